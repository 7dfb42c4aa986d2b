/*
 * test_cuda_h2o.c — the cuda backend's device rule "h2o" (H2O's rule on the
 * device, policies/h2o.cu) against the cpu policy's own operations
 * (policies/h2o.c: attn_band_cpu's weights summed per entry and query head
 * in t order, the mean or max over the group or observed_attention's mean of
 * S / count, the protection, then select_topk_cpu ranked by position,
 * compact_plan's moves): over several syncs of two lists (a prefill, decode
 * steps, a sync that is not due), with the pages compacted by compact_drops
 * between syncs, the drop indices and the positions must be the host's, S
 * within 1e-5 relative (on the emulator, whose cuBLAS is OpenBLAS, S is the
 * same bits; a GPU's SGEMM and expf round differently).  Then a NaN in a new
 * row is flagged, and the refusals.  Built into kvtrim-cuda-tests and, under
 * the CPU emulator, kvtrim-cuda-emu-tests; skips without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "kernels.h"
#include "h2o_rule.h"
#include "test.h"

#define SEL_SEED 29
#include "select_fixture.h"

enum { HD = 8, PT = 4, G = 2, NKV = 2, H = G * NKV, NP = 12, CAP = NP * PT,
       ST = 16, RF = H * HD + H };

/* The chunk of NKV lists (select_fixture.h) and the h2o state. */
struct hx {
	struct sel_fx fx;
	const struct kvt_backend_rule *rule;
	void *state, *ring;
	float ring_h[ST * RF];
	/* the host's state per list */
	uint32_t len[NKV], pos[NKV][CAP], cur[NKV];
	float S[NKV][CAP * G];
};

static void hx_init(struct hx *f)
{
	memset(f, 0, sizeof(*f));
	sel_init(&f->fx, PT, HD * sizeof(float), NKV, NP);
	f->rule = sel_rule(&f->fx, "h2o", H2O_RULE_VERSION,
	                   sizeof(struct h2o_rule),
	                   sizeof(struct h2o_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NKV * 2 * CAP * (1 + G) * 4);
	f->ring = sel_mem(&f->fx, sizeof(f->ring_h));
	sel_fill_floats(&f->fx, KVT_DTYPE_F32);
}

static int prot_of(uint32_t p, uint32_t seen, uint32_t sinks,
                   uint32_t window, uint32_t recent)
{
	return (recent && p + (uint64_t)recent >= seen) || p < sinks ||
	       (window && p + (uint64_t)window >= seen);
}

/*
 * One sync of n_new tokens (positions [seen0, seen0 + n_new)) on both
 * lists, due or not, budget b: the host does what h2o_decide does, the
 * device rule "h2o" (h2o_rule.h); then both compact.
 */
static void hx_sync(struct hx *f, uint32_t seen0, uint32_t n_new, int due,
                    uint32_t b, uint32_t agg, uint32_t sinks,
                    uint32_t window, uint32_t recent)
{
	const uint32_t seen = seen0 + n_new;
	for (uint32_t t = 0; t < n_new; t++)
		for (uint32_t e = 0; e < RF; e++)
			f->ring_h[((seen0 + t) % ST) * RF + e] =
				e < H * HD ? frnd() : 0.5f * (float)(urnd() % 5);
	T_OK(f->fx.o->copy(f->fx.ctx, f->ring, f->ring_h, sizeof(f->ring_h),
	                   NULL));
	struct h2o_rule_job jobs[NKV];
	uint8_t want[NKV][CAP];
	uint32_t nd[NKV], off = 0;
	for (uint32_t g = 0; g < NKV; g++) {
		uint32_t L = f->len[g] + n_new, *pos = f->pos[g];
		float *S = f->S[g];
		for (uint32_t k = 0; k < n_new; k++) {
			pos[f->len[g] + k] = seen0 + k;
			for (uint32_t j = 0; j < G; j++)
				S[(f->len[g] + k) * G + j] = 0.0f;
		}
		/* attn_band_cpu over the group's q and lse, as policy_attn */
		float qg[ST * G * HD], lg[ST * G], w[ST * G * CAP], ks[CAP * HD];
		uint32_t qpos[ST];
		for (uint32_t t = 0; t < n_new; t++) {
			const float *row = f->ring_h + ((seen0 + t) % ST) * RF;
			memcpy(qg + t * G * HD, row + g * G * HD,
			       G * HD * sizeof(float));
			memcpy(lg + t * G, row + H * HD + g * G,
			       G * sizeof(float));
			qpos[t] = seen0 + t;
		}
		void *pv[NP];
		sel_pages(&f->fx, g, pv);
		if (n_new) {
			attn_band_cpu(qg, lg, qpos, n_new, G, pv, PT, HD,
			              KVT_DTYPE_F32, pos, L,
			              1.0f / sqrtf((float)HD), w, ks);
			for (uint32_t t = 0; t < n_new; t++)
				for (uint32_t j = 0; j < G; j++)
					for (uint32_t i = 0; i < L; i++)
						S[i * G + j] += w[(t * G + j) * L + i];
		}
		float sc[CAP];
		uint8_t pr[CAP];
		uint32_t np = 0, scr[CAP];
		for (uint32_t i = 0; i < L; i++) {
			const float *e = S + i * G;
			float v = e[0];
			if (agg == 2) { /* kvpress: each head's S / count, mean */
				const float c = (float)(seen - pos[i]);
				v = e[0] / c;
				for (uint32_t j = 1; j < G; j++)
					v += e[j] / c;
				sc[i] = v / (float)G;
			} else {
				for (uint32_t j = 1; j < G; j++)
					v = agg ? (e[j] > v ? e[j] : v) : v + e[j];
				sc[i] = agg ? v : v / (float)G;
			}
			pr[i] = (uint8_t)prot_of(pos[i], seen, sinks, window, recent);
			np += pr[i];
		}
		uint32_t keep = b > np ? b - np : 0;
		memset(want[g], 0, L);
		nd[g] = due ? select_topk_cpu(sc, pos, pr, L, keep, want[g], scr)
		            : 0;
		jobs[g] = (struct h2o_rule_job){
			.ring = f->ring, .record = g, .g = g, .cur = f->cur[g],
			.len = f->len[g], .n_new = n_new, .n_seen = seen,
			.due = (uint32_t)due, .recent = recent, .keep = keep,
			.n_drop = nd[g], .drop_off = off,
		};
		off += nd[g];
	}
	const struct h2o_rule a = {
		.state = f->state, .cap = CAP, .rows = {ST, RF, 0, H * HD},
		.agg = agg,
		.sinks = sinks, .window = window,
	};
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NKV + NKV * CAP];
	T_OK(sel_run(&f->fx, f->rule, &pg, NKV, KVT_DTYPE_F32, H, NKV,
	             HD, &a, jobs, NKV, out, 2 * NKV + off, NULL));
	struct kvt_backend_drops dl[NKV];
	uint32_t drops[NKV * CAP], ndl = 0, at = 0;
	for (uint32_t g = 0; g < NKV; g++) {
		const uint32_t L = f->len[g] + n_new;
		T_EQ(out[g], 0);
		T_EQ(out[NKV + g], nd[g]);
		uint32_t k = 0;
		for (uint32_t i = 0; i < L; i++)
			if (want[g][i])
				T_EQ(out[2 * NKV + jobs[g].drop_off + k++], i);
		/* the host's compaction of its state and pages */
		uint32_t moves[2 * CAP], nl;
		uint32_t nm = compact_plan(want[g], L, moves, &nl);
		for (uint32_t m = 0; m < nm; m++) {
			f->pos[g][moves[2 * m]] = f->pos[g][moves[2 * m + 1]];
			memcpy(f->S[g] + moves[2 * m] * G,
			       f->S[g] + moves[2 * m + 1] * G, G * sizeof(float));
		}
		void *pv[NP];
		sel_pages(&f->fx, g, pv);
		compact_cpu(pv, PT, HD * sizeof(float), moves, nm);
		if (nd[g]) {
			dl[ndl++] = (struct kvt_backend_drops){g, L, nd[g], at};
			for (uint32_t i = 0; i < L; i++)
				if (want[g][i])
					drops[at++] = i;
		}
		f->len[g] = nl;
		f->cur[g] ^= 1;
		/* the device's new half: positions and S bit for bit */
		uint32_t half[CAP * (1 + G)];
		T_OK(f->fx.o->copy(f->fx.ctx, half,
		                   (uint32_t *)f->state +
		                           ((uint64_t)g * 2 + f->cur[g]) * CAP *
		                                   (1 + G),
		                   sizeof(half), NULL));
		T_ASSERT(memcmp(half, f->pos[g], nl * 4) == 0);
		const float *ds = (const float *)(half + CAP);
		for (uint32_t i = 0; i < nl * G; i++)
			T_ASSERT(fabsf(ds[i] - f->S[g][i]) <=
			         1e-5f * fabsf(f->S[g][i]) + 1e-6f);
	}
	if (ndl)
		T_OK(f->fx.o->compact_drops(f->fx.ctx, &pg, NKV, dl, ndl, drops,
		                            NULL));
	T_ASSERT(sel_chunk_same(&f->fx));
}

static void run_case(uint32_t agg, uint32_t sinks, uint32_t window,
                     uint32_t every)
{
	struct hx f;
	hx_init(&f);
	const uint32_t b = 14, recent = window || agg == 2 ? 0 : b / 2;
	uint32_t seen = 0;
	const uint32_t steps[] = {12, 3, 1, 4, 2, 5, 1, 1, 3};
	for (uint32_t s = 0; s < sizeof(steps) / sizeof(*steps); s++) {
		const uint32_t n = steps[s];
		const int due = !every || (seen + n) / every > seen / every;
		hx_sync(&f, seen, n, due, b, agg, sinks, window, recent);
		seen += n;
	}
	sel_fini(&f.fx);
}

TEST(cuda, backend_h2o_rule_matches_h2o)
{
	run_case(0, 0, 0, 0); /* mean, recent = budget / 2 */
	run_case(1, 2, 0, 0); /* max, sinks */
	run_case(0, 1, 3, 4); /* window given (no recent), every 4 */
	run_case(2, 0, 0, 0); /* observed_attention: nothing protected */
}

TEST(cuda, backend_h2o_rule_flags_and_refuses)
{
	struct hx f;
	hx_init(&f);
	hx_sync(&f, 0, 8, 1, 6, 0, 0, 0, 3);
	/* a NaN in a new row's q of another group: flagged */
	for (uint32_t e = 0; e < RF; e++)
		f.ring_h[8 * RF + e] = 0.5f;
	f.ring_h[8 * RF + 3] = NAN;
	T_OK(f.fx.o->copy(f.fx.ctx, f.ring, f.ring_h, sizeof(f.ring_h), NULL));
	struct h2o_rule_job j = {
		.ring = f.ring, .record = 1, .g = 1, .cur = f.cur[1],
		.len = f.len[1], .n_new = 1, .n_seen = 9,
	};
	const struct h2o_rule a = {
		.state = f.state, .cap = CAP, .rows = {ST, RF, 0, H * HD},
	};
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[8];
	T_OK(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &j, 1, out, 2, NULL));
	T_EQ(out[0], 1);
	/* refusals */
	struct h2o_rule_job bad = j;
	bad.record = NKV;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j;
	bad.len = CAP;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j;
	bad.n_drop = 1;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H + 1, NKV,
	             HD, &a, &j, 1, out, 2, NULL), KVT_EINVAL);
	sel_fini(&f.fx);
}
