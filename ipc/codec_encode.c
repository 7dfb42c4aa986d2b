/*
 * codec_encode.c — msgpack encoding of control messages: a body is written
 * by walking its table (codec_int.h) after the same table's checks refused
 * whatever the decoder would refuse; see codec.h for the wire format.
 */
#include "codec_int.h"

#include <msgpack.h>
#include <stdbool.h>
#include <string.h>

struct enc {
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int bad; /* a pack call failed: out of memory */
};

static void enc_init(struct enc *e)
{
	msgpack_sbuffer_init(&e->sb);
	msgpack_packer_init(&e->pk, &e->sb, msgpack_sbuffer_write);
	e->bad = 0;
}

static void e_str(struct enc *e, const char *s)
{
	size_t n = strlen(s);
	if (msgpack_pack_str(&e->pk, n) || msgpack_pack_str_body(&e->pk, s, n))
		e->bad = 1;
}

static void e_uint(struct enc *e, uint64_t v)
{
	if (msgpack_pack_uint64(&e->pk, v))
		e->bad = 1;
}

static void e_map(struct enc *e, size_t n)
{
	if (msgpack_pack_map(&e->pk, n))
		e->bad = 1;
}

static void e_array(struct enc *e, size_t n)
{
	if (msgpack_pack_array(&e->pk, n))
		e->bad = 1;
}

static void kv_u(struct enc *e, const char *k, uint64_t v)
{
	e_str(e, k);
	e_uint(e, v);
}

static void kv_s(struct enc *e, const char *k, const char *v)
{
	e_str(e, k);
	e_str(e, v);
}

static int enc_finish(struct enc *e, uint8_t **out, size_t *len)
{
	if (e->bad) {
		msgpack_sbuffer_destroy(&e->sb);
		return KVT_ENOMEM;
	}
	/* Mirrors the decoder: what one side cannot receive is not sent. */
	if (e->sb.size > IPC_MAX_MSG) {
		msgpack_sbuffer_destroy(&e->sb);
		return KVT_ETOOBIG;
	}
	*len = e->sb.size;
	*out = (uint8_t *)msgpack_sbuffer_release(&e->sb);
	return *out ? 0 : KVT_ENOMEM;
}

/* A C string that fits its field with its NUL (so no embedded NUL either). */
static bool fits(const char *s, size_t cap)
{
	return strnlen(s, cap) < cap;
}

static int check_row(const struct ipc_row *row);

/* Refuses (KVT_EINVAL) what the decoder would refuse of table f. */
static int check_fields(const struct codec_field *f, const void *base)
{
	for (; f && f->key; f++) {
		const char *p = (const char *)base + f->off;
		switch ((enum codec_field_kind)f->kind) {
		case F_UINT:
			if (codec_field_get(f, base) > f->max)
				return KVT_EINVAL;
			break;
		case F_STR:
			if (!fits(p, f->size))
				return KVT_EINVAL;
			break;
		case F_NONEMPTY:
			if (!p[0])
				return KVT_EINVAL;
			break;
		case F_GEO:
			break;
		case F_ITEMS: {
			const struct ipc_req *req = base;
			if (!req->u.sync.n ||
			    req->u.sync.n > IPC_MAX_SYNC_ITEMS ||
			    !req->u.sync.items)
				return KVT_EINVAL;
			for (uint32_t i = 0; i < req->u.sync.n; i++)
				if (req->u.sync.items[i].phase >
				    KVT_PHASE_DECODE)
					return KVT_EINVAL;
			break;
		}
		case F_ROWS: {
			const struct ipc_rep *rep = base;
			int rc;
			if (rep->table.n > IPC_MAX_ROWS ||
			    (rep->table.n && !rep->table.rows))
				return KVT_EINVAL;
			for (uint32_t i = 0; i < rep->table.n; i++)
				if ((rc = check_row(&rep->table.rows[i])))
					return rc;
			break;
		}
		}
	}
	return 0;
}

/* Is the field of table row f encoded?  Optional ones only when not 0 / "". */
static bool field_sent(const struct codec_field *f, const void *base)
{
	if (f->kind == F_NONEMPTY)
		return false;
	if (!(f->flags & F_OPT))
		return true;
	if (f->kind == F_STR)
		return ((const char *)base + f->off)[0] != 0;
	return codec_field_get(f, base) != 0;
}

static size_t count_fields(const struct codec_field *f, const void *base)
{
	size_t n = 0;
	for (; f && f->key; f++)
		n += field_sent(f, base);
	return n;
}

static void e_row(struct enc *e, const struct ipc_row *row);

/* Writes the keys of table f from base, in table order. */
static void enc_fields(struct enc *e, const struct codec_field *f,
                       const void *base)
{
	for (; f && f->key; f++) {
		const char *p = (const char *)base + f->off;
		if (!field_sent(f, base))
			continue;
		e_str(e, f->key);
		switch ((enum codec_field_kind)f->kind) {
		case F_UINT:
			e_uint(e, codec_field_get(f, base));
			break;
		case F_STR:
			e_str(e, p);
			break;
		case F_GEO:
			e_array(e, CODEC_GEO_N);
			for (size_t i = 0; i < CODEC_GEO_N; i++)
				e_uint(e, codec_field_get(&codec_geo_fields[i],
				                          p));
			break;
		case F_ITEMS: {
			const struct ipc_req *req = base;
			e_array(e, req->u.sync.n);
			for (uint32_t i = 0; i < req->u.sync.n; i++) {
				/* headroom, the last field, only when set */
				size_t nf = req->u.sync.items[i].headroom
				                    ? CODEC_ITEM_N
				                    : CODEC_ITEM_MIN;
				e_array(e, (uint32_t)nf);
				for (size_t k = 0; k < nf; k++)
					e_uint(e, codec_field_get(
						&codec_item_fields[k],
						&req->u.sync.items[i]));
			}
			break;
		}
		case F_ROWS: {
			const struct ipc_rep *rep = base;
			e_array(e, rep->table.n);
			for (uint32_t i = 0; i < rep->table.n; i++)
				e_row(e, &rep->table.rows[i]);
			break;
		}
		case F_NONEMPTY:
			break;
		}
	}
}

/*
 * Always writes IPC_PROTO_VERSION (req->version is ignored): an encoder
 * speaks its own version.  Admin ops carry "t"/"k" only when either is
 * nonzero; stats/config carry their filter only when it is not "".
 */
int codec_req_encode(const struct ipc_req *req, uint8_t **out, size_t *len)
{
	struct enc e;
	int rc;

	if (!req || !out || !len || !codec_op_valid(req->op))
		return KVT_EINVAL;
	const struct codec_field *body = codec_req_fields[req->op];
	if ((rc = check_fields(body, req)))
		return rc;
	bool creds = codec_op_needs_creds(req->op) ||
	             (codec_op_is_admin(req->op) &&
	              (req->tenant || req->token));

	enc_init(&e);
	e_map(&e, 2 + (creds ? 2 : 0) + count_fields(body, req));
	kv_u(&e, "v", IPC_PROTO_VERSION);
	kv_s(&e, "op", codec_op_names[req->op]);
	if (creds) {
		kv_u(&e, "t", req->tenant);
		kv_u(&e, "k", req->token);
	}
	enc_fields(&e, body, req);
	return enc_finish(&e, out, len);
}

static int check_row(const struct ipc_row *row)
{
	if (row->n > IPC_MAX_COLS)
		return KVT_EINVAL;
	for (uint32_t i = 0; i < row->n; i++) {
		const struct ipc_val *v = &row->vals[i];
		if (!fits(v->key, sizeof(v->key)))
			return KVT_EINVAL;
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(row->vals[j].key, v->key))
				return KVT_EINVAL; /* the decoder would refuse */
		switch (v->type) {
		case IPC_VAL_U64:
		case IPC_VAL_I64:
		case IPC_VAL_F64:
			break;
		case IPC_VAL_STR:
			if (!fits(v->v.s, sizeof(v->v.s)))
				return KVT_EINVAL;
			break;
		default:
			return KVT_EINVAL;
		}
	}
	return 0;
}

static void e_row(struct enc *e, const struct ipc_row *row)
{
	e_map(e, row->n);
	for (uint32_t i = 0; i < row->n; i++) {
		const struct ipc_val *v = &row->vals[i];
		e_str(e, v->key);
		switch (v->type) {
		case IPC_VAL_U64:
			e_uint(e, v->v.u);
			break;
		case IPC_VAL_I64:
			/* Non-negative values go out as positive ints and so
			 * come back as IPC_VAL_U64: msgpack has one int type. */
			if (msgpack_pack_int64(&e->pk, v->v.i))
				e->bad = 1;
			break;
		case IPC_VAL_F64:
			if (msgpack_pack_double(&e->pk, v->v.f))
				e->bad = 1;
			break;
		case IPC_VAL_STR:
			e_str(e, v->v.s);
			break;
		}
	}
}

/*
 * An error reply (err != 0) is v, e, m whatever the op; a success reply is
 * v, e and the op's payload, never m.
 */
int codec_rep_encode(enum ipc_op op, const struct ipc_rep *rep, uint8_t **out,
                     size_t *len)
{
	struct enc e;
	int rc;

	if (!rep || !out || !len || rep->err > 0)
		return KVT_EINVAL;
	/* Error replies carry no op payload, so they encode even for a
	 * request whose op could not be read (the daemon must still answer). */
	if (rep->err) {
		if (!fits(rep->msg, sizeof(rep->msg)))
			return KVT_EINVAL;
		enc_init(&e);
		e_map(&e, 3);
		kv_u(&e, "v", IPC_PROTO_VERSION);
		e_str(&e, "e");
		if (msgpack_pack_int32(&e.pk, rep->err))
			e.bad = 1;
		kv_s(&e, "m", rep->msg);
		return enc_finish(&e, out, len);
	}
	if (!codec_op_valid(op))
		return KVT_EINVAL;
	const struct codec_field *body = codec_rep_fields[op];
	if ((rc = check_fields(body, rep)))
		return rc;
	enc_init(&e);
	e_map(&e, 2 + count_fields(body, rep));
	kv_u(&e, "v", IPC_PROTO_VERSION);
	kv_u(&e, "e", 0);
	enc_fields(&e, body, rep);
	return enc_finish(&e, out, len);
}
