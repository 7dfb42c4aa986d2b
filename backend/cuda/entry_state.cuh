/*
 * entry_state.cuh — what the device selections that keep per-entry state
 * between syncs share (attn_select.cu: H2O's; tova_select.cu: TOVA's;
 * pop_select.cu: KVpop's): the two halves of a record's state (positions
 * [cap], then [cap][F] floats; a sync reads one half and writes the
 * other, so a refused sync leaves no trace), the check of a sync's new
 * staged rows, and the compaction of a half by a job's drops, pairing
 * holes and tail entries as compact_drops pairs the pages (backend.h).
 * Internal to libkvtrim-cuda.so; each file includes its own static copy.
 */
#ifndef KVT_CUDA_ENTRY_STATE_CUH
#define KVT_CUDA_ENTRY_STATE_CUH

#include "backend_cuda.cuh"
#include "prompt_select.cuh"
#include "select_topk.cuh"

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

/* One block: *out = 1 when a value of the rows [first, first + n) of the
 * ring is not finite among x (x_floats at 0; 0: not read), q (n_heads *
 * head_dim at rl.q_off) and lse (n_heads at rl.lse_off), else 0 — what
 * policy_decide checks. */
static __global__ void bc_es_check(const float *ring, const kvt_backend_rows rl,
                                   uint32_t first, uint32_t n,
                                   uint32_t x_floats, uint32_t n_heads,
                                   uint32_t head_dim, uint32_t *out)
{
	__shared__ uint32_t bad;
	if (threadIdx.x == 0)
		bad = 0;
	__syncthreads();
	const uint32_t nq = n_heads * head_dim, per = x_floats + nq + n_heads;
	const uint64_t tot = (uint64_t)n * per;
	uint32_t mine = 0;
	for (uint64_t e = threadIdx.x; e < tot; e += blockDim.x) {
		const float *row = bc_es_row(ring, rl,
		                             first + (uint32_t)(e / per));
		uint32_t k = (uint32_t)(e % per);
		float v = k < x_floats ? row[k]
		          : k < x_floats + nq ? row[rl.q_off + k - x_floats]
		          : row[rl.lse_off + k - x_floats - nq];
		mine |= !isfinite(v);
	}
	if (mine)
		atomicOr(&bad, 1u);
	__syncthreads();
	if (threadIdx.x == 0)
		*out = bad;
}

/* The half `half` of record r compacted by the ascending drops d (their
 * count at *count, at most n_drop read) of its L entries: one thread per
 * drop below the new length (a hole) takes the (k+1)-th kept entry at or
 * above it, as compact_drops pairs them. */
static __global__ void bc_es_compact(void *state, uint32_t cap, uint32_t F,
                                     uint32_t r, uint32_t half, uint32_t L,
                                     uint32_t n_drop, const uint32_t *d,
                                     const uint32_t *count)
{
	const uint32_t m = *count < n_drop ? *count : n_drop;
	if (m > L)
		return;
	const uint32_t NL = L - m;
	uint32_t h = 0, hi = m; /* holes: d[k] < NL */
	while (h < hi) {
		uint32_t mid = h + (hi - h) / 2;
		if (d[mid] < NL)
			h = mid + 1;
		else
			hi = mid;
	}
	uint32_t *pos = bc_es_half(state, cap, F, r, half);
	float *S = (float *)(pos + cap);
	const uint32_t *t = d + h;
	for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < h;
	     k += gridDim.x * blockDim.x) {
		uint32_t lo = 0, up = m - h;
		while (lo < up) { /* smallest q with t[q] - q > NL + k */
			uint32_t mid = lo + (up - lo) / 2;
			if (t[mid] - mid > NL + k)
				up = mid;
			else
				lo = mid + 1;
		}
		const uint32_t src = NL + k + lo, dst = d[k];
		pos[dst] = pos[src];
		for (uint32_t q = 0; q < F; q++)
			S[(uint64_t)dst * F + q] = S[(uint64_t)src * F + q];
	}
}

/* Threads per block of bc_es_compact. */
#define BC_ES_THREADS 256

/*
 * A due job's selection, queued on s: of its L entries (scores sc, the
 * positions of half `half` of record r as ranks, protection prot) the
 * best keep unprotected ones stay (select_topk_cuda, flags in drop), the
 * dropped indices ascending at idx (at most n_drop) with their count at
 * *count, and the half compacted by them.  0 or the error (noted, op
 * naming the op).
 */
static inline int bc_es_select(const char *op, void *state, uint32_t cap,
                               uint32_t F, uint32_t r, uint32_t half,
                               const float *sc, const uint8_t *prot,
                               uint8_t *drop, uint32_t L, uint32_t keep,
                               uint32_t *idx, uint32_t n_drop,
                               uint32_t *count, cudaStream_t s)
{
	const uint32_t *pos = bc_es_half(state, cap, F, r, half);
	int rv = select_topk_cuda(sc, pos, prot, L, keep, drop, NULL, NULL, s);
	if (rv)
		return rv;
	KVT_LAUNCH(bc_ps_indices, 1, BC_PS_IDX_THREADS, 0, s, drop, L, idx,
	           n_drop, count);
	BC_CALL(cudaGetLastError(), op);
	if (n_drop) {
		uint32_t cb = (n_drop + BC_ES_THREADS - 1) / BC_ES_THREADS;
		KVT_LAUNCH(bc_es_compact, cb > 4096 ? 4096 : cb, BC_ES_THREADS,
		           0, s, state, cap, F, r, half, L, n_drop, idx, count);
		BC_CALL(cudaGetLastError(), op);
	}
	return 0;
}

/*
 * The entry point of a device selection (attn_select, tova_select,
 * pop_select): n 0 does nothing; a NULL a or jobs, or a call
 * bc_ps_check_call refuses, is KVT_EINVAL (noted); then check() (the op's
 * own argument checks), then locked(c) under the context's lock, which
 * guards the scratch and cuBLAS handle the ops share.
 */
template <typename Check, typename Locked>
static inline int bc_es_entry(void *ctx, const char *op,
                              const struct kvt_backend_paged *pg,
                              const void *a, const void *jobs, uint32_t n,
                              enum kvt_dtype dtype, const uint32_t *out,
                              uint32_t out_words, Check check,
                              Locked locked)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n)
		return 0;
	if (!a || !jobs) {
		bc_note("%s: a NULL argument", op);
		return KVT_EINVAL;
	}
	int rv = bc_ps_check_call(op, pg, jobs, 0, NULL, 0, dtype, out,
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
