/*
 * file.c — see file.h.
 */
#include "file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "kvtrim.h"

int file_read_all(const char *path, char **out, size_t *n, char *err,
                  size_t errlen)
{
	*out = NULL;
	*n = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return errors_fmt(err, errlen, KVT_ESYS, "%s: %s", path,
		                  strerror(errno));
	size_t cap = 64 << 10, len = 0, got;
	char *buf = malloc(cap + 1);
	while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
		len += got;
		if (len < cap)
			continue;
		char *nb = realloc(buf, 2 * cap + 1);
		if (!nb) {
			free(buf);
			buf = NULL;
		}
		buf = nb;
		cap *= 2;
	}
	int rerr = ferror(f) ? errno : 0;
	fclose(f);
	if (!buf)
		return errors_fmt(err, errlen, KVT_ENOMEM, "%s: out of memory",
		                  path);
	if (rerr) {
		free(buf);
		return errors_fmt(err, errlen, KVT_ESYS, "%s: %s", path,
		                  strerror(rerr));
	}
	buf[len] = 0;
	*out = buf;
	*n = len;
	return 0;
}
