/*
 * server.c — see server.h.
 *
 * Request path: nng context receives (nng thread) -> srv_ready queue ->
 * loop thread decodes, validates, applies, sends any chunk grants over the
 * client's handle channel, encodes the reply -> nng_ctx_send -> the send
 * completion (nng thread) re-arms the receive.
 *
 * Leases: a tenant is bound to one handle-channel connection and one nng
 * pipe, both from the same process (peer pid checked at hello).  When
 * either closes, or the process is gone, the tenant is reclaimed at once.
 */
#include "server.h"

#include <errno.h>
#include <inttypes.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "codec.h"
#include "handle.h"
#include "kvtrim.h"
#include "log.h"
#include "policy.h"
#include "pool.h"
#include "stats.h"
#include "tenant.h"

/* nng drops a connection whose message exceeds this; messages between
 * IPC_MAX_MSG and this size get a KVT_ETOOBIG reply instead. */
#define SRV_RECV_MAX (4u * IPC_MAX_MSG)
#define SRV_CRON_MS 100
#define SRV_DRAIN_MS 200

struct server;

struct srv_req {
	struct server *srv;
	nng_ctx ctx;
	nng_aio *aio;
	int sending;
	nng_msg *msg;        /* received request, owned by the loop */
	struct srv_req *next; /* ready queue */
};

struct srv_tenant;

struct srv_conn {
	struct server *srv;
	int fd;
	uv_poll_t poll;
	uint64_t cookie;
	uint32_t pid, uid, gid;
	uint64_t born_ms;
	struct srv_tenant *st; /* bound tenant, NULL until hello */
	struct srv_conn *prev, *next;
	int closing;
};

struct srv_tenant {
	struct tenant *t;
	uint32_t id;
	uint64_t token;
	uint32_t pipe_id;
	uint32_t pid;
	struct srv_conn *conn;
};

struct srv_pipe_ev {
	uint32_t pipe_id;
	struct srv_pipe_ev *next;
};

struct server {
	struct config cfg;
	uv_loop_t loop;
	struct pool pool;
	struct stats st;
	uint64_t started_ms;

	nng_socket sock;
	nng_listener listener;
	int sock_open;
	struct srv_req *reqs; /* [cfg.contexts] */
	uint32_t n_reqs;

	pthread_mutex_t qlock;   /* guards ready_* and pipe_evs */
	struct srv_req *ready_head, *ready_tail;
	struct srv_pipe_ev *pipe_evs;
	uv_async_t wake;

	int hsock;
	uv_poll_t hpoll;
	struct srv_conn *conns;

	struct srv_tenant **tenants; /* [cfg.max_tenants] */
	uint32_t next_tenant_id;

	uv_signal_t sigterm, sigint;
	uv_timer_t cron, drain;
	int draining;
	volatile int stopping; /* set before nng_close: callbacks stop re-arming */
	uint64_t drain_started_ms;
	int loop_ready;

	char ctl_path[PATH_MAX], fd_path[PATH_MAX];
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static uint64_t random_u64(void)
{
	uint64_t v = 0;
	while (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
		;
	return v;
}

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
		r->sending = 0;
		if (rv != 0) {
			nng_msg_free(nng_aio_get_msg(r->aio));
			if (rv == NNG_ECLOSED)
				return;
		}
		nng_ctx_recv(r->ctx, r->aio);
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
	pthread_mutex_lock(&s->qlock);
	if (s->ready_tail)
		s->ready_tail->next = r;
	else
		s->ready_head = r;
	s->ready_tail = r;
	pthread_mutex_unlock(&s->qlock);
	uv_async_send(&s->wake);
}

static void srv_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct server *s = arg;
	struct srv_pipe_ev *e = malloc(sizeof(*e));
	if (!e)
		return; /* the pid check in cron still reclaims the tenant */
	e->pipe_id = (uint32_t)nng_pipe_id(p);
	pthread_mutex_lock(&s->qlock);
	e->next = s->pipe_evs;
	s->pipe_evs = e;
	pthread_mutex_unlock(&s->qlock);
	uv_async_send(&s->wake);
}

/* ---------------------------------------------------------- tenants */

static struct srv_tenant *srv_find_tenant(struct server *s, uint32_t id)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] && s->tenants[i]->id == id)
			return s->tenants[i];
	return NULL;
}

static void srv_conn_close(struct srv_conn *c);

static void srv_reclaim(struct server *s, struct srv_tenant *st,
                        const char *why)
{
	struct kvt_tenant_stats ts;
	tenant_stats(st->t, &ts);
	LOG(LOG_LVL_NOTICE,
	    "tenant %" PRIu32 " '%s' (pid %" PRIu32 ") released: %s; "
	    "%" PRIu64 " pages, %" PRIu64 " chunks back to the pool",
	    st->id, tenant_name(st->t), st->pid, why, ts.pages_used, ts.chunks);
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] == st)
			s->tenants[i] = NULL;
	tenant_free(st->t);
	if (st->conn) {
		st->conn->st = NULL;
		srv_conn_close(st->conn);
	}
	free(st);
}

/* ---------------------------------------------------------- handle channel */

static void srv_conn_closed_cb(uv_handle_t *h)
{
	struct srv_conn *c = h->data;
	close(c->fd);
	free(c);
}

static void srv_conn_close(struct srv_conn *c)
{
	struct server *s = c->srv;
	if (c->closing)
		return;
	c->closing = 1;
	if (c->st) {
		struct srv_tenant *st = c->st;
		st->conn = NULL;
		c->st = NULL;
		s->st.tenants_reclaimed_total++;
		srv_reclaim(s, st, "handle channel closed");
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	uv_close((uv_handle_t *)&c->poll, srv_conn_closed_cb);
}

static void srv_conn_cb(uv_poll_t *p, int status, int events)
{
	struct srv_conn *c = p->data;
	char buf[256];
	/* Clients never send on this channel; anything readable is either EOF
	 * (the process closed it or died) or noise, which is discarded. */
	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EINTR) && status >= 0 &&
		    !(events & UV_DISCONNECT))
			return;
		break;
	}
	srv_conn_close(c);
}

static void srv_accept_cb(uv_poll_t *p, int status, int events)
{
	struct server *s = p->data;
	for (;;) {
		int fd;
		int rv = handle_accept(s->hsock, &fd);
		if (rv == KVT_EBUSY)
			return;
		if (rv) {
			LOG(LOG_LVL_WARNING, "fd.sock accept failed: %s",
			    strerror(errno));
			return;
		}
		struct srv_conn *c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			return;
		}
		c->srv = s;
		c->fd = fd;
		c->cookie = random_u64();
		c->born_ms = now_ms();
		handle_peer(fd, &c->pid, &c->uid, &c->gid);
		struct handle_msg m = {.magic = HANDLE_MAGIC,
		                       .type = HANDLE_WELCOME,
		                       .cookie = c->cookie};
		if (handle_send(fd, &m, -1) ||
		    uv_poll_init(&s->loop, &c->poll, fd)) {
			close(fd);
			free(c);
			continue;
		}
		c->poll.data = c;
		uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, srv_conn_cb);
		c->next = s->conns;
		if (s->conns)
			s->conns->prev = c;
		s->conns = c;
		LOG(LOG_LVL_DEBUG, "handle channel from pid %" PRIu32, c->pid);
	}
}

static int srv_send_event(void *ctx, const struct tenant_event *e)
{
	struct srv_conn *c = ctx;
	struct handle_msg m = {.magic = HANDLE_MAGIC,
	                       .type = (uint16_t)e->type,
	                       .slot = e->slot,
	                       .size = e->size};
	return handle_send(c->fd, &m, e->type == HANDLE_CHUNK_ADD ? e->fd : -1);
}

/* ---------------------------------------------------------- requests */

static int srv_auth(struct server *s, const struct ipc_req *r, nng_pipe pipe,
                    struct srv_tenant **out, char *why, size_t wlen)
{
	struct srv_tenant *st = srv_find_tenant(s, r->tenant);
	if (!st || st->token != r->token ||
	    st->pipe_id != (uint32_t)nng_pipe_id(pipe)) {
		snprintf(why, wlen, "tenant %" PRIu32 " is not registered on "
		         "this connection", r->tenant);
		return KVT_ENOTENANT;
	}
	*out = st;
	return 0;
}

/* Sends queued chunk grants before the reply; a client that cannot take
 * them loses its tenant (its lease cannot be honoured any more). */
static int srv_flush(struct server *s, struct srv_tenant *st, char *why,
                     size_t wlen)
{
	int rv = tenant_flush_events(st->t, srv_send_event, st->conn);
	if (rv) {
		snprintf(why, wlen, "handle channel to the client failed (%s)",
		         kvt_strerror(rv));
		s->st.tenants_reclaimed_total++;
		srv_reclaim(s, st, "handle channel send failed");
		return KVT_ECONN;
	}
	return 0;
}

static int srv_hello(struct server *s, const struct ipc_hello *h, nng_pipe pipe,
                     struct ipc_rep *rep, char *why, size_t wlen)
{
	struct srv_conn *c;
	for (c = s->conns; c; c = c->next)
		if (!c->closing && c->cookie == h->cookie)
			break;
	if (!c) {
		snprintf(why, wlen, "unknown handle-channel cookie: connect to "
		         "fd.sock first and send its welcome cookie");
		return KVT_ENOTENANT;
	}
	if (c->st) {
		snprintf(why, wlen, "this handle channel already has a tenant");
		return KVT_EEXIST;
	}
	uint64_t ppid = 0;
	if (nng_pipe_get_uint64(pipe, NNG_OPT_IPC_PEER_PID, &ppid) == 0 &&
	    ppid != c->pid) {
		snprintf(why, wlen, "control connection (pid %" PRIu64 ") and "
		         "handle channel (pid %" PRIu32 ") are different "
		         "processes", ppid, c->pid);
		return KVT_EPERM;
	}
	uint32_t slot = s->cfg.max_tenants;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (!s->tenants[i]) {
			slot = i;
			break;
		}
	if (slot == s->cfg.max_tenants) {
		snprintf(why, wlen, "too many tenants (max_tenants %" PRIu32 ")",
		         s->cfg.max_tenants);
		return KVT_EBUSY;
	}
	struct srv_tenant *st = calloc(1, sizeof(*st));
	if (!st)
		return KVT_ENOMEM;
	uint64_t quota = s->cfg.default_quota ? s->cfg.default_quota
	                                      : pool_bytes_total(&s->pool);
	int rv = tenant_new(&s->pool, s->next_tenant_id, h, quota, &st->t, why,
	                    wlen);
	if (rv) {
		free(st);
		return rv;
	}
	const struct shm_geom *g = tenant_geom(st->t);
	struct handle_msg tm = {.magic = HANDLE_MAGIC, .type = HANDLE_TABLE,
	                        .size = g->table_bytes};
	struct handle_msg sm = {.magic = HANDLE_MAGIC, .type = HANDLE_STAGE,
	                        .size = g->stage_bytes};
	if (handle_send(c->fd, &tm, tenant_table_fd(st->t)) ||
	    handle_send(c->fd, &sm, tenant_stage_fd(st->t))) {
		tenant_free(st->t);
		free(st);
		snprintf(why, wlen, "cannot send segments over the handle channel");
		return KVT_ECONN;
	}
	st->id = s->next_tenant_id++;
	st->token = random_u64();
	st->pipe_id = (uint32_t)nng_pipe_id(pipe);
	st->pid = c->pid;
	st->conn = c;
	c->st = st;
	s->tenants[slot] = st;
	s->st.tenants_registered_total++;

	rep->u.hello.tenant = st->id;
	rep->u.hello.token = st->token;
	rep->u.hello.max_seqs = g->max_seqs;
	rep->u.hello.max_tokens = g->max_tokens;
	rep->u.hello.headroom = g->headroom;
	rep->u.hello.stage_tokens = g->stage_tokens;
	rep->u.hello.page_tokens = g->page_tokens;
	rep->u.hello.quota_bytes = tenant_quota(st->t);
	LOG(LOG_LVL_NOTICE,
	    "tenant %" PRIu32 " '%s' registered (pid %" PRIu32 ", policy '%s', "
	    "quota %" PRIu64 " bytes, page %" PRIu64 " bytes)",
	    st->id, tenant_name(st->t), st->pid, tenant_policy_spec(st->t),
	    tenant_quota(st->t), g->page_bytes);
	return 0;
}

static struct ipc_row *srv_rows(struct ipc_rep *rep, uint32_t n)
{
	rep->table.rows = calloc(n ? n : 1, sizeof(struct ipc_row));
	rep->table.n = rep->table.rows ? n : 0;
	return rep->table.rows;
}

static void srv_stats_row(struct server *s, struct ipc_row *row)
{
	uint64_t kv_bytes = 0, seqs = 0, kept = 0, pages = 0, tenants = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st)
			continue;
		struct kvt_tenant_stats ts;
		tenant_stats(st->t, &ts);
		kv_bytes += ts.pages_used * tenant_geom(st->t)->page_bytes;
		seqs += ts.sequences;
		kept += ts.entries_kept;
		pages += ts.pages_used;
		tenants++;
	}
	uint64_t total = pool_bytes_total(&s->pool);
	uint64_t used = s->pool.chunks_used * KVT_CHUNK_BYTES;
	codec_row_str(row, "version", "0.1.0");
	codec_row_u64(row, "uptime_s", (now_ms() - s->started_ms) / 1000);
	codec_row_str(row, "backend", "cpu");
	codec_row_u64(row, "pool_bytes_total", total);
	codec_row_u64(row, "pool_bytes_used", used);
	codec_row_u64(row, "pool_bytes_free", total - used);
	codec_row_u64(row, "kv_bytes_used", kv_bytes);
	codec_row_u64(row, "chunks_total", s->pool.chunk_capacity);
	codec_row_u64(row, "chunks_used", s->pool.chunks_used);
	codec_row_u64(row, "pages_used", pages);
	codec_row_u64(row, "tenants", tenants);
	codec_row_u64(row, "sequences", seqs);
	codec_row_u64(row, "entries_kept", kept);
	stats_fill_row(&s->st, row);
}

static void srv_tenant_row(struct srv_tenant *st, struct ipc_row *row)
{
	struct kvt_tenant_stats ts;
	tenant_stats(st->t, &ts);
	codec_row_u64(row, "id", st->id);
	codec_row_str(row, "name", tenant_name(st->t));
	codec_row_u64(row, "pid", st->pid);
	codec_row_str(row, "policy", tenant_policy_spec(st->t));
	codec_row_u64(row, "pages_used", ts.pages_used);
	codec_row_u64(row, "pages_free", ts.pages_free);
	codec_row_u64(row, "chunks", ts.chunks);
	codec_row_u64(row, "sequences", ts.sequences);
	codec_row_u64(row, "syncs", ts.syncs);
	codec_row_u64(row, "entries_kept", ts.entries_kept);
	codec_row_u64(row, "entries_appended", ts.entries_appended);
	codec_row_u64(row, "entries_evicted", ts.entries_evicted);
	codec_row_u64(row, "quota_bytes", ts.quota_bytes);
}

/* The pool-level invariant plus every tenant's own. */
static void srv_check(struct server *s, struct ipc_row *row)
{
	char detail[IPC_STR_MAX] = "";
	uint64_t violations = 0, chunks = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st)
			continue;
		char d[IPC_STR_MAX - 32];
		int v = tenant_check(st->t, d, sizeof(d));
		if (v > 0 && !violations)
			snprintf(detail, sizeof(detail), "tenant %" PRIu32 ": %s",
			         st->id, d);
		violations += v > 0 ? (uint64_t)v : 0;
		chunks += tenant_chunks(st->t);
	}
	if (chunks != s->pool.chunks_used) {
		if (!violations)
			snprintf(detail, sizeof(detail),
			         "tenants hold %" PRIu64 " chunks, pool counts %" PRIu64,
			         chunks, s->pool.chunks_used);
		violations++;
	}
	if (s->pool.chunks_used > s->pool.chunk_capacity) {
		if (!violations)
			snprintf(detail, sizeof(detail), "pool over capacity");
		violations++;
	}
	codec_row_u64(row, "ok", violations == 0);
	codec_row_u64(row, "violations", violations);
	codec_row_u64(row, "chunks_used", s->pool.chunks_used);
	codec_row_str(row, "detail", violations ? detail : "every page is "
	              "free or in exactly one list; free + used = total");
}

static int srv_admin(struct server *s, const struct ipc_req *r,
                     struct ipc_rep *rep, char *why, size_t wlen)
{
	uint32_t n = 0;
	switch (r->op) {
	case IPC_OP_STATS:
		if (!srv_rows(rep, 1))
			return KVT_ENOMEM;
		srv_stats_row(s, &rep->table.rows[0]);
		return 0;
	case IPC_OP_TENANTS:
		for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
			n += s->tenants[i] != NULL;
		if (!srv_rows(rep, n))
			return KVT_ENOMEM;
		n = 0;
		for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
			if (s->tenants[i])
				srv_tenant_row(s->tenants[i],
				               &rep->table.rows[n++]);
		return 0;
	case IPC_OP_CHECK:
		if (!srv_rows(rep, 1))
			return KVT_ENOMEM;
		srv_check(s, &rep->table.rows[0]);
		return 0;
	case IPC_OP_POLICIES:
		if (!srv_rows(rep, (uint32_t)policy_count()))
			return KVT_ENOMEM;
		for (size_t i = 0; i < policy_count(); i++) {
			codec_row_str(&rep->table.rows[i], "name",
			              policy_at(i)->name);
			codec_row_str(&rep->table.rows[i], "help",
			              policy_at(i)->help);
		}
		return 0;
	case IPC_OP_CONFIG: {
		for (size_t i = 0; i < config_count(); i++)
			n += !r->u.filter[0] ||
			     !strcmp(r->u.filter, config_at(i)->name);
		if (!n) {
			snprintf(why, wlen, "unknown setting '%s'", r->u.filter);
			return KVT_EINVAL;
		}
		if (!srv_rows(rep, n))
			return KVT_ENOMEM;
		n = 0;
		for (size_t i = 0; i < config_count(); i++) {
			const struct config_entry *e = config_at(i);
			if (r->u.filter[0] && strcmp(r->u.filter, e->name))
				continue;
			char val[IPC_STR_MAX];
			config_get(&s->cfg, e, val, sizeof(val));
			struct ipc_row *row = &rep->table.rows[n++];
			codec_row_str(row, "key", e->name);
			codec_row_str(row, "value", val);
			codec_row_u64(row, "mutable", !!(e->flags & CONFIG_MUTABLE));
		}
		return 0;
	}
	default:
		return KVT_EUNKNOWNOP;
	}
}

static int srv_dispatch(struct server *s, const struct ipc_req *r,
                        nng_pipe pipe, struct ipc_rep *rep, char *why,
                        size_t wlen)
{
	struct srv_tenant *st = NULL;
	int rv;
	if (codec_op_is_admin(r->op))
		return srv_admin(s, r, rep, why, wlen);
	if (s->draining) {
		snprintf(why, wlen, "kvtrimd is shutting down");
		return KVT_ESHUTDOWN;
	}
	if (r->op == IPC_OP_HELLO)
		return srv_hello(s, &r->u.hello, pipe, rep, why, wlen);
	if ((rv = srv_auth(s, r, pipe, &st, why, wlen)))
		return rv;
	switch (r->op) {
	case IPC_OP_BYE:
		srv_reclaim(s, st, "client said bye");
		return 0;
	case IPC_OP_SEQ_OPEN:
		if ((rv = tenant_seq_open(st->t, &rep->u.seq)))
			return rv;
		s->st.seqs_opened_total++;
		return srv_flush(s, st, why, wlen);
	case IPC_OP_SEQ_CLOSE:
		if ((rv = tenant_seq_close(st->t, r->u.seq)))
			return rv;
		s->st.seqs_closed_total++;
		return srv_flush(s, st, why, wlen);
	case IPC_OP_SYNC: {
		struct kvt_tenant_stats before, after;
		uint64_t t0 = now_us();
		tenant_stats(st->t, &before);
		if ((rv = tenant_sync(st->t, r->u.sync.items, r->u.sync.n, why,
		                      wlen)))
			return rv;
		tenant_stats(st->t, &after);
		s->st.syncs_total++;
		s->st.sync_items_total += r->u.sync.n;
		s->st.entries_appended_total +=
			after.entries_appended - before.entries_appended;
		s->st.entries_evicted_total +=
			after.entries_evicted - before.entries_evicted;
		rv = srv_flush(s, st, why, wlen);
		s->st.sync_us_total += now_us() - t0;
		return rv;
	}
	default:
		snprintf(why, wlen, "operation not handled");
		return KVT_EUNKNOWNOP;
	}
}

static nng_msg *srv_handle(struct server *s, nng_msg *msg)
{
	struct ipc_req req;
	struct ipc_rep rep;
	char why[KVT_ERRTEXT_MAX] = "";
	const uint8_t *body = nng_msg_body(msg);
	size_t len = nng_msg_len(msg);
	enum ipc_op op;
	int rv;

	s->st.requests_total++;
	memset(&rep, 0, sizeof(rep));
	rep.version = IPC_PROTO_VERSION;
	rv = codec_req_decode(body, len, &req, why, sizeof(why));
	if (rv) {
		op = codec_peek_op(body, len);
	} else {
		op = req.op;
		rv = srv_dispatch(s, &req, nng_msg_get_pipe(msg), &rep, why,
		                  sizeof(why));
	}
	codec_req_free(&req);
	if (rv) {
		codec_rep_free(&rep);
		codec_rep_error(&rep, rv, why[0] ? why : kvt_strerror(rv));
		stats_count_error(&s->st, rv);
		LOG(LOG_LVL_INFO, "request %s refused: %s: %s",
		    codec_op_name(op) ? codec_op_name(op) : "?", kvt_errname(rv),
		    rep.msg);
	}
	uint8_t *out = NULL;
	size_t olen = 0;
	int erv = codec_rep_encode(op, &rep, &out, &olen);
	codec_rep_free(&rep);
	if (erv) {
		codec_rep_error(&rep, erv, "cannot encode the reply");
		erv = codec_rep_encode(op, &rep, &out, &olen);
	}
	nng_msg_clear(msg);
	if (erv || nng_msg_append(msg, out, olen)) {
		free(out);
		nng_msg_free(msg);
		return NULL;
	}
	free(out);
	return msg;
}

static void srv_wake_cb(uv_async_t *a)
{
	struct server *s = a->data;
	struct srv_req *list;
	struct srv_pipe_ev *evs;

	pthread_mutex_lock(&s->qlock);
	list = s->ready_head;
	s->ready_head = s->ready_tail = NULL;
	evs = s->pipe_evs;
	s->pipe_evs = NULL;
	pthread_mutex_unlock(&s->qlock);

	while (evs) {
		struct srv_pipe_ev *e = evs;
		evs = e->next;
		for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
			struct srv_tenant *st = s->tenants[i];
			if (st && st->pipe_id == e->pipe_id) {
				s->st.tenants_reclaimed_total++;
				srv_reclaim(s, st, "control connection closed");
			}
		}
		free(e);
	}
	while (list) {
		struct srv_req *r = list;
		list = r->next;
		nng_msg *rep = srv_handle(s, r->msg);
		r->msg = NULL;
		if (!rep) {
			nng_ctx_recv(r->ctx, r->aio);
			continue;
		}
		r->sending = 1;
		nng_aio_set_msg(r->aio, rep);
		nng_ctx_send(r->ctx, r->aio);
	}
}

/* ---------------------------------------------------------- lifecycle */

static void srv_cron_cb(uv_timer_t *t)
{
	struct server *s = t->data;
	uint64_t now = now_ms();
	for (struct srv_conn *c = s->conns, *n; c; c = n) {
		n = c->next;
		if (!c->st && now - c->born_ms > s->cfg.hello_timeout_ms) {
			LOG(LOG_LVL_INFO, "closing handle channel of pid %" PRIu32
			    ": no hello", c->pid);
			srv_conn_close(c);
		}
	}
	/* A process that died while a forked child kept its sockets open
	 * would otherwise hold its pages: check the peer pid directly. */
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (st && st->pid && kill((pid_t)st->pid, 0) < 0 &&
		    errno == ESRCH) {
			s->st.tenants_reclaimed_total++;
			srv_reclaim(s, st, "client process is gone");
		}
	}
}

static void srv_stop_loop(struct server *s)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i])
			srv_reclaim(s, s->tenants[i], "daemon shutting down");
	while (s->conns)
		srv_conn_close(s->conns);
	uv_close((uv_handle_t *)&s->hpoll, NULL);
	uv_close((uv_handle_t *)&s->wake, NULL);
	uv_close((uv_handle_t *)&s->sigterm, NULL);
	uv_close((uv_handle_t *)&s->sigint, NULL);
	uv_close((uv_handle_t *)&s->cron, NULL);
	uv_close((uv_handle_t *)&s->drain, NULL);
}

static int srv_busy(struct server *s)
{
	int busy = 0;
	pthread_mutex_lock(&s->qlock);
	busy = s->ready_head != NULL;
	pthread_mutex_unlock(&s->qlock);
	for (uint32_t i = 0; i < s->n_reqs && !busy; i++)
		busy = s->reqs[i].sending;
	return busy;
}

/* Stops nng for good: no callback runs after this returns. */
static void srv_close_nng(struct server *s)
{
	__atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
	if (s->sock_open) {
		nng_close(s->sock);
		s->sock_open = 0;
	}
	for (uint32_t i = 0; i < s->n_reqs; i++)
		nng_aio_stop(s->reqs[i].aio);
	pthread_mutex_lock(&s->qlock);
	for (struct srv_req *r = s->ready_head; r; r = r->next) {
		nng_msg_free(r->msg);
		r->msg = NULL;
	}
	s->ready_head = s->ready_tail = NULL;
	pthread_mutex_unlock(&s->qlock);
}

static void srv_drain_cb(uv_timer_t *t)
{
	struct server *s = t->data;
	/* Replies in flight finish first, but never wait forever. */
	if (srv_busy(s) && now_ms() - s->drain_started_ms < 5000)
		return;
	srv_close_nng(s);
	uv_timer_stop(t);
	srv_stop_loop(s);
}

static void srv_signal_cb(uv_signal_t *h, int signum)
{
	struct server *s = h->data;
	if (s->draining)
		return;
	LOG(LOG_LVL_NOTICE, "signal %d: shutting down", signum);
	s->draining = 1;
	s->drain_started_ms = now_ms();
	uv_poll_stop(&s->hpoll);
	nng_listener_close(s->listener);
	uv_timer_start(&s->drain, srv_drain_cb, SRV_DRAIN_MS, 20);
}

static int mkdir_p(const char *path)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0755) && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(tmp, 0770) && errno != EEXIST)
		return -1;
	return 0;
}

int server_new(const struct config *cfg, struct server **out, char *err,
               size_t errlen)
{
	struct server *s = calloc(1, sizeof(*s));
	int rv;
	char url[PATH_MAX + 8];
	if (!s)
		return KVT_ENOMEM;
	s->cfg = *cfg;
	s->hsock = -1;
	s->next_tenant_id = 1;
	s->started_ms = now_ms();
	pthread_mutex_init(&s->qlock, NULL);
	if (strcmp(cfg->backend, "cuda") == 0) {
		snprintf(err, errlen, "--backend cuda: this build has no CUDA "
		         "backend yet; use --backend cpu");
		rv = KVT_ENOTSUP;
		goto fail;
	}
	if ((rv = pool_init(&s->pool, cfg->pool_size))) {
		snprintf(err, errlen, "pool_size %" PRIu64 " holds no 2 MiB chunk",
		         cfg->pool_size);
		goto fail;
	}
	s->tenants = calloc(cfg->max_tenants, sizeof(*s->tenants));
	s->reqs = calloc(cfg->contexts, sizeof(*s->reqs));
	if (!s->tenants || !s->reqs) {
		rv = KVT_ENOMEM;
		goto fail;
	}
	if (mkdir_p(cfg->runtime_dir)) {
		snprintf(err, errlen, "cannot create runtime dir %s: %s",
		         cfg->runtime_dir, strerror(errno));
		rv = KVT_ESYS;
		goto fail;
	}
	snprintf(s->ctl_path, sizeof(s->ctl_path), "%s/ctl.ipc", cfg->runtime_dir);
	snprintf(s->fd_path, sizeof(s->fd_path), "%s/fd.sock", cfg->runtime_dir);

	if ((rv = handle_listen(s->fd_path, &s->hsock))) {
		snprintf(err, errlen, "cannot listen on %s: %s", s->fd_path,
		         strerror(errno));
		goto fail;
	}
	if ((rv = nng_rep0_open(&s->sock))) {
		snprintf(err, errlen, "nng: %s", nng_strerror(rv));
		rv = KVT_ESYS;
		goto fail;
	}
	s->sock_open = 1;
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, SRV_RECV_MAX);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, srv_pipe_cb, s);
	/* A stale socket file of a dead daemon would make listen fail. */
	unlink(s->ctl_path);
	snprintf(url, sizeof(url), "ipc://%s", s->ctl_path);
	if ((rv = nng_listener_create(&s->listener, s->sock, url)) ||
	    (rv = nng_listener_set_int(s->listener, NNG_OPT_IPC_PERMISSIONS,
	                               0660)) ||
	    (rv = nng_listener_start(s->listener, 0))) {
		snprintf(err, errlen, "cannot listen on %s: %s", url,
		         nng_strerror(rv));
		rv = KVT_ESYS;
		goto fail;
	}
	for (uint32_t i = 0; i < cfg->contexts; i++) {
		struct srv_req *r = &s->reqs[i];
		r->srv = s;
		if ((rv = nng_ctx_open(&r->ctx, s->sock)) ||
		    (rv = nng_aio_alloc(&r->aio, srv_req_cb, r))) {
			snprintf(err, errlen, "nng: %s", nng_strerror(rv));
			rv = KVT_ESYS;
			goto fail;
		}
		s->n_reqs = i + 1;
	}
	if (uv_loop_init(&s->loop)) {
		rv = KVT_ESYS;
		goto fail;
	}
	s->loop_ready = 1;
	uv_async_init(&s->loop, &s->wake, srv_wake_cb);
	s->wake.data = s;
	uv_poll_init(&s->loop, &s->hpoll, s->hsock);
	s->hpoll.data = s;
	uv_signal_init(&s->loop, &s->sigterm);
	uv_signal_init(&s->loop, &s->sigint);
	s->sigterm.data = s->sigint.data = s;
	uv_timer_init(&s->loop, &s->cron);
	uv_timer_init(&s->loop, &s->drain);
	s->cron.data = s->drain.data = s;
	*out = s;
	return 0;
fail:
	server_free(s);
	return rv;
}

int server_run(struct server *s)
{
	signal(SIGPIPE, SIG_IGN);
	uv_signal_start(&s->sigterm, srv_signal_cb, SIGTERM);
	uv_signal_start(&s->sigint, srv_signal_cb, SIGINT);
	uv_poll_start(&s->hpoll, UV_READABLE, srv_accept_cb);
	uv_timer_start(&s->cron, srv_cron_cb, SRV_CRON_MS, SRV_CRON_MS);
	for (uint32_t i = 0; i < s->n_reqs; i++)
		nng_ctx_recv(s->reqs[i].ctx, s->reqs[i].aio);
	LOG(LOG_LVL_NOTICE,
	    "kvtrimd ready: runtime dir %s, backend cpu, pool %" PRIu64
	    " bytes (%" PRIu64 " chunks)", s->cfg.runtime_dir,
	    pool_bytes_total(&s->pool), s->pool.chunk_capacity);
	uv_run(&s->loop, UV_RUN_DEFAULT);
	LOG(LOG_LVL_NOTICE, "kvtrimd stopped");
	return 0;
}

void server_free(struct server *s)
{
	if (!s)
		return;
	srv_close_nng(s);
	for (uint32_t i = 0; i < s->n_reqs; i++)
		nng_aio_free(s->reqs[i].aio);
	while (s->pipe_evs) {
		struct srv_pipe_ev *e = s->pipe_evs;
		s->pipe_evs = e->next;
		free(e);
	}
	if (s->loop_ready) {
		if (!uv_is_closing((uv_handle_t *)&s->wake)) {
			/* server_run never ran: close what server_new opened. */
			srv_stop_loop(s);
		}
		uv_run(&s->loop, UV_RUN_DEFAULT);
		uv_loop_close(&s->loop);
	}
	if (s->hsock >= 0) {
		close(s->hsock);
		unlink(s->fd_path);
	}
	if (s->ctl_path[0])
		unlink(s->ctl_path);
	free(s->tenants);
	free(s->reqs);
	pthread_mutex_destroy(&s->qlock);
	free(s);
}
