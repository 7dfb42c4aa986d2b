/*
 * codec_row.c — building replies: error replies (codec_rep_error) and the
 * rows of table replies (codec_row_*), which truncate rather than fail;
 * see codec.h.
 */
#include "codec.h"

#include <string.h>

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
