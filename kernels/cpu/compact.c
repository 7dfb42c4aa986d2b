/*
 * compact.c — CPU reference of list compaction; see compact.h.
 *
 * Two pointers: the holes below new_len are visited in ascending order and
 * each is filled with the next kept entry found scanning down from the end
 * of the list.  The number of holes below new_len always equals the number
 * of kept entries at or above it, so the two scans meet exactly.
 */
#include "compact.h"

#include <string.h>

uint32_t compact_plan(const uint8_t *drop, uint32_t len, uint32_t *moves,
                      uint32_t *new_len)
{
	uint32_t kept = 0;
	for (uint32_t i = 0; i < len; i++)
		kept += !drop[i];
	*new_len = kept;

	uint32_t n = 0;
	uint32_t src = len; /* next candidate is src - 1 */
	for (uint32_t dst = 0; dst < kept; dst++) {
		if (!drop[dst])
			continue;
		do
			src--;
		while (drop[src]);
		/* src >= kept: the holes below kept are balanced by kept
		 * entries above it, and dst < kept <= src holds throughout. */
		moves[2 * n] = dst;
		moves[2 * n + 1] = src;
		n++;
	}
	return n;
}

void compact_cpu(void *const *pages, uint32_t page_tokens, uint32_t row_bytes,
                 const uint32_t *moves, uint32_t n_moves)
{
	size_t v_off = (size_t)page_tokens * row_bytes;
	for (uint32_t m = 0; m < n_moves; m++) {
		uint32_t d = moves[2 * m], s = moves[2 * m + 1];
		char *dp = (char *)pages[d / page_tokens] +
		           (size_t)(d % page_tokens) * row_bytes;
		const char *sp = (const char *)pages[s / page_tokens] +
		                 (size_t)(s % page_tokens) * row_bytes;
		memcpy(dp, sp, row_bytes);                 /* K */
		memcpy(dp + v_off, sp + v_off, row_bytes); /* V */
	}
}
