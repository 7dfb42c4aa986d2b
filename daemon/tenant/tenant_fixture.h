/*
 * tenant_fixture.h — the simulated client of the tenant tests
 * (daemon/tenant/tenant*_test.c), header-only so each suite file keeps its
 * own copy and no helper name leaves its file.
 *
 * The tests act like a client: they map the table segment read-only, map
 * every chunk from the CHUNK_ADD events, write K/V bytes of new entries at
 * len + k through the table, and read the lists back after each sync.  Every
 * K/V row carries its (slot, layer, head, position), so compaction that loses
 * or mixes bytes shows up.  The checking macros (CLEAN, STEP, VERIFY, SAME,
 * REFUSE, NEW_REFUSED) report the caller's file and line.
 *
 * A test of how a tenant takes its policy's device rule (tenant_window_test.c,
 * tenant_attn_test.c) defines TENANT_FIXTURE_RULE before including it: it
 * gets tenant_int.h, a fake rule lookup for a backend table and a device
 * tenant as far as the rule's setup reads it (the last section).
 */
#ifndef KVT_TENANT_FIXTURE_H
#define KVT_TENANT_FIXTURE_H

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

static inline int sim_send(void *ctx, const struct tenant_event *e)
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

static inline void flush(struct sim *s)
{
	T_OK(tenant_flush_events(s->t, sim_send, s));
}

/* Geometry A: small pages (8192 per chunk), for policies and bytes. */
static inline struct ipc_hello hello_a(const char *policy)
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
static inline struct ipc_hello hello_b(const char *policy,
                                       uint64_t quota_chunks)
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
static inline void sim_new_id(struct sim *s, struct pool *pool,
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

static inline void sim_new(struct sim *s, struct pool *pool,
                           const struct ipc_hello *h, uint64_t default_quota)
{
	sim_new_id(s, pool, h, default_quota, 1);
}

static inline void sim_free(struct sim *s)
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

static inline const struct shm_list *lst(const struct sim *s, uint64_t seq,
                                         uint32_t layer, uint32_t head)
{
	return shm_list_at((void *)s->table, s->g, seqid_slot(seq), layer, head);
}

static inline uint8_t *sim_page(const struct sim *s, uint32_t id)
{
	uint32_t ppc = s->g->pages_per_chunk;
	T_ASSERT(id / ppc < MAX_SLOTS);
	T_ASSERT(s->chunk[id / ppc] != NULL);
	return s->chunk[id / ppc] + (size_t)(id % ppc) * s->g->page_bytes;
}

static inline void rows(const struct sim *s, const struct shm_list *l,
                        uint32_t e, uint32_t **k, uint32_t **v)
{
	uint32_t P = s->g->page_tokens;
	size_t row = (size_t)s->g->head_dim * s->g->elem_bytes;
	T_ASSERT(e / P < l->n_pages);
	uint8_t *pg = sim_page(s, l->pages[e / P]);
	*k = (uint32_t *)(pg + (e % P) * row);
	*v = (uint32_t *)(pg + P * row + (e % P) * row);
}

/* The K word j of an entry; V holds its complement. */
static inline uint32_t word(uint32_t slot, uint32_t layer, uint32_t head,
                            uint32_t pos, uint32_t j)
{
	return slot << 28 | layer << 24 | head << 20 | pos << 4 | (j & 15);
}

static inline void check_clean_at(const struct sim *s, const char *file,
                                  int line)
{
	char d[KVT_ERRTEXT_MAX] = "";
	int v = tenant_check(s->t, d, sizeof(d));
	if (v)
		th_fail(file, line, "tenant_check: %d violation(s): %s", v,
		        d);
}
#define CLEAN(s) check_clean_at((s), __FILE__, __LINE__)

/* Writes n_new entries into every list of layers [lo, hi) like an engine;
 * n_seen[layer] is the test's own count of tokens seen. */
static inline void append(const struct sim *s, uint64_t seq, uint32_t lo,
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

static inline struct ipc_sync_item item(uint64_t seq, uint32_t counter,
                                        uint32_t n_new, uint32_t lo,
                                        uint32_t hi)
{
	return (struct ipc_sync_item){.seq = seq, .counter = counter,
	                              .n_new = n_new,
	                              .phase = KVT_PHASE_DECODE,
	                              .layer_lo = lo, .layer_hi = hi};
}

/* Appends, syncs one sequence, updates the test's counters, checks. */
static inline void step_at(struct sim *s, uint64_t seq, uint32_t *counter,
                           uint32_t lo, uint32_t hi, uint32_t n_new,
                           uint32_t *n_seen, const char *file, int line)
{
	char err[KVT_ERRTEXT_MAX] = "";
	uint32_t h = hi ? hi : s->g->n_layers;
	append(s, seq, lo, h, n_new, n_seen);
	struct ipc_sync_item it = item(seq, *counter, n_new, lo, hi);
	int rc = tenant_sync(s->t, 0, &it, 1, err, sizeof(err));
	if (rc)
		th_fail(file, line, "tenant_sync: %s: %s", kvt_errname(rc),
		        err);
	(*counter)++;
	for (uint32_t layer = lo; layer < h; layer++)
		n_seen[layer] += n_new;
	flush(s);
	check_clean_at(s, file, line);
}
#define STEP(s, seq, ctr, lo, hi, n, seen)                                     \
	step_at((s), (seq), (ctr), (lo), (hi), (n), (seen), __FILE__, __LINE__)

static inline int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/*
 * Checks one list: exactly the positions want[0..n) (ascending), each with
 * intact K and V bytes, and ceil((n + headroom) / page_tokens) pages.
 */
static inline void verify_at(const struct sim *s, uint64_t seq, uint32_t layer,
                             uint32_t head, const uint32_t *want, uint32_t n,
                             const char *file, int line)
{
	const struct shm_list *l = lst(s, seq, layer, head);
	uint32_t slot = seqid_slot(seq);
	uint32_t P = s->g->page_tokens;
	if (l->len != n)
		th_fail(file, line, "layer %u head %u: len %u, expected %u",
		        layer, head, l->len, n);
	uint32_t want_pages = (n + s->g->headroom + P - 1) / P;
	if (l->n_pages != want_pages)
		th_fail(file, line, "n_pages %u, expected %u", l->n_pages,
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
				th_fail(file, line,
				        "layer %u head %u entry %u word %u: "
				        "K %#x V %#x", layer, head, e, j,
				        kr[j], vr[j]);
		got[e] = pos;
	}
	qsort(got, n, sizeof(uint32_t), cmp_u32);
	for (uint32_t e = 0; e < n; e++)
		if (got[e] != want[e])
			th_fail(file, line,
			        "layer %u head %u: kept position #%u is %u, "
			        "expected %u", layer, head, e, got[e], want[e]);
	free(got);
}
#define VERIFY(s, seq, layer, head, want, n)                                   \
	verify_at((s), (seq), (layer), (head), (want), (n), __FILE__, __LINE__)

static inline void verify_all_at(const struct sim *s, uint64_t seq,
                                 const uint32_t *want, uint32_t n,
                                 const char *file, int line)
{
	for (uint32_t layer = 0; layer < s->g->n_layers; layer++)
		for (uint32_t head = 0; head < s->g->n_kv_heads; head++)
			verify_at(s, seq, layer, head, want, n, file, line);
}
#define VERIFY_ALL(s, seq, want, n)                                            \
	verify_all_at((s), (seq), (want), (n), __FILE__, __LINE__)

/* Everything a refusal must leave alone. */
struct snap {
	struct kvt_tenant_stats st;
	uint8_t *table; /* [table_bytes] */
	struct pool pool;
	uint64_t chunks;
	int adds, revokes;
	int revoke_sets; /* CHUNK_REVOKE_SET packets (each logged per slot) */
};

static inline void snap_take(const struct sim *s, struct snap *sn)
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

static inline void same_at(struct sim *s, const struct snap *sn,
                           const char *file, int line)
{
	struct kvt_tenant_stats st;
	tenant_stats(s->t, &st);
	if (memcmp(&st, &sn->st, sizeof(st)))
		th_fail(file, line, "stats changed");
	if (memcmp(s->table, sn->table, s->g->table_bytes))
		th_fail(file, line, "table segment changed");
	if (memcmp(s->pool, &sn->pool, sizeof(sn->pool)))
		th_fail(file, line, "pool changed");
	if (tenant_chunks(s->t) != sn->chunks)
		th_fail(file, line, "chunks changed");
	flush(s);
	if (s->adds != sn->adds || s->revokes != sn->revokes)
		th_fail(file, line, "events were queued");
	check_clean_at(s, file, line);
}
#define SAME(s, sn) same_at((s), (sn), __FILE__, __LINE__)

/* A refused sync: the code, a reason, nothing changed. */
static inline void refuse_at(struct sim *s, const struct snap *sn,
                             const struct ipc_sync_item *items, uint32_t n,
                             int code, const char *file, int line)
{
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = tenant_sync(s->t, 0, items, n, err, sizeof(err));
	if (rc != code)
		th_fail(file, line, "tenant_sync gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (!err[0])
		th_fail(file, line, "no reason given");
	same_at(s, sn, file, line);
}
#define REFUSE(s, sn, items, n, code)                                          \
	refuse_at((s), (sn), (items), (n), (code), __FILE__, __LINE__)

/* Ascending 0..n-1 */
static inline void iota(uint32_t *v, uint32_t n, uint32_t from)
{
	for (uint32_t i = 0; i < n; i++)
		v[i] = from + i;
}


static inline void new_refused_at(struct pool *pool, const struct ipc_hello *h,
                                  int code, const char *file, int line)
{
	struct tenant *t = (struct tenant *)pool; /* must be reset */
	char err[KVT_ERRTEXT_MAX] = "";
	struct pool before = *pool;
	int rc = tenant_new(pool, 1, h, LIM(0), &t, err, sizeof(err));
	if (rc != code)
		th_fail(file, line, "tenant_new gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (t != NULL || !err[0])
		th_fail(file, line, "no reason or a half-made tenant");
	if (memcmp(&before, pool, sizeof(before)))
		th_fail(file, line, "pool changed");
}
#define NEW_REFUSED(pool, h, code)                                             \
	new_refused_at((pool), (h), (code), __FILE__, __LINE__)


#ifdef TENANT_FIXTURE_RULE
#include <stdio.h>

#include "tenant_int.h"

/* What the fake rule lookup hands out (fake, when have_rule) and the name
 * it was last asked (asked). */
static struct kvt_backend_rule fake;
static int have_rule;
static char asked[32];

/* fake's run: never called, the tests plan no job. */
static inline int fake_run(void *ctx, const struct kvt_backend_paged *pg,
                           uint32_t n_records,
                           const struct kvt_backend_rule_geom *g,
                           const void *params, const void *jobs, uint32_t n,
                           uint32_t *out, uint32_t out_words, void *stream)
{
	return KVT_ESYS;
}

/* A backend's rule member: fake or none, whatever the name. */
static inline const struct kvt_backend_rule *fake_lookup(const char *name)
{
	snprintf(asked, sizeof(asked), "%s", name ? name : "(null)");
	return have_rule ? &fake : NULL;
}

/* A device tenant called name of policy spec on backend o, as far as the
 * lookup of its device rules reads it: the geometry, the policy, the
 * backend, and stand-ins for the chunk bases and device staging. */
static inline void tenant_of(struct tenant *t, const char *name,
                             const char *spec, const struct kvt_backend_ops *o)
{
	static char base; /* stands in for the chunk bases and staging */
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->g = (struct shm_geom){.max_seqs = 2, .n_layers = 2, .n_heads = 4,
	                         .n_kv_heads = 2, .head_dim = 8, .d_model = 16,
	                         .page_tokens = 4, .max_tokens = 32,
	                         .headroom = 4, .stage_tokens = 8};
	t->lists_per_seq = t->g.n_layers * t->g.n_kv_heads;
	const struct policy_geom pg = {
		.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
		.d_model = 16, .page_tokens = 4, .dtype = KVT_DTYPE_F32,
		.headroom = 4,
	};
	char err[256];
	T_OK(policy_create(spec, &pg, &t->pol, err, sizeof(err)));
	t->bops = o;
	t->dev = 1;
	t->dsync.dbases = (void **)&base;
	t->dstage.chunk.base = &base;
}

/* The code under test as a test drives it: setup makes t a tenant of
 * policy spec on o and sets its rule up (0, or the error with the reason
 * in err); taken asserts that t holds fake and what goes with it, none
 * that it holds nothing of a rule; done frees t. */
struct rule_setup {
	int (*setup)(const char *spec, const struct kvt_backend_ops *o,
	             struct tenant *t, char *err, size_t errlen);
	void (*taken)(const struct tenant *t);
	void (*none)(const struct tenant *t);
	void (*done)(struct tenant *t);
};

/* A policy and the backend rule of its header's layout. */
struct rule_case {
	const char *spec, *rule;
	uint32_t version, params, job;
};

/* Each case's rule, of the policy's layout, offered by o's lookup: asked
 * by its name and taken. */
static inline void rule_cases_taken(const struct rule_setup *rs,
                                    const struct kvt_backend_ops *o,
                                    const struct rule_case *c, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		struct tenant t;
		char err[256];
		fake = (struct kvt_backend_rule){c[k].rule, c[k].version,
		                                 c[k].params, c[k].job,
		                                 fake_run};
		have_rule = 1;
		T_OK(rs->setup(c[k].spec, o, &t, err, sizeof(err)));
		T_EQ_STR(asked, c[k].rule);
		rs->taken(&t);
		rs->done(&t);
	}
}

/* good (the rule of spec's policy, of its layout) with its version, its
 * params' bytes or its job's bytes off in turn: each refused with
 * KVT_ENOTSUP and a reason naming the rule, both layout versions and
 * another build, and nothing kept. */
static inline void
rule_other_layouts_refused(const struct rule_setup *rs,
                           const struct kvt_backend_ops *o, const char *spec,
                           const struct kvt_backend_rule *good)
{
	struct kvt_backend_rule bad[3] = {*good, *good, *good};
	bad[0].version++;
	bad[1].params_bytes += 4;
	bad[2].job_bytes -= 4;
	have_rule = 1;
	for (int k = 0; k < 3; k++) {
		struct tenant t;
		char err[256], want[64];
		fake = bad[k];
		T_EQ(rs->setup(spec, o, &t, err, sizeof(err)), KVT_ENOTSUP);
		snprintf(want, sizeof(want), "device rule %s", good->name);
		T_ASSERT(strstr(err, want) != NULL);
		T_ASSERT(strstr(err, "another build") != NULL);
		snprintf(want, sizeof(want), "layout version %u",
		         bad[k].version);
		T_ASSERT(strstr(err, want) != NULL);
		snprintf(want, sizeof(want), "this kvtrimd's %u", good->version);
		T_ASSERT(strstr(err, want) != NULL);
		rs->none(&t);
		rs->done(&t);
	}
}
#endif

#endif
