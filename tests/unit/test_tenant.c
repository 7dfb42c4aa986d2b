/*
 * test_tenant.c — tenants: sequences, pages, chunks, sync, refusals and the
 * invariant checker.
 *
 * The tests act like a client: they map the table segment read-only, map
 * every chunk from the CHUNK_ADD events, write K/V bytes of new entries at
 * len + k through the table, and read the lists back after each sync.  Every
 * K/V row carries its (slot, layer, head, position), so compaction that loses
 * or mixes bytes shows up.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "policy.h"
#include "seqid.h"
#include "tenant.h"
#include "test.h"

#define MAX_SLOTS 64
#define MAX_LOG 64

/*
 * Registration limits: a hello asking no quota gets q (0: the whole pool,
 * expected_tenants 1); the daemon-memory cap is kvtrimd's default, 1 GiB.
 */
#define LIM(q)                                                                 \
	(&(struct tenant_limits){.default_quota = (q),                         \
	                         .expected_tenants = 1,                        \
	                         .memory_max = 1ull << 30})

struct sim {
	struct pool *pool;
	struct tenant *t;
	const struct shm_geom *g;
	const uint8_t *table;      /* [g->table_bytes] read-only, like a client */
	uint8_t *chunk[MAX_SLOTS]; /* [KVT_CHUNK_BYTES] each, from CHUNK_ADD */
	int adds, revokes;
	int revoke_sets; /* CHUNK_REVOKE_SET packets (each logged per slot) */
	int n_log;
	int log_type[MAX_LOG];
	uint32_t log_slot[MAX_LOG];
	int fail_sends; /* send() fails while > 0 */
};

static int sim_send(void *ctx, const struct tenant_event *e)
{
	struct sim *s = ctx;
	if (s->fail_sends > 0) {
		s->fail_sends--;
		return KVT_ECONN;
	}
	if (e->type == HANDLE_CHUNK_REVOKE_SET) {
		/* Each set bit as a REVOKE of its own, in slot order. */
		T_EQ(e->slot % HANDLE_REVOKE_SET_SLOTS, 0);
		for (uint32_t i = 0; i < HANDLE_REVOKE_SET_SLOTS; i++) {
			if (!(e->data[i / 8] >> (i % 8) & 1))
				continue;
			struct tenant_event one = {.type = HANDLE_CHUNK_REVOKE,
			                           .slot = e->slot + i, .fd = -1};
			sim_send(ctx, &one);
		}
		s->revoke_sets++;
		return 0;
	}
	T_ASSERT(e->slot < MAX_SLOTS);
	if (s->n_log < MAX_LOG) {
		s->log_type[s->n_log] = (int)e->type;
		s->log_slot[s->n_log++] = e->slot;
	}
	if (e->type == HANDLE_CHUNK_ADD) {
		T_ASSERT(s->chunk[e->slot] == NULL);
		T_EQ_U64(e->size, KVT_CHUNK_BYTES);
		T_ASSERT(e->fd >= 0);
		void *m = mmap(NULL, e->size, PROT_READ | PROT_WRITE,
		               MAP_SHARED, e->fd, 0);
		T_ASSERT(m != MAP_FAILED);
		s->chunk[e->slot] = m;
		s->adds++;
	} else {
		T_EQ(e->type, HANDLE_CHUNK_REVOKE);
		T_ASSERT(s->chunk[e->slot] != NULL);
		munmap(s->chunk[e->slot], KVT_CHUNK_BYTES);
		s->chunk[e->slot] = NULL;
		s->revokes++;
	}
	return 0;
}

static void flush(struct sim *s)
{
	T_OK(tenant_flush_events(s->t, sim_send, s));
}

/* Geometry A: small pages (8192 per chunk), for policies and bytes. */
static struct ipc_hello hello_a(const char *policy)
{
	struct ipc_hello h;
	memset(&h, 0, sizeof(h));
	strcpy(h.name, "a");
	h.geo = (struct kvt_geometry){.n_layers = 2, .n_heads = 4,
	                              .n_kv_heads = 2, .head_dim = 8,
	                              .d_model = 16};
	h.dtype = KVT_DTYPE_F32;
	h.page_tokens = 4;
	h.max_seqs = 4;
	h.max_tokens = 64;
	h.headroom = 4;
	snprintf(h.policy, sizeof(h.policy), "%s", policy);
	return h;
}

/* Geometry B: 512 KiB pages, 4 per chunk, for quota and chunk tests.
 * Each list holds 1 page when empty and 2 once it holds 1..64 entries. */
static struct ipc_hello hello_b(const char *policy, uint64_t quota_chunks)
{
	struct ipc_hello h = hello_a(policy);
	strcpy(h.name, "b");
	h.geo = (struct kvt_geometry){.n_layers = 2, .n_heads = 2,
	                              .n_kv_heads = 2, .head_dim = 1024,
	                              .d_model = 64};
	h.page_tokens = 64;
	h.max_tokens = 512;
	h.headroom = 64;
	h.quota_bytes = quota_chunks * KVT_CHUNK_BYTES;
	return h;
}

/* A tenant of id `id` on pool, with its table mapped as a client would. */
static void sim_new_id(struct sim *s, struct pool *pool,
                       const struct ipc_hello *h, uint64_t default_quota,
                       uint32_t id)
{
	char err[KVT_ERRTEXT_MAX] = "";
	memset(s, 0, sizeof(*s));
	s->pool = pool;
	int rc = tenant_new(pool, id, h, LIM(default_quota), &s->t, err,
	                    sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "tenant_new: %s: %s",
		        kvt_errname(rc), err);
	s->g = tenant_geom(s->t);
	void *m = mmap(NULL, s->g->table_bytes, PROT_READ, MAP_SHARED,
	               tenant_table_fd(s->t), 0);
	T_ASSERT(m != MAP_FAILED);
	s->table = m;
}

static void sim_new(struct sim *s, struct pool *pool,
                    const struct ipc_hello *h, uint64_t default_quota)
{
	sim_new_id(s, pool, h, default_quota, 1);
}

static void sim_free(struct sim *s)
{
	/* s->g lives inside the tenant */
	munmap((void *)s->table, s->g->table_bytes);
	tenant_free(s->t);
	s->t = NULL;
	s->g = NULL;
	for (int i = 0; i < MAX_SLOTS; i++)
		if (s->chunk[i])
			munmap(s->chunk[i], KVT_CHUNK_BYTES);
}

static const struct shm_list *lst(const struct sim *s, uint64_t seq,
                                  uint32_t layer, uint32_t head)
{
	return shm_list_at((void *)s->table, s->g, seqid_slot(seq), layer, head);
}

static uint8_t *page_ptr(const struct sim *s, uint32_t id)
{
	uint32_t ppc = s->g->pages_per_chunk;
	T_ASSERT(id / ppc < MAX_SLOTS);
	T_ASSERT(s->chunk[id / ppc] != NULL);
	return s->chunk[id / ppc] + (size_t)(id % ppc) * s->g->page_bytes;
}

static void rows(const struct sim *s, const struct shm_list *l, uint32_t e,
                 uint32_t **k, uint32_t **v)
{
	uint32_t P = s->g->page_tokens;
	size_t row = (size_t)s->g->head_dim * s->g->elem_bytes;
	T_ASSERT(e / P < l->n_pages);
	uint8_t *pg = page_ptr(s, l->pages[e / P]);
	*k = (uint32_t *)(pg + (e % P) * row);
	*v = (uint32_t *)(pg + P * row + (e % P) * row);
}

/* The K word j of an entry; V holds its complement. */
static uint32_t word(uint32_t slot, uint32_t layer, uint32_t head,
                     uint32_t pos, uint32_t j)
{
	return slot << 28 | layer << 24 | head << 20 | pos << 4 | (j & 15);
}

static void check_clean_at(const struct sim *s, int line)
{
	char d[KVT_ERRTEXT_MAX] = "";
	int v = tenant_check(s->t, d, sizeof(d));
	if (v)
		th_fail(__FILE__, line, "tenant_check: %d violation(s): %s", v,
		        d);
}
#define CLEAN(s) check_clean_at((s), __LINE__)

/* Writes n_new entries into every list of layers [lo, hi) like an engine;
 * n_seen[layer] is the test's own count of tokens seen. */
static void append(const struct sim *s, uint64_t seq, uint32_t lo,
                   uint32_t hi, uint32_t n_new, const uint32_t *n_seen)
{
	uint32_t slot = seqid_slot(seq);
	for (uint32_t layer = lo; layer < hi; layer++)
		for (uint32_t head = 0; head < s->g->n_kv_heads; head++) {
			const struct shm_list *l = lst(s, seq, layer, head);
			for (uint32_t k = 0; k < n_new; k++) {
				uint32_t *kr, *vr;
				rows(s, l, l->len + k, &kr, &vr);
				for (uint32_t j = 0; j < s->g->head_dim; j++) {
					kr[j] = word(slot, layer, head,
					             n_seen[layer] + k, j);
					vr[j] = ~kr[j];
				}
			}
		}
}

static struct ipc_sync_item item(uint64_t seq, uint32_t counter,
                                 uint32_t n_new, uint32_t lo, uint32_t hi)
{
	return (struct ipc_sync_item){.seq = seq, .counter = counter,
	                              .n_new = n_new,
	                              .phase = KVT_PHASE_DECODE,
	                              .layer_lo = lo, .layer_hi = hi};
}

/* Appends, syncs one sequence, updates the test's counters, checks. */
static void step_at(struct sim *s, uint64_t seq, uint32_t *counter,
                    uint32_t lo, uint32_t hi, uint32_t n_new,
                    uint32_t *n_seen, int line)
{
	char err[KVT_ERRTEXT_MAX] = "";
	uint32_t h = hi ? hi : s->g->n_layers;
	append(s, seq, lo, h, n_new, n_seen);
	struct ipc_sync_item it = item(seq, *counter, n_new, lo, hi);
	int rc = tenant_sync(s->t, 0, &it, 1, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, line, "tenant_sync: %s: %s", kvt_errname(rc),
		        err);
	(*counter)++;
	for (uint32_t layer = lo; layer < h; layer++)
		n_seen[layer] += n_new;
	flush(s);
	check_clean_at(s, line);
}
#define STEP(s, seq, ctr, lo, hi, n, seen)                                     \
	step_at((s), (seq), (ctr), (lo), (hi), (n), (seen), __LINE__)

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/*
 * Checks one list: exactly the positions want[0..n) (ascending), each with
 * intact K and V bytes, and ceil((n + headroom) / page_tokens) pages.
 */
static void verify_at(const struct sim *s, uint64_t seq, uint32_t layer,
                      uint32_t head, const uint32_t *want, uint32_t n,
                      int line)
{
	const struct shm_list *l = lst(s, seq, layer, head);
	uint32_t slot = seqid_slot(seq);
	uint32_t P = s->g->page_tokens;
	if (l->len != n)
		th_fail(__FILE__, line, "layer %u head %u: len %u, expected %u",
		        layer, head, l->len, n);
	uint32_t want_pages = (n + s->g->headroom + P - 1) / P;
	if (l->n_pages != want_pages)
		th_fail(__FILE__, line, "n_pages %u, expected %u", l->n_pages,
		        want_pages);
	uint32_t *got = malloc((n ? n : 1) * sizeof(uint32_t));
	T_ASSERT(got);
	for (uint32_t e = 0; e < n; e++) {
		uint32_t *kr, *vr;
		rows(s, l, e, &kr, &vr);
		uint32_t pos = (kr[0] >> 4) & 0xffff;
		for (uint32_t j = 0; j < s->g->head_dim; j++)
			if (kr[j] != word(slot, layer, head, pos, j) ||
			    vr[j] != ~word(slot, layer, head, pos, j))
				th_fail(__FILE__, line,
				        "layer %u head %u entry %u word %u: "
				        "K %#x V %#x", layer, head, e, j,
				        kr[j], vr[j]);
		got[e] = pos;
	}
	qsort(got, n, sizeof(uint32_t), cmp_u32);
	for (uint32_t e = 0; e < n; e++)
		if (got[e] != want[e])
			th_fail(__FILE__, line,
			        "layer %u head %u: kept position #%u is %u, "
			        "expected %u", layer, head, e, got[e], want[e]);
	free(got);
}
#define VERIFY(s, seq, layer, head, want, n)                                   \
	verify_at((s), (seq), (layer), (head), (want), (n), __LINE__)

static void verify_all_at(const struct sim *s, uint64_t seq,
                          const uint32_t *want, uint32_t n, int line)
{
	for (uint32_t layer = 0; layer < s->g->n_layers; layer++)
		for (uint32_t head = 0; head < s->g->n_kv_heads; head++)
			verify_at(s, seq, layer, head, want, n, line);
}
#define VERIFY_ALL(s, seq, want, n) verify_all_at((s), (seq), (want), (n), __LINE__)

/* Everything a refusal must leave alone. */
struct snap {
	struct kvt_tenant_stats st;
	uint8_t *table; /* [table_bytes] */
	struct pool pool;
	uint64_t chunks;
	int adds, revokes;
	int revoke_sets; /* CHUNK_REVOKE_SET packets (each logged per slot) */
};

static void snap_take(const struct sim *s, struct snap *sn)
{
	tenant_stats(s->t, &sn->st);
	sn->table = malloc(s->g->table_bytes);
	T_ASSERT(sn->table);
	memcpy(sn->table, s->table, s->g->table_bytes);
	sn->pool = *s->pool;
	sn->chunks = tenant_chunks(s->t);
	sn->adds = s->adds;
	sn->revokes = s->revokes;
}

static void same_at(struct sim *s, const struct snap *sn, int line)
{
	struct kvt_tenant_stats st;
	tenant_stats(s->t, &st);
	if (memcmp(&st, &sn->st, sizeof(st)))
		th_fail(__FILE__, line, "stats changed");
	if (memcmp(s->table, sn->table, s->g->table_bytes))
		th_fail(__FILE__, line, "table segment changed");
	if (memcmp(s->pool, &sn->pool, sizeof(sn->pool)))
		th_fail(__FILE__, line, "pool changed");
	if (tenant_chunks(s->t) != sn->chunks)
		th_fail(__FILE__, line, "chunks changed");
	flush(s);
	if (s->adds != sn->adds || s->revokes != sn->revokes)
		th_fail(__FILE__, line, "events were queued");
	check_clean_at(s, line);
}
#define SAME(s, sn) same_at((s), (sn), __LINE__)

/* A refused sync: the code, a reason, nothing changed. */
static void refuse_at(struct sim *s, const struct snap *sn,
                      const struct ipc_sync_item *items, uint32_t n, int code,
                      int line)
{
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = tenant_sync(s->t, 0, items, n, err, sizeof(err));
	if (rc != code)
		th_fail(__FILE__, line, "tenant_sync gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (!err[0])
		th_fail(__FILE__, line, "no reason given");
	same_at(s, sn, line);
}
#define REFUSE(s, sn, items, n, code)                                          \
	refuse_at((s), (sn), (items), (n), (code), __LINE__)

/* Ascending 0..n-1 */
static void iota(uint32_t *v, uint32_t n, uint32_t from)
{
	for (uint32_t i = 0; i < n; i++)
		v[i] = from + i;
}

/* ------------------------------------------------------------------ tests */

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

static void new_refused_at(struct pool *pool, const struct ipc_hello *h,
                           int code, int line)
{
	struct tenant *t = (struct tenant *)pool; /* must be reset */
	char err[KVT_ERRTEXT_MAX] = "";
	struct pool before = *pool;
	int rc = tenant_new(pool, 1, h, LIM(0), &t, err, sizeof(err));
	if (rc != code)
		th_fail(__FILE__, line, "tenant_new gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (t != NULL || !err[0])
		th_fail(__FILE__, line, "no reason or a half-made tenant");
	if (memcmp(&before, pool, sizeof(before)))
		th_fail(__FILE__, line, "pool changed");
}
#define NEW_REFUSED(pool, h, code) new_refused_at((pool), (h), (code), __LINE__)

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
 * Issue 14, item 2: two tenants with a sequence in the same slot and
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
	T_ERR(tenant_seq_query(b.t, sa, 0, &q), KVT_ENOSEQ);
	T_ERR(tenant_seq_query(a.t, sb, 0, &q), KVT_ENOSEQ);
	T_ERR(tenant_seq_close(b.t, sa), KVT_ENOSEQ);
	T_ERR(tenant_seq_close(a.t, sb), KVT_ENOSEQ);
	SAME(&a, &na);
	SAME(&b, &nb);
	free(na.table);
	free(nb.table);
	T_OK(tenant_seq_query(a.t, sa, 0, &q));
	T_EQ(q.syncs, 1);
	T_EQ(q.len_hi, 3);
	T_OK(tenant_seq_query(b.t, sb, 0, &q));
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
	T_ERR(tenant_seq_query(a.t, sa, 0, &q), KVT_ENOSEQ);
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
	T_OK(tenant_seq_query(s.t, id, 0, &q));
	T_EQ(q.syncs, 0);
	T_EQ(q.seen_lo, 0);
	T_EQ(q.seen_hi, 0);
	T_EQ(q.len_lo, 0);
	T_EQ(q.len_hi, 0);
	struct ipc_sync_item it = item(id, 0, 3, 0, 1);
	T_OK(tenant_sync(s.t, 0, &it, 1, NULL, 0));
	it = item(id, 1, 2, 0, 0);
	T_OK(tenant_sync(s.t, 0, &it, 1, NULL, 0));
	T_OK(tenant_seq_query(s.t, id, 0, &q));
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
 * A query names the sync in doubt by its number: applied, `last` is that
 * number; not (it has not arrived), the query voids it, and when it does
 * arrive, late, it is refused as a whole (both sequences of it), changes
 * nothing, and the next sync, numbered higher, is applied.  Queries that
 * name no sync (after 0) or one already applied void nothing.
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
	T_OK(tenant_seq_query(s.t, a, 5, &q));
	T_EQ_U64(q.last, 5);
	T_EQ(q.syncs, 1);
	T_OK(tenant_seq_query(s.t, b, 0, &q));
	T_EQ_U64(q.last, 5);
	/* 7 is asked about before it arrives: not applied, voided. */
	T_OK(tenant_seq_query(s.t, a, 7, &q));
	T_EQ_U64(q.last, 5);
	T_EQ(q.syncs, 1);
	it[0] = item(a, 1, 1, 0, 0);
	it[1] = item(b, 1, 1, 0, 0);
	T_ERR(tenant_sync(s.t, 7, it, 2, err, sizeof(err)), KVT_ESTALE);
	T_ASSERT(strstr(err, "given up"));
	T_OK(tenant_seq_query(s.t, b, 7, &q)); /* b was in 7 too */
	T_EQ(q.syncs, 1);
	T_EQ(q.len_lo, 2);
	T_OK(tenant_seq_query(s.t, a, 0, &q));
	T_EQ(q.syncs, 1);
	T_EQ(q.len_lo, 3);
	/* An older number is void too; the next one is applied. */
	T_ERR(tenant_sync(s.t, 6, it, 2, NULL, 0), KVT_ESTALE);
	T_OK(tenant_sync(s.t, 8, it, 2, NULL, 0));
	T_OK(tenant_seq_query(s.t, a, 8, &q));
	T_EQ_U64(q.last, 8);
	T_EQ(q.syncs, 2);
	T_EQ(q.len_lo, 4);
	/* Closing and reopening forgets both marks. */
	T_OK(tenant_seq_close(s.t, a));
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_query(s.t, a, 0, &q));
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
	T_ERR(tenant_seq_query(s.t, lost1, 0, &q), KVT_ENOSEQ);
	T_ERR(tenant_seq_query(s.t, lost2, 0, &q), KVT_ENOSEQ);
	T_OK(tenant_seq_query(s.t, a, 0, &q));
	T_OK(tenant_seq_query(s.t, b, 0, &q));
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

/*
 * The tenant's own read-write mapping of a segment: this test process is
 * the "daemon", so /proc/self/maps lists it (the rw-s mapping of the
 * memfd's inode).
 */
static uint8_t *daemon_mapping(int fd)
{
	struct stat st;
	T_EQ(fstat(fd, &st), 0);
	FILE *f = fopen("/proc/self/maps", "r");
	T_ASSERT(f);
	char line[512];
	unsigned long lo = 0, hi, ino;
	char perm[8];
	int found = 0;
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perm,
		               &ino) == 4 &&
		        ino == (unsigned long)st.st_ino &&
		        !strcmp(perm, "rw-s");
	fclose(f);
	T_ASSERT(found);
	return (uint8_t *)lo;
}

TEST(tenant, check_detects_corrupt_table)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t sq;
	T_OK(tenant_seq_open(s.t, &sq));
	flush(&s);
	uint32_t ctr = 0, seen[2] = {0, 0};
	STEP(&s, sq, &ctr, 0, 0, 4, seen);

	/* A slot opened and closed again: its records were written. */
	uint64_t sq2;
	T_OK(tenant_seq_open(s.t, &sq2));
	T_OK(tenant_seq_close(s.t, sq2));
	flush(&s);

	/* The client cannot write the table (sealed); the daemon's own
	 * mapping, in this same process, stands in for a daemon bug. */
	const struct shm_geom *g = s.g;
	T_ASSERT(mmap(NULL, g->table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
	              tenant_table_fd(s.t), 0) == MAP_FAILED);
	uint8_t *rw = daemon_mapping(tenant_table_fd(s.t));
	struct shm_list *l = shm_list_at(rw, g, seqid_slot(sq), 1, 1);
	T_EQ(l->n_pages, 2);
	char d[KVT_ERRTEXT_MAX];

	uint32_t keep = l->pages[1];
	l->pages[1] = l->pages[0]; /* a page twice */
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	T_ASSERT(d[0] != '\0');
	l->pages[1] = 999999; /* a page that does not exist */
	d[0] = '\0';
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	T_ASSERT(d[0] != '\0');
	l->pages[1] = keep;
	CLEAN(&s);

	l->len++;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	l->len--;
	l->n_pages++;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	l->n_pages--;
	l->epoch += 7;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	l->epoch -= 7;
	CLEAN(&s);

	/* a closed slot that claims entries */
	struct shm_list *c = shm_list_at(rw, g, seqid_slot(sq2), 0, 0);
	c->len = 1;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	c->len = 0;
	struct shm_table_hdr *hd = (struct shm_table_hdr *)rw;
	hd->magic ^= 1;
	T_ASSERT(tenant_check(s.t, NULL, 0) > 0);
	hd->magic ^= 1;
	CLEAN(&s);

	/* the daemon never trusted the table: the next sync repairs it */
	l->pages[0] = 12345;
	struct ipc_sync_item it = item(sq, ctr, 0, 0, 0);
	T_OK(tenant_sync(s.t, 0, &it, 1, NULL, 0));
	CLEAN(&s);
	sim_free(&s);
}

TEST(tenant, random_ops_keep_invariants)
{
	/* Many sequences, random opens, closes and batched syncs, checked
	 * after every operation against the streaming rule. */
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("streaming:sinks=1,tokens=9");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t id[4];
	int open[4] = {0};
	uint32_t ctr[4], seen[4][2];
	uint32_t rng = 12345;
	char err[KVT_ERRTEXT_MAX];
	for (int op = 0; op < 400; op++) {
		rng = rng * 1103515245u + 12345u;
		uint32_t r = rng >> 8;
		int k = (int)(r % 4);
		if (!open[k] || r % 23 == 0) {
			if (open[k])
				T_OK(tenant_seq_close(s.t, id[k]));
			T_OK(tenant_seq_open(s.t, &id[k]));
			open[k] = 1;
			ctr[k] = 0;
			seen[k][0] = seen[k][1] = 0;
		} else {
			struct ipc_sync_item its[4];
			int who[4];
			uint32_t n = 0, lo = 0, hi = 0;
			if (r % 5 == 0) {
				lo = (r >> 4) % 2;
				hi = lo + 1;
			}
			for (int j = 0; j < 4; j++) {
				if (!open[j] || (j != k && (r >> (8 + j)) % 2))
					continue;
				uint32_t nn = (r >> (12 + 2 * j)) % 5;
				append(&s, id[j], lo, hi ? hi : 2, nn, seen[j]);
				who[n] = j;
				its[n++] = item(id[j], ctr[j], nn, lo, hi);
			}
			if (tenant_sync(s.t, 0, its, n, err, sizeof(err)))
				th_fail(__FILE__, __LINE__, "op %d: %s", op,
				        err);
			for (uint32_t i = 0; i < n; i++) {
				int j = who[i];
				ctr[j]++;
				for (uint32_t layer = lo; layer < (hi ? hi : 2);
				     layer++)
					seen[j][layer] += its[i].n_new;
			}
		}
		flush(&s);
		CLEAN(&s);
		for (int j = 0; j < 4; j++) {
			if (!open[j])
				continue;
			for (uint32_t layer = 0; layer < 2; layer++) {
				uint32_t n = seen[j][layer], want[16], m;
				if (n <= 9) {
					iota(want, n, 0);
					m = n;
				} else {
					want[0] = 0;
					iota(want + 1, 8, n - 8);
					m = 9;
				}
				VERIFY(&s, id[j], layer, 0, want, m);
				VERIFY(&s, id[j], layer, 1, want, m);
			}
		}
	}
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}

/* ------------------------------------------------------------ policies */

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

/* ------------------------------------------------------------ admission */

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
	 * lists of 100 entries), newlen 24 * 4, and the policy arena of one
	 * decide, twice 2 heads * 100 entries * 64 bytes. */
	T_EQ_U64(m->scratch, 800 + 224 + 2 * sizeof(struct policy_head) +
	                             2400 + 96 + 2 * 2 * 100 * 64);
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
	/* + staged rows of one sync 8 * 200 * 4 (gathered by part), entry scratch 2400 * 4 * 4,
	 * and per entry 64 + head_dim 16 * 4 + 8 queries * 4 heads * 4. */
	T_EQ_U64(m->scratch, 800 + 224 + 2 * sizeof(struct policy_head) +
	                             8 * 200 * 4 + 2400 + 96 +
	                             2400 * 4 * 4 +
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
	 * The geometry: 4-byte pages (page_tokens 1, head_dim 1,
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

/* Pages of [map, map + bytes) in the page cache (mincore). */
static size_t resident_pages(const void *map, size_t bytes)
{
	size_t ps = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + ps - 1) / ps;
	unsigned char *v = malloc(n);
	T_ASSERT(v);
	T_EQ(mincore((void *)map, bytes, v), 0);
	size_t r = 0;
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

TEST(tenant, check_reads_no_untouched_table_page)
{
	/*
	 * 64 slots of 16 layers x 16 KV heads, records of 64 bytes (pages of
	 * one entry, max_tokens 4, headroom 1: 5 page ids): a 1 MiB table,
	 * 16 KiB (4 pages) per slot.
	 */
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h;
	memset(&h, 0, sizeof(h));
	strcpy(h.name, "wide");
	h.geo = (struct kvt_geometry){16, 16, 16, 8, 16};
	h.dtype = KVT_DTYPE_F32;
	h.page_tokens = 1;
	h.max_seqs = 64;
	h.max_tokens = 4;
	h.headroom = 1;
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	T_EQ_U64(s.g->table_bytes, 128 + 64 * 256 * 64);
	uint64_t a, b;
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_open(s.t, &b));
	T_OK(tenant_seq_close(s.t, b)); /* closed, but its records written */
	flush(&s);
	size_t before = resident_pages(s.table, s.g->table_bytes);
	CLEAN(&s);
	CLEAN(&s);
	size_t after = resident_pages(s.table, s.g->table_bytes);
	/* The header page and two slots' 4 pages each (one more where a
	 * slot straddles a page); reading all 64 slots would make 257. */
	T_ASSERT(before <= 10);
	T_EQ_U64(after, before);
	T_OK(tenant_seq_close(s.t, a));
	flush(&s);
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}
