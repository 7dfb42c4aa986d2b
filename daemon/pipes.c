/*
 * pipes.c — kvtrimd's control connections on ctl.ipc (struct srv_pipe):
 * their table, the refusal at accept, the deadlines, and closing them.
 *
 * No peer can hold the daemon: a connection is not read while it has
 * max_inflight_per_conn requests unanswered or SRV_UNSENT_MAX bytes of
 * replies unsent (ctl.c); one whose replies wait send_timeout_ms without
 * the kernel taking a byte is closed, and so is one without a tenant that
 * sent nothing for hello_timeout_ms; beyond max_pending_per_pid of one
 * process, max_pending_per_uid of one uid or max_pending_conns in all
 * connections without a tenant, new ones are refused at accept, and told
 * why (refuse.c); at max_pending_conns a newcomer of a uid holding fewer
 * closes one of the uid holding the most instead (admins pass the last
 * two bounds; registered tenants' connections never count).  Closing is
 * immediate (uv_close): the daemon reads and writes the sockets itself, so
 * nng's pipe reaper, which closes had to be arranged around before, is not
 * involved.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

/* ---------------------------------------------------------- the table */

static uint32_t srv_pipe_slot(const struct server *s, uint32_t id)
{
	uint32_t m = s->ctl.pipes_cap - 1, i = (id * 2654435761u) & m;
	while (s->ctl.pipes[i] && s->ctl.pipes[i]->id != id)
		i = (i + 1) & m;
	return i;
}

struct srv_pipe *srv_pipe_find(struct server *s, uint32_t id)
{
	if (!id || !s->ctl.pipes_cap)
		return NULL;
	return s->ctl.pipes[srv_pipe_slot(s, id)];
}

int srv_pipe_add(struct server *s, struct srv_pipe *p)
{
	if (2 * (s->ctl.n_pipes + 1) > s->ctl.pipes_cap) {
		uint32_t cap = s->ctl.pipes_cap ? 2 * s->ctl.pipes_cap : 64;
		struct srv_pipe **old = s->ctl.pipes;
		struct srv_pipe **nt = calloc(cap, sizeof(*nt));
		if (!nt)
			return KVT_ENOMEM;
		uint32_t ocap = s->ctl.pipes_cap;
		s->ctl.pipes = nt;
		s->ctl.pipes_cap = cap;
		for (uint32_t i = 0; i < ocap; i++)
			if (old[i])
				s->ctl.pipes[srv_pipe_slot(s, old[i]->id)] =
					old[i];
		free(old);
	}
	s->ctl.pipes[srv_pipe_slot(s, p->id)] = p;
	s->ctl.n_pipes++;
	return 0;
}

/* Removes pipe id's entry (backward-shift deletion keeps probes short). */
static void srv_pipe_del(struct server *s, uint32_t id)
{
	if (!srv_pipe_find(s, id))
		return;
	uint32_t m = s->ctl.pipes_cap - 1, i = srv_pipe_slot(s, id);
	s->ctl.pipes[i] = NULL;
	s->ctl.n_pipes--;
	for (uint32_t j = (i + 1) & m; s->ctl.pipes[j]; j = (j + 1) & m) {
		uint32_t home = (s->ctl.pipes[j]->id * 2654435761u) & m;
		/* Move j back into the hole at i unless its home lies in
		 * (i, j] (cyclically). */
		if (((j - home) & m) >= ((j - i) & m)) {
			s->ctl.pipes[i] = s->ctl.pipes[j];
			s->ctl.pipes[j] = NULL;
			i = j;
		}
	}
}

/* ---------------------------------------------------------- accept */

/* Is p closed before q for a newcomer: idle (no request in flight or
 * waiting) first, then the oldest? */
static int srv_evict_before(const struct srv_pipe *p, const struct srv_pipe *q)
{
	int pi = !p->inflight && !p->starved, qi = !q->inflight && !q->starved;
	return pi != qi ? pi : p->born_ms < q->born_ms;
}

/*
 * At max_pending_conns, for a newcomer of uid (which holds of_uid): closes
 * a connection without a tenant of the uid holding the most, when that uid
 * holds at least two more, so that the newcomer's holds no more than it
 * afterwards (no uid can lock another out, and two cannot take turns).
 * Its oldest connection with no request in flight goes, else its oldest;
 * an admin's never (admins pass the bound themselves).  1: one was closed.
 */
static int srv_pipe_evict(struct server *s, uint32_t uid, uint32_t of_uid)
{
	uint32_t n = s->ctl.n_pipes - s->ctl.n_bound_pipes, k = 0, r;
	uint32_t *uids = malloc(sizeof(*uids) * (n ? n : 1));
	struct srv_uid_run *runs = malloc(sizeof(*runs) * (n ? n : 1));
	struct srv_pipe *victim = NULL;
	for (uint32_t i = 0; uids && runs && i < s->ctl.pipes_cap && k < n; i++)
		if (s->ctl.pipes[i] && !s->ctl.pipes[i]->bound &&
		    s->ctl.pipes[i]->uid != uid)
			uids[k++] = s->ctl.pipes[i]->uid;
	r = uids && runs ? srv_uid_runs(uids, k, runs) : 0;
	for (uint32_t j = 0; j < r && !victim && runs[j].n >= of_uid + 2;
	     j++) {
		for (uint32_t i = 0; i < s->ctl.pipes_cap; i++) {
			struct srv_pipe *p = s->ctl.pipes[i];
			if (!p || p->bound || p->uid != runs[j].uid)
				continue;
			if (!victim || srv_evict_before(p, victim))
				victim = p;
		}
		if (victim && srv_acl_has(s, &s->admin, victim->pid,
		                          victim->uid, victim->gid))
			victim = NULL;
	}
	free(uids);
	free(runs);
	if (!victim)
		return 0;
	srv_pipe_close(s, victim, &s->st.control_conns_evicted_total,
	               "its uid holds the most connections without a tenant "
	               "(max_pending_conns): closed for a newcomer of another "
	               "uid");
	return 1;
}

int srv_pipe_room(struct server *s, uint32_t pid, uint32_t uid, uint32_t gid,
                  char *why, size_t wlen)
{
	uint32_t pending = s->ctl.n_pipes - s->ctl.n_bound_pipes, of_pid = 0,
	         of_uid = 0, per_uid = srv_pending_per_uid(s);
	for (uint32_t i = 0; i < s->ctl.pipes_cap; i++) {
		const struct srv_pipe *p = s->ctl.pipes[i];
		if (p && !p->bound) {
			of_pid += p->pid == pid;
			of_uid += p->uid == uid;
		}
	}
	/* Admins pass the socket's bounds (kvtrimctl must get in), not the
	 * process's: none of theirs needs 64 connections at once.  (The
	 * lists are only read when a bound is reached.) */
	int full = pending >= srv_pending_max(s);
	int admin = (of_uid >= per_uid || full) &&
	            srv_acl_has(s, &s->admin, pid, uid, gid);
	if (of_pid >= s->cfg.max_pending_per_pid)
		snprintf(why, wlen, "process %" PRIu32 " holds "
		         "max_pending_per_pid (%" PRIu32 ") connections without "
		         "a tenant on ctl.ipc", pid, s->cfg.max_pending_per_pid);
	else if (of_uid >= per_uid && !admin)
		snprintf(why, wlen, "uid %" PRIu32 " holds max_pending_per_uid "
		         "(%" PRIu32 ") connections without a tenant on ctl.ipc",
		         uid, per_uid);
	else if (!full || admin || srv_pipe_evict(s, uid, of_uid))
		return 0;
	else
		snprintf(why, wlen, "max_pending_conns (%" PRIu32 ") "
		         "connections without a tenant are open on ctl.ipc and "
		         "uid %" PRIu32 " holds as many of them as any other uid",
		         srv_pending_max(s), uid);
	uint64_t held, now = now_ms();
	s->st.control_conns_refused_total++;
	if (log_rate_due(&s->ctl.crefuse_log, now, 1000, &held))
		LOG(LOG_LVL_WARNING, "ctl.ipc: connection of pid %" PRIu32
		    " uid %" PRIu32 " refused: %s (%" PRIu64 " more not "
		    "logged)", pid, uid, why, held);
	return KVT_EBUSY;
}

/* ---------------------------------------------------------- closing */

static void srv_pipe_free_cb(uv_handle_t *h)
{
	struct srv_pipe *p = h->data;
	struct server *s = p->srv;
	if (s->ctl.n_closing)
		s->ctl.n_closing--;
	free(p->rx);
	free(p);
}

/* The whole frames p read and never took. */
static uint64_t srv_pipe_unread_frames(const struct srv_pipe *p)
{
	uint64_t n = 0, need, len;
	uint32_t o = p->rx_off + (p->greeted ? 0 : SPW_HELLO_LEN);
	const uint8_t *m;
	const char *why;
	while (o < p->rx_len &&
	       spw_frame(p->rx + o, p->rx_len - o, UINT64_MAX, &need, &m, &len,
	                 &why) == SPW_OK) {
		n++;
		o += (uint32_t)need;
	}
	return n;
}

void srv_pipe_close(struct server *s, struct srv_pipe *p, uint64_t *counter,
                    const char *why)
{
	if (p->closing)
		return;
	p->closing = 1;
	if (counter) {
		(*counter)++;
		LOG_EVERY(LOG_LVL_WARNING, 1000, "closing control connection %"
		          PRIu32 " (pid %" PRIu32 "): %s", p->id, p->pid, why);
	} else if (why && why[0] && !s->stopping) {
		LOG(LOG_LVL_INFO, "control connection %" PRIu32 " (pid %"
		    PRIu32 ") closed: %s", p->id, p->pid, why);
	}
	s->st.control_requests_dropped_total +=
		p->inflight + srv_pipe_unread_frames(p);
	if (p->starved) {
		struct srv_pipe **q = &s->ctl.starved_head, *prev = NULL;
		while (*q && *q != p) {
			prev = *q;
			q = &(*q)->starved_next;
		}
		if (*q)
			*q = p->starved_next;
		if (s->ctl.starved_tail == p)
			s->ctl.starved_tail = prev;
		p->starved = 0;
	}
	srv_pipe_del(s, p->id);
	if (p->big && s->ctl.n_big_rx)
		s->ctl.n_big_rx--;
	p->big = 0;
	if (p->bound) {
		/* Its tenant's reclaim below unbinds by id, which no longer
		 * finds it: the count is kept here. */
		p->bound = 0;
		if (s->ctl.n_bound_pipes)
			s->ctl.n_bound_pipes--;
	}
	s->ctl.n_closing++;
	if (p->reading)
		uv_read_stop((uv_stream_t *)&p->h);
	p->reading = 0;
	uv_close((uv_handle_t *)&p->h, srv_pipe_free_cb);
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (st && st->pipe_id == p->id) {
			s->st.tenants_reclaimed_total++;
			srv_reclaim(s, st, "control connection closed");
		}
	}
}

/* Marks the connection of a tenant registered (1) or released (0). */
void srv_pipe_bind(struct server *s, uint32_t id, int bound)
{
	struct srv_pipe *p = srv_pipe_find(s, id);
	if (!p || p->bound == bound)
		return;
	p->bound = bound;
	if (bound)
		s->ctl.n_bound_pipes++;
	else if (s->ctl.n_bound_pipes)
		s->ctl.n_bound_pipes--;
	if (!bound)
		p->last_ms = now_ms(); /* the idle deadline starts now */
}

/* Cron: control connections without a tenant that sent nothing for
 * hello_timeout_ms (kvtrimctl's connections are busy or short), and
 * those whose replies waited send_timeout_ms with no byte taken, are
 * closed; one that could not get read memory is read again. */
void srv_pipe_cron(struct server *s, uint64_t now)
{
	struct srv_pipe *due[SRV_CLOSES_PER_TICK];
	uint64_t *why_c[SRV_CLOSES_PER_TICK];
	const char *why[SRV_CLOSES_PER_TICK];
	uint32_t n = 0;
	for (uint32_t i = 0; i < s->ctl.pipes_cap; i++) {
		struct srv_pipe *p = s->ctl.pipes[i];
		if (!p)
			continue;
		if (n < SRV_CLOSES_PER_TICK && p->stall_ms &&
		    now - p->stall_ms > s->cfg.send_timeout_ms &&
		    uv_stream_get_write_queue_size((uv_stream_t *)&p->h)) {
			due[n] = p;
			why_c[n] = &s->st.control_conns_closed_send_timeout_total;
			why[n++] = "it did not take a reply within "
			           "send_timeout_ms";
		} else if (n < SRV_CLOSES_PER_TICK && !p->bound && !p->inflight &&
		           now - p->last_ms > s->cfg.hello_timeout_ms) {
			due[n] = p;
			why_c[n] = &s->st.control_conns_closed_idle_total;
			why[n++] = "no request and no tenant within "
			           "hello_timeout_ms";
		} else if (!p->reading && !p->starved) {
			srv_pipe_pump(s, p);
		}
	}
	/* (Closing shifts the table: the ones due are closed after the scan;
	 * beyond SRV_CLOSES_PER_TICK they wait for the next tick.) */
	for (uint32_t k = 0; k < n; k++)
		srv_pipe_close(s, due[k], why_c[k], why[k]);
	srv_refuse_cron(s, now);
}
