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
 *
 * Authentication: peers are checked against allow_uids / allow_gids (empty:
 * the daemon's own uid and root) twice — SO_PEERCRED on fd.sock at accept,
 * and the nng pipe's peer uid at hello.  The admin ops that change
 * something (drain, config_set) are checked against admin_uids /
 * admin_gids instead (same default): a tenant is not an admin, and the four
 * lists change from the socket only with acl_from_socket = 1.  Read-only
 * admin ops are open to whoever may open the socket (mode 0660).
 *
 * Control connections (one nng pipe each) are tracked by the loop (struct
 * srv_pipe) so that no peer can hold the daemon: a reply waits at most
 * send_timeout_ms for its peer to take it, a connection has at most
 * max_inflight_per_conn requests in flight (more are dropped unanswered),
 * one without a tenant is closed after
 * hello_timeout_ms without a request, and beyond max_pending_conns such
 * connections are refused at accept (admins and registered tenants never
 * are).  One sync touches at most max_sync_lists page lists, which bounds
 * how long it holds the loop.
 *
 * Memory pressure, in three steps: above high_watermark every tenant gets
 * a pressure level (scaled by its priority, tenant_set_pressure) that
 * shrinks its policy's budgets at its next sync;
 * a seq_open or sync that still finds the pool full is parked (its nng
 * context simply does not answer yet; the loop goes on) and retried as
 * pages come free; after pressure_deadline_ms it is refused with
 * KVT_EPOOLFULL.  Nothing is ever over-committed: the pool's capacity is
 * checked by every allocation.
 *
 * Stats: the loop builds a snapshot (stats.h) every cron tick, and on
 * demand when the HTTP thread asks through uv_async; the HTTP thread only
 * ever reads published snapshots.
 */
#include "server.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "codec.h"
#include "handle.h"
#include "http.h"
#include "kvtrim.h"
#include "log.h"
#include "notify.h"
#include "policy.h"
#include "pool.h"
#include "rundir.h"
#include "stats.h"
#include "tenant.h"

/* nng drops a connection whose message exceeds this; messages between
 * IPC_MAX_MSG and this size get a KVT_ETOOBIG reply instead. */
#define SRV_RECV_MAX (4u * IPC_MAX_MSG)
#define SRV_CRON_MS 100
#define SRV_DRAIN_MS 200
#define SRV_STATUS_MS 1000   /* STATUS= refresh period */
#define SRV_SNAP_WAIT_MS 250 /* HTTP waits this long for a fresh snapshot */
#define SRV_ALLOW_MAX 64     /* ids per allow list */
#define SRV_DENIED_MS 2000   /* a refused fd.sock peer's time for its hello */
#define SRV_INLINE_LISTS 4096 /* a sync touching more runs on a worker */
#define SRV_WORKER_NICE 10    /* workers' priority below the loop's */
#define SRV_QUIET_MS 200      /* a connection this long silent is safe to
                                 close (srv_pipe_reap) */
#define SRV_KICK_BATCH 64     /* processes shut down per cron tick */
#define SRV_DISCARD_READS 64  /* reads of a shut connection's queue */
#define SRV_CLOSE_WAIT_MS 1500 /* shutdown: for connections to drain */
#define SRV_NNG_CLOSE_MS 2000  /* shutdown: for nng_close */
#define SRV_RELEASE_MS 10000   /* a close nng has not released by then is
                                  counted as unreleased */

/* fd.sock under attack (docs/protocol.md "Limits of the handle channel"). */
#define SRV_ACCEPT_BATCH 64      /* accepts per poll callback */
#define SRV_ACCEPT_PAUSE_MIN_MS 100  /* after a failed accept, doubling ... */
#define SRV_ACCEPT_PAUSE_MAX_MS 1000 /* ... to this while accept keeps failing */
#define SRV_CONN_BATCH 16        /* client packets read per poll callback */
#define SRV_PENDING_GRACE_MS 1000 /* a pending conn younger than this is not
                                     evicted for a newcomer */
#define SRV_PENDING_FLOOR 8      /* max_pending_conns never lowered below */
#define SRV_FD_PER_TENANT 4      /* handle channel, nng pipe, table, stage */
#define SRV_FD_SPARE 64          /* stdio, lock, loop, nng, MHD, driver */
#define SRV_LOG_EVERY_MS 5000    /* repeated warnings: one per interval */

struct server;

struct srv_req {
	struct server *srv;
	nng_ctx ctx;
	nng_aio *aio;
	int sending;
	nng_msg *msg;        /* received request, owned by the loop */
	struct srv_req *next; /* ready queue, then the parked list */
	uint64_t recv_us;    /* when nng delivered it (set before queueing) */
	uint64_t park_deadline_ms; /* parked: refuse after this */
	int dev_wait; /* parked until a tenant's GPU writes are done */
	uint32_t pipe_id; /* the request's control connection, 0 once done */
	int held;         /* it waited for its tenant: a retry, not new */
	int held_parked;  /* ... and was a backpressure retry then */
	int send_rv;      /* nng result of the reply's send (done queue) */
};

/* srv_dispatch: the sync waits for the engine's GPU writes
 * (tenant_sync_ready); park it, retry at the wakeup.  Never on the wire. */
#define SRV_DEVICE_WAIT 1
/* srv_dispatch: the sync now runs on a worker thread (struct srv_job),
 * which owns the request until it ends; no reply yet. */
#define SRV_ASYNC 2
/* srv_dispatch: the request's tenant has a sync on a worker; the request
 * waits in the tenant's queue and is handled again when that ends. */
#define SRV_TENANT_BUSY 3
/* srv_dispatch: an admin request that must see no sync running (check);
 * parked like SRV_DEVICE_WAIT, without its counter. */
#define SRV_IDLE_WAIT 4

struct srv_tenant;

struct srv_conn {
	struct server *srv;
	int fd;
	uv_poll_t poll;
	uint64_t cookie;
	uint32_t pid, uid, gid;
	int denied;      /* peer not in the allow lists: its hello is refused */
	uint64_t born_ms;
	struct srv_tenant *st; /* bound tenant, NULL until hello */
	struct srv_conn *prev, *next;
	int closing;
	char close_why[128]; /* why the daemon closes it ("": the peer did) */
};

struct srv_tenant {
	struct tenant *t;
	uint32_t id;
	uint64_t token;
	uint32_t pipe_id;
	uint32_t pid;
	struct srv_conn *conn;
	int draining;   /* kvtrimctl drain: no new sequences */
	/*
	 * busy: one of its syncs runs on a worker thread (srv_job), which
	 * alone touches st->t until it ends; the loop then reads only what a
	 * sync does not change (name, spec, geometry), and `cached` for the
	 * counters.  Its other requests wait in wait_* (in order).
	 * doomed: released while busy (why); freed when the sync ends.
	 */
	int busy;
	int doomed;
	char doomed_why[160];
	int reload_pending; /* SIGHUP came while busy */
	uint64_t sync_us;   /* moving average of its syncs' apply time */
	struct kvt_tenant_stats cached;
	struct srv_req *wait_head, *wait_tail;
};

/* A sync running on a libuv worker thread for one tenant. */
struct srv_job {
	uv_work_t work;
	struct server *s;
	struct srv_tenant *st;
	struct srv_req *r;
	int parked;          /* r is a backpressure retry */
	struct ipc_req req;  /* the decoded sync, owned by the job */
	int rv;
	char why[KVT_ERRTEXT_MAX];
	struct kvt_tenant_stats before, after;
	uint64_t apply_us, scorer_ns;
};

struct srv_acl {
	int configured; /* either list non-empty */
	uint32_t uid[SRV_ALLOW_MAX], n_uid;
	uint32_t gid[SRV_ALLOW_MAX], n_gid;
};

struct srv_pipe_ev {
	uint32_t pipe_id;
	int added; /* NNG_PIPE_EV_ADD_POST, else REM_POST */
	struct srv_pipe_ev *next;
};

/*
 * One open control connection (nng pipe), loop thread only.  inflight
 * counts its requests from receipt until nng took the reply (queued,
 * handled, parked or being sent); a peer that stops reading its replies
 * keeps its sends, and so the contexts, waiting: max_inflight_per_conn
 * bounds how many contexts one connection can hold, and send_timeout_ms
 * how long.
 */
struct srv_pipe {
	uint32_t id;       /* nng pipe id; 0: free slot */
	uint32_t inflight;
	uint64_t last_ms;  /* last request received or reply taken */
	int bound;         /* a tenant registered on it (no idle deadline) */
	int kicked;        /* the daemon gave up on it: its requests are
	                      dropped unread, and it is closed (now, or once
	                      it is quiet: srv_pipe_kick) */
	uint64_t rx_ms;    /* last message of any kind from it */
	uint32_t pid;      /* its peer process (0: unknown) */
	uint64_t *close_counter; /* a close still due: what to count */
	const char *close_why;
	uint64_t closed_ms; /* when the daemon closed it (0: it did not) */
};

struct server {
	struct config cfg;
	struct config_args args; /* how cfg was built, for SIGHUP */
	uv_loop_t loop;
	struct pool pool;
	/* Where KV memory lives (backend.h): the table is static, bctx is
	 * freed by server_free after every tenant and chunk is gone. */
	const struct kvt_backend_ops *bops;
	void *bctx;
	const char *bmode; /* "memfd" | "vmm" | "ipc" */
	struct stats st;
	uint64_t started_ms;

	nng_socket sock;
	nng_listener listener;
	int sock_open;
	struct srv_req *reqs; /* [cfg.contexts] */
	uint32_t n_reqs;

	pthread_mutex_t qlock;   /* guards ready_*, done_* and pipe_evs */
	struct srv_req *ready_head, *ready_tail;
	struct srv_req *done_head, *done_tail; /* replies nng finished */
	struct srv_pipe_ev *pipe_evs, *pipe_evs_tail; /* in order */
	uv_async_t wake;

	/* Open control connections, open addressing on the pipe id
	 * (linear probing, at most half full). */
	struct srv_pipe *pipes; /* [pipes_cap] */
	uint32_t pipes_cap, n_pipes;

	int hsock;
	uv_poll_t hpoll;
	int hpoll_ready;
	struct srv_conn *conns;     /* newest first */
	struct srv_conn *conns_tail; /* oldest */
	uint32_t n_conns;           /* fd.sock connections, with or without a
	                               tenant */
	/* Accept back-off: after a failed accept (out of fds, say) the
	 * listener is not polled until accept_resume_ms (cron restarts it). */
	int accept_paused;
	uint64_t accept_resume_ms;
	uint32_t accept_pause_ms;   /* 0, or 100 doubling to 1000 */
	struct log_rate accept_log, refuse_log, violation_log, denied_log,
	                hello_log; /* repeatable warnings (SRV_LOG_EVERY_MS) */
	/* fd budget (srv_fd_budget): the open-file limit in force and the
	 * most max_pending_conns it leaves room for. */
	uint64_t fd_limit;
	uint32_t pending_cap;
	int lock_fd; /* runtime dir's kvtrimd.lock (rundir_lock), -1: none */

	struct srv_tenant **tenants; /* [cfg.max_tenants] */
	uint32_t next_tenant_id;

	uint32_t n_jobs; /* syncs running on worker threads */
	/* srv_nng_close: nng_close returned (under qlock), or not in time. */
	pthread_cond_t close_cv;
	int nng_closed, nng_wedged;

	/* Requests waiting for pool pages, oldest first (loop thread). */
	struct srv_req *parked_head, *parked_tail;
	uint32_t n_parked;
	float pressure; /* pool-wide level, 0..1 */

	/* Parsed access lists (cfg.allow_* and cfg.admin_*). */
	pthread_mutex_t acl_lock;
	struct srv_acl allow, admin;

	int control_conns; /* nng pipes open; atomic (nng threads) */
	int tenant_pipes;  /* of which a tenant is registered on; atomic,
	                      written by the loop, read at accept */
	int closing_pipes; /* of which the daemon closed and nng has not
	                      released yet; atomic, likewise */
	uint64_t unreleased; /* closed over SRV_RELEASE_MS ago (cron) */
	uint64_t ctl_refused; /* atomic: pipes refused at accept */
	uint32_t max_pending; /* atomic copy of srv_pending_max() for ctl.ipc */

	struct stats_pub pub;
	int pub_ready;
	struct http *http;
	uv_async_t snap_async;  /* HTTP thread asks for a fresh snapshot */

	uv_signal_t sigterm, sigint, sighup;
	uv_timer_t cron, drain, watchdog;
	uint64_t watchdog_ms;   /* 0: systemd expects no pings */
	uint64_t status_ms;     /* last STATUS= */
	int draining;
	volatile int stopping; /* set before nng_close: callbacks stop re-arming */
	uint64_t drain_started_ms;
	int loop_ready;

	char ctl_path[PATH_MAX], fd_path[PATH_MAX], stats_path[PATH_MAX];
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

static int srv_acl_has(const struct server *s, const struct srv_acl *a,
                       uint32_t pid, uint32_t uid, uint32_t gid);

/*
 * ADD_PRE: a connection beyond max_pending_conns that no tenant is
 * registered on is refused (closed before it joins the socket), unless
 * its peer is an admin; registered tenants' connections do not count, so
 * neither they nor kvtrimctl as an admin ever lose their place.
 * nng runs REM_POST for every pipe that saw ADD_PRE, refused ones included,
 * which keeps control_conns exact.
 */
static void srv_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
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

/* ---------------------------------------------------------- connections */

static uint32_t srv_pipe_slot(const struct server *s, uint32_t id)
{
	uint32_t m = s->pipes_cap - 1, i = (id * 2654435761u) & m;
	while (s->pipes[i].id && s->pipes[i].id != id)
		i = (i + 1) & m;
	return i;
}

static struct srv_pipe *srv_pipe_find(struct server *s, uint32_t id)
{
	if (!id || !s->pipes_cap)
		return NULL;
	struct srv_pipe *p = &s->pipes[srv_pipe_slot(s, id)];
	return p->id ? p : NULL;
}

/* The entry of pipe id, created when missing; NULL only when out of
 * memory (the connection is then simply not limited). */
static struct srv_pipe *srv_pipe_get(struct server *s, uint32_t id)
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
 * Shuts down for reading, at the socket, the accepted ctl.ipc connections
 * of the processes in pids[n] (n 0: of every process).  nng then reads what
 * they had queued, meets EOF and closes those pipes itself, from its own
 * receive callback; their writes fail, so a flooding peer stops.  Returns
 * how many.  It scans the process's descriptors: cron and shutdown only.
 */
static uint32_t srv_ctl_shutdown(const struct server *s, const uint32_t *pids,
                                 uint32_t n)
{
	uint32_t done = 0;
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d));) {
		int fd = atoi(e->d_name), acc = 0, hit = !n;
		struct sockaddr_un a;
		struct ucred cr;
		socklen_t al = sizeof(a), il = sizeof(acc), cl = sizeof(cr);
		if (fd <= 2 || fd == dirfd(d) ||
		    getsockname(fd, (struct sockaddr *)&a, &al) ||
		    a.sun_family != AF_UNIX || al <= sizeof(sa_family_t) ||
		    strncmp(a.sun_path, s->ctl_path, sizeof(a.sun_path)) ||
		    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &il) || acc)
			continue;
		if (n && !getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl))
			for (uint32_t i = 0; i < n && !hit; i++)
				hit = pids[i] == (uint32_t)cr.pid;
		if (!hit)
			continue;
		/* What the peer queued is discarded first: nng then meets
		 * EOF (or a cut frame) at its next read and closes the pipe
		 * from that error at once, rather than reading on while the
		 * peer's own close (EPIPE on our blocked reply) closes it
		 * from elsewhere, which is the race that wedges nng. */
		char junk[16384];
		for (int k = 0; k < SRV_DISCARD_READS &&
		                recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0;
		     k++)
			;
		done += shutdown(fd, SHUT_RD) == 0;
	}
	closedir(d);
	return done;
}

/* Does process pid hold a registered tenant? */
static int srv_pid_has_tenant(const struct server *s, uint32_t pid)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] && s->tenants[i]->pid == pid)
			return 1;
	return 0;
}

/*
 * Gives up on a control connection, once: its requests are dropped from
 * now on, and the cron closes it (srv_pipe_reap; nng then reports its
 * removal, which reclaims a tenant registered on it).
 */
static void srv_pipe_kick(struct server *s, uint32_t id, uint64_t *counter,
                          const char *why)
{
	struct srv_pipe *e = srv_pipe_find(s, id);
	if (!e || e->kicked)
		return; /* gone already, or closing */
	e->kicked = 1;
	e->close_counter = counter;
	e->close_why = why;
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

/* Marks the connection of a tenant registered (1) or released (0). */
static void srv_pipe_bind(struct server *s, uint32_t id, int bound)
{
	struct srv_pipe *p = srv_pipe_find(s, id);
	if (p)
		p->bound = bound;
	__atomic_add_fetch(&s->tenant_pipes, bound ? 1 : -1, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------- tenants */

static struct srv_tenant *srv_find_tenant(struct server *s, uint32_t id)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] && s->tenants[i]->id == id)
			return s->tenants[i];
	return NULL;
}

/* ---------------------------------------------------------- auth */

/* Is gid among the supplementary groups of a live process (/proc)? */
static int srv_pid_in_group(uint32_t pid, uint32_t gid)
{
	char path[64], line[4096];
	int found = 0;
	if (!pid)
		return 0;
	snprintf(path, sizeof(path), "/proc/%" PRIu32 "/status", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "Groups:", 7))
			continue;
		char *p = line + 7, *end;
		for (;;) {
			unsigned long g = strtoul(p, &end, 10);
			if (end == p)
				break;
			if (g == gid) {
				found = 1;
				break;
			}
			p = end;
		}
		break;
	}
	fclose(f);
	return found;
}

/*
 * An access list: a peer is in it when its uid is in uids or its primary
 * or a supplementary group is in gids.  With both lists empty it holds the
 * daemon's own uid and root (and nobody else).  Two lists: allow (who may
 * register a tenant) and admin (who may use the admin ops that change
 * something: drain, config set); being one does not make a peer the other.
 * Read from nng threads too (srv_pipe_cb), hence acl_lock.
 */
static int srv_acl_has(const struct server *s, const struct srv_acl *a,
                       uint32_t pid, uint32_t uid, uint32_t gid)
{
	int in = 0;
	pthread_mutex_lock((pthread_mutex_t *)&s->acl_lock);
	if (!a->configured)
		in = uid == 0 || uid == (uint32_t)geteuid();
	for (uint32_t i = 0; i < a->n_uid && !in; i++)
		in = a->uid[i] == uid;
	for (uint32_t i = 0; i < a->n_gid && !in; i++)
		in = a->gid[i] == gid || srv_pid_in_group(pid, a->gid[i]);
	pthread_mutex_unlock((pthread_mutex_t *)&s->acl_lock);
	return in;
}

static int srv_allowed(const struct server *s, uint32_t pid, uint32_t uid,
                       uint32_t gid)
{
	return srv_acl_has(s, &s->allow, pid, uid, gid);
}

/* Re-reads one list after a config change (values were validated by the
 * config table, so a parse failure means a name vanished from NSS since:
 * that list then holds nobody, which fails closed). */
static uint32_t srv_acl_load(const char *key, const char *list, int gids,
                             uint32_t *ids)
{
	int n = config_parse_ids(list, gids, ids, SRV_ALLOW_MAX);
	if (n < 0 || n > SRV_ALLOW_MAX)
		LOG(LOG_LVL_WARNING, "%s: %s", key, n < 0 ?
		    "a name no longer resolves; the list allows nobody" :
		    "more than 64 entries; the rest are ignored");
	return n < 0 ? 0 : n > SRV_ALLOW_MAX ? SRV_ALLOW_MAX : (uint32_t)n;
}

static void srv_acl_set(struct srv_acl *a, const char *ukey,
                        const char *uids, const char *gkey, const char *gids)
{
	a->configured = uids[0] || gids[0];
	a->n_uid = srv_acl_load(ukey, uids, 0, a->uid);
	a->n_gid = srv_acl_load(gkey, gids, 1, a->gid);
}

static void srv_allow_refresh(struct server *s)
{
	pthread_mutex_lock(&s->acl_lock);
	srv_acl_set(&s->allow, "allow_uids", s->cfg.allow_uids, "allow_gids",
	            s->cfg.allow_gids);
	srv_acl_set(&s->admin, "admin_uids", s->cfg.admin_uids, "admin_gids",
	            s->cfg.admin_gids);
	pthread_mutex_unlock(&s->acl_lock);
}

/* Checks the control connection's peer (nng reads SO_PEERCRED for us)
 * against the allow list, or the admin list (admin 1). */
static int srv_pipe_check(struct server *s, nng_pipe p, int admin,
                          const char *what, char *why, size_t wlen)
{
	uint64_t uid = 0, gid = 0, pid = 0;
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) ||
	    nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_GID, &gid)) {
		snprintf(why, wlen, "%s refused: the peer's credentials cannot "
		         "be read", what);
		s->st.auth_refusals_total++;
		return KVT_EPERM;
	}
	nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid);
	if (srv_acl_has(s, admin ? &s->admin : &s->allow, (uint32_t)pid,
	                (uint32_t)uid, (uint32_t)gid))
		return 0;
	snprintf(why, wlen, "%s refused: uid %" PRIu64 " gid %" PRIu64
	         " is not allowed (%s)", what, uid, gid,
	         admin ? "admin_uids / admin_gids" : "allow_uids / allow_gids");
	s->st.auth_refusals_total++;
	LOG_EVERY(LOG_LVL_WARNING, 1000, "%s (pid %" PRIu64 ")", why, pid);
	return KVT_EPERM;
}

static int srv_pipe_allowed(struct server *s, nng_pipe p, const char *what,
                            char *why, size_t wlen)
{
	return srv_pipe_check(s, p, 0, what, why, wlen);
}

static int srv_pipe_admin(struct server *s, nng_pipe p, const char *what,
                          char *why, size_t wlen)
{
	return srv_pipe_check(s, p, 1, what, why, wlen);
}

static void srv_conn_close(struct srv_conn *c);

/* The tenant's counters: live when no sync of it runs, else as of the
 * last time they were read live. */
static void srv_tenant_stats(struct srv_tenant *st,
                             struct kvt_tenant_stats *out)
{
	if (!st->busy)
		tenant_stats(st->t, &st->cached);
	*out = st->cached;
}

static void srv_tenant_free(struct srv_tenant *st, const char *why)
{
	struct kvt_tenant_stats ts;
	tenant_stats(st->t, &ts);
	LOG(LOG_LVL_NOTICE,
	    "tenant %" PRIu32 " '%s' (pid %" PRIu32 ") released: %s; "
	    "%" PRIu64 " pages, %" PRIu64 " chunks back to the pool",
	    st->id, tenant_name(st->t), st->pid, why, ts.pages_used, ts.chunks);
	tenant_free(st->t);
	free(st);
}

/*
 * Ends a tenant's lease: it leaves the table (its requests from now on get
 * ENOTENANT), its connections close, and its memory goes back to the pool
 * now, or, while one of its syncs runs on a worker, when that sync ends.
 */
static void srv_reclaim(struct server *s, struct srv_tenant *st,
                        const char *why)
{
	if (st->doomed)
		return;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] == st)
			s->tenants[i] = NULL;
	srv_pipe_bind(s, st->pipe_id, 0);
	if (st->conn) {
		st->conn->st = NULL;
		srv_conn_close(st->conn);
		st->conn = NULL;
	}
	if (st->busy) {
		st->doomed = 1;
		snprintf(st->doomed_why, sizeof(st->doomed_why), "%s", why);
		return;
	}
	srv_tenant_free(st, why);
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
		srv_reclaim(s, st, c->close_why[0] ? c->close_why
		                                   : "handle channel closed");
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		s->conns_tail = c->prev;
	s->n_conns--;
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

/* Disconnects a peer that broke the protocol; its tenant's lease ends
 * (srv_reclaim logs that once), a peer without one is logged rate
 * limited. */
static void srv_conn_violation(struct srv_conn *c, const char *what)
{
	struct server *s = c->srv;
	uint64_t held;
	s->st.handle_violations_total++;
	if (c->st)
		snprintf(c->close_why, sizeof(c->close_why), "it sent %s on "
		         "the handle channel", what);
	else if (log_rate_due(&s->violation_log, now_ms(), SRV_LOG_EVERY_MS,
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

/* The most fd.sock connections without a tenant at once: max_pending_conns,
 * lowered when the open-file limit leaves no room (srv_fd_budget). */
static uint32_t srv_pending_max(const struct server *s)
{
	return s->cfg.max_pending_conns < s->pending_cap
	               ? s->cfg.max_pending_conns
	               : s->pending_cap;
}

/* fd.sock connections that have no tenant (yet). */
static uint32_t srv_pending(const struct server *s)
{
	uint32_t bound = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		bound += s->tenants[i] && s->tenants[i]->conn;
	return s->n_conns > bound ? s->n_conns - bound : 0;
}

/* A connection closed at accept, or evicted: counted, logged rate
 * limited. */
static void srv_pending_refused(struct server *s, uint64_t now,
                                const char *what)
{
	uint64_t held;
	s->st.handle_pending_refusals_total++;
	if (log_rate_due(&s->refuse_log, now, SRV_LOG_EVERY_MS, &held))
		LOG(LOG_LVL_WARNING, "fd.sock: %" PRIu32 " connections without "
		    "a tenant (max_pending_conns, in force %" PRIu32 "): %s "
		    "(%" PRIu64 " more not logged)", srv_pending(s),
		    srv_pending_max(s), what, held);
}

/*
 * Room for one more connection without a tenant?  At the limit, the oldest
 * pending one that has had SRV_PENDING_GRACE_MS for its hello is closed to
 * make room: idle connections cannot lock newcomers out until the hello
 * deadline, and a client in the middle of its hello (a few ms) is not
 * evicted.  0 when every pending connection is younger: the new one is
 * refused.
 */
static int srv_pending_room(struct server *s, uint64_t now)
{
	if (s->n_conns < srv_pending_max(s) ||
	    srv_pending(s) < srv_pending_max(s))
		return 1;
	for (struct srv_conn *c = s->conns_tail; c; c = c->prev) {
		if (c->st)
			continue;
		if (now - c->born_ms < SRV_PENDING_GRACE_MS)
			return 0; /* older ones come first: none is due */
		srv_conn_close(c);
		srv_pending_refused(s, now, "the oldest was closed for a "
		                    "newcomer");
		return 1;
	}
	return 0;
}

static void srv_accept_cb(uv_poll_t *p, int status, int events);

/*
 * accept failed (EMFILE / ENFILE when out of fds, or anything else): the
 * listener is not polled for a while (level-triggered, it would call again
 * at once, forever), 100 ms doubling to 1 s while failures go on; cron
 * resumes it (srv_accept_resume).  Logged once per SRV_LOG_EVERY_MS.
 */
static void srv_accept_pause(struct server *s, int err)
{
	uint64_t now = now_ms(), held;
	s->st.handle_accept_failures_total++;
	s->accept_pause_ms = !s->accept_pause_ms ? SRV_ACCEPT_PAUSE_MIN_MS
	                     : s->accept_pause_ms * 2 > SRV_ACCEPT_PAUSE_MAX_MS
	                             ? SRV_ACCEPT_PAUSE_MAX_MS
	                             : s->accept_pause_ms * 2;
	uv_poll_stop(&s->hpoll);
	s->accept_paused = 1;
	s->accept_resume_ms = now + s->accept_pause_ms;
	if (log_rate_due(&s->accept_log, now, SRV_LOG_EVERY_MS, &held))
		LOG(LOG_LVL_WARNING, "fd.sock accept failed: %s (open-file "
		    "limit %" PRIu64 "); not accepting for %" PRIu32 " ms "
		    "(%" PRIu64 " more failures not logged)", strerror(err),
		    s->fd_limit, s->accept_pause_ms, held);
}

static void srv_accept_resume(struct server *s, uint64_t now)
{
	if (!s->accept_paused || s->draining || now < s->accept_resume_ms)
		return;
	s->accept_paused = 0;
	uv_poll_start(&s->hpoll, UV_READABLE, srv_accept_cb);
}

/* A new handle channel: WELCOME with its cookie, then it waits for its
 * hello (cron closes it after hello_timeout_ms). */
static void srv_conn_open(struct server *s, int fd, uint64_t now)
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
	if (handle_peer(fd, &c->pid, &c->uid, &c->gid) ||
	    !srv_allowed(s, c->pid, c->uid, c->gid)) {
		uint64_t held;
		/* Kept open until its hello (or the hello timeout) so the
		 * client learns why (KVT_EPERM), not just EOF. */
		c->denied = 1;
		s->st.auth_refusals_total++;
		if (log_rate_due(&s->denied_log, now, SRV_LOG_EVERY_MS, &held))
			LOG(LOG_LVL_WARNING, "fd.sock: pid %" PRIu32 " uid %"
			    PRIu32 " gid %" PRIu32 " is not allowed "
			    "(allow_uids / allow_gids); its hello will be "
			    "refused (%" PRIu64 " more refusals not logged)",
			    c->pid, c->uid, c->gid, held);
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
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	else
		s->conns_tail = c;
	s->conns = c;
	s->n_conns++;
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
		int rv = handle_accept(s->hsock, &fd);
		if (rv == KVT_EBUSY)
			return;
		if (rv) {
			srv_accept_pause(s, errno);
			return;
		}
		s->accept_pause_ms = 0;
		uint64_t now = now_ms();
		if (!srv_pending_room(s, now)) {
			close(fd);
			srv_pending_refused(s, now, "a new one was closed at "
			                    "accept");
			continue;
		}
		srv_conn_open(s, fd, now);
	}
}

static int srv_send_event(void *ctx, const struct tenant_event *e)
{
	struct srv_conn *c = ctx;
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
		                               e->type == HANDLE_TABLE_DEV
		                               ? e->fd
		                               : -1);
	}
	return handle_send(c->fd, &m, e->type == HANDLE_CHUNK_ADD ? e->fd : -1);
}

/* ---------------------------------------------------------- requests */

/* tenant_sync_ready's wakeup, on a driver thread: the loop retries the
 * parked requests (srv_wake_cb). */
static void srv_wake_from_device(void *arg)
{
	struct server *s = arg;
	uv_async_send(&s->wake);
}

/*
 * rv from a tenant operation: when a device call failed after the change
 * was committed (tenant_failed), the tenant's K/V and table cannot be
 * trusted any more, so it is reclaimed; rv is returned either way.
 */
static int srv_device_failed(struct server *s, struct srv_tenant *st, int rv,
                             const char *op)
{
	if (!tenant_failed(st->t))
		return rv;
	LOG(LOG_LVL_ERR, "tenant %" PRIu32 ": device failure during %s",
	    st->id, op);
	s->st.tenants_reclaimed_total++;
	srv_reclaim(s, st, "device failure");
	return rv;
}

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
	if (c->denied) {
		snprintf(why, wlen, "hello refused: uid %" PRIu32 " gid %" PRIu32
		         " is not allowed (allow_uids / allow_gids)", c->uid,
		         c->gid);
		LOG(LOG_LVL_WARNING, "%s (pid %" PRIu32 ")", why, c->pid);
		return KVT_EPERM;
	}
	int rv = srv_pipe_allowed(s, pipe, "hello", why, wlen);
	if (rv)
		return rv;
	/* More than the pool itself is tenant_new's refusal, with its text. */
	uint64_t pool_bytes = pool_bytes_total(&s->pool);
	uint64_t max_quota = s->cfg.max_quota ? s->cfg.max_quota : pool_bytes;
	if (s->cfg.max_quota && h->quota_bytes > max_quota) {
		snprintf(why, wlen, "quota of %" PRIu64 " bytes is above "
		         "max_quota (%" PRIu64 " bytes)", h->quota_bytes,
		         max_quota);
		s->st.quota_refusals_total++;
		return KVT_EQUOTA;
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
	/* A hello asking no quota gets default_quota (0: a fair share of the
	 * pool), never more than max_quota; tenant_memory_max caps the daemon
	 * memory its geometry may need. */
	struct tenant_limits lim = {
		.default_quota = s->cfg.default_quota,
		.max_quota = s->cfg.max_quota,
		.expected_tenants = s->cfg.expected_tenants,
		.memory_max = s->cfg.tenant_memory_max,
	};
	rv = tenant_new(&s->pool, s->next_tenant_id, h, &lim, &st->t, why,
	                wlen);
	if (rv) {
		if (lim.memory_need > lim.memory_max)
			s->st.memory_refusals_total++;
		free(st);
		return rv;
	}
	const struct shm_geom *g = tenant_geom(st->t);
	if ((uint64_t)g->n_layers * g->n_kv_heads > s->cfg.max_sync_lists) {
		snprintf(why, wlen, "a sequence has %" PRIu64 " page lists "
		         "(n_layers x n_kv_heads), more than one sync may touch "
		         "(max_sync_lists %" PRIu32 ")",
		         (uint64_t)g->n_layers * g->n_kv_heads,
		         s->cfg.max_sync_lists);
		tenant_free(st->t);
		free(st);
		return KVT_EGEOMETRY;
	}
	/* Device tenants: the two event handles go first, so the client has
	 * them (or fails) before its segments complete the hello. */
	if (tenant_flush_events(st->t, srv_send_event, c)) {
		tenant_free(st->t);
		free(st);
		snprintf(why, wlen, "cannot send event handles over the handle "
		         "channel");
		return KVT_ECONN;
	}
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
	srv_pipe_bind(s, st->pipe_id, 1);
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

/* ---------------------------------------------------------- stats */

/*
 * Appended per entry not evicted: 1 means no compression.  When every
 * entry was evicted the ratio is unbounded; the count appended is shown.
 */
static double srv_ratio(uint64_t appended, uint64_t evicted)
{
	if (!appended)
		return 1.0;
	if (evicted >= appended)
		return (double)appended;
	return (double)appended / (double)(appended - evicted);
}

/* Everything the stats outputs show, from live state (loop thread). */
static struct stats_snap *srv_snapshot(struct server *s)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		n += s->tenants[i] != NULL;
	struct stats_snap *snap = stats_snap_new(n);
	if (!snap)
		return NULL;
	snap->c = s->st;
	snap->c.chunks_created_total =
		__atomic_load_n(&s->pool.chunks_created_total, __ATOMIC_RELAXED);
	snap->c.chunks_released_total =
		__atomic_load_n(&s->pool.chunks_released_total, __ATOMIC_RELAXED);
	http_counts(s->http, &snap->c.stats_conn_timeouts_total,
	            &snap->c.stats_conn_drops_total);
	snprintf(snap->version, sizeof(snap->version), "%d.%d.%d",
	         KVT_VERSION_MAJOR, KVT_VERSION_MINOR, KVT_VERSION_PATCH);
	/* "cpu" (memfd chunks), or "cuda/vmm" / "cuda/ipc": the sharing mode
	 * rides in the existing backend stat and label. */
	if (!s->bops || s->bops->host_visible)
		snprintf(snap->backend, sizeof(snap->backend), "%s",
		         s->bops ? s->bops->name : "cpu");
	else
		snprintf(snap->backend, sizeof(snap->backend), "%s/%s",
		         s->bops->name, s->bmode ? s->bmode : "?");

	uint64_t total = pool_bytes_total(&s->pool);
	uint64_t used = pool_chunks_used(&s->pool) * KVT_CHUNK_BYTES;
	snap->uptime_seconds = (now_ms() - s->started_ms) / 1000;
	snap->pool_bytes_total = total;
	snap->pool_bytes_used = used;
	snap->pool_bytes_free = total > used ? total - used : 0;
	snap->chunks_total = s->pool.chunk_capacity;
	snap->chunks_used = pool_chunks_used(&s->pool);
	snap->chunks_free = s->pool.chunk_capacity > pool_chunks_used(&s->pool)
	                            ? s->pool.chunk_capacity - pool_chunks_used(&s->pool)
	                            : 0;
	snap->pool_use_ratio = s->pool.chunk_capacity
	                               ? (double)pool_chunks_used(&s->pool) /
	                                         (double)s->pool.chunk_capacity
	                               : 0;
	snap->pressure_level = s->pressure;
	for (struct srv_conn *c = s->conns; c; c = c->next)
		snap->clients_connected += !c->closing;
	int cc = __atomic_load_n(&s->control_conns, __ATOMIC_RELAXED);
	snap->control_connections = cc > 0 ? (uint64_t)cc : 0;
	snap->control_unreleased = s->unreleased;
	snap->parked_requests = s->n_parked;

	n = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st)
			continue;
		struct kvt_tenant_stats ts;
		struct stats_tenant *t = &snap->tenant_list[n++];
		srv_tenant_stats(st, &ts);
		t->id = st->id;
		snprintf(t->name, sizeof(t->name), "%s", tenant_name(st->t));
		snprintf(t->policy, sizeof(t->policy), "%s",
		         tenant_policy_spec(st->t));
		t->pid = st->pid;
		t->pages_used = ts.pages_used;
		t->pages_free = ts.pages_free;
		t->chunks = ts.chunks;
		t->bytes = ts.chunks * KVT_CHUNK_BYTES;
		t->quota_bytes = ts.quota_bytes;
		t->daemon_bytes = ts.daemon_bytes;
		t->sequences = ts.sequences;
		t->syncs = ts.syncs;
		t->entries_kept = ts.entries_kept;
		t->entries_appended = ts.entries_appended;
		t->entries_evicted = ts.entries_evicted;
		t->priority = config_priority(&s->cfg, t->name);
		t->draining = (uint64_t)st->draining;
		t->compression_ratio = srv_ratio(ts.entries_appended,
		                                 ts.entries_evicted);
		t->pressure = tenant_pressure(st->t);
		t->budget = ts.budget;

		snap->kv_bytes_used +=
			ts.pages_used * tenant_geom(st->t)->page_bytes;
		snap->pages_used += ts.pages_used;
		snap->sequences += ts.sequences;
		snap->entries_kept += ts.entries_kept;
		snap->tenants++;
	}
	snap->n_tenant_list = n;
	return snap;
}

static void srv_publish(struct server *s)
{
	struct stats_snap *snap = srv_snapshot(s);
	if (snap)
		stats_pub_publish(&s->pub, snap);
}

static void srv_snap_async_cb(uv_async_t *a)
{
	srv_publish(a->data);
}

/*
 * Runs on the HTTP thread: asks the loop for a fresh snapshot and renders
 * it, or the last one when the loop does not answer in SRV_SNAP_WAIT_MS
 * (it is busy; the data is then at most one cron tick old).
 */
static int srv_http_render(void *ctx, enum stats_fmt fmt, char **out,
                           size_t *len)
{
	struct server *s = ctx;
	uint64_t want = stats_pub_gen(&s->pub) + 1;
	uv_async_send(&s->snap_async);
	return stats_pub_render(&s->pub, want, SRV_SNAP_WAIT_MS, fmt, out, len);
}

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
	if (chunks != pool_chunks_used(&s->pool)) {
		if (!violations)
			snprintf(detail, sizeof(detail),
			         "tenants hold %" PRIu64 " chunks, pool counts %" PRIu64,
			         chunks, pool_chunks_used(&s->pool));
		violations++;
	}
	if (pool_chunks_used(&s->pool) > s->pool.chunk_capacity) {
		if (!violations)
			snprintf(detail, sizeof(detail), "pool over capacity");
		violations++;
	}
	codec_row_u64(row, "ok", violations == 0);
	codec_row_u64(row, "violations", violations);
	codec_row_u64(row, "chunks_used", pool_chunks_used(&s->pool));
	codec_row_str(row, "detail", violations ? detail : "every page is "
	              "free or in exactly one list; free + used = total");
}


/* ---------------------------------------------------------- admin */

/* Settings read at use time need nothing here; these keep derived state. */
static void srv_config_changed(struct server *s)
{
	int lvl = log_parse_level(s->cfg.log_level);
	if (lvl >= 0)
		log_threshold = lvl;
	srv_allow_refresh(s);
	__atomic_store_n(&s->max_pending, srv_pending_max(s),
	                 __ATOMIC_RELAXED);
}

static void srv_config_row(const struct server *s,
                           const struct config_entry *e, struct ipc_row *row)
{
	char val[IPC_STR_MAX];
	config_get(&s->cfg, e, val, sizeof(val));
	codec_row_str(row, "key", e->name);
	codec_row_str(row, "value", val);
	codec_row_u64(row, "mutable", !!(e->flags & CONFIG_MUTABLE));
}

/*
 * kvtrimctl config set: the same table validates the value, then
 * config_validate the whole result; only then is anything applied.
 */
static int srv_config_set(struct server *s, const struct ipc_req *r,
                          nng_pipe pipe, struct ipc_rep *rep, char *why,
                          size_t wlen)
{
	const char *key = r->u.set.key, *val = r->u.set.value;
	int rv = srv_pipe_admin(s, pipe, "config_set", why, wlen);
	if (rv)
		return rv;
	const struct config_entry *e = config_find(key);
	if (!e) {
		snprintf(why, wlen, "unknown setting '%s' (kvtrimctl config get "
		         "lists them)", key);
		return KVT_EINVAL;
	}
	if (!(e->flags & CONFIG_MUTABLE)) {
		snprintf(why, wlen, "%s cannot change while kvtrimd runs: set it "
		         "in the config file and restart", key);
		return KVT_ENOTSUP;
	}
	if (!s->cfg.acl_from_socket && (!strncmp(key, "allow_", 6) ||
	                                !strncmp(key, "admin_", 6))) {
		snprintf(why, wlen, "%s can change only in the config file "
		         "(then SIGHUP); acl_from_socket = 1 allows it here", key);
		return KVT_EPERM;
	}
	struct config next = s->cfg;
	if ((rv = config_set(&next, key, val, why, wlen)) ||
	    (rv = config_validate(&next, why, wlen)))
		return rv;
	if (!srv_rows(rep, 1))
		return KVT_ENOMEM;
	s->cfg = next;
	srv_config_changed(s);
	s->st.config_sets_total++;
	srv_config_row(s, e, &rep->table.rows[0]);
	LOG(LOG_LVL_NOTICE, "config set %s = %s", key,
	    rep->table.rows[0].vals[1].v.s);
	return 0;
}

/*
 * Does tenant st answer to `who`?  All digits: the tenant id in decimal;
 * anything else: the name.  Names never start with a digit
 * (tenant_name_check), so the two never collide.
 */
static int srv_tenant_is(const struct srv_tenant *st, const char *who)
{
	size_t n = strspn(who, "0123456789");
	if (n && !who[n]) {
		errno = 0;
		unsigned long long id = strtoull(who, NULL, 10);
		return errno == 0 && id == st->id;
	}
	return !strcmp(tenant_name(st->t), who);
}

/* kvtrimctl drain: every tenant matching stops (or resumes) admitting new
 * sequences; its open sequences are untouched. */
static int srv_drain_tenant(struct server *s, const struct ipc_req *r,
                            nng_pipe pipe, struct ipc_rep *rep, char *why,
                            size_t wlen)
{
	const char *who = r->u.drain.tenant;
	uint32_t n = 0;
	int rv = srv_pipe_admin(s, pipe, "drain", why, wlen);
	if (rv)
		return rv;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		n += s->tenants[i] && srv_tenant_is(s->tenants[i], who);
	if (!n) {
		snprintf(why, wlen, "no tenant %s '%s' (kvtrimctl tenants "
		         "lists them)",
		         who[0] && !who[strspn(who, "0123456789")] ? "with id"
		                                                    : "named",
		         who);
		return KVT_ENOTENANT;
	}
	if (!srv_rows(rep, n))
		return KVT_ENOMEM;
	n = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st || !srv_tenant_is(st, who))
			continue;
		st->draining = !r->u.drain.undo;
		struct ipc_row *row = &rep->table.rows[n++];
		codec_row_u64(row, "id", st->id);
		codec_row_str(row, "name", tenant_name(st->t));
		codec_row_u64(row, "draining", (uint64_t)st->draining);
		LOG(LOG_LVL_NOTICE, "tenant %" PRIu32 " '%s' %s", st->id,
		    tenant_name(st->t), st->draining ?
		    "draining: no new sequences" : "admits new sequences again");
	}
	return 0;
}

static int srv_admin(struct server *s, const struct ipc_req *r, nng_pipe pipe,
                     struct ipc_rep *rep, char *why, size_t wlen)
{
	uint32_t n = 0;
	struct stats_snap *snap;
	switch (r->op) {
	case IPC_OP_STATS:
	case IPC_OP_TENANTS:
		if (!(snap = srv_snapshot(s)))
			return KVT_ENOMEM;
		n = r->op == IPC_OP_STATS ? 1 : snap->n_tenant_list;
		if (!srv_rows(rep, n)) {
			stats_snap_free(snap);
			return KVT_ENOMEM;
		}
		if (r->op == IPC_OP_STATS)
			stats_fill_row(snap, &rep->table.rows[0]);
		else
			for (uint32_t i = 0; i < n; i++)
				stats_fill_tenant_row(&snap->tenant_list[i],
				                      &rep->table.rows[i]);
		stats_snap_free(snap);
		return 0;
	case IPC_OP_CHECK:
		if (s->n_jobs)
			return SRV_IDLE_WAIT; /* a tenant is mid-sync */
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
	case IPC_OP_CONFIG:
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
			srv_config_row(s, e, &rep->table.rows[n++]);
		}
		return 0;
	case IPC_OP_DRAIN:
		return srv_drain_tenant(s, r, pipe, rep, why, wlen);
	case IPC_OP_CONFIG_SET:
		return srv_config_set(s, r, pipe, rep, why, wlen);
	default:
		return KVT_EUNKNOWNOP;
	}
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
 * Where a sync runs.  The loop serves everyone, so a tenant whose syncs
 * are expensive (their moving average above sync_offload_us, or this one
 * touching many lists) runs them on libuv's worker threads, one at a time
 * per tenant, several tenants at once (UV_THREADPOOL_SIZE, default 4);
 * cheap ones stay on the loop, where they cost no thread hand-off.
 */
static int srv_sync_offload(const struct server *s,
                            const struct srv_tenant *st, uint64_t lists)
{
	return !s->cfg.sync_offload_us || st->sync_us > s->cfg.sync_offload_us ||
	       lists > SRV_INLINE_LISTS;
}

/*
 * What follows a sync's apply, on the loop, wherever it ran: the counters,
 * the tenant's moving average, the chunk grants it queued (before the
 * reply), or the drop of a tenant whose device failed.
 */
static int srv_sync_finish(struct server *s, struct srv_tenant *st, int rv,
                           uint32_t items,
                           const struct kvt_tenant_stats *before,
                           const struct kvt_tenant_stats *after,
                           uint64_t apply_us, uint64_t scorer_ns, char *why,
                           size_t wlen)
{
	st->sync_us = (3 * st->sync_us + apply_us) / 4;
	if (rv && tenant_failed(st->t)) {
		LOG(LOG_LVL_ERR, "tenant %" PRIu32 ": %s", st->id, why);
		return srv_device_failed(s, st, rv, "sync");
	}
	if (rv)
		return rv;
	stats_observe(&s->st.apply_time, (double)apply_us / 1e6);
	stats_observe(&s->st.scorer_time, (double)scorer_ns / 1e9);
	s->st.syncs_total++;
	s->st.sync_items_total += items;
	s->st.entries_appended_total +=
		after->entries_appended - before->entries_appended;
	s->st.entries_evicted_total +=
		after->entries_evicted - before->entries_evicted;
	return srv_flush(s, st, why, wlen);
}

/*
 * Worker thread: the tenant is this job's alone (st->busy).  Workers run
 * at a lower priority than the loop (nice SRV_WORKER_NICE): where cores are
 * short, a heavy tenant's syncs take the cycles the loop leaves, not the
 * other way round.
 */
static void srv_job_run(uv_work_t *w)
{
	static _Thread_local int niced;
	if (!niced) {
		niced = 1;
		setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid),
		            SRV_WORKER_NICE);
	}
	struct srv_job *j = w->data;
	struct tenant *t = j->st->t;
	tenant_stats(t, &j->before);
	uint64_t t0 = now_us();
	j->rv = tenant_sync(t, j->req.u.sync.items, j->req.u.sync.n, j->why,
	                    sizeof(j->why));
	j->apply_us = now_us() - t0;
	j->scorer_ns = tenant_scorer_ns(t);
	tenant_stats(t, &j->after);
}

static void srv_job_done(uv_work_t *w, int status);

/* Hands the sync r (decoded in req, whose items the job takes) to a
 * worker; nonzero when it cannot (it then runs on the loop). */
static int srv_job_start(struct server *s, struct srv_tenant *st,
                         struct srv_req *rq, int parked, struct ipc_req *req)
{
	struct srv_job *j = calloc(1, sizeof(*j));
	if (!j)
		return -1;
	j->s = s;
	j->st = st;
	j->r = rq;
	j->parked = parked;
	j->req = *req;
	j->work.data = j;
	tenant_stats(st->t, &st->cached);
	if (uv_queue_work(&s->loop, &j->work, srv_job_run, srv_job_done)) {
		free(j);
		return -1;
	}
	req->u.sync.items = NULL; /* the job's now */
	req->u.sync.n = 0;
	st->busy = 1;
	s->n_jobs++;
	s->st.syncs_offloaded_total++;
	return 0;
}

static int srv_dispatch(struct server *s, struct srv_req *rq, int parked,
                        struct ipc_req *r, nng_pipe pipe, struct ipc_rep *rep,
                        char *why, size_t wlen)
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
	case IPC_OP_SEQ_OPEN:
		if (st->draining) {
			snprintf(why, wlen, "tenant '%s' is draining: no new "
			         "sequences (open ones continue)",
			         tenant_name(st->t));
			return KVT_ESHUTDOWN;
		}
		if ((rv = tenant_seq_open(st->t, &rep->u.seq)))
			return srv_device_failed(s, st, rv, "seq_open");
		s->st.seqs_opened_total++;
		return srv_flush(s, st, why, wlen);
	case IPC_OP_SEQ_CLOSE:
		if ((rv = tenant_seq_close(st->t, r->u.seq)))
			return srv_device_failed(s, st, rv, "seq_close");
		s->st.seqs_closed_total++;
		return srv_flush(s, st, why, wlen);
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
		uint64_t t0 = now_us();
		rv = tenant_sync(st->t, r->u.sync.items, r->u.sync.n, why, wlen);
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

/* ---------------------------------------------------------- requests */

/* SRV_HELD: the request belongs to a sync job or waits for its tenant;
 * whoever holds it replies later. */
enum srv_verdict { SRV_REPLY, SRV_PARK, SRV_HELD };

static enum srv_verdict srv_conclude(struct server *s, struct srv_req *r,
                                     enum ipc_op op, int rv,
                                     struct ipc_rep *rep, char *why,
                                     size_t wlen, int parked);

/*
 * Handles one request.  SRV_PARK: it needs pool pages that may come free,
 * r->msg is kept untouched and the request is retried later (parked says
 * this is such a retry).  SRV_REPLY: r->msg now holds the reply, or is NULL
 * when none could be built (the context is then simply re-armed).
 * Every request is validated from scratch on each try, so a tenant that
 * vanished meanwhile gets its typed error, not a stale decision.
 */
static enum srv_verdict srv_handle(struct server *s, struct srv_req *r,
                                   int parked)
{
	struct ipc_req req;
	struct ipc_rep rep;
	char why[KVT_ERRTEXT_MAX] = "";
	nng_msg *msg = r->msg;
	const uint8_t *body = nng_msg_body(msg);
	size_t len = nng_msg_len(msg);
	enum ipc_op op;
	int rv;

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
		rv = srv_dispatch(s, r, parked, &req, nng_msg_get_pipe(msg), &rep,
		                  why, sizeof(why));
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
static enum srv_verdict srv_conclude(struct server *s, struct srv_req *r,
                                     enum ipc_op op, int rv,
                                     struct ipc_rep *rep, char *why,
                                     size_t wlen, int parked)
{
	nng_msg *msg = r->msg;
	if (rv == KVT_EPOOLFULL && !s->draining &&
	    (op == IPC_OP_SYNC || op == IPC_OP_SEQ_OPEN)) {
		uint64_t now = now_ms();
		if (!parked && s->cfg.pressure_deadline_ms &&
		    s->n_parked < s->n_reqs / 2) {
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
		stats_observe(&s->st.sync_latency,
		              (double)(now_us() - r->recv_us) / 1e6);
	nng_msg_clear(msg);
	if (erv || nng_msg_append(msg, out, olen)) {
		free(out);
		nng_msg_free(msg);
		r->msg = NULL;
		return SRV_REPLY;
	}
	free(out);
	return SRV_REPLY;
}

/* Arms r's context for the next request (no deadline: a connection may
 * stay quiet as long as it likes; idleness is the cron's business). */
static void srv_recv(struct srv_req *r)
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
static void srv_send(struct server *s, struct srv_req *r)
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
			              &s->st.ctl_send_timeout_closed_total,
			              "it did not take a reply within "
			              "send_timeout_ms");
		srv_req_done(s, r);
	}
}

/*
 * A new request r: counted against its connection; one beyond
 * max_inflight_per_conn in flight (the client library never has more than
 * 17) is dropped unanswered.  0: handle r; -1: r was dropped and its
 * context re-armed.
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
		s->st.ctl_requests_dropped_total++;
		nng_msg_free(r->msg);
		r->msg = NULL;
		srv_recv(r);
		return -1;
	}
	p->inflight++;
	p->last_ms = now_ms();
	return 0;
}

static void srv_park(struct server *s, struct srv_req *r)
{
	r->next = NULL;
	if (s->parked_tail)
		s->parked_tail->next = r;
	else
		s->parked_head = r;
	s->parked_tail = r;
	s->n_parked++;
}

static void srv_proceed(struct server *s, struct srv_req *r,
                        enum srv_verdict v)
{
	if (v == SRV_PARK)
		srv_park(s, r);
	else if (v == SRV_REPLY)
		srv_send(s, r);
}

/* Retries every parked request once, oldest first. */
static void srv_retry_parked(struct server *s)
{
	struct srv_req *list = s->parked_head;
	s->parked_head = s->parked_tail = NULL;
	s->n_parked = 0;
	while (list) {
		struct srv_req *r = list;
		list = r->next;
		srv_proceed(s, r, srv_handle(s, r, !r->dev_wait));
	}
}

static void srv_reload_one(struct server *s, struct srv_tenant *st);

/*
 * A sync job ended (loop thread): its tenant is the loop's again; the
 * reply goes out (or the request parks under pressure), then the requests
 * that waited for the tenant are handled, in order.  A tenant released
 * meanwhile is freed now and its requests get ENOTENANT.
 */
static void srv_job_done(uv_work_t *w, int status)
{
	struct srv_job *j = w->data;
	struct server *s = j->s;
	struct srv_tenant *st = j->st;
	struct srv_req *r = j->r, *waiting = st->wait_head;
	int rv = j->rv;
	uint32_t items = j->req.u.sync.n;
	st->wait_head = st->wait_tail = NULL;
	st->busy = 0;
	st->cached = j->after;
	if (st->conn && !st->conn->closing)
		uv_poll_start(&st->conn->poll, UV_READABLE | UV_DISCONNECT,
		              srv_conn_cb);
	s->n_jobs--;
	codec_req_free(&j->req);
	if (st->doomed) {
		snprintf(j->why, sizeof(j->why), "tenant %" PRIu32 " was "
		         "released while this sync ran (%s)", st->id,
		         st->doomed_why);
		rv = KVT_ENOTENANT;
		srv_tenant_free(st, st->doomed_why);
	} else {
		rv = srv_sync_finish(s, st, rv, items, &j->before, &j->after,
		                     j->apply_us, j->scorer_ns, j->why,
		                     sizeof(j->why));
		/* (st is gone if that dropped the tenant.) */
	}
	struct ipc_rep rep;
	memset(&rep, 0, sizeof(rep));
	rep.version = IPC_PROTO_VERSION;
	if (!rv)
		tenant_sync_reply(st->t, &rep);
	enum srv_verdict v = srv_conclude(s, r, IPC_OP_SYNC, rv, &rep, j->why,
	                                  sizeof(j->why), j->parked);
	free(j);
	if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
		/* nng is closed: nothing can be sent any more. */
		nng_msg_free(r->msg);
		r->msg = NULL;
		for (struct srv_req *q = waiting; q; q = q->next) {
			nng_msg_free(q->msg);
			q->msg = NULL;
		}
		return;
	}
	srv_proceed(s, r, v);
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] && s->tenants[i]->reload_pending &&
		    !s->tenants[i]->busy)
			srv_reload_one(s, s->tenants[i]);
	while (waiting) {
		struct srv_req *q = waiting;
		waiting = q->next;
		srv_proceed(s, q, srv_handle(s, q, q->held_parked));
	}
	if (s->n_parked)
		srv_retry_parked(s); /* check waits; pages freed */
}

static void srv_wake_cb(uv_async_t *a)
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

	uint64_t refused = __atomic_exchange_n(&s->ctl_refused, 0,
	                                       __ATOMIC_RELAXED);
	if (refused) {
		s->st.ctl_refused_total += refused;
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
	srv_done(s, done);
	/* Waiting requests first: pages freed by the events above go to
	 * them before newcomers. */
	if (s->n_parked)
		srv_retry_parked(s);
	int handled = list != NULL;
	while (list) {
		struct srv_req *r = list;
		list = r->next;
		if (srv_admit(s, r))
			continue;
		srv_proceed(s, r, srv_handle(s, r, 0));
	}
	/* Closes, byes and evicting syncs just handled may have freed what
	 * the parked ones wait for: do not leave that to the next tick. */
	if (handled && s->n_parked)
		srv_retry_parked(s);
}

/* ---------------------------------------------------------- pressure */

/*
 * Pool use above high_watermark becomes a pool-wide level in (0, 1],
 * rising linearly to 1 at a full pool.  Each tenant gets that level scaled
 * by (lowest priority present / its priority): the least important tenants
 * are tightened fully, more important ones proportionally less.
 */
static void srv_pressure(struct server *s)
{
	double use = s->pool.chunk_capacity
	                     ? (double)pool_chunks_used(&s->pool) /
	                               (double)s->pool.chunk_capacity
	                     : 0;
	double hw = s->cfg.high_watermark;
	double level = 0;
	if (use > hw)
		level = hw < 1 ? (use - hw) / (1 - hw) : 1;
	if (level > 1)
		level = 1;
	s->pressure = (float)level;

	uint32_t min_prio = UINT32_MAX;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i]) {
			uint32_t p = config_priority(
				&s->cfg, tenant_name(s->tenants[i]->t));
			if (p < min_prio)
				min_prio = p;
		}
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st || st->busy)
			continue; /* mid-sync: next tick */
		float p = (float)(level * min_prio /
		                  config_priority(&s->cfg, tenant_name(st->t)));
		float cur = tenant_pressure(st->t);
		/* Hysteresis: policies re-plan on every change, so small
		 * wobbles of the pool are not passed on. */
		if (p == cur || (p > 0 && fabsf(p - cur) < 0.02f))
			continue;
		if (p > cur)
			s->st.pressure_tightenings_total++;
		tenant_set_pressure(st->t, p);
	}
}

/* ---------------------------------------------------------- lifecycle */

/* "41.2MiB" */
static void srv_fmt_bytes(char *buf, size_t len, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.1fGiB", (double)b / (1ull << 30));
	else
		snprintf(buf, len, "%.1fMiB", (double)b / (1ull << 20));
}

static void srv_status(struct server *s)
{
	char line[200], used[32], total[32];
	uint32_t tenants = 0;
	uint64_t seqs = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st)
			continue;
		struct kvt_tenant_stats ts;
		srv_tenant_stats(st, &ts);
		tenants++;
		seqs += ts.sequences;
	}
	uint64_t cap = pool_bytes_total(&s->pool);
	uint64_t u = pool_chunks_used(&s->pool) * KVT_CHUNK_BYTES;
	srv_fmt_bytes(used, sizeof(used), u);
	srv_fmt_bytes(total, sizeof(total), cap);
	snprintf(line, sizeof(line),
	         "tenants=%" PRIu32 " sequences=%" PRIu64 " pool=%s/%s "
	         "(%.0f%%) pressure=%.2f parked=%" PRIu32,
	         tenants, seqs, used, total, cap ? 100.0 * (double)u / (double)cap
	                                         : 0.0,
	         (double)s->pressure, s->n_parked);
	notify_status(line);
}

static void srv_cron_cb(uv_timer_t *t)
{
	struct server *s = t->data;
	uint64_t now = now_ms(), held;
	for (struct srv_conn *c = s->conns, *n; c; c = n) {
		n = c->next;
		/* A refused peer gets just long enough to hear why. */
		uint64_t limit = c->denied && s->cfg.hello_timeout_ms >
		                 SRV_DENIED_MS ? SRV_DENIED_MS
		                               : s->cfg.hello_timeout_ms;
		if (!c->st && now - c->born_ms > limit) {
			if (log_rate_due(&s->hello_log, now, SRV_LOG_EVERY_MS,
			                 &held))
				LOG(LOG_LVL_INFO, "closing handle channel of pid %"
				    PRIu32 ": no hello (%" PRIu64 " more such "
				    "closes not logged)", c->pid, held);
			srv_conn_close(c);
		}
	}
	/* Control connections without a tenant that sent nothing for
	 * hello_timeout_ms (kvtrimctl's connections are busy or short). */
	for (uint32_t i = 0; i < s->pipes_cap; i++) {
		struct srv_pipe *p = &s->pipes[i];
		if (p->id && !p->bound && !p->inflight && !p->kicked &&
		    now - p->last_ms > s->cfg.hello_timeout_ms)
			srv_pipe_kick(s, p->id, &s->st.ctl_idle_closed_total,
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
	srv_accept_resume(s, now);
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
	srv_pressure(s);
	if (s->n_parked)
		srv_retry_parked(s); /* deadlines, and pages freed meanwhile */
	srv_publish(s);
	if (now - s->status_ms >= SRV_STATUS_MS) {
		s->status_ms = now;
		srv_status(s);
	}
}

static void srv_watchdog_cb(uv_timer_t *t)
{
	notify_watchdog();
}

/* SIGHUP: the file (and the command line over it) again; only mutable
 * settings change, a bad file changes nothing, tenants stay. */
/* SIGHUP also re-reads every tenant's scorer weights; a tenant whose new
 * weights do not load keeps its old ones, and nobody is dropped. */
static void srv_reload_one(struct server *s, struct srv_tenant *st)
{
	char why[KVT_ERRTEXT_MAX];
	st->reload_pending = 0;
	int rv = tenant_reload_policy(st->t, why, sizeof(why));
	if (rv > 0) {
		s->st.weights_reloads_total++;
		LOG(LOG_LVL_NOTICE, "SIGHUP: tenant %" PRIu32 " '%s': "
		    "weights re-read (%s)", st->id, tenant_name(st->t),
		    tenant_policy_spec(st->t));
	} else if (rv < 0) {
		s->st.weights_reload_failures_total++;
		LOG(LOG_LVL_ERR, "SIGHUP: tenant %" PRIu32 " '%s' keeps "
		    "its old weights: %s", st->id, tenant_name(st->t), why);
	}
}

/* A tenant with a sync on a worker re-reads its weights when that ends. */
static void srv_reload_weights(struct server *s)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (st && st->busy)
			st->reload_pending = 1;
		else if (st)
			srv_reload_one(s, st);
	}
}

static void srv_reload(struct server *s)
{
	struct config next;
	char err[512], applied[512], ignored[512];
	notify_reloading();
	int rv = config_build(&next, &s->args, err, sizeof(err));
	if (rv) {
		s->st.config_reload_failures_total++;
		LOG(LOG_LVL_ERR, "SIGHUP: new config refused, the running one is "
		    "kept: %s", err);
	} else {
		if (!next.runtime_dir[0])
			rundir_resolve(NULL, next.runtime_dir,
			               sizeof(next.runtime_dir));
		int n = config_apply_mutable(&s->cfg, &next, applied,
		                             sizeof(applied), ignored,
		                             sizeof(ignored));
		srv_config_changed(s);
		s->st.config_reloads_total++;
		LOG(LOG_LVL_NOTICE, "SIGHUP: config reloaded%s%s: %s",
		    s->args.file ? " from " : " (no --config file)",
		    s->args.file ? s->args.file : "",
		    n ? applied : "nothing changed");
		if (ignored[0])
			LOG(LOG_LVL_WARNING, "SIGHUP: %s changed but cannot "
			    "change while kvtrimd runs; restart to apply",
			    ignored);
	}
	srv_reload_weights(s);
	notify_ready();
}

static void srv_hup_cb(uv_signal_t *h, int signum)
{
	srv_reload(h->data);
}

static void srv_stop_loop(struct server *s)
{
	/* The HTTP thread first: it may still poke snap_async. */
	if (s->pub_ready)
		stats_pub_close(&s->pub);
	http_stop(s->http);
	s->http = NULL;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i])
			srv_reclaim(s, s->tenants[i], "daemon shutting down");
	while (s->conns)
		srv_conn_close(s->conns);
	if (s->hpoll_ready)
		uv_close((uv_handle_t *)&s->hpoll, NULL);
	uv_close((uv_handle_t *)&s->wake, NULL);
	uv_close((uv_handle_t *)&s->snap_async, NULL);
	uv_close((uv_handle_t *)&s->sigterm, NULL);
	uv_close((uv_handle_t *)&s->sigint, NULL);
	uv_close((uv_handle_t *)&s->sighup, NULL);
	uv_close((uv_handle_t *)&s->cron, NULL);
	uv_close((uv_handle_t *)&s->drain, NULL);
	uv_close((uv_handle_t *)&s->watchdog, NULL);
}

static int srv_busy(struct server *s)
{
	int busy = 0;
	pthread_mutex_lock(&s->qlock);
	busy = s->ready_head != NULL;
	pthread_mutex_unlock(&s->qlock);
	for (uint32_t i = 0; i < s->n_reqs && !busy; i++)
		busy = s->reqs[i].sending;
	return busy || s->n_parked || s->n_jobs;
}

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
static void srv_close_nng(struct server *s)
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
	s->n_parked = 0;
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
	notify_stopping();
	s->draining = 1;
	s->drain_started_ms = now_ms();
	uv_poll_stop(&s->hpoll);
	nng_listener_close(s->listener);
	/* Parked requests now get KVT_ESHUTDOWN instead of waiting on. */
	if (s->n_parked)
		srv_retry_parked(s);
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


/* Hands a socket file to group kvtrim when that group exists, so members
 * (engines running as other users) can connect; mode stays 0660. */
static void srv_socket_group(const char *path)
{
	struct group g, *r = NULL;
	char buf[4096];
	if (getgrnam_r("kvtrim", &g, buf, sizeof(buf), &r) || !r)
		return;
	if (chown(path, (uid_t)-1, r->gr_gid))
		LOG(LOG_LVL_INFO, "cannot give %s to group kvtrim: %s", path,
		    strerror(errno));
}

/*
 * Takes the runtime dir's lock before anything in it is touched: a second
 * kvtrimd on a live dir must neither replace the first one's sockets nor,
 * when it exits, remove them.
 */
static int srv_lock_rundir(struct server *s, char *err, size_t errlen)
{
	long holder = 0;
	int rv = rundir_lock(s->cfg.runtime_dir, &s->lock_fd, &holder);
	if (rv == KVT_EBUSY && holder)
		snprintf(err, errlen, "runtime dir %s is in use by kvtrimd pid "
		         "%ld (%s/%s)", s->cfg.runtime_dir, holder,
		         s->cfg.runtime_dir, RUNDIR_LOCK_NAME);
	else if (rv == KVT_EBUSY)
		snprintf(err, errlen, "runtime dir %s is in use by another "
		         "kvtrimd (%s/%s is locked)", s->cfg.runtime_dir,
		         s->cfg.runtime_dir, RUNDIR_LOCK_NAME);
	else if (rv)
		snprintf(err, errlen, "cannot lock runtime dir %s (%s/%s): %s",
		         s->cfg.runtime_dir, s->cfg.runtime_dir,
		         RUNDIR_LOCK_NAME, strerror(errno));
	return rv;
}

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
 * socket's stats_max_conns, 2 * max_pending_conns (ctl.ipc and fd.sock)
 * and SRV_FD_SPARE.  When the open-file limit is lower, max_pending_conns
 * is lowered (pending_cap) so that connections without a tenant run out
 * first, never the registered tenants, and one warning says so.
 */
static void srv_fd_budget(struct server *s)
{
	const struct config *c = &s->cfg;
	uint64_t lim = srv_raise_nofile();
	uint32_t listeners = 3 + (c->stats_tcp_port ? 1 : 0);
	uint64_t rest = s->pool.chunk_capacity +
	                (uint64_t)SRV_FD_PER_TENANT * c->max_tenants +
	                listeners + c->stats_max_conns + SRV_FD_SPARE;
	uint64_t need = rest + 2ull * c->max_pending_conns;
	uint64_t cap = lim > rest ? (lim - rest) / 2 : 0;

	s->fd_limit = lim;
	if (cap < SRV_PENDING_FLOOR)
		cap = SRV_PENDING_FLOOR;
	s->pending_cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
	if (lim >= need)
		return;
	LOG(LOG_LVL_WARNING, "open-file limit %" PRIu64 " is below the %"
	    PRIu64 " this configuration needs (%" PRIu64 " pool chunks + %d x "
	    "%" PRIu32 " max_tenants + %" PRIu32 " listeners + %" PRIu32
	    " stats_max_conns + 2 x %" PRIu32 " max_pending_conns + %d "
	    "spare): max_pending_conns is lowered to %" PRIu32 "%s; raise "
	    "LimitNOFILE= / ulimit -n", lim, need, s->pool.chunk_capacity,
	    SRV_FD_PER_TENANT, c->max_tenants, listeners, c->stats_max_conns,
	    c->max_pending_conns, SRV_FD_SPARE, s->pending_cap,
	    lim < rest + 2ull * SRV_PENDING_FLOOR
	            ? ", and even registered tenants may run out of fds "
	              "(or lower pool_size, max_tenants, stats_max_conns)"
	            : "");
}

int server_new(const struct config *cfg, const struct config_args *args,
               struct server **out, char *err, size_t errlen)
{
	struct server *s = calloc(1, sizeof(*s));
	int rv;
	mode_t old_umask;
	char url[PATH_MAX + 8];
	if (!s)
		return KVT_ENOMEM;
	s->cfg = *cfg;
	if (args)
		s->args = *args;
	s->hsock = -1;
	s->lock_fd = -1;
	s->next_tenant_id = 1;
	s->started_ms = now_ms();
	pthread_mutex_init(&s->qlock, NULL);
	pthread_cond_init(&s->close_cv, NULL);
	pthread_mutex_init(&s->acl_lock, NULL);
	stats_pub_init(&s->pub);
	s->pub_ready = 1;
	srv_allow_refresh(s);
	{
		char note[512];
		/* "auto": cuda where the library loads and sees a device, else
		 * cpu with the reason in note; "cuda" without them fails. */
		if ((rv = backend_open(cfg->backend, &s->bops, note,
		                       sizeof(note)))) {
			snprintf(err, errlen, "%s", note);
			goto fail;
		}
		if (note[0])
			LOG(LOG_LVL_NOTICE, "%s", note);
		if ((rv = s->bops->ctx_new(0, &s->bctx, &s->bmode, note,
		                           sizeof(note)))) {
			snprintf(err, errlen, "%s backend: %s", s->bops->name,
			         note[0] ? note : kvt_strerror(rv));
			s->bctx = NULL;
			goto fail;
		}
	}
	if ((rv = pool_init(&s->pool, cfg->pool_size))) {
		snprintf(err, errlen, "pool_size %" PRIu64 " holds no 2 MiB chunk",
		         cfg->pool_size);
		goto fail;
	}
	pool_set_backend(&s->pool, s->bops, s->bctx);
	s->tenants = calloc(cfg->max_tenants, sizeof(*s->tenants));
	s->reqs = calloc(cfg->contexts, sizeof(*s->reqs));
	if (!s->tenants || !s->reqs) {
		rv = KVT_ENOMEM;
		goto fail;
	}
	if (uv_loop_init(&s->loop)) {
		rv = KVT_ESYS;
		goto fail;
	}
	s->loop_ready = 1;
	uv_async_init(&s->loop, &s->wake, srv_wake_cb);
	s->wake.data = s;
	uv_async_init(&s->loop, &s->snap_async, srv_snap_async_cb);
	s->snap_async.data = s;
	uv_signal_init(&s->loop, &s->sigterm);
	uv_signal_init(&s->loop, &s->sigint);
	uv_signal_init(&s->loop, &s->sighup);
	s->sigterm.data = s->sigint.data = s->sighup.data = s;
	/* Catch signals before any socket exists: a supervisor (or a test)
	 * that sees the sockets may signal at once, and the default action
	 * would kill the daemon instead of draining it.  The callbacks run
	 * once server_run starts the loop. */
	signal(SIGPIPE, SIG_IGN);
	uv_signal_start(&s->sigterm, srv_signal_cb, SIGTERM);
	uv_signal_start(&s->sigint, srv_signal_cb, SIGINT);
	uv_signal_start(&s->sighup, srv_hup_cb, SIGHUP);
	uv_timer_init(&s->loop, &s->cron);
	uv_timer_init(&s->loop, &s->drain);
	uv_timer_init(&s->loop, &s->watchdog);
	s->cron.data = s->drain.data = s->watchdog.data = s;
	if (mkdir_p(cfg->runtime_dir)) {
		snprintf(err, errlen, "cannot create runtime dir %s: %s",
		         cfg->runtime_dir, strerror(errno));
		rv = KVT_ESYS;
		goto fail;
	}
	/* Nothing in the dir is touched (stale sockets removed) before the
	 * lock is ours. */
	if ((rv = srv_lock_rundir(s, err, errlen)))
		goto fail;
	srv_fd_budget(s);
	snprintf(s->ctl_path, sizeof(s->ctl_path), "%s/ctl.ipc", cfg->runtime_dir);
	snprintf(s->fd_path, sizeof(s->fd_path), "%s/fd.sock", cfg->runtime_dir);
	snprintf(s->stats_path, sizeof(s->stats_path), "%s/stats.sock",
	         cfg->runtime_dir);

	/* Socket files are born 0660: the umask covers the moment between
	 * bind and the chmod the listeners do afterwards. */
	old_umask = umask(0117);
	rv = handle_listen(s->fd_path, &s->hsock);
	umask(old_umask);
	if (rv) {
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
	s->max_pending = srv_pending_max(s);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, srv_pipe_cb, s);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, srv_pipe_cb, s);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, srv_pipe_cb, s);
	/* A stale socket file of a dead daemon would make listen fail. */
	unlink(s->ctl_path);
	snprintf(url, sizeof(url), "ipc://%s", s->ctl_path);
	old_umask = umask(0117);
	if ((rv = nng_listener_create(&s->listener, s->sock, url)) ||
	    (rv = nng_listener_set_int(s->listener, NNG_OPT_IPC_PERMISSIONS,
	                               0660)) ||
	    (rv = nng_listener_start(s->listener, 0))) {
		umask(old_umask);
		snprintf(err, errlen, "cannot listen on %s: %s", url,
		         nng_strerror(rv));
		rv = KVT_ESYS;
		goto fail;
	}
	umask(old_umask);
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
	uv_poll_init(&s->loop, &s->hpoll, s->hsock);
	s->hpoll.data = s;
	s->hpoll_ready = 1;
	/* The stats socket last: the HTTP thread starts serving at once and
	 * must find a snapshot to render. */
	srv_publish(s);
	if ((rv = http_start(s->stats_path,
	                     &(struct http_opts){
	                             .tcp_port = cfg->stats_tcp_port,
	                             .max_conns = cfg->stats_max_conns,
	                             .header_timeout_ms =
	                                     cfg->stats_header_timeout_ms},
	                     srv_http_render, s, &s->http, err, errlen)))
		goto fail;
	srv_socket_group(s->fd_path);
	srv_socket_group(s->ctl_path);
	srv_socket_group(s->stats_path);
	*out = s;
	return 0;
fail:
	server_free(s);
	return rv;
}

int server_run(struct server *s)
{
	uv_poll_start(&s->hpoll, UV_READABLE, srv_accept_cb);
	uv_timer_start(&s->cron, srv_cron_cb, SRV_CRON_MS, SRV_CRON_MS);
	s->watchdog_ms = notify_watchdog_period_ms();
	if (s->watchdog_ms) {
		notify_watchdog();
		uv_timer_start(&s->watchdog, srv_watchdog_cb, s->watchdog_ms,
		               s->watchdog_ms);
	}
	for (uint32_t i = 0; i < s->n_reqs; i++)
		srv_recv(&s->reqs[i]);
	LOG(LOG_LVL_NOTICE,
	    "kvtrimd ready: runtime dir %s, backend %s (%s), pool %" PRIu64
	    " bytes (%" PRIu64 " chunks)%s", s->cfg.runtime_dir,
	    s->bops->name, s->bmode, pool_bytes_total(&s->pool),
	    s->pool.chunk_capacity,
	    s->watchdog_ms ? ", systemd watchdog on" : "");
	srv_status(s);
	s->status_ms = now_ms();
	notify_ready();
	uv_run(&s->loop, UV_RUN_DEFAULT);
	LOG(LOG_LVL_NOTICE, "kvtrimd stopped");
	return 0;
}

void server_free(struct server *s)
{
	if (!s)
		return;
	if (s->pub_ready)
		stats_pub_close(&s->pub);
	http_stop(s->http);
	s->http = NULL;
	srv_close_nng(s);
	for (uint32_t i = 0; i < s->n_reqs && !s->nng_wedged; i++)
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
	/* Socket files are removed only by the lock's holder: they are its
	 * own (a daemon refused the lock never created any). */
	if (s->hsock >= 0) {
		close(s->hsock);
		if (s->lock_fd >= 0)
			unlink(s->fd_path);
	}
	if (s->ctl_path[0] && s->lock_fd >= 0)
		unlink(s->ctl_path);
	/* Every tenant and chunk is gone (srv_stop_loop reclaimed them). */
	if (s->bctx)
		s->bops->ctx_free(s->bctx);
	free(s->tenants);
	free(s->pipes);
	if (s->pub_ready)
		stats_pub_destroy(&s->pub);
	pthread_mutex_destroy(&s->acl_lock);
	rundir_unlock(s->cfg.runtime_dir, s->lock_fd);
	if (s->nng_wedged)
		return; /* nng's threads may still touch reqs, qlock, s */
	free(s->reqs);
	pthread_mutex_destroy(&s->qlock);
	pthread_cond_destroy(&s->close_cv);
	free(s);
}
