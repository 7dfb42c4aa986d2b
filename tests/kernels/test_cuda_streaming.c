/*
 * test_cuda_streaming.c — the cuda backend's device rule "streaming"
 * (StreamingLLM's rule on the device, policies/streaming.cu) against the
 * rule as policies/streaming.c states it, worked out here on the host:
 * budget B; n_seen <= B keeps all; else S' = min(sinks, B), recent = B -
 * S', an entry is kept iff pos < S' or pos >= n_seen - recent; the
 * positions compacted by compact_plan's moves.  Over a run of syncs of NJ
 * jobs of ragged lengths (prefills of different sizes, decode steps,
 * syncs of no token, budgets that shrink and grow again, sinks beyond the
 * budget) the drop indices and the positions (both halves) must be the
 * host's exactly, in a bounded number of launches whatever NJ.  Then the
 * refusals, which launch nothing and leave the state alone.  Built into
 * kvtrim-cuda-tests and, under the CPU emulator, kvtrim-cuda-emu-tests;
 * skips without a device.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "streaming_rule.h"
#include "test.h"

#define SEL_SEED 43
#include "select_fixture.h"

enum { PT = 4, NKV = 2, NP = 16, CAP = NP * PT, NJ = 6, NR = NJ * NKV };

struct sx {
	struct sel_fx fx;
	const struct kvt_backend_rule *rule;
	void *state;
	/* per job: the host's positions, their length, the half they are
	 * in, the tokens seen */
	uint32_t pos[NJ][CAP], len[NJ], cur[NJ], seen[NJ];
};

static void sx_init(struct sx *f)
{
	memset(f, 0, sizeof(*f));
	sel_init(&f->fx, PT, 4 * sizeof(float), NR, NP);
	f->rule = sel_rule(&f->fx, "streaming", STREAMING_RULE_VERSION,
	                   sizeof(struct streaming_rule),
	                   sizeof(struct streaming_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NJ * 2 * CAP * 4);
}

/* Half h of job k's positions (state record NJ - 1 - k), read back. */
static void sx_half(struct sx *f, uint32_t k, uint32_t h, uint32_t *out)
{
	T_OK(f->fx.o->copy(f->fx.ctx, out,
	                   (uint32_t *)f->state +
	                           ((uint64_t)(NJ - 1 - k) * 2 + h) * CAP,
	                   CAP * sizeof(uint32_t), NULL));
}

/*
 * One sync: job k gets n_new[k] tokens under budget b[k] and sinks; the
 * host marks and compacts, the device rule does the same.  Returns the
 * drops made.
 */
static uint32_t sx_sync(struct sx *f, const uint32_t *n_new, const uint32_t *b,
                        uint32_t sinks)
{
	struct streaming_rule_job jobs[NJ];
	uint8_t want[NJ][CAP];
	uint32_t nd[NJ], nj = 0, off = 0, total = 0, map[NJ];
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t prev = f->seen[k], seen = prev + n_new[k];
		const uint32_t L = f->len[k] + n_new[k];
		for (uint32_t i = 0; i < n_new[k]; i++)
			f->pos[k][f->len[k] + i] = prev + i;
		memset(want[k], 0, sizeof(want[k]));
		nd[k] = 0;
		uint32_t s = 0, from = 0;
		const int due = seen > b[k];
		if (due) {
			s = sinks < b[k] ? sinks : b[k];
			from = seen - (b[k] - s);
			for (uint32_t i = 0; i < L; i++) {
				const uint32_t p = f->pos[k][i];
				want[k][i] = !(p < s || p >= from);
				nd[k] += want[k][i];
			}
		}
		if (!L || (!n_new[k] && !nd[k]))
			continue; /* no job: nothing changes */
		map[nj] = k;
		jobs[nj++] = (struct streaming_rule_job){
			.srec = NJ - 1 - k, .cur = f->cur[k], .len = f->len[k],
			.n_new = n_new[k], .n_seen = seen, .due = (uint32_t)due,
			.keep = 0, .sinks = s, .from = from, .n_drop = nd[k],
			.drop_off = off,
		};
		off += nd[k];
	}
	const struct streaming_rule a = {.state = f->state, .cap = CAP};
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NJ + NJ * CAP];
	memset(out, 0xff, sizeof(out));
	if (nj) {
		/* the plan, the marks, the indices, the compaction */
		const uint64_t nl = SEL_LAUNCHES(f->fx.o, f->fx.ctx,
			sel_run(&f->fx, f->rule, &pg, NR, KVT_DTYPE_F32, NKV,
			        NKV, 4, &a, jobs, nj, out, 2 * nj + off, NULL));
		T_ASSERT(nl <= 4);
	}
	for (uint32_t j = 0; j < nj; j++) {
		const uint32_t k = map[j], L = f->len[k] + jobs[j].n_new;
		T_EQ(out[j], 0);
		sel_check_drops(out, nj, j, L, nd[k], jobs[j].drop_off, want[k]);
		/* the half read is left as it was */
		uint32_t half[CAP];
		sx_half(f, k, f->cur[k], half);
		T_ASSERT(memcmp(half, f->pos[k], f->len[k] * 4) == 0);
		uint32_t moves[2 * CAP], nl;
		uint32_t nm = compact_plan(want[k], L, moves, &nl);
		T_EQ(nl, L - nd[k]);
		for (uint32_t i = 0; i < nm; i++)
			f->pos[k][moves[2 * i]] = f->pos[k][moves[2 * i + 1]];
		f->len[k] = nl;
		f->cur[k] ^= 1;
		sx_half(f, k, f->cur[k], half);
		T_ASSERT(memcmp(half, f->pos[k], nl * 4) == 0);
		total += nd[k];
	}
	for (uint32_t k = 0; k < NJ; k++)
		f->seen[k] += n_new[k];
	return total;
}

static void run_case(uint32_t sinks)
{
	struct sx f;
	sx_init(&f);
	uint32_t drops = 0;
	for (uint32_t s = 0; s < 14; s++) {
		uint32_t n[NJ], b[NJ];
		for (uint32_t k = 0; k < NJ; k++) {
			/* ragged prefills, then 0 to 3 tokens a sync */
			n[k] = s == 0 ? 3 + 5 * k : urnd() % 4;
			/* budgets of 6 to 13, down to 2 for a while (below
			 * the sinks) and up again */
			b[k] = s >= 5 && s < 8 ? 2 : 6 + (k + s) % 8;
			if (f.seen[k] + n[k] > CAP - 4)
				n[k] = 0;
		}
		drops += sx_sync(&f, n, b, sinks);
	}
	T_ASSERT(drops > 0);
	sel_fini(&f.fx);
}

TEST(cuda, backend_streaming_rule_matches_streaming)
{
	run_case(4); /* StreamingLLM's default sinks */
	run_case(0); /* the recent window alone */
	run_case(3);
}

/* A refused call of the rule: KVT_EINVAL, nothing launched or copied. */
#define REFUSED(params, job)                                                  \
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,                                   \
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32,      \
	                          NKV, NKV, 4, params, job, 1, out, 16,       \
	                          NULL))

TEST(cuda, backend_streaming_rule_refuses)
{
	struct sx f;
	sx_init(&f);
	const uint32_t n[NJ] = {9, 9, 9, 9, 9, 9}, b[NJ] = {5, 5, 5, 5, 5, 5};
	sx_sync(&f, n, b, 2);
	struct streaming_rule_job j = {
		.srec = NJ - 1, .cur = f.cur[0], .len = f.len[0], .n_new = 2,
		.n_seen = 11, .due = 1, .sinks = 2, .from = 8, .n_drop = 1,
	};
	const struct streaming_rule a = {.state = f.state, .cap = CAP};
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[16];
	struct streaming_rule_job bad = j;
	bad.srec = NJ; /* beyond n_records / n_kv_heads */
	REFUSED(&a, &bad);
	bad = j;
	bad.cur = 2;
	REFUSED(&a, &bad);
	bad = j;
	bad.len = CAP - 1; /* len + n_new = CAP + 1 */
	REFUSED(&a, &bad);
	bad = j;
	bad.n_seen = 1; /* fewer tokens seen than new ones */
	REFUSED(&a, &bad);
	bad = j;
	bad.n_drop = f.len[0] + 3; /* more drops than entries */
	REFUSED(&a, &bad);
	bad = j;
	bad.drop_off = 14; /* its index at out[16] of 16 words */
	REFUSED(&a, &bad);
	const struct streaming_rule none = {.state = NULL, .cap = CAP};
	REFUSED(&none, &j);
	/* the refusals left the half read alone */
	uint32_t half[CAP];
	sx_half(&f, 0, f.cur[0], half);
	T_ASSERT(memcmp(half, f.pos[0], f.len[0] * 4) == 0);
	sel_fini(&f.fx);
}
#undef REFUSED
