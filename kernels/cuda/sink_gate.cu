/*
 * sink_gate.cu — CUDA twin of sink_gate_cpu; see sink_gate.cuh.
 *
 * The projections of all tokens are two SGEMMs into scratch (queries
 * [n][n_kv][G][dp], keys [n][n_kv][dp]); then one thread per (token, KV
 * head) normalises its key once, and for each of the G query heads
 * normalises the query, takes its logit against the key and the S sinks,
 * and averages the gates.  dp is small (16 in the released checkpoints),
 * so the per-thread loops are short.
 * The batched form (sink_gate_batch_cuda) prefills cq into the queries as
 * sink_gate_cpu's sgemm adds it, and keeps that function's order of
 * operations without fused multiply-adds where the compiler leaves them
 * (the emulator's g++ does), so that the emulator reproduces its bits.
 * Tests: build/bin/kvtrim-cuda-tests sink_gate, backend_scorer.
 */
#include "blas.cuh"
#include "scorer_linear.cuh"
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

/* v = v / sqrt(mean(v^2) + eps) * gamma, sink_gate_cpu's rmsnorm. */
static __device__ inline void sink_gate_rms(float *v, const float *gamma,
                                            uint32_t dp)
{
	float ss = 0.f;
	for (uint32_t d = 0; d < dp; d++)
		ss += v[d] * v[d];
	float inv = 1.f / sqrtf(ss / (float)dp + SG_EPS);
	for (uint32_t d = 0; d < dp; d++)
		v[d] = v[d] * inv * gamma[d];
}

static __device__ inline float sink_gate_dot(const float *a, const float *b,
                                             uint32_t n)
{
	float acc = 0.f;
	for (uint32_t d = 0; d < n; d++)
		acc += a[d] * b[d];
	return acc;
}

static __global__ void sink_gate_batch_kernel(
	const struct blas_seg *__restrict__ seg, uint32_t nseg, uint64_t rows,
	const float *__restrict__ Q, const float *__restrict__ K, uint32_t n_kv,
	uint32_t G, uint32_t dp, uint32_t S, const float *__restrict__ gq,
	const float *__restrict__ gk, const float *__restrict__ sinks,
	const float *__restrict__ bias, uint64_t stride,
	float *__restrict__ score)
{
	uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (x >= rows * n_kv)
		return;
	uint32_t i = (uint32_t)(x / n_kv), g = (uint32_t)(x % n_kv);
	uint64_t lw = seg[blas_seg_find(seg, nseg, i)].layer * stride;
	float kt[SG_MAX_DP], qt[SG_MAX_DP];
	const float *kr = K + ((size_t)i * n_kv + g) * dp;
	for (uint32_t d = 0; d < dp; d++)
		kt[d] = kr[d];
	sink_gate_rms(kt, gk + lw, dp);
	const float inv = 1.f / sqrtf((float)dp);
	const float *sk = sinks + lw + (size_t)g * S * dp;
	double psum = 0.0;
	for (uint32_t j = 0; j < G; j++) {
		const float *qr =
			Q + ((size_t)i * n_kv * G + (size_t)g * G + j) * dp;
		for (uint32_t d = 0; d < dp; d++)
			qt[d] = qr[d];
		sink_gate_rms(qt, gq + lw, dp);
		float l = sink_gate_dot(qt, kt, dp) * inv +
		          bias[lw + (size_t)g * G + j];
		float den = 1.f;
		for (uint32_t si = 0; si < S; si++)
			den += expf(sink_gate_dot(qt, sk + (size_t)si * dp,
			                          dp) * inv - l);
		psum += 1.f / den;
	}
	score[x] = (float)(psum / G);
}

extern "C" int sink_gate_batch_cuda(
	cublasHandle_t h, const struct blas_grouped *g, const float *const *ptr,
	const struct blas_seg *seg, uint32_t nseg, uint64_t rows, uint32_t n_kv,
	uint32_t G, uint32_t dp, uint32_t S, const float *cq, const float *gq,
	const float *gk, const float *sinks, const float *bias, uint64_t stride,
	float *scratch, float *score, cudaStream_t s)
{
	int rv;
	if (!h || !g || !ptr || !n_kv || !G || !dp ||
	    (uint32_t)g->problems != 2 * (uint64_t)nseg)
		return KVT_EINVAL;
	if (dp > SG_MAX_DP)
		return KVT_ENOTSUP;
	if (!rows)
		return 0;
	if (!cq || !gq || !gk || (S && !sinks) || !bias || !scratch || !score)
		return KVT_EINVAL;
	uint64_t qcols = (uint64_t)n_kv * G * dp, kcols = (uint64_t)n_kv * dp;
	if (qcols > INT32_MAX)
		return KVT_EINVAL;
	const size_t P = 2 * (size_t)nseg;
	float *Q = scratch, *K = scratch + rows * qcols;
	if ((rv = scorer_rows_init_cuda(seg, nseg, rows, Q, (uint32_t)qcols, cq,
	                                0, K, (uint32_t)kcols, NULL, stride,
	                                s)) ||
	    (rv = blas_grouped_run(h, g, ptr, ptr + P,
	                           (float *const *)(ptr + 2 * P), s)))
		return rv;
	uint64_t total = rows * n_kv;
	KVT_LAUNCH(sink_gate_batch_kernel, common_cdiv(total, 128), 128, 0, s,
	           seg, nseg, rows, Q, K, n_kv, G, dp, S, gq, gk, sinks, bias,
	           stride, score);
	COMMON_LAUNCHED();
	return 0;
}
