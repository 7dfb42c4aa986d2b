/*
 * test_contract_sync.c — what a sync promises an engine, against the real
 * daemon: staged inputs that are not numbers, or were never
 * staged, are refused with a reason and change nothing; the sync
 * reply, kvt_last_sync, kvt_stats and the stats show the pressure and the
 * budget applied; a sequence's headroom follows its next append
 * (kvt_seq_headroom), so lists hold the pages the work needs.
 * Expected page counts are ceil((len + headroom) / page_tokens), by hand.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "rndweights.h"
#include "test.h"

/* Writes K and V of n new entries of every list of seq (small geometry:
 * head_dim 8, f32), through kvt_memcpy so a cuda tenant works too. */
static void append(kvt_client *c, kvt_seq seq, uint32_t n)
{
	const struct kvt_config *cfg = kvt_config_of(c);
	float row[8];
	for (uint32_t l = 0; l < cfg->geo.n_layers; l++)
		for (uint32_t h = 0; h < cfg->geo.n_kv_heads; h++)
			for (uint32_t k = 0; k < n; k++) {
				void *kp, *vp;
				T_OK(kvt_kv_ptr(c, seq, l, h, k, &kp, &vp));
				for (uint32_t j = 0; j < 8; j++)
					row[j] = 0.05f * (float)(j + k + 1);
				T_OK(kvt_memcpy(c, kp, row, sizeof(row)));
				T_OK(kvt_memcpy(c, vp, row, sizeof(row)));
			}
}

/* Stages finite x, q and lse for positions [from, from + n) of every layer. */
static void stage(kvt_client *c, kvt_seq seq, uint32_t from, uint32_t n)
{
	const struct kvt_config *cfg = kvt_config_of(c);
	const struct kvt_geometry *g = &cfg->geo;
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t p = from; p < from + n; p++)
			th_stage_row(c, seq, l, p, NULL);
}

/* len and epoch of every list of seq, layer-major. */
static void lists_of(kvt_client *c, kvt_seq seq, uint32_t *len,
                     uint64_t *epoch)
{
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			struct kvt_list li;
			T_OK(kvt_list_get(c, seq, l, h, &li));
			len[l * g->n_kv_heads + h] = li.len;
			epoch[l * g->n_kv_heads + h] = li.epoch;
		}
}

/* A sync refused with KVT_EINVAL whose reason holds needle, after which
 * every list of seq is as it was and the tenant counted no sync. */
static void refused_(kvt_client *c, kvt_seq seq, uint32_t n_new,
                     enum kvt_phase ph, const char *needle, int line)
{
	uint32_t len0[4], len1[4];
	uint64_t ep0[4], ep1[4];
	struct kvt_tenant_stats s0, s1;
	lists_of(c, seq, len0, ep0);
	T_OK(kvt_stats(c, &s0));
	struct kvt_sync_item it = {.seq = seq, .n_new = n_new, .phase = ph};
	int rc = kvt_sync(c, &it, 1);
	if (rc != KVT_EINVAL || !strstr(kvt_last_error(c), needle))
		th_fail(__FILE__, line, "sync gave %s (%s), expected EINVAL "
		        "with '%s'", kvt_errname(rc), kvt_last_error(c), needle);
	lists_of(c, seq, len1, ep1);
	T_OK(kvt_stats(c, &s1));
	if (memcmp(len0, len1, sizeof(len0)) || memcmp(ep0, ep1, sizeof(ep0)) ||
	    s1.syncs != s0.syncs || s1.entries_appended != s0.entries_appended)
		th_fail(__FILE__, line, "the refused sync changed something");
}
#define refused(c, seq, n, needle)                                             \
	refused_(c, seq, n, KVT_PHASE_PREFILL, needle, __LINE__)
#define refused_decode(c, seq, n, needle)                                      \
	refused_(c, seq, n, KVT_PHASE_DECODE, needle, __LINE__)

/* A daemon of 16M and one tenant of the small geometry with policy and
 * stage_tokens, with one sequence open. */
static void start_one(struct th_daemon *d, const char *policy,
                      uint32_t stage_tokens, kvt_client **c, kvt_seq *seq)
{
	th_daemon_start(d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(d, "stager", policy);
	cfg.stage_tokens = stage_tokens;
	char why[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, c, why));
	T_OK(kvt_seq_open(*c, seq));
}

TEST(contract_sync, bad_staged_inputs_refused_and_nothing_changes)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	start_one(&d, "h2o:tokens=6,window=2", 4, &c, &seq);
	struct kvt_sync_item it = {.seq = seq, .n_new = 4};
	append(c, seq, 4);
	stage(c, seq, 0, 4);
	T_OK(kvt_sync(c, &it, 1));

	/* A NaN in one query of layer 1: layer 0 was fine, yet nothing of
	 * the sync is applied. */
	append(c, seq, 4);
	stage(c, seq, 4, 4);
	float *q = kvt_stage_q(c, seq, 1, 6);
	th_put_f32(c, q + 2 * 8 + 3, NAN);
	refused(c, seq, 4, "policy h2o: layer 1, position 6: staged q of "
	                   "query head 2 [3] is NaN");
	th_put_f32(c, q + 2 * 8 + 3, 0.1f);
	T_OK(kvt_sync(c, &it, 1)); /* the same sync, fixed: counter kept */
	struct kvt_list l;
	T_OK(kvt_list_get(c, seq, 1, 0, &l));
	T_EQ(l.len, 6); /* 8 entries, budget 6 */

	/* Rows never staged: the daemon marked them after the last sync. */
	it.n_new = 1;
	append(c, seq, 1);
	refused(c, seq, 1, "layer 0, position 8: q of query head 0 was never "
	                   "staged (kvt_stage_q)");
	stage(c, seq, 8, 1);
	th_put_f32(c, kvt_stage_lse(c, seq, 0, 8) + 3, INFINITY);
	refused(c, seq, 1, "layer 0, position 8: staged lse of query head 3 "
	                   "is +Inf");
	stage(c, seq, 8, 1);
	T_OK(kvt_sync(c, &it, 1));
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.syncs, 3);
	T_EQ_U64(ts.entries_appended, 9 * 4); /* 9 entries in 4 lists */

	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * snapkv decides once, at the first decode sync, from the window's rows
 * (positions [P - w, P)) and the new token's: those are checked there and
 * a bad one refuses the sync with its reason, on every backend (on cuda the
 * device's selection finds it and the host path names it); a row it never
 * reads (a prompt row before the window, a decode row after the decision)
 * is not checked.  The kept entries, by hand: keys repeat per batch of 4
 * (entry k of a batch: 0.05 (j + k + 1)), q is 0.1 everywhere, so key k
 * scores higher with k; window 2 (positions 6, 7) protected, budget 4 of
 * the prompt of 8: the best 2 of positions 0..5 are 3 (k 3) and 2 (k 2);
 * with the new entry 8 (k 0) every list keeps first key elements {0.05,
 * 0.15, 0.15, 0.2, 0.2}.
 */
TEST(contract_sync, snapkv_checks_the_rows_it_reads_where_it_decides)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	start_one(&d, "snapkv:window=2,kernel=1,tokens=4", 8, &c, &seq);
	struct kvt_sync_item it = {.seq = seq, .n_new = 4};
	for (uint32_t p = 0; p < 8; p += 4) {
		append(c, seq, 4);
		stage(c, seq, p, 4);
		if (p == 0) /* never read: before the window */
			th_put_f32(c, kvt_stage_q(c, seq, 1, 2) + 5, NAN);
		T_OK(kvt_sync(c, &it, 1));
	}
	append(c, seq, 1);
	stage(c, seq, 8, 1);
	float *lse7 = kvt_stage_lse(c, seq, 1, 7);
	th_put_f32(c, lse7 + 1, NAN);
	refused_decode(c, seq, 1, "layer 1, position 7: staged lse of query "
	                          "head 1 is NaN");
	th_put_f32(c, lse7 + 1, logf(8.0f));
	th_put_f32(c, kvt_stage_q(c, seq, 0, 8), INFINITY); /* the new row */
	refused_decode(c, seq, 1, "layer 0, position 8: staged q of query "
	                          "head 0 [0] is +Inf");
	stage(c, seq, 8, 1);
	it.n_new = 1;
	it.phase = KVT_PHASE_DECODE;
	T_OK(kvt_sync(c, &it, 1));
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			struct kvt_list li;
			T_OK(kvt_list_get(c, seq, l, h, &li));
			T_EQ(li.len, 5);
			float first[5];
			for (uint32_t e = 0; e < 5; e++) {
				char *pg = kvt_page_ptr(c, li.pages[e / 4]);
				T_OK(kvt_memcpy(c, &first[e],
				                pg + (e % 4) * 8 * sizeof(float),
				                sizeof(float)));
			}
			for (uint32_t a = 0; a < 5; a++) /* sort */
				for (uint32_t b = a + 1; b < 5; b++)
					if (first[b] < first[a]) {
						float x = first[a];
						first[a] = first[b];
						first[b] = x;
					}
			const float want[5] = {0.05f, 0.15f, 0.15f, 0.2f, 0.2f};
			for (uint32_t e = 0; e < 5; e++)
				T_ASSERT(fabsf(first[e] - want[e]) < 1e-6f);
		}
	/* after the decision its decode rows are not read */
	append(c, seq, 1);
	stage(c, seq, 9, 1);
	th_put_f32(c, kvt_stage_q(c, seq, 0, 9), NAN);
	T_OK(kvt_sync(c, &it, 1));
	struct kvt_list li;
	T_OK(kvt_list_get(c, seq, 0, 0, &li));
	T_EQ(li.len, 6);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * TOVA and KVpop, which a cuda tenant decides on the device at every sync
 * (their device rules), as h2o above: a new row's value that is not
 * a number is refused with the cpu backend's reason on either backend
 * (the device flags the row and sends the layer to the host's check),
 * nothing changes, and the same sync fixed is accepted and evicts to the
 * budget of 6 (TOVA: 8 entries; KVpop: 8, of which the 2 of the delay and
 * the sink are protected).
 */
static void attn_bad_rows(const char *spec, int x_too)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char path[600], full[KVT_SPEC_MAX], err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "stager", spec);
	cfg.stage_tokens = 4;
	if (strstr(spec, "%s")) {
		snprintf(path, sizeof(path), "%s/kvpop.safetensors",
		         th_tmpdir());
		const struct th_wshape sh = {16, 4, 4, 4, 8};
		T_OK(th_random_weights("kvpop", &cfg.geo, &sh, 3, path, err,
		                       sizeof(err)));
	}
	snprintf(full, sizeof(full), spec, path);
	cfg.policy = full;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = {.seq = seq, .n_new = 4};
	append(c, seq, 4);
	stage(c, seq, 0, 4);
	T_OK(kvt_sync(c, &it, 1));

	append(c, seq, 4);
	stage(c, seq, 4, 4);
	float *q = kvt_stage_q(c, seq, 1, 6);
	th_put_f32(c, q + 2 * 8 + 3, NAN);
	char needle[160];
	snprintf(needle, sizeof(needle), "policy %.*s: layer 1, position 6: "
	         "staged q of query head 2 [3] is NaN",
	         (int)strcspn(full, ":"), full);
	refused(c, seq, 4, needle);
	th_put_f32(c, q + 2 * 8 + 3, 0.1f);
	if (x_too) {
		float *x = kvt_stage_x(c, seq, 0, 5);
		th_put_f32(c, x + 7, -INFINITY);
		snprintf(needle, sizeof(needle), "policy %.*s: layer 0, "
		         "position 5: staged x[7] is -Inf",
		         (int)strcspn(full, ":"), full);
		refused(c, seq, 4, needle);
		th_put_f32(c, x + 7, 0.25f);
	}
	T_OK(kvt_sync(c, &it, 1)); /* the same sync, fixed */
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < 2; h++) {
			struct kvt_list li;
			T_OK(kvt_list_get(c, seq, l, h, &li));
			T_EQ(li.len, 6);
		}
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.syncs, 2);
	T_EQ_U64(ts.entries_evicted, 2 * 4);
	T_EQ(th_sh(&d, err, sizeof(err), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(contract_sync, tova_refuses_bad_rows_and_nothing_changes)
{
	attn_bad_rows("tova:tokens=6", 0);
}

TEST(contract_sync, kvpop_refuses_bad_rows_and_nothing_changes)
{
	attn_bad_rows("kvpop:model=%s,tokens=6,delay=2,sinks=1", 1);
}

/*
 * kvzap scores x where it is staged (on cuda the scorer's scores stay on
 * the device, where its rule reads them): a NaN in one x of layer 1
 * refuses the sync with the layer and position (on cuda the rule flags
 * the score, the scores come back and the host path names it), nothing
 * changes, and the same sync fixed is accepted.
 */
TEST(contract_sync, kvzap_refuses_bad_x_and_nothing_changes)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char path[160], spec[KVT_SPEC_MAX], err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "stager", "kvzap");
	cfg.stage_tokens = 4;
	snprintf(path, sizeof(path), "%s/kvzap.safetensors", th_tmpdir());
	const struct th_wshape sh = {8, 4, 4, 4, 8};
	T_OK(th_random_weights("kvzap", &cfg.geo, &sh, 5, path, err,
	                       sizeof(err)));
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=2", path);
	cfg.policy = spec;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = {.seq = seq, .n_new = 4};
	append(c, seq, 4);
	stage(c, seq, 0, 4);
	T_OK(kvt_sync(c, &it, 1));
	append(c, seq, 4);
	stage(c, seq, 4, 4);
	float *x = kvt_stage_x(c, seq, 1, 6);
	th_put_f32(c, x + 3, NAN);
	refused(c, seq, 4, "policy kvzap: layer 1, position 6: ");
	th_put_f32(c, x + 3, 0.25f);
	T_OK(kvt_sync(c, &it, 1)); /* the same sync, fixed */
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.syncs, 2);
	T_EQ_U64(ts.entries_appended, 8 * 4);
	T_EQ(th_sh(&d, err, sizeof(err), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* Waits up to ms for a metric to reach want; its last value. */
static double wait_metric(const struct th_daemon *d, const char *series,
                          double want, int ms)
{
	double v = -1;
	for (int waited = 0; waited <= ms; waited += 50) {
		if ((v = th_metric_or(d, series)) >= want)
			break;
		th_sleep_ms(50);
	}
	return v;
}

TEST(contract_sync, sync_reports_the_pressure_and_budget_applied)
{
	struct th_daemon d;
	/* One engine: its uid's and process's shares are the whole pool, so
	 * the level below is the pool's alone. */
	const char *extra[] = {"--expected-tenants", "1", NULL};
	th_daemon_start(&d, "4M", extra); /* 2 chunks */
	struct kvt_config cfg = th_small_cfg(&d, "squeezed",
	                                     "streaming:tokens=8,sinks=0");
	cfg.quota_bytes = KVT_CHUNK_BYTES;
	kvt_client *c;
	char why[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, why));
	struct kvt_sync_info si;
	T_OK(kvt_last_sync(c, &si));
	T_EQ_U64(si.syncs, 0);
	T_EQ(si.budget, 0);
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq)); /* one chunk of two */
	struct kvt_sync_item it = {.seq = seq, .n_new = 4};
	T_OK(kvt_sync(c, &it, 1));
	T_OK(kvt_last_sync(c, &si));
	T_EQ_U64(si.syncs, 1);
	T_ASSERT(si.pressure == 0.0f);
	T_EQ(si.budget, 8);

	/* high_watermark 0.25: a half-full pool is level (0.5 - 0.25) /
	 * (1 - 0.25) = 1/3, so the budget of 8 becomes 8 - floor(8 / 3 / 2)
	 * = 7, and the level travels as 333333 millionths. */
	char out[8192];
	const char *ctl = th_bin("kvtrimctl");
	T_EQ(th_sh(&d, out, sizeof(out), "%s config set high_watermark 0.25",
	           ctl), 0);
	T_ASSERT(wait_metric(&d, "kvtrim_tenant_pressure{tenant=\"squeezed\","
	                         "id=\"1\"}", 0.33, 5000) >= 0.33);
	kvt_ticket tk;
	T_OK(kvt_sync_async(c, &it, 1, &tk));
	T_OK(kvt_wait(c, tk));
	T_OK(kvt_last_sync(c, &si));
	T_EQ_U64(si.syncs, 2);
	T_ASSERT(fabsf(si.pressure - 1.0f / 3.0f) < 1e-6f);
	T_EQ(si.budget, 7);
	struct kvt_list l;
	T_OK(kvt_list_get(c, seq, 0, 0, &l));
	T_EQ(l.len, 7);

	/* The same in kvt_stats, /metrics and kvtrimctl. */
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.pressure_ppm, 333333);
	T_EQ_U64(ts.budget, 7);
	T_EQ(th_metric(&d, "kvtrim_tenant_budget_entries{tenant=\"squeezed\","
	                   "id=\"1\"}"), 7);
	T_EQ(th_sh(&d, out, sizeof(out), "%s --json tenants", ctl), 0);
	T_ASSERT(strstr(out, "\"budget_entries\":7"));

	/* full has no entry budget */
	kvt_disconnect(c);
	cfg = th_small_cfg(&d, "whole", "full");
	T_OK(kvt_connect(&cfg, &c, why));
	T_OK(kvt_seq_open(c, &seq));
	it.seq = seq;
	T_OK(kvt_sync(c, &it, 1));
	T_OK(kvt_last_sync(c, &si));
	T_EQ(si.budget, 0);
	T_EQ_U64(si.syncs, 1);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* Pages held by every list of seq (4 lists), summed. */
static uint64_t pages_held(kvt_client *c, kvt_seq seq)
{
	uint64_t n = 0;
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < 2; h++) {
			struct kvt_list li;
			T_OK(kvt_list_get(c, seq, l, h, &li));
			n += li.n_pages;
		}
	return n;
}

/*
 * A 300-token prefill chunk, then 10 decode steps of 1, pages of 16, on 4
 * lists.  With the registration's headroom of 300 throughout every list
 * ends at ceil((310 + 300) / 16) = 39 pages; asking headroom 1 before the
 * prefill sync leaves ceil((310 + 1) / 16) = 20.
 */
static uint64_t prefill_then_decode(const struct th_daemon *d, int per_sync)
{
	struct kvt_config cfg = th_small_cfg(d, per_sync ? "lean" : "fat",
	                                     "full");
	cfg.page_tokens = 16;
	cfg.headroom = 300;
	cfg.max_tokens = 1024;
	kvt_client *c;
	char why[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, why));
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));
	T_EQ_U64(pages_held(c, seq), 4 * 19); /* ceil(300 / 16) */
	struct kvt_sync_item it = {.seq = seq, .n_new = 300};
	append(c, seq, 300);
	if (per_sync)
		T_OK(kvt_seq_headroom(c, seq, 1));
	T_OK(kvt_sync(c, &it, 1));
	T_EQ_U64(pages_held(c, seq), per_sync ? 4 * 19 : 4 * 38);
	it.n_new = 1;
	for (int step = 0; step < 10; step++) {
		append(c, seq, 1);
		T_OK(kvt_sync(c, &it, 1));
	}
	uint64_t held = pages_held(c, seq);
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.pages_used, held); /* the tenant's only lists */
	if (per_sync) {
		/* Room for one: a second entry has no place, and a sync of
		 * two is refused, naming the headroom in force. */
		void *kp, *vp;
		T_ERR(kvt_kv_ptr(c, seq, 0, 0, 1, &kp, &vp), KVT_EHEADROOM);
		it.n_new = 2;
		T_ERR(kvt_sync(c, &it, 1), KVT_EHEADROOM);
		T_ASSERT(strstr(kvt_last_error(c), "headroom is 1 (as the last "
		                                   "sync asked)"));
		T_ERR(kvt_seq_headroom(c, seq, 301), KVT_EHEADROOM);
		/* The next chunk: back to the registration's room, at the
		 * sync before it. */
		T_OK(kvt_seq_headroom(c, seq, 0));
		it.n_new = 1;
		append(c, seq, 1);
		T_OK(kvt_sync(c, &it, 1));
		T_EQ_U64(pages_held(c, seq), 4 * 39); /* ceil((311+300)/16) */
		T_OK(kvt_kv_ptr(c, seq, 0, 0, 299, &kp, &vp));
		append(c, seq, 300);
		it.n_new = 300;
		T_OK(kvt_sync(c, &it, 1));
		struct kvt_list li;
		T_OK(kvt_list_get(c, seq, 1, 1, &li));
		T_EQ(li.len, 611);
	}
	char out[4096];
	T_EQ(th_sh(d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	return held;
}

TEST(contract_sync, per_sync_headroom_follows_the_next_append)
{
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	T_EQ_U64(prefill_then_decode(&d, 0), 4 * 39);
	T_EQ_U64(prefill_then_decode(&d, 1), 4 * 20);
	T_EQ_U64(th_stat(&d, "pool_bytes_used"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}
