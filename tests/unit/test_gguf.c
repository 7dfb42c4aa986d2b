/*
 * test_gguf.c — the GGUF reader (engine/gguf.c) and the model cache
 * (engine/model_files.c, scripts/models.sh).
 *
 * Small GGUF files are written by the test itself: every metadata type,
 * every tensor type with values dequantised by hand below, alignment 64,
 * and corrupt variants (every truncation point, bad magic, other versions,
 * huge counts and lengths, unknown types, duplicates, data beyond the
 * end), each refused with its code and a reason.  The real SmolLM2 file,
 * when `make models` has fetched it, is compared with
 * tests/fixtures/smollm2/gguf.txt, which the gguf Python package decoded
 * (scripts/fixtures/smollm2_gguf.py).
 * Run: build/bin/kvtrim-tests gguf
 */
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gb.h"
#include "gguf.h"
#include "model_files.h"
#include "test.h"

/* ---------------------------------------------------------------- helpers */

/* Opens the bytes of b from an exact-size heap copy (so ASan sees any read
 * past the end); returns the code, with the reason in err. */
static int open_copy(const uint8_t *p, size_t len, struct gguf **g, char *err,
                     size_t errlen)
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

static char *tmp_path(const char *name)
{
	static char buf[4][512];
	static int next;
	char *p = buf[next++ % 4];
	snprintf(p, sizeof(buf[0]), "%s/%s", th_tmpdir(), name);
	return p;
}

static void write_bytes(const char *path, const void *data, size_t len)
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
static void k4_scales(uint8_t q[12])
{
	for (int j = 0; j < 4; j++) {
		q[j] = (uint8_t)(K4_SC[j] | ((K4_SC[j + 4] >> 4) << 6));
		q[j + 4] = (uint8_t)(K4_MN[j] | ((K4_MN[j + 4] >> 4) << 6));
		q[j + 8] = (uint8_t)((K4_SC[j + 4] & 15) | ((K4_MN[j + 4] & 15) << 4));
	}
}

/* The Q4_K 4-bit quant of element e: low nibbles for even sub-blocks. */
static unsigned k4_q(int e)
{
	int s = e / 32, l = e % 32;
	return s % 2 == 0 ? (unsigned)(l % 16) : (unsigned)((l + 3) % 16);
}

static void q4k_block(uint8_t b[144])
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
static float q4k_want(int e)
{
	int s = e / 32;
	return (float)K4_SC[s] * (float)k4_q(e) - 0.5f * (float)K4_MN[s];
}

/* Q6_K: 6-bit quant of element e and the int8 scale of sub-block s. */
static int k6_q(int e) { return (e * 7) % 64; }
static int k6_sc(int s) { return (s % 2 ? -1 : 1) * (s + 1); }

static void q6k_block(uint8_t b[210])
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

static float q6k_want(int e)
{
	return 0.5f * (float)k6_sc(e / 16) * (float)(k6_q(e) - 32);
}

/* Q8_0 test tensor {64, 2}: block b has d = 0.5 (b + 1) and qs[j] = j - 16
 * + b, except block 0 which holds the extremes -128 and 127 at 0 and 31. */
static int q8_q(int b, int j)
{
	if (b == 0 && j == 0)
		return -128;
	if (b == 0 && j == 31)
		return 127;
	return j - 16 + b;
}

static float q8_want(int e)
{
	int b = e / 32, j = e % 32;
	return 0.5f * (float)(b + 1) * (float)q8_q(b, j);
}

/* Q4_0 {32}: d = 2, qs[j] = j | (15 - j) << 4: y[j] = (j - 8) 2,
 * y[j + 16] = (7 - j) 2.  Q4_1 {32}: d = 0.25, m = -1, same qs:
 * y[j] = j / 4 - 1, y[j + 16] = (15 - j) / 4 - 1. */
static float q40_want(int e) { return e < 16 ? (e - 8) * 2.0f : (7 - (e - 16)) * 2.0f; }
static float q41_want(int e) { return e < 16 ? e * 0.25f - 1 : (15 - (e - 16)) * 0.25f - 1; }

static void q4_block(uint8_t *b, uint16_t d, int with_m, uint16_t m)
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

static void all_kvs(struct gb *b)
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

static void all_data(struct gb *d)
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

static struct gb all_types_file(void)
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

static struct gguf *open_all(struct gb *b, const char *name)
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

/* ---------------------------------------------------------------- metadata */

TEST(gguf, metadata_every_type)
{
	struct gb b;
	struct gguf *g = open_all(&b, "all.gguf");
	char err[KVT_ERRTEXT_MAX];
	T_EQ(gguf_version(g), 3);
	T_EQ(gguf_kv_count(g), ALL_NKV);
	T_EQ(gguf_alignment(g), 64);
	T_EQ(gguf_data_offset(g) % 64, 0);
	/* File order is kept. */
	T_ASSERT(gguf_str_eq(gguf_kv_at(g, 0)->key, "t.u8"));
	T_ASSERT(gguf_str_eq(gguf_kv_at(g, ALL_NKV - 1)->key,
	                     "general.alignment"));
	T_ASSERT(gguf_kv_at(g, ALL_NKV) == NULL);

	const struct gguf_value *v;
	T_ASSERT((v = gguf_find(g, "t.u8")) && v->type == GGUF_TYPE_UINT8);
	T_EQ(v->v.u, 200);
	T_ASSERT((v = gguf_find(g, "t.i8")) && v->type == GGUF_TYPE_INT8);
	T_EQ(v->v.i, -100);
	T_ASSERT((v = gguf_find(g, "t.u16")) && v->v.u == 60000);
	T_ASSERT((v = gguf_find(g, "t.i16")) && v->v.i == -30000);
	T_ASSERT((v = gguf_find(g, "t.u32")) && v->v.u == 4000000000u);
	T_ASSERT((v = gguf_find(g, "t.i32")) && v->v.i == -2000000000);
	T_ASSERT((v = gguf_find(g, "t.f32")) && v->type == GGUF_TYPE_FLOAT32);
	T_ASSERT(v->v.f == 1.5);
	T_ASSERT((v = gguf_find(g, "t.bool")) && v->type == GGUF_TYPE_BOOL);
	T_EQ(v->v.b, 1);
	T_ASSERT((v = gguf_find(g, "t.str")) && v->type == GGUF_TYPE_STRING);
	T_ASSERT(gguf_str_eq(v->v.s, "h\xc3\xa9llo"));
	T_ASSERT((v = gguf_find(g, "t.u64")) && v->type == GGUF_TYPE_UINT64);
	T_EQ_U64(v->v.u, 0x8000000000000005ull);
	T_ASSERT((v = gguf_find(g, "t.i64")) && v->v.i == -(INT64_C(1) << 62));
	T_ASSERT((v = gguf_find(g, "t.f64")) && v->type == GGUF_TYPE_FLOAT64);
	T_ASSERT(v->v.f == 0.1); /* the double, not a float rounding of it */
	T_ASSERT(gguf_find(g, "t.missing") == NULL);
	T_ASSERT(gguf_find(g, "t.u") == NULL); /* prefixes do not match */

	/* Typed getters: conversions that fit, refusals that name the key. */
	uint32_t u32;
	float f;
	int bo;
	struct gguf_str s;
	T_OK(gguf_get_u32(g, "t.u16", &u32, err, sizeof(err)));
	T_EQ(u32, 60000);
	T_OK(gguf_get_u32(g, "t.u32", &u32, err, sizeof(err)));
	T_EQ(u32, 4000000000u);
	T_ERR(gguf_get_u32(g, "t.i8", &u32, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "t.i8"));
	T_ERR(gguf_get_u32(g, "t.u64", &u32, err, sizeof(err)), KVT_EINVAL);
	T_ERR(gguf_get_u32(g, "t.str", &u32, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "string"));
	T_ERR(gguf_get_u32(g, "t.none", &u32, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "missing key t.none"));
	T_OK(gguf_get_f32(g, "t.f64", &f, err, sizeof(err)));
	T_ASSERT(f == 0.1f);
	T_OK(gguf_get_bool(g, "t.bool", &bo, err, sizeof(err)));
	T_EQ(bo, 1);
	T_OK(gguf_get_str(g, "t.str", &s, err, sizeof(err)));
	T_EQ(s.len, 6);

	/* Arrays: fixed-size elements, strings, nested, empty, bools. */
	const struct gguf_value *a;
	struct gguf_value it;
	T_OK(gguf_get_arr(g, "t.arr_u32", GGUF_TYPE_UINT32, &a, err,
	                  sizeof(err)));
	T_EQ(a->v.arr.n, 3);
	for (uint64_t i = 0; i < 3; i++) {
		T_OK(gguf_arr_item(a, i, &it));
		T_EQ(it.type, GGUF_TYPE_UINT32);
		T_EQ(it.v.u, i + 1);
	}
	T_ERR(gguf_arr_item(a, 3, &it), KVT_EINVAL);
	T_ERR(gguf_get_arr(g, "t.arr_u32", GGUF_TYPE_INT32, &a, err,
	                   sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "array of uint32"));
	T_OK(gguf_get_arr(g, "t.arr_str", GGUF_TYPE_STRING, &a, err,
	                  sizeof(err)));
	T_EQ(a->v.arr.n, 3);
	T_OK(gguf_arr_item(a, 0, &it));
	T_ASSERT(gguf_str_eq(it.v.s, "a"));
	T_OK(gguf_arr_item(a, 1, &it));
	T_EQ(it.v.s.len, 0);
	T_OK(gguf_arr_item(a, 2, &it));
	T_ASSERT(gguf_str_eq(it.v.s, "ccc"));
	T_OK(gguf_get_arr(g, "t.arr_nest", GGUF_TYPE_ARRAY, &a, err,
	                  sizeof(err)));
	T_EQ(a->v.arr.n, 2);
	struct gguf_value in, x;
	T_OK(gguf_arr_item(a, 0, &in));
	T_EQ(in.type, GGUF_TYPE_ARRAY);
	T_EQ(in.v.arr.type, GGUF_TYPE_INT16);
	T_EQ(in.v.arr.n, 2);
	T_OK(gguf_arr_item(&in, 0, &x));
	T_EQ(x.v.i, 1);
	T_OK(gguf_arr_item(&in, 1, &x));
	T_EQ(x.v.i, -2);
	T_OK(gguf_arr_item(a, 1, &in));
	T_EQ(in.v.arr.n, 1);
	T_OK(gguf_arr_item(&in, 0, &x));
	T_EQ(x.v.i, 3);
	T_OK(gguf_get_arr(g, "t.arr_empty", GGUF_TYPE_FLOAT64, &a, err,
	                  sizeof(err)));
	T_EQ(a->v.arr.n, 0);
	T_ERR(gguf_arr_item(a, 0, &it), KVT_EINVAL);
	T_OK(gguf_get_arr(g, "t.arr_bool", GGUF_TYPE_BOOL, &a, err,
	                  sizeof(err)));
	T_OK(gguf_arr_item(a, 1, &it));
	T_EQ(it.v.b, 1);
	T_ERR(gguf_arr_item(gguf_find(g, "t.u8"), 0, &it), KVT_EINVAL);
	gguf_close(g);
	gb_free(&b);
}

/* ---------------------------------------------------------------- tensors */

static void deq_all(const struct gguf_tensor *t, float *out)
{
	char err[KVT_ERRTEXT_MAX];
	int rc = gguf_dequant(t, 0, t->n_elem, out, err, sizeof(err));
	if (rc < 0)
		th_fail(__FILE__, __LINE__, "%s: %s", t->name, err);
}

static void expect_f(const char *what, int i, float got, float want)
{
	uint32_t a, b;
	memcpy(&a, &got, 4);
	memcpy(&b, &want, 4);
	if (a != b)
		th_fail(__FILE__, __LINE__, "%s[%d] = %.9g (0x%08x), expected "
		        "%.9g (0x%08x)", what, i, (double)got, a,
		        (double)want, b);
}

TEST(gguf, tensor_infos_and_alignment)
{
	struct gb b;
	struct gguf *g = open_all(&b, "all.gguf");
	T_EQ(gguf_tensor_count(g), ALL_NT);
	const uint8_t *data = b.p + gguf_data_offset(g);
	for (int i = 0; i < ALL_NT; i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);
		T_EQ_STR(t->name, ALL_T[i].name);
		T_ASSERT(gguf_tensor_find(g, ALL_T[i].name) == t);
		T_EQ(t->type, ALL_T[i].type);
		T_EQ(t->n_dims, ALL_T[i].n_dims);
		T_EQ(t->ne[0], ALL_T[i].ne[0]);
		T_EQ(t->ne[1], ALL_T[i].ne[1]);
		T_EQ(t->ne[2], 1);
		T_EQ(t->ne[3], 1);
		T_EQ(t->n_elem, ALL_T[i].ne[0] * ALL_T[i].ne[1]);
		T_EQ(t->offset, ALL_T[i].off);
		T_EQ(t->n_bytes, ALL_T[i].bytes);
		/* Data are views of the file at the aligned data section. */
		T_ASSERT(!memcmp(t->data, data + ALL_T[i].off, t->n_bytes));
	}
	T_ASSERT(gguf_tensor_find(g, "q4") == NULL);
	T_ASSERT(gguf_tensor_at(g, ALL_NT) == NULL);
	T_EQ_STR(gguf_type_name(GGUF_GGML_Q4_1), "Q4_1");
	T_ASSERT(gguf_type_name((enum gguf_ggml_type)4) == NULL);
	gguf_close(g);
	gb_free(&b);
}

TEST(gguf, dequant_every_type_by_hand)
{
	struct gb b;
	struct gguf *g = open_all(&b, "all.gguf");
	float y[256];
	deq_all(gguf_tensor_find(g, "f32"), y);
	for (int i = 0; i < 4; i++)
		expect_f("f32", i, y[i], F32_VALS[i]);
	deq_all(gguf_tensor_find(g, "f16"), y);
	for (int i = 0; i < 4; i++)
		expect_f("f16", i, y[i], F16_VALS[i]);
	deq_all(gguf_tensor_find(g, "bf16"), y);
	expect_f("bf16", 0, y[0], 1.0f);
	expect_f("bf16", 1, y[1], -3.0f);
	expect_f("bf16", 2, y[2], 1.5f);
	expect_f("bf16", 3, y[3], 0x1p-133f); /* bits 0x00010000 */

	deq_all(gguf_tensor_find(g, "q8_0"), y);
	expect_f("q8_0", 0, y[0], -64.0f);   /* -128 * 0.5 */
	expect_f("q8_0", 31, y[31], 63.5f);  /* 127 * 0.5 */
	expect_f("q8_0", 127, y[127], 36.0f); /* (31 - 16 + 3) * 2 */
	for (int i = 0; i < 128; i++)
		expect_f("q8_0", i, y[i], q8_want(i));

	deq_all(gguf_tensor_find(g, "q4_0"), y);
	expect_f("q4_0", 0, y[0], -16.0f);
	expect_f("q4_0", 16, y[16], 14.0f);
	for (int i = 0; i < 32; i++)
		expect_f("q4_0", i, y[i], q40_want(i));

	deq_all(gguf_tensor_find(g, "q4_1"), y);
	expect_f("q4_1", 0, y[0], -1.0f);
	expect_f("q4_1", 15, y[15], 2.75f);
	expect_f("q4_1", 16, y[16], 2.75f);
	for (int i = 0; i < 32; i++)
		expect_f("q4_1", i, y[i], q41_want(i));

	deq_all(gguf_tensor_find(g, "q4_k"), y);
	expect_f("q4_k", 0, y[0], 0.0f);      /* 1 * 0 - 0.5 * 0 */
	expect_f("q4_k", 161, y[161], 157.5f); /* 40 * 4 - 0.5 * 5 */
	for (int i = 0; i < 256; i++)
		expect_f("q4_k", i, y[i], q4k_want(i));

	deq_all(gguf_tensor_find(g, "q6_k"), y);
	expect_f("q6_k", 0, y[0], -16.0f); /* 0.5 * 1 * (0 - 32) */
	for (int i = 0; i < 256; i++)
		expect_f("q6_k", i, y[i], q6k_want(i));

	char err[KVT_ERRTEXT_MAX];
	T_ASSERT(!gguf_can_dequant(GGUF_GGML_Q5_0));
	T_ERR(gguf_dequant(gguf_tensor_find(g, "q5_0"), 0, 32, y, err,
	                   sizeof(err)), KVT_ENOTSUP);
	T_ASSERT(strstr(err, "Q5_0"));
	gguf_close(g);
	gb_free(&b);
}

TEST(gguf, dequant_ranges_and_partial_blocks)
{
	struct gb b;
	struct gguf *g = open_all(&b, "all.gguf");
	const struct gguf_tensor *t = gguf_tensor_find(g, "q8_0");
	char err[KVT_ERRTEXT_MAX];
	float y[128];
	/* Every range [first, first + n) of the 128 elements. */
	for (int first = 0; first < 128; first++)
		for (int n = 0; first + n <= 128; n += 7) {
			for (int i = 0; i < 128; i++)
				y[i] = NAN;
			T_OK(gguf_dequant(t, (uint64_t)first, (uint64_t)n, y,
			                  err, sizeof(err)));
			for (int i = 0; i < n; i++)
				expect_f("q8_0 range", first + i, y[i],
				         q8_want(first + i));
			if (n < 128)
				T_ASSERT(isnan(y[n])); /* nothing past n */
		}
	T_ERR(gguf_dequant(t, 120, 9, y, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "outside"));
	T_ERR(gguf_dequant(t, 129, 0, y, err, sizeof(err)), KVT_EINVAL);
	T_ERR(gguf_dequant(t, UINT64_MAX, 2, y, err, sizeof(err)), KVT_EINVAL);
	t = gguf_tensor_find(g, "q4_k");
	T_OK(gguf_dequant(t, 250, 6, y, err, sizeof(err)));
	for (int i = 0; i < 6; i++)
		expect_f("q4_k range", 250 + i, y[i], q4k_want(250 + i));
	gguf_close(g);
	gb_free(&b);
}

/* Random blocks of each quantised type against gguf-py's dequantisation
 * (tests/fixtures/gguf/quants.txt, scripts/fixtures/gguf_quants.py): the
 * byte layouts checked by an independent implementation, bit for bit. */
TEST(gguf, dequant_matches_gguf_py)
{
	FILE *f = fopen("tests/fixtures/gguf/quants.txt", "r");
	if (!f)
		th_fail(__FILE__, __LINE__, "quants.txt: %s (run from the "
		        "repository root)", strerror(errno));
	static char line[1 << 14], vals[1 << 14];
	int blocks = 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "block ", 6))
			continue;
		T_ASSERT(fgets(vals, sizeof(vals), f));
		T_ASSERT(!strncmp(vals, "values ", 7));
		char type[16], hex[1024];
		unsigned nel;
		T_EQ(sscanf(line + 6, "%15s %u %1023s", type, &nel, hex), 3);
		struct gguf_tensor t = {.n_dims = 1, .ne = {nel, 1, 1, 1},
		                        .n_elem = nel};
		snprintf(t.name, sizeof(t.name), "%s", type);
		for (int k = 0; k < 32; k++)
			if (gguf_type_name((enum gguf_ggml_type)k) &&
			    !strcmp(gguf_type_name((enum gguf_ggml_type)k), type))
				t.type = (enum gguf_ggml_type)k;
		T_ASSERT(t.type != GGUF_GGML_F32);
		uint8_t bytes[512];
		size_t nb = strlen(hex) / 2;
		T_ASSERT(nb <= sizeof(bytes));
		for (size_t i = 0; i < nb; i++) {
			char h[3] = {hex[2 * i], hex[2 * i + 1], 0};
			bytes[i] = (uint8_t)strtoul(h, NULL, 16);
		}
		t.data = bytes;
		t.n_bytes = nb;
		float y[256];
		char err[KVT_ERRTEXT_MAX], *save;
		T_OK(gguf_dequant(&t, 0, nel, y, err, sizeof(err)));
		char *w = strtok_r(vals + 7, " \n", &save);
		for (unsigned i = 0; i < nel; i++, w = strtok_r(NULL, " \n", &save)) {
			uint32_t want, got;
			T_ASSERT(w);
			want = (uint32_t)strtoul(w, NULL, 16);
			memcpy(&got, &y[i], 4);
			if (got != want)
				th_fail(__FILE__, __LINE__, "%s block %d [%u] = "
				        "0x%08x, gguf-py 0x%08x", type, blocks, i,
				        got, want);
		}
		blocks++;
	}
	fclose(f);
	T_EQ(blocks, 8); /* 2 each of Q4_0, Q4_1, Q8_0; 1 of Q4_K, Q6_K */
}

/* ---------------------------------------------------------------- refusals */

TEST(gguf, every_truncation_refused)
{
	struct gb b = all_types_file();
	char err[KVT_ERRTEXT_MAX];
	struct gguf *g = NULL;
	T_OK(open_copy(b.p, b.len, &g, err, sizeof(err)));
	const char *path = tmp_path("cut.gguf");
	for (size_t k = 0; k < b.len; k++) {
		int rc = open_copy(b.p, k, &g, err, sizeof(err));
		if (rc != KVT_EINVAL)
			th_fail(__FILE__, __LINE__, "cut at %zu of %zu: %s (%s)",
			        k, b.len, kvt_errname(rc), err);
		/* The same through the file path (mmap). */
		write_bytes(path, b.p, k);
		rc = gguf_open(path, &g, err, sizeof(err));
		if (rc != KVT_EINVAL || g)
			th_fail(__FILE__, __LINE__, "file cut at %zu: %s (%s)",
			        k, kvt_errname(rc), err);
		T_ASSERT(strstr(err, path)); /* file errors name the file */
	}
	gb_free(&b);
}

/* Patches the 8 (or 4) bytes at off of a copy of the all-types file. */
static struct gb patched(size_t off, uint64_t v, size_t width)
{
	struct gb b = all_types_file();
	memcpy(b.p + off, &v, width);
	return b;
}

TEST(gguf, bad_magic_versions_counts)
{
	struct gb b = patched(0, 'G' | 'G' << 8 | 'M' << 16 | 'L' << 24, 4);
	T_REFUSED(&b, KVT_EINVAL, "not a GGUF file");
	gb_free(&b);
	b = patched(4, 2, 4);
	T_REFUSED(&b, KVT_EVERSION, "version 2");
	gb_free(&b);
	b = patched(4, 1, 4);
	T_REFUSED(&b, KVT_EVERSION, "version 1");
	gb_free(&b);
	b = patched(4, 4, 4);
	T_REFUSED(&b, KVT_EVERSION, "version 4");
	gb_free(&b);
	b = patched(4, 0x03000000u, 4);
	T_REFUSED(&b, KVT_ENOTSUP, "big-endian");
	gb_free(&b);
	b = patched(8, UINT64_C(1) << 62, 8); /* n_tensors */
	T_REFUSED(&b, KVT_EINVAL, "tensors");
	gb_free(&b);
	b = patched(16, UINT64_MAX, 8); /* n_kv */
	T_REFUSED(&b, KVT_EINVAL, "key/value");
	gb_free(&b);
	b = patched(8, ALL_NT + 1, 8); /* one tensor info more than there is */
	T_REFUSED(&b, KVT_EINVAL, "");
	gb_free(&b);
	/* Nonsense files through the path: empty, a directory, missing. */
	struct gguf *g = NULL;
	char err[KVT_ERRTEXT_MAX];
	write_bytes(tmp_path("empty.gguf"), "", 0);
	T_ERR(gguf_open(tmp_path("empty.gguf"), &g, err, sizeof(err)),
	      KVT_EINVAL);
	T_ASSERT(strstr(err, "truncated"));
	T_ERR(gguf_open(th_tmpdir(), &g, err, sizeof(err)), KVT_EINVAL);
	T_ERR(gguf_open(tmp_path("nope.gguf"), &g, err, sizeof(err)), KVT_ESYS);
	T_ASSERT(strstr(err, "No such file"));
	T_ASSERT(g == NULL);
}

/* A file with one key of type type whose value bytes are val[vlen], and
 * 16 bytes of trailing zeros (so the count check, which wants a few bytes
 * per key, lets the parser reach the value). */
static struct gb one_kv(const char *key, uint32_t type, const void *val,
                        size_t vlen)
{
	struct gb b = {0};
	gb_hdr(&b, GGUF_VERSION, 0, 1);
	gb_key(&b, key, type);
	gb_put(&b, val, vlen);
	gb_u64(&b, 0);
	gb_u64(&b, 0);
	return b;
}

TEST(gguf, huge_lengths_and_bad_values)
{
	struct gb b = {0};
	/* A key length beyond the file. */
	gb_hdr(&b, GGUF_VERSION, 0, 1);
	gb_u64(&b, UINT64_C(1) << 63);
	gb_put(&b, "abcdefghijklmnopqrstuvwxyz", 26);
	T_REFUSED(&b, KVT_EINVAL, "beyond");
	gb_free(&b);
	/* A string value length beyond the file. */
	uint64_t huge = UINT64_MAX - 3;
	b = one_kv("k", GGUF_TYPE_STRING, &huge, 8);
	T_REFUSED(&b, KVT_EINVAL, "value of k");
	gb_free(&b);
	/* Arrays claiming more elements than the file holds: fixed-size,
	 * strings, arrays; counts chosen so n * size overflows 64 bits. */
	uint32_t types[] = {GGUF_TYPE_UINT32, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY,
	                    GGUF_TYPE_UINT64};
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		uint8_t v[12 + 16] = {0};
		uint64_t n = (UINT64_C(1) << 62) + 1;
		memcpy(v, &types[i], 4);
		memcpy(v + 4, &n, 8);
		b = one_kv("arr", GGUF_TYPE_ARRAY, v, sizeof(v));
		T_REFUSED(&b, KVT_EINVAL, "claims");
		gb_free(&b);
	}
	/* Unknown value types, at the top and as array elements. */
	b = one_kv("k", 13, "\0\0\0\0", 4);
	T_REFUSED(&b, KVT_EINVAL, "unknown value type 13");
	gb_free(&b);
	uint8_t ua[12] = {99};
	b = one_kv("k", GGUF_TYPE_ARRAY, ua, sizeof(ua));
	T_REFUSED(&b, KVT_EINVAL, "unknown element type 99");
	gb_free(&b);
	/* A bool must be 0 or 1, alone or in an array. */
	b = one_kv("k", GGUF_TYPE_BOOL, "\2", 1);
	T_REFUSED(&b, KVT_EINVAL, "bool");
	gb_free(&b);
	uint8_t ba[15] = {GGUF_TYPE_BOOL, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 7};
	b = one_kv("k", GGUF_TYPE_ARRAY, ba, sizeof(ba));
	T_REFUSED(&b, KVT_EINVAL, "bool element 2");
	gb_free(&b);
	/* An empty key; a duplicate key. */
	b = one_kv("", GGUF_TYPE_UINT8, "\1", 1);
	T_REFUSED(&b, KVT_EINVAL, "length 0");
	gb_free(&b);
	gb_hdr(&b, GGUF_VERSION, 0, 2);
	gb_kv_u32(&b, "dup", 1);
	gb_kv_u32(&b, "dup", 2);
	T_REFUSED(&b, KVT_EINVAL, "duplicate metadata key dup");
	gb_free(&b);
	/* Bad alignments: zero, not a power of two, wrong type. */
	uint32_t al[] = {0, 48};
	for (int i = 0; i < 2; i++) {
		b = one_kv("general.alignment", GGUF_TYPE_UINT32, &al[i], 4);
		T_REFUSED(&b, KVT_EINVAL, "general.alignment");
		gb_free(&b);
	}
	uint64_t al64 = 32;
	b = one_kv("general.alignment", GGUF_TYPE_UINT64, &al64, 8);
	T_REFUSED(&b, KVT_EINVAL, "uint64");
	gb_free(&b);
}

/* An array of arrays nested depth deep, the innermost holding one uint8. */
static struct gb nested(int depth)
{
	struct gb b = {0};
	gb_hdr(&b, GGUF_VERSION, 0, 1);
	gb_key(&b, "deep", GGUF_TYPE_ARRAY);
	for (int i = 1; i < depth; i++) {
		gb_u32(&b, GGUF_TYPE_ARRAY);
		gb_u64(&b, 1);
	}
	gb_u32(&b, GGUF_TYPE_UINT8);
	gb_u64(&b, 1);
	gb_u8(&b, 42);
	return b;
}

TEST(gguf, nesting_bounded)
{
	struct gb b = nested(GGUF_MAX_DEPTH);
	struct gguf *g = NULL;
	char err[KVT_ERRTEXT_MAX];
	uint8_t *c = malloc(b.len);
	T_ASSERT(c);
	memcpy(c, b.p, b.len);
	T_OK(gguf_open_mem(c, b.len, &g, err, sizeof(err)));
	struct gguf_value v = *gguf_find(g, "deep"), w;
	for (int i = 1; i < GGUF_MAX_DEPTH; i++) {
		T_OK(gguf_arr_item(&v, 0, &w));
		v = w;
	}
	T_OK(gguf_arr_item(&v, 0, &w));
	T_EQ(w.v.u, 42);
	gguf_close(g);
	free(c);
	gb_free(&b);
	b = nested(GGUF_MAX_DEPTH + 1);
	T_REFUSED(&b, KVT_EINVAL, "nested deeper");
	gb_free(&b);
	/* A file of nothing but nesting headers is refused, not recursed
	 * into until the stack runs out. */
	b = nested(100000);
	T_REFUSED(&b, KVT_EINVAL, "nested deeper");
	gb_free(&b);
}

/* A file with tensor infos t[n] (alignment 32) and data_len data bytes. */
static struct gb tensors_file(const struct tdesc *t, int n, size_t data_len)
{
	struct gb b = {0};
	gb_hdr(&b, GGUF_VERSION, (uint64_t)n, 0);
	for (int i = 0; i < n; i++)
		gb_tinfo(&b, t[i].name, t[i].n_dims, t[i].ne, t[i].type,
		         t[i].off);
	gb_pad(&b, 32);
	for (size_t i = 0; i < data_len; i++)
		gb_u8(&b, 0);
	return b;
}

TEST(gguf, bad_tensor_infos)
{
	struct tdesc ok = {"a", GGUF_GGML_F32, 1, {8, 1}, 0, 32};
	struct gb b = tensors_file(&ok, 1, 32);
	struct gguf *g = NULL;
	char err[KVT_ERRTEXT_MAX];
	T_OK(open_copy(b.p, b.len, &g, err, sizeof(err)));
	gb_free(&b);

	struct {
		struct tdesc t[2];
		int n;
		size_t data;
		int code;
		const char *word;
	} cases[] = {
		{{{"a", 4, 1, {8, 1}, 0, 0}}, 1, 64, KVT_ENOTSUP,
		 "unknown tensor type 4"},
		{{{"a", 99, 1, {8, 1}, 0, 0}}, 1, 64, KVT_ENOTSUP,
		 "unknown tensor type 99"},
		{{{"a", GGUF_GGML_F32, 1, {8, 1}, 0, 0},
		  {"a", GGUF_GGML_F32, 1, {8, 1}, 32, 0}}, 2, 64, KVT_EINVAL,
		 "duplicate tensor name a"},
		{{{"a", GGUF_GGML_F32, 1, {8, 1}, 32, 0}}, 1, 32, KVT_EINVAL,
		 "beyond the end"},
		{{{"a", GGUF_GGML_F32, 1, {9, 1}, 0, 0}}, 1, 32, KVT_EINVAL,
		 "beyond the end"}, /* 36 bytes in 32 */
		{{{"a", GGUF_GGML_F32, 1, {8, 1}, UINT64_MAX - 31, 0}}, 1, 32,
		 KVT_EINVAL, "beyond the end"},
		{{{"a", GGUF_GGML_F32, 1, {8, 1}, 16, 0}}, 1, 64, KVT_EINVAL,
		 "alignment"},
		{{{"a", GGUF_GGML_F32, 1, {16, 1}, 0, 0},
		  {"b", GGUF_GGML_F32, 1, {8, 1}, 32, 0}}, 2, 96, KVT_EINVAL,
		 "overlap"},
		{{{"a", GGUF_GGML_F32, 2, {UINT64_C(1) << 32, UINT64_C(1) << 32},
		   0, 0}}, 1, 32, KVT_EINVAL, "overflows"},
		{{{"a", GGUF_GGML_F32, 1, {UINT64_C(1) << 63, 1}, 0, 0}}, 1, 32,
		 KVT_EINVAL, "overflows"},
		{{{"a", GGUF_GGML_F32, 2, {8, 0}, 0, 0}}, 1, 32, KVT_EINVAL,
		 "dimension 1 is 0"},
		{{{"a", GGUF_GGML_F32, 5, {8, 1}, 0, 0}}, 1, 32, KVT_EINVAL,
		 "5 dimensions"},
		{{{"a", GGUF_GGML_F32, 0, {8, 1}, 0, 0}}, 1, 32, KVT_EINVAL,
		 "0 dimensions"},
		{{{"a", GGUF_GGML_Q4_0, 1, {48, 1}, 0, 0}}, 1, 64, KVT_EINVAL,
		 "whole number of Q4_0 blocks"},
		{{{"", GGUF_GGML_F32, 1, {8, 1}, 0, 0}}, 1, 32, KVT_EINVAL,
		 "name of 0 bytes"},
		{{{"01234567890123456789012345678901234567890123456789012345678"
		   "901234", GGUF_GGML_F32, 1, {8, 1}, 0, 0}}, 1, 32, KVT_EINVAL,
		 "name of 65 bytes"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		/* n_dims 5 writes 5 dims: give the writer room. */
		struct tdesc t[2];
		memcpy(t, cases[i].t, sizeof(t));
		struct gb f = {0};
		gb_hdr(&f, GGUF_VERSION, (uint64_t)cases[i].n, 0);
		for (int j = 0; j < cases[i].n; j++) {
			uint64_t ne[5] = {t[j].ne[0], t[j].ne[1], 1, 1, 1};
			gb_tinfo(&f, t[j].name, t[j].n_dims, ne, t[j].type,
			         t[j].off);
		}
		gb_pad(&f, 32);
		for (size_t k = 0; k < cases[i].data; k++)
			gb_u8(&f, 0);
		T_REFUSED(&f, cases[i].code, cases[i].word);
		gb_free(&f);
	}
	/* A 64-byte name is the longest accepted. */
	struct tdesc n64 = {"0123456789012345678901234567890123456789012345678"
	                    "901234567890123", GGUF_GGML_F32, 1, {8, 1}, 0, 32};
	b = tensors_file(&n64, 1, 32);
	T_OK(open_copy(b.p, b.len, &g, err, sizeof(err)));
	gb_free(&b);
}

/* ---------------------------------------------------------------- llama */

/* A tiny llama file: 2 layers, n_embd 32, 4 heads (head_dim 8), 2 KV
 * heads, FFN 64, vocab 5 (from the token list), all tensors F32 except
 * where a variant says otherwise. */
struct tiny {
	const char *arch;
	const char *skip;     /* tensor left out */
	const char *bad;      /* tensor with ne[1] one larger */
	const char *typed;    /* tensor stored as type */
	uint32_t type;
	uint32_t kv_heads;
	int output;           /* write output.weight (untied) */
	const char *drop_key; /* metadata key left out */
};

static void tiny_tensor(struct gb *hdr, struct gb *data, const struct tiny *o,
                        const char *name, uint64_t ne0, uint64_t ne1)
{
	if (o->skip && !strcmp(o->skip, name))
		return;
	uint32_t type = o->typed && !strcmp(o->typed, name) ? o->type
	                                                     : GGUF_GGML_F32;
	if (o->bad && !strcmp(o->bad, name))
		ne1++;
	uint64_t ne[2] = {ne0, ne1 ? ne1 : 1}, n = ne0 * ne[1], bytes;
	bytes = type == GGUF_GGML_F32 ? n * 4 : type == GGUF_GGML_F16
	                                          ? n * 2 : n / 32 * 22;
	gb_tinfo(hdr, name, ne1 ? 2 : 1, ne, type, data->len);
	for (uint64_t i = 0; i < bytes; i++)
		gb_u8(data, 0);
	gb_pad(data, 32);
}

static struct gb tiny_llama(const struct tiny *o)
{
	struct gb kv = {0}, ti = {0}, data = {0}, b = {0};
	int nkv = 0, nt = 0;
	const char *keys[] = {"llama.embedding_length", "llama.block_count",
	                      "llama.attention.head_count",
	                      "llama.attention.head_count_kv",
	                      "llama.feed_forward_length",
	                      "llama.context_length"};
	uint32_t vals[] = {32, 2, 4, o->kv_heads ? o->kv_heads : 2, 64, 16};
	gb_kv_str(&kv, "general.architecture", o->arch ? o->arch : "llama");
	nkv++;
	for (int i = 0; i < 6; i++)
		if (!o->drop_key || strcmp(o->drop_key, keys[i])) {
			gb_kv_u32(&kv, keys[i], vals[i]);
			nkv++;
		}
	gb_key(&kv, "llama.attention.layer_norm_rms_epsilon", GGUF_TYPE_FLOAT32);
	gb_f32(&kv, 1e-5f);
	gb_key(&kv, "llama.rope.freq_base", GGUF_TYPE_FLOAT32);
	gb_f32(&kv, 100000.0f);
	gb_key(&kv, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
	gb_u32(&kv, GGUF_TYPE_STRING);
	gb_u64(&kv, 5);
	for (int i = 0; i < 5; i++)
		gb_str(&kv, "t");
	nkv += 3;

	size_t before = ti.len;
	(void)before;
	const char *names[] = {"token_embd.weight", "output_norm.weight",
	                       "output.weight"};
	uint64_t dims[][2] = {{32, 5}, {32, 0}, {32, 5}};
	for (int i = 0; i < 3; i++) {
		if (i == 2 && !o->output)
			continue;
		size_t l0 = ti.len;
		tiny_tensor(&ti, &data, o, names[i], dims[i][0], dims[i][1]);
		nt += ti.len != l0;
	}
	const uint64_t q = 32, kvd = 8 * (uint64_t)(o->kv_heads ? o->kv_heads : 2);
	const struct {
		const char *s;
		uint64_t a, c;
	} per[] = {{"attn_norm.weight", 32, 0}, {"attn_q.weight", 32, q},
	           {"attn_k.weight", 32, kvd},  {"attn_v.weight", 32, kvd},
	           {"attn_output.weight", q, 32}, {"ffn_norm.weight", 32, 0},
	           {"ffn_gate.weight", 32, 64}, {"ffn_up.weight", 32, 64},
	           {"ffn_down.weight", 64, 32}};
	for (int l = 0; l < 2; l++)
		for (size_t i = 0; i < sizeof(per) / sizeof(per[0]); i++) {
			char name[64];
			snprintf(name, sizeof(name), "blk.%d.%s", l, per[i].s);
			size_t l0 = ti.len;
			tiny_tensor(&ti, &data, o, name, per[i].a, per[i].c);
			nt += ti.len != l0;
		}
	gb_hdr(&b, GGUF_VERSION, (uint64_t)nt, (uint64_t)nkv);
	gb_put(&b, kv.p, kv.len);
	gb_put(&b, ti.p, ti.len);
	gb_pad(&b, 32);
	gb_put(&b, data.p, data.len);
	gb_free(&kv);
	gb_free(&ti);
	gb_free(&data);
	return b;
}

/* Opens the tiny llama o and runs the architecture check on it. */
static int tiny_check(const struct tiny *o, struct gguf_llama *hp, char *err,
                      size_t errlen)
{
	struct gb b = tiny_llama(o);
	struct gguf *g = NULL;
	int rc = gguf_open_mem(b.p, b.len, &g, err, errlen);
	if (rc < 0)
		th_fail(__FILE__, __LINE__, "tiny llama refused at load: %s",
		        err);
	rc = gguf_llama_check(g, hp, err, errlen);
	gguf_close(g);
	gb_free(&b);
	return rc;
}

#define T_TINY(o, code, word)                                                  \
	do {                                                                   \
		struct gguf_llama hp_;                                         \
		char e_[KVT_ERRTEXT_MAX] = "";                                 \
		T_ERR(tiny_check(o, &hp_, e_, sizeof(e_)), code);              \
		if (!strstr(e_, word))                                         \
			th_fail(__FILE__, __LINE__, "reason \"%s\" lacks "    \
			        "\"%s\"", e_, word);                           \
	} while (0)

TEST(gguf, llama_check)
{
	struct gguf_llama hp;
	char err[KVT_ERRTEXT_MAX];
	struct tiny o = {0};
	T_OK(tiny_check(&o, &hp, err, sizeof(err)));
	T_EQ(hp.n_embd, 32);
	T_EQ(hp.n_layer, 2);
	T_EQ(hp.n_head, 4);
	T_EQ(hp.n_head_kv, 2);
	T_EQ(hp.head_dim, 8);
	T_EQ(hp.n_ff, 64);
	T_EQ(hp.n_vocab, 5);
	T_EQ(hp.n_ctx, 16);
	T_ASSERT(hp.rope_theta == 100000.0f);
	T_ASSERT(hp.rms_eps == 1e-5f);
	T_EQ(hp.tied, 1);
	o.output = 1;
	T_OK(tiny_check(&o, &hp, err, sizeof(err)));
	T_EQ(hp.tied, 0);
	/* F16 is as good as F32 for the check. */
	o = (struct tiny){.typed = "blk.1.ffn_up.weight", .type = GGUF_GGML_F16};
	T_OK(tiny_check(&o, &hp, err, sizeof(err)));

	o = (struct tiny){.arch = "gpt2"};
	T_TINY(&o, KVT_ENOTSUP, "architecture \"gpt2\"");
	o = (struct tiny){.skip = "blk.1.ffn_up.weight"};
	T_TINY(&o, KVT_EGEOMETRY, "missing tensor blk.1.ffn_up.weight");
	o = (struct tiny){.bad = "blk.0.attn_k.weight"};
	T_TINY(&o, KVT_EGEOMETRY, "blk.0.attn_k.weight has 2 dims {32, 17");
	o = (struct tiny){.bad = "token_embd.weight"};
	T_TINY(&o, KVT_EGEOMETRY, "token_embd.weight");
	o = (struct tiny){.bad = "output.weight", .output = 1};
	T_TINY(&o, KVT_EGEOMETRY, "output.weight");
	o = (struct tiny){.typed = "blk.0.attn_q.weight", .type = GGUF_GGML_Q5_0};
	T_TINY(&o, KVT_ENOTSUP, "Q5_0");
	o = (struct tiny){.kv_heads = 3}; /* 4 heads do not share 3 */
	T_TINY(&o, KVT_EINVAL, "inconsistent");
	o = (struct tiny){.drop_key = "llama.feed_forward_length"};
	T_TINY(&o, KVT_EINVAL, "missing key llama.feed_forward_length");
}

/* ---------------------------------------------------------------- models */

TEST(gguf, model_files_dir_rule)
{
	char buf[512], err[KVT_ERRTEXT_MAX];
	setenv("KVTRIM_MODELS", "/m", 1);
	setenv("XDG_CACHE_HOME", "/x", 1);
	setenv("HOME", "/h", 1);
	T_OK(model_files_dir(buf, sizeof(buf), err, sizeof(err)));
	T_EQ_STR(buf, "/m");
	setenv("KVTRIM_MODELS", "", 1); /* empty counts as unset */
	T_OK(model_files_dir(buf, sizeof(buf), err, sizeof(err)));
	T_EQ_STR(buf, "/x/kvtrim/models");
	unsetenv("XDG_CACHE_HOME");
	T_OK(model_files_dir(buf, sizeof(buf), err, sizeof(err)));
	T_EQ_STR(buf, "/h/.cache/kvtrim/models");
	unsetenv("HOME");
	T_ERR(model_files_dir(buf, sizeof(buf), err, sizeof(err)), KVT_EINVAL);
	T_ERR(model_files_dir(buf, 4, err, sizeof(err)), KVT_EINVAL);

	/* model_files_find wants the file and its stamp. */
	setenv("KVTRIM_MODELS", th_tmpdir(), 1);
	T_ERR(model_files_find("m.gguf", buf, sizeof(buf), err, sizeof(err)),
	      KVT_EINVAL);
	T_ASSERT(strstr(err, "make models"));
	write_bytes(tmp_path("m.gguf"), "x", 1);
	T_ERR(model_files_find("m.gguf", buf, sizeof(buf), err, sizeof(err)),
	      KVT_EINVAL);
	T_ASSERT(strstr(err, "not verified"));
	write_bytes(tmp_path("m.gguf.sha256"), "x", 1);
	T_OK(model_files_find("m.gguf", buf, sizeof(buf), err, sizeof(err)));
	T_EQ_STR(buf, tmp_path("m.gguf"));
}

/* Runs scripts/models.sh with the cache in the scratch directory and the
 * package index pointed at a closed local port; returns its exit status. */
static int models_sh_offline(void)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd),
	         "env -u PIP_FIND_LINKS KVTRIM_MODELS='%s/cache' PIP_INDEX_URL=http://127.0.0.1:9/simple "
	         "PIP_TIMEOUT=2 PIP_CONFIG_FILE=/dev/null "
	         "sh scripts/models.sh 2>'%s/log'",
	         th_tmpdir(), th_tmpdir());
	int st = system(cmd);
	T_ASSERT(st != -1 && WIFEXITED(st));
	return WEXITSTATUS(st);
}

TEST_T(gguf, models_script_offline, 90)
{
	if (system("python3 -m pip --version >/dev/null 2>&1") != 0)
		T_SKIP("python3 with pip not found");
	char path[600], log[600];
	snprintf(log, sizeof(log), "%s/log", th_tmpdir());
	/* Nothing cached, registry unreachable: 77 and a message, no file. */
	T_EQ(models_sh_offline(), 77);
	FILE *f = fopen(log, "r");
	T_ASSERT(f);
	char text[8192];
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = 0;
	T_ASSERT(strstr(text, "unavailable"));
	snprintf(path, sizeof(path), "%s/cache/%s", th_tmpdir(), MODEL_FILES_SMOLLM2);
	T_ASSERT(access(path, F_OK) != 0);
	/* A cached file of the wrong content is removed, never kept. */
	write_bytes(path, "not a model", 11);
	T_EQ(models_sh_offline(), 77);
	T_ASSERT(access(path, F_OK) != 0);
	/* A verified file with its stamp: 0 at once, without the network. */
	char stamp[700];
	write_bytes(path, "stand-in", 8);
	snprintf(stamp, sizeof(stamp), "%s.sha256", path);
	const char *line = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70"
	                   "ea373728110db53  " MODEL_FILES_SMOLLM2 "\n";
	write_bytes(stamp, line, strlen(line));
	T_EQ(models_sh_offline(), 0);
}

/* ---------------------------------------------------------------- SmolLM2 */

#define FIXTURE "tests/fixtures/smollm2/gguf.txt"

/* Undoes the fixture's escapes (\\ \n \t \xHH; "\x" alone is ""). */
static size_t unescape(const char *s, char *out, size_t cap)
{
	size_t n = 0;
	if (!strcmp(s, "\\x"))
		return 0;
	for (; *s && n + 1 < cap; s++) {
		if (*s != '\\') {
			out[n++] = *s;
			continue;
		}
		s++;
		if (*s == 'n')
			out[n++] = '\n';
		else if (*s == 't')
			out[n++] = '\t';
		else if (*s == 'x' && s[1] && s[2]) {
			char h[3] = {s[1], s[2], 0};
			out[n++] = (char)strtoul(h, NULL, 16);
			s += 2;
		} else
			out[n++] = *s;
	}
	out[n] = 0;
	return n;
}

/* Compares value v (of type name tname) with the fixture's text. */
static void check_scalar(const char *key, const struct gguf_value *v,
                         const char *tname, const char *text)
{
	static char want[65536];
	if (strcmp(gguf_value_type_name(v->type), tname))
		th_fail(__FILE__, __LINE__, "%s: type %s, fixture %s", key,
		        gguf_value_type_name(v->type), tname);
	switch (v->type) {
	case GGUF_TYPE_STRING: {
		size_t n = unescape(text, want, sizeof(want));
		if (v->v.s.len != n || memcmp(v->v.s.p, want, n))
			th_fail(__FILE__, __LINE__, "%s: string differs", key);
		break;
	}
	case GGUF_TYPE_FLOAT32: {
		float f = (float)v->v.f;
		uint32_t bits;
		memcpy(&bits, &f, 4);
		T_EQ_U64(bits, strtoull(text, NULL, 16));
		break;
	}
	case GGUF_TYPE_FLOAT64: {
		uint64_t bits;
		memcpy(&bits, &v->v.f, 8);
		T_EQ_U64(bits, strtoull(text, NULL, 16));
		break;
	}
	case GGUF_TYPE_BOOL:
		T_EQ(v->v.b, atoi(text));
		break;
	case GGUF_TYPE_INT8: case GGUF_TYPE_INT16: case GGUF_TYPE_INT32:
	case GGUF_TYPE_INT64:
		T_EQ(v->v.i, strtoll(text, NULL, 10));
		break;
	default:
		T_EQ_U64(v->v.u, strtoull(text, NULL, 10));
	}
}

static void check_arr(const struct gguf *g, char *rest)
{
	char *save, *key = strtok_r(rest, " ", &save);
	char *et = strtok_r(NULL, " ", &save);
	char *n = strtok_r(NULL, " ", &save);
	const struct gguf_value *v = gguf_find(g, key);
	T_ASSERT(key && et && n && v);
	T_EQ(v->type, GGUF_TYPE_ARRAY);
	T_EQ_STR(gguf_value_type_name(v->v.arr.type), et);
	T_EQ_U64(v->v.arr.n, strtoull(n, NULL, 10));
	for (char *it; (it = strtok_r(NULL, " ", &save));) {
		char *eq = strchr(it, '=');
		struct gguf_value x;
		T_ASSERT(eq);
		*eq = 0;
		T_OK(gguf_arr_item(v, strtoull(it, NULL, 10), &x));
		check_scalar(key, &x, et, eq + 1);
	}
}

static const struct gguf_tensor *fx_tensor(const struct gguf *g,
                                           const char *name)
{
	const struct gguf_tensor *t = gguf_tensor_find(g, name);
	if (!t)
		th_fail(__FILE__, __LINE__, "no tensor %s", name);
	return t;
}

static void check_values(const struct gguf *g, char *rest)
{
	char *save, *name = strtok_r(rest, " ", &save);
	uint64_t first = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
	uint64_t n = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
	const struct gguf_tensor *t = fx_tensor(g, name);
	float *y = malloc(n * sizeof(float));
	char err[KVT_ERRTEXT_MAX];
	T_ASSERT(y);
	T_OK(gguf_dequant(t, first, n, y, err, sizeof(err)));
	for (uint64_t i = 0; i < n; i++) {
		char *h = strtok_r(NULL, " ", &save);
		uint32_t bits;
		T_ASSERT(h);
		memcpy(&bits, &y[i], 4);
		if (bits != strtoul(h, NULL, 16))
			th_fail(__FILE__, __LINE__, "%s[%llu] = 0x%08x, gguf-py "
			        "0x%s", name, (unsigned long long)(first + i),
			        bits, h);
	}
	free(y);
}

/* The fixture's hashes of the whole dequantised tensor. */
static void check_hash(const struct gguf *g, char *rest)
{
	char *save, *name = strtok_r(rest, " ", &save);
	uint64_t n = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
	uint64_t h1 = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
	uint64_t h2 = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
	const struct gguf_tensor *t = fx_tensor(g, name);
	T_EQ_U64(t->n_elem, n);
	float *y = malloc(n * sizeof(float));
	char err[KVT_ERRTEXT_MAX];
	T_ASSERT(y);
	T_OK(gguf_dequant(t, 0, n, y, err, sizeof(err)));
	uint64_t a = 0, b = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint32_t w;
		memcpy(&w, &y[i], 4);
		a += w;
		b += (i + 1) * (uint64_t)w;
	}
	free(y);
	if (a != h1 || b != h2)
		th_fail(__FILE__, __LINE__, "%s: dequantised values differ "
		        "from gguf-py's (hash %llu %llu, fixture %llu %llu)",
		        name, (unsigned long long)a, (unsigned long long)b,
		        (unsigned long long)h1, (unsigned long long)h2);
}

static void check_tensor(const struct gguf *g, char *rest)
{
	char name[128], type[16];
	unsigned nd;
	unsigned long long ne0, ne1, off, bytes;
	T_EQ(sscanf(rest, "%127s %15s %u %llu %llu %llu %llu", name, type, &nd,
	            &ne0, &ne1, &off, &bytes), 7);
	const struct gguf_tensor *t = fx_tensor(g, name);
	T_EQ_STR(gguf_type_name(t->type), type);
	T_EQ(t->n_dims, nd);
	T_EQ_U64(t->ne[0], ne0);
	T_EQ_U64(t->ne[1], ne1);
	T_EQ_U64(gguf_data_offset(g) + t->offset, off); /* fixture: absolute */
	T_EQ_U64(t->n_bytes, bytes);
}

static void check_types(const struct gguf *g, char *rest)
{
	char *save;
	for (char *it = strtok_r(rest, " ", &save); it;
	     it = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(it, '=');
		T_ASSERT(eq);
		*eq = 0;
		size_t count = 0;
		for (size_t i = 0; i < gguf_tensor_count(g); i++)
			count += !strcmp(gguf_type_name(gguf_tensor_at(g, i)->type),
			                 it);
		T_EQ(count, atoi(eq + 1));
	}
}

static struct gguf *open_smollm2(char *path, size_t len)
{
	char err[KVT_ERRTEXT_MAX], why[KVT_ERRTEXT_MAX + 32];
	if (model_files_find(MODEL_FILES_SMOLLM2, path, len, err, sizeof(err)) < 0) {
		snprintf(why, sizeof(why), "%s", err);
		T_SKIP(why);
	}
	struct gguf *g = NULL;
	int rc = gguf_open(path, &g, err, sizeof(err));
	if (rc < 0)
		th_fail(__FILE__, __LINE__, "gguf_open: %s", err);
	return g;
}

TEST_T(gguf, smollm2_matches_gguf_py, 120)
{
	char path[4200];
	struct gguf *g = open_smollm2(path, sizeof(path));
	FILE *f = fopen(FIXTURE, "r");
	if (!f)
		th_fail(__FILE__, __LINE__, "%s: %s (run from the repository "
		        "root)", FIXTURE, strerror(errno));
	static char line[1 << 17];
	int counts[6] = {0}; /* file kv arr tensor values hash */
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		char *sp = strchr(line, ' ');
		if (line[0] == '#' || !sp)
			continue;
		*sp = 0;
		char *rest = sp + 1;
		if (!strcmp(line, "file")) {
			unsigned long long nkv, nt, al, doff;
			T_EQ(sscanf(rest, "%llu %llu %llu %llu", &nkv, &nt, &al,
			            &doff), 4);
			T_EQ(gguf_kv_count(g), nkv);
			T_EQ(gguf_tensor_count(g), nt);
			T_EQ(gguf_alignment(g), al);
			T_EQ_U64(gguf_data_offset(g), doff);
			counts[0]++;
		} else if (!strcmp(line, "kv")) {
			char *save, *key = strtok_r(rest, " ", &save);
			char *tn = strtok_r(NULL, " ", &save);
			char *val = strtok_r(NULL, "", &save);
			const struct gguf_value *v = gguf_find(g, key);
			if (!v)
				th_fail(__FILE__, __LINE__, "no key %s", key);
			check_scalar(key, v, tn, val ? val : "");
			counts[1]++;
		} else if (!strcmp(line, "arr")) {
			check_arr(g, rest);
			counts[2]++;
		} else if (!strcmp(line, "tensor")) {
			check_tensor(g, rest);
			counts[3]++;
		} else if (!strcmp(line, "types")) {
			check_types(g, rest);
		} else if (!strcmp(line, "values")) {
			check_values(g, rest);
			counts[4]++;
		} else if (!strcmp(line, "hash")) {
			check_hash(g, rest);
			counts[5]++;
		} else {
			th_fail(__FILE__, __LINE__, "unknown fixture line %s",
			        line);
		}
	}
	fclose(f);
	/* The fixture really was read: every kind of record is there. */
	for (int i = 0; i < 6; i++)
		T_ASSERT(counts[i] > 0);
	gguf_close(g);
}

TEST(gguf, smollm2_llama_hyperparameters)
{
	char path[4200], err[KVT_ERRTEXT_MAX];
	struct gguf *g = open_smollm2(path, sizeof(path));
	struct gguf_llama hp;
	T_OK(gguf_llama_check(g, &hp, err, sizeof(err)));
	/* The model card's figures (issue 10). */
	T_EQ(hp.n_layer, 30);
	T_EQ(hp.n_embd, 576);
	T_EQ(hp.n_head, 9);
	T_EQ(hp.n_head_kv, 3);
	T_EQ(hp.head_dim, 64);
	T_EQ(hp.n_ff, 1536);
	T_EQ(hp.n_vocab, 49152);
	T_EQ(hp.n_ctx, 8192);
	T_ASSERT(hp.rope_theta == 100000.0f);
	T_ASSERT(hp.rms_eps == 1e-5f);
	T_EQ(hp.tied, 1);
	T_EQ(fx_tensor(g, "token_embd.weight")->type, GGUF_GGML_Q8_0);
	T_EQ(fx_tensor(g, "blk.7.ffn_gate.weight")->type, GGUF_GGML_Q4_1);
	T_EQ(fx_tensor(g, "output_norm.weight")->type, GGUF_GGML_F32);
	gguf_close(g);
}

TEST_T(gguf, smollm2_truncated_copies_refused, 60)
{
	char path[4200], err[KVT_ERRTEXT_MAX];
	struct gguf *g = open_smollm2(path, sizeof(path));
	uint64_t doff = gguf_data_offset(g);
	gguf_close(g);
	FILE *f = fopen(path, "rb");
	T_ASSERT(f);
	/* Cut inside the token list, inside the merges, at the data section
	 * and inside the last tensor: each one refused, none crashing. */
	struct stat st;
	T_ASSERT(stat(path, &st) == 0);
	uint64_t cuts[] = {24, 1000, 600000, 1500000, doff, doff + 1000,
	                   (uint64_t)st.st_size - 1};
	size_t cap = (size_t)doff + 1000;
	uint8_t *buf = malloc(cap);
	T_ASSERT(buf);
	T_EQ(fread(buf, 1, cap, f), cap);
	fclose(f);
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		const char *cut = tmp_path("cut.gguf");
		if (cuts[i] <= cap) {
			write_bytes(cut, buf, (size_t)cuts[i]);
		} else {
			/* Near the end: a sparse copy of the right length
			 * whose header is the real one. */
			write_bytes(cut, buf, cap);
			T_ASSERT(truncate(cut, (off_t)cuts[i]) == 0);
		}
		T_ERR(gguf_open(cut, &g, err, sizeof(err)), KVT_EINVAL);
		T_ASSERT(g == NULL && strstr(err, cut));
		if (cuts[i] >= doff)
			T_ASSERT(strstr(err, "beyond the end"));
	}
	free(buf);
}
