/*
 * http.c — see http.h.  The Unix socket is created here (libmicrohttpd
 * only binds TCP) and handed over with MHD_OPTION_LISTEN_SOCKET.
 *
 * Slow and idle clients: libmicrohttpd 0.9.75 has only an idle timeout
 * that every byte restarts and a limit that stops accepting, so this file
 * keeps a record of every connection and enforces the header deadline,
 * the reply deadline and the per-listener limit itself (docs/protocol.md,
 * "Stats socket"; why not MHD's own: docs/design-changes.md).  MHD runs in
 * external-polling epoll mode on one thread of ours (http_main): poll,
 * MHD_run, then sweep the deadlines.  A late connection gets shutdown(2)
 * and MHD closes it on its next pass through its normal path; that is
 * sound because only this thread lets MHD close sockets and MHD reports a
 * close before it closes the fd, so a socket shut down here is still that
 * connection's.  MHD's own limit is set well above ours, so it never
 * refuses a connection itself.
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvtrim.h"
#include "log.h"
#include "now.h"

#define HTTP_CONN_TIMEOUT_S 10      /* idle: no byte moved for this long */
#define HTTP_REPLY_TIMEOUT_MS 10000 /* rule 2 */
#define HTTP_MHD_SLACK 16           /* MHD's limit: 2 x ours + this */
#define HTTP_LOG_INTERVAL_MS 10000  /* one log line of each kind per this */

enum http_cstate {
	HTTP_WAITING, /* no complete request head yet (rule 1 runs) */
	HTTP_BUSY,    /* a request is being answered (rule 2 runs) */
	HTTP_CLOSING, /* shut down here; MHD has not reported the close yet */
};

/* One accepted connection: MHD's socket context for it. */
struct http_conn {
	struct http_conn *prev, *next; /* in its listener's list of state */
	struct MHD_Connection *mc;
	uint64_t since_ms; /* when the current state began (monotonic) */
	enum http_cstate state;
};

/* Connections in one state, oldest first (since_ms ascending: each is
 * appended when it enters the state, with since_ms = now). */
struct http_list {
	struct http_conn *head, *tail;
};

/* One listening socket and the MHD daemon serving it. */
struct http_lsn {
	struct http *h;
	struct MHD_Daemon *d; /* NULL: not serving */
	int epfd;             /* MHD's epoll fd, what http_main polls */
	struct http_list waiting, busy;
	unsigned live; /* waiting + busy: what rule 3 counts */
};

struct http {
	struct http_lsn lsn[2]; /* stats.sock, then the TCP port */
	http_render_fn render;
	void *ctx;
	unsigned max_conns;         /* rule 3, per listener */
	unsigned header_timeout_ms; /* rule 1 */
	int wake;                   /* eventfd: http_stop ends http_main */
	pthread_t thread;
	int running;                /* thread started */
	_Atomic uint64_t timeouts;  /* closed by rule 1 or 2 */
	_Atomic uint64_t dropped;   /* closed by rule 3 */
	/* Log rate limiting; only one thread at a time runs MHD (start, then
	 * http_main, then stop), so these need no lock. */
	uint64_t report_next_ms, reported_timeouts, reported_dropped;
	uint64_t mhd_next_ms, mhd_suppressed;
	char path[PATH_MAX];
};

/* ------------------------------------------------------- connection lists */

static void http_list_add(struct http_list *l, struct http_conn *c)
{
	c->next = NULL;
	c->prev = l->tail;
	if (l->tail)
		l->tail->next = c;
	else
		l->head = c;
	l->tail = c;
}

static void http_list_del(struct http_list *l, struct http_conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		l->head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		l->tail = c->prev;
	c->prev = c->next = NULL;
}

static struct http_list *http_list_of(struct http_lsn *l,
                                      const struct http_conn *c)
{
	return c->state == HTTP_WAITING ? &l->waiting : &l->busy;
}

/* Moves a tracked connection into state st, its clock restarted. */
static void http_conn_move(struct http_lsn *l, struct http_conn *c,
                           enum http_cstate st)
{
	http_list_del(http_list_of(l, c), c);
	c->state = st;
	c->since_ms = now_ms();
	http_list_add(http_list_of(l, c), c);
}

static struct http_conn *http_conn_of(struct MHD_Connection *mc)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
		mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return ci ? ci->socket_context : NULL;
}

/*
 * Closes a tracked connection: it leaves the counts at once, and MHD
 * closes it on its next pass when it reads the EOF.  Runs on the MHD
 * thread only (see the header: the fd is still the connection's).
 */
static void http_conn_close(struct http_lsn *l, struct http_conn *c,
                            _Atomic uint64_t *counter)
{
	http_list_del(http_list_of(l, c), c);
	c->state = HTTP_CLOSING;
	l->live--;
	atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
		c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci)
		shutdown(ci->connect_fd, SHUT_RDWR);
}

/* MHD_OPTION_NOTIFY_CONNECTION: accept (rule 3 applied) and close. */
static void http_notify(void *cls, struct MHD_Connection *mc, void **sctx,
                        enum MHD_ConnectionNotificationCode toe)
{
	struct http_lsn *l = cls;
	struct http_conn *c = *sctx;

	if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (c && c->state != HTTP_CLOSING) {
			http_list_del(http_list_of(l, c), c);
			l->live--;
		}
		free(c);
		*sctx = NULL;
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		/* Untracked, it would escape every rule: refuse it. */
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
			mc, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (ci)
			shutdown(ci->connect_fd, SHUT_RDWR);
		atomic_fetch_add_explicit(&l->h->dropped, 1,
		                          memory_order_relaxed);
		return;
	}
	*sctx = c;
	c->mc = mc;
	c->state = HTTP_WAITING;
	c->since_ms = now_ms();
	http_list_add(&l->waiting, c);
	if (++l->live > l->h->max_conns)
		http_conn_close(l, l->waiting.head, &l->h->dropped);
}

/* MHD_OPTION_NOTIFY_COMPLETED: the response is done (or the request
 * ended otherwise); the connection waits for its next request. */
static void http_completed(void *cls, struct MHD_Connection *mc,
                           void **req_cls,
                           enum MHD_RequestTerminationCode toe)
{
	struct http_conn *c = http_conn_of(mc);
	if (c && c->state == HTTP_BUSY)
		http_conn_move(cls, c, HTTP_WAITING);
}

/* Rules 1 and 2 for one listener; the lists are oldest first. */
static void http_sweep(struct http_lsn *l, uint64_t now)
{
	struct http *h = l->h;
	while (l->waiting.head &&
	       now - l->waiting.head->since_ms >= h->header_timeout_ms)
		http_conn_close(l, l->waiting.head, &h->timeouts);
	while (l->busy.head &&
	       now - l->busy.head->since_ms >= HTTP_REPLY_TIMEOUT_MS)
		http_conn_close(l, l->busy.head, &h->timeouts);
}

/* ---------------------------------------------------------------- logging */

/* MHD's own messages, at most one per HTTP_LOG_INTERVAL_MS (a flood of
 * bad clients must not flood the journal). */
static void http_log(void *cls, const char *fmt, va_list ap)
{
	struct http *h = cls;
	uint64_t now = now_ms();
	if (now < h->mhd_next_ms) {
		h->mhd_suppressed++;
		return;
	}
	char buf[512];
	vsnprintf(buf, sizeof(buf), fmt, ap);
	size_t n = strlen(buf);
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	if (h->mhd_suppressed)
		LOG(LOG_LVL_WARNING, "stats socket: %s (and %" PRIu64
		    " libmicrohttpd messages suppressed before)", buf,
		    h->mhd_suppressed);
	else
		LOG(LOG_LVL_WARNING, "stats socket: %s", buf);
	h->mhd_suppressed = 0;
	h->mhd_next_ms = now + HTTP_LOG_INTERVAL_MS;
}

static int http_report_pending(const struct http *h)
{
	return atomic_load_explicit(&h->timeouts, memory_order_relaxed) !=
	               h->reported_timeouts ||
	       atomic_load_explicit(&h->dropped, memory_order_relaxed) !=
	               h->reported_dropped;
}

/* The connections closed by the rules, summed in one line at most every
 * HTTP_LOG_INTERVAL_MS. */
static void http_report(struct http *h, uint64_t now)
{
	if (!http_report_pending(h) || now < h->report_next_ms)
		return;
	uint64_t t = atomic_load_explicit(&h->timeouts, memory_order_relaxed);
	uint64_t d = atomic_load_explicit(&h->dropped, memory_order_relaxed);
	LOG(LOG_LVL_WARNING, "stats socket: closed %" PRIu64 " slow "
	    "connections (no request head within stats_header_timeout_ms=%u, "
	    "or a reply not read in %d s) and %" PRIu64 " at "
	    "stats_max_conns=%u since the last report", t - h->reported_timeouts,
	    h->header_timeout_ms, HTTP_REPLY_TIMEOUT_MS / 1000,
	    d - h->reported_dropped, h->max_conns);
	h->reported_timeouts = t;
	h->reported_dropped = d;
	h->report_next_ms = now + HTTP_LOG_INTERVAL_MS;
}

/* ------------------------------------------------------------- requests */

static enum MHD_Result http_reply(struct MHD_Connection *conn,
                                  unsigned status, const char *type,
                                  char *body, size_t len, int owned)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		if (owned)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET");
	enum MHD_Result rv = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return rv;
}

#define HTTP_TEXT "text/plain; charset=utf-8"

static enum MHD_Result http_handle(void *cls, struct MHD_Connection *conn,
                                   const char *url, const char *method,
                                   const char *version,
                                   const char *upload_data,
                                   size_t *upload_data_size, void **req_cls)
{
	static const char not_found[] =
		"not found: try /metrics (Prometheus) or /stats (JSON)\n";
	static const char not_allowed[] = "method not allowed: use GET\n";
	static const char unavailable[] = "statistics unavailable\n";
	struct http_lsn *l = cls;
	struct http *h = l->h;
	struct http_conn *c = http_conn_of(conn);
	enum stats_fmt fmt;

	/* The head is complete: rule 1 is met, rule 2 starts. */
	if (c && c->state == HTTP_WAITING)
		http_conn_move(l, c, HTTP_BUSY);

	if (strcmp(method, MHD_HTTP_METHOD_GET))
		return http_reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, HTTP_TEXT,
		                  (char *)not_allowed, sizeof(not_allowed) - 1,
		                  0);
	if (!strcmp(url, "/metrics"))
		fmt = STATS_FMT_PROM;
	else if (!strcmp(url, "/stats"))
		fmt = STATS_FMT_JSON;
	else
		return http_reply(conn, MHD_HTTP_NOT_FOUND, HTTP_TEXT,
		                  (char *)not_found, sizeof(not_found) - 1, 0);

	char *body = NULL;
	size_t len = 0;
	if (h->render(h->ctx, fmt, &body, &len))
		return http_reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, HTTP_TEXT,
		                  (char *)unavailable, sizeof(unavailable) - 1,
		                  0);
	return http_reply(conn, MHD_HTTP_OK,
	                  fmt == STATS_FMT_PROM
	                          ? "text/plain; version=0.0.4; charset=utf-8"
	                          : "application/json",
	                  body, len, 1);
}

static int unix_listen(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	struct stat st;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "%s: path too long for a Unix socket", path);
		return -1;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	/* A socket file left by a daemon that died is replaced; anything
	 * else at that path is not ours to remove. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	mode_t old = umask(0117);
	int rv = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	umask(old);
	/* The full backlog (net.core.somaxconn): a scrape that arrives in a
	 * burst of connects (a slowloris opening hundreds at once) must be
	 * queued, not refused with EAGAIN before MHD could accept it; the
	 * connection rules (http_notify) then make room for it. */
	if (rv < 0 || listen(fd, SOMAXCONN) < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", path,
		         strerror(rv < 0 ? e : errno));
		if (rv == 0)
			unlink(path);
		close(fd);
		return -1;
	}
	return fd;
}

/* ------------------------------------------------------------- the thread */

static void http_min(uint64_t *wait, uint64_t deadline, uint64_t now)
{
	uint64_t left = deadline > now ? deadline - now : 0;
	if (left < *wait)
		*wait = left;
}

/* Milliseconds http_main may sleep: until MHD's next timeout, the next
 * deadline of rules 1 and 2, or the next due report; -1 for none. */
static int http_wait_ms(const struct http *h, uint64_t now)
{
	uint64_t wait = UINT64_MAX;
	for (int i = 0; i < 2; i++) {
		const struct http_lsn *l = &h->lsn[i];
		MHD_UNSIGNED_LONG_LONG t;
		if (!l->d)
			continue;
		if (MHD_get_timeout(l->d, &t) == MHD_YES && t < wait)
			wait = t;
		if (l->waiting.head)
			http_min(&wait, l->waiting.head->since_ms +
			                        h->header_timeout_ms, now);
		if (l->busy.head)
			http_min(&wait, l->busy.head->since_ms +
			                        HTTP_REPLY_TIMEOUT_MS, now);
	}
	if (http_report_pending(h))
		http_min(&wait, h->report_next_ms, now);
	if (wait == UINT64_MAX)
		return -1;
	return wait > INT_MAX ? INT_MAX : (int)wait;
}

/* The HTTP thread: every MHD callback and every close happens here. */
static void *http_main(void *arg)
{
	struct http *h = arg;
	for (;;) {
		struct pollfd p[3] = {{.fd = h->wake, .events = POLLIN}};
		nfds_t n = 1;
		for (int i = 0; i < 2; i++)
			if (h->lsn[i].d)
				p[n++] = (struct pollfd){.fd = h->lsn[i].epfd,
				                         .events = POLLIN};
		/* Errors (EINTR) only mean another pass. */
		(void)poll(p, n, http_wait_ms(h, now_ms()));
		if (p[0].revents)
			return NULL;
		for (int i = 0; i < 2; i++) {
			if (!h->lsn[i].d)
				continue;
			MHD_run(h->lsn[i].d);
			http_sweep(&h->lsn[i], now_ms());
		}
		http_report(h, now_ms());
	}
}

/* ------------------------------------------------------------- start/stop */

/*
 * Starts MHD (external epoll polling, run by http_main) on the listening
 * socket fd, or, with fd < 0, on the TCP address sin.  0 or -1.
 */
static int http_serve(struct http_lsn *l, struct http *h, int fd,
                      const struct sockaddr_in *sin)
{
	const struct MHD_OptionItem common[] = {
		{MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)http_log, h},
		{MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)http_notify, l},
		{MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)http_completed, l},
		{MHD_OPTION_CONNECTION_LIMIT,
		 (intptr_t)(2 * h->max_conns + HTTP_MHD_SLACK), NULL},
		{MHD_OPTION_CONNECTION_TIMEOUT, HTTP_CONN_TIMEOUT_S, NULL},
		{MHD_OPTION_END, 0, NULL},
	};
	const unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;

	l->h = h;
	if (fd >= 0)
		l->d = MHD_start_daemon(flags, 0, NULL, NULL, http_handle, l,
		                        MHD_OPTION_ARRAY, common,
		                        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
		                        MHD_OPTION_END);
	else
		l->d = MHD_start_daemon(flags, ntohs(sin->sin_port), NULL, NULL,
		                        http_handle, l, MHD_OPTION_ARRAY, common,
		                        MHD_OPTION_SOCK_ADDR,
		                        (const struct sockaddr *)sin,
		                        MHD_OPTION_END);
	if (!l->d)
		return -1;
	const union MHD_DaemonInfo *di =
		MHD_get_daemon_info(l->d, MHD_DAEMON_INFO_EPOLL_FD);
	if (!di) {
		MHD_stop_daemon(l->d);
		l->d = NULL;
		return -1;
	}
	l->epfd = di->epoll_fd;
	return 0;
}

int http_start(const char *path, const struct http_opts *o,
               http_render_fn render, void *ctx, struct http **out,
               char *err, size_t errlen)
{
	struct http *h = calloc(1, sizeof(*h));
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return KVT_ENOMEM;
	}
	h->render = render;
	h->ctx = ctx;
	h->max_conns = o->max_conns ? o->max_conns : 1;
	h->header_timeout_ms = o->header_timeout_ms;
	h->wake = -1;
	snprintf(h->path, sizeof(h->path), "%s", path);
	int fd = unix_listen(path, err, errlen);
	if (fd < 0) {
		free(h);
		return KVT_ESYS;
	}
	if (http_serve(&h->lsn[0], h, fd, NULL)) {
		snprintf(err, errlen, "libmicrohttpd cannot serve %s", path);
		close(fd);
		unlink(path);
		free(h);
		return KVT_ESYS;
	}
	if (o->tcp_port) {
		struct sockaddr_in sin;
		memset(&sin, 0, sizeof(sin));
		sin.sin_family = AF_INET;
		sin.sin_port = htons((uint16_t)o->tcp_port);
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (http_serve(&h->lsn[1], h, -1, &sin)) {
			snprintf(err, errlen, "cannot serve stats on "
			         "127.0.0.1:%u (port in use?)", o->tcp_port);
			http_stop(h);
			return KVT_ESYS;
		}
	}
	h->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (h->wake < 0 || pthread_create(&h->thread, NULL, http_main, h)) {
		snprintf(err, errlen, "cannot start the HTTP thread: %s",
		         strerror(h->wake < 0 ? errno : EAGAIN));
		http_stop(h);
		return KVT_ESYS;
	}
	h->running = 1;
	*out = h;
	return 0;
}

void http_stop(struct http *h)
{
	if (!h)
		return;
	if (h->running) {
		uint64_t one = 1;
		/* An eventfd write of 1 cannot fail short of overflow. */
		(void)!write(h->wake, &one, sizeof(one));
		pthread_join(h->thread, NULL);
	}
	if (h->wake >= 0)
		close(h->wake);
	for (int i = 1; i >= 0; i--)
		if (h->lsn[i].d)
			MHD_stop_daemon(h->lsn[i].d);
	unlink(h->path);
	free(h);
}

void http_counts(const struct http *h, uint64_t *timeouts, uint64_t *dropped)
{
	*timeouts = h ? atomic_load_explicit(&h->timeouts,
	                                     memory_order_relaxed) : 0;
	*dropped = h ? atomic_load_explicit(&h->dropped,
	                                    memory_order_relaxed) : 0;
}
