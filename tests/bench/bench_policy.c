/*
 * bench_policy.c — kvtrim-bench's policy figures at 8B geometry (the lines
 * sgemm_gflops .. kvpop_tokens_per_s and daemon_*_per_token_<policy>, all
 * explained in bench.c's header and docs/bench.md): the scorer kernels in
 * process beside their sgemm floor, kvpop's decide() on one layer, and
 * every policy through kvtrimd, the daemon's CPU time per token read from
 * its process clock.  bench.c's main prints them.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <math.h>

#include "bench.h"
#include "compact.h"
#include "kernels.h"
#include "kvtrim.h"
#include "policy.h"
#include "rndweights.h"

/* --quick (bench_policy_run's quick): smaller budgets and fewer rounds. */
static int quick;
#define B_D 4096u
#define B_L 36u
#define B_H 32u
#define B_KV 8u
#define B_G (B_H / B_KV)
#define B_HD 128u
#define B_N 16u    /* tokens per decode sync */
#define B_LEN 512u /* entries per list (in-process kvpop) */

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

void bench_fill_rnd(float *v, size_t n, uint64_t seed, float scale)
{
	uint64_t x = mix64(seed) | 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		v[i] = ((float)(x >> 40) / 16777216.0f - 0.5f) * scale;
	}
}

static float *rnd(size_t n, uint64_t seed, float scale)
{
	float *v = malloc(n * sizeof(float) + 1);
	if (!v)
		bench_die("out of memory");
	bench_fill_rnd(v, n, seed, scale);
	return v;
}

/* Best of reps of stmt's duration in us. */
#define BEST_US(reps, stmt)                                                    \
	({                                                                     \
		double best_ = 1e30;                                           \
		for (int r_ = 0; r_ < (reps); r_++) {                          \
			double t0_ = bench_now_us();                           \
			stmt;                                                  \
			double dt_ = bench_now_us() - t0_;                     \
			if (dt_ < best_)                                       \
				best_ = dt_;                                   \
		}                                                              \
		best_;                                                         \
	})

static void bench_scorers(struct bench_policy *b)
{
	const uint32_t h = 512, n = B_N;
	float *x = rnd((size_t)n * B_D, 1, 1.0f);
	float *W1 = rnd((size_t)h * B_D, 2, 0.05f), *b1 = rnd(h, 3, 0.1f);
	float *W2 = rnd((size_t)B_KV * h, 4, 0.1f), *b2 = rnd(B_KV, 5, 0.1f);
	float *y = malloc(sizeof(float) * n * h), *hs = malloc(sizeof(float) * n * h);
	int reps = quick ? 20 : 200;
	double t = BEST_US(reps, cblas_sgemm(CblasRowMajor, CblasNoTrans,
	                                     CblasTrans, n, h, B_D, 1.0f, x,
	                                     B_D, W1, B_D, 0.0f, hs, h));
	b->sgemm_gflops = 2.0 * n * h * B_D / t / 1e3;
	t = BEST_US(reps, scorer_mlp_cpu(x, n, B_D, W1, b1, h, W2, b2, B_KV, y,
	                                 hs));
	b->mlp_tps = n / t * 1e6;
	b->mlp_gflops = 2.0 * n * ((double)h * B_D + (double)B_KV * h) / t / 1e3;
	float *Wl = rnd((size_t)B_KV * B_D, 6, 0.05f);
	t = BEST_US(reps, scorer_linear_cpu(x, n, B_D, Wl, b2, B_KV, y));
	b->lin_tps = n / t * 1e6;
	const uint32_t G = B_G, dp = 16, S = 16;
	float *Wq = rnd((size_t)B_KV * G * dp * B_D, 7, 0.05f);
	float *cq = rnd((size_t)B_KV * G * dp, 8, 0.1f);
	float *Wk = rnd((size_t)B_KV * dp * B_D, 9, 0.05f);
	float *g1 = rnd(dp, 10, 1.0f), *sk = rnd((size_t)B_KV * S * dp, 11, 1.0f);
	float *bias = rnd((size_t)B_KV * G, 12, 1.0f);
	float *sc = malloc(sizeof(float) * n * B_KV * (G + 1) * dp);
	t = BEST_US(reps, sink_gate_cpu(x, n, B_D, B_KV, G, dp, S, Wq, cq, Wk,
	                                g1, g1, sk, bias, y, sc));
	b->fkv_tps = n / t * 1e6;
	free(x); free(W1); free(b1); free(W2); free(b2); free(y); free(hs);
	free(Wl); free(Wq); free(cq); free(Wk); free(g1); free(sk); free(bias);
	free(sc);
}

/*
 * attn_band_us: attn_band_cpu (the attention policies' weights of B_N
 * staged queries of a KV head's B_G query heads against a list of 1024
 * f32 entries, the logits in its fixed order: kernels.h) beside its floor,
 * cblas_sgemm of the same product on keys already gathered (what the
 * kernel computed before the order was fixed), attn_band_sgemm_us.
 */
static void bench_band(struct bench_policy *b)
{
	const uint32_t len = 1024, rows = B_N * B_G, pt = 16;
	float *q = rnd((size_t)rows * B_HD, 13, 1.0f);
	float *keys = rnd((size_t)len * B_HD * 2, 14, 1.0f);
	float *lse = malloc(sizeof(float) * rows), *w = malloc(sizeof(float) *
	                                                        rows * len);
	float *ks = malloc(sizeof(float) * len * B_HD);
	uint32_t *kpos = malloc(sizeof(uint32_t) * len), qpos[B_N];
	void *pages[1024 / 16];
	if (!lse || !w || !ks || !kpos)
		bench_die("out of memory");
	/* pages [K: pt rows][V: pt rows] of f32, as shm.h lays them out */
	for (uint32_t p = 0; p < len / pt; p++)
		pages[p] = keys + (size_t)p * 2 * pt * B_HD;
	for (uint32_t i = 0; i < len; i++)
		kpos[i] = i;
	for (uint32_t t = 0; t < B_N; t++)
		qpos[t] = len + t;
	for (uint32_t r = 0; r < rows; r++)
		lse[r] = 8.0f;
	const float scale = 1.0f / sqrtf((float)B_HD);
	int reps = quick ? 20 : 200;
	b->band_us = BEST_US(reps, attn_band_cpu(q, lse, qpos, B_N, B_G, pages,
	                                         pt, B_HD, KVT_DTYPE_F32, kpos,
	                                         len, scale, w, ks));
	b->band_sgemm_us = BEST_US(reps, cblas_sgemm(
		CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)len,
		(int)B_HD, scale, q, B_HD, ks, B_HD, 0.0f, w, (int)len));
	free(q); free(keys); free(lse); free(w); free(ks); free(kpos);
}

/*
 * Writes random seeded weights of a learned policy for all 36 layers into
 * path (rndweights.h): kvzap MLP hidden 512 (output bias -4, so about half
 * the entries fall below the default threshold), fastkvzip D' 16 S 16 (the
 * released gates), kvpop r 16 m 64.
 */
static void bench_weights(const char *name, const char *path)
{
	const struct kvt_geometry g = {B_L, B_H, B_KV, B_HD, B_D};
	char err[KVT_ERRTEXT_MAX];
	if (th_random_weights(name, &g, &TH_WSHAPE_FULL, 0, path, err,
	                      sizeof(err)))
		bench_die(err);
}

/*
 * kvpop_tokens_per_s: kvpop's policy_decide in process on one layer, one
 * sequence's sync of B_N decode tokens, lists of B_LEN entries per KV head
 * (f16 pages), staged inputs random, lse log(len) so weights stay finite.
 * Returns the best time of one decide call in us.
 */
static double bench_kvpop_decide(const char *spec)
{
	struct policy_geom ge = {B_L, B_H, B_KV, B_HD, B_D, 16, KVT_DTYPE_F16,
	                         B_N};
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX];
	if (policy_create(spec, &ge, &p, err, sizeof(err)))
		bench_die(err);
	uint32_t len = B_LEN + B_N, pages = (len + 15) / 16;
	size_t page_bytes = 2ull * 16 * B_HD * 2;
	char *mem = malloc(B_KV * pages * page_bytes);
	float *kf = rnd((size_t)B_KV * pages * 32 * B_HD, 21, 0.2f);
	dtype_from_f32(kf, KVT_DTYPE_F16, mem, (size_t)B_KV * pages * 32 * B_HD);
	free(kf);
	void **pv = malloc(sizeof(void *) * B_KV * pages);
	uint32_t *pos = malloc(sizeof(uint32_t) * len);
	uint32_t ef = p->entry_floats ? p->entry_floats : 1;
	float *ent = calloc((size_t)B_KV * len * ef, sizeof(float));
	uint8_t *drop = malloc((size_t)B_KV * len);
	uint8_t *state = calloc(p->layer_state_bytes + 1, 1);
	float *x = rnd((size_t)B_N * B_D, 22, 1.0f);
	float *q = rnd((size_t)B_N * B_H * B_HD, 23, 0.2f);
	float *lse = malloc(sizeof(float) * B_N * B_H);
	for (uint32_t i = 0; i < B_N * B_H; i++)
		lse[i] = logf((float)len); /* weights ~ 1 / len */
	for (uint32_t i = 0; i < B_KV * pages; i++)
		pv[i] = mem + i * page_bytes;
	struct policy_head heads[B_KV];
	double best = 1e30;
	for (int rep = 0; rep < (quick ? 3 : 20); rep++) {
		/* n_seen beyond len so the delay rule sees an old list */
		for (uint32_t i = 0; i < len; i++)
			pos[i] = 4096 + i;
		for (uint32_t g = 0; g < B_KV; g++) {
			memset(drop + (size_t)g * len, 0, len);
			heads[g] = (struct policy_head){
				pos, p->entry_floats ? ent + (size_t)g * len * ef : NULL,
				pv + (size_t)g * pages, len, drop + (size_t)g * len};
		}
		struct policy_layer pl = {
			.layer = 0, .phase = KVT_PHASE_DECODE, .n_new = B_N,
			.n_seen = len + 4096, .x = x, .q = q, .lse = lse,
			.heads = heads,
			.state = p->layer_state_bytes ? state : NULL};
		double t0 = bench_now_us();
		if (policy_decide(p, &pl))
			bench_die("policy_decide");
		double dt = bench_now_us() - t0;
		if (dt < best)
			best = dt;
	}
	free(mem); free(pv); free(pos); free(ent); free(drop); free(state);
	free(x); free(q); free(lse);
	policy_free(p);
	return best;
}

/* ------------------------------------- daemon CPU per token, through kvtrimd */

#define D_R 16u          /* kinds of key rows per (layer, KV head) */
#define D_PREFILL_SYNC 128u
#define D_HEADROOM 128u  /* the largest sync: a prefill chunk */
#define D_LOOKBACK 64u   /* snapkv's default window, the largest lookback */

/* The daemon's CPU time (every thread), us. */
struct dcpu {
	pid_t pid;
	clockid_t clk;
	int have_clk;
};

static double dcpu_us(const struct dcpu *d)
{
	struct timespec ts;
	if (d->have_clk && !clock_gettime(d->clk, &ts))
		return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
	/* Fallback: utime + stime of /proc/PID/stat, clock ticks. */
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)d->pid);
	FILE *f = fopen(path, "r");
	if (!f)
		bench_die("cannot read the daemon's /proc stat");
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	unsigned long long ut = 0, st = 0;
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
	                 "%llu %llu", &ut, &st) != 2)
		bench_die("cannot parse the daemon's /proc stat");
	return (double)(ut + st) * 1e6 / (double)sysconf(_SC_CLK_TCK);
}

void bench_ctl_stats(const char *bin_dir, const char *dir,
                     const char *const *keys, double *vals, int n)
{
	char cmd[1400], line[256], key[128];
	for (int i = 0; i < n; i++)
		vals[i] = NAN;
	snprintf(cmd, sizeof(cmd), "'%s/kvtrimctl' --runtime-dir '%s' stats "
	         "2>/dev/null", bin_dir, dir);
	FILE *p = popen(cmd, "r");
	if (!p)
		return;
	double v;
	while (fgets(line, sizeof(line), p)) {
		if (sscanf(line, "%127s %lf", key, &v) != 2)
			continue;
		for (int i = 0; i < n; i++)
			if (!strcmp(key, keys[i]))
				vals[i] = v;
	}
	pclose(p);
}

/*
 * The daemon's own sync time so far, us, from `kvtrimctl stats`:
 * sync_us_total where the daemon has it, else sync_apply_seconds_sum (the
 * time in the tenant's sync apply).  NAN when neither could be read.
 */
static double ctl_sync_us(const char *bin_dir, const char *dir)
{
	static const char *const keys[] = {"sync_us_total",
	                                   "sync_apply_seconds_sum"};
	double v[2];
	bench_ctl_stats(bin_dir, dir, keys, v, 2);
	return isnan(v[0]) ? v[1] * 1e6 : v[0];
}

/*
 * A synthetic engine at 8B geometry.  Keys are drawn from D_R fixed rows
 * per (layer, KV head) (which one: a hash of position, layer and head), so
 * the true log-sum-exp of a query over its list is a sum over D_R logits
 * weighted by how many entries of each kind the list holds: lse stays
 * exact (the engine's causal attention over what the daemon kept) at a
 * cost independent of the list length.  V's element 0 carries the kind
 * (raw bits), read back after each sync to recount the kept entries.
 */
struct deng {
	kvt_client *c;
	kvt_seq seq;
	uint32_t n_seen;
	unsigned needs;
	uint16_t *kb, *vb; /* [L][KV][R][HD] f16 rows of K and V */
	float *kf;         /* [L][KV][R][HD] the K rows as float */
	uint32_t *cnt;     /* [L][KV][R] committed entries of each kind */
	float *qh;         /* [KV][n][G][HD] one layer's queries by KV head */
	float *s;          /* [n][G][R] logits of one KV head */
};

static uint32_t d_kind(uint32_t pos, uint32_t l, uint32_t h)
{
	return (uint32_t)(mix64(((uint64_t)pos << 16) ^ (l << 8) ^ h) % D_R);
}

static void deng_init(struct deng *e)
{
	size_t nr = (size_t)B_L * B_KV * D_R * B_HD;
	e->kb = malloc(nr * 2);
	e->vb = malloc(nr * 2);
	e->kf = malloc(nr * sizeof(float));
	e->cnt = calloc((size_t)B_L * B_KV * D_R, sizeof(uint32_t));
	e->qh = malloc(sizeof(float) * B_KV * D_HEADROOM * B_G * B_HD);
	e->s = malloc(sizeof(float) * D_HEADROOM * B_G * D_R);
	float *tmp = malloc(nr * sizeof(float));
	if (!e->kb || !e->vb || !e->kf || !e->cnt || !e->qh || !e->s || !tmp)
		bench_die("out of memory");
	/* keys in [-1, 1): with queries in [-3, 3) the logits q.k/sqrt(hd)
	 * have a standard deviation near 1, so attention is far from
	 * uniform */
	bench_fill_rnd(tmp, nr, 31, 2.0f);
	dtype_from_f32(tmp, KVT_DTYPE_F16, e->kb, nr);
	dtype_to_f32(e->kb, KVT_DTYPE_F16, e->kf, nr);
	bench_fill_rnd(tmp, nr, 32, 2.0f);
	dtype_from_f32(tmp, KVT_DTYPE_F16, e->vb, nr);
	for (size_t r = 0; r < nr / B_HD; r++)
		e->vb[r * B_HD] = (uint16_t)(r % D_R);
	free(tmp);
}

static void deng_fini(struct deng *e)
{
	free(e->kb); free(e->vb); free(e->kf); free(e->cnt); free(e->qh);
	free(e->s);
}

/* Recounts the kinds of every list's kept entries after a sync. */
static void deng_recount(struct deng *e)
{
	const uint32_t P = 16;
	for (uint32_t l = 0; l < B_L; l++)
		for (uint32_t h = 0; h < B_KV; h++) {
			struct kvt_list li;
			uint32_t *cnt = e->cnt + ((size_t)l * B_KV + h) * D_R;
			memset(cnt, 0, sizeof(uint32_t) * D_R);
			if (kvt_list_get(e->c, e->seq, l, h, &li))
				bench_die("kvt_list_get");
			for (uint32_t i = 0; i < li.len; i++) {
				const uint16_t *pg = kvt_page_ptr(e->c,
				                                  li.pages[i / P]);
				if (!pg)
					bench_die("kvt_page_ptr");
				uint16_t r = pg[(P + i % P) * B_HD];
				if (r >= D_R)
					bench_die("a V row lost its kind");
				cnt[r]++;
			}
		}
}

/* Appends n tokens to every list, stages their inputs, syncs. */
static void deng_step(struct deng *e, uint32_t n, enum kvt_phase phase)
{
	const size_t rb = B_HD * 2;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t pos = e->n_seen + k;
		for (uint32_t l = 0; l < B_L; l++)
			for (uint32_t h = 0; h < B_KV; h++) {
				void *kp, *vp;
				if (kvt_kv_ptr(e->c, e->seq, l, h, k, &kp, &vp))
					bench_die("kvt_kv_ptr");
				size_t row = ((size_t)l * B_KV + h) * D_R +
				             d_kind(pos, l, h);
				memcpy(kp, e->kb + row * B_HD, rb);
				memcpy(vp, e->vb + row * B_HD, rb);
			}
	}
	for (uint32_t l = 0; l < B_L && (e->needs & POLICY_NEED_STAGED); l++) {
		for (uint32_t k = 0; k < n; k++) {
			uint32_t pos = e->n_seen + k;
			uint64_t seed = ((uint64_t)pos << 8) ^ l;
			if (e->needs & POLICY_NEED_X) {
				float *x = kvt_stage_x(e->c, e->seq, l, pos);
				if (!x)
					bench_die("kvt_stage_x");
				bench_fill_rnd(x, B_D, seed * 2, 3.4f); /* RMS ~ 1 */
			}
			if (!(e->needs & (POLICY_NEED_Q | POLICY_NEED_LSE)))
				continue;
			float *q = kvt_stage_q(e->c, e->seq, l, pos);
			if (!q)
				bench_die("kvt_stage_q");
			bench_fill_rnd(q, (size_t)B_H * B_HD, seed * 2 + 1, 6.0f);
			for (uint32_t h = 0; h < B_KV; h++)
				memcpy(e->qh + (((size_t)h * n + k) * B_G) * B_HD,
				       q + (size_t)h * B_G * B_HD,
				       sizeof(float) * B_G * B_HD);
		}
		if (!(e->needs & (POLICY_NEED_Q | POLICY_NEED_LSE)))
			continue;
		for (uint32_t h = 0; h < B_KV; h++) {
			const size_t lh = (size_t)l * B_KV + h;
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
			            (int)(n * B_G), D_R, B_HD,
			            1.0f / sqrtf((float)B_HD),
			            e->qh + (size_t)h * n * B_G * B_HD, B_HD,
			            e->kf + lh * D_R * B_HD, B_HD, 0.0f, e->s, D_R);
			uint32_t c[D_R];
			memcpy(c, e->cnt + lh * D_R, sizeof(c));
			for (uint32_t k = 0; k < n; k++) {
				uint32_t pos = e->n_seen + k;
				c[d_kind(pos, l, h)]++; /* causal: itself too */
				float *lse = kvt_stage_lse(e->c, e->seq, l, pos);
				if (!lse)
					bench_die("kvt_stage_lse");
				for (uint32_t j = 0; j < B_G; j++) {
					const float *sr = e->s + ((size_t)k * B_G + j) * D_R;
					float m = -INFINITY;
					for (uint32_t r = 0; r < D_R; r++)
						if (c[r] && sr[r] > m)
							m = sr[r];
					double sum = 0;
					for (uint32_t r = 0; r < D_R; r++)
						if (c[r])
							sum += c[r] * exp(sr[r] - m);
					lse[h * B_G + j] = m + (float)log(sum);
				}
			}
		}
	}
	struct kvt_sync_item it = {e->seq, n, phase, 0, 0};
	int rv = kvt_sync(e->c, &it, 1);
	if (rv) {
		fprintf(stderr, "kvtrim-bench: kvt_sync: %s: %s\n",
		        kvt_strerror(rv), kvt_last_error(e->c));
		exit(1);
	}
	e->n_seen += n;
	if (e->needs & (POLICY_NEED_Q | POLICY_NEED_LSE))
		deng_recount(e);
}

/*
 * One policy through kvtrimd: a tenant at 8B geometry, one sequence,
 * prefill of `prompt` tokens in syncs of 128, one decode sync (snapkv
 * compresses the prompt there), then `reps` rounds of `dec` decode tokens
 * in syncs of 16.  The daemon's CPU time over each round / dec; the best
 * round is kept, with the daemon's own sync time of that round.
 */
static void bench_daemon_policy(const char *bin_dir, const char *dir,
                                const struct dcpu *d, const char *name,
                                const char *spec, uint32_t prompt,
                                uint32_t dec, int reps, double *us_tok,
                                double *sync_tok, double *prefill_tok)
{
	struct deng e;
	memset(&e, 0, sizeof(e));
	for (size_t i = 0; i < policy_count(); i++)
		if (!strcmp(policy_at(i)->name, name))
			e.needs = policy_at(i)->needs;
	deng_init(&e);
	struct kvt_config c;
	char err[KVT_ERRTEXT_MAX] = "", tenant[KVT_NAME_MAX];
	memset(&c, 0, sizeof(c));
	snprintf(tenant, sizeof(tenant), "bench-%s", name);
	c.runtime_dir = dir;
	c.tenant = tenant;
	c.geo = (struct kvt_geometry){B_L, B_H, B_KV, B_HD, B_D};
	c.dtype = KVT_DTYPE_F16;
	c.page_tokens = 16;
	c.max_seqs = 1;
	c.max_tokens = 2048;
	c.headroom = D_HEADROOM;
	c.stage_tokens = (e.needs & POLICY_NEED_STAGED) ? D_HEADROOM + D_LOOKBACK
	                                                : 0;
	c.policy = spec;
	c.timeout_ms = 120000;
	int rv = kvt_connect(&c, &e.c, err);
	if (rv) {
		fprintf(stderr, "kvtrim-bench: kvt_connect(%s): %s: %s\n", spec,
		        kvt_strerror(rv), err);
		exit(1);
	}
	if (kvt_seq_open(e.c, &e.seq))
		bench_die("seq_open");
	double c0 = dcpu_us(d);
	for (uint32_t done = 0; done < prompt; done += D_PREFILL_SYNC)
		deng_step(&e, prompt - done < D_PREFILL_SYNC ? prompt - done
		                                             : D_PREFILL_SYNC,
		          KVT_PHASE_PREFILL);
	deng_step(&e, B_N, KVT_PHASE_DECODE);
	*prefill_tok = (dcpu_us(d) - c0) / prompt;
	*us_tok = 1e30;
	*sync_tok = NAN;
	for (int r = 0; r < reps; r++) {
		double s0 = ctl_sync_us(bin_dir, dir);
		usleep(20000); /* the daemon closes kvtrimctl's pipe */
		double t0 = dcpu_us(d);
		for (uint32_t i = 0; i < dec; i += B_N)
			deng_step(&e, B_N, KVT_PHASE_DECODE);
		double t1 = dcpu_us(d);
		double s1 = ctl_sync_us(bin_dir, dir);
		if ((t1 - t0) / dec < *us_tok) {
			*us_tok = (t1 - t0) / dec;
			*sync_tok = (s1 - s0) / dec;
		}
	}
	kvt_seq_close(e.c, e.seq);
	kvt_disconnect(e.c);
	deng_fini(&e);
}

void bench_policy_run(struct bench_policy *b, const char *bin_dir,
                      const char *dir, pid_t daemon, int is_quick)
{
	quick = is_quick;
	bench_scorers(b);
	bench_band(b);
	struct dcpu d = {.pid = daemon};
	d.have_clk = !clock_getcpuclockid(daemon, &d.clk);
	/* quick: a short prompt and small budgets, so evictions still run */
	uint32_t prompt = quick ? 128 : 512, dec = quick ? 32 : 128;
	uint32_t B = quick ? 64 : 512;
	int reps = quick ? 1 : 3;
	char wpath[128];
	static const char *const names[BENCH_N_POL] = {
		"full", "random", "streaming", "h2o", "snapkv", "tova",
		"kvzap", "fastkvzip", "kvpop"};
	for (int i = 0; i < BENCH_N_POL; i++) {
		const char *nm = names[i];
		char spec[KVT_SPEC_MAX];
		int learned = !strcmp(nm, "kvzap") || !strcmp(nm, "fastkvzip") ||
		              !strcmp(nm, "kvpop");
		if (learned) {
			snprintf(wpath, sizeof(wpath), "%s/%s.safetensors", dir, nm);
			bench_weights(nm, wpath);
		}
		if (!strcmp(nm, "full"))
			snprintf(spec, sizeof(spec), "full");
		else if (!strcmp(nm, "snapkv")) /* ratio 0.5 of the prompt */
			snprintf(spec, sizeof(spec), "snapkv");
		else if (!strcmp(nm, "kvzap")) /* window 128, threshold -4 */
			snprintf(spec, sizeof(spec), "kvzap:model=%s", wpath);
		else if (learned) /* fastkvzip: every 128; kvpop: delay 32 */
			snprintf(spec, sizeof(spec), "%s:model=%s,tokens=%u", nm,
			         wpath, B);
		else
			snprintf(spec, sizeof(spec), "%s:tokens=%u", nm, B);
		if (!strcmp(nm, "kvpop")) {
			/* kvpop alone on one layer: tokens scored per second */
			char s2[KVT_SPEC_MAX];
			snprintf(s2, sizeof(s2), "kvpop:model=%s,tokens=%u", wpath,
			         B_LEN);
			b->kvpop_tps = B_N / bench_kvpop_decide(s2) * 1e6;
		}
		b->names[i] = nm;
		bench_daemon_policy(bin_dir, dir, &d, nm, spec, prompt, dec, reps,
		                    &b->us_per_token[i], &b->sync_us[i],
		                    &b->prefill_us[i]);
		if (learned)
			unlink(wpath);
	}
	b->n = BENCH_N_POL;
}
