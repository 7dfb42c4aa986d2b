/*
 * attn_band.cuh — CUDA twin of attn_band_cpu (kernels/cpu/kernels.h):
 * attention weights of n_q staged queries against the entries of one list,
 * recomputed from the engine's log-sum-exp, causal by original position:
 *   w[t][g][i] = exp(q[t][g] . k_i * scale - lse[t][g])  if kpos[i] <= qpos[t]
 *              = 0                                        otherwise
 */
#ifndef KVT_CUDA_ATTN_BAND_CUH
#define KVT_CUDA_ATTN_BAND_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Same arguments as attn_band_cpu, all device memory; pages is a device
 * array of device page addresses.  kscratch is not needed on the GPU (keys
 * are gathered into shared memory tile by tile) and may be NULL.
 * Asynchronous on s; returns 0, KVT_EINVAL or the mapped CUDA error.
 */
int attn_band_cuda(const float *q /* [n_q][G][head_dim] */,
                   const float *lse /* [n_q][G] */,
                   const uint32_t *qpos /* [n_q] */, uint32_t n_q, uint32_t G,
                   void *const *pages, uint32_t page_tokens,
                   uint32_t head_dim, enum kvt_dtype dt,
                   const uint32_t *kpos /* [len] */, uint32_t len, float scale,
                   float *w /* [n_q][G][len] */, float *kscratch,
                   cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
