/*
 * policy_test.c — registry, spec parser, shared machinery, pressure and
 * the rules of the policies without weights (streaming, random, h2o, tova,
 * snapkv) with hand-computed expectations.  The learned scorers and the
 * refusal of bad staged inputs are policy_weights_test.c's.
 *
 * The miniature tenant (struct fx) is policy_fixture.h's.
 */
#include "policy_fixture.h"
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

/* ------------------------------------------------------------ parsing */

TEST(policy, registry)
{
	static const char *const names[] = {"full", "random", "streaming",
	                                    "h2o", "snapkv", "tova", "kvzap",
	                                    "fastkvzip", "kvpop", "knorm",
	                                    "expected_attention", "pyramidkv",
	                                    "observed_attention"};
	T_EQ(policy_count(), 13);
	for (size_t i = 0; i < 13; i++) {
		T_EQ_STR(policy_at(i)->name, names[i]);
		T_ASSERT(policy_at(i)->help && policy_at(i)->help[0]);
		T_ASSERT(policy_at(i)->decide);
	}
	T_ASSERT(policy_at(13) == NULL);
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
	              "expected_attention, pyramidkv, observed_attention)");
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

TEST(policy, observed_attention_averages_over_the_queries_that_saw_it)
{
	/* kvpress's ObservedAttentionPress: every query at or after entry i
	 * gives it a_i per query head, so after n tokens S_i = a_i (n - i)
	 * per head and the score mean_j S_i / (n - i) = a_i; nothing is
	 * protected.  One prefill of 6, tokens 4, a = .5 .1 .3 .05 .2 .04:
	 * keep the four largest a: 0, 1, 2, 4 (h2o, whose recent half
	 * protects 4 and 5 and ranks by S = 3 .5 1.2 .15, keeps 0, 2, 4, 5). */
	struct fx f;
	fx_init(&f, "observed_attention:tokens=4", 2, 1);
	const float a[6][FX_KV] = {{.5f}, {.1f}, {.3f}, {.05f}, {.2f}, {.04f}};
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 1, 2, 4);
	/* a decode step of a = .7: the kept scores stay a_i, the new entry
	 * scores .7: drop pos 1 (.1) */
	const float d[FX_KV] = {.7f};
	fx_step(&f, d, NULL);
	FX_EXPECT(&f, 0, 0, 2, 4, 6);
	policy_free(f.p);

	struct fx g;
	fx_init(&g, "h2o:tokens=4", 2, 1);
	T_OK(fx_sync(&g, 6, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	FX_EXPECT(&g, 0, 0, 2, 4, 5);
	policy_free(g.p);
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

TEST(policy, prompt_only_policies_read_only_when_they_decide)
{
	/* snapkv, pyramidkv and expected_attention decide once, at the
	 * first decode sync (policy_decides); at every other sync they read
	 * nothing, so the tenant stages nothing and an input that is not a
	 * number is not looked at.  h2o reads at every sync. */
	static const char *const once[] = {
		"snapkv:window=2,kernel=1,tokens=5",
		"pyramidkv:window=2,kernel=1,tokens=5",
		"expected_attention:window=2,tokens=5,sinks=0"};
	const float a[8][FX_KV] = {{.1f}, {.5f}, {.2f}, {.9f}, {.3f}, {.4f},
	                           {.5f}, {.5f}};
	const float d1[1][FX_KV] = {{.5f}};
	const float nanq[1][FX_H] = {{NAN, NAN}};
	float q8[8][FX_H];
	for (int k = 0; k < 8; k++)
		q8[k][0] = q8[k][1] = k == 2 ? NAN : 1.0f; /* outside the window */
	for (size_t i = 0; i < sizeof(once) / sizeof(once[0]); i++) {
		struct policy_geom ge = geom(FX_H, 1);
		ge.head_dim = 2; /* expected_attention rotates pairs */
		struct policy *p = make_g(once[i], &ge);
		uint32_t st[16] = {0};
		T_ASSERT(p->layer_state_bytes <= sizeof(st));
		struct policy_layer l = {.phase = KVT_PHASE_PREFILL, .n_new = 8,
		                         .n_seen = 8, .state = st};
		T_EQ(policy_decides(p, &l), 0);
		l.phase = KVT_PHASE_DECODE;
		T_EQ(policy_decides(p, &l), 1);
		st[0] = 1; /* compressed already */
		T_EQ(policy_decides(p, &l), 0);
		policy_free(p);
		if (i == 2)
			break; /* the fixture's head_dim 1 is snapkv's only */
		struct fx f;
		fx_init(&f, once[i], FX_H, 1);
		/* a NaN query at a prefill sync, outside the window it reads
		 * later: never read, not refused */
		T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, a, NULL, q8, NULL));
		T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, NULL, NULL));
		uint32_t kept = f.len[0];
		T_ASSERT(kept < 9); /* it compressed the prompt */
		/* after the decision: decode rows are never read */
		T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, nanq, NULL));
		T_EQ(f.len[0], kept + 1);
		policy_free(f.p);
	}
	/* the window's rows are read at the decision: a NaN there refuses */
	struct fx f;
	fx_init(&f, once[0], FX_H, 1);
	for (int k = 0; k < 8; k++)
		q8[k][0] = q8[k][1] = k == 7 ? NAN : 1.0f;
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, a, NULL, q8, NULL));
	T_EQ(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, NULL, NULL), KVT_EINVAL);
	policy_free(f.p);
	/* h2o reads at every sync */
	fx_init(&f, "h2o:tokens=5", FX_H, 1);
	struct policy_layer l = {.phase = KVT_PHASE_PREFILL, .n_new = 1,
	                         .n_seen = 1};
	T_EQ(policy_decides(f.p, &l), 1);
	T_EQ(fx_sync(&f, 1, KVT_PHASE_DECODE, d1, NULL, nanq, NULL), KVT_EINVAL);
	policy_free(f.p);
}

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
