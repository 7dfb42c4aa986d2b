/*
 * tova.c — TOVA: at each decision the newest query's attention, averaged
 * over all query heads of the layer, scores every position; the layer
 * keeps the same top-B positions in every KV head (TOVA decides per layer,
 * as its official code gathers the same indices for all heads).
 *
 * Rule (docs/policies.md):
 *   t = the newest staged query of the sync (position n_seen - 1); the
 *   other queries of a multi-token sync are not used (TOVA is defined per
 *   step; with sync-every-N it sees every N-th query).
 *   score(pos) = (1/H) sum_g sum_{j in grp(g)} a^{g,j}_{t,pos}, summed over
 *   the KV heads in index order (heads that do not hold pos add nothing).
 *   Protected: sinks (default 0) and window (default 1: the newest token,
 *   as kvpress protects the last).  Budget tokens (default 256) or ratio;
 *   the best B - protected positions are kept in every head.  No query
 *   (n_new 0): no decision.  At every sync or every=N.
 */
#include "policy.h"

#include <stdlib.h>
#include <string.h>

#include "attn_plan.h"
#include "errors.h"
#include "tova_rule.h"

#define TOVA_DEF_TOKENS 256u
#define TOVA_DEF_WINDOW 1u

static int tova_init(struct policy *p, char *err, size_t errlen)
{
	if (!(p->args.set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO)))
		p->args.tokens = TOVA_DEF_TOKENS;
	if (!(p->args.set & POLICY_KEY_WINDOW))
		p->args.window = TOVA_DEF_WINDOW;
	return 0;
}

/* (position, head) keys of the merge path, sorted by position then head. */
struct tkey {
	uint32_t pos, head, idx;
};

static int tkey_cmp(const void *a, const void *b)
{
	const struct tkey *x = a, *y = b;
	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return x->head < y->head ? -1 : x->head > y->head;
}

static int tova_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	uint32_t G = ge->n_heads / ge->n_kv_heads, nkv = ge->n_kv_heads;
	if (!l->n_new || !policy_due(p, l))
		return 0;
	uint32_t t = l->n_new - 1, qpos = l->n_seen - 1;
	const float *q = l->q + (size_t)t * ge->n_heads * ge->head_dim;
	const float *lse = l->lse + (size_t)t * ge->n_heads;

	/* Per head: part[g][i] = sum_j a^{g,j}(entry i). */
	float **part = policy_scratch(p, nkv * sizeof(float *));
	if (!part)
		return KVT_ENOMEM;
	int same = 1;
	size_t total = 0;
	for (uint32_t g = 0; g < nkv; g++) {
		struct policy_head *h = &l->heads[g];
		total += h->len;
		if (h->len != l->heads[0].len ||
		    (h->len && memcmp(h->pos, l->heads[0].pos,
		                      h->len * sizeof(uint32_t))))
			same = 0;
		part[g] = policy_scratch(p, (h->len + 1) * sizeof(float));
		if (!part[g])
			return KVT_ENOMEM;
		if (!h->len)
			continue;
		const float *w = policy_attn(p, g, q, lse, &qpos, 1, h->pages,
		                             ge->page_tokens, h->pos, h->len);
		if (!w)
			return KVT_ENOMEM;
		for (uint32_t i = 0; i < h->len; i++) {
			float v = w[i];
			for (uint32_t j = 1; j < G; j++)
				v += w[(size_t)j * h->len + i];
			part[g][i] = v;
		}
	}
	float inv_h = 1.0f / (float)ge->n_heads;

	if (same) {
		/* Every head holds the same positions in the same order (the
		 * normal case: TOVA's decisions are shared). */
		struct policy_head *h0 = &l->heads[0];
		float *s = policy_scratch(p, (h0->len + 1) * sizeof(float));
		if (!s)
			return KVT_ENOMEM;
		for (uint32_t i = 0; i < h0->len; i++) {
			float v = part[0][i];
			for (uint32_t g = 1; g < nkv; g++)
				v += part[g][i];
			s[i] = v * inv_h;
		}
		int rc = policy_select(p, l, h0, s, NULL);
		if (rc < 0)
			return rc;
		for (uint32_t g = 1; g < nkv; g++)
			memcpy(l->heads[g].drop, h0->drop, h0->len);
		return 0;
	}

	/* Heads differ: score the union of positions, decide once, map the
	 * verdict back to each head's entries. */
	struct tkey *k = policy_scratch(p, (total + 1) * sizeof(*k));
	uint32_t *upos = policy_scratch(p, (total + 1) * sizeof(uint32_t));
	float *us = policy_scratch(p, (total + 1) * sizeof(float));
	uint8_t *ud = policy_scratch(p, total + 1);
	if (!k || !upos || !us || !ud)
		return KVT_ENOMEM;
	size_t n = 0;
	for (uint32_t g = 0; g < nkv; g++)
		for (uint32_t i = 0; i < l->heads[g].len; i++)
			k[n++] = (struct tkey){l->heads[g].pos[i], g, i};
	qsort(k, n, sizeof(*k), tkey_cmp);
	uint32_t m = 0;
	for (size_t e = 0; e < n; e++) {
		float v = part[k[e].head][k[e].idx];
		if (m && upos[m - 1] == k[e].pos) {
			us[m - 1] += v;
		} else {
			upos[m] = k[e].pos;
			us[m++] = v;
		}
	}
	for (uint32_t i = 0; i < m; i++)
		us[i] *= inv_h;
	struct policy_head u = {.pos = upos, .len = m, .drop = ud};
	int rc = policy_select(p, l, &u, us, NULL);
	if (rc < 0)
		return rc;
	for (uint32_t g = 0; g < nkv; g++) {
		struct policy_head *h = &l->heads[g];
		for (uint32_t i = 0; i < h->len; i++) {
			uint32_t lo = 0, hi = m; /* upos sorted, unique */
			while (lo < hi) {
				uint32_t mid = lo + (hi - lo) / 2;
				if (upos[mid] < h->pos[i])
					lo = mid + 1;
				else
					hi = mid;
			}
			h->drop[i] = ud[lo];
		}
	}
	return 0;
}

/* policy.h: the rule tova_decide applies, for a device to run it. */
static int tova_attn(const struct policy *p, const struct policy_layer *l,
                     struct policy_attn_rule *r)
{
	*r = (struct policy_attn_rule){
		.sinks = p->args.sinks,
		.window = p->args.window,
		.budget = policy_budget(p, l->n_seen),
		.due = l->n_new && policy_due(p, l),
	};
	return 1;
}

/* policy.h: per (sequence, layer) one record, two halves of cap
 * positions (tova_rule.h's layout): its lists hold the same ones. */
static void tova_shape(const struct policy *p, uint32_t cap,
                       struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){
		.records = 1, .record_bytes = 2 * (size_t)cap * sizeof(float),
		.positions = 1, /* one array for the layer's lists */
	};
}

/* policy.h: one job per (sequence, layer) with a query, the counts of
 * head 0's positions (the lists' lengths agree: an invariant).  The
 * protected tail, the window, is fixed, so the counts follow from the
 * numbers (policy_attn_count). */
static int tova_plan(const struct policy *p, const struct policy_layer *l,
                     const struct policy_dev_layer *c, void *jobs,
                     struct policy_dev_job *hj, uint32_t *n, char *err,
                     size_t errlen)
{
	const uint32_t len = c->len[0];
	*n = 0;
	for (uint32_t h = 1; h < p->geom.n_kv_heads; h++)
		if (c->len[h] != len)
			return errors_fmt(err, errlen, KVT_ESYS, "tova: layer "
			                  "%u: its lists' lengths differ (an "
			                  "invariant)", l->layer);
	if (!l->n_new)
		return 0; /* no query: nothing changes */
	struct policy_attn_rule r;
	(void)tova_attn(p, l, &r);
	const int due = policy_attn_due(&r);
	const struct policy_attn_counts k = policy_attn_count(
		&r, r.window, due, NULL, len, l->n_new,
		l->n_seen - l->n_new, 1); /* tail held: no position read */
	*(struct tova_rule_job *)jobs = (struct tova_rule_job){
		.ring = c->ring, .record = c->list_rec, .srec = c->state_rec,
		.cur = c->cur[0], .len = len, .n_new = l->n_new,
		.n_seen = l->n_seen, .due = (uint32_t)due, .keep = k.keep,
		.n_drop = k.n_drop, .drop_off = c->drop_off,
	};
	hj[0] = (struct policy_dev_job){
		.rec = c->state_rec, .g = POLICY_DEV_ALL, .L = len + l->n_new,
		.n_drop = k.n_drop, .drop_off = c->drop_off,
	};
	*n = 1;
	return 0;
}

static void tova_params(const struct policy *p,
                        const struct policy_dev_bufs *b, void *out)
{
	*(struct tova_rule *)out = (struct tova_rule){
		.state = b->state, .cap = b->cap, .rows = b->rows,
		.sinks = p->args.sinks, .window = p->args.window,
	};
}

static const struct policy_device_rule tova_device = {
	.name = "tova", .version = TOVA_RULE_VERSION,
	.params_bytes = sizeof(struct tova_rule),
	.job_bytes = sizeof(struct tova_rule_job),
	.shape = tova_shape, .plan = tova_plan, .params = tova_params,
};

const struct policy_ops tova_ops = {
	.name = "tova",
	.help = "TOVA: newest query's attention averaged over heads, one "
	        "decision per layer (tokens=256 | ratio=R, window=1, sinks=0, "
	        "every=N)",
	.needs = POLICY_NEED_Q | POLICY_NEED_LSE | POLICY_NEED_KV,
	.keys = POLICY_KEY_TOKENS | POLICY_KEY_RATIO | POLICY_KEY_WINDOW |
	        POLICY_KEY_SINKS | POLICY_KEY_EVERY,
	.init = tova_init,
	.decide = tova_decide,
	.device = &tova_device,
	.eval = {"tova:%s",
	         POLICY_EVAL_BYTES | POLICY_EVAL_CONTEXT |
	         POLICY_EVAL_DECODING},
};
