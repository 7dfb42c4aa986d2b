/*
 * tenant_policy_test.c — policies through the tenant: h2o fed through syncs,
 * policy refusals at registration, pressure tightening budgets, policy
 * state untouched by a refused sync, closed chunks.
 *
 * The simulated client (struct sim) and its checks are tenant_fixture.h's.
 */
#include "tenant_fixture.h"

/* Maps the staging segment read-write, like a client. */
static float *stage_map(const struct sim *s)
{
	void *m = mmap(NULL, s->g->stage_bytes, PROT_READ | PROT_WRITE,
	               MAP_SHARED, tenant_stage_fd(s->t), 0);
	T_ASSERT(m != MAP_FAILED);
	return m;
}

/* Stages q = 0 and lse = 0 for (slot, layer, pos) of every layer: every
 * causal attention weight is exp(0 - 0) = 1. */
static void stage_uniform(const struct sim *s, void *stage, uint64_t seq,
                          uint32_t pos)
{
	for (uint32_t layer = 0; layer < s->g->n_layers; layer++) {
		float *row = shm_stage_at(stage, s->g, seqid_slot(seq), layer, pos);
		memset(row, 0, s->g->stage_entry_floats * sizeof(float));
	}
}

TEST(tenant, h2o_through_sync)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("h2o:tokens=4,window=1");
	h.stage_tokens = 4;
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	void *stage = stage_map(&s);
	uint64_t seq;
	T_OK(tenant_seq_open(s.t, &seq));
	flush(&s);
	uint32_t ctr = 0, seen[2] = {0, 0};
	/* Uniform attention: S_i = queries at or after i, so the oldest
	 * entries are the heavy hitters; the newest is protected. */
	for (uint32_t n = 0; n < 8; n++) {
		stage_uniform(&s, stage, seq, n);
		STEP(&s, seq, &ctr, 0, 0, 1, seen);
	}
	const uint32_t want[4] = {0, 1, 2, 7};
	VERIFY_ALL(&s, seq, want, 4);
	/* a prefill-size sync of 3 stages 3 rows through the ring */
	for (uint32_t n = 8; n < 11; n++)
		stage_uniform(&s, stage, seq, n);
	STEP(&s, seq, &ctr, 0, 0, 3, seen);
	const uint32_t want2[4] = {0, 1, 2, 10};
	VERIFY_ALL(&s, seq, want2, 4);
	munmap(stage, s.g->stage_bytes);
	sim_free(&s);
}

TEST(tenant, policy_refusals_at_registration)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct tenant *t = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	/* staged policies need stage_tokens >= headroom (+ lookback) */
	struct ipc_hello h = hello_a("h2o");
	h.stage_tokens = 0;
	T_ERR(tenant_new(&pool, 1, &h, LIM(0), &t, err, sizeof(err)), KVT_EPOLICY);
	T_ASSERT(strstr(err, "stage_tokens"));
	h = hello_a("snapkv:window=8");
	h.stage_tokens = 11; /* needs 4 + 8 */
	T_ERR(tenant_new(&pool, 1, &h, LIM(0), &t, err, sizeof(err)), KVT_EPOLICY);
	h.stage_tokens = 12;
	T_OK(tenant_new(&pool, 1, &h, LIM(0), &t, err, sizeof(err)));
	tenant_free(t);
	/* weights are loaded, and refused, at registration */
	h = hello_a("kvzap:model=/nonexistent/kvzap.safetensors");
	h.stage_tokens = 4;
	T_ERR(tenant_new(&pool, 1, &h, LIM(0), &t, err, sizeof(err)), KVT_EPOLICY);
	T_ASSERT(strstr(err, "/nonexistent"));
	T_ASSERT(t == NULL);
	T_EQ_U64(pool.chunks_used, 0);
}

/* model= paths must be absolute (docs/weights.md "Paths"): the daemon's
 * working directory means nothing to the engine that wrote the spec. */
TEST(tenant, relative_model_paths_are_refused)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	static const char *const bad[] = {
		"kvzap:model=kvzap.safetensors",
		"kvzap:threshold=-4,model=./w/kvzap.safetensors,window=4",
		"fastkvzip:model=../gate",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct ipc_hello h = hello_a(bad[i]);
		struct tenant *t = NULL;
		char err[KVT_ERRTEXT_MAX] = "";
		h.stage_tokens = 4;
		T_ERR(tenant_new(&pool, 1, &h, LIM(0), &t, err, sizeof(err)),
		      KVT_EPOLICY);
		T_ASSERT(strstr(err, "relative path"));
		T_ASSERT(t == NULL);
	}
	T_EQ_U64(pool.chunks_used, 0);
}

TEST(tenant, pressure_tightens_budgets)
{
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("streaming:sinks=1,tokens=8");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	T_ASSERT(tenant_pressure(s.t) == 0.0f);
	uint64_t seq;
	T_OK(tenant_seq_open(s.t, &seq));
	flush(&s);
	uint32_t ctr = 0, seen[2] = {0, 0};
	for (int i = 0; i < 3; i++)
		STEP(&s, seq, &ctr, 0, 0, 4, seen);
	const uint32_t want[8] = {0, 5, 6, 7, 8, 9, 10, 11};
	VERIFY_ALL(&s, seq, want, 8);
	tenant_set_pressure(s.t, 2.0f); /* clamped: budget 8 -> 4 */
	T_ASSERT(tenant_pressure(s.t) == 1.0f);
	STEP(&s, seq, &ctr, 0, 0, 1, seen);
	const uint32_t want2[4] = {0, 10, 11, 12};
	VERIFY_ALL(&s, seq, want2, 4);
	tenant_set_pressure(s.t, NAN);
	T_ASSERT(tenant_pressure(s.t) == 0.0f);
	sim_free(&s);
}

TEST(tenant, policy_state_untouched_by_refused_sync)
{
	/* Geometry B, quota of one chunk: the open sequence holds it all,
	 * so a sync that must grow the lists is refused in the page step,
	 * after the policy decided (on scratch state): nothing changes. */
	struct pool pool;
	T_OK(pool_init(&pool, 1 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_b("h2o:tokens=1,window=0", 1);
	h.stage_tokens = 64;
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t seq;
	T_OK(tenant_seq_open(s.t, &seq));
	flush(&s);
	struct snap sn;
	snap_take(&s, &sn);
	uint32_t seen[2] = {0, 0};
	append(&s, seq, 0, 2, 64, seen);
	void *stage = stage_map(&s); /* h2o refuses rows never staged */
	for (uint32_t pos = 0; pos < 64; pos++)
		stage_uniform(&s, stage, seq, pos);
	struct ipc_sync_item it = item(seq, 0, 64, 0, 0);
	REFUSE(&s, &sn, &it, 1, KVT_EQUOTA);
	munmap(stage, s.g->stage_bytes);
	free(sn.table);
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}

TEST(tenant, chunk_closed_refuses_unasked_serials)
{
	/* A memfd tenant frees a revoked chunk at its REVOKE: no chunk ever
	 * awaits CHUNK_CLOSED, so every serial (0, the revoked chunk's, any
	 * other) is refused and nothing changes. */
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_b("full", 4);
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t a, b;
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_open(s.t, &b));
	flush(&s);
	T_OK(tenant_seq_close(s.t, a));
	flush(&s);
	T_EQ(s.revokes, 1);
	T_EQ_U64(pool.chunks_used, 1);
	const uint64_t serials[] = {0, 1, 2, 3, UINT64_MAX};
	for (size_t i = 0; i < sizeof(serials) / sizeof(serials[0]); i++)
		T_ERR(tenant_chunk_closed(s.t, serials[i]), KVT_EPROTO);
	T_EQ_U64(pool.chunks_used, 1);
	T_EQ_U64(tenant_chunks(s.t), 1);
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}
