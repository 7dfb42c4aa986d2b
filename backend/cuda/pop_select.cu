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
#include "batch_select.cuh"
#include "entry_state.cuh"

/* Half h of record r: positions [cap], then [cap][2] floats (a, s). */
static __host__ __device__ __forceinline__ uint32_t *
bc_pop_half(const kvt_backend_pop &a, uint32_t r, uint32_t h)
{
	return bc_es_half(a.state, a.cap, 2, r, h);
}

/* One projection: the new rows [first, first + n) of a (sequence,
 * layer)'s staging ring, at rows row0.. of the flat xs and ub, whose u
 * ring is record ur. */
struct bc_pop_prj {
	const float *ring;
	uint32_t first, n, ur, row0;
};

/* Step 1a, every projection at once: x of the new rows copied contiguous
 * into xs [rows][d_model] (rows may wrap round the staging ring). */
__global__ void bc_pop_xcopy(const kvt_backend_pop a,
                             const struct bc_pop_prj *prj, uint32_t np,
                             float *xs)
{
	for (uint32_t k = blockIdx.y; k < np; k += gridDim.y) {
		const struct bc_pop_prj q = prj[k];
		const uint64_t tot = (uint64_t)q.n * a.d_model;
		for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		     e < tot; e += (uint64_t)gridDim.x * blockDim.x)
			xs[(uint64_t)q.row0 * a.d_model + e] =
				bc_es_row(q.ring, a.rows,
				          q.first + (uint32_t)(e / a.d_model))
					[e % a.d_model];
	}
}

/* Step 1c, every projection at once: rows of ub [rows][r] into their u
 * rings. */
__global__ void bc_pop_scatter(const kvt_backend_pop a,
                               const struct bc_pop_prj *prj, uint32_t np,
                               const float *ub)
{
	for (uint32_t k = blockIdx.y; k < np; k += gridDim.y) {
		const struct bc_pop_prj q = prj[k];
		float *u = a.u + (uint64_t)q.ur * a.ring * a.r;
		const uint64_t tot = (uint64_t)q.n * a.r;
		for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		     e < tot; e += (uint64_t)gridDim.x * blockDim.x) {
			uint32_t t = (uint32_t)(e / a.r), c = (uint32_t)(e % a.r);
			u[(uint64_t)((q.first + t) % a.ring) * a.r + c] =
				ub[(uint64_t)q.row0 * a.r + e];
		}
	}
}

/* Step 2, every job at once, grid (entries, jobs): the state carried
 * from half cur to the other, the new entries with a = s = 0. */
__global__ void bc_pop_carry(const kvt_backend_pop a,
                             const kvt_backend_pop_job *jobs, uint32_t n)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const kvt_backend_pop_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
		const uint32_t *src = bc_pop_half(a, j.record, j.cur);
		uint32_t *dst = bc_pop_half(a, j.record, j.cur ^ 1u);
		const float *ss = (const float *)(src + a.cap);
		float *sd = (float *)(dst + a.cap);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			const int old = i < j.len;
			dst[i] = old ? src[i] : first + (i - j.len);
			sd[(uint64_t)i * 2] = old ? ss[(uint64_t)i * 2] : 0.0f;
			sd[(uint64_t)i * 2 + 1] = old ? ss[(uint64_t)i * 2 + 1] : 0.0f;
		}
	}
}

/* Step 3's band, one block of BC_BS_THREADS per job (those without a
 * band, boff[k] UINT32_MAX, leave): the indices of the entries with pos +
 * delay >= n_seen - n_new in order (at most n_band written, at bidx +
 * boff[k]), bad[k] = 1 when there are not n_band of them. */
__global__ void bc_pop_band(const kvt_backend_pop a,
                            const kvt_backend_pop_job *jobs,
                            const uint32_t *boff, uint32_t *bidx,
                            uint32_t *bad)
{
	__shared__ uint32_t cnt[BC_BS_THREADS];
	__shared__ uint32_t total;
	const uint32_t bo = boff[blockIdx.x];
	if (bo == UINT32_MAX)
		return;
	const kvt_backend_pop_job j = jobs[blockIdx.x];
	const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new;
	const uint32_t *pos = bc_pop_half(a, j.record, j.cur ^ 1u);
	const uint32_t per = (L + blockDim.x - 1) / blockDim.x;
	const uint64_t lo64 = (uint64_t)threadIdx.x * per;
	const uint32_t lo = lo64 < L ? (uint32_t)lo64 : L,
	               hi = L - lo < per ? L : lo + per;
	uint32_t c = 0;
	for (uint32_t i = lo; i < hi; i++)
		c += (uint64_t)pos[i] + a.delay >= first;
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
	uint32_t *out = bidx + bo;
	for (uint32_t i = lo; i < hi && o < j.n_band; i++)
		if ((uint64_t)pos[i] + a.delay >= first)
			out[o++] = i;
	if (threadIdx.x == 0)
		bad[blockIdx.x] = total != j.n_band;
}

/* Step 3's accumulation, grid (band entries, jobs), one thread per band
 * entry of every job with a band (unless bad): per query t in order
 * within the delay,
 * a += (sum over the G query heads in order of exp(logit - lse)) / G,
 * the logits in attn_band_cpu's order. */
template <typename T>
__global__ void bc_pop_accum(const kvt_backend_paged pg,
                             const kvt_backend_pop a,
                             const kvt_backend_pop_job *jobs, uint32_t n,
                             const uint32_t *boff, uint32_t nkv, uint32_t G,
                             uint32_t hd, float scale, const uint32_t *bidx,
                             const uint32_t *bad)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const uint32_t bo = boff[k];
		if (bo == UINT32_MAX || bad[k])
			continue;
		const kvt_backend_pop_job j = jobs[k];
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)((const char *)pg.records +
			                                 (uint64_t)j.record *
			                                         pg.list_stride);
		const uint32_t first = j.n_seen - j.n_new, g = j.record % nkv;
		uint32_t *pos = bc_pop_half(a, j.record, j.cur ^ 1u);
		float *S = (float *)(pos + a.cap);
		for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
		     e < j.n_band; e += gridDim.x * blockDim.x) {
			const uint32_t i = bidx[bo + e], kp = pos[i];
			const T *key = (const T *)bc_entry_row(pg, r, i);
			float acc = S[(uint64_t)i * 2];
			for (uint32_t t = 0; t < j.n_new; t++) {
				const uint32_t qp = first + t;
				if (qp <= kp || qp - kp > a.delay)
					continue;
				const float *row = bc_es_row(j.ring, a.rows, qp);
				float v = 0.0f;
				for (uint32_t h = 0; h < G; h++) {
					const uint32_t qh = g * G + h;
					v += expf(bc_band_logit(row + a.rows.q_off +
					                                (uint64_t)qh * hd,
					                        key, hd, scale) -
					          row[a.rows.lse_off + qh]);
				}
				acc += v / (float)G;
			}
			S[(uint64_t)i * 2] = acc;
		}
	}
}

/* Steps 4 and 5, grid (entries, jobs): the score of the entries whose
 * delay ends in the sync (kvpop_score), then (due: seg[k] the job's place
 * in the flat arrays) score, rank and protection of every entry; a job
 * whose band was not n_band (bad) protects everything instead.  The
 * layer's W1 follows its P in a.weights (lf floats a layer) (W1 [m][r + 1], b1 [m], W2
 * [nkv][m], b2 [nkv]). */
__global__ void bc_pop_score(const kvt_backend_pop a,
                             const kvt_backend_pop_job *jobs,
                             const uint32_t *seg, uint32_t n, uint32_t nkv,
                             uint64_t lf, const uint32_t *bad, float *sc,
                             uint32_t *rank, uint8_t *prot)
{
	const uint32_t r = a.r, m = a.m;
	const float inv_sqrt2 = 0.70710678118654752440f;
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const kvt_backend_pop_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new,
		               at = seg[k], fail = bad[k];
		if (!j.n_new && at == UINT32_MAX)
			continue;
		const float *W1 = a.weights + (uint64_t)j.layer * lf +
		                  (uint64_t)r * a.d_model,
		            *b1 = W1 + (uint64_t)m * (r + 1), *W2 = b1 + m,
		            *b2 = W2 + (uint64_t)nkv * m,
		            *w2 = W2 + (uint64_t)(j.record % nkv) * m;
		const float *ur = a.u + (uint64_t)(j.record / nkv) * a.ring * r;
		uint32_t *pos = bc_pop_half(a, j.record, j.cur ^ 1u);
		float *S = (float *)(pos + a.cap);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < L;
		     i += gridDim.x * blockDim.x) {
			const uint32_t p = pos[i];
			const uint64_t pd = (uint64_t)p + a.delay;
			float *e = S + (uint64_t)i * 2;
			if (fail) {
				if (at != UINT32_MAX) {
					sc[at + i] = 0.0f;
					rank[at + i] = p;
					prot[at + i] = 1;
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
			if (at != UINT32_MAX) {
				sc[at + i] = e[1];
				rank[at + i] = p;
				prot[at + i] = pd >= j.n_seen || p < a.sinks;
			}
		}
	}
}

/* Step 6: out[n + job] = UINT32_MAX for every job whose band was not
 * n_band (after the compaction, which then had no drops to apply). */
__global__ void bc_pop_fail(const uint32_t *bad, uint32_t n, uint32_t *count)
{
	for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < n;
	     k += gridDim.x * blockDim.x)
		if (bad[k])
			count[k] = 0xffffffffu;
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

/* What one call uploads beside the jobs, packed (the projections are
 * per (sequence, layer): a KV head's share of them is small): the row
 * checks, the projections and their grouped GEMM's pointer arrays (W, x,
 * y: filled once the scratch is placed). */
struct bc_pop_plan {
	struct bc_pack pk;
	size_t o_chk, o_prj, o_W, o_X, o_Y;
	uint32_t nprj, rows, maxN, maxB, has_band;
	uint64_t band;
	struct bc_bs_count cn;
};

static int bc_pop_reserve(struct bc_pop_plan *pl, const kvt_backend_pop *a,
                          const struct kvt_backend_pop_job *jobs, uint32_t n)
{
	int rv = bc_bs_count_jobs(jobs, n, &pl->cn);
	if (rv)
		return rv;
	uint64_t rows = 0;
	for (uint32_t k = 0; k < n; k++) {
		const struct kvt_backend_pop_job *j = &jobs[k];
		if (j->proj && j->n_new) {
			pl->nprj++;
			rows += j->n_new;
			pl->maxN = j->n_new > pl->maxN ? j->n_new : pl->maxN;
		}
		if (j->n_new && a->delay) {
			pl->has_band = 1;
			pl->band += j->n_band;
			pl->maxB = j->n_band > pl->maxB ? j->n_band : pl->maxB;
		}
	}
	if (rows > UINT32_MAX || pl->band > UINT32_MAX)
		return KVT_EINVAL;
	pl->rows = (uint32_t)rows;
	struct bc_pack *pk = &pl->pk;
	const size_t ptr = sizeof(void *);
	if (!bc_pack_add(pk, (size_t)pl->nprj * sizeof(struct bc_chk),
	                 &pl->o_chk) ||
	    !bc_pack_add(pk, (size_t)pl->nprj * sizeof(struct bc_pop_prj),
	                 &pl->o_prj) ||
	    !bc_pack_add(pk, (size_t)pl->nprj * ptr, &pl->o_W) ||
	    !bc_pack_add(pk, (size_t)pl->nprj * ptr, &pl->o_X) ||
	    !bc_pack_add(pk, (size_t)pl->nprj * ptr, &pl->o_Y))
		return KVT_ENOMEM;
	return 0;
}

/* Scratch offsets of one call. */
struct bc_pop_mem {
	struct bc_bs_mem bs; /* output words, jobs, plan, flat arrays */
	size_t o_pack, o_bad, o_boff, o_ub, o_xs, o_bidx, need;
};

static struct bc_pop_mem bc_pop_layout(const struct bc_pop_plan *pl,
                                       const kvt_backend_pop *a, uint32_t n,
                                       uint32_t out_words)
{
	struct bc_pop_mem m;
	m.bs = bc_bs_layout(&pl->cn, n, sizeof(struct kvt_backend_pop_job),
	                    out_words);
	m.o_pack = m.bs.need;
	m.o_bad = m.o_pack + bc_pack_bytes(&pl->pk);
	m.o_boff = m.o_bad + bc_ps_al((size_t)n * 4);
	m.o_ub = m.o_boff + bc_ps_al((size_t)n * 4);
	m.o_xs = m.o_ub + bc_ps_al((size_t)pl->rows * a->r * 4);
	m.o_bidx = m.o_xs + bc_ps_al((size_t)pl->rows * a->d_model * 4);
	m.need = m.o_bidx + bc_ps_al((size_t)pl->band * 4);
	return m;
}

/* The checks, the projections and the grouped GEMM's problems, once the
 * scratch is placed: W the job's layer's P, x and y its rows of xs and ub
 * (no problem when d_model is 0: u is then 0). */
static int bc_pop_fill(struct bc_pop_plan *pl, const kvt_backend_pop *a,
                       const struct kvt_backend_pop_job *jobs, uint32_t n,
                       uint32_t nkv, const float *xs, float *ub,
                       struct blas_grouped *g)
{
	char *h = pl->pk.h;
	struct bc_chk *chk = (struct bc_chk *)(h + pl->o_chk);
	struct bc_pop_prj *prj = (struct bc_pop_prj *)(h + pl->o_prj);
	const float **W = (const float **)(h + pl->o_W),
	            **X = (const float **)(h + pl->o_X);
	float **Y = (float **)(h + pl->o_Y);
	const uint64_t lf = kvt_pop_layer_floats(a->r, a->m, a->d_model, nkv);
	int rv = blas_grouped_reset(g, pl->nprj);
	uint32_t q = 0, row = 0;
	for (uint32_t k = 0; !rv && k < n; k++) {
		const struct kvt_backend_pop_job *j = &jobs[k];
		if (!j->proj || !j->n_new)
			continue;
		const uint32_t f = j->n_seen - j->n_new;
		chk[q] = (struct bc_chk){j->ring, f, j->n_new, k, 0};
		prj[q] = (struct bc_pop_prj){j->ring, f, j->n_new,
		                             j->record / nkv, row};
		W[q] = a->weights + (uint64_t)j->layer * lf;
		X[q] = xs + (uint64_t)row * a->d_model;
		Y[q] = ub + (uint64_t)row * a->r;
		q++;
		row += j->n_new;
		if (a->d_model)
			rv = blas_grouped_add(g, j->n_new, a->d_model, a->r, 1.0f);
	}
	return rv;
}

/* Step 1: every projection's u = P x (the rows copied contiguous, one
 * grouped GEMM: each problem scorer_linear_cpu's call on zeros, beta 1),
 * then into the u rings. */
static int bc_pop_project(struct bc_ctx *c, const kvt_backend_pop &A,
                          const struct bc_pop_plan *pl, const char *dp,
                          const struct blas_grouped *g, float *xs, float *ub,
                          cudaStream_t s)
{
	if (!pl->nprj)
		return 0;
	const struct bc_pop_prj *prj = (const struct bc_pop_prj *)(dp + pl->o_prj);
	BC_CALL(cudaMemsetAsync(ub, 0, (size_t)pl->rows * A.r * 4, s),
	        "pop_select");
	if (A.d_model) {
		const dim3 gx(bc_bs_blocks((uint64_t)pl->maxN * A.d_model),
		              bc_bs_rows(pl->nprj));
		KVT_LAUNCH(bc_pop_xcopy, gx, BC_BS_THREADS, 0, s, A, prj, pl->nprj,
		           xs);
		BC_CALL(cudaGetLastError(), "pop_select x");
		int rv = blas_grouped_run((cublasHandle_t)c->win_blas, g,
		                          (const float *const *)(dp + pl->o_W),
		                          (const float *const *)(dp + pl->o_X),
		                          (float *const *)(dp + pl->o_Y), s);
		if (rv) {
			bc_note("pop_select: the projections' grouped GEMM failed");
			return rv;
		}
	}
	const dim3 gu(bc_bs_blocks((uint64_t)pl->maxN * A.r),
	              bc_bs_rows(pl->nprj));
	KVT_LAUNCH(bc_pop_scatter, gu, BC_BS_THREADS, 0, s, A, prj, pl->nprj,
	           ub);
	BC_CALL(cudaGetLastError(), "pop_select scatter");
	return 0;
}

/* Steps 2 to 6 for every job: the plan, the carry, the bands and their
 * accumulation, the scores, the due lists' selection, the failed bands. */
static int bc_pop_decide(const kvt_backend_paged &p, enum kvt_dtype dt,
                         const kvt_backend_pop &A,
                         const struct bc_pop_plan *pl,
                         const struct bc_pop_mem &m, char *d, uint32_t n,
                         uint32_t nkv, uint32_t G, uint32_t hd,
                         cudaStream_t s)
{
	const kvt_backend_pop_job *jobs =
		(const kvt_backend_pop_job *)(d + m.bs.o_jobs);
	uint32_t *dout = (uint32_t *)d, *bad = (uint32_t *)(d + m.o_bad),
	         *boff = (uint32_t *)(d + m.o_boff),
	         *bidx = (uint32_t *)(d + m.o_bidx),
	         *at = (uint32_t *)(d + m.bs.o_at),
	         *rank = (uint32_t *)(d + m.bs.o_rank);
	float *sc = (float *)(d + m.bs.o_sc);
	uint8_t *prot = (uint8_t *)(d + m.bs.o_prot),
	        *drop = (uint8_t *)(d + m.bs.o_drop);
	KVT_LAUNCH(bc_bs_plan<kvt_backend_pop_job>, 1, BC_BS_THREADS, 0, s, jobs,
	           n, A.delay, at, boff, (uint32_t *)(d + m.bs.o_first),
	           (uint32_t *)(d + m.bs.o_keep),
	           (struct bc_seg *)(d + m.bs.o_segs));
	BC_CALL(cudaGetLastError(), "pop_select plan");
	const dim3 ge(bc_bs_blocks(pl->cn.maxL), bc_bs_rows(n));
	KVT_LAUNCH(bc_pop_carry, ge, BC_BS_THREADS, 0, s, A, jobs, n);
	BC_CALL(cudaGetLastError(), "pop_select carry");
	if (pl->has_band) {
		KVT_LAUNCH(bc_pop_band, n, BC_BS_THREADS, 0, s, A, jobs, boff, bidx,
		           bad);
		BC_CALL(cudaGetLastError(), "pop_select band");
		const float scale = 1.0f / sqrtf((float)hd);
		const dim3 gb(bc_bs_blocks(pl->maxB), bc_bs_rows(n));
		if (dt == KVT_DTYPE_F16)
			KVT_LAUNCH(bc_pop_accum<f16_t>, gb, BC_BS_THREADS, 0, s, p, A,
			           jobs, n, boff, nkv, G, hd, scale, bidx, bad);
		else if (dt == KVT_DTYPE_BF16)
			KVT_LAUNCH(bc_pop_accum<bf16_t>, gb, BC_BS_THREADS, 0, s, p, A,
			           jobs, n, boff, nkv, G, hd, scale, bidx, bad);
		else
			KVT_LAUNCH(bc_pop_accum<float>, gb, BC_BS_THREADS, 0, s, p, A,
			           jobs, n, boff, nkv, G, hd, scale, bidx, bad);
		BC_CALL(cudaGetLastError(), "pop_select accumulate");
	}
	const uint64_t lf = kvt_pop_layer_floats(A.r, A.m, A.d_model, nkv);
	KVT_LAUNCH(bc_pop_score, ge, BC_BS_THREADS, 0, s, A, jobs, at, n, nkv,
	           lf, bad, sc, rank, prot);
	BC_CALL(cudaGetLastError(), "pop_select score");
	int rv = bc_bs_select("pop_select", A.state, A.cap, 2, sc, rank, prot,
	                      drop, (const uint32_t *)(d + m.bs.o_first),
	                      (const uint32_t *)(d + m.bs.o_keep),
	                      (const struct bc_seg *)(d + m.bs.o_segs),
	                      pl->cn.nseg, pl->cn.max_drop, dout, s);
	if (rv || !pl->has_band)
		return rv;
	KVT_LAUNCH(bc_pop_fail, bc_bs_blocks(n), BC_BS_THREADS, 0, s, bad, n,
	           dout + n);
	BC_CALL(cudaGetLastError(), "pop_select band check");
	return 0;
}

static int bc_pop_run(struct bc_ctx *c, const struct kvt_backend_paged *pg,
                      enum kvt_dtype dt, uint32_t n_heads, uint32_t nkv,
                      uint32_t hd, const struct kvt_backend_pop *a,
                      struct bc_pop_plan *pl,
                      const struct kvt_backend_pop_job *jobs, uint32_t n,
                      uint32_t *out, uint32_t out_words, cudaStream_t s)
{
	const struct bc_pop_mem m = bc_pop_layout(pl, a, n, out_words);
	int rv = bc_win_prepare(c, m.need);
	if (rv)
		return rv;
	char *d = c->d_win, *dp = d + m.o_pack;
	uint32_t *dout = (uint32_t *)d;
	float *ub = (float *)(d + m.o_ub), *xs = (float *)(d + m.o_xs);
	struct blas_grouped g;
	memset(&g, 0, sizeof(g));
	rv = bc_pop_fill(pl, a, jobs, n, nkv, xs, ub, &g);
	if (!rv)
		rv = bc_cuda(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
		             "pop_select");
	if (!rv)
		rv = bc_cuda(cudaMemsetAsync(d + m.o_bad, 0, (size_t)n * 4, s),
		             "pop_select");
	if (!rv)
		rv = bc_cuda(cudaMemcpyAsync(d + m.bs.o_jobs, jobs,
		                             (size_t)n * sizeof(*jobs),
		                             cudaMemcpyHostToDevice, s),
		             "pop_select");
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	if (!rv)
		rv = bc_pack_send(c, &pl->pk, dp, s, "pop_select");
	if (!rv)
		rv = bc_bs_checks("pop_select check",
		                  (const struct bc_chk *)(dp + pl->o_chk), pl->nprj,
		                  a->rows, a->d_model, n_heads, hd, dout, s);
	if (!rv)
		rv = bc_pop_project(c, *a, pl, dp, &g, xs, ub, s);
	if (!rv)
		rv = bc_pop_decide(*pg, dt, *a, pl, m, d, n, nkv, n_heads / nkv, hd,
		                   s);
	blas_grouped_free(&g);
	if (rv)
		return rv;
	return bc_ps_finish(c, out, dout, out_words, s, "pop_select");
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
	struct bc_pop_plan pl;
	memset(&pl, 0, sizeof(pl));
	int rv = bc_pop_reserve(&pl, a, jobs, n);
	if (!rv)
		rv = bc_pop_run(c, pg, dt, n_heads, nkv, hd, a, &pl, jobs, n, out,
		                out_words, s);
	bc_pack_free(&pl.pk);
	return rv;
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
