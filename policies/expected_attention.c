/*
 * expected_attention.c — Expected Attention (kvpress
 * ExpectedAttentionPress): once, at the end of prefill, the statistics of
 * the last staged queries stand for the queries still to come, and each
 * prompt entry scores the attention those would pay it in expectation.
 * docs/policies.md states the rule, its defaults and departures.
 * Statistics and scores are computed in double, but for the rows of K S'
 * (float, quad_form_cpu's fixed order).
 * On a device tenant the same rule runs on the device (the device rule
 * "expected_attention", expected_attention_rule.h; policies/
 * expected_attention.cu repeats these operations in this order, so the
 * kept sets are the same bits on the CPU emulator): a change here must be
 * made there too.
 */
#include "policy.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "expected_attention_rule.h"
#include "kernels.h"

#define EA_DEF_WINDOW 64u
#define EA_DEF_SINKS 4u
#define EA_DEF_RATIO 0.5
#define EA_DEF_FUTURE 512u
#define EA_DEF_THETA 10000.0

struct ea_state {
	uint32_t done; /* 1 once the prompt was compressed */
};

static int ea_init(struct policy *p, char *err, size_t errlen)
{
	struct policy_args *a = &p->args;
	if (p->geom.head_dim % 2) {
		snprintf(err, errlen, "expected_attention: head_dim %u is odd "
		         "(RoPE rotates pairs of dimensions)", p->geom.head_dim);
		return KVT_EPOLICY;
	}
	if (!(a->set & POLICY_KEY_WINDOW))
		a->window = EA_DEF_WINDOW;
	if (!a->window) {
		snprintf(err, errlen, "expected_attention: window must be >= 1 "
		         "(the staged queries the statistics come from)");
		return KVT_EPOLICY;
	}
	if (!(a->set & POLICY_KEY_SINKS))
		a->sinks = EA_DEF_SINKS;
	if (!(a->set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO))) {
		a->ratio = EA_DEF_RATIO;
		a->set |= POLICY_KEY_RATIO;
	}
	if (!(a->set & POLICY_KEY_FUTURE))
		a->future = EA_DEF_FUTURE;
	if (!(a->set & POLICY_KEY_THETA))
		a->theta = EA_DEF_THETA;
	if (!(a->set & POLICY_KEY_COV))
		a->cov = 1;
	if (!(a->set & POLICY_KEY_VNORM))
		a->vnorm = 1;
	p->layer_state_bytes = sizeof(struct ea_state);
	p->lookback = a->window;
	return 0;
}

/* RoPE frequency of pair k, as model_rope computes it. */
static float ea_freq(const struct policy *p, uint32_t k)
{
	uint32_t hd = p->geom.head_dim;
	return 1.0f / powf((float)p->args.theta, (float)(2 * k) / (float)hd);
}

/* v (one head, [head_dim]) rotated back from position pos to before RoPE:
 * the inverse of model_rope's rotation, same float angles. */
static void ea_unrope(const struct policy *p, float *v, uint32_t pos)
{
	for (uint32_t k = 0; k < p->geom.head_dim / 2; k++) {
		float ang = (float)pos * ea_freq(p, k);
		float c = cosf(ang), s = sinf(ang);
		float v0 = v[2 * k], v1 = v[2 * k + 1];
		v[2 * k] = v0 * c + v1 * s;
		v[2 * k + 1] = -v0 * s + v1 * c;
	}
}

/* rc [half][2]: mean cos and sin of the future positions' angles. */
static void ea_future_rot(const struct policy *p, uint32_t P, double *rc)
{
	uint32_t F = p->args.future;
	for (uint32_t k = 0; k < p->geom.head_dim / 2; k++) {
		double w = ea_freq(p, k), c = 0.0, s = 0.0;
		for (uint32_t t = 0; t < F; t++) {
			double ang = ((double)P + t) * w;
			c += cos(ang);
			s += sin(ang);
		}
		rc[2 * k] = c / F;
		rc[2 * k + 1] = s / F;
	}
}

/*
 * One query head's future statistics from qs [N][head_dim] (pre-RoPE,
 * stride apart): mu' [hd] and, with cov, S' [hd][hd] (float, for
 * quad_form_cpu); m [hd] and tmp [hd][hd] scratch.
 */
static void ea_stats(const struct policy *p, const float *qs, size_t stride,
                     uint32_t N, const double *rc, double *mu, float *S,
                     double *m, double *tmp)
{
	uint32_t hd = p->geom.head_dim;
	for (uint32_t d = 0; d < hd; d++) {
		double v = 0.0;
		for (uint32_t t = 0; t < N; t++)
			v += qs[(size_t)t * stride + d];
		m[d] = v / N;
	}
	/* mu' = R m */
	for (uint32_t k = 0; k < hd / 2; k++) {
		double c = rc[2 * k], s = rc[2 * k + 1];
		mu[2 * k] = c * m[2 * k] - s * m[2 * k + 1];
		mu[2 * k + 1] = s * m[2 * k] + c * m[2 * k + 1];
	}
	if (!p->args.cov)
		return;
	memset(tmp, 0, (size_t)hd * hd * sizeof(double));
	for (uint32_t t = 0; t < N; t++) {
		const float *q = qs + (size_t)t * stride;
		for (uint32_t r = 0; r < hd; r++) {
			double dr = q[r] - m[r];
			for (uint32_t c = 0; c < hd; c++)
				tmp[(size_t)r * hd + c] += dr * (q[c] - m[c]);
		}
	}
	for (size_t i = 0; i < (size_t)hd * hd; i++)
		tmp[i] /= N;
	/* S' = R S R^T: R on the rows of S (in place, a pair of rows at a
	 * time), then on the columns. */
	for (uint32_t k = 0; k < hd / 2; k++) {
		double c = rc[2 * k], s = rc[2 * k + 1];
		double *r0 = tmp + (size_t)(2 * k) * hd, *r1 = r0 + hd;
		for (uint32_t col = 0; col < hd; col++) {
			double a0 = r0[col], a1 = r1[col];
			r0[col] = c * a0 - s * a1;
			r1[col] = s * a0 + c * a1;
		}
	}
	for (uint32_t row = 0; row < hd; row++) {
		const double *r = tmp + (size_t)row * hd;
		float *o = S + (size_t)row * hd;
		for (uint32_t k = 0; k < hd / 2; k++) {
			double c = rc[2 * k], s = rc[2 * k + 1];
			double a0 = r[2 * k], a1 = r[2 * k + 1];
			o[2 * k] = (float)(c * a0 - s * a1);
			o[2 * k + 1] = (float)(s * a0 + c * a1);
		}
	}
}

/*
 * Adds (1/G) softmax_i(z_i) over the candidates (cand[i]) of one query
 * head to acc [len]; keys [len][hd] f32; z [len] scratch.  k^T S' k is
 * quad_form_cpu's, a fixed order (kernels.h) that the device rule
 * repeats, not an sgemm's.
 */
static void ea_expect(const struct policy *p, const float *keys,
                      const uint8_t *cand, uint32_t len, const double *mu,
                      const float *S, double G, double *z, double *acc)
{
	uint32_t hd = p->geom.head_dim;
	double zmax = -INFINITY;
	if (p->args.cov)
		quad_form_cpu(keys, len, hd, S, z);
	for (uint32_t i = 0; i < len; i++) {
		if (!cand[i])
			continue;
		const float *k = keys + (size_t)i * hd;
		double lin = 0.0, quad = p->args.cov ? z[i] : 0.0;
		for (uint32_t d = 0; d < hd; d++)
			lin += mu[d] * k[d];
		z[i] = lin / sqrt((double)hd) + quad / (2.0 * hd);
		if (z[i] > zmax)
			zmax = z[i];
	}
	double sum = 0.0;
	for (uint32_t i = 0; i < len; i++)
		if (cand[i])
			sum += (z[i] = exp(z[i] - zmax));
	for (uint32_t i = 0; i < len; i++)
		if (cand[i])
			acc[i] += z[i] / sum / G;
}

/* Once per (sequence, layer), at its first decode sync. */
static int ea_decides(const struct policy *p, const struct policy_layer *l)
{
	const struct ea_state *st = l->state;
	(void)p;
	return !st->done && l->phase == KVT_PHASE_DECODE;
}

static int ea_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	const struct policy_args *a = &p->args;
	struct ea_state *st = l->state;
	if (st->done || l->phase != KVT_PHASE_DECODE)
		return 0;
	st->done = 1;
	uint32_t P = l->n_seen - l->n_new, w = a->window;
	uint32_t B = policy_budget(p, P);
	uint32_t from = P > w ? P - w : 0;
	if (from < a->sinks)
		from = a->sinks;
	if (P <= B || from >= P)
		return 0;
	uint32_t N = P - from, H = ge->n_heads, hd = ge->head_dim;
	uint32_t G = H / ge->n_kv_heads, pt = ge->page_tokens;
	size_t qrow = (size_t)H * hd;
	float *qs = policy_scratch(p, (size_t)N * qrow * sizeof(float));
	double *rc = policy_scratch(p, (size_t)hd * sizeof(double));
	double *mu = policy_scratch(p, (size_t)2 * hd * sizeof(double));
	float *S = policy_scratch(p, (size_t)hd * hd * sizeof(float));
	double *tmp = policy_scratch(p, (size_t)hd * hd * sizeof(double));
	if (!qs || !rc || !mu || !S || !tmp)
		return KVT_ENOMEM;
	for (uint32_t t = 0; t < N; t++) {
		const float *row = l->staged ? l->staged(l->staged_ctx,
		                                         from + t)
		                             : NULL;
		if (!row)
			return 0; /* the ring lost the window: keep all */
		/* Checked when they were new; checked again, as the engine
		 * can still write the ring since. */
		int rc_ = policy_check_row(p, l->layer, from + t, row);
		if (rc_)
			return rc_;
		float *q = qs + t * qrow;
		memcpy(q, policy_row_q(p, row), qrow * sizeof(float));
		for (uint32_t j = 0; j < H; j++)
			ea_unrope(p, q + (size_t)j * hd, from + t);
	}
	ea_future_rot(p, P, rc);
	size_t rb = (size_t)hd * kvt_dtype_size(ge->dtype);
	for (uint32_t g = 0; g < ge->n_kv_heads; g++) {
		struct policy_head *h = &l->heads[g];
		uint32_t len = h->len;
		if (!len)
			continue;
		float *keys = policy_scratch(p, (size_t)len * hd * sizeof(float));
		float *vr = policy_scratch(p, (size_t)hd * sizeof(float));
		double *z = policy_scratch(p, (size_t)len * sizeof(double));
		double *acc = policy_scratch(p, (size_t)len * sizeof(double));
		float *s = policy_scratch(p, (size_t)len * sizeof(float));
		uint8_t *cand = policy_scratch(p, len);
		uint8_t *prot = policy_scratch(p, len);
		uint32_t *sc = policy_scratch(p, (size_t)len * sizeof(uint32_t));
		if (!keys || !vr || !z || !acc || !s || !cand || !prot || !sc)
			return KVT_ENOMEM;
		uint32_t np = 0, nc = 0;
		for (uint32_t i = 0; i < len; i++) {
			uint32_t pos = h->pos[i];
			const char *page = h->pages[i / pt];
			dtype_to_f32(page + (size_t)(i % pt) * rb, ge->dtype,
			             keys + (size_t)i * hd, hd);
			cand[i] = pos >= a->sinks && pos < P;
			prot[i] = !cand[i];
			np += pos < a->sinks;
			nc += cand[i];
			acc[i] = 0.0;
		}
		if (!nc)
			continue;
		for (uint32_t j = 0; j < G; j++) {
			ea_stats(p, qs + (size_t)(g * G + j) * hd, qrow, N, rc,
			         mu, S, mu + hd, tmp);
			ea_expect(p, keys, cand, len, mu, S, G, z, acc);
		}
		for (uint32_t i = 0; i < len; i++) {
			double v = acc[i];
			if (a->vnorm && cand[i]) {
				const char *page = h->pages[i / pt];
				dtype_to_f32(page + (size_t)pt * rb +
				                     (size_t)(i % pt) * rb,
				             ge->dtype, vr, hd);
				double ss = 0.0;
				for (uint32_t d = 0; d < hd; d++)
					ss += (double)vr[d] * vr[d];
				v = (v + a->eps) * sqrt(ss);
			}
			s[i] = (float)v;
		}
		uint32_t k = B > np ? B - np : 0;
		select_topk_cpu(s, h->pos, prot, len, k, h->drop, sc);
	}
	return 0;
}

/* The device rule's params (policy_prompt_rule.params). */
static void ea_rule_params(const struct policy *p,
                           const struct kvt_backend_rows *rows, void *params)
{
	const struct policy_args *a = &p->args;
	*(struct expected_attention_rule *)params =
		(struct expected_attention_rule){
			.rows = *rows, .sinks = a->sinks, .future = a->future,
			.theta = (float)a->theta, .cov = a->cov,
			.vnorm = a->vnorm, .eps = a->eps};
}

/* policy_prompt_rule.plan: the rule ea_decide applies at this sync as
 * the device rule's jobs, one a KV head (expected_attention_rule.h). */
static uint32_t ea_plan(struct policy *p, struct policy_layer *l,
                        const struct policy_prompt_at *at, void *jobs,
                        struct policy_prompt_job *led)
{
	const struct policy_args *a = &p->args;
	struct ea_state *st = l->state;
	const uint32_t P = l->n_seen - l->n_new, B = policy_budget(p, P);
	uint32_t from = P > a->window ? P - a->window : 0;
	if (from < a->sinks)
		from = a->sinks;
	st->done = 1;
	if (!at)
		return 0;
	struct expected_attention_rule_job *j = jobs;
	if (P <= B || from >= P) { /* keeps all: the new rows checked */
		j[0] = (struct expected_attention_rule_job){
			.ring = at->ring, .record = at->record, .len = P,
			.n_new = at->n_new, .from = P};
		led[0] = (struct policy_prompt_job){UINT32_MAX, 0,
		                                    at->drop_off};
		return 1;
	}
	/* ea_decide reads the statistics' rows through the ring; one it no
	 * longer holds keeps all there */
	if ((uint64_t)from + at->stage_tokens < (uint64_t)P + at->n_new)
		return 0;
	/* candidates [sinks, P), the sinks counting against the budget */
	const uint32_t keep = B > a->sinks ? B - a->sinks : 0;
	const uint32_t nd = P - a->sinks > keep ? P - a->sinks - keep : 0;
	for (uint32_t h = 0; h < p->geom.n_kv_heads; h++) {
		const uint32_t off = at->drop_off + h * nd;
		j[h] = (struct expected_attention_rule_job){
			.ring = at->ring, .record = at->record + h, .g = h,
			.len = P, .n_new = at->n_new, .from = from, .due = 1,
			.keep = keep, .n_drop = nd, .drop_off = off};
		led[h] = (struct policy_prompt_job){h, nd, off};
	}
	return p->geom.n_kv_heads;
}

static const struct policy_prompt_rule ea_window_rule = {
	.name = "expected_attention",
	.version = EXPECTED_ATTENTION_RULE_VERSION,
	.params_bytes = sizeof(struct expected_attention_rule),
	.job_bytes = sizeof(struct expected_attention_rule_job),
	.params = ea_rule_params,
	.plan = ea_plan,
};

const struct policy_ops expected_attention_ops = {
	.name = "expected_attention",
	.help = "Expected Attention: recent staged queries' mean/covariance "
	        "under averaged future RoPE, times the value norm, once at "
	        "the end of prefill (window=64, ratio=0.5 | tokens=N, "
	        "sinks=4, future=512, theta=10000, cov=1, vnorm=1, eps=0)",
	.needs = POLICY_NEED_Q | POLICY_NEED_KV | POLICY_NEED_V,
	.keys = POLICY_KEY_WINDOW | POLICY_KEY_TOKENS | POLICY_KEY_RATIO |
	        POLICY_KEY_SINKS | POLICY_KEY_FUTURE | POLICY_KEY_THETA |
	        POLICY_KEY_COV | POLICY_KEY_VNORM | POLICY_KEY_EPS,
	.init = ea_init,
	.decide = ea_decide,
	.decides = ea_decides,
	.prompt = &ea_window_rule,
	.eval = {"expected_attention:%s",
	         POLICY_EVAL_CONTEXT},
};
