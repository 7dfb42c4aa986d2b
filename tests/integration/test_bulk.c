/*
 * test_bulk.c — kvt_write_kv and kvt_stage through the real daemon, on
 * whatever backend the suite runs: the rows land where kvt_kv_ptr and
 * kvt_stage_* say (read back with kvt_memcpy), in both layouts an engine
 * hands over, and every refusal writes nothing.  Expected values are the
 * source elements themselves, placed by hand arithmetic.
 */
#include <math.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "rndweights.h"
#include "test.h"

/* geometry of th_small_cfg: 2 layers, 4 heads, 2 KV heads, head_dim 8,
 * d_model 32, pages of 4, headroom 4 */
#define HD 8
#define KV 2

/* Reads K and V of entry len + k of (layer, head) to the host. */
static void read_row(kvt_client *c, kvt_seq s, uint32_t l, uint32_t h,
                     uint32_t k, float *kr, float *vr)
{
	void *kp, *vp;
	T_OK(kvt_kv_ptr(c, s, l, h, k, &kp, &vp));
	T_OK(kvt_memcpy(c, kr, kp, HD * sizeof(float)));
	T_OK(kvt_memcpy(c, vr, vp, HD * sizeof(float)));
}

/* Host memory, or a device buffer holding a copy of it (cuda tenants
 * take either; the device one is what a GPU engine hands over). */
static const void *src_copy(kvt_client *c, const void *host, size_t bytes,
                            void **buf)
{
	*buf = NULL;
	if (kvt_memory_kind(c) == KVT_MEMORY_HOST)
		return host;
	T_OK(kvt_buffer_alloc(c, bytes, buf));
	T_OK(kvt_memcpy(c, *buf, host, bytes));
	return *buf;
}

TEST(bulk, write_kv_both_layouts_land_where_kv_ptr_points)
{
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "bulk", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	/* transformers' layout [KV][n][HD]: element (t, h, i) at
	 * h * n * HD + t * HD + i, value 1000 h + 10 t + i (+0.5 for V) */
	enum { N = 3 };
	float K[KV][N][HD], V[KV][N][HD];
	for (int h = 0; h < KV; h++)
		for (int t = 0; t < N; t++)
			for (int i = 0; i < HD; i++) {
				K[h][t][i] = (float)(1000 * h + 10 * t + i);
				V[h][t][i] = K[h][t][i] + 0.5f;
			}
	void *bk, *bv;
	const void *sk = src_copy(c, K, sizeof(K), &bk);
	const void *sv = src_copy(c, V, sizeof(V), &bv);
	for (uint32_t l = 0; l < 2; l++)
		T_OK(kvt_write_kv(c, s, l, 1, N, sk, sv, HD, N * HD));
	float kr[HD], vr[HD];
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < KV; h++)
			for (uint32_t t = 0; t < N; t++) {
				read_row(c, s, l, h, 1 + t, kr, vr);
				for (int i = 0; i < HD; i++) {
					T_ASSERT(kr[i] == K[h][t][i]);
					T_ASSERT(vr[i] == V[h][t][i]);
				}
			}
	/* the token-major layout [n][KV][HD] at k0 0: the same values */
	float K2[N][KV][HD], V2[N][KV][HD];
	for (int t = 0; t < N; t++)
		for (int h = 0; h < KV; h++)
			for (int i = 0; i < HD; i++) {
				K2[t][h][i] = -K[h][t][i];
				V2[t][h][i] = -V[h][t][i];
			}
	void *bk2, *bv2;
	const void *sk2 = src_copy(c, K2, sizeof(K2), &bk2);
	const void *sv2 = src_copy(c, V2, sizeof(V2), &bv2);
	T_OK(kvt_write_kv(c, s, 0, 0, 1, sk2, sv2, KV * HD, HD));
	read_row(c, s, 0, 1, 0, kr, vr);
	T_ASSERT(kr[3] == -1003.0f && vr[3] == -1003.5f);
	/* and the four committed entries are those written */
	struct kvt_sync_item it = {s, 4, KVT_PHASE_PREFILL, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
	struct kvt_list li;
	T_OK(kvt_list_get(c, s, 1, 1, &li));
	T_EQ(li.len, 4);
	float pg[2 * 4 * HD];
	T_OK(kvt_memcpy(c, pg, kvt_page_ptr(c, li.pages[0]), sizeof(pg)));
	T_ASSERT(pg[2 * HD + 5] == 1015.0f);            /* K, entry 2: t 1 */
	T_ASSERT(pg[4 * HD + 3 * HD + 5] == 1025.5f);   /* V, entry 3: t 2 */
	/* kvt_buffer_free(c, NULL) does nothing: host tenants have none */
	T_OK(kvt_buffer_free(c, bk));
	T_OK(kvt_buffer_free(c, bv));
	T_OK(kvt_buffer_free(c, bk2));
	T_OK(kvt_buffer_free(c, bv2));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(bulk, write_kv_refusals_write_nothing)
{
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "bulkbad", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	float K[4 * KV * HD], zero[HD] = {0}, kr[HD], vr[HD];
	for (int i = 0; i < 4 * KV * HD; i++)
		K[i] = 7.0f;
	void *bk;
	const void *sk = src_copy(c, K, sizeof(K), &bk);
	/* headroom 4: entries 2 .. 5 do not fit */
	T_ERR(kvt_write_kv(c, s, 0, 2, 4, sk, sk, HD, 4 * HD), KVT_EHEADROOM);
	T_ASSERT(strstr(kvt_last_error(c), "headroom"));
	T_ERR(kvt_write_kv(c, s, 2, 0, 1, sk, sk, HD, HD), KVT_EINVAL);
	T_ERR(kvt_write_kv(c, s, 0, 0, 2, NULL, sk, HD, 2 * HD), KVT_EINVAL);
	/* strides that would make rows overlap */
	T_ERR(kvt_write_kv(c, s, 0, 0, 2, sk, sk, 4, 4), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "overlap"));
	T_ERR(kvt_write_kv(c, s + 1, 0, 0, 1, sk, sk, HD, HD), KVT_ENOSEQ);
	for (uint32_t h = 0; h < KV; h++)
		for (uint32_t k = 0; k < 4; k++) {
			read_row(c, s, 0, h, k, kr, vr);
			T_ASSERT(!memcmp(kr, zero, sizeof(kr)));
			T_ASSERT(!memcmp(vr, zero, sizeof(vr)));
		}
	T_OK(kvt_write_kv(c, s, 0, 0, 0, NULL, NULL, 0, 0)); /* n 0 */
	if (bk)
		T_OK(kvt_buffer_free(c, bk));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(bulk, stage_fills_the_rows_the_policy_reads)
{
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	/* h2o reads q and lse; x has no room in its staging rows */
	struct kvt_config cfg = th_small_cfg(&d, "bulkstage", "h2o:tokens=8");
	cfg.stage_tokens = 4;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	enum { N = 3, H = 4 };
	float q[N][H][HD], lse[N][H], x[N][32];
	for (int t = 0; t < N; t++) {
		for (int h = 0; h < H; h++) {
			lse[t][h] = (float)(t * 10 + h);
			for (int i = 0; i < HD; i++)
				q[t][h][i] = (float)(100 * t + 10 * h + i);
		}
		for (int i = 0; i < 32; i++)
			x[t][i] = 1.0f;
	}
	void *bq, *bl;
	const void *sq = src_copy(c, q, sizeof(q), &bq);
	const void *sl = src_copy(c, lse, sizeof(lse), &bl);
	/* lse is read: NULL refused, and nothing staged */
	T_ERR(kvt_stage(c, s, 1, 0, N, NULL, sq, NULL), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "lse"));
	T_ERR(kvt_stage(c, s, 1, 0, 5, NULL, sq, sl), KVT_EINVAL); /* > ring */
	T_ERR(kvt_stage(c, s, 2, 0, 1, NULL, sq, sl), KVT_EINVAL);
	/* x is not read: NULL is fine, and a given x is ignored */
	T_OK(kvt_stage(c, s, 1, 0, N, NULL, sq, sl));
	T_OK(kvt_stage(c, s, 0, 0, N, x[0], sq, sl));
	float got[H * HD], gl[H];
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t t = 0; t < N; t++) {
			T_OK(kvt_memcpy(c, got, kvt_stage_q(c, s, l, t),
			                sizeof(got)));
			T_OK(kvt_memcpy(c, gl, kvt_stage_lse(c, s, l, t),
			                sizeof(gl)));
			T_ASSERT(!memcmp(got, q[t], sizeof(got)));
			T_ASSERT(!memcmp(gl, lse[t], sizeof(gl)));
		}
	T_ASSERT(kvt_stage_x(c, s, 0, 0) == NULL);
	if (bq) {
		T_OK(kvt_buffer_free(c, bq));
		T_OK(kvt_buffer_free(c, bl));
	}
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(bulk, reserve_grows_the_headroom_now)
{
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "bulkroom", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s;
	void *kp, *vp;
	T_OK(kvt_seq_open(c, &s));
	/* headroom 1 for decoding, taken at a sync */
	T_OK(kvt_seq_headroom(c, s, 1));
	struct kvt_sync_item it = {s, 0, KVT_PHASE_PREFILL, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
	T_ERR(kvt_kv_ptr(c, s, 0, 0, 1, &kp, &vp), KVT_EHEADROOM);
	struct kvt_seq_info qi;
	T_OK(kvt_seq_query(c, s, &qi));
	uint32_t syncs = qi.syncs;
	/* a 3-token chunk comes: room now, by one empty sync */
	T_OK(kvt_seq_reserve(c, s, 3));
	T_OK(kvt_kv_ptr(c, s, 1, 1, 2, &kp, &vp));
	T_ERR(kvt_kv_ptr(c, s, 1, 1, 3, &kp, &vp), KVT_EHEADROOM);
	T_OK(kvt_seq_query(c, s, &qi));
	T_EQ(qi.syncs, syncs + 1);
	T_EQ(qi.seen_max, 0);
	/* already there: no sync at all */
	T_OK(kvt_seq_reserve(c, s, 2));
	T_OK(kvt_seq_query(c, s, &qi));
	T_EQ(qi.syncs, syncs + 1);
	/* refusals: beyond the registration, an unknown sequence (with its
	 * reason, where kvt_seq_headroom once left it empty) */
	T_ERR(kvt_seq_reserve(c, s, 5), KVT_EHEADROOM);
	T_ERR(kvt_seq_reserve(c, s + 1, 2), KVT_ENOSEQ);
	T_ASSERT(kvt_last_error(c)[0]);
	T_ERR(kvt_seq_headroom(c, s + 1, 2), KVT_ENOSEQ);
	T_ASSERT(strstr(kvt_last_error(c), "no open sequence"));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* The committed entries of list (l, h) of s, K and V rows [len][HD]
 * each, read through the pages (K half, then V half, of each page of
 * 4 entries); returns len. */
static uint32_t read_list(kvt_client *c, kvt_seq s, uint32_t l, uint32_t h,
                          float K[][HD], float V[][HD])
{
	struct kvt_list li;
	T_OK(kvt_list_get(c, s, l, h, &li));
	float pg[2 * 4 * HD];
	for (uint32_t e = 0; e < li.len; e++) {
		if (e % 4 == 0)
			T_OK(kvt_memcpy(c, pg, kvt_page_ptr(c, li.pages[e / 4]),
			                sizeof(pg)));
		memcpy(K[e], pg + (e % 4) * HD, sizeof(K[e]));
		memcpy(V[e], pg + 4 * HD + (e % 4) * HD, sizeof(V[e]));
	}
	return li.len;
}

/* Writes 4 new tokens at positions p .. p + 3 into every list of s
 * (value 1000 h + 100 l + position, + i / 8 per element; V + 0.5) and
 * syncs them. */
static void append4(kvt_client *c, kvt_seq s, uint32_t p)
{
	float K[KV][4][HD], V[KV][4][HD];
	for (uint32_t l = 0; l < 2; l++) {
		for (int h = 0; h < KV; h++)
			for (int t = 0; t < 4; t++)
				for (int i = 0; i < HD; i++) {
					K[h][t][i] = (float)(1000 * h + 100 * l +
					                     p + t) + i / 8.0f;
					V[h][t][i] = K[h][t][i] + 0.5f;
				}
		void *bk, *bv;
		const void *sk = src_copy(c, K, sizeof(K), &bk);
		const void *sv = src_copy(c, V, sizeof(V), &bv);
		T_OK(kvt_write_kv(c, s, l, 0, 4, sk, sv, HD, 4 * HD));
		T_OK(kvt_buffer_free(c, bk));
		T_OK(kvt_buffer_free(c, bv));
	}
	struct kvt_sync_item it = {s, 4, p ? KVT_PHASE_DECODE
	                                   : KVT_PHASE_PREFILL, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
}

/* 1 when every list of a and b holds the same entries, bit for bit. */
static int same_lists(kvt_client *c, kvt_seq a, kvt_seq b)
{
	float Ka[64][HD], Va[64][HD], Kb[64][HD], Vb[64][HD];
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < KV; h++) {
			uint32_t na = read_list(c, a, l, h, Ka, Va);
			uint32_t nb = read_list(c, b, l, h, Kb, Vb);
			if (na != nb || memcmp(Ka, Kb, na * sizeof(Ka[0])) ||
			    memcmp(Va, Vb, na * sizeof(Va[0])))
				return 0;
		}
	return 1;
}

/*
 * kvt_seq_fork: the copy holds the source's entries bit for bit, its
 * tokens seen and its lengths, with a counter of 0; the same sync on both
 * leaves them equal again (streaming decides by position, so positions
 * came along); a sync of one leaves the other as it was; closing the copy
 * gives its pages back.  Refusals (an unknown or closed source, a NULL
 * out, no free slot) change nothing.
 */
TEST(bulk, fork_copies_a_sequence_that_then_goes_its_own_way)
{
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "fork",
	                                     "streaming:tokens=6,sinks=2");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq a, b;
	T_OK(kvt_seq_open(c, &a));
	for (uint32_t p = 0; p < 12; p += 4)
		append4(c, a, p);
	struct kvt_tenant_stats before, st;
	T_OK(kvt_stats(c, &before));
	T_OK(kvt_seq_fork(c, a, &b));
	T_ASSERT(b != a);
	T_ASSERT(same_lists(c, a, b));
	float K[64][HD], V[64][HD];
	T_EQ(read_list(c, b, 1, 1, K, V), 6);
	/* sinks 0, 1 and the recent 8 .. 11 of layer 1, KV head 1 */
	T_ASSERT(K[1][0] == 1101.0f && K[2][0] == 1108.0f && K[5][7] ==
	         1111.0f + 7 / 8.0f && V[5][7] == K[5][7] + 0.5f);
	struct kvt_seq_info info;
	T_OK(kvt_seq_query(c, b, &info));
	T_EQ(info.syncs, 0);
	T_EQ(info.seen_min, 12);
	T_EQ(info.seen_max, 12);
	T_EQ(info.len_min, 6);
	T_EQ(info.len_max, 6);
	T_OK(kvt_stats(c, &st));
	T_ASSERT(st.pages_used > before.pages_used);

	append4(c, a, 12);
	append4(c, b, 12);
	T_ASSERT(same_lists(c, a, b));
	append4(c, a, 16);
	T_ASSERT(!same_lists(c, a, b));
	T_EQ(read_list(c, b, 0, 0, K, V), 6);
	T_ASSERT(K[5][0] == 15.0f); /* b's newest is still position 15 */
	T_EQ(read_list(c, a, 0, 0, K, V), 6);
	T_ASSERT(K[5][0] == 19.0f);

	/* Refusals: nothing opened, nothing allocated. */
	T_OK(kvt_stats(c, &before));
	kvt_seq x;
	T_ERR(kvt_seq_fork(c, a, NULL), KVT_EINVAL);
	T_ERR(kvt_seq_fork(c, 0x1234, &x), KVT_ENOSEQ);
	T_ASSERT(strstr(kvt_last_error(c), "kvt_seq_fork"));
	kvt_seq y, z;
	T_OK(kvt_seq_open(c, &y));
	T_OK(kvt_seq_close(c, y));
	T_ERR(kvt_seq_fork(c, y, &x), KVT_ENOSEQ);
	T_OK(kvt_seq_fork(c, b, &y)); /* 3 of 4 slots */
	T_OK(kvt_seq_fork(c, y, &z)); /* 4 of 4 */
	T_OK(kvt_stats(c, &st));
	T_ERR(kvt_seq_fork(c, a, &x), KVT_ESEQLIMIT);
	struct kvt_tenant_stats st2;
	T_OK(kvt_stats(c, &st2));
	T_EQ_U64(st2.pages_used, st.pages_used);
	T_OK(kvt_seq_close(c, z));
	T_OK(kvt_seq_close(c, y));
	T_OK(kvt_stats(c, &st));
	T_EQ_U64(st.pages_used, before.pages_used);
	T_OK(kvt_seq_close(c, b));
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* A small pseudo-random value in [-1, 1) of (a, b, c): the same inputs
 * for every sequence given the same positions. */
static float mix(uint32_t a, uint32_t b, uint32_t c)
{
	uint32_t h = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u ^
	             c * 2246822519u;
	h ^= h >> 15;
	h *= 2246822519u;
	h ^= h >> 13;
	return (float)(h & 0xffff) / 32768.0f - 1.0f;
}

/* n tokens at positions p .. p + n - 1 into every list of s, K, V and
 * the staged x, q, lse all functions of (layer, head, position), and a
 * sync of them: the attention a policy computes differs per entry. */
static void append_attn(kvt_client *c, kvt_seq s, uint32_t p, uint32_t n)
{
	float K[KV][4][HD], V[KV][4][HD], qv[4 * HD];
	for (uint32_t l = 0; l < 2; l++) {
		for (uint32_t h = 0; h < KV; h++)
			for (uint32_t t = 0; t < n; t++)
				for (uint32_t i = 0; i < HD; i++) {
					K[h][t][i] = mix(l, h * 64 + p + t, i);
					V[h][t][i] = mix(l + 7, h * 64 + p + t,
					                 i);
				}
		void *bk, *bv;
		const void *sk = src_copy(c, K, sizeof(K), &bk);
		const void *sv = src_copy(c, V, sizeof(V), &bv);
		T_OK(kvt_write_kv(c, s, l, 0, n, sk, sv, HD, 4 * HD));
		T_OK(kvt_buffer_free(c, bk));
		T_OK(kvt_buffer_free(c, bv));
		for (uint32_t t = 0; t < n; t++) {
			for (uint32_t i = 0; i < 4 * HD; i++)
				qv[i] = 2.0f * mix(l + 13, p + t, i);
			th_stage_row(c, s, l, p + t, qv);
		}
	}
	struct kvt_sync_item it = {s, n, p ? KVT_PHASE_DECODE
	                                   : KVT_PHASE_PREFILL, 0, 0};
	T_OK(kvt_sync(c, &it, 1));
}

/*
 * kvt_seq_fork of a sequence whose policy keeps per-entry state (H2O's
 * accumulated attention, TOVA's positions, KVpop's delayed attention,
 * scores and u rings: on the device on the cuda backend, on the host
 * otherwise): the copy decides as the source does, sync after sync, so
 * its state came along (a copy without it decides from zeroed scores, or
 * finds its device counts wrong and refuses the sync).  Then a sync of
 * the source alone leaves the copy as it was.
 */
TEST(bulk, fork_carries_the_policy_state_of_attention_policies)
{
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	char path[600], spec[KVT_SPEC_MAX], err[KVT_ERRTEXT_MAX];
	snprintf(path, sizeof(path), "%s/kvpop-fork.safetensors",
	         th_tmpdir());
	const char *specs[] = {
		"h2o:tokens=10", "h2o:tokens=10,agg=max,sinks=1",
		"tova:tokens=10,window=2",
		"kvpop:model=%s,tokens=10,delay=3,sinks=1",
	};
	for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
		struct kvt_config cfg = th_small_cfg(&d, "fork-attn", NULL);
		cfg.stage_tokens = 4;
		if (strstr(specs[k], "%s")) {
			const struct th_wshape sh = {16, 4, 4, 4, 8};
			T_OK(th_random_weights("kvpop", &cfg.geo, &sh, 3,
			                       path, err, sizeof(err)));
		}
		snprintf(spec, sizeof(spec), specs[k], path);
		cfg.policy = spec;
		kvt_client *c;
		T_OK(kvt_connect(&cfg, &c, err));
		kvt_seq a, b;
		T_OK(kvt_seq_open(c, &a));
		uint32_t p = 0;
		for (; p < 16; p += 4)
			append_attn(c, a, p, 4);
		append_attn(c, a, p++, 1);
		T_OK(kvt_seq_fork(c, a, &b));
		if (!same_lists(c, a, b))
			th_fail(__FILE__, __LINE__, "%s: the copy differs at once", spec);
		for (int step = 0; step < 12; step++, p++) {
			append_attn(c, a, p, 1);
			append_attn(c, b, p, 1);
			if (!same_lists(c, a, b))
				th_fail(__FILE__, __LINE__, "%s: the copy decided apart at "
				        "position %u", spec, p);
		}
		float K[64][HD], V[64][HD];
		T_EQ(read_list(c, a, 1, 1, K, V), 10);
		append_attn(c, a, p, 1);
		T_ASSERT(!same_lists(c, a, b));
		T_OK(kvt_seq_close(c, b));
		T_OK(kvt_seq_close(c, a));
		kvt_disconnect(c);
	}
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_daemon_stop(&d), 0);
}
