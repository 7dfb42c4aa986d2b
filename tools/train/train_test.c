/*
 * train_test.c — the numerical pieces of kvtrim-train (tools/train):
 * ridge against a known solution, Cholesky on a hand-solved system, R^2
 * and Spearman on hand-computed cases, the MLP trainer lowering its loss
 * on a toy problem, the Fast KVzip gate trainer agreeing with the
 * kernel the policy runs (sink_gate_cpu) and with finite differences,
 * KVpop's budget shares on a hand-counted case and its memory's readout
 * recovering a planted linear law.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "fit.h"
#include "gate.h"
#include "kernels.h"
#include "pop.h"
#include "test.h"

#define T_NEAR(a, b, tol)                                                      \
	do {                                                                   \
		double a_ = (a), b_ = (b);                                     \
		if (!(fabs(a_ - b_) <= (tol)))                                 \
			th_fail(__FILE__, __LINE__, "%s = %.9g, expected "    \
			        "%.9g (tol %g)", #a, a_, b_, (double)(tol));   \
	} while (0)

TEST(train, cholesky_hand)
{
	/* [[4, 2], [2, 3]] x = [2, 1]  ->  x = [0.5, 0] */
	double A[4] = {4, 2, 2, 3}, B[2] = {2, 1};
	T_OK(fit_cholesky_solve(A, B, 2, 1));
	T_NEAR(B[0], 0.5, 1e-12);
	T_NEAR(B[1], 0.0, 1e-12);
	double N[4] = {1, 2, 2, 1}, C[2] = {1, 1}; /* indefinite */
	T_ERR(fit_cholesky_solve(N, C, 2, 1), KVT_EINVAL);
}

TEST(train, ridge_known_solution)
{
	enum { n = 400, d = 6, k = 2 };
	static float X[n * d], Y[n * k];
	const float W[k][d] = {{1, -2, 0.5f, 0, 3, -1},
	                       {0.25f, 0, -1, 2, 0, 1}};
	const float b[k] = {-4, 0.5f};
	uint64_t st = 7;
	for (int r = 0; r < n; r++) {
		for (int i = 0; i < d; i++)
			X[r * d + i] = (float)(2 * dataset_uniform(&st) - 1) + 3;
		for (int c = 0; c < k; c++) {
			double y = b[c];
			for (int i = 0; i < d; i++)
				y += W[c][i] * X[r * d + i];
			Y[r * k + c] = (float)y;
		}
	}
	float Wf[k * d], bf[k];
	/* tiny alpha: the exact solution (intercept unpenalised) */
	T_OK(fit_ridge(X, Y, n, d, k, 1e-9, Wf, bf));
	for (int c = 0; c < k; c++) {
		for (int i = 0; i < d; i++)
			T_NEAR(Wf[c * d + i], W[c][i], 1e-3);
		T_NEAR(bf[c], b[c], 1e-2);
	}
	/* alpha shrinks the weights, never the intercept's job */
	float Ws[k * d], bs[k];
	T_OK(fit_ridge(X, Y, n, d, k, 1e4, Ws, bs));
	double n0 = 0, n1 = 0;
	for (int i = 0; i < k * d; i++) {
		n0 += Wf[i] * Wf[i];
		n1 += Ws[i] * Ws[i];
	}
	T_ASSERT(n1 < 0.5 * n0);
}

TEST(train, r2_spearman_hand)
{
	const float y[4] = {1, 2, 3, 4}, p[4] = {1, 2, 3, 5},
	            m[4] = {2.5f, 2.5f, 2.5f, 2.5f};
	T_NEAR(fit_r2(p, y, 4), 0.8, 1e-9);   /* 1 - 1/5 */
	T_NEAR(fit_r2(m, y, 4), 0.0, 1e-9);
	T_ASSERT(isnan(fit_r2(y, m, 4)));     /* constant target */
	const float a[5] = {1, 2, 3, 4, 5}, b[5] = {5, 6, 7, 8, 7};
	/* ranks of b: 1 2 3.5 5 3.5 -> rho = 8 / sqrt(10 * 9.5) */
	T_NEAR(fit_spearman(a, b, 5), 8.0 / sqrt(95.0), 1e-9);
	const float c[5] = {1, 8, 27, 64, 125}, e[5] = {5, 4, 3, 2, 1};
	T_NEAR(fit_spearman(a, c, 5), 1.0, 1e-12);
	T_NEAR(fit_spearman(a, e, 5), -1.0, 1e-12);
}

/* Two layers of four rows, one KV head: all eight scores sorted are .2
 * .3 .4 1 2 3 4 5.  Keep 1/2: tau = the 5th, 2; layer 0 has 3 rows >= 2
 * (4 3 2), layer 1 one (5): shares 3 / 2 and 1 / 2.  Keep 1/4: tau = the
 * 7th, 4; one row each: 1 and 1. */
TEST(train, pop_shares_hand)
{
	const float l0[4] = {4, 3, 2, 1}, l1[4] = {5, .4f, .3f, .2f};
	const float *pred[2] = {l0, l1}, keep[2] = {.5f, .25f};
	float share[4];
	T_EQ(pop_shares(pred, 2, 4, 1, keep, 2, share), 0);
	T_NEAR(share[0], 1.5, 1e-6);
	T_NEAR(share[1], 0.5, 1e-6);
	T_NEAR(share[2], 1.0, 1e-6);
	T_NEAR(share[3], 1.0, 1e-6);
}

/* The memory's readout: the targets follow ln t = 0.3 + 0.5 s + 1.5 f,
 * f = ln(m / c) of the second decay (c summed here term by term), the
 * first decay's m is noise, every fifth row's target is cut (NaN) and a
 * cut target must be skipped, not fitted.  The fit finds the second
 * decay and the law's weights, and explains the held-out rows (R^2 1)
 * better than s alone; with every target cut, s alone (1, 0). */
TEST(train, pop_mem_fit_finds_the_law)
{
	enum { N = 200, NH = 100 };
	const uint32_t D = RECIPE_KVPOP_DELAY;
	float *S = malloc(sizeof(float) * (N + NH)),
	      *M = malloc(sizeof(float) * (N + NH) * POP_MEM_FEATS);
	uint64_t st = 11;
	for (uint32_t i = 0; i < N + NH; i++) {
		S[i] = (float)(dataset_rng(&st) % 1000) / 100.0f - 5.0f;
		float *f = M + (size_t)i * POP_MEM_FEATS;
		for (uint32_t k = 0; k < POP_MEM_AGES; k++) {
			double c = 0, b = exp(-1.0 / pop_mem_decay(1));
			for (uint32_t q = 0; q < pop_mem_age(k) - D; q++)
				c += pow(b, q);
			const double mean = (double)(1 + dataset_rng(&st) % 500) /
			                    1000.0;
			f[POP_MEM_FEAT(k, 1)] =
				(float)(dataset_rng(&st) % 100) / 10.0f;
			f[POP_MEM_FEAT(k, 2)] = (float)(mean * c);
			const double y = 0.3 + 0.5 * S[i] +
			                 1.5 * log(mean + 1e-6);
			f[POP_MEM_FEAT(k, 0)] = i % 5 == 4 ? NAN
			                        : (float)(exp(y) - 1e-6);
		}
	}
	struct pop_mem pm;
	pop_mem_fit(S, M, N, S + N, M + (size_t)N * POP_MEM_FEATS, NH, 1, D,
	            &pm);
	T_NEAR(pm.decay, pop_mem_decay(1), 0);
	T_NEAR(pm.w_s, 0.5, 1e-3);
	T_NEAR(pm.w_f, 1.5, 1e-3);
	T_NEAR(pm.r2_mem, 1.0, 1e-4);
	T_ASSERT(pm.r2_s < pm.r2_mem - 0.1);
	T_EQ(pm.n_tr, (size_t)N / 5 * 4 * POP_MEM_AGES);
	T_EQ(pm.n_ho, (size_t)NH / 5 * 4 * POP_MEM_AGES);
	for (uint32_t i = 0; i < N + NH; i++)
		for (uint32_t k = 0; k < POP_MEM_AGES; k++)
			M[(size_t)i * POP_MEM_FEATS + POP_MEM_FEAT(k, 0)] = NAN;
	pop_mem_fit(S, M, N, S + N, M + (size_t)N * POP_MEM_FEATS, NH, 1, D,
	            &pm);
	T_EQ(pm.n_tr, 0);
	T_NEAR(pm.w_s, 1.0, 0);
	T_NEAR(pm.w_f, 0.0, 0);
	T_ASSERT(isnan(pm.r2_mem));
	free(S);
	free(M);
}

TEST(train, mlp_loss_decreases)
{
	enum { n = 2000, d = 4, h = 16, k = 2, E = 20 };
	static float X[n * d], Y[n * k];
	uint64_t st = 3;
	for (int r = 0; r < n; r++) {
		for (int i = 0; i < d; i++)
			X[r * d + i] = (float)(4 * dataset_uniform(&st) - 2);
		Y[r * k] = sinf(X[r * d]) + X[r * d + 1] * X[r * d + 1];
		Y[r * k + 1] = fabsf(X[r * d + 2]) - X[r * d + 3];
	}
	float W1[h * d], b1[h], W2[k * h], b2[k];
	double loss[E];
	struct fit_mlp_opts o = {E, 64, 1e-2, 0.01, 1.0, 5};
	T_OK(fit_mlp(X, Y, n, d, h, k, &o, W1, b1, W2, b2, loss));
	T_ASSERT(loss[E - 1] < 0.2 * loss[0]);
	/* deterministic for a seed */
	float V1[h * d], c1[h], V2[k * h], c2[k];
	T_OK(fit_mlp(X, Y, n, d, h, k, &o, V1, c1, V2, c2, NULL));
	T_ASSERT(!memcmp(W1, V1, sizeof(W1)) && !memcmp(W2, V2, sizeof(W2)));
	/* fit_mlp_apply = the policy's kernel */
	float P1[8 * k], P2[8 * k], hs[8 * h];
	T_OK(fit_mlp_apply(X, 8, d, h, k, W1, b1, W2, b2, P1));
	scorer_mlp_cpu(X, 8, d, W1, b1, h, W2, b2, k, P2, hs);
	for (int i = 0; i < 8 * k; i++)
		T_NEAR(P1[i], P2[i], 1e-4);
}

TEST(train, gate_matches_kernel_and_gradient)
{
	enum { n = 5, d = 6, nkv = 2, G = 2, dp = 4, S = 3 };
	struct gate_params p;
	T_OK(gate_init(&p, d, nkv, G, dp, S, 11));
	uint64_t st = 9;
	/* non-trivial gains, biases and query bias */
	for (int i = 0; i < dp; i++) {
		p.gq[i] = 0.5f + (float)dataset_uniform(&st);
		p.gk[i] = 0.5f + (float)dataset_uniform(&st);
	}
	for (int i = 0; i < nkv * G; i++)
		p.bias[i] = (float)(dataset_uniform(&st) - 0.5);
	for (int i = 0; i < nkv * G * dp; i++)
		p.cq[i] = (float)(dataset_uniform(&st) - 0.5);
	float X[n * d], Y[n * nkv], s1[n * nkv], s2[n * nkv];
	float scr[n * nkv * (G + 1) * dp];
	for (int i = 0; i < n * d; i++)
		X[i] = (float)(2 * dataset_uniform(&st) - 1);
	for (int i = 0; i < n * nkv; i++)
		Y[i] = (float)dataset_uniform(&st);
	size_t np = gate_count(&p);
	float *g = calloc(np, sizeof(float));
	T_ASSERT(g);
	double L0 = gate_loss(&p, X, Y, n, g, s1);
	sink_gate_cpu(X, n, d, nkv, G, dp, S, p.Wq, p.cq, p.Wk, p.gq, p.gk,
	              p.sinks, p.bias, s2, scr);
	for (int i = 0; i < n * nkv; i++)
		T_NEAR(s1[i], s2[i], 1e-5);
	T_ASSERT(L0 > 0);
	/* central differences on every parameter */
	double worst = 0;
	for (size_t i = 0; i < np; i++) {
		float keep = p.flat[i], h = 2e-3f;
		p.flat[i] = keep + h;
		double lp = gate_loss(&p, X, Y, n, NULL, NULL);
		p.flat[i] = keep - h;
		double lm = gate_loss(&p, X, Y, n, NULL, NULL);
		p.flat[i] = keep;
		double fd = (lp - lm) / (2 * h);
		/* float loss: differences carry ~1e-5 of rounding noise */
		double e = fabs(fd - g[i]) / (1e-4 + 2e-2 * fabs(fd));
		if (e > 1)
			fprintf(stderr, "param %zu: fd %g, analytic %g\n", i,
			        fd, g[i]);
		worst = e > worst ? e : worst;
	}
	T_ASSERT(worst <= 1);
	free(g);
	gate_free(&p);
}
