/*
 * attn_select.cu — the cuda backend's `attn_select` op (backend.h): H2O's
 * accumulated attention (policies/h2o.c) computed where the keys, the
 * staged queries and the per-entry state are, so that a sync moves only
 * the drop indices to the host.  Per job (one list): gather and carry the
 * state to the other half, the logits (band_logits.cuh), one thread per
 * entry doing h2o_decide's float operations, then (when due)
 * select_topk_cuda and the half compacted by compact_drops' pairing; a
 * flag per job for rows that are not finite.  The steps: docs/cuda.md,
 * "Device ops, step by step".  Scratch: bc_win_prepare's, under the
 * context's lock; the op waits for its output.  Test:
 * cuda.backend_attn_select_matches_h2o and the emulated passes.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "prompt_select.cuh"
#include "select_topk.cuh"

#define BC_H2O_THREADS 256

static __device__ __forceinline__ const float *
bc_h2o_row(const kvt_backend_attn &a, const kvt_backend_attn_job &j,
           uint32_t p)
{
	return j.ring + (uint64_t)(p % a.rows.stage_tokens) * a.rows.row_floats;
}

/* Half h of record r: positions [cap], then S [cap][G]. */
static __host__ __device__ __forceinline__ uint32_t *
bc_h2o_half(const kvt_backend_attn &a, uint32_t G, uint32_t r, uint32_t h)
{
	return bc_es_half(a.state, a.cap, G, r, h);
}

/* Step 1 (L = len + n_new entries). */
template <typename T>
__global__ void bc_h2o_gather(const kvt_backend_paged pg,
                              const kvt_backend_attn a,
                              const kvt_backend_attn_job j, uint32_t G,
                              uint32_t head_dim, float *qg, float *lg,
                              float *keys)
{
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		                                 (uint64_t)j.record *
		                                         pg.list_stride);
	const uint32_t L = j.len + j.n_new;
	const uint32_t *src = bc_h2o_half(a, G, j.record, j.cur);
	uint32_t *dst = bc_h2o_half(a, G, j.record, j.cur ^ 1u);
	const float *ss = (const float *)(src + a.cap);
	float *sd = (float *)(dst + a.cap);
	const uint64_t nk = j.n_new ? (uint64_t)L * head_dim : 0,
	               nq = (uint64_t)j.n_new * G * head_dim,
	               nl = (uint64_t)j.n_new * G, ns = (uint64_t)L * (1 + G);
	const uint32_t first = j.n_seen - j.n_new;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < nk + nq + nl + ns; e += (uint64_t)gridDim.x * blockDim.x) {
		if (e < nk) {
			uint32_t i = (uint32_t)(e / head_dim),
			         d = (uint32_t)(e % head_dim);
			const T *row = (const T *)bc_entry_row(pg, r, i);
			keys[e] = row ? common_to_f(row[d]) : nanf("");
		} else if (e < nk + nq) {
			uint64_t q = e - nk;
			uint32_t t = (uint32_t)(q / ((uint64_t)G * head_dim));
			uint32_t rest = (uint32_t)(q % ((uint64_t)G * head_dim));
			qg[q] = bc_h2o_row(a, j, first + t)
				[a.rows.q_off + (uint64_t)j.g * G * head_dim +
				 rest];
		} else if (e < nk + nq + nl) {
			uint64_t q = e - nk - nq;
			uint32_t t = (uint32_t)(q / G), h = (uint32_t)(q % G);
			lg[q] = bc_h2o_row(a, j, first + t)
				[a.rows.lse_off + j.g * G + h];
		} else {
			uint64_t q = e - nk - nq - nl;
			uint32_t i = (uint32_t)(q / (1 + G)),
			         k = (uint32_t)(q % (1 + G));
			if (k == 0)
				dst[i] = i < j.len ? src[i] : first + (i - j.len);
			else
				sd[(uint64_t)i * G + k - 1] =
					i < j.len ? ss[(uint64_t)i * G + k - 1] : 0.0f;
		}
	}
}

/* Step 3: the accumulation, then (due) score s and protection prot. */
__global__ void bc_h2o_accum(const kvt_backend_attn a,
                             const kvt_backend_attn_job j, uint32_t G,
                             const float *logit, const float *lg, float *s,
                             uint8_t *prot)
{
	const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
	uint32_t *pos = bc_h2o_half(a, G, j.record, j.cur ^ 1u);
	float *S = (float *)(pos + a.cap);
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
	     i += gridDim.x * blockDim.x) {
		const uint32_t p = pos[i];
		float *e = S + (uint64_t)i * G;
		for (uint32_t h = 0; h < G; h++) {
			float v = e[h];
			for (uint32_t t = 0; t < j.n_new; t++) {
				const uint32_t row = t * G + h;
				float w = p <= first + t
				          ? expf(logit[(uint64_t)row * L + i] - lg[row])
				          : 0.0f;
				v += w;
			}
			e[h] = v;
		}
		if (!j.due)
			continue;
		float v;
		if (a.agg == 1) { /* max */
			v = e[0];
			for (uint32_t h = 1; h < G; h++)
				v = e[h] > v ? e[h] : v;
			s[i] = v;
		} else if (a.agg == 2) { /* observed: mean of S / count */
			const float c = (float)(j.n_seen - p);
			v = e[0] / c;
			for (uint32_t h = 1; h < G; h++)
				v += e[h] / c;
			s[i] = v / (float)G;
		} else { /* mean */
			v = e[0];
			for (uint32_t h = 1; h < G; h++)
				v += e[h];
			s[i] = v / (float)G;
		}
		prot[i] = (j.recent && p + (uint64_t)j.recent >= j.n_seen) ||
		          p < a.sinks ||
		          (a.window && p + (uint64_t)a.window >= j.n_seen);
	}
}

static int bc_attn_check_args(uint32_t n_records, uint32_t n_heads,
                              uint32_t nkv, uint32_t hd,
                              const struct kvt_backend_attn *a,
                              const struct kvt_backend_attn_job *jobs,
                              uint32_t n, uint32_t out_words)
{
	if (!bc_es_layout_ok(n_heads, nkv, hd, a->state, a->rows)) {
		bc_note("attn_select: %u query heads on %u KV heads, head_dim "
		        "%u, or no state or ring", n_heads, nkv, hd);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct kvt_backend_attn_job *j = &jobs[k];
		if (!j->ring || j->record >= n_records || j->g >= nkv ||
		    j->cur > 1 || (uint64_t)j->len + j->n_new > a->cap ||
		    j->n_new > j->n_seen || j->n_new > a->rows.stage_tokens ||
		    j->n_drop > j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("attn_select: job %u: record %u of %u, KV head %u, "
			        "%u + %u entries of %u, seen %u, drops %u + %u of "
			        "%u words", k, j->record, n_records, j->g, j->len,
			        j->n_new, a->cap, j->n_seen, j->drop_off,
			        j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

static int bc_attn_select_locked(struct bc_ctx *c,
                                 const struct kvt_backend_paged *pg,
                                 enum kvt_dtype dt, uint32_t n_heads,
                                 uint32_t nkv, uint32_t hd,
                                 const struct kvt_backend_attn *a,
                                 const struct kvt_backend_attn_job *jobs,
                                 uint32_t n, uint32_t *out,
                                 uint32_t out_words, cudaStream_t s)
{
	const uint32_t G = n_heads / nkv;
	uint64_t maxL = 1, maxN = 1;
	for (uint32_t k = 0; k < n; k++) {
		uint64_t L = (uint64_t)jobs[k].len + jobs[k].n_new;
		maxL = L > maxL ? L : maxL;
		maxN = jobs[k].n_new > maxN ? jobs[k].n_new : maxN;
	}
	const size_t o_out = 0,
	             o_keys = o_out + bc_ps_al((size_t)out_words * 4),
	             o_qg = o_keys + bc_ps_al(maxL * hd * 4),
	             o_lg = o_qg + bc_ps_al(maxN * G * hd * 4),
	             o_logit = o_lg + bc_ps_al(maxN * G * 4),
	             o_s = o_logit + bc_ps_al(maxN * G * maxL * 4),
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
	      *sc = (float *)(d + o_s);
	uint8_t *prot = (uint8_t *)(d + o_prot), *drop = (uint8_t *)(d + o_drop);
	/* the jobs reach the device as launch arguments: counted as the
	 * descriptors they are */
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "attn_select");
	const float scale = 1.0f / sqrtf((float)hd);
	const kvt_backend_paged p = *pg;
	const kvt_backend_attn A = *a;
	for (uint32_t k = 0; k < n; k++) {
		const kvt_backend_attn_job J = jobs[k];
		const uint32_t L = J.len + J.n_new;
		if (!L)
			continue;
		KVT_LAUNCH(bc_es_check, 1, BC_H2O_THREADS, 0, s, J.ring, A.rows,
		           J.n_seen - J.n_new, J.n_new, 0, n_heads, hd, dout + k);
		uint64_t tot = (J.n_new ? (uint64_t)L * hd : 0) +
		               (uint64_t)J.n_new * G * (hd + 1) +
		               (uint64_t)L * (1 + G);
		uint32_t blocks = (uint32_t)((tot + BC_H2O_THREADS - 1) /
		                             BC_H2O_THREADS);
		if (blocks > 4096)
			blocks = 4096;
		if (dt == KVT_DTYPE_F16)
			KVT_LAUNCH(bc_h2o_gather<f16_t>, blocks, BC_H2O_THREADS, 0,
			           s, p, A, J, G, hd, qg, lg, keys);
		else if (dt == KVT_DTYPE_BF16)
			KVT_LAUNCH(bc_h2o_gather<bf16_t>, blocks, BC_H2O_THREADS,
			           0, s, p, A, J, G, hd, qg, lg, keys);
		else
			KVT_LAUNCH(bc_h2o_gather<float>, blocks, BC_H2O_THREADS, 0,
			           s, p, A, J, G, hd, qg, lg, keys);
		BC_CALL(cudaGetLastError(), "attn_select gather");
		/* logit [n_new G][L], as attn_band_cpu */
		if ((rv = bc_band_logits("attn_select logits", keys, qg,
		                         J.n_new * G, L, hd, scale, logit, s)))
			return rv;
		uint32_t eb = (L + BC_H2O_THREADS - 1) / BC_H2O_THREADS;
		KVT_LAUNCH(bc_h2o_accum, eb > 4096 ? 4096 : eb, BC_H2O_THREADS, 0,
		           s, A, J, G, logit, lg, sc, prot);
		BC_CALL(cudaGetLastError(), "attn_select accumulate");
		if (!J.due)
			continue;
		if ((rv = bc_es_select("attn_select", A.state, A.cap, G, J.record,
		                       J.cur ^ 1u, sc, prot, drop, L, J.keep,
		                       dout + 2 * n + J.drop_off, J.n_drop,
		                       dout + n + k, s)))
			return rv;
	}
	return bc_ps_finish(c, out, dout, out_words, s, "attn_select");
}

int bc_attn_select(void *ctx, const struct kvt_backend_paged *pg,
                   uint32_t n_records, enum kvt_dtype dtype, uint32_t n_heads,
                   uint32_t n_kv_heads, uint32_t head_dim,
                   const struct kvt_backend_attn *a,
                   const struct kvt_backend_attn_job *jobs, uint32_t n,
                   uint32_t *out, uint32_t out_words, void *stream)
{
	return bc_es_entry(
		ctx, "attn_select", pg, a, jobs, n, dtype, out, out_words,
		[&] {
			return bc_attn_check_args(n_records, n_heads, n_kv_heads,
			          head_dim, a, jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_attn_select_locked(
				c, pg, dtype, n_heads, n_kv_heads, head_dim, a,
				jobs, n, out, out_words, (cudaStream_t)stream);
		});
}
