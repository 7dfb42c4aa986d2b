/*
 * paged_attention.cuh — CUDA twin of paged_attention_cpu
 * (kernels/cpu/kernels.h): decode attention of one query token per
 * (layer, KV head) list over that list's pages, for the G query heads that
 * read it, returning the output and the log-sum-exp (natural log) of each
 * query head:
 *   out[g][:] = sum_i softmax_i(q[g] . k_i * scale) v_i
 *   lse[g]    = log sum_i exp(q[g] . k_i * scale)
 * len 0 gives out 0 and lse -INFINITY.  K/V in f32, f16 or bf16; head_dim
 * up to 256 (KVT_ENOTSUP beyond); q, out, lse float32.
 *
 * A split-K ("flash decoding") kernel: each thread block streams one
 * slice of one list's tokens once for all G heads of the group, keeps an
 * online softmax in registers, and a second small kernel merges the slices
 * with their log-sum-exps.  Slices are sized so the grid fills the GPU
 * whatever the batch.
 */
#ifndef KVT_CUDA_PAGED_ATTENTION_CUH
#define KVT_CUDA_PAGED_ATTENTION_CUH

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The twin of paged_attention_cpu, on the device: q [G][head_dim], pages a
 * device array of device page addresses, out [G][head_dim], lse [G].
 * scratch is device memory of G * len floats (as on the CPU); it holds the
 * per-slice partial results (NULL: one slice, slower for long lists).
 * Page addresses must be 16-byte aligned when head_dim * elem_bytes is a
 * multiple of 16 (pool pages are).  Asynchronous on s; returns 0,
 * KVT_EINVAL, KVT_ENOTSUP (head_dim > 256) or the mapped CUDA launch error.
 */
int paged_attention_cuda(const float *q /* [G][head_dim] */, uint32_t G,
                         void *const *pages, uint32_t page_tokens,
                         uint32_t head_dim, enum kvt_dtype dt, uint32_t len,
                         float scale, float *out /* [G][head_dim] */,
                         float *lse /* [G] */, float *scratch /* [G][len] */,
                         cudaStream_t s);

/*
 * The same over n_lists lists in one launch (a decode step of a batch:
 * one list per (sequence, KV head) of a layer).  All device memory:
 *   q          [n_lists][G][head_dim]
 *   pages      every list's page addresses, list after list
 *   page_first [n_lists] index in pages of each list's page 0
 *   lens       [n_lists] entries of each list; every lens[i] <= max_len
 *   out        [n_lists][G][head_dim], lse [n_lists][G]
 *   work       work_bytes of scratch for partial results; more splits fit
 *              in more (paged_attention_work_bytes says how much helps);
 *              NULL / 0 runs one slice per list.
 */
int paged_attention_batch_cuda(const float *q, uint32_t G, void *const *pages,
                               const uint32_t *page_first,
                               const uint32_t *lens, uint32_t n_lists,
                               uint32_t max_len, uint32_t page_tokens,
                               uint32_t head_dim, enum kvt_dtype dt,
                               float scale, float *out, float *lse,
                               void *work, size_t work_bytes, cudaStream_t s);

/* Bytes of work that let paged_attention_batch_cuda split as much as it
 * wants on the current device for this shape (0: no split helps). */
size_t paged_attention_work_bytes(uint32_t n_lists, uint32_t G,
                                  uint32_t head_dim, uint32_t max_len);

#ifdef __cplusplus
}
#endif
#endif
