/*
 * fuzz_weights.c — libFuzzer target for the safetensors loader
 * (policies/weights.h).
 *
 * Input layout: byte 0 picks the form.  Even: the rest is one .safetensors
 * file.  Odd: byte 1 is the length L of a config.json, the next L bytes
 * are that file and the rest is model.safetensors, loaded as a kvpress
 * checkpoint directory.  The files live in a scratch directory under
 * /dev/shm (or $TMPDIR) made once per process and removed at exit.
 *
 * A load that succeeds is walked completely: every name, weights_has on it,
 * weights_get with a wrong shape (the error path that prints shapes) and,
 * for the config, weights_config_u32 on the kvpress keys.  Every value the
 * loader hands out must be finite (weights.h promises it checked them); the
 * shapes are unknown here, so that is checked in the unit tests instead.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MUST(c)                                                                \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "fuzz_weights: %s:%d: %s\n",           \
			        __FILE__, __LINE__, #c);                       \
			abort();                                               \
		}                                                              \
	} while (0)

static char dir[256], file_path[300], cfg_path[300], model_path[300];

static void cleanup(void)
{
	unlink(file_path);
	unlink(cfg_path);
	unlink(model_path);
	rmdir(dir);
}

static void setup(void)
{
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : NULL;
	if (!base && !(base = getenv("TMPDIR")))
		base = "/tmp";
	snprintf(dir, sizeof(dir), "%s/kvtrim-fuzz-weights-XXXXXX", base);
	MUST(mkdtemp(dir));
	snprintf(file_path, sizeof(file_path), "%s/w.safetensors", dir);
	snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", dir);
	snprintf(model_path, sizeof(model_path), "%s/model.safetensors", dir);
	atexit(cleanup);
}

static void put(const char *path, const uint8_t *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	MUST(f);
	MUST(fwrite(p, 1, n, f) == n);
	MUST(fclose(f) == 0);
}

static void walk(const struct weights *w)
{
	char err[KVT_ERRTEXT_MAX];
	static const char *const keys[] = {"input_dim", "output_dim",
	                                   "hidden_dim", "n_modules"};
	size_t n = weights_count(w);
	MUST(weights_name_at(w, n) == NULL);
	for (size_t i = 0; i < n; i++) {
		const char *name = weights_name_at(w, i);
		MUST(name && weights_has(w, name));
		/* No tensor has 9 dimensions, so this always refuses. */
		uint64_t shape[WEIGHTS_MAX_DIMS + 1] = {0};
		MUST(!weights_get(w, name, WEIGHTS_MAX_DIMS + 1, shape, err,
		                  sizeof(err)));
		MUST(err[0]);
		shape[0] = UINT64_MAX;
		(void)weights_get(w, name, 1, shape, err, sizeof(err));
	}
	MUST(!weights_get(w, "no such tensor \x01", 0, NULL, err,
	                  sizeof(err)));
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		uint32_t v;
		(void)weights_config_u32(w, keys[i], &v);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[KVT_ERRTEXT_MAX];
	struct weights *w = NULL;
	const char *path;

	if (!dir[0])
		setup();
	if (size < 1)
		return 0;
	unlink(cfg_path);
	if (data[0] & 1) {
		size_t l = size > 1 ? data[1] : 0;
		const uint8_t *p = data + (size > 1 ? 2 : 1);
		size_t left = size - (size > 1 ? 2 : 1);
		if (l > left)
			l = left;
		/* L == 0 means no config.json at all. */
		if (l)
			put(cfg_path, p, l);
		put(model_path, p + l, left - l);
		path = dir;
	} else {
		put(file_path, data + 1, size - 1);
		path = file_path;
	}
	int rc = weights_load(path, &w, err, sizeof(err));
	if (rc) {
		MUST(rc < 0 && !w && err[0]);
		return 0;
	}
	MUST(w);
	walk(w);
	weights_free(w);
	return 0;
}
