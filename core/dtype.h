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

/* Bytes of one element, 0 for an unknown dtype: kvt_dtype_size itself,
 * inline so that the CUDA code, which does not link core, includes the
 * same definition (kernels/cuda/common.cuh: plain C, also C++). */
static inline size_t dtype_size(enum kvt_dtype dt)
{
	switch (dt) {
	case KVT_DTYPE_F32:
		return 4;
	case KVT_DTYPE_F16:
	case KVT_DTYPE_BF16:
		return 2;
	}
	return 0;
}

/* C linkage also for C++ (the CUDA code includes this header through
 * kernels/cuda/common.cuh). */
#ifdef __cplusplus
extern "C" {
#endif

/* Converts n elements of dtype dt to float32; src and dst may be the same
 * buffer only for KVT_DTYPE_F32. */
void dtype_to_f32(const void *src /* [n] of dt */, enum kvt_dtype dt,
                  float *dst /* [n] */, size_t n);
/* float32 to dtype, round to nearest even; NaN stays NaN. */
void dtype_from_f32(const float *src /* [n] */, enum kvt_dtype dt,
                    void *dst /* [n] of dt */, size_t n);
/* The command lines' names "f32", "f16", "bf16": 0 and *dt, else -1 and
 * *dt untouched. */
int dtype_parse(const char *name, enum kvt_dtype *dt);

#ifdef __cplusplus
}
#endif

#endif
