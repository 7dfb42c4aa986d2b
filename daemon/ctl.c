/*
 * ctl.c — the control socket ctl.ipc, served on the loop: nng's SP req/rep
 * wire over a Unix stream socket (spwire.h; libkvtrim and kvtrimctl dial it
 * with nng's req0): accept, reads under flow control, the request pool, the
 * low class, replies and closing.
 *
 * Flow control: a connection with max_inflight_per_conn requests unanswered
 * or SRV_UNSENT_MAX bytes of replies the kernel has not taken is not read,
 * so its peer's writes block in its own socket (why nng's rep0 does not do
 * this: docs/design-changes.md).  Requests come from a pool of cfg.contexts;
 * with none free the connection waits on s->starved_*.  A tenant's
 * connection is served at once; the others (hellos, kvtrimctl, group
 * members) wait in s->low_* and get SRV_LOW_SLICE per turn of the loop.  A
 * connection without a tenant may send only hellos and admin requests of at
 * most s->ctl.low_msg_max bytes: a longer frame is refused unread (KVT_ETOOBIG)
 * and its bytes dropped, at most SRV_UNREAD_TICK per cron tick over all
 * connections.  A reply goes on its connection's write queue and its
 * request back to the pool at once, so no peer holds requests by not reading.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "handle.h"
#include "server_int.h"
#include "spwire.h"

/* A frame longer than this closes its connection (as nng's RECVMAXSZ did);
 * messages between IPC_MAX_MSG and this size get a KVT_ETOOBIG reply. */
#define SRV_RECV_MAX (4u * IPC_MAX_MSG)
/* Requests of connections without a tenant handled per turn of the loop,
 * after every tenant's: each decodes at most s->ctl.low_msg_max bytes. */
#define SRV_LOW_SLICE 8
#define SRV_RX_CHUNK 65536u /* read at least this much at a time */
/* A buffer above SRV_RX_BIG (a frame of more than 64 KiB on its way):
 * connections without a tenant may hold SRV_RX_BIG_MAX of them at once,
 * so a crowd of unregistered peers cannot make the daemon hold a big
 * buffer for each; the others wait (read again by the cron) until one is
 * done.  (Their frames that long are refused unread, srv_take_unread, so
 * this is a second line.) */
#define SRV_RX_BIG (2 * SRV_RX_CHUNK)
#define SRV_RX_BIG_MAX 8u
/* Bytes of frames refused unread the daemon reads (to drop them) per
 * cron tick, over all connections: 10 MiB/s at SRV_CRON_MS 100, no more
 * than a frame of IPC_MAX_MSG in one turn of the loop. */
#define SRV_UNREAD_TICK IPC_MAX_MSG
#define SRV_CACCEPT_BATCH 16
#define SRV_LISTEN_BACKLOG 512


/* ---------------------------------------------------------- the pool */

static struct srv_req *srv_req_take(struct server *s)
{
	struct srv_req *r = s->ctl.req_free;
	if (!r)
		return NULL;
	s->ctl.req_free = r->next;
	s->ctl.n_free--;
	r->next = NULL;
	return r;
}

/* Reads the connections waiting for a request again, in order, while
 * requests are free. */
static void srv_pump_starved(struct server *s)
{
	if (!s->ctl.starved_head || s->ctl.pumping_starved)
		return;
	/* In order, while requests last; a pump that takes the last one
	 * leaves its connection (and those after it) waiting. */
	s->ctl.pumping_starved = 1;
	/* Each waiting connection once: one that is refused again (the low
	 * class at its share) goes back to the end of the line. */
	uint32_t turns = 0;
	for (struct srv_pipe *p = s->ctl.starved_head; p; p = p->starved_next)
		turns++;
	while (s->ctl.starved_head && s->ctl.n_free && turns--) {
		struct srv_pipe *p = s->ctl.starved_head;
		if (!(s->ctl.starved_head = p->starved_next))
			s->ctl.starved_tail = NULL;
		p->starved = 0;
		p->starved_next = NULL;
		srv_pipe_pump(s, p);
	}
	s->ctl.pumping_starved = 0;
}

/* Back to the pool; a connection waiting for one is read again. */
static void srv_req_put(struct server *s, struct srv_req *r)
{
	if (r->low && s->ctl.n_low_held)
		s->ctl.n_low_held--;
	free(r->msg);
	memset(r, 0, sizeof(*r));
	r->srv = s;
	r->next = s->ctl.req_free;
	s->ctl.req_free = r;
	s->ctl.n_free++;
	srv_pump_starved(s);
}

/* ---------------------------------------------------------- reading */

/* Is p at one of its bounds (then it is not read)? */
static int srv_pipe_full(const struct server *s, const struct srv_pipe *p)
{
	return p->inflight >= s->cfg.max_inflight_per_conn ||
	       uv_stream_get_write_queue_size((const uv_stream_t *)&p->h) >
	               SRV_UNSENT_MAX;
}

static void srv_starve(struct server *s, struct srv_pipe *p)
{
	if (p->starved)
		return;
	p->starved = 1;
	p->starved_next = NULL;
	if (s->ctl.starved_tail)
		s->ctl.starved_tail->starved_next = p;
	else
		s->ctl.starved_head = p;
	s->ctl.starved_tail = p;
}

/* A request for p's next frame, or NULL: connections without a tenant
 * hold at most half the pool, so a tenant's request always finds one free
 * soon. */
static struct srv_req *srv_req_for(struct server *s,
                                   const struct srv_pipe *p)
{
	if (!p->bound && s->ctl.n_low_held >= (s->ctl.n_reqs + 1) / 2)
		return NULL;
	return srv_req_take(s);
}

/* A request of a connection without a tenant: the low class, served by
 * srv_wake_cb after the tenants' requests of this turn. */
static void srv_low_push(struct server *s, struct srv_req *r)
{
	r->next = NULL;
	if (s->ctl.low_tail)
		s->ctl.low_tail->next = r;
	else
		s->ctl.low_head = r;
	s->ctl.low_tail = r;
	uv_async_send(&s->wake);
}

/* k bytes of frames refused unread were read: off this tick's share. */
static void srv_unread_charge(struct server *s, uint32_t k)
{
	uint32_t *left = &s->ctl.unread_left;
	*left = *left > k ? *left - k : 0;
}

/* Is p dropping a frame refused unread with this tick's share spent (then
 * it is not read until the cron's next tick)? */
static int srv_pipe_held(const struct server *s, const struct srv_pipe *p)
{
	return p->rx_skip && !s->ctl.unread_left;
}

/* Drops what was read of a frame refused unread: 1 once all of it is
 * gone, 0 while more of it is to come. */
static int srv_skip(struct server *s, struct srv_pipe *p)
{
	uint32_t avail = p->rx_len - p->rx_off;
	uint32_t k = avail < p->rx_skip ? avail : p->rx_skip;
	p->rx_off += k;
	p->rx_skip -= k;
	p->rx_need = 0;
	srv_unread_charge(s, k);
	return !p->rx_skip;
}

/*
 * The frame at p's rx_off, of mlen message bytes (backtrace and body),
 * from a connection without a tenant and longer than any request it may
 * send: once its backtrace is in, a request carrying only the refusal
 * (r->unread, answered KVT_ETOOBIG by srv_handle) joins the low class, and
 * the frame's bytes are dropped as they come (rx_skip).  Returns as
 * srv_take_frame.
 */
static int srv_take_unread(struct server *s, struct srv_pipe *p,
                           uint64_t mlen)
{
	uint32_t avail = p->rx_len - p->rx_off;
	uint32_t head = SPW_HEAD_LEN + 4 * SPW_BT_MAX; /* mlen is longer */
	if (avail < head) {
		p->rx_need = head;
		return 0;
	}
	const uint8_t *m = p->rx + p->rx_off + SPW_HEAD_LEN;
	uint32_t bt = spw_backtrace(m, 4 * SPW_BT_MAX);
	struct srv_req *r = NULL;
	if (bt && !(r = srv_req_for(s, p))) {
		srv_starve(s, p);
		return -1;
	}
	uint64_t frame = SPW_HEAD_LEN + mlen; /* <= SRV_RECV_MAX + 9 */
	uint32_t k = avail < frame ? avail : (uint32_t)frame;
	p->rx_off += k;
	p->rx_skip = (uint32_t)(frame - k);
	p->rx_need = 0;
	srv_unread_charge(s, k);
	if (!r) {
		/* Malformed, or too many hops: dropped, as nng's rep0 does. */
		s->st.control_requests_dropped_total++;
		return 1;
	}
	memcpy(r->bt, m, bt);
	r->btlen = bt;
	r->unread = (uint32_t)(mlen - bt);
	r->pipe_id = p->id;
	r->recv_us = now_us();
	r->low = 1;
	s->ctl.n_low_held++;
	s->st.control_requests_unread_total++;
	p->inflight++;
	p->last_ms = now_ms();
	srv_low_push(s, r);
	return 1;
}

/*
 * Takes p's next frame: 1 taken (or the SP header, or the last bytes of a
 * frame refused unread), 0 more bytes needed (rx_need says how many), -1
 * no free request (p waits on s->starved_*), -2 p was closed (a protocol
 * error).
 */
static int srv_take_frame(struct server *s, struct srv_pipe *p)
{
	if (p->rx_skip && !srv_skip(s, p))
		return 0;
	const uint8_t *b = p->rx + p->rx_off;
	uint32_t avail = p->rx_len - p->rx_off;
	if (!p->greeted) {
		int h = spw_hello(b, avail, SPW_REQ0);
		if (h == SPW_MORE) {
			p->rx_need = SPW_HELLO_LEN;
			return 0;
		}
		if (h == SPW_BAD) {
			srv_pipe_close(s, p, &s->st.control_conns_closed_protocol_total,
			               "not an SP req0 peer");
			return -2;
		}
		p->greeted = 1;
		p->rx_off += SPW_HELLO_LEN;
		p->rx_need = 0;
		return 1;
	}
	uint64_t need, len;
	const uint8_t *m;
	const char *why;
	int f = spw_frame(b, avail, SRV_RECV_MAX, &need, &m, &len, &why);
	if (f == SPW_BAD) {
		srv_pipe_close(s, p, &s->st.control_conns_closed_protocol_total,
		               why);
		return -2;
	}
	/* (need is the whole frame's once its header is in) */
	if (!p->bound &&
	    need - SPW_HEAD_LEN > (uint64_t)s->ctl.low_msg_max + 4 * SPW_BT_MAX)
		return srv_take_unread(s, p, need - SPW_HEAD_LEN);
	if (f == SPW_MORE) {
		p->rx_need = (uint32_t)need;
		return 0;
	}
	uint32_t bt = spw_backtrace(m, len);
	if (!bt) {
		/* Malformed, or too many hops: dropped, as nng's rep0 does. */
		s->st.control_requests_dropped_total++;
		p->rx_off += (uint32_t)need;
		p->rx_need = 0;
		return 1;
	}
	struct srv_req *r = srv_req_for(s, p);
	if (!r) {
		srv_starve(s, p);
		return -1;
	}
	size_t n = (size_t)len - bt;
	r->msg = malloc(n ? n : 1);
	if (!r->msg) {
		/* Not read now: retried when memory or a request frees. */
		srv_req_put(s, r);
		srv_starve(s, p);
		return -1;
	}
	memcpy(r->msg, m + bt, n);
	r->len = n;
	memcpy(r->bt, m, bt);
	r->btlen = bt;
	r->pipe_id = p->id;
	r->recv_us = now_us();
	r->low = !p->bound;
	s->ctl.n_low_held += r->low;
	p->rx_off += (uint32_t)need;
	p->rx_need = 0;
	p->inflight++;
	p->last_ms = now_ms();
	if (p->bound)
		srv_proceed(s, r, srv_handle(s, r, 0));
	else
		srv_low_push(s, r);
	return 1;
}

static void srv_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct srv_pipe *p = h->data;
	(void)suggested;
	if (p->rx_off == p->rx_len)
		p->rx_off = p->rx_len = 0;
	uint32_t want = p->rx_need > SRV_RX_CHUNK ? p->rx_need : SRV_RX_CHUNK;
	if (p->rx_cap - p->rx_len < SRV_RX_CHUNK ||
	    p->rx_cap - p->rx_off < want) {
		if (p->rx_off) {
			memmove(p->rx, p->rx + p->rx_off, p->rx_len - p->rx_off);
			p->rx_len -= p->rx_off;
			p->rx_off = 0;
		}
		uint32_t cap = p->rx_len + SRV_RX_CHUNK;
		if (cap < want)
			cap = want;
		struct server *s = p->srv;
		int big = cap > SRV_RX_BIG && !p->big && !p->bound;
		if (big && s->ctl.n_big_rx >= SRV_RX_BIG_MAX)
			cap = p->rx_cap; /* waits: ENOBUFS when full */
		if (cap > p->rx_cap) {
			uint8_t *nb = realloc(p->rx, cap);
			if (nb) {
				p->rx = nb;
				p->rx_cap = cap;
				if (big) {
					p->big = 1;
					s->ctl.n_big_rx++;
				}
			}
		}
	}
	buf->base = (char *)p->rx + p->rx_len;
	buf->len = p->rx_cap - p->rx_len;
}

static void srv_read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
	struct srv_pipe *p = st->data;
	struct server *s = p->srv;
	(void)buf;
	if (n == UV_ENOBUFS) {
		/* Out of memory for the buffer: not read until the cron's
		 * next try (srv_pipe_cron), rather than at once, forever. */
		uv_read_stop(st);
		p->reading = 0;
		return;
	}
	if (n < 0) {
		srv_pipe_close(s, p, NULL, n == UV_EOF ? "" : uv_strerror((int)n));
		return;
	}
	p->rx_len += (uint32_t)n;
	srv_pipe_pump(s, p);
}

void srv_pipe_pump(struct server *s, struct srv_pipe *p)
{
	if (p->closing || p->pumping)
		return;
	p->pumping = 1;
	int got = 1;
	while (!p->closing && !p->starved && !srv_pipe_full(s, p) &&
	       !srv_pipe_held(s, p) && (got = srv_take_frame(s, p)) > 0)
		;
	p->pumping = 0;
	if (p->closing)
		return;
	/* (A held one is read again by the cron: srv_pipe_cron.) */
	int want = !p->starved && !srv_pipe_full(s, p) && !srv_pipe_held(s, p);
	if (!want && p->reading)
		s->st.control_reads_paused_total++;
	if (want != p->reading) {
		if (want)
			uv_read_start((uv_stream_t *)&p->h, srv_alloc_cb,
			              srv_read_cb);
		else
			uv_read_stop((uv_stream_t *)&p->h);
		p->reading = want;
	}
	/* A shrunk buffer keeps no idle megabytes. */
	if (p->rx_off == p->rx_len && p->rx_cap > SRV_RX_BIG) {
		free(p->rx);
		p->rx = NULL;
		p->rx_off = p->rx_len = p->rx_cap = 0;
		if (p->big && s->ctl.n_big_rx)
			s->ctl.n_big_rx--;
		p->big = 0;
	}
	(void)got;
}

/* ---------------------------------------------------------- replies */

struct srv_wr {
	uv_write_t w;
	uint8_t head[SPW_HEAD_LEN + 4 * SPW_BT_MAX];
	uint8_t *body;
};

static void srv_write_cb(uv_write_t *w, int status)
{
	struct srv_wr *q = (struct srv_wr *)w;
	struct srv_pipe *p = w->handle->data;
	struct server *s = p->srv;
	free(q->body);
	free(q);
	if (status == UV_ECANCELED || p->closing)
		return;
	if (status) {
		srv_pipe_close(s, p, NULL, uv_strerror(status));
		return;
	}
	uint64_t now = now_ms();
	p->last_ms = now;
	p->stall_ms = uv_stream_get_write_queue_size((uv_stream_t *)&p->h)
	                      ? now : 0;
	srv_pipe_pump(s, p);
}

/* Queues body[len] (taken) with the backtrace bt[btlen] on p. */
static void srv_write(struct server *s, struct srv_pipe *p, const uint8_t *bt,
                      uint32_t btlen, uint8_t *body, size_t len)
{
	struct srv_wr *q = malloc(sizeof(*q));
	if (!q) {
		free(body);
		srv_pipe_close(s, p, NULL, "out of memory for a reply");
		return;
	}
	spw_head_put(q->head, (uint64_t)btlen + len);
	memcpy(q->head + SPW_HEAD_LEN, bt, btlen);
	q->body = body;
	uv_buf_t bufs[2] = {uv_buf_init((char *)q->head, SPW_HEAD_LEN + btlen),
	                    uv_buf_init((char *)body, (unsigned)len)};
	int was = uv_stream_get_write_queue_size((uv_stream_t *)&p->h) > 0;
	int rv = uv_write(&q->w, (uv_stream_t *)&p->h, bufs, len ? 2 : 1,
	                  srv_write_cb);
	if (rv) {
		free(body);
		free(q);
		srv_pipe_close(s, p, NULL, uv_strerror(rv));
		return;
	}
	if (!was && uv_stream_get_write_queue_size((uv_stream_t *)&p->h))
		p->stall_ms = now_ms();
}

void srv_send(struct server *s, struct srv_req *r)
{
	struct srv_pipe *p = srv_pipe_find(s, r->pipe_id);
	if (p && r->msg && !s->stopping) {
		srv_write(s, p, r->bt, r->btlen, r->msg, r->len);
		r->msg = NULL;
	}
	if (p && p->inflight)
		p->inflight--;
	srv_req_put(s, r);
	if (p)
		srv_pipe_pump(s, p);
}

/* ---------------------------------------------------------- the low class */

void srv_wake_cb(uv_async_t *a)
{
	struct server *s = a->data;
	/* Waiting requests first: pages freed since go to them before
	 * newcomers (a device wake-up lands here too). */
	if (s->n_parked)
		srv_retry_parked(s);
	int handled = 0;
	for (int k = 0; k < SRV_LOW_SLICE && s->ctl.low_head; k++) {
		struct srv_req *r = s->ctl.low_head;
		if (!(s->ctl.low_head = r->next))
			s->ctl.low_tail = NULL;
		r->next = NULL;
		if (!srv_pipe_find(s, r->pipe_id)) {
			/* Its connection is gone: nobody would read it. */
			srv_send(s, r);
			continue;
		}
		srv_proceed(s, r, srv_handle(s, r, 0));
		handled = 1;
	}
	/* More left: come back after the loop's other events, taking the
	 * tenants' new requests first. */
	if (s->ctl.low_head)
		uv_async_send(&s->wake);
	/* Closes and byes just handled may have freed what the parked ones
	 * wait for: do not leave that to the next tick. */
	if (handled && s->n_parked)
		srv_retry_parked(s);
}

/* ---------------------------------------------------------- accept */

static void srv_caccept_cb(uv_poll_t *h, int status, int events);

void srv_ctl_start(struct server *s)
{
	if (s->ctl.cpoll_ready && !uv_is_closing((uv_handle_t *)&s->ctl.cpoll))
		uv_poll_start(&s->ctl.cpoll, UV_READABLE, srv_caccept_cb);
}

void srv_ctl_stop_accepting(struct server *s)
{
	/* Closed, not just unpolled: a client dialling during the drain is
	 * refused at once instead of waiting in the backlog. */
	if (s->ctl.cpoll_ready && !uv_is_closing((uv_handle_t *)&s->ctl.cpoll))
		uv_close((uv_handle_t *)&s->ctl.cpoll, NULL);
	if (s->ctl.csock >= 0) {
		close(s->ctl.csock);
		s->ctl.csock = -1;
	}
	s->ctl.caccept.paused = 0;
}

void srv_ctl_cron(struct server *s, uint64_t now)
{
	/* (A connection starved by a failed allocation, with every request
	 * free, has nothing else to wake it.) */
	srv_pump_starved(s);
	/* The next tick's share of frames refused unread; the connections
	 * held for it are read again by srv_pipe_cron. */
	s->ctl.unread_left = SRV_UNREAD_TICK;
	if (srv_backoff_over(&s->ctl.caccept, s, now))
		srv_ctl_start(s);
}

/* A new connection fd (non-blocking, close-on-exec): our SP header, then
 * it is read; unless its peer is at one of srv_pipe_room's bounds: it is
 * then told why (refuse.c). */
static void srv_pipe_open(struct server *s, int fd)
{
	uint32_t pid = 0, uid = 0, gid = 0;
	char why[KVT_ERRTEXT_MAX - 48], text[KVT_ERRTEXT_MAX];
	if (handle_peer(fd, &pid, &uid, &gid)) {
		close(fd);
		return;
	}
	int rv = srv_pipe_room(s, pid, uid, gid, why, sizeof(why));
	if (rv) {
		snprintf(text, sizeof(text), "kvtrimd refused this control "
		         "connection: %s", why);
		srv_refuse(s, fd, rv, text);
		srv_accept_hold(s, &s->ctl.caccept, &s->ctl.cpoll);
		return;
	}
	struct srv_pipe *p = calloc(1, sizeof(*p));
	if (!p) {
		close(fd);
		return;
	}
	p->srv = s;
	p->pid = pid;
	p->uid = uid;
	p->gid = gid;
	p->born_ms = p->last_ms = now_ms();
	do
		p->id = ++s->ctl.next_pipe_id;
	while (!p->id || srv_pipe_find(s, p->id));
	if (uv_pipe_init(&s->loop, &p->h, 0)) {
		close(fd);
		free(p);
		return;
	}
	p->h.data = p;
	if (uv_pipe_open(&p->h, fd)) {
		close(fd);
		srv_pipe_close(s, p, NULL, NULL);
		return;
	}
	if (srv_pipe_add(s, p)) {
		/* (the handle owns fd: its close closes it) */
		srv_pipe_close(s, p, NULL, NULL);
		return;
	}
	struct srv_wr *q = malloc(sizeof(*q));
	if (!q) {
		srv_pipe_close(s, p, NULL, "out of memory");
		return;
	}
	spw_hello_put(q->head, SPW_REP0);
	q->body = NULL;
	uv_buf_t b = uv_buf_init((char *)q->head, SPW_HELLO_LEN);
	if (uv_write(&q->w, (uv_stream_t *)&p->h, &b, 1, srv_write_cb)) {
		free(q);
		srv_pipe_close(s, p, NULL, "cannot send the SP header");
		return;
	}
	srv_pipe_pump(s, p);
}

static void srv_caccept_cb(uv_poll_t *h, int status, int events)
{
	struct server *s = h->data;
	(void)status;
	(void)events;
	/* A bounded batch: the poll calls again while connections queue. */
	for (int i = 0; i < SRV_CACCEPT_BATCH && !s->draining; i++) {
		int fd;
		int rv = handle_accept(s->ctl.csock, &fd);
		if (rv == KVT_EBUSY)
			return;
		if (rv) {
			srv_accept_failed(s, &s->ctl.caccept, &s->ctl.cpoll,
			                  "ctl.ipc",
			                  &s->st.control_accept_failures_total,
			                  errno);
			return;
		}
		s->ctl.caccept.pause_ms = 0;
		srv_pipe_open(s, fd);
		if (s->ctl.caccept.paused) /* srv_accept_hold */
			return;
	}
}

/* ---------------------------------------------------------- open, close */

/* The longest request a connection without a tenant may send: a hello or
 * an admin request (its other requests are refused by srv_auth). */
static uint32_t srv_low_msg_max(void)
{
	size_t most = codec_req_len_max(IPC_OP_HELLO);
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++)
		if (codec_op_is_admin((enum ipc_op)op) &&
		    codec_req_len_max((enum ipc_op)op) > most)
			most = codec_req_len_max((enum ipc_op)op);
	return (uint32_t)most;
}

int srv_ctl_open(struct server *s, char *err, size_t errlen)
{
	struct sockaddr_un a;
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	if (strlen(s->ctl_path) >= sizeof(a.sun_path)) {
		snprintf(err, errlen, "socket path too long: %s", s->ctl_path);
		return KVT_EINVAL;
	}
	memcpy(a.sun_path, s->ctl_path, strlen(s->ctl_path));
	s->ctl.csock = socket(AF_UNIX,
	                      SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->ctl.csock < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return KVT_ESYS;
	}
	/* A stale socket file of a dead daemon would make bind fail (the
	 * runtime dir's lock is ours: no live daemon owns it). */
	unlink(s->ctl_path);
	mode_t old = umask(0117); /* born 0660 (see server_new) */
	int rv = bind(s->ctl.csock, (struct sockaddr *)&a, sizeof(a));
	umask(old);
	if (rv || chmod(s->ctl_path, 0660) ||
	    listen(s->ctl.csock, SRV_LISTEN_BACKLOG)) {
		snprintf(err, errlen, "cannot listen on %s: %s", s->ctl_path,
		         strerror(errno));
		return KVT_ESYS;
	}
	if (uv_poll_init(&s->loop, &s->ctl.cpoll, s->ctl.csock)) {
		snprintf(err, errlen, "cannot poll %s", s->ctl_path);
		return KVT_ESYS;
	}
	s->ctl.cpoll.data = s;
	s->ctl.cpoll_ready = 1;
	for (uint32_t i = 0; i < s->cfg.contexts; i++) {
		struct srv_req *r = &s->ctl.reqs[i];
		r->srv = s;
		r->next = s->ctl.req_free;
		s->ctl.req_free = r;
	}
	s->ctl.n_reqs = s->ctl.n_free = s->cfg.contexts;
	s->ctl.low_msg_max = srv_low_msg_max();
	s->ctl.unread_left = SRV_UNREAD_TICK;
	return 0;
}

int srv_ctl_writing(const struct server *s)
{
	for (uint32_t i = 0; i < s->ctl.pipes_cap; i++) {
		const struct srv_pipe *p = s->ctl.pipes[i];
		if (p && uv_stream_get_write_queue_size(
		                 (const uv_stream_t *)&p->h))
			return 1;
	}
	return 0;
}

static void srv_free_list(struct server *s, struct srv_req **head,
                          struct srv_req **tail)
{
	for (struct srv_req *r = *head, *n; r; r = n) {
		n = r->next;
		free(r->msg);
		r->msg = NULL;
	}
	*head = NULL;
	if (tail)
		*tail = NULL;
	(void)s;
}

void srv_ctl_close(struct server *s)
{
	__atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
	/* (Each close shifts the table: the first left, until none is.) */
	while (s->ctl.n_pipes) {
		uint32_t i = 0;
		while (!s->ctl.pipes[i])
			i++;
		srv_pipe_close(s, s->ctl.pipes[i], NULL,
		               "daemon shutting down");
	}
	srv_refuse_close_all(s);
	s->ctl.starved_head = s->ctl.starved_tail = NULL;
	srv_free_list(s, &s->ctl.low_head, &s->ctl.low_tail);
	srv_free_list(s, &s->parked_head, &s->parked_tail);
	s->n_parked = 0;
	if (s->ctl.cpoll_ready && !uv_is_closing((uv_handle_t *)&s->ctl.cpoll))
		uv_close((uv_handle_t *)&s->ctl.cpoll, NULL);
	if (s->ctl.csock >= 0) {
		/* libuv's poll handle does not own the descriptor */
		close(s->ctl.csock);
		s->ctl.csock = -1;
	}
}
