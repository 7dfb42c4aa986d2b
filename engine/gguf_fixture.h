/*
 * gguf_fixture.h — what the GGUF reader tests (engine/gguf*_test.c)
 * share: opening from an exact-size heap copy, T_REFUSED, scratch paths,
 * and the "all types" file (every metadata type, every tensor type with
 * values dequantised by hand).  Header-only (static inline), so no helper
 * name leaves a test file.
 */
#ifndef KVT_GGUF_FIXTURE_H
#define KVT_GGUF_FIXTURE_H

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gb.h"
#include "gguf.h"
#include "model_files.h"
#include "test.h"
/* Opens the bytes of b from an exact-size heap copy (so ASan sees any read
 * past the end); returns the code, with the reason in err. */
static inline int open_copy(const uint8_t *p, size_t len, struct gguf **g,
                            char *err, size_t errlen)
{
	uint8_t *c = malloc(len ? len : 1);
	T_ASSERT(c);
	memcpy(c, p, len);
	err[0] = 0;
	int rc = gguf_open_mem(c, len, g, err, errlen);
	if (rc < 0) {
		T_ASSERT(*g == NULL);
		T_ASSERT(err[0] != 0); /* a reason always comes with a refusal */
	}
	if (rc == 0) { /* the copy must outlive g: callers reopen */
		gguf_close(*g);
		*g = NULL;
	}
	free(c);
	return rc;
}

/* Expects b to be refused with code and a reason containing word. */
#define T_REFUSED(b, code, word)                                               \
	do {                                                                   \
		struct gguf *g_ = NULL;                                        \
		char e_[KVT_ERRTEXT_MAX];                                      \
		T_ERR(open_copy((b)->p, (b)->len, &g_, e_, sizeof(e_)), code); \
		if (!strstr(e_, word))                                         \
			th_fail(__FILE__, __LINE__, "reason \"%s\" lacks "    \
			        "\"%s\"", e_, word);                           \
	} while (0)

static inline char *tmp_path(const char *name)
{
	static char buf[4][512];
	static int next;
	char *p = buf[next++ % 4];
	snprintf(p, sizeof(buf[0]), "%s/%s", th_tmpdir(), name);
	return p;
}

static inline void write_bytes(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	T_ASSERT(f);
	T_ASSERT(fwrite(data, 1, len, f) == len);
	T_ASSERT(fclose(f) == 0);
}

/* ---------------------------------------------------------------- the file
 * "all types": 18 keys (every value type, arrays of strings, bools, nested
 * and empty arrays, general.alignment = 64) and 9 tensors, one per tensor
 * type, whose data end exactly at the end of the file. */

#define ALL_NKV 18
#define ALL_NT 9

/* f16 bit patterns: 0.25, 0.5, 1, 1.5, 2, -1, -2, 65504 (largest). */
#define H_025 0x3400
#define H_05 0x3800
#define H_1 0x3c00
#define H_15 0x3e00
#define H_2 0x4000
#define H_M1 0xbc00
#define H_M2 0xc000
#define H_MAX 0x7bff

/* Q4_K sub-block scales and mins (6 bits each; 40 and 20 use the high
 * bits packed into the first bytes). */
static const uint8_t K4_SC[8] = {1, 2, 3, 4, 5, 40, 7, 8};
static const uint8_t K4_MN[8] = {0, 1, 2, 3, 4, 5, 20, 7};

/* Q4_K packing of 8 (scale, min) pairs into 12 bytes (ggml's layout:
 * bytes 0-3 scale 0-3 and bytes 4-7 min 0-3 in the low 6 bits; bytes 8-11
 * the low nibbles of scale 4-7 and high nibbles of min 4-7; their top 2
 * bits in the top 2 bits of bytes 0-3 (scales) and 4-7 (mins)). */
static inline void k4_scales(uint8_t q[12])
{
	for (int j = 0; j < 4; j++) {
		q[j] = (uint8_t)(K4_SC[j] | ((K4_SC[j + 4] >> 4) << 6));
		q[j + 4] = (uint8_t)(K4_MN[j] | ((K4_MN[j + 4] >> 4) << 6));
		q[j + 8] = (uint8_t)((K4_SC[j + 4] & 15) | ((K4_MN[j + 4] & 15) << 4));
	}
}

/* The Q4_K 4-bit quant of element e: low nibbles for even sub-blocks. */
static inline unsigned k4_q(int e)
{
	int s = e / 32, l = e % 32;
	return s % 2 == 0 ? (unsigned)(l % 16) : (unsigned)((l + 3) % 16);
}

static inline void q4k_block(uint8_t b[144])
{
	uint16_t d = H_1, dmin = H_05;
	memcpy(b, &d, 2);
	memcpy(b + 2, &dmin, 2);
	k4_scales(b + 4);
	/* qs: byte 32c + l holds element 64c + l (low) and 64c + 32 + l. */
	for (int c = 0; c < 4; c++)
		for (int l = 0; l < 32; l++)
			b[16 + 32 * c + l] = (uint8_t)(k4_q(64 * c + l) |
			                               (k4_q(64 * c + 32 + l) << 4));
}

/* Expected Q4_K value: d * scale_s * q - dmin * min_s, d = 1, dmin = 0.5. */
static inline float q4k_want(int e)
{
	int s = e / 32;
	return (float)K4_SC[s] * (float)k4_q(e) - 0.5f * (float)K4_MN[s];
}

/* Q6_K: 6-bit quant of element e and the int8 scale of sub-block s. */
static inline int k6_q(int e) { return (e * 7) % 64; }
static inline int k6_sc(int s) { return (s % 2 ? -1 : 1) * (s + 1); }

static inline void q6k_block(uint8_t b[210])
{
	memset(b, 0, 210);
	/* ggml's layout: per half h (128 elements), element 128h + 32k + l
	 * (k = 0..3, l < 32) has its low 4 bits in ql[64h + l + 32 (k & 1)]
	 * (low nibble for k < 2, high for k >= 2) and its high 2 bits in
	 * qh[32h + l] at bit 2k. */
	for (int e = 0; e < 256; e++) {
		int h = e / 128, k = (e % 128) / 32, l = e % 32, q = k6_q(e);
		uint8_t *ql = &b[64 * h + l + 32 * (k & 1)];
		*ql |= (uint8_t)((q & 15) << (k >= 2 ? 4 : 0));
		b[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
	}
	for (int s = 0; s < 16; s++)
		b[192 + s] = (uint8_t)(int8_t)k6_sc(s);
	uint16_t d = H_05;
	memcpy(b + 208, &d, 2);
}

static inline float q6k_want(int e)
{
	return 0.5f * (float)k6_sc(e / 16) * (float)(k6_q(e) - 32);
}

/* Q8_0 test tensor {64, 2}: block b has d = 0.5 (b + 1) and qs[j] = j - 16
 * + b, except block 0 which holds the extremes -128 and 127 at 0 and 31. */
static inline int q8_q(int b, int j)
{
	if (b == 0 && j == 0)
		return -128;
	if (b == 0 && j == 31)
		return 127;
	return j - 16 + b;
}

static inline float q8_want(int e)
{
	int b = e / 32, j = e % 32;
	return 0.5f * (float)(b + 1) * (float)q8_q(b, j);
}

/* Q4_0 {32}: d = 2, qs[j] = j | (15 - j) << 4: y[j] = (j - 8) 2,
 * y[j + 16] = (7 - j) 2.  Q4_1 {32}: d = 0.25, m = -1, same qs:
 * y[j] = j / 4 - 1, y[j + 16] = (15 - j) / 4 - 1. */
static inline float q40_want(int e) { return e < 16 ? (e - 8) * 2.0f : (7 - (e - 16)) * 2.0f; }
static inline float q41_want(int e) { return e < 16 ? e * 0.25f - 1 : (15 - (e - 16)) * 0.25f - 1; }

static inline void q4_block(uint8_t *b, uint16_t d, int with_m, uint16_t m)
{
	memcpy(b, &d, 2);
	if (with_m)
		memcpy(b + 2, &m, 2);
	for (int j = 0; j < 16; j++)
		b[(with_m ? 4 : 2) + j] = (uint8_t)(j | ((15 - j) << 4));
}

static const float F32_VALS[4] = {1.0f, -2.0f, 0.5f, 3.25f};
static const uint16_t F16_BITS[4] = {H_1, H_M2, H_05, H_MAX};
static const float F16_VALS[4] = {1.0f, -2.0f, 0.5f, 65504.0f};
/* bf16: 1, -3, 1.5 and the smallest subnormal (float bits 0x00010000). */
static const uint16_t BF16_BITS[4] = {0x3f80, 0xc040, 0x3fc0, 0x0001};

struct tdesc {
	const char *name;
	uint32_t type, n_dims;
	uint64_t ne[2];
	uint64_t off, bytes;
};

static const struct tdesc ALL_T[ALL_NT] = {
	{"f32", GGUF_GGML_F32, 1, {4, 1}, 0, 16},
	{"f16", GGUF_GGML_F16, 1, {4, 1}, 64, 8},
	{"bf16", GGUF_GGML_BF16, 1, {4, 1}, 128, 8},
	{"q8_0", GGUF_GGML_Q8_0, 2, {64, 2}, 192, 4 * 34},
	{"q4_0", GGUF_GGML_Q4_0, 1, {32, 1}, 384, 18},
	{"q4_1", GGUF_GGML_Q4_1, 1, {32, 1}, 448, 20},
	{"q4_k", GGUF_GGML_Q4_K, 1, {256, 1}, 512, 144},
	{"q6_k", GGUF_GGML_Q6_K, 1, {256, 1}, 704, 210},
	{"q5_0", GGUF_GGML_Q5_0, 1, {32, 1}, 960, 22},
};

static inline void all_kvs(struct gb *b)
{
	gb_key(b, "t.u8", GGUF_TYPE_UINT8); gb_u8(b, 200);
	gb_key(b, "t.i8", GGUF_TYPE_INT8); gb_u8(b, (uint8_t)(int8_t)-100);
	gb_key(b, "t.u16", GGUF_TYPE_UINT16); gb_u16(b, 60000);
	gb_key(b, "t.i16", GGUF_TYPE_INT16); gb_u16(b, (uint16_t)(int16_t)-30000);
	gb_kv_u32(b, "t.u32", 4000000000u);
	gb_key(b, "t.i32", GGUF_TYPE_INT32); gb_u32(b, (uint32_t)(int32_t)-2000000000);
	gb_key(b, "t.f32", GGUF_TYPE_FLOAT32); gb_f32(b, 1.5f);
	gb_key(b, "t.bool", GGUF_TYPE_BOOL); gb_u8(b, 1);
	gb_kv_str(b, "t.str", "h\xc3\xa9llo");
	gb_key(b, "t.u64", GGUF_TYPE_UINT64); gb_u64(b, 0x8000000000000005ull);
	gb_key(b, "t.i64", GGUF_TYPE_INT64); gb_u64(b, (uint64_t)(-(INT64_C(1) << 62)));
	double f64 = 0.1;
	gb_key(b, "t.f64", GGUF_TYPE_FLOAT64); gb_put(b, &f64, 8);
	gb_key(b, "t.arr_u32", GGUF_TYPE_ARRAY);
	gb_u32(b, GGUF_TYPE_UINT32); gb_u64(b, 3);
	gb_u32(b, 1); gb_u32(b, 2); gb_u32(b, 3);
	gb_key(b, "t.arr_str", GGUF_TYPE_ARRAY);
	gb_u32(b, GGUF_TYPE_STRING); gb_u64(b, 3);
	gb_str(b, "a"); gb_str(b, ""); gb_str(b, "ccc");
	gb_key(b, "t.arr_nest", GGUF_TYPE_ARRAY); /* [[1, -2], [3]] of int16 */
	gb_u32(b, GGUF_TYPE_ARRAY); gb_u64(b, 2);
	gb_u32(b, GGUF_TYPE_INT16); gb_u64(b, 2);
	gb_u16(b, 1); gb_u16(b, (uint16_t)(int16_t)-2);
	gb_u32(b, GGUF_TYPE_INT16); gb_u64(b, 1); gb_u16(b, 3);
	gb_key(b, "t.arr_empty", GGUF_TYPE_ARRAY);
	gb_u32(b, GGUF_TYPE_FLOAT64); gb_u64(b, 0);
	gb_key(b, "t.arr_bool", GGUF_TYPE_ARRAY);
	gb_u32(b, GGUF_TYPE_BOOL); gb_u64(b, 2); gb_u8(b, 0); gb_u8(b, 1);
	gb_kv_u32(b, "general.alignment", 64);
}

static inline void all_data(struct gb *d)
{
	uint8_t blk[256];
	gb_at(d, 0, F32_VALS, sizeof(F32_VALS));
	gb_at(d, 64, F16_BITS, sizeof(F16_BITS));
	gb_at(d, 128, BF16_BITS, sizeof(BF16_BITS));
	for (int b = 0; b < 4; b++) {
		uint16_t h[4] = {H_05, H_1, H_15, H_2};
		memcpy(blk, &h[b], 2);
		for (int j = 0; j < 32; j++)
			blk[2 + j] = (uint8_t)(int8_t)q8_q(b, j);
		gb_at(d, 192 + 34 * (size_t)b, blk, 34);
	}
	q4_block(blk, H_2, 0, 0);
	gb_at(d, 384, blk, 18);
	q4_block(blk, H_025, 1, H_M1);
	gb_at(d, 448, blk, 20);
	uint8_t k4[144], k6[210];
	q4k_block(k4);
	gb_at(d, 512, k4, sizeof(k4));
	q6k_block(k6);
	gb_at(d, 704, k6, sizeof(k6));
	memset(blk, 0x11, 22);
	gb_at(d, 960, blk, 22);
}

static inline struct gb all_types_file(void)
{
	struct gb b = {0}, d = {0};
	gb_hdr(&b, GGUF_VERSION, ALL_NT, ALL_NKV);
	all_kvs(&b);
	for (int i = 0; i < ALL_NT; i++)
		gb_tinfo(&b, ALL_T[i].name, ALL_T[i].n_dims, ALL_T[i].ne,
		         ALL_T[i].type, ALL_T[i].off);
	gb_pad(&b, 64);
	all_data(&d);
	gb_put(&b, d.p, d.len);
	gb_free(&d);
	return b;
}

static inline struct gguf *open_all(struct gb *b, const char *name)
{
	struct gguf *g = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	*b = all_types_file();
	const char *path = tmp_path(name);
	write_bytes(path, b->p, b->len);
	int rc = gguf_open(path, &g, err, sizeof(err));
	if (rc < 0)
		th_fail(__FILE__, __LINE__, "gguf_open: %s", err);
	return g;
}

#endif
