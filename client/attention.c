/*
 * attention.c — kvt_attention (kvtrim.h, "Attention"): an engine's causal
 * attention of n new tokens of one (sequence, layer) over that layer's
 * lists, the n new entries appended at len .. len + n - 1 of each and not
 * yet synced.
 *
 *   host tenant  paged_attention_cpu (kernels/cpu/paged_attention.c, linked
 *                into libkvtrim and hidden there like every non-kvt_
 *                symbol), once per (token, KV head), before returning.
 *   cuda tenant  the backend's `attention` op (libkvtrim-cuda.so,
 *                backend/cuda/attention.cu) queued on the client's stream;
 *                it reads the device copy of the table, so the call
 *                copies nothing between host and device.
 *
 * Every list is checked against the host table first (open, idle
 * sequence; layer; n within the headroom; pages for len + n entries; on a
 * host tenant every page mapped), so an error writes nothing.  The host
 * buffers (page addresses, logits) are allocated on the first host call at
 * the geometry's largest size and kept until the client is freed
 * (client_attention_free).  See client.h.
 */
#include "client.h"

#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "shm.h"

void client_attention_free(kvt_client *c)
{
	free(c->attn_pages);
	free(c->attn_logits);
	c->attn_pages = NULL;
	c->attn_logits = NULL;
}

/* Sets the reason and returns rc. */
static int fail(kvt_client *c, int rc, const char *why)
{
	client_set_err(c, "kvt_attention: %s", why);
	return rc;
}

/* Host tenant: the page addresses of every list ([n_kv][max_pages]),
 * checked, then the kernel per (token, KV head). */
static int attend_host(kvt_client *c, uint32_t slot, uint32_t layer,
                       uint32_t n, const float *q, float *out, float *lse)
{
	const struct shm_geom *g = &c->mem.g;
	const uint32_t H = g->n_heads, Hkv = g->n_kv_heads, G = H / Hkv;
	const uint32_t hd = g->head_dim, pt = g->page_tokens;
	if (!c->attn_pages) {
		c->attn_pages = malloc((size_t)Hkv * g->max_pages *
		                       sizeof(void *));
		c->attn_logits = malloc((size_t)G * g->max_pages * pt *
		                        sizeof(float));
		if (!c->attn_pages || !c->attn_logits) {
			client_attention_free(c);
			return fail(c, KVT_ENOMEM, "no memory for the page "
			            "addresses and logits");
		}
	}
	for (uint32_t h = 0; h < Hkv; h++) {
		const struct shm_list *l = shm_list_at(c->mem.table, g, slot,
		                                       layer, h);
		uint32_t need = (uint32_t)(((uint64_t)l->len + n + pt - 1) / pt);
		void **pv = c->attn_pages + (size_t)h * g->max_pages;
		for (uint32_t i = 0; i < need; i++) {
			pv[i] = mem_page(&c->mem, l->pages[i]);
			if (!pv[i]) {
				client_set_err(c, "kvt_attention: page %u of layer "
				               "%u KV head %u is not mapped",
				               l->pages[i], layer, h);
				return KVT_EPROTO;
			}
		}
	}
	const float scale = 1.0f / sqrtf((float)hd);
	for (uint32_t h = 0; h < Hkv; h++) {
		const struct shm_list *l = shm_list_at(c->mem.table, g, slot,
		                                       layer, h);
		void *const *pv = c->attn_pages + (size_t)h * g->max_pages;
		for (uint32_t t = 0; t < n; t++) {
			size_t qh = (size_t)t * H + (size_t)h * G; /* [t][h*G] */
			paged_attention_cpu(q + qh * hd, G, pv, pt, hd,
			                    c->cfg.dtype, l->len + t + 1, scale,
			                    out + qh * hd, lse + qh,
			                    c->attn_logits);
		}
	}
	return 0;
}

/* Cuda tenant: one backend call, the records taken from the device table
 * that kvt_table_view describes. */
static int attend_device(kvt_client *c, uint32_t slot, uint32_t layer,
                         uint32_t n, uint32_t max_len, const float *q,
                         float *out, float *lse)
{
	const struct shm_geom *g = &c->mem.g;
	struct kvt_table_view v;
	if (mem_table_view(&c->mem, &v) < 0)
		return fail(c, KVT_EPROTO, "the device table is not mapped");
	struct kvt_backend_attention a = {
		.records = (const char *)v.table + v.records_offset +
		           ((uint64_t)slot * g->n_layers + layer) *
		                   g->n_kv_heads * v.list_stride,
		.list_stride = v.list_stride,
		.chunk_bases = v.chunk_bases,
		.n_chunk_slots = v.n_chunk_slots,
		.pages_per_chunk = v.pages_per_chunk,
		.page_bytes = v.page_bytes,
		.max_pages = v.max_pages,
		.page_tokens = g->page_tokens,
		.head_dim = g->head_dim,
		.n_heads = g->n_heads,
		.n_kv_heads = g->n_kv_heads,
		.dtype = c->cfg.dtype,
		.n = n,
		.max_len = max_len,
		.scale = 1.0f / sqrtf((float)g->head_dim),
		.q = q,
		.out = out,
		.lse = lse,
	};
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_attention(&c->mem, &a, c->stream, why, sizeof(why));
	return rc < 0 ? fail(c, rc, why) : 0;
}

int kvt_attention(kvt_client *c, kvt_seq seq, uint32_t layer, uint32_t n,
                  const float *q, float *out, float *lse)
{
	if (!c)
		return KVT_EINVAL;
	if (!client_alive(c))
		return KVT_ECONN;
	const struct shm_geom *g = &c->mem.g;
	uint32_t slot;
	if (client_seq_lookup(c, seq, &slot) < 0)
		return fail(c, KVT_ENOSEQ, "no such open sequence");
	if (c->seqs[slot].busy)
		return fail(c, KVT_EBUSY, "the sequence has a sync in flight "
		            "(kvt_wait for it first)");
	if (layer >= g->n_layers) {
		client_set_err(c, "kvt_attention: layer %u of %u", layer,
		               g->n_layers);
		return KVT_EINVAL;
	}
	if (n > g->headroom) {
		client_set_err(c, "kvt_attention: %u new entries beyond the "
		               "headroom of %u", n, g->headroom);
		return KVT_EHEADROOM;
	}
	if (n && (!q || !out || !lse))
		return fail(c, KVT_EINVAL, "q, out and lse must not be NULL");
	/* The new entries sit in the headroom pages the daemon promised
	 * after the last sync: a list without them breaks the contract. */
	uint32_t max_len = 0;
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		const struct shm_list *l = shm_list_at(c->mem.table, g, slot,
		                                       layer, h);
		uint32_t np = l->n_pages < g->max_pages ? l->n_pages
		                                        : g->max_pages;
		uint64_t end = (uint64_t)l->len + n;
		if (end > (uint64_t)np * g->page_tokens) {
			client_set_err(c, "kvt_attention: layer %u KV head %u "
			               "holds %u entries in %u pages of %u: no "
			               "room for %u new ones", layer, h, l->len,
			               np, g->page_tokens, n);
			return KVT_EPROTO;
		}
		if (end > max_len)
			max_len = (uint32_t)end;
	}
	if (n == 0)
		return 0;
	if (mem_is_device(&c->mem))
		return attend_device(c, slot, layer, n, max_len, q, out, lse);
	return attend_host(c, slot, layer, n, q, out, lse);
}
