/*
 * page.h — page arithmetic shared by the daemon, libkvtrim and the engines
 * (header only: each is one multiplication or division, in hot paths).
 *
 * A page holds page_tokens entries of one list:
 *   [K: page_tokens x head_dim][V: page_tokens x head_dim] in the dtype,
 * and a pool chunk (KVT_CHUNK_BYTES) holds pages_per_chunk whole pages:
 * page id p lives in the tenant's chunk slot p / pages_per_chunk, at byte
 * offset (p % pages_per_chunk) * page_bytes (ipc/shm.h, kvtrim.h's
 * kvt_table_view).  No bounds checks: callers check slots and ids.
 */
#ifndef KVT_PAGE_H
#define KVT_PAGE_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of one page of head_dim-wide rows of elem_bytes elements. */
static inline uint64_t page_nbytes(uint32_t page_tokens, uint32_t head_dim,
                                   size_t elem_bytes)
{
	return 2ull * page_tokens * head_dim * elem_bytes;
}

/* The chunk slot page id `page` lives in. */
static inline uint32_t page_chunk(uint32_t page, uint32_t pages_per_chunk)
{
	return page / pages_per_chunk;
}

/* Byte offset of page id `page` in its chunk. */
static inline uint64_t page_offset(uint32_t page, uint32_t pages_per_chunk,
                                   uint64_t page_bytes)
{
	return (uint64_t)(page % pages_per_chunk) * page_bytes;
}

#endif
