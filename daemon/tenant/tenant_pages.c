/*
 * tenant_pages.c — a tenant's chunks and pages: chunks taken from the pool
 * up to the quota, each carved into pages with a stack of free indexes,
 * revoked once empty; the queue of chunk and device events and its flush
 * to the server.  See tenant_int.h for the two-halves contract.
 *
 * Accounting: t->free_pages is the sum of n_free over live chunks, kept up
 * to date by every function here (tenant_check recomputes it).  The pool
 * counts live chunks plus revoked ones not destroyed yet (tenant_chunks).
 */
#include "errors.h"
#include "tenant_int.h"

#include <stdlib.h>
#include <string.h>

/*
 * Takes one free page.  Drains the fullest chunk first (fewest free pages,
 * lowest slot on ties), which keeps chunks dense and lets the others empty
 * out and be revoked.  The caller has made sure enough pages are free.
 */
uint32_t tenant_page_alloc(struct tenant *t)
{
	if (t->alloc_cur == TENANT_NO_CHUNK ||
	    !t->chunks[t->alloc_cur].n_free) {
		uint32_t best = TENANT_NO_CHUNK;
		for (uint32_t i = 0; i < t->max_chunks; i++) {
			const struct tchunk *c = &t->chunks[i];
			if (c->pc.base && c->n_free &&
			    (best == TENANT_NO_CHUNK ||
			     c->n_free < t->chunks[best].n_free))
				best = i;
		}
		t->alloc_cur = best;
	}
	struct tchunk *c = &t->chunks[t->alloc_cur];
	t->free_pages--;
	return t->alloc_cur * t->g.pages_per_chunk + c->free[--c->n_free];
}

void tenant_page_free(struct tenant *t, uint32_t id)
{
	struct tchunk *c = &t->chunks[id / t->g.pages_per_chunk];
	c->free[c->n_free++] = id % t->g.pages_per_chunk;
	t->free_pages++;
}

int tenant_ensure_room(void **arr, uint32_t *cap, uint32_t want,
                       size_t elem)
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
 * Can k more chunks count in the tenant's uid and process shares?  Else
 * KVT_EPOOLFULL, as for a full pool: the share is that uid's (process's)
 * pool, and pages its other tenants free, or pressure makes them free,
 * can end the wait.  The share is rechecked when the chunk is created.
 */
static int share_check(const struct tenant *t, uint64_t k, char *err,
                       size_t errlen)
{
	static const char *const who[POOL_SHARES] = {"uid", "process"};
	static const char *const key[POOL_SHARES] = {"uid_pool_share",
	                                             "pid_pool_share"};
	for (int i = 0; k && i < POOL_SHARES; i++) {
		const struct pool_account *a = t->acct[i];
		if (!a)
			continue;
		uint64_t held = pool_account_chunks(a);
		uint64_t cap = pool_share_chunks(t->pool, (enum pool_share)i);
		if (held + k > cap)
			return errors_fmt(err, errlen, KVT_EPOOLFULL,
			            "needs %llu more chunk(s); the tenants of %s "
			            "%u hold %llu of the %llu chunks its share of the "
			            "pool (%s) allows", (unsigned long long)k,
			            who[i], a->id, (unsigned long long)held,
			            (unsigned long long)cap, key[i]);
	}
	return 0;
}

/*
 * First half of every page-changing operation: makes sure `need` pages can
 * be allocated once `freed` pages have been returned, creating chunks now if
 * the free pages do not suffice.  Also reserves room for every event and
 * dead chunk the operation can produce, so the second half cannot fail.
 * On error nothing changed.  On success the ADD events are queued.
 */
int tenant_pages_check(const struct tenant *t, uint64_t need, uint64_t freed,
                       uint64_t *k, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	uint64_t avail = t->free_pages + freed;
	*k = 0;
	if (need > avail)
		*k = (need - avail + g->pages_per_chunk - 1) / g->pages_per_chunk;
	if (t->n_chunks + *k > t->max_chunks)
		return errors_fmt(err, errlen, KVT_EQUOTA,
		            "needs %llu more chunk(s): %u held, quota allows %u",
		            (unsigned long long)*k, t->n_chunks, t->max_chunks);
	int rc = share_check(t, *k, err, errlen);
	if (rc)
		return rc;
	if (pool_chunks_used(t->pool) + *k > t->pool->chunk_capacity)
		return errors_fmt(err, errlen, KVT_EPOOLFULL,
		            "needs %llu more chunk(s); the pool has %llu of %llu "
		            "in use", (unsigned long long)*k,
		            (unsigned long long)pool_chunks_used(t->pool),
		            (unsigned long long)t->pool->chunk_capacity);
	return 0;
}

int tenant_reserve_pages(struct tenant *t, uint64_t need, uint64_t freed,
                         char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	uint64_t k;
	int rc = tenant_pages_check(t, need, freed, &k, err, errlen);
	if (rc)
		return rc;
	/* Every live chunk may be revoked at the end; each new one is added. */
	uint32_t worst = t->n_chunks + (uint32_t)k;
	if (tenant_ensure_room((void **)&t->ev, &t->ev_cap,
	                       t->n_ev + 2 * worst, sizeof(*t->ev)) ||
	    tenant_ensure_room((void **)&t->dead, &t->dead_cap,
	                       t->n_dead + worst, sizeof(*t->dead)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");

	uint32_t made[64], *madev = made;
	if (k > sizeof(made) / sizeof(made[0])) {
		madev = malloc((size_t)k * sizeof(*madev));
		if (!madev)
			return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	rc = 0;
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
		rc = pool_chunk_new(t->pool, t->acct, &c->pc);
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
 * Queues the revoke of chunk slot: into the CHUNK_REVOKE_SET of its window
 * queued last when there is one (t->revoke_set; slots come in increasing
 * order), else a new set; legacy IPC chunks get a CHUNK_REVOKE each (the
 * client acknowledges each cookie).  ev has room for one event per chunk.
 */
static void revoke_event(struct tenant *t, uint32_t slot, uint64_t cookie)
{
	if (t->ipc_share) {
		t->ev[t->n_ev++] = (struct tenant_event){
			.type = HANDLE_CHUNK_REVOKE, .slot = slot, .fd = -1,
			.cookie = cookie};
		return;
	}
	uint32_t base = slot - slot % HANDLE_REVOKE_SET_SLOTS, bit = slot - base;
	struct tenant_event *e = t->revoke_set != TENANT_NO_CHUNK
	                                 ? &t->ev[t->revoke_set]
	                                 : NULL;
	if (!e || e->slot != base) {
		t->revoke_set = t->n_ev;
		e = &t->ev[t->n_ev++];
		*e = (struct tenant_event){.type = HANDLE_CHUNK_REVOKE_SET,
		                           .slot = base, .fd = -1};
	}
	e->data[bit / 8] |= (uint8_t)(1u << (bit % 8));
}

/*
 * End of every page-changing operation: chunks that are now completely free
 * are revoked.  The slot becomes reusable at once (the client processes the
 * REVOKE before any later ADD of the same slot); the memory is destroyed in
 * tenant_flush_events after the REVOKE went out.
 */
void tenant_revoke_empty(struct tenant *t)
{
	t->revoke_set = TENANT_NO_CHUNK;
	for (uint32_t i = 0; i < t->max_chunks; i++) {
		struct tchunk *c = &t->chunks[i];
		if (!c->pc.base || c->n_free != t->g.pages_per_chunk)
			continue;
		revoke_event(t, i, t->dev ? c->serial : 0);
		t->dead[t->n_dead++] = (struct tdead){c->pc, c->serial};
		t->free_pages -= c->n_free;
		c->pc.base = NULL;
		c->pc.fd = -1;
		free(c->free);
		c->free = NULL;
		c->n_free = 0;
		t->n_chunks--;
	}
	t->alloc_cur = TENANT_NO_CHUNK;
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
