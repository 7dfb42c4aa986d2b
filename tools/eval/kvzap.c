/*
 * kvzap.c — kvzap's thresholds, chosen on the training split only: its
 * scorers' scores on calibration sequences, the ratio a threshold achieves
 * under the protocol (exact, from the scores), the threshold for a target
 * ratio and the grid of the threshold sweep.
 */
#include "eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../train/dataset.h"
#include "kernels.h"
#include "model.h"
#include "weights.h"

/* kvzap's achieved ratio on the protocol for threshold tau, computed from
 * its scores s [cal][L][n_kv][T] exactly: after the sync of step t the
 * entries i <= t - w were decided (dropped iff s < tau), the window
 * (t - w, t] is kept. */
static double kvzap_ratio(const struct model *M, const float *s, uint32_t ncal,
                          uint32_t T, uint32_t P, uint32_t w, float tau)
{
	const struct model_config *mc = &M->cfg;
	size_t nl = (size_t)mc->n_layers * mc->n_kv_heads;
	double acc = 0;
	uint64_t cnt = 0;
	uint32_t *below = malloc(sizeof(uint32_t) * (T + 1));
	for (uint32_t q = 0; q < ncal; q++) {
		/* below[i] = dropped decided entries among positions < i */
		memset(below, 0, sizeof(uint32_t) * (T + 1));
		for (size_t li = 0; li < nl; li++) {
			const float *x = s + ((size_t)q * nl + li) * T;
			uint32_t run = 0;
			for (uint32_t i = 0; i < T; i++) {
				below[i] += run;
				run += !(x[i] >= tau);
			}
			below[T] += run;
		}
		for (uint32_t t = P; t + 1 < T; t++) {
			uint32_t n = t + 1;
			uint32_t decided = n > w ? n - w : 0;
			double dropped = below[decided];
			acc += dropped / ((double)n * nl);
			cnt++;
		}
	}
	free(below);
	return cnt ? acc / cnt : 0;
}

/* Scores of the kvzap model dir on ncal training sequences. */
float *kvzap_scores(const struct model *M, const char *dir,
                    const struct dataset *cal, char *err, size_t errlen)
{
	const struct model_config *mc = &M->cfg;
	struct weights *w;
	if (weights_load(dir, &w, err, errlen))
		return NULL;
	uint32_t hid = 0, L = mc->n_layers, nkv = mc->n_kv_heads, d = mc->dim,
	         T = cal->len;
	int mlp = weights_has(w, "layers.0.0.weight");
	if (mlp && weights_config_u32(w, "hidden_dim", &hid)) {
		snprintf(err, errlen, "%.900s: no hidden_dim", dir);
		weights_free(w);
		return NULL;
	}
	float *s = malloc(sizeof(float) * cal->n * L * nkv * T);
	float *y = malloc(sizeof(float) * T * nkv);
	float *hs = malloc(sizeof(float) * T * (hid + 1));
	if (!s || !y || !hs)
		eval_die("out of memory");
	for (uint32_t q = 0; q < cal->n; q++) {
		struct model_dense dn;
		if (model_dense_init(&dn, M, T, 1) ||
		    model_dense_step(&dn, cal->tok + (size_t)q * T, T, NULL))
			eval_die("calibration forward failed");
		for (uint32_t l = 0; l < L; l++) {
			char n1[64], n2[64], n3[64], n4[64];
			snprintf(n1, 64, mlp ? "layers.%u.0.weight" : "layers.%u.weight", l);
			snprintf(n2, 64, mlp ? "layers.%u.0.bias" : "layers.%u.bias", l);
			snprintf(n3, 64, "layers.%u.2.weight", l);
			snprintf(n4, 64, "layers.%u.2.bias", l);
			uint32_t o1 = mlp ? hid : nkv;
			uint64_t s1[2] = {o1, d}, s2[1] = {o1}, s3[2] = {nkv, hid},
			         s4[1] = {nkv};
			const float *W1 = weights_get(w, n1, 2, s1, err, errlen);
			const float *b1 = weights_get(w, n2, 1, s2, err, errlen);
			const float *W2 = mlp ? weights_get(w, n3, 2, s3, err, errlen) : NULL;
			const float *b2 = mlp ? weights_get(w, n4, 1, s4, err, errlen) : NULL;
			if (!W1 || !b1 || (mlp && (!W2 || !b2)))
				eval_die("%s: %s", dir, err);
			const float *x = dn.xs + (size_t)l * T * d;
			if (mlp)
				scorer_mlp_cpu(x, T, d, W1, b1, hid, W2, b2, nkv,
				               y, hs);
			else
				scorer_linear_cpu(x, T, d, W1, b1, nkv, y);
			for (uint32_t g = 0; g < nkv; g++)
				for (uint32_t i = 0; i < T; i++)
					s[(((size_t)q * L + l) * nkv + g) * T + i] =
						y[(size_t)i * nkv + g];
		}
		model_dense_free(&dn);
	}
	free(y);
	free(hs);
	weights_free(w);
	return s;
}

static int same_f(float a, float b) { return fabsf(a - b) < 1e-6f; }

/* Bisection of tau for the target ratio (achieved grows with tau). */
float kvzap_tau(const struct model *M, const float *s, uint32_t ncal,
                uint32_t T, uint32_t P, uint32_t w, double R)
{
	float lo = -60.0f, hi = 20.0f;
	for (int it = 0; it < 60; it++) {
		float mid = 0.5f * (lo + hi);
		if (kvzap_ratio(M, s, ncal, T, P, w, mid) < R)
			lo = mid;
		else
			hi = mid;
	}
	return 0.5f * (lo + hi);
}

/* The sweep's fixed thresholds, chosen on the training split: for npts
 * ratios evenly spaced from SWEEP_LO to hi (hi = SWEEP_HI or, when the
 * window caps kvzap below that, 0.01 under the cap), the threshold that
 * reaches it, rounded to a multiple of SWEEP_ROUND; duplicates once. */
uint32_t kvzap_sweep_grid(const struct model *M, const char *name,
                          const float *s, uint32_t ncal, uint32_t T, uint32_t P,
                          uint32_t w, uint32_t npts, float *out)
{
	double cap = kvzap_ratio(M, s, ncal, T, P, w, INFINITY);
	double rhi = cap - 0.01 < SWEEP_HI ? cap - 0.01 : SWEEP_HI;
	uint32_t n = 0;
	fprintf(stderr, "kvtrim-eval: %s sweep (training split, cap %.3f):",
	        name, cap);
	for (uint32_t i = 0; i < npts; i++) {
		double r = npts > 1 ? SWEEP_LO + (rhi - SWEEP_LO) * i /
		                              (npts - 1) : SWEEP_LO;
		float tau = (float)(SWEEP_ROUND *
		                    round(kvzap_tau(M, s, ncal, T, P, w, r) /
		                          SWEEP_ROUND));
		if (n && same_f(out[n - 1], tau))
			continue;
		out[n++] = tau;
		fprintf(stderr, " %.2f (%.3f)", tau,
		        kvzap_ratio(M, s, ncal, T, P, w, tau));
	}
	fputc('\n', stderr);
	return n;
}
