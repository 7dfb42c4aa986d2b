/*
 * pool.h — the daemon's KV memory pool: a fixed number of 2 MiB chunks.
 *
 * Chunks come from a backend (backend.h; cpu unless pool_set_backend says
 * otherwise).  CPU backend: each chunk is its own memfd (sealed against
 * resizing) mapped into the daemon; the owning tenant's client maps the
 * same fd.  CUDA backend: a VMM allocation exported as a POSIX fd (or a
 * legacy IPC handle in ipc[]), base a device address.  A chunk
 * belongs to one tenant for its whole life and is destroyed (never
 * recycled) when that tenant no longer needs it, so no one else's memory can
 * ever appear behind a descriptor a client still holds.
 *
 * Threads: pool_chunk_new and pool_chunk_free may run on several threads
 * at once (the loop, and syncs on worker threads); the counters are
 * atomic, read them with pool_chunks_used (or __atomic loads).  The rest
 * is set up once by the loop before any tenant exists.
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

#include <stdint.h>

#include "backend.h"
#include "kvtrim.h"

struct pool {
	const struct kvt_backend_ops *ops; /* NULL: backend_cpu */
	void *bctx;                        /* the backend's context */
	uint64_t chunk_capacity; /* pool_bytes / KVT_CHUNK_BYTES */
	uint64_t chunks_used;    /* chunks currently created */
	uint64_t chunks_created_total;
	uint64_t chunks_released_total;
};

struct pool_chunk {
	int fd;       /* memfd, sealed F_SEAL_GROW|F_SEAL_SHRINK|F_SEAL_SEAL
	                 (cpu); VMM fd (cuda vmm); -1 in cuda ipc mode */
	void *base;   /* [KVT_CHUNK_BYTES] daemon's mapping, read-write
	                 (a device address with the cuda backend) */
	uint64_t bytes;
	uint8_t ipc[KVT_BACKEND_IPC_BYTES]; /* cuda ipc mode: handle to send */
	uint64_t priv[2];                  /* the backend's own */
};

/* Sets the capacity; KVT_EINVAL when pool_bytes holds no whole chunk.
 * The backend is cpu until pool_set_backend. */
int pool_init(struct pool *p, uint64_t pool_bytes);

/* Makes later chunks come from ops with context ctx (from ops->ctx_new;
 * the pool does not own it).  Call before the first pool_chunk_new. */
void pool_set_backend(struct pool *p, const struct kvt_backend_ops *ops,
                      void *ctx);

/* Creates a zero-filled chunk; KVT_EPOOLFULL at capacity, KVT_ESYS. */
int pool_chunk_new(struct pool *p, struct pool_chunk *out);

/* Unmaps and closes a chunk and returns its capacity.  Safe on a zeroed
 * chunk (fd 0 is never a memfd here: fields are set to -1 / NULL). */
void pool_chunk_free(struct pool *p, struct pool_chunk *c);

/* The backend chunks come from (backend_cpu until pool_set_backend) and,
 * in *ctx, its context. */
const struct kvt_backend_ops *pool_backend(const struct pool *p, void **ctx);

/* Chunks created and not yet freed (an atomic read). */
uint64_t pool_chunks_used(const struct pool *p);

/* Bytes of the whole pool. */
uint64_t pool_bytes_total(const struct pool *p);

#endif
