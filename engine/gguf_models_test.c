/*
 * gguf_models_test.c — the model cache (engine/model_files.c,
 * scripts/models.sh) and the real SmolLM2 file: when `make models` has
 * fetched it, it is compared with tests/fixtures/smollm2/gguf.txt, which the
 * gguf Python package decoded (scripts/fixtures/smollm2_gguf.py).
 */
#include "gguf_fixture.h"
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
	/* The model card's figures. */
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
