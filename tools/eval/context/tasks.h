/*
 * tasks.h — the tasks of protocol 1 of kvtrim-eval (context
 * compression, context.c) for models with a chat template (SmolLM2): the
 * pass-key needle and the copy task, built from the held-out evaluation
 * text, answered greedily after each policy compressed the prompt once
 * (docs/eval.md states the protocol and its choices).
 *
 * The pieces, each usable (and tested) on its own:
 *   task_case_build  one case: the chat prompt in token ids, and what a
 *                       right answer is (the key, or the line's tokens);
 *   task_ref_build   its full-cache reference: the prompt prefilled in
 *                       one pass (the last prompt token as a second step,
 *                       for its logits), the full cache's answer, and,
 *                       for the policies, what context.h's window holds (the
 *                       staged x / q / lse, KVzip's and the hindsight
 *                       oracle's scores);
 *   task_load        a job's kept entries of a window into a cache
 *                       (through kvtrimd or from in-process keep flags);
 *   task_decode      greedy decoding on a cache, positions continuing
 *                       at the prompt's, no further compression;
 *   task_wilson      the Wilson 95 % interval of k successes in n.
 * Errors are negative KVT_E* codes with a reason where an err is taken.
 */
#ifndef KVT_EVAL_TASKS_H
#define KVT_EVAL_TASKS_H

#include <stddef.h>
#include <stdint.h>

#include "context.h"
#include "../common/eval.h"

struct tok;

enum task_kind { TASK_NEEDLE = 0, TASK_COPY = 1 };

#define TASK_KEY_DIGITS 5u
#define TASK_ANS_MAX 24u   /* answer tokens decoded at most */
/* The tasks run the targets from table_at[TASK_AT0] (0.75, 0.875: the
 * protocol's goals) and their tables start at that column: a job costs
 * about a case's prefill in greedy steps, and at 0.5 the 48-case needle
 * did not fit `make eval`'s time (docs/eval.md, trial counts). */
#define TASK_AT0 1u
#define TASK_LINE_MAX 96u  /* copy: bytes of the held-out line, at most */

/* One case: the prompt (the model's chat template around one user
 * message) and what a right answer is. */
struct task_case {
	enum task_kind kind;
	int32_t *tok;     /* [P + nans]: the prompt, then (copy) the line's
	                     tokens, the answer expected */
	uint32_t P;       /* prompt tokens */
	uint32_t nans;    /* copy: tokens of the expected answer; needle 0 */
	char key[TASK_KEY_DIGITS + 1];  /* needle: the digits */
	uint32_t key_tok; /* needle: prompt index of the key's first digit
	                     (its first occurrence) */
	char line[TASK_LINE_MAX + 1];   /* copy: the line */
	double depth;     /* needle: as asked (fraction of the filler) */
};

/*
 * Case `seed` of kind at len prompt tokens (the filler's length corrected
 * until the prompt has exactly len; a few off where that fails) from
 * text[n] (the evaluation split):
 *   needle: a 5-digit key (seeded, first digit non-zero) in the sentence
 *           "The pass key is K. Remember it. K is the pass key." on a line
 *           of its own, placed at the first line start at or after the
 *           filler token floor(depth x F) of the F filler tokens; the
 *           filler is consecutive text from a seeded line start; before
 *           it an instruction, after it the question;
 *   copy:   a seeded held-out line (40..TASK_LINE_MAX bytes, bullet
 *           stripped, not found in the filler) first, then the filler,
 *           then the request to repeat it; the expected answer is the
 *           line's own tokens.
 * One user message, the template's default system message, the
 * generation prompt (tok_chat).  KVT_EINVAL (with a reason) when the text
 * is too short for len or holds no usable line; KVT_ENOMEM.
 */
int task_case_build(const struct tok *t, const char *text, size_t n,
                       enum task_kind kind, uint32_t len, double depth,
                       uint64_t seed, struct task_case *c, char *err,
                       size_t errlen);
void task_case_free(struct task_case *c);

/* When greedy decoding stops: at eot (< 0: never), after TASK_ANS_MAX
 * or max tokens, and, when digit is given, at the first token that is not
 * a digit after one that was (the key's digits are single tokens). */
struct task_stop {
	int32_t eot;
	const uint8_t *digit; /* [vocab] 1: the token is one ASCII digit */
	uint32_t max;
};

/*
 * Greedy decoding on cache c (loaded with a prompt's kept entries): the
 * first token is the argmax of first [vocab] (the prefill's last logits),
 * then each token is stepped at positions pos0, pos0 + 1, ... (entries
 * appended, none evicted) until the stop rule: out[TASK_ANS_MAX], the
 * length in *nout.
 */
int task_decode(const struct model *m, struct ctx_cache *c,
                   const float *first, uint32_t pos0,
                   const struct task_stop *st, int32_t *out,
                   uint32_t *nout);

/* The full-cache reference of a case. */
struct task_ref {
	struct ctx_window w; /* tok = prompt then the reference answer, P,
	                        T = P + nans; x/q/lse/kvzip/hind when built
	                        for the policies, else only w.full */
	int32_t *tok;        /* [P + TASK_ANS_MAX] what w.tok points at */
	float *first;        /* [vocab] logits of the prompt's last token */
	uint32_t nans;       /* the full cache's greedy answer (needle) or
	                        the expected one (copy) */
	int ok;              /* the full cache answers right */
	double top1;         /* copy: per-token top-1 of the full cache */
};

/*
 * Builds r for case c: the prompt's prefill (tokens [0, P-1) in one step,
 * the last as a second: the cache and hidden states are those of one
 * pass), the answer (needle: greedy on the full cache; copy: the expected
 * line teacher-forced), scored.  With policies: the staged records, the
 * KVzip scores (sep then the prompt again, sep[n_sep]) and the hindsight
 * scores of the answer's queries (context.h's window).  KVT_ENOMEM,
 * KVT_ETOOLONG.
 */
int task_ref_build(const struct model *m, const struct tok *t,
                      const struct task_case *c,
                      const struct task_stop *st, const int32_t *sep,
                      uint32_t n_sep, int policies, struct task_ref *r);
void task_ref_free(struct task_ref *r);

/*
 * A job's answer to the needle case c on cache cc (loaded with its kept
 * entries), as greedy decoding gives it, from the reference's r: that
 * answer teacher-forced in one step, kept as far as every argmax follows
 * it (greedy decoding would have produced exactly those tokens), then
 * decoded on from the first token that differs (the entries after it
 * cut off), stopping as soon as the answer is wrong whatever follows
 * (the digits so far are not the key's start).  out[TASK_ANS_MAX],
 * length in *nout; the score of that answer is the greedy answer's.
 */
int task_needle_answer(const struct model *m, const struct tok *t,
                          struct ctx_cache *cc, const struct task_case *c,
                          const struct task_ref *r,
                          const struct task_stop *st, int32_t *out,
                          uint32_t *nout);

/*
 * Scores an answer ans[n] of case c: needle: its first run of digits (as
 * decoded by t) is exactly the key; copy: its first c->nans tokens are
 * the line's (the rest ignored).  A needle answer scores 0 without a
 * tokenizer (t NULL: models without one, in tests of the decoding).  *top1 (copy, may be NULL): the fraction
 * of the line's tokens matched position by position.
 */
int task_score(const struct tok *t, const struct task_case *c,
                  const int32_t *ans, uint32_t n, double *top1);

/*
 * Job j's kept entries of window w into c (emptied first): through
 * kvtrimd (tenant name, runtime directory rt) for J_DAEMON, else from
 * the in-process keep flags (keep: [L][n_kv][P] scratch).  Reason in err.
 */
int task_load(const struct model *m, const struct job *j,
                 const char *tenant, const struct ctx_window *w,
                 const char *rt, struct ctx_cache *c, uint8_t *keep,
                 char *err, size_t errlen);

/* Wilson score interval (95 %, z = 1.96) of k successes in n trials;
 * [0, 1] when n is 0. */
void task_wilson(uint64_t k, uint64_t n, double *lo, double *hi);

/* ------------------------------------------------------------ the run */

/* The jobs of protocol 1 for prompts of P tokens (context.c: the ratio
 * policies, kvzap at its calibrated and swept thresholds, fastkvzip,
 * kvpop with the token budget of P, kvzip, oracle); returns their
 * number. */
typedef uint32_t (*task_jobs_fn)(void *arg, uint32_t P, struct job *jobs);

struct task_args {
	const struct model *M;
	const struct eval_opts *a;
	const struct tok *tk;
	const int32_t *sep;
	uint32_t nsep;
	const char *rt;          /* kvtrimd's runtime directory */
	task_jobs_fn jobs;
	void *jobs_arg;
};

/* What a task's run measured (tasks.c), for its tables (task_tables.c). */
#define TASK_NLEN 4    /* lengths tried by the full cache */
#define TASK_NDEPTH 3  /* needle depths (the copy has one) */
#define TASK_NRUN 2    /* lengths the policies run at, at most */

/* Counts of one (length, depth) cell. */
struct task_cell {
	uint64_t ok, n;
	double top1;   /* copy: sum of the per-token top-1 */
	double tokens; /* sum of the prompts' lengths */
};

/* One job's results at one length. */
struct task_jres {
	struct task_cell c[TASK_NDEPTH];
	double ach;    /* sum over cases of the achieved ratio */
	uint64_t nach;
	int failed;
	char err[600];
};

struct task_result {
	enum task_kind kind;
	const char *name;              /* "needle", "copy" */
	const char *model;
	int quick;
	uint32_t nlen, ndepth;
	const uint32_t *len;           /* [nlen] */
	const double *depth;           /* [ndepth] (copy: NULL) */
	double bar;                    /* full-cache accuracy a cell needs */
	uint32_t scan_trials, run_trials, run_min_len, run_max_len;
	struct task_cell scan[TASK_NLEN][TASK_NDEPTH];
	double scan_s, run_s;          /* seconds */
	uint32_t nrun;
	struct {
		uint32_t li;                   /* index into len */
		uint8_t on[TASK_NDEPTH];    /* depths run */
		struct job *jobs;
		uint32_t njobs;
		struct task_jres *res;      /* [njobs] */
		struct task_cell ref[TASK_NDEPTH]; /* the reference's */
	} run[TASK_NRUN];
};

/* task_tables.c: DIR/<name>.csv and DIR/<name>.md of a task's result;
 * what: how the run was made (a line). */
void task_tables_write(const char *dir, const struct task_result *r,
                      const char *what);

/* task_tables.c, for --only: appends to run ri (its jobs and results:
 * jobs [MAX_JOBS], res reallocated to MAX_JOBS) the rows of DIR/<name>.csv
 * at the run's length of the policies not in only (the comma-separated
 * names rerun), then orders the run's jobs as all[nall] (the jobs a whole
 * run would run, in its order; the others after, stable), so the csv is
 * a whole run's row for row.  No csv: nothing kept, 0.  KVT_EINVAL (reason in err) when a
 * kept row's trials differ from this run's cases at its depth or a kept
 * policy lacks a depth this run ran: a table mixes no case sets.
 * KVT_ENOMEM. */
int task_tables_keep(const char *dir, struct task_result *R, uint32_t ri,
                     const char *only, const struct job *all,
                     uint32_t nall, char *err, size_t errlen);

/* Both tasks: the full cache at every length first, then the policies
 * where it reaches the bar; DIR/needle.{csv,md} and DIR/copy.{csv,md}.
 * Returns 1 when a job failed, else 0 (dies on what the run cannot go
 * on without). */
int task_main(const struct task_args *ta);

#endif
