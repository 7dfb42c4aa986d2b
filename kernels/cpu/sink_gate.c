/*
 * sink_gate.c — Fast KVzip's low-rank sink-attention gate (CPU reference);
 * see kernels.h and reference/methods.md section 2.  Tested in
 * kernels/cpu/kernels_test.c.
 *
 * Both projections are one sgemm each over the n tokens (Wq is a
 * (n_kv * G * dp) x d_in matrix, Wk (n_kv * dp) x d_in, KV-head-major as
 * the released checkpoints store them); the RMSNorms are applied in place
 * in scratch, then the (1 + S)-way softmax per query head is a few dp-long
 * dot products.  p is computed as 1 / (1 + sum_s exp(ls_s - l)), which
 * saturates to 0 or 1 instead of producing inf / inf.
 */
#include "kernels.h"

#include <math.h>

#define RMS_EPS 1e-6f

/* v = v / sqrt(mean(v^2) + eps) * gamma, as Qwen3RMSNorm in float32. */
static void rmsnorm(float *v, const float *gamma, uint32_t dp)
{
	float ss = 0.0f;
	for (uint32_t d = 0; d < dp; d++)
		ss += v[d] * v[d];
	float inv = 1.0f / sqrtf(ss / (float)dp + RMS_EPS);
	for (uint32_t d = 0; d < dp; d++)
		v[d] = v[d] * inv * gamma[d];
}

static float dot(const float *a, const float *b, uint32_t n)
{
	float acc = 0.0f;
	for (uint32_t d = 0; d < n; d++)
		acc += a[d] * b[d];
	return acc;
}

void sink_gate_cpu(const float *x, uint32_t n, uint32_t d_in, uint32_t n_kv,
                   uint32_t G, uint32_t dp, uint32_t S, const float *Wq,
                   const float *cq, const float *Wk, const float *gq,
                   const float *gk, const float *sinks, const float *bias,
                   float *score, float *scratch)
{
	if (n == 0 || n_kv == 0)
		return;
	uint32_t qw = n_kv * G * dp, kw = n_kv * dp; /* projection widths */
	float *qs = scratch;                  /* [n][n_kv][G][dp] */
	float *ks = scratch + (size_t)n * qw; /* [n][n_kv][dp] */
	float inv_sqrt_dp = 1.0f / sqrtf((float)dp);

	scorer_linear_cpu(x, n, d_in, Wq, cq, qw, qs);
	scorer_linear_cpu(x, n, d_in, Wk, NULL, kw, ks);

	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t g = 0; g < n_kv; g++) {
			float *kt = ks + (size_t)i * kw + (size_t)g * dp;
			const float *sk = sinks + (size_t)g * S * dp;
			rmsnorm(kt, gk, dp);
			double psum = 0.0;
			for (uint32_t j = 0; j < G; j++) {
				float *qt = qs + (size_t)i * qw +
				            ((size_t)g * G + j) * dp;
				rmsnorm(qt, gq, dp);
				float l = dot(qt, kt, dp) * inv_sqrt_dp +
				          bias[(size_t)g * G + j];
				float den = 1.0f;
				for (uint32_t s = 0; s < S; s++)
					den += expf(dot(qt, sk + (size_t)s * dp,
					                dp) * inv_sqrt_dp - l);
				psum += 1.0f / den;
			}
			score[(size_t)i * n_kv + g] = G ? (float)(psum / G)
			                                : 0.0f;
		}
	}
}
