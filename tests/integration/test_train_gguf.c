/*
 * test_train_gguf.c — kvtrim-train on a tiny llama GGUF model with the
 * byte tokenizer of tests/harness/gb.h (no BOS, as SmolLM2), on texts
 * written here: the output is byte-identical for the same seed whatever
 * --jobs, differs for another seed, has the documented files and fit
 * table, and every scorer it wrote loads in a real kvtrimd (kvtrim-engine
 * score through the daemon with kvzap, fastkvzip and kvpop) and evicts.
 * Run: build/bin/kvtrim-tests train_gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "gb.h"
#include "model.h"
#include "test.h"

static const char *tmp(const char *name)
{
	static char buf[8][600];
	static int k;
	k = (k + 1) % 8;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", th_tmpdir(), name);
	return buf[k];
}

/* bytes of words from a fixed list, lines of about 60 characters */
static void write_text(const char *path, size_t bytes, uint64_t seed)
{
	static const char *const w[] = {
		"the", "daemon", "keeps", "pages", "of", "keys", "and",
		"values", "for", "every", "layer", "while", "a", "policy",
		"evicts", "entries", "nobody", "reads", "again", "cache"};
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	size_t n = 0, col = 0;
	while (n < bytes) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		const char *s = w[(seed >> 33) % 20];
		int k = fprintf(f, "%s%s", col ? " " : "", s);
		n += (size_t)k;
		col += (size_t)k;
		if (col > 60) {
			fputc('\n', f);
			n++;
			col = 0;
		}
	}
	T_ASSERT(fclose(f) == 0);
}

static const char *tiny_model(void)
{
	char err[512];
	struct model m;
	struct model_config c = {
		.dim = 32, .hidden_dim = 64, .n_layers = 2, .n_heads = 4,
		.n_kv_heads = 2, .vocab_size = GB_TOK_VOCAB, .seq_len = 512,
		.shared_classifier = 1,
	};
	T_OK(model_alloc(&m, &c, err, sizeof(err)));
	gb_llama_fill(&m, 5);
	struct gb b = {0};
	gb_llama(&b, &m, &(struct gb_llama_opts){.tokenizer = 1});
	const char *path = tmp("tiny.gguf");
	gb_write(&b, path);
	gb_free(&b);
	model_free(&m);
	return path;
}

/* 1 when the two files hold the same bytes */
static int same(const char *a, const char *b)
{
	static char x[1 << 20], y[1 << 20];
	FILE *f = fopen(a, "rb"), *g = fopen(b, "rb");
	T_ASSERT(f && g);
	size_t n = fread(x, 1, sizeof(x), f), k = fread(y, 1, sizeof(y), g);
	fclose(f);
	fclose(g);
	T_ASSERT(n > 0 && n < sizeof(x));
	return n == k && !memcmp(x, y, n);
}

static void train(const char *mdl, const char *out, int seed, int jobs,
                  char *log, size_t loglen)
{
	int rc = th_sh(NULL, log, loglen,
	               "KVTRIM_TRAIN_TEXT=%s KVTRIM_VALID_TEXT=%s %s --model %s "
	               "--out %s --seed %d --jobs %d --window 160 --windows 6 "
	               "--heldout 3 --rows 48", tmp("train.txt"),
	               tmp("valid.txt"), th_bin("kvtrim-train"), mdl, out, seed,
	               jobs);
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrim-train: %d\n%s", rc, log);
}

TEST_T(train_gguf, deterministic_and_loadable, 180)
{
	if (access(th_bin("kvtrim-train"), X_OK) ||
	    access(th_bin("kvtrim-engine"), X_OK))
		T_SKIP("kvtrim-train / kvtrim-engine not built");
	char mdl[600];
	snprintf(mdl, sizeof(mdl), "%s", tiny_model());
	write_text(tmp("train.txt"), 6000, 1);
	write_text(tmp("valid.txt"), 3000, 2);
	static char log[32768];
	char a[600], b[600], c[600];
	snprintf(a, sizeof(a), "%s", tmp("a"));
	snprintf(b, sizeof(b), "%s", tmp("b"));
	snprintf(c, sizeof(c), "%s", tmp("c"));
	train(mdl, a, 3, 1, log, sizeof(log));
	/* what the run says: windows from the texts, the geometry, the
	 * progress line on stderr, a fit row per layer (KVpop's entries:
	 * min(W - D, T) = min(160 - 16, 160) = 144) */
	T_ASSERT(strstr(log, "data: 6 training windows of 160 tokens "
	                     "(960 tokens"));
	T_ASSERT(strstr(log, "3 held out"));
	T_ASSERT(strstr(log, "KVzip ctx 160 tokens + a separator of 51, 160 "
	                     "entries; KVpop delay 16, 144 entries"));
	T_ASSERT(strstr(log, "kvtrim-train: oracles 9/9 windows (1440 "
	                     "tokens), elapsed"));
	T_ASSERT(strstr(log, "kvtrim-train: fits: layer 2/2"));
	T_ASSERT(strstr(log, "summary over 2 layers"));
	train(mdl, b, 3, 2, log, sizeof(log));
	train(mdl, c, 4, 1, log, sizeof(log));

	static const char *const files[] = {
		"kvzap-linear/model.safetensors", "kvzap-mlp/model.safetensors",
		"fastkvzip.safetensors", "kvpop.safetensors", "fit.csv",
		"kvzap-mlp/config.json"};
	char pa[700], pb[700], pc[700];
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(pa, sizeof(pa), "%s/%s", a, files[i]);
		snprintf(pb, sizeof(pb), "%s/%s", b, files[i]);
		if (!same(pa, pb))
			th_fail(__FILE__, __LINE__, "%s differs between --jobs "
			        "1 and 2", files[i]);
	}
	snprintf(pa, sizeof(pa), "%s/kvzap-mlp/model.safetensors", a);
	snprintf(pc, sizeof(pc), "%s/kvzap-mlp/model.safetensors", c);
	T_ASSERT(!same(pa, pc)); /* the seed matters */

	/* fit.csv: a header and one row per layer, every value a number */
	snprintf(pa, sizeof(pa), "%s/fit.csv", a);
	FILE *f = fopen(pa, "r");
	T_ASSERT(f);
	char line[1024];
	T_ASSERT(fgets(line, sizeof(line), f));
	T_ASSERT(!strncmp(line, "layer,kvzap_linear_r2,", 22));
	int rows = 0;
	while (fgets(line, sizeof(line), f)) {
		T_ASSERT(!strstr(line, "nan"));
		rows++;
	}
	fclose(f);
	T_EQ(rows, 2);
	snprintf(pa, sizeof(pa), "%s/kvzap-mlp/config.json", a);
	f = fopen(pa, "r");
	T_ASSERT(f && fgets(line, sizeof(line), f));
	fclose(f);
	T_EQ_STR(line, "{\"input_dim\": 32, \"output_dim\": 2, \"hidden_dim\": "
	               "4, \"n_modules\": 2}\n");

	/* each scorer in a real kvtrimd for this model's tenant */
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	char pol[4][800];
	snprintf(pol[0], sizeof(pol[0]), "kvzap:model=%s/kvzap-linear,"
	         "threshold=100,window=8", a);
	snprintf(pol[1], sizeof(pol[1]), "kvzap:model=%s/kvzap-mlp,"
	         "threshold=100,window=8", a);
	snprintf(pol[2], sizeof(pol[2]), "fastkvzip:model=%s/"
	         "fastkvzip.safetensors,ratio=0.5,window=8", a);
	snprintf(pol[3], sizeof(pol[3]), "kvpop:model=%s/kvpop.safetensors,"
	         "tokens=64,delay=16", a);
	for (int i = 0; i < 4; i++) {
		int rc = th_sh(&d, log, sizeof(log), "%s --model %s "
		               "--runtime-dir %s --chunk 16 --policy %s score "
		               "--input %s --max-bytes 300", th_bin("kvtrim-engine"),
		               mdl, d.dir, pol[i], tmp("valid.txt"));
		if (rc || !strstr(log, "evicted ") || strstr(log, "evicted 0"))
			th_fail(__FILE__, __LINE__, "%s: %d\n%s", pol[i], rc, log);
	}
	T_EQ(th_daemon_stop(&d), 0);
}
