/*
 * test_hostile_http.c — slow and idle HTTP clients cannot starve the stats
 * socket: hundreds of incomplete connections, a client that trickles its
 * headers, and more incomplete connections than stats_max_conns.  Every
 * test starts the real daemon and talks to its real stats.sock.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

/* Fails the test unless want fds (plus slack) fit under RLIMIT_NOFILE,
 * raising the soft limit to the hard one if needed. */
static void need_fds(rlim_t want)
{
	struct rlimit rl;
	T_ASSERT(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	if (rl.rlim_cur < want + 64 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		T_ASSERT(setrlimit(RLIMIT_NOFILE, &rl) == 0);
	}
	if (rl.rlim_cur < want + 64)
		T_SKIP("RLIMIT_NOFILE too low for this test");
}

/*
 * Connects to the daemon's stats.sock and sends head (may be ""); the fd,
 * or -1 if not connected.  Non-blocking, so a daemon that stops accepting
 * cannot hang the test: a full backlog is retried until until_ms (on the
 * now_ms clock) at most.
 */
static int slow_connect(const struct th_daemon *d, const char *head,
                        double until_ms)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char path[600];
	snprintf(path, sizeof(path), "%s/stats.sock", d->dir);
	T_ASSERT(strlen(path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	for (;;) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK |
		                                 SOCK_CLOEXEC, 0);
		T_ASSERT(fd >= 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			if (*head)
				(void)!send(fd, head, strlen(head),
				            MSG_NOSIGNAL);
			return fd;
		}
		int e = errno;
		close(fd);
		if (e != EAGAIN || (double)th_now_ms() >= until_ms)
			return -1;
		th_sleep_ms(10);
	}
}

/* 1 when the daemon has closed fd (EOF or reset), waiting at most ms. */
static int closed_by_peer(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (poll(&p, 1, ms) <= 0)
		return 0;
	char b[256];
	ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN);
}

/* Lines of the daemon's log that contain text. */
static int log_count(const struct th_daemon *d, const char *text)
{
	FILE *f = fopen(d->log, "r");
	char line[2048];
	int n = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, text) != NULL;
	fclose(f);
	return n;
}

/* One byte every 300 ms to each fd until stop (at most 10 s). */
struct trickler {
	int *fds;
	int n;
	atomic_int stop;
};

static void *trickle_main(void *arg)
{
	struct trickler *t = arg;
	for (int round = 0; round < 34 && !atomic_load(&t->stop); round++) {
		for (int i = 0; i < t->n; i++)
			if (t->fds[i] >= 0)
				(void)!send(t->fds[i], "a", 1,
				            MSG_NOSIGNAL | MSG_DONTWAIT);
		th_sleep_ms(300);
	}
	return NULL;
}

/* ---------------------------------------------------------------- tests */

#define N_SLOW 300

/*
 * 300 connections that sent part of a request line, half of them then
 * trickling a byte every 300 ms and half silent, against the defaults
 * (stats_max_conns 256, stats_header_timeout_ms 2000): /metrics and the
 * control plane still answer, and every one of the 300 is closed by the
 * daemon, each counted once by the limit or the deadline.
 */
TEST(hostile_http, many_slow_connections_do_not_block_metrics)
{
	static int fds[N_SLOW];
	static int trick[N_SLOW / 2];
	static char body[1 << 18];
	struct th_daemon d;
	int connected = 0;

	need_fds(N_SLOW);
	th_daemon_start(&d, "16M", NULL);
	double until = (double)th_now_ms() + 3000;
	for (int i = 0; i < N_SLOW; i++) {
		fds[i] = slow_connect(&d, "GET /metr", until);
		connected += fds[i] >= 0;
		if (i % 2 == 0)
			trick[i / 2] = fds[i];
	}
	struct trickler t = {trick, N_SLOW / 2, 0};
	pthread_t th;
	T_ASSERT(pthread_create(&th, NULL, trickle_main, &t) == 0);

	double t0 = (double)th_now_ms();
	int code = th_http(&d, NULL, "/metrics", body, sizeof(body));
	double took = (double)th_now_ms() - t0;
	T_EQ(code, 200);
	T_ASSERT(strstr(body, "kvtrim_uptime_seconds"));
	T_ASSERT(took < 4000);
	char out[8192];
	t0 = (double)th_now_ms();
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats", th_bin("kvtrimctl")), 0);
	T_ASSERT((double)th_now_ms() - t0 < 4000);
	T_EQ(connected, N_SLOW);

	/* None of the 300 ever completes a request: each is closed once,
	 * by the limit or by the deadline. */
	uint64_t to = 0, dr = 0;
	for (int waited = 0; waited < 6000; waited += 100) {
		to = th_stat(&d, "stats_conn_timeouts_total");
		dr = th_stat(&d, "stats_conn_drops_total");
		if (to + dr >= N_SLOW)
			break;
		th_sleep_ms(100);
	}
	T_EQ_U64(to + dr, N_SLOW);
	for (int i = 0; i < N_SLOW; i++)
		T_ASSERT(closed_by_peer(fds[i], 1000));

	atomic_store(&t.stop, 1);
	pthread_join(th, NULL);
	for (int i = 0; i < N_SLOW; i++)
		close(fds[i]);
	/* Rate limited: one summary line per 10 s, not one per connection. */
	int lines = log_count(&d, "stats socket: closed");
	T_ASSERT(lines >= 1 && lines <= 2);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * A client that sends one header byte every 300 ms and never ends its
 * headers is closed, without a response, once stats_header_timeout_ms
 * (500) has passed since it connected; an idle timeout alone would never
 * close it.
 */
TEST(hostile_http, trickling_headers_are_cut_at_the_deadline)
{
	static const char *const extra[] = {"--stats-header-timeout-ms", "500",
	                                    NULL};
	struct th_daemon d;
	th_daemon_start(&d, "16M", extra);

	double t0 = (double)th_now_ms();
	int fd = slow_connect(&d, "GET /metrics HTTP/1.1\r\nX-Slow: ",
	                      t0 + 2000);
	T_ASSERT(fd >= 0);
	double closed_at = -1;
	char b[256];
	ssize_t got = 0;
	while ((double)th_now_ms() - t0 < 6000) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 300) > 0) {
			got = recv(fd, b, sizeof(b), MSG_DONTWAIT);
			if (got <= 0 && !(got < 0 && errno == EAGAIN)) {
				closed_at = (double)th_now_ms() - t0;
				break;
			}
			T_ASSERT(got < 0); /* no bytes: no response */
		}
		if (send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
		    errno != EAGAIN) {
			closed_at = (double)th_now_ms() - t0;
			break;
		}
	}
	close(fd);
	T_ASSERT(closed_at >= 0);   /* closed at all (6 s of trickling) */
	T_ASSERT(closed_at >= 450); /* not before the deadline (500 ms) */
	T_ASSERT(closed_at < 3000); /* the deadline plus a 2.5 s margin */
	T_EQ_U64(th_stat(&d, "stats_conn_timeouts_total"), 1);
	T_EQ_U64(th_stat(&d, "stats_conn_drops_total"), 0);
	T_EQ(th_http(&d, NULL, "/metrics", NULL, 0), 200);
	T_EQ(th_daemon_stop(&d), 0);
}

#define N_IDLE 40 /* above stats_max_conns (8) and the old fixed limit (32) */
#define MAX_CONNS 8

/*
 * 40 incomplete connections (half silent, half with a partial head) at
 * stats_max_conns 8 and a 60 s header deadline (so only the limit rule
 * can act): each new one closes the oldest, so a fresh /metrics request
 * gets 200 at once.  By hand: the 40 leave 32 closed and the last 8 open;
 * curl's connection then closes one more (the oldest left), so 33 drops,
 * connections 0..32 closed, 33..39 open, and no deadline closes.
 */
TEST(hostile_http, incomplete_connections_beyond_the_limit_leave_room)
{
	static const char *const extra[] = {
		"--stats-max-conns", "8", "--stats-header-timeout-ms", "60000",
		NULL};
	static int fds[N_IDLE];
	struct th_daemon d;
	th_daemon_start(&d, "16M", extra);

	double until = (double)th_now_ms() + 3000;
	for (int i = 0; i < N_IDLE; i++) {
		fds[i] = slow_connect(&d, i % 2 ? "GET /metrics HTTP/1.1\r\n"
		                                : "", until);
		T_ASSERT(fds[i] >= 0);
	}
	/* The daemon accepts in connect order; wait for the 40 - 8 closes,
	 * so that curl's connection comes after all 40 (checked after the
	 * request, which is the point). */
	int early = 0;
	until = (double)th_now_ms() + 3000; /* for all: the old 10 s idle timeout is out */
	for (int i = 0; i < N_IDLE - MAX_CONNS; i++) {
		double left = until - (double)th_now_ms();
		early += closed_by_peer(fds[i], left > 0 ? (int)left : 0);
	}

	double t0 = (double)th_now_ms();
	T_EQ(th_http(&d, NULL, "/metrics", NULL, 0), 200);
	T_ASSERT((double)th_now_ms() - t0 < 4000);
	T_EQ(early, N_IDLE - MAX_CONNS);

	T_ASSERT(closed_by_peer(fds[N_IDLE - MAX_CONNS], 3000));
	for (int i = N_IDLE - MAX_CONNS + 1; i < N_IDLE; i++)
		T_ASSERT(!closed_by_peer(fds[i], 0));
	T_EQ_U64(th_stat(&d, "stats_conn_drops_total"),
	         N_IDLE - MAX_CONNS + 1);
	T_EQ_U64(th_stat(&d, "stats_conn_timeouts_total"), 0);
	for (int i = 0; i < N_IDLE; i++)
		close(fds[i]);
	T_EQ(th_daemon_stop(&d), 0);
}
