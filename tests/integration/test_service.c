/*
 * test_service.c — kvtrimd as a service: systemd notification and units,
 * SIGHUP reloads, kvtrimctl's operator commands, quotas and peer
 * authentication, memory pressure with backpressure, and a daemon killed
 * under a syncing client (the stats socket: test_stats.c).  Every test
 * starts the real daemon on a scratch runtime directory.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
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

#include "config.h"
#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Pages of 256 KiB ([K 256 x 128][V 256 x 128] f32): 8 per 2 MiB chunk.
 * A sequence has 2 layers x 2 KV heads = 4 lists of one page each (the
 * headroom of 256 entries), so one chunk holds exactly two sequences.
 */
static struct kvt_config big_cfg(const struct th_daemon *d, const char *name)
{
	struct kvt_config c;
	memset(&c, 0, sizeof(c));
	c.runtime_dir = d->dir;
	c.tenant = name;
	c.geo = (struct kvt_geometry){2, 2, 2, 128, 256};
	c.dtype = KVT_DTYPE_F32;
	c.page_tokens = 256;
	c.max_seqs = 8;
	c.max_tokens = 1024;
	c.headroom = 256;
	c.policy = "full";
	c.timeout_ms = 5000;
	return c;
}

/* Polls a metric until it reaches want (at most ms); returns the last. */
static double wait_metric(const struct th_daemon *d, const char *series,
                          double want, int ms)
{
	double v = -1;
	for (int waited = 0; waited <= ms; waited += 50) {
		v = th_metric_or(d, series);
		if (v >= want)
			return v;
		sleep_ms(50);
	}
	return v;
}

static int log_has(const struct th_daemon *d, const char *text)
{
	char out[1 << 16];
	th_sh(NULL, out, sizeof(out), "cat %s", d->log);
	return strstr(out, text) != NULL;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fputs(text, f);
	T_ASSERT(fclose(f) == 0);
}

/* ---------------------------------------------------------------- systemd */

/* A datagram socket standing in for systemd's notification socket. */
static int notify_socket(char *path, size_t len)
{
	struct sockaddr_un sa;
	snprintf(path, len, "%s/notify.sock", th_tmpdir());
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	T_ASSERT(strlen(path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	T_ASSERT(fd >= 0);
	T_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/*
 * Reads datagrams for up to ms, appending each to log (one per line),
 * until one contains want (returns 1) or time runs out (0).
 */
static int notify_wait(int fd, const char *want, int ms, char *log,
                       size_t loglen)
{
	double end = now_ms() + ms;
	for (;;) {
		int left = (int)(end - now_ms());
		if (left <= 0)
			return 0;
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, left) <= 0)
			return 0;
		char buf[512];
		ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		size_t l = strlen(log);
		snprintf(log + l, loglen - l, "%s\n", buf);
		if (strstr(buf, want))
			return 1;
	}
}

TEST(systemd, notify_ready_status_watchdog_reload_stopping)
{
	struct th_daemon d;
	char path[512], log[16384] = "", sock[600];
	struct stat st;
	int fd = notify_socket(path, sizeof(path));
	setenv("NOTIFY_SOCKET", path, 1);
	setenv("WATCHDOG_USEC", "200000", 1); /* a ping every 100 ms */
	th_daemon_spawn(&d, "16M", NULL);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");

	if (!notify_wait(fd, "READY=1", 5000, log, sizeof(log)))
		th_fail(__FILE__, __LINE__, "no READY=1; got:\n%s", log);
	/* READY means serving: every socket is there and answers. */
	static const char *const socks[] = {"ctl.ipc", "fd.sock", "stats.sock"};
	for (int i = 0; i < 3; i++) {
		snprintf(sock, sizeof(sock), "%s/%s", d.dir, socks[i]);
		T_EQ(stat(sock, &st), 0);
	}
	T_EQ(th_http(&d, NULL, "/metrics", NULL, 0), 200);
	T_ASSERT(strstr(log, "STATUS=tenants=0 sequences=0 pool=0.0MiB/16.0MiB"));

	/* Watchdog pings at half of WATCHDOG_USEC. */
	int pings = 0;
	double t0 = now_ms();
	while (now_ms() - t0 < 1000) {
		char one[4096] = "";
		if (notify_wait(fd, "WATCHDOG=1", 300, one, sizeof(one)))
			pings++;
	}
	T_ASSERT(pings >= 5 && pings <= 15);

	/* STATUS follows the tenants (refreshed every second). */
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	struct kvt_config cfg = th_small_cfg(&d, "notified", "full");
	kvt_seq seq;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	if (!notify_wait(fd, "STATUS=tenants=1 sequences=1 pool=2.0MiB", 3000,
	                 log, sizeof(log)))
		th_fail(__FILE__, __LINE__, "no STATUS with the tenant:\n%s",
		        log);

	/* SIGHUP: RELOADING=1, then READY=1 again. */
	log[0] = '\0';
	kill(d.pid, SIGHUP);
	T_ASSERT(notify_wait(fd, "RELOADING=1", 3000, log, sizeof(log)));
	T_ASSERT(notify_wait(fd, "READY=1", 3000, log, sizeof(log)));

	log[0] = '\0';
	T_EQ(th_daemon_stop(&d), 0);
	T_ASSERT(notify_wait(fd, "STOPPING=1", 1000, log, sizeof(log)));
	kvt_disconnect(c);
	close(fd);
}

TEST(systemd, without_notify_socket_nothing_is_sent)
{
	/* The default path of every other test: no NOTIFY_SOCKET, no
	 * watchdog, and the log says nothing about sd_notify failing. */
	struct th_daemon d;
	unsetenv("NOTIFY_SOCKET");
	th_daemon_start(&d, "8M", NULL);
	sleep_ms(200);
	T_EQ(th_daemon_stop(&d), 0);
	T_ASSERT(!log_has(&d, "sd_notify"));
	T_ASSERT(!log_has(&d, "watchdog on"));
}

TEST(systemd, unit_file_verifies_and_keeps_gpus_reachable)
{
	char out[8192], unit[600];
	FILE *f = fopen("systemd/kvtrimd.service", "r");
	if (!f)
		T_SKIP("systemd/kvtrimd.service not found (run from the repo "
		       "root)");
	static char text[16384];
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	static const char *const must[] = {
		"\nType=notify\n", "\nExecReload=/bin/kill -HUP $MAINPID\n",
		"\nRuntimeDirectory=kvtrimd\n", "\nUser=kvtrim\n",
		"\nGroup=kvtrim\n", "\nWatchdogSec=30\n",
		"\nNoNewPrivileges=yes\n", "\nProtectSystem=strict\n",
		"\nProtectHome=yes\n", "\nDevicePolicy=closed\n",
		"\nDeviceAllow=char-nvidia* rw\n",
		"\nDeviceAllow=/dev/nvidiactl rw\n",
		"\nDeviceAllow=/dev/nvidia-uvm rw\n",
		"\nExecStart=/usr/local/bin/kvtrimd --config "
		"/etc/kvtrim/kvtrimd.conf",
	};
	for (size_t i = 0; i < sizeof(must) / sizeof(must[0]); i++)
		if (!strstr(text, must[i]))
			th_fail(__FILE__, __LINE__, "unit lacks %s", must[i]);
	/* PrivateDevices hides /dev/nvidia*. */
	T_ASSERT(!strstr(text, "\nPrivateDevices=yes"));
	T_ASSERT(!strstr(text, "\nPrivateDevices=true"));

	if (th_sh(NULL, out, sizeof(out), "command -v systemd-analyze") != 0)
		T_SKIP("systemd-analyze is not installed");
	/* verify insists the ExecStart binary exists: point it at ours. */
	char abs[512];
	T_ASSERT(realpath(th_bin("kvtrimd"), abs));
	snprintf(unit, sizeof(unit), "%s/kvtrimd.service", th_tmpdir());
	T_EQ(th_sh(NULL, out, sizeof(out),
	           "sed 's|/usr/local/bin/kvtrimd|%s|' systemd/kvtrimd.service "
	           "> %s", abs, unit), 0);
	int rc = th_sh(NULL, out, sizeof(out), "systemd-analyze verify %s",
	               unit);
	if (rc != 0 || strstr(out, "kvtrimd.service"))
		th_fail(__FILE__, __LINE__, "systemd-analyze verify (%d):\n%s",
		        rc, out);
}

TEST(systemd, sysusers_and_tmpfiles_apply_in_a_scratch_root)
{
	char out[8192], su[512], tf[512];
	if (th_sh(NULL, out, sizeof(out),
	          "command -v systemd-sysusers && command -v systemd-tmpfiles")
	    != 0)
		T_SKIP("systemd-sysusers / systemd-tmpfiles not installed");
	/* With --root, relative paths would be taken inside the root. */
	if (!realpath("systemd/kvtrim.sysusers", su) ||
	    !realpath("systemd/kvtrim.tmpfiles", tf))
		T_SKIP("systemd/ files not found (run from the repo root)");
	const char *r = th_tmpdir();
	if (th_sh(NULL, out, sizeof(out), "mkdir -p %s/root/etc && "
	          "systemd-sysusers --root=%s/root %s", r, r, su) != 0)
		th_fail(__FILE__, __LINE__, "systemd-sysusers: %s", out);
	T_EQ(th_sh(NULL, out, sizeof(out), "grep -c '^kvtrim:' "
	           "%s/root/etc/passwd", r), 0);
	T_EQ(th_sh(NULL, out, sizeof(out), "grep -c '^kvtrim:' "
	           "%s/root/etc/group", r), 0);
	if (th_sh(NULL, out, sizeof(out), "systemd-tmpfiles --root=%s/root "
	          "--create %s", r, tf) != 0)
		th_fail(__FILE__, __LINE__, "systemd-tmpfiles: %s", out);
	struct stat st;
	char p[600];
	snprintf(p, sizeof(p), "%s/root/run/kvtrimd", r);
	T_EQ(stat(p, &st), 0);
	T_EQ(st.st_mode & 0777, 0750);
	snprintf(p, sizeof(p), "%s/root/etc/kvtrim", r);
	T_EQ(stat(p, &st), 0);
}

/* Every key of the config table is documented in the example, and the
 * example's "#key = value" lines, uncommented, are exactly the defaults. */
TEST(systemd, example_config_documents_every_key_with_its_default)
{
	static char text[32768];
	char line[512], path[600], err[256];
	FILE *f = fopen("systemd/kvtrimd.conf", "r");
	if (!f)
		T_SKIP("systemd/kvtrimd.conf not found (run from the repo root)");
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	text[n] = '\0';
	fclose(f);
	snprintf(path, sizeof(path), "%s/uncommented.conf", th_tmpdir());
	FILE *o = fopen(path, "w");
	T_ASSERT(o);
	for (size_t i = 0; i < config_count(); i++) {
		const struct config_entry *e = config_at(i);
		char want[128];
		snprintf(want, sizeof(want), "\n#%s =", e->name);
		if (!strstr(text, want))
			th_fail(__FILE__, __LINE__, "kvtrimd.conf does not "
			        "document %s", e->name);
		const char *p = strstr(text, want) + 2;
		size_t l = strcspn(p, "\n");
		T_ASSERT(l < sizeof(line));
		memcpy(line, p, l);
		line[l] = '\0';
		const char *eq = strchr(line, '=');
		if (eq[1] && eq[2]) /* a value is shown */
			fprintf(o, "%s\n", line);
	}
	fclose(o);
	struct config def, ex;
	config_defaults(&def);
	config_defaults(&ex);
	if (config_load_file(&ex, path, err, sizeof(err)))
		th_fail(__FILE__, __LINE__, "example does not load: %s", err);
	for (size_t i = 0; i < config_count(); i++) {
		char a[512], b[512];
		config_get(&def, config_at(i), a, sizeof(a));
		config_get(&ex, config_at(i), b, sizeof(b));
		if (strcmp(a, b))
			th_fail(__FILE__, __LINE__, "example shows %s = %s, the "
			        "default is %s", config_at(i)->name, b, a);
	}
}

TEST(systemd, sighup_applies_mutable_keeps_tenants_refuses_bad_files)
{
	struct th_daemon d;
	char conf[600], out[8192], err[KVT_ERRTEXT_MAX];
	snprintf(conf, sizeof(conf), "%s/kvtrimd.conf", th_tmpdir());
	write_file(conf, "default_quota = 2M\nhello_timeout_ms = 7000\n"
	                 "pressure_deadline_ms = 1000\n");
	/* The command line wins over the file, at start and at reload (the
	 * harness also pins --log-level info). */
	const char *extra[] = {"--config", conf, "--hello-timeout-ms", "5000",
	                       NULL};
	th_daemon_start(&d, "16M", extra);
	kvt_client *c;
	kvt_seq seq;
	struct kvt_config cfg = th_small_cfg(&d, "survivor", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	T_EQ(th_stat(&d, "tenants"), 1);

	write_file(conf, "default_quota = 4M\nhello_timeout_ms = 7000\n"
	                 "log_level = debug\n"
	                 "pressure_deadline_ms = 1500\nmax_tenants = 3\n");
	kill(d.pid, SIGHUP);
	for (int i = 0; i < 100 && th_stat(&d, "config_reloads_total") < 1; i++)
		sleep_ms(20);
	T_EQ(th_stat(&d, "config_reloads_total"), 1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get default_quota",
	           th_bin("kvtrimctl")), 0);
	T_EQ_STR(out, "default_quota 4194304\n");
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get log_level",
	           th_bin("kvtrimctl")), 0);
	T_EQ_STR(out, "log_level info\n");
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get pressure_deadline_ms",
	           th_bin("kvtrimctl")), 0);
	T_EQ_STR(out, "pressure_deadline_ms 1500\n");
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get hello_timeout_ms",
	           th_bin("kvtrimctl")), 0);
	T_EQ_STR(out, "hello_timeout_ms 5000\n");
	/* Immutable: logged, kept. */
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get max_tenants",
	           th_bin("kvtrimctl")), 0);
	T_EQ_STR(out, "max_tenants 64\n");
	T_ASSERT(log_has(&d, "max_tenants changed but cannot change while "
	                     "kvtrimd runs"));

	/* A bad file changes nothing. */
	write_file(conf, "default_quota = 8M\npool_size = 12Q\n");
	kill(d.pid, SIGHUP);
	for (int i = 0; i < 100 &&
	                th_stat(&d, "config_reload_failures_total") < 1; i++)
		sleep_ms(20);
	T_EQ(th_stat(&d, "config_reload_failures_total"), 1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get default_quota",
	           th_bin("kvtrimctl")), 0);
	T_EQ_STR(out, "default_quota 4194304\n");
	T_ASSERT(log_has(&d, "new config refused, the running one is kept"));
	T_ASSERT(log_has(&d, "pool_size"));
	/* A missing file too. */
	unlink(conf);
	kill(d.pid, SIGHUP);
	for (int i = 0; i < 100 &&
	                th_stat(&d, "config_reload_failures_total") < 2; i++)
		sleep_ms(20);
	T_EQ(th_stat(&d, "config_reload_failures_total"), 2);

	/* The tenant never noticed. */
	T_EQ(th_stat(&d, "tenants"), 1);
	struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- kvtrimctl */

TEST(ctl, config_get_and_set_through_the_table)
{
	struct th_daemon d;
	char out[16384];
	const char *ctl = th_bin("kvtrimctl");
	th_daemon_start(&d, "32M", NULL);
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get", ctl), 0);
	int lines = 0;
	for (const char *p = out; *p; p++)
		lines += *p == '\n';
	T_EQ(lines, (int)config_count());
	T_EQ(th_sh(&d, out, sizeof(out), "%s config", ctl), 0); /* old form */

	T_EQ(th_sh(&d, out, sizeof(out), "%s config set log_level debug", ctl),
	     0);
	T_EQ_STR(out, "log_level debug\n");
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set default_quota 4M", ctl),
	     0);
	T_EQ_STR(out, "default_quota 4194304\n");
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json config set "
	           "high_watermark 0.75", ctl), 0);
	T_ASSERT(strstr(out, "\"key\":\"high_watermark\",\"value\":\"0.75\","
	                     "\"mutable\":1"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get high_watermark", ctl),
	     0);
	T_EQ_STR(out, "high_watermark 0.75\n");
	T_EQ(th_stat(&d, "config_sets_total"), 3);

	/* Refusals: immutable, malformed, out of range, cross-field, unknown. */
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set pool_size 1G", ctl), 2);
	T_ASSERT(strstr(out, "restart") && strstr(out, "ENOTSUP"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set max_quota 12Q", ctl), 2);
	T_ASSERT(strstr(out, "not a size"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set high_watermark 1.5",
	           ctl), 2);
	T_ASSERT(strstr(out, "(0, 1]"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set default_quota 64M",
	           ctl), 2);
	T_ASSERT(strstr(out, "larger than pool_size"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set allow_uids "
	           "no-such-user-kvt", ctl), 2);
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set nope 1", ctl), 2);
	T_ASSERT(strstr(out, "unknown setting 'nope'"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set log_level", ctl), 2);
	T_ASSERT(strstr(out, "usage: config set KEY VALUE"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get log_level", ctl), 0);
	T_EQ_STR(out, "log_level debug\n");
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(ctl, top_refreshes_and_exits_after_iterations)
{
	struct th_daemon d;
	char out[32768], err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	kvt_seq seq;
	th_daemon_start(&d, "32M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "topper", "streaming:tokens=8");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	T_EQ(th_sh(&d, out, sizeof(out), "%s top --iterations 3 --interval 50",
	           th_bin("kvtrimctl")), 0);
	int heads = 0, rows = 0;
	for (const char *p = out; (p = strstr(p, "kvtrimd 0.1.0")); p++)
		heads++;
	for (const char *p = out; (p = strstr(p, " topper ")); p++)
		rows++;
	T_EQ(heads, 3);
	T_EQ(rows, 3);
	T_ASSERT(strstr(out, "SYNC/s"));
	T_ASSERT(!strchr(out, '\033')); /* not a terminal: no escapes */
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json top --iterations 2 "
	           "--interval 10", th_bin("kvtrimctl")), 0);
	T_ASSERT(!strncmp(out, "{\"stats\":{", 10));
	T_ASSERT(strstr(out, "}]}\n{\"stats\":{"));
	T_ASSERT(strstr(out, "\"name\":\"topper\""));
	T_EQ(th_sh(&d, out, sizeof(out), "%s top --iterations 0",
	           th_bin("kvtrimctl")), 2);
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats --iterations 2",
	           th_bin("kvtrimctl")), 2);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(ctl, help_errors_and_unreachable_daemon)
{
	char out[16384];
	const char *ctl = th_bin("kvtrimctl");
	T_EQ(th_sh(NULL, out, sizeof(out), "%s --help", ctl), 0);
	static const char *const words[] = {"stats", "top", "tenants",
	                                    "config get", "config set KEY VALUE",
	                                    "check", "drain TENANT", "--json",
	                                    "--iterations", "exit status"};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		if (!strstr(out, words[i]))
			th_fail(__FILE__, __LINE__, "--help lacks %s", words[i]);
	T_EQ(th_sh(NULL, out, sizeof(out), "%s frobnicate", ctl), 2);
	T_ASSERT(strstr(out, "unknown command 'frobnicate'"));
	T_EQ(th_sh(NULL, out, sizeof(out), "%s --frob stats", ctl), 2);
	T_ASSERT(strstr(out, "unknown or incomplete option --frob"));
	T_EQ(th_sh(NULL, out, sizeof(out), "%s", ctl), 2);
	T_ASSERT(strstr(out, "usage:"));
	T_EQ(th_sh(NULL, out, sizeof(out), "%s drain", ctl), 2);
	T_ASSERT(strstr(out, "usage: drain TENANT"));
	T_EQ(th_sh(NULL, out, sizeof(out), "%s check extra", ctl), 2);
	/* Nobody listening: exit 2 and the path tried. */
	T_EQ(th_sh(NULL, out, sizeof(out), "%s --runtime-dir %s/none stats",
	           ctl, th_tmpdir()), 2);
	char want[600];
	snprintf(want, sizeof(want), "%s/none/ctl.ipc", th_tmpdir());
	T_ASSERT(strstr(out, want));
	T_EQ(th_sh(NULL, out, sizeof(out), "%s --runtime-dir %s/none metrics",
	           ctl, th_tmpdir()), 2);
	snprintf(want, sizeof(want), "%s/none/stats.sock", th_tmpdir());
	T_ASSERT(strstr(out, want));
}

TEST(ctl, drain_stops_new_sequences_and_open_ones_continue)
{
	struct th_daemon d;
	char out[16384], err[KVT_ERRTEXT_MAX];
	kvt_client *c, *other;
	kvt_seq seq, seq2;
	const char *ctl = th_bin("kvtrimctl");
	th_daemon_start(&d, "32M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "drainme", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	struct kvt_config ocfg = th_small_cfg(&d, "bystander", "full");
	T_OK(kvt_connect(&ocfg, &other, err));
	T_OK(kvt_seq_open(c, &seq));

	T_EQ(th_sh(&d, out, sizeof(out), "%s drain drainme", ctl), 0);
	T_ASSERT(strstr(out, "tenant 1 'drainme' draining"));
	T_ERR(kvt_seq_open(c, &seq2), KVT_ESHUTDOWN);
	T_ASSERT(strstr(kvt_last_error(c), "draining"));
	/* The open sequence goes on, and so does everyone else. */
	struct kvt_sync_item it = {seq, 2, KVT_PHASE_DECODE, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
	T_OK(kvt_seq_open(other, &seq2));
	T_EQ(th_metric(&d, "kvtrim_tenant_draining{tenant=\"drainme\",id=\"1\"}"),
	     1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json tenants", ctl), 0);
	T_ASSERT(strstr(out, "\"name\":\"drainme\""));
	T_ASSERT(strstr(out, "\"draining\":1"));
	T_OK(kvt_seq_close(c, seq));

	/* By id, and undone. */
	T_EQ(th_sh(&d, out, sizeof(out), "%s drain --undo 1", ctl), 0);
	T_ASSERT(strstr(out, "admits new sequences again"));
	T_OK(kvt_seq_open(c, &seq2));
	T_EQ(th_sh(&d, out, sizeof(out), "%s drain nobody", ctl), 2);
	T_ASSERT(strstr(out, "no tenant named 'nobody'"));
	T_ASSERT(strstr(out, "ENOTENANT"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", ctl), 0);
	kvt_disconnect(c);
	kvt_disconnect(other);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(ctl, metrics_command_reads_the_stats_socket)
{
	struct th_daemon d;
	static char out[1 << 17];
	th_daemon_start(&d, "32M", NULL);
	T_EQ(th_sh(&d, out, sizeof(out), "%s metrics", th_bin("kvtrimctl")), 0);
	T_ASSERT(!strncmp(out, "# HELP kvtrim_info", 18));
	T_ASSERT(strstr(out, "kvtrim_pool_size_bytes 33554432\n"));
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- quotas */

TEST(quota, max_quota_refuses_larger_hellos_and_caps_defaults)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	const char *extra[] = {"--max-quota", "8M", NULL};
	th_daemon_start(&d, "32M", extra);
	struct kvt_config cfg = th_small_cfg(&d, "greedy", "full");
	cfg.quota_bytes = 16 << 20;
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EQUOTA);
	T_ASSERT(strstr(err, "max_quota"));
	T_EQ(th_stat(&d, "quota_refusals_total"), 1);
	T_EQ(th_stat(&d, "tenants"), 0);

	cfg.quota_bytes = 8 << 20; /* exactly the limit is fine */
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_disconnect(c);
	cfg.quota_bytes = 0; /* asks none: the whole pool, capped */
	T_OK(kvt_connect(&cfg, &c, err));
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.quota_bytes, 8 << 20);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(quota, quotas_are_hard)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	kvt_seq s[3];
	th_daemon_start(&d, "32M", NULL);
	struct kvt_config cfg = big_cfg(&d, "capped");
	cfg.quota_bytes = 2 << 20; /* one chunk = two sequences */
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &s[0]));
	T_OK(kvt_seq_open(c, &s[1]));
	double t0 = now_ms();
	T_ERR(kvt_seq_open(c, &s[2]), KVT_EQUOTA); /* never parked */
	T_ASSERT(now_ms() - t0 < 500);
	struct kvt_sync_item it = {s[0], 1, KVT_PHASE_DECODE, 0, 0};
	T_ERR(kvt_sync(c, &it, 1), KVT_EQUOTA);
	T_EQ(th_stat(&d, "pool_chunks_used"), 1);
	T_EQ(th_stat(&d, "backpressure_waits_total"), 0);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- auth */

/*
 * Forks a client that drops to uid (primary gid, supplementary groups)
 * and registers; returns 0 on success or the negated KVT code.  nng must
 * not have been used in this process before (it refuses to run after a
 * fork), so call this before any kvt_connect of the test itself.  The
 * scratch directory is opened to group 0, which the sockets also belong
 * to, so only the daemon's allow lists decide.
 */
static int connect_as(const struct th_daemon *d, uid_t uid, gid_t gid,
                      const gid_t *groups, int ngroups)
{
	chmod(th_tmpdir(), 0750);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		kvt_client *c;
		kvt_seq seq;
		char err[KVT_ERRTEXT_MAX];
		if (setgroups((size_t)ngroups, groups) || setgid(gid) ||
		    setuid(uid))
			_exit(99);
		struct kvt_config cfg = th_small_cfg(d, "other-user", "full");
		int rv = kvt_connect(&cfg, &c, err);
		if (!rv) {
			rv = kvt_seq_open(c, &seq);
			kvt_disconnect(c);
		}
		_exit(rv < 0 ? -rv : 0);
	}
	int st;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) != 99);
	return -WEXITSTATUS(st);
}

TEST(auth, default_allows_own_uid_and_root_only)
{
	struct th_daemon d;
	if (geteuid() != 0)
		T_SKIP("needs root to act as another uid");
	gid_t g0[] = {0};
	th_daemon_start(&d, "16M", NULL);
	T_ERR(connect_as(&d, 4242, 0, g0, 1), KVT_EPERM);
	T_ASSERT(th_stat(&d, "auth_refusals_total") >= 1);
	T_EQ(th_stat(&d, "tenants"), 0);
	T_ASSERT(log_has(&d, "uid 4242"));
	T_OK(connect_as(&d, 0, 0, g0, 1)); /* root */
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(auth, allow_uids_and_gids_decide_registration_not_admin_rights)
{
	struct th_daemon d;
	char out[4096], err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	if (geteuid() != 0)
		T_SKIP("needs root to act as another uid");
	if (!strcmp(th_backend(), "cuda") && getenv("KVTRIM_CUDA_EMU"))
		T_SKIP("cuda emulator: a client of another uid cannot open "
		       "the root daemon's emulated device memory "
		       "(/proc/<pid>/fd needs ptrace access)");
	const char *extra[] = {"--allow-uids", "4242", "--allow-gids", "4343",
	                       NULL};
	th_daemon_start(&d, "16M", extra);
	/* Other users first: nng must not be used before a fork. */
	gid_t g0[] = {0}, g_member[] = {0, 4343};
	T_OK(connect_as(&d, 4242, 0, g0, 1));       /* listed uid */
	T_OK(connect_as(&d, 4444, 0, g_member, 2)); /* supplementary group */
	T_OK(connect_as(&d, 4444, 4343, g0, 1));    /* primary group */
	T_ERR(connect_as(&d, 4444, 0, g0, 1), KVT_EPERM);
	T_EQ(th_stat(&d, "tenants_registered_total"), 3);
	/* Root is not on the lists: refused with the reason. */
	struct kvt_config cfg = th_small_cfg(&d, "root-engine", "full");
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EPERM);
	T_ASSERT(strstr(err, "not allowed"));
	T_ASSERT(strstr(err, "allow_uids"));
	/* Admin rights are apart (admin_*, default: the daemon's own uid
	 * and root): root may still change settings, a listed tenant user
	 * may not (tests/integration/test_hostile.c has the rest). */
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set log_level debug",
	           th_bin("kvtrimctl")), 0);
	T_EQ(th_sh(&d, out, sizeof(out), "setpriv --reuid 4242 --regid 0 "
	           "--clear-groups %s config set log_level info",
	           th_bin("kvtrimctl")), 2);
	T_ASSERT(strstr(out, "EPERM"));
	T_ASSERT(strstr(out, "admin_uids"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats", th_bin("kvtrimctl")), 0);
	T_EQ(th_stat(&d, "tenants_registered_total"), 3);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- pressure */

/* Pressure needs quotas that together exceed the pool: these daemons run
 * with expected_tenants 1, so a tenant asking no quota may hold it all. */

TEST(pressure, backpressure_parks_until_pages_free)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *a;
	kvt_seq s[4];
	int go[2], res[2];
	const char *extra[] = {"--pressure-deadline-ms", "4000",
	                       "--expected-tenants", "1", NULL};
	th_daemon_start(&d, "4M", extra); /* 2 chunks: 4 big sequences */
	T_EQ(pipe(go), 0);
	T_EQ(pipe(res), 0);
	pid_t b = fork();
	T_ASSERT(b >= 0);
	if (b == 0) {
		char x;
		kvt_client *c;
		kvt_seq seq;
		double r[2] = {1, 0};
		if (read(go[0], &x, 1) == 1) {
			struct kvt_config cfg = big_cfg(&d, "latecomer");
			int rv = kvt_connect(&cfg, &c, err);
			double t0 = now_ms();
			if (!rv)
				rv = kvt_seq_open(c, &seq);
			r[0] = rv;
			r[1] = now_ms() - t0;
			if (write(res[1], r, sizeof(r)) != sizeof(r))
				_exit(1);
			if (!rv)
				kvt_disconnect(c);
		}
		_exit(0);
	}
	struct kvt_config cfg = big_cfg(&d, "hog");
	T_OK(kvt_connect(&cfg, &a, err));
	for (int i = 0; i < 4; i++)
		T_OK(kvt_seq_open(a, &s[i]));
	T_EQ(th_stat(&d, "pool_chunks_used"), 2);
	T_EQ(write(go[1], "g", 1), 1);
	T_EQ(wait_metric(&d, "kvtrim_backpressure_waits_total", 1, 3000), 1);
	T_EQ(th_metric(&d, "kvtrim_backpressure_parked_requests"), 1);
	T_EQ(wait_metric(&d, "kvtrim_pressure_level", 1, 1000), 1);
	sleep_ms(200); /* the latecomer really waits */
	for (int i = 1; i < 4; i++)
		T_OK(kvt_seq_close(a, s[i]));
	double r[2];
	T_EQ(read(res[0], r, sizeof(r)), (ssize_t)sizeof(r));
	T_EQ(r[0], 0);
	T_ASSERT(r[1] >= 150 && r[1] < 3000);
	T_EQ(th_metric(&d, "kvtrim_backpressure_resumed_total"), 1);
	T_EQ(th_metric(&d, "kvtrim_backpressure_timeouts_total"), 0);
	T_EQ(th_metric(&d, "kvtrim_errors_EPOOLFULL_total"), 0);
	int st;
	waitpid(b, &st, 0);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(a);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * Fills a 2-chunk pool with two tenants of one chunk each: "other" (quota
 * one chunk) and *a (quota the whole pool, so what it lacks next is pool,
 * not quota).  Each holds two sequences.
 */
static void fill_pool(const struct th_daemon *d, const char *name,
                      kvt_client **other, kvt_seq *os, kvt_client **a,
                      kvt_seq *as)
{
	char err[KVT_ERRTEXT_MAX];
	struct kvt_config ocfg = big_cfg(d, "other");
	ocfg.quota_bytes = 2 << 20;
	T_OK(kvt_connect(&ocfg, other, err));
	T_OK(kvt_seq_open(*other, &os[0]));
	T_OK(kvt_seq_open(*other, &os[1]));
	struct kvt_config cfg = big_cfg(d, name);
	T_OK(kvt_connect(&cfg, a, err));
	T_OK(kvt_seq_open(*a, &as[0]));
	T_OK(kvt_seq_open(*a, &as[1]));
	T_EQ(th_stat(d, "pool_chunks_used"), 2);
}

TEST(pressure, backpressure_times_out_with_epoolfull_and_never_overcommits)
{
	struct th_daemon d;
	char out[4096];
	kvt_client *a, *o;
	kvt_seq s[3], os[2];
	const char *extra[] = {"--pressure-deadline-ms", "300",
	                       "--expected-tenants", "1", NULL};
	th_daemon_start(&d, "4M", extra);
	fill_pool(&d, "full-house", &o, os, &a, s);
	/* A third sequence needs a third chunk. */
	double t0 = now_ms();
	T_ERR(kvt_seq_open(a, &s[2]), KVT_EPOOLFULL);
	double waited = now_ms() - t0;
	T_ASSERT(waited >= 250 && waited < 2000);
	T_ASSERT(strstr(kvt_last_error(a), "pressure_deadline_ms"));
	/* A reason of its own, not an empty one with a suffix (which
	 * rendered as "memory pool exhausted ( (no pages ...))"). */
	T_ASSERT(isalpha((unsigned char)kvt_last_error(a)[0]));
	/* A sync growing a list needs pages too: same path, nothing changes. */
	struct kvt_sync_item it = {s[0], 1, KVT_PHASE_DECODE, 0, 0};
	t0 = now_ms();
	T_ERR(kvt_sync(a, &it, 1), KVT_EPOOLFULL);
	T_ASSERT(now_ms() - t0 >= 250);
	struct kvt_list v;
	T_OK(kvt_list_get(a, s[0], 0, 0, &v));
	T_EQ(v.len, 0);
	T_EQ(th_metric(&d, "kvtrim_backpressure_waits_total"), 2);
	T_EQ(th_metric(&d, "kvtrim_backpressure_timeouts_total"), 2);
	T_EQ(th_metric(&d, "kvtrim_errors_EPOOLFULL_total"), 2);
	T_EQ(th_metric(&d, "kvtrim_pool_chunks_used"), 2);
	T_EQ(th_metric(&d, "kvtrim_pool_chunks_free"), 0);
	T_EQ(wait_metric(&d, "kvtrim_pressure_level", 1, 1000), 1);
	T_ASSERT(th_metric(&d, "kvtrim_pressure_tightenings_total") >= 1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	/* With the deadline at 0, the refusal is immediate. */
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set pressure_deadline_ms 0",
	           th_bin("kvtrimctl")), 0);
	t0 = now_ms();
	T_ERR(kvt_seq_open(a, &s[2]), KVT_EPOOLFULL);
	T_ASSERT(now_ms() - t0 < 200);
	T_EQ(th_metric(&d, "kvtrim_backpressure_waits_total"), 2);
	/* Once the other tenant leaves, the same sync succeeds. */
	kvt_disconnect(o);
	sleep_ms(100);
	T_OK(kvt_sync(a, &it, 1));
	T_OK(kvt_list_get(a, s[0], 0, 0, &v));
	T_EQ(v.len, 1);
	kvt_disconnect(a);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(pressure, priorities_scale_each_tenants_pressure)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *lo, *hi;
	kvt_seq s[5];
	const char *extra[] = {"--tenant-priorities", "hi=4",
	                       "--expected-tenants", "1", NULL};
	th_daemon_start(&d, "6M", extra); /* 3 chunks */
	struct kvt_config lcfg = big_cfg(&d, "lo"), hcfg = big_cfg(&d, "hi");
	T_OK(kvt_connect(&lcfg, &lo, err));
	T_OK(kvt_connect(&hcfg, &hi, err));
	T_OK(kvt_seq_open(lo, &s[0]));
	T_OK(kvt_seq_open(lo, &s[1]));
	T_OK(kvt_seq_open(hi, &s[2]));
	T_EQ(wait_metric(&d, "kvtrim_pressure_level", 0, 500), 0);
	T_OK(kvt_seq_open(lo, &s[3])); /* third chunk: the pool is full */
	T_EQ(wait_metric(&d, "kvtrim_tenant_pressure{tenant=\"lo\",id=\"1\"}", 1,
	                 1000), 1);
	T_EQ(th_metric(&d, "kvtrim_tenant_pressure{tenant=\"hi\",id=\"2\"}"),
	     0.25);
	T_EQ(th_metric(&d, "kvtrim_tenant_priority{tenant=\"hi\",id=\"2\"}"), 4);
	T_EQ(th_metric(&d, "kvtrim_tenant_priority{tenant=\"lo\",id=\"1\"}"), 1);
	T_EQ(th_metric(&d, "kvtrim_pressure_tightenings_total"), 2);
	/* Relief: back under the watermark, everyone relaxes. */
	T_OK(kvt_seq_close(lo, s[3]));
	for (int i = 0; i < 20 && th_metric(&d, "kvtrim_pressure_level") > 0; i++)
		sleep_ms(50);
	T_EQ(th_metric(&d, "kvtrim_pressure_level"), 0);
	sleep_ms(150);
	T_EQ(th_metric(&d, "kvtrim_tenant_pressure{tenant=\"lo\",id=\"1\"}"), 0);
	kvt_disconnect(lo);
	kvt_disconnect(hi);
	T_EQ(th_daemon_stop(&d), 0);
}

/* Step (a) end to end: the level reaches the tenant's policy, whose
 * budget shrinks at the next sync (tenant.h: B - floor(B * level / 2)). */
TEST(pressure, tightening_shrinks_budgets_at_the_next_sync)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c, *hog;
	kvt_seq seq, hs[2];
	struct kvt_list v;
	th_daemon_start(&d, "4M", NULL); /* 2 chunks */
	struct kvt_config cfg = th_small_cfg(&d, "squeezed", "streaming:tokens=8");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
	for (int i = 0; i < 20; i++)
		T_OK(kvt_sync(c, &it, 1));
	T_OK(kvt_list_get(c, seq, 1, 1, &v));
	T_EQ(v.len, 8); /* half the pool in use: no pressure */

	struct kvt_config hcfg = big_cfg(&d, "hog");
	hcfg.quota_bytes = 2 << 20;
	T_OK(kvt_connect(&hcfg, &hog, err));
	T_OK(kvt_seq_open(hog, &hs[0]));
	T_OK(kvt_seq_open(hog, &hs[1]));
	T_EQ(wait_metric(&d, "kvtrim_tenant_pressure{tenant=\"squeezed\","
	                 "id=\"1\"}", 1, 1000), 1);
	T_OK(kvt_sync(c, &it, 1));
	T_OK(kvt_list_get(c, seq, 1, 1, &v));
	T_EQ(v.len, 8 - 8 / 2);
	T_ASSERT(th_metric(&d, "kvtrim_pressure_tightenings_total") >= 2);

	/* The hog leaves: pressure drops and the budget is whole again. */
	kvt_disconnect(hog);
	for (int i = 0; i < 40; i++) {
		double p = th_metric(&d, "kvtrim_tenant_pressure{tenant="
		                         "\"squeezed\",id=\"1\"}");
		if (p == 0)
			break;
		sleep_ms(50);
	}
	for (int i = 0; i < 8; i++)
		T_OK(kvt_sync(c, &it, 1));
	T_OK(kvt_list_get(c, seq, 1, 1, &v));
	T_EQ(v.len, 8);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(pressure, sigterm_answers_parked_requests)
{
	struct th_daemon d;
	kvt_client *a, *o;
	kvt_seq s[3], os[2];
	const char *extra[] = {"--pressure-deadline-ms", "4000",
	                       "--expected-tenants", "1", NULL};
	th_daemon_start(&d, "4M", extra);
	fill_pool(&d, "stuck", &o, os, &a, s);
	pid_t daemon_pid = d.pid;
	pid_t killer = fork();
	T_ASSERT(killer >= 0);
	if (killer == 0) {
		sleep_ms(300);
		kill(daemon_pid, SIGTERM);
		_exit(0);
	}
	double t0 = now_ms();
	int rv = kvt_seq_open(a, &s[2]);
	T_ASSERT(rv == KVT_ESHUTDOWN || rv == KVT_ECONN);
	T_ASSERT(now_ms() - t0 < 2500); /* not the whole deadline */
	int st;
	waitpid(killer, &st, 0);
	T_EQ(th_daemon_stop(&d), 0);
	kvt_disconnect(a);
	kvt_disconnect(o);
}

/* ---------------------------------------------------------------- crashes */

TEST(faults, sigkill_during_syncs_gives_econn_and_a_restart_serves_again)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c, *fresh;
	kvt_seq seq;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "crashy", "streaming:tokens=8");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	pid_t daemon_pid = d.pid;
	pid_t killer = fork();
	T_ASSERT(killer >= 0);
	if (killer == 0) {
		sleep_ms(200);
		kill(daemon_pid, SIGKILL);
		_exit(0);
	}
	int rv = 0, syncs = 0;
	double t0 = now_ms(), call = 0;
	while (!rv && now_ms() - t0 < 10000) {
		struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
		call = now_ms();
		rv = kvt_sync(c, &it, 1);
		syncs += !rv;
	}
	double took = now_ms() - call;
	T_ERR(rv, KVT_ECONN);
	T_ASSERT(syncs > 0);
	T_ASSERT(took < 1500); /* the hang-up, not the 3 s timeout */
	int st;
	waitpid(killer, &st, 0);
	th_daemon_kill(&d); /* reaps the killed daemon */
	/* The dead client stays dead, quickly. */
	call = now_ms();
	T_ERR(kvt_seq_open(c, &seq), KVT_ECONN);
	T_ASSERT(now_ms() - call < 1500);
	kvt_disconnect(c);

	/* A new daemon on the same directory takes fresh clients. */
	th_daemon_start(&d, "16M", NULL);
	T_OK(kvt_connect(&cfg, &fresh, err));
	T_OK(kvt_seq_open(fresh, &seq));
	struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
	T_OK(kvt_sync(fresh, &it, 1));
	T_EQ(th_stat(&d, "tenants"), 1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(fresh);
	T_EQ(th_daemon_stop(&d), 0);
}
