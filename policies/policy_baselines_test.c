/*
 * policy_baselines_test.c — the three kvpress baselines (knorm,
 * expected_attention, pyramidkv): their keys and refusals, and their rules
 * against hand calculations or a naive double-precision implementation
 * written here (docs/policies.md states the rules).
 *
 * The fixture (struct bx) is a miniature tenant like policy_test.c's, but
 * with head_dim 4 (RoPE needs pairs, norms need more than one dimension),
 * several layers (pyramidkv's budgets differ by layer) and real V rows:
 * f32 pages of [K: 4 x 4][V: 4 x 4], a staging array indexed by layer and
 * position, the tenant's compaction (compact_plan, compact_cpu,
 * policy_move_entries) after every sync.
 */
#include <math.h>
#include <stdio.h>

#include "compact.h"
#include "kernels.h"
#include "policy.h"
#include "shm.h"
#include "test.h"

#define BX_MAX 64 /* entries per list */
#define BX_L 4    /* most layers */
#define BX_KV 2   /* most KV heads */
#define BX_H 4    /* most query heads */
#define BX_HD 4   /* head_dim */
#define BX_D 4    /* d_model */
#define BX_PT 4   /* page_tokens */
#define BX_ROW (BX_D + BX_H * BX_HD + BX_H) /* staged row, widest */

struct bx {
	struct policy *p;
	struct policy_geom ge;
	uint32_t layer; /* of the decide() running (fx_row's context) */
	uint32_t n_seen[BX_L];
	uint32_t len[BX_L][BX_KV];
	uint32_t pos[BX_L][BX_KV][BX_MAX];
	float ent[BX_L][BX_KV][BX_MAX];
	/* pages of [K: BX_PT][BX_HD][V: BX_PT][BX_HD] floats */
	float kv[BX_L][BX_KV][BX_MAX / BX_PT][2 * BX_PT * BX_HD];
	uint8_t drop[BX_L][BX_KV][BX_MAX];
	_Alignas(16) uint8_t state[BX_L][256];
	/* staged rows by position: [x: BX_D][q: H][head_dim][lse: H], the
	 * parts the policy reads only (ipc/shm.h), q at qo and lse at lo */
	float stage[BX_L][BX_MAX][BX_ROW];
	uint32_t inputs;
	uint64_t qo, lo;
};

static struct policy_geom bgeom(uint32_t n_layers, uint32_t H, uint32_t nkv)
{
	return (struct policy_geom){.n_layers = n_layers, .n_heads = H,
	                            .n_kv_heads = nkv, .head_dim = BX_HD,
	                            .d_model = BX_D, .page_tokens = BX_PT,
	                            .dtype = KVT_DTYPE_F32, .headroom = 32};
}

static struct policy *bmake(const char *spec, const struct policy_geom *ge)
{
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, ge, &p, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "policy_create(\"%s\"): %s: %s",
		        spec, kvt_errname(rc), err);
	return p;
}

static void bx_init(struct bx *b, const char *spec, uint32_t n_layers,
                    uint32_t H, uint32_t nkv)
{
	memset(b, 0, sizeof(*b));
	b->ge = bgeom(n_layers, H, nkv);
	b->p = bmake(spec, &b->ge);
	T_ASSERT(b->p->layer_state_bytes <= sizeof(b->state[0]));
	T_ASSERT(b->p->entry_floats <= 1);
	uint64_t n;
	b->inputs = policy_inputs_of(b->p->ops->needs);
	shm_stage_layout(b->inputs, BX_D, H, BX_HD, &b->qo, &b->lo, &n);
}

static const float *bx_row(void *ctx, uint32_t pos)
{
	struct bx *b = ctx;
	return pos < b->n_seen[b->layer] ? b->stage[b->layer][pos] : NULL;
}

static float *bx_k(struct bx *b, uint32_t l, uint32_t h, uint32_t e)
{
	return &b->kv[l][h][e / BX_PT][(e % BX_PT) * BX_HD];
}

static float *bx_v(struct bx *b, uint32_t l, uint32_t h, uint32_t e)
{
	return &b->kv[l][h][e / BX_PT][(BX_PT + e % BX_PT) * BX_HD];
}

/*
 * One sync of n new tokens in layer l.  k, v [n][nkv][BX_HD] (NULL:
 * zeros), q [n][H][BX_HD] (NULL: zeros), lse [n][H] (NULL: zeros).
 * Returns decide()'s rc; compacts like the tenant when it succeeded.
 */
static int bx_sync(struct bx *b, uint32_t l, uint32_t n, enum kvt_phase ph,
                   const float *k, const float *v, const float *q,
                   const float *lse)
{
	uint32_t H = b->ge.n_heads, nkv = b->ge.n_kv_heads;
	uint32_t ef = b->p->entry_floats;
	static float xs[BX_MAX * BX_D], qs[BX_MAX * BX_H * BX_HD],
		ls[BX_MAX * BX_H];
	T_ASSERT(b->n_seen[l] + n <= BX_MAX);
	for (uint32_t t = 0; t < n; t++) {
		uint32_t pos = b->n_seen[l] + t;
		float *row = b->stage[l][pos];
		for (uint32_t d = 0; d < BX_D; d++) {
			xs[t * BX_D + d] = 0.0f;
			if (b->inputs & KVT_INPUT_X)
				row[d] = 0.0f;
		}
		for (uint32_t i = 0; i < H * BX_HD; i++) {
			qs[t * H * BX_HD + i] =
				q ? q[(size_t)t * H * BX_HD + i] : 0.0f;
			if (b->inputs & KVT_INPUT_Q)
				row[b->qo + i] = qs[t * H * BX_HD + i];
		}
		for (uint32_t j = 0; j < H; j++) {
			ls[t * H + j] = lse ? lse[t * H + j] : 0.0f;
			if (b->inputs & KVT_INPUT_LSE)
				row[b->lo + j] = ls[t * H + j];
		}
		for (uint32_t h = 0; h < nkv; h++) {
			uint32_t e = b->len[l][h] + t;
			T_ASSERT(e < BX_MAX);
			b->pos[l][h][e] = pos;
			b->ent[l][h][e] = 0.0f;
			for (uint32_t d = 0; d < BX_HD; d++) {
				size_t o = ((size_t)t * nkv + h) * BX_HD + d;
				bx_k(b, l, h, e)[d] = k ? k[o] : 0.0f;
				bx_v(b, l, h, e)[d] = v ? v[o] : 0.0f;
			}
		}
	}
	b->n_seen[l] += n;
	struct policy_head heads[BX_KV];
	void *pages[BX_KV][BX_MAX / BX_PT];
	for (uint32_t h = 0; h < nkv; h++) {
		b->len[l][h] += n;
		memset(b->drop[l][h], 0, BX_MAX);
		for (uint32_t pg = 0; pg < BX_MAX / BX_PT; pg++)
			pages[h][pg] = b->kv[l][h][pg];
		heads[h] = (struct policy_head){
			.pos = b->pos[l][h], .ent = ef ? b->ent[l][h] : NULL,
			.pages = pages[h], .len = b->len[l][h],
			.drop = b->drop[l][h]};
	}
	struct policy_layer pl = {
		.layer = l, .phase = ph, .n_new = n, .n_seen = b->n_seen[l],
		.x = xs, .q = qs, .lse = ls, .staged = bx_row, .staged_ctx = b,
		.heads = heads,
		.state = b->p->layer_state_bytes ? b->state[l] : NULL,
	};
	b->layer = l;
	int rc = policy_decide(b->p, &pl);
	if (rc)
		return rc;
	for (uint32_t h = 0; h < nkv; h++) {
		uint32_t moves[2 * BX_MAX], nl;
		uint32_t nm = compact_plan(b->drop[l][h], b->len[l][h], moves,
		                           &nl);
		compact_cpu(pages[h], BX_PT, BX_HD * sizeof(float), moves, nm);
		policy_move_entries(b->pos[l][h], ef ? b->ent[l][h] : NULL, ef,
		                    moves, nm);
		b->len[l][h] = nl;
	}
	return 0;
}

/* List (l, h) holds exactly the positions of want[0..n). */
static void bx_expect_(const struct bx *b, uint32_t l, uint32_t h,
                       const uint32_t *want, uint32_t n, int line)
{
	uint8_t seen[BX_MAX] = {0}, wanted[BX_MAX] = {0};
	for (uint32_t i = 0; i < b->len[l][h]; i++)
		seen[b->pos[l][h][i]] = 1;
	for (uint32_t i = 0; i < n; i++)
		wanted[want[i]] = 1;
	if (b->len[l][h] == n && !memcmp(seen, wanted, BX_MAX))
		return;
	char got[400] = "", exp[400] = "";
	size_t o = 0, e = 0;
	for (uint32_t p = 0; p < BX_MAX; p++) {
		if (seen[p] && o < 380)
			o += (size_t)snprintf(got + o, sizeof(got) - o, "%u ", p);
		if (wanted[p] && e < 380)
			e += (size_t)snprintf(exp + e, sizeof(exp) - e, "%u ", p);
	}
	th_fail(__FILE__, line, "%s layer %u head %u: holds {%s}, expected {%s}",
	        b->p->spec, l, h, got, exp);
}
#define BX_EXPECT(b, l, h, ...)                                                \
	do {                                                                   \
		const uint32_t w_[] = {__VA_ARGS__};                           \
		bx_expect_(b, l, h, w_, sizeof(w_) / sizeof(w_[0]), __LINE__); \
	} while (0)

/* Refused with KVT_EPOLICY, no object, and a reason containing needle. */
static void brefused_(const char *spec, const struct policy_geom *ge,
                      const char *needle, int line)
{
	struct policy *p = (struct policy *)&p; /* must be reset to NULL */
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, ge, &p, err, sizeof(err));
	if (rc != KVT_EPOLICY || p || !strstr(err, needle))
		th_fail(__FILE__, line, "\"%s\" gave %s (%s), expected EPOLICY "
		        "mentioning '%s'", spec, kvt_errname(rc), err, needle);
}
#define BREFUSED(spec, needle)                                                 \
	do {                                                                   \
		struct policy_geom g_ = bgeom(2, 2, 1);                        \
		brefused_(spec, &g_, needle, __LINE__);                        \
	} while (0)

/* Deterministic values in [-1, 1). */
static uint32_t rng = 2024;
static float rnd(void)
{
	rng = rng * 1664525u + 1013904223u;
	return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

/* ------------------------------------------------------------ keys */

TEST(baselines, defaults_and_keys)
{
	struct policy_geom ge = bgeom(2, 2, 1);
	struct policy *p = bmake("knorm", &ge);
	T_EQ(p->args.tokens, 256);
	T_EQ(p->args.sinks, 0);
	T_EQ(p->args.window, 0);
	T_EQ(p->entry_floats, 1);
	T_EQ(p->ops->needs, POLICY_NEED_KV);
	policy_free(p);
	p = bmake("knorm:ratio=0.25,sinks=2,window=3,every=4", &ge);
	T_ASSERT(p->args.ratio == 0.25);
	T_EQ(p->args.tokens, 0);
	T_EQ(p->args.every, 4);
	policy_free(p);

	p = bmake("expected_attention", &ge);
	T_EQ(p->args.window, 64);
	T_EQ(p->lookback, 64);
	T_EQ(p->args.sinks, 4);
	T_ASSERT(p->args.ratio == 0.5);
	T_EQ(p->args.future, 512);
	T_ASSERT(p->args.theta == 10000.0);
	T_EQ(p->args.cov, 1);
	T_EQ(p->args.vnorm, 1);
	T_ASSERT(p->args.eps == 0.0);
	T_EQ(p->ops->needs, POLICY_NEED_Q | POLICY_NEED_KV | POLICY_NEED_V);
	policy_free(p);
	p = bmake("expected_attention:window=8,tokens=5,sinks=0,future=7,"
	          "theta=500000,cov=0,vnorm=0,eps=1e-3", &ge);
	T_EQ(p->args.window, 8);
	T_EQ(p->lookback, 8);
	T_EQ(p->args.tokens, 5);
	T_EQ(p->args.sinks, 0);
	T_EQ(p->args.future, 7);
	T_ASSERT(p->args.theta == 500000.0);
	T_EQ(p->args.cov, 0);
	T_EQ(p->args.vnorm, 0);
	T_ASSERT(p->args.eps == 1e-3);
	policy_free(p);

	p = bmake("pyramidkv", &ge);
	T_EQ(p->args.window, 64);
	T_EQ(p->args.kernel, 5);
	T_EQ(p->args.beta, 20);
	T_ASSERT(p->args.ratio == 0.5);
	T_EQ(p->lookback, 64);
	policy_free(p);
	p = bmake("pyramidkv:beta=3,window=4,kernel=1,tokens=9", &ge);
	T_EQ(p->args.beta, 3);
	T_EQ(p->args.tokens, 9);
	policy_free(p);
}

TEST(baselines, refusals)
{
	BREFUSED("knorm:threshold=1", "not accepted");
	BREFUSED("knorm:kernel=3", "not accepted");
	BREFUSED("knorm:tokens=0", "tokens must be >= 1");
	BREFUSED("knorm:tokens=4,ratio=0.5", "give one of");
	BREFUSED("knorm:ratio=1", "ratio must be in [0, 1)");

	BREFUSED("expected_attention:window=0", "window must be >= 1");
	BREFUSED("expected_attention:cov=2", "(0 or 1)");
	BREFUSED("expected_attention:vnorm=yes", "(0 or 1)");
	BREFUSED("expected_attention:eps=-1", "bad value '-1' for 'eps'");
	BREFUSED("expected_attention:theta=0", "theta must be > 0");
	BREFUSED("expected_attention:future=0", "future must be >= 1");
	BREFUSED("expected_attention:threshold=1", "not accepted");
	BREFUSED("expected_attention:kernel=3", "not accepted");
	BREFUSED("expected_attention:cov=1,cov=0", "given twice");
	struct policy_geom odd = bgeom(2, 2, 1);
	odd.head_dim = 3;
	brefused_("expected_attention", &odd, "head_dim 3 is odd", __LINE__);

	BREFUSED("pyramidkv:beta=0", "beta must be >= 1");
	BREFUSED("pyramidkv:kernel=2", "kernel must be odd");
	BREFUSED("pyramidkv:window=0", "pyramidkv: window must be >= 1");
	BREFUSED("pyramidkv:threshold=1", "not accepted");
	BREFUSED("pyramidkv:eps=0", "not accepted");
	BREFUSED("snapkv:beta=2", "not accepted");
}

/* ------------------------------------------------------------ knorm */

/* Rows of norm 5, 1, 2, 10, 3, 4, 7, 0.5 (hand-picked). */
static const float knorm_rows[8][BX_HD] = {
	{3, 4, 0, 0}, {1, 0, 0, 0}, {0, 2, 0, 0}, {6, 0, 0, 8},
	{0, 0, 3, 0}, {0, 0, 0, 4}, {0, 0, 7, 0}, {.3f, .4f, 0, 0},
};

TEST(baselines, knorm_rule)
{
	struct bx b;
	bx_init(&b, "knorm:tokens=5", 1, 2, 1);
	T_OK(bx_sync(&b, 0, 8, KVT_PHASE_PREFILL, &knorm_rows[0][0], NULL,
	             NULL, NULL));
	/* keep the 5 smallest norms: 1 (1), 2 (2), 3 (4), 4 (5), .5 (7) */
	BX_EXPECT(&b, 0, 0, 1, 2, 4, 5, 7);
	/* norm 4.5 arrives: the largest of the six, dropped at once */
	T_OK(bx_sync(&b, 0, 1, KVT_PHASE_DECODE,
	             (const float[BX_HD]){0, 0, 2.7f, 3.6f}, NULL, NULL, NULL));
	BX_EXPECT(&b, 0, 0, 1, 2, 4, 5, 7);
	/* norm .1 arrives: now 4 (position 5) is the largest */
	T_OK(bx_sync(&b, 0, 1, KVT_PHASE_DECODE,
	             (const float[BX_HD]){.1f, 0, 0, 0}, NULL, NULL, NULL));
	BX_EXPECT(&b, 0, 0, 1, 2, 4, 7, 9);
	policy_free(b.p);

	/* ratio .5 of 8: B 4; sink 0 and window 6, 7 protected; one more:
	 * the smallest of 1..5, position 1 */
	bx_init(&b, "knorm:ratio=0.5,sinks=1,window=2", 1, 2, 1);
	T_OK(bx_sync(&b, 0, 8, KVT_PHASE_PREFILL, &knorm_rows[0][0], NULL,
	             NULL, NULL));
	BX_EXPECT(&b, 0, 0, 0, 1, 6, 7);
	policy_free(b.p);

	/* every=4: norms taken at every sync, evictions at n_seen 4 only */
	bx_init(&b, "knorm:tokens=2,every=4", 1, 2, 1);
	for (uint32_t t = 0; t < 3; t++)
		T_OK(bx_sync(&b, 0, 1, KVT_PHASE_DECODE, knorm_rows[t], NULL,
		             NULL, NULL));
	T_EQ(b.len[0][0], 3);
	T_OK(bx_sync(&b, 0, 1, KVT_PHASE_DECODE, knorm_rows[3], NULL, NULL,
	             NULL));
	BX_EXPECT(&b, 0, 0, 1, 2);
	policy_free(b.p);

	/* two KV heads decide apart: head 1 gets the rows reversed */
	bx_init(&b, "knorm:tokens=3", 1, 2, 2);
	float k2[8][2][BX_HD];
	for (uint32_t t = 0; t < 8; t++) {
		memcpy(k2[t][0], knorm_rows[t], sizeof(k2[t][0]));
		memcpy(k2[t][1], knorm_rows[7 - t], sizeof(k2[t][1]));
	}
	T_OK(bx_sync(&b, 0, 8, KVT_PHASE_PREFILL, &k2[0][0][0], NULL, NULL,
	             NULL));
	BX_EXPECT(&b, 0, 0, 1, 2, 7);     /* norms 1, 2, .5 */
	BX_EXPECT(&b, 0, 1, 0, 5, 6);     /* reversed: 7 - {7, 2, 1} */
	policy_free(b.p);
}

/* ------------------------------------------------------------ expected attention */

#define EA_P 24 /* prompt */

/* The engine's RoPE in double (model_rope's pairs and frequencies). */
static void rope_d(double *v, uint32_t hd, double pos, double theta)
{
	for (uint32_t k = 0; k < hd / 2; k++) {
		double a = pos * pow(theta, -(double)(2 * k) / hd);
		double v0 = v[2 * k], v1 = v[2 * k + 1];
		v[2 * k] = v0 * cos(a) - v1 * sin(a);
		v[2 * k + 1] = v0 * sin(a) + v1 * cos(a);
	}
}

struct ea_case {
	const char *spec;
	uint32_t H, nkv, window, sinks, future, cov, vnorm, keep;
	double theta, eps;
};

/*
 * The kept prompt positions of KV head g by the rule, naively: full
 * matrices, statistics from the pre-RoPE queries the test generated.
 */
static void ea_naive(const struct ea_case *c, double qpre[][BX_H][BX_HD],
                     float kr[][BX_KV][BX_HD], float vr[][BX_KV][BX_HD],
                     uint32_t g, uint8_t *kept)
{
	const uint32_t hd = BX_HD, G = c->H / c->nkv;
	uint32_t from = EA_P > c->window ? EA_P - c->window : 0;
	if (from < c->sinks)
		from = c->sinks;
	uint32_t N = EA_P - from;
	/* R: the mean of the rotation matrices of the future positions */
	double R[BX_HD][BX_HD] = {{0}};
	for (uint32_t t = 0; t < c->future; t++)
		for (uint32_t col = 0; col < hd; col++) {
			double e[BX_HD] = {0};
			e[col] = 1.0;
			rope_d(e, hd, EA_P + t, c->theta);
			for (uint32_t r = 0; r < hd; r++)
				R[r][col] += e[r] / c->future;
		}
	double score[EA_P] = {0};
	for (uint32_t j = 0; j < G; j++) {
		uint32_t qh = g * G + j;
		double mu[BX_HD] = {0}, S[BX_HD][BX_HD] = {{0}};
		for (uint32_t t = from; t < EA_P; t++)
			for (uint32_t d = 0; d < hd; d++)
				mu[d] += qpre[t][qh][d] / N;
		for (uint32_t t = from; t < EA_P; t++)
			for (uint32_t r = 0; r < hd; r++)
				for (uint32_t s = 0; s < hd; s++)
					S[r][s] += (qpre[t][qh][r] - mu[r]) *
					           (qpre[t][qh][s] - mu[s]) / N;
		double mr[BX_HD] = {0}, RS[BX_HD][BX_HD] = {{0}},
		       Sr[BX_HD][BX_HD] = {{0}};
		for (uint32_t r = 0; r < hd; r++)
			for (uint32_t s = 0; s < hd; s++) {
				mr[r] += R[r][s] * mu[s];
				for (uint32_t u = 0; u < hd; u++)
					RS[r][s] += R[r][u] * S[u][s];
			}
		for (uint32_t r = 0; r < hd; r++)
			for (uint32_t s = 0; s < hd; s++)
				for (uint32_t u = 0; u < hd; u++)
					Sr[r][s] += RS[r][u] * R[s][u];
		double z[EA_P], zsum = 0.0;
		for (uint32_t i = c->sinks; i < EA_P; i++) {
			double lin = 0.0, quad = 0.0;
			for (uint32_t r = 0; r < hd; r++) {
				lin += mr[r] * kr[i][g][r];
				for (uint32_t s = 0; s < hd; s++)
					quad += kr[i][g][r] * Sr[r][s] *
					        kr[i][g][s];
			}
			z[i] = exp(lin / sqrt(hd) +
			           (c->cov ? quad / (2.0 * hd) : 0.0));
			zsum += z[i];
		}
		for (uint32_t i = c->sinks; i < EA_P; i++)
			score[i] += z[i] / zsum / G;
	}
	for (uint32_t i = c->sinks; i < EA_P; i++)
		if (c->vnorm) {
			double n = 0.0;
			for (uint32_t d = 0; d < hd; d++)
				n += (double)vr[i][g][d] * vr[i][g][d];
			score[i] = (score[i] + c->eps) * sqrt(n);
		}
	/* the best keep - sinks candidates, plus the sinks */
	memset(kept, 0, EA_P);
	for (uint32_t i = 0; i < c->sinks; i++)
		kept[i] = 1;
	for (uint32_t n = c->sinks; n < c->keep; n++) {
		int best = -1;
		for (uint32_t i = c->sinks; i < EA_P; i++)
			if (!kept[i] && (best < 0 || score[i] > score[best]))
				best = (int)i;
		kept[best] = 1;
	}
}

static void ea_run(const struct ea_case *c)
{
	static double qpre[EA_P + 1][BX_H][BX_HD];
	static float kr[EA_P + 1][BX_KV][BX_HD], vr[EA_P + 1][BX_KV][BX_HD];
	/* what bx_sync takes: k, v [t][nkv][hd], q [t][H][hd] (post-RoPE) */
	static float ks[(EA_P + 1) * BX_KV * BX_HD];
	static float vs[(EA_P + 1) * BX_KV * BX_HD];
	static float qs[(EA_P + 1) * BX_H * BX_HD];
	size_t kst = c->nkv * BX_HD, qst = c->H * BX_HD;
	for (uint32_t t = 0; t <= EA_P; t++) {
		for (uint32_t h = 0; h < c->H; h++) {
			double v[BX_HD];
			for (uint32_t d = 0; d < BX_HD; d++)
				v[d] = qpre[t][h][d] = 2.0 * rnd();
			rope_d(v, BX_HD, t, c->theta);
			for (uint32_t d = 0; d < BX_HD; d++)
				qs[t * qst + h * BX_HD + d] = (float)v[d];
		}
		for (uint32_t h = 0; h < c->nkv; h++)
			for (uint32_t d = 0; d < BX_HD; d++) {
				ks[t * kst + h * BX_HD + d] = kr[t][h][d] =
					1.5f * rnd();
				vs[t * kst + h * BX_HD + d] = vr[t][h][d] =
					rnd();
			}
	}
	struct bx b;
	bx_init(&b, c->spec, 1, c->H, c->nkv);
	/* prefill in two chunks: nothing evicted */
	T_OK(bx_sync(&b, 0, 10, KVT_PHASE_PREFILL, ks, vs, qs, NULL));
	T_OK(bx_sync(&b, 0, EA_P - 10, KVT_PHASE_PREFILL, ks + 10 * kst,
	             vs + 10 * kst, qs + 10 * qst, NULL));
	for (uint32_t h = 0; h < c->nkv; h++)
		T_EQ(b.len[0][h], EA_P);
	/* the first decode sync compresses the prompt */
	T_OK(bx_sync(&b, 0, 1, KVT_PHASE_DECODE, ks + EA_P * kst,
	             vs + EA_P * kst, qs + EA_P * qst, NULL));
	for (uint32_t g = 0; g < c->nkv; g++) {
		uint8_t kept[EA_P];
		uint32_t want[EA_P + 1], n = 0;
		ea_naive(c, qpre, kr, vr, g, kept);
		for (uint32_t i = 0; i < EA_P; i++)
			if (kept[i])
				want[n++] = i;
		want[n++] = EA_P; /* the decode token */
		bx_expect_(&b, 0, g, want, n, __LINE__);
	}
	policy_free(b.p);
}

TEST(baselines, expected_attention_matches_naive)
{
	/* ratio .5 of 24: B 12 with the sinks; G 2 on 2 KV heads */
	static const struct ea_case cases[] = {
		{"expected_attention:window=8,sinks=2", 4, 2, 8, 2, 512, 1, 1,
		 12, 10000.0, 0.0},
		{"expected_attention:window=8,sinks=2,cov=0", 4, 2, 8, 2, 512,
		 0, 1, 12, 10000.0, 0.0},
		{"expected_attention:window=8,sinks=2,vnorm=0", 4, 2, 8, 2, 512,
		 1, 0, 12, 10000.0, 0.0},
		{"expected_attention:window=8,sinks=2,eps=0.05,future=3,"
		 "theta=100", 4, 2, 8, 2, 3, 1, 1, 12, 100.0, 0.05},
		/* window reaching into the sinks: statistics from 1..23 */
		{"expected_attention:window=30,sinks=1,tokens=7", 2, 1, 30, 1,
		 512, 1, 1, 7, 10000.0, 0.0},
		{"expected_attention:window=5,sinks=0,ratio=0.75,future=64", 4,
		 1, 5, 0, 64, 1, 1, 6, 10000.0, 0.0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ea_run(&cases[i]);
}

/*
 * Equal keys 0.5, value t of norm (t * 5) % 6 + 1 (one nonzero element),
 * random queries of 2 heads; a prompt of 8 in one prefill sync, then one
 * decode token, for spec.
 */
static void ea_equal_keys(struct bx *b, const char *spec)
{
	static float k[9][BX_HD], v[9][BX_HD], q[9][2][BX_HD];
	for (uint32_t t = 0; t < 9; t++) {
		for (uint32_t d = 0; d < BX_HD; d++) {
			k[t][d] = 0.5f;
			v[t][d] = 0.0f;
			q[t][0][d] = rnd();
			q[t][1][d] = rnd();
		}
		v[t][t % BX_HD] = (float)((t * 5) % 6 + 1);
	}
	bx_init(b, spec, 1, 2, 1);
	T_OK(bx_sync(b, 0, 8, KVT_PHASE_PREFILL, &k[0][0], &v[0][0],
	             &q[0][0][0], NULL));
	T_OK(bx_sync(b, 0, 1, KVT_PHASE_DECODE, k[8], v[8], &q[8][0][0],
	             NULL));
}

TEST(baselines, expected_attention_by_hand)
{
	/*
	 * Equal keys: every candidate has the same expected attention
	 * 1 / 6 (6 candidates, sinks 2), so with vnorm the value norms
	 * decide.  Norms at 2..7: 5, 4, 3, 2, 1, 6; budget 4 - 2 sinks:
	 * keep 2 (5) and 7 (6).
	 */
	struct bx b;
	ea_equal_keys(&b, "expected_attention:window=4,sinks=2,tokens=4");
	BX_EXPECT(&b, 0, 0, 0, 1, 2, 7, 8);
	/* once only: later decode syncs never evict */
	for (uint32_t t = 0; t < 3; t++)
		T_OK(bx_sync(&b, 0, 1, KVT_PHASE_DECODE, NULL, NULL, NULL,
		             NULL));
	T_EQ(b.len[0][0], 8);
	policy_free(b.p);

	/* without vnorm all candidates tie: ties keep the more recent */
	ea_equal_keys(&b, "expected_attention:window=4,sinks=2,tokens=4,"
	                  "vnorm=0");
	BX_EXPECT(&b, 0, 0, 0, 1, 6, 7, 8);
	policy_free(b.p);

	/* prompt within the budget, or nothing to learn from (all sinks):
	 * keep all */
	ea_equal_keys(&b, "expected_attention:window=4,sinks=2,tokens=8");
	T_EQ(b.len[0][0], 9);
	policy_free(b.p);
	ea_equal_keys(&b, "expected_attention:window=4,sinks=8,tokens=2");
	T_EQ(b.len[0][0], 9);
	policy_free(b.p);
}

TEST(baselines, expected_attention_rechecks_its_window)
{
	/* a staged query of the window turned NaN after its own sync: the
	 * decision is refused and names it */
	struct bx b;
	bx_init(&b, "expected_attention:window=4,sinks=0,tokens=2", 1, 2, 1);
	T_OK(bx_sync(&b, 0, 8, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	b.stage[0][6][b.qo + 1] = NAN;
	T_ERR(bx_sync(&b, 0, 1, KVT_PHASE_DECODE, NULL, NULL, NULL, NULL),
	      KVT_EINVAL);
	T_ASSERT(strstr(b.p->why, "position 6"));
	policy_free(b.p);
}

/* ------------------------------------------------------------ pyramidkv */

/*
 * Runs a prompt of P in every layer (one query head, q (1, 0, 0, 0), lse
 * 0, keys (2 ln a_i, 0, 0, 0): with scale 1/2 the window's attention to
 * entry i is a_i, a_i = ((7 i) % P + 1) / 100, distinct), then one decode
 * token, and checks that layer l kept its window, its decode token and
 * the best budget[l] - window others by a.
 */
static void pyr_run(const char *spec, uint32_t L, uint32_t P, uint32_t w,
                    const uint32_t *budget)
{
	struct bx b;
	bx_init(&b, spec, L, 1, 1);
	static float k[BX_MAX][BX_HD], q[BX_MAX][BX_HD];
	double a[BX_MAX];
	memset(k, 0, sizeof(k));
	memset(q, 0, sizeof(q));
	for (uint32_t i = 0; i <= P; i++) {
		a[i] = (double)((7 * i) % P + 1) / 100.0;
		k[i][0] = (float)(2.0 * log(a[i]));
		q[i][0] = 1.0f;
	}
	for (uint32_t l = 0; l < L; l++) {
		T_OK(bx_sync(&b, l, P, KVT_PHASE_PREFILL, &k[0][0], NULL,
		             &q[0][0], NULL));
		T_OK(bx_sync(&b, l, 1, KVT_PHASE_DECODE, k[P], NULL, q[P],
		             NULL));
		uint8_t kept[BX_MAX] = {0};
		uint32_t want[BX_MAX], n = 0;
		for (uint32_t i = P - w; i <= P; i++)
			kept[i] = 1;
		for (uint32_t m = w; m < budget[l]; m++) {
			int best = -1;
			for (uint32_t i = 0; i < P - w; i++)
				if (!kept[i] && (best < 0 || a[i] > a[best]))
					best = (int)i;
			kept[best] = 1;
		}
		for (uint32_t i = 0; i <= P; i++)
			if (kept[i])
				want[n++] = i;
		bx_expect_(&b, l, 0, want, n, __LINE__);
	}
	policy_free(b.p);
}

TEST(baselines, pyramidkv_budgets)
{
	/*
	 * P 40, w 4, ratio .5: mean 20; min = 20/20 = 1, max = 40 - 1 = 39
	 * >= P - w = 36, so max 36, min 40 - 36 = 4 >= w; steps 32/3:
	 * 36, 25.33 -> 25, 14.67 -> 15, 4 (mean 20).
	 */
	static const uint32_t b4[] = {36, 25, 15, 4};
	pyr_run("pyramidkv:window=4,kernel=1,ratio=0.5", 4, 40, 4, b4);
	/* tokens=20 is the same mean */
	pyr_run("pyramidkv:window=4,kernel=1,tokens=20", 4, 40, 4, b4);
	/*
	 * P 9, w 2, ratio .5, 3 layers: mean 4.5; max 9 - .225 >= 7 -> 7,
	 * min 9 - 7 = 2; steps 2.5: 7, 4.5 -> 4 (half to even), 2.
	 */
	static const uint32_t b3[] = {7, 4, 2};
	pyr_run("pyramidkv:window=2,kernel=1,ratio=0.5", 3, 9, 2, b3);
	/*
	 * P 50, w 4, ratio .7: mean 15.000000000000002; min .75 < w: kvpress
	 * falls back to SnapKV's round(mean) = 15 in every layer.
	 */
	static const uint32_t bf[] = {15, 15};
	pyr_run("pyramidkv:window=4,kernel=1,ratio=0.7", 2, 50, 4, bf);
	/*
	 * beta 2 on P 40, w 4, ratio .5: min 10, max 30 < 36; 30, 10 over
	 * 2 layers.
	 */
	static const uint32_t bb[] = {30, 10};
	pyr_run("pyramidkv:window=4,kernel=1,ratio=0.5,beta=2", 2, 40, 4, bb);
	/* one layer: the mean */
	static const uint32_t b1[] = {20};
	pyr_run("pyramidkv:window=4,kernel=1,ratio=0.5", 1, 40, 4, b1);
}

TEST(baselines, pyramidkv_pressure_and_once)
{
	/* pressure 1 halves each layer's budget: 36 - 18, 4 - 2 (the window
	 * of 4 stays protected, so layer 1 keeps just it) */
	struct bx b;
	bx_init(&b, "pyramidkv:window=4,kernel=1,ratio=0.5", 2, 1, 1);
	policy_set_pressure(b.p, 1.0f);
	float k[41][BX_HD] = {{0}}, q[41][BX_HD] = {{0}};
	for (uint32_t i = 0; i <= 40; i++) {
		k[i][0] = (float)(2.0 * log((double)((7 * i) % 40 + 1) / 100.0));
		q[i][0] = 1.0f;
	}
	/* 2 layers, P 40: max 36, min 4 */
	for (uint32_t l = 0; l < 2; l++) {
		T_OK(bx_sync(&b, l, 40, KVT_PHASE_PREFILL, &k[0][0], NULL,
		             &q[0][0], NULL));
		T_OK(bx_sync(&b, l, 1, KVT_PHASE_DECODE, k[40], NULL, q[40],
		             NULL));
	}
	T_EQ(b.len[0][0], 18 + 1);
	T_EQ(b.len[1][0], 4 + 1);
	/* decided once: more decode tokens stay */
	for (uint32_t l = 0; l < 2; l++)
		T_OK(bx_sync(&b, l, 1, KVT_PHASE_DECODE, k[40], NULL, q[40],
		             NULL));
	T_EQ(b.len[0][0], 20);
	T_EQ(b.len[1][0], 6);
	policy_free(b.p);
}
