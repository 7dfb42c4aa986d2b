/*
 * h2o.cu — H2O's rule on the cuda backend, the device rule "h2o"
 * (h2o_rule.h; struct kvt_backend_rule, backend.h): policies/h2o.c's
 * accumulated attention computed where the keys, the staged queries and
 * the per-entry state are, so that a sync moves only the drop indices to
 * the host.  observed_attention runs it too.  The whole call (every job:
 * one list) in five launches whatever its jobs: a flag per job for rows
 * that are not finite; one thread per entry of every job carrying the
 * state to the other half and doing h2o_decide's float operations (the
 * logits in attn_band_cpu's order, band_logits.cuh); then the due lists'
 * selection, drop indices and compaction (batch_select.cuh).  The steps:
 * docs/cuda.md, "Device ops, step by step".  Scratch: bc_win_prepare's,
 * under the context's lock; the rule waits for its output.  Built into
 * libkvtrim-cuda.so (backend/cuda/cuda.mk) and registered in
 * backend_cuda.cu's BC_RULES.  Test: cuda.backend_h2o_rule_matches_h2o and
 * the emulated passes.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "h2o_rule.h"

/* What batch_select.cuh asks of a job: every job checks its rows; the
 * state record is the list's; no band. */
static __device__ __forceinline__ int
bc_bs_checked(const h2o_rule_job &) { return 1; }
static __device__ __forceinline__ uint32_t
bc_bs_srec(const h2o_rule_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const h2o_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const h2o_rule_job &) { return 0; }

#include "batch_select.cuh"

static __device__ __forceinline__ const float *
bc_h2o_row(const h2o_rule &a, const h2o_rule_job &j,
           uint32_t p)
{
	return j.ring + (uint64_t)(p % a.rows.stage_tokens) * a.rows.row_floats;
}

/* Half h of record r: positions [cap], then S [cap][G]. */
static __host__ __device__ __forceinline__ uint32_t *
bc_h2o_half(const h2o_rule &a, uint32_t G, uint32_t r, uint32_t h)
{
	return bc_es_half(a.state, a.cap, G, r, h);
}

/* The score of an entry from its S [G] (count: the queries that could
 * see it, n_seen - pos): policies/h2o.c's float operations. */
static __device__ __forceinline__ float
bc_h2o_score(const h2o_rule &a, const float *e, uint32_t G,
             uint32_t count)
{
	float v;
	if (a.agg == 1) { /* max */
		v = e[0];
		for (uint32_t h = 1; h < G; h++)
			v = e[h] > v ? e[h] : v;
		return v;
	}
	if (a.agg == 2) { /* observed: mean of S / count */
		const float c = (float)count;
		v = e[0] / c;
		for (uint32_t h = 1; h < G; h++)
			v += e[h] / c;
		return v / (float)G;
	}
	v = e[0]; /* mean */
	for (uint32_t h = 1; h < G; h++)
		v += e[h];
	return v / (float)G;
}

/*
 * Every job's entries in one launch, grid (entries, jobs), one thread an
 * entry: the state carried from half cur to the other with the new
 * entries (position, S = 0), then per query head h of the group and each
 * new query t in order S += exp(logit - lse) where the entry is not newer
 * than the query (logits in attn_band_cpu's order), then (due: seg[k] is
 * the job's place in the flat arrays, else UINT32_MAX) the score, its rank
 * (the position) and its protection.
 */
template <typename T>
__global__ void bc_h2o_batch(const kvt_backend_paged pg,
                             const h2o_rule a,
                             const h2o_rule_job *jobs,
                             const uint32_t *seg, uint32_t n, uint32_t G,
                             uint32_t hd, float scale, float *sc,
                             uint32_t *rank, uint8_t *prot)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const h2o_rule_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)((const char *)pg.records +
			                                 (uint64_t)j.record *
			                                         pg.list_stride);
		const uint32_t *src = bc_h2o_half(a, G, j.record, j.cur);
		uint32_t *dst = bc_h2o_half(a, G, j.record, j.cur ^ 1u);
		const float *ss = (const float *)(src + a.cap);
		float *sd = (float *)(dst + a.cap);
		const uint32_t at = seg[k];
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			const uint32_t p = i < j.len ? src[i] : first + (i - j.len);
			dst[i] = p;
			const T *key = j.n_new ? (const T *)bc_entry_row(pg, r, i)
			                       : NULL;
			float *e = sd + (uint64_t)i * G;
			for (uint32_t h = 0; h < G; h++) {
				float v = i < j.len ? ss[(uint64_t)i * G + h] : 0.0f;
				const uint32_t qh = j.g * G + h;
				for (uint32_t t = 0; t < j.n_new; t++) {
					const float *row = bc_h2o_row(a, j, first + t);
					float w = p <= first + t
					          ? bc_band_weight(row, a.rows,
					                           qh, key, hd,
					                           scale)
					          : 0.0f;
					v += w;
				}
				e[h] = v;
			}
			if (at == UINT32_MAX)
				continue;
			sc[at + i] = bc_h2o_score(a, e, G, j.n_seen - p);
			rank[at + i] = p;
			prot[at + i] =
				(j.recent && p + (uint64_t)j.recent >= j.n_seen) ||
				p < a.sinks ||
				(a.window && p + (uint64_t)a.window >= j.n_seen);
		}
	}
}

static int bc_h2o_check_args(uint32_t n_records, uint32_t n_heads,
                             uint32_t nkv, uint32_t hd,
                             const struct h2o_rule *a,
                             const struct h2o_rule_job *jobs,
                             uint32_t n, uint32_t out_words)
{
	if (!bc_es_layout_ok(n_heads, nkv, hd, a->state, a->rows)) {
		bc_note("h2o rule: %u query heads on %u KV heads, head_dim "
		        "%u, or no state or ring", n_heads, nkv, hd);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct h2o_rule_job *j = &jobs[k];
		if (!j->ring || j->record >= n_records || j->g >= nkv ||
		    j->cur > 1 || (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || j->n_new > a->rows.stage_tokens ||
		    j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("h2o rule: job %u: record %u of %u, KV head %u, "
			        "%u + %u entries of %u, seen %u, drops %u + %u of "
			        "%u words", k, j->record, n_records, j->g, j->len,
			        j->n_new, a->cap, j->n_seen, j->drop_off,
			        j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The launches of one call, whatever n: the jobs' upload, the checks,
 * the plan, the accumulation, the selection's three (batch_select.cuh);
 * then the output's copy. */
static int bc_h2o_run_locked(struct bc_ctx *c,
                             const struct kvt_backend_paged *pg,
                             enum kvt_dtype dt, uint32_t n_heads,
                             uint32_t nkv, uint32_t hd,
                             const struct h2o_rule *a,
                             const struct h2o_rule_job *jobs,
                             uint32_t n, uint32_t *out,
                             uint32_t out_words, cudaStream_t s)
{
	const uint32_t G = n_heads / nkv;
	struct bc_bs_call k;
	h2o_rule_job *dj;
	int rv = bc_bs_begin<true>(c, "h2o rule", jobs, n, sizeof(*a),
	                           out_words, 0, &a->rows, 0, n_heads, hd, s, &k,
	                           &dj);
	if (rv)
		return rv;
	const float scale = 1.0f / sqrtf((float)hd);
	const uint32_t tpb = bc_bs_threads(k.cn.maxL);
	const dim3 grid(bc_bs_blocks(k.cn.maxL), bc_bs_rows(n));
	const kvt_backend_paged p = *pg;
	const h2o_rule A = *a;
	if (dt == KVT_DTYPE_F16)
		KVT_LAUNCH(bc_h2o_batch<f16_t>, grid, tpb, 0, s, p, A,
		           dj, k.at, n, G, hd, scale, k.sc, k.rank, k.prot);
	else if (dt == KVT_DTYPE_BF16)
		KVT_LAUNCH(bc_h2o_batch<bf16_t>, grid, tpb, 0, s, p, A,
		           dj, k.at, n, G, hd, scale, k.sc, k.rank, k.prot);
	else
		KVT_LAUNCH(bc_h2o_batch<float>, grid, tpb, 0, s, p, A,
		           dj, k.at, n, G, hd, scale, k.sc, k.rank, k.prot);
	BC_CALL(cudaGetLastError(), "h2o rule accumulate");
	return bc_bs_end(c, "h2o rule", &k, a->state, a->cap, G, out,
	                 out_words, s);
}

static int bc_h2o_run(void *ctx, const struct kvt_backend_paged *pg,
                      uint32_t n_records, const struct kvt_backend_rule_geom *g,
                      const void *params, const void *jobs_, uint32_t n,
                      uint32_t *out, uint32_t out_words, void *stream)
{
	const struct h2o_rule *a = (const struct h2o_rule *)params;
	const struct h2o_rule_job *jobs = (const struct h2o_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "h2o rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_h2o_check_args(n_records, g->n_heads,
			          g->n_kv_heads, g->head_dim, a, jobs, n,
			          out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_h2o_run_locked(
				c, pg, g->dtype, g->n_heads, g->n_kv_heads,
				g->head_dim, a, jobs, n, out, out_words,
				(cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_h2o_rule;
const struct kvt_backend_rule bc_h2o_rule = {
	/* .name = */ "h2o",
	/* .version = */ H2O_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct h2o_rule),
	/* .job_bytes = */ sizeof(struct h2o_rule_job),
	/* .run = */ bc_h2o_run,
};
