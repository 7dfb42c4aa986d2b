/*
 * test_policy.c — registry, spec parser, shared machinery, pressure and
 * every policy's rule with hand-computed expectations.
 *
 * The fixture (struct fx) is a miniature tenant: head_dim 1 f32 pages, a
 * staging array indexed by position, per-entry and layer state, and the
 * same compaction (compact_plan + policy_move_entries) the tenant applies,
 * so multi-sync scenarios run exactly as in the daemon.  With head_dim 1
 * and scale 1, a query q, a key k and a stored lse L give the attention
 * weight exp(q k - L): keys are ln(a) so that a query of 1 with lse 0 puts
 * weight a on an entry.
 */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>

#include "compact.h"
#include "policy.h"
#include "shm.h"
#include "test.h"
#include "weights.h"

#define FX_MAX 96   /* entries per list */
#define FX_KV 4     /* most KV heads */
#define FX_D 4      /* d_model */
#define FX_PT 4     /* page_tokens */
#define FX_H 8      /* most query heads */

struct fx {
	struct policy *p;
	struct policy_geom ge;
	uint32_t n_seen;
	uint32_t len[FX_KV];
	uint32_t pos[FX_KV][FX_MAX];
	float ent[FX_KV][FX_MAX * 8];
	float kv[FX_KV][FX_MAX * 2]; /* pages of [K: 4][V: 4] floats */
	void *pages[FX_KV][FX_MAX / FX_PT];
	uint8_t drop[FX_KV][FX_MAX];
	_Alignas(16) uint8_t state[4096];
	/* staged rows by position: [x: FX_D][q: n_heads][lse: n_heads], the
	 * parts the policy reads only (ipc/shm.h), q at qo and lse at lo */
	float stage[FX_MAX][FX_D + 2 * FX_H];
	uint32_t inputs;
	uint64_t qo, lo;
};

static struct policy *make_g(const char *spec, const struct policy_geom *ge)
{
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, ge, &p, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "policy_create(\"%s\"): %s: %s",
		        spec, kvt_errname(rc), err);
	return p;
}

static struct policy_geom geom(uint32_t n_heads, uint32_t n_kv)
{
	return (struct policy_geom){.n_layers = 2, .n_heads = n_heads,
	                            .n_kv_heads = n_kv, .head_dim = 1,
	                            .d_model = FX_D, .page_tokens = FX_PT,
	                            .dtype = KVT_DTYPE_F32, .headroom = 16};
}

static struct policy *make(const char *spec)
{
	struct policy_geom ge = geom(2, 1);
	return make_g(spec, &ge);
}

static void fx_init(struct fx *f, const char *spec, uint32_t n_heads,
                    uint32_t n_kv)
{
	memset(f, 0, sizeof(*f));
	f->ge = geom(n_heads, n_kv);
	f->p = make_g(spec, &f->ge);
	T_ASSERT(f->p->layer_state_bytes <= sizeof(f->state));
	T_ASSERT(f->p->entry_floats <= 8);
	uint64_t n;
	f->inputs = policy_inputs_of(f->p->ops->needs);
	shm_stage_layout(f->inputs, FX_D, n_heads, 1, &f->qo, &f->lo, &n);
	for (uint32_t h = 0; h < FX_KV; h++)
		for (uint32_t pg = 0; pg < FX_MAX / FX_PT; pg++)
			f->pages[h][pg] = f->kv[h] + pg * 2 * FX_PT;
}

static const float *fx_row(void *ctx, uint32_t pos)
{
	struct fx *f = ctx;
	return pos < f->n_seen ? f->stage[pos] : NULL;
}

/*
 * One sync of n new tokens.  a[k][h]: the new entry's key in head h is
 * ln(a) (a <= 0 gives key 0); x[k] the token's x (NULL = zeros); q[k][j]
 * and lse[k][j] per query head (NULL = 1 and 0).  Returns decide()'s rc.
 */
static int fx_sync(struct fx *f, uint32_t n, enum kvt_phase phase,
                   const float (*a)[FX_KV], const float (*x)[FX_D],
                   const float (*q)[FX_H], const float (*lse)[FX_H])
{
	uint32_t H = f->ge.n_heads, nkv = f->ge.n_kv_heads;
	uint32_t ef = f->p->entry_floats;
	/* packed as decide() wants them: q, lse [n][H] */
	static float xs[FX_MAX][FX_D], qs[FX_MAX * FX_H], ls[FX_MAX * FX_H];
	for (uint32_t k = 0; k < n; k++) {
		uint32_t pos = f->n_seen + k;
		float *row = f->stage[pos];
		for (uint32_t d = 0; d < FX_D; d++) {
			xs[k][d] = x ? x[k][d] : 0.0f;
			if (f->inputs & KVT_INPUT_X)
				row[d] = xs[k][d];
		}
		for (uint32_t j = 0; j < H; j++) {
			qs[k * H + j] = q ? q[k][j] : 1.0f;
			ls[k * H + j] = lse ? lse[k][j] : 0.0f;
			if (f->inputs & KVT_INPUT_Q)
				row[f->qo + j] = qs[k * H + j];
			if (f->inputs & KVT_INPUT_LSE)
				row[f->lo + j] = ls[k * H + j];
		}
		for (uint32_t h = 0; h < nkv; h++) {
			uint32_t e = f->len[h] + k;
			T_ASSERT(e < FX_MAX);
			f->pos[h][e] = pos;
			float av = a ? a[k][h] : 0.0f;
			f->kv[h][(e / FX_PT) * 2 * FX_PT + e % FX_PT] =
				av > 0 ? logf(av) : 0.0f;
			memset(&f->ent[h][e * ef], 0, ef * sizeof(float));
		}
	}
	f->n_seen += n;
	struct policy_head heads[FX_KV];
	for (uint32_t h = 0; h < nkv; h++) {
		f->len[h] += n;
		memset(f->drop[h], 0, FX_MAX);
		heads[h] = (struct policy_head){
			.pos = f->pos[h], .ent = ef ? f->ent[h] : NULL,
			.pages = f->pages[h], .len = f->len[h],
			.drop = f->drop[h]};
	}
	struct policy_layer l = {
		.layer = 0, .phase = phase, .n_new = n, .n_seen = f->n_seen,
		.x = &xs[0][0], .q = qs, .lse = ls,
		.staged = fx_row, .staged_ctx = f, .heads = heads,
		.state = f->p->layer_state_bytes ? f->state : NULL,
	};
	/* Staged rows are [x: FX_D][q: H][lse: H], the ring layout for
	 * d_model FX_D and head_dim 1. */
	int rc = policy_decide(f->p, &l);
	if (rc)
		return rc;
	for (uint32_t h = 0; h < nkv; h++) {
		uint32_t moves[2 * FX_MAX], nl;
		uint32_t nm = compact_plan(f->drop[h], f->len[h], moves, &nl);
		void *pg[FX_MAX / FX_PT];
		for (uint32_t i = 0; i < FX_MAX / FX_PT; i++)
			pg[i] = f->pages[h][i];
		compact_cpu(pg, FX_PT, sizeof(float), moves, nm);
		policy_move_entries(f->pos[h], ef ? f->ent[h] : NULL, ef, moves,
		                    nm);
		f->len[h] = nl;
	}
	return 0;
}

/* One token per sync, decode phase. */
static void fx_step(struct fx *f, const float *a, const float *x)
{
	float aa[1][FX_KV], xx[1][FX_D];
	memcpy(aa[0], a, sizeof(aa[0]));
	memcpy(xx[0], x ? x : (const float[FX_D]){0}, sizeof(xx[0]));
	T_OK(fx_sync(f, 1, KVT_PHASE_DECODE, aa, xx, NULL, NULL));
}

/* Head h holds exactly the positions in want[0..n) (any order). */
static void fx_expect_(const struct fx *f, uint32_t h, const uint32_t *want,
                       uint32_t n, int line)
{
	uint8_t seen[FX_MAX] = {0};
	for (uint32_t i = 0; i < f->len[h]; i++)
		seen[f->pos[h][i]] = 1;
	int ok = f->len[h] == n;
	for (uint32_t i = 0; i < n && ok; i++)
		ok = seen[want[i]];
	if (!ok) {
		char got[512] = "";
		size_t o = 0;
		for (uint32_t p = 0; p < FX_MAX && o < 480; p++)
			if (seen[p])
				o += (size_t)snprintf(got + o, sizeof(got) - o,
				                      "%u ", p);
		th_fail(__FILE__, line, "%s head %u: holds {%s}, %u entries, "
		        "expected %u", f->p->spec, h, got, f->len[h], n);
	}
}
#define FX_EXPECT(f, h, ...)                                                   \
	do {                                                                   \
		const uint32_t w_[] = {__VA_ARGS__};                           \
		fx_expect_(f, h, w_, sizeof(w_) / sizeof(w_[0]), __LINE__);    \
	} while (0)

/* A refused spec: KVT_EPOLICY, no object, a reason. */
static void refused_g(const char *spec, const struct policy_geom *ge,
                      int line)
{
	struct policy *p = (struct policy *)&p; /* must be reset to NULL */
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, ge, &p, err, sizeof(err));
	if (rc != KVT_EPOLICY)
		th_fail(__FILE__, line, "\"%s\" gave %s, expected EPOLICY",
		        spec ? spec : "(null)", kvt_errname(rc));
	if (p != NULL || !err[0])
		th_fail(__FILE__, line, "\"%s\": object or no reason", spec);
}
#define refused(spec)                                                          \
	do {                                                                   \
		struct policy_geom g_ = geom(2, 1);                            \
		refused_g(spec, &g_, __LINE__);                                \
	} while (0)

/* Refused with a reason containing needle. */
static void refused_why(const char *spec, const struct policy_geom *ge,
                        const char *needle, int line)
{
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, ge, &p, err, sizeof(err));
	if (rc != KVT_EPOLICY || p || !strstr(err, needle))
		th_fail(__FILE__, line, "\"%s\" gave %s (%s), expected EPOLICY "
		        "mentioning '%s'", spec, kvt_errname(rc), err, needle);
}

/* ------------------------------------------------------------ parsing */

TEST(policy, registry)
{
	static const char *const names[] = {"full", "random", "streaming",
	                                    "h2o", "snapkv", "tova", "kvzap",
	                                    "fastkvzip", "kvpop", "knorm",
	                                    "expected_attention", "pyramidkv"};
	T_EQ(policy_count(), 12);
	for (size_t i = 0; i < 12; i++) {
		T_EQ_STR(policy_at(i)->name, names[i]);
		T_ASSERT(policy_at(i)->help && policy_at(i)->help[0]);
		T_ASSERT(policy_at(i)->decide);
	}
	T_ASSERT(policy_at(12) == NULL);
}

TEST(policy, parse_full)
{
	struct policy *p = make("full");
	T_EQ_STR(p->ops->name, "full");
	T_EQ_STR(p->spec, "full");
	T_EQ(p->args.set, 0);
	T_EQ_U64(policy_budget(p, 1000), UINT32_MAX);
	T_EQ(p->entry_floats, 0);
	T_EQ(p->layer_state_bytes, 0);
	policy_free(p);
	policy_free(NULL);
}

TEST(policy, parse_streaming_defaults)
{
	struct policy *p = make("streaming");
	T_EQ(p->args.sinks, 4);
	T_EQ(p->args.tokens, 256);
	T_EQ(p->args.set, 0);
	policy_free(p);
}

TEST(policy, parse_keys)
{
	struct policy *p = make("streaming:sinks=2,tokens=10");
	T_EQ(p->args.sinks, 2);
	T_EQ(p->args.tokens, 10);
	T_EQ(p->args.set, POLICY_KEY_SINKS | POLICY_KEY_TOKENS);
	policy_free(p);

	p = make("streaming:ratio=.25");
	T_ASSERT(p->args.ratio == 0.25);
	policy_free(p);

	p = make("streaming:tokens=4294967295,sinks=0");
	T_EQ_U64(p->args.tokens, 4294967295u);
	policy_free(p);

	p = make("h2o:agg=max,window=3,every=4,tokens=9");
	T_EQ(p->args.agg, POLICY_AGG_MAX);
	T_EQ(p->args.window, 3);
	T_EQ(p->args.every, 4);
	T_EQ(p->entry_floats, 2); /* G = 2 */
	policy_free(p);

	p = make("random:seed=18446744073709551615");
	T_EQ_U64(p->args.seed, UINT64_MAX);
	T_EQ(p->args.tokens, 256);
	policy_free(p);

	p = make("snapkv");
	T_EQ(p->args.window, 64);
	T_EQ(p->args.kernel, 5);
	T_ASSERT(p->args.ratio == 0.5);
	T_EQ(p->lookback, 64);
	policy_free(p);

	p = make("tova:ratio=0.5");
	T_EQ(p->args.window, 1);
	policy_free(p);
}

TEST(policy, unknown_name_message)
{
	struct policy *p = NULL;
	struct policy_geom ge = geom(2, 1);
	char err[KVT_ERRTEXT_MAX] = "";
	T_ERR(policy_create("x", &ge, &p, err, sizeof(err)), KVT_EPOLICY);
	T_EQ_STR(err, "unknown policy 'x' (known: full, random, streaming, "
	              "h2o, snapkv, tova, kvzap, fastkvzip, kvpop, knorm, "
	              "expected_attention, pyramidkv)");
	T_ASSERT(p == NULL);
}

TEST(policy, refusals)
{
	refused(NULL);
	refused("");
	refused("nope");
	refused("ful");
	refused("Full");
	refused("streaming:foo=1");         /* unknown key */
	refused("full:sinks=1");            /* key the policy does not take */
	refused("streaming:window=8");
	refused("streaming:sinks=1,sinks=2"); /* repeated */
	refused("streaming:sinks=x");
	refused("streaming:sinks=-1");
	refused("streaming:sinks=+1");
	refused("streaming:sinks=1.0");
	refused("streaming:sinks=0x10");
	refused("streaming:sinks=4294967296");
	refused("streaming:tokens=0");
	refused("streaming:tokens=5,ratio=0.5");
	refused("streaming:ratio=1");
	refused("streaming:ratio=-0.1");
	refused("streaming:ratio=nan");
	refused("streaming:ratio=1e400");
	refused("streaming:sinks=1,");
	refused("streaming:,sinks=1");
	refused("streaming:");
	refused("streaming:sinks");
	refused("streaming:sinks=");
	refused("streaming: sinks=1");
	refused("streaming:sinks=1\t");
	refused("random:seed=18446744073709551616");
	refused("random:tokens=3,ratio=0.5");
	refused("h2o:agg=min");
	refused("h2o:agg=");
	refused("h2o:every=0");
	refused("h2o:threshold=1");
	refused("snapkv:kernel=4");
	refused("snapkv:kernel=0");
	refused("snapkv:window=0");
	refused("tova:delay=3");
	refused("kvzap:threshold=nan");
	refused("kvzap:threshold=--1");
	refused("kvzap:threshold=1e40");   /* not a finite float */
	refused("kvzap:tokens=5,model=x");
	refused("kvzap:threshold=-4");     /* model missing */
	refused("kvzap:model=/nonexistent/w.safetensors");
	refused("fastkvzip:ratio=0.5,threshold=0.3,model=x");
	refused("kvpop:ratio=0.5");
	/* geometry */
	struct policy_geom bad = geom(3, 2);
	refused_g("full", &bad, __LINE__);
	refused_g("full", NULL, __LINE__);

	char longspec[KVT_SPEC_MAX + 8];
	memset(longspec, '1', sizeof(longspec));
	memcpy(longspec, "streaming:sinks=", 16);
	longspec[sizeof(longspec) - 1] = '\0';
	refused(longspec);
}

TEST(policy, threshold_values)
{
	/* kvzap needs a model; the parser is checked through the error of a
	 * missing file, after the value parsed */
	struct policy_geom ge = geom(2, 1);
	refused_why("kvzap:threshold=-4.5,model=/nonexistent", &ge,
	            "/nonexistent", __LINE__);
	refused_why("kvzap:threshold=-x,model=/n", &ge, "signed decimal",
	            __LINE__);
}

/* ------------------------------------------------------------ machinery */

TEST(policy, budget_and_protected)
{
	struct policy_args a;
	memset(&a, 0, sizeof(a));
	T_EQ_U64(policy_budget_args(&a, 50), UINT32_MAX);
	a.tokens = 7;
	T_EQ(policy_budget_args(&a, 50), 7);
	a.tokens = 0;
	a.ratio = 0.5;
	a.set = POLICY_KEY_RATIO;
	T_EQ(policy_budget_args(&a, 7), 4);   /* 7 - floor(3.5) */
	T_EQ(policy_budget_args(&a, 10), 5);
	T_EQ(policy_budget_args(&a, 0), 0);
	a.ratio = 0.25;
	T_EQ(policy_budget_args(&a, 10), 8);  /* 10 - floor(2.5) */

	memset(&a, 0, sizeof(a));
	a.sinks = 2;
	a.window = 3;
	const int want[10] = {1, 1, 0, 0, 0, 0, 0, 1, 1, 1};
	for (uint32_t pos = 0; pos < 10; pos++)
		T_EQ(policy_protected(&a, pos, 10), want[pos]);
	a.sinks = 0;
	a.window = 8; /* longer than what was seen: all protected */
	for (uint32_t pos = 0; pos < 5; pos++)
		T_EQ(policy_protected(&a, pos, 5), 1);
}

TEST(policy, pressure_mapping)
{
	struct policy *p = make("streaming:tokens=10");
	T_EQ(policy_budget(p, 100), 10);
	policy_set_pressure(p, 0.5f);
	T_EQ(policy_budget(p, 100), 8);  /* 10 - floor(2.5) */
	policy_set_pressure(p, 1.0f);
	T_EQ(policy_budget(p, 100), 5);  /* half */
	policy_set_pressure(p, 7.0f);    /* clamped to 1 */
	T_ASSERT(p->pressure == 1.0f);
	T_EQ(policy_budget(p, 100), 5);
	policy_set_pressure(p, NAN);
	T_ASSERT(p->pressure == 0.0f);
	T_EQ(policy_budget(p, 100), 10);
	policy_set_pressure(p, -1.0f);
	T_ASSERT(p->pressure == 0.0f);
	policy_free(p);

	p = make("streaming:tokens=1");
	policy_set_pressure(p, 1.0f);
	T_EQ(policy_budget(p, 100), 1);  /* never below 1 */
	policy_free(p);

	p = make("streaming:ratio=0.5");
	policy_set_pressure(p, 1.0f);
	T_EQ(policy_budget(p, 10), 3);   /* B 5 -> 5 - floor(2.5) */
	T_EQ(policy_budget(p, 0), 0);
	policy_free(p);

	p = make("full");
	policy_set_pressure(p, 1.0f);
	T_EQ_U64(policy_budget(p, 10), UINT32_MAX); /* no budget: ignored */
	policy_free(p);

	/* thresholds: LOG tau + 2 level, PROB tau + (1 - tau) level / 2 */
	struct policy fake;
	memset(&fake, 0, sizeof(fake));
	struct policy_ops ops = {.name = "t", .tau = POLICY_TAU_LOG};
	fake.ops = &ops;
	fake.args.threshold = -4.0f;
	fake.pressure = 0.5f;
	T_ASSERT(policy_threshold(&fake) == -3.0f);
	ops.tau = POLICY_TAU_PROB;
	fake.args.threshold = 0.2f;
	fake.pressure = 1.0f;
	T_ASSERT(fabsf(policy_threshold(&fake) - 0.6f) < 1e-6f);
	ops.tau = POLICY_TAU_NONE;
	T_ASSERT(policy_threshold(&fake) == 0.2f);
}

TEST(policy, due_every)
{
	struct policy *p = make("h2o:every=4");
	struct policy_layer l = {.n_new = 1, .n_seen = 3};
	T_EQ(policy_due(p, &l), 0);
	l.n_seen = 4;
	T_EQ(policy_due(p, &l), 1);
	l.n_seen = 5;
	T_EQ(policy_due(p, &l), 0);
	l.n_new = 6;
	l.n_seen = 10; /* crosses 8 */
	T_EQ(policy_due(p, &l), 1);
	l.n_new = 3;
	l.n_seen = 11; /* 8..11: no multiple of 4 crossed after 8 */
	T_EQ(policy_due(p, &l), 0);
	policy_free(p);
	p = make("h2o");
	T_EQ(policy_due(p, &l), 1);
	policy_free(p);
}

TEST(policy, scratch_arena)
{
	struct policy *p = make("full");
	char *a = policy_scratch(p, 10);
	char *b = policy_scratch(p, 1 << 20); /* a new block */
	T_ASSERT(a && b);
	T_EQ((uintptr_t)a % 64, 0);
	T_EQ((uintptr_t)b % 64, 0);
	memset(a, 1, 10);
	memset(b, 2, 1 << 20);
	T_ASSERT(a[9] == 1); /* earlier pointers stay valid */
	struct policy_layer l = {0};
	T_OK(policy_decide(p, &l)); /* resets into one block */
	T_ASSERT(p->scratch_used == 0);
	T_ASSERT(p->scratch_peak >= (1 << 20) + 64);
	a = policy_scratch(p, 1 << 20);
	T_ASSERT(a);
	memset(a, 3, 1 << 20);
	policy_free(p);
}

/* ------------------------------------------------------------ streaming */

TEST(policy, streaming_rule)
{
	struct fx f;
	/* sinks 2, tokens 5, one token per sync: keeps 0, 1 and the three
	 * newest; at most one entry leaves per step once full */
	fx_init(&f, "streaming:sinks=2,tokens=5", 2, 2);
	const float a[FX_KV] = {0};
	for (uint32_t n = 1; n <= 20; n++) {
		fx_step(&f, a, NULL);
		T_EQ(f.len[0], n < 5 ? n : 5);
		T_EQ(f.len[1], n < 5 ? n : 5);
	}
	FX_EXPECT(&f, 0, 0, 1, 17, 18, 19);
	FX_EXPECT(&f, 1, 0, 1, 17, 18, 19);
	policy_free(f.p);

	/* a prefill of 10 at once: B 6, S' 4, recent 2 */
	fx_init(&f, "streaming:tokens=6", 2, 1);
	T_OK(fx_sync(&f, 10, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 1, 2, 3, 8, 9);
	policy_free(f.p);

	/* sinks beyond the budget: B 3, S' 3, recent 0 */
	fx_init(&f, "streaming:sinks=8,tokens=3", 2, 1);
	T_OK(fx_sync(&f, 10, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 1, 2);
	policy_free(f.p);

	/* ratio: n 7, ratio 0.5: B 4; sinks 1: keep 0, 4, 5, 6 */
	fx_init(&f, "streaming:sinks=1,ratio=0.5", 2, 1);
	T_OK(fx_sync(&f, 7, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 4, 5, 6);
	policy_free(f.p);

	/* budget larger than the length keeps everything */
	fx_init(&f, "streaming:tokens=12", 2, 1);
	T_OK(fx_sync(&f, 10, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	T_EQ(f.len[0], 10);
	/* a sync without new tokens changes nothing */
	T_OK(fx_sync(&f, 0, KVT_PHASE_DECODE, NULL, NULL, NULL, NULL));
	T_EQ(f.len[0], 10);
	policy_free(f.p);
}

TEST(policy, streaming_pressure)
{
	struct fx f;
	fx_init(&f, "streaming:sinks=1,tokens=6", 2, 1);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 3, 4, 5, 6, 7);
	policy_set_pressure(f.p, 1.0f); /* B 3: sink + 2 recent */
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 7, 8);
	policy_free(f.p);
}

/* ------------------------------------------------------------ random */

TEST(policy, random_rule)
{
	struct fx f, g;
	fx_init(&f, "random:seed=7,tokens=4,sinks=1,window=1", 2, 2);
	fx_init(&g, "random:seed=7,tokens=4,sinks=1,window=1", 2, 2);
	T_OK(fx_sync(&f, 12, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	/* one sync of 12 or 12 syncs of 1: scores are a function of the
	 * position, but decisions are final, so compare the same timing */
	T_OK(fx_sync(&g, 12, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	for (uint32_t h = 0; h < 2; h++) {
		T_EQ(f.len[h], 4);
		uint8_t has[FX_MAX] = {0};
		for (uint32_t i = 0; i < f.len[h]; i++)
			has[f.pos[h][i]] = 1;
		T_ASSERT(has[0] && has[11]); /* sink and window */
		T_EQ(memcmp(f.pos[h], g.pos[h], 4 * sizeof(uint32_t)), 0);
	}
	policy_free(f.p);
	policy_free(g.p);

	/* budget larger than the length; every=N timing */
	fx_init(&f, "random:tokens=50", 2, 1);
	T_OK(fx_sync(&f, 12, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	T_EQ(f.len[0], 12);
	policy_free(f.p);
	fx_init(&f, "random:tokens=2,every=4", 2, 1);
	const float a[FX_KV] = {0};
	fx_step(&f, a, NULL);
	fx_step(&f, a, NULL);
	fx_step(&f, a, NULL);
	T_EQ(f.len[0], 3); /* not due before 4 */
	fx_step(&f, a, NULL);
	T_EQ(f.len[0], 2);
	policy_free(f.p);
}

/* ------------------------------------------------------------ h2o */

TEST(policy, h2o_accumulates_and_evicts)
{
	/* G = 2 query heads on one KV head, q 1, lse 0: entry i receives a_i
	 * per query head from every query at or after it, so after n tokens
	 * S_i = a_i (n - i).  tokens 3, window 1.
	 *   n 4: S = .4 2.4 .6 .5, pos 3 protected, keep 2 of {0,1,2}: drop 0
	 *   n 5: S1 3.2 S2 .9 S3 1.0, pos 4 protected: drop 2 */
	struct fx f;
	fx_init(&f, "h2o:tokens=3,window=1", 2, 1);
	const float a[5] = {0.1f, 0.8f, 0.3f, 0.5f, 0.05f};
	for (uint32_t n = 0; n < 5; n++) {
		float av[FX_KV] = {a[n]};
		fx_step(&f, av, NULL);
		if (n == 3)
			FX_EXPECT(&f, 0, 1, 2, 3);
	}
	FX_EXPECT(&f, 0, 1, 3, 4);
	/* the state moved with the entries: entry of pos 1 holds 4 * .8 per
	 * query head */
	for (uint32_t i = 0; i < f.len[0]; i++)
		if (f.pos[0][i] == 1) {
			T_ASSERT(fabsf(f.ent[0][2 * i] - 3.2f) < 1e-4f);
			T_ASSERT(fabsf(f.ent[0][2 * i + 1] - 3.2f) < 1e-4f);
		}
	policy_free(f.p);
}

TEST(policy, h2o_prefill_window_default_and_every)
{
	/* One prefill of 6: S_i = a_i (6 - i).  tokens 4, window defaults to
	 * 4 / 2 = 2 (pos 4, 5); keep 2 of {0..3} by S:
	 * a .5 .1 .3 .05 -> S 3.0 .5 1.2 .15: keep 0, 2 */
	struct fx f;
	fx_init(&f, "h2o:tokens=4", 2, 1);
	const float a[6][FX_KV] = {{.5f}, {.1f}, {.3f}, {.05f}, {.9f}, {.9f}};
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 2, 4, 5);
	policy_free(f.p);

	/* every=4 with tokens 2, window 0: nothing evicted at n 1..3 */
	fx_init(&f, "h2o:tokens=2,window=0,every=4", 2, 1);
	const float b[4] = {0.9f, 0.1f, 0.2f, 0.3f};
	for (uint32_t n = 0; n < 4; n++) {
		float av[FX_KV] = {b[n]};
		fx_step(&f, av, NULL);
		T_EQ(f.len[0], n < 3 ? n + 1 : 2);
	}
	/* S at n 4: .9*4 .1*3 .2*2 .3*1 = 3.6 .3 .4 .3: keep 0, 2 */
	FX_EXPECT(&f, 0, 0, 2);
	policy_free(f.p);
}

TEST(policy, h2o_edges)
{
	struct fx f;
	/* q 0: every weight is exp(0 - 0) = 1, S_i = 6 - i: the oldest
	 * received most */
	fx_init(&f, "h2o:tokens=3,window=0", 2, 1);
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL, NULL, NULL,
	             (const float[6][FX_H]){{0}}, NULL));
	FX_EXPECT(&f, 0, 0, 1, 2);
	policy_free(f.p);

	/* all scores equal (snapkv, every a .5): ties keep the most recent */
	fx_init(&f, "snapkv:window=2,kernel=1,tokens=5", FX_H, 1);
	const float e8[8][FX_KV] = {{.5f}, {.5f}, {.5f}, {.5f}, {.5f}, {.5f},
	                            {.5f}, {.5f}};
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, e8, NULL, NULL, NULL));
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, e8, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 3, 4, 5, 6, 7, 8);
	policy_free(f.p);

	/* a NaN lse is refused before anything is scored (test
	 * policy.inputs_refused has every policy and input) */
	fx_init(&f, "h2o:tokens=2,window=0", 2, 1);
	float lse[3][FX_H] = {{0, 0}, {NAN, NAN}, {0, 0}};
	const float a[3][FX_KV] = {{.5f}, {.5f}, {.5f}};
	T_ERR(fx_sync(&f, 3, KVT_PHASE_PREFILL, a, NULL, NULL, lse),
	      KVT_EINVAL);
	T_ASSERT(strstr(f.p->why, "layer 0, position 1: staged lse of query "
	                          "head 0 is NaN"));
	policy_free(f.p);

	/* window longer than the sequence: everything protected */
	fx_init(&f, "h2o:tokens=1,window=50", 2, 1);
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL, NULL, NULL, NULL, NULL));
	T_EQ(f.len[0], 6);
	policy_free(f.p);

	/* zero-length lists and empty syncs */
	fx_init(&f, "h2o:tokens=1", 2, 1);
	T_OK(fx_sync(&f, 0, KVT_PHASE_DECODE, NULL, NULL, NULL, NULL));
	T_EQ(f.len[0], 0);
	policy_free(f.p);
}

/* ------------------------------------------------------------ tova */

TEST(policy, tova_per_layer)
{
	/* 2 KV heads, G 1, q 1, lse 0: the newest query gives entry i weight
	 * a_i in head 0 and b_i in head 1; score (a + b) / 2.
	 *   a .1 .6 .2 .4 .3, b .5 .1 .1 .1 .1 -> .3 .35 .15 .25 .2
	 *   n 4: protect 3, keep 2 of {0,1,2}: drop 2
	 *   n 5: protect 4, keep 2 of {0,1,3}: drop 3 */
	struct fx f;
	fx_init(&f, "tova:tokens=3", 2, 2);
	const float ab[5][2] = {{.1f, .5f}, {.6f, .1f}, {.2f, .1f},
	                        {.4f, .1f}, {.3f, .1f}};
	for (uint32_t n = 0; n < 5; n++) {
		float av[FX_KV] = {ab[n][0], ab[n][1]};
		fx_step(&f, av, NULL);
		if (n == 3) {
			FX_EXPECT(&f, 0, 0, 1, 3);
			FX_EXPECT(&f, 1, 0, 1, 3);
		}
	}
	FX_EXPECT(&f, 0, 0, 1, 4);
	FX_EXPECT(&f, 1, 0, 1, 4);
	policy_free(f.p);

	/* only the newest query of a multi-token sync counts: prefill of 4
	 * where query 3 puts a .1 .2 .3 .4 on 0..3 (tokens 2, window 1):
	 * keep 3 (protected) and 2 */
	fx_init(&f, "tova:tokens=2", 2, 1);
	const float a4[4][FX_KV] = {{.1f}, {.2f}, {.3f}, {.4f}};
	T_OK(fx_sync(&f, 4, KVT_PHASE_PREFILL, a4, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 2, 3);
	policy_free(f.p);
}

TEST(policy, tova_heads_differ)
{
	/* Lists that differ (pos 1 only in head 0): the union is scored,
	 * head 1 adds nothing for pos 1.  a .1 .7 .2 .4, b .5 - .1 .1:
	 * scores .3 .35 .15 .25; tokens 2, window 1: keep 3 and 1. */
	struct fx f;
	fx_init(&f, "tova:tokens=2", 2, 2);
	const float ab[4][FX_KV] = {{.1f, .5f}, {.7f, .1f}, {.2f, .1f},
	                            {.4f, .1f}};
	/* build the lists by hand: no decision yet (budget 2 of 4 would
	 * evict), so place entries directly */
	for (uint32_t k = 0; k < 4; k++) {
		f.stage[k][f.qo] = f.stage[k][f.qo + 1] = 1.0f;
		for (uint32_t h = 0; h < 2; h++) {
			if (h == 1 && k == 1)
				continue;
			uint32_t e = f.len[h]++;
			f.pos[h][e] = k;
			f.kv[h][(e / FX_PT) * 2 * FX_PT + e % FX_PT] =
				logf(ab[k][h]);
		}
	}
	f.n_seen = 4;
	float q[1][FX_H] = {{1, 1}}, lse[1][FX_H] = {{0, 0}};
	struct policy_head heads[2];
	for (uint32_t h = 0; h < 2; h++)
		heads[h] = (struct policy_head){.pos = f.pos[h],
		                                .pages = f.pages[h],
		                                .len = f.len[h],
		                                .drop = f.drop[h]};
	struct policy_layer l = {.n_new = 1, .n_seen = 4, .q = q[0],
	                         .lse = lse[0], .heads = heads};
	T_OK(policy_decide(f.p, &l));
	const uint8_t want0[4] = {1, 0, 1, 0}, want1[3] = {1, 1, 0};
	T_EQ(memcmp(f.drop[0], want0, 4), 0);
	T_EQ(memcmp(f.drop[1], want1, 3), 0);
	policy_free(f.p);
}

/* ------------------------------------------------------------ snapkv */

TEST(policy, snapkv_end_of_prefill)
{
	/*
	 * 8 query heads on 1 KV head (G 8); prompt of 8, window 2 (queries at 6,
	 * 7 with q 1, lse 0), so s_i = a_i for i < 6.
	 * a: .1 .5 .2 .9 .3 .4 for 0..5. */
	const float a[8][FX_KV] = {{.1f}, {.5f}, {.2f}, {.9f}, {.3f}, {.4f},
	                           {.5f}, {.5f}};
	struct fx f;
	/* kernel 1 (no pooling), tokens 5: 2 window entries protected,
	 * keep 3 of 0..5 by a: 3, 1, 5 */
	fx_init(&f, "snapkv:window=2,kernel=1,tokens=5", FX_H, 1);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	T_EQ(f.len[0], 8); /* nothing during prefill */
	const float d1[1][FX_KV] = {{.5f}};
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 1, 3, 5, 6, 7, 8);
	/* once only: later decode syncs never evict */
	for (int i = 0; i < 5; i++)
		T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, NULL, NULL));
	T_EQ(f.len[0], 11);
	policy_free(f.p);

	/* kernel 3 max pool over 0..5: .5 .5 .9 .9 .9 .4: keep 2, 3, 4 */
	fx_init(&f, "snapkv:window=2,kernel=3,tokens=5", FX_H, 1);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 2, 3, 4, 6, 7, 8);
	policy_free(f.p);

	/* ratio 0.5 of the prompt: B 4, protected 2, keep 2: 3, 1; sinks 1
	 * protects 0 too: then B - 3 = 1: keep 3 */
	fx_init(&f, "snapkv:window=2,kernel=1,ratio=0.5,sinks=1", FX_H, 1);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	T_OK(fx_sync(&f, 2, KVT_PHASE_DECODE,
	             (const float[2][FX_KV]){{.5f}, {.5f}}, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 3, 6, 7, 8, 9);
	policy_free(f.p);

	/* prompt not longer than the window, or within budget: keep all */
	fx_init(&f, "snapkv:window=8,tokens=2", FX_H, 1);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, NULL, NULL));
	T_EQ(f.len[0], 9);
	policy_free(f.p);
	fx_init(&f, "snapkv:window=2,tokens=8", FX_H, 1);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, NULL, NULL));
	T_EQ(f.len[0], 9);
	policy_free(f.p);
}

/* ------------------------------------------------------------ weights */

static const char *tmp_path(const char *name)
{
	static char buf[4][512];
	static int n;
	char *b = buf[n++ % 4];
	snprintf(b, 512, "%s/%s", th_tmpdir(), name);
	return b;
}

static void write_w(const char *path, const struct weights_tensor *t,
                    size_t n)
{
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = weights_write(path, t, n, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "weights_write: %s", err);
}

/* Replaces the first float equal to from in the file by NaN. */
static void poison(const char *path, float from)
{
	FILE *f = fopen(path, "r+b");
	T_ASSERT(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	char *b = malloc((size_t)n);
	fseek(f, 0, SEEK_SET);
	T_EQ(fread(b, 1, (size_t)n, f), (size_t)n);
	for (long i = 0; i + 4 <= n; i++) {
		float v;
		memcpy(&v, b + i, 4);
		if (v == from) {
			float nan = NAN;
			fseek(f, i, SEEK_SET);
			fwrite(&nan, 4, 1, f);
			break;
		}
	}
	fclose(f);
	free(b);
}

/* kvzap linear weights for 2 layers, 2 KV heads, d 4: head 0 reads x0,
 * head 1 reads x1.  names: "kvzap" or "kvpress" scheme; skip_b1: leave
 * layer 1's bias out; wide: a bad shape. */
static void kvzap_linear(const char *path, int kvpress, int skip_b1, int wide)
{
	static const float W[8] = {1, 0, 0, 0, 0, 1, 0, 0};
	static const float Ww[10] = {1, 0, 0, 0, 0, 0, 1, 0, 0, 0};
	static const float b[2] = {0, 1234.5f};
	static const float z[2] = {0, 0};
	struct weights_tensor t[4];
	char names[4][32];
	size_t n = 0;
	for (uint32_t l = 0; l < 2; l++) {
		snprintf(names[n], 32, kvpress ? "layers.%u.weight"
		                               : "kvzap.%u.weight", l);
		t[n] = (struct weights_tensor){names[n], 2, {2, wide ? 5 : 4},
		                               wide ? Ww : W};
		n++;
		if (l == 1 && skip_b1)
			continue;
		snprintf(names[n], 32, kvpress ? "layers.%u.bias"
		                               : "kvzap.%u.bias", l);
		/* layer 0's bias is 0; layer 1's carries a marker value */
		t[n] = (struct weights_tensor){names[n], 1, {2},
		                               l ? b : z};
		n++;
	}
	write_w(path, t, n);
}

TEST(policy, kvzap_linear_rule)
{
	/* window 2, threshold 0.5: an entry is decided at n = pos + 3.
	 * head 0 score x0, head 1 score x1. */
	const char *w = tmp_path("kvzap.safetensors");
	kvzap_linear(w, 0, 0, 0);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=2,threshold=0.5",
	         w);
	const float x[5][FX_D] = {{.9f, .1f}, {.2f, .8f}, {.7f, .5f},
	                          {.1f, .1f}, {.6f, .3f}};
	const float a[FX_KV] = {0};
	struct fx f;
	fx_init(&f, spec, 2, 2);
	T_EQ(f.p->entry_floats, 1);
	for (uint32_t n = 0; n < 5; n++) {
		fx_step(&f, a, x[n]);
		if (n == 2) { /* pos 0 decided: head 1 drops it */
			FX_EXPECT(&f, 0, 0, 1, 2);
			FX_EXPECT(&f, 1, 1, 2);
		}
	}
	/* pos 1: head 0 drops (.2); pos 2: .7 keeps, .5 == tau keeps;
	 * pos 3, 4 still in the window */
	FX_EXPECT(&f, 0, 0, 2, 3, 4);
	FX_EXPECT(&f, 1, 1, 2, 3, 4);
	/* the score moved with its entry */
	for (uint32_t i = 0; i < f.len[1]; i++)
		if (f.pos[1][i] == 1)
			T_ASSERT(f.ent[1][i] == 0.8f);
	policy_free(f.p);

	/* the same in one prefill sync: pos 0..2 leave the window at once */
	fx_init(&f, spec, 2, 2);
	T_OK(fx_sync(&f, 5, KVT_PHASE_PREFILL, NULL, x, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 2, 3, 4);
	FX_EXPECT(&f, 1, 1, 2, 3, 4);
	/* decided once: pos 0 of head 0 (.9) stays under any later pressure */
	policy_set_pressure(f.p, 1.0f); /* tau 2.5 */
	fx_step(&f, a, (const float[FX_D]){.9f, .9f});
	/* pos 3 left now: .1 < 2.5 dropped in both; pos 0, 2 untouched */
	FX_EXPECT(&f, 0, 0, 2, 4, 5);
	FX_EXPECT(&f, 1, 1, 2, 4, 5);
	policy_free(f.p);

	/* window 0 decides at arrival; a NaN x is refused before it is
	 * scored (policy.inputs_refused) */
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=0,threshold=0", w);
	fx_init(&f, spec, 2, 2);
	T_ERR(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL,
	              (const float[1][FX_D]){{NAN, 1.0f}}, NULL, NULL),
	      KVT_EINVAL);
	f.n_seen = 0;
	f.len[0] = f.len[1] = 0;
	fx_step(&f, a, (const float[FX_D]){0.0f, -1.0f});
	FX_EXPECT(&f, 0, 0); /* 0 >= 0 keeps */
	T_EQ(f.len[1], 0);
	policy_free(f.p);

	/* sinks protect */
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=0,sinks=1,"
	         "threshold=5", w);
	fx_init(&f, spec, 2, 2);
	fx_step(&f, a, x[0]);
	fx_step(&f, a, x[1]);
	FX_EXPECT(&f, 0, 0);
	FX_EXPECT(&f, 1, 0);
	policy_free(f.p);
}

TEST(policy, kvzap_mlp_and_kvpress_dir)
{
	/* MLP hidden 1: head 0 = gelu(x0), head 1 = -gelu(x0); threshold 0
	 * keeps head 0 for x0 >= 0 and head 1 only at x0 = 0. */
	const char *dir = tmp_path("kvzap-mlp");
	T_EQ(mkdir(dir, 0755), 0);
	char path[600];
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	static const float W1[4] = {1, 0, 0, 0}, b1[1] = {0};
	static const float W2[2] = {1, -1}, b2[2] = {0, 0};
	struct weights_tensor t[8];
	char nm[8][32];
	for (uint32_t l = 0; l < 2; l++) {
		snprintf(nm[4 * l], 32, "layers.%u.0.weight", l);
		snprintf(nm[4 * l + 1], 32, "layers.%u.0.bias", l);
		snprintf(nm[4 * l + 2], 32, "layers.%u.2.weight", l);
		snprintf(nm[4 * l + 3], 32, "layers.%u.2.bias", l);
		t[4 * l] = (struct weights_tensor){nm[4 * l], 2, {1, 4}, W1};
		t[4 * l + 1] = (struct weights_tensor){nm[4 * l + 1], 1, {1}, b1};
		t[4 * l + 2] = (struct weights_tensor){nm[4 * l + 2], 2, {2, 1},
		                                       W2};
		t[4 * l + 3] = (struct weights_tensor){nm[4 * l + 3], 1, {2}, b2};
	}
	write_w(path, t, 8);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	FILE *c = fopen(path, "w");
	fprintf(c, "{\"input_dim\": 4, \"output_dim\": 2, \"hidden_dim\": 1, "
	           "\"n_modules\": 2}\n");
	fclose(c);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=0,threshold=0", dir);
	struct fx f;
	fx_init(&f, spec, 2, 2);
	const float a[FX_KV] = {0};
	fx_step(&f, a, (const float[FX_D]){1.0f});
	fx_step(&f, a, (const float[FX_D]){-1.0f});
	fx_step(&f, a, (const float[FX_D]){0.0f});
	/* gelu(-1) = -.159: head 0 drops pos 1, head 1 (+.159) keeps it */
	FX_EXPECT(&f, 0, 0, 2);
	FX_EXPECT(&f, 1, 1, 2);
	policy_free(f.p);

	/* config.json describing another model is refused */
	c = fopen(path, "w");
	fprintf(c, "{\"input_dim\": 8, \"output_dim\": 2, \"hidden_dim\": 1}\n");
	fclose(c);
	struct policy_geom ge = geom(2, 2);
	refused_why(spec, &ge, "input_dim", __LINE__);
}

TEST(policy, kvzap_weight_refusals)
{
	struct policy_geom ge = geom(2, 2);
	char spec[600];
	const char *w = tmp_path("bad.safetensors");
	/* missing tensor */
	kvzap_linear(w, 1, 1, 0);
	snprintf(spec, sizeof(spec), "kvzap:model=%s", w);
	refused_why(spec, &ge, "layers.1.bias", __LINE__);
	/* bad shape */
	kvzap_linear(w, 0, 0, 1);
	refused_why(spec, &ge, "shape", __LINE__);
	/* fine, then NaN */
	kvzap_linear(w, 0, 0, 0);
	struct policy *p = make_g(spec, &ge);
	policy_free(p);
	poison(w, 1234.5f);
	refused_why(spec, &ge, "NaN", __LINE__);
	/* more layers than the model */
	kvzap_linear(w, 0, 0, 0);
	struct policy_geom one = ge;
	one.n_layers = 1;
	refused_why(spec, &one, "more layers", __LINE__);
	/* fewer: a 3-layer model lacks layer 2 */
	struct policy_geom three = ge;
	three.n_layers = 3;
	refused_why(spec, &three, "kvzap.2.weight", __LINE__);
	/* not KVzap at all */
	write_w(w, &(struct weights_tensor){"x", 1, {1}, (const float[1]){0}},
	        1);
	refused_why(spec, &ge, "no KVzap tensors", __LINE__);
}

/* fastkvzip gate weights, 2 layers, 2 KV heads, G 1, dp 1, S 1: q from
 * x0, k from x1 (head 0) or x2 (head 1), zero sink key, bias 0, so
 * score = sigmoid(sign(x0) sign(x_{1+g})). */
static void fkv_weights(const char *path, int skip, float gq)
{
	static const float Wq[8] = {1, 0, 0, 0, 1, 0, 0, 0};
	static const float Wk[8] = {0, 1, 0, 0, 0, 0, 1, 0};
	static const float z2[2] = {0, 0}, one[1] = {1};
	float g[1] = {gq};
	struct weights_tensor t[14];
	char nm[14][48];
	size_t n = 0;
	for (uint32_t l = 0; l < 2; l++) {
#define T_(fmt, nd, s0, s1, s2, s3, d)                                         \
	do {                                                                   \
		snprintf(nm[n], 48, fmt, l);                                   \
		t[n] = (struct weights_tensor){nm[n], nd, {s0, s1, s2, s3}, d};\
		n++;                                                           \
	} while (0)
		T_("fastkvzip.%u.q_proj.weight", 2, 2, 4, 0, 0, Wq);
		T_("fastkvzip.%u.q_proj.bias", 1, 2, 0, 0, 0, z2);
		T_("fastkvzip.%u.k_proj.weight", 2, 2, 4, 0, 0, Wk);
		T_("fastkvzip.%u.q_norm.weight", 1, 1, 0, 0, 0,
		   l ? g : one);
		T_("fastkvzip.%u.k_norm.weight", 1, 1, 0, 0, 0, one);
		T_("fastkvzip.%u.k_base", 4, 2, 1, 1, 1, z2);
		if (!(skip && l == 1))
			T_("fastkvzip.%u.b", 3, 2, 1, 1, 0, z2);
#undef T_
	}
	write_w(path, t, n);
}

TEST(policy, fastkvzip_rule)
{
	const char *w = tmp_path("fkv.safetensors");
	fkv_weights(w, 0, 1.0f);
	char spec[600];
	/* prefill of 8, sinks 1, window 2, ratio 0.5: B 4 per head, the layer
	 * keeps 8; protected 0, 6, 7 in each head (6), so 2 more of the
	 * candidates 1..5 of both heads: head 0 agrees (score .73) at 1, 2,
	 * everything else .27: head 0 keeps 0 1 2 6 7, head 1 keeps 0 6 7 */
	snprintf(spec, sizeof(spec), "fastkvzip:model=%s,sinks=1,window=2", w);
	const float x[8][FX_D] = {{1, 1, 1}, {1, 1, -1}, {-1, -1, 1},
	                          {1, -1, -1}, {-1, 1, 1}, {1, -1, -1},
	                          {1, 1, 1}, {1, 1, 1}};
	struct fx f;
	fx_init(&f, spec, 2, 2);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, NULL, x, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 1, 2, 6, 7);
	FX_EXPECT(&f, 1, 0, 6, 7);
	float s = f.ent[0][0];
	T_ASSERT(fabsf(s - 1.0f / (1.0f + expf(-1.0f))) < 1e-3f);
	policy_free(f.p);

	/* decode: threshold 0.5, window 2, sinks 0, every 4: decisions only
	 * at n 4 (candidates pos < 2) and n 8 (pos < 6) */
	snprintf(spec, sizeof(spec), "fastkvzip:model=%s,sinks=0,window=2,"
	         "threshold=0.5,every=4", w);
	fx_init(&f, spec, 2, 2);
	const float a[FX_KV] = {0};
	for (uint32_t n = 0; n < 8; n++) {
		fx_step(&f, a, x[n]);
		if (n == 2) {
			T_EQ(f.len[0], 3);
			T_EQ(f.len[1], 3);
		}
		if (n == 3) { /* pos 0 agrees in both, 1 only in head 0 */
			FX_EXPECT(&f, 0, 0, 1, 2, 3);
			FX_EXPECT(&f, 1, 0, 2, 3);
		}
	}
	/* n 8: pos 2..5 decided: head 0 keeps 2, head 1 none */
	FX_EXPECT(&f, 0, 0, 1, 2, 6, 7);
	FX_EXPECT(&f, 1, 0, 6, 7);
	policy_free(f.p);
}

TEST(policy, fastkvzip_weight_refusals)
{
	struct policy_geom ge = geom(2, 2);
	const char *w = tmp_path("fkv-bad.safetensors");
	char spec[600];
	snprintf(spec, sizeof(spec), "fastkvzip:model=%s", w);
	fkv_weights(w, 1, 1.0f);
	refused_why(spec, &ge, "fastkvzip.1.b", __LINE__);
	fkv_weights(w, 0, 1234.5f);
	struct policy *p = make_g(spec, &ge);
	policy_free(p);
	poison(w, 1234.5f);
	refused_why(spec, &ge, "NaN", __LINE__);
	fkv_weights(w, 0, 1.0f);
	struct policy_geom g4 = geom(4, 2); /* G 2: q_proj must be [4][4] */
	refused_why(spec, &g4, "shape", __LINE__);
	refused_why("fastkvzip", &ge, "model=PATH", __LINE__);
}

/* kvpop weights, 2 layers, r 1, m 1: u = x0; z = W1 [u, ln a] + 10;
 * s = z (gelu is the identity that far out). */
static void kvpop_weights(const char *path, float wu, float wa, int bad)
{
	static const float P[4] = {1, 0, 0, 0}, b1[1] = {10}, W2[1] = {1},
	                   b2[1] = {0};
	float W1[2] = {wu, wa};
	struct weights_tensor t[10];
	char nm[10][40];
	size_t n = 0;
	for (uint32_t l = 0; l < 2; l++) {
		snprintf(nm[n], 40, "kvpop.%u.proj.weight", l);
		t[n] = (struct weights_tensor){nm[n], 2, {1, 4}, P};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc1.weight", l);
		t[n] = (struct weights_tensor){nm[n], 2, {1, bad ? 1 : 2}, W1};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc1.bias", l);
		t[n] = (struct weights_tensor){nm[n], 1, {1}, b1};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc2.weight", l);
		t[n] = (struct weights_tensor){nm[n], 2, {1, 1}, W2};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc2.bias", l);
		t[n] = (struct weights_tensor){nm[n], 1, {1}, b2};
		n++;
	}
	write_w(path, t, n);
}

TEST(policy, kvpop_delayed_scores)
{
	/* score = x0 + 10 at age 2, tokens 3, delay 2, sinks 0:
	 * x0 .5 .1 .9 .3 .2 .8
	 *   n 3: pos 0 scored; 1, 2 protected; keep 0
	 *   n 4: pos 1 (10.1) vs 0 (10.5): drop 1
	 *   n 5: pos 2 (10.9) vs 0: drop 0
	 *   n 6: pos 3 (10.3) vs 2: drop 3 -> {2, 4, 5} */
	const char *w = tmp_path("kvpop.safetensors");
	kvpop_weights(w, 1.0f, 0.0f, 0);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=3,delay=2,sinks=0",
	         w);
	struct fx f;
	fx_init(&f, spec, 2, 1);
	T_EQ(f.p->entry_floats, 2);
	const float x0[6] = {.5f, .1f, .9f, .3f, .2f, .8f};
	const float a[FX_KV] = {0};
	for (uint32_t n = 0; n < 6; n++) {
		fx_step(&f, a, (const float[FX_D]){x0[n]});
		if (n == 3)
			FX_EXPECT(&f, 0, 0, 2, 3);
	}
	FX_EXPECT(&f, 0, 2, 4, 5);
	policy_free(f.p);
}

TEST(policy, kvpop_attention_feature)
{
	/* score = ln(A + 1e-6) + 10, A = attention received from the two
	 * following queries, mean over G: q 1, lse 0 give alpha_i each, so
	 * A = 2 alpha_i.  tokens 3, delay 2, sinks 0.
	 * alpha .5 .1 .3 .4 .2 .6:
	 *   n 4: pos 1 (A .2) vs 0 (1.0): drop 1
	 *   n 5: pos 2 (.6) vs 0: drop 2
	 *   n 6: pos 3 (.8) vs 0: drop 3 -> {0, 4, 5} */
	const char *w = tmp_path("kvpop2.safetensors");
	kvpop_weights(w, 0.0f, 1.0f, 0);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=3,delay=2,sinks=0",
	         w);
	struct fx f;
	fx_init(&f, spec, 2, 1);
	const float al[6] = {.5f, .1f, .3f, .4f, .2f, .6f};
	for (uint32_t n = 0; n < 6; n++) {
		float av[FX_KV] = {al[n]};
		fx_step(&f, av, NULL);
	}
	FX_EXPECT(&f, 0, 0, 4, 5);
	for (uint32_t i = 0; i < f.len[0]; i++)
		if (f.pos[0][i] == 0)
			T_ASSERT(fabsf(f.ent[0][2 * i] - 1.0f) < 1e-4f);
	policy_free(f.p);

	/* the same prompt in one prefill sync gives the same survivors when
	 * the budget allows them all to age: tokens 6 keeps everything */
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=6,delay=2,sinks=0",
	         w);
	fx_init(&f, spec, 2, 1);
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL,
	             (const float[6][FX_KV]){{.5f}, {.1f}, {.3f}, {.4f}, {.2f},
	                                     {.6f}},
	             NULL, NULL, NULL));
	T_EQ(f.len[0], 6);
	/* entry 0 received 2 x .5 in the same sync */
	for (uint32_t i = 0; i < f.len[0]; i++)
		if (f.pos[0][i] == 0)
			T_ASSERT(fabsf(f.ent[0][2 * i] - 1.0f) < 1e-4f);
	policy_free(f.p);
}

TEST(policy, kvpop_weight_refusals)
{
	struct policy_geom ge = geom(2, 1);
	const char *w = tmp_path("kvpop-bad.safetensors");
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s", w);
	kvpop_weights(w, 1.0f, 0.0f, 1);
	refused_why(spec, &ge, "shape", __LINE__);
	kvpop_weights(w, 1234.5f, 0.0f, 0);
	struct policy *p = make_g(spec, &ge);
	policy_free(p);
	poison(w, 1234.5f);
	refused_why(spec, &ge, "NaN", __LINE__);
	struct policy_geom g2 = geom(2, 2); /* fc2 must be [2][1] */
	kvpop_weights(w, 1.0f, 0.0f, 0);
	refused_why(spec, &g2, "shape", __LINE__);
}

/* ------------------------------------------------------------ inputs */

/*
 * A policy reading staged inputs: two finite tokens pass; then a sync whose
 * token 1 (position 3) carries `bad` at index 1 of input `which` (0 x, 1 q,
 * 2 lse) is refused with KVT_EINVAL and a reason containing needle, before
 * decide() ran (the layer state is untouched); the same sync with the
 * input fixed then passes.
 */
static void bad_input_(const char *spec, uint32_t H, uint32_t nkv, int which,
                       float bad, const char *needle, int line)
{
	struct fx f;
	fx_init(&f, spec, H, nkv);
	float x[2][FX_D], q[2][FX_H], lse[2][FX_H];
	for (uint32_t k = 0; k < 2; k++) {
		for (uint32_t d = 0; d < FX_D; d++)
			x[k][d] = 0.5f;
		for (uint32_t j = 0; j < FX_H; j++) {
			q[k][j] = 1.0f;
			lse[k][j] = 0.0f;
		}
	}
	const float a[2][FX_KV] = {{.5f, .5f}, {.5f, .5f}};
	T_OK(fx_sync(&f, 2, KVT_PHASE_PREFILL, a, x, q, lse));
	uint32_t n_seen = f.n_seen, len[FX_KV];
	memcpy(len, f.len, sizeof(len));
	static uint8_t state[sizeof(f.state)];
	memcpy(state, f.state, sizeof(state));
	float *slot = which == 0 ? &x[1][1] : which == 1 ? &q[1][1] : &lse[1][1];
	float good = *slot;
	*slot = bad;
	int rc = fx_sync(&f, 2, KVT_PHASE_PREFILL, a, x, q, lse);
	if (rc != KVT_EINVAL || !strstr(f.p->why, needle))
		th_fail(__FILE__, line, "%s: gave %s (%s), expected EINVAL "
		        "with '%s'", spec, kvt_errname(rc), f.p->why, needle);
	if (memcmp(state, f.state, sizeof(state)))
		th_fail(__FILE__, line, "%s: layer state changed", spec);
	/* The fixture appended before deciding; a tenant commits nothing
	 * of a refused sync, so rewind it the same way. */
	f.n_seen = n_seen;
	memcpy(f.len, len, sizeof(len));
	*slot = good;
	rc = fx_sync(&f, 2, KVT_PHASE_PREFILL, a, x, q, lse);
	if (rc || f.p->why[0])
		th_fail(__FILE__, line, "%s: fixed sync gave %s (%s)", spec,
		        kvt_errname(rc), f.p->why);
	policy_free(f.p);
}
#define bad_input(spec, H, nkv, which, bad, needle)                           \
	bad_input_(spec, H, nkv, which, bad, needle, __LINE__)

TEST(policy, inputs_refused)
{
	const char *wz = tmp_path("kvzap.safetensors");
	const char *wf = tmp_path("fkv.safetensors");
	const char *wp = tmp_path("kvpop.safetensors");
	kvzap_linear(wz, 0, 0, 0);
	fkv_weights(wf, 0, 1.0f);
	kvpop_weights(wp, 1.0f, 0.0f, 0);
	char kvzap[600], fkv[600], kvpop[600];
	snprintf(kvzap, sizeof(kvzap), "kvzap:model=%s,window=1", wz);
	snprintf(fkv, sizeof(fkv), "fastkvzip:model=%s", wf);
	snprintf(kvpop, sizeof(kvpop), "kvpop:model=%s,tokens=3,delay=2", wp);
	const float nan = NAN, inf = INFINITY, un = policy_unstaged();
	/* every policy that reads an input, for each input it reads
	 * (head_dim 1: a q element is named by its head alone) */
	const struct {
		const char *spec;
		uint32_t H, nkv;
		unsigned inputs; /* bit 0 x, 1 q, 2 lse */
	} pol[] = {
		{"h2o:tokens=8", 2, 1, 6},  {"snapkv:window=1", 2, 1, 6},
		{"tova:tokens=8", 2, 1, 6}, {kvzap, 2, 2, 1},
		{fkv, 2, 2, 1},             {kvpop, 2, 1, 7},
	};
	static const char *const what[3][3] = {
		{"layer 0, position 3: staged x[1] is NaN",
		 "layer 0, position 3: staged x[1] is +Inf",
		 "layer 0, position 3: x was never staged (kvt_stage_x)"},
		{"layer 0, position 3: staged q of query head 1 is NaN",
		 "layer 0, position 3: staged q of query head 1 is -Inf",
		 "layer 0, position 3: q of query head 1 was never staged "
		 "(kvt_stage_q)"},
		{"layer 0, position 3: staged lse of query head 1 is NaN",
		 "layer 0, position 3: staged lse of query head 1 is +Inf",
		 "layer 0, position 3: lse of query head 1 was never staged "
		 "(kvt_stage_lse)"},
	};
	for (size_t i = 0; i < sizeof(pol) / sizeof(pol[0]); i++)
		for (int in = 0; in < 3; in++) {
			if (!(pol[i].inputs & (1u << in)))
				continue;
			bad_input(pol[i].spec, pol[i].H, pol[i].nkv, in, nan,
			          what[in][0]);
			bad_input(pol[i].spec, pol[i].H, pol[i].nkv, in,
			          in == 1 ? -inf : inf, what[in][1]);
			bad_input(pol[i].spec, pol[i].H, pol[i].nkv, in, un,
			          what[in][2]);
		}
	/* x's marker sits in x[0] (what the tenant writes) */
	struct fx f;
	fx_init(&f, kvzap, 2, 2);
	T_ERR(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL,
	              (const float[1][FX_D]){{un, 1, 1, 1}}, NULL, NULL),
	      KVT_EINVAL);
	T_EQ_STR(f.p->why, "layer 0, position 0: x was never staged "
	                   "(kvt_stage_x)");
	policy_free(f.p);
	/* inputs a policy does not read are not checked */
	fx_init(&f, "h2o:tokens=8", 2, 1);
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL,
	             (const float[1][FX_D]){{nan, un, inf, 0}}, NULL, NULL));
	policy_free(f.p);
	/* the full policy reads nothing */
	fx_init(&f, "full", 2, 1);
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL, NULL,
	             (const float[1][FX_H]){{nan, un}}, NULL));
	policy_free(f.p);
}

TEST(policy, snapkv_rechecks_its_window)
{
	/* snapkv reads the window rows from the ring at the first decode
	 * sync; one rewritten with a NaN since its own sync is refused */
	struct fx f;
	fx_init(&f, "snapkv:window=2,kernel=1,tokens=2", 2, 1);
	const float a[6][FX_KV] = {{.5f}, {.5f}, {.5f}, {.5f}, {.5f}, {.5f}};
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	f.stage[4][f.lo + 1] = NAN; /* lse of query head 1, position 4 */
	T_ERR(fx_sync(&f, 1, KVT_PHASE_DECODE, a, NULL, NULL, NULL),
	      KVT_EINVAL);
	T_EQ_STR(f.p->why, "layer 0, position 4: staged lse of query head 1 "
	                   "is NaN");
	policy_free(f.p);
}
