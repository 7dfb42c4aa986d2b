/*
 * cuda_fp16.h — stand-in for the toolkit's half type in the CPU emulation
 * of the kernels (tests/kernels/emu/, docs/cuda.md).  The conversions do
 * what the device's cvt instructions do (and the toolkit's own host path):
 * round to nearest even, overflow to inf, and every NaN becomes the
 * canonical 0x7fff (f16) or 0x7fffffff (f32).  Plain bit arithmetic, so no
 * dependence on the host's rounding mode or on F16C.
 *
 * Deliberately smaller than the toolkit's: no __half arithmetic and no
 * implicit conversion to float, so a kernel that would do half arithmetic
 * on the device fails to compile here instead of silently computing in
 * float.  C++ only.
 */
#ifndef KVT_EMU_CUDA_FP16_H
#define KVT_EMU_CUDA_FP16_H

#ifdef __cplusplus

#include <stdint.h>
#include <string.h>

#include "vector_types.h"

struct __half_raw {
	unsigned short x;
};

struct __half {
	unsigned short __x;
	__half() = default;
	constexpr __half(__half_raw r) : __x(r.x) {}
	constexpr operator __half_raw() const { return __half_raw{__x}; }
};

struct __half2_raw {
	unsigned short x, y;
};

/* x is the low 16 bits of the 32-bit word, as on the device. */
struct __attribute__((aligned(4))) __half2 {
	__half x, y;
};

namespace kvt_emu {

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* cvt.rn.f16.f32 */
static inline unsigned short f32_to_f16_rn(float f)
{
	uint32_t x = f32_bits(f), u = x & 0x7fffffffu;
	uint32_t sign = (x >> 16) & 0x8000u, r, rem;
	if (u >= 0x7f800000u)
		return (unsigned short)(u == 0x7f800000u ? sign | 0x7c00u
		                                         : 0x7fffu);
	if (u > 0x477fefffu) /* >= 65520: rounds to inf */
		return (unsigned short)(sign | 0x7c00u);
	if (u >= 0x38800000u) { /* normal half */
		r = (u - 0x38000000u) >> 13;
		rem = u << 19; /* the 13 dropped bits, at the top */
	} else if (u < 0x33000001u) { /* <= 2^-25: zero (a tie goes even) */
		return (unsigned short)sign;
	} else { /* subnormal half: shift in [14, 24] */
		uint32_t shift = 0x7eu - (u >> 23);
		uint32_t m = (u & 0x7fffffu) | 0x800000u;
		r = m >> shift;
		rem = m << (32 - shift);
	}
	if (rem > 0x80000000u || (rem == 0x80000000u && (r & 1u)))
		r++; /* a carry into the exponent is the right answer */
	return (unsigned short)(sign | r);
}

/* cvt.f32.f16: exact; a NaN becomes the canonical one */
static inline float f16_to_f32(unsigned short h)
{
	uint32_t sign = (uint32_t)(h >> 15) & 1u;
	uint32_t e = (uint32_t)(h >> 10) & 0x1fu;
	uint32_t m = ((uint32_t)h & 0x3ffu) << 13;
	if (e == 0x1fu) {
		if (m)
			return bits_f32(0x7fffffffu);
		return bits_f32(sign << 31 | 0x7f800000u);
	}
	if (e == 0) {
		if (m == 0)
			return bits_f32(sign << 31);
		e = 0x71u; /* normalise the subnormal */
		uint32_t msb;
		do {
			msb = m & 0x400000u;
			m <<= 1;
			e--;
		} while (!msb);
		m &= 0x7fffffu;
	} else {
		e += 0x70u;
	}
	return bits_f32(sign << 31 | e << 23 | m);
}

} /* namespace kvt_emu */

static inline __half __float2half_rn(float f)
{
	return __half_raw{kvt_emu::f32_to_f16_rn(f)};
}
static inline __half __float2half(float f)
{
	return __float2half_rn(f);
}
static inline float __half2float(__half h)
{
	return kvt_emu::f16_to_f32(h.__x);
}
static inline unsigned short __half_as_ushort(__half h)
{
	return h.__x;
}
static inline __half __ushort_as_half(unsigned short u)
{
	return __half_raw{u};
}
static inline __half2 __floats2half2_rn(float a, float b)
{
	return __half2{__float2half_rn(a), __float2half_rn(b)};
}
static inline __half2 __float2half2_rn(float a)
{
	return __floats2half2_rn(a, a);
}
static inline float2 __half22float2(__half2 h)
{
	return make_float2(__half2float(h.x), __half2float(h.y));
}
static inline float __low2float(__half2 h)
{
	return __half2float(h.x);
}
static inline float __high2float(__half2 h)
{
	return __half2float(h.y);
}

#endif /* __cplusplus */
#endif
