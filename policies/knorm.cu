/*
 * knorm.cu — the key-norm baseline's rule on the cuda backend, the device
 * rule "knorm" (knorm_rule.h; struct kvt_backend_rule, backend.h):
 * policies/knorm.c's selection computed where the keys and the norms are,
 * so that a sync moves one job up and the drop indices down per list, and
 * the host keeps no norm and makes no pass over a list.  The whole call
 * (every job: one list) in five launches whatever its jobs: the plan
 * (batch_select.cuh), one thread per entry of every job carrying its
 * position and norm (a new entry's norm from its key, as key_norms does)
 * and, when due, its score, rank and protection; then the due lists'
 * segmented top-k, drop indices and compaction (batch_select.cuh).
 * Scratch: bc_win_prepare's, under the context's lock; the rule waits for
 * its output.  Built into libkvtrim-cuda.so (backend/cuda/cuda.mk) and
 * registered in backend_cuda.cu's BC_RULES.  Test:
 * cuda.backend_knorm_rule_matches_knorm.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "knorm_rule.h"

/* What batch_select.cuh asks of a job: its list's own state record; no
 * band (no rows to check: bc_bs_check_jobs is not launched). */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const knorm_rule_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const knorm_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const knorm_rule_job &) { return 0; }

#include "batch_select.cuh"

/*
 * Every job in one launch, grid (entries, jobs), one thread an entry: its
 * position and norm carried from half cur to the other, a new entry's
 * norm that of its key row (knorm.c's: float, squared and summed in
 * double in index order, sqrt, rounded to float; NaN for a row the table
 * does not resolve, as key_norms); when due (seg[k] its place in the flat
 * arrays, else UINT32_MAX) the score -norm, its rank (the position) and
 * its protection.
 */
template <typename T>
__global__ void bc_knorm_batch(const kvt_backend_paged pg, const knorm_rule a,
                               const knorm_rule_job *jobs, const uint32_t *seg,
                               uint32_t n, uint32_t hd, float *sc,
                               uint32_t *rank, uint8_t *prot)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const knorm_rule_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new,
		               at = seg[k];
		const uint32_t *src = bc_es_half(a.state, a.cap, 1, j.record, j.cur);
		uint32_t *dst = bc_es_half(a.state, a.cap, 1, j.record, j.cur ^ 1u);
		const float *sn = (const float *)(src + a.cap);
		float *dn = (float *)(dst + a.cap);
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)(
				(const char *)pg.records +
				(uint64_t)j.record * pg.list_stride);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			uint32_t p;
			float v;
			if (i < j.len) {
				p = src[i];
				v = sn[i];
			} else {
				p = first + (i - j.len);
				const T *row = (const T *)bc_entry_row(pg, r, i);
				v = nanf("");
				if (row) {
					double ss = 0.0;
					for (uint32_t d = 0; d < hd; d++) {
						double x = (double)common_to_f(row[d]);
						ss += x * x;
					}
					v = (float)sqrt(ss);
				}
			}
			dst[i] = p;
			dn[i] = v;
			if (at == UINT32_MAX)
				continue;
			sc[at + i] = -v;
			rank[at + i] = p;
			prot[at + i] = p < a.sinks ||
			               (a.window && p + (uint64_t)a.window >= j.n_seen);
		}
	}
}

static int bc_knorm_check_args(uint32_t n_records, uint32_t hd,
                                const struct knorm_rule *a,
                                const struct knorm_rule_job *jobs,
                                uint32_t n, uint32_t out_words)
{
	if (!a->state || !hd) {
		bc_note("knorm rule: no state, or head_dim %u", hd);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct knorm_rule_job *j = &jobs[k];
		if (j->record >= n_records || j->cur > 1 ||
		    (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("knorm rule: job %u: record %u of %u, half %u, "
			        "%u + %u entries of %u, seen %u, drops %u + %u of "
			        "%u words", k, j->record, n_records, j->cur,
			        j->len, j->n_new, a->cap, j->n_seen, j->drop_off,
			        j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The launches of one call, whatever n: the jobs' upload, the plan, the
 * carry and scores, the selection's three (batch_select.cuh); then the
 * output's copy. */
static int bc_knorm_run_locked(struct bc_ctx *c,
                               const struct kvt_backend_paged *pg,
                               enum kvt_dtype dt, uint32_t hd,
                               const struct knorm_rule *a,
                               const struct knorm_rule_job *jobs,
                               uint32_t n, uint32_t *out,
                               uint32_t out_words, cudaStream_t s)
{
	struct bc_bs_call k;
	knorm_rule_job *dj;
	int rv = bc_bs_begin<false>(c, "knorm rule", jobs, n, sizeof(*a),
	                            out_words, 0, NULL, 0, 0, 0, s, &k, &dj);
	if (rv)
		return rv;
	const uint32_t tpb = bc_bs_threads(k.cn.maxL);
	const dim3 grid(bc_bs_blocks(k.cn.maxL), bc_bs_rows(n));
	const kvt_backend_paged p = *pg;
	const knorm_rule A = *a;
	if (dt == KVT_DTYPE_F16)
		KVT_LAUNCH(bc_knorm_batch<f16_t>, grid, tpb, 0, s, p, A, dj, k.at,
		           n, hd, k.sc, k.rank, k.prot);
	else if (dt == KVT_DTYPE_BF16)
		KVT_LAUNCH(bc_knorm_batch<bf16_t>, grid, tpb, 0, s, p, A, dj,
		           k.at,
		           n, hd, k.sc, k.rank, k.prot);
	else
		KVT_LAUNCH(bc_knorm_batch<float>, grid, tpb, 0, s, p, A, dj, k.at,
		           n, hd, k.sc, k.rank, k.prot);
	BC_CALL(cudaGetLastError(), "knorm rule score");
	return bc_bs_end(c, "knorm rule", &k, a->state, a->cap, 1, out,
	                 out_words, s);
}

static int bc_knorm_run(void *ctx, const struct kvt_backend_paged *pg,
                        uint32_t n_records,
                        const struct kvt_backend_rule_geom *g,
                        const void *params, const void *jobs_, uint32_t n,
                        uint32_t *out, uint32_t out_words, void *stream)
{
	const struct knorm_rule *a = (const struct knorm_rule *)params;
	const struct knorm_rule_job *jobs = (const struct knorm_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "knorm rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_knorm_check_args(n_records, g->head_dim, a,
			                           jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_knorm_run_locked(c, pg, g->dtype, g->head_dim,
			                           a, jobs, n, out, out_words,
			                           (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_knorm_rule;
const struct kvt_backend_rule bc_knorm_rule = {
	/* .name = */ "knorm",
	/* .version = */ KNORM_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct knorm_rule),
	/* .job_bytes = */ sizeof(struct knorm_rule_job),
	/* .run = */ bc_knorm_run,
};
