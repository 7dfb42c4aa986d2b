/*
 * errors.h — internal helper beside the public error list (kvtrim.h):
 * fills a caller's reason buffer and returns the code, so every module
 * reports "code + one-line reason" the same way.
 */
#ifndef KVT_ERRORS_H
#define KVT_ERRORS_H

#include <stddef.h>

/* Writes the formatted reason into err (when err and errlen are non-zero)
 * and returns code. */
int errors_fmt(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
