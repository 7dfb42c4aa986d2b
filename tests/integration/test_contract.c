/*
 * test_contract.c — the contract between libkvtrim and an engine, against
 * the real daemon and the built (or installed) library: engines of a killed
 * kvtrim-loadgen die with it, the static library exposes only kvt_*
 * symbols, an install into a prefix is self-contained and usable through
 * pkg-config, and a handle outlives its daemon.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

/* The parent pid of process pid from /proc (-1 when it is gone). */
static pid_t proc_ppid(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* "pid (comm) state ppid ...": comm may hold spaces, so after the
	 * last ')'. */
	char *p = strrchr(buf, ')');
	char state;
	int ppid;
	if (!p || sscanf(p + 1, " %c %d", &state, &ppid) != 2)
		return -1;
	return ppid;
}

/* Up to max children of parent (from /proc); their count. */
static int children_of(pid_t parent, pid_t *out, int max)
{
	DIR *dir = opendir("/proc");
	T_ASSERT(dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dir)) && n < max) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		if (proc_ppid((pid_t)pid) == parent)
			out[n++] = (pid_t)pid;
	}
	closedir(dir);
	return n;
}

/*
 * The folder of the built libraries: $KVTRIM_LIB_DIR, else lib/ beside the
 * folder of this test binary (build/lib, or build/san-X/lib).
 */
static const char *lib_dir(void)
{
	static char dir[512];
	const char *env = getenv("KVTRIM_LIB_DIR");
	if (env && *env) {
		snprintf(dir, sizeof(dir), "%s", env);
		return dir;
	}
	char exe[480];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	T_ASSERT(n > 0);
	exe[n] = '\0';
	char *slash = strrchr(exe, '/');
	T_ASSERT(slash);
	*slash = '\0';
	snprintf(dir, sizeof(dir), "%s/../lib", exe);
	return dir;
}

/* Writes text to file name in the test's scratch dir; its path. */
static const char *scratch_file(const char *name, const char *text)
{
	static char path[4][512];
	static int i;
	char *p = path[i++ % 4];
	snprintf(p, 512, "%s/%s", th_tmpdir(), name);
	FILE *f = fopen(p, "w");
	T_ASSERT(f);
	T_ASSERT(fputs(text, f) >= 0);
	T_EQ(fclose(f), 0);
	return p;
}

/* Programs the tests build link the libraries of this build, which a
 * sanitizer build instruments: they take the same sanitizer. */
#if defined(__SANITIZE_ADDRESS__)
#define ENGINE_CC "cc -fsanitize=address "
#elif defined(__SANITIZE_THREAD__)
#define ENGINE_CC "cc -fsanitize=thread "
#else
#define ENGINE_CC "cc "
#endif

/* ------------------------------------------------------------ loadgen */

/*
 * kvtrim-loadgen with 4 engines is SIGKILLed mid-run: its engines must die
 * with it (they would otherwise run for their whole 100000 steps, holding
 * pool pages).  The test process is a child subreaper, so the orphaned
 * engines are reparented here and their end is seen by reaping them.
 */
TEST_T(contract, loadgen_engines_die_with_a_sigkilled_parent, 60)
{
	enum { ENGINES = 4 };
	T_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	char log[512];
	snprintf(log, sizeof(log), "%s/loadgen.out", th_tmpdir());
	pid_t lg = fork();
	T_ASSERT(lg >= 0);
	if (lg == 0) {
		if (!freopen(log, "w", stdout) || !freopen(log, "a", stderr))
			_exit(127);
		execl(th_bin("kvtrim-loadgen"), "kvtrim-loadgen",
		      "--runtime-dir", d.dir, "--clients", "4", "--seqs", "2",
		      "--steps", "100000", "--step-us", "10000", "--policy",
		      "streaming:tokens=16", "--name", "orphan", (char *)NULL);
		_exit(127);
	}
	/* Every engine registered and holds pages (10 s at most). */
	uint64_t t0 = th_now_ms();
	while (th_stat(&d, "tenants") < ENGINES ||
	       th_stat(&d, "pool_bytes_used") == 0) {
		if (th_now_ms() - t0 > 10000) {
			kill(lg, SIGKILL);
			th_fail(__FILE__, __LINE__, "loadgen engines did not "
			        "register within 10 s");
		}
		th_sleep_ms(50);
	}
	pid_t eng[ENGINES + 1];
	T_EQ(children_of(lg, eng, ENGINES + 1), ENGINES);

	T_EQ(kill(lg, SIGKILL), 0);
	int st;
	T_EQ(waitpid(lg, &st, 0), lg);
	T_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);

	/* Each engine ends within 3 s (reaped here, as their subreaper). */
	int left = ENGINES;
	t0 = th_now_ms();
	while (left && th_now_ms() - t0 < 3000) {
		for (int i = 0; i < ENGINES; i++)
			if (eng[i] > 0 && waitpid(eng[i], &st, WNOHANG) ==
			                          eng[i]) {
				eng[i] = 0;
				left--;
			}
		if (left)
			th_sleep_ms(20);
	}
	if (left) {
		for (int i = 0; i < ENGINES; i++)
			if (eng[i] > 0) {
				kill(eng[i], SIGKILL);
				waitpid(eng[i], &st, 0);
			}
		th_fail(__FILE__, __LINE__, "%d of %d engines still ran 3 s "
		        "after loadgen was SIGKILLed", left, ENGINES);
	}
	/* The daemon reclaims their tenants: the pool is empty again. */
	t0 = th_now_ms();
	while ((th_stat(&d, "pool_bytes_used") || th_stat(&d, "tenants")) &&
	       th_now_ms() - t0 < 3000)
		th_sleep_ms(50);
	T_EQ_U64(th_stat(&d, "pool_bytes_used"), 0);
	T_EQ_U64(th_stat(&d, "tenants"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ------------------------------------------------------ static library */

/*
 * A tiny engine, built by the tests against libkvtrim.a or an installed
 * libkvtrim: its own functions share names with libkvtrim's internals
 * (mem_init, codec_req_encode, handle_connect), it prints kvt_strerror's
 * text and then connects to the daemon of runtime dir argv[1] (one sequence
 * opened and closed) and prints the outcome's code name.  kvt_connect pulls
 * the whole client in, the memory and codec modules with it.
 */
static const char tiny_engine[] =
	"#include <stdio.h>\n"
	"#include \"kvtrim.h\"\n"
	"int mem_init(void) { return 1; }\n"
	"int codec_req_encode(void) { return 2; }\n"
	"int handle_connect(void) { return 3; }\n"
	"int main(int argc, char **argv)\n"
	"{\n"
	"\tprintf(\"own=%d text=%s\\n\", mem_init() + codec_req_encode() +\n"
	"\t       handle_connect(), kvt_strerror(KVT_ECONN));\n"
	"\tstruct kvt_config c = {argc > 1 ? argv[1] : \"/nonexistent\",\n"
	"\t\t\"tiny\", {2, 4, 2, 8, 32}, KVT_DTYPE_F32, 4, 4, 64, 4};\n"
	"\tc.timeout_ms = 3000;\n"
	"\tchar why[KVT_ERRTEXT_MAX];\n"
	"\tkvt_client *k;\n"
	"\tint rc = kvt_connect(&c, &k, why);\n"
	"\tif (rc == 0) {\n"
	"\t\tkvt_seq s;\n"
	"\t\trc = kvt_seq_open(k, &s);\n"
	"\t\tif (rc == 0)\n"
	"\t\t\trc = kvt_seq_close(k, s);\n"
	"\t\tkvt_disconnect(k);\n"
	"\t}\n"
	"\tprintf(\"connect=%s\\n\", rc ? kvt_errname(rc) : \"ok\");\n"
	"\treturn 0;\n"
	"}\n";

TEST_T(contract, static_library_exports_only_kvt_symbols, 60)
{
	char out[8192];
	const char *lib = lib_dir();
	/* Every defined global of the archive is kvt_*: the list of the
	 * others is empty (nm's lines are "address type name"). */
	T_EQ(th_sh(NULL, out, sizeof(out),
	           "nm -g --defined-only %s/libkvtrim.a | "
	           "awk 'NF == 3 && $3 !~ /^kvt_/ { print $3 }'", lib), 0);
	if (out[0])
		th_fail(__FILE__, __LINE__, "libkvtrim.a exports:\n%s", out);
	/* ... and it does define the public functions. */
	T_EQ(th_sh(NULL, out, sizeof(out),
	           "nm -g --defined-only %s/libkvtrim.a | "
	           "grep -c ' T kvt_strerror$'", lib), 0);
	T_EQ(atoi(out), 1);

	const char *src = scratch_file("engine.c", tiny_engine);
	int rc = th_sh(NULL, out, sizeof(out),
	               ENGINE_CC "-std=c11 -Iinclude -o %s/engine %s %s/libkvtrim.a "
	               "-lnng -lmsgpackc -lpthread -lm", th_tmpdir(), src, lib);
	if (rc)
		th_fail(__FILE__, __LINE__, "static link failed (%d):\n%s", rc,
		        out);
	T_EQ(th_sh(NULL, out, sizeof(out), "%s/engine", th_tmpdir()), 0);
	/* 1 + 2 + 3 from the engine's own functions, the text from
	 * include/kvtrim.h's table; no daemon in /nonexistent. */
	T_EQ_STR(out, "own=6 text=cannot reach the daemon or connection lost\n"
	              "connect=ECONN\n");
}

/* --------------------------------------------------------------- install */

/*
 * `make install-files` (the copying half of `make install`, the build being
 * done) into a scratch prefix writes everything under it, /etc included
 * (SYSCONFDIR is PREFIX/etc), installs the docs README.md links to and the
 * cuda backend when it was built; an engine built with pkg-config against
 * the prefix and run with only LD_LIBRARY_PATH=PREFIX/lib connects to the
 * real daemon; so does one linked against the build tree (libkvtrim.so.0,
 * the SONAME, is there).
 */
TEST_T(contract, install_into_a_prefix_and_build_an_engine_with_pkg_config,
       120)
{
	char out[8192];
	if (th_sh(NULL, out, sizeof(out),
	          "command -v make && command -v pkg-config") != 0)
		T_SKIP("make or pkg-config missing");
	const char *lib = lib_dir();
	char pre[512];
	snprintf(pre, sizeof(pre), "%s/prefix", th_tmpdir());
	struct stat st;
	int etc_before = stat("/etc/kvtrim", &st) == 0;
	int rc = th_sh(NULL, out, sizeof(out),
	               "make --no-print-directory install-files PREFIX=%s "
	               "DESTDIR= B=%s/..", pre, lib);
	if (rc)
		th_fail(__FILE__, __LINE__, "install failed (%d):\n%s", rc, out);
	if (!etc_before)
		T_ASSERT(stat("/etc/kvtrim", &st) != 0);
	static const char *const want[] = {
		"etc/kvtrim/kvtrimd.conf", "bin/kvtrimd", "bin/kvtrimctl",
		"lib/libkvtrim.so.0", "lib/libkvtrim.so", "lib/libkvtrim.a",
		"lib/pkgconfig/kvtrim.pc", "lib/pkgconfig/kvtrim-static.pc",
		"include/kvtrim.h",
		"share/doc/kvtrim/README.md",
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char p[700];
		snprintf(p, sizeof(p), "%s/%s", pre, want[i]);
		if (stat(p, &st) != 0)
			th_fail(__FILE__, __LINE__, "not installed: %s", p);
	}
	/* The unit starts the installed daemon on the installed config. */
	T_EQ(th_sh(NULL, out, sizeof(out),
	           "grep -c '^ExecStart=%s/bin/kvtrimd --config "
	           "%s/etc/kvtrim/kvtrimd.conf' "
	           "%s/lib/systemd/system/kvtrimd.service", pre, pre, pre), 0);
	/* Every docs/ link of the installed README resolves beside it. */
	T_EQ(th_sh(NULL, out, sizeof(out),
	           "cd %s/share/doc/kvtrim && n=0 && for f in $(grep -o "
	           "'](docs/[^)]*)' README.md | sed 's/^](//; s/)$//'); do "
	           "n=$((n+1)); [ -e \"$f\" ] || echo \"missing $f\"; done; "
	           "echo links=$n", pre), 0);
	T_ASSERT(!strstr(out, "missing"));
	T_ASSERT(!strstr(out, "links=0\n"));
	/* The cuda backend where the daemon looks for it (../lib beside
	 * bin/kvtrimd), when this build has one. */
	char cuda[600];
	snprintf(cuda, sizeof(cuda), "%s/libkvtrim-cuda.so", lib);
	if (stat(cuda, &st) == 0) {
		snprintf(cuda, sizeof(cuda), "%s/lib/libkvtrim-cuda.so", pre);
		T_EQ(stat(cuda, &st), 0);
	}

	/* An engine built against the prefix with pkg-config only. */
	const char *src = scratch_file("engine.c", tiny_engine);
	rc = th_sh(NULL, out, sizeof(out),
	           "PKG_CONFIG_PATH=%s/lib/pkgconfig " ENGINE_CC "-std=c11 -o %s/engine "
	           "%s $(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags "
	           "--libs kvtrim)", pre, th_tmpdir(), src, pre);
	if (rc)
		th_fail(__FILE__, __LINE__, "engine build failed (%d):\n%s", rc,
		        out);
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	T_EQ(th_sh(NULL, out, sizeof(out), "LD_LIBRARY_PATH=%s/lib ldd "
	           "%s/engine | grep -c '%s/lib/libkvtrim.so.0'", pre,
	           th_tmpdir(), pre), 0);
	T_EQ(th_sh(NULL, out, sizeof(out), "LD_LIBRARY_PATH=%s/lib %s/engine %s",
	           pre, th_tmpdir(), d.dir), 0);
	T_EQ_STR(out, "own=6 text=cannot reach the daemon or connection lost\n"
	              "connect=ok\n");

	/* The same engine linked against the build tree starts too. */
	rc = th_sh(NULL, out, sizeof(out),
	           ENGINE_CC "-std=c11 -Iinclude -o %s/engine-bt %s -L%s -lkvtrim",
	           th_tmpdir(), src, lib);
	if (rc)
		th_fail(__FILE__, __LINE__, "build-tree link failed (%d):\n%s",
		        rc, out);
	T_EQ(th_sh(NULL, out, sizeof(out), "LD_LIBRARY_PATH=%s %s/engine-bt %s",
	           lib, th_tmpdir(), d.dir), 0);
	T_EQ_STR(out, "own=6 text=cannot reach the daemon or connection lost\n"
	              "connect=ok\n");

	/* Linked statically with kvtrim-static.pc: no libkvtrim.so needed
	 * (the shared one beside the archive is not picked), and it runs. */
	rc = th_sh(NULL, out, sizeof(out),
	           ENGINE_CC "-std=c11 -o %s/engine-st %s $(PKG_CONFIG_PATH=%s/lib/"
	           "pkgconfig pkg-config --cflags --libs kvtrim-static)",
	           th_tmpdir(), src, pre);
	if (rc)
		th_fail(__FILE__, __LINE__, "static engine build failed (%d):\n%s",
		        rc, out);
	T_EQ(th_sh(NULL, out, sizeof(out), "LD_LIBRARY_PATH=%s/lib ldd "
	           "%s/engine-st | grep -c libkvtrim", pre, th_tmpdir()), 1);
	T_EQ(th_sh(NULL, out, sizeof(out), "%s/engine-st %s", th_tmpdir(),
	           d.dir), 0);
	T_EQ_STR(out, "own=6 text=cannot reach the daemon or connection lost\n"
	              "connect=ok\n");
	T_EQ(th_daemon_stop(&d), 0);
}

/* ------------------------------------------- a handle after its daemon (4) */

/*
 * Once the daemon is gone the handle stays valid: every call that needs the
 * daemon returns KVT_ECONN, again and again (no crash, no nng panic), until
 * kvt_disconnect frees it; a new kvt_connect to the daemon restarted on the
 * same runtime dir then works (the reconnect path of include/kvtrim.h).
 */
TEST_T(contract, handle_after_daemon_death_gives_econn_until_reconnect, 60)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "survivor", "full");
	kvt_client *c;
	char why[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, why));
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = {.seq = seq, .n_new = 1};
	T_OK(kvt_sync(c, &it, 1));
	/* The config the handle holds stays readable throughout. */
	T_EQ(kvt_config_of(c)->max_seqs, 4);

	/* A sync in flight when the daemon dies. */
	kvt_ticket pend;
	it.n_new = 1;
	T_OK(kvt_sync_async(c, &it, 1, &pend));
	th_daemon_kill(&d);
	int wr = kvt_wait(c, pend);
	T_ASSERT(wr == 0 || wr == KVT_ECONN);
	for (int round = 0; round < 3; round++) {
		kvt_seq s2;
		struct kvt_tenant_stats ts;
		kvt_ticket t;
		it.n_new = 0;
		T_ERR(kvt_sync(c, &it, 1), KVT_ECONN);
		T_ERR(kvt_sync_async(c, &it, 1, &t), KVT_ECONN);
		T_ERR(kvt_seq_open(c, &s2), KVT_ECONN);
		T_ERR(kvt_stats(c, &ts), KVT_ECONN);
		T_ERR(kvt_seq_close(c, seq), KVT_ECONN);
		/* The data plane says so too (the pages would be the dead
		 * daemon's). */
		void *kp, *vp;
		struct kvt_list l;
		struct kvt_table_view tv;
		const struct kvt_list_record *rec;
		char buf[4] = {0}, dst[4];
		T_ERR(kvt_kv_ptr(c, seq, 0, 0, 0, &kp, &vp), KVT_ECONN);
		T_ERR(kvt_list_get(c, seq, 0, 0, &l), KVT_ECONN);
		T_ERR(kvt_table_view(c, &tv), KVT_ECONN);
		T_ERR(kvt_list_record(c, seq, 0, 0, &rec, NULL), KVT_ECONN);
		T_ERR(kvt_memcpy(c, dst, buf, sizeof(buf)), KVT_ECONN);
		T_ERR(kvt_set_stream(c, NULL), KVT_ECONN);
		T_ASSERT(kvt_page_ptr(c, 0) == NULL);
		T_ASSERT(kvt_memory_kind(c) == KVT_MEMORY_HOST ||
		         kvt_memory_kind(c) == KVT_MEMORY_CUDA);
		T_ASSERT(strstr(kvt_last_error(c), "kvtrimd"));
		/* A daemon restarted on the same dir does not revive the
		 * handle: its tenant died with the old daemon. */
		if (round == 1) {
			th_daemon_start(&d, "16M", NULL);
			T_ERR(kvt_seq_open(c, &s2), KVT_ECONN);
			T_ERR(kvt_sync(c, &it, 1), KVT_ECONN);
			T_EQ_U64(th_stat(&d, "tenants"), 0);
		}
		T_EQ(kvt_config_of(c)->max_seqs, 4);
	}
	kvt_disconnect(c);

	/* Reconnect: a new client on the restarted daemon, same dir. */
	cfg = th_small_cfg(&d, "survivor", "full");
	T_OK(kvt_connect(&cfg, &c, why));
	T_OK(kvt_seq_open(c, &seq));
	it = (struct kvt_sync_item){.seq = seq, .n_new = 1};
	T_OK(kvt_sync(c, &it, 1));
	T_OK(kvt_seq_close(c, seq));
	kvt_disconnect(c);
	T_EQ_U64(th_stat(&d, "pool_bytes_used"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}
