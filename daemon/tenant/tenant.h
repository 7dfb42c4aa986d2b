/*
 * tenant.h — one registered engine: its geometry, policy, chunks, pages,
 * sequences and every (sequence, layer, KV head) page list.
 *
 * Every entry point validates all of its input before it changes anything:
 * on an error return the tenant is exactly as before.  Pages: page id =
 * chunk slot * pages_per_chunk + index; each list holds
 * ceil((len + room) / page_tokens) pages after every operation, room being
 * its sequence's headroom in force (the registration's at open, then what
 * each sync asked for).  The daemon keeps each entry's original position
 * privately.  Chunk grants and revocations are queued in order and handed
 * to the server by tenant_flush_events() before the reply of the request
 * that caused them.  Threads: loop thread only.
 */
#ifndef KVT_TENANT_H
#define KVT_TENANT_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "handle.h"
#include "kvtrim.h"
#include "pool.h"
#include "shm.h"

struct tenant;

/* Defaults applied to zero fields of a hello. */
#define TENANT_DEF_PAGE_TOKENS 16u
#define TENANT_DEF_MAX_SEQS 8u
#define TENANT_DEF_MAX_TOKENS 4096u
#define TENANT_DEF_POLICY "full"

struct tenant_event {
	enum handle_type type; /* HANDLE_CHUNK_ADD or HANDLE_CHUNK_REVOKE (cpu);
	                          HANDLE_CHUNK_DEV, HANDLE_CHUNK_REVOKE or
	                          HANDLE_EVENT (cuda) */
	uint32_t slot;         /* chunk slot; HANDLE_EVENT_* for an EVENT */
	int fd;                /* ADD, DEV: the chunk's memfd or VMM fd
	                          (borrowed), else -1 */
	uint64_t size;         /* ADD, DEV: KVT_CHUNK_BYTES */
	uint64_t cookie;       /* REVOKE of a device chunk: its serial */
	uint8_t data[HANDLE_DATA_BYTES]; /* DEV (ipc mode), EVENT: handle */
};

/*
 * What registration allows: the server's settings at hello time.
 */
struct tenant_limits {
	uint64_t default_quota;    /* quota of a hello asking none; 0 = the
	                              fair share, pool / expected_tenants */
	uint64_t max_quota;        /* caps the default; 0 = the whole pool */
	uint32_t expected_tenants; /* tenants the pool is shared between
	                              (0 is taken as 1) */
	uint64_t memory_max;       /* tenant_memory_max: daemon bytes outside
	                              the pool one tenant may cause */
	uint64_t memory_need;      /* out: the hello's estimate (struct
	                              tenant_mem total), 0 when tenant_new
	                              refused it before computing it */
	struct pool_account *acct[POOL_SHARES]; /* the uid's and process's
	                              shares its chunks count in (borrowed:
	                              they must outlive the tenant); NULL:
	                              none */
};

/*
 * Daemon memory outside the pool that one tenant can cause at its worst:
 * every max_seqs slot open with every list at max_tokens, the largest sync,
 * and every chunk its quota allows.  Computed from the geometry, the policy
 * (entry and layer state, staged inputs, lookback), the quota and the
 * backend; saturates at UINT64_MAX instead of wrapping.
 */
struct tenant_mem {
	uint64_t table;   /* table segment (and its device copy on cuda) */
	uint64_t stage;   /* staging segment */
	uint64_t seqs;    /* private arrays of max_seqs open sequences:
	                     page ids, positions, entry and layer state */
	uint64_t lists;   /* per-slot and per-list state of all slots */
	uint64_t chunks;  /* bookkeeping of the quota's chunks: slots, free-page
	                     stacks, event and revocation queues */
	uint64_t scratch; /* sync and policy scratch at their largest */
	uint64_t total;   /* sum of the above */
};

struct policy;
void tenant_memory(const struct shm_geom *g, const struct policy *pol,
                   uint64_t quota, int dev, struct tenant_mem *out);

/*
 * Tenant names: 1..KVT_NAME_MAX-1 bytes of [A-Za-z0-9._@:-], the first not
 * a digit, so a name is never mistaken for an id (kvtrimctl drain 12 means
 * tenant id 12).  0 or KVT_EINVAL with the reason (the name shown escaped).
 * An empty name is not checked here: tenant_new names it "tenant-<id>".
 */
int tenant_name_check(const char *name, char *err, size_t errlen);

/*
 * Registers a tenant from a decoded hello: applies defaults (an empty name
 * becomes "tenant-<id>"), validates the name (KVT_EINVAL) and the geometry
 * (KVT_EGEOMETRY), parses the policy spec (KVT_EPOLICY), checks the quota
 * (0 asks the default of lim; more than the pool or less than one chunk
 * gives KVT_EQUOTA; otherwise rounded down to whole chunks) and the
 * daemon memory the tenant may cause (struct tenant_mem: more than
 * lim->memory_max gives KVT_EQUOTA, the text naming the parts and the hello
 * fields to lower), and creates the table and staging memfds.  No chunk is
 * created yet.  The table memfd is sealed against writes
 * (F_SEAL_FUTURE_WRITE) once the daemon mapped it: the client can map it
 * read-only only, so the daemon's checks see only the daemon's writes.
 */
int tenant_new(struct pool *pool, uint32_t id, const struct ipc_hello *h,
               struct tenant_limits *lim, struct tenant **out, char *err,
               size_t errlen);

/*
 * With a backend whose chunks are device memory (host_visible 0), the
 * tenant also holds a stream and two interprocess events, whose handles
 * are queued as HANDLE_EVENT packets by tenant_new: the server must flush
 * them before it sends the segments.  A sync makes the stream wait on the
 * client's "writes" event, stages the keys its policy reads to host memory,
 * compacts all its lists in one batched call and records the "compact"
 * event, which the client's stream waits on.
 */

/*
 * Re-reads the tenant's policy from its spec, the scorer weights files
 * included (SIGHUP), and swaps it in between two syncs.  The new policy must
 * fit the running state: the same per-entry and per-layer state sizes and
 * lookback, else it is refused.  Returns 1 when swapped, 0 when the spec
 * loads no weights (nothing to re-read), or a negative code with a reason;
 * on refusal the tenant keeps its old policy unchanged.
 */
int tenant_reload_policy(struct tenant *t, char *err, size_t errlen);

/* Nanoseconds the last tenant_sync spent in the policy's scoring and
 * decisions (the rest of the apply is commits, compaction and pages). */
uint64_t tenant_scorer_ns(const struct tenant *t);

/* The CPU time of the thread that ran the last tenant_sync, inside it
 * (on a device tenant, the host's side and the launches; on the CUDA
 * emulator also the device's work it ran). */
uint64_t tenant_sync_cpu_ns(const struct tenant *t);

/* The longest the device scorer of the tenant's next syncs may wait for
 * other tenants' syncs to share its run (scorer_gather_us on a sync worker;
 * 0, the default, on the loop thread: it takes only what is queued). */
void tenant_set_gather(struct tenant *t, uint32_t us);

/* Releases every chunk back to the pool and frees the tenant.  NULL-safe. */
void tenant_free(struct tenant *t);

uint32_t tenant_id(const struct tenant *t);
const char *tenant_name(const struct tenant *t);
const char *tenant_policy_spec(const struct tenant *t);
/* What its policy reads: kvtrim.h's KVT_INPUT_* bits (the hello reply). */
uint32_t tenant_policy_inputs(const struct tenant *t);
const struct shm_geom *tenant_geom(const struct tenant *t);
uint64_t tenant_quota(const struct tenant *t);
int tenant_table_fd(const struct tenant *t); /* size: geom.table_bytes */
int tenant_stage_fd(const struct tenant *t); /* size: geom.stage_bytes */

/*
 * Opens a sequence: allocates headroom pages for each of its lists.
 * KVT_ESEQLIMIT when all max_seqs slots are open; KVT_EQUOTA / KVT_EPOOLFULL
 * when the pages cannot be had (nothing allocated then).  Sequence ids hold
 * the tenant's id, the slot's generation and the slot (ipc/seqid.h), so an
 * id of another tenant, or of a closed sequence, names no open sequence
 * (KVT_ENOSEQ wherever an id is taken).
 */
int tenant_seq_open(struct tenant *t, uint64_t *seq);

/* tenant_seq_open, with the reason of a refusal in err (errlen bytes):
 * which limit the pages ran into (the quota, a share of the pool, the
 * pool). */
int tenant_seq_open_why(struct tenant *t, uint64_t *seq, char *err,
                        size_t errlen);

/*
 * Before a seq_open numbered `no` (the client's request number): the
 * client's earlier opens that ended without a verdict (timed out), from
 * number `undo` (0: none) on.  Each of those the daemon did apply opened a
 * sequence the client never learnt the id of: those sequences, the ones
 * opened by requests numbered in [undo, no), are closed, and *closed says
 * how many.  A client opens one sequence at a time (kvt_client is used by
 * one thread), so an open numbered below the latest one seen is one the
 * client gave up on, arriving late: KVT_ESTALE, nothing done (the same
 * number again is the retry of a parked open); so is an open numbered at
 * or below a sync that reached the tenant (tenant_sync), since one
 * client numbers its opens and syncs from one counter.  The number then becomes
 * the tenant's latest, and tenant_seq_open gives it to the sequence it
 * opens.  Runs even when the open itself is then refused
 * (draining, no slot): undoing frees what the client cannot use.
 */
int tenant_seq_reconcile(struct tenant *t, uint64_t no, uint64_t undo,
                         uint32_t *closed);

/*
 * Opens a sequence that is a copy of open sequence `from`: every list holds
 * the same entries (bit for bit), original positions and policy state, and
 * the sequence the same tokens seen per layer and per-layer policy state;
 * its counter starts at 0 and its headroom is the registration's, as after
 * tenant_seq_open.  Both then go on independently.  KVT_ENOSEQ for an
 * unknown `from`, KVT_EINVAL when the policy keeps per-entry state on the
 * device (an attention rule deciding there: not copied), KVT_ESEQLIMIT,
 * KVT_ENOMEM, KVT_EQUOTA or KVT_EPOOLFULL with nothing changed (the
 * reason in err, as tenant_seq_open_why gives it); KVT_ESYS
 * when a device copy fails (the tenant is marked failed).
 */
int tenant_seq_fork(struct tenant *t, uint64_t from, uint64_t *seq,
                    char *err, size_t errlen);

/* Closes a sequence and frees its pages; KVT_ENOSEQ for an unknown id. */
int tenant_seq_close(struct tenant *t, uint64_t seq);

/*
 * What the tenant holds for an open sequence: its sync counter, the tokens
 * appended per layer, the committed entries per list (lowest and highest
 * of each) and the number of the last sync applied to it, so a client
 * whose sync `after` timed out learns whether it was applied.
 *
 * The answer must stay true: requests of one client can be handled out
 * of order (parked, or held behind a sync on a worker), and one the
 * client gave up on may still be on its way.  So when sync `after` (nonzero) was
 * not applied to seq, it is voided here: a sync of seq numbered up to
 * `after` that arrives later is refused (tenant_sync).  The client sends
 * at most one sync per sequence at a time, so nothing else it still
 * waits for is caught.  `no` is the query's own number: an `after` at or
 * above it names a sync the client had not sent when it asked, KVT_EINVAL,
 * nothing marked (voiding it would refuse every later sync of seq).  A
 * client's requests reach the tenant in the order it sent them, so a sync
 * numbered above every one seen (tenant_sync) never reached it (its
 * client's library gave it up before writing it) and never will: not
 * applied, nothing to void.  KVT_ENOSEQ for an unknown id; otherwise
 * changes only that mark.
 */
int tenant_seq_query(struct tenant *t, uint64_t seq, uint64_t no,
                     uint64_t after, struct ipc_seq_state *out);

/*
 * Device tenants whose policy reads K (the daemon copies keys to the host,
 * which must wait for the engine's writes): 1 when a sync can run now
 * without the daemon's thread waiting on the engine's queued GPU work,
 * else 0 after arranging for wake(arg) to be called (from another thread)
 * once those writes are done; the caller keeps the request and asks again
 * then.  Always 1 for host tenants and for policies that do not read K.
 * Changes nothing a sync or a refusal could observe.
 */
int tenant_sync_ready(struct tenant *t, void (*wake)(void *), void *arg);

/*
 * Applies a sync: for each item commits n_new entries of every list of
 * layers [lo, hi) (hi 0 = all), runs the policy, compacts, restores headroom
 * and bumps epochs.  Validates every item first: unknown sequence
 * (KVT_ENOSEQ), the same sequence twice (KVT_EINVAL), counter != syncs so far
 * (KVT_ESTALE), a sync number `no` (the client's, the request's "n")
 * a seq_query voided for one of its sequences (KVT_ESTALE, see
 * tenant_seq_query), bad layer range (KVT_ELAYERS), n_new beyond the headroom in
 * force or a headroom asked beyond the registration's (KVT_EHEADROOM),
 * n_new > stage_tokens when the policy needs staged inputs (KVT_EHEADROOM),
 * len beyond max_tokens (KVT_ETOOLONG), staged inputs the policy refuses
 * (not finite or never staged: KVT_EINVAL naming item, sequence, layer,
 * position and input; policy_decide), pages that cannot be had (KVT_EQUOTA
 * / KVT_EPOOLFULL).  On success each item's sequence counter is
 * incremented, its last sync number set to no, its lists keep room for the item's headroom, and the
 * staging rows of the positions it may append next are marked unstaged.
 * Refused or not, `no` becomes the highest sync number the tenant has seen
 * when above it (the only change a refusal makes).
 */
int tenant_sync(struct tenant *t, uint64_t no,
                const struct ipc_sync_item *items, uint32_t n, char *err,
                size_t errlen);

/*
 * After a successful tenant_sync: the sync reply's fields, what that sync
 * applied: the pressure level (IPC_PRESS_ONE = 1) and the entries per list
 * its policy's budget allowed (for ratio budgets at the longest
 * (sequence, layer) of the sync; 0 when the policy has no entry budget).
 */
void tenant_sync_reply(const struct tenant *t, struct ipc_rep *rep);

/*
 * Hands queued events to send() in order; after the last one, destroys the
 * revoked chunks.  Stops at the first send error and returns it (the server
 * then drops the tenant).  0 when all were sent (or none was queued).
 */
int tenant_flush_events(struct tenant *t,
                        int (*send)(void *ctx, const struct tenant_event *e),
                        void *ctx);

/*
 * Memory pressure for this tenant's policy, level in [0, 1] (clamped; NaN
 * is 0): 0 = as configured; budgets shrink to B - floor(B * level / 2),
 * thresholds rise (policy.h, policy_set_pressure).  Takes effect at the
 * next sync; decisions already made stay made.  Never fails.
 */
void tenant_set_pressure(struct tenant *t, float level);
float tenant_pressure(const struct tenant *t);

/* Accounting of this tenant (the public struct, filled by the daemon);
 * daemon_bytes is the estimate of struct tenant_mem, pressure_ppm the level
 * in force now, budget the one the last sync applied (tenant_sync_reply). */
void tenant_stats(const struct tenant *t, struct kvt_tenant_stats *out);

/* The estimate the tenant was admitted with. */
const struct tenant_mem *tenant_mem_of(const struct tenant *t);

/*
 * Checks the tenant's invariants: every page of its chunks is either free or
 * in exactly one list; free + used = chunks * pages_per_chunk; each list
 * holds exactly ceil((len + headroom) / page_tokens) pages and the table
 * segment matches the private state; chunks * 2 MiB <= quota.  Returns the
 * number of violations (0 = clean) and describes the first in detail.
 * Cost follows the live state: open sequences' lists and pages, and the
 * record headers of slots that were open once; slots never opened are
 * all-zero by construction (only the daemon writes the sealed table) and
 * are not read, so the check faults in no untouched table page.
 */
int tenant_check(const struct tenant *t, char *detail, size_t len);

/*
 * Device tenants: rewrites, from the host table, every record (and the
 * header) of the device table shared with the client that differs from
 * it, queued on the tenant's stream before the COMPACT event the client
 * waits on.  Only an engine writes there (its mapping is read-only where
 * the sharing mode allows, not in legacy IPC, nor against an engine that
 * changes its own mapping's access); the daemon's kernels read its own
 * copy, so this is for the engine's view only.  *fixed = records (and
 * header) rewritten; 0 or the backend's code.  A host tenant: 0, none.
 * Reads what tenant_check reads; run it with no sync in flight.
 */
int tenant_table_repair(struct tenant *t, uint32_t *fixed);

/*
 * The client closed a legacy-IPC chunk it was told to revoke (packet
 * CHUNK_CLOSED with the serial from the REVOKE): the chunk is freed now and
 * 0 is returned.  A serial that names no revoked chunk still awaiting
 * CHUNK_CLOSED (unknown, already confirmed, or a tenant that shares no
 * legacy-IPC chunks) changes nothing and returns KVT_EPROTO: the client
 * sent what the protocol never asked for, and the server drops it.
 */
int tenant_chunk_closed(struct tenant *t, uint64_t serial);

/* 1 after a device failure inside a sync's apply step: the tenant's K/V
 * can no longer be trusted and the server drops it. */
int tenant_failed(const struct tenant *t);

/* Number of chunks the tenant holds (for the pool-level check). */
uint64_t tenant_chunks(const struct tenant *t);

#endif
