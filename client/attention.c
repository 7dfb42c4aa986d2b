/*
 * attention.c — kvt_attention and kvt_attend (kvtrim.h, "Attention"): an
 * engine's causal attention of n new tokens of one (sequence, layer) over
 * that layer's lists, the new entries appended and not yet synced.  A host
 * tenant runs paged_attention_cpu per (token, KV head) before returning; a
 * cuda tenant queues the backend's `attention` op on the client's stream,
 * which reads the device table and copies nothing.  Every list of every
 * item is checked against the host table first, so an error writes
 * nothing.  The host scratch is allocated on the first host call at the
 * geometry's largest size and kept until client_attention_free.
 */
#include "client.h"

#include <math.h>
#include <stdio.h>
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
                       uint32_t n, const float *q, float *out, float *lse,
                       float scale)
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
                         float *out, float *lse, float scale)
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
		.scale = scale,
		.q = q,
		.out = out,
		.lse = lse,
	};
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_attention(&c->mem, &a, c->stream, why, sizeof(why));
	return rc < 0 ? fail(c, rc, why) : 0;
}

/*
 * Checks one attention (kvt_attention's arguments, item i of a kvt_attend
 * when many) against the host table before anything is computed: *slot
 * and *max_len (the longest list's len + n) for the run.  0, or the code
 * with the reason set.
 */
static int check(kvt_client *c, size_t i, int many, kvt_seq seq,
                 uint32_t layer, uint32_t n, const float *q,
                 const float *out, const float *lse, float scale,
                 uint32_t *slot, uint32_t *max_len)
{
	const struct shm_geom *g = &c->mem.g;
	char at[32] = "";
	if (many)
		snprintf(at, sizeof(at), "item %zu: ", i);
	if (client_seq_lookup(c, seq, slot) < 0) {
		client_set_err(c, "kvt_attention: %sno such open sequence", at);
		return KVT_ENOSEQ;
	}
	if (c->seqs[*slot].busy) {
		client_set_err(c, "kvt_attention: %sthe sequence has a sync in "
		               "flight (kvt_wait for it first)", at);
		return KVT_EBUSY;
	}
	if (layer >= g->n_layers) {
		client_set_err(c, "kvt_attention: %slayer %u of %u", at, layer,
		               g->n_layers);
		return KVT_EINVAL;
	}
	if (n > g->headroom) {
		client_set_err(c, "kvt_attention: %s%u new entries beyond the "
		               "headroom of %u", at, n, g->headroom);
		return KVT_EHEADROOM;
	}
	if (!(scale > 0) || !isfinite(scale)) {
		client_set_err(c, "kvt_attention: %sscale %g is not a positive "
		               "finite number", at, (double)scale);
		return KVT_EINVAL;
	}
	if (n && (!q || !out || !lse)) {
		client_set_err(c, "kvt_attention: %sq, out and lse must not be "
		               "NULL", at);
		return KVT_EINVAL;
	}
	const size_t qb = (size_t)n * g->n_heads * g->head_dim * sizeof(float);
	const size_t lb = (size_t)n * g->n_heads * sizeof(float);
	if (mem_overlaps(q, qb, out, qb) || mem_overlaps(q, qb, lse, lb) ||
	    mem_overlaps(out, qb, lse, lb)) {
		client_set_err(c, "kvt_attention: %sq, out and lse overlap "
		               "(out and lse must be memory of their own)", at);
		return KVT_EINVAL;
	}
	/* Where kvt_memcpy refuses to write, so does the attention: a store
	 * there would fault instead of failing. */
	if (mem_in_table(&c->mem, out, qb) || mem_in_table(&c->mem, lse, lb)) {
		client_set_err(c, "kvt_attention: %sout or lse lies in the "
		               "table, which only kvtrimd writes", at);
		return KVT_EINVAL;
	}
	/* The new entries sit in the headroom pages the daemon promised
	 * after the last sync: a list without them breaks the contract. */
	*max_len = 0;
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		const struct shm_list *l = shm_list_at(c->mem.table, g, *slot,
		                                       layer, h);
		uint32_t np = l->n_pages < g->max_pages ? l->n_pages
		                                        : g->max_pages;
		uint64_t end = (uint64_t)l->len + n;
		if (end > (uint64_t)np * g->page_tokens) {
			client_set_err(c, "kvt_attention: %slayer %u KV head %u "
			               "holds %u entries in %u pages of %u: no "
			               "room for %u new ones", at, layer, h,
			               l->len, np, g->page_tokens, n);
			return KVT_EPROTO;
		}
		/* Several items: every page mapped before the first runs
		 * (one item: attend_host checks them before computing). */
		for (uint64_t p = 0; many && n && !mem_is_device(&c->mem) &&
		                     p < (end + g->page_tokens - 1) /
		                                 g->page_tokens; p++)
			if (!mem_page(&c->mem, l->pages[p])) {
				client_set_err(c, "kvt_attention: %spage %u of layer "
				               "%u KV head %u is not mapped", at,
				               l->pages[p], layer, h);
				return KVT_EPROTO;
			}
		if (end > *max_len)
			*max_len = (uint32_t)end;
	}
	return 0;
}

static int run(kvt_client *c, uint32_t slot, uint32_t layer, uint32_t n,
               uint32_t max_len, const float *q, float *out, float *lse,
               float scale)
{
	if (n == 0)
		return 0;
	if (mem_is_device(&c->mem))
		return attend_device(c, slot, layer, n, max_len, q, out, lse,
		                     scale);
	return attend_host(c, slot, layer, n, q, out, lse, scale);
}

int kvt_attention(kvt_client *c, kvt_seq seq, uint32_t layer, uint32_t n,
                  const float *q, float *out, float *lse)
{
	if (!c)
		return KVT_EINVAL;
	if (!client_alive(c))
		return KVT_ECONN;
	uint32_t slot, max_len;
	const float scale = 1.0f / sqrtf((float)c->mem.g.head_dim);
	int rc = check(c, 0, 0, seq, layer, n, q, out, lse, scale, &slot,
	               &max_len);
	return rc ? rc : run(c, slot, layer, n, max_len, q, out, lse, scale);
}

int kvt_attend(kvt_client *c, const struct kvt_attend_item *items,
               size_t n_items)
{
	if (!c)
		return KVT_EINVAL;
	if (!client_alive(c))
		return KVT_ECONN;
	if (n_items && !items) {
		client_set_err(c, "kvt_attend: items is NULL");
		return KVT_EINVAL;
	}
	if (!n_items)
		return 0;
	const float dflt = 1.0f / sqrtf((float)c->mem.g.head_dim);
	/* [n_items][2]: each item's slot and longest list, from its check
	 * (on the stack for a batch of up to 64: a decode step's call) */
	uint32_t stack[64][2], (*at)[2] = n_items <= 64 ? stack
	                                  : malloc(n_items * sizeof(*at));
	if (!at) {
		client_set_err(c, "kvt_attend: no memory for %zu items", n_items);
		return KVT_ENOMEM;
	}
	int rc = 0;
	for (size_t i = 0; i < n_items && !rc; i++) {
		const struct kvt_attend_item *it = &items[i];
		rc = check(c, i, 1, it->seq, it->layer, it->n, it->q, it->out,
		           it->lse, it->scale ? it->scale : dflt, &at[i][0],
		           &at[i][1]);
	}
	for (size_t i = 0; i < n_items && !rc; i++) {
		const struct kvt_attend_item *it = &items[i];
		rc = run(c, at[i][0], it->layer, it->n, at[i][1], it->q, it->out,
		         it->lse, it->scale ? it->scale : dflt);
	}
	if (at != stack)
		free(at);
	return rc;
}
