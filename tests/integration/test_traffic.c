/*
 * test_traffic.c — the bound on what crosses between host and device at a
 * sync of the cuda daemon: sized by the decisions, never by the context
 * length or d_model.  For each policy one tenant (4 layers, 8 query and 4
 * KV heads, head_dim 16, d_model 1024, f32 pages of 4 entries, lists of up
 * to 1024) runs a prefill of 640 tokens in syncs of 64, then 6 decode
 * syncs of 2 tokens, with budgets of 512 entries so that every policy but
 * full evicts.  Around each sync device_h2d_bytes_total +
 * device_d2h_bytes_total must grow by at most
 *
 *     4096 + 64 * lists + 16 * (new entries + dropped entries)
 *
 * Lists are long and d_model large enough that keys read to the host or
 * whole records uploaded exceed it.  A policy whose row is not `asserted`
 * prints its figures and SKIPs.  Skips on the cpu backend.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "policy.h"
#include "rndweights.h"
#include "test.h"

/* One row per registered policy, and kvpop_learned (kvpop with its
 * learned memory, whose device rule reads a table beside the weights);
 * spec's %s is a learned policy's weights file, random ones for the
 * policy the spec names.  Windows and lookbacks of 4, budgets of 512. */
static const struct tpol {
	const char *name;
	const char *spec;
	int asserted; /* the bound holds: its device path has landed */
} POL[] = {
	{"full", "full", 1},
	{"random", "random:tokens=512", 1},
	{"streaming", "streaming:sinks=2,tokens=512", 1},
	{"h2o", "h2o:tokens=512", 1},
	{"snapkv", "snapkv:window=4,tokens=512", 1},
	{"tova", "tova:tokens=512", 1},
	{"kvzap", "kvzap:model=%s,window=4", 1},
	{"fastkvzip", "fastkvzip:model=%s,tokens=512,window=4,sinks=1,every=4", 1},
	{"kvpop", "kvpop:model=%s,tokens=512,delay=4,sinks=1", 1},
	/* kvpop's learned memory: its band is every entry, on the device */
	{"kvpop_learned", "kvpop:model=%s,tokens=512,delay=4,sinks=1,"
	 "memory=learned", 1},
	{"knorm", "knorm:tokens=512", 1},
	{"expected_attention", "expected_attention:window=4,tokens=512,sinks=1",
	 1},
	{"pyramidkv", "pyramidkv:window=4,tokens=512", 1},
	{"observed_attention", "observed_attention:tokens=512", 1},
};
#define N_POL (sizeof(POL) / sizeof(POL[0]))

#define T_DMODEL 1024u
#define T_PREFILL 64u  /* tokens a prefill sync (the headroom) */
#define T_NPREFILL 10u /* prefill syncs */
#define T_DECODE 2u    /* tokens a decode sync */
#define T_NDECODE 6u   /* decode syncs */

/* The daemon's host <-> device bytes so far (one kvtrimctl stats). */
static uint64_t device_bytes(const struct th_daemon *d)
{
	static char out[1 << 14];
	int rc = th_sh(d, out, sizeof(out), "%s stats", th_bin("kvtrimctl"));
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrimctl stats: %d: %s", rc, out);
	uint64_t sum = 0;
	int seen = 0;
	for (char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1
	                                                : NULL) {
		static const char *const keys[] = {"device_h2d_bytes_total ",
		                                   "device_d2h_bytes_total "};
		for (int k = 0; k < 2; k++)
			if (!strncmp(l, keys[k], strlen(keys[k]))) {
				sum += strtoull(l + strlen(keys[k]), NULL, 10);
				seen++;
			}
	}
	if (seen != 2)
		th_fail(__FILE__, __LINE__, "kvtrimctl stats lacks the device "
		        "traffic counters:\n%s", out);
	return sum;
}

static uint64_t evicted(kvt_client *c)
{
	struct kvt_tenant_stats st;
	T_OK(kvt_stats(c, &st));
	return st.entries_evicted;
}

/* Writes n new tokens (K/V through kvt_memcpy, pseudo-random) at positions
 * pos.. and stages what the policy reads (x varied so that scores differ). */
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
					row[i] = (float)((p * 7 + l * 3 + h +
					                  i * 5) % 11) / 11.0f - 0.5f;
				T_OK(kvt_memcpy(c, kp, row,
				                g->head_dim * sizeof(float)));
				T_OK(kvt_memcpy(c, vp, row,
				                g->head_dim * sizeof(float)));
			}
			for (uint32_t i = 0; i < g->n_heads * g->head_dim; i++)
				q[i] = (float)((p * 3 + i) % 7) / 7.0f - 0.5f;
			th_stage_row(c, s, l, p, q);
			float *x = kvt_stage_x(c, s, l, p);
			for (uint32_t i = 0; x && i < g->d_model; i++)
				x[i] = (float)((p * 13 + l + i) % 17) / 17.0f -
				       0.5f;
		}
	}
}

static void run_policy(const char *name)
{
	const struct tpol *tp = NULL;
	for (size_t i = 0; i < N_POL; i++)
		if (!strcmp(POL[i].name, name))
			tp = &POL[i];
	T_ASSERT(tp);
	if (!strcmp(th_backend(), "cpu"))
		T_SKIP("cpu backend: no host <-> device traffic to bound");
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], spec[KVT_SPEC_MAX], path[600];
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, tp->name, "full");
	cfg.geo = (struct kvt_geometry){4, 8, 4, 16, T_DMODEL};
	cfg.max_seqs = 1;
	cfg.max_tokens = 1024;
	cfg.headroom = T_PREFILL;
	cfg.stage_tokens = 2 * T_PREFILL;
	if (strstr(tp->spec, "%s")) {
		snprintf(path, sizeof(path), "%s/%s.safetensors", th_tmpdir(),
		         tp->name);
		const struct th_wshape sh = {16, 4, 4, 4, 8};
		T_OK(th_random_weights(tp->spec, &cfg.geo, &sh, 1, path, err,
		                       sizeof(err)));
	}
	snprintf(spec, sizeof(spec), tp->spec, path);
	cfg.policy = spec;
	kvt_client *c;
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));

	const uint32_t lists = cfg.geo.n_layers * cfg.geo.n_kv_heads;
	uint64_t before = device_bytes(&d), ev0 = evicted(c);
	uint64_t worst = 0, worst_bound = 0, over = 0;
	uint32_t pos = 0;
	for (uint32_t k = 0; k < T_NPREFILL + T_NDECODE; k++) {
		int pre = k < T_NPREFILL;
		uint32_t n = pre ? T_PREFILL : T_DECODE;
		put_tokens(c, s, pos, n);
		struct kvt_sync_item it = {
			.seq = s, .n_new = n,
			.phase = pre ? KVT_PHASE_PREFILL : KVT_PHASE_DECODE};
		T_OK(kvt_sync(c, &it, 1));
		pos += n;
		uint64_t after = device_bytes(&d), ev1 = evicted(c);
		uint64_t bytes = after - before, dropped = ev1 - ev0;
		uint64_t bound = 4096 + 64 * (uint64_t)lists +
		                 16 * ((uint64_t)n * lists + dropped);
		fprintf(stderr, "    traffic %s sync %u: %" PRIu64 " B (bound "
		        "%" PRIu64 "; lists %u, new %u, dropped %" PRIu64 ")\n",
		        tp->name, k, bytes, bound, lists, n * lists, dropped);
		if (bytes > bound)
			over++;
		if (!worst_bound || (double)bytes / bound >
		                            (double)worst / worst_bound) {
			worst = bytes;
			worst_bound = bound;
		}
		before = after;
		ev0 = ev1;
	}
	T_EQ(th_sh(&d, err, sizeof(err), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
	static char why[512];
	snprintf(why, sizeof(why), "%s: worst sync %" PRIu64 " B against a "
	         "bound of %" PRIu64 " B, %" PRIu64 " of %u syncs over",
	         tp->name, worst, worst_bound, over, T_NPREFILL + T_NDECODE);
	if (tp->asserted && over)
		th_fail(__FILE__, __LINE__, "%s", why);
	if (!tp->asserted) {
		static char skip[600];
		snprintf(skip, sizeof(skip), "not yet device-resident (issue "
		         "12): %s%s", why, over ? "" : " (within it: assert it)");
		T_SKIP(skip);
	}
}

/* Every registered policy has a row, so a new one is measured too. */
TEST(traffic, every_policy_has_a_row)
{
	for (size_t i = 0; i < policy_count(); i++) {
		size_t k = 0;
		while (k < N_POL && strcmp(POL[k].name, policy_at(i)->name))
			k++;
		if (k == N_POL)
			th_fail(__FILE__, __LINE__, "policy %s has no row in "
			        "test_traffic.c's table", policy_at(i)->name);
	}
	T_EQ(N_POL, policy_count() + 1); /* and kvpop_learned */
}

#define TRAFFIC_TEST(p)                                                        \
	TEST_T(traffic, sync_bound_##p, 60) { run_policy(#p); }
TRAFFIC_TEST(full)
TRAFFIC_TEST(random)
TRAFFIC_TEST(streaming)
TRAFFIC_TEST(h2o)
TRAFFIC_TEST(snapkv)
TRAFFIC_TEST(tova)
TRAFFIC_TEST(kvzap)
TRAFFIC_TEST(fastkvzip)
TRAFFIC_TEST(kvpop)
TRAFFIC_TEST(kvpop_learned)
TRAFFIC_TEST(knorm)
TRAFFIC_TEST(expected_attention)
TRAFFIC_TEST(pyramidkv)
TRAFFIC_TEST(observed_attention)
