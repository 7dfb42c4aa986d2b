/*
 * shm.h — layout of the shared-memory segments, written once and used by
 * both the daemon and libkvtrim so the two sides can never disagree.
 *
 * Table segment (one per tenant; daemon writes, client maps read-only):
 *   struct shm_table_hdr, then max_seqs * n_layers * n_kv_heads list records
 *   of list_stride bytes each, indexed ((slot * n_layers) + layer) *
 *   n_kv_heads + head.  A record is struct shm_list followed by max_pages
 *   uint32 page ids.
 *
 * Staging segment (one per tenant; client writes, daemon reads):
 *   struct shm_stage_hdr, then for each (slot, layer) a ring of stage_tokens
 *   float32 entries [x: d_model][q: n_heads * head_dim][lse: n_heads], each
 *   part present only when the tenant's policy reads it (stage_inputs, the
 *   KVT_INPUT_* bits the daemon tells the client at hello): kvzap, which
 *   reads x only, stages d_model floats per token, not x + q + lse.
 *
 * Pool chunk (KVT_CHUNK_BYTES, one memfd each): pages_per_chunk pages of
 * page_bytes; page id p lives in the tenant's chunk slot p / pages_per_chunk
 * at byte offset (p % pages_per_chunk) * page_bytes.  A page is
 * [K: page_tokens x head_dim][V: page_tokens x head_dim] in the tenant dtype.
 */
#ifndef KVT_SHM_H
#define KVT_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

#define SHM_TABLE_MAGIC 0x4b565454u /* "KVTT" */
#define SHM_STAGE_MAGIC 0x4b565453u /* "KVTS" */
#define SHM_VERSION 2u /* 2: staging entries hold only stage_inputs */

/* The staged inputs there are (kvtrim.h's KVT_INPUT_* bits). */
#define SHM_STAGE_ALL (KVT_INPUT_X | KVT_INPUT_Q | KVT_INPUT_LSE)

/* The parameters that fix every size and offset of a tenant's layout. */
struct shm_geom {
	uint32_t max_seqs, n_layers, n_heads, n_kv_heads, head_dim, d_model;
	uint32_t page_tokens, max_tokens, headroom, stage_tokens;
	uint32_t elem_bytes;      /* kvt_dtype_size(dtype) */
	uint32_t max_pages;       /* per list: ceil((max_tokens+headroom)/page_tokens) */
	uint32_t pages_per_chunk; /* KVT_CHUNK_BYTES / page_bytes */
	uint64_t page_bytes;      /* 2 * page_tokens * head_dim * elem_bytes */
	uint64_t list_stride;     /* bytes per list record, 64-byte aligned */
	uint64_t table_bytes;     /* whole table segment */
	uint32_t stage_inputs;    /* parts of a staging entry: KVT_INPUT_X, _Q,
	                             _LSE bits (SHM_STAGE_ALL masked) */
	uint64_t stage_q_off;     /* floats before q in an entry (x's size
	                             when staged, else 0) */
	uint64_t stage_lse_off;   /* floats before lse (x's and q's) */
	uint64_t stage_entry_floats; /* floats of the staged parts */
	uint64_t stage_bytes;     /* whole staging segment (>= one header) */
};

struct shm_table_hdr {
	uint32_t magic, version;
	uint32_t max_seqs, n_layers, n_kv_heads, max_pages;
	uint64_t list_stride;
	uint64_t reserved[5];
};

struct shm_list {
	uint32_t len;     /* committed entries */
	uint32_t n_pages; /* valid ids in pages[] */
	uint64_t epoch;
	uint32_t pages[]; /* [max_pages] */
};

struct shm_stage_hdr {
	uint32_t magic, version;
	uint32_t max_seqs, n_layers, stage_tokens, entry_floats;
	uint32_t inputs;          /* stage_inputs */
	uint32_t reserved32;
	uint64_t reserved[4];
};

/* bytes rounded up to whole KVT_CHUNK_BYTES: the allocation of a device
 * segment (device table, device staging), whose size is the
 * granularity's multiple. */
static inline uint64_t shm_whole_chunks(uint64_t bytes)
{
	return (bytes + KVT_CHUNK_BYTES - 1) / KVT_CHUNK_BYTES * KVT_CHUNK_BYTES;
}

/*
 * Fills g from registration parameters (defaults already applied) and checks
 * them: non-zero sizes, n_heads % n_kv_heads == 0, a page fits a chunk,
 * dtype known, sizes that do not overflow.  stage_inputs (KVT_INPUT_* bits;
 * others ignored) says which parts a staging entry holds.  Returns 0 or
 * KVT_EGEOMETRY with a reason in err.
 */
int shm_geom_init(struct shm_geom *g, const struct kvt_geometry *geo,
                  enum kvt_dtype dtype, uint32_t page_tokens,
                  uint32_t max_seqs, uint32_t max_tokens, uint32_t headroom,
                  uint32_t stage_tokens, uint32_t stage_inputs, char *err,
                  size_t errlen);

/*
 * The layout of one staging entry holding the parts `inputs` (KVT_INPUT_*
 * bits) of a model: floats before q and before lse, and in all.  The one
 * definition both sides and the policies read rows by.
 */
void shm_stage_layout(uint32_t inputs, uint32_t d_model, uint32_t n_heads,
                      uint32_t head_dim, uint64_t *q_off, uint64_t *lse_off,
                      uint64_t *floats);

/* Checks a mapped staging header against g; 0 or KVT_EPROTO. */
int shm_stage_check(const void *stage, const struct shm_geom *g);

/* Writes the table header of a fresh (zeroed) table segment. */
void shm_table_init(void *table, const struct shm_geom *g);

/* Writes the staging header of a fresh staging segment. */
void shm_stage_init(void *stage, const struct shm_geom *g);

/* Checks a mapped table header against g; 0 or KVT_EPROTO. */
int shm_table_check(const void *table, const struct shm_geom *g);

/* The list record of (slot, layer, head); no bounds checks (callers check). */
struct shm_list *shm_list_at(void *table, const struct shm_geom *g,
                             uint32_t slot, uint32_t layer, uint32_t head);

/* Staged entry of (slot, layer, pos): its parts at 0 (x), stage_q_off and
 * stage_lse_off, those of stage_inputs only; no bounds checks. */
float *shm_stage_at(void *stage, const struct shm_geom *g, uint32_t slot,
                    uint32_t layer, uint32_t pos);

#endif
