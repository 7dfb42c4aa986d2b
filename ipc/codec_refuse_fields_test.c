/*
 * codec_refuse_fields_test.c — refusals of single fields with their exact
 * codes: every hello field out of bounds, unknown and repeated keys,
 * trailing bytes, and malformed replies.
 */
#include "codec_fixture.h"
/* A hello request with one key replaced (value written by val()) or, when
 * val is NULL, removed. */
static void hello_with(struct mp *m, const char *key,
                       void (*val)(struct mp *))
{
	static const char *const keys[] = {"name", "geo", "dtype", "page",
	                                   "seqs", "maxtok", "head", "stage",
	                                   "policy", "quota", "cookie", "pid"};
	mp_req(m, val ? 14 : 13, "hello");
	for (size_t i = 0; i < 12; i++) {
		if (!strcmp(keys[i], key)) {
			if (val) {
				mp_s(m, key);
				val(m);
			}
			continue;
		}
		mp_s(m, keys[i]);
		if (!strcmp(keys[i], "name") || !strcmp(keys[i], "policy")) {
			mp_s(m, "x");
		} else if (!strcmp(keys[i], "geo")) {
			mp_arr(m, 5);
			for (int g = 0; g < 5; g++)
				mp_u(m, 8);
		} else {
			mp_u(m, 1);
		}
	}
}

static void v_name63(struct mp *m)
{
	char s[64];
	memset(s, 'a', 63);
	s[63] = 0;
	mp_s(m, s);
}
static void v_name64(struct mp *m)
{
	char s[65];
	memset(s, 'a', 64);
	s[64] = 0;
	mp_s(m, s);
}
static void v_nul(struct mp *m)
{
	msgpack_pack_str(&m->pk, 5);
	msgpack_pack_str_body(&m->pk, "ab\0cd", 5);
}
static void v_bin(struct mp *m)
{
	msgpack_pack_bin(&m->pk, 2);
	msgpack_pack_bin_body(&m->pk, "ab", 2);
}
static void v_geo4(struct mp *m)
{
	mp_arr(m, 4);
	for (int g = 0; g < 4; g++)
		mp_u(m, 8);
}
static void v_geo_neg(struct mp *m)
{
	mp_arr(m, 5);
	mp_u(m, 1);
	mp_u(m, 1);
	mp_i(m, -8);
	mp_u(m, 1);
	mp_u(m, 1);
}
static void v_u33(struct mp *m) { mp_u(m, (uint64_t)UINT32_MAX + 1); }
static void v_u32max(struct mp *m) { mp_u(m, UINT32_MAX); }
static void v_nil(struct mp *m) { msgpack_pack_nil(&m->pk); }
static void v_true(struct mp *m) { msgpack_pack_true(&m->pk); }
static void v_spec256(struct mp *m)
{
	char s[257];
	memset(s, 'p', 256);
	s[256] = 0;
	mp_s(m, s);
}

TEST(codec, refuse_hello_fields)
{
	struct mp m;
	struct ipc_req q;

	hello_with(&m, "name", v_name63);
	accept_req(&m, &q);
	T_EQ(strlen(q.u.hello.name), 63);
	hello_with(&m, "pid", v_u32max);
	accept_req(&m, &q);
	T_EQ_U64(q.u.hello.pid, UINT32_MAX);

	hello_with(&m, "name", v_name64);
	refuse_req(&m, KVT_EPROTO, "name is too long");
	hello_with(&m, "name", v_nul);
	refuse_req(&m, KVT_EPROTO, "name contains a NUL");
	hello_with(&m, "policy", v_nul);
	refuse_req(&m, KVT_EPROTO, "policy contains a NUL");
	hello_with(&m, "name", v_bin);
	refuse_req(&m, KVT_EPROTO, "name is not a string");
	hello_with(&m, "policy", v_spec256);
	refuse_req(&m, KVT_EPROTO, "policy is too long");
	hello_with(&m, "geo", v_geo4);
	refuse_req(&m, KVT_EPROTO, "geo has 4 entries");
	hello_with(&m, "geo", v_geo_neg);
	refuse_req(&m, KVT_EPROTO, "geo[2] (n_kv_heads) is negative");
	hello_with(&m, "geo", v_u33);
	refuse_req(&m, KVT_EPROTO, "geo is an unsigned integer");
	hello_with(&m, "maxtok", v_u33);
	refuse_req(&m, KVT_EPROTO, "maxtok is out of range");
	hello_with(&m, "pid", v_nil);
	refuse_req(&m, KVT_EPROTO, "pid is not an unsigned integer");
	hello_with(&m, "dtype", v_true);
	refuse_req(&m, KVT_EPROTO, "dtype");

	/* Every key is required. */
	static const char *const keys[] = {"name", "geo", "dtype", "page",
	                                   "seqs", "maxtok", "head", "stage",
	                                   "policy", "quota", "cookie", "pid"};
	for (size_t i = 0; i < 12; i++) {
		char want[32];
		snprintf(want, sizeof(want), "missing key \"%s\"", keys[i]);
		hello_with(&m, keys[i], NULL);
		refuse_req(&m, KVT_EPROTO, want);
	}
}

TEST(codec, refuse_keys)
{
	struct mp m;
	/* unknown key */
	mp_req(&m, 3, "stats");
	mp_ku(&m, "verbose", 1);
	refuse_req(&m, KVT_EPROTO, "unknown key \"verbose\"");
	/* a key of another op */
	mp_req(&m, 3, "tenants");
	mp_ks(&m, "key", "x");
	refuse_req(&m, KVT_EPROTO, "unknown key \"key\"");
	mp_req(&m, 5, "bye");
	mp_ku(&m, "t", 1);
	mp_ku(&m, "k", 1);
	mp_ku(&m, "seq", 1);
	refuse_req(&m, KVT_EPROTO, "unknown key \"seq\"");
	/* duplicate key, same value or not */
	mp_req(&m, 3, "stats");
	mp_ks(&m, "op", "stats");
	refuse_req(&m, KVT_EPROTO, "duplicate key \"op\"");
	mp_req(&m, 3, "check");
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	refuse_req(&m, KVT_EPROTO, "duplicate key \"v\"");
	/* non-string key */
	mp_req(&m, 3, "check");
	mp_u(&m, 1);
	mp_u(&m, 1);
	refuse_req(&m, KVT_EPROTO, "not a string");
	/* filter string too long / wrong type */
	mp_req(&m, 3, "stats");
	mp_s(&m, "tenant");
	v_name64(&m);
	refuse_req(&m, KVT_EPROTO, "tenant is too long");
	mp_req(&m, 3, "config");
	mp_ku(&m, "key", 1);
	refuse_req(&m, KVT_EPROTO, "key is not a string");
	/* too many keys */
	mp_req(&m, 40, "stats");
	for (int i = 0; i < 38; i++) {
		char k[8];
		snprintf(k, sizeof(k), "k%d", i);
		mp_ku(&m, k, 1);
	}
	refuse_req(&m, KVT_EPROTO, "too many keys");
}

TEST(codec, refuse_trailing_bytes)
{
	struct ipc_req q = hello_req();
	uint8_t *buf;
	size_t len;
	char err[256];
	T_OK(codec_req_encode(&q, &buf, &len));
	uint8_t *p = malloc(len + 1);
	memcpy(p, buf, len);
	p[len] = 0xc0;
	T_ERR(codec_req_decode(p, len + 1, &q, err, sizeof(err)), KVT_EPROTO);
	T_ASSERT(strstr(err, "1 trailing byte"));
	/* A second whole message is trailing bytes too. */
	uint8_t *two = malloc(2 * len);
	memcpy(two, buf, len);
	memcpy(two + len, buf, len);
	T_ERR(codec_req_decode(two, 2 * len, &q, err, sizeof(err)),
	      KVT_EPROTO);
	free(two);
	free(p);
	free(buf);
}

TEST(codec, refuse_replies)
{
	struct mp m;
	/* e positive, e wrong type, e missing */
	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 3);
	refuse_rep(IPC_OP_BYE, &m, KVT_EPROTO, "positive");
	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ks(&m, "e", "0");
	refuse_rep(IPC_OP_BYE, &m, KVT_EPROTO, "not an integer");
	mp_init(&m);
	mp_map(&m, 1);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	refuse_rep(IPC_OP_BYE, &m, KVT_EPROTO, "missing key \"e\"");
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_s(&m, "e");
	mp_i(&m, (int64_t)INT32_MIN - 1);
	mp_ks(&m, "m", "x");
	refuse_rep(IPC_OP_BYE, &m, KVT_EPROTO, "out of range");
	/* error without m; success with m; error with payload */
	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_s(&m, "e");
	mp_i(&m, KVT_ENOSEQ);
	refuse_rep(IPC_OP_SEQ_CLOSE, &m, KVT_EPROTO, "missing key \"m\"");
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_ks(&m, "m", "fine");
	refuse_rep(IPC_OP_BYE, &m, KVT_EPROTO, "unknown key \"m\"");
	mp_init(&m);
	mp_map(&m, 4);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_s(&m, "e");
	mp_i(&m, KVT_ESEQLIMIT);
	mp_ks(&m, "m", "full");
	mp_ku(&m, "seq", 3);
	refuse_rep(IPC_OP_SEQ_OPEN, &m, KVT_EPROTO, "unknown key \"seq\"");
	/* hello reply missing a field */
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_ku(&m, "t", 1);
	refuse_rep(IPC_OP_HELLO, &m, KVT_EPROTO, "missing key \"k\"");
	/* rows: wrong types, bad rows */
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_ku(&m, "rows", 0);
	refuse_rep(IPC_OP_STATS, &m, KVT_EPROTO, "rows is");
	mp_init(&m);
	mp_map(&m, 2);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	refuse_rep(IPC_OP_CHECK, &m, KVT_EPROTO, "missing key \"rows\"");
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_s(&m, "rows");
	mp_arr(&m, 2);
	mp_map(&m, 1);
	mp_ku(&m, "ok", 1);
	mp_map(&m, 1);
	mp_s(&m, "list");
	mp_arr(&m, 0);
	refuse_rep(IPC_OP_CHECK, &m, KVT_EPROTO, "row 1: \"list\"");
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_s(&m, "rows");
	mp_arr(&m, 1);
	mp_map(&m, 2);
	mp_ku(&m, "a", 1);
	mp_ku(&m, "a", 2);
	refuse_rep(IPC_OP_CONFIG, &m, KVT_EPROTO, "row 0: duplicate key");
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_s(&m, "rows");
	mp_arr(&m, 1);
	mp_map(&m, IPC_MAX_COLS + 1);
	for (uint32_t i = 0; i <= IPC_MAX_COLS; i++) {
		char k[8];
		snprintf(k, sizeof(k), "c%u", i);
		mp_ku(&m, k, i);
	}
	refuse_rep(IPC_OP_STATS, &m, KVT_EPROTO, "97 columns"); /* 96 + 1 */
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_s(&m, "rows");
	mp_arr(&m, 1);
	mp_map(&m, 1);
	char longk[IPC_KEY_MAX + 1];
	memset(longk, 'k', IPC_KEY_MAX);
	longk[IPC_KEY_MAX] = 0;
	mp_ku(&m, longk, 1);
	refuse_rep(IPC_OP_STATS, &m, KVT_EPROTO, "too long");
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_ku(&m, "e", 0);
	mp_s(&m, "rows");
	mp_arr(&m, IPC_MAX_ROWS + 1);
	for (uint32_t i = 0; i <= IPC_MAX_ROWS; i++)
		mp_map(&m, 0);
	refuse_rep(IPC_OP_TENANTS, &m, KVT_EPROTO, "4097");
}
