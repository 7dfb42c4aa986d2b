/*
 * test_service_limits.c — what kvtrimd as a service enforces and survives:
 * quotas, peer authentication and allow-lists, memory pressure with
 * backpressure and priorities, and a daemon killed under syncing clients.
 * Every test starts the real daemon on a scratch runtime directory.
 */
#include "service_fixture.h"
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
	/* Both tenants are this process's: with expected_tenants 1 its
	 * share is the whole pool. */
	const char *extra[] = {"--expected-tenants", "1", NULL};
	th_daemon_start(&d, "4M", extra); /* 2 chunks */
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
