/*
 * select_threshold.cu — CUDA twin of select_threshold_cpu; see
 * select_threshold.cuh.  One thread per entry; the count is summed per
 * warp and added with one atomic per warp.
 * Test: build/bin/kvtrim-cuda-tests select_threshold
 */
#include "common.cuh"
#include "select_threshold.cuh"

static __global__ void select_threshold_kernel(const float *__restrict__ score,
                                               const uint8_t *__restrict__ protect,
                                               uint32_t n, float tau,
                                               uint8_t *__restrict__ drop,
                                               uint32_t *n_dropped)
{
	for (uint32_t base = blockIdx.x * blockDim.x; base < n;
	     base += gridDim.x * blockDim.x) {
		uint32_t i = base + threadIdx.x;
		int d = 0;
		if (i < n) {
			float sc = score[i];
			d = !(protect && protect[i]) && !(sc >= tau);
			drop[i] = (uint8_t)d;
		}
		if (n_dropped) {
			unsigned b = __ballot_sync(0xffffffffu, d);
			if ((threadIdx.x & 31) == 0 && b)
				atomicAdd(n_dropped, (uint32_t)__popc(b));
		}
	}
}

extern "C" int select_threshold_cuda(const float *score, const uint8_t *protect,
                                     uint32_t n, float tau, uint8_t *drop,
                                     uint32_t *n_dropped, cudaStream_t s)
{
	if (n_dropped)
		COMMON_CALL(cudaMemsetAsync(n_dropped, 0, sizeof(uint32_t), s));
	if (n == 0)
		return 0;
	if (!score || !drop)
		return KVT_EINVAL;
	unsigned blocks = common_cdiv(n, 256);
	if (blocks > 4096)
		blocks = 4096;
	KVT_LAUNCH(select_threshold_kernel, blocks, 256, 0, s, score, protect,
	           n, tau, drop, n_dropped);
	COMMON_LAUNCHED();
	return 0;
}
