/*
 * test_cuda_random.c — the cuda backend's device rule "random" (the
 * random baseline's rule on the device, policies/random.cu) against the
 * rule as policies/random.c states it, worked out here: entry score (the
 * top 24 bits of splitmix64(base ^ pos)) / 2^24, base =
 * splitmix64(splitmix64(splitmix64(seed) ^ layer) ^ KV head); the
 * protection of sinks and window; select_topk_cpu ranked by position;
 * compact_plan's moves.  Over several syncs of NJ lists of ragged lengths
 * on different layers and heads (prefills of different sizes, decode
 * steps, syncs of no token and syncs not due) the drop indices and the
 * positions (both halves) must be the host's exactly, in a bounded number
 * of launches whatever NJ.  Then the refusals, which launch nothing.
 * Built into kvtrim-cuda-tests and, under the CPU emulator,
 * kvtrim-cuda-emu-tests; skips without a device.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "kernels.h"
#include "random_rule.h"
#include "test.h"

#define SEL_SEED 53
#include "select_fixture.h"

enum { PT = 4, NP = 12, CAP = NP * PT, NKV = 2, NJ = 6, NR = NJ + 2 };

struct rx {
	struct sel_fx fx;
	const struct kvt_backend_rule *rule;
	void *state;
	/* per job: the host's positions, their length, the half they are
	 * in, the tokens seen */
	uint32_t pos[NJ][CAP], len[NJ], cur[NJ], seen[NJ];
};

/* Job k's record, layer and KV head. */
static uint32_t rx_rec(uint32_t k) { return NR - 1 - k; }
static uint32_t rx_layer(uint32_t k) { return 3 * (k / NKV); }
static uint32_t rx_head(uint32_t k) { return k % NKV; }

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void rx_init(struct rx *f)
{
	memset(f, 0, sizeof(*f));
	sel_init(&f->fx, PT, 4 * sizeof(float), NR, NP);
	f->rule = sel_rule(&f->fx, "random", RANDOM_RULE_VERSION,
	                   sizeof(struct random_rule),
	                   sizeof(struct random_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NR * 2 * CAP * 4);
}

/* Half h of job k's positions, read back. */
static void rx_half(struct rx *f, uint32_t k, uint32_t h, uint32_t *out)
{
	T_OK(f->fx.o->copy(f->fx.ctx, out,
	                   (uint32_t *)f->state +
	                           ((uint64_t)rx_rec(k) * 2 + h) * CAP,
	                   CAP * sizeof(uint32_t), NULL));
}

/* One sync: job k gets n_new[k] tokens, budget b[k], due or not.
 * Returns the drops made. */
static uint32_t rx_sync(struct rx *f, const uint32_t *n_new, const uint32_t *b,
                        int due, uint64_t seed, uint32_t sinks,
                        uint32_t window)
{
	struct random_rule_job jobs[NJ];
	uint8_t want[NJ][CAP];
	uint32_t nd[NJ], map[NJ], nj = 0, off = 0, total = 0;
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t prev = f->seen[k], seen = prev + n_new[k];
		const uint32_t L = f->len[k] + n_new[k];
		for (uint32_t i = 0; i < n_new[k]; i++)
			f->pos[k][f->len[k] + i] = prev + i;
		memset(want[k], 0, sizeof(want[k]));
		nd[k] = 0;
		uint32_t keep = 0;
		if (due && L) {
			const uint64_t base = splitmix(
				splitmix(splitmix(seed) ^ rx_layer(k)) ^
				rx_head(k));
			float s[CAP];
			uint8_t pr[CAP];
			uint32_t np = 0, scr[CAP];
			for (uint32_t i = 0; i < L; i++) {
				const uint32_t p = f->pos[k][i];
				s[i] = (float)(splitmix(base ^ p) >> 40) /
				       16777216.0f;
				pr[i] = p < sinks ||
				        (window && p + (uint64_t)window >= seen);
				np += pr[i];
			}
			keep = b[k] > np ? b[k] - np : 0;
			nd[k] = select_topk_cpu(s, f->pos[k], pr, L, keep,
			                        want[k], scr);
		}
		if (!L || (!n_new[k] && !due))
			continue;
		map[nj] = k;
		jobs[nj++] = (struct random_rule_job){
			.record = rx_rec(k), .layer = rx_layer(k),
			.g = rx_head(k), .cur = f->cur[k], .len = f->len[k],
			.n_new = n_new[k], .n_seen = seen, .due = (uint32_t)due,
			.keep = keep, .n_drop = nd[k], .drop_off = off,
		};
		off += nd[k];
	}
	const struct random_rule a = {.state = f->state, .seed = seed,
	                              .cap = CAP, .sinks = sinks,
	                              .window = window};
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NJ + NJ * CAP];
	memset(out, 0xff, sizeof(out));
	if (nj) {
		/* the plan, the scores, the selection's three */
		const uint64_t nl = SEL_LAUNCHES(f->fx.o, f->fx.ctx,
			sel_run(&f->fx, f->rule, &pg, NR, KVT_DTYPE_F32, NKV,
			        NKV, 4, &a, jobs, nj, out, 2 * nj + off, NULL));
		T_ASSERT(nl <= 5);
	}
	for (uint32_t j = 0; j < nj; j++) {
		const uint32_t k = map[j], L = f->len[k] + jobs[j].n_new;
		T_EQ(out[j], 0);
		sel_check_drops(out, nj, j, L, nd[k], jobs[j].drop_off, want[k]);
		uint32_t half[CAP];
		/* the half read is left as it was */
		rx_half(f, k, f->cur[k], half);
		T_ASSERT(memcmp(half, f->pos[k], f->len[k] * 4) == 0);
		uint32_t moves[2 * CAP], nl;
		uint32_t nm = compact_plan(want[k], L, moves, &nl);
		T_EQ(nl, L - nd[k]);
		for (uint32_t i = 0; i < nm; i++)
			f->pos[k][moves[2 * i]] = f->pos[k][moves[2 * i + 1]];
		f->len[k] = nl;
		f->cur[k] ^= 1;
		rx_half(f, k, f->cur[k], half);
		T_ASSERT(memcmp(half, f->pos[k], nl * 4) == 0);
		total += nd[k];
	}
	for (uint32_t k = 0; k < NJ; k++)
		f->seen[k] += n_new[k];
	return total;
}

static void run_case(uint64_t seed, uint32_t sinks, uint32_t window,
                     uint32_t every)
{
	struct rx f;
	rx_init(&f);
	uint32_t drops = 0, skipped = 0;
	for (uint32_t s = 0; s < 12; s++) {
		uint32_t n[NJ], b[NJ];
		for (uint32_t k = 0; k < NJ; k++) {
			/* ragged prefills, then 0 to 3 tokens a sync */
			n[k] = s == 0 ? 4 + 4 * k : urnd() % 4;
			b[k] = 5 + (k + s) % 7;
			if (f.len[k] + n[k] > CAP)
				n[k] = 0;
		}
		/* every: due at one sync of every (the plan's policy_due
		 * decides it; the rule takes the flag) */
		const int due = !every || s % every == 0;
		drops += rx_sync(&f, n, b, due, seed, sinks, window);
		skipped += !due;
	}
	T_ASSERT(drops > 0);
	T_ASSERT(every < 2 || skipped > 0);
	sel_fini(&f.fx);
}

TEST(cuda, backend_random_rule_matches_random)
{
	run_case(0, 0, 0, 0); /* random's defaults */
	run_case(0x123456789abcdef0ull, 2, 3, 0); /* a 64-bit seed */
	run_case(7, 1, 0, 3); /* every 3 */
}

/* A refused call of the rule: KVT_EINVAL, nothing launched or copied. */
#define REFUSED(params, job)                                                  \
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,                                   \
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32,      \
	                          NKV, NKV, 4, params, job, 1, out, 16,       \
	                          NULL))

TEST(cuda, backend_random_rule_refuses)
{
	struct rx f;
	rx_init(&f);
	const uint32_t n[NJ] = {9, 9, 9, 9, 9, 9}, b[NJ] = {5, 5, 5, 5, 5, 5};
	rx_sync(&f, n, b, 1, 1, 0, 0);
	const struct random_rule_job j = {
		.record = rx_rec(0), .cur = f.cur[0], .len = f.len[0],
		.n_new = 2, .n_seen = 11, .due = 1, .keep = 5, .n_drop = 2,
	};
	const struct random_rule a = {.state = f.state, .seed = 1, .cap = CAP};
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[16];
	struct random_rule_job bad = j;
	bad.record = NR; /* beyond n_records */
	REFUSED(&a, &bad);
	bad = j;
	bad.g = NKV; /* beyond the KV heads */
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
	bad.drop_off = 13; /* its indices to out[16] of 16 words */
	REFUSED(&a, &bad);
	const struct random_rule none = {.state = NULL, .cap = CAP};
	REFUSED(&none, &j);
	/* the refusals left the half read alone */
	uint32_t half[CAP];
	rx_half(&f, 0, f.cur[0], half);
	T_ASSERT(memcmp(half, f.pos[0], f.len[0] * 4) == 0);
	sel_fini(&f.fx);
}
#undef REFUSED
