/*
 * tenant.c — one registered engine: chunks, pages, sequences, page lists and
 * the sync algorithm; see tenant.h.
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
 * fails, so an error return leaves the tenant exactly as it was.
 */
#include "errors.h"
#include "tenant.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include "compact.h"
#include "policy.h"

/* Per list state; the table record mirrors it. */
struct tlist {
	uint32_t len;     /* committed entries */
	uint32_t n_pages; /* pages held = ceil((len + headroom) / page_tokens) */
	uint64_t epoch;   /* bumped by every change, monotonic per slot */
};

/* One sequence slot. */
struct tseq {
	int open;
	int used;         /* opened at least once: its table records were
	                     written (tenant_check reads only those) */
	uint32_t gen;     /* id = gen << 32 | slot; never 0, bumped on close */
	uint32_t counter; /* syncs accepted since open */
	uint32_t mark;    /* sync serial, for duplicate detection */
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

struct tenant {
	uint32_t id;
	char name[KVT_NAME_MAX];
	struct shm_geom g;
	struct policy *pol;
	struct pool *pool;
	uint64_t quota;
	struct tenant_mem mem;  /* daemon memory it may cause, at admission */
	uint32_t max_chunks;    /* quota / KVT_CHUNK_BYTES */
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
	uint32_t alloc_cur;    /* chunk being drained by page_alloc, or -1 */
	uint64_t scorer_ns;    /* time in policy_decide during the last sync */

	/* Revoked chunks, destroyed after their REVOKE event was sent (legacy
	 * IPC chunks: after the client said CHUNK_CLOSED). */
	struct tdead *dead; /* [dead_cap] */
	uint32_t n_dead, dead_cap;
	uint64_t chunk_serial; /* last serial given to a chunk */

	/* Backend of the pool's chunks.  dev: they are device memory the
	 * daemon must never dereference; then stream, events and the
	 * batched-compaction and key-staging scratch below are used. */
	const struct kvt_backend_ops *bops;
	void *bctx;
	int dev;
	int ipc_share; /* legacy IPC chunks: freed after CHUNK_CLOSED */
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
	/* Device copy of the table segment, which the engine's kernels read
	 * (kvt_table_view), and the records mirror() changed since it was
	 * last brought up to date (table_flush). */
	struct kvt_backend_chunk dtab;
	struct kvt_backend_region *dirty; /* [max_seqs * lists_per_seq] */
	uint32_t n_dirty;

	struct tenant_event *ev; /* [ev_cap] queued, in order */
	uint32_t n_ev, ev_cap;

	struct tseq *seqs;   /* [max_seqs] */
	struct tlist *lists; /* [max_seqs][lists_per_seq] */
	uint32_t n_open;
	uint32_t serial;

	uint64_t syncs, appended, evicted;
	float pressure;         /* last tenant_set_pressure level */
	uint32_t ef;            /* pol->entry_floats */
	size_t sbytes;          /* pol->layer_state_bytes */

	/* Scratch of tenant_sync, grown on demand. */
	uint8_t *drop;     /* [drop_cap] drop marks of every list of a sync */
	size_t drop_cap;
	uint32_t *newlen;  /* [newlen_cap] per list of a sync: its new length,
	                      then (pass 1 -> 2) the pages it must hold */
	size_t newlen_cap;
	uint32_t *moves;   /* [max_tokens][2] compaction plan of one list */
	void **pagev;      /* [n_kv_heads][max_pages] page pointers, one row
	                      per head of the layer being decided */
	float *ent_scr;    /* [ent_cap] entry states of every list of a sync:
	                      what decide() rewrites, committed after pass 3 */
	size_t ent_cap;
	uint8_t *state_scr; /* [state_cap] layer states of a sync, likewise */
	size_t state_cap;
	struct policy_head *heads; /* [n_kv_heads] */
	float *in;         /* staged inputs of the new tokens, contiguous:
	                      x [headroom][d_model], q [headroom][n_heads *
	                      head_dim], lse [headroom][n_heads]; NULL when
	                      the policy reads none */
};

/* A revoked chunk not destroyed yet. */
struct tdead {
	struct pool_chunk pc;
	uint64_t serial;
};

/* What the staged-row accessor of policy_layer needs. */
struct stage_ctx {
	struct tenant *t;
	uint32_t slot, layer, n_seen;
};

#define NO_CHUNK UINT32_MAX

static uint32_t pages_for(const struct shm_geom *g, uint32_t len)
{
	return (uint32_t)(((uint64_t)len + g->headroom + g->page_tokens - 1) /
	                  g->page_tokens);
}

static struct tlist *tlist_at(const struct tenant *t, uint32_t slot,
                              uint32_t layer, uint32_t head)
{
	return &t->lists[((size_t)slot * t->g.n_layers + layer) *
	                         t->g.n_kv_heads +
	                 head];
}

/* Index of (layer, head) inside a sequence's arrays. */
static size_t lidx(const struct tenant *t, uint32_t layer, uint32_t head)
{
	return (size_t)layer * t->g.n_kv_heads + head;
}

static uint32_t *seq_pages(const struct tenant *t, const struct tseq *s,
                           size_t li)
{
	return s->pages + li * t->g.max_pages;
}

static uint32_t *seq_pos(const struct tenant *t, const struct tseq *s,
                         size_t li)
{
	return s->pos + li * t->pos_cap;
}

static float *seq_ent(const struct tenant *t, const struct tseq *s,
                      size_t li)
{
	return s->ent ? s->ent + li * t->pos_cap * t->ef : NULL;
}

static void *seq_state(const struct tenant *t, const struct tseq *s,
                       uint32_t layer)
{
	return s->state ? s->state + (size_t)layer * t->sbytes : NULL;
}

/* Base address of page id. */
static void *page_ptr(const struct tenant *t, uint32_t id)
{
	const struct shm_geom *g = &t->g;
	return (char *)t->chunks[id / g->pages_per_chunk].pc.base +
	       (size_t)(id % g->pages_per_chunk) * g->page_bytes;
}

/* Writes the private state of one list into its table record. */
static void mirror(struct tenant *t, uint32_t slot, uint32_t layer,
                   uint32_t head)
{
	const struct tlist *l = tlist_at(t, slot, layer, head);
	struct shm_list *r = shm_list_at(t->table, &t->g, slot, layer, head);
	r->len = l->len;
	r->n_pages = l->n_pages;
	r->epoch = l->epoch;
	if (t->seqs[slot].open)
		memcpy(r->pages,
		       seq_pages(t, &t->seqs[slot], lidx(t, layer, head)),
		       (size_t)l->n_pages * sizeof(uint32_t));
	memset(r->pages + l->n_pages, 0,
	       (size_t)(t->g.max_pages - l->n_pages) * sizeof(uint32_t));
	/* Each list is mirrored at most once per operation, so the array
	 * (one entry per list) cannot overflow; the device copy gets the
	 * header and the valid ids (ids beyond n_pages are unspecified). */
	if (t->dtab.base && t->n_dirty < t->g.max_seqs * t->lists_per_seq)
		t->dirty[t->n_dirty++] = (struct kvt_backend_region){
			.off = (uint64_t)((char *)r - (char *)t->table),
			.bytes = sizeof(*r) + (uint64_t)l->n_pages * sizeof(uint32_t),
		};
}

/*
 * Device tenants: queues on the tenant's stream the upload of the records
 * mirror() changed, then the COMPACT event, so the client's stream (which
 * waits on that event after every reply that changes lists) reads the new
 * table.  A failure marks the tenant failed (the server drops it).
 */
static int table_flush(struct tenant *t)
{
	if (!t->dev)
		return 0;
	int rc = 0;
	if (t->n_dirty)
		rc = t->bops->upload_regions(t->bctx, t->dtab.base, t->table,
		                             t->dirty, t->n_dirty, t->stream);
	t->n_dirty = 0;
	if (!rc)
		rc = t->bops->event_record(t->bctx, &t->ev_compact, t->stream);
	if (rc)
		t->failed = 1;
	return rc;
}

/* ------------------------------------------------------------ segments */

/*
 * A shared segment of `bytes`, mapped read-write here.  seals are added
 * after the daemon's own mapping exists, so F_SEAL_FUTURE_WRITE leaves that
 * mapping writable and refuses every later writable mapping, write() and
 * hole punch, whoever holds the fd (a reopened /proc/PID/fd path too: seals
 * belong to the file).  Sealing beats sending an O_RDONLY fd reopened
 * through /proc: the client could reopen that one read-write.
 */
static int segment_new(const char *name, uint64_t bytes, unsigned seals,
                       int *fd_out, void **map_out)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return KVT_ESYS;
	if (ftruncate(fd, (off_t)bytes) < 0) {
		close(fd);
		return KVT_ESYS;
	}
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return KVT_ESYS;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | seals |
	                               F_SEAL_SEAL) < 0) {
		munmap(m, bytes);
		close(fd);
		return KVT_ESYS;
	}
	*fd_out = fd;
	*map_out = m;
	return 0;
}

/* ------------------------------------------------------------ pages */

/*
 * Takes one free page.  Drains the fullest chunk first (fewest free pages,
 * lowest slot on ties), which keeps chunks dense and lets the others empty
 * out and be revoked.  The caller has made sure enough pages are free.
 */
static uint32_t page_alloc(struct tenant *t)
{
	if (t->alloc_cur == NO_CHUNK || !t->chunks[t->alloc_cur].n_free) {
		uint32_t best = NO_CHUNK;
		for (uint32_t i = 0; i < t->max_chunks; i++) {
			const struct tchunk *c = &t->chunks[i];
			if (c->pc.base && c->n_free &&
			    (best == NO_CHUNK ||
			     c->n_free < t->chunks[best].n_free))
				best = i;
		}
		t->alloc_cur = best;
	}
	struct tchunk *c = &t->chunks[t->alloc_cur];
	t->free_pages--;
	return t->alloc_cur * t->g.pages_per_chunk + c->free[--c->n_free];
}

static void page_free(struct tenant *t, uint32_t id)
{
	struct tchunk *c = &t->chunks[id / t->g.pages_per_chunk];
	c->free[c->n_free++] = id % t->g.pages_per_chunk;
	t->free_pages++;
}

static int ensure_room(void **arr, uint32_t *cap, uint32_t want, size_t elem)
{
	if (want <= *cap)
		return 0;
	uint32_t n = *cap ? *cap : 8;
	while (n < want)
		n = n > UINT32_MAX / 2 ? want : n * 2;
	void *p = realloc(*arr, (size_t)n * elem);
	if (!p)
		return KVT_ENOMEM;
	*arr = p;
	*cap = n;
	return 0;
}

static void chunk_destroy(struct tenant *t, uint32_t slot)
{
	struct tchunk *c = &t->chunks[slot];
	t->free_pages -= c->n_free;
	pool_chunk_free(t->pool, &c->pc);
	free(c->free);
	c->free = NULL;
	c->n_free = 0;
	t->n_chunks--;
}

/*
 * First half of every page-changing operation: makes sure `need` pages can
 * be allocated once `freed` pages have been returned, creating chunks now if
 * the free pages do not suffice.  Also reserves room for every event and
 * dead chunk the operation can produce, so the second half cannot fail.
 * On error nothing changed.  On success the ADD events are queued.
 */
static int reserve_pages(struct tenant *t, uint64_t need, uint64_t freed,
                         char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	uint64_t avail = t->free_pages + freed;
	uint64_t k = 0;
	if (need > avail)
		k = (need - avail + g->pages_per_chunk - 1) / g->pages_per_chunk;
	if (t->n_chunks + k > t->max_chunks)
		return errors_fmt(err, errlen, KVT_EQUOTA,
		            "needs %llu more chunk(s): %u held, quota allows %u",
		            (unsigned long long)k, t->n_chunks, t->max_chunks);
	if (pool_chunks_used(t->pool) + k > t->pool->chunk_capacity)
		return errors_fmt(err, errlen, KVT_EPOOLFULL,
		            "needs %llu more chunk(s); the pool has %llu of %llu "
		            "in use", (unsigned long long)k,
		            (unsigned long long)pool_chunks_used(t->pool),
		            (unsigned long long)t->pool->chunk_capacity);
	/* Every live chunk may be revoked at the end; each new one is added. */
	uint32_t worst = t->n_chunks + (uint32_t)k;
	if (ensure_room((void **)&t->ev, &t->ev_cap, t->n_ev + 2 * worst,
	                sizeof(*t->ev)) ||
	    ensure_room((void **)&t->dead, &t->dead_cap, t->n_dead + worst,
	                sizeof(*t->dead)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");

	uint32_t made[64], *madev = made;
	if (k > sizeof(made) / sizeof(made[0])) {
		madev = malloc((size_t)k * sizeof(*madev));
		if (!madev)
			return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	int rc = 0;
	uint32_t n_made = 0, slot = 0;
	while (n_made < k) {
		while (t->chunks[slot].pc.base) /* lowest free slot */
			slot++;
		struct tchunk *c = &t->chunks[slot];
		c->free = malloc((size_t)g->pages_per_chunk * sizeof(uint32_t));
		if (!c->free) {
			rc = errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
			break;
		}
		rc = pool_chunk_new(t->pool, &c->pc);
		if (rc) {
			free(c->free);
			c->free = NULL;
			c->pc.base = NULL;
			rc = errors_fmt(err, errlen, rc, "cannot create a pool chunk: %s",
			          kvt_strerror(rc));
			break;
		}
		/* Pops give ascending page indexes. */
		for (uint32_t i = 0; i < g->pages_per_chunk; i++)
			c->free[i] = g->pages_per_chunk - 1 - i;
		c->n_free = g->pages_per_chunk;
		c->serial = ++t->chunk_serial;
		t->free_pages += c->n_free;
		t->n_chunks++;
		madev[n_made++] = slot;
	}
	if (rc) {
		/* Destroyed at once: the client never heard of them. */
		for (uint32_t i = 0; i < n_made; i++)
			chunk_destroy(t, madev[i]);
	} else {
		for (uint32_t i = 0; i < n_made; i++) {
			const struct pool_chunk *pc = &t->chunks[madev[i]].pc;
			struct tenant_event *e = &t->ev[t->n_ev++];
			*e = (struct tenant_event){
				.type = t->dev ? HANDLE_CHUNK_DEV
				               : HANDLE_CHUNK_ADD,
				.slot = madev[i],
				.fd = pc->fd,
				.size = KVT_CHUNK_BYTES,
			};
			if (t->dev && pc->fd < 0) /* legacy IPC */
				memcpy(e->data, pc->ipc, sizeof(e->data));
		}
	}
	if (madev != made)
		free(madev);
	return rc;
}

/*
 * End of every page-changing operation: chunks that are now completely free
 * are revoked.  The slot becomes reusable at once (the client processes the
 * REVOKE before any later ADD of the same slot); the memory is destroyed in
 * tenant_flush_events after the REVOKE went out.
 */
static void revoke_empty(struct tenant *t)
{
	for (uint32_t i = 0; i < t->max_chunks; i++) {
		struct tchunk *c = &t->chunks[i];
		if (!c->pc.base || c->n_free != t->g.pages_per_chunk)
			continue;
		t->ev[t->n_ev++] = (struct tenant_event){
			.type = HANDLE_CHUNK_REVOKE, .slot = i, .fd = -1,
			.size = 0, .cookie = t->dev ? c->serial : 0};
		t->dead[t->n_dead++] = (struct tdead){c->pc, c->serial};
		t->free_pages -= c->n_free;
		c->pc.base = NULL;
		c->pc.fd = -1;
		free(c->free);
		c->free = NULL;
		c->n_free = 0;
		t->n_chunks--;
	}
	t->alloc_cur = NO_CHUNK;
}

/* ------------------------------------------------------------ lifetime */

/*
 * Device tenant: its stream and the two interprocess events, whose handles
 * are queued for the client (sent before the segments, see tenant.h).
 */
static int device_init(struct tenant *t, char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	if (!o->stream_new || !o->stream_free || !o->stream_sync ||
	    !o->event_new || !o->event_free || !o->event_record ||
	    !o->stream_wait_event || !o->read_regions || !o->upload_regions)
		return errors_fmt(err, errlen, KVT_ENOTSUP, "the %s backend has no "
		            "streams or events", o->name);
	t->ipc_share = o->share(t->bctx) == KVT_BACKEND_SHARE_IPC;
	int rc;
	if ((rc = o->stream_new(t->bctx, &t->stream)) ||
	    (rc = o->event_new(t->bctx, &t->ev_writes)) ||
	    (rc = o->event_new(t->bctx, &t->ev_compact)))
		return errors_fmt(err, errlen, rc, "%s backend: %s", o->name,
		            o->last_error());
	if (ensure_room((void **)&t->ev, &t->ev_cap, 3, sizeof(*t->ev)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	const struct kvt_backend_event *evs[2] = {&t->ev_writes,
	                                          &t->ev_compact};
	for (uint32_t i = 0; i < 2; i++) {
		struct tenant_event *e = &t->ev[t->n_ev++];
		*e = (struct tenant_event){
			.type = HANDLE_EVENT,
			.slot = i ? HANDLE_EVENT_COMPACT : HANDLE_EVENT_WRITES,
			.fd = -1,
		};
		memcpy(e->data, evs[i]->handle, sizeof(e->data));
	}
	/* The device table: a whole number of chunks (the allocation
	 * granularity), zeroed, then the header; every record starts as the
	 * zeroed host record does (len 0, no pages). */
	uint64_t tb = (t->g.table_bytes + KVT_CHUNK_BYTES - 1) /
	              KVT_CHUNK_BYTES * KVT_CHUNK_BYTES;
	struct kvt_backend_region hdr = {0, sizeof(struct shm_table_hdr)};
	t->dirty = malloc((size_t)t->g.max_seqs * t->lists_per_seq *
	                  sizeof(*t->dirty));
	if (!t->dirty)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	if ((rc = o->chunk_new(t->bctx, tb, &t->dtab)) ||
	    (rc = o->upload_regions(t->bctx, t->dtab.base, t->table, &hdr, 1,
	                            t->stream)) ||
	    (rc = o->event_record(t->bctx, &t->ev_compact, t->stream)))
		return errors_fmt(err, errlen, rc, "%s backend: device table of "
		                  "%llu bytes: %s", o->name,
		                  (unsigned long long)tb, o->last_error());
	struct tenant_event *e = &t->ev[t->n_ev++];
	*e = (struct tenant_event){
		.type = HANDLE_TABLE_DEV,
		.slot = t->max_chunks, /* sizes the client's chunk-base array */
		.fd = t->dtab.fd,
		.size = t->g.table_bytes,
	};
	memcpy(e->data, t->dtab.ipc, sizeof(e->data));
	return 0;
}

static void device_fini(struct tenant *t)
{
	const struct kvt_backend_ops *o = t->bops;
	if (t->stream) {
		o->stream_sync(t->bctx, t->stream);
		o->stream_free(t->bctx, t->stream);
		t->stream = NULL;
	}
	if (t->ev_writes.ev)
		o->event_free(t->bctx, &t->ev_writes);
	if (t->ev_compact.ev)
		o->event_free(t->bctx, &t->ev_compact);
	/* VMM: the driver keeps the memory while the client maps it.  Legacy
	 * IPC: the client is gone or said bye (as for the chunks). */
	o->chunk_free(t->bctx, &t->dtab);
	free(t->dirty);
	t->dirty = NULL;
}

/* ------------------------------------------------------------ admission */

/* Saturating arithmetic: an estimate that wraps would admit anything. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
	return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

static uint64_t mul3(uint64_t a, uint64_t b, uint64_t c)
{
	return mul_sat(mul_sat(a, b), c);
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Per entry of one decide(), bytes of the policies' scratch arena: score,
 * protection, ranking and index arrays (policy_select, snapkv, tova, kvpop
 * each stay below this, the arena's 64-byte rounding included). */
#define TENANT_POLICY_ENTRY_BYTES 64u

/*
 * Each term mirrors an allocation of this file, at the size it reaches at
 * its worst (see struct tenant_mem):
 *   seqs    per open slot (tenant_seq_open): n_seen [n_layers] u32, pages
 *           [lists][max_pages] u32, pos [lists][pos_cap] u32, ent
 *           [lists][pos_cap][entry_floats] f32, state [n_layers][state].
 *   lists   struct tenant, seqs [max_seqs], lists [max_seqs][lists], and on
 *           a device backend the dirty-record array of the same count.
 *   chunks  per chunk of the quota: its slot, its free-page stack
 *           [pages_per_chunk] u32, two events and a revocation (both queues
 *           grow by doubling), and tenant_check's bitmap and slot bases.
 *   scratch tenant_new's fixed buffers (moves, pagev, heads, in), the
 *           scratch of the largest sync (every list of every slot, each at
 *           max_tokens entries: drop, newlen, ent_scr, state_scr; on a
 *           device backend blist, bpages, bmoves, and kbuf, ksrc for
 *           policies that read K), and the policy arena of one decide
 *           (n_kv_heads lists of max_tokens entries; attention policies add
 *           their weights [n_q][G][len] and key rows [len][head_dim] f32,
 *           n_q <= headroom + lookback), twice, as the arena grows by
 *           doubling.
 */
void tenant_memory(const struct shm_geom *g, const struct policy *pol,
                   uint64_t quota, int dev, struct tenant_mem *out)
{
	uint64_t S = g->max_seqs, L = g->n_layers, H = g->n_kv_heads;
	uint64_t LP = L * H, P = (uint64_t)g->max_tokens + g->headroom;
	uint64_t MP = g->max_pages, T = g->max_tokens;
	uint64_t ef = pol->entry_floats, sb = pol->layer_state_bytes;
	uint64_t C = quota / KVT_CHUNK_BYTES, nl = S * LP;
	uint64_t E = mul_sat(nl, T); /* entries of the largest sync */
	unsigned need = pol->ops->needs;
	memset(out, 0, sizeof(*out));

	out->table = g->table_bytes;
	if (dev)
		out->table = add_sat(out->table,
		                     (g->table_bytes + KVT_CHUNK_BYTES - 1) /
		                             KVT_CHUNK_BYTES * KVT_CHUNK_BYTES);
	out->stage = g->stage_bytes;

	uint64_t per_seq = L * 4 + LP * MP * 4;
	per_seq = add_sat(per_seq, mul_sat(LP * P, 4 + 4 * ef));
	per_seq = add_sat(per_seq, mul_sat(L, sb));
	out->seqs = mul_sat(S, per_seq);

	out->lists = sizeof(struct tenant) + S * sizeof(struct tseq) +
	             nl * sizeof(struct tlist);
	if (dev)
		out->lists += nl * sizeof(struct kvt_backend_region);

	uint64_t per_chunk = sizeof(struct tchunk) +
	                     (uint64_t)g->pages_per_chunk * 4 +
	                     2 * (2 * sizeof(struct tenant_event) +
	                          sizeof(struct tdead)) +
	                     sizeof(uint64_t) + g->pages_per_chunk / 8 + 1;
	out->chunks = mul_sat(C, per_chunk) + 6 * sizeof(struct tenant_event);

	uint64_t sc = T * 2 * 4 + H * MP * sizeof(void *) +
	              H * sizeof(struct policy_head);
	if (need & POLICY_NEED_STAGED)
		sc = add_sat(sc, mul3(g->headroom, g->stage_entry_floats, 4));
	sc = add_sat(sc, E);                            /* drop */
	sc = add_sat(sc, nl * 4);                       /* newlen */
	sc = add_sat(sc, mul3(E, ef, 4));               /* ent_scr */
	sc = add_sat(sc, mul3(S, L, sb));               /* state_scr */
	if (dev) {
		sc = add_sat(sc, nl * sizeof(struct kvt_backend_compact));
		sc = add_sat(sc, mul3(nl, MP, sizeof(void *)));
		sc = add_sat(sc, mul_sat(E, 8));        /* bmoves */
		if (need & POLICY_NEED_KV)
			sc = add_sat(sc, mul_sat(H * MP,
			                         (uint64_t)g->page_tokens *
			                                 g->head_dim *
			                                 g->elem_bytes +
			                                 sizeof(void *)));
	}
	uint64_t per_entry = TENANT_POLICY_ENTRY_BYTES;
	if (need & POLICY_NEED_Q) {
		uint64_t G = g->n_heads / g->n_kv_heads;
		uint64_t nq = (uint64_t)g->headroom + pol->lookback;
		per_entry += (uint64_t)g->head_dim * 4 + nq * G * 4;
	}
	sc = add_sat(sc, mul3(2, H * T, per_entry));
	out->scratch = sc;

	uint64_t tot = 0;
	const uint64_t parts[] = {out->table, out->stage, out->seqs, out->lists,
	                          out->chunks, out->scratch};
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		tot = add_sat(tot, parts[i]);
	out->total = tot;
}

/* "1.5 GiB", "12 MiB", "300 B": sizes in reason texts. */
static const char *human(uint64_t v, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB",
	                                   "PiB", "EiB"};
	double x = (double)v;
	unsigned u = 0;
	while (x >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		x /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)v);
	else
		snprintf(buf, len, "%.*f %s", x < 10 ? 1 : 0, x, unit[u]);
	return buf;
}

/*
 * The refusal of a hello whose tenant_memory exceeds the cap: the total,
 * every part, and what to lower for the largest part (it fits
 * KVT_ERRTEXT_MAX: the longest form is about 230 bytes).
 */
static int memory_refusal(const struct tenant_mem *m, uint64_t max, char *err,
                          size_t errlen)
{
	char b[8][16];
	const uint64_t part[] = {m->table, m->stage, m->seqs, m->lists,
	                         m->chunks, m->scratch};
	static const char *const fix[] = {
		"lower max_seqs or max_tokens, or raise page_tokens",
		"lower stage_tokens or max_seqs",
		"lower max_seqs or max_tokens",
		"lower max_seqs",
		"lower quota_bytes, or raise page_tokens",
		"lower max_seqs or max_tokens",
	};
	size_t big = 0;
	for (size_t i = 1; i < sizeof(part) / sizeof(part[0]); i++)
		if (part[i] > part[big])
			big = i;
	return errors_fmt(err, errlen, KVT_EQUOTA,
	            "needs %s of daemon memory, over tenant_memory_max %s "
	            "(table %s, staging %s, sequences %s, lists %s, chunks "
	            "%s, scratch %s): %s",
	            human(m->total, b[0], 16), human(max, b[1], 16),
	            human(m->table, b[2], 16), human(m->stage, b[3], 16),
	            human(m->seqs, b[4], 16), human(m->lists, b[5], 16),
	            human(m->chunks, b[6], 16), human(m->scratch, b[7], 16),
	            fix[big]);
}

int tenant_name_check(const char *name, char *err, size_t errlen)
{
	char q[72]; /* the name escaped, truncated: the reason must fit */
	size_t n = strnlen(name, KVT_NAME_MAX);
	if (n >= KVT_NAME_MAX)
		return errors_fmt(err, errlen, KVT_EINVAL, "tenant name longer "
		                  "than %d bytes", KVT_NAME_MAX - 1);
	if (!n)
		return errors_fmt(err, errlen, KVT_EINVAL, "empty tenant name");
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)name[i];
		int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		         (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
		         ch == '-' || ch == '@' || ch == ':';
		if (!ok || (i == 0 && ch >= '0' && ch <= '9')) {
			errors_quote(q, sizeof(q), name);
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "tenant name \"%s\": %s (names are 1..%d "
			            "bytes of A-Z a-z 0-9 . _ - @ :, not "
			            "starting with a digit)", q,
			            ok ? "starts with a digit"
			               : "byte outside the name characters",
			            KVT_NAME_MAX - 1);
		}
	}
	return 0;
}

/*
 * The quota of a hello asking none: default_quota, or the fair share
 * pool / expected_tenants in whole chunks (at least one), capped by
 * max_quota and by the pool.
 */
static uint64_t default_quota_of(const struct tenant_limits *lim,
                                 uint64_t pool_bytes)
{
	uint64_t q = lim->default_quota;
	if (!q) {
		uint64_t n = lim->expected_tenants ? lim->expected_tenants : 1;
		q = pool_bytes / n / KVT_CHUNK_BYTES * KVT_CHUNK_BYTES;
		if (q < KVT_CHUNK_BYTES)
			q = KVT_CHUNK_BYTES;
	}
	if (lim->max_quota && q > lim->max_quota)
		q = lim->max_quota;
	return q < pool_bytes ? q : pool_bytes;
}

int tenant_new(struct pool *pool, uint32_t id, const struct ipc_hello *h,
               struct tenant_limits *lim, struct tenant **out, char *err,
               size_t errlen)
{
	*out = NULL;
	lim->memory_need = 0;
	uint32_t page_tokens = h->page_tokens ? h->page_tokens
	                                      : TENANT_DEF_PAGE_TOKENS;
	uint32_t max_seqs = h->max_seqs ? h->max_seqs : TENANT_DEF_MAX_SEQS;
	uint32_t max_tokens = h->max_tokens ? h->max_tokens
	                                    : TENANT_DEF_MAX_TOKENS;
	/* Default headroom: one page, but never more than a list can hold. */
	uint32_t headroom = h->headroom ? h->headroom
	                    : page_tokens < max_tokens ? page_tokens
	                                               : max_tokens;
	struct shm_geom g;
	int rc = shm_geom_init(&g, &h->geo, (enum kvt_dtype)h->dtype,
	                       page_tokens, max_seqs, max_tokens, headroom,
	                       h->stage_tokens, err, errlen);
	if (rc)
		return rc;
	char name[KVT_NAME_MAX];
	if (h->name[0] && (rc = tenant_name_check(h->name, err, errlen)))
		return rc;
	if (h->name[0])
		snprintf(name, sizeof(name), "%s", h->name);
	else
		snprintf(name, sizeof(name), "tenant-%" PRIu32, id);

	uint64_t pool_bytes = pool_bytes_total(pool);
	uint64_t quota = h->quota_bytes;
	if (!quota)
		quota = default_quota_of(lim, pool_bytes);
	if (quota > pool_bytes)
		return errors_fmt(err, errlen, KVT_EQUOTA,
		            "quota of %llu bytes exceeds the pool (%llu bytes)",
		            (unsigned long long)quota,
		            (unsigned long long)pool_bytes);
	if (quota < KVT_CHUNK_BYTES)
		return errors_fmt(err, errlen, KVT_EQUOTA,
		            "quota of %llu bytes is below one chunk (%llu bytes)",
		            (unsigned long long)quota,
		            (unsigned long long)KVT_CHUNK_BYTES);

	struct policy *pol = NULL;
	struct policy_geom pg = {
		.n_layers = g.n_layers, .n_heads = g.n_heads,
		.n_kv_heads = g.n_kv_heads, .head_dim = g.head_dim,
		.d_model = g.d_model, .page_tokens = g.page_tokens,
		.dtype = (enum kvt_dtype)h->dtype, .headroom = g.headroom,
	};
	rc = policy_create(h->policy[0] ? h->policy : TENANT_DEF_POLICY, &pg,
	                   &pol, err, errlen);
	if (rc)
		return rc;
	/* A sync stages up to headroom new rows; lookback rows before them
	 * must survive in the ring. */
	if ((pol->ops->needs & POLICY_NEED_STAGED) &&
	    g.stage_tokens < (uint64_t)g.headroom + pol->lookback) {
		rc = errors_fmt(err, errlen, KVT_EPOLICY,
		          "policy '%s' needs staged inputs: stage_tokens must be "
		          ">= headroom + %u = %llu, got %u", pol->ops->name,
		          pol->lookback,
		          (unsigned long long)g.headroom + pol->lookback,
		          g.stage_tokens);
		policy_free(pol);
		return rc;
	}
	void *bctx;
	struct tenant_mem mem;
	tenant_memory(&g, pol, quota, !pool_backend(pool, &bctx)->host_visible,
	              &mem);
	lim->memory_need = mem.total;
	if (mem.total > lim->memory_max) {
		policy_free(pol);
		return memory_refusal(&mem, lim->memory_max, err, errlen);
	}

	struct tenant *t = calloc(1, sizeof(*t));
	if (!t) {
		policy_free(pol);
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	t->id = id;
	memcpy(t->name, name, sizeof(t->name));
	t->mem = mem;
	t->g = g;
	t->pol = pol;
	t->pool = pool;
	t->quota = quota;
	t->max_chunks = (uint32_t)(quota / KVT_CHUNK_BYTES);
	t->lists_per_seq = g.n_layers * g.n_kv_heads;
	t->pos_cap = g.max_tokens + g.headroom;
	t->alloc_cur = NO_CHUNK;
	t->table_fd = t->stage_fd = -1;
	t->chunks = calloc(t->max_chunks, sizeof(*t->chunks));
	t->seqs = calloc(g.max_seqs, sizeof(*t->seqs));
	t->lists = calloc((size_t)g.max_seqs * t->lists_per_seq,
	                  sizeof(*t->lists));
	t->ef = pol->entry_floats;
	t->sbytes = pol->layer_state_bytes;
	t->moves = malloc((size_t)g.max_tokens * 2 * sizeof(uint32_t));
	t->pagev = malloc((size_t)g.n_kv_heads * g.max_pages * sizeof(void *));
	t->heads = calloc(g.n_kv_heads, sizeof(*t->heads));
	if (pol->ops->needs & POLICY_NEED_STAGED)
		t->in = malloc((size_t)g.headroom * g.stage_entry_floats *
		               sizeof(float));
	if (!t->chunks || !t->seqs || !t->lists || !t->moves || !t->pagev ||
	    !t->heads || ((pol->ops->needs & POLICY_NEED_STAGED) && !t->in)) {
		tenant_free(t);
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	for (uint32_t i = 0; i < t->max_chunks; i++)
		t->chunks[i].pc.fd = -1;
	for (uint32_t i = 0; i < g.max_seqs; i++)
		t->seqs[i].gen = 1;

	if (segment_new("kvtrim-table", g.table_bytes, F_SEAL_FUTURE_WRITE,
	                &t->table_fd, &t->table) ||
	    segment_new("kvtrim-stage", g.stage_bytes, 0, &t->stage_fd,
	                &t->stage)) {
		tenant_free(t);
		return errors_fmt(err, errlen, KVT_ESYS,
		            "cannot create the table and staging segments");
	}
	shm_table_init(t->table, &g);
	shm_stage_init(t->stage, &g);
	t->bops = pool_backend(pool, &t->bctx);
	t->dev = !t->bops->host_visible;
	if (t->dev && (rc = device_init(t, err, errlen))) {
		tenant_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

static void seq_release_arrays(struct tseq *s)
{
	free(s->n_seen);
	free(s->pages);
	free(s->pos);
	free(s->ent);
	free(s->state);
	s->n_seen = s->pages = s->pos = NULL;
	s->ent = NULL;
	s->state = NULL;
}

void tenant_free(struct tenant *t)
{
	if (!t)
		return;
	/* Queued device work first: it may still touch the chunks. */
	if (t->dev && t->stream)
		t->bops->stream_sync(t->bctx, t->stream);
	if (t->chunks)
		for (uint32_t i = 0; i < t->max_chunks; i++) {
			pool_chunk_free(t->pool, &t->chunks[i].pc);
			free(t->chunks[i].free);
		}
	/* A client that is gone closed its IPC mappings by exiting; one
	 * that said bye is past using them (kvt_disconnect). */
	for (uint32_t i = 0; i < t->n_dead; i++)
		pool_chunk_free(t->pool, &t->dead[i].pc);
	if (t->dev)
		device_fini(t);
	if (t->seqs)
		for (uint32_t i = 0; i < t->g.max_seqs; i++)
			seq_release_arrays(&t->seqs[i]);
	if (t->table)
		munmap(t->table, t->g.table_bytes);
	if (t->stage)
		munmap(t->stage, t->g.stage_bytes);
	if (t->table_fd >= 0)
		close(t->table_fd);
	if (t->stage_fd >= 0)
		close(t->stage_fd);
	policy_free(t->pol);
	free(t->chunks);
	free(t->dead);
	free(t->ev);
	free(t->seqs);
	free(t->lists);
	free(t->drop);
	free(t->newlen);
	free(t->moves);
	free(t->pagev);
	free(t->ent_scr);
	free(t->state_scr);
	free(t->heads);
	free(t->in);
	free(t->blist);
	free(t->bpages);
	free(t->bmoves);
	free(t->kbuf);
	free(t->ksrc);
	free(t);
}

uint32_t tenant_id(const struct tenant *t) { return t->id; }
const char *tenant_name(const struct tenant *t) { return t->name; }
const char *tenant_policy_spec(const struct tenant *t) { return t->pol->spec; }
int tenant_reload_policy(struct tenant *t, char *err, size_t errlen)
{
	const struct policy *old = t->pol;
	struct policy *np;
	if (!strstr(old->spec, "model="))
		return 0;
	int rc = policy_create(old->spec, &old->geom, &np, err, errlen);
	if (rc)
		return rc;
	if (np->entry_floats != old->entry_floats ||
	    np->layer_state_bytes != old->layer_state_bytes ||
	    np->lookback != old->lookback) {
		policy_free(np);
		return errors_fmt(err, errlen, KVT_EPOLICY,
		                  "the new weights change the policy's state "
		                  "layout; re-register the tenant to use them");
	}
	policy_set_pressure(np, t->pressure);
	policy_free(t->pol);
	t->pol = np;
	return 1;
}

uint64_t tenant_scorer_ns(const struct tenant *t) { return t->scorer_ns; }

float tenant_pressure(const struct tenant *t) { return t->pressure; }

void tenant_set_pressure(struct tenant *t, float level)
{
	policy_set_pressure(t->pol, level);
	t->pressure = t->pol->pressure; /* clamped there */
}
const struct shm_geom *tenant_geom(const struct tenant *t) { return &t->g; }
uint64_t tenant_quota(const struct tenant *t) { return t->quota; }
int tenant_table_fd(const struct tenant *t) { return t->table_fd; }
int tenant_stage_fd(const struct tenant *t) { return t->stage_fd; }

/* Live chunks plus revoked ones not yet destroyed: what the pool counts. */
uint64_t tenant_chunks(const struct tenant *t)
{
	return (uint64_t)t->n_chunks + t->n_dead;
}

/* ------------------------------------------------------------ sequences */

/* The open slot an id names, or -1. */
static int64_t seq_slot(const struct tenant *t, uint64_t seq)
{
	uint32_t slot = (uint32_t)seq, gen = (uint32_t)(seq >> 32);
	if (slot >= t->g.max_seqs || !t->seqs[slot].open ||
	    t->seqs[slot].gen != gen)
		return -1;
	return slot;
}

int tenant_seq_open(struct tenant *t, uint64_t *seq)
{
	const struct shm_geom *g = &t->g;
	uint32_t slot = 0;
	while (slot < g->max_seqs && t->seqs[slot].open)
		slot++;
	if (slot == g->max_seqs)
		return KVT_ESEQLIMIT;

	struct tseq *s = &t->seqs[slot];
	s->n_seen = calloc(g->n_layers, sizeof(uint32_t));
	s->pages = calloc((size_t)t->lists_per_seq * g->max_pages,
	                  sizeof(uint32_t));
	s->pos = malloc((size_t)t->lists_per_seq * t->pos_cap *
	                sizeof(uint32_t));
	if (t->ef)
		s->ent = malloc((size_t)t->lists_per_seq * t->pos_cap * t->ef *
		                sizeof(float));
	if (t->sbytes)
		s->state = calloc(g->n_layers, t->sbytes);
	if (!s->n_seen || !s->pages || !s->pos || (t->ef && !s->ent) ||
	    (t->sbytes && !s->state)) {
		seq_release_arrays(s);
		return KVT_ENOMEM;
	}
	uint32_t per_list = pages_for(g, 0);
	int rc = reserve_pages(t, (uint64_t)per_list * t->lists_per_seq, 0,
	                       NULL, 0);
	if (rc) {
		seq_release_arrays(s);
		return rc;
	}

	s->open = 1;
	s->used = 1;
	s->counter = 0;
	t->n_open++;
	for (uint32_t layer = 0; layer < g->n_layers; layer++)
		for (uint32_t head = 0; head < g->n_kv_heads; head++) {
			struct tlist *l = tlist_at(t, slot, layer, head);
			uint32_t *pg = seq_pages(t, s, lidx(t, layer, head));
			for (uint32_t i = 0; i < per_list; i++)
				pg[i] = page_alloc(t);
			l->len = 0;
			l->n_pages = per_list;
			l->epoch++;
			mirror(t, slot, layer, head);
		}
	revoke_empty(t); /* resets the allocation cursor; nothing is empty */
	*seq = ((uint64_t)s->gen << 32) | slot;
	return table_flush(t) ? KVT_ESYS : 0;
}

int tenant_seq_close(struct tenant *t, uint64_t seq)
{
	int64_t sl = seq_slot(t, seq);
	if (sl < 0)
		return KVT_ENOSEQ;
	uint32_t slot = (uint32_t)sl;
	struct tseq *s = &t->seqs[slot];
	for (uint32_t layer = 0; layer < t->g.n_layers; layer++)
		for (uint32_t head = 0; head < t->g.n_kv_heads; head++) {
			struct tlist *l = tlist_at(t, slot, layer, head);
			uint32_t *pg = seq_pages(t, s, lidx(t, layer, head));
			for (uint32_t i = 0; i < l->n_pages; i++)
				page_free(t, pg[i]);
			t->kept -= l->len;
			l->len = 0;
			l->n_pages = 0;
			l->epoch++;
		}
	s->open = 0;
	/* Generation 0 is never issued, so id 0 is never valid. */
	s->gen = s->gen == UINT32_MAX ? 1 : s->gen + 1;
	s->counter = 0;
	t->n_open--;
	for (uint32_t layer = 0; layer < t->g.n_layers; layer++)
		for (uint32_t head = 0; head < t->g.n_kv_heads; head++)
			mirror(t, slot, layer, head);
	seq_release_arrays(s);
	revoke_empty(t);
	return table_flush(t) ? KVT_ESYS : 0;
}

/* ------------------------------------------------------------ sync */

/* Runs on a driver thread (or inline) once the tenant stream passed the
 * engine's writes: no backend calls here, only the flag and the wakeup. */
static void writes_done_cb(void *arg)
{
	struct tenant *t = arg;
	__atomic_store_n(&t->kv_wait, 2, __ATOMIC_RELEASE);
	t->wake(t->wake_arg);
}

int tenant_sync_ready(struct tenant *t, void (*wake)(void *), void *arg)
{
	const struct kvt_backend_ops *o = t->bops;
	if (!t->dev || !(t->pol->ops->needs & POLICY_NEED_KV) ||
	    !o->stream_notify)
		return 1;
	int st = __atomic_load_n(&t->kv_wait, __ATOMIC_ACQUIRE);
	if (st == 1)
		return 0;
	if (st == 2) {
		/* The writes this sync's keys come from were recorded before
		 * its request left the engine, so before the wait queued for
		 * it or for an earlier request: they are done. */
		t->kv_wait = 0;
		return 1;
	}
	t->wake = wake;
	t->wake_arg = arg;
	/* 1 first: the callback may run before stream_notify returns. */
	__atomic_store_n(&t->kv_wait, 1, __ATOMIC_RELEASE);
	if (o->stream_wait_event(t->bctx, t->stream, &t->ev_writes) ||
	    o->stream_notify(t->bctx, t->stream, writes_done_cb, t)) {
		/* The sync will wait on the host instead; it reports a
		 * device failure itself. */
		__atomic_store_n(&t->kv_wait, 0, __ATOMIC_RELEASE);
		return 1;
	}
	if (__atomic_load_n(&t->kv_wait, __ATOMIC_ACQUIRE) == 2) {
		t->kv_wait = 0;
		return 1;
	}
	return 0;
}

/* Layer range of an item after defaults; 0 or KVT_ELAYERS. */
static int item_layers(const struct tenant *t, const struct ipc_sync_item *it,
                       uint32_t *lo, uint32_t *hi)
{
	*lo = it->layer_lo;
	*hi = it->layer_hi ? it->layer_hi : t->g.n_layers;
	if (*lo >= *hi || *hi > t->g.n_layers)
		return KVT_ELAYERS;
	return 0;
}

/* Step 1: every check that needs no policy decision.  Returns the number of
 * list entries (len + n_new summed over lists) the decisions need. */
static int validate(struct tenant *t, const struct ipc_sync_item *items,
                    uint32_t n, size_t *entries, size_t *lists, char *err,
                    size_t errlen)
{
	const struct shm_geom *g = &t->g;
	if (!items || !n)
		return errors_fmt(err, errlen, KVT_EINVAL, "sync without items");
	if (++t->serial == 0) {
		/* Wrapped: forget old marks so none can collide. */
		for (uint32_t i = 0; i < g->max_seqs; i++)
			t->seqs[i].mark = 0;
		t->serial = 1;
	}
	size_t ent = 0, nl = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		int64_t sl = seq_slot(t, it->seq);
		if (sl < 0)
			return errors_fmt(err, errlen, KVT_ENOSEQ,
			            "item %u: no open sequence %#llx", i,
			            (unsigned long long)it->seq);
		struct tseq *s = &t->seqs[sl];
		if (s->mark == t->serial)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "item %u: sequence %#llx appears twice", i,
			            (unsigned long long)it->seq);
		s->mark = t->serial;
		if (it->counter != s->counter)
			return errors_fmt(err, errlen, KVT_ESTALE,
			            "item %u: sync counter %u, expected %u", i,
			            it->counter, s->counter);
		if (it->phase > KVT_PHASE_DECODE)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "item %u: unknown phase %u", i, it->phase);
		uint32_t lo, hi;
		if (item_layers(t, it, &lo, &hi))
			return errors_fmt(err, errlen, KVT_ELAYERS,
			            "item %u: layers [%u, %u) not within [0, %u)",
			            i, it->layer_lo, it->layer_hi, g->n_layers);
		if (it->n_new > g->headroom)
			return errors_fmt(err, errlen, KVT_EHEADROOM,
			            "item %u: %u new entries, headroom is %u", i,
			            it->n_new, g->headroom);
		if ((t->pol->ops->needs & POLICY_NEED_STAGED) &&
		    it->n_new > g->stage_tokens)
			return errors_fmt(err, errlen, KVT_EHEADROOM,
			            "item %u: %u new entries, staging ring holds "
			            "%u", i, it->n_new, g->stage_tokens);
		for (uint32_t layer = lo; layer < hi; layer++) {
			if ((uint64_t)s->n_seen[layer] + it->n_new > UINT32_MAX)
				return errors_fmt(err, errlen, KVT_ETOOLONG,
				            "item %u: layer %u: positions exhausted",
				            i, layer);
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				uint32_t len = tlist_at(t, (uint32_t)sl, layer,
				                        head)->len;
				if ((uint64_t)len + it->n_new > g->max_tokens)
					return errors_fmt(err, errlen, KVT_ETOOLONG,
					            "item %u: layer %u head %u: "
					            "%u + %u entries exceed "
					            "max_tokens %u", i, layer,
					            head, len, it->n_new,
					            g->max_tokens);
				ent += (size_t)len + it->n_new;
				nl++;
			}
		}
	}
	*entries = ent;
	*lists = nl;
	return 0;
}

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
	if (want <= *cap)
		return 0;
	void *q = realloc(*p, want * elem);
	if (!q)
		return KVT_ENOMEM;
	*p = q;
	*cap = want;
	return 0;
}

/* Staged row of an earlier position, for policies with lookback. */
static const float *stage_row(void *ctx, uint32_t pos)
{
	const struct stage_ctx *c = ctx;
	const struct tenant *t = c->t;
	if (pos >= c->n_seen || (uint64_t)pos + t->g.stage_tokens < c->n_seen)
		return NULL;
	return shm_stage_at(t->stage, &t->g, c->slot, c->layer, pos);
}

/*
 * Copies the staged inputs of positions [first, first + n) out of the ring
 * (which the client may keep writing) into t->in, contiguous, and points
 * pl at them.  n <= headroom (validated).
 */
static void gather_inputs(struct tenant *t, uint32_t slot, uint32_t layer,
                          uint32_t first, uint32_t n,
                          struct policy_layer *pl)
{
	const struct shm_geom *g = &t->g;
	size_t nq = (size_t)g->n_heads * g->head_dim;
	float *x = t->in;
	float *q = x + (size_t)g->headroom * g->d_model;
	float *lse = q + (size_t)g->headroom * nq;
	for (uint32_t k = 0; k < n; k++) {
		const float *row = shm_stage_at(t->stage, g, slot, layer,
		                                first + k);
		memcpy(x + (size_t)k * g->d_model, row,
		       g->d_model * sizeof(float));
		memcpy(q + k * nq, row + g->d_model, nq * sizeof(float));
		memcpy(lse + (size_t)k * g->n_heads, row + g->d_model + nq,
		       g->n_heads * sizeof(float));
	}
	unsigned need = t->pol->ops->needs;
	pl->x = need & POLICY_NEED_X ? x : NULL;
	pl->q = need & POLICY_NEED_Q ? q : NULL;
	pl->lse = need & POLICY_NEED_LSE ? lse : NULL;
}

/* Bytes of the K half of a page: what attn_band reads. */
static size_t key_bytes(const struct tenant *t)
{
	return (size_t)t->g.page_tokens * t->g.head_dim * t->g.elem_bytes;
}

/*
 * Device tenant, first half of a sync: the scratch the apply step needs
 * (it cannot fail later) and the stream's wait for the client's writes,
 * ahead of every key read and move of this sync.
 */
static int device_prepare(struct tenant *t, size_t nlists, size_t entries,
                          char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	if (grow((void **)&t->blist, &t->blist_cap, nlists ? nlists : 1,
	         sizeof(*t->blist)) ||
	    grow((void **)&t->bpages, &t->bpages_cap,
	         nlists * g->max_pages + 1, sizeof(*t->bpages)) ||
	    grow((void **)&t->bmoves, &t->bmoves_cap, 2 * entries + 2,
	         sizeof(*t->bmoves)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	if (t->pol->ops->needs & POLICY_NEED_KV) {
		size_t n = (size_t)g->n_kv_heads * g->max_pages;
		if (grow((void **)&t->kbuf, &t->kbuf_cap, n * key_bytes(t), 1) ||
		    grow((void **)&t->ksrc, &t->ksrc_cap, n, sizeof(*t->ksrc)))
			return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	int rc = t->bops->stream_wait_event(t->bctx, t->stream, &t->ev_writes);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: %s", t->bops->name,
		            t->bops->last_error());
	return 0;
}

/*
 * Device tenant, a policy that reads K: the pages holding entries
 * [0, len) of a list get a host copy of their K half in t->kbuf (copied
 * per layer by read_regions, after the wait for the client's writes), and
 * pv points the policy at those copies.  attn_band and kvpop read K rows
 * only, so the V halves are not copied.
 */
static void stage_keys(struct tenant *t, const uint32_t *pg, uint32_t len,
                       void **pv, uint32_t *nk)
{
	uint32_t used = (len + t->g.page_tokens - 1) / t->g.page_tokens;
	for (uint32_t p = 0; p < used; p++) {
		t->ksrc[*nk] = page_ptr(t, pg[p]);
		pv[p] = t->kbuf + (size_t)*nk * key_bytes(t);
		(*nk)++;
	}
}

int tenant_sync(struct tenant *t, const struct ipc_sync_item *items,
                uint32_t n, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	size_t entries = 0, nlists = 0;
	t->scorer_ns = 0;
	int rc = validate(t, items, n, &entries, &nlists, err, errlen);
	if (rc)
		return rc;
	size_t nlayers = nlists / g->n_kv_heads;
	if (grow((void **)&t->drop, &t->drop_cap, entries ? entries : 1, 1) ||
	    grow((void **)&t->newlen, &t->newlen_cap, nlists, sizeof(uint32_t)) ||
	    grow((void **)&t->ent_scr, &t->ent_cap, entries * t->ef + 1,
	         sizeof(float)) ||
	    grow((void **)&t->state_scr, &t->state_cap,
	         nlayers * t->sbytes + 1, 1))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	memset(t->drop, 0, entries);
	unsigned need = t->pol->ops->needs;
	if (t->dev && (rc = device_prepare(t, nlists, entries, err, errlen)))
		return rc;

	/*
	 * Step 2: decisions, one (sequence, layer) at a time.  The new
	 * entries' positions are written past len, where nothing is committed
	 * yet; the policy rewrites scratch copies of the entry and layer
	 * states (t->ent_scr, t->state_scr), committed in step 4.  So a
	 * refusal here or in step 3 leaves no trace.
	 */
	uint64_t need_pages = 0, freed = 0;
	size_t off = 0, eoff = 0, li_all = 0, ly_all = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot = (uint32_t)it->seq, lo, hi;
		struct tseq *s = &t->seqs[slot];
		item_layers(t, it, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, ly_all++) {
			uint32_t prev = s->n_seen[layer];
			uint32_t seen = prev + it->n_new;
			struct stage_ctx sc = {t, slot, layer, seen};
			struct policy_layer pl = {
				.layer = layer,
				.phase = (enum kvt_phase)it->phase,
				.n_new = it->n_new, .n_seen = seen,
				.staged = stage_row, .staged_ctx = &sc,
				.heads = t->heads,
				.state = t->sbytes ? t->state_scr +
				                             ly_all * t->sbytes
				                   : NULL,
			};
			if (t->sbytes)
				memcpy(pl.state, seq_state(t, s, layer),
				       t->sbytes);
			if (need & POLICY_NEED_STAGED)
				gather_inputs(t, slot, layer, prev, it->n_new,
				              &pl);
			size_t off0 = off;
			uint32_t nk = 0; /* K halves staged for this layer */
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				const struct tlist *l = tlist_at(t, slot, layer,
				                                 head);
				size_t li = lidx(t, layer, head);
				uint32_t *pos = seq_pos(t, s, li);
				uint32_t len = l->len + it->n_new;
				for (uint32_t k = 0; k < it->n_new; k++)
					pos[l->len + k] = prev + k;
				float *e = t->ef ? t->ent_scr + eoff : NULL;
				if (e) {
					size_t old = (size_t)l->len * t->ef;
					memcpy(e, seq_ent(t, s, li),
					       old * sizeof(float));
					memset(e + old, 0, (size_t)it->n_new *
					       t->ef * sizeof(float));
				}
				void **pv = NULL;
				if ((need & POLICY_NEED_KV) && t->dev) {
					pv = t->pagev + (size_t)head * g->max_pages;
					stage_keys(t, seq_pages(t, s, li), len,
					           pv, &nk);
				} else if (need & POLICY_NEED_KV) {
					pv = t->pagev + (size_t)head * g->max_pages;
					const uint32_t *pg = seq_pages(t, s, li);
					for (uint32_t p = 0; p < l->n_pages; p++)
						pv[p] = page_ptr(t, pg[p]);
				}
				t->heads[head] = (struct policy_head){
					.pos = pos, .ent = e, .pages = pv,
					.len = len, .drop = t->drop + off,
				};
				off += len;
				eoff += (size_t)len * t->ef;
			}
			if (nk && (rc = t->bops->read_regions(
				           t->bctx, t->kbuf, key_bytes(t),
				           (const void *const *)t->ksrc, nk,
				           key_bytes(t), t->stream)))
				return errors_fmt(err, errlen, rc, "%s backend: "
				            "staging keys: %s", t->bops->name,
				            t->bops->last_error());
			struct timespec d0, d1;
			clock_gettime(CLOCK_MONOTONIC, &d0);
			rc = policy_decide(t->pol, &pl);
			clock_gettime(CLOCK_MONOTONIC, &d1);
			t->scorer_ns += (uint64_t)((d1.tv_sec - d0.tv_sec) *
			                           1000000000ll +
			                           (d1.tv_nsec - d0.tv_nsec));
			if (rc)
				return errors_fmt(err, errlen, rc, "policy %s: %s",
				            t->pol->ops->name, kvt_strerror(rc));
			off = off0;
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				const struct tlist *l = tlist_at(t, slot, layer,
				                                 head);
				uint32_t len = l->len + it->n_new, nd = 0;
				for (uint32_t k = 0; k < len; k++)
					nd += t->drop[off + k] != 0;
				uint32_t want = pages_for(g, len - nd);
				t->newlen[li_all++] = len - nd;
				if (want > l->n_pages)
					need_pages += want - l->n_pages;
				else
					freed += l->n_pages - want;
				off += len;
			}
		}
	}

	/* Step 3: pages; the last step that may fail. */
	rc = reserve_pages(t, need_pages, freed, err, errlen);
	if (rc)
		return rc;

	/* Step 4: apply.  Pass 1 compacts, commits the policy states and
	 * frees, pass 2 allocates, so the frees of one list can serve the
	 * growth of another. */
	uint32_t row_bytes = g->head_dim * g->elem_bytes;
	uint32_t nb = 0;  /* device: lists batched for one compact call */
	size_t bp = 0, bm = 0; /* their pages and move pairs so far */
	off = 0;
	eoff = 0;
	li_all = 0;
	ly_all = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot = (uint32_t)it->seq, lo, hi;
		struct tseq *s = &t->seqs[slot];
		item_layers(t, it, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, ly_all++) {
			if (t->sbytes)
				memcpy(seq_state(t, s, layer),
				       t->state_scr + ly_all * t->sbytes,
				       t->sbytes);
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				struct tlist *l = tlist_at(t, slot, layer, head);
				size_t li = lidx(t, layer, head);
				uint32_t *pos = seq_pos(t, s, li);
				uint32_t *pg = seq_pages(t, s, li);
				uint32_t len = l->len + it->n_new, nl;
				float *e = t->ef ? t->ent_scr + eoff : NULL;
				const uint8_t *drop = t->drop + off;
				uint32_t nm = compact_plan(drop, len, t->moves,
				                           &nl);
				if (nm && t->dev) {
					/* The page addresses are taken before
					 * the frees below; a chunk emptied by
					 * them is destroyed only after the
					 * queued compaction (chunk_free syncs
					 * the device first). */
					void **bpv = t->bpages + bp;
					for (uint32_t p = 0; p < l->n_pages; p++)
						bpv[p] = page_ptr(t, pg[p]);
					memcpy(t->bmoves + 2 * bm, t->moves,
					       (size_t)nm * 2 * sizeof(uint32_t));
					t->blist[nb++] = (struct kvt_backend_compact){
						.pages = bpv,
						.n_pages = l->n_pages,
						.page_tokens = g->page_tokens,
						.row_bytes = row_bytes,
						.n_moves = nm,
						.moves = t->bmoves + 2 * bm,
					};
					bp += l->n_pages;
					bm += nm;
					policy_move_entries(pos, e, t->ef,
					                    t->moves, nm);
				} else if (nm) {
					for (uint32_t p = 0; p < l->n_pages; p++)
						t->pagev[p] = page_ptr(t, pg[p]);
					compact_cpu(t->pagev, g->page_tokens,
					            row_bytes, t->moves, nm);
					policy_move_entries(pos, e, t->ef,
					                    t->moves, nm);
				}
				if (e)
					memcpy(seq_ent(t, s, li), e,
					       (size_t)nl * t->ef * sizeof(float));
				t->appended += it->n_new;
				t->evicted += len - nl;
				uint32_t want = pages_for(g, nl);
				while (l->n_pages > want)
					page_free(t, pg[--l->n_pages]);
				t->kept += nl;
				t->kept -= l->len;
				l->len = nl;
				l->epoch++;
				t->newlen[li_all++] = want; /* for pass 2 */
				off += len;
				eoff += (size_t)len * t->ef;
			}
		}
	}
	li_all = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot = (uint32_t)it->seq, lo, hi;
		struct tseq *s = &t->seqs[slot];
		item_layers(t, it, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++) {
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				struct tlist *l = tlist_at(t, slot, layer, head);
				uint32_t *pg = seq_pages(t, s,
				                         lidx(t, layer, head));
				uint32_t want = t->newlen[li_all++];
				while (l->n_pages < want)
					pg[l->n_pages++] = page_alloc(t);
				mirror(t, slot, layer, head);
			}
			s->n_seen[layer] += it->n_new;
		}
		s->counter++;
	}
	t->syncs++;
	/*
	 * Device: one launch for the whole sync, the upload of the changed
	 * table records, then the event the client's stream waits on before
	 * it touches the lists again.  All are only queued; a failure here comes after the bookkeeping is committed,
	 * so the tenant is marked failed and the server drops it.
	 */
	int drc = 0;
	if (t->dev) {
		if (nb)
			drc = t->bops->compact(t->bctx, t->blist, nb, t->stream);
		if (drc)
			t->failed = 1;
		else
			drc = table_flush(t);
	}
	revoke_empty(t);
	if (drc)
		return errors_fmt(err, errlen, KVT_ESYS, "%s backend: compaction: "
		            "%s", t->bops->name, t->bops->last_error());
	return 0;
}

/* ------------------------------------------------------------ events */

int tenant_flush_events(struct tenant *t,
                        int (*send)(void *ctx, const struct tenant_event *e),
                        void *ctx)
{
	for (uint32_t i = 0; i < t->n_ev; i++) {
		int rc = send(ctx, &t->ev[i]);
		if (rc < 0) {
			/* Keep what was not sent; the server drops the tenant
			 * and tenant_free destroys everything. */
			memmove(t->ev, t->ev + i, (t->n_ev - i) * sizeof(*t->ev));
			t->n_ev -= i;
			return rc;
		}
	}
	t->n_ev = 0;
	/* Legacy IPC: the exporter must not free memory an importer still
	 * maps; those wait for CHUNK_CLOSED (tenant_chunk_closed). */
	if (t->ipc_share)
		return 0;
	for (uint32_t i = 0; i < t->n_dead; i++)
		pool_chunk_free(t->pool, &t->dead[i].pc);
	t->n_dead = 0;
	return 0;
}

int tenant_chunk_closed(struct tenant *t, uint64_t serial)
{
	if (!t->ipc_share || !serial)
		return KVT_EPROTO;
	for (uint32_t i = 0; i < t->n_dead; i++)
		if (t->dead[i].serial == serial) {
			pool_chunk_free(t->pool, &t->dead[i].pc);
			t->dead[i] = t->dead[--t->n_dead];
			return 0;
		}
	return KVT_EPROTO;
}

int tenant_failed(const struct tenant *t)
{
	return t->failed;
}

/* ------------------------------------------------------------ stats, check */

void tenant_stats(const struct tenant *t, struct kvt_tenant_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->pages_used = (uint64_t)t->n_chunks * t->g.pages_per_chunk -
	                  t->free_pages;
	out->entries_kept = t->kept;
	out->pages_free = t->free_pages;
	out->chunks = t->n_chunks;
	out->sequences = t->n_open;
	out->syncs = t->syncs;
	out->entries_appended = t->appended;
	out->entries_evicted = t->evicted;
	out->quota_bytes = t->quota;
	out->daemon_bytes = t->mem.total;
}

const struct tenant_mem *tenant_mem_of(const struct tenant *t)
{
	return &t->mem;
}

struct checker {
	int n;
	char *detail;
	size_t len;
};

static void violation(struct checker *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void violation(struct checker *c, const char *fmt, ...)
{
	if (!c->n++ && c->detail && c->len) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->detail, c->len, fmt, ap);
		va_end(ap);
	}
}

/* Sets bit i; returns whether it was already set. */
static int test_and_set(uint8_t *bits, uint64_t i)
{
	int was = bits[i / 8] >> (i % 8) & 1;
	bits[i / 8] |= (uint8_t)(1u << (i % 8));
	return was;
}

/*
 * Device tenants: the device copy of the table must equal the host table
 * in every header field and valid page id, once the queued work is done
 * (read_regions waits for the tenant's stream).  Only the records of slots
 * that were ever open are read (the others were uploaded zeroed and never
 * changed), in batches, so the host buffer stays small and the cost
 * follows the live state whatever the table's size.
 */
static int device_records_differ(const struct tenant *t, struct checker *c,
                                 char *buf, uint64_t first, uint32_t k)
{
	enum { BATCH = 256 };
	const struct shm_geom *g = &t->g;
	const void *src[BATCH];
	const char *rec0 = (const char *)shm_list_at(t->table, g, 0, 0, 0);
	uint64_t roff = (uint64_t)(rec0 - (const char *)t->table);
	for (uint32_t j = 0; j < k; j++)
		src[j] = (const char *)t->dtab.base + roff +
		         (first + j) * g->list_stride;
	if (t->bops->read_regions(t->bctx, buf, g->list_stride, src, k,
	                          g->list_stride, t->stream)) {
		violation(c, "device table: %s", t->bops->last_error());
		return 1;
	}
	for (uint32_t j = 0; j < k; j++) {
		const struct shm_list *h = (const struct shm_list *)(
			rec0 + (first + j) * g->list_stride);
		const struct shm_list *d = (const struct shm_list *)(
			buf + (size_t)j * g->list_stride);
		uint32_t np = h->n_pages < g->max_pages ? h->n_pages
		                                        : g->max_pages;
		if (d->len != h->len || d->n_pages != h->n_pages ||
		    d->epoch != h->epoch ||
		    memcmp(d->pages, h->pages, np * sizeof(uint32_t))) {
			violation(c, "device table record %llu differs from "
			          "the table (len %u/%u pages %u/%u epoch "
			          "%llu/%llu)", (unsigned long long)(first + j),
			          d->len, h->len, d->n_pages, h->n_pages,
			          (unsigned long long)d->epoch,
			          (unsigned long long)h->epoch);
			return 1;
		}
	}
	return 0;
}

static void check_device_table(const struct tenant *t, struct checker *c)
{
	enum { BATCH = 256 };
	const struct shm_geom *g = &t->g;
	const void *src[1] = {t->dtab.base};
	size_t hdr = sizeof(struct shm_table_hdr);
	char *buf = malloc(BATCH * g->list_stride);
	if (!buf) {
		violation(c, "out of memory reading the device table back");
		return;
	}
	if (t->bops->read_regions(t->bctx, buf, hdr, src, 1, hdr, t->stream))
		violation(c, "device table: %s", t->bops->last_error());
	else if (memcmp(buf, t->table, hdr))
		violation(c, "device table header differs from the table");
	for (uint32_t slot = 0; slot < g->max_seqs && c->n == 0; slot++) {
		if (!t->seqs[slot].used)
			continue;
		uint64_t first = (uint64_t)slot * t->lists_per_seq;
		for (uint32_t i = 0; i < t->lists_per_seq; i += BATCH) {
			uint32_t k = t->lists_per_seq - i < BATCH
			                     ? t->lists_per_seq - i
			                     : BATCH;
			if (device_records_differ(t, c, buf, first + i, k))
				break;
		}
	}
	free(buf);
}

int tenant_check(const struct tenant *t, char *detail, size_t len)
{
	const struct shm_geom *g = &t->g;
	struct checker c = {0, detail, len};
	if (detail && len)
		detail[0] = '\0';
	uint32_t ppc = g->pages_per_chunk;
	/*
	 * One bit per page of the live chunks: base[slot] is the first bit of
	 * a live slot's pages, UINT64_MAX for a slot without a chunk.
	 */
	uint64_t *base = malloc((size_t)t->max_chunks * sizeof(*base));
	uint64_t nbits = 0;
	for (uint32_t i = 0; base && i < t->max_chunks; i++) {
		base[i] = t->chunks[i].pc.base ? nbits : UINT64_MAX;
		nbits += t->chunks[i].pc.base ? ppc : 0;
	}
	uint8_t *seen = calloc(nbits / 8 + 1, 1); /* [nbits] bits */
	if (!base || !seen) {
		free(base);
		free(seen);
		return KVT_ENOMEM;
	}

	if (shm_table_check(t->table, g))
		violation(&c, "table header does not match the geometry");
	uint32_t live = 0;
	uint64_t free_pages = 0, used = 0, kept = 0;
	for (uint32_t i = 0; i < t->max_chunks; i++) {
		const struct tchunk *ch = &t->chunks[i];
		if (!ch->pc.base)
			continue;
		live++;
		if (ch->n_free > ppc) {
			violation(&c, "chunk %u: %u free pages of %u", i,
			          ch->n_free, ppc);
			continue;
		}
		free_pages += ch->n_free;
		for (uint32_t k = 0; k < ch->n_free; k++) {
			uint32_t idx = ch->free[k];
			if (idx >= ppc)
				violation(&c, "chunk %u: free index %u out of "
				          "range", i, idx);
			else if (test_and_set(seen, base[i] + idx))
				violation(&c, "page %llu free twice",
				          (unsigned long long)i * ppc + idx);
		}
	}
	if (live != t->n_chunks)
		violation(&c, "%u live chunks, counted %u", live, t->n_chunks);
	if ((uint64_t)live * KVT_CHUNK_BYTES > t->quota)
		violation(&c, "%u chunks exceed the quota of %llu bytes", live,
		          (unsigned long long)t->quota);

	uint32_t n_open = 0;
	for (uint32_t slot = 0; slot < g->max_seqs; slot++) {
		const struct tseq *s = &t->seqs[slot];
		n_open += !!s->open;
		/* Never opened: its records and lists are the zeroes they were
		 * created with (nobody but the daemon writes the table), and
		 * reading them would fault in table pages nothing touched. */
		if (!s->used)
			continue;
		for (uint32_t layer = 0; layer < g->n_layers; layer++)
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				const struct tlist *l = tlist_at(t, slot, layer,
				                                 head);
				const struct shm_list *r = shm_list_at(
					t->table, g, slot, layer, head);
				if (r->len != l->len || r->n_pages != l->n_pages ||
				    r->epoch != l->epoch)
					violation(&c, "seq slot %u layer %u head "
					          "%u: table says len %u pages "
					          "%u epoch %llu, daemon %u %u "
					          "%llu", slot, layer, head,
					          r->len, r->n_pages,
					          (unsigned long long)r->epoch,
					          l->len, l->n_pages,
					          (unsigned long long)l->epoch);
				if (!s->open) {
					if (l->len || l->n_pages)
						violation(&c, "closed slot %u holds "
						          "entries", slot);
					continue;
				}
				size_t li = lidx(t, layer, head);
				const uint32_t *pg = seq_pages(t, s, li);
				const uint32_t *pos = seq_pos(t, s, li);
				if (l->len > g->max_tokens)
					violation(&c, "slot %u layer %u head %u: "
					          "len %u > max_tokens", slot,
					          layer, head, l->len);
				if (l->n_pages != pages_for(g, l->len))
					violation(&c, "slot %u layer %u head %u: "
					          "%u pages for len %u, want %u",
					          slot, layer, head, l->n_pages,
					          l->len, pages_for(g, l->len));
				kept += l->len;
				if (l->n_pages > g->max_pages)
					continue;
				used += l->n_pages;
				for (uint32_t p = 0; p < l->n_pages; p++) {
					uint32_t id = pg[p];
					if (r->n_pages == l->n_pages &&
					    r->pages[p] != id)
						violation(&c, "slot %u layer %u "
						          "head %u: table page "
						          "%u is %u, daemon %u",
						          slot, layer, head, p,
						          r->pages[p], id);
					if (id / ppc >= t->max_chunks ||
					    base[id / ppc] == UINT64_MAX)
						violation(&c, "page id %u not in "
						          "a live chunk", id);
					else if (test_and_set(seen, base[id / ppc] +
					                      id % ppc))
						violation(&c, "page %u used "
						          "twice or also free", id);
				}
				for (uint32_t e = 0; e < l->len && e < t->pos_cap;
				     e++)
					if (pos[e] >= s->n_seen[layer]) {
						violation(&c, "slot %u layer %u "
						          "head %u: position %u "
						          "not below n_seen %u",
						          slot, layer, head,
						          pos[e],
						          s->n_seen[layer]);
						break;
					}
			}
	}
	if (n_open != t->n_open)
		violation(&c, "%u open sequences, counted %u", n_open,
		          t->n_open);
	for (uint32_t i = 0; i < t->max_chunks; i++) {
		if (!t->chunks[i].pc.base)
			continue;
		for (uint32_t k = 0; k < ppc; k++)
			if (!(seen[(base[i] + k) / 8] >> ((base[i] + k) % 8) & 1)) {
				violation(&c, "page %llu neither free nor in "
				          "a list",
				          (unsigned long long)i * ppc + k);
				break;
			}
	}
	if (free_pages != t->free_pages || kept != t->kept)
		violation(&c, "running totals: free %llu (counted %llu), kept "
		          "%llu (counted %llu)", (unsigned long long)free_pages,
		          (unsigned long long)t->free_pages,
		          (unsigned long long)kept,
		          (unsigned long long)t->kept);
	if (free_pages + used != (uint64_t)live * ppc)
		violation(&c, "free %llu + used %llu != %llu pages",
		          (unsigned long long)free_pages,
		          (unsigned long long)used,
		          (unsigned long long)live * ppc);
	if (t->dev && t->dtab.base)
		check_device_table(t, &c);
	free(seen);
	free(base);
	return c.n;
}
