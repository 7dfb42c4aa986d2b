/*
 * compact.cuh — CUDA twin of compact_cpu (kernels/cpu/compact.h): executes
 * the moves compact_plan() made, copying the K and V rows of entry src to
 * entry dst of the same page list.  Destinations and sources of one plan
 * are disjoint (dst < new_len <= src), so all moves run in parallel.
 */
#ifndef KVT_CUDA_COMPACT_CUH
#define KVT_CUDA_COMPACT_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Same arguments as compact_cpu, all on the device: pages is a device array
 * of device page addresses, moves a device [n_moves][2] (dst, src) array.
 * Page addresses must be aligned to the largest power of two (<= 16) that
 * divides row_bytes (pool pages are).  Asynchronous on s; returns 0,
 * KVT_EINVAL or the mapped CUDA launch error.
 */
int compact_cuda(void *const *pages, uint32_t page_tokens, uint32_t row_bytes,
                 const uint32_t *moves /* [n_moves][2] */, uint32_t n_moves,
                 cudaStream_t s);

/*
 * Many lists of one geometry in one launch (what a sync compacts):
 * pages is the device array of every list's page addresses, one list after
 * the other; moves is a device [n_moves][3] array of (dst, src, first)
 * where first is the index in pages of that move's list's page 0.
 */
int compact_batch_cuda(void *const *pages, uint32_t page_tokens,
                       uint32_t row_bytes,
                       const uint32_t *moves /* [n_moves][3] */,
                       uint32_t n_moves, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
