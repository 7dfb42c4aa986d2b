/*
 * sink_gate.cuh — CUDA twin of sink_gate_cpu (kernels/cpu/kernels.h):
 * Fast KVzip's low-rank sink-attention gate, score[i][g] in (0, 1).
 */
#ifndef KVT_CUDA_SINK_GATE_CUH
#define KVT_CUDA_SINK_GATE_CUH

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Same arguments as sink_gate_cpu (device float32, layouts as there) plus
 * a cuBLAS handle for the two projections (its stream becomes s).  scratch
 * holds n * n_kv * (G + 1) * dp floats: the projected queries and keys.
 * dp at most 256 (KVT_ENOTSUP beyond).  Asynchronous on s.
 */
int sink_gate_cuda(cublasHandle_t h, const float *x /* [n][d_in] */,
                   uint32_t n, uint32_t d_in, uint32_t n_kv, uint32_t G,
                   uint32_t dp, uint32_t S, const float *Wq, const float *cq,
                   const float *Wk, const float *gq, const float *gk,
                   const float *sinks, const float *bias,
                   float *score /* [n][n_kv] */, float *scratch,
                   cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
