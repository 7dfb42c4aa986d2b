/*
 * eval.h — what the files of kvtrim-eval (tools/eval/) share: the protocol's
 * constants, the cases (inputs) and the jobs (one policy at one budget),
 * the csv rows, and each file's functions.  The protocols are
 * described in docs/eval.md.
 *
 *   main.c    options, the cases and jobs of a run, the results files
 *   eval.c    dying cleanly: the kvtrimd a run started, signals
 *   cases.c   the inputs: evaluation sequences, copy and needle cases,
 *             their full-cache references and KVzip scores
 *   kvzap.c   kvzap's thresholds from the training split (calibration
 *             and the sweep grid)
 *   run.c     the worker threads: a job's cases through kvtrimd or the
 *             in-process replay (kvzip, oracle), scored against the
 *             reference
 *   table.c   quality.csv rows, quality.md and quality.png
 *   ctxmain.c protocol 1 (context compression) for models with a
 *             tokenizer (SmolLM2): its windows, jobs and results
 *   ctx.c     protocol 1's machinery (ctx.h): the in-process cache, the
 *             full-cache reference of a window, a policy's run on it
 *   ctxtable.c protocol 1's quality.md
 *   ctxtask.c  protocol 1's needle and copy tasks (ctxtask.h);
 *             ctxtask_case.c their cases;
 *             ctxtasktab.c their tables
 *   dec2.c    protocol 2 (decoding-time compression) for models with a
 *             tokenizer (dec2.h): every policy decoding in lockstep,
 *             batched; dec2main.c its windows, jobs and results files
 *   curve.c   reading a policy's curve at an achieved ratio
 *   ctxdump.c protocol 1's kept positions for the kvpress parity
 *             (--dump-kept)
 */
#ifndef KVT_EVAL_H
#define KVT_EVAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtrim.h"

struct dataset;
struct engine;
struct model;

#define CHUNK 64u
#define COPY_FILLER 200u
#define COPY_SKIP 8u
#define KVZIP_SINKS 4u
#define MAX_JOBS 96
/* Key-value needles (byte models): depths in bytes between the end of the
 * target record and the start of its query; every case is NEEDLE_LEN
 * bytes long (BOS included); NEEDLE_DIGITS digits per value. */
#define NEEDLE_NDEPTH 4
#define NEEDLE_LEN 512u
#define NEEDLE_DIGITS 5u
#define NEEDLE_DISTRACTORS 3u
#define NEEDLE_BAR 0.5 /* full-cache per-digit accuracy a depth needs */
#define NEEDLE_SEED 0x6e6565646c652d31ull /* "needle-1" */
/* kvzap threshold sweep: the grid spans the thresholds that reach these
 * ratios on the training split */
#define SWEEP_LO 0.30
#define SWEEP_HI 0.95
#define SWEEP_ROUND 0.25 /* swept thresholds are multiples of it */
/* Protocol 1: staging rows a tenant keeps beyond its context, for the
 * lookback of policies that read earlier rows (snapkv's window). */
#define CTX_LOOKBACK 64u
#define CTX_SYNC_TIMEOUT_MS 600000 /* one sync of a whole context: see ctx.c */

/* What a case is scored by (also the engine a daemon job runs it on). */
enum ckind { C_MAIN = 0, C_COPY = 1, C_NEEDLE = 2, C_NKIND };

/* One input: tokens, prefill length, and what is scored. */
struct ecase {
	int32_t *tok;   /* [T] */
	uint32_t T, P;
	enum ckind kind;
	uint32_t c0;    /* copy / needle: first scored target position */
	uint32_t di;    /* needle: depth index */
	float *ref;     /* [T - 1 - P][V] full-cache logits of steps P..T-2 */
	float *kvzip;   /* [L][n_kv][P] KVzip scores of the prompt */
};

enum jkind { J_DAEMON, J_KVZIP, J_ORACLE };

struct job {
	char name[32];
	double ratio;
	enum jkind kind;
	int sweep;      /* 1: fixed-threshold sweep row (ratio unused) */
	double tau;     /* kvzap threshold, NaN for other policies */
	/* spec[C_MAIN] always; spec[C_COPY] / spec[C_NEEDLE] when those
	 * cases need their own budget (kvpop), else they run on e[C_MAIN] */
	char spec[C_NKIND][KVT_SPEC_MAX];
	struct engine *e[C_NKIND];
	/* results */
	double kl, top1, dnll, ach;
	uint64_t npos, nach, copy_ok, copy_n;
	uint64_t nd_ok[NEEDLE_NDEPTH], nd_n[NEEDLE_NDEPTH],
	         nd_exact[NEEDLE_NDEPTH], nd_cases[NEEDLE_NDEPTH];
	uint32_t case_ok; /* needle digits right in the current case */
	int failed;
	char err[600];
};

/* One csv row.  Sweep rows (kvzap at a fixed threshold) have no target;
 * tau is the kvzap or fastkvzip-global threshold (calibrated or swept),
 * empty otherwise. */
struct row {
	char model[64], policy[64];
	double target, ach, kl, top1, dnll, copy, needle, tau; /* NaN = empty */
};

/* eval.c */
/* Appends a job to jobs[*n] (dies beyond MAX_JOBS); spec_copy and
 * spec_needle may be NULL. */
struct job *eval_add_job(struct job *jobs, uint32_t *n, const char *name,
                         double R, enum jkind kind, const char *spec,
                         const char *spec_copy, const char *spec_needle);
/* A daemon policy whose budget is a ratio: its name and its spec format
 * (one %.4f, the ratio). */
struct eval_ratio_policy {
	const char *name, *fmt;
};
/* A job of target R per policy of pol[np], each asked for the ratio Rs. */
void eval_add_ratio_jobs(struct job *jobs, uint32_t *n,
                         const struct eval_ratio_policy *pol, size_t np,
                         double R, double Rs);
/* The fastkvzip job of the weights in wabs at target R, asked for the
 * ratio Rs, deciding every `every` syncs. */
void eval_add_fastkvzip(struct job *jobs, uint32_t *n, const char *wabs,
                        double R, double Rs, uint32_t every);
/* kvpop's spec with the weights in wabs and a budget of tokens per list
 * (delay RECIPE_KVPOP_DELAY, 4 sinks). */
void eval_kvpop_spec(char *s, size_t len, const char *wabs, uint32_t tokens);
/* Prints "kvtrim-eval: " and the message, stops the daemon this run
 * started (eval_daemon_start), exits 1. */
void eval_die(const char *fmt, ...) __attribute__((format(printf, 1, 2),
                                                   noreturn));
/* Starts kvtrimd (beside this executable) on a fresh runtime directory,
 * written to rt; waits until its sockets exist.  Dies on failure. */
void eval_daemon_start(const char *argv0, char *rt, size_t rtlen);
/* The runtime directory of the run into rt: given (--runtime-dir) when
 * not NULL, else a kvtrimd's that eval_daemon_start starts. */
void eval_runtime_dir(const char *given, const char *argv0, char *rt,
                      size_t rtlen);
void eval_daemon_stop(void);
/* SIGINT / SIGTERM handler: the daemon must not outlive the run. */
void eval_on_signal(int sig);

/* cases.c */
/* Needle depths in bytes; case s has depth s % NEEDLE_NDEPTH. */
extern const uint32_t cases_needle_depth[NEEDLE_NDEPTH];
void cases_ref(const struct model *M, struct ecase *c);
void cases_kvzip(const struct model *M, struct ecase *c);
uint32_t cases_copy(struct ecase *out, uint32_t want);
void cases_needle(struct ecase *out, uint32_t want);
void cases_needle_full(const struct model *M, const struct ecase *c,
                       uint32_t nc, double *digit, double *exact,
                       uint32_t *per_depth);

/* Scores y [n][nkv] of rows i0 .. i0 + n of one layer into out
 * [L][nkv][T] (the scorers' kernels write token-major, the calibration
 * reads head-major). */
void eval_put_scores(float *out, const float *y, uint32_t layer,
                     uint32_t nkv, uint32_t T, uint32_t i0, uint32_t n);

/* kvzap.c */
/* A kvzap scorer (linear or MLP, kvpress checkpoint dir) for sequences of
 * up to T rows per call; reason in err. */
struct kvzap_scorer;
int kvzap_open(const struct model *M, const char *dir, uint32_t T,
               struct kvzap_scorer **out, char *err, size_t errlen);
/* Scores of the attention inputs xs [L][T][d_model]: out [L][n_kv][T]. */
void kvzap_score(struct kvzap_scorer *z, const float *xs, uint32_t T,
                 float *out);
void kvzap_close(struct kvzap_scorer *z);
/* Scores [cal][L][n_kv][T] of the calibration sequences (dense forward).
 * kvzap_tau / kvzap_sweep_grid: T == P is protocol 1 (scores of the
 * context, one decision after its prefill), T > P a decode protocol (a
 * decision at every sync); positions < sinks are kept in both. */
float *kvzap_scores(const struct model *M, const char *dir,
                    const struct dataset *cal, char *err, size_t errlen);
float kvzap_tau(const struct model *M, const float *s, uint32_t ncal,
                uint32_t T, uint32_t P, uint32_t w, uint32_t sinks, double R);
uint32_t kvzap_sweep_grid(const struct model *M, const char *name,
                          const float *s, uint32_t ncal, uint32_t T,
                          uint32_t P, uint32_t w, uint32_t sinks,
                          uint32_t npts, double step, float *out);
/* The scorers' names: their weights' folders and their jobs' names,
 * [0] linear, [1] MLP. */
extern const char *const kvzap_names[2];
/* The job of scorer v (scores s of ncal calibration sequences, window
 * RECIPE_KVZAP_WINDOW) at the threshold that achieves R, or the jobs of
 * its sweep of npts thresholds (kvzap_sweep_grid; no target, j->sweep set).
 * sinks < 0: no sinks in the spec and none in the calibration (the
 * policy's default, 0). */
void kvzap_add_target(struct job *jobs, uint32_t *n, const struct model *M,
                      const char *wabs, int v, const float *s, uint32_t ncal,
                      uint32_t T, uint32_t P, int sinks, double R);
void kvzap_add_sweep(struct job *jobs, uint32_t *n, const struct model *M,
                     const char *wabs, int v, const float *s, uint32_t ncal,
                     uint32_t T, uint32_t P, int sinks, uint32_t npts);

/* fkvgate.c */
/* Fast KVzip's gate (the fastkvzip.safetensors at path, the daemon's
 * kernel) for sequences of up to T rows per call; reason in err. */
struct fkv_gate;
int fkv_gate_open(const struct model *M, const char *path, uint32_t T,
                  struct fkv_gate **out, char *err, size_t errlen);
/* Scores of the attention inputs xs [L][T][d_model]: out [L][n_kv][T]. */
void fkv_gate_score(struct fkv_gate *f, const float *xs, uint32_t T,
                    float *out);
void fkv_gate_close(struct fkv_gate *f);

/* run.c */
/* One prediction against the reference's: KL(ref || lg) in nats, whether
 * the argmaxes agree, and the NLL increase of the true token y. */
void run_compare(const float *rf, const float *lg, uint32_t V, int32_t y,
                 double *kl, int *top1, double *dnll);
/* KVzip's selection at ratio R over scores [nl][P] (one top-k over every
 * list, positions < KVZIP_SINKS protected): drop [nl][P]. KVT_ENOMEM. */
int run_kvzip_drop(const float *scores, uint32_t nl, uint32_t P, double R,
                   uint8_t *drop);
/* The hindsight oracle's eviction after a sync of n = replay_pos(r)
 * tokens: per (layer, KV head) the n - floor(R n) live entries with the
 * best score, the max over the group's query heads h of
 * s[l * sl + h * sh + i] (entry i; s NULL: every score 0; ties as
 * select_topk_cpu), are kept, the others die.  KVT_ENOMEM. */
struct replay;
int run_oracle_evict(const struct model *M, struct replay *r, double R,
                     const float *s, size_t sl, size_t sh);
/* What the worker threads share: they take jobs in order under lock. */
struct run_pool {
	const struct model *M;
	const struct ecase *cases;
	uint32_t ncases;
	struct job *jobs;
	uint32_t njobs;
	pthread_mutex_t lock;
	uint32_t next; /* the next job to take */
};
/* A worker thread (arg: the struct run_pool): runs jobs until none is
 * left. */
void *run_worker(void *arg);

/* table.c */
#define TABLE_CSV_HEADER "model,policy,target_ratio,achieved_ratio,kl," \
	                 "top1,dnll,copy_acc,needle_acc,threshold"
int table_parse_row(const char *line, struct row *r);
/* The rows of path (quality.csv) of models other than model, at most
 * max, into rows; 0 when there is no file. */
size_t table_read_others(const char *path, const char *model, struct row *rows,
                         size_t max);
void table_write_row(FILE *f, const struct row *r);
/* Writes rows to path (TABLE_CSV_HEADER first); dies when it cannot. */
void table_write_csv(const char *path, const struct row *rows, size_t nr);
/* Prints model's rows on stdout (csv, no header). */
void table_print_model(const struct row *rows, size_t nr, const char *model);
/* The rows of path of models other than model (table_read_others), then
 * model's, one per job (protocols 1 and 2: no copy or needle; NaN where
 * the job failed or measured nothing), *nout in all, calloc'd; *bad: a job
 * failed.  Dies out of memory. */
struct row *table_job_rows(const char *path, const char *model,
                           const struct job *jobs, uint32_t njobs,
                           size_t *nout, int *bad);
/* One line of a specs file: the job's name, its target ratio or "sweep",
 * its spec, then its copy and needle specs where it has them; every
 * occurrence of wabs (the weights directory as the daemon needs it,
 * absolute) printed as wdir (as given), so the committed files read the
 * same on every machine. */
void table_write_spec(FILE *f, const struct job *j, const char *wabs,
                      const char *wdir);
/* A specs file: "# what", then a line per job; dies when it cannot. */
void table_write_specs(const char *path, const char *what,
                       const struct job *jobs, uint32_t njobs,
                       const char *wabs, const char *wdir);
/* DIR/quality.md opened for writing (dies when it cannot be). */
FILE *table_open_md(const char *dir);
void table_write_md(const char *dir, struct row *rows, size_t nr);
/* merge: a policy's sweep rows join its curve (protocol 1) instead of
 * being dashed curves of their own. */
void table_write_png(const char *dir, struct row *rows, size_t nr,
                     int merge);
/* The md order of the policies (others follow in order of appearance). */
extern const char *const table_policy_order[];
extern const size_t table_npolicy;
/* names[nn] (with repeats) as the md lists them: those of
 * table_policy_order first, in its order, then the others in order of
 * appearance, each once, at most max, into out; their count. */
size_t table_order(const char *const *names, size_t nn, const char **out,
                   size_t max);
/* The achieved ratios the md tables are read at (curve_at), and the
 * header cells of those columns from table_at[q0] on, with the separator
 * line after them. */
#define TABLE_NAT 3
extern const double table_at[TABLE_NAT];
void table_md_at_header(FILE *f, size_t q0);

/* ctxtable.c */
/* Protocol 1's quality.md of model's rows; what (a line) says how the run
 * was made (windows, lengths, time). */
void ctxtable_write_md(const char *dir, const struct row *rows, size_t nr,
                       const char *model, const char *what);
/* 1 for the policies that bound the others (full, random, kvzip, oracle). */
int ctxtable_is_bound(const char *policy);
/* Its two tables (at equal achieved compression; every run, read from
 * the file named csv) into f. */
void ctxtable_write_tables(FILE *f, const struct row *rows, size_t nr,
                           const char *model, const char *csv);

/* curve.c */
/* The curve through the points (x[i], y[i]) at x0: linear between the
 * nearest points on either side (points at the same x: their mean), y[i]
 * NaN ignored; NaN outside [min x, max x]. */
double curve_at(const double *x, const double *y, size_t n, double x0);

/* ctxmain.c */
/* What main.c hands protocol 1. */
struct ctx_args {
	const char *argv0, *model_path, *mname, *out;
	const char *wdir, *wabs; /* weights as given / absolute ("" none) */
	const char *rt;          /* --runtime-dir or NULL */
	int quick, threads;
	int notasks;             /* --no-tasks: protocol 1's windows only */
	int tasksonly;           /* --tasks-only: the needle and copy tasks
	                          * only; quality.* are left as they are */
	uint32_t nseq;           /* --seqs, 0 = default */
	const char *dump;        /* --dump-kept DIR or NULL */
	const char *only;        /* --only a,b,...: protocol 1 runs only the
	                          * jobs of those names (NULL: all) */
	int calibrate;           /* --calibrate: kvzap's thresholds only,
	                          * into OUT/calibration.txt */
};
int ctx_main(const struct model *M, const struct ctx_args *a);
/* Both protocols' windows and targets: the evaluation split's windows of
 * T tokens (a->nseq of them, else def; fewer where the split holds fewer,
 * said on stderr) into ev, the target ratios (--quick: 0.75, else 0.5,
 * 0.75, 0.875) in *ratios, their count returned.  Dies on failure. */
struct tok;
uint32_t ctx_windows(const struct model *M, const struct tok *tk,
                     const struct ctx_args *a, uint32_t T, uint32_t def,
                     struct dataset *ev, const double **ratios);
/* The results of protocols 1 and 2, in this order: OUT/specs-MODEL<tag>.txt
 * (table_write_specs), OUT/<csv> (table_job_rows, then table_write_csv),
 * the protocol's md and png (md(OUT, rows, nr, MODEL, what), png(OUT,
 * rows, nr, MODEL)) and the model's rows on stdout.  Returns bad as
 * table_job_rows says (a job failed).  Dies on failure. */
typedef void (*ctx_md_fn)(const char *dir, const struct row *rows, size_t nr,
                          const char *model, const char *what);
typedef void (*ctx_png_fn)(const char *dir, struct row *rows, size_t nr,
                           const char *model);
int ctx_write_results(const struct ctx_args *a, const struct job *jobs,
                      uint32_t njobs, const char *what, const char *tag,
                      const char *csv, ctx_md_fn md, ctx_png_fn png);
/* kvzap's calibration: ncal windows of P tokens of the training split
 * (train-man.txt) through the full-cache forward; the scores [ncal][L]
 * [n_kv][P] of the scorers a->wabs/kvzap-linear and a->wabs/kvzap-mlp in
 * zs[0], zs[1] (NULL where one is missing, reason on stderr; both where
 * there are no weights: said on stderr), *nout windows.  gs, when not
 * NULL, receives Fast KVzip's gate scores of the same windows likewise
 * (a->wabs/fastkvzip.safetensors; NULL where it is missing). */
void ctx_calibrate(const struct model *M, const struct tok *t,
                   const struct ctx_args *a, uint32_t P, uint32_t ncal,
                   float *zs[2], float **gs, uint32_t *nout);

/* ctxdump.c */
/* --dump-kept: protocol 1's windows ev (P context + T - P tokens each),
 * run by the parity's policies, written to a->dump (docs/eval.md
 * has the files); frees ev and tk.  Dies on failure. */
struct tok;
int ctxdump_main(const struct model *M, const struct ctx_args *a,
                 struct tok *tk, struct dataset *ev, const int32_t *sep, uint32_t nsep,
                 uint32_t P, uint32_t T);

#endif
