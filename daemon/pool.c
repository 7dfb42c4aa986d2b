/*
 * pool.c — the daemon's KV memory pool: counts 2 MiB chunks against the
 * capacity and gets each one from the backend (backend_cpu: a sealed
 * memfd); see pool.h.
 *
 * The pool only counts chunks against its capacity; which tenant owns a
 * chunk and which pages inside it are free is the tenant's business.
 */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

int pool_init(struct pool *p, uint64_t pool_bytes)
{
	memset(p, 0, sizeof(*p));
	if (pool_bytes < KVT_CHUNK_BYTES)
		return KVT_EINVAL;
	p->chunk_capacity = pool_bytes / KVT_CHUNK_BYTES;
	for (int k = 0; k < POOL_SHARES; k++)
		p->share_chunks[k] = p->chunk_capacity;
	return 0;
}

void pool_set_shares(struct pool *p, const double share[POOL_SHARES])
{
	for (int k = 0; k < POOL_SHARES; k++) {
		double r = share[k] > 0 && share[k] <= 1 ? share[k] : 1;
		uint64_t n = (uint64_t)(r * (double)p->chunk_capacity);
		if (n < 1)
			n = 1;
		if (n > p->chunk_capacity)
			n = p->chunk_capacity;
		__atomic_store_n(&p->share_chunks[k], n, __ATOMIC_RELEASE);
	}
}

uint64_t pool_share_chunks(const struct pool *p, enum pool_share kind)
{
	return __atomic_load_n(&p->share_chunks[kind], __ATOMIC_ACQUIRE);
}

uint64_t pool_account_chunks(const struct pool_account *a)
{
	return __atomic_load_n(&a->chunks, __ATOMIC_ACQUIRE);
}

struct pool_account *pool_account_get(struct pool *p, enum pool_share kind,
                                      uint32_t id)
{
	struct pool_account *a;
	for (a = p->accounts; a; a = a->next)
		if (a->kind == kind && a->id == id)
			break;
	if (!a) {
		a = calloc(1, sizeof(*a));
		if (!a)
			return NULL;
		a->kind = kind;
		a->id = id;
		a->next = p->accounts;
		p->accounts = a;
	}
	a->refs++;
	return a;
}

/* Frees the accounts nobody refers to and that count no chunk. */
static void pool_account_sweep(struct pool *p)
{
	struct pool_account **pp = &p->accounts;
	while (*pp) {
		struct pool_account *a = *pp;
		if (!a->refs && !pool_account_chunks(a)) {
			*pp = a->next;
			free(a);
		} else {
			pp = &a->next;
		}
	}
}

void pool_account_put(struct pool *p, struct pool_account *a)
{
	if (!a)
		return;
	if (a->refs)
		a->refs--;
	pool_account_sweep(p);
}

uint32_t pool_accounts(const struct pool *p, enum pool_share kind)
{
	uint32_t n = 0;
	for (const struct pool_account *a = p->accounts; a; a = a->next)
		n += a->kind == kind && a->refs;
	return n;
}

/* Counts one more chunk in *counter unless it already holds cap. */
static int counter_take(uint64_t *counter, uint64_t cap)
{
	uint64_t used = __atomic_load_n(counter, __ATOMIC_RELAXED);
	do {
		if (used >= cap)
			return KVT_EPOOLFULL;
	} while (!__atomic_compare_exchange_n(counter, &used, used + 1, 1,
	                                      __ATOMIC_ACQ_REL,
	                                      __ATOMIC_RELAXED));
	return 0;
}

/* Gives back the chunk counted in the accounts of c (and clears them). */
static void accounts_release(struct pool_chunk *c)
{
	for (int k = 0; k < POOL_SHARES; k++) {
		if (c->acct[k])
			__atomic_sub_fetch(&c->acct[k]->chunks, 1,
			                   __ATOMIC_ACQ_REL);
		c->acct[k] = NULL;
	}
}

/* Counts a new chunk in every account of acct (NULL: none) and in the
 * pool's capacity, all or nothing. */
static int pool_reserve(struct pool *p, struct pool_account *const *acct,
                        struct pool_chunk *out)
{
	for (int k = 0; acct && k < POOL_SHARES; k++) {
		if (!acct[k])
			continue;
		if (counter_take(&acct[k]->chunks, pool_share_chunks(p, k))) {
			accounts_release(out);
			return KVT_EPOOLFULL;
		}
		out->acct[k] = acct[k];
	}
	if (counter_take(&p->chunks_used, p->chunk_capacity)) {
		accounts_release(out);
		return KVT_EPOOLFULL;
	}
	return 0;
}

void pool_set_backend(struct pool *p, const struct kvt_backend_ops *ops,
                      void *ctx)
{
	p->ops = ops;
	p->bctx = ctx;
}

static const struct kvt_backend_ops *pool_ops(const struct pool *p)
{
	return p->ops ? p->ops : &backend_cpu;
}

static void pool_chunk_clear(struct pool_chunk *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

int pool_chunk_new(struct pool *p, struct pool_account *const *acct,
                   struct pool_chunk *out)
{
	struct kvt_backend_chunk bc;
	pool_chunk_clear(out);
	/* Reserve the capacity first (syncs on worker threads create chunks
	 * at the same time), then ask the backend. */
	int rv = pool_reserve(p, acct, out);
	if (rv)
		return rv;
	rv = pool_ops(p)->chunk_new(p->bctx, KVT_CHUNK_BYTES, &bc);
	if (rv) {
		__atomic_sub_fetch(&p->chunks_used, 1, __ATOMIC_ACQ_REL);
		accounts_release(out);
		return rv;
	}
	out->fd = bc.fd;
	out->base = bc.base;
	out->bytes = bc.bytes;
	memcpy(out->ipc, bc.ipc, sizeof(out->ipc));
	memcpy(out->priv, bc.priv, sizeof(out->priv));
	__atomic_add_fetch(&p->chunks_created_total, 1, __ATOMIC_RELAXED);
	return 0;
}

void pool_chunk_free(struct pool *p, struct pool_chunk *c)
{
	/* base NULL marks "no chunk" (a zeroed struct, or one already
	 * freed): nothing to release, and its fd (0 in a zeroed struct) is
	 * somebody else's descriptor. */
	if (c->base) {
		struct kvt_backend_chunk bc;
		bc.fd = c->fd;
		bc.base = c->base;
		bc.bytes = c->bytes ? c->bytes : KVT_CHUNK_BYTES;
		memcpy(bc.ipc, c->ipc, sizeof(bc.ipc));
		memcpy(bc.priv, c->priv, sizeof(bc.priv));
		pool_ops(p)->chunk_free(p->bctx, &bc);
		__atomic_sub_fetch(&p->chunks_used, 1, __ATOMIC_ACQ_REL);
		accounts_release(c);
		__atomic_add_fetch(&p->chunks_released_total, 1,
		                   __ATOMIC_RELAXED);
	}
	pool_chunk_clear(c);
}

const struct kvt_backend_ops *pool_backend(const struct pool *p, void **ctx)
{
	if (ctx)
		*ctx = p->bctx;
	return pool_ops(p);
}

uint64_t pool_bytes_total(const struct pool *p)
{
	return p->chunk_capacity * KVT_CHUNK_BYTES;
}

uint64_t pool_chunks_used(const struct pool *p)
{
	return __atomic_load_n(&p->chunks_used, __ATOMIC_ACQUIRE);
}
