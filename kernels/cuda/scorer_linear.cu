/*
 * scorer_linear.cu — CUDA twin of scorer_linear_cpu, one job at a time or
 * batched, and the batched scorers' elementwise stage; see
 * scorer_linear.cuh.
 * Tests: build/bin/kvtrim-cuda-tests scorer_linear, backend_scorer.
 */
#include "blas.cuh"
#include "scorer_linear.cuh"

static __global__ void scorer_linear_bias(float *__restrict__ y,
                                          const float *__restrict__ b,
                                          uint64_t total, uint32_t d_out)
{
	for (uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     x < total; x += (uint64_t)gridDim.x * blockDim.x)
		y[x] += b[x % d_out];
}

extern "C" int scorer_linear_cuda(cublasHandle_t h, const float *x,
                                  uint32_t n, uint32_t d_in, const float *W,
                                  const float *b, uint32_t d_out, float *y,
                                  cudaStream_t s)
{
	if (!h || !d_in || !d_out)
		return KVT_EINVAL;
	if (n == 0)
		return 0;
	if (!x || !W || !y)
		return KVT_EINVAL;
	int rv = blas_xwt(h, x, n, d_in, W, d_out, y, s);
	if (rv || !b)
		return rv;
	uint64_t total = (uint64_t)n * d_out;
	unsigned blocks = common_cdiv(total, 256);
	if (blocks > 65535)
		blocks = 65535;
	KVT_LAUNCH(scorer_linear_bias, blocks, 256, 0, s, y, b, total, d_out);
	COMMON_LAUNCHED();
	return 0;
}

static __global__ void scorer_rows_init(const struct blas_seg *__restrict__ seg,
                                        uint32_t nseg, uint64_t rows,
                                        float *__restrict__ a, uint32_t ca,
                                        const float *__restrict__ va,
                                        int gelu, float *__restrict__ b,
                                        uint32_t cb,
                                        const float *__restrict__ vb,
                                        uint64_t stride)
{
	const uint64_t na = rows * ca, total = na + rows * cb;
	for (uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     x < total; x += (uint64_t)gridDim.x * blockDim.x) {
		if (x < na && gelu) { /* scorer_mlp_cpu's expression */
			const float inv_sqrt2 = 0.70710678118654752440f;
			float z = a[x];
			a[x] = 0.5f * z * (1.f + erff(z * inv_sqrt2));
			continue;
		}
		float *d = x < na ? a : b;
		const float *v = x < na ? va : vb;
		uint32_t cols = x < na ? ca : cb;
		uint64_t e = x < na ? x : x - na;
		uint32_t r = (uint32_t)(e / cols), c = (uint32_t)(e % cols);
		uint64_t l = seg[blas_seg_find(seg, nseg, r)].layer;
		d[e] = v ? v[l * stride + c] : 0.f;
	}
}

extern "C" int scorer_rows_init_cuda(const struct blas_seg *seg,
                                     uint32_t nseg, uint64_t rows, float *a,
                                     uint32_t ca, const float *va, int gelu,
                                     float *b, uint32_t cb, const float *vb,
                                     uint64_t stride, cudaStream_t s)
{
	if (!rows)
		return 0;
	if (!seg || !nseg || rows > UINT32_MAX || !a || !ca || (cb && !b))
		return KVT_EINVAL;
	uint64_t total = rows * ((uint64_t)ca + cb);
	unsigned blocks = common_cdiv(total, 256);
	if (blocks > 65535)
		blocks = 65535;
	KVT_LAUNCH(scorer_rows_init, blocks, 256, 0, s, seg, nseg, rows, a, ca,
	           va, gelu, b, cb, vb, stride);
	COMMON_LAUNCHED();
	return 0;
}

extern "C" int scorer_linear_batch_cuda(cublasHandle_t h,
                                        const struct blas_grouped *g,
                                        const float *const *ptr,
                                        const struct blas_seg *seg,
                                        uint32_t nseg, uint64_t rows,
                                        const float *b, uint64_t stride,
                                        uint32_t d_out, float *y,
                                        cudaStream_t s)
{
	int rv;
	if (!h || !g || !ptr || (uint32_t)g->problems != nseg)
		return KVT_EINVAL;
	if ((rv = scorer_rows_init_cuda(seg, nseg, rows, y, d_out, b, 0, NULL,
	                                0, NULL, stride, s)))
		return rv;
	return blas_grouped_run(h, g, ptr, ptr + nseg,
	                        (float *const *)(ptr + 2 * (size_t)nseg), s);
}
