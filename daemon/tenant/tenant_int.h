/*
 * tenant_int.h — what the files of the tenant module share, private to them
 * (tenant.h is the interface the server uses).  Include it only from:
 *
 *   tenant.c        lifecycle: admission (name, quota, the daemon-memory
 *                   estimate), the table and staging segments, the device
 *                   stream and events, free, accessors and stats
 *   tenant_pages.c  chunks and pages: allocation from the pool, the free
 *                   page stacks, revocation, the event queue and its flush
 *   tenant_table.c  the table records mirroring the lists, and their upload
 *   tenant_stage.c  the staging rows: unstaged marks, the rows a sync reads
 *   tenant_seq.c    sequences: open, fork, close, query
 *   tenant_sync.c   the sync: validation, decisions, then application
 *   tenant_device.c the device's part of a sync (waits, scratch, keys
 *                   staged to the host, chunk bases, scorer, norms,
 *                   compaction)
 *   tenant_window.c end-of-prefill selections on the device (a policy's
 *                   end-of-prefill rule, planned by the policy:
 *                   policy_ops.prompt)
 *   tenant_attn.c   the policies' device rules run at every sync
 *                   (policy_ops.device) and their per-entry state
 *   tenant_scorer.c device scorers shared by the tenants whose weights are
 *                   the same, and the syncs' runs they share
 *   tenant_check.c  the invariant checker
 *
 * State and who owns it:
 *   - private (authoritative): per list len, n_pages, epoch and page ids,
 *     per sequence slot the original position of every entry and the tokens
 *     seen per layer, per chunk a stack of free page indexes.
 *   - table segment: a mirror of the per-list state, written after every
 *     change.  The daemon never reads it back for a decision.  Its memfd is
 *     sealed with F_SEAL_FUTURE_WRITE once the daemon has its own writable
 *     mapping, so the client can neither map it writable nor write() it:
 *     tenant_check's comparison of table and private state sees only the
 *     daemon's writes.
 *
 * Every entry point works in two halves: a first half that may fail and
 * changes nothing visible (validation, policy decisions into scratch
 * buffers, page accounting, creating the chunks the operation will need,
 * reserving event queue room), and a second half that cannot fail.  Chunks
 * created by the first half are destroyed again when a later step of it
 * fails, so an error return leaves the tenant exactly as it was.  The
 * helpers below say which half they belong to.
 *
 * Threads: the thread that owns the tenant (the loop, or a sync worker
 * while it runs), writes_done_cb in tenant_device.c excepted.
 */
#ifndef KVT_TENANT_INT_H
#define KVT_TENANT_INT_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend.h"
#include "page.h"
#include "policy.h"
#include "pool.h"
#include "seqid.h"
#include "shm.h"
#include "tenant.h"

/* Per list state; the table record mirrors it. */
struct tlist {
	uint32_t len;     /* committed entries */
	uint32_t n_pages; /* pages held = ceil((len + room) / page_tokens),
	                     room the sequence's headroom in force */
	uint64_t epoch;   /* bumped by every change, monotonic per slot */
};

/* One sequence slot. */
struct tseq {
	int open;
	int used;         /* opened at least once: its table records were
	                     written (tenant_check reads only those) */
	uint32_t gen;     /* in the id (ipc/seqid.h); never 0, bumped on
	                     close, at most SEQID_GEN_MAX */
	uint32_t counter; /* syncs accepted since open */
	uint32_t room;    /* headroom in force: entries every list has room
	                     for until the next sync (the registration's at
	                     open, then what each sync asked; <= g.headroom) */
	uint32_t mark;    /* sync serial, for duplicate detection */
	uint64_t last_no; /* the client's number ("n") of the last sync
	                     applied to it; 0 when none since open */
	uint64_t void_no; /* a seq_query gave up the client's sync of this
	                     number (it had not arrived): syncs numbered up
	                     to it are refused; 0 when none */
	uint64_t open_no; /* the client's number of the seq_open that opened
	                     it (0: unnumbered) */
	/* Allocated while open: */
	uint32_t *n_seen; /* [n_layers] tokens seen per layer */
	uint32_t *pages;  /* [lists_per_seq][max_pages] page ids */
	uint32_t *pos;    /* [lists_per_seq][pos_cap] original positions,
	                     same order as the entries; only [0, len) valid */
	float *ent;       /* [lists_per_seq][pos_cap][entry_floats] policy
	                     state per entry, moved like pos; NULL when the
	                     policy keeps none */
	uint8_t *state;   /* [n_layers][layer_state_bytes] policy state per
	                     layer, zeroed at open; NULL when none */
};

/* One chunk slot of the tenant. */
struct tchunk {
	struct pool_chunk pc; /* pc.base NULL: slot unused */
	uint64_t serial;      /* names the chunk in REVOKE / CHUNK_CLOSED */
	uint32_t *free;       /* [pages_per_chunk] stack of free page indexes */
	uint32_t n_free;
};

/* A list's drops at a sync, as ascending indices (n of them at idx), when
 * the device decided it (tenant_attn_take); idx NULL: the list's marks in
 * t->scr.drop say. */
struct tenant_ldrop {
	const uint32_t *idx;
	uint32_t n;
};

/* The device's part of a sync (tenant_device.c): the stream and its events,
 * the wait for the engine's writes, and the scratch of the batched
 * compaction, of the keys staged to the host and of the chunk bases. */
struct tdsync {
	int failed;    /* a device call of an apply step failed */
	void *stream;
	struct kvt_backend_event ev_writes, ev_compact;
	struct kvt_backend_compact *blist; /* [blist_cap] lists of one sync */
	size_t blist_cap;
	void **bpages;     /* [bpages_cap] their page addresses */
	size_t bpages_cap;
	uint32_t *bmoves;  /* [bmoves_cap] their moves, (dst, src) pairs */
	size_t bmoves_cap;
	char *kbuf;        /* [kbuf_cap] host copy of one layer's K halves */
	size_t kbuf_cap;
	const void **ksrc; /* [ksrc_cap] device addresses of those K halves */
	size_t ksrc_cap;
	/* tenant_sync_ready: 0 idle, 1 waiting for the engine's writes on
	 * the stream, 2 they are done (set by writes_done_cb on a driver
	 * thread, hence atomic); wake(wake_arg) tells the server. */
	int kv_wait;
	void (*wake)(void *);
	void *wake_arg;
	/* Backends with compact_drops: the daemon's own chunk bases in device
	 * memory, which that op resolves page ids through, and the host copy
	 * of what was last uploaded there (brought up to date before each
	 * compaction; NULL without the op); a sync's lists, and those of
	 * them that move with their drop indices. */
	void **dbases;     /* device [max_chunks] */
	void **hbases;     /* [max_chunks] */
	struct tenant_ldrop *ldrop; /* [ldrop_cap] a sync's lists, in order */
	size_t ldrop_cap;
	struct kvt_backend_drops *bdl; /* [bdl_cap] a sync's lists that move */
	size_t bdl_cap;
	uint32_t *bdrops;  /* [bdrops_cap] their drop indices, ascending */
	size_t bdrops_cap;
};

/* Device copies of the table segment (tenant_table.c): shared, with the
 * client, which the engine's kernels read (kvt_table_view; mapped
 * read-only there where the sharing mode allows, but an engine may still
 * write it: legacy IPC, or its own cuMemSetAccess), and own, device memory
 * of this process alone, the one the daemon's kernels resolve page ids
 * through (tenant_paged): they never follow an id an engine could have
 * written.  Both are written together, by one upload of the records
 * tenant_mirror() changed since the last tenant_table_flush. */
struct tdtable {
	struct kvt_backend_chunk shared;
	void *own;                        /* [g.table_bytes] */
	struct kvt_backend_region *dirty; /* [2 * max_seqs * lists_per_seq] */
	uint32_t n_dirty;
};

/* Device staging (tenant_stage.c; policies that read staged inputs on a
 * device backend with fill_words; chunk.base NULL otherwise): the staging
 * rows in device memory, the host segment keeping only its header.  A sync
 * copies the rows its policy may read (the new ones and lookback before
 * them) into ring with read_regions; the rows of the next positions are
 * marked unstaged on the device, the pattern ppat of word offsets in each
 * row the runs prun name (one or two per sequence, all layers at once),
 * flushed with the table. */
struct tdstage {
	struct kvt_backend_chunk chunk;
	float *ring;         /* [headroom + lookback][stage_entry_floats] */
	const void **rsrc;   /* [headroom + lookback] their device rows */
	uint32_t ring_first, ring_n; /* positions ring holds */
	uint32_t ring_lb;    /* of which the first ring_lb are lookback rows, */
	int ring_lb_ok;      /* read (stage_row reads them when first asked) */
	int ring_err;        /* a failed lazy read: fails the sync */
	uint32_t *ppat;      /* [n_ppat] words of a row marked unstaged */
	uint32_t n_ppat;
	struct kvt_backend_fill_run *prun; /* [TENANT_POISON_RUNS] */
	uint32_t n_prun;
	/* the last tenant_stage_poison call, which the next may extend by a
	 * layer: its slot, layer, first position, rows, and runs (1 or 2) */
	uint32_t pslot, player, pfrom, pn, pruns;
};

/* Scores computed on the device (tenant_device.c).  With device staging
 * and a policy whose only input is x scored by its scorer (ops->scorer):
 * the scorer on the device, and per sync the jobs (rows of x in
 * device staging) and their scores [rows][n_kv_heads] in pre, passed to
 * decide() as policy_layer.pre; x is then never copied to the host.  A
 * policy that reads only its new keys' norms (ops->new_key_norms) on a
 * backend with key_norms: norms, and they are computed on the device into
 * pre too, no key copied to the host. */
struct tdscore {
	struct tscorer_hold *scorer;        /* NULL without (tenant_scorer.c) */
	struct kvt_backend_score_job *jobs; /* [jobs_cap] */
	size_t jobs_cap;
	int norms;
	struct kvt_backend_norm_job *njobs; /* [njobs_cap] */
	size_t njobs_cap;
	float *pre;          /* [pre_cap] */
	size_t pre_cap;
};

/* End-of-prefill selection on the device (tenant_window.c: a policy
 * with an end-of-prefill rule, policy_ops.prompt, on a backend with its
 * device rule): per (item, layer) of a sync its way (enum tenant_win,
 * mode), its first job (widx) and how many (wn); the backend's rule (looked up once, its
 * layout checked), its params, the jobs (job_bytes each) with what the
 * tenant reads back of each (led), and the rule's output words. */
struct twin {
	uint8_t *mode;     /* [mode_cap] */
	size_t mode_cap;
	uint32_t *widx;    /* [widx_cap] */
	size_t widx_cap;
	uint32_t *wn;      /* [wn_cap] */
	size_t wn_cap;
	const struct kvt_backend_rule *rule; /* NULL: none (looked says) */
	int looked;        /* the backend was asked for the rule */
	void *params;      /* [params_bytes] */
	void *jobs;        /* [jobs_cap] jobs */
	size_t jobs_cap;
	struct policy_prompt_job *led; /* [led_cap] */
	size_t led_cap;
	uint32_t *wlen;    /* [wlen_cap] each job's list length */
	size_t wlen_cap;
	uint32_t *out;     /* [out_cap] */
	size_t out_cap;
	uint32_t n_jobs;
	int active;        /* this sync was planned (tenant_window_plan) */
};

/* A policy's rule run on the device at every sync (tenant_attn.c: a
 * policy with a device rule, policy.h's struct policy_device_rule, on a
 * backend with the rule of its name, struct kvt_backend_rule): the
 * policy's rule and the backend's, the shape of its state, the state in
 * device memory (records of two halves, (slot, layer) major), the half
 * each record's state is in, the plan's word per (slot, layer), the
 * rule's per-(slot, layer) buffers and uploaded tensors on the device,
 * and per sync each (item, layer)'s way (enum tenant_attn), the jobs (the
 * backend's, and the host's view of each) and the output words. */
struct tattn {
	const struct policy_device_rule *dr; /* the policy's */
	const struct kvt_backend_rule *rule; /* the backend's, its layout
	                                        checked; NULL: the host
	                                        decides */
	struct policy_dev_shape shape;
	void *state;       /* device, NULL when the host decides */
	uint8_t *cur;      /* [max_seqs * n_layers * shape.records] */
	uint32_t *word;    /* [max_seqs * n_layers] the plan's words */
	void *layers;      /* device: [max_seqs * n_layers] buffers of
	                      shape.layer_bytes; NULL when 0 */
	void *consts;      /* device: the policy's upload; NULL without */
	void *params;      /* [dr->params_bytes] a run's params */
	uint32_t *llen;    /* [n_kv_heads] a (slot, layer)'s lists' lengths */
	const uint32_t **lpos; /* [n_kv_heads] and positions, for the plan */
	uint8_t *mode;     /* [mode_cap] */
	size_t mode_cap;
	uint32_t *first;   /* [first_cap] the first job of each (item, layer),
	                      then the end */
	size_t first_cap;
	struct policy_dev_job *jobs; /* [jobs_cap] */
	size_t jobs_cap;
	void *bjobs;       /* [bjobs_cap] the backend's jobs of the rule */
	size_t bjobs_cap;
	uint32_t *out;     /* [out_cap] */
	size_t out_cap;
	uint32_t n_jobs;
	int active;        /* this sync was planned (tenant_attn_plan) */
	float *dpre;       /* device: a sync's scores [rows][n_kv_heads] as
	                      the scorer wrote them there (a rule with
	                      takes_pre); NULL otherwise */
	size_t dpre_cap;   /* floats */
	size_t dpre_n;     /* of them this sync's */
};

/* Scratch of tenant_sync (tenant_sync.c), grown on demand. */
struct tscratch {
	uint8_t *drop;     /* [drop_cap] drop marks of every list of a sync */
	size_t drop_cap;
	uint32_t *newlen;  /* [newlen_cap] per list of a sync: its new length,
	                      then (pass 1 -> 2) the pages it must hold */
	size_t newlen_cap;
	uint32_t *moves;   /* [max_tokens][2] compaction plan of one list */
	void **pagev;      /* [n_kv_heads][max_pages] page pointers, one row
	                      per head of the layer being decided */
	float *ent;        /* [ent_cap] entry states of every list of a sync:
	                      what decide() rewrites, committed after pass 3 */
	size_t ent_cap;
	uint8_t *state;    /* [state_cap] layer states of a sync, likewise */
	size_t state_cap;
	struct policy_head *heads; /* [n_kv_heads] */
	float *in;         /* staged inputs of the new tokens, contiguous:
	                      x [headroom][d_model], q [headroom][n_heads *
	                      head_dim], lse [headroom][n_heads]; NULL when
	                      the policy reads none */
};

struct tenant {
	uint32_t id;
	char name[KVT_NAME_MAX];
	struct shm_geom g;
	struct policy *pol;
	struct pool *pool;
	uint64_t quota;
	struct tenant_mem mem;  /* daemon memory it may cause, at admission */
	uint32_t max_chunks;    /* quota / KVT_CHUNK_BYTES */
	struct pool_account *acct[POOL_SHARES]; /* tenant_limits.acct */
	uint32_t lists_per_seq; /* n_layers * n_kv_heads */
	uint32_t pos_cap;       /* max_tokens + headroom */

	int table_fd, stage_fd;
	void *table; /* [g.table_bytes] read-write mapping */
	void *stage; /* [g.stage_bytes] read-write mapping */

	struct tchunk *chunks; /* [max_chunks] */
	uint32_t n_chunks;     /* live chunk slots */
	/* Running totals, so tenant_stats (called around every sync) costs
	 * nothing; tenant_check recomputes and compares them. */
	uint64_t free_pages;   /* sum of n_free over live chunks */
	uint64_t kept;         /* sum of len over open lists */
	uint32_t alloc_cur;    /* chunk being drained by tenant_page_alloc,
	                          or TENANT_NO_CHUNK */
	uint64_t scorer_ns;    /* time in policy_decide during the last sync */
	uint64_t sync_cpu_ns;  /* the thread's CPU time in the last sync */
	uint32_t gather_us;    /* the device scorer may wait this long for
	                          other tenants' syncs (tenant_set_gather) */

	/* Revoked chunks, destroyed after their REVOKE event was sent (legacy
	 * IPC chunks: after the client said CHUNK_CLOSED). */
	struct tdead *dead; /* [dead_cap] */
	uint32_t n_dead, dead_cap;
	uint64_t chunk_serial; /* last serial given to a chunk */

	/* Backend of the pool's chunks.  dev: they are device memory the
	 * daemon must never dereference; then the device parts below are used
	 * (each zero on a host tenant, whose sync never enters their files). */
	const struct kvt_backend_ops *bops;
	void *bctx;
	int dev;
	int ipc_share; /* legacy IPC chunks: freed after CHUNK_CLOSED */
	struct tdsync dsync;   /* tenant_device.c */
	struct tdtable dtable; /* tenant_table.c */
	struct tdstage dstage; /* tenant_stage.c */
	struct tdscore dscore; /* tenant_device.c */
	struct twin win;       /* tenant_window.c */
	struct tattn attn;     /* tenant_attn.c */

	struct tenant_event *ev; /* [ev_cap] queued, in order */
	uint32_t n_ev, ev_cap;
	uint32_t revoke_set; /* tenant_revoke_empty: index in ev of the
	                        CHUNK_REVOKE_SET being filled, or
	                        TENANT_NO_CHUNK */

	struct tseq *seqs;   /* [max_seqs] */
	struct tlist *lists; /* [max_seqs][lists_per_seq] */
	uint32_t n_open;
	uint32_t serial;
	uint64_t open_no;       /* the client's number of its latest seq_open
	                           (tenant_seq_reconcile), 0 before any */
	uint64_t sync_no;       /* the highest number of a sync that reached
	                           the tenant, applied or refused
	                           (tenant_sync), 0 before any */

	uint64_t syncs, appended, evicted;
	float pressure;         /* last tenant_set_pressure level */
	uint32_t sync_press;    /* the last sync's pressure, IPC_PRESS_ONE = 1 */
	uint32_t sync_budget;   /* and its budget per list (0: none) */
	uint32_t ef;            /* pol->entry_floats */
	size_t sbytes;          /* pol->layer_state_bytes */

	struct tscratch scr; /* tenant_sync.c */
};

/* A revoked chunk not destroyed yet. */
struct tdead {
	struct pool_chunk pc;
	uint64_t serial;
};

#define TENANT_NO_CHUNK UINT32_MAX /* alloc_cur: no chunk being drained */

/* ------------------------------------------------------------ indexing */

/* Pages a list of len entries holds when its sequence keeps room for
 * `room` more: ceil((len + room) / page_tokens). */
static inline uint32_t pages_for(const struct shm_geom *g, uint32_t len,
                                 uint32_t room)
{
	return (uint32_t)(((uint64_t)len + room + g->page_tokens - 1) /
	                  g->page_tokens);
}

static inline struct tlist *tlist_at(const struct tenant *t, uint32_t slot,
                                     uint32_t layer, uint32_t head)
{
	return &t->lists[((size_t)slot * t->g.n_layers + layer) *
	                         t->g.n_kv_heads +
	                 head];
}

/* Index of (layer, head) inside a sequence's arrays. */
static inline size_t lidx(const struct tenant *t, uint32_t layer,
                          uint32_t head)
{
	return (size_t)layer * t->g.n_kv_heads + head;
}

static inline uint32_t *seq_pages(const struct tenant *t,
                                  const struct tseq *s, size_t li)
{
	return s->pages + li * t->g.max_pages;
}

static inline uint32_t *seq_pos(const struct tenant *t, const struct tseq *s,
                                size_t li)
{
	return s->pos + li * t->pos_cap;
}

static inline float *seq_ent(const struct tenant *t, const struct tseq *s,
                             size_t li)
{
	return s->ent ? s->ent + li * t->pos_cap * t->ef : NULL;
}

static inline void *seq_state(const struct tenant *t, const struct tseq *s,
                              uint32_t layer)
{
	return s->state ? s->state + (size_t)layer * t->sbytes : NULL;
}

/* The headroom an item asks its sequence to keep after the sync. */
static inline uint32_t item_room(const struct tenant *t, const struct ipc_sync_item *it)
{
	return it->headroom ? it->headroom : t->g.headroom;
}

/* Layer range of an item after defaults; 0 or KVT_ELAYERS. */
static inline int item_layers(const struct tenant *t, const struct ipc_sync_item *it,
                       uint32_t *lo, uint32_t *hi)
{
	*lo = it->layer_lo;
	*hi = it->layer_hi ? it->layer_hi : t->g.n_layers;
	if (*lo >= *hi || *hi > t->g.n_layers)
		return KVT_ELAYERS;
	return 0;
}

/* The per-item prologue of steps 2 and 4, on an item validate() passed:
 * its sequence, slot and layer range. */
static inline struct tseq *item_seq(struct tenant *t,
                                    const struct ipc_sync_item *it,
                                    uint32_t *slot, uint32_t *lo,
                                    uint32_t *hi)
{
	*slot = seqid_slot(it->seq);
	item_layers(t, it, lo, hi);
	return &t->seqs[*slot];
}

struct policy_layer;

/* How a (sequence, layer) of a sync is decided (tenant_window.c). */
enum tenant_win {
	TENANT_WIN_HOST = 0, /* policy_decide on the host, as always */
	TENANT_WIN_DEVICE,   /* the device rule's jobs decide it (their
	                        drops, or none where the rule keeps all) */
};

/*
 * Device tenant of a policy with an end-of-prefill rule
 * (policy_ops.prompt) on a backend with its device rule (any other
 * tenant: nothing, every layer stays on the host): before the decisions,
 * picks the way of each (item, layer) of the sync (t->win.mode, widx, wn)
 * and runs the device rule for those it can take: where the policy
 * decides now, every list still holds each position at its index and the
 * policy's plan takes it; the others stay on the host.  t->scr.state is
 * used as scratch (the decision loop refills it).  0, or KVT_ENOMEM / a
 * backend error with the reason in err (KVT_ENOTSUP: the backend's rule
 * has another layout than this kvtrimd's).
 */
int tenant_window_plan(struct tenant *t, const struct ipc_sync_item *items,
                       uint32_t n, char *err, size_t errlen);

/*
 * In the decision loop, for the (item, layer) ly of the sync whose heads
 * are set up (t->scr.heads): 1 when the device decided it (the policy's
 * state marked as decide() would, the drops marked in the heads), 0 when
 * the host decides (also when the device found a staged row that is not
 * finite: the host then refuses with the reason).
 */
int tenant_window_take(struct tenant *t, size_t ly, struct policy_layer *pl);

/* Whether the (item, layer) ly of this sync goes to the host: not
 * planned for the device, or a job of it found a staged row that is not
 * finite. */
static inline int tenant_window_host(const struct tenant *t, size_t ly)
{
	if (!t->win.active || t->win.mode[ly] == TENANT_WIN_HOST)
		return 1;
	for (uint32_t k = 0; k < t->win.wn[ly]; k++)
		if (t->win.out[t->win.widx[ly] + k])
			return 1;
	return 0;
}

/* How a (sequence, layer) of a sync is decided (tenant_attn.c). */
enum tenant_attn {
	TENANT_ATTN_HOST = 0, /* policy_decide on the host */
	TENANT_ATTN_DEVICE,   /* the device rule's drops */
	TENANT_ATTN_FLAGGED,  /* the device found a new row not finite: the
	                         host path refuses the sync */
};

/* Allocates the device state of the policy's device rule when it has one
 * (policy_ops.device) and the backend the rule of its name (device_init);
 * 0 or an error with the reason in err (KVT_ENOTSUP: the backend's rule
 * has another layout than this build's header).  tenant_attn_fini frees
 * it. */
int tenant_attn_init(struct tenant *t, char *err, size_t errlen);
void tenant_attn_fini(struct tenant *t);

/* kvt_seq_fork: slot dst's device state (both halves of its records,
 * their current halves, the plan's words, the rule's per-layer buffers)
 * becomes slot src's, the copies queued on the tenant's stream; 0, or
 * KVT_ESYS when a copy fails (the tenant is then broken, as after any
 * failed device op). */
int tenant_attn_fork(struct tenant *t, uint32_t dst, uint32_t src);

/* tenant_reload_policy: np's tensors to the device (the rule's upload),
 * the old ones kept on failure; 0 or an error with the reason. */
int tenant_attn_reload(struct tenant *t, const struct policy *np, char *err,
                       size_t errlen);

/*
 * Before the decisions of a sync of such a tenant: one run of the device
 * rule over the jobs its policy plans for the sync (a list, or a
 * (sequence, layer), each: the state updated and, where due, the
 * selection and the state's compaction, into the half not current), the
 * counts checked against the host's.  0, or an error with the reason.
 */
int tenant_attn_plan(struct tenant *t, const struct ipc_sync_item *items,
                     uint32_t n, char *err, size_t errlen);

/* The n positions of list (slot, layer, head) as the device rule's state
 * holds them now (its record's half cur), into dst [n] (tenant_dpos):
 * after the work queued on the tenant's stream.  0, or the backend's
 * error. */
int tenant_attn_read_pos(const struct tenant *t, uint32_t slot,
                         uint32_t layer, uint32_t head, uint32_t n,
                         uint32_t *dst);

/* After the rule's run of tenant_attn_plan, over the nly (item, layer)s
 * of its jobs: each job's output words against its plan (flag, count,
 * indices ascending below L); a flagged job's layer goes to the host
 * (TENANT_ATTN_FLAGGED); with the rule's drop_bound a count up to the
 * job's n_drop becomes its n_drop.  0, or KVT_ESYS with the reason (a
 * count that is not the plan's, beyond the bound, or indices out of
 * order), attn.active then 0. */
int tenant_attn_check(struct tenant *t, size_t nly, char *err,
                      size_t errlen);

/* Before the sync's scorer run: room for fresh scores in device memory
 * where the policy's rule reads them there (takes_pre), its address in
 * *dev (NULL: none wanted); 0 or an error. */
int tenant_attn_pre(struct tenant *t, size_t fresh, float **dev, char *err,
                    size_t errlen);

/* In the decision loop: 1 when the device decided (item, layer) ly, its
 * drops as indices in ld [n_kv_heads] (the heads' marks untouched: a pass
 * over the lists the host need not make), else 0.  Once per layer, after
 * stage_layer laid it out in scr.heads (a POLICY_DEV_LAYER job's indices
 * are split by those lengths, in place). */
int tenant_attn_take(struct tenant *t, size_t ly, struct tenant_ldrop *ld);

/* After the sync's last check: the new halves become current. */
void tenant_attn_commit(struct tenant *t);

static inline int tenant_attn_mode(const struct tenant *t, size_t ly)
{
	return t->attn.active ? t->attn.mode[ly] : TENANT_ATTN_HOST;
}

/* Whether the lists' positions live in the device rule's state only
 * (policy_dev_shape.positions): then a sync neither writes nor moves the
 * host's copy (seq_pos), which holds nothing, and whoever needs them
 * reads them back (tenant_attn_read_pos). */
static inline int tenant_dpos(const struct tenant *t)
{
	return t->attn.state && t->attn.shape.positions;
}

/* Whether the host decides (item, layer) ly of this sync. */
static inline int tenant_attn_host(const struct tenant *t, size_t ly)
{
	return tenant_attn_mode(t, ly) != TENANT_ATTN_DEVICE;
}

/* Device staging's row layout, as the device selections take it. */
static inline struct kvt_backend_rows tenant_rows(const struct tenant *t)
{
	return (struct kvt_backend_rows){
		.stage_tokens = t->g.stage_tokens,
		.row_floats = (uint32_t)t->g.stage_entry_floats,
		.q_off = (uint32_t)t->g.stage_q_off,
		.lse_off = (uint32_t)t->g.stage_lse_off,
	};
}

/* The (item, layer)s of a sync validate() passed, and its entries (every
 * list's len + n_new: a bound on its drops). */
static inline void tenant_sync_extent(struct tenant *t,
                                      const struct ipc_sync_item *items,
                                      uint32_t n, size_t *nly,
                                      size_t *entries)
{
	*nly = *entries = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t slot, lo, hi;
		(void)item_seq(t, &items[i], &slot, &lo, &hi);
		*nly += hi - lo;
		for (uint32_t layer = lo; layer < hi; layer++)
			for (uint32_t h = 0; h < t->g.n_kv_heads; h++)
				*entries += tlist_at(t, slot, layer, h)->len +
				            items[i].n_new;
	}
}

/* Grows *p to at least want elements of elem bytes (*cap counts them),
 * by half its size at least: a sync's scratch follows its lists' lengths,
 * which grow a little every sync, and a reallocation of megabytes each time
 * (a copy and fresh pages to fault in) would cost more than the sync's
 * own work.  KVT_ENOMEM leaves it as it was. */
static inline int tenant_grow(void **p, size_t *cap, size_t want, size_t elem)
{
	if (want <= *cap)
		return 0;
	if (!elem || want > SIZE_MAX / elem)
		return KVT_ENOMEM;
	size_t n = *cap + *cap / 2; /* wraps below want where it overflows */
	if (n < want || n > SIZE_MAX / elem)
		n = want;
	void *q = realloc(*p, n * elem);
	if (!q)
		return KVT_ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

/* tenant_grow for scratch whose contents need not survive: the old
 * block freed, not copied (a sync's marks and entry states are written
 * before they are read; where a device decides, never touched: only
 * there, since a fresh block's pages fault in anew where they are all
 * written).  KVT_ENOMEM leaves it empty (*p NULL, *cap 0). */
static inline int tenant_grow_fresh(void **p, size_t *cap, size_t want,
                                    size_t elem)
{
	if (want <= *cap)
		return 0;
	if (!elem || want > SIZE_MAX / elem)
		return KVT_ENOMEM;
	size_t n = *cap + *cap / 2;
	if (n < want || n > SIZE_MAX / elem)
		n = want;
	free(*p);
	*p = malloc(n * elem);
	*cap = *p ? n : 0;
	return *p ? 0 : KVT_ENOMEM;
}

/* Base address of page id (a device address on a device tenant: never
 * dereferenced there). */
static inline void *page_ptr(const struct tenant *t, uint32_t id)
{
	const struct shm_geom *g = &t->g;
	return (char *)t->chunks[page_chunk(id, g->pages_per_chunk)].pc.base +
	       page_offset(id, g->pages_per_chunk, g->page_bytes);
}

/* ---------------------------------------------------- tenant_pages.c */

/*
 * First half of every page-changing operation: makes sure `need` pages can
 * be allocated once `freed` pages have been returned, creating chunks now if
 * the free pages do not suffice (KVT_EQUOTA past the quota, KVT_EPOOLFULL
 * past the pool, with a reason in err when err is not NULL).  Also reserves
 * room for every event and dead chunk the operation can produce, so the
 * second half cannot fail.  On error nothing changed.  On success the ADD
 * events are queued.
 */
int tenant_reserve_pages(struct tenant *t, uint64_t need, uint64_t freed,
                         char *err, size_t errlen);

/*
 * tenant_reserve_pages' limits alone, changing nothing: KVT_EQUOTA,
 * KVT_EPOOLFULL (the reason in err) when `need` pages would need chunks
 * beyond the quota, the uid's or process's share or the pool; else 0 and
 * in *k the chunks to create.  Cheap enough to ask before building what
 * an operation needs (a parked seq_open is asked again often).
 */
int tenant_pages_check(const struct tenant *t, uint64_t need, uint64_t freed,
                       uint64_t *k, char *err, size_t errlen);

/*
 * Second half: takes one free page (the caller's tenant_reserve_pages made
 * sure there is one), draining the fullest chunk first, and gives a page
 * back.  Neither fails.
 */
uint32_t tenant_page_alloc(struct tenant *t);
void tenant_page_free(struct tenant *t, uint32_t id);

/*
 * End of every page-changing operation: revokes the chunks that are now
 * completely free (REVOKE queued, memory destroyed by tenant_flush_events)
 * and resets the allocation cursor.  Uses the room tenant_reserve_pages
 * reserved; cannot fail.
 */
void tenant_revoke_empty(struct tenant *t);

/* Grows *arr (of *cap elements of elem bytes) by doubling to hold at least
 * want; KVT_ENOMEM leaves it as it was. */
int tenant_ensure_room(void **arr, uint32_t *cap, uint32_t want, size_t elem);

/* ---------------------------------------------------- tenant_stage.c */

/*
 * Writes POLICY_UNSTAGED into the staging ring rows of positions
 * [from, from + n) of (slot, layer), in the inputs the policy reads, so a
 * row the engine does not stage before the sync that commits it is refused
 * (policy.h).  Called at open and after every sync for the positions the
 * sequence may append next; a no-op for policies reading no staged input.
 */
/* Runs of device staging rows marked unstaged per fill_words call at
 * most (a full buffer is flushed early). */
#define TENANT_POISON_RUNS 1024u

/* Device staging: queues the marks tenant_stage_poison collected (the
 * table flush calls it before recording COMPACT); 0 or a KVT_E*. */
int tenant_stage_poison_flush(struct tenant *t);

void tenant_stage_poison(struct tenant *t, uint32_t slot, uint32_t layer,
                         uint32_t from, uint32_t n);

/* What tenant_stage_row reads: the (sequence, layer) of a decision and the
 * tokens seen after the sync. */
struct tenant_stage_ctx {
	struct tenant *t;
	uint32_t slot, layer, n_seen;
};

/* policy_layer's staged accessor (ctx: a struct tenant_stage_ctx): the
 * staged row of an earlier position within the lookback, from the host
 * segment or the host copy of device staging; NULL when out of reach or
 * when a device read failed (its code in t->dstage.ring_err fails the sync). */
const float *tenant_stage_row(void *ctx, uint32_t pos);

/* Device staging: the rows of the new positions [first, first + n) of
 * (slot, layer), after the policy's lookback, copied into t->dstage.ring; 0 or
 * a backend error. */
int tenant_fetch_rows(struct tenant *t, uint32_t slot, uint32_t layer,
                      uint32_t first, uint32_t n);

/* The staged inputs the policy reads of positions [first, first + n),
 * copied out of the ring into t->scr.in and pointed at by pl (n <= headroom,
 * validated). */
void tenant_gather_inputs(struct tenant *t, uint32_t slot, uint32_t layer,
                          uint32_t first, uint32_t n,
                          struct policy_layer *pl);

/* --------------------------------------------------- tenant_device.c */

/* The backend's device rule called name into *out: NULL when the backend
 * has none of that name that runs (the host decides); KVT_ENOTSUP with the
 * reason when its layout (version, params and job bytes) is not the one
 * given, the policy's header's this kvtrimd was built with. */
int tenant_rule_lookup(const struct tenant *t, const char *name,
                       uint32_t version, uint32_t params_bytes,
                       uint32_t job_bytes,
                       const struct kvt_backend_rule **out, char *err,
                       size_t errlen);

/* Whether job j's output words of a device rule's run over n jobs
 * (backend.h, struct kvt_backend_rule: out[n + j] drops, their indices at
 * out[2 n + drop_off]) are what the host planned: n_drop of them,
 * strictly ascending, each below L, the job's entries. */
int tenant_rule_drops_ok(const uint32_t *out, uint32_t n, uint32_t j,
                         uint32_t n_drop, uint32_t drop_off, uint32_t L);

/* Bytes of a page a device tenant stages on the host for its policy: the
 * K half, or the whole page for a policy that reads V. */
size_t tenant_staged_page_bytes(const struct tenant *t);

/* Device tenant, first half of a sync over nlists lists of entries
 * entries, fresh of them new: the scratch the apply step needs (it cannot
 * fail later) and the stream's wait for the engine's writes; 0 or an error
 * with the reason. */
int tenant_device_prepare(struct tenant *t, size_t nlists, size_t entries,
                          size_t fresh,
                          char *err, size_t errlen);

/* Device tenant, a policy that reads K: the pages holding entries
 * [0, len) of a list (ids pg) are queued for a host copy in t->dsync.kbuf
 * (*nk counts them) and pv points the policy at those copies. */
void tenant_stage_keys(struct tenant *t, const uint32_t *pg, uint32_t len,
                       void **pv, uint32_t *nk);

/* Device tenant with compact_drops: queues the upload of the daemon's
 * chunk bases when a chunk came or went since the last one (the ops that
 * resolve page ids read them); 0 or a backend error. */
int tenant_bases_sync(struct tenant *t);

/* Where the tenant's pages are on the device, as the ops that resolve page
 * ids there take it: the daemon's own device table (dtable.own), never the
 * one shared with the client. */
struct kvt_backend_paged tenant_paged(const struct tenant *t);

/* Queues the compaction of the sync's nb lists that move (t->dsync.bdl,
 * t->dsync.bdrops) in one compact_drops; 0 or a backend error. */
int tenant_compact_on_device(struct tenant *t, uint32_t nb);

/* The key norms of the new entries of every list of the sync, computed on
 * the device into t->dscore.pre ([n_new][n_kv_heads] per (item, layer), in the
 * decisions' order); 0 or a backend error. */
int tenant_norms_on_device(struct tenant *t,
                           const struct ipc_sync_item *items, uint32_t n);

/* The device scorer's scores of the new rows of x of every (item, layer)
 * of the sync, into t->dscore.pre in the decisions' order, in a run shared
 * with other tenants' syncs (tscorer_run); fresh: the sync's new entries
 * (validate's count, the device copy's size); 0 or an error. */
int tenant_score_on_device(struct tenant *t,
                           const struct ipc_sync_item *items, uint32_t n,
                           size_t fresh, char *err, size_t errlen);

/* --------------------------------------------------- tenant_scorer.c */

/*
 * A tenant's hold on a device scorer: the entry holding the device copy of
 * the weights, which every tenant whose weights are the same byte for byte
 * shares (struct tscorer, private to tenant_scorer.c; the pool lists them),
 * and the tenant's host tensors, its policy's, compared with a newcomer's.
 */
struct tscorer_hold {
	struct tscorer *e;
	struct tscorer_hold *next; /* the entry's holds */
	const float **w;           /* [n_layers][KVT_SCORER_TENSORS], owned;
	                              the tensors are the policy's */
};

/*
 * A hold on the device scorer of d, whose tensors are w (taken: freed with
 * the hold or on failure; they must stay valid until tscorer_put): the
 * pool's entry of the same kind, sizes and bytes on the same backend
 * context, or a new entry with the weights uploaded.  0 or an error.  Loop
 * thread.
 */
int tscorer_get(struct pool *pool, const struct kvt_backend_ops *o,
                void *bctx, const struct kvt_backend_scorer *d,
                const float **w, struct tscorer_hold **out, char *err,
                size_t errlen);

/* Drops a hold; the last one frees the device copy.  NULL-safe.  Loop
 * thread, with no sync of the holder running. */
void tscorer_put(struct tscorer_hold *h);

/* The content hash entries are looked up by (kind, sizes, then every
 * tensor's bytes, FNV-1a 8 bytes a step from each tensor's start); a hit is
 * then compared byte for byte.  Exposed for its test. */
uint64_t tscorer_hash(const struct kvt_backend_scorer *d);

/* Tenants holding h's entry. */
uint32_t tscorer_holders(const struct tscorer_hold *h);

/*
 * Scores the n jobs into out ([rows][d_out]) as scorer_run does, after the
 * work queued on stream, in one run with the jobs of the other holders'
 * syncs that are queued by then (waiting up to gather_us for more; 0 never
 * waits for anyone to arrive, only for a run in progress).  Blocks until out
 * is filled (out NULL: every job's dev, its device copy, alone).  0 or an
 * error (a failed shared run fails every sync it served, each with the
 * reason).
 */
int tscorer_run(struct tscorer_hold *h,
                const struct kvt_backend_score_job *jobs, uint32_t n,
                float *out, void *stream, uint32_t gather_us, char *err,
                size_t errlen);

/* ------------------------------------------------------ tenant_seq.c */

/* The open slot a sequence id names, or -1. */
int64_t tenant_seq_slot(const struct tenant *t, uint64_t seq);

/* Frees a slot's per-sequence arrays and NULLs them (NULL-safe each). */
void tenant_seq_release(struct tseq *s);

/* ---------------------------------------------------- tenant_table.c */

/*
 * Writes the private state of one list into its table record, and on a
 * device tenant notes the record for tenant_table_flush.  Call it at most
 * once per list per operation (the dirty array holds one entry per list).
 */
void tenant_mirror(struct tenant *t, uint32_t slot, uint32_t layer,
                   uint32_t head);

/*
 * Device tenants, at the end of an operation that changed lists: queues
 * the upload of the records tenant_mirror noted, then the COMPACT event.
 * 0 on a host tenant; a failure marks the tenant failed (the server drops
 * it) and returns the backend's code.
 */
int tenant_table_flush(struct tenant *t);

#endif
