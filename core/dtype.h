/*
 * dtype.h — the element types of K/V pages and their conversions to and
 * from float32 (CPU reference, core/dtype.c).  kvt_dtype_size (the bytes
 * of one element) is public and declared in kvtrim.h; it is defined in
 * dtype.c too.
 *
 * f16 is IEEE binary16, bf16 the top half of a float32.  The conversions
 * are pure bit manipulation, so results do not depend on the FPU rounding
 * mode or on F16C, and the CUDA twins (__float2half_rn,
 * __float2bfloat16_rn in kernels/cuda/common.cuh) match them bit for bit.
 */
#ifndef KVT_DTYPE_H
#define KVT_DTYPE_H

#include <stddef.h>

#include "kvtrim.h"

/* Converts n elements of dtype dt to float32; src and dst may be the same
 * buffer only for KVT_DTYPE_F32. */
void dtype_to_f32(const void *src /* [n] of dt */, enum kvt_dtype dt,
                  float *dst /* [n] */, size_t n);
/* float32 to dtype, round to nearest even; NaN stays NaN. */
void dtype_from_f32(const float *src /* [n] */, enum kvt_dtype dt,
                    void *dst /* [n] of dt */, size_t n);

#endif
