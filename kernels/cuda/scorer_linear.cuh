/*
 * scorer_linear.cuh — CUDA twin of scorer_linear_cpu
 * (kernels/cpu/kernels.h): y = x W^T + b (KVzap linear surrogate).
 */
#ifndef KVT_CUDA_SCORER_LINEAR_CUH
#define KVT_CUDA_SCORER_LINEAR_CUH

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * x [n][d_in], W [d_out][d_in], b [d_out] (NULL = 0), y [n][d_out]: device
 * float32.  One cuBLAS SGEMM on handle h (whose stream becomes s; its math
 * mode is the caller's: TF32 modes trade accuracy for speed) and one bias
 * kernel.  Asynchronous on s; returns 0, KVT_EINVAL or a mapped error.
 */
int scorer_linear_cuda(cublasHandle_t h, const float *x, uint32_t n,
                       uint32_t d_in, const float *W, const float *b,
                       uint32_t d_out, float *y /* [n][d_out] */,
                       cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
