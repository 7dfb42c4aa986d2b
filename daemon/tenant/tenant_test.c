/*
 * tenant_test.c — tenants: registration defaults and refusals, open and close
 * returning pages, sequence ids, queries, reconciliation and the sequence
 * limit.
 *
 * The simulated client (struct sim) and its checks are tenant_fixture.h's.
 */
#include "tenant_fixture.h"
TEST(tenant, new_applies_defaults)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h;
	memset(&h, 0, sizeof(h));
	strcpy(h.name, "engine-1");
	h.geo = (struct kvt_geometry){2, 4, 2, 8, 16};
	h.dtype = KVT_DTYPE_F16;
	struct tenant *t = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	T_OK(tenant_new(&pool, 7, &h, LIM(4 * KVT_CHUNK_BYTES), &t, err,
	                sizeof(err)));
	const struct shm_geom *g = tenant_geom(t);
	T_EQ(g->page_tokens, 16);
	T_EQ(g->max_seqs, 8);
	T_EQ(g->max_tokens, 4096);
	T_EQ(g->headroom, 16);
	T_EQ(g->stage_tokens, 0);
	T_EQ(g->elem_bytes, 2);
	T_EQ(tenant_id(t), 7);
	T_EQ_STR(tenant_name(t), "engine-1");
	T_EQ_STR(tenant_policy_spec(t), "full");
	T_EQ_U64(tenant_quota(t), 4 * KVT_CHUNK_BYTES);
	T_EQ_U64(tenant_chunks(t), 0);
	T_EQ_U64(pool.chunks_used, 0);

	struct stat st;
	T_EQ(fstat(tenant_table_fd(t), &st), 0);
	T_EQ_U64((uint64_t)st.st_size, g->table_bytes);
	int seals = fcntl(tenant_table_fd(t), F_GET_SEALS);
	T_EQ(seals & (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL |
	              F_SEAL_FUTURE_WRITE),
	     F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE);
	/* The table is read-only for whoever holds its fd; the staging
	 * segment is the client's to write. */
	T_ASSERT(mmap(NULL, g->table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
	              tenant_table_fd(t), 0) == MAP_FAILED);
	T_EQ(errno, EPERM);
	T_ASSERT(pwrite(tenant_table_fd(t), "x", 1, 0) < 0);
	T_EQ(fstat(tenant_stage_fd(t), &st), 0);
	T_EQ_U64((uint64_t)st.st_size, g->stage_bytes);
	seals = fcntl(tenant_stage_fd(t), F_GET_SEALS);
	T_ASSERT(seals & F_SEAL_SHRINK);
	T_ASSERT(!(seals & (F_SEAL_FUTURE_WRITE | F_SEAL_WRITE)));
	void *stw = mmap(NULL, g->stage_bytes, PROT_READ | PROT_WRITE,
	                 MAP_SHARED, tenant_stage_fd(t), 0);
	T_ASSERT(stw != MAP_FAILED);
	munmap(stw, g->stage_bytes);

	void *tab = mmap(NULL, g->table_bytes, PROT_READ, MAP_SHARED,
	                 tenant_table_fd(t), 0);
	T_ASSERT(tab != MAP_FAILED);
	T_OK(shm_table_check(tab, g));
	munmap(tab, g->table_bytes);
	const struct shm_stage_hdr *sh = mmap(NULL, g->stage_bytes, PROT_READ,
	                                      MAP_SHARED, tenant_stage_fd(t),
	                                      0);
	T_ASSERT(sh != MAP_FAILED);
	T_EQ(sh->magic, SHM_STAGE_MAGIC);
	T_EQ(sh->max_seqs, 8);
	munmap((void *)sh, g->stage_bytes);

	struct kvt_tenant_stats s;
	tenant_stats(t, &s);
	T_EQ_U64(s.pages_used + s.pages_free + s.chunks + s.sequences +
	                 s.syncs + s.entries_kept + s.entries_appended +
	                 s.entries_evicted,
	         0);
	T_EQ_U64(s.quota_bytes, 4 * KVT_CHUNK_BYTES);
	T_EQ(tenant_check(t, err, sizeof(err)), 0);
	tenant_free(t);
	tenant_free(NULL);

	/* no default quota, or one above the pool: the whole pool */
	T_OK(tenant_new(&pool, 8, &h, LIM(0), &t, err, sizeof(err)));
	T_EQ_U64(tenant_quota(t), 8 * KVT_CHUNK_BYTES);
	tenant_free(t);
	T_OK(tenant_new(&pool, 9, &h, LIM(100 * KVT_CHUNK_BYTES), &t, err,
	                sizeof(err)));
	T_EQ_U64(tenant_quota(t), 8 * KVT_CHUNK_BYTES);
	tenant_free(t);
	/* The fair share: pool / expected_tenants in whole chunks, at least
	 * one, capped by max_quota; an explicit default_quota wins. */
	struct tenant_limits lim = {.expected_tenants = 4,
	                            .memory_max = 1ull << 30};
	T_OK(tenant_new(&pool, 11, &h, &lim, &t, err, sizeof(err)));
	T_EQ_U64(tenant_quota(t), 2 * KVT_CHUNK_BYTES); /* 8 / 4 */
	tenant_free(t);
	lim.expected_tenants = 3; /* 8 / 3 = 2.67 chunks: 2 */
	T_OK(tenant_new(&pool, 11, &h, &lim, &t, err, sizeof(err)));
	T_EQ_U64(tenant_quota(t), 2 * KVT_CHUNK_BYTES);
	tenant_free(t);
	lim.expected_tenants = 64; /* below one chunk: one */
	T_OK(tenant_new(&pool, 11, &h, &lim, &t, err, sizeof(err)));
	T_EQ_U64(tenant_quota(t), KVT_CHUNK_BYTES);
	tenant_free(t);
	lim.expected_tenants = 1;
	lim.max_quota = 3 * KVT_CHUNK_BYTES;
	T_OK(tenant_new(&pool, 11, &h, &lim, &t, err, sizeof(err)));
	T_EQ_U64(tenant_quota(t), 3 * KVT_CHUNK_BYTES);
	tenant_free(t);
	lim.default_quota = 5 * KVT_CHUNK_BYTES; /* still capped */
	T_OK(tenant_new(&pool, 11, &h, &lim, &t, err, sizeof(err)));
	T_EQ_U64(tenant_quota(t), 3 * KVT_CHUNK_BYTES);
	tenant_free(t);
	/* headroom defaults to page_tokens, clamped to max_tokens */
	h.max_tokens = 5;
	T_OK(tenant_new(&pool, 10, &h, LIM(0), &t, err, sizeof(err)));
	T_EQ(tenant_geom(t)->headroom, 5);
	tenant_free(t);
	T_EQ_U64(pool.chunks_used, 0);
}

TEST(tenant, new_refusals)
{
	struct pool pool;
	T_OK(pool_init(&pool, 2 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	h.geo.n_heads = 3; /* not a multiple of n_kv_heads 2 */
	NEW_REFUSED(&pool, &h, KVT_EGEOMETRY);
	h = hello_a("full");
	h.dtype = 7;
	NEW_REFUSED(&pool, &h, KVT_EGEOMETRY);
	h = hello_a("full");
	h.headroom = 65; /* > max_tokens */
	NEW_REFUSED(&pool, &h, KVT_EGEOMETRY);
	h = hello_a("full");
	h.geo.head_dim = 0;
	NEW_REFUSED(&pool, &h, KVT_EGEOMETRY);

	h = hello_a("streaming:tokens=0");
	NEW_REFUSED(&pool, &h, KVT_EPOLICY);
	h = hello_a("bogus");
	NEW_REFUSED(&pool, &h, KVT_EPOLICY);
	h = hello_a("full:tokens=3");
	NEW_REFUSED(&pool, &h, KVT_EPOLICY);

	h = hello_a("full");
	h.quota_bytes = 3 * KVT_CHUNK_BYTES; /* pool holds 2 */
	NEW_REFUSED(&pool, &h, KVT_EQUOTA);
	h.quota_bytes = KVT_CHUNK_BYTES / 2; /* not even one chunk */
	NEW_REFUSED(&pool, &h, KVT_EQUOTA);
	T_EQ_U64(pool.chunks_created_total, 0);
}

TEST(tenant, open_close_returns_pages)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	struct kvt_tenant_stats st;

	uint64_t s1, s2, s3;
	T_OK(tenant_seq_open(s.t, &s1));
	T_EQ_U64(s1, seqid_make(1, 1, 0)); /* tenant 1, gen 1, slot 0 */
	CLEAN(&s);
	tenant_stats(s.t, &st);
	/* 2 layers x 2 heads, ceil((0 + 4) / 4) = 1 page each */
	T_EQ_U64(st.pages_used, 4);
	T_EQ_U64(st.pages_free, 8192 - 4);
	T_EQ_U64(st.chunks, 1);
	T_EQ_U64(st.sequences, 1);
	T_EQ_U64(pool.chunks_used, 1);
	for (uint32_t layer = 0; layer < 2; layer++)
		for (uint32_t head = 0; head < 2; head++) {
			const struct shm_list *l = lst(&s, s1, layer, head);
			T_EQ(l->len, 0);
			T_EQ(l->n_pages, 1);
			T_EQ_U64(l->epoch, 1);
		}
	flush(&s);
	T_EQ(s.adds, 1);
	T_EQ(s.n_log, 1);
	T_EQ(s.log_type[0], HANDLE_CHUNK_ADD);
	T_EQ(s.log_slot[0], 0);

	T_OK(tenant_seq_open(s.t, &s2));
	T_EQ_U64(s2, seqid_make(1, 1, 1));
	CLEAN(&s);
	tenant_stats(s.t, &st);
	T_EQ_U64(st.pages_used, 8);
	T_EQ_U64(st.pages_free, 8192 - 8);
	T_EQ_U64(st.chunks, 1);
	flush(&s);
	T_EQ(s.adds, 1);

	/* eight distinct page ids */
	uint32_t ids[8];
	int n = 0;
	for (uint32_t sq = 0; sq < 2; sq++)
		for (uint32_t layer = 0; layer < 2; layer++)
			for (uint32_t head = 0; head < 2; head++)
				ids[n++] = lst(&s, sq ? s2 : s1, layer, head)
				                   ->pages[0];
	for (int i = 0; i < 8; i++)
		for (int j = i + 1; j < 8; j++)
			T_ASSERT(ids[i] != ids[j]);

	T_OK(tenant_seq_close(s.t, s1));
	T_ERR(tenant_seq_close(s.t, s1), KVT_ENOSEQ);
	CLEAN(&s);
	tenant_stats(s.t, &st);
	T_EQ_U64(st.pages_used, 4);
	T_EQ_U64(st.sequences, 1);
	T_EQ_U64(st.chunks, 1);
	for (uint32_t layer = 0; layer < 2; layer++)
		for (uint32_t head = 0; head < 2; head++) {
			const struct shm_list *l = lst(&s, s1, layer, head);
			T_EQ(l->len, 0);
			T_EQ(l->n_pages, 0);
			T_EQ_U64(l->epoch, 2);
		}
	flush(&s);
	T_EQ(s.revokes, 0);

	T_OK(tenant_seq_close(s.t, s2));
	CLEAN(&s);
	tenant_stats(s.t, &st);
	T_EQ_U64(st.pages_used, 0);
	T_EQ_U64(st.pages_free, 0);
	T_EQ_U64(st.chunks, 0);
	T_EQ_U64(st.sequences, 0);
	/* revoked, destroyed only once the client was told */
	T_EQ_U64(tenant_chunks(s.t), 1);
	T_EQ_U64(pool.chunks_used, 1);
	flush(&s);
	T_EQ(s.revokes, 1);
	T_EQ(s.n_log, 2);
	T_EQ(s.log_type[1], HANDLE_CHUNK_REVOKE);
	T_EQ(s.log_slot[1], 0);
	T_EQ_U64(tenant_chunks(s.t), 0);
	T_EQ_U64(pool.chunks_used, 0);
	T_EQ_U64(pool.chunks_released_total, 1);

	/* same slot, new generation; old ids stay dead */
	T_OK(tenant_seq_open(s.t, &s3));
	T_EQ_U64(s3, seqid_make(1, 2, 0));
	T_ERR(tenant_seq_close(s.t, s1), KVT_ENOSEQ);
	struct ipc_sync_item it = item(s1, 0, 1, 0, 0);
	T_ERR(tenant_sync(s.t, 0, &it, 1, NULL, 0), KVT_ENOSEQ);
	T_ERR(tenant_seq_close(s.t, 0), KVT_ENOSEQ);
	T_ERR(tenant_seq_close(s.t, seqid_make(1, 1, 99)), KVT_ENOSEQ);
	flush(&s);
	T_EQ(s.adds, 2);
	T_EQ(s.log_slot[2], 0);
	T_EQ_U64(pool.chunks_created_total, 2);
	CLEAN(&s);
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}

/*
 * Two tenants with a sequence in the same slot and
 * generation get different ids, and neither can sync, close or query the
 * other's (ENOSEQ with a reason, nothing changed on either side); the id
 * of a closed sequence stays unknown once its slot is reused.
 */
TEST(tenant, sequence_ids_carry_their_tenant)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim a, b;
	sim_new_id(&a, &pool, &h, 0, 1);
	sim_new_id(&b, &pool, &h, 0, 2);
	uint64_t sa, sb;
	T_OK(tenant_seq_open(a.t, &sa));
	T_OK(tenant_seq_open(b.t, &sb));
	T_EQ(seqid_slot(sa), 0);
	T_EQ(seqid_slot(sb), 0);
	T_ASSERT(sa != sb);
	struct ipc_sync_item it = item(sa, 0, 3, 0, 0);
	T_OK(tenant_sync(a.t, 0, &it, 1, NULL, 0));
	flush(&a);
	flush(&b);

	struct snap na, nb;
	snap_take(&a, &na);
	snap_take(&b, &nb);
	/* b's counter is 0 like a's was, so only the tenant tells them
	 * apart. */
	it = item(sa, 0, 1, 0, 0);
	REFUSE(&b, &nb, &it, 1, KVT_ENOSEQ);
	it = item(sb, 1, 1, 0, 0);
	REFUSE(&a, &na, &it, 1, KVT_ENOSEQ);
	struct ipc_seq_state q;
	T_ERR(tenant_seq_query(b.t, sa, 100, 0, &q), KVT_ENOSEQ);
	T_ERR(tenant_seq_query(a.t, sb, 100, 0, &q), KVT_ENOSEQ);
	T_ERR(tenant_seq_close(b.t, sa), KVT_ENOSEQ);
	T_ERR(tenant_seq_close(a.t, sb), KVT_ENOSEQ);
	SAME(&a, &na);
	SAME(&b, &nb);
	free(na.table);
	free(nb.table);
	T_OK(tenant_seq_query(a.t, sa, 100, 0, &q));
	T_EQ(q.syncs, 1);
	T_EQ(q.len_hi, 3);
	T_OK(tenant_seq_query(b.t, sb, 100, 0, &q));
	T_EQ(q.syncs, 0);
	T_EQ(q.len_hi, 0);

	/* A stale id after its slot was reused. */
	T_OK(tenant_seq_close(a.t, sa));
	uint64_t sa2;
	T_OK(tenant_seq_open(a.t, &sa2));
	T_EQ(seqid_slot(sa2), 0);
	T_ASSERT(sa2 != sa);
	flush(&a);
	snap_take(&a, &na);
	it = item(sa, 0, 1, 0, 0);
	REFUSE(&a, &na, &it, 1, KVT_ENOSEQ);
	T_ERR(tenant_seq_query(a.t, sa, 100, 0, &q), KVT_ENOSEQ);
	T_ERR(tenant_seq_close(a.t, sa), KVT_ENOSEQ);
	SAME(&a, &na);
	free(na.table);
	sim_free(&a);
	sim_free(&b);
	T_EQ_U64(pool.chunks_used, 0);
}

/*
 * tenant_seq_query: the counter, tokens seen per layer and list lengths,
 * here after a sync of layer 0 only (3 new) and one of both layers (2
 * new) under "full", which keeps everything: layer 0 saw 5, layer 1 saw 2.
 */
TEST(tenant, seq_query_counts_and_lengths)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t id;
	struct ipc_seq_state q;
	T_OK(tenant_seq_open(s.t, &id));
	T_OK(tenant_seq_query(s.t, id, 100, 0, &q));
	T_EQ(q.syncs, 0);
	T_EQ(q.seen_lo, 0);
	T_EQ(q.seen_hi, 0);
	T_EQ(q.len_lo, 0);
	T_EQ(q.len_hi, 0);
	struct ipc_sync_item it = item(id, 0, 3, 0, 1);
	T_OK(tenant_sync(s.t, 0, &it, 1, NULL, 0));
	it = item(id, 1, 2, 0, 0);
	T_OK(tenant_sync(s.t, 0, &it, 1, NULL, 0));
	T_OK(tenant_seq_query(s.t, id, 100, 0, &q));
	T_EQ(q.syncs, 2);
	T_EQ(q.seen_lo, 2);
	T_EQ(q.seen_hi, 5);
	T_EQ(q.len_lo, 2);
	T_EQ(q.len_hi, 5);
	flush(&s);
	CLEAN(&s);
	sim_free(&s);
}

/*
 * A query names the sync in doubt by its number.  Applied, `last` is that
 * number.  Not applied though it reached the tenant (refused), the query
 * voids it: the same number arriving again is refused as a whole (both
 * sequences of it), changes nothing, and the next sync, numbered higher,
 * is applied.  A number above every sync seen never reached the tenant
 * and, requests arriving in order, never will: not applied, nothing
 * voided.  A number at or above the query's own was never sent: EINVAL,
 * nothing voided.  Queries that name no sync (after 0) or one already
 * applied void nothing.
 */
TEST(tenant, seq_query_voids_the_sync_it_names)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t a, b;
	struct ipc_seq_state q;
	char err[KVT_ERRTEXT_MAX];
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_open(s.t, &b));
	struct ipc_sync_item it[2] = {item(a, 0, 3, 0, 0), item(b, 0, 2, 0, 0)};
	T_OK(tenant_sync(s.t, 5, it, 2, NULL, 0));
	/* 5 was applied: the query says so and voids nothing. */
	T_OK(tenant_seq_query(s.t, a, 100, 5, &q));
	T_EQ_U64(q.last, 5);
	T_EQ(q.syncs, 1);
	T_OK(tenant_seq_query(s.t, b, 100, 0, &q));
	T_EQ_U64(q.last, 5);
	/* 7 reaches the tenant and is refused (wrong counters); asked
	 * about: not applied, voided, so 7 is refused even when right. */
	it[0] = item(a, 3, 1, 0, 0);
	it[1] = item(b, 3, 1, 0, 0);
	T_ERR(tenant_sync(s.t, 7, it, 2, NULL, 0), KVT_ESTALE);
	T_OK(tenant_seq_query(s.t, a, 100, 7, &q));
	T_EQ_U64(q.last, 5);
	T_EQ(q.syncs, 1);
	it[0] = item(a, 1, 1, 0, 0);
	it[1] = item(b, 1, 1, 0, 0);
	T_ERR(tenant_sync(s.t, 7, it, 2, err, sizeof(err)), KVT_ESTALE);
	T_ASSERT(strstr(err, "given up"));
	T_OK(tenant_seq_query(s.t, b, 100, 7, &q)); /* b was in 7 too */
	T_EQ(q.syncs, 1);
	T_EQ(q.len_lo, 2);
	T_OK(tenant_seq_query(s.t, a, 100, 0, &q));
	T_EQ(q.syncs, 1);
	T_EQ(q.len_lo, 3);
	/* An older number is void too; the next one is applied. */
	T_ERR(tenant_sync(s.t, 6, it, 2, NULL, 0), KVT_ESTALE);
	T_OK(tenant_sync(s.t, 8, it, 2, NULL, 0));
	T_OK(tenant_seq_query(s.t, a, 100, 8, &q));
	T_EQ_U64(q.last, 8);
	T_EQ(q.syncs, 2);
	T_EQ(q.len_lo, 4);
	/* 9 never reached the tenant: not applied, not voided. */
	T_OK(tenant_seq_query(s.t, a, 100, 9, &q));
	T_EQ_U64(q.last, 8);
	it[0] = item(a, 2, 1, 0, 0);
	it[1] = item(b, 2, 1, 0, 0);
	T_OK(tenant_sync(s.t, 9, it, 2, NULL, 0));
	/* Never sent (at or above the query's own number): refused,
	 * nothing voided. */
	T_ERR(tenant_seq_query(s.t, a, 10, 10, &q), KVT_EINVAL);
	T_ERR(tenant_seq_query(s.t, a, 100, UINT64_MAX, &q), KVT_EINVAL);
	it[0] = item(a, 3, 1, 0, 0);
	it[1] = item(b, 3, 1, 0, 0);
	T_OK(tenant_sync(s.t, 10, it, 2, NULL, 0));
	T_OK(tenant_seq_query(s.t, a, 100, 10, &q));
	T_EQ_U64(q.last, 10);
	T_EQ(q.syncs, 4);
	/* Closing and reopening forgets both marks. */
	T_OK(tenant_seq_close(s.t, a));
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_query(s.t, a, 100, 0, &q));
	T_EQ_U64(q.last, 0);
	it[0] = item(a, 0, 1, 0, 0);
	T_OK(tenant_sync(s.t, 1, it, 1, NULL, 0));
	flush(&s);
	CLEAN(&s);
	sim_free(&s);
}

/*
 * Opens without a verdict: the next open names the first of them (undo)
 * and the sequences they opened, and only those, are closed; a late copy
 * of an open numbered below the latest is refused; the same number again
 * (a parked open's retry) is not.
 */
TEST(tenant, seq_reconcile_closes_what_lost_opens_opened)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t a, lost1, lost2, b, c;
	uint32_t closed;
	struct ipc_seq_state q;
	struct kvt_tenant_stats st;
	T_OK(tenant_seq_reconcile(s.t, 1, 0, &closed));
	T_OK(tenant_seq_open(s.t, &a));         /* its reply arrived */
	T_OK(tenant_seq_reconcile(s.t, 4, 0, &closed));
	T_OK(tenant_seq_open(s.t, &lost1));     /* open 4: timed out */
	T_OK(tenant_seq_reconcile(s.t, 6, 4, &closed));
	T_EQ(closed, 1);                         /* lost1 */
	T_OK(tenant_seq_open(s.t, &lost2));     /* open 6: timed out too */
	tenant_stats(s.t, &st);
	T_EQ_U64(st.sequences, 2);
	/* Open 9 still names 4, the first without a verdict. */
	T_OK(tenant_seq_reconcile(s.t, 9, 4, &closed));
	T_EQ(closed, 1);                         /* lost2 */
	T_OK(tenant_seq_open(s.t, &b));
	tenant_stats(s.t, &st);
	T_EQ_U64(st.sequences, 2);               /* a and b */
	T_ERR(tenant_seq_query(s.t, lost1, 100, 0, &q), KVT_ENOSEQ);
	T_ERR(tenant_seq_query(s.t, lost2, 100, 0, &q), KVT_ENOSEQ);
	T_OK(tenant_seq_query(s.t, a, 100, 0, &q));
	T_OK(tenant_seq_query(s.t, b, 100, 0, &q));
	/* A late copy of 6: refused, nothing opened or closed. */
	T_ERR(tenant_seq_reconcile(s.t, 6, 0, &closed), KVT_ESTALE);
	T_EQ(closed, 0);
	tenant_stats(s.t, &st);
	T_EQ_U64(st.sequences, 2);
	/* 9 again (a retry): allowed, and b (opened by 9) stays. */
	T_OK(tenant_seq_reconcile(s.t, 9, 4, &closed));
	T_EQ(closed, 0);
	T_OK(tenant_seq_reconcile(s.t, 10, 0, &closed));
	T_OK(tenant_seq_open(s.t, &c));
	tenant_stats(s.t, &st);
	T_EQ_U64(st.sequences, 3);
	flush(&s);
	CLEAN(&s);
	sim_free(&s);
}

TEST(tenant, seq_limit)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t id[4], x;
	for (int i = 0; i < 4; i++)
		T_OK(tenant_seq_open(s.t, &id[i]));
	flush(&s);
	struct snap sn;
	snap_take(&s, &sn);
	T_ERR(tenant_seq_open(s.t, &x), KVT_ESEQLIMIT);
	SAME(&s, &sn);
	T_OK(tenant_seq_close(s.t, id[2]));
	T_OK(tenant_seq_open(s.t, &x));
	T_EQ_U64(x, seqid_make(1, 2, 2));
	CLEAN(&s);
	sim_free(&s);
}
