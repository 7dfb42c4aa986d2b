/*
 * compact.c — CPU reference of list compaction; see compact.h.
 *
 * Two pointers: the holes below new_len are visited in ascending order and
 * each is filled with the next kept entry at or above new_len, also in
 * ascending order.  The number of holes below new_len always equals the
 * number of kept entries at or above it, so both scans end together.
 */
#include "compact.h"

#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

uint32_t compact_plan(const uint8_t *drop, uint32_t len, uint32_t *moves,
                      uint32_t *new_len)
{
	uint32_t kept = 0;
	for (uint32_t i = 0; i < len; i++)
		kept += !drop[i];
	*new_len = kept;

	/* Holes below kept and kept entries at or above it are equal in
	 * number; pair them both in ascending order, so that source and
	 * destination each walk forward through their pages (the hardware
	 * prefetcher follows forward streams within a page). */
	uint32_t n = 0, src = kept;
	for (uint32_t dst = 0; dst < kept; dst++) {
		if (!drop[dst])
			continue;
		while (drop[src])
			src++;
		moves[2 * n] = dst;
		moves[2 * n + 1] = src++;
		n++;
	}
	return n;
}

uint32_t compact_plan_drops(const uint32_t *d, uint32_t n_drop, uint32_t len,
                            uint32_t *moves, uint32_t *new_len)
{
	const uint32_t kept = len - n_drop;
	*new_len = kept;
	/* holes: d[0 .. h) below kept; the drops at or above it, d[h ..),
	 * are skipped by the source walk, which starts at kept */
	uint32_t h = 0;
	while (h < n_drop && d[h] < kept)
		h++;
	uint32_t src = kept, j = h;
	for (uint32_t k = 0; k < h; k++) {
		while (j < n_drop && d[j] == src) {
			src++;
			j++;
		}
		moves[2 * k] = d[k];
		moves[2 * k + 1] = src++;
	}
	return h;
}

/* Rows a move reads or writes are scattered over pages that sit anywhere
 * in the pool, where the hardware prefetcher does not follow; prefetching
 * a few moves ahead keeps several cache misses in flight, which is what
 * lets a gather approach memcpy speed. */
#define COMPACT_AHEAD 8u
#define COMPACT_LINE 64u

/* Entry e's row: page e / page_tokens, row e % page_tokens.  Page sizes
 * are powers of two in practice; shift then replaces two divisions per
 * row, which otherwise cost as much as the copy of a small row. */
struct rowmap {
	void *const *pages;
	uint32_t page_tokens, row_bytes, shift; /* shift: log2, or 32 */
};

static inline char *row_ptr(const struct rowmap *m, uint32_t e)
{
	uint32_t pg, r;
	if (m->shift < 32) {
		pg = e >> m->shift;
		r = e & (m->page_tokens - 1);
	} else {
		pg = e / m->page_tokens;
		r = e % m->page_tokens;
	}
	return (char *)m->pages[pg] + (size_t)r * m->row_bytes;
}

static inline void prefetch_row(const char *p, size_t v_off,
                                uint32_t row_bytes, int write)
{
	for (uint32_t o = 0; o < row_bytes; o += COMPACT_LINE) {
		if (write) {
			__builtin_prefetch(p + o, 1, 0);
			__builtin_prefetch(p + v_off + o, 1, 0);
		} else {
			__builtin_prefetch(p + o, 0, 0);
			__builtin_prefetch(p + v_off + o, 0, 0);
		}
	}
}

/*
 * Large compactions move more than the caches hold, and an ordinary store
 * first reads the destination line (read-for-ownership): three memory
 * streams per copied byte where memcpy of a large block, which streams its
 * stores, has two.  Streaming stores of whole rows remove that read.  Small
 * compactions (a decode step evicts a handful of rows) keep ordinary
 * stores so that the rows stay cached for the engine's next attention.
 */
#define COMPACT_STREAM_MIN_BYTES (4u << 20)

static inline void copy_row_stream(char *dst, const char *src,
                                   uint32_t row_bytes)
{
#ifdef __SSE2__
	for (uint32_t o = 0; o < row_bytes; o += 16)
		_mm_stream_si128((__m128i *)(void *)(dst + o),
		                 _mm_loadu_si128((const __m128i *)(const void *)
		                                         (src + o)));
#else
	memcpy(dst, src, row_bytes);
#endif
}

void compact_cpu(void *const *pages, uint32_t page_tokens, uint32_t row_bytes,
                 const uint32_t *moves, uint32_t n_moves)
{
	size_t v_off = (size_t)page_tokens * row_bytes;
	struct rowmap rm = {pages, page_tokens, row_bytes, 32};
	/* Streaming needs 16-byte aligned rows of whole 16-byte units; pages
	 * are page-aligned in the pool, so row_bytes decides. */
	int stream = row_bytes % 16 == 0 &&
	             (uint64_t)n_moves * 2 * row_bytes >= COMPACT_STREAM_MIN_BYTES;
	if ((page_tokens & (page_tokens - 1)) == 0)
		rm.shift = (uint32_t)__builtin_ctz(page_tokens);
	for (uint32_t m = 0; m < n_moves; m++) {
		if (m + COMPACT_AHEAD < n_moves) {
			const uint32_t *a = &moves[2 * (m + COMPACT_AHEAD)];
			prefetch_row(row_ptr(&rm, a[1]), v_off, row_bytes, 0);
			prefetch_row(row_ptr(&rm, a[0]), v_off, row_bytes, 1);
		}
		char *dp = row_ptr(&rm, moves[2 * m]);
		const char *sp = row_ptr(&rm, moves[2 * m + 1]);
		if (stream) {
			copy_row_stream(dp, sp, row_bytes);                 /* K */
			copy_row_stream(dp + v_off, sp + v_off, row_bytes); /* V */
		} else {
			memcpy(dp, sp, row_bytes);                 /* K */
			memcpy(dp + v_off, sp + v_off, row_bytes); /* V */
		}
	}
#ifdef __SSE2__
	if (stream)
		_mm_sfence(); /* streamed rows are visible before we return */
#endif
}
