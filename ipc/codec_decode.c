/*
 * codec_decode.c — strict decoding of control messages; see codec.h for
 * the contract and codec_int.h for the message tables.
 *
 * Three steps: codec_scan_obj() walks the raw bytes once without
 * allocating, proving one well-formed object, bounding nesting, checking
 * every container's count against the bytes left (msgpack-c allocates
 * from the header count) and stopping at the most objects a valid message
 * holds; msgpack_unpack_next() builds the tree (strings point into the
 * caller's buffer); the tree is checked key by key ("v" first, then key
 * types and duplicates, then "op" and its table's keys; an unmarked key
 * is refused).  Any failure frees what was allocated and leaves the
 * output zeroed, so *_free() on it is a no-op.
 */
#include "codec_int.h"

#include <inttypes.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dec {
	const msgpack_object_kv *kv; /* top-level map entries */
	uint32_t n;
	uint64_t used; /* bit i: entry i was taken */
	char *err;
	size_t errlen;
};

__attribute__((format(printf, 3, 4)))
static int fail(struct dec *d, int code, const char *fmt, ...)
{
	if (d->err && d->errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(d->err, d->errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* A peer's bytes made printable for an error line: at most 40 characters,
 * control and non-ASCII bytes shown as '?'. */
static const char *shown(char *dst, size_t cap, const char *s, size_t n)
{
	size_t o = 0;
	for (size_t i = 0; i < n && o + 4 < cap && i < 40; i++)
		dst[o++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	if (n > 40 && o + 4 < cap) {
		memcpy(dst + o, "...", 3);
		o += 3;
	}
	dst[o] = 0;
	return dst;
}

static const char *type_name(msgpack_object_type t)
{
	switch (t) {
	case MSGPACK_OBJECT_NIL: return "nil";
	case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return "an unsigned integer";
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "a negative integer";
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: return "a float";
	case MSGPACK_OBJECT_STR: return "a string";
	case MSGPACK_OBJECT_ARRAY: return "an array";
	case MSGPACK_OBJECT_MAP: return "a map";
	case MSGPACK_OBJECT_BIN: return "binary";
	case MSGPACK_OBJECT_EXT: return "an extension";
	}
	return "an unknown type";
}

static bool str_is(const msgpack_object *o, const char *s)
{
	size_t n = strlen(s);
	return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
	       !memcmp(o->via.str.ptr, s, n);
}

/* Value of top-level key, marking it taken; NULL when absent. */
static const msgpack_object *take(struct dec *d, const char *key)
{
	for (uint32_t i = 0; i < d->n; i++)
		if (str_is(&d->kv[i].key, key)) {
			d->used |= (uint64_t)1 << i;
			return &d->kv[i].val;
		}
	return NULL;
}

static bool has(const struct dec *d, const char *key)
{
	for (uint32_t i = 0; i < d->n; i++)
		if (str_is(&d->kv[i].key, key))
			return true;
	return false;
}

static int as_uint(struct dec *d, const msgpack_object *o, uint64_t max,
                   uint64_t *out, const char *what)
{
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		return fail(d, KVT_EPROTO, "%s is negative (%" PRId64 ")", what,
		            o->via.i64);
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return fail(d, KVT_EPROTO,
		            "%s is not an unsigned integer (got %s)", what,
		            type_name(o->type));
	if (o->via.u64 > max)
		return fail(d, KVT_EPROTO,
		            "%s is out of range (%" PRIu64 " > %" PRIu64 ")", what,
		            o->via.u64, max);
	*out = o->via.u64;
	return 0;
}

static int as_str(struct dec *d, const msgpack_object *o, char *dst,
                  size_t cap, const char *what)
{
	if (o->type != MSGPACK_OBJECT_STR)
		return fail(d, KVT_EPROTO, "%s is not a string (got %s)", what,
		            type_name(o->type));
	if (o->via.str.size >= cap)
		return fail(d, KVT_EPROTO,
		            "%s is too long (%" PRIu32 " bytes, at most %zu)",
		            what, o->via.str.size, cap - 1);
	if (memchr(o->via.str.ptr, 0, o->via.str.size))
		return fail(d, KVT_EPROTO, "%s contains a NUL byte", what);
	memcpy(dst, o->via.str.ptr, o->via.str.size);
	dst[o->via.str.size] = 0;
	return 0;
}

static int missing(struct dec *d, const char *key)
{
	return fail(d, KVT_EPROTO, "missing key \"%s\"", key);
}

static int key_u64(struct dec *d, const char *key, uint64_t *out)
{
	const msgpack_object *o = take(d, key);
	return o ? as_uint(d, o, UINT64_MAX, out, key) : missing(d, key);
}

static int key_u32(struct dec *d, const char *key, uint32_t *out)
{
	const msgpack_object *o = take(d, key);
	uint64_t v = 0;
	if (!o)
		return missing(d, key);
	int rc = as_uint(d, o, UINT32_MAX, &v, key);
	if (!rc)
		*out = (uint32_t)v;
	return rc;
}

static int key_str(struct dec *d, const char *key, char *dst, size_t cap,
                   bool required)
{
	const msgpack_object *o = take(d, key);
	if (!o)
		return required ? missing(d, key) : 0;
	return as_str(d, o, dst, cap, key);
}

/* Refuses any top-level key no step took. */
static int no_unknown_keys(struct dec *d, const char *opname)
{
	char tmp[48];
	for (uint32_t i = 0; i < d->n; i++)
		if (!(d->used & ((uint64_t)1 << i))) {
			const msgpack_object *k = &d->kv[i].key;
			return fail(d, KVT_EPROTO,
			            "unknown key \"%s\" for op %s",
			            shown(tmp, sizeof(tmp), k->via.str.ptr,
			                  k->via.str.size),
			            opname);
		}
	return 0;
}

/*
 * The checks every message shares: size, well-formed single object, a map,
 * "v" (before anything about keys, so a peer of another version gets
 * KVT_EVERSION even if its keys differ), no trailing bytes, string keys
 * without duplicates.  On success up holds the tree and d its entries.
 */
static int open_msg(struct dec *d, msgpack_unpacked *up, const uint8_t *buf,
                    size_t len, uint64_t objs_max)
{
	const char *why = NULL;
	size_t end = 0, off = 0;
	uint64_t left = objs_max;
	char tmp[48];

	if (!buf || !len)
		return fail(d, KVT_EPROTO, "empty message");
	if (len > IPC_MAX_MSG)
		return fail(d, KVT_ETOOBIG,
		            "message of %zu bytes exceeds the limit of %u", len,
		            IPC_MAX_MSG);
	int sc = codec_scan_obj(buf, len, &end, 0, &left, &why);
	if (sc == SCAN_TOO_MANY)
		return fail(d, KVT_ETOOBIG, "message of more than %" PRIu64
		            " msgpack objects, more than any valid one holds: "
		            "refused before unpacking (byte %zu)", objs_max,
		            end);
	if (sc)
		return fail(d, KVT_EPROTO, "malformed msgpack: %s (byte %zu)",
		            why, end);
	switch (msgpack_unpack_next(up, (const char *)buf, end, &off)) {
	case MSGPACK_UNPACK_SUCCESS:
		break;
	case MSGPACK_UNPACK_NOMEM_ERROR:
		return fail(d, KVT_ENOMEM, "out of memory unpacking message");
	default: /* the scan accepted it, so msgpack-c should too */
		return fail(d, KVT_EPROTO, "malformed msgpack");
	}
	const msgpack_object *top = &up->data;
	if (top->type != MSGPACK_OBJECT_MAP)
		return fail(d, KVT_EPROTO, "message is %s, not a map",
		            type_name(top->type));
	d->kv = top->via.map.ptr;
	d->n = top->via.map.size;

	const msgpack_object *v = NULL;
	for (uint32_t i = 0; i < d->n && !v; i++)
		if (str_is(&d->kv[i].key, "v"))
			v = &d->kv[i].val;
	if (!v)
		return fail(d, KVT_EPROTO, "missing protocol version \"v\"");
	if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return fail(d, KVT_EPROTO,
		            "protocol version \"v\" is not an unsigned integer "
		            "(got %s)", type_name(v->type));
	if (v->via.u64 != IPC_PROTO_VERSION)
		return fail(d, KVT_EVERSION,
		            "protocol version %" PRIu64 ", this side speaks %u",
		            v->via.u64, IPC_PROTO_VERSION);

	if (end != len)
		return fail(d, KVT_EPROTO, "%zu trailing bytes after the message",
		            len - end);
	if (d->n > TOP_KEYS_MAX)
		return fail(d, KVT_EPROTO, "too many keys (%" PRIu32 ", at most %d)",
		            d->n, TOP_KEYS_MAX);
	for (uint32_t i = 0; i < d->n; i++) {
		const msgpack_object *k = &d->kv[i].key;
		if (k->type != MSGPACK_OBJECT_STR)
			return fail(d, KVT_EPROTO, "key %" PRIu32 " is %s, not a "
			            "string", i, type_name(k->type));
		for (uint32_t j = 0; j < i; j++) {
			const msgpack_object *p = &d->kv[j].key;
			if (p->via.str.size == k->via.str.size &&
			    !memcmp(p->via.str.ptr, k->via.str.ptr,
			            k->via.str.size))
				return fail(d, KVT_EPROTO,
				            "duplicate key \"%s\"",
				            shown(tmp, sizeof(tmp),
				                  k->via.str.ptr,
				                  k->via.str.size));
		}
	}
	take(d, "v");
	return 0;
}

static int dec_geo(struct dec *d, const msgpack_object *o,
                   struct kvt_geometry *g)
{
	char what[40];
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return fail(d, KVT_EPROTO, "geo is %s, not an array",
		            type_name(o->type));
	if (o->via.array.size != CODEC_GEO_N)
		return fail(d, KVT_EPROTO,
		            "geo has %" PRIu32 " entries, expected %d",
		            o->via.array.size, CODEC_GEO_N);
	for (size_t i = 0; i < CODEC_GEO_N; i++) {
		const struct codec_field *f = &codec_geo_fields[i];
		uint64_t v = 0;
		snprintf(what, sizeof(what), "geo[%zu] (%s)", i, f->key);
		int rc = as_uint(d, &o->via.array.ptr[i], f->max, &v, what);
		if (rc)
			return rc;
		codec_field_put(f, g, v);
	}
	return 0;
}

static int dec_items(struct dec *d, const msgpack_object *o,
                     struct ipc_req *req)
{
	char what[64];
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return fail(d, KVT_EPROTO, "items is %s, not an array",
		            type_name(o->type));
	uint32_t n = o->via.array.size;
	if (n == 0)
		return fail(d, KVT_EPROTO, "items is empty");
	if (n > IPC_MAX_SYNC_ITEMS)
		return fail(d, KVT_EPROTO,
		            "items has %" PRIu32 " entries, at most %u", n,
		            IPC_MAX_SYNC_ITEMS);
	struct ipc_sync_item *items = calloc(n, sizeof(*items));
	if (!items)
		return fail(d, KVT_ENOMEM, "out of memory for %" PRIu32
		            " sync items", n);
	/* Owned by req from here, so a failure below is freed with it. */
	req->u.sync.items = items;
	req->u.sync.n = n;
	for (uint32_t i = 0; i < n; i++) {
		const msgpack_object *it = &o->via.array.ptr[i];
		struct ipc_sync_item v = {0};
		if (it->type != MSGPACK_OBJECT_ARRAY)
			return fail(d, KVT_EPROTO,
			            "sync item %" PRIu32 " is %s, not an array", i,
			            type_name(it->type));
		uint32_t nf = it->via.array.size;
		if (nf != CODEC_ITEM_MIN && nf != CODEC_ITEM_N)
			return fail(d, KVT_EPROTO,
			            "sync item %" PRIu32 " has %" PRIu32
			            " fields, expected %d or %d", i, nf,
			            CODEC_ITEM_MIN, CODEC_ITEM_N);
		for (size_t k = 0; k < nf; k++) {
			const struct codec_field *f = &codec_item_fields[k];
			const msgpack_object *x = &it->via.array.ptr[k];
			/* The reason is written only for a field refused:
			 * formatting one for each of a large sync's 28,672
			 * fields would take most of its decode. */
			if (x->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
			    x->via.u64 > f->max) {
				uint64_t u;
				snprintf(what, sizeof(what), "sync item %"
				         PRIu32 ": %s", i, f->key);
				return as_uint(d, x, f->max, &u, what);
			}
			codec_field_put(f, &v, x->via.u64);
		}
		if (v.phase > KVT_PHASE_DECODE)
			return fail(d, KVT_EPROTO,
			            "sync item %" PRIu32 ": phase %" PRIu32
			            " is neither 0 (prefill) nor 1 (decode)", i,
			            v.phase);
		items[i] = v;
	}
	return 0;
}

static int dec_rows(struct dec *d, const msgpack_object *o,
                    struct ipc_rep *rep);

/* Takes the keys of table f (a message body) into base (the request or
 * reply); the first failing row is the one reported. */
static int dec_fields(struct dec *d, const struct codec_field *f, void *base)
{
	for (; f && f->key; f++) {
		char *p = (char *)base + f->off;
		if (f->kind == F_NONEMPTY) {
			if (!p[0])
				return fail(d, KVT_EPROTO, "%s is empty",
				            f->key);
			continue;
		}
		const msgpack_object *o = take(d, f->key);
		if (!o) {
			if (f->flags & F_OPT)
				continue;
			return missing(d, f->key);
		}
		uint64_t v = 0;
		int rc = 0;
		switch ((enum codec_field_kind)f->kind) {
		case F_UINT:
			if (!(rc = as_uint(d, o, f->max, &v, f->key)))
				codec_field_put(f, base, v);
			break;
		case F_STR:
			rc = as_str(d, o, p, f->size, f->key);
			break;
		case F_GEO:
			rc = dec_geo(d, o, (struct kvt_geometry *)(void *)p);
			break;
		case F_ITEMS:
			rc = dec_items(d, o, base);
			break;
		case F_ROWS:
			rc = dec_rows(d, o, base);
			break;
		case F_NONEMPTY:
			break;
		}
		if (rc)
			return rc;
	}
	return 0;
}

static int dec_req_body(struct dec *d, struct ipc_req *req)
{
	const msgpack_object *o = take(d, "op");
	char tmp[48];
	int rc;

	if (!o)
		return missing(d, "op");
	if (o->type != MSGPACK_OBJECT_STR)
		return fail(d, KVT_EPROTO, "op is %s, not a string",
		            type_name(o->type));
	req->op = codec_op_lookup(o->via.str.ptr, o->via.str.size);
	if (req->op == IPC_OP_NONE)
		return fail(d, KVT_EUNKNOWNOP, "unknown op \"%s\"",
		            shown(tmp, sizeof(tmp), o->via.str.ptr,
		                  o->via.str.size));

	/* Admin ops may carry credentials; when they do, both, well-formed. */
	if (codec_op_needs_creds(req->op) ||
	    (codec_op_is_admin(req->op) && (has(d, "t") || has(d, "k")))) {
		if ((rc = key_u32(d, "t", &req->tenant)) ||
		    (rc = key_u64(d, "k", &req->token)))
			return rc;
	}
	rc = dec_fields(d, codec_req_fields[req->op], req);
	return rc ? rc : no_unknown_keys(d, codec_op_names[req->op]);
}

int codec_req_decode(const uint8_t *buf, size_t len, struct ipc_req *req,
                     char *err, size_t errlen)
{
	struct dec d = {.err = err, .errlen = errlen};
	msgpack_unpacked up;
	int rc;

	if (err && errlen)
		err[0] = 0;
	if (!req)
		return fail(&d, KVT_EINVAL, "no request to decode into");
	memset(req, 0, sizeof(*req));
	msgpack_unpacked_init(&up);
	rc = open_msg(&d, &up, buf, len, codec_req_objs_max());
	if (!rc)
		rc = dec_req_body(&d, req);
	msgpack_unpacked_destroy(&up);
	if (rc) {
		/* The op (and t, k) may already be set: clear them too, so a
		 * failed decode never looks half-filled (found by fuzz_codec). */
		codec_req_free(req);
		memset(req, 0, sizeof(*req));
		return rc;
	}
	req->version = IPC_PROTO_VERSION;
	return 0;
}

static int dec_row(struct dec *d, const msgpack_object *o, uint32_t r,
                   struct ipc_row *row)
{
	char tmp[48];
	if (o->type != MSGPACK_OBJECT_MAP)
		return fail(d, KVT_EPROTO, "row %" PRIu32 " is %s, not a map", r,
		            type_name(o->type));
	if (o->via.map.size > IPC_MAX_COLS)
		return fail(d, KVT_EPROTO,
		            "row %" PRIu32 " has %" PRIu32 " columns, at most %u",
		            r, o->via.map.size, IPC_MAX_COLS);
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key;
		const msgpack_object *v = &o->via.map.ptr[i].val;
		struct ipc_val *out = &row->vals[i];
		char what[64];
		int rc;

		snprintf(what, sizeof(what), "row %" PRIu32 ": key %" PRIu32,
		         r, i);
		if ((rc = as_str(d, k, out->key, sizeof(out->key), what)))
			return rc;
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(row->vals[j].key, out->key))
				return fail(d, KVT_EPROTO,
				            "row %" PRIu32 ": duplicate key \"%s\"",
				            r, shown(tmp, sizeof(tmp), out->key,
				                     strlen(out->key)));
		snprintf(what, sizeof(what), "row %" PRIu32 ": \"%s\"", r,
		         shown(tmp, sizeof(tmp), out->key, strlen(out->key)));
		switch (v->type) {
		case MSGPACK_OBJECT_POSITIVE_INTEGER:
			out->type = IPC_VAL_U64;
			out->v.u = v->via.u64;
			break;
		case MSGPACK_OBJECT_NEGATIVE_INTEGER:
			out->type = IPC_VAL_I64;
			out->v.i = v->via.i64;
			break;
		case MSGPACK_OBJECT_FLOAT32:
		case MSGPACK_OBJECT_FLOAT64:
			out->type = IPC_VAL_F64;
			out->v.f = v->via.f64;
			break;
		case MSGPACK_OBJECT_STR:
			out->type = IPC_VAL_STR;
			if ((rc = as_str(d, v, out->v.s, sizeof(out->v.s), what)))
				return rc;
			break;
		default:
			return fail(d, KVT_EPROTO,
			            "%s is %s, not a number or string", what,
			            type_name(v->type));
		}
		row->n = i + 1;
	}
	return 0;
}

static int dec_rows(struct dec *d, const msgpack_object *o,
                    struct ipc_rep *rep)
{
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return fail(d, KVT_EPROTO, "rows is %s, not an array",
		            type_name(o->type));
	uint32_t n = o->via.array.size;
	if (n > IPC_MAX_ROWS)
		return fail(d, KVT_EPROTO, "rows has %" PRIu32 " entries, at "
		            "most %u", n, IPC_MAX_ROWS);
	if (!n)
		return 0;
	struct ipc_row *rows = calloc(n, sizeof(*rows));
	if (!rows)
		return fail(d, KVT_ENOMEM, "out of memory for %" PRIu32 " rows",
		            n);
	rep->table.rows = rows;
	rep->table.n = n;
	for (uint32_t i = 0; i < n; i++) {
		int rc = dec_row(d, &o->via.array.ptr[i], i, &rows[i]);
		if (rc)
			return rc;
	}
	return 0;
}

static int dec_rep_body(struct dec *d, enum ipc_op op, struct ipc_rep *rep)
{
	const msgpack_object *e = take(d, "e");
	int rc = 0;

	if (!e)
		return missing(d, "e");
	if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		if (e->via.u64 != 0)
			return fail(d, KVT_EPROTO, "error code e is positive (%"
			            PRIu64 ")", e->via.u64);
		rep->err = 0;
	} else if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		if (e->via.i64 < INT32_MIN)
			return fail(d, KVT_EPROTO, "error code e is out of range "
			            "(%" PRId64 ")", e->via.i64);
		rep->err = (int32_t)e->via.i64;
	} else {
		return fail(d, KVT_EPROTO, "error code e is %s, not an integer",
		            type_name(e->type));
	}

	if (rep->err) {
		/* An error reply carries v, e and m only, whatever the op. */
		rc = key_str(d, "m", rep->msg, sizeof(rep->msg), true);
	} else {
		rc = dec_fields(d, codec_rep_fields[op], rep);
	}
	return rc ? rc : no_unknown_keys(d, codec_op_names[op]);
}

int codec_rep_decode(enum ipc_op op, const uint8_t *buf, size_t len,
                     struct ipc_rep *rep, char *err, size_t errlen)
{
	struct dec d = {.err = err, .errlen = errlen};
	msgpack_unpacked up;
	int rc;

	if (err && errlen)
		err[0] = 0;
	if (!rep)
		return fail(&d, KVT_EINVAL, "no reply to decode into");
	memset(rep, 0, sizeof(*rep));
	if (!codec_op_valid(op))
		return fail(&d, KVT_EINVAL, "reply to unknown op %d", (int)op);
	msgpack_unpacked_init(&up);
	rc = open_msg(&d, &up, buf, len, codec_rep_objs_max());
	if (!rc)
		rc = dec_rep_body(&d, op, rep);
	msgpack_unpacked_destroy(&up);
	if (rc) {
		codec_rep_free(rep);
		memset(rep, 0, sizeof(*rep));
		return rc;
	}
	rep->version = IPC_PROTO_VERSION;
	return 0;
}

void codec_req_free(struct ipc_req *req)
{
	if (!req)
		return;
	if (req->op == IPC_OP_SYNC) {
		free(req->u.sync.items);
		req->u.sync.items = NULL;
		req->u.sync.n = 0;
	}
}

void codec_rep_free(struct ipc_rep *rep)
{
	if (!rep)
		return;
	free(rep->table.rows);
	rep->table.rows = NULL;
	rep->table.n = 0;
}
