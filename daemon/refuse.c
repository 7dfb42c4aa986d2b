/*
 * refuse.c — control connections refused at accept (srv_pipe_room's
 * limits), told why instead of being shut: the daemon sends its SP header,
 * reads the peer's first frame as far as its request id, answers it with
 * an error reply (the code and text srv_pipe_room chose, which
 * kvt_connect returns and kvtrimctl prints), and closes the connection
 * when the peer hangs up or SRV_REFUSE_MS after the accept, whichever
 * comes first.  The rest of the request is never decoded.
 *
 * A refusal must not become a way to hold the daemon's fds or time: at
 * most SRV_REFUSALS_MAX are open at once (a new one closes the oldest),
 * each lives SRV_REFUSE_MS at most and reads SRV_REFUSE_READ_MAX bytes at
 * most into one buffer all of them share, and none is in the connection
 * table or counts as a connection without a tenant.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server_int.h"

#define SRV_REFUSE_MS 1000
#define SRV_REFUSE_READ_MAX 65536u
/* The peer's SP header, its first frame's head and the longest backtrace:
 * all of a request a refusal reads before its answer. */
#define SRV_REFUSE_IN (SPW_HELLO_LEN + SPW_HEAD_LEN + 4 * SPW_BT_MAX)

struct srv_refusal {
	uv_pipe_t h; /* h.data: this */
	struct server *srv;
	struct srv_refusal *prev, *next; /* s->ref.refusals, newest first */
	uint64_t born_ms;
	int code;
	char why[KVT_ERRTEXT_MAX];
	uint8_t in[SRV_REFUSE_IN]; /* the first bytes read */
	uint32_t got;
	uint64_t read;             /* bytes read in all */
	int answered, closing;
	uv_write_t hello_w, reply_w;
	uint8_t hello[SPW_HELLO_LEN];
	uint8_t head[SPW_HEAD_LEN + 4 * SPW_BT_MAX]; /* the reply's frame head
	                                                and backtrace */
	uint8_t *body; /* the encoded error reply (malloc'd) */
};

static void srv_refusal_free_cb(uv_handle_t *h)
{
	struct srv_refusal *r = h->data;
	free(r->body);
	free(r);
}

static void srv_refusal_close(struct srv_refusal *r)
{
	struct server *s = r->srv;
	if (r->closing)
		return;
	r->closing = 1;
	if (r->prev)
		r->prev->next = r->next;
	else
		s->ref.refusals = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		s->ref.refusals_tail = r->prev;
	s->ref.n_refusals--;
	uv_close((uv_handle_t *)&r->h, srv_refusal_free_cb);
}

static void srv_refusal_wrote_cb(uv_write_t *w, int status)
{
	struct srv_refusal *r = w->handle->data;
	if (status && !r->closing)
		srv_refusal_close(r);
}

/*
 * The request id of the peer's first frame, from what was read: SPW_OK
 * with *btlen, SPW_MORE, or SPW_BAD (not an SP req0 peer, a frame of
 * another type, or no backtrace where nng puts one).
 */
static int srv_refusal_bt(const struct srv_refusal *r, uint32_t *btlen)
{
	int h = spw_hello(r->in, r->got, SPW_REQ0);
	if (h != SPW_OK)
		return h;
	const uint8_t *f = r->in + SPW_HELLO_LEN, *m;
	uint32_t have = r->got - SPW_HELLO_LEN;
	uint64_t need, len;
	const char *why;
	int fr = spw_frame(f, have, UINT64_MAX, &need, &m, &len, &why);
	if (fr == SPW_BAD || (fr == SPW_MORE && have < SPW_HEAD_LEN))
		return fr;
	/* The message as far as it was read (all of it, or its first
	 * 4 x SPW_BT_MAX bytes at least once `in` is full). */
	uint64_t msg = need - SPW_HEAD_LEN, got = have - SPW_HEAD_LEN;
	uint64_t seen = got < msg ? got : msg;
	if ((*btlen = spw_backtrace(f + SPW_HEAD_LEN, seen)))
		return SPW_OK;
	return seen == msg || seen >= 4 * SPW_BT_MAX ? SPW_BAD : SPW_MORE;
}

/* Queues the error reply to the request whose backtrace is in r->in. */
static void srv_refusal_answer(struct srv_refusal *r, uint32_t btlen)
{
	struct ipc_rep rep;
	size_t len = 0;
	memset(&rep, 0, sizeof(rep));
	codec_rep_error(&rep, r->code, r->why);
	r->answered = 1;
	if (codec_rep_encode(IPC_OP_HELLO, &rep, &r->body, &len)) {
		srv_refusal_close(r);
		return;
	}
	spw_head_put(r->head, (uint64_t)btlen + len);
	memcpy(r->head + SPW_HEAD_LEN,
	       r->in + SPW_HELLO_LEN + SPW_HEAD_LEN, btlen);
	uv_buf_t b[2] = {uv_buf_init((char *)r->head, SPW_HEAD_LEN + btlen),
	                 uv_buf_init((char *)r->body, (unsigned)len)};
	if (uv_write(&r->reply_w, (uv_stream_t *)&r->h, b, 2,
	             srv_refusal_wrote_cb))
		srv_refusal_close(r);
}

static void srv_refusal_alloc_cb(uv_handle_t *h, size_t suggested,
                                 uv_buf_t *buf)
{
	struct srv_refusal *r = h->data;
	(void)suggested;
	*buf = uv_buf_init((char *)r->srv->ref.refuse_rx,
	                   sizeof(r->srv->ref.refuse_rx));
}

/* Keeps the first bytes, answers once the request id is known; EOF, an
 * error, a peer that is not an SP req0 one or one that writes more than
 * SRV_REFUSE_READ_MAX is closed. */
static void srv_refusal_read_cb(uv_stream_t *st, ssize_t n,
                                const uv_buf_t *buf)
{
	struct srv_refusal *r = st->data;
	if (n == 0 || r->closing)
		return;
	if (n < 0 || (r->read += (uint64_t)n) > SRV_REFUSE_READ_MAX) {
		srv_refusal_close(r);
		return;
	}
	uint32_t room = (uint32_t)sizeof(r->in) - r->got;
	uint32_t take = (uint64_t)n < room ? (uint32_t)n : room;
	memcpy(r->in + r->got, buf->base, take);
	r->got += take;
	if (r->answered)
		return;
	uint32_t btlen = 0;
	int rc = srv_refusal_bt(r, &btlen);
	if (rc == SPW_BAD)
		srv_refusal_close(r);
	else if (rc == SPW_OK)
		srv_refusal_answer(r, btlen);
}

void srv_refuse(struct server *s, int fd, int code, const char *why)
{
	if (s->ref.n_refusals >= SRV_REFUSALS_MAX && s->ref.refusals_tail)
		srv_refusal_close(s->ref.refusals_tail);
	struct srv_refusal *r = calloc(1, sizeof(*r));
	if (!r) {
		close(fd);
		return;
	}
	r->srv = s;
	r->code = code;
	snprintf(r->why, sizeof(r->why), "%s", why);
	r->born_ms = now_ms();
	if (uv_pipe_init(&s->loop, &r->h, 0)) {
		close(fd);
		free(r);
		return;
	}
	r->h.data = r;
	r->next = s->ref.refusals;
	if (s->ref.refusals)
		s->ref.refusals->prev = r;
	else
		s->ref.refusals_tail = r;
	s->ref.refusals = r;
	s->ref.n_refusals++;
	if (uv_pipe_open(&r->h, fd)) {
		close(fd);
		srv_refusal_close(r);
		return;
	}
	spw_hello_put(r->hello, SPW_REP0);
	uv_buf_t b = uv_buf_init((char *)r->hello, SPW_HELLO_LEN);
	if (uv_write(&r->hello_w, (uv_stream_t *)&r->h, &b, 1,
	             srv_refusal_wrote_cb) ||
	    uv_read_start((uv_stream_t *)&r->h, srv_refusal_alloc_cb,
	                  srv_refusal_read_cb))
		srv_refusal_close(r);
}

void srv_refuse_cron(struct server *s, uint64_t now)
{
	while (s->ref.refusals_tail &&
	       now - s->ref.refusals_tail->born_ms >= SRV_REFUSE_MS)
		srv_refusal_close(s->ref.refusals_tail);
}

void srv_refuse_close_all(struct server *s)
{
	while (s->ref.refusals)
		srv_refusal_close(s->ref.refusals);
}
