/*
 * window_select.cu — the cuda backend's `window_select` op (backend.h):
 * SnapKV's end-of-prefill selection (snapkv and pyramidkv) computed where
 * the keys and the window's queries are, so that only the drop indices
 * (4 bytes each) come to the host.  The whole call in six launches
 * whatever its windows and lists: the rows' check, the plan
 * (batch_select.cuh's bc_ps_plan, so that only the caller's windows and
 * lists cross), one thread per entry of every list doing the cpu
 * policy's float operations one for one (the logits in attn_band_cpu's
 * order, band_logits.cuh), the pooling, one segmented top-k and the drop
 * indices.  The steps: docs/cuda.md, "Device ops, step by step".
 * Everything runs on the caller's stream; the scratch (bc_win_prepare)
 * is the context's, under its lock, and the op waits for its output.
 * Tests: cuda.backend_window_select_matches_naive, _launches and the
 * emulated passes of `make test`.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "batch_select.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "prompt_select.cuh"

#define BC_WIN_THREADS 256

/* Row of position p of a window's ring. */
static __device__ __forceinline__ const float *
bc_win_row(const kvt_backend_window &w, uint32_t p)
{
	return w.ring + (uint64_t)(p % w.rows.stage_tokens) * w.rows.row_floats;
}

/* out[j] = 1 when a q or lse value of window j's rows [P - w, P + n_new)
 * is not finite (the cpu policy refuses such a sync). */
__global__ void bc_win_check(const kvt_backend_window *wins, uint32_t n_heads,
                             uint32_t head_dim, uint32_t *out)
{
	__shared__ uint32_t bad;
	const kvt_backend_window w = wins[blockIdx.x];
	if (threadIdx.x == 0)
		bad = 0;
	__syncthreads();
	const uint32_t nq = n_heads * head_dim, per = nq + n_heads;
	const uint64_t n = (uint64_t)(w.w + w.n_new) * per;
	uint32_t mine = 0;
	for (uint64_t e = threadIdx.x; e < n; e += blockDim.x) {
		const float *row = bc_win_row(w, w.P - w.w + (uint32_t)(e / per));
		uint32_t k = (uint32_t)(e % per);
		float v = k < nq ? row[w.rows.q_off + k]
		                 : row[w.rows.lse_off + k - nq];
		mine |= !isfinite(v);
	}
	if (mine)
		atomicOr(&bad, 1u);
	__syncthreads();
	if (threadIdx.x == 0)
		out[blockIdx.x] = bad;
}

/* The ring row of query t of window w's observation window. */
static __device__ __forceinline__ const float *
bc_win_qrow(const kvt_backend_window &w, uint32_t t)
{
	return bc_win_row(w, w.P - w.w + t);
}

/*
 * Every due list's entries in one launch, grid (entries, lists), one
 * thread an entry i of list l (window w, KV head g): for a candidate (i <
 * P - w) raw = the sum over the window's queries t, then the group's
 * query heads j, of exp(logit - lse) (0 where i > P - w + t), times 1 /
 * (w G): snapkv.c's float operations one for one, the logit in
 * attn_band_cpu's order (band_logits.cuh; a missing key row: NaN).
 * Nothing [w G][len] is materialised: the thread reads its key row from
 * its page and the queries from the ring.
 */
template <typename T>
__global__ void bc_win_raw(const kvt_backend_paged pg,
                           const kvt_backend_window *wins,
                           const kvt_backend_window_list *lists,
                           const struct bc_seg *segs,
                           const struct bc_ps_own *own, uint32_t nseg,
                           uint32_t G, uint32_t hd, float scale, float *raw)
{
	for (uint32_t l = blockIdx.y; l < nseg; l += gridDim.y) {
		const struct bc_seg sg = segs[l];
		const kvt_backend_window w = wins[own[l].win];
		const uint32_t g = own[l].g, from = w.P - w.w;
		const uint32_t nc = from < sg.L ? from : sg.L;
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)((const char *)pg.records +
			        (uint64_t)lists[w.first_list + g].record *
			                pg.list_stride);
		const float inv = 1.0f / ((float)w.w * (float)G);
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < nc;
		     i += gridDim.x * blockDim.x) {
			const T *key = (const T *)bc_entry_row(pg, r, i);
			float v = 0.0f;
			for (uint32_t t = 0; t < w.w; t++) {
				const float *row = bc_win_qrow(w, t);
				for (uint32_t j = 0; j < G; j++) {
					const uint32_t qh = g * G + j;
					float a = i <= from + t
					          ? expf(bc_band_logit(
					                     row + w.rows.q_off +
					                             (uint64_t)qh * hd,
					                     key, hd, scale) -
					                 row[w.rows.lse_off + qh])
					          : 0.0f;
					v += a;
				}
			}
			raw[sg.first + i] = v * inv;
		}
	}
}

/* Grid (entries, lists): the scores s of every due list, raw max-pooled
 * over the kernel's neighbours in index order (0 past the candidates),
 * and the protection (the window and the sinks), as snapkv.c. */
__global__ void bc_win_pool(const kvt_backend_window *wins,
                            const struct bc_seg *segs,
                            const struct bc_ps_own *own, uint32_t nseg,
                            const float *raw, float *s, uint8_t *prot)
{
	for (uint32_t l = blockIdx.y; l < nseg; l += gridDim.y) {
		const struct bc_seg sg = segs[l];
		const kvt_backend_window w = wins[own[l].win];
		const uint32_t from = w.P - w.w, rad = w.kernel / 2;
		const uint32_t nc = from < sg.L ? from : sg.L;
		const float *rw = raw + sg.first;
		for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
		     i < sg.L; i += gridDim.x * blockDim.x) {
			prot[sg.first + i] = i >= from || i < w.sinks;
			if (i >= nc) {
				s[sg.first + i] = 0.0f;
				continue;
			}
			uint32_t a = i > rad ? i - rad : 0;
			uint32_t b = i + rad < nc ? i + rad : nc - 1;
			float m = rw[a];
			for (uint32_t e = a + 1; e <= b; e++) {
				float v = rw[e];
				if (v > m || m != m)
					m = v;
			}
			s[sg.first + i] = m;
		}
	}
}

/* Grows the context's window scratch to need bytes (nothing is queued on
 * it: the ops that use it wait for their work before they return). */
static int bc_win_scratch(struct bc_ctx *c, size_t need)
{
	if (need <= c->win_cap)
		return 0;
	size_t cap = c->win_cap ? c->win_cap : (size_t)1 << 20;
	while (cap < need)
		cap *= 2;
	if (c->d_win)
		cudaFree(c->d_win);
	c->d_win = NULL;
	c->win_cap = 0;
	BC_CALL(cudaMalloc((void **)&c->d_win, cap), "cudaMalloc");
	c->win_cap = cap;
	return 0;
}

int bc_win_prepare(struct bc_ctx *c, size_t need)
{
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	int rv = bc_win_scratch(c, need);
	if (rv || c->win_blas)
		return rv;
	cublasHandle_t h;
	if ((rv = blas_err(cublasCreate(&h)))) {
		bc_note("cublasCreate failed");
		return rv;
	}
	c->win_blas = h;
	return 0;
}

static int bc_window_check_args(uint32_t n_records, uint32_t n_heads,
                                uint32_t nkv, uint32_t hd,
                                const struct kvt_backend_window *win,
                                uint32_t n_win,
                                const struct kvt_backend_window_list *lists,
                                uint32_t n_lists, uint32_t out_words)
{
	if (!hd || !nkv || n_heads % nkv) {
		bc_note("window_select: %u query heads on %u KV heads, "
		        "head_dim %u", n_heads, nkv, hd);
		return KVT_EINVAL;
	}
	uint32_t named = 0; /* lists named by the windows before */
	for (uint32_t j = 0; j < n_win; j++) {
		const struct kvt_backend_window *w = &win[j];
		/* a window of no lists only has its rows checked */
		int sel = w->n_lists != 0;
		if (!w->ring || !w->rows.stage_tokens || (sel && !w->w) ||
		    w->w > w->P || (sel && !(w->kernel & 1)) ||
		    (sel && w->n_lists != nkv) || w->first_list > n_lists ||
		    w->n_lists > n_lists - w->first_list ||
		    w->rows.q_off + (uint64_t)n_heads * hd >
		            w->rows.row_floats ||
		    w->rows.lse_off + (uint64_t)n_heads > w->rows.row_floats ||
		    w->w + (uint64_t)w->n_new > w->rows.stage_tokens ||
		    (sel && w->first_list < named)) {
			bc_note("window_select: window %u: P %u, w %u, new %u, "
			        "kernel %u, lists %u + %u of %u (%u named "
			        "before)", j, w->P, w->w,
			        w->n_new, w->kernel, w->first_list, w->n_lists,
			        n_lists, named);
			return KVT_EINVAL;
		}
		/* the lists' selections run at once: no list is two
		 * windows' (they name them in ascending order) */
		if (sel)
			named = w->first_list + w->n_lists;
	}
	return bc_ps_check_lists("window_select", n_records, lists, n_lists,
	                         n_win, out_words);
}

/* The raw and pooling launches of one call (dtype dispatch). */
static int bc_win_scores(enum kvt_dtype dt, const kvt_backend_paged &p,
                         const kvt_backend_window *dwin,
                         const kvt_backend_window_list *dlists,
                         const struct bc_seg *segs,
                         const struct bc_ps_own *own,
                         const struct bc_bs_count &cn, uint32_t G,
                         uint32_t hd, float *raw, float *sc, uint8_t *prot,
                         cudaStream_t s)
{
	const float scale = 1.0f / sqrtf((float)hd);
	const dim3 grid(bc_bs_blocks(cn.maxL), bc_bs_rows(cn.nseg));
	if (dt == KVT_DTYPE_F16)
		KVT_LAUNCH(bc_win_raw<f16_t>, grid, BC_BS_THREADS, 0, s, p, dwin,
		           dlists, segs, own, cn.nseg, G, hd, scale, raw);
	else if (dt == KVT_DTYPE_BF16)
		KVT_LAUNCH(bc_win_raw<bf16_t>, grid, BC_BS_THREADS, 0, s, p, dwin,
		           dlists, segs, own, cn.nseg, G, hd, scale, raw);
	else
		KVT_LAUNCH(bc_win_raw<float>, grid, BC_BS_THREADS, 0, s, p, dwin,
		           dlists, segs, own, cn.nseg, G, hd, scale, raw);
	BC_CALL(cudaGetLastError(), "window_select raw");
	KVT_LAUNCH(bc_win_pool, grid, BC_BS_THREADS, 0, s, dwin, segs, own,
	           cn.nseg, raw, sc, prot);
	BC_CALL(cudaGetLastError(), "window_select pool");
	return 0;
}

/*
 * The launches of one call, whatever its windows and lists: the rows'
 * check, the plan (bc_ps_plan), raw, the pooling, the segmented top-k and
 * the drop indices (six; the check alone when no list is due); the
 * windows and the lists go up in two copies, the output comes back in
 * one.  Scratch: the output words, the windows, the lists, the plan
 * (44 bytes a due list) and 9 bytes an entry of the due lists (raw, s,
 * prot; drop over raw, dead by then).
 */
static int bc_window_select_locked(struct bc_ctx *c,
                                   const struct kvt_backend_paged *pg,
                                   enum kvt_dtype dt, uint32_t n_heads,
                                   uint32_t nkv, uint32_t hd,
                                   const struct kvt_backend_window *win,
                                   uint32_t n_win,
                                   const struct kvt_backend_window_list *lists,
                                   uint32_t n_lists, uint32_t *out,
                                   uint32_t out_words, cudaStream_t s)
{
	const uint32_t G = n_heads / nkv;
	struct bc_bs_count cn;
	int rv = bc_ps_count("window_select", win, n_win, lists, &cn);
	if (rv)
		return rv;
	const size_t o_win = bc_ps_al((size_t)out_words * 4),
	             o_lists = o_win + bc_ps_al((size_t)n_win * sizeof(*win)),
	             o_first = o_lists +
	                       bc_ps_al((size_t)n_lists * sizeof(*lists)),
	             o_keep = o_first + bc_ps_al((size_t)(cn.nseg + 1) * 4),
	             o_segs = o_keep + bc_ps_al((size_t)cn.nseg * 4),
	             o_own = o_segs +
	                     bc_ps_al((size_t)cn.nseg * sizeof(struct bc_seg)),
	             o_raw = o_own + bc_ps_al((size_t)cn.nseg *
	                                      sizeof(struct bc_ps_own)),
	             o_s = o_raw + bc_ps_al((size_t)cn.tot * 4),
	             o_prot = o_s + bc_ps_al((size_t)cn.tot * 4),
	             need = o_prot + bc_ps_al(cn.tot);
	if ((rv = bc_win_prepare(c, need)))
		return rv;
	char *d = c->d_win;
	uint32_t *dout = (uint32_t *)d, *first = (uint32_t *)(d + o_first),
	         *keep = (uint32_t *)(d + o_keep);
	kvt_backend_window *dwin = (kvt_backend_window *)(d + o_win);
	kvt_backend_window_list *dlists =
		(kvt_backend_window_list *)(d + o_lists);
	struct bc_seg *segs = (struct bc_seg *)(d + o_segs);
	struct bc_ps_own *own = (struct bc_ps_own *)(d + o_own);
	float *raw = (float *)(d + o_raw), *sc = (float *)(d + o_s);
	uint8_t *prot = (uint8_t *)(d + o_prot), *drop = (uint8_t *)raw;
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "window_select");
	BC_CALL(cudaMemcpyAsync(dwin, win, (size_t)n_win * sizeof(*win),
	                        cudaMemcpyHostToDevice, s),
	        "window_select");
	BC_CALL(cudaMemcpyAsync(dlists, lists, (size_t)n_lists * sizeof(*lists),
	                        cudaMemcpyHostToDevice, s),
	        "window_select");
	bc_count(c, (uint64_t)n_win * sizeof(*win) +
	                    (uint64_t)n_lists * sizeof(*lists), 0);
	KVT_LAUNCH(bc_win_check, n_win, BC_WIN_THREADS, 0, s, dwin, n_heads, hd,
	           dout);
	BC_CALL(cudaGetLastError(), "window_select check");
	if (cn.nseg) {
		KVT_LAUNCH(bc_ps_plan<kvt_backend_window>, 1, BC_BS_THREADS, 0, s,
		           dwin, n_win, n_win, dlists, n_lists, first, keep, segs,
		           own, NULL);
		BC_CALL(cudaGetLastError(), "window_select plan");
		if ((rv = bc_win_scores(dt, *pg, dwin, dlists, segs, own, cn, G,
		                        hd, raw, sc, prot, s)) ||
		    (rv = bc_ps_select("window_select", sc, prot, drop, first,
		                       keep, segs, cn.nseg, dout, s)))
			return rv;
	}
	return bc_ps_finish(c, out, dout, out_words, s, "window_select");
}

int bc_window_select(void *ctx, const struct kvt_backend_paged *pg,
                     uint32_t n_records, enum kvt_dtype dtype,
                     uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                     const struct kvt_backend_window *win, uint32_t n_win,
                     const struct kvt_backend_window_list *lists,
                     uint32_t n_lists, uint32_t *out, uint32_t out_words,
                     void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n_win)
		return 0;
	int rv = bc_ps_check_call("window_select", pg, win, n_win, lists, n_lists,
	                          dtype, out, out_words);
	if (rv)
		return rv;
	rv = bc_window_check_args(n_records, n_heads, n_kv_heads, head_dim,
	                              win, n_win, lists, n_lists, out_words);
	if (rv)
		return rv;
	pthread_mutex_lock(&c->lock);
	rv = bc_window_select_locked(c, pg, dtype, n_heads, n_kv_heads,
	                             head_dim, win, n_win, lists, n_lists, out,
	                             out_words, (cudaStream_t)stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
