/*
 * oracle.c — KVzip, KVzip+ and future-attention targets from dense
 * attention; see oracle.h for the definitions.
 *
 * The pass (oracle_run) hands model_forward an attention callback that
 * sees the whole sequence at once (pos0 0, n tokens): per query head it
 * forms S = Q K^T / sqrt(hd) with one sgemm, the causal softmax row by row
 * (max subtracted, sum in double, as the engine's dense attention), the
 * output P V with a second sgemm, and then reduces P into the requested
 * targets before the next head overwrites it.
 */
#include "oracle.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int oracle_kind_parse(const char *s, enum oracle_kind *out)
{
	if (!strcmp(s, "kvzip"))
		*out = ORACLE_KVZIP;
	else if (!strcmp(s, "kvzip+") || !strcmp(s, "kvzip_plus"))
		*out = ORACLE_KVZIP_PLUS;
	else if (!strcmp(s, "future") || !strcmp(s, "future_attention"))
		*out = ORACLE_FUTURE;
	else
		return KVT_EINVAL;
	return 0;
}

const char *oracle_kind_name(enum oracle_kind k)
{
	switch (k) {
	case ORACLE_KVZIP: return "kvzip";
	case ORACLE_KVZIP_PLUS: return "kvzip+";
	case ORACLE_FUTURE: return "future";
	}
	return "?";
}

uint32_t oracle_default_sep(const struct model *m, int32_t *sep)
{
	if (m->cfg.vocab_size == 256) {
		sep[0] = '\n';
		sep[1] = '\n';
		return 2;
	}
	sep[0] = MODEL_BOS;
	return 1;
}

int oracle_repeat_sep(const struct tok *t, int32_t *sep, uint32_t *n,
                      char *err, size_t errlen)
{
	static const char prompt[] = "\n\nRepeat the previous context exactly.";
	int chatml = tok_find(t, "<|im_start|>") >= 0 &&
	             tok_find(t, "<|im_end|>") >= 0;
	const char *turn = chatml ? "<|im_end|>\n<|im_start|>assistant\n"
	                          : "\n";
	struct tok_ids ids = {0};
	int rc = tok_encode(t, prompt, strlen(prompt), 0, &ids, err, errlen);
	if (!rc)
		rc = tok_encode(t, turn, strlen(turn), TOK_SPECIAL, &ids, err,
		                errlen);
	if (!rc && ids.n > ORACLE_SEP_MAX) {
		snprintf(err, errlen, "oracle: the repeat prompt takes %zu "
		         "tokens, more than %d", ids.n, ORACLE_SEP_MAX);
		rc = KVT_EINVAL;
	}
	if (!rc) {
		memcpy(sep, ids.v, ids.n * sizeof(int32_t));
		*n = (uint32_t)ids.n;
	}
	free(ids.v);
	return rc;
}

uint32_t oracle_kvzip_max_ctx(uint32_t context, uint32_t n_sep)
{
	return context < 1 + n_sep ? 0 : (context - 1 - n_sep) / 2;
}

uint32_t oracle_max_ctx(const struct model *m, uint32_t context,
                        uint32_t n_sep)
{
	uint32_t b = m->bos >= 0;
	return context < b + n_sep ? 0 : (context - b - n_sep) / 2;
}

uint32_t oracle_scored(const struct model *m, uint32_t n_ctx)
{
	return (m->bos >= 0) + n_ctx;
}

/* ---------------------------------------------------------------- pass */

struct pass {
	const struct model *m;
	const struct oracle_req *r;
	float *S;   /* [n][n] probabilities of the current head */
	float *U;   /* [scored][d] W_O^h v_i of the current head */
	float *nv;  /* [scored] ||W_O^h v_i|| */
	float *inx; /* [n] 1 / ||x_j|| */
};

/* KVzip and KVzip+ maxima of head h (group g) over the queries [q0, n). */
static void reduce_kvzip(struct pass *p, uint32_t l, uint32_t h, uint32_t g,
                         const float *v)
{
	const struct oracle_req *r = p->r;
	const struct model_config *c = &p->m->cfg;
	const uint32_t n = r->n, T = r->scored, Hkv = c->n_kv_heads,
	               hd = c->head_dim, d = c->dim;
	if (r->kvzip_plus) {
		/* U = V_g W_O^h^T: W_O^h = columns h*hd.. of wo [d][d] */
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T,
		            (int)d, (int)hd, 1.0f, v + (size_t)g * hd,
		            (int)(Hkv * hd),
		            p->m->wo + (size_t)l * d * d + (size_t)h * hd,
		            (int)d, 0.0f, p->U, (int)d);
		for (uint32_t i = 0; i < T; i++) {
			const float *u = p->U + (size_t)i * d;
			double ss = 0.0;
			for (uint32_t e = 0; e < d; e++)
				ss += (double)u[e] * u[e];
			p->nv[i] = (float)sqrt(ss);
		}
	}
	float *oz = r->kvzip ? r->kvzip + ((size_t)l * Hkv + g) * T : NULL;
	float *op = r->kvzip_plus ? r->kvzip_plus + ((size_t)l * Hkv + g) * T
	                          : NULL;
	for (uint32_t j = r->q0; j < n; j++) {
		const float *row = p->S + (size_t)j * n;
		if (oz)
			for (uint32_t i = 0; i < T; i++)
				oz[i] = row[i] > oz[i] ? row[i] : oz[i];
		if (op) {
			float ix = p->inx[j];
			for (uint32_t i = 0; i < T; i++) {
				float a = row[i] * p->nv[i] * ix;
				op[i] = a > op[i] ? a : op[i];
			}
		}
	}
}

static void reduce_windows(struct pass *p, uint32_t l, uint32_t g)
{
	const struct oracle_req *r = p->r;
	const struct model_config *c = &p->m->cfg;
	const uint32_t n = r->n, G = c->n_heads / c->n_kv_heads;
	for (uint32_t w = 0; w < r->n_win; w++) {
		const struct oracle_win *wn = &r->win[w];
		float *o = wn->out + ((size_t)l * c->n_kv_heads + g) * r->rows;
		for (uint32_t i = 0; i < r->rows; i++) {
			uint64_t a = (uint64_t)i + wn->lo + 1,
			         b = (uint64_t)i + wn->hi;
			if (b > r->plain - 1)
				b = r->plain - 1;
			/* Horner's rule: each query read decays the sum once */
			const double dc = wn->decay > 0.0f ? wn->decay : 1.0;
			double s = 0.0;
			for (uint64_t t = a; t <= b; t++)
				s = dc * s + p->S[t * n + i];
			if (dc != 1.0 && a <= b && b < (uint64_t)i + wn->hi)
				s *= pow(dc, (double)((uint64_t)i + wn->hi - b));
			if (wn->mean)
				o[i] += (float)(s / G);
			else if ((float)s > o[i])
				o[i] = (float)s;
		}
	}
}

static int pass_attend(void *ctx, uint32_t l, uint32_t pos0, uint32_t n,
                       const float *x, const float *q, const float *k,
                       const float *v, float *out, float *lse)
{
	struct pass *p = ctx;
	const struct oracle_req *r = p->r;
	const struct model_config *c = &p->m->cfg;
	const uint32_t H = c->n_heads, Hkv = c->n_kv_heads, G = H / Hkv,
	               hd = c->head_dim, d = c->dim;
	if (pos0 != 0 || n != r->n)
		return KVT_EINVAL; /* the pass runs in one step */
	const float scale = 1.0f / sqrtf((float)hd);
	if (r->xs)
		memcpy(r->xs + (size_t)l * r->xs_rows * d, x,
		       sizeof(float) * r->xs_rows * d);
	if (r->kvzip_plus)
		for (uint32_t j = r->q0; j < n; j++) {
			const float *xj = x + (size_t)j * d;
			double ss = 0.0;
			for (uint32_t e = 0; e < d; e++)
				ss += (double)xj[e] * xj[e];
			p->inx[j] = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
		}
	size_t per = (size_t)Hkv * r->scored;
	if (r->kvzip)
		memset(r->kvzip + l * per, 0, per * sizeof(float));
	if (r->kvzip_plus)
		memset(r->kvzip_plus + l * per, 0, per * sizeof(float));
	for (uint32_t w = 0; w < r->n_win; w++)
		memset(r->win[w].out + (size_t)l * Hkv * r->rows, 0,
		       sizeof(float) * Hkv * r->rows);
	for (uint32_t h = 0; h < H; h++) {
		uint32_t g = h / G;
		float *S = p->S;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n,
		            (int)n, (int)hd, scale, q + (size_t)h * hd,
		            (int)(H * hd), k + (size_t)g * hd, (int)(Hkv * hd),
		            0.0f, S, (int)n);
		for (uint32_t t = 0; t < n; t++) {
			float *s = S + (size_t)t * n, mx = -INFINITY;
			for (uint32_t i = 0; i <= t; i++)
				mx = s[i] > mx ? s[i] : mx;
			double sum = 0.0;
			for (uint32_t i = 0; i <= t; i++) {
				s[i] = expf(s[i] - mx);
				sum += s[i];
			}
			float inv = (float)(1.0 / sum);
			for (uint32_t i = 0; i <= t; i++)
				s[i] *= inv;
			for (uint32_t i = t + 1; i < n; i++)
				s[i] = 0.0f;
			lse[(size_t)t * H + h] = mx + (float)log(sum);
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n,
		            (int)hd, (int)n, 1.0f, S, (int)n, v + (size_t)g * hd,
		            (int)(Hkv * hd), 0.0f, out + (size_t)h * hd,
		            (int)(H * hd));
		if (r->kvzip || r->kvzip_plus)
			reduce_kvzip(p, l, h, g, v);
		reduce_windows(p, l, g);
	}
	if (r->kvzip_plus)
		for (size_t i = 0; i < per; i++) {
			float *o = r->kvzip_plus + l * per + i;
			*o = logf(*o > 1e-30f ? *o : 1e-30f);
		}
	return 0;
}

int oracle_run(const struct model *m, const struct oracle_req *r)
{
	const struct model_config *c = &m->cfg;
	int kz = r->kvzip || r->kvzip_plus;
	if (!r->n || (kz && (r->q0 >= r->n || !r->scored ||
	                     r->scored > r->q0)) ||
	    (r->n_win && (r->n_win > ORACLE_WIN_MAX || !r->rows ||
	                  r->rows > r->plain || r->plain > r->n)) ||
	    (r->xs && r->xs_rows > r->n))
		return KVT_EINVAL;
	for (uint32_t w = 0; w < r->n_win; w++)
		if (!r->win[w].out || r->win[w].lo >= r->win[w].hi ||
		    !(r->win[w].decay >= 0.0f && r->win[w].decay <= 1.0f))
			return KVT_EINVAL;
	struct pass p = {m, r, NULL, NULL, NULL, NULL};
	p.S = malloc(sizeof(float) * (size_t)r->n * r->n);
	if (r->kvzip_plus) {
		p.U = malloc(sizeof(float) * (size_t)r->scored * c->dim);
		p.nv = malloc(sizeof(float) * r->scored);
		p.inx = malloc(sizeof(float) * r->n);
	}
	int rc = KVT_ENOMEM;
	if (p.S && (!r->kvzip_plus || (p.U && p.nv && p.inx))) {
		struct model_attn a = {pass_attend, &p};
		rc = model_forward(m, r->tokens, r->n, 0, &a, r->logits);
	}
	free(p.S);
	free(p.U);
	free(p.nv);
	free(p.inx);
	return rc;
}

int oracle_kvzip(const struct model *m, const int32_t *ctx, uint32_t n_ctx,
                 const int32_t *sep, uint32_t n_sep, int plus, float *out)
{
	if (!n_ctx)
		return KVT_EINVAL;
	const uint32_t b = m->bos >= 0, T = b + n_ctx, j0 = T + n_sep,
	               N = j0 + n_ctx;
	int32_t *seq = malloc(sizeof(int32_t) * N);
	if (!seq)
		return KVT_ENOMEM;
	if (b)
		seq[0] = m->bos;
	memcpy(seq + b, ctx, n_ctx * sizeof(int32_t));
	memcpy(seq + T, sep, n_sep * sizeof(int32_t));
	memcpy(seq + j0, ctx, n_ctx * sizeof(int32_t));
	struct oracle_req r = {.tokens = seq, .n = N, .scored = T, .q0 = T};
	if (plus)
		r.kvzip_plus = out;
	else
		r.kvzip = out;
	int rc = oracle_run(m, &r);
	free(seq);
	return rc;
}

int oracle_future(const struct model *m, const int32_t *tokens, uint32_t T,
                  uint32_t horizon, float *out)
{
	if (!T || !horizon)
		return KVT_EINVAL;
	struct oracle_req r = {.tokens = tokens, .n = T, .rows = T, .plain = T,
	                       .n_win = 1, .win = {{0, horizon, 0, out}}};
	return oracle_run(m, &r);
}

int oracle_write(const char *path, enum oracle_kind kind,
                 const struct model *m, uint32_t T, uint32_t horizon,
                 const float *scores, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	uint32_t hdr[8] = {ORACLE_FILE_MAGIC, 1, (uint32_t)kind, c->n_layers,
	                   c->n_kv_heads, T,
	                   kind == ORACLE_FUTURE ? horizon : 0, 0};
	size_t n = (size_t)c->n_layers * c->n_kv_heads * T;
	FILE *f = fopen(path, "wb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return KVT_ESYS;
	}
	int bad = fwrite(hdr, sizeof(hdr), 1, f) != 1 ||
	          fwrite(scores, sizeof(float), n, f) != n;
	bad |= fclose(f) != 0;
	if (bad) {
		snprintf(err, errlen, "%s: write failed", path);
		return KVT_ESYS;
	}
	return 0;
}
