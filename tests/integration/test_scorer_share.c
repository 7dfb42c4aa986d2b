/*
 * test_scorer_share.c — tenants whose device scorers have the same weights
 * share one device copy of them and one scorer run for the syncs that
 * arrive together, with the kept sets each keeps alone.
 *
 * Three tenants of kvzap (its MLP scorer), then of fastkvzip (its sink
 * gate): A and A2 load the same weights from two files (the
 * same bytes, so sharing goes by content, not path), B weights of the
 * same shapes and other bytes (equal sizes must not be enough to share).
 * Each stages its own x (seeded by its index), so their decisions differ.
 * Each is run alone on the cpu backend and on the cuda one, then the three
 * at once on one cuda daemon whose syncs all run on workers and gather
 * for each other (sync_offload_us 0, scorer_gather_us 100 ms, stopping as
 * soon as every sharer has queued): every tenant's kept positions (read
 * back from K rows that hold their position) must be the same as alone on
 * either backend (the cpu one on the emulator, whose cuBLAS is the CPU's
 * SGEMM); scorers_shared counts 2 device copies while the three
 * are connected.  Then A's file gets B's bytes and SIGHUP moves A to B's
 * copy: the copy of the old weights goes with A2, B's stays until both A
 * and B are gone.
 * Skips on the cpu suite (no device scorer there).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "kvtrim.h"
#include "rndweights.h"
#include "test.h"

#define S_SEQS 2u
#define S_ROUNDS 6u
#define S_TOK 64u /* max_tokens; kept positions per list at most */
#define S_LISTS (S_SEQS * 4u * 4u)

static const struct kvt_geometry S_GEO = {4, 8, 4, 16, 64};

struct share_run {
	const struct th_daemon *d;
	const char *name, *spec;
	uint32_t idx;                /* seeds the staged x */
	pthread_barrier_t *bar;      /* NULL: alone */
	int rc;
	char why[KVT_ERRTEXT_MAX];
	kvt_client *c;               /* left connected when keep is set */
	int keep;
	uint32_t len[S_LISTS];
	float kept[S_LISTS][S_TOK];  /* kept entries' positions */
};

/* n tokens at pos of sequence s: K rows holding the position (row[0]),
 * V zeros, x from (tenant, sequence, position, layer). */
static int put_tokens(kvt_client *c, kvt_seq s, uint32_t si, uint32_t idx,
                      uint32_t pos, uint32_t n)
{
	float row[16] = {0}, x[64];
	for (uint32_t k = 0; k < n; k++) {
		uint32_t p = pos + k;
		for (uint32_t l = 0; l < S_GEO.n_layers; l++) {
			for (uint32_t h = 0; h < S_GEO.n_kv_heads; h++) {
				void *kp, *vp;
				if (kvt_kv_ptr(c, s, l, h, k, &kp, &vp))
					return -1;
				row[0] = (float)p;
				th_put(c, kp, row, sizeof(row));
			}
			float *sx = kvt_stage_x(c, s, l, p);
			if (!sx)
				return -1;
			for (uint32_t i = 0; i < 64; i++)
				x[i] = (float)((p * 13 + l * 7 + i * 3 + si * 5 +
				                idx * 11) % 17) / 8.0f - 1.0f;
			th_put(c, sx, x, sizeof(x));
		}
	}
	return 0;
}

/* The kept positions of every list of the tenant's sequences. */
static int read_kept(struct share_run *r, const kvt_seq *s)
{
	const uint32_t pt = kvt_config_of(r->c)->page_tokens;
	uint32_t li = 0;
	for (uint32_t q = 0; q < S_SEQS; q++)
		for (uint32_t l = 0; l < S_GEO.n_layers; l++)
			for (uint32_t h = 0; h < S_GEO.n_kv_heads; h++, li++) {
				struct kvt_list ls;
				if (kvt_list_get(r->c, s[q], l, h, &ls))
					return -1;
				r->len[li] = ls.len;
				for (uint32_t e = 0; e < ls.len; e++) {
					float row[16];
					const char *pg = kvt_page_ptr(
						r->c, ls.pages[e / pt]);
					if (!pg)
						return -1;
					th_put(r->c, row, pg + (size_t)(e % pt) *
					                   sizeof(row), sizeof(row));
					r->kept[li][e] = row[0];
				}
			}
	return 0;
}

/* A prefill of 20 tokens per sequence, then S_ROUNDS decode syncs of 4
 * (every sync of both sequences), each after the barrier when shared. */
static void *share_drive(void *arg)
{
	struct share_run *r = arg;
	struct kvt_config cfg = th_small_cfg(r->d, r->name, r->spec);
	cfg.geo = S_GEO;
	cfg.max_seqs = S_SEQS;
	cfg.max_tokens = S_TOK;
	cfg.headroom = 20;
	cfg.stage_tokens = 64;
	cfg.timeout_ms = 60000;
	kvt_seq s[S_SEQS];
	uint32_t pos = 0;
	r->rc = kvt_connect(&cfg, &r->c, r->why);
	for (uint32_t q = 0; q < S_SEQS && !r->rc; q++)
		r->rc = kvt_seq_open(r->c, &s[q]);
	/* every round meets the barrier, failed or not: the others wait */
	for (uint32_t round = 0; round <= S_ROUNDS; round++) {
		uint32_t n = round ? 4 : 20;
		struct kvt_sync_item it[S_SEQS];
		for (uint32_t q = 0; q < S_SEQS && !r->rc; q++) {
			r->rc = put_tokens(r->c, s[q], q, r->idx, pos, n);
			it[q] = (struct kvt_sync_item){
				.seq = s[q], .n_new = n,
				.phase = round ? KVT_PHASE_DECODE
				               : KVT_PHASE_PREFILL};
		}
		if (r->bar)
			pthread_barrier_wait(r->bar);
		if (!r->rc)
			r->rc = kvt_sync(r->c, it, S_SEQS);
		pos += n;
	}
	if (!r->rc)
		r->rc = read_kept(r, s);
	if (r->rc && r->c && !r->why[0])
		snprintf(r->why, sizeof(r->why), "%s", kvt_last_error(r->c));
	if (!r->keep || r->rc) {
		kvt_disconnect(r->c);
		r->c = NULL;
	}
	return NULL;
}

static void expect_run(const struct share_run *r)
{
	if (r->rc)
		th_fail(__FILE__, __LINE__, "%s: %s: %s", r->name,
		        kvt_strerror(r->rc), r->why);
}

static void expect_same(const struct share_run *a, const struct share_run *b)
{
	for (uint32_t li = 0; li < S_LISTS; li++) {
		T_EQ(a->len[li], b->len[li]);
		T_ASSERT(!memcmp(a->kept[li], b->kept[li],
		                 a->len[li] * sizeof(float)));
	}
}

/* Whether a and b keep different entries somewhere. */
static int kept_differ(const struct share_run *a, const struct share_run *b)
{
	for (uint32_t li = 0; li < S_LISTS; li++)
		if (a->len[li] != b->len[li] ||
		    memcmp(a->kept[li], b->kept[li], a->len[li] * sizeof(float)))
			return 1;
	return 0;
}

/* Entries evicted over all lists (44 appended to each). */
static uint32_t evicted(const struct share_run *a)
{
	uint32_t n = 0;
	for (uint32_t li = 0; li < S_LISTS; li++)
		n += 44 - a->len[li];
	return n;
}

/* Waits until the daemon's gauge key reads want (a tenant's release is
 * applied on the daemon's loop after kvt_disconnect returns). */
static void wait_stat(const struct th_daemon *d, const char *key,
                      uint64_t want)
{
	for (int i = 0; i < 500 && th_stat(d, key) != want; i++)
		th_sleep_ms(20);
	T_EQ_U64(th_stat(d, key), want);
}

/* The test for one policy; fmt: its spec, %s the weights file. */
static void share_test(const char *pol, const char *fmt)
{
	if (strcmp(th_backend(), "cuda"))
		T_SKIP("cpu backend: no device scorer to share");
	char err[KVT_ERRTEXT_MAX], pa[200], pa2[200], pb[200];
	char sa[KVT_SPEC_MAX], sa2[KVT_SPEC_MAX], sb[KVT_SPEC_MAX];
	const struct th_wshape sh = {16, 4, 4, 4, 8};
	snprintf(pa, sizeof(pa), "%s/share-a.safetensors", th_tmpdir());
	snprintf(pa2, sizeof(pa2), "%s/share-a2.safetensors", th_tmpdir());
	snprintf(pb, sizeof(pb), "%s/share-b.safetensors", th_tmpdir());
	T_OK(th_random_weights(pol, &S_GEO, &sh, 5, pa, err, sizeof(err)));
	T_OK(th_random_weights(pol, &S_GEO, &sh, 5, pa2, err, sizeof(err)));
	T_OK(th_random_weights(pol, &S_GEO, &sh, 6, pb, err, sizeof(err)));
	snprintf(sa, sizeof(sa), fmt, pa);
	snprintf(sa2, sizeof(sa2), fmt, pa2);
	snprintf(sb, sizeof(sb), fmt, pb);
	const char *names[3] = {"share-a", "share-a2", "share-b"};
	const char *specs[3] = {sa, sa2, sb};
	static struct share_run cpu[3], alone[3], both[3];

	struct th_daemon dc, d;
	th_daemon_start_as(&dc, "cpu", "share-cpu", "64M", NULL);
	static const char *const extra[] = {"--sync-offload-us", "0",
	                                    "--scorer-gather-us", "100000",
	                                    NULL};
	th_daemon_start_as(&d, "cuda", "share-cuda", "64M", extra);
	for (uint32_t i = 0; i < 3; i++) {
		cpu[i] = (struct share_run){.d = &dc, .name = names[i],
		                            .spec = specs[i], .idx = i};
		alone[i] = cpu[i];
		alone[i].d = &d;
		share_drive(&cpu[i]);
		expect_run(&cpu[i]);
		share_drive(&alone[i]);
		expect_run(&alone[i]);
		wait_stat(&d, "scorers_shared", 0);
	}
	T_EQ_U64(th_stat(&d, "scorer_shared_runs_total"), 0);
	/* scores handed to the wrong tenant would show: the decisions
	 * differ between tenants, and they evict */
	fprintf(stderr, "    evicted alone: %u %u %u of %u\n", evicted(&alone[0]),
	        evicted(&alone[1]), evicted(&alone[2]), 44 * S_LISTS);
	T_ASSERT(kept_differ(&alone[0], &alone[1]) &&
	         kept_differ(&alone[0], &alone[2]) &&
	         kept_differ(&alone[1], &alone[2]));
	for (uint32_t i = 0; i < 3; i++)
		T_ASSERT(evicted(&alone[i]) > 0);
	/* the three at once, each sync after the others' are staged */
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, 3);
	pthread_t th[3];
	for (uint32_t i = 0; i < 3; i++) {
		both[i] = alone[i];
		both[i].bar = &bar;
		both[i].keep = 1;
		T_EQ(pthread_create(&th[i], NULL, share_drive, &both[i]), 0);
	}
	for (uint32_t i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&bar);
	for (uint32_t i = 0; i < 3; i++) {
		expect_run(&both[i]);
		expect_same(&both[i], &alone[i]);
		/* on a GPU cuBLAS's sums may round otherwise than OpenBLAS's:
		 * a score at the threshold may fall the other way there */
		if (getenv("KVTRIM_CUDA_EMU"))
			expect_same(&both[i], &cpu[i]);
	}
	/* A and A2 held one device copy, B its own; their syncs met */
	T_EQ_U64(th_stat(&d, "scorers_shared"), 2);
	uint64_t runs = th_stat(&d, "scorer_shared_runs_total");
	uint64_t syncs = th_stat(&d, "scorer_shared_syncs_total");
	fprintf(stderr, "    shared runs %llu for %llu syncs\n",
	        (unsigned long long)runs, (unsigned long long)syncs);
	T_ASSERT(runs >= 1 && syncs >= 2 * runs && syncs <= 2 * (S_ROUNDS + 1));
	/* A's file now holds B's bytes: on SIGHUP A moves to B's copy, and
	 * the copy of A's old weights is A2's alone */
	T_OK(th_random_weights(pol, &S_GEO, &sh, 6, pa, err, sizeof(err)));
	kill(d.pid, SIGHUP);
	wait_stat(&d, "weights_reloads_total", 3);
	T_EQ_U64(th_stat(&d, "scorers_shared"), 2);
	kvt_disconnect(both[1].c);
	wait_stat(&d, "tenants", 2);
	wait_stat(&d, "scorers_shared", 1);
	kvt_disconnect(both[0].c);
	wait_stat(&d, "tenants", 1);
	T_EQ_U64(th_stat(&d, "scorers_shared"), 1);
	kvt_disconnect(both[2].c);
	wait_stat(&d, "scorers_shared", 0);
	T_EQ(th_sh(&d, err, sizeof(err), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_daemon_stop(&d), 0);
	T_EQ(th_daemon_stop(&dc), 0);
}

TEST_T(scorer_share, kvzap_same_weights_share_one_copy_and_run, 240)
{
	share_test("kvzap", "kvzap:model=%s,window=4");
}

TEST_T(scorer_share, fastkvzip_same_weights_share_one_copy_and_run, 240)
{
	share_test("fastkvzip", "fastkvzip:model=%s,tokens=12,window=4,sinks=1");
}
