/*
 * batch_select.cuh — what the device rules share to do a whole sync in
 * a fixed number of launches, whatever its sequences, layers and heads
 * (policies/h2o.cu, tova.cu, kvpop.cu): the jobs are all that
 * crosses (one upload), every job's new staged rows are checked in one
 * launch (bc_bs_check_jobs), the due lists are planned on the device
 * (bc_bs_plan), and every due list's selection takes three launches
 * (struct bc_seg): one segmented top-k
 * (select_topk_batch_cuda) over the lists' scores laid end to end, their
 * drop indices in order, and each list's state half compacted by them as
 * compact_drops pairs the pages.  The end-of-prefill rules
 * (policies/snapkv.cu, expected_attention.cu), whose jobs are lists and
 * which keep no state, plan and select them the same way (no
 * compaction).  Internal to libkvtrim-cuda.so; each file includes its own
 * static copy.
 *
 * A job struct J has the fields ring, len, n_new, n_seen, due, keep,
 * n_drop, drop_off and (with state) cur, and the file that includes this
 * header declares before it, for its J:
 *   int bc_bs_checked(const J &)            whether the job checks its
 *                                           rows (bc_bs_check_jobs)
 *   uint32_t bc_bs_srec(const J &)          the state record of its lists
 *   int bc_bs_band(const J &, uint32_t delay)  whether it has a band
 *   uint32_t bc_bs_band_n(const J &)        the band's entries (the
 *                                           caller's count)
 *   uint32_t bc_bs_next_half(const J &)     (a J without cur) the state
 *                                           half its list compacts into
 * (static __device__ functions), so that this header names no rule.
 */
#ifndef KVT_CUDA_BATCH_SELECT_CUH
#define KVT_CUDA_BATCH_SELECT_CUH

#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "entry_state.cuh"
#include "prompt_select.cuh"
#include "select_topk.cuh"

#define BC_BS_THREADS 256

/* The state half a due job's list is compacted into: the one it did not
 * read.  A rule whose J keeps no state (no cur) declares its own
 * overload, which the plan prefers. */
template <typename J>
static __device__ __forceinline__ uint32_t bc_bs_next_half(const J &j)
{
	return j.cur ^ 1u;
}

/* --------------------------------------------------- the row checks */

/* Every job's check in one launch, a block each: its new rows [n_seen -
 * n_new, n_seen) of its ring (x_floats of x, q and lse); out[k] = 1 when a
 * value is not finite, else 0 (jobs bc_bs_checked skips leave out[k]
 * alone).  J: a job struct with ring, n_new and n_seen; no descriptor of
 * its own crosses. */
template <typename J>
__global__ void bc_bs_check_jobs(const J *jobs, const kvt_backend_rows rl,
                                 uint32_t x_floats, uint32_t n_heads,
                                 uint32_t head_dim, uint32_t *out)
{
	__shared__ uint32_t bad;
	const J j = jobs[blockIdx.x];
	if (!bc_bs_checked(j))
		return;
	if (threadIdx.x == 0)
		bad = 0;
	__syncthreads();
	const uint32_t nq = n_heads * head_dim, per = x_floats + nq + n_heads,
	               first = j.n_seen - j.n_new;
	const uint64_t tot = (uint64_t)j.n_new * per;
	uint32_t mine = 0;
	for (uint64_t e = threadIdx.x; e < tot; e += blockDim.x) {
		const float *row = bc_es_row(j.ring, rl,
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
		out[blockIdx.x] = bad;
}

/* ----------------------------------------------------- the selection */

/*
 * One due list: its L entries at [first, first + L) of the flat score,
 * rank, protection and drop arrays (first also in the separate array
 * select_topk_batch_cuda reads, keep likewise), the drops the host
 * expects (at most n_drop indices written, at out[idx]; their count at
 * out[cnt]), the state half to compact by them (record srec, half; F
 * floats an entry), and its job (whose veto flag, where the op has them,
 * replaces the count by UINT32_MAX and the drops by none).
 */
struct bc_seg {
	uint32_t first, L, n_drop, idx, cnt, srec, half, job;
};

/* The run of items [*lo, *hi) of n that thread t of a block of
 * BC_BS_THREADS walks in the one-block plans (contiguous runs, so that an
 * exclusive scan of the runs' counts gives each item its place). */
static __device__ __forceinline__ void bc_bs_run(uint32_t n, uint32_t *lo,
                                                 uint32_t *hi)
{
	const uint32_t per = (n + BC_BS_THREADS - 1) / BC_BS_THREADS;
	const uint32_t t = threadIdx.x;
	*lo = t * per < n ? t * per : n;
	*hi = *lo + per < n ? *lo + per : n;
}

/* The exclusive scan of three counters over a block's runs: c holds this
 * thread's counts and becomes what the runs before it counted; sum (the
 * block's shared [BC_BS_THREADS + 1][3]) holds the totals at
 * sum[BC_BS_THREADS] afterwards.  Every thread of the block calls it. */
static __device__ void bc_bs_scan3(uint64_t c[3], uint64_t (*sum)[3])
{
	const uint32_t t = threadIdx.x;
	for (int q = 0; q < 3; q++)
		sum[t + 1][q] = c[q];
	__syncthreads();
	if (t == 0) {
		for (int q = 0; q < 3; q++)
			sum[0][q] = 0;
		for (uint32_t k = 1; k <= BC_BS_THREADS; k++)
			for (int q = 0; q < 3; q++)
				sum[k][q] += sum[k - 1][q];
	}
	__syncthreads();
	for (int q = 0; q < 3; q++)
		c[q] = sum[t][q];
}

/*
 * The plan of a call on the device, one block, so that the host uploads
 * the jobs alone: exclusive scans over the jobs in order give each due
 * job (entries and due) its place at[k] in the flat arrays (UINT32_MAX:
 * not due) and its list: first [nseg + 1], keep [nseg], segs [nseg]
 * (indices at out[2 n + drop_off], count at out[n + k], the half cur ^ 1
 * compacted); and each job with a band its place boff[k] in the flat band
 * indices (UINT32_MAX: none; boff may be NULL).  The host counted nseg
 * from the same jobs.  One block of BC_BS_THREADS; sum: its shared
 * [BC_BS_THREADS + 1][3].
 */
template <typename J>
static __device__ void bc_bs_plan_dev(const J *jobs, uint32_t n,
                                      uint32_t delay, uint32_t *at,
                                      uint32_t *boff, uint32_t *first,
                                      uint32_t *keep, struct bc_seg *segs,
                                      uint64_t (*sum)[3])
{
	uint32_t lo, hi;
	bc_bs_run(n, &lo, &hi);
	uint64_t c[3] = {0, 0, 0}; /* due lists, their entries, band entries */
	for (uint32_t k = lo; k < hi; k++) {
		const J j = jobs[k];
		const uint32_t L = j.len + j.n_new;
		if (L && j.due) {
			c[0]++;
			c[1] += L;
		}
		c[2] += bc_bs_band(j, delay) ? bc_bs_band_n(j) : 0;
	}
	bc_bs_scan3(c, sum);
	if (threadIdx.x == 0)
		first[sum[BC_BS_THREADS][0]] = (uint32_t)sum[BC_BS_THREADS][1];
	uint32_t d = (uint32_t)c[0], a = (uint32_t)c[1], b = (uint32_t)c[2];
	for (uint32_t k = lo; k < hi; k++) {
		const J j = jobs[k];
		const uint32_t L = j.len + j.n_new;
		const int band = bc_bs_band(j, delay);
		if (boff)
			boff[k] = band ? b : UINT32_MAX;
		b += band ? bc_bs_band_n(j) : 0;
		at[k] = UINT32_MAX;
		if (!L || !j.due)
			continue;
		at[k] = first[d] = a;
		keep[d] = j.keep;
		segs[d++] = (struct bc_seg){a, L, j.n_drop, 2 * n + j.drop_off,
		                            n + k, bc_bs_srec(j), bc_bs_next_half(j),
		                            k};
		a += L;
	}
}

/* bc_bs_plan_dev as one launch of one block of BC_BS_THREADS. */
template <typename J>
__global__ void bc_bs_plan(const J *jobs, uint32_t n, uint32_t delay,
                           uint32_t *at, uint32_t *boff, uint32_t *first,
                           uint32_t *keep, struct bc_seg *segs)
{
	__shared__ uint64_t sum[BC_BS_THREADS + 1][3];
	bc_bs_plan_dev(jobs, n, delay, at, boff, first, keep, segs, sum);
}

/* What the host counts of a call's jobs to size its scratch and grids. */
struct bc_bs_count {
	uint32_t nseg, tot, maxL, max_drop;
	uint64_t band;
	uint32_t maxB;
};

template <typename J>
static inline int bc_bs_count_jobs(const J *jobs, uint32_t n,
                                   struct bc_bs_count *c)
{
	uint64_t tot = 0;
	memset(c, 0, sizeof(*c));
	for (uint32_t k = 0; k < n; k++) {
		const uint32_t L = jobs[k].len + jobs[k].n_new;
		c->maxL = L > c->maxL ? L : c->maxL;
		if (!L || !jobs[k].due)
			continue;
		c->nseg++;
		tot += L;
		if (jobs[k].n_drop > c->max_drop)
			c->max_drop = jobs[k].n_drop;
	}
	if (tot > UINT32_MAX)
		return KVT_EINVAL;
	c->tot = (uint32_t)tot;
	return 0;
}

/* One block per list: its drop indices in order (at most n_drop
 * written) and their count; a vetoed list: count UINT32_MAX, no indices.
 * Each thread takes a contiguous run of the entries, counts its drops,
 * and writes them after the drops of the runs before it (an exclusive
 * scan of the counts in shared memory): the serial scan's output, without
 * one GPU thread walking the whole list.  At most BC_BS_THREADS threads a
 * block. */
static __global__ void bc_bs_indices(const uint8_t *drop,
                                     const struct bc_seg *segs,
                                     const uint32_t *veto, uint32_t *out)
{
	__shared__ uint32_t before[BC_BS_THREADS + 1];
	const struct bc_seg g = segs[blockIdx.x];
	if (veto && veto[g.job]) {
		if (threadIdx.x == 0)
			out[g.cnt] = UINT32_MAX;
		return;
	}
	const uint8_t *dr = drop + g.first;
	const uint32_t t = threadIdx.x, nt = blockDim.x, len = g.L;
	const uint32_t per = (len + nt - 1) / nt;
	const uint32_t lo = t * per < len ? t * per : len;
	const uint32_t hi = lo + per < len ? lo + per : len;
	uint32_t c = 0;
	for (uint32_t i = lo; i < hi; i++)
		c += dr[i] != 0;
	before[t + 1] = c;
	__syncthreads();
	if (t == 0) {
		before[0] = 0;
		for (uint32_t k = 1; k <= nt; k++)
			before[k] += before[k - 1];
		out[g.cnt] = before[nt];
	}
	__syncthreads();
	uint32_t o = before[t];
	uint32_t *idx = out + g.idx;
	for (uint32_t i = lo; i < hi && o < g.n_drop; i++)
		if (dr[i])
			idx[o++] = i;
}

/* One list's half compacted by its drops, by the threads of one grid
 * row: one thread per drop below the new length (a hole) takes the
 * (k+1)-th kept entry at or above it, as compact_drops pairs them. */
static __device__ void bc_bs_compact_one(void *state, uint32_t cap,
                                         uint32_t F, const struct bc_seg &g,
                                         const uint32_t *out)
{
	const uint32_t *d = out + g.idx;
	const uint32_t cnt = out[g.cnt];
	if (cnt == UINT32_MAX) /* vetoed: nothing dropped */
		return;
	const uint32_t m = cnt < g.n_drop ? cnt : g.n_drop;
	if (m > g.L)
		return;
	const uint32_t NL = g.L - m;
	uint32_t h = 0, hi = m; /* holes: d[k] < NL */
	while (h < hi) {
		uint32_t mid = h + (hi - h) / 2;
		if (d[mid] < NL)
			h = mid + 1;
		else
			hi = mid;
	}
	uint32_t *pos = bc_es_half(state, cap, F, g.srec, g.half);
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

/* Grid (blocks, rows): the lists, a grid row each in turn. */
static __global__ void bc_bs_compact(void *state, uint32_t cap, uint32_t F,
                                     const struct bc_seg *segs, uint32_t nseg,
                                     const uint32_t *out)
{
	for (uint32_t l = blockIdx.y; l < nseg; l += gridDim.y)
		bc_bs_compact_one(state, cap, F, segs[l], out);
}

/* Grid rows for n jobs or lists (each kernel loops over the rest). */
static inline uint32_t bc_bs_rows(uint32_t n)
{
	return n > 65535 ? 65535 : n ? n : 1;
}


/* The x of a grid (items, jobs) whose kernels loop over their items by
 * the grid's stride: threads a block (a warp to BC_BS_THREADS: short
 * lists leave no block mostly idle) and blocks (at most 4096) for n. */
static inline uint32_t bc_bs_threads(uint64_t n)
{
	return n <= 32 ? 32 : n <= 64 ? 64 : n <= 128 ? 128 : BC_BS_THREADS;
}

static inline uint32_t bc_bs_blocks(uint64_t n)
{
	const uint32_t t = bc_bs_threads(n);
	uint64_t b = (n + t - 1) / t;
	return b > 4096 ? 4096 : b ? (uint32_t)b : 1;
}

/*
 * The drops of nseg due lists marked in drop, queued on s: their indices
 * and counts into dout (veto: a flag per job whose lists drop nothing,
 * count UINT32_MAX, or NULL), the halves compacted (F floats of state an
 * entry besides its position).  Two launches (one without drops).
 */
static inline int bc_bs_drops(const char *op, void *state, uint32_t cap,
                              uint32_t F, uint8_t *drop,
                              const struct bc_seg *segs, uint32_t nseg,
                              uint32_t maxL, const uint32_t *veto,
                              uint32_t max_drop, uint32_t *dout,
                              cudaStream_t s)
{
	if (!nseg)
		return 0;
	KVT_LAUNCH(bc_bs_indices, nseg, bc_bs_threads(maxL), 0, s, drop, segs,
	           veto, dout);
	BC_CALL(cudaGetLastError(), op);
	if (max_drop) {
		const uint32_t t = bc_bs_threads(max_drop);
		const uint32_t bx = (max_drop + t - 1) / t;
		dim3 grid(bx > 64 ? 64 : bx, bc_bs_rows(nseg));
		KVT_LAUNCH(bc_bs_compact, grid, t, 0, s, state, cap, F, segs,
		           nseg, dout);
		BC_CALL(cudaGetLastError(), op);
	}
	return 0;
}

/*
 * The selection of nseg due lists, queued on s: select_topk_batch_cuda
 * over the flat sc / rank / prot into drop (first [nseg + 1] and keep
 * [nseg] device arrays), the drop indices and counts into dout (veto:
 * a flag per job, or NULL), the halves compacted.  Three launches
 * whatever nseg; maxL, the longest list's entries (bc_bs_count), sizes
 * the blocks of the first two and max_drop the compaction's grid, so
 * that short lists take short blocks; neither changes a result.
 */
static inline int bc_bs_select(const char *op, void *state, uint32_t cap,
                               uint32_t F, const float *sc,
                               const uint32_t *rank, const uint8_t *prot,
                               uint8_t *drop, const uint32_t *first,
                               const uint32_t *keep,
                               const struct bc_seg *segs, uint32_t nseg,
                               uint32_t maxL, const uint32_t *veto,
                               uint32_t max_drop, uint32_t *dout,
                               cudaStream_t s)
{
	if (!nseg)
		return 0;
	int rv = select_topk_batch_cuda(sc, rank, prot, first, nseg, maxL,
	                                keep, drop, NULL, s);
	if (rv) {
		bc_note("%s: select_topk_batch_cuda failed", op);
		return rv;
	}
	return bc_bs_drops(op, state, cap, F, drop, segs, nseg, maxL, veto,
	                   max_drop, dout, s);
}

/* Scratch offsets of one call of an entry-state op: the output words,
 * the jobs, the plan (bc_bs_plan) and the flat arrays. */
struct bc_bs_mem {
	size_t o_jobs, o_at, o_first, o_keep, o_segs, o_sc, o_rank, o_prot,
	       o_drop, need;
};

static inline struct bc_bs_mem bc_bs_layout(const struct bc_bs_count *cn,
                                       uint32_t n, size_t job_bytes,
                                       uint32_t out_words)
{
	struct bc_bs_mem m;
	m.o_jobs = bc_ps_al((size_t)out_words * 4);
	m.o_at = m.o_jobs + bc_ps_al((size_t)n * job_bytes);
	m.o_first = m.o_at + bc_ps_al((size_t)n * 4);
	m.o_keep = m.o_first + bc_ps_al((size_t)(cn->nseg + 1) * 4);
	m.o_segs = m.o_keep + bc_ps_al((size_t)cn->nseg * 4);
	m.o_sc = m.o_segs + bc_ps_al((size_t)cn->nseg * sizeof(struct bc_seg));
	m.o_rank = m.o_sc + bc_ps_al((size_t)cn->tot * 4);
	m.o_prot = m.o_rank + bc_ps_al((size_t)cn->tot * 4);
	m.o_drop = m.o_prot + bc_ps_al(cn->tot);
	m.need = m.o_drop + bc_ps_al(cn->tot);
	return m;
}


/* One call of a rule whose scratch is bc_bs_layout's: the jobs' counts,
 * the layout, and its arrays in the context's window (device). */
struct bc_bs_call {
	struct bc_bs_count cn;
	struct bc_bs_mem m;
	uint32_t *dout;       /* [out_words] the output words */
	uint32_t *at, *first, *keep, *rank;
	struct bc_seg *segs;
	float *sc;
	uint8_t *prot, *drop;
	void *extra;          /* the rule's own scratch after them */
};

/*
 * The start every such call makes, queued on s under the context's lock
 * (named op in errors): the jobs counted (bc_bs_count_jobs: KVT_EINVAL
 * for a job beyond its list), the window sized, the output words zeroed,
 * extra bytes more of the rule's own at k->extra (uninitialised), the
 * jobs uploaded to *dj (counted with param_bytes of params), with
 * CHECK (a rule that reads staged rows: its J has bc_bs_checked) every
 * job's new rows in rows checked (bc_bs_check_jobs: x_floats of x, the q
 * and lse of n_heads query heads of head_dim), and the due lists planned
 * (bc_bs_plan, no band).  0 or an error.
 */
template <bool CHECK, typename J>
static int bc_bs_begin(struct bc_ctx *c, const char *op, const J *jobs,
                       uint32_t n, size_t param_bytes, uint32_t out_words,
                       size_t extra, const kvt_backend_rows *rows,
                       uint32_t x_floats,
                       uint32_t n_heads, uint32_t head_dim, cudaStream_t s,
                       struct bc_bs_call *k, J **dj)
{
	int rv = bc_bs_count_jobs(jobs, n, &k->cn);
	if (rv)
		return rv;
	k->m = bc_bs_layout(&k->cn, n, sizeof(*jobs), out_words);
	if ((rv = bc_win_prepare(c, k->m.need + extra)))
		return rv;
	char *d = c->d_win;
	k->extra = d + k->m.need;
	k->dout = (uint32_t *)d;
	k->at = (uint32_t *)(d + k->m.o_at);
	k->first = (uint32_t *)(d + k->m.o_first);
	k->keep = (uint32_t *)(d + k->m.o_keep);
	k->rank = (uint32_t *)(d + k->m.o_rank);
	k->segs = (struct bc_seg *)(d + k->m.o_segs);
	k->sc = (float *)(d + k->m.o_sc);
	k->prot = (uint8_t *)(d + k->m.o_prot);
	k->drop = (uint8_t *)(d + k->m.o_drop);
	*dj = (J *)(d + k->m.o_jobs);
	BC_CALL(cudaMemsetAsync(k->dout, 0, (size_t)out_words * 4, s), op);
	BC_CALL(cudaMemcpyAsync(*dj, jobs, (size_t)n * sizeof(*jobs),
	                        cudaMemcpyHostToDevice, s),
	        op);
	bc_count(c, (uint64_t)n * sizeof(*jobs) + param_bytes, 0);
	if constexpr (CHECK) {
		KVT_LAUNCH(bc_bs_check_jobs<J>, n, BC_BS_THREADS, 0, s, *dj,
		           *rows, x_floats, n_heads, head_dim, k->dout);
		BC_CALL(cudaGetLastError(), op);
	}
	KVT_LAUNCH(bc_bs_plan<J>, 1, BC_BS_THREADS, 0, s, *dj, n, 0, k->at,
	           NULL, k->first, k->keep, k->segs);
	BC_CALL(cudaGetLastError(), op);
	return 0;
}

/* The end of such a call after its scores: the due lists' selection
 * (bc_bs_select, F floats of state an entry besides its position), then
 * the output words to out and the wait. */
static inline int bc_bs_end(struct bc_ctx *c, const char *op,
                            const struct bc_bs_call *k, void *state,
                            uint32_t cap, uint32_t F, uint32_t *out,
                            uint32_t out_words, cudaStream_t s)
{
	int rv = bc_bs_select(op, state, cap, F, k->sc, k->rank, k->prot,
	                      k->drop, k->first, k->keep, k->segs, k->cn.nseg,
	                      k->cn.maxL, NULL, k->cn.max_drop, k->dout, s);
	return rv ? rv : bc_ps_finish(c, out, k->dout, out_words, s, op);
}

/* The end of such a call whose rule marked its drops itself (no scores,
 * no top-k): the marked lists' drop indices (veto: a flag per job whose
 * lists drop nothing, count UINT32_MAX, or NULL), their halves compacted
 * (F floats of state an entry besides its position), then the output
 * words to out and the wait. */
static inline int bc_bs_marks_end(struct bc_ctx *c, const char *op,
                                  const struct bc_bs_call *k, void *state,
                                  uint32_t cap, uint32_t F,
                                  const uint32_t *veto, uint32_t *out,
                                  uint32_t out_words, cudaStream_t s)
{
	int rv = bc_bs_drops(op, state, cap, F, k->drop, k->segs, k->cn.nseg,
	                     k->cn.maxL, veto, k->cn.max_drop, k->dout, s);
	return rv ? rv : bc_ps_finish(c, out, k->dout, out_words, s, op);
}

#endif
