/*
 * buffer.c — kvt_buffer_alloc and kvt_buffer_free (kvtrim.h, "Device
 * memory"): memory of the pages' kind for an engine that computes on the
 * host but hands kvt_attention its q, out and lse, which on a cuda tenant
 * must be device memory of this process.
 *
 * The client keeps every live buffer in a small array (an engine holds a
 * few, for its whole life), so kvt_buffer_free can refuse a pointer it did
 * not give, or gave and already took back, without touching it, and
 * kvt_disconnect frees what is left before the backend context that owns
 * device buffers goes (client_buffers_free, then mem_fini).  See client.h.
 */
#include "client.h"

#include <stdlib.h>

void client_buffers_free(kvt_client *c)
{
	for (uint32_t i = 0; i < c->n_bufs; i++)
		mem_buffer_free(&c->mem, c->bufs[i].p, c->bufs[i].dev);
	free(c->bufs);
	c->bufs = NULL;
	c->n_bufs = c->bufs_cap = 0;
}

int kvt_buffer_alloc(kvt_client *c, size_t bytes, void **out)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (!out) {
		client_set_err(c, "kvt_buffer_alloc: NULL out");
		return KVT_EINVAL;
	}
	*out = NULL;
	if (!bytes) {
		client_set_err(c, "kvt_buffer_alloc: 0 bytes");
		return KVT_EINVAL;
	}
	if (!client_alive(c))
		return KVT_ECONN;
	/* Room in the list first, so a failure after the allocation cannot
	 * leave a buffer nobody can free. */
	if (c->n_bufs == c->bufs_cap) {
		uint32_t cap = c->bufs_cap ? 2 * c->bufs_cap : 8;
		struct client_buffer *nb = cap > c->bufs_cap
		        ? realloc(c->bufs, cap * sizeof(*nb)) : NULL;
		if (!nb) {
			client_set_err(c, "kvt_buffer_alloc: no memory for the "
			               "list of buffers");
			return KVT_ENOMEM;
		}
		c->bufs = nb;
		c->bufs_cap = cap;
	}
	char why[KVT_ERRTEXT_MAX - 32];
	void *p;
	int rc = mem_buffer_new(&c->mem, bytes, &p, why, sizeof(why));
	if (rc < 0) {
		client_set_err(c, "kvt_buffer_alloc: %s", why);
		return rc;
	}
	c->bufs[c->n_bufs++] = (struct client_buffer){p, mem_is_device(&c->mem)};
	*out = p;
	return 0;
}

int kvt_buffer_free(kvt_client *c, void *p)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (!p)
		return 0;
	for (uint32_t i = 0; i < c->n_bufs; i++) {
		if (c->bufs[i].p != p)
			continue;
		mem_buffer_free(&c->mem, p, c->bufs[i].dev);
		c->bufs[i] = c->bufs[--c->n_bufs];
		return 0;
	}
	client_set_err(c, "kvt_buffer_free: %p is not a live buffer of "
	               "kvt_buffer_alloc on this client", p);
	return KVT_EINVAL;
}
