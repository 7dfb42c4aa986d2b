/* test_policy.c — registry, spec parser, shared machinery, streaming rule. */
#include "policy.h"
#include "test.h"

static struct policy *make(const char *spec)
{
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, &p, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "policy_create(\"%s\"): %s: %s",
		        spec, kvt_errname(rc), err);
	return p;
}

/* A refused spec: KVT_EPOLICY, no object, a reason. */
static void refused(const char *spec)
{
	struct policy *p = (struct policy *)&p; /* must be reset to NULL */
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, &p, err, sizeof(err));
	if (rc != KVT_EPOLICY)
		th_fail(__FILE__, __LINE__, "\"%s\" gave %s, expected EPOLICY",
		        spec ? spec : "(null)", kvt_errname(rc));
	T_ASSERT(p == NULL);
	T_ASSERT(err[0] != '\0');
}

TEST(policy, registry)
{
	T_EQ(policy_count(), 2);
	T_EQ_STR(policy_at(0)->name, "full");
	T_EQ_STR(policy_at(1)->name, "streaming");
	T_ASSERT(policy_at(2) == NULL);
	for (size_t i = 0; i < policy_count(); i++) {
		T_ASSERT(policy_at(i)->help && policy_at(i)->help[0]);
		T_ASSERT(policy_at(i)->decide);
	}
}

TEST(policy, parse_full)
{
	struct policy *p = make("full");
	T_EQ_STR(p->ops->name, "full");
	T_EQ_STR(p->spec, "full");
	T_EQ(p->args.set, 0);
	T_EQ_U64(policy_budget(&p->args, 1000), UINT32_MAX);
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

TEST(policy, parse_streaming_keys)
{
	struct policy *p = make("streaming:sinks=2,tokens=10");
	T_EQ(p->args.sinks, 2);
	T_EQ(p->args.tokens, 10);
	T_EQ(p->args.set, POLICY_KEY_SINKS | POLICY_KEY_TOKENS);
	T_EQ_STR(p->spec, "streaming:sinks=2,tokens=10");
	policy_free(p);

	p = make("streaming:ratio=0.5");
	T_EQ(p->args.sinks, 4);
	T_EQ(p->args.tokens, 0);
	T_ASSERT(p->args.ratio == 0.5);
	T_EQ(p->args.set, POLICY_KEY_RATIO);
	policy_free(p);

	p = make("streaming:tokens=4294967295,sinks=0");
	T_EQ_U64(p->args.tokens, 4294967295u);
	T_EQ(p->args.sinks, 0);
	policy_free(p);

	p = make("streaming:ratio=0");
	T_ASSERT(p->args.ratio == 0.0);
	policy_free(p);

	p = make("streaming:ratio=.25");
	T_ASSERT(p->args.ratio == 0.25);
	policy_free(p);
}

TEST(policy, unknown_name_message)
{
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	T_ERR(policy_create("x", &p, err, sizeof(err)), KVT_EPOLICY);
	T_EQ_STR(err, "unknown policy 'x' (known: full, streaming)");
	T_ERR(policy_create("x:tokens=3", &p, err, sizeof(err)), KVT_EPOLICY);
	T_EQ_STR(err, "unknown policy 'x' (known: full, streaming)");
	T_ASSERT(p == NULL);
}

TEST(policy, refusals)
{
	refused(NULL);
	refused("");
	refused("nope");
	refused("ful");
	refused("fullx");
	refused("Full");
	refused("streaming:foo=1");         /* unknown key */
	refused("full:sinks=1");            /* key the policy does not take */
	refused("streaming:window=8");      /* ditto */
	refused("streaming:sinks=1,sinks=2"); /* repeated */
	refused("streaming:sinks=x");       /* bad numbers */
	refused("streaming:sinks=-1");
	refused("streaming:sinks=+1");
	refused("streaming:sinks=1.0");
	refused("streaming:sinks=0x10");
	refused("streaming:sinks=4294967296");
	refused("streaming:sinks=99999999999999999999");
	refused("streaming:tokens=0");
	refused("streaming:tokens=5,ratio=0.5");
	refused("streaming:ratio=1");
	refused("streaming:ratio=1.0");
	refused("streaming:ratio=1.5");
	refused("streaming:ratio=-0.1");
	refused("streaming:ratio=nan");
	refused("streaming:ratio=inf");
	refused("streaming:ratio=0.5x");
	refused("streaming:ratio=1e400");
	refused("streaming:sinks=1,");      /* trailing comma */
	refused("streaming:,sinks=1");
	refused("streaming:sinks=1,,tokens=3");
	refused("streaming:");
	refused("streaming:sinks");
	refused("streaming:sinks=");
	refused("streaming:=3");
	refused("streaming: sinks=1");      /* whitespace */
	refused(" streaming");
	refused("streaming ");
	refused("streaming:sinks=1\t");
	refused("streaming:sinks=1\n");

	char longspec[KVT_SPEC_MAX + 8];
	memset(longspec, '1', sizeof(longspec));
	memcpy(longspec, "streaming:sinks=", 16);
	longspec[sizeof(longspec) - 1] = '\0';
	refused(longspec);
}

TEST(policy, budget_and_protected)
{
	struct policy_args a;
	memset(&a, 0, sizeof(a));
	T_EQ_U64(policy_budget(&a, 50), UINT32_MAX);
	a.tokens = 7;
	T_EQ(policy_budget(&a, 50), 7);
	a.tokens = 0;
	a.ratio = 0.5;
	a.set = POLICY_KEY_RATIO;
	T_EQ(policy_budget(&a, 7), 4);   /* 7 - floor(3.5) */
	T_EQ(policy_budget(&a, 10), 5);
	T_EQ(policy_budget(&a, 0), 0);
	a.ratio = 0.25;
	T_EQ(policy_budget(&a, 10), 8);  /* 10 - floor(2.5) */
	a.ratio = 0.0;
	T_EQ(policy_budget(&a, 10), 10);

	memset(&a, 0, sizeof(a));
	a.sinks = 2;
	a.window = 3;
	/* n_seen 10: protected 0,1 (sinks) and 7,8,9 (window) */
	const int want[10] = {1, 1, 0, 0, 0, 0, 0, 1, 1, 1};
	for (uint32_t pos = 0; pos < 10; pos++)
		T_EQ(policy_protected(&a, pos, 10), want[pos]);
	/* window longer than what was seen: everything protected */
	a.sinks = 0;
	a.window = 8;
	for (uint32_t pos = 0; pos < 5; pos++)
		T_EQ(policy_protected(&a, pos, 5), 1);
	a.window = 0;
	T_EQ(policy_protected(&a, 4, 5), 0);
}

/* Runs decide on positions pos[0..len) and compares the marks. */
static void expect_decide(const char *spec, const uint32_t *pos, uint32_t len,
                          uint32_t n_seen, const uint8_t *want)
{
	struct policy *p = make(spec);
	uint8_t drop[64];
	memset(drop, 0, sizeof(drop));
	struct policy_list l = {.pos = pos, .len = len, .n_new = 1,
	                        .n_seen = n_seen, .layer = 0, .head = 0,
	                        .phase = KVT_PHASE_DECODE};
	uint32_t n = policy_decide(p, &l, drop);
	uint32_t want_n = 0;
	for (uint32_t i = 0; i < len; i++) {
		want_n += want[i];
		if (drop[i] != want[i])
			th_fail(__FILE__, __LINE__,
			        "%s: entry %u (pos %u): drop %d, expected %d",
			        spec, i, pos[i], drop[i], want[i]);
	}
	T_EQ(n, want_n);
	for (uint32_t i = len; i < sizeof(drop); i++)
		T_EQ(drop[i], 0);
	policy_free(p);
}

static const uint32_t seq10[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};

TEST(policy, streaming_within_budget_keeps_all)
{
	const uint8_t none[10] = {0};
	expect_decide("streaming:tokens=10", seq10, 10, 10, none);
	expect_decide("streaming:sinks=4,tokens=12", seq10, 10, 10, none);
	expect_decide("full", seq10, 10, 10, none);
}

TEST(policy, streaming_sinks_and_recent)
{
	/* B 6, S' 4, recent 2: keep 0..3 and 8,9 */
	const uint8_t want[10] = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0};
	expect_decide("streaming:sinks=4,tokens=6", seq10, 10, 10, want);
	/* default sinks 4 */
	expect_decide("streaming:tokens=6", seq10, 10, 10, want);
}

TEST(policy, streaming_sinks_beyond_budget)
{
	/* B 3, S' = min(8, 3) = 3, recent 0: keep 0,1,2 only */
	const uint8_t want[10] = {0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
	expect_decide("streaming:sinks=8,tokens=3", seq10, 10, 10, want);
}

TEST(policy, streaming_no_sinks)
{
	/* B 3, S' 0, recent 3: keep 7,8,9 */
	const uint8_t want[10] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
	expect_decide("streaming:sinks=0,tokens=3", seq10, 10, 10, want);
}

TEST(policy, streaming_ratio)
{
	/* n_seen 7, ratio 0.5: B = 7 - 3 = 4; S' 1, recent 3: keep 0,4,5,6 */
	const uint8_t want7[7] = {0, 1, 1, 1, 0, 0, 0};
	expect_decide("streaming:sinks=1,ratio=0.5", seq10, 7, 7, want7);
	/* n_seen 10, ratio 0.3: 0.3 * 10 rounds to 3.0 in double, B = 7;
	 * S' 2, recent 5: keep 0,1 and 5..9 */
	const uint8_t want10[10] = {0, 0, 1, 1, 1, 0, 0, 0, 0, 0};
	expect_decide("streaming:sinks=2,ratio=0.3", seq10, 10, 10, want10);
	/* ratio 0 keeps everything */
	const uint8_t none[10] = {0};
	expect_decide("streaming:ratio=0", seq10, 10, 10, none);
}

TEST(policy, streaming_uses_positions_not_order)
{
	/* A compacted list: order scrambled, some positions already gone.
	 * n_seen 10, sinks 1, tokens 3: keep pos < 1 or pos >= 8. */
	const uint32_t pos[6] = {9, 0, 5, 1, 7, 3};
	const uint8_t want[6] = {0, 0, 1, 1, 1, 1};
	expect_decide("streaming:sinks=1,tokens=3", pos, 6, 10, want);
}

TEST(policy, streaming_many_single_token_syncs)
{
	/* sinks 2, tokens 5, one token per sync; the list is filtered here
	 * by hand (no compaction code), as the daemon would leave it. */
	struct policy *p = make("streaming:sinks=2,tokens=5");
	uint32_t pos[64];
	uint32_t len = 0;
	for (uint32_t n = 1; n <= 20; n++) {
		pos[len++] = n - 1;
		uint8_t drop[64];
		memset(drop, 0, sizeof(drop));
		struct policy_list l = {.pos = pos, .len = len, .n_new = 1,
		                        .n_seen = n,
		                        .phase = KVT_PHASE_DECODE};
		uint32_t nd = policy_decide(p, &l, drop);
		uint32_t k = 0;
		for (uint32_t i = 0; i < len; i++)
			if (!drop[i])
				pos[k++] = pos[i];
		T_EQ(nd, len - k);
		len = k;
		/* at most one entry leaves per step once full */
		T_EQ(len, n < 5 ? n : 5);
		T_EQ(nd, n <= 5 ? 0 : 1);
	}
	const uint32_t want[5] = {0, 1, 17, 18, 19};
	T_EQ(len, 5);
	for (uint32_t i = 0; i < 5; i++)
		T_EQ(pos[i], want[i]);
	policy_free(p);
}

TEST(policy, decide_empty_list)
{
	struct policy *p = make("streaming:sinks=0,tokens=1");
	uint8_t drop[1] = {0};
	struct policy_list l = {.pos = NULL, .len = 0, .n_seen = 5};
	T_EQ(policy_decide(p, &l, drop), 0);
	policy_free(p);
}
