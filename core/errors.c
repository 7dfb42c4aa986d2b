/* errors.c — the error list's strings (public kvt_ API) and the shared
 * reason formatter (errors.h). */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

#include "kvtrim.h"

int errors_fmt(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

char *errors_quote(char *out, size_t len, const char *s)
{
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		int plain = *p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\';
		size_t need = plain ? 1 : 4;
		if (o + need >= len)
			break;
		if (plain)
			out[o] = (char)*p;
		else
			snprintf(out + o, 5, "\\x%02x", *p);
		o += need;
	}
	out[o] = '\0';
	return out;
}

const char *kvt_strerror(int err)
{
	switch (err) {
	case KVT_OK:
		return "success";
#define KVT_ERR_STR_(name, num, text)                                          \
	case KVT_##name:                                                       \
		return text;
		KVT_ERRNO_MAP(KVT_ERR_STR_)
#undef KVT_ERR_STR_
	}
	return "unknown error";
}

const char *kvt_errname(int err)
{
	switch (err) {
	case KVT_OK:
		return "OK";
#define KVT_ERR_NAME_(name, num, text)                                         \
	case KVT_##name:                                                       \
		return #name;
		KVT_ERRNO_MAP(KVT_ERR_NAME_)
#undef KVT_ERR_NAME_
	}
	return "E?";
}
