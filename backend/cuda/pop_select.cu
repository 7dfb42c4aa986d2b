/*
 * pop_select.cu — the cuda backend's `pop_select` op (backend.h): KVpop's
 * delayed learned scorer (policies/kvpop.c) run where the staged rows, the
 * keys, the projections u and the entries' state [a, s] are, so that a
 * sync moves only the drop indices to the host.  Per job (one list),
 * kvpop_decide's float operations one for one: u = P x into the u ring,
 * the state carried, the band's attention accumulated, kvpop_score where
 * a delay ends, and (when due) select_topk_cuda and the half compacted.
 * Bit for bit on the CPU emulator; on a GPU FMA and the math functions
 * round differently.  The steps: docs/cuda.md, "Device ops, step by step".
 * Scratch: bc_win_prepare's, under the context's lock.  Tests:
 * cuda.backend_pop_select_matches_kvpop, ..._kvpop_flags_and_refuses.
 */
#include <cublas_v2.h>
#include <math.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "prompt_select.cuh"
#include "select_topk.cuh"

#define BC_POP_THREADS 256

/* Half h of record r: positions [cap], then [cap][2] floats (a, s). */
static __host__ __device__ __forceinline__ uint32_t *
bc_pop_half(const kvt_backend_pop &a, uint32_t r, uint32_t h)
{
	return bc_es_half(a.state, a.cap, 2, r, h);
}

/* Step 1: row t of the new rows' u (ub [n_new][r]) into the u ring. */
__global__ void bc_pop_scatter(const kvt_backend_pop a,
                               const kvt_backend_pop_job j, uint32_t nkv,
                               const float *ub)
{
	float *u = a.u + (uint64_t)(j.record / nkv) * a.ring * a.r;
	const uint32_t first = j.n_seen - j.n_new;
	const uint64_t tot = (uint64_t)j.n_new * a.r;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < tot; e += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t t = (uint32_t)(e / a.r), c = (uint32_t)(e % a.r);
		u[(uint64_t)((first + t) % a.ring) * a.r + c] = ub[e];
	}
}

/* Step 1, rows that wrap round the staging ring: x of the new rows
 * copied contiguous, xs [n_new][d_model]. */
__global__ void bc_pop_xcopy(const kvt_backend_pop a,
                             const kvt_backend_pop_job j, float *xs)
{
	const uint32_t first = j.n_seen - j.n_new;
	const uint64_t tot = (uint64_t)j.n_new * a.d_model;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < tot; e += (uint64_t)gridDim.x * blockDim.x)
		xs[e] = bc_es_row(j.ring, a.rows,
		                  first + (uint32_t)(e / a.d_model))
			[e % a.d_model];
}

/* Step 3's band, one block of BC_POP_THREADS: the indices of the entries
 * with pos + delay >= n_seen - n_new in order (at most n_band written),
 * *bad = 1 when there are not n_band of them. */
__global__ void bc_pop_band(const kvt_backend_pop a,
                            const kvt_backend_pop_job j, uint32_t *bidx,
                            uint32_t *bad)
{
	__shared__ uint32_t cnt[BC_POP_THREADS];
	__shared__ uint32_t total;
	const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
	const uint32_t *src = bc_pop_half(a, j.record, j.cur);
	const uint32_t per = (L + blockDim.x - 1) / blockDim.x;
	const uint64_t lo64 = (uint64_t)threadIdx.x * per;
	const uint32_t lo = lo64 < L ? (uint32_t)lo64 : L,
	               hi = L - lo < per ? L : lo + per;
	uint32_t c = 0;
	for (uint32_t i = lo; i < hi; i++) {
		uint32_t p = i < j.len ? src[i] : first + (i - j.len);
		c += (uint64_t)p + a.delay >= first;
	}
	cnt[threadIdx.x] = c;
	__syncthreads();
	if (threadIdx.x == 0) {
		uint32_t s = 0;
		for (uint32_t k = 0; k < blockDim.x; k++) {
			uint32_t v = cnt[k];
			cnt[k] = s;
			s += v;
		}
		total = s;
	}
	__syncthreads();
	uint32_t o = cnt[threadIdx.x];
	for (uint32_t i = lo; i < hi && o < j.n_band; i++) {
		uint32_t p = i < j.len ? src[i] : first + (i - j.len);
		if ((uint64_t)p + a.delay >= first)
			bidx[o++] = i;
	}
	if (threadIdx.x == 0)
		*bad = total != j.n_band;
}

/* Step 2, and step 3's gather when band: the band's keys [n_band][hd],
 * the group's q [n_new][G][hd] and lse [n_new][G] of the new rows. */
template <typename T>
__global__ void bc_pop_gather(const kvt_backend_paged pg,
                              const kvt_backend_pop a,
                              const kvt_backend_pop_job j, uint32_t band,
                              uint32_t nkv, uint32_t G, uint32_t head_dim,
                              const uint32_t *bidx, float *keys, float *qg,
                              float *lg)
{
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		                                 (uint64_t)j.record *
		                                         pg.list_stride);
	const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
	const uint32_t *src = bc_pop_half(a, j.record, j.cur);
	uint32_t *dst = bc_pop_half(a, j.record, j.cur ^ 1u);
	const float *ss = (const float *)(src + a.cap);
	float *sd = (float *)(dst + a.cap);
	const uint64_t ns = (uint64_t)L * 3,
	               nk = band ? (uint64_t)j.n_band * head_dim : 0,
	               nq = band ? (uint64_t)j.n_new * G * head_dim : 0,
	               nl = band ? (uint64_t)j.n_new * G : 0;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < ns + nk + nq + nl; e += (uint64_t)gridDim.x * blockDim.x) {
		if (e < ns) {
			uint32_t i = (uint32_t)(e / 3), k = (uint32_t)(e % 3);
			if (k == 0)
				dst[i] = i < j.len ? src[i] : first + (i - j.len);
			else
				sd[(uint64_t)i * 2 + k - 1] =
					i < j.len ? ss[(uint64_t)i * 2 + k - 1] : 0.0f;
		} else if (e < ns + nk) {
			uint64_t q = e - ns;
			uint32_t b = (uint32_t)(q / head_dim),
			         d = (uint32_t)(q % head_dim);
			const T *row = (const T *)bc_entry_row(pg, r, bidx[b]);
			keys[q] = row ? common_to_f(row[d]) : nanf("");
		} else if (e < ns + nk + nq) {
			uint64_t q = e - ns - nk;
			uint32_t t = (uint32_t)(q / ((uint64_t)G * head_dim));
			uint32_t rest = (uint32_t)(q % ((uint64_t)G * head_dim));
			qg[q] = bc_es_row(j.ring, a.rows, first + t)
				[a.rows.q_off + (uint64_t)(j.record % nkv) * G *
				                        head_dim + rest];
		} else {
			uint64_t q = e - ns - nk - nq;
			uint32_t t = (uint32_t)(q / G), h = (uint32_t)(q % G);
			lg[q] = bc_es_row(j.ring, a.rows, first + t)
				[a.rows.lse_off + (j.record % nkv) * G + h];
		}
	}
}

/* Step 3's accumulation: one thread per band entry e (unless *bad). */
__global__ void bc_pop_accum(const kvt_backend_pop a,
                             const kvt_backend_pop_job j, uint32_t G,
                             const uint32_t *bidx, const float *logit,
                             const float *lg, const uint32_t *bad)
{
	if (*bad)
		return;
	const uint32_t first = j.n_seen - j.n_new, nb = j.n_band;
	uint32_t *pos = bc_pop_half(a, j.record, j.cur ^ 1u);
	float *S = (float *)(pos + a.cap);
	for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < nb;
	     e += gridDim.x * blockDim.x) {
		const uint32_t i = bidx[e], kp = pos[i];
		float acc = S[(uint64_t)i * 2];
		for (uint32_t t = 0; t < j.n_new; t++) {
			const uint32_t qp = first + t;
			if (qp <= kp || qp - kp > a.delay)
				continue;
			float v = 0.0f;
			for (uint32_t h = 0; h < G; h++) {
				const uint32_t row = t * G + h;
				v += expf(logit[(uint64_t)row * nb + e] - lg[row]);
			}
			acc += v / (float)G;
		}
		S[(uint64_t)i * 2] = acc;
	}
}

/* Steps 4 and 5: the score of the entries whose delay ends in the sync
 * (kvpop_score), then (due) score sc and protection prot of every entry;
 * a job whose band was not n_band (*bad) protects everything instead.
 * wl: the layer's W1 (W1 [m][r + 1], b1 [m], W2 [nkv][m], b2 [nkv]). */
__global__ void bc_pop_score(const kvt_backend_pop a,
                             const kvt_backend_pop_job j, uint32_t nkv,
                             const float *wl, const uint32_t *bad, float *sc,
                             uint8_t *prot)
{
	const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
	const uint32_t r = a.r, m = a.m;
	const float inv_sqrt2 = 0.70710678118654752440f;
	const float *W1 = wl, *b1 = W1 + (uint64_t)m * (r + 1), *W2 = b1 + m,
	            *b2 = W2 + (uint64_t)nkv * m,
	            *w2 = W2 + (uint64_t)(j.record % nkv) * m;
	const float *ur = a.u + (uint64_t)(j.record / nkv) * a.ring * r;
	const uint32_t fail = *bad;
	uint32_t *pos = bc_pop_half(a, j.record, j.cur ^ 1u);
	float *S = (float *)(pos + a.cap);
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
	     i += gridDim.x * blockDim.x) {
		const uint32_t p = pos[i];
		const uint64_t pd = (uint64_t)p + a.delay;
		float *e = S + (uint64_t)i * 2;
		if (fail) {
			if (j.due) {
				sc[i] = 0.0f;
				prot[i] = 1;
			}
			continue;
		}
		if (pd >= first && pd < j.n_seen) {
			const float *u = ur + (uint64_t)(p % a.ring) * r;
			const float f = logf(e[0] + 1e-6f);
			float s = b2[j.record % nkv];
			for (uint32_t o = 0; o < m; o++) {
				const float *w = W1 + (uint64_t)o * (r + 1);
				float z = b1[o];
				for (uint32_t c = 0; c < r; c++)
					z += w[c] * u[c];
				z += w[r] * f;
				const float hid =
					0.5f * z * (1.0f + erff(z * inv_sqrt2));
				s += w2[o] * hid;
			}
			e[1] = s;
		}
		if (j.due) {
			sc[i] = e[1];
			prot[i] = pd >= j.n_seen || p < a.sinks;
		}
	}
}

/* Step 3's failure: out[n + j] = UINT32_MAX when the band was not n_band
 * (after the compaction, which then had no drops to apply). */
__global__ void bc_pop_fail(const uint32_t *bad, uint32_t *count)
{
	if (threadIdx.x == 0 && blockIdx.x == 0 && *bad)
		*count = 0xffffffffu;
}

static int bc_pop_check_args(uint32_t n_records, uint32_t n_heads,
                             uint32_t nkv, uint32_t hd,
                             const struct kvt_backend_pop *a,
                             const struct kvt_backend_pop_job *jobs,
                             uint32_t n, uint32_t out_words)
{
	if (!bc_es_layout_ok(n_heads, nkv, hd, a->state, a->rows) || !a->u ||
	    !a->weights || !a->r || !a->m || !a->ring ||
	    a->d_model > a->rows.row_floats) {
		bc_note("pop_select: %u query heads on %u KV heads, head_dim "
		        "%u, r %u, m %u, ring %u, d_model %u, rows of %u "
		        "floats, or no state, u or weights", n_heads, nkv, hd,
		        a->r, a->m, a->ring, a->d_model, a->rows.row_floats);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct kvt_backend_pop_job *j = &jobs[k];
		const uint64_t L = (uint64_t)j->len + j->n_new;
		if (!j->ring || j->record >= n_records ||
		    j->cur > 1 || L > a->cap || j->n_band > L ||
		    j->n_new > j->n_seen || j->n_new > a->rows.stage_tokens ||
		    j->n_new > a->ring || j->n_drop > L ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("pop_select: job %u: record %u of %u, "
			        "%u + %u entries of %u, band %u, seen %u, drops "
			        "%u + %u of %u words", k, j->record, n_records,
			        j->len, j->n_new, a->cap, j->n_band,
			        j->n_seen, j->drop_off, j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* Whether job j's new rows wrap round the staging ring's end. */
static inline int bc_pop_wraps(const struct kvt_backend_pop *a,
                               const struct kvt_backend_pop_job *j)
{
	return (uint64_t)(j->n_seen - j->n_new) % a->rows.stage_tokens +
	               j->n_new >
	       a->rows.stage_tokens;
}

static inline uint32_t bc_pop_blocks(uint64_t tot)
{
	uint64_t b = (tot + BC_POP_THREADS - 1) / BC_POP_THREADS;
	return b > 4096 ? 4096 : b ? (uint32_t)b : 1;
}

/* Step 1's u: one SGEMM into ub (zeroed) as scorer_linear_cpu (beta 1 on
 * zeros), x in the ring or (wrapping rows) copied to xs; then the scatter
 * into the u ring. */
static int bc_pop_project(cublasHandle_t h, const kvt_backend_pop &A,
                          const kvt_backend_pop_job &J, uint32_t nkv,
                          const float *P, float *ub, float *xs,
                          cudaStream_t s)
{
	int rv;
	BC_CALL(cudaMemsetAsync(ub, 0, (size_t)J.n_new * A.r * 4, s),
	        "pop_select");
	if (A.d_model) {
		const float one = 1.0f;
		const float *x = J.ring + (uint64_t)((J.n_seen - J.n_new) %
		                                     A.rows.stage_tokens) *
		                                  A.rows.row_floats;
		uint32_t ldx = A.rows.row_floats;
		if (bc_pop_wraps(&A, &J)) {
			KVT_LAUNCH(bc_pop_xcopy,
			           bc_pop_blocks((uint64_t)J.n_new * A.d_model),
			           BC_POP_THREADS, 0, s, A, J, xs);
			BC_CALL(cudaGetLastError(), "pop_select x");
			x = xs;
			ldx = A.d_model;
		}
		/* ub [n_new][r] = x P^T: column-major P^T (r x d) x^T (d x n) */
		common_count_launch();
		if ((rv = blas_err(cublasSgemm(
			     h, CUBLAS_OP_T, CUBLAS_OP_N, (int)A.r, (int)J.n_new,
			     (int)A.d_model, &one, P, (int)A.d_model, x, (int)ldx,
			     &one, ub, (int)A.r)))) {
			bc_note("pop_select: cublasSgemm (u) failed");
			return rv;
		}
	}
	KVT_LAUNCH(bc_pop_scatter, bc_pop_blocks((uint64_t)J.n_new * A.r),
	           BC_POP_THREADS, 0, s, A, J, nkv, ub);
	BC_CALL(cudaGetLastError(), "pop_select scatter");
	return 0;
}

static int bc_pop_select_locked(struct bc_ctx *c,
                                const struct kvt_backend_paged *pg,
                                enum kvt_dtype dt, uint32_t n_heads,
                                uint32_t nkv, uint32_t hd,
                                const struct kvt_backend_pop *a,
                                const struct kvt_backend_pop_job *jobs,
                                uint32_t n, uint32_t *out, uint32_t out_words,
                                cudaStream_t s)
{
	const uint32_t G = n_heads / nkv;
	uint64_t maxL = 1, maxN = 1, maxB = 1, maxW = 0;
	for (uint32_t k = 0; k < n; k++) {
		const struct kvt_backend_pop_job *j = &jobs[k];
		uint64_t L = (uint64_t)j->len + j->n_new;
		maxL = L > maxL ? L : maxL;
		maxN = j->n_new > maxN ? j->n_new : maxN;
		if (j->n_new && a->delay && j->n_band > maxB)
			maxB = j->n_band;
		if (j->proj && bc_pop_wraps(a, j) && j->n_new > maxW)
			maxW = j->n_new;
	}
	const size_t o_out = 0,
	             o_bad = o_out + bc_ps_al((size_t)out_words * 4),
	             o_ub = o_bad + bc_ps_al((size_t)n * 4),
	             o_xs = o_ub + bc_ps_al(maxN * a->r * 4),
	             o_bidx = o_xs + bc_ps_al(maxW * a->d_model * 4),
	             o_keys = o_bidx + bc_ps_al(maxB * 4),
	             o_qg = o_keys + bc_ps_al(maxB * hd * 4),
	             o_lg = o_qg + bc_ps_al(maxN * G * hd * 4),
	             o_logit = o_lg + bc_ps_al(maxN * G * 4),
	             o_s = o_logit + bc_ps_al(maxN * G * maxB * 4),
	             o_prot = o_s + bc_ps_al(maxL * 4),
	             o_drop = o_prot + bc_ps_al(maxL),
	             need = o_drop + bc_ps_al(maxL);
	int rv = bc_win_prepare(c, need);
	if (rv)
		return rv;
	cublasHandle_t h = (cublasHandle_t)c->win_blas;
	char *d = c->d_win;
	uint32_t *dout = (uint32_t *)(d + o_out), *bad = (uint32_t *)(d + o_bad),
	         *bidx = (uint32_t *)(d + o_bidx);
	float *ub = (float *)(d + o_ub), *xs = (float *)(d + o_xs),
	      *keys = (float *)(d + o_keys),
	      *qg = (float *)(d + o_qg), *lg = (float *)(d + o_lg),
	      *logit = (float *)(d + o_logit), *sc = (float *)(d + o_s);
	uint8_t *prot = (uint8_t *)(d + o_prot), *drop = (uint8_t *)(d + o_drop);
	/* the jobs reach the device as launch arguments: counted as the
	 * descriptors they are */
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "pop_select");
	BC_CALL(cudaMemsetAsync(bad, 0, (size_t)n * 4, s), "pop_select");
	if ((rv = blas_err(cublasSetStream(h, s))))
		return rv;
	const float scale = 1.0f / sqrtf((float)hd);
	const uint64_t lf = kvt_pop_layer_floats(a->r, a->m, a->d_model, nkv);
	const kvt_backend_paged p = *pg;
	const kvt_backend_pop A = *a;
	for (uint32_t k = 0; k < n; k++) {
		const kvt_backend_pop_job J = jobs[k];
		const uint32_t L = J.len + J.n_new;
		const float *P = A.weights + (uint64_t)J.layer * lf;
		if (J.proj && J.n_new) {
			KVT_LAUNCH(bc_es_check, 1, BC_POP_THREADS, 0, s, J.ring,
			           A.rows, J.n_seen - J.n_new, J.n_new,
			           A.d_model, n_heads, hd, dout + k);
			BC_CALL(cudaGetLastError(), "pop_select check");
			if ((rv = bc_pop_project(h, A, J, nkv, P, ub, xs, s)))
				return rv;
		}
		if (!L)
			continue;
		const uint32_t band = J.n_new && A.delay;
		if (band) {
			KVT_LAUNCH(bc_pop_band, 1, BC_POP_THREADS, 0, s, A, J, bidx,
			           bad + k);
			BC_CALL(cudaGetLastError(), "pop_select band");
		}
		uint64_t tot = (uint64_t)L * 3 +
		               (band ? (uint64_t)J.n_band * hd +
		                               (uint64_t)J.n_new * G * (hd + 1)
		                     : 0);
		const uint32_t blocks = bc_pop_blocks(tot);
		if (dt == KVT_DTYPE_F16)
			KVT_LAUNCH(bc_pop_gather<f16_t>, blocks, BC_POP_THREADS, 0,
			           s, p, A, J, band, nkv, G, hd, bidx, keys, qg,
			           lg);
		else if (dt == KVT_DTYPE_BF16)
			KVT_LAUNCH(bc_pop_gather<bf16_t>, blocks, BC_POP_THREADS,
			           0, s, p, A, J, band, nkv, G, hd, bidx, keys, qg,
			           lg);
		else
			KVT_LAUNCH(bc_pop_gather<float>, blocks, BC_POP_THREADS, 0,
			           s, p, A, J, band, nkv, G, hd, bidx, keys, qg,
			           lg);
		BC_CALL(cudaGetLastError(), "pop_select gather");
		if (band && J.n_band) {
			/* logit [n_new G][n_band], as attn_band_cpu */
			if ((rv = bc_band_logits("pop_select logits", keys, qg,
			                         J.n_new * G, J.n_band, hd,
			                         scale, logit, s)))
				return rv;
			KVT_LAUNCH(bc_pop_accum, bc_pop_blocks(J.n_band),
			           BC_POP_THREADS, 0, s, A, J, G, bidx, logit, lg,
			           bad + k);
			BC_CALL(cudaGetLastError(), "pop_select accumulate");
		}
		if (J.n_new || J.due) {
			KVT_LAUNCH(bc_pop_score, bc_pop_blocks(L),
			           BC_POP_THREADS, 0, s, A, J, nkv,
			           P + (uint64_t)A.r * A.d_model, bad + k, sc, prot);
			BC_CALL(cudaGetLastError(), "pop_select score");
		}
		uint32_t *cnt = dout + n + k;
		if (J.due) {
			if ((rv = bc_es_select("pop_select", A.state, A.cap, 2,
			                       J.record, J.cur ^ 1u, sc, prot,
			                       drop, L, J.keep,
			                       dout + 2 * n + J.drop_off, J.n_drop,
			                       cnt, s)))
				return rv;
		}
		if (band) {
			KVT_LAUNCH(bc_pop_fail, 1, 32, 0, s, bad + k, cnt);
			BC_CALL(cudaGetLastError(), "pop_select band check");
		}
	}
	return bc_ps_finish(c, out, dout, out_words, s, "pop_select");
}

int bc_pop_select(void *ctx, const struct kvt_backend_paged *pg,
                  uint32_t n_records, enum kvt_dtype dtype, uint32_t n_heads,
                  uint32_t n_kv_heads, uint32_t head_dim,
                  const struct kvt_backend_pop *a,
                  const struct kvt_backend_pop_job *jobs, uint32_t n,
                  uint32_t *out, uint32_t out_words, void *stream)
{
	return bc_es_entry(
		ctx, "pop_select", pg, a, jobs, n, dtype, out, out_words,
		[&] {
			return bc_pop_check_args(n_records, n_heads, n_kv_heads,
			          head_dim, a, jobs, n, out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_pop_select_locked(
				c, pg, dtype, n_heads, n_kv_heads, head_dim, a,
				jobs, n, out, out_words, (cudaStream_t)stream);
		});
}
