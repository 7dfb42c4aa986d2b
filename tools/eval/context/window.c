/*
 * window.c — protocol 1's machinery (context.h has the contracts): the
 * in-process cache with its BLAS attention and taps, the full-cache
 * reference of a window, and a policy's run on it, through kvtrimd or
 * from keep flags computed in process.
 */
#include "context.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "../common/eval.h"
#include "kernels.h"

struct ctx_cache {
	const struct model *m;
	uint32_t cap;
	uint32_t *len;      /* [L * n_kv] */
	float *k, *v;       /* [L][n_kv][cap][hd] */
	float *S;           /* [s_rows][cap] probabilities of one head */
	uint32_t s_rows;
	float *red;         /* [cap] one head's reduction */
	const struct ctx_tap *tap; /* of the step running */
};

int ctx_cache_open(const struct model *m, uint32_t cap, struct ctx_cache **out)
{
	const struct model_config *mc = &m->cfg;
	size_t nl = (size_t)mc->n_layers * mc->n_kv_heads;
	struct ctx_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return KVT_ENOMEM;
	c->m = m;
	c->cap = cap;
	c->len = calloc(nl, sizeof(uint32_t));
	c->k = malloc(sizeof(float) * nl * cap * mc->head_dim);
	c->v = malloc(sizeof(float) * nl * cap * mc->head_dim);
	c->red = malloc(sizeof(float) * cap);
	if (!c->len || !c->k || !c->v || !c->red) {
		ctx_cache_close(c);
		return KVT_ENOMEM;
	}
	*out = c;
	return 0;
}

void ctx_cache_close(struct ctx_cache *c)
{
	if (!c)
		return;
	free(c->len);
	free(c->k);
	free(c->v);
	free(c->S);
	free(c->red);
	free(c);
}

void ctx_cache_truncate(struct ctx_cache *c, uint32_t n)
{
	const struct model_config *mc = &c->m->cfg;
	for (size_t li = 0; li < (size_t)mc->n_layers * mc->n_kv_heads; li++)
		c->len[li] = c->len[li] < n ? c->len[li] : n;
}

static size_t list_of(const struct ctx_cache *c, uint32_t l, uint32_t g)
{
	return (size_t)l * c->m->cfg.n_kv_heads + g;
}

float *ctx_cache_k(struct ctx_cache *c, uint32_t l, uint32_t g)
{
	return c->k + list_of(c, l, g) * c->cap * c->m->cfg.head_dim;
}

float *ctx_cache_v(struct ctx_cache *c, uint32_t l, uint32_t g)
{
	return c->v + list_of(c, l, g) * c->cap * c->m->cfg.head_dim;
}

uint32_t *ctx_cache_len(struct ctx_cache *c, uint32_t l, uint32_t g)
{
	return &c->len[list_of(c, l, g)];
}

uint64_t ctx_cache_kept(const struct ctx_cache *c)
{
	const struct model_config *mc = &c->m->cfg;
	uint64_t s = 0;
	for (size_t li = 0; li < (size_t)mc->n_layers * mc->n_kv_heads; li++)
		s += c->len[li];
	return s;
}

/* Softmax of row s over its first nv entries in place (the rest set 0);
 * returns the lse. */
static float softmax_row(float *s, uint32_t nv, uint32_t N)
{
	float lse = paged_attention_softmax_cpu(s, nv);
	for (uint32_t i = nv; i < N; i++)
		s[i] = 0.0f;
	return lse;
}

/* The model_attn callback: append, attend with BLAS, tap. */
static int attend(void *ctx, uint32_t l, uint32_t pos0, uint32_t n,
                  const float *x, const float *q, const float *k,
                  const float *v, float *out, float *lse)
{
	struct ctx_cache *c = ctx;
	const struct model_config *mc = &c->m->cfg;
	const struct ctx_tap *tp = c->tap;
	const uint32_t hd = mc->head_dim, H = mc->n_heads, nkv = mc->n_kv_heads,
	               G = H / nkv;
	const float scale = 1.0f / sqrtf((float)hd);
	(void)pos0;
	for (uint32_t g = 0; g < nkv; g++)
		if (c->len[list_of(c, l, g)] + n > c->cap)
			return KVT_ETOOLONG;
	if (n > c->s_rows) {
		free(c->S);
		c->S = malloc(sizeof(float) * (size_t)n * c->cap);
		c->s_rows = c->S ? n : 0;
		if (!c->S)
			return KVT_ENOMEM;
	}
	for (uint32_t g = 0; g < nkv; g++) {
		size_t li = list_of(c, l, g);
		uint32_t len = c->len[li], N = len + n;
		float *K = ctx_cache_k(c, l, g), *V = ctx_cache_v(c, l, g);
		for (uint32_t t = 0; t < n; t++) {
			memcpy(K + (size_t)(len + t) * hd,
			       k + ((size_t)t * nkv + g) * hd, sizeof(float) * hd);
			memcpy(V + (size_t)(len + t) * hd,
			       v + ((size_t)t * nkv + g) * hd, sizeof(float) * hd);
		}
		float *red = tp && tp->red ? tp->red + li * tp->ncols : NULL;
		if (red)
			memset(red, 0, sizeof(float) * tp->ncols);
		for (uint32_t h = g * G; h < (g + 1) * G; h++) {
			float *S = c->S;
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
			            (int)n, (int)N, (int)hd, scale, q + (size_t)h * hd,
			            (int)(H * hd), K, (int)hd, 0.0f, S, (int)N);
			for (uint32_t t = 0; t < n; t++)
				lse[(size_t)t * H + h] = softmax_row(
					S + (size_t)t * N, len + t + 1, N);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
			            (int)n, (int)hd, (int)N, 1.0f, S, (int)N, V,
			            (int)hd, 0.0f, out + (size_t)h * hd,
			            (int)(H * hd));
			if (!red)
				continue;
			uint32_t nc = tp->ncols < N ? tp->ncols : N;
			memset(c->red, 0, sizeof(float) * nc);
			for (uint32_t t = tp->r0; t < tp->r1 && t < n; t++) {
				const float *s = S + (size_t)t * N;
				for (uint32_t i = 0; i < nc; i++)
					c->red[i] = tp->max ? (s[i] > c->red[i] ? s[i]
					                       : c->red[i])
					            : c->red[i] + s[i];
			}
			for (uint32_t i = 0; i < nc; i++)
				red[i] = c->red[i] > red[i] ? c->red[i] : red[i];
		}
	}
	for (uint32_t g = 0; g < nkv; g++)
		c->len[list_of(c, l, g)] += n;
	if (tp && tp->x)
		memcpy(tp->x + (size_t)l * n * mc->dim, x,
		       sizeof(float) * n * mc->dim);
	if (tp && tp->q)
		memcpy(tp->q + (size_t)l * n * H * hd, q,
		       sizeof(float) * n * H * hd);
	if (tp && tp->lse)
		memcpy(tp->lse + (size_t)l * n * H, lse, sizeof(float) * n * H);
	return 0;
}

int ctx_cache_step(struct ctx_cache *c, const int32_t *tok, uint32_t n,
                   uint32_t pos0, const struct ctx_tap *tap, float *logits)
{
	struct model_attn a = {attend, c};
	c->tap = tap;
	int rc = model_forward(c->m, tok, n, pos0, &a, logits);
	c->tap = NULL;
	return rc;
}

/* ------------------------------------------------------------ a window */

void ctx_window_free(struct ctx_window *w)
{
	ctx_cache_close(w->full);
	free(w->x);
	free(w->q);
	free(w->lse);
	free(w->ref);
	free(w->kvzip);
	free(w->hind);
	memset(w, 0, sizeof(*w));
}

int ctx_window_build(const struct model *m, const int32_t *tok, uint32_t P,
                     uint32_t T, const int32_t *sep, uint32_t n_sep,
                     struct ctx_window *w)
{
	const struct model_config *mc = &m->cfg;
	const size_t L = mc->n_layers, H = mc->n_heads, nl = L * mc->n_kv_heads;
	memset(w, 0, sizeof(*w));
	if (P < 1 || T < P + 2)
		return KVT_EINVAL;
	w->tok = tok;
	w->P = P;
	w->T = T;
	uint32_t nz = sep ? n_sep + P : 0, nc = T - 1 - P;
	uint32_t cap = P + (nz > nc ? nz : nc);
	int32_t *pre = sep ? malloc(sizeof(int32_t) * nz) : NULL;
	w->x = malloc(sizeof(float) * L * P * mc->dim);
	w->q = malloc(sizeof(float) * L * P * H * mc->head_dim);
	w->lse = malloc(sizeof(float) * L * P * H);
	w->ref = malloc(sizeof(float) * nc * mc->vocab_size);
	w->kvzip = sep ? malloc(sizeof(float) * nl * P) : NULL;
	w->hind = malloc(sizeof(float) * nl * P);
	int rc = ctx_cache_open(m, cap, &w->full);
	if (!rc && (!w->x || !w->q || !w->lse || !w->ref || !w->hind ||
	            (sep && (!pre || !w->kvzip))))
		rc = KVT_ENOMEM;
	if (!rc) {
		struct ctx_tap t = {.x = w->x, .q = w->q, .lse = w->lse};
		rc = ctx_cache_step(w->full, tok, P, 0, &t, NULL);
	}
	if (!rc && sep) {
		memcpy(pre, sep, sizeof(int32_t) * n_sep);
		memcpy(pre + n_sep, tok, sizeof(int32_t) * P);
		/* every query of the reconstruction input, the repeat
		 * prompt's included (oracle.h's KVzip) */
		struct ctx_tap t = {.r0 = 0, .r1 = nz, .ncols = P, .max = 1,
		                    .red = w->kvzip};
		rc = ctx_cache_step(w->full, pre, nz, P, &t, NULL);
		ctx_cache_truncate(w->full, P);
	}
	if (!rc) {
		struct ctx_tap t = {.r0 = 0, .r1 = nc, .ncols = P, .max = 0,
		                    .red = w->hind};
		rc = ctx_cache_step(w->full, tok + P, nc, P, &t, w->ref);
		ctx_cache_truncate(w->full, P);
	}
	free(pre);
	if (rc)
		ctx_window_free(w);
	return rc;
}

/* ------------------------------------------------------------ a run */

int ctx_load_daemon(const struct model *m, const struct ctx_window *w,
                    const char *rt, const char *tenant, const char *spec,
                    struct ctx_cache *c, char *err, size_t errlen)
{
	const struct model_config *mc = &m->cfg;
	const uint32_t P = w->P, hd = mc->head_dim, H = mc->n_heads,
	               d = mc->dim;
	const size_t rb = sizeof(float) * hd;
	struct engine_opts o;
	memset(&o, 0, sizeof(o));
	o.runtime_dir = rt;
	o.tenant = tenant;
	o.policy = spec;
	o.context = P;
	o.chunk = P;
	o.stage_tokens = P + CTX_LOOKBACK;
	/* One sync scores a whole context (h2o: every prefill query against
	 * every key, 30 layers): seconds on a loaded 2-core machine, which the
	 * engine's 10 s default timed out.  An offline evaluation waits. */
	o.timeout_ms = CTX_SYNC_TIMEOUT_MS;
	struct engine *e;
	int rc = engine_open(m, &o, &e, err, errlen);
	if (rc)
		return rc;
	kvt_client *cl = engine_client(e);
	kvt_seq s = engine_seq(e);
	/* a cuda tenant's pages are device memory: through kvt_memcpy, and
	 * read back one page at a time into host memory */
	const int dev = kvt_memory_kind(cl) == KVT_MEMORY_CUDA;
	const uint32_t pt = kvt_config_of(cl)->page_tokens;
	float *bounce = dev ? malloc(2 * (size_t)pt * rb) : NULL;
	if (dev && !bounce) {
		snprintf(err, errlen, "out of memory");
		rc = KVT_ENOMEM;
		goto out;
	}
	for (uint32_t l = 0; l < mc->n_layers; l++) {
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			const float *K = ctx_cache_k(w->full, l, g),
			            *V = ctx_cache_v(w->full, l, g);
			for (uint32_t t = 0; t < P; t++) {
				void *kp, *vp;
				rc = kvt_kv_ptr(cl, s, l, g, t, &kp, &vp);
				if (rc < 0) {
					snprintf(err, errlen, "kvt_kv_ptr(layer %u, "
					         "head %u, +%u): %s", l, g, t,
					         kvt_strerror(rc));
					goto out;
				}
				if (dev) {
					if ((rc = kvt_memcpy(cl, kp, K + (size_t)t * hd,
					                     rb)) < 0 ||
					    (rc = kvt_memcpy(cl, vp, V + (size_t)t * hd,
					                     rb)) < 0) {
						snprintf(err, errlen, "kvt_memcpy: %s",
						         kvt_last_error(cl));
						goto out;
					}
				} else {
					memcpy(kp, K + (size_t)t * hd, rb);
					memcpy(vp, V + (size_t)t * hd, rb);
				}
			}
		}
		for (uint32_t t = 0; t < P; t++) {
			float *sx = kvt_stage_x(cl, s, l, t),
			      *sq = kvt_stage_q(cl, s, l, t),
			      *sl = kvt_stage_lse(cl, s, l, t);
			size_t r = (size_t)l * P + t;
			/* kvt_memcpy: device memory on a cuda tenant */
			if ((sx && (rc = kvt_memcpy(cl, sx, w->x + r * d,
			                            sizeof(float) * d))) ||
			    (sq && (rc = kvt_memcpy(cl, sq, w->q + r * H * hd,
			                            sizeof(float) * H * hd))) ||
			    (sl && (rc = kvt_memcpy(cl, sl, w->lse + r * H,
			                            sizeof(float) * H)))) {
				snprintf(err, errlen, "staging: %s",
				         kvt_last_error(cl));
				goto out;
			}
		}
	}
	/* the continuation is not appended: one entry of headroom is
	 * enough after the prefill sync */
	rc = kvt_seq_headroom(cl, s, 1);
	struct kvt_sync_item it = {s, P, KVT_PHASE_PREFILL, 0, 0};
	if (!rc)
		rc = kvt_sync(cl, &it, 1);
	if (!rc) {
		it.n_new = 0;
		it.phase = KVT_PHASE_DECODE;
		rc = kvt_sync(cl, &it, 1);
	}
	if (rc < 0) {
		snprintf(err, errlen, "%s: %s: %s", spec, kvt_strerror(rc),
		         kvt_last_error(cl));
		goto out;
	}
	engine_seq_advance(e, 0, P);
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			struct kvt_list li;
			rc = kvt_list_get(cl, s, l, g, &li);
			if (rc < 0 || li.len > c->cap) {
				snprintf(err, errlen, "kvt_list_get(layer %u, head "
				         "%u): %s", l, g, rc < 0 ? kvt_strerror(rc)
				         : "longer than the context");
				rc = rc < 0 ? rc : KVT_EPROTO;
				goto out;
			}
			float *K = ctx_cache_k(c, l, g), *V = ctx_cache_v(c, l, g);
			const float *pg = NULL;
			for (uint32_t i = 0; i < li.len; i++) {
				uint32_t r = i % pt;
				if (r == 0) {
					pg = kvt_page_ptr(cl, li.pages[i / pt]);
					if (!pg) {
						snprintf(err, errlen, "page %u of layer "
						         "%u head %u is not mapped",
						         li.pages[i / pt], l, g);
						rc = KVT_EPROTO;
						goto out;
					}
					if (dev && (rc = kvt_memcpy(cl, bounce, pg,
					                            2 * (size_t)pt *
					                            rb)) < 0) {
						snprintf(err, errlen, "kvt_memcpy: %s",
						         kvt_last_error(cl));
						goto out;
					}
					if (dev)
						pg = bounce;
				}
				memcpy(K + (size_t)i * hd, pg + (size_t)r * hd, rb);
				memcpy(V + (size_t)i * hd,
				       pg + ((size_t)pt + r) * hd, rb);
			}
			*ctx_cache_len(c, l, g) = li.len;
		}
	rc = 0;
out:
	engine_close(e);
	free(bounce);
	return rc;
}

void ctx_load_keep(const struct model *m, const struct ctx_window *w,
                   const uint8_t *keep, struct ctx_cache *c)
{
	const struct model_config *mc = &m->cfg;
	const uint32_t P = w->P, hd = mc->head_dim;
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			const uint8_t *kp = keep + list_of(c, l, g) * P;
			const float *K = ctx_cache_k(w->full, l, g),
			            *V = ctx_cache_v(w->full, l, g);
			float *Kd = ctx_cache_k(c, l, g), *Vd = ctx_cache_v(c, l, g);
			uint32_t n = 0;
			for (uint32_t i = 0; i < P; i++) {
				if (!kp[i])
					continue;
				memcpy(Kd + (size_t)n * hd, K + (size_t)i * hd,
				       sizeof(float) * hd);
				memcpy(Vd + (size_t)n * hd, V + (size_t)i * hd,
				       sizeof(float) * hd);
				n++;
			}
			*ctx_cache_len(c, l, g) = n;
		}
}

int ctx_keep_kvzip(const struct model *m, const struct ctx_window *w,
                   double R, uint8_t *keep)
{
	const struct model_config *mc = &m->cfg;
	uint32_t nl = mc->n_layers * mc->n_kv_heads;
	if (!w->kvzip)
		return KVT_EINVAL;
	int rc = score_kvzip_drop(w->kvzip, nl, w->P, R, keep);
	for (size_t e = 0; !rc && e < (size_t)nl * w->P; e++)
		keep[e] = !keep[e];
	return rc;
}

int ctx_keep_oracle(const struct model *m, const struct ctx_window *w,
                    double R, uint8_t *keep)
{
	const struct model_config *mc = &m->cfg;
	const uint32_t P = w->P, nl = mc->n_layers * mc->n_kv_heads,
	               B = P - (uint32_t)floor(R * P);
	uint32_t *rank = malloc(sizeof(uint32_t) * P),
	         *sc = malloc(sizeof(uint32_t) * P);
	if (!rank || !sc) {
		free(rank);
		free(sc);
		return KVT_ENOMEM;
	}
	for (uint32_t i = 0; i < P; i++)
		rank[i] = i;
	for (uint32_t li = 0; li < nl; li++) {
		uint8_t *kp = keep + (size_t)li * P;
		select_topk_cpu(w->hind + (size_t)li * P, rank, NULL, P, B, kp,
		                sc);
		for (uint32_t i = 0; i < P; i++)
			kp[i] = !kp[i];
	}
	free(rank);
	free(sc);
	return 0;
}

int ctx_continue(const struct model *m, const struct ctx_window *w,
                 struct ctx_cache *c, float *lg, struct ctx_score *s)
{
	const uint32_t P = w->P, nc = w->T - 1 - P, V = m->cfg.vocab_size;
	memset(s, 0, sizeof(*s));
	s->kept = ctx_cache_kept(c);
	int rc = ctx_cache_step(c, w->tok + P, nc, P, NULL, lg);
	if (rc)
		return rc;
	for (uint32_t t = 0; t < nc; t++) {
		double kl, dnll;
		int top1;
		score_compare(w->ref + (size_t)t * V, lg + (size_t)t * V, V,
		            w->tok[P + t + 1], &kl, &top1, &dnll);
		s->kl += kl;
		s->top1 += top1;
		s->dnll += dnll;
		s->npos++;
	}
	return 0;
}
