
/*
 * bench.c — kvtrim-bench: every figure next to its floor, measured in the
 * same run on the same machine, written as "name value" lines
 * (docs/bench.md explains every line, the options and the exit status).
 * This file measures the floors (raw Unix socket, bare nng, memcpy,
 * gather), the sync lines and compaction, and prints every line; the
 * policy lines are measured in bench_policy.c, the hostile ones in
 * hostile.c, SmolLM2's in smollm2.c, the cuda traffic in traffic.c.
 *
 * Usage: kvtrim-bench --bin-dir build/bin --out build/bench.txt [--quick]
 *        [--sync-only | --hostile-only | --smollm2-only | --traffic-only]
 * (kvtrim-bench --adversary NAME --runtime-dir DIR is one of hostile.c's
 * adversary processes.)
 */
#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <math.h>

#include "bench.h"
#include "compact.h"
#include "kernels.h"
#include "kvtrim.h"
#include "policy.h"
#include "weights.h"

static int quick;

double bench_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Sorts v. */
double bench_pct(double *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof(double), cmp_d);
	int i = (int)(p * (n - 1) + 0.5);
	return v[i];
}

/* Long runs talk: a phase's end with its time and the run's so far, on
 * stderr (the quick bench's budget in CI is a few minutes: docs/bench.md
 * says which phase costs what). */
static double t_start, t_phase;

static void phase_done(const char *name)
{
	const double t = bench_now_us();
	fprintf(stderr, "kvtrim-bench: %s done in %.1f s (%.1f s so far)\n",
	        name, (t - t_phase) / 1e6, (t - t_start) / 1e6);
	t_phase = t;
}

void bench_die(const char *what)
{
	fprintf(stderr, "kvtrim-bench: %s\n", what);
	exit(1);
}

/* ---------------------------------------------------------- floors */

static double bench_uds(int iters)
{
	int sv[2];
	char buf[64] = {1};
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
		bench_die("socketpair");
	pid_t pid = fork();
	if (pid == 0) {
		close(sv[0]);
		while (read(sv[1], buf, sizeof(buf)) == sizeof(buf))
			if (write(sv[1], buf, sizeof(buf)) != sizeof(buf))
				break;
		_exit(0);
	}
	close(sv[1]);
	double *t = malloc(sizeof(double) * (size_t)iters);
	for (int i = 0; i < iters + 1000; i++) {
		double t0 = bench_now_us();
		if (write(sv[0], buf, sizeof(buf)) != sizeof(buf) ||
		    read(sv[0], buf, sizeof(buf)) != sizeof(buf))
			bench_die("uds ping-pong");
		if (i >= 1000)
			t[i - 1000] = bench_now_us() - t0;
	}
	close(sv[0]);
	waitpid(pid, NULL, 0);
	double p50 = bench_pct(t, iters, 0.5);
	free(t);
	return p50;
}

static double bench_nng(const char *dir, int iters)
{
	char url[600];
	snprintf(url, sizeof(url), "ipc://%s/bench-nng.ipc", dir);
	pid_t pid = fork();
	if (pid == 0) {
		nng_socket s;
		nng_msg *m;
		if (nng_rep0_open(&s) || nng_listen(s, url, NULL, 0))
			_exit(1);
		while (nng_recvmsg(s, &m, 0) == 0)
			if (nng_sendmsg(s, m, 0))
				break;
		_exit(0);
	}
	nng_socket s;
	nng_msg *m;
	if (nng_req0_open(&s))
		bench_die("nng_req0_open");
	nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	int rv = -1;
	for (int i = 0; i < 200 && rv; i++) {
		rv = nng_dial(s, url, NULL, 0);
		if (rv)
			usleep(10000);
	}
	if (rv)
		bench_die("nng dial");
	double *t = malloc(sizeof(double) * (size_t)iters);
	for (int i = 0; i < iters + 1000; i++) {
		double t0 = bench_now_us();
		if (nng_msg_alloc(&m, 64) || nng_sendmsg(s, m, 0) ||
		    nng_recvmsg(s, &m, 0))
			bench_die("nng ping-pong");
		nng_msg_free(m);
		if (i >= 1000)
			t[i - 1000] = bench_now_us() - t0;
	}
	nng_close(s);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	double p50 = bench_pct(t, iters, 0.5);
	free(t);
	return p50;
}

/* ---------------------------------------------------------- daemon */

/* --backend: the sync lines on another backend (scripts/gpu-check.sh runs
 * them on cuda with --sync-only). */
static const char *backend = "cpu";

pid_t bench_spawn_daemon(const char *bin_dir, const char *dir,
                         const char *const *args)
{
	char bin[700];
	const char *argv[24];
	int n = 0;
	snprintf(bin, sizeof(bin), "%s/kvtrimd", bin_dir);
	argv[n++] = bin;
	argv[n++] = "--runtime-dir";
	argv[n++] = dir;
	argv[n++] = "--log-level";
	argv[n++] = "warning";
	for (int i = 0; args && args[i] && n < 23; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	pid_t pid = fork();
	if (pid == 0) {
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	if (pid < 0)
		return -1;
	static const char *const socks[] = {"ctl.ipc", "fd.sock", "stats.sock"};
	for (int tries = 0; tries < 1000; tries++) {
		int up = 0;
		for (int i = 0; i < 3; i++) {
			char p[800];
			struct stat st;
			snprintf(p, sizeof(p), "%s/%s", dir, socks[i]);
			up += !stat(p, &st);
		}
		if (up == 3)
			return pid;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

static pid_t start_daemon(const char *bin_dir, const char *dir)
{
	const char *const args[] = {"--backend", backend, "--pool-size", "1G",
	                            NULL};
	pid_t pid = bench_spawn_daemon(bin_dir, dir, args);
	if (pid < 0)
		bench_die("kvtrimd did not start");
	return pid;
}

/*
 * A model the size where control overhead, not KV traffic, dominates:
 * 4 layers x 2 KV heads of head_dim 64 in f16, 16-entry pages.  The
 * streaming budget of 256 entries is reached early, so every measured sync
 * evicts one entry per list and compacts.
 */
void bench_small_cfg(struct kvt_config *c, const char *dir, const char *name,
                     uint32_t seqs)
{
	memset(c, 0, sizeof(*c));
	c->runtime_dir = dir;
	c->tenant = name;
	c->geo = (struct kvt_geometry){4, 8, 2, 64, 512};
	c->dtype = KVT_DTYPE_F16;
	c->page_tokens = 16;
	c->max_seqs = seqs;
	c->max_tokens = 512;
	c->headroom = 16;
	c->policy = "streaming:sinks=4,tokens=256";
	c->timeout_ms = 5000;
}

static kvt_client *bench_client(const char *dir, uint32_t seqs)
{
	struct kvt_config c;
	kvt_client *cl;
	char err[KVT_ERRTEXT_MAX] = "";
	bench_small_cfg(&c, dir, "bench", seqs);
	int rv = kvt_connect(&c, &cl, err);
	if (rv) {
		fprintf(stderr, "kvt_connect: %s: %s\n", kvt_strerror(rv), err);
		exit(1);
	}
	return cl;
}

static void bench_sync(const char *dir, int iters, double *p50, double *p99)
{
	kvt_client *c = bench_client(dir, 1);
	kvt_seq seq;
	if (kvt_seq_open(c, &seq))
		bench_die("seq_open");
	double *t = malloc(sizeof(double) * (size_t)iters);
	for (int i = 0; i < iters + 300; i++) {
		struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
		double t0 = bench_now_us();
		if (kvt_sync(c, &it, 1))
			bench_die("sync");
		if (i >= 300)
			t[i - 300] = bench_now_us() - t0;
	}
	*p50 = bench_pct(t, iters, 0.5);
	*p99 = bench_pct(t, iters, 0.99);
	free(t);
	kvt_disconnect(c);
}

static double bench_sync64(const char *dir, int iters)
{
	kvt_client *c = bench_client(dir, 64);
	struct kvt_sync_item it[64];
	for (int s = 0; s < 64; s++) {
		if (kvt_seq_open(c, &it[s].seq))
			bench_die("seq_open");
		it[s].n_new = 1;
		it[s].phase = KVT_PHASE_DECODE;
		it[s].layer_lo = it[s].layer_hi = 0;
	}
	double *t = malloc(sizeof(double) * (size_t)iters);
	for (int i = 0; i < iters + 300; i++) {
		double t0 = bench_now_us();
		if (kvt_sync(c, it, 64))
			bench_die("sync64");
		if (i >= 300)
			t[i - 300] = bench_now_us() - t0;
	}
	double p50 = bench_pct(t, iters, 0.5) / 64;
	free(t);
	kvt_disconnect(c);
	return p50;
}

/* ---------------------------------------------------------- compaction */

static void bench_compact(double *memcpy_gbps, double *gather_gbps,
                          double *compact_gbps)
{
	/* One list of 256k entries, head_dim 128 f16 (256-byte rows), pages of
	 * 16 entries: 128 MiB of K+V.  Evict a random half. */
	const uint32_t P = 16, row = 256, len = quick ? 65536 : 262144;
	const uint32_t n_pages = len / P;
	const size_t page_bytes = 2ull * P * row;
	char *mem = malloc((size_t)n_pages * page_bytes);
	void **pages = malloc(sizeof(void *) * n_pages);
	uint8_t *drop = malloc(len);
	uint32_t *moves = malloc(sizeof(uint32_t) * 2 * len);
	if (!mem || !pages || !drop || !moves)
		bench_die("out of memory");
	memset(mem, 7, (size_t)n_pages * page_bytes);
	/* Pages in shuffled order, like a real pool. */
	for (uint32_t i = 0; i < n_pages; i++)
		pages[i] = mem + (size_t)((i * 2654435761u) % n_pages) * page_bytes;
	uint64_t x = 88172645463325252ull;
	double best_c = 1e30, best_m = 1e30;
	uint32_t n_moves = 0, new_len;
	for (int rep = 0; rep < 5; rep++) {
		for (uint32_t i = 0; i < len; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			drop[i] = x & 1;
		}
		double t0 = bench_now_us();
		n_moves = compact_plan(drop, len, moves, &new_len);
		compact_cpu(pages, P, row, moves, n_moves);
		double dt = bench_now_us() - t0;
		if (dt < best_c)
			best_c = dt;
	}
	size_t moved = (size_t)n_moves * 2 * row;
	char *src = malloc(moved), *dst = malloc(moved);
	memset(src, 3, moved);
	memset(dst, 4, moved);
	for (int rep = 0; rep < 5; rep++) {
		double t0 = bench_now_us();
		memcpy(dst, src, moved);
		double dt = bench_now_us() - t0;
		if (dt < best_m)
			best_m = dt;
	}
	if (dst[moved / 2] != 3)
		bench_die("memcpy check");
	/* Gather floor: the same number of rows, each copied from a random row
	 * of the same pool into a contiguous buffer. */
	double best_g = 1e30;
	size_t rows = moved / row, pool_rows = (size_t)n_pages * 2 * P;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = bench_now_us();
		for (size_t i = 0; i < rows; i++) {
			size_t j = (i * 2654435761u) % pool_rows;
			memcpy(dst + i * row, mem + j * row, row);
		}
		double dt = bench_now_us() - t0;
		if (dt < best_g)
			best_g = dt;
	}
	*memcpy_gbps = moved / best_m / 1e3;
	*gather_gbps = moved / best_g / 1e3;
	*compact_gbps = moved / best_c / 1e3;
	free(src);
	free(dst);
	free(mem);
	free(pages);
	free(drop);
	free(moves);
}

/*
 * The figures as written: every "name value" line of out must hold a
 * finite number (the one text value, cuda_daemon_cpu_backend, aside) and
 * no phase may have written a "# ... failed" line.  Each offence goes to
 * stderr; the number of them is returned (kvtrim-bench then exits 1, so
 * a figure that vanished into nan cannot pass unnoticed; a phase skipped
 * for a stated reason writes "# ... skipped: why" and no figures).
 */
static int bench_verify(const char *out)
{
	FILE *f = fopen(out, "r");
	char line[512];
	int bad = 0;
	if (!f) {
		fprintf(stderr, "kvtrim-bench: cannot read back %s\n", out);
		return 1;
	}
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		if (line[0] == '#') {
			if (strstr(line, " failed")) {
				fprintf(stderr, "kvtrim-bench: FAILED: %s\n",
				        line + 2);
				bad++;
			}
			continue;
		}
		char *sp = strchr(line, ' ');
		char *end = NULL;
		double v = sp ? strtod(sp + 1, &end) : NAN;
		if (sp && !strncmp(line, "cuda_daemon_cpu_backend ", 24))
			continue;
		if (!sp || end == sp + 1 || *end || !isfinite(v)) {
			fprintf(stderr, "kvtrim-bench: FAILED: %s is not a "
			        "finite number\n", line);
			bad++;
		}
	}
	fclose(f);
	return bad;
}

int main(int argc, char **argv)
{
	const char *bin_dir = "build/bin", *out = "build/bench.txt";
	int sync_only = 0, hostile_only = 0, smollm2_only = 0, traffic_only = 0;
	if (argc > 1 && !strcmp(argv[1], "--adversary"))
		return hostile_adversary_main(argc, argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--bin-dir") && i + 1 < argc)
			bin_dir = argv[++i];
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out = argv[++i];
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
			backend = argv[++i];
		else if (!strcmp(argv[i], "--sync-only"))
			sync_only = 1;
		else if (!strcmp(argv[i], "--hostile-only"))
			hostile_only = 1;
		else if (!strcmp(argv[i], "--smollm2-only"))
			smollm2_only = 1;
		else if (!strcmp(argv[i], "--traffic-only"))
			traffic_only = 1;
		else {
			fprintf(stderr, "usage: kvtrim-bench [--bin-dir DIR] "
			        "[--out FILE] [--quick] [--backend cpu|cuda] "
			        "[--sync-only | --hostile-only | "
			        "--smollm2-only | --traffic-only]\n");
			return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	/* One thread, like the daemon's scorers (daemon/main.c). */
	openblas_set_num_threads(1);
	char dir[] = "/tmp/kvtrim-bench-XXXXXX";
	if (!mkdtemp(dir))
		bench_die("mkdtemp");
	int iters = quick ? 2000 : 20000;
	/* --traffic-only runs only the cuda traffic lines */
	if (traffic_only)
		hostile_only = smollm2_only = sync_only = 0;

	double uds = 0, nng = 0, p50 = 0, p99 = 0, s64 = 0;
	double mg = 0, gg = 0, cg = 0;
	struct bench_policy pb;
	memset(&pb, 0, sizeof(pb));
	t_start = t_phase = bench_now_us();
	if (!hostile_only && !smollm2_only && !traffic_only) {
		uds = bench_uds(iters);
		nng = bench_nng(dir, iters);
		pid_t d = start_daemon(bin_dir, dir);
		bench_sync(dir, iters, &p50, &p99);
		s64 = bench_sync64(dir, quick ? 300 : 3000);
		if (!sync_only) {
			bench_compact(&mg, &gg, &cg);
			bench_policy_run(&pb, bin_dir, dir, d, quick);
		}
		kill(d, SIGTERM);
		int st;
		waitpid(d, &st, 0);
		phase_done("floors, sync and policies");
	}
	/* The hostile phases re-run this binary as their adversaries. */
	char self[4096];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (!sync_only && !smollm2_only && !traffic_only && sl > 0) {
		self[sl] = '\0';
		hostile_run(self, bin_dir, dir, quick);
		phase_done("hostile");
	} else if (!sync_only && !smollm2_only && !traffic_only) {
		fprintf(stderr, "kvtrim-bench: no /proc/self/exe: the hostile "
		        "figures are left out\n");
	}
	if (!sync_only && !hostile_only && !traffic_only) {
		smollm2_run(bin_dir, dir, quick);
		phase_done("smollm2");
	}
	if (!sync_only && !hostile_only && !smollm2_only) {
		traffic_run(bin_dir, dir, quick);
		phase_done("cuda traffic");
	}

	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		fprintf(stderr, "kvtrim-bench: could not remove %s\n", dir);

	FILE *f = fopen(out, "w");
	if (!f)
		bench_die("cannot write the output file");
	FILE *outs[2] = {stdout, f};
	for (int i = 0; i < 2; i++) {
		if (hostile_only) {
			hostile_print(outs[i]);
			continue;
		}
		if (smollm2_only) {
			smollm2_print(outs[i]);
			continue;
		}
		if (traffic_only) {
			traffic_print(outs[i]);
			continue;
		}
		fprintf(outs[i], "uds_rtt_p50_us %.1f\n", uds);
		fprintf(outs[i], "nng_rtt_p50_us %.1f\n", nng);
		fprintf(outs[i], "sync_rtt_p50_us %.1f\n", p50);
		fprintf(outs[i], "sync_rtt_p99_us %.1f\n", p99);
		fprintf(outs[i], "sync_rtt_vs_nng %.2f\n", p50 / nng);
		fprintf(outs[i], "sync64_us_per_seq %.2f\n", s64);
		if (sync_only)
			continue;
		fprintf(outs[i], "memcpy_gbps %.2f\n", mg);
		fprintf(outs[i], "gather_gbps %.2f\n", gg);
		fprintf(outs[i], "compact_gbps %.2f\n", cg);
		fprintf(outs[i], "compact_vs_memcpy %.2f\n", cg / mg);
		fprintf(outs[i], "compact_vs_gather %.2f\n", cg / gg);
		fprintf(outs[i], "sgemm_gflops %.1f\n", pb.sgemm_gflops);
		fprintf(outs[i], "kvzap_mlp_tokens_per_s %.0f\n", pb.mlp_tps);
		fprintf(outs[i], "kvzap_mlp_gflops %.1f\n", pb.mlp_gflops);
		fprintf(outs[i], "kvzap_mlp_vs_sgemm %.2f\n",
		        pb.mlp_gflops / pb.sgemm_gflops);
		fprintf(outs[i], "kvzap_linear_tokens_per_s %.0f\n", pb.lin_tps);
		fprintf(outs[i], "fastkvzip_tokens_per_s %.0f\n", pb.fkv_tps);
		fprintf(outs[i], "kvpop_tokens_per_s %.0f\n", pb.kvpop_tps);
		fprintf(outs[i], "attn_band_us %.1f\n", pb.band_us);
		fprintf(outs[i], "attn_band_sgemm_us %.1f\n", pb.band_sgemm_us);
		fprintf(outs[i], "attn_band_vs_sgemm %.2f\n",
		        pb.band_sgemm_us / pb.band_us);
		for (int k = 0; k < pb.n; k++)
			fprintf(outs[i], "daemon_us_per_token_%s %.1f\n",
			        pb.names[k], pb.us_per_token[k]);
		for (int k = 0; k < pb.n; k++)
			fprintf(outs[i], "daemon_sync_us_per_token_%s %.1f\n",
			        pb.names[k], pb.sync_us[k]);
		for (int k = 0; k < pb.n; k++)
			fprintf(outs[i], "daemon_prefill_us_per_token_%s %.1f\n",
			        pb.names[k], pb.prefill_us[k]);
		hostile_print(outs[i]);
		smollm2_print(outs[i]);
		traffic_print(outs[i]);
	}
	fclose(f);
	int bad = bench_verify(out);
	if (bad)
		fprintf(stderr, "kvtrim-bench: %d figure(s) failed (above); "
		        "exit 1\n", bad);
	return bad ? 1 : 0;
}
