/*
 * kvtrim-eval — quality of every eviction policy against the full cache,
 * on held-out inputs, through one real kvtrimd.
 *
 *   kvtrim-eval --model M --out DIR [--quick] [--weights WDIR]
 *               [--runtime-dir RT] [--threads N] [--seqs N]
 *
 * Protocol (methods.md section 17; every number is full cache vs evicted
 * run on the same tokens):
 *   - Inputs: the evaluation split of dataset.h (bytes2m: the last 40 % of
 *     bytes2m-valid.txt; stories260K: samples of the fixed eval stream),
 *     sequences of T = 512 tokens (--quick: 256) starting at BOS.
 *   - Each policy is one tenant of one kvtrimd (all registered at once,
 *     `--threads` of them stepping concurrently): the reference engine
 *     (examples/tinyllm/engine.h) prefills P = 384 tokens (--quick: 192) in
 *     chunks of 64 (the policy compresses as it would: at prefill syncs,
 *     at the end of prefill, ...), then decodes the rest one token per
 *     sync, teacher-forced, policy active.
 *   - Reference: the dense in-process forward on the same schedule.
 *   - Metrics over the decode predictions t = P .. T-2 (of token t+1):
 *     kl   = mean KL(p_full || p_policy) in nats,
 *     top1 = agreement of the two argmaxes,
 *     dnll = mean increase of -ln p(token t+1) in nats/token,
 *     achieved_ratio = mean over those steps of 1 - kept / (n_seen L H_kv),
 *     kept counted from the daemon's list lengths after each sync: every
 *     entry, sinks, windows and entries pending a delayed decision alike.
 *   - Copy (byte models): BOS, a held-out line of 55-65 bytes, 200 bytes of
 *     held-out filler, the line again; prefill through the filler, decode
 *     the second copy; copy_acc = top-1 accuracy of its bytes from the 9th
 *     on (the protocol of models/README.md).
 *   - Needles (byte models): 16 cases per depth (--quick: 1) of 512 bytes
 *     of held-out filler (evaluation split) with three distractor records
 *     `code WXYZ: 12345` and the target `code ABCD: 48213`, then depth =
 *     50 / 100 / 200 / 400 bytes later the query `code ABCD: ` and the 5
 *     digits (seeded keys and digits; make_needle).  Prefill stops where
 *     the query starts; the digits are scored teacher-forced, per-digit
 *     top-1 and exact (all 5).  The full cache is scored first (from the
 *     reference logits); only the depths where it reaches NEEDLE_BAR
 *     per digit (chance 0.1) are run for the policies, and needle_acc is
 *     the per-digit accuracy over them, else empty.  DIR/needle-<model>.txt
 *     has the full-cache figures per depth (and the policies' per depth).
 *   - Budgets: ratio policies get ratio=R; kvpop (a token budget) gets the
 *     N whose mean achieved ratio over the scored steps is R; kvzap (a
 *     threshold) gets the tau that achieves R on the TRAINING split under
 *     this protocol (computed offline from its own scores; the achieved
 *     ratio on the evaluation inputs is then measured, not assumed).
 *   - Sweep: kvzap-linear and kvzap-mlp also run at 6 fixed thresholds
 *     (--quick: 2) chosen on the training split (sweep_grid: those that
 *     reach ratios evenly spaced over 0.30 .. 0.95, or 0.01 under the cap
 *     the window sets, rounded to multiples of 0.25); rows with an empty
 *     target_ratio, the threshold in the threshold column, the achieved
 *     ratio measured.
 *   - kvzip and oracle cannot run in the daemon (they need the model, and
 *     the daemon takes no external scores), so they run through
 *     tools/eval/replay.h, an in-process cache with the same forward,
 *     attention kernel and top-k kernel:
 *       kvzip:  KVzip scores (oracle.h; contexts longer than one
 *               reconstruction pretext are scored in chunks, BOS keeps its
 *               best score) of the prompt, one top-k over all layers and
 *               KV heads at the end of prefill (KVzip's pair level), first
 *               4 positions protected; decode tokens kept.
 *       oracle: hindsight — after every sync (n tokens seen) each entry
 *               is scored by the attention it will still receive in the
 *               full-cache run from the queries t in [n, T - 2] (max
 *               over the group's query heads); per-head top-k to the
 *               ratio budget, like the ratio policies.
 * Output: DIR/quality.csv (rows of other models already there are kept;
 * columns model, policy, target_ratio, achieved_ratio, kl, top1, dnll,
 * copy_acc, needle_acc, threshold), DIR/quality.md, DIR/quality.png
 * (gnuplot, skipped with a note when absent), DIR/specs-<model>.txt (the
 * exact policy specs), DIR/needle-<model>.txt (byte models).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../train/dataset.h"
#include "../train/recipe.h"
#include "engine.h"
#include "kernels.h"
#include "model.h"
#include "oracle.h"
#include "replay.h"
#include "weights.h"

void openblas_set_num_threads(int n);

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
static const uint32_t needle_depth[NEEDLE_NDEPTH] = {50, 100, 200, 400};
/* kvzap threshold sweep: the grid spans the thresholds that reach these
 * ratios on the training split */
#define SWEEP_LO 0.30
#define SWEEP_HI 0.95

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

static const struct model *M;
static struct ecase *cases;
static uint32_t ncases;
static struct job jobs[MAX_JOBS];
static uint32_t njobs;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_job;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2),
                                                     noreturn));
static pid_t daemon_pid;
static char rt_tmp[256];

static void stop_daemon(void)
{
	if (daemon_pid > 0) {
		kill(daemon_pid, SIGTERM);
		waitpid(daemon_pid, NULL, 0);
		daemon_pid = 0;
	}
	if (rt_tmp[0]) {
		char cmd[300];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rt_tmp);
		if (system(cmd) != 0)
			fprintf(stderr, "kvtrim-eval: could not remove %s\n",
			        rt_tmp);
		rt_tmp[0] = 0;
	}
}

static void die(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "kvtrim-eval: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	stop_daemon();
	exit(1);
}

/* SIGINT / SIGTERM: the daemon this run started must not outlive it. */
static void on_signal(int sig)
{
	if (daemon_pid > 0)
		kill(daemon_pid, SIGTERM);
	signal(sig, SIG_DFL);
	raise(sig);
}

/* ------------------------------------------------------------ metrics */

/* Adds the comparison of one prediction to job j. */
static void score_step(struct job *j, const struct ecase *c, uint32_t t,
                       const float *lg)
{
	uint32_t V = M->cfg.vocab_size;
	const float *rf = c->ref + (size_t)(t - c->P) * V;
	int32_t y = c->tok[t + 1];
	if (c->kind != C_MAIN) {
		if (t + 1 < c->c0)
			return;
		uint32_t am = 0;
		for (uint32_t v = 1; v < V; v++)
			if (lg[v] > lg[am])
				am = v;
		if (c->kind == C_COPY) {
			j->copy_ok += (int32_t)am == y;
			j->copy_n++;
		} else {
			j->nd_ok[c->di] += (int32_t)am == y;
			j->nd_n[c->di]++;
			j->case_ok += (int32_t)am == y;
		}
		return;
	}
	double mf = rf[0], me = lg[0];
	uint32_t af = 0, ae = 0;
	for (uint32_t v = 1; v < V; v++) {
		if (rf[v] > mf) {
			mf = rf[v];
			af = v;
		}
		if (lg[v] > me) {
			me = lg[v];
			ae = v;
		}
	}
	double zf = 0, ze = 0;
	for (uint32_t v = 0; v < V; v++) {
		zf += exp(rf[v] - mf);
		ze += exp(lg[v] - me);
	}
	double lzf = mf + log(zf), lze = me + log(ze), kl = 0;
	for (uint32_t v = 0; v < V; v++) {
		double lpf = rf[v] - lzf, lpe = lg[v] - lze;
		kl += exp(lpf) * (lpf - lpe);
	}
	j->kl += kl > 0 ? kl : 0;
	j->top1 += af == ae;
	j->dnll += (lze - lg[y]) - (lzf - rf[y]);
	j->npos++;
}

static void add_ach(struct job *j, const struct ecase *c, uint64_t kept,
                    uint32_t n_seen)
{
	if (c->kind != C_MAIN)
		return;
	const struct model_config *mc = &M->cfg;
	j->ach += 1.0 - (double)kept / ((double)n_seen * mc->n_layers *
	                                mc->n_kv_heads);
	j->nach++;
}

/* ------------------------------------------------------------ daemon jobs */

static uint64_t engine_kept(struct engine *e)
{
	const struct model_config *mc = &M->cfg;
	uint64_t s = 0;
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			struct kvt_list li;
			if (kvt_list_get(engine_client(e), engine_seq(e), l, g,
			                 &li) == 0)
				s += li.len;
		}
	return s;
}

static int run_daemon_case(struct job *j, const struct ecase *c, float *lg)
{
	struct engine *e = j->e[c->kind] ? j->e[c->kind] : j->e[C_MAIN];
	int rc = engine_reset(e);
	if (!rc)
		rc = engine_feed(e, c->tok, c->P, KVT_PHASE_PREFILL, NULL);
	for (uint32_t t = c->P; !rc && t + 1 < c->T; t++) {
		rc = engine_step(e, c->tok + t, 1, KVT_PHASE_DECODE, lg);
		if (rc)
			break;
		score_step(j, c, t, lg);
		add_ach(j, c, engine_kept(e), t + 1);
	}
	if (rc)
		snprintf(j->err, sizeof(j->err), "%s", engine_error(e));
	return rc;
}

/* ------------------------------------------------------------ replay jobs */

/* Per-head top-k of the hindsight scores to the ratio budget. */
static int evict_oracle(struct replay *r, const struct ecase *c,
                        const float *suf, double R)
{
	const struct model_config *mc = &M->cfg;
	uint32_t n = replay_pos(r);
	uint32_t B = n - (uint32_t)floor(R * n);
	float *s = malloc(sizeof(float) * n);
	uint32_t *rank = malloc(sizeof(uint32_t) * n),
	         *idx = malloc(sizeof(uint32_t) * n),
	         *sc = malloc(sizeof(uint32_t) * n);
	uint8_t *drop = malloc(n);
	if (!s || !rank || !idx || !sc || !drop) {
		free(s);
		free(rank);
		free(idx);
		free(sc);
		free(drop);
		return KVT_ENOMEM;
	}
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			uint8_t *al = replay_alive(r, l, g);
			uint32_t G = mc->n_heads / mc->n_kv_heads, T = c->T;
			uint32_t k = 0;
			for (uint32_t i = 0; i < n; i++)
				if (al[i]) {
					/* attention still to come: queries
					 * t >= n, best head of the group */
					float best = 0;
					for (uint32_t h = g * G; h < (g + 1) * G;
					     h++) {
						float v = n < T ? suf[(((size_t)l *
						        mc->n_heads + h) * T + n) *
						        T + i] : 0;
						best = v > best ? v : best;
					}
					s[k] = best;
					rank[k] = i;
					idx[k++] = i;
				}
			if (k <= B)
				continue;
			select_topk_cpu(s, rank, NULL, k, B, drop, sc);
			for (uint32_t e = 0; e < k; e++)
				if (drop[e])
					al[idx[e]] = 0;
		}
	free(s);
	free(rank);
	free(idx);
	free(sc);
	free(drop);
	return 0;
}

/* One top-k over every layer and KV head of the prompt (KVzip pair
 * level), first KVZIP_SINKS positions protected. */
static int evict_kvzip(struct replay *r, const struct ecase *c, double R)
{
	const struct model_config *mc = &M->cfg;
	uint32_t P = c->P, nl = mc->n_layers * mc->n_kv_heads;
	size_t n = (size_t)nl * P;
	float *s = malloc(sizeof(float) * n);
	uint32_t *rank = malloc(sizeof(uint32_t) * n),
	         *sc = malloc(sizeof(uint32_t) * n);
	uint8_t *prot = malloc(n), *drop = malloc(n);
	int rc = KVT_ENOMEM;
	if (!s || !rank || !sc || !prot || !drop)
		goto out;
	uint64_t np = 0;
	for (size_t e = 0; e < n; e++) {
		uint32_t i = (uint32_t)(e % P);
		s[e] = c->kvzip[e];
		rank[e] = i;
		prot[e] = i < KVZIP_SINKS;
		np += prot[e];
	}
	uint64_t B = (uint64_t)(P - (uint32_t)floor(R * P)) * nl;
	uint32_t k = B > np ? (uint32_t)(B - np) : 0;
	select_topk_cpu(s, rank, prot, (uint32_t)n, k, drop, sc);
	for (uint32_t li = 0; li < nl; li++) {
		uint8_t *al = replay_alive(r, li / mc->n_kv_heads,
		                           li % mc->n_kv_heads);
		for (uint32_t i = 0; i < P; i++)
			if (drop[(size_t)li * P + i])
				al[i] = 0;
	}
	rc = 0;
out:
	free(s);
	free(rank);
	free(sc);
	free(prot);
	free(drop);
	return rc;
}

static int run_replay_case(struct job *j, struct replay *r,
                           const struct ecase *c, float *lg)
{
	int rc = 0;
	float *suf = NULL;
	struct model_dense dn;
	if (j->kind == J_ORACLE) {
		/* suffix sums of the full run's attention maps over the
		 * scored queries: suf[l][h][n][i] = sum_{t = n}^{T - 2}
		 * a^h_{t,i} (the maps buffer is reused in place) */
		const struct model_config *mc = &M->cfg;
		uint32_t T = c->T;
		if (model_dense_init(&dn, M, T, 1) ||
		    model_dense_step(&dn, c->tok, T, NULL))
			die("hindsight pass failed");
		suf = dn.maps;
		for (size_t lh = 0; lh < (size_t)mc->n_layers * mc->n_heads;
		     lh++) {
			float *mp = suf + lh * T * T;
			for (uint32_t i = 0; i < T; i++)
				mp[(size_t)(T - 1) * T + i] = 0;
			for (uint32_t t = T - 1; t-- > 0;)
				for (uint32_t i = 0; i < T; i++)
					mp[(size_t)t * T + i] +=
						mp[(size_t)(t + 1) * T + i];
		}
	}
	replay_reset(r);
	for (uint32_t i = 0; i < c->P && !rc; i += CHUNK) {
		uint32_t k = c->P - i < CHUNK ? c->P - i : CHUNK;
		rc = replay_step(r, c->tok + i, k, NULL);
		if (!rc && j->kind == J_ORACLE)
			rc = evict_oracle(r, c, suf, j->ratio);
	}
	if (!rc && j->kind == J_KVZIP)
		rc = evict_kvzip(r, c, j->ratio);
	for (uint32_t t = c->P; !rc && t + 1 < c->T; t++) {
		rc = replay_step(r, c->tok + t, 1, lg);
		if (!rc && j->kind == J_ORACLE)
			rc = evict_oracle(r, c, suf, j->ratio);
		if (rc)
			break;
		score_step(j, c, t, lg);
		add_ach(j, c, replay_kept(r), t + 1);
	}
	if (rc)
		snprintf(j->err, sizeof(j->err), "replay: %s", kvt_strerror(rc));
	if (suf)
		model_dense_free(&dn);
	return rc;
}

static void *worker(void *arg)
{
	(void)arg;
	uint32_t maxT = 0;
	for (uint32_t i = 0; i < ncases; i++)
		maxT = cases[i].T > maxT ? cases[i].T : maxT;
	float *lg = malloc(sizeof(float) * M->cfg.vocab_size);
	struct replay *r = NULL;
	if (!lg || replay_open(M, maxT, &r))
		die("out of memory");
	for (;;) {
		pthread_mutex_lock(&job_lock);
		uint32_t k = next_job++;
		pthread_mutex_unlock(&job_lock);
		if (k >= njobs)
			break;
		struct job *j = &jobs[k];
		for (uint32_t i = 0; i < ncases && !j->failed; i++) {
			const struct ecase *c = &cases[i];
			j->case_ok = 0;
			int rc = j->kind == J_DAEMON
			                 ? run_daemon_case(j, c, lg)
			                 : run_replay_case(j, r, c, lg);
			if (rc)
				j->failed = 1;
			else if (c->kind == C_NEEDLE) {
				j->nd_cases[c->di]++;
				j->nd_exact[c->di] += j->case_ok == NEEDLE_DIGITS;
			}
		}
		if (j->sweep)
			fprintf(stderr, "  %-13s tau %.2f done%s%s\n", j->name,
			        j->tau, j->failed ? ": FAILED: " : "",
			        j->failed ? j->err : "");
		else
			fprintf(stderr, "  %-13s %.3f done%s%s\n", j->name,
			        j->ratio, j->failed ? ": FAILED: " : "",
			        j->failed ? j->err : "");
	}
	replay_close(r);
	free(lg);
	return NULL;
}

/* ------------------------------------------------------------ inputs */

/* Full-cache logits on the engine's schedule. */
static void make_ref(struct ecase *c)
{
	uint32_t V = M->cfg.vocab_size;
	struct model_dense dn;
	float *lg = malloc(sizeof(float) * CHUNK * V);
	c->ref = malloc(sizeof(float) * (size_t)(c->T - c->P) * V);
	if (!lg || !c->ref || model_dense_init(&dn, M, c->T, 0))
		die("out of memory");
	for (uint32_t i = 0; i + 1 < c->T;) {
		uint32_t k = i < c->P ? (c->P - i < CHUNK ? c->P - i : CHUNK) : 1;
		if (model_dense_step(&dn, c->tok + i, k, lg))
			die("dense forward failed");
		if (i >= c->P)
			memcpy(c->ref + (size_t)(i - c->P) * V, lg,
			       sizeof(float) * V);
		i += k;
	}
	model_dense_free(&dn);
	free(lg);
}

/* KVzip scores of the prompt [0, P), in reconstruction chunks. */
static void make_kvzip(struct ecase *c)
{
	const struct model_config *mc = &M->cfg;
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t nsep = oracle_default_sep(M, sep);
	uint32_t mx = oracle_kvzip_max_ctx(model_context(M), nsep);
	uint32_t nctx = c->P - 1, nch = (nctx + mx - 1) / mx;
	size_t nl = (size_t)mc->n_layers * mc->n_kv_heads;
	c->kvzip = calloc(nl * c->P, sizeof(float));
	float *o = malloc(sizeof(float) * nl * (mx + 1));
	if (!c->kvzip || !o)
		die("out of memory");
	for (uint32_t k = 0; k < nch; k++) {
		uint32_t a = 1 + (uint32_t)((uint64_t)k * nctx / nch);
		uint32_t b = 1 + (uint32_t)((uint64_t)(k + 1) * nctx / nch);
		uint32_t len = b - a;
		if (oracle_kvzip(M, c->tok + a, len, sep, nsep, 0, o))
			die("kvzip oracle failed");
		for (size_t li = 0; li < nl; li++) {
			const float *src = o + li * (len + 1);
			float *dst = c->kvzip + li * c->P;
			dst[0] = src[0] > dst[0] ? src[0] : dst[0];
			for (uint32_t i = 0; i < len; i++)
				dst[a + i] = src[1 + i];
		}
	}
	free(o);
}

/* Copy cases from the evaluation text: lines of 55-65 printable bytes,
 * evenly spaced, filler from half the text away. */
static uint32_t make_copy(struct ecase *out, uint32_t want)
{
	char *text, err[512];
	size_t n;
	if (dataset_text(DATASET_EVAL, &text, &n, err, sizeof(err)))
		die("%s", err);
	size_t *cand = malloc(sizeof(size_t) * (n / 55 + 1));
	uint32_t *clen = malloc(sizeof(uint32_t) * (n / 55 + 1));
	size_t nc = 0;
	for (size_t i = 0; i < n;) {
		size_t e = i;
		while (e < n && text[e] != '\n')
			e++;
		size_t len = e - i;
		if (len >= 55 && len <= 65) {
			cand[nc] = i;
			clen[nc++] = (uint32_t)len;
		}
		i = e + 1;
	}
	uint32_t k = nc < want ? (uint32_t)nc : want;
	for (uint32_t s = 0; s < k; s++) {
		size_t ci = (size_t)s * nc / k;
		size_t at = cand[ci];
		uint32_t len = clen[ci];
		struct ecase *c = &out[s];
		memset(c, 0, sizeof(*c));
		c->kind = C_COPY;
		c->T = 1 + len + COPY_FILLER + len;
		c->P = 1 + len + COPY_FILLER;
		c->c0 = c->P + COPY_SKIP;
		c->tok = malloc(sizeof(int32_t) * c->T);
		if (!c->tok)
			die("out of memory");
		c->tok[0] = MODEL_BOS;
		size_t f = (at + n / 2) % (n - COPY_FILLER);
		for (uint32_t i = 0; i < len; i++)
			c->tok[1 + i] = c->tok[c->P + i] =
				(unsigned char)text[at + i];
		for (uint32_t i = 0; i < COPY_FILLER; i++)
			c->tok[1 + len + i] = (unsigned char)text[f + i];
	}
	free(cand);
	free(clen);
	free(text);
	return k;
}

/* Key-value needle cases from the evaluation text (byte models): NEEDLE_LEN
 * bytes, BOS then consecutive held-out filler from a seeded offset into
 * which are set, each on a line of its own (the filler byte before it
 * becomes a newline), three distractor records `code WXYZ: 12345`, 4-8
 * filler bytes apart, then the target record `code ABCD: 48213`, then
 * exactly depth bytes of filler, then the query `code ABCD: ` and the
 * target's 5 digits, which end the case.  Keys are 4 random uppercase
 * letters, distinct within a case; digits uniform.  Prefill stops where
 * the query starts: the query is decoded with the policy active and the
 * digits are scored teacher-forced (per-digit top-1, and exact = all 5).
 * Case s has depth needle_depth[s % NEEDLE_NDEPTH]. */
/* Writes the first n bytes of "code KEY: VALUE\n" (17) at t. */
static void needle_record(int32_t *t, const char *key, const char *val,
                          size_t n)
{
	char b[32];
	snprintf(b, sizeof(b), "code %.4s: %.5s\n", key, val);
	for (size_t i = 0; i < n && b[i]; i++)
		t[i] = (unsigned char)b[i];
}

static void make_needle(struct ecase *out, uint32_t want)
{
	char *text, err[512];
	size_t n;
	if (dataset_text(DATASET_EVAL, &text, &n, err, sizeof(err)))
		die("%s", err);
	if (n < 2 * NEEDLE_LEN)
		die("needles: evaluation text too short");
	const uint32_t rec = 17; /* "code ABCD: 48213\n" */
	for (uint32_t s = 0; s < want; s++) {
		struct ecase *c = &out[s];
		uint64_t st = NEEDLE_SEED + 0x9e3779b97f4a7c15ull * (s + 1);
		(void)dataset_rng(&st);
		char key[NEEDLE_DISTRACTORS + 1][5], val[NEEDLE_DISTRACTORS + 1][6];
		for (uint32_t k = 0; k <= NEEDLE_DISTRACTORS; k++) {
			int dup;
			do {
				for (int i = 0; i < 4; i++)
					key[k][i] = (char)('A' +
					            dataset_rng(&st) % 26);
				key[k][4] = 0;
				dup = 0;
				for (uint32_t q = 0; q < k; q++)
					dup |= !memcmp(key[q], key[k], 4);
			} while (dup);
			for (uint32_t i = 0; i < NEEDLE_DIGITS; i++)
				val[k][i] = (char)('0' + dataset_rng(&st) % 10);
			val[k][5] = 0;
		}
		uint32_t gap[NEEDLE_DISTRACTORS], gs = 0;
		for (uint32_t k = 0; k < NEEDLE_DISTRACTORS; k++)
			gs += gap[k] = 4 + (uint32_t)(dataset_rng(&st) % 5);
		size_t f = dataset_rng(&st) % (n - NEEDLE_LEN);
		memset(c, 0, sizeof(*c));
		c->kind = C_NEEDLE;
		c->di = s % NEEDLE_NDEPTH;
		uint32_t depth = needle_depth[c->di];
		c->T = NEEDLE_LEN;
		c->c0 = c->T - NEEDLE_DIGITS;
		c->P = c->c0 - 11; /* "code ABCD: " */
		uint32_t lead = c->P - depth - rec * (NEEDLE_DISTRACTORS + 1) -
		                gs - 1;
		if ((int32_t)lead < 1)
			die("needles: depth %u does not fit", depth);
		c->tok = malloc(sizeof(int32_t) * c->T);
		if (!c->tok)
			die("out of memory");
		/* filler everywhere, then the records over it */
		c->tok[0] = MODEL_BOS;
		for (uint32_t i = 1; i < c->T; i++)
			c->tok[i] = (unsigned char)text[f + i - 1];
		uint32_t at = 1 + lead;
		for (uint32_t k = 0; k <= NEEDLE_DISTRACTORS; k++) {
			/* k < NEEDLE_DISTRACTORS: distractor k; last: target */
			uint32_t r = k < NEEDLE_DISTRACTORS ? k + 1 : 0;
			c->tok[at - 1] = '\n';
			needle_record(c->tok + at, key[r], val[r], rec);
			at += rec + (k < NEEDLE_DISTRACTORS ? gap[k] : depth);
		}
		if (at != c->P)
			die("needles: layout error");
		c->tok[at - 1] = '\n';
		/* the query and the digits: the case ends there */
		needle_record(c->tok + at, key[0], val[0], c->T - at);
	}
	free(text);
}

/* Full-cache needle accuracy per depth from the reference logits. */
static void needle_full(const struct ecase *c, uint32_t nc, double *digit,
                        double *exact, uint32_t *per_depth)
{
	uint32_t V = M->cfg.vocab_size;
	uint64_t ok[NEEDLE_NDEPTH] = {0}, ex[NEEDLE_NDEPTH] = {0};
	memset(per_depth, 0, sizeof(uint32_t) * NEEDLE_NDEPTH);
	for (uint32_t i = 0; i < nc; i++) {
		uint32_t k = 0;
		for (uint32_t t = c[i].c0 - 1; t + 1 < c[i].T; t++) {
			const float *rf = c[i].ref + (size_t)(t - c[i].P) * V;
			uint32_t am = 0;
			for (uint32_t v = 1; v < V; v++)
				if (rf[v] > rf[am])
					am = v;
			k += (int32_t)am == c[i].tok[t + 1];
		}
		ok[c[i].di] += k;
		ex[c[i].di] += k == NEEDLE_DIGITS;
		per_depth[c[i].di]++;
	}
	for (int d = 0; d < NEEDLE_NDEPTH; d++) {
		digit[d] = per_depth[d] ? (double)ok[d] /
		           ((double)per_depth[d] * NEEDLE_DIGITS) : NAN;
		exact[d] = per_depth[d] ? (double)ex[d] / per_depth[d] : NAN;
	}
}

/* ------------------------------------------------------------ kvzap tau */

/* kvzap's achieved ratio on the protocol for threshold tau, computed from
 * its scores s [cal][L][n_kv][T] exactly: after the sync of step t the
 * entries i <= t - w were decided (dropped iff s < tau), the window
 * (t - w, t] is kept. */
static double kvzap_ratio(const float *s, uint32_t ncal, uint32_t T,
                          uint32_t P, uint32_t w, float tau)
{
	const struct model_config *mc = &M->cfg;
	size_t nl = (size_t)mc->n_layers * mc->n_kv_heads;
	double acc = 0;
	uint64_t cnt = 0;
	uint32_t *below = malloc(sizeof(uint32_t) * (T + 1));
	for (uint32_t q = 0; q < ncal; q++) {
		/* below[i] = dropped decided entries among positions < i */
		memset(below, 0, sizeof(uint32_t) * (T + 1));
		for (size_t li = 0; li < nl; li++) {
			const float *x = s + ((size_t)q * nl + li) * T;
			uint32_t run = 0;
			for (uint32_t i = 0; i < T; i++) {
				below[i] += run;
				run += !(x[i] >= tau);
			}
			below[T] += run;
		}
		for (uint32_t t = P; t + 1 < T; t++) {
			uint32_t n = t + 1;
			uint32_t decided = n > w ? n - w : 0;
			double dropped = below[decided];
			acc += dropped / ((double)n * nl);
			cnt++;
		}
	}
	free(below);
	return cnt ? acc / cnt : 0;
}

/* Scores of the kvzap model dir on ncal training sequences. */
static float *kvzap_scores(const char *dir, const struct dataset *cal,
                           char *err, size_t errlen)
{
	const struct model_config *mc = &M->cfg;
	struct weights *w;
	if (weights_load(dir, &w, err, errlen))
		return NULL;
	uint32_t hid = 0, L = mc->n_layers, nkv = mc->n_kv_heads, d = mc->dim,
	         T = cal->len;
	int mlp = weights_has(w, "layers.0.0.weight");
	if (mlp && weights_config_u32(w, "hidden_dim", &hid)) {
		snprintf(err, errlen, "%.900s: no hidden_dim", dir);
		weights_free(w);
		return NULL;
	}
	float *s = malloc(sizeof(float) * cal->n * L * nkv * T);
	float *y = malloc(sizeof(float) * T * nkv);
	float *hs = malloc(sizeof(float) * T * (hid + 1));
	if (!s || !y || !hs)
		die("out of memory");
	for (uint32_t q = 0; q < cal->n; q++) {
		struct model_dense dn;
		if (model_dense_init(&dn, M, T, 1) ||
		    model_dense_step(&dn, cal->tok + (size_t)q * T, T, NULL))
			die("calibration forward failed");
		for (uint32_t l = 0; l < L; l++) {
			char n1[64], n2[64], n3[64], n4[64];
			snprintf(n1, 64, mlp ? "layers.%u.0.weight" : "layers.%u.weight", l);
			snprintf(n2, 64, mlp ? "layers.%u.0.bias" : "layers.%u.bias", l);
			snprintf(n3, 64, "layers.%u.2.weight", l);
			snprintf(n4, 64, "layers.%u.2.bias", l);
			uint32_t o1 = mlp ? hid : nkv;
			uint64_t s1[2] = {o1, d}, s2[1] = {o1}, s3[2] = {nkv, hid},
			         s4[1] = {nkv};
			const float *W1 = weights_get(w, n1, 2, s1, err, errlen);
			const float *b1 = weights_get(w, n2, 1, s2, err, errlen);
			const float *W2 = mlp ? weights_get(w, n3, 2, s3, err, errlen) : NULL;
			const float *b2 = mlp ? weights_get(w, n4, 1, s4, err, errlen) : NULL;
			if (!W1 || !b1 || (mlp && (!W2 || !b2)))
				die("%s: %s", dir, err);
			const float *x = dn.xs + (size_t)l * T * d;
			if (mlp)
				scorer_mlp_cpu(x, T, d, W1, b1, hid, W2, b2, nkv,
				               y, hs);
			else
				scorer_linear_cpu(x, T, d, W1, b1, nkv, y);
			for (uint32_t g = 0; g < nkv; g++)
				for (uint32_t i = 0; i < T; i++)
					s[(((size_t)q * L + l) * nkv + g) * T + i] =
						y[(size_t)i * nkv + g];
		}
		model_dense_free(&dn);
	}
	free(y);
	free(hs);
	weights_free(w);
	return s;
}

static int same_f(float a, float b) { return fabsf(a - b) < 1e-6f; }

/* Bisection of tau for the target ratio (achieved grows with tau). */
static float kvzap_tau(const float *s, uint32_t ncal, uint32_t T, uint32_t P,
                       uint32_t w, double R)
{
	float lo = -60.0f, hi = 20.0f;
	for (int it = 0; it < 60; it++) {
		float mid = 0.5f * (lo + hi);
		if (kvzap_ratio(s, ncal, T, P, w, mid) < R)
			lo = mid;
		else
			hi = mid;
	}
	return 0.5f * (lo + hi);
}

/* The sweep's fixed thresholds, chosen on the training split: for npts
 * ratios evenly spaced from SWEEP_LO to hi (hi = SWEEP_HI or, when the
 * window caps kvzap below that, 0.01 under the cap), the threshold that
 * reaches it, rounded to a multiple of SWEEP_ROUND; duplicates once. */
#define SWEEP_ROUND 0.25
static uint32_t sweep_grid(const char *name, const float *s, uint32_t ncal,
                           uint32_t T, uint32_t P, uint32_t w,
                           uint32_t npts, float *out)
{
	double cap = kvzap_ratio(s, ncal, T, P, w, INFINITY);
	double rhi = cap - 0.01 < SWEEP_HI ? cap - 0.01 : SWEEP_HI;
	uint32_t n = 0;
	fprintf(stderr, "kvtrim-eval: %s sweep (training split, cap %.3f):",
	        name, cap);
	for (uint32_t i = 0; i < npts; i++) {
		double r = npts > 1 ? SWEEP_LO + (rhi - SWEEP_LO) * i /
		                              (npts - 1) : SWEEP_LO;
		float tau = (float)(SWEEP_ROUND *
		                    round(kvzap_tau(s, ncal, T, P, w, r) /
		                          SWEEP_ROUND));
		if (n && same_f(out[n - 1], tau))
			continue;
		out[n++] = tau;
		fprintf(stderr, " %.2f (%.3f)", tau,
		        kvzap_ratio(s, ncal, T, P, w, tau));
	}
	fputc('\n', stderr);
	return n;
}

/* ------------------------------------------------------------ daemon */

static void start_daemon(const char *argv0, char *rt, size_t rtlen)
{
	char exe[PATH_MAX], bin[PATH_MAX + 16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		snprintf(exe, sizeof(exe), "%s", argv0);
	else
		exe[n] = 0;
	char *slash = strrchr(exe, '/');
	if (slash)
		*slash = 0;
	snprintf(bin, sizeof(bin), "%s/kvtrimd", slash ? exe : ".");
	snprintf(rt_tmp, sizeof(rt_tmp), "/tmp/kvtrim-eval.XXXXXX");
	if (!mkdtemp(rt_tmp))
		die("mkdtemp: %s", strerror(errno));
	snprintf(rt, rtlen, "%s/rt", rt_tmp);
	char logp[300];
	snprintf(logp, sizeof(logp), "%s/kvtrimd.log", rt_tmp);
	pid_t pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		execl(bin, bin, "--runtime-dir", rt, "--backend", "cpu",
		      "--pool-size", "1024M", "--high-watermark", "1",
		      "--log-level", "warning", (char *)NULL);
		_exit(127);
	}
	daemon_pid = pid;
	for (int i = 0; i < 500; i++) {
		char p[3][400];
		snprintf(p[0], 400, "%.380s/ctl.ipc", rt);
		snprintf(p[1], 400, "%.380s/fd.sock", rt);
		snprintf(p[2], 400, "%.380s/stats.sock", rt);
		if (!access(p[0], F_OK) && !access(p[1], F_OK) &&
		    !access(p[2], F_OK))
			return;
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			daemon_pid = 0;
			die("%s exited at start (log %s)", bin, logp);
		}
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	die("%s did not start in 5 s", bin);
}

/* ------------------------------------------------------------ output */

#define CSV_HEADER "model,policy,target_ratio,achieved_ratio,kl,top1,dnll," \
	           "copy_acc,needle_acc,threshold"

/* One csv row.  Sweep rows (kvzap at a fixed threshold) have no target;
 * tau is the kvzap threshold (calibrated or swept), empty otherwise. */
struct row {
	char model[64], policy[64];
	double target, ach, kl, top1, dnll, copy, needle, tau; /* NaN = empty */
};

static int is_sweep(const struct row *r) { return isnan(r->target); }

static void fmt_num(char *b, size_t n, double v, const char *f)
{
	if (isnan(v))
		b[0] = 0;
	else
		snprintf(b, n, f, v);
}

/* Reads a row of this header or of the earlier one (no threshold). */
static int parse_row(const char *line, struct row *r)
{
	char f[10][64];
	int k = 0;
	const char *p = line;
	while (k < 10) {
		const char *e = strpbrk(p, ",\n");
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (len >= 64)
			return -1;
		memcpy(f[k], p, len);
		f[k][len] = 0;
		k++;
		if (!e || *e == '\n')
			break;
		p = e + 1;
	}
	if (k != 9 && k != 10)
		return -1;
	if (k == 9)
		f[9][0] = 0;
	snprintf(r->model, sizeof(r->model), "%s", f[0]);
	snprintf(r->policy, sizeof(r->policy), "%s", f[1]);
	double *v[8] = {&r->target, &r->ach, &r->kl, &r->top1, &r->dnll,
	                &r->copy, &r->needle, &r->tau};
	for (int i = 0; i < 8; i++)
		*v[i] = f[2 + i][0] ? strtod(f[2 + i], NULL) : NAN;
	return 0;
}

static void write_row(FILE *f, const struct row *r)
{
	char b[8][32];
	fmt_num(b[0], 32, r->target, "%.3f");
	fmt_num(b[1], 32, r->ach, "%.4f");
	fmt_num(b[2], 32, r->kl, "%.6f");
	fmt_num(b[3], 32, r->top1, "%.4f");
	fmt_num(b[4], 32, r->dnll, "%.5f");
	fmt_num(b[5], 32, r->copy, "%.4f");
	fmt_num(b[6], 32, r->needle, "%.4f");
	fmt_num(b[7], 32, r->tau, "%.4f");
	fprintf(f, "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", r->model, r->policy,
	        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
}

static const char *const policy_order[] = {
	"full", "random", "streaming", "h2o", "snapkv", "tova",
	"kvzap-linear", "kvzap-mlp", "fastkvzip", "kvpop", "kvzip", "oracle"};
#define NPOL (sizeof(policy_order) / sizeof(policy_order[0]))

static int same(double a, double b) { return fabs(a - b) < 1e-6; }

/* Indices of model's sweep rows of policy pol, by threshold. */
static size_t sweep_rows(const struct row *rows, size_t nr, const char *model,
                         const char *pol, size_t *idx)
{
	size_t n = 0;
	for (size_t i = 0; i < nr; i++)
		if (is_sweep(&rows[i]) && !strcmp(rows[i].model, model) &&
		    !strcmp(rows[i].policy, pol))
			idx[n++] = i;
	for (size_t a = 0; a < n; a++)
		for (size_t b = a + 1; b < n; b++)
			if (rows[idx[b]].tau < rows[idx[a]].tau) {
				size_t t = idx[a];
				idx[a] = idx[b];
				idx[b] = t;
			}
	return n;
}

/* The needle paragraph of one model, from DIR/needle-<model>.txt. */
static void md_needles(FILE *f, const char *dir, const char *model)
{
	char path[1200], line[512];
	snprintf(path, sizeof(path), "%s/needle-%s.txt", dir, model);
	FILE *nf = fopen(path, "r");
	if (!nf) {
		fprintf(f, "\nNeedles: not run (token-id model: no text to "
		           "hold key-value records).\n");
		return;
	}
	int n = 0, npass = 0;
	fprintf(f, "\nNeedles (full cache, per-digit top-1 / exact, chance "
	           "0.10 / 0.00):");
	while (fgets(line, sizeof(line), nf)) {
		unsigned depth, nc;
		double dg, ex;
		char st[16];
		if (sscanf(line, "full %u %u %lf %lf %15s", &depth, &nc, &dg,
		           &ex, st) != 5)
			continue;
		int pass = !strcmp(st, "pass");
		npass += pass;
		fprintf(f, "%s depth %u: %.2f / %.2f (%u cases%s)", n ? ";" : "",
		        depth, dg, ex, nc, pass ? ", run" : ", below the bar");
		n++;
	}
	fclose(nf);
	if (!npass)
		fprintf(f, ". No depth reaches the bar (per digit >= %.2f): "
		           "the full cache does not retrieve, so needle_acc "
		           "stays empty for every policy.\n", NEEDLE_BAR);
	else
		fprintf(f, ". needle = per-digit accuracy over the depths run "
		           "(per depth and exact match: needle-%s.txt).\n",
		        model);
}

static void write_md(const char *dir, struct row *rows, size_t nr)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/quality.md", dir);
	FILE *f = fopen(path, "w");
	if (!f)
		die("%s: %s", path, strerror(errno));
	fprintf(f,
	        "# KV-cache eviction quality\n\n"
	        "Generated by `kvtrim-eval` (tools/eval/main.c; `make eval`) "
	        "from quality.csv; do not edit by hand.\n\n"
	        "Each policy runs as a tenant of one real kvtrimd (kvzip and "
	        "oracle: in-process replay with the same forward, attention and "
	        "top-k kernels, because they need the model and the daemon takes "
	        "no external scores). Inputs are held-out: bytes2m uses the last "
	        "40 %% of bytes2m-valid.txt (the trainer uses the first 60 %%), "
	        "stories260K a fixed evaluation stream of its own samples "
	        "(training uses other streams). Each sequence is prefilled (384 "
	        "of 512 tokens, chunks of 64, the policy compressing as it "
	        "would), then decoded teacher-forced with the policy active. "
	        "Metrics compare each decode-step prediction with the full "
	        "cache's on the same tokens: KL(full || policy) in nats, top-1 "
	        "agreement, NLL increase in nats/token; achieved = mean over "
	        "the scored steps of 1 - kept/(tokens x layers x KV heads), "
	        "every kept entry counted (sinks, windows, pending decisions). "
	        "copy = top-1 accuracy on a held-out line repeated after 200 "
	        "bytes of filler (byte model only; bytes 9.. of the copy). "
	        "needle (byte model only) = key-value retrieval: 512 bytes of "
	        "held-out filler (evaluation split) carrying three distractor "
	        "records `code WXYZ: 12345` and the target record `code ABCD: "
	        "48213` (seeded random keys of 4 uppercase letters and 5 "
	        "digits, each record on its own line), then, 50 / 100 / 200 / "
	        "400 bytes after the target, the query `code ABCD: ` and the "
	        "5 digits, which end the sequence; prefill stops where the "
	        "query starts, the query is decoded with the policy active, "
	        "the digits are scored teacher-forced (per-digit top-1; exact "
	        "= all 5). The full cache runs it first; a depth is run for "
	        "the policies only when the full cache's per-digit accuracy "
	        "there is at least %.2f (chance 0.10), and needle is the "
	        "per-digit accuracy over those depths, otherwise it stays "
	        "empty. kvzap thresholds are calibrated on the training "
	        "split to the target ratio; its achieved ratio on these inputs "
	        "is what it is. kvzap is also swept over fixed thresholds, "
	        "reported with the compression they actually reach (own table "
	        "per model; dashed curves in quality.png): 6 thresholds per "
	        "model and scorer, chosen on the training split only, those "
	        "that reach ratios evenly spaced from %.2f to %.2f there (or "
	        "0.01 under the cap its 32-entry window sets, mean 1 - 32/n) "
	        "rounded to multiples of %.2f; the sweep rows have no "
	        "target. kvpop gets the token budget "
	        "whose mean achieved "
	        "ratio is the target. snapkv and kvzip compress the prompt only "
	        "(decode tokens are kept), so they achieve less than the "
	        "target. oracle = hindsight (true future attention, in the "
	        "full run, of the queries still to come), an upper bracket, not a "
	        "deployable policy. Exact specs: specs-<model>.txt.\n\n"
	        "Cells: KL / top-1 / dNLL (achieved ratio)[ / copy[ / "
	        "needle]].\n", NEEDLE_BAR, SWEEP_LO, SWEEP_HI, SWEEP_ROUND);
	char models[8][64];
	int nm = 0;
	for (size_t i = 0; i < nr; i++) {
		int seen = 0;
		for (int k = 0; k < nm; k++)
			seen |= !strcmp(models[k], rows[i].model);
		if (!seen && nm < 8)
			snprintf(models[nm++], 64, "%s", rows[i].model);
	}
	size_t *idx = malloc(sizeof(size_t) * (nr + 1));
	if (!idx)
		die("out of memory");
	for (int k = 0; k < nm; k++) {
		double tg[8];
		int nt = 0;
		for (size_t i = 0; i < nr; i++) {
			if (strcmp(rows[i].model, models[k]) ||
			    is_sweep(&rows[i]) || rows[i].target <= 0)
				continue;
			int seen = 0;
			for (int q = 0; q < nt; q++)
				seen |= same(tg[q], rows[i].target);
			if (!seen && nt < 8)
				tg[nt++] = rows[i].target;
		}
		for (int a = 0; a < nt; a++)
			for (int b = a + 1; b < nt; b++)
				if (tg[b] < tg[a]) {
					double t = tg[a];
					tg[a] = tg[b];
					tg[b] = t;
				}
		fprintf(f, "\n## %s\n\n| policy |", models[k]);
		for (int q = 0; q < nt; q++)
			fprintf(f, " ratio %.3f |", tg[q]);
		fprintf(f, "\n|---|");
		for (int q = 0; q < nt; q++)
			fprintf(f, "---|");
		fprintf(f, "\n");
		for (size_t p = 0; p < NPOL; p++) {
			int any = 0;
			for (size_t i = 0; i < nr; i++)
				any |= !strcmp(rows[i].model, models[k]) &&
				       !strcmp(rows[i].policy, policy_order[p]) &&
				       !is_sweep(&rows[i]);
			if (!any)
				continue;
			fprintf(f, "| %s |", policy_order[p]);
			for (int q = 0; q < nt; q++) {
				const struct row *r = NULL;
				for (size_t i = 0; i < nr; i++)
					if (!strcmp(rows[i].model, models[k]) &&
					    !strcmp(rows[i].policy, policy_order[p]) &&
					    (same(rows[i].target, tg[q]) ||
					     rows[i].target == 0))
						r = &rows[i];
				if (!r || isnan(r->kl)) {
					fprintf(f, " %s |", r ? "failed" : "");
					continue;
				}
				fprintf(f, " %.4f / %.3f / %.4f (%.3f)", r->kl,
				        r->top1, r->dnll, r->ach);
				if (!isnan(r->copy))
					fprintf(f, " / %.3f", r->copy);
				if (!isnan(r->needle))
					fprintf(f, " / %.3f", r->needle);
				fprintf(f, " |");
			}
			fprintf(f, "\n");
		}
		md_needles(f, dir, models[k]);

		/* the threshold sweep */
		int hdr = 0, hc = 0, hn = 0;
		for (size_t i = 0; i < nr; i++)
			if (is_sweep(&rows[i]) &&
			    !strcmp(rows[i].model, models[k])) {
				hdr = 1;
				hc |= !isnan(rows[i].copy);
				hn |= !isnan(rows[i].needle);
			}
		if (!hdr)
			continue;
		fprintf(f, "\n### %s: kvzap threshold sweep\n\n| policy | "
		           "threshold | achieved ratio | KL | top-1 | dNLL |%s%s"
		           "\n|---|---|---|---|---|---|%s%s\n", models[k],
		        hc ? " copy |" : "", hn ? " needle |" : "",
		        hc ? "---|" : "", hn ? "---|" : "");
		for (size_t p = 0; p < NPOL; p++) {
			size_t n = sweep_rows(rows, nr, models[k],
			                      policy_order[p], idx);
			for (size_t q = 0; q < n; q++) {
				const struct row *r = &rows[idx[q]];
				if (isnan(r->kl)) {
					fprintf(f, "| %s | %.2f | failed | | | |%s%s\n",
					        r->policy, r->tau, hc ? " |" : "",
					        hn ? " |" : "");
					continue;
				}
				fprintf(f, "| %s | %.2f | %.3f | %.4f | %.3f | "
				           "%.4f |", r->policy, r->tau, r->ach,
				        r->kl, r->top1, r->dnll);
				if (hc) {
					if (isnan(r->copy))
						fprintf(f, " |");
					else
						fprintf(f, " %.3f |", r->copy);
				}
				if (hn) {
					if (isnan(r->needle))
						fprintf(f, " |");
					else
						fprintf(f, " %.3f |", r->needle);
				}
				fprintf(f, "\n");
			}
		}
	}
	free(idx);
	fclose(f);
}

static void write_png(const char *dir, struct row *rows, size_t nr)
{
	if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
		fprintf(stderr, "kvtrim-eval: gnuplot not found, quality.png "
		                "not written (make deps installs gnuplot-nox)\n");
		return;
	}
	char models[8][64];
	int nm = 0;
	for (size_t i = 0; i < nr; i++) {
		int seen = 0;
		for (int k = 0; k < nm; k++)
			seen |= !strcmp(models[k], rows[i].model);
		if (!seen && nm < 8)
			snprintf(models[nm++], 64, "%s", rows[i].model);
	}
	char dat[1200], gp[1200];
	snprintf(dat, sizeof(dat), "%s/.quality-plot.dat", dir);
	snprintf(gp, sizeof(gp), "%s/.quality-plot.gp", dir);
	FILE *d = fopen(dat, "w"), *g = fopen(gp, "w");
	size_t *idx = malloc(sizeof(size_t) * (nr + 1));
	if (!d || !g || !idx)
		die("%s: %s", dat, strerror(errno));
	fprintf(g, "set terminal pngcairo size %d,480 font ',9'\n"
	           "set output '%s/quality.png'\n"
	           "set multiplot layout 1,%d\n"
	           "set logscale y\nset key left top font ',8'\n"
	           "set xlabel 'achieved compression ratio'\n"
	           "set ylabel 'mean next-token KL vs full (nats)'\n"
	           "set grid\n", 640 * nm, dir, nm);
	int block = 0;
	for (int k = 0; k < nm; k++) {
		fprintf(g, "set title '%s'\nplot ", models[k]);
		int first = 1, lt = 0, lt_of[NPOL] = {0};
		for (size_t p = 1; p < NPOL; p++) {
			int any = 0;
			for (size_t i = 0; i < nr; i++) {
				const struct row *r = &rows[i];
				if (strcmp(r->model, models[k]) ||
				    strcmp(r->policy, policy_order[p]) ||
				    is_sweep(r) || isnan(r->kl) || r->kl <= 0)
					continue;
				fprintf(d, "%.5f %.8f\n", r->ach, r->kl);
				any = 1;
			}
			if (!any)
				continue;
			fprintf(d, "\n\n");
			lt_of[p] = ++lt;
			fprintf(g, "%s'%s' index %d using 1:2 with linespoints "
			           "lt %d title '%s'", first ? "" : ", ", dat,
			        block, lt, policy_order[p]);
			block++;
			first = 0;
		}
		/* sweeps: dashed, in their policy's colour, by achieved ratio */
		for (size_t p = 1; p < NPOL; p++) {
			size_t n = sweep_rows(rows, nr, models[k],
			                      policy_order[p], idx);
			for (size_t a = 0; a < n; a++)
				for (size_t b = a + 1; b < n; b++)
					if (rows[idx[b]].ach < rows[idx[a]].ach) {
						size_t t = idx[a];
						idx[a] = idx[b];
						idx[b] = t;
					}
			int any = 0;
			for (size_t q = 0; q < n; q++) {
				const struct row *r = &rows[idx[q]];
				if (isnan(r->kl) || r->kl <= 0)
					continue;
				fprintf(d, "%.5f %.8f\n", r->ach, r->kl);
				any = 1;
			}
			if (!any)
				continue;
			fprintf(d, "\n\n");
			fprintf(g, "%s'%s' index %d using 1:2 with linespoints "
			           "lt %d dt 2 pt 6 title '%s sweep'",
			        first ? "" : ", ", dat, block,
			        lt_of[p] ? lt_of[p] : ++lt, policy_order[p]);
			block++;
			first = 0;
		}
		if (first)
			fprintf(g, "1/0 notitle");
		fprintf(g, "\n");
	}
	fprintf(g, "unset multiplot\n");
	fclose(d);
	fclose(g);
	free(idx);
	char cmd[2600];
	snprintf(cmd, sizeof(cmd), "gnuplot '%s'", gp);
	if (system(cmd) != 0)
		fprintf(stderr, "kvtrim-eval: gnuplot failed\n");
	unlink(dat);
	unlink(gp);
}

/* ------------------------------------------------------------ main */

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtrim-eval --model M --out DIR [--quick] "
	           "[--weights WDIR] [--runtime-dir RT] [--threads N] "
	           "[--seqs N]\n");
}

static struct job *add_job(const char *name, double R, enum jkind kind,
                           const char *spec, const char *spec_copy,
                           const char *spec_needle)
{
	if (njobs >= MAX_JOBS)
		die("too many jobs");
	struct job *j = &jobs[njobs++];
	memset(j, 0, sizeof(*j));
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->ratio = R;
	j->kind = kind;
	j->tau = NAN;
	const char *sp[C_NKIND] = {spec, spec_copy, spec_needle};
	for (int c = 0; c < C_NKIND; c++)
		snprintf(j->spec[c], sizeof(j->spec[c]), "%s",
		         sp[c] ? sp[c] : "");
	return j;
}

/* Token budget whose mean achieved ratio over steps [P, T-1) is R. */
static uint32_t tokens_for(double R, uint32_t P, uint32_t T)
{
	double s = 0;
	for (uint32_t t = P; t + 1 < T; t++)
		s += 1.0 / (t + 1);
	s /= (T - 1 - P);
	double n = (1.0 - R) / s;
	return n < 1 ? 1 : (uint32_t)lround(n);
}

/* Prints spec with every occurrence of abs replaced by rel. */
static void spec_print(FILE *f, const char *spec, const char *abs,
                       const char *rel)
{
	size_t n = strlen(abs);
	while (*spec) {
		if (n && !strncmp(spec, abs, n)) {
			fputs(rel, f);
			spec += n;
		} else {
			fputc(*spec++, f);
		}
	}
}

int main(int argc, char **argv)
{
	const char *model_path = NULL, *out = NULL, *wdir_arg = NULL,
	           *rt_arg = NULL;
	int quick = 0, threads = 2;
	uint32_t nseq = 0;
	static const struct option lo[] = {
		{"model", required_argument, 0, 'm'},
		{"out", required_argument, 0, 'o'},
		{"quick", no_argument, 0, 'q'},
		{"weights", required_argument, 0, 'w'},
		{"runtime-dir", required_argument, 0, 'r'},
		{"threads", required_argument, 0, 't'},
		{"seqs", required_argument, 0, 's'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	int ch;
	while ((ch = getopt_long(argc, argv, "m:o:qw:r:t:s:h", lo, NULL)) !=
	       -1) {
		switch (ch) {
		case 'm': model_path = optarg; break;
		case 'o': out = optarg; break;
		case 'q': quick = 1; break;
		case 'w': wdir_arg = optarg; break;
		case 'r': rt_arg = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 's': nseq = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!out || optind != argc || threads < 1 || threads > 16) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	openblas_set_num_threads(1);
	char err[1024];
	static struct model m;
	model_path = model_default_path(model_path);
	if (model_load(model_path, &m, err, sizeof(err)))
		die("%s", err);
	M = &m;
	const struct model_config *mc = &m.cfg;
	char mname[64];
	{
		const char *b = strrchr(model_path, '/');
		snprintf(mname, sizeof(mname), "%s", b ? b + 1 : model_path);
		char *dot = strrchr(mname, '.');
		if (dot)
			*dot = 0;
	}
	char wdir[PATH_MAX];
	if (wdir_arg)
		snprintf(wdir, sizeof(wdir), "%s", wdir_arg);
	else
		snprintf(wdir, sizeof(wdir), "build/weights/%s", mname);
	char wabs[PATH_MAX] = "";
	int have_w = realpath(wdir, wabs) != NULL;
	if (mkdir(out, 0755) < 0 && errno != EEXIST)
		die("%s: %s", out, strerror(errno));

	const uint32_t T = quick ? 256 : model_context(&m);
	const uint32_t P = quick ? 192 : T * 3 / 4;
	if (!nseq)
		nseq = quick ? 2 : 32;
	uint32_t ncopy = dataset_is_bytes(&m) ? (quick ? 2 : 24) : 0;
	uint32_t nneedle = dataset_is_bytes(&m) ? (quick ? 1 : 16) *
	                   NEEDLE_NDEPTH : 0;
	static const double full_ratios[] = {0.5, 0.75, 0.875};
	static const double quick_ratios[] = {0.75};
	const double *ratios = quick ? quick_ratios : full_ratios;
	uint32_t nrat = quick ? 1 : 3;
	time_t t0 = time(NULL);

	struct dataset ev;
	if (dataset_build(&m, DATASET_EVAL, T, nseq, 0, &ev, err, sizeof(err)))
		die("%s", err);
	cases = calloc(ev.n + ncopy + nneedle, sizeof(*cases));
	if (!cases)
		die("out of memory");
	for (uint32_t i = 0; i < ev.n; i++) {
		cases[i].tok = ev.tok + (size_t)i * T;
		cases[i].T = T;
		cases[i].P = P;
	}
	ncases = ev.n;
	if (ncopy)
		ncases += make_copy(cases + ev.n, ncopy);
	uint32_t ncp = ncases - ev.n;
	for (uint32_t i = 0; i < ncases; i++) {
		make_ref(&cases[i]);
		make_kvzip(&cases[i]);
	}
	/* Needles: the full cache first; the cases of a depth where it
	 * reaches NEEDLE_BAR join the policies' cases, the others go. */
	double nd_digit[NEEDLE_NDEPTH], nd_exact[NEEDLE_NDEPTH];
	uint32_t nd_per[NEEDLE_NDEPTH] = {0};
	int nd_pass[NEEDLE_NDEPTH] = {0};
	uint32_t nnd = 0;
	if (nneedle) {
		struct ecase *nc = cases + ncases;
		make_needle(nc, nneedle);
		for (uint32_t i = 0; i < nneedle; i++)
			make_ref(&nc[i]);
		needle_full(nc, nneedle, nd_digit, nd_exact, nd_per);
		for (int d = 0; d < NEEDLE_NDEPTH; d++)
			nd_pass[d] = nd_digit[d] >= NEEDLE_BAR;
		for (uint32_t i = 0; i < nneedle; i++) {
			struct ecase c = nc[i];
			if (nd_pass[c.di]) {
				make_kvzip(&c);
				nc[nnd++] = c;
			} else {
				free(c.tok);
				free(c.ref);
			}
		}
		memset(nc + nnd, 0, sizeof(*nc) * (nneedle - nnd));
		ncases += nnd;
		for (int d = 0; d < NEEDLE_NDEPTH; d++)
			fprintf(stderr, "kvtrim-eval: needle depth %u, full "
			        "cache: per digit %.3f, exact %.3f (%u cases)%s\n",
			        needle_depth[d], nd_digit[d], nd_exact[d],
			        nd_per[d], nd_pass[d] ? "" : ": below the bar, "
			        "not run");
	}
	fprintf(stderr, "kvtrim-eval: %s: %u sequences of %u (prefill %u), "
	        "%u copy cases, %u needle cases; references in %lds\n", mname,
	        ev.n, T, P, ncp, nnd, (long)(time(NULL) - t0));

	/* ---- jobs */
	uint32_t cP = 0, cT = 0, nP = 0, nT = 0;
	for (uint32_t i = ev.n; i < ncases; i++) {
		if (cases[i].kind == C_COPY) {
			cP += cases[i].P;
			cT += cases[i].T;
		} else {
			nP += cases[i].P;
			nT += cases[i].T;
		}
	}
	if (ncp) {
		cP /= ncp;
		cT /= ncp;
	}
	if (nnd) {
		nP /= nnd;
		nT /= nnd;
	}
	/* kvzap calibration on the training split */
	float *zs[2] = {NULL, NULL};
	uint32_t ncal = quick ? 2 : 16;
	static const char *const zname[2] = {"kvzap-linear", "kvzap-mlp"};
	if (have_w) {
		struct dataset cal;
		if (dataset_build(&m, DATASET_TRAIN, T, ncal, 1, &cal, err,
		                  sizeof(err)))
			die("%s", err);
		ncal = cal.n;
		for (int v = 0; v < 2; v++) {
			char d[PATH_MAX + 32];
			snprintf(d, sizeof(d), "%s/%s", wabs, zname[v]);
			zs[v] = kvzap_scores(d, &cal, err, sizeof(err));
			if (!zs[v])
				fprintf(stderr, "kvtrim-eval: %s: %s (skipped)\n",
				        zname[v], err);
		}
		dataset_free(&cal);
	} else {
		fprintf(stderr, "kvtrim-eval: no weights in %s: learned "
		        "policies skipped (run make weights)\n", wdir);
	}
	add_job("full", 0, J_DAEMON, "full", NULL, NULL);
	char s[KVT_SPEC_MAX], sc[KVT_SPEC_MAX], sn[KVT_SPEC_MAX];
	for (uint32_t k = 0; k < nrat; k++) {
		double R = ratios[k];
		snprintf(s, sizeof(s), "random:ratio=%.4f,seed=1", R);
		add_job("random", R, J_DAEMON, s, NULL, NULL);
		snprintf(s, sizeof(s), "streaming:ratio=%.4f,sinks=4", R);
		add_job("streaming", R, J_DAEMON, s, NULL, NULL);
		snprintf(s, sizeof(s), "h2o:ratio=%.4f", R);
		add_job("h2o", R, J_DAEMON, s, NULL, NULL);
		snprintf(s, sizeof(s), "snapkv:ratio=%.4f,window=16,kernel=5", R);
		add_job("snapkv", R, J_DAEMON, s, NULL, NULL);
		snprintf(s, sizeof(s), "tova:ratio=%.4f", R);
		add_job("tova", R, J_DAEMON, s, NULL, NULL);
		for (int v = 0; v < 2; v++) {
			if (!zs[v])
				continue;
			float tau = kvzap_tau(zs[v], ncal, T, P,
			                      RECIPE_KVZAP_WINDOW, R);
			snprintf(s, sizeof(s), "kvzap:model=%s/%s,threshold=%.4f,"
			         "window=%u", wabs, zname[v], tau,
			         RECIPE_KVZAP_WINDOW);
			add_job(zname[v], R, J_DAEMON, s, NULL, NULL)->tau =
				tau;
		}
		if (have_w) {
			snprintf(s, sizeof(s), "fastkvzip:model=%s/fastkvzip."
			         "safetensors,ratio=%.4f,window=16,sinks=4,"
			         "every=16", wabs, R);
			add_job("fastkvzip", R, J_DAEMON, s, NULL, NULL);
			snprintf(s, sizeof(s), "kvpop:model=%s/kvpop.safetensors,"
			         "tokens=%u,delay=%u,sinks=4", wabs,
			         tokens_for(R, P, T), RECIPE_KVPOP_DELAY);
			snprintf(sc, sizeof(sc), "kvpop:model=%s/kvpop.safetensors,"
			         "tokens=%u,delay=%u,sinks=4", wabs,
			         cT ? tokens_for(R, cP, cT) : 1,
			         RECIPE_KVPOP_DELAY);
			snprintf(sn, sizeof(sn), "kvpop:model=%s/kvpop.safetensors,"
			         "tokens=%u,delay=%u,sinks=4", wabs,
			         nT ? tokens_for(R, nP, nT) : 1,
			         RECIPE_KVPOP_DELAY);
			add_job("kvpop", R, J_DAEMON, s, ncp ? sc : NULL,
			        nnd ? sn : NULL);
		}
		add_job("kvzip", R, J_KVZIP, "kvzip (in-process replay)", NULL,
		        NULL);
		add_job("oracle", R, J_ORACLE, "hindsight oracle (in-process "
		        "replay)", NULL, NULL);
	}
	/* kvzap threshold sweep: fixed thresholds from the training split
	 * (sweep_grid), the achieved ratio measured */
	for (int v = 0; v < 2; v++) {
		if (!zs[v])
			continue;
		float grid[64];
		uint32_t ng = sweep_grid(zname[v], zs[v], ncal, T, P,
		                         RECIPE_KVZAP_WINDOW, quick ? 2 : 6,
		                         grid);
		for (uint32_t i = 0; i < ng; i++) {
			snprintf(s, sizeof(s), "kvzap:model=%s/%s,threshold=%.4f,"
			         "window=%u", wabs, zname[v], grid[i],
			         RECIPE_KVZAP_WINDOW);
			struct job *j = add_job(zname[v], 0, J_DAEMON, s, NULL,
			                        NULL);
			j->sweep = 1;
			j->tau = grid[i];
		}
	}
	free(zs[0]);
	free(zs[1]);

	/* ---- one daemon, every tenant registered at once */
	uint32_t maxT = 0;
	for (uint32_t i = 0; i < ncases; i++)
		maxT = cases[i].T > maxT ? cases[i].T : maxT;
	char rt[400];
	if (rt_arg)
		snprintf(rt, sizeof(rt), "%s", rt_arg);
	else
		start_daemon(argv[0], rt, sizeof(rt));
	for (uint32_t k = 0; k < njobs; k++) {
		struct job *j = &jobs[k];
		if (j->kind != J_DAEMON)
			continue;
		static const char *const sfx[C_NKIND] = {"", "-copy",
		                                         "-needle"};
		for (int c = 0; c < C_NKIND; c++) {
			if (c && !j->spec[c][0])
				continue;
			struct engine_opts o;
			memset(&o, 0, sizeof(o));
			char tn[64];
			if (j->sweep)
				snprintf(tn, sizeof(tn), "eval-%.31s-t%.3f%s",
				         j->name, j->tau, sfx[c]);
			else
				snprintf(tn, sizeof(tn), "eval-%.31s-%.3f%s",
				         j->name, j->ratio, sfx[c]);
			o.runtime_dir = rt;
			o.tenant = tn;
			o.policy = j->spec[c];
			o.chunk = CHUNK;
			o.context = maxT;
			if (engine_open(&m, &o, &j->e[c], err, sizeof(err)))
				die("%s (%s): %s", j->name, o.policy, err);
		}
	}
	fprintf(stderr, "kvtrim-eval: %u jobs (%u threads) on %s\n", njobs,
	        threads, rt);
	pthread_t th[16];
	for (int i = 0; i < threads; i++)
		if (pthread_create(&th[i], NULL, worker, NULL))
			die("pthread_create failed");
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	for (uint32_t k = 0; k < njobs; k++)
		for (int c = 0; c < C_NKIND; c++)
			engine_close(jobs[k].e[c]);
	stop_daemon();

	/* ---- results: merge with other models' rows */
	char path[1200];
	snprintf(path, sizeof(path), "%s/quality.csv", out);
	struct row *rows = calloc(1024 + njobs, sizeof(*rows));
	size_t nr = 0;
	FILE *f = fopen(path, "r");
	if (f) {
		char line[1024];
		while (fgets(line, sizeof(line), f) && nr < 1024) {
			if (!strncmp(line, "model,", 6))
				continue;
			if (parse_row(line, &rows[nr]) == 0 &&
			    strcmp(rows[nr].model, mname))
				nr++;
		}
		fclose(f);
	}
	int bad = 0;
	for (uint32_t k = 0; k < njobs; k++) {
		struct job *j = &jobs[k];
		struct row *r = &rows[nr++];
		snprintf(r->model, sizeof(r->model), "%s", mname);
		snprintf(r->policy, sizeof(r->policy), "%.31s", j->name);
		r->target = j->sweep ? NAN : j->ratio;
		r->tau = j->tau;
		r->needle = NAN;
		bad |= j->failed;
		if (j->failed || !j->npos) {
			r->ach = r->kl = r->top1 = r->dnll = r->copy = NAN;
			continue;
		}
		/* needle_acc: per-digit accuracy over the depths where the
		 * full cache reaches the bar (only those cases were run) */
		uint64_t ok = 0, nn = 0;
		for (int d = 0; d < NEEDLE_NDEPTH; d++) {
			ok += j->nd_ok[d];
			nn += j->nd_n[d];
		}
		r->needle = nn ? (double)ok / nn : NAN;
		r->ach = j->nach ? j->ach / j->nach : NAN;
		r->kl = j->kl / j->npos;
		r->top1 = j->top1 / j->npos;
		r->dnll = j->dnll / j->npos;
		r->copy = j->copy_n ? (double)j->copy_ok / j->copy_n : NAN;
	}
	f = fopen(path, "w");
	if (!f)
		die("%s: %s", path, strerror(errno));
	fprintf(f, CSV_HEADER "\n");
	for (size_t i = 0; i < nr; i++)
		write_row(f, &rows[i]);
	fclose(f);
	snprintf(path, sizeof(path), "%s/specs-%s.txt", out, mname);
	f = fopen(path, "w");
	if (f) {
		fprintf(f, "# %s: T %u, prefill %u, %u sequences, %u copy "
		        "cases, %u of %u needle cases run%s\n", mname, T, P,
		        ev.n, ncp, nnd, nneedle, quick ? " (quick)" : "");
		/* The daemon needs absolute weight paths; the committed file
		 * shows them as given (build/weights/...), so it reads the
		 * same on every machine. */
		for (uint32_t k = 0; k < njobs; k++) {
			const struct job *j = &jobs[k];
			if (j->sweep)
				fprintf(f, "%s sweep ", j->name);
			else
				fprintf(f, "%s %.3f ", j->name, j->ratio);
			spec_print(f, j->spec[C_MAIN], wabs, wdir);
			static const char *const lab[C_NKIND] = {
				"", " | copy: ", " | needle: "};
			for (int c = 1; c < C_NKIND; c++)
				if (j->spec[c][0]) {
					fputs(lab[c], f);
					spec_print(f, j->spec[c], wabs, wdir);
				}
			fputc('\n', f);
		}
		fclose(f);
	}
	if (nneedle) {
		snprintf(path, sizeof(path), "%s/needle-%s.txt", out, mname);
		f = fopen(path, "w");
		if (!f)
			die("%s: %s", path, strerror(errno));
		fprintf(f, "# %s key-value needles (kvtrim-eval): cases of %u "
		        "bytes, target + %u distractor records, %u digits; "
		        "chance %.2f per digit\n# a depth is run for the "
		        "policies when the full cache's per-digit top-1 "
		        "accuracy >= %.2f%s\n# full DEPTH CASES DIGIT_ACC "
		        "EXACT_ACC pass|below\n", mname, NEEDLE_LEN,
		        NEEDLE_DISTRACTORS, NEEDLE_DIGITS, 0.1, NEEDLE_BAR,
		        quick ? " (quick)" : "");
		for (int d = 0; d < NEEDLE_NDEPTH; d++)
			fprintf(f, "full %u %u %.4f %.4f %s\n", needle_depth[d],
			        nd_per[d], nd_digit[d], nd_exact[d],
			        nd_pass[d] ? "pass" : "below");
		if (nnd)
			fprintf(f, "# policy TARGET|sweep:TAU DEPTH CASES "
			        "DIGIT_ACC EXACT_ACC\n");
		for (uint32_t k = 0; k < njobs && nnd; k++) {
			const struct job *j = &jobs[k];
			for (int d = 0; d < NEEDLE_NDEPTH; d++) {
				if (!j->nd_cases[d])
					continue;
				if (j->sweep)
					fprintf(f, "policy %s sweep:%.4f", j->name,
					        j->tau);
				else
					fprintf(f, "policy %s %.3f", j->name,
					        j->ratio);
				fprintf(f, " %u %" PRIu64 " %.4f %.4f\n",
				        needle_depth[d], j->nd_cases[d],
				        (double)j->nd_ok[d] / j->nd_n[d],
				        (double)j->nd_exact[d] /
				                j->nd_cases[d]);
			}
		}
		fclose(f);
	}
	write_md(out, rows, nr);
	write_png(out, rows, nr);
	for (size_t i = 0; i < nr; i++)
		if (!strcmp(rows[i].model, mname))
			write_row(stdout, &rows[i]);
	fprintf(stderr, "kvtrim-eval: %s done in %lds\n", mname,
	        (long)(time(NULL) - t0));
	free(rows);
	(void)mc;
	return bad ? 1 : 0;
}
