/*
 * spwire_test.c — daemon/spwire.h, nng's SP wire as kvtrimd parses it,
 * against frames written out by hand from nng's format (its
 * src/sp/transport/ipc and src/sp/protocol/reqrep0).
 */
#include <string.h>

#include "spwire.h"
#include "test.h"

TEST(spwire, hello)
{
	static const uint8_t req0[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
	T_EQ(spw_hello(req0, 7, SPW_REQ0), SPW_MORE);
	T_EQ(spw_hello(req0, 8, SPW_REQ0), SPW_OK);
	T_EQ(spw_hello(req0, 8, SPW_REP0), SPW_BAD);
	for (int i = 0; i < 8; i++) {
		if (i == 4)
			continue; /* (0x30 -> 0x31 + 0x100: still not req0) */
		uint8_t b[8];
		memcpy(b, req0, 8);
		b[i] ^= 0x01;
		T_EQ(spw_hello(b, 8, SPW_REQ0), SPW_BAD);
	}
	uint8_t out[8];
	spw_hello_put(out, SPW_REP0);
	static const uint8_t rep0[8] = {0, 'S', 'P', 0, 0x00, 0x31, 0, 0};
	T_EQ(memcmp(out, rep0, 8), 0);
}

TEST(spwire, frames)
{
	/* type 1, length 6, then "\x80\0\0\x2a" (request id 42) "hi" */
	static const uint8_t f[15] = {1, 0, 0, 0, 0, 0, 0, 0, 6,
	                              0x80, 0, 0, 0x2a, 'h', 'i'};
	uint64_t need = 0, len = 0;
	const uint8_t *m = NULL;
	const char *why = NULL;
	T_EQ(spw_frame(f, 8, 100, &need, &m, &len, &why), SPW_MORE);
	T_EQ(need, 9);
	T_EQ(spw_frame(f, 14, 100, &need, &m, &len, &why), SPW_MORE);
	T_EQ(need, 15);
	T_EQ(spw_frame(f, 15, 100, &need, &m, &len, &why), SPW_OK);
	T_EQ(need, 15);
	T_EQ(len, 6);
	T_ASSERT(m == f + 9);
	T_EQ(spw_backtrace(m, len), 4);
	/* the length bound is inclusive */
	T_EQ(spw_frame(f, 15, 6, &need, &m, &len, &why), SPW_OK);
	T_EQ(spw_frame(f, 15, 5, &need, &m, &len, &why), SPW_BAD);
	T_ASSERT(why && strstr(why, "largest"));
	uint8_t g[15];
	memcpy(g, f, 15);
	g[0] = 2;
	T_EQ(spw_frame(g, 15, 100, &need, &m, &len, &why), SPW_BAD);
	T_ASSERT(strstr(why, "type"));
	/* 2^64 - 1: refused at the head, no wrap */
	memset(g + 1, 0xff, 8);
	g[0] = 1;
	T_EQ(spw_frame(g, 15, UINT64_MAX - 1, &need, &m, &len, &why), SPW_BAD);
	T_EQ(spw_frame(g, 15, UINT64_MAX, &need, &m, &len, &why), SPW_MORE);
	uint8_t h[9];
	spw_head_put(h, 0x0102030405060708ull);
	static const uint8_t hx[9] = {1, 1, 2, 3, 4, 5, 6, 7, 8};
	T_EQ(memcmp(h, hx, 9), 0);
}

TEST(spwire, backtraces)
{
	/* two hops: a pipe id word, then the request id */
	static const uint8_t two[12] = {0, 0, 0, 7, 0x80, 0, 0, 1, 'x', 'y',
	                                'z', 'w'};
	T_EQ(spw_backtrace(two, 12), 8);
	T_EQ(spw_backtrace(two, 8), 8);
	T_EQ(spw_backtrace(two, 7), 0); /* the id cut off */
	T_EQ(spw_backtrace(two, 0), 0);
	/* SPW_BT_MAX words without the top bit: refused; with it at the
	 * last allowed word: taken. */
	uint8_t many[4 * (SPW_BT_MAX + 1)];
	memset(many, 0, sizeof(many));
	many[4 * SPW_BT_MAX] = 0x80;
	T_EQ(spw_backtrace(many, sizeof(many)), 0);
	many[4 * (SPW_BT_MAX - 1)] = 0x80;
	T_EQ(spw_backtrace(many, sizeof(many)), 4 * SPW_BT_MAX);
}
