/*
 * bench.c — kvtrim-bench: every figure next to its floor, measured in the
 * same run on the same machine, written as "name value" lines.
 *
 *   uds_rtt_p50_us       raw AF_UNIX SOCK_SEQPACKET ping-pong, 64 B, two
 *                        processes (floor of any local RPC)
 *   nng_rtt_p50_us       bare nng req0/rep0 over ipc://, 64 B, two processes
 *                        (floor of the control plane)
 *   sync_rtt_p50_us/p99  one-sequence decode sync through kvtrimd, streaming
 *   sync64_us_per_seq    one sync carrying 64 sequences, / 64
 *   memcpy_gbps          memcpy of the bytes a compaction moves, contiguous
 *   gather_gbps          the same number of rows, each memcpy'd from a
 *                        random row of the same memory (floor of any
 *                        scattered-row copy)
 *   compact_gbps         plan + move of a 50% random eviction on one long
 *                        list (bytes of kept entries moved per second)
 *
 *
 * Policies at 8B geometry (d_model 4096, 36 layers, 32 heads, 8 KV heads,
 * head_dim 128), in process, one thread:
 *   sgemm_gflops               cblas_sgemm on the KVzap-MLP first-layer
 *                              shape (16 x 4096 x 512): the floor
 *   kvzap_mlp_tokens_per_s     scorer_mlp_cpu, hidden 512, 16 tokens a call
 *   kvzap_mlp_gflops           its FLOP rate (target >= 0.8 x sgemm_gflops)
 *   kvzap_linear_tokens_per_s  scorer_linear_cpu, 8 outputs
 *   fastkvzip_tokens_per_s     sink_gate_cpu, D' 16, S 16
 *   kvpop_tokens_per_s         kvpop's decide() on one layer, 16 new tokens,
 *                              lists of 512 entries, r 16, m 64 (per layer)
 *   daemon_us_per_token_<p>    policy_decide() time of one sequence's sync
 *                              of 16 decode tokens over all 36 layers
 *                              (lists of 512 entries, f16 pages), / 16:
 *                              the policy's part of the daemon's CPU time
 *                              per decoded token; measured by timing the
 *                              decide calls the tenant makes, not through
 *                              IPC (compaction is compact_gbps above)
 *
 * Usage: kvtrim-bench --bin-dir build/bin --out build/bench.txt [--quick]
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

#include "compact.h"
#include "kernels.h"
#include "kvtrim.h"
#include "policy.h"
#include "weights.h"

static int quick;

static double now_us(void)
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

static double pct(double *v, int n, double p)
{
	qsort(v, (size_t)n, sizeof(double), cmp_d);
	int i = (int)(p * (n - 1) + 0.5);
	return v[i];
}

static void die(const char *what)
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
		die("socketpair");
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
		double t0 = now_us();
		if (write(sv[0], buf, sizeof(buf)) != sizeof(buf) ||
		    read(sv[0], buf, sizeof(buf)) != sizeof(buf))
			die("uds ping-pong");
		if (i >= 1000)
			t[i - 1000] = now_us() - t0;
	}
	close(sv[0]);
	waitpid(pid, NULL, 0);
	double p50 = pct(t, iters, 0.5);
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
		die("nng_req0_open");
	nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	int rv = -1;
	for (int i = 0; i < 200 && rv; i++) {
		rv = nng_dial(s, url, NULL, 0);
		if (rv)
			usleep(10000);
	}
	if (rv)
		die("nng dial");
	double *t = malloc(sizeof(double) * (size_t)iters);
	for (int i = 0; i < iters + 1000; i++) {
		double t0 = now_us();
		if (nng_msg_alloc(&m, 64) || nng_sendmsg(s, m, 0) ||
		    nng_recvmsg(s, &m, 0))
			die("nng ping-pong");
		nng_msg_free(m);
		if (i >= 1000)
			t[i - 1000] = now_us() - t0;
	}
	nng_close(s);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	double p50 = pct(t, iters, 0.5);
	free(t);
	return p50;
}

/* ---------------------------------------------------------- daemon */

static pid_t start_daemon(const char *bin_dir, const char *dir)
{
	char bin[600], ctl[600];
	snprintf(bin, sizeof(bin), "%s/kvtrimd", bin_dir);
	snprintf(ctl, sizeof(ctl), "%s/ctl.ipc", dir);
	pid_t pid = fork();
	if (pid == 0) {
		execl(bin, bin, "--runtime-dir", dir, "--backend", "cpu",
		      "--pool-size", "1G", "--log-level", "warning", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		struct stat st;
		if (!stat(ctl, &st))
			return pid;
		usleep(10000);
	}
	die("kvtrimd did not start");
	return -1;
}

/*
 * A model the size where control overhead, not KV traffic, dominates:
 * 4 layers x 2 KV heads of head_dim 64 in f16, 16-entry pages.  The
 * streaming budget of 256 entries is reached early, so every measured sync
 * evicts one entry per list and compacts.
 */
static kvt_client *bench_client(const char *dir, uint32_t seqs)
{
	struct kvt_config c;
	kvt_client *cl;
	char err[KVT_ERRTEXT_MAX] = "";
	memset(&c, 0, sizeof(c));
	c.runtime_dir = dir;
	c.tenant = "bench";
	c.geo = (struct kvt_geometry){4, 8, 2, 64, 512};
	c.dtype = KVT_DTYPE_F16;
	c.page_tokens = 16;
	c.max_seqs = seqs;
	c.max_tokens = 512;
	c.headroom = 16;
	c.policy = "streaming:sinks=4,tokens=256";
	c.timeout_ms = 5000;
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
		die("seq_open");
	double *t = malloc(sizeof(double) * (size_t)iters);
	for (int i = 0; i < iters + 300; i++) {
		struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
		double t0 = now_us();
		if (kvt_sync(c, &it, 1))
			die("sync");
		if (i >= 300)
			t[i - 300] = now_us() - t0;
	}
	*p50 = pct(t, iters, 0.5);
	*p99 = pct(t, iters, 0.99);
	free(t);
	kvt_disconnect(c);
}

static double bench_sync64(const char *dir, int iters)
{
	kvt_client *c = bench_client(dir, 64);
	struct kvt_sync_item it[64];
	for (int s = 0; s < 64; s++) {
		if (kvt_seq_open(c, &it[s].seq))
			die("seq_open");
		it[s].n_new = 1;
		it[s].phase = KVT_PHASE_DECODE;
		it[s].layer_lo = it[s].layer_hi = 0;
	}
	double *t = malloc(sizeof(double) * (size_t)iters);
	for (int i = 0; i < iters + 300; i++) {
		double t0 = now_us();
		if (kvt_sync(c, it, 64))
			die("sync64");
		if (i >= 300)
			t[i - 300] = now_us() - t0;
	}
	double p50 = pct(t, iters, 0.5) / 64;
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
		die("out of memory");
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
		double t0 = now_us();
		n_moves = compact_plan(drop, len, moves, &new_len);
		compact_cpu(pages, P, row, moves, n_moves);
		double dt = now_us() - t0;
		if (dt < best_c)
			best_c = dt;
	}
	size_t moved = (size_t)n_moves * 2 * row;
	char *src = malloc(moved), *dst = malloc(moved);
	memset(src, 3, moved);
	memset(dst, 4, moved);
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_us();
		memcpy(dst, src, moved);
		double dt = now_us() - t0;
		if (dt < best_m)
			best_m = dt;
	}
	if (dst[moved / 2] != 3)
		die("memcpy check");
	/* Gather floor: the same number of rows, each copied from a random row
	 * of the same pool into a contiguous buffer. */
	double best_g = 1e30;
	size_t rows = moved / row, pool_rows = (size_t)n_pages * 2 * P;
	for (int rep = 0; rep < 5; rep++) {
		double t0 = now_us();
		for (size_t i = 0; i < rows; i++) {
			size_t j = (i * 2654435761u) % pool_rows;
			memcpy(dst + i * row, mem + j * row, row);
		}
		double dt = now_us() - t0;
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

/* ---------------------------------------------------------- policies */

#define B_D 4096u
#define B_L 36u
#define B_H 32u
#define B_KV 8u
#define B_HD 128u
#define B_N 16u    /* tokens per sync */
#define B_LEN 512u /* entries per list */

static float *rnd(size_t n, uint64_t seed, float scale)
{
	float *v = malloc(n * sizeof(float) + 1);
	if (!v)
		die("out of memory");
	uint64_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		v[i] = ((float)(x >> 40) / 16777216.0f - 0.5f) * scale;
	}
	return v;
}

/* Best of reps of fn's duration in us. */
#define BEST_US(reps, stmt)                                                    	({                                                                     		double best_ = 1e30;                                           		for (int r_ = 0; r_ < (reps); r_++) {                          			double t0_ = now_us();                                 			stmt;                                                  			double dt_ = now_us() - t0_;                           			if (dt_ < best_)                                       				best_ = dt_;                                   		}                                                              		best_;                                                         	})

struct pbench {
	double sgemm_gflops, mlp_tps, mlp_gflops, lin_tps, fkv_tps, kvpop_tps;
	const char *names[9];
	double us_per_token[9];
	int n;
};

static void bench_scorers(struct pbench *b)
{
	const uint32_t h = 512, n = B_N;
	float *x = rnd((size_t)n * B_D, 1, 1.0f);
	float *W1 = rnd((size_t)h * B_D, 2, 0.05f), *b1 = rnd(h, 3, 0.1f);
	float *W2 = rnd((size_t)B_KV * h, 4, 0.1f), *b2 = rnd(B_KV, 5, 0.1f);
	float *y = malloc(sizeof(float) * n * h), *hs = malloc(sizeof(float) * n * h);
	int reps = quick ? 20 : 200;
	double t = BEST_US(reps, cblas_sgemm(CblasRowMajor, CblasNoTrans,
	                                     CblasTrans, n, h, B_D, 1.0f, x,
	                                     B_D, W1, B_D, 0.0f, hs, h));
	b->sgemm_gflops = 2.0 * n * h * B_D / t / 1e3;
	t = BEST_US(reps, scorer_mlp_cpu(x, n, B_D, W1, b1, h, W2, b2, B_KV, y,
	                                 hs));
	b->mlp_tps = n / t * 1e6;
	b->mlp_gflops = 2.0 * n * ((double)h * B_D + (double)B_KV * h) / t / 1e3;
	float *Wl = rnd((size_t)B_KV * B_D, 6, 0.05f);
	t = BEST_US(reps, scorer_linear_cpu(x, n, B_D, Wl, b2, B_KV, y));
	b->lin_tps = n / t * 1e6;
	const uint32_t G = B_H / B_KV, dp = 16, S = 16;
	float *Wq = rnd((size_t)B_KV * G * dp * B_D, 7, 0.05f);
	float *cq = rnd((size_t)B_KV * G * dp, 8, 0.1f);
	float *Wk = rnd((size_t)B_KV * dp * B_D, 9, 0.05f);
	float *g1 = rnd(dp, 10, 1.0f), *sk = rnd((size_t)B_KV * S * dp, 11, 1.0f);
	float *bias = rnd((size_t)B_KV * G, 12, 1.0f);
	float *sc = malloc(sizeof(float) * n * B_KV * (G + 1) * dp);
	t = BEST_US(reps, sink_gate_cpu(x, n, B_D, B_KV, G, dp, S, Wq, cq, Wk,
	                                g1, g1, sk, bias, y, sc));
	b->fkv_tps = n / t * 1e6;
	free(x); free(W1); free(b1); free(W2); free(b2); free(y); free(hs);
	free(Wl); free(Wq); free(cq); free(Wk); free(g1); free(sk); free(bias);
	free(sc);
}

/* Writes weights for layers [0, L) of a learned policy into path. */
static void bench_weights(const char *name, const char *path, uint32_t L)
{
	struct weights_tensor t[8 * B_L];
	float *data[8 * B_L];
	char nm[8 * B_L][48];
	size_t n = 0;
	const uint32_t G = B_H / B_KV;
#define ADD(fmt, nd, s0, s1, s2, s3)                                           	do {                                                                   		snprintf(nm[n], 48, fmt, l);                                   		uint64_t sh_[4] = {s0, s1, s2, s3}, ne_ = 1;                   		for (int d_ = 0; d_ < nd; d_++)                                			ne_ *= sh_[d_];                                        		data[n] = rnd(ne_, n + 100, 0.05f);                            		t[n] = (struct weights_tensor){nm[n], nd, {s0, s1, s2, s3},    		                               data[n]};                       		n++;                                                           	} while (0)
	for (uint32_t l = 0; l < L; l++) {
		if (!strcmp(name, "kvzap")) {
			ADD("kvzap.%u.fc1.weight", 2, 512, B_D, 0, 0);
			ADD("kvzap.%u.fc1.bias", 1, 512, 0, 0, 0);
			ADD("kvzap.%u.fc2.weight", 2, B_KV, 512, 0, 0);
			ADD("kvzap.%u.fc2.bias", 1, B_KV, 0, 0, 0);
		} else if (!strcmp(name, "fastkvzip")) {
			ADD("fastkvzip.%u.q_proj.weight", 2, B_KV * G * 16, B_D, 0, 0);
			ADD("fastkvzip.%u.q_proj.bias", 1, B_KV * G * 16, 0, 0, 0);
			ADD("fastkvzip.%u.k_proj.weight", 2, B_KV * 16, B_D, 0, 0);
			ADD("fastkvzip.%u.q_norm.weight", 1, 16, 0, 0, 0);
			ADD("fastkvzip.%u.k_norm.weight", 1, 16, 0, 0, 0);
			ADD("fastkvzip.%u.k_base", 4, B_KV, 1, 16, 16);
			ADD("fastkvzip.%u.b", 3, B_KV, 1, G, 0);
		} else {
			ADD("kvpop.%u.proj.weight", 2, 16, B_D, 0, 0);
			ADD("kvpop.%u.fc1.weight", 2, 64, 17, 0, 0);
			ADD("kvpop.%u.fc1.bias", 1, 64, 0, 0, 0);
			ADD("kvpop.%u.fc2.weight", 2, B_KV, 64, 0, 0);
			ADD("kvpop.%u.fc2.bias", 1, B_KV, 0, 0, 0);
		}
	}
#undef ADD
	char err[KVT_ERRTEXT_MAX];
	if (weights_write(path, t, n, err, sizeof(err)))
		die(err);
	for (size_t i = 0; i < n; i++)
		free(data[i]);
}

/*
 * Times policy_decide for one sequence's sync of B_N decode tokens over
 * `layers` layers (lists of B_LEN entries per KV head, f16 pages, staged
 * inputs random, lse so weights stay finite); returns us per token scaled
 * to all 36 layers.
 */
static double bench_decide(const char *spec, uint32_t layers)
{
	struct policy_geom ge = {B_L, B_H, B_KV, B_HD, B_D, 16, KVT_DTYPE_F16,
	                         B_N};
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX];
	if (policy_create(spec, &ge, &p, err, sizeof(err)))
		die(err);
	uint32_t len = B_LEN + B_N, pages = (len + 15) / 16;
	size_t page_bytes = 2ull * 16 * B_HD * 2;
	char *mem = malloc(B_KV * pages * page_bytes);
	float *kf = rnd((size_t)B_KV * pages * 32 * B_HD, 21, 0.2f);
	dtype_from_f32(kf, KVT_DTYPE_F16, mem, (size_t)B_KV * pages * 32 * B_HD);
	free(kf);
	void **pv = malloc(sizeof(void *) * B_KV * pages);
	uint32_t *pos = malloc(sizeof(uint32_t) * len);
	uint32_t ef = p->entry_floats ? p->entry_floats : 1;
	float *ent = calloc((size_t)B_KV * len * ef, sizeof(float));
	uint8_t *drop = malloc((size_t)B_KV * len);
	uint8_t *state = calloc(p->layer_state_bytes + 1, 1);
	float *x = rnd((size_t)B_N * B_D, 22, 1.0f);
	float *q = rnd((size_t)B_N * B_H * B_HD, 23, 0.2f);
	float *lse = rnd((size_t)B_N * B_H, 24, 0.0f);
	for (uint32_t i = 0; i < B_N * B_H; i++)
		lse[i] = logf((float)len); /* weights ~ 1 / len */
	for (uint32_t i = 0; i < len; i++)
		pos[i] = i;
	for (uint32_t i = 0; i < B_KV * pages; i++)
		pv[i] = mem + i * page_bytes;
	struct policy_head heads[B_KV];
	double best = 1e30;
	for (int rep = 0; rep < (quick ? 2 : 3); rep++) {
		double t0 = now_us();
		for (uint32_t l = 0; l < layers; l++) {
			for (uint32_t g = 0; g < B_KV; g++) {
				memset(drop + (size_t)g * len, 0, len);
				heads[g] = (struct policy_head){
					pos, p->entry_floats ? ent + (size_t)g * len * ef : NULL,
					pv + (size_t)g * pages, len,
					drop + (size_t)g * len};
			}
			struct policy_layer pl = {
				.layer = l, .phase = KVT_PHASE_DECODE,
				.n_new = B_N, .n_seen = len + 4096, .x = x,
				.q = q, .lse = lse, .heads = heads,
				.state = p->layer_state_bytes ? state : NULL};
			/* n_seen beyond len so window rules see an old list */
			for (uint32_t i = 0; i < len; i++)
				pos[i] = 4096 + i;
			if (policy_decide(p, &pl))
				die("policy_decide");
		}
		double dt = now_us() - t0;
		if (dt < best)
			best = dt;
	}
	free(mem); free(pv); free(pos); free(ent); free(drop); free(state);
	free(x); free(q); free(lse);
	policy_free(p);
	return best * ((double)B_L / layers) / B_N;
}

static void bench_policies(struct pbench *b, const char *dir)
{
	bench_scorers(b);
	uint32_t L = quick ? 2 : 4; /* layers timed, scaled to 36 */
	char wz[600], wf[600], wp[600];
	snprintf(wz, sizeof(wz), "%s/kvzap.safetensors", dir);
	snprintf(wf, sizeof(wf), "%s/fastkvzip.safetensors", dir);
	snprintf(wp, sizeof(wp), "%s/kvpop.safetensors", dir);
	/* learned weights for all 36 layers (the geometry is checked) */
	bench_weights("kvzap", wz, B_L);
	bench_weights("fastkvzip", wf, B_L);
	bench_weights("kvpop", wp, B_L);
	char specs[9][700];
	snprintf(specs[0], 700, "full");
	snprintf(specs[1], 700, "random:tokens=512");
	snprintf(specs[2], 700, "streaming:tokens=512");
	snprintf(specs[3], 700, "h2o:tokens=512");
	snprintf(specs[4], 700, "snapkv:tokens=512");
	snprintf(specs[5], 700, "tova:tokens=512");
	snprintf(specs[6], 700, "kvzap:model=%s", wz);
	snprintf(specs[7], 700, "fastkvzip:model=%s,every=16", wf);
	snprintf(specs[8], 700, "kvpop:model=%s,tokens=512,delay=32", wp);
	static const char *const names[9] = {"full", "random", "streaming",
	                                      "h2o", "snapkv", "tova", "kvzap",
	                                      "fastkvzip", "kvpop"};
	for (int i = 0; i < 9; i++) {
		b->names[i] = names[i];
		b->us_per_token[i] = bench_decide(specs[i], L);
	}
	b->n = 9;
	/* kvpop alone on one layer: tokens scored per second */
	double us = b->us_per_token[8] * B_N / B_L; /* per layer per sync */
	b->kvpop_tps = B_N / us * 1e6;
	unlink(wz);
	unlink(wf);
	unlink(wp);
}

int main(int argc, char **argv)
{
	const char *bin_dir = "build/bin", *out = "build/bench.txt";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--bin-dir") && i + 1 < argc)
			bin_dir = argv[++i];
		else if (!strcmp(argv[i], "--out") && i + 1 < argc)
			out = argv[++i];
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else {
			fprintf(stderr, "usage: kvtrim-bench [--bin-dir DIR] "
			        "[--out FILE] [--quick]\n");
			return 2;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	char dir[] = "/tmp/kvtrim-bench-XXXXXX";
	if (!mkdtemp(dir))
		die("mkdtemp");
	int iters = quick ? 2000 : 20000;

	double uds = bench_uds(iters);
	double nng = bench_nng(dir, iters);
	pid_t d = start_daemon(bin_dir, dir);
	double p50, p99;
	bench_sync(dir, iters, &p50, &p99);
	double s64 = bench_sync64(dir, quick ? 300 : 3000);
	kill(d, SIGTERM);
	int st;
	waitpid(d, &st, 0);
	double mg, gg, cg;
	bench_compact(&mg, &gg, &cg);
	struct pbench pb;
	memset(&pb, 0, sizeof(pb));
	bench_policies(&pb, dir);

	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd))
		fprintf(stderr, "kvtrim-bench: could not remove %s\n", dir);

	FILE *f = fopen(out, "w");
	if (!f)
		die("cannot write the output file");
	FILE *outs[2] = {stdout, f};
	for (int i = 0; i < 2; i++) {
		fprintf(outs[i], "uds_rtt_p50_us %.1f\n", uds);
		fprintf(outs[i], "nng_rtt_p50_us %.1f\n", nng);
		fprintf(outs[i], "sync_rtt_p50_us %.1f\n", p50);
		fprintf(outs[i], "sync_rtt_p99_us %.1f\n", p99);
		fprintf(outs[i], "sync_rtt_vs_nng %.2f\n", p50 / nng);
		fprintf(outs[i], "sync64_us_per_seq %.2f\n", s64);
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
		for (int k = 0; k < pb.n; k++)
			fprintf(outs[i], "daemon_us_per_token_%s %.1f\n",
			        pb.names[k], pb.us_per_token[k]);
	}
	fclose(f);
	return 0;
}
