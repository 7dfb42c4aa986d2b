/*
 * codec_test.c — the control-message codec: op names, round trips of every
 * request and reply, and byte facts checked against an independent
 * encoding built with msgpack-c's packer (codec_fixture.h).  Refusals are
 * in codec_refuse*_test.c, the mutation loop in codec_mutation_test.c.
 */
#include "codec_fixture.h"
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
	/* 96 columns (ipc/codec.h): c0..c95 kept, c96 on dropped */
	T_ASSERT(codec_row_get(&row, "c95") != NULL);
	T_ASSERT(codec_row_get(&row, "c96") == NULL);

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
		0xa1, 'v', 0x04,                    /* "v": 4 */
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
		0x83, 0xa1, 'v', 0x04, 0xa1, 'e', 0xf6, /* -10 negative fixint */
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
