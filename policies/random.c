/*
 * random.c — the random baseline (kvpress RandomPress): every entry gets a
 * uniform score in [0, 1) and each head keeps the best within its budget.
 *
 * The score is a hash of (seed, layer, KV head, position), so it needs no
 * state, is the same at every sync (an entry's fate only changes when the
 * budget or newer entries change) and is replayable anywhere; it does not
 * depend on the sequence, so two sequences of a tenant drop alike.
 * Protected: sinks and the recent window.  Budget tokens (default 256) or
 * ratio; evictions at every sync, or every=N tokens.
 * On a device (policy_ops.device, random_rule.h, policies/random.cu) the
 * positions and the selection stay there, a job per list; the scores are
 * the same hash of the positions.
 */
#include "policy.h"

#include <stdio.h>

#include "attn_plan.h"
#include "errors.h"
#include "random_rule.h"

#define RANDOM_DEF_TOKENS 256u

static int random_init(struct policy *p, char *err, size_t errlen)
{
	if (!(p->args.set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO)))
		p->args.tokens = RANDOM_DEF_TOKENS;
	return 0;
}

static uint64_t mix(uint64_t x)
{
	/* splitmix64 finaliser */
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static int random_decide(struct policy *p, struct policy_layer *l)
{
	if (!policy_due(p, l))
		return 0;
	for (uint32_t g = 0; g < p->geom.n_kv_heads; g++) {
		struct policy_head *h = &l->heads[g];
		float *s = policy_scratch(p, (size_t)h->len * sizeof(float));
		if (!s)
			return KVT_ENOMEM;
		uint64_t base = mix(mix(mix(p->args.seed) ^ l->layer) ^ g);
		for (uint32_t i = 0; i < h->len; i++)
			/* top 24 bits: exact in float, uniform in [0, 1) */
			s[i] = (float)(mix(base ^ h->pos[i]) >> 40) *
			       (1.0f / 16777216.0f);
		int rc = policy_select(p, l, h, s, NULL);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* policy.h: per list record two halves of cap positions (random_rule.h's
 * layout). */
static void random_shape(const struct policy *p, uint32_t cap,
                         struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){
		.records = p->geom.n_kv_heads,
		.record_bytes = 2 * (size_t)cap * sizeof(uint32_t),
		.positions = 1,
	};
}

/* policy.h: a job per list that changes.  The protection (sinks, and the
 * window's tail, whose start never moves back) holds its positions from
 * their arrival, so the counts follow from the numbers alone
 * (policy_attn_count's tail_held). */
static int random_plan(const struct policy *p, const struct policy_layer *l,
                       const struct policy_dev_layer *c, void *jobs,
                       struct policy_dev_job *hj, uint32_t *n, char *err,
                       size_t errlen)
{
	(void)err;
	(void)errlen;
	const struct policy_attn_rule r = {
		.sinks = p->args.sinks, .window = p->args.window,
		.budget = policy_budget(p, l->n_seen), .due = policy_due(p, l),
	};
	const uint32_t due = (uint32_t)policy_attn_due(&r);
	struct random_rule_job *bj = jobs;
	uint32_t k = 0, off = c->drop_off, keep;
	for (uint32_t h = 0; h < p->geom.n_kv_heads; h++) {
		if (!policy_attn_list_job(&r, r.window, 1, l, c, h, off, &hj[k],
		                          &keep))
			continue;
		bj[k] = (struct random_rule_job){
			.record = hj[k].rec, .layer = l->layer, .g = h,
			.cur = c->cur[h], .len = c->len[h], .n_new = l->n_new,
			.n_seen = l->n_seen, .due = due, .keep = keep,
			.n_drop = hj[k].n_drop, .drop_off = off,
		};
		off += hj[k++].n_drop;
	}
	*n = k;
	return 0;
}

static void random_params(const struct policy *p,
                          const struct policy_dev_bufs *b, void *out)
{
	*(struct random_rule *)out = (struct random_rule){
		.state = b->state, .seed = p->args.seed, .cap = b->cap,
		.sinks = p->args.sinks, .window = p->args.window,
	};
}

static const struct policy_device_rule random_device = {
	.name = "random", .version = RANDOM_RULE_VERSION,
	.params_bytes = sizeof(struct random_rule),
	.job_bytes = sizeof(struct random_rule_job),
	.shape = random_shape, .plan = random_plan, .params = random_params,
};

const struct policy_ops random_ops = {
	.name = "random",
	.help = "uniform random scores, top-k per head "
	        "(seed=0, tokens=256 | ratio=R, sinks=0, window=0, every=N)",
	.needs = 0,
	.keys = POLICY_KEY_SEED | POLICY_KEY_TOKENS | POLICY_KEY_RATIO |
	        POLICY_KEY_SINKS | POLICY_KEY_WINDOW | POLICY_KEY_EVERY,
	.init = random_init,
	.decide = random_decide,
	.device = &random_device,
	.eval = {"random:%s,seed=1",
	         POLICY_EVAL_BYTES | POLICY_EVAL_CONTEXT |
	         POLICY_EVAL_DECODING},
};
