/*
 * fuzz_codec.c — libFuzzer target for the control-message decoders
 * (ipc/codec.h).
 *
 * Every input is tried as a request and as the reply to every op, and read
 * by codec_peek_op.  A decode that succeeds must round-trip: encoding the
 * decoded message has to succeed (the decoder accepted it, so it is within
 * every limit the encoder checks) and decoding that encoding must give the
 * same message field by field.  A failed decode must leave the output
 * zeroed with a reason, as codec.h promises.  Everything a decode or encode
 * allocates is released, so LeakSanitizer sees any leak of the codec.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise of the codec: report it as a crash the fuzzer keeps. */
#define MUST(c)                                                                \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "fuzz_codec: %s:%d: %s\n", __FILE__,   \
			        __LINE__, #c);                                 \
			abort();                                               \
		}                                                              \
	} while (0)

static int zeroed(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

static int req_eq(const struct ipc_req *a, const struct ipc_req *b)
{
	if (a->version != b->version || a->op != b->op ||
	    a->tenant != b->tenant || a->token != b->token)
		return 0;
	switch (a->op) {
	case IPC_OP_HELLO: {
		const struct ipc_hello *x = &a->u.hello, *y = &b->u.hello;
		return !strcmp(x->name, y->name) &&
		       !strcmp(x->policy, y->policy) &&
		       x->geo.n_layers == y->geo.n_layers &&
		       x->geo.n_heads == y->geo.n_heads &&
		       x->geo.n_kv_heads == y->geo.n_kv_heads &&
		       x->geo.head_dim == y->geo.head_dim &&
		       x->geo.d_model == y->geo.d_model &&
		       x->dtype == y->dtype &&
		       x->page_tokens == y->page_tokens &&
		       x->max_seqs == y->max_seqs &&
		       x->max_tokens == y->max_tokens &&
		       x->headroom == y->headroom &&
		       x->stage_tokens == y->stage_tokens &&
		       x->quota_bytes == y->quota_bytes &&
		       x->cookie == y->cookie && x->pid == y->pid;
	}
	case IPC_OP_SEQ_OPEN:
		return a->u.open.no == b->u.open.no &&
		       a->u.open.undo == b->u.open.undo;
	case IPC_OP_SEQ_CLOSE:
		return a->u.seq == b->u.seq;
	case IPC_OP_SEQ_QUERY:
		return a->u.query.seq == b->u.query.seq &&
		       a->u.query.no == b->u.query.no &&
		       a->u.query.after == b->u.query.after;
	case IPC_OP_SYNC:
		if (a->u.sync.n != b->u.sync.n || a->u.sync.no != b->u.sync.no)
			return 0;
		for (uint32_t i = 0; i < a->u.sync.n; i++) {
			const struct ipc_sync_item *x = &a->u.sync.items[i],
			                           *y = &b->u.sync.items[i];
			if (x->seq != y->seq || x->counter != y->counter ||
			    x->n_new != y->n_new || x->phase != y->phase ||
			    x->layer_lo != y->layer_lo ||
			    x->layer_hi != y->layer_hi ||
			    x->headroom != y->headroom)
				return 0;
		}
		return 1;
	case IPC_OP_STATS:
	case IPC_OP_CONFIG:
		return !strcmp(a->u.filter, b->u.filter);
	case IPC_OP_DRAIN:
		return !strcmp(a->u.drain.tenant, b->u.drain.tenant) &&
		       a->u.drain.undo == b->u.drain.undo;
	case IPC_OP_CONFIG_SET:
		return !strcmp(a->u.set.key, b->u.set.key) &&
		       !strcmp(a->u.set.value, b->u.set.value);
	default:
		return 1;
	}
}

static int val_eq(const struct ipc_val *x, const struct ipc_val *y)
{
	if (strcmp(x->key, y->key) || x->type != y->type)
		return 0;
	switch (x->type) {
	case IPC_VAL_U64:
		return x->v.u == y->v.u;
	case IPC_VAL_I64:
		return x->v.i == y->v.i;
	case IPC_VAL_F64: /* bitwise: NaN must come back as the same NaN */
		return !memcmp(&x->v.f, &y->v.f, sizeof(double));
	case IPC_VAL_STR:
		return !strcmp(x->v.s, y->v.s);
	}
	return 0;
}

static int rep_eq(enum ipc_op op, const struct ipc_rep *a,
                  const struct ipc_rep *b)
{
	if (a->version != b->version || a->err != b->err ||
	    strcmp(a->msg, b->msg) || a->table.n != b->table.n)
		return 0;
	if (a->err)
		return 1;
	if (op == IPC_OP_HELLO)
		return a->u.hello.tenant == b->u.hello.tenant &&
		       a->u.hello.token == b->u.hello.token &&
		       a->u.hello.max_seqs == b->u.hello.max_seqs &&
		       a->u.hello.max_tokens == b->u.hello.max_tokens &&
		       a->u.hello.headroom == b->u.hello.headroom &&
		       a->u.hello.stage_tokens == b->u.hello.stage_tokens &&
		       a->u.hello.page_tokens == b->u.hello.page_tokens &&
		       a->u.hello.quota_bytes == b->u.hello.quota_bytes &&
		       a->u.hello.inputs == b->u.hello.inputs;
	if (op == IPC_OP_SEQ_OPEN)
		return a->u.seq == b->u.seq;
	if (op == IPC_OP_SYNC)
		return a->u.sync.press == b->u.sync.press &&
		       a->u.sync.budget == b->u.sync.budget;
	if (op == IPC_OP_SEQ_QUERY)
		return !memcmp(&a->u.query, &b->u.query, sizeof(a->u.query));
	for (uint32_t r = 0; r < a->table.n; r++) {
		const struct ipc_row *x = &a->table.rows[r],
		                     *y = &b->table.rows[r];
		if (x->n != y->n)
			return 0;
		for (uint32_t i = 0; i < x->n; i++)
			if (!val_eq(&x->vals[i], &y->vals[i]))
				return 0;
	}
	return 1;
}

static void fuzz_req(const uint8_t *data, size_t size)
{
	struct ipc_req req, again;
	char err[KVT_ERRTEXT_MAX];
	uint8_t *enc = NULL;
	size_t elen = 0;

	int rc = codec_req_decode(data, size, &req, err, sizeof(err));
	if (rc) {
		MUST(rc < 0 && err[0]);
		MUST(zeroed(&req, sizeof(req)));
		codec_req_free(&req); /* documented as safe after a failure */
		return;
	}
	MUST(codec_op_name(req.op) != NULL);
	MUST(codec_peek_op(data, size) == req.op);
	MUST(codec_req_encode(&req, &enc, &elen) == 0);
	rc = codec_req_decode(enc, elen, &again, err, sizeof(err));
	if (rc)
		fprintf(stderr, "fuzz_codec: re-decode of %s: %s\n",
		        codec_op_name(req.op), err);
	MUST(rc == 0);
	MUST(req_eq(&req, &again));
	free(enc);
	codec_req_free(&again);
	codec_req_free(&req);
}

static void fuzz_rep(enum ipc_op op, const uint8_t *data, size_t size)
{
	struct ipc_rep *rep = malloc(sizeof(*rep)),
	               *again = malloc(sizeof(*again));
	char err[KVT_ERRTEXT_MAX];
	uint8_t *enc = NULL;
	size_t elen = 0;

	MUST(rep && again);
	int rc = codec_rep_decode(op, data, size, rep, err, sizeof(err));
	if (rc) {
		MUST(rc < 0 && err[0]);
		MUST(zeroed(rep, sizeof(*rep)));
		codec_rep_free(rep);
		goto out;
	}
	MUST(codec_rep_encode(op, rep, &enc, &elen) == 0);
	rc = codec_rep_decode(op, enc, elen, again, err, sizeof(err));
	if (rc)
		fprintf(stderr, "fuzz_codec: re-decode of the %s reply: %s\n",
		        codec_op_name(op), err);
	MUST(rc == 0);
	MUST(rep_eq(op, rep, again));
	free(enc);
	codec_rep_free(again);
	/* An error reply built on a decoded one releases its rows. */
	codec_rep_error(rep, KVT_EPROTO, NULL);
	MUST(rep->table.rows == NULL && rep->table.n == 0);
	codec_rep_free(rep);
out:
	free(rep);
	free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)codec_peek_op(data, size);
	fuzz_req(data, size);
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++)
		fuzz_rep((enum ipc_op)op, data, size);
	return 0;
}
