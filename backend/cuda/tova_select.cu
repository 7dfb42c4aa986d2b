/*
 * tova_select.cu — the cuda backend's `tova_select` op (backend.h):
 * TOVA's selection (policies/tova.c) computed where the keys, the staged
 * queries and the positions are, so that a sync moves one list of drop
 * indices per (sequence, layer) to the host.  Per job (one (sequence,
 * layer), its lists sharing one position array): the row check and the
 * positions carried, then (when due) per KV head the logits in
 * attn_band_cpu's order (band_logits.cuh), tova_decide's float
 * operations, select_topk_cuda and the half
 * compacted.  The steps: docs/cuda.md, "Device ops, step by step".
 * Scratch: bc_win_prepare's, under the context's lock; the op waits for
 * its output.  Test: cuda.backend_tova_select_matches_tova.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "prompt_select.cuh"
#include "select_topk.cuh"

#define BC_TOVA_THREADS 256

static __host__ __device__ __forceinline__ uint32_t *
bc_tova_half(const kvt_backend_tova &a, uint32_t r, uint32_t h)
{
	return bc_es_half(a.state, a.cap, 0, r, h);
}

/* Step 1's positions: half cur to the other, the new ones appended. */
__global__ void bc_tova_positions(const kvt_backend_tova a,
                                  const kvt_backend_tova_job j)
{
	const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
	const uint32_t *src = bc_tova_half(a, j.srec, j.cur);
	uint32_t *dst = bc_tova_half(a, j.srec, j.cur ^ 1u);
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
	     i += gridDim.x * blockDim.x)
		dst[i] = i < j.len ? src[i] : first + (i - j.len);
}

/* Step 2's gather for KV head g: keys [L][hd], the newest row's q [G][hd]
 * and lse [G] of the head's query heads. */
template <typename T>
__global__ void bc_tova_gather(const kvt_backend_paged pg,
                               const kvt_backend_tova a,
                               const kvt_backend_tova_job j, uint32_t g,
                               uint32_t G, uint32_t head_dim, float *qg,
                               float *lg, float *keys)
{
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		                                 (uint64_t)(j.record + g) *
		                                         pg.list_stride);
	const uint64_t nk = (uint64_t)(j.len + j.n_new) * head_dim,
	               nq = (uint64_t)G * head_dim;
	const float *row = bc_es_row(j.ring, a.rows, j.n_seen - 1);
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < nk + nq + G; e += (uint64_t)gridDim.x * blockDim.x) {
		if (e < nk) {
			uint32_t i = (uint32_t)(e / head_dim),
			         d = (uint32_t)(e % head_dim);
			const T *k = (const T *)bc_entry_row(pg, r, i);
			keys[e] = k ? common_to_f(k[d]) : nanf("");
		} else if (e < nk + nq) {
			qg[e - nk] = row[a.rows.q_off +
			                 (uint64_t)g * G * head_dim + (e - nk)];
		} else {
			lg[e - nk - nq] = row[a.rows.lse_off + g * G +
			                      (uint32_t)(e - nk - nq)];
		}
	}
}

/* Step 2's sum over the query heads of KV head g: part [L]. */
__global__ void bc_tova_part(const kvt_backend_tova a,
                             const kvt_backend_tova_job j, uint32_t G,
                             const float *logit, const float *lg,
                             float *part)
{
	const uint32_t L = j.len + j.n_new, qpos = j.n_seen - 1;
	const uint32_t *pos = bc_tova_half(a, j.srec, j.cur ^ 1u);
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
	     i += gridDim.x * blockDim.x) {
		const int vis = pos[i] <= qpos;
		float v = vis ? expf(logit[i] - lg[0]) : 0.0f;
		for (uint32_t h = 1; h < G; h++)
			v += vis ? expf(logit[(uint64_t)h * L + i] - lg[h]) : 0.0f;
		part[i] = v;
	}
}

/* Step 3: the score over the n_kv heads' parts [n_kv][L], and prot. */
__global__ void bc_tova_score(const kvt_backend_tova a,
                              const kvt_backend_tova_job j, uint32_t nkv,
                              float inv_h, const float *part, float *s,
                              uint8_t *prot)
{
	const uint32_t L = j.len + j.n_new;
	const uint32_t *pos = bc_tova_half(a, j.srec, j.cur ^ 1u);
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
	     i += gridDim.x * blockDim.x) {
		float v = part[i];
		for (uint32_t g = 1; g < nkv; g++)
			v += part[(uint64_t)g * L + i];
		s[i] = v * inv_h;
		const uint32_t p = pos[i];
		prot[i] = p < a.sinks ||
		          (a.window && p + (uint64_t)a.window >= j.n_seen);
	}
}

static int bc_tova_check_args(uint32_t n_records, uint32_t n_heads,
                              uint32_t nkv, uint32_t hd,
                              const struct kvt_backend_tova *a,
                              const struct kvt_backend_tova_job *jobs,
                              uint32_t n, uint32_t out_words)
{
	if (!bc_es_layout_ok(n_heads, nkv, hd, a->state, a->rows)) {
		bc_note("tova_select: %u query heads on %u KV heads, head_dim "
		        "%u, or no state or ring", n_heads, nkv, hd);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct kvt_backend_tova_job *j = &jobs[k];
		if (!j->ring || (uint64_t)j->record + nkv > n_records ||
		    j->srec >= n_records / nkv || j->cur > 1 || !j->n_new ||
		    (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || j->n_new > a->rows.stage_tokens ||
		    j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("tova_select: job %u: records %u + %u of %u, state "
			        "%u, %u + %u entries of %u, seen %u, drops %u + %u "
			        "of %u words", k, j->record, nkv, n_records,
			        j->srec, j->len, j->n_new, a->cap, j->n_seen,
			        j->drop_off, j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

static uint32_t bc_tova_blocks(uint64_t items)
{
	uint64_t b = (items + BC_TOVA_THREADS - 1) / BC_TOVA_THREADS;
	return b > 4096 ? 4096 : b ? (uint32_t)b : 1;
}

/* Step 2 for KV head g of job J: keys, logits, part. */
static int bc_tova_head(const kvt_backend_paged &p,
                        enum kvt_dtype dt, const kvt_backend_tova &A,
                        const kvt_backend_tova_job &J, uint32_t g,
                        uint32_t G, uint32_t hd, float *keys, float *qg,
                        float *lg, float *logit, float *part, cudaStream_t s)
{
	const uint32_t L = J.len + J.n_new;
	const uint32_t blocks = bc_tova_blocks((uint64_t)L * hd + G * (hd + 1));
	if (dt == KVT_DTYPE_F16)
		KVT_LAUNCH(bc_tova_gather<f16_t>, blocks, BC_TOVA_THREADS, 0, s,
		           p, A, J, g, G, hd, qg, lg, keys);
	else if (dt == KVT_DTYPE_BF16)
		KVT_LAUNCH(bc_tova_gather<bf16_t>, blocks, BC_TOVA_THREADS, 0, s,
		           p, A, J, g, G, hd, qg, lg, keys);
	else
		KVT_LAUNCH(bc_tova_gather<float>, blocks, BC_TOVA_THREADS, 0, s,
		           p, A, J, g, G, hd, qg, lg, keys);
	BC_CALL(cudaGetLastError(), "tova_select gather");
	/* logit [G][L], as attn_band_cpu */
	const float scale = 1.0f / sqrtf((float)hd);
	int rv = bc_band_logits("tova_select logits", keys, qg, G, L, hd, scale,
	                        logit, s);
	if (rv)
		return rv;
	KVT_LAUNCH(bc_tova_part, bc_tova_blocks(L), BC_TOVA_THREADS, 0, s, A, J,
	           G, logit, lg, part + (uint64_t)g * L);
	BC_CALL(cudaGetLastError(), "tova_select part");
	return 0;
}

static int bc_tova_select_locked(struct bc_ctx *c,
                                 const struct kvt_backend_paged *pg,
                                 enum kvt_dtype dt, uint32_t n_heads,
                                 uint32_t nkv, uint32_t hd,
                                 const struct kvt_backend_tova *a,
                                 const struct kvt_backend_tova_job *jobs,
                                 uint32_t n, uint32_t *out,
                                 uint32_t out_words, cudaStream_t s)
{
	const uint32_t G = n_heads / nkv;
	uint64_t maxL = 1;
	for (uint32_t k = 0; k < n; k++) {
		uint64_t L = (uint64_t)jobs[k].len + jobs[k].n_new;
		maxL = L > maxL ? L : maxL;
	}
	const size_t o_out = 0,
	             o_keys = o_out + bc_ps_al((size_t)out_words * 4),
	             o_qg = o_keys + bc_ps_al(maxL * hd * 4),
	             o_lg = o_qg + bc_ps_al((size_t)G * hd * 4),
	             o_logit = o_lg + bc_ps_al((size_t)G * 4),
	             o_part = o_logit + bc_ps_al(G * maxL * 4),
	             o_s = o_part + bc_ps_al(nkv * maxL * 4),
	             o_prot = o_s + bc_ps_al(maxL * 4),
	             o_drop = o_prot + bc_ps_al(maxL),
	             need = o_drop + bc_ps_al(maxL);
	int rv = bc_win_prepare(c, need);
	if (rv)
		return rv;
	char *d = c->d_win;
	uint32_t *dout = (uint32_t *)(d + o_out);
	float *keys = (float *)(d + o_keys), *qg = (float *)(d + o_qg),
	      *lg = (float *)(d + o_lg), *logit = (float *)(d + o_logit),
	      *part = (float *)(d + o_part), *sc = (float *)(d + o_s);
	uint8_t *prot = (uint8_t *)(d + o_prot), *drop = (uint8_t *)(d + o_drop);
	/* the jobs reach the device as launch arguments: counted as the
	 * descriptors they are */
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "tova_select");
	const kvt_backend_paged p = *pg;
	const kvt_backend_tova A = *a;
	const float inv_h = 1.0f / (float)n_heads;
	for (uint32_t k = 0; k < n; k++) {
		const kvt_backend_tova_job J = jobs[k];
		const uint32_t L = J.len + J.n_new;
		KVT_LAUNCH(bc_es_check, 1, BC_TOVA_THREADS, 0, s, J.ring,
		           A.rows, J.n_seen - J.n_new, J.n_new, 0, n_heads, hd,
		           dout + k);
		KVT_LAUNCH(bc_tova_positions, bc_tova_blocks(L), BC_TOVA_THREADS,
		           0, s, A, J);
		BC_CALL(cudaGetLastError(), "tova_select positions");
		if (!J.due)
			continue;
		for (uint32_t g = 0; g < nkv; g++)
			if ((rv = bc_tova_head(p, dt, A, J, g, G, hd, keys, qg,
			                       lg, logit, part, s)))
				return rv;
		KVT_LAUNCH(bc_tova_score, bc_tova_blocks(L), BC_TOVA_THREADS, 0,
		           s, A, J, nkv, inv_h, part, sc, prot);
		BC_CALL(cudaGetLastError(), "tova_select score");
		if ((rv = bc_es_select("tova_select", A.state, A.cap, 0, J.srec,
		                       J.cur ^ 1u, sc, prot, drop, L, J.keep,
		                       dout + 2 * n + J.drop_off, J.n_drop,
		                       dout + n + k, s)))
			return rv;
	}
	return bc_ps_finish(c, out, dout, out_words, s, "tova_select");
}

int bc_tova_select(void *ctx, const struct kvt_backend_paged *pg,
                   uint32_t n_records, enum kvt_dtype dtype, uint32_t n_heads,
                   uint32_t n_kv_heads, uint32_t head_dim,
                   const struct kvt_backend_tova *a,
                   const struct kvt_backend_tova_job *jobs, uint32_t n,
                   uint32_t *out, uint32_t out_words, void *stream)
{
	return bc_es_entry(
		ctx, "tova_select", pg, a, jobs, n, dtype, out, out_words,
		[&] {
			return bc_tova_check_args(n_records, n_heads, n_kv_heads,
			          head_dim, a, jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_tova_select_locked(
				c, pg, dtype, n_heads, n_kv_heads, head_dim, a,
				jobs, n, out, out_words, (cudaStream_t)stream);
		});
}
