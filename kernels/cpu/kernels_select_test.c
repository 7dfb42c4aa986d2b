/*
 * kernels_select_test.c — the CPU kernels of kernels.h that decide what is
 * kept (the sink gate, top-k and threshold selection) against a naive oracle
 * written here: plain loops in double precision, no BLAS, and page bytes
 * decoded by kernels_fixture.h's own f16/bf16 decoders, so a bug shared by
 * kernel and oracle is unlikely.
 *
 * Tolerances are atol + rtol * |ref| per element, stated beside each op;
 * NaN/Inf in a result fails before the tolerance is looked at.
 * Run: build/bin/kvtrim-tests kernels
 */
#include "kernels_fixture.h"
static void naive_rms(double *v, const float *g, uint32_t dp)
{
	double ss = 0;
	for (uint32_t d = 0; d < dp; d++)
		ss += v[d] * v[d];
	double inv = 1.0 / sqrt(ss / dp + 1e-6);
	for (uint32_t d = 0; d < dp; d++)
		v[d] = v[d] * inv * g[d];
}

static void naive_sink_gate(const float *x, uint32_t n, uint32_t d_in,
                            uint32_t n_kv, uint32_t G, uint32_t dp,
                            uint32_t S, const float *Wq, const float *cq,
                            const float *Wk, const float *gq,
                            const float *gk, const float *sinks,
                            const float *bias, double *score)
{
	double qt[64], kt[64];
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t g = 0; g < n_kv; g++) {
			for (uint32_t d = 0; d < dp; d++) {
				double acc = 0;
				for (uint32_t c = 0; c < d_in; c++)
					acc += (double)Wk[((size_t)g * dp + d) * d_in + c] * x[(size_t)i * d_in + c];
				kt[d] = acc;
			}
			naive_rms(kt, gk, dp);
			double psum = 0;
			for (uint32_t j = 0; j < G; j++) {
				size_t row = ((size_t)g * G + j) * dp;
				for (uint32_t d = 0; d < dp; d++) {
					double acc = cq[row + d];
					for (uint32_t c = 0; c < d_in; c++)
						acc += (double)Wq[(row + d) * d_in + c] * x[(size_t)i * d_in + c];
					qt[d] = acc;
				}
				naive_rms(qt, gq, dp);
				double l = bias[(size_t)g * G + j], den = 1;
				for (uint32_t d = 0; d < dp; d++)
					l += qt[d] * kt[d] / sqrt(dp);
				for (uint32_t s = 0; s < S; s++) {
					double ls = 0;
					for (uint32_t d = 0; d < dp; d++)
						ls += qt[d] * sinks[((size_t)g * S + s) * dp + d] / sqrt(dp);
					den += exp(ls - l);
				}
				psum += 1 / den;
			}
			score[(size_t)i * n_kv + g] = psum / G;
		}
}

TEST(kernels, sink_gate_hand)
{
	/* dp 2, S 1, G 1, n_kv 1, d_in 2, Wq = Wk = I, cq 0, gains 1.
	 * x = (1, -1): mean square 1, so qt = kt = (1, -1) (eps 1e-6 moves
	 * them by 5e-7); l = qt.kt / sqrt 2 + b = sqrt 2 + b.
	 * Case A: sink (1, 1), b 0: ls = 0, p = 1 / (1 + e^-sqrt2)
	 *         = 1 / 1.2431167 = 0.8044297.
	 * Case B: sink (0, 0), b -sqrt 2: l = 0, ls = 0, p = 0.5. */
	const float x[2] = {1, -1}, I[4] = {1, 0, 0, 1}, zero[2] = {0, 0};
	const float one[2] = {1, 1};
	float score, scratch[4];
	double ref;
	float b = 0;
	snprintf(ctx, sizeof(ctx), "hand case A");
	sink_gate_cpu(x, 1, 2, 1, 1, 2, 1, I, zero, I, one, one, one, &b,
	              &score, scratch);
	check_close("sink_gate", 0, score, 0.8044297, 2e-6, 0);
	naive_sink_gate(x, 1, 2, 1, 1, 2, 1, I, zero, I, one, one, one, &b,
	                &ref);
	check_close("sink_gate naive", 0, ref, 0.8044297, 2e-6, 0);
	b = -sqrtf(2.0f);
	snprintf(ctx, sizeof(ctx), "hand case B");
	sink_gate_cpu(x, 1, 2, 1, 1, 2, 1, I, zero, I, one, one, zero, &b,
	              &score, scratch);
	check_close("sink_gate", 0, score, 0.5, 2e-6, 0);
}

TEST(kernels, sink_gate_shapes)
{
	/* Scores in (0, 1); float projections + 16-long dots: atol 1e-5 +
	 * rtol 1e-4. */
	const uint32_t ns[] = {1, 37}, nkvs[] = {1, 2}, Gs[] = {1, 4},
	               dps[] = {2, 16}, Ss[] = {1, 16}, dins[] = {8, 64};
	rng_seed(8);
	for (int m = 0; m < 64; m++) {
		uint32_t n = ns[m & 1], n_kv = nkvs[(m >> 1) & 1],
		         G = Gs[(m >> 2) & 1], dp = dps[(m >> 3) & 1],
		         S = Ss[(m >> 4) & 1], din = dins[(m >> 5) & 1];
		snprintf(ctx, sizeof(ctx), "n %u n_kv %u G %u dp %u S %u d_in %u",
		         n, n_kv, G, dp, S, din);
		float *x = rand_vec((size_t)n * din, -1, 1);
		float *Wq = rand_vec((size_t)n_kv * G * dp * din, -0.5f, 0.5f);
		float *cq = rand_vec((size_t)n_kv * G * dp, -0.5f, 0.5f);
		float *Wk = rand_vec((size_t)n_kv * dp * din, -0.5f, 0.5f);
		float *gq = rand_vec(dp, 0.5f, 1.5f);
		float *gk = rand_vec(dp, 0.5f, 1.5f);
		float *sk = rand_vec((size_t)n_kv * S * dp, -1, 1);
		float *bias = rand_vec((size_t)n_kv * G, -2, 2);
		float *score = rand_vec((size_t)n * n_kv, 3, 4);
		float *scratch =
			malloc((size_t)n * n_kv * (G + 1) * dp * sizeof(float));
		double *ref = malloc((size_t)n * n_kv * sizeof(double));
		sink_gate_cpu(x, n, din, n_kv, G, dp, S, Wq, cq, Wk, gq, gk, sk,
		              bias, score, scratch);
		naive_sink_gate(x, n, din, n_kv, G, dp, S, Wq, cq, Wk, gq, gk,
		                sk, bias, ref);
		for (size_t i = 0; i < (size_t)n * n_kv; i++) {
			T_ASSERT(score[i] > 0 && score[i] < 1);
			check_close("sink_gate", i, score[i], ref[i], 1e-5, 1e-4);
		}
		free(x);
		free(Wq);
		free(cq);
		free(Wk);
		free(gq);
		free(gk);
		free(sk);
		free(bias);
		free(score);
		free(scratch);
		free(ref);
	}
}

/* ---------------------------------------------------------------- select_topk */

/* Runs select_topk and checks drop[] against the expected 0/1 list. */
static void expect_topk(const float *score, const uint32_t *rank,
                        const uint8_t *protect, uint32_t n, uint32_t k,
                        const uint8_t *want)
{
	uint8_t drop[64];
	uint32_t scratch[64];
	memset(drop, 7, sizeof(drop));
	uint32_t marked = select_topk_cpu(score, rank, protect, n, k, drop,
	                                  scratch);
	uint32_t want_n = 0;
	for (uint32_t i = 0; i < n; i++) {
		want_n += want[i];
		if (drop[i] != want[i])
			th_fail(__FILE__, __LINE__,
			        "k %u: drop[%u] = %u, expected %u", k, i,
			        drop[i], want[i]);
	}
	T_EQ(marked, want_n);
}

static const uint32_t idx_rank[64] = {
	0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
	16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
	32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
	48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};

TEST(kernels, select_topk_hand)
{
	const float s[5] = {0.5f, 0.1f, 0.9f, 0.3f, 0.7f};
	expect_topk(s, idx_rank, NULL, 5, 2, (const uint8_t[]){1, 1, 0, 1, 0});
	expect_topk(s, idx_rank, NULL, 5, 1, (const uint8_t[]){1, 1, 0, 1, 1});
	expect_topk(s, idx_rank, NULL, 5, 4, (const uint8_t[]){0, 1, 0, 0, 0});
	/* k >= n: nothing to drop; k = 0: every candidate goes. */
	expect_topk(s, idx_rank, NULL, 5, 5, (const uint8_t[]){0, 0, 0, 0, 0});
	expect_topk(s, idx_rank, NULL, 5, 99, (const uint8_t[]){0, 0, 0, 0, 0});
	expect_topk(s, idx_rank, NULL, 5, 0, (const uint8_t[]){1, 1, 1, 1, 1});
	/* n = 0 writes nothing and marks nothing. */
	expect_topk(s, idx_rank, NULL, 0, 0, (const uint8_t[]){0});
	/* Negative scores and -inf are ordinary values. */
	const float neg[4] = {-3.0f, -INFINITY, -0.5f, -10.0f};
	expect_topk(neg, idx_rank, NULL, 4, 2, (const uint8_t[]){0, 1, 0, 1});
}

TEST(kernels, select_topk_ties_keep_higher_rank)
{
	const float eq[6] = {1, 1, 1, 1, 1, 1};
	expect_topk(eq, idx_rank, NULL, 6, 3, (const uint8_t[]){1, 1, 1, 0, 0, 0});
	/* Ranks are positions, not indices: the list was compacted. */
	const uint32_t rank[6] = {40, 10, 50, 20, 60, 30};
	expect_topk(eq, rank, NULL, 6, 2, (const uint8_t[]){1, 1, 0, 1, 0, 1});
	expect_topk(eq, rank, NULL, 6, 3, (const uint8_t[]){0, 1, 0, 1, 0, 1});
	/* A tie only at the boundary: 0.5 x3, one slot left for them. */
	const float s[5] = {0.5f, 0.9f, 0.5f, 0.5f, 0.1f};
	expect_topk(s, idx_rank, NULL, 5, 2, (const uint8_t[]){1, 0, 1, 0, 1});
	/* +0 and -0 are equal scores: the rank decides. */
	const float z[2] = {0.0f, -0.0f};
	expect_topk(z, idx_rank, NULL, 2, 1, (const uint8_t[]){1, 0});
}

TEST(kernels, select_topk_nan_lowest)
{
	const float s[5] = {NAN, 1.0f, NAN, 0.0f, -INFINITY};
	expect_topk(s, idx_rank, NULL, 5, 3, (const uint8_t[]){1, 0, 1, 0, 0});
	/* One NaN must stay: the higher-ranked one. */
	expect_topk(s, idx_rank, NULL, 5, 4, (const uint8_t[]){1, 0, 0, 0, 0});
	expect_topk(s, idx_rank, NULL, 5, 1, (const uint8_t[]){1, 0, 1, 1, 1});
}

TEST(kernels, select_topk_protected)
{
	/* Protected entries stay whatever their score and do not use up k:
	 * of the 4 candidates (1, 2, 4, 5) the best 2 stay. */
	const float s[6] = {-5, 0.3f, 0.8f, NAN, 0.1f, 0.9f};
	const uint8_t prot[6] = {1, 0, 0, 1, 0, 0};
	expect_topk(s, idx_rank, prot, 6, 2, (const uint8_t[]){0, 1, 0, 0, 1, 0});
	expect_topk(s, idx_rank, prot, 6, 0, (const uint8_t[]){0, 1, 1, 0, 1, 1});
	expect_topk(s, idx_rank, prot, 6, 4, (const uint8_t[]){0, 0, 0, 0, 0, 0});
	const uint8_t all[3] = {1, 1, 1};
	expect_topk(s, idx_rank, all, 3, 0, (const uint8_t[]){0, 0, 0});
}

/* The oracle: sort candidates best first (an O(n^2) insertion sort, as
 * obvious as it gets) and drop everything past k. */
static const float *o_score;
static const uint32_t *o_rank;

static int o_better(uint32_t a, uint32_t b)
{
	double sa = o_score[a], sb = o_score[b];
	if (isnan(sa) || isnan(sb)) {
		if (!isnan(sa))
			return 1;
		if (!isnan(sb))
			return 0;
	} else if (sa != sb) {
		return sa > sb;
	}
	return o_rank[a] > o_rank[b];
}

static void naive_topk(const float *score, const uint32_t *rank,
                       const uint8_t *protect, uint32_t n, uint32_t k,
                       uint8_t *drop)
{
	uint32_t *c = malloc((n + 1) * sizeof(uint32_t)), m = 0;
	o_score = score;
	o_rank = rank;
	for (uint32_t i = 0; i < n; i++) {
		drop[i] = 0;
		if (protect && protect[i])
			continue;
		uint32_t j = m++;
		while (j > 0 && o_better(i, c[j - 1])) {
			c[j] = c[j - 1];
			j--;
		}
		c[j] = i;
	}
	for (uint32_t j = k; j < m; j++)
		drop[c[j]] = 1;
	free(c);
}

TEST_T(kernels, select_topk_vs_naive, 60)
{
	/* Distinct ranks (a shuffled permutation), scores from a small set
	 * so ties are common, some NaN, random protection, every k. */
	const uint32_t ns[] = {1, 2, 3, 37, 100, 1000};
	rng_seed(9);
	for (size_t a = 0; a < 6; a++) {
		uint32_t n = ns[a];
		float *s = malloc(n * sizeof(float));
		uint32_t *rank = malloc(n * sizeof(uint32_t)),
		         *scr = malloc(n * sizeof(uint32_t));
		uint8_t *prot = malloc(n), *d = malloc(n), *w = malloc(n);
		for (int trial = 0; trial < 30; trial++) {
			for (uint32_t i = 0; i < n; i++) {
				rank[i] = i * 7 + 3;
				uint32_t j = (uint32_t)(rng_u64() % (i + 1));
				uint32_t t = rank[i];
				rank[i] = rank[j];
				rank[j] = t;
				uint64_t r = rng_u64();
				s[i] = (r % 13 == 0) ? NAN
				                     : (float)((r >> 8) % (trial % 3 ? 5 : 1000));
				prot[i] = (r >> 32) % 5 == 0;
			}
			uint32_t ks[] = {0, 1, n / 3, n / 2, n - 1, n, n + 5};
			for (size_t ki = 0; ki < 7; ki++)
				for (int withp = 0; withp < 2; withp++) {
					const uint8_t *p = withp ? prot : NULL;
					uint32_t got = select_topk_cpu(s, rank, p, n, ks[ki], d, scr);
					naive_topk(s, rank, p, n, ks[ki], w);
					uint32_t want = 0;
					for (uint32_t i = 0; i < n; i++) {
						want += w[i];
						if (d[i] != w[i])
							th_fail(__FILE__, __LINE__, "n %u k %u trial %d: drop[%u] = %u, expected %u",
							        n, ks[ki], trial, i, d[i], w[i]);
					}
					T_EQ(got, want);
				}
		}
		free(s);
		free(rank);
		free(scr);
		free(prot);
		free(d);
		free(w);
	}
}

TEST_T(kernels, select_topk_adversarial_is_fast, 60)
{
	/* Sorted, reverse sorted, all equal, organ pipe and interleaved
	 * halves at n = 2^20 (shapes that make naive pivots quadratic):
	 * must finish well inside the timeout.  Checks the kept count and
	 * the boundary: every kept entry beats every dropped one. */
	const uint32_t n = 1u << 20, k = n / 3;
	float *s = malloc(n * sizeof(float));
	uint32_t *rank = malloc(n * sizeof(uint32_t)),
	         *scr = malloc(n * sizeof(uint32_t));
	uint8_t *d = malloc(n);
	for (int shape = 0; shape < 5; shape++) {
		for (uint32_t i = 0; i < n; i++) {
			rank[i] = i;
			switch (shape) {
			case 0: s[i] = (float)i; break;
			case 1: s[i] = (float)(n - i); break;
			case 2: s[i] = 1.0f; break;
			case 3: s[i] = (float)(i < n / 2 ? i : n - i); break;
			default: /* odd first half ascending, then evens */
				s[i] = (float)(i < n / 2 ? 2 * i + 1 : 2 * (i - n / 2));
			}
		}
		uint32_t marked = select_topk_cpu(s, rank, NULL, n, k, d, scr);
		T_EQ(marked, n - k);
		o_score = s;
		o_rank = rank;
		/* The worst kept beats the best dropped. */
		uint32_t worst_kept = UINT32_MAX, best_drop = UINT32_MAX;
		for (uint32_t i = 0; i < n; i++) {
			if (!d[i] && (worst_kept == UINT32_MAX || o_better(worst_kept, i)))
				worst_kept = i;
			if (d[i] && (best_drop == UINT32_MAX || o_better(i, best_drop)))
				best_drop = i;
		}
		T_ASSERT(o_better(worst_kept, best_drop));
	}
	free(s);
	free(rank);
	free(scr);
	free(d);
}

/* ---------------------------------------------------------------- select_threshold */

TEST(kernels, select_threshold_hand)
{
	/* Only score < tau (or NaN) is dropped: equality keeps. */
	const float s[7] = {-4.0f, -4.5f, NAN, -3.9f, -INFINITY, INFINITY, -4.0001f};
	uint8_t d[7];
	memset(d, 9, sizeof(d));
	T_EQ(select_threshold_cpu(s, NULL, 7, -4.0f, d), 4);
	const uint8_t want[7] = {0, 1, 1, 0, 1, 0, 1};
	for (int i = 0; i < 7; i++)
		T_EQ(d[i], want[i]);
	/* Protected entries stay, NaN included. */
	const uint8_t prot[7] = {0, 1, 1, 0, 0, 0, 0};
	T_EQ(select_threshold_cpu(s, prot, 7, -4.0f, d), 2);
	const uint8_t want2[7] = {0, 0, 0, 0, 1, 0, 1};
	for (int i = 0; i < 7; i++)
		T_EQ(d[i], want2[i]);
	/* -0 == +0 at tau: kept. */
	const float z[1] = {-0.0f};
	T_EQ(select_threshold_cpu(z, NULL, 1, 0.0f, d), 0);
	T_EQ(d[0], 0);
	T_EQ(select_threshold_cpu(s, NULL, 0, 0.0f, d), 0);
}

TEST(kernels, select_threshold_vs_naive)
{
	rng_seed(10);
	enum { N = 1000 };
	float s[N];
	uint8_t prot[N], d[N];
	for (int trial = 0; trial < 20; trial++) {
		float tau = (float)(trial - 10) / 4;
		uint32_t want = 0;
		for (int i = 0; i < N; i++) {
			uint64_t r = rng_u64();
			s[i] = r % 17 == 0 ? NAN : (float)((int)(r % 41) - 20) / 4;
			prot[i] = (r >> 20) % 4 == 0;
		}
		uint32_t got = select_threshold_cpu(s, prot, N, tau, d);
		for (int i = 0; i < N; i++) {
			int w = !prot[i] && (isnan(s[i]) || s[i] < tau);
			want += (uint32_t)w;
			T_EQ(d[i], w);
		}
		T_EQ(got, want);
	}
}
