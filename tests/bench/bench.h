/*
 * bench.h — what the parts of kvtrim-bench share: bench.c's clock,
 * percentile, small tenant and bench_die, bench_policy.c's policy figures,
 * hostile.c's hostile-client figures and smollm2.c's SmolLM2 figures.
 */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "kvtrim.h"

/* Monotonic clock in microseconds. */
double bench_now_us(void);

/* The p-quantile (0..1, nearest rank) of v[0..n); sorts v. */
double bench_pct(double *v, int n, double p);

/*
 * The small tenant of the sync lines: 4 layers, 8 query heads, 2 KV heads,
 * head_dim 64, d_model 512, f16, pages of 16 entries, max_tokens 512,
 * headroom 16, streaming:sinks=4,tokens=256, timeout 5 s; seqs sequences.
 * name and dir are kept by pointer.
 */
void bench_small_cfg(struct kvt_config *c, const char *dir, const char *name,
                     uint32_t seqs);

/*
 * Starts kvtrimd from bin_dir on runtime dir dir (--log-level warning) plus
 * args (NULL-terminated, e.g. {"--backend", "cpu", "--pool-size", "1G",
 * NULL}) and waits until its three sockets exist (10 s at most).  Its pid,
 * or -1 when it exited or never came up (then it is killed and reaped).
 */
pid_t bench_spawn_daemon(const char *bin_dir, const char *dir,
                         const char *const *args);

/* Prints "kvtrim-bench: what" to stderr and exits 1: the figures of
 * bench.c and bench_policy.c cannot be measured without what failed. */
void bench_die(const char *what);

/* n floats uniform in [-scale/2, scale/2) from a xorshift seeded by seed
 * (bench_policy.c). */
void bench_fill_rnd(float *v, size_t n, uint64_t seed, float scale);

/* Reads numeric keys of `kvtrimctl stats` (kvtrimctl from bin_dir, the
 * daemon of runtime dir dir) into vals; NAN for a key absent or when
 * kvtrimctl could not run. */
void bench_ctl_stats(const char *bin_dir, const char *dir,
                     const char *const *keys, double *vals, int n);

/* The policy figures (bench_policy.c; docs/bench.md, "Scorer kernels" and
 * "Daemon CPU per decoded token"). */
#define BENCH_N_POL 9
struct bench_policy {
	double sgemm_gflops, mlp_tps, mlp_gflops, lin_tps, fkv_tps, kvpop_tps;
	double band_us, band_sgemm_us; /* attn_band_cpu and its sgemm floor */
	const char *names[BENCH_N_POL];
	double us_per_token[BENCH_N_POL]; /* daemon CPU per decoded token */
	double sync_us[BENCH_N_POL];      /* the daemon's own sync time, likewise */
	double prefill_us[BENCH_N_POL];   /* daemon CPU per prompt token */
	int n;
};

/*
 * Measures the scorer kernels in process, then every policy through the
 * running kvtrimd `daemon` (its runtime dir: dir; kvtrimctl from bin_dir),
 * into b.  quick: a short prompt, small budgets, one round.
 */
void bench_policy_run(struct bench_policy *b, const char *bin_dir,
                      const char *dir, pid_t daemon, int quick);

/*
 * The hostile-client phases (docs/bench.md, "Hostile clients"): a fresh
 * kvtrimd from bin_dir per phase under tmp_dir, a healthy engine alone
 * and beside each adversary.  The adversaries run in child processes of
 * this binary (self: its path), started with --adversary.  Never exits the
 * process: what a phase could not measure is reported as nan.  quick: fewer
 * syncs and shorter phases.
 */
void hostile_run(const char *self, const char *bin_dir, const char *tmp_dir,
                 int quick);

/* Writes the "name value" lines of the last hostile_run to f. */
void hostile_print(FILE *f);

/*
 * Entry point of an adversary process: argv is
 * {prog, "--adversary", NAME, "--runtime-dir", DIR, ["--quick"]}; reports
 * "ready k=v ..." and later "stat k=v ..." lines on fd 3.  Runs until
 * killed; returns 2 on bad arguments.
 */
int hostile_adversary_main(int argc, char **argv);

/*
 * The SmolLM2-135M-Instruct lines (smollm2.c, docs/bench.md "SmolLM2"): a
 * fresh kvtrimd from bin_dir under tmp_dir/smollm2, the engine's prefill
 * beside its sgemm floor, batched decode steps at long contexts with the
 * full cache and with policies evicting 75%.  Skipped with the reason
 * (stderr, and a comment line in the output) when the model is not in the
 * cache.  Never exits the process: what it could not measure is nan.
 * quick: a prefill of 128 tokens and the 1k context only.
 */
void smollm2_run(const char *bin_dir, const char *tmp_dir, int quick);

/* Writes the "name value" lines of the last smollm2_run to f. */
void smollm2_print(FILE *f);
/* 1 when the last smollm2_run failed (not skipped): the reason is on
 * stderr and in a "# smollm2 failed:" line. */
int smollm2_failed(void);

/*
 * The host <-> device bytes per decoded token of every policy on the
 * emulated cuda daemon (traffic.c, docs/bench.md "Host-device traffic"): a
 * fresh kvtrimd --backend cuda on bin_dir/../lib/emu/libkvtrim-cuda.so
 * under tmp_dir/traffic.  Skipped with the reason (stderr, and a comment
 * line in the output) when that library is missing.  Never exits the
 * process: a policy it could not measure is nan.  quick: a shorter prompt
 * and fewer decode tokens.
 */
void traffic_run(const char *bin_dir, const char *tmp_dir, int quick);

/* Writes the "name value" lines of the last traffic_run to f. */
void traffic_print(FILE *f);

#endif
