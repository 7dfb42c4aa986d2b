/*
 * kvzap.cu — KVzap's rule on the cuda backend, the device rule "kvzap"
 * (kvzap_rule.h; struct kvt_backend_rule, backend.h): policies/kvzap.c's
 * threshold at the window's edge applied where the scores are (the
 * scorer's output copied to device memory, scorer.cu), so that a sync
 * moves only the jobs up and the drop indices down, and the host's plan
 * of a list is O(1).  The whole call (every job: one list) in four
 * launches whatever its jobs (two when no entry leaves a window), besides
 * the output's clear, the jobs' upload and the output's copy: the plan
 * (batch_select.cuh's bc_bs_plan), one thread per entry of
 * every job carrying the state to the other half with the new entries,
 * flagging scores that are not finite and marking the drops, then the
 * due lists' drop indices and the state halves' compaction
 * (batch_select.cuh's bc_bs_indices and bc_bs_compact; no top-k: the
 * marks are the decision); then the output's copy.  Scratch:
 * bc_win_prepare's, under the context's lock; the rule waits for its
 * output.  Built into libkvtrim-cuda.so (backend/cuda/cuda.mk) and
 * registered in backend_cuda.cu's BC_RULES.  Test:
 * cuda.backend_kvzap_rule_matches_kvzap and the emulated passes.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "kvzap_rule.h"

/* What batch_select.cuh asks of a job: the state record is the list's;
 * no band (no rows are checked: the scores are, where they are read). */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const kvzap_rule_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const kvzap_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const kvzap_rule_job &) { return 0; }

#include "batch_select.cuh"

/*
 * Every job's entries in one launch, grid (entries, jobs), one thread an
 * entry: the state (position, score) carried from half cur to the other
 * with the new entries' (position n_seen - n_new + k, the scorer's
 * score); a new score that is not finite flags the job (out[k] = 1); and
 * (due: at[k] is the job's place in the flat marks, else UINT32_MAX)
 * kvzap_decide's mark: leaving the window, not a sink, !(score >= tau).
 */
static __global__ void bc_kvzap_batch(const kvzap_rule a,
                                      const kvzap_rule_job *jobs,
                                      const uint32_t *at, uint32_t n,
                                      uint32_t nkv, uint8_t *drop,
                                      uint32_t *out)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const kvzap_rule_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
		const uint32_t *src = bc_es_half(a.state, a.cap, 1, j.record,
		                                 j.cur);
		uint32_t *dst = bc_es_half(a.state, a.cap, 1, j.record,
		                           j.cur ^ 1u);
		const float *ss = (const float *)(src + a.cap);
		float *sd = (float *)(dst + a.cap);
		const uint32_t o = at[k];
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			uint32_t p;
			float v;
			if (i < j.len) {
				p = src[i];
				v = ss[i];
			} else {
				p = first + (i - j.len);
				v = j.pre[(uint64_t)(i - j.len) * nkv + j.g];
				if (!isfinite(v))
					out[k] = 1;
			}
			dst[i] = p;
			sd[i] = v;
			if (o == UINT32_MAX)
				continue;
			const uint64_t pw = (uint64_t)p + a.window;
			drop[o + i] = pw >= first && pw < j.n_seen &&
			              p >= a.sinks && !(v >= a.tau);
		}
	}
}

static int bc_kvzap_check_args(uint32_t n_records, uint32_t nkv,
                               const struct kvzap_rule *a,
                               const struct kvzap_rule_job *jobs,
                               uint32_t n, uint32_t out_words)
{
	if (!a->state || !nkv) {
		bc_note("kvzap rule: no state, or %u KV heads", nkv);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct kvzap_rule_job *j = &jobs[k];
		if (j->record >= n_records || j->g >= nkv || j->cur > 1 ||
		    (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || (j->n_new && !j->pre) ||
		    j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("kvzap rule: job %u: record %u of %u, KV head %u "
			        "of %u, %u + %u entries of %u, seen %u, scores "
			        "%p, drops %u + %u of %u words", k, j->record,
			        n_records, j->g, nkv, j->len, j->n_new, a->cap,
			        j->n_seen, (const void *)j->pre, j->drop_off,
			        j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The launches of one call, whatever n: the output's clear, the jobs'
 * upload, the plan, the entries, the indices and the compaction; then
 * the output's copy. */
static int bc_kvzap_run_locked(struct bc_ctx *c, uint32_t nkv,
                               const struct kvzap_rule *a,
                               const struct kvzap_rule_job *jobs,
                               uint32_t n, uint32_t *out,
                               uint32_t out_words, cudaStream_t s)
{
	struct bc_bs_call k;
	kvzap_rule_job *dj;
	int rv = bc_bs_begin<false>(c, "kvzap rule", jobs, n, sizeof(*a),
	                            out_words, 0, NULL, 0, 0, 0, s, &k, &dj);
	if (rv)
		return rv;
	const struct bc_bs_count &cn = k.cn;
	const dim3 grid(bc_bs_blocks(cn.maxL), bc_bs_rows(n));
	const kvzap_rule A = *a;
	KVT_LAUNCH(bc_kvzap_batch, grid, bc_bs_threads(cn.maxL), 0, s, A, dj,
	           k.at, n, nkv, k.drop, k.dout);
	BC_CALL(cudaGetLastError(), "kvzap rule entries");
	/* a flagged job (out[k]) is vetoed: no drops, count UINT32_MAX, its
	 * half left as the entries' kernel wrote it */
	return bc_bs_marks_end(c, "kvzap rule", &k, a->state, a->cap, 1,
	                       k.dout, out, out_words, s);
}

static int bc_kvzap_run(void *ctx, const struct kvt_backend_paged *pg,
                        uint32_t n_records,
                        const struct kvt_backend_rule_geom *g,
                        const void *params, const void *jobs_, uint32_t n,
                        uint32_t *out, uint32_t out_words, void *stream)
{
	const struct kvzap_rule *a = (const struct kvzap_rule *)params;
	const struct kvzap_rule_job *jobs =
		(const struct kvzap_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "kvzap rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_kvzap_check_args(n_records, g->n_kv_heads, a,
			                           jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_kvzap_run_locked(c, g->n_kv_heads, a, jobs, n,
			                           out, out_words,
			                           (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_kvzap_rule;
const struct kvt_backend_rule bc_kvzap_rule = {
	/* .name = */ "kvzap",
	/* .version = */ KVZAP_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct kvzap_rule),
	/* .job_bytes = */ sizeof(struct kvzap_rule_job),
	/* .run = */ bc_kvzap_run,
};
