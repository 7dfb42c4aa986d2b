/*
 * unicode.c — UTF-8 and the character classes of the tokenizer's
 * pre-tokenizer; see unicode.h.
 */
#include "unicode.h"

#include "errors.h"
#include "kvtrim.h"
#include "unicode_tables.h"

/* ---------------------------------------------------------------- utf-8 */

/* Decodes the code point at s[i..n); returns its length, 0 when invalid. */
size_t unicode_utf8_at(const uint8_t *s, size_t n, size_t i, uint32_t *cp)
{
	uint8_t c = s[i];
	size_t len;
	uint32_t v, min;
	if (c < 0x80) {
		*cp = c;
		return 1;
	} else if ((c & 0xe0) == 0xc0) {
		len = 2, v = c & 0x1f, min = 0x80;
	} else if ((c & 0xf0) == 0xe0) {
		len = 3, v = c & 0x0f, min = 0x800;
	} else if ((c & 0xf8) == 0xf0) {
		len = 4, v = c & 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if (n - i < len)
		return 0;
	for (size_t k = 1; k < len; k++) {
		if ((s[i + k] & 0xc0) != 0x80)
			return 0;
		v = v << 6 | (s[i + k] & 0x3f);
	}
	if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
		return 0;
	*cp = v;
	return len;
}

int unicode_utf8_check(const char *text, size_t len, char *err, size_t errlen)
{
	uint32_t cp;
	for (size_t i = 0; i < len;) {
		size_t k = unicode_utf8_at((const uint8_t *)text, len, i, &cp);
		if (!k)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "invalid UTF-8 at byte %zu (0x%02x)", i,
			                  (uint8_t)text[i]);
		i += k;
	}
	return 0;
}

size_t unicode_utf8_put(uint32_t cp, char *out)
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	out[0] = (char)(0xe0 | cp >> 12);
	out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
	out[2] = (char)(0x80 | (cp & 0x3f));
	return 3; /* byte characters are all below U+0800 */
}

/* ---------------------------------------------------------------- classes */

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (cp < r[mid][0])
			hi = mid;
		else if (cp > r[mid][1])
			lo = mid + 1;
		else
			return 1;
	}
	return 0;
}

int unicode_is_letter(uint32_t cp)
{
	if (cp < 0x80)
		return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
	return in_ranges(UNI_LETTER, sizeof(UNI_LETTER) / sizeof(UNI_LETTER[0]),
	                 cp);
}

int unicode_is_number(uint32_t cp)
{
	if (cp < 0x80)
		return cp >= '0' && cp <= '9';
	return in_ranges(UNI_NUMBER, sizeof(UNI_NUMBER) / sizeof(UNI_NUMBER[0]),
	                 cp);
}

/* \s: the Unicode White_Space property. */
int unicode_is_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 ||
	       cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
	       cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
	       cp == 0x3000;
}

int unicode_is_other(uint32_t cp)
{
	return !unicode_is_space(cp) && !unicode_is_letter(cp) && !unicode_is_number(cp);
}

