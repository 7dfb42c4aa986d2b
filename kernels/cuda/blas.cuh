/*
 * blas.cuh — the row-major cuBLAS product the scorers share (internal to
 * libkvtrim-cuda.so; static inline, nothing exported).
 */
#ifndef KVT_CUDA_BLAS_CUH
#define KVT_CUDA_BLAS_CUH

#include <cublas_v2.h>
#include <stdint.h>

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

#endif
