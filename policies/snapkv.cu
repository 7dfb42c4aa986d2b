/*
 * snapkv.cu — SnapKV's end-of-prefill rule on the cuda backend, the
 * device rule "snapkv" (snapkv_rule.h; struct kvt_backend_rule,
 * backend.h) that snapkv and pyramidkv run: policies/snapkv.c's selection
 * computed where the keys and the window's queries are, so that only the
 * drop indices (4 bytes each) come to the host.  The whole call (every
 * job: one list) in five launches whatever its jobs: the rows' checks
 * beside the plan (batch_select.cuh's, on the device, so that only the
 * jobs cross), one thread per entry of every due list doing the cpu
 * policy's float operations one for one (the logits in attn_band_cpu's
 * order, band_logits.cuh), the pooling, one segmented top-k and the drop
 * indices.  The steps: docs/cuda.md, "Device ops, step by step".
 * Scratch: bc_win_prepare's, under the context's lock; the rule waits for
 * its output.  Built into libkvtrim-cuda.so (backend/cuda/cuda.mk) and
 * registered in backend_cuda.cu's BC_RULES.  Tests:
 * cuda.backend_snapkv_rule_matches_naive, _launches and the emulated
 * passes.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "common.cuh"
#include "snapkv_rule.h"

/* What batch_select.cuh asks of a job: its list is its record; no band;
 * no state (the half is unused). */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const snapkv_rule_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const snapkv_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const snapkv_rule_job &) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_next_half(const snapkv_rule_job &) { return 0; }

#include "batch_select.cuh"

/*
 * One launch of n + 1 blocks: block k < n checks job k's rows [len - w,
 * len + n_new), every q and lse value (out[k] = 1 when one is not finite:
 * the cpu policy refuses such a sync), block n plans the due lists
 * (bc_bs_plan_dev: their segments of the flat arrays, where their drops
 * go).
 */
__global__ void bc_snap_check_plan(const snapkv_rule_job *jobs, uint32_t n,
                                   const kvt_backend_rows rl,
                                   uint32_t n_heads, uint32_t hd,
                                   uint32_t *out, uint32_t *at,
                                   uint32_t *first, uint32_t *keep,
                                   struct bc_seg *segs)
{
	__shared__ uint64_t sum[BC_BS_THREADS + 1][3];
	__shared__ uint32_t bad;
	if (blockIdx.x == n) {
		bc_bs_plan_dev(jobs, n, 0, at, NULL, first, keep, segs, sum);
		return;
	}
	const snapkv_rule_job j = jobs[blockIdx.x];
	if (threadIdx.x == 0)
		bad = 0;
	__syncthreads();
	const uint32_t nq = n_heads * hd, per = nq + n_heads;
	const uint64_t tot = (uint64_t)(j.w + j.n_new) * per;
	uint32_t mine = 0;
	for (uint64_t e = threadIdx.x; e < tot; e += blockDim.x) {
		const float *row = bc_es_row(j.ring, rl,
		                             j.len - j.w + (uint32_t)(e / per));
		const uint32_t k = (uint32_t)(e % per);
		const float v = k < nq ? row[rl.q_off + k]
		                       : row[rl.lse_off + k - nq];
		mine |= !isfinite(v);
	}
	if (mine)
		atomicOr(&bad, 1u);
	__syncthreads();
	if (threadIdx.x == 0)
		out[blockIdx.x] = bad;
}

/*
 * Every due list's entries in one launch, grid (entries, lists), one
 * thread an entry i of list l (job j, KV head g): for a candidate (i <
 * from = len - w) raw = the sum over the window's queries t, then the
 * group's query heads, of exp(logit - lse) (0 where i > from + t), times
 * 1 / (w G): snapkv.c's float operations one for one, the logit in
 * attn_band_cpu's order (band_logits.cuh; a missing key row: NaN).
 * Nothing [w G][len] is materialised: the thread reads its key row from
 * its page and the queries from the ring.
 */
template <typename T>
__global__ void bc_snap_raw(const kvt_backend_paged pg, const snapkv_rule a,
                            const snapkv_rule_job *jobs,
                            const struct bc_seg *segs, uint32_t nseg,
                            uint32_t G, uint32_t hd, float scale, float *raw)
{
	for (uint32_t l = blockIdx.y; l < nseg; l += gridDim.y) {
		const struct bc_seg sg = segs[l];
		const snapkv_rule_job j = jobs[sg.job];
		const uint32_t from = j.len - j.w;
		const uint32_t nc = from < sg.L ? from : sg.L;
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)((const char *)pg.records +
			        (uint64_t)j.record * pg.list_stride);
		const float inv = 1.0f / ((float)j.w * (float)G);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < nc;
		     i += gridDim.x * blockDim.x) {
			const T *key = (const T *)bc_entry_row(pg, r, i);
			float v = 0.0f;
			for (uint32_t t = 0; t < j.w; t++) {
				const float *row = bc_es_row(j.ring, a.rows, from + t);
				for (uint32_t h = 0; h < G; h++) {
					const uint32_t qh = j.g * G + h;
					float w = i <= from + t
					          ? bc_band_weight(row, a.rows,
					                           qh, key, hd,
					                           scale)
					          : 0.0f;
					v += w;
				}
			}
			raw[sg.first + i] = v * inv;
		}
	}
}

/* Grid (entries, lists): the scores s of every due list, raw max-pooled
 * over the kernel's neighbours in index order (0 past the candidates),
 * and the protection (the window and the sinks), as snapkv.c. */
__global__ void bc_snap_pool(const snapkv_rule a, const snapkv_rule_job *jobs,
                             const struct bc_seg *segs, uint32_t nseg,
                             const float *raw, float *s, uint8_t *prot)
{
	for (uint32_t l = blockIdx.y; l < nseg; l += gridDim.y) {
		const struct bc_seg sg = segs[l];
		const snapkv_rule_job j = jobs[sg.job];
		const uint32_t from = j.len - j.w, rad = a.kernel / 2;
		const uint32_t nc = from < sg.L ? from : sg.L;
		const float *rw = raw + sg.first;
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
		     i < sg.L; i += gridDim.x * blockDim.x) {
			prot[sg.first + i] = i >= from || i < a.sinks;
			if (i >= nc) {
				s[sg.first + i] = 0.0f;
				continue;
			}
			uint32_t lo = i > rad ? i - rad : 0;
			uint32_t hi = i + rad < nc ? i + rad : nc - 1;
			float m = rw[lo];
			for (uint32_t e = lo + 1; e <= hi; e++) {
				float v = rw[e];
				if (v > m || m != m)
					m = v;
			}
			s[sg.first + i] = m;
		}
	}
}

static int bc_snap_check_args(uint32_t n_records, uint32_t n_heads,
                              uint32_t nkv, uint32_t hd,
                              const struct snapkv_rule *a,
                              const struct snapkv_rule_job *jobs, uint32_t n,
                              uint32_t out_words)
{
	const struct kvt_backend_rows rl = a->rows;
	if (!hd || !nkv || n_heads % nkv || !rl.stage_tokens ||
	    rl.q_off + (uint64_t)n_heads * hd > rl.row_floats ||
	    rl.lse_off + (uint64_t)n_heads > rl.row_floats) {
		bc_note("snapkv rule: %u query heads on %u KV heads, head_dim "
		        "%u, or q and lse beyond rows of %u floats", n_heads, nkv,
		        hd, rl.row_floats);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct snapkv_rule_job *j = &jobs[k];
		if (!j->ring || j->record >= n_records || j->g >= nkv ||
		    j->w > j->len || (j->due && (!j->w || !(a->kernel & 1))) ||
		    (uint64_t)j->w + j->n_new > rl.stage_tokens ||
		    j->n_drop > (uint64_t)j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("snapkv rule: job %u: record %u of %u, KV head "
			        "%u, prompt %u, window %u, new %u, kernel %u, "
			        "drops %u + %u of %u words", k, j->record,
			        n_records, j->g, j->len, j->w, j->n_new,
			        a->kernel, j->drop_off, j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The raw and pooling launches of one call (dtype dispatch). */
static int bc_snap_scores(enum kvt_dtype dt, const kvt_backend_paged &p,
                          const snapkv_rule &a, const snapkv_rule_job *dj,
                          const struct bc_seg *segs,
                          const struct bc_bs_count &cn, uint32_t G,
                          uint32_t hd, float *raw, float *sc, uint8_t *prot,
                          cudaStream_t s)
{
	const float scale = 1.0f / sqrtf((float)hd);
	const uint32_t tpb = bc_bs_threads(cn.maxL);
	const dim3 grid(bc_bs_blocks(cn.maxL), bc_bs_rows(cn.nseg));
	if (dt == KVT_DTYPE_F16)
		KVT_LAUNCH(bc_snap_raw<f16_t>, grid, tpb, 0, s, p, a, dj, segs,
		           cn.nseg, G, hd, scale, raw);
	else if (dt == KVT_DTYPE_BF16)
		KVT_LAUNCH(bc_snap_raw<bf16_t>, grid, tpb, 0, s, p, a, dj, segs,
		           cn.nseg, G, hd, scale, raw);
	else
		KVT_LAUNCH(bc_snap_raw<float>, grid, tpb, 0, s, p, a, dj, segs,
		           cn.nseg, G, hd, scale, raw);
	BC_CALL(cudaGetLastError(), "snapkv rule raw");
	KVT_LAUNCH(bc_snap_pool, grid, tpb, 0, s, a, dj, segs, cn.nseg, raw,
	           sc, prot);
	BC_CALL(cudaGetLastError(), "snapkv rule pool");
	return 0;
}

/*
 * The launches of one call, whatever its jobs: the checks and the plan
 * (one), raw, the pooling, the segmented top-k and the drop indices (the
 * first alone when no list is due); the jobs go up in one copy, the
 * output comes back in one.  Scratch: the output words, the jobs, the
 * plan (4 bytes a job, 40 a due list) and 10 bytes an entry of the due
 * lists (raw, s, prot, drop).
 */
static int bc_snap_run_locked(struct bc_ctx *c,
                              const struct kvt_backend_paged *pg,
                              const struct kvt_backend_rule_geom *g,
                              const struct snapkv_rule *a,
                              const struct snapkv_rule_job *jobs, uint32_t n,
                              uint32_t *out, uint32_t out_words,
                              cudaStream_t s)
{
	struct bc_bs_count cn;
	if (bc_bs_count_jobs(jobs, n, &cn)) {
		bc_note("snapkv rule: more than 2^32 entries in one call");
		return KVT_EINVAL;
	}
	const struct bc_bs_mem m = bc_bs_layout(&cn, n, sizeof(*jobs),
	                                          out_words);
	int rv = bc_win_prepare(c, m.need);
	if (rv)
		return rv;
	char *d = c->d_win;
	uint32_t *dout = (uint32_t *)d;
	snapkv_rule_job *dj = (snapkv_rule_job *)(d + m.o_jobs);
	struct bc_seg *segs = (struct bc_seg *)(d + m.o_segs);
	const uint32_t *first = (const uint32_t *)(d + m.o_first),
	               *keep = (const uint32_t *)(d + m.o_keep);
	float *sc = (float *)(d + m.o_sc), *raw = (float *)(d + m.o_rank);
	uint8_t *prot = (uint8_t *)(d + m.o_prot), *drop = (uint8_t *)(d + m.o_drop);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "snapkv rule");
	BC_CALL(cudaMemcpyAsync(dj, jobs, (size_t)n * sizeof(*jobs),
	                        cudaMemcpyHostToDevice, s),
	        "snapkv rule");
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	KVT_LAUNCH(bc_snap_check_plan, n + 1, BC_BS_THREADS, 0, s, dj, n,
	           a->rows, g->n_heads, g->head_dim, dout,
	           (uint32_t *)(d + m.o_at), (uint32_t *)(d + m.o_first),
	           (uint32_t *)(d + m.o_keep), segs);
	BC_CALL(cudaGetLastError(), "snapkv rule check");
	if (cn.nseg &&
	    ((rv = bc_snap_scores(g->dtype, *pg, *a, dj, segs, cn,
	                          g->n_heads / g->n_kv_heads, g->head_dim, raw,
	                          sc, prot, s)) ||
	     (rv = bc_bs_select("snapkv rule", NULL, 0, 0, sc, NULL, prot, drop,
	                        first, keep, segs, cn.nseg, cn.maxL, NULL, 0,
	                        dout, s))))
		return rv;
	return bc_ps_finish(c, out, dout, out_words, s, "snapkv rule");
}

static int bc_snap_run(void *ctx, const struct kvt_backend_paged *pg,
                       uint32_t n_records,
                       const struct kvt_backend_rule_geom *g,
                       const void *params, const void *jobs_, uint32_t n,
                       uint32_t *out, uint32_t out_words, void *stream)
{
	const struct snapkv_rule *a = (const struct snapkv_rule *)params;
	const struct snapkv_rule_job *jobs =
		(const struct snapkv_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "snapkv rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_snap_check_args(n_records, g->n_heads,
			          g->n_kv_heads, g->head_dim, a, jobs, n,
			          out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_snap_run_locked(c, pg, g, a, jobs, n, out,
			                          out_words, (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_snapkv_rule;
const struct kvt_backend_rule bc_snapkv_rule = {
	/* .name = */ "snapkv",
	/* .version = */ SNAPKV_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct snapkv_rule),
	/* .job_bytes = */ sizeof(struct snapkv_rule_job),
	/* .run = */ bc_snap_run,
};
