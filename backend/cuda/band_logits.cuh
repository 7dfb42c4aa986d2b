/*
 * band_logits.cuh — the logits of the device selections that read
 * attention (the policies' rules policies/h2o.cu, tova.cu, kvpop.cu and
 * snapkv.cu): logit[r][i] = dot(q_r, k_i) * scale in
 * attn_dot_cpu's fixed order (as common_dot_rn), which the cpu policies'
 * attn_band_cpu computes too, so both backends keep the same entries bit
 * for bit, whatever a GEMM library would sum in; and the weight
 * exp(logit - lse) they sum.  Internal to
 * libkvtrim-cuda.so; each file includes its own static copy.
 */
#ifndef KVT_CUDA_BAND_LOGITS_CUH
#define KVT_CUDA_BAND_LOGITS_CUH

#include "backend_cuda.cuh"
#include "common.cuh"

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

/* The attention weight exp(logit - lse) of key row k (NULL: missing, NaN)
 * for query head qh of the staged row row (rows: where its q heads of hd
 * floats and its lse are), the term the rules sum. */
template <typename T>
static __device__ __forceinline__ float
bc_band_weight(const float *row, const kvt_backend_rows &rows, uint32_t qh,
               const T *k, uint32_t hd, float scale)
{
	return expf(bc_band_logit(row + rows.q_off + (uint64_t)qh * hd, k, hd,
	                          scale) -
	            row[rows.lse_off + qh]);
}

#endif
