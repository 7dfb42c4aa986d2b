/*
 * append_kv.cuh — CUDA twin of append_kv_cpu (kernels/cpu/kernels.h):
 * writes n float32 entries into a page list at entries [first, first + n),
 * converted to the list's dtype.
 */
#ifndef KVT_CUDA_APPEND_KV_CUH
#define KVT_CUDA_APPEND_KV_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * pages: device array of device page addresses ([first + n] / page_tokens
 * pages at least); k, v: device [n][head_dim] float32.  Asynchronous on s;
 * returns 0, KVT_EINVAL (bad dtype or shape) or the mapped CUDA error of
 * the launch.  n 0 launches nothing.
 */
int append_kv_cuda(void *const *pages, uint32_t page_tokens, uint32_t head_dim,
                   enum kvt_dtype dt, uint32_t first,
                   const float *k /* [n][head_dim] */,
                   const float *v /* [n][head_dim] */, uint32_t n,
                   cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
