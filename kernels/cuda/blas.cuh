/*
 * blas.cuh — the row-major cuBLAS products the scorers share, one at a
 * time (blas_xwt) or grouped into one call (struct blas_grouped), and the
 * packed-row segments of the batched scorers (internal to
 * libkvtrim-cuda.so; static inline, nothing exported).
 */
#ifndef KVT_CUDA_BLAS_CUH
#define KVT_CUDA_BLAS_CUH

#include <cublas_v2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

static inline int blas_err(cublasStatus_t st)
{
	switch (st) {
	case CUBLAS_STATUS_SUCCESS:
		return 0;
	case CUBLAS_STATUS_INVALID_VALUE:
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return KVT_EINVAL;
	case CUBLAS_STATUS_NOT_SUPPORTED:
	case CUBLAS_STATUS_ARCH_MISMATCH:
		return KVT_ENOTSUP;
	default:
		return KVT_ESYS;
	}
}

/*
 * y[n][d_out] = x[n][d_in] W[d_out][d_in]^T, float32 row-major, on stream
 * s (the handle's stream is set to s and left there).  In cuBLAS's column
 * order y^T = W x^T: W read transposed with ld d_in, x as is with ld d_in.
 */
static inline int blas_xwt(cublasHandle_t h, const float *x, uint32_t n,
                           uint32_t d_in, const float *W, uint32_t d_out,
                           float *y, cudaStream_t s)
{
	const float one = 1.f, zero = 0.f;
	if (n > INT32_MAX || d_in > INT32_MAX || d_out > INT32_MAX)
		return KVT_EINVAL;
	int rv = blas_err(cublasSetStream(h, s));
	if (rv)
		return rv;
	common_count_launch();
	return blas_err(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)d_out,
	                            (int)n, (int)d_in, &one, W, (int)d_in, x,
	                            (int)d_in, &zero, y, (int)d_out));
}

/* cublasSgemmGroupedBatched, one call for products of different shapes. */
#if defined(__CUDACC__) && CUBLAS_VERSION < 120500
#error "kernels/cuda/ needs cuBLAS 12.5 or newer (cublasSgemmGroupedBatched)"
#endif

/*
 * The host half of one cublasSgemmGroupedBatched call of row-major
 * products y[rows][d_out] = x[rows][d_in] W[d_out][d_in]^T + beta y, each
 * problem the call blas_xwt would make for it (so on the emulator, and in
 * cuBLAS's own per-problem semantics, the same bits).  Problems are added
 * in the order of the device pointer arrays the call takes; consecutive
 * problems of one shape share a group.  The arrays are kept between calls
 * and grown (blas_grouped_reset); the caller owns the struct, zeroed
 * before first use, and frees it with blas_grouped_free.
 */
struct blas_grouped {
	int groups, problems, cap; /* groups used, problems, array capacity */
	int *block;                /* one allocation: the arrays below */
	cublasOperation_t *ta, *tb;
	int *m, *n, *k, *lda, *ldb, *ldc, *size;
	float *alpha, *beta;
};

#define BLAS_GROUPED_ARRAYS 11 /* 4-byte arrays in struct blas_grouped */

static inline void blas_grouped_free(struct blas_grouped *g)
{
	free(g->block);
	memset(g, 0, sizeof(*g));
}

/* Empties g and makes room for up to max_problems problems (as many
 * groups at most); KVT_ENOMEM leaves g empty and usable. */
static inline int blas_grouped_reset(struct blas_grouped *g,
                                     uint32_t max_problems)
{
	g->groups = g->problems = 0;
	if (max_problems > (uint32_t)INT32_MAX)
		return KVT_EINVAL;
	if ((int)max_problems > g->cap) {
		int cap = g->cap ? g->cap : 64;
		while (cap < (int)max_problems)
			cap = cap > INT32_MAX / 2 ? INT32_MAX : cap * 2;
		int *b = (int *)malloc((size_t)cap * BLAS_GROUPED_ARRAYS *
		                       sizeof(int));
		if (!b)
			return KVT_ENOMEM;
		free(g->block);
		g->block = b;
		g->cap = cap;
		int *a[BLAS_GROUPED_ARRAYS];
		for (int i = 0; i < BLAS_GROUPED_ARRAYS; i++)
			a[i] = b + (size_t)i * cap;
		g->ta = (cublasOperation_t *)a[0];
		g->tb = (cublasOperation_t *)a[1];
		g->m = a[2], g->n = a[3], g->k = a[4];
		g->lda = a[5], g->ldb = a[6], g->ldc = a[7], g->size = a[8];
		g->alpha = (float *)a[9];
		g->beta = (float *)a[10];
	}
	return 0;
}

/* Appends one problem (rows of x, d_in, d_out as blas_xwt's n, d_in,
 * d_out); rows 0 adds nothing.  KVT_EINVAL past int sizes or past the
 * capacity reserved by blas_grouped_reset. */
static inline int blas_grouped_add(struct blas_grouped *g, uint32_t rows,
                                   uint32_t d_in, uint32_t d_out, float beta)
{
	if (!rows)
		return 0;
	if (rows > INT32_MAX || !d_in || d_in > INT32_MAX || !d_out ||
	    d_out > INT32_MAX || g->problems >= g->cap)
		return KVT_EINVAL;
	int i = g->groups - 1;
	/* the operands' sizes are what blas_xwt passes */
	if (i >= 0 && g->n[i] == (int)rows && g->k[i] == (int)d_in &&
	    g->m[i] == (int)d_out && g->beta[i] == beta) {
		g->size[i]++;
	} else {
		i = g->groups++;
		g->ta[i] = CUBLAS_OP_T;
		g->tb[i] = CUBLAS_OP_N;
		g->m[i] = (int)d_out;
		g->n[i] = (int)rows;
		g->k[i] = (int)d_in;
		g->lda[i] = g->ldb[i] = (int)d_in;
		g->ldc[i] = (int)d_out;
		g->alpha[i] = 1.f;
		g->beta[i] = beta;
		g->size[i] = 1;
	}
	g->problems++;
	return 0;
}

/*
 * g's problems in one cuBLAS call on stream s (the handle's stream is set
 * to s and left there): W, x and y are DEVICE arrays of g->problems device
 * pointers, in the order the problems were added; the y matrices must not
 * overlap.  No problems, no call.
 */
static inline int blas_grouped_run(cublasHandle_t h,
                                   const struct blas_grouped *g,
                                   const float *const *W,
                                   const float *const *x, float *const *y,
                                   cudaStream_t s)
{
	if (!g->groups)
		return 0;
	int rv = blas_err(cublasSetStream(h, s));
	if (rv)
		return rv;
	common_count_launch();
	return blas_err(cublasSgemmGroupedBatched(
		h, g->ta, g->tb, g->m, g->n, g->k, g->alpha, W, g->lda, x,
		g->ldb, g->beta, y, g->ldc, g->groups, g->size));
}

/*
 * The batched scorers' rows: every job's rows are packed one after the
 * other in each of their matrices (x's products, scores), job j's from
 * row row0; the segments are sorted by row0, none empty, and the last
 * ends at the batch's row count.  layer picks the job's weights.
 */
struct blas_seg {
	uint32_t row0, layer;
};

/* The segment holding packed row r: the last one with row0 <= r. */
static __device__ inline uint32_t blas_seg_find(
	const struct blas_seg *__restrict__ seg, uint32_t nseg, uint32_t r)
{
	uint32_t lo = 0, hi = nseg; /* seg[lo].row0 <= r < seg[hi].row0 */
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (seg[mid].row0 <= r)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

#endif
