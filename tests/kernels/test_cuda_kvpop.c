/*
 * test_cuda_kvpop.c — the cuda backend's device rule "kvpop" (KVpop's rule
 * on the device, policies/kvpop.cu) against the cpu policy's own operations
 * (policies/kvpop.c: u = P x by scorer_linear_cpu into a ring of delay +
 * headroom rows, the band's attn_band_cpu weights summed per entry in t and
 * j order over the queries within the delay and, with a memory, every
 * entry's decayed sum and count of those after it, kvpop_score's loops for
 * the entries whose delay ends, the protection, the memory's blend or the
 * learned memory's readout (its layer's decay and weights), then
 * select_topk_cpu ranked by position, compact_plan's moves), written out
 * here naively: over several
 * syncs of the two lists of one (sequence, layer) of layer 1 (a 12-token
 * prefill, decode steps, syncs whose new rows wrap round the staging ring's
 * end, syncs that are not due, f32 and f16 pages), with the pages compacted
 * by compact_drops between syncs, the drop indices and the positions must be
 * the host's, a, s and the u ring within 1e-5 relative (on the emulator,
 * whose cuBLAS is OpenBLAS, the same bits; a GPU's SGEMM, FMA, expf, logf
 * and erff round differently).  Then a NaN in a new row's x is flagged by
 * the proj job, a band that is not the caller's n_band fails the job's
 * count, and the refusals.  Built into kvtrim-cuda-tests and, under the CPU
 * emulator, kvtrim-cuda-emu-tests; skips without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "dtype.h"
#include "kernels.h"
#include "kvpop_rule.h"
#include "test.h"

#define SEL_SEED 31
#include "select_fixture.h"

enum { HD = 8, PT = 4, G = 2, NKV = 2, H = G * NKV, NP = 12, CAP = NP * PT,
       ST = 16, D = 12, R = 3, M = 5, NL = 2, LAYER = 1, DELAY = 3,
       HEADROOM = 12, RING = DELAY + HEADROOM, Q_OFF = D,
       LSE_OFF = D + H * HD, RF = D + H * HD + H };

#define LF (R * D + M * (R + 1) + M + NKV * M + NKV)

/* The rule's memory with the learned table (policies' memory=learned). */
#define LEARNED UINT32_MAX

/* The chunk of NKV lists of dtype dt (select_fixture.h) and the kvpop
 * state. */
struct px {
	struct sel_fx fx;
	const struct kvt_backend_rule *rule;
	enum kvt_dtype dt;
	size_t esz;
	uint32_t window; /* the rule's recent window (0: none) */
	uint32_t memory; /* the memory's decay in tokens (0: none; LEARNED) */
	float trust;     /* the learned score's weight beside it */
	uint32_t F;      /* floats an entry: 2, with a memory 4 */
	/* the learned memory: per layer its decay in tokens and readout
	 * weights w_s, w_f (lmem), the table the rule reads (beta, w_s, w_f;
	 * mem on the device) */
	float lmem[NL][3];
	void *state, *ring, *u, *w, *mem;
	float ring_h[ST * RF];
	float w_h[NL * LF];
	float u_h[RING * R]; /* the host's u ring */
	/* the host's state per list */
	uint32_t len[NKV], pos[NKV][CAP], cur[NKV];
	float ent[NKV][CAP * 4];
};

/* memory and trust: the rule's (memory 0: none). */
static void px_init(struct px *f, enum kvt_dtype dt, uint32_t memory,
                    float trust)
{
	memset(f, 0, sizeof(*f));
	f->memory = memory;
	f->trust = trust;
	f->F = memory ? 4 : 2;
	f->dt = dt;
	f->esz = kvt_dtype_size(dt);
	sel_init(&f->fx, PT, (uint32_t)(HD * f->esz), NKV, NP);
	f->rule = sel_rule(&f->fx, "kvpop", KVPOP_RULE_VERSION,
	                   sizeof(struct kvpop_rule),
	                   sizeof(struct kvpop_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NKV * 2 * CAP * (1 + f->F) * 4);
	f->ring = sel_mem(&f->fx, sizeof(f->ring_h));
	f->u = sel_mem(&f->fx, sizeof(f->u_h));
	f->w = sel_mem(&f->fx, sizeof(f->w_h));
	sel_fill_floats(&f->fx, dt);
	for (uint32_t i = 0; i < NL * LF; i++)
		f->w_h[i] = frnd();
	T_OK(f->fx.o->copy(f->fx.ctx, f->w, f->w_h, sizeof(f->w_h), NULL));
}

/* The learned memory (memory LEARNED) of decay T tokens and readout w_s,
 * w_f in layer LAYER (the other layer's row: a decay of 64 and weights
 * that would rank otherwise, never to be read). */
static void px_learned(struct px *f, float T, float ws, float wf)
{
	const float rows[NL][3] = {{64.0f, -3.0f, 7.0f}, {T, ws, wf}};
	float tab[NL * 3];
	memcpy(f->lmem, rows, sizeof(rows));
	for (uint32_t l = 0; l < NL; l++) {
		tab[3 * l] = expf(-1.0f / f->lmem[l][0]);
		tab[3 * l + 1] = f->lmem[l][1];
		tab[3 * l + 2] = f->lmem[l][2];
	}
	f->mem = sel_mem(&f->fx, sizeof(tab));
	T_OK(f->fx.o->copy(f->fx.ctx, f->mem, tab, sizeof(tab), NULL));
}

static struct kvpop_rule px_pop(struct px *f, uint32_t sinks)
{
	return (struct kvpop_rule){
		.state = f->state, .u = f->u, .weights = f->w, .cap = CAP,
		.rows = {ST, RF, Q_OFF, LSE_OFF}, .d_model = D, .r = R, .m = M,
		.ring = RING,
		.delay = DELAY, .sinks = sinks, .window = f->window,
		.memory = f->memory,
		.beta = f->memory && !f->mem ? expf(-1.0f / (float)f->memory)
		                             : 0.0f,
		.trust = f->trust, .mem = f->mem,
	};
}

/* Entry i's K row in the host image. */
static void *px_row(struct px *f, uint32_t g, uint32_t i)
{
	return f->fx.h_chunk + sel_rec(&f->fx, g)->pages[i / PT] *
	       f->fx.page_bytes + (size_t)(i % PT) * HD * f->esz;
}

/* kvpop_score, as written in policies/kvpop.c. */
static float score_of(const float *wl, uint32_t g, const float *u, float f)
{
	const float *W1 = wl + R * D, *b1 = W1 + M * (R + 1), *W2 = b1 + M,
	            *b2 = W2 + NKV * M;
	float hid[M];
	for (uint32_t o = 0; o < M; o++) {
		const float *w = W1 + o * (R + 1);
		float z = b1[o];
		for (uint32_t c = 0; c < R; c++)
			z += w[c] * u[c];
		z += w[R] * f;
		hid[o] = 0.5f * z * (1.0f + erff(z * 0.70710678118654752440f));
	}
	float s = b2[g];
	for (uint32_t o = 0; o < M; o++)
		s += W2[g * M + o] * hid[o];
	return s;
}

static int close_to(float got, float want)
{
	return fabsf(got - want) <= 1e-5f * fabsf(want) + 1e-6f;
}

/* The band of list g for a sync whose first new position is prev: its
 * entries' indices in order (with a memory, every entry), their count
 * returned. */
static uint32_t band_of(struct px *f, uint32_t g, uint32_t L, uint32_t prev,
                        uint32_t *idx)
{
	uint32_t c = 0;
	for (uint32_t i = 0; i < L; i++)
		if (f->memory || (uint64_t)f->pos[g][i] + DELAY >= prev)
			idx[c++] = i;
	return c;
}

/*
 * One sync of n_new tokens (positions [seen0, seen0 + n_new)) on both
 * lists, due or not, budget b: the host does what kvpop_decide does, the
 * device rule "kvpop" (kvpop_rule.h); then both compact.
 */
static void px_sync(struct px *f, uint32_t seen0, uint32_t n_new, int due,
                    uint32_t b, uint32_t sinks)
{
	const uint32_t seen = seen0 + n_new, prev = seen0, F = f->F;
	const float *wl = f->w_h + LAYER * LF;
	const float beta = f->mem ? expf(-1.0f / f->lmem[LAYER][0])
	                   : f->memory ? expf(-1.0f / (float)f->memory)
	                   : 0.0f;
	for (uint32_t t = 0; t < n_new; t++)
		for (uint32_t e = 0; e < RF; e++)
			f->ring_h[((seen0 + t) % ST) * RF + e] =
				e < LSE_OFF ? frnd() : 0.5f * (float)(urnd() % 5);
	T_OK(f->fx.o->copy(f->fx.ctx, f->ring, f->ring_h, sizeof(f->ring_h),
	                   NULL));
	/* u of the new rows, as kvpop_decide: one scorer_linear_cpu */
	if (n_new) {
		float x[ST * D], u[ST * R];
		for (uint32_t t = 0; t < n_new; t++)
			memcpy(x + t * D, f->ring_h + ((seen0 + t) % ST) * RF,
			       D * sizeof(float));
		scorer_linear_cpu(x, n_new, D, wl, NULL, R, u);
		for (uint32_t t = 0; t < n_new; t++)
			memcpy(f->u_h + ((seen0 + t) % RING) * R, u + t * R,
			       R * sizeof(float));
	}
	struct kvpop_rule_job jobs[NKV];
	uint8_t want[NKV][CAP];
	uint32_t nd[NKV], off = 0;
	for (uint32_t g = 0; g < NKV; g++) {
		uint32_t L = f->len[g] + n_new, *pos = f->pos[g];
		float *ent = f->ent[g];
		T_ASSERT(L <= CAP);
		for (uint32_t k = 0; k < n_new; k++) {
			pos[f->len[g] + k] = seen0 + k;
			for (uint32_t c = 0; c < F; c++)
				ent[(f->len[g] + k) * F + c] = 0.0f;
		}
		uint32_t idx[CAP], nb = band_of(f, g, L, prev, idx);
		if (n_new && DELAY && nb) {
			/* attn_band_cpu over one-row "pages", as kvpop */
			float qg[ST * G * HD], lg[ST * G], w[ST * G * CAP],
			      ks[CAP * HD];
			uint32_t qpos[ST], kp[CAP];
			void *rows[CAP];
			for (uint32_t t = 0; t < n_new; t++) {
				const float *row =
					f->ring_h + ((seen0 + t) % ST) * RF;
				memcpy(qg + t * G * HD, row + Q_OFF + g * G * HD,
				       G * HD * sizeof(float));
				memcpy(lg + t * G, row + LSE_OFF + g * G,
				       G * sizeof(float));
				qpos[t] = seen0 + t;
			}
			for (uint32_t e = 0; e < nb; e++) {
				kp[e] = pos[idx[e]];
				rows[e] = px_row(f, g, idx[e]);
			}
			attn_band_cpu(qg, lg, qpos, n_new, G, rows, 1, HD, f->dt,
			              kp, nb, 1.0f / sqrtf((float)HD), w, ks);
			for (uint32_t e = 0; e < nb; e++) {
				float *acc = &ent[idx[e] * F];
				for (uint32_t t = 0; t < n_new; t++) {
					if (qpos[t] <= kp[e] ||
					    (!f->memory && qpos[t] - kp[e] > DELAY))
						continue;
					float v = 0.0f;
					for (uint32_t j = 0; j < G; j++)
						v += w[(t * G + j) * nb + e];
					v /= (float)G;
					if (qpos[t] - kp[e] <= DELAY) {
						acc[0] += v;
					} else {
						acc[2] = beta * acc[2] + v;
						acc[3] = beta * acc[3] + 1.0f;
					}
				}
			}
		}
		for (uint32_t i = 0; i < L; i++) {
			uint64_t pd = (uint64_t)pos[i] + DELAY;
			if (pd < prev || pd >= seen)
				continue;
			ent[i * F + 1] = score_of(wl, g, f->u_h + (pos[i] % RING) * R,
			                          logf(ent[i * F] + 1e-6f));
		}
		float sc[CAP];
		uint8_t pr[CAP];
		uint32_t np = 0, scr[CAP];
		for (uint32_t i = 0; i < L; i++) {
			const float *e = &ent[i * F];
			sc[i] = e[1];
			if (f->mem) /* w_s s + w_f ln(m / c or a / delay) */
				sc[i] = f->lmem[LAYER][1] * e[1] +
				        f->lmem[LAYER][2] *
				                logf((e[3] > 0.0f ? e[2] / e[3]
				                                  : e[0] / DELAY) +
				                     1e-6f);
			else if (f->memory && e[3] > 0.0f)
				sc[i] = (f->trust * e[1] +
				         e[3] * logf(128.0f * e[2] / e[3] + 1e-6f)) /
				        (f->trust + e[3]);
			pr[i] = (uint64_t)pos[i] + DELAY >= seen ||
			        pos[i] < sinks ||
			        (f->window &&
			         (uint64_t)pos[i] + f->window >= seen);
			np += pr[i];
		}
		uint32_t keep = b > np ? b - np : 0;
		memset(want[g], 0, L);
		nd[g] = due && L ? select_topk_cpu(sc, pos, pr, L, keep, want[g],
		                                   scr)
		                 : 0;
		jobs[g] = (struct kvpop_rule_job){
			.ring = f->ring, .layer = LAYER, .record = g,
			.cur = f->cur[g], .proj = g == 0,
			.len = f->len[g], .n_new = n_new, .n_seen = seen,
			.n_band = n_new ? nb : 0, .due = (uint32_t)due,
			.keep = keep, .n_drop = nd[g], .drop_off = off,
		};
		off += nd[g];
	}
	const struct kvpop_rule a = px_pop(f, sinks);
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NKV + NKV * CAP];
	T_OK(sel_run(&f->fx, f->rule, &pg, NKV, f->dt, H, NKV, HD, &a,
	             jobs, NKV, out, 2 * NKV + off, NULL));
	float ud[RING * R];
	T_OK(f->fx.o->copy(f->fx.ctx, ud, f->u, sizeof(ud), NULL));
	for (uint32_t i = 0; i < RING * R; i++)
		T_ASSERT(close_to(ud[i], f->u_h[i]));
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
			memcpy(f->ent[g] + moves[2 * m] * F,
			       f->ent[g] + moves[2 * m + 1] * F, F * sizeof(float));
		}
		void *pv[NP];
		sel_pages(&f->fx, g, pv);
		compact_cpu(pv, PT, (uint32_t)(HD * f->esz), moves, nm);
		if (nd[g]) {
			dl[ndl++] = (struct kvt_backend_drops){g, L, nd[g], at};
			for (uint32_t i = 0; i < L; i++)
				if (want[g][i])
					drops[at++] = i;
		}
		f->len[g] = nl;
		f->cur[g] ^= 1;
		/* the device's new half: positions, a, s (and m, c) */
		uint32_t half[CAP * 5];
		T_OK(f->fx.o->copy(f->fx.ctx, half,
		                   (uint32_t *)f->state +
		                           ((uint64_t)g * 2 + f->cur[g]) * CAP *
		                                   (1 + F),
		                   (size_t)CAP * (1 + F) * 4, NULL));
		T_ASSERT(memcmp(half, f->pos[g], nl * 4) == 0);
		const float *ds = (const float *)(half + CAP);
		for (uint32_t i = 0; i < nl * F; i++)
			T_ASSERT(close_to(ds[i], f->ent[g][i]));
	}
	if (ndl)
		T_OK(f->fx.o->compact_drops(f->fx.ctx, &pg, NKV, dl, ndl, drops,
		                            NULL));
	T_ASSERT(sel_chunk_same(&f->fx));
}

/* lm: the learned memory's decay and readout {T, w_s, w_f} (memory
 * LEARNED), else NULL. */
static void run_case_lm(enum kvt_dtype dt, uint32_t sinks, uint32_t every,
                        uint32_t window, uint32_t memory, float trust,
                        const float *lm)
{
	struct px f;
	px_init(&f, dt, memory, trust);
	if (lm)
		px_learned(&f, lm[0], lm[1], lm[2]);
	f.window = window;
	const uint32_t b = 10;
	uint32_t seen = 0;
	/* 15 .. 17 and 30 .. 33 wrap round the staging ring (16 rows) */
	const uint32_t steps[] = {12, 3, 2, 4, 2, 5, 1, 1, 3, 6, 1};
	for (uint32_t s = 0; s < sizeof(steps) / sizeof(*steps); s++) {
		const uint32_t n = steps[s];
		const int due = !every || (seen + n) / every > seen / every;
		px_sync(&f, seen, n, due, b, sinks);
		seen += n;
	}
	/* a sync of no new rows that is due: selection only */
	px_sync(&f, seen, 0, 1, b - 2, sinks);
	sel_fini(&f.fx);
}

static void run_case(enum kvt_dtype dt, uint32_t sinks, uint32_t every,
                     uint32_t window, uint32_t memory, float trust)
{
	run_case_lm(dt, sinks, every, window, memory, trust, NULL);
}

TEST(cuda, backend_kvpop_rule_matches_kvpop)
{
	run_case(KVT_DTYPE_F32, 0, 0, 0, 0, 0);  /* every sync due */
	run_case(KVT_DTYPE_F32, 2, 4, 0, 0, 0);  /* sinks, every 4 */
	run_case(KVT_DTYPE_F16, 1, 0, 0, 0, 0);  /* f16 pages */
	/* a recent window longer than the delay (half the budget of 10, as
	 * kvpop's spec would give it), and one shorter */
	run_case(KVT_DTYPE_F32, 1, 0, 5, 0, 0);
	run_case(KVT_DTYPE_F32, 0, 3, 2, 0, 0);
	/* a memory: alone (trust 0), blended, with a window and every, f16 */
	run_case(KVT_DTYPE_F32, 0, 0, 0, 6, 0.0f);
	run_case(KVT_DTYPE_F32, 1, 0, 5, 4, 3.0f);
	run_case(KVT_DTYPE_F16, 2, 3, 0, 20, 0.5f);
	/* the learned memory: the readout alone, beside the score, the
	 * score alone (w_f 0), with sinks, a window and every, f16 */
	const float lm[][3] = {{16.0f, 0.0f, 1.0f}, {4.0f, 0.7f, 1.3f},
	                       {1.0f, 1.0f, 0.0f}, {64.0f, 0.5f, 2.0f}};
	run_case_lm(KVT_DTYPE_F32, 0, 0, 0, LEARNED, 0.0f, lm[0]);
	run_case_lm(KVT_DTYPE_F32, 1, 0, 5, LEARNED, 0.0f, lm[1]);
	run_case_lm(KVT_DTYPE_F32, 0, 2, 0, LEARNED, 0.0f, lm[2]);
	run_case_lm(KVT_DTYPE_F16, 2, 3, 2, LEARNED, 0.0f, lm[3]);
}

TEST(cuda, backend_kvpop_rule_flags_and_refuses)
{
	struct px f;
	px_init(&f, KVT_DTYPE_F32, 0, 0.0f);
	px_sync(&f, 0, 8, 1, 6, 0);
	/* a NaN in a new row's x: flagged by the proj job only */
	for (uint32_t e = 0; e < RF; e++)
		f.ring_h[8 * RF + e] = 0.5f;
	f.ring_h[8 * RF + 5] = NAN;
	T_OK(f.fx.o->copy(f.fx.ctx, f.ring, f.ring_h, sizeof(f.ring_h), NULL));
	struct kvpop_rule_job j[2];
	uint32_t idx[CAP];
	for (uint32_t g = 0; g < NKV; g++) {
		f.pos[g][f.len[g]] = 8;
		j[g] = (struct kvpop_rule_job){
			.ring = f.ring, .layer = LAYER, .record = g,
			.cur = f.cur[g], .proj = g == 0, .len = f.len[g],
			.n_new = 1, .n_seen = 9,
			.n_band = band_of(&f, g, f.len[g] + 1, 8, idx),
		};
	}
	const struct kvpop_rule a = px_pop(&f, 0);
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[8];
	T_OK(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, j, 2, out, 4, NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], 0);
	T_EQ(out[2], 0);
	T_EQ(out[3], 0);
	/* a band that is not the caller's count: the job's count fails */
	struct kvpop_rule_job bad = j[1];
	T_ASSERT(bad.n_band > 0);
	bad.n_band--;
	bad.due = 1;
	T_OK(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL));
	T_EQ(out[1], 0xffffffffu);
	bad.n_band += 2;
	T_OK(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL));
	T_EQ(out[1], 0xffffffffu);
	/* refusals */
	bad = j[1];
	bad.record = NKV;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j[1];
	bad.n_band = bad.len + bad.n_new + 1;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j[1];
	bad.n_drop = 1;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j[1];
	bad.len = CAP;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a, &bad, 1, out, 2, NULL), KVT_EINVAL);
	bad = j[1];
	bad.n_new = 2;
	bad.n_seen = 10;
	struct kvpop_rule a2 = a;
	a2.ring = 1; /* n_new beyond the u ring */
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a2, &bad, 1, out, 2, NULL), KVT_EINVAL);
	a2 = a;
	a2.r = 0;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a2, &j[1], 1, out, 2, NULL), KVT_EINVAL);
	a2 = a;
	a2.m = 0;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a2, &j[1], 1, out, 2, NULL), KVT_EINVAL);
	/* a memory whose decay or trust is not one */
	const float badf[][2] = {{0.0f, 0.0f}, {1.0f, 0.0f}, {NAN, 0.0f},
	                         {0.5f, -1.0f}, {0.5f, INFINITY}};
	for (size_t b = 0; b < sizeof(badf) / sizeof(badf[0]); b++) {
		a2 = a;
		a2.memory = 8;
		a2.beta = badf[b][0];
		a2.trust = badf[b][1];
		T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV,
		             HD, &a2, &j[1], 1, out, 2, NULL), KVT_EINVAL);
	}
	/* a learned memory's table without a memory */
	a2 = a;
	a2.mem = (const float *)f.w;
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, HD,
	             &a2, &j[1], 1, out, 2, NULL), KVT_EINVAL);
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H, NKV, 0,
	             &a, &j[1], 1, out, 2, NULL), KVT_EINVAL);
	T_EQ(sel_run(&f.fx, f.rule, &pg, NKV, KVT_DTYPE_F32, H + 1, NKV,
	             HD, &a, &j[1], 1, out, 2, NULL), KVT_EINVAL);
	sel_fini(&f.fx);
}
