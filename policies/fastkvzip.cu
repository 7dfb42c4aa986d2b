/*
 * fastkvzip.cu — Fast KVzip's selection on the cuda backend, the device
 * rule "fastkvzip" (fastkvzip_rule.h; struct kvt_backend_rule,
 * backend.h): policies/fastkvzip.c's selection over every KV head's list
 * of a layer (a top-k under the layer's budget, or a threshold) applied
 * where the scores are (the scorer's output copied to device memory,
 * scorer.cu), so that a sync moves only the jobs up and the drop indices
 * down, and the host's plan of a (sequence, layer) is O(KV heads).  The
 * whole call (every job: one (sequence, layer)) in six launches whatever
 * its jobs with a budget, four with a threshold (two when no layer is
 * due), plus the output's clear, the jobs' upload and the output's copy:
 * the plan (batch_select.cuh's bc_bs_plan, a segment per due layer), one
 * thread per entry of every job carrying the state to the other half with
 * the new entries, flagging scores that are not finite and, when due, the
 * score, rank and protection, counting the protected (with a threshold:
 * the drop mark); the keep of each segment (budget - protected) and the
 * segmented top-k (select_topk_batch_cuda), with a budget only; the drop
 * indices (bc_bs_indices); each list's half compacted by its share of
 * them.  Scratch: bc_win_prepare's, under the context's lock; the rule
 * waits for its output.  Built into
 * libkvtrim-cuda.so (backend/cuda/cuda.mk) and registered in
 * backend_cuda.cu's BC_RULES.  Test: cuda.backend_fastkvzip_rule_matches_
 * fastkvzip and the emulated passes.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "fastkvzip_rule.h"

/* What batch_select.cuh asks of a job: the state record; no band. */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const fastkvzip_rule_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const fastkvzip_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const fastkvzip_rule_job &) { return 0; }

#include "batch_select.cuh"

/* List g of half h of record r: positions [cap], then scores [cap]. */
static __host__ __device__ __forceinline__ uint32_t *
bc_fkv_list(void *state, uint32_t cap, uint32_t nkv, uint32_t r, uint32_t h,
            uint32_t g)
{
	return (uint32_t *)state +
	       (((uint64_t)r * 2 + h) * nkv + g) * cap * 2;
}

/*
 * Every job's entries in one launch, grid (entries, jobs), one thread an
 * entry of the layer's lists end to end: its list g and index there, the
 * state (position, score) carried from half cur to the other with the new
 * entries' (position n_seen - nn + k, the score of KV head g); a new score
 * that is not finite flags the job (out[k] = 1); when due (at[k] its place
 * in the flat arrays, else UINT32_MAX) the score, its rank (the position)
 * and its protection, the protected counted in np[seg]; with a threshold,
 * the drop mark itself (not protected, !(score >= tau)).
 */
static __global__ void bc_fkv_batch(const fastkvzip_rule a,
                                    const fastkvzip_rule_job *jobs,
                                    const uint32_t *at, uint32_t n,
                                    uint32_t nkv, float *sc, uint32_t *rank,
                                    uint8_t *prot, uint32_t *np,
                                    uint8_t *drop, uint32_t *out)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const fastkvzip_rule_job &j = jobs[k];
		const uint32_t first = j.n_seen - j.nn, o = at[k];
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < j.len;
		     i += gridDim.x * blockDim.x) {
			uint32_t g = 0, e = i;
			while (g + 1 < nkv && e >= j.lens[g] + j.nn)
				e -= j.lens[g++] + j.nn;
			const uint32_t *src = bc_fkv_list(a.state, a.cap, nkv,
			                                  j.record, j.cur, g);
			uint32_t *dst = bc_fkv_list(a.state, a.cap, nkv, j.record,
			                            j.cur ^ 1u, g);
			uint32_t p;
			float v;
			if (e < j.lens[g]) {
				p = src[e];
				v = ((const float *)(src + a.cap))[e];
			} else {
				p = first + (e - j.lens[g]);
				v = j.pre[(uint64_t)(e - j.lens[g]) * nkv + g];
				if (!isfinite(v))
					out[k] = 1;
			}
			dst[e] = p;
			((float *)(dst + a.cap))[e] = v;
			if (o == UINT32_MAX)
				continue;
			const uint8_t pr = p < a.sinks ||
			                   (uint64_t)p + a.window >= j.n_seen;
			if (a.threshold) { /* the mark is the decision */
				drop[o + i] = !pr && !(v >= a.tau);
				continue;
			}
			sc[o + i] = v;
			rank[o + i] = p;
			prot[o + i] = pr;
			if (pr)
				atomicAdd(&np[k], 1u);
		}
	}
}

/* Each due job's keep (one thread a job): fkv_decide's k = budget -
 * protected, at most the entries, when the budget exceeds the protected;
 * else 0, into its segment's place: the due job whose flat place at[k]
 * is first[seg] (ascending over the due jobs: bc_bs_plan's scan). */
static __global__ void bc_fkv_keep(const fastkvzip_rule_job *jobs,
                                   const uint32_t *at, uint32_t n,
                                   const uint32_t *np, const uint32_t *first,
                                   uint32_t nseg, uint32_t *keep)
{
	for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n;
	     k += gridDim.x * blockDim.x) {
		if (at[k] == UINT32_MAX)
			continue;
		uint32_t lo = 0, hi = nseg; /* first[lo] == at[k] */
		while (hi - lo > 1) {
			const uint32_t mid = lo + (hi - lo) / 2;
			if (first[mid] <= at[k])
				lo = mid;
			else
				hi = mid;
		}
		const uint64_t b = jobs[k].budget, p = np[k], L = jobs[k].len;
		keep[lo] = b > p ? (uint32_t)(b - p < L ? b - p : L) : 0;
	}
}

/*
 * Each due list's half compacted by its share of its layer's drops, grid
 * (threads, segments x heads): for segment s and KV head g, its drops are
 * the run of the segment's ascending indices in [off, off + Lg) (off: the
 * entries of the lists before g); one thread per hole (a drop below the
 * list's new length) takes the (k+1)-th kept entry at or above it, as
 * compact_drops pairs them.
 */
static __global__ void bc_fkv_compact(void *state, uint32_t cap, uint32_t nkv,
                                      const fastkvzip_rule_job *jobs,
                                      const struct bc_seg *segs,
                                      uint32_t nseg, const uint32_t *out)
{
	for (uint32_t sg = blockIdx.y; sg < nseg * nkv; sg += gridDim.y) {
		const struct bc_seg sgm = segs[sg / nkv];
		const uint32_t g = sg % nkv;
		const uint32_t cnt = out[sgm.cnt];
		if (cnt == UINT32_MAX) /* vetoed: nothing dropped */
			continue;
		const fastkvzip_rule_job &j = jobs[sgm.job];
		const uint32_t m_all = cnt < sgm.n_drop ? cnt : sgm.n_drop;
		const uint32_t *d = out + sgm.idx;
		uint32_t off = 0;
		for (uint32_t q = 0; q < g; q++)
			off += j.lens[q] + j.nn;
		const uint32_t Lg = j.lens[g] + j.nn;
		/* the run [a, b) of d in [off, off + Lg) */
		uint32_t lo = 0, hi = m_all;
		while (lo < hi) {
			const uint32_t mid = lo + (hi - lo) / 2;
			if (d[mid] < off)
				lo = mid + 1;
			else
				hi = mid;
		}
		const uint32_t a0 = lo;
		hi = m_all;
		while (lo < hi) {
			const uint32_t mid = lo + (hi - lo) / 2;
			if (d[mid] < off + Lg)
				lo = mid + 1;
			else
				hi = mid;
		}
		const uint32_t m = lo - a0;
		if (!m)
			continue;
		const uint32_t *dl = d + a0; /* minus off: list indices */
		const uint32_t NL = Lg - m;
		uint32_t h = 0, up = m; /* holes: dl[k] - off < NL */
		while (h < up) {
			const uint32_t mid = h + (up - h) / 2;
			if (dl[mid] - off < NL)
				h = mid + 1;
			else
				up = mid;
		}
		uint32_t *pos = bc_fkv_list(state, cap, nkv, j.record,
		                            j.cur ^ 1u, g);
		float *S = (float *)(pos + cap);
		const uint32_t *t = dl + h;
		for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < h;
		     k += gridDim.x * blockDim.x) {
			uint32_t l2 = 0, u2 = m - h;
			while (l2 < u2) { /* smallest q: t[q] - off - q > NL + k */
				const uint32_t mid = l2 + (u2 - l2) / 2;
				if (t[mid] - off - mid > NL + k)
					u2 = mid;
				else
					l2 = mid + 1;
			}
			const uint32_t src = NL + k + l2, dst = dl[k] - off;
			pos[dst] = pos[src];
			S[dst] = S[src];
		}
	}
}

static int bc_fkv_check_args(uint32_t n_records, uint32_t nkv,
                             const struct fastkvzip_rule *a,
                             const struct fastkvzip_rule_job *jobs,
                             uint32_t n, uint32_t out_words)
{
	if (!a->state || !nkv || nkv > FASTKVZIP_RULE_MAX_KV) {
		bc_note("fastkvzip rule: no state, or %u KV heads (at most %u)",
		        nkv, FASTKVZIP_RULE_MAX_KV);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct fastkvzip_rule_job *j = &jobs[k];
		uint64_t tot = 0;
		int ok = 1;
		for (uint32_t g = 0; g < nkv; g++) {
			ok &= (uint64_t)j->lens[g] + j->nn <= a->cap;
			tot += (uint64_t)j->lens[g] + j->nn;
		}
		if (!ok || tot != j->len || j->n_new || j->record >= n_records ||
		    j->cur > 1 || j->nn > j->n_seen || (j->nn && !j->pre) ||
		    j->n_drop > j->len ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("fastkvzip rule: job %u: record %u of %u, %u KV "
			        "heads, %u entries (%llu) of %u a list, %u new, "
			        "seen %u, scores %p, drops %u + %u of %u words", k,
			        j->record, n_records, nkv, j->len,
			        (unsigned long long)tot, a->cap, j->nn, j->n_seen,
			        (const void *)j->pre, j->drop_off, j->n_drop,
			        out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The launches of one call, whatever n: the output's clear, the jobs'
 * upload, the plan, the entries, the segments' keeps and the top-k (not
 * with a threshold: the entries' marks are the decision), the indices and
 * the compaction; then the output's copy. */
static int bc_fkv_run_locked(struct bc_ctx *c, uint32_t nkv,
                             const struct fastkvzip_rule *a,
                             const struct fastkvzip_rule_job *jobs,
                             uint32_t n, uint32_t *out, uint32_t out_words,
                             cudaStream_t s)
{
	struct bc_bs_call k;
	fastkvzip_rule_job *dj;
	int rv = bc_bs_begin<false>(c, "fastkvzip rule", jobs, n, sizeof(*a),
	                            out_words, (size_t)n * 4, NULL, 0, 0, 0, s,
	                            &k, &dj);
	if (rv)
		return rv;
	const struct bc_bs_count &cn = k.cn;
	uint32_t *dout = k.dout, *at = k.at, *first = k.first, *keep = k.keep,
	         *rank = k.rank, *np = (uint32_t *)k.extra; /* [n] */
	float *sc = k.sc;
	uint8_t *prot = k.prot, *drop = k.drop;
	struct bc_seg *segs = k.segs;
	if (!a->threshold) /* the protected counts of the budgets' keeps */
		BC_CALL(cudaMemsetAsync(np, 0, (size_t)n * 4, s),
		        "fastkvzip rule");
	const dim3 grid(bc_bs_blocks(cn.maxL), bc_bs_rows(n));
	const fastkvzip_rule A = *a;
	KVT_LAUNCH(bc_fkv_batch, grid, bc_bs_threads(cn.maxL), 0, s, A, dj, at,
	           n, nkv, sc, rank, prot, np, drop, dout);
	BC_CALL(cudaGetLastError(), "fastkvzip rule entries");
	if (!cn.nseg)
		return bc_ps_finish(c, out, dout, out_words, s, "fastkvzip rule");
	if (!a->threshold) {
		KVT_LAUNCH(bc_fkv_keep, bc_bs_blocks(n), bc_bs_threads(n), 0,
		           s, dj, at, n, np, first, cn.nseg, keep);
		BC_CALL(cudaGetLastError(), "fastkvzip rule keep");
		if ((rv = select_topk_batch_cuda(sc, rank, prot, first,
		                                 cn.nseg, cn.maxL, keep, drop,
		                                 NULL, s))) {
			bc_note("fastkvzip rule: select_topk_batch_cuda failed");
			return rv;
		}
	}
	/* a flagged job (out[k]) is vetoed: no drops, count UINT32_MAX */
	KVT_LAUNCH(bc_bs_indices, cn.nseg, bc_bs_threads(cn.maxL), 0, s, drop,
	           segs, dout, dout);
	BC_CALL(cudaGetLastError(), "fastkvzip rule indices");
	if (cn.max_drop) {
		const uint32_t t = bc_bs_threads(cn.max_drop);
		const uint32_t bx = (cn.max_drop + t - 1) / t;
		dim3 cg(bx > 64 ? 64 : bx, bc_bs_rows((uint64_t)cn.nseg * nkv));
		KVT_LAUNCH(bc_fkv_compact, cg, t, 0, s, a->state, a->cap, nkv,
		           dj, segs, cn.nseg, dout);
		BC_CALL(cudaGetLastError(), "fastkvzip rule compact");
	}
	return bc_ps_finish(c, out, dout, out_words, s, "fastkvzip rule");
}

static int bc_fkv_run(void *ctx, const struct kvt_backend_paged *pg,
                      uint32_t n_records,
                      const struct kvt_backend_rule_geom *g,
                      const void *params, const void *jobs_, uint32_t n,
                      uint32_t *out, uint32_t out_words, void *stream)
{
	const struct fastkvzip_rule *a = (const struct fastkvzip_rule *)params;
	const struct fastkvzip_rule_job *jobs =
		(const struct fastkvzip_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "fastkvzip rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_fkv_check_args(n_records, g->n_kv_heads, a,
			                         jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_fkv_run_locked(c, g->n_kv_heads, a, jobs, n,
			                         out, out_words,
			                         (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_fastkvzip_rule;
const struct kvt_backend_rule bc_fastkvzip_rule = {
	/* .name = */ "fastkvzip",
	/* .version = */ FASTKVZIP_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct fastkvzip_rule),
	/* .job_bytes = */ sizeof(struct fastkvzip_rule_job),
	/* .run = */ bc_fkv_run,
};
