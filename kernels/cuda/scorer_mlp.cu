/*
 * scorer_mlp.cu — CUDA twin of scorer_mlp_cpu, one job at a time or
 * batched; see scorer_mlp.cuh.
 * Tests: build/bin/kvtrim-cuda-tests scorer_mlp, backend_scorer;
 * bench: kvtrim-cuda-bench (kvzap_mlp_tokens_per_s).
 */
#include "blas.cuh"
#include "scorer_linear.cuh"
#include "scorer_mlp.cuh"

/* v = act(v + b[col]); act = exact erf GELU when gelu, identity otherwise.
 * b may be NULL. */
static __global__ void scorer_mlp_bias_act(float *__restrict__ v,
                                           const float *__restrict__ b,
                                           uint64_t total, uint32_t cols,
                                           int gelu)
{
	for (uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     x < total; x += (uint64_t)gridDim.x * blockDim.x) {
		float z = v[x] + (b ? b[x % cols] : 0.f);
		if (gelu)
			z = 0.5f * z * (1.f + erff(z * 0.70710678118654752f));
		v[x] = z;
	}
}

static int scorer_mlp_epilogue(float *v, const float *b, uint32_t n,
                               uint32_t cols, int gelu, cudaStream_t s)
{
	uint64_t total = (uint64_t)n * cols;
	unsigned blocks = common_cdiv(total, 256);
	if (blocks > 65535)
		blocks = 65535;
	KVT_LAUNCH(scorer_mlp_bias_act, blocks, 256, 0, s, v, b, total, cols,
	           gelu);
	COMMON_LAUNCHED();
	return 0;
}

extern "C" int scorer_mlp_cuda(cublasHandle_t h, const float *x, uint32_t n,
                               uint32_t d_in, const float *W1,
                               const float *b1, uint32_t hidden,
                               const float *W2, const float *b2,
                               uint32_t d_out, float *y, float *hscratch,
                               cudaStream_t s)
{
	int rv;
	if (!h || !d_in || !hidden || !d_out)
		return KVT_EINVAL;
	if (n == 0)
		return 0;
	if (!x || !W1 || !W2 || !y || !hscratch)
		return KVT_EINVAL;
	if ((rv = blas_xwt(h, x, n, d_in, W1, hidden, hscratch, s)) ||
	    (rv = scorer_mlp_epilogue(hscratch, b1, n, hidden, 1, s)) ||
	    (rv = blas_xwt(h, hscratch, n, hidden, W2, d_out, y, s)))
		return rv;
	if (b2)
		return scorer_mlp_epilogue(y, b2, n, d_out, 0, s);
	return 0;
}

extern "C" int scorer_mlp_batch_cuda(cublasHandle_t h,
                                     const struct blas_grouped *g1,
                                     const struct blas_grouped *g2,
                                     const float *const *ptr,
                                     const struct blas_seg *seg,
                                     uint32_t nseg, uint64_t rows,
                                     const float *b1, uint32_t hidden,
                                     const float *b2, uint32_t d_out,
                                     uint64_t stride, float *hscratch,
                                     float *y, cudaStream_t s)
{
	int rv;
	const size_t P = nseg;
	if (!h || !g1 || !g2 || !ptr || (uint32_t)g1->problems != nseg ||
	    (uint32_t)g2->problems != nseg)
		return KVT_EINVAL;
	if ((rv = scorer_rows_init_cuda(seg, nseg, rows, hscratch, hidden, b1,
	                                0, NULL, 0, NULL, stride, s)) ||
	    (rv = blas_grouped_run(h, g1, ptr, ptr + P,
	                           (float *const *)(ptr + 2 * P), s)) ||
	    (rv = scorer_rows_init_cuda(seg, nseg, rows, hscratch, hidden,
	                                NULL, 1, y, d_out, b2, stride, s)))
		return rv;
	return blas_grouped_run(h, g2, ptr + 3 * P, ptr + 4 * P,
	                        (float *const *)(ptr + 5 * P), s);
}
