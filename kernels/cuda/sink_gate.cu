/*
 * sink_gate.cu — CUDA twin of sink_gate_cpu; see sink_gate.cuh.
 *
 * The projections of all tokens are two SGEMMs into scratch (queries
 * [n][n_kv][G][dp], keys [n][n_kv][dp]); then one thread per (token, KV
 * head) normalises its key once, and for each of the G query heads
 * normalises the query, takes its logit against the key and the S sinks,
 * and averages the gates.  dp is small (16 in the released checkpoints),
 * so the per-thread loops are short.
 * Test: build/bin/kvtrim-cuda-tests sink_gate
 */
#include "blas.cuh"
#include "sink_gate.cuh"

#define SG_MAX_DP 256
#define SG_EPS 1e-6f

static __global__ void sink_gate_kernel(
	const float *__restrict__ Q, const float *__restrict__ K, uint32_t n,
	uint32_t n_kv, uint32_t G, uint32_t dp, uint32_t S,
	const float *__restrict__ cq, const float *__restrict__ gq,
	const float *__restrict__ gk, const float *__restrict__ sinks,
	const float *__restrict__ bias, float *__restrict__ score)
{
	uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (x >= (uint64_t)n * n_kv)
		return;
	uint32_t i = (uint32_t)(x / n_kv), g = (uint32_t)(x % n_kv);
	float kt[SG_MAX_DP], qt[SG_MAX_DP];
	const float *kr = K + ((size_t)i * n_kv + g) * dp;
	float ss = 0.f;
	for (uint32_t d = 0; d < dp; d++) {
		kt[d] = kr[d];
		ss = fmaf(kt[d], kt[d], ss);
	}
	float rk = rsqrtf(ss / (float)dp + SG_EPS);
	for (uint32_t d = 0; d < dp; d++)
		kt[d] = kt[d] * rk * gk[d];
	float inv = 1.f / sqrtf((float)dp), sum = 0.f;
	for (uint32_t j = 0; j < G; j++) {
		size_t qj = ((size_t)g * G + j) * dp;
		const float *qr = Q + (size_t)i * n_kv * G * dp + qj;
		ss = 0.f;
		for (uint32_t d = 0; d < dp; d++) {
			qt[d] = qr[d] + cq[qj + d];
			ss = fmaf(qt[d], qt[d], ss);
		}
		float rq = rsqrtf(ss / (float)dp + SG_EPS), l = 0.f;
		for (uint32_t d = 0; d < dp; d++) {
			qt[d] = qt[d] * rq * gq[d];
			l = fmaf(qt[d], kt[d], l);
		}
		l = l * inv + bias[(size_t)g * G + j];
		float den = 1.f;
		const float *sk = sinks + (size_t)g * S * dp;
		for (uint32_t si = 0; si < S; si++) {
			float ls = 0.f;
			for (uint32_t d = 0; d < dp; d++)
				ls = fmaf(qt[d], sk[(size_t)si * dp + d], ls);
			den += expf(ls * inv - l);
		}
		sum += 1.f / den;
	}
	score[x] = sum / (float)G;
}

extern "C" int sink_gate_cuda(cublasHandle_t h, const float *x, uint32_t n,
                              uint32_t d_in, uint32_t n_kv, uint32_t G,
                              uint32_t dp, uint32_t S, const float *Wq,
                              const float *cq, const float *Wk,
                              const float *gq, const float *gk,
                              const float *sinks, const float *bias,
                              float *score, float *scratch, cudaStream_t s)
{
	int rv;
	if (!h || !d_in || !n_kv || !G || !dp)
		return KVT_EINVAL;
	if (dp > SG_MAX_DP)
		return KVT_ENOTSUP;
	if (n == 0)
		return 0;
	if (!x || !Wq || !cq || !Wk || !gq || !gk || (S && !sinks) || !bias ||
	    !score || !scratch)
		return KVT_EINVAL;
	uint64_t qcols = (uint64_t)n_kv * G * dp, kcols = (uint64_t)n_kv * dp;
	if (qcols > INT32_MAX)
		return KVT_EINVAL;
	float *Q = scratch, *K = scratch + (size_t)n * qcols;
	if ((rv = blas_xwt(h, x, n, d_in, Wq, (uint32_t)qcols, Q, s)) ||
	    (rv = blas_xwt(h, x, n, d_in, Wk, (uint32_t)kcols, K, s)))
		return rv;
	uint64_t total = (uint64_t)n * n_kv;
	KVT_LAUNCH(sink_gate_kernel, common_cdiv(total, 128), 128, 0, s, Q, K,
	           n, n_kv, G, dp, S, cq, gq, gk, sinks, bias, score);
	COMMON_LAUNCHED();
	return 0;
}
