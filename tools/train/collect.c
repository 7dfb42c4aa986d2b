/*
 * collect.c — the per-window oracle passes of kvtrim-train and the row
 * sets they fill; see collect.h.
 */
#include "collect.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "dtype.h"
#include "fit.h"
#include "pop.h"

static int set_alloc(struct collect_set *s, uint32_t L, size_t n, uint32_t d,
                     uint32_t nkv, int mem)
{
	memset(s, 0, sizeof(*s));
	s->n = n;
	s->x = malloc(sizeof(uint16_t) * L * n * d + 1);
	s->y1 = malloc(sizeof(float) * L * n * nkv + 1);
	s->y2 = malloc(sizeof(float) * L * n * nkv + 1);
	if (mem)
		s->mem = malloc(sizeof(float) * L * n * nkv * POP_MEM_FEATS +
		                1);
	return s->x && s->y1 && s->y2 && (!mem || s->mem) ? 0 : KVT_ENOMEM;
}

void collect_free(struct collect_set *s)
{
	free(s->x);
	free(s->y1);
	free(s->y2);
	free(s->mem);
	memset(s, 0, sizeof(*s));
}

int collect_alloc(const struct model *m, const struct collect_geom *g,
                  uint32_t n_win, struct collect_set *z,
                  struct collect_set *p)
{
	const struct model_config *c = &m->cfg;
	int rc = set_alloc(z, c->n_layers, (size_t)n_win * g->nz, c->dim,
	                   c->n_kv_heads, 0);
	if (!rc)
		rc = set_alloc(p, c->n_layers, (size_t)n_win * g->np, c->dim,
		               c->n_kv_heads, 1);
	if (rc) {
		collect_free(z);
		collect_free(p);
	}
	return rc;
}

void collect_layer_x(const struct collect_set *s, uint32_t l, uint32_t d,
                     float *out)
{
	dtype_to_f32(s->x + (size_t)l * s->n * d, KVT_DTYPE_F16, out,
	             s->n * d);
}

/* k of the n positions, without replacement, in increasing order. */
static void pick(uint32_t *idx /* [n] scratch; first k out */, uint32_t n,
                 uint32_t k, uint64_t st)
{
	for (uint32_t i = 0; i < n; i++)
		idx[i] = i;
	if (k >= n)
		return;
	for (uint32_t i = 0; i < k; i++) {
		uint32_t j = i + (uint32_t)(dataset_rng(&st) % (n - i));
		uint32_t t = idx[i];
		idx[i] = idx[j];
		idx[j] = t;
	}
	/* insertion sort of the k picked (k is a few hundred) */
	for (uint32_t i = 1; i < k; i++) {
		uint32_t v = idx[i], j = i;
		for (; j > 0 && idx[j - 1] > v; j--)
			idx[j] = idx[j - 1];
		idx[j] = v;
	}
}

/* What one worker owns: the buffers of one window. */
struct work {
	float *kz, *kzp;  /* [L][nkv][T] */
	float *wa;        /* [L][nkv][npw] */
	float *wm;        /* [POP_MEM_FEATS][L][nkv][npw] */
	float *xs;        /* [L][W][d] */
	float *logits;    /* [Np][vocab], for the copy check */
	int32_t *seq;     /* [Np] the pretext */
	uint32_t *iz, *ip; /* [T], [npw] */
};

struct job {
	const struct model *m;
	const struct collect_geom *g;
	const int32_t *const *tok;
	uint32_t n_win, copy_from;
	uint64_t seed;
	struct collect_set *z, *p;
	collect_progress_fn progress;
	void *pctx;
	pthread_mutex_t mu;
	uint32_t next, done;
	uint64_t copy_ok, copy_n;
	int rc;
	char *err;
	size_t errlen;
};

static void work_free(struct work *w)
{
	free(w->kz);
	free(w->kzp);
	free(w->wa);
	free(w->wm);
	free(w->xs);
	free(w->logits);
	free(w->seq);
	free(w->iz);
	free(w->ip);
}

static int work_alloc(struct work *w, const struct model *m,
                      const struct collect_geom *g, int copy)
{
	const struct model_config *c = &m->cfg;
	const size_t L = c->n_layers, nkv = c->n_kv_heads;
	const uint32_t Np = g->T + g->n_sep + g->n_ctx;
	memset(w, 0, sizeof(*w));
	w->kz = malloc(sizeof(float) * L * nkv * g->T);
	w->kzp = malloc(sizeof(float) * L * nkv * g->T);
	w->wa = malloc(sizeof(float) * L * nkv * g->npw);
	w->wm = malloc(sizeof(float) * POP_MEM_FEATS * L * nkv * g->npw);
	w->xs = malloc(sizeof(float) * L * g->W * c->dim);
	w->seq = malloc(sizeof(int32_t) * Np);
	w->iz = malloc(sizeof(uint32_t) * g->T);
	w->ip = malloc(sizeof(uint32_t) * g->npw);
	if (copy)
		w->logits = malloc(sizeof(float) * Np * c->vocab_size);
	if (!w->kz || !w->kzp || !w->wa || !w->wm || !w->xs || !w->seq ||
	    !w->iz || !w->ip || (copy && !w->logits)) {
		work_free(w);
		return KVT_ENOMEM;
	}
	return 0;
}

/* Stores x row (layer l, position i) as f16 at dst; 0 when it fits. */
static int put_x(uint16_t *dst, const float *x, uint32_t d)
{
	for (uint32_t e = 0; e < d; e++)
		if (!(fabsf(x[e]) <= 65504.0f))
			return -1;
	dtype_from_f32(x, KVT_DTYPE_F16, dst, d);
	return 0;
}

/* The passes of window w into its rows; 0 or an error (reason in why). */
static int one_window(struct job *j, struct work *wk, uint32_t w,
                      uint64_t *copy_ok, char *why, size_t whylen)
{
	const struct model *m = j->m;
	const struct model_config *c = &m->cfg;
	const struct collect_geom *g = j->g;
	const uint32_t L = c->n_layers, nkv = c->n_kv_heads, d = c->dim,
	               b = g->T - g->n_ctx;
	const int32_t *tok = j->tok[w];
	const uint32_t q0 = g->T + g->n_sep, Np = q0 + g->n_ctx;
	const int copy = w >= j->copy_from;
	/* the pretext [BOS] ctx sep ctx: the window's first T tokens are
	 * [BOS] ctx */
	memcpy(wk->seq, tok, sizeof(int32_t) * g->T);
	memcpy(wk->seq + g->T, g->sep, sizeof(int32_t) * g->n_sep);
	memcpy(wk->seq + q0, tok + b, sizeof(int32_t) * g->n_ctx);
	/* KVzip's maximum runs over the whole reconstruction input, the
	 * repeat prompt's queries as well as the copy's (as the KVzip paper
	 * and kvpress compute it): .q0 = T, not q0 */
	struct oracle_req r = {.tokens = wk->seq, .n = Np, .scored = g->T,
	                       .q0 = g->T, .kvzip = wk->kz,
	                       .kvzip_plus = wk->kzp,
	                       .logits = copy ? wk->logits : NULL};
	struct oracle_req pl = {.tokens = tok, .n = g->W};
	struct oracle_req *win = &pl;
	if (g->T == g->W)
		win = &r; /* the pretext's first W positions are the window */
	win->rows = g->npw;
	win->plain = g->W;
	win->win[0] = (struct oracle_win){0, g->D, 1, wk->wa, 0.0f};
	/* the learned memory's (pop.h): per age, the target (the most a
	 * head of the group is paid over the horizon), then the decayed
	 * means over the queries since the delay */
	const size_t per = (size_t)L * nkv * g->npw;
	win->n_win = 1 + POP_MEM_FEATS;
	for (uint32_t k = 0; k < POP_MEM_AGES; k++) {
		win->win[1 + POP_MEM_FEAT(k, 0)] = (struct oracle_win){
			pop_mem_age(k),
			pop_mem_age(k) + RECIPE_KVPOP_MEM_HORIZON, 0,
			wk->wm + POP_MEM_FEAT(k, 0) * per, 0.0f};
		for (uint32_t e = 0; e < POP_MEM_DECAYS; e++)
			win->win[1 + POP_MEM_FEAT(k, 1 + e)] =
				(struct oracle_win){
					g->D, pop_mem_age(k), 1,
					wk->wm + POP_MEM_FEAT(k, 1 + e) * per,
					expf(-1.0f /
					     (float)pop_mem_decay(e))};
	}
	win->xs = wk->xs;
	win->xs_rows = g->W;
	int rc = oracle_run(m, &r);
	if (!rc && win != &r)
		rc = oracle_run(m, &pl);
	if (rc) {
		snprintf(why, whylen, "window %u: oracle: %s", w,
		         kvt_strerror(rc));
		return rc;
	}
	if (copy)
		for (uint32_t t = q0 - 1; t + 1 < Np; t++) {
			const float *lg = wk->logits + (size_t)t * c->vocab_size;
			uint32_t best = 0;
			for (uint32_t v = 1; v < c->vocab_size; v++)
				best = lg[v] > lg[best] ? v : best;
			*copy_ok += (int32_t)best == wk->seq[t + 1];
		}
	uint64_t st = j->seed ^ 0x726f7773ull; /* "rows" */
	st += 0x9e3779b97f4a7c15ull * (w + 1);
	(void)dataset_rng(&st);
	pick(wk->iz, g->T, g->nz, dataset_rng(&st));
	pick(wk->ip, g->npw, g->np, dataset_rng(&st));
	struct collect_set *z = j->z, *p = j->p;
	for (uint32_t l = 0; l < L; l++) {
		const float *xl = wk->xs + (size_t)l * g->W * d;
		for (uint32_t k = 0; k < g->nz; k++) {
			uint32_t i = wk->iz[k];
			size_t row = (size_t)l * z->n + (size_t)w * g->nz + k;
			if (put_x(z->x + row * d, xl + (size_t)i * d, d))
				goto range;
			for (uint32_t h = 0; h < nkv; h++) {
				size_t src = ((size_t)l * nkv + h) * g->T + i;
				z->y1[row * nkv + h] = wk->kzp[src];
				z->y2[row * nkv + h] = wk->kz[src];
			}
		}
		for (uint32_t k = 0; k < g->np; k++) {
			uint32_t i = wk->ip[k];
			size_t row = (size_t)l * p->n + (size_t)w * g->np + k;
			if (put_x(p->x + row * d, xl + (size_t)i * d, d))
				goto range;
			for (uint32_t h = 0; h < nkv; h++) {
				size_t lh = (size_t)l * nkv + h;
				p->y1[row * nkv + h] = wk->wa[lh * g->npw + i];
				p->y2[row * nkv + h] = wk->kzp[lh * g->T + i];
				float *f = p->mem + (row * nkv + h) *
				                    POP_MEM_FEATS;
				for (uint32_t e = 0; e < POP_MEM_FEATS; e++)
					f[e] = wk->wm[e * per + lh * g->npw + i];
				/* a target whose queries run past the window
				 * is cut short: none */
				for (uint32_t a = 0; a < POP_MEM_AGES; a++)
					if ((uint64_t)i + pop_mem_age(a) +
					    RECIPE_KVPOP_MEM_HORIZON > g->W - 1)
						f[POP_MEM_FEAT(a, 0)] = NAN;
			}
		}
	}
	return 0;
range:
	snprintf(why, whylen, "window %u: an attention input beyond the f16 "
	         "range (or not finite)", w);
	return KVT_EINVAL;
}

static void *worker(void *arg)
{
	struct job *j = arg;
	struct work wk;
	char why[256];
	int arc = work_alloc(&wk, j->m, j->g, j->copy_from < j->n_win),
	    rc = arc;
	pthread_mutex_lock(&j->mu);
	if (rc && !j->rc) {
		j->rc = rc;
		snprintf(j->err, j->errlen, "out of memory");
	}
	while (!rc && !j->rc && j->next < j->n_win) {
		uint32_t w = j->next++;
		pthread_mutex_unlock(&j->mu);
		uint64_t ok = 0;
		rc = one_window(j, &wk, w, &ok, why, sizeof(why));
		pthread_mutex_lock(&j->mu);
		if (rc) {
			if (!j->rc) {
				j->rc = rc;
				snprintf(j->err, j->errlen, "%s", why);
			}
			break;
		}
		if (w >= j->copy_from) {
			j->copy_ok += ok;
			j->copy_n += j->g->n_ctx;
		}
		j->done++;
		if (j->progress)
			j->progress(j->pctx, j->done, j->n_win);
	}
	pthread_mutex_unlock(&j->mu);
	if (!arc)
		work_free(&wk);
	return NULL;
}

int collect_run(const struct model *m, const struct collect_geom *g,
                const int32_t *const *tok, uint32_t n_win, uint64_t seed,
                uint32_t jobs, uint32_t copy_from, struct collect_set *z,
                struct collect_set *p, double *copy_acc,
                collect_progress_fn progress, void *pctx, char *err,
                size_t errlen)
{
	if (!g->n_ctx || g->T > g->W || g->T < g->n_ctx ||
	    !g->npw || g->npw + g->D > g->W || g->npw > g->T ||
	    g->nz > g->T || g->np > g->npw ||
	    !g->nz || !g->np || !jobs) {
		snprintf(err, errlen, "collect: inconsistent geometry");
		return KVT_EINVAL;
	}
	struct job j = {.m = m, .g = g, .tok = tok, .n_win = n_win,
	                .copy_from = copy_from, .seed = seed, .z = z, .p = p,
	                .progress = progress, .pctx = pctx, .err = err,
	                .errlen = errlen};
	pthread_mutex_init(&j.mu, NULL);
	pthread_t th[16];
	uint32_t nt = jobs > 16 ? 16 : jobs, started = 0;
	for (uint32_t i = 1; i < nt; i++)
		if (!pthread_create(&th[i], NULL, worker, &j))
			started = i;
		else
			break;
	worker(&j);
	for (uint32_t i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&j.mu);
	*copy_acc = j.copy_n ? (double)j.copy_ok / (double)j.copy_n : NAN;
	return j.rc;
}
