/*
 * smollm2.c — kvtrim-bench's SmolLM2-135M-Instruct lines (docs/bench.md,
 * "SmolLM2", lists every line, the policies and the goal): the reference
 * engine (engine/) on the real model from `make models`, its KV cache in a
 * kvtrimd this file starts (f32 pages of 16 entries), one OpenBLAS thread
 * (bench.c's main sets it) for the engine and its floors alike.  Skipped,
 * with the reason on stderr and in the output, when the model is not in
 * the cache; the learned policies' lines when weights/smollm2/ is absent.
 *
 * The long contexts are filled synthetically (S2_R random K/V kinds per
 * list with the model's RMS, staged x from a dense pass, q/lse exact over
 * what was written; docs/bench.md says how), synced as prefill so the
 * policy evicts as it would; then the real model decodes real tokens over
 * those caches, and that step is what is timed.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "engine.h"
#include "gguf.h"
#include "kvtrim.h"
#include "model.h"
#include "model_files.h"
#include "tokenizer.h"

#define S2_B 8u             /* sequences of the decode batch */
#define S2_PREFILL 512u     /* tokens of the real prefill */
#define S2_PREFILL_CHUNK 64u
#define S2_FILL_CHUNK 64u   /* tokens per synthetic sync (the headroom) */
#define S2_WINDOW 64u       /* snapkv's default observation window */
#define S2_R 64u            /* synthetic K/V rows per (layer, KV head) */
#define S2_XPOS0 64u        /* x of kind r: the text's position S2_XPOS0 + r */
#define S2_WARM 1u
#define S2_MEAS 3u
#define S2_PAGE 16u
/* Full 8 x 8K f32: 8 x 30 x 3 lists x 513 pages x 8 KiB = 2.8 GiB; the
 * pool leaves room so high_watermark (0.9) never tightens anything. */
#define S2_POOL "3584M"
#define S2_POOL_BYTES (3584ull << 20)
#define S2_TEXT "tests/fixtures/text/english.txt"
/* The trained scorers that ship with kvtrim, and their calibration. */
#define S2_WEIGHTS "weights/smollm2"

#define N_CTX 3
enum { P_FULL, P_STREAMING, P_SNAPKV, P_KVZAP, P_FASTKVZIP, P_KVPOP, N_POL };
static const uint32_t ctx_tokens[N_CTX] = {1024, 4096, 8192};
static const char *const ctx_name[N_CTX] = {"1k", "4k", "8k"};
static const char *const pol_name[N_POL] = {"full", "streaming", "snapkv",
                                            "kvzap", "fastkvzip", "kvpop"};

static struct {
	char why[1100];     /* non-empty: skipped */
	char wwhy[600];     /* non-empty: the learned policies' lines skipped */
	char failed[1400];  /* non-empty: a measurement failed (the reason) */
	int n_ctx;          /* contexts measured */
	float kvzap_tau;    /* kvzap-mlp's threshold calibrated for 0.75 */
	double prefill_tps, sgemm_tps, sgemm_decode_ms;
	double ms[N_CTX][N_POL], kv[N_CTX][N_POL];
} s2;

/* What the model's own cache looks like, from the real prefill. */
struct s2_scale {
	float *k_rms, *v_rms; /* [L][KV] */
	float *q_rms;         /* [L] */
	float *x;             /* [L][S2_R][dim] real attention inputs */
};

static int s2_learned(int p)
{
	return p == P_KVZAP || p == P_FASTKVZIP || p == P_KVPOP;
}

/* Records the first failure's reason (the phase then exits non-zero). */
static void s2_fail(const char *what, const char *why)
{
	if (!s2.failed[0])
		snprintf(s2.failed, sizeof(s2.failed), "%.200s: %.1100s", what,
		         why);
	fprintf(stderr, "kvtrim-bench: smollm2 %s: %s\n", what, why);
}

static uint64_t s2_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Uniform in [-a, a) from a counter. */
static float s2_rnd(uint64_t *st, float a)
{
	*st = s2_mix(*st + 0x9e3779b97f4a7c15ull);
	return a * (float)((double)(*st >> 11) * 0x1p-52 - 1.0);
}

/* ---------------------------------------------------------- daemon */

static pid_t s2_daemon(const char *bin_dir, const char *dir)
{
	/* One engine holds the whole pool: no share is kept for others. */
	const char *const args[] = {"--backend", "cpu", "--pool-size", S2_POOL,
	                            "--tenant-memory-max", "4G",
	                            "--expected-tenants", "1", NULL};
	return bench_spawn_daemon(bin_dir, dir, args);
}

static int s2_open(const struct model *m, const char *dir, const char *tenant,
                   const char *policy, uint32_t batch, uint32_t context,
                   uint32_t chunk, struct engine **e)
{
	struct engine_opts o;
	memset(&o, 0, sizeof(o));
	o.runtime_dir = dir;
	o.tenant = tenant;
	o.policy = policy;
	o.dtype = KVT_DTYPE_F32;
	o.page_tokens = S2_PAGE;
	o.context = context;
	o.chunk = chunk;
	/* the largest sync plus snapkv's lookback */
	o.stage_tokens = chunk + S2_WINDOW;
	o.quota_bytes = S2_POOL_BYTES;
	o.timeout_ms = 600000; /* snapkv compresses 8 x 8K in one sync */
	o.batch = batch;
	char err[KVT_ERRTEXT_MAX + 128];
	int rc = engine_open(m, &o, e, err, sizeof(err));
	if (rc)
		fprintf(stderr, "kvtrim-bench: smollm2 %s: engine_open: %s\n",
		        tenant, err);
	return rc;
}

/* ---------------------------------------------------------- prefill */

/* RMS of K and V per (layer, KV head) over sequence 0's lists. */
static int s2_measure_kv(const struct model *m, struct engine *e,
                         struct s2_scale *sc)
{
	const struct model_config *c = &m->cfg;
	const uint32_t hd = c->head_dim, P = S2_PAGE;
	kvt_client *cl = engine_client(e);
	kvt_seq seq = engine_seq(e);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		for (uint32_t g = 0; g < c->n_kv_heads; g++) {
			struct kvt_list li;
			if (kvt_list_get(cl, seq, l, g, &li) || !li.len)
				return -1;
			double sk = 0, sv = 0;
			for (uint32_t i = 0; i < li.len; i++) {
				const float *pg = kvt_page_ptr(cl, li.pages[i / P]);
				if (!pg)
					return -1;
				const float *kr = pg + (size_t)(i % P) * hd;
				const float *vr = kr + (size_t)P * hd;
				for (uint32_t j = 0; j < hd; j++) {
					sk += (double)kr[j] * kr[j];
					sv += (double)vr[j] * vr[j];
				}
			}
			sc->k_rms[l * c->n_kv_heads + g] =
				(float)sqrt(sk / ((double)li.len * hd));
			sc->v_rms[l * c->n_kv_heads + g] =
				(float)sqrt(sv / ((double)li.len * hd));
		}
	}
	return 0;
}

/*
 * The model's real attention inputs x at positions S2_XPOS0 .. + S2_R of
 * the text, from a dense pass (model_dense records them), and the RMS of
 * q = Wq x per layer over those rows (RoPE rotates pairs, so it keeps the
 * norm): the synthetic fill's x and q scale.
 */
static int s2_measure_x(const struct model *m, const int32_t *tok,
                        struct s2_scale *sc)
{
	const struct model_config *c = &m->cfg;
	const uint32_t T = S2_XPOS0 + S2_R, d = c->dim;
	struct model_dense dn;
	if (model_dense_init(&dn, m, T, 1))
		return -1;
	float *q = malloc(sizeof(float) * S2_R * d);
	int rc = !q || model_dense_step(&dn, tok, T, NULL);
	for (uint32_t l = 0; !rc && l < c->n_layers; l++) {
		float *xl = sc->x + (size_t)l * S2_R * d;
		memcpy(xl, dn.xs + ((size_t)l * T + S2_XPOS0) * d,
		       sizeof(float) * S2_R * d);
		model_matmul(q, xl, m->wq + (size_t)l * d * d, S2_R, d, d);
		double sq = 0;
		for (size_t j = 0; j < (size_t)S2_R * d; j++)
			sq += (double)q[j] * q[j];
		sc->q_rms[l] = (float)sqrt(sq / ((double)S2_R * d));
	}
	free(q);
	model_dense_free(&dn);
	return rc ? -1 : 0;
}

/* The real prefill through kvtrimd: best tokens/s of 2 runs; fills sc from
 * the cache it leaves. */
static double s2_prefill(const struct model *m, const char *dir,
                         const int32_t *tok, uint32_t n, struct s2_scale *sc)
{
	struct engine *e;
	if (s2_open(m, dir, "smollm2-prefill", "full", 1, model_context(m),
	            S2_PREFILL_CHUNK, &e)) {
		s2_fail("prefill", "the engine did not open");
		return NAN;
	}
	double best = 1e30;
	for (int rep = 0; rep < 2; rep++) {
		if (rep && engine_reset(e))
			break;
		double t0 = bench_now_us();
		if (engine_feed(e, tok, n, KVT_PHASE_PREFILL, NULL)) {
			s2_fail("prefill", engine_error(e));
			engine_close(e);
			return NAN;
		}
		double dt = bench_now_us() - t0;
		best = dt < best ? dt : best;
	}
	int bad = s2_measure_kv(m, e, sc);
	engine_close(e);
	if (bad) {
		s2_fail("prefill", "cannot read the prefill's cache back");
		return NAN;
	}
	return n / best * 1e6;
}

/* The linear layers of one forward of k tokens (and the classifier when
 * cls), cblas_sgemm alone (model_matmul), on the model's weights. */
static void s2_gemms(const struct model *m, uint32_t k, int cls, float *x,
                     float *y)
{
	const struct model_config *c = &m->cfg;
	const size_t d = c->dim, kv = c->kv_dim, hid = c->hidden_dim;
	for (uint32_t l = 0; l < c->n_layers; l++) {
		model_matmul(y, x, m->wq + l * d * d, k, d, d);
		model_matmul(y, x, m->wk + l * kv * d, k, d, kv);
		model_matmul(y, x, m->wv + l * kv * d, k, d, kv);
		model_matmul(y, x, m->wo + l * d * d, k, d, d);
		model_matmul(y, x, m->w1 + l * hid * d, k, d, hid);
		model_matmul(y, x, m->w3 + l * hid * d, k, d, hid);
		model_matmul(y, x, m->w2 + l * d * hid, k, hid, d);
	}
	if (cls)
		model_matmul(y, x, m->wcls, k, d, c->vocab_size);
}

/* Best time of reps runs of n tokens in calls of chunk rows, us. */
static double s2_sgemm_us(const struct model *m, uint32_t n, uint32_t chunk,
                          int cls, int reps)
{
	const struct model_config *c = &m->cfg;
	size_t w = c->hidden_dim > c->dim ? c->hidden_dim : c->dim;
	size_t wy = cls && c->vocab_size > w ? c->vocab_size : w;
	float *x = malloc(sizeof(float) * chunk * w);
	float *y = malloc(sizeof(float) * chunk * wy);
	if (!x || !y) {
		free(x);
		free(y);
		return NAN;
	}
	uint64_t st = 5;
	for (size_t i = 0; i < chunk * w; i++)
		x[i] = s2_rnd(&st, 1.0f);
	double best = 1e30;
	for (int r = 0; r < reps; r++) {
		double t0 = bench_now_us();
		for (uint32_t i = 0; i < n; i += chunk)
			s2_gemms(m, n - i < chunk ? n - i : chunk, cls, x, y);
		double dt = bench_now_us() - t0;
		best = dt < best ? dt : best;
	}
	free(x);
	free(y);
	return best;
}

/* ---------------------------------------------------------- decode */

/* The synthetic rows and the counts of each kind per list. */
struct s2_fill {
	const struct model *m;
	struct engine *e;
	uint32_t inputs; /* KVT_INPUT_* the tenant's policy reads */
	float *k, *v;   /* [L][KV][R][hd] */
	uint32_t *cnt;  /* [B][L][KV][R] entries of each kind written */
	const float *q_rms;
	const float *x; /* [L][R][dim] */
	struct kvt_sync_item items[S2_B];
};

static uint32_t s2_kind(uint32_t s, uint32_t pos, uint32_t l, uint32_t g)
{
	return (uint32_t)(s2_mix(((uint64_t)s << 48) ^ ((uint64_t)pos << 16) ^
	                         (l << 8) ^ g) % S2_R);
}

static int s2_fill_init(struct s2_fill *f, const struct model *m,
                        const struct s2_scale *sc)
{
	const struct model_config *c = &m->cfg;
	const size_t lists = (size_t)c->n_layers * c->n_kv_heads;
	f->m = m;
	f->k = malloc(sizeof(float) * lists * S2_R * c->head_dim);
	f->v = malloc(sizeof(float) * lists * S2_R * c->head_dim);
	f->cnt = malloc(sizeof(uint32_t) * S2_B * lists * S2_R);
	f->q_rms = sc->q_rms;
	f->x = sc->x;
	if (!f->k || !f->v || !f->cnt)
		return -1;
	uint64_t st = 17;
	const float u = sqrtf(3.0f); /* uniform [-a, a) has RMS a / sqrt(3) */
	for (size_t li = 0; li < lists; li++)
		for (size_t i = 0; i < (size_t)S2_R * c->head_dim; i++) {
			size_t at = li * S2_R * c->head_dim + i;
			f->k[at] = s2_rnd(&st, u * sc->k_rms[li]);
			f->v[at] = s2_rnd(&st, u * sc->v_rms[li]);
		}
	return 0;
}

static void s2_fill_free(struct s2_fill *f)
{
	free(f->k);
	free(f->v);
	free(f->cnt);
}

/* Staged q (random) and exact lse of sequence s's query at pos, layer l,
 * over the entries counted so far (itself included). */
static int s2_stage(struct s2_fill *f, uint32_t s, uint32_t pos, uint32_t l)
{
	const struct model_config *c = &f->m->cfg;
	const uint32_t hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads,
	               G = H / KV;
	kvt_client *cl = engine_client(f->e);
	kvt_seq seq = engine_seq_of(f->e, s);
	float *q = kvt_stage_q(cl, seq, l, pos);
	float *lse = kvt_stage_lse(cl, seq, l, pos);
	if (!q || !lse)
		return -1;
	uint64_t st = ((uint64_t)s << 40) ^ ((uint64_t)pos << 8) ^ l;
	for (uint32_t j = 0; j < H * hd; j++)
		q[j] = s2_rnd(&st, sqrtf(3.0f) * f->q_rms[l]);
	const float scale = 1.0f / sqrtf((float)hd);
	for (uint32_t h = 0; h < H; h++) {
		uint32_t g = h / G;
		size_t li = (size_t)l * KV + g;
		const uint32_t *cnt = f->cnt + ((size_t)s * c->n_layers * KV +
		                                li) * S2_R;
		const float *kr = f->k + li * S2_R * hd;
		double lg[S2_R], mx = -INFINITY;
		for (uint32_t r = 0; r < S2_R; r++) {
			double dot = 0;
			for (uint32_t j = 0; j < hd; j++)
				dot += (double)q[h * hd + j] * kr[r * hd + j];
			lg[r] = dot * scale;
			if (cnt[r] && lg[r] > mx)
				mx = lg[r];
		}
		double sum = 0;
		for (uint32_t r = 0; r < S2_R; r++)
			if (cnt[r])
				sum += cnt[r] * exp(lg[r] - mx);
		lse[h] = (float)(mx + log(sum));
	}
	return 0;
}

/* Outside snapkv's window: q = 0, whose lse over the n entries counted so
 * far is exactly log(n) (every logit is 0).  Policies refuse syncs with
 * inputs never staged, and these rows are never read. */
static int s2_stage_flat(struct s2_fill *f, uint32_t s, uint32_t pos,
                         uint32_t l)
{
	const struct model_config *c = &f->m->cfg;
	const uint32_t H = c->n_heads, KV = c->n_kv_heads, G = H / KV;
	kvt_client *cl = engine_client(f->e);
	kvt_seq seq = engine_seq_of(f->e, s);
	float *q = kvt_stage_q(cl, seq, l, pos);
	float *lse = kvt_stage_lse(cl, seq, l, pos);
	if (!q || !lse)
		return -1;
	memset(q, 0, sizeof(float) * H * c->head_dim);
	for (uint32_t h = 0; h < H; h++) {
		const uint32_t *cnt = f->cnt + ((size_t)s * c->n_layers * KV +
		                                (size_t)l * KV + h / G) * S2_R;
		double n = 0;
		for (uint32_t r = 0; r < S2_R; r++)
			n += cnt[r];
		lse[h] = (float)log(n);
	}
	return 0;
}

/* Stages what the policy reads of sequence s's entry at pos, layer l. */
static int s2_stage_row(struct s2_fill *f, uint32_t s, uint32_t pos,
                        uint32_t l, uint32_t P)
{
	const struct model_config *c = &f->m->cfg;
	kvt_client *cl = engine_client(f->e);
	if (f->inputs & KVT_INPUT_X) {
		float *x = kvt_stage_x(cl, engine_seq_of(f->e, s), l, pos);
		/* kind of KV head 0: the row stands for the whole token */
		uint32_t r = s2_kind(s, pos, l, 0);
		if (!x)
			return -1;
		memcpy(x, f->x + ((size_t)l * S2_R + r) * c->dim,
		       sizeof(float) * c->dim);
	}
	if (!(f->inputs & (KVT_INPUT_Q | KVT_INPUT_LSE)))
		return 0;
	return pos + S2_WINDOW >= P ? s2_stage(f, s, pos, l)
	                            : s2_stage_flat(f, s, pos, l);
}

/*
 * Writes P synthetic entries into every list of every sequence, syncing
 * S2_FILL_CHUNK at a time (phase prefill).  One sequence after the other,
 * so each sequence's pages fill chunks of their own: when snapkv then
 * compresses one sequence, the chunks it empties are its own (see
 * s2_decode for why that matters).
 */
static int s2_fill(struct s2_fill *f, uint32_t P)
{
	const struct model_config *c = &f->m->cfg;
	const uint32_t hd = c->head_dim, L = c->n_layers, KV = c->n_kv_heads;
	const size_t rb = hd * sizeof(float);
	kvt_client *cl = engine_client(f->e);
	memset(f->cnt, 0, sizeof(uint32_t) * S2_B * L * KV * S2_R);
	for (uint32_t s = 0; s < S2_B; s++) {
		kvt_seq seq = engine_seq_of(f->e, s);
		for (uint32_t p0 = 0; p0 < P; p0 += S2_FILL_CHUNK) {
			uint32_t n = P - p0 < S2_FILL_CHUNK ? P - p0
			                                    : S2_FILL_CHUNK;
			for (uint32_t t = 0; t < n; t++) {
				uint32_t pos = p0 + t;
				for (uint32_t l = 0; l < L; l++) {
					for (uint32_t g = 0; g < KV; g++) {
						void *kp, *vp;
						if (kvt_kv_ptr(cl, seq, l, g, t, &kp,
						               &vp))
							return -1;
						uint32_t r = s2_kind(s, pos, l, g);
						size_t li = (size_t)l * KV + g;
						memcpy(kp, f->k + (li * S2_R + r) * hd,
						       rb);
						memcpy(vp, f->v + (li * S2_R + r) * hd,
						       rb);
						f->cnt[((size_t)s * L * KV + li) *
						       S2_R + r]++;
					}
					if (s2_stage_row(f, s, pos, l, P))
						return -1;
				}
			}
			struct kvt_sync_item it = {seq, n, KVT_PHASE_PREFILL,
			                           0, 0};
			int rc = kvt_sync(cl, &it, 1);
			if (rc) {
				char why[KVT_ERRTEXT_MAX + 64];
				snprintf(why, sizeof(why), "kvt_sync: %s: %s",
				         kvt_strerror(rc), kvt_last_error(cl));
				s2_fail("fill", why);
				return rc;
			}
			engine_seq_advance(f->e, s, n);
		}
	}
	return 0;
}

/* One (context, policy): fill, decode, read the pool's stats. */
static void s2_decode(const struct model *m, const char *dir,
                      const struct s2_scale *sc, const int32_t *tok,
                      uint32_t ntok, int ci, int p)
{
	s2.ms[ci][p] = s2.kv[ci][p] = NAN;
	/* snapkv compresses each prompt at its first decode sync.  Done in
	 * the batched step, that one sync empties the chunks of all S2_B
	 * prompts at once (over 500 at 4k), and kvtrimd sends one revoke
	 * message per chunk without waiting: the handle channel's send
	 * buffer overflows (EAGAIN) and the daemon drops the tenant
	 * ("handle channel to the client failed (resource busy)").  So each
	 * sequence takes its first decode step alone (engine_step_seq),
	 * emptying only its own chunks (s2_fill), before the batched steps;
	 * its prompt is one token shorter, so every policy ends at ctx. */
	const int alone = p == P_SNAPKV;
	const uint32_t ctx = ctx_tokens[ci], steps = S2_WARM + S2_MEAS;
	const uint32_t P = ctx - steps - (alone ? 1 : 0);
	char spec[KVT_SPEC_MAX], tenant[64];
	if (p == P_FULL)
		snprintf(spec, sizeof(spec), "full");
	else if (p == P_STREAMING)
		snprintf(spec, sizeof(spec), "streaming:sinks=4,tokens=%u",
		         ctx / 4);
	else if (p == P_SNAPKV)
		snprintf(spec, sizeof(spec), "snapkv:ratio=0.75");
	else if (p == P_KVZAP)
		snprintf(spec, sizeof(spec), "kvzap:model=%s/kvzap-mlp,"
		         "threshold=%.4f,window=32,sinks=4", S2_WEIGHTS,
		         s2.kvzap_tau);
	else if (p == P_FASTKVZIP)
		snprintf(spec, sizeof(spec), "fastkvzip:model=%s/fastkvzip."
		         "safetensors,ratio=0.75,window=16,sinks=4", S2_WEIGHTS);
	else
		snprintf(spec, sizeof(spec), "kvpop:model=%s/kvpop.safetensors,"
		         "tokens=%u", S2_WEIGHTS, ctx / 4);
	snprintf(tenant, sizeof(tenant), "smollm2-%s-%s", pol_name[p],
	         ctx_name[ci]);
	struct s2_fill f;
	memset(&f, 0, sizeof(f));
	float *logits = malloc(sizeof(float) * S2_B * m->cfg.vocab_size);
	if (!logits || s2_fill_init(&f, m, sc) ||
	    s2_open(m, dir, tenant, spec, S2_B, ctx, S2_FILL_CHUNK, &f.e)) {
		s2_fail(tenant, logits ? "the engine did not open"
		                       : "out of memory");
		s2_fill_free(&f);
		free(logits);
		return;
	}
	f.inputs = kvt_policy_inputs(engine_client(f.e));
	double t[S2_WARM + S2_MEAS];
	int rc = s2_fill(&f, P);
	if (rc)
		s2_fail(tenant, "the synthetic fill failed (kvt_kv_ptr or a "
		        "staging row was refused)");
	for (uint32_t s = 0; !rc && alone && s < S2_B; s++) {
		rc = engine_step_seq(f.e, s, &tok[s % ntok], 1,
		                     KVT_PHASE_DECODE, NULL);
		if (rc)
			s2_fail(tenant, engine_error(f.e));
	}
	for (uint32_t k = 0; !rc && k < steps; k++) {
		int32_t bt[S2_B];
		for (uint32_t s = 0; s < S2_B; s++)
			bt[s] = tok[(s * 61 + k) % ntok];
		double t0 = bench_now_us();
		rc = engine_step_batch(f.e, bt, KVT_PHASE_DECODE, logits);
		t[k] = (bench_now_us() - t0) / 1e3;
		if (rc)
			s2_fail(tenant, engine_error(f.e));
	}
	struct kvt_tenant_stats st;
	if (!rc && !(rc = kvt_stats(engine_client(f.e), &st))) {
		s2.ms[ci][p] = bench_pct(t + S2_WARM, S2_MEAS, 0.5);
		s2.kv[ci][p] = (double)st.pages_used * 2 * S2_PAGE *
		               m->cfg.head_dim * sizeof(float);
	} else if (!rc) {
		s2_fail(tenant, "kvt_stats failed");
	}
	engine_close(f.e);
	s2_fill_free(&f);
	free(logits);
	fprintf(stderr, "kvtrim-bench: smollm2 %s: %.1f ms/step, %.0f MB\n",
	        tenant, s2.ms[ci][p], s2.kv[ci][p] / 1e6);
}

/* ---------------------------------------------------------- entry */

/* The first n tokens of the text, repeated as needed; NULL and why. */
static int32_t *s2_tokens(const char *path, uint32_t n)
{
	struct gguf *g = NULL;
	struct tok *t = NULL;
	struct tok_ids ids = {0};
	char err[600];
	FILE *fp = fopen(S2_TEXT, "rb");
	char *text = malloc(1 << 16);
	size_t len = fp && text ? fread(text, 1, (1 << 16) - 1, fp) : 0;
	if (fp)
		fclose(fp);
	if (!len) {
		snprintf(s2.why, sizeof(s2.why), "cannot read %s (run from the "
		         "repository root)", S2_TEXT);
		free(text);
		return NULL;
	}
	int32_t *out = NULL;
	if (gguf_open(path, &g, err, sizeof(err)) ||
	    tok_load(g, &t, err, sizeof(err)) ||
	    tok_encode(t, text, len, 0, &ids, err, sizeof(err))) {
		snprintf(s2.why, sizeof(s2.why), "tokenizer: %s", err);
	} else if (ids.n && (out = malloc(sizeof(int32_t) * n))) {
		for (uint32_t i = 0; i < n; i++)
			out[i] = ids.v[i % ids.n];
	}
	free(ids.v);
	tok_free(t);
	gguf_close(g);
	free(text);
	return out;
}

/*
 * kvzap-mlp's threshold for target 0.75 from S2_WEIGHTS/calibration.txt
 * (lines "scorer target threshold"); 0, or -1 and the reason in s2.wwhy.
 */
static int s2_read_tau(void)
{
	FILE *f = fopen(S2_WEIGHTS "/calibration.txt", "r");
	char line[256], name[64];
	double target, tau;
	int found = 0;
	if (!f) {
		snprintf(s2.wwhy, sizeof(s2.wwhy), "cannot read %s: %s (run from "
		         "the repository root)", S2_WEIGHTS "/calibration.txt",
		         strerror(errno));
		return -1;
	}
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "%63s %lf %lf", name, &target, &tau) == 3 &&
		        !strcmp(name, "kvzap-mlp") && fabs(target - 0.75) < 1e-9;
	fclose(f);
	if (!found) {
		snprintf(s2.wwhy, sizeof(s2.wwhy), "%s has no kvzap-mlp 0.75 line",
		         S2_WEIGHTS "/calibration.txt");
		return -1;
	}
	s2.kvzap_tau = (float)tau;
	return 0;
}

void smollm2_run(const char *bin_dir, const char *tmp_dir, int quick)
{
	char path[1024], err[1024], dir[700];
	memset(&s2, 0, sizeof(s2));
	if (model_files_resolve("smollm2", path, sizeof(path), err,
	                        sizeof(err))) {
		snprintf(s2.why, sizeof(s2.why), "%s", err);
		fprintf(stderr, "kvtrim-bench: smollm2 lines skipped: %s\n",
		        s2.why);
		return;
	}
	struct model m;
	if (model_load(path, &m, err, sizeof(err))) {
		/* The cache said the model is there: a file that does not
		 * load is a failure, not a reason to skip. */
		s2_fail("model", err);
		return;
	}
	const uint32_t n = quick ? 128 : S2_PREFILL;
	int32_t *tok = s2_tokens(path, n < S2_XPOS0 + S2_R ? S2_XPOS0 + S2_R
	                                                   : n);
	const size_t lists = (size_t)m.cfg.n_layers * m.cfg.n_kv_heads;
	struct s2_scale sc = {malloc(sizeof(float) * lists),
	                      malloc(sizeof(float) * lists),
	                      malloc(sizeof(float) * m.cfg.n_layers),
	                      malloc(sizeof(float) * m.cfg.n_layers * S2_R *
	                             m.cfg.dim)};
	pid_t d = -1;
	snprintf(dir, sizeof(dir), "%s/smollm2", tmp_dir);
	if (tok && sc.k_rms && sc.v_rms && sc.q_rms && sc.x &&
	    (mkdir(dir, 0700) == 0 || errno == EEXIST))
		d = s2_daemon(bin_dir, dir);
	if (!tok || d < 0) {
		s2_fail("setup", s2.why[0] ? s2.why
		                 : tok ? "kvtrimd did not start"
		                       : "out of memory");
		s2.why[0] = 0;
		goto out;
	}
	struct stat wst;
	if (stat(S2_WEIGHTS, &wst) != 0)
		snprintf(s2.wwhy, sizeof(s2.wwhy), "no %s (run from the "
		         "repository root)", S2_WEIGHTS);
	else
		s2_read_tau();
	if (s2.wwhy[0])
		fprintf(stderr, "kvtrim-bench: smollm2: the learned policies' "
		        "lines skipped: %s\n", s2.wwhy);
	fprintf(stderr, "kvtrim-bench: smollm2: prefill of %u tokens\n", n);
	s2.prefill_tps = s2_prefill(&m, dir, tok, n, &sc);
	if (s2_measure_x(&m, tok, &sc))
		s2_fail("x", "the dense pass for the attention inputs failed");
	s2.sgemm_tps = n / s2_sgemm_us(&m, n, S2_PREFILL_CHUNK, 0, 2) * 1e6;
	s2.sgemm_decode_ms = s2_sgemm_us(&m, S2_B, S2_B, 1, 5) / 1e3;
	s2.n_ctx = quick ? 1 : N_CTX;
	for (int ci = 0; ci < s2.n_ctx; ci++)
		for (int p = 0; p < N_POL; p++)
			if (s2.failed[0] || (s2_learned(p) && s2.wwhy[0]))
				s2.ms[ci][p] = s2.kv[ci][p] = NAN;
			else
				s2_decode(&m, dir, &sc, tok, n, ci, p);
	kill(d, SIGTERM);
	waitpid(d, NULL, 0);
out:
	free(tok);
	free(sc.k_rms);
	free(sc.v_rms);
	free(sc.q_rms);
	free(sc.x);
	model_free(&m);
}

int smollm2_failed(void)
{
	return s2.failed[0] != 0;
}

void smollm2_print(FILE *f)
{
	if (s2.why[0]) {
		fprintf(f, "# smollm2 lines skipped: %s\n", s2.why);
		return;
	}
	if (s2.failed[0])
		fprintf(f, "# smollm2 failed: %s\n", s2.failed);
	if (s2.wwhy[0])
		fprintf(f, "# smollm2 learned policies skipped: %s\n", s2.wwhy);
	fprintf(f, "smollm2_prefill_tokens_per_s %.1f\n", s2.prefill_tps);
	fprintf(f, "smollm2_prefill_sgemm_tokens_per_s %.1f\n", s2.sgemm_tps);
	fprintf(f, "smollm2_prefill_vs_sgemm %.2f\n",
	        s2.prefill_tps / s2.sgemm_tps);
	fprintf(f, "smollm2_decode_sgemm_ms %.1f\n", s2.sgemm_decode_ms);
	for (int ci = 0; ci < s2.n_ctx; ci++)
		for (int p = 0; p < N_POL; p++) {
			const char *pn = pol_name[p], *cn = ctx_name[ci];
			if (s2_learned(p) && s2.wwhy[0])
				continue;
			fprintf(f, "smollm2_decode_ms_%s_%s %.1f\n", pn, cn,
			        s2.ms[ci][p]);
			fprintf(f, "smollm2_kv_bytes_%s_%s %.0f\n", pn, cn,
			        s2.kv[ci][p]);
			if (p == P_FULL)
				continue;
			fprintf(f, "smollm2_decode_speedup_%s_%s %.2f\n", pn, cn,
			        s2.ms[ci][P_FULL] / s2.ms[ci][p]);
			fprintf(f, "smollm2_kv_ratio_%s_%s %.3f\n", pn, cn,
			        s2.kv[ci][p] / s2.kv[ci][P_FULL]);
		}
}
