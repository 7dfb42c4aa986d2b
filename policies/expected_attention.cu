/*
 * expected_attention.cu — Expected Attention's end-of-prefill rule on the
 * cuda backend, the device rule "expected_attention"
 * (expected_attention_rule.h; struct kvt_backend_rule, backend.h):
 * policies/expected_attention.c's selection computed where the keys, the
 * values and the staged queries are, so that only the drop indices come
 * to the host.  The kept sets are the cpu policy's bit for bit on the CPU
 * emulator: every step repeats ea_decide's operations in its order (each
 * kernel's comment names the host function it follows), and the softmax's
 * max and sum, whose order the bits depend on, run in one thread.
 *
 * A call: the rows' checks beside the plan (batch_select.cuh's, one
 * launch), then the due lists in tiles (BC_EA_TILE_BYTES of scratch, one
 * tile where the call fits), each in at most 4 launches whatever its
 * lists: the statistics' inputs, the keys and the K S' problems' plan;
 * the means and covariances; every K S' block of 64 keys as one problem
 * of one grouped GEMM; z, the softmaxes and the scores; then one
 * segmented top-k and the drop indices over every tile's lists.  The
 * steps: docs/cuda.md, "Device ops, step by step".  Scratch: the
 * context's (bc_win_prepare), under its lock; the rule waits for its
 * output.  Built into libkvtrim-cuda.so (backend/cuda/cuda.mk) and
 * registered in backend_cuda.cu's BC_RULES.  Tests:
 * cuda.backend_expected_attention_rule_matches_naive, _launches and the
 * emulated passes.
 */
#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "expected_attention_rule.h"

typedef expected_attention_rule ea_rule;
typedef expected_attention_rule_job ea_job;

/* What batch_select.cuh asks of a job: its list is its record; no band;
 * no state (the half is unused). */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const ea_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const ea_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const ea_job &) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_next_half(const ea_job &) { return 0; }

#include "batch_select.cuh"

#define BC_EA_THREADS 256
#define BC_EA_BLOCK 64u /* keys per K S' product: the policy's EA_BLOCK */

/* q of position p of a job's ring. */
static __device__ __forceinline__ const float *
bc_ea_q(const ea_rule &a, const ea_job &j, uint32_t p)
{
	return bc_es_row(j.ring, a.rows, p) + a.rows.q_off;
}

/* RoPE frequency of pair k, as ea_freq (and model_rope) computes it. */
static __device__ __forceinline__ float bc_ea_freq(float theta, uint32_t k,
                                                   uint32_t hd)
{
	return 1.0f / powf(theta, (float)(2 * k) / (float)hd);
}

/*
 * One launch of n + 1 blocks: block k < n checks job k's rows [from, len
 * + n_new), every q value of every query head (out[k] = 1 when one is not
 * finite: the cpu policy refuses such a sync), block n plans the due
 * lists (bc_bs_plan_dev).
 */
__global__ void bc_ea_check_plan(const ea_job *jobs, uint32_t n,
                                 const ea_rule a, uint32_t nq, uint32_t *out,
                                 uint32_t *at, uint32_t *first,
                                 uint32_t *keep, struct bc_seg *segs)
{
	__shared__ uint64_t sum[BC_BS_THREADS + 1][3];
	__shared__ uint32_t bad;
	if (blockIdx.x == n) {
		bc_bs_plan_dev(jobs, n, 0, at, NULL, first, keep, segs, sum);
		return;
	}
	const ea_job j = jobs[blockIdx.x];
	if (threadIdx.x == 0)
		bad = 0;
	__syncthreads();
	const uint64_t tot = (uint64_t)(j.len - j.from + j.n_new) * nq;
	uint32_t mine = 0;
	for (uint64_t e = threadIdx.x; e < tot; e += blockDim.x)
		mine |= !isfinite(bc_ea_q(a, j, j.from + (uint32_t)(e / nq))[e % nq]);
	if (mine)
		atomicOr(&bad, 1u);
	__syncthreads();
	if (threadIdx.x == 0)
		out[blockIdx.x] = bad;
}

/*
 * A tile of a call: its due lists segs [nseg] (the plan's, from the
 * tile's first; the entries of list l at segs[l].first - e0 in the
 * tile's arrays), and where the steps put their results: per list (slot
 * l; the G query heads j of its KV head g) rc [hd], qs [maxN][G][hd], m
 * and mu [G][hd], S' [G][hd][hd]; per entry (tot) keys [hd], z [G] (head
 * j at z[j tot + e]), K S' [G][hd] (head j at ks[(j tot + e) hd]); per
 * list and head the softmax's sum.
 */
struct bc_ea_tile {
	const ea_job *jobs;
	const struct bc_seg *segs;
	uint32_t nseg, e0, tot, maxN, G, hd;
	double *rc, *m, *mu, *z, *sums;
	float *qs, *S, *keys, *ks;
};

/* The tile's lists, a grid row each in turn. */
#define BC_EA_ROWS(T, l) \
	for (uint32_t l = blockIdx.y; l < (T).nseg; l += gridDim.y)

/* The x extent of a role of a fused launch: blocks at or beyond it
 * return, the others stride by it. */
#define BC_EA_X(nx, i, n)                                                      \
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;   \
	     blockIdx.x < (nx) && i < (n); i += (uint64_t)(nx) * blockDim.x)

/* Step 1 (ea_future_rot): rc [hd / 2][2] of list l, the mean cos and sin
 * of the future positions' angles, each pair's sums in t order. */
static __device__ void bc_ea_rot(const ea_rule &a, const struct bc_ea_tile &T,
                                 uint32_t l, uint32_t nx)
{
	const ea_job j = T.jobs[T.segs[l].job];
	double *rc = T.rc + (uint64_t)l * T.hd;
	BC_EA_X(nx, q, T.hd / 2) {
		double f = bc_ea_freq(a.theta, (uint32_t)q, T.hd), c = 0.0,
		       s = 0.0;
		for (uint32_t t = 0; t < a.future; t++) {
			double ang = ((double)j.len + t) * f;
			c += cos(ang);
			s += sin(ang);
		}
		rc[2 * q] = c / a.future;
		rc[2 * q + 1] = s / a.future;
	}
}

/* Step 2 (ea_unrope): qs [N][G][hd] of list l, the q of its query heads
 * at positions [from, P) rotated back to before RoPE with the same float
 * angles. */
static __device__ void bc_ea_unrope(const ea_rule &a,
                                    const struct bc_ea_tile &T, uint32_t l,
                                    uint32_t nx)
{
	const ea_job j = T.jobs[T.segs[l].job];
	const uint32_t hd = T.hd, nq = T.G * hd;
	float *qs = T.qs + (uint64_t)l * T.maxN * nq;
	BC_EA_X(nx, e, (uint64_t)(j.len - j.from) * nq) {
		const uint32_t t = (uint32_t)(e / nq), r = (uint32_t)(e % nq);
		const uint32_t d = r % hd, q = d / 2, pos = j.from + t;
		const float *v = bc_ea_q(a, j, pos) +
		                 (uint64_t)(j.g * T.G + r / hd) * hd;
		float ang = (float)pos * bc_ea_freq(a.theta, q, hd);
		float c = cosf(ang), s = sinf(ang);
		float v0 = v[2 * q], v1 = v[2 * q + 1];
		qs[e] = d % 2 == 0 ? v0 * c + v1 * s : -v0 * s + v1 * c;
	}
}

/* Step 4: keys [len][hd] of list l; a key of a page beyond its record or
 * of an unmapped chunk reads as NaN (a daemon bug must not fault the
 * context). */
template <typename E>
static __device__ void bc_ea_keys(const kvt_backend_paged &pg,
                                  const struct bc_ea_tile &T, uint32_t l,
                                  uint32_t nx)
{
	const struct bc_seg sg = T.segs[l];
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		        (uint64_t)T.jobs[sg.job].record * pg.list_stride);
	const uint32_t hd = T.hd;
	float *keys = T.keys + (uint64_t)(sg.first - T.e0) * hd;
	BC_EA_X(nx, e, (uint64_t)sg.L * hd) {
		const E *row = (const E *)bc_entry_row(pg, r, (uint32_t)(e / hd));
		keys[e] = row ? common_to_f(row[e % hd]) : nanf("");
	}
}

/* The K S' problems of each block size: group q holds the blocks of
 * bc_ea_rows(q) keys (BC_EA_BLOCK, then the shorter last blocks by
 * size); base[q] is its first problem. */
struct bc_ea_groups {
	uint32_t base[BC_EA_BLOCK];
};

static __host__ __device__ __forceinline__ uint32_t bc_ea_rows(uint32_t q)
{
	return q == 0 ? BC_EA_BLOCK : q;
}

/*
 * Step 5a, by one block, group q: the pointers of group q's K S'
 * problems, the blocks of ea_expect's scorer_linear_cpu calls: for each
 * list, in order, and each query head j of its group, its blocks of
 * bc_ea_rows(q) keys by S' of head j into ks.  The block's scan over the
 * lists places the problems in list, head, block order from gr.base[q].
 * Every thread of the block calls it; it leaves the block synchronised.
 */
static __device__ void bc_ea_gemm_plan(const struct bc_ea_tile &T,
                                       const struct bc_ea_groups &gr,
                                       uint32_t q, const float **W,
                                       const float **X, float **Y)
{
	__shared__ uint32_t before[BC_BS_THREADS + 1];
	uint32_t lo, hi;
	bc_bs_run(T.nseg, &lo, &hi);
	const uint32_t t = threadIdx.x;
	uint32_t c = 0;
	for (uint32_t l = lo; l < hi; l++) {
		const uint32_t L = T.segs[l].L;
		c += T.G * (q == 0 ? L / BC_EA_BLOCK : L % BC_EA_BLOCK == q);
	}
	before[t + 1] = c;
	__syncthreads();
	if (t == 0) {
		before[0] = gr.base[q];
		for (uint32_t k = 1; k <= BC_BS_THREADS; k++)
			before[k] += before[k - 1];
	}
	__syncthreads();
	uint32_t p = before[t];
	const uint32_t hd = T.hd;
	for (uint32_t l = lo; l < hi; l++) {
		const struct bc_seg sg = T.segs[l];
		const uint32_t b0 = q == 0 ? 0 : sg.L / BC_EA_BLOCK;
		const uint32_t nb = q == 0 ? sg.L / BC_EA_BLOCK
		                           : sg.L % BC_EA_BLOCK == q;
		for (uint32_t j = 0; j < T.G; j++)
			for (uint32_t b = b0; b < b0 + nb; b++, p++) {
				const uint64_t e = sg.first - T.e0 +
				                   (uint64_t)b * BC_EA_BLOCK;
				X[p] = T.keys + e * hd;
				W[p] = T.S + ((uint64_t)l * T.G + j) * hd * hd;
				Y[p] = T.ks + ((uint64_t)j * T.tot + e) * hd;
			}
	}
	__syncthreads(); /* before is the next group's */
}

/* The x extents of bc_ea_inputs's roles. */
struct bc_ea_nx {
	uint32_t rot, unrope, keys;
};

/*
 * Steps 1, 2, 4 and 5a of a tile in one launch, grid (x, lists, 3): z 0
 * the future rotations, z 1 the un-rotated queries, z 2 the keys (each
 * role its own x extent, nx); then (cov) the block (0, 0, 0) plans the
 * K S' problems' pointers, group after group.  They read nothing
 * another writes.
 */
template <typename E>
__global__ void bc_ea_inputs(const kvt_backend_paged pg, const ea_rule a,
                             const struct bc_ea_tile T,
                             const struct bc_ea_nx nx,
                             const struct bc_ea_groups gr, const float **W,
                             const float **X, float **Y)
{
	BC_EA_ROWS(T, l) {
		if (blockIdx.z == 0)
			bc_ea_rot(a, T, l, nx.rot);
		else if (blockIdx.z == 1)
			bc_ea_unrope(a, T, l, nx.unrope);
		else
			bc_ea_keys<E>(pg, T, l, nx.keys);
	}
	if (a.cov && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
		for (uint32_t q = 0; q < BC_EA_BLOCK; q++)
			bc_ea_gemm_plan(T, gr, q, W, X, Y);
}

/* The mean of dimension d of query head j of list l (ea_stats: summed in
 * t order, divided by N), the same bits wherever it is computed. */
static __device__ __forceinline__ double
bc_ea_mean_of(const struct bc_ea_tile &T, const float *qs, uint32_t N,
              uint32_t j, uint32_t d)
{
	double v = 0.0;
	for (uint32_t t = 0; t < N; t++)
		v += qs[((uint64_t)t * T.G + j) * T.hd + d];
	return v / N;
}

/* Step 3a (ea_stats) of list l, one thread per query head j and pair q:
 * m [G][hd] (the means) and mu [G][hd] = R m. */
static __device__ void bc_ea_mean(const struct bc_ea_tile &T, uint32_t l,
                                  uint32_t N, const float *qs,
                                  const double *rc, uint32_t nx)
{
	const uint32_t half = T.hd / 2;
	BC_EA_X(nx, e, (uint64_t)T.G * half) {
		const uint32_t j = (uint32_t)(e / half), q = (uint32_t)(e % half);
		const double m0 = bc_ea_mean_of(T, qs, N, j, 2 * q),
		             m1 = bc_ea_mean_of(T, qs, N, j, 2 * q + 1);
		const double c = rc[2 * q], s = rc[2 * q + 1];
		const uint64_t o = ((uint64_t)l * T.G + j) * T.hd;
		T.m[o + 2 * q] = m0;
		T.m[o + 2 * q + 1] = m1;
		T.mu[o + 2 * q] = c * m0 - s * m1;
		T.mu[o + 2 * q + 1] = s * m0 + c * m1;
	}
}

/* Step 3b (ea_stats, cov) of list l, one thread per 2 x 2 block (rows 2a,
 * 2a + 1, columns 2b, 2b + 1) of query head j's S' [hd][hd]: its four
 * covariances, each summed in t order from 0 and divided by N (the means
 * recomputed as step 3a computes them), then R on the rows, then on the
 * columns, rounded to float, as the host does in place. */
static __device__ void bc_ea_cov(const struct bc_ea_tile &T, uint32_t l,
                                 uint32_t N, const float *qs,
                                 const double *rc, uint32_t nx)
{
	const uint32_t hd = T.hd, half = hd / 2;
	BC_EA_X(nx, e, (uint64_t)T.G * half * half) {
		const uint32_t j = (uint32_t)(e / ((uint64_t)half * half));
		const uint32_t a = (uint32_t)(e / half % half),
		               b = (uint32_t)(e % half);
		double mr[2], mc[2], C[2][2];
		for (uint32_t u = 0; u < 2; u++) {
			mr[u] = bc_ea_mean_of(T, qs, N, j, 2 * a + u);
			mc[u] = bc_ea_mean_of(T, qs, N, j, 2 * b + u);
		}
		for (uint32_t u = 0; u < 2; u++)
			for (uint32_t v = 0; v < 2; v++) {
				const uint32_t r = 2 * a + u, c = 2 * b + v;
				double x = 0.0;
				for (uint32_t t = 0; t < N; t++) {
					const float *q = qs + ((uint64_t)t * T.G +
					                       j) * hd;
					double dr = q[r] - mr[u];
					x += dr * (q[c] - mc[v]);
				}
				C[u][v] = x / N;
			}
		const double cr = rc[2 * a], sr = rc[2 * a + 1];
		const double cc = rc[2 * b], sc = rc[2 * b + 1];
		float *S = T.S + ((uint64_t)l * T.G + j) * hd * hd;
		for (uint32_t u = 0; u < 2; u++) {
			double r0 = u == 0 ? cr * C[0][0] - sr * C[1][0]
			                   : sr * C[0][0] + cr * C[1][0];
			double r1 = u == 0 ? cr * C[0][1] - sr * C[1][1]
			                   : sr * C[0][1] + cr * C[1][1];
			float *o = S + (uint64_t)(2 * a + u) * hd;
			o[2 * b] = (float)(cc * r0 - sc * r1);
			o[2 * b + 1] = (float)(sc * r0 + cc * r1);
		}
	}
}

/* Step 3 of a tile in one launch, grid (x, lists, 2): z 0 the means, z 1
 * (cov) the covariances, each role its own x extent. */
__global__ void bc_ea_stats(const ea_rule a, const struct bc_ea_tile T,
                            uint32_t nx_mean, uint32_t nx_cov)
{
	if (blockIdx.z == 1 && !a.cov)
		return;
	BC_EA_ROWS(T, l) {
		const ea_job j = T.jobs[T.segs[l].job];
		const uint32_t N = j.len - j.from;
		const float *qs = T.qs + (uint64_t)l * T.maxN * T.G * T.hd;
		const double *rc = T.rc + (uint64_t)l * T.hd;
		if (blockIdx.z == 0)
			bc_ea_mean(T, l, N, qs, rc, nx_mean);
		else
			bc_ea_cov(T, l, N, qs, rc, nx_cov);
	}
}

/*
 * Steps 5b and 5c (ea_expect) of list l and query head j of its group,
 * by every thread of a block: z of the candidates [sinks, min(P, len))
 * (mu' of head j, K S' with cov) in double, in parallel; then the max and
 * the sum in index order by one thread (a tree would change the bits),
 * the exps in parallel; z holds the exps, sums[l G + j] the sum.  It
 * leaves the block synchronised.
 */
static __device__ void bc_ea_soft(const ea_rule &a, const struct bc_ea_tile &T,
                                  uint32_t l, uint32_t j)
{
	__shared__ double zmax;
	const uint32_t hd = T.hd;
	const struct bc_seg sg = T.segs[l];
	const ea_job jb = T.jobs[sg.job];
	const uint32_t lo = a.sinks, hi = jb.len < sg.L ? jb.len : sg.L;
	const uint64_t e0 = sg.first - T.e0;
	double *z = T.z + (uint64_t)j * T.tot + e0;
	const double *mu = T.mu + ((uint64_t)l * T.G + j) * hd;
	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
		const float *k = T.keys + (e0 + i) * hd;
		const float *kS = T.ks + ((uint64_t)j * T.tot + e0 + i) * hd;
		double lin = 0.0, quad = 0.0;
		for (uint32_t d = 0; d < hd; d++)
			lin += mu[d] * k[d];
		if (a.cov)
			for (uint32_t d = 0; d < hd; d++)
				quad += (double)kS[d] * k[d];
		z[i] = lin / sqrt((double)hd) + quad / (2.0 * hd);
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		double v = -INFINITY;
		for (uint32_t i = lo; i < hi; i++)
			if (z[i] > v)
				v = z[i];
		zmax = v;
	}
	__syncthreads();
	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
		z[i] = exp(z[i] - zmax);
	__syncthreads();
	if (threadIdx.x == 0) {
		double v = 0.0;
		for (uint32_t i = lo; i < hi; i++)
			v += z[i];
		T.sums[(uint64_t)l * T.G + j] = v;
	}
	__syncthreads();
}

/* Step 6 (ea_decide's tail) of list l, by the threads of a block: acc =
 * the sum over the group's heads in order of e / sum / G, then s and the
 * protection into the call's flat arrays; a candidate's value row (the
 * page's V half, after its page_tokens K rows) weighs it with vnorm; a
 * value of a page beyond its record or of an unmapped chunk makes the
 * score NaN. */
template <typename E>
static __device__ void bc_ea_score(const kvt_backend_paged &pg,
                                   const ea_rule &a,
                                   const struct bc_ea_tile &T, uint32_t l,
                                   float *s, uint8_t *prot)
{
	const uint32_t hd = T.hd;
	const double G = (double)T.G;
	const struct bc_seg sg = T.segs[l];
	const ea_job jb = T.jobs[sg.job];
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		        (uint64_t)jb.record * pg.list_stride);
	for (uint32_t i = threadIdx.x; i < sg.L; i += blockDim.x) {
		const uint64_t e = sg.first - T.e0 + (uint64_t)i;
		const int cand = i >= a.sinks && i < jb.len;
		double v = 0.0;
		for (uint32_t j = 0; cand && j < T.G; j++)
			v += T.z[(uint64_t)j * T.tot + e] /
			     T.sums[(uint64_t)l * T.G + j] / G;
		if (a.vnorm && cand) {
			const char *row = bc_entry_row(pg, r, i);
			double ss = nan("");
			if (row) {
				const E *vr = (const E *)(row +
				        (uint64_t)pg.page_tokens * pg.row_bytes);
				ss = 0.0;
				for (uint32_t d = 0; d < hd; d++) {
					float x = common_to_f(vr[d]);
					ss += (double)x * x;
				}
			}
			v = (v + a.eps) * sqrt(ss);
		}
		s[sg.first + i] = (float)v;
		prot[sg.first + i] = !cand;
	}
}

/* Steps 5b, 5c and 6 of a tile in one launch, a block per list in turn:
 * the softmax of each query head of its group in order, then its
 * scores. */
template <typename E>
__global__ void bc_ea_expect(const kvt_backend_paged pg, const ea_rule a,
                             const struct bc_ea_tile T, float *s,
                             uint8_t *prot)
{
	for (uint32_t l = blockIdx.x; l < T.nseg; l += gridDim.x) {
		for (uint32_t j = 0; j < T.G; j++)
			bc_ea_soft(a, T, l, j);
		bc_ea_score<E>(pg, a, T, l, s, prot);
		__syncthreads(); /* zmax is the next list's */
	}
}

static uint32_t bc_ea_grid(uint64_t n)
{
	uint64_t b = (n + BC_EA_THREADS - 1) / BC_EA_THREADS;
	return b < 1 ? 1 : b > 4096 ? 4096 : (uint32_t)b;
}

static int bc_ea_check_args(uint32_t n_records, uint32_t n_heads,
                            uint32_t nkv, uint32_t hd, const ea_rule *a,
                            const ea_job *jobs, uint32_t n,
                            uint32_t out_words)
{
	const struct kvt_backend_rows rl = a->rows;
	if (!hd || hd % 2 || !nkv || n_heads % nkv || !rl.stage_tokens ||
	    rl.q_off + (uint64_t)n_heads * hd > rl.row_floats) {
		bc_note("expected_attention rule: %u query heads on %u KV "
		        "heads, head_dim %u, or q beyond rows of %u floats",
		        n_heads, nkv, hd, rl.row_floats);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const ea_job *j = &jobs[k];
		if (!j->ring || j->record >= n_records || j->g >= nkv ||
		    j->from > j->len ||
		    (j->due && (j->from == j->len || j->from < a->sinks ||
		                !a->future || !(a->theta > 0.0f))) ||
		    (uint64_t)j->len - j->from + j->n_new > rl.stage_tokens ||
		    j->n_drop > (uint64_t)j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("expected_attention rule: job %u: record %u of "
			        "%u, KV head %u, prompt %u, from %u, new %u, "
			        "future %u, drops %u + %u of %u words", k,
			        j->record, n_records, j->g, j->len, j->from,
			        j->n_new, a->future, j->drop_off, j->n_drop,
			        out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

/* The scratch a call may take for its tiles (beyond the call's own
 * arrays): due lists are taken in order while their tile fits, one at
 * least. */
#define BC_EA_TILE_BYTES ((size_t)256 << 20)

/* BC_EA_TILE_BYTES, or KVTRIM_CUDA_TILE_BYTES where it is a positive
 * number (the tests split small calls into tiles with it). */
static size_t bc_ea_budget(void)
{
	const char *e = getenv("KVTRIM_CUDA_TILE_BYTES");
	char *end = NULL;
	unsigned long long v = e && *e ? strtoull(e, &end, 10) : 0;
	return v && end && !*end ? (size_t)v : BC_EA_TILE_BYTES;
}

/* What the host counts of a tile, the due lists [s0, s1) of the call
 * (jobs [k0, k1)): their entries (from e0), the longest list and
 * statistics window, and the K S' problems of each group (bc_ea_rows). */
struct bc_ea_count {
	uint32_t k0, k1, s0, s1, maxN, maxL;
	uint64_t e0, tot, nprob;
	uint64_t cnt[BC_EA_BLOCK];
};

/* Scratch offsets of one tile, after base. */
struct bc_ea_mem {
	size_t rc, qs, m, mu, S, keys, ks, z, sums, W, X, Y, need;
};

static struct bc_ea_mem bc_ea_layout(const struct bc_ea_count *t, uint32_t G,
                                     uint32_t hd, uint32_t cov, size_t base)
{
	struct bc_ea_mem o;
	const uint64_t ns = t->s1 - t->s0, tot = t->tot,
	               ptrs = bc_ps_al(t->nprob * sizeof(void *));
	o.rc = base;
	o.qs = o.rc + bc_ps_al(ns * hd * 8);
	o.m = o.qs + bc_ps_al(ns * t->maxN * G * hd * 4);
	o.mu = o.m + bc_ps_al(ns * G * hd * 8);
	o.S = o.mu + bc_ps_al(ns * G * hd * 8);
	o.keys = o.S + (cov ? bc_ps_al(ns * G * hd * hd * 4) : 0);
	o.ks = o.keys + bc_ps_al(tot * hd * 4);
	o.z = o.ks + (cov ? bc_ps_al(G * tot * hd * 4) : 0);
	o.sums = o.z + bc_ps_al(G * tot * 8);
	o.W = o.sums + bc_ps_al(G * ns * 8);
	o.X = o.W + ptrs;
	o.Y = o.X + ptrs;
	o.need = o.Y + ptrs;
	return o;
}

/* Adds job k, a due list, to t. */
static void bc_ea_add(struct bc_ea_count *t, const ea_job *j, uint32_t G,
                      uint32_t cov)
{
	const uint32_t L = j->len + j->n_new, N = j->len - j->from;
	t->s1++;
	t->tot += L;
	t->maxL = L > t->maxL ? L : t->maxL;
	t->maxN = N > t->maxN ? N : t->maxN;
	if (!cov)
		return;
	t->cnt[0] += (uint64_t)G * (L / BC_EA_BLOCK);
	if (L % BC_EA_BLOCK)
		t->cnt[L % BC_EA_BLOCK] += G;
	t->nprob += (uint64_t)G * ((L + BC_EA_BLOCK - 1) / BC_EA_BLOCK);
}

/* The tile after prev (from job prev->k1, list prev->s1): the due lists
 * after it while the tile's scratch stays within budget bytes (one at
 * least); jobs not due ride along. */
static struct bc_ea_count bc_ea_tile_after(const struct bc_ea_count *prev,
                                           const ea_job *jobs, uint32_t n,
                                           uint32_t G, uint32_t hd,
                                           uint32_t cov, size_t budget)
{
	struct bc_ea_count t;
	memset(&t, 0, sizeof(t));
	t.k0 = t.k1 = prev->k1;
	t.s0 = t.s1 = prev->s1;
	t.e0 = prev->e0 + prev->tot;
	for (; t.k1 < n; t.k1++) {
		const ea_job *j = &jobs[t.k1];
		if (!j->due || !(j->len + j->n_new))
			continue;
		struct bc_ea_count more = t;
		bc_ea_add(&more, j, G, cov);
		if (t.s1 > t.s0 &&
		    bc_ea_layout(&more, G, hd, cov, 0).need > budget)
			break;
		t = more;
	}
	return t;
}

/* The tile's view of the scratch d (layout o). */
static struct bc_ea_tile bc_ea_view(char *d, const struct bc_ea_mem &o,
                                    const struct bc_ea_count *t, uint32_t G,
                                    uint32_t hd, const ea_job *dj,
                                    const struct bc_seg *segs)
{
	struct bc_ea_tile T;
	T.jobs = dj;
	T.segs = segs + t->s0;
	T.nseg = t->s1 - t->s0;
	T.e0 = (uint32_t)t->e0;
	T.tot = (uint32_t)t->tot;
	T.maxN = t->maxN;
	T.G = G;
	T.hd = hd;
	T.rc = (double *)(d + o.rc);
	T.m = (double *)(d + o.m);
	T.mu = (double *)(d + o.mu);
	T.z = (double *)(d + o.z);
	T.sums = (double *)(d + o.sums);
	T.qs = (float *)(d + o.qs);
	T.S = (float *)(d + o.S);
	T.keys = (float *)(d + o.keys);
	T.ks = (float *)(d + o.ks);
	return T;
}

#define BC_EA_DISPATCH(kernel, dt, grid, s, ...)                               \
	do {                                                                   \
		if ((dt) == KVT_DTYPE_F16)                                     \
			KVT_LAUNCH(kernel<f16_t>, grid, BC_EA_THREADS, 0, s,   \
			           __VA_ARGS__);                               \
		else if ((dt) == KVT_DTYPE_BF16)                               \
			KVT_LAUNCH(kernel<bf16_t>, grid, BC_EA_THREADS, 0, s,  \
			           __VA_ARGS__);                               \
		else                                                           \
			KVT_LAUNCH(kernel<float>, grid, BC_EA_THREADS, 0, s,   \
			           __VA_ARGS__);                               \
	} while (0)

/* The K S' problems of tile t as one grouped GEMM (step 5a's second
 * half), each the call ea_expect makes through scorer_linear_cpu
 * (blas_xwt's; S' is symmetric, so the kernel's K S'^T is K S'); their
 * pointers were planned by bc_ea_inputs. */
static int bc_ea_products(cublasHandle_t h, const struct bc_ea_count *t,
                          uint32_t hd, char *d, const struct bc_ea_mem &o,
                          cudaStream_t s)
{
	if (!t->nprob)
		return 0;
	struct blas_grouped g;
	memset(&g, 0, sizeof(g));
	int rv = blas_grouped_reset(&g, (uint32_t)t->nprob);
	for (uint32_t q = 0; !rv && q < BC_EA_BLOCK; q++)
		for (uint64_t k = 0; !rv && k < t->cnt[q]; k++)
			rv = blas_grouped_add(&g, bc_ea_rows(q), hd, hd, 0.0f);
	if (!rv)
		rv = blas_grouped_run(h, &g, (const float *const *)(d + o.W),
		                      (const float *const *)(d + o.X),
		                      (float *const *)(d + o.Y), s);
	blas_grouped_free(&g);
	if (rv)
		bc_note("expected_attention rule: the K S' grouped GEMM "
		        "failed");
	return rv;
}

/*
 * One tile, queued on s: the inputs (rotations, un-rotated queries, keys,
 * the products' pointers), the statistics, K S' (one grouped GEMM, with
 * cov), z, the softmaxes and the scores into the call's flat arrays: 4
 * launches at most whatever its lists.
 */
static int bc_ea_run_tile(struct bc_ctx *c, const kvt_backend_paged &p,
                          enum kvt_dtype dt, const ea_rule &a,
                          const struct bc_ea_count *t, uint32_t G,
                          uint32_t hd, size_t base, const ea_job *dj,
                          const struct bc_seg *segs, float *sc,
                          uint8_t *prot, cudaStream_t s)
{
	char *d = c->d_win;
	const struct bc_ea_mem o = bc_ea_layout(t, G, hd, a.cov, base);
	const struct bc_ea_tile T = bc_ea_view(d, o, t, G, hd, dj, segs);
	const uint32_t half = hd / 2, rows = bc_bs_rows(T.nseg);
	struct bc_ea_groups gr;
	uint64_t at = 0;
	for (uint32_t q = 0; q < BC_EA_BLOCK; q++) {
		gr.base[q] = (uint32_t)at;
		at += t->cnt[q];
	}
	const struct bc_ea_nx nx = {
		bc_ea_grid(half), bc_ea_grid((uint64_t)T.maxN * G * hd),
		bc_ea_grid((uint64_t)t->maxL * hd)};
	const uint32_t gx = nx.unrope > nx.keys ? nx.unrope : nx.keys;
	BC_EA_DISPATCH(bc_ea_inputs, dt, dim3(gx, rows, 3), s, p, a, T, nx, gr,
	               (const float **)(d + o.W), (const float **)(d + o.X),
	               (float **)(d + o.Y));
	BC_CALL(cudaGetLastError(), "expected_attention rule inputs");
	const uint32_t nm = bc_ea_grid((uint64_t)G * half),
	               nc = bc_ea_grid((uint64_t)G * half * half);
	KVT_LAUNCH(bc_ea_stats, dim3(nm > nc ? nm : nc, rows, 2), BC_EA_THREADS,
	           0, s, a, T, nm, nc);
	BC_CALL(cudaGetLastError(), "expected_attention rule statistics");
	int rv = bc_ea_products((cublasHandle_t)c->win_blas, t, hd, d, o, s);
	if (rv)
		return rv;
	const uint32_t nb = T.nseg < (1u << 20) ? T.nseg : (1u << 20);
	BC_EA_DISPATCH(bc_ea_expect, dt, nb, s, p, a, T, sc, prot);
	BC_CALL(cudaGetLastError(), "expected_attention rule scores");
	return 0;
}

/* Scratch offsets of a call's own arrays: the output words, the jobs,
 * the plan, and the flat score, protection and drop arrays; the tiles'
 * from base. */
struct bc_ea_call {
	size_t jobs, at, first, keep, segs, sc, prot, drop, base;
};

static struct bc_ea_call bc_ea_call_layout(uint32_t n, uint32_t out_words,
                                           const struct bc_bs_count &cn)
{
	struct bc_ea_call m;
	m.jobs = bc_ps_al((size_t)out_words * 4);
	m.at = m.jobs + bc_ps_al((size_t)n * sizeof(ea_job));
	m.first = m.at + bc_ps_al((size_t)n * 4);
	m.keep = m.first + bc_ps_al((size_t)(cn.nseg + 1) * 4);
	m.segs = m.keep + bc_ps_al((size_t)cn.nseg * 4);
	m.sc = m.segs + bc_ps_al((size_t)cn.nseg * sizeof(struct bc_seg));
	m.prot = m.sc + bc_ps_al((size_t)cn.tot * 4);
	m.drop = m.prot + bc_ps_al(cn.tot);
	m.base = m.drop + bc_ps_al(cn.tot);
	return m;
}

/*
 * The launches of one call: the checks and the plan (one), per tile (its
 * lists' scratch within BC_EA_TILE_BYTES, so one tile where the call's
 * lists fit) at most 4 (bc_ea_run_tile), then the segmented top-k and
 * the drop indices over every list (two); the jobs go up in one copy,
 * the output comes back in one.
 */
static int bc_ea_run_locked(struct bc_ctx *c, const kvt_backend_paged *pg,
                            const struct kvt_backend_rule_geom *g,
                            const ea_rule *a, const ea_job *jobs, uint32_t n,
                            uint32_t *out, uint32_t out_words, cudaStream_t s)
{
	const uint32_t G = g->n_heads / g->n_kv_heads, hd = g->head_dim;
	const size_t budget = bc_ea_budget();
	struct bc_bs_count cn;
	if (bc_bs_count_jobs(jobs, n, &cn)) {
		bc_note("expected_attention rule: more than 2^32 entries in "
		        "one call");
		return KVT_EINVAL;
	}
	const struct bc_ea_call m = bc_ea_call_layout(n, out_words, cn);
	size_t need = m.base;
	struct bc_ea_count t;
	memset(&t, 0, sizeof(t));
	while (t.s1 < cn.nseg) {
		t = bc_ea_tile_after(&t, jobs, n, G, hd, a->cov, budget);
		if (t.nprob > INT32_MAX || (uint64_t)t.tot * G > UINT32_MAX) {
			bc_note("expected_attention rule: %llu entries, %llu K "
			        "S' products in a tile", (unsigned long long)t.tot,
			        (unsigned long long)t.nprob);
			return KVT_EINVAL;
		}
		size_t tn = bc_ea_layout(&t, G, hd, a->cov, m.base).need;
		need = tn > need ? tn : need;
	}
	int rv = bc_win_prepare(c, need);
	if (rv)
		return rv;
	char *d = c->d_win;
	uint32_t *dout = (uint32_t *)d;
	ea_job *dj = (ea_job *)(d + m.jobs);
	struct bc_seg *segs = (struct bc_seg *)(d + m.segs);
	float *sc = (float *)(d + m.sc);
	uint8_t *prot = (uint8_t *)(d + m.prot);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "expected_attention rule");
	BC_CALL(cudaMemcpyAsync(dj, jobs, (size_t)n * sizeof(*jobs),
	                        cudaMemcpyHostToDevice, s),
	        "expected_attention rule");
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	KVT_LAUNCH(bc_ea_check_plan, n + 1, BC_BS_THREADS, 0, s, dj, n, *a,
	           g->n_heads * hd, dout, (uint32_t *)(d + m.at),
	           (uint32_t *)(d + m.first), (uint32_t *)(d + m.keep), segs);
	BC_CALL(cudaGetLastError(), "expected_attention rule check");
	memset(&t, 0, sizeof(t));
	while (t.s1 < cn.nseg) {
		t = bc_ea_tile_after(&t, jobs, n, G, hd, a->cov, budget);
		if ((rv = bc_ea_run_tile(c, *pg, g->dtype, *a, &t, G, hd, m.base,
		                         dj, segs, sc, prot, s)))
			return rv;
	}
	if ((rv = bc_bs_select("expected_attention rule", NULL, 0, 0, sc, NULL,
	                       prot, (uint8_t *)(d + m.drop),
	                       (const uint32_t *)(d + m.first),
	                       (const uint32_t *)(d + m.keep), segs, cn.nseg,
	                       NULL, 0, dout, s)))
		return rv;
	return bc_ps_finish(c, out, dout, out_words, s,
	                    "expected_attention rule");
}

static int bc_ea_run(void *ctx, const struct kvt_backend_paged *pg,
                     uint32_t n_records,
                     const struct kvt_backend_rule_geom *g,
                     const void *params, const void *jobs_, uint32_t n,
                     uint32_t *out, uint32_t out_words, void *stream)
{
	const ea_rule *a = (const ea_rule *)params;
	const ea_job *jobs = (const ea_job *)jobs_;
	return bc_es_entry(
		ctx, "expected_attention rule", pg, g, a, jobs, n, out,
		out_words,
		[&] {
			return bc_ea_check_args(n_records, g->n_heads,
			          g->n_kv_heads, g->head_dim, a, jobs, n,
			          out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_ea_run_locked(c, pg, g, a, jobs, n, out,
			                        out_words, (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_expected_attention_rule;
const struct kvt_backend_rule bc_expected_attention_rule = {
	/* .name = */ "expected_attention",
	/* .version = */ EXPECTED_ATTENTION_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct expected_attention_rule),
	/* .job_bytes = */ sizeof(struct expected_attention_rule_job),
	/* .run = */ bc_ea_run,
};
