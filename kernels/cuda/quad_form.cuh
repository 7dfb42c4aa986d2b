/*
 * quad_form.cuh — CUDA twin of quad_form_cpu (kernels/cpu/kernels.h):
 * k^T S k of n keys in the fixed order, the same bits.
 */
#ifndef KVT_CUDA_QUAD_FORM_CUH
#define KVT_CUDA_QUAD_FORM_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Same arguments as quad_form_cpu, all device memory.  Asynchronous on
 * s; returns 0, KVT_EINVAL (a NULL array where n > 0) or the mapped CUDA
 * error.
 */
int quad_form_cuda(const float *k /* [n][hd] */, uint32_t n, uint32_t hd,
                   const float *S /* [hd][hd] */, double *out /* [n] */,
                   cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
