/*
 * knorm.c — the key-norm baseline (kvpress KnormPress): an entry scores
 * minus the L2 norm of its key as stored (after RoPE, which preserves the
 * norm), so each head evicts its highest-norm keys first.
 *
 * Rule (docs/policies.md):
 *   arrival: entry state = ||k||_2 of the new entry's key row, read from
 *   its page and converted to float32 (summed in double).
 *   score = -state; protected: sinks (default 0) and the recent window
 *   (default 0); budget tokens (default 256) or ratio, top-k per head
 *   (policy_select: ties keep the more recent).  Evictions at every sync
 *   of either phase, or every=N (the norms are taken at every sync).
 * The norm is kept per entry rather than re-read from the pages at each
 * sync: a key never changes, and the pages of old entries stay untouched.
 * A cuda tenant computes the new norms on the device (key_norms, the same
 * bits) and passes them as policy_layer.pre.
 */
#include "policy.h"

#include <math.h>
#include <stdio.h>

#include "dtype.h"

#define KNORM_DEF_TOKENS 256u

static int knorm_init(struct policy *p, char *err, size_t errlen)
{
	if (!(p->args.set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO)))
		p->args.tokens = KNORM_DEF_TOKENS;
	p->entry_floats = 1;
	return 0;
}

static int knorm_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	uint32_t hd = ge->head_dim, pt = ge->page_tokens;
	size_t rb = (size_t)hd * kvt_dtype_size(ge->dtype); /* K row bytes */
	float *k = policy_scratch(p, (size_t)hd * sizeof(float));
	if (!k)
		return KVT_ENOMEM;
	int due = policy_due(p, l);
	if (l->pre)
		policy_take_pre(p, l);
	for (uint32_t g = 0; g < ge->n_kv_heads; g++) {
		struct policy_head *h = &l->heads[g];
		uint32_t n = l->n_new < h->len ? l->n_new : h->len;
		for (uint32_t i = h->len - n; !l->pre && i < h->len; i++) {
			const char *page = h->pages[i / pt];
			dtype_to_f32(page + (size_t)(i % pt) * rb, ge->dtype, k,
			             hd);
			double ss = 0.0;
			for (uint32_t d = 0; d < hd; d++)
				ss += (double)k[d] * k[d];
			h->ent[i] = (float)sqrt(ss);
		}
		if (!due)
			continue;
		float *s = policy_scratch(p, ((size_t)h->len + 1) *
		                                 sizeof(float));
		if (!s)
			return KVT_ENOMEM;
		for (uint32_t i = 0; i < h->len; i++)
			s[i] = -h->ent[i];
		int rc = policy_select(p, l, h, s, NULL);
		if (rc < 0)
			return rc;
	}
	return 0;
}

const struct policy_ops knorm_ops = {
	.name = "knorm",
	.help = "Knorm: minus the L2 norm of the key, top-k per head "
	        "(tokens=256 | ratio=R, sinks=0, window=0, every=N)",
	.needs = POLICY_NEED_KV,
	.keys = POLICY_KEY_TOKENS | POLICY_KEY_RATIO | POLICY_KEY_SINKS |
	        POLICY_KEY_WINDOW | POLICY_KEY_EVERY,
	.init = knorm_init,
	.decide = knorm_decide,
	.new_key_norms = 1,
	.eval = {"knorm:ratio=%.4f",
	         POLICY_EVAL_CONTEXT | POLICY_EVAL_DECODING},
};
