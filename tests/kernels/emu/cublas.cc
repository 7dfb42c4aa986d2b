/*
 * cublas.cc — the cuBLAS calls of the CPU emulator (include/cublas_v2.h;
 * docs/cuda.md, "CPU emulation of the kernels"), on OpenBLAS.
 *
 * cublasSgemm is cblas_sgemm in column-major order, which is cuBLAS's own,
 * and cublasSgemmGroupedBatched the same call per problem (one launch),
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

namespace {

/* The shapes of one product as stored: A is ar x ac, B br x bc. */
struct gemm_args {
	cublasOperation_t ta, tb;
	int m, n, k, lda, ldb, ldc;
	int ar, ac, br, bc;
};

gemm_args gemm_shape(cublasOperation_t ta, cublasOperation_t tb, int m,
                     int n, int k, int lda, int ldb, int ldc)
{
	/* op(A) is m x k, op(B) k x n */
	gemm_args g{ta, tb, m, n, k, lda, ldb, ldc, 0, 0, 0, 0};
	g.ar = ta == CUBLAS_OP_N ? m : k;
	g.ac = ta == CUBLAS_OP_N ? k : m;
	g.br = tb == CUBLAS_OP_N ? k : n;
	g.bc = tb == CUBLAS_OP_N ? n : k;
	return g;
}

/* cuBLAS's argument rules of a gemm (and of each group of a grouped one). */
bool gemm_valid(const char *fn, const gemm_args &g)
{
	if ((unsigned)g.ta <= CUBLAS_OP_C && (unsigned)g.tb <= CUBLAS_OP_C &&
	    g.m >= 0 && g.n >= 0 && g.k >= 0 &&
	    g.lda >= (g.ar > 1 ? g.ar : 1) && g.ldb >= (g.br > 1 ? g.br : 1) &&
	    g.ldc >= (g.m > 1 ? g.m : 1))
		return true;
	kvt_emu::note("%s: invalid arguments (op %d %d, m %d n %d k %d, ld %d "
	              "%d %d)",
	              fn, (int)g.ta, (int)g.tb, g.m, g.n, g.k, g.lda, g.ldb,
	              g.ldc);
	return false;
}

/* Whether the matrices the product reads and writes are device memory. */
bool gemm_on_device(const gemm_args &g, float alpha, const float *A,
                    const float *B, const float *C)
{
	if (g.m == 0 || g.n == 0)
		return true;
	return on_device("C", C, g.m, g.n, g.ldc) &&
	       (!g.k || alpha == 0.f ||
	        (on_device("A", A, g.ar, g.ac, g.lda) &&
	         on_device("B", B, g.br, g.bc, g.ldb)));
}

/* C = alpha op(A) op(B) + beta C on checked arguments. */
void gemm_run(cublasMath_t mode, const gemm_args &g, float a,
              const float *A, const float *B, float b, float *C)
{
	const int m = g.m, n = g.n, ldc = g.ldc;
	if (m == 0 || n == 0)
		return;
	if (b == 0.f) /* C is written, never read */
		for (int c = 0; c < n; c++)
			memset(C + (size_t)c * ldc, 0, (size_t)m * 4);
	if (g.k == 0 || a == 0.f) {
		if (b != 0.f && b != 1.f)
			for (int c = 0; c < n; c++)
				for (int r = 0; r < m; r++)
					C[(size_t)c * ldc + r] *= b;
		return;
	}
	std::vector<float> a32, b32;
	if ((mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH) {
		a32 = tf32_copy(A, g.ar, g.ac, g.lda);
		b32 = tf32_copy(B, g.br, g.bc, g.ldb);
		A = a32.data();
		B = b32.data();
	}
	CBLAS_TRANSPOSE cta = g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	CBLAS_TRANSPOSE ctb = g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	cblas_sgemm(CblasColMajor, cta, ctb, m, n, g.k, a, A, g.lda, B, g.ldb,
	            b, C, ldc);
}

/* An array of n pointers the call reads on the device. */
bool ptrs_on_device(const char *what, const void *p, int64_t n)
{
	if (!n || (p && kvt_emu::is_device(p, (size_t)n * sizeof(void *))))
		return true;
	kvt_emu::note("cublasSgemmGroupedBatched: %s (%p, %lld pointers) is "
	              "not inside a cudaMalloc allocation",
	              what, p, (long long)n);
	return false;
}

} /* namespace */

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
	gemm_args g = gemm_shape(ta, tb, m, n, k, lda, ldb, ldc);
	if (!gemm_valid("cublasSgemm", g) || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!gemm_on_device(g, *alpha, A, B, C))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	gemm_run(h->mode, g, *alpha, A, B, *beta, C);
	return CUBLAS_STATUS_SUCCESS;
}

/*
 * One launch, as on the GPU: the problems one by one, each the cublasSgemm
 * of its group's arguments, so that a grouped product has the bits of the
 * same calls made singly.  The per-group arrays are host memory, the
 * pointer arrays device memory (cuBLAS's documented locations); every
 * argument and matrix is checked before any is computed, so a refused
 * call writes nothing.
 */
extern "C" cublasStatus_t cublasSgemmGroupedBatched(
	cublasHandle_t h, const cublasOperation_t transa_array[],
	const cublasOperation_t transb_array[], const int m_array[],
	const int n_array[], const int k_array[], const float alpha_array[],
	const float *const Aarray[], const int lda_array[],
	const float *const Barray[], const int ldb_array[],
	const float beta_array[], float *const Carray[], const int ldc_array[],
	int group_count, const int group_size[])
{
	EMU_API_LOCK();
	kvt_emu::launches_total++;
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (kvt_emu::sticky_error() != cudaSuccess)
		return CUBLAS_STATUS_EXECUTION_FAILED;
	if (!transa_array || !transb_array || !m_array || !n_array ||
	    !k_array || !alpha_array || !lda_array || !ldb_array ||
	    !beta_array || !ldc_array || !group_size || group_count < 0) {
		kvt_emu::note("cublasSgemmGroupedBatched: a NULL array or "
		              "group_count %d",
		              group_count);
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	std::vector<gemm_args> gs;
	int64_t problems = 0;
	for (int i = 0; i < group_count; i++) {
		gs.push_back(gemm_shape(transa_array[i], transb_array[i],
		                        m_array[i], n_array[i], k_array[i],
		                        lda_array[i], ldb_array[i],
		                        ldc_array[i]));
		if (!gemm_valid("cublasSgemmGroupedBatched", gs[i]))
			return CUBLAS_STATUS_INVALID_VALUE;
		if (group_size[i] < 0) {
			kvt_emu::note("cublasSgemmGroupedBatched: group %d of "
			              "size %d",
			              i, group_size[i]);
			return CUBLAS_STATUS_INVALID_VALUE;
		}
		problems += group_size[i];
	}
	/* the pointer arrays lie in allocations: problems is bounded */
	if (!ptrs_on_device("Aarray", Aarray, problems) ||
	    !ptrs_on_device("Barray", Barray, problems) ||
	    !ptrs_on_device("Carray", Carray, problems))
		return CUBLAS_STATUS_EXECUTION_FAILED;
	std::vector<int> group_of; /* each problem's group */
	for (int i = 0; i < group_count; i++)
		group_of.insert(group_of.end(), (size_t)group_size[i], i);
	for (int64_t p = 0; p < problems; p++) { /* all checked, then run */
		int i = group_of[(size_t)p];
		if (!gemm_on_device(gs[i], alpha_array[i], Aarray[p], Barray[p],
		                    Carray[p]))
			return CUBLAS_STATUS_EXECUTION_FAILED;
	}
	for (int64_t p = 0; p < problems; p++) {
		int i = group_of[(size_t)p];
		gemm_run(h->mode, gs[i], alpha_array[i], Aarray[p], Barray[p],
		         beta_array[i], Carray[p]);
	}
	return CUBLAS_STATUS_SUCCESS;
}
