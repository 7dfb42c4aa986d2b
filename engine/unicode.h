/*
 * unicode.h — what the byte-level BPE tokenizer needs of Unicode: UTF-8
 * decoding, checking and encoding, and the character classes of GPT-2's
 * pre-tokenizer regex (\p{L}, \p{N}, \s), from unicode_tables.h.
 */
#ifndef KVT_UNICODE_H
#define KVT_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* The code point at s[i..n) into *cp; its length in bytes, 0 when the
 * bytes there are not valid UTF-8 (overlong, surrogate, beyond U+10FFFF,
 * truncated). */
size_t unicode_utf8_at(const uint8_t *s, size_t n, size_t i, uint32_t *cp);

/* 0, or KVT_EINVAL naming the first invalid byte. */
int unicode_utf8_check(const char *text, size_t len, char *err,
                       size_t errlen);

/* Writes cp (below U+10000) as UTF-8 into out (room for 3 bytes); its
 * length. */
size_t unicode_utf8_put(uint32_t cp, char *out);

int unicode_is_letter(uint32_t cp); /* \p{L} */
int unicode_is_number(uint32_t cp); /* \p{N} */
int unicode_is_space(uint32_t cp);  /* \s: the White_Space property */
int unicode_is_other(uint32_t cp);  /* none of the three */

#endif
