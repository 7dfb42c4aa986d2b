/*
 * cublas.cc — the cuBLAS calls of the CPU emulator (include/cublas_v2.h;
 * docs/cuda.md, "CPU emulation of the kernels"), on OpenBLAS.
 *
 * cublasSgemm is cblas_sgemm in column-major order, which is cuBLAS's own,
 * so the scorers' row-major trick (y^T = W x^T, blas.cuh) is exercised as
 * written.  The arguments are checked as cuBLAS checks them, and the
 * matrices must be device allocations (a host pointer faults on the GPU).
 * beta 0 never reads C (cuBLAS's rule: C may hold NaN).  In a TF32 math
 * mode the inputs are rounded to TF32 (10 mantissa bits, to nearest, ties
 * away) first, so a scorer test with a TF32 handle fails here as it would
 * on the tensor cores.
 */
#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "include/cublas_v2.h"
#include "internal.h"

struct cublasContext {
	cudaStream_t stream;
	cublasMath_t mode;
};

namespace {

/* cvt.rna.tf32.f32 */
float tf32(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7f800000u) != 0x7f800000u) { /* finite */
		u += 0x1000u;
		u &= ~0x1fffu;
	}
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* A rows x cols column-major matrix with leading dimension ld, copied with
 * every element rounded to TF32. */
std::vector<float> tf32_copy(const float *a, int rows, int cols, int ld)
{
	std::vector<float> v((size_t)ld * cols);
	for (int c = 0; c < cols; c++)
		for (int r = 0; r < rows; r++)
			v[(size_t)c * ld + r] = tf32(a[(size_t)c * ld + r]);
	return v;
}

bool on_device(const char *what, const float *p, int rows, int cols, int ld)
{
	if (!rows || !cols)
		return true;
	size_t n = ((size_t)(cols - 1) * ld + rows) * sizeof(float);
	if (kvt_emu::is_device(p, n))
		return true;
	kvt_emu::note("cublasSgemm: %s (%p, %d x %d, ld %d) is not inside a "
	              "cudaMalloc allocation",
	              what, (const void *)p, rows, cols, ld);
	return false;
}

} /* namespace */

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	EMU_API_LOCK();
	if (!h)
		return CUBLAS_STATUS_INVALID_VALUE;
	*h = new cublasContext{nullptr, CUBLAS_DEFAULT_MATH};
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	EMU_API_LOCK();
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	EMU_API_LOCK();
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!kvt_emu::is_stream(s)) {
		kvt_emu::note("cublasSetStream: %p is not a live stream",
		              (void *)s);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s)
{
	EMU_API_LOCK();
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!s)
		return CUBLAS_STATUS_INVALID_VALUE;
	*s = h->stream;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
	EMU_API_LOCK();
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->mode = mode;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetMathMode(cublasHandle_t h,
                                            cublasMath_t *mode)
{
	EMU_API_LOCK();
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!mode)
		return CUBLAS_STATUS_INVALID_VALUE;
	*mode = h->mode;
	return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char *cublasGetStatusName(cublasStatus_t st)
{
	EMU_API_LOCK();
	switch (st) {
	case CUBLAS_STATUS_SUCCESS:
		return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED:
		return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE:
		return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH:
		return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_EXECUTION_FAILED:
		return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_NOT_SUPPORTED:
		return "CUBLAS_STATUS_NOT_SUPPORTED";
	default:
		return "CUBLAS_STATUS_UNKNOWN";
	}
}

extern "C" const char *cublasGetStatusString(cublasStatus_t st)
{
	EMU_API_LOCK();
	return cublasGetStatusName(st);
}

extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta,
                                      cublasOperation_t tb, int m, int n,
                                      int k, const float *alpha,
                                      const float *A, int lda, const float *B,
                                      int ldb, const float *beta, float *C,
                                      int ldc)
{
	EMU_API_LOCK();
	kvt_emu::launches_total++;
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (kvt_emu::sticky_error() != cudaSuccess)
		return CUBLAS_STATUS_EXECUTION_FAILED;
	/* op(A) is m x k, op(B) k x n; A and B as stored: */
	int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
	int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
	if ((unsigned)ta > CUBLAS_OP_C || (unsigned)tb > CUBLAS_OP_C || m < 0 ||
	    n < 0 || k < 0 || lda < (ar > 1 ? ar : 1) ||
	    ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) || !alpha ||
	    !beta) {
		kvt_emu::note("cublasSgemm: invalid arguments (op %d %d, m %d "
		              "n %d k %d, ld %d %d %d)",
		              (int)ta, (int)tb, m, n, k, lda, ldb, ldc);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	if (m == 0 || n == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (!on_device("C", C, m, n, ldc) ||
	    (k && *alpha != 0.f &&
	     (!on_device("A", A, ar, ac, lda) ||
	      !on_device("B", B, br, bc, ldb))))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	const float a = *alpha, b = *beta;
	if (b == 0.f) /* C is written, never read */
		for (int c = 0; c < n; c++)
			memset(C + (size_t)c * ldc, 0, (size_t)m * 4);
	if (k == 0 || a == 0.f) {
		if (b != 0.f && b != 1.f)
			for (int c = 0; c < n; c++)
				for (int r = 0; r < m; r++)
					C[(size_t)c * ldc + r] *= b;
		return CUBLAS_STATUS_SUCCESS;
	}
	std::vector<float> a32, b32;
	if ((h->mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH) {
		a32 = tf32_copy(A, ar, ac, lda);
		b32 = tf32_copy(B, br, bc, ldb);
		A = a32.data();
		B = b32.data();
	}
	CBLAS_TRANSPOSE cta = ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	CBLAS_TRANSPOSE ctb = tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	cblas_sgemm(CblasColMajor, cta, ctb, m, n, k, a, A, lda, B, ldb, b, C,
	            ldc);
	return CUBLAS_STATUS_SUCCESS;
}
