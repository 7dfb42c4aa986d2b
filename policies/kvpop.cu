/*
 * kvpop.cu — KVpop's rule on the cuda backend, the device rule "kvpop"
 * (kvpop_rule.h; struct kvt_backend_rule, backend.h): policies/kvpop.c's
 * delayed learned scorer run where the staged rows, the keys, the
 * projections u and the entries' state ([a, s], with a memory [a, s, m,
 * c]: memory=T's or the learned one's, its decay and readout per layer)
 * are, so that a sync moves only the drop indices to the host.  The whole
 * call (every job: one list) in at most 13 launches whatever its jobs,
 * kvpop_decide's float operations one for one: the plan (one block), the
 * row checks, u = P x of every projecting job (copy, one grouped GEMM,
 * scatter), the state carried with the bands found, the bands' attention
 * accumulated, kvpop_score where a delay ends, and the due lists'
 * selection, drop indices and compaction (batch_select.cuh).  Bit for bit
 * on the CPU emulator; on a GPU FMA and the math functions round
 * differently.  The steps: docs/cuda.md, "Device ops, step by step".
 * Scratch:
 * bc_win_prepare's, under the context's lock.  Built into
 * libkvtrim-cuda.so (backend/cuda/cuda.mk) and registered in
 * backend_cuda.cu's BC_RULES.  Tests: cuda.backend_kvpop_rule_matches_kvpop,
 * ..._flags_and_refuses.
 */
#include <cublas_v2.h>
#include <math.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "entry_state.cuh"
#include "kvpop_rule.h"

/* What batch_select.cuh asks of a job: the first job of a (sequence,
 * layer) (proj) checks the rows for its lists; the state record is the
 * list's; a band when there are new entries and the rule reads attention
 * (its "delay" argument: bc_pop_reads, a delay or a memory), of the
 * caller's n_band entries. */
static __device__ __forceinline__ int
bc_bs_checked(const kvpop_rule_job &j) { return j.proj; }
static __device__ __forceinline__ uint32_t
bc_bs_srec(const kvpop_rule_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const kvpop_rule_job &j, uint32_t reads)
{
	return j.n_new && reads;
}
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const kvpop_rule_job &j) { return j.n_band; }

#include "batch_select.cuh"

/* Whether the new queries' attention is read at all: to the entries in
 * their delay, or with a memory to every entry. */
static __host__ __device__ __forceinline__ uint32_t
bc_pop_reads(const kvpop_rule &a)
{
	return a.delay || a.memory;
}

/* Half h of record r: positions [cap], then [cap][F] floats (a, s and,
 * with a memory, m, c; F = KVPOP_ENTRY_FLOATS). */
static __host__ __device__ __forceinline__ uint32_t *
bc_pop_half(const kvpop_rule &a, uint32_t r, uint32_t h)
{
	return bc_es_half(a.state, a.cap, KVPOP_ENTRY_FLOATS(a.memory), r, h);
}

/* The call's plan, one block of BC_BS_THREADS: bc_bs_plan_dev's (the
 * due lists, the bands' places boff), then the projecting jobs (proj, new
 * rows) in order get their rows row0[k] of the flat xs and ub (UINT32_MAX:
 * none), their indices pj[q] and the grouped GEMM's pointers, problem q:
 * W[q] the layer's P (lf floats a layer), x[q] and y[q] their rows of xs
 * and ub. */
__global__ void bc_pop_plan(const kvpop_rule a,
                            const kvpop_rule_job *jobs, uint32_t n,
                            uint32_t *at, uint32_t *boff, uint32_t *first,
                            uint32_t *keep, struct bc_seg *segs, uint64_t lf,
                            const float *xs, float *ub, uint32_t *row0,
                            uint32_t *pj, const float **W, const float **X,
                            float **Y)
{
	__shared__ uint64_t sum[BC_BS_THREADS + 1][3];
	bc_bs_plan_dev(jobs, n, bc_pop_reads(a), at, boff, first, keep, segs,
	               sum);
	__syncthreads(); /* sum is reused */
	uint32_t lo, hi;
	bc_bs_run(n, &lo, &hi);
	uint64_t c[3] = {0, 0, 0}; /* problems, rows */
	for (uint32_t k = lo; k < hi; k++)
		if (jobs[k].proj && jobs[k].n_new) {
			c[0]++;
			c[1] += jobs[k].n_new;
		}
	bc_bs_scan3(c, sum);
	uint32_t q = (uint32_t)c[0], row = (uint32_t)c[1];
	for (uint32_t k = lo; k < hi; k++) {
		const kvpop_rule_job j = jobs[k];
		row0[k] = UINT32_MAX;
		if (!j.proj || !j.n_new)
			continue;
		row0[k] = row;
		pj[q] = k;
		W[q] = a.weights + (uint64_t)j.layer * lf;
		X[q] = xs + (uint64_t)row * a.d_model;
		Y[q] = ub + (uint64_t)row * a.r;
		q++;
		row += j.n_new;
	}
}

/* Step 1a, every projecting job at once, grid (values, projecting jobs:
 * pj [nprj] their indices, so that the rows of the others launch no
 * block): x of its new rows copied contiguous into xs [rows][d_model]
 * (rows may wrap round the staging ring), and its rows of ub zeroed
 * (scorer_linear_cpu's output before its GEMM adds to it). */
__global__ void bc_pop_xcopy(const kvpop_rule a,
                             const kvpop_rule_job *jobs, const uint32_t *pj,
                             uint32_t nprj, const uint32_t *row0, float *xs,
                             float *ub)
{
	for (uint32_t q = blockIdx.y; q < nprj; q += gridDim.y) {
		const uint32_t k = pj[q], r0 = row0[k];
		const kvpop_rule_job j = jobs[k];
		const uint32_t first = j.n_seen - j.n_new;
		const uint64_t tot = (uint64_t)j.n_new * a.d_model,
		               nu = (uint64_t)j.n_new * a.r;
		for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		     e < tot || e < nu; e += (uint64_t)gridDim.x * blockDim.x) {
			if (e < tot)
				xs[(uint64_t)r0 * a.d_model + e] =
					bc_es_row(j.ring, a.rows,
					          first + (uint32_t)(e / a.d_model))
						[e % a.d_model];
			if (e < nu)
				ub[(uint64_t)r0 * a.r + e] = 0.0f;
		}
	}
}

/* Step 1c, every projecting job at once (pj [nprj], as step 1a): its
 * rows of ub [rows][r] into its (sequence, layer)'s u ring. */
__global__ void bc_pop_scatter(const kvpop_rule a,
                               const kvpop_rule_job *jobs, const uint32_t *pj,
                               uint32_t nprj, uint32_t nkv,
                               const uint32_t *row0, const float *ub)
{
	for (uint32_t q = blockIdx.y; q < nprj; q += gridDim.y) {
		const uint32_t k = pj[q], r0 = row0[k];
		const kvpop_rule_job j = jobs[k];
		const uint32_t first = j.n_seen - j.n_new;
		float *u = a.u + (uint64_t)(j.record / nkv) * a.ring * a.r;
		const uint64_t tot = (uint64_t)j.n_new * a.r;
		for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		     e < tot; e += (uint64_t)gridDim.x * blockDim.x) {
			uint32_t t = (uint32_t)(e / a.r), c = (uint32_t)(e % a.r);
			u[(uint64_t)((first + t) % a.ring) * a.r + c] =
				ub[(uint64_t)r0 * a.r + e];
		}
	}
}

/* Steps 2 and 3's band, one block per job (bc_bs_threads of the longest
 * list: at most BC_BS_THREADS), each thread a run of its entries: the
 * state carried from half cur to the other (the new entries with every
 * float 0); then, for a job with a band (boff[k] not UINT32_MAX), the
 * indices of the entries with pos + delay >= n_seen - n_new (with a
 * memory: every entry) in order (at most n_band written, at bidx +
 * boff[k]), bad[k] = 1 when there are not n_band of them, else 0. */
__global__ void bc_pop_band(const kvpop_rule a,
                            const kvpop_rule_job *jobs,
                            const uint32_t *boff, uint32_t *bidx,
                            uint32_t *bad)
{
	__shared__ uint32_t cnt[BC_BS_THREADS];
	__shared__ uint32_t total;
	const uint32_t bo = boff[blockIdx.x];
	const kvpop_rule_job j = jobs[blockIdx.x];
	const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new,
	               F = KVPOP_ENTRY_FLOATS(a.memory);
	const uint32_t *src = bc_pop_half(a, j.record, j.cur);
	uint32_t *dst = bc_pop_half(a, j.record, j.cur ^ 1u);
	const float *ss = (const float *)(src + a.cap);
	float *sd = (float *)(dst + a.cap);
	const uint32_t per = (L + blockDim.x - 1) / blockDim.x;
	const uint64_t lo64 = (uint64_t)threadIdx.x * per;
	const uint32_t lo = lo64 < L ? (uint32_t)lo64 : L,
	               hi = L - lo < per ? L : lo + per;
	uint32_t c = 0;
	for (uint32_t i = lo; i < hi; i++) {
		const int old = i < j.len;
		const uint32_t p = old ? src[i] : first + (i - j.len);
		dst[i] = p;
		for (uint32_t f = 0; f < F; f++)
			sd[(uint64_t)i * F + f] =
				old ? ss[(uint64_t)i * F + f] : 0.0f;
		c += a.memory || (uint64_t)p + a.delay >= first;
	}
	if (bo == UINT32_MAX) {
		if (threadIdx.x == 0)
			bad[blockIdx.x] = 0;
		return;
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
	uint32_t *out = bidx + bo;
	for (uint32_t i = lo; i < hi && o < j.n_band; i++)
		if (a.memory || (uint64_t)dst[i] + a.delay >= first)
			out[o++] = i;
	if (threadIdx.x == 0)
		bad[blockIdx.x] = total != j.n_band;
}

/* Step 3's accumulation, grid (band entries, jobs), one thread per band
 * entry of every job with a band (unless bad): per query t in order after
 * the entry, v = (sum over the G query heads in order of exp(logit -
 * lse)) / G, the logits in attn_band_cpu's order; within the delay a +=
 * v, after it (a memory) m = beta m + v, c = beta c + 1. */
template <typename T>
__global__ void bc_pop_accum(const kvt_backend_paged pg,
                             const kvpop_rule a,
                             const kvpop_rule_job *jobs, uint32_t n,
                             const uint32_t *boff, uint32_t nkv, uint32_t G,
                             uint32_t hd, float scale, const uint32_t *bidx,
                             const uint32_t *bad)
{
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const uint32_t bo = boff[k];
		if (bo == UINT32_MAX || bad[k])
			continue;
		const kvpop_rule_job j = jobs[k];
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)((const char *)pg.records +
			                                 (uint64_t)j.record *
			                                         pg.list_stride);
		const uint32_t first = j.n_seen - j.n_new, g = j.record % nkv;
		uint32_t *pos = bc_pop_half(a, j.record, j.cur ^ 1u);
		float *S = (float *)(pos + a.cap);
		const uint32_t F = KVPOP_ENTRY_FLOATS(a.memory);
		const float beta = a.mem ? a.mem[(uint64_t)j.layer *
		                                 KVPOP_MEM_FLOATS]
		                         : a.beta;
		for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
		     e < j.n_band; e += gridDim.x * blockDim.x) {
			const uint32_t i = bidx[bo + e], kp = pos[i];
			const T *key = (const T *)bc_entry_row(pg, r, i);
			float *ent = S + (uint64_t)i * F;
			float acc = ent[0], mm = 0.0f, mc = 0.0f;
			if (a.memory) {
				mm = ent[2];
				mc = ent[3];
			}
			for (uint32_t t = 0; t < j.n_new; t++) {
				const uint32_t qp = first + t;
				if (qp <= kp || (!a.memory && qp - kp > a.delay))
					continue;
				const float *row = bc_es_row(j.ring, a.rows, qp);
				float v = 0.0f;
				for (uint32_t h = 0; h < G; h++) {
					const uint32_t qh = g * G + h;
					v += bc_band_weight(row, a.rows, qh,
					                    key, hd, scale);
				}
				v /= (float)G;
				if (qp - kp <= a.delay) {
					acc += v;
				} else { /* the memory, in query order */
					mm = beta * mm + v;
					mc = beta * mc + 1.0f;
				}
			}
			ent[0] = acc;
			if (a.memory) {
				ent[2] = mm;
				ent[3] = mc;
			}
		}
	}
}

/* The score an entry e ([a, s] or [a, s, m, c]) of a list of layer l is
 * ranked by: kvpop_decide's, s; with the learned memory its layer's
 * readout; with memory=T and c > 0 the blend. */
static __device__ __forceinline__ float
bc_pop_rank(const kvpop_rule &a, uint32_t l, const float *e)
{
	if (a.mem) {
		const float *lm = a.mem + (uint64_t)l * KVPOP_MEM_FLOATS;
		return KVPOP_READOUT(lm[1], lm[2], e[1], e[0], e[2], e[3],
		                     a.delay);
	}
	if (!a.memory || !(e[3] > 0.0f))
		return e[1];
	return KVPOP_BLEND(a.trust, e[1], e[2], e[3]);
}

/* Steps 4 and 5, grid (entries, jobs): the score of the entries whose
 * delay ends in the sync (kvpop_score), then (due: seg[k] the job's place
 * in the flat arrays) score (bc_pop_rank), rank and protection of every
 * entry; a job whose band was not n_band (bad) protects everything
 * instead and gets count[k] = UINT32_MAX (a due one through
 * bc_bs_select's veto).  The layer's W1 follows its P in a.weights (lf
 * floats a layer): W1 [m][r + 1], b1 [m], W2 [nkv][m], b2 [nkv]. */
__global__ void bc_pop_score(const kvpop_rule a,
                             const kvpop_rule_job *jobs,
                             const uint32_t *seg, uint32_t n, uint32_t nkv,
                             uint64_t lf, const uint32_t *bad, float *sc,
                             uint32_t *rank, uint8_t *prot, uint32_t *count)
{
	const uint32_t r = a.r, m = a.m, F = KVPOP_ENTRY_FLOATS(a.memory);
	const float inv_sqrt2 = 0.70710678118654752440f;
	for (uint32_t k = blockIdx.y; k < n; k += gridDim.y) {
		const kvpop_rule_job j = jobs[k];
		const uint32_t L = j.len + j.n_new, first = j.n_seen - j.n_new,
		               at = seg[k], fail = bad[k];
		/* a failed band: count UINT32_MAX (a due list's: its veto) */
		if (fail && at == UINT32_MAX && !blockIdx.x && !threadIdx.x)
			count[k] = UINT32_MAX;
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
			float *e = S + (uint64_t)i * F;
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
				sc[at + i] = bc_pop_rank(a, j.layer, e);
				rank[at + i] = p;
				prot[at + i] = pd >= j.n_seen || p < a.sinks ||
				               (a.window &&
				                (uint64_t)p + a.window >= j.n_seen);
			}
		}
	}
}

static int bc_pop_check_args(uint32_t n_records, uint32_t n_heads,
                             uint32_t nkv, uint32_t hd,
                             const struct kvpop_rule *a,
                             const struct kvpop_rule_job *jobs,
                             uint32_t n, uint32_t out_words)
{
	if (!bc_es_layout_ok(n_heads, nkv, hd, a->state, a->rows) || !a->u ||
	    !a->weights || !a->r || !a->m || !a->ring ||
	    a->d_model > a->rows.row_floats ||
	    (a->mem && !a->memory) ||
	    (a->memory && !a->mem &&
	     !(a->beta > 0.0f && a->beta < 1.0f && a->trust >= 0.0f &&
	       isfinite(a->trust)))) {
		bc_note("kvpop rule: %u query heads on %u KV heads, head_dim "
		        "%u, r %u, m %u, ring %u, d_model %u, rows of %u "
		        "floats, memory %u (beta %g, trust %g, %s), or no "
		        "state, u or weights", n_heads, nkv, hd, a->r, a->m,
		        a->ring, a->d_model, a->rows.row_floats, a->memory,
		        (double)a->beta, (double)a->trust,
		        a->mem ? "learned" : "no learned table");
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const struct kvpop_rule_job *j = &jobs[k];
		const uint64_t L = (uint64_t)j->len + j->n_new;
		if (!j->ring || j->record >= n_records ||
		    j->cur > 1 || L > a->cap || j->n_band > L ||
		    j->n_new > j->n_seen || j->n_new > a->rows.stage_tokens ||
		    j->n_new > a->ring || j->n_drop > L ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("kvpop rule: job %u: record %u of %u, "
			        "%u + %u entries of %u, band %u, seen %u, drops "
			        "%u + %u of %u words", k, j->record, n_records,
			        j->len, j->n_new, a->cap, j->n_band,
			        j->n_seen, j->drop_off, j->n_drop, out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* What the host counts of one call's jobs: the due lists (bc_bs_count),
 * the projections, the bands. */
struct bc_pop_plan {
	struct bc_bs_count cn;
	uint32_t nprj, rows, maxN, maxB, has_band;
	uint64_t band;
};

static int bc_pop_count(struct bc_pop_plan *pl, const kvpop_rule *a,
                        const struct kvpop_rule_job *jobs, uint32_t n)
{
	memset(pl, 0, sizeof(*pl));
	int rv = bc_bs_count_jobs(jobs, n, &pl->cn);
	if (rv)
		return rv;
	uint64_t rows = 0;
	for (uint32_t k = 0; k < n; k++) {
		const struct kvpop_rule_job *j = &jobs[k];
		if (j->proj && j->n_new) {
			pl->nprj++;
			rows += j->n_new;
			pl->maxN = j->n_new > pl->maxN ? j->n_new : pl->maxN;
		}
		if (j->n_new && bc_pop_reads(*a)) {
			pl->has_band = 1;
			pl->band += j->n_band;
			pl->maxB = j->n_band > pl->maxB ? j->n_band : pl->maxB;
		}
	}
	if (rows > UINT32_MAX || pl->band > UINT32_MAX)
		return KVT_EINVAL;
	pl->rows = (uint32_t)rows;
	return 0;
}

/* Scratch offsets of one call. */
struct bc_pop_mem {
	struct bc_bs_mem bs; /* output words, jobs, plan, flat arrays */
	size_t o_bad, o_boff, o_row0, o_pj, o_W, o_X, o_Y, o_ub, o_xs, o_bidx,
		need;
};

static struct bc_pop_mem bc_pop_layout(const struct bc_pop_plan *pl,
                                       const kvpop_rule *a, uint32_t n,
                                       uint32_t out_words)
{
	struct bc_pop_mem m;
	const size_t ptrs = bc_ps_al((size_t)pl->nprj * sizeof(void *));
	m.bs = bc_bs_layout(&pl->cn, n, sizeof(struct kvpop_rule_job),
	                    out_words);
	m.o_bad = m.bs.need;
	m.o_boff = m.o_bad + bc_ps_al((size_t)n * 4);
	m.o_row0 = m.o_boff + bc_ps_al((size_t)n * 4);
	m.o_pj = m.o_row0 + bc_ps_al((size_t)n * 4);
	m.o_W = m.o_pj + bc_ps_al((size_t)pl->nprj * 4);
	m.o_X = m.o_W + ptrs;
	m.o_Y = m.o_X + ptrs;
	m.o_ub = m.o_Y + ptrs;
	m.o_xs = m.o_ub + bc_ps_al((size_t)pl->rows * a->r * 4);
	m.o_bidx = m.o_xs + bc_ps_al((size_t)pl->rows * a->d_model * 4);
	m.need = m.o_bidx + bc_ps_al((size_t)pl->band * 4);
	return m;
}

/* Step 1: every projection's u = P x: the rows copied contiguous (ub
 * zeroed), one grouped GEMM (each problem
 * scorer_linear_cpu's call for its job, beta 1 on the zeros; none when
 * d_model is 0: u is then 0), the rows into the u rings. */
static int bc_pop_project(struct bc_ctx *c, const kvpop_rule &A,
                          const struct bc_pop_plan *pl,
                          const struct bc_pop_mem &m, char *d,
                          const struct kvpop_rule_job *jobs, uint32_t n,
                          uint32_t nkv, cudaStream_t s)
{
	if (!pl->nprj)
		return 0;
	const kvpop_rule_job *dj =
		(const kvpop_rule_job *)(d + m.bs.o_jobs);
	const uint32_t *row0 = (const uint32_t *)(d + m.o_row0),
	               *pj = (const uint32_t *)(d + m.o_pj);
	float *ub = (float *)(d + m.o_ub), *xs = (float *)(d + m.o_xs);
	const uint64_t wide = A.d_model > A.r ? A.d_model : A.r;
	const uint32_t tx = bc_bs_threads((uint64_t)pl->maxN * wide);
	const dim3 gx(bc_bs_blocks((uint64_t)pl->maxN * wide),
	              bc_bs_rows(pl->nprj));
	KVT_LAUNCH(bc_pop_xcopy, gx, tx, 0, s, A, dj, pj, pl->nprj, row0, xs,
	           ub);
	BC_CALL(cudaGetLastError(), "kvpop rule x");
	struct blas_grouped g;
	memset(&g, 0, sizeof(g));
	int rv = blas_grouped_reset(&g, pl->nprj);
	for (uint32_t k = 0; !rv && A.d_model && k < n; k++)
		if (jobs[k].proj && jobs[k].n_new)
			rv = blas_grouped_add(&g, jobs[k].n_new, A.d_model, A.r,
			                      1.0f);
	if (!rv)
		rv = blas_grouped_run((cublasHandle_t)c->win_blas, &g,
		                      (const float *const *)(d + m.o_W),
		                      (const float *const *)(d + m.o_X),
		                      (float *const *)(d + m.o_Y), s);
	blas_grouped_free(&g);
	if (rv) {
		bc_note("kvpop rule: the projections' grouped GEMM failed");
		return rv;
	}
	const uint32_t tu = bc_bs_threads((uint64_t)pl->maxN * A.r);
	const dim3 gu(bc_bs_blocks((uint64_t)pl->maxN * A.r),
	              bc_bs_rows(pl->nprj));
	KVT_LAUNCH(bc_pop_scatter, gu, tu, 0, s, A, dj, pj, pl->nprj, nkv,
	           row0, ub);
	BC_CALL(cudaGetLastError(), "kvpop rule scatter");
	return 0;
}

/* Steps 2 to 5 for every job: the carry and the bands, their
 * accumulation, the scores, the due lists' selection (a failed band's
 * veto). */
static int bc_pop_decide(const kvt_backend_paged &p, enum kvt_dtype dt,
                         const kvpop_rule &A,
                         const struct bc_pop_plan *pl,
                         const struct bc_pop_mem &m, char *d, uint32_t n,
                         uint32_t nkv, uint32_t G, uint32_t hd,
                         cudaStream_t s)
{
	const kvpop_rule_job *jobs =
		(const kvpop_rule_job *)(d + m.bs.o_jobs);
	uint32_t *dout = (uint32_t *)d, *bad = (uint32_t *)(d + m.o_bad),
	         *boff = (uint32_t *)(d + m.o_boff),
	         *bidx = (uint32_t *)(d + m.o_bidx),
	         *at = (uint32_t *)(d + m.bs.o_at),
	         *rank = (uint32_t *)(d + m.bs.o_rank);
	float *sc = (float *)(d + m.bs.o_sc);
	uint8_t *prot = (uint8_t *)(d + m.bs.o_prot),
	        *drop = (uint8_t *)(d + m.bs.o_drop);
	KVT_LAUNCH(bc_pop_band, n, bc_bs_threads(pl->cn.maxL), 0, s, A, jobs,
	           boff, bidx, bad);
	BC_CALL(cudaGetLastError(), "kvpop rule carry and band");
	if (pl->has_band) {
		const float scale = 1.0f / sqrtf((float)hd);
		const uint32_t tb = bc_bs_threads(pl->maxB);
		const dim3 gb(bc_bs_blocks(pl->maxB), bc_bs_rows(n));
		if (dt == KVT_DTYPE_F16)
			KVT_LAUNCH(bc_pop_accum<f16_t>, gb, tb, 0, s, p, A,
			           jobs, n, boff, nkv, G, hd, scale, bidx, bad);
		else if (dt == KVT_DTYPE_BF16)
			KVT_LAUNCH(bc_pop_accum<bf16_t>, gb, tb, 0, s, p, A,
			           jobs, n, boff, nkv, G, hd, scale, bidx, bad);
		else
			KVT_LAUNCH(bc_pop_accum<float>, gb, tb, 0, s, p, A,
			           jobs, n, boff, nkv, G, hd, scale, bidx, bad);
		BC_CALL(cudaGetLastError(), "kvpop rule accumulate");
	}
	const uint64_t lf = kvpop_layer_floats(A.r, A.m, A.d_model, nkv);
	const uint32_t te = bc_bs_threads(pl->cn.maxL);
	const dim3 ge(bc_bs_blocks(pl->cn.maxL), bc_bs_rows(n));
	KVT_LAUNCH(bc_pop_score, ge, te, 0, s, A, jobs, at, n, nkv,
	           lf, bad, sc, rank, prot, dout + n);
	BC_CALL(cudaGetLastError(), "kvpop rule score");
	return bc_bs_select("kvpop rule", A.state, A.cap,
	                    KVPOP_ENTRY_FLOATS(A.memory), sc, rank, prot,
	                    drop, (const uint32_t *)(d + m.bs.o_first),
	                    (const uint32_t *)(d + m.bs.o_keep),
	                    (const struct bc_seg *)(d + m.bs.o_segs), pl->cn.nseg,
	                    pl->cn.maxL, bad, pl->cn.max_drop, dout, s);
}

static int bc_pop_run_locked(struct bc_ctx *c,
                             const struct kvt_backend_paged *pg,
                             enum kvt_dtype dt, uint32_t n_heads,
                             uint32_t nkv, uint32_t hd,
                             const struct kvpop_rule *a,
                             const struct kvpop_rule_job *jobs,
                             uint32_t n, uint32_t *out, uint32_t out_words,
                             cudaStream_t s)
{
	struct bc_pop_plan pl;
	int rv = bc_pop_count(&pl, a, jobs, n);
	if (rv)
		return rv;
	const struct bc_pop_mem m = bc_pop_layout(&pl, a, n, out_words);
	if ((rv = bc_win_prepare(c, m.need)))
		return rv;
	char *d = c->d_win;
	uint32_t *dout = (uint32_t *)d;
	const kvpop_rule_job *dj =
		(const kvpop_rule_job *)(d + m.bs.o_jobs);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "kvpop rule");
	BC_CALL(cudaMemcpyAsync(d + m.bs.o_jobs, jobs, (size_t)n * sizeof(*jobs),
	                        cudaMemcpyHostToDevice, s),
	        "kvpop rule");
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	KVT_LAUNCH(bc_bs_check_jobs<kvpop_rule_job>, n, BC_BS_THREADS, 0,
	           s, dj, a->rows, a->d_model, n_heads, hd, dout);
	BC_CALL(cudaGetLastError(), "kvpop rule check");
	KVT_LAUNCH(bc_pop_plan, 1, BC_BS_THREADS, 0, s, *a, dj, n,
	           (uint32_t *)(d + m.bs.o_at), (uint32_t *)(d + m.o_boff),
	           (uint32_t *)(d + m.bs.o_first), (uint32_t *)(d + m.bs.o_keep),
	           (struct bc_seg *)(d + m.bs.o_segs),
	           kvpop_layer_floats(a->r, a->m, a->d_model, nkv),
	           (const float *)(d + m.o_xs), (float *)(d + m.o_ub),
	           (uint32_t *)(d + m.o_row0), (uint32_t *)(d + m.o_pj),
	           (const float **)(d + m.o_W),
	           (const float **)(d + m.o_X), (float **)(d + m.o_Y));
	BC_CALL(cudaGetLastError(), "kvpop rule plan");
	if ((rv = bc_pop_project(c, *a, &pl, m, d, jobs, n, nkv, s)) ||
	    (rv = bc_pop_decide(*pg, dt, *a, &pl, m, d, n, nkv, n_heads / nkv,
	                        hd, s)))
		return rv;
	return bc_ps_finish(c, out, dout, out_words, s, "kvpop rule");
}

static int bc_kvpop_run(void *ctx, const struct kvt_backend_paged *pg,
                        uint32_t n_records,
                        const struct kvt_backend_rule_geom *g,
                        const void *params, const void *jobs_, uint32_t n,
                        uint32_t *out, uint32_t out_words, void *stream)
{
	const struct kvpop_rule *a = (const struct kvpop_rule *)params;
	const struct kvpop_rule_job *jobs =
		(const struct kvpop_rule_job *)jobs_;
	return bc_es_entry(
		ctx, "kvpop rule", pg, g, a, jobs, n, out, out_words,
		[&] {
			return bc_pop_check_args(n_records, g->n_heads,
			          g->n_kv_heads, g->head_dim, a, jobs, n,
			          out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_pop_run_locked(
				c, pg, g->dtype, g->n_heads, g->n_kv_heads,
				g->head_dim, a, jobs, n, out, out_words,
				(cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_kvpop_rule;
const struct kvt_backend_rule bc_kvpop_rule = {
	/* .name = */ "kvpop",
	/* .version = */ KVPOP_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct kvpop_rule),
	/* .job_bytes = */ sizeof(struct kvpop_rule_job),
	/* .run = */ bc_kvpop_run,
};
