/*
 * codec_scan.c — the raw msgpack walk of the codec (codec_decode.c, step
 * 1): it proves a buffer holds one well-formed object within the bounds
 * before msgpack-c allocates anything, and reads a request's op without
 * decoding it (codec_peek_op).  Never allocates, so it is safe on any bytes.
 */
#include "codec_int.h"

#include <string.h>

static uint64_t be_read(const uint8_t *p, size_t w)
{
	uint64_t v = 0;
	for (size_t i = 0; i < w; i++)
		v = v << 8 | p[i];
	return v;
}

/* See codec_int.h. */
int codec_scan_obj(const uint8_t *b, size_t len, size_t *pos, int depth,
                   uint64_t *left, const char **why)
{
	if (*pos >= len) {
		*why = "truncated message";
		return -1;
	}
	if (!*left) {
		*why = "more objects than any message holds";
		return SCAN_TOO_MANY;
	}
	--*left;
	uint8_t c = b[(*pos)++];
	uint64_t skip = 0, count = 0;
	size_t w = 0;      /* width of a big-endian length field */
	int container = 0; /* 1 array, 2 map */

	if (c <= 0x7f || c >= 0xe0)
		return 0; /* fixint */
	if (c <= 0x8f) {
		count = c & 0x0f;
		container = 2;
	} else if (c <= 0x9f) {
		count = c & 0x0f;
		container = 1;
	} else if (c <= 0xbf) {
		skip = c & 0x1f;
	} else {
		switch (c) {
		case 0xc0: case 0xc2: case 0xc3:
			return 0; /* nil, false, true */
		case 0xc1:
			*why = "reserved byte 0xc1";
			return -1;
		case 0xc4: case 0xd9: w = 1; break; /* bin8, str8 */
		case 0xc5: case 0xda: w = 2; break;
		case 0xc6: case 0xdb: w = 4; break;
		case 0xc7: w = 1; skip = 1; break; /* ext: + type byte */
		case 0xc8: w = 2; skip = 1; break;
		case 0xc9: w = 4; skip = 1; break;
		case 0xca: skip = 4; break; /* float32 */
		case 0xcb: skip = 8; break;
		case 0xcc: case 0xd0: skip = 1; break;
		case 0xcd: case 0xd1: skip = 2; break;
		case 0xce: case 0xd2: skip = 4; break;
		case 0xcf: case 0xd3: skip = 8; break;
		case 0xd4: skip = 2; break; /* fixext: type + data */
		case 0xd5: skip = 3; break;
		case 0xd6: skip = 5; break;
		case 0xd7: skip = 9; break;
		case 0xd8: skip = 17; break;
		case 0xdc: w = 2; container = 1; break;
		case 0xdd: w = 4; container = 1; break;
		case 0xde: w = 2; container = 2; break;
		case 0xdf: w = 4; container = 2; break;
		}
	}
	if (w) {
		if (w > len - *pos) {
			*why = "truncated message";
			return -1;
		}
		uint64_t n = be_read(b + *pos, w);
		*pos += w;
		if (container)
			count = n;
		else
			skip += n;
	}
	if (!container) {
		if (skip > len - *pos) {
			*why = "truncated message";
			return -1;
		}
		*pos += skip;
		return 0;
	}
	if (depth >= SCAN_DEPTH) {
		*why = "containers nested too deep";
		return -1;
	}
	if (container == 2)
		count *= 2;
	if (count > len - *pos) {
		*why = "truncated message (container count beyond its bytes)";
		return -1;
	}
	if (count > *left) {
		/* Refused at the header, before walking a single element. */
		*why = "more objects than any message holds";
		return SCAN_TOO_MANY;
	}
	for (uint64_t i = 0; i < count; i++) {
		int rc = codec_scan_obj(b, len, pos, depth + 1, left, why);
		if (rc)
			return rc;
	}
	return 0;
}

/* Reads a str header at b[*pos]; 1 (and *s, *n, *pos past it) when it is a
 * whole string, 0 when not a string, -1 when truncated. */
static int peek_str(const uint8_t *b, size_t len, size_t *pos,
                    const char **s, size_t *n)
{
	size_t p = *pos, w = 0;
	uint64_t sl;
	if (p >= len)
		return -1;
	uint8_t c = b[p++];
	if (c >= 0xa0 && c <= 0xbf)
		sl = c & 0x1f;
	else if (c == 0xd9 || c == 0xda || c == 0xdb) {
		w = c == 0xd9 ? 1 : c == 0xda ? 2 : 4;
		if (w > len - p)
			return -1;
		sl = be_read(b + p, w);
		p += w;
	} else {
		return 0;
	}
	if (sl > len - p)
		return -1;
	*s = (const char *)b + p;
	*n = (size_t)sl;
	*pos = p + (size_t)sl;
	return 1;
}

/*
 * Lenient: only needs a top-level map whose entries up to "op" are readable;
 * ignores the version, other keys, later damage and trailing bytes.  Never
 * allocates, so it is as safe on garbage as the scan.  Looks at no more
 * than TOP_KEYS_MAX entries and walks no more objects than a request may
 * hold (codec_req_objs_max): a message refused for its size costs no
 * second walk of it.
 */
enum ipc_op codec_peek_op(const uint8_t *buf, size_t len)
{
	const char *why, *s;
	size_t pos = 0, n;
	uint64_t count, left = codec_req_objs_max();

	if (!buf || !len)
		return IPC_OP_NONE;
	uint8_t c = buf[pos++];
	if (c >= 0x80 && c <= 0x8f) {
		count = c & 0x0f;
	} else if (c == 0xde || c == 0xdf) {
		size_t w = c == 0xde ? 2 : 4;
		if (w > len - pos)
			return IPC_OP_NONE;
		count = be_read(buf + pos, w);
		pos += w;
	} else {
		return IPC_OP_NONE;
	}
	for (uint64_t i = 0; i < count && i < TOP_KEYS_MAX; i++) {
		int k = peek_str(buf, len, &pos, &s, &n);
		if (k < 0)
			return IPC_OP_NONE;
		bool is_op = k == 1 && n == 2 && !memcmp(s, "op", 2);
		if (k == 0 && codec_scan_obj(buf, len, &pos, 1, &left, &why))
			return IPC_OP_NONE;
		if (is_op) {
			if (peek_str(buf, len, &pos, &s, &n) != 1)
				return IPC_OP_NONE;
			return codec_op_lookup(s, n);
		}
		if (codec_scan_obj(buf, len, &pos, 1, &left, &why))
			return IPC_OP_NONE;
	}
	return IPC_OP_NONE;
}
