/*
 * kvzap.c — kvzap's thresholds, chosen on the training split only: its
 * scorers (kvzap_open / kvzap_score: the daemon's scorer kernels on the
 * attention inputs of a sequence) and their scores on calibration
 * sequences, the ratio a threshold achieves under the protocol (exact, from
 * the scores; either protocol), the threshold for a target ratio and the
 * grid of the threshold sweep; the kvzap jobs of every protocol
 * (kvzap_add_target, kvzap_add_sweep), so their specs are written once.
 */
#include "eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "../../train/recipe.h"
#include "kernels.h"
#include "model.h"
#include "weights.h"

/* kvzap's achieved ratio on the protocol for threshold tau, computed from
 * its scores s [cal][L][n_kv][T] exactly: after the sync of step t the
 * entries i <= t - w were decided (dropped iff s < tau), the window
 * (t - w, t] is kept; positions < sinks are never dropped.  T == P is
 * protocol 1 (context compression): one decision after the prefill of the
 * T entries, those in [sinks, T - w) decided. */
static double kvzap_ratio(const struct model *M, const float *s, uint32_t ncal,
                          uint32_t T, uint32_t P, uint32_t w, uint32_t sinks,
                          float tau)
{
	const struct model_config *mc = &M->cfg;
	size_t nl = (size_t)mc->n_layers * mc->n_kv_heads;
	double acc = 0;
	uint64_t cnt = 0;
	if (T <= P) {
		uint32_t dec = T > w ? T - w : 0;
		for (size_t e = 0; e < ncal * nl; e++) {
			const float *x = s + e * T;
			uint32_t dropped = 0;
			for (uint32_t i = sinks; i < dec; i++)
				dropped += !(x[i] >= tau);
			acc += (double)dropped / T;
		}
		return ncal ? acc / ((double)ncal * nl) : 0;
	}
	uint32_t *below = malloc(sizeof(uint32_t) * (T + 1));
	for (uint32_t q = 0; q < ncal; q++) {
		/* below[i] = dropped decided entries among positions < i */
		memset(below, 0, sizeof(uint32_t) * (T + 1));
		for (size_t li = 0; li < nl; li++) {
			const float *x = s + ((size_t)q * nl + li) * T;
			uint32_t run = 0;
			for (uint32_t i = 0; i < T; i++) {
				below[i] += run;
				run += i >= sinks && !(x[i] >= tau);
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

struct kvzap_scorer {
	const struct model *M;
	struct weights *w;
	int mlp;
	uint32_t hid;
	/* per layer: W1 [o1][d], b1 [o1], W2 [nkv][hid], b2 [nkv] (MLP only
	 * the last two); o1 = hid (MLP) or nkv (linear) */
	const float **W1, **b1, **W2, **b2;
	float *y, *hs; /* [cap][nkv], [cap][hid + 1] */
	uint32_t cap;
};

void kvzap_close(struct kvzap_scorer *z)
{
	if (!z)
		return;
	weights_free(z->w);
	free(z->W1);
	free(z->b1);
	free(z->W2);
	free(z->b2);
	free(z->y);
	free(z->hs);
	free(z);
}

int kvzap_open(const struct model *M, const char *dir, uint32_t T,
               struct kvzap_scorer **out, char *err, size_t errlen)
{
	const struct model_config *mc = &M->cfg;
	const uint32_t L = mc->n_layers, nkv = mc->n_kv_heads, d = mc->dim;
	struct kvzap_scorer *z = calloc(1, sizeof(*z));
	*out = NULL;
	if (!z)
		return KVT_ENOMEM;
	z->M = M;
	int rc = weights_load(dir, &z->w, err, errlen);
	if (rc) {
		free(z);
		return rc;
	}
	z->mlp = weights_has(z->w, "layers.0.0.weight");
	if (z->mlp && weights_config_u32(z->w, "hidden_dim", &z->hid)) {
		snprintf(err, errlen, "%.900s: no hidden_dim", dir);
		kvzap_close(z);
		return KVT_EINVAL;
	}
	z->W1 = calloc(L, sizeof(float *));
	z->b1 = calloc(L, sizeof(float *));
	z->W2 = calloc(L, sizeof(float *));
	z->b2 = calloc(L, sizeof(float *));
	z->cap = T;
	z->y = malloc(sizeof(float) * T * nkv);
	z->hs = malloc(sizeof(float) * T * (z->hid + 1));
	if (!z->W1 || !z->b1 || !z->W2 || !z->b2 || !z->y || !z->hs) {
		kvzap_close(z);
		return KVT_ENOMEM;
	}
	for (uint32_t l = 0; l < L; l++) {
		char n1[64], n2[64], n3[64], n4[64];
		snprintf(n1, 64, z->mlp ? "layers.%u.0.weight" : "layers.%u.weight", l);
		snprintf(n2, 64, z->mlp ? "layers.%u.0.bias" : "layers.%u.bias", l);
		snprintf(n3, 64, "layers.%u.2.weight", l);
		snprintf(n4, 64, "layers.%u.2.bias", l);
		uint32_t o1 = z->mlp ? z->hid : nkv;
		uint64_t s1[2] = {o1, d}, s2[1] = {o1}, s3[2] = {nkv, z->hid},
		         s4[1] = {nkv};
		z->W1[l] = weights_get(z->w, n1, 2, s1, err, errlen);
		z->b1[l] = weights_get(z->w, n2, 1, s2, err, errlen);
		if (z->mlp) {
			z->W2[l] = weights_get(z->w, n3, 2, s3, err, errlen);
			z->b2[l] = weights_get(z->w, n4, 1, s4, err, errlen);
		}
		if (!z->W1[l] || !z->b1[l] ||
		    (z->mlp && (!z->W2[l] || !z->b2[l]))) {
			kvzap_close(z);
			return KVT_EINVAL;
		}
	}
	*out = z;
	return 0;
}

void kvzap_score(struct kvzap_scorer *z, const float *xs, uint32_t T,
                 float *out)
{
	const struct model_config *mc = &z->M->cfg;
	const uint32_t nkv = mc->n_kv_heads, d = mc->dim;
	for (uint32_t l = 0; l < mc->n_layers; l++) {
		const float *x = xs + (size_t)l * T * d;
		for (uint32_t i0 = 0; i0 < T; i0 += z->cap) {
			uint32_t n = T - i0 < z->cap ? T - i0 : z->cap;
			const float *xi = x + (size_t)i0 * d;
			if (z->mlp)
				scorer_mlp_cpu(xi, n, d, z->W1[l], z->b1[l], z->hid,
				               z->W2[l], z->b2[l], nkv, z->y, z->hs);
			else
				scorer_linear_cpu(xi, n, d, z->W1[l], z->b1[l],
				                  nkv, z->y);
			eval_put_scores(out, z->y, l, nkv, T, i0, n);
		}
	}
}

/* Scores of the kvzap model dir on ncal training sequences. */
float *kvzap_scores(const struct model *M, const char *dir,
                    const struct dataset *cal, char *err, size_t errlen)
{
	const struct model_config *mc = &M->cfg;
	const uint32_t L = mc->n_layers, nkv = mc->n_kv_heads, T = cal->len;
	struct kvzap_scorer *z;
	if (kvzap_open(M, dir, T, &z, err, errlen))
		return NULL;
	float *s = malloc(sizeof(float) * cal->n * L * nkv * T);
	if (!s)
		eval_die("out of memory");
	for (uint32_t q = 0; q < cal->n; q++) {
		struct model_dense dn;
		if (model_dense_init(&dn, M, T, 1) ||
		    model_dense_step(&dn, cal->tok + (size_t)q * T, T, NULL))
			eval_die("calibration forward failed");
		kvzap_score(z, dn.xs, T, s + (size_t)q * L * nkv * T);
		model_dense_free(&dn);
	}
	kvzap_close(z);
	return s;
}

static int same_f(float a, float b) { return fabsf(a - b) < 1e-6f; }

/* Bisection of tau for the target ratio (achieved grows with tau): the
 * upper end, which reaches R (the midpoint may round onto a score). */
float kvzap_tau(const struct model *M, const float *s, uint32_t ncal,
                uint32_t T, uint32_t P, uint32_t w, uint32_t sinks, double R)
{
	float lo = -60.0f, hi = 20.0f;
	for (int it = 0; it < 60; it++) {
		float mid = 0.5f * (lo + hi);
		if (kvzap_ratio(M, s, ncal, T, P, w, sinks, mid) < R)
			lo = mid;
		else
			hi = mid;
	}
	return hi;
}

/* Rounds a swept threshold: to a multiple of step, or (step 0) to three
 * significant digits, for scores that are not on a log scale (Fast
 * KVzip's gate is a probability: 0.0067 and 0.022 are one step apart). */
static float sweep_round(double tau, double step)
{
	if (step > 0)
		return (float)(step * round(tau / step));
	if (tau == 0 || !isfinite(tau))
		return (float)tau;
	double e = pow(10, floor(log10(fabs(tau))) - 2);
	return (float)(e * round(tau / e));
}

/* The sweep's fixed thresholds, chosen on the training split: for npts
 * ratios evenly spaced from SWEEP_LO to hi (hi = SWEEP_HI or, when the
 * window caps the rule below that, 0.01 under the cap), the threshold
 * that reaches it, rounded by sweep_round(step); duplicates once. */
uint32_t kvzap_sweep_grid(const struct model *M, const char *name,
                          const float *s, uint32_t ncal, uint32_t T, uint32_t P,
                          uint32_t w, uint32_t sinks, uint32_t npts,
                          double step, float *out)
{
	double cap = kvzap_ratio(M, s, ncal, T, P, w, sinks, INFINITY);
	double rhi = cap - 0.01 < SWEEP_HI ? cap - 0.01 : SWEEP_HI;
	uint32_t n = 0;
	fprintf(stderr, "kvtrim-eval: %s sweep (training split, cap %.3f):",
	        name, cap);
	for (uint32_t i = 0; i < npts; i++) {
		double r = npts > 1 ? SWEEP_LO + (rhi - SWEEP_LO) * i /
		                              (npts - 1) : SWEEP_LO;
		float tau = sweep_round(kvzap_tau(M, s, ncal, T, P, w, sinks, r),
		                        step);
		if (n && same_f(out[n - 1], tau))
			continue;
		out[n++] = tau;
		fprintf(stderr, " %.3g (%.3f)", tau,
		        kvzap_ratio(M, s, ncal, T, P, w, sinks, tau));
	}
	fputc('\n', stderr);
	return n;
}

const char *const kvzap_names[2] = {"kvzap-linear", "kvzap-mlp"};

/* One kvzap job of scorer v at threshold tau; sinks < 0 leaves sinks out
 * of the spec (the policy's default, 0: protocol 0's specs). */
static struct job *add_job(struct job *jobs, uint32_t *n, const char *wabs,
                           int v, double R, float tau, int sinks)
{
	char s[KVT_SPEC_MAX], tail[32] = "";
	if (sinks >= 0)
		snprintf(tail, sizeof(tail), ",sinks=%d", sinks);
	snprintf(s, sizeof(s), "kvzap:model=%s/%s,threshold=%.4f,window=%u%s",
	         wabs, kvzap_names[v], tau, RECIPE_KVZAP_WINDOW, tail);
	struct job *j = eval_add_job(jobs, n, kvzap_names[v], R, J_DAEMON, s,
	                             NULL, NULL);
	j->tau = tau;
	return j;
}

void kvzap_add_target(struct job *jobs, uint32_t *n, const struct model *M,
                      const char *wabs, int v, const float *s, uint32_t ncal,
                      uint32_t T, uint32_t P, int sinks, double R)
{
	float tau = kvzap_tau(M, s, ncal, T, P, RECIPE_KVZAP_WINDOW,
	                      sinks > 0 ? (uint32_t)sinks : 0, R);
	add_job(jobs, n, wabs, v, R, tau, sinks);
}

void kvzap_add_sweep(struct job *jobs, uint32_t *n, const struct model *M,
                     const char *wabs, int v, const float *s, uint32_t ncal,
                     uint32_t T, uint32_t P, int sinks, uint32_t npts)
{
	float grid[64];
	uint32_t ng = kvzap_sweep_grid(M, kvzap_names[v], s, ncal, T, P,
	                               RECIPE_KVZAP_WINDOW,
	                               sinks > 0 ? (uint32_t)sinks : 0, npts,
	                               SWEEP_ROUND, grid);
	for (uint32_t i = 0; i < ng; i++)
		add_job(jobs, n, wabs, v, 0, grid[i], sinks)->sweep = 1;
}

void eval_put_scores(float *out, const float *y, uint32_t layer,
                     uint32_t nkv, uint32_t T, uint32_t i0, uint32_t n)
{
	for (uint32_t g = 0; g < nkv; g++)
		for (uint32_t i = 0; i < n; i++)
			out[((size_t)layer * nkv + g) * T + i0 + i] =
				y[(size_t)i * nkv + g];
}
