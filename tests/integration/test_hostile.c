/*
 * test_hostile.c — the control plane under hostile and faulty control
 * clients (ctl.ipc): a peer that never reads its replies, idle
 * connections that never say hello, and admin rights apart from tenant
 * rights.  Each test drives the real daemon and checks that a healthy
 * client keeps being served.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#include "daemon.h"
#include "handle.h"
#include "kvtrim.h"
#include "test.h"

/*
 * A healthy engine: registers, opens a sequence and syncs it `syncs`
 * times, each call bounded by the client timeout (3 s in th_small_cfg).
 * Returns the first error, 0 when every call succeeded.
 */
static int healthy_engine(const struct th_daemon *d, const char *name,
                          int syncs)
{
	struct kvt_config cfg = th_small_cfg(d, name, "full");
	kvt_client *c = NULL;
	char err[KVT_ERRTEXT_MAX];
	uint64_t seq;
	int rv = kvt_connect(&cfg, &c, err);
	if (rv)
		return rv;
	if ((rv = kvt_seq_open(c, &seq)))
		goto out;
	for (int i = 0; i < syncs && !rv; i++) {
		struct kvt_sync_item it = {.seq = seq, .n_new = 1};
		rv = kvt_sync(c, &it, 1);
	}
out:
	kvt_disconnect(c);
	return rv;
}

/* Waits (5 s at most) until counter key reaches at least n; returns it. */
static uint64_t wait_stat(const struct th_daemon *d, const char *key,
                          uint64_t n)
{
	uint64_t deadline = th_now_ms() + 5000, v;
	while ((v = th_stat(d, key)) < n && th_now_ms() < deadline)
		th_sleep_ms(50);
	return v;
}

/* Waits (5 s at most) until the daemon counts at most n control
 * connections (kvtrimctl's own included); returns the last count. */
static uint64_t wait_connections(const struct th_daemon *d, uint64_t n)
{
	uint64_t deadline = th_now_ms() + 5000, cc;
	while ((cc = th_stat(d, "control_connections")) > n &&
	       th_now_ms() < deadline)
		th_sleep_ms(50);
	return cc;
}

TEST_T(hostile, never_reading_peer_does_not_freeze_the_control_plane, 60)
{
	struct th_daemon d;
	const char *extra[] = {"--hello-timeout-ms", "1000", NULL};
	th_daemon_start(&d, "16M", extra);
	size_t len;
	uint8_t *req = th_stats_req(&len);
	/* Four such peers, each writing far more requests than the daemon
	 * has contexts, and never reading a byte. */
	int fds[4];
	uint32_t sent = 0;
	for (int i = 0; i < 4; i++) {
		fds[i] = th_silent_peer(&d);
		sent += th_silent_send(fds[i], req, len, 1000, 2000);
	}
	free(req);
	T_ASSERT(sent >= 300);
	/* The daemon closes them; meanwhile everybody else is served. */
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats >/dev/null",
	           th_bin("kvtrimctl")), 0);
	T_OK(healthy_engine(&d, "healthy", 20));
	/* The daemon stopped reading them once their unread replies passed
	 * its bound; the replies they hold back time out or they idle out
	 * without a tenant: the daemon closes them.  Reading drains whatever
	 * replies got through, then EOF (0), or ECONNRESET. */
	for (int i = 0; i < 4; i++) {
		uint64_t deadline = th_now_ms() + 10000;
		int closed = 0;
		char buf[65536];
		while (!closed && th_now_ms() < deadline) {
			ssize_t n = read(fds[i], buf, sizeof(buf));
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
				closed = 1;
			else if (n < 0)
				th_sleep_ms(20);
		}
		T_ASSERT(closed);
		close(fds[i]);
	}
	T_EQ(th_stat(&d, "control_conns_closed_send_timeout_total") +
	     th_stat(&d, "control_conns_closed_idle_total"), 4);
	T_ASSERT(th_stat(&d, "control_reads_paused_total") >= 4);
	/* control_requests_dropped_total is not asserted here: it counts the
	 * requests the daemon had read or taken in when it closed a peer,
	 * not those still in the kernel's socket buffer, so whether a pause
	 * fell on a frame boundary with every request read answered decides
	 * it (a CI-like run saw 0 once, in an emulated pass).  ctl_wire's
	 * tests count drops where they are deterministic. */
	T_EQ(wait_connections(&d, 1), 1);
	T_EQ(th_daemon_stop(&d), 0);
}

/* Runs kvtrimctl as uid (group root, so the 0660 sockets open). */
static int ctl_as(const struct th_daemon *d, unsigned uid, char *out,
                  size_t len, const char *args)
{
	chmod(th_tmpdir(), 0750);
	return th_sh(d, out, len, "setpriv --reuid %u --regid 0 "
	             "--clear-groups %s %s", uid, th_bin("kvtrimctl"), args);
}

TEST(hostile, tenants_are_not_admins_and_acls_change_only_in_the_file)
{
	struct th_daemon d;
	char out[4096];
	if (geteuid() != 0)
		T_SKIP("needs root to act as another uid");
	const char *extra[] = {"--allow-uids", "0,4242", NULL};
	th_daemon_start(&d, "16M", extra);
	/* A tenant user (allow_uids) can read, not drain or reconfigure. */
	T_EQ(ctl_as(&d, 4242, out, sizeof(out), "stats"), 0);
	T_EQ(ctl_as(&d, 4242, out, sizeof(out), "drain x"), 2);
	T_ASSERT(strstr(out, "EPERM") && strstr(out, "admin_uids"));
	T_EQ(ctl_as(&d, 4242, out, sizeof(out),
	            "config set allow_uids 4242"), 2);
	T_ASSERT(strstr(out, "EPERM"));
	/* Even an admin cannot rewrite the access lists from the socket. */
	static const char *const keys[] = {"allow_uids", "allow_gids",
	                                   "admin_uids", "admin_gids"};
	for (int i = 0; i < 4; i++) {
		char cmd[128];
		snprintf(cmd, sizeof(cmd), "%s config set %s 4242",
		         th_bin("kvtrimctl"), keys[i]);
		T_EQ(th_sh(&d, out, sizeof(out), "%s", cmd), 2);
		T_ASSERT(strstr(out, "EPERM") && strstr(out, "config file"));
	}
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get allow_uids",
	           th_bin("kvtrimctl")), 0);
	T_ASSERT(strstr(out, "0,4242"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set log_level info",
	           th_bin("kvtrimctl")), 0);
	T_EQ(th_daemon_stop(&d), 0);

	/* admin_uids names the admins; root is then not one, and
	 * acl_from_socket 1 lets an admin change the lists. */
	const char *extra2[] = {"--admin-uids", "4242", "--acl-from-socket",
	                        "1", NULL};
	th_daemon_start(&d, "16M", extra2);
	T_EQ(th_sh(&d, out, sizeof(out), "%s drain x", th_bin("kvtrimctl")),
	     2);
	T_ASSERT(strstr(out, "EPERM"));
	T_EQ(ctl_as(&d, 4242, out, sizeof(out), "drain x"), 2);
	T_ASSERT(strstr(out, "ENOTENANT")); /* allowed; no such tenant */
	T_EQ(ctl_as(&d, 4242, out, sizeof(out), "config set allow_uids 0"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(hostile, reply_not_taken_in_time_closes_the_connection, 60)
{
	struct th_daemon d;
	/* The in-flight bound out of the way: only the send deadline can
	 * free the contexts this peer's unread replies hold. */
	const char *extra[] = {"--max-inflight-per-conn", "1024",
	                       "--send-timeout-ms", "300", NULL};
	th_daemon_start(&d, "16M", extra);
	size_t len;
	uint8_t *req = th_stats_req(&len);
	int fd = th_silent_peer(&d);
	T_ASSERT(th_silent_send(fd, req, len, 1000, 2000) >= 300);
	free(req);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats >/dev/null",
	           th_bin("kvtrimctl")), 0);
	T_EQ(wait_stat(&d, "control_conns_closed_send_timeout_total", 1), 1);
	/* An engine of the same process is served beside it and after. */
	T_OK(healthy_engine(&d, "healthy", 20));
	/* not idle: slow */
	T_EQ(th_stat(&d, "control_conns_closed_idle_total"), 0);
	close(fd);
	T_EQ(wait_connections(&d, 1), 1);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(hostile, idle_connections_without_a_tenant_are_closed)
{
	struct th_daemon d;
	const char *extra[] = {"--hello-timeout-ms", "500", NULL};
	th_daemon_start(&d, "16M", extra);
	/* A registered tenant idles as long as it likes. */
	struct kvt_config cfg = th_small_cfg(&d, "idler", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	int fds[50];
	for (int i = 0; i < 50; i++)
		fds[i] = th_silent_peer(&d);
	uint64_t deadline = th_now_ms() + 10000;
	int closed = 0;
	while (closed < 50 && th_now_ms() < deadline) {
		closed = 0;
		for (int i = 0; i < 50; i++) {
			char b[64];
			ssize_t n = recv(fds[i], b, sizeof(b), MSG_PEEK);
			/* The daemon's SP header may sit unread; past it,
			 * EOF means closed. */
			if (n == 8)
				T_EQ(read(fds[i], b, 8), 8);
			else if (n == 0)
				closed++;
		}
		th_sleep_ms(50);
	}
	T_EQ(closed, 50);
	T_EQ(th_stat(&d, "control_conns_closed_idle_total"), 50);
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));
	kvt_disconnect(c);
	for (int i = 0; i < 50; i++)
		close(fds[i]);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(hostile, pending_connections_are_bounded_tenants_and_admins_served)
{
	struct th_daemon d;
	const char *extra[] = {"--max-pending-conns", "8", NULL};
	th_daemon_start(&d, "16M", extra);
	struct kvt_config cfg = th_small_cfg(&d, "early", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX], out[4096];
	T_OK(kvt_connect(&cfg, &c, err));
	/* Silent peers as a non-admin user fill its share of the pending
	 * slots (max_pending_per_uid: half of them); those beyond it are
	 * refused (told why, had they asked, and closed). */
	if (geteuid() != 0)
		T_SKIP("needs root to act as another uid");
	chmod(th_tmpdir(), 0750);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		gid_t g0[] = {0};
		if (setgroups(1, g0) || setgid(0) || setuid(4242))
			_exit(99);
		/* (refused ones may fail their header's write) */
		for (int i = 0; i < 20; i++)
			th_silent_peer_try(&d);
		th_sleep_ms(3000);
		_exit(0);
	}
	uint64_t deadline = th_now_ms() + 5000;
	while (th_stat(&d, "control_conns_refused_total") < 12 &&
	       th_now_ms() < deadline)
		th_sleep_ms(50);
	T_ASSERT(th_stat(&d, "control_conns_refused_total") >= 12);
	/* The registered tenant and root's kvtrimctl are still served. */
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats >/dev/null",
	           th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	int st;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(hostile, one_sync_touches_at_most_max_sync_lists)
{
	struct th_daemon d;
	const char *extra[] = {"--max-sync-lists", "8", NULL};
	th_daemon_start(&d, "16M", extra);
	/* 2 layers x 2 KV heads: 4 lists a sequence. */
	struct kvt_config cfg = th_small_cfg(&d, "batcher", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s[3];
	for (int i = 0; i < 3; i++)
		T_OK(kvt_seq_open(c, &s[i]));
	struct kvt_sync_item it[3];
	for (int i = 0; i < 3; i++)
		it[i] = (struct kvt_sync_item){s[i], 1, KVT_PHASE_DECODE, 0, 0};
	T_ERR(kvt_sync(c, it, 3), KVT_ETOOBIG); /* 12 lists */
	T_ASSERT(strstr(kvt_last_error(c), "max_sync_lists"));
	/* Nothing was applied: the same items, two at a time, go through
	 * with the counters they had, and so does one layer of all three. */
	T_OK(kvt_sync(c, it, 2));
	T_OK(kvt_sync(c, &it[2], 1));
	struct kvt_sync_item l0[3];
	for (int i = 0; i < 3; i++)
		l0[i] = (struct kvt_sync_item){s[i], 1, KVT_PHASE_PREFILL, 0, 1};
	T_OK(kvt_sync(c, l0, 3)); /* 3 x 1 layer x 2 heads = 6 lists */
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);

	const char *tiny[] = {"--max-sync-lists", "3", NULL};
	th_daemon_start(&d, "16M", tiny);
	cfg = th_small_cfg(&d, "too-deep", "full");
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EGEOMETRY);
	T_ASSERT(strstr(err, "max_sync_lists"));
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------- heavy syncs */

struct heavy {
	const struct th_daemon *d;
	int syncs;
	uint64_t min_ms, max_ms; /* of its own syncs */
	int rv;
	int done_one; /* atomic: its first sync has returned */
};

/*
 * A tenant whose every sync touches max_sync_lists lists: 64 layers x 64
 * KV heads = 4096 lists a sequence, HEAVY_SEQS sequences, 16 new entries
 * each, a streaming budget that evicts at every sync.
 */
#define HEAVY_SEQS 64
static void *heavy_run(void *arg)
{
	struct heavy *h = arg;
	struct kvt_config cfg = th_small_cfg(h->d, "heavy",
	                                     "streaming:sinks=4,tokens=16");
	cfg.geo = (struct kvt_geometry){64, 64, 64, 4, 64};
	cfg.dtype = KVT_DTYPE_F16;
	cfg.page_tokens = 16;
	cfg.max_seqs = HEAVY_SEQS;
	cfg.max_tokens = 64;
	cfg.headroom = 16;
	cfg.timeout_ms = 20000;
	cfg.quota_bytes = 256ull << 20;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	kvt_seq seq[HEAVY_SEQS];
	struct kvt_sync_item it[HEAVY_SEQS];
	h->min_ms = UINT64_MAX;
	if ((h->rv = kvt_connect(&cfg, &c, err)))
		return NULL;
	for (int i = 0; i < HEAVY_SEQS && !h->rv; i++) {
		h->rv = kvt_seq_open(c, &seq[i]);
		it[i] = (struct kvt_sync_item){seq[i], 16, KVT_PHASE_DECODE, 0,
		                               0};
	}
	for (int k = 0; k < h->syncs && !h->rv; k++) {
		uint64_t t0 = th_now_ms();
		h->rv = kvt_sync(c, it, HEAVY_SEQS);
		uint64_t ms = th_now_ms() - t0;
		h->min_ms = ms < h->min_ms ? ms : h->min_ms;
		h->max_ms = ms > h->max_ms ? ms : h->max_ms;
		__atomic_store_n(&h->done_one, 1, __ATOMIC_RELEASE);
	}
	kvt_disconnect(c);
	return NULL;
}

TEST_T(hostile, a_heavy_tenants_syncs_do_not_delay_the_others, 120)
{
	struct th_daemon d;
	if (getenv("KVTRIM_CUDA_EMU"))
		T_SKIP("cuda emulator: every device call holds one lock and "
		       "kernels run on the host, so the heavy tenant's "
		       "compaction stalls the others' device calls (a GPU "
		       "does not); make gpu-check runs it on a device");
	const char *extra[] = {"--max-sync-lists", "262144",
	                       "--expected-tenants", "1", NULL};
	th_daemon_start(&d, "512M", extra);
	struct heavy h = {.d = &d, .syncs = 12};
	pthread_t th;
	T_EQ(pthread_create(&th, NULL, heavy_run, &h), 0);
	/* A light tenant syncs one entry at a time while the heavy one
	 * works; it is served between (not after) the heavy syncs. */
	struct kvt_config cfg = th_small_cfg(&d, "light", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	kvt_seq seq;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	uint64_t deadline = th_now_ms() + 60000;
	while (th_stat(&d, "syncs_offloaded_total") == 0 &&
	       th_now_ms() < deadline)
		th_sleep_ms(10);
	uint64_t worst = 0;
	int n = 0;
	/* While the heavy tenant runs (its first sync returned before the
	 * light one stops), and at least 40 syncs. */
	for (; n < 2000 && (n < 40 || !__atomic_load_n(&h.done_one,
	                                               __ATOMIC_ACQUIRE));
	     n++) {
		struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
		uint64_t t0 = th_now_ms();
		T_OK(kvt_sync(c, &it, 1));
		uint64_t ms = th_now_ms() - t0;
		worst = ms > worst ? ms : worst;
		if (n % 16 == 15) { /* keep its list short: reopen */
			T_OK(kvt_seq_close(c, seq));
			T_OK(kvt_seq_open(c, &seq));
		}
		th_sleep_ms(5);
	}
	T_EQ(pthread_join(th, NULL), 0);
	T_OK(h.rv);
	kvt_disconnect(c);
	fprintf(stderr, "    heavy syncs %" PRIu64 "..%" PRIu64 " ms, light "
	        "worst %" PRIu64 " ms over %d syncs\n", h.min_ms, h.max_ms,
	        worst, n);
	if (h.min_ms < 40)
		T_SKIP("the heavy sync is too quick on this machine to tell");
	T_ASSERT(th_stat(&d, "syncs_offloaded_total") >= 12);
	T_ASSERT(worst < h.min_ms / 2);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(hostile, a_reconnecting_flood_leaves_nothing_behind, 90)
{
	/* kvtrim-bench's never_reading adversary: four connections writing
	 * requests as fast as the socket takes them, never reading, each
	 * reopened when the daemon closes it; 8 s of it.  Each connection is
	 * closed once a reply has waited send_timeout_ms (2 s) without the
	 * kernel taking a byte, a cycle of 2-4 s under ASan on a loaded machine: at
	 * least 6 closes (4, and some of the reconnected ones again) show
	 * the reconnects were closed too (CI saw 6 s give fewer than 8). */
	struct th_daemon d;
	const char *extra[] = {"--hello-timeout-ms", "1000", NULL};
	th_daemon_start(&d, "16M", extra);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "timeout -s KILL 8 %s --adversary "
	           "never_reading --runtime-dir %s >/dev/null 2>&1; true",
	           th_bin("kvtrim-bench"), d.dir), 0);
	uint64_t closes = th_stat(&d, "control_conns_closed_send_timeout_total") +
	                  th_stat(&d, "control_conns_closed_idle_total");
	fprintf(stderr, "    %" PRIu64 " connections closed in 8 s\n", closes);
	T_ASSERT(closes >= 6);
	/* New engines still get in, and run. */
	T_OK(healthy_engine(&d, "after", 5));
	/* Every connection it opened is gone (kvtrimctl's own stays). */
	T_EQ(wait_connections(&d, 1), 1);
	T_OK(healthy_engine(&d, "later", 5));
	T_EQ(th_daemon_stop(&d), 0);
}

/* One process with many idle connections on both sockets gets
 * max_pending_per_pid of each and no more: the rest are refused at
 * accept and evict nobody, so another process's engine gets in. */
TEST_T(hostile, one_process_holds_at_most_max_pending_per_pid, 60)
{
	struct th_daemon d;
	const char *extra[] = {"--max-pending-per-pid", "10", NULL};
	th_daemon_start(&d, "16M", extra);
	/* Root is an admin by default, and admins are exempt: the flooding
	 * process is another uid (group root, so the 0660 sockets open). */
	if (geteuid() != 0)
		T_SKIP("needs root to act as another uid");
	chmod(th_tmpdir(), 0750);
	int go[2];
	T_EQ(pipe(go), 0);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		close(go[0]);
		gid_t g0[] = {0};
		if (setgroups(1, g0) || setgid(0) || setuid(4242))
			_exit(99);
		char path[600];
		snprintf(path, sizeof(path), "%s/fd.sock", d.dir);
		for (int i = 0; i < 40; i++) {
			th_silent_peer_try(&d); /* refused ones may fail */
			int fd;
			if (handle_connect(path, &fd))
				_exit(98);
		}
		if (write(go[1], "x", 1) != 1)
			_exit(97);
		th_sleep_ms(4000);
		_exit(0);
	}
	close(go[1]);
	char b;
	T_EQ(read(go[0], &b, 1), 1);
	close(go[0]);
	uint64_t deadline = th_now_ms() + 5000;
	while ((th_stat(&d, "control_conns_refused_total") < 30 ||
	        th_stat(&d, "handle_pending_refusals_total") < 30) &&
	       th_now_ms() < deadline)
		th_sleep_ms(50);
	T_EQ(th_stat(&d, "control_conns_refused_total"), 30);
	T_EQ(th_stat(&d, "handle_pending_refusals_total"), 30);
	/* 10 of its own, kvtrimctl's for th_stat */
	T_ASSERT(th_stat(&d, "control_connections") <= 11);
	T_OK(healthy_engine(&d, "other", 5));
	int st;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	T_EQ(th_daemon_stop(&d), 0);
}
