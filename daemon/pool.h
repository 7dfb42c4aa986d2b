/*
 * pool.h — the daemon's KV memory pool: a fixed number of 2 MiB chunks
 * from a backend (backend.h: memfds on cpu, VMM or legacy IPC allocations
 * on cuda).  A chunk belongs to one tenant for its whole life and is
 * destroyed (never recycled) when that tenant no longer needs it, so no
 * one else's memory can appear behind a descriptor a client still holds.
 * Every chunk also counts against its tenant's uid and process accounts,
 * each capped at a share of the pool (pool_set_shares).
 *
 * Threads: pool_chunk_new / pool_chunk_free may run on several threads at
 * once; the counters and share caps are atomic (read them with
 * pool_chunks_used, pool_account_chunks, pool_share_chunks); the account
 * list belongs to the loop; the rest is set up before any tenant exists.
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

#include <stdint.h>

#include "backend.h"
#include "kvtrim.h"

/* Who a share of the pool belongs to. */
enum pool_share { POOL_SHARE_UID, POOL_SHARE_PID, POOL_SHARES };

/*
 * The chunks that one uid's (or one process's) tenants hold together.
 * Allocated once and never moved while a tenant refers to it: chunks keep
 * a pointer to it, and pool_chunk_free gives their count back.
 */
struct pool_account {
	struct pool_account *next; /* the pool's list (loop only) */
	enum pool_share kind;
	uint32_t id;               /* uid or pid */
	uint32_t refs;             /* tenants bound to it (loop only) */
	uint64_t chunks;           /* chunks held (atomic) */
};

struct pool {
	const struct kvt_backend_ops *ops; /* NULL: backend_cpu */
	void *bctx;                        /* the backend's context */
	uint64_t chunk_capacity; /* pool_bytes / KVT_CHUNK_BYTES */
	uint64_t chunks_used;    /* chunks currently created */
	uint64_t chunks_created_total;
	uint64_t chunks_released_total;
	uint64_t share_chunks[POOL_SHARES]; /* most chunks one account of
	                                       each kind may hold (atomic) */
	struct pool_account *accounts;      /* every account with refs > 0 */
	/* Device scorers, one per distinct weights, shared by the tenants
	 * holding them (daemon/tenant/tenant_scorer.c; the list and count:
	 * loop thread), and the runs that served several tenants' syncs
	 * (atomic). */
	struct tscorer *scorers;
	uint32_t n_scorers;
	uint64_t scorer_shared_runs_total;
	uint64_t scorer_shared_syncs_total;
};

struct pool_chunk {
	int fd;       /* memfd, sealed F_SEAL_GROW|F_SEAL_SHRINK|F_SEAL_SEAL
	                 (cpu); VMM fd (cuda vmm); -1 in cuda ipc mode */
	void *base;   /* [KVT_CHUNK_BYTES] daemon's mapping, read-write
	                 (a device address with the cuda backend) */
	uint64_t bytes;
	uint8_t ipc[KVT_BACKEND_IPC_BYTES]; /* cuda ipc mode: handle to send */
	uint64_t priv[2];                  /* the backend's own */
	struct pool_account *acct[POOL_SHARES]; /* counted in; NULL: none */
};

/* Sets the capacity; KVT_EINVAL when pool_bytes holds no whole chunk.
 * The backend is cpu until pool_set_backend; shares are the whole pool
 * until pool_set_shares. */
int pool_init(struct pool *p, uint64_t pool_bytes);

/* Makes later chunks come from ops with context ctx (from ops->ctx_new;
 * the pool does not own it).  Call before the first pool_chunk_new. */
void pool_set_backend(struct pool *p, const struct kvt_backend_ops *ops,
                      void *ctx);

/*
 * Each account of a kind may hold share[kind] of the pool (a ratio in
 * (0, 1]): that many whole chunks, at least one.  Applies to later
 * allocations; what accounts hold already stays.
 */
void pool_set_shares(struct pool *p, const double share[POOL_SHARES]);

/* Most chunks one account of kind may hold (an atomic read). */
uint64_t pool_share_chunks(const struct pool *p, enum pool_share kind);

/* The account of (kind, id), created on first use, with one more
 * reference; NULL when out of memory.  Loop only. */
struct pool_account *pool_account_get(struct pool *p, enum pool_share kind,
                                      uint32_t id);

/* Drops a reference from pool_account_get (NULL: nothing); the account
 * goes once the last tenant and every chunk counted in it have.  Loop
 * only. */
void pool_account_put(struct pool *p, struct pool_account *a);

/* Chunks account a holds now (an atomic read). */
uint64_t pool_account_chunks(const struct pool_account *a);

/* Accounts of kind with at least one reference (distinct uids or
 * processes holding tenants).  Loop only. */
uint32_t pool_accounts(const struct pool *p, enum pool_share kind);

/*
 * Creates a zero-filled chunk counted in each non-NULL acct[kind] (acct
 * may be NULL: no account); KVT_EPOOLFULL at capacity or when an account
 * is at its share, KVT_ESYS.
 */
int pool_chunk_new(struct pool *p, struct pool_account *const *acct,
                   struct pool_chunk *out);

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
