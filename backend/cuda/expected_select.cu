/*
 * expected_select.cu — the cuda backend's `expected_select` op (backend.h):
 * Expected Attention's end-of-prefill selection computed where the keys,
 * the values and the window's queries are, so that only the drop indices
 * come to the host.  The kept sets are the cpu policy's bit for bit on the
 * CPU emulator: every step repeats ea_decide's operations in its order
 * (each kernel's comment names the host function it follows), and the
 * softmax's max and sum, whose order the bits depend on, run in one
 * thread.  The windows go in tiles (BC_EA_TILE_BYTES of scratch, one
 * tile where the call fits), each in at most 13 launches whatever its
 * windows and lists: the plan (bc_ps_plan), the statistics, the keys,
 * every K S' block of 64 keys as one problem of one grouped GEMM, z, the
 * softmaxes, the scores, one segmented top-k and the drop indices.  The
 * steps: docs/cuda.md, "Device ops, step by step".  The scratch is
 * window_select's (bc_win_prepare), under the context's lock; the op
 * waits for its output.  Tests: cuda.backend_expected_select_matches_naive,
 * _launches and the emulated passes.
 */
#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "batch_select.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "prompt_select.cuh"

#define BC_EA_THREADS 256
#define BC_EA_BLOCK 64u /* keys per K S' product: the policy's EA_BLOCK */

/* q of position p of a window's ring. */
static __device__ __forceinline__ const float *
bc_ea_q(const kvt_backend_expected &w, uint32_t p)
{
	const uint64_t row = p % w.rows.stage_tokens;
	return w.ring + row * w.rows.row_floats + w.rows.q_off;
}

/* RoPE frequency of pair k, as ea_freq (and model_rope) computes it. */
static __device__ __forceinline__ float bc_ea_freq(float theta, uint32_t k,
                                                   uint32_t hd)
{
	return 1.0f / powf(theta, (float)(2 * k) / (float)hd);
}

/* out[j] = 1 when a q value of window j's rows [from, P + n_new) is not
 * finite (the cpu policy refuses such a sync). */
__global__ void bc_ea_check(const kvt_backend_expected *wins, uint32_t nq,
                            uint32_t *out)
{
	__shared__ uint32_t bad;
	const kvt_backend_expected w = wins[blockIdx.x];
	if (threadIdx.x == 0)
		bad = 0;
	__syncthreads();
	const uint64_t n = (uint64_t)(w.P - w.from + w.n_new) * nq;
	uint32_t mine = 0;
	for (uint64_t e = threadIdx.x; e < n; e += blockDim.x)
		mine |= !isfinite(bc_ea_q(w, w.from + (uint32_t)(e / nq))[e % nq]);
	if (mine)
		atomicOr(&bad, 1u);
	__syncthreads();
	if (threadIdx.x == 0)
		out[blockIdx.x] = bad;
}

/*
 * A tile of a call: the windows wins [n] (some of the call's, each
 * with a due list at stats slot slot[k], else UINT32_MAX), their due
 * lists (segs, own: bc_ps_plan), and where the steps put their results:
 * per slot rc [hd], qs [maxN][H][hd], m and mu [H][hd], S' [H][hd][hd];
 * per entry of the tile's lists (tot, flat) keys [hd], z [G] (head j at
 * z[j tot + e]), K S' [G][hd] (head j at ks[(j tot + e) hd]); per list
 * and head the softmax's sum.
 */
struct bc_ea_tile {
	const kvt_backend_expected *wins;
	const kvt_backend_window_list *lists;
	const uint32_t *slot;
	const struct bc_seg *segs;
	const struct bc_ps_own *own;
	uint32_t n, nseg, tot, maxN, H, G, hd;
	double *rc, *m, *mu, *z, *sums;
	float *qs, *S, *keys, *ks;
};

/* The window of grid row k, and its stats slot (UINT32_MAX: none). */
#define BC_EA_ROWS(T, k) \
	for (uint32_t k = blockIdx.y; k < (T).n; k += gridDim.y)

/* Step 1 (ea_future_rot): rc [hd / 2][2] per window, the mean cos and
 * sin of the future positions' angles, each pair's sums in t order. */
__global__ void bc_ea_rot(const struct bc_ea_tile T)
{
	BC_EA_ROWS(T, k) {
		const kvt_backend_expected w = T.wins[k];
		const uint32_t sl = T.slot[k];
		if (sl == UINT32_MAX)
			continue;
		double *rc = T.rc + (uint64_t)sl * T.hd;
		for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x;
		     q < T.hd / 2; q += gridDim.x * blockDim.x) {
			double f = bc_ea_freq(w.theta, q, T.hd), c = 0.0, s = 0.0;
			for (uint32_t t = 0; t < w.future; t++) {
				double ang = ((double)w.P + t) * f;
				c += cos(ang);
				s += sin(ang);
			}
			rc[2 * q] = c / w.future;
			rc[2 * q + 1] = s / w.future;
		}
	}
}

/* Step 2 (ea_unrope): qs [N][H][hd] per window, the q of positions
 * [from, P) rotated back to before RoPE with the same float angles. */
__global__ void bc_ea_unrope(const struct bc_ea_tile T)
{
	const uint32_t hd = T.hd, nq = T.H * hd;
	BC_EA_ROWS(T, k) {
		const kvt_backend_expected w = T.wins[k];
		const uint32_t sl = T.slot[k];
		if (sl == UINT32_MAX)
			continue;
		float *qs = T.qs + (uint64_t)sl * T.maxN * nq;
		const uint64_t n = (uint64_t)(w.P - w.from) * nq;
		for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
			const uint32_t t = (uint32_t)(e / nq), r = (uint32_t)(e % nq);
			const uint32_t d = r % hd, q = d / 2, pos = w.from + t;
			const float *v = bc_ea_q(w, pos) + (r - d);
			float ang = (float)pos * bc_ea_freq(w.theta, q, hd);
			float c = cosf(ang), s = sinf(ang);
			float v0 = v[2 * q], v1 = v[2 * q + 1];
			qs[e] = d % 2 == 0 ? v0 * c + v1 * s : -v0 * s + v1 * c;
		}
	}
}

/* Step 3a (ea_stats): per window, query head j and pair q, m [H][hd]
 * (the means, summed in t order) and mu [H][hd] = R m. */
__global__ void bc_ea_mean(const struct bc_ea_tile T)
{
	const uint32_t hd = T.hd, half = hd / 2;
	BC_EA_ROWS(T, k) {
		const kvt_backend_expected w = T.wins[k];
		const uint32_t sl = T.slot[k], N = w.P - w.from;
		if (sl == UINT32_MAX)
			continue;
		const float *qs = T.qs + (uint64_t)sl * T.maxN * T.H * hd;
		const double *rc = T.rc + (uint64_t)sl * hd;
		for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
		     e < T.H * half; e += gridDim.x * blockDim.x) {
			const uint32_t j = e / half, q = e % half;
			double v0 = 0.0, v1 = 0.0;
			for (uint32_t t = 0; t < N; t++) {
				const float *x = qs + ((uint64_t)t * T.H + j) * hd;
				v0 += x[2 * q];
				v1 += x[2 * q + 1];
			}
			const double m0 = v0 / N, m1 = v1 / N;
			const double c = rc[2 * q], s = rc[2 * q + 1];
			const uint64_t o = ((uint64_t)sl * T.H + j) * hd;
			T.m[o + 2 * q] = m0;
			T.m[o + 2 * q + 1] = m1;
			T.mu[o + 2 * q] = c * m0 - s * m1;
			T.mu[o + 2 * q + 1] = s * m0 + c * m1;
		}
	}
}

/* Step 3b (ea_stats, cov), one thread per 2 x 2 block (rows 2a, 2a + 1,
 * columns 2b, 2b + 1) of query head j's S' [hd][hd] per window with cov:
 * its four covariances, each summed in t order from 0 and divided by N,
 * then R on the rows, then on the columns, rounded to float, as the host
 * does in place (so nothing [hd][hd] in double is kept). */
__global__ void bc_ea_cov(const struct bc_ea_tile T)
{
	const uint32_t hd = T.hd, half = hd / 2;
	BC_EA_ROWS(T, k) {
		const kvt_backend_expected w = T.wins[k];
		const uint32_t sl = T.slot[k], N = w.P - w.from;
		if (sl == UINT32_MAX || !w.cov)
			continue;
		const float *qs = T.qs + (uint64_t)sl * T.maxN * T.H * hd;
		const double *rc = T.rc + (uint64_t)sl * hd;
		const uint64_t n = (uint64_t)T.H * half * half;
		for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
			const uint32_t j = (uint32_t)(e / ((uint64_t)half * half));
			const uint32_t a = (uint32_t)(e / half % half),
			               b = (uint32_t)(e % half);
			const double *mj = T.m + ((uint64_t)sl * T.H + j) * hd;
			double C[2][2];
			for (uint32_t u = 0; u < 2; u++)
				for (uint32_t v = 0; v < 2; v++) {
					const uint32_t r = 2 * a + u, c = 2 * b + v;
					double x = 0.0;
					for (uint32_t t = 0; t < N; t++) {
						const float *q = qs + ((uint64_t)t * T.H +
						                       j) * hd;
						double dr = q[r] - mj[r];
						x += dr * (q[c] - mj[c]);
					}
					C[u][v] = x / N;
				}
			const double cr = rc[2 * a], sr = rc[2 * a + 1];
			const double cc = rc[2 * b], sc = rc[2 * b + 1];
			float *S = T.S + ((uint64_t)sl * T.H + j) * hd * hd;
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
}

/* The list record of segment l. */
static __device__ __forceinline__ const struct kvt_list_record *
bc_ea_rec(const kvt_backend_paged &pg, const struct bc_ea_tile &T, uint32_t l)
{
	const kvt_backend_expected &w = T.wins[T.own[l].win];
	return (const struct kvt_list_record *)((const char *)pg.records +
	        (uint64_t)T.lists[w.first_list + T.own[l].g].record *
	                pg.list_stride);
}

/* Step 4, grid (entries, lists): keys [len][hd] of every due list; a key
 * of a page beyond its record or of an unmapped chunk reads as NaN (a
 * daemon bug must not fault the context). */
template <typename E>
__global__ void bc_ea_keys(const kvt_backend_paged pg, const struct bc_ea_tile T)
{
	const uint32_t hd = T.hd;
	for (uint32_t l = blockIdx.y; l < T.nseg; l += gridDim.y) {
		const struct bc_seg sg = T.segs[l];
		const struct kvt_list_record *r = bc_ea_rec(pg, T, l);
		float *keys = T.keys + (uint64_t)sg.first * hd;
		const uint64_t n = (uint64_t)sg.L * hd;
		for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
		     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
			const E *row = (const E *)bc_entry_row(pg, r,
			                                       (uint32_t)(e / hd));
			keys[e] = row ? common_to_f(row[e % hd]) : nanf("");
		}
	}
}

/* The sizes of K S' blocks: group q of the grouped GEMM holds the
 * blocks of bc_ea_rows[q] keys (EA_BLOCK, then the shorter last blocks
 * by size); base[q] is its first problem. */
struct bc_ea_groups {
	uint32_t base[BC_EA_BLOCK];
};

static __host__ __device__ __forceinline__ uint32_t bc_ea_rows(uint32_t q)
{
	return q == 0 ? BC_EA_BLOCK : q;
}

/*
 * Step 5a, grid (BC_EA_BLOCK groups, one block each): the pointers of
 * every K S' problem of the tile, the blocks of ea_expect's
 * scorer_linear_cpu calls: for each list of a window with cov, in order,
 * and each query head j of its group, its blocks of rows keys (of
 * bc_ea_rows(blockIdx.x) keys each) by S' of head g G + j into ks.  One
 * block's scan over the lists places a group's problems in list, head,
 * block order from gr.base[blockIdx.x].
 */
__global__ void bc_ea_gemm_plan(const struct bc_ea_tile T,
                                const struct bc_ea_groups gr,
                                const float **W, const float **X, float **Y)
{
	__shared__ uint32_t before[BC_BS_THREADS + 1];
	const uint32_t q = blockIdx.x;
	const uint32_t t = threadIdx.x, nt = BC_BS_THREADS;
	const uint32_t per = (T.nseg + nt - 1) / nt;
	const uint32_t lo = t * per < T.nseg ? t * per : T.nseg;
	const uint32_t hi = lo + per < T.nseg ? lo + per : T.nseg;
	uint32_t c = 0;
	for (uint32_t l = lo; l < hi; l++) {
		const uint32_t L = T.segs[l].L;
		if (!T.wins[T.own[l].win].cov)
			continue;
		c += T.G * (q == 0 ? L / BC_EA_BLOCK : L % BC_EA_BLOCK == q);
	}
	before[t + 1] = c;
	__syncthreads();
	if (t == 0) {
		before[0] = gr.base[q];
		for (uint32_t k = 1; k <= nt; k++)
			before[k] += before[k - 1];
	}
	__syncthreads();
	uint32_t p = before[t];
	const uint32_t hd = T.hd;
	for (uint32_t l = lo; l < hi; l++) {
		const struct bc_seg sg = T.segs[l];
		const struct bc_ps_own o = T.own[l];
		if (!T.wins[o.win].cov)
			continue;
		const uint32_t b0 = q == 0 ? 0 : sg.L / BC_EA_BLOCK;
		const uint32_t nb = q == 0 ? sg.L / BC_EA_BLOCK
		                           : sg.L % BC_EA_BLOCK == q;
		for (uint32_t j = 0; j < T.G; j++)
			for (uint32_t b = b0; b < b0 + nb; b++, p++) {
				const uint64_t e = sg.first + (uint64_t)b * BC_EA_BLOCK;
				X[p] = T.keys + e * hd;
				W[p] = T.S + ((uint64_t)T.slot[o.win] * T.H +
				              (uint64_t)o.g * T.G + j) * hd * hd;
				Y[p] = T.ks + ((uint64_t)j * T.tot + e) * hd;
			}
	}
}

/* Step 5b (ea_expect), grid (entries, lists x heads): z of the
 * candidates [sinks, min(P, len)) of every list for query head j of its
 * group (mu' of head g G + j, K S' with cov), in double. */
__global__ void bc_ea_z(const struct bc_ea_tile T)
{
	const uint32_t hd = T.hd;
	for (uint32_t y = blockIdx.y; y < T.nseg * T.G; y += gridDim.y) {
		const uint32_t l = y / T.G, j = y % T.G;
		const struct bc_seg sg = T.segs[l];
		const struct bc_ps_own o = T.own[l];
		const kvt_backend_expected w = T.wins[o.win];
		const uint32_t hi = w.P < sg.L ? w.P : sg.L;
		const double *mu = T.mu + ((uint64_t)T.slot[o.win] * T.H +
		                           (uint64_t)o.g * T.G + j) * hd;
		for (uint32_t i = w.sinks + blockIdx.x * blockDim.x + threadIdx.x;
		     i < hi; i += gridDim.x * blockDim.x) {
			const uint64_t e = sg.first + (uint64_t)i;
			const float *k = T.keys + e * hd;
			const float *kS = T.ks + ((uint64_t)j * T.tot + e) * hd;
			double lin = 0.0, quad = 0.0;
			for (uint32_t d = 0; d < hd; d++)
				lin += mu[d] * k[d];
			if (w.cov)
				for (uint32_t d = 0; d < hd; d++)
					quad += (double)kS[d] * k[d];
			T.z[(uint64_t)j * T.tot + e] =
				lin / sqrt((double)hd) + quad / (2.0 * hd);
		}
	}
}

/* Step 5c (ea_expect), one block per list and head: the max and the sum
 * in index order by one thread (a tree would change the bits), the exps
 * in parallel; z holds the exps, sums[l G + j] the sum. */
__global__ void bc_ea_soft(const struct bc_ea_tile T)
{
	__shared__ double zmax;
	const uint32_t l = blockIdx.x / T.G, j = blockIdx.x % T.G;
	const struct bc_seg sg = T.segs[l];
	const kvt_backend_expected w = T.wins[T.own[l].win];
	const uint32_t lo = w.sinks, hi = w.P < sg.L ? w.P : sg.L;
	double *z = T.z + (uint64_t)j * T.tot + sg.first;
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
		T.sums[blockIdx.x] = v;
	}
}

/* Step 6 (ea_decide's tail), grid (entries, lists): acc = the sum over
 * the group's heads in order of e / sum / G, then s and the protection;
 * a candidate's value row (the page's V half, after its page_tokens K
 * rows) weighs it with vnorm; a value of a page beyond its record or of
 * an unmapped chunk makes the score NaN. */
template <typename E>
__global__ void bc_ea_score(const kvt_backend_paged pg,
                            const struct bc_ea_tile T, float *s,
                            uint8_t *prot)
{
	const uint32_t hd = T.hd;
	const double G = (double)T.G;
	for (uint32_t l = blockIdx.y; l < T.nseg; l += gridDim.y) {
		const struct bc_seg sg = T.segs[l];
		const kvt_backend_expected w = T.wins[T.own[l].win];
		const struct kvt_list_record *r = bc_ea_rec(pg, T, l);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < sg.L;
		     i += gridDim.x * blockDim.x) {
			const uint64_t e = sg.first + (uint64_t)i;
			const int cand = i >= w.sinks && i < w.P;
			double v = 0.0;
			for (uint32_t j = 0; cand && j < T.G; j++)
				v += T.z[(uint64_t)j * T.tot + e] /
				     T.sums[(uint64_t)l * T.G + j] / G;
			if (w.vnorm && cand) {
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
				v = (v + w.eps) * sqrt(ss);
			}
			s[e] = (float)v;
			prot[e] = !cand;
		}
	}
}

static uint32_t bc_ea_grid(uint64_t n)
{
	uint64_t b = (n + BC_EA_THREADS - 1) / BC_EA_THREADS;
	return b < 1 ? 1 : b > 4096 ? 4096 : (uint32_t)b;
}

static int bc_ea_check_args(uint32_t n_records, uint32_t n_heads,
                            uint32_t nkv, uint32_t hd,
                            const struct kvt_backend_expected *win,
                            uint32_t n_win,
                            const struct kvt_backend_window_list *lists,
                            uint32_t n_lists, uint32_t out_words)
{
	if (!hd || hd % 2 || !nkv || n_heads % nkv) {
		bc_note("expected_select: %u query heads on %u KV heads, "
		        "head_dim %u", n_heads, nkv, hd);
		return KVT_EINVAL;
	}
	uint32_t named = 0; /* lists named by the windows before */
	for (uint32_t j = 0; j < n_win; j++) {
		const struct kvt_backend_expected *w = &win[j];
		/* a window of no lists only has its rows checked */
		int sel = w->n_lists != 0;
		if (!w->ring || !w->rows.stage_tokens || w->from > w->P ||
		    (sel && (w->from == w->P || !w->future ||
		             !(w->theta > 0.0f) || w->n_lists != nkv)) ||
		    w->first_list > n_lists ||
		    w->n_lists > n_lists - w->first_list ||
		    w->rows.q_off + (uint64_t)n_heads * hd >
		            w->rows.row_floats ||
		    (uint64_t)w->P - w->from + w->n_new >
		            w->rows.stage_tokens ||
		    (sel && w->first_list < named)) {
			bc_note("expected_select: window %u: P %u, from %u, new "
			        "%u, future %u, lists %u + %u of %u (%u named "
			        "before)", j, w->P, w->from, w->n_new, w->future,
			        w->first_list, w->n_lists, n_lists, named);
			return KVT_EINVAL;
		}
		/* the lists' selections run at once: no list is two
		 * windows' (they name them in ascending order) */
		if (sel)
			named = w->first_list + w->n_lists;
	}
	return bc_ps_check_lists("expected_select", n_records, lists, n_lists,
	                         n_win, out_words);
}

/* The scratch a call may take for its tiles (its windows, lists and
 * output words aside): windows are taken in order while their tile fits,
 * one at least. */
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

/* The geometry of a call, what its tiles' sizes depend on. */
struct bc_ea_geo {
	uint32_t H, G, hd, maxN;
};

/* What the host counts of a tile, windows [w0, w1): the windows with a
 * due list (nstat), the due lists, their entries, the longest, whether
 * one has cov, and the K S' problems of each group (bc_ea_rows). */
struct bc_ea_count {
	uint32_t w0, w1, nstat, cov;
	uint64_t nseg, tot, nprob;
	uint32_t maxL;
	uint64_t cnt[BC_EA_BLOCK];
};

/* Scratch offsets of one tile, after base. */
struct bc_ea_mem {
	size_t slot, first, keep, segs, own, rc, qs, m, mu, S, keys, ks, z,
	       sums, s, prot, W, X, Y, need;
};

static struct bc_ea_mem bc_ea_layout(const struct bc_ea_count *t,
                                     const struct bc_ea_geo *g, size_t base)
{
	struct bc_ea_mem o;
	const uint64_t H = g->H, hd = g->hd, ns = t->nstat, tot = t->tot,
	               ptrs = bc_ps_al(t->nprob * sizeof(void *));
	o.slot = base;
	o.first = o.slot + bc_ps_al((size_t)(t->w1 - t->w0) * 4);
	o.keep = o.first + bc_ps_al((t->nseg + 1) * 4);
	o.segs = o.keep + bc_ps_al(t->nseg * 4);
	o.own = o.segs + bc_ps_al(t->nseg * sizeof(struct bc_seg));
	o.rc = o.own + bc_ps_al(t->nseg * sizeof(struct bc_ps_own));
	o.qs = o.rc + bc_ps_al(ns * hd * 8);
	o.m = o.qs + bc_ps_al(ns * g->maxN * H * hd * 4);
	o.mu = o.m + bc_ps_al(ns * H * hd * 8);
	o.S = o.mu + bc_ps_al(ns * H * hd * 8);
	o.keys = o.S + (t->cov ? bc_ps_al(ns * H * hd * hd * 4) : 0);
	o.ks = o.keys + bc_ps_al(tot * hd * 4);
	o.z = o.ks + (t->cov ? bc_ps_al(g->G * tot * hd * 4) : 0);
	o.sums = o.z + bc_ps_al(g->G * tot * 8);
	o.s = o.sums + bc_ps_al(g->G * t->nseg * 8);
	o.prot = o.s + bc_ps_al(tot * 4);
	o.W = o.prot + bc_ps_al(tot);
	o.X = o.W + ptrs;
	o.Y = o.X + ptrs;
	o.need = o.Y + ptrs;
	return o;
}

/* Adds window k's due lists to t. */
static void bc_ea_add(struct bc_ea_count *t,
                      const struct kvt_backend_expected *w,
                      const struct kvt_backend_window_list *lists,
                      const struct bc_ea_geo *g)
{
	const uint64_t nseg = t->nseg;
	for (uint32_t q = 0; q < w->n_lists; q++) {
		const struct kvt_backend_window_list *L = &lists[w->first_list + q];
		if (!bc_ps_due(*w, *L))
			continue;
		t->nseg++;
		t->tot += L->len;
		t->maxL = L->len > t->maxL ? L->len : t->maxL;
		if (!w->cov)
			continue;
		t->cov = 1;
		t->cnt[0] += (uint64_t)g->G * (L->len / BC_EA_BLOCK);
		if (L->len % BC_EA_BLOCK)
			t->cnt[L->len % BC_EA_BLOCK] += g->G;
		t->nprob += (uint64_t)g->G * ((L->len + BC_EA_BLOCK - 1) /
		                              BC_EA_BLOCK);
	}
	t->nstat += t->nseg != nseg;
}

/* The tile from window w0: the windows after it while the tile's
 * scratch stays within budget bytes (one at least). */
static struct bc_ea_count bc_ea_tile_at(const struct kvt_backend_expected *win,
                                        uint32_t n_win, uint32_t w0,
                                        const struct kvt_backend_window_list *lists,
                                        const struct bc_ea_geo *g,
                                        size_t budget)
{
	struct bc_ea_count t;
	memset(&t, 0, sizeof(t));
	t.w0 = t.w1 = w0;
	while (t.w1 < n_win) {
		struct bc_ea_count more = t;
		bc_ea_add(&more, &win[t.w1], lists, g);
		more.w1++;
		if (t.w1 > t.w0 && more.nseg > t.nseg &&
		    bc_ea_layout(&more, g, 0).need > budget)
			break;
		t = more;
	}
	return t;
}

/* The tile's view of the scratch d (layout o), its windows at dwin. */
static struct bc_ea_tile bc_ea_view(char *d, const struct bc_ea_mem &o,
                                    const struct bc_ea_count *t,
                                    const struct bc_ea_geo *g,
                                    const kvt_backend_expected *dwin,
                                    const kvt_backend_window_list *dlists)
{
	struct bc_ea_tile T;
	T.wins = dwin + t->w0;
	T.lists = dlists;
	T.slot = (const uint32_t *)(d + o.slot);
	T.segs = (const struct bc_seg *)(d + o.segs);
	T.own = (const struct bc_ps_own *)(d + o.own);
	T.n = t->w1 - t->w0;
	T.nseg = (uint32_t)t->nseg;
	T.tot = (uint32_t)t->tot;
	T.maxN = g->maxN;
	T.H = g->H;
	T.G = g->G;
	T.hd = g->hd;
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

/* Steps 1 to 4 of a tile: every window's statistics and every list's
 * keys (four or five launches). */
static int bc_ea_stats(const struct bc_ea_tile &T, const struct bc_ea_count *t,
                       const kvt_backend_paged &p, enum kvt_dtype dt,
                       cudaStream_t s)
{
	const uint32_t hd = T.hd, half = hd / 2, rows = bc_bs_rows(T.n);
	KVT_LAUNCH(bc_ea_rot, dim3(bc_ea_grid(half), rows), BC_EA_THREADS, 0,
	           s, T);
	KVT_LAUNCH(bc_ea_unrope,
	           dim3(bc_ea_grid((uint64_t)T.maxN * T.H * hd), rows),
	           BC_EA_THREADS, 0, s, T);
	KVT_LAUNCH(bc_ea_mean, dim3(bc_ea_grid((uint64_t)T.H * half), rows),
	           BC_EA_THREADS, 0, s, T);
	if (t->cov)
		KVT_LAUNCH(bc_ea_cov,
		           dim3(bc_ea_grid((uint64_t)T.H * half * half), rows),
		           BC_EA_THREADS, 0, s, T);
	BC_CALL(cudaGetLastError(), "expected_select statistics");
	BC_EA_DISPATCH(bc_ea_keys, dt,
	               dim3(bc_ea_grid((uint64_t)t->maxL * hd),
	                    bc_bs_rows(T.nseg)),
	               s, p, T);
	BC_CALL(cudaGetLastError(), "expected_select keys");
	return 0;
}

/* Step 5a of a tile: every K S' block, the problems planned on the
 * device and run as one grouped GEMM, each problem the call ea_expect
 * makes through scorer_linear_cpu (blas_xwt's; S' is symmetric, so the
 * kernel's K S'^T is K S'). */
static int bc_ea_products(cublasHandle_t h, const struct bc_ea_tile &T,
                          const struct bc_ea_count *t, char *d,
                          const struct bc_ea_mem &o, cudaStream_t s)
{
	if (!t->nprob)
		return 0;
	if (t->nprob > INT32_MAX) {
		bc_note("expected_select: %llu K S' products in a tile",
		        (unsigned long long)t->nprob);
		return KVT_EINVAL;
	}
	struct bc_ea_groups gr;
	uint64_t at = 0;
	for (uint32_t q = 0; q < BC_EA_BLOCK; q++) {
		gr.base[q] = (uint32_t)at;
		at += t->cnt[q];
	}
	KVT_LAUNCH(bc_ea_gemm_plan, BC_EA_BLOCK, BC_BS_THREADS, 0, s, T, gr,
	           (const float **)(d + o.W), (const float **)(d + o.X),
	           (float **)(d + o.Y));
	BC_CALL(cudaGetLastError(), "expected_select products plan");
	struct blas_grouped g;
	memset(&g, 0, sizeof(g));
	int rv = blas_grouped_reset(&g, (uint32_t)t->nprob);
	for (uint32_t q = 0; !rv && q < BC_EA_BLOCK; q++)
		for (uint64_t k = 0; !rv && k < t->cnt[q]; k++)
			rv = blas_grouped_add(&g, bc_ea_rows(q), T.hd, T.hd,
			                      0.0f);
	if (!rv)
		rv = blas_grouped_run(h, &g, (const float *const *)(d + o.W),
		                      (const float *const *)(d + o.X),
		                      (float *const *)(d + o.Y), s);
	blas_grouped_free(&g);
	if (rv)
		bc_note("expected_select: the K S' grouped GEMM failed");
	return rv;
}

/*
 * One tile, queued on s: the plan (bc_ps_plan), the statistics, the
 * keys, K S' (the products' plan and one grouped GEMM, with cov), z, the
 * softmaxes, the scores, the segmented top-k and the drop indices: 13
 * launches at most whatever its windows and lists.
 */
static int bc_ea_run_tile(struct bc_ctx *c, const kvt_backend_paged &p,
                          enum kvt_dtype dt, const struct bc_ea_count *t,
                          const struct bc_ea_geo *g, size_t base,
                          const kvt_backend_expected *dwin,
                          const kvt_backend_window_list *dlists,
                          uint32_t n_win, uint32_t n_lists, uint32_t *dout,
                          cudaStream_t s)
{
	if (!t->nseg)
		return 0;
	char *d = c->d_win;
	const struct bc_ea_mem o = bc_ea_layout(t, g, base);
	const struct bc_ea_tile T = bc_ea_view(d, o, t, g, dwin, dlists);
	uint32_t *first = (uint32_t *)(d + o.first),
	         *keep = (uint32_t *)(d + o.keep);
	KVT_LAUNCH(bc_ps_plan<kvt_backend_expected>, 1, BC_BS_THREADS, 0, s,
	           T.wins, T.n, n_win, dlists, n_lists, first, keep,
	           (struct bc_seg *)(d + o.segs), (struct bc_ps_own *)(d + o.own),
	           (uint32_t *)(d + o.slot));
	BC_CALL(cudaGetLastError(), "expected_select plan");
	int rv = bc_ea_stats(T, t, p, dt, s);
	if (!rv)
		rv = bc_ea_products((cublasHandle_t)c->win_blas, T, t, d, o, s);
	if (rv)
		return rv;
	const uint32_t rows = bc_bs_rows(T.nseg);
	KVT_LAUNCH(bc_ea_z, dim3(bc_ea_grid(t->maxL),
	                         bc_bs_rows(T.nseg * T.G)),
	           BC_EA_THREADS, 0, s, T);
	KVT_LAUNCH(bc_ea_soft, T.nseg * T.G, BC_EA_THREADS, 0, s, T);
	BC_CALL(cudaGetLastError(), "expected_select softmax");
	float *sc = (float *)(d + o.s);
	uint8_t *prot = (uint8_t *)(d + o.prot);
	BC_EA_DISPATCH(bc_ea_score, dt, dim3(bc_ea_grid(t->maxL), rows), s, p,
	               T, sc, prot);
	BC_CALL(cudaGetLastError(), "expected_select score");
	/* drop over the keys, dead by then */
	return bc_ps_select("expected_select", sc, prot, (uint8_t *)T.keys,
	                    first, keep, T.segs, T.nseg, dout, s);
}

/*
 * The launches of one call: the rows' check, then per tile (its windows'
 * scratch within BC_EA_TILE_BYTES, so one tile where the call's lists
 * fit) at most 13 (bc_ea_run_tile); the windows and the lists go up in
 * two copies, the output comes back in one.
 */
static int bc_expected_locked(struct bc_ctx *c,
                              const struct kvt_backend_paged *pg,
                              enum kvt_dtype dt, uint32_t H, uint32_t nkv,
                              uint32_t hd,
                              const struct kvt_backend_expected *win,
                              uint32_t n_win,
                              const struct kvt_backend_window_list *lists,
                              uint32_t n_lists, uint32_t *out,
                              uint32_t out_words, cudaStream_t s)
{
	struct bc_ea_geo g = {H, H / nkv, hd, 1};
	const size_t budget = bc_ea_budget();
	for (uint32_t j = 0; j < n_win; j++)
		if (win[j].n_lists && win[j].P - win[j].from > g.maxN)
			g.maxN = win[j].P - win[j].from;
	const size_t o_win = bc_ps_al((size_t)out_words * 4),
	             o_lists = o_win + bc_ps_al((size_t)n_win * sizeof(*win)),
	             base = o_lists + bc_ps_al((size_t)n_lists * sizeof(*lists));
	size_t need = base;
	for (uint32_t w0 = 0; w0 < n_win;) {
		struct bc_ea_count t = bc_ea_tile_at(win, n_win, w0, lists, &g,
		                                         budget);
		if (t.tot > UINT32_MAX || t.nseg * g.G > UINT32_MAX) {
			bc_note("expected_select: %llu entries in window %u",
			        (unsigned long long)t.tot, w0);
			return KVT_EINVAL;
		}
		size_t n = bc_ea_layout(&t, &g, base).need;
		need = n > need ? n : need;
		w0 = t.w1;
	}
	int rv = bc_win_prepare(c, need);
	if (rv)
		return rv;
	char *d = c->d_win;
	uint32_t *dout = (uint32_t *)d;
	kvt_backend_expected *dwin = (kvt_backend_expected *)(d + o_win);
	kvt_backend_window_list *dlists = (kvt_backend_window_list *)(d + o_lists);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "expected_select");
	BC_CALL(cudaMemcpyAsync(dwin, win, (size_t)n_win * sizeof(*win),
	                        cudaMemcpyHostToDevice, s),
	        "expected_select");
	BC_CALL(cudaMemcpyAsync(dlists, lists, (size_t)n_lists * sizeof(*lists),
	                        cudaMemcpyHostToDevice, s),
	        "expected_select");
	bc_count(c, (uint64_t)n_win * sizeof(*win) +
	                    (uint64_t)n_lists * sizeof(*lists), 0);
	KVT_LAUNCH(bc_ea_check, n_win, BC_EA_THREADS, 0, s, dwin, H * hd, dout);
	BC_CALL(cudaGetLastError(), "expected_select check");
	for (uint32_t w0 = 0; w0 < n_win;) {
		struct bc_ea_count t = bc_ea_tile_at(win, n_win, w0, lists, &g,
		                                         budget);
		if ((rv = bc_ea_run_tile(c, *pg, dt, &t, &g, base, dwin, dlists,
		                         n_win, n_lists, dout, s)))
			return rv;
		w0 = t.w1;
	}
	return bc_ps_finish(c, out, dout, out_words, s, "expected_select");
}

int bc_expected_select(void *ctx, const struct kvt_backend_paged *pg,
                       uint32_t n_records, enum kvt_dtype dtype,
                       uint32_t n_heads, uint32_t n_kv_heads,
                       uint32_t head_dim,
                       const struct kvt_backend_expected *win, uint32_t n_win,
                       const struct kvt_backend_window_list *lists,
                       uint32_t n_lists, uint32_t *out, uint32_t out_words,
                       void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n_win)
		return 0;
	int rv = bc_ps_check_call("expected_select", pg, win, n_win, lists, n_lists,
	                          dtype, out, out_words);
	if (rv)
		return rv;
	rv = bc_ea_check_args(n_records, n_heads, n_kv_heads, head_dim, win,
	                          n_win, lists, n_lists, out_words);
	if (rv)
		return rv;
	pthread_mutex_lock(&c->lock);
	rv = bc_expected_locked(c, pg, dtype, n_heads, n_kv_heads, head_dim,
	                        win, n_win, lists, n_lists, out, out_words,
	                        (cudaStream_t)stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
