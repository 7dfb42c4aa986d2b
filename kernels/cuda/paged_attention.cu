/*
 * paged_attention.cu — split-K decode attention over paged, per-head
 * variable-length K/V lists; see paged_attention.cuh.  Grid (list, slice,
 * head group): a block of PA_WARPS warps streams one slice of one list;
 * TPT lanes share a token, reading its K then V row in coalesced 16-byte
 * loads, each lane issuing the loads of U tokens before using any (enough
 * bytes in flight to saturate HBM).  Every K/V row is read once for all GB
 * query heads of its group, with an online softmax in base 2 (q pre-scaled
 * by scale * log2 e); groups, then warps, merge their (max, sum, acc)
 * triples, and with several slices pa_combine_kernel merges the slices'
 * triples from `work`.  Instances: dtype {f32, f16, bf16} x head_dim bucket
 * {64, 128, 256} x GB {1, 2, 4, 8}.  Test: kvtrim-cuda-tests
 * paged_attention; bench: kvtrim-cuda-bench (paged_attention_gbps).
 */
#include <float.h>
#include <math.h>

#include "common.cuh"
#include "paged_attention.cuh"

#define PA_WARPS 4
#define PA_THREADS (PA_WARPS * 32)
#define PA_MIN_SPLIT 256u /* fewest tokens worth a slice of their own */
#define PA_LN2 0.69314718055994531f
#define PA_LOG2E 1.44269504088896341f

struct pa_args {
	const float *q;            /* [n_lists][G][hd] */
	void *const *pages;        /* page addresses, list after list */
	const uint32_t *page_first; /* [n_lists] or NULL (all 0) */
	const uint32_t *lens;      /* [n_lists] or NULL (all len1) */
	uint32_t len1;
	uint32_t G, hd, page_tokens, shift, row_bytes;
	uint32_t split, n_splits; /* tokens per slice; slices per list */
	float scale_log2;
	int vec; /* rows are whole 16-byte vectors */
	float *out, *lse;
	float *part; /* [n_lists][G][n_splits][2 + hd] (max, sum, acc[hd]) */
};

/* Loads the 16-byte vector of row elements [d0, d0 + 16 / sizeof(T)),
 * zero beyond hd; scalar loads when rows are not whole vectors. */
template <typename T>
__device__ __forceinline__ uint4 pa_load(const char *row, uint32_t d0,
                                         uint32_t hd, int vec)
{
	constexpr uint32_t VEC = common_vec<T>::n;
	if (vec) {
		if (d0 < hd)
			return __ldg((const uint4 *)(row + (size_t)d0 * sizeof(T)));
		return make_uint4(0, 0, 0, 0);
	}
	uint32_t w[4];
	if (sizeof(T) == 4) {
#pragma unroll
		for (int i = 0; i < 4; i++)
			w[i] = d0 + i < hd ? __ldg((const unsigned int *)row + d0 + i)
			                   : 0u;
	} else {
		const unsigned short *h = (const unsigned short *)row;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t a = d0 + 2 * i, b = a + 1;
			uint32_t lo = a < hd ? __ldg(h + a) : 0u;
			uint32_t hi = b < hd ? __ldg(h + b) : 0u;
			w[i] = lo | hi << 16;
		}
	}
	(void)VEC;
	return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Merges (mb, lb, ab) into (ma, la, aa); -inf maxima carry no mass. */
__device__ __forceinline__ void pa_rescale(float ma, float mb, float *ca,
                                           float *cb, float *mx)
{
	*mx = fmaxf(ma, mb);
	if (*mx == -INFINITY) {
		*ca = 0.f;
		*cb = 0.f;
	} else {
		*ca = exp2f(ma - *mx);
		*cb = exp2f(mb - *mx);
	}
}

/* ------------------------------------------------------- split kernel */

/* The split kernel's tiling for dtype T, head_dim bucket HDMAX and GB
 * query heads per block. */
template <typename T, int HDMAX, int GB> struct pa_tile {
	static constexpr int VEC = common_vec<T>::n;
	/* lanes per token */
	static constexpr int TPT = HDMAX / VEC < 32 ? HDMAX / VEC : 32;
	static constexpr int NV = HDMAX / (TPT * VEC); /* vectors per lane */
	static constexpr int TPW = 32 / TPT;           /* tokens per warp step */
	static constexpr int EPL = NV * VEC;           /* elements per lane */
	static constexpr int U = GB * EPL >= 64 ? 2 : 4; /* tokens in flight */
	static constexpr int STEP = PA_WARPS * TPW * U;
};

/* Where one thread of pa_split_kernel works. */
struct pa_at {
	uint32_t list, slice, g0; /* the block's list, slice, first query head */
	uint32_t start, end;      /* the slice's tokens [start, end) */
	void *const *pages;       /* the list's page addresses */
	int warp, grp, sub;       /* warp of the block; the lane's token group
	                             in the warp and its place in the group */
	size_t v_off;             /* bytes from a K row to its V row */
};

/* One lane's part of the block's GB query heads: its EPL elements of each
 * query, pre-scaled, and the running softmax in base 2 (max m, sum l of
 * 2^(s - m), and acc, the V elements weighted alike). */
template <int GB, int EPL> struct pa_lane {
	float qr[GB][EPL], acc[GB][EPL], m[GB], l[GB];
};

/* Fills *at for this thread; false when the block's slice starts past the
 * list's end (slice 0 always runs: it writes an empty list's result). */
template <typename T, int HDMAX, int GB>
static __device__ __forceinline__ bool pa_at_init(const pa_args &a,
                                                 pa_at *at)
{
	typedef pa_tile<T, HDMAX, GB> P;
	at->list = blockIdx.x;
	at->slice = blockIdx.y;
	at->g0 = blockIdx.z * GB;
	const uint32_t len = a.lens ? a.lens[at->list] : a.len1;
	at->start = at->slice * a.split;
	if (at->slice > 0 && at->start >= len)
		return false;
	at->end = len - at->start < a.split ? len : at->start + a.split;
	at->pages = a.pages + (a.page_first ? a.page_first[at->list] : 0);
	const int lane = threadIdx.x & 31;
	at->warp = threadIdx.x >> 5;
	at->grp = lane / P::TPT;
	at->sub = lane % P::TPT;
	at->v_off = (size_t)a.page_tokens * a.row_bytes;
	return true;
}

/* Loads the lane's elements of the GB query heads (0 beyond G and hd),
 * scaled by scale * log2 e, and starts an empty softmax. */
template <typename T, int HDMAX, int GB>
static __device__ __forceinline__ void
pa_lane_init(const pa_args &a, const pa_at &at,
             pa_lane<GB, pa_tile<T, HDMAX, GB>::EPL> *st)
{
	typedef pa_tile<T, HDMAX, GB> P;
#pragma unroll
	for (int gi = 0; gi < GB; gi++) {
		uint32_t g = at.g0 + gi;
		const float *qg = a.q + ((size_t)at.list * a.G + g) * a.hd;
#pragma unroll
		for (int v = 0; v < P::NV; v++)
#pragma unroll
			for (int e = 0; e < P::VEC; e++) {
				uint32_t d = (uint32_t)((v * P::TPT + at.sub) * P::VEC +
				                        e);
				st->qr[gi][v * P::VEC + e] = g < a.G && d < a.hd
				                                 ? qg[d] * a.scale_log2
				                                 : 0.f;
				st->acc[gi][v * P::VEC + e] = 0.f;
			}
		st->m[gi] = -INFINITY;
		st->l[gi] = 0.f;
	}
}

/*
 * One step of the slice from token base: the lane's group reads U tokens'
 * K and V rows (all loads issued before any is used), takes their logits
 * against the GB queries and folds them into the softmax.  Tokens at or
 * past at.end count as -inf logits.
 */
template <typename T, int HDMAX, int GB>
static __device__ __forceinline__ void
pa_step(const pa_args &a, const pa_at &at, uint32_t base,
        pa_lane<GB, pa_tile<T, HDMAX, GB>::EPL> *st)
{
	typedef pa_tile<T, HDMAX, GB> P;
	constexpr int U = P::U, NV = P::NV, VEC = P::VEC, EPL = P::EPL;
	uint4 kr[U][NV], vr[U][NV];
	bool ok[U];
#pragma unroll
	for (int u = 0; u < U; u++) {
		uint32_t t = base + (uint32_t)((u * PA_WARPS + at.warp) * P::TPW +
		                               at.grp);
		ok[u] = t < at.end;
		const char *row = ok[u] ? common_row(at.pages, t, a.page_tokens,
		                                     a.shift, a.row_bytes)
		                        : NULL;
#pragma unroll
		for (int v = 0; v < NV; v++) {
			uint32_t d0 = (uint32_t)((v * P::TPT + at.sub) * VEC);
			if (ok[u]) {
				kr[u][v] = pa_load<T>(row, d0, a.hd, a.vec);
				vr[u][v] = pa_load<T>(row + at.v_off, d0, a.hd, a.vec);
			} else {
				kr[u][v] = make_uint4(0, 0, 0, 0);
				vr[u][v] = make_uint4(0, 0, 0, 0);
			}
		}
	}
	/* Logits: every lane of a group ends with the same sum (the xor
	 * butterfly adds the same pairs in every lane). */
	float s[U][GB];
#pragma unroll
	for (int u = 0; u < U; u++) {
		float kf[EPL];
#pragma unroll
		for (int v = 0; v < NV; v++)
			common_unpack(kr[u][v], kf + v * VEC, T());
#pragma unroll
		for (int gi = 0; gi < GB; gi++) {
			float p = 0.f;
#pragma unroll
			for (int e = 0; e < EPL; e++)
				p = fmaf(st->qr[gi][e], kf[e], p);
#pragma unroll
			for (int o = P::TPT / 2; o > 0; o >>= 1)
				p += __shfl_xor_sync(0xffffffffu, p, o);
			s[u][gi] = ok[u] ? p : -INFINITY;
		}
	}
	float vf[U][EPL];
#pragma unroll
	for (int u = 0; u < U; u++)
#pragma unroll
		for (int v = 0; v < NV; v++)
			common_unpack(vr[u][v], vf[u] + v * VEC, T());
#pragma unroll
	for (int gi = 0; gi < GB; gi++) {
		float mx = st->m[gi];
#pragma unroll
		for (int u = 0; u < U; u++)
			mx = fmaxf(mx, s[u][gi]);
		if (mx == -INFINITY)
			continue; /* nothing valid yet in this group */
		float c = exp2f(st->m[gi] - mx), p[U], ps = 0.f;
#pragma unroll
		for (int u = 0; u < U; u++) {
			p[u] = exp2f(s[u][gi] - mx);
			ps += p[u];
		}
		st->l[gi] = st->l[gi] * c + ps;
#pragma unroll
		for (int e = 0; e < EPL; e++) {
			float x = st->acc[gi][e] * c;
#pragma unroll
			for (int u = 0; u < U; u++)
				x = fmaf(p[u], vf[u][e], x);
			st->acc[gi][e] = x;
		}
		st->m[gi] = mx;
	}
}

/* Merges the softmax of the warp's token groups (lanes sub, sub + TPT,
 * ...): afterwards every lane of the warp holds the warp's. */
template <typename T, int HDMAX, int GB>
static __device__ __forceinline__ void
pa_merge_groups(pa_lane<GB, pa_tile<T, HDMAX, GB>::EPL> *st)
{
	typedef pa_tile<T, HDMAX, GB> P;
#pragma unroll
	for (int o = P::TPT; o < 32; o <<= 1)
#pragma unroll
		for (int gi = 0; gi < GB; gi++) {
			float om = __shfl_xor_sync(0xffffffffu, st->m[gi], o);
			float ol = __shfl_xor_sync(0xffffffffu, st->l[gi], o);
			float ca, cb, mx;
			pa_rescale(st->m[gi], om, &ca, &cb, &mx);
			st->l[gi] = st->l[gi] * ca + ol * cb;
#pragma unroll
			for (int e = 0; e < P::EPL; e++) {
				float oa = __shfl_xor_sync(0xffffffffu, st->acc[gi][e],
				                           o);
				st->acc[gi][e] = st->acc[gi][e] * ca + oa * cb;
			}
			st->m[gi] = mx;
		}
}

/* Each warp's softmax as the block shares it: [PA_WARPS][GB] maxima and
 * sums, [PA_WARPS][GB][HDMAX] weighted V sums. */
template <int GB, int HDMAX> struct pa_shared {
	float (*m)[GB], (*l)[GB];
	float (*acc)[GB][HDMAX];
};

/* Lane group 0 of each warp writes the warp's softmax into sm (the
 * caller's shared memory; a __syncthreads must follow). */
template <typename T, int HDMAX, int GB>
static __device__ __forceinline__ void
pa_publish(const pa_at &at, const pa_lane<GB, pa_tile<T, HDMAX, GB>::EPL> *st,
           const pa_shared<GB, HDMAX> &sm)
{
	typedef pa_tile<T, HDMAX, GB> P;
	if (at.grp != 0)
		return;
#pragma unroll
	for (int gi = 0; gi < GB; gi++) {
#pragma unroll
		for (int v = 0; v < P::NV; v++)
#pragma unroll
			for (int e = 0; e < P::VEC; e++)
				sm.acc[at.warp][gi][(v * P::TPT + at.sub) * P::VEC + e] =
					st->acc[gi][v * P::VEC + e];
		if (at.sub == 0) {
			sm.m[at.warp][gi] = st->m[gi];
			sm.l[at.warp][gi] = st->l[gi];
		}
	}
}

/*
 * Merges the warps' softmax from sm (after the barrier) and writes, for
 * each query head of the block and element d: with one slice, out and
 * lse; with several, the slice's (max, sum, acc) triple into a.part, for
 * pa_combine_kernel.
 */
template <int HDMAX, int GB>
static __device__ __forceinline__ void
pa_write(const pa_args &a, const pa_at &at, const pa_shared<GB, HDMAX> &sm)
{
	for (int idx = threadIdx.x; idx < GB * HDMAX; idx += PA_THREADS) {
		int gi = idx / HDMAX;
		uint32_t d = (uint32_t)(idx % HDMAX), g = at.g0 + (uint32_t)gi;
		if (g >= a.G || d >= a.hd)
			continue;
		float M = -INFINITY;
#pragma unroll
		for (int w = 0; w < PA_WARPS; w++)
			M = fmaxf(M, sm.m[w][gi]);
		float L = 0.f, A = 0.f;
		if (M != -INFINITY) {
#pragma unroll
			for (int w = 0; w < PA_WARPS; w++) {
				float c = exp2f(sm.m[w][gi] - M);
				L += sm.l[w][gi] * c;
				A += sm.acc[w][gi][d] * c;
			}
		}
		size_t lg = (size_t)at.list * a.G + g;
		if (a.n_splits == 1) {
			a.out[lg * a.hd + d] = L > 0.f ? A / L : 0.f;
			if (d == 0)
				a.lse[lg] = L > 0.f ? (M + log2f(L)) * PA_LN2
				                    : -INFINITY;
		} else {
			float *pp = a.part +
			            (lg * a.n_splits + at.slice) * (size_t)(a.hd + 2);
			if (d == 0) {
				pp[0] = M;
				pp[1] = L;
			}
			pp[2 + d] = A;
		}
	}
}

/* Grid (list, slice, head group of GB): one slice of one list for GB query
 * heads, through the phases above. */
template <typename T, int HDMAX, int GB>
static __global__ void __launch_bounds__(PA_THREADS)
pa_split_kernel(const pa_args a)
{
	typedef pa_tile<T, HDMAX, GB> P;
	pa_at at;
	if (!pa_at_init<T, HDMAX, GB>(a, &at))
		return;
	pa_lane<GB, P::EPL> st;
	pa_lane_init<T, HDMAX, GB>(a, at, &st);
	for (uint32_t base = at.start; base < at.end; base += P::STEP)
		pa_step<T, HDMAX, GB>(a, at, base, &st);
	pa_merge_groups<T, HDMAX, GB>(&st);

	/* Merge the warps through shared memory. */
	__shared__ float sm_m[PA_WARPS][GB], sm_l[PA_WARPS][GB];
	__shared__ float sm_a[PA_WARPS][GB][HDMAX];
	const pa_shared<GB, HDMAX> sm = {sm_m, sm_l, sm_a};
	pa_publish<T, HDMAX, GB>(at, &st, sm);
	__syncthreads();
	pa_write<HDMAX, GB>(a, at, sm);
}

/* One block per (list, head): merges the slices that hold tokens. */
static __global__ void pa_combine_kernel(const pa_args a)
{
	KVT_DYN_SHARED(float, pc_w); /* [n_splits] slice weights */
	__shared__ float pc_L;
	const uint32_t lg = blockIdx.x, list = lg / a.G;
	const uint32_t len = a.lens ? a.lens[list] : a.len1;
	uint32_t nv = (uint32_t)(((uint64_t)len + a.split - 1) / a.split);
	if (nv > a.n_splits)
		nv = a.n_splits;
	const size_t stride = a.hd + 2;
	const float *pp = a.part + (size_t)lg * a.n_splits * stride;
	float M = -INFINITY;
	for (uint32_t s = 0; s < nv; s++)
		M = fmaxf(M, pp[s * stride]);
	for (uint32_t s = threadIdx.x; s < nv; s += blockDim.x)
		pc_w[s] = M == -INFINITY ? 0.f : exp2f(pp[s * stride] - M);
	__syncthreads();
	if (threadIdx.x == 0) {
		float L = 0.f;
		for (uint32_t s = 0; s < nv; s++)
			L += pp[s * stride + 1] * pc_w[s];
		pc_L = L;
		a.lse[lg] = L > 0.f ? (M + log2f(L)) * PA_LN2 : -INFINITY;
	}
	__syncthreads();
	const float L = pc_L;
	for (uint32_t d = threadIdx.x; d < a.hd; d += blockDim.x) {
		float A = 0.f;
		for (uint32_t s = 0; s < nv; s++)
			A += pp[s * stride + 2 + d] * pc_w[s];
		a.out[(size_t)lg * a.hd + d] = L > 0.f ? A / L : 0.f;
	}
}

/* ------------------------------------------------------------ launch */

static uint32_t pa_group(uint32_t G)
{
	return G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8;
}

/*
 * Slices per list: enough blocks for ~16 per multiprocessor (several waves
 * of resident blocks, so the last wave's tail is small), never slices under
 * PA_MIN_SPLIT tokens, and no more than fit in work_bytes.  *split is the
 * slice length (a multiple of 64), UINT32_MAX with one slice.
 */
static uint32_t pa_plan(uint32_t n_lists, uint32_t G, uint32_t hd,
                        uint32_t max_len, size_t work_bytes, uint32_t *split)
{
	int sms = common_sm_count();
	uint64_t blocks = (uint64_t)n_lists * common_cdiv(G, pa_group(G));
	uint64_t target = (uint64_t)(sms > 0 ? sms : 108) * 16;
	uint64_t ns = 1;
	if (blocks < target && max_len > PA_MIN_SPLIT) {
		ns = (target + blocks - 1) / blocks;
		uint64_t cap = (max_len + PA_MIN_SPLIT - 1) / PA_MIN_SPLIT;
		if (ns > cap)
			ns = cap;
	}
	uint64_t per = (uint64_t)n_lists * G * (hd + 2) * sizeof(float);
	if (ns > 1 && per * ns > work_bytes)
		ns = work_bytes / per;
	if (ns > 4096) /* grid.y, and pa_combine's weights in shared memory */
		ns = 4096;
	if (ns > 1) {
		uint64_t st = ((max_len + ns - 1) / ns + 63) / 64 * 64;
		ns = (max_len + st - 1) / st;
		*split = (uint32_t)st;
	}
	if (ns <= 1) {
		*split = UINT32_MAX;
		return 1;
	}
	return (uint32_t)ns;
}

template <typename T, int HDMAX>
static void pa_go(const pa_args &a, dim3 grid, uint32_t gb, cudaStream_t s)
{
	switch (gb) {
	case 1:
		KVT_LAUNCH((pa_split_kernel<T, HDMAX, 1>), grid, PA_THREADS, 0,
		           s, a);
		break;
	case 2:
		KVT_LAUNCH((pa_split_kernel<T, HDMAX, 2>), grid, PA_THREADS, 0,
		           s, a);
		break;
	case 4:
		KVT_LAUNCH((pa_split_kernel<T, HDMAX, 4>), grid, PA_THREADS, 0,
		           s, a);
		break;
	default:
		KVT_LAUNCH((pa_split_kernel<T, HDMAX, 8>), grid, PA_THREADS, 0,
		           s, a);
		break;
	}
}

static int pa_launch(const float *q, uint32_t G, void *const *pages,
                     const uint32_t *page_first, const uint32_t *lens,
                     uint32_t len1, uint32_t n_lists, uint32_t max_len,
                     uint32_t page_tokens, uint32_t hd, enum kvt_dtype dt,
                     float scale, float *out, float *lse, void *work,
                     size_t work_bytes, cudaStream_t s)
{
	uint32_t es = common_dt_size(dt);
	if (!G || !page_tokens || !hd || !es)
		return KVT_EINVAL;
	if (hd > 256)
		return KVT_ENOTSUP;
	if (n_lists == 0)
		return 0;
	if (!q || !out || !lse || (!pages && max_len) || n_lists > INT32_MAX ||
	    (uint64_t)n_lists * G > INT32_MAX)
		return KVT_EINVAL;
	if (!work || ((uintptr_t)work & 15))
		work_bytes = 0;
	pa_args a;
	a.q = q;
	a.pages = pages;
	a.page_first = page_first;
	a.lens = lens;
	a.len1 = len1;
	a.G = G;
	a.hd = hd;
	a.page_tokens = page_tokens;
	a.shift = common_shift(page_tokens);
	a.row_bytes = hd * es;
	a.n_splits = pa_plan(n_lists, G, hd, max_len, work_bytes, &a.split);
	a.scale_log2 = scale * PA_LOG2E;
	a.vec = a.row_bytes % 16 == 0;
	a.out = out;
	a.lse = lse;
	a.part = (float *)work;
	uint32_t gb = pa_group(G);
	dim3 grid(n_lists, a.n_splits, common_cdiv(G, gb));
	uint32_t bucket = hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
	COMMON_DISPATCH_DT(dt, T,
		if (bucket == 64) pa_go<T, 64>(a, grid, gb, s);
		else if (bucket == 128) pa_go<T, 128>(a, grid, gb, s);
		else pa_go<T, 256>(a, grid, gb, s));
	COMMON_LAUNCHED();
	if (a.n_splits > 1) {
		KVT_LAUNCH(pa_combine_kernel, n_lists * G, 128,
		           a.n_splits * sizeof(float), s, a);
		COMMON_LAUNCHED();
	}
	return 0;
}

extern "C" int paged_attention_cuda(const float *q, uint32_t G,
                                    void *const *pages, uint32_t page_tokens,
                                    uint32_t head_dim, enum kvt_dtype dt,
                                    uint32_t len, float scale, float *out,
                                    float *lse, float *scratch,
                                    cudaStream_t s)
{
	return pa_launch(q, G, pages, NULL, NULL, len, 1, len, page_tokens,
	                 head_dim, dt, scale, out, lse, scratch,
	                 scratch ? (size_t)G * len * sizeof(float) : 0, s);
}

extern "C" int paged_attention_batch_cuda(
	const float *q, uint32_t G, void *const *pages,
	const uint32_t *page_first, const uint32_t *lens, uint32_t n_lists,
	uint32_t max_len, uint32_t page_tokens, uint32_t head_dim,
	enum kvt_dtype dt, float scale, float *out, float *lse, void *work,
	size_t work_bytes, cudaStream_t s)
{
	if (n_lists && (!page_first || !lens))
		return KVT_EINVAL;
	return pa_launch(q, G, pages, page_first, lens, 0, n_lists, max_len,
	                 page_tokens, head_dim, dt, scale, out, lse, work,
	                 work_bytes, s);
}

extern "C" size_t paged_attention_work_bytes(uint32_t n_lists, uint32_t G,
                                             uint32_t head_dim,
                                             uint32_t max_len)
{
	uint32_t split;
	if (!n_lists || !G || !head_dim)
		return 0;
	uint32_t ns = pa_plan(n_lists, G, head_dim, max_len, SIZE_MAX, &split);
	if (ns <= 1)
		return 0;
	return (size_t)n_lists * G * (head_dim + 2) * sizeof(float) * ns;
}
