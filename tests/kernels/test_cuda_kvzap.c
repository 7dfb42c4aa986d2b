/*
 * test_cuda_kvzap.c — the cuda backend's device rule "kvzap" (KVzap's
 * rule on the device, policies/kvzap.cu) against the cpu policy's own
 * operations (policies/kvzap.c's kvzap_decide: the new entries' scores
 * from the scorer's output [n_new][n_kv_heads] at their KV head, the
 * protection of every entry that does not leave the window at this sync
 * (n_seen - n_new <= pos + window < n_seen) or is a sink, then
 * select_threshold_cpu at tau; compact_plan's moves): over several syncs
 * of NJ lists of different KV heads, lengths and new entries at once (a
 * prefill, decode steps, syncs where nothing leaves), the drop counts,
 * their indices and both state halves (positions and scores, bit for bit)
 * must be the host's exactly; scores equal to tau stay (strict <).  The
 * jobs' n_drop is a bound (kvzap_rule.h): the count is the device's, at
 * most the bound, and a bound of 0 drops nothing.  Then a score that is
 * not finite flags its job, and the refusals.  Built into
 * kvtrim-cuda-tests and, under the CPU emulator, kvtrim-cuda-emu-tests;
 * skips without a device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "kernels.h"
#include "kvzap_rule.h"
#include "test.h"

#define SEL_SEED 57
#include "select_fixture.h"

enum { PT = 4, HD = 4, NKV = 3, NR = 6, NP = 2, CAP = 64, NJ = 4,
       MAXN = 24 };

struct zx {
	struct sel_fx fx;
	const struct kvt_backend_rule *rule;
	void *state;
	float *pre[NJ]; /* device: each job's [MAXN][NKV] scores */
	/* per job: its record and KV head, the host's list, its half */
	uint32_t record[NJ], g[NJ], len[NJ], seen[NJ], pos[NJ][CAP], cur[NJ];
	float sc[NJ][CAP];
};

static void zx_init(struct zx *f)
{
	memset(f, 0, sizeof(*f));
	sel_init(&f->fx, PT, HD * sizeof(float), NR, NP);
	f->rule = sel_rule(&f->fx, "kvzap", KVZAP_RULE_VERSION,
	                   sizeof(struct kvzap_rule),
	                   sizeof(struct kvzap_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NR * 2 * CAP * 2 * 4);
	for (uint32_t k = 0; k < NJ; k++) {
		f->pre[k] = sel_mem(&f->fx, (size_t)MAXN * NKV * sizeof(float));
		f->record[k] = NR - 1 - k; /* records out of job order */
		f->g[k] = (k * 2) % NKV;
	}
}

static struct kvzap_rule zx_args(struct zx *f, uint32_t sinks,
                                 uint32_t window, float tau)
{
	return (struct kvzap_rule){
		.state = f->state, .cap = CAP, .sinks = sinks,
		.window = window, .tau = tau,
	};
}

/* Half h of job k's record: positions and scores, read back. */
static void zx_half(struct zx *f, uint32_t k, uint32_t h, uint32_t *pos,
                    float *sc)
{
	const uint32_t *b = (const uint32_t *)f->state +
	                    ((uint64_t)f->record[k] * 2 + h) * CAP * 2;
	T_OK(f->fx.o->copy(f->fx.ctx, pos, b, CAP * 4, NULL));
	T_OK(f->fx.o->copy(f->fx.ctx, sc, b + CAP, CAP * 4, NULL));
}

/* Job k's entries at positions [lo, hi) scoring below tau (or NaN): its
 * drops when those leave the window, their indices into idx. */
static uint32_t zx_below(const struct zx *f, uint32_t k, uint32_t lo,
                         uint32_t hi, float tau, uint32_t *idx)
{
	uint32_t c = 0;
	for (uint32_t i = 0; i < f->len[k]; i++)
		if (f->pos[k][i] >= lo && f->pos[k][i] < hi &&
		    !(f->sc[k][i] >= tau))
			idx[c++] = i;
	return c;
}

/* A score around tau: on a grid of 1/4 from tau - 2 to tau + 2, so that
 * some equal tau exactly. */
static float zx_score(float tau)
{
	return tau + (float)((int)(urnd() % 17) - 8) / 4.0f;
}

/*
 * One sync of n_new[k] tokens on each job: the host does what
 * kvzap_decide does, the device rule "kvzap"; bound: each job's n_drop
 * (UINT32_MAX: the entries leaving the window, counted here from the
 * positions; else that number, at most the list's entries).  Returns the
 * drops made.
 */
static uint32_t zx_sync(struct zx *f, const uint32_t *n_new, uint32_t sinks,
                        uint32_t window, float tau, uint32_t bound)
{
	struct kvzap_rule_job jobs[NJ];
	uint8_t want[NJ][CAP];
	uint32_t nd[NJ], off = 0, total = 0;
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t n = n_new[k], prev = f->seen[k], seen = prev + n;
		const uint32_t L = f->len[k] + n;
		float rows[MAXN * NKV];
		for (uint32_t i = 0; i < n * NKV; i++)
			rows[i] = zx_score(tau);
		T_OK(f->fx.o->copy(f->fx.ctx, f->pre[k], rows,
		                   sizeof(float) * n * NKV, NULL));
		for (uint32_t t = 0; t < n; t++) {
			f->pos[k][f->len[k] + t] = prev + t;
			f->sc[k][f->len[k] + t] = rows[t * NKV + f->g[k]];
		}
		uint8_t prot[CAP];
		uint32_t leaving = 0;
		for (uint32_t i = 0; i < L; i++) {
			const uint64_t pw = (uint64_t)f->pos[k][i] + window;
			prot[i] = !(pw >= prev && pw < seen) ||
			          f->pos[k][i] < sinks;
			leaving += !prot[i];
		}
		nd[k] = select_threshold_cpu(f->sc[k], prot, L, tau, want[k]);
		const uint32_t b = bound == UINT32_MAX ? leaving
		                   : bound < L ? bound : L;
		jobs[k] = (struct kvzap_rule_job){
			.pre = f->pre[k], .record = f->record[k], .g = f->g[k],
			.cur = f->cur[k], .len = f->len[k], .n_new = n,
			.n_seen = seen, .due = b != 0, .n_drop = b,
			.drop_off = off,
		};
		if (!b)
			nd[k] = 0, memset(want[k], 0, L); /* nothing due */
		off += b;
		total += nd[k];
	}
	const struct kvzap_rule a = zx_args(f, sinks, window, tau);
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NJ + NJ * CAP];
	memset(out, 0xff, sizeof(out));
	const int rv = sel_run(&f->fx, f->rule, &pg, NR, KVT_DTYPE_F32, NKV,
	                       NKV, HD, &a, jobs, NJ, out, 2 * NJ + off, NULL);
	if (rv)
		fprintf(stderr, "%s\n", f->fx.o->last_error());
	T_OK(rv);
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t L = f->len[k] + n_new[k];
		T_EQ(out[k], 0);
		sel_check_drops(out, NJ, k, L, nd[k], jobs[k].drop_off, want[k]);
		/* the half read is left as it was */
		uint32_t hp[CAP];
		float hs[CAP];
		zx_half(f, k, f->cur[k], hp, hs);
		T_ASSERT(memcmp(hp, f->pos[k], f->len[k] * 4) == 0);
		T_ASSERT(memcmp(hs, f->sc[k], f->len[k] * 4) == 0);
		/* the host's compaction of its positions and scores */
		uint32_t moves[2 * CAP], nl;
		uint32_t nm = compact_plan(want[k], L, moves, &nl);
		T_EQ(nl, L - nd[k]);
		for (uint32_t i = 0; i < nm; i++) {
			f->pos[k][moves[2 * i]] = f->pos[k][moves[2 * i + 1]];
			f->sc[k][moves[2 * i]] = f->sc[k][moves[2 * i + 1]];
		}
		f->len[k] = nl;
		f->seen[k] += n_new[k];
		f->cur[k] ^= 1;
		/* the device's new half, bit for bit */
		zx_half(f, k, f->cur[k], hp, hs);
		T_ASSERT(memcmp(hp, f->pos[k], nl * 4) == 0);
		T_ASSERT(memcmp(hs, f->sc[k], nl * 4) == 0);
	}
	return total;
}

static void run_case(uint32_t sinks, uint32_t window, float tau)
{
	struct zx f;
	zx_init(&f);
	/* ragged: a prefill on some lists, decode steps on others, a list
	 * with nothing new at a sync */
	const uint32_t steps[][NJ] = {
		{20, 1, 12, 3}, {1, 1, 1, 0}, {4, 2, 1, 1}, {1, 16, 3, 2},
		{2, 1, 1, 1},   {1, 1, 5, 1}, {3, 0, 1, 4}, {1, 1, 1, 1},
		{6, 2, 2, 1},   {1, 1, 1, 1},
	};
	uint32_t drops = 0;
	for (uint32_t s = 0; s < sizeof(steps) / sizeof(*steps); s++)
		drops += zx_sync(&f, steps[s], sinks, window, tau, UINT32_MAX);
	T_ASSERT(drops > 0);
	/* a looser bound changes nothing (the count is the device's), a
	 * bound of 0 drops nothing */
	const uint32_t more[NJ] = {4, 4, 4, 4};
	zx_sync(&f, more, sinks, window, tau, 2 * CAP / NJ / 2);
	T_EQ(zx_sync(&f, more, sinks, window, tau, 0), 0);
	sel_fini(&f.fx);
}

TEST(cuda, backend_kvzap_rule_matches_kvzap)
{
	run_case(0, 8, 0.0f);   /* the loadgen runs' spec */
	run_case(2, 5, -0.25f); /* sinks, another window and tau */
	run_case(0, 0, 0.5f);   /* no window: an entry leaves as it comes */
}

/* Launches of a call do not grow with its jobs. */
TEST(cuda, backend_kvzap_rule_launches_bounded)
{
	struct zx f;
	zx_init(&f);
	const uint32_t n[NJ] = {12, 12, 12, 12};
	zx_sync(&f, n, 0, 4, 0.0f, UINT32_MAX);
	uint64_t l[2];
	for (uint32_t c = 0; c < 2; c++) {
		const uint32_t nj = c ? NJ : 1;
		struct kvzap_rule_job jobs[NJ];
		float rows[MAXN * NKV];
		for (uint32_t i = 0; i < 2 * NKV; i++)
			rows[i] = -1.0f; /* below tau: the leaving ones drop */
		uint32_t off = 0;
		for (uint32_t k = 0; k < nj; k++) {
			T_OK(f.fx.o->copy(f.fx.ctx, f.pre[k], rows,
			                  sizeof(float) * 2 * NKV, NULL));
			jobs[k] = (struct kvzap_rule_job){
				.pre = f.pre[k], .record = f.record[k],
				.g = f.g[k], .cur = f.cur[k], .len = f.len[k],
				.n_new = 2, .n_seen = f.seen[k] + 2, .due = 1,
				.n_drop = 2, .drop_off = off,
			};
			off += 2;
		}
		const struct kvzap_rule a = zx_args(&f, 0, 4, 0.0f);
		struct kvt_backend_paged pg = sel_paged(&f.fx);
		uint32_t out[2 * NJ + 2 * NJ];
		l[c] = SEL_LAUNCHES(f.fx.o, f.fx.ctx,
		                    sel_run(&f.fx, f.rule, &pg, NR,
		                            KVT_DTYPE_F32, NKV, NKV, HD, &a,
		                            jobs, nj, out, 2 * nj + off, NULL));
		for (uint32_t k = 0; k < nj; k++) {
			uint32_t idx[2]; /* positions 8 and 9 leave */
			const uint32_t w = zx_below(&f, k, 8, 10, 0.0f, idx);
			T_EQ(out[k], 0);
			T_EQ(out[nj + k], w);
			for (uint32_t d = 0; d < w; d++)
				T_EQ(out[2 * nj + jobs[k].drop_off + d], idx[d]);
		}
	}
	T_EQ(l[0], l[1]);
	T_EQ(l[1], 4); /* plan, entries, indices, compaction */
	sel_fini(&f.fx);
}

/* A refused call of the rule: KVT_EINVAL, nothing launched or copied. */
#define REFUSED(params, job)                                                  \
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,                                   \
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32,      \
	                          NKV, NKV, HD, params, job, 1, out, 4,       \
	                          NULL))

TEST(cuda, backend_kvzap_rule_flags_and_refuses)
{
	struct zx f;
	zx_init(&f);
	const uint32_t n0[NJ] = {10, 10, 10, 10};
	zx_sync(&f, n0, 0, 4, 0.0f, UINT32_MAX);
	/* job 1's next two scores: a NaN in the second row at its head is
	 * flagged, its count UINT32_MAX, no drops */
	float rows[2 * NKV];
	for (uint32_t i = 0; i < 2 * NKV; i++)
		rows[i] = -3.0f;
	rows[1 * NKV + f.g[1]] = NAN;
	T_OK(f.fx.o->copy(f.fx.ctx, f.pre[1], rows, sizeof(rows), NULL));
	struct kvzap_rule_job j = {
		.pre = f.pre[1], .record = f.record[1], .g = f.g[1],
		.cur = f.cur[1], .len = f.len[1], .n_new = 2, .n_seen = 12,
		.due = 1, .n_drop = 2,
	};
	const struct kvzap_rule a = zx_args(&f, 0, 4, 0.0f);
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[8];
	memset(out, 0, sizeof(out));
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV, NKV, HD, &a,
	             &j, 1, out, 4, NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], UINT32_MAX);
	/* an infinity likewise, at another head's column too: only the
	 * job's own head counts */
	rows[1 * NKV + f.g[1]] = INFINITY;
	T_OK(f.fx.o->copy(f.fx.ctx, f.pre[1], rows, sizeof(rows), NULL));
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV, NKV, HD, &a,
	             &j, 1, out, 4, NULL));
	T_EQ(out[0], 1);
	rows[1 * NKV + f.g[1]] = -3.0f;
	rows[1 * NKV + (f.g[1] + 1) % NKV] = NAN;
	T_OK(f.fx.o->copy(f.fx.ctx, f.pre[1], rows, sizeof(rows), NULL));
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV, NKV, HD, &a,
	             &j, 1, out, 4, NULL));
	uint32_t idx[2]; /* positions 6 and 7 leave the window of 4 */
	const uint32_t w = zx_below(&f, 1, 6, 8, 0.0f, idx);
	T_EQ(out[0], 0);
	T_EQ(out[1], w);
	for (uint32_t d = 0; d < w; d++)
		T_EQ(out[2 + d], idx[d]);
	/* refusals, before anything runs */
	struct kvzap_rule_job bad = j;
	bad.record = NR;
	REFUSED(&a, &bad);
	bad = j;
	bad.g = NKV;
	REFUSED(&a, &bad);
	bad = j;
	bad.len = CAP - 1; /* len + n_new = CAP + 1 */
	REFUSED(&a, &bad);
	bad = j;
	bad.n_seen = 1; /* n_new 2 */
	REFUSED(&a, &bad);
	bad = j;
	bad.pre = NULL;
	REFUSED(&a, &bad);
	bad = j;
	bad.cur = 2;
	REFUSED(&a, &bad);
	bad = j;
	bad.n_drop = 3; /* its indices at out[2..4] of 4 words */
	REFUSED(&a, &bad);
	bad = j;
	bad.n_drop = f.len[1] + 3; /* more than its entries */
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV,
	                          NKV, HD, &a, &bad, 1, out, 64, NULL));
	struct kvzap_rule nost = a;
	nost.state = NULL;
	REFUSED(&nost, &j);
	/* the refusals and the flagged calls left the half read alone */
	uint32_t hp[CAP];
	float hs[CAP];
	zx_half(&f, 1, f.cur[1], hp, hs);
	T_ASSERT(memcmp(hp, f.pos[1], f.len[1] * 4) == 0);
	T_ASSERT(memcmp(hs, f.sc[1], f.len[1] * 4) == 0);
	sel_fini(&f.fx);
}
#undef REFUSED
