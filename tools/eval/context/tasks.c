/*
 * tasks.c — the pass-key needle and the copy task under protocol 1 of
 * kvtrim-eval (context compression, context.c), for models with a chat
 * template (SmolLM2); the pieces are declared in tasks.h.
 *
 * The tasks' protocol (cases, scoring, the full cache's scan then fresh
 * cases for the policies, trial counts, --quick) is in docs/eval.md,
 * "Protocol 1 tasks".  One reference per case serves every job: a worker
 * takes a whole case (reference, then all its jobs) with one BLAS thread,
 * so a case's figures do not depend on what ran beside it.
 */
#include "tasks.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "../common/pool.h"
#include "now.h"
#include "tokenizer.h"

#define TASK_SEED 0x7061737373657931ull /* "passkey1" */
#define TASK_BAR 0.7
#define NLEN TASK_NLEN
#define NDEPTH TASK_NDEPTH
#define SCAN_TRIALS 4u    /* full cache, per length and depth */
#define RUN_TRIALS 12u    /* policies, per depth run */
#define RUN_LENGTHS 1u    /* <= TASK_NRUN */
#define RUN_MIN_LEN 1024u
#define RUN_MAX_LEN 2048u

static const uint32_t task_len[2][NLEN] = {{512, 1024, 2048, 4096},
                                           {256, 512, 1024, 2048}};
static const double needle_depth[NDEPTH] = {0.1, 0.5, 0.9};
static const char *const task_name[2] = {"needle", "copy"};

/* ------------------------------------------------------------ decoding */

static int32_t argmax(const float *v, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return (int32_t)b;
}

/* Whether decoding stops after token tk (n tokens so far, *seen: a digit
 * came). */
static int stops(const struct task_stop *st, int32_t tk, uint32_t n,
                 int *seen)
{
	uint32_t max = st->max && st->max < TASK_ANS_MAX ? st->max
	                                                    : TASK_ANS_MAX;
	if (tk == st->eot || n >= max)
		return 1;
	if (st->digit) {
		if (st->digit[tk])
			*seen = 1;
		else if (*seen)
			return 1;
	}
	return 0;
}

/* Greedy decoding on from out[0, k) (the cache holding the entries of
 * out[0, k-1)) until the stop rule; with key, also as soon as the digits
 * so far cannot be its first run of digits (the answer is wrong whatever
 * follows).  The length in *n. */
static int greedy_from(const struct model *m, struct ctx_cache *c,
                       int32_t *out, uint32_t k, uint32_t pos0,
                       const struct task_stop *st, const struct tok *t,
                       const char *key, uint32_t *n)
{
	const uint32_t V = m->cfg.vocab_size;
	int seen = 0, rc = 0, doomed = 0;
	uint32_t run = 0; /* digits of the first run so far */
	for (uint32_t i = 0; i < k; i++) {
		int32_t tk = out[i];
		if (key && !doomed && st->digit && st->digit[tk]) {
			size_t bl;
			const char *b = tok_token_bytes(t, tk, &bl);
			doomed = run >= TASK_KEY_DIGITS || b[0] != key[run];
			run++;
		}
		if (stops(st, tk, i + 1, &seen) || doomed) {
			*n = i + 1;
			return 0;
		}
	}
	float *lg = malloc(sizeof(float) * V);
	if (!lg)
		return KVT_ENOMEM;
	for (;;) {
		rc = ctx_cache_step(c, &out[k - 1], 1, pos0 + k - 1, NULL, lg);
		if (rc)
			break;
		int32_t tk = out[k++] = argmax(lg, V);
		if (key && st->digit && st->digit[tk]) {
			size_t bl;
			const char *b = tok_token_bytes(t, tk, &bl);
			doomed = run >= TASK_KEY_DIGITS || b[0] != key[run];
			run++;
		}
		if (stops(st, tk, k, &seen) || doomed)
			break;
	}
	*n = k;
	free(lg);
	return rc;
}

int task_decode(const struct model *m, struct ctx_cache *c,
                   const float *first, uint32_t pos0,
                   const struct task_stop *st, int32_t *out,
                   uint32_t *nout)
{
	out[0] = argmax(first, m->cfg.vocab_size);
	return greedy_from(m, c, out, 1, pos0, st, NULL, NULL, nout);
}

/* tasks.h; one step instead of one per token when the answer is the
 * reference's. */
int task_needle_answer(const struct model *m, const struct tok *t,
                           struct ctx_cache *cc,
                           const struct task_case *c,
                           const struct task_ref *r,
                           const struct task_stop *st, int32_t *out,
                           uint32_t *nout)
{
	const struct model_config *mc = &m->cfg;
	const uint32_t V = mc->vocab_size, n = r->nans, P = c->P;
	const int32_t *A = r->tok + P;
	out[0] = A[0];
	uint32_t k = 1;
	if (n >= 2) {
		float *lg = malloc(sizeof(float) * (n - 1) * V);
		uint32_t *len0 = malloc(sizeof(uint32_t) * mc->n_layers *
		                        mc->n_kv_heads);
		int rc = lg && len0 ? 0 : KVT_ENOMEM;
		for (uint32_t l = 0; !rc && l < mc->n_layers; l++)
			for (uint32_t g = 0; g < mc->n_kv_heads; g++)
				len0[l * mc->n_kv_heads + g] =
					*ctx_cache_len(cc, l, g);
		if (!rc)
			rc = ctx_cache_step(cc, A, n - 1, P, NULL, lg);
		while (!rc && k < n && argmax(lg + (size_t)(k - 1) * V, V) == A[k])
			out[k] = A[k], k++;
		if (!rc && k < n) {
			/* greedy decoding leaves the reference here */
			out[k] = argmax(lg + (size_t)(k - 1) * V, V);
			k++;
			for (uint32_t l = 0; l < mc->n_layers; l++)
				for (uint32_t g = 0; g < mc->n_kv_heads; g++)
					*ctx_cache_len(cc, l, g) =
						len0[l * mc->n_kv_heads + g] + k - 1;
		}
		free(lg);
		free(len0);
		if (rc)
			return rc;
		if (k == n) {
			*nout = n;
			return 0;
		}
	}
	return greedy_from(m, cc, out, k, P, st, t, c->key, nout);
}

/* The copy's answer on cache c: the argmax after the prompt (first) and
 * after each of the line's tokens but the last, teacher-forced, into
 * out[c->nans]; the line's entries stay appended (the caller cuts them
 * off or reloads the cache). */
static int copy_answer(const struct model *m, struct ctx_cache *cc,
                       const struct task_case *c, const float *first,
                       int32_t *out)
{
	const uint32_t V = m->cfg.vocab_size, n = c->nans;
	out[0] = argmax(first, V);
	if (n < 2)
		return 0;
	float *lg = malloc(sizeof(float) * (n - 1) * V);
	if (!lg)
		return KVT_ENOMEM;
	int rc = ctx_cache_step(cc, c->tok + c->P, n - 1, c->P, NULL, lg);
	for (uint32_t i = 1; !rc && i < n; i++)
		out[i] = argmax(lg + (size_t)(i - 1) * V, V);
	free(lg);
	return rc;
}

int task_score(const struct tok *t, const struct task_case *c,
                  const int32_t *ans, uint32_t n, double *top1)
{
	if (c->kind == TASK_COPY) {
		uint32_t ok = 0;
		for (uint32_t i = 0; i < c->nans; i++)
			ok += i < n && ans[i] == c->tok[c->P + i];
		if (top1)
			*top1 = c->nans ? (double)ok / c->nans : 0;
		return c->nans && ok == c->nans;
	}
	char *s;
	size_t len;
	char e[64];
	if (!t || tok_decode(t, ans, n, &s, &len, e, sizeof(e)))
		return 0;
	size_t i = 0;
	while (i < len && !isdigit((unsigned char)s[i]))
		i++;
	size_t j = i;
	while (j < len && isdigit((unsigned char)s[j]))
		j++;
	int ok = j - i == TASK_KEY_DIGITS &&
	         !memcmp(s + i, c->key, TASK_KEY_DIGITS);
	free(s);
	return ok;
}

/* ------------------------------------------------------------ reference */

void task_ref_free(struct task_ref *r)
{
	ctx_window_free(&r->w);
	free(r->tok);
	free(r->first);
	memset(r, 0, sizeof(*r));
}

/* Moves the [L][n-1][row] records of the first prefill step to their
 * places in [L][n][row] and puts the last step's [L][1][row] after
 * them; layers from the last down, so nothing unmoved is overwritten. */
static void restride(float *a, const float *last, uint32_t L, uint32_t n,
                     size_t row)
{
	for (uint32_t l = L; l-- > 0;) {
		memmove(a + (size_t)l * n * row, a + (size_t)l * (n - 1) * row,
		        sizeof(float) * (n - 1) * row);
		memcpy(a + ((size_t)l * n + n - 1) * row, last + (size_t)l * row,
		       sizeof(float) * row);
	}
}

int task_ref_build(const struct model *m, const struct tok *t,
                      const struct task_case *c,
                      const struct task_stop *st, const int32_t *sep,
                      uint32_t n_sep, int policies, struct task_ref *r)
{
	const struct model_config *mc = &m->cfg;
	const size_t L = mc->n_layers, H = mc->n_heads, hd = mc->head_dim,
	             d = mc->dim, nl = L * mc->n_kv_heads;
	const uint32_t P = c->P, V = mc->vocab_size;
	struct ctx_window *w = &r->w;
	memset(r, 0, sizeof(*r));
	if (P < 2 || (c->kind == TASK_COPY && !c->nans) ||
	    c->nans > TASK_ANS_MAX)
		return KVT_EINVAL;
	uint32_t nz = policies ? n_sep + P : 0;
	uint32_t cap = P + (nz > TASK_ANS_MAX ? nz : TASK_ANS_MAX);
	r->tok = malloc(sizeof(int32_t) * (P + TASK_ANS_MAX));
	r->first = malloc(sizeof(float) * V);
	float *x1 = malloc(sizeof(float) * L * (d + H * hd + H));
	int32_t *pre = policies ? malloc(sizeof(int32_t) * nz) : NULL;
	int rc = ctx_cache_open(m, cap, &w->full);
	if (!rc && (!r->tok || !r->first || !x1 || (policies && !pre)))
		rc = KVT_ENOMEM;
	if (!rc && policies) {
		w->x = malloc(sizeof(float) * L * P * d);
		w->q = malloc(sizeof(float) * L * P * H * hd);
		w->lse = malloc(sizeof(float) * L * P * H);
		w->kvzip = malloc(sizeof(float) * nl * P);
		w->hind = calloc(nl * P, sizeof(float));
		if (!w->x || !w->q || !w->lse || !w->kvzip || !w->hind)
			rc = KVT_ENOMEM;
	}
	if (!rc) {
		memcpy(r->tok, c->tok, sizeof(int32_t) * P);
		w->tok = r->tok;
		w->P = P;
		struct ctx_tap t0 = {.x = w->x, .q = w->q, .lse = w->lse};
		float *q1 = x1 + L * d, *l1 = q1 + L * H * hd;
		struct ctx_tap t1 = {.x = x1, .q = q1, .lse = l1};
		rc = ctx_cache_step(w->full, c->tok, P - 1, 0,
		                    policies ? &t0 : NULL, NULL);
		if (!rc)
			rc = ctx_cache_step(w->full, c->tok + P - 1, 1, P - 1,
			                    policies ? &t1 : NULL, r->first);
		if (!rc && policies) {
			restride(w->x, x1, (uint32_t)L, P, d);
			restride(w->q, q1, (uint32_t)L, P, H * hd);
			restride(w->lse, l1, (uint32_t)L, P, H);
		}
	}
	/* the answer: the full cache's own */
	if (!rc && c->kind == TASK_NEEDLE) {
		rc = task_decode(m, w->full, r->first, P, st, r->tok + P,
		                    &r->nans);
		ctx_cache_truncate(w->full, P);
		if (!rc)
			r->ok = task_score(t, c, r->tok + P, r->nans, NULL);
	} else if (!rc) {
		int32_t got[TASK_ANS_MAX];
		r->nans = c->nans;
		memcpy(r->tok + P, c->tok + P, sizeof(int32_t) * c->nans);
		rc = copy_answer(m, w->full, c, r->first, got);
		ctx_cache_truncate(w->full, P);
		if (!rc)
			r->ok = task_score(t, c, got, c->nans, &r->top1);
	}
	w->T = P + r->nans;
	if (!rc && policies) {
		/* KVzip's reconstruction of the prompt (context.h step 2):
		 * every query of it, the repeat prompt's included */
		memcpy(pre, sep, sizeof(int32_t) * n_sep);
		memcpy(pre + n_sep, c->tok, sizeof(int32_t) * P);
		struct ctx_tap tz = {.r0 = 0, .r1 = nz, .ncols = P, .max = 1,
		                     .red = w->kvzip};
		rc = ctx_cache_step(w->full, pre, nz, P, &tz, NULL);
		ctx_cache_truncate(w->full, P);
	}
	if (!rc && policies && r->nans >= 2) {
		/* hindsight: the attention of the answer's queries (those
		 * that predict its tokens after the first) */
		struct ctx_tap th = {.r0 = 0, .r1 = r->nans - 1, .ncols = P,
		                     .max = 0, .red = w->hind};
		rc = ctx_cache_step(w->full, r->tok + P, r->nans - 1, P, &th,
		                    NULL);
		ctx_cache_truncate(w->full, P);
	}
	free(x1);
	free(pre);
	if (rc)
		task_ref_free(r);
	return rc;
}

/* ------------------------------------------------------------ a job */

int task_load(const struct model *m, const struct job *j,
                 const char *tenant, const struct ctx_window *w,
                 const char *rt, struct ctx_cache *c, uint8_t *keep,
                 char *err, size_t errlen)
{
	ctx_cache_truncate(c, 0);
	if (j->kind == J_DAEMON)
		return ctx_load_daemon(m, w, rt, tenant, j->spec[C_MAIN], c, err,
		                       errlen);
	int rc = j->kind == J_KVZIP ? ctx_keep_kvzip(m, w, j->ratio, keep)
	                            : ctx_keep_oracle(m, w, j->ratio, keep);
	if (rc) {
		snprintf(err, errlen, "keep flags: %s", kvt_strerror(rc));
		return rc;
	}
	ctx_load_keep(m, w, keep, c);
	return 0;
}

void task_wilson(uint64_t k, uint64_t n, double *lo, double *hi)
{
	if (!n) {
		*lo = 0;
		*hi = 1;
		return;
	}
	const double z = 1.96, p = (double)k / n, z2 = z * z / n;
	double mid = (p + z2 / 2) / (1 + z2);
	double half = z * sqrt(p * (1 - p) / n + z2 / (4.0 * n)) / (1 + z2);
	*lo = mid - half < 0 ? 0 : mid - half;
	*hi = mid + half > 1 ? 1 : mid + half;
}

/* ------------------------------------------------------------ the run */

/* What the workers of one part of a task share (under the pool's lock):
 * its cases and jobs; the pool's job k is case k, its reference then
 * every job on it. */
struct task_part {
	const struct task_args *ta;
	const struct task_stop *st;
	enum task_kind kind;
	const char *part;           /* for the progress line */
	struct task_case *cases;    /* [ncases] */
	uint32_t *cell;             /* [ncases] li * NDEPTH + di */
	uint32_t ncases, maxP;
	struct task_cell *ref;      /* [NLEN * NDEPTH] the reference's */
	const struct job *jobs;     /* [njobs], 0: the full cache only */
	uint32_t njobs;
	struct task_jres *res;      /* [njobs] */
};

/* A worker's scratch: a cache for the jobs' kept entries, keep flags. */
struct tscratch {
	struct ctx_cache *jc;
	uint8_t *keep;              /* [L][n_kv][maxP] */
};

/* One job on the reference r of case c (cache jc): right or not, the
 * kept entries.  Reason in err. */
static int run_job(struct task_part *p, uint32_t k, uint32_t ci,
                   const struct task_ref *r, struct ctx_cache *jc,
                   uint8_t *keep, int *ok, double *top1, uint64_t *kept,
                   char *err, size_t errlen)
{
	const struct task_args *ta = p->ta;
	const struct task_case *c = &p->cases[ci];
	const struct job *j = &p->jobs[k];
	char tn[80];
	snprintf(tn, sizeof(tn), "%s-%.24s-%u-c%u", task_name[p->kind],
	         j->name, k, ci);
	int rc = task_load(ta->M, j, tn, &r->w, ta->rt, jc, keep, err,
	                      errlen);
	if (rc)
		return rc;
	*kept = ctx_cache_kept(jc);
	int32_t ans[TASK_ANS_MAX];
	uint32_t n = c->nans;
	if (c->kind == TASK_NEEDLE)
		rc = task_needle_answer(ta->M, ta->tk, jc, c, r, p->st, ans, &n);
	else
		rc = copy_answer(ta->M, jc, c, r->first, ans);
	if (rc) {
		snprintf(err, errlen, "answer: %s", kvt_strerror(rc));
		return rc;
	}
	*ok = task_score(ta->tk, c, ans, n, top1);
	return 0;
}

static void *part_open(struct pool *pl)
{
	const struct task_part *p = pl->ctx;
	const struct model_config *mc = &p->ta->M->cfg;
	struct tscratch *s = calloc(1, sizeof(*s));
	if (!s || !(s->keep = malloc((size_t)mc->n_layers * mc->n_kv_heads *
	                             p->maxP)) ||
	    (p->njobs && ctx_cache_open(p->ta->M, p->maxP + TASK_ANS_MAX,
	                                &s->jc)))
		eval_die("out of memory");
	return s;
}

static void part_close(struct pool *pl, void *scratch)
{
	struct tscratch *s = scratch;
	ctx_cache_close(s->jc);
	free(s->keep);
	free(s);
}

/* Under the lock: job k's result on case ci (cell cl of P tokens). */
static void job_done(struct task_part *p, uint32_t k, uint32_t ci, uint32_t cl,
                     uint32_t P, int rc, int ok, double top1, uint64_t kept,
                     const char *err)
{
	const struct model_config *mc = &p->ta->M->cfg;
	struct task_jres *jr = &p->res[k];
	if (rc && !jr->failed) {
		jr->failed = 1;
		snprintf(jr->err, sizeof(jr->err), "case %u: %s", ci, err);
		fprintf(stderr, "  %s %-13s %.3f FAILED: %s\n",
		        task_name[p->kind], p->jobs[k].name, p->jobs[k].ratio,
		        jr->err);
	} else if (!rc) {
		struct task_cell *e = &jr->c[cl % NDEPTH];
		e->ok += ok;
		e->n++;
		e->top1 += top1;
		e->tokens += P;
		jr->ach += 1.0 - (double)kept /
		           ((double)mc->n_layers * mc->n_kv_heads * P);
		jr->nach++;
	}
}

/* The pool's job: case ci's reference, then every job on it. */
static void run_case(struct pool *pl, void *scratch, uint64_t k0)
{
	struct task_part *p = pl->ctx;
	struct tscratch *sc = scratch;
	const struct task_args *ta = p->ta;
	const uint32_t ci = (uint32_t)k0, cl = p->cell[ci];
	const struct task_case *c = &p->cases[ci];
	struct task_ref r;
	int rc = task_ref_build(ta->M, ta->tk, c, p->st, ta->sep, ta->nsep,
	                        p->njobs > 0, &r);
	if (rc)
		eval_die("%s case %u: reference: %s", task_name[p->kind], ci,
		         kvt_strerror(rc));
	for (uint32_t k = 0; k < p->njobs; k++) {
		pthread_mutex_lock(&pl->lock);
		int skip = p->res[k].failed;
		pthread_mutex_unlock(&pl->lock);
		if (skip)
			continue;
		char err[600] = "";
		int ok = 0;
		double top1 = 0;
		uint64_t kept = 0;
		rc = run_job(p, k, ci, &r, sc->jc, sc->keep, &ok, &top1, &kept,
		             err, sizeof(err));
		pthread_mutex_lock(&pl->lock);
		job_done(p, k, ci, cl, c->P, rc, ok, top1, kept, err);
		pthread_mutex_unlock(&pl->lock);
	}
	pthread_mutex_lock(&pl->lock);
	struct task_cell *e = &p->ref[cl];
	e->ok += r.ok;
	e->n++;
	e->top1 += r.top1;
	e->tokens += c->P;
	pthread_mutex_unlock(&pl->lock);
	task_ref_free(&r);
}

static void run_part(struct task_part *p)
{
	char label[160];
	snprintf(label, sizeof(label), "%s %s: %s, cases", p->ta->a->mname,
	         task_name[p->kind], p->part);
	p->maxP = 0;
	for (uint32_t i = 0; i < p->ncases; i++)
		p->maxP = p->cases[i].P > p->maxP ? p->cases[i].P : p->maxP;
	struct pool pl = {.threads = p->ta->a->threads, .njobs = p->ncases,
	                  .ctx = p, .open = part_open, .close = part_close,
	                  .run = run_case, .label = label};
	pool_run(&pl);
}

/* The seed of case (kind, part, length, depth, trial): one stream each. */
static uint64_t case_seed(enum task_kind kind, int part, uint32_t len,
                          uint32_t di, uint32_t trial)
{
	uint64_t s = TASK_SEED ^ ((uint64_t)kind << 60) ^
	             ((uint64_t)part << 56) ^ ((uint64_t)len << 32) ^
	             ((uint64_t)di << 24) ^ trial;
	(void)dataset_rng(&s);
	return s;
}

/* The cases of part (0 scan, 1 run) at lengths li (on[li]) and depths
 * (don[di]) into p, longest first (the pool then ends on short ones). */
static void make_cases(struct task_part *p, const struct task_result *R,
                       const char *text, size_t n, int part,
                       const uint8_t *on, const uint8_t *don,
                       uint32_t trials)
{
	uint32_t max = R->nlen * R->ndepth * trials;
	p->cases = calloc(max, sizeof(*p->cases));
	p->cell = calloc(max, sizeof(*p->cell));
	if (!p->cases || !p->cell)
		eval_die("out of memory");
	p->ncases = 0;
	char err[1024];
	for (uint32_t li = R->nlen; li-- > 0;) {
		if (!on[li])
			continue;
		for (uint32_t di = 0; di < R->ndepth; di++) {
			if (!don[di])
				continue;
			for (uint32_t k = 0; k < trials; k++) {
				uint32_t i = p->ncases++;
				double d = R->depth ? R->depth[di] : 0;
				if (task_case_build(p->ta->tk, text, n, R->kind,
				                       R->len[li], d,
				                       case_seed(R->kind, part,
				                                 R->len[li], di, k),
				                       &p->cases[i], err,
				                       sizeof(err)))
					eval_die("%s case at %u tokens: %s", R->name,
					         R->len[li], err);
				p->cell[i] = li * NDEPTH + di;
			}
		}
	}
}

static void free_cases(struct task_part *p)
{
	for (uint32_t i = 0; i < p->ncases; i++)
		task_case_free(&p->cases[i]);
	free(p->cases);
	free(p->cell);
}

/*
 * Whether job k of jobs[nj] runs in the tasks (each job costs about as
 * much as a case's prefill, so not all of them do).  A budgeted policy
 * runs its targets from table_at[TASK_AT0] on (0.75, 0.875): its
 * achieved ratio is its target, so those columns are its runs.  A
 * threshold policy (kvzap, fastkvzip-global: tau set) reaches its target
 * only roughly (0.754 for 0.75, 0.871 for 0.875 on the needle's cases),
 * so a column needs a run on each side of it: its calibrated targets
 * from 0.5 on, and the sweep's most aggressive threshold (achieved about
 * 0.95), which brackets 0.875 from above; the rest of its sweep is left
 * out.
 */
static int task_job_wanted(const struct job *jobs, uint32_t nj, uint32_t k)
{
	const struct job *j = &jobs[k];
	if (j->sweep) {
		for (uint32_t i = 0; i < nj; i++)
			if (jobs[i].sweep && !strcmp(jobs[i].name, j->name) &&
			    jobs[i].tau > j->tau)
				return 0;
		return 1;
	}
	if (!j->ratio)
		return 1;
	if (isfinite(j->tau))
		return j->ratio > 0.5 - 1e-9;
	return j->ratio > table_at[TASK_AT0] - 1e-9;
}

/* The policies at length li, the depths don: fresh cases, the jobs of
 * that length (quick: a few). */
static void run_length(const struct task_args *ta,
                       const struct task_stop *st,
                       struct task_result *R, uint32_t li,
                       const uint8_t *don, uint32_t trials,
                       const char *text, size_t n)
{
	static const char *const quick_jobs[] = {"full", "streaming", "snapkv",
	                                         "kvzip", "oracle"};
	uint32_t ri = R->nrun++;
	R->run[ri].li = li;
	memcpy(R->run[ri].on, don, NDEPTH);
	struct job *jobs = calloc(MAX_JOBS, sizeof(*jobs));
	if (!jobs)
		eval_die("out of memory");
	uint32_t nj = ta->jobs(ta->jobs_arg, R->len[li], jobs), kept = 0,
	         nall = 0;
	/* --only: the jobs a whole run would run, for the order of its rows */
	struct job *all = ta->a->only ? calloc(MAX_JOBS, sizeof(*all)) : NULL;
	if (ta->a->only && !all)
		eval_die("out of memory");
	uint8_t want[MAX_JOBS] = {0}; /* decided on the whole list first */
	for (uint32_t k = 0; k < nj && k < MAX_JOBS; k++) {
		if (R->quick)
			for (size_t q = 0; !want[k] && q < 5; q++)
				want[k] = !strcmp(jobs[k].name, quick_jobs[q]);
		else
			want[k] = (uint8_t)task_job_wanted(jobs, nj, k);
	}
	for (uint32_t k = 0; k < nj && k < MAX_JOBS; k++) {
		if (want[k] && all)
			all[nall++] = jobs[k];
		if (want[k] && (!ta->a->only ||
		                eval_in_list(ta->a->only, jobs[k].name)))
			jobs[kept++] = jobs[k];
	}
	R->run[ri].jobs = jobs;
	R->run[ri].njobs = kept;
	R->run[ri].res = calloc(kept ? kept : 1, sizeof(struct task_jres));
	if (!R->run[ri].res)
		eval_die("out of memory");
	uint8_t on[NLEN] = {0};
	on[li] = 1;
	struct task_cell ref[NLEN * NDEPTH];
	memset(ref, 0, sizeof(ref));
	struct task_part p = {.ta = ta, .st = st, .kind = R->kind,
	                  .part = "policies", .ref = ref, .jobs = jobs,
	                  .njobs = kept, .res = R->run[ri].res};
	make_cases(&p, R, text, n, 1, on, don, trials);
	fprintf(stderr, "kvtrim-eval: %s %s: %u cases at %u tokens, %u jobs\n",
	        ta->a->mname, R->name, p.ncases, R->len[li], kept);
	run_part(&p);
	for (uint32_t di = 0; di < NDEPTH; di++)
		R->run[ri].ref[di] = ref[li * NDEPTH + di];
	free_cases(&p);
	char err[1400];
	if (ta->a->only && task_tables_keep(ta->a->out, R, ri, ta->a->only,
	                                    all, nall, err, sizeof(err)))
		eval_die("--only %s: %s", ta->a->only, err);
	free(all);
}

/* One task: the full cache at every length, then the policies. */
static int run_task(const struct task_args *ta,
                    const struct task_stop *st, enum task_kind kind,
                    const char *text, size_t n)
{
	static const uint32_t quick_len[2] = {512, 256};
	static const double quick_depth[1] = {0.5};
	const int quick = ta->a->quick;
	struct task_result *R = calloc(1, sizeof(*R));
	if (!R)
		eval_die("out of memory");
	R->kind = kind;
	R->name = task_name[kind];
	R->model = ta->a->mname;
	R->quick = quick;
	R->bar = TASK_BAR;
	R->nlen = quick ? 1 : NLEN;
	R->len = quick ? &quick_len[kind] : task_len[kind];
	R->ndepth = kind == TASK_NEEDLE ? (quick ? 1 : NDEPTH) : 1;
	R->depth = kind != TASK_NEEDLE ? NULL
	           : quick ? quick_depth : needle_depth;
	R->scan_trials = quick ? 0 : SCAN_TRIALS;
	R->run_trials = quick ? (kind == TASK_NEEDLE ? 2 : 1) : RUN_TRIALS;
	R->run_min_len = RUN_MIN_LEN;
	R->run_max_len = RUN_MAX_LEN;
	uint8_t all[NLEN] = {1, 1, 1, 1}, dall[NDEPTH] = {1, 1, 1};
	uint64_t t0 = now_ms();
	if (quick) {
		/* one length, the policies whatever the full cache scores;
		 * its row comes from the same cases */
		run_length(ta, st, R, 0, dall, R->run_trials, text, n);
		for (uint32_t di = 0; di < R->ndepth; di++)
			R->scan[0][di] = R->run[0].ref[di];
		R->run_s = (double)(now_ms() - t0) / 1e3;
	} else {
		struct task_cell ref[NLEN * NDEPTH];
		memset(ref, 0, sizeof(ref));
		struct task_part p = {.ta = ta, .st = st, .kind = kind,
		                  .part = "full cache", .ref = ref};
		make_cases(&p, R, text, n, 0, all, dall, SCAN_TRIALS);
		run_part(&p);
		free_cases(&p);
		for (uint32_t li = 0; li < NLEN; li++)
			for (uint32_t di = 0; di < R->ndepth; di++)
				R->scan[li][di] = ref[li * NDEPTH + di];
		R->scan_s = (double)(now_ms() - t0) / 1e3;
		/* the shortest lengths in [RUN_MIN_LEN, RUN_MAX_LEN] where
		 * a depth reaches the bar */
		for (uint32_t li = 0; li < NLEN && R->nrun < RUN_LENGTHS; li++) {
			uint8_t don[NDEPTH] = {0};
			int any = 0;
			for (uint32_t di = 0; di < R->ndepth; di++) {
				const struct task_cell *e = &R->scan[li][di];
				don[di] = e->n && (double)e->ok / e->n >= TASK_BAR;
				any |= don[di];
			}
			if (any && R->len[li] >= RUN_MIN_LEN &&
			    R->len[li] <= RUN_MAX_LEN)
				run_length(ta, st, R, li, don, RUN_TRIALS, text, n);
		}
		R->run_s = (double)(now_ms() - t0) / 1e3 - R->scan_s;
		if (!R->nrun)
			fprintf(stderr, "kvtrim-eval: %s %s: the full cache is "
			        "below %.1f at every length: policies not run\n",
			        ta->a->mname, R->name, TASK_BAR);
	}
	char what[768];
	snprintf(what, sizeof(what), "%.1f minutes with %d threads (full "
	         "cache %.1f, policies %.1f)%s%.400s%s",
	         (R->scan_s + R->run_s) / 60, ta->a->threads, R->scan_s / 60,
	         R->run_s / 60, ta->a->only ? "; --only " : "",
	         ta->a->only ? ta->a->only : "", ta->a->only ? ": the other "
	         "policies' rows are the previous run's" : "");
	task_tables_write(ta->a->out, R, what);
	int bad = 0;
	for (uint32_t ri = 0; ri < R->nrun; ri++) {
		for (uint32_t k = 0; k < R->run[ri].njobs; k++)
			bad |= R->run[ri].res[k].failed;
		free(R->run[ri].jobs);
		free(R->run[ri].res);
	}
	free(R);
	return bad;
}

int task_main(const struct task_args *ta)
{
	const uint32_t V = ta->M->cfg.vocab_size;
	char err[1024], *text;
	size_t n;
	if (dataset_text(DATASET_EVAL, &text, &n, err, sizeof(err)))
		eval_die("%s", err);
	/* the stop rule: the key's digits are single tokens */
	uint8_t *digit = calloc(V, 1);
	if (!digit)
		eval_die("out of memory");
	for (uint32_t i = 0; i < V && i < tok_vocab_size(ta->tk); i++) {
		size_t bl;
		const char *b = tok_token_bytes(ta->tk, (int32_t)i, &bl);
		digit[i] = b && bl == 1 && isdigit((unsigned char)b[0]);
	}
	struct task_stop st = {tok_eot(ta->tk), digit, TASK_ANS_MAX};
	int bad = run_task(ta, &st, TASK_NEEDLE, text, n);
	bad |= run_task(ta, &st, TASK_COPY, text, n);
	free(digit);
	free(text);
	return bad;
}
