/*
 * codec.c — the control messages: op names and the table of every message
 * body (codec_int.h), which codec_decode.c and codec_encode.c walk; see
 * codec.h for the wire format.
 */
#include "codec_int.h"

#include <stddef.h>
#include <string.h>

/* ------------------------------------------------------------- op names */

const char *const codec_op_names[IPC_OP_COUNT] = {
#define OP_NAME_(name, str) [IPC_OP_##name] = str,
	IPC_OP_MAP(OP_NAME_)
#undef OP_NAME_
};

bool codec_op_valid(enum ipc_op op)
{
	return (int)op > (int)IPC_OP_NONE && (int)op < (int)IPC_OP_COUNT;
}

const char *codec_op_name(enum ipc_op op)
{
	return codec_op_valid(op) ? codec_op_names[op] : NULL;
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

bool codec_op_needs_creds(enum ipc_op op)
{
	return op != IPC_OP_HELLO && !codec_op_is_admin(op);
}

enum ipc_op codec_op_lookup(const char *s, size_t n)
{
	for (int i = IPC_OP_NONE + 1; i < IPC_OP_COUNT; i++)
		if (strlen(codec_op_names[i]) == n &&
		    !memcmp(codec_op_names[i], s, n))
			return (enum ipc_op)i;
	return IPC_OP_NONE;
}

/* ------------------------------------------------------- message tables */

/* One row per field; see codec_int.h. */
#define FSIZE_(T, m) sizeof(((T *)0)->m)
#define UINT_(T, k, m, mx, fl) {k, F_UINT, fl, FSIZE_(T, m), offsetof(T, m), mx}
#define U32(T, k, m) UINT_(T, k, m, UINT32_MAX, 0)
#define U64(T, k, m) UINT_(T, k, m, UINT64_MAX, 0)
#define STR_(T, k, m, fl) {k, F_STR, fl, FSIZE_(T, m), offsetof(T, m), 0}
#define STR(T, k, m) STR_(T, k, m, 0)
#define NONEMPTY(T, k, m) {k, F_NONEMPTY, 0, FSIZE_(T, m), offsetof(T, m), 0}
#define KIND_(T, k, kind, m) {k, kind, 0, FSIZE_(T, m), offsetof(T, m), 0}
#define END_ {NULL, 0, 0, 0, 0, 0}

typedef struct ipc_req RQ_;
typedef struct ipc_rep RP_;
typedef struct kvt_geometry GEO_;
typedef struct ipc_sync_item ITEM_;

/* "geo": [n_layers, n_heads, n_kv_heads, head_dim, d_model] */
const struct codec_field codec_geo_fields[CODEC_GEO_N] = {
	U32(GEO_, "n_layers", n_layers),
	U32(GEO_, "n_heads", n_heads),
	U32(GEO_, "n_kv_heads", n_kv_heads),
	U32(GEO_, "head_dim", head_dim),
	U32(GEO_, "d_model", d_model),
};

/* A sync item: [seq, counter, n_new, phase, layer_lo, layer_hi] and,
 * when nonzero, headroom.  The phase's range is checked after the tuple
 * (its own message); headroom's against the geometry by the tenant. */
const struct codec_field codec_item_fields[CODEC_ITEM_N] = {
	U64(ITEM_, "seq", seq),
	U32(ITEM_, "counter", counter),
	U32(ITEM_, "n_new", n_new),
	U32(ITEM_, "phase", phase),
	U32(ITEM_, "layer_lo", layer_lo),
	U32(ITEM_, "layer_hi", layer_hi),
	U32(ITEM_, "headroom", headroom),
};

/* Request bodies, after "v", "op" and the credentials "t", "k". */
static const struct codec_field req_hello[] = {
	STR(RQ_, "name", u.hello.name),
	KIND_(RQ_, "geo", F_GEO, u.hello.geo),
	U32(RQ_, "dtype", u.hello.dtype),
	U32(RQ_, "page", u.hello.page_tokens),
	U32(RQ_, "seqs", u.hello.max_seqs),
	U32(RQ_, "maxtok", u.hello.max_tokens),
	U32(RQ_, "head", u.hello.headroom),
	U32(RQ_, "stage", u.hello.stage_tokens),
	STR(RQ_, "policy", u.hello.policy),
	U64(RQ_, "quota", u.hello.quota_bytes),
	U64(RQ_, "cookie", u.hello.cookie),
	U32(RQ_, "pid", u.hello.pid),
	END_,
};
static const struct codec_field req_seq_close[] = {
	U64(RQ_, "seq", u.seq),
	END_,
};
static const struct codec_field req_seq_open[] = {
	U64(RQ_, "n", u.open.no),
	U64(RQ_, "undo", u.open.undo),
	UINT_(RQ_, "from", u.open.from, UINT64_MAX, F_OPT),
	END_,
};
static const struct codec_field req_seq_query[] = {
	U64(RQ_, "seq", u.query.seq),
	U64(RQ_, "n", u.query.no),
	U64(RQ_, "after", u.query.after),
	END_,
};
static const struct codec_field req_sync[] = {
	U64(RQ_, "n", u.sync.no),
	KIND_(RQ_, "items", F_ITEMS, u.sync),
	END_,
};
static const struct codec_field req_stats[] = {
	STR_(RQ_, "tenant", u.filter, F_OPT),
	END_,
};
static const struct codec_field req_config[] = {
	STR_(RQ_, "key", u.filter, F_OPT),
	END_,
};
static const struct codec_field req_drain[] = {
	STR(RQ_, "tenant", u.drain.tenant),
	NONEMPTY(RQ_, "tenant", u.drain.tenant),
	UINT_(RQ_, "undo", u.drain.undo, 1, F_OPT),
	END_,
};
static const struct codec_field req_config_set[] = {
	STR(RQ_, "key", u.set.key),
	STR(RQ_, "value", u.set.value),
	NONEMPTY(RQ_, "key", u.set.key),
	END_,
};
const struct codec_field *const codec_req_fields[IPC_OP_COUNT] = {
	[IPC_OP_HELLO] = req_hello,
	[IPC_OP_SEQ_OPEN] = req_seq_open,
	[IPC_OP_SEQ_CLOSE] = req_seq_close,
	[IPC_OP_SEQ_QUERY] = req_seq_query,
	[IPC_OP_SYNC] = req_sync,
	[IPC_OP_STATS] = req_stats,
	[IPC_OP_CONFIG] = req_config,
	[IPC_OP_DRAIN] = req_drain,
	[IPC_OP_CONFIG_SET] = req_config_set,
};

/* Success reply bodies, after "v" and "e" (an error reply is v, e, m). */
static const struct codec_field rep_hello[] = {
	U32(RP_, "t", u.hello.tenant),
	U64(RP_, "k", u.hello.token),
	U32(RP_, "seqs", u.hello.max_seqs),
	U32(RP_, "maxtok", u.hello.max_tokens),
	U32(RP_, "head", u.hello.headroom),
	U32(RP_, "stage", u.hello.stage_tokens),
	U32(RP_, "page", u.hello.page_tokens),
	U64(RP_, "quota", u.hello.quota_bytes),
	UINT_(RP_, "inputs", u.hello.inputs, 15, 0),
	END_,
};
static const struct codec_field rep_seq_open[] = {
	U64(RP_, "seq", u.seq),
	END_,
};
static const struct codec_field rep_sync[] = {
	UINT_(RP_, "press", u.sync.press, IPC_PRESS_ONE, F_OPT),
	UINT_(RP_, "budget", u.sync.budget, UINT32_MAX, F_OPT),
	END_,
};
static const struct codec_field rep_seq_query[] = {
	U32(RP_, "syncs", u.query.syncs),
	U32(RP_, "seen_lo", u.query.seen_lo),
	U32(RP_, "seen_hi", u.query.seen_hi),
	U32(RP_, "len_lo", u.query.len_lo),
	U32(RP_, "len_hi", u.query.len_hi),
	U64(RP_, "last", u.query.last),
	END_,
};
static const struct codec_field rep_table[] = { /* every admin op */
	KIND_(RP_, "rows", F_ROWS, table),
	END_,
};
const struct codec_field *const codec_rep_fields[IPC_OP_COUNT] = {
	[IPC_OP_HELLO] = rep_hello,
	[IPC_OP_SEQ_OPEN] = rep_seq_open,
	[IPC_OP_SYNC] = rep_sync,
	[IPC_OP_SEQ_QUERY] = rep_seq_query,
	[IPC_OP_STATS] = rep_table,
	[IPC_OP_TENANTS] = rep_table,
	[IPC_OP_CHECK] = rep_table,
	[IPC_OP_POLICIES] = rep_table,
	[IPC_OP_CONFIG] = rep_table,
	[IPC_OP_DRAIN] = rep_table,
	[IPC_OP_CONFIG_SET] = rep_table,
};

uint64_t codec_field_get(const struct codec_field *f, const void *base)
{
	const char *p = (const char *)base + f->off;
	if (f->size == sizeof(uint64_t)) {
		uint64_t v;
		memcpy(&v, p, sizeof(v));
		return v;
	}
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

void codec_field_put(const struct codec_field *f, void *base, uint64_t v)
{
	char *p = (char *)base + f->off;
	if (f->size == sizeof(uint64_t)) {
		memcpy(p, &v, sizeof(v));
	} else {
		uint32_t w = (uint32_t)v;
		memcpy(p, &w, sizeof(w));
	}
}

/* ------------------------------------------- the largest valid messages */

/*
 * What the tables allow at most, however a peer encodes it: msgpack's
 * widest forms (5-byte headers of strings, arrays and maps, 9-byte
 * integers), every string at its field's length, every array at its
 * limit.  A message above these cannot decode, so the daemon may refuse
 * it by its size or its count of objects without decoding it.
 */
#define WIDE_HDR 5u /* str32, array32, map32 */
#define WIDE_UINT 9u

/* Bytes of key k with the widest value of field f after it. */
static size_t field_len_max(const struct codec_field *f)
{
	size_t key = WIDE_HDR + strlen(f->key);
	switch ((enum codec_field_kind)f->kind) {
	case F_UINT:
		return key + WIDE_UINT;
	case F_STR:
		return key + WIDE_HDR + f->size - 1;
	case F_GEO:
		return key + WIDE_HDR + CODEC_GEO_N * WIDE_UINT;
	case F_ITEMS:
		return key + WIDE_HDR +
		       (size_t)IPC_MAX_SYNC_ITEMS *
		               (WIDE_HDR + CODEC_ITEM_N * WIDE_UINT);
	case F_ROWS: {
		size_t val = WIDE_HDR + IPC_STR_MAX - 1;
		size_t col = WIDE_HDR + IPC_KEY_MAX - 1 +
		             (val > WIDE_UINT ? val : WIDE_UINT);
		return key + WIDE_HDR +
		       (size_t)IPC_MAX_ROWS * (WIDE_HDR + IPC_MAX_COLS * col);
	}
	case F_NONEMPTY:
		break;
	}
	return 0; /* not a key of its own */
}

/* Objects of key k and the largest value of field f. */
static uint64_t field_objs_max(const struct codec_field *f)
{
	switch ((enum codec_field_kind)f->kind) {
	case F_UINT:
	case F_STR:
		return 2;
	case F_GEO:
		return 2 + CODEC_GEO_N;
	case F_ITEMS:
		return 2 + (uint64_t)IPC_MAX_SYNC_ITEMS * (1 + CODEC_ITEM_N);
	case F_ROWS:
		return 2 + (uint64_t)IPC_MAX_ROWS * (1 + 2 * IPC_MAX_COLS);
	case F_NONEMPTY:
		break;
	}
	return 0;
}

/* Whether a request of op may carry "t" and "k". */
static bool op_has_creds(enum ipc_op op)
{
	return codec_op_needs_creds(op) || codec_op_is_admin(op);
}

size_t codec_req_len_max(enum ipc_op op)
{
	if (!codec_op_valid(op))
		return 0;
	/* the map, "v", "op" and its name, "t" and "k" */
	size_t n = WIDE_HDR + (WIDE_HDR + 1 + WIDE_UINT) +
	           (WIDE_HDR + 2 + WIDE_HDR + strlen(codec_op_names[op]));
	if (op_has_creds(op))
		n += 2 * (WIDE_HDR + 1 + WIDE_UINT);
	for (const struct codec_field *f = codec_req_fields[op]; f && f->key;
	     f++)
		n += field_len_max(f);
	return n;
}

uint64_t codec_req_objs_max(void)
{
	uint64_t most = 0;
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
		/* the map, "v", "op", "t", "k" (keys and values) */
		uint64_t n = 1 + 2 * 2 + (op_has_creds(op) ? 2 * 2 : 0);
		for (const struct codec_field *f = codec_req_fields[op];
		     f && f->key; f++)
			n += field_objs_max(f);
		most = n > most ? n : most;
	}
	return most;
}

uint64_t codec_rep_objs_max(void)
{
	uint64_t most = 0;
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
		/* the map, "v", "e" and, in an error reply instead of the
		 * body, "m" */
		uint64_t n = 1 + 2 * 2, body = 0;
		for (const struct codec_field *f = codec_rep_fields[op];
		     f && f->key; f++)
			body += field_objs_max(f);
		n += body > 2 ? body : 2;
		most = n > most ? n : most;
	}
	return most;
}
