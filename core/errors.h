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

/*
 * Renders a string that came from a peer for a reason text or a log line:
 * printable ASCII is kept, '"' and '\\' and every other byte (controls,
 * ESC, non-ASCII) become \xNN, so the result is one line of printable
 * ASCII whatever the input.  Truncated to fit out (len >= 1); returns out.
 */
char *errors_quote(char *out, size_t len, const char *s);

#endif
