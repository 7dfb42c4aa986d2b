/*
 * compact.cu — CUDA twin of compact_cpu; see compact.cuh.
 *
 * The copy is flattened into units of W bytes (16 when rows allow it): a
 * move is 2 * row_bytes / W units (its K row, then its V row) and thread x
 * copies unit x % upm of move x / upm.  Consecutive threads copy
 * consecutive bytes of a row, so every row moves in coalesced 16-byte
 * accesses, and short rows do not leave lanes idle as a warp-per-move
 * scheme would.  Loads use the non-coherent path with evict-first hints:
 * each byte is read once.
 * Test: build/bin/kvtrim-cuda-tests compact; bench: kvtrim-cuda-bench.
 */
#include "common.cuh"
#include "compact.cuh"

template <typename V> __device__ __forceinline__ V compact_ld(const V *p)
{
	return __ldcs(p);
}
template <> __device__ __forceinline__ uint16_t compact_ld(const uint16_t *p)
{
	return *p;
}
template <> __device__ __forceinline__ uint8_t compact_ld(const uint8_t *p)
{
	return *p;
}

template <typename V, int MS>
static __global__ void compact_kernel(void *const *pages, uint32_t page_tokens,
                                      uint32_t shift, uint32_t row_bytes,
                                      const uint32_t *__restrict__ moves,
                                      uint64_t total, uint32_t upr)
{
	/* upr: units per row; a move is 2 * upr units (K row, V row). */
	size_t v_off = (size_t)page_tokens * row_bytes;
	uint32_t upm = 2 * upr;
	for (uint64_t x = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     x < total; x += (uint64_t)gridDim.x * blockDim.x) {
		/* 64-bit division is a long instruction sequence; plans
		 * under 2^32 units (all real ones) divide in 32 bits. */
		uint64_t m = total <= UINT32_MAX ? (uint32_t)x / upm : x / upm;
		uint32_t u = (uint32_t)(x - m * upm);
		const uint32_t *mv = moves + m * MS;
		void *const *pl = MS == 3 ? pages + mv[2] : pages;
		size_t off = u < upr ? (size_t)u * sizeof(V)
		                     : v_off + (size_t)(u - upr) * sizeof(V);
		const char *src = common_row(pl, mv[1], page_tokens, shift,
		                             row_bytes) + off;
		char *dst = (char *)common_row(pl, mv[0], page_tokens, shift,
		                               row_bytes) + off;
		*(V *)dst = compact_ld((const V *)src);
	}
}

template <int MS>
static int compact_launch(void *const *pages, uint32_t page_tokens,
                          uint32_t row_bytes, const uint32_t *moves,
                          uint32_t n_moves, cudaStream_t s)
{
	if (!page_tokens || !row_bytes)
		return KVT_EINVAL;
	if (n_moves == 0)
		return 0;
	if (!pages || !moves)
		return KVT_EINVAL;
	uint32_t shift = common_shift(page_tokens);
	unsigned threads = 256;
	int sms = common_sm_count();
	/* Enough blocks to fill the GPU several times over; the grid stride
	 * covers the rest. */
	unsigned cap = (unsigned)(sms > 0 ? sms : 132) * 32;
#define COMPACT_GO(V)                                                          \
	do {                                                                   \
		uint32_t upr = row_bytes / (uint32_t)sizeof(V);                \
		uint64_t total = (uint64_t)n_moves * 2 * upr;                  \
		unsigned blocks = common_cdiv(total, threads);                 \
		if (blocks > cap)                                              \
			blocks = cap;                                          \
		KVT_LAUNCH((compact_kernel<V, MS>), blocks, threads, 0, s,     \
		           pages, page_tokens, shift, row_bytes, moves, total, \
		           upr);                                               \
	} while (0)
	if (row_bytes % 16 == 0)
		COMPACT_GO(uint4);
	else if (row_bytes % 4 == 0)
		COMPACT_GO(uint32_t);
	else if (row_bytes % 2 == 0)
		COMPACT_GO(uint16_t);
	else
		COMPACT_GO(uint8_t);
#undef COMPACT_GO
	COMMON_LAUNCHED();
	return 0;
}

extern "C" int compact_cuda(void *const *pages, uint32_t page_tokens,
                            uint32_t row_bytes, const uint32_t *moves,
                            uint32_t n_moves, cudaStream_t s)
{
	return compact_launch<2>(pages, page_tokens, row_bytes, moves, n_moves,
	                         s);
}

extern "C" int compact_batch_cuda(void *const *pages, uint32_t page_tokens,
                                  uint32_t row_bytes, const uint32_t *moves,
                                  uint32_t n_moves, cudaStream_t s)
{
	return compact_launch<3>(pages, page_tokens, row_bytes, moves, n_moves,
	                         s);
}
