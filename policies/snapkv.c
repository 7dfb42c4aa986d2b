/*
 * snapkv.c — SnapKV: once, at the end of prefill (the first decode sync of
 * a (sequence, layer)), the last w prompt queries (the observation window)
 * vote for the prompt entries each KV head keeps, max-pooled in position
 * order; the window, the sinks and the decode tokens are never evicted.
 * The rule, budget and defaults: docs/policies.md, **snapkv**.  The
 * tenant needs stage_tokens >= headroom + w (the lookback).  pyramidkv
 * (pyramidkv.c) runs the same compression with its own per-layer budget:
 * snapkv_init_args and snapkv_compress (snapkv.h) are shared.  On a device
 * tenant the same rule runs on the device (the device rule "snapkv",
 * snapkv_rule.h; policies/snapkv.cu repeats these float operations in this
 * order): a change here must be made there too.
 */
#include "snapkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define SNAPKV_DEF_WINDOW 64u
#define SNAPKV_DEF_KERNEL 5u
#define SNAPKV_DEF_RATIO 0.5

struct snapkv_state {
	uint32_t done; /* 1 once the prompt was compressed */
};

int snapkv_init_args(struct policy *p, char *err, size_t errlen)
{
	struct policy_args *a = &p->args;
	if (!(a->set & POLICY_KEY_WINDOW))
		a->window = SNAPKV_DEF_WINDOW;
	if (!a->window) {
		snprintf(err, errlen, "%s: window must be >= 1 (the "
		         "observation window)", p->ops->name);
		return KVT_EPOLICY;
	}
	if (!(a->set & POLICY_KEY_KERNEL))
		a->kernel = SNAPKV_DEF_KERNEL;
	if (!(a->set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO))) {
		a->ratio = SNAPKV_DEF_RATIO;
		a->set |= POLICY_KEY_RATIO;
	}
	p->layer_state_bytes = sizeof(struct snapkv_state);
	p->lookback = a->window;
	return 0;
}

/* Orders entry indices by position (qsort context through a file static is
 * avoided: positions are unique, so sort (pos, index) pairs). */
static int pair_cmp(const void *a, const void *b)
{
	const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int snapkv_decides(const struct policy *p, const struct policy_layer *l)
{
	const struct snapkv_state *st = l->state;
	(void)p;
	return !st->done && l->phase == KVT_PHASE_DECODE;
}

void snapkv_rule_params(const struct policy *p,
                        const struct kvt_backend_rows *rows, void *params)
{
	*(struct snapkv_rule *)params = (struct snapkv_rule){
		.rows = *rows, .kernel = p->args.kernel, .sinks = p->args.sinks};
}

uint32_t snapkv_plan(struct policy *p, struct policy_layer *l,
                     const struct policy_prompt_at *at, void *jobs,
                     struct policy_prompt_job *led, snapkv_budget_fn budget)
{
	struct snapkv_state *st = l->state;
	const uint32_t P = l->n_seen - l->n_new, w = p->args.window;
	const uint32_t B = budget(p, l->layer, P);
	st->done = 1;
	if (!at)
		return 0;
	struct snapkv_rule_job *j = jobs;
	if (P <= w || P <= B) { /* keeps all: the new rows checked */
		j[0] = (struct snapkv_rule_job){
			.ring = at->ring, .record = at->record, .len = P,
			.n_new = at->n_new};
		led[0] = (struct policy_prompt_job){UINT32_MAX, 0,
		                                    at->drop_off};
		return 1;
	}
	/* snapkv_compress reads the window through the ring; one it no
	 * longer holds keeps all there */
	if ((uint64_t)P - w + at->stage_tokens < (uint64_t)P + at->n_new)
		return 0;
	/* candidates [0, from): the window, the new entries and the
	 * sinks protected; of the others keep stay */
	const uint32_t from = P - w, ms = p->args.sinks < from ? p->args.sinks
	                                                      : from;
	const uint32_t np = w + ms, keep = B > np ? B - np : 0;
	const uint32_t nd = from - ms > keep ? from - ms - keep : 0;
	for (uint32_t h = 0; h < p->geom.n_kv_heads; h++) {
		const uint32_t off = at->drop_off + h * nd;
		j[h] = (struct snapkv_rule_job){
			.ring = at->ring, .record = at->record + h, .g = h,
			.len = P, .n_new = at->n_new, .w = w, .due = 1,
			.keep = keep, .n_drop = nd, .drop_off = off};
		led[h] = (struct policy_prompt_job){h, nd, off};
	}
	return p->geom.n_kv_heads;
}

int snapkv_compress(struct policy *p, struct policy_layer *l,
                    snapkv_budget_fn budget)
{
	const struct policy_geom *ge = &p->geom;
	struct snapkv_state *st = l->state;
	if (st->done || l->phase != KVT_PHASE_DECODE)
		return 0;
	st->done = 1;
	uint32_t P = l->n_seen - l->n_new, w = p->args.window;
	uint32_t B = budget(p, l->layer, P);
	if (P <= w || P <= B)
		return 0;
	uint32_t G = ge->n_heads / ge->n_kv_heads, hd = ge->head_dim;
	size_t qrow = (size_t)ge->n_heads * hd;
	float *qo = policy_scratch(p, (size_t)w * qrow * sizeof(float));
	float *lo = policy_scratch(p, (size_t)w * ge->n_heads * sizeof(float));
	uint32_t *qpos = policy_scratch(p, (size_t)w * sizeof(uint32_t));
	if (!qo || !lo || !qpos)
		return KVT_ENOMEM;
	for (uint32_t t = 0; t < w; t++) {
		const float *row = l->staged ? l->staged(l->staged_ctx,
		                                         P - w + t)
		                             : NULL;
		if (!row)
			return 0; /* the ring lost the window: keep all */
		/* Checked when they were new; checked again, as the engine
		 * can still write the ring since. */
		int rc = policy_check_row(p, l->layer, P - w + t, row);
		if (rc)
			return rc;
		memcpy(qo + t * qrow, policy_row_q(p, row),
		       qrow * sizeof(float));
		memcpy(lo + (size_t)t * ge->n_heads, policy_row_lse(p, row),
		       ge->n_heads * sizeof(float));
		qpos[t] = P - w + t;
	}
	uint32_t from = P - w; /* candidates: pos < from */
	float inv = 1.0f / ((float)w * (float)G);
	for (uint32_t g = 0; g < ge->n_kv_heads; g++) {
		struct policy_head *h = &l->heads[g];
		uint32_t len = h->len;
		if (!len)
			continue;
		const float *att = policy_attn(p, g, qo, lo, qpos, w, h->pages,
		                               ge->page_tokens, h->pos, len);
		float *raw = policy_scratch(p, len * sizeof(float));
		float *s = policy_scratch(p, len * sizeof(float));
		uint8_t *prot = policy_scratch(p, len);
		uint64_t *ord = policy_scratch(p, len * sizeof(uint64_t));
		uint32_t *sc = policy_scratch(p, len * sizeof(uint32_t));
		if (!att || !raw || !s || !prot || !ord || !sc)
			return KVT_ENOMEM;
		uint32_t nc = 0, np = 0;
		for (uint32_t i = 0; i < len; i++) {
			uint32_t pos = h->pos[i];
			prot[i] = pos >= from || pos < p->args.sinks;
			np += prot[i] && pos < P;
			s[i] = 0.0f;
			if (pos >= from)
				continue;
			float v = 0.0f;
			for (uint32_t t = 0; t < w; t++)
				for (uint32_t j = 0; j < G; j++)
					v += att[((size_t)t * G + j) * len + i];
			raw[i] = v * inv;
			ord[nc++] = (uint64_t)pos << 32 | i;
		}
		/* Max pool over candidates in position order. */
		qsort(ord, nc, sizeof(*ord), pair_cmp);
		uint32_t r = p->args.kernel / 2;
		for (uint32_t c = 0; c < nc; c++) {
			uint32_t a = c > r ? c - r : 0;
			uint32_t b = c + r < nc ? c + r : nc - 1;
			float m = raw[(uint32_t)ord[a]];
			for (uint32_t e = a + 1; e <= b; e++) {
				float v = raw[(uint32_t)ord[e]];
				if (v > m || m != m)
					m = v;
			}
			s[(uint32_t)ord[c]] = m;
		}
		uint32_t k = B > np ? B - np : 0;
		select_topk_cpu(s, h->pos, prot, len, k, h->drop, sc);
	}
	return 0;
}

/* SnapKV's budget: the configured one over the prompt, every layer alike. */
static uint32_t snapkv_budget(const struct policy *p, uint32_t layer,
                              uint32_t P)
{
	return policy_budget(p, P);
}

static int snapkv_decide(struct policy *p, struct policy_layer *l)
{
	return snapkv_compress(p, l, snapkv_budget);
}

static uint32_t snapkv_plan_op(struct policy *p, struct policy_layer *l,
                               const struct policy_prompt_at *at, void *jobs,
                               struct policy_prompt_job *led)
{
	return snapkv_plan(p, l, at, jobs, led, snapkv_budget);
}

static const struct policy_prompt_rule snapkv_window_rule = {
	.name = "snapkv",
	.version = SNAPKV_RULE_VERSION,
	.params_bytes = sizeof(struct snapkv_rule),
	.job_bytes = sizeof(struct snapkv_rule_job),
	.params = snapkv_rule_params,
	.plan = snapkv_plan_op,
};

const struct policy_ops snapkv_ops = {
	.name = "snapkv",
	.help = "SnapKV: last-window attention, max-pooled, once at the end "
	        "of prefill (window=64, kernel=5, ratio=0.5 | tokens=N, "
	        "sinks=0)",
	.needs = POLICY_NEED_Q | POLICY_NEED_LSE | POLICY_NEED_KV,
	.keys = POLICY_KEY_WINDOW | POLICY_KEY_KERNEL | POLICY_KEY_TOKENS |
	        POLICY_KEY_RATIO | POLICY_KEY_SINKS,
	.init = snapkv_init_args,
	.decide = snapkv_decide,
	.decides = snapkv_decides,
	.prompt = &snapkv_window_rule,
	.eval = {"snapkv:%s,window=16,kernel=5",
	         POLICY_EVAL_BYTES | POLICY_EVAL_CONTEXT},
};
