/*
 * policy_fixture.h — the miniature tenant of the policy tests
 * (policies/policy*_test.c), header-only (static inline) so no helper
 * name leaves a test file.
 *
 * The fixture (struct fx) is a miniature tenant: head_dim 1 f32 pages, a
 * staging array indexed by position, per-entry and layer state, and the
 * same compaction (compact_plan + policy_move_entries) the tenant applies,
 * so multi-sync scenarios run exactly as in the daemon.  With head_dim 1
 * and scale 1, a query q, a key k and a stored lse L give the attention
 * weight exp(q k - L): keys are ln(a) so that a query of 1 with lse 0 puts
 * weight a on an entry.  FX_EXPECT and refused_why report the caller's file.
 */
#ifndef KVT_POLICY_FIXTURE_H
#define KVT_POLICY_FIXTURE_H

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "compact.h"
#include "policy.h"
#include "shm.h"
#include "test.h"
#include "weights.h"
#define FX_MAX 96   /* entries per list */
#define FX_KV 4     /* most KV heads */
#define FX_D 4      /* d_model */
#define FX_PT 4     /* page_tokens */
#define FX_H 8      /* most query heads */

struct fx {
	struct policy *p;
	struct policy_geom ge;
	uint32_t n_seen;
	uint32_t layer; /* the layer its lists belong to (0 unless set) */
	uint32_t len[FX_KV];
	uint32_t pos[FX_KV][FX_MAX];
	float ent[FX_KV][FX_MAX * 8];
	float kv[FX_KV][FX_MAX * 2]; /* pages of [K: 4][V: 4] floats */
	void *pages[FX_KV][FX_MAX / FX_PT];
	uint8_t drop[FX_KV][FX_MAX];
	_Alignas(16) uint8_t state[4096];
	/* staged rows by position: [x: FX_D][q: n_heads][lse: n_heads], the
	 * parts the policy reads only (ipc/shm.h), q at qo and lse at lo */
	float stage[FX_MAX][FX_D + 2 * FX_H];
	uint32_t inputs;
	uint64_t qo, lo;
	uint32_t fetches; /* fx_plan_sync: positions read back by the plans */
};

static inline struct policy *make_g(const char *spec,
                                     const struct policy_geom *ge)
{
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, ge, &p, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "policy_create(\"%s\"): %s: %s",
		        spec, kvt_errname(rc), err);
	return p;
}

static inline struct policy_geom geom(uint32_t n_heads, uint32_t n_kv)
{
	return (struct policy_geom){.n_layers = 2, .n_heads = n_heads,
	                            .n_kv_heads = n_kv, .head_dim = 1,
	                            .d_model = FX_D, .page_tokens = FX_PT,
	                            .dtype = KVT_DTYPE_F32, .headroom = 16};
}

static inline struct policy *make(const char *spec)
{
	struct policy_geom ge = geom(2, 1);
	return make_g(spec, &ge);
}

static inline void fx_init(struct fx *f, const char *spec, uint32_t n_heads,
                           uint32_t n_kv)
{
	memset(f, 0, sizeof(*f));
	f->ge = geom(n_heads, n_kv);
	f->p = make_g(spec, &f->ge);
	T_ASSERT(f->p->layer_state_bytes <= sizeof(f->state));
	T_ASSERT(f->p->entry_floats <= 8);
	uint64_t n;
	f->inputs = policy_inputs_of(f->p->ops->needs);
	shm_stage_layout(f->inputs, FX_D, n_heads, 1, &f->qo, &f->lo, &n);
	for (uint32_t h = 0; h < FX_KV; h++)
		for (uint32_t pg = 0; pg < FX_MAX / FX_PT; pg++)
			f->pages[h][pg] = f->kv[h] + pg * 2 * FX_PT;
}

static inline const float *fx_row(void *ctx, uint32_t pos)
{
	struct fx *f = ctx;
	return pos < f->n_seen ? f->stage[pos] : NULL;
}

/*
 * One sync of n new tokens.  a[k][h]: the new entry's key in head h is
 * ln(a) (a <= 0 gives key 0); x[k] the token's x (NULL = zeros); q[k][j]
 * and lse[k][j] per query head (NULL = 1 and 0).  Returns decide()'s rc.
 */
static inline int fx_sync(struct fx *f, uint32_t n, enum kvt_phase phase,
                          const float (*a)[FX_KV], const float (*x)[FX_D],
                          const float (*q)[FX_H], const float (*lse)[FX_H])
{
	uint32_t H = f->ge.n_heads, nkv = f->ge.n_kv_heads;
	uint32_t ef = f->p->entry_floats;
	/* packed as decide() wants them: q, lse [n][H] */
	static float xs[FX_MAX][FX_D], qs[FX_MAX * FX_H], ls[FX_MAX * FX_H];
	for (uint32_t k = 0; k < n; k++) {
		uint32_t pos = f->n_seen + k;
		float *row = f->stage[pos];
		for (uint32_t d = 0; d < FX_D; d++) {
			xs[k][d] = x ? x[k][d] : 0.0f;
			if (f->inputs & KVT_INPUT_X)
				row[d] = xs[k][d];
		}
		for (uint32_t j = 0; j < H; j++) {
			qs[k * H + j] = q ? q[k][j] : 1.0f;
			ls[k * H + j] = lse ? lse[k][j] : 0.0f;
			if (f->inputs & KVT_INPUT_Q)
				row[f->qo + j] = qs[k * H + j];
			if (f->inputs & KVT_INPUT_LSE)
				row[f->lo + j] = ls[k * H + j];
		}
		for (uint32_t h = 0; h < nkv; h++) {
			uint32_t e = f->len[h] + k;
			T_ASSERT(e < FX_MAX);
			f->pos[h][e] = pos;
			float av = a ? a[k][h] : 0.0f;
			f->kv[h][(e / FX_PT) * 2 * FX_PT + e % FX_PT] =
				av > 0 ? logf(av) : 0.0f;
			memset(&f->ent[h][e * ef], 0, ef * sizeof(float));
		}
	}
	f->n_seen += n;
	struct policy_head heads[FX_KV];
	for (uint32_t h = 0; h < nkv; h++) {
		f->len[h] += n;
		memset(f->drop[h], 0, FX_MAX);
		heads[h] = (struct policy_head){
			.pos = f->pos[h], .ent = ef ? f->ent[h] : NULL,
			.pages = f->pages[h], .len = f->len[h],
			.drop = f->drop[h]};
	}
	struct policy_layer l = {
		.layer = f->layer, .phase = phase, .n_new = n, .n_seen = f->n_seen,
		.x = &xs[0][0], .q = qs, .lse = ls,
		.staged = fx_row, .staged_ctx = f, .heads = heads,
		.state = f->p->layer_state_bytes ? f->state : NULL,
	};
	/* Staged rows are [x: FX_D][q: H][lse: H], the ring layout for
	 * d_model FX_D and head_dim 1. */
	int rc = policy_decide(f->p, &l);
	if (rc)
		return rc;
	for (uint32_t h = 0; h < nkv; h++) {
		uint32_t moves[2 * FX_MAX], nl;
		uint32_t nm = compact_plan(f->drop[h], f->len[h], moves, &nl);
		void *pg[FX_MAX / FX_PT];
		for (uint32_t i = 0; i < FX_MAX / FX_PT; i++)
			pg[i] = f->pages[h][i];
		compact_cpu(pg, FX_PT, sizeof(float), moves, nm);
		policy_move_entries(f->pos[h], ef ? f->ent[h] : NULL, ef, moves,
		                    nm);
		f->len[h] = nl;
	}
	return 0;
}

/* One token per sync, decode phase. */
static inline void fx_step(struct fx *f, const float *a, const float *x)
{
	float aa[1][FX_KV], xx[1][FX_D];
	memcpy(aa[0], a, sizeof(aa[0]));
	memcpy(xx[0], x ? x : (const float[FX_D]){0}, sizeof(xx[0]));
	T_OK(fx_sync(f, 1, KVT_PHASE_DECODE, aa, xx, NULL, NULL));
}

/* A small LCG, so a run is the same every time. */
static inline uint32_t fx_next(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* policy_dev_layer.fetch_pos over the fixture's lists, counted. */
static inline const uint32_t *fx_fetch_pos(void *ctx, uint32_t h)
{
	struct fx *f = ctx;
	f->fetches++;
	return f->pos[h];
}

/* One sync of n tokens of random keys on a policy with a device rule
 * (policy_ops.device): its plan first, then decide() on the fixture; each
 * job's drop count must be the entries decide() dropped from its list, a
 * list without a job drops none, and the offsets follow each other.  The
 * same plan where the positions live on the device only (pos NULL, read
 * back through fetch_pos, counted in f->fetches) gives the same jobs and
 * word.  word is the plan's word of the (sequence, layer). */
static inline void fx_plan_sync(struct fx *f, uint32_t n, uint32_t *word,
                                uint32_t *seed)
{
	const struct policy_device_rule *dr = f->p->ops->device;
	const uint32_t nkv = f->ge.n_kv_heads;
	uint32_t before[FX_KV];
	const uint32_t *pos[FX_KV];
	const uint8_t cur[FX_KV] = {0};
	for (uint32_t h = 0; h < nkv; h++) {
		before[h] = f->len[h];
		pos[h] = f->pos[h];
	}
	const struct policy_dev_layer c = {
		.len = before, .pos = pos, .list_rec = 0, .state_rec = 0,
		.cur = cur, .word = word, .drop_off = 5,
	};
	const enum kvt_phase ph = f->n_seen ? KVT_PHASE_DECODE
	                                    : KVT_PHASE_PREFILL;
	const struct policy_layer l = {
		.layer = f->layer, .phase = ph, .n_new = n,
		.n_seen = f->n_seen + n,
	};
	_Alignas(16) char jobs[FX_KV * 256], jobs2[FX_KV * 256];
	struct policy_dev_job hj[FX_KV], hj2[FX_KV];
	uint32_t nj = 99, nj2 = 98, word2 = *word;
	char err[128];
	T_ASSERT(dr->job_bytes <= 256);
	memset(jobs, 0, sizeof(jobs));
	memset(jobs2, 0, sizeof(jobs2));
	memset(hj2, 0, sizeof(hj2));
	struct policy_dev_layer c2 = c;
	c2.pos = NULL;
	c2.fetch_pos = fx_fetch_pos;
	c2.fetch_ctx = f;
	c2.word = &word2;
	T_OK(dr->plan(f->p, &l, &c2, jobs2, hj2, &nj2, err, sizeof(err)));
	T_OK(dr->plan(f->p, &l, &c, jobs, hj, &nj, err, sizeof(err)));
	T_ASSERT(nj <= nkv);
	T_EQ(nj2, nj);
	T_EQ(word2, *word);
	T_ASSERT(memcmp(hj2, hj, nj * sizeof(*hj)) == 0);
	T_ASSERT(memcmp(jobs2, jobs, nj * dr->job_bytes) == 0);

	float a[FX_MAX][FX_KV];
	for (uint32_t k = 0; k < n; k++)
		for (uint32_t h = 0; h < FX_KV; h++)
			a[k][h] = (float)(fx_next(seed) % 1000 + 1) / 1000.0f;
	T_OK(fx_sync(f, n, ph, a, NULL, NULL, NULL));

	uint32_t off = c.drop_off;
	for (uint32_t j = 0; j < nj; j++) {
		T_EQ(hj[j].drop_off, off);
		off += hj[j].n_drop;
	}
	for (uint32_t h = 0; h < nkv; h++) {
		const uint32_t dropped = before[h] + n - f->len[h];
		const struct policy_dev_job *J = NULL;
		for (uint32_t j = 0; j < nj; j++)
			if (hj[j].g == h || hj[j].g == POLICY_DEV_ALL)
				J = &hj[j];
		if (!J) {
			T_EQ(dropped, 0);
			continue;
		}
		T_EQ(J->L, before[h] + n);
		if (J->n_drop != dropped)
			th_fail(__FILE__, __LINE__, "%s: n_seen %u, head %u: "
			        "the plan drops %u, decide() %u", f->p->spec,
			        f->n_seen, h, J->n_drop, dropped);
	}
}

/* Head h holds exactly the positions in want[0..n) (any order). */
static inline void fx_expect_(const struct fx *f, uint32_t h,
                              const uint32_t *want, uint32_t n,
                              const char *file, int line)
{
	uint8_t seen[FX_MAX] = {0};
	for (uint32_t i = 0; i < f->len[h]; i++)
		seen[f->pos[h][i]] = 1;
	int ok = f->len[h] == n;
	for (uint32_t i = 0; i < n && ok; i++)
		ok = seen[want[i]];
	if (!ok) {
		char got[512] = "";
		size_t o = 0;
		for (uint32_t p = 0; p < FX_MAX && o < 480; p++)
			if (seen[p])
				o += (size_t)snprintf(got + o, sizeof(got) - o,
				                      "%u ", p);
		th_fail(file, line, "%s head %u: holds {%s}, %u entries, "
		        "expected %u", f->p->spec, h, got, f->len[h], n);
	}
}
#define FX_EXPECT(f, h, ...)                                                   \
	do {                                                                   \
		const uint32_t w_[] = {__VA_ARGS__};                           \
		fx_expect_(f, h, w_, sizeof(w_) / sizeof(w_[0]), __FILE__,     \
		           __LINE__);                                          \
	} while (0)

/* Refused with a reason containing needle; line is the caller's. */
static inline void refused_why_(const char *spec, const struct policy_geom *ge,
                                const char *needle, const char *file,
                                int line)
{
	struct policy *p = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = policy_create(spec, ge, &p, err, sizeof(err));
	if (rc != KVT_EPOLICY || p || !strstr(err, needle))
		th_fail(file, line, "\"%s\" gave %s (%s), expected EPOLICY "
		        "mentioning '%s'", spec, kvt_errname(rc), err, needle);
}
#define refused_why(spec, ge, needle, line)                                    \
	refused_why_(spec, ge, needle, __FILE__, line)

#endif
