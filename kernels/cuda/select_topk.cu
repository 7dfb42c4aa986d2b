/*
 * select_topk.cu — exact top-k selection per list; see select_topk.cuh.
 *
 * Key of a candidate: the score mapped to an order-preserving uint32 (NaN
 * to 0, below -inf; -0 to +0 so that they tie as floats do) in the high
 * half, rank in the low half.  Eight radix passes of 8 bits find the k-th
 * largest key T (a block histogram per pass, a warp scan picks the digit),
 * then one pass marks candidates with key < T, and of the keys == T keeps
 * only as many as are still wanted, highest indices first like the CPU's
 * order (a block scan in index order).  rank NULL ranks by the index in
 * the list.  Each pass reads the list once; lists of a few thousand
 * entries stay in L1/L2 across passes.  A block has st_threads(longest
 * list) threads, a power of two from a warp to ST_MAX_THREADS: every
 * pass ends in block-wide barriers, so a short list in a wide block
 * would leave most of its threads waiting at them.
 * Test: build/bin/kvtrim-cuda-tests select_topk
 */
#include "common.cuh"
#include "select_topk.cuh"

#define ST_MAX_THREADS 1024
#define ST_MAX_WARPS (ST_MAX_THREADS / 32)

/* The threads of a block for lists of at most n entries: the power of
 * two from 32 to ST_MAX_THREADS that gives every thread one entry (a
 * longer list is still selected right; each thread takes more). */
static unsigned st_threads(uint32_t n)
{
	unsigned t = 32;
	while (t < ST_MAX_THREADS && t < n)
		t <<= 1;
	return t;
}

__device__ __forceinline__ uint64_t st_key(float sc, uint32_t rank)
{
	uint32_t u;
	if (isnan(sc)) {
		u = 0;
	} else {
		if (sc == 0.f)
			sc = 0.f; /* -0 -> +0 */
		u = __float_as_uint(sc);
		u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	}
	return (uint64_t)u << 32 | rank;
}

/* Inclusive prefix sum of x over the warp in lane order.  Every lane of
 * the warp must call it. */
__device__ __forceinline__ uint32_t st_warp_scan(uint32_t x, int lane)
{
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
		if (lane >= o)
			x += y;
	}
	return x;
}

/* Exclusive prefix sum of v over the block in thread order; *total gets
 * the block's sum.  Every thread of the block must call it; blockDim.x is
 * a multiple of 32, at most ST_MAX_THREADS. */
__device__ uint32_t st_scan(uint32_t v, uint32_t *total)
{
	__shared__ uint32_t wsum[ST_MAX_WARPS];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int nw = (int)(blockDim.x >> 5);
	uint32_t x = st_warp_scan(v, lane);
	if (lane == 31)
		wsum[warp] = x;
	__syncthreads();
	if (warp == 0) {
		uint32_t w = st_warp_scan(lane < nw ? wsum[lane] : 0, lane);
		if (lane < nw)
			wsum[lane] = w; /* inclusive */
	}
	__syncthreads();
	uint32_t before = (warp ? wsum[warp - 1] : 0) + x - v;
	*total = wsum[nw - 1];
	__syncthreads(); /* wsum is reused by the next call */
	return before;
}

static __global__ void __launch_bounds__(ST_MAX_THREADS)
select_topk_kernel(const float *__restrict__ score,
                   const uint32_t *__restrict__ rank,
                   const uint8_t *__restrict__ protect,
                   const uint32_t *__restrict__ first, uint32_t n1,
                   const uint32_t *__restrict__ ks, uint32_t k1,
                   uint8_t *__restrict__ drop, uint32_t *__restrict__ n_dropped)
{
	__shared__ uint32_t hist[256];
	__shared__ uint32_t sh_want, sh_digit, sh_count;
	const uint32_t list = blockIdx.x;
	const uint32_t off = first ? first[list] : 0;
	const uint32_t n = first ? first[list + 1] - off : n1;
	const uint32_t k = ks ? ks[list] : k1;
	score += off;
	drop += off;
	/* NULL stays NULL: the index in the list ranks, as on the CPU */
	if (rank)
		rank += off;
	if (protect)
		protect += off;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

	uint32_t cand = 0, total;
	for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
		cand += !(protect && protect[i]);
	st_scan(cand, &total);
	if (total <= k) { /* everything stays */
		for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
			drop[i] = 0;
		if (n_dropped && threadIdx.x == 0)
			n_dropped[list] = 0;
		return;
	}

	uint64_t prefix = 0;
	uint32_t want = k;   /* keys >= prefix still to keep */
	uint32_t n_eq = 0;   /* after the last pass: keys equal to T */
	if (k > 0) {
		for (int shift = 56; shift >= 0; shift -= 8) {
			uint64_t hi = shift == 56 ? 0 : ~0ull << (shift + 8);
			for (int b = threadIdx.x; b < 256; b += blockDim.x)
				hist[b] = 0;
			__syncthreads();
			for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
				if (protect && protect[i])
					continue;
				uint64_t key = st_key(score[i], rank ? rank[i] : i);
				if ((key & hi) == prefix)
					atomicAdd(&hist[(key >> shift) & 255], 1u);
			}
			__syncthreads();
			if (warp == 0) {
				/* lane L owns digits 255 - 8L down to 248 - 8L */
				uint32_t c[8], sum = 0;
#pragma unroll
				for (int j = 0; j < 8; j++) {
					c[j] = hist[255 - 8 * lane - j];
					sum += c[j];
				}
				uint32_t inc = st_warp_scan(sum, lane);
				uint32_t exc = inc - sum;
				unsigned hit = __ballot_sync(0xffffffffu,
				                             exc < want && inc >= want);
				if (lane == __ffs(hit) - 1) {
					uint32_t acc = exc;
					for (int j = 0; j < 8; j++) {
						if (acc + c[j] >= want) {
							sh_digit = (uint32_t)(255 - 8 * lane - j);
							sh_want = want - acc;
							sh_count = c[j];
							break;
						}
						acc += c[j];
					}
				}
			}
			__syncthreads();
			prefix |= (uint64_t)sh_digit << shift;
			want = sh_want;
			n_eq = sh_count;
			__syncthreads();
		}
	}

	/* k == 0: drop every candidate (want 0 keeps none equal to the
	 * unreachable threshold ~0). */
	const uint64_t T = k > 0 ? prefix : ~0ull;
	uint32_t base = 0, dropped = 0;
	for (uint32_t c0 = 0; c0 < n; c0 += blockDim.x) {
		uint32_t i = c0 + threadIdx.x;
		int is_cand = 0, eq = 0;
		uint64_t key = 0;
		if (i < n && !(protect && protect[i])) {
			is_cand = 1;
			key = st_key(score[i], rank ? rank[i] : i);
			eq = key == T;
		}
		uint32_t tot;
		uint32_t pos = st_scan((uint32_t)eq, &tot);
		if (i < n) {
			/* of equal keys the highest indices stay, as on
			 * the CPU */
			int keep = !is_cand || (k > 0 && key > T) ||
			           (eq && base + pos >= n_eq - want);
			drop[i] = (uint8_t)!keep;
			dropped += !keep;
		}
		base += tot;
	}
	st_scan(dropped, &total);
	if (n_dropped && threadIdx.x == 0)
		n_dropped[list] = total;
	(void)lane;
}

extern "C" int select_topk_cuda(const float *score, const uint32_t *rank,
                                const uint8_t *protect, uint32_t n,
                                uint32_t k, uint8_t *drop, uint32_t *scratch,
                                uint32_t *n_dropped, cudaStream_t s)
{
	(void)scratch;
	if (n == 0) {
		if (n_dropped)
			COMMON_CALL(cudaMemsetAsync(n_dropped, 0, sizeof(uint32_t),
			                            s));
		return 0;
	}
	if (!score || !drop)
		return KVT_EINVAL;
	KVT_LAUNCH(select_topk_kernel, 1, st_threads(n), 0, s, score, rank,
	           protect, NULL, n, NULL, k, drop, n_dropped);
	COMMON_LAUNCHED();
	return 0;
}

extern "C" int select_topk_batch_cuda(const float *score, const uint32_t *rank,
                                      const uint8_t *protect,
                                      const uint32_t *first, uint32_t n_lists,
                                      uint32_t max_len, const uint32_t *k,
                                      uint8_t *drop,
                                      uint32_t *n_dropped, cudaStream_t s)
{
	if (n_lists == 0)
		return 0;
	if (!score || !first || !k || !drop || n_lists > INT32_MAX)
		return KVT_EINVAL;
	KVT_LAUNCH(select_topk_kernel, n_lists, st_threads(max_len), 0, s,
	           score, rank, protect, first, 0, k, 0, drop, n_dropped);
	COMMON_LAUNCHED();
	return 0;
}
