/*
 * codec_sync_test.c — the sync's optional wire fields: an item's
 * optional 7th field (the headroom the sequence keeps after the sync), the
 * reply's optional "press" and "budget", and the sync numbers ("n", and
 * seq_query's own "n", "after" and "last").  Exact bytes are written out
 * by hand from the msgpack spec.
 */
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "test.h"

/* Encodes a one-item sync request of tenant 1, token 2. */
static uint8_t *sync_req(const struct ipc_sync_item *it, size_t *len)
{
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_SYNC;
	q.tenant = 1;
	q.token = 2;
	q.u.sync.no = 1;
	q.u.sync.n = 1;
	q.u.sync.items = (struct ipc_sync_item *)it;
	uint8_t *buf = NULL;
	T_OK(codec_req_encode(&q, &buf, len));
	return buf;
}

/* The bytes of "items": [[...]] at the end of an encoded sync. */
static const uint8_t *items_of(const uint8_t *buf, size_t len, size_t *n)
{
	static const uint8_t key[] = {0xa5, 'i', 't', 'e', 'm', 's'};
	for (size_t i = 0; i + sizeof(key) <= len; i++)
		if (!memcmp(buf + i, key, sizeof(key))) {
			*n = len - i - sizeof(key);
			return buf + i + sizeof(key);
		}
	th_fail(__FILE__, __LINE__, "no items key");
}

TEST(codec_sync, item_headroom_is_an_optional_seventh_field)
{
	struct ipc_sync_item it = {.seq = 5, .counter = 1, .n_new = 3,
	                           .phase = KVT_PHASE_DECODE, .layer_lo = 0,
	                           .layer_hi = 2};
	size_t len, n;
	uint8_t *buf = sync_req(&it, &len);
	/* headroom 0: the six fields of protocol 1 as before */
	static const uint8_t six[] = {0x91, 0x96, 5, 1, 3, 1, 0, 2};
	const uint8_t *p = items_of(buf, len, &n);
	T_EQ(n, sizeof(six));
	T_ASSERT(!memcmp(p, six, n));
	struct ipc_req out;
	char why[KVT_ERRTEXT_MAX];
	T_OK(codec_req_decode(buf, len, &out, why, sizeof(why)));
	T_EQ(out.u.sync.items[0].headroom, 0);
	codec_req_free(&out);
	free(buf);

	/* headroom 300: a seventh field, uint16 0xcd 0x01 0x2c */
	it.headroom = 300;
	buf = sync_req(&it, &len);
	static const uint8_t seven[] = {0x91, 0x97, 5, 1, 3, 1, 0, 2,
	                                0xcd, 0x01, 0x2c};
	p = items_of(buf, len, &n);
	T_EQ(n, sizeof(seven));
	T_ASSERT(!memcmp(p, seven, n));
	T_OK(codec_req_decode(buf, len, &out, why, sizeof(why)));
	T_EQ(out.u.sync.items[0].headroom, 300);
	T_EQ(out.u.sync.items[0].layer_hi, 2);
	codec_req_free(&out);

	/* a negative headroom is refused, named (items is the last key, so
	 * its last 3 bytes are the headroom) */
	uint8_t *bad = malloc(len);
	T_ASSERT(bad);
	memcpy(bad, buf, len - 3);
	bad[len - 3] = 0xff; /* -1, negative fixint */
	T_ERR(codec_req_decode(bad, len - 2, &out, why, sizeof(why)),
	      KVT_EPROTO);
	T_ASSERT(strstr(why, "sync item 0: headroom is negative"));
	codec_req_free(&out);
	free(bad);
	free(buf);
}

TEST(codec_sync, reply_carries_pressure_and_budget)
{
	struct ipc_rep r, out;
	memset(&r, 0, sizeof(r));
	r.u.sync.press = 333333;
	r.u.sync.budget = 7;
	uint8_t *buf = NULL;
	size_t len = 0;
	T_OK(codec_rep_encode(IPC_OP_SYNC, &r, &buf, &len));
	/* {"v": 3, "e": 0, "press": 333333 (uint32 0x00051615),
	 *  "budget": 7} */
	static const uint8_t want[] = {
		0x84, 0xa1, 'v', 0x04, 0xa1, 'e', 0x00,
		0xa5, 'p', 'r', 'e', 's', 's', 0xce, 0x00, 0x05, 0x16, 0x15,
		0xa6, 'b', 'u', 'd', 'g', 'e', 't', 0x07,
	};
	T_EQ(len, sizeof(want));
	T_ASSERT(!memcmp(buf, want, len));
	char why[KVT_ERRTEXT_MAX];
	T_OK(codec_rep_decode(IPC_OP_SYNC, buf, len, &out, why, sizeof(why)));
	T_EQ(out.u.sync.press, 333333);
	T_EQ(out.u.sync.budget, 7);
	codec_rep_free(&out);
	free(buf);

	/* both absent (no pressure, no entry budget): the reply of before */
	memset(&r, 0, sizeof(r));
	T_OK(codec_rep_encode(IPC_OP_SYNC, &r, &buf, &len));
	static const uint8_t bare[] = {0x82, 0xa1, 'v', 0x04, 0xa1, 'e', 0x00};
	T_EQ(len, sizeof(bare));
	T_ASSERT(!memcmp(buf, bare, len));
	T_OK(codec_rep_decode(IPC_OP_SYNC, buf, len, &out, why, sizeof(why)));
	T_EQ(out.u.sync.press, 0);
	T_EQ(out.u.sync.budget, 0);
	codec_rep_free(&out);
	free(buf);

	/* a level above 1 is refused by both sides */
	r.u.sync.press = IPC_PRESS_ONE + 1;
	T_ERR(codec_rep_encode(IPC_OP_SYNC, &r, &buf, &len), KVT_EINVAL);
	uint8_t over[sizeof(want)];
	memcpy(over, want, sizeof(want));
	over[14] = 0x01; /* 0x01051615 = 17110549 > 1000000 */
	T_ERR(codec_rep_decode(IPC_OP_SYNC, over, sizeof(over), &out, why,
	                       sizeof(why)), KVT_EPROTO);
	T_ASSERT(strstr(why, "press is out of range"));
	codec_rep_free(&out);
}

/* A sync's number, and the query that names one and the reply that says
 * which was applied last: exact bytes both ways. */
TEST(codec_sync, numbers_of_syncs_and_queries)
{
	struct ipc_sync_item it = {.seq = 1, .n_new = 1};
	size_t len;
	uint8_t *buf = sync_req(&it, &len);
	/* ... "k": 2, "n": 1, "items": ... */
	static const uint8_t n1[] = {0xa1, 'k', 0x02, 0xa1, 'n', 0x01, 0xa5};
	T_ASSERT(len > sizeof(n1));
	T_ASSERT(memmem(buf, len, n1, sizeof(n1)) != NULL);
	free(buf);

	struct ipc_req q, qo;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_SEQ_QUERY;
	q.tenant = 1;
	q.token = 2;
	q.u.query.seq = 7;
	q.u.query.no = 301;
	q.u.query.after = 300;
	T_OK(codec_req_encode(&q, &buf, &len));
	static const uint8_t want[] = {
		0x87, 0xa1, 'v', 0x04,
		0xa2, 'o', 'p', 0xa9, 's', 'e', 'q', '_', 'q', 'u', 'e', 'r', 'y',
		0xa1, 't', 0x01, 0xa1, 'k', 0x02,
		0xa3, 's', 'e', 'q', 0x07,
		0xa1, 'n', 0xcd, 0x01, 0x2d, /* 301 */
		0xa5, 'a', 'f', 't', 'e', 'r', 0xcd, 0x01, 0x2c, /* 300 */
	};
	T_EQ(len, sizeof(want));
	T_ASSERT(!memcmp(buf, want, len));
	free(buf);
	char why[KVT_ERRTEXT_MAX];
	T_OK(codec_req_decode(want, sizeof(want), &qo, why, sizeof(why)));
	T_EQ_U64(qo.u.query.seq, 7);
	T_EQ_U64(qo.u.query.no, 301);
	T_EQ_U64(qo.u.query.after, 300);
	codec_req_free(&qo);
	/* "after" is required (0 says no sync is in doubt). */
	uint8_t bad[sizeof(want)];
	memcpy(bad, want, sizeof(want));
	bad[0] = 0x86;
	T_ERR(codec_req_decode(bad, sizeof(want) - 9, &qo, why, sizeof(why)),
	      KVT_EPROTO);
	T_ASSERT(strstr(why, "after"));
	codec_req_free(&qo);

	struct ipc_rep r, ro;
	memset(&r, 0, sizeof(r));
	r.u.query.syncs = 2;
	r.u.query.last = 9;
	T_OK(codec_rep_encode(IPC_OP_SEQ_QUERY, &r, &buf, &len));
	static const uint8_t rep[] = {
		0x88, 0xa1, 'v', 0x04, 0xa1, 'e', 0x00,
		0xa5, 's', 'y', 'n', 'c', 's', 0x02,
		0xa7, 's', 'e', 'e', 'n', '_', 'l', 'o', 0x00,
		0xa7, 's', 'e', 'e', 'n', '_', 'h', 'i', 0x00,
		0xa6, 'l', 'e', 'n', '_', 'l', 'o', 0x00,
		0xa6, 'l', 'e', 'n', '_', 'h', 'i', 0x00,
		0xa4, 'l', 'a', 's', 't', 0x09,
	};
	T_EQ(len, sizeof(rep));
	T_ASSERT(!memcmp(buf, rep, len));
	free(buf);
	T_OK(codec_rep_decode(IPC_OP_SEQ_QUERY, rep, sizeof(rep), &ro, why,
	                      sizeof(why)));
	T_EQ(ro.u.query.syncs, 2);
	T_EQ_U64(ro.u.query.last, 9);
	codec_rep_free(&ro);
}
