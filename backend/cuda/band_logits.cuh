/*
 * band_logits.cuh — the logits of the device selections that read
 * attention (the policies' rules policies/h2o.cu, tova.cu, kvpop.cu, and
 * window_select.cu): logit[r][i] = dot(q_r, k_i) * scale in
 * attn_dot_cpu's fixed order (common_dot_rn), which the cpu policies'
 * attn_band_cpu computes too, so both backends keep the same entries bit
 * for bit, whatever a GEMM library would sum in.  Internal to
 * libkvtrim-cuda.so; each file includes its own static copy.
 */
#ifndef KVT_CUDA_BAND_LOGITS_CUH
#define KVT_CUDA_BAND_LOGITS_CUH

#include "backend_cuda.cuh"
#include "common.cuh"

#define BC_BAND_THREADS 256

/* The logit of query row q (float) and key row k (the pages' dtype):
 * common_dot_rn over k converted, times scale; NaN for a missing row. */
template <typename T>
static __device__ __forceinline__ float
bc_band_logit(const float *q, const T *k, uint32_t hd, float scale)
{
	if (!k)
		return nanf("");
	float acc = 0.0f;
	for (uint32_t d = 0; d < hd; d++)
		acc = __fadd_rn(acc, __fmul_rn(q[d], common_to_f(k[d])));
	return __fmul_rn(acc, scale);
}

/* One thread per logit: keys [L][hd], q [R][hd], logit [R][L]. */
static __global__ void bc_band_logits_k(const float *keys, const float *q,
                                        uint32_t R, uint32_t L, uint32_t hd,
                                        float scale, float *logit)
{
	const uint64_t n = (uint64_t)R * L;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t r = (uint32_t)(e / L), i = (uint32_t)(e % L);
		logit[e] = __fmul_rn(common_dot_rn(q + (uint64_t)r * hd, 1,
		                                   keys + (uint64_t)i * hd, 1,
		                                   hd),
		                     scale);
	}
}

/* Queues the R x L logits on s; 0 or the launch error (noted as op). */
static inline int bc_band_logits(const char *op, const float *keys,
                                 const float *q, uint32_t R, uint32_t L,
                                 uint32_t hd, float scale, float *logit,
                                 cudaStream_t s)
{
	const uint64_t n = (uint64_t)R * L;
	if (!n)
		return 0;
	uint64_t b = (n + BC_BAND_THREADS - 1) / BC_BAND_THREADS;
	KVT_LAUNCH(bc_band_logits_k, (uint32_t)(b > 4096 ? 4096 : b),
	           BC_BAND_THREADS, 0, s, keys, q, R, L, hd, scale, logit);
	BC_CALL(cudaGetLastError(), op);
	return 0;
}

#endif
