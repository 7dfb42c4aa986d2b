/*
 * streaming.cu — StreamingLLM's rule on the cuda backend, the device rule
 * "streaming" (streaming_rule.h; struct kvt_backend_rule, backend.h):
 * policies/streaming.c's decision where the positions are, so that a sync
 * moves one list of drop indices per (sequence, layer) to the host and the
 * host makes no pass over a list.  The whole call (every job: one
 * (sequence, layer), its lists sharing one position array) in four
 * launches whatever its jobs: the plan (batch_select.cuh), one thread per
 * entry of every job carrying the positions and marking the due jobs'
 * drops, then the drop indices and the compaction of the positions
 * (batch_select.cuh's).  Nothing is scored or ranked: the rule keeps a
 * head and a tail of the positions, so no top-k runs.  Scratch:
 * bc_win_prepare's, under the context's lock; the rule waits for its
 * output.  Built into libkvtrim-cuda.so (backend/cuda/cuda.mk) and
 * registered in backend_cuda.cu's BC_RULES.  Test:
 * cuda.backend_streaming_rule_matches_streaming.
 */
#include <string.h>

#include "backend_cuda.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "streaming_rule.h"

/* What batch_select.cuh asks of a job: its lists share the state record
 * srec; no band (no rows to check: bc_bs_check_jobs is not launched). */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const streaming_rule_job &j) { return j.srec; }
static __device__ __forceinline__ int
bc_bs_band(const streaming_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const streaming_rule_job &) { return 0; }

#include "batch_select.cuh"

/*
 * Every job in one launch, grid (entries, jobs), one thread an entry: its
 * position carried from half cur to the other (the new ones appended);
 * when due (seg[k] its place in the flat drop marks, else UINT32_MAX) the
 * mark of streaming_decide: dropped unless pos < sinks or pos >= from.
 */
__global__ void bc_streaming_batch(const streaming_rule a,
                                   const streaming_rule_job *jobs,
                                   const uint32_t *seg, uint32_t n,
                                   uint8_t *drop)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const streaming_rule_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new,
		               at = seg[k];
		const uint32_t *src = bc_es_half(a.state, a.cap, 0, j.srec, j.cur);
		uint32_t *dst = bc_es_half(a.state, a.cap, 0, j.srec, j.cur ^ 1u);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			const uint32_t p = i < j.len ? src[i] : first + (i - j.len);
			dst[i] = p;
			if (at != UINT32_MAX)
				drop[at + i] = !(p < j.sinks || p >= j.from);
		}
	}
}

static int bc_streaming_check_args(uint32_t n_records, uint32_t nkv,
                                   const struct streaming_rule *a,
                                   const struct streaming_rule_job *jobs,
                                   uint32_t n, uint32_t out_words)
{
	if (!a->state || !nkv) {
		bc_note("streaming rule: no state, or %u KV heads", nkv);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct streaming_rule_job *j = &jobs[k];
		if (j->srec >= n_records / nkv || j->cur > 1 ||
		    (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("streaming rule: job %u: state %u of %u, half "
			        "%u, %u + %u entries of %u, seen %u, drops %u + "
			        "%u of %u words", k, j->srec, n_records / nkv,
			        j->cur, j->len, j->n_new, a->cap, j->n_seen,
			        j->drop_off, j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The launches of one call, whatever n: the jobs' upload, the plan, the
 * positions and marks, the drop indices, the compaction; then the
 * output's copy. */
static int bc_streaming_run_locked(struct bc_ctx *c,
                                   const struct streaming_rule *a,
                                   const struct streaming_rule_job *jobs,
                                   uint32_t n, uint32_t *out,
                                   uint32_t out_words, cudaStream_t s)
{
	struct bc_bs_call k;
	streaming_rule_job *dj;
	int rv = bc_bs_begin<false>(c, "streaming rule", jobs, n, sizeof(*a),
	                            out_words, 0, NULL, 0, 0, 0, s, &k, &dj);
	if (rv)
		return rv;
	const struct bc_bs_count &cn = k.cn;
	const dim3 grid(bc_bs_blocks(cn.maxL), bc_bs_rows(n));
	KVT_LAUNCH(bc_streaming_batch, grid, bc_bs_threads(cn.maxL), 0, s, *a,
	           dj, k.at, n, k.drop);
	BC_CALL(cudaGetLastError(), "streaming rule marks");
	/* no score, so no top-k: the marks are the decision */
	return bc_bs_marks_end(c, "streaming rule", &k, a->state, a->cap, 0,
	                       NULL, out, out_words, s);
}

static int bc_streaming_run(void *ctx, const struct kvt_backend_paged *pg,
                            uint32_t n_records,
                            const struct kvt_backend_rule_geom *g,
                            const void *params, const void *jobs_,
                            uint32_t n, uint32_t *out, uint32_t out_words,
                            void *stream)
{
	const struct streaming_rule *a = (const struct streaming_rule *)params;
	const struct streaming_rule_job *jobs =
		(const struct streaming_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "streaming rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_streaming_check_args(n_records, g->n_kv_heads,
			                               a, jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_streaming_run_locked(c, a, jobs, n, out,
			                               out_words,
			                               (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_streaming_rule;
const struct kvt_backend_rule bc_streaming_rule = {
	/* .name = */ "streaming",
	/* .version = */ STREAMING_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct streaming_rule),
	/* .job_bytes = */ sizeof(struct streaming_rule_job),
	/* .run = */ bc_streaming_run,
};
