/*
 * ctl.c — the nng control socket ctl.ipc (rep0): its contexts, the queues
 * between nng's threads and the loop, receive, admission and send, and
 * closing it.
 *
 * Each of cfg.contexts contexts (struct srv_req) serves one request at a
 * time: receive (nng thread, srv_req_cb) -> s->ready_* -> srv_wake_cb on
 * the loop admits it against its connection (srv_admit) and handles it
 * (dispatch.c) -> srv_send -> the send completion (nng thread) ->
 * s->done_* -> srv_done, which re-arms the receive.  nng's callbacks touch
 * only the queues (under qlock) and the wake-up; libuv may coalesce
 * wake-ups, so the loop drains whole queues each time.
 *
 * Two classes: requests of connections a tenant registered on are handled
 * as they come; those of connections without one (hellos, kvtrimctl, any
 * member of the group) wait in s->low_* and get SRV_LOW_SLICE per wake-up,
 * so a flood of those delays no tenant's sync by more than a slice.
 *
 * No peer can hold the daemon's contexts: a reply waits at most
 * send_timeout_ms for its peer to take it (the connection is then kicked,
 * pipes.c), and a connection has at most max_inflight_per_conn requests in
 * flight; more are dropped unanswered.
 *
 * Closing: a peer can wedge nng 1.5.2's pipe reaper, after which nng_close
 * never returns (pipes.c).  srv_close_nng ends the connections at the
 * socket first, gives nng_close SRV_NNG_CLOSE_MS, and goes on without it.
 */
#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_int.h"

/* nng drops a connection whose message exceeds this; messages between
 * IPC_MAX_MSG and this size get a KVT_ETOOBIG reply instead. */
#define SRV_RECV_MAX (4u * IPC_MAX_MSG)
#define SRV_CLOSE_WAIT_MS 1500 /* shutdown: for connections to drain */
#define SRV_NNG_CLOSE_MS 2000  /* shutdown: for nng_close */
/* Requests of connections without a tenant handled per wake-up, after
 * every tenant's: a flood from such peers delays a tenant's request by at
 * most this many cheap requests, not by the whole flood. */
#define SRV_LOW_SLICE 8

/* ---------------------------------------------------------- nng side */

/* Runs on nng threads: only the queue and the wake-up are touched here. */
static void srv_req_cb(void *arg)
{
	struct srv_req *r = arg;
	struct server *s = r->srv;
	int rv = nng_aio_result(r->aio);

	if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
		if (r->sending || rv == 0)
			nng_msg_free(nng_aio_get_msg(r->aio));
		r->sending = 0;
		return;
	}
	if (r->sending) {
		/* The loop accounts the reply to its connection and re-arms
		 * the context (srv_done). */
		if (rv != 0) {
			nng_msg_free(nng_aio_get_msg(r->aio));
			nng_aio_set_msg(r->aio, NULL);
			if (rv == NNG_ECLOSED)
				return;
		}
		r->send_rv = rv;
		r->next = NULL;
		pthread_mutex_lock(&s->qlock);
		if (s->done_tail)
			s->done_tail->next = r;
		else
			s->done_head = r;
		s->done_tail = r;
		pthread_mutex_unlock(&s->qlock);
		uv_async_send(&s->wake);
		return;
	}
	if (rv != 0) {
		if (rv == NNG_ECLOSED)
			return;
		nng_ctx_recv(r->ctx, r->aio);
		return;
	}
	r->msg = nng_aio_get_msg(r->aio);
	r->next = NULL;
	r->recv_us = now_us();
	pthread_mutex_lock(&s->qlock);
	if (s->ready_tail)
		s->ready_tail->next = r;
	else
		s->ready_head = r;
	s->ready_tail = r;
	pthread_mutex_unlock(&s->qlock);
	uv_async_send(&s->wake);
}

int srv_ctl_open(struct server *s, char *err, size_t errlen)
{
	char url[PATH_MAX + 8];
	mode_t old_umask;
	int rv;
	if ((rv = nng_rep0_open(&s->sock))) {
		snprintf(err, errlen, "nng: %s", nng_strerror(rv));
		return KVT_ESYS;
	}
	s->sock_open = 1;
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, SRV_RECV_MAX);
	s->max_pending = srv_pending_max(s);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, srv_pipe_cb, s);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, srv_pipe_cb, s);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, srv_pipe_cb, s);
	/* A stale socket file of a dead daemon would make listen fail. */
	unlink(s->ctl_path);
	snprintf(url, sizeof(url), "ipc://%s", s->ctl_path);
	/* Born 0660 (see server_new). */
	old_umask = umask(0117);
	if ((rv = nng_listener_create(&s->listener, s->sock, url)) ||
	    (rv = nng_listener_set_int(s->listener, NNG_OPT_IPC_PERMISSIONS,
	                               0660)) ||
	    (rv = nng_listener_start(s->listener, 0))) {
		umask(old_umask);
		snprintf(err, errlen, "cannot listen on %s: %s", url,
		         nng_strerror(rv));
		return KVT_ESYS;
	}
	umask(old_umask);
	for (uint32_t i = 0; i < s->cfg.contexts; i++) {
		struct srv_req *r = &s->reqs[i];
		r->srv = s;
		if ((rv = nng_ctx_open(&r->ctx, s->sock)) ||
		    (rv = nng_aio_alloc(&r->aio, srv_req_cb, r))) {
			snprintf(err, errlen, "nng: %s", nng_strerror(rv));
			return KVT_ESYS;
		}
		s->n_reqs = i + 1;
	}
	return 0;
}

/* ---------------------------------------------------------- loop side */

/* Arms r's context for the next request (no deadline: a connection may
 * stay quiet as long as it likes; idleness is the cron's business). */
void srv_recv(struct srv_req *r)
{
	r->pipe_id = 0;
	nng_aio_set_timeout(r->aio, NNG_DURATION_INFINITE);
	nng_ctx_recv(r->ctx, r->aio);
}

/* The request r is over (reply taken, or none): its connection has one
 * fewer in flight. */
static void srv_req_done(struct server *s, struct srv_req *r)
{
	struct srv_pipe *p = srv_pipe_find(s, r->pipe_id);
	srv_recv(r);
	if (!p)
		return;
	if (p->inflight)
		p->inflight--;
	p->last_ms = now_ms();
}

/*
 * Sends r's reply (or re-arms its context when there is none).  The send
 * waits at most send_timeout_ms for the connection to take it: a peer
 * that does not read cannot keep the context (srv_done closes it).
 */
void srv_send(struct server *s, struct srv_req *r)
{
	nng_msg *rep = r->msg;
	r->msg = NULL;
	if (!rep) {
		srv_req_done(s, r);
		return;
	}
	r->sending = 1;
	nng_aio_set_timeout(r->aio, (nng_duration)s->cfg.send_timeout_ms);
	nng_aio_set_msg(r->aio, rep);
	nng_ctx_send(r->ctx, r->aio);
}

/* Replies nng has finished with, from the done queue (loop thread). */
static void srv_done(struct server *s, struct srv_req *list)
{
	while (list) {
		struct srv_req *r = list;
		list = r->next;
		r->sending = 0;
		if (r->send_rv == NNG_ETIMEDOUT)
			srv_pipe_kick(s, r->pipe_id,
			              &s->st.control_conns_closed_send_timeout_total,
			              "it did not take a reply within "
			              "send_timeout_ms");
		srv_req_done(s, r);
	}
}

/*
 * A new request r: counted against its connection; one beyond
 * max_inflight_per_conn in flight (the client library never has more than
 * 17) is dropped unanswered.  0: handle r now; 1: r's connection has no
 * tenant, r waits in the low class; -1: r was dropped and its context
 * re-armed.
 */
static int srv_admit(struct server *s, struct srv_req *r)
{
	nng_pipe np = nng_msg_get_pipe(r->msg);
	uint64_t pid;
	r->pipe_id = (uint32_t)nng_pipe_id(np);
	struct srv_pipe *p = srv_pipe_find(s, r->pipe_id);
	if (!p && nng_pipe_get_uint64(np, NNG_OPT_IPC_PEER_PID, &pid)) {
		/* Its connection is gone (its removal was handled): nobody
		 * would read the reply. */
		nng_msg_free(r->msg);
		r->msg = NULL;
		srv_recv(r);
		return -1;
	}
	if (!p && !(p = srv_pipe_get(s, r->pipe_id)))
		return 0;
	p->rx_ms = now_ms();
	if (p->kicked || p->inflight >= s->cfg.max_inflight_per_conn) {
		/* Not answered: the context goes back to serving others.
		 * The connection stays open (it is closed when one of its
		 * replies misses send_timeout_ms, or when it idles without a
		 * tenant): closing a pipe from our side while its peer kept
		 * streaming requests left nng 1.5's pipe reaper stuck under
		 * load, after which no closed connection was ever released. */
		s->st.control_requests_dropped_total++;
		nng_msg_free(r->msg);
		r->msg = NULL;
		srv_recv(r);
		return -1;
	}
	p->inflight++;
	p->last_ms = now_ms();
	return !p->bound;
}

void srv_wake_cb(uv_async_t *a)
{
	struct server *s = a->data;
	struct srv_req *list, *done;
	struct srv_pipe_ev *evs;

	pthread_mutex_lock(&s->qlock);
	list = s->ready_head;
	s->ready_head = s->ready_tail = NULL;
	done = s->done_head;
	s->done_head = s->done_tail = NULL;
	evs = s->pipe_evs;
	s->pipe_evs = s->pipe_evs_tail = NULL;
	pthread_mutex_unlock(&s->qlock);

	srv_pipe_events(s, evs);
	srv_done(s, done);
	/* Waiting requests first: pages freed by the events above go to
	 * them before newcomers. */
	if (s->n_parked)
		srv_retry_parked(s);
	int handled = list != NULL;
	while (list) {
		struct srv_req *r = list;
		list = r->next;
		int cls = srv_admit(s, r);
		if (cls < 0)
			continue;
		if (cls) {
			r->next = NULL;
			if (s->low_tail)
				s->low_tail->next = r;
			else
				s->low_head = r;
			s->low_tail = r;
			continue;
		}
		srv_proceed(s, r, srv_handle(s, r, 0));
	}
	for (int k = 0; k < SRV_LOW_SLICE && s->low_head; k++) {
		struct srv_req *r = s->low_head;
		if (!(s->low_head = r->next))
			s->low_tail = NULL;
		srv_proceed(s, r, srv_handle(s, r, 0));
		handled = 1;
	}
	/* More left: come back after the loop's other events, taking the
	 * tenants' new requests first. */
	if (s->low_head)
		uv_async_send(&s->wake);
	/* Closes, byes and evicting syncs just handled may have freed what
	 * the parked ones wait for: do not leave that to the next tick. */
	if (handled && s->n_parked)
		srv_retry_parked(s);
}

/* ---------------------------------------------------------- closing */

static void *srv_nng_close_main(void *arg)
{
	struct server *s = arg;
	nng_close(s->sock);
	pthread_mutex_lock(&s->qlock);
	s->nng_closed = 1;
	pthread_cond_signal(&s->close_cv);
	pthread_mutex_unlock(&s->qlock);
	return NULL;
}

/*
 * nng_close, given SRV_NNG_CLOSE_MS.  A peer can wedge nng 1.5's pipe
 * reaper (srv_pipe_reap), and then nng_close never returns.  The daemon
 * then logs it, leaves nng as it is (its threads may still use the
 * contexts: server_free frees none of them) and goes on shutting down, so
 * it still exits instead of hanging until systemd kills it.  Returns
 * nonzero when nng was left so.
 */
static int srv_nng_close(struct server *s)
{
	pthread_t th;
	struct timespec until;
	int rc = 0;
	if (pthread_create(&th, NULL, srv_nng_close_main, s)) {
		nng_close(s->sock);
		return 0;
	}
	pthread_detach(th);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += SRV_NNG_CLOSE_MS / 1000;
	pthread_mutex_lock(&s->qlock);
	while (!s->nng_closed && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&s->close_cv, &s->qlock, &until);
	s->nng_wedged = !s->nng_closed;
	pthread_mutex_unlock(&s->qlock);
	if (s->nng_wedged)
		LOG(LOG_LVL_ERR, "nng did not close the control socket within "
		    "%d s (a peer wedged nng 1.5's pipe reaper); exiting "
		    "without waiting for it", SRV_NNG_CLOSE_MS / 1000);
	return s->nng_wedged;
}

/* Stops nng for good: no callback runs after this returns (unless nng
 * was left wedged: s->nng_wedged). */
void srv_close_nng(struct server *s)
{
	__atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
	if (s->sock_open) {
		/* Connections still streaming requests would race nng_close's
		 * pipe closes (srv_pipe_reap): end them at the socket first
		 * and give nng time to read what they queued and close them
		 * from the EOF. */
		srv_ctl_shutdown(s, NULL, 0);
		/* (Known wedged: nothing would come back.) */
		for (int i = 0; !s->unreleased && i < SRV_CLOSE_WAIT_MS / 10 &&
		                __atomic_load_n(&s->control_conns,
		                                __ATOMIC_RELAXED) > 0;
		     i++)
			usleep(10000);
		s->sock_open = 0;
		if (srv_nng_close(s))
			return;
	}
	for (uint32_t i = 0; i < s->n_reqs; i++)
		nng_aio_stop(s->reqs[i].aio);
	pthread_mutex_lock(&s->qlock);
	for (struct srv_req *r = s->ready_head; r; r = r->next) {
		nng_msg_free(r->msg);
		r->msg = NULL;
	}
	s->ready_head = s->ready_tail = NULL;
	s->done_head = s->done_tail = NULL; /* their messages are gone */
	pthread_mutex_unlock(&s->qlock);
	for (struct srv_req *r = s->parked_head; r; r = r->next) {
		nng_msg_free(r->msg);
		r->msg = NULL;
	}
	s->parked_head = s->parked_tail = NULL;
	for (struct srv_req *r = s->low_head; r; r = r->next) {
		nng_msg_free(r->msg);
		r->msg = NULL;
	}
	s->low_head = s->low_tail = NULL;
	s->n_parked = 0;
}
