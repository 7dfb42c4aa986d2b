/*
 * dump_kept.c — `kvtrim-eval --model smollm2 --dump-kept DIR [--seqs N]
 * [--quick]`: what protocol 1 decides, written out for an independent
 * implementation to compare with (scripts/kvpress_parity.py, `make
 * parity`): per policy and ratio the context entries each (layer, KV head)
 * kept, found again bit for bit among the window's context rows.
 *
 * The policies' parity parameters (parity[] below), the files written to
 * DIR and their layouts are in docs/eval.md, "Kept positions for the
 * kvpress parity".  Progress on stderr, one line per window.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "context.h"
#include "now.h"
#include "tokenizer.h"

/* The kvtrim spec of each compared press (%.4f the ratio); the kvpress
 * names are in scripts/kvpress_parity.py. */
static const struct {
	const char *name, *fmt;
} parity[] = {
	{"streaming", "streaming:ratio=%.4f,sinks=4"},
	{"snapkv", "snapkv:ratio=%.4f,window=16,kernel=5"},
	{"tova", "tova:ratio=%.4f"},
	/* h2o's prefill rule without its recent window: the sum that
	 * ObservedAttention averages */
	{"h2o", "h2o:ratio=%.4f,window=0"},
	{"observed_attention", "observed_attention:ratio=%.4f"},
	{"knorm", "knorm:ratio=%.4f"},
	/* statistics of the last 64 queries: the most protocol 1's staging
	 * ring holds (CTX_LOOKBACK); kvpress takes all but the sinks */
	{"expected_attention", "expected_attention:ratio=%.4f,theta=100000,"
	                       "window=64"},
};
#define NPAR (sizeof(parity) / sizeof(parity[0]))
#define NRUN (NPAR + 1) /* + kvzip */
#define KVZAP_WINDOW 32u
#define KVZAP_SINKS 4u

static const char *const zver[2] = {"kvzap-linear", "kvzap-mlp"};

struct drun {
	char name[32], spec[KVT_SPEC_MAX], file[64];
	double ratio;
	FILE *keep;
	double *kl, *top1, *dnll; /* [windows] means */
	uint64_t *kept;           /* [windows] */
	uint64_t npos;
};

static FILE *open_in(const char *dir, const char *name, const char *mode)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, mode);
	if (!f)
		eval_die("%s: %s", p, strerror(errno));
	return f;
}

static void put(FILE *f, const void *b, size_t sz, size_t n)
{
	if (fwrite(b, sz, n, f) != n)
		eval_die("dump: write failed: %s", strerror(errno));
}

/* The keep flags of c's lists: each kept row found among w's P rows. */
static int keep_of(const struct model *M, const struct ctx_window *w,
                   struct ctx_cache *c, uint8_t *keep)
{
	const struct model_config *mc = &M->cfg;
	const uint32_t P = w->P, hd = mc->head_dim;
	const size_t rb = sizeof(float) * hd;
	memset(keep, 0, (size_t)mc->n_layers * mc->n_kv_heads * P);
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			uint8_t *kp = keep + ((size_t)l * mc->n_kv_heads + g) * P;
			const float *K = ctx_cache_k(c, l, g),
			            *V = ctx_cache_v(c, l, g),
			            *FK = ctx_cache_k(w->full, l, g),
			            *FV = ctx_cache_v(w->full, l, g);
			uint32_t n = *ctx_cache_len(c, l, g), at = 0;
			for (uint32_t i = 0; i < n; i++) {
				const float *k = K + (size_t)i * hd,
				            *v = V + (size_t)i * hd;
				uint32_t t, found = 0;
				for (uint32_t s = 0; s < P && !found; s++) {
					t = (at + s) % P;
					found = !memcmp(FK + (size_t)t * hd, k, rb) &&
					        !memcmp(FV + (size_t)t * hd, v, rb);
				}
				if (!found || kp[t])
					return KVT_EPROTO;
				kp[t] = 1;
				at = t + 1;
			}
		}
	return 0;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/*
 * Runs spec in kvtrimd on window w as tenant `name` and writes which
 * context entries it kept to DIR/keep-NAME.u8 (uint8 [L][n_kv][P]; its
 * file name in fn); dies with the reason on a failure.
 */
static void dump_keep(const struct model *M, const char *dir,
                      const struct ctx_window *w, const char *rt,
                      struct ctx_cache *c, uint8_t *keep, const char *name,
                      const char *spec, char *fn, size_t fnlen)
{
	char err[1200] = "";
	const size_t nl = (size_t)M->cfg.n_layers * M->cfg.n_kv_heads;
	ctx_cache_truncate(c, 0);
	int rc = ctx_load_daemon(M, w, rt, name, spec, c, err, sizeof(err));
	if (!rc)
		rc = keep_of(M, w, c, keep);
	if (rc)
		eval_die("%s in kvtrimd: %s", name, rc == KVT_EPROTO && !err[0]
		         ? "a kept row is no context row" : err);
	snprintf(fn, fnlen, "keep-%s.u8", name);
	FILE *f = open_in(dir, fn, "wb");
	put(f, keep, 1, nl * w->P);
	fclose(f);
}

/*
 * KVzap on window 0 for every checkpoint in DIR: x, the C scores, the
 * daemon's kept flags at the median threshold.  Writes the index's
 * "kvzap" member.
 */
static void dump_kvzap(const struct model *M, const char *dir,
                       const struct ctx_window *w, const char *rt,
                       struct ctx_cache *c, uint8_t *keep, FILE *ix)
{
	const struct model_config *mc = &M->cfg;
	const uint32_t P = w->P, L = mc->n_layers;
	const size_t nl = (size_t)L * mc->n_kv_heads;
	int wrote_x = 0;
	fprintf(ix, ",\n \"kvzap\": [");
	for (int v = 0, first = 1; v < 2; v++) {
		char d[PATH_MAX + 64], abs[PATH_MAX], err[1200];
		snprintf(d, sizeof(d), "%s/%s/config.json", dir, zver[v]);
		FILE *probe = fopen(d, "r");
		if (!probe)
			continue;
		fclose(probe);
		snprintf(d, sizeof(d), "%s/%s", dir, zver[v]);
		if (!realpath(d, abs))
			eval_die("%s: %s", d, strerror(errno));
		if (!wrote_x) {
			FILE *f = open_in(dir, "x0.f32", "wb");
			put(f, w->x, sizeof(float), (size_t)L * P * mc->dim);
			fclose(f);
			wrote_x = 1;
		}
		struct kvzap_scorer *z;
		if (kvzap_open(M, abs, P, &z, err, sizeof(err)))
			eval_die("%s: %s", abs, err);
		float *s = malloc(sizeof(float) * nl * P),
		      *srt = malloc(sizeof(float) * nl * P);
		if (!s || !srt)
			eval_die("out of memory");
		kvzap_score(z, w->x, P, s);
		kvzap_close(z);
		char fn[64];
		snprintf(fn, sizeof(fn), "%s.scores.f32", zver[v]);
		FILE *f = open_in(dir, fn, "wb");
		put(f, s, sizeof(float), nl * P);
		fclose(f);
		/* the median of the decided entries' scores */
		size_t n = 0;
		for (size_t li = 0; li < nl; li++)
			for (uint32_t i = KVZAP_SINKS; i + KVZAP_WINDOW < P; i++)
				srt[n++] = s[li * P + i];
		qsort(srt, n, sizeof(float), cmp_float);
		float tau = srt[n / 2];
		char spec[KVT_SPEC_MAX];
		if (strlen(abs) > 180) /* the spec must hold it */
			eval_die("%s: path longer than 180 bytes", abs);
		snprintf(spec, sizeof(spec), "kvzap:model=%.180s,threshold=%.6f,"
		         "window=%u,sinks=%u", abs, tau, KVZAP_WINDOW,
		         KVZAP_SINKS);
		dump_keep(M, dir, w, rt, c, keep, zver[v], spec, fn, sizeof(fn));
		fprintf(ix, "%s\n  {\"name\": \"%s\", \"dir\": \"%s\", "
		        "\"scores\": \"%s.scores.f32\", \"keep\": \"%s\", "
		        "\"threshold\": %.9g, \"window\": %u, \"sinks\": %u, "
		        "\"spec\": \"kvzap:model=DIR/%s,threshold=%.6f,"
		        "window=%u,sinks=%u\"}", first ? "" : ",", zver[v],
		        zver[v], zver[v], fn, tau, KVZAP_WINDOW, KVZAP_SINKS,
		        zver[v], tau, KVZAP_WINDOW, KVZAP_SINKS);
		first = 0;
		free(s);
		free(srt);
	}
	fprintf(ix, "]");
	if (wrote_x)
		fprintf(ix, ",\n \"x0\": \"x0.f32\"");
}

/*
 * The daemon's policies the parity table above leaves out (no kvpress
 * press to compare with), on window 0, for an implementation of the same
 * policies to compare with: pyramidkv and random at ratio 0.75 (random
 * with seed 7), and, when DIR holds their weight files
 * (fastkvzip.safetensors, kvpop.safetensors), Fast KVzip at ratio 0.75
 * (its layer-wide top-k) and KVpop at a budget of P / 4 entries a list.
 * Writes the index's "others" member: name, spec (DIR for the dump's
 * folder) and keep file (uint8 [L][n_kv][P]) of each.
 */
static void dump_others(const struct model *M, const char *dir,
                        const struct ctx_window *w, const char *rt,
                        struct ctx_cache *c, uint8_t *keep, FILE *ix)
{
	static const struct {
		const char *name, *file, *fmt; /* file NULL: no weights */
	} op[] = {{"pyramidkv", NULL, "ratio=0.75"},
	          {"random", NULL, "ratio=0.75,seed=7"},
	          {"fastkvzip", "fastkvzip.safetensors", "ratio=0.75"},
	          {"kvpop", "kvpop.safetensors", "tokens=%u"}};
	fprintf(ix, ",\n \"others\": [");
	for (size_t i = 0, first = 1; i < sizeof(op) / sizeof(op[0]); i++) {
		char d[PATH_MAX + 64], abs[PATH_MAX], spec[KVT_SPEC_MAX],
		     rest[64], model[240] = "",
		     dmodel[96] = "", fn[64];
		if (op[i].file) {
			snprintf(d, sizeof(d), "%s/%s", dir, op[i].file);
			if (!realpath(d, abs))
				continue;
			if (strlen(abs) > 180) /* the spec must hold it */
				eval_die("%s: path longer than 180 bytes", abs);
			snprintf(model, sizeof(model), "model=%.180s,", abs);
			snprintf(dmodel, sizeof(dmodel), "model=DIR/%s,",
			         op[i].file);
		}
		snprintf(rest, sizeof(rest), op[i].fmt, w->P / 4);
		snprintf(spec, sizeof(spec), "%s:%s%s", op[i].name, model, rest);
		dump_keep(M, dir, w, rt, c, keep, op[i].name, spec, fn, sizeof(fn));
		fprintf(ix, "%s\n  {\"name\": \"%s\", \"spec\": \"%s:%s%s\", "
		        "\"keep\": \"%s\"}", first ? "" : ",", op[i].name,
		        op[i].name, dmodel, rest, fn);
		first = 0;
	}
	fprintf(ix, "]");
}

static void json_doubles(FILE *f, const char *key, const double *v,
                         uint32_t n)
{
	fprintf(f, ", \"%s\": [", key);
	for (uint32_t i = 0; i < n; i++)
		fprintf(f, "%s%.9g", i ? ", " : "", v[i]);
	fputc(']', f);
}

/* One dump: its runs (parity's policies and kvzip at each ratio) and
 * scratch. */
struct dump {
	const struct model *M;
	const struct eval_opts *a;
	const struct dataset *ev;
	const int32_t *sep;
	uint32_t nsep, P, T, nrun;
	struct drun *runs;   /* [nrun] */
	uint8_t *keep;       /* [L][n_kv][P] */
	float *lg;           /* [T-1-P][V] */
	int32_t *top;        /* [T-1-P] */
	struct ctx_cache *c;
	char rt[400];
};

/* The runs, their keep files opened in DIR, and the scratch. */
static void open_runs(struct dump *d)
{
	static const double full_ratios[] = {0.5, 0.75, 0.875};
	static const double quick_ratios[] = {0.75};
	const struct model_config *mc = &d->M->cfg;
	const double *ratios = d->a->quick ? quick_ratios : full_ratios;
	const uint32_t nrat = d->a->quick ? 1 : 3, nw = d->ev->n,
	               nc = d->T - 1 - d->P;
	d->nrun = NRUN * nrat;
	d->runs = calloc(d->nrun, sizeof(*d->runs));
	d->keep = malloc((size_t)mc->n_layers * mc->n_kv_heads * d->P);
	d->lg = malloc(sizeof(float) * nc * mc->vocab_size);
	d->top = malloc(sizeof(int32_t) * nc);
	if (!d->runs || !d->keep || !d->lg || !d->top ||
	    ctx_cache_open(d->M, d->T, &d->c))
		eval_die("out of memory");
	for (uint32_t q = 0, k = 0; q < nrat; q++)
		for (uint32_t i = 0; i < NRUN; i++, k++) {
			struct drun *r = &d->runs[k];
			r->ratio = ratios[q];
			snprintf(r->name, sizeof(r->name), "%s",
			         i < NPAR ? parity[i].name : "kvzip");
			if (i < NPAR)
				snprintf(r->spec, sizeof(r->spec), parity[i].fmt,
				         r->ratio);
			else
				snprintf(r->spec, sizeof(r->spec),
				         "kvzip (in-process)");
			snprintf(r->file, sizeof(r->file), "keep-%s-%.3f.u8",
			         r->name, r->ratio);
			r->keep = open_in(d->a->dump, r->file, "wb");
			r->kl = calloc(nw, sizeof(double));
			r->top1 = calloc(nw, sizeof(double));
			r->dnll = calloc(nw, sizeof(double));
			r->kept = calloc(nw, sizeof(uint64_t));
			if (!r->kl || !r->top1 || !r->dnll || !r->kept)
				eval_die("out of memory");
		}
}

/* index.json's geometry, sep and the token files' names. */
static void index_head(const struct dump *d, FILE *ix)
{
	const struct model_config *mc = &d->M->cfg;
	fprintf(ix, "{\"model\": \"%s\", \"P\": %u, \"T\": %u, "
	        "\"windows\": %u, \"layers\": %u, \"kv_heads\": %u, "
	        "\"heads\": %u, \"head_dim\": %u, \"dim\": %u, \"vocab\": "
	        "%u,\n \"sep\": [", d->a->mname, d->P, d->T, d->ev->n,
	        mc->n_layers, mc->n_kv_heads, mc->n_heads, mc->head_dim,
	        mc->dim, mc->vocab_size);
	for (uint32_t i = 0; i < d->nsep; i++)
		fprintf(ix, "%s%d", i ? ", " : "", d->sep[i]);
	fprintf(ix, "],\n \"tokens\": \"tokens.i32\", \"ref_top1\": "
	        "\"ref_top1.i32\"");
}

/* Run k of window wi (reference w): its keep flags written, its scores
 * kept for the index. */
static void dump_run(struct dump *d, uint32_t k, uint32_t wi,
                     const struct ctx_window *w)
{
	const size_t nl = (size_t)d->M->cfg.n_layers * d->M->cfg.n_kv_heads;
	struct drun *r = &d->runs[k];
	char err[600] = "", tn[64];
	int rc;
	ctx_cache_truncate(d->c, 0);
	if (strcmp(r->name, "kvzip")) {
		snprintf(tn, sizeof(tn), "dump-%.24s-%u-w%u", r->name, k, wi);
		rc = ctx_load_daemon(d->M, w, d->rt, tn, r->spec, d->c, err,
		                     sizeof(err));
		if (!rc && (rc = keep_of(d->M, w, d->c, d->keep)))
			snprintf(err, sizeof(err), "a kept row is no context "
			         "row");
	} else {
		rc = ctx_keep_kvzip(d->M, w, r->ratio, d->keep);
		if (!rc)
			ctx_load_keep(d->M, w, d->keep, d->c);
		else
			snprintf(err, sizeof(err), "%s", kvt_strerror(rc));
	}
	struct ctx_score s;
	if (!rc && (rc = ctx_continue(d->M, w, d->c, d->lg, &s)))
		snprintf(err, sizeof(err), "continuation: %s",
		         kvt_strerror(rc));
	if (rc)
		eval_die("window %u, %s %.3f: %s", wi, r->name, r->ratio, err);
	put(r->keep, d->keep, 1, nl * d->P);
	r->kl[wi] = s.kl / s.npos;
	r->top1[wi] = s.top1 / s.npos;
	r->dnll[wi] = s.dnll / s.npos;
	r->kept[wi] = s.kept;
	r->npos = s.npos;
}

/* Window wi: its reference's argmaxes into ftop, every run on it, and on
 * window 0 kvzap's and the other policies' kept entries. */
static void dump_window(struct dump *d, uint32_t wi, FILE *ftop, FILE *ix)
{
	const uint32_t nc = d->T - 1 - d->P, V = d->M->cfg.vocab_size;
	struct ctx_window w;
	int rc = ctx_window_build(d->M, d->ev->tok + (size_t)wi * d->T, d->P,
	                          d->T, d->sep, d->nsep, &w);
	if (rc)
		eval_die("window %u: reference: %s", wi, kvt_strerror(rc));
	for (uint32_t t = 0; t < nc; t++) {
		const float *r = w.ref + (size_t)t * V;
		uint32_t b = 0;
		for (uint32_t v = 1; v < V; v++)
			b = r[v] > r[b] ? v : b;
		d->top[t] = (int32_t)b;
	}
	put(ftop, d->top, sizeof(int32_t), nc);
	for (uint32_t k = 0; k < d->nrun; k++)
		dump_run(d, k, wi, &w);
	if (wi == 0) {
		dump_kvzap(d->M, d->a->dump, &w, d->rt, d->c, d->keep, ix);
		dump_others(d->M, d->a->dump, &w, d->rt, d->c, d->keep, ix);
	}
	ctx_window_free(&w);
}

/* index.json's runs; the runs' files closed and their sums freed. */
static void index_runs(struct dump *d, FILE *ix)
{
	const uint32_t nw = d->ev->n;
	fprintf(ix, ",\n \"runs\": [");
	for (uint32_t k = 0; k < d->nrun; k++) {
		struct drun *r = &d->runs[k];
		fclose(r->keep);
		fprintf(ix, "%s\n  {\"policy\": \"%s\", \"ratio\": %.4f, "
		        "\"spec\": \"%s\", \"keep\": \"%s\", \"npos\": %llu",
		        k ? "," : "", r->name, r->ratio, r->spec, r->file,
		        (unsigned long long)r->npos);
		json_doubles(ix, "kl", r->kl, nw);
		json_doubles(ix, "top1", r->top1, nw);
		json_doubles(ix, "dnll", r->dnll, nw);
		fprintf(ix, ", \"kept\": [");
		for (uint32_t i = 0; i < nw; i++)
			fprintf(ix, "%s%llu", i ? ", " : "",
			        (unsigned long long)r->kept[i]);
		fprintf(ix, "]}");
		free(r->kl);
		free(r->top1);
		free(r->dnll);
		free(r->kept);
	}
	fprintf(ix, "]}\n");
}

int dump_kept_main(const struct model *M, const struct eval_opts *a,
                   struct tok *tk, struct dataset *ev, const int32_t *sep,
                   uint32_t nsep, uint32_t P, uint32_t T)
{
	const char *dir = a->dump;
	uint64_t t0 = now_ms();
	struct dump d = {.M = M, .a = a, .ev = ev, .sep = sep, .nsep = nsep,
	                 .P = P, .T = T};
	open_runs(&d);
	eval_runtime_dir(a->rt, a->argv0, d.rt, sizeof(d.rt));
	FILE *ftok = open_in(dir, "tokens.i32", "wb"),
	     *ftop = open_in(dir, "ref_top1.i32", "wb"),
	     *ix = open_in(dir, "index.json", "w");
	put(ftok, ev->tok, sizeof(int32_t), (size_t)ev->n * T);
	fclose(ftok);
	index_head(&d, ix);
	for (uint32_t wi = 0; wi < ev->n; wi++) {
		dump_window(&d, wi, ftop, ix);
		fprintf(stderr, "kvtrim-eval: dump: window %u/%u, %u runs, "
		        "elapsed %.0fs\n", wi + 1, ev->n, d.nrun,
		        (double)(now_ms() - t0) / 1e3);
	}
	if (!a->rt)
		eval_daemon_stop();
	fclose(ftop);
	index_runs(&d, ix);
	if (fclose(ix))
		eval_die("%s/index.json: %s", dir, strerror(errno));
	fprintf(stderr, "kvtrim-eval: dump: %u windows, %u runs in %s (%.0fs)\n",
	        ev->n, d.nrun, dir, (double)(now_ms() - t0) / 1e3);
	ctx_cache_close(d.c);
	free(d.runs);
	free(d.keep);
	free(d.lg);
	free(d.top);
	dataset_free(ev);
	tok_free(tk);
	return 0;
}
