/*
 * window_select.cu — the cuda backend's `window_select` op (backend.h):
 * SnapKV's end-of-prefill selection (snapkv and pyramidkv) computed where
 * the keys and the window's queries are, so that only the drop indices
 * (4 bytes each) come to the host.  Per list: gather, the logits in
 * attn_band_cpu's order (band_logits.cuh), one block doing the cpu policy's
 * float operations one for one, select_topk_cuda.  The steps: docs/cuda.md,
 * "Device ops, step by step".  Everything runs on the caller's stream;
 * the scratch (bc_win_prepare) is the context's, under its lock, and the
 * op waits for its output.  Tests: cuda.backend_window_select_matches_naive
 * and the emulated passes of `make test`.
 */
#include <cublas_v2.h>
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "band_logits.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "prompt_select.cuh"
#include "select_topk.cuh"

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

/* Step 1 for list (record) of KV head g: qg [w][G][hd], lg [w][G], keys
 * [len][hd]; a key of a page beyond its record or of an unmapped chunk
 * reads as NaN (a daemon bug must not fault the context). */
template <typename T>
__global__ void bc_win_gather(const kvt_backend_paged pg, uint32_t record,
                              uint32_t len, const kvt_backend_window *wins,
                              uint32_t wi, uint32_t g, uint32_t G,
                              uint32_t head_dim, float *qg, float *lg,
                              float *keys)
{
	const kvt_backend_window w = wins[wi];
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		                                 (uint64_t)record * pg.list_stride);
	const uint64_t nk = (uint64_t)len * head_dim,
	               nq = (uint64_t)w.w * G * head_dim, nl = (uint64_t)w.w * G;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < nk + nq + nl; e += (uint64_t)gridDim.x * blockDim.x) {
		if (e < nk) {
			uint32_t i = (uint32_t)(e / head_dim),
			         d = (uint32_t)(e % head_dim);
			const T *row = (const T *)bc_entry_row(pg, r, i);
			keys[e] = row ? common_to_f(row[d]) : nanf("");
		} else if (e < nk + nq) {
			uint64_t q = e - nk;
			uint32_t t = (uint32_t)(q / ((uint64_t)G * head_dim));
			uint32_t rest = (uint32_t)(q % ((uint64_t)G * head_dim));
			const float *row = bc_win_row(w, w.P - w.w + t);
			qg[q] = row[w.rows.q_off + (uint64_t)g * G * head_dim +
			            rest];
		} else {
			uint64_t q = e - nk - nq;
			uint32_t t = (uint32_t)(q / G), j = (uint32_t)(q % G);
			lg[q] = bc_win_row(w, w.P - w.w + t)
				[w.rows.lse_off + g * G + j];
		}
	}
}

/* Step 3, one block: logits [w * G][len] into scores s [len] and protect
 * [len], as snapkv.c computes them (raw in scratch). */
__global__ void bc_win_score(const kvt_backend_window *wins, uint32_t wi,
                             uint32_t len, uint32_t G, const float *logit,
                             const float *lg, float inv, float *raw,
                             float *s, uint8_t *prot)
{
	const kvt_backend_window w = wins[wi];
	const uint32_t from = w.P - w.w; /* candidates: i < from */
	for (uint32_t i = threadIdx.x; i < from && i < len; i += blockDim.x) {
		float v = 0.0f;
		for (uint32_t t = 0; t < w.w; t++)
			for (uint32_t j = 0; j < G; j++) {
				const uint32_t r = t * G + j;
				float a = i <= from + t
				          ? expf(logit[(uint64_t)r * len + i] - lg[r])
				          : 0.0f;
				v += a;
			}
		raw[i] = v * inv;
	}
	__syncthreads();
	const uint32_t nc = from < len ? from : len, rad = w.kernel / 2;
	for (uint32_t i = threadIdx.x; i < len; i += blockDim.x) {
		prot[i] = i >= from || i < w.sinks;
		if (i >= nc) {
			s[i] = 0.0f;
			continue;
		}
		uint32_t a = i > rad ? i - rad : 0;
		uint32_t b = i + rad < nc ? i + rad : nc - 1;
		float m = raw[a];
		for (uint32_t e = a + 1; e <= b; e++) {
			float v = raw[e];
			if (v > m || m != m)
				m = v;
		}
		s[i] = m;
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
		    w->w + (uint64_t)w->n_new > w->rows.stage_tokens) {
			bc_note("window_select: window %u: P %u, w %u, new %u, "
			        "kernel %u, lists %u + %u of %u", j, w->P, w->w,
			        w->n_new, w->kernel, w->first_list, w->n_lists,
			        n_lists);
			return KVT_EINVAL;
		}
	}
	return bc_ps_check_lists("window_select", n_records, lists, n_lists,
	                         n_win, out_words);
}

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
	/* scratch: windows, out, then per list keys, qg, lg, logits, raw, s,
	 * prot, drop (the largest list's sizes) */
	uint64_t maxlen = 1, maxw = 1;
	for (uint32_t l = 0; l < n_lists; l++)
		maxlen = lists[l].len > maxlen ? lists[l].len : maxlen;
	for (uint32_t j = 0; j < n_win; j++)
		maxw = win[j].w > maxw ? win[j].w : maxw;
	const size_t o_win = 0,
	             o_out = o_win + bc_ps_al((size_t)n_win * sizeof(*win)),
	             o_keys = o_out + bc_ps_al((size_t)out_words * 4),
	             o_qg = o_keys + bc_ps_al(maxlen * hd * 4),
	             o_lg = o_qg + bc_ps_al(maxw * G * hd * 4),
	             o_logit = o_lg + bc_ps_al(maxw * G * 4),
	             o_raw = o_logit + bc_ps_al(maxw * G * maxlen * 4),
	             o_s = o_raw + bc_ps_al(maxlen * 4),
	             o_prot = o_s + bc_ps_al(maxlen * 4),
	             o_drop = o_prot + bc_ps_al(maxlen),
	             need = o_drop + bc_ps_al(maxlen);
	int rv = bc_win_prepare(c, need);
	if (rv)
		return rv;
	char *d = c->d_win;
	kvt_backend_window *dwin = (kvt_backend_window *)(d + o_win);
	uint32_t *dout = (uint32_t *)(d + o_out);
	float *keys = (float *)(d + o_keys), *qg = (float *)(d + o_qg),
	      *lg = (float *)(d + o_lg), *logit = (float *)(d + o_logit),
	      *raw = (float *)(d + o_raw), *sc = (float *)(d + o_s);
	uint8_t *prot = (uint8_t *)(d + o_prot), *drop = (uint8_t *)(d + o_drop);
	/* the windows' descriptors go to the device in one copy (sizeof
	 * *win a (sequence, layer)), counted like every other */
	cudaError_t e = cudaMemcpyAsync(dwin, win, (size_t)n_win * sizeof(*win),
	                                cudaMemcpyHostToDevice, s);
	if (e != cudaSuccess)
		return bc_cuda(e, "window_select");
	bc_count(c, (uint64_t)n_win * sizeof(*win), 0);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "window_select");
	KVT_LAUNCH(bc_win_check, n_win, BC_WIN_THREADS, 0, s, dwin, n_heads, hd,
	           dout);
	BC_CALL(cudaGetLastError(), "window_select");
	const float scale = 1.0f / sqrtf((float)hd);
	const kvt_backend_paged p = *pg;
	for (uint32_t j = 0; j < n_win; j++) {
		const struct kvt_backend_window *w = &win[j];
		const float inv = 1.0f / ((float)w->w * (float)G);
		for (uint32_t g = 0; g < w->n_lists; g++) {
			const uint32_t li = w->first_list + g;
			const struct kvt_backend_window_list *L = &lists[li];
			if (!L->len)
				continue;
			uint64_t tot = (uint64_t)L->len * hd +
			               (uint64_t)w->w * G * (hd + 1);
			uint32_t blocks = (uint32_t)((tot + BC_WIN_THREADS - 1) /
			                             BC_WIN_THREADS);
			if (blocks > 4096)
				blocks = 4096;
			if (dt == KVT_DTYPE_F16)
				KVT_LAUNCH(bc_win_gather<f16_t>, blocks,
				           BC_WIN_THREADS, 0, s, p, L->record,
				           L->len, dwin, j, g, G, hd, qg, lg, keys);
			else if (dt == KVT_DTYPE_BF16)
				KVT_LAUNCH(bc_win_gather<bf16_t>, blocks,
				           BC_WIN_THREADS, 0, s, p, L->record,
				           L->len, dwin, j, g, G, hd, qg, lg, keys);
			else
				KVT_LAUNCH(bc_win_gather<float>, blocks,
				           BC_WIN_THREADS, 0, s, p, L->record,
				           L->len, dwin, j, g, G, hd, qg, lg, keys);
			BC_CALL(cudaGetLastError(), "window_select gather");
			/* logit [w G][len], as attn_band_cpu */
			if ((rv = bc_band_logits("window_select logits", keys,
			                         qg, w->w * G, L->len, hd, scale,
			                         logit, s)))
				return rv;
			KVT_LAUNCH(bc_win_score, 1, BC_WIN_THREADS, 0, s, dwin, j,
			           L->len, G, logit, lg, inv, raw, sc, prot);
			BC_CALL(cudaGetLastError(), "window_select score");
			if ((rv = select_topk_cuda(sc, NULL, prot, L->len, L->keep,
			                           drop, NULL, NULL, s)))
				return rv;
			KVT_LAUNCH(bc_ps_indices, 1, BC_PS_IDX_THREADS, 0, s,
			           drop, L->len,
			           dout + n_win + n_lists + L->drop_off,
			           L->n_drop, dout + n_win + li);
			BC_CALL(cudaGetLastError(), "window_select indices");
		}
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
