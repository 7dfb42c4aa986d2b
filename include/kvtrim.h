/*
 * kvtrim.h — the one public header of libkvtrim, the client library that
 * inference engines link to keep their KV cache inside kvtrimd's pool.
 *
 * Model of use (see DESIGN.md section 4):
 *   1. kvt_connect() registers a tenant (model geometry, dtype, page size,
 *      policy) and maps the tenant's read-only table segment, its read-write
 *      staging segment and every pool chunk the daemon grants it.
 *   2. kvt_seq_open() reserves a sequence slot.
 *   3. For each new token the engine writes K and V of every (layer, KV head)
 *      at entry index len + k (k < headroom) through kvt_kv_ptr(), and the
 *      scorer inputs its policy needs through kvt_stage_*().
 *   4. kvt_sync() tells the daemon how many entries were appended; the daemon
 *      commits them, applies the policy, compacts every list and restores
 *      headroom.  Afterwards kvt_list() shows the new lengths and pages.
 *
 * Threads: a kvt_client is not thread-safe; use it from one thread at a time.
 * Blocking: every call that talks to the daemon blocks for at most the
 * client's timeout (kvt_config.timeout_ms) and returns KVT_ETIMEDOUT after it
 * (what a timed-out sync leaves, and how to resolve it: kvt_sync).
 * Errors: every function returning int returns 0 (or a count >= 0) on success
 * and a negative KVT_E* code on failure; kvt_strerror() names it.  The codes
 * are stable: they travel on the wire.
 */
#ifndef KVTRIM_H
#define KVTRIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_API __attribute__((visibility("default")))

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 1
#define KVT_VERSION_PATCH 0

/* ---------------------------------------------------------------- errors */

/*
 * The one error list of the project: XX(NAME, number, text).  The enum value
 * is the negated number.  Numbers are fixed forever (they go on the wire);
 * add new codes at the end.
 */
#define KVT_ERRNO_MAP(XX)                                                      \
	XX(EINVAL, 1, "invalid argument")                                      \
	XX(ENOMEM, 2, "out of host memory")                                    \
	XX(EPROTO, 3, "malformed message")                                     \
	XX(EVERSION, 4, "protocol version mismatch")                           \
	XX(EUNKNOWNOP, 5, "unknown operation")                                 \
	XX(ENOTENANT, 6, "unknown tenant or bad credentials")                  \
	XX(ENOSEQ, 7, "unknown sequence")                                      \
	XX(ELAYERS, 8, "layer range out of bounds")                            \
	XX(EHEADROOM, 9, "entry count beyond headroom")                        \
	XX(ESTALE, 10, "stale or duplicate sync")                              \
	XX(EPOLICY, 11, "bad policy spec")                                     \
	XX(EQUOTA, 12, "tenant quota exceeded")                                \
	XX(EPOOLFULL, 13, "memory pool exhausted")                             \
	XX(ETOOLONG, 14, "sequence longer than max_tokens")                    \
	XX(ESHUTDOWN, 15, "daemon shutting down, or tenant drained")           \
	XX(ECONN, 16, "cannot reach the daemon or connection lost")            \
	XX(ETIMEDOUT, 17, "timed out")                                         \
	XX(ESYS, 18, "system call failed")                                     \
	XX(ESEQLIMIT, 19, "no free sequence slot")                             \
	XX(EGEOMETRY, 20, "invalid model geometry or page layout")             \
	XX(EBUSY, 21, "resource busy")                                         \
	XX(EINVARIANT, 22, "pool invariant violated")                          \
	XX(ETOOBIG, 23, "message too large")                                   \
	XX(EPERM, 24, "permission denied")                                     \
	XX(EEXIST, 25, "already exists")                                       \
	XX(ENOTSUP, 26, "not supported")

enum kvt_err {
	KVT_OK = 0,
#define KVT_ERR_ENUM_(name, num, text) KVT_##name = -(num),
	KVT_ERRNO_MAP(KVT_ERR_ENUM_)
#undef KVT_ERR_ENUM_
};

/* Returns a static string for a KVT_E* code (or "unknown error"). */
KVT_API const char *kvt_strerror(int err);

/* Returns the symbolic name ("EINVAL") of a code, or "E?" when unknown. */
KVT_API const char *kvt_errname(int err);

/* ---------------------------------------------------------------- types */

enum kvt_dtype {
	KVT_DTYPE_F32 = 0,
	KVT_DTYPE_F16 = 1,
	KVT_DTYPE_BF16 = 2,
};

/* Bytes per element of a dtype, 0 for an unknown one. */
KVT_API size_t kvt_dtype_size(enum kvt_dtype dt);

enum kvt_phase {
	KVT_PHASE_PREFILL = 0,
	KVT_PHASE_DECODE = 1,
};

/* Size of one pool chunk: the unit of quota and of memory sharing. */
#define KVT_CHUNK_BYTES ((uint64_t)2 << 20)

/* Longest tenant name, policy spec and error text, including the NUL. */
#define KVT_NAME_MAX 64
#define KVT_SPEC_MAX 256
#define KVT_ERRTEXT_MAX 256

struct kvt_geometry {
	uint32_t n_layers;   /* transformer layers */
	uint32_t n_heads;    /* query heads */
	uint32_t n_kv_heads; /* KV heads; n_heads % n_kv_heads == 0 */
	uint32_t head_dim;   /* per head */
	uint32_t d_model;    /* hidden size of the attention input x */
};

/*
 * Registration parameters.  Zero fields take the documented default.
 * The page of one (sequence, layer, KV head) holds page_tokens entries laid
 * out as [K: page_tokens x head_dim][V: page_tokens x head_dim] in dtype; it
 * must fit in one chunk.
 */
struct kvt_config {
	const char *runtime_dir;  /* NULL: $KVTRIM_RUNTIME_DIR, then
	                             $XDG_RUNTIME_DIR/kvtrim, then
	                             /run/kvtrimd (the systemd service's) */
	const char *tenant;       /* name shown in stats: 1..KVT_NAME_MAX-1
	                             bytes of [A-Za-z0-9._@:-], not starting
	                             with a digit (kvtrimd refuses others with
	                             KVT_EINVAL, so a name never reads as a
	                             tenant id); NULL or "" = "engine-<pid>" */
	struct kvt_geometry geo;
	enum kvt_dtype dtype;
	uint32_t page_tokens;     /* entries per page (default 16) */
	uint32_t max_seqs;        /* open sequences at once (default 8) */
	uint32_t max_tokens;      /* most entries one list may hold
	                             (default 4096) */
	uint32_t headroom;        /* entries the engine may append between two
	                             syncs (default page_tokens) */
	uint32_t stage_tokens;    /* staging ring length per (sequence, layer);
	                             0 = none (policies that need no inputs) */
	const char *policy;       /* spec "name[:k=v,...]"; NULL = "full";
	                             a relative model= path is made absolute
	                             against the working directory at
	                             kvt_connect (docs/weights.md) */
	uint64_t quota_bytes;     /* pool bytes this tenant may hold; 0 = the
	                             daemon's default quota (its default_quota,
	                             by default a fair share: pool_size /
	                             expected_tenants).  Held in whole 2 MiB
	                             chunks: rounded down to them at
	                             kvt_connect, which stores what was
	                             granted here (kvt_config_of) */
	int timeout_ms;           /* per call; 0 = 5000 */
};

typedef struct kvt_client kvt_client; /* opaque */
/* Sequence id from kvt_seq_open, opaque and never 0.  It names its tenant
 * and its slot's generation too: another client's id, and the id of a
 * closed sequence (even once its slot is reused), are unknown (KVT_ENOSEQ)
 * to every call, so mixing up the ids of two clients changes nothing. */
typedef uint64_t kvt_seq;

/* ---------------------------------------------------------------- session */

/*
 * Connects to kvtrimd, registers a tenant and maps its segments.
 * On success *out owns the connection until kvt_disconnect().  The daemon
 * refuses bad geometry (KVT_EGEOMETRY), a spec that does not parse
 * (KVT_EPOLICY), a bad tenant name (KVT_EINVAL), a quota below one chunk,
 * or larger than the pool, than its max_quota or than what the tenants of
 * one uid or one process may hold together (its uid_pool_share and
 * pid_pool_share: by default 3/4 and 1/2 of the pool with 4
 * expected_tenants, so that no user or process can take what the others'
 * engines are owed) (KVT_EQUOTA, the text naming the limit), and a
 * geometry whose daemon-side
 * state (table and staging segments, per-sequence arrays, scratch, for
 * max_seqs open sequences) would exceed its tenant_memory_max (KVT_EQUOTA,
 * the text naming the parts and which fields to lower), and a connection
 * when the process or its uid already holds its share of the connections
 * without a tenant, or the daemon is at max_pending_conns or max_tenants
 * (KVT_EBUSY, the text naming the limit); the reason is then in *errtext
 * when errtext is not NULL (KVT_ERRTEXT_MAX bytes).
 */
KVT_API int kvt_connect(const struct kvt_config *cfg, kvt_client **out,
                        char *errtext);

/*
 * Unregisters and unmaps everything.  All sequences are closed and their
 * pages return to the pool.  Safe with NULL.  Never fails visibly.
 * kvt_disconnect frees the handle (as nng_close and uv_close end theirs):
 * c must not be used afterwards, by any call, kvt_disconnect included; a
 * call on a freed handle is a use after free that no library can detect.
 *
 * Lost connection.  Once the daemon is gone (it exited, crashed or was
 * killed; the first call that notices returns KVT_ECONN) the handle stays
 * valid but dead: every later call on it returns KVT_ECONN (kvt_page_ptr
 * and kvt_stage_* return NULL) until the engine calls kvt_disconnect, which
 * is still required to release it.  kvt_last_error, kvt_config_of and
 * kvt_memory_kind keep answering.  A sync whose kvt_wait gives KVT_ECONN
 * may or may not have been applied; it does not matter, as the tenant and
 * all its sequences died with the daemon.  The handle never revives, not
 * even when a kvtrimd is restarted on the same runtime dir: to reconnect,
 * kvt_disconnect the dead handle, then kvt_connect a new client (the same
 * kvt_config serves) once the new daemon is up (kvt_connect returns
 * KVT_ECONN until its sockets exist; retry with a backoff), and reopen and
 * refill the sequences: no KV data survives a daemon restart.
 */
KVT_API void kvt_disconnect(kvt_client *c);

/*
 * The reason of the last failed call on c: the daemon's text, or
 * libkvtrim's own for what it refused itself.  Every call that takes a
 * mutable client clears it first, so after a call that succeeded it is "".
 * The calls that take a const client (kvt_list_get, kvt_page_ptr,
 * kvt_kv_ptr, kvt_stage_*, kvt_table_view, kvt_list_record, and the
 * accessors) neither set nor clear it: their codes say it all.
 */
KVT_API const char *kvt_last_error(const kvt_client *c);

/* Registered parameters after defaults were applied (read-only). */
KVT_API const struct kvt_config *kvt_config_of(const kvt_client *c);

/* What the tenant's policy reads, as kvt_policy_inputs() reports it. */
enum kvt_input {
	KVT_INPUT_X = 1u << 0,   /* kvt_stage_x */
	KVT_INPUT_Q = 1u << 1,   /* kvt_stage_q */
	KVT_INPUT_LSE = 1u << 2, /* kvt_stage_lse */
	KVT_INPUT_KV = 1u << 3,  /* the K/V pages (always written anyway) */
};

/*
 * The KVT_INPUT_* bits of what the tenant's policy reads at every sync,
 * from kvtrimd at kvt_connect: an engine stages exactly the inputs whose
 * bit is set (none for "full" or "streaming"); the others are never read.
 * 0 for NULL.
 */
KVT_API uint32_t kvt_policy_inputs(const kvt_client *c);

/* ---------------------------------------------------------------- sequences */

/*
 * Opens a sequence: every (layer, head) list starts empty with headroom.
 * Pages beyond the tenant's quota: KVT_EQUOTA at once.  Pages the pool, or
 * the share of it the tenants of this uid or process may hold together,
 * lacks: the request waits up to the daemon's pressure_deadline_ms for
 * pages to come free, then KVT_EPOOLFULL, kvt_last_error naming which
 * (the same holds for kvt_sync).  One that timed out (KVT_ETIMEDOUT) may have opened a sequence whose id
 * this client never learnt: the next kvt_seq_open has kvtrimd close it
 * first (and refuse the timed-out request should it arrive only then), so
 * its slot and pages come back.
 */
KVT_API int kvt_seq_open(kvt_client *c, kvt_seq *out);

/*
 * Opens a sequence that is a copy of open sequence `from` as its last sync
 * left it: every (layer, head) list holds the same entries, bit for bit,
 * with their original positions and the policy's state, and the same
 * tokens count as seen, so appending continues at the same position.  Its
 * sync counter starts at 0 and its headroom is the registration's, as
 * after kvt_seq_open; then the two go on independently (pages are copied,
 * not shared: the copy costs the pages `from` holds).  The way to ask
 * several questions about one compressed context: prefill and compress
 * the context once, then fork it for each question and close the fork.
 * Errors: KVT_ENOSEQ (from is not an open sequence of this client),
 * KVT_EBUSY (its async sync is in flight), KVT_ESTALE (a sync of it is in
 * doubt: kvt_seq_query first), and those of kvt_seq_open
 * (KVT_ESEQLIMIT, KVT_EQUOTA, KVT_EPOOLFULL); a timeout is resolved as
 * kvt_seq_open's is.  On the cuda backend the policy's device state (H2O's
 * accumulated attention, TOVA's positions, KVpop's scores and rings) is
 * copied on the device too.
 */
KVT_API int kvt_seq_fork(kvt_client *c, kvt_seq from, kvt_seq *out);

/*
 * Closes a sequence and returns its pages to the pool.  KVT_EBUSY while
 * a kvt_sync_async of it is in flight (kvt_wait first).  Closing a
 * sequence in doubt (see kvt_sync) is allowed.  After KVT_ETIMEDOUT the
 * sequence stays open here; close it again (KVT_ENOSEQ then means the
 * daemon had closed it, and libkvtrim forgets it too).
 */
KVT_API int kvt_seq_close(kvt_client *c, kvt_seq seq);

/*
 * What kvtrimd holds for one sequence, from kvt_seq_query.
 */
struct kvt_seq_info {
	uint32_t syncs;     /* syncs applied to it since kvt_seq_open */
	uint32_t seen_min;  /* entries appended since open (n_new summed),
	                       in the layer with fewest ... */
	uint32_t seen_max;  /* ... and most (they differ only after syncs of
	                       part of the layers) */
	uint32_t len_min;   /* committed entries (kvt_list.len) of its */
	uint32_t len_max;   /* shortest and longest list */
	int32_t last_sync;  /* the sync that left it in doubt (kvt_sync):
	                       1 applied, 0 not applied; -1 none was */
};

/*
 * Asks the daemon where a sequence stands, and resynchronises libkvtrim
 * with it: this is how a sync that ended in doubt (KVT_ETIMEDOUT, see
 * kvt_sync) is resolved without closing the sequence.  The query names
 * that sync (each sync request carries a number), and out->last_sync is
 * final: 1, the sync was applied (its entries are committed; append after
 * them), 0, it was not (the appended entries are still at len + k; sync
 * them again), and the daemon refuses that request should it still
 * arrive, so it never applies later.  Then the sequence is usable again.
 * Safe on any open, idle sequence; KVT_EBUSY while an async sync of it is
 * in flight, KVT_ENOSEQ for an unknown id.  A query that times out itself
 * changes nothing: ask again.
 */
KVT_API int kvt_seq_query(kvt_client *c, kvt_seq seq,
                          struct kvt_seq_info *out);

/* ---------------------------------------------------------------- data plane */

/*
 * Read-only view of one (sequence, layer, KV head) list as of the last
 * completed sync.  Entries [0, len) are valid, in no particular order (keys
 * are stored after RoPE, so attention does not depend on order).  Entry i
 * lives in page pages[i / page_tokens] at row i % page_tokens.  The view is
 * valid until the next sync or close of that sequence.  On an error
 * kvt_list_get leaves *out as it was.
 */
struct kvt_list {
	uint32_t len;          /* committed entries */
	uint32_t n_pages;      /* pages held, including headroom */
	uint64_t epoch;        /* bumped by every change of the list */
	const uint32_t *pages; /* [n_pages] page ids, read-only shared memory */
};
KVT_API int kvt_list_get(const kvt_client *c, kvt_seq seq, uint32_t layer,
                         uint32_t kv_head, struct kvt_list *out);

/*
 * Pointer to page `page` (an id from kvt_list.pages):
 * [K: page_tokens x head_dim][V: page_tokens x head_dim], dtype elements.
 * NULL for an id the client has not mapped.
 */
KVT_API void *kvt_page_ptr(const kvt_client *c, uint32_t page);

/*
 * Where to write K and V of entry len + k of a list (0 <= k < headroom,
 * the sequence's headroom in force: see kvt_seq_headroom): *k_out and
 * *v_out each point at head_dim dtype elements.  Returns KVT_EHEADROOM when
 * k is beyond the headroom.
 *
 * Contract: before a sync commits n_new entries, the engine has written K
 * and V of entries len .. len + n_new - 1 of every list the sync names.
 * The daemon commits whatever bytes those rows hold: a row never written
 * holds zeros (a fresh page) or the stale bytes of an entry compaction
 * moved away, and the entry then takes part in attention like any other.
 * kvtrimd does not check it: on a cuda tenant the pages are device memory
 * it reads only for policies that need keys, and on the cpu backend the
 * only cheap test (an all-zero row) misses stale rows, refuses a valid
 * all-zero key, and would cost a write into every headroom row per sync.
 */
KVT_API int kvt_kv_ptr(const kvt_client *c, kvt_seq seq, uint32_t layer,
                       uint32_t kv_head, uint32_t k, void **k_out,
                       void **v_out);

/*
 * Staged scorer inputs of the token at original position `pos` of a
 * sequence in one layer, float32, in a ring of stage_tokens entries
 * (pos % stage_tokens): x is [d_model] (attention input after the input
 * RMSNorm), q is [n_heads][head_dim] (post-RoPE queries), lse is [n_heads]
 * (log-sum-exp of each query head's attention logits).  NULL when the tenant
 * has no staging (stage_tokens 0), when its policy does not read that input
 * (kvt_policy_inputs: the staging segment holds only what it reads, so
 * kvzap, reading x, stages d_model floats per token), or an argument is out
 * of range.  The memory is that of the pages (kvt_memory_kind): on a cuda
 * tenant the staging rows are device memory, which the engine's kernels
 * write in place on its stream (kvt_set_stream) before the sync (or
 * kvt_memcpy from the host); kvtrimd reads them itself, after the
 * sync's writes event, so no staged byte crosses to the host on the
 * engine's side.
 *
 * Contract: before a sync commits n_new entries, the engine has staged
 * every input its policy reads (docs/policies.md) of every new position,
 * as finite numbers.  A sync whose staged inputs hold a NaN or an infinity,
 * or a row the engine never staged (kvtrimd marks the rows of the next
 * positions at open and after every sync), is refused with KVT_EINVAL, the
 * text naming the item, sequence, layer, position and input, and changes
 * nothing: the engine may fix the rows and sync again.
 */
KVT_API float *kvt_stage_x(const kvt_client *c, kvt_seq seq, uint32_t layer,
                           uint32_t pos);
KVT_API float *kvt_stage_q(const kvt_client *c, kvt_seq seq, uint32_t layer,
                           uint32_t pos);
KVT_API float *kvt_stage_lse(const kvt_client *c, kvt_seq seq, uint32_t layer,
                             uint32_t pos);

/*
 * Bulk writes, for engines that hold a layer's new K and V (or scorer
 * inputs) as tensors: one call per (sequence, layer) instead of one
 * kvt_kv_ptr / kvt_stage_* per row.
 *
 * kvt_write_kv copies K and V of n new tokens into entries len + k0 ..
 * len + k0 + n - 1 of every KV head's list of the layer.  k and v hold
 * elements of the tenant's dtype (kvt_config.dtype: an engine converts
 * first); element i of token t and KV head h is at
 *   k[(t * tok_stride + h * head_stride) + i]     (strides in elements),
 * so transformers' per-sequence [n_kv_heads][n][head_dim] is
 * tok_stride = head_dim, head_stride = n * head_dim, and [n][n_kv_heads]
 * [head_dim] is tok_stride = n_kv_heads * head_dim, head_stride = head_dim.
 * Memory as kvt_memcpy takes it (host memory; on a cuda tenant host or
 * device memory, copied on the client's stream).  Everything is checked
 * before a byte is written: KVT_EINVAL (NULL pointers with n > 0, layer out
 * of range, a stride too small to keep rows apart), KVT_ENOSEQ, KVT_EBUSY,
 * KVT_EHEADROOM (k0 + n beyond the headroom in force), KVT_EPROTO (a list
 * without the pages the daemon promised), KVT_ECONN; the reason in
 * kvt_last_error.  n 0 writes nothing.
 */
KVT_API int kvt_write_kv(kvt_client *c, kvt_seq seq, uint32_t layer,
                         uint32_t k0, uint32_t n, const void *k,
                         const void *v, uint64_t tok_stride,
                         uint64_t head_stride);

/*
 * kvt_stage copies the scorer inputs of positions pos0 .. pos0 + n - 1 of
 * one layer into their staging rows: x [n][d_model], q [n][n_heads]
 * [head_dim], lse [n][n_heads], float32, contiguous, memory as for
 * kvt_write_kv.  Only the inputs the policy reads (kvt_policy_inputs) are
 * copied; the others may be NULL.  Checked first: KVT_EINVAL (an input the
 * policy reads given as NULL, n beyond stage_tokens, layer out of range, no
 * staging), KVT_ENOSEQ, KVT_EBUSY, KVT_ECONN.  n 0, or a policy that reads
 * none of them, copies nothing.
 */
KVT_API int kvt_stage(kvt_client *c, kvt_seq seq, uint32_t layer,
                      uint32_t pos0, uint32_t n, const float *x,
                      const float *q, const float *lse);

/* ---------------------------------------------------------------- sync */

/*
 * Headroom of a sequence's next appends.  Every list keeps room for
 * `entries` new entries after each following sync of seq (1 ..
 * kvt_config.headroom; 0, the default, = kvt_config.headroom): ask for what
 * the next append needs (a prefill chunk of 300, then 1 per decode step)
 * and the lists hold ceil((len + entries) / page_tokens) pages, not the
 * registration's worst case for their whole life.  It is sent with each
 * sync of seq and takes effect when that sync is accepted: the headroom in
 * force (kvt_kv_ptr's bound, n_new's bound at the next sync) is the
 * registration's after kvt_seq_open, then what the last accepted sync
 * asked.  So set it before the sync that precedes the change: before the
 * last prefill sync to 1 for decode.  KVT_EHEADROOM beyond the
 * registration's headroom, KVT_ENOSEQ for an unknown sequence.
 */
KVT_API int kvt_seq_headroom(kvt_client *c, kvt_seq seq, uint32_t entries);

/*
 * Room for `entries` new entries now, for an engine that learns the next
 * append's size only when it comes (a question after a decoded answer):
 * kvt_seq_headroom(seq, entries), then, when the headroom in force is
 * smaller, a sync of seq with no new entries (phase prefill), which
 * carries it; the following appends have room for `entries`.  Call it with
 * nothing appended since the last sync: that sync may compact the lists,
 * which would move rows written into the headroom.  Errors as
 * kvt_seq_headroom and kvt_sync (on an error the headroom in force is
 * unchanged).
 */
KVT_API int kvt_seq_reserve(kvt_client *c, kvt_seq seq, uint32_t entries);

/*
 * One sequence's part of a sync: n_new entries were appended to every list
 * of layers [layer_lo, layer_hi) (layer_hi 0 means all layers).
 */
struct kvt_sync_item {
	kvt_seq seq;
	uint32_t n_new;
	uint32_t phase; /* enum kvt_phase */
	uint32_t layer_lo;
	uint32_t layer_hi;
};

/*
 * Commits the appended entries of n items (distinct sequences) and applies
 * the policy.  All items are validated before anything changes: on an error
 * no sequence changed.  Blocks until the daemon replied.  The library adds
 * each sequence's sync counter, so a resent or stale sync is refused
 * (KVT_ESTALE) rather than committed twice.  n 0 is a no-op (0; items may
 * then be NULL).
 *
 * One sync per sequence at a time: a sequence whose kvt_sync_async is in
 * flight is refused by kvt_sync, kvt_sync_async and kvt_seq_close with
 * KVT_EBUSY (and by kvt_list_get, kvt_kv_ptr with KVT_EBUSY, kvt_stage_*
 * with NULL) until kvt_wait.
 *
 * What the engine may assume after the result of kvt_sync, or of kvt_wait
 * for kvt_sync_async (whose own return is 0 or one of the codes below):
 *   0             applied to every item.
 *   KVT_ETIMEDOUT unknown: the daemon may apply it later or may not (it
 *   KVT_EPROTO    was stopped or overloaded; the reply was unreadable).
 *                 Every sequence of the sync is then in doubt: kvt_sync
 *                 and kvt_sync_async of it return KVT_ESTALE, its lists
 *                 read KVT_EBUSY (kvt_stage_* NULL), until kvt_seq_query
 *                 says whether it was applied and makes it usable again.
 *                 Sequences of the client not in that sync are unaffected.
 *   KVT_ECONN     the daemon is gone, and every sequence with it (see
 *                 kvt_disconnect); applied or not does not matter.
 *   any other     not applied: nothing changed, on the daemon (which
 *                 validates every item before it changes anything) nor
 *                 here; the reason is in kvt_last_error.
 */
KVT_API int kvt_sync(kvt_client *c, const struct kvt_sync_item *items,
                     size_t n);

typedef uint32_t kvt_ticket;

/* The ticket of a sync of no items: kvt_wait answers 0 at once.  Never
 * the ticket of a real sync. */
#define KVT_TICKET_NONE ((kvt_ticket)0)

/*
 * Starts a sync and returns at once with a ticket; kvt_wait() completes it.
 * Until then the lists of those sequences must not be read or appended to.
 * At most 16 syncs are in flight per client (KVT_EBUSY beyond), one per
 * sequence (see kvt_sync).  Results as for kvt_sync; n 0 gives
 * KVT_TICKET_NONE.
 */
KVT_API int kvt_sync_async(kvt_client *c, const struct kvt_sync_item *items,
                           size_t n, kvt_ticket *out);

/* Waits for a ticket; returns the sync's result (see kvt_sync).  KVT_EINVAL
 * for a ticket not in flight (never issued, or waited for already). */
KVT_API int kvt_wait(kvt_client *c, kvt_ticket t);

/*
 * What the daemon applied at the last accepted sync of this client
 * (kvt_sync, or the kvt_wait that completed last): under pool pressure
 * budgets shrink to B - floor(B * pressure / 2) and thresholds rise
 * (docs/policies.md), and this is where an engine sees it.
 */
struct kvt_sync_info {
	float pressure;  /* memory-pressure level its decisions applied, 0..1
	                    (to 1e-6) */
	uint32_t budget; /* entries per (sequence, layer, KV head) list the
	                    policy's budget allowed, pressure applied: for a
	                    tokens budget the same for every list, for a ratio
	                    budget that of the sync's longest (sequence,
	                    layer); 0 when the policy has no entry budget
	                    (full, threshold=) */
	uint64_t syncs;  /* accepted syncs of this client so far, a sync whose
	                    reply never came counted once kvt_seq_query finds
	                    it applied (0: none, and the fields above are 0;
	                    they are those of the last reply that came) */
};
KVT_API int kvt_last_sync(const kvt_client *c, struct kvt_sync_info *out);

/* ---------------------------------------------------------------- device */

/*
 * Where the pages live.  With kvtrimd --backend cpu they are host memory;
 * with --backend cuda they are CUDA device memory (VMM or legacy IPC
 * allocations of the daemon's GPU 0, imported into this process by
 * libkvtrim through libkvtrim-cuda.so, loaded with dlopen: libkvtrim never
 * links CUDA).  On a cuda tenant kvt_page_ptr() and kvt_kv_ptr() return
 * device addresses, for the engine's kernels only.  kvt_list_get() reads
 * the host table; kvt_table_view() gives the device copy of it.  The
 * staging rows (kvt_stage_*) are device memory too.
 */
enum kvt_memory {
	KVT_MEMORY_HOST = 0,
	KVT_MEMORY_CUDA = 1,
};

/* KVT_MEMORY_HOST or KVT_MEMORY_CUDA (fixed at kvt_connect). */
KVT_API int kvt_memory_kind(const kvt_client *c);

/*
 * Cuda tenants: the cudaStream_t (passed as void *) on which the engine
 * writes K/V and runs attention; NULL (the default) is the legacy default
 * stream.  kvt_sync() and kvt_sync_async() record an interprocess event on
 * it before the request leaves, so the daemon reads and moves entries only
 * after the engine's writes queued so far; after a successful reply
 * (kvt_sync, kvt_wait) the stream is made to wait for the daemon's
 * compaction, so work queued on it afterwards sees the new lists.  Nothing
 * blocks the host.  Ownership: the stream stays the engine's; libkvtrim
 * never creates or destroys it, and it must stay valid until it is
 * replaced or the client is disconnected.  A no-op (0) on host tenants.
 */
KVT_API int kvt_set_stream(kvt_client *c, void *stream);

/*
 * Copies bytes between host memory and this client's pages (either
 * direction, or page to page): a memcpy on a host tenant; on a cuda tenant
 * a copy on the client's stream (kvt_set_stream) followed by a wait for
 * that stream, so the bytes are in place when it returns.  Meant for
 * tools, tests and engines whose K/V is produced on the host; a GPU engine
 * writes pages with its own kernels.  0 (bytes 0 copies nothing, whatever
 * the pointers), KVT_EINVAL (NULL client, a NULL pointer with bytes, or a
 * destination in the table: kvt_table_view's or kvt_list_get's, which only
 * kvtrimd writes), or KVT_ESYS with the CUDA error in kvt_last_error().
 */
KVT_API int kvt_memcpy(kvt_client *c, void *dst, const void *src,
                       size_t bytes);

/*
 * A buffer of `bytes` in the pages' memory kind (kvt_memory_kind), for an
 * engine that computes on the host yet hands kvt_attention its q, out and
 * lse: on a host tenant 64-byte aligned host memory, on a cuda tenant
 * device memory of this process (shared with no one; the engine's kernels,
 * kvt_memcpy and kvt_attention use it).  Zero-filled.  *out gets the
 * address (NULL on failure).  The client owns the buffer: kvt_buffer_free
 * gives it back, and kvt_disconnect frees every buffer still allocated.
 * 0, KVT_EINVAL (NULL client or out, bytes 0), KVT_ENOMEM (host memory),
 * KVT_ESYS (a CUDA error, device memory exhausted included), KVT_ECONN
 * (daemon gone); the reason in kvt_last_error().
 */
KVT_API int kvt_buffer_alloc(kvt_client *c, size_t bytes, void **out);

/*
 * Frees a buffer of kvt_buffer_alloc on this client; p NULL does nothing.
 * Works on a dead client too (the memory is this process's).  KVT_EINVAL,
 * changing nothing, for a NULL client or a p that is not a live buffer of
 * this client (never allocated here, freed already, or inside a buffer).
 */
KVT_API int kvt_buffer_free(kvt_client *c, void *p);

/*
 * The whole table as a GPU kernel reads it, in the memory of the pages
 * (kvt_memory_kind: host memory on a host tenant, device memory on a cuda
 * tenant, where kvtrimd keeps a device copy of the table segment that its
 * stream updates before the compaction event the client's stream waits
 * on).  The list of (sequence slot s, layer l, KV head h) is the record at
 *
 *   table + records_offset + ((s * n_layers + l) * n_kv_heads + h) * list_stride
 *
 * laid out as struct kvt_list_record; page id p lives at
 *
 *   chunk_bases[p / pages_per_chunk] + (p % pages_per_chunk) * page_bytes
 *
 * (chunk_bases is this process's own array, kept current by libkvtrim on
 * the client's stream).  Ids beyond n_pages are unspecified.  Valid until
 * the next kvt_sync, kvt_wait, kvt_seq_open, kvt_seq_close or
 * kvt_seq_query, which may move chunk_bases; the contents follow every
 * completed sync.
 *
 * The table is read-only to the engine.  The host table is a sealed
 * read-only mapping.  The device copy is mapped read-only where CUDA
 * allows it (VMM sharing: a copy or kernel store into it faults, and
 * kvt_memcpy refuses it as a destination); legacy CUDA IPC sharing
 * (cudaIpcOpenMemHandle) has no read-only mapping, so there a write
 * lands.  Either way kvtrimd never reads this copy for its own work (its
 * kernels resolve page ids through a private device copy it alone
 * writes), so a write can only mislead this engine's own kernels;
 * `kvtrimctl check` reports the records that differ from the table and
 * rewrites them.
 */
struct kvt_list_record {
	uint32_t len;     /* committed entries */
	uint32_t n_pages; /* valid ids in pages[] (headroom included) */
	uint64_t epoch;
	uint32_t pages[]; /* [max_pages] page ids */
};

struct kvt_table_view {
	const void *table;        /* the table (kvt_memory_kind memory) */
	uint64_t records_offset;  /* bytes from table to the first record */
	uint64_t list_stride;     /* bytes between records */
	uint32_t max_seqs, n_layers, n_kv_heads, max_pages;
	void *const *chunk_bases; /* [n_chunk_slots] base of each chunk in
	                             this process, NULL when unmapped; same
	                             memory kind as table */
	uint32_t n_chunk_slots;
	uint32_t pages_per_chunk;
	uint64_t page_bytes;
};
KVT_API int kvt_table_view(const kvt_client *c, struct kvt_table_view *out);

/*
 * The record of one list in the memory kvt_table_view describes, and the
 * sequence's slot (the s above).  Same validity as kvt_table_view.
 */
KVT_API int kvt_list_record(const kvt_client *c, kvt_seq seq,
                            uint32_t layer, uint32_t kv_head,
                            const struct kvt_list_record **out,
                            uint32_t *slot);

/* ---------------------------------------------------------------- attention */

/*
 * The attention an engine runs in one layer for n new tokens of a
 * sequence, over that layer's lists, after writing their K and V
 * (kvt_kv_ptr, k < n) and before the sync that commits them: the new
 * entries sit at len .. len + n - 1 of each KV head's list (len: its
 * committed length, which may differ between heads), and token k of the n
 * (0 <= k < n) sees the first len + k + 1 entries (causal inside the
 * chunk, so a prefill of n tokens at once equals n single steps).  Query
 * head h reads KV head h / (n_heads / n_kv_heads); with
 * scale = 1 / sqrt(head_dim), over those entries i:
 *   out[k][h][:] = sum_i softmax_i(q[k][h] . K_i * scale) V_i
 *   lse[k][h]    = log sum_i exp(q[k][h] . K_i * scale)   (natural log)
 * Shapes, float32 (pages in the tenant's dtype, f32, f16 or bf16):
 *   q   [n][n_heads][head_dim]   post-RoPE queries (as kvt_stage_q wants)
 *   out [n][n_heads][head_dim]
 *   lse [n][n_heads]             (as kvt_stage_lse wants)
 * out and lse must not overlap q.
 *
 * Memory and timing follow kvt_memory_kind, where the engine computes:
 * on a host tenant q, out and lse are host memory and the CPU kernel has
 * written out and lse when the call returns; on a cuda tenant they are
 * CUDA device memory of this process (KVT_EINVAL otherwise), and the CUDA
 * kernel is queued on the client's stream (kvt_set_stream) after the work
 * already queued there (the engine's K/V writes) and returns at once:
 * out and lse are ready for work queued on that stream afterwards.  It
 * reads the device copy of the table, so no bytes cross between host and
 * device; head_dim up to 256 there (KVT_ENOTSUP beyond).
 *
 * n 0 computes nothing (q, out and lse may then be NULL).  Every argument
 * is checked before anything is computed; an error writes nothing and
 * kvt_last_error says why: KVT_EINVAL (NULL client, NULL pointer with
 * n > 0, layer out of range, out or lse overlapping q or each other or
 * lying in the table, on
 * cuda a pointer that is not device memory), KVT_ENOSEQ (not an open sequence), KVT_EBUSY (its sync is in
 * flight), KVT_EHEADROOM (n beyond the headroom), KVT_EPROTO (a list
 * without the pages of its len + n entries: a daemon bug), KVT_ENOMEM
 * (host buffers, allocated on the first call), KVT_ESYS (CUDA error),
 * KVT_ECONN (daemon gone).
 */
KVT_API int kvt_attention(kvt_client *c, kvt_seq seq, uint32_t layer,
                          uint32_t n, const float *q, float *out,
                          float *lse);

/*
 * kvt_attention for many (sequence, layer) at once, as a batched step of
 * an engine needs: item i attends n new tokens of its sequence in its
 * layer with its scale (0: 1 / sqrt(head_dim); a model with another
 * softmax scale passes its own), q, out and lse shaped and placed as for
 * kvt_attention.  Every item is checked before any is computed (the
 * error's text names the item), so an error writes nothing; then they run
 * in order (on a cuda tenant queued on the client's stream).  Items may
 * name the same sequence in different layers.  n_items 0 does nothing.
 */
struct kvt_attend_item {
	kvt_seq seq;
	uint32_t layer;
	uint32_t n;       /* new tokens of this item */
	float scale;      /* softmax scale; 0 = 1 / sqrt(head_dim) */
	const float *q;   /* [n][n_heads][head_dim] */
	float *out;       /* [n][n_heads][head_dim] */
	float *lse;       /* [n][n_heads] */
};
KVT_API int kvt_attend(kvt_client *c, const struct kvt_attend_item *items,
                       size_t n_items);

/* ---------------------------------------------------------------- stats */

struct kvt_tenant_stats {
	uint64_t pages_used;
	uint64_t pages_free;  /* free pages inside this tenant's chunks */
	uint64_t chunks;
	uint64_t sequences;
	uint64_t syncs;
	uint64_t entries_kept;
	uint64_t entries_appended;
	uint64_t entries_evicted;
	uint64_t quota_bytes;
	uint64_t daemon_bytes; /* daemon memory outside the pool this tenant's
	                          geometry may need at most (admitted when
	                          <= kvtrimd's tenant_memory_max) */
	uint64_t pressure_ppm; /* memory-pressure level in force now (the next
	                          sync applies it), in millionths: 1000000 =
	                          level 1, where budgets are halved */
	uint64_t budget;       /* entries per list the policy's budget allowed
	                          at the tenant's last sync, pressure applied
	                          (0: no entry budget; see kvt_last_sync) */
	uint64_t reserved[4];
};

/* The daemon's accounting for this client's tenant. */
KVT_API int kvt_stats(kvt_client *c, struct kvt_tenant_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVTRIM_H */
