/*
 * random.cu — the random baseline's rule on the cuda backend, the device
 * rule "random" (random_rule.h; struct kvt_backend_rule, backend.h):
 * policies/random.c's selection computed where the positions are, so that
 * a sync moves one job up and the drop indices down per list and the host
 * makes no pass over a list.  The whole call (every job: one list) in five
 * launches whatever its jobs: the plan (batch_select.cuh), one thread per
 * entry of every job carrying its position and, when due, its score (the
 * hash of its position), rank and protection; then the due lists'
 * segmented top-k, drop indices and compaction (batch_select.cuh).
 * Scratch: bc_win_prepare's, under the context's lock; the rule waits for
 * its output.  Built into libkvtrim-cuda.so (backend/cuda/cuda.mk) and
 * registered in backend_cuda.cu's BC_RULES.  Test:
 * cuda.backend_random_rule_matches_random.
 */
#include <string.h>

#include "backend_cuda.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "random_rule.h"

/* What batch_select.cuh asks of a job: its list's own state record; no
 * band (no rows to check: bc_bs_check_jobs is not launched). */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const random_rule_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const random_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const random_rule_job &) { return 0; }

#include "batch_select.cuh"

/* random.c's mix: the splitmix64 finaliser. */
static __device__ __forceinline__ uint64_t bc_random_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/*
 * Every job in one launch, grid (entries, jobs), one thread an entry: its
 * position carried from half cur to the other (the new ones appended);
 * when due (seg[k] its place in the flat arrays, else UINT32_MAX)
 * random_decide's score (the top 24 bits of the hash, exact in float),
 * its rank (the position) and its protection.
 */
__global__ void bc_random_batch(const random_rule a,
                                const random_rule_job *jobs,
                                const uint32_t *seg, uint32_t n, float *sc,
                                uint32_t *rank, uint8_t *prot)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const random_rule_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new,
		               at = seg[k];
		const uint32_t *src = bc_es_half(a.state, a.cap, 0, j.record, j.cur);
		uint32_t *dst = bc_es_half(a.state, a.cap, 0, j.record, j.cur ^ 1u);
		const uint64_t base = bc_random_mix(
			bc_random_mix(bc_random_mix(a.seed) ^ j.layer) ^ j.g);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			const uint32_t p = i < j.len ? src[i] : first + (i - j.len);
			dst[i] = p;
			if (at == UINT32_MAX)
				continue;
			sc[at + i] = (float)(bc_random_mix(base ^ p) >> 40) *
			             (1.0f / 16777216.0f);
			rank[at + i] = p;
			prot[at + i] = p < a.sinks ||
			               (a.window && p + (uint64_t)a.window >= j.n_seen);
		}
	}
}

static int bc_random_check_args(uint32_t n_records, uint32_t nkv,
                                const struct random_rule *a,
                                const struct random_rule_job *jobs,
                                uint32_t n, uint32_t out_words)
{
	if (!a->state) {
		bc_note("random rule: no state");
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct random_rule_job *j = &jobs[k];
		if (j->record >= n_records || j->g >= nkv || j->cur > 1 ||
		    (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("random rule: job %u: record %u of %u, head %u of "
			        "%u, half %u, %u + %u entries of %u, seen %u, "
			        "drops %u + %u of %u words", k, j->record,
			        n_records, j->g, nkv, j->cur, j->len, j->n_new,
			        a->cap, j->n_seen, j->drop_off, j->n_drop,
			        out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The launches of one call, whatever n: the jobs' upload, the plan, the
 * carry and scores, the selection's three (batch_select.cuh); then the
 * output's copy. */
static int bc_random_run_locked(struct bc_ctx *c, const struct random_rule *a,
                                const struct random_rule_job *jobs,
                                uint32_t n, uint32_t *out,
                                uint32_t out_words, cudaStream_t s)
{
	struct bc_bs_call k;
	random_rule_job *dj;
	int rv = bc_bs_begin<false>(c, "random rule", jobs, n, sizeof(*a),
	                            out_words, 0, NULL, 0, 0, 0, s, &k, &dj);
	if (rv)
		return rv;
	const dim3 grid(bc_bs_blocks(k.cn.maxL), bc_bs_rows(n));
	KVT_LAUNCH(bc_random_batch, grid, bc_bs_threads(k.cn.maxL), 0, s, *a,
	           dj, k.at, n, k.sc, k.rank, k.prot);
	BC_CALL(cudaGetLastError(), "random rule score");
	return bc_bs_end(c, "random rule", &k, a->state, a->cap, 0, out,
	                 out_words, s);
}

static int bc_random_run(void *ctx, const struct kvt_backend_paged *pg,
                         uint32_t n_records,
                         const struct kvt_backend_rule_geom *g,
                         const void *params, const void *jobs_, uint32_t n,
                         uint32_t *out, uint32_t out_words, void *stream)
{
	const struct random_rule *a = (const struct random_rule *)params;
	const struct random_rule_job *jobs = (const struct random_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "random rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_random_check_args(n_records, g->n_kv_heads, a,
			                            jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_random_run_locked(c, a, jobs, n, out, out_words,
			                            (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_random_rule;
const struct kvt_backend_rule bc_random_rule = {
	/* .name = */ "random",
	/* .version = */ RANDOM_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct random_rule),
	/* .job_bytes = */ sizeof(struct random_rule_job),
	/* .run = */ bc_random_run,
};
