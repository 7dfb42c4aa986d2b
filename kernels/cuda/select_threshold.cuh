/*
 * select_threshold.cuh — CUDA twin of select_threshold_cpu
 * (kernels/cpu/kernels.h): marks unprotected entries with score < tau (or
 * NaN) for dropping.
 */
#ifndef KVT_CUDA_SELECT_THRESHOLD_CUH
#define KVT_CUDA_SELECT_THRESHOLD_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Device memory: score [n], protect [n] or NULL, drop [n] (written for
 * every i).  The count the CPU version returns goes to the device word
 * *n_dropped when not NULL (zeroed first on s).  Asynchronous on s.
 */
int select_threshold_cuda(const float *score, const uint8_t *protect,
                          uint32_t n, float tau, uint8_t *drop,
                          uint32_t *n_dropped, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
