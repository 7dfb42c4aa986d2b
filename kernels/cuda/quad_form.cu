/*
 * quad_form.cu — CUDA twin of quad_form_cpu; see quad_form.cuh.
 *
 * One thread a key, common_quad_rn's order (the one Expected Attention's
 * device rule computes per entry and query head, policies/
 * expected_attention.cu): every thread of a warp reads the same S row
 * at once.  Test: build/bin/kvtrim-cuda-tests quad_form
 */
#include "common.cuh"
#include "quad_form.cuh"

static __global__ void __launch_bounds__(256)
quad_form_kernel(const float *__restrict__ k, uint32_t n, uint32_t hd,
                 const float *__restrict__ S, double *__restrict__ out)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < n; i += (uint64_t)gridDim.x * blockDim.x)
		out[i] = common_quad_rn(k + i * hd, S, hd);
}

extern "C" int quad_form_cuda(const float *k, uint32_t n, uint32_t hd,
                              const float *S, double *out, cudaStream_t s)
{
	if (!n)
		return 0;
	if (!k || !S || !out)
		return KVT_EINVAL;
	unsigned blocks = common_cdiv(n, 256);
	KVT_LAUNCH(quad_form_kernel, blocks > 4096 ? 4096 : blocks, 256, 0, s,
	           k, n, hd, S, out);
	COMMON_LAUNCHED();
	return 0;
}
