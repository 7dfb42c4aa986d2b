/*
 * dispatch.c — one request on the loop: decode, validate, route to its
 * handler (hello, admin, the tenant ops: bye, seq_open, seq_close,
 * seq_query, sync), and the verdict: a reply encoded into the request's
 * message, a park (pool pressure, or a wait for the engine's GPU writes,
 * for idle syncs, or a seq_query's for its tenant's older parked
 * requests), or held (a sync job or the tenant's queue owns it).
 *
 * Every request is validated from scratch on each try, so a tenant that
 * vanished meanwhile gets its typed error, not a stale decision.  One sync
 * touches at most max_sync_lists page lists, which bounds how long it holds
 * the loop; an expensive one runs on a worker (jobs.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* tenant_sync_ready's wakeup, on a driver thread: the loop retries the
 * parked requests (srv_wake_cb). */
static void srv_wake_from_device(void *arg)
{
	struct server *s = arg;
	uv_async_send(&s->wake);
}

/*
 * The work of one sync follows the page lists it touches; max_sync_lists
 * bounds it, so one tenant's sync cannot hold the loop (and everyone
 * else's syncs) for long.  Layer ranges are counted as the sync would
 * clamp them; their validity is tenant_sync's to judge.
 */
static int srv_sync_bounded(const struct server *s,
                            const struct srv_tenant *st,
                            const struct ipc_sync_item *items, uint32_t n,
                            uint64_t *nlists, char *why, size_t wlen)
{
	const struct shm_geom *g = tenant_geom(st->t);
	uint64_t lists = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t hi = items[i].layer_hi, lo = items[i].layer_lo;
		if (!hi || hi > g->n_layers)
			hi = g->n_layers;
		lists += (uint64_t)(hi > lo ? hi - lo : 0) * g->n_kv_heads;
	}
	*nlists = lists;
	if (lists <= s->cfg.max_sync_lists)
		return 0;
	snprintf(why, wlen, "this sync touches %" PRIu64 " page lists "
	         "(items x layers x KV heads), more than max_sync_lists (%"
	         PRIu32 "): split it into smaller syncs", lists,
	         s->cfg.max_sync_lists);
	return KVT_ETOOBIG;
}

/*
 * 1 when an older request of st's connection is parked (pool pressure, or
 * waiting for the engine's GPU writes): a seq_query must not answer before
 * it, or it would report "not applied" for a sync that still may be.  The
 * parked list holds only requests older than the one being handled (a
 * retry detaches the list and re-parks in order, srv_retry_parked).
 */
static int srv_tenant_parked(const struct server *s,
                             const struct srv_tenant *st)
{
	for (const struct srv_req *r = s->parked_head; r; r = r->next)
		if (r->pipe_id == st->pipe_id)
			return 1;
	return 0;
}

static int srv_dispatch(struct server *s, struct srv_req *rq, int parked,
                        struct ipc_req *r, const struct srv_pipe *pipe,
                        struct ipc_rep *rep, char *why, size_t wlen)
{
	struct srv_tenant *st = NULL;
	int rv;
	if (codec_op_is_admin(r->op))
		return srv_admin(s, r, pipe, rep, why, wlen);
	if (s->draining) {
		snprintf(why, wlen, "kvtrimd is shutting down");
		return KVT_ESHUTDOWN;
	}
	if (r->op == IPC_OP_HELLO)
		return srv_hello(s, &r->u.hello, pipe, rep, why, wlen);
	if ((rv = srv_auth(s, r, pipe, &st, why, wlen)))
		return rv;
	if (st->busy) {
		/* Its requests stay in order behind the running sync. */
		rq->next = NULL;
		rq->held = 1;
		rq->held_parked = parked;
		if (st->wait_tail)
			st->wait_tail->next = rq;
		else
			st->wait_head = rq;
		st->wait_tail = rq;
		return SRV_TENANT_BUSY;
	}
	switch (r->op) {
	case IPC_OP_BYE:
		srv_reclaim(s, st, "client said bye");
		return 0;
	case IPC_OP_SEQ_OPEN: {
		uint32_t undone;
		rv = tenant_seq_reconcile(st->t, r->u.open.no, r->u.open.undo,
		                          &undone);
		s->st.sequences_closed_total += undone;
		if (rv == KVT_ESTALE) {
			snprintf(why, wlen, "seq_open %llu arrived after a "
			         "request numbered later: its client had given "
			         "it up, or numbers its requests out of order",
			         (unsigned long long)r->u.open.no);
			return rv;
		}
		if (rv)
			return srv_device_failed(s, st, rv, "seq_open");
		if (undone && (rv = srv_flush(s, st, why, wlen)))
			return rv;
		if (st->draining) {
			snprintf(why, wlen, "tenant '%s' is draining: no new "
			         "sequences (open ones continue)",
			         tenant_name(st->t));
			return KVT_ESHUTDOWN;
		}
		if (r->u.open.from)
			rv = tenant_seq_fork(st->t, r->u.open.from,
			                     &rep->u.seq, why, wlen);
		else
			rv = tenant_seq_open_why(st->t, &rep->u.seq, why,
			                         wlen);
		if (rv == KVT_ENOSEQ)
			snprintf(why, wlen, "no open sequence %#llx to copy on "
			         "tenant %u", (unsigned long long)r->u.open.from,
			         st->id);
		if (rv)
			return srv_device_failed(s, st, rv, "seq_open");
		s->st.sequences_opened_total++;
		return srv_flush(s, st, why, wlen);
	}
	case IPC_OP_SEQ_CLOSE:
		if ((rv = tenant_seq_close(st->t, r->u.seq)))
			return srv_device_failed(s, st, rv, "seq_close");
		s->st.sequences_closed_total++;
		return srv_flush(s, st, why, wlen);
	case IPC_OP_SEQ_QUERY:
		/* Answered after every older request of the tenant: those
		 * on a worker (busy, above) and parked ones. */
		if (srv_tenant_parked(s, st))
			return SRV_IDLE_WAIT;
		rv = tenant_seq_query(st->t, r->u.query.seq, r->u.query.no,
		                      r->u.query.after, &rep->u.query);
		if (rv == KVT_ENOSEQ)
			snprintf(why, wlen, "no open sequence %#llx on tenant "
			         "%u", (unsigned long long)r->u.query.seq,
			         st->id);
		else if (rv)
			snprintf(why, wlen, "seq_query %llu: \"after\" %llu "
			         "names a sync this client had not sent",
			         (unsigned long long)r->u.query.no,
			         (unsigned long long)r->u.query.after);
		return rv;
	case IPC_OP_SYNC: {
		uint64_t lists;
		if ((rv = srv_sync_bounded(s, st, r->u.sync.items,
		                           r->u.sync.n, &lists, why, wlen)))
			return rv;
		if (!tenant_sync_ready(st->t, srv_wake_from_device, s))
			return SRV_DEVICE_WAIT;
		if (srv_sync_offload(s, st, lists) &&
		    srv_job_start(s, st, rq, parked, r) == 0)
			return SRV_ASYNC;
		struct kvt_tenant_stats before, after;
		tenant_stats(st->t, &before);
		tenant_set_gather(st->t, 0); /* the loop waits for nobody */
		uint64_t t0 = now_us();
		rv = tenant_sync(st->t, r->u.sync.no, r->u.sync.items, r->u.sync.n,
		                 why, wlen);
		uint64_t us = now_us() - t0;
		tenant_stats(st->t, &after);
		if (!rv)
			tenant_sync_reply(st->t, rep);
		return srv_sync_finish(s, st, rv, r->u.sync.n, &before, &after,
		                       us, tenant_scorer_ns(st->t), why, wlen);
	}
	default:
		snprintf(why, wlen, "operation not handled");
		return KVT_EUNKNOWNOP;
	}
}

/*
 * A request refused unread (ctl.c, srv_take_unread): longer than any its
 * connection without a tenant may send.  Its reply, KVT_ETOOBIG, takes
 * its place; logged at most once a second (a peer may repeat it at will).
 */
static enum srv_verdict srv_refuse_unread(struct server *s,
                                          struct srv_req *r)
{
	struct ipc_rep rep;
	char why[KVT_ERRTEXT_MAX];
	uint8_t *out = NULL;
	size_t olen = 0;
	memset(&rep, 0, sizeof(rep));
	snprintf(why, sizeof(why), "request of %" PRIu32 " bytes on a "
	         "connection without a tenant, which may send only hello "
	         "and admin requests of at most %" PRIu32 " bytes: refused "
	         "unread", r->unread, s->ctl.low_msg_max);
	s->st.requests_total++;
	stats_count_error(&s->st, KVT_ETOOBIG);
	LOG_EVERY(LOG_LVL_INFO, 1000, "request refused: ETOOBIG: %s", why);
	codec_rep_error(&rep, KVT_ETOOBIG, why);
	if (codec_rep_encode(IPC_OP_NONE, &rep, &out, &olen)) {
		free(out);
		out = NULL;
		olen = 0;
	}
	free(r->msg);
	r->msg = out;
	r->len = olen;
	return SRV_REPLY;
}

/*
 * Handles one request.  SRV_PARK: it needs pool pages that may come free,
 * r->msg is kept untouched and the request is retried later (parked says
 * this is such a retry).  SRV_REPLY: r->msg now holds the reply, or is NULL
 * when none could be built (the context is then simply re-armed).
 * Every request is validated from scratch on each try, so a tenant that
 * vanished meanwhile gets its typed error, not a stale decision.
 */
enum srv_verdict srv_handle(struct server *s, struct srv_req *r,
                            int parked)
{
	struct ipc_req req;
	struct ipc_rep rep;
	char why[KVT_ERRTEXT_MAX] = "";
	const uint8_t *body = r->msg;
	size_t len = r->len;
	enum ipc_op op;
	int rv;
	const struct srv_pipe *pipe = srv_pipe_find(s, r->pipe_id);
	if (!pipe) {
		/* Its connection closed meanwhile (its tenant was reclaimed
		 * then): nobody would read a reply. */
		free(r->msg);
		r->msg = NULL;
		return SRV_REPLY;
	}
	if (r->unread)
		return srv_refuse_unread(s, r);

	int retry = parked || r->dev_wait || r->held;
	r->dev_wait = 0;
	r->held = 0;
	if (!retry)
		s->st.requests_total++;
	memset(&rep, 0, sizeof(rep));
	rep.version = IPC_PROTO_VERSION;
	rv = codec_req_decode(body, len, &req, why, sizeof(why));
	if (rv) {
		op = codec_peek_op(body, len);
	} else {
		op = req.op;
		rv = srv_dispatch(s, r, parked, &req, pipe, &rep, why,
		                  sizeof(why));
	}
	codec_req_free(&req);
	if (rv == SRV_ASYNC || rv == SRV_TENANT_BUSY) {
		codec_rep_free(&rep);
		return SRV_HELD;
	}
	if (rv == SRV_DEVICE_WAIT || rv == SRV_IDLE_WAIT) {
		/* Not a pressure wait: no deadline, no backpressure counts;
		 * the retry is a first try again (parked 0). */
		r->dev_wait = 1;
		if (!retry && rv == SRV_DEVICE_WAIT)
			s->st.device_waits_total++;
		codec_rep_free(&rep);
		return SRV_PARK;
	}
	return srv_conclude(s, r, op, rv, &rep, why, sizeof(why), parked);
}

/*
 * The end of a request's handling, with dispatch's result rv and reply
 * rep (consumed): parks it under pool pressure, or leaves its encoded reply
 * in r->msg (NULL when none could be built).
 */
enum srv_verdict srv_conclude(struct server *s, struct srv_req *r,
                              enum ipc_op op, int rv,
                              struct ipc_rep *rep, char *why,
                              size_t wlen, int parked)
{
	if (rv == KVT_EPOOLFULL && !s->draining &&
	    (op == IPC_OP_SYNC || op == IPC_OP_SEQ_OPEN)) {
		uint64_t now = now_ms();
		if (!parked && s->cfg.pressure_deadline_ms &&
		    s->n_parked < s->ctl.n_reqs / 2) {
			/* At most half the contexts wait, so the requests
			 * that free pages (close, bye) still get in. */
			r->park_deadline_ms = now + s->cfg.pressure_deadline_ms;
			s->st.backpressure_waits_total++;
			codec_rep_free(rep);
			LOG(LOG_LVL_INFO, "%s parked for up to %" PRIu32
			    " ms: %s", codec_op_name(op),
			    s->cfg.pressure_deadline_ms, why);
			return SRV_PARK;
		}
		if (parked && now < r->park_deadline_ms) {
			codec_rep_free(rep);
			return SRV_PARK;
		}
		if (parked) {
			size_t n = strlen(why);
			s->st.backpressure_timeouts_total++;
			snprintf(why + n, wlen - n, "%sno pages came free "
			         "within pressure_deadline_ms", n ? "; " : "");
		}
	} else if (parked && rv == 0) {
		s->st.backpressure_resumed_total++;
	}
	if (rv) {
		codec_rep_free(rep);
		codec_rep_error(rep, rv, why[0] ? why : kvt_strerror(rv));
		stats_count_error(&s->st, rv);
		LOG(LOG_LVL_INFO, "request %s refused: %s: %s",
		    codec_op_name(op) ? codec_op_name(op) : "?", kvt_errname(rv),
		    rep->msg);
	}
	uint8_t *out = NULL;
	size_t olen = 0;
	int erv = codec_rep_encode(op, rep, &out, &olen);
	codec_rep_free(rep);
	if (erv) {
		codec_rep_error(rep, erv, "cannot encode the reply");
		erv = codec_rep_encode(op, rep, &out, &olen);
	}
	if (op == IPC_OP_SYNC)
		stats_observe(&s->st.sync_latency_seconds,
		              (double)(now_us() - r->recv_us) / 1e6);
	/* The reply takes the request's place (none when it could not be
	 * encoded: the peer's request then times out). */
	free(r->msg);
	r->msg = erv ? NULL : out;
	r->len = erv ? 0 : olen;
	if (erv)
		free(out);
	return SRV_REPLY;
}

void srv_proceed(struct server *s, struct srv_req *r,
                 enum srv_verdict v)
{
	if (v == SRV_PARK)
		srv_park(s, r);
	else if (v == SRV_REPLY)
		srv_send(s, r);
}
