/*
 * streaming.c — StreamingLLM: keep the first sinks positions and the most
 * recent ones, within a budget, decided at every sync of either phase.
 *
 * The rule, exactly (a verifier implements it independently):
 *   B = tokens, or n_seen - floor(ratio * n_seen) (policy_budget).
 *   n_seen <= B: keep all.  Else S' = min(sinks, B), recent = B - S', and an
 *   entry is kept iff pos < S' or pos >= n_seen - recent.
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
	if (has_tokens && a->tokens < 1) {
		snprintf(err, errlen, "streaming: tokens must be >= 1");
		return KVT_EPOLICY;
	}
	if (!has_tokens && !has_ratio)
		a->tokens = STREAMING_DEF_TOKENS;
	if (!(a->set & POLICY_KEY_SINKS))
		a->sinks = STREAMING_DEF_SINKS;
	return 0;
}

static uint32_t streaming_decide(const struct policy *p,
                                 const struct policy_list *l, uint8_t *drop)
{
	uint32_t b = policy_budget(&p->args, l->n_seen);
	if (l->n_seen <= b)
		return 0;
	uint32_t s = p->args.sinks < b ? p->args.sinks : b;
	uint32_t recent = b - s;
	uint32_t from = l->n_seen - recent; /* recent <= b < n_seen */
	uint32_t n = 0;
	for (uint32_t i = 0; i < l->len; i++) {
		uint32_t pos = l->pos[i];
		if (pos < s || pos >= from)
			continue;
		drop[i] = 1;
		n++;
	}
	return n;
}

const struct policy_ops streaming_ops = {
	.name = "streaming",
	.help = "StreamingLLM: attention sinks + recent tokens "
	        "(sinks=4, tokens=256 | ratio=R)",
	.needs = 0,
	.keys = POLICY_KEY_SINKS | POLICY_KEY_TOKENS | POLICY_KEY_RATIO,
	.init = streaming_init,
	.decide = streaming_decide,
};
