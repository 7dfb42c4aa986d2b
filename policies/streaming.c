/*
 * streaming.c — StreamingLLM: keep the first sinks positions and the most
 * recent ones, within a budget, decided at every sync of either phase.
 *
 * The rule, exactly (a verifier implements it independently):
 *   B = tokens, or n_seen - floor(ratio * n_seen) (policy_budget, pressure
 *   applied).  n_seen <= B: keep all.  Else S' = min(sinks, B),
 *   recent = B - S', and an entry is kept iff pos < S' or
 *   pos >= n_seen - recent.  Every head of the layer gets the same rule.
 */
#include "policy.h"

#include <stdio.h>

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

static int streaming_decide(struct policy *p, struct policy_layer *l)
{
	uint32_t b = policy_budget(p, l->n_seen);
	if (l->n_seen <= b)
		return 0;
	uint32_t s = p->args.sinks < b ? p->args.sinks : b;
	uint32_t recent = b - s;
	uint32_t from = l->n_seen - recent; /* recent <= b < n_seen */
	for (uint32_t g = 0; g < p->geom.n_kv_heads; g++) {
		struct policy_head *h = &l->heads[g];
		for (uint32_t i = 0; i < h->len; i++) {
			uint32_t pos = h->pos[i];
			h->drop[i] = !(pos < s || pos >= from);
		}
	}
	return 0;
}

const struct policy_ops streaming_ops = {
	.name = "streaming",
	.help = "StreamingLLM: attention sinks + recent tokens "
	        "(sinks=4, tokens=256 | ratio=R)",
	.needs = 0,
	.keys = POLICY_KEY_SINKS | POLICY_KEY_TOKENS | POLICY_KEY_RATIO,
	.init = streaming_init,
	.decide = streaming_decide,
	.eval = {"streaming:ratio=%.4f,sinks=4",
	         POLICY_EVAL_BYTES | POLICY_EVAL_CONTEXT |
	         POLICY_EVAL_DECODING},
};
