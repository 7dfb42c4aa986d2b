/*
 * weights_test.c — the safetensors loader and writer: round trips, the
 * kvpress KVzap directory layout, hand-written F16/BF16 files, and every
 * refusal with its code and a reason naming the tensor.
 * Run: build/bin/kvtrim-tests weights
 */
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "weights.h"

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

/* A safetensors file from a header string and a data section, with the
 * header length given explicitly (hlen 0: its real length). */
static void write_raw(const char *path, const char *hdr, uint64_t hlen,
                      const void *data, size_t dlen)
{
	size_t len = strlen(hdr);
	if (!hlen)
		hlen = len;
	unsigned char *buf = malloc(8 + len + dlen);
	T_ASSERT(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)(hlen >> (8 * i)); /* little-endian */
	memcpy(buf + 8, hdr, len);
	if (dlen)
		memcpy(buf + 8 + len, data, dlen);
	write_bytes(path, buf, 8 + len + dlen);
	free(buf);
}

/* Loading path must fail with code and a reason containing needle. */
static void expect_refusal(const char *path, int code, const char *needle)
{
	struct weights *w = (struct weights *)1;
	char err[256] = "";
	int rv = weights_load(path, &w, err, sizeof(err));
	if (rv != code)
		th_fail(__FILE__, __LINE__, "load gave %s (%s), expected %s",
		        kvt_errname(rv), err, kvt_errname(code));
	T_ASSERT(w == NULL);
	if (!strstr(err, needle))
		th_fail(__FILE__, __LINE__, "reason \"%s\" lacks \"%s\"", err,
		        needle);
}

static struct weights *load_ok(const char *path)
{
	struct weights *w = NULL;
	char err[256] = "";
	int rv = weights_load(path, &w, err, sizeof(err));
	if (rv)
		th_fail(__FILE__, __LINE__, "load %s: %s: %s", path,
		        kvt_errname(rv), err);
	T_ASSERT(w);
	return w;
}

TEST(weights, round_trip)
{
	float a[12], b[5], c = 3.25f;
	for (int i = 0; i < 12; i++)
		a[i] = (float)i * 0.5f - 2.0f;
	for (int i = 0; i < 5; i++)
		b[i] = -1e-30f * (float)(i + 1);
	const struct weights_tensor t[4] = {
		{"layers.0.weight", 2, {3, 4}, a},
		{"layers.0.bias", 1, {5}, b},
		{"scalar", 0, {0}, &c},
		{"empty", 2, {0, 7}, NULL},
	};
	const char *p = tmp_path("rt.safetensors");
	char err[256];
	T_OK(weights_write(p, t, 4, err, sizeof(err)));

	/* The data section starts 8-byte aligned. */
	FILE *f = fopen(p, "rb");
	uint64_t hlen = 0;
	T_ASSERT(f && fread(&hlen, 8, 1, f) == 1);
	fclose(f);
	T_EQ((8 + hlen) % 8, 0);

	struct weights *w = load_ok(p);
	T_EQ(weights_count(w), 4);
	T_EQ_STR(weights_name_at(w, 0), "layers.0.weight");
	T_EQ_STR(weights_name_at(w, 1), "layers.0.bias");
	T_EQ_STR(weights_name_at(w, 2), "scalar");
	T_EQ_STR(weights_name_at(w, 3), "empty");
	T_ASSERT(weights_name_at(w, 4) == NULL);
	T_EQ(weights_has(w, "layers.0.bias"), 1);
	T_EQ(weights_has(w, "layers.1.bias"), 0);

	const float *ga =
		weights_get(w, "layers.0.weight", 2, (uint64_t[]){3, 4}, err,
		            sizeof(err));
	T_ASSERT(ga && !memcmp(ga, a, sizeof(a)));
	const float *gb = weights_get(w, "layers.0.bias", 1, (uint64_t[]){5},
	                              err, sizeof(err));
	T_ASSERT(gb && !memcmp(gb, b, sizeof(b)));
	const float *gc = weights_get(w, "scalar", 0, NULL, err, sizeof(err));
	T_ASSERT(gc && *gc == 3.25f);
	T_ASSERT(weights_get(w, "empty", 2, (uint64_t[]){0, 7}, err,
	                     sizeof(err)) != NULL);

	T_ASSERT(!weights_get(w, "layers.0.weight", 2, (uint64_t[]){4, 3}, err,
	                      sizeof(err)));
	T_EQ_STR(err, "tensor layers.0.weight has shape [3,4], expected [4,3]");
	T_ASSERT(!weights_get(w, "layers.0.weight", 1, (uint64_t[]){12}, err,
	                      sizeof(err)));
	T_EQ_STR(err, "tensor layers.0.weight has shape [3,4], expected [12]");
	T_ASSERT(!weights_get(w, "x", 1, (uint64_t[]){1}, err, sizeof(err)));
	T_EQ_STR(err, "missing tensor x");
	/* A plain file has no config. */
	uint32_t v;
	T_ERR(weights_config_u32(w, "input_dim", &v), KVT_EINVAL);
	weights_free(w);
	weights_free(NULL);
}

TEST(weights, kvpress_directory)
{
	/* nvidia/KVzap-linear-* layout: config.json + model.safetensors with
	 * one Linear per layer (hidden_dim null for the linear model). */
	const char *dir = tmp_path("kvzap");
	T_ASSERT(mkdir(dir, 0755) == 0);
	char cfg[600], model[600];
	snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
	snprintf(model, sizeof(model), "%s/model.safetensors", dir);
	const char *json = "{\"input_dim\": 64, \"output_dim\": 4, "
	                   "\"hidden_dim\": null, \"n_modules\": 5, "
	                   "\"model_type\": \"linear\", \"neg\": -1, "
	                   "\"frac\": 1.5}";
	write_bytes(cfg, json, strlen(json));
	float W[4 * 64], b[4] = {-4, -5, -6, -7};
	for (int i = 0; i < 4 * 64; i++)
		W[i] = (float)(i % 17) / 16.0f;
	const struct weights_tensor t[2] = {
		{"layers.0.weight", 2, {4, 64}, W},
		{"layers.0.bias", 1, {4}, b},
	};
	char err[256];
	T_OK(weights_write(model, t, 2, err, sizeof(err)));

	struct weights *w = load_ok(dir);
	uint32_t v = 0;
	T_OK(weights_config_u32(w, "input_dim", &v));
	T_EQ(v, 64);
	T_OK(weights_config_u32(w, "output_dim", &v));
	T_EQ(v, 4);
	T_OK(weights_config_u32(w, "n_modules", &v));
	T_EQ(v, 5);
	T_ERR(weights_config_u32(w, "hidden_dim", &v), KVT_EINVAL);
	T_ERR(weights_config_u32(w, "absent", &v), KVT_EINVAL);
	T_ERR(weights_config_u32(w, "model_type", &v), KVT_EINVAL);
	T_ERR(weights_config_u32(w, "neg", &v), KVT_EINVAL);
	T_ERR(weights_config_u32(w, "frac", &v), KVT_EINVAL);
	const float *gw = weights_get(w, "layers.0.weight", 2,
	                              (uint64_t[]){4, 64}, err, sizeof(err));
	const float *gb = weights_get(w, "layers.0.bias", 1, (uint64_t[]){4},
	                              err, sizeof(err));
	T_ASSERT(gw && gb);
	T_ASSERT(!memcmp(gw, W, sizeof(W)) && !memcmp(gb, b, sizeof(b)));
	weights_free(w);

	/* Without config.json the directory still loads. */
	T_ASSERT(unlink(cfg) == 0);
	w = load_ok(dir);
	T_ERR(weights_config_u32(w, "input_dim", &v), KVT_EINVAL);
	weights_free(w);

	/* A config.json that is not an object is refused. */
	write_bytes(cfg, "[1]", 3);
	expect_refusal(dir, KVT_EINVAL, "config.json");
}

TEST(weights, f16_bf16_by_hand)
{
	/* One F16 [2,3] and one BF16 [2] tensor plus an F32 [1], bytes
	 * written out here; header left unpadded (readers must not need the
	 * alignment).  F16: 1, -2, 0.5, 65504, 2^-24 (smallest subnormal),
	 * -0.  BF16: 0x3e20 = 0.15625, 0xc040 = -3.  F32: 1.5. */
	const unsigned char data[] = {
		0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b, 0x01, 0x00,
		0x00, 0x80, /* f16 x6 */
		0x20, 0x3e, 0x40, 0xc0, /* bf16 x2 */
		0x00, 0x00, 0xc0, 0x3f, /* f32 1.5 */
	};
	const char *hdr =
		"{\"h\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
		"\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
		"\"f\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]},"
		"\"__metadata__\":{\"format\":\"pt\"}}";
	const char *p = tmp_path("half.safetensors");
	write_raw(p, hdr, 0, data, sizeof(data));
	struct weights *w = load_ok(p);
	char err[256];
	T_EQ(weights_count(w), 3);
	const float *h = weights_get(w, "h", 2, (uint64_t[]){2, 3}, err,
	                             sizeof(err));
	T_ASSERT(h);
	const float want_h[6] = {1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-24f, -0.0f};
	for (int i = 0; i < 6; i++)
		T_ASSERT(h[i] == want_h[i]);
	T_ASSERT(signbit(h[5]));
	const float *b = weights_get(w, "b", 1, (uint64_t[]){2}, err,
	                             sizeof(err));
	T_ASSERT(b && b[0] == 0.15625f && b[1] == -3.0f);
	const float *f = weights_get(w, "f", 1, (uint64_t[]){1}, err,
	                             sizeof(err));
	T_ASSERT(f && f[0] == 1.5f);
	weights_free(w);

	/* Inf and NaN in half precision are refused like F32 ones. */
	const unsigned char inf16[4] = {0x00, 0x3c, 0x00, 0x7c};
	write_raw(p, "{\"x.h\":{\"dtype\":\"F16\",\"shape\":[2],"
	             "\"data_offsets\":[0,4]}}", 0, inf16, 4);
	expect_refusal(p, KVT_EINVAL, "tensor x.h has Inf at index 1");
	const unsigned char nan16[4] = {0xc1, 0x7f, 0x80, 0x3f};
	write_raw(p, "{\"x.b\":{\"dtype\":\"BF16\",\"shape\":[2],"
	             "\"data_offsets\":[0,4]}}", 0, nan16, 4);
	expect_refusal(p, KVT_EINVAL, "tensor x.b has NaN at index 0");
}

TEST(weights, large_f16_chunks)
{
	/* More elements than one staging chunk, so the chunked conversion
	 * and its offsets are exercised: value i is (i % 2048) as f16. */
	enum { N = 150000 };
	uint16_t *d = malloc(N * 2);
	T_ASSERT(d);
	for (uint32_t i = 0; i < N; i++) {
		uint32_t v = i % 2048; /* exact in f16: integers <= 2048 */
		uint16_t code = 0;
		if (v) {
			int e = 0;
			while ((v >> e) > 1)
				e++;
			code = (uint16_t)(((e + 15) << 10) |
			                  ((v << (10 - e)) & 0x3ff));
		}
		d[i] = code;
	}
	char hdr[200];
	snprintf(hdr, sizeof(hdr),
	         "{\"big\":{\"dtype\":\"F16\",\"shape\":[%d],"
	         "\"data_offsets\":[0,%d]}}", N, 2 * N);
	const char *p = tmp_path("big.safetensors");
	write_raw(p, hdr, 0, d, N * 2);
	free(d);
	struct weights *w = load_ok(p);
	char err[256];
	const float *f = weights_get(w, "big", 1, (uint64_t[]){N}, err,
	                             sizeof(err));
	T_ASSERT(f);
	for (uint32_t i = 0; i < N; i++)
		if (f[i] != (float)(i % 2048))
			th_fail(__FILE__, __LINE__, "big[%u] = %g", i, f[i]);
	weights_free(w);
}

TEST(weights, refusals_file_level)
{
	const char *p = tmp_path("bad.safetensors");
	write_bytes(p, "abc", 3);
	expect_refusal(p, KVT_EINVAL, "shorter than the 8-byte header length");
	write_raw(p, "{}", 1000, NULL, 0);
	expect_refusal(p, KVT_EINVAL, "header length 1000 runs beyond");
	write_raw(p, "{}", 200000000, NULL, 0);
	expect_refusal(p, KVT_EINVAL, "100 MB");
	write_raw(p, "[1, 2]", 0, NULL, 0);
	expect_refusal(p, KVT_EINVAL, "header JSON is not an object");
	write_raw(p, "{\"a\": ", 0, NULL, 0);
	expect_refusal(p, KVT_EINVAL, "not valid JSON");
	write_raw(p, "{}  x", 0, NULL, 0);
	expect_refusal(p, KVT_EINVAL, "bytes after the JSON object (at byte 4");
	const unsigned char nul_pad[12] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
	write_bytes(p, nul_pad, sizeof(nul_pad));
	expect_refusal(p, KVT_EINVAL, "bytes after the JSON object (at byte 2");
	expect_refusal(tmp_path("does-not-exist"), KVT_ESYS, "does-not-exist");
	/* A directory without model.safetensors. */
	expect_refusal(th_tmpdir(), KVT_ESYS, "model.safetensors");
	/* An empty header object is a valid file with no tensors. */
	write_raw(p, "{}", 0, NULL, 0);
	struct weights *w = load_ok(p);
	T_EQ(weights_count(w), 0);
	weights_free(w);
}

TEST(weights, refusals_tensor_level)
{
	const char *p = tmp_path("bad.safetensors");
	float data[24];
	for (int i = 0; i < 24; i++)
		data[i] = (float)i;
	const struct {
		const char *hdr, *needle;
	} cases[] = {
		{"{\"t.w\":{\"shape\":[2],\"data_offsets\":[0,8]}}",
		 "tensor t.w has no dtype"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}",
		 "tensor t.w has no shape"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[2]}}",
		 "tensor t.w has no data_offsets"},
		{"{\"t.w\":7}", "tensor t.w: entry is not an object"},
		{"{\"t.w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
		 "tensor t.w has unsupported dtype F64"},
		{"{\"t.w\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		 "tensor t.w has unsupported dtype I32"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}",
		 "tensor t.w: data_offsets [0, 12] span 12 bytes, shape [2,2] of F32 needs 16"},
		{"{\"t.w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}",
		 "tensor t.w: data_offsets [0, 8] span 8 bytes"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
		 "tensor t.w: shape[0] is not a non-negative integer"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}",
		 "tensor t.w: shape[0]"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}}",
		 "tensor t.w: data_offsets is not [begin, end]"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}",
		 "tensor t.w: data_offsets [8, 0] end before begin"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[30],\"data_offsets\":[0,120]}}",
		 "tensor t.w: data_offsets [0, 120] beyond the 96-byte data section"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
		 "tensor t.w has 9 dimensions"},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		 "\"t.w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
		 "tensor t.w [8, 24) overlaps tensor a [0, 16)"},
		{"{\"t.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"t.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		 "tensor t.w appears twice"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		write_raw(p, cases[i].hdr, 0, data, sizeof(data));
		expect_refusal(p, KVT_EINVAL, cases[i].needle);
	}
}

TEST(weights, refusals_nan_inf)
{
	/* The exact reasons a policy will log. */
	float d[20];
	for (int i = 0; i < 20; i++)
		d[i] = 1.0f;
	d[17] = NAN;
	const char *hdr = "{\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[4,5],"
	                  "\"data_offsets\":[0,80]}}";
	const char *p = tmp_path("nan.safetensors");
	write_raw(p, hdr, 0, d, sizeof(d));
	struct weights *w = (struct weights *)1;
	char err[256];
	T_ERR(weights_load(p, &w, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(w == NULL);
	T_EQ_STR(err, "tensor layers.0.weight has NaN at index 17");
	d[17] = 1.0f;
	d[3] = -INFINITY;
	write_raw(p, hdr, 0, d, sizeof(d));
	T_ERR(weights_load(p, &w, err, sizeof(err)), KVT_EINVAL);
	T_EQ_STR(err, "tensor layers.0.weight has Inf at index 3");
	/* err may be NULL. */
	T_ERR(weights_load(p, &w, NULL, 0), KVT_EINVAL);
}

TEST(weights, writer_refusals)
{
	const char *p = tmp_path("w.safetensors");
	float ok[2] = {1, 2}, bad[3] = {0, NAN, 1};
	char err[256];
	struct weights_tensor t[2] = {{"a", 1, {2}, ok}, {"a", 1, {2}, ok}};
	T_ERR(weights_write(p, t, 2, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "tensor a appears twice"));
	t[1] = (struct weights_tensor){"b", 1, {3}, bad};
	T_ERR(weights_write(p, t, 2, err, sizeof(err)), KVT_EINVAL);
	T_EQ_STR(err, "tensor b has NaN at index 1");
	t[1] = (struct weights_tensor){"__metadata__", 1, {2}, ok};
	T_ERR(weights_write(p, t, 2, err, sizeof(err)), KVT_EINVAL);
	t[1] = (struct weights_tensor){"c", 5, {2}, ok};
	T_ERR(weights_write(p, t, 2, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "tensor c"));
	t[1] = (struct weights_tensor){"d", 1, {2}, NULL};
	T_ERR(weights_write(p, t, 2, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "tensor d has no data"));
	/* Nothing was left behind, not even the temporary. */
	struct stat st;
	T_ASSERT(stat(p, &st) != 0);
	/* Into a missing directory: a system error with the path. */
	T_ERR(weights_write(tmp_path("no/such/dir.safetensors"), t, 1, err,
	                    sizeof(err)), KVT_ESYS);
	T_ASSERT(strstr(err, "no/such/dir.safetensors"));
	/* Zero tensors is a valid (empty) file. */
	T_OK(weights_write(p, t, 0, err, sizeof(err)));
	struct weights *w = load_ok(p);
	T_EQ(weights_count(w), 0);
	weights_free(w);
}

TEST(weights, writer_f16_bf16_bytes_by_hand)
{
	/* 1 -> 0x3c00, -2 -> 0xc000, 65504 (f16's largest) -> 0x7bff,
	 * 1 + 2^-11 (half way between 1 and its f16 successor) rounds to
	 * even 0x3c00, 1 + 3 * 2^-11 rounds up to 0x3c02.  bf16 keeps the
	 * top half: 1 -> 0x3f80, -2 -> 0xc000, 65504 -> 0x4780 (2^16 after
	 * rounding 0x477fe000 up), 1 + 2^-8 (half way) -> 0x3f80, 1 + 3 *
	 * 2^-8 -> 0x3f82. */
	const char *p = tmp_path("h.safetensors");
	const float v[5] = {1.0f, -2.0f, 65504.0f, 1.0f + 0x1p-11f,
	                    1.0f + 3 * 0x1p-11f};
	const float u[5] = {1.0f, -2.0f, 65504.0f, 1.0f + 0x1p-8f,
	                    1.0f + 3 * 0x1p-8f};
	const uint16_t hf[5] = {0x3c00, 0xc000, 0x7bff, 0x3c00, 0x3c02};
	const uint16_t hb[5] = {0x3f80, 0xc000, 0x4780, 0x3f80, 0x3f82};
	char err[256];
	for (int k = 0; k < 2; k++) {
		const struct weights_tensor t[1] = {
			{"x", 1, {5}, k ? u : v}};
		enum kvt_dtype dt = k ? KVT_DTYPE_BF16 : KVT_DTYPE_F16;
		T_OK(weights_write_as(p, t, 1, dt, err, sizeof(err)));
		/* The data section is the file's last 10 bytes. */
		FILE *f = fopen(p, "rb");
		T_ASSERT(f);
		unsigned char b[4096];
		size_t n = fread(b, 1, sizeof(b), f);
		fclose(f);
		T_ASSERT(n > 10);
		uint16_t got[5];
		memcpy(got, b + n - 10, 10);
		T_ASSERT(!memcmp(got, k ? hb : hf, 10));
		T_ASSERT(strstr((const char *)b + 8,
		                k ? "\"dtype\":\"BF16\"" : "\"dtype\":\"F16\""));
		/* Read back as float32: the rounded values. */
		struct weights *w = load_ok(p);
		const float *r = weights_get(w, "x", 1, (uint64_t[]){5}, err,
		                             sizeof(err));
		T_ASSERT(r);
		T_ASSERT(r[0] == 1.0f && r[1] == -2.0f && r[3] == 1.0f);
		T_ASSERT(r[2] == (k ? 65536.0f : 65504.0f));
		T_ASSERT(r[4] == (k ? 1.0f + 0x1p-6f : 1.0f + 0x1p-9f));
		weights_free(w);
	}
	/* 65520 rounds to f16 Inf: refused, naming the stored type, and no
	 * file is left where there was none. */
	const char *q = tmp_path("inf.safetensors");
	const float big[2] = {1.0f, 65520.0f};
	const struct weights_tensor tb[1] = {{"y", 1, {2}, big}};
	T_ERR(weights_write_as(q, tb, 1, KVT_DTYPE_F16, err, sizeof(err)),
	      KVT_EINVAL);
	T_EQ_STR(err, "tensor y has Inf at index 1 once stored as F16");
	struct stat st;
	T_ASSERT(stat(q, &st) != 0);
	T_ERR(weights_write_as(q, tb, 1, (enum kvt_dtype)7, err, sizeof(err)),
	      KVT_EINVAL);
}
