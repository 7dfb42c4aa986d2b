/*
 * tenant_sync_test.c — tenant syncs: lists growing, streaming keeping the
 * expected bytes, refusals that change nothing, quota and pool limits,
 * revocation and event flushing.
 *
 * The simulated client (struct sim) and its checks are tenant_fixture.h's.
 */
#include "tenant_fixture.h"
TEST(tenant, sync_full_grows_lists)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t sq;
	T_OK(tenant_seq_open(s.t, &sq));
	flush(&s);
	uint32_t ctr = 0, seen[2] = {0, 0}, want[16];

	STEP(&s, sq, &ctr, 0, 0, 4, seen);
	iota(want, 4, 0);
	VERIFY_ALL(&s, sq, want, 4); /* ceil(8/4) = 2 pages */
	T_EQ(lst(&s, sq, 0, 0)->n_pages, 2);

	STEP(&s, sq, &ctr, 0, 0, 4, seen);
	iota(want, 8, 0);
	VERIFY_ALL(&s, sq, want, 8);
	T_EQ(lst(&s, sq, 1, 1)->n_pages, 3);

	STEP(&s, sq, &ctr, 0, 0, 3, seen);
	iota(want, 11, 0);
	VERIFY_ALL(&s, sq, want, 11);
	T_EQ(lst(&s, sq, 0, 1)->n_pages, 4); /* ceil(15/4) */

	/* prefill-style: only layer 1 */
	STEP(&s, sq, &ctr, 1, 2, 2, seen);
	iota(want, 13, 0);
	VERIFY(&s, sq, 1, 0, want, 13);
	VERIFY(&s, sq, 1, 1, want, 13);
	T_EQ(lst(&s, sq, 1, 0)->n_pages, 5); /* ceil(17/4) */
	VERIFY(&s, sq, 0, 0, want, 11);
	VERIFY(&s, sq, 0, 1, want, 11);

	/* nothing new: still a sync, still an epoch */
	STEP(&s, sq, &ctr, 0, 0, 0, seen);
	T_EQ_U64(lst(&s, sq, 0, 0)->epoch, 5); /* open + 4 syncs */
	T_EQ_U64(lst(&s, sq, 1, 1)->epoch, 6); /* open + 5 syncs */
	VERIFY(&s, sq, 1, 1, want, 13);

	struct kvt_tenant_stats st;
	tenant_stats(s.t, &st);
	T_EQ_U64(st.syncs, 5);
	T_EQ_U64(st.entries_appended, 4 * (4 + 4 + 3) + 2 * 2);
	T_EQ_U64(st.entries_evicted, 0);
	T_EQ_U64(st.entries_kept, 2 * 11 + 2 * 13);
	T_EQ_U64(st.pages_used, 2 * 4 + 2 * 5);
	T_EQ(s.adds, 1);
	sim_free(&s);
}

/* Streaming sinks=2,tokens=6 after n tokens: 0..n-1, or {0,1} + last 4. */
static uint32_t stream_2_6(uint32_t n, uint32_t *want)
{
	if (n <= 6) {
		iota(want, n, 0);
		return n;
	}
	want[0] = 0;
	want[1] = 1;
	iota(want + 2, 4, n - 4);
	return 6;
}

TEST(tenant, sync_streaming_keeps_expected_bytes)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("streaming:sinks=2,tokens=6");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t a, b;
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_open(s.t, &b));
	flush(&s);
	uint32_t ca = 0, cb = 0, sa[2] = {0, 0}, sb[2] = {0, 0}, want[8];
	char err[KVT_ERRTEXT_MAX];

	/* a: one token per sync; b: two per sync, in the same message */
	for (uint32_t i = 1; i <= 20; i++) {
		append(&s, a, 0, 2, 1, sa);
		append(&s, b, 0, 2, 2, sb);
		struct ipc_sync_item its[2] = {item(a, ca, 1, 0, 0),
		                               item(b, cb, 2, 0, 0)};
		if (tenant_sync(s.t, 0, its, 2, err, sizeof(err)))
			th_fail(__FILE__, __LINE__, "sync %u: %s", i, err);
		ca++, cb++;
		sa[0] = sa[1] = i;
		sb[0] = sb[1] = 2 * i;
		flush(&s);
		CLEAN(&s);
		uint32_t n = stream_2_6(i, want);
		VERIFY_ALL(&s, a, want, n);
		n = stream_2_6(2 * i, want);
		VERIFY_ALL(&s, b, want, n);
	}
	const uint32_t a20[6] = {0, 1, 16, 17, 18, 19};
	VERIFY_ALL(&s, a, a20, 6);
	const uint32_t b40[6] = {0, 1, 36, 37, 38, 39};
	VERIFY_ALL(&s, b, b40, 6);
	T_EQ(lst(&s, a, 0, 0)->n_pages, 3); /* ceil((6 + 4) / 4) */

	/* four tokens at a time */
	STEP(&s, a, &ca, 0, 0, 4, sa);
	const uint32_t a24[6] = {0, 1, 20, 21, 22, 23};
	VERIFY_ALL(&s, a, a24, 6);

	struct kvt_tenant_stats st;
	tenant_stats(s.t, &st);
	T_EQ_U64(st.syncs, 21);
	T_EQ_U64(st.entries_appended, 4 * 24 + 4 * 40);
	T_EQ_U64(st.entries_kept, 4 * 6 + 4 * 6);
	T_EQ_U64(st.entries_evicted, 4 * (24 - 6) + 4 * (40 - 6));
	T_EQ_U64(st.pages_used, 8 * 3);
	sim_free(&s);
}

TEST(tenant, sync_streaming_drops_new_entries)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("streaming:sinks=1,tokens=2");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t sq;
	T_OK(tenant_seq_open(s.t, &sq));
	flush(&s);
	uint32_t ctr = 0, seen[2] = {0, 0};
	STEP(&s, sq, &ctr, 0, 0, 4, seen);
	const uint32_t w4[2] = {0, 3};
	VERIFY_ALL(&s, sq, w4, 2);
	STEP(&s, sq, &ctr, 0, 0, 4, seen);
	const uint32_t w8[2] = {0, 7};
	VERIFY_ALL(&s, sq, w8, 2);
	struct kvt_tenant_stats st;
	tenant_stats(s.t, &st);
	T_EQ_U64(st.entries_appended, 32);
	T_EQ_U64(st.entries_evicted, 24);
	T_EQ_U64(st.entries_kept, 8);
	sim_free(&s);
}

TEST(tenant, sync_streaming_big_pages)
{
	/* 64-entry pages of 4 KiB rows, 4 pages per chunk: entries move
	 * between pages that live in different chunks. */
	struct pool pool;
	T_OK(pool_init(&pool, 16 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_b("streaming:sinks=3,tokens=70", 16);
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t sq;
	T_OK(tenant_seq_open(s.t, &sq));
	flush(&s);
	uint32_t ctr = 0, seen[2] = {0, 0}, want[80];

	STEP(&s, sq, &ctr, 0, 0, 64, seen);
	iota(want, 64, 0);
	VERIFY_ALL(&s, sq, want, 64); /* 2 pages */

	STEP(&s, sq, &ctr, 0, 0, 64, seen);
	/* B 70, S' 3, recent 67: 0,1,2 and 61..127 */
	iota(want, 3, 0);
	iota(want + 3, 67, 61);
	VERIFY_ALL(&s, sq, want, 70); /* ceil(134/64) = 3 pages */

	STEP(&s, sq, &ctr, 0, 0, 64, seen);
	iota(want + 3, 67, 125);
	VERIFY_ALL(&s, sq, want, 70);

	struct kvt_tenant_stats st;
	tenant_stats(s.t, &st);
	T_EQ_U64(st.pages_used, 12);
	T_EQ_U64(st.chunks, 3);
	T_EQ_U64(st.pages_free, 0);
	sim_free(&s);
}

TEST(tenant, sync_refusals_change_nothing)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("streaming:sinks=2,tokens=6");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t s1, s2, s3;
	T_OK(tenant_seq_open(s.t, &s1));
	T_OK(tenant_seq_open(s.t, &s2));
	T_OK(tenant_seq_open(s.t, &s3));
	T_OK(tenant_seq_close(s.t, s3));
	flush(&s);
	uint32_t c1 = 0, c2 = 0, n1[2] = {0, 0}, n2[2] = {0, 0};
	STEP(&s, s1, &c1, 0, 0, 4, n1);
	STEP(&s, s1, &c1, 0, 0, 4, n1);
	STEP(&s, s1, &c1, 0, 0, 1, n1);
	STEP(&s, s2, &c2, 0, 0, 2, n2);
	T_EQ(c1, 3);

	struct snap sn;
	snap_take(&s, &sn);
	struct ipc_sync_item it[3];

	/* unknown sequences */
	it[0] = item(s3, 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_ENOSEQ); /* closed */
	it[0] = item(seqid_make(1, 1, 99), 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_ENOSEQ); /* slot beyond max_seqs */
	it[0] = item(0, 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_ENOSEQ); /* garbage */
	it[0] = item(~0ull, 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_ENOSEQ);
	it[0] = item(seqid_make(1, 5, seqid_slot(s1)), c1, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_ENOSEQ); /* open slot, wrong generation */
	it[0] = item(s1, c1, 1, 0, 0);
	it[1] = item(0, 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 2, KVT_ENOSEQ); /* the good first item too */

	/* duplicates */
	it[0] = item(s1, c1, 1, 0, 0);
	it[1] = item(s1, c1, 1, 0, 0);
	REFUSE(&s, &sn, it, 2, KVT_EINVAL);
	it[1] = item(s2, c2, 1, 0, 0);
	it[2] = item(s1, c1, 1, 0, 0);
	REFUSE(&s, &sn, it, 3, KVT_EINVAL);
	it[0] = item(s1, c1, 1, 0, 1); /* same sequence, other layers */
	it[1] = item(s1, c1 + 1, 1, 1, 2);
	REFUSE(&s, &sn, it, 2, KVT_EINVAL);

	/* counters */
	it[0] = item(s1, c1 + 1, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_ESTALE);
	it[0] = item(s1, c1 - 1, 1, 0, 0); /* a replay */
	REFUSE(&s, &sn, it, 1, KVT_ESTALE);
	it[0] = item(s2, c2, 1, 0, 0);
	it[1] = item(s1, 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 2, KVT_ESTALE);

	/* layer ranges (n_layers 2) */
	it[0] = item(s1, c1, 1, 1, 1);
	REFUSE(&s, &sn, it, 1, KVT_ELAYERS);
	it[0] = item(s1, c1, 1, 0, 3);
	REFUSE(&s, &sn, it, 1, KVT_ELAYERS);
	it[0] = item(s1, c1, 1, 2, 0); /* hi 0 = 2 */
	REFUSE(&s, &sn, it, 1, KVT_ELAYERS);
	it[0] = item(s1, c1, 1, 1, 0xffffffffu);
	REFUSE(&s, &sn, it, 1, KVT_ELAYERS);
	it[0] = item(s1, c1, 1, 2, 1);
	REFUSE(&s, &sn, it, 1, KVT_ELAYERS);
	it[0] = item(s2, c2, 1, 0, 0);
	it[1] = item(s1, c1, 1, 0, 5);
	REFUSE(&s, &sn, it, 2, KVT_ELAYERS);

	/* headroom 4 */
	it[0] = item(s1, c1, 5, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_EHEADROOM);
	it[0] = item(s2, c2, 4, 0, 0);
	it[1] = item(s1, c1, 0xffffffffu, 0, 0);
	REFUSE(&s, &sn, it, 2, KVT_EHEADROOM);

	/* phase, empty batch */
	it[0] = item(s1, c1, 1, 0, 0);
	it[0].phase = 2;
	REFUSE(&s, &sn, it, 1, KVT_EINVAL);
	REFUSE(&s, &sn, it, 0, KVT_EINVAL);
	REFUSE(&s, &sn, NULL, 1, KVT_EINVAL);

	/* and the tenant still works where it left off */
	it[0] = item(s1, c1, 1, 0, 0);
	it[1] = item(s2, c2, 1, 0, 0);
	append(&s, s1, 0, 2, 1, n1);
	append(&s, s2, 0, 2, 1, n2);
	T_OK(tenant_sync(s.t, 0, it, 2, NULL, 0));
	CLEAN(&s);
	const uint32_t w1[6] = {0, 1, 6, 7, 8, 9};
	VERIFY_ALL(&s, s1, w1, 6);
	const uint32_t w2[3] = {0, 1, 2};
	VERIFY_ALL(&s, s2, w2, 3);
	free(sn.table);
	sim_free(&s);
}

TEST(tenant, sync_too_long)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	h.max_tokens = 8;
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t s1, s2;
	T_OK(tenant_seq_open(s.t, &s1));
	T_OK(tenant_seq_open(s.t, &s2));
	flush(&s);
	uint32_t c1 = 0, c2 = 0, n1[2] = {0, 0}, want[8];
	STEP(&s, s1, &c1, 0, 0, 4, n1);
	STEP(&s, s1, &c1, 0, 0, 4, n1);
	iota(want, 8, 0);
	VERIFY_ALL(&s, s1, want, 8); /* ceil(12/4) = 3 pages */

	struct snap sn;
	snap_take(&s, &sn);
	struct ipc_sync_item it[2];
	it[0] = item(s1, c1, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_ETOOLONG);
	it[0] = item(s1, c1, 1, 1, 2);
	REFUSE(&s, &sn, it, 1, KVT_ETOOLONG);
	it[0] = item(s2, c2, 4, 0, 0);
	it[1] = item(s1, c1, 1, 0, 0);
	REFUSE(&s, &sn, it, 2, KVT_ETOOLONG);
	free(sn.table);

	it[0] = item(s1, c1, 0, 0, 0); /* a full list may still sync */
	T_OK(tenant_sync(s.t, 0, it, 1, NULL, 0));
	CLEAN(&s);
	sim_free(&s);
}

TEST(tenant, quota_refusals)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_b("full", 1);
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t s1, x;
	T_OK(tenant_seq_open(s.t, &s1)); /* 4 lists x 1 page = the chunk */
	flush(&s);
	struct kvt_tenant_stats st;
	tenant_stats(s.t, &st);
	T_EQ_U64(st.chunks, 1);
	T_EQ_U64(st.pages_free, 0);

	struct snap sn;
	snap_take(&s, &sn);
	T_ERR(tenant_seq_open(s.t, &x), KVT_EQUOTA);
	SAME(&s, &sn);
	/* one entry needs a second page per list: 4 pages, a new chunk */
	struct ipc_sync_item it[2];
	it[0] = item(s1, 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 1, KVT_EQUOTA);
	it[0] = item(s1, 0, 0, 0, 0);
	T_OK(tenant_sync(s.t, 0, it, 1, NULL, 0));
	CLEAN(&s);
	free(sn.table);
	sim_free(&s);

	/* all items together need more than the quota allows */
	h = hello_b("full", 3);
	sim_new(&s, &pool, &h, 0);
	uint64_t a, b;
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_open(s.t, &b));
	flush(&s);
	T_EQ(s.adds, 2);
	snap_take(&s, &sn);
	it[0] = item(a, 0, 1, 0, 0);
	it[1] = item(b, 0, 1, 0, 0);
	REFUSE(&s, &sn, it, 2, KVT_EQUOTA); /* 2 + 2 chunks > 3 */
	free(sn.table);
	uint32_t ca = 0, na[2] = {0, 0};
	STEP(&s, a, &ca, 0, 0, 1, na); /* 2 + 1 chunks */
	T_EQ(s.adds, 3);
	T_EQ(s.log_slot[2], 2);
	tenant_stats(s.t, &st);
	T_EQ_U64(st.chunks, 3);
	T_EQ_U64(st.pages_used, 12);
	const uint32_t w[1] = {0};
	VERIFY_ALL(&s, a, w, 1);
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}

TEST(tenant, pool_full_refusals)
{
	struct pool pool;
	T_OK(pool_init(&pool, 2 * KVT_CHUNK_BYTES));
	struct ipc_hello ha = hello_b("full", 2), hb = hello_b("full", 2);
	struct sim A, B;
	sim_new(&A, &pool, &ha, 0);
	sim_new(&B, &pool, &hb, 0);
	uint64_t a1, b1, x;
	T_OK(tenant_seq_open(A.t, &a1));
	T_OK(tenant_seq_open(B.t, &b1));
	flush(&A);
	flush(&B);
	T_EQ_U64(pool.chunks_used, 2);

	struct snap sn;
	snap_take(&A, &sn);
	T_ERR(tenant_seq_open(A.t, &x), KVT_EPOOLFULL);
	SAME(&A, &sn);
	struct ipc_sync_item it = item(a1, 0, 1, 0, 0);
	REFUSE(&A, &sn, &it, 1, KVT_EPOOLFULL);
	free(sn.table);

	T_OK(tenant_seq_close(B.t, b1));
	flush(&B);
	T_EQ_U64(pool.chunks_used, 1);
	T_OK(tenant_seq_open(A.t, &x));
	flush(&A);
	CLEAN(&A);
	CLEAN(&B);
	T_EQ(A.adds, 2);
	sim_free(&A);
	sim_free(&B);
	T_EQ_U64(pool.chunks_used, 0);
}

TEST(tenant, revoke_then_reuse_slot)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_b("full", 4);
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t q[3], q4;
	for (int i = 0; i < 3; i++)
		T_OK(tenant_seq_open(s.t, &q[i])); /* a chunk each */
	flush(&s);
	T_EQ(s.adds, 3);
	for (int i = 0; i < 3; i++)
		T_EQ(s.log_slot[i], (uint32_t)i);
	/* q[1] holds exactly the pages of chunk slot 1 (ids 4..7) */
	for (uint32_t layer = 0; layer < 2; layer++)
		for (uint32_t head = 0; head < 2; head++)
			T_EQ(lst(&s, q[1], layer, head)->pages[0] / 4, 1);

	T_OK(tenant_seq_close(s.t, q[1]));
	CLEAN(&s);
	T_OK(tenant_seq_open(s.t, &q4)); /* lowest free chunk slot: 1 */
	CLEAN(&s);
	T_EQ_U64(tenant_chunks(s.t), 4); /* 3 live + 1 awaiting its REVOKE */
	T_EQ_U64(pool.chunks_used, 4);
	int before = s.n_log;
	flush(&s);
	T_EQ(s.n_log, before + 2);
	T_EQ(s.log_type[before], HANDLE_CHUNK_REVOKE);
	T_EQ(s.log_slot[before], 1);
	T_EQ(s.log_type[before + 1], HANDLE_CHUNK_ADD);
	T_EQ(s.log_slot[before + 1], 1);
	T_EQ_U64(tenant_chunks(s.t), 3);
	T_EQ_U64(pool.chunks_used, 3);
	uint32_t got = 0;
	for (uint32_t layer = 0; layer < 2; layer++)
		for (uint32_t head = 0; head < 2; head++) {
			uint32_t id = lst(&s, q4, layer, head)->pages[0];
			T_EQ(id / 4, 1);
			got |= 1u << (id % 4);
		}
	T_EQ(got, 0xf);
	/* the new chunk is fresh memory */
	T_EQ(s.chunk[1][0], 0);
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}

TEST(tenant, flush_stops_at_send_error)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_b("full", 4);
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t a, b;
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_open(s.t, &b));
	s.fail_sends = 1;
	T_ERR(tenant_flush_events(s.t, sim_send, &s), KVT_ECONN);
	T_EQ(s.adds, 0);
	T_OK(tenant_seq_close(s.t, a));
	T_EQ_U64(pool.chunks_used, 2); /* a's chunk awaits its REVOKE */
	/* the server drops such a tenant: everything goes back */
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}
