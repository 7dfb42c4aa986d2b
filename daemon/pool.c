/*
 * pool.c — the daemon's KV memory pool: counts 2 MiB chunks against the
 * capacity and gets each one from the backend (backend_cpu: a sealed
 * memfd); see pool.h.
 *
 * The pool only counts chunks against its capacity; which tenant owns a
 * chunk and which pages inside it are free is the tenant's business.
 */
#include "pool.h"

#include <string.h>

int pool_init(struct pool *p, uint64_t pool_bytes)
{
	memset(p, 0, sizeof(*p));
	if (pool_bytes < KVT_CHUNK_BYTES)
		return KVT_EINVAL;
	p->chunk_capacity = pool_bytes / KVT_CHUNK_BYTES;
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

int pool_chunk_new(struct pool *p, struct pool_chunk *out)
{
	struct kvt_backend_chunk bc;
	pool_chunk_clear(out);
	/* Reserve the capacity first (syncs on worker threads create chunks
	 * at the same time), then ask the backend. */
	uint64_t used = __atomic_load_n(&p->chunks_used, __ATOMIC_RELAXED);
	do {
		if (used >= p->chunk_capacity)
			return KVT_EPOOLFULL;
	} while (!__atomic_compare_exchange_n(&p->chunks_used, &used, used + 1,
	                                      1, __ATOMIC_ACQ_REL,
	                                      __ATOMIC_RELAXED));
	int rv = pool_ops(p)->chunk_new(p->bctx, KVT_CHUNK_BYTES, &bc);
	if (rv) {
		__atomic_sub_fetch(&p->chunks_used, 1, __ATOMIC_ACQ_REL);
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
