/*
 * test_eval_dump.c — `kvtrim-eval --model smollm2 --dump-kept DIR --quick
 * --seqs 1` (tools/eval/context/dump_kept.c, the kvpress parity's input) through a
 * real kvtrimd: the files docs/eval.md lists, their sizes from the geometry
 * in index.json, and kept flags checked against the policies' definitions
 * (docs/policies.md) by hand: streaming keeps the 4 sinks and the last
 * B - 4 positions, knorm keeps B per list, kvzip its 4 sinks.  Skips
 * without the model (`make models`).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon.h"
#include "model_files.h"
#include "test.h"

/* The unsigned after "key": in the json text s. */
static unsigned json_u(const char *s, const char *key)
{
	char k[64];
	snprintf(k, sizeof(k), "\"%s\": ", key);
	const char *p = strstr(s, k);
	if (!p)
		th_fail(__FILE__, __LINE__, "index.json: no %s", key);
	return (unsigned)strtoul(p + strlen(k), NULL, 10);
}

static uint8_t *slurp(const char *dir, const char *name, size_t want)
{
	char p[1024];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	struct stat st;
	if (stat(p, &st))
		th_fail(__FILE__, __LINE__, "%s missing", p);
	T_EQ(st.st_size, want);
	uint8_t *b = malloc(want + 1);
	FILE *f = fopen(p, "rb");
	T_ASSERT(b && f && fread(b, 1, want, f) == want);
	fclose(f);
	b[want] = 0;
	return b;
}

TEST_T(eval_dump, quick_smollm2_kept_positions, 300)
{
	/* SmolLM2, kvtrim-eval and the held-out text (shared data, not in the
	 * repository: a fresh clone skips). */
	th_need_smollm2_eval();
	struct th_daemon d;
	th_daemon_start(&d, "512M", NULL);
	static char out[32768];
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/dump", th_tmpdir());
	int rc = th_sh(&d, out, sizeof(out), "%s --model smollm2 --dump-kept "
	               "%s --runtime-dir %s --quick --seqs 1",
	               th_bin("kvtrim-eval"), dir, d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrim-eval: %d\n%s", rc, out);
	T_ASSERT(th_daemon_alive(&d));
	char p[700];
	snprintf(p, sizeof(p), "%s/index.json", dir);
	struct stat st;
	T_ASSERT(!stat(p, &st));
	char *ix = (char *)slurp(dir, "index.json", (size_t)st.st_size);
	const unsigned P = json_u(ix, "P"), T = json_u(ix, "T"),
	               L = json_u(ix, "layers"), G = json_u(ix, "kv_heads");
	T_EQ(P, 256);
	T_EQ(T, 288);
	T_EQ(json_u(ix, "windows"), 1);
	T_ASSERT(strstr(ix, "\"policy\": \"streaming\", \"ratio\": 0.7500"));
	free(slurp(dir, "tokens.i32", 4u * T));
	free(slurp(dir, "ref_top1.i32", 4u * (T - 1 - P)));
	const unsigned B = P - 192; /* P - floor(0.75 P) */
	uint8_t *k = slurp(dir, "keep-streaming-0.750.u8", (size_t)L * G * P);
	for (unsigned li = 0; li < L * G; li++)
		for (unsigned i = 0; i < P; i++)
			if (k[(size_t)li * P + i] != (i < 4 || i >= P - (B - 4)))
				th_fail(__FILE__, __LINE__, "streaming list %u "
				        "position %u: %u", li, i,
				        k[(size_t)li * P + i]);
	free(k);
	k = slurp(dir, "keep-knorm-0.750.u8", (size_t)L * G * P);
	for (unsigned li = 0; li < L * G; li++) {
		unsigned n = 0;
		for (unsigned i = 0; i < P; i++)
			n += k[(size_t)li * P + i];
		T_EQ(n, B);
	}
	free(k);
	k = slurp(dir, "keep-kvzip-0.750.u8", (size_t)L * G * P);
	for (unsigned li = 0; li < L * G; li++)
		for (unsigned i = 0; i < 4; i++)
			T_EQ(k[(size_t)li * P + i], 1);
	free(k);
	free(ix);
	T_EQ(th_daemon_stop(&d), 0);
}
