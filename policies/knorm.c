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
 * bits) and passes them as policy_layer.pre; with the device rule
 * (policy_ops.device, knorm_rule.h, policies/knorm.cu) the norms, the
 * positions and the selection stay on the device, a job per list.
 */
#include "policy.h"

#include <math.h>
#include <stdio.h>

#include "attn_plan.h"
#include "dtype.h"
#include "errors.h"
#include "knorm_rule.h"

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

/* policy.h: per list record two halves of cap positions and cap norms
 * (knorm_rule.h's layout). */
static void knorm_shape(const struct policy *p, uint32_t cap,
                        struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){
		.records = p->geom.n_kv_heads,
		.record_bytes = 2 * (size_t)cap * (sizeof(uint32_t) + sizeof(float)),
		.positions = 1,
	};
}

/* policy.h: a job per list that changes.  The protection (sinks, and the
 * window's tail, whose start never moves back) holds its positions from
 * their arrival, so the counts follow from the numbers alone
 * (policy_attn_count's tail_held). */
static int knorm_plan(const struct policy *p, const struct policy_layer *l,
                      const struct policy_dev_layer *c, void *jobs,
                      struct policy_dev_job *hj, uint32_t *n, char *err,
                      size_t errlen)
{
	*n = 0;
	if (c->state_rec != c->list_rec)
		return errors_fmt(err, errlen, KVT_ESYS, "knorm: layer %u: "
		                  "state record %u is not its lists' %u (an "
		                  "invariant)", l->layer, c->state_rec,
		                  c->list_rec);
	const struct policy_attn_rule r = {
		.sinks = p->args.sinks, .window = p->args.window,
		.budget = policy_budget(p, l->n_seen), .due = policy_due(p, l),
	};
	const uint32_t due = (uint32_t)policy_attn_due(&r);
	struct knorm_rule_job *bj = jobs;
	uint32_t k = 0, off = c->drop_off, keep;
	for (uint32_t h = 0; h < p->geom.n_kv_heads; h++) {
		if (!policy_attn_list_job(&r, r.window, 1, l, c, h, off, &hj[k],
		                          &keep))
			continue;
		bj[k] = (struct knorm_rule_job){
			.record = hj[k].rec, .cur = c->cur[h], .len = c->len[h],
			.n_new = l->n_new, .n_seen = l->n_seen, .due = due,
			.keep = keep, .n_drop = hj[k].n_drop, .drop_off = off,
		};
		off += hj[k++].n_drop;
	}
	*n = k;
	return 0;
}

static void knorm_params(const struct policy *p,
                         const struct policy_dev_bufs *b, void *out)
{
	*(struct knorm_rule *)out = (struct knorm_rule){
		.state = b->state, .cap = b->cap, .sinks = p->args.sinks,
		.window = p->args.window,
	};
}

static const struct policy_device_rule knorm_device = {
	.name = "knorm", .version = KNORM_RULE_VERSION,
	.params_bytes = sizeof(struct knorm_rule),
	.job_bytes = sizeof(struct knorm_rule_job),
	.shape = knorm_shape, .plan = knorm_plan, .params = knorm_params,
};

const struct policy_ops knorm_ops = {
	.name = "knorm",
	.help = "Knorm: minus the L2 norm of the key, top-k per head "
	        "(tokens=256 | ratio=R, sinks=0, window=0, every=N)",
	.needs = POLICY_NEED_KV,
	.keys = POLICY_KEY_TOKENS | POLICY_KEY_RATIO | POLICY_KEY_SINKS |
	        POLICY_KEY_WINDOW | POLICY_KEY_EVERY,
	.init = knorm_init,
	.decide = knorm_decide,
	.device = &knorm_device,
	.new_key_norms = 1,
	.eval = {"knorm:%s",
	         POLICY_EVAL_CONTEXT | POLICY_EVAL_DECODING},
};
