/*
 * codec.h — the control-plane messages and their msgpack encoding
 * (protocol version IPC_PROTO_VERSION; every key of every message:
 * docs/protocol.md, "Messages" and "Keys").
 *
 * Pure functions: no I/O, no global state, safe on any bytes (fuzzable).
 * A decoder validates every field (type, range, string length, required
 * keys present, no unknown keys, no trailing bytes) and fails with
 * KVT_EPROTO (or KVT_EVERSION / KVT_EUNKNOWNOP / KVT_ETOOBIG) plus a one-line
 * reason; it never returns a half-filled message as success.  "v" is
 * checked first, so a peer of another version gets KVT_EVERSION.
 *
 * Limits: messages above IPC_MAX_MSG bytes are refused (KVT_ETOOBIG), and so
 * are messages of more msgpack objects than the largest valid one holds
 * (codec_req_objs_max), before they are unpacked; strings longer than
 * their field (KVT_NAME_MAX, KVT_SPEC_MAX ...) are refused.
 */
#ifndef KVT_CODEC_H
#define KVT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

#define IPC_PROTO_VERSION 4u
#define IPC_MAX_MSG (1u << 20)
#define IPC_MAX_SYNC_ITEMS 4096u
#define IPC_MAX_ROWS 4096u
#define IPC_MAX_COLS 96u
#define IPC_STR_MAX 256u /* longest string value in a row, with NUL */
#define IPC_KEY_MAX 48u  /* longest key in a row, with NUL */

#define IPC_OP_MAP(XX)                                                         \
	XX(HELLO, "hello")                                                     \
	XX(BYE, "bye")                                                         \
	XX(SEQ_OPEN, "seq_open")                                               \
	XX(SEQ_CLOSE, "seq_close")                                             \
	XX(SYNC, "sync")                                                       \
	XX(STATS, "stats")                                                     \
	XX(TENANTS, "tenants")                                                 \
	XX(CHECK, "check")                                                     \
	XX(POLICIES, "policies")                                               \
	XX(CONFIG, "config")                                                   \
	XX(DRAIN, "drain")                                                     \
	XX(CONFIG_SET, "config_set")                                           \
	XX(SEQ_QUERY, "seq_query")

enum ipc_op {
	IPC_OP_NONE = 0,
#define IPC_OP_ENUM_(name, str) IPC_OP_##name,
	IPC_OP_MAP(IPC_OP_ENUM_)
#undef IPC_OP_ENUM_
	IPC_OP_COUNT
};

/* "hello" for IPC_OP_HELLO ..., NULL for an out-of-range op. */
const char *codec_op_name(enum ipc_op op);

/* True for ops that need no registered tenant (stats, tenants, ...). */
int codec_op_is_admin(enum ipc_op op);

struct ipc_hello {
	char name[KVT_NAME_MAX];
	struct kvt_geometry geo;
	uint32_t dtype;
	uint32_t page_tokens, max_seqs, max_tokens, headroom, stage_tokens;
	char policy[KVT_SPEC_MAX];
	uint64_t quota_bytes;
	uint64_t cookie;
	uint32_t pid;
};

struct ipc_sync_item {
	uint64_t seq;
	uint32_t counter; /* the sequence's sync counter: syncs accepted so far */
	uint32_t n_new;
	uint32_t phase;   /* enum kvt_phase; decoder checks the range */
	uint32_t layer_lo, layer_hi; /* raw; range checks need the geometry */
	uint32_t headroom; /* room kept after this sync; 0 = registration's
	                      (optional 7th tuple field, sent when nonzero) */
};

#define IPC_PRESS_ONE 1000000u /* "press" of pressure level 1 */

/* A sequence as the daemon holds it (the seq_query reply). */
struct ipc_seq_state {
	uint32_t syncs;            /* its sync counter: syncs applied */
	uint32_t seen_lo, seen_hi; /* tokens appended per layer: fewest, most */
	uint32_t len_lo, len_hi;   /* committed entries per list: shortest,
	                              longest */
	uint64_t last;             /* number of the last sync applied to it
	                              (the request's "n"), 0 when none */
};

struct ipc_req {
	uint32_t version;
	enum ipc_op op;
	uint32_t tenant;
	uint64_t token;
	union {
		struct ipc_hello hello;
		uint64_t seq; /* seq_close */
		struct {
			uint64_t no;   /* the client's number for this open */
			uint64_t undo; /* the first of its opens since the last
			                  verdict that ended without one, 0 when
			                  none (tenant_seq_reconcile) */
			uint64_t from; /* open a copy of this sequence
			                  (kvt_seq_fork); 0: an empty one */
		} open; /* seq_open */
		struct {
			uint64_t seq;
			uint64_t no;    /* the client's number for this query
			                   (the same counter as syncs') */
			uint64_t after; /* the number of the client's sync of seq
			                   left in doubt, below no; 0 when none */
		} query; /* seq_query */
		struct {
			uint64_t no; /* the client's number for this sync:
			                increasing, never 0 */
			uint32_t n;
			struct ipc_sync_item *items; /* [n], owned by the req */
		} sync;
		char filter[KVT_NAME_MAX]; /* stats "tenant", config "key";
		                              "" when absent */
		struct {
			char tenant[KVT_NAME_MAX]; /* name or decimal id */
			uint32_t undo;             /* 0 drain, 1 admit again */
		} drain;
		struct {
			char key[KVT_NAME_MAX];
			char value[IPC_STR_MAX];
		} set; /* config_set */
	} u;
};

enum ipc_val_type { IPC_VAL_U64 = 0, IPC_VAL_I64, IPC_VAL_F64, IPC_VAL_STR };

struct ipc_val {
	char key[IPC_KEY_MAX];
	enum ipc_val_type type;
	union {
		uint64_t u;
		int64_t i;
		double f;
		char s[IPC_STR_MAX];
	} v;
};

struct ipc_row {
	uint32_t n;
	struct ipc_val vals[IPC_MAX_COLS];
};

struct ipc_rep {
	uint32_t version;
	int32_t err;                 /* 0 or a KVT_E* code */
	char msg[KVT_ERRTEXT_MAX];   /* "" when err == 0 */
	union {
		struct {
			uint32_t tenant;
			uint64_t token;
			uint32_t max_seqs, max_tokens, headroom, stage_tokens;
			uint32_t page_tokens;
			uint64_t quota_bytes;
			uint32_t inputs; /* KVT_INPUT_* bits */
		} hello;
		uint64_t seq; /* seq_open */
		struct {
			uint32_t press;  /* level * IPC_PRESS_ONE, rounded */
			uint32_t budget; /* entries per list; 0 = none */
		} sync;
		struct ipc_seq_state query; /* seq_query */
	} u;
	/* stats, tenants, policies, check, config.  Outside the union so that
	 * codec_rep_free can always release rows (NULL for other replies). */
	struct {
		uint32_t n;
		struct ipc_row *rows; /* [n], malloc'ed, owned by the rep */
	} table;
};

/*
 * Encoding.  *out is malloc'ed (free() it); *len its size.  The op of a reply
 * is given separately because replies do not carry it.  Returns 0 or
 * KVT_ENOMEM / KVT_EINVAL (a field out of range, e.g. too many items).
 */
int codec_req_encode(const struct ipc_req *req, uint8_t **out, size_t *len);
int codec_rep_encode(enum ipc_op op, const struct ipc_rep *rep, uint8_t **out,
                     size_t *len);

/*
 * Decoding.  On success *req / *rep is filled and may own memory: release it
 * with codec_req_free / codec_rep_free (also safe after a failed decode).
 * On failure returns a KVT_E* code and writes a reason into err.
 * codec_rep_decode needs the op the request had.  codec_rep_free releases
 * table.rows whoever allocated them (decoder or a caller building a reply),
 * so a caller that builds rows must malloc them.
 */
int codec_req_decode(const uint8_t *buf, size_t len, struct ipc_req *req,
                     char *err, size_t errlen);
int codec_rep_decode(enum ipc_op op, const uint8_t *buf, size_t len,
                     struct ipc_rep *rep, char *err, size_t errlen);
void codec_req_free(struct ipc_req *req);
void codec_rep_free(struct ipc_rep *rep);

/*
 * The largest valid requests, from the message tables (msgpack's widest
 * encodings, every string and array at its limit): codec_req_len_max is
 * the most bytes a request of op can take (0 for an invalid op), and
 * codec_req_objs_max the most msgpack objects any request holds (a sync
 * of IPC_MAX_SYNC_ITEMS items).  No request beyond them can decode:
 * codec_req_decode refuses one with more objects (KVT_ETOOBIG) after a
 * walk of at most that many, before msgpack-c unpacks anything, and the
 * daemon refuses longer requests where it knows their op's set.
 */
size_t codec_req_len_max(enum ipc_op op);
uint64_t codec_req_objs_max(void);

/*
 * Reads the request's "v" and "op" only, for error replies to a message that
 * failed full decoding; returns IPC_OP_NONE when unreadable.
 */
enum ipc_op codec_peek_op(const uint8_t *buf, size_t len);

/* Builds an error reply (version set, msg copied and truncated). */
void codec_rep_error(struct ipc_rep *rep, int err, const char *msg);

/*
 * Row helpers for table replies: append a value to a row; silently drop it
 * when the row is full (IPC_MAX_COLS) — rows are built from fixed field
 * lists, so that never happens outside a bug, which the unit test checks.
 */
void codec_row_u64(struct ipc_row *row, const char *key, uint64_t v);
void codec_row_i64(struct ipc_row *row, const char *key, int64_t v);
void codec_row_f64(struct ipc_row *row, const char *key, double v);
void codec_row_str(struct ipc_row *row, const char *key, const char *v);

/* Finds a key in a row; NULL when absent. */
const struct ipc_val *codec_row_get(const struct ipc_row *row, const char *key);

#endif
