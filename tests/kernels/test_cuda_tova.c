/*
 * test_cuda_tova.c — the cuda backend's device rule "tova" (TOVA's rule on
 * the device, policies/tova.cu) against the cpu policy's own operations
 * (policies/tova.c, its `same` path: attn_band_cpu's weights of the newest
 * staged query, summed over the G query heads of each KV head in j order,
 * then over the KV heads in g order, times 1/H; the protection of sinks and
 * window; select_topk_cpu ranked by position; compact_plan's moves): over
 * several syncs of two jobs (two layers, NKV lists each, the job's lists at
 * consecutive records and its state record elsewhere) — a prefill with
 * drops, decode steps, syncs that are not due — with the pages compacted by
 * compact_drops between syncs, the drop indices and the positions (both
 * halves) must be the host's exactly (on the emulator, whose cuBLAS is
 * OpenBLAS, the scores are the same bits; a GPU's SGEMM and expf round
 * differently, which ties aside moves no decision of these sizes).  Then a
 * NaN in the newest row's lse is flagged, and the refusals.  Built into
 * kvtrim-cuda-tests and, under the CPU emulator, kvtrim-cuda-emu-tests;
 * skips without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "kernels.h"
#include "tova_rule.h"
#include "test.h"

#define SEL_SEED 41
#include "select_fixture.h"

enum { HD = 8, PT = 4, G = 2, NKV = 2, H = G * NKV, NP = 12, CAP = NP * PT,
       ST = 16, RF = H * HD + H, NJ = 2, NR = NJ * NKV };

/* The chunk of NR lists (select_fixture.h) and the jobs' state. */
struct tx {
	struct sel_fx fx;
	const struct kvt_backend_rule *rule;
	void *state, *ring[NJ];
	float ring_h[NJ][ST * RF];
	/* per job: its lists' first record, its state record, the host's
	 * positions (the same for every list of the job) */
	uint32_t record[NJ], srec[NJ], len[NJ], pos[NJ][CAP], cur[NJ];
};

static void tx_init(struct tx *f)
{
	memset(f, 0, sizeof(*f));
	sel_init(&f->fx, PT, HD * sizeof(float), NR, NP);
	f->rule = sel_rule(&f->fx, "tova", TOVA_RULE_VERSION,
	                   sizeof(struct tova_rule),
	                   sizeof(struct tova_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NJ * 2 * CAP * 4);
	for (uint32_t k = 0; k < NJ; k++)
		f->ring[k] = sel_mem(&f->fx, sizeof(f->ring_h[k]));
	sel_fill_floats(&f->fx, KVT_DTYPE_F32);
	/* pages of each list in reverse, interleaved between the lists */
	for (uint32_t r = 0; r < NR; r++) {
		struct kvt_list_record *lr = sel_rec(&f->fx, r);
		for (uint32_t p = 0; p < NP; p++)
			lr->pages[p] = (NP - 1 - p) * NR + r;
	}
	sel_put_records(&f->fx);
	/* job k: the lists of the other end, state record k */
	for (uint32_t k = 0; k < NJ; k++) {
		f->record[k] = (NJ - 1 - k) * NKV;
		f->srec[k] = k;
	}
}

static struct tova_rule tx_args(struct tx *f, uint32_t sinks,
                                       uint32_t window)
{
	return (struct tova_rule){
		.state = f->state, .cap = CAP, .rows = {ST, RF, 0, H * HD},
		.sinks = sinks, .window = window,
	};
}

/* Half h of job k's positions, read back from the device. */
static void tx_half(struct tx *f, uint32_t k, uint32_t h, uint32_t *out)
{
	T_OK(f->fx.o->copy(f->fx.ctx, out,
	                   (uint32_t *)f->state +
	                           ((uint64_t)f->srec[k] * 2 + h) * CAP,
	                   CAP * sizeof(uint32_t), NULL));
}

/* Fresh staged rows for positions [seen0, seen0 + n_new) of every job. */
static void tx_stage(struct tx *f, uint32_t seen0, uint32_t n_new)
{
	for (uint32_t k = 0; k < NJ; k++) {
		for (uint32_t t = 0; t < n_new; t++)
			for (uint32_t e = 0; e < RF; e++)
				f->ring_h[k][((seen0 + t) % ST) * RF + e] =
					e < H * HD ? frnd()
					           : 0.5f * (float)(urnd() % 5);
		T_OK(f->fx.o->copy(f->fx.ctx, f->ring[k], f->ring_h[k],
		                   sizeof(f->ring_h[k]), NULL));
	}
}

/*
 * One sync of n_new tokens (positions [seen0, seen0 + n_new)) on both
 * jobs, due or not, budgets b[k]: the host does what tova_decide does, the
 * device rule "tova" (tova_rule.h); then both compact.  Returns the drops made.
 */
static uint32_t tx_sync(struct tx *f, uint32_t seen0, uint32_t n_new,
                        int due, const uint32_t *b, uint32_t sinks,
                        uint32_t window)
{
	const uint32_t seen = seen0 + n_new, qpos = seen - 1;
	tx_stage(f, seen0, n_new);
	struct tova_rule_job jobs[NJ];
	uint8_t want[NJ][CAP];
	uint32_t nd[NJ], off = 0, total = 0;
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t L = f->len[k] + n_new;
		uint32_t *pos = f->pos[k];
		for (uint32_t i = 0; i < n_new; i++)
			pos[f->len[k] + i] = seen0 + i;
		memset(want[k], 0, sizeof(want[k]));
		nd[k] = 0;
		uint32_t keep = 0;
		if (due) {
			/* the newest row's q and lse: tova_decide's policy_attn
			 * per KV head, part[g][i] summed in j order */
			const float *row = f->ring_h[k] + (qpos % ST) * RF;
			float part[NKV][CAP], w[G * CAP], ks[CAP * HD];
			for (uint32_t g = 0; g < NKV; g++) {
				void *pv[NP];
				sel_pages(&f->fx, f->record[k] + g, pv);
				attn_band_cpu(row + g * G * HD, row + H * HD + g * G,
				              &qpos, 1, G, pv, PT, HD,
				              KVT_DTYPE_F32, pos, L,
				              1.0f / sqrtf((float)HD), w, ks);
				for (uint32_t i = 0; i < L; i++) {
					float v = w[i];
					for (uint32_t j = 1; j < G; j++)
						v += w[j * L + i];
					part[g][i] = v;
				}
			}
			const float inv_h = 1.0f / (float)H;
			float s[CAP];
			uint8_t pr[CAP];
			uint32_t np = 0, scr[CAP];
			for (uint32_t i = 0; i < L; i++) {
				float v = part[0][i];
				for (uint32_t g = 1; g < NKV; g++)
					v += part[g][i];
				s[i] = v * inv_h;
				pr[i] = pos[i] < sinks ||
				        (window && pos[i] + (uint64_t)window >= seen);
				np += pr[i];
			}
			keep = b[k] > np ? b[k] - np : 0;
			nd[k] = select_topk_cpu(s, pos, pr, L, keep, want[k], scr);
		}
		jobs[k] = (struct tova_rule_job){
			.ring = f->ring[k], .record = f->record[k],
			.srec = f->srec[k], .cur = f->cur[k], .len = f->len[k],
			.n_new = n_new, .n_seen = seen, .due = (uint32_t)due,
			.keep = keep, .n_drop = nd[k], .drop_off = off,
		};
		off += nd[k];
		total += nd[k];
	}
	const struct tova_rule a = tx_args(f, sinks, window);
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NJ + NJ * CAP];
	memset(out, 0xff, sizeof(out));
	T_OK(sel_run(&f->fx, f->rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, jobs, NJ, out, 2 * NJ + off, NULL));
	struct kvt_backend_drops dl[NJ * NKV];
	uint32_t drops[NJ * CAP], ndl = 0, at = 0;
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t L = f->len[k] + n_new;
		T_EQ(out[k], 0);
		T_EQ(out[NJ + k], nd[k]);
		uint32_t m = 0;
		for (uint32_t i = 0; i < L; i++)
			if (want[k][i])
				T_EQ(out[2 * NJ + jobs[k].drop_off + m++], i);
		T_EQ(m, nd[k]);
		/* the half read is left as it was */
		uint32_t half[CAP];
		tx_half(f, k, f->cur[k], half);
		T_ASSERT(memcmp(half, f->pos[k], f->len[k] * 4) == 0);
		/* the host's compaction of its positions and every list's
		 * pages; the device's pages by compact_drops, one list of
		 * drops for all the job's lists */
		uint32_t moves[2 * CAP], nl;
		uint32_t nm = compact_plan(want[k], L, moves, &nl);
		T_EQ(nl, L - nd[k]);
		for (uint32_t i = 0; i < nm; i++)
			f->pos[k][moves[2 * i]] = f->pos[k][moves[2 * i + 1]];
		for (uint32_t g = 0; g < NKV; g++) {
			void *pv[NP];
			sel_pages(&f->fx, f->record[k] + g, pv);
			compact_cpu(pv, PT, HD * sizeof(float), moves, nm);
		}
		if (nd[k]) {
			for (uint32_t g = 0; g < NKV; g++)
				dl[ndl++] = (struct kvt_backend_drops){
					f->record[k] + g, L, nd[k], at};
			for (uint32_t i = 0; i < L; i++)
				if (want[k][i])
					drops[at++] = i;
		}
		f->len[k] = nl;
		f->cur[k] ^= 1;
		/* the device's new half: the positions, exactly */
		tx_half(f, k, f->cur[k], half);
		T_ASSERT(memcmp(half, f->pos[k], nl * 4) == 0);
	}
	if (ndl)
		T_OK(f->fx.o->compact_drops(f->fx.ctx, &pg, NR, dl, ndl, drops,
		                            NULL));
	T_ASSERT(sel_chunk_same(&f->fx));
	return total;
}

static void run_case(uint32_t sinks, uint32_t window, uint32_t every)
{
	struct tx f;
	tx_init(&f);
	const uint32_t b[NJ] = {10, 7};
	uint32_t seen = 0, drops = 0, skipped = 0;
	const uint32_t steps[] = {16, 1, 1, 3, 1, 1, 5, 1, 2, 1, 1, 1};
	for (uint32_t s = 0; s < sizeof(steps) / sizeof(*steps); s++) {
		const uint32_t n = steps[s];
		const int due = !every || (seen + n) / every > seen / every;
		drops += tx_sync(&f, seen, n, due, b, sinks, window);
		skipped += !due;
		seen += n;
	}
	/* the schedule made drops, and with every > 1 syncs not due */
	T_ASSERT(drops > 0);
	T_ASSERT(every < 2 || skipped > 0);
	sel_fini(&f.fx);
}

TEST(cuda, backend_tova_rule_matches_tova)
{
	run_case(0, 1, 0); /* tova's defaults: window 1, no sinks */
	run_case(2, 3, 0); /* sinks and a wider window */
	run_case(1, 0, 4); /* no window, every 4 (syncs not due) */
}

TEST(cuda, backend_tova_rule_flags_and_refuses)
{
	struct tx f;
	tx_init(&f);
	const uint32_t b[NJ] = {6, 6};
	tx_sync(&f, 0, 8, 1, b, 0, 1);
	/* job 1's next two rows: a NaN in the newest row's lse (the last
	 * query head's) is flagged */
	tx_stage(&f, 8, 2);
	f.ring_h[1][9 * RF + H * HD + H - 1] = NAN;
	T_OK(f.fx.o->copy(f.fx.ctx, f.ring[1], f.ring_h[1], sizeof(f.ring_h[1]),
	                  NULL));
	struct tova_rule_job j = {
		.ring = f.ring[1], .record = f.record[1], .srec = f.srec[1],
		.cur = f.cur[1], .len = f.len[1], .n_new = 2, .n_seen = 10,
	};
	const struct tova_rule a = tx_args(&f, 0, 1);
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[8];
	memset(out, 0, sizeof(out));
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &j, 1, out, 2, NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], 0);
	/* also when due (the count is what the caller said, 0 here) */
	j.due = 1;
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &j, 1, out, 2, NULL));
	T_EQ(out[0], 1);
	/* the same rows made finite: not flagged */
	j.due = 0;
	f.ring_h[1][9 * RF + H * HD + H - 1] = 0.5f;
	T_OK(f.fx.o->copy(f.fx.ctx, f.ring[1], f.ring_h[1], sizeof(f.ring_h[1]),
	                  NULL));
	out[0] = 7;
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &j, 1, out, 2, NULL));
	T_EQ(out[0], 0);
	/* a NaN in the q of the sync's older row (every new row is checked) */
	f.ring_h[1][8 * RF + 3] = NAN;
	T_OK(f.fx.o->copy(f.fx.ctx, f.ring[1], f.ring_h[1], sizeof(f.ring_h[1]),
	                  NULL));
	T_OK(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &j, 1, out, 2, NULL));
	T_EQ(out[0], 1);
	/* refusals */
	struct tova_rule_job bad = j;
	bad.record = NR - NKV + 1; /* its last list beyond n_records */
	T_EQ(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j;
	bad.srec = NR / NKV;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j;
	bad.len = CAP - 1; /* len + n_new = CAP + 1 */
	T_EQ(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j;
	bad.n_new = 0;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j;
	bad.n_drop = 1; /* its index at out[2] of 2 words */
	T_EQ(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad.drop_off = 5; /* out[7] of 7 words */
	T_EQ(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 7, NULL), KVT_EINVAL);
	T_EQ(sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, H + 1, NKV,
	             HD, &a, &j, 1, out, 2, NULL), KVT_EINVAL);
	/* the refusals and the flagged calls left the half read alone */
	uint32_t half[CAP];
	tx_half(&f, 1, f.cur[1], half);
	T_ASSERT(memcmp(half, f.pos[1], f.len[1] * 4) == 0);
	sel_fini(&f.fx);
}
