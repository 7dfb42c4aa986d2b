/*
 * test_launches.c — the device work of a sync takes a bounded number of
 * kernel launches and cuBLAS calls, whatever its sequences, layers and KV
 * heads.  For each policy one tenant of the cuda daemon (4 layers, 8 query
 * and 4 KV heads: 16 lists a sequence) with 64 sequences runs
 *   a sync of one sequence's prefill,
 *   a sync of 64 items: the other 63 sequences' prefills of ragged
 *     lengths (9 to 25 tokens) beside the first one's decode,
 *   decode syncs of one sequence and of all 64 (1 to 3 tokens each),
 * budgets of 12 entries, so every policy but full evicts in every sync
 * that decides.  The daemon's device_launches_total must grow by at most
 * T_BOUND in every sync: the whole sync (table upload, the policy's rule,
 * compaction) is one fixed set of launches, where a launch per list would
 * give more than 1,000 for 64 sequences (kvpop_learned: kvpop with its
 * learned memory, random weights for the policy its spec names).  A
 * policy whose row is not
 * `asserted` prints its figures and SKIPs.  Skips on the cpu backend (no
 * device).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "rndweights.h"
#include "test.h"

#define T_BOUND 16u  /* launches a sync may take, whatever its size */
#define T_SEQS 64u
#define T_BUDGET "tokens=12"

static const struct lpol {
	const char *name;
	const char *spec; /* %s: a learned policy's weights */
	int asserted;     /* its rule is batched: the bound holds */
} POL[] = {
	{"full", "full", 1},
	{"random", "random:" T_BUDGET, 1},
	{"streaming", "streaming:sinks=2," T_BUDGET, 1},
	{"h2o", "h2o:" T_BUDGET, 1},
	{"observed_attention", "observed_attention:" T_BUDGET, 1},
	{"tova", "tova:" T_BUDGET, 1},
	{"kvpop", "kvpop:model=%s," T_BUDGET ",delay=4,sinks=1", 1},
	{"kvpop_learned",
	 "kvpop:model=%s," T_BUDGET ",delay=4,sinks=1,memory=learned", 1},
	{"kvzap", "kvzap:model=%s,window=4", 1},
	{"fastkvzip", "fastkvzip:model=%s," T_BUDGET ",window=4,sinks=1", 1},
	{"snapkv", "snapkv:window=4," T_BUDGET, 1},
	{"pyramidkv", "pyramidkv:window=4," T_BUDGET, 1},
	{"expected_attention", "expected_attention:window=4," T_BUDGET ",sinks=1",
	 1},
	{"knorm", "knorm:" T_BUDGET, 1},
};
#define N_POL (sizeof(POL) / sizeof(POL[0]))

/* n tokens of sequence s at positions pos..: K/V pseudo-random, varied by
 * position so that the rules' scores differ, and the staged inputs. */
static void put_tokens(kvt_client *c, kvt_seq s, uint32_t pos, uint32_t n)
{
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	float row[16], q[128];
	T_ASSERT(g->head_dim <= 16 && g->n_heads * g->head_dim <= 128);
	for (uint32_t k = 0; k < n; k++) {
		uint32_t p = pos + k;
		for (uint32_t l = 0; l < g->n_layers; l++) {
			for (uint32_t h = 0; h < g->n_kv_heads; h++) {
				void *kp, *vp;
				T_OK(kvt_kv_ptr(c, s, l, h, k, &kp, &vp));
				for (uint32_t i = 0; i < g->head_dim; i++)
					row[i] = (float)((p * 7 + l * 3 + h * 5 +
					                  i * 5 + s) % 13) / 13.0f -
					         0.5f;
				th_put(c, kp, row, g->head_dim * sizeof(float));
				th_put(c, vp, row, g->head_dim * sizeof(float));
			}
			for (uint32_t i = 0; i < g->n_heads * g->head_dim; i++)
				q[i] = (float)((p * 3 + i + s) % 7) / 7.0f - 0.5f;
			th_stage_row(c, s, l, p, q);
		}
	}
}

struct lrun {
	const struct th_daemon *d;
	kvt_client *c;
	kvt_seq s[T_SEQS];
	uint32_t pos[T_SEQS];
	uint64_t worst;
	char worst_at[64];
};

/* One sync of the items (seq index, tokens, prefill) of it[0..n); its
 * launches are recorded. */
static void run_sync(struct lrun *r, const char *what, const uint32_t (*it)[3],
                     uint32_t n)
{
	struct kvt_sync_item items[T_SEQS];
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = it[k][0];
		put_tokens(r->c, r->s[i], r->pos[i], it[k][1]);
		items[k] = (struct kvt_sync_item){
			.seq = r->s[i], .n_new = it[k][1],
			.phase = it[k][2] ? KVT_PHASE_PREFILL : KVT_PHASE_DECODE};
	}
	uint64_t before = th_stat(r->d, "device_launches_total");
	uint64_t cpu0 = th_stat(r->d, "sync_cpu_ns_total");
	uint64_t emu0 = th_stat(r->d, "device_emulated_ns_total");
	T_OK(kvt_sync(r->c, items, n));
	uint64_t used = th_stat(r->d, "device_launches_total") - before;
	/* the sync cost its thread CPU time, and the emulated device's work
	 * (which launched) counted: emu is the process's, so it may exceed
	 * the sync thread's cpu where the emulator runs work on other
	 * threads (KVT_EMU_HOSTFN_DELAY_US's deferred host functions) */
	uint64_t cpu = th_stat(r->d, "sync_cpu_ns_total") - cpu0;
	uint64_t emu = th_stat(r->d, "device_emulated_ns_total") - emu0;
	T_ASSERT(cpu > 0);
	T_ASSERT(!used || emu > 0);
	for (uint32_t k = 0; k < n; k++)
		r->pos[it[k][0]] += it[k][1];
	fprintf(stderr, "    launches %s: %" PRIu64 " (%u items)\n", what, used,
	        n);
	if (used > r->worst) {
		r->worst = used;
		snprintf(r->worst_at, sizeof(r->worst_at), "%s", what);
	}
}

static void run_policy(const char *name)
{
	const struct lpol *tp = NULL;
	for (size_t i = 0; i < N_POL; i++)
		if (!strcmp(POL[i].name, name))
			tp = &POL[i];
	T_ASSERT(tp);
	if (!strcmp(th_backend(), "cpu"))
		T_SKIP("cpu backend: no device launches to bound");
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], spec[KVT_SPEC_MAX], path[600] = "";
	th_daemon_start(&d, "256M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, tp->name, "full");
	cfg.geo = (struct kvt_geometry){4, 8, 4, 16, 64};
	cfg.max_seqs = T_SEQS;
	cfg.max_tokens = 256;
	cfg.headroom = 32;
	cfg.stage_tokens = 64;
	cfg.timeout_ms = 120000; /* a 64-sequence sync on the CPU emulator */
	if (strstr(tp->spec, "%s")) {
		snprintf(path, sizeof(path), "%s/%s.safetensors", th_tmpdir(),
		         tp->name);
		const struct th_wshape sh = {16, 4, 4, 4, 8};
		T_OK(th_random_weights(tp->spec, &cfg.geo, &sh, 1, path, err,
		                       sizeof(err)));
	}
	snprintf(spec, sizeof(spec), tp->spec, path);
	cfg.policy = spec;
	struct lrun r = {.d = &d};
	T_OK(kvt_connect(&cfg, &r.c, err));
	for (uint32_t i = 0; i < T_SEQS; i++)
		T_OK(kvt_seq_open(r.c, &r.s[i]));

	uint32_t it[T_SEQS][3];
	const uint32_t one_prefill[1][3] = {{0, 24, 1}};
	run_sync(&r, "1 sequence, prefill", one_prefill, 1);
	for (uint32_t i = 0; i < T_SEQS; i++) {
		it[i][0] = i;
		it[i][1] = i ? 9 + (i * 7) % 17 : 2;
		it[i][2] = i != 0;
	}
	run_sync(&r, "64 sequences, prefills and a decode", it, T_SEQS);
	for (int rep = 0; rep < 3; rep++) {
		const uint32_t one[1][3] = {{0, 1, 0}};
		run_sync(&r, "1 sequence, decode", one, 1);
		for (uint32_t i = 0; i < T_SEQS; i++) {
			it[i][0] = i;
			it[i][1] = 1 + (i + rep) % 3;
			it[i][2] = 0;
		}
		run_sync(&r, "64 sequences, decode", it, T_SEQS);
	}
	T_EQ(th_sh(&d, err, sizeof(err), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(r.c);
	T_EQ(th_daemon_stop(&d), 0);
	static char why[256];
	snprintf(why, sizeof(why), "%s: worst sync %" PRIu64 " launches (%s), "
	         "bound %u", tp->name, r.worst, r.worst_at, T_BOUND);
	if (tp->asserted && r.worst > T_BOUND)
		th_fail(__FILE__, __LINE__, "%s", why);
	if (!tp->asserted)
		T_SKIP(why);
}

#define LAUNCH_TEST(p)                                                         \
	TEST_T(launches, sync_bound_##p, 120) { run_policy(#p); }
LAUNCH_TEST(full)
LAUNCH_TEST(random)
LAUNCH_TEST(streaming)
LAUNCH_TEST(h2o)
LAUNCH_TEST(observed_attention)
LAUNCH_TEST(tova)
LAUNCH_TEST(kvpop)
LAUNCH_TEST(kvpop_learned)
LAUNCH_TEST(kvzap)
LAUNCH_TEST(fastkvzip)
LAUNCH_TEST(snapkv)
LAUNCH_TEST(pyramidkv)
LAUNCH_TEST(expected_attention)
LAUNCH_TEST(knorm)
