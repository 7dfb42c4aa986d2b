/*
 * test_hostile_fd.c — the handle channel (fd.sock) and the runtime dir
 * under hostile or faulty peers, against the real daemon: an idle-connection
 * flood beyond the daemon's open-file limit, a registered tenant flooding
 * its handle channel with junk, packets the protocol never asks for, and a
 * second kvtrimd on a live runtime dir (docs/protocol.md, "Limits of the
 * handle channel" and "Runtime directory lock").
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "handle.h"
#include "kvtrim.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

static void fd_sock_path(const struct th_daemon *d, char *out, size_t len)
{
	snprintf(out, len, "%s/fd.sock", d->dir);
}

/*
 * One more connection to fd.sock that never says hello: a non-blocking
 * socket, so a full accept backlog (a daemon that stopped accepting) gives
 * -1 instead of blocking the test.  Returns the fd or -1.
 */
static int idle_conn(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC,
	               0);
	if (s < 0)
		return -1;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(s);
		return -1;
	}
	return s;
}

/* Lines of the daemon's log that contain text (NULL: all lines). */
static int log_count(const struct th_daemon *d, const char *text)
{
	char line[2048];
	int n = 0;
	FILE *f = fopen(d->log, "r");
	T_ASSERT(f);
	while (fgets(line, sizeof(line), f))
		n += !text || strstr(line, text) != NULL;
	fclose(f);
	return n;
}

/*
 * Marks in seen[] (fd < nfd) every socket of this process connected to
 * fd.sock of d; returns how many.  A client's handle channel is found this
 * way: the one marked after kvt_connect and not before.
 */
static int fdsock_fds(const struct th_daemon *d, unsigned char *seen, int nfd)
{
	char path[600];
	int n = 0;
	fd_sock_path(d, path, sizeof(path));
	for (int fd = 0; fd < nfd; fd++) {
		struct sockaddr_un sa;
		socklen_t len = sizeof(sa);
		int type = 0;
		socklen_t tl = sizeof(type);
		seen[fd] = 0;
		if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) ||
		    type != SOCK_SEQPACKET)
			continue;
		memset(&sa, 0, sizeof(sa));
		if (getpeername(fd, (struct sockaddr *)&sa, &len) ||
		    sa.sun_family != AF_UNIX || strcmp(sa.sun_path, path))
			continue;
		seen[fd] = 1;
		n++;
	}
	return n;
}

#define SCAN_FDS 4096

/* Connects a client and returns its handle-channel fd in *hfd. */
static kvt_client *connect_find_hfd(const struct th_daemon *d,
                                    const struct kvt_config *cfg, int *hfd)
{
	static unsigned char before[SCAN_FDS], after[SCAN_FDS];
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	fdsock_fds(d, before, SCAN_FDS);
	T_OK(kvt_connect(cfg, &c, err));
	fdsock_fds(d, after, SCAN_FDS);
	*hfd = -1;
	for (int fd = 0; fd < SCAN_FDS; fd++)
		if (after[fd] && !before[fd]) {
			T_EQ(*hfd, -1); /* exactly one new channel */
			*hfd = fd;
		}
	T_ASSERT(*hfd >= 0);
	return c;
}

/* One decode step of one token on seq (no K/V written: only the counts
 * matter here). */
static int step(kvt_client *c, kvt_seq seq)
{
	struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
	return kvt_sync(c, &it, 1);
}

/* Polls a stat until it equals want (at most ms); returns the last. */
static uint64_t wait_stat(const struct th_daemon *d, const char *key,
                          uint64_t want, int ms)
{
	uint64_t v = 0;
	for (double end = (double)th_now_ms() + ms; (double)th_now_ms() < end; th_sleep_ms(50))
		if ((v = th_stat(d, key)) == want)
			break;
	return v;
}

/* 1 when the daemon hung up on fd within ms (EOF or reset). */
static int hung_up(int fd, int ms)
{
	struct handle_msg m;
	int got = -1;
	for (double end = (double)th_now_ms() + ms; (double)th_now_ms() < end;) {
		int rc = handle_recv(fd, &m, &got, 100);
		if (got >= 0)
			close(got);
		if (rc == KVT_ECONN)
			return 1;
		if (rc && rc != KVT_ETIMEDOUT && rc != KVT_EPROTO)
			return 0;
	}
	return 0;
}

/* ------------------------------------------------------- idle flood */

#define FLOOD_CONNS 400 /* more than the daemon's 256 fds */

/*
 * The daemon runs with RLIMIT_NOFILE 256 (soft and hard), pool 64M (32
 * chunks), max_tenants 8 and stats_max_conns 16: by the documented rule it
 * needs 32 + 4 x 8 + 3 + 16 + 2 x (256 + 16) + 64 = 691 fds, so
 * max_pending_conns (256) is lowered to (256 - 179) / 2 = 38.  400 idle
 * connections are opened and kept: the daemon must not spin on failed
 * accepts (its log stays small), a healthy client still registers and
 * syncs (its connection evicts the oldest idle one, idle for over 1 s),
 * and kvtrimctl stats answers.
 */
TEST_T(hostile_fd, idle_flood_beyond_the_fd_limit, 90)
{
	static int conns[FLOOD_CONNS];
	struct th_daemon d;
	char path[600], out[4096], err[KVT_ERRTEXT_MAX];
	const char *extra[] = {"--max-tenants", "8", "--stats-max-conns", "16",
	                       "--hello-timeout-ms", "60000", NULL};
	th_daemon_set_nofile(256);
	th_daemon_start(&d, "64M", extra);
	th_daemon_set_nofile(0);
	fd_sock_path(&d, path, sizeof(path));

	/* Open them all within 15 s; a full backlog is retried. */
	int n = 0;
	for (double end = (double)th_now_ms() + 15000; n < FLOOD_CONNS && (double)th_now_ms() < end;) {
		int fd = idle_conn(path);
		if (fd < 0) {
			th_sleep_ms(5);
			continue;
		}
		conns[n++] = fd;
	}
	T_EQ(n, FLOOD_CONNS);
	/* Every connection beyond the 38 slots is refused or evicts one; up
	 * to 16 refused ones are kept to be told why at their hello.  The
	 * daemon takes at most SRV_REFUSALS_PER_TICK (32) refusals a tick, so
	 * the flood drains from the backlog over a second or so. */
	for (double end = (double)th_now_ms() + 15000;
	     th_stat(&d, "handle_pending_refusals_total") < FLOOD_CONNS - 38 &&
	     (double)th_now_ms() < end;)
		th_sleep_ms(50);
	T_ASSERT(th_stat(&d, "handle_pending_refusals_total") >=
	         FLOOD_CONNS - 38);
	th_sleep_ms(1500); /* every idle one is now past the 1 s grace */
	T_ASSERT(log_count(&d, "accept failed") < 100);
	T_ASSERT(th_stat(&d, "clients_connected") <= 38 + 16);

	struct kvt_config cfg = th_small_cfg(&d, "healthy", "streaming:tokens=8");
	kvt_client *c;
	kvt_seq seq;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	for (int i = 0; i < 5; i++)
		T_OK(step(c, seq));
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats", th_bin("kvtrimctl")), 0);
	T_ASSERT(strstr(out, "tenants 1\n"));
	kvt_disconnect(c);

	for (int i = 0; i < n; i++)
		close(conns[i]);
	T_ASSERT(log_count(&d, "accept failed") < 100);
	T_ASSERT(log_count(&d, NULL) < 100);
	T_EQ(log_count(&d, "max_pending_conns is lowered to 38"), 1);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ------------------------------------------------------ junk flood */

#define JUNK_PACKETS 100000

/*
 * Sends up to JUNK_PACKETS 16-byte junk packets on fd (never blocking the
 * test: a full buffer waits 100 ms for room), a healthy sync after every
 * 5000.  Returns how many went out before the daemon hung up, or -1 when
 * it never did.
 */
static int junk_flood(int fd, kvt_client *healthy, kvt_seq seq)
{
	unsigned char junk[16];
	memset(junk, 0xa5, sizeof(junk));
	int sent = 0;
	for (double end = (double)th_now_ms() + 20000; sent < JUNK_PACKETS &&
	                                    (double)th_now_ms() < end;) {
		ssize_t w = send(fd, junk, sizeof(junk),
		                 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			poll(&p, 1, 100);
			continue;
		}
		if (w < 0)
			return sent; /* EPIPE / ECONNRESET: disconnected */
		if (++sent % 5000 == 0)
			T_OK(step(healthy, seq));
	}
	return -1;
}

/*
 * A registered tenant writes 100,000 junk packets on its handle channel: the
 * daemon disconnects it at the first (its lease ends, its pages return,
 * logged once, counted once), and another tenant's syncs work throughout.
 */
TEST_T(hostile_fd, junk_flood_disconnects_the_sender, 60)
{
	struct th_daemon d;
	char out[4096], err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config hc = th_small_cfg(&d, "healthy", "streaming:tokens=8");
	struct kvt_config fc = th_small_cfg(&d, "flooder", "streaming:tokens=8");
	kvt_client *healthy, *flooder;
	kvt_seq hs, fs;
	int hfd;
	T_OK(kvt_connect(&hc, &healthy, err));
	T_OK(kvt_seq_open(healthy, &hs));
	T_OK(step(healthy, hs));
	flooder = connect_find_hfd(&d, &fc, &hfd);
	T_OK(kvt_seq_open(flooder, &fs));
	T_OK(step(flooder, fs));
	T_EQ_U64(th_stat(&d, "tenants"), 2);
	T_EQ_U64(th_stat(&d, "pool_chunks_used"), 2);

	int sent = junk_flood(hfd, healthy, hs);
	T_ASSERT(sent >= 0); /* the daemon hung up */
	T_ASSERT(sent < JUNK_PACKETS);
	T_EQ_U64(wait_stat(&d, "tenants", 1, 5000), 1);
	T_EQ_U64(th_stat(&d, "pool_chunks_used"), 1); /* its chunk came back */
	T_EQ_U64(th_stat(&d, "handle_violations_total"), 1);
	T_EQ(log_count(&d, "'flooder' (pid"), 1);
	T_EQ(log_count(&d, "it sent a malformed packet"), 1);

	/* The flooder learns it at its next calls; the other one syncs on. */
	int rc = step(flooder, fs);
	T_ASSERT(rc == KVT_ENOTENANT || rc == KVT_ECONN);
	T_ERR(step(flooder, fs), KVT_ECONN);
	for (int i = 0; i < 5; i++)
		T_OK(step(healthy, hs));
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(flooder);
	kvt_disconnect(healthy);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * What the protocol never asks for ends the connection at once: a packet
 * before the hello (here a well-formed WELCOME sent back), and, from a
 * registered tenant, a CHUNK_CLOSED naming a serial it was never given
 * (on every backend: serials are only given to revoked legacy-IPC
 * chunks, and this tenant had none revoked).
 */
TEST(hostile_fd, unasked_packets_disconnect)
{
	struct th_daemon d;
	char path[600], out[4096];
	struct handle_msg m;
	int fd, got;
	th_daemon_start(&d, "64M", NULL);
	fd_sock_path(&d, path, sizeof(path));

	T_OK(handle_connect(path, &fd));
	T_OK(handle_recv(fd, &m, &got, 2000));
	T_EQ(m.type, HANDLE_WELCOME);
	T_OK(handle_send(fd, &m, -1));
	T_ASSERT(hung_up(fd, 3000)); /* not after hello_timeout_ms (10 s) */
	close(fd);
	T_EQ_U64(th_stat(&d, "handle_violations_total"), 1);

	/* The process that broke the protocol is barred from registering,
	 * 1 s the first time: told why, and nothing is created. */
	struct kvt_config cfg = th_small_cfg(&d, "confused", "full");
	kvt_client *c;
	kvt_seq seq;
	int hfd;
	char err[KVT_ERRTEXT_MAX];
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EPERM);
	T_ASSERT(strstr(err, "broke the handle-channel protocol"));
	T_EQ_U64(th_stat(&d, "tenants"), 0);
	T_EQ_U64(th_stat(&d, "handle_barred_refusals_total"), 1);
	th_sleep_ms(1100);
	c = connect_find_hfd(&d, &cfg, &hfd);
	T_OK(kvt_seq_open(c, &seq));
	struct handle_ext x;
	memset(&x, 0, sizeof(x));
	x.h.magic = HANDLE_MAGIC;
	x.h.type = HANDLE_CHUNK_CLOSED;
	x.h.cookie = 12345;
	T_OK(handle_send_ext(hfd, &x, -1));
	T_EQ_U64(wait_stat(&d, "tenants", 0, 5000), 0);
	T_EQ_U64(th_stat(&d, "handle_violations_total"), 2);
	T_EQ_U64(th_stat(&d, "pool_chunks_used"), 0);
	T_EQ(log_count(&d, "CHUNK_CLOSED 12345 for no chunk awaiting it"), 1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* -------------------------------------------------- runtime dir lock */

/* kvt_connect, one sequence, two syncs, disconnect. */
static void serves(const struct th_daemon *d, const char *name)
{
	char err[KVT_ERRTEXT_MAX];
	struct kvt_config cfg = th_small_cfg(d, name, "streaming:tokens=8");
	kvt_client *c;
	kvt_seq seq;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	T_OK(step(c, seq));
	T_OK(step(c, seq));
	kvt_disconnect(c);
}

/*
 * A second kvtrimd on a live runtime dir exits with status 1 and says who
 * holds it, leaving the first one's sockets alone; after a SIGKILL (the
 * lock file stays, the kernel drops the lock) a new daemon takes the dir
 * over and serves; a clean stop removes the sockets and the lock file.
 */
TEST_T(hostile_fd, one_daemon_per_runtime_dir, 60)
{
	struct th_daemon d;
	char out[4096], want[640], lock[600];
	struct stat st;
	th_daemon_start(&d, "32M", NULL);
	snprintf(lock, sizeof(lock), "%s/kvtrimd.lock", d.dir);
	snprintf(want, sizeof(want), "runtime dir %s is in use by kvtrimd pid %d",
	         d.dir, (int)d.pid);
	/* `timeout`: a daemon that took the dir over would serve forever. */
	int rc = th_sh(NULL, out, sizeof(out), "timeout 10 %s --runtime-dir %s "
	               "--backend %s --pool-size 32M", th_bin("kvtrimd"), d.dir,
	               th_backend());
	T_EQ(rc, 1);
	if (!strstr(out, want))
		th_fail(__FILE__, __LINE__, "expected \"%s\" in:\n%s", want,
		        out);
	T_ASSERT(th_daemon_alive(&d));
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats", th_bin("kvtrimctl")), 0);
	serves(&d, "first");

	th_daemon_kill(&d);
	T_OK(stat(lock, &st)); /* left behind, but unlocked */
	th_daemon_start(&d, "32M", NULL);
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats", th_bin("kvtrimctl")), 0);
	serves(&d, "second");
	T_EQ(th_sh(NULL, out, sizeof(out), "cat %s", lock), 0);
	T_EQ(atoi(out), (int)d.pid);
	T_EQ(th_daemon_stop(&d), 0);
	T_EQ(stat(lock, &st), -1);
	snprintf(lock, sizeof(lock), "%s/fd.sock", d.dir);
	T_EQ(stat(lock, &st), -1);
}

/* The exit status of d's daemon once it exits by itself within ms, else
 * -1 (and it is killed).  d->pid is 0 after. */
static int exits_within(struct th_daemon *d, int ms)
{
	int status;
	for (int i = 0; i < ms / 10; i++) {
		if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
			d->pid = 0;
			return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		}
		th_sleep_ms(10);
	}
	th_daemon_kill(d);
	return -1;
}

/*
 * The runtime dir removed under a live kvtrimd (stopped, so it cannot
 * notice yet): a second kvtrimd on the same path is still refused, naming
 * the first, whose abstract claim outlives the dir.  Running again, the
 * first one notices within seconds, logs that the dir was lost and exits
 * with status 1; then a new daemon takes the path.  Removing only ctl.ipc
 * is noticed the same way, and the daemon leaves alone the file someone
 * put in its place.
 */
TEST_T(hostile_fd, removed_runtime_dir_keeps_its_owner, 60)
{
	struct th_daemon d;
	char out[4096], want[640], path[600];
	struct stat st;
	th_daemon_start(&d, "32M", NULL);
	T_EQ(kill(d.pid, SIGSTOP), 0);
	T_EQ(th_sh(NULL, out, sizeof(out), "rm -rf %s", d.dir), 0);
	snprintf(want, sizeof(want), "runtime dir %s is in use by kvtrimd pid %d",
	         d.dir, (int)d.pid);
	int rc = th_sh(NULL, out, sizeof(out), "timeout 10 %s --runtime-dir %s "
	               "--backend %s --pool-size 32M", th_bin("kvtrimd"), d.dir,
	               th_backend());
	T_EQ(rc, 1);
	if (!strstr(out, want))
		th_fail(__FILE__, __LINE__, "expected \"%s\" in:\n%s", want,
		        out);
	T_EQ(kill(d.pid, SIGCONT), 0);
	T_EQ(exits_within(&d, 10000), 1);
	T_EQ(th_sh(NULL, out, sizeof(out), "cat %s", d.log), 0);
	T_ASSERT(strstr(out, "lost: kvtrimd.lock was removed or replaced"));
	th_daemon_start(&d, "32M", NULL);
	serves(&d, "after");

	/* Only ctl.ipc goes, and a plain file takes its name. */
	snprintf(path, sizeof(path), "%s/ctl.ipc", d.dir);
	T_EQ(unlink(path), 0);
	T_EQ(th_sh(NULL, out, sizeof(out), "echo mine > %s", path), 0);
	T_EQ(exits_within(&d, 10000), 1);
	T_EQ(th_sh(NULL, out, sizeof(out), "cat %s", d.log), 0);
	T_ASSERT(strstr(out, "lost: ctl.ipc was removed or replaced"));
	T_EQ(stat(path, &st), 0); /* not the daemon's to remove */
	snprintf(path, sizeof(path), "%s/fd.sock", d.dir);
	T_EQ(stat(path, &st), -1); /* its own files are gone */
}
