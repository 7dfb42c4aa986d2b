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

/* decoding.c: kvtrim-eval --protocol 2 for a model with a tokenizer
 * (main.c). */
int decoding_main(const struct model *M, const struct eval_opts *a);

#endif
