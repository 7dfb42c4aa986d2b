/*
 * test_hostile_tenant.c — what one tenant can do to the daemon and to the
 * others through its registration: geometries whose daemon-side state would
 * dwarf their pool quota, a table segment it tries to make writable, names
 * that would break /stats, /metrics or `kvtrimctl tenants`, names that read
 * as ids, and a first tenant taking the whole pool.  Every test runs the
 * real kvtrimd on a scratch runtime directory and talks to it through the
 * real client library, or raw hellos where the library would not send what
 * the test needs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "daemon.h"
#include "handle.h"
#include "kvtrim.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

/* A tenant registered by hand: its handle channel, its control pipe, and
 * the table and staging fds the daemon sent after the hello. */
struct raw_tenant {
	int hfd;
	uint32_t sock;
	uint32_t id;
	int table_fd, stage_fd;
	uint64_t table_bytes, stage_bytes;
};

/*
 * Registers th_small_cfg's geometry under `name` (any bytes, "" included),
 * which the client library would refuse or replace.  Returns the reply's
 * code; its text goes to msg (KVT_ERRTEXT_MAX).  On success the segments
 * have been received.
 */
static int raw_hello(const struct th_daemon *d, const char *name,
                     struct raw_tenant *rt, char *msg)
{
	char why[256];
	uint64_t cookie;
	int fd;
	memset(rt, 0, sizeof(*rt));
	rt->table_fd = rt->stage_fd = -1;
	T_OK(th_raw_welcome(d, &rt->hfd, &cookie));

	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = IPC_OP_HELLO;
	snprintf(q.u.hello.name, sizeof(q.u.hello.name), "%s", name);
	q.u.hello.geo = (struct kvt_geometry){2, 4, 2, 8, 32};
	q.u.hello.page_tokens = 4;
	q.u.hello.max_seqs = 4;
	q.u.hello.max_tokens = 64;
	q.u.hello.headroom = 4;
	snprintf(q.u.hello.policy, sizeof(q.u.hello.policy), "full");
	q.u.hello.cookie = cookie;
	q.u.hello.pid = (uint32_t)getpid();
	struct ipc_rep r;
	rt->sock = th_raw_conn(d);
	if (th_raw_request(d, rt->sock, &q, &r, why, sizeof(why)))
		th_fail(__FILE__, __LINE__, "hello: %s", why);
	snprintf(msg, KVT_ERRTEXT_MAX, "%s", r.msg);
	int e = r.err;
	if (!e) {
		/* A cuda tenant gets its event and device-table handles
		 * first; those are skipped. */
		struct handle_ext x;
		rt->id = r.u.hello.tenant;
		for (int i = 0; i < 8 && rt->stage_fd < 0; i++) {
			T_OK(handle_recv_ext(rt->hfd, &x, &fd, 2000));
			if (x.h.type == HANDLE_TABLE) {
				rt->table_fd = fd;
				rt->table_bytes = x.h.size;
			} else if (x.h.type == HANDLE_STAGE) {
				rt->stage_fd = fd;
				rt->stage_bytes = x.h.size;
			} else if (fd >= 0) {
				close(fd);
			}
		}
		T_ASSERT(rt->table_fd >= 0 && rt->stage_fd >= 0);
	}
	codec_rep_free(&r);
	return e;
}

static void raw_close(struct raw_tenant *rt)
{
	if (rt->table_fd >= 0)
		close(rt->table_fd);
	if (rt->stage_fd >= 0)
		close(rt->stage_fd);
	close(rt->hfd);
	th_raw_close(rt->sock);
}

/* Fails unless body parses as JSON (strict UTF-8) with python3. */
static void assert_json(const char *body)
{
	char path[300], out[4096];
	if (th_sh(NULL, out, sizeof(out), "command -v python3 >/dev/null"))
		T_SKIP("python3 is not installed");
	snprintf(path, sizeof(path), "%s/stats.json", th_tmpdir());
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fputs(body, f);
	T_ASSERT(fclose(f) == 0);
	int rc = th_sh(NULL, out, sizeof(out),
	               "python3 -c 'import json,sys; "
	               "json.load(open(sys.argv[1], encoding=\"utf-8\"))' %s",
	               path);
	if (rc)
		th_fail(__FILE__, __LINE__, "/stats is not JSON: %s", out);
}

/* No byte of s is a control character other than newline. */
static void assert_no_controls(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if ((*p < 0x20 && *p != '\n') || *p == 0x7f)
			th_fail(__FILE__, __LINE__, "control byte 0x%02x in "
			        "output:\n%s", *p, s);
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* --------------------------------------------- daemon memory (items 3, 4) */

TEST(hostile_tenant, geometry_beyond_tenant_memory_max_is_refused)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[8192];
	kvt_client *c = NULL;
	th_daemon_start(&d, "256M", NULL);
	long rss0 = th_rss_kib(d.pid);

	/*
	 * A hostile geometry: 4-byte pages (page_tokens 1, head_dim 1, f16)
	 * and 512 sequences of 64 layers x 1024 KV heads.  Its table alone is
	 * 512 * 65536 records of 64 bytes = 2 GiB, above the default
	 * tenant_memory_max of 1 GiB whatever its quota.
	 */
	struct kvt_config cfg = th_small_cfg(&d, "sparse", "full");
	cfg.geo = (struct kvt_geometry){64, 1024, 1024, 1, 16};
	cfg.dtype = KVT_DTYPE_F16;
	cfg.page_tokens = 1;
	cfg.max_seqs = 512;
	cfg.max_tokens = 4;
	cfg.headroom = 1;
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EQUOTA);
	T_ASSERT(c == NULL);
	T_ASSERT(strstr(err, "tenant_memory_max"));
	/* On cuda the device copy of the table counts too. */
	T_ASSERT(strstr(err, strcmp(th_backend(), "cuda") ? "table 2.0 GiB"
	                                                   : "table 6.0 GiB"));
	T_ASSERT(strstr(err, "sequences") && strstr(err, "staging"));
	T_ASSERT(strstr(err, "lower max_seqs"));
	T_EQ_U64(th_stat(&d, "tenants"), 0);
	T_EQ_U64(th_stat(&d, "tenant_memory_refusals_total"), 1);
	/* Refused before anything was made: no segment, no list array. */
	T_ASSERT(th_rss_kib(d.pid) - rss0 < 8 * 1024);

	/*
	 * Realistic engines stay admitted: an 8B model (32 layers, 8 KV
	 * heads, head_dim 128, f16) with the library's defaults (8 sequences
	 * of 4096 tokens, pages of 16), and
	 * the benchmark's staged one (36 layers, 1 sequence of 2048 tokens,
	 * headroom 128, 192 staged rows per layer of 4128 floats, q and lse,
	 * which h2o reads, without x: 36 * 192 * 4128 * 4 bytes = 108.8 MiB
	 * of staging, plus h2o's state and scratch).
	 */
	cfg = th_small_cfg(&d, "eight-b", "full");
	cfg.geo = (struct kvt_geometry){32, 32, 8, 128, 4096};
	cfg.dtype = KVT_DTYPE_F16;
	cfg.page_tokens = cfg.max_seqs = cfg.max_tokens = cfg.headroom = 0;
	T_OK(kvt_connect(&cfg, &c, err));
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	/* About 48 MiB; on cuda about 125 MiB (the device table and the
	 * batched compaction's page and move lists of the largest sync). */
	T_ASSERT(ts.daemon_bytes > (32ull << 20) &&
	         ts.daemon_bytes < (256ull << 20));
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json tenants",
	           th_bin("kvtrimctl")), 0);
	char want[128];
	snprintf(want, sizeof(want), "\"daemon_memory_bytes\":%llu",
	         (unsigned long long)ts.daemon_bytes);
	T_ASSERT(strstr(out, want));
	snprintf(want, sizeof(want),
	         "kvtrim_tenant_daemon_memory_bytes{tenant=\"eight-b\",id=\"1\"}");
	T_EQ_U64((uint64_t)th_metric(&d, want), ts.daemon_bytes);
	kvt_disconnect(c);

	cfg = th_small_cfg(&d, "bench", "h2o");
	cfg.geo = (struct kvt_geometry){36, 32, 8, 128, 4096};
	cfg.dtype = KVT_DTYPE_F16;
	cfg.page_tokens = 16;
	cfg.max_seqs = 1;
	cfg.max_tokens = 2048;
	cfg.headroom = 128;
	cfg.stage_tokens = 192;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_stats(c, &ts));
	T_ASSERT(ts.daemon_bytes > 36ull * 192 * 4128 * 4 &&
	         ts.daemon_bytes < (1ull << 30));
	kvt_disconnect(c);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(hostile_tenant, check_reads_only_live_state)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c = NULL;
	th_daemon_start(&d, "256M", NULL);

	/*
	 * 1024 sequence slots of 32 layers x 32 KV heads with records of 64
	 * bytes (pages of one entry, max_tokens 4, headroom 1: 5 page ids):
	 * a sparse 64 MiB table, about 140 MiB of daemon memory in all, so
	 * admitted.  One sequence is open: 1024 records, 64 KiB.
	 */
	struct kvt_config cfg = th_small_cfg(&d, "wide", "full");
	cfg.geo = (struct kvt_geometry){32, 32, 32, 8, 32};
	cfg.page_tokens = 1;
	cfg.max_seqs = 1024;
	cfg.max_tokens = 4;
	cfg.headroom = 1;
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = {seq, 1, KVT_PHASE_PREFILL, 0, 0};
	T_OK(kvt_sync(c, &it, 1));

	long rss0 = th_rss_kib(d.pid);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	/* Walking the 1023 slots never opened would fault in 64 MiB. */
	long grew = th_rss_kib(d.pid) - rss0;
	if (grew > 8 * 1024)
		th_fail(__FILE__, __LINE__, "check grew the daemon's RSS by "
		        "%ld KiB", grew);
	T_OK(kvt_seq_close(c, seq));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* -------------------------------------------------------- read-only table */

TEST(hostile_tenant, table_segment_cannot_be_made_writable)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c = NULL;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "scribbler", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));

	/* The library's read-only mapping of the table (where kvt_list_get
	 * points, on either backend) cannot be turned writable. */
	struct kvt_list l;
	T_OK(kvt_list_get(c, seq, 0, 0, &l));
	size_t ps = (size_t)sysconf(_SC_PAGESIZE);
	void *page = (void *)((uintptr_t)l.pages & ~(uintptr_t)(ps - 1));
	errno = 0;
	T_ASSERT(mprotect(page, ps, PROT_READ | PROT_WRITE) != 0);
	T_ASSERT(errno == EACCES || errno == EPERM);
	struct kvt_sync_item it = {seq, 4, KVT_PHASE_PREFILL, 0, 0};
	T_OK(kvt_sync(c, &it, 1));

	/* Nor can the fd: mmap writable, write(), or a reopen through /proc
	 * (the seal belongs to the file). */
	struct raw_tenant rt;
	T_EQ(raw_hello(&d, "raw", &rt, err), 0);
	errno = 0;
	T_ASSERT(mmap(NULL, rt.table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
	              rt.table_fd, 0) == MAP_FAILED);
	T_EQ(errno, EPERM);
	T_ASSERT(pwrite(rt.table_fd, "\0\0\0\0", 4, 0) < 0);
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", rt.table_fd);
	int rw = open(path, O_RDWR);
	if (rw >= 0) {
		T_ASSERT(mmap(NULL, rt.table_bytes, PROT_READ | PROT_WRITE,
		              MAP_SHARED, rw, 0) == MAP_FAILED);
		T_ASSERT(write(rw, "\0", 1) < 0);
		close(rw);
	}
	void *ro = mmap(NULL, rt.table_bytes, PROT_READ, MAP_SHARED,
	                rt.table_fd, 0);
	T_ASSERT(ro != MAP_FAILED);
	T_ASSERT(mprotect(ro, rt.table_bytes, PROT_READ | PROT_WRITE) != 0);
	munmap(ro, rt.table_bytes);
	/* The staging segment stays the engine's to write. */
	void *st = mmap(NULL, rt.stage_bytes, PROT_READ | PROT_WRITE,
	                MAP_SHARED, rt.stage_fd, 0);
	T_ASSERT(st != MAP_FAILED);
	munmap(st, rt.stage_bytes);

	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ_STR(out, "ok\n");
	raw_close(&rt);
	T_OK(kvt_seq_close(c, seq));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* -------------------------------------------------------------- names */

TEST(hostile_tenant, bad_names_are_refused_and_stats_stay_valid)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	static char body[1 << 17], out[1 << 14];
	kvt_client *c = NULL, *good = NULL;
	th_daemon_start(&d, "16M", NULL);

	const char *bad[] = {
		"x\n1 fake 0 full",   /* a line of its own in `tenants` */
		"\x1b[2J\x1b[H",      /* clears an operator's terminal */
		"\xff\xfe",           /* not UTF-8: /stats, /metrics */
		"ok\xc3",             /* truncated UTF-8 */
		"12",                 /* reads as an id */
		"1",
		"with space",
		"a=1,b",              /* breaks tenant_priorities */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvt_config cfg = th_small_cfg(&d, bad[i], "full");
		err[0] = '\0';
		T_ERR(kvt_connect(&cfg, &c, err), KVT_EINVAL);
		T_ASSERT(strstr(err, "tenant name"));
		assert_no_controls(err);
	}
	T_EQ_U64(th_stat(&d, "tenants"), 0);

	/* An empty name (which the library never sends) is given one. */
	struct raw_tenant rt;
	T_EQ(raw_hello(&d, "", &rt, err), 0);
	struct kvt_config cfg = th_small_cfg(&d, "good.one@host:0", "full");
	T_OK(kvt_connect(&cfg, &good, err));

	T_EQ(th_http(&d, NULL, "/stats", body, sizeof(body)), 200);
	assert_json(body);
	char want[64];
	snprintf(want, sizeof(want), "\"name\":\"tenant-%u\"", rt.id);
	T_ASSERT(strstr(body, want));
	T_ASSERT(strstr(body, "\"name\":\"good.one@host:0\""));
	T_EQ(th_http(&d, NULL, "/metrics", body, sizeof(body)), 200);
	assert_no_controls(body);
	T_EQ(th_sh(&d, out, sizeof(out), "%s tenants", th_bin("kvtrimctl")), 0);
	assert_no_controls(out);
	T_EQ(count_lines(out), 3); /* the header and two tenants */
	kvt_disconnect(good);
	raw_close(&rt);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(hostile_tenant, drain_tells_ids_from_names)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *a = NULL, *b = NULL, *one = NULL;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "alpha", "full");
	T_OK(kvt_connect(&cfg, &a, err)); /* id 1 */
	cfg = th_small_cfg(&d, "1", "full");
	T_ERR(kvt_connect(&cfg, &one, err), KVT_EINVAL);
	cfg = th_small_cfg(&d, "beta", "full");
	T_OK(kvt_connect(&cfg, &b, err)); /* id 2: the refusal took none */

	/* "1" is tenant id 1 and nothing else. */
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json drain 1",
	           th_bin("kvtrimctl")), 0);
	T_ASSERT(strstr(out, "\"name\":\"alpha\""));
	T_ASSERT(!strstr(out, "beta"));
	kvt_seq s;
	T_ASSERT(kvt_seq_open(a, &s) < 0);
	T_OK(kvt_seq_open(b, &s));
	T_OK(kvt_seq_close(b, s));
	/* A name is a name, even one that ends in digits. */
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json undrain alpha",
	           th_bin("kvtrimctl")), 0);
	T_OK(kvt_seq_open(a, &s));
	T_OK(kvt_seq_close(a, s));
	T_ASSERT(th_sh(&d, out, sizeof(out), "%s drain 3",
	               th_bin("kvtrimctl")) != 0);
	T_ASSERT(strstr(out, "no tenant with id '3'"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json drain 002",
	           th_bin("kvtrimctl")), 0);
	T_ASSERT(strstr(out, "\"name\":\"beta\""));
	T_ASSERT(!strstr(out, "alpha"));
	T_ASSERT(kvt_seq_open(b, &s) < 0);
	/* kvtrimctl stats TENANT follows the same rule. */
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats 1", th_bin("kvtrimctl")),
	     0);
	T_ASSERT(strstr(out, "name alpha"));
	kvt_disconnect(a);
	kvt_disconnect(b);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------- default quota */

/*
 * Pages of 256 KiB ([K 256 x 128][V 256 x 128] f32): 8 per 2 MiB chunk.
 * A sequence has 2 layers x 2 KV heads = 4 lists of one page each (the
 * headroom of 256 entries), so one chunk holds exactly two sequences.
 */
static struct kvt_config chunky_cfg(const struct th_daemon *d,
                                    const char *name)
{
	struct kvt_config c = th_small_cfg(d, name, "full");
	c.geo = (struct kvt_geometry){2, 2, 2, 128, 256};
	c.page_tokens = 256;
	c.max_seqs = 16;
	c.max_tokens = 1024;
	c.headroom = 256;
	c.timeout_ms = 5000;
	return c;
}

TEST(hostile_tenant, tenants_without_a_quota_share_the_pool)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *a = NULL, *b = NULL;
	/* 16 MiB = 8 chunks; expected_tenants 4 by default: 2 chunks each. */
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = chunky_cfg(&d, "first");
	T_OK(kvt_connect(&cfg, &a, err));
	T_EQ_U64(kvt_config_of(a)->quota_bytes, 4ull << 20);
	kvt_seq sa[16];
	int n = 0, rc = 0;
	while (n < 16 && (rc = kvt_seq_open(a, &sa[n])) == 0)
		n++;
	/* Its own quota stops it, at once (no pool-full wait): 2 chunks
	 * hold 4 sequences. */
	T_EQ(rc, KVT_EQUOTA);
	T_EQ(n, 4);

	cfg = chunky_cfg(&d, "second");
	T_OK(kvt_connect(&cfg, &b, err));
	kvt_seq sb;
	T_OK(kvt_seq_open(b, &sb));
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(b, &ts));
	T_EQ_U64(ts.quota_bytes, 4ull << 20);
	T_EQ_U64(ts.chunks, 1);
	T_OK(kvt_seq_close(b, sb));
	for (int i = 0; i < n; i++)
		T_OK(kvt_seq_close(a, sa[i]));
	kvt_disconnect(a);
	kvt_disconnect(b);

	/* An explicit default_quota still wins. */
	char out[256];
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set default_quota 6M",
	           th_bin("kvtrimctl")), 0);
	cfg = chunky_cfg(&d, "third");
	T_OK(kvt_connect(&cfg, &a, err));
	T_EQ_U64(kvt_config_of(a)->quota_bytes, 6ull << 20);
	kvt_disconnect(a);
	T_EQ(th_daemon_stop(&d), 0);
}
