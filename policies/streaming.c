/*
 * streaming.c — StreamingLLM: keep the first sinks positions and the most
 * recent ones, within a budget, decided at every sync of either phase.
 *
 * The rule, exactly (a verifier implements it independently):
 *   B = tokens, or n_seen - floor(ratio * n_seen) (policy_budget, pressure
 *   applied).  n_seen <= B: keep all.  Else S' = min(sinks, B),
 *   recent = B - S', and an entry is kept iff pos < S' or
 *   pos >= n_seen - recent.  Every head of the layer gets the same rule.
 *
 * On a device (policy_ops.device, streaming_rule.h, policies/streaming.cu)
 * one job per (sequence, layer) marks the same drops in every list; the
 * plan counts them from the positions' numbers (streaming_plan).
 */
#include "policy.h"

#include <stdio.h>

#include "attn_plan.h"
#include "errors.h"
#include "streaming_rule.h"

#define STREAMING_DEF_SINKS 4u
#define STREAMING_DEF_TOKENS 256u

static int streaming_init(struct policy *p, char *err, size_t errlen)
{
	struct policy_args *a = &p->args;
	int has_tokens = !!(a->set & POLICY_KEY_TOKENS);
	int has_ratio = !!(a->set & POLICY_KEY_RATIO);
	if (has_tokens && has_ratio) {
		snprintf(err, errlen, "streaming: give tokens or ratio, not both");
		return KVT_EPOLICY;
	}
	if (!has_tokens && !has_ratio)
		a->tokens = STREAMING_DEF_TOKENS;
	if (!(a->set & POLICY_KEY_SINKS))
		a->sinks = STREAMING_DEF_SINKS;
	return 0;
}

/* The kept head [0, *s) and tail [*from, n_seen) of the positions
 * after n_seen tokens; 0 when nothing is dropped (n_seen within the
 * budget). */
static int streaming_keep(const struct policy *p, uint32_t n_seen,
                          uint32_t *s, uint32_t *from)
{
	uint32_t b = policy_budget(p, n_seen);
	if (n_seen <= b)
		return 0;
	*s = p->args.sinks < b ? p->args.sinks : b;
	uint32_t recent = b - *s;
	*from = n_seen - recent; /* recent <= b < n_seen */
	return 1;
}

static int streaming_decide(struct policy *p, struct policy_layer *l)
{
	uint32_t s, from;
	if (!streaming_keep(p, l->n_seen, &s, &from))
		return 0;
	for (uint32_t g = 0; g < p->geom.n_kv_heads; g++) {
		struct policy_head *h = &l->heads[g];
		for (uint32_t i = 0; i < h->len; i++) {
			uint32_t pos = h->pos[i];
			h->drop[i] = !(pos < s || pos >= from);
		}
	}
	return 0;
}

/* policy.h: per (sequence, layer) one record, two halves of cap
 * positions (streaming_rule.h's layout): its lists hold the same ones. */
static void streaming_shape(const struct policy *p, uint32_t cap,
                            struct policy_dev_shape *s)
{
	(void)p;
	*s = (struct policy_dev_shape){
		.records = 1, .record_bytes = 2 * (size_t)cap * sizeof(uint32_t),
		.positions = 1, /* one array for the layer's lists */
	};
}

/* The high bit of the plan's word: a decision of the sequence kept fewer
 * sinks than configured (a budget below them), so [0, sinks) may not all
 * be held; the low bits: the latest start of the kept tail. */
#define STREAMING_WORD_SHORT 0x80000000u

/*
 * policy.h: one job per (sequence, layer) whose lists change (the lists'
 * lengths agree, and they hold the same positions: invariants; the
 * device's count is checked against this one).  Every unprotected entry
 * goes, so the drops are the entries less the kept head [0, s) and tail
 * [from, n_seen) that the lists hold.  Those are all held, and the count
 * follows from the numbers (policy_attn_count's tail_held), while no
 * earlier decision of the sequence kept a shorter head or a later tail:
 * c->word holds the latest tail start and whether a head was ever short
 * (updated eagerly, which a refused sync only makes stricter); else the
 * count is a pass over head 0's positions, one list of the layer.
 */
static int streaming_plan(const struct policy *p, const struct policy_layer *l,
                          const struct policy_dev_layer *c, void *jobs,
                          struct policy_dev_job *hj, uint32_t *n, char *err,
                          size_t errlen)
{
	const uint32_t len = c->len[0], prev = l->n_seen - l->n_new;
	const uint32_t L = len + l->n_new;
	*n = 0;
	for (uint32_t h = 1; h < p->geom.n_kv_heads; h++)
		if (c->len[h] != len)
			return errors_fmt(err, errlen, KVT_ESYS, "streaming: "
			                  "layer %u: its lists' lengths differ (an "
			                  "invariant)", l->layer);
	if (!prev)
		*c->word = 0; /* a new sequence in the slot */
	uint32_t s = 0, from = 0, nd = 0;
	const int due = streaming_keep(p, l->n_seen, &s, &from);
	if (due) {
		const uint32_t w = *c->word, last = w & ~STREAMING_WORD_SHORT;
		const int held = !(w & STREAMING_WORD_SHORT) && from >= last;
		const struct policy_attn_rule r = {
			.sinks = s, .recent = l->n_seen - from, .budget = 0,
			.due = 1,
		};
		const uint32_t *pos = NULL;
		if (!held && len && !(pos = policy_dev_pos(c, 0)))
			return errors_fmt(err, errlen, KVT_ESYS, "streaming: "
			                  "layer %u: its positions could not be "
			                  "read back", l->layer);
		nd = policy_attn_count(&r, r.recent, 1, pos, len, l->n_new,
		                       prev, held).n_drop;
		*c->word = (from > last ? from : last) |
		           (w & STREAMING_WORD_SHORT) |
		           (s < p->args.sinks ? STREAMING_WORD_SHORT : 0);
	}
	if (!L || (!l->n_new && !nd))
		return 0; /* nothing changes */
	*(struct streaming_rule_job *)jobs = (struct streaming_rule_job){
		.srec = c->state_rec, .cur = c->cur[0], .len = len,
		.n_new = l->n_new, .n_seen = l->n_seen, .due = (uint32_t)due,
		.keep = 0, .sinks = s, .from = from, .n_drop = nd,
		.drop_off = c->drop_off,
	};
	hj[0] = (struct policy_dev_job){
		.rec = c->state_rec, .g = POLICY_DEV_ALL, .L = L,
		.n_drop = nd, .drop_off = c->drop_off,
	};
	*n = 1;
	return 0;
}

static void streaming_params(const struct policy *p,
                             const struct policy_dev_bufs *b, void *out)
{
	(void)p;
	*(struct streaming_rule *)out = (struct streaming_rule){
		.state = b->state, .cap = b->cap,
	};
}

static const struct policy_device_rule streaming_device = {
	.name = "streaming", .version = STREAMING_RULE_VERSION,
	.params_bytes = sizeof(struct streaming_rule),
	.job_bytes = sizeof(struct streaming_rule_job),
	.shape = streaming_shape, .plan = streaming_plan,
	.params = streaming_params,
};

const struct policy_ops streaming_ops = {
	.name = "streaming",
	.help = "StreamingLLM: attention sinks + recent tokens "
	        "(sinks=4, tokens=256 | ratio=R)",
	.needs = 0,
	.keys = POLICY_KEY_SINKS | POLICY_KEY_TOKENS | POLICY_KEY_RATIO,
	.init = streaming_init,
	.decide = streaming_decide,
	.device = &streaming_device,
	.eval = {"streaming:%s,sinks=4",
	         POLICY_EVAL_BYTES | POLICY_EVAL_CONTEXT |
	         POLICY_EVAL_DECODING},
};
