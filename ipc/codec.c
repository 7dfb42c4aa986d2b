/*
 * codec.c — msgpack encoding and strict decoding of control messages; see
 * codec.h for the wire format.
 *
 * Decoding runs in three steps:
 *   1. scan_obj() walks the raw bytes once without allocating.  It proves the
 *      buffer holds exactly one well-formed msgpack object, bounds nesting,
 *      and checks that every container's element count fits in the bytes
 *      left.  That last check matters: msgpack-c allocates an array's or
 *      map's element storage up front from the header count, so five bytes
 *      "dd ff ff ff ff" would otherwise ask for ~100 GB.  After the scan
 *      msgpack-c allocates at most a small multiple of the message size.
 *   2. msgpack_unpack_next() builds the object tree (strings point into the
 *      caller's buffer, which outlives the tree).
 *   3. The tree is checked key by key: "v" first, then key types and
 *      duplicates, then "op" and each op's keys.  Every key taken is marked;
 *      a key left unmarked at the end is unknown and refused.
 *
 * Any failure frees what the decoder allocated and leaves the output zeroed,
 * so a failed decode never looks half-filled and *_free() on it is a no-op.
 */
#include "codec.h"

#include <inttypes.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deepest container nesting accepted by the scan (the protocol needs 3). */
#define SCAN_DEPTH 8
/* Most keys in a top-level map (hello, the largest, has 14); bounds the
 * quadratic duplicate check and fits the "used" bit mask. */
#define TOP_KEYS_MAX 32


/* ------------------------------------------------------------- op names */

static const char *const op_names[IPC_OP_COUNT] = {
#define OP_NAME_(name, str) [IPC_OP_##name] = str,
	IPC_OP_MAP(OP_NAME_)
#undef OP_NAME_
};

static bool op_valid(enum ipc_op op)
{
	return (int)op > (int)IPC_OP_NONE && (int)op < (int)IPC_OP_COUNT;
}

const char *codec_op_name(enum ipc_op op)
{
	return op_valid(op) ? op_names[op] : NULL;
}

int codec_op_is_admin(enum ipc_op op)
{
	switch (op) {
	case IPC_OP_STATS:
	case IPC_OP_TENANTS:
	case IPC_OP_CHECK:
	case IPC_OP_POLICIES:
	case IPC_OP_CONFIG:
	case IPC_OP_DRAIN:
	case IPC_OP_CONFIG_SET:
		return 1;
	default:
		return 0;
	}
}

static bool op_is_table(enum ipc_op op)
{
	return codec_op_is_admin(op); /* every admin op replies with rows */
}

/* Ops whose requests carry "t" and "k" (admin ops may, optionally). */
static bool op_needs_creds(enum ipc_op op)
{
	return op != IPC_OP_HELLO && !codec_op_is_admin(op);
}

static enum ipc_op op_lookup(const char *s, size_t n)
{
	for (int i = IPC_OP_NONE + 1; i < IPC_OP_COUNT; i++)
		if (strlen(op_names[i]) == n && !memcmp(op_names[i], s, n))
			return (enum ipc_op)i;
	return IPC_OP_NONE;
}

/* ------------------------------------------------------------- raw scan */

static uint64_t be_read(const uint8_t *p, size_t w)
{
	uint64_t v = 0;
	for (size_t i = 0; i < w; i++)
		v = v << 8 | p[i];
	return v;
}

/*
 * Steps *pos over one msgpack object of b[0, len).  Returns 0, or -1 with a
 * static reason in *why.  Work is linear in the bytes walked: every element
 * of a container consumes at least one byte, and counts beyond the bytes
 * left are refused before recursing.
 */
static int scan_obj(const uint8_t *b, size_t len, size_t *pos, int depth,
                    const char **why)
{
	if (*pos >= len) {
		*why = "truncated message";
		return -1;
	}
	uint8_t c = b[(*pos)++];
	uint64_t skip = 0, count = 0;
	size_t w = 0;      /* width of a big-endian length field */
	int container = 0; /* 1 array, 2 map */

	if (c <= 0x7f || c >= 0xe0)
		return 0; /* fixint */
	if (c <= 0x8f) {
		count = c & 0x0f;
		container = 2;
	} else if (c <= 0x9f) {
		count = c & 0x0f;
		container = 1;
	} else if (c <= 0xbf) {
		skip = c & 0x1f;
	} else {
		switch (c) {
		case 0xc0: case 0xc2: case 0xc3:
			return 0; /* nil, false, true */
		case 0xc1:
			*why = "reserved byte 0xc1";
			return -1;
		case 0xc4: case 0xd9: w = 1; break; /* bin8, str8 */
		case 0xc5: case 0xda: w = 2; break;
		case 0xc6: case 0xdb: w = 4; break;
		case 0xc7: w = 1; skip = 1; break; /* ext: + type byte */
		case 0xc8: w = 2; skip = 1; break;
		case 0xc9: w = 4; skip = 1; break;
		case 0xca: skip = 4; break; /* float32 */
		case 0xcb: skip = 8; break;
		case 0xcc: case 0xd0: skip = 1; break;
		case 0xcd: case 0xd1: skip = 2; break;
		case 0xce: case 0xd2: skip = 4; break;
		case 0xcf: case 0xd3: skip = 8; break;
		case 0xd4: skip = 2; break; /* fixext: type + data */
		case 0xd5: skip = 3; break;
		case 0xd6: skip = 5; break;
		case 0xd7: skip = 9; break;
		case 0xd8: skip = 17; break;
		case 0xdc: w = 2; container = 1; break;
		case 0xdd: w = 4; container = 1; break;
		case 0xde: w = 2; container = 2; break;
		case 0xdf: w = 4; container = 2; break;
		}
	}
	if (w) {
		if (w > len - *pos) {
			*why = "truncated message";
			return -1;
		}
		uint64_t n = be_read(b + *pos, w);
		*pos += w;
		if (container)
			count = n;
		else
			skip += n;
	}
	if (!container) {
		if (skip > len - *pos) {
			*why = "truncated message";
			return -1;
		}
		*pos += skip;
		return 0;
	}
	if (depth >= SCAN_DEPTH) {
		*why = "containers nested too deep";
		return -1;
	}
	if (container == 2)
		count *= 2;
	if (count > len - *pos) {
		*why = "truncated message (container count beyond its bytes)";
		return -1;
	}
	for (uint64_t i = 0; i < count; i++)
		if (scan_obj(b, len, pos, depth + 1, why))
			return -1;
	return 0;
}

/* ------------------------------------------------------------- decoding */

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
                    size_t len)
{
	const char *why = NULL;
	size_t end = 0, off = 0;
	char tmp[48];

	if (!buf || !len)
		return fail(d, KVT_EPROTO, "empty message");
	if (len > IPC_MAX_MSG)
		return fail(d, KVT_ETOOBIG,
		            "message of %zu bytes exceeds the limit of %u", len,
		            IPC_MAX_MSG);
	if (scan_obj(buf, len, &end, 0, &why))
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

static int dec_geo(struct dec *d, struct kvt_geometry *g)
{
	static const char *const names[5] = {"n_layers", "n_heads",
	                                     "n_kv_heads", "head_dim",
	                                     "d_model"};
	uint32_t *f[5] = {&g->n_layers, &g->n_heads, &g->n_kv_heads,
	                  &g->head_dim, &g->d_model};
	const msgpack_object *o = take(d, "geo");
	char what[40];
	if (!o)
		return missing(d, "geo");
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return fail(d, KVT_EPROTO, "geo is %s, not an array",
		            type_name(o->type));
	if (o->via.array.size != 5)
		return fail(d, KVT_EPROTO,
		            "geo has %" PRIu32 " entries, expected 5",
		            o->via.array.size);
	for (int i = 0; i < 5; i++) {
		uint64_t v = 0;
		snprintf(what, sizeof(what), "geo[%d] (%s)", i, names[i]);
		int rc = as_uint(d, &o->via.array.ptr[i], UINT32_MAX, &v, what);
		if (rc)
			return rc;
		*f[i] = (uint32_t)v;
	}
	return 0;
}

static int dec_hello(struct dec *d, struct ipc_hello *h)
{
	int rc;
	if ((rc = key_str(d, "name", h->name, sizeof(h->name), true)) ||
	    (rc = dec_geo(d, &h->geo)) ||
	    (rc = key_u32(d, "dtype", &h->dtype)) ||
	    (rc = key_u32(d, "page", &h->page_tokens)) ||
	    (rc = key_u32(d, "seqs", &h->max_seqs)) ||
	    (rc = key_u32(d, "maxtok", &h->max_tokens)) ||
	    (rc = key_u32(d, "head", &h->headroom)) ||
	    (rc = key_u32(d, "stage", &h->stage_tokens)) ||
	    (rc = key_str(d, "policy", h->policy, sizeof(h->policy), true)) ||
	    (rc = key_u64(d, "quota", &h->quota_bytes)) ||
	    (rc = key_u64(d, "cookie", &h->cookie)) ||
	    (rc = key_u32(d, "pid", &h->pid)))
		return rc;
	return 0;
}

static int dec_sync(struct dec *d, struct ipc_req *req)
{
	static const char *const names[6] = {"seq", "counter", "n_new",
	                                     "phase", "layer_lo", "layer_hi"};
	const msgpack_object *o = take(d, "items");
	char what[64];
	if (!o)
		return missing(d, "items");
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
		uint64_t v[6];
		if (it->type != MSGPACK_OBJECT_ARRAY)
			return fail(d, KVT_EPROTO,
			            "sync item %" PRIu32 " is %s, not an array", i,
			            type_name(it->type));
		if (it->via.array.size != 6)
			return fail(d, KVT_EPROTO,
			            "sync item %" PRIu32 " has %" PRIu32
			            " fields, expected 6", i, it->via.array.size);
		for (int f = 0; f < 6; f++) {
			snprintf(what, sizeof(what), "sync item %" PRIu32 ": %s",
			         i, names[f]);
			int rc = as_uint(d, &it->via.array.ptr[f],
			                 f == 0 ? UINT64_MAX : UINT32_MAX, &v[f],
			                 what);
			if (rc)
				return rc;
		}
		if (v[3] > KVT_PHASE_DECODE)
			return fail(d, KVT_EPROTO,
			            "sync item %" PRIu32 ": phase %" PRIu64
			            " is neither 0 (prefill) nor 1 (decode)", i,
			            v[3]);
		items[i] = (struct ipc_sync_item){
			.seq = v[0],
			.counter = (uint32_t)v[1],
			.n_new = (uint32_t)v[2],
			.phase = (uint32_t)v[3],
			.layer_lo = (uint32_t)v[4],
			.layer_hi = (uint32_t)v[5],
		};
	}
	return 0;
}

static int dec_drain(struct dec *d, struct ipc_req *req)
{
	int rc = key_str(d, "tenant", req->u.drain.tenant,
	                 sizeof(req->u.drain.tenant), true);
	if (rc)
		return rc;
	if (!req->u.drain.tenant[0])
		return fail(d, KVT_EPROTO, "tenant is empty");
	if (has(d, "undo")) {
		uint64_t v = 0;
		if ((rc = as_uint(d, take(d, "undo"), 1, &v, "undo")))
			return rc;
		req->u.drain.undo = (uint32_t)v;
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
	req->op = op_lookup(o->via.str.ptr, o->via.str.size);
	if (req->op == IPC_OP_NONE)
		return fail(d, KVT_EUNKNOWNOP, "unknown op \"%s\"",
		            shown(tmp, sizeof(tmp), o->via.str.ptr,
		                  o->via.str.size));

	/* Admin ops may carry credentials; when they do, both, well-formed. */
	if (op_needs_creds(req->op) ||
	    (codec_op_is_admin(req->op) && (has(d, "t") || has(d, "k")))) {
		if ((rc = key_u32(d, "t", &req->tenant)) ||
		    (rc = key_u64(d, "k", &req->token)))
			return rc;
	}

	switch (req->op) {
	case IPC_OP_HELLO:
		rc = dec_hello(d, &req->u.hello);
		break;
	case IPC_OP_SEQ_CLOSE:
		rc = key_u64(d, "seq", &req->u.seq);
		break;
	case IPC_OP_SYNC:
		rc = dec_sync(d, req);
		break;
	case IPC_OP_STATS:
		rc = key_str(d, "tenant", req->u.filter,
		             sizeof(req->u.filter), false);
		break;
	case IPC_OP_CONFIG:
		rc = key_str(d, "key", req->u.filter, sizeof(req->u.filter),
		             false);
		break;
	case IPC_OP_DRAIN:
		rc = dec_drain(d, req);
		break;
	case IPC_OP_CONFIG_SET:
		if (!(rc = key_str(d, "key", req->u.set.key,
		                   sizeof(req->u.set.key), true)) &&
		    !(rc = key_str(d, "value", req->u.set.value,
		                   sizeof(req->u.set.value), true)) &&
		    !req->u.set.key[0])
			rc = fail(d, KVT_EPROTO, "key is empty");
		break;
	default:
		rc = 0;
		break;
	}
	return rc ? rc : no_unknown_keys(d, op_names[req->op]);
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
	rc = open_msg(&d, &up, buf, len);
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

static int dec_rows(struct dec *d, struct ipc_rep *rep)
{
	const msgpack_object *o = take(d, "rows");
	if (!o)
		return missing(d, "rows");
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
	} else if (op == IPC_OP_HELLO) {
		if ((rc = key_u32(d, "t", &rep->u.hello.tenant)) ||
		    (rc = key_u64(d, "k", &rep->u.hello.token)) ||
		    (rc = key_u32(d, "seqs", &rep->u.hello.max_seqs)) ||
		    (rc = key_u32(d, "maxtok", &rep->u.hello.max_tokens)) ||
		    (rc = key_u32(d, "head", &rep->u.hello.headroom)) ||
		    (rc = key_u32(d, "stage", &rep->u.hello.stage_tokens)) ||
		    (rc = key_u32(d, "page", &rep->u.hello.page_tokens)) ||
		    (rc = key_u64(d, "quota", &rep->u.hello.quota_bytes)))
			return rc;
	} else if (op == IPC_OP_SEQ_OPEN) {
		rc = key_u64(d, "seq", &rep->u.seq);
	} else if (op_is_table(op)) {
		rc = dec_rows(d, rep);
	}
	return rc ? rc : no_unknown_keys(d, op_names[op]);
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
	if (!op_valid(op))
		return fail(&d, KVT_EINVAL, "reply to unknown op %d", (int)op);
	msgpack_unpacked_init(&up);
	rc = open_msg(&d, &up, buf, len);
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

/* Reads a str header at b[*pos]; 1 (and *s, *n, *pos past it) when it is a
 * whole string, 0 when not a string, -1 when truncated. */
static int peek_str(const uint8_t *b, size_t len, size_t *pos,
                    const char **s, size_t *n)
{
	size_t p = *pos, w = 0;
	uint64_t sl;
	if (p >= len)
		return -1;
	uint8_t c = b[p++];
	if (c >= 0xa0 && c <= 0xbf)
		sl = c & 0x1f;
	else if (c == 0xd9 || c == 0xda || c == 0xdb) {
		w = c == 0xd9 ? 1 : c == 0xda ? 2 : 4;
		if (w > len - p)
			return -1;
		sl = be_read(b + p, w);
		p += w;
	} else {
		return 0;
	}
	if (sl > len - p)
		return -1;
	*s = (const char *)b + p;
	*n = (size_t)sl;
	*pos = p + (size_t)sl;
	return 1;
}

/*
 * Lenient: only needs a top-level map whose entries up to "op" are readable;
 * ignores the version, other keys, later damage and trailing bytes.  Never
 * allocates, so it is as safe on garbage as the scan.
 */
enum ipc_op codec_peek_op(const uint8_t *buf, size_t len)
{
	const char *why, *s;
	size_t pos = 0, n;
	uint64_t count;

	if (!buf || !len)
		return IPC_OP_NONE;
	uint8_t c = buf[pos++];
	if (c >= 0x80 && c <= 0x8f) {
		count = c & 0x0f;
	} else if (c == 0xde || c == 0xdf) {
		size_t w = c == 0xde ? 2 : 4;
		if (w > len - pos)
			return IPC_OP_NONE;
		count = be_read(buf + pos, w);
		pos += w;
	} else {
		return IPC_OP_NONE;
	}
	for (uint64_t i = 0; i < count; i++) {
		int k = peek_str(buf, len, &pos, &s, &n);
		if (k < 0)
			return IPC_OP_NONE;
		bool is_op = k == 1 && n == 2 && !memcmp(s, "op", 2);
		if (k == 0 && scan_obj(buf, len, &pos, 1, &why))
			return IPC_OP_NONE;
		if (is_op) {
			if (peek_str(buf, len, &pos, &s, &n) != 1)
				return IPC_OP_NONE;
			return op_lookup(s, n);
		}
		if (scan_obj(buf, len, &pos, 1, &why))
			return IPC_OP_NONE;
	}
	return IPC_OP_NONE;
}

/* ------------------------------------------------------------- encoding */

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

static int check_req(const struct ipc_req *req)
{
	switch (req->op) {
	case IPC_OP_HELLO:
		if (!fits(req->u.hello.name, sizeof(req->u.hello.name)) ||
		    !fits(req->u.hello.policy, sizeof(req->u.hello.policy)))
			return KVT_EINVAL;
		break;
	case IPC_OP_SYNC:
		if (!req->u.sync.n || req->u.sync.n > IPC_MAX_SYNC_ITEMS ||
		    !req->u.sync.items)
			return KVT_EINVAL;
		for (uint32_t i = 0; i < req->u.sync.n; i++)
			if (req->u.sync.items[i].phase > KVT_PHASE_DECODE)
				return KVT_EINVAL;
		break;
	case IPC_OP_STATS:
	case IPC_OP_CONFIG:
		if (!fits(req->u.filter, sizeof(req->u.filter)))
			return KVT_EINVAL;
		break;
	case IPC_OP_DRAIN:
		if (!fits(req->u.drain.tenant, sizeof(req->u.drain.tenant)) ||
		    !req->u.drain.tenant[0] || req->u.drain.undo > 1)
			return KVT_EINVAL;
		break;
	case IPC_OP_CONFIG_SET:
		if (!fits(req->u.set.key, sizeof(req->u.set.key)) ||
		    !req->u.set.key[0] ||
		    !fits(req->u.set.value, sizeof(req->u.set.value)))
			return KVT_EINVAL;
		break;
	default:
		break;
	}
	return 0;
}

/*
 * Always writes IPC_PROTO_VERSION (req->version is ignored): an encoder
 * speaks its own version.  Admin ops carry "t"/"k" only when either is
 * nonzero; stats/config carry their filter only when it is not "".
 */
int codec_req_encode(const struct ipc_req *req, uint8_t **out, size_t *len)
{
	struct enc e;
	size_t n = 2;
	int rc;

	if (!req || !out || !len || !op_valid(req->op))
		return KVT_EINVAL;
	if ((rc = check_req(req)))
		return rc;
	bool creds = op_needs_creds(req->op) ||
	             (codec_op_is_admin(req->op) && (req->tenant || req->token));
	n += creds ? 2 : 0;
	switch (req->op) {
	case IPC_OP_HELLO: n += 12; break;
	case IPC_OP_SEQ_CLOSE:
	case IPC_OP_SYNC: n += 1; break;
	case IPC_OP_STATS:
	case IPC_OP_CONFIG: n += req->u.filter[0] ? 1 : 0; break;
	case IPC_OP_DRAIN: n += req->u.drain.undo ? 2 : 1; break;
	case IPC_OP_CONFIG_SET: n += 2; break;
	default: break;
	}

	enc_init(&e);
	e_map(&e, n);
	kv_u(&e, "v", IPC_PROTO_VERSION);
	kv_s(&e, "op", op_names[req->op]);
	if (creds) {
		kv_u(&e, "t", req->tenant);
		kv_u(&e, "k", req->token);
	}
	switch (req->op) {
	case IPC_OP_HELLO: {
		const struct ipc_hello *h = &req->u.hello;
		kv_s(&e, "name", h->name);
		e_str(&e, "geo");
		e_array(&e, 5);
		e_uint(&e, h->geo.n_layers);
		e_uint(&e, h->geo.n_heads);
		e_uint(&e, h->geo.n_kv_heads);
		e_uint(&e, h->geo.head_dim);
		e_uint(&e, h->geo.d_model);
		kv_u(&e, "dtype", h->dtype);
		kv_u(&e, "page", h->page_tokens);
		kv_u(&e, "seqs", h->max_seqs);
		kv_u(&e, "maxtok", h->max_tokens);
		kv_u(&e, "head", h->headroom);
		kv_u(&e, "stage", h->stage_tokens);
		kv_s(&e, "policy", h->policy);
		kv_u(&e, "quota", h->quota_bytes);
		kv_u(&e, "cookie", h->cookie);
		kv_u(&e, "pid", h->pid);
		break;
	}
	case IPC_OP_SEQ_CLOSE:
		kv_u(&e, "seq", req->u.seq);
		break;
	case IPC_OP_SYNC:
		e_str(&e, "items");
		e_array(&e, req->u.sync.n);
		for (uint32_t i = 0; i < req->u.sync.n; i++) {
			const struct ipc_sync_item *it = &req->u.sync.items[i];
			e_array(&e, 6);
			e_uint(&e, it->seq);
			e_uint(&e, it->counter);
			e_uint(&e, it->n_new);
			e_uint(&e, it->phase);
			e_uint(&e, it->layer_lo);
			e_uint(&e, it->layer_hi);
		}
		break;
	case IPC_OP_STATS:
		if (req->u.filter[0])
			kv_s(&e, "tenant", req->u.filter);
		break;
	case IPC_OP_CONFIG:
		if (req->u.filter[0])
			kv_s(&e, "key", req->u.filter);
		break;
	case IPC_OP_DRAIN:
		kv_s(&e, "tenant", req->u.drain.tenant);
		if (req->u.drain.undo)
			kv_u(&e, "undo", req->u.drain.undo);
		break;
	case IPC_OP_CONFIG_SET:
		kv_s(&e, "key", req->u.set.key);
		kv_s(&e, "value", req->u.set.value);
		break;
	default:
		break;
	}
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
	if (!op_valid(op))
		return KVT_EINVAL;
	if (op_is_table(op)) {
		if (rep->table.n > IPC_MAX_ROWS ||
		    (rep->table.n && !rep->table.rows))
			return KVT_EINVAL;
		for (uint32_t i = 0; i < rep->table.n; i++)
			if ((rc = check_row(&rep->table.rows[i])))
				return rc;
	}

	size_t n = 2;
	if (op == IPC_OP_HELLO)
		n += 8;
	else if (op == IPC_OP_SEQ_OPEN || op_is_table(op))
		n += 1;
	enc_init(&e);
	e_map(&e, n);
	kv_u(&e, "v", IPC_PROTO_VERSION);
	kv_u(&e, "e", 0);
	if (op == IPC_OP_HELLO) {
		kv_u(&e, "t", rep->u.hello.tenant);
		kv_u(&e, "k", rep->u.hello.token);
		kv_u(&e, "seqs", rep->u.hello.max_seqs);
		kv_u(&e, "maxtok", rep->u.hello.max_tokens);
		kv_u(&e, "head", rep->u.hello.headroom);
		kv_u(&e, "stage", rep->u.hello.stage_tokens);
		kv_u(&e, "page", rep->u.hello.page_tokens);
		kv_u(&e, "quota", rep->u.hello.quota_bytes);
	} else if (op == IPC_OP_SEQ_OPEN) {
		kv_u(&e, "seq", rep->u.seq);
	} else if (op_is_table(op)) {
		e_str(&e, "rows");
		e_array(&e, rep->table.n);
		for (uint32_t i = 0; i < rep->table.n; i++)
			e_row(&e, &rep->table.rows[i]);
	}
	return enc_finish(&e, out, len);
}

/* ------------------------------------------------------------- helpers */

/* Copies at most cap-1 bytes and terminates (truncating, never failing). */
static void copy_trunc(char *dst, size_t cap, const char *src)
{
	size_t n = strnlen(src, cap - 1);
	memcpy(dst, src, n);
	dst[n] = 0;
}

/*
 * Sets version, err and msg (kvt_strerror(err) when msg is NULL or "").
 * Rows a decode left in rep are released first; the rest of the payload is
 * left alone (an error reply does not encode it).
 */
void codec_rep_error(struct ipc_rep *rep, int err, const char *msg)
{
	if (!rep)
		return;
	codec_rep_free(rep);
	rep->version = IPC_PROTO_VERSION;
	rep->err = err;
	copy_trunc(rep->msg, sizeof(rep->msg),
	           msg && *msg ? msg : kvt_strerror(err));
}

static struct ipc_val *row_add(struct ipc_row *row, const char *key,
                               enum ipc_val_type t)
{
	if (!row || !key || row->n >= IPC_MAX_COLS)
		return NULL;
	struct ipc_val *v = &row->vals[row->n++];
	memset(v, 0, sizeof(*v));
	copy_trunc(v->key, sizeof(v->key), key);
	v->type = t;
	return v;
}

void codec_row_u64(struct ipc_row *row, const char *key, uint64_t v)
{
	struct ipc_val *x = row_add(row, key, IPC_VAL_U64);
	if (x)
		x->v.u = v;
}

void codec_row_i64(struct ipc_row *row, const char *key, int64_t v)
{
	struct ipc_val *x = row_add(row, key, IPC_VAL_I64);
	if (x)
		x->v.i = v;
}

void codec_row_f64(struct ipc_row *row, const char *key, double v)
{
	struct ipc_val *x = row_add(row, key, IPC_VAL_F64);
	if (x)
		x->v.f = v;
}

void codec_row_str(struct ipc_row *row, const char *key, const char *v)
{
	struct ipc_val *x = row_add(row, key, IPC_VAL_STR);
	if (x)
		copy_trunc(x->v.s, sizeof(x->v.s), v ? v : "");
}

const struct ipc_val *codec_row_get(const struct ipc_row *row, const char *key)
{
	if (!row || !key)
		return NULL;
	for (uint32_t i = 0; i < row->n && i < IPC_MAX_COLS; i++)
		if (!strcmp(row->vals[i].key, key))
			return &row->vals[i];
	return NULL;
}
