/*
 * pipes.c — kvtrimd's control connections (one nng pipe each): the table
 * the loop keeps of them (struct srv_pipe), nng's pipe events, the refusal
 * at accept, and closing the connections the daemon gives up on.
 *
 * The table is there so that no peer can hold the daemon: a connection has
 * at most max_inflight_per_conn requests in flight and a reply waits at
 * most send_timeout_ms (ctl.c), one without a tenant is closed after
 * hello_timeout_ms without a request, and beyond max_pending_conns such
 * connections are refused at accept (admins and registered tenants never
 * are).
 *
 * nng 1.5.2's race: nng_pipe_close on a pipe whose peer is streaming
 * requests races the transport's receive re-arm, which is then dropped,
 * and nng's pipe reaper hangs for good (no closed connection is released
 * again, and nng_close never returns).  So nothing here closes a pipe at
 * once: srv_pipe_kick only marks it (its requests are dropped unread from
 * then on), and the cron closes it (srv_pipe_reap): at the socket for a
 * process without a tenant (srv_ctl_shutdown; nng meets the EOF and closes
 * the pipe itself, in order), with nng_pipe_close after SRV_QUIET_MS of
 * silence otherwise.  Closes nng never releases are counted
 * (s->unreleased) and logged.
 */
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "server_int.h"

#define SRV_QUIET_MS 200      /* a connection this long silent is safe to
                                 close (srv_pipe_reap) */
#define SRV_KICK_BATCH 64     /* processes shut down per cron tick */
#define SRV_DISCARD_READS 64  /* reads of a shut connection's queue */
#define SRV_RELEASE_MS 10000   /* a close nng has not released by then is
                                  counted as unreleased */

/* ---------------------------------------------------------- nng side */

/*
 * ADD_PRE: a connection beyond max_pending_conns that no tenant is
 * registered on is refused (closed before it joins the socket), unless
 * its peer is an admin; registered tenants' connections do not count, so
 * neither they nor kvtrimctl as an admin ever lose their place.
 * nng runs REM_POST for every pipe that saw ADD_PRE, refused ones included,
 * which keeps control_conns exact.
 */
void srv_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct server *s = arg;
	if (ev == NNG_PIPE_EV_ADD_PRE) {
		int open = __atomic_add_fetch(&s->control_conns, 1,
		                              __ATOMIC_RELAXED);
		int bound = __atomic_load_n(&s->tenant_pipes, __ATOMIC_RELAXED);
		uint32_t max = __atomic_load_n(&s->max_pending,
		                               __ATOMIC_RELAXED);
		uint64_t pid = 0, uid = 0, gid = 0;
		int closing = __atomic_load_n(&s->closing_pipes,
		                              __ATOMIC_RELAXED);
		if (open - bound - closing > (int)max &&
		    (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) ||
		     nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_GID, &gid) ||
		     nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) ||
		     !srv_acl_has(s, &s->admin, (uint32_t)pid, (uint32_t)uid,
		                  (uint32_t)gid))) {
			nng_pipe_close(p);
			__atomic_add_fetch(&s->ctl_refused, 1, __ATOMIC_RELAXED);
			uv_async_send(&s->wake); /* the loop logs it */
		}
		return;
	}
	if (ev == NNG_PIPE_EV_REM_POST)
		__atomic_sub_fetch(&s->control_conns, 1, __ATOMIC_RELAXED);
	struct srv_pipe_ev *e = malloc(sizeof(*e));
	if (!e)
		return; /* the pid check in cron still reclaims the tenant */
	e->pipe_id = (uint32_t)nng_pipe_id(p);
	e->added = ev == NNG_PIPE_EV_ADD_POST;
	e->next = NULL;
	pthread_mutex_lock(&s->qlock);
	if (s->pipe_evs_tail)
		s->pipe_evs_tail->next = e;
	else
		s->pipe_evs = e;
	s->pipe_evs_tail = e;
	pthread_mutex_unlock(&s->qlock);
	uv_async_send(&s->wake);
}

/* ---------------------------------------------------------- the table */

static uint32_t srv_pipe_slot(const struct server *s, uint32_t id)
{
	uint32_t m = s->pipes_cap - 1, i = (id * 2654435761u) & m;
	while (s->pipes[i].id && s->pipes[i].id != id)
		i = (i + 1) & m;
	return i;
}

struct srv_pipe *srv_pipe_find(struct server *s, uint32_t id)
{
	if (!id || !s->pipes_cap)
		return NULL;
	struct srv_pipe *p = &s->pipes[srv_pipe_slot(s, id)];
	return p->id ? p : NULL;
}

/* The entry of pipe id, created when missing; NULL only when out of
 * memory (the connection is then simply not limited). */
struct srv_pipe *srv_pipe_get(struct server *s, uint32_t id)
{
	struct srv_pipe *p = srv_pipe_find(s, id);
	if (p)
		return p;
	if (2 * (s->n_pipes + 1) > s->pipes_cap) {
		uint32_t cap = s->pipes_cap ? 2 * s->pipes_cap : 64;
		struct srv_pipe *old = s->pipes, *nt = calloc(cap, sizeof(*nt));
		if (!nt)
			return NULL;
		uint32_t ocap = s->pipes_cap;
		s->pipes = nt;
		s->pipes_cap = cap;
		for (uint32_t i = 0; i < ocap; i++)
			if (old[i].id)
				s->pipes[srv_pipe_slot(s, old[i].id)] = old[i];
		free(old);
	}
	p = &s->pipes[srv_pipe_slot(s, id)];
	*p = (struct srv_pipe){.id = id, .last_ms = now_ms()};
	nng_pipe np = NNG_PIPE_INITIALIZER;
	uint64_t pid = 0;
	np.id = id;
	if (nng_pipe_get_uint64(np, NNG_OPT_IPC_PEER_PID, &pid) == 0)
		p->pid = (uint32_t)pid;
	s->n_pipes++;
	return p;
}

/* Removes pipe id's entry (backward-shift deletion keeps probes short). */
static void srv_pipe_del(struct server *s, uint32_t id)
{
	if (!srv_pipe_find(s, id))
		return;
	uint32_t m = s->pipes_cap - 1, i = srv_pipe_slot(s, id);
	s->pipes[i].id = 0;
	s->n_pipes--;
	for (uint32_t j = (i + 1) & m; s->pipes[j].id; j = (j + 1) & m) {
		uint32_t home = (s->pipes[j].id * 2654435761u) & m;
		/* Move j back into the hole at i unless its home lies in
		 * (i, j] (cyclically). */
		if (((j - home) & m) >= ((j - i) & m)) {
			s->pipes[i] = s->pipes[j];
			s->pipes[j].id = 0;
			i = j;
		}
	}
}

/*
 * Applies nng's pipe events, in order: a new connection gets its entry, a
 * closed one loses it, and a tenant registered on it is reclaimed.  First,
 * the connections refused at accept since the last call are counted and
 * logged.
 */
void srv_pipe_events(struct server *s, struct srv_pipe_ev *evs)
{
	uint64_t refused = __atomic_exchange_n(&s->ctl_refused, 0,
	                                       __ATOMIC_RELAXED);
	if (refused) {
		s->st.control_conns_refused_total += refused;
		LOG_EVERY(LOG_LVL_WARNING, 1000, "ctl.ipc: %" PRIu64 " "
		          "connection(s) refused: max_pending_conns (%" PRIu32
		          ") connections without a tenant are open", refused,
		          s->cfg.max_pending_conns);
	}
	while (evs) {
		struct srv_pipe_ev *e = evs;
		evs = e->next;
		if (e->added) {
			srv_pipe_get(s, e->pipe_id);
			free(e);
			continue;
		}
		struct srv_pipe *gone = srv_pipe_find(s, e->pipe_id);
		if (gone && gone->closed_ms)
			__atomic_sub_fetch(&s->closing_pipes, 1,
			                   __ATOMIC_RELAXED);
		srv_pipe_del(s, e->pipe_id);
		for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
			struct srv_tenant *st = s->tenants[i];
			if (st && st->pipe_id == e->pipe_id) {
				s->st.tenants_reclaimed_total++;
				srv_reclaim(s, st, "control connection closed");
			}
		}
		free(e);
	}
}

/* Marks the connection of a tenant registered (1) or released (0). */
void srv_pipe_bind(struct server *s, uint32_t id, int bound)
{
	struct srv_pipe *p = srv_pipe_find(s, id);
	if (p)
		p->bound = bound;
	__atomic_add_fetch(&s->tenant_pipes, bound ? 1 : -1, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------- closing */

/* srv_ctl_shutdown on one descriptor: 1 when fd is an accepted ctl.ipc
 * connection of one of pids[n] (n 0: of any) and was shut down. */
static int ctl_shutdown_one(const struct server *s, int fd,
                            const uint32_t *pids, uint32_t n)
{
	int acc = 0, hit = !n;
	struct sockaddr_un a;
	struct ucred cr;
	socklen_t al = sizeof(a), il = sizeof(acc), cl = sizeof(cr);
	if (getsockname(fd, (struct sockaddr *)&a, &al) ||
	    a.sun_family != AF_UNIX || al <= sizeof(sa_family_t) ||
	    strncmp(a.sun_path, s->ctl_path, sizeof(a.sun_path)) ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &il) || acc)
		return 0;
	if (n && !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl))
		for (uint32_t i = 0; i < n && !hit; i++)
			hit = pids[i] == (uint32_t)cr.pid;
	if (!hit)
		return 0;
	/* What the peer queued is discarded first: nng then meets EOF (or
	 * a cut frame) at its next read and closes the pipe from that error
	 * at once, rather than reading on while the peer's own close (EPIPE
	 * on our blocked reply) closes it from elsewhere, which is the race
	 * that wedges nng. */
	char junk[16384];
	for (int k = 0; k < SRV_DISCARD_READS &&
	                recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0;
	     k++)
		;
	return shutdown(fd, SHUT_RD) == 0;
}

/*
 * Shuts down for reading, at the socket, the accepted ctl.ipc connections
 * of the processes in pids[n] (n 0: of every process).  nng then reads what
 * they had queued, meets EOF and closes those pipes itself, from its own
 * receive callback; their writes fail, so a flooding peer stops.  Returns
 * how many.  It scans the process's descriptors: cron and shutdown only.
 */
uint32_t srv_ctl_shutdown(const struct server *s, const uint32_t *pids,
                          uint32_t n)
{
	uint32_t done = 0;
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d));) {
		int fd = atoi(e->d_name);
		if (fd <= 2 || fd == dirfd(d))
			continue;
		/* nng's threads may close fd at any moment and the number
		 * may then name a new socket (another peer's): every check
		 * and action below is on a duplicate, which holds the
		 * socket it was made from whatever happens to fd. */
		int dup = fcntl(fd, F_DUPFD_CLOEXEC, 3);
		if (dup < 0)
			continue;
		done += ctl_shutdown_one(s, dup, pids, n);
		close(dup);
	}
	closedir(d);
	return done;
}

/*
 * Gives up on a control connection, once: its requests are dropped from
 * now on, and the cron closes it (srv_pipe_reap; nng then reports its
 * removal, which reclaims a tenant registered on it).
 */
void srv_pipe_kick(struct server *s, uint32_t id, uint64_t *counter,
                   const char *why)
{
	struct srv_pipe *e = srv_pipe_find(s, id);
	if (!e || e->kicked)
		return; /* gone already, or closing */
	e->kicked = 1;
	e->close_counter = counter;
	e->close_why = why;
}

/* e was closed by the daemon: it no longer counts against
 * max_pending_conns, whether or not nng ever reports its removal. */
static void srv_pipe_closed(struct server *s, struct srv_pipe *e,
                            uint64_t now)
{
	if (e->closed_ms)
		return;
	e->closed_ms = now ? now : 1;
	__atomic_add_fetch(&s->closing_pipes, 1, __ATOMIC_RELAXED);
}

/*
 * Closes the connections kicked since the last tick.  nng 1.5 can hang its
 * pipe reaper for good (no closed connection is released again, and
 * nng_close never returns) when it closes a pipe whose peer is streaming
 * requests: nng_pipe_close races the transport's receive re-arm, which is
 * then dropped.  So the connections of a process without a tenant are shut
 * down at the socket instead (srv_ctl_shutdown: nng closes them from the
 * EOF, in order); those of a process that holds a tenant (the fd of one of
 * them cannot be told apart) get nng_pipe_close once they sent nothing for
 * SRV_QUIET_MS, and stay muted until then.
 */
static void srv_pipe_reap(struct server *s, uint64_t now)
{
	uint32_t pids[SRV_KICK_BATCH], n = 0;
	uint64_t *why_of[SRV_KICK_BATCH]; /* the counter of pids[k]'s kick */
	for (uint32_t i = 0; i < s->pipes_cap; i++) {
		struct srv_pipe *e = &s->pipes[i];
		if (!e->id || !e->close_counter)
			continue;
		int socket = e->pid && !srv_pid_has_tenant(s, e->pid);
		if (socket) {
			uint32_t k = 0;
			while (k < n && pids[k] != e->pid)
				k++;
			if (k == n && n == SRV_KICK_BATCH)
				continue; /* next tick */
			if (k == n) {
				why_of[n] = e->close_counter;
				pids[n++] = e->pid;
			}
		} else if (now - e->rx_ms < SRV_QUIET_MS) {
			continue;
		}
		(*e->close_counter)++;
		LOG_EVERY(LOG_LVL_WARNING, 1000, "closing control connection %"
		          PRIu32 " (pid %" PRIu32 "): %s", e->id, e->pid,
		          e->close_why);
		e->close_counter = NULL;
		srv_pipe_closed(s, e, now);
		if (!socket) {
			nng_pipe p = NNG_PIPE_INITIALIZER;
			p.id = e->id;
			nng_pipe_close(p);
		}
	}
	if (!n)
		return;
	srv_ctl_shutdown(s, pids, n);
	/* That closed every connection of those processes (none holds a
	 * tenant): the ones not kicked themselves count with their
	 * process's reason, and drop their requests from now on. */
	for (uint32_t i = 0; i < s->pipes_cap; i++) {
		struct srv_pipe *e = &s->pipes[i];
		for (uint32_t k = 0; e->id && !e->kicked && k < n; k++)
			if (e->pid == pids[k]) {
				e->kicked = 1;
				(*why_of[k])++;
			}
		for (uint32_t k = 0; e->id && !e->closed_ms && k < n; k++)
			if (e->pid == pids[k])
				srv_pipe_closed(s, e, now);
	}
}

/* Cron: control connections without a tenant that sent nothing for
 * hello_timeout_ms are kicked (kvtrimctl's connections are busy or
 * short), the kicked ones closed, and the closes nng never released
 * counted. */
void srv_pipe_cron(struct server *s, uint64_t now)
{
	for (uint32_t i = 0; i < s->pipes_cap; i++) {
		struct srv_pipe *p = &s->pipes[i];
		if (p->id && !p->bound && !p->inflight && !p->kicked &&
		    now - p->last_ms > s->cfg.hello_timeout_ms)
			srv_pipe_kick(s, p->id, &s->st.control_conns_closed_idle_total,
			              "no request and no tenant within "
			              "hello_timeout_ms");
	}
	srv_pipe_reap(s, now);
	uint64_t unreleased = 0;
	for (uint32_t i = 0; i < s->pipes_cap; i++)
		unreleased += s->pipes[i].id && s->pipes[i].closed_ms &&
		              now - s->pipes[i].closed_ms > SRV_RELEASE_MS;
	if (unreleased > s->unreleased)
		LOG_EVERY(LOG_LVL_ERR, 60000, "%" PRIu64 " control connections "
		          "closed over %d s ago were never released by nng "
		          "(nng 1.5's pipe reaper is wedged, see "
		          "docs/design-changes.md): kvtrimd goes on serving; "
		          "restart it to free them", unreleased,
		          SRV_RELEASE_MS / 1000);
	s->unreleased = unreleased;
}
