/*
 * pool.h — the daemon's KV memory pool: a fixed number of 2 MiB chunks.
 *
 * CPU backend: each chunk is its own memfd (sealed against resizing) mapped
 * into the daemon; the owning tenant's client maps the same fd.  A chunk
 * belongs to one tenant for its whole life and is destroyed (never
 * recycled) when that tenant no longer needs it, so no one else's memory can
 * ever appear behind a descriptor a client still holds.
 *
 * Threads: loop thread only.
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

#include <stdint.h>

#include "kvtrim.h"

struct pool {
	uint64_t chunk_capacity; /* pool_bytes / KVT_CHUNK_BYTES */
	uint64_t chunks_used;    /* chunks currently created */
	uint64_t chunks_created_total;
	uint64_t chunks_released_total;
};

struct pool_chunk {
	int fd;       /* memfd, sealed F_SEAL_GROW|F_SEAL_SHRINK|F_SEAL_SEAL */
	void *base;   /* [KVT_CHUNK_BYTES] daemon's mapping, read-write */
	uint64_t bytes;
};

/* Sets the capacity; KVT_EINVAL when pool_bytes holds no whole chunk. */
int pool_init(struct pool *p, uint64_t pool_bytes);

/* Creates a zero-filled chunk; KVT_EPOOLFULL at capacity, KVT_ESYS. */
int pool_chunk_new(struct pool *p, struct pool_chunk *out);

/* Unmaps and closes a chunk and returns its capacity.  Safe on a zeroed
 * chunk (fd 0 is never a memfd here: fields are set to -1 / NULL). */
void pool_chunk_free(struct pool *p, struct pool_chunk *c);

/* Bytes of the whole pool. */
uint64_t pool_bytes_total(const struct pool *p);

#endif
