/*
 * bytes.h — kvtrim-eval's evaluation of the byte and token-id models
 * (llama2.c checkpoints: bytes2m, stories260K): the cases (held-out
 * sequences, copy and key-value needle cases, with their full-cache
 * references), the worker that runs a job's cases through kvtrimd or the
 * in-process replay, and the byte models' quality.md.  The protocol is in
 * docs/eval.md, "Byte and token-id models".
 */
#ifndef KVT_EVAL_BYTES_H
#define KVT_EVAL_BYTES_H

#include <stdint.h>

#include "../common/eval.h"

#define COPY_FILLER 200u
#define COPY_SKIP 8u
/* Key-value needles: depths in bytes between the end of the target
 * record and the start of its query; every case is NEEDLE_LEN bytes long
 * (BOS included); NEEDLE_DIGITS digits per value. */
#define NEEDLE_LEN 512u
#define NEEDLE_DIGITS 5u
#define NEEDLE_DISTRACTORS 3u
#define NEEDLE_BAR 0.5 /* full-cache per-digit accuracy a depth needs */
#define NEEDLE_SEED 0x6e6565646c652d31ull /* "needle-1" */

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

/* bytes.c: kvtrim-eval --model M for a byte or token-id model. */
int bytes_main(const struct model *M, const struct eval_opts *a);

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

/* run.c */
/* Every job of jobs[njobs] on every case of cases[ncases], `threads` jobs
 * at once (common/pool.h), its results added to the job; a line on
 * stderr when a job ends.  A daemon job runs on its engines (j->e[]). */
void run_jobs(const struct model *M, const struct ecase *cases,
              uint32_t ncases, struct job *jobs, uint32_t njobs,
              int threads);

/* quality_md.c */
/* DIR/quality.md of the byte models' rows (every model's, one table
 * each, with its needle paragraph and its kvzap sweep). */
void bytes_write_md(const char *dir, struct row *rows, size_t nr);

#endif
