/*
 * expected_select.cu — the cuda backend's `expected_select` op (backend.h):
 * Expected Attention's end-of-prefill selection computed where the keys,
 * the values and the window's queries are, so that only the drop indices
 * come to the host.  The kept sets are the cpu policy's bit for bit on the
 * CPU emulator: every step repeats ea_decide's operations in its order
 * (each kernel's comment names the host function it follows), and the
 * softmax's max and sum, whose order the bits depend on, run in one
 * thread.  The steps: docs/cuda.md, "Device ops, step by step".  The
 * scratch is window_select's (bc_win_prepare), under the context's lock;
 * the op waits for its output.  Tests:
 * cuda.backend_expected_select_matches_naive and the emulated passes.
 */
#include <cublas_v2.h>
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "prompt_select.cuh"
#include "select_topk.cuh"

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

/* Step 1 (ea_future_rot): rc [hd / 2][2], the mean cos and sin of the
 * future positions' angles, each pair's sums in t order. */
__global__ void bc_ea_rot(const kvt_backend_expected *wins, uint32_t wi,
                          uint32_t hd, double *rc)
{
	const kvt_backend_expected w = wins[wi];
	for (uint32_t k = threadIdx.x; k < hd / 2; k += blockDim.x) {
		double f = bc_ea_freq(w.theta, k, hd), c = 0.0, s = 0.0;
		for (uint32_t t = 0; t < w.future; t++) {
			double ang = ((double)w.P + t) * f;
			c += cos(ang);
			s += sin(ang);
		}
		rc[2 * k] = c / w.future;
		rc[2 * k + 1] = s / w.future;
	}
}

/* Step 2 (ea_unrope): qs [N][H][hd] (nq = H hd), the q of positions
 * [from, P) rotated back to before RoPE with the same float angles. */
__global__ void bc_ea_unrope(const kvt_backend_expected *wins, uint32_t wi,
                             uint32_t nq, uint32_t hd, float *qs)
{
	const kvt_backend_expected w = wins[wi];
	const uint64_t n = (uint64_t)(w.P - w.from) * nq;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t t = (uint32_t)(e / nq), r = (uint32_t)(e % nq);
		const uint32_t d = r % hd, k = d / 2, pos = w.from + t;
		const float *v = bc_ea_q(w, pos) + (r - d);
		float ang = (float)pos * bc_ea_freq(w.theta, k, hd);
		float c = cosf(ang), s = sinf(ang);
		float v0 = v[2 * k], v1 = v[2 * k + 1];
		qs[e] = d % 2 == 0 ? v0 * c + v1 * s : -v0 * s + v1 * c;
	}
}

/* Step 3a (ea_stats): per query head j and pair k, m [H][hd] (the means,
 * summed in t order) and mu [H][hd] = R m. */
__global__ void bc_ea_mean(uint32_t N, uint32_t H, uint32_t hd,
                           const float *qs, const double *rc, double *m,
                           double *mu)
{
	const uint32_t half = hd / 2;
	for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < H * half;
	     e += gridDim.x * blockDim.x) {
		const uint32_t j = e / half, k = e % half;
		double v0 = 0.0, v1 = 0.0;
		for (uint32_t t = 0; t < N; t++) {
			const float *q = qs + ((uint64_t)t * H + j) * hd;
			v0 += q[2 * k];
			v1 += q[2 * k + 1];
		}
		const double m0 = v0 / N, m1 = v1 / N;
		const double c = rc[2 * k], s = rc[2 * k + 1];
		double *mj = m + (uint64_t)j * hd, *uj = mu + (uint64_t)j * hd;
		mj[2 * k] = m0;
		mj[2 * k + 1] = m1;
		uj[2 * k] = c * m0 - s * m1;
		uj[2 * k + 1] = s * m0 + c * m1;
	}
}

/* Step 3b (ea_stats, cov): tmp [H][hd][hd], the covariance, each element
 * summed in t order from 0 and divided by N. */
__global__ void bc_ea_cov(uint32_t N, uint32_t H, uint32_t hd,
                          const float *qs, const double *m, double *tmp)
{
	const uint64_t n = (uint64_t)H * hd * hd;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t j = (uint32_t)(e / ((uint64_t)hd * hd));
		const uint32_t r = (uint32_t)(e / hd % hd), c = (uint32_t)(e % hd);
		const double *mj = m + (uint64_t)j * hd;
		double v = 0.0;
		for (uint32_t t = 0; t < N; t++) {
			const float *q = qs + ((uint64_t)t * H + j) * hd;
			double dr = q[r] - mj[r];
			v += dr * (q[c] - mj[c]);
		}
		tmp[e] = v / N;
	}
}

/* Step 3c (ea_stats, cov): S [H][hd][hd] = (float) R tmp R^T, R applied to
 * the rows first, then to the columns, as the host does in place. */
__global__ void bc_ea_rotate(uint32_t H, uint32_t hd, const double *tmp,
                             const double *rc, float *S)
{
	const uint32_t half = hd / 2;
	const uint64_t n = (uint64_t)H * hd * half;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t j = (uint32_t)(e / ((uint64_t)hd * half));
		const uint32_t row = (uint32_t)(e / half % hd);
		const uint32_t kc = (uint32_t)(e % half), kr = row / 2;
		const double *T = tmp + (uint64_t)j * hd * hd;
		const double cr = rc[2 * kr], sr = rc[2 * kr + 1];
		double b[2];
		for (uint32_t u = 0; u < 2; u++) {
			const uint32_t col = 2 * kc + u;
			double a0 = T[(uint64_t)(2 * kr) * hd + col];
			double a1 = T[(uint64_t)(2 * kr + 1) * hd + col];
			b[u] = row % 2 == 0 ? cr * a0 - sr * a1 : sr * a0 + cr * a1;
		}
		const double c = rc[2 * kc], s = rc[2 * kc + 1];
		float *o = S + ((uint64_t)j * hd + row) * hd;
		o[2 * kc] = (float)(c * b[0] - s * b[1]);
		o[2 * kc + 1] = (float)(s * b[0] + c * b[1]);
	}
}

/* Step 4: keys [len][hd] of the list whose record is given; a key of a page
 * beyond its record or of an unmapped chunk reads as NaN (a daemon bug
 * must not fault the context). */
template <typename T>
__global__ void bc_ea_keys(const kvt_backend_paged pg, uint32_t record,
                           uint32_t len, uint32_t hd, float *keys)
{
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		                                 (uint64_t)record * pg.list_stride);
	const uint64_t n = (uint64_t)len * hd;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < n; e += (uint64_t)gridDim.x * blockDim.x) {
		const T *row = (const T *)bc_entry_row(pg, r, (uint32_t)(e / hd));
		keys[e] = row ? common_to_f(row[e % hd]) : nanf("");
	}
}

/* Step 5 (ea_expect): z [len] of the candidates [lo, hi) for one query
 * head, mu [hd] its mu', ks [len][hd] its K S' (cov). */
__global__ void bc_ea_z(uint32_t lo, uint32_t hi, uint32_t hd, uint32_t cov,
                        const float *keys, const float *ks, const double *mu,
                        double *z)
{
	for (uint32_t i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi;
	     i += gridDim.x * blockDim.x) {
		const float *k = keys + (uint64_t)i * hd;
		const float *kS = ks + (uint64_t)i * hd;
		double lin = 0.0, quad = 0.0;
		for (uint32_t d = 0; d < hd; d++)
			lin += mu[d] * k[d];
		if (cov)
			for (uint32_t d = 0; d < hd; d++)
				quad += (double)kS[d] * k[d];
		z[i] = lin / sqrt((double)hd) + quad / (2.0 * hd);
	}
}

/* Step 5, one block (ea_expect): the max and the sum in index order by one
 * thread (a tree would change the bits), the exps and acc's updates in
 * parallel. */
__global__ void bc_ea_soft(uint32_t lo, uint32_t hi, double G, double *z,
                           double *acc)
{
	__shared__ double zmax, sum;
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
		sum = v;
	}
	__syncthreads();
	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
		acc[i] += z[i] / sum / G;
}

/* Step 6 (ea_decide's tail): s [len] and protect [len]; a candidate's
 * value row (the page's V half, after its page_tokens K rows) weighs it
 * with vnorm; a value of a page beyond its record or of an unmapped chunk
 * makes the score NaN. */
template <typename T>
__global__ void bc_ea_score(const kvt_backend_paged pg, uint32_t record,
                            uint32_t len, uint32_t lo, uint32_t P, uint32_t hd,
                            uint32_t vnorm, double eps, const double *acc,
                            float *s, uint8_t *prot)
{
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		                                 (uint64_t)record * pg.list_stride);
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < len;
	     i += gridDim.x * blockDim.x) {
		const int cand = i >= lo && i < P;
		double v = acc[i];
		if (vnorm && cand) {
			const char *row = bc_entry_row(pg, r, i);
			double ss = nan("");
			if (row) {
				const T *vr = (const T *)(row + (uint64_t)pg.page_tokens *
				                                        pg.row_bytes);
				ss = 0.0;
				for (uint32_t d = 0; d < hd; d++) {
					float x = common_to_f(vr[d]);
					ss += (double)x * x;
				}
			}
			v = (v + eps) * sqrt(ss);
		}
		s[i] = (float)v;
		prot[i] = !cand;
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
		            w->rows.stage_tokens) {
			bc_note("expected_select: window %u: P %u, from %u, new "
			        "%u, future %u, lists %u + %u of %u", j, w->P,
			        w->from, w->n_new, w->future, w->first_list,
			        w->n_lists, n_lists);
			return KVT_EINVAL;
		}
	}
	return bc_ps_check_lists("expected_select", n_records, lists, n_lists,
	                         n_win, out_words);
}

/* Scratch of one call: byte offsets into c->d_win. */
struct bc_ea_lay {
	size_t win, out, rc, qs, m, mu, tmp, S, keys, ks, z, acc, s, prot, drop;
	size_t need;
};

static struct bc_ea_lay bc_ea_layout(uint32_t n_win, uint32_t out_words,
                                     uint64_t H, uint64_t hd, uint64_t maxn,
                                     uint64_t maxlen)
{
	struct bc_ea_lay o;
	o.win = 0;
	o.out = o.win + bc_ps_al((size_t)n_win * sizeof(kvt_backend_expected));
	o.rc = o.out + bc_ps_al((size_t)out_words * 4);
	o.qs = o.rc + bc_ps_al(hd * 8);
	o.m = o.qs + bc_ps_al(maxn * H * hd * 4);
	o.mu = o.m + bc_ps_al(H * hd * 8);
	o.tmp = o.mu + bc_ps_al(H * hd * 8);
	o.S = o.tmp + bc_ps_al(H * hd * hd * 8);
	o.keys = o.S + bc_ps_al(H * hd * hd * 4);
	o.ks = o.keys + bc_ps_al(maxlen * hd * 4);
	o.z = o.ks + bc_ps_al(maxlen * hd * 4);
	o.acc = o.z + bc_ps_al(maxlen * 8);
	o.s = o.acc + bc_ps_al(maxlen * 8);
	o.prot = o.s + bc_ps_al(maxlen * 4);
	o.drop = o.prot + bc_ps_al(maxlen);
	o.need = o.drop + bc_ps_al(maxlen);
	return o;
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

/* Steps 4 to 6 for list L (KV head g) of window w (index wi), the
 * window's statistics in mu and S. */
static int bc_ea_list(cublasHandle_t h, const kvt_backend_paged &p,
                      enum kvt_dtype dt, const struct kvt_backend_expected *w,
                      const struct kvt_backend_window_list *L, uint32_t li,
                      uint32_t g, uint32_t G, uint32_t hd, uint32_t n_win,
                      uint32_t n_lists, char *d, const struct bc_ea_lay &o,
                      cudaStream_t s)
{
	const uint32_t len = L->len, lo = w->sinks,
	               hi = w->P < len ? w->P : len;
	if (lo >= hi)
		return 0; /* no candidate: nothing dropped (the count is 0) */
	float *keys = (float *)(d + o.keys), *ks = (float *)(d + o.ks),
	      *S = (float *)(d + o.S), *sc = (float *)(d + o.s);
	double *mu = (double *)(d + o.mu), *z = (double *)(d + o.z),
	       *acc = (double *)(d + o.acc);
	uint8_t *prot = (uint8_t *)(d + o.prot), *drop = (uint8_t *)(d + o.drop);
	uint32_t *dout = (uint32_t *)(d + o.out);
	BC_EA_DISPATCH(bc_ea_keys, dt, bc_ea_grid((uint64_t)len * hd), s, p,
	               L->record, len, hd, keys);
	BC_CALL(cudaGetLastError(), "expected_select keys");
	BC_CALL(cudaMemsetAsync(acc, 0, (size_t)len * 8, s), "expected_select");
	int rv;
	for (uint32_t j = 0; j < G; j++) {
		const uint64_t hj = (uint64_t)g * G + j;
		/* K S' block by block, as ea_expect calls scorer_linear_cpu
		 * (S' is symmetric: the kernel's K S'^T is K S') */
		for (uint32_t b = 0; w->cov && b < len; b += BC_EA_BLOCK) {
			uint32_t nb = len - b < BC_EA_BLOCK ? len - b : BC_EA_BLOCK;
			if ((rv = blas_xwt(h, keys + (uint64_t)b * hd, nb, hd,
			                   S + hj * hd * hd, hd,
			                   ks + (uint64_t)b * hd, s))) {
				bc_note("expected_select: cublasSgemm failed");
				return rv;
			}
		}
		KVT_LAUNCH(bc_ea_z, bc_ea_grid(hi - lo), BC_EA_THREADS, 0, s, lo,
		           hi, hd, w->cov, keys, ks, mu + hj * hd, z);
		KVT_LAUNCH(bc_ea_soft, 1, BC_EA_THREADS, 0, s, lo, hi, (double)G,
		           z, acc);
		BC_CALL(cudaGetLastError(), "expected_select softmax");
	}
	BC_EA_DISPATCH(bc_ea_score, dt, bc_ea_grid(len), s, p, L->record, len,
	               lo, w->P, hd, w->vnorm, w->eps, acc, sc, prot);
	BC_CALL(cudaGetLastError(), "expected_select score");
	if ((rv = select_topk_cuda(sc, NULL, prot, len, L->keep, drop, NULL,
	                           NULL, s)))
		return rv;
	KVT_LAUNCH(bc_ps_indices, 1, BC_PS_IDX_THREADS, 0, s, drop, len,
	           dout + n_win + n_lists + L->drop_off, L->n_drop,
	           dout + n_win + li);
	BC_CALL(cudaGetLastError(), "expected_select indices");
	return 0;
}

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
	const uint32_t G = H / nkv, nq = H * hd;
	uint64_t maxlen = 1, maxn = 1;
	for (uint32_t l = 0; l < n_lists; l++)
		maxlen = lists[l].len > maxlen ? lists[l].len : maxlen;
	for (uint32_t j = 0; j < n_win; j++)
		if (win[j].n_lists && win[j].P - win[j].from > maxn)
			maxn = win[j].P - win[j].from;
	const struct bc_ea_lay o = bc_ea_layout(n_win, out_words, H, hd, maxn,
	                                        maxlen);
	int rv = bc_win_prepare(c, o.need);
	if (rv)
		return rv;
	cublasHandle_t h = (cublasHandle_t)c->win_blas;
	char *d = c->d_win;
	kvt_backend_expected *dwin = (kvt_backend_expected *)(d + o.win);
	uint32_t *dout = (uint32_t *)(d + o.out);
	double *rc = (double *)(d + o.rc), *m = (double *)(d + o.m),
	       *mu = (double *)(d + o.mu), *tmp = (double *)(d + o.tmp);
	float *qs = (float *)(d + o.qs), *S = (float *)(d + o.S);
	/* the windows' descriptors go to the device in one copy, counted
	 * like every other */
	cudaError_t e = cudaMemcpyAsync(dwin, win, (size_t)n_win * sizeof(*win),
	                                cudaMemcpyHostToDevice, s);
	if (e != cudaSuccess)
		return bc_cuda(e, "expected_select");
	bc_count(c, (uint64_t)n_win * sizeof(*win), 0);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "expected_select");
	KVT_LAUNCH(bc_ea_check, n_win, BC_EA_THREADS, 0, s, dwin, nq, dout);
	BC_CALL(cudaGetLastError(), "expected_select");
	const kvt_backend_paged p = *pg;
	for (uint32_t j = 0; j < n_win; j++) {
		const struct kvt_backend_expected *w = &win[j];
		if (!w->n_lists)
			continue;
		const uint32_t N = w->P - w->from;
		KVT_LAUNCH(bc_ea_rot, 1, BC_EA_THREADS, 0, s, dwin, j, hd, rc);
		KVT_LAUNCH(bc_ea_unrope, bc_ea_grid((uint64_t)N * nq),
		           BC_EA_THREADS, 0, s, dwin, j, nq, hd, qs);
		KVT_LAUNCH(bc_ea_mean, bc_ea_grid((uint64_t)H * hd / 2),
		           BC_EA_THREADS, 0, s, N, H, hd, qs, rc, m, mu);
		if (w->cov) {
			KVT_LAUNCH(bc_ea_cov, bc_ea_grid((uint64_t)H * hd * hd),
			           BC_EA_THREADS, 0, s, N, H, hd, qs, m, tmp);
			KVT_LAUNCH(bc_ea_rotate,
			           bc_ea_grid((uint64_t)H * hd * hd / 2),
			           BC_EA_THREADS, 0, s, H, hd, tmp, rc, S);
		}
		BC_CALL(cudaGetLastError(), "expected_select statistics");
		for (uint32_t g = 0; g < w->n_lists; g++) {
			const uint32_t li = w->first_list + g;
			if (!lists[li].len)
				continue;
			if ((rv = bc_ea_list(h, p, dt, w, &lists[li], li, g, G, hd,
			                     n_win, n_lists, d, o, s)))
				return rv;
		}
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
