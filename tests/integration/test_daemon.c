/*
 * test_daemon.c — integration tests against the real kvtrimd on a scratch
 * runtime directory: tools, client library, loadgen and SIGHUP reloads of
 * scorer weights (bad input, crashes and shutdown: test_daemon_faults.c).
 * Expected values come from the test's own arithmetic.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "daemon.h"
#include "handle.h"
#include "kvtrim.h"
#include "test.h"
#include "weights.h"

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/*
 * Writes entry k of every list of seq (th_small_cfg) with K floats
 * (tag * 1000 + pos) + (l * 100 + h * 10) + i / 16 and V their negation,
 * built on the host and copied with kvt_memcpy, so any backend's pages.
 */
static void put_token(kvt_client *c, kvt_seq seq, uint32_t k, float tag,
                      uint32_t pos)
{
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < 2; h++) {
			void *kp, *vp;
			float kr[8], vr[8];
			T_OK(kvt_kv_ptr(c, seq, l, h, k, &kp, &vp));
			for (int i = 0; i < 8; i++) {
				kr[i] = tag * 1000 + (float)pos +
				        (float)(l * 100 + h * 10) +
				        (float)i / 16;
				vr[i] = -kr[i];
			}
			T_OK(kvt_memcpy(c, kp, kr, sizeof(kr)));
			T_OK(kvt_memcpy(c, vp, vr, sizeof(vr)));
		}
}

/* A page of th_small_cfg: K rows 0..3, then V rows 0..3, 8 floats each. */
#define SMALL_PAGE_FLOATS (2 * 4 * 8)

/* Copies page id `page` into out with kvt_memcpy (any backend). */
static void get_page(kvt_client *c, uint32_t page,
                     float out[SMALL_PAGE_FLOATS])
{
	void *pg = kvt_page_ptr(c, page);
	T_ASSERT(pg);
	T_OK(kvt_memcpy(c, out, pg, SMALL_PAGE_FLOATS * sizeof(float)));
}

TEST(daemon, starts_reports_and_stops_cleanly)
{
	struct th_daemon d;
	char out[8192];
	th_daemon_start(&d, "64M", NULL);
	T_EQ_U64(th_stat(&d, "pool_size_bytes"), 64ull << 20);
	T_EQ_U64(th_stat(&d, "pool_bytes_used"), 0);
	T_EQ_U64(th_stat(&d, "pool_bytes_free"), 64ull << 20);
	T_EQ_U64(th_stat(&d, "pool_chunks_capacity"), 32);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_sh(&d, out, sizeof(out), "%s policies", th_bin("kvtrimctl")), 0);
	T_ASSERT(strstr(out, "streaming"));
	T_EQ(th_daemon_stop(&d), 0);
	struct stat st;
	char path[600];
	snprintf(path, sizeof(path), "%s/ctl.ipc", d.dir);
	T_ASSERT(stat(path, &st) != 0);
	snprintf(path, sizeof(path), "%s/fd.sock", d.dir);
	T_ASSERT(stat(path, &st) != 0);
}

TEST(daemon, list_policies_and_bad_options)
{
	char out[4096];
	T_EQ(th_sh(NULL, out, sizeof(out), "%s --list-policies",
	           th_bin("kvtrimd")), 0);
	/* One line per policy: name, parameters with their defaults, and
	 * what it reads; no running daemon needed. */
	T_ASSERT(!strncmp(out, "full ", 5));
	T_ASSERT(strstr(out, "\nstreaming "));
	T_ASSERT(strstr(out, "tokens=256"));     /* h2o's default */
	T_ASSERT(strstr(out, "threshold=-4"));   /* kvzap's */
	const char *kz = strstr(out, "\nkvzap ");
	T_ASSERT(kz);
	const char *eol = strchr(kz + 1, '\n');
	T_ASSERT(eol);
	T_ASSERT(strstr(kz, "reads x\n") == eol - strlen("reads x"));
	T_ASSERT(strstr(out, "reads q, lse, K/V pages\n"));
	T_ASSERT(strstr(out, "reads nothing\n"));
	T_EQ(th_sh(NULL, out, sizeof(out), "%s --pool-size 12Q",
	           th_bin("kvtrimd")), 2);
	T_ASSERT(strstr(out, "pool_size"));
	T_EQ(th_sh(NULL, out, sizeof(out), "%s --no-such-option 1",
	           th_bin("kvtrimd")), 2);
	/* Only where cuda cannot run (no NVIDIA driver device): elsewhere
	 * the daemon would start and serve. */
	if (!strcmp(th_backend(), "cpu") && access("/dev/nvidiactl", F_OK) != 0) {
		T_EQ(th_sh(NULL, out, sizeof(out), "%s --backend cuda "
		           "--runtime-dir %s/x", th_bin("kvtrimd"),
		           th_tmpdir()), 1);
		T_ASSERT(strstr(out, "cuda"));
	}
}

TEST(daemon, socket_modes_are_restrictive)
{
	struct th_daemon d;
	struct stat st;
	char path[600];
	th_daemon_start(&d, "8M", NULL);
	snprintf(path, sizeof(path), "%s/fd.sock", d.dir);
	T_EQ(stat(path, &st), 0);
	T_EQ(st.st_mode & 0777, 0660);
	snprintf(path, sizeof(path), "%s/ctl.ipc", d.dir);
	T_EQ(stat(path, &st), 0);
	T_EQ(st.st_mode & 0777, 0660);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(client, full_policy_keeps_every_entry_bit_exact)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "full-a", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	/* 10 tokens: a sync of 3, then 7 single-token syncs. */
	for (uint32_t k = 0; k < 3; k++)
		put_token(c, seq, k, 1, k);
	struct kvt_sync_item it = {seq, 3, KVT_PHASE_PREFILL, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
	for (uint32_t p = 3; p < 10; p++) {
		put_token(c, seq, 0, 1, p);
		it = (struct kvt_sync_item){seq, 1, KVT_PHASE_DECODE, 0, 0};
		T_OK(kvt_sync(c, &it, 1));
	}
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < 2; h++) {
			struct kvt_list v;
			T_OK(kvt_list_get(c, seq, l, h, &v));
			T_EQ(v.len, 10);
			/* ceil((10 + headroom 4) / 4) = 4 pages */
			T_EQ(v.n_pages, 4);
			unsigned seen = 0;
			for (uint32_t e = 0; e < v.len; e++) {
				float pg[SMALL_PAGE_FLOATS];
				get_page(c, v.pages[e / 4], pg);
				float *k = pg + (e % 4) * 8;
				float *vv = pg + (4 + e % 4) * 8;
				float base = k[0] - (float)(l * 100 + h * 10) - 1000;
				uint32_t pos = (uint32_t)base;
				T_ASSERT(pos < 10 && (float)pos == base);
				seen |= 1u << pos;
				for (int i = 0; i < 8; i++) {
					T_ASSERT(k[i] == 1000 + (float)pos +
					                 (float)(l * 100 + h * 10) +
					                 (float)i / 16);
					T_ASSERT(vv[i] == -k[i]);
				}
			}
			T_EQ(seen, 0x3ff);
		}
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.entries_kept, 40);
	T_EQ_U64(ts.entries_appended, 40);
	T_EQ_U64(ts.entries_evicted, 0);
	T_EQ_U64(ts.pages_used, 16);
	T_EQ_U64(ts.sequences, 1);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_OK(kvt_seq_close(c, seq));
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.pages_used, 0);
	kvt_disconnect(c);
	sleep_ms(100);
	T_EQ_U64(th_stat(&d, "pool_chunks_used"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(client, streaming_keeps_sinks_and_recent_window)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "stream", "streaming:sinks=2,tokens=6");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	for (uint32_t p = 0; p < 20; p++) {
		put_token(c, seq, 0, 2, p);
		struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
		T_OK(kvt_sync(c, &it, 1));
	}
	/* 20 seen, budget 6, sinks 2: keep {0, 1} and {16, 17, 18, 19}. */
	struct kvt_list v;
	T_OK(kvt_list_get(c, seq, 1, 1, &v));
	T_EQ(v.len, 6);
	T_EQ(v.n_pages, 3); /* ceil((6 + 4) / 4) */
	unsigned seen = 0;
	for (uint32_t e = 0; e < v.len; e++) {
		float pg[SMALL_PAGE_FLOATS];
		get_page(c, v.pages[e / 4], pg);
		float *k = pg + (e % 4) * 8;
		uint32_t pos = (uint32_t)(k[0] - 2000 - 110);
		seen |= 1u << pos;
		T_ASSERT(k[7] == 2000 + (float)pos + 110 + 7.0f / 16);
	}
	T_EQ(seen, (1u << 0) | (1u << 1) | (0xfu << 16));
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.entries_evicted, 4 * 14);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * Bytes of the page checker below: on host pages (the cpu backend) read
 * with plain loads, independent of kvt_memcpy; on device pages with
 * kvt_memcpy, the only way there.
 */
static void read_bytes(kvt_client *c, uint8_t *out, const uint8_t *page,
                       size_t n)
{
	if (kvt_memory_kind(c) == KVT_MEMORY_HOST) {
		for (size_t i = 0; i < n; i++)
			out[i] = page[i];
		return;
	}
	T_OK(kvt_memcpy(c, out, page, n));
}

/* Byte i of the page contents the memcpy test builds. */
static uint8_t pat_a(size_t i) { return (uint8_t)(i * 7 + 3); }
static uint8_t pat_b(size_t i) { return (uint8_t)(255 - i); }

/* Checks every byte of page against want(i) (fails with the first). */
static void expect_page(kvt_client *c, const uint8_t *page, size_t n,
                        uint8_t (*want)(size_t))
{
	uint8_t got[SMALL_PAGE_FLOATS * sizeof(float)];
	T_ASSERT(n <= sizeof(got));
	read_bytes(c, got, page, n);
	for (size_t i = 0; i < n; i++)
		if (got[i] != want(i))
			th_fail(__FILE__, __LINE__, "byte %zu is %u, "
			        "expected %u", i, got[i], want(i));
}

/* Page a after the 10 bytes 0xa0.. at offset 37. */
static uint8_t pat_a2(size_t i)
{
	return i >= 37 && i < 47 ? (uint8_t)(0xa0 + i - 37) : pat_a(i);
}

/* Page b after 16 bytes of page a2 from offset 8 went to offset 100. */
static uint8_t pat_b2(size_t i)
{
	return i >= 100 && i < 116 ? pat_a2(i - 100 + 8) : pat_b(i);
}

TEST(client, memcpy_moves_exact_bytes_between_host_and_pages)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX];
	enum { PB = SMALL_PAGE_FLOATS * sizeof(float) }; /* 256 bytes */
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "memcpy", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	if (!strcmp(th_backend(), "cpu"))
		T_EQ(kvt_memory_kind(c), KVT_MEMORY_HOST);
	T_OK(kvt_seq_open(c, &seq));
	/* The first page of three lists: a and b are written, n is the
	 * neighbour nobody writes. */
	struct kvt_list la, lb, ln;
	T_OK(kvt_list_get(c, seq, 0, 0, &la));
	T_OK(kvt_list_get(c, seq, 1, 1, &lb));
	T_OK(kvt_list_get(c, seq, 0, 1, &ln));
	T_ASSERT(la.n_pages >= 1 && lb.n_pages >= 1 && ln.n_pages >= 1);
	uint8_t *pa = kvt_page_ptr(c, la.pages[0]);
	uint8_t *pb = kvt_page_ptr(c, lb.pages[0]);
	uint8_t *pn = kvt_page_ptr(c, ln.pages[0]);
	T_ASSERT(pa && pb && pn && pa != pb && pa != pn && pb != pn);
	uint8_t n_before[PB], n_after[PB];
	read_bytes(c, n_before, pn, PB);

	/* host -> page, whole pages */
	uint8_t src[PB], got[PB];
	for (size_t i = 0; i < PB; i++)
		src[i] = pat_a(i);
	T_OK(kvt_memcpy(c, pa, src, PB));
	for (size_t i = 0; i < PB; i++)
		src[i] = pat_b(i);
	T_OK(kvt_memcpy(c, pb, src, PB));
	expect_page(c, pa, PB, pat_a);
	expect_page(c, pb, PB, pat_b);

	/* page -> host, the whole page and a slice at an odd offset */
	memset(got, 0xee, sizeof(got));
	T_OK(kvt_memcpy(c, got, pa, PB));
	for (size_t i = 0; i < PB; i++)
		T_EQ(got[i], pat_a(i));
	memset(got, 0xee, sizeof(got));
	T_OK(kvt_memcpy(c, got + 1, pb + 51, 13));
	T_EQ(got[0], 0xee);
	for (size_t i = 0; i < 13; i++)
		T_EQ(got[1 + i], pat_b(51 + i));
	T_EQ(got[14], 0xee);

	/* host -> page, 10 bytes at an odd offset: the rest stays */
	uint8_t ten[10];
	for (size_t i = 0; i < 10; i++)
		ten[i] = (uint8_t)(0xa0 + i);
	T_OK(kvt_memcpy(c, pa + 37, ten, sizeof(ten)));
	expect_page(c, pa, PB, pat_a2);

	/* page -> page, 16 bytes from a + 8 to b + 100 */
	T_OK(kvt_memcpy(c, pb + 100, pa + 8, 16));
	expect_page(c, pa, PB, pat_a2);
	expect_page(c, pb, PB, pat_b2);

	/* 0 bytes copy nothing; NULL pointers and client are refused */
	for (size_t i = 0; i < PB; i++)
		src[i] = 0x55;
	T_OK(kvt_memcpy(c, pa, src, 0));
	T_OK(kvt_memcpy(c, pb, pa, 0));
	memset(got, 0xee, sizeof(got));
	T_OK(kvt_memcpy(c, got, pa, 0));
	for (size_t i = 0; i < PB; i++)
		T_EQ(got[i], 0xee);
	T_ERR(kvt_memcpy(c, NULL, src, 4), KVT_EINVAL);
	T_ERR(kvt_memcpy(c, pa, NULL, 4), KVT_EINVAL);
	T_ERR(kvt_memcpy(c, NULL, NULL, 4), KVT_EINVAL);
	T_ERR(kvt_memcpy(NULL, pa, src, 4), KVT_EINVAL);
	T_ERR(kvt_memcpy(NULL, got, pa, 4), KVT_EINVAL);
	expect_page(c, pa, PB, pat_a2);
	expect_page(c, pb, PB, pat_b2);

	/* page -> page, a whole page */
	T_OK(kvt_memcpy(c, pb, pa, PB));
	expect_page(c, pb, PB, pat_a2);
	expect_page(c, pa, PB, pat_a2);

	/* The neighbour page saw none of it. */
	read_bytes(c, n_after, pn, PB);
	T_ASSERT(!memcmp(n_before, n_after, PB));
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_OK(kvt_seq_close(c, seq));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(loadgen, verify_full_and_streaming_many_tenants, 120)
{
	struct th_daemon d;
	char out[8192];
	th_daemon_start(&d, "128M", NULL);
	int rc = th_sh(&d, out, sizeof(out),
	               "%s --runtime-dir %s --clients 3 --seqs 4 --steps 150 "
	               "--policy full --verify --name lf",
	               th_bin("kvtrim-loadgen"), d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "loadgen full: %d\n%s", rc, out);
	T_ASSERT(strstr(out, "mismatches=0"));
	rc = th_sh(&d, out, sizeof(out),
	           "%s --runtime-dir %s --clients 3 --seqs 4 --steps 200 "
	           "--policy streaming:sinks=4,tokens=40 --sync-every 5 "
	           "--dtype f16 --verify --name ls",
	           th_bin("kvtrim-loadgen"), d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "loadgen streaming: %d\n%s", rc, out);
	T_ASSERT(strstr(out, "mismatches=0"));
	rc = th_sh(&d, out, sizeof(out),
	           "%s --runtime-dir %s --clients 2 --seqs 3 --steps 120 "
	           "--policy streaming:ratio=0.5 --sync-every 3 --dtype bf16 "
	           "--page-tokens 8 --verify --name lr",
	           th_bin("kvtrim-loadgen"), d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "loadgen ratio: %d\n%s", rc, out);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ_U64(th_stat(&d, "pool_chunks_used"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

/* kvzap linear weights for the small model: scores = bias for any x. */
static void write_kvzap(const char *path, float bias)
{
	static float w[2][2 * 32], b[2][2];
	struct weights_tensor t[4];
	char names[4][32];
	for (int l = 0; l < 2; l++) {
		for (int i = 0; i < 2 * 32; i++)
			w[l][i] = 0;
		b[l][0] = b[l][1] = bias;
		snprintf(names[2 * l], 32, "layers.%d.weight", l);
		snprintf(names[2 * l + 1], 32, "layers.%d.bias", l);
		t[2 * l] = (struct weights_tensor){names[2 * l], 2, {2, 32, 0, 0},
		                                   w[l]};
		t[2 * l + 1] = (struct weights_tensor){names[2 * l + 1], 1,
		                                       {2, 0, 0, 0}, b[l]};
	}
	char err[256];
	T_OK(weights_write(path, t, 4, err, sizeof(err)));
}

static void kvzap_tokens(kvt_client *c, kvt_seq seq, uint32_t *pos, int n)
{
	for (int i = 0; i < n; i++, (*pos)++) {
		put_token(c, seq, 0, 3, *pos);
		for (uint32_t l = 0; l < 2; l++) {
			float *x = kvt_stage_x(c, seq, l, *pos);
			static const float zero[32];
			T_ASSERT(x);
			th_put(c, x, zero, sizeof(zero));
		}
		struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
		T_OK(kvt_sync(c, &it, 1));
	}
}

static uint64_t wait_stat(const struct th_daemon *d, const char *key,
                          uint64_t want)
{
	uint64_t v = 0;
	for (int i = 0; i < 100 && (v = th_stat(d, key)) < want; i++)
		sleep_ms(20);
	return v;
}

/* Bytes of this process's mapping of the memfd named `name`, 0 if none. */
static uint64_t mapped_bytes(const char *name)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	uint64_t total = 0;
	T_ASSERT(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long long lo, hi;
		if (strstr(line, name) &&
		    sscanf(line, "%llx-%llx", &lo, &hi) == 2)
			total += hi - lo;
	}
	fclose(f);
	return total;
}

/*
 * kvzap reads only x, so its tenant stages only x: the
 * staging segment holds 4 sequences x 2 layers x 8 rows x d_model 32
 * floats + the 64-byte header = 8256 bytes (3 pages mapped), where x, q
 * (4 heads x 8) and lse (4) took 4 x 2 x 8 x 68 x 4 + 64 = 17472 (5
 * pages); kvt_stage_q and kvt_stage_lse have no room to give.  The sync
 * still works on x alone.
 */
TEST(reload, kvzap_stages_x_only)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX], path[512], spec[700];
	snprintf(path, sizeof(path), "%s/kvzap-x.safetensors", th_tmpdir());
	write_kvzap(path, 0.0f);
	th_daemon_start(&d, "16M", NULL);
	snprintf(spec, sizeof(spec), "kvzap:model=%s,threshold=-4,window=4",
	         path);
	struct kvt_config cfg = th_small_cfg(&d, "x-only", spec);
	cfg.stage_tokens = 8;
	T_OK(kvt_connect(&cfg, &c, err));
	T_EQ(kvt_policy_inputs(c), KVT_INPUT_X);
	T_EQ_U64(mapped_bytes("kvtrim-stage"), 3 * 4096);
	T_OK(kvt_seq_open(c, &seq));
	T_ASSERT(kvt_stage_x(c, seq, 1, 7));
	T_ASSERT(!kvt_stage_q(c, seq, 0, 0));
	T_ASSERT(!kvt_stage_lse(c, seq, 0, 0));
	/* Row 1 of layer 0 begins d_model floats after row 0. */
	char *r0 = (char *)kvt_stage_x(c, seq, 0, 0);
	T_EQ((char *)kvt_stage_x(c, seq, 0, 1) - r0,
	     32 * (ptrdiff_t)sizeof(float));
	uint32_t pos = 0;
	kvzap_tokens(c, seq, &pos, 10);
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.syncs, 10);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(reload, sighup_rereads_scorer_weights_and_keeps_tenants)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX], path[512], spec[700];
	snprintf(path, sizeof(path), "%s/kvzap.safetensors", th_tmpdir());
	write_kvzap(path, 0.0f); /* score 0 >= -4: everything kept */
	th_daemon_start(&d, "16M", NULL);
	snprintf(spec, sizeof(spec), "kvzap:model=%s,threshold=-4,window=4",
	         path);
	struct kvt_config cfg = th_small_cfg(&d, "reloader", spec);
	cfg.stage_tokens = 8;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	uint32_t pos = 0;
	kvzap_tokens(c, seq, &pos, 10);
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.entries_evicted, 0);

	/* New weights: every score -10 < -4.  kvzap scores an entry when it
	 * arrives and decides when it leaves the 4-entry window, so after
	 * SIGHUP tokens 10..15 arrive with score -10 and, at n_seen 16,
	 * positions 10 and 11 have left the window (6..9 were scored 0 by
	 * the old weights and stay): 2 positions x 4 lists. */
	write_kvzap(path, -10.0f);
	kill(d.pid, SIGHUP);
	T_EQ_U64(wait_stat(&d, "weights_reloads_total", 1), 1);
	kvzap_tokens(c, seq, &pos, 6);
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.entries_evicted, 2 * 4);

	/* A broken file (wrong shape) is refused; the tenant keeps the
	 * weights it had and goes on evicting with them: 2 more tokens,
	 * positions 12 and 13 leave the window. */
	static float bad[3];
	struct weights_tensor t = {"layers.0.weight", 1, {3, 0, 0, 0}, bad};
	T_OK(weights_write(path, &t, 1, err, sizeof(err)));
	kill(d.pid, SIGHUP);
	T_EQ_U64(wait_stat(&d, "weights_reload_failures_total", 1), 1);
	T_EQ_U64(th_stat(&d, "tenants"), 1);
	kvzap_tokens(c, seq, &pos, 2);
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.entries_evicted, 4 * 4);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * model= paths (docs/weights.md "Paths"): the daemon runs
 * in another directory than the engine, and a relative path means the
 * engine's: libkvtrim sends it absolute (kvt_config_of shows it), so the
 * weights load; the daemon itself refuses a relative path (the raw hello
 * is tenant.relative_model_paths_are_refused's).
 */
/* kvpop weights for the small model (2 layers, 2 KV heads, d_model 32; r
 * 2, m 2): P, W1 and W2 zero, so an entry's score is fc2's bias for its KV
 * head, whatever its x and the attention it received; with budget shares
 * share [2 layers][2 KV heads] at keep fraction 1/2 when not NULL. */
/* kvpop weights for the daemon tests: 2 layers, 2 KV heads, every score
 * fc2's bias; with budget shares share [2][2] at keep 1/2 and the learned
 * memory's kvpop.memory [2][3] mem when not NULL. */
static void write_kvpop_shm(const char *path, float bias, const float *share,
                            const float *mem)
{
	enum { R = 2, M = 2 };
	static float P[R * 32], W1[M * (R + 1)], b1[M], W2[2 * M], b2[2];
	static const float keep[1] = {0.5f};
	b2[0] = b2[1] = bias;
	struct weights_tensor t[13];
	char names[10][40];
	for (int l = 0; l < 2; l++) {
		const struct {
			const char *fmt;
			uint32_t nd, d0, d1;
			float *v;
		} part[5] = {
			{"kvpop.%d.proj.weight", 2, R, 32, P},
			{"kvpop.%d.fc1.weight", 2, M, R + 1, W1},
			{"kvpop.%d.fc1.bias", 1, M, 0, b1},
			{"kvpop.%d.fc2.weight", 2, 2, M, W2},
			{"kvpop.%d.fc2.bias", 1, 2, 0, b2},
		};
		for (int k = 0; k < 5; k++) {
			snprintf(names[5 * l + k], 40, part[k].fmt, l);
			t[5 * l + k] = (struct weights_tensor){
				names[5 * l + k], part[k].nd,
				{part[k].d0, part[k].d1, 0, 0}, part[k].v};
		}
	}
	size_t n = 10;
	if (share) {
		t[n++] = (struct weights_tensor){"kvpop.share", 3, {1, 2, 2, 0},
		                                 share};
		t[n++] = (struct weights_tensor){"kvpop.share_keep", 1,
		                                 {1, 0, 0, 0}, keep};
	}
	if (mem)
		t[n++] = (struct weights_tensor){"kvpop.memory", 2, {2, 3, 0, 0},
		                                 mem};
	char err[256];
	T_OK(weights_write(path, t, n, err, sizeof(err)));
}

static void write_kvpop_sh(const char *path, float bias, const float *share)
{
	write_kvpop_shm(path, bias, share, NULL);
}

static void write_kvpop(const char *path, float bias)
{
	write_kvpop_sh(path, bias, NULL);
}

/* One token at pos: K row (pos, 0, ...) in every list (small, so the
 * attention kvpop accumulates stays finite), q and lse staged; a sync. */
static void kvpop_token(kvt_client *c, kvt_seq seq, uint32_t pos)
{
	float kr[8] = {(float)pos};
	for (uint32_t l = 0; l < 2; l++) {
		for (uint32_t h = 0; h < 2; h++) {
			void *kp, *vp;
			T_OK(kvt_kv_ptr(c, seq, l, h, 0, &kp, &vp));
			T_OK(kvt_memcpy(c, kp, kr, sizeof(kr)));
			T_OK(kvt_memcpy(c, vp, kr, sizeof(kr)));
		}
		th_stage_row(c, seq, l, pos, NULL);
	}
	struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
}

/* A client of tenant name under spec, staging 8 tokens a sync, and one
 * sequence open. */
static void kvpop_open(struct th_daemon *d, const char *name,
                       const char *spec, kvt_client **c, kvt_seq *seq)
{
	char err[KVT_ERRTEXT_MAX];
	struct kvt_config cfg = th_small_cfg(d, name, spec);
	cfg.stage_tokens = 8;
	T_OK(kvt_connect(&cfg, c, err));
	T_OK(kvt_seq_open(*c, seq));
}

/* Whether both lists of layer l of seq hold exactly the positions want
 * [n] (read from K[0] of their entries, any order). */
static int kvpop_layer_holds(kvt_client *c, kvt_seq seq, uint32_t l,
                             const uint32_t *want, uint32_t n)
{
	for (uint32_t h = 0; h < 2; h++) {
		struct kvt_list li;
		T_OK(kvt_list_get(c, seq, l, h, &li));
		if (li.len != n)
			return 0;
		uint32_t seen = 0;
		for (uint32_t e = 0; e < li.len; e++) {
			float pg[SMALL_PAGE_FLOATS];
			get_page(c, li.pages[e / 4], pg);
			uint32_t p = (uint32_t)pg[(e % 4) * 8];
			for (uint32_t k = 0; k < n; k++)
				seen += want[k] == p;
		}
		if (seen != n)
			return 0;
	}
	return 1;
}

/* Whether every list of seq holds exactly the positions want [n]. */
static int kvpop_holds(kvt_client *c, kvt_seq seq, const uint32_t *want,
                       uint32_t n)
{
	return kvpop_layer_holds(c, seq, 0, want, n) &&
	       kvpop_layer_holds(c, seq, 1, want, n);
}

/*
 * A SIGHUP reaches KVpop's weights wherever its tenant decides: on the
 * cuda backend its tensors are copied to the device at registration
 * (its device rule's), and the reload copies the new ones there.  tokens=6,
 * delay=1, sinks=0, a token a sync: an entry is scored at the sync after
 * it arrived, and the newest is protected.  With fc2's bias +1 every score
 * ties, so the newest positions stay: 4..9 after 10 tokens.  After the
 * reload (bias -1) each new entry scores -1 once scored, below the old
 * ones, and is the one dropped: 9, 10 and 11 at the next three syncs, so
 * 4..8 and 12 stay (with the old weights still in use: 7..12).
 */
TEST(reload, sighup_reaches_kvpop_weights_on_either_backend)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX], path[512], spec[700];
	snprintf(path, sizeof(path), "%s/kvpop.safetensors", th_tmpdir());
	write_kvpop(path, 1.0f);
	th_daemon_start(&d, "16M", NULL);
	/* the scorer alone (no window, no memory): the weights decide */
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=6,delay=1,sinks=0,"
	         "window=0,memory=0", path);
	kvpop_open(&d, "popper", spec, &c, &seq);
	uint32_t pos = 0;
	for (; pos < 10; pos++)
		kvpop_token(c, seq, pos);
	const uint32_t before[6] = {4, 5, 6, 7, 8, 9};
	T_ASSERT(kvpop_holds(c, seq, before, 6));

	write_kvpop(path, -1.0f);
	kill(d.pid, SIGHUP);
	T_EQ_U64(wait_stat(&d, "weights_reloads_total", 1), 1);
	for (; pos < 13; pos++)
		kvpop_token(c, seq, pos);
	const uint32_t after[6] = {4, 5, 6, 7, 8, 12};
	T_ASSERT(kvpop_holds(c, seq, after, 6));
	T_EQ(th_sh(&d, err, sizeof(err), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * KVpop's budget shares through a real daemon: shares 1.5, 0.5 (layer 0's
 * KV heads) and 1, 1 (layer 1's) at keep 1/2; tokens=10, delay=1, sinks
 * 0, no window: every list holds P0 = 1 (the entry in its delay) plus its
 * part 9 share of the free 36, the share linear in ln phi, phi = 9 / (n -
 * 1), from 1 at phi = 1 to the table's at phi <= 1/2 (n >= 19), rounded
 * by largest remainders.  After 20 tokens the parts are 13.5, 4.5, 9 and
 * 9: floors 13, 4, 9, 9 and the one entry left to the lower of the two
 * tied remainders, list (0, 0): 1 + 14 = 15, 5, 10 and 10 entries, the 40
 * an even budget holds (list (0, 0) got its budget at every sync from n =
 * 11 on: 11, 11, 12, 12, 13, 13, 14, 14, 15, never more than one above
 * the last).  The scores tie (fc2's bias), so the newest positions stay.
 */
TEST(daemon, kvpop_budget_shares_hold)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX], path[512], spec[700];
	snprintf(path, sizeof(path), "%s/kvpop-sh.safetensors", th_tmpdir());
	const float share[4] = {1.5f, 0.5f, 1.0f, 1.0f};
	write_kvpop_sh(path, 1.0f, share);
	th_daemon_start(&d, "16M", NULL);
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=10,delay=1,"
	         "sinks=0,window=0", path);
	kvpop_open(&d, "sharer", spec, &c, &seq);
	for (uint32_t pos = 0; pos < 20; pos++)
		kvpop_token(c, seq, pos);
	const uint32_t want[2][2] = {{15, 5}, {10, 10}};
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < 2; h++) {
			struct kvt_list li;
			T_OK(kvt_list_get(c, seq, l, h, &li));
			T_EQ(li.len, want[l][h]);
		}
	T_EQ(th_sh(&d, err, sizeof(err), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * The learned memory's rule replayed naively in double for kvpop_token's
 * rows (K[0] of position p is p, q 0.1 in each of 8 dimensions, lse of
 * query t ln(t + 1), so every query head pays entry p v = e^(0.1 p / sqrt
 * 8) / (t + 1)), delay 1, no sinks or window, a fixed budget of B and a
 * token a sync, a memory of decay T tokens read out w_s s + w_f ln(m / c
 * + 1e-6) (a / delay while c = 0), every score s 1 (fc2's bias): the
 * positions held after n tokens into out [B], in order.  The smallest gap
 * between the last entry kept and the first dropped at a selection goes
 * to *gap, so a test can tell that float rounding cannot flip it.
 */
static void lm_replay(double T, double ws, double wf, uint32_t n, uint32_t B,
                      uint32_t *out, double *gap)
{
	enum { N = 16 };
	double a[N] = {0}, m[N] = {0}, cnt[N] = {0};
	int held[N] = {0};
	const double beta = exp(-1.0 / T);
	*gap = INFINITY;
	for (uint32_t t = 0; t < n && t < N; t++) {
		held[t] = 1;
		double r[N]; /* the held entries' ranks */
		for (uint32_t p = 0; p < t; p++) {
			if (!held[p])
				continue;
			const double v = exp(0.1 * p / sqrt(8.0)) / (t + 1);
			if (t - p <= 1) {
				a[p] += v;
			} else {
				m[p] = beta * m[p] + v;
				cnt[p] = beta * cnt[p] + 1;
			}
			r[p] = ws + wf * log((cnt[p] > 0 ? m[p] / cnt[p] : a[p]) +
			                     1e-6);
		}
		/* the newest is protected; of the others the best B - 1 stay
		 * (ties: the higher position) */
		uint32_t L = 0;
		for (uint32_t p = 0; p < t; p++)
			L += held[p];
		for (; L > B - 1; L--) {
			uint32_t w = N;
			for (uint32_t p = 0; p < t; p++)
				if (held[p] && (w == N || r[p] < r[w]))
					w = p;
			for (uint32_t p = 0; p < t; p++)
				if (held[p] && p != w && r[p] - r[w] < *gap)
					*gap = r[p] - r[w];
			held[w] = 0;
		}
	}
	uint32_t k = 0;
	for (uint32_t p = 0; p < N && k < B; p++)
		if (held[p])
			out[k++] = p;
}

/*
 * memory=learned through a real daemon, on either backend (on cuda its
 * device rule runs it: the decay and readout of each layer go up with the
 * weights): weights without kvpop.memory are refused at registration with
 * the reason and nothing registered; with it, tokens=6, delay=1, sinks=0,
 * no window, the readout the memory alone (w_s 0, w_f 1) at a decay of 16
 * tokens in layer 0 and 2 in layer 1, each layer holds what lm_replay
 * says after ten tokens (old entries, whose mean attention came from
 * earlier queries with smaller lse, outrank the newer ones: not the
 * newest six), the two layers differently, and the state checks out.
 * With the readout the score alone (w_s 1, w_f 0) every rank ties and the
 * newest six stay.
 */
TEST(daemon, kvpop_learned_memory_runs_and_refuses)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX], path[512], spec[700];
	snprintf(path, sizeof(path), "%s/kvpop-lm.safetensors", th_tmpdir());
	write_kvpop(path, 1.0f);
	th_daemon_start(&d, "16M", NULL);
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=6,delay=1,sinks=0,"
	         "window=0,memory=learned", path);
	struct kvt_config cfg = th_small_cfg(&d, "recaller", spec);
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EPOLICY);
	T_ASSERT(strstr(err, "kvpop.memory"));
	const float mem[2][6] = {{16, 0, 1, 2, 0, 1}, {16, 1, 0, 64, 1, 0}};
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof(path), "%s/kvpop-lm%d.safetensors",
		         th_tmpdir(), k);
		write_kvpop_shm(path, 1.0f, NULL, mem[k]);
		snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=6,delay=1,"
		         "sinks=0,window=0,memory=learned", path);
		kvpop_open(&d, "recaller", spec, &c, &seq);
		for (uint32_t pos = 0; pos < 10; pos++)
			kvpop_token(c, seq, pos);
		uint32_t want[2][6];
		for (uint32_t l = 0; l < 2; l++) {
			double gap;
			const float *lm = mem[k] + 3 * l;
			lm_replay(lm[0], lm[1], lm[2], 10, 6, want[l], &gap);
			T_ASSERT(!(gap < 1e-3) || lm[2] == 0.0f);
			T_ASSERT(kvpop_layer_holds(c, seq, l, want[l], 6));
		}
		/* the memory moved the old ones in, each layer its own way;
		 * without it, the newest six */
		T_EQ(memcmp(want[0], want[1], sizeof(want[0])) != 0, k == 0);
		T_EQ(want[0][0] == 4, k == 1);
		T_EQ(th_sh(&d, err, sizeof(err), "%s check",
		           th_bin("kvtrimctl")), 0);
		kvt_disconnect(c);
	}
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(reload, relative_model_path_is_the_engines)
{
	struct th_daemon d;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX], path[512], want[600], here[512];
	snprintf(path, sizeof(path), "%s/w", th_tmpdir());
	T_EQ(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/w/kvzap.safetensors", th_tmpdir());
	write_kvzap(path, 0.0f);
	th_daemon_start(&d, "16M", NULL); /* in the test's directory */
	T_ASSERT(getcwd(here, sizeof(here)));
	T_EQ(chdir(th_tmpdir()), 0);
	struct kvt_config cfg = th_small_cfg(&d, "relative",
	        "kvzap:threshold=-4,model=w/kvzap.safetensors,window=4");
	cfg.stage_tokens = 8;
	T_OK(kvt_connect(&cfg, &c, err));
	snprintf(want, sizeof(want), "kvzap:threshold=-4,model=%s/w/"
	         "kvzap.safetensors,window=4", th_tmpdir());
	T_EQ_STR(kvt_config_of(c)->policy, want);
	kvt_disconnect(c);
	/* Too long once absolute: refused before the daemon is asked. */
	char spec[KVT_SPEC_MAX];
	memset(spec, 'a', sizeof(spec));
	memcpy(spec, "kvzap:model=", 12);
	spec[sizeof(spec) - 1 - (strlen(th_tmpdir()) / 2)] = '\0';
	cfg.policy = spec;
	T_ERR(kvt_connect(&cfg, &c, err), KVT_EPOLICY);
	T_ASSERT(strstr(err, "longer than 255"));
	T_EQ(chdir(here), 0);
	T_EQ(th_daemon_stop(&d), 0);
}
