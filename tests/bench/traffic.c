/*
 * traffic.c — kvtrim-bench's host <-> device lines (docs/bench.md,
 * "Host-device traffic", lists every line, the geometry and the target:
 * at most 4 KB per decoded token per sequence for every policy).  A fresh
 * kvtrimd --backend cuda on the CPU emulator's library
 * (build/lib/emu/libkvtrim-cuda.so) and, for every policy kvtrimd lists, a
 * synthetic engine at the 8B geometry with 2 sequences that writes K/V
 * with kvt_memcpy and stages the inputs the policy reads.
 *
 * KVTRIM_BENCH_CUDA_LIB=PATH runs on that (real) libkvtrim-cuda.so instead
 * of the emulated one (scripts/gpu-check.sh on a GPU host);
 * KVTRIM_BENCH_TRAFFIC=name[,name...] measures only those policies.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "dtype.h"
#include "kvtrim.h"
#include "rndweights.h"

#define T_L 32u
#define T_H 32u
#define T_KV 8u
#define T_HD 128u
#define T_D 4096u
#define T_SEQS 2u     /* the bytes lines */
#define T_MAXSEQS 64u /* the host CPU lines (goal: 5 us a token) */
#define T_CHUNK 128u /* a prefill sync; the headroom */
#define T_EVERY 16u  /* decode tokens a sync */
#define T_BUDGET 128u
#define T_MAXPOL 32

/* What run_policy measured, per decoded token per sequence over the
 * measured syncs (NAN: not measured): the bytes the daemon's backend
 * moved, those of the first decode sync (per sequence), the daemon's CPU
 * time (every thread), and the host side of the syncs (their CPU time,
 * sync_cpu_ns_total, less the emulated device's work). */
struct t_meas {
	double daemon_b, first_b, cpu_us, host_us;
};

static struct {
	int ran;
	char skipped[800];
	int n;
	char names[T_MAXPOL][32];
	/* run_policy's: at T_SEQS (bytes) and at T_MAXSEQS (host CPU) */
	struct t_meas bytes[T_MAXPOL], host[T_MAXPOL];
	/* launches a sync at 1 and at LS_SEQS sequences (launch_policy) */
	double ls1[T_MAXPOL], lsn[T_MAXPOL];
	/* launches a sync, SH_TENANTS kvzap tenants of SH_SEQS sequences on
	 * the same weights: one after the other, and at once (shared_kvzap);
	 * NAN when not measured */
	double sh_alone, sh_shared;
	int emu; /* the library is the emulator's */
} ts;

/* The policies kvtrimd lists (`kvtrimd --list-policies`: a name first on
 * each line), into ts.names. */
static void list_policies(const char *bin_dir)
{
	char cmd[700], line[512];
	snprintf(cmd, sizeof(cmd), "'%s/kvtrimd' --list-policies 2>/dev/null",
	         bin_dir);
	FILE *p = popen(cmd, "r");
	if (!p)
		return;
	const char *only = getenv("KVTRIM_BENCH_TRAFFIC");
	while (fgets(line, sizeof(line), p) && ts.n < T_MAXPOL) {
		char nm[32];
		if (sscanf(line, "%31s", nm) != 1)
			continue;
		if (only && *only && !strstr(only, nm))
			continue;
		snprintf(ts.names[ts.n++], sizeof(ts.names[0]), "%s", nm);
	}
	pclose(p);
}

/* device_launches_total now; NAN if unread. */
static double daemon_launches(const char *bin_dir, const char *dir)
{
	static const char *const keys[] = {"device_launches_total"};
	double v;
	bench_ctl_stats(bin_dir, dir, keys, &v, 1);
	return v;
}

/* What the synthetic engine writes for geometry g: K and V rows (f16) for
 * n <= T_CHUNK tokens of every KV head from any of 64 starting rows, and
 * staged rows (x, q: f32) likewise, so that a step of many sequences costs
 * the bench one kvt_write_kv and one kvt_stage per (sequence, layer). */
struct t_rows {
	struct kvt_geometry g;
	uint16_t *k, *v; /* [64][T_CHUNK][n_kv_heads][head_dim]: pattern row
	                    (b + t + h) % 64 */
	float *x, *q;    /* [64 + T_CHUNK][d_model], [64 + T_CHUNK][n_heads *
	                    head_dim] */
};

static void rows_free(struct t_rows *r)
{
	free(r->k);
	free(r->v);
	free(r->x);
	free(r->q);
}

static int rows_make(struct t_rows *r, const struct kvt_geometry *g)
{
	const uint32_t hd = g->head_dim, kvh = g->n_kv_heads;
	const size_t per = (size_t)T_CHUNK * kvh * hd;
	const size_t qd = (size_t)g->n_heads * hd, rows = 64 + T_CHUNK;
	float *f = malloc(128 * hd * sizeof(float));
	uint16_t *pat = malloc(128 * hd * sizeof(uint16_t));
	r->g = *g;
	r->k = malloc(64 * per * sizeof(uint16_t));
	r->v = malloc(64 * per * sizeof(uint16_t));
	r->x = malloc(rows * g->d_model * sizeof(float));
	r->q = malloc(rows * qd * sizeof(float));
	if (!f || !pat || !r->k || !r->v || !r->x || !r->q) {
		free(f);
		free(pat);
		rows_free(r);
		return -1;
	}
	/* 64 K rows then 64 V rows, f16 of the pattern */
	bench_fill_rnd(f, 128 * hd, 7, 1.0f);
	dtype_from_f32(f, KVT_DTYPE_F16, pat, 128 * hd);
	for (uint32_t b = 0; b < 64; b++)
		for (uint32_t t = 0; t < T_CHUNK; t++)
			for (uint32_t h = 0; h < kvh; h++) {
				size_t at = ((b * T_CHUNK + t) * kvh + h) * hd;
				uint32_t row = (b + t + h) % 64;
				memcpy(r->k + at, pat + row * hd, hd * 2);
				memcpy(r->v + at, pat + (64 + row) * hd, hd * 2);
			}
	bench_fill_rnd(r->x, rows * g->d_model, 11, 1.0f);
	bench_fill_rnd(r->q, rows * qd, 13, 1.0f);
	free(f);
	free(pat);
	return 0;
}

/* One sync of n new tokens of every sequence of seq[0..ns). */
static int ls_sync(kvt_client *c, const kvt_seq *seq, uint32_t ns,
                   uint32_t n, enum kvt_phase phase)
{
	struct kvt_sync_item it[T_MAXSEQS];
	for (uint32_t s = 0; s < ns; s++)
		it[s] = (struct kvt_sync_item){seq[s], n, phase, 0, 0};
	return kvt_sync(c, it, ns);
}

/*
 * Appends n <= T_CHUNK tokens at position pos to sequences seq[0..ns): K/V
 * of every list (kvt_write_kv), the staged inputs the policy reads
 * (kvt_stage: the client copies only those), then one sync of them all.
 * 0 or the first failing call's code.
 */
static int step(kvt_client *c, const kvt_seq *seq, uint32_t ns, uint32_t pos,
                uint32_t n, enum kvt_phase phase, const struct t_rows *r)
{
	const struct kvt_geometry *g = &r->g;
	const size_t per = (size_t)T_CHUNK * g->n_kv_heads * g->head_dim;
	const size_t qd = (size_t)g->n_heads * g->head_dim;
	static float lse[T_CHUNK * T_H];
	/* finite, near the log of the list's length */
	for (uint32_t k = 0; k < n; k++)
		for (uint32_t h = 0; h < g->n_heads; h++)
			lse[k * g->n_heads + h] = logf((float)(pos + k + 1)) +
			                          0.1f * (float)(h % 5);
	for (uint32_t s = 0; s < ns; s++)
		for (uint32_t l = 0; l < g->n_layers; l++) {
			const uint32_t b = (pos + l + s) % 64;
			int rv = kvt_write_kv(c, seq[s], l, 0, n, r->k + b * per,
			                      r->v + b * per,
			                      g->n_kv_heads * g->head_dim,
			                      g->head_dim);
			if (!rv)
				rv = kvt_stage(c, seq[s], l, pos, n,
				               r->x + (size_t)b * g->d_model,
				               r->q + b * qd, lse);
			if (rv)
				return rv;
		}
	return ls_sync(c, seq, ns, n, phase);
}

/* The policies that read weights (random ones here, rndweights.h). */
static int is_learned(const char *nm)
{
	return !strcmp(nm, "kvzap") || !strcmp(nm, "fastkvzip") ||
	       !strcmp(nm, "kvpop");
}

/* The spec of one policy: budgets of budget entries, windows of window
 * (the prompt selections), learned ones on random weights (rndweights.h)
 * at path.  0, or -1 when it does not fit. */
static int spec_of(const char *nm, const char *path, uint32_t budget,
                   uint32_t window, char *spec, size_t n)
{
	int k;
	if (!strcmp(nm, "full"))
		k = snprintf(spec, n, "full");
	else if (!strcmp(nm, "kvzap")) /* window 128, threshold -4 */
		k = snprintf(spec, n, "kvzap:model=%s", path);
	else if (!strcmp(nm, "fastkvzip") || !strcmp(nm, "kvpop"))
		k = snprintf(spec, n, "%s:model=%s,tokens=%u", nm, path,
		             budget);
	else if (strstr("snapkv pyramidkv expected_attention", nm))
		k = snprintf(spec, n, "%s:tokens=%u,window=%u", nm, budget,
		             window);
	else
		k = snprintf(spec, n, "%s:tokens=%u", nm, budget);
	return k >= 0 && (size_t)k < n ? 0 : -1;
}

/* Nanoseconds every thread of process pid has run on a CPU so far (the
 * first field of /proc/PID/task/TID/schedstat; the loop, the sync
 * workers, nng's and the driver's threads), NAN when unreadable.  A
 * thread that exits in between drops out of the sum: the daemon's threads
 * live as long as it does. */
static double cpu_ns(pid_t pid)
{
	char path[96];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *dir = opendir(path);
	if (!dir)
		return NAN;
	double sum = 0;
	struct dirent *de;
	while ((de = readdir(dir))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat",
		         (int)pid, de->d_name);
		FILE *f = fopen(path, "r");
		unsigned long long ns;
		if (f && fscanf(f, "%llu", &ns) == 1)
			sum += (double)ns;
		if (f)
			fclose(f);
	}
	closedir(dir);
	return sum;
}

/* How run_policy drives a tenant: ns sequences, a prompt of prompt tokens
 * in syncs of chunk (the headroom), then one decode sync, warm more tokens
 * (the scratch memory at its size) and dec more, measured, in syncs of
 * T_EVERY; budgets of budget entries, windows
 * of window (the prompt selections; their staged lookback); room for
 * max_tokens a sequence; the learned policies on random weights of wsh's
 * widths. */
struct t_run {
	uint32_t ns, chunk, prompt, warm, dec, budget, window, max_tokens;
	const struct th_wshape *wsh; /* the learned policies' widths */
};

/* The daemon's counters: device bytes both ways, the CPU time of its
 * syncs and the emulated device's share of it (ns); NAN if unread. */
static void daemon_counts(const char *bin_dir, const char *dir, double *bytes,
                          double *sync_ns, double *emu_ns)
{
	static const char *const keys[] = {"device_h2d_bytes_total",
	                                   "device_d2h_bytes_total",
	                                   "sync_cpu_ns_total",
	                                   "device_emulated_ns_total"};
	double v[4];
	bench_ctl_stats(bin_dir, dir, keys, v, 4);
	*bytes = v[0] + v[1];
	*sync_ns = v[2];
	*emu_ns = v[3];
}

/* One policy on the running daemon (process d), as ru says, into *m; NAN
 * with the reason on stderr where it fails. */
static void run_policy(const char *bin_dir, const char *dir, const char *nm,
                       const struct t_run *ru, const struct t_rows *rows,
                       pid_t d, struct t_meas *m)
{
	char path[1100], spec[KVT_SPEC_MAX], err[KVT_ERRTEXT_MAX] = "";
	char tenant[KVT_NAME_MAX];
	const struct kvt_geometry g = rows->g;
	m->daemon_b = m->first_b = m->cpu_us = m->host_us = NAN;
	snprintf(path, sizeof(path), "%s/%s.safetensors", dir, nm);
	const int learned = is_learned(nm);
	if (learned && th_random_weights(nm, &g, ru->wsh, 0, path, err,
	                                 sizeof(err))) {
		fprintf(stderr, "kvtrim-bench: traffic %s: %s\n", nm, err);
		return;
	}
	if (spec_of(nm, path, ru->budget, ru->window, spec, sizeof(spec))) {
		fprintf(stderr, "kvtrim-bench: traffic %s: the spec does not "
		        "fit (path %s)\n", nm, path);
		return;
	}
	snprintf(tenant, sizeof(tenant), "traffic-%s-%u", nm, ru->ns);
	struct kvt_config c = {
		.runtime_dir = dir, .tenant = tenant, .geo = g,
		.dtype = KVT_DTYPE_F16, .page_tokens = 16, .max_seqs = ru->ns,
		.max_tokens = ru->max_tokens, .headroom = ru->chunk,
		/* the headroom plus the largest lookback (the windows) */
		.stage_tokens = ru->chunk + ru->window, .policy = spec,
		.timeout_ms = 600000};
	kvt_client *cl = NULL;
	kvt_seq seq[T_MAXSEQS];
	int rv = kvt_connect(&c, &cl, err);
	if (learned)
		unlink(path);
	if (rv) {
		fprintf(stderr, "kvtrim-bench: traffic %s: kvt_connect: %s: %s\n",
		        nm, kvt_strerror(rv), err);
		return;
	}
	for (uint32_t s = 0; s < ru->ns && !rv; s++)
		rv = kvt_seq_open(cl, &seq[s]);
	uint32_t pos = 0;
	for (; !rv && pos < ru->prompt; pos += ru->chunk)
		rv = step(cl, seq, ru->ns, pos, ru->chunk, KVT_PHASE_PREFILL,
		          rows);
	/* the first decode sync (snapkv compresses the prompt there) is not
	 * part of the steady state measured; its own line */
	double f0, bf, b0, b1, s0, s1, e0, e1, x, y;
	daemon_counts(bin_dir, dir, &f0, &x, &y);
	if (!rv)
		rv = step(cl, seq, ru->ns, pos, T_EVERY, KVT_PHASE_DECODE, rows);
	pos += T_EVERY;
	daemon_counts(bin_dir, dir, &bf, &x, &y);
	for (uint32_t i = 0; !rv && i < ru->warm; i += T_EVERY, pos += T_EVERY)
		rv = step(cl, seq, ru->ns, pos, T_EVERY, KVT_PHASE_DECODE, rows);
	daemon_counts(bin_dir, dir, &b0, &s0, &e0);
	const double c0 = cpu_ns(d);
	for (uint32_t i = 0; !rv && i < ru->dec; i += T_EVERY, pos += T_EVERY)
		rv = step(cl, seq, ru->ns, pos, T_EVERY, KVT_PHASE_DECODE, rows);
	const double c1 = cpu_ns(d);
	daemon_counts(bin_dir, dir, &b1, &s1, &e1);
	if (rv) {
		fprintf(stderr, "kvtrim-bench: traffic %s: %s: %s\n", nm,
		        kvt_strerror(rv), kvt_last_error(cl));
	} else {
		const double tok = (double)ru->dec * ru->ns;
		/* kvtrim.h: a cuda tenant's staging rows are device memory,
		 * which a GPU engine's kernels write in place: nothing crosses
		 * on its side (before device staging it copied every staged
		 * float, 524288 bytes a token for x alone at this geometry) */
		m->daemon_b = (b1 - b0) / tok;
		m->first_b = (bf - f0) / ru->ns;
		m->cpu_us = (c1 - c0) / 1e3 / tok;
		/* the syncs' CPU less the emulated device's work in them: on
		 * the emulator the loop's timers run a thousand times longer
		 * per sync than beside a GPU, so the daemon's whole CPU time
		 * (cpu_us) says little of what a token costs it there */
		m->host_us = (s1 - s0 - (e1 - e0)) / 1e3 / tok;
	}
	kvt_disconnect(cl);
}

/*
 * Launches a sync (launch_policy): LS_SEQS sequences of a small geometry
 * (4 layers, 8 query and 4 KV heads, head_dim 16), since what is measured
 * must not depend on the shapes (tests/integration/test_launches.c
 * asserts it at every sync): all prefilled by one sync of 32 tokens
 * each, then a decode sync of T_EVERY tokens of all (where the prompt
 * selections decide: windows of 8) and one of the first alone.  Budgets
 * of 16 entries, so every policy but full evicts.
 */
#define LS_SEQS 64u
#define LS_PREFILL 32u

/* n tokens at pos of sequences seq[0..ns): K/V and the staged inputs;
 * 0 or KVT_EINVAL. */
static int ls_stage(kvt_client *c, const kvt_seq *seq, uint32_t ns,
                    uint32_t pos, uint32_t n)
{
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	float row[16], q[128], x[64], lse[8];
	for (uint32_t s = 0; s < ns; s++)
		for (uint32_t k = 0; k < n; k++) {
			uint32_t p = pos + k;
			uint64_t seed = ((uint64_t)p << 16) ^ ((uint64_t)s << 4);
			for (uint32_t l = 0; l < g->n_layers; l++) {
				for (uint32_t h = 0; h < g->n_kv_heads; h++) {
					void *kp, *vp;
					bench_fill_rnd(row, g->head_dim, seed ^ (l * 8 + h),
					               1.0f);
					if (kvt_kv_ptr(c, seq[s], l, h, k, &kp, &vp) ||
					    kvt_memcpy(c, kp, row, sizeof(row)) ||
					    kvt_memcpy(c, vp, row, sizeof(row)))
						return KVT_EINVAL;
				}
				float *sx = kvt_stage_x(c, seq[s], l, p);
				float *sq = kvt_stage_q(c, seq[s], l, p);
				float *sl = kvt_stage_lse(c, seq[s], l, p);
				bench_fill_rnd(x, 64, seed ^ 0x55 ^ l, 1.0f);
				bench_fill_rnd(q, 128, seed ^ 0xaa ^ l, 1.0f);
				for (uint32_t h = 0; h < 8; h++)
					lse[h] = logf((float)(p + 1));
				if ((sx && kvt_memcpy(c, sx, x, sizeof(x))) ||
				    (sq && kvt_memcpy(c, sq, q, sizeof(q))) ||
				    (sl && kvt_memcpy(c, sl, lse, sizeof(lse))))
					return KVT_EINVAL;
			}
		}
	return 0;
}

/* ls_stage, then ls_sync; 0 or the first error. */
static int ls_step(kvt_client *c, const kvt_seq *seq, uint32_t ns,
                   uint32_t pos, uint32_t n, enum kvt_phase phase)
{
	int rv = ls_stage(c, seq, ns, pos, n);
	return rv ? rv : ls_sync(c, seq, ns, n, phase);
}

static void launch_policy(const char *bin_dir, const char *dir,
                          const char *nm, double *one, double *all)
{
	char path[1100], spec[KVT_SPEC_MAX], err[KVT_ERRTEXT_MAX] = "";
	char tenant[KVT_NAME_MAX];
	const struct kvt_geometry g = {4, 8, 4, 16, 64};
	const struct th_wshape sh = {16, 4, 4, 4, 8};
	*one = *all = NAN;
	snprintf(path, sizeof(path), "%s/%s-ls.safetensors", dir, nm);
	const int learned = is_learned(nm);
	if (learned && th_random_weights(nm, &g, &sh, 0, path, err,
	                                 sizeof(err))) {
		fprintf(stderr, "kvtrim-bench: launches %s: %s\n", nm, err);
		return;
	}
	if (spec_of(nm, path, 16, 8, spec, sizeof(spec)))
		return;
	snprintf(tenant, sizeof(tenant), "launches-%s", nm);
	struct kvt_config c = {
		.runtime_dir = dir, .tenant = tenant, .geo = g,
		.dtype = KVT_DTYPE_F32, .page_tokens = 16, .max_seqs = LS_SEQS,
		.max_tokens = 256, .headroom = LS_PREFILL,
		.stage_tokens = LS_PREFILL + 64, .policy = spec,
		.timeout_ms = 600000};
	kvt_client *cl = NULL;
	kvt_seq seq[LS_SEQS];
	int rv = kvt_connect(&c, &cl, err);
	if (learned)
		unlink(path);
	if (rv) {
		fprintf(stderr, "kvtrim-bench: launches %s: kvt_connect: %s: %s\n",
		        nm, kvt_strerror(rv), err);
		return;
	}
	for (uint32_t s = 0; s < LS_SEQS && !rv; s++)
		rv = kvt_seq_open(cl, &seq[s]);
	if (!rv)
		rv = ls_step(cl, seq, LS_SEQS, 0, LS_PREFILL, KVT_PHASE_PREFILL);
	double l0 = daemon_launches(bin_dir, dir);
	if (!rv)
		rv = ls_step(cl, seq, LS_SEQS, LS_PREFILL, T_EVERY,
		             KVT_PHASE_DECODE);
	double l1 = daemon_launches(bin_dir, dir);
	if (!rv)
		rv = ls_step(cl, seq, 1, LS_PREFILL + T_EVERY, T_EVERY,
		             KVT_PHASE_DECODE);
	double l2 = daemon_launches(bin_dir, dir);
	if (rv) {
		fprintf(stderr, "kvtrim-bench: launches %s: %s: %s\n", nm,
		        kvt_strerror(rv), kvt_last_error(cl));
	} else {
		*all = l1 - l0;
		*one = l2 - l1;
	}
	kvt_disconnect(cl);
}

/*
 * Cross-tenant batching: SH_TENANTS kvzap tenants on the same weights, each
 * with SH_SEQS sequences (the launch lines' small geometry), on a daemon
 * whose syncs all run on workers (sync_offload_us 0, UV_THREADPOOL_SIZE
 * SH_TENANTS) and gather for each other (scorer_gather_us 20000: a
 * gathering ends when all SH_TENANTS are queued).  Decode
 * syncs of T_EVERY tokens of every sequence: first one tenant after the
 * other (each sync alone: no run to share), then all at once after a
 * barrier (their scorer stages meet in one run).  *alone and *shared:
 * device_launches_total's growth per sync in either phase.
 */
#define SH_TENANTS 8u
#define SH_SEQS 8u

struct sh_tenant {
	kvt_client *c;
	kvt_seq seq[SH_SEQS];
	uint32_t pos, rounds;
	pthread_barrier_t *bar;
	int rv;
};

/* rounds decode syncs of every sequence of one tenant (each sync, once
 * its rows are staged, after the barrier when there is one). */
static void *sh_drive(void *arg)
{
	struct sh_tenant *t = arg;
	for (uint32_t r = 0; r < t->rounds; r++) {
		if (!t->rv)
			t->rv = ls_stage(t->c, t->seq, SH_SEQS, t->pos, T_EVERY);
		if (t->bar)
			pthread_barrier_wait(t->bar);
		if (!t->rv)
			t->rv = ls_sync(t->c, t->seq, SH_SEQS, T_EVERY,
			                KVT_PHASE_DECODE);
		t->pos += T_EVERY;
	}
	return NULL;
}

/* Connects the tenants (names <set>-<i>) with their sequences' prefills;
 * 0 or a code. */
static int sh_connect(const char *dir, const char *set, const char *spec,
                      struct sh_tenant *t, char *err)
{
	const struct kvt_geometry g = {4, 8, 4, 16, 64};
	char name[SH_TENANTS][KVT_NAME_MAX];
	int rv = 0;
	memset(t, 0, SH_TENANTS * sizeof(*t));
	for (uint32_t i = 0; i < SH_TENANTS && !rv; i++) {
		snprintf(name[i], sizeof(name[i]), "%s-%u", set, i);
		struct kvt_config c = {
			.runtime_dir = dir, .tenant = name[i], .geo = g,
			.dtype = KVT_DTYPE_F32, .page_tokens = 16,
			.max_seqs = SH_SEQS, .max_tokens = 256,
			.headroom = LS_PREFILL, .stage_tokens = LS_PREFILL + 64,
			.policy = spec, .timeout_ms = 600000};
		rv = kvt_connect(&c, &t[i].c, err);
		for (uint32_t s = 0; s < SH_SEQS && !rv; s++)
			rv = kvt_seq_open(t[i].c, &t[i].seq[s]);
		if (!rv)
			rv = ls_step(t[i].c, t[i].seq, SH_SEQS, 0, LS_PREFILL,
			             KVT_PHASE_PREFILL);
		t[i].pos = LS_PREFILL;
		if (rv && t[i].c)
			snprintf(err, KVT_ERRTEXT_MAX, "%s", kvt_last_error(t[i].c));
	}
	return rv;
}

/* rounds decode syncs of every connected tenant, one tenant after the
 * other or (together) all at once; *per_sync: the launches a sync.  0 or a
 * code (the reason in err). */
static int sh_phase(const char *bin_dir, const char *dir, struct sh_tenant *t,
                    uint32_t rounds, int together, double *per_sync,
                    char *err)
{
	pthread_barrier_t bar;
	pthread_t th[SH_TENANTS];
	uint32_t started = 0;
	int rv = 0;
	double l0 = daemon_launches(bin_dir, dir);
	if (together)
		pthread_barrier_init(&bar, NULL, SH_TENANTS);
	for (uint32_t i = 0; i < SH_TENANTS; i++) {
		t[i].rounds = rounds;
		t[i].bar = together ? &bar : NULL;
		if (!together)
			sh_drive(&t[i]);
		else if (!pthread_create(&th[i], NULL, sh_drive, &t[i]))
			started++;
	}
	if (together && started < SH_TENANTS) {
		/* the others would wait forever at the barrier */
		fprintf(stderr, "kvtrim-bench: shared kvzap: pthread_create\n");
		exit(1);
	}
	for (uint32_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (together)
		pthread_barrier_destroy(&bar);
	double l1 = daemon_launches(bin_dir, dir);
	for (uint32_t i = 0; i < SH_TENANTS && !rv; i++)
		if ((rv = t[i].rv))
			snprintf(err, KVT_ERRTEXT_MAX, "%s",
			         kvt_last_error(t[i].c));
	*per_sync = (l1 - l0) / (SH_TENANTS * rounds);
	return rv;
}

/* Both phases, each on its own SH_TENANTS tenants over the same positions
 * (the alone ones gone before the others come); 0 or a code. */
static int sh_phases(const char *bin_dir, const char *dir, const char *spec,
                     uint32_t rounds, double *alone, double *shared,
                     char *err)
{
	struct sh_tenant t[SH_TENANTS];
	int rv = sh_connect(dir, "alone", spec, t, err);
	if (!rv)
		rv = sh_phase(bin_dir, dir, t, rounds, 0, alone, err);
	for (uint32_t i = 0; i < SH_TENANTS; i++)
		kvt_disconnect(t[i].c);
	if (!rv)
		rv = sh_connect(dir, "shared", spec, t, err);
	if (!rv)
		rv = sh_phase(bin_dir, dir, t, rounds, 1, shared, err);
	for (uint32_t i = 0; i < SH_TENANTS; i++)
		kvt_disconnect(t[i].c);
	static const char *const keys[] = {"scorer_shared_runs_total",
	                                   "scorer_shared_syncs_total"};
	double v[2];
	bench_ctl_stats(bin_dir, dir, keys, v, 2);
	fprintf(stderr, "kvtrim-bench: shared kvzap: %u syncs at once: %.0f "
	        "shared runs served %.0f of them\n", SH_TENANTS * rounds, v[0],
	        v[1]);
	return rv;
}

static void shared_kvzap(const char *bin_dir, const char *tmp_dir, int quick,
                         double *alone, double *shared)
{
	char dir[700], path[800], spec[KVT_SPEC_MAX], err[KVT_ERRTEXT_MAX] = "";
	const struct kvt_geometry g = {4, 8, 4, 16, 64};
	const struct th_wshape sh = {16, 4, 4, 4, 8};
	*alone = *shared = NAN;
	snprintf(dir, sizeof(dir), "%s/traffic-shared", tmp_dir);
	mkdir(dir, 0700);
	snprintf(path, sizeof(path), "%s/kvzap-shared.safetensors", dir);
	int k = snprintf(spec, sizeof(spec), "kvzap:model=%s", path);
	if (k < 0 || (size_t)k >= sizeof(spec) ||
	    th_random_weights("kvzap", &g, &sh, 0, path, err, sizeof(err))) {
		fprintf(stderr, "kvtrim-bench: shared kvzap: %s\n", err);
		return;
	}
	const char *const args[] = {"--backend", "cuda", "--pool-size", "1G",
	                            "--sync-offload-us", "0",
	                            "--scorer-gather-us", "20000", NULL};
	char *pool = getenv("UV_THREADPOOL_SIZE");
	char *saved = pool ? strdup(pool) : NULL;
	setenv("UV_THREADPOOL_SIZE", "8", 1);
	pid_t d = bench_spawn_daemon(bin_dir, dir, args);
	if (saved)
		setenv("UV_THREADPOOL_SIZE", saved, 1);
	else
		unsetenv("UV_THREADPOOL_SIZE");
	free(saved);
	if (d < 0) {
		fprintf(stderr, "kvtrim-bench: shared kvzap: no daemon\n");
		unlink(path);
		return;
	}
	int rv = sh_phases(bin_dir, dir, spec, quick ? 2 : 4, alone, shared,
	                   err);
	if (rv) {
		fprintf(stderr, "kvtrim-bench: shared kvzap: %s: %s\n",
		        kvt_strerror(rv), err);
		*alone = *shared = NAN;
	}
	unlink(path);
	kill(d, SIGTERM);
	waitpid(d, NULL, 0);
}

void traffic_run(const char *bin_dir, const char *tmp_dir, int quick)
{
	char lib[700], dir[700];
	memset(&ts, 0, sizeof(ts));
	/* KVTRIM_BENCH_CUDA_LIB: the real library, on a GPU host
	 * (scripts/gpu-check.sh) */
	const char *real = getenv("KVTRIM_BENCH_CUDA_LIB");
	ts.emu = !real || !*real;
	snprintf(lib, sizeof(lib), "%s", !ts.emu ? real : "");
	if (ts.emu)
		snprintf(lib, sizeof(lib), "%s/../lib/emu/libkvtrim-cuda.so",
		         bin_dir);
	if (access(lib, R_OK)) {
		snprintf(ts.skipped, sizeof(ts.skipped), "%s not built (make "
		         "builds it where g++ is found)", lib);
		fprintf(stderr, "kvtrim-bench: cuda traffic lines skipped: %s\n",
		        ts.skipped);
		return;
	}
	char *abs = realpath(lib, NULL);
	snprintf(dir, sizeof(dir), "%s/traffic", tmp_dir);
	mkdir(dir, 0700);
	/* daemon and client both load the library (the emulated one by
	 * default) */
	if (ts.emu)
		setenv("KVTRIM_CUDA_EMU", "1", 1);
	setenv("KVTRIM_CUDA_LIB", abs ? abs : lib, 1);
	free(abs);
	list_policies(bin_dir);
	const char *const args[] = {"--backend", "cuda", "--pool-size", "1G",
	                            NULL};
	pid_t d = bench_spawn_daemon(bin_dir, dir, args);
	if (d < 0) {
		snprintf(ts.skipped, sizeof(ts.skipped), "kvtrimd --backend "
		         "cuda did not start on %s", lib);
		fprintf(stderr, "kvtrim-bench: cuda traffic lines skipped: %s\n",
		        ts.skipped);
	} else {
		/* bytes: the 8B geometry, 2 sequences, prompt syncs of
		 * T_CHUNK, budgets of T_BUDGET (quick: 1 sequence, a prompt
		 * of one sync of T_CHUNK / 2, budgets of T_BUDGET / 2 and
		 * windows of 32, which costs the emulator half as much and
		 * moves the bytes a token by under 1%: a sync's bytes scale
		 * with its lists and tokens, not its sequences).  The host
		 * side: 64 sequences of the 8B model's lists (32 layers of 8
		 * KV heads), which is what the daemon's host work depends on,
		 * at one query head a KV head, head_dim 16, d_model 256 and
		 * narrow scorers (what only the device's work depends on: on the emulator it would cost
		 * minutes and gigabytes), a prompt of 16, budgets of 16 and
		 * windows of 8, so that the emulated device's work (which is
		 * subtracted) stays short; in the full bench one decode sync
		 * after the first before those measured, so that the scratch
		 * memory has its size (its first touch is not a token's
		 * cost; the quick bench does without: the emulated attention
		 * rules take a minute a sync of 64 sequences) */
		const struct kvt_geometry g8 = {T_L, T_H, T_KV, T_HD, T_D};
		const struct kvt_geometry gh = {T_L, T_KV, T_KV, 16, 256};
		const struct th_wshape wsh = {16, 4, 4, 4, 8};
		struct t_rows rows8 = {0}, rowsh = {0};
		if (rows_make(&rows8, &g8) || rows_make(&rowsh, &gh)) {
			fprintf(stderr, "kvtrim-bench: traffic: out of memory\n");
			ts.n = 0;
		}
		const struct t_run rb = quick
			? (struct t_run){1, T_CHUNK / 2, T_CHUNK / 2, 0,
			                 2 * T_EVERY, T_BUDGET / 2, 32, 1024,
			                 &TH_WSHAPE_FULL}
			: (struct t_run){T_SEQS, T_CHUNK, 2 * T_CHUNK, 0,
			                 4 * T_EVERY, T_BUDGET, 64, 1024,
			                 &TH_WSHAPE_FULL};
		const struct t_run rh = {T_MAXSEQS, 16, 16, quick ? 0 : T_EVERY,
		                         quick ? T_EVERY : 2 * T_EVERY, 16, 8,
		                         128, &wsh};
		const double t0 = bench_now_us();
		for (int i = 0; i < ts.n; i++) {
			const double el = (bench_now_us() - t0) / 1e6;
			fprintf(stderr, "kvtrim-bench: traffic %s (%d of %d, "
			        "%.0f s, about %.0f s left)\n", ts.names[i],
			        i + 1, ts.n, el, i ? el / i * (ts.n - i) : 0.0);
			run_policy(bin_dir, dir, ts.names[i], &rb, &rows8, d,
			           &ts.bytes[i]);
			run_policy(bin_dir, dir, ts.names[i], &rh, &rowsh, d,
			           &ts.host[i]);
		}
		rows_free(&rows8);
		rows_free(&rowsh);
		for (int i = 0; i < ts.n; i++)
			launch_policy(bin_dir, dir, ts.names[i], &ts.ls1[i],
			              &ts.lsn[i]);
		for (int i = 0; i < ts.n; i++)
			if (!strcmp(ts.names[i], "kvzap"))
				shared_kvzap(bin_dir, tmp_dir, quick,
				             &ts.sh_alone, &ts.sh_shared);
		ts.ran = 1;
		kill(d, SIGTERM);
		waitpid(d, NULL, 0);
	}
	unsetenv("KVTRIM_CUDA_EMU");
	unsetenv("KVTRIM_CUDA_LIB");
}

void traffic_print(FILE *f)
{
	if (ts.skipped[0]) {
		fprintf(f, "# cuda traffic lines skipped: %s\n", ts.skipped);
		return;
	}
	if (!ts.ran)
		return;
	fprintf(f, "cuda_host_bytes_target 4096\n");
	for (int i = 0; i < ts.n; i++) /* the engine's side moves nothing */
		fprintf(f, "cuda_host_bytes_per_token_%s %.0f\n", ts.names[i],
		        ts.bytes[i].daemon_b);
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_daemon_bytes_per_token_%s %.0f\n", ts.names[i],
		        ts.bytes[i].daemon_b);
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_stage_bytes_per_token_%s %.0f\n", ts.names[i],
		        isnan(ts.bytes[i].daemon_b) ? NAN : 0.0);
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_prompt_sync_bytes_%s %.0f\n", ts.names[i],
		        ts.bytes[i].first_b);
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_launches_per_sync_%s_1seq %.0f\n", ts.names[i],
		        ts.ls1[i]);
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_launches_per_sync_%s_%useq %.0f\n", ts.names[i],
		        LS_SEQS, ts.lsn[i]);
	fprintf(f, "cuda_launches_per_sync_target 16\n");
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_launches_per_token_%s %.3f\n", ts.names[i],
		        ts.lsn[i] / ((double)LS_SEQS * T_EVERY));
	for (int i = 0; i < ts.n; i++)
		if (!strcmp(ts.names[i], "kvzap"))
			fprintf(f, "cuda_launches_per_sync_kvzap_%ux%u_shared %.2f\n"
			        "cuda_launches_per_sync_kvzap_%ux%u_alone %.2f\n",
			        SH_TENANTS, SH_SEQS, ts.sh_shared, SH_TENANTS,
			        SH_SEQS, ts.sh_alone);
	/* The daemon's CPU per decoded token per sequence at 64 sequences a
	 * sync: all of it, and its host side (less the emulated device's
	 * work, device_emulated_ns_total; on a GPU host the two agree and
	 * scripts/gpu-check.sh reports them as gpu_daemon_us_per_token_<p>) */
	fprintf(f, "cuda_daemon_cpu_backend %s\n", ts.emu ? "emulator" : "gpu");
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_daemon_cpu_us_per_token_%s %.2f\n", ts.names[i],
		        ts.host[i].cpu_us);
	for (int i = 0; i < ts.n; i++)
		fprintf(f, "cuda_daemon_us_per_token_%s %.2f\n", ts.names[i],
		        ts.host[i].host_us);
	fprintf(f, "cuda_daemon_us_target 5\n");
}
