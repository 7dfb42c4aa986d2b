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

struct blas_grouped; /* blas.cuh */
struct blas_seg;

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

/*
 * Many jobs' gates in three launches: cq prefilled into the projected
 * queries and zeros into the keys, both projections of every job in one
 * grouped SGEMM, then one thread per (row, KV head).  g holds the query
 * problems of the nseg segments (d_in to n_kv * G * dp), then their key
 * problems (d_in to n_kv * dp); ptr[0 .. P), [P .. 2P), [2P .. 3P) their
 * W, x and output pointers, P = 2 * nseg, the outputs rows of scratch:
 * queries [rows][n_kv][G][dp], then keys [rows][n_kv][dp].  cq, gq, gk,
 * sinks, bias: layer 0's tensors, layer l's at + l * stride.  The gate's
 * arithmetic is sink_gate_cpu's, in its order (a float sum per dot
 * product, the probabilities summed in double), so on the emulator the
 * scores are its bits.  dp at most 256 (KVT_ENOTSUP beyond).
 * Asynchronous on s.
 */
int sink_gate_batch_cuda(cublasHandle_t h, const struct blas_grouped *g,
                         const float *const *ptr, const struct blas_seg *seg,
                         uint32_t nseg, uint64_t rows, uint32_t n_kv,
                         uint32_t G, uint32_t dp, uint32_t S,
                         const float *cq, const float *gq, const float *gk,
                         const float *sinks, const float *bias,
                         uint64_t stride, float *scratch,
                         float *score /* [rows][n_kv] */, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
