/*
 * codec_bounds_test.c — the largest valid requests (codec_req_len_max,
 * codec_req_objs_max): built here by hand in msgpack's widest encodings,
 * every string and array at its limit, they decode and are exactly as
 * long as the bound says; one object more is refused before unpacking,
 * and so is a megabyte of nils, whatever its shape.
 */
#include <stdlib.h>

#include "codec_fixture.h"

/* A hand encoder of msgpack's widest forms: 5-byte headers, 9-byte
 * integers (all valid msgpack, never what the library writes). */
struct wide {
	uint8_t *b;
	size_t n, cap;
};

static void w_put(struct wide *w, const void *p, size_t n)
{
	if (w->n + n > w->cap) {
		w->cap = (w->n + n) * 2;
		w->b = realloc(w->b, w->cap);
		T_ASSERT(w->b);
	}
	memcpy(w->b + w->n, p, n);
	w->n += n;
}

static void w_head(struct wide *w, uint8_t tag, uint64_t v, int bytes)
{
	uint8_t h[9] = {tag};
	for (int i = 0; i < bytes; i++)
		h[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
	w_put(w, h, 1 + (size_t)bytes);
}

static void w_u(struct wide *w, uint64_t v) { w_head(w, 0xcf, v, 8); }
static void w_map(struct wide *w, uint32_t n) { w_head(w, 0xdf, n, 4); }
static void w_arr(struct wide *w, uint32_t n) { w_head(w, 0xdd, n, 4); }

static void w_s(struct wide *w, const char *s)
{
	w_head(w, 0xdb, strlen(s), 4);
	w_put(w, s, strlen(s));
}

/* A string of n 'a's under the str32 header. */
static void w_sn(struct wide *w, size_t n)
{
	w_head(w, 0xdb, n, 4);
	for (size_t i = 0; i < n; i++)
		w_put(w, "a", 1);
}

static void w_ku(struct wide *w, const char *k, uint64_t v)
{
	w_s(w, k);
	w_u(w, v);
}

/* The map, "v" and "op" of a request of n keys in all. */
static void w_req(struct wide *w, uint32_t n, const char *op)
{
	memset(w, 0, sizeof(*w));
	w_map(w, n);
	w_ku(w, "v", IPC_PROTO_VERSION);
	w_s(w, "op");
	w_s(w, op);
}

/* Decodes w: the code, with the request freed. */
static int w_decode(const struct wide *w, char *err, size_t elen)
{
	struct ipc_req q;
	int rc = codec_req_decode(w->b, w->n, &q, err, elen);
	codec_req_free(&q);
	return rc;
}

TEST(codec_bounds, the_widest_hello_and_admin_request_fit_exactly)
{
	char err[KVT_ERRTEXT_MAX];
	struct wide w;
	static const char *const u[] = {"dtype", "page", "seqs", "maxtok",
	                                "head", "stage", "quota", "cookie",
	                                "pid"};
	w_req(&w, 14, "hello");
	w_s(&w, "name");
	w_sn(&w, KVT_NAME_MAX - 1);
	w_s(&w, "geo");
	w_arr(&w, 5);
	for (int i = 0; i < 5; i++)
		w_u(&w, 8);
	w_s(&w, "policy");
	w_sn(&w, KVT_SPEC_MAX - 1);
	for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++)
		w_ku(&w, u[i], 1);
	T_OK(w_decode(&w, err, sizeof(err)));
	T_EQ_U64(w.n, codec_req_len_max(IPC_OP_HELLO));
	free(w.b);

	/* config_set: the longest admin request, with credentials. */
	w_req(&w, 6, "config_set");
	w_ku(&w, "t", UINT32_MAX);
	w_ku(&w, "k", UINT64_MAX);
	w_s(&w, "key");
	w_sn(&w, KVT_NAME_MAX - 1);
	w_s(&w, "value");
	w_sn(&w, IPC_STR_MAX - 1);
	T_OK(w_decode(&w, err, sizeof(err)));
	T_EQ_U64(w.n, codec_req_len_max(IPC_OP_CONFIG_SET));
	free(w.b);

	/* Every other admin request and the hello are shorter. */
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++)
		if (codec_op_is_admin((enum ipc_op)op))
			T_ASSERT(codec_req_len_max((enum ipc_op)op) <=
			         codec_req_len_max(IPC_OP_CONFIG_SET));
	T_ASSERT(codec_req_len_max(IPC_OP_CONFIG_SET) <
	         codec_req_len_max(IPC_OP_HELLO));
	T_EQ_U64(codec_req_len_max(IPC_OP_NONE), 0);
	T_EQ_U64(codec_req_len_max(IPC_OP_COUNT), 0);
}

/* The widest sync of IPC_MAX_SYNC_ITEMS items of 7 fields; with extra,
 * its last item has an 8th field (one object more). */
static void w_sync(struct wide *w, int extra)
{
	w_req(w, 6, "sync");
	w_ku(w, "t", 1);
	w_ku(w, "k", 2);
	w_ku(w, "n", 3);
	w_s(w, "items");
	w_arr(w, IPC_MAX_SYNC_ITEMS);
	for (uint32_t i = 0; i < IPC_MAX_SYNC_ITEMS; i++) {
		int last = i + 1 == IPC_MAX_SYNC_ITEMS;
		w_arr(w, 7 + (last && extra));
		for (int f = 0; f < 7 + (last && extra); f++)
			w_u(w, f == 2); /* n_new 1, phase 0 */
	}
}

TEST(codec_bounds, the_largest_sync_decodes_one_object_more_does_not)
{
	char err[KVT_ERRTEXT_MAX];
	struct wide w;
	w_sync(&w, 0);
	T_OK(w_decode(&w, err, sizeof(err)));
	T_EQ_U64(w.n, codec_req_len_max(IPC_OP_SYNC));
	/* map, 6 keys and their values, the items and their fields */
	T_EQ_U64(codec_req_objs_max(),
	         1 + 2 * 6 + (uint64_t)IPC_MAX_SYNC_ITEMS * 8);
	free(w.b);
	/* Its size is fine; its count of objects is not: refused by the
	 * walk before msgpack-c builds anything (without the bound, the
	 * decoder would have said "8 fields"). */
	w_sync(&w, 1);
	T_ERR(w_decode(&w, err, sizeof(err)), KVT_ETOOBIG);
	T_ASSERT(strstr(err, "msgpack objects"));
	T_ASSERT(strstr(err, "refused before unpacking"));
	free(w.b);
}

/* A message of about IPC_MAX_MSG bytes of nils: shape 0 an array32 of
 * them, 1 a map32 of pairs of them, 2 {"x": an array32 of them}. */
static uint8_t *nil_flood(int shape, size_t *len)
{
	static const uint8_t x[] = {0x81, 0xa1, 'x'};
	size_t pre = shape == 2 ? sizeof(x) : 0, head = pre + 5;
	size_t n = shape == 1 ? (IPC_MAX_MSG - head) / 2 : IPC_MAX_MSG - head;
	uint8_t *b = malloc(IPC_MAX_MSG);
	T_ASSERT(b);
	memcpy(b, x, pre);
	b[pre] = shape == 1 ? 0xdf : 0xdd;
	for (int i = 0; i < 4; i++)
		b[pre + 1 + i] = (uint8_t)(n >> (24 - 8 * i));
	*len = head + (shape == 1 ? 2 * n : n);
	memset(b + head, 0xc0, *len - head);
	return b;
}

TEST(codec_bounds, a_megabyte_of_nils_is_refused_before_unpacking)
{
	char err[KVT_ERRTEXT_MAX];
	for (int shape = 0; shape < 3; shape++) {
		size_t len;
		uint8_t *b = nil_flood(shape, &len);
		T_ASSERT(len <= IPC_MAX_MSG && len > IPC_MAX_MSG - 16);
		struct ipc_req q;
		/* Before the bound: "message is an array, not a map" and
		 * "missing protocol version", each after msgpack-c built a
		 * million objects. */
		T_ERR(codec_req_decode(b, len, &q, err, sizeof(err)),
		      KVT_ETOOBIG);
		T_ASSERT(strstr(err, "msgpack objects"));
		T_EQ(q.op, IPC_OP_NONE);
		T_EQ(codec_peek_op(b, len), IPC_OP_NONE);
		struct ipc_rep r;
		T_ERR(codec_rep_decode(IPC_OP_STATS, b, len, &r, err,
		                       sizeof(err)),
		      KVT_ETOOBIG);
		free(b);
	}
}

/* The op of a request is still read when its "op" comes within the keys a
 * request may have, and not looked for beyond them. */
TEST(codec_bounds, peek_op_reads_at_most_the_keys_a_request_has)
{
	struct mp m;
	mp_init(&m);
	mp_map(&m, 40);
	for (int i = 0; i < 39; i++) {
		char k[8];
		snprintf(k, sizeof(k), "k%d", i);
		mp_ku(&m, k, 1);
	}
	mp_ks(&m, "op", "stats");
	T_EQ(codec_peek_op((uint8_t *)m.sb.data, m.sb.size), IPC_OP_NONE);
	mp_free(&m);
	mp_init(&m);
	mp_map(&m, 40);
	mp_ks(&m, "op", "stats");
	for (int i = 0; i < 39; i++) {
		char k[8];
		snprintf(k, sizeof(k), "k%d", i);
		mp_ku(&m, k, 1);
	}
	T_EQ(codec_peek_op((uint8_t *)m.sb.data, m.sb.size), IPC_OP_STATS);
	mp_free(&m);
}
