/*
 * gguf_test.c — the GGUF reader (engine/gguf.c): metadata of every type,
 * tensor infos and alignment, dequantisation of every tensor type against
 * values worked out by hand (and gguf-py's), and the llama hyperparameters
 * of a tiny llama file.
 *
 * Small GGUF files are written by the test itself (gguf_fixture.h: every
 * metadata type, every tensor type, alignment 64).  Corrupt variants are
 * refused in gguf_refuse_test.c; the model cache and the real SmolLM2 file
 * are gguf_models_test.c's.
 * Run: build/bin/kvtrim-tests gguf
 */
#include "gguf_fixture.h"
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
