/*
 * test_cuda_snapkv.c — the cuda backend's device rule "snapkv" (SnapKV's
 * end-of-prefill selection on the device, policies/snapkv.cu, run by
 * snapkv and pyramidkv) against its rule computed in double
 * (snapkv_rule.h: the window's attention, max-pooled, the window and the
 * sinks protected, the best keep of the others): one job a list, prompts
 * of ragged lengths, a NaN in a staged row flagged (a job that only checks
 * rows too), the refusals changing nothing, and the launches of a call the
 * same whatever its jobs.  Built into kvtrim-cuda-tests and, under the CPU
 * emulator, kvtrim-cuda-emu-tests; skips without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernels.h"
#include "snapkv_rule.h"
#include "test.h"

#define SEL_SEED 11
#define SEL_FRND_STEPS 10000
#include "select_fixture.h"

#define DR_LISTS 7
#define DR_PAGES 9 /* pages per list */

/* The launches a call may take, whatever its jobs (docs/cuda.md). */
#define SK_BOUND 5

/* The rule of snapkv_rule.h in double, for the list of record r (KV
 * head g) of the fixture: its drop marks. */
static void window_naive(const struct sel_fx *f,
                         const struct kvt_list_record *r,
                         const float *ring, uint32_t row_floats,
                         uint32_t stage_tokens, uint32_t g, uint32_t G,
                         uint32_t hd, uint32_t P, uint32_t w, uint32_t n_new,
                         uint32_t kernel, uint32_t sinks, uint32_t keep,
                         uint8_t *drop)
{
	const uint32_t len = P + n_new, from = P - w, H = G * 2;
	double raw[64], s[64];
	T_ASSERT(len <= 64);
	for (uint32_t i = 0; i < from; i++) {
		const float *k = (const float *)(f->h_chunk + r->pages[i / f->pt] *
		                                 f->page_bytes) + (i % f->pt) * hd;
		double v = 0;
		for (uint32_t t = 0; t < w; t++) {
			const float *row = ring + ((P - w + t) % stage_tokens) *
			                   row_floats;
			for (uint32_t j = 0; j < G; j++) {
				const float *q = row + (g * G + j) * hd;
				double dot = 0;
				for (uint32_t d = 0; d < hd; d++)
					dot += (double)q[d] * k[d];
				if (i <= from + t)
					v += exp(dot / sqrt((double)hd) -
					         row[H * hd + g * G + j]);
			}
		}
		raw[i] = v / (w * G);
	}
	uint32_t cand[64], nc = 0;
	for (uint32_t i = 0; i < len; i++) {
		if (i < from) {
			uint32_t a = i > kernel / 2 ? i - kernel / 2 : 0;
			uint32_t b = i + kernel / 2 < from ? i + kernel / 2 : from - 1;
			s[i] = raw[a];
			for (uint32_t e = a + 1; e <= b; e++)
				s[i] = raw[e] > s[i] ? raw[e] : s[i];
		}
		drop[i] = 0;
		if (i < from && i >= sinks)
			cand[nc++] = i;
	}
	sel_keep_best(s, cand, nc, keep, drop);
}

/* n jobs' drops (out of a call of n jobs) against the naive marks want
 * [n][cap]. */
static void sk_check(const uint32_t *out, const struct snapkv_rule_job *j,
                     uint32_t n, const uint8_t *want, uint32_t cap)
{
	for (uint32_t k = 0; k < n; k++)
		sel_check_drops(out, n, k, j[k].len + j[k].n_new, j[k].n_drop,
		                j[k].drop_off, want + k * cap);
}

/* A random staging ring of st rows of rf floats (q of H heads of hd, then
 * lse), on the host and the device. */
static void *sk_ring(struct sel_fx *f, float *ring, uint32_t st, uint32_t rf,
                     uint32_t nq)
{
	for (uint32_t e = 0; e < st * rf; e++)
		ring[e] = e % rf < nq ? sel_unif(1000)
		                      : 0.25f * (float)(urnd() % 8);
	void *d;
	T_OK(f->o->mem_new(f->ctx, (size_t)st * rf * sizeof(float), &d));
	T_OK(f->o->copy(f->ctx, d, ring, (size_t)st * rf * sizeof(float),
	                NULL));
	return d;
}

TEST(cuda, backend_snapkv_rule_matches_naive)
{
	/* Two lists (KV heads) of 36 f32 entries of head_dim 8 (the
	 * fixture's lists 0 and 1), 2 query heads each; a prompt of 32, 4
	 * new entries, window 4, kernel 3, sinks 1, keep 10 of the 27
	 * unprotected: the drops must be the rule's computed in double.  A
	 * job whose rows hold a NaN is flagged, a job that only checks rows
	 * too; the refusals. */
	enum { HD = 8, PT = 4, G = 2, NKV = 2, H = G * NKV, ST = 16, P = 32,
	       W = 4, NN = 4, KEEP = 10, RF = H * HD + H };
	struct sel_fx f;
	sel_init_bytes(&f, PT, HD * sizeof(float), DR_LISTS, DR_PAGES);
	const struct kvt_backend_rule *r =
		sel_rule(&f, "snapkv", SNAPKV_RULE_VERSION,
		         sizeof(struct snapkv_rule), sizeof(struct snapkv_rule_job));
	sel_fill_floats(&f, KVT_DTYPE_F32);
	sel_set_lens(&f, P + NN);
	float ring[ST * RF];
	void *dring = sk_ring(&f, ring, ST, RF, H * HD);
	struct kvt_backend_paged pg = sel_paged(&f);
	const struct snapkv_rule a = {{ST, RF, 0, H * HD}, 3, 1};
	struct snapkv_rule_job jobs[NKV + 1];
	uint8_t want[NKV][P + NN];
	uint32_t off = 0;
	for (uint32_t g = 0; g < NKV; g++) {
		window_naive(&f, sel_rec(&f, g), ring, RF, ST, g, G, HD, P, W, NN,
		             3, 1, KEEP, want[g]);
		uint32_t nd = 0;
		for (uint32_t i = 0; i < P + NN; i++)
			nd += want[g][i];
		T_EQ(nd, 27 - KEEP);
		jobs[g] = (struct snapkv_rule_job){dring, g, g, P, NN, W, 1,
		                                   KEEP, nd, off};
		off += nd;
	}
	uint32_t out[2 * (NKV + 1) + 64];
	T_OK(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a,
	             jobs, NKV, out, 2 * NKV + off, NULL));
	T_EQ(out[0], 0);
	T_EQ(out[1], 0);
	sk_check(out, jobs, NKV, &want[0][0], P + NN);
	/* a NaN in a new row's lse: flagged; a job that only checks rows
	 * (its new ones) too */
	ring[((P + 1) % ST) * RF + H * HD + 3] = NAN;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	jobs[NKV] = (struct snapkv_rule_job){dring, 0, 0, P, NN, 0, 0, 0, 0,
	                                     off};
	T_OK(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a,
	             jobs, NKV + 1, out, 2 * (NKV + 1) + off, NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], 1);
	T_EQ(out[2], 1);
	T_EQ(out[NKV + 1 + 2], 0); /* it drops nothing */
	/* refusals */
	const uint32_t words = 2 * NKV + off;
	struct snapkv_rule ab = a;
	ab.kernel = 2;
	T_EQ(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &ab,
	             jobs, NKV, out, words, NULL), KVT_EINVAL);
	struct snapkv_rule_job keep0[NKV] = {jobs[0], jobs[1]};
	keep0[1].w = P + 1;
	T_EQ(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a,
	             keep0, NKV, out, words, NULL), KVT_EINVAL);
	keep0[1] = jobs[1];
	keep0[1].w = 0; /* due without a window */
	T_EQ(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a,
	             keep0, NKV, out, words, NULL), KVT_EINVAL);
	keep0[1] = jobs[1];
	keep0[1].g = NKV;
	T_EQ(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a,
	             keep0, NKV, out, words, NULL), KVT_EINVAL);
	keep0[1] = jobs[1];
	keep0[1].record = DR_LISTS;
	T_EQ(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a,
	             keep0, NKV, out, words, NULL), KVT_EINVAL);
	T_EQ(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a,
	             jobs, NKV, out, words - 1, NULL), KVT_EINVAL);
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}

TEST(cuda, backend_snapkv_rule_launches)
{
	/* 2 and 48 jobs (24 (sequence, layer)s of ragged prompts, 8 to 32,
	 * so lists of 12 to 36 entries; 2 KV heads each, records shared),
	 * window 4, kernel 3, sinks 1: the drops are the rule's in double
	 * (window_naive) and a call takes the same launches whatever its
	 * jobs, at most SK_BOUND.  A call with a bad job is refused before
	 * anything is launched or copied. */
	enum { HD = 8, PT = 4, G = 2, NKV = 2, H = G * NKV, ST = 16, W = 4,
	       NN = 4, NW = 24, CAP = DR_PAGES * PT, RF = H * HD + H };
	struct sel_fx f;
	sel_init_bytes(&f, PT, HD * sizeof(float), DR_LISTS, DR_PAGES);
	const struct kvt_backend_rule *r =
		sel_rule(&f, "snapkv", SNAPKV_RULE_VERSION,
		         sizeof(struct snapkv_rule), sizeof(struct snapkv_rule_job));
	if (!f.o->traffic)
		T_SKIP("no traffic");
	sel_fill_floats(&f, KVT_DTYPE_F32);
	sel_set_lens(&f, CAP);
	static float ring[ST * RF];
	void *dring = sk_ring(&f, ring, ST, RF, H * HD);
	struct kvt_backend_paged pg = sel_paged(&f);
	const struct snapkv_rule a = {{ST, RF, 0, H * HD}, 3, 1};
	struct snapkv_rule_job jobs[NW * NKV];
	static uint8_t want[NW * NKV * CAP];
	static uint32_t out[2 * NW * NKV + NW * NKV * CAP];
	uint32_t off = 0;
	for (uint32_t j = 0; j < NW; j++) {
		const uint32_t P = 8 + (j * 7) % 25, keep = (P - W - 1) / 2;
		for (uint32_t g = 0; g < NKV; g++) {
			const uint32_t l = j * NKV + g, rec = l % DR_LISTS;
			window_naive(&f, sel_rec(&f, rec), ring, RF, ST, g, G, HD,
			             P, W, NN, 3, 1, keep, want + l * CAP);
			uint32_t nd = 0;
			for (uint32_t i = 0; i < P + NN; i++)
				nd += want[l * CAP + i];
			jobs[l] = (struct snapkv_rule_job){dring, rec, g, P, NN, W,
			                                   1, keep, nd, off};
			off += nd;
		}
	}
	uint64_t one = SEL_LAUNCHES(f.o, f.ctx, sel_run(
		&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a, jobs, NKV,
		out, 2 * NKV + jobs[1].drop_off + jobs[1].n_drop, NULL));
	sk_check(out, jobs, NKV, want, CAP);
	uint64_t many = SEL_LAUNCHES(f.o, f.ctx, sel_run(
		&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a, jobs,
		NW * NKV, out, 2 * NW * NKV + off, NULL));
	for (uint32_t k = 0; k < NW * NKV; k++)
		T_EQ(out[k], 0);
	sk_check(out, jobs, NW * NKV, want, CAP);
	T_EQ(one, many);
	T_ASSERT(many <= SK_BOUND);
	/* job 9 of a list beyond the records: refused, nothing launched */
	jobs[9].record = DR_LISTS;
	SEL_REFUSED_UNRUN(f.o, f.ctx, sel_run(
		&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, &a, jobs,
		NW * NKV, out, 2 * NW * NKV + off, NULL));
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}
