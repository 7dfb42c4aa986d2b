/*
 * compact.h — compaction of one (sequence, layer, KV head) page list.
 *
 * Attention does not depend on the order of entries (keys are stored after
 * RoPE), so compaction fills each hole below the new length with a kept
 * entry from the tail of the same list.  Its cost is proportional to the
 * number of evicted entries, not to the length of the list.
 */
#ifndef KVT_COMPACT_H
#define KVT_COMPACT_H

#include <stdint.h>

/*
 * Plans compaction of len entries with drop marks (drop[i] != 0 = evict).
 * Writes moves as pairs (dst, src) into moves [len][2] capacity: dst is a
 * dropped index < new_len, src a kept index >= new_len; pairs are ordered
 * by ascending dst and ascending src.  Returns the number of moves; *new_len = kept count.
 */
uint32_t compact_plan(const uint8_t *drop, uint32_t len, uint32_t *moves,
                      uint32_t *new_len);

/*
 * compact_plan from the drops as indices: d [n_drop] ascending, distinct,
 * each < len.  The same moves as compact_plan of the marks they stand for,
 * in time proportional to n_drop (the daemon's lists the device decided
 * come back as indices; their marks would cost a pass over the list).
 */
uint32_t compact_plan_drops(const uint32_t *d, uint32_t n_drop, uint32_t len,
                            uint32_t *moves, uint32_t *new_len);

/*
 * Executes moves on a page list.  pages[i] points at page i of the list,
 * laid out [K: page_tokens][row_bytes][V: page_tokens][row_bytes]; entry e
 * is row e % page_tokens of page e / page_tokens.  Copies K and V rows
 * (row_bytes = head_dim * elem_bytes each) from src to dst.
 */
void compact_cpu(void *const *pages, uint32_t page_tokens, uint32_t row_bytes,
                 const uint32_t *moves, uint32_t n_moves);

#endif
