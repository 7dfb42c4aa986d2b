/*
 * append_kv.cu — CUDA twin of append_kv_cpu; see append_kv.cuh.
 *
 * One thread per element: thread (i, d) writes K and V element d of entry
 * first + i.  Consecutive threads write consecutive elements of one row,
 * so the stores coalesce whatever the dtype.
 * Test: build/bin/kvtrim-cuda-tests append_kv
 */
#include "append_kv.cuh"
#include "common.cuh"

template <typename T>
static __global__ void append_kv_kernel(void *const *pages,
                                        uint32_t page_tokens, uint32_t shift,
                                        uint32_t head_dim, uint32_t first,
                                        const float *__restrict__ k,
                                        const float *__restrict__ v,
                                        uint64_t total /* n * head_dim */)
{
	uint32_t row_bytes = head_dim * (uint32_t)sizeof(T);
	size_t v_off = (size_t)page_tokens * row_bytes;
	for (uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     x < total; x += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t i = (uint32_t)(x / head_dim), d = (uint32_t)(x % head_dim);
		char *row = (char *)common_row(pages, first + i, page_tokens,
		                               shift, row_bytes);
		((T *)row)[d] = common_from_f<T>(k[x]);
		((T *)(row + v_off))[d] = common_from_f<T>(v[x]);
	}
}

extern "C" int append_kv_cuda(void *const *pages, uint32_t page_tokens,
                              uint32_t head_dim, enum kvt_dtype dt,
                              uint32_t first, const float *k, const float *v,
                              uint32_t n, cudaStream_t s)
{
	if (!page_tokens || !head_dim || common_dt_size(dt) == 0)
		return KVT_EINVAL;
	if (n == 0)
		return 0;
	if (!pages || !k || !v || (uint64_t)first + n > UINT32_MAX)
		return KVT_EINVAL;
	uint64_t total = (uint64_t)n * head_dim;
	unsigned threads = 256;
	unsigned blocks = common_cdiv(total, threads);
	if (blocks > 65535u * 4)
		blocks = 65535u * 4; /* grid-stride beyond */
	uint32_t shift = common_shift(page_tokens);
	COMMON_DISPATCH_DT(dt, T,
		KVT_LAUNCH(append_kv_kernel<T>, blocks, threads, 0, s,
		           pages, page_tokens, shift, head_dim, first, k, v,
		           total));
	COMMON_LAUNCHED();
	return 0;
}
