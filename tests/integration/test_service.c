/*
 * test_service.c — kvtrimd as a service: systemd notification and units,
 * SIGHUP reloads and kvtrimctl's operator commands (quotas, peer
 * authentication, memory pressure and crashes: test_service_limits.c; the
 * stats socket: test_stats.c).  Every test starts the real daemon on a
 * scratch runtime directory.
 */
#include "service_fixture.h"
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
