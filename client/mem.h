/*
 * mem.h — libkvtrim's view of a tenant's shared memory: the read-only table
 * segment, the read-write staging segment and the pool chunks the daemon
 * granted, all mapped from descriptors that arrive on the handle channel.
 *
 * Internal to client/; not part of the public API.  Not thread-safe (the
 * owning kvt_client is used from one thread at a time).
 */
#ifndef KVT_CLIENT_MEM_H
#define KVT_CLIENT_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "handle.h"
#include "shm.h"

/* Slot i of a tenant's chunks; it is mapped (at bases[i]) or not. */
struct mem_chunk {
	uint64_t bytes; /* length of the mapping */
	int dev;        /* imported through the cuda backend (bc below) */
	int ipc;        /* legacy IPC: the daemon waits for CHUNK_CLOSED */
	struct kvt_backend_chunk bc;
};

struct mem {
	struct shm_geom g;          /* layout the segments must match */
	void *table;                /* [g.table_bytes] PROT_READ, or NULL */
	void *stage;                /* [g.stage_bytes] read-write, or NULL */
	uint32_t max_chunks;        /* slots the quota allows */
	uint32_t n_chunks;          /* entries allocated in chunks[] */
	struct mem_chunk *chunks;   /* [n_chunks], grown on demand */
	void **bases;               /* [n_chunks] where chunk i is mapped
	                               (read-write; a device address for a
	                               device chunk), NULL when unmapped;
	                               contiguous, as kvt_table_view's
	                               chunk_bases on a host tenant and the
	                               source of d_bases on a device tenant */

	/* cuda tenants (the daemon sent EVENT / CHUNK_DEV packets): the
	 * backend from libkvtrim-cuda.so (dlopen; libkvtrim links no CUDA),
	 * its context, and the two interprocess events, indexed by
	 * HANDLE_EVENT_WRITES / HANDLE_EVENT_COMPACT. */
	const struct kvt_backend_ops *bops; /* NULL: host memory only */
	void *bctx;
	struct kvt_backend_event ev[2];
	/* The daemon's device copy of the table (TABLE_DEV), and this
	 * process's chunk bases on the device: d_bases[slot] for slots
	 * [0, n_dbases), of which [dirty_lo, dirty_hi) still await their
	 * upload (mem_device_after). */
	struct kvt_backend_chunk dtab;
	/* The staging segment in device memory (STAGE_DEV; base NULL when
	 * the rows are those of the host segment). */
	struct kvt_backend_chunk dstage;
	void **d_bases;
	uint32_t n_dbases, dirty_lo, dirty_hi;
	/* Serials of closed legacy-IPC chunks to confirm (CHUNK_CLOSED). */
	uint64_t *acks;
	uint32_t n_acks, acks_cap;
};

/*
 * Prepares an empty map for a tenant of geometry g whose quota is
 * quota_bytes (it bounds the chunk slots the daemon may use:
 * quota_bytes / KVT_CHUNK_BYTES; 0 means no bound beyond what page ids can
 * address).  Maps nothing yet.  0 or KVT_EINVAL.
 */
int mem_init(struct mem *m, const struct shm_geom *g, uint64_t quota_bytes);

/* Unmaps everything (device chunks and events too) and frees the slot
 * array; safe twice. */
void mem_fini(struct mem *m);

/*
 * Applies one handle packet: maps TABLE, STAGE and CHUNK_ADD segments,
 * unmaps on CHUNK_REVOKE.  Always consumes fd (closes it when >= 0: the
 * mapping keeps its own reference).  On failure nothing changed except that
 * a CHUNK_ADD into an occupied slot has unmapped the old chunk, and a reason
 * is in err.  Returns 0, KVT_EPROTO (packet that breaks the contract) or
 * KVT_ESYS (mmap failed).
 */
/* Like mem_apply for a packet from handle_recv_set: fds[n] its fds (a grant
 * set maps each chunk as its own CHUNK_ADD / CHUNK_DEV would); consumes
 * every fd; the first error is returned, the other chunks still apply. */
int mem_apply_fds(struct mem *m, const struct handle_ext *h, const int *fds,
                  uint32_t n, char *err, size_t errlen);

int mem_apply(struct mem *m, const struct handle_ext *h, int fd, char *err,
              size_t errlen);

/* 1 when the chunks are device memory (cuda backend). */
int mem_is_device(const struct mem *m);

/* Device tenants: records the "writes" event on stream (the engine's
 * cudaStream_t, NULL = legacy default stream), or makes stream wait on
 * the daemon's "compact" event.  0 on a host-memory tenant. */
int mem_record_writes(struct mem *m, void *stream, char *err, size_t errlen);
int mem_wait_compact(struct mem *m, void *stream, char *err, size_t errlen);

/* Device tenants, after a reply whose packets were applied: queues on
 * stream the upload of changed chunk bases, then the wait for the
 * daemon's "compact" event (which follows its table update).  0 on a host
 * tenant. */
int mem_device_after(struct mem *m, void *stream, char *err, size_t errlen);

/* The table in the pages' memory (kvt_table_view); KVT_EPROTO before the
 * segments are mapped. */
int mem_table_view(const struct mem *m, struct kvt_table_view *out);

/* 1 when [p, p + n) and [base, base + len) share a byte (bytes; NULL
 * base or an empty range: 0). */
int mem_overlaps(const void *p, size_t n, const void *base, uint64_t len);

/* 1 when [p, p + bytes) meets the table, its host or its device copy
 * (which only kvtrimd writes). */
int mem_in_table(const struct mem *m, const void *p, size_t bytes);

/* Copies bytes (kvt_memcpy): memcpy on a host tenant, else a copy on
 * stream and a wait for it.  0, KVT_EINVAL when [dst, dst + bytes) meets
 * the table (host or device copy: only kvtrimd writes it, and a write
 * there would fault, SIGSEGV or a sticky CUDA error that ends the
 * engine's context, rather than fail), or KVT_ESYS; the reason in err. */
int mem_copy(struct mem *m, void *dst, const void *src, size_t bytes,
             void *stream, char *err, size_t errlen);

/* Device tenants: queues the backend's attention op (kvt_attention) on
 * stream.  KVT_ENOTSUP on a host tenant or a library without the op, else
 * the op's code with the reason in err. */
int mem_attention(struct mem *m, const struct kvt_backend_attention *a,
                  void *stream, char *err, size_t errlen);

/* Private memory of the pages' kind (kvt_buffer_alloc), zero-filled: on
 * a device tenant the backend's mem_new (device memory of this process,
 * shared with no one), else 64-byte aligned host memory.  0, KVT_ENOMEM,
 * or the backend's code, with the reason in err.  mem_buffer_free gives
 * back what mem_buffer_new returned, by the same memory kind (dev: the
 * tenant was a device tenant then), before mem_fini. */
int mem_buffer_new(struct mem *m, size_t bytes, void **out, char *err,
                   size_t errlen);
void mem_buffer_free(struct mem *m, void *p, int dev);

/* True once the table and the staging segment are mapped (and, on a
 * device tenant, the device table imported). */
int mem_ready(const struct mem *m);

/* Base of page id `page` in its chunk; NULL when that chunk is unmapped. */
void *mem_page(const struct mem *m, uint32_t page);

#endif
