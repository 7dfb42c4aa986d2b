/*
 * test_cuda_expected_attention.c — the cuda backend's device rule
 * "expected_attention" (Expected Attention's end-of-prefill selection on
 * the device, policies/expected_attention.cu) against its rule computed in
 * double (expected_attention_rule.h): one job a list, cov and vnorm on and
 * off, prompts of ragged lengths, more lists than the rule has slots, a
 * NaN in a staged q flagged (a job that only checks rows too), the
 * refusals changing nothing, and the launches of a call the same whatever
 * its jobs.  Built into kvtrim-cuda-tests and, under the CPU
 * emulator, kvtrim-cuda-emu-tests; skips without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "expected_attention_rule.h"
#include "kernels.h"
#include "test.h"

#define SEL_SEED 11
#define SEL_FRND_STEPS 10000
#include "select_fixture.h"

#define DR_LISTS 7
#define DR_PAGES 9 /* pages per list */

/* The launches of a call, whatever its jobs: the checks and plan, every
 * list's rule, the top-k and the indices (docs/cuda.md). */
#define EA_LAUNCHES 4

typedef struct expected_attention_rule ea_rule;
typedef struct expected_attention_rule_job ea_job;

/* Expected Attention's rule (expected_attention_rule.h) in double for
 * job j (the list of record r, KV head g; G query heads a group), the
 * ring's q rows at row_floats apart: its drop marks [len + n_new]. */
static void expected_naive(const struct sel_fx *f,
                           const struct kvt_list_record *r,
                           const float *ring, uint32_t row_floats,
                           uint32_t g, uint32_t G, uint32_t hd,
                           const struct expected_attention_rule *w,
                           const struct expected_attention_rule_job *j_,
                           uint8_t *drop)
{
	const uint32_t keep = j_->keep;
	enum { MAXL = 128, MAXD = 16, MAXN = 16 };
	const uint32_t P = j_->len, N = P - j_->from, len = P + j_->n_new;
	const uint32_t half = hd / 2;
	T_ASSERT(len <= MAXL && hd <= MAXD && N <= MAXN);
	double rc[MAXD], wk[MAXD / 2], acc[MAXL] = {0}, s[MAXL];
	for (uint32_t k = 0; k < half; k++) {
		wk[k] = pow(w->theta, -(double)(2 * k) / hd);
		double c = 0, sn = 0;
		for (uint32_t t = 0; t < w->future; t++) {
			c += cos((P + t) * wk[k]);
			sn += sin((P + t) * wk[k]);
		}
		rc[2 * k] = c / w->future;
		rc[2 * k + 1] = sn / w->future;
	}
	const float *pg0 = (const float *)f->h_chunk;
	for (uint32_t j = 0; j < G; j++) {
		double qs[MAXN][MAXD], m[MAXD] = {0}, C[MAXD][MAXD] = {{0}};
		double mu[MAXD], S[MAXD][MAXD], z[MAXL];
		for (uint32_t t = 0; t < N; t++) {
			uint32_t pos = j_->from + t;
			const uint32_t row = pos % w->rows.stage_tokens;
			const float *q = ring + row * row_floats +
			                 w->rows.q_off + (g * G + j) * hd;
			for (uint32_t k = 0; k < half; k++) {
				double c = cos(pos * wk[k]), sn = sin(pos * wk[k]);
				qs[t][2 * k] = q[2 * k] * c + q[2 * k + 1] * sn;
				qs[t][2 * k + 1] = -q[2 * k] * sn + q[2 * k + 1] * c;
			}
			for (uint32_t d = 0; d < hd; d++)
				m[d] += qs[t][d] / N;
		}
		for (uint32_t t = 0; t < N; t++)
			for (uint32_t a = 0; a < hd; a++)
				for (uint32_t b = 0; b < hd; b++)
					C[a][b] += (qs[t][a] - m[a]) *
					           (qs[t][b] - m[b]) / N;
		/* R: 2x2 blocks [[c, -s], [s, c]]; mu = R m, S = R C R^T */
		for (uint32_t a = 0; a < hd; a++) {
			uint32_t k = a / 2;
			double c = rc[2 * k], sn = rc[2 * k + 1];
			mu[a] = a % 2 ? sn * m[a - 1] + c * m[a]
			              : c * m[a] - sn * m[a + 1];
		}
		for (uint32_t a = 0; a < hd; a++)
			for (uint32_t b = 0; b < hd; b++) {
				double v = 0;
				for (uint32_t x = 0; x < hd; x++)
					for (uint32_t y = 0; y < hd; y++) {
						double ra = x / 2 != a / 2 ? 0
						        : a % 2 == x % 2 ? rc[a / 2 * 2]
						        : a % 2 ? rc[a / 2 * 2 + 1]
						        : -rc[a / 2 * 2 + 1];
						double rb = y / 2 != b / 2 ? 0
						        : b % 2 == y % 2 ? rc[b / 2 * 2]
						        : b % 2 ? rc[b / 2 * 2 + 1]
						        : -rc[b / 2 * 2 + 1];
						v += ra * C[x][y] * rb;
					}
				S[a][b] = v;
			}
		double zmax = -INFINITY, sum = 0;
		for (uint32_t i = w->sinks; i < P; i++) {
			const float *k = pg0 + (r->pages[i / f->pt] * f->page_bytes +
			                        (i % f->pt) * f->row) / sizeof(float);
			double lin = 0, quad = 0;
			for (uint32_t a = 0; a < hd; a++) {
				lin += mu[a] * k[a];
				for (uint32_t b = 0; b < hd; b++)
					quad += k[a] * S[a][b] * k[b];
			}
			z[i] = lin / sqrt(hd) + (w->cov ? quad / (2.0 * hd) : 0);
			zmax = z[i] > zmax ? z[i] : zmax;
		}
		for (uint32_t i = w->sinks; i < P; i++)
			sum += exp(z[i] - zmax);
		for (uint32_t i = w->sinks; i < P; i++)
			acc[i] += exp(z[i] - zmax) / sum / G;
	}
	uint32_t cand[MAXL], nc = 0;
	for (uint32_t i = 0; i < len; i++) {
		drop[i] = 0;
		if (i < w->sinks || i >= P)
			continue;
		const float *v = pg0 + (r->pages[i / f->pt] * f->page_bytes +
		                        (f->pt + i % f->pt) * f->row) /
		                       sizeof(float);
		double ss = 0;
		for (uint32_t d = 0; d < hd; d++)
			ss += (double)v[d] * v[d];
		s[i] = w->vnorm ? (acc[i] + w->eps) * sqrt(ss) : acc[i];
		cand[nc++] = i;
	}
	sel_keep_best(s, cand, nc, keep, drop);
}

/* n jobs' drops (out of a call of n jobs) against the naive marks want
 * [n][cap]. */
static void ea_check(const uint32_t *out, const ea_job *j, uint32_t n,
                     const uint8_t *want, uint32_t cap)
{
	for (uint32_t k = 0; k < n; k++) {
		T_EQ(out[k], 0);
		sel_check_drops(out, n, k, j[k].len + j[k].n_new, j[k].n_drop,
		                j[k].drop_off, want + k * cap);
	}
}

/* The fixture's chunk (pages of pt rows of hd floats) and the backend's
 * rule "expected_attention", of the header's layout. */
static const struct kvt_backend_rule *ea_init(struct sel_fx *f, uint32_t pt,
                                              uint32_t hd)
{
	sel_init_bytes(f, pt, hd * sizeof(float), DR_LISTS, DR_PAGES);
	return sel_rule(f, "expected_attention",
	                EXPECTED_ATTENTION_RULE_VERSION, sizeof(ea_rule),
	                sizeof(ea_job));
}

/* A random staging ring of n floats (each on the grid k / 500 - 2, one
 * urnd), on the host and the device. */
static void *ea_ring(struct sel_fx *f, float *ring, uint32_t n)
{
	for (uint32_t e = 0; e < n; e++)
		ring[e] = (float)(urnd() % 2001) / 500.0f - 2.0f;
	void *d;
	T_OK(f->o->mem_new(f->ctx, n * sizeof(float), &d));
	T_OK(f->o->copy(f->ctx, d, ring, n * sizeof(float), NULL));
	return d;
}

/* Rule r over n jobs of the tests' geometry. */
#define EA_RUN(a, jobs, n, out, words)                                         \
	sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, (a), (jobs), \
	        (n), (out), (words), NULL)

TEST(cuda, backend_expected_attention_rule_matches_naive)
{
	/* Three calls (cov and vnorm; no cov; vnorm off with eps) of two
	 * jobs each (KV heads; the fixture's lists 0 to 5), 2 query heads
	 * a group, f32 entries of head_dim 8 in pages of 8: a prompt of 64,
	 * 4 new entries, the statistics of the last 6 queries, sinks 2 (so
	 * 62 candidates), keep 20: the drops must be the rule's computed in
	 * double.  A job whose rows hold a NaN is flagged, a job that only
	 * checks rows too; the refusals. */
	enum { HD = 8, PT = 8, G = 2, NKV = 2, H = G * NKV, ST = 16, P = 64,
	       W = 6, NN = 4, SINKS = 2, KEEP = 20, NC = 3, RF = H * HD + 3,
	       ND = P - SINKS - KEEP };
	struct sel_fx f;
	const struct kvt_backend_rule *r = ea_init(&f, PT, HD);
	sel_fill_floats(&f, KVT_DTYPE_F32);
	sel_set_lens(&f, P + NN);
	float ring[ST * RF]; /* q at 3: other parts before it */
	void *dring = ea_ring(&f, ring, ST * RF);
	struct kvt_backend_paged pg = sel_paged(&f);
	ea_rule a[NC];
	ea_job jobs[NKV + 1];
	uint8_t want[NKV][P + NN];
	enum { WORDS = 2 * (NKV + 1) + NKV * ND };
	uint32_t out[WORDS];
	for (uint32_t c = 0; c < NC; c++) {
		a[c] = (ea_rule){.rows = {ST, RF, 3, 0}, .sinks = SINKS,
		                 .future = 40, .theta = 10000.0f, .cov = c != 1,
		                 .vnorm = c != 2, .eps = c == 2 ? 0.01 : 0};
		for (uint32_t g = 0; g < NKV; g++) {
			jobs[g] = (ea_job){dring, c * NKV + g, g, P, NN, P - W, 1,
			                   KEEP, ND, g * ND};
			expected_naive(&f, sel_rec(&f, c * NKV + g), ring, RF, g,
			               G, HD, &a[c], &jobs[g], want[g]);
		}
		T_OK(EA_RUN(&a[c], jobs, NKV, out, 2 * NKV + NKV * ND));
		ea_check(out, jobs, NKV, &want[0][0], P + NN);
	}
	/* a NaN in a new row's q: flagged, in the job that only checks rows
	 * too (and a NaN in a row outside q, which neither reads) */
	ring[((P + 2) % ST) * RF + 3 + 5] = NAN;
	ring[((P - 1) % ST) * RF + 1] = NAN;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	jobs[NKV] = (ea_job){dring, 0, 0, P, NN, P, 0, 0, 0, ND};
	ea_job two[2] = {jobs[0], jobs[NKV]};
	T_OK(EA_RUN(&a[0], two, 2, out, 4 + ND));
	T_EQ(out[0], 1);
	T_EQ(out[1], 1);
	/* the NaN before P only touches the statistics' job */
	ring[((P + 2) % ST) * RF + 3 + 5] = 1.0f;
	ring[((P - 1) % ST) * RF + 3 + 2] = NAN;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	T_OK(EA_RUN(&a[0], two, 2, out, 4 + ND));
	T_EQ(out[0], 1);
	T_EQ(out[1], 0);
	/* q finite again: the NaN outside q stays unread, same drops */
	ring[((P - 1) % ST) * RF + 3 + 2] = 0.5f;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	T_OK(EA_RUN(&a[0], two, 2, out, 4 + ND));
	T_EQ(out[0], 0);
	T_EQ(out[1], 0);
	T_EQ(out[2], ND);
	T_EQ(out[3], 0);
	/* refusals */
	const uint32_t words = 2 * NKV + NKV * ND;
	ea_job bad[NKV] = {jobs[0], jobs[1]};
	bad[1].from = P + 1;
	T_EQ(EA_RUN(&a[0], bad, NKV, out, words), KVT_EINVAL);
	bad[1] = jobs[1];
	bad[1].from = SINKS - 1; /* statistics over the sinks */
	T_EQ(EA_RUN(&a[0], bad, NKV, out, words), KVT_EINVAL);
	bad[1] = jobs[1];
	bad[1].from = P - ST; /* rows beyond the ring */
	T_EQ(EA_RUN(&a[0], bad, NKV, out, words), KVT_EINVAL);
	bad[1] = jobs[1];
	bad[1].g = NKV;
	T_EQ(EA_RUN(&a[0], bad, NKV, out, words), KVT_EINVAL);
	bad[1] = jobs[1];
	bad[1].record = DR_LISTS;
	T_EQ(EA_RUN(&a[0], bad, NKV, out, words), KVT_EINVAL);
	ea_rule ab = a[0];
	ab.future = 0;
	T_EQ(EA_RUN(&ab, jobs, NKV, out, words), KVT_EINVAL);
	T_EQ(sel_run(&f, r, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD - 1,
	             &a[0], jobs, NKV, out, words, NULL),
	     KVT_EINVAL); /* odd head_dim */
	T_EQ(EA_RUN(&a[0], jobs, NKV, out, words - 1), KVT_EINVAL);
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}

TEST(cuda, backend_expected_attention_rule_launches)
{
	/* 2, 36 and 288 jobs (18 (sequence, layer)s of ragged prompts, 10
	 * to 68, so lists of 14 to 72 entries, 2 KV heads each, records
	 * shared; the 288 are the 36 eight times over, more lists than the
	 * rule has slots, so slots are reused), cov on and off: the drops
	 * are the rule's in double (expected_naive) and a call takes
	 * EA_LAUNCHES launches whatever its jobs.  A call with a bad job is
	 * refused before anything is launched or copied. */
	enum { HD = 8, PT = 8, G = 2, NKV = 2, H = G * NKV, ST = 16, W = 6,
	       NN = 4, SINKS = 2, NW = 18, NJ = NW * NKV, CAP = DR_PAGES * PT,
	       RF = H * HD + 3, REP = 8, NJR = NJ * REP };
	struct sel_fx f;
	const struct kvt_backend_rule *r = ea_init(&f, PT, HD);
	if (!f.o->traffic)
		T_SKIP("no traffic");
	sel_fill_floats(&f, KVT_DTYPE_F32);
	sel_set_lens(&f, CAP);
	static float ring[ST * RF];
	void *dring = ea_ring(&f, ring, ST * RF);
	struct kvt_backend_paged pg = sel_paged(&f);
	static ea_job jobs[NJR];
	static uint8_t want[NJR * CAP];
	static uint32_t out[2 * NJR + NJR * CAP];
	for (uint32_t cov = 0; cov < 2; cov++) {
		const ea_rule a = {.rows = {ST, RF, 3, 0}, .sinks = SINKS,
		                   .future = 40, .theta = 10000.0f, .cov = cov,
		                   .vnorm = 1, .eps = 0.01};
		uint32_t off = 0;
		for (uint32_t j = 0; j < NW; j++) {
			const uint32_t P = 10 + (j * 13) % 59,
			               keep = (P - SINKS) / 3;
			for (uint32_t g = 0; g < NKV; g++) {
				const uint32_t l = j * NKV + g, rec = l % DR_LISTS;
				const uint32_t nd = P - SINKS - keep;
				jobs[l] = (ea_job){dring, rec, g, P, NN, P - W, 1,
				                   keep, nd, off};
				expected_naive(&f, sel_rec(&f, rec), ring, RF, g, G,
				               HD, &a, &jobs[l], want + l * CAP);
				off += nd;
			}
		}
		const uint32_t off1 = off;
		for (uint32_t k = NJ; k < NJR; k++) {
			jobs[k] = jobs[k % NJ];
			jobs[k].drop_off = off;
			off += jobs[k].n_drop;
			memcpy(want + k * CAP, want + (k % NJ) * CAP, CAP);
		}
		uint64_t one = SEL_LAUNCHES(f.o, f.ctx, EA_RUN(
			&a, jobs, NKV, out,
			2 * NKV + jobs[1].drop_off + jobs[1].n_drop));
		ea_check(out, jobs, NKV, want, CAP);
		uint64_t many = SEL_LAUNCHES(f.o, f.ctx, EA_RUN(
			&a, jobs, NJ, out, 2 * NJ + off1));
		ea_check(out, jobs, NJ, want, CAP);
		memset(out, 0xff, sizeof(out));
		uint64_t most = SEL_LAUNCHES(f.o, f.ctx, EA_RUN(
			&a, jobs, NJR, out, 2 * NJR + off));
		ea_check(out, jobs, NJR, want, CAP);
		T_EQ(one, EA_LAUNCHES);
		T_EQ(many, EA_LAUNCHES);
		T_EQ(most, EA_LAUNCHES);
		/* job 9 of a list beyond the records: refused, nothing
		 * launched or copied */
		const uint32_t rec = jobs[9].record;
		jobs[9].record = DR_LISTS;
		SEL_REFUSED_UNRUN(f.o, f.ctx,
		                  EA_RUN(&a, jobs, NJ, out, 2 * NJ + off1));
		jobs[9].record = rec;
	}
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}
