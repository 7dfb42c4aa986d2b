/* shm.c — sizes and offsets of the shared segments; see shm.h. */
#include "shm.h"

#include <stdio.h>
#include <string.h>

#include "page.h"

#define SHM_ALIGN 64u

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static int bad(char *err, size_t errlen, const char *why)
{
	if (err && errlen)
		snprintf(err, errlen, "bad geometry: %s", why);
	return KVT_EGEOMETRY;
}

int shm_geom_init(struct shm_geom *g, const struct kvt_geometry *geo,
                  enum kvt_dtype dtype, uint32_t page_tokens,
                  uint32_t max_seqs, uint32_t max_tokens, uint32_t headroom,
                  uint32_t stage_tokens, uint32_t stage_inputs, char *err,
                  size_t errlen)
{
	memset(g, 0, sizeof(*g));
	if (!geo->n_layers || !geo->n_heads || !geo->n_kv_heads ||
	    !geo->head_dim || !geo->d_model)
		return bad(err, errlen, "every model dimension must be > 0");
	if (geo->n_layers > 1024 || geo->n_heads > 1024 ||
	    geo->n_kv_heads > 1024 || geo->head_dim > 1024 ||
	    geo->d_model > 65536)
		return bad(err, errlen, "a model dimension is implausibly large");
	if (geo->n_heads % geo->n_kv_heads)
		return bad(err, errlen, "n_heads must be a multiple of n_kv_heads");
	size_t es = kvt_dtype_size(dtype);
	if (!es)
		return bad(err, errlen, "unknown dtype");
	if (!page_tokens || page_tokens > 4096)
		return bad(err, errlen, "page_tokens must be in [1, 4096]");
	if (!max_seqs || max_seqs > 65536)
		return bad(err, errlen, "max_seqs must be in [1, 65536]");
	if (!max_tokens || max_tokens > (1u << 24))
		return bad(err, errlen, "max_tokens must be in [1, 2^24]");
	if (!headroom || headroom > max_tokens)
		return bad(err, errlen, "headroom must be in [1, max_tokens]");
	if (stage_tokens > 65536)
		return bad(err, errlen, "stage_tokens must be <= 65536");
	if (stage_tokens && stage_tokens < headroom)
		return bad(err, errlen, "stage_tokens must be 0 or >= headroom");

	g->max_seqs = max_seqs;
	g->n_layers = geo->n_layers;
	g->n_heads = geo->n_heads;
	g->n_kv_heads = geo->n_kv_heads;
	g->head_dim = geo->head_dim;
	g->d_model = geo->d_model;
	g->page_tokens = page_tokens;
	g->max_tokens = max_tokens;
	g->headroom = headroom;
	g->stage_tokens = stage_tokens;
	g->elem_bytes = (uint32_t)es;
	g->page_bytes = page_nbytes(page_tokens, geo->head_dim, es);
	if (g->page_bytes > KVT_CHUNK_BYTES)
		return bad(err, errlen, "one page is larger than a 2 MiB chunk");
	g->pages_per_chunk = (uint32_t)(KVT_CHUNK_BYTES / g->page_bytes);
	g->max_pages = (uint32_t)(((uint64_t)max_tokens + headroom +
	                           page_tokens - 1) / page_tokens);
	g->list_stride = align_up(sizeof(struct shm_list) +
	                          4ull * g->max_pages, SHM_ALIGN);
	uint64_t n_lists = (uint64_t)max_seqs * g->n_layers * g->n_kv_heads;
	g->table_bytes = align_up(sizeof(struct shm_table_hdr), SHM_ALIGN) +
	                 n_lists * g->list_stride;
	g->stage_inputs = stage_inputs & SHM_STAGE_ALL;
	shm_stage_layout(g->stage_inputs, g->d_model, g->n_heads, g->head_dim,
	                 &g->stage_q_off, &g->stage_lse_off,
	                 &g->stage_entry_floats);
	g->stage_bytes = align_up(sizeof(struct shm_stage_hdr), SHM_ALIGN) +
	                 (uint64_t)max_seqs * g->n_layers * stage_tokens *
	                         g->stage_entry_floats * sizeof(float);
	if (g->table_bytes > (64ull << 30) || g->stage_bytes > (64ull << 30))
		return bad(err, errlen, "segments would exceed 64 GiB");
	return 0;
}

void shm_stage_layout(uint32_t inputs, uint32_t d_model, uint32_t n_heads,
                      uint32_t head_dim, uint64_t *q_off, uint64_t *lse_off,
                      uint64_t *floats)
{
	uint64_t n = inputs & KVT_INPUT_X ? d_model : 0;
	*q_off = n;
	n += inputs & KVT_INPUT_Q ? (uint64_t)n_heads * head_dim : 0;
	*lse_off = n;
	n += inputs & KVT_INPUT_LSE ? n_heads : 0;
	*floats = n;
}

void shm_table_init(void *table, const struct shm_geom *g)
{
	struct shm_table_hdr *h = table;
	h->magic = SHM_TABLE_MAGIC;
	h->version = SHM_VERSION;
	h->max_seqs = g->max_seqs;
	h->n_layers = g->n_layers;
	h->n_kv_heads = g->n_kv_heads;
	h->max_pages = g->max_pages;
	h->list_stride = g->list_stride;
}

void shm_stage_init(void *stage, const struct shm_geom *g)
{
	struct shm_stage_hdr *h = stage;
	h->magic = SHM_STAGE_MAGIC;
	h->version = SHM_VERSION;
	h->max_seqs = g->max_seqs;
	h->n_layers = g->n_layers;
	h->stage_tokens = g->stage_tokens;
	h->entry_floats = (uint32_t)g->stage_entry_floats;
	h->inputs = g->stage_inputs;
}

int shm_stage_check(const void *stage, const struct shm_geom *g)
{
	const struct shm_stage_hdr *h = stage;
	if (h->magic != SHM_STAGE_MAGIC || h->version != SHM_VERSION ||
	    h->max_seqs != g->max_seqs || h->n_layers != g->n_layers ||
	    h->stage_tokens != g->stage_tokens ||
	    h->entry_floats != g->stage_entry_floats ||
	    h->inputs != g->stage_inputs)
		return KVT_EPROTO;
	return 0;
}

int shm_table_check(const void *table, const struct shm_geom *g)
{
	const struct shm_table_hdr *h = table;
	if (h->magic != SHM_TABLE_MAGIC || h->version != SHM_VERSION ||
	    h->max_seqs != g->max_seqs || h->n_layers != g->n_layers ||
	    h->n_kv_heads != g->n_kv_heads || h->max_pages != g->max_pages ||
	    h->list_stride != g->list_stride)
		return KVT_EPROTO;
	return 0;
}

struct shm_list *shm_list_at(void *table, const struct shm_geom *g,
                             uint32_t slot, uint32_t layer, uint32_t head)
{
	uint64_t idx = ((uint64_t)slot * g->n_layers + layer) * g->n_kv_heads +
	               head;
	return (struct shm_list *)((char *)table +
	                           align_up(sizeof(struct shm_table_hdr),
	                                    SHM_ALIGN) +
	                           idx * g->list_stride);
}

float *shm_stage_at(void *stage, const struct shm_geom *g, uint32_t slot,
                    uint32_t layer, uint32_t pos)
{
	uint64_t ring = (uint64_t)slot * g->n_layers + layer;
	uint64_t idx = ring * g->stage_tokens + pos % g->stage_tokens;
	return (float *)((char *)stage +
	                 align_up(sizeof(struct shm_stage_hdr), SHM_ALIGN)) +
	       idx * g->stage_entry_floats;
}

/* The public record (kvt_table_view) is this layout under another name. */
_Static_assert(sizeof(struct shm_list) == sizeof(struct kvt_list_record) &&
                       offsetof(struct shm_list, n_pages) ==
                               offsetof(struct kvt_list_record, n_pages) &&
                       offsetof(struct shm_list, epoch) ==
                               offsetof(struct kvt_list_record, epoch) &&
                       offsetof(struct shm_list, pages) ==
                               offsetof(struct kvt_list_record, pages),
               "struct shm_list and struct kvt_list_record differ");
