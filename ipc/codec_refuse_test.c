/*
 * codec_refuse_test.c — refusals of whole codec messages with their exact
 * codes: garbage, truncations, oversized and non-map messages, versions,
 * ops, sync items and missing credentials.
 */
#include "codec_fixture.h"
TEST(codec, refuse_garbage_and_empty)
{
	struct ipc_req q;
	char err[256];
	static const uint8_t junk[] = {0xc1, 0x00, 0xff, 0x13, 0x37};
	T_ERR(codec_req_decode(junk, sizeof(junk), &q, err, sizeof(err)),
	      KVT_EPROTO);
	T_ASSERT(err[0]);
	T_ERR(codec_req_decode((const uint8_t *)"hello world", 11, &q, err,
	                       sizeof(err)), KVT_EPROTO);
	T_ASSERT(err[0]);
	T_ERR(codec_req_decode((const uint8_t *)"", 0, &q, err, sizeof(err)),
	      KVT_EPROTO);
	T_ASSERT(strstr(err, "empty"));
	T_ERR(codec_req_decode(NULL, 0, &q, err, sizeof(err)), KVT_EPROTO);
	/* A header promising 4 G entries must not make anyone allocate. */
	T_ERR(codec_req_decode((const uint8_t *)"\xdf\xff\xff\xff\xff", 5, &q,
	                       err, sizeof(err)), KVT_EPROTO);
	T_ASSERT(strstr(err, "truncated"));
	T_ERR(codec_req_decode((const uint8_t *)"\xdd\xff\xff\xff\xff", 5, &q,
	                       err, sizeof(err)), KVT_EPROTO);
	/* Deep nesting. */
	uint8_t deep[64];
	memset(deep, 0x91, sizeof(deep));
	deep[63] = 0x01;
	T_ERR(codec_req_decode(deep, sizeof(deep), &q, err, sizeof(err)),
	      KVT_EPROTO);
	T_ASSERT(strstr(err, "nested"));
}

TEST(codec, refuse_every_truncation)
{
	struct ipc_req q = hello_req(), out;
	uint8_t *buf;
	size_t len;
	char err[256];
	T_OK(codec_req_encode(&q, &buf, &len));
	for (size_t n = 0; n < len; n++) {
		/* An exact-size copy so ASan sees any over-read. */
		uint8_t *p = malloc(n ? n : 1);
		memcpy(p, buf, n);
		err[0] = 0;
		int rc = codec_req_decode(p, n, &out, err, sizeof(err));
		if (rc != KVT_EPROTO || !err[0])
			th_fail(__FILE__, __LINE__, "prefix %zu: %s (%s)", n,
			        kvt_errname(rc), err);
		codec_req_free(&out);
		free(p);
	}
	T_OK(codec_req_decode(buf, len, &out, err, sizeof(err)));
	free(buf);
}

TEST(codec, refuse_oversized)
{
	size_t n = IPC_MAX_MSG + 1;
	uint8_t *p = calloc(1, n);
	struct ipc_req q;
	struct ipc_rep r;
	char err[256];
	T_ASSERT(p);
	p[0] = 0x80;
	T_ERR(codec_req_decode(p, n, &q, err, sizeof(err)), KVT_ETOOBIG);
	T_ASSERT(err[0]);
	T_ERR(codec_rep_decode(IPC_OP_STATS, p, n, &r, err, sizeof(err)),
	      KVT_ETOOBIG);
	free(p);

	/* The encoder refuses to build what the decoder would refuse. */
	uint32_t nrows = 1100; /* 1100 x 4 x 255 bytes > 1 MiB */
	struct ipc_row *rows = calloc(nrows, sizeof(*rows));
	T_ASSERT(rows);
	for (uint32_t i = 0; i < nrows; i++)
		for (int c = 0; c < 4; c++) {
			char key[8];
			snprintf(key, sizeof(key), "s%d", c);
			char val[IPC_STR_MAX];
			memset(val, 'v', sizeof(val) - 1);
			val[sizeof(val) - 1] = 0;
			codec_row_str(&rows[i], key, val);
		}
	memset(&r, 0, sizeof(r));
	r.table.n = nrows;
	r.table.rows = rows;
	uint8_t *buf = NULL;
	size_t len = 0;
	T_ERR(codec_rep_encode(IPC_OP_TENANTS, &r, &buf, &len), KVT_ETOOBIG);
	T_ASSERT(buf == NULL);
	free(rows);
}

TEST(codec, refuse_non_map)
{
	struct mp m;
	mp_init(&m);
	mp_arr(&m, 2);
	mp_u(&m, 1);
	mp_s(&m, "hello");
	refuse_req(&m, KVT_EPROTO, "not a map");
	mp_init(&m);
	mp_s(&m, "v");
	refuse_req(&m, KVT_EPROTO, "not a map");
	mp_init(&m);
	mp_arr(&m, 0);
	refuse_rep(IPC_OP_BYE, &m, KVT_EPROTO, "not a map");
}

TEST(codec, refuse_version)
{
	struct mp m;
	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", 1); /* the old protocol (sequence ids without tenant) */
	mp_ks(&m, "op", "bye");
	refuse_req(&m, KVT_EVERSION, "version 1");
	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", 2); /* syncs without numbers */
	mp_ks(&m, "op", "bye");
	refuse_req(&m, KVT_EVERSION, "protocol version 2, this side speaks 4");

	/* Version is judged before anything else: unknown keys, unknown op,
	 * even trailing bytes of a future format. */
	mp_init(&m);
	mp_map(&m, 3);
	mp_ks(&m, "op", "teleport");
	mp_ku(&m, "whatever", 1);
	mp_ku(&m, "v", 0);
	msgpack_pack_nil(&m.pk);
	refuse_req(&m, KVT_EVERSION, NULL);

	mp_init(&m);
	mp_map(&m, 2);
	mp_ks(&m, "op", "bye");
	mp_ks(&m, "x", "y");
	refuse_req(&m, KVT_EPROTO, "version");

	mp_init(&m);
	mp_map(&m, 2);
	mp_ks(&m, "v", "1");
	mp_ks(&m, "op", "stats");
	refuse_req(&m, KVT_EPROTO, "not an unsigned integer");

	mp_init(&m);
	mp_map(&m, 2);
	mp_s(&m, "v");
	mp_i(&m, -1);
	mp_ks(&m, "op", "stats");
	refuse_req(&m, KVT_EPROTO, NULL);

	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", 7);
	mp_ku(&m, "e", 0);
	refuse_rep(IPC_OP_BYE, &m, KVT_EVERSION, NULL);
}

TEST(codec, refuse_op)
{
	struct mp m;
	mp_req(&m, 2, "teleport");
	refuse_req(&m, KVT_EUNKNOWNOP, "teleport");
	mp_req(&m, 2, "");
	refuse_req(&m, KVT_EUNKNOWNOP, NULL);
	mp_req(&m, 2, "hello\n"); /* reason stays one line */
	refuse_req(&m, KVT_EUNKNOWNOP, "hello?");

	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "op", 1);
	refuse_req(&m, KVT_EPROTO, "op");

	mp_init(&m);
	mp_map(&m, 1);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	refuse_req(&m, KVT_EPROTO, "\"op\"");
}

/* A sync request whose single item is written by item(). */
static void sync_with(struct mp *m, void (*item)(struct mp *))
{
	mp_req(m, 6, "sync");
	mp_ku(m, "t", 1);
	mp_ku(m, "k", 2);
	mp_ku(m, "n", 1);
	mp_s(m, "items");
	mp_arr(m, 1);
	item(m);
}

static void it_neg(struct mp *m)
{
	mp_arr(m, 6);
	mp_u(m, 1);
	mp_u(m, 0);
	mp_i(m, -1);
	mp_u(m, 1);
	mp_u(m, 0);
	mp_u(m, 0);
}
static void it_big(struct mp *m) { mp_item(m, 1, 0, (uint64_t)UINT32_MAX + 1, 1, 0, 0); }
static void it_phase2(struct mp *m) { mp_item(m, 1, 0, 1, 2, 0, 0); }
static void it_short(struct mp *m)
{
	mp_arr(m, 5);
	for (int i = 0; i < 5; i++)
		mp_u(m, 1);
}
static void it_long(struct mp *m)
{
	mp_arr(m, 8); /* 6 fields, or 7 with the optional headroom */
	for (int i = 0; i < 8; i++)
		mp_u(m, 0);
}
static void it_float(struct mp *m)
{
	mp_arr(m, 6);
	mp_u(m, 1);
	mp_u(m, 0);
	msgpack_pack_double(&m->pk, 1.0);
	mp_u(m, 0);
	mp_u(m, 0);
	mp_u(m, 0);
}
static void it_map(struct mp *m) { mp_map(m, 0); }
static void it_ok(struct mp *m) { mp_item(m, UINT64_MAX, UINT32_MAX, UINT32_MAX, 1, UINT32_MAX, UINT32_MAX); }

TEST(codec, refuse_sync_items)
{
	struct mp m;
	struct ipc_req q;

	sync_with(&m, it_ok);
	accept_req(&m, &q);
	T_EQ_U64(q.u.sync.items[0].seq, UINT64_MAX);
	T_EQ_U64(q.u.sync.items[0].n_new, UINT32_MAX);
	codec_req_free(&q);

	sync_with(&m, it_neg);
	refuse_req(&m, KVT_EPROTO, "sync item 0: n_new is negative");
	sync_with(&m, it_big);
	refuse_req(&m, KVT_EPROTO, "sync item 0: n_new is out of range");
	sync_with(&m, it_phase2);
	refuse_req(&m, KVT_EPROTO, "sync item 0: phase 2");
	sync_with(&m, it_short);
	refuse_req(&m, KVT_EPROTO, "sync item 0 has 5 fields");
	sync_with(&m, it_long);
	refuse_req(&m, KVT_EPROTO, "sync item 0 has 8 fields");
	sync_with(&m, it_float);
	refuse_req(&m, KVT_EPROTO,
	           "sync item 0: n_new is not an unsigned integer");
	sync_with(&m, it_map);
	refuse_req(&m, KVT_EPROTO, "sync item 0 is a map");

	/* The failing item's index is reported. */
	mp_req(&m, 6, "sync");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 2);
	mp_ku(&m, "n", 1);
	mp_s(&m, "items");
	mp_arr(&m, 4);
	for (int i = 0; i < 3; i++)
		mp_item(&m, i, 0, 1, 0, 0, 0);
	mp_item(&m, 3, 0, 1, 0, 0, (uint64_t)1 << 32);
	refuse_req(&m, KVT_EPROTO, "sync item 3: layer_hi");

	/* Empty and too many. */
	mp_req(&m, 6, "sync");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 2);
	mp_ku(&m, "n", 1);
	mp_s(&m, "items");
	mp_arr(&m, 0);
	refuse_req(&m, KVT_EPROTO, "empty");

	mp_req(&m, 6, "sync");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 2);
	mp_ku(&m, "n", 1);
	mp_s(&m, "items");
	mp_arr(&m, IPC_MAX_SYNC_ITEMS + 1);
	for (uint32_t i = 0; i <= IPC_MAX_SYNC_ITEMS; i++)
		mp_item(&m, i, 0, 1, 0, 0, 0);
	refuse_req(&m, KVT_EPROTO, "4097");

	mp_req(&m, 6, "sync");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 2);
	mp_ku(&m, "n", 1);
	mp_ku(&m, "items", 1);
	refuse_req(&m, KVT_EPROTO, "items");

	mp_req(&m, 5, "sync");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 2);
	mp_ku(&m, "n", 1);
	refuse_req(&m, KVT_EPROTO, "missing key \"items\"");

	/* Every sync is numbered (kvt_seq_query names one by it). */
	mp_req(&m, 5, "sync");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 2);
	mp_s(&m, "items");
	mp_arr(&m, 1);
	mp_item(&m, 1, 0, 1, 0, 0, 0);
	refuse_req(&m, KVT_EPROTO, "missing key \"n\"");
}

TEST(codec, refuse_missing_credentials)
{
	struct mp m;
	/* sync without "t" */
	mp_req(&m, 4, "sync");
	mp_ku(&m, "k", 2);
	mp_s(&m, "items");
	mp_arr(&m, 1);
	mp_item(&m, 1, 0, 1, 0, 0, 0);
	refuse_req(&m, KVT_EPROTO, "missing key \"t\"");

	mp_req(&m, 3, "bye");
	mp_ku(&m, "t", 2);
	refuse_req(&m, KVT_EPROTO, "missing key \"k\"");

	mp_req(&m, 4, "seq_open");
	mp_ku(&m, "t", (uint64_t)UINT32_MAX + 1);
	mp_ku(&m, "k", 2);
	refuse_req(&m, KVT_EPROTO, "t is out of range");

	mp_req(&m, 4, "seq_close");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 2);
	refuse_req(&m, KVT_EPROTO, "missing key \"seq\"");

	/* Admin ops with half the credentials. */
	mp_req(&m, 3, "tenants");
	mp_ku(&m, "t", 1);
	refuse_req(&m, KVT_EPROTO, "missing key \"k\"");

	/* Hello never carries credentials. */
	struct ipc_req q = hello_req();
	uint8_t *buf;
	size_t len;
	T_OK(codec_req_encode(&q, &buf, &len));
	T_EQ(top_keys(buf, len), 14);
	free(buf);
}
