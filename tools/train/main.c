/*
 * kvtrim-train — learns the scorers of the learned policies from a model's
 * own oracles and writes them where the policies load them.
 *
 *   kvtrim-train --model M --out DIR [--seed S] [--quick] [--jobs N] [...]
 *
 * Writes kvzap-linear/, kvzap-mlp/ (kvpress layout), fastkvzip.safetensors,
 * kvpop.safetensors, fit.txt and fit.csv under DIR (recipe.h has the
 * recipes).  The options, the data and the outputs: docs/weights.md,
 * "Training".  Deterministic for a given seed: BLAS on one thread, fixed
 * shapes, seeded samples, shuffles and inits; --jobs N runs N windows'
 * oracle passes, then N layers' fits, each on one thread into rows it
 * owns, so the output does not depend on N.  Progress goes to stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collect.h"
#include "dataset.h"
#include "dtype.h"
#include "fit.h"
#include "gate.h"
#include "gguf.h"
#include "kernels.h"
#include "model.h"
#include "model_files.h"
#include "now.h"
#include "oracle.h"
#include "pop.h"
#include "recipe.h"
#include "save.h"
#include "tokenizer.h"

void openblas_set_num_threads(int n);

static FILE *fit_out;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	if (fit_out) {
		va_start(ap, fmt);
		vfprintf(fit_out, fmt, ap);
		va_end(ap);
	}
	fflush(stdout);
}

/* ---------------------------------------------------------------- progress */

struct progress {
	uint64_t t0, last; /* ms */
	int tty, open;     /* open: a \r line is on the terminal */
	uint32_t per;      /* tokens per window */
};

static void hms(char *b, size_t n, double s)
{
	long v = s > 0 && s < 1e8 ? (long)(s + 0.5) : 0;
	snprintf(b, n, "%ldm%02lds", v / 60, v % 60);
}

/* Prints "what done/total, elapsed, ETA" when it is time to. */
static void progress_say(struct progress *pg, const char *what, uint32_t done,
                         uint32_t total, const char *extra)
{
	uint64_t t = now_ms();
	if (done < total && t - pg->last < (pg->tty ? 500u : 10000u))
		return;
	pg->last = t;
	double el = (double)(t - pg->t0) / 1e3;
	char e[32], eta[32];
	hms(e, sizeof(e), el);
	hms(eta, sizeof(eta), done ? el / done * (total - done) : 0);
	fprintf(stderr, "%skvtrim-train: %s %u/%u%s, elapsed %s, ETA %s%s",
	        pg->tty ? "\r" : "", what, done, total, extra, e, eta,
	        pg->tty ? "\033[K" : "\n");
	pg->open = pg->tty;
	if (pg->tty && done == total) {
		fputc('\n', stderr);
		pg->open = 0;
	}
	fflush(stderr);
}

static void on_window(void *ctx, uint32_t done, uint32_t n_win)
{
	struct progress *pg = ctx;
	char x[64];
	snprintf(x, sizeof(x), " windows (%llu tokens)",
	         (unsigned long long)done * pg->per);
	progress_say(pg, "oracles", done, n_win, x);
}

/* ---------------------------------------------------------------- setup */

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtrim-train --model M --out DIR [--seed S] "
	           "[--quick] [--windows N] [--heldout N] [--jobs N] "
	           "[--window W] [--rows N] [--dtype f32|f16|bf16]\n");
}

/* The tokenizer of a GGUF model (NULL for llama2.c checkpoints). */
static int load_tok(const char *path, const struct model *m, struct tok **t,
                    char *err, size_t errlen)
{
	*t = NULL;
	if (m->version != MODEL_GGUF)
		return 0;
	struct gguf *g;
	int rc = gguf_open(path, &g, err, errlen);
	if (rc < 0)
		return rc;
	if (!gguf_find(g, "tokenizer.ggml.model")) {
		snprintf(err, errlen, "%.900s: no tokenizer in the file", path);
		rc = KVT_EINVAL;
	} else if ((rc = tok_load(g, t, err, errlen)) == 0 &&
	           tok_vocab_size(*t) > m->cfg.vocab_size) {
		snprintf(err, errlen, "%.900s: the tokenizer has more tokens than "
		         "the model", path);
		tok_free(*t);
		*t = NULL;
		rc = KVT_EINVAL;
	}
	gguf_close(g);
	return rc;
}

struct opts {
	uint64_t seed;
	int quick;
	uint32_t windows, heldout, jobs, window, rows;
	enum kvt_dtype dtype; /* of the files written (--dtype) */
};

/* The windows: n_tr training ones then n_ho held-out ones, in *ptr. */
struct data {
	struct dataset tr, ho;
	const int32_t **ptr;
	uint32_t n_tr, n_ho;
};

static void data_free(struct data *dt)
{
	dataset_free(&dt->tr);
	dataset_free(&dt->ho);
	free(dt->ptr);
}

static int setup(const struct model *m, const struct tok *t,
                 const struct opts *o, struct collect_geom *g,
                 struct data *dt, char *err, size_t errlen)
{
	const uint32_t ctx = model_context(m), b = m->bos >= 0;
	memset(g, 0, sizeof(*g));
	memset(dt, 0, sizeof(*dt));
	g->D = RECIPE_KVPOP_DELAY;
	int rc;
	if (t) {
		if ((rc = oracle_repeat_sep(t, g->sep, &g->n_sep, err,
		                            errlen)))
			return rc;
		g->W = o->window ? o->window : RECIPE_TOK_WINDOW;
		g->n_ctx = g->W - b;
		if (g->W <= b ||
		    oracle_max_ctx(m, ctx, g->n_sep) < g->n_ctx) {
			snprintf(err, errlen, "window %u: the pretext does not "
			         "fit the context %u", g->W, ctx);
			return KVT_EINVAL;
		}
	} else {
		g->n_sep = oracle_default_sep(m, g->sep);
		g->W = ctx;
		g->n_ctx = oracle_max_ctx(m, ctx, g->n_sep);
	}
	g->T = oracle_scored(m, g->n_ctx);
	if (g->W <= g->D + 1 || !g->n_ctx) {
		snprintf(err, errlen, "window %u: too short for the KVpop "
		         "delay %u", g->W, g->D);
		return KVT_EINVAL;
	}
	g->npw = g->W - g->D < g->T ? g->W - g->D : g->T;
	uint32_t rows = o->rows ? o->rows : t ? RECIPE_TOK_ROWS : 0;
	g->nz = rows && rows < g->T ? rows : g->T;
	g->np = rows && rows < g->npw ? rows : g->npw;
	if (t) {
		uint32_t nt = o->windows ? o->windows
		              : o->quick ? 4 : RECIPE_TOK_WINDOWS;
		uint32_t nh = o->heldout ? o->heldout
		              : o->quick ? 2 : RECIPE_TOK_HELDOUT;
		if ((rc = dataset_build_tok(m, t, DATASET_TRAIN, g->W, nt,
		                            &dt->tr, err, errlen)) ||
		    (rc = dataset_build_tok(m, t, DATASET_HELDOUT, g->W, nh,
		                            &dt->ho, err, errlen)))
			goto fail;
		dt->n_tr = dt->tr.n;
		dt->n_ho = dt->ho.n;
	} else {
		uint32_t nw = o->windows ? o->windows : o->quick ? 6 : 192;
		if ((rc = dataset_build(m, DATASET_TRAIN, g->W, nw, o->seed,
		                        &dt->tr, err, errlen)))
			goto fail;
		if (dt->tr.n < 2) {
			snprintf(err, errlen, "too little data");
			rc = KVT_EINVAL;
			goto fail;
		}
		dt->n_ho = dt->tr.n / 10 ? dt->tr.n / 10 : 1;
		dt->n_tr = dt->tr.n - dt->n_ho;
	}
	uint32_t n = dt->n_tr + dt->n_ho;
	dt->ptr = malloc(sizeof(*dt->ptr) * n);
	if (!dt->ptr) {
		rc = KVT_ENOMEM;
		goto fail;
	}
	for (uint32_t w = 0; w < n; w++)
		dt->ptr[w] = w < dt->tr.n ? dt->tr.tok + (size_t)w * g->W
		                          : dt->ho.tok +
		                                    (size_t)(w - dt->tr.n) * g->W;
	return 0;
fail:
	data_free(dt);
	return rc;
}

/* ---------------------------------------------------------------- fits */

/* R^2 and Spearman of n * k held-out predictions, pooled over heads. */
static void metrics(const float *pred, const float *y, size_t n, uint32_t k,
                    double *r2, double *rho)
{
	*r2 = fit_r2(pred, y, n * k);
	*rho = fit_spearman(pred, y, n * k);
}

/* What the fits produce, per layer. */
struct learned {
	uint32_t L, hid;
	float **lW, **lb;              /* ridge [n_kv][d], [n_kv] */
	float **mW1, **mb1, **mW2, **mb2; /* MLP */
	struct gate_params *gp;
	struct pop_params *pp;
	float **pop_tr;                /* [L] KVpop's scores of the training
	                                  rows, [pt][n_kv] (pop_shares) */
	float *share;                  /* [RECIPE_KVPOP_SHARES][L][n_kv] */
	struct pop_mem *mem;           /* [L] KVpop's learned memory */
	float keep[RECIPE_KVPOP_SHARES]; /* 1/2, 1/4, ... */
	double (*m)[14];               /* per-layer metrics (fit.csv), then
	                                  MLP loss first / last epoch, gate
	                                  BCE first / last 5 % of steps */
};

static void learned_free(struct learned *lr)
{
	float **arr[6] = {lr->lW, lr->lb, lr->mW1, lr->mb1, lr->mW2, lr->mb2};
	for (int a = 0; a < 6; a++) {
		for (uint32_t l = 0; arr[a] && l < lr->L; l++)
			free(arr[a][l]);
		free(arr[a]);
	}
	for (uint32_t l = 0; l < lr->L; l++) {
		if (lr->gp)
			gate_free(&lr->gp[l]);
		if (lr->pp)
			pop_free(&lr->pp[l]);
		if (lr->pop_tr)
			free(lr->pop_tr[l]);
	}
	free(lr->gp);
	free(lr->pp);
	free(lr->pop_tr);
	free(lr->share);
	free(lr->mem);
	free(lr->m);
}

static int learned_alloc(struct learned *lr, const struct model_config *c)
{
	const uint32_t L = c->n_layers, d = c->dim, nkv = c->n_kv_heads;
	memset(lr, 0, sizeof(*lr));
	lr->L = L;
	lr->hid = d / RECIPE_KVZAP_HIDDEN_DIV;
	float ***arr[6] = {&lr->lW, &lr->lb, &lr->mW1, &lr->mb1, &lr->mW2,
	                   &lr->mb2};
	size_t sz[6] = {(size_t)nkv * d, nkv, (size_t)lr->hid * d, lr->hid,
	                (size_t)nkv * lr->hid, nkv};
	for (int a = 0; a < 6; a++) {
		if (!(*arr[a] = calloc(L, sizeof(float *))))
			return KVT_ENOMEM;
		for (uint32_t l = 0; l < L; l++)
			if (!((*arr[a])[l] = malloc(sizeof(float) * sz[a])))
				return KVT_ENOMEM;
	}
	lr->gp = calloc(L, sizeof(*lr->gp));
	lr->pp = calloc(L, sizeof(*lr->pp));
	lr->m = calloc(L, sizeof(*lr->m));
	lr->pop_tr = calloc(L, sizeof(float *));
	lr->mem = calloc(L, sizeof(*lr->mem));
	lr->share = calloc((size_t)RECIPE_KVPOP_SHARES * L * nkv,
	                   sizeof(float));
	for (uint32_t j = 0; j < RECIPE_KVPOP_SHARES; j++)
		lr->keep[j] = 1.0f / (float)(2u << j);
	return lr->gp && lr->pp && lr->m && lr->pop_tr && lr->share &&
	       lr->mem ? 0 : KVT_ENOMEM;
}

/* Fits layer l's four scorers on the training rows and measures them on
 * the held-out rows; X* are the layer's x in float32. */
static int fit_layer(const struct model_config *c, const struct opts *o,
                     uint32_t l, const struct collect_set *z,
                     const struct collect_set *p, size_t zt, size_t pt,
                     const float *XZ, const float *XP, float *pred,
                     double *mloss /* [epochs] */, struct learned *lr)
{
	const uint32_t d = c->dim, nkv = c->n_kv_heads,
	               G = c->n_heads / nkv, hid = lr->hid;
	const float *Yp = z->y1 + (size_t)l * z->n * nkv;
	const float *Yz = z->y2 + (size_t)l * z->n * nkv;
	const float *PF = p->y1 + (size_t)l * p->n * nkv;
	const float *PT = p->y2 + (size_t)l * p->n * nkv;
	const size_t nh = z->n - zt, nph = p->n - pt;
	const float *Xh = XZ + zt * d;
	double *r = lr->m[l];
	struct fit_mlp_opts mo = {o->quick ? 3 : 15, 512, 5e-3, 0.01, 1.0,
	                          o->seed};
	struct fit_mlp_opts po = {o->quick ? 3 : 10, 512, 5e-3, 0.01, 1.0,
	                          o->seed};
	struct gate_opts go = {o->quick ? 60 : recipe_fkv_steps(d), 1000, 0.2,
	                       0.9, o->seed};
	int rc = fit_ridge(XZ, Yp, zt, d, nkv, 1.0, lr->lW[l], lr->lb[l]);
	if (rc)
		return rc;
	scorer_linear_cpu(Xh, (uint32_t)nh, d, lr->lW[l], lr->lb[l], nkv, pred);
	metrics(pred, Yp + zt * nkv, nh, nkv, &r[0], &r[1]);

	if ((rc = fit_mlp(XZ, Yp, zt, d, hid, nkv, &mo, lr->mW1[l], lr->mb1[l],
	                  lr->mW2[l], lr->mb2[l], mloss)) ||
	    (rc = fit_mlp_apply(Xh, nh, d, hid, nkv, lr->mW1[l], lr->mb1[l],
	                        lr->mW2[l], lr->mb2[l], pred)))
		return rc;
	metrics(pred, Yp + zt * nkv, nh, nkv, &r[2], &r[3]);

	double lf = 0, ll = 0;
	if ((rc = gate_init(&lr->gp[l], d, nkv, G, recipe_fkv_dp(d),
	                    RECIPE_FKV_SINKS, o->seed + l)) ||
	    (rc = gate_train(&lr->gp[l], XZ, Yz, zt, &go, &lf, &ll)))
		return rc;
	r[6] = gate_loss(&lr->gp[l], Xh, Yz + zt * nkv, nh, NULL, pred);
	metrics(pred, Yz + zt * nkv, nh, nkv, &r[4], &r[5]);

	if ((rc = pop_init(&lr->pp[l], d, nkv, RECIPE_KVPOP_R, RECIPE_KVPOP_M,
	                   o->seed + 100 + l)) ||
	    (rc = pop_train(&lr->pp[l], XP, PF, PT, pt, &po, NULL)) ||
	    (rc = pop_apply(&lr->pp[l], XP + pt * d, PF + pt * nkv, nph, pred)))
		return rc;
	/* its scores of the training rows, for the budget shares */
	if (!(lr->pop_tr[l] = malloc(sizeof(float) * pt * nkv + 1)))
		return KVT_ENOMEM;
	if ((rc = pop_apply(&lr->pp[l], XP, PF, pt, lr->pop_tr[l])))
		return rc;
	metrics(pred, PT + pt * nkv, nph, nkv, &r[7], &r[8]);
	/* the learned memory's readout, on the scorer's scores */
	const float *PM = p->mem + (size_t)l * p->n * nkv * POP_MEM_FEATS;
	pop_mem_fit(lr->pop_tr[l], PM, pt, pred,
	            PM + pt * nkv * POP_MEM_FEATS, nph, nkv,
	            RECIPE_KVPOP_DELAY, &lr->mem[l]);
	r[9] = fit_spearman(PF + pt * nkv, PT + pt * nkv, nph * nkv);
	r[10] = mloss[0];
	r[11] = mloss[mo.epochs - 1];
	r[12] = lf;
	r[13] = ll;
	return 0;
}

static void say_layer(const struct learned *lr, uint32_t l)
{
	const double *r = lr->m[l];
	char b[4][64];
	snprintf(b[0], 64, "%.3f / %.3f", r[0], r[1]);
	snprintf(b[1], 64, "%.3f / %.3f", r[2], r[3]);
	snprintf(b[2], 64, "%.3f / %.3f (%.3f)", r[4], r[5], r[6]);
	snprintf(b[3], 64, "%.3f / %.3f", r[7], r[8]);
	say("%-5u %-15s %-15s %-24s %-15s %.3f\n", l, b[0], b[1], b[2], b[3],
	    r[9]);
	say("      mlp loss %.4f -> %.4f; gate train bce %.4f -> %.4f\n",
	    r[10], r[11], r[12], r[13]);
	const struct pop_mem *pm = &lr->mem[l];
	say("      kvpop memory: decay %.0f, readout %.3f s %+.3f f; future "
	    "attention R2 %.3f with s alone, %.3f with the memory\n",
	    (double)pm->decay, (double)pm->w_s, (double)pm->w_f, pm->r2_s,
	    pm->r2_mem);
}

/* KVpop's budget shares per layer (the mean over its KV heads) at the
 * keep fractions 1/4 and 1/16: where one threshold would spend the
 * budget. */
static void say_shares(const struct learned *lr, const struct model_config *c)
{
	const uint32_t L = c->n_layers, nkv = c->n_kv_heads;
	for (uint32_t j = 1; j < RECIPE_KVPOP_SHARES; j += 2) {
		say("kvpop budget shares per layer at keep 1/%u:",
		    (unsigned)(1.0f / lr->keep[j] + 0.5f));
		for (uint32_t l = 0; l < L; l++) {
			double s = 0;
			for (uint32_t h = 0; h < nkv; h++)
				s += lr->share[((size_t)j * L + l) * nkv + h];
			say(" %.2f", s / nkv);
		}
		say("\n");
	}
}

/* The fit stage: layers handed out to jobs workers; each layer's fits run
 * on one thread from the same inputs, so the results do not depend on
 * jobs.  Lines are printed in layer order as soon as they can be. */
struct fits {
	const struct model_config *c;
	const struct opts *o;
	const struct collect_set *z, *p;
	size_t zt, pt;
	struct learned *lr;
	struct progress *pg;
	pthread_mutex_t mu;
	uint32_t next, printed, done;
	unsigned char *ready; /* [L] */
	int rc;
	uint32_t bad; /* the layer that failed */
};

static void *fit_worker(void *arg)
{
	struct fits *f = arg;
	const uint32_t d = f->c->dim, nkv = f->c->n_kv_heads,
	               L = f->c->n_layers;
	size_t nh = f->z->n - f->zt, nph = f->p->n - f->pt;
	float *XZ = malloc(sizeof(float) * f->z->n * d);
	float *XP = malloc(sizeof(float) * f->p->n * d);
	float *pred = malloc(sizeof(float) * (nh > nph ? nh : nph) * nkv + 1);
	double *mloss = calloc(64, sizeof(double));
	int rc = XZ && XP && pred && mloss ? 0 : KVT_ENOMEM;
	pthread_mutex_lock(&f->mu);
	if (rc && !f->rc)
		f->rc = rc;
	while (!f->rc && f->next < L) {
		uint32_t l = f->next++;
		pthread_mutex_unlock(&f->mu);
		collect_layer_x(f->z, l, d, XZ);
		collect_layer_x(f->p, l, d, XP);
		rc = fit_layer(f->c, f->o, l, f->z, f->p, f->zt, f->pt, XZ, XP,
		               pred, mloss, f->lr);
		pthread_mutex_lock(&f->mu);
		if (rc) {
			if (!f->rc) {
				f->rc = rc;
				f->bad = l;
			}
			break;
		}
		f->ready[l] = 1;
		f->done++;
		while (f->printed < L && f->ready[f->printed])
			say_layer(f->lr, f->printed++);
		progress_say(f->pg, "fits: layer", f->done, L, "");
	}
	pthread_mutex_unlock(&f->mu);
	free(XZ);
	free(XP);
	free(pred);
	free(mloss);
	return NULL;
}

static int fit_all(struct fits *f, uint32_t jobs)
{
	f->ready = calloc(f->c->n_layers, 1);
	if (!f->ready)
		return KVT_ENOMEM;
	pthread_mutex_init(&f->mu, NULL);
	pthread_t th[16];
	uint32_t started = 0;
	for (uint32_t i = 1; i < jobs && i < 16; i++) {
		if (pthread_create(&th[i], NULL, fit_worker, f))
			break;
		started = i;
	}
	fit_worker(f);
	for (uint32_t i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&f->mu);
	free(f->ready);
	return f->rc;
}

static int write_csv(const char *out, const struct learned *lr)
{
	char path[1100];
	snprintf(path, sizeof(path), "%s/fit.csv", out);
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f, "layer,kvzap_linear_r2,kvzap_linear_spearman,kvzap_mlp_r2,"
	           "kvzap_mlp_spearman,fastkvzip_r2,fastkvzip_spearman,"
	           "fastkvzip_bce,kvpop_r2,kvpop_spearman,delay_spearman,"
	           "kvpop_memory_decay,kvpop_future_r2_score,"
	           "kvpop_future_r2_memory\n");
	for (uint32_t l = 0; l < lr->L; l++) {
		const double *r = lr->m[l];
		fprintf(f, "%u", l);
		for (int k = 0; k < 10; k++)
			fprintf(f, ",%.4f", r[k]);
		fprintf(f, ",%.0f,%.4f,%.4f\n", (double)lr->mem[l].decay,
		        lr->mem[l].r2_s, lr->mem[l].r2_mem);
	}
	return fclose(f) ? -1 : 0;
}

/* Mean / min / max over layers of metric k. */
static void summary(const struct learned *lr, const char *name, int k2,
                    int kr)
{
	double s2 = 0, sr = 0, lo = INFINITY, hi = -INFINITY;
	for (uint32_t l = 0; l < lr->L; l++) {
		s2 += lr->m[l][k2];
		sr += lr->m[l][kr];
		lo = fmin(lo, lr->m[l][k2]);
		hi = fmax(hi, lr->m[l][k2]);
	}
	say("  %-13s R2 mean %.3f (layers %.3f .. %.3f), Spearman mean "
	    "%.3f\n", name, s2 / lr->L, lo, hi, sr / lr->L);
}

/* ---------------------------------------------------------------- main */

/* One run of the tool: what main's steps share, released by run_free. */
struct run {
	const char *out;        /* --out DIR */
	const char *model_path; /* the model file (path, or the default) */
	char path[1024];        /* --model resolved */
	struct opts o;
	struct model m;
	struct tok *tk;         /* NULL for llama2.c checkpoints */
	struct collect_geom g;
	struct data dt;
	struct collect_set z, p; /* KVzap / Fast KVzip rows, KVpop rows */
	struct learned lr;
	struct progress pg;     /* of the oracles; pg.t0 is the run's start */
	char err[1024];         /* why a step failed */
};

/* Reads the options into r->o, r->out and *model_arg; -1 to go on, else
 * the exit status (0 after --help, 2 after printing why). */
static int parse_args(int argc, char **argv, struct run *r,
                      const char **model_arg)
{
	static const struct option lo[] = {
		{"model", required_argument, 0, 'm'},
		{"out", required_argument, 0, 'o'},
		{"seed", required_argument, 0, 's'},
		{"quick", no_argument, 0, 'q'},
		{"windows", required_argument, 0, 'w'},
		{"heldout", required_argument, 0, 'H'},
		{"jobs", required_argument, 0, 'j'},
		{"window", required_argument, 0, 'W'},
		{"rows", required_argument, 0, 'r'},
		{"dtype", required_argument, 0, 'd'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	struct opts *o = &r->o;
	int ch;
	while ((ch = getopt_long(argc, argv, "m:o:s:qw:H:j:W:r:d:h", lo, NULL)) !=
	       -1) {
		switch (ch) {
		case 'm': *model_arg = optarg; break;
		case 'o': r->out = optarg; break;
		case 's': o->seed = strtoull(optarg, NULL, 0); break;
		case 'q': o->quick = 1; break;
		case 'w': o->windows = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'H': o->heldout = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'j': o->jobs = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'W': o->window = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'r': o->rows = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'd':
			if (dtype_parse(optarg, &o->dtype)) {
				fprintf(stderr, "kvtrim-train: --dtype %s: want "
				        "f32, f16 or bf16\n", optarg);
				return 2;
			}
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!r->out || optind != argc || !o->jobs || o->jobs > 16) {
		usage(stderr);
		return 2;
	}
	return -1;
}

/* Resolves model_arg (NULL: the default model) and loads it into r->m;
 * 0, or -1 after printing why (nothing then to free). */
static int load_model(struct run *r, const char *model_arg)
{
	r->model_path = model_default_path(model_arg);
	if (model_arg && model_files_resolve(model_arg, r->path,
	                                     sizeof(r->path), r->err,
	                                     sizeof(r->err))) {
		fprintf(stderr, "kvtrim-train: %s\n", r->err);
		return -1;
	}
	if (model_arg)
		r->model_path = r->path;
	if (model_load(r->model_path, &r->m, r->err, sizeof(r->err))) {
		fprintf(stderr, "kvtrim-train: %s\n", r->err);
		return -1;
	}
	return 0;
}

/* Loads the tokenizer, builds the windows, makes DIR, opens fit.txt and
 * says what will run; 0, or nonzero with r->err set. */
static int prepare(struct run *r)
{
	const struct model_config *c = &r->m.cfg;
	const struct collect_geom *g = &r->g;
	char fp[1100];

	if (load_tok(r->model_path, &r->m, &r->tk, r->err, sizeof(r->err)) ||
	    setup(&r->m, r->tk, &r->o, &r->g, &r->dt, r->err, sizeof(r->err)))
		return -1;
	if (save_mkdirs(r->out) < 0) {
		snprintf(r->err, sizeof(r->err), "%s: %s", r->out,
		         strerror(errno));
		return -1;
	}
	snprintf(fp, sizeof(fp), "%s/fit.txt", r->out);
	fit_out = fopen(fp, "w");
	say("kvtrim-train: model %s (d %u, %u layers, %u heads, %u KV heads), "
	    "seed %llu%s\n", r->model_path, c->dim, c->n_layers, c->n_heads,
	    c->n_kv_heads, (unsigned long long)r->o.seed,
	    r->o.quick ? ", quick" : "");
	say("data: %u training windows of %u tokens (%llu tokens, %s), %u "
	    "held out (%s)\n", r->dt.n_tr, g->W,
	    (unsigned long long)r->dt.n_tr * g->W,
	    r->tk ? dataset_corpus_path() : dataset_text_path(), r->dt.n_ho,
	    r->tk ? "the first part of the held-out text"
	          : "the last windows of the same text");
	say("      KVzip ctx %u tokens + a separator of %u, %u entries; "
	    "KVpop delay %u, %u entries per window; rows per window %u "
	    "KVzap, %u KVpop\n", g->n_ctx, g->n_sep, g->T, g->D, g->npw,
	    g->nz, g->np);
	return 0;
}

/* Runs the oracles over every window into r->z and r->p, starting the
 * run's clock (r->pg); 0, or nonzero with r->err set. */
static int collect_oracles(struct run *r)
{
	const uint32_t nw = r->dt.n_tr + r->dt.n_ho;
	double copy;

	if (collect_alloc(&r->m, &r->g, nw, &r->z, &r->p)) {
		snprintf(r->err, sizeof(r->err),
		         "out of memory for %u windows", nw);
		return -1;
	}
	r->pg = (struct progress){now_ms(), 0, isatty(2), 0, r->g.W};
	if (collect_run(&r->m, &r->g, r->dt.ptr, nw, r->o.seed, r->o.jobs,
	                r->dt.n_tr, &r->z, &r->p, &copy, on_window, &r->pg,
	                r->err, sizeof(r->err)))
		return -1;
	say("oracles: %.0f s; the model repeats the held-out contexts with "
	    "top-1 agreement %.3f\n", (double)(now_ms() - r->pg.t0) / 1e3,
	    copy);
	return 0;
}

/* Fits every layer's scorers into r->lr and prints the held-out table and
 * its summary; 0, or nonzero with r->err set. */
static int fit_layers(struct run *r)
{
	const struct model_config *c = &r->m.cfg;
	size_t zt = (size_t)r->dt.n_tr * r->g.nz;
	size_t pt = (size_t)r->dt.n_tr * r->g.np;

	if (learned_alloc(&r->lr, c)) {
		snprintf(r->err, sizeof(r->err), "out of memory");
		return -1;
	}
	say("held-out fit per layer (R2 / Spearman against the oracle; "
	    "KVzap and KVpop on log KVzip+, Fast KVzip on KVzip; 'delay' "
	    "= Spearman of the raw delay attention alone)\n");
	say("%-5s %-15s %-15s %-24s %-15s %s\n", "layer", "kvzap-linear",
	    "kvzap-mlp", "fastkvzip (bce)", "kvpop", "delay");
	uint64_t tf = now_ms();
	struct progress pf = {tf, 0, r->pg.tty, 0, 0};
	struct fits fs = {.c = c, .o = &r->o, .z = &r->z, .p = &r->p,
	                  .zt = zt, .pt = pt, .lr = &r->lr, .pg = &pf};
	int frc = fit_all(&fs, r->o.jobs);
	if (frc) {
		snprintf(r->err, sizeof(r->err), "layer %u: fit failed: %s",
		         fs.bad, kvt_strerror(frc));
		return -1;
	}
	say("summary over %u layers (held out):\n", c->n_layers);
	summary(&r->lr, "kvzap-linear", 0, 1);
	summary(&r->lr, "kvzap-mlp", 2, 3);
	summary(&r->lr, "fastkvzip", 4, 5);
	summary(&r->lr, "kvpop", 7, 8);
	if (pop_shares((const float *const *)r->lr.pop_tr, c->n_layers, pt,
	               c->n_kv_heads, r->lr.keep, RECIPE_KVPOP_SHARES,
	               r->lr.share)) {
		snprintf(r->err, sizeof(r->err), "out of memory");
		return -1;
	}
	say_shares(&r->lr, c);
	say("fits: %.0f s\n", (double)(now_ms() - tf) / 1e3);
	return 0;
}

/* Writes the scorers' files and fit.csv under r->out; 0, or nonzero with
 * r->err set. */
static int write_outputs(struct run *r)
{
	const struct model_config *c = &r->m.cfg;
	const struct learned *lr = &r->lr;
	const char *out = r->out;
	char dir[1100], fp[1100];

	snprintf(dir, sizeof(dir), "%s/kvzap-linear", out);
	if (save_kvzap(dir, c, 0, lr->lW, lr->lb, NULL, NULL, r->o.dtype,
	               r->err, sizeof(r->err)))
		return -1;
	snprintf(dir, sizeof(dir), "%s/kvzap-mlp", out);
	if (save_kvzap(dir, c, lr->hid, lr->mW1, lr->mb1, lr->mW2, lr->mb2,
	               r->o.dtype, r->err, sizeof(r->err)))
		return -1;
	snprintf(fp, sizeof(fp), "%s/fastkvzip.safetensors", out);
	if (save_fastkvzip(fp, c, lr->gp, r->o.dtype, r->err, sizeof(r->err)))
		return -1;
	snprintf(fp, sizeof(fp), "%s/kvpop.safetensors", out);
	float *mem = malloc(sizeof(float) * 3 * lr->L);
	if (!mem) {
		snprintf(r->err, sizeof(r->err), "out of memory");
		return -1;
	}
	for (uint32_t l = 0; l < lr->L; l++) {
		mem[3 * l] = lr->mem[l].decay;
		mem[3 * l + 1] = lr->mem[l].w_s;
		mem[3 * l + 2] = lr->mem[l].w_f;
	}
	int src = save_kvpop(fp, c, lr->pp, lr->share, lr->keep,
	                     RECIPE_KVPOP_SHARES, mem, r->o.dtype, r->err,
	                     sizeof(r->err));
	free(mem);
	if (src)
		return -1;
	if (write_csv(out, lr)) {
		snprintf(r->err, sizeof(r->err), "%s/fit.csv: %s", out,
		         strerror(errno));
		return -1;
	}
	say("wrote %s/{kvzap-linear,kvzap-mlp}/, fastkvzip.safetensors, "
	    "kvpop.safetensors, fit.txt, fit.csv in %.0f s\n", out,
	    (double)(now_ms() - r->pg.t0) / 1e3);
	return 0;
}

/* Releases everything a loaded run holds, so LeakSanitizer (make
 * SANITIZER=address test runs this tool) only ever reports real leaks. */
static void run_free(struct run *r)
{
	if (fit_out)
		fclose(fit_out);
	learned_free(&r->lr);
	collect_free(&r->z);
	collect_free(&r->p);
	data_free(&r->dt);
	tok_free(r->tk);
	model_free(&r->m);
}

int main(int argc, char **argv)
{
	struct run r = {.o = {.seed = 1, .jobs = 1}};
	const char *model_arg = NULL;
	int rc;

	if ((rc = parse_args(argc, argv, &r, &model_arg)) >= 0)
		return rc;
	openblas_set_num_threads(1);
	if (load_model(&r, model_arg))
		return 1;
	rc = prepare(&r) || collect_oracles(&r) || fit_layers(&r) ||
	     write_outputs(&r);
	if (rc)
		fprintf(stderr, "kvtrim-train: %s\n", r.err);
	run_free(&r);
	return rc ? 1 : 0;
}
