/*
 * entry_state.cuh — what the device rules that keep per-entry state
 * between syncs share (policies/h2o.cu: H2O's; policies/tova.cu: TOVA's;
 * policies/kvpop.cu: KVpop's): the two halves of a record's state
 * (positions [cap], then [cap][F] floats; a sync reads one half and
 * writes the other, so a refused sync leaves no trace), a staged row's
 * address, the layout check and the rules' entry point.  Their batched
 * checks and selections: batch_select.cuh.
 * Internal to libkvtrim-cuda.so; each file includes its own static copy.
 */
#ifndef KVT_CUDA_ENTRY_STATE_CUH
#define KVT_CUDA_ENTRY_STATE_CUH

#include "backend_cuda.cuh"
#include "prompt_select.cuh"

/* Half h of record r in state: positions [cap], then [cap][F] floats. */
static __host__ __device__ __forceinline__ uint32_t *
bc_es_half(void *state, uint32_t cap, uint32_t F, uint32_t r, uint32_t h)
{
	return (uint32_t *)state + ((uint64_t)r * 2 + h) * cap * (uint64_t)(1 + F);
}

/* Row of position p in a staging ring laid out as rl says. */
static __device__ __forceinline__ const float *
bc_es_row(const float *ring, const kvt_backend_rows &rl, uint32_t p)
{
	return ring + (uint64_t)(p % rl.stage_tokens) * rl.row_floats;
}

/* 1 when a selection's geometry and staging layout hold together:
 * head_dim and KV heads not 0, n_heads a multiple of them, a state, and
 * every query head's q and lse inside a row of a ring that has rows. */
static inline int bc_es_layout_ok(uint32_t n_heads, uint32_t nkv, uint32_t hd,
                                  const void *state,
                                  const kvt_backend_rows &rl)
{
	return hd && nkv && n_heads % nkv == 0 && state && rl.stage_tokens &&
	       rl.q_off + (uint64_t)n_heads * hd <= rl.row_floats &&
	       rl.lse_off + (uint64_t)n_heads <= rl.row_floats;
}

/*
 * The entry point of a device rule (kvt_backend_rule.run): n 0 does
 * nothing; a NULL g, a or jobs, or a call bc_ps_check_call refuses, is
 * KVT_EINVAL (noted); then check() (the rule's own argument checks), then
 * locked(c) under the context's lock, which guards the scratch and cuBLAS
 * handle the ops share.
 */
template <typename Check, typename Locked>
static inline int bc_es_entry(void *ctx, const char *op,
                              const struct kvt_backend_paged *pg,
                              const struct kvt_backend_rule_geom *g,
                              const void *a, const void *jobs, uint32_t n,
                              const uint32_t *out, uint32_t out_words,
                              Check check, Locked locked)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n)
		return 0;
	if (!g || !a || !jobs) {
		bc_note("%s: a NULL argument", op);
		return KVT_EINVAL;
	}
	int rv = bc_ps_check_call(op, pg, jobs, 0, NULL, 0, g->dtype, out,
	                          out_words);
	if (!rv)
		rv = check();
	if (rv)
		return rv;
	pthread_mutex_lock(&c->lock);
	rv = locked(c);
	pthread_mutex_unlock(&c->lock);
	return rv;
}

#endif
