/*
 * tova.cu — TOVA's rule on the cuda backend, the device rule "tova"
 * (tova_rule.h; struct kvt_backend_rule, backend.h): policies/tova.c's
 * selection computed where the keys, the staged queries and the positions
 * are, so that a sync moves one list of drop indices per (sequence,
 * layer) to the host.  The whole call (every job: one (sequence, layer),
 * its lists sharing one position array) in five launches whatever its
 * jobs: the row checks; one thread per entry of every job carrying the
 * positions and, when due, doing tova_decide's float operations over
 * every KV head (the logits in attn_band_cpu's order, band_logits.cuh);
 * then the due jobs' selection, drop indices and compaction
 * (batch_select.cuh).  The steps: docs/cuda.md, "Device ops, step by
 * step".  Scratch: bc_win_prepare's, under the context's lock; the rule
 * waits for its output.  Built into libkvtrim-cuda.so (backend/cuda/
 * cuda.mk) and registered in backend_cuda.cu's BC_RULES.  Test:
 * cuda.backend_tova_rule_matches_tova.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "tova_rule.h"

/* What batch_select.cuh asks of a job: every job checks its rows; its
 * lists share the state record srec; no band. */
static __device__ __forceinline__ int
bc_bs_checked(const tova_rule_job &) { return 1; }
static __device__ __forceinline__ uint32_t
bc_bs_srec(const tova_rule_job &j) { return j.srec; }
static __device__ __forceinline__ int
bc_bs_band(const tova_rule_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const tova_rule_job &) { return 0; }

#include "batch_select.cuh"

static __host__ __device__ __forceinline__ uint32_t *
bc_tova_half(const tova_rule &a, uint32_t r, uint32_t h)
{
	return bc_es_half(a.state, a.cap, 0, r, h);
}

/*
 * Every job (one (sequence, layer)) in one launch, grid (entries, jobs),
 * one thread an entry: its position carried from half cur to the other
 * (the new ones appended); when due (seg[k] its place in the flat arrays,
 * else UINT32_MAX) tova_decide's score: per KV head g in order, the sum
 * over its query heads in order of exp(logit - lse) of the newest query
 * (0 for an entry newer than it; logits in attn_band_cpu's order), the
 * heads' parts summed in g order, times 1/H; its rank and protection.
 */
template <typename T>
__global__ void bc_tova_batch(const kvt_backend_paged pg,
                              const tova_rule a,
                              const tova_rule_job *jobs,
                              const uint32_t *seg, uint32_t n, uint32_t nkv,
                              uint32_t G, uint32_t hd, float scale,
                              float inv_h, float *sc, uint32_t *rank,
                              uint8_t *prot)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const tova_rule_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new,
		               qpos = j.n_seen - 1, at = seg[k];
		const uint32_t *src = bc_tova_half(a, j.srec, j.cur);
		uint32_t *dst = bc_tova_half(a, j.srec, j.cur ^ 1u);
		const float *row = bc_es_row(j.ring, a.rows, qpos);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			const uint32_t p = i < j.len ? src[i] : first + (i - j.len);
			dst[i] = p;
			if (at == UINT32_MAX)
				continue;
			const int vis = p <= qpos;
			float v = 0.0f;
			for (uint32_t g = 0; g < nkv; g++) {
				const struct kvt_list_record *r =
					(const struct kvt_list_record *)(
						(const char *)pg.records +
						(uint64_t)(j.record + g) * pg.list_stride);
				const T *key = vis ? (const T *)bc_entry_row(pg, r, i)
				                   : NULL;
				float part = 0.0f;
				for (uint32_t h = 0; h < G; h++) {
					const uint32_t qh = g * G + h;
					float w = vis ? bc_band_weight(
						row, a.rows, qh, key, hd, scale)
					              : 0.0f;
					part = h ? part + w : w;
				}
				v = g ? v + part : part;
			}
			sc[at + i] = v * inv_h;
			rank[at + i] = p;
			prot[at + i] = p < a.sinks ||
			               (a.window && p + (uint64_t)a.window >= j.n_seen);
		}
	}
}

static int bc_tova_check_args(uint32_t n_records, uint32_t n_heads,
                              uint32_t nkv, uint32_t hd,
                              const struct tova_rule *a,
                              const struct tova_rule_job *jobs,
                              uint32_t n, uint32_t out_words)
{
	if (!bc_es_layout_ok(n_heads, nkv, hd, a->state, a->rows)) {
		bc_note("tova rule: %u query heads on %u KV heads, head_dim "
		        "%u, or no state or ring", n_heads, nkv, hd);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct tova_rule_job *j = &jobs[k];
		if (!j->ring || (uint64_t)j->record + nkv > n_records ||
		    j->srec >= n_records / nkv || j->cur > 1 || !j->n_new ||
		    (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || j->n_new > a->rows.stage_tokens ||
		    j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("tova rule: job %u: records %u + %u of %u, state "
			        "%u, %u + %u entries of %u, seen %u, drops %u + %u "
			        "of %u words", k, j->record, nkv, n_records,
			        j->srec, j->len, j->n_new, a->cap, j->n_seen,
			        j->drop_off, j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The launches of one call, whatever n: the jobs' upload, the checks,
 * the plan, the positions and scores, the selection's three
 * (batch_select.cuh); then the output's copy. */
static int bc_tova_run_locked(struct bc_ctx *c,
                              const struct kvt_backend_paged *pg,
                              enum kvt_dtype dt, uint32_t n_heads,
                              uint32_t nkv, uint32_t hd,
                              const struct tova_rule *a,
                              const struct tova_rule_job *jobs,
                              uint32_t n, uint32_t *out,
                              uint32_t out_words, cudaStream_t s)
{
	struct bc_bs_call k;
	tova_rule_job *dj;
	int rv = bc_bs_begin<true>(c, "tova rule", jobs, n, sizeof(*a),
	                           out_words, 0, &a->rows, 0, n_heads, hd, s, &k,
	                           &dj);
	if (rv)
		return rv;
	const uint32_t G = n_heads / nkv;
	const float scale = 1.0f / sqrtf((float)hd), inv_h = 1.0f / (float)n_heads;
	const uint32_t tpb = bc_bs_threads(k.cn.maxL);
	const dim3 grid(bc_bs_blocks(k.cn.maxL), bc_bs_rows(n));
	const kvt_backend_paged p = *pg;
	const tova_rule A = *a;
	if (dt == KVT_DTYPE_F16)
		KVT_LAUNCH(bc_tova_batch<f16_t>, grid, tpb, 0, s, p, A,
		           dj, k.at, n, nkv, G, hd, scale, inv_h, k.sc, k.rank,
		           k.prot);
	else if (dt == KVT_DTYPE_BF16)
		KVT_LAUNCH(bc_tova_batch<bf16_t>, grid, tpb, 0, s, p, A,
		           dj, k.at, n, nkv, G, hd, scale, inv_h, k.sc, k.rank,
		           k.prot);
	else
		KVT_LAUNCH(bc_tova_batch<float>, grid, tpb, 0, s, p, A,
		           dj, k.at, n, nkv, G, hd, scale, inv_h, k.sc, k.rank,
		           k.prot);
	BC_CALL(cudaGetLastError(), "tova rule score");
	return bc_bs_end(c, "tova rule", &k, a->state, a->cap, 0, out,
	                 out_words, s);
}

static int bc_tova_run(void *ctx, const struct kvt_backend_paged *pg,
                       uint32_t n_records,
                       const struct kvt_backend_rule_geom *g,
                       const void *params, const void *jobs_, uint32_t n,
                       uint32_t *out, uint32_t out_words, void *stream)
{
	const struct tova_rule *a = (const struct tova_rule *)params;
	const struct tova_rule_job *jobs = (const struct tova_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "tova rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_tova_check_args(n_records, g->n_heads,
			          g->n_kv_heads, g->head_dim, a, jobs, n,
			          out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_tova_run_locked(
				c, pg, g->dtype, g->n_heads, g->n_kv_heads,
				g->head_dim, a, jobs, n, out, out_words,
				(cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_tova_rule;
const struct kvt_backend_rule bc_tova_rule = {
	/* .name = */ "tova",
	/* .version = */ TOVA_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct tova_rule),
	/* .job_bytes = */ sizeof(struct tova_rule_job),
	/* .run = */ bc_tova_run,
};
