/*
 * lockstep_test.c — the in-process pieces of kvtrim-eval's protocol 2
 * (decoding-time compression, tools/eval/decoding/decoding.h) on a tiny random model,
 * against independent computations: the dense attention maps
 * (model_dense_*) for the replay cache's attention sums (replay_tap),
 * single-cache steps (replay_step) for a batched step over several caches
 * (replay_attend_row), hand-made scores for the hindsight oracle's
 * eviction (score_oracle_evict, at a ratio and at a fixed budget), hand
 * sums for kvpop's budget (decoding_budget), the budgets the jobs are
 * given (the needle's one fixed budget for all) and kvzap's
 * decode-protocol threshold with sinks.  The protocol's run
 * through a real kvtrimd is in tests/integration/test_eval_decoding.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decoding.h"
#include "../common/replay.h"
#include "gb.h"
#include "model.h"
#include "test.h"

#define N 20u

static void tokens(int32_t *tok, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = (int32_t)((i * 41u + seed * 13u + (i * i) % 11u) % 300u);
}

TEST(eval_decoding, budget_by_hand)
{
	/* P = 2, T = 5: syncs at n = 3 and 4, mean(1/n) = 7/24 */
	T_ASSERT(fabs(decoding_inv_seen(2, 5) - 7.0 / 24.0) < 1e-15);
	/* R = 0.5: N = 0.5 / (7/24) = 1.71 -> 2; R = 0.9: 0.34 -> 1 */
	T_EQ(decoding_budget(0.5, 2, 5), 2);
	T_EQ(decoding_budget(0.9, 2, 5), 1);
	/* R = 0: N = 24/7 = 3.43 -> 3 */
	T_EQ(decoding_budget(0.0, 2, 5), 3);
	/* exactly, with every entry kept while n <= N: the mean of
	 * max(0, 1 - N/3) and max(0, 1 - N/4) is 17/24 (N = 1), 5/12
	 * (N = 2), 1/8 (N = 3), 0 (N = 4) */
	T_EQ(decoding_tokens(0.5, 2, 5, 1), 1);  /* at least 0.5 */
	T_EQ(decoding_tokens(0.5, 2, 5, 0), 2);  /* at most 0.5 */
	T_EQ(decoding_tokens(0.125, 2, 5, 1), 3);
	T_EQ(decoding_tokens(0.125, 2, 5, 0), 3);
	T_EQ(decoding_tokens(0.9, 2, 5, 1), 1);  /* out of reach: 1 */
}

/* The decoding-time needle's jobs hold every policy that takes a budget
 * to kvpop's fixed one; protocol 2's give them a ratio.  P = 2, T = 5,
 * R = 0.5 asked for at least R: the fixed budget is 1 (budget_by_hand),
 * the ratio 0.5 + 7/24. */
TEST(eval_decoding, needle_jobs_share_one_fixed_budget)
{
	struct model m;
	gb_tiny_llama(&m, 4);
	struct eval_opts a;
	memset(&a, 0, sizeof(a));
	a.wabs = "/w"; /* fastkvzip's and kvpop's jobs too (nothing read) */
	float *zs[2] = {NULL, NULL};
	static struct job jobs[MAX_JOBS];
	const double R[1] = {0.5};
	for (int fixed = 0; fixed < 2; fixed++) {
		uint32_t n = decoding_jobs(&m, &a, zs, 0, 2, 5, R, 1, 0, fixed,
		                           0, jobs);
		uint32_t budgeted = 0;
		for (uint32_t k = 0; k < n; k++) {
			const char *sp = jobs[k].spec[C_MAIN];
			if (!strcmp(jobs[k].name, "full"))
				continue;
			budgeted++;
			const int fx = fixed || !strcmp(jobs[k].name, "kvpop");
			const char *b = strstr(sp, fx ? "tokens=" : "ratio=");
			T_ASSERT(b);
			T_ASSERT(fx ? !strncmp(b, "tokens=1", 8) &&
			              (b[8] == ',' || b[8] == ' ' || !b[8])
			            : !strncmp(b, "ratio=0.7917", 12));
			T_ASSERT(!strstr(sp, fx ? "ratio=" : "tokens="));
		}
		/* h2o, tova, streaming, ..., fastkvzip, kvpop, the oracle */
		T_ASSERT(budgeted >= 7);
	}
	model_free(&m);
}

TEST(eval_decoding, kvzap_decode_threshold_with_sinks_by_hand)
{
	/* 3 layers x 2 KV heads, one window of T = 6 scored 0..5, P = 3,
	 * window 1: after the syncs of n = 4 and 5 the entries < n - 1 are
	 * decided.  sinks 0, tau 1.5: entries 0, 1 dropped at both syncs:
	 * (2/4 + 2/5) / 2 = 0.45.  sinks 1: entry 0 kept: (1/4 + 1/5) / 2 =
	 * 0.225; a tau for 0.225 must be in (1, 2]. */
	struct model m;
	gb_tiny_llama(&m, 3);
	float s[6 * 6];
	for (uint32_t e = 0; e < 6; e++)
		for (uint32_t i = 0; i < 6; i++)
			s[e * 6 + i] = (float)i;
	float tau = kvzap_tau(&m, s, 1, 6, 3, 1, 0, 0.45);
	T_ASSERT(tau > 1.0f && tau <= 2.0f);
	tau = kvzap_tau(&m, s, 1, 6, 3, 1, 1, 0.225);
	T_ASSERT(tau > 1.0f && tau <= 2.0f);
	/* 0.35 lies between those steps: without sinks entries 0, 1 (tau
	 * just above 1), with one sink entries 1, 2 (just above 2) */
	tau = kvzap_tau(&m, s, 1, 6, 3, 1, 0, 0.35);
	T_ASSERT(tau > 1.0f && tau < 1.001f);
	tau = kvzap_tau(&m, s, 1, 6, 3, 1, 1, 0.35);
	T_ASSERT(tau > 2.0f && tau < 2.001f);
	model_free(&m);
}

TEST_T(eval_decoding, tap_sums_the_dense_attention_maps, 60)
{
	struct model m;
	gb_tiny_llama(&m, 5);
	const struct model_config *mc = &m.cfg;
	const size_t H = mc->n_heads, L = mc->n_layers;
	int32_t tok[N];
	tokens(tok, N, 1);
	struct model_dense dn;
	T_OK(model_dense_init(&dn, &m, N, 1));
	T_OK(model_dense_step(&dn, tok, N, NULL));
	struct replay *r;
	T_OK(replay_open(&m, N, &r));
	double *acc = calloc(L * H * N, sizeof(double));
	T_ASSERT(acc);
	/* a prefill of 12 untapped, then 8 single steps tapped: the sums
	 * over the queries 12..19 */
	T_OK(replay_step(r, tok, 12, NULL));
	replay_tap(r, acc);
	for (uint32_t t = 12; t < N; t++)
		T_OK(replay_step(r, tok + t, 1, NULL));
	double worst = 0, mass = 0;
	for (size_t lh = 0; lh < L * H; lh++)
		for (uint32_t i = 0; i < N; i++) {
			double want = 0;
			for (uint32_t t = 12; t < N; t++)
				want += dn.maps[(lh * N + t) * N + i];
			double d = fabs(acc[lh * N + i] - want);
			worst = d > worst ? d : worst;
			mass += acc[lh * N + i];
		}
	if (worst > 1e-5)
		th_fail(__FILE__, __LINE__, "tap vs dense maps: %g", worst);
	/* each query's probabilities sum to 1 */
	T_ASSERT(fabs(mass - (double)L * H * 8) < 1e-4);
	replay_close(r);
	model_dense_free(&dn);
	free(acc);
	model_free(&m);
}

/* Two caches decoding in one batched forward, rows served by
 * replay_attend_row. */
struct two {
	struct replay *r[2];
};

static int two_attend(void *ctx, uint32_t l, uint32_t pos0, uint32_t n,
                      const float *x, const float *q, const float *k,
                      const float *v, float *out, float *lse)
{
	struct two *tw = ctx;
	(void)pos0;
	(void)x;
	/* the geometry of gb_tiny_llama: 4 heads of 16, 2 KV heads */
	const size_t Hd = 4 * 16, Kd = 2 * 16;
	for (uint32_t c = 0; c < n; c++) {
		int rc = replay_attend_row(tw->r[c], l, q + c * Hd, k + c * Kd,
		                           v + c * Kd, out + c * Hd, lse + c * 4);
		if (rc)
			return rc;
	}
	return 0;
}

TEST_T(eval_decoding, batched_rows_are_single_steps, 60)
{
	struct model m;
	gb_tiny_llama(&m, 9);
	const size_t V = m.cfg.vocab_size;
	T_EQ(m.cfg.n_heads, 4);
	T_EQ(m.cfg.head_dim, 16);
	T_EQ(m.cfg.n_kv_heads, 2);
	int32_t a[N], b[N];
	tokens(a, N, 2);
	tokens(b, N, 3);
	struct replay *ra, *rb;
	struct two tw;
	T_OK(replay_open(&m, N, &ra));
	T_OK(replay_open(&m, N, &rb));
	T_OK(replay_open(&m, N, &tw.r[0]));
	T_OK(replay_open(&m, N, &tw.r[1]));
	float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V),
	      *l2 = malloc(sizeof(float) * 2 * V);
	T_ASSERT(la && lb && l2);
	/* different prompt lengths: the rows sit at different positions;
	 * one entry evicted in cache b (and its twin) */
	T_OK(replay_step(ra, a, 10, NULL));
	T_OK(replay_step(rb, b, 7, NULL));
	T_OK(replay_step(tw.r[0], a, 10, NULL));
	T_OK(replay_step(tw.r[1], b, 7, NULL));
	replay_alive(rb, 1, 1)[3] = 0;
	replay_alive(tw.r[1], 1, 1)[3] = 0;
	double worst = 0;
	for (uint32_t s = 0; s < 6; s++) {
		T_OK(replay_step(ra, a + 10 + s, 1, la));
		T_OK(replay_step(rb, b + 7 + s, 1, lb));
		int32_t tk[2] = {a[10 + s], b[7 + s]};
		uint32_t pos[2] = {10 + s, 7 + s};
		struct model_attn at = {two_attend, &tw};
		T_OK(model_forward_pos(&m, tk, 2, pos, &at, l2));
		replay_advance(tw.r[0], 1);
		replay_advance(tw.r[1], 1);
		for (size_t v = 0; v < V; v++) {
			double d = fabs(la[v] - l2[v]);
			double e = fabs(lb[v] - l2[V + v]);
			worst = d > worst ? d : worst;
			worst = e > worst ? e : worst;
		}
	}
	if (worst > 1e-5)
		th_fail(__FILE__, __LINE__, "batched vs single: %g", worst);
	T_EQ(replay_pos(tw.r[0]), 16);
	T_EQ(replay_kept(tw.r[1]), replay_kept(rb));
	replay_close(ra);
	replay_close(rb);
	replay_close(tw.r[0]);
	replay_close(tw.r[1]);
	free(la);
	free(lb);
	free(l2);
	model_free(&m);
}

/* 1 when every (layer, KV head) list of r has exactly want[8] alive. */
static int every_list_alive(const struct model *m, struct replay *r,
                            const uint8_t want[8])
{
	for (uint32_t l = 0; l < m->cfg.n_layers; l++)
		for (uint32_t g = 0; g < m->cfg.n_kv_heads; g++)
			if (memcmp(replay_alive(r, l, g), want, 8))
				return 0;
	return 1;
}

TEST(eval_decoding, oracle_evicts_by_hand)
{
	/* 8 entries; score of (l, h, i) = hand values, max over the group's
	 * two query heads; R = 0.5 keeps 8 - 4 = 4 per list */
	struct model m;
	gb_tiny_llama(&m, 4);
	const struct model_config *mc = &m.cfg;
	const uint32_t n = 8, H = mc->n_heads;
	int32_t tok[8];
	tokens(tok, 8, 4);
	struct replay *r;
	T_OK(replay_open(&m, n, &r));
	T_OK(replay_step(r, tok, n, NULL));
	float *s = calloc((size_t)mc->n_layers * H * n, sizeof(float));
	T_ASSERT(s);
	/* head 2h: i; head 2h+1: 10 on entry 0 -> KV head g keeps 0 and
	 * the three highest of 1..7 (5, 6, 7) */
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t i = 0; i < n; i++)
				s[((size_t)l * H + h) * n + i] =
					h % 2 ? (i == 0 ? 10.0f : 0.0f) : (float)i;
	T_OK(score_oracle_evict(&m, r, 0.5, 0, s, (size_t)H * n, n));
	static const uint8_t want4[8] = {1, 0, 0, 0, 0, 1, 1, 1};
	T_ASSERT(every_list_alive(&m, r, want4));
	/* kept entries never come back; no scores: a budget of 2 keeps
	 * two of the four (the more recent on ties) */
	T_OK(score_oracle_evict(&m, r, 0.75, 0, NULL, 0, 0));
	T_EQ(replay_kept(r), (uint64_t)mc->n_layers * mc->n_kv_heads * 2);
	replay_close(r);
	/* a fixed budget of 3 a list (the ratio unread): entry 0 and the
	 * two highest of 1..7; a budget above n keeps all */
	T_OK(replay_open(&m, n, &r));
	T_OK(replay_step(r, tok, n, NULL));
	T_OK(score_oracle_evict(&m, r, 0.0, 9, s, (size_t)H * n, n));
	T_EQ(replay_kept(r), (uint64_t)mc->n_layers * mc->n_kv_heads * 8);
	T_OK(score_oracle_evict(&m, r, 0.0, 3, s, (size_t)H * n, n));
	static const uint8_t want3[8] = {1, 0, 0, 0, 0, 0, 1, 1};
	T_ASSERT(every_list_alive(&m, r, want3));
	replay_close(r);
	free(s);
	model_free(&m);
}
