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
	if (p->chunks_used >= p->chunk_capacity)
		return KVT_EPOOLFULL;
	int rv = pool_ops(p)->chunk_new(p->bctx, KVT_CHUNK_BYTES, &bc);
	if (rv)
		return rv;
	out->fd = bc.fd;
	out->base = bc.base;
	out->bytes = bc.bytes;
	memcpy(out->ipc, bc.ipc, sizeof(out->ipc));
	memcpy(out->priv, bc.priv, sizeof(out->priv));
	p->chunks_used++;
	p->chunks_created_total++;
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
		if (p->chunks_used)
			p->chunks_used--;
		p->chunks_released_total++;
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
