/*
 * test_cuda_fastkvzip.c — the cuda backend's device rule "fastkvzip" (Fast
 * KVzip's layer-wide top-k on the device, policies/fastkvzip.cu) against
 * the cpu policy's own operations (policies/fastkvzip.c's fkv_decide: the
 * new entries' scores from the scorer's output [n_new][n_kv_heads] at
 * their KV head; when due, every list of the layer laid end to end in KV
 * head order, protected pos < sinks or pos + window >= n_seen, k = budget
 * x KV heads - protected (at most the entries; 0 when the protected
 * exceed it), select_topk_cpu ranked by position; compact_plan's moves per
 * list): over several syncs of NJ layers of NKV lists of different
 * lengths, new entries and budgets at once (a prefill, decode steps,
 * syncs that are not due, a budget below the protected), the drop counts,
 * their indices over the concatenation and both halves of every list
 * (positions and scores, bit for bit) must be the host's exactly; equal
 * scores tie on position across lists.  The jobs' n_drop is the caller's
 * bound (entries - budget): the count is the device's.  The same with a
 * threshold (policy_select's per list: the unprotected entries whose
 * score is not >= tau dropped).  Then a score that is not finite flags its
 * job, the launches do not grow with the jobs, and the refusals.  Built into kvtrim-cuda-tests and, under the CPU
 * emulator, kvtrim-cuda-emu-tests; skips without a device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "fastkvzip_rule.h"
#include "kernels.h"
#include "test.h"

#define SEL_SEED 73
#include "select_fixture.h"

enum { PT = 4, HD = 4, NKV = 3, NR = 4, NP = 2, CAP = 48, NJ = 3,
       MAXN = 20 };

struct fz {
	struct sel_fx fx;
	const struct kvt_backend_rule *rule;
	void *state;
	float *pre[NJ]; /* device: each job's [MAXN][NKV] scores */
	/* per job: its record, the host's lists, its half, tokens seen */
	uint32_t record[NJ], len[NJ][NKV], seen[NJ], pos[NJ][NKV][CAP],
	         cur[NJ];
	float sc[NJ][NKV][CAP];
	int thr;   /* 1: the threshold tau decides, not the budgets */
	float tau;
};

static void fz_init(struct fz *f)
{
	memset(f, 0, sizeof(*f));
	sel_init(&f->fx, PT, HD * sizeof(float), NR, NP);
	f->rule = sel_rule(&f->fx, "fastkvzip", FASTKVZIP_RULE_VERSION,
	                   sizeof(struct fastkvzip_rule),
	                   sizeof(struct fastkvzip_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NR * 2 * NKV * CAP * 2 * 4);
	for (uint32_t k = 0; k < NJ; k++) {
		f->pre[k] = sel_mem(&f->fx, (size_t)MAXN * NKV * sizeof(float));
		f->record[k] = NR - 1 - k;
	}
}

static struct fastkvzip_rule fz_args(struct fz *f, uint32_t sinks,
                                     uint32_t window)
{
	return (struct fastkvzip_rule){
		.state = f->state, .cap = CAP, .sinks = sinks, .window = window,
		.threshold = (uint32_t)f->thr, .tau = f->tau,
	};
}

/* List g of half h of job k's record, read back. */
static void fz_half(struct fz *f, uint32_t k, uint32_t h, uint32_t g,
                    uint32_t *pos, float *sc)
{
	const uint32_t *b = (const uint32_t *)f->state +
	                    (((uint64_t)f->record[k] * 2 + h) * NKV + g) *
	                            CAP * 2;
	T_OK(f->fx.o->copy(f->fx.ctx, pos, b, CAP * 4, NULL));
	T_OK(f->fx.o->copy(f->fx.ctx, sc, b + CAP, CAP * 4, NULL));
}

/*
 * One sync of n_new[k] tokens on job k's lists, due or not, budget bud[k]
 * a list: the host does what fkv_decide does, the device rule
 * "fastkvzip"; each job's n_drop the bound entries - bud x NKV.  Returns
 * the drops made.
 */
static uint32_t fz_sync(struct fz *f, const uint32_t *n_new, int due,
                        const uint32_t *bud, uint32_t sinks,
                        uint32_t window)
{
	struct fastkvzip_rule_job jobs[NJ];
	uint8_t want[NJ][NKV * CAP];
	uint32_t nd[NJ], off = 0, total = 0;
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t n = n_new[k], prev = f->seen[k], seen = prev + n;
		float rows[MAXN * NKV];
		for (uint32_t i = 0; i < n * NKV; i++) /* ties across lists */
			rows[i] = (float)(urnd() % 6) / 4.0f;
		T_OK(f->fx.o->copy(f->fx.ctx, f->pre[k], rows,
		                   sizeof(float) * n * NKV, NULL));
		float s[NKV * CAP];
		uint32_t rank[NKV * CAP], scr[NKV * CAP], L = 0, np = 0;
		nd[k] = 0;
		uint8_t prot[NKV * CAP];
		jobs[k] = (struct fastkvzip_rule_job){
			.pre = f->pre[k], .record = f->record[k],
			.cur = f->cur[k], .nn = n, .n_seen = seen,
			.drop_off = off,
		};
		for (uint32_t g = 0; g < NKV; g++) {
			jobs[k].lens[g] = f->len[k][g];
			for (uint32_t t = 0; t < n; t++) {
				f->pos[k][g][f->len[k][g] + t] = prev + t;
				f->sc[k][g][f->len[k][g] + t] = rows[t * NKV + g];
			}
			for (uint32_t i = 0; i < f->len[k][g] + n; i++, L++) {
				s[L] = f->sc[k][g][i];
				rank[L] = f->pos[k][g][i];
				prot[L] = rank[L] < sinks ||
				          (uint64_t)rank[L] + window >= seen;
				np += prot[L];
			}
		}
		const uint64_t b = f->thr ? 0 : (uint64_t)bud[k] * NKV;
		const uint32_t kk = b > np ? (uint32_t)(b - np < L ? b - np : L)
		                           : 0;
		memset(want[k], 0, sizeof(want[k]));
		if (f->thr) /* policy_select's, a list at a time */
			for (uint32_t g = 0, o = 0; g < NKV; g++) {
				const uint32_t Lg = f->len[k][g] + n;
				if (due)
					nd[k] += select_threshold_cpu(
						s + o, prot + o, Lg, f->tau,
						want[k] + o);
				o += Lg;
			}
		else
			nd[k] = due ? select_topk_cpu(s, rank, prot, L, kk,
			                              want[k], scr)
			            : 0;
		if (!due)
			memset(want[k], 0, sizeof(want[k]));
		/* the bound: entries - budget; with a threshold, the
		 * unprotected */
		const uint32_t bound = !due ? 0 : f->thr ? L - np
		                       : L > b ? L - (uint32_t)b : 0;
		T_ASSERT(nd[k] <= bound);
		jobs[k].len = L;
		jobs[k].budget = (uint32_t)b;
		jobs[k].due = bound != 0;
		jobs[k].n_drop = bound;
		off += bound;
		total += nd[k];
	}
	const struct fastkvzip_rule a = fz_args(f, sinks, window);
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NJ + NJ * NKV * CAP];
	memset(out, 0xff, sizeof(out));
	const int rv = sel_run(&f->fx, f->rule, &pg, NR, KVT_DTYPE_F32, NKV,
	                       NKV, HD, &a, jobs, NJ, out, 2 * NJ + off, NULL);
	if (rv)
		fprintf(stderr, "%s\n", f->fx.o->last_error());
	T_OK(rv);
	for (uint32_t k = 0; k < NJ; k++) {
		T_EQ(out[k], 0);
		sel_check_drops(out, NJ, k, jobs[k].len, nd[k],
		                jobs[k].drop_off, want[k]);
		uint32_t at = 0;
		for (uint32_t g = 0; g < NKV; g++) {
			const uint32_t L = f->len[k][g] + n_new[k];
			uint32_t hp[CAP];
			float hs[CAP];
			/* the half read is left as it was */
			fz_half(f, k, f->cur[k], g, hp, hs);
			T_ASSERT(memcmp(hp, f->pos[k][g], f->len[k][g] * 4) == 0);
			T_ASSERT(memcmp(hs, f->sc[k][g], f->len[k][g] * 4) == 0);
			uint32_t moves[2 * CAP], nl;
			uint32_t nm = compact_plan(want[k] + at, L, moves, &nl);
			for (uint32_t i = 0; i < nm; i++) {
				f->pos[k][g][moves[2 * i]] =
					f->pos[k][g][moves[2 * i + 1]];
				f->sc[k][g][moves[2 * i]] =
					f->sc[k][g][moves[2 * i + 1]];
			}
			f->len[k][g] = nl;
			at += L;
			/* the device's new half, bit for bit */
			fz_half(f, k, f->cur[k] ^ 1, g, hp, hs);
			T_ASSERT(memcmp(hp, f->pos[k][g], nl * 4) == 0);
			T_ASSERT(memcmp(hs, f->sc[k][g], nl * 4) == 0);
		}
		f->seen[k] += n_new[k];
		f->cur[k] ^= 1;
	}
	return total;
}

static void run_case(uint32_t sinks, uint32_t window, uint32_t every,
                     int thr)
{
	struct fz f;
	fz_init(&f);
	f.thr = thr;
	f.tau = 0.5f; /* the scores: quarters in [0, 1.25] */
	/* ragged: prefills of different lengths, decode steps, a job with
	 * nothing new; budgets a list, one below the protected */
	const uint32_t steps[][NJ] = {
		{12, 3, 7}, {1, 1, 1}, {2, 0, 1}, {1, 4, 1}, {3, 1, 2},
		{1, 1, 1},  {5, 2, 1}, {1, 1, 1}, {2, 2, 2}, {1, 1, 1},
	};
	const uint32_t bud[NJ] = {6, 4, 1};
	uint32_t drops = 0, seen = 0;
	for (uint32_t s = 0; s < sizeof(steps) / sizeof(*steps); s++) {
		const int due = !every || s % every == 0;
		drops += fz_sync(&f, steps[s], due, bud, sinks, window);
		seen++;
	}
	T_ASSERT(drops > 0);
	sel_fini(&f.fx);
}

TEST(cuda, backend_fastkvzip_rule_matches_fastkvzip)
{
	run_case(0, 2, 0, 0);
	run_case(2, 3, 0, 0);  /* sinks and window: budget 1 below them */
	run_case(1, 0, 3, 0);  /* syncs not due */
}

/* The threshold: each list's unprotected entries below tau dropped. */
TEST(cuda, backend_fastkvzip_rule_threshold_matches_fastkvzip)
{
	run_case(0, 2, 0, 1);
	run_case(2, 3, 0, 1);
	run_case(1, 0, 3, 1);
}

/* Launches of a call do not grow with its jobs. */
TEST(cuda, backend_fastkvzip_rule_launches_bounded)
{
	struct fz f;
	fz_init(&f);
	const uint32_t n0[NJ] = {8, 8, 8}, bud[NJ] = {4, 4, 4};
	fz_sync(&f, n0, 1, bud, 0, 2);
	uint64_t l[4];
	for (uint32_t c = 0; c < 4; c++) {
		const uint32_t nj = c & 1 ? NJ : 1;
		/* c 2, 3: a threshold above every score, the same drops */
		f.thr = c >= 2;
		f.tau = 2.0f;
		struct fastkvzip_rule_job jobs[NJ];
		float rows[MAXN * NKV];
		for (uint32_t i = 0; i < 2 * NKV; i++)
			rows[i] = 0.5f;
		uint32_t off = 0;
		for (uint32_t k = 0; k < nj; k++) {
			T_OK(f.fx.o->copy(f.fx.ctx, f.pre[k], rows,
			                  sizeof(float) * 2 * NKV, NULL));
			jobs[k] = (struct fastkvzip_rule_job){
				.pre = f.pre[k], .record = f.record[k],
				.cur = f.cur[k], .nn = 2,
				.n_seen = f.seen[k] + 2, .due = 1, .budget = 6,
				.drop_off = off,
			};
			uint32_t L = 0;
			for (uint32_t g = 0; g < NKV; g++) {
				jobs[k].lens[g] = f.len[k][g];
				L += f.len[k][g] + 2;
			}
			jobs[k].len = L;
			jobs[k].n_drop = L - 6;
			off += L - 6;
		}
		const struct fastkvzip_rule a = fz_args(&f, 0, 2);
		struct kvt_backend_paged pg = sel_paged(&f.fx);
		uint32_t out[2 * NJ + NJ * NKV * CAP];
		l[c] = SEL_LAUNCHES(f.fx.o, f.fx.ctx,
		                    sel_run(&f.fx, f.rule, &pg, NR,
		                            KVT_DTYPE_F32, NKV, NKV, HD, &a,
		                            jobs, nj, out, 2 * nj + off, NULL));
		for (uint32_t k = 0; k < nj; k++) {
			T_EQ(out[k], 0);
			T_EQ(out[nj + k], jobs[k].n_drop); /* 6 protected */
		}
	}
	T_EQ(l[0], l[1]);
	T_EQ(l[1], 6); /* plan, entries, keep, top-k, indices, compaction */
	T_EQ(l[2], l[3]);
	T_EQ(l[3], 4); /* plan, entries, indices, compaction */
	sel_fini(&f.fx);
}

/* A refused call of the rule: KVT_EINVAL, nothing launched or copied. */
#define REFUSED(params, job)                                                  \
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,                                   \
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32,      \
	                          NKV, NKV, HD, params, job, 1, out, 2 +      \
	                          j.n_drop, NULL))

TEST(cuda, backend_fastkvzip_rule_flags_and_refuses)
{
	struct fz f;
	fz_init(&f);
	const uint32_t n0[NJ] = {6, 6, 6}, bud[NJ] = {3, 3, 3};
	fz_sync(&f, n0, 1, bud, 0, 2);
	float rows[2 * NKV];
	for (uint32_t i = 0; i < 2 * NKV; i++)
		rows[i] = 0.25f;
	rows[1 * NKV + 2] = NAN;
	T_OK(f.fx.o->copy(f.fx.ctx, f.pre[1], rows, sizeof(rows), NULL));
	struct fastkvzip_rule_job j = {
		.pre = f.pre[1], .record = f.record[1], .cur = f.cur[1],
		.nn = 2, .n_seen = 8, .due = 1, .budget = 9, .drop_off = 0,
	};
	uint32_t L = 0;
	for (uint32_t g = 0; g < NKV; g++) {
		j.lens[g] = f.len[1][g];
		L += f.len[1][g] + 2;
	}
	j.len = L;
	j.n_drop = L - 9;
	const struct fastkvzip_rule a = fz_args(&f, 0, 2);
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[64];
	memset(out, 0, sizeof(out));
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV, NKV, HD, &a,
	             &j, 1, out, 2 + j.n_drop, NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], UINT32_MAX);
	rows[1 * NKV + 2] = -INFINITY;
	T_OK(f.fx.o->copy(f.fx.ctx, f.pre[1], rows, sizeof(rows), NULL));
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV, NKV, HD, &a,
	             &j, 1, out, 2 + j.n_drop, NULL));
	T_EQ(out[0], 1);
	/* refusals, before anything runs */
	struct fastkvzip_rule_job bad = j;
	bad.record = NR;
	REFUSED(&a, &bad);
	bad = j;
	bad.len++; /* not the lists' sum */
	REFUSED(&a, &bad);
	bad = j;
	bad.lens[2] = CAP - 1; /* a list beyond cap */
	bad.len += CAP - 1 - j.lens[2];
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV,
	                          NKV, HD, &a, &bad, 1, out, 64, NULL));
	bad = j;
	bad.pre = NULL;
	REFUSED(&a, &bad);
	bad = j;
	bad.n_new = 1; /* the segment's field: 0 */
	REFUSED(&a, &bad);
	bad = j;
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, NKV,
	                          NKV, HD, &a, &bad, 1, out, 1 + j.n_drop,
	                          NULL));
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32,
	                          FASTKVZIP_RULE_MAX_KV + 1,
	                          FASTKVZIP_RULE_MAX_KV + 1, HD, &a, &j, 1,
	                          out, 2 + j.n_drop, NULL));
	/* the refusals and the flagged calls left the half read alone */
	for (uint32_t g = 0; g < NKV; g++) {
		uint32_t hp[CAP];
		float hs[CAP];
		fz_half(&f, 1, f.cur[1], g, hp, hs);
		T_ASSERT(memcmp(hp, f.pos[1][g], f.len[1][g] * 4) == 0);
		T_ASSERT(memcmp(hs, f.sc[1][g], f.len[1][g] * 4) == 0);
	}
	sel_fini(&f.fx);
}
#undef REFUSED
