/*
 * fuzz_spwire.c — libFuzzer target for the SP wire kvtrimd parses on
 * ctl.ipc (daemon/spwire.h), driven the way ctl.c drives it: the input is
 * a byte stream from one peer, cut into reads at offsets taken from its
 * first byte; the hello, then frames while they are whole.  Checked: no
 * read outside the bytes received (ASan), a whole frame never claims more
 * than was received, SPW_MORE asks for more than is there, a backtrace
 * is whole 4-byte words inside its message ending at the first word with
 * its top bit, and every accepted head re-encodes to the bytes read.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spwire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MUST(c)                                                                \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "fuzz_spwire: %s:%d: %s\n", __FILE__,  \
			        __LINE__, #c);                                 \
			abort();                                               \
		}                                                              \
	} while (0)

#define MAX_MSG 4096u /* small, so the bound is hit */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!size)
		return 0;
	size_t step = (size_t)data[0] % 64 + 1;
	data++;
	size--;
	/* What "arrived" so far: a heap copy of exactly those bytes, so an
	 * overread is ASan's to see. */
	size_t got = 0, off = 0;
	int greeted = 0;
	while (got < size) {
		got = got + step < size ? got + step : size;
		uint8_t *b = malloc(got ? got : 1);
		MUST(b);
		memcpy(b, data, got);
		for (;;) {
			size_t n = got - off;
			if (!greeted) {
				int h = spw_hello(b + off, n, SPW_REQ0);
				if (h == SPW_MORE) {
					MUST(n < SPW_HELLO_LEN);
					break;
				}
				if (h == SPW_BAD) {
					free(b);
					return 0; /* the connection closes */
				}
				greeted = 1;
				off += SPW_HELLO_LEN;
				continue;
			}
			uint64_t need = 0, len = 0;
			const uint8_t *m = NULL;
			const char *why = NULL;
			int f = spw_frame(b + off, n, MAX_MSG, &need, &m, &len,
			                  &why);
			if (f == SPW_BAD) {
				MUST(why != NULL);
				free(b);
				return 0;
			}
			if (f == SPW_MORE) {
				MUST(need > n && need <= SPW_HEAD_LEN + MAX_MSG);
				break;
			}
			MUST(need == SPW_HEAD_LEN + len && need <= n);
			MUST(m == b + off + SPW_HEAD_LEN && len <= MAX_MSG);
			uint8_t h[SPW_HEAD_LEN];
			spw_head_put(h, len);
			MUST(!memcmp(h, b + off, SPW_HEAD_LEN));
			uint32_t bt = spw_backtrace(m, len);
			if (bt) {
				MUST(bt % 4 == 0 && bt <= len &&
				     bt <= 4 * SPW_BT_MAX);
				MUST(m[bt - 4] & 0x80);
				for (uint32_t w = 0; w + 4 < bt; w += 4)
					MUST(!(m[w] & 0x80));
			}
			off += need;
		}
		free(b);
	}
	return 0;
}
