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
 */
#include "policy.h"

#include <stdio.h>

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

const struct policy_ops random_ops = {
	.name = "random",
	.help = "uniform random scores, top-k per head "
	        "(seed=0, tokens=256 | ratio=R, sinks=0, window=0, every=N)",
	.needs = 0,
	.keys = POLICY_KEY_SEED | POLICY_KEY_TOKENS | POLICY_KEY_RATIO |
	        POLICY_KEY_SINKS | POLICY_KEY_WINDOW | POLICY_KEY_EVERY,
	.init = random_init,
	.decide = random_decide,
	.eval = {"random:ratio=%.4f,seed=1",
	         POLICY_EVAL_BYTES | POLICY_EVAL_CONTEXT |
	         POLICY_EVAL_DECODING},
};
