/*
 * bulk.c — kvt_write_kv and kvt_stage (kvtrim.h): a layer's new K/V rows
 * or scorer inputs of several tokens in one call, for engines that hold
 * them as tensors.  Every argument and every destination row is checked
 * before the first byte is copied, so a refused call writes nothing.
 * Rows go by client_copy: memcpy on a host tenant, a copy on the
 * client's stream on a cuda tenant.
 */
#include <string.h>

#include "client.h"
#include "shm.h"

/* The slot of an open, idle sequence for a bulk call; else the code with
 * the reason set. */
static int bulk_slot(kvt_client *c, const char *call, kvt_seq seq,
                     uint32_t layer, uint32_t *slot)
{
	if (!client_alive(c))
		return KVT_ECONN;
	if (client_seq_lookup(c, seq, slot) < 0) {
		client_set_err(c, "%s: no open sequence %#llx on this client",
		               call, (unsigned long long)seq);
		return KVT_ENOSEQ;
	}
	if (c->seqs[*slot].busy || c->seqs[*slot].doubt) {
		client_set_err(c, "%s: sequence %#llx has a sync in flight or "
		               "in doubt", call, (unsigned long long)seq);
		return KVT_EBUSY;
	}
	if (layer >= c->mem.g.n_layers) {
		client_set_err(c, "%s: layer %u of %u", call, layer,
		               c->mem.g.n_layers);
		return KVT_EINVAL;
	}
	return 0;
}

int kvt_write_kv(kvt_client *c, kvt_seq seq, uint32_t layer, uint32_t k0,
                 uint32_t n, const void *k, const void *v,
                 uint64_t tok_stride, uint64_t head_stride)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	const struct shm_geom *g = &c->mem.g;
	uint32_t slot;
	int rc = bulk_slot(c, "kvt_write_kv", seq, layer, &slot);
	if (rc)
		return rc;
	if (n == 0)
		return 0;
	if (!k || !v) {
		client_set_err(c, "kvt_write_kv: NULL %s", k ? "v" : "k");
		return KVT_EINVAL;
	}
	/* Rows must not overlap: a token's heads and the tokens apart by at
	 * least a row each, in one of the two orders. */
	uint64_t hd = g->head_dim, H = g->n_kv_heads;
	int ok = (head_stride >= hd && tok_stride >= head_stride * H) ||
	         (tok_stride >= hd && head_stride >= tok_stride * n) ||
	         (H == 1 && tok_stride >= hd) || (n == 1 && head_stride >= hd);
	if (!ok) {
		client_set_err(c, "kvt_write_kv: strides %llu (token) and %llu "
		               "(head) overlap rows of %llu elements",
		               (unsigned long long)tok_stride,
		               (unsigned long long)head_stride,
		               (unsigned long long)hd);
		return KVT_EINVAL;
	}
	if ((uint64_t)k0 + n > c->seqs[slot].room) {
		client_set_err(c, "kvt_write_kv: entries %u .. %llu beyond the "
		               "headroom of %u", k0,
		               (unsigned long long)k0 + n - 1, c->seqs[slot].room);
		return KVT_EHEADROOM;
	}
	/* Every destination page first. */
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		const struct shm_list *l = shm_list_at(c->mem.table, g, slot,
		                                       layer, h);
		uint32_t np = l->n_pages < g->max_pages ? l->n_pages
		                                        : g->max_pages;
		uint64_t last = ((uint64_t)l->len + k0 + n - 1) / g->page_tokens;
		for (uint64_t p = ((uint64_t)l->len + k0) / g->page_tokens;
		     p <= last; p++)
			if (p >= np || !mem_page(&c->mem, l->pages[p])) {
				client_set_err(c, "kvt_write_kv: layer %u KV head "
				               "%u has no page for entry %llu", layer,
				               h, (unsigned long long)p *
				                          g->page_tokens);
				return KVT_EPROTO;
			}
	}
	const size_t eb = g->elem_bytes, rb = hd * eb;
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		const struct shm_list *l = shm_list_at(c->mem.table, g, slot,
		                                       layer, h);
		for (uint32_t t = 0; t < n; t++) {
			uint64_t e = (uint64_t)l->len + k0 + t;
			char *page = mem_page(&c->mem,
			                      l->pages[e / g->page_tokens]);
			uint64_t row = e % g->page_tokens;
			size_t off = (size_t)(t * tok_stride + h * head_stride) *
			             eb;
			char *kd = page + row * rb,
			     *vd = page + (g->page_tokens + row) * rb;
			if ((rc = client_copy(c, kd, (const char *)k + off,
			                      rb)) ||
			    (rc = client_copy(c, vd, (const char *)v + off, rb)))
				return rc;
		}
	}
	return 0;
}

int kvt_stage(kvt_client *c, kvt_seq seq, uint32_t layer, uint32_t pos0,
              uint32_t n, const float *x, const float *q, const float *lse)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	const struct shm_geom *g = &c->mem.g;
	uint32_t slot;
	int rc = bulk_slot(c, "kvt_stage", seq, layer, &slot);
	if (rc || n == 0 || !g->stage_inputs)
		return rc;
	const uint32_t in = g->stage_inputs;
	if (!g->stage_tokens || !c->mem.stage) {
		client_set_err(c, "kvt_stage: the tenant has no staging "
		               "(stage_tokens 0)");
		return KVT_EINVAL;
	}
	if (n > g->stage_tokens) {
		client_set_err(c, "kvt_stage: %u positions, the ring holds %u",
		               n, g->stage_tokens);
		return KVT_EINVAL;
	}
	if (((in & KVT_INPUT_X) && !x) || ((in & KVT_INPUT_Q) && !q) ||
	    ((in & KVT_INPUT_LSE) && !lse)) {
		client_set_err(c, "kvt_stage: the policy reads %s, given as "
		               "NULL", (in & KVT_INPUT_X) && !x ? "x"
		                       : (in & KVT_INPUT_Q) && !q ? "q" : "lse");
		return KVT_EINVAL;
	}
	const size_t nx = g->d_model, nq = (size_t)g->n_heads * g->head_dim,
	             nl = g->n_heads;
	void *base = c->mem.dstage.base ? c->mem.dstage.base : c->mem.stage;
	for (uint32_t t = 0; t < n; t++) {
		float *e = shm_stage_at(base, g, slot, layer, pos0 + t);
		if ((in & KVT_INPUT_X) &&
		    (rc = client_copy(c, e, x + t * nx, nx * sizeof(float))))
			return rc;
		if ((in & KVT_INPUT_Q) &&
		    (rc = client_copy(c, e + g->stage_q_off, q + t * nq,
		              nq * sizeof(float))))
			return rc;
		if ((in & KVT_INPUT_LSE) &&
		    (rc = client_copy(c, e + g->stage_lse_off, lse + t * nl,
		              nl * sizeof(float))))
			return rc;
	}
	return 0;
}
