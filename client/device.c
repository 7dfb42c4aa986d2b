/*
 * device.c — the calls an engine on the cuda backend needs (kvtrim.h,
 * "Device memory"): where pages live, the stream the interprocess events
 * order, the table as a kernel reads it, and copies to and from pages.
 * On a host tenant they answer for host memory.  See client.h and mem.h.
 */
#include "client.h"

#include <string.h>

/* ---------------------------------------------------------------- device */

int kvt_memory_kind(const kvt_client *c)
{
	if (!c)
		return KVT_EINVAL;
	return mem_is_device(&c->mem) ? KVT_MEMORY_CUDA : KVT_MEMORY_HOST;
}

int kvt_set_stream(kvt_client *c, void *stream)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (!client_alive(c))
		return KVT_ECONN;
	c->stream = stream;
	return 0;
}

int kvt_table_view(const kvt_client *c, struct kvt_table_view *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	if (client_lost(c))
		return KVT_ECONN;
	return mem_table_view(&c->mem, out);
}

int kvt_list_record(const kvt_client *c, kvt_seq seq, uint32_t layer,
                    uint32_t kv_head, const struct kvt_list_record **out,
                    uint32_t *slot)
{
	if (!c || !out)
		return KVT_EINVAL;
	const struct shm_list *l;
	struct kvt_table_view v;
	uint32_t s;
	int rc = client_list_of(c, seq, layer, kv_head, &l);
	if (rc < 0 || (rc = mem_table_view(&c->mem, &v)) < 0 ||
	    (rc = client_seq_lookup(c, seq, &s)) < 0)
		return rc;
	/* Same offset in the view's copy as in the host table. */
	size_t off = (size_t)((const char *)l - (const char *)c->mem.table);
	*out = (const struct kvt_list_record *)((const char *)v.table + off);
	if (slot)
		*slot = s;
	return 0;
}

int kvt_memcpy(kvt_client *c, void *dst, const void *src, size_t bytes)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if ((!dst || !src) && bytes) {
		client_set_err(c, "kvt_memcpy: NULL %s with %zu bytes",
		               dst ? "src" : "dst", bytes);
		return KVT_EINVAL;
	}
	if (!client_alive(c))
		return KVT_ECONN;
	return bytes ? client_copy(c, dst, src, bytes) : 0;
}

int client_copy(kvt_client *c, void *dst, const void *src, size_t bytes)
{
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_copy(&c->mem, dst, src, bytes, c->stream, why,
	                  sizeof(why));
	if (rc < 0)
		client_set_err(c, "%s", why);
	return rc;
}
