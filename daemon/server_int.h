/*
 * server_int.h — kvtrimd's server, private to daemon/: the state all its
 * parts share and the functions one part calls in another.  main.c sees
 * only server.h; everything not declared here is static to its file.
 *
 * The server is one module (prefix srv_), one file per concern:
 *
 *   server.c    lifecycle: server_new / run / free, the cron tick, the
 *               systemd watchdog, SIGHUP reload, the SIGTERM / SIGINT
 *               drain and shutdown, the runtime dir and its lock
 *   ctl.c       the control socket ctl.ipc, served on the loop: nng's SP
 *               req/rep wire (its IPC framing), accept and its back-off,
 *               reading under flow control, requests and their pool, the
 *               low class, replies, closing
 *   pipes.c     the control connections: their table, the refusal at
 *               accept, the limits (in flight, unsent replies, send
 *               timeout, idle without a tenant) and closing them
 *   refuse.c    control connections refused at accept, told why (an
 *               error reply to their first request) before they close
 *   fdchan.c    the handle channel fd.sock: accept and its back-off, the
 *               pending connections and their eviction, the fd budget,
 *               packets from clients, events to them
 *   auth.c      who may do what: the allow and admin lists, peer
 *               credentials, a request's tenant token
 *   lease.c     a tenant's lease: hello (registration), lookup, release
 *   dispatch.c  one request, from its decode to its encoded reply
 *   jobs.c      syncs offloaded to libuv's worker threads (srv_job_*)
 *   pressure.c  pool pressure, and the requests parked for pages
 *   admin.c     the admin ops (stats, tenants, check, policies, config,
 *               drain, config set)
 *   snapshot.c  stats snapshots for kvtrimctl and HTTP; systemd STATUS=
 *
 * Request path: the loop reads a connection (ctl.c), takes a request from
 * the pool for each whole frame, admits it against its connection,
 * decodes, validates and applies it (dispatch.c), sends any chunk grants
 * over the client's handle channel (lease.c), encodes the reply and queues
 * it on the connection; the request goes back to the pool at once (flow
 * control: ctl.c).
 *
 * Threads: libuv's loop thread owns every field below unless its comment
 * says otherwise: acl_lock guards the access lists other threads read,
 * and the fields marked atomic are accessed with __atomic builtins.  A
 * tenant with a sync on a worker thread is that worker's alone until the sync ends (struct srv_tenant, busy).  Every
 * function declared here runs on the loop thread unless its comment says
 * otherwise.
 */
#ifndef KVT_SERVER_INT_H
#define KVT_SERVER_INT_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/types.h>
#include <time.h>
#include <uv.h>

#include "backend.h"
#include "codec.h"
#include "config.h"
#include "kvtrim.h"
#include "log.h"
#include "now.h"
#include "pool.h"
#include "server.h"
#include "spwire.h"
#include "stats.h"
#include "tenant.h"

#define SRV_ALLOW_MAX 64     /* ids per allow list */

struct server;

/* One request being served (ctl.c: the pool of cfg.contexts). */
struct srv_req {
	struct server *srv;
	uint8_t *msg;        /* request body, then its encoded reply (NULL:
	                        none); malloc'd, owned by the loop */
	size_t len;
	uint8_t bt[4 * SPW_BT_MAX]; /* its SP backtrace (spwire.h), sent back
	                               before the reply */
	uint32_t btlen;
	int low;             /* read from a connection without a tenant */
	struct srv_req *next; /* the free list, the low class, the parked
	                         list, or its tenant's wait queue */
	uint64_t recv_us;    /* when its frame was read */
	uint64_t park_deadline_ms; /* parked: refuse after this */
	int dev_wait; /* parked until a tenant's GPU writes are done */
	uint32_t pipe_id; /* the request's control connection, 0 once done */
	int held;         /* it waited for its tenant: a retry, not new */
	int held_parked;  /* ... and was a backpressure retry then */
	uint32_t unread;  /* refused unread (ctl.c): the bytes of its body,
	                     never kept (msg NULL); srv_handle answers
	                     KVT_ETOOBIG */
};

/* srv_dispatch: the sync waits for the engine's GPU writes
 * (tenant_sync_ready); park it, retry at the wakeup.  Never on the wire. */
#define SRV_DEVICE_WAIT 1
/* srv_dispatch: the sync now runs on a worker thread (struct srv_job in
 * jobs.c), which owns the request until it ends; no reply yet. */
#define SRV_ASYNC 2
/* srv_dispatch: the request's tenant has a sync on a worker; the request
 * waits in the tenant's queue and is handled again when that ends. */
#define SRV_TENANT_BUSY 3
/* srv_dispatch: an admin request that must see no sync running (check);
 * parked like SRV_DEVICE_WAIT, without its counter. */
#define SRV_IDLE_WAIT 4

struct srv_tenant;
struct srv_refusal;

/* One handle-channel connection on fd.sock (fdchan.c). */
struct srv_conn {
	struct server *srv;
	int fd;
	uv_poll_t poll;
	uint64_t cookie;
	uint32_t pid, uid, gid;
	int denied;      /* peer not in the allow lists: its hello is refused */
	char refused[160]; /* "": admitted; else refused at accept (a limit
	                      of fdchan.c): its hello gets KVT_EBUSY, this */
	uint64_t barred_ms; /* >0: its process is barred (srv_barred) for
	                       this long still: its hello is refused */
	uint64_t born_ms;
	struct srv_tenant *st; /* bound tenant, NULL until hello */
	struct srv_conn *prev, *next;
	int closing;
	char close_why[128]; /* why the daemon closes it ("": the peer did) */
};

/* A listener's accept back-off (fdchan.c, srv_accept_failed): after a
 * failed accept it is not polled for pause_ms, 100 doubling to 1000 while
 * accepts keep failing; 0 again after one succeeds. */
struct srv_backoff {
	int paused;
	uint64_t resume_ms;
	uint32_t pause_ms;
	struct log_rate log;
};

/* A process the daemon disconnected for breaking the handle protocol
 * (fdchan.c): its registrations are refused until until_ms, for 1 s
 * doubling to 60 s while it goes on (reset after 10 quiet minutes). */
#define SRV_BARRED_MAX 64
struct srv_barred {
	uint32_t pid;       /* 0: free */
	uint32_t backoff_ms;
	uint64_t until_ms, last_ms;
};

/* A registered tenant and its lease (lease.c). */
struct srv_tenant {
	struct tenant *t;
	uint32_t id;
	uint64_t token;
	uint32_t pipe_id;
	uint32_t pid;
	struct pool_account *acct[POOL_SHARES]; /* its uid's and process's
	                                           shares of the pool */
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

/* An access list, parsed (auth.c). */
struct srv_acl {
	int configured; /* either list non-empty */
	uint32_t uid[SRV_ALLOW_MAX], n_uid;
	uint32_t gid[SRV_ALLOW_MAX], n_gid;
};

/*
 * One open control connection on ctl.ipc, loop thread only.  inflight
 * counts its requests from their frame until their reply is queued
 * (handled, parked, held or on a worker); the replies queued and not yet
 * taken by the kernel are the handle's write queue.  Either above its
 * bound (max_inflight_per_conn, SRV_UNSENT_MAX), the connection is not
 * read (ctl.c, srv_pipe_pump).  Its memory lives until libuv's close
 * callback; it leaves the table (srv_pipe_find) when the close starts.
 */
#define SRV_UNSENT_MAX (256u << 10) /* bytes of replies the kernel has not
                                       taken, beyond which a connection
                                       is not read */

struct srv_pipe {
	uv_pipe_t h;       /* h.data: this */
	struct server *srv;
	uint32_t id;       /* from 1, never reused while the daemon runs */
	uint32_t pid, uid, gid; /* SO_PEERCRED at accept */
	uint64_t born_ms;
	uint64_t last_ms;  /* last request read or reply written */
	uint32_t inflight;
	int bound;         /* a tenant registered on it (no idle deadline) */
	int closing;       /* uv_close called: out of the table */
	int greeted;       /* the peer's SP header came */
	int reading;       /* uv_read_start in force */
	int pumping;       /* srv_pipe_pump is on the stack */
	int starved;       /* on s->starved_*: a frame waits for a request */
	struct srv_pipe *starved_next;
	uint64_t stall_ms; /* replies unsent and none written since (0) */
	/* What was read and not yet taken as frames: rx[rx_off, rx_len). */
	uint8_t *rx;
	uint32_t rx_off, rx_len, rx_cap;
	uint32_t rx_need;  /* bytes from rx_off the next frame needs */
	uint32_t rx_skip;  /* bytes of a frame refused unread still to come:
	                      dropped as they are read */
	int big;           /* counted in s->ctl.n_big_rx (ctl.c, SRV_RX_BIG) */
};

/* ctl.ipc (ctl.c, pipes.c): the listener, the request pool and the open
 * control connections. */
struct srv_ctl {
	/* the listening socket, polled, with the accept back-off of
	 * fdchan.c's kind */
	int csock;
	uv_poll_t cpoll;
	int cpoll_ready;
	struct srv_backoff caccept;
	struct log_rate crefuse_log;
	struct srv_req *reqs; /* [n_reqs = cfg.contexts], the pool */
	uint32_t n_reqs;
	struct srv_req *req_free; /* free ones */
	uint32_t n_free;
	uint32_t n_low_held; /* held by connections without a tenant: at
	                        most n_reqs / 2 (ctl.c) */
	/* Connections with a whole frame waiting for a free request, in
	 * order (srv_pipe_pump). */
	struct srv_pipe *starved_head, *starved_tail;
	int pumping_starved;
	uint32_t n_big_rx; /* connections without a tenant holding a big
	                      receive buffer (ctl.c) */
	uint32_t low_msg_max; /* the longest hello or admin request
	                         (codec_req_len_max): a connection without a
	                         tenant sends nothing longer (ctl.c) */
	uint32_t unread_left; /* bytes of frames refused unread that may
	                         still be read this cron tick (ctl.c) */
	uint32_t next_pipe_id;
	/* Admitted requests of connections without a tenant (kvtrimctl,
	 * hellos, anyone in the group), loop thread only: handled after
	 * every tenant's request, SRV_LOW_SLICE per wake-up (ctl.c). */
	struct srv_req *low_head, *low_tail;

	/* Open control connections, open addressing on the pipe id
	 * (linear probing, at most half full). */
	struct srv_pipe **pipes; /* [pipes_cap] */
	uint32_t pipes_cap, n_pipes;
	uint32_t n_bound_pipes; /* of which a tenant is registered on */
	uint32_t n_closing;     /* closed, their close callback not run */
};

/* Refused connections being told why (refuse.c), newest first, at most
 * SRV_REFUSALS_MAX; they are not among the control connections. */
struct srv_refused {
	struct srv_refusal *refusals, *refusals_tail;
	uint32_t n_refusals;
	uint8_t refuse_rx[4096]; /* what refusals read, then discard */
};

/* fd.sock (fdchan.c): the listener and the handle channels. */
struct srv_fdchan {
	int hsock;
	uv_poll_t hpoll;
	int hpoll_ready;
	struct srv_conn *conns;     /* newest first */
	struct srv_conn *conns_tail; /* oldest */
	uint32_t n_conns;           /* fd.sock connections, with or without a
	                               tenant */
	uint32_t n_conns_refused;   /* ... of them kept only to say why
	                               (srv_conn refused), at most
	                               SRV_REFUSALS_MAX */
	/* Accept back-off: after a failed accept (out of fds, say) the
	 * listener is not polled until its resume time (cron restarts it). */
	struct srv_backoff haccept;
	struct log_rate refuse_log, violation_log, denied_log,
	                hello_log; /* repeatable warnings (fdchan.c) */
	/* fd budget (srv_fd_budget): the open-file limit in force and the
	 * most max_pending_conns it leaves room for. */
	uint64_t fd_limit;
	uint32_t pending_cap;
};

/* The runtime directory this daemon owns (server.c). */
struct srv_rundir {
	int lock_fd;  /* runtime dir's kvtrimd.lock (rundir_lock), -1: none */
	int claim_fd; /* the dir's abstract claim (rundir_claim), -1: none */
	/* The socket files this daemon bound, as they were then: what
	 * srv_rundir_watch compares the dir against, and what server_free
	 * may remove (a file replaced meanwhile is someone else's). */
	struct srv_own_file {
		const char *path;
		dev_t dev;
		ino_t ino;
		int bound;
	} own[3];
	uint64_t rundir_ms; /* the last srv_rundir_watch */
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

	struct srv_ctl ctl;
	struct srv_refused ref;
	struct srv_fdchan fdc;
	struct srv_rundir rd;
	/* Device wake-ups (a driver thread) and the low class's next slice:
	 * srv_wake_cb. */
	uv_async_t wake;


	uint32_t refusals_tick; /* connections refused this cron tick
	                           (srv_accept_hold) */
	int exit_status;    /* server_run's: 0, or 1 after the dir was lost */

	struct srv_barred barred[SRV_BARRED_MAX];
	struct srv_tenant **tenants; /* [cfg.max_tenants] */
	uint32_t next_tenant_id;

	uint32_t n_jobs; /* syncs running on worker threads */

	/* Requests waiting for pool pages, oldest first (loop thread). */
	struct srv_req *parked_head, *parked_tail;
	uint32_t n_parked;
	float pressure; /* pool-wide level, 0..1 */

	/* Parsed access lists (cfg.allow_* and cfg.admin_*). */
	pthread_mutex_t acl_lock;
	struct srv_acl allow, admin;


	struct stats_pub pub;
	int pub_ready;
	struct http *http;
	uv_async_t snap_async;  /* HTTP thread asks for a fresh snapshot */

	uv_signal_t sigterm, sigint, sighup;
	uv_timer_t cron, drain, watchdog;
	uint64_t watchdog_ms;   /* 0: systemd expects no pings */
	uint64_t status_ms;     /* last STATUS= */
	int draining;
	volatile int stopping; /* ctl.ipc closed: nothing can be sent */
	uint64_t drain_started_ms;
	int loop_ready;

	char ctl_path[PATH_MAX], fd_path[PATH_MAX], stats_path[PATH_MAX];
};

/* What srv_handle and srv_conclude decided about a request: reply now,
 * park, or SRV_HELD: the request belongs to a sync job or waits for its
 * tenant; whoever holds it replies later. */
enum srv_verdict { SRV_REPLY, SRV_PARK, SRV_HELD };

/* A random cookie or token (clocks: core/now.h). */
static inline uint64_t random_u64(void)
{
	uint64_t v = 0;
	while (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
		;
	return v;
}

/* ---------------------------------------------------------- ctl.c */

/* Listens on ctl_path (mode 0660, SOCK_STREAM: nng's ipc:// transport)
 * and makes the pool of cfg.contexts requests.  On failure returns a
 * KVT_E* code, err says why; what was opened is s's (srv_ctl_close). */
int srv_ctl_open(struct server *s, char *err, size_t errlen);

/* Starts polling ctl.ipc for connections; stops (the drain). */
void srv_ctl_start(struct server *s);
void srv_ctl_stop_accepting(struct server *s);

/* Cron: reads the connections waiting for a request again, and polls
 * ctl.ipc again once an accept back-off is over. */
void srv_ctl_cron(struct server *s, uint64_t now);

/* s->wake: retries the parked requests, then the low class's next slice. */
void srv_wake_cb(uv_async_t *a);

/* Queues r's reply (r->msg, taken; none when NULL or its connection is
 * gone) and returns r to the pool. */
void srv_send(struct server *s, struct srv_req *r);

/* Reads what p holds and can take (whole frames while p is within its
 * bounds and requests are free), then reads p again or not. */
void srv_pipe_pump(struct server *s, struct srv_pipe *p);

/* Are replies still to be written on some connection? */
int srv_ctl_writing(const struct server *s);

/* Closes ctl.ipc and every connection, and frees every request message
 * the loop holds; nothing is sent after it (s->stopping). */
void srv_ctl_close(struct server *s);

/* ---------------------------------------------------------- pipes.c */

/* The open connection of id, or NULL (also once its close started). */
struct srv_pipe *srv_pipe_find(struct server *s, uint32_t id);

/* Enters p (a new connection) into the table; nonzero when out of memory. */
int srv_pipe_add(struct server *s, struct srv_pipe *p);

/*
 * Is there room for one more connection without a tenant from this peer?
 * max_pending_per_pid holds for everyone; max_pending_per_uid and
 * max_pending_conns for all but admins.  At max_pending_conns a newcomer
 * whose uid holds fewer closes a connection of the uid holding the most
 * (srv_uid_runs).  0: admit it; KVT_EBUSY: refuse it, why naming the
 * limit (counted, logged).
 */
int srv_pipe_room(struct server *s, uint32_t pid, uint32_t uid, uint32_t gid,
                  char *why, size_t wlen);

/* ---------------------------------------------------------- refuse.c */

/* Refused connections told why, at most this many at once. */
#define SRV_REFUSALS_MAX 16

/*
 * Takes fd, a control connection srv_pipe_room refused: sends the SP
 * header, answers the peer's first request with code and why, and closes
 * it when the peer hangs up or SRV_REFUSE_MS after the accept.  With
 * SRV_REFUSALS_MAX open already, the oldest is closed first.
 */
void srv_refuse(struct server *s, int fd, int code, const char *why);

/* Cron: closes the refusals past their deadline. */
void srv_refuse_cron(struct server *s, uint64_t now);

/* Closes every refusal (shutdown). */
void srv_refuse_close_all(struct server *s);

/* Closes p, once: out of the table at once, a tenant registered on it
 * reclaimed, its unanswered requests counted as dropped; counter (may be
 * NULL: the peer closed) bumped and why logged; freed by libuv's close
 * callback. */
void srv_pipe_close(struct server *s, struct srv_pipe *p, uint64_t *counter,
                    const char *why);

/* A tenant was registered on pipe id (bound 1) or released from it (0). */
void srv_pipe_bind(struct server *s, uint32_t id, int bound);

/* Cron: closes the connections without a tenant that sent nothing for
 * hello_timeout_ms, and those whose replies waited send_timeout_ms
 * without a byte taken. */
void srv_pipe_cron(struct server *s, uint64_t now);

/* ---------------------------------------------------------- fdchan.c */

/* Starts polling fd.sock for connections. */
void srv_accept_start(struct server *s);

/* A failed accept (errno err) on the listener polled by poll, named name:
 * *counter bumped, poll stopped for b's next pause, logged once a second
 * at most.  srv_backoff_over: is b's pause over at now (it is then
 * cleared)? */
void srv_accept_failed(struct server *s, struct srv_backoff *b,
                       uv_poll_t *poll, const char *name, uint64_t *counter,
                       int err);
int srv_backoff_over(struct srv_backoff *b, const struct server *s,
                     uint64_t now);

/*
 * A connection was refused for a bound (srv_pipe_room, srv_conn_room).
 * Past SRV_REFUSALS_PER_TICK refusals in one cron tick (both sockets
 * together), the listener is not polled until the next tick: while a flood
 * keeps a bound reached, its connections then wait in the kernel's backlog
 * (beyond it the kernel refuses them) instead of costing the loop an
 * accept, a refusal and a close each without end; bursts of those delayed
 * every tenant's sync.  Refused clients are still told why, a few hundred
 * a second; an admin or a newcomer of another uid waits a tick at most.
 */
void srv_accept_hold(struct server *s, struct srv_backoff *b,
                     uv_poll_t *poll);
#define SRV_REFUSALS_PER_TICK 32

/* Connections the cron closes per tick and socket for a deadline they
 * missed (hello_timeout_ms, send_timeout_ms); the rest wait for the next
 * tick.  A flood opened at once expires at once, and closing hundreds in
 * one tick (10-20 us each) would hold every tenant's sync for milliseconds. */
#define SRV_CLOSES_PER_TICK 16

/* Cron: polls fd.sock again once an accept back-off is over. */
void srv_accept_resume(struct server *s, uint64_t now);

/* Closes a handle channel (once) and ends the lease of its tenant. */
void srv_conn_close(struct srv_conn *c);

/* Polls c again, after a sync on a worker held its tenant. */
void srv_conn_resume(struct srv_conn *c);

/* Cron: closes the handle channels that sent no hello in time. */
void srv_conn_cron(struct server *s, uint64_t now);

/* The most connections without a tenant at once (max_pending_conns, lowered
 * to what the fd budget leaves room for), and of them one uid's
 * (max_pending_per_uid; 0 there: half of srv_pending_max, at least 1). */
uint32_t srv_pending_max(const struct server *s);
uint32_t srv_pending_per_uid(const struct server *s);

/* A uid and how many connections without a tenant it holds. */
struct srv_uid_run {
	uint32_t uid, n;
};

/* Sorts uids[n] (in place) and writes the uids' counts to runs[n], most
 * first; returns how many runs. */
uint32_t srv_uid_runs(uint32_t *uids, uint32_t n, struct srv_uid_run *runs);

/* Sends t's queued events over c's handle channel (tenant_flush_events),
 * grants of one window coalesced into sets; 0 or the first KVT_E*. */
int srv_send_events(struct srv_conn *c, struct tenant *t);

/* Raises the open-file limit and sets fd_limit and pending_cap from it. */
void srv_fd_budget(struct server *s);

/* ---------------------------------------------------------- auth.c */

/* Is the peer (pid, uid, gid) in list a?  Any thread (takes acl_lock). */
int srv_acl_has(const struct server *s, const struct srv_acl *a,
                uint32_t pid, uint32_t uid, uint32_t gid);

/* ... in the allow list (who may register a tenant)? */
int srv_allowed(const struct server *s, uint32_t pid, uint32_t uid,
                uint32_t gid);

/* Re-parses s->allow and s->admin from s->cfg. */
void srv_allow_refresh(struct server *s);

/* 0 when control connection p's peer is in the allow list (srv_pipe_allowed)
 * or the admin list (srv_pipe_admin), else KVT_EPERM with why naming what
 * was refused; counted and logged. */
int srv_pipe_allowed(struct server *s, const struct srv_pipe *p,
                     const char *what, char *why, size_t wlen);
int srv_pipe_admin(struct server *s, const struct srv_pipe *p,
                   const char *what, char *why, size_t wlen);

/* Request r's tenant, in *out, when its id and token match and it came on
 * the tenant's own control connection; else KVT_ENOTENANT. */
int srv_auth(struct server *s, const struct ipc_req *r,
             const struct srv_pipe *pipe,
             struct srv_tenant **out, char *why, size_t wlen);

/* ---------------------------------------------------------- lease.c */

/* The registered tenant with that id, or NULL. */
struct srv_tenant *srv_find_tenant(struct server *s, uint32_t id);

/* Does process pid hold a registered tenant? */
int srv_pid_has_tenant(const struct server *s, uint32_t pid);

/* st's counters, live or as of the start of its running sync. */
void srv_tenant_stats(struct srv_tenant *st, struct kvt_tenant_stats *out);

/* Frees st and its memory (logged with why); it must be out of the table
 * and idle. */
void srv_tenant_free(struct server *s, struct srv_tenant *st,
                     const char *why);
/* The pool's share caps from uid_pool_share / pid_pool_share, at start
 * and after every config change. */
void srv_shares_refresh(struct server *s);

/* Ends st's lease (why is logged): now, or when its running sync ends. */
void srv_reclaim(struct server *s, struct srv_tenant *st, const char *why);

/* IPC_OP_HELLO: registers a tenant on the handle channel named by h's
 * cookie and on control connection pipe; fills rep. */
int srv_hello(struct server *s, const struct ipc_hello *h,
              const struct srv_pipe *pipe,
              struct ipc_rep *rep, char *why, size_t wlen);

/* rv of a tenant operation, returned; st is reclaimed when its device
 * failed (tenant_failed). */
int srv_device_failed(struct server *s, struct srv_tenant *st, int rv,
                      const char *op);

/* Sends st's queued events before the reply; KVT_ECONN (and st reclaimed)
 * when they cannot go. */
int srv_flush(struct server *s, struct srv_tenant *st, char *why,
              size_t wlen);

/* ---------------------------------------------------------- dispatch.c */

/* Handles request r (parked: this is a backpressure retry). */
enum srv_verdict srv_handle(struct server *s, struct srv_req *r, int parked);

/* The end of a request's handling with result rv and reply rep (consumed):
 * parks it under pool pressure, or encodes its reply into r->msg. */
enum srv_verdict srv_conclude(struct server *s, struct srv_req *r,
                              enum ipc_op op, int rv, struct ipc_rep *rep,
                              char *why, size_t wlen, int parked);

/* Acts on a verdict: parks r, sends its reply, or (SRV_HELD) nothing. */
void srv_proceed(struct server *s, struct srv_req *r, enum srv_verdict v);

/* ---------------------------------------------------------- jobs.c */

/* Should st's sync touching lists page lists run on a worker? */
int srv_sync_offload(const struct server *s, const struct srv_tenant *st,
                     uint64_t lists);

/* Hands the sync rq (decoded in req, whose items it takes) to a worker;
 * nonzero when it cannot (it then runs on the loop). */
int srv_job_start(struct server *s, struct srv_tenant *st,
                  struct srv_req *rq, int parked, struct ipc_req *req);

/* What follows a sync's apply (rv), wherever it ran: counters, chunk
 * grants, or the drop of a tenant whose device failed. */
int srv_sync_finish(struct server *s, struct srv_tenant *st, int rv,
                    uint32_t items, const struct kvt_tenant_stats *before,
                    const struct kvt_tenant_stats *after, uint64_t apply_us,
                    uint64_t scorer_ns, char *why, size_t wlen);

/* ---------------------------------------------------------- pressure.c */

/* Cron: the pool-wide pressure level, and each tenant's share of it. */
void srv_pressure(struct server *s);

/* Adds r to the parked requests (last). */
void srv_park(struct server *s, struct srv_req *r);

/* Retries every parked request once, oldest first. */
void srv_retry_parked(struct server *s);

/* ---------------------------------------------------------- admin.c */

/* An admin op (codec_op_is_admin); SRV_IDLE_WAIT when it must wait for
 * the running syncs. */
int srv_admin(struct server *s, const struct ipc_req *r,
              const struct srv_pipe *pipe,
              struct ipc_rep *rep, char *why, size_t wlen);

/* ---------------------------------------------------------- snapshot.c */

/* A snapshot of live state (stats_snap_free frees it), NULL when out of
 * memory. */
struct stats_snap *srv_snapshot(struct server *s);

/* Publishes a fresh snapshot for the HTTP thread. */
void srv_publish(struct server *s);

/* s->snap_async: the HTTP thread asked for a fresh snapshot. */
void srv_snap_async_cb(uv_async_t *a);

/* http_start's renderer; runs on the HTTP thread. */
int srv_http_render(void *ctx, enum stats_fmt fmt, char **out, size_t *len);

/* Tells systemd STATUS= (tenants, sequences, pool, pressure). */
void srv_status(struct server *s);

/* ---------------------------------------------------------- server.c */

/* After s->cfg changed (config set, SIGHUP): what is derived from it. */
void srv_config_changed(struct server *s);

/* Re-reads st's scorer weights (SIGHUP); st must be idle. */
void srv_reload_one(struct server *s, struct srv_tenant *st);

#endif
