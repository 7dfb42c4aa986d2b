/*
 * gguf_refuse_test.c — corrupt GGUF files, each refused with its code and a
 * reason: every truncation point, bad magic, other versions, huge counts
 * and lengths, unknown types, nesting, duplicates, bad tensor infos and
 * data beyond the end.
 */
#include "gguf_fixture.h"
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
