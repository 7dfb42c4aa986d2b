/*
 * context.c — kvtrim-eval's protocol 1, context compression, for a model
 * with a tokenizer (`kvtrim-eval --model smollm2`; docs/eval.md,
 * "Protocol 1"): its jobs (the registry's ratio policies, kvzap and Fast
 * KVzip at their calibrated and swept thresholds, fastkvzip, kvpop,
 * kvzip, oracle), the windows' references and runs on the worker pool
 * (at most CTX_HELD windows held), then the tasks (tasks.c) and the
 * results files.  --dump-kept and --calibrate go to dump_kept.c and
 * calibration.c.
 */
#include "../common/eval.h"
#include "../common/pool.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "../../train/recipe.h"
#include "context.h"
#include "tasks.h"
#include "model_gguf.h"
#include "now.h"
#include "policy.h"
#include "oracle.h"
#include "tokenizer.h"

void openblas_set_num_threads(int n);

#define CTX_P 1024u
#define CTX_C 128u
#define CTX_WINDOWS 16u
#define CTX_QUICK_P 256u
#define CTX_QUICK_C 32u
#define CTX_QUICK_WINDOWS 2u
#define CTX_SWEEP 4u
#define CTX_HELD 2u /* windows held at once */
#define CTX_FKV_WINDOW 16u /* eval_add_fastkvzip's window and sinks */
#define CTX_FKV_SINKS 4u

/* ------------------------------------------------------------ the pool */

struct win_slot {
	struct ctx_window w;
	int ready;          /* reference built */
	uint32_t left;      /* runs still to finish on it */
};

/* What the workers share (under the pool's lock): the windows and the
 * jobs.  The pool's job k is window k / (1 + njobs)'s reference (k % (1 +
 * njobs) == 0) or the run of job k % (1 + njobs) - 1 on it. */
struct windows {
	const struct model *M;
	const struct eval_opts *a;
	const struct dataset *ev;
	const int32_t *sep;
	uint32_t nsep, P, T, nwin;
	struct job *jobs;
	uint32_t njobs;
	const char *rt;
	pthread_cond_t cond;
	struct win_slot *win;  /* [nwin] */
	uint32_t released;     /* windows freed so far (in order) */
	uint64_t done_ref, done_run;
};

/* A worker's scratch: a cache, keep flags, the continuation's logits. */
struct run_scratch {
	struct ctx_cache *c;
	uint8_t *keep;         /* [L][n_kv][P] */
	float *lg;             /* [T-1-P][V] */
};

static void describe(struct pool *pl, char *b, size_t n)
{
	const struct windows *p = pl->ctx;
	snprintf(b, n, "references %llu/%u windows, runs %llu/%llu",
	         (unsigned long long)p->done_ref, p->nwin,
	         (unsigned long long)p->done_run,
	         (unsigned long long)p->nwin * p->njobs);
}

static void *run_open(struct pool *pl)
{
	const struct windows *p = pl->ctx;
	const struct model_config *mc = &p->M->cfg;
	struct run_scratch *s = calloc(1, sizeof(*s));
	if (!s || !(s->keep = malloc((size_t)mc->n_layers * mc->n_kv_heads *
	                             p->P)) ||
	    !(s->lg = malloc(sizeof(float) * (p->T - 1 - p->P) *
	                     mc->vocab_size)) ||
	    ctx_cache_open(p->M, p->T, &s->c))
		eval_die("out of memory");
	return s;
}

static void run_close(struct pool *pl, void *scratch)
{
	struct run_scratch *s = scratch;
	ctx_cache_close(s->c);
	free(s->keep);
	free(s->lg);
	free(s);
}

/* The reference of window wi, once the window CTX_HELD before it is
 * gone (called and returning under the lock). */
static void build_ref(struct pool *pl, uint32_t wi)
{
	struct windows *p = pl->ctx;
	struct win_slot *ws = &p->win[wi];
	while (wi >= CTX_HELD && p->released <= wi - CTX_HELD)
		pthread_cond_wait(&p->cond, &pl->lock);
	pthread_mutex_unlock(&pl->lock);
	int rc = ctx_window_build(p->M, p->ev->tok + (size_t)wi * p->T, p->P,
	                          p->T, p->sep, p->nsep, &ws->w);
	if (rc)
		eval_die("window %u: reference: %s", wi, kvt_strerror(rc));
	pthread_mutex_lock(&pl->lock);
	ws->ready = 1;
	p->done_ref++;
	pthread_cond_broadcast(&p->cond);
}

/* One run of job j on window w: its kept entries into s->c, the
 * continuation.  Reason in err. */
static int run_one(const struct windows *p, const struct job *j,
                   uint32_t wi, const struct ctx_window *w,
                   struct run_scratch *sc, struct ctx_score *s, char *err,
                   size_t errlen)
{
	char tn[64];
	snprintf(tn, sizeof(tn), "ctx-%.24s-%u-w%u", j->name,
	         (unsigned)(j - p->jobs), wi);
	int rc = task_load(p->M, j, tn, w, p->rt, sc->c, sc->keep, err,
	                   errlen);
	if (rc)
		return rc;
	rc = ctx_continue(p->M, w, sc->c, sc->lg, s);
	if (rc)
		snprintf(err, errlen, "continuation: %s", kvt_strerror(rc));
	return rc;
}

/* Under the lock: run s of job j (rc its result) added up; the windows
 * whose runs have all finished are freed, in order (so the runs of a
 * window finish before the reference of the window CTX_HELD after it is
 * built). */
static void run_done(struct windows *p, struct job *j, uint32_t wi, int rc,
                     const struct ctx_score *s, const char *err)
{
	const struct model_config *mc = &p->M->cfg;
	if (rc) {
		j->failed = 1;
		snprintf(j->err, sizeof(j->err), "window %u: %s", wi, err);
		fprintf(stderr, "  %-13s %.3f FAILED: %s\n", j->name, j->ratio,
		        j->err);
	} else if (s) {
		j->kl += s->kl;
		j->top1 += s->top1;
		j->dnll += s->dnll;
		j->npos += s->npos;
		j->ach += 1.0 - (double)s->kept /
		          ((double)p->P * mc->n_layers * mc->n_kv_heads);
		j->nach++;
	}
	p->done_run++;
	if (--p->win[wi].left)
		return;
	while (p->released < p->nwin && p->win[p->released].left == 0 &&
	       p->win[p->released].ready) {
		ctx_window_free(&p->win[p->released].w);
		p->released++;
	}
	pthread_cond_broadcast(&p->cond);
}

/* The pool's job: a window's reference or one run on it. */
static void run_task(struct pool *pl, void *scratch, uint64_t task)
{
	struct windows *p = pl->ctx;
	uint32_t wi = (uint32_t)(task / (1 + p->njobs)),
	         k = (uint32_t)(task % (1 + p->njobs));
	struct win_slot *ws = &p->win[wi];
	pthread_mutex_lock(&pl->lock);
	if (k == 0) {
		build_ref(pl, wi);
		pool_progress(pl, 1);
		pthread_mutex_unlock(&pl->lock);
		return;
	}
	struct job *j = &p->jobs[k - 1];
	while (!ws->ready)
		pthread_cond_wait(&p->cond, &pl->lock);
	int skip = j->failed;
	pthread_mutex_unlock(&pl->lock);
	struct ctx_score s;
	char err[600] = "";
	int rc = skip ? 0 : run_one(p, j, wi, &ws->w, scratch, &s, err,
	                            sizeof(err));
	pthread_mutex_lock(&pl->lock);
	run_done(p, j, wi, rc, skip ? NULL : &s, err);
	pool_progress(pl, 1);
	pthread_mutex_unlock(&pl->lock);
}

/* Every job on every window of ev (--threads workers); the windows are
 * freed as their runs end. */
static void run_windows(struct windows *p, int threads)
{
	char label[96];
	snprintf(label, sizeof(label), "%s context compression", p->a->mname);
	p->cond = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
	p->win = calloc(p->nwin ? p->nwin : 1, sizeof(*p->win));
	if (!p->win)
		eval_die("out of memory");
	for (uint32_t w = 0; w < p->nwin; w++)
		p->win[w].left = p->njobs;
	struct pool pl = {.threads = threads,
	                  .njobs = (uint64_t)p->nwin * (1 + p->njobs),
	                  .ctx = p, .open = run_open, .close = run_close,
	                  .run = run_task, .label = label,
	                  .units = (uint64_t)p->nwin * (1 + p->njobs),
	                  .describe = describe};
	pool_run(&pl);
	for (uint32_t w = p->released; w < p->nwin; w++)
		ctx_window_free(&p->win[w].w);
	free(p->win);
}

/* ------------------------------------------------------------ jobs */

/* What the jobs are made of (make_jobs). */
struct jobs_in {
	const struct model *M;
	const struct eval_opts *a;
	float *zs[2];         /* kvzap's calibration scores (NULL: none) */
	float *gs;            /* Fast KVzip's gate's, likewise */
	uint32_t ncal, calP;  /* their windows, of calP tokens */
	const double *ratios;
	uint32_t nrat;
};

/*
 * Fast KVzip as its paper evicts: one threshold F for every layer (an
 * entry outside the sinks and the window is dropped iff its gate score is
 * below F), chosen on the training split for the target R exactly as
 * kvzap's (kvzap_tau on the gate's scores gs: the rule is kvzap's under
 * this protocol).  The `fastkvzip` jobs keep each layer's budget instead
 * (kvpress layerwise): the two rows show what the budget rule is worth.
 */
static void ctx_add_fastkvzip_global(struct job *jobs, uint32_t *n,
                                     const struct model *M, const char *wabs,
                                     const float *gs, uint32_t ncal,
                                     uint32_t P, double R)
{
	char s[KVT_SPEC_MAX];
	float F = kvzap_tau(M, gs, ncal, P, P, CTX_FKV_WINDOW, CTX_FKV_SINKS, R);
	snprintf(s, sizeof(s), "fastkvzip:model=%s/fastkvzip.safetensors,"
	         "threshold=%.9g,window=%u,sinks=%u", wabs, F, CTX_FKV_WINDOW,
	         CTX_FKV_SINKS);
	eval_add_job(jobs, n, "fastkvzip-global", R, J_DAEMON, s, NULL,
	             NULL)->tau = F;
}

/* Its sweep of npts fixed thresholds, chosen on the training split as
 * kvzap's (kvzap_sweep_grid, three significant digits: the gate's scores
 * are probabilities), so its curve brackets every column of the table. */
static void ctx_add_fastkvzip_sweep(struct job *jobs, uint32_t *n,
                                    const struct model *M, const char *wabs,
                                    const float *gs, uint32_t ncal,
                                    uint32_t P, uint32_t npts)
{
	float grid[64];
	uint32_t ng = kvzap_sweep_grid(M, "fastkvzip-global", gs, ncal, P, P,
	                               CTX_FKV_WINDOW, CTX_FKV_SINKS, npts, 0,
	                               grid);
	for (uint32_t i = 0; i < ng; i++) {
		char s[KVT_SPEC_MAX];
		snprintf(s, sizeof(s), "fastkvzip:model=%s/fastkvzip.safetensors,"
		         "threshold=%.9g,window=%u,sinks=%u", wabs, grid[i],
		         CTX_FKV_WINDOW, CTX_FKV_SINKS);
		struct job *j = eval_add_job(jobs, n, "fastkvzip-global", 0,
		                             J_DAEMON, s, NULL, NULL);
		j->tau = grid[i];
		j->sweep = 1;
	}
}

/* The jobs for contexts of P tokens into jobs (a task_jobs_fn, also
 * used by the tasks at their lengths): kvzap's thresholds from the
 * calibration, kvpop's token budget from P. */
static uint32_t make_jobs(void *arg, uint32_t P, struct job *jobs)
{
	const struct jobs_in *in = arg;
	const struct model *M = in->M;
	const struct eval_opts *a = in->a;
	float *const *zs = in->zs;
	const uint32_t ncal = in->ncal, nrat = in->nrat;
	const double *ratios = in->ratios;
	const int have_w = a->wabs[0] != 0;
	uint32_t njobs = 0;
	eval_add_job(jobs, &njobs, "full", 0, J_DAEMON, "full", NULL, NULL);
	char s[KVT_SPEC_MAX];
	for (uint32_t q = 0; q < nrat; q++) {
		double R = ratios[q];
		uint32_t B = P - (uint32_t)floor(R * P);
		eval_add_budget_jobs(jobs, &njobs, M, POLICY_EVAL_CONTEXT, R, R, 0);
		for (int v = 0; v < 2; v++)
			if (zs[v])
				kvzap_add_target(jobs, &njobs, M, a->wabs, v, zs[v],
				                 ncal, in->calP, in->calP,
				                 CTX_KVZAP_SINKS, R);
		if (in->gs)
			ctx_add_fastkvzip_global(jobs, &njobs, M, a->wabs, in->gs,
			                         ncal, in->calP, R);
		if (have_w) {
			eval_add_fastkvzip(jobs, &njobs, a->wabs, R, R, 0, 16);
			eval_kvpop_spec(s, sizeof(s), a->wabs, B);
			eval_add_job(jobs, &njobs, "kvpop", R, J_DAEMON, s, NULL,
			             NULL);
		}
		eval_add_job(jobs, &njobs, "kvzip", R, J_KVZIP,
		             "kvzip (in-process)", NULL, NULL);
		eval_add_job(jobs, &njobs, "oracle", R, J_ORACLE,
		             "hindsight oracle (in-process)", NULL, NULL);
	}
	for (int v = 0; v < 2; v++)
		if (zs[v])
			kvzap_add_sweep(jobs, &njobs, M, a->wabs, v, zs[v], ncal,
			                in->calP, in->calP, CTX_KVZAP_SINKS,
			                a->quick ? 2 : CTX_SWEEP);
	if (in->gs)
		ctx_add_fastkvzip_sweep(jobs, &njobs, M, a->wabs, in->gs, ncal,
		                        in->calP, a->quick ? 2 : CTX_SWEEP);
	return njobs;
}

/* ------------------------------------------------------------ results */

/* quality.png: the sweep rows merged into their policies' curves. */
static void write_png(const char *dir, struct row *rows, size_t nr,
                      const char *model)
{
	table_write_png(dir, rows, nr, 1);
}

/* ------------------------------------------------------------ the run */

int context_main(const struct model *M, const struct eval_opts *a)
{
	const struct model_config *mc = &M->cfg;
	char err[1024];
	uint64_t t0 = now_ms();
	struct tok *tk;
	if (model_gguf_tok_file(a->model_path, M, &tk, err, sizeof(err)))
		eval_die("%s", err);
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t nsep;
	if (oracle_repeat_sep(tk, sep, &nsep, err, sizeof(err)))
		eval_die("%s", err);
	const uint32_t P = a->quick ? CTX_QUICK_P : CTX_P,
	               C = a->quick ? CTX_QUICK_C : CTX_C, T = P + C;
	if (P + nsep + P > model_context(M))
		eval_die("KVzip's pretext of %u tokens exceeds the context %u",
		         P + nsep + P, model_context(M));
	struct dataset ev;
	const double *ratios;
	const uint32_t nrat = ctx_windows(M, tk, a, T, a->quick ?
	                                  CTX_QUICK_WINDOWS : CTX_WINDOWS,
	                                  &ev, &ratios);
	if (a->dump) /* the kvpress parity's dump (dump_kept.c) */
		return dump_kept_main(M, a, tk, &ev, sep, nsep, P, T);
	if (a->calibrate) {
		dataset_free(&ev);
		int rc = ctx_write_calibration(M, tk, a, P);
		tok_free(tk);
		return rc;
	}

	/* ---- jobs */
	static struct job jobs[MAX_JOBS];
	uint32_t njobs = 0;
	float *zs[2] = {NULL, NULL}, *gs = NULL;
	uint32_t ncal = 0;
	ctx_calibrate(M, tk, a, P, a->quick ? 2 : CTX_CAL, zs, &gs, &ncal);
	struct jobs_in jin = {.M = M, .a = a, .zs = {zs[0], zs[1]}, .gs = gs,
	                      .ncal = ncal, .calP = P, .ratios = ratios,
	                      .nrat = nrat};
	njobs = make_jobs(&jin, P, jobs);
	if (a->only)
		njobs = eval_only_jobs(jobs, njobs, a->only);

	/* ---- the pool */
	char rt[400];
	eval_runtime_dir(a->rt, a->argv0, rt, sizeof(rt));
	openblas_set_num_threads(1);
	struct windows p = {
		.M = M, .a = a, .ev = &ev, .sep = sep, .nsep = nsep, .P = P,
		.T = T, .nwin = ev.n, .jobs = jobs, .njobs = njobs, .rt = rt,
	};
	if (!a->tasksonly) {
		fprintf(stderr, "kvtrim-eval: %s: %u windows of %u + %u "
		        "tokens, %u jobs, %d threads, kvtrimd on %s\n",
		        a->mname, ev.n, P, C, njobs, a->threads, rt);
		run_windows(&p, a->threads);
	}
	double secs = (double)(now_ms() - t0) / 1e3;

	/* ---- the needle and copy tasks (tasks.c), on the same daemon */
	struct task_args ta = {.M = M, .a = a, .tk = tk, .sep = sep,
	                          .nsep = nsep, .rt = rt, .jobs = make_jobs,
	                          .jobs_arg = &jin};
	int tbad = a->notasks ? 0 : task_main(&ta);
	eval_daemon_stop();
	free(zs[0]);
	free(zs[1]);
	free(gs);

	char what[512];
	snprintf(what, sizeof(what), "%s, protocol 1 (context compression): "
	         "%u windows of %u context + %u continuation tokens%s, %u "
	         "kvzap calibration windows; %u jobs; %.1f minutes with %d "
	         "threads", a->mname, ev.n, P, C, a->quick ? " (quick)" : "",
	         ncal, njobs, secs / 60, a->threads);
	int bad = tbad;
	if (!a->tasksonly)
		bad |= table_write_results(a, jobs, njobs, what, "",
		                         "quality.csv", context_write_md,
		                         write_png);
	fprintf(stderr, "kvtrim-eval: %s done in %.0fs\n", a->mname,
	        (double)(now_ms() - t0) / 1e3);
	dataset_free(&ev);
	tok_free(tk);
	(void)mc;
	return bad ? 1 : 0;
}
