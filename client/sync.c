/*
 * sync.c — kvt_sync (one round trip) and kvt_sync_async / kvt_wait (one nng
 * context per ticket, at most CLIENT_MAX_TICKETS in flight), and on device
 * tenants the ordering around a sync: the engine's writes recorded before
 * it, the chunk bases uploaded and the daemon's compaction waited for after
 * it.  See client.h.
 */
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/protocol/reqrep0/req.h> /* NNG_OPT_REQ_RESENDTIME */

/* ---------------------------------------------------------------- sync */

/*
 * Item i of a sync, against the local sequence table: an open sequence of
 * this client (KVT_ENOSEQ), not in flight (KVT_EBUSY: one sync per
 * sequence at a time), not in doubt (KVT_ESTALE), a known phase.
 */
static int sync_item_check(kvt_client *c, const struct kvt_sync_item *items,
                           size_t i)
{
	uint32_t slot;
	unsigned long long id = (unsigned long long)items[i].seq;
	if (client_seq_lookup(c, items[i].seq, &slot) < 0) {
		client_set_err(c, "sync item %zu: no open sequence %#llx on "
		               "this client (closed, never opened, or another "
		               "client's)", i, id);
		return KVT_ENOSEQ;
	}
	if (c->seqs[slot].busy) {
		client_set_err(c, "sync item %zu: sequence %#llx has a sync in "
		               "flight; one sync per sequence at a time: "
		               "kvt_wait its ticket first", i, id);
		return KVT_EBUSY;
	}
	if (c->seqs[slot].doubt) {
		client_set_err(c, "sync item %zu: the last sync of sequence "
		               "%#llx ended without a verdict: kvt_seq_query "
		               "it to learn whether it was applied", i, id);
		return KVT_ESTALE;
	}
	if (items[i].phase > KVT_PHASE_DECODE) {
		client_set_err(c, "sync item %zu: unknown phase %u", i,
		               items[i].phase);
		return KVT_EINVAL;
	}
	return 0;
}

/*
 * Checks items against the local sequence table and builds the request
 * (req->u.sync.items is malloc'ed: free it).  Each item carries its
 * sequence's counter.  A sequence listed twice is passed on: the daemon
 * refuses it with a precise reason.
 */
static int build_sync(kvt_client *c, const struct kvt_sync_item *items,
                      size_t n, struct ipc_req *req)
{
	if (!items || n > IPC_MAX_SYNC_ITEMS) {
		client_set_err(c, "sync: %s", !items ? "items is NULL"
		               : "more than 4096 items");
		return KVT_EINVAL;
	}
	client_req_init(c, IPC_OP_SYNC, req);
	struct ipc_sync_item *w = malloc(n * sizeof(*w));
	if (!w)
		return KVT_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int rc = sync_item_check(c, items, i);
		if (rc < 0) {
			free(w);
			return rc;
		}
		uint32_t slot;
		client_seq_lookup(c, items[i].seq, &slot);
		struct seq_slot *s = &c->seqs[slot];
		w[i] = (struct ipc_sync_item){
			.seq = items[i].seq,
			.counter = s->counter,
			.n_new = items[i].n_new,
			.phase = items[i].phase,
			.layer_lo = items[i].layer_lo,
			.layer_hi = items[i].layer_hi,
			.headroom = s->want,
		};
		s->sent = s->want ? s->want : c->cfg.headroom;
	}
	req->u.sync.no = ++c->req_no;
	for (size_t i = 0; i < n; i++) {
		uint32_t slot;
		client_seq_lookup(c, items[i].seq, &slot);
		c->seqs[slot].sent_no = req->u.sync.no;
		c->seqs[slot].counted = 0;
	}
	req->u.sync.n = (uint32_t)n;
	req->u.sync.items = w;
	return 0;
}

/*
 * Device tenants: the engine's writes so far (on its stream) must land
 * before the daemon reads or moves entries, and the daemon's compaction
 * before the engine's next appends or attention on that stream.  No-ops
 * for host memory.
 */
static int device_before_sync(kvt_client *c)
{
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_record_writes(&c->mem, c->stream, why, sizeof(why));
	if (rc < 0)
		client_set_err(c, "%s", why);
	return rc;
}

int client_device_after(kvt_client *c)
{
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_device_after(&c->mem, c->stream, why, sizeof(why));
	if (rc < 0)
		client_set_err(c, "%s", why);
	return rc;
}

void client_count_sync(kvt_client *c, kvt_seq seq)
{
	uint32_t slot;
	if (client_seq_lookup(c, seq, &slot) == 0) {
		c->seqs[slot].counter++;
		c->seqs[slot].room = c->seqs[slot].sent;
	}
}

void client_note_sync(kvt_client *c, const struct ipc_rep *rep)
{
	c->last_sync.pressure = (float)rep->u.sync.press / (float)IPC_PRESS_ONE;
	c->last_sync.budget = rep->u.sync.budget;
	c->last_sync.syncs++;
}

int kvt_last_sync(const kvt_client *c, struct kvt_sync_info *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	*out = c->last_sync;
	return 0;
}

/* build_sync, then the device ordering before the request goes out;
 * on an error nothing is left to free. */
static int prepare_sync(kvt_client *c, const struct kvt_sync_item *items,
                        size_t n, struct ipc_req *req)
{
	int rc = build_sync(c, items, n, req);
	if (rc < 0)
		return rc;
	if ((rc = device_before_sync(c)) < 0)
		free(req->u.sync.items);
	return rc;
}

int kvt_sync(kvt_client *c, const struct kvt_sync_item *items, size_t n)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (n == 0)
		return 0; /* nothing appended: nothing to tell the daemon */
	struct ipc_req req;
	struct ipc_rep rep;
	int rc = prepare_sync(c, items, n, &req);
	if (rc < 0)
		return rc;
	rc = client_rpc(c, &req, &rep, c->cfg.timeout_ms);
	free(req.u.sync.items);
	if (rc == 0)
		client_note_sync(c, &rep);
	codec_rep_free(&rep);
	for (size_t i = 0; i < n; i++)
		if (rc == 0)
			client_count_sync(c, items[i].seq);
		else
			client_seq_doubt(c, items[i].seq, rc);
	if (rc == 0)
		rc = client_device_after(c);
	return rc;
}

static int ticket_prepare(kvt_client *c, struct ticket *t)
{
	if (t->ready)
		return 0;
	int rv = nng_ctx_open(&t->ctx, c->sock);
	if (rv)
		return client_from_nng(rv);
	if ((rv = nng_ctx_set_ms(t->ctx, NNG_OPT_REQ_RESENDTIME,
	                         NNG_DURATION_INFINITE)) ||
	    (rv = nng_aio_alloc(&t->aio, NULL, NULL))) {
		nng_ctx_close(t->ctx);
		return client_from_nng(rv);
	}
	t->ready = 1;
	return 0;
}

int kvt_sync_async(kvt_client *c, const struct kvt_sync_item *items,
                   size_t n, kvt_ticket *out)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (!out) {
		client_set_err(c, "kvt_sync_async: out is NULL");
		return KVT_EINVAL;
	}
	if (n == 0) {
		*out = KVT_TICKET_NONE; /* kvt_wait answers 0 at once */
		return 0;
	}
	if (!client_alive(c))
		return KVT_ECONN;
	int idx = -1;
	for (int i = 0; i < CLIENT_MAX_TICKETS && idx < 0; i++)
		if (!c->tickets[i].pending)
			idx = i;
	if (idx < 0) {
		client_set_err(c, "kvt_sync_async: %d syncs in flight already: "
		               "kvt_wait one first", CLIENT_MAX_TICKETS);
		return KVT_EBUSY;
	}
	struct ticket *t = &c->tickets[idx];

	struct ipc_req req;
	int rc = prepare_sync(c, items, n, &req);
	if (rc < 0)
		return rc;
	kvt_seq *seqs = malloc(n * sizeof(*seqs));
	uint8_t *buf = NULL;
	size_t len = 0;
	nng_msg *msg = NULL;
	if (!seqs)
		rc = KVT_ENOMEM;
	else if ((rc = ticket_prepare(c, t)) == 0 &&
	         (rc = codec_req_encode(&req, &buf, &len)) == 0) {
		int rv = nng_msg_alloc(&msg, 0);
		if (rv == 0 && (rv = nng_msg_append(msg, buf, len)) != 0)
			nng_msg_free(msg);
		rc = client_from_nng(rv);
	}
	free(buf);
	free(req.u.sync.items);
	if (rc < 0) {
		free(seqs);
		return rc;
	}

	/* The send completes once the request is handed to the pipe; only
	 * the reply is left to wait for. */
	nng_aio_set_msg(t->aio, msg);
	nng_aio_set_timeout(t->aio, c->cfg.timeout_ms);
	nng_ctx_send(t->ctx, t->aio);
	nng_aio_wait(t->aio);
	int rv = nng_aio_result(t->aio);
	if (rv) {
		/* A failed send hands the request back to the aio. */
		if ((msg = nng_aio_get_msg(t->aio)) != NULL)
			nng_msg_free(msg);
		nng_aio_set_msg(t->aio, NULL);
		free(seqs);
		client_set_err(c, "sending sync: %s", nng_strerror(rv));
		for (size_t i = 0; i < n; i++)
			client_seq_doubt(c, items[i].seq, client_from_nng(rv));
		return client_from_nng(rv);
	}
	nng_aio_set_timeout(t->aio, c->cfg.timeout_ms);
	nng_ctx_recv(t->ctx, t->aio);
	if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE))
		nng_aio_cancel(t->aio); /* see aio_step */

	for (size_t i = 0; i < n; i++) {
		uint32_t slot;
		seqs[i] = items[i].seq;
		if (client_seq_lookup(c, seqs[i], &slot) == 0)
			c->seqs[slot].busy = 1;
	}
	t->seqs = seqs;
	t->n = (uint32_t)n;
	t->pending = 1;
	if (++c->ticket_gen >= (1u << (32 - CLIENT_TICKET_BITS)))
		c->ticket_gen = 1;
	t->gen = c->ticket_gen;
	*out = (t->gen << CLIENT_TICKET_BITS) | (uint32_t)idx;
	return 0;
}

int kvt_wait(kvt_client *c, kvt_ticket tk)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (tk == KVT_TICKET_NONE)
		return 0; /* the ticket of a sync of no items */
	uint32_t idx = tk & ((1u << CLIENT_TICKET_BITS) - 1);
	struct ticket *t = &c->tickets[idx];
	if (!t->pending || t->gen != tk >> CLIENT_TICKET_BITS) {
		client_set_err(c, "kvt_wait: ticket %u is not in flight (never "
		               "issued, or waited for already)", tk);
		return KVT_EINVAL;
	}

	nng_aio_wait(t->aio);
	int rv = nng_aio_result(t->aio);
	int rc;
	struct ipc_rep rep;
	memset(&rep, 0, sizeof(rep));
	if (rv) {
		rc = client_from_nng(rv);
		client_set_err(c, "sync: %s", nng_strerror(rv));
	} else {
		nng_msg *msg = nng_aio_get_msg(t->aio);
		nng_aio_set_msg(t->aio, NULL);
		char why[KVT_ERRTEXT_MAX - 32];
		rc = codec_rep_decode(IPC_OP_SYNC, nng_msg_body(msg),
		                      nng_msg_len(msg), &rep, why, sizeof(why));
		nng_msg_free(msg);
		if (rc < 0)
			client_set_err(c, "bad sync reply: %s", why);
		else if ((rc = client_rep_code(rep.err)) < 0)
			snprintf(c->last_error, sizeof(c->last_error), "%s",
			         rep.msg[0] ? rep.msg : kvt_strerror(rc));
		else
			client_note_sync(c, &rep);
	}
	codec_rep_free(&rep);
	if (c->mem_live && !c->dead && client_drain(c) == KVT_ECONN &&
	    rc == KVT_ETIMEDOUT)
		rc = KVT_ECONN; /* no reply because the daemon is gone */

	for (uint32_t i = 0; i < t->n; i++) {
		uint32_t slot;
		if (client_seq_lookup(c, t->seqs[i], &slot) == 0)
			c->seqs[slot].busy = 0;
		if (rc == 0)
			client_count_sync(c, t->seqs[i]);
		else
			client_seq_doubt(c, t->seqs[i], rc);
	}
	free(t->seqs);
	t->seqs = NULL;
	t->n = 0;
	t->pending = 0;
	if (rc == 0)
		rc = client_device_after(c);
	return rc;
}
