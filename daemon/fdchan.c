/*
 * fdchan.c — the handle channel fd.sock (AF_UNIX SOCK_SEQPACKET,
 * handle.h): accepting connections, what clients send on them, the events
 * (chunk grants and revocations, device handles) the daemon sends, and the
 * fd budget.  A new connection gets WELCOME with its cookie and waits for
 * the hello that names it (lease.c); a refused peer is kept open until its
 * hello so that it learns why.  Under attack (docs/protocol.md, "Limits
 * of the handle channel" and "Connection limits"): accepts and reads come
 * in bounded batches, a failed accept pauses the listener, pending
 * connections are capped per pid, per uid and in all, and the fd budget
 * lowers max_pending_conns so pending connections run out of fds before
 * registered tenants do.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "handle.h"
#include "server_int.h"

#define SRV_DENIED_MS 2000   /* a refused fd.sock peer's time for its hello */
#define SRV_ACCEPT_BATCH 16      /* accepts per poll callback: a burst of
                                    connections interleaves with the
                                    tenants' requests */
#define SRV_ACCEPT_PAUSE_MIN_MS 100  /* after a failed accept, doubling ... */
#define SRV_ACCEPT_PAUSE_MAX_MS 1000 /* ... to this while accept keeps failing */
#define SRV_CONN_BATCH 16        /* client packets read per poll callback */
#define SRV_PENDING_GRACE_MS 1000 /* a pending conn younger than this is not
                                     evicted for a newcomer */
#define SRV_PENDING_FLOOR 8      /* max_pending_conns never lowered below */
#define SRV_FD_PER_TENANT 4      /* handle channel, control connection,
                                    table, stage */
#define SRV_FD_SPARE 64          /* stdio, lock, loop, listeners, MHD,
                                    driver */
#define SRV_LOG_EVERY_MS 5000    /* repeated warnings: one per interval */

/* ---------------------------------------------------------- connections */

static void srv_conn_closed_cb(uv_handle_t *h)
{
	struct srv_conn *c = h->data;
	close(c->fd);
	free(c);
}

void srv_conn_close(struct srv_conn *c)
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
		srv_reclaim(s, st, c->close_why[0] ? c->close_why
		                                   : "handle channel closed");
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		s->fdc.conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		s->fdc.conns_tail = c->prev;
	s->fdc.n_conns--;
	if (c->refused[0])
		s->fdc.n_conns_refused--;
	uv_close((uv_handle_t *)&c->poll, srv_conn_closed_cb);
}

/*
 * Judges one packet a client sent (rc from handle_recv_ext): NULL when the
 * protocol asked for it, else what was wrong, in why.  Clients send one
 * thing on this channel: CHUNK_CLOSED, after closing a legacy-IPC chunk the
 * daemon revoked (tenant_chunk_closed frees it); anything else, or one
 * naming no chunk that awaits it, is a broken or hostile client.
 */
static const char *srv_conn_judge(struct srv_conn *c, int rc,
                                  const struct handle_ext *m, char *why,
                                  size_t wlen)
{
	if (rc == KVT_EPROTO)
		snprintf(why, wlen, "a malformed packet");
	else if (!c->st)
		snprintf(why, wlen, "a packet (type %u) before its hello",
		         (unsigned)m->h.type);
	else if (m->h.type != HANDLE_CHUNK_CLOSED)
		snprintf(why, wlen, "a packet of type %u, which clients never "
		         "send", (unsigned)m->h.type);
	else if (tenant_chunk_closed(c->st->t, m->h.cookie))
		snprintf(why, wlen, "CHUNK_CLOSED %" PRIu64 " for no chunk "
		         "awaiting it", m->h.cookie);
	else
		return NULL;
	return why;
}

/* ---------------------------------------------------------- the bar */

#define SRV_BAR_MIN_MS 1000
#define SRV_BAR_MAX_MS 60000
#define SRV_BAR_FORGET_MS 600000 /* quiet this long: the next bar is short */

/* Bars pid after a violation: 1 s, doubling to 60 s while violations go
 * on (each re-registration that breaks the protocol again).  A full table
 * replaces the bar that ends first. */
static void srv_bar(struct server *s, uint32_t pid, uint64_t now)
{
	struct srv_barred *b = NULL, *first = &s->barred[0];
	for (int i = 0; i < SRV_BARRED_MAX && !b; i++)
		if (s->barred[i].pid == pid)
			b = &s->barred[i];
	for (int i = 0; i < SRV_BARRED_MAX && !b; i++) {
		struct srv_barred *e = &s->barred[i];
		if (!e->pid || now - e->last_ms > SRV_BAR_FORGET_MS)
			b = e;
		else if (e->until_ms < first->until_ms)
			first = e;
	}
	if (!b) {
		b = first;
		b->pid = 0;
	}
	int fresh = b->pid != pid || now - b->last_ms > SRV_BAR_FORGET_MS;
	b->backoff_ms = fresh ? SRV_BAR_MIN_MS
	                : b->backoff_ms * 2 > SRV_BAR_MAX_MS ? SRV_BAR_MAX_MS
	                                                     : b->backoff_ms * 2;
	b->pid = pid;
	b->last_ms = now;
	b->until_ms = now + b->backoff_ms;
}

/* How long pid is barred still (0: not). */
static uint64_t srv_barred_left(const struct server *s, uint32_t pid,
                                uint64_t now)
{
	for (int i = 0; i < SRV_BARRED_MAX; i++)
		if (s->barred[i].pid == pid && now < s->barred[i].until_ms)
			return s->barred[i].until_ms - now;
	return 0;
}

/* Disconnects a peer that broke the protocol; its tenant's lease ends
 * (srv_reclaim logs that once), a peer without one is logged rate
 * limited.  Its process is barred from registering for a while: a client
 * that breaks the protocol and registers again at once (a loop of
 * registrations costs every tenant time on the loop) gets its hellos
 * refused, cheaply, until the bar ends. */
static void srv_conn_violation(struct srv_conn *c, const char *what)
{
	struct server *s = c->srv;
	uint64_t held;
	s->st.handle_violations_total++;
	srv_bar(s, c->pid, now_ms());
	if (c->st)
		snprintf(c->close_why, sizeof(c->close_why), "it sent %s on "
		         "the handle channel", what);
	else if (log_rate_due(&s->fdc.violation_log, now_ms(), SRV_LOG_EVERY_MS,
	                      &held))
		LOG(LOG_LVL_WARNING, "fd.sock: closed the connection of pid %"
		    PRIu32 ": it sent %s (%" PRIu64 " more such closes not "
		    "logged)", c->pid, what, held);
	srv_conn_close(c);
}

static void srv_conn_cb(uv_poll_t *p, int status, int events)
{
	struct srv_conn *c = p->data;
	char why[80];
	if (c->st && c->st->busy) {
		/* Its packets (CHUNK_CLOSED) change the tenant, which a
		 * worker holds: read them once the sync is over. */
		uv_poll_stop(p);
		return;
	}
	/*
	 * At most SRV_CONN_BATCH packets per callback, so that a flood cannot
	 * hold the loop; the poll is level-triggered and calls again while
	 * packets are queued.  A read error, EOF (the process closed it or
	 * died) or a hang-up with nothing left to read closes the channel.
	 */
	for (int i = 0; i < SRV_CONN_BATCH; i++) {
		struct handle_ext m;
		int fd = -1;
		int rc = handle_recv_ext(c->fd, &m, &fd, 0);
		if (fd >= 0)
			close(fd); /* clients never send fds */
		if (rc == KVT_ETIMEDOUT && status >= 0 &&
		    !(events & UV_DISCONNECT))
			return; /* all read */
		if (rc && rc != KVT_EPROTO) {
			srv_conn_close(c);
			return;
		}
		const char *bad = srv_conn_judge(c, rc, &m, why, sizeof(why));
		if (bad) {
			srv_conn_violation(c, bad);
			return;
		}
	}
}

void srv_conn_resume(struct srv_conn *c)
{
	uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, srv_conn_cb);
}

/* A handle channel without a tenant after hello_timeout_ms is closed. */
void srv_conn_cron(struct server *s, uint64_t now)
{
	uint64_t held;
	uint32_t closed = 0;
	for (struct srv_conn *c = s->fdc.conns, *n;
	     c && closed < SRV_CLOSES_PER_TICK; c = n) {
		n = c->next;
		/* A refused peer gets just long enough to hear why. */
		uint64_t limit = (c->denied || c->barred_ms || c->refused[0]) &&
		                 s->cfg.hello_timeout_ms >
		                 SRV_DENIED_MS ? SRV_DENIED_MS
		                               : s->cfg.hello_timeout_ms;
		if (!c->st && now - c->born_ms > limit) {
			if (log_rate_due(&s->fdc.hello_log, now,
			                 SRV_LOG_EVERY_MS, &held))
				LOG(LOG_LVL_INFO, "closing handle channel of pid %"
				    PRIu32 ": no hello (%" PRIu64 " more such "
				    "closes not logged)", c->pid, held);
			srv_conn_close(c);
			closed++;
		}
	}
}

/* One event as its own packet. */
static int send_one(struct srv_conn *c, const struct tenant_event *e)
{
	struct handle_msg m = {.magic = HANDLE_MAGIC,
	                       .type = (uint16_t)e->type,
	                       .slot = e->slot,
	                       .size = e->size,
	                       .cookie = e->cookie};
	if (handle_is_ext(m.type)) {
		struct handle_ext x;
		x.h = m;
		memcpy(x.data, e->data, sizeof(x.data));
		return handle_send_ext(c->fd, &x,
		                       e->type == HANDLE_CHUNK_DEV ||
		                               e->type == HANDLE_TABLE_DEV ||
		                               e->type == HANDLE_STAGE_DEV
		                               ? e->fd
		                               : -1);
	}
	return handle_send(c->fd, &m, e->type == HANDLE_CHUNK_ADD ? e->fd : -1);
}

/*
 * A request's events on their way out: consecutive grants of chunks with
 * an fd (CHUNK_ADD, VMM CHUNK_DEV) of one window, in increasing slot order,
 * go as one CHUNK_ADD_SET / CHUNK_DEV_SET of up to HANDLE_SET_FDS, so a
 * request that gains hundreds of chunks fits the socket's send buffer.
 * Any other event sends the set being filled first: order is kept.
 */
struct evout {
	struct srv_conn *c;
	struct handle_ext set; /* being filled when n > 0 */
	int fds[HANDLE_SET_FDS];
	uint32_t n, last_bit;
};

static int evout_flush(struct evout *o)
{
	if (!o->n)
		return 0;
	int rc = handle_send_set(o->c->fd, &o->set, o->fds, o->n);
	o->n = 0;
	return rc;
}

static int evout_send(void *ctx, const struct tenant_event *e)
{
	struct evout *o = ctx;
	uint16_t st = e->type == HANDLE_CHUNK_ADD ? HANDLE_CHUNK_ADD_SET
	              : e->type == HANDLE_CHUNK_DEV && e->fd >= 0
	                      ? HANDLE_CHUNK_DEV_SET
	                      : 0;
	int rc;
	if (!st) {
		if ((rc = evout_flush(o)))
			return rc;
		return send_one(o->c, e);
	}
	uint32_t base = e->slot - e->slot % HANDLE_SET_SLOTS;
	uint32_t bit = e->slot - base;
	if (o->n && (o->set.h.type != st || o->set.h.slot != base ||
	             o->set.h.size != e->size || bit <= o->last_bit ||
	             o->n == HANDLE_SET_FDS) &&
	    (rc = evout_flush(o)))
		return rc;
	if (!o->n) {
		memset(&o->set, 0, sizeof(o->set));
		o->set.h = (struct handle_msg){.magic = HANDLE_MAGIC, .type = st,
		                               .slot = base, .size = e->size};
	}
	o->set.data[bit / 8] |= (uint8_t)(1u << (bit % 8));
	o->fds[o->n++] = e->fd;
	o->last_bit = bit;
	return 0;
}

int srv_send_events(struct srv_conn *c, struct tenant *t)
{
	struct evout o = {.c = c};
	int rc = tenant_flush_events(t, evout_send, &o);
	int frc = evout_flush(&o);
	return rc ? rc : frc;
}

/* ---------------------------------------------------------- accept */

/* The most fd.sock connections without a tenant at once: max_pending_conns,
 * lowered when the open-file limit leaves no room (srv_fd_budget). */
uint32_t srv_pending_max(const struct server *s)
{
	return s->cfg.max_pending_conns < s->fdc.pending_cap
	               ? s->cfg.max_pending_conns
	               : s->fdc.pending_cap;
}

uint32_t srv_pending_per_uid(const struct server *s)
{
	uint32_t max = srv_pending_max(s);
	if (s->cfg.max_pending_per_uid)
		return s->cfg.max_pending_per_uid;
	return max / 2 ? max / 2 : 1;
}

static int srv_u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static int srv_run_cmp(const void *a, const void *b)
{
	const struct srv_uid_run *x = a, *y = b;
	return x->n > y->n ? -1 : x->n < y->n;
}

uint32_t srv_uid_runs(uint32_t *uids, uint32_t n, struct srv_uid_run *runs)
{
	uint32_t r = 0;
	qsort(uids, n, sizeof(*uids), srv_u32_cmp);
	for (uint32_t i = 0; i < n; i++) {
		if (!r || runs[r - 1].uid != uids[i])
			runs[r++] = (struct srv_uid_run){uids[i], 0};
		runs[r - 1].n++;
	}
	qsort(runs, r, sizeof(*runs), srv_run_cmp);
	return r;
}

/* A connection kept only to tell its peer why it was refused. */
static int srv_conn_pending(const struct srv_conn *c)
{
	return !c->st && !c->closing && !c->refused[0];
}

/* fd.sock connections that have no tenant (yet), those kept to say why
 * they were refused left out. */
static uint32_t srv_pending(const struct server *s)
{
	uint32_t bound = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		bound += s->tenants[i] && s->tenants[i]->conn;
	bound += s->fdc.n_conns_refused;
	return s->fdc.n_conns > bound ? s->fdc.n_conns - bound : 0;
}

/* A connection closed at accept, refused, or evicted: counted, logged
 * rate limited. */
static void srv_pending_refused(struct server *s, uint64_t now,
                                const char *what, const char *why)
{
	uint64_t held;
	s->st.handle_pending_refusals_total++;
	if (log_rate_due(&s->fdc.refuse_log, now, SRV_LOG_EVERY_MS, &held))
		LOG(LOG_LVL_WARNING, "fd.sock: %" PRIu32 " connections without "
		    "a tenant (max_pending_conns, in force %" PRIu32 "): %s%s%s "
		    "(%" PRIu64 " more not logged)", srv_pending(s),
		    srv_pending_max(s), what, why ? ": " : "", why ? why : "",
		    held);
}

/*
 * At the bound, for a newcomer of uid (holding of_uid): the oldest
 * connection without a tenant of the uid holding the most is closed when
 * that uid holds at least two more (so that no uid locks another out, and
 * two cannot take turns).  1 when one was closed.
 */
static int srv_pending_evict_uid(struct server *s, uint64_t now, uint32_t uid,
                                 uint32_t of_uid)
{
	uint32_t n = srv_pending(s), k = 0, r;
	uint32_t *uids = malloc(sizeof(*uids) * (n ? n : 1));
	struct srv_uid_run *runs = malloc(sizeof(*runs) * (n ? n : 1));
	struct srv_conn *victim = NULL;
	for (struct srv_conn *c = s->fdc.conns; uids && runs && c && k < n;
	     c = c->next)
		if (srv_conn_pending(c) && c->uid != uid)
			uids[k++] = c->uid;
	r = uids && runs ? srv_uid_runs(uids, k, runs) : 0;
	if (r && runs[0].n >= of_uid + 2)
		for (struct srv_conn *c = s->fdc.conns_tail; c && !victim;
		     c = c->prev)
			if (srv_conn_pending(c) && c->uid == runs[0].uid)
				victim = c;
	free(uids);
	free(runs);
	if (!victim)
		return 0;
	srv_conn_close(victim);
	srv_pending_refused(s, now, "the oldest of the uid holding the most "
	                    "was closed for a newcomer of another uid", NULL);
	return 1;
}

/*
 * Room for one more connection without a tenant, of uid (holding of_uid)?
 * At the limit, the uid holding the most gives one up to a newcomer of a
 * uid holding fewer (srv_pending_evict_uid); else the oldest pending one
 * that has had SRV_PENDING_GRACE_MS for its hello is closed to make room:
 * idle connections cannot lock newcomers out until the hello deadline,
 * and a client in the middle of its hello (a few ms) is not evicted.  0
 * when every pending connection is younger: the new one is refused.
 */
static int srv_pending_room(struct server *s, uint64_t now, uint32_t uid,
                            uint32_t of_uid)
{
	if (srv_pending(s) < srv_pending_max(s) ||
	    srv_pending_evict_uid(s, now, uid, of_uid))
		return 1;
	for (struct srv_conn *c = s->fdc.conns_tail; c; c = c->prev) {
		if (!srv_conn_pending(c))
			continue;
		if (now - c->born_ms < SRV_PENDING_GRACE_MS)
			return 0; /* older ones come first: none is due */
		srv_conn_close(c);
		srv_pending_refused(s, now, "the oldest was closed for a "
		                    "newcomer", NULL);
		return 1;
	}
	return 0;
}

/*
 * May a new connection of this peer (peer: its credentials were read) go
 * without a tenant?  max_pending_per_pid holds for everyone,
 * max_pending_per_uid for all but admins, max_pending_conns as
 * srv_pending_room says.  0, or KVT_EBUSY with why naming the limit.
 */
static int srv_conn_room(struct server *s, uint64_t now, int peer,
                         uint32_t pid, uint32_t uid, uint32_t gid, char *why,
                         size_t wlen)
{
	uint32_t of_pid = 0, of_uid = 0, per_uid = srv_pending_per_uid(s);
	for (const struct srv_conn *c = s->fdc.conns; peer && c; c = c->next)
		if (srv_conn_pending(c)) {
			of_pid += c->pid == pid;
			of_uid += c->uid == uid;
		}
	if (peer && of_pid >= s->cfg.max_pending_per_pid)
		snprintf(why, wlen, "process %" PRIu32 " holds "
		         "max_pending_per_pid (%" PRIu32 ") handle channels "
		         "(fd.sock) without a tenant", pid,
		         s->cfg.max_pending_per_pid);
	else if (peer && of_uid >= per_uid &&
	         !srv_acl_has(s, &s->admin, pid, uid, gid))
		snprintf(why, wlen, "uid %" PRIu32 " holds max_pending_per_uid "
		         "(%" PRIu32 ") handle channels (fd.sock) without a "
		         "tenant", uid, per_uid);
	else if (srv_pending_room(s, now, peer ? uid : UINT32_MAX, of_uid))
		return 0;
	else
		snprintf(why, wlen, "max_pending_conns (%" PRIu32 ") handle "
		         "channels (fd.sock) without a tenant are open, none "
		         "idle for 1 s, and uid %" PRIu32 " holds as many as "
		         "any other uid", srv_pending_max(s), uid);
	return KVT_EBUSY;
}

static void srv_accept_cb(uv_poll_t *p, int status, int events);

/*
 * accept failed (EMFILE / ENFILE when out of fds, or anything else): the
 * listener is not polled for a while (level-triggered, it would call again
 * at once, forever), 100 ms doubling to 1 s while failures go on; cron
 * resumes it (srv_backoff_over).  Logged once per SRV_LOG_EVERY_MS.  Both
 * listeners (fd.sock here, ctl.ipc in ctl.c) use it.
 */
void srv_accept_failed(struct server *s, struct srv_backoff *b,
                       uv_poll_t *poll, const char *name, uint64_t *counter,
                       int err)
{
	uint64_t now = now_ms(), held;
	(*counter)++;
	b->pause_ms = !b->pause_ms ? SRV_ACCEPT_PAUSE_MIN_MS
	              : b->pause_ms * 2 > SRV_ACCEPT_PAUSE_MAX_MS
	                      ? SRV_ACCEPT_PAUSE_MAX_MS
	                      : b->pause_ms * 2;
	uv_poll_stop(poll);
	b->paused = 1;
	b->resume_ms = now + b->pause_ms;
	if (log_rate_due(&b->log, now, SRV_LOG_EVERY_MS, &held))
		LOG(LOG_LVL_WARNING, "%s accept failed: %s (open-file limit %"
		    PRIu64 "); not accepting for %" PRIu32 " ms (%" PRIu64
		    " more failures not logged)", name, strerror(err),
		    s->fdc.fd_limit, b->pause_ms, held);
}

void srv_accept_hold(struct server *s, struct srv_backoff *b,
                     uv_poll_t *poll)
{
	if (++s->refusals_tick < SRV_REFUSALS_PER_TICK)
		return;
	uv_poll_stop(poll);
	b->paused = 1;
	b->resume_ms = now_ms();
}

int srv_backoff_over(struct srv_backoff *b, const struct server *s,
                     uint64_t now)
{
	if (!b->paused || s->draining || now < b->resume_ms)
		return 0;
	b->paused = 0;
	return 1;
}

void srv_accept_start(struct server *s)
{
	uv_poll_start(&s->fdc.hpoll, UV_READABLE, srv_accept_cb);
}

void srv_accept_resume(struct server *s, uint64_t now)
{
	if (!srv_backoff_over(&s->fdc.haccept, s, now))
		return;
	uv_poll_start(&s->fdc.hpoll, UV_READABLE, srv_accept_cb);
}

/* A new handle channel: WELCOME with its cookie, then it waits for its
 * hello (cron closes it after hello_timeout_ms).  refused (NULL: none):
 * why it was refused, which its hello gets (SRV_DENIED_MS to send it). */
static void srv_conn_open(struct server *s, int fd, uint64_t now,
                          const char *refused)
{
	struct srv_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->srv = s;
	c->fd = fd;
	c->cookie = random_u64();
	c->born_ms = now;
	if (refused)
		snprintf(c->refused, sizeof(c->refused), "%s", refused);
	if (handle_peer(fd, &c->pid, &c->uid, &c->gid) ||
	    !srv_allowed(s, c->pid, c->uid, c->gid)) {
		uint64_t held;
		/* Kept open until its hello (or the hello timeout) so the
		 * client learns why (KVT_EPERM), not just EOF. */
		c->denied = 1;
		s->st.auth_refusals_total++;
		if (log_rate_due(&s->fdc.denied_log, now, SRV_LOG_EVERY_MS,
		                 &held))
			LOG(LOG_LVL_WARNING, "fd.sock: pid %" PRIu32 " uid %"
			    PRIu32 " gid %" PRIu32 " is not allowed "
			    "(allow_uids / allow_gids); its hello will be "
			    "refused (%" PRIu64 " more refusals not logged)",
			    c->pid, c->uid, c->gid, held);
	} else if ((c->barred_ms = srv_barred_left(s, c->pid, now))) {
		/* Kept open, as a denied one, to tell it why at its hello. */
		s->st.handle_barred_refusals_total++;
	}
	struct handle_msg m = {.magic = HANDLE_MAGIC,
	                       .type = HANDLE_WELCOME,
	                       .cookie = c->cookie};
	if (handle_send(fd, &m, -1) || uv_poll_init(&s->loop, &c->poll, fd)) {
		close(fd);
		free(c);
		return;
	}
	c->poll.data = c;
	uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, srv_conn_cb);
	c->next = s->fdc.conns;
	if (s->fdc.conns)
		s->fdc.conns->prev = c;
	else
		s->fdc.conns_tail = c;
	s->fdc.conns = c;
	s->fdc.n_conns++;
	s->fdc.n_conns_refused += refused != NULL;
	LOG(LOG_LVL_DEBUG, "handle channel from pid %" PRIu32, c->pid);
}

static void srv_accept_cb(uv_poll_t *p, int status, int events)
{
	struct server *s = p->data;
	(void)status;
	(void)events;
	/* A bounded batch: the poll calls again while connections queue. */
	for (int i = 0; i < SRV_ACCEPT_BATCH; i++) {
		int fd;
		int rv = handle_accept(s->fdc.hsock, &fd);
		if (rv == KVT_EBUSY)
			return;
		if (rv) {
			srv_accept_failed(s, &s->fdc.haccept, &s->fdc.hpoll,
			                  "fd.sock",
			                  &s->st.handle_accept_failures_total,
			                  errno);
			return;
		}
		s->fdc.haccept.pause_ms = 0;
		uint64_t now = now_ms();
		uint32_t pid = 0, uid = 0, gid = 0;
		char why[sizeof(((struct srv_conn *)0)->refused)];
		int peer = !handle_peer(fd, &pid, &uid, &gid);
		/* A process or uid at its bound is refused before it can
		 * close another's (the eviction at max_pending_conns). */
		if (!srv_conn_room(s, now, peer, pid, uid, gid, why,
		                   sizeof(why))) {
			srv_conn_open(s, fd, now, NULL);
		} else if (s->fdc.n_conns_refused < SRV_REFUSALS_MAX) {
			/* Kept until its hello, which gets why. */
			srv_pending_refused(s, now, "a new one was refused, "
			                    "to be told why at its hello", why);
			srv_conn_open(s, fd, now, why);
			srv_accept_hold(s, &s->fdc.haccept, &s->fdc.hpoll);
			if (s->fdc.haccept.paused)
				return;
		} else {
			/* A flood of refused ones costs an accept and a
			 * close each. */
			close(fd);
			srv_pending_refused(s, now, "a new one was closed at "
			                    "accept (SRV_REFUSALS_MAX refused "
			                    "ones wait for their hello)", why);
			srv_accept_hold(s, &s->fdc.haccept, &s->fdc.hpoll);
			if (s->fdc.haccept.paused)
				return;
		}
	}
}

/* ---------------------------------------------------------- fd budget */

/* The soft open-file limit raised to the hard one (as redis and nginx do);
 * returns the limit in force. */
static uint64_t srv_raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return UINT64_MAX; /* unknown: no budget enforced */
	if (rl.rlim_cur != rl.rlim_max) {
		struct rlimit up = rl;
		/* An infinite hard limit is refused above fs.nr_open. */
		up.rlim_cur = rl.rlim_max == RLIM_INFINITY ? 1048576
		                                           : rl.rlim_max;
		if (up.rlim_cur > rl.rlim_cur && !setrlimit(RLIMIT_NOFILE, &up))
			rl.rlim_cur = up.rlim_cur;
	}
	return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX
	                                    : (uint64_t)rl.rlim_cur;
}

/*
 * The fd budget: what the configuration may hold open at once is one fd per
 * pool chunk (chunk memfds / VMM exports stay open for the chunk's life),
 * SRV_FD_PER_TENANT per tenant for max_tenants, the listeners, the stats
 * socket's stats_max_conns, 2 * (max_pending_conns + SRV_REFUSALS_MAX)
 * (ctl.ipc and fd.sock: those without a tenant, and the refused ones kept
 * to be told why) and SRV_FD_SPARE.  When the open-file limit is lower, max_pending_conns
 * is lowered (pending_cap) so that connections without a tenant run out
 * first, never the registered tenants, and one warning says so.
 */
void srv_fd_budget(struct server *s)
{
	const struct config *c = &s->cfg;
	uint64_t lim = srv_raise_nofile();
	uint32_t listeners = 3 + (c->stats_tcp_port ? 1 : 0);
	uint64_t rest = s->pool.chunk_capacity +
	                (uint64_t)SRV_FD_PER_TENANT * c->max_tenants +
	                listeners + c->stats_max_conns + SRV_FD_SPARE +
	                2u * SRV_REFUSALS_MAX;
	uint64_t need = rest + 2ull * c->max_pending_conns;
	uint64_t cap = lim > rest ? (lim - rest) / 2 : 0;

	s->fdc.fd_limit = lim;
	if (cap < SRV_PENDING_FLOOR)
		cap = SRV_PENDING_FLOOR;
	s->fdc.pending_cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
	if (lim >= need)
		return;
	LOG(LOG_LVL_WARNING, "open-file limit %" PRIu64 " is below the %"
	    PRIu64 " this configuration needs (%" PRIu64 " pool chunks + %d x "
	    "%" PRIu32 " max_tenants + %" PRIu32 " listeners + %" PRIu32
	    " stats_max_conns + 2 x (%" PRIu32 " max_pending_conns + %d "
	    "refused) + %d spare): max_pending_conns is lowered to %" PRIu32
	    "%s; raise LimitNOFILE= / ulimit -n", lim, need,
	    s->pool.chunk_capacity, SRV_FD_PER_TENANT, c->max_tenants,
	    listeners, c->stats_max_conns, c->max_pending_conns,
	    SRV_REFUSALS_MAX, SRV_FD_SPARE, s->fdc.pending_cap,
	    lim < rest + 2ull * SRV_PENDING_FLOOR
	            ? ", and even registered tenants may run out of fds "
	              "(or lower pool_size, max_tenants, stats_max_conns)"
	            : "");
}
