/*
 * test_hostile_uid.c — one uid holding many connections without a tenant
 * on ctl.ipc or fd.sock, against the real daemon: it gets its share
 * (max_pending_per_uid) and no more, a client of another uid still
 * connects and registers, at max_pending_conns the uid holding the most
 * gives one up to a newcomer of another, and a refused client is told
 * which limit refused it (KVT_EBUSY and the limit's name, from
 * kvt_connect and from kvtrimctl), not a shut connection
 * (docs/protocol.md, "Connection limits" and "Limits of the handle
 * channel").
 *
 * Root is an admin by default, and admins pass these limits: the hog and
 * the newcomer are other uids (group root, so the 0660 sockets open).
 * nng must not run in this process before a fork: every client is a
 * child, every figure comes from kvtrimctl.
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "handle.h"
#include "kvtrim.h"
#include "test.h"

#define HOG_UID 4242
#define OTHER_UID 4243

static void skip_unless_root_cpu(void)
{
	if (geteuid() != 0)
		T_SKIP("needs root to act as other uids");
	if (!strcmp(th_backend(), "cuda") && getenv("KVTRIM_CUDA_EMU"))
		T_SKIP("cuda emulator: a client of another uid cannot open "
		       "the root daemon's emulated device memory");
}

/* In a child: becomes uid, group root (the sockets' group). */
static void become(uid_t uid)
{
	gid_t g0[] = {0};
	if (setgroups(1, g0) || setgid(0) || setuid(uid))
		_exit(99);
}

/*
 * Forks a process of uid holding n connections to sock ("ctl.ipc": the SP
 * header, then silence; "fd.sock": never a hello), those the daemon
 * refuses included, until killed.  Returns its pid once they are open.
 */
static pid_t hog(const struct th_daemon *d, uid_t uid, const char *sock,
                 int n)
{
	int go[2];
	T_EQ(pipe(go), 0);
	chmod(th_tmpdir(), 0750);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		close(go[0]);
		become(uid);
		char path[600];
		snprintf(path, sizeof(path), "%s/fd.sock", d->dir);
		for (int i = 0; i < n; i++) {
			int fd;
			if (!strcmp(sock, "ctl.ipc"))
				th_silent_peer_try(d); /* refused ones may fail */
			else if (handle_connect(path, &fd))
				_exit(98);
		}
		if (write(go[1], "x", 1) != 1)
			_exit(97);
		for (;;)
			pause();
	}
	close(go[1]);
	char b;
	T_EQ(read(go[0], &b, 1), 1);
	close(go[0]);
	return pid;
}

static void hog_end(pid_t pid)
{
	kill(pid, SIGKILL);
	T_EQ(waitpid(pid, NULL, 0), pid);
}

/*
 * Forks a client of uid that connects (kvt_connect), opens a sequence and
 * syncs it once.  Returns 0 or its KVT code; err gets kvt_connect's text.
 */
static int client_as(const struct th_daemon *d, uid_t uid, char *err,
                     size_t errlen)
{
	int out[2];
	T_EQ(pipe(out), 0);
	chmod(th_tmpdir(), 0750);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		close(out[0]);
		become(uid);
		char text[KVT_ERRTEXT_MAX] = "";
		kvt_client *c;
		kvt_seq seq;
		struct kvt_config cfg = th_small_cfg(d, "newcomer", "full");
		int rv = kvt_connect(&cfg, &c, text);
		if (!rv) {
			struct kvt_sync_item it = {.n_new = 1};
			if (!(rv = kvt_seq_open(c, &seq))) {
				it.seq = seq;
				rv = kvt_sync(c, &it, 1);
			}
			kvt_disconnect(c);
		}
		if (write(out[1], text, strlen(text)) < 0)
			_exit(97);
		_exit(rv < 0 ? -rv : 0);
	}
	close(out[1]);
	size_t got = 0;
	ssize_t n;
	while (got + 1 < errlen &&
	       (n = read(out[0], err + got, errlen - 1 - got)) > 0)
		got += (size_t)n;
	err[got] = '\0';
	close(out[0]);
	int st;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) < 97);
	return -WEXITSTATUS(st);
}

/* Waits (10 s at most) until counter key reaches n; returns it. */
static uint64_t wait_stat(const struct th_daemon *d, const char *key,
                          uint64_t n)
{
	uint64_t deadline = th_now_ms() + 10000, v;
	while ((v = th_stat(d, key)) < n && th_now_ms() < deadline)
		th_sleep_ms(50);
	return v;
}

TEST_T(hostile_uid, one_uid_gets_its_share_of_control_connections, 60)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	skip_unless_root_cpu();
	const char *extra[] = {"--max-pending-conns", "16",
	                       "--max-pending-per-uid", "6",
	                       "--hello-timeout-ms", "60000",
	                       "--allow-uids", "0,4242,4243", NULL};
	th_daemon_start(&d, "16M", extra);
	/* As many as the whole socket admits: 6 are its, 10 refused. */
	pid_t h = hog(&d, HOG_UID, "ctl.ipc", 16);
	T_ASSERT(wait_stat(&d, "control_conns_refused_total", 10) >= 10);
	T_EQ(th_stat(&d, "control_conns_refused_total"), 10);
	T_EQ(th_stat(&d, "control_connections"), 7); /* and kvtrimctl's */
	/* Another uid connects and registers. */
	T_OK(client_as(&d, OTHER_UID, err, sizeof(err)));
	/* One more of the hog's uid is told why, not shut. */
	T_ERR(client_as(&d, HOG_UID, err, sizeof(err)), KVT_EBUSY);
	T_ASSERT(strstr(err, "max_pending_per_uid (6)"));
	T_ASSERT(strstr(err, "ctl.ipc"));
	T_ASSERT(strstr(err, "uid 4242"));
	/* kvtrimctl of that uid prints it. */
	chmod(th_tmpdir(), 0750);
	T_ASSERT(th_sh(&d, out, sizeof(out), "setpriv --reuid %u --regid 0 "
	               "--clear-groups %s stats", HOG_UID,
	               th_bin("kvtrimctl")) != 0);
	T_ASSERT(strstr(out, "max_pending_per_uid"));
	T_ASSERT(strstr(out, "EBUSY"));
	T_EQ(th_stat(&d, "tenants_registered_total"), 1);
	hog_end(h);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(hostile_uid, the_uid_holding_most_gives_way_at_max_pending_conns, 60)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	skip_unless_root_cpu();
	/* The per-uid share is the whole socket: only the eviction at
	 * max_pending_conns lets the newcomer in. */
	const char *extra[] = {"--max-pending-conns", "12",
	                       "--max-pending-per-uid", "12",
	                       "--hello-timeout-ms", "60000",
	                       "--allow-uids", "0,4243", NULL};
	th_daemon_start(&d, "16M", extra);
	pid_t h = hog(&d, HOG_UID, "ctl.ipc", 12);
	/* (kvtrimctl's own connection is root's: an admin passes) */
	uint64_t deadline = th_now_ms() + 10000;
	while (th_stat(&d, "control_connections") < 13 &&
	       th_now_ms() < deadline)
		th_sleep_ms(50);
	T_EQ(th_stat(&d, "control_connections"), 13);
	T_EQ(th_stat(&d, "control_conns_evicted_total"), 0);
	T_OK(client_as(&d, OTHER_UID, err, sizeof(err)));
	T_EQ(th_stat(&d, "control_conns_evicted_total"), 1);
	T_EQ(th_stat(&d, "tenants_registered_total"), 1);
	hog_end(h);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(hostile_uid, one_uid_gets_its_share_of_handle_channels, 60)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	skip_unless_root_cpu();
	const char *extra[] = {"--max-pending-conns", "16",
	                       "--max-pending-per-uid", "6",
	                       "--hello-timeout-ms", "60000",
	                       "--allow-uids", "0,4242,4243", NULL};
	th_daemon_start(&d, "16M", extra);
	pid_t h = hog(&d, HOG_UID, "fd.sock", 16);
	T_ASSERT(wait_stat(&d, "handle_pending_refusals_total", 10) >= 10);
	T_OK(client_as(&d, OTHER_UID, err, sizeof(err)));
	/* One more of the hog's uid: its handle channel was refused, and
	 * its hello says so. */
	T_ERR(client_as(&d, HOG_UID, err, sizeof(err)), KVT_EBUSY);
	T_ASSERT(strstr(err, "max_pending_per_uid (6)"));
	T_ASSERT(strstr(err, "fd.sock"));
	T_ASSERT(strstr(err, "uid 4242"));
	T_EQ(th_stat(&d, "tenants_registered_total"), 1);
	hog_end(h);
	T_EQ(th_daemon_stop(&d), 0);
}

/* A refused control connection is answered, and costs nothing more: one
 * that sends no SP header, or something else, is closed; so is one that
 * never sends its request. */
TEST_T(hostile_uid, a_refused_connection_holds_nothing, 60)
{
	struct th_daemon d;
	skip_unless_root_cpu();
	const char *extra[] = {"--max-pending-conns", "16",
	                       "--max-pending-per-uid", "2",
	                       "--hello-timeout-ms", "60000", NULL};
	th_daemon_start(&d, "16M", extra);
	pid_t h = hog(&d, HOG_UID, "ctl.ipc", 2);
	chmod(th_tmpdir(), 0750);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		become(HOG_UID);
		/* garbage instead of the SP header; then silence */
		int a = th_ctl_connect(&d), b = th_ctl_connect(&d);
		struct timeval tv = {10, 0}; /* a connection kept: fail */
		if (a < 0 || b < 0 ||
		    setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
		    setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
		    write(a, "GET / HTTP/1.0\r\n\r\n", 18) != 18)
			_exit(96);
		char buf[256];
		int closed = 0;
		for (int fd = a; fd >= 0; fd = fd == a ? b : -1) {
			/* the daemon's SP header (8 bytes), then EOF */
			ssize_t n, got = 0;
			while ((n = read(fd, buf, sizeof(buf))) > 0)
				got += n;
			closed += n == 0 && got == 8;
		}
		_exit(closed == 2 ? 0 : 95);
	}
	int st;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st));
	T_EQ(WEXITSTATUS(st), 0);
	T_EQ(th_stat(&d, "control_conns_refused_total"), 2);
	/* (2 of the hog's, kvtrimctl's own) */
	T_EQ(th_stat(&d, "control_connections"), 3);
	hog_end(h);
	T_EQ(th_daemon_stop(&d), 0);
}
