/*
 * attn_band.cu — CUDA twin of attn_band_cpu; see attn_band.cuh.
 *
 * A tiled product of the query rows (r = t * G + g) with the keys, both
 * staged through shared memory 32 dimensions at a time; keys are gathered
 * from their pages and converted to float on the way in.  Each of the 256
 * threads owns 2 x 2 outputs of a 32 x 32 tile, summing over d in
 * attn_dot_cpu's order (the tiles in order, never fused), and applies the
 * causal mask and exp(. - lse) on the way out, so no dense score map is
 * ever stored apart from w itself.
 * Test: build/bin/kvtrim-cuda-tests attn_band
 */
#include "attn_band.cuh"
#include "common.cuh"

#define AB_T 32

template <typename T>
static __global__ void __launch_bounds__(256)
attn_band_kernel(const float *__restrict__ q, const float *__restrict__ lse,
                 const uint32_t *__restrict__ qpos, uint32_t R, uint32_t G,
                 void *const *pages, uint32_t page_tokens, uint32_t shift,
                 uint32_t hd, const uint32_t *__restrict__ kpos, uint32_t len,
                 float scale, float *__restrict__ w)
{
	__shared__ float qs[AB_T][AB_T + 1], ks[AB_T][AB_T + 1];
	const uint32_t r0 = blockIdx.y * AB_T, i0 = blockIdx.x * AB_T;
	const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
	const uint32_t row_bytes = hd * (uint32_t)sizeof(T);
	float c[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
	for (uint32_t d0 = 0; d0 < hd; d0 += AB_T) {
		for (uint32_t idx = threadIdx.x; idx < AB_T * AB_T; idx += 256) {
			uint32_t rr = idx / AB_T, dd = idx % AB_T, d = d0 + dd;
			uint32_t r = r0 + rr, i = i0 + rr;
			qs[rr][dd] = r < R && d < hd ? q[(size_t)r * hd + d] : 0.f;
			float kv = 0.f;
			if (i < len && d < hd)
				kv = common_to_f(((const T *)common_row(
					pages, i, page_tokens, shift, row_bytes))[d]);
			ks[rr][dd] = kv;
		}
		__syncthreads();
#pragma unroll 8
		for (int dd = 0; dd < AB_T; dd++) {
			float a0 = qs[ty][dd], a1 = qs[ty + 16][dd];
			float b0 = ks[tx][dd], b1 = ks[tx + 16][dd];
			c[0][0] = __fadd_rn(c[0][0], __fmul_rn(a0, b0));
			c[0][1] = __fadd_rn(c[0][1], __fmul_rn(a0, b1));
			c[1][0] = __fadd_rn(c[1][0], __fmul_rn(a1, b0));
			c[1][1] = __fadd_rn(c[1][1], __fmul_rn(a1, b1));
		}
		__syncthreads();
	}
#pragma unroll
	for (int a = 0; a < 2; a++)
#pragma unroll
		for (int b = 0; b < 2; b++) {
			uint32_t r = r0 + ty + 16 * a, i = i0 + tx + 16 * b;
			if (r >= R || i >= len)
				continue;
			uint32_t t = r / G;
			w[(size_t)r * len + i] =
				kpos[i] <= qpos[t] ? expf(__fmul_rn(c[a][b], scale) - lse[r])
				                   : 0.f;
		}
}

extern "C" int attn_band_cuda(const float *q, const float *lse,
                              const uint32_t *qpos, uint32_t n_q, uint32_t G,
                              void *const *pages, uint32_t page_tokens,
                              uint32_t head_dim, enum kvt_dtype dt,
                              const uint32_t *kpos, uint32_t len, float scale,
                              float *w, float *kscratch, cudaStream_t s)
{
	(void)kscratch;
	if (!G || !page_tokens || !head_dim || !common_dt_size(dt))
		return KVT_EINVAL;
	uint64_t R = (uint64_t)n_q * G;
	if (R == 0 || len == 0)
		return 0;
	if (!q || !lse || !qpos || !pages || !kpos || !w)
		return KVT_EINVAL;
	if (common_cdiv(R, AB_T) > 65535)
		return KVT_EINVAL;
	dim3 grid(common_cdiv(len, AB_T), common_cdiv(R, AB_T));
	uint32_t shift = common_shift(page_tokens);
	COMMON_DISPATCH_DT(dt, T,
		KVT_LAUNCH(attn_band_kernel<T>, grid, 256, 0, s, q, lse,
		           qpos, (uint32_t)R, G, pages, page_tokens, shift,
		           head_dim, kpos, len, scale, w));
	COMMON_LAUNCHED();
	return 0;
}
