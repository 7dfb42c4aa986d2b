/*
 * scorer_linear.cu — CUDA twin of scorer_linear_cpu; see scorer_linear.cuh.
 * Test: build/bin/kvtrim-cuda-tests scorer_linear
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
