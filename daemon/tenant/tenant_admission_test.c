/*
 * tenant_admission_test.c — admission of a tenant: the memory estimate
 * against a hand calculation, the memory cap and the reason naming its
 * parts, names checked and defaulted.
 *
 * The simulated client (struct sim) and its checks are tenant_fixture.h's.
 */
#include "tenant_fixture.h"

/*
 * Geometry M: 4 layers, 8 query heads over 2 KV heads, head_dim 16,
 * d_model 64, f32, pages of 8 (1 KiB, 2048 per chunk), 3 sequences of 100
 * entries, headroom 8, a staging ring of 16, a quota of 4 chunks.
 */
static struct ipc_hello hello_m(const char *policy)
{
	struct ipc_hello h;
	memset(&h, 0, sizeof(h));
	strcpy(h.name, "m");
	h.geo = (struct kvt_geometry){4, 8, 2, 16, 64};
	h.dtype = KVT_DTYPE_F32;
	h.page_tokens = 8;
	h.max_seqs = 3;
	h.max_tokens = 100;
	h.headroom = 8;
	h.stage_tokens = 16;
	h.quota_bytes = 4 * KVT_CHUNK_BYTES;
	snprintf(h.policy, sizeof(h.policy), "%s", policy);
	return h;
}

TEST(tenant, memory_estimate_matches_hand_calculation)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	char err[KVT_ERRTEXT_MAX] = "";
	struct tenant *t = NULL;
	struct ipc_hello h = hello_m("full");
	T_OK(tenant_new(&pool, 1, &h, LIM(0), &t, err, sizeof(err)));
	const struct tenant_mem *m = tenant_mem_of(t);
	/*
	 * max_pages = ceil((100 + 8) / 8) = 14; a record is 16 + 14 * 4 = 72
	 * bytes, 128 aligned; the header 72 bytes, 128 aligned; 3 * 4 * 2 =
	 * 24 lists.
	 */
	T_EQ_U64(m->table, 128 + 24 * 128);
	/* "full" reads no staged input: its staging segment is the 64-byte
	 * header only (the entry of every part would be 64 + 8 * 16 + 8 =
	 * 200 floats). */
	T_EQ_U64(m->stage, 64);
	/* Per sequence: n_seen 4 * 4, page ids 8 * 14 * 4, positions
	 * 8 * (100 + 8) * 4; "full" keeps no entry or layer state. */
	T_EQ_U64(m->seqs, 3 * (4 * 4 + 8 * 14 * 4 + 8 * 108 * 4));
	/* Per list 16 bytes, plus the tenant's and slots' structs. */
	T_ASSERT(m->lists >= 24 * 16 && m->lists <= 24 * 16 + 8192);
	/* Per chunk a free stack of 2048 ids, check's bitmap of 2048 bits
	 * (+1) and a slot base, plus slot and queue structs. */
	uint64_t per_chunk = 2048 * 4 + 2048 / 8 + 1 + 8;
	T_ASSERT(m->chunks >= 4 * per_chunk &&
	         m->chunks <= 4 * (per_chunk + 1024) + 1024);
	/* moves 100 * 2 * 4, pagev 2 * 14 * 8, heads, drop 2400 (3 * 8
	 * lists of 100 entries) and newlen 24 * 4, which grow by half again
	 * at most, and the policy arena of one decide, twice 2 heads * 100
	 * entries * 64 bytes. */
	T_EQ_U64(m->scratch, 800 + 224 + 2 * sizeof(struct policy_head) +
	                             (2400 + 96) * 3 / 2 + 2 * 2 * 100 * 64);
	T_EQ_U64(m->total, m->table + m->stage + m->seqs + m->lists +
	                           m->chunks + m->scratch);
	struct kvt_tenant_stats ts;
	tenant_stats(t, &ts);
	T_EQ_U64(ts.daemon_bytes, m->total);
	uint64_t full_lists = m->lists, full_chunks = m->chunks;
	tenant_free(t);

	/* h2o: entry state of G = 4 floats, staged q and lse, attention
	 * scratch over headroom queries (lookback 0). */
	h = hello_m("h2o");
	T_OK(tenant_new(&pool, 1, &h, LIM(0), &t, err, sizeof(err)));
	m = tenant_mem_of(t);
	T_EQ_U64(m->seqs, 3 * (4 * 4 + 8 * 14 * 4 + 8 * 108 * 4 +
	                       8 * 108 * 4 * 4));
	T_EQ_U64(m->lists, full_lists);
	T_EQ_U64(m->chunks, full_chunks);
	/* h2o reads q and lse: staged entries of 8 * 16 + 8 = 136 floats,
	 * no x. */
	T_EQ_U64(m->stage, 64 + 3 * 4 * 16 * 136 * 4);
	/* + staged rows of one sync 8 * 200 * 4 (gathered by part), entry
	 * scratch 2400 * 4 * 4 (grown by half again, as drop and newlen), and
	 * per entry 64 + head_dim 16 * 4 + 8 queries * 4 heads * 4. */
	T_EQ_U64(m->scratch, 800 + 224 + 2 * sizeof(struct policy_head) +
	                             8 * 200 * 4 +
	                             (2400 + 96 + 2400 * 4 * 4) * 3 / 2 +
	                             2 * 2 * 100 * (64 + 64 + 8 * 4 * 4));
	tenant_free(t);
	T_EQ_U64(pool.chunks_used, 0);
}

TEST(tenant, memory_cap_refuses_and_names_the_parts)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	char err[KVT_ERRTEXT_MAX] = "";
	struct tenant *t = NULL;
	struct ipc_hello h = hello_m("full");
	struct tenant_limits lim = {.expected_tenants = 1,
	                            .memory_max = 1ull << 30};
	T_OK(tenant_new(&pool, 1, &h, &lim, &t, err, sizeof(err)));
	uint64_t need = tenant_mem_of(t)->total;
	T_EQ_U64(lim.memory_need, need);
	tenant_free(t);

	/* Exactly the need is admitted, a byte less is not. */
	lim.memory_max = need;
	T_OK(tenant_new(&pool, 1, &h, &lim, &t, err, sizeof(err)));
	tenant_free(t);
	lim.memory_max = need - 1;
	struct pool before = pool;
	t = (struct tenant *)&pool;
	T_ERR(tenant_new(&pool, 1, &h, &lim, &t, err, sizeof(err)),
	      KVT_EQUOTA);
	T_ASSERT(t == NULL);
	T_ASSERT(!memcmp(&before, &pool, sizeof(pool)));
	T_EQ_U64(lim.memory_need, need);
	T_ASSERT(strstr(err, "tenant_memory_max"));
	T_ASSERT(strstr(err, "table") && strstr(err, "staging") &&
	         strstr(err, "sequences") && strstr(err, "scratch"));

	/*
	 * A hostile geometry: 4-byte pages (page_tokens 1, head_dim 1,
	 * f16), 512 sequences of 64 layers x 1024 KV heads.  The table alone
	 * is 128 + 512 * 65536 * 64 bytes = 2.0 GiB, the page ids and
	 * positions 2 * 512 * 65536 * (4 + 1) * 4 bytes = 1.25 GiB, a little
	 * more with n_seen (512 * 64 * 4).
	 */
	memset(&h, 0, sizeof(h));
	strcpy(h.name, "sparse");
	h.geo = (struct kvt_geometry){64, 1024, 1024, 1, 16};
	h.dtype = KVT_DTYPE_F16;
	h.page_tokens = 1;
	h.max_seqs = 512;
	h.max_tokens = 4;
	h.headroom = 1;
	lim.memory_max = 1ull << 30;
	T_ERR(tenant_new(&pool, 1, &h, &lim, &t, err, sizeof(err)),
	      KVT_EQUOTA);
	T_ASSERT(lim.memory_need > (3ull << 30));
	T_ASSERT(strstr(err, "table 2.0 GiB"));
	T_ASSERT(strstr(err, "sequences 1.3 GiB")); /* 1.25 and n_seen */
	T_ASSERT(strstr(err, "lower max_seqs or max_tokens, or raise "
	                     "page_tokens"));
	T_ASSERT(strlen(err) < KVT_ERRTEXT_MAX - 1); /* not truncated */
	T_EQ_U64(pool.chunks_created_total, 0);
}

TEST(tenant, names_are_checked_and_defaulted)
{
	char err[KVT_ERRTEXT_MAX];
	const char *good[] = {"a", "engine-12", "x.y_z@host:1", "A-Z.09"};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		T_OK(tenant_name_check(good[i], err, sizeof(err)));
	char longest[KVT_NAME_MAX];
	memset(longest, 'n', KVT_NAME_MAX - 1);
	longest[KVT_NAME_MAX - 1] = '\0';
	T_OK(tenant_name_check(longest, err, sizeof(err)));
	const char *bad[] = {"", "1", "12", "7up", "a b", "a\nb", "\x1b[2J",
	                     "caf\xc3\xa9", "\xff\xfe", "a,b", "a=1", "a\"b",
	                     "a/b"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		T_ERR(tenant_name_check(bad[i], err, sizeof(err)), KVT_EINVAL);
		T_ASSERT(err[0]);
		for (const char *p = err; *p; p++) /* printable, one line */
			T_ASSERT(*p >= 0x20 && *p < 0x7f);
	}
	T_ERR(tenant_name_check("\x1b[2J", err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "\"\\x1b[2J\""));
	T_ERR(tenant_name_check("12", err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "starts with a digit"));

	/* An empty name is defaulted, a bad one refused, at registration. */
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct tenant *t = NULL;
	struct ipc_hello h = hello_a("full");
	h.name[0] = '\0';
	T_OK(tenant_new(&pool, 42, &h, LIM(0), &t, err, sizeof(err)));
	T_EQ_STR(tenant_name(t), "tenant-42");
	tenant_free(t);
	strcpy(h.name, "a\nb");
	NEW_REFUSED(&pool, &h, KVT_EINVAL);
}
