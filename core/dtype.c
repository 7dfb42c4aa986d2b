/*
 * dtype.c — element sizes (kvt_dtype_size, public) and float32 <-> f16 /
 * bf16 conversion (CPU reference); see dtype.h.
 *
 * Pure bit manipulation, so results do not depend on the FPU rounding mode
 * or on F16C being present, and the CUDA twins (__float2half_rn,
 * __float2bfloat16_rn) must match it bit for bit.  Tested in
 * kernels/cpu/kernels_test.c (`kvtrim-tests kernels`).
 */
#include "dtype.h"

#include <stdint.h>
#include <string.h>

size_t kvt_dtype_size(enum kvt_dtype dt) { return dtype_size(dt); }

static inline uint32_t f32_bits(float f)
{
	uint32_t x;
	memcpy(&x, &f, sizeof(x));
	return x;
}

static inline float bits_f32(uint32_t x)
{
	float f;
	memcpy(&f, &x, sizeof(f));
	return f;
}

static inline float half_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;

	if (exp == 0x1f) /* inf or NaN: the payload moves up unchanged */
		return bits_f32(sign | 0x7f800000u | (man << 13));
	if (exp != 0)
		return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
	if (man == 0)
		return bits_f32(sign);
	/* Subnormal man * 2^-24: shift the leading one up to bit 10; every
	 * shift lowers the float32 exponent, which starts at 2^-14 (113). */
	uint32_t e = 113;
	while (!(man & 0x400u)) {
		man <<= 1;
		e--;
	}
	return bits_f32(sign | (e << 23) | ((man & 0x3ffu) << 13));
}

static inline uint16_t f32_to_half(float f)
{
	uint32_t x = f32_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t ax = x & 0x7fffffffu;

	if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top payload */
		return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);
	if (ax >= 0x477ff000u) /* >= 65520 rounds past 65504: inf */
		return sign | 0x7c00u;
	if (ax >= 0x38800000u) { /* normal half: rebias 127 -> 15 */
		uint32_t r = ax - 0x38000000u;
		uint32_t h = r >> 13, rem = r & 0x1fffu;
		if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
			h++; /* a carry into the exponent is the right answer */
		return sign | (uint16_t)h;
	}
	if (ax <= 0x33000000u) /* <= 2^-25: zero (2^-25 ties to even 0) */
		return sign;
	/* Subnormal half: round(value * 2^24) with the implicit one put back;
	 * exponent e in [102, 112] gives a shift in [14, 24]. */
	uint32_t e = ax >> 23;
	uint32_t m = (ax & 0x7fffffu) | 0x800000u;
	uint32_t shift = 126u - e;
	uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u);
	uint32_t half = 1u << (shift - 1u);
	if (rem > half || (rem == half && (h & 1u)))
		h++; /* 0x400 is the smallest normal: still right */
	return sign | (uint16_t)h;
}

static inline uint16_t f32_to_bf16(float f)
{
	uint32_t x = f32_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate, force quiet */
		return (uint16_t)((x >> 16) | 0x0040u);
	/* Round to nearest even on the dropped 16 bits; overflow to inf is
	 * the correct rounding of the largest floats. */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

void dtype_to_f32(const void *src, enum kvt_dtype dt, float *dst, size_t n)
{
	const uint16_t *s16 = src;
	switch (dt) {
	case KVT_DTYPE_F32:
		memmove(dst, src, n * sizeof(float));
		return;
	case KVT_DTYPE_F16:
		for (size_t i = 0; i < n; i++)
			dst[i] = half_to_f32(s16[i]);
		return;
	case KVT_DTYPE_BF16:
		for (size_t i = 0; i < n; i++)
			dst[i] = bits_f32((uint32_t)s16[i] << 16);
		return;
	}
}

void dtype_from_f32(const float *src, enum kvt_dtype dt, void *dst, size_t n)
{
	uint16_t *d16 = dst;
	switch (dt) {
	case KVT_DTYPE_F32:
		memmove(dst, src, n * sizeof(float));
		return;
	case KVT_DTYPE_F16:
		for (size_t i = 0; i < n; i++)
			d16[i] = f32_to_half(src[i]);
		return;
	case KVT_DTYPE_BF16:
		for (size_t i = 0; i < n; i++)
			d16[i] = f32_to_bf16(src[i]);
		return;
	}
}

int dtype_parse(const char *name, enum kvt_dtype *dt)
{
	static const char *const names[] = {"f32", "f16", "bf16"};
	for (int i = 0; i < 3; i++)
		if (!strcmp(name, names[i])) {
			*dt = (enum kvt_dtype)i;
			return 0;
		}
	return -1;
}
