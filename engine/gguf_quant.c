/*
 * gguf_quant.c — GGUF tensor types (names, block geometry) and their
 * dequantisation to float32; see gguf.h.
 *
 * The block layouts and the dequantisation formulas follow ggml's reference
 * CPU code (ggml-quants.c, dequantize_row_*), in the same order of float
 * operations, so values match ggml and the gguf Python package bit for
 * bit.
 */
#include "gguf.h"

#include <string.h>

#include "errors.h"
#include "dtype.h"
#include "kvtrim.h"

/* ---------------------------------------------------------------- types */

struct ttype {
	const char *name;
	uint32_t blck;  /* elements per block */
	uint32_t bytes; /* bytes per block */
	int deq;        /* gguf_dequant() handles it */
};

/* Indexed by ggml_type; a NULL name is a number unknown here. */
static const struct ttype TTYPES[] = {
	[GGUF_GGML_F32] = {"F32", 1, 4, 1},
	[GGUF_GGML_F16] = {"F16", 1, 2, 1},
	[GGUF_GGML_Q4_0] = {"Q4_0", 32, 18, 1},
	[GGUF_GGML_Q4_1] = {"Q4_1", 32, 20, 1},
	[GGUF_GGML_Q5_0] = {"Q5_0", 32, 22, 0},
	[GGUF_GGML_Q5_1] = {"Q5_1", 32, 24, 0},
	[GGUF_GGML_Q8_0] = {"Q8_0", 32, 34, 1},
	[GGUF_GGML_Q8_1] = {"Q8_1", 32, 36, 0},
	[GGUF_GGML_Q2_K] = {"Q2_K", 256, 84, 0},
	[GGUF_GGML_Q3_K] = {"Q3_K", 256, 110, 0},
	[GGUF_GGML_Q4_K] = {"Q4_K", 256, 144, 1},
	[GGUF_GGML_Q5_K] = {"Q5_K", 256, 176, 0},
	[GGUF_GGML_Q6_K] = {"Q6_K", 256, 210, 1},
	[GGUF_GGML_Q8_K] = {"Q8_K", 256, 292, 0},
	[GGUF_GGML_I8] = {"I8", 1, 1, 0},
	[GGUF_GGML_I16] = {"I16", 1, 2, 0},
	[GGUF_GGML_I32] = {"I32", 1, 4, 0},
	[GGUF_GGML_I64] = {"I64", 1, 8, 0},
	[GGUF_GGML_F64] = {"F64", 1, 8, 0},
	[GGUF_GGML_BF16] = {"BF16", 1, 2, 1},
};
#define N_TTYPES (sizeof(TTYPES) / sizeof(TTYPES[0]))

static const struct ttype *ttype(uint32_t t)
{
	return t < N_TTYPES && TTYPES[t].name ? &TTYPES[t] : NULL;
}

const char *gguf_type_name(enum gguf_ggml_type t)
{
	const struct ttype *tt = ttype((uint32_t)t);
	return tt ? tt->name : NULL;
}

int gguf_can_dequant(enum gguf_ggml_type t)
{
	const struct ttype *tt = ttype((uint32_t)t);
	return tt && tt->deq;
}

int gguf_type_block(enum gguf_ggml_type t, uint32_t *elems, uint32_t *bytes)
{
	const struct ttype *tt = ttype((uint32_t)t);
	if (!tt)
		return KVT_ENOTSUP;
	*elems = tt->blck;
	*bytes = tt->bytes;
	return 0;
}

/* ---------------------------------------------------------------- dequant */

#define QK 32    /* elements of a Q4_0 / Q4_1 / Q8_0 block */
#define QK_K 256 /* elements of a K-quant super-block */

static float f16_at(const uint8_t *p)
{
	uint16_t h;
	float f;
	memcpy(&h, p, 2);
	dtype_to_f32(&h, KVT_DTYPE_F16, &f, 1);
	return f;
}

/* block_q4_0: f16 d; u8 qs[16]: y[j] = (lo(qs[j]) - 8) d, y[j+16] = (hi - 8) d */
static void deq_q4_0(const uint8_t *b, float *y)
{
	const float d = f16_at(b);
	const uint8_t *qs = b + 2;
	for (int j = 0; j < QK / 2; j++) {
		const int x0 = (qs[j] & 0x0f) - 8, x1 = (qs[j] >> 4) - 8;
		y[j] = x0 * d;
		y[j + QK / 2] = x1 * d;
	}
}

/* block_q4_1: f16 d, m; u8 qs[16]: y[j] = lo(qs[j]) d + m, y[j+16] = hi d + m */
static void deq_q4_1(const uint8_t *b, float *y)
{
	const float d = f16_at(b), m = f16_at(b + 2);
	const uint8_t *qs = b + 4;
	for (int j = 0; j < QK / 2; j++) {
		const float x0 = (float)(qs[j] & 0x0f), x1 = (float)(qs[j] >> 4);
		y[j] = x0 * d + m;
		y[j + QK / 2] = x1 * d + m;
	}
}

/* block_q8_0: f16 d; i8 qs[32]: y[j] = qs[j] d */
static void deq_q8_0(const uint8_t *b, float *y)
{
	const float d = f16_at(b);
	const int8_t *qs = (const int8_t *)(b + 2);
	for (int j = 0; j < QK; j++)
		y[j] = qs[j] * d;
}

/* The 6-bit scale and min of sub-block j of a Q4_K block (ggml's
 * get_scale_min_k4): scales[12] packs 8 pairs. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
	if (j < 4) {
		*d = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*d = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

/* block_q4_K: f16 d, dmin; u8 scales[12]; u8 qs[128]: 8 sub-blocks of 32,
 * y = d sc_s q - dmin m_s (q the low nibbles for even s, high for odd). */
static void deq_q4_k(const uint8_t *b, float *y)
{
	const float d = f16_at(b), min = f16_at(b + 2);
	const uint8_t *scales = b + 4, *q = b + 16;
	int is = 0;
	for (int j = 0; j < QK_K; j += 64) {
		uint8_t sc, m;
		scale_min_k4(is, scales, &sc, &m);
		const float d1 = d * sc, m1 = min * m;
		scale_min_k4(is + 1, scales, &sc, &m);
		const float d2 = d * sc, m2 = min * m;
		for (int l = 0; l < 32; l++)
			*y++ = d1 * (q[l] & 0x0f) - m1;
		for (int l = 0; l < 32; l++)
			*y++ = d2 * (q[l] >> 4) - m2;
		q += 32;
		is += 2;
	}
}

/* block_q6_K: u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), i8
 * scales[16], f16 d: y = d scale_s (q - 32), 16 sub-blocks of 16. */
static void deq_q6_k(const uint8_t *b, float *y)
{
	const uint8_t *ql = b, *qh = b + 128;
	const int8_t *sc = (const int8_t *)(b + 192);
	const float d = f16_at(b + 208);
	for (int n = 0; n < QK_K; n += 128) {
		for (int l = 0; l < 32; l++) {
			int is = l / 16;
			const int q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) - 32;
			const int q2 = ((ql[l + 32] & 0xf) |
			                (((qh[l] >> 2) & 3) << 4)) - 32;
			const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
			const int q4 = ((ql[l + 32] >> 4) |
			                (((qh[l] >> 6) & 3) << 4)) - 32;
			y[l] = d * sc[is] * q1;
			y[l + 32] = d * sc[is + 2] * q2;
			y[l + 64] = d * sc[is + 4] * q3;
			y[l + 96] = d * sc[is + 6] * q4;
		}
		y += 128;
		ql += 64;
		qh += 32;
		sc += 8;
	}
}

/* F16 / BF16 runs; the source may be unaligned (alignment 1 is legal), so
 * it is copied into an aligned staging buffer first. */
static void deq_half(const uint8_t *src, enum kvt_dtype dt, float *dst,
                     uint64_t n)
{
	uint16_t tmp[1024];
	while (n) {
		size_t k = n < 1024 ? (size_t)n : 1024;
		memcpy(tmp, src, k * 2);
		dtype_to_f32(tmp, dt, dst, k);
		src += k * 2;
		dst += k;
		n -= k;
	}
}

typedef void (*deq_block_fn)(const uint8_t *b, float *y);

static deq_block_fn block_fn(enum gguf_ggml_type t)
{
	switch (t) {
	case GGUF_GGML_Q4_0: return deq_q4_0;
	case GGUF_GGML_Q4_1: return deq_q4_1;
	case GGUF_GGML_Q8_0: return deq_q8_0;
	case GGUF_GGML_Q4_K: return deq_q4_k;
	case GGUF_GGML_Q6_K: return deq_q6_k;
	default: return NULL;
	}
}

int gguf_dequant(const struct gguf_tensor *t, uint64_t first, uint64_t n,
                 float *dst, char *err, size_t errlen)
{
	const struct ttype *tt = ttype((uint32_t)t->type);
	if (!tt || !tt->deq)
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "tensor %s: cannot dequantise type %s", t->name,
		                  tt ? tt->name : "unknown");
	if (first > t->n_elem || n > t->n_elem - first)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "tensor %s: range [%llu, +%llu) outside its "
		                  "%llu elements", t->name,
		                  (unsigned long long)first,
		                  (unsigned long long)n,
		                  (unsigned long long)t->n_elem);
	const uint8_t *src = t->data;
	switch (t->type) {
	case GGUF_GGML_F32:
		memcpy(dst, src + first * 4, n * 4);
		return 0;
	case GGUF_GGML_F16:
		deq_half(src + first * 2, KVT_DTYPE_F16, dst, n);
		return 0;
	case GGUF_GGML_BF16:
		deq_half(src + first * 2, KVT_DTYPE_BF16, dst, n);
		return 0;
	default:
		break;
	}
	deq_block_fn fn = block_fn(t->type);
	float tmp[QK_K];
	uint64_t bk = tt->blck, blk = first / bk, skip = first % bk;
	while (n) {
		const uint8_t *b = src + blk * tt->bytes;
		if (skip == 0 && n >= bk) {
			fn(b, dst);
			dst += bk;
			n -= bk;
		} else { /* a partial block at either end */
			uint64_t k = bk - skip < n ? bk - skip : n;
			fn(b, tmp);
			memcpy(dst, tmp + skip, k * sizeof(float));
			dst += k;
			n -= k;
			skip = 0;
		}
		blk++;
	}
	return 0;
}
