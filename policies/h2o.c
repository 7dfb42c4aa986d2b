/*
 * h2o.c — H2O heavy hitters: each entry accumulates the attention it
 * received from every staged query since it arrived; each KV head keeps
 * its recent window plus the entries with the most accumulated attention.
 *
 * Rule (docs/policies.md):
 *   state per entry: S[j], j < G, the attention received from query head j
 *   of the KV head's group, summed over every query seen (prefill and
 *   decode, the entry's own query included), recovered from staged q/lse.
 *   score = mean_j S[j] (agg=mean, default, kvpress's group mean) or
 *   max_j S[j] (agg=max).
 *   Protected: sinks (default 0) and the recent window: window=N if given,
 *   else half the budget (H2O's 1:1 heavy:recent split).  Budget tokens
 *   (default 256) or ratio; top-k of the rest; at every sync or every=N
 *   (the accumulation runs at every sync regardless).
 * S is per query head rather than aggregated per query so that agg=max is
 * H2O's per-head score maxed over the group, not a max per step.
 * observed_attention is the same accumulation with kvpress's
 * ObservedAttentionPress's score: mean_j S[j] / (n_seen - pos), the
 * attention averaged over the queries that could see the entry, nothing
 * protected, ratio or tokens per KV head.
 */
#include "policy.h"

#include <stdio.h>

#include "attn_plan.h"
#include "errors.h"
#include "h2o_rule.h"

#define H2O_DEF_TOKENS 256u

static int h2o_init(struct policy *p, char *err, size_t errlen)
{
	if (!(p->args.set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO)))
		p->args.tokens = H2O_DEF_TOKENS;
	p->entry_floats = p->geom.n_heads / p->geom.n_kv_heads;
	return 0;
}

static int observed_init(struct policy *p, char *err, size_t errlen)
{
	p->args.agg = POLICY_AGG_OBSERVED;
	return h2o_init(p, err, errlen);
}

/* The recent entries H2O protects: window=N when given (policy_protected
 * applies it), else half the budget b; observed_attention protects none. */
static uint32_t h2o_recent(const struct policy *p, uint32_t b)
{
	if (p->args.agg == POLICY_AGG_OBSERVED ||
	    (p->args.set & POLICY_KEY_WINDOW))
		return 0;
	return b / 2;
}

/* The score of an entry at pos from its group's accumulated S[G]. */
static float h2o_score(const struct policy *p, const float *e, uint32_t G,
                       uint32_t pos, uint32_t n_seen)
{
	float v;
	switch (p->args.agg) {
	case POLICY_AGG_MAX:
		v = e[0];
		for (uint32_t j = 1; j < G; j++)
			v = e[j] > v ? e[j] : v;
		return v;
	case POLICY_AGG_OBSERVED: {
		const float c = (float)(n_seen - pos);
		v = e[0] / c;
		for (uint32_t j = 1; j < G; j++)
			v += e[j] / c;
		return v / (float)G;
	}
	default:
		v = e[0];
		for (uint32_t j = 1; j < G; j++)
			v += e[j];
		return v / (float)G;
	}
}

/* policy.h: H2O's rule at this sync (budget, the protected recent half,
 * whether a selection is due): what h2o_decide applies and a device runs. */
static int h2o_attn(const struct policy *p, const struct policy_layer *l,
                    struct policy_attn_rule *r)
{
	uint32_t b = policy_budget(p, l->n_seen);
	*r = (struct policy_attn_rule){
		.agg = p->args.agg, .sinks = p->args.sinks,
		.window = p->args.window,
		.recent = h2o_recent(p, b),
		.budget = b, .due = policy_due(p, l),
	};
	return 1;
}

static int h2o_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	uint32_t G = ge->n_heads / ge->n_kv_heads;
	uint32_t *qpos = policy_scratch(p, (l->n_new + 1) * sizeof(uint32_t));
	if (!qpos)
		return KVT_ENOMEM;
	for (uint32_t t = 0; t < l->n_new; t++)
		qpos[t] = l->n_seen - l->n_new + t;
	struct policy_attn_rule r;
	(void)h2o_attn(p, l, &r);
	const int due = r.due;
	const uint32_t recent = r.recent;

	for (uint32_t g = 0; g < ge->n_kv_heads; g++) {
		struct policy_head *h = &l->heads[g];
		uint32_t len = h->len;
		if (!len)
			continue;
		if (l->n_new) {
			const float *w = policy_attn(p, g, l->q, l->lse, qpos,
			                             l->n_new, h->pages,
			                             ge->page_tokens, h->pos,
			                             len);
			if (!w)
				return KVT_ENOMEM;
			for (uint32_t t = 0; t < l->n_new; t++)
				for (uint32_t j = 0; j < G; j++) {
					const float *wr =
						w + ((size_t)t * G + j) * len;
					for (uint32_t i = 0; i < len; i++)
						h->ent[(size_t)i * G + j] += wr[i];
				}
		}
		if (!due)
			continue;
		float *s = policy_scratch(p, (size_t)len * sizeof(float));
		uint8_t *prot = policy_scratch(p, len);
		if (!s || !prot)
			return KVT_ENOMEM;
		for (uint32_t i = 0; i < len; i++) {
			s[i] = h2o_score(p, h->ent + (size_t)i * G, G, h->pos[i],
			                 l->n_seen);
			prot[i] = recent &&
			          h->pos[i] + (uint64_t)recent >= l->n_seen;
		}
		int rc = policy_select(p, l, h, s, prot);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* policy.h: per list record two halves of cap positions and cap rows of
 * S (G floats), h2o_rule.h's layout. */
static void h2o_shape(const struct policy *p, uint32_t cap,
                      struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){
		.records = p->geom.n_kv_heads,
		.record_bytes = 2 * (size_t)cap *
		                (1 + p->geom.n_heads / p->geom.n_kv_heads) *
		                sizeof(float),
		.positions = 1,
	};
}

/*
 * policy.h: a job per list that changes.  The protected tail is the
 * window or the recent half, which moves with the budget, back too when
 * pressure eases: the counts come from the numbers alone only while the
 * tail starts at or after every earlier start of the sequence (c->word
 * holds the latest; updated eagerly, which a refused sync only makes
 * stricter), else from the positions (policy_attn_count).
 */
static int h2o_plan(const struct policy *p, const struct policy_layer *l,
                    const struct policy_dev_layer *c, void *jobs,
                    struct policy_dev_job *hj, uint32_t *n, char *err,
                    size_t errlen)
{
	struct policy_attn_rule r;
	(void)h2o_attn(p, l, &r);
	const uint32_t prev = l->n_seen - l->n_new, seen = l->n_seen;
	const uint32_t tail = r.recent > r.window ? r.recent : r.window;
	const uint32_t start = seen - (tail < seen ? tail : seen);
	if (!prev)
		*c->word = 0; /* a new sequence in the slot */
	const int held = start >= *c->word;
	if (held)
		*c->word = start;
	struct h2o_rule_job *bj = jobs;
	uint32_t k = 0, off = c->drop_off, keep;
	for (uint32_t h = 0; h < p->geom.n_kv_heads; h++) {
		const int j = policy_attn_list_job(&r, tail, held, l, c, h, off,
		                                   &hj[k], &keep);
		if (j < 0)
			return errors_fmt(err, errlen, KVT_ESYS, "h2o: layer %u "
			                  "head %u: its positions could not be "
			                  "read back", l->layer, h);
		if (!j)
			continue;
		bj[k] = (struct h2o_rule_job){
			.ring = c->ring, .record = hj[k].rec, .g = h,
			.cur = c->cur[h], .len = c->len[h], .n_new = l->n_new,
			.n_seen = seen, .due = (uint32_t)policy_attn_due(&r),
			.recent = r.recent, .keep = keep,
			.n_drop = hj[k].n_drop, .drop_off = off,
		};
		off += hj[k++].n_drop;
	}
	*n = k;
	return 0;
}

static void h2o_params(const struct policy *p, const struct policy_dev_bufs *b,
                       void *out)
{
	*(struct h2o_rule *)out = (struct h2o_rule){
		.state = b->state, .cap = b->cap, .rows = b->rows,
		.agg = (uint32_t)p->args.agg, .sinks = p->args.sinks,
		.window = p->args.window,
	};
}

static const struct policy_device_rule h2o_device = {
	.name = "h2o", .version = H2O_RULE_VERSION,
	.params_bytes = sizeof(struct h2o_rule),
	.job_bytes = sizeof(struct h2o_rule_job),
	.shape = h2o_shape, .plan = h2o_plan, .params = h2o_params,
};

const struct policy_ops h2o_ops = {
	.name = "h2o",
	.help = "H2O: accumulated attention received, per KV head "
	        "(tokens=256 | ratio=R, window=budget/2, agg=mean|max, "
	        "sinks=0, every=N)",
	.needs = POLICY_NEED_Q | POLICY_NEED_LSE | POLICY_NEED_KV,
	.keys = POLICY_KEY_TOKENS | POLICY_KEY_RATIO | POLICY_KEY_WINDOW |
	        POLICY_KEY_AGG | POLICY_KEY_SINKS | POLICY_KEY_EVERY,
	.init = h2o_init,
	.decide = h2o_decide,
	.device = &h2o_device,
	.eval = {"h2o:%s",
	         POLICY_EVAL_BYTES | POLICY_EVAL_CONTEXT |
	         POLICY_EVAL_DECODING},
};

const struct policy_ops observed_attention_ops = {
	.name = "observed_attention",
	.help = "kvpress's ObservedAttentionPress: the attention an entry "
	        "received, averaged over the queries that could see it, per "
	        "KV head (tokens=256 | ratio=R, every=N)",
	.needs = POLICY_NEED_Q | POLICY_NEED_LSE | POLICY_NEED_KV,
	.keys = POLICY_KEY_TOKENS | POLICY_KEY_RATIO | POLICY_KEY_EVERY,
	.init = observed_init,
	.decide = h2o_decide,
	.device = &h2o_device,
	.eval = {"observed_attention:%s",
	         POLICY_EVAL_CONTEXT | POLICY_EVAL_DECODING},
};
