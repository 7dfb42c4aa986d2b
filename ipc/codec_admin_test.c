/*
 * codec_admin_test.c — the admin ops added for operators: "drain" and
 * "config_set".  Round trips, the exact bytes against msgpack-c's packer,
 * refusals with their codes, and the encoder's own checks.
 */
#include <msgpack.h>

#include "codec.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

struct mpa {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void mpa_init(struct mpa *m)
{
	msgpack_sbuffer_init(&m->sb);
	msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void mpa_s(struct mpa *m, const char *s)
{
	msgpack_pack_str(&m->pk, strlen(s));
	msgpack_pack_str_body(&m->pk, s, strlen(s));
}

static void mpa_ku(struct mpa *m, const char *k, uint64_t v)
{
	mpa_s(m, k);
	msgpack_pack_uint64(&m->pk, v);
}

static void mpa_ks(struct mpa *m, const char *k, const char *v)
{
	mpa_s(m, k);
	mpa_s(m, v);
}

/* A request map of n keys starting with v and op. */
static void mpa_req(struct mpa *m, size_t n, const char *op)
{
	mpa_init(m);
	msgpack_pack_map(&m->pk, n);
	mpa_ku(m, "v", IPC_PROTO_VERSION);
	mpa_ks(m, "op", op);
}

static int mpa_decode(struct mpa *m, struct ipc_req *r, char *err,
                      size_t errlen)
{
	int rc = codec_req_decode((const uint8_t *)m->sb.data, m->sb.size, r,
	                          err, errlen);
	msgpack_sbuffer_destroy(&m->sb);
	return rc;
}

static void refuse_(struct mpa *m, int code, const char *want,
                    const char *file, int line)
{
	struct ipc_req r;
	char err[256] = "";
	int rc = mpa_decode(m, &r, err, sizeof(err));
	codec_req_free(&r);
	if (rc != code)
		th_fail(file, line, "decode gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (want && !strstr(err, want))
		th_fail(file, line, "reason \"%s\" lacks \"%s\"", err, want);
}
#define refuse(m, code, want) refuse_(m, code, want, __FILE__, __LINE__)

/* Encodes q, checks the bytes equal m's, decodes them back into *out. */
static void same_bytes_(const struct ipc_req *q, struct mpa *m,
                        struct ipc_req *out, const char *file, int line)
{
	uint8_t *buf;
	size_t len;
	char err[256] = "";
	int rc = codec_req_encode(q, &buf, &len);
	if (rc)
		th_fail(file, line, "encode gave %s", kvt_errname(rc));
	if (len != m->sb.size || memcmp(buf, m->sb.data, len))
		th_fail(file, line, "encoding differs from msgpack-c's "
		        "(%zu vs %zu bytes)", len, m->sb.size);
	msgpack_sbuffer_destroy(&m->sb);
	rc = codec_req_decode(buf, len, out, err, sizeof(err));
	free(buf);
	if (rc)
		th_fail(file, line, "decode gave %s: %s", kvt_errname(rc), err);
}
#define same_bytes(q, m, out) same_bytes_(q, m, out, __FILE__, __LINE__)

/* ---------------------------------------------------------------- tests */

TEST(codec_admin, names_and_admin_class)
{
	T_EQ_STR(codec_op_name(IPC_OP_DRAIN), "drain");
	T_EQ_STR(codec_op_name(IPC_OP_CONFIG_SET), "config_set");
	T_ASSERT(codec_op_is_admin(IPC_OP_DRAIN));
	T_ASSERT(codec_op_is_admin(IPC_OP_CONFIG_SET));
	/* Appended after the older ops: their numbering did not move. */
	T_ASSERT(IPC_OP_DRAIN > IPC_OP_CONFIG);
	T_ASSERT(IPC_OP_CONFIG_SET > IPC_OP_DRAIN);
	T_ASSERT(IPC_OP_SEQ_QUERY > IPC_OP_CONFIG_SET);
	T_EQ(IPC_OP_COUNT, IPC_OP_SEQ_QUERY + 1);
}

TEST(codec_admin, drain_round_trip_and_bytes)
{
	struct ipc_req q, out;
	struct mpa m;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_DRAIN;
	snprintf(q.u.drain.tenant, sizeof(q.u.drain.tenant), "engine-a");
	/* undo 0 is left off the wire. */
	mpa_req(&m, 3, "drain");
	mpa_ks(&m, "tenant", "engine-a");
	same_bytes(&q, &m, &out);
	T_EQ(out.op, IPC_OP_DRAIN);
	T_EQ_STR(out.u.drain.tenant, "engine-a");
	T_EQ(out.u.drain.undo, 0);
	T_EQ(out.tenant, 0);
	codec_req_free(&out);

	q.u.drain.undo = 1;
	mpa_req(&m, 4, "drain");
	mpa_ks(&m, "tenant", "engine-a");
	mpa_ku(&m, "undo", 1);
	same_bytes(&q, &m, &out);
	T_EQ(out.u.drain.undo, 1);
	codec_req_free(&out);

	/* Admin ops may carry credentials; they round-trip too. */
	q.tenant = 3;
	q.token = 77;
	uint8_t *buf;
	size_t len;
	char err[256];
	T_OK(codec_req_encode(&q, &buf, &len));
	T_OK(codec_req_decode(buf, len, &out, err, sizeof(err)));
	T_EQ(out.tenant, 3);
	T_EQ_U64(out.token, 77);
	T_EQ_STR(codec_op_name(codec_peek_op(buf, len)), "drain");
	free(buf);
	codec_req_free(&out);
}

TEST(codec_admin, config_set_round_trip_and_bytes)
{
	struct ipc_req q, out;
	struct mpa m;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_CONFIG_SET;
	snprintf(q.u.set.key, sizeof(q.u.set.key), "log_level");
	snprintf(q.u.set.value, sizeof(q.u.set.value), "debug");
	mpa_req(&m, 4, "config_set");
	mpa_ks(&m, "key", "log_level");
	mpa_ks(&m, "value", "debug");
	same_bytes(&q, &m, &out);
	T_EQ(out.op, IPC_OP_CONFIG_SET);
	T_EQ_STR(out.u.set.key, "log_level");
	T_EQ_STR(out.u.set.value, "debug");
	codec_req_free(&out);

	/* An empty value is legal (allow_uids = ""); the longest fits. */
	q.u.set.value[0] = '\0';
	mpa_req(&m, 4, "config_set");
	mpa_ks(&m, "key", "log_level");
	mpa_ks(&m, "value", "");
	same_bytes(&q, &m, &out);
	T_EQ_STR(out.u.set.value, "");
	codec_req_free(&out);
	memset(q.u.set.value, 'v', IPC_STR_MAX - 1);
	q.u.set.value[IPC_STR_MAX - 1] = '\0';
	uint8_t *buf;
	size_t len;
	char err[256];
	T_OK(codec_req_encode(&q, &buf, &len));
	T_OK(codec_req_decode(buf, len, &out, err, sizeof(err)));
	T_EQ(strlen(out.u.set.value), IPC_STR_MAX - 1);
	free(buf);
	codec_req_free(&out);
}

TEST(codec_admin, drain_refusals)
{
	struct mpa m;
	char longname[KVT_NAME_MAX + 1];
	memset(longname, 'n', KVT_NAME_MAX);
	longname[KVT_NAME_MAX] = '\0';

	mpa_req(&m, 2, "drain");
	refuse(&m, KVT_EPROTO, "missing key \"tenant\"");

	mpa_req(&m, 3, "drain");
	mpa_ks(&m, "tenant", "");
	refuse(&m, KVT_EPROTO, "tenant is empty");

	mpa_req(&m, 3, "drain");
	mpa_ks(&m, "tenant", longname);
	refuse(&m, KVT_EPROTO, "too long");

	mpa_req(&m, 3, "drain");
	mpa_ku(&m, "tenant", 5);
	refuse(&m, KVT_EPROTO, "not a string");

	mpa_req(&m, 4, "drain");
	mpa_ks(&m, "tenant", "a");
	mpa_ku(&m, "undo", 2);
	refuse(&m, KVT_EPROTO, "undo");

	mpa_req(&m, 4, "drain");
	mpa_ks(&m, "tenant", "a");
	mpa_ks(&m, "undo", "yes");
	refuse(&m, KVT_EPROTO, "undo");

	mpa_req(&m, 4, "drain");
	mpa_ks(&m, "tenant", "a");
	mpa_ku(&m, "force", 1);
	refuse(&m, KVT_EPROTO, "force");

	/* Half a credential pair is refused like for the other admin ops. */
	mpa_req(&m, 4, "drain");
	mpa_ks(&m, "tenant", "a");
	mpa_ku(&m, "t", 1);
	refuse(&m, KVT_EPROTO, "\"k\"");
}

TEST(codec_admin, config_set_refusals)
{
	struct mpa m;
	char longval[IPC_STR_MAX + 1];
	memset(longval, 'v', IPC_STR_MAX);
	longval[IPC_STR_MAX] = '\0';

	mpa_req(&m, 3, "config_set");
	mpa_ks(&m, "key", "log_level");
	refuse(&m, KVT_EPROTO, "missing key \"value\"");

	mpa_req(&m, 3, "config_set");
	mpa_ks(&m, "value", "debug");
	refuse(&m, KVT_EPROTO, "missing key \"key\"");

	mpa_req(&m, 4, "config_set");
	mpa_ks(&m, "key", "");
	mpa_ks(&m, "value", "debug");
	refuse(&m, KVT_EPROTO, "key is empty");

	mpa_req(&m, 4, "config_set");
	mpa_ks(&m, "key", "log_level");
	mpa_ks(&m, "value", longval);
	refuse(&m, KVT_EPROTO, "too long");

	mpa_req(&m, 4, "config_set");
	mpa_ks(&m, "key", "log_level");
	mpa_ku(&m, "value", 7);
	refuse(&m, KVT_EPROTO, "not a string");

	mpa_req(&m, 5, "config_set");
	mpa_ks(&m, "key", "log_level");
	mpa_ks(&m, "value", "debug");
	mpa_ks(&m, "filter", "x");
	refuse(&m, KVT_EPROTO, "filter");

	/* A value with a NUL inside cannot be a C string. */
	mpa_req(&m, 4, "config_set");
	mpa_ks(&m, "key", "log_level");
	mpa_s(&m, "value");
	msgpack_pack_str(&m.pk, 3);
	msgpack_pack_str_body(&m.pk, "a\0b", 3);
	refuse(&m, KVT_EPROTO, "NUL");
}

TEST(codec_admin, encoder_refuses_what_the_decoder_would)
{
	struct ipc_req q;
	uint8_t *buf = NULL;
	size_t len;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_DRAIN;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL); /* no tenant */
	snprintf(q.u.drain.tenant, sizeof(q.u.drain.tenant), "a");
	q.u.drain.undo = 2;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL);
	memset(q.u.drain.tenant, 'x', sizeof(q.u.drain.tenant)); /* no NUL */
	q.u.drain.undo = 0;
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL);

	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_CONFIG_SET;
	snprintf(q.u.set.value, sizeof(q.u.set.value), "debug");
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL); /* no key */
	snprintf(q.u.set.key, sizeof(q.u.set.key), "log_level");
	memset(q.u.set.value, 'x', sizeof(q.u.set.value));
	T_ERR(codec_req_encode(&q, &buf, &len), KVT_EINVAL);
	T_ASSERT(buf == NULL);
}

TEST(codec_admin, replies_are_tables)
{
	struct ipc_rep in, out;
	uint8_t *buf;
	size_t len;
	char err[256];
	for (int op = IPC_OP_DRAIN; op <= IPC_OP_CONFIG_SET; op++) {
		memset(&in, 0, sizeof(in));
		in.table.rows = calloc(2, sizeof(struct ipc_row));
		in.table.n = 2;
		codec_row_u64(&in.table.rows[0], "id", 4);
		codec_row_str(&in.table.rows[0], "name", "engine-a");
		codec_row_u64(&in.table.rows[0], "draining", 1);
		codec_row_str(&in.table.rows[1], "key", "log_level");
		T_OK(codec_rep_encode((enum ipc_op)op, &in, &buf, &len));
		T_OK(codec_rep_decode((enum ipc_op)op, buf, len, &out, err,
		                      sizeof(err)));
		free(buf);
		T_EQ(out.err, 0);
		T_EQ(out.table.n, 2);
		T_EQ_STR(codec_row_get(&out.table.rows[0], "name")->v.s,
		         "engine-a");
		T_EQ(codec_row_get(&out.table.rows[0], "draining")->v.u, 1);
		codec_rep_free(&in);
		codec_rep_free(&out);

		/* Error replies: v, e, m whatever the op. */
		memset(&in, 0, sizeof(in));
		codec_rep_error(&in, KVT_EPERM, "drain refused: uid 7");
		T_OK(codec_rep_encode((enum ipc_op)op, &in, &buf, &len));
		T_OK(codec_rep_decode((enum ipc_op)op, buf, len, &out, err,
		                      sizeof(err)));
		free(buf);
		T_EQ(out.err, KVT_EPERM);
		T_EQ_STR(out.msg, "drain refused: uid 7");
		codec_rep_free(&out);
	}
}
