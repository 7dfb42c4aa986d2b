/*
 * codec_mutation_test.c — a fixed-seed mutation loop over encoded requests
 * and replies: a mutant either is refused or decodes to a message whose
 * re-encoding is stable.
 */
#include "codec_fixture.h"
static uint64_t xs_state = 0x9e3779b97f4a7c15ull;

static uint64_t xs(void)
{
	uint64_t x = xs_state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return xs_state = x;
}

/* Decoded successfully: re-encoding must succeed and be stable. */
static void check_req_stable(const struct ipc_req *q)
{
	uint8_t *a, *b;
	size_t al, bl;
	struct ipc_req q2;
	T_OK(codec_req_encode(q, &a, &al));
	T_OK(codec_req_decode(a, al, &q2, NULL, 0));
	T_OK(codec_req_encode(&q2, &b, &bl));
	T_ASSERT(al == bl && !memcmp(a, b, al));
	codec_req_free(&q2);
	free(a);
	free(b);
}

static void check_rep_stable(enum ipc_op op, const struct ipc_rep *r)
{
	uint8_t *a, *b;
	size_t al, bl;
	struct ipc_rep r2;
	T_OK(codec_rep_encode(op, r, &a, &al));
	T_OK(codec_rep_decode(op, a, al, &r2, NULL, 0));
	T_OK(codec_rep_encode(op, &r2, &b, &bl));
	T_ASSERT(al == bl && !memcmp(a, b, al));
	codec_rep_free(&r2);
	free(a);
	free(b);
}

TEST_T(codec, mutation_loop, 120)
{
	/* Seeds: valid encodings of varied shape. */
	uint8_t *seed[8];
	size_t seedlen[8];
	int ns = 0;
	struct ipc_req q = hello_req();
	T_OK(codec_req_encode(&q, &seed[ns], &seedlen[ns]));
	ns++;
	struct ipc_sync_item it[3] = {{1, 2, 3, 0, 0, 4, 0},
	                              {5, 6, 7, 1, 2, 3, 0},
	                              {UINT64_MAX, 0, 1, 1, 0, 0, 0}};
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_SYNC;
	q.tenant = 1;
	q.token = 99999;
	q.u.sync.n = 3;
	q.u.sync.items = it;
	T_OK(codec_req_encode(&q, &seed[ns], &seedlen[ns]));
	ns++;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_STATS;
	snprintf(q.u.filter, sizeof(q.u.filter), "tenant-a");
	T_OK(codec_req_encode(&q, &seed[ns], &seedlen[ns]));
	ns++;
	struct ipc_row rows[2];
	memset(rows, 0, sizeof(rows));
	codec_row_u64(&rows[0], "pages", 12);
	codec_row_i64(&rows[0], "d", -5);
	codec_row_f64(&rows[0], "r", 0.5);
	codec_row_str(&rows[1], "name", "abc");
	struct ipc_rep r;
	memset(&r, 0, sizeof(r));
	r.table.n = 2;
	r.table.rows = rows;
	T_OK(codec_rep_encode(IPC_OP_STATS, &r, &seed[ns], &seedlen[ns]));
	ns++;
	memset(&r, 0, sizeof(r));
	r.u.hello.tenant = 3;
	r.u.hello.token = 4;
	T_OK(codec_rep_encode(IPC_OP_HELLO, &r, &seed[ns], &seedlen[ns]));
	ns++;
	codec_rep_error(&r, KVT_EPOLICY, "bad policy spec: unknown name");
	T_OK(codec_rep_encode(IPC_OP_HELLO, &r, &seed[ns], &seedlen[ns]));
	ns++;

	static const uint8_t hot[] = {0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f,
	                              0xa0, 0xbf, 0xc0, 0xc1, 0xc4, 0xca,
	                              0xcb, 0xcf, 0xd3, 0xd9, 0xdc, 0xdd,
	                              0xde, 0xdf, 0xe0, 0xff};
	int ok = 0, refused = 0;
	for (int iter = 0; iter < 20000; iter++) {
		int s = (int)(xs() % (uint64_t)ns);
		size_t len = seedlen[s];
		uint8_t *p = malloc(len + 8);
		memcpy(p, seed[s], len);
		int nmut = 1 + (int)(xs() % 4);
		for (int k = 0; k < nmut; k++) {
			size_t at = len ? (size_t)(xs() % len) : 0;
			switch (xs() % 6) {
			case 0: /* flip bits */
				if (len)
					p[at] ^= (uint8_t)(1 + xs() % 255);
				break;
			case 1: /* interesting byte */
				if (len)
					p[at] = hot[xs() % sizeof(hot)];
				break;
			case 2: /* truncate */
				len = len ? (size_t)(xs() % len) : 0;
				break;
			case 3: /* insert a byte */
				if (len < seedlen[s] + 8) {
					memmove(p + at + 1, p + at, len - at);
					p[at] = (uint8_t)xs();
					len++;
				}
				break;
			case 4: /* delete a byte */
				if (len) {
					memmove(p + at, p + at + 1, len - at - 1);
					len--;
				}
				break;
			case 5: /* small integer tweak */
				if (len)
					p[at] = (uint8_t)(p[at] + (xs() % 2 ? 1 : -1));
				break;
			}
		}
		/* Exact-size copy: ASan/valgrind catch any over-read. */
		uint8_t *b = malloc(len ? len : 1);
		memcpy(b, p, len);
		free(p);

		char err[256];
		struct ipc_req rq;
		err[0] = 0;
		int rc = codec_req_decode(b, len, &rq, err, sizeof(err));
		if (rc == 0) {
			ok++;
			T_EQ_STR(err, "");
			check_req_stable(&rq);
		} else {
			refused++;
			if (rc >= 0 || !err[0])
				th_fail(__FILE__, __LINE__, "iter %d: rc %d err "
				        "\"%s\"", iter, rc, err);
		}
		codec_req_free(&rq);

		enum ipc_op op = (enum ipc_op)(1 + xs() % (IPC_OP_COUNT - 1));
		if (s >= 3)
			op = s == 3 ? IPC_OP_STATS : IPC_OP_HELLO;
		struct ipc_rep rp;
		err[0] = 0;
		rc = codec_rep_decode(op, b, len, &rp, err, sizeof(err));
		if (rc == 0) {
			check_rep_stable(op, &rp);
		} else if (rc >= 0 || !err[0]) {
			th_fail(__FILE__, __LINE__, "iter %d: rep rc %d err "
			        "\"%s\"", iter, rc, err);
		}
		codec_rep_free(&rp);

		enum ipc_op pk = codec_peek_op(b, len);
		T_ASSERT((int)pk >= IPC_OP_NONE && (int)pk < IPC_OP_COUNT);
		free(b);
	}
	/* The loop exercised both outcomes. */
	T_ASSERT(ok > 0 && refused > 0);
	for (int i = 0; i < ns; i++)
		free(seed[i]);
}
