/*
 * cuda_bf16.h — stand-in for the toolkit's bfloat16 type in the CPU
 * emulation of the kernels (tests/kernels/emu/, docs/cuda.md).  As on the
 * device (cvt.rn.bf16.f32, sm_80 and later): round to nearest even, and
 * every NaN becomes the canonical 0x7fff.  Like cuda_fp16.h here, no
 * arithmetic and no implicit conversion to float.  C++ only.
 */
#ifndef KVT_EMU_CUDA_BF16_H
#define KVT_EMU_CUDA_BF16_H

#ifdef __cplusplus

#include "cuda_fp16.h"

struct __nv_bfloat16_raw {
	unsigned short x;
};

struct __nv_bfloat16 {
	unsigned short __x;
	__nv_bfloat16() = default;
	constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
	constexpr operator __nv_bfloat16_raw() const
	{
		return __nv_bfloat16_raw{__x};
	}
};

/* x is the low 16 bits of the 32-bit word, as on the device. */
struct __attribute__((aligned(4))) __nv_bfloat162 {
	__nv_bfloat16 x, y;
};

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

namespace kvt_emu {

static inline unsigned short f32_to_bf16_rn(float f)
{
	uint32_t x = f32_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return 0x7fffu;
	uint32_t r = x >> 16, rem = x << 16;
	if (rem > 0x80000000u || (rem == 0x80000000u && (r & 1u)))
		r++;
	return (unsigned short)r;
}

} /* namespace kvt_emu */

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	return __nv_bfloat16_raw{kvt_emu::f32_to_bf16_rn(f)};
}
static inline __nv_bfloat16 __float2bfloat16(float f)
{
	return __float2bfloat16_rn(f);
}
static inline float __bfloat162float(__nv_bfloat16 h)
{
	return kvt_emu::bits_f32((uint32_t)h.__x << 16);
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h)
{
	return h.__x;
}
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
	return __nv_bfloat16_raw{u};
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b)
{
	return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 h)
{
	return make_float2(__bfloat162float(h.x), __bfloat162float(h.y));
}
static inline float __low2float(__nv_bfloat162 h)
{
	return __bfloat162float(h.x);
}
static inline float __high2float(__nv_bfloat162 h)
{
	return __bfloat162float(h.y);
}

#endif /* __cplusplus */
#endif
