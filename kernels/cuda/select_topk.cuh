/*
 * select_topk.cuh — CUDA twin of select_topk_cpu (kernels/cpu/kernels.h):
 * marks entries to drop so that at most k of the unprotected ones remain,
 * keeping the k highest scores; ties keep the higher rank[]; NaN scores
 * rank below everything; protected entries are never dropped and do not
 * count against k.
 */
#ifndef KVT_CUDA_SELECT_TOPK_CUH
#define KVT_CUDA_SELECT_TOPK_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Device memory: score [n], rank [n], protect [n] or NULL, drop [n]
 * (written for every i, 0 or 1).  scratch is not needed on the GPU (may be
 * NULL).  The count of marked entries, which select_topk_cpu returns, is
 * written to the device word *n_dropped when it is not NULL.  The selection
 * is exact: a radix select on the key (score, rank) in one thread block,
 * so the drop set equals the CPU's: equal (score, rank) keys keep the
 * highest indices; rank NULL ranks by index.
 * Asynchronous on s; returns 0, KVT_EINVAL or the mapped launch error.
 */
int select_topk_cuda(const float *score /* [n] */,
                     const uint32_t *rank /* [n] or NULL */,
                     const uint8_t *protect, uint32_t n, uint32_t k,
                     uint8_t *drop /* [n] */, uint32_t *scratch,
                     uint32_t *n_dropped /* device, or NULL */,
                     cudaStream_t s);

/*
 * n_lists independent selections in one launch (one block each): list j
 * is entries [first[j], first[j + 1]) of score/rank/protect/drop and keeps
 * k[j].  first [n_lists + 1], k [n_lists] and n_dropped [n_lists] (or
 * NULL) are device arrays.  rank NULL ranks each entry by its index in its
 * list, as select_topk_cpu on that list with rank NULL.  max_len, the
 * longest list's length as the host knows it, sizes the blocks (a power
 * of two from 32 to 1024 threads); it changes no result: a longer list
 * is still selected exactly, by fewer threads than it could use.
 */
int select_topk_batch_cuda(const float *score, const uint32_t *rank,
                           const uint8_t *protect, const uint32_t *first,
                           uint32_t n_lists, uint32_t max_len,
                           const uint32_t *k, uint8_t *drop,
                           uint32_t *n_dropped, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
