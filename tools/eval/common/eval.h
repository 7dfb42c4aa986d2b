/*
 * eval.h — what the programs of kvtrim-eval (tools/eval/) share: the run's
 * options, the jobs (one policy at one budget) and the csv rows, and the
 * functions of common/.  Each program has its folder: bytes/ (the byte and
 * token-id models), context/ (protocol 1, context compression, with its
 * tasks and the kvpress parity's dump) and decoding/ (protocol 2,
 * decoding-time compression); main.c picks one.  docs/eval.md states the
 * protocols.  Every function here dies (eval_die) on what a run cannot go
 * on without, unless it says it returns an error.
 */
#ifndef KVT_EVAL_H
#define KVT_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtrim.h"

struct dataset;
struct engine;
struct model;
struct replay;

#define CHUNK 64u
#define KVZIP_SINKS 4u
#define MAX_JOBS 96
/* Byte models' key-value needles: the depths a job counts (bytes.h) */
#define NEEDLE_NDEPTH 4
/* kvzap threshold sweep: the grid spans the thresholds that reach these
 * ratios on the training split */
#define SWEEP_LO 0.30
#define SWEEP_HI 0.95
#define SWEEP_ROUND 0.25 /* swept thresholds are multiples of it */
/* Protocols 1 and 2: staging rows a tenant keeps beyond its context, for
 * the lookback of policies that read earlier rows (snapkv's window). */
#define CTX_LOOKBACK 64u
#define CTX_SYNC_TIMEOUT_MS 600000 /* one sync of a whole context: window.c */

/* The run's options, as main.c parsed them, for every program. */
struct eval_opts {
	const char *argv0, *model_path, *mname, *out;
	const char *wdir, *wabs; /* weights as given / absolute ("" none) */
	const char *rt;          /* --runtime-dir or NULL */
	int quick, threads;
	int protocol;            /* --protocol 1 or 2 (models with a tokenizer) */
	int notasks;             /* --no-tasks: protocol 1's (2's) windows
	                          * only */
	int tasksonly;           /* --tasks-only: the needle and copy tasks
	                          * only; quality.* are left as they are
	                          * (protocol 2: the decoding-time needle,
	                          * protocol2.* left) */
	uint32_t nseq;           /* --seqs, 0 = default (protocol 2 with
	                          * --tasks-only: the needle's cases) */
	const char *dump;        /* --dump-kept DIR or NULL */
	const char *only;        /* --only a,b,...: protocols 1's and 2's
	                          * windows run only the jobs of those names
	                          * (NULL: all); the model's rows of the
	                          * other policies already in the csv are
	                          * kept (the tasks run every policy) */
	int calibrate;           /* --calibrate: kvzap's thresholds only,
	                          * into OUT/calibration.txt */
};

/* What a byte model's case is scored by (also the engine a daemon job
 * runs it on); the other programs use C_MAIN only. */
enum ckind { C_MAIN = 0, C_COPY = 1, C_NEEDLE = 2, C_NKIND };

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

/* ---- daemon.c */
/* Prints "kvtrim-eval: " and the message, stops the daemon this run
 * started (eval_daemon_start), exits 1. */
void eval_die(const char *fmt, ...) __attribute__((format(printf, 1, 2),
                                                   noreturn));
/* Starts kvtrimd (beside this executable) on a fresh runtime directory,
 * written to rt; waits until its sockets exist. */
void eval_daemon_start(const char *argv0, char *rt, size_t rtlen);
/* The runtime directory of the run into rt: given (--runtime-dir) when
 * not NULL, else a kvtrimd's that eval_daemon_start starts. */
void eval_runtime_dir(const char *given, const char *argv0, char *rt,
                      size_t rtlen);
void eval_daemon_stop(void);
/* SIGINT / SIGTERM handler: the daemon must not outlive the run. */
void eval_on_signal(int sig);

/* ---- policies.c */
/* Appends a job to jobs[*n] (dies beyond MAX_JOBS); spec_copy and
 * spec_needle may be NULL. */
struct job *eval_add_job(struct job *jobs, uint32_t *n, const char *name,
                         double R, enum jkind kind, const char *spec,
                         const char *spec_copy, const char *spec_needle);
/* A job of target R per policy of the registry (policies/policy.c) that
 * program `in` (enum policy_eval_in) sweeps over budgets: its
 * policy_ops.eval.spec asked for the ratio Rs, or for a fixed budget of
 * `tokens` entries a list when tokens > 0, with the model's RoPE base for
 * a policy that takes one (theta). */
void eval_add_budget_jobs(struct job *jobs, uint32_t *n, const struct model *M,
                          unsigned in, double R, double Rs, uint32_t tokens);
/* The fastkvzip job of the weights in wabs at target R, asked for the
 * ratio Rs (or a fixed budget of tokens a list when tokens > 0),
 * deciding every `every` syncs. */
void eval_add_fastkvzip(struct job *jobs, uint32_t *n, const char *wabs,
                        double R, double Rs, uint32_t tokens, uint32_t every);
/* kvpop's spec with the weights in wabs and a budget of tokens a list on
 * average (delay RECIPE_KVPOP_DELAY, 4 sinks, and its defaults named:
 * window policy_kvpop_window(tokens), no memory, trust 0). */
void eval_kvpop_spec(char *s, size_t len, const char *wabs, uint32_t tokens);
/* 1 when name is one of the names of the comma-separated list (whole
 * names: "kvpop" is not in "kvpopx"). */
int eval_in_list(const char *list, const char *name);
/* Keeps the jobs whose name is in the comma-separated list (--only), in
 * order; returns how many (dies when none is). */
uint32_t eval_only_jobs(struct job *jobs, uint32_t n, const char *list);
/* 1 for the policies that bound the others (full, random, kvzip, oracle). */
int eval_is_bound(const char *policy);
/* The tables' order of the policies, from the registry: full and the
 * ratio policies, the learned ones (kvzap as kvzap_names), then kvzip and
 * oracle; *names, their count returned.  Others follow in order of
 * appearance (table_order). */
size_t eval_policy_order(const char *const **names);

/* ---- score.c */
/* One prediction against the reference's: KL(ref || lg) in nats, whether
 * the argmaxes agree, and the NLL increase of the true token y. */
void score_compare(const float *rf, const float *lg, uint32_t V, int32_t y,
                   double *kl, int *top1, double *dnll);
/* KVzip's selection at ratio R over scores [nl][P] (one top-k over every
 * list, positions < KVZIP_SINKS protected): drop [nl][P]. KVT_ENOMEM. */
int score_kvzip_drop(const float *scores, uint32_t nl, uint32_t P, double R,
                     uint8_t *drop);
/* The hindsight oracle's eviction after a sync of n = replay_pos(r)
 * tokens: per (layer, KV head) the n - floor(R n) live entries (tokens >
 * 0: min(tokens, n), R unread) with the
 * best score, the max over the group's query heads h of
 * s[l * sl + h * sh + i] (entry i; s NULL: every score 0; ties as
 * select_topk_cpu), are kept, the others die.  KVT_ENOMEM. */
int score_oracle_evict(const struct model *M, struct replay *r, double R,
                       uint32_t tokens, const float *s, size_t sl,
                       size_t sh);

/* ---- kvzap.c */
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
/* Scores y [n][nkv] of rows i0 .. i0 + n of one layer into out
 * [L][nkv][T] (the scorers' kernels write token-major, the calibration
 * reads head-major). */
void eval_put_scores(float *out, const float *y, uint32_t layer,
                     uint32_t nkv, uint32_t T, uint32_t i0, uint32_t n);

/* ---- table.c */
#define TABLE_CSV_HEADER "model,policy,target_ratio,achieved_ratio,kl," \
	                 "top1,dnll,copy_acc,needle_acc,threshold"
/* Splits a csv line (no quoting: the columns are numbers and names) in
 * place, its line end dropped, into at most max fields (the last holds
 * the rest); their count. */
int table_split_csv(char *line, char **f, int max);
/* Reads a row of TABLE_CSV_HEADER or of the earlier one (no threshold);
 * -1 when it is neither. */
int table_parse_row(const char *line, struct row *r);
/* The rows of path (quality.csv) of models other than model and, with
 * only (--only's list; NULL: none), model's rows of the policies not in
 * it, at most max, into rows; 0 when there is no file. */
size_t table_read_others(const char *path, const char *model,
                         const char *only, struct row *rows, size_t max);
void table_write_row(FILE *f, const struct row *r);
/* Writes rows to path (TABLE_CSV_HEADER first); dies when it cannot. */
void table_write_csv(const char *path, const struct row *rows, size_t nr);
/* Prints model's rows on stdout (csv, no header). */
void table_print_model(const struct row *rows, size_t nr, const char *model);
/* The rows of path of models other than model and of the policies not
 * in only (table_read_others), then model's, one per job (protocols 1
 * and 2: no copy or needle; NaN where the job failed or measured
 * nothing), *nout in all, calloc'd; *bad: a job failed.  Dies out of
 * memory. */
struct row *table_job_rows(const char *path, const char *model,
                           const char *only, const struct job *jobs,
                           uint32_t njobs, size_t *nout, int *bad);
/* One line of a specs file: the job's name, its target ratio or "sweep",
 * its spec, then its copy and needle specs where it has them; every
 * occurrence of wabs (the weights directory as the daemon needs it,
 * absolute) printed as wdir (as given), so the committed files read the
 * same on every machine. */
void table_write_spec(FILE *f, const struct job *j, const char *wabs,
                      const char *wdir);
/* A specs file: "# what", then (with only, --only's list) the lines of
 * the file already at path of the policies not in only, then a line per
 * job; dies when it cannot. */
void table_write_specs(const char *path, const char *what, const char *only,
                       const struct job *jobs, uint32_t njobs,
                       const char *wabs, const char *wdir);
/* DIR/quality.md opened for writing (dies when it cannot be). */
FILE *table_open_md(const char *dir);
/* merge: a policy's sweep rows join its curve (protocol 1) instead of
 * being dashed curves of their own. */
void table_write_png(const char *dir, struct row *rows, size_t nr,
                     int merge);
/* names[nn] (with repeats) as the md lists them: those of
 * eval_policy_order first, in its order, then the others in order of
 * appearance, each once, at most max, into out; their count. */
size_t table_order(const char *const *names, size_t nn, const char **out,
                   size_t max);
/* The achieved ratios the md tables are read at (curve_at), and the
 * header cells of those columns from table_at[q0] on, with the separator
 * line after them. */
#define TABLE_NAT 3
extern const double table_at[TABLE_NAT];
void table_md_at_header(FILE *f, size_t q0);

/* The results of protocols 1 and 2, in this order: OUT/specs-MODEL<tag>.txt
 * (table_write_specs), OUT/<csv> (table_job_rows, then table_write_csv),
 * the protocol's md and png (md(OUT, rows, nr, MODEL, what), png(OUT,
 * rows, nr, MODEL)) and the model's rows on stdout.  Returns bad as
 * table_job_rows says (a job failed). */
typedef void (*table_md_fn)(const char *dir, const struct row *rows,
                            size_t nr, const char *model, const char *what);
typedef void (*table_png_fn)(const char *dir, struct row *rows, size_t nr,
                             const char *model);
int table_write_results(const struct eval_opts *a, const struct job *jobs,
                        uint32_t njobs, const char *what, const char *tag,
                        const char *csv, table_md_fn md, table_png_fn png);
/* Shared with bytes/quality_md.c: a sweep row (no target); the models of
 * the rows (at most 8) in order of first appearance; model's sweep rows of
 * policy pol by threshold, indices into idx; the md header cells
 * " what v |" of the columns v[n] with the separator line after them. */
int table_is_sweep(const struct row *r);
int table_models(const struct row *rows, size_t nr, char models[8][64]);
size_t table_sweep_rows(const struct row *rows, size_t nr, const char *model,
                        const char *pol, size_t *idx);
void table_md_cols(FILE *f, const char *what, const double *v, size_t n);

/* ---- curve.c */
/* The curve through the points (x[i], y[i]) at x0: linear between the
 * nearest points on either side (points at the same x: their mean), y[i]
 * NaN ignored; NaN outside [min x, max x]. */
double curve_at(const double *x, const double *y, size_t n, double x0);
/* Protocols 1 and 2's two tables of model's rows into f: at equal
 * achieved compression (each policy's runs one curve, read at table_at),
 * then every run as measured (read from the file named csv). */
void curve_write_tables(FILE *f, const struct row *rows, size_t nr,
                        const char *model, const char *csv);

#endif
