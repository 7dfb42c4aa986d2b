/*
 * decoding.h — protocol 2 of kvtrim-eval, decoding-time compression (the
 * protocol and its choices: docs/eval.md): the lockstep run of a set of
 * jobs over a set of windows, which the tests drive on a tiny model
 * (decoding_run, its contract at its declaration), and the command itself
 * (`kvtrim-eval --model smollm2 --protocol 2`).
 */
#ifndef KVT_EVAL_DECODING_H
#define KVT_EVAL_DECODING_H

#include <stdint.h>
#include <stdio.h>

#include "../common/eval.h"

struct decoding_set {
	const struct model *M;
	const int32_t *tok;   /* [nwin][T] */
	uint32_t nwin, P, T;  /* P >= 1, T >= P + 2 */
	const char *rt;       /* kvtrimd's runtime directory */
	int threads;          /* groups run at once (>= 1) */
	/* grouping: jobs share a batched forward in groups of at most
	 * group_jobs (the references of a group count as one) whose daemon
	 * pages (estimated from their ratios) fit group_bytes; 0:
	 * DECODING_GROUP_JOBS, and 80 % of the eval daemon's pool shared by the
	 * threads */
	uint32_t group_jobs;
	uint64_t group_bytes;
	const char *label;    /* progress lines on stderr, or NULL: none */
	/* answer scoring, or ans0 0: none (the decoding-time needle,
	 * needle.c): window w's answer is tok[w T + ans0 .. + nans[w]);
	 * right [njobs][nwin], set to 1 by the caller, is cleared for job k
	 * and window w when the job's argmax at one of the answer's
	 * predictions (steps ans0 - 1 ..) is not the answer's token (a
	 * failed job's flags mean nothing: its rows stop being scored) */
	uint32_t ans0;
	const uint32_t *nans;  /* [nwin], ans0 + nans[w] <= T */
	uint8_t *right;        /* [njobs][nwin] */
};

#define DECODING_GROUP_JOBS 10u

/* Window w is tok[w T .. w T + T): its first P
 * tokens are prefilled (one step, one prefill sync per daemon sequence),
 * then tokens P .. T-2 are fed one decode step each, teacher-forced; the
 * step feeding token t predicts token t+1, so every window gives T-1-P
 * predictions.  Jobs are J_DAEMON (spec[C_MAIN] in a kvtrimd tenant on
 * runtime directory rt, one sequence per window, one sync per step with
 * the policy active) or J_ORACLE (the hindsight oracle in process,
 * keeping n - floor(r n) entries of n, r from "ratio=F" in spec[C_MAIN],
 * else job->ratio); J_KVZIP is refused (a prompt-only bound, not part of this
 * protocol).  Per job it adds, over every prediction of every window, KL
 * (reference || job) into kl, top-1 agreement into top1 and the NLL
 * increase of the true token into dnll (npos predictions), and after
 * every sync 1 - kept / (n L n_kv) into ach (nach syncs; n tokens seen,
 * kept every entry of every list).  The reference is the dense forward:
 * the same tokens through an in-process cache that keeps every entry.
 * A job that fails (registration, a sync, memory pressure applied by the
 * daemon) gets failed = 1 and a reason in err; the others go on.
 * Returns 0, KVT_EINVAL (bad set or a J_KVZIP job) or KVT_ENOMEM. */
int decoding_run(const struct decoding_set *s, struct job *jobs, uint32_t njobs);

/* The token budget N whose mean achieved ratio 1 - N / n over the syncs
 * of the decode steps (n = P+1 .. T-1 tokens seen) is R, at least 1:
 * kvpop's budget (a token count) for a target ratio. */
uint32_t decoding_budget(double R, uint32_t P, uint32_t T);

/* The same budget exactly (every entry kept while n <= N, so the mean of
 * max(0, 1 - N / n)): the largest N achieving at least R when up, else
 * the smallest achieving at most R (kvpop's budget under protocol 2). */
uint32_t decoding_tokens(double R, uint32_t P, uint32_t T, int up);

/* The mean over those syncs of 1 / n. */
double decoding_inv_seen(uint32_t P, uint32_t T);

/* Protocol 2's jobs into jobs[MAX_JOBS] for windows of P prefilled tokens
 * and decode steps to T, at the targets ratios[nrat] (ascending): full,
 * the registry's decoding policies, kvzap at the thresholds calibrated
 * for each target (zs, ncal: ctx_calibrate's at T; NULL: none) and
 * nsweep swept ones, fastkvzip and kvpop (with weights), the oracle.
 * Every target asks for R + mean(1/n) (at least R achieved) but the
 * lowest when lo_down (R: at most R); kvpop runs at the fixed budget
 * decoding_tokens gives for it, and so, when `fixed`, do the registry's
 * policies, fastkvzip and the oracle (kvzap's budget is its threshold).
 * Returns their number. */
uint32_t decoding_jobs(const struct model *M, const struct eval_opts *a,
                       float *const zs[2], uint32_t ncal, uint32_t P,
                       uint32_t T, const double *ratios, uint32_t nrat,
                       int lo_down, int fixed, uint32_t nsweep,
                       struct job *jobs);

/* decoding.c: kvtrim-eval --protocol 2 for a model with a tokenizer
 * (main.c): the windows (not with --tasks-only), then the decoding-time
 * needle (not with --no-tasks). */
int decoding_main(const struct model *M, const struct eval_opts *a);

/* ------------------------------------------------------------ needle.c */

/*
 * The decoding-time pass-key task (docs/eval.md, "The decoding-time
 * needle"): one case is task_case_build's needle prompt of len tokens
 * whose key sentence lies whole in its first P tokens; those P are
 * prefilled (one prefill sync), the rest (held-out text, the question,
 * the generation prompt) and the full cache's answer are fed one decode
 * step each with the policy active, and a job is right on the case when
 * its argmax at every answer token's prediction is that token.
 */
struct tok;
struct task_case;

/* Case `seed` at prefill P and length len into c (tasks.h's needle
 * case, the key at depth about P / 4 of the filler); re-seeded until the
 * key sentence is whole in tokens [0, P).  KVT_EINVAL with a reason when
 * no seed of 16 gives one (P too short for the frame and the sentence). */
int needle_case_build(const struct tok *t, const char *text, size_t n,
                      uint32_t P, uint32_t len, uint64_t seed,
                      struct task_case *c, char *err, size_t errlen);

/* The case counts: the reference's answer ans[na]'s first run of digits
 * is exactly the case's key (task_score). */
int needle_counts(const struct tok *t, const struct task_case *c,
                  const int32_t *ans, uint32_t na);

/* The task on the daemon at rt: its cases, the full cache's answers,
 * the jobs of protocol 2 at 0.75 and 0.875 in chunks of lockstep runs,
 * DIR/needle-decoding.{md,csv}.  1 when a job failed, else 0. */
int needle_main(const struct model *M, const struct eval_opts *a,
                const struct tok *tk, const char *rt);

#endif
