/*
 * scorer_mlp.cuh — CUDA twin of scorer_mlp_cpu (kernels/cpu/kernels.h):
 * y = W2 gelu(W1 x + b1) + b2 with the exact erf GELU (KVzap MLP).
 */
#ifndef KVT_CUDA_SCORER_MLP_CUH
#define KVT_CUDA_SCORER_MLP_CUH

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

struct blas_grouped; /* blas.cuh */
struct blas_seg;

/*
 * Device float32: x [n][d_in], W1 [hidden][d_in], b1 [hidden] (NULL = 0),
 * W2 [d_out][hidden], b2 [d_out] (NULL = 0), y [n][d_out], hscratch
 * [n][hidden].  Two SGEMMs on h (its stream becomes s) and two small
 * kernels (bias + GELU fused, bias).  Asynchronous on s.
 */
int scorer_mlp_cuda(cublasHandle_t h, const float *x, uint32_t n,
                    uint32_t d_in, const float *W1, const float *b1,
                    uint32_t hidden, const float *W2, const float *b2,
                    uint32_t d_out, float *y /* [n][d_out] */,
                    float *hscratch /* [n][hidden] */, cudaStream_t s);

/*
 * Many jobs' MLP in four launches (b1 prefilled into hscratch, a grouped
 * SGEMM, GELU with b2 prefilled into y, a grouped SGEMM), as
 * scorer_linear_batch_cuda (scorer_linear.cuh) twice: g1 (d_in to hidden)
 * and g2 (hidden to d_out) hold one problem per segment each, ptr[0 .. 3P)
 * their W1, x and hscratch pointers and ptr[3P .. 6P) their W2, hscratch
 * and y pointers, P = nseg.  b1, b2: layer 0's, layer l's at + l * stride.
 * hscratch [rows][hidden], y [rows][d_out].  Per job the same bits as
 * scorer_mlp_cpu on the emulator.  Asynchronous on s.
 */
int scorer_mlp_batch_cuda(cublasHandle_t h, const struct blas_grouped *g1,
                          const struct blas_grouped *g2,
                          const float *const *ptr,
                          const struct blas_seg *seg, uint32_t nseg,
                          uint64_t rows, const float *b1, uint32_t hidden,
                          const float *b2, uint32_t d_out, uint64_t stride,
                          float *hscratch, float *y, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
