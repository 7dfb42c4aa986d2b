/*
 * test_codec.c — the control-message codec: round trips of every op, byte
 * facts checked against an independent encoding built here with msgpack-c's
 * packer, refusals with their exact codes, and a fixed-seed mutation loop.
 */
#include <msgpack.h>

#include "codec.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

/* An independent encoder: msgpack-c's packer driven by hand. */
struct mp {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void mp_init(struct mp *m)
{
	msgpack_sbuffer_init(&m->sb);
	msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mp_s(struct mp *m, const char *s)
{
	msgpack_pack_str(&m->pk, strlen(s));
	msgpack_pack_str_body(&m->pk, s, strlen(s));
}

static void mp_u(struct mp *m, uint64_t v) { msgpack_pack_uint64(&m->pk, v); }
static void mp_i(struct mp *m, int64_t v) { msgpack_pack_int64(&m->pk, v); }
static void mp_map(struct mp *m, size_t n) { msgpack_pack_map(&m->pk, n); }
static void mp_arr(struct mp *m, size_t n) { msgpack_pack_array(&m->pk, n); }
static void mp_ku(struct mp *m, const char *k, uint64_t v) { mp_s(m, k); mp_u(m, v); }
static void mp_ks(struct mp *m, const char *k, const char *v) { mp_s(m, k); mp_s(m, v); }
static void mp_free(struct mp *m) { msgpack_sbuffer_destroy(&m->sb); }

/* Starts a request map of n keys with v and op (n counts them). */
static void mp_req(struct mp *m, size_t n, const char *op)
{
	mp_init(m);
	mp_map(m, n);
	mp_ku(m, "v", IPC_PROTO_VERSION);
	mp_ks(m, "op", op);
}

static void mp_item(struct mp *m, uint64_t seq, uint64_t ctr, uint64_t n_new,
                    uint64_t phase, uint64_t lo, uint64_t hi)
{
	mp_arr(m, 6);
	mp_u(m, seq);
	mp_u(m, ctr);
	mp_u(m, n_new);
	mp_u(m, phase);
	mp_u(m, lo);
	mp_u(m, hi);
}

/* Decodes m as a request, expects code, a non-empty reason and (when
 * given) a reason containing want; releases m. */
static void refuse_req_(struct mp *m, int code, const char *want,
                        const char *file, int line)
{
	struct ipc_req r;
	char err[256];
	memset(err, 'x', sizeof(err));
	int rc = codec_req_decode((const uint8_t *)m->sb.data, m->sb.size, &r,
	                          err, sizeof(err));
	codec_req_free(&r);
	mp_free(m);
	if (rc != code)
		th_fail(file, line, "decode gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (!err[0] || !memchr(err, 0, sizeof(err)) || strchr(err, '\n'))
		th_fail(file, line, "no one-line reason");
	if (want && !strstr(err, want))
		th_fail(file, line, "reason \"%s\" lacks \"%s\"", err, want);
}
#define refuse_req(m, code, want) refuse_req_(m, code, want, __FILE__, __LINE__)

static void refuse_rep_(enum ipc_op op, struct mp *m, int code,
                        const char *want, const char *file, int line)
{
	struct ipc_rep r;
	char err[256] = "";
	int rc = codec_rep_decode(op, (const uint8_t *)m->sb.data, m->sb.size,
	                          &r, err, sizeof(err));
	codec_rep_free(&r);
	mp_free(m);
	if (rc != code)
		th_fail(file, line, "decode gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (!err[0])
		th_fail(file, line, "no reason");
	if (want && !strstr(err, want))
		th_fail(file, line, "reason \"%s\" lacks \"%s\"", err, want);
}
#define refuse_rep(op, m, code, want)                                          \
	refuse_rep_(op, m, code, want, __FILE__, __LINE__)

static void accept_req_(struct mp *m, struct ipc_req *r, const char *file,
                        int line)
{
	char err[256] = "";
	int rc = codec_req_decode((const uint8_t *)m->sb.data, m->sb.size, r,
	                          err, sizeof(err));
	mp_free(m);
	if (rc)
		th_fail(file, line, "decode gave %s: %s", kvt_errname(rc), err);
}
#define accept_req(m, r) accept_req_(m, r, __FILE__, __LINE__)

static struct ipc_req hello_req(void)
{
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_HELLO;
	struct ipc_hello *h = &q.u.hello;
	snprintf(h->name, sizeof(h->name), "engine-7");
	h->geo = (struct kvt_geometry){32, 32, 8, 128, 4096};
	h->dtype = KVT_DTYPE_BF16;
	h->page_tokens = 16;
	h->max_seqs = 8;
	h->max_tokens = UINT32_MAX;
	h->headroom = 17;
	h->stage_tokens = 64;
	snprintf(h->policy, sizeof(h->policy), "snapkv:budget=512,window=32");
	h->quota_bytes = UINT64_MAX;
	h->cookie = 0x0123456789abcdefull;
	h->pid = 4242;
	return q;
}

static void req_roundtrip(const struct ipc_req *in, struct ipc_req *out)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	char err[256] = "";
	T_OK(codec_req_encode(in, &buf, &len));
	T_ASSERT(buf && len > 0 && len <= IPC_MAX_MSG);
	int rc = codec_req_decode(buf, len, out, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "decode: %s", err);
	T_EQ_STR(err, "");
	T_EQ(out->version, IPC_PROTO_VERSION);
	T_EQ(out->op, in->op);
	free(buf);
}

static void rep_roundtrip(enum ipc_op op, const struct ipc_rep *in,
                          struct ipc_rep *out)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	char err[256] = "";
	T_OK(codec_rep_encode(op, in, &buf, &len));
	int rc = codec_rep_decode(op, buf, len, out, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "decode: %s", err);
	T_EQ(out->version, IPC_PROTO_VERSION);
	T_EQ(out->err, in->err);
	free(buf);
}

/* Number of keys of the top-level map of buf, read by msgpack-c. */
static uint32_t top_keys(const uint8_t *buf, size_t len)
{
	msgpack_unpacked up;
	size_t off = 0;
	uint32_t n = 0;
	msgpack_unpacked_init(&up);
	if (msgpack_unpack_next(&up, (const char *)buf, len, &off) ==
	            MSGPACK_UNPACK_SUCCESS &&
	    up.data.type == MSGPACK_OBJECT_MAP)
		n = up.data.via.map.size;
	msgpack_unpacked_destroy(&up);
	return n;
}

/* ------------------------------------------------------------- ops */

TEST(codec, op_names)
{
	T_EQ_STR(codec_op_name(IPC_OP_HELLO), "hello");
	T_EQ_STR(codec_op_name(IPC_OP_SEQ_OPEN), "seq_open");
	T_EQ_STR(codec_op_name(IPC_OP_CONFIG), "config");
	T_ASSERT(codec_op_name(IPC_OP_NONE) == NULL);
	T_ASSERT(codec_op_name(IPC_OP_COUNT) == NULL);
	T_ASSERT(codec_op_name((enum ipc_op)-1) == NULL);
	T_ASSERT(!codec_op_is_admin(IPC_OP_HELLO));
	T_ASSERT(!codec_op_is_admin(IPC_OP_SYNC));
	T_ASSERT(codec_op_is_admin(IPC_OP_STATS));
	T_ASSERT(codec_op_is_admin(IPC_OP_TENANTS));
	T_ASSERT(codec_op_is_admin(IPC_OP_CHECK));
	T_ASSERT(codec_op_is_admin(IPC_OP_POLICIES));
	T_ASSERT(codec_op_is_admin(IPC_OP_CONFIG));
}

/* ------------------------------------------------------------- requests */

TEST(codec, hello_roundtrip)
{
	struct ipc_req in = hello_req(), out;
	/* Longest strings that fit. */
	memset(in.u.hello.name, 'n', KVT_NAME_MAX - 1);
	in.u.hello.name[KVT_NAME_MAX - 1] = 0;
	memset(in.u.hello.policy, 'p', KVT_SPEC_MAX - 1);
	in.u.hello.policy[KVT_SPEC_MAX - 1] = 0;
	req_roundtrip(&in, &out);
	const struct ipc_hello *a = &in.u.hello, *b = &out.u.hello;
	T_EQ_STR(b->name, a->name);
	T_EQ(b->geo.n_layers, 32);
	T_EQ(b->geo.n_heads, 32);
	T_EQ(b->geo.n_kv_heads, 8);
	T_EQ(b->geo.head_dim, 128);
	T_EQ(b->geo.d_model, 4096);
	T_EQ(b->dtype, KVT_DTYPE_BF16);
	T_EQ(b->page_tokens, 16);
	T_EQ(b->max_seqs, 8);
	T_EQ_U64(b->max_tokens, UINT32_MAX);
	T_EQ(b->headroom, 17);
	T_EQ(b->stage_tokens, 64);
	T_EQ_STR(b->policy, a->policy);
	T_EQ_U64(b->quota_bytes, UINT64_MAX);
	T_EQ_U64(b->cookie, 0x0123456789abcdefull);
	T_EQ(b->pid, 4242);
	T_EQ(out.tenant, 0);
	T_EQ_U64(out.token, 0);
	codec_req_free(&out);
}

TEST(codec, hello_empty_strings_and_zeros)
{
	struct ipc_req in, out;
	memset(&in, 0, sizeof(in));
	in.op = IPC_OP_HELLO;
	req_roundtrip(&in, &out);
	T_EQ_STR(out.u.hello.name, "");
	T_EQ_STR(out.u.hello.policy, "");
	T_EQ(out.u.hello.geo.d_model, 0);
	codec_req_free(&out);
}

TEST(codec, session_ops_roundtrip)
{
	enum ipc_op ops[] = {IPC_OP_BYE, IPC_OP_SEQ_OPEN, IPC_OP_SEQ_CLOSE};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		struct ipc_req in, out;
		memset(&in, 0, sizeof(in));
		in.op = ops[i];
		in.tenant = UINT32_MAX;
		in.token = 0xfeedfacecafebeefull;
		in.u.seq = UINT64_MAX - 1;
		if (ops[i] == IPC_OP_SEQ_OPEN)
			in.u.open.undo = 3;
		req_roundtrip(&in, &out);
		if (ops[i] == IPC_OP_SEQ_OPEN)
			T_EQ_U64(out.u.open.undo, 3);
		T_EQ_U64(out.tenant, UINT32_MAX);
		T_EQ_U64(out.token, 0xfeedfacecafebeefull);
		if (ops[i] == IPC_OP_SEQ_CLOSE)
			T_EQ_U64(out.u.seq, UINT64_MAX - 1);
		else if (ops[i] == IPC_OP_SEQ_OPEN) /* "n", "undo" */
			T_EQ_U64(out.u.open.no, UINT64_MAX - 1);
		else
			T_EQ_U64(out.u.seq, 0);
		codec_req_free(&out);
	}
}

static int same_item(const struct ipc_sync_item *a,
                     const struct ipc_sync_item *b)
{
	return a->seq == b->seq && a->counter == b->counter &&
	       a->n_new == b->n_new && a->phase == b->phase &&
	       a->layer_lo == b->layer_lo && a->layer_hi == b->layer_hi;
}

TEST(codec, sync_one_item)
{
	struct ipc_sync_item it = {.seq = 9, .counter = 41, .n_new = 1,
	                           .phase = KVT_PHASE_DECODE, .layer_lo = 0,
	                           .layer_hi = 0};
	struct ipc_req in, out;
	memset(&in, 0, sizeof(in));
	in.op = IPC_OP_SYNC;
	in.tenant = 3;
	in.token = 77;
	in.u.sync.n = 1;
	in.u.sync.items = &it;
	req_roundtrip(&in, &out);
	T_EQ(out.u.sync.n, 1);
	T_ASSERT(out.u.sync.items != &it);
	T_ASSERT(same_item(&out.u.sync.items[0], &it));
	codec_req_free(&out);
	T_ASSERT(out.u.sync.items == NULL);
	codec_req_free(&out); /* twice is harmless */
}

TEST(codec, sync_max_items)
{
	struct ipc_sync_item *it = calloc(IPC_MAX_SYNC_ITEMS, sizeof(*it));
	T_ASSERT(it);
	for (uint32_t i = 0; i < IPC_MAX_SYNC_ITEMS; i++)
		it[i] = (struct ipc_sync_item){
			.seq = (uint64_t)i << 33 | i, .counter = i * 7u,
			.n_new = i ? UINT32_MAX / i : UINT32_MAX,
			.phase = i & 1, .layer_lo = i % 40,
			.layer_hi = i % 40 + 1};
	struct ipc_req in, out;
	memset(&in, 0, sizeof(in));
	in.op = IPC_OP_SYNC;
	in.tenant = 1;
	in.token = 2;
	in.u.sync.n = IPC_MAX_SYNC_ITEMS;
	in.u.sync.items = it;
	req_roundtrip(&in, &out);
	T_EQ(out.u.sync.n, IPC_MAX_SYNC_ITEMS);
	for (uint32_t i = 0; i < IPC_MAX_SYNC_ITEMS; i++)
		T_ASSERT(same_item(&out.u.sync.items[i], &it[i]));
	codec_req_free(&out);

	/* One more is refused by the encoder too. */
	in.u.sync.n = IPC_MAX_SYNC_ITEMS + 1;
	uint8_t *buf = NULL;
	size_t len = 0;
	T_ERR(codec_req_encode(&in, &buf, &len), KVT_EINVAL);
	free(it);
}

TEST(codec, admin_roundtrip)
{
	for (int op = IPC_OP_STATS; op <= IPC_OP_CONFIG; op++) {
		struct ipc_req in, out;
		uint8_t *buf;
		size_t len;

		/* Bare: only v and op on the wire. */
		memset(&in, 0, sizeof(in));
		in.op = (enum ipc_op)op;
		T_OK(codec_req_encode(&in, &buf, &len));
		T_EQ(top_keys(buf, len), 2);
		free(buf);
		req_roundtrip(&in, &out);
		T_EQ_STR(out.u.filter, "");
		codec_req_free(&out);

		/* With credentials (optional for admin ops). */
		in.tenant = 5;
		in.token = 6;
		req_roundtrip(&in, &out);
		T_EQ(out.tenant, 5);
		T_EQ(out.token, 6);
		codec_req_free(&out);
	}
	struct ipc_req in, out;
	memset(&in, 0, sizeof(in));
	in.op = IPC_OP_STATS;
	memset(in.u.filter, 't', KVT_NAME_MAX - 1);
	req_roundtrip(&in, &out);
	T_EQ_STR(out.u.filter, in.u.filter);
	in.op = IPC_OP_CONFIG;
	snprintf(in.u.filter, sizeof(in.u.filter), "log_level");
	req_roundtrip(&in, &out);
	T_EQ_STR(out.u.filter, "log_level");
}

TEST(codec, encode_refuses_bad_fields)
{
	struct ipc_req q = hello_req();
	uint8_t *buf = NULL;
	size_t len = 0;
	memset(q.u.hello.name, 'x', sizeof(q.u.hello.name)); /* no NUL */
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL);
	q = hello_req();
	memset(q.u.hello.policy, 'x', sizeof(q.u.hello.policy));
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL);

	struct ipc_sync_item it = {.phase = 2};
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_SYNC;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL); /* n == 0 */
	q.u.sync.n = 1;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL); /* items NULL */
	q.u.sync.items = &it;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL); /* phase 2 */

	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_NONE;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL);
	q.op = IPC_OP_COUNT;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL);
	T_ERR(codec_req_encode(NULL, &buf, &len), KVT_EINVAL);

	struct ipc_rep r;
	memset(&r, 0, sizeof(r));
	r.err = 3; /* positive */
	T_ERR(codec_rep_encode(IPC_OP_BYE, &r, &buf, &len), KVT_EINVAL);
	r.err = 0;
	T_ERR(codec_rep_encode(IPC_OP_NONE, &r, &buf, &len), KVT_EINVAL);
	/* An error reply to a request whose op was unreadable still encodes,
	 * and decodes under any op. */
	codec_rep_error(&r, KVT_EPROTO, "garbage");
	T_OK(codec_rep_encode(IPC_OP_NONE, &r, &buf, &len));
	struct ipc_rep back;
	char why[128];
	T_OK(codec_rep_decode(IPC_OP_SYNC, buf, len, &back, why, sizeof(why)));
	T_EQ(back.err, KVT_EPROTO);
	T_EQ_STR(back.msg, "garbage");
	codec_rep_free(&back);
	free(buf);
	memset(&r, 0, sizeof(r));
	r.table.n = 1; /* rows NULL */
	T_ERR(codec_rep_encode(IPC_OP_STATS, &r, &buf, &len), KVT_EINVAL);
	r.table.n = IPC_MAX_ROWS + 1;
	T_ERR(codec_rep_encode(IPC_OP_STATS, &r, &buf, &len), KVT_EINVAL);

	struct ipc_row row;
	memset(&row, 0, sizeof(row));
	codec_row_u64(&row, "a", 1);
	codec_row_u64(&row, "a", 2); /* the decoder refuses duplicates */
	r.table.n = 1;
	r.table.rows = &row;
	T_ERR(codec_rep_encode(IPC_OP_STATS, &r, &buf, &len), KVT_EINVAL);
	row.n = 1;
	row.vals[0].type = (enum ipc_val_type)9;
	T_ERR(codec_rep_encode(IPC_OP_STATS, &r, &buf, &len), KVT_EINVAL);
}

/* ------------------------------------------------------------- replies */

TEST(codec, rep_hello_roundtrip)
{
	struct ipc_rep in, out;
	memset(&in, 0, sizeof(in));
	in.u.hello.tenant = 12;
	in.u.hello.token = 0xdeadbeefcafef00dull; /* overlaps table.rows */
	in.u.hello.max_seqs = 8;
	in.u.hello.max_tokens = 4096;
	in.u.hello.headroom = 16;
	in.u.hello.stage_tokens = 32;
	in.u.hello.page_tokens = 16;
	in.u.hello.quota_bytes = 1ull << 40;
	in.u.hello.inputs = KVT_INPUT_Q | KVT_INPUT_LSE;
	rep_roundtrip(IPC_OP_HELLO, &in, &out);
	T_EQ_STR(out.msg, "");
	T_EQ(out.u.hello.tenant, 12);
	T_EQ_U64(out.u.hello.token, 0xdeadbeefcafef00dull);
	T_EQ(out.u.hello.max_seqs, 8);
	T_EQ(out.u.hello.max_tokens, 4096);
	T_EQ(out.u.hello.headroom, 16);
	T_EQ(out.u.hello.stage_tokens, 32);
	T_EQ(out.u.hello.page_tokens, 16);
	T_EQ_U64(out.u.hello.quota_bytes, 1ull << 40);
	T_EQ(out.u.hello.inputs, KVT_INPUT_Q | KVT_INPUT_LSE);
	/* Must not free the token as if it were rows. */
	codec_rep_free(&out);
	T_EQ_U64(out.u.hello.token, 0xdeadbeefcafef00dull);
}

TEST(codec, rep_simple_ops_roundtrip)
{
	struct ipc_rep in, out;
	uint8_t *buf;
	size_t len;
	memset(&in, 0, sizeof(in));
	in.u.seq = UINT64_MAX;
	rep_roundtrip(IPC_OP_SEQ_OPEN, &in, &out);
	T_EQ_U64(out.u.seq, UINT64_MAX);

	/* (a sync reply's optional fields are 0 here: not encoded) */
	memset(&in, 0, sizeof(in));
	enum ipc_op bare[] = {IPC_OP_BYE, IPC_OP_SEQ_CLOSE, IPC_OP_SYNC};
	for (size_t i = 0; i < 3; i++) {
		T_OK(codec_rep_encode(bare[i], &in, &buf, &len));
		T_EQ(top_keys(buf, len), 2); /* v, e */
		free(buf);
		rep_roundtrip(bare[i], &in, &out);
		T_EQ_U64(out.u.seq, 0);
	}
}

TEST(codec, rep_rows_every_type)
{
	struct ipc_row rows[3];
	memset(rows, 0, sizeof(rows));
	codec_row_u64(&rows[0], "pages_used", UINT64_MAX);
	codec_row_i64(&rows[0], "delta", INT64_MIN);
	codec_row_i64(&rows[0], "small", -1);
	codec_row_i64(&rows[0], "nonneg", 5); /* comes back as U64 */
	codec_row_f64(&rows[0], "ratio", 0.3125);
	codec_row_f64(&rows[0], "neg", -1e300);
	codec_row_str(&rows[0], "name", "tenant-a");
	codec_row_str(&rows[0], "empty", "");
	char longv[IPC_STR_MAX];
	memset(longv, 's', sizeof(longv) - 1);
	longv[sizeof(longv) - 1] = 0;
	codec_row_str(&rows[0], "long", longv);
	/* row 1 stays empty; row 2 is full with the longest keys */
	for (uint32_t c = 0; c < IPC_MAX_COLS; c++) {
		char key[IPC_KEY_MAX];
		memset(key, 'k', sizeof(key) - 1);
		snprintf(key, sizeof(key), "%02u", c);
		key[2] = 'k';
		key[sizeof(key) - 1] = 0;
		codec_row_u64(&rows[2], key, c);
	}
	T_EQ(rows[2].n, IPC_MAX_COLS);

	struct ipc_rep in, out;
	memset(&in, 0, sizeof(in));
	in.table.n = 3;
	in.table.rows = rows;
	rep_roundtrip(IPC_OP_TENANTS, &in, &out);
	T_EQ(out.table.n, 3);
	const struct ipc_row *r = &out.table.rows[0];
	T_EQ(r->n, 9);
	const struct ipc_val *v;
	T_ASSERT((v = codec_row_get(r, "pages_used")) && v->type == IPC_VAL_U64);
	T_EQ_U64(v->v.u, UINT64_MAX);
	T_ASSERT((v = codec_row_get(r, "delta")) && v->type == IPC_VAL_I64);
	T_ASSERT(v->v.i == INT64_MIN);
	T_ASSERT((v = codec_row_get(r, "small")) && v->type == IPC_VAL_I64);
	T_EQ(v->v.i, -1);
	T_ASSERT((v = codec_row_get(r, "nonneg")) && v->type == IPC_VAL_U64);
	T_EQ(v->v.u, 5);
	T_ASSERT((v = codec_row_get(r, "ratio")) && v->type == IPC_VAL_F64);
	T_ASSERT(v->v.f == 0.3125);
	T_ASSERT((v = codec_row_get(r, "neg")) && v->v.f == -1e300);
	T_ASSERT((v = codec_row_get(r, "name")) && v->type == IPC_VAL_STR);
	T_EQ_STR(v->v.s, "tenant-a");
	T_ASSERT((v = codec_row_get(r, "empty")) && v->type == IPC_VAL_STR);
	T_EQ_STR(v->v.s, "");
	T_ASSERT((v = codec_row_get(r, "long")) && !strcmp(v->v.s, longv));
	T_ASSERT(codec_row_get(r, "absent") == NULL);
	T_EQ(out.table.rows[1].n, 0);
	T_EQ(out.table.rows[2].n, IPC_MAX_COLS);
	for (uint32_t c = 0; c < IPC_MAX_COLS; c++) {
		T_EQ_STR(out.table.rows[2].vals[c].key, rows[2].vals[c].key);
		T_EQ(out.table.rows[2].vals[c].v.u, c);
	}
	T_EQ_STR(out.msg, "");
	codec_rep_free(&out);
	T_ASSERT(out.table.rows == NULL && out.table.n == 0);
	codec_rep_free(&out);

	/* No rows at all is a valid table (no tenants registered). */
	memset(&in, 0, sizeof(in));
	for (int op = IPC_OP_STATS; op <= IPC_OP_CONFIG; op++) {
		rep_roundtrip((enum ipc_op)op, &in, &out);
		T_EQ(out.table.n, 0);
		codec_rep_free(&out);
	}
}

TEST(codec, rep_float32_and_signed_forms)
{
	/* Independent encoding using float32 and signed int formats for
	 * non-negative values: the decoder must normalise both. */
	struct mp m;
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	mp_s(&m, "e");
	msgpack_pack_int8(&m.pk, 0);
	mp_s(&m, "rows");
	mp_arr(&m, 1);
	mp_map(&m, 3);
	mp_s(&m, "f");
	msgpack_pack_float(&m.pk, 1.5f);
	mp_s(&m, "i");
	msgpack_pack_int32(&m.pk, 7);
	mp_s(&m, "n");
	msgpack_pack_int16(&m.pk, -300);
	struct ipc_rep r;
	char err[256];
	T_OK(codec_rep_decode(IPC_OP_STATS, (uint8_t *)m.sb.data, m.sb.size,
	                      &r, err, sizeof(err)));
	mp_free(&m);
	const struct ipc_row *row = &r.table.rows[0];
	T_EQ(codec_row_get(row, "f")->type, IPC_VAL_F64);
	T_ASSERT(codec_row_get(row, "f")->v.f == 1.5);
	T_EQ(codec_row_get(row, "i")->type, IPC_VAL_U64);
	T_EQ(codec_row_get(row, "i")->v.u, 7);
	T_EQ(codec_row_get(row, "n")->type, IPC_VAL_I64);
	T_EQ(codec_row_get(row, "n")->v.i, -300);
	codec_rep_free(&r);
}

TEST(codec, rep_error_every_op)
{
	for (int op = IPC_OP_HELLO; op < IPC_OP_COUNT; op++) {
		struct ipc_rep in, out;
		uint8_t *buf;
		size_t len;
		memset(&in, 0, sizeof(in));
		/* Payload set, yet an error reply carries only v, e, m. */
		in.u.hello.tenant = 9;
		in.u.seq = 99;
		codec_rep_error(&in, KVT_ELAYERS, "sync item 0: layer 40 >= 32");
		T_EQ(in.version, IPC_PROTO_VERSION);
		T_OK(codec_rep_encode((enum ipc_op)op, &in, &buf, &len));
		T_EQ(top_keys(buf, len), 3);
		free(buf);
		rep_roundtrip((enum ipc_op)op, &in, &out);
		T_EQ(out.err, KVT_ELAYERS);
		T_EQ_STR(out.msg, "sync item 0: layer 40 >= 32");
		T_EQ_U64(out.u.seq, 0);
		T_EQ(out.table.n, 0);
		codec_rep_free(&out);
	}
}

TEST(codec, rep_error_helper)
{
	struct ipc_rep r;
	memset(&r, 0, sizeof(r));
	codec_rep_error(&r, KVT_EQUOTA, NULL);
	T_EQ(r.err, KVT_EQUOTA);
	T_EQ_STR(r.msg, kvt_strerror(KVT_EQUOTA));
	char big[1000];
	memset(big, 'm', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	codec_rep_error(&r, KVT_EPROTO, big);
	T_EQ(strlen(r.msg), KVT_ERRTEXT_MAX - 1);

	/* An error code outside the known list still travels. */
	struct ipc_rep out;
	codec_rep_error(&r, -1000, "future");
	rep_roundtrip(IPC_OP_SYNC, &r, &out);
	T_EQ(out.err, -1000);

	/* On a decoded table, the rows go away first (no leak). */
	struct ipc_row row;
	memset(&row, 0, sizeof(row));
	codec_row_u64(&row, "x", 1);
	memset(&r, 0, sizeof(r));
	r.table.n = 1;
	r.table.rows = &row;
	rep_roundtrip(IPC_OP_STATS, &r, &out);
	codec_rep_error(&out, KVT_ESHUTDOWN, "bye");
	T_ASSERT(out.table.rows == NULL);
	T_EQ_STR(out.msg, "bye");
}

TEST(codec, row_helpers)
{
	struct ipc_row row;
	memset(&row, 0, sizeof(row));
	for (int i = 0; i < (int)IPC_MAX_COLS + 5; i++) {
		char key[16];
		snprintf(key, sizeof(key), "c%d", i);
		codec_row_u64(&row, key, (uint64_t)i);
	}
	T_EQ(row.n, IPC_MAX_COLS); /* extras silently dropped */
	T_ASSERT(codec_row_get(&row, "c63") != NULL);
	T_ASSERT(codec_row_get(&row, "c64") == NULL);

	memset(&row, 0, sizeof(row));
	char longk[200];
	memset(longk, 'k', sizeof(longk) - 1);
	longk[sizeof(longk) - 1] = 0;
	codec_row_str(&row, longk, longk); /* both truncated, terminated */
	T_EQ(strlen(row.vals[0].key), IPC_KEY_MAX - 1);
	T_EQ(strlen(row.vals[0].v.s), sizeof(longk) - 1);
	codec_row_str(&row, "nul", NULL);
	T_EQ_STR(codec_row_get(&row, "nul")->v.s, "");
	T_ASSERT(codec_row_get(NULL, "x") == NULL);
	codec_row_u64(NULL, "x", 1); /* ignored, no crash */
}

TEST(codec, free_on_zeroed_and_failed)
{
	struct ipc_req q;
	struct ipc_rep r;
	memset(&q, 0, sizeof(q));
	memset(&r, 0, sizeof(r));
	codec_req_free(&q);
	codec_rep_free(&r);
	codec_req_free(NULL);
	codec_rep_free(NULL);
	char err[64];
	T_ERR(codec_req_decode((const uint8_t *)"\x80", 1, &q, err,
	                       sizeof(err)), KVT_EPROTO);
	codec_req_free(&q);
	T_ERR(codec_rep_decode(IPC_OP_STATS, (const uint8_t *)"\x80", 1, &r,
	                       err, sizeof(err)), KVT_EPROTO);
	codec_rep_free(&r);
	/* NULL err buffer is allowed. */
	T_ERR(codec_req_decode((const uint8_t *)"\x80", 1, &q, NULL, 0),
	      KVT_EPROTO);
	T_ERR(codec_rep_decode(IPC_OP_NONE, (const uint8_t *)"\x80", 1, &r,
	                       err, sizeof(err)), KVT_EINVAL);
}

/* ------------------------------------------------------------- bytes */

TEST(codec, exact_bytes_of_a_request)
{
	struct ipc_req q;
	uint8_t *buf;
	size_t len;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_SEQ_CLOSE;
	q.tenant = 5;
	q.token = 300;
	q.u.seq = 7;
	T_OK(codec_req_encode(&q, &buf, &len));
	static const uint8_t want[] = {
		0x85,                               /* map of 5 */
		0xa1, 'v', 0x03,                    /* "v": 3 */
		0xa2, 'o', 'p', 0xa9, 's', 'e', 'q', '_', 'c', 'l', 'o', 's',
		'e',                                /* "op": "seq_close" */
		0xa1, 't', 0x05,                    /* "t": 5 */
		0xa1, 'k', 0xcd, 0x01, 0x2c,        /* "k": uint16 300 */
		0xa3, 's', 'e', 'q', 0x07,          /* "seq": 7 */
	};
	T_EQ(len, sizeof(want));
	T_ASSERT(!memcmp(buf, want, len));
	free(buf);

	/* Same bytes built by hand decode to the same request. */
	struct ipc_req out;
	T_OK(codec_req_decode(want, sizeof(want), &out, NULL, 0));
	T_EQ(out.op, IPC_OP_SEQ_CLOSE);
	T_EQ(out.tenant, 5);
	T_EQ(out.token, 300);
	T_EQ(out.u.seq, 7);
}

TEST(codec, exact_bytes_of_an_error_reply)
{
	struct ipc_rep r;
	uint8_t *buf;
	size_t len;
	memset(&r, 0, sizeof(r));
	codec_rep_error(&r, KVT_ESTALE, "old");
	T_OK(codec_rep_encode(IPC_OP_SYNC, &r, &buf, &len));
	static const uint8_t want[] = {
		0x83, 0xa1, 'v', 0x03, 0xa1, 'e', 0xf6, /* -10 negative fixint */
		0xa1, 'm', 0xa3, 'o', 'l', 'd',
	};
	T_EQ(len, sizeof(want));
	T_ASSERT(!memcmp(buf, want, len));
	free(buf);
}

TEST(codec, handbuilt_hello_any_key_order)
{
	/* Keys in reverse order and signed int formats for small values. */
	struct mp m;
	mp_init(&m);
	mp_map(&m, 14);
	mp_ku(&m, "pid", 1);
	mp_ku(&m, "cookie", UINT64_MAX);
	mp_ku(&m, "quota", 0);
	mp_ks(&m, "policy", "h2o");
	mp_s(&m, "stage");
	msgpack_pack_int64(&m.pk, 8);
	mp_ku(&m, "head", 16);
	mp_ku(&m, "maxtok", 2048);
	mp_ku(&m, "seqs", 4);
	mp_ku(&m, "page", 16);
	mp_ku(&m, "dtype", 1);
	mp_s(&m, "geo");
	mp_arr(&m, 5);
	mp_u(&m, 2);
	mp_u(&m, 4);
	mp_u(&m, 2);
	mp_u(&m, 64);
	mp_u(&m, 256);
	mp_ks(&m, "name", "tiny");
	mp_ks(&m, "op", "hello");
	mp_ku(&m, "v", IPC_PROTO_VERSION);
	struct ipc_req q;
	accept_req(&m, &q);
	T_EQ(q.op, IPC_OP_HELLO);
	T_EQ_STR(q.u.hello.name, "tiny");
	T_EQ_STR(q.u.hello.policy, "h2o");
	T_EQ(q.u.hello.geo.head_dim, 64);
	T_EQ(q.u.hello.geo.d_model, 256);
	T_EQ(q.u.hello.stage_tokens, 8);
	T_EQ_U64(q.u.hello.cookie, UINT64_MAX);
	T_EQ(q.u.hello.pid, 1);
}

TEST(codec, peek_op)
{
	struct ipc_req q = hello_req();
	uint8_t *buf;
	size_t len;
	T_OK(codec_req_encode(&q, &buf, &len));
	T_EQ(codec_peek_op(buf, len), IPC_OP_HELLO);
	/* "op" is the second key; damage after it does not matter. */
	T_EQ(codec_peek_op(buf, 13), IPC_OP_HELLO);
	T_EQ(codec_peek_op(buf, 12), IPC_OP_NONE);
	T_EQ(codec_peek_op(buf, 5), IPC_OP_NONE);
	free(buf);

	struct mp m;
	mp_init(&m);
	mp_map(&m, 3);
	mp_ku(&m, "v", 99); /* wrong version: still peeked */
	mp_s(&m, "junk");
	mp_arr(&m, 2);
	mp_map(&m, 0);
	mp_s(&m, "x");
	mp_ks(&m, "op", "sync");
	T_EQ(codec_peek_op((uint8_t *)m.sb.data, m.sb.size), IPC_OP_SYNC);
	mp_free(&m);

	mp_req(&m, 2, "reboot");
	T_EQ(codec_peek_op((uint8_t *)m.sb.data, m.sb.size), IPC_OP_NONE);
	mp_free(&m);
	T_EQ(codec_peek_op((const uint8_t *)"\x92\x01\x02", 3), IPC_OP_NONE);
	T_EQ(codec_peek_op((const uint8_t *)"\xdf\xff\xff\xff\xff", 5),
	     IPC_OP_NONE);
	T_EQ(codec_peek_op(NULL, 0), IPC_OP_NONE);
}

/* ------------------------------------------------------------- refusals */

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
	refuse_req(&m, KVT_EVERSION, "protocol version 2, this side speaks 3");

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
	refuse_rep(IPC_OP_STATS, &m, KVT_EPROTO, "65 columns");
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

/* ------------------------------------------------------------- mutations */

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
