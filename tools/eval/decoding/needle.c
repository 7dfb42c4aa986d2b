/*
 * needle.c — the decoding-time pass-key task of protocol 2 (decoding.h,
 * needle_main): protocol 1's needle prompt (context/task_case.c) with its
 * key in the prefilled part, the rest of the prompt and the full cache's
 * answer teacher-forced one decode step each with the policy active
 * (lockstep.c's run, answer scoring on), accuracy per policy at 0.75 and
 * 0.875 with Wilson intervals into DIR/needle-decoding.{md,csv}.  Why
 * teacher-forced scoring is greedy exact match, the counts and the
 * costs: docs/eval.md, "The decoding-time needle".
 */
#include "decoding.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "../context/tasks.h"
#include "now.h"
#include "tokenizer.h"

void openblas_set_num_threads(int n);

/* The case: P prefilled tokens, then len - P decode steps (held-out
 * text, then the question and the generation prompt: 22 tokens),
 * then the answer.  D = 512 text tokens: the cost of a case is about
 * linear in len - P (docs/eval.md has the measured cost), and 512 steps
 * already evict the prompt's entries many times over at 0.875 (the key
 * must survive 534 syncs at a fixed budget whose mean achieved ratio is
 * 7/8: 59 entries a list for SmolLM2). */
#define ND_P 256u
#define ND_LEN (ND_P + 512u + 22u)
#define ND_CASES 16u          /* counted cases wanted: a policy right on
                                 12 of 16 ([0.51, 0.90]) separates from
                                 one right on none ([0, 0.19]); about 45
                                 minutes on 2 cores (docs/eval.md) */
#define ND_QUICK_P 128u
#define ND_QUICK_LEN (ND_QUICK_P + 48u)
#define ND_QUICK_CASES 2u
#define ND_CHUNK 8u           /* cases per lockstep run: the references'
                                 logits are [cases][steps][vocab], 0.85
                                 GB at 8 */
#define ND_SEED 0x6465636f64653131ull /* "decode11" */

static const double nd_targets[2] = {0.75, 0.875};

/* ------------------------------------------------------------ cases */

int needle_case_build(const struct tok *t, const char *text, size_t n,
                      uint32_t P, uint32_t len, uint64_t seed,
                      struct task_case *c, char *err, size_t errlen)
{
	/* the key a quarter into the prefill's filler: the frame before it
	 * (system message, instruction) is about 60 tokens */
	const double depth = (double)P / 4 / len;
	for (int k = 0; k < 16; k++) {
		uint64_t s = seed ^ ((uint64_t)k << 48);
		(void)dataset_rng(&s);
		int rc = task_case_build(t, text, n, TASK_NEEDLE, len, depth, s,
		                         c, err, errlen);
		if (rc)
			return rc;
		char *pre = NULL, want[128];
		size_t pl;
		if (tok_decode(t, c->tok, c->P < P ? c->P : P, &pre, &pl, err,
		               errlen)) {
			task_case_free(c);
			return KVT_EINVAL;
		}
		snprintf(want, sizeof(want), "The pass key is %s. Remember it. "
		         "%s is the pass key.", c->key, c->key);
		int whole = c->P == len && strstr(pre, want) != NULL;
		free(pre);
		if (whole)
			return 0;
		task_case_free(c);
	}
	snprintf(err, errlen, "no case of %u tokens has its key sentence "
	         "within the first %u", len, P);
	return KVT_EINVAL;
}

int needle_counts(const struct tok *t, const struct task_case *c,
                  const int32_t *ans, uint32_t na)
{
	return task_score(t, c, ans, na, NULL);
}

/* Tokens at the end of case c from the question on ("\n\nWhat is the
 * pass key?" through the generation prompt): for the report's D. */
static uint32_t question_tokens(const struct tok *t, const struct task_case *c)
{
	for (uint32_t q = 1; q < 64 && q < c->P; q++) {
		char *s = NULL, err[256];
		size_t sl;
		if (tok_decode(t, c->tok + c->P - q, q, &s, &sl, err,
		               sizeof(err)))
			return 0;
		int in = strstr(s, "What is the pass key?") != NULL;
		free(s);
		if (in)
			return q;
	}
	return 0;
}

/* ------------------------------------------------------------ tables */

struct nd_res {
	const struct model *M;
	const struct eval_opts *a;
	struct job *jobs;
	uint32_t njobs;
	uint64_t *ok;        /* [njobs] right on counted cases */
	uint32_t built, counted, P, len, Q, steps;
	double secs;
};

/* One row of the tables: a job of this run, or (--only) a row of the
 * previous run's csv for a policy not rerun. */
struct nd_line {
	char name[64];
	double ratio, ach, kl;
	uint64_t ok;
	uint32_t cases;
	int failed;
	const char *err; /* this run's failure, or NULL */
};

/* The rows of the csv at path (nd_write's columns) for model mname, in
 * order, into l (at most max), their count; 0 when there is no file. */
static uint32_t nd_read(const char *path, const char *mname,
                        struct nd_line *l, uint32_t max)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char line[1024], model[64];
	uint32_t n = 0;
	while (n < max && fgets(line, sizeof(line), f)) {
		struct nd_line r = {0};
		unsigned long long ok;
		double acc, lo, hi, rel;
		if (sscanf(line, "%63[^,],%63[^,],%lf,%lf,%llu,%u,%lf,%lf,%lf,"
		           "%lf,%lf,%d", model, r.name, &r.ratio, &r.ach, &ok,
		           &r.cases, &acc, &lo, &hi, &rel, &r.kl,
		           &r.failed) != 12 || strcmp(model, mname))
			continue;
		r.ok = ok;
		l[n++] = r;
	}
	fclose(f);
	return n;
}

/* Where a row lists: by target (the full cache's 0 first), then in the
 * tables' order of the policies (eval_policy_order; others after). */
static int nd_before(const struct nd_line *a, const struct nd_line *b)
{
	if (a->ratio != b->ratio)
		return a->ratio < b->ratio;
	const char *const *pol;
	const size_t np = eval_policy_order(&pol);
	size_t ra = np, rb = np;
	for (size_t i = 0; i < np; i++) {
		ra = ra == np && !strcmp(pol[i], a->name) ? i : ra;
		rb = rb == np && !strcmp(pol[i], b->name) ? i : rb;
	}
	return ra < rb;
}

/* The tables' rows into l (at most max), their count: this run's jobs
 * and, with --only, the previous csv's rows of the policies not rerun,
 * in nd_before's order (stable), which is the jobs' own. */
static uint32_t nd_lines(const char *path, const struct nd_res *r,
                         struct nd_line *l, uint32_t max)
{
	static struct nd_line old[2 * MAX_JOBS];
	const uint32_t no = r->a->only ? nd_read(path, r->a->mname, old,
	                                         2 * MAX_JOBS)
	                               : 0;
	uint32_t n = 0;
	for (uint32_t i = 0; i < no && n < max; i++)
		if (!eval_in_list(r->a->only, old[i].name))
			l[n++] = old[i];
	for (uint32_t k = 0; k < r->njobs && n < max; k++) {
		const struct job *j = &r->jobs[k];
		l[n] = (struct nd_line){
			.ratio = j->ratio,
			.ach = j->nach ? j->ach / j->nach : NAN,
			.kl = j->npos ? j->kl / j->npos : NAN, .ok = r->ok[k],
			.cases = r->counted, .failed = j->failed,
			.err = j->failed ? j->err : NULL,
		};
		snprintf(l[n].name, sizeof(l[n].name), "%.31s", j->name);
		n++;
	}
	for (uint32_t i = 1; i < n; i++) { /* insertion: stable */
		const struct nd_line x = l[i];
		uint32_t k = i;
		for (; k > 0 && nd_before(&x, &l[k - 1]); k--)
			l[k] = l[k - 1];
		l[k] = x;
	}
	return n;
}

/* A row's accuracy, Wilson interval and accuracy relative to the full
 * cache's (full). */
static void nd_acc(const struct nd_line *x, double full, double *acc,
                   double *lo, double *hi, double *rel)
{
	*acc = x->cases ? (double)x->ok / x->cases : NAN;
	task_wilson(x->ok, x->cases, lo, hi);
	*rel = full > 0 ? *acc / full : NAN;
}

static void nd_write(const char *dir, const struct nd_res *r)
{
	char path[1200];
	static struct nd_line l[3 * MAX_JOBS];
	double full = NAN, acc, lo, hi, rel;
	snprintf(path, sizeof(path), "%s/needle-decoding.csv", dir);
	const uint32_t nl = nd_lines(path, r, l, 3 * MAX_JOBS);
	for (uint32_t k = 0; k < nl; k++) {
		if (l[k].cases != r->counted)
			eval_die("%s: %s's row counts %u cases, this run %u: "
			         "rerun every policy", path, l[k].name,
			         l[k].cases, r->counted);
		if (!strcmp(l[k].name, "full") && !l[k].failed && l[k].cases)
			full = (double)l[k].ok / l[k].cases;
	}
	FILE *f = fopen(path, "w");
	if (!f)
		eval_die("%s: %s", path, strerror(errno));
	fprintf(f, "model,policy,target_ratio,achieved_ratio,right,cases,"
	           "accuracy,wilson_lo,wilson_hi,relative,kl,failed\n");
	for (uint32_t k = 0; k < nl; k++) {
		nd_acc(&l[k], full, &acc, &lo, &hi, &rel);
		fprintf(f, "%s,%s,%.4g,%.4f,%llu,%u,%.4f,%.4f,%.4f,%.4f,%.6f,"
		        "%d\n", r->a->mname, l[k].name, l[k].ratio, l[k].ach,
		        (unsigned long long)l[k].ok, l[k].cases, acc, lo, hi,
		        rel, l[k].kl, l[k].failed);
	}
	fclose(f);
	snprintf(path, sizeof(path), "%s/needle-decoding.md", dir);
	if (!(f = fopen(path, "w")))
		eval_die("%s: %s", path, strerror(errno));
	fprintf(f,
	        "# %s: the pass key after decoding with the policy active\n\n"
	        "Generated by `kvtrim-eval --model %s --protocol 2` "
	        "(tools/eval/decoding/needle.c; `make eval`) from "
	        "needle-decoding.csv; do not edit by hand. Run: %u cases built, "
	        "%u counted%s, %.1f minutes with %d threads%s.\n\n"
	        "A case is protocol 1's needle prompt of %u tokens (held-out "
	        "text, the key sentence a quarter into it): its first %u "
	        "tokens (the key sentence among them) are prefilled with one "
	        "prefill sync, then the other %u (%u of held-out text, then %u "
	        "of the question \"What is the pass key? Answer with the "
	        "5-digit number only.\" and the generation prompt) and the full "
	        "cache's greedy answer are fed one decode step each, one sync "
	        "per step with the policy active (protocol 2's lockstep run, a "
	        "real kvtrimd). A case counts when the full cache's answer "
	        "(the whole prompt in one pass, greedy) has the key as its "
	        "first run of digits; a policy is right on it when its argmax "
	        "at every answer token's prediction is that token (the greedy "
	        "answer teacher-forced: equal to greedy exact match of the "
	        "full cache's answer). accuracy: right / counted cases, with "
	        "its Wilson 95 %% interval; relative: accuracy / the full "
	        "cache's (its run through kvtrimd, on the same cases). "
	        "achieved: mean over the decode syncs of 1 - kept / (tokens "
	        "seen x layers x KV heads), as protocol 2's. Every policy "
	        "that takes a budget runs at one fixed budget for a column, "
	        "the same for all (the task as issue 28 and KVpop's paper set "
	        "it: the memory known in advance): the largest number of "
	        "entries a list whose mean achieved ratio reaches the column's "
	        "(specs file), so a policy holds as much at the question as "
	        "at the first step after the prefill; kvzap runs at the "
	        "threshold calibrated for the column, so its cache grows with "
	        "the sequence (more at the question, less early). The "
	        "achieved ratio is printed beside each; kl: mean KL(full || "
	        "policy) over all the case's decode steps.\n\n",
	        r->a->mname, r->a->mname, r->built, r->counted,
	        r->a->quick ? " (quick)" : "", r->secs / 60, r->a->threads,
	        r->a->only ? " (--only: the other policies' rows are the "
	                     "previous run's)" : "",
	        r->len, r->P, r->len - r->P, r->len - r->P - r->Q, r->Q);
	for (int q = 0; q < 2; q++) {
		int any = 0;
		for (uint32_t k = 0; k < nl; k++)
			any |= fabs(l[k].ratio - nd_targets[q]) < 1e-9;
		if (!any)
			continue;
		fprintf(f, "## At %.3f\n\n| policy | achieved | accuracy | "
		           "Wilson 95 %% | right / cases | relative to full | "
		           "kl |\n|---|---|---|---|---|---|---|\n", nd_targets[q]);
		for (uint32_t k = 0; k < nl; k++) {
			const struct nd_line *x = &l[k];
			if (x->ratio && fabs(x->ratio - nd_targets[q]) > 1e-9)
				continue;
			nd_acc(x, full, &acc, &lo, &hi, &rel);
			if (x->failed) {
				fprintf(f, "| %s | failed: %s | | | | | |\n",
				        x->name, x->err ? x->err
				                        : "(the previous run)");
				continue;
			}
			fprintf(f, "| %s | %.3f | %.3f | [%.3f, %.3f] | %llu / "
			        "%u | %.3f | %.4f |\n", x->name, x->ach, acc, lo,
			        hi, (unsigned long long)x->ok, x->cases, rel,
			        x->kl);
		}
		fprintf(f, "\n");
	}
	fprintf(f, "Exact specs: specs-%s-needle-decoding.txt (protocol 2's "
	        "jobs, kvzap's thresholds and kvpop's budgets for this "
	        "task's lengths).\n", r->a->mname);
	fclose(f);

	snprintf(path, sizeof(path), "%s/specs-%s-needle-decoding.txt", dir,
	         r->a->mname);
	table_write_specs(path, "kvtrim-eval --protocol 2: the decoding-time "
	                  "needle's jobs", r->a->only, r->jobs, r->njobs,
	                  r->a->wabs, r->a->wdir);
}

/* ------------------------------------------------------------ the run */

int needle_main(const struct model *M, const struct eval_opts *a,
                const struct tok *tk, const char *rt)
{
	const uint64_t t0 = now_ms();
	const uint32_t V = M->cfg.vocab_size,
	               P = a->quick ? ND_QUICK_P : ND_P,
	               len = a->quick ? ND_QUICK_LEN : ND_LEN,
	               want = a->tasksonly && a->nseq ? a->nseq
	                      : a->quick ? ND_QUICK_CASES : ND_CASES;
	char err[1024], *text;
	size_t n;
	if (dataset_text(DATASET_EVAL, &text, &n, err, sizeof(err)))
		eval_die("%s", err);
	/* the stop rule of protocol 1's needle: the key's digits are single
	 * tokens */
	uint8_t *digit = calloc(V, 1);
	struct task_case *cs = calloc(want, sizeof(*cs));
	int32_t (*ans)[TASK_ANS_MAX] = calloc(want, sizeof(*ans));
	uint32_t *nans = calloc(want, sizeof(uint32_t));
	if (!digit || !cs || !ans || !nans)
		eval_die("out of memory");
	for (uint32_t i = 0; i < V && i < tok_vocab_size(tk); i++) {
		size_t bl;
		const char *b = tok_token_bytes(tk, (int32_t)i, &bl);
		digit[i] = b && bl == 1 && isdigit((unsigned char)b[0]);
	}
	const struct task_stop st = {tok_eot(tk), digit, TASK_ANS_MAX};

	/* ---- the cases the full cache answers right, and its answers
	 * (one pass of the whole prompt, greedy) */
	openblas_set_num_threads(a->threads);
	uint32_t built = 0, counted = 0, namax = 1;
	while (counted < want && built < want * 3) {
		struct task_case c;
		struct task_ref r;
		if (needle_case_build(tk, text, n, P, len, ND_SEED + built, &c,
		                      err, sizeof(err)))
			eval_die("decoding needle case: %s", err);
		built++;
		if (task_ref_build(M, tk, &c, &st, NULL, 0, 0, &r))
			eval_die("decoding needle: the full cache's answer failed");
		if (needle_counts(tk, &c, r.tok + c.P, r.nans)) {
			memcpy(ans[counted], r.tok + c.P,
			       sizeof(int32_t) * r.nans);
			nans[counted] = r.nans;
			namax = r.nans > namax ? r.nans : namax;
			cs[counted++] = c;
		} else {
			task_case_free(&c);
		}
		task_ref_free(&r);
	}
	openblas_set_num_threads(1);
	fprintf(stderr, "kvtrim-eval: %s decoding needle: %u of %u cases "
	        "counted (the full cache's answer is the key), %.0fs\n",
	        a->mname, counted, built, (double)(now_ms() - t0) / 1e3);
	if (!counted)
		eval_die("decoding needle: the full cache answers no case");

	/* ---- the jobs: protocol 2's at 0.75 and 0.875 (quick: 0.75), each
	 * policy with a budget at kvpop's fixed one for its target, kvzap
	 * calibrated at T */
	const uint32_t T = len + namax;
	float *zs[2] = {NULL, NULL};
	uint32_t ncal = 0;
	if (a->wabs[0])
		ctx_calibrate(M, tk, a, T, a->quick ? 1 : 4, zs,
		              NULL, &ncal);
	static struct job jobs[MAX_JOBS];
	uint32_t nj = decoding_jobs(M, a, zs, ncal, P, T, nd_targets,
	                            a->quick ? 1 : 2, 0, 1, 0, jobs);
	if (a->only) /* nd_write keeps the other policies' rows */
		nj = eval_only_jobs(jobs, nj, a->only);
	free(zs[0]);
	free(zs[1]);

	/* ---- the lockstep runs, ND_CHUNK cases each: the tokens are the
	 * prompt, the answer, then end-of-turn padding (not scored) */
	uint64_t *ok = calloc(nj, sizeof(uint64_t));
	int32_t *tok = malloc(sizeof(int32_t) * ND_CHUNK * T);
	uint8_t *right = malloc((size_t)nj * ND_CHUNK);
	if (!ok || !tok || !right)
		eval_die("out of memory");
	char label[96];
	snprintf(label, sizeof(label), "%s decoding needle", a->mname);
	/* groups small enough that every thread has work: the oracle's
	 * group waits for the references' (group 0) to end, and with
	 * protocol 2's 10 a group these few jobs would make two groups run
	 * one after the other */
	uint32_t nd = 0;
	for (uint32_t k = 0; k < nj; k++)
		nd += jobs[k].kind == J_DAEMON;
	uint32_t gj = (nd + 1 + 2 * a->threads - 1) / (2 * a->threads);
	gj = gj < 3 ? 3 : gj > DECODING_GROUP_JOBS ? DECODING_GROUP_JOBS : gj;
	for (uint32_t c0 = 0; c0 < counted; c0 += ND_CHUNK) {
		uint32_t nw = counted - c0 < ND_CHUNK ? counted - c0 : ND_CHUNK;
		for (uint32_t w = 0; w < nw; w++) {
			int32_t *tw = tok + (size_t)w * T;
			memcpy(tw, cs[c0 + w].tok, sizeof(int32_t) * len);
			memcpy(tw + len, ans[c0 + w],
			       sizeof(int32_t) * nans[c0 + w]);
			for (uint32_t i = len + nans[c0 + w]; i < T; i++)
				tw[i] = st.eot;
		}
		memset(right, 1, (size_t)nj * nw);
		struct decoding_set set = {
			.M = M, .tok = tok, .nwin = nw, .P = P, .T = T, .rt = rt,
			.threads = a->threads, .group_jobs = gj,
			.label = label, .ans0 = len,
			.nans = nans + c0, .right = right,
		};
		int rc = decoding_run(&set, jobs, nj);
		if (rc)
			eval_die("decoding needle: %s", kvt_strerror(rc));
		/* a failed job's rows stopped being scored: its flags
		 * mean nothing (its row says failed) */
		for (uint32_t k = 0; k < nj; k++)
			for (uint32_t w = 0; w < nw && !jobs[k].failed; w++)
				ok[k] += right[(size_t)k * nw + w];
		fprintf(stderr, "kvtrim-eval: %s decoding needle: %u of %u "
		        "cases run, %.0fs\n", a->mname, c0 + nw, counted,
		        (double)(now_ms() - t0) / 1e3);
	}

	struct nd_res res = {
		.M = M, .a = a, .jobs = jobs, .njobs = nj, .ok = ok,
		.built = built, .counted = counted, .P = P, .len = len,
		.Q = question_tokens(tk, &cs[0]), .steps = T - 1 - P,
		.secs = (double)(now_ms() - t0) / 1e3,
	};
	nd_write(a->out, &res);
	int bad = 0;
	for (uint32_t k = 0; k < nj; k++)
		bad |= jobs[k].failed;
	fprintf(stderr, "kvtrim-eval: %s decoding needle done in %.0fs "
	        "(%u cases, %u jobs)\n", a->mname, res.secs, counted, nj);
	for (uint32_t i = 0; i < counted; i++)
		task_case_free(&cs[i]);
	free(cs);
	free(ans);
	free(nans);
	free(ok);
	free(tok);
	free(right);
	free(digit);
	free(text);
	return bad;
}
