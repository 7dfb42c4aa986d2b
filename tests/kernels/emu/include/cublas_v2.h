/*
 * cublas_v2.h — stand-in for the cuBLAS API in the CPU emulation of the
 * kernels (tests/kernels/emu/, docs/cuda.md): the calls kernels/cuda/ and
 * the test make, with cuBLAS's names and status numbers.  tests/kernels/
 * emu/cublas.cc implements cublasSgemm with OpenBLAS's cblas_sgemm in
 * column-major order, which is cuBLAS's (cublasSgemmGroupedBatched: that
 * per problem); a handle in a TF32 math mode
 * rounds the inputs to TF32 first, as the tensor cores would.  Valid C and
 * C++.
 */
#ifndef KVT_EMU_CUBLAS_V2_H
#define KVT_EMU_CUBLAS_V2_H

#include "cuda_runtime_api.h"

typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_ALLOC_FAILED = 3,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_ARCH_MISMATCH = 8,
	CUBLAS_STATUS_MAPPING_ERROR = 11,
	CUBLAS_STATUS_EXECUTION_FAILED = 13,
	CUBLAS_STATUS_INTERNAL_ERROR = 14,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
	CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
	CUBLAS_OP_N = 0,
	CUBLAS_OP_T = 1,
	CUBLAS_OP_C = 2
} cublasOperation_t;

typedef enum {
	CUBLAS_DEFAULT_MATH = 0,
	CUBLAS_TENSOR_OP_MATH = 1,
	CUBLAS_PEDANTIC_MATH = 2,
	CUBLAS_TF32_TENSOR_OP_MATH = 3,
	CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
} cublasMath_t;

typedef struct cublasContext *cublasHandle_t;

#ifdef __cplusplus
extern "C" {
#endif

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode);
const char *cublasGetStatusString(cublasStatus_t st);
const char *cublasGetStatusName(cublasStatus_t st);

/* C[m][n] = alpha op(A) op(B) + beta C, column-major (cuBLAS's order);
 * beta 0 never reads C. */
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta,
                           cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta,
                           float *C, int ldc);

/* Problem idx of group i: C[idx] = alpha[i] op(A[idx]) op(B[idx]) +
 * beta[i] C[idx] with group i's ops, sizes and leading dimensions; the
 * per-group arrays (group_count long) are host memory, Aarray, Barray and
 * Carray (sum of group_size long) device arrays of device pointers.
 * cuBLAS 12.5 and newer. */
cublasStatus_t cublasSgemmGroupedBatched(
	cublasHandle_t h, const cublasOperation_t transa_array[],
	const cublasOperation_t transb_array[], const int m_array[],
	const int n_array[], const int k_array[], const float alpha_array[],
	const float *const Aarray[], const int lda_array[],
	const float *const Barray[], const int ldb_array[],
	const float beta_array[], float *const Carray[], const int ldc_array[],
	int group_count, const int group_size[]);

#ifdef __cplusplus
}
#endif

#endif
