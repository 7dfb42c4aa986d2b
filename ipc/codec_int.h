/*
 * codec_int.h — what the files of the codec share, internal to ipc/codec*.c
 * (the interface is codec.h):
 *
 *   codec.c         op names, and the table of every message body
 *   codec_decode.c  strict decoding, walking the tables
 *   codec_encode.c  encoding, walking the same tables
 *   codec_scan.c    the raw msgpack walk before anything is allocated
 *   codec_row.c     building error replies and table rows
 */
#ifndef KVT_CODEC_INT_H
#define KVT_CODEC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"

/* ---- ops (codec.c) */

extern const char *const codec_op_names[IPC_OP_COUNT];
bool codec_op_valid(enum ipc_op op);
/* Ops whose requests carry "t" and "k" (admin ops may, optionally). */
bool codec_op_needs_creds(enum ipc_op op);
/* The op named s[0, n); IPC_OP_NONE when none is. */
enum ipc_op codec_op_lookup(const char *s, size_t n);

/* Most keys in a top-level map (hello, the largest, has 14); bounds the
 * decoder's quadratic duplicate check, fits its "used" bit mask, and
 * bounds the entries codec_peek_op looks at. */
#define TOP_KEYS_MAX 32

/* ---- message tables (codec.c) */

/*
 * Each message body is a table: one row per key, in wire order.  The
 * encoder writes the rows in that order, the decoder takes them in that
 * order (so the first bad field is the one reported) and refuses whatever
 * key is left, and the encoder's checks refuse exactly what the decoder
 * would.  A new field is one row.  Rows point into struct ipc_req or
 * struct ipc_rep by offset; a tuple's rows (geo, a sync item) into its own
 * struct.  A table ends with a row whose key is NULL.
 */
enum codec_field_kind {
	F_UINT,     /* uint32_t or uint64_t (by size), at most max */
	F_STR,      /* char[size]: shorter than size, no NUL inside */
	F_GEO,      /* struct kvt_geometry: the tuple codec_geo_fields */
	F_ITEMS,    /* ipc_req u.sync: an array of codec_item_fields tuples */
	F_ROWS,     /* ipc_rep table: an array of maps str -> value */
	F_NONEMPTY, /* not a key: the F_STR field at off (named key) must
	               not be "" */
};

#define F_OPT 1u /* absent decodes as 0 / ""; 0 / "" is not encoded */

struct codec_field {
	const char *key;
	uint8_t kind, flags;
	uint32_t size; /* bytes of the C field */
	size_t off;
	uint64_t max;  /* F_UINT */
};

/* Request bodies (after "v", "op", "t", "k") and success reply bodies
 * (after "v", "e") per op; NULL: no body. */
extern const struct codec_field *const codec_req_fields[IPC_OP_COUNT];
extern const struct codec_field *const codec_rep_fields[IPC_OP_COUNT];
/* "geo": [n_layers, n_heads, n_kv_heads, head_dim, d_model]. */
#define CODEC_GEO_N 5
extern const struct codec_field codec_geo_fields[CODEC_GEO_N];
/* A sync item: [seq, counter, n_new, phase, layer_lo, layer_hi] and an
 * optional headroom: CODEC_ITEM_MIN or CODEC_ITEM_N fields. */
#define CODEC_ITEM_N 7
#define CODEC_ITEM_MIN 6
extern const struct codec_field codec_item_fields[CODEC_ITEM_N];

/* The most msgpack objects a valid reply holds (any op): codec_req_objs_max's
 * counterpart, for codec_rep_decode. */
uint64_t codec_rep_objs_max(void);

/* The F_UINT field f of the struct at base. */
uint64_t codec_field_get(const struct codec_field *f, const void *base);
void codec_field_put(const struct codec_field *f, void *base, uint64_t v);

/* ---- raw scan (codec_scan.c) */

/* Deepest container nesting accepted by the scan (the protocol needs 3). */
#define SCAN_DEPTH 8

/* codec_scan_obj's result when the object holds more than *left objects. */
#define SCAN_TOO_MANY (-2)

/*
 * Steps *pos over one msgpack object of b[0, len), counting each object it
 * meets (containers and their elements, at every depth) off *left.
 * Returns 0; -1 with a static reason in *why when the bytes are not one
 * well-formed object within SCAN_DEPTH; SCAN_TOO_MANY (and a reason) when
 * it holds more than *left objects: a container whose count is above
 * *left is refused at its header.  Work is linear in the objects walked,
 * so at most the *left given: every element of a container consumes at
 * least one byte, and counts beyond the bytes left are refused before
 * recursing.
 */
int codec_scan_obj(const uint8_t *b, size_t len, size_t *pos, int depth,
                   uint64_t *left, const char **why);

#endif
