/*
 * test_hostile_share.c — what one uid or one process can take of the pool:
 * the tenants of a uid (of a process) hold together at most their share
 * (uid_pool_share, pid_pool_share), so one process registering tenants
 * until the pool is gone, or asking a quota of the whole pool, leaves an
 * engine of another uid its fair share; pressure reaches first the uid
 * holding more than a fair share; quotas count in whole chunks.  Every test
 * runs the real kvtrimd on a scratch runtime directory.
 */
#include "service_fixture.h"

/* ----------------------------------------------------------- helpers */

/*
 * An engine process, forked and driven over two pipes: on "go" it drops to
 * uid (unless 0; group 0, which the scratch directory is opened to),
 * registers n_tenants tenants `name` with big_cfg (two sequences a chunk,
 * a quota asked of 0: the fair share) and opens nseq sequences in each, or
 * with nseq < 0 opens them until refused; answers with the error that
 * ended the last tenant's (0: none, its text in err) and the chunks its
 * tenants hold, and keeps them until "bye".  Fork every one before this
 * process uses nng (nng refuses to run after a fork).
 */
struct child {
	pid_t pid;
	int go[2], res[2];
};

struct child_result {
	int rv;
	uint64_t chunks;
	char err[KVT_ERRTEXT_MAX];
};

struct child_spec {
	const char *name;
	uid_t uid;
	int n_tenants, nseq;
};

/* One tenant of child_run: opens its sequences, adds its chunks. */
static int child_tenant(const struct th_daemon *d, const struct child_spec *sp,
                        kvt_client **c, struct child_result *r)
{
	struct kvt_config cfg = big_cfg(d, sp->name);
	int rv = kvt_connect(&cfg, c, r->err);
	if (rv) {
		*c = NULL;
		return rv;
	}
	for (int i = 0; !rv && (sp->nseq < 0 || i < sp->nseq); i++) {
		kvt_seq s;
		if ((rv = kvt_seq_open(*c, &s)))
			snprintf(r->err, sizeof(r->err), "%s",
			         kvt_last_error(*c));
	}
	struct kvt_tenant_stats ts;
	if (!kvt_stats(*c, &ts))
		r->chunks += ts.chunks;
	return rv;
}

static void child_run(struct child *ch, const struct th_daemon *d,
                      const struct child_spec *sp)
{
	char b;
	struct child_result r = {0};
	kvt_client *c[8] = {NULL};
	gid_t g0[] = {0};
	if (read(ch->go[0], &b, 1) != 1 || sp->n_tenants > 8)
		_exit(99);
	if (sp->uid && (setgroups(1, g0) || setgid(0) || setuid(sp->uid)))
		_exit(99);
	for (int t = 0; t < sp->n_tenants; t++)
		r.rv = child_tenant(d, sp, &c[t], &r);
	if (write(ch->res[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(98);
	if (read(ch->go[0], &b, 1) < 0)
		_exit(97);
	for (int t = 0; t < sp->n_tenants; t++)
		kvt_disconnect(c[t]);
	_exit(0);
}

static void child_fork(struct child *ch, const struct th_daemon *d,
                       const struct child_spec *sp)
{
	chmod(th_tmpdir(), 0750);
	T_ASSERT(pipe(ch->go) == 0 && pipe(ch->res) == 0);
	ch->pid = fork();
	T_ASSERT(ch->pid >= 0);
	if (ch->pid == 0)
		child_run(ch, d, sp);
}

/* Lets the child register and open its sequences; its answer. */
static struct child_result child_go(struct child *ch)
{
	struct child_result r;
	T_ASSERT(write(ch->go[1], "g", 1) == 1);
	T_ASSERT(read(ch->res[0], &r, sizeof(r)) == (ssize_t)sizeof(r));
	return r;
}

static void child_end(struct child *ch)
{
	int st;
	T_ASSERT(write(ch->go[1], "b", 1) == 1);
	T_EQ(waitpid(ch->pid, &st, 0), ch->pid);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(ch->go[0]);
	close(ch->go[1]);
	close(ch->res[0]);
	close(ch->res[1]);
}

/* The child's answer must be rv, its text holding `text` ("": any). */
#define CHILD_IS(r, want_rv, text)                                           \
	do {                                                                 \
		if ((r).rv != (want_rv) || !strstr((r).err, (text)))         \
			th_fail(__FILE__, __LINE__, "child: %s (%s)",        \
			        (r).rv ? kvt_errname((r).rv) : "ok",         \
			        (r).err);                                    \
	} while (0)

static void other_uid_needs_root(void)
{
	if (geteuid() != 0)
		T_SKIP("needs root to act as another uid");
	if (!strcmp(th_backend(), "cuda") && getenv("KVTRIM_CUDA_EMU"))
		T_SKIP("cuda emulator: a client of another uid cannot open "
		       "the root daemon's emulated device memory "
		       "(/proc/<pid>/fd needs ptrace access)");
}

/* ----------------------------------------------------------- shares */

/*
 * 8 chunks, expected_tenants 4: a quota asked of 0 is 2 chunks, a process
 * may hold 4 (1 - 2/4) and a uid 6 (1 - 1/4).  Two processes of one uid
 * with four tenants each at that quota would take all 8: the first gets
 * 4, the second 2, their further chunks wait, then EPOOLFULL naming the
 * share, and an engine of another uid still opens its four sequences (its
 * fair share, 2 chunks).
 */
TEST(share, four_tenants_of_one_process_leave_another_uid_its_fair_share)
{
	struct th_daemon d;
	other_uid_needs_root();
	const char *extra[] = {"--allow-uids", "0,65534",
	                       "--pressure-deadline-ms", "200", NULL};
	th_daemon_start(&d, "16M", extra);
	struct child hog[2], newcomer;
	const struct child_spec hs = {"hog", 0, 4, -1};
	const struct child_spec ns = {"newcomer", 65534, 1, 4};
	child_fork(&hog[0], &d, &hs);
	child_fork(&hog[1], &d, &hs);
	child_fork(&newcomer, &d, &ns);

	struct child_result r = child_go(&hog[0]);
	CHILD_IS(r, KVT_EPOOLFULL, "pid_pool_share");
	T_EQ_U64(r.chunks, 4);
	r = child_go(&hog[1]);
	CHILD_IS(r, KVT_EPOOLFULL, "uid_pool_share");
	CHILD_IS(r, KVT_EPOOLFULL, "uid 0 hold 6 of the 6");
	T_EQ_U64(r.chunks, 2);
	T_EQ(th_stat(&d, "pool_chunks_used"), 6);
	T_EQ(th_stat(&d, "uid_bytes_used_max"), 12 << 20);
	T_EQ(th_stat(&d, "uid_share_bytes"), 12 << 20);
	T_EQ(th_stat(&d, "pid_share_bytes"), 8 << 20);
	T_EQ(th_stat(&d, "pool_uids"), 1);

	r = child_go(&newcomer);
	CHILD_IS(r, 0, "");
	T_EQ_U64(r.chunks, 2);
	T_EQ(th_stat(&d, "pool_chunks_used"), 8);
	T_EQ(th_stat(&d, "pool_uids"), 2);
	child_end(&newcomer);
	child_end(&hog[0]);
	child_end(&hog[1]);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_stat(&d, "pool_uids"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * A quota of the whole pool is refused, naming the tightest share and what
 * it allows; exactly the share is fine; an admin may widen both (1: no
 * limit), and a share that is not a ratio in [0, 1] changes nothing.
 */
TEST(share, a_quota_of_the_whole_pool_is_refused_naming_the_share)
{
	struct th_daemon d;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX], out[4096];
	const char *ctl = th_bin("kvtrimctl");
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = big_cfg(&d, "greedy");
	cfg.quota_bytes = 16 << 20;
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EQUOTA);
	if (!strstr(err, "one process may hold together: pid_pool_share 0.5 "
	                 "of the pool, 8388608 bytes"))
		th_fail(__FILE__, __LINE__, "refusal text: %s", err);
	T_EQ(th_stat(&d, "quota_refusals_total"), 1);
	T_EQ(th_stat(&d, "tenants"), 0);

	cfg.quota_bytes = 8 << 20;
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_disconnect(c);
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set pid_pool_share 1",
	           ctl), 0);
	cfg.quota_bytes = 16 << 20; /* now the uid's share is the limit */
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EQUOTA);
	if (!strstr(err, "uid_pool_share 0.75 of the pool, 12582912 bytes"))
		th_fail(__FILE__, __LINE__, "refusal text: %s", err);

	T_EQ(th_sh(&d, out, sizeof(out), "%s config set uid_pool_share 1.5",
	           ctl), 2);
	T_ASSERT(strstr(out, "not a ratio in [0, 1]"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set pid_pool_share -0.1",
	           ctl), 2);
	T_EQ(th_sh(&d, out, sizeof(out), "%s config get uid_pool_share", ctl),
	     0);
	T_EQ_STR(out, "uid_pool_share 0\n");
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set uid_pool_share 1",
	           ctl), 0);
	cfg.quota_bytes = 16 << 20;
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s[8];
	for (int i = 0; i < 8; i++) /* 4 chunks */
		T_OK(kvt_seq_open(c, &s[i]));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* pid_pool_share splits a uid's share: the tenants of one process hold
 * together at most theirs, and the refusal names it. */
TEST(share, pid_pool_share_bounds_the_tenants_of_one_process)
{
	struct th_daemon d;
	kvt_client *c[2];
	kvt_seq s;
	char err[KVT_ERRTEXT_MAX];
	const char *extra[] = {"--pid-pool-share", "0.25",
	                       "--pressure-deadline-ms", "100", NULL};
	th_daemon_start(&d, "16M", extra);
	T_EQ(th_stat(&d, "pid_share_bytes"), 4 << 20);
	struct kvt_config cfg = big_cfg(&d, "first");
	cfg.quota_bytes = 6 << 20; /* more than the process may hold */
	T_ERR(kvt_connect(&cfg, &c[0], err), KVT_EQUOTA);
	T_ASSERT(strstr(err, "pid_pool_share 0.25"));
	cfg.quota_bytes = 0;
	T_OK(kvt_connect(&cfg, &c[0], err));
	cfg.tenant = "second";
	T_OK(kvt_connect(&cfg, &c[1], err));
	for (int i = 0; i < 2; i++) /* one chunk each: the process's 2 */
		for (int k = 0; k < 2; k++)
			T_OK(kvt_seq_open(c[i], &s));
	T_ERR(kvt_seq_open(c[0], &s), KVT_EPOOLFULL);
	if (!strstr(kvt_last_error(c[0]), "pid_pool_share"))
		th_fail(__FILE__, __LINE__, "refusal text: %s",
		        kvt_last_error(c[0]));
	T_EQ(th_stat(&d, "pool_chunks_used"), 2);
	kvt_disconnect(c[1]); /* its chunk is the process's again */
	T_OK(kvt_seq_open(c[0], &s));
	kvt_disconnect(c[0]);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * Pressure reaches the hog first: with the pool full, the uid holding
 * more than a fair share (the pool over the uids with tenants) is
 * tightened, and the engine of the uid within its share is not.
 */
TEST(share, pressure_reaches_the_uid_above_its_fair_share_first)
{
	struct th_daemon d;
	other_uid_needs_root();
	const char *extra[] = {"--allow-uids", "0,65534",
	                       "--pressure-deadline-ms", "100", NULL};
	th_daemon_start(&d, "16M", extra);
	struct child hog[2], victim;
	const struct child_spec hs = {"hog", 0, 4, -1};
	const struct child_spec vs = {"victim", 65534, 1, 4};
	child_fork(&victim, &d, &vs);
	child_fork(&hog[0], &d, &hs);
	child_fork(&hog[1], &d, &hs);
	struct child_result r = child_go(&victim); /* tenant 1: 2 chunks */
	CHILD_IS(r, 0, "");
	r = child_go(&hog[0]); /* tenants 2-5 */
	r = child_go(&hog[1]);
	CHILD_IS(r, KVT_EPOOLFULL, "");
	T_EQ(th_stat(&d, "pool_chunks_used"), 8); /* full: level 1 */
	T_EQ(wait_metric(&d, "kvtrim_tenant_pressure{tenant=\"hog\","
	                     "id=\"2\"}", 1, 5000), 1);
	/* Set in the same pass as the hog's. */
	T_EQ(th_metric(&d, "kvtrim_tenant_pressure{tenant=\"victim\","
	                   "id=\"1\"}"), 0);
	child_end(&victim);
	child_end(&hog[0]);
	child_end(&hog[1]);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ----------------------------------------------------------- rounding */

/* A 3 MiB quota holds one 2 MiB chunk: the daemon registers, and every
 * report shows, the 2 MiB that are usable. */
TEST(share, a_quota_counts_in_whole_chunks)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq s[3];
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = big_cfg(&d, "odd");
	cfg.quota_bytes = 3 << 20;
	T_OK(kvt_connect(&cfg, &c, err));
	T_EQ_U64(kvt_config_of(c)->quota_bytes, 2 << 20);
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.quota_bytes, 2 << 20);
	T_EQ(th_metric(&d, "kvtrim_tenant_quota_bytes{tenant=\"odd\","
	                   "id=\"1\"}"), 2 << 20);
	T_OK(kvt_seq_open(c, &s[0])); /* one chunk: two sequences */
	T_OK(kvt_seq_open(c, &s[1]));
	T_ERR(kvt_seq_open(c, &s[2]), KVT_EQUOTA);
	kvt_disconnect(c);
	cfg.quota_bytes = (2 << 20) - 1; /* below one chunk: refused */
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EQUOTA);
	T_ASSERT(strstr(err, "below one chunk"));
	T_EQ(th_daemon_stop(&d), 0);
}
