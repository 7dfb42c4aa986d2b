/*
 * window_test.c — the machinery of kvtrim-eval's protocol 1 (context
 * compression, tools/eval/context/context.h) on a tiny random model, against
 * independent computations: the dense forward (model_dense_*) for the
 * reference continuation, oracle_kvzip for the KVzip scores, the dense
 * attention maps for the hindsight scores, hand-made curves for the
 * interpolation at equal achieved compression (curve_at) and hand-made
 * scores for kvzap's protocol-1 threshold.  The daemon round trip is in
 * tests/integration/test_eval_context.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "../common/eval.h"
#include "gb.h"
#include "model.h"
#include "oracle.h"
#include "test.h"

#define P 40u
#define T 52u

static void tiny(struct model *m)
{
	gb_tiny_llama(m, 7);
}

static void tokens(int32_t *tok, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = (int32_t)((i * 37u + seed * 11u + (i * i) % 13u) % 300u);
}

static const int32_t sep[3] = {5, 6, 7};

TEST(eval_context, curve_interpolates_by_hand)
{
	/* (0.4, 1), (0.6, 2) twice as 2 and 3, (0.8, 4), a failed run */
	const double x[] = {0.8, 0.4, 0.6, 0.6, 0.7};
	const double y[] = {4.0, 1.0, 2.0, 3.0, NAN};
	T_ASSERT(fabs(curve_at(x, y, 5, 0.5) - 1.75) < 1e-12);  /* 1 + 1.5/2 */
	T_ASSERT(fabs(curve_at(x, y, 5, 0.6) - 2.5) < 1e-12);   /* the mean */
	T_ASSERT(fabs(curve_at(x, y, 5, 0.7) - 3.25) < 1e-12);  /* (2.5+4)/2 */
	T_ASSERT(fabs(curve_at(x, y, 5, 0.75) - 3.625) < 1e-12);
	T_ASSERT(fabs(curve_at(x, y, 5, 0.8) - 4.0) < 1e-12);
	T_ASSERT(fabs(curve_at(x, y, 5, 0.4) - 1.0) < 1e-12);
	T_ASSERT(isnan(curve_at(x, y, 5, 0.39)));  /* never extrapolated */
	T_ASSERT(isnan(curve_at(x, y, 5, 0.875)));
	T_ASSERT(isnan(curve_at(x, y, 0, 0.5)));
}

TEST(eval_context, kvzap_threshold_protocol1_by_hand)
{
	/* 3 layers x 2 KV heads, one calibration window of T = 8 entries
	 * scored 0..7, window 2: the decision covers entries 0..5, so the
	 * ratio of a threshold tau is #{i < 6 : i < tau} / 8. */
	struct model m;
	tiny(&m);
	const uint32_t n = 8, nl = 6;
	float s[6 * 8];
	for (uint32_t e = 0; e < nl; e++)
		for (uint32_t i = 0; i < n; i++)
			s[e * n + i] = (float)i;
	/* 0.25 (2 of 8 dropped) needs tau just above 1 */
	float tau = kvzap_tau(&m, s, 1, n, n, 2, 0, 0.25);
	T_ASSERT(tau > 1.0f && tau < 1.001f);
	tau = kvzap_tau(&m, s, 1, n, n, 2, 0, 0.5);
	T_ASSERT(tau > 3.0f && tau < 3.001f);
	/* sinks 1: entry 0 is never dropped, 0.25 needs entries 1 and 2 */
	tau = kvzap_tau(&m, s, 1, n, n, 2, 1, 0.25);
	T_ASSERT(tau > 2.0f && tau < 2.001f);
	model_free(&m);
}

TEST_T(eval_context, reference_matches_dense_forward, 60)
{
	struct model m;
	tiny(&m);
	const struct model_config *c = &m.cfg;
	const uint32_t V = c->vocab_size, nc = T - 1 - P;
	int32_t tok[T];
	tokens(tok, T, 1);
	struct ctx_window w;
	T_OK(ctx_window_build(&m, tok, P, T, sep, 3, &w));
	/* the reference continuation = the dense forward of tok[0, T-1) */
	float *lg = malloc(sizeof(float) * (T - 1) * V);
	T_ASSERT(lg);
	T_OK(model_dense_forward(&m, tok, T - 1, lg));
	double worst = 0;
	for (uint32_t t = 0; t < nc; t++)
		for (uint32_t v = 0; v < V; v++) {
			double d = fabs(w.ref[(size_t)t * V + v] -
			                lg[(size_t)(P + t) * V + v]);
			worst = d > worst ? d : worst;
		}
	if (worst > 1e-4)
		th_fail(__FILE__, __LINE__, "reference vs dense: %g", worst);
	/* keeping every entry reproduces the reference bit for bit */
	struct ctx_cache *cc;
	T_OK(ctx_cache_open(&m, T, &cc));
	uint8_t *keep = malloc((size_t)c->n_layers * c->n_kv_heads * P);
	memset(keep, 1, (size_t)c->n_layers * c->n_kv_heads * P);
	ctx_load_keep(&m, &w, keep, cc);
	struct ctx_score s;
	T_OK(ctx_continue(&m, &w, cc, lg, &s));
	T_EQ(s.npos, nc);
	T_EQ_U64(s.kept, (uint64_t)P * c->n_layers * c->n_kv_heads);
	T_ASSERT(s.kl == 0.0 && s.top1 == nc && s.dnll == 0.0);
	/* dropping entries changes the predictions */
	T_OK(ctx_keep_oracle(&m, &w, 0.5, keep));
	ctx_cache_truncate(cc, 0);
	ctx_load_keep(&m, &w, keep, cc);
	T_OK(ctx_continue(&m, &w, cc, lg, &s));
	T_EQ_U64(s.kept, (uint64_t)(P / 2) * c->n_layers * c->n_kv_heads);
	T_ASSERT(s.kl > 0);
	ctx_cache_close(cc);
	free(keep);
	free(lg);
	ctx_window_free(&w);
	model_free(&m);
}

TEST_T(eval_context, oracle_scores_match_independent_ones, 60)
{
	struct model m;
	tiny(&m);
	const struct model_config *c = &m.cfg;
	const uint32_t L = c->n_layers, nkv = c->n_kv_heads, H = c->n_heads,
	               G = H / nkv;
	int32_t tok[T];
	tokens(tok, T, 2);
	struct ctx_window w;
	T_OK(ctx_window_build(&m, tok, P, T, sep, 3, &w));
	/* KVzip: oracle.h's pass over ctx sep ctx */
	float *kz = malloc(sizeof(float) * L * nkv * P);
	T_OK(oracle_kvzip(&m, tok, P, sep, 3, 0, kz));
	double worst = 0;
	for (size_t e = 0; e < (size_t)L * nkv * P; e++) {
		double d = fabs(kz[e] - w.kvzip[e]);
		worst = d > worst ? d : worst;
	}
	if (worst > 1e-5)
		th_fail(__FILE__, __LINE__, "kvzip vs oracle_kvzip: %g", worst);
	/* hindsight: the dense maps of the queries P .. T-2 */
	struct model_dense dn;
	T_OK(model_dense_init(&dn, &m, T - 1, 1));
	T_OK(model_dense_step(&dn, tok, T - 1, NULL));
	worst = 0;
	const uint32_t cap = T - 1;
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t g = 0; g < nkv; g++)
			for (uint32_t i = 0; i < P; i++) {
				double best = 0;
				for (uint32_t h = g * G; h < (g + 1) * G; h++) {
					double sum = 0;
					for (uint32_t t = P; t < T - 1; t++)
						sum += dn.maps[(((size_t)l * H + h) *
						                cap + t) * cap + i];
					best = sum > best ? sum : best;
				}
				double d = fabs(best - w.hind[((size_t)l * nkv + g) *
				                               P + i]);
				worst = d > worst ? d : worst;
			}
	if (worst > 1e-5)
		th_fail(__FILE__, __LINE__, "hindsight vs dense maps: %g",
		        worst);
	model_dense_free(&dn);
	/* kvzip's selection: one budget over all lists, sinks kept */
	uint8_t *keep = malloc((size_t)L * nkv * P);
	T_OK(ctx_keep_kvzip(&m, &w, 0.75, keep));
	uint64_t kept = 0;
	for (size_t e = 0; e < (size_t)L * nkv * P; e++) {
		kept += keep[e];
		if (e % P < KVZIP_SINKS)
			T_ASSERT(keep[e]);
	}
	T_EQ_U64(kept, (uint64_t)(P - 30) * L * nkv); /* floor(0.75 40) */
	free(keep);
	free(kz);
	ctx_window_free(&w);
	model_free(&m);
}
