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

struct blas_grouped; /* blas.cuh: the host half of a grouped GEMM */
struct blas_seg;     /* blas.cuh: a job's packed rows and layer */

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

/*
 * The batched scorers' elementwise stage, one launch over the packed rows
 * of nseg segments (seg: device, blas.cuh), rows in all:
 *   a [rows][ca] = va + layer * stride (a vector of ca, per the row's
 *   layer; va NULL: zeros), or when gelu a = exact erf GELU of a in place;
 *   then b [rows][cb] = vb + layer * stride (NULL: zeros); cb 0: no b.
 * Prefilling the bias and then accumulating the product with beta 1 is
 * scorer_linear_cpu's order of additions, so the sums are its own.
 * Asynchronous on s.
 */
int scorer_rows_init_cuda(const struct blas_seg *seg, uint32_t nseg,
                          uint64_t rows, float *a, uint32_t ca,
                          const float *va, int gelu, float *b, uint32_t cb,
                          const float *vb, uint64_t stride, cudaStream_t s);

/*
 * Many jobs' y = x W^T + b in two launches (the bias prefill, one grouped
 * SGEMM): job j (segment j of seg, nseg of them, device) is problem j of g
 * (host; its rows, d_in and d_out), whose device pointer arrays are
 * ptr[0 .. P) (the layer's W), ptr[P .. 2P) (x) and ptr[2P .. 3P) (its
 * rows of y [rows][d_out]), P = nseg.  b is layer 0's bias; layer l's is
 * b + l * stride.  Per job the same bits as scorer_linear_cpu on the
 * emulator.  Asynchronous on s.
 */
int scorer_linear_batch_cuda(cublasHandle_t h, const struct blas_grouped *g,
                             const float *const *ptr,
                             const struct blas_seg *seg, uint32_t nseg,
                             uint64_t rows, const float *b, uint64_t stride,
                             uint32_t d_out, float *y, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
