/*
 * test_cuda_sync_ops.c — the cuda backend's ops of a device sync
 * (backend.h), each against a host computation on an image of the same
 * memory: fill_words against the same stores; scorer_run's linear, MLP and
 * sink-gate scorers against scorer_*_cpu / sink_gate_cpu (tolerances:
 * docs/cuda.md); key_norms bit for bit against a double loop;
 * compact_drops against compact_plan + compact_cpu, the whole chunk byte
 * for byte over several drop patterns, row sizes and page orders, with an
 * unmapped chunk slot skipped.  Every op's refusals change nothing (the
 * policies' device rules: test_cuda_<name>.c).  Built into
 * kvtrim-cuda-tests and, under the CPU emulator, kvtrim-cuda-emu-tests;
 * skips without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "kernels.h"
#include "test.h"

#define SEL_SEED 11
#define SEL_FRND_STEPS 10000
#include "select_fixture.h"

#define DR_LISTS 7
#define DR_PAGES 9 /* pages per list */

/* One chunk of DR_LISTS * DR_PAGES pages of random bytes (list i owns
 * pages i * DR_PAGES .. in reversed order; select_fixture.h). */
static void dr_init(struct sel_fx *f, uint32_t pt, uint32_t row)
{
	sel_init_bytes(f, pt, row, DR_LISTS, DR_PAGES);
	T_ASSERT(f->o->compact_drops != NULL);
}

/* Drop marks of list i, pattern by i; the list holds len entries. */
static void dr_marks(uint32_t i, uint32_t len, uint8_t *drop)
{
	for (uint32_t e = 0; e < len; e++) {
		switch (i % 6) {
		case 0: drop[e] = 0; break;                   /* none */
		case 1: drop[e] = e >= len - len / 3; break;  /* tail only */
		case 2: drop[e] = 1; break;                   /* all */
		case 3: drop[e] = e != len / 2; break;        /* all but one */
		default: drop[e] = urnd() % 3 == 0; break;    /* random */
		}
	}
}

/* Applies the same marks on the host image with compact_plan +
 * compact_cpu, and on the device with compact_drops; compares chunks. */
static void dr_run(struct sel_fx *f)
{
	uint32_t cap = DR_PAGES * f->pt;
	uint8_t *drop = malloc(cap);
	uint32_t *moves = malloc(2 * cap * sizeof(uint32_t));
	uint32_t *drops = malloc(DR_LISTS * cap * sizeof(uint32_t));
	struct kvt_backend_drops lists[DR_LISTS];
	T_ASSERT(drop && moves && drops);
	uint32_t nd = 0;
	for (uint32_t i = 0; i < DR_LISTS; i++) {
		struct kvt_list_record *r = sel_rec(f, i);
		uint32_t len = 1 + urnd() % cap, nl;
		r->len = len;
		dr_marks(i, len, drop);
		lists[i] = (struct kvt_backend_drops){i, len, 0, nd};
		for (uint32_t e = 0; e < len; e++)
			if (drop[e])
				drops[nd + lists[i].n_drop++] = e;
		nd += lists[i].n_drop;
		uint32_t nm = compact_plan(drop, len, moves, &nl);
		void *pv[DR_PAGES];
		sel_pages(f, i, pv);
		compact_cpu(pv, f->pt, f->row, moves, nm);
	}
	sel_put_records(f);
	struct kvt_backend_paged pg = sel_paged(f);
	T_OK(f->o->compact_drops(f->ctx, &pg, DR_LISTS, lists, DR_LISTS, drops,
	                         NULL));
	T_ASSERT(sel_chunk_same(f));
	free(drop);
	free(moves);
	free(drops);
}

TEST(cuda, backend_compact_drops_matches_plan)
{
	/* (page_tokens, row_bytes): 16-, 4-, 2- and 1-byte units */
	static const uint32_t shapes[][2] = {
		{16, 256}, {5, 128}, {7, 20}, {1, 12}, {3, 6}, {4, 5},
	};
	for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
		struct sel_fx f;
		dr_init(&f, shapes[k][0], shapes[k][1]);
		for (int round = 0; round < 3; round++)
			dr_run(&f);
		sel_fini(&f);
	}
}

TEST(cuda, backend_compact_drops_refuses_and_skips_unmapped)
{
	struct sel_fx f;
	dr_init(&f, 4, 16);
	struct kvt_list_record *r = sel_rec(&f, 0);
	r->len = 12;
	sel_put_records(&f);
	struct kvt_backend_paged pg = sel_paged(&f);
	const uint32_t unsorted[] = {3, 1}, beyond[] = {2, 12}, ok[] = {1, 2};
	struct kvt_backend_drops l = {0, 12, 2, 0};
	T_EQ(f.o->compact_drops(f.ctx, &pg, DR_LISTS, &l, 1, unsorted, NULL),
	     KVT_EINVAL);
	T_ASSERT(strstr(f.o->last_error(), "ascending") != NULL);
	T_EQ(f.o->compact_drops(f.ctx, &pg, DR_LISTS, &l, 1, beyond, NULL),
	     KVT_EINVAL);
	struct kvt_backend_drops far = {DR_LISTS, 12, 2, 0};
	T_EQ(f.o->compact_drops(f.ctx, &pg, DR_LISTS, &far, 1, ok, NULL),
	     KVT_EINVAL);
	T_ASSERT(strstr(f.o->last_error(), "record") != NULL);
	T_ASSERT(sel_chunk_same(&f));

	/* List 0's third page (entries 8..11, the sources of both holes)
	 * moves to an id of the unmapped slot 1: the moves are skipped. */
	r->pages[2] = f.ppc + 3;
	sel_put_records(&f);
	T_OK(f.o->compact_drops(f.ctx, &pg, DR_LISTS, &l, 1, ok, NULL));
	T_ASSERT(sel_chunk_same(&f));
	/* n 0 and lists without holes do nothing */
	T_OK(f.o->compact_drops(f.ctx, &pg, DR_LISTS, &l, 0, ok, NULL));
	sel_fini(&f);
}

TEST(cuda, backend_fill_words_stores_the_pattern)
{
	char err[256];
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	if (o->probe(err, sizeof(err)))
		T_SKIP(err);
	void *ctx, *dev;
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_ASSERT(o->fill_words != NULL);
	enum { WORDS = 65536 };
	uint32_t *img = malloc(WORDS * 4), *got = malloc(WORDS * 4);
	T_ASSERT(img && got);
	for (uint32_t i = 0; i < WORDS; i++)
		img[i] = urnd();
	T_OK(o->mem_new(ctx, WORDS * 4, &dev));
	T_OK(o->copy(ctx, dev, img, WORDS * 4, NULL));
	/* 300 runs of up to 6 blocks of up to 12 rows, scattered and some
	 * overlapping (more rows than a launch's blocks), a pattern longer
	 * than a block of threads */
	enum { RUNS = 300, NW = 200 };
	struct kvt_backend_fill_run *runs = malloc(RUNS * sizeof(*runs));
	uint32_t pat[NW];
	T_ASSERT(runs);
	for (uint32_t w = 0; w < NW; w++)
		pat[w] = (w * 7) % 331;
	uint32_t rows = 0;
	for (uint32_t i = 0; i < RUNS; i++) {
		struct kvt_backend_fill_run *r = &runs[i];
		*r = (struct kvt_backend_fill_run){
			.first = 4ull * (urnd() % 20000),
			.block_stride = 4ull * (400 + urnd() % 2000),
			.rows = i % 17 ? 1 + urnd() % 12 : 0,
			.row_stride = 4u * (1 + urnd() % 40),
			.blocks = 1 + urnd() % 6,
		};
		for (uint32_t b = 0; b < r->blocks; b++)
			for (uint32_t k = 0; k < r->rows; k++, rows++) {
				uint64_t w0 = (r->first + b * r->block_stride +
				               (uint64_t)k * r->row_stride) / 4;
				T_ASSERT(w0 + 331 < WORDS);
				for (uint32_t w = 0; w < NW; w++)
					img[w0 + pat[w]] = 0x7fc57a6eu;
			}
	}
	T_ASSERT(rows > 1024);
	T_OK(o->fill_words(ctx, dev, 0x7fc57a6eu, pat, NW, runs, RUNS, NULL));
	T_OK(o->copy(ctx, got, dev, WORDS * 4, NULL));
	T_ASSERT(memcmp(got, img, WORDS * 4) == 0);
	/* a run not in whole words is refused and nothing is stored */
	runs[1].row_stride = 6;
	T_EQ(o->fill_words(ctx, dev, 1, pat, NW, runs, 2, NULL), KVT_EINVAL);
	T_OK(o->copy(ctx, got, dev, WORDS * 4, NULL));
	T_ASSERT(memcmp(got, img, WORDS * 4) == 0);
	T_OK(o->fill_words(ctx, dev, 1, pat, 0, runs, 0, NULL));
	o->mem_free(ctx, dev);
	o->ctx_free(ctx);
	free(runs);
	free(img);
	free(got);
}

static void scorer_case(const struct kvt_backend_ops *o, void *ctx,
                        uint32_t hidden)
{
	enum { L = 3, D = 40, O = 3, ROWS = 70 };
	uint32_t o1 = hidden ? hidden : O;
	float *w[4][L];
	size_t sz[4] = {(size_t)o1 * D, o1, (size_t)O * hidden, O};
	for (int k = 0; k < 4; k++)
		for (int l = 0; l < L; l++) {
			w[k][l] = malloc(sz[k] * sizeof(float) + 4);
			T_ASSERT(w[k][l]);
			for (size_t i = 0; i < sz[k]; i++)
				w[k][l][i] = frnd() * (k % 2 ? 1.0f : 0.3f);
		}
	const float *wl[L][KVT_SCORER_TENSORS] = {{0}};
	for (int l = 0; l < L; l++)
		for (int k = 0; k < (hidden ? 4 : 2); k++)
			wl[l][k] = w[k][l];
	const struct kvt_backend_scorer d = {
		.kind = hidden ? KVT_SCORER_MLP : KVT_SCORER_LINEAR,
		.n_layers = L, .d_in = D, .hidden = hidden, .d_out = O,
		.w = &wl[0][0],
	};
	void *sc;
	T_OK(o->scorer_new(ctx, &d, &sc));
	float *hx = malloc(ROWS * D * sizeof(float)), *dx;
	T_ASSERT(hx);
	for (size_t i = 0; i < ROWS * D; i++)
		hx[i] = frnd() * 2.0f;
	T_OK(o->mem_new(ctx, ROWS * D * sizeof(float), (void **)&dx));
	T_OK(o->copy(ctx, dx, hx, ROWS * D * sizeof(float), NULL));
	/* jobs over parts of the rows, layers in any order, one empty */
	const struct kvt_backend_score_job jobs[] = {
		{2, 5, dx, NULL}, {0, 0, NULL, NULL}, {1, 30, dx + 5 * D, NULL},
		{0, 35, dx + 35 * D, NULL},
		{2, 70, dx, NULL},
	};
	const uint32_t nj = sizeof(jobs) / sizeof(jobs[0]);
	float got[140 * O], want[140 * O], hs[70 * 64];
	T_ASSERT(hidden <= 64);
	T_OK(o->scorer_run(ctx, sc, jobs, nj, got, NULL));
	size_t at = 0;
	for (uint32_t j = 0; j < nj; j++) {
		uint32_t l = jobs[j].layer, n = jobs[j].n;
		if (!n)
			continue;
		const float *x = hx + (jobs[j].x - dx);
		if (hidden)
			scorer_mlp_cpu(x, n, D, w[0][l], w[1][l], hidden, w[2][l],
			               w[3][l], O, want + at * O, hs);
		else
			scorer_linear_cpu(x, n, D, w[0][l], w[1][l], O,
			                  want + at * O);
		at += n;
	}
	T_EQ(at, 140);
	for (size_t i = 0; i < at * O; i++)
		T_ASSERT(fabsf(got[i] - want[i]) <= 1e-4f + 1e-4f * fabsf(want[i]));
	/* device copies (kvt_backend_score_job.dev): jobs 2 and 4 into
	 * their places in a device buffer, the others not; with the host's
	 * out the same bits on both sides, without it (every job with a dev)
	 * nothing crosses but the device copies are the same; a job with
	 * neither is refused */
	float *dv, back[100 * O];
	T_OK(o->mem_new(ctx, sizeof(back), (void **)&dv));
	T_OK(o->copy(ctx, dv, want, sizeof(back), NULL)); /* not the bits */
	struct kvt_backend_score_job dj[5];
	memcpy(dj, jobs, sizeof(dj));
	dj[2].dev = dv;            /* rows 5..35 of got */
	dj[4].dev = dv + 30 * O;   /* rows 70..140 */
	float got2[140 * O];
	T_OK(o->scorer_run(ctx, sc, dj, nj, got2, NULL));
	T_ASSERT(memcmp(got2, got, sizeof(got2)) == 0);
	T_OK(o->copy(ctx, back, dv, sizeof(back), NULL));
	T_ASSERT(memcmp(back, got + 5 * O, 30 * O * sizeof(float)) == 0);
	T_ASSERT(memcmp(back + 30 * O, got + 70 * O,
	                70 * O * sizeof(float)) == 0);
	T_EQ(o->scorer_run(ctx, sc, dj, nj, NULL, NULL), KVT_EINVAL);
	const struct kvt_backend_score_job only[] = {dj[2], dj[1], dj[4]};
	T_OK(o->copy(ctx, dv, want, sizeof(back), NULL));
	uint64_t h0, d0, l0, h1, d1, l1;
	T_OK(o->traffic(ctx, &h0, &d0, &l0, NULL));
	T_OK(o->scorer_run(ctx, sc, only, 3, NULL, NULL));
	T_OK(o->traffic(ctx, &h1, &d1, &l1, NULL));
	T_EQ(d1, d0); /* nothing came back */
	T_OK(o->copy(ctx, back, dv, sizeof(back), NULL));
	T_ASSERT(memcmp(back, got + 5 * O, 30 * O * sizeof(float)) == 0);
	T_ASSERT(memcmp(back + 30 * O, got + 70 * O,
	                70 * O * sizeof(float)) == 0);
	o->mem_free(ctx, dv);
	const struct kvt_backend_score_job bad = {L, 1, dx, NULL};
	T_EQ(o->scorer_run(ctx, sc, &bad, 1, got, NULL), KVT_EINVAL);
	T_OK(o->scorer_run(ctx, sc, jobs, 0, got, NULL));
	o->scorer_free(ctx, sc);
	o->scorer_free(ctx, NULL);
	o->mem_free(ctx, dx);
	free(hx);
	for (int k = 0; k < 4; k++)
		for (int l = 0; l < L; l++)
			free(w[k][l]);
}

/* Fast KVzip's gate: 2 layers, d_in 24, 2 KV heads of G 2, dp 8, 3 sinks;
 * tolerance of sink_gate in docs/cuda.md (atol 2e-5, rtol 1e-4). */
static void gate_case(const struct kvt_backend_ops *o, void *ctx)
{
	enum { L = 2, D = 24, KV = 2, G = 2, DP = 8, S = 3, ROWS = 19 };
	struct kvt_backend_scorer d = {
		.kind = KVT_SCORER_SINK_GATE, .n_layers = L, .d_in = D,
		.d_out = KV, .G = G, .dp = DP, .S = S,
	};
	float *w[L][KVT_SCORER_TENSORS];
	for (int l = 0; l < L; l++)
		for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++) {
			uint64_t n = kvt_scorer_floats(&d, k);
			w[l][k] = malloc(n * sizeof(float));
			T_ASSERT(w[l][k]);
			for (uint64_t i = 0; i < n; i++)
				w[l][k][i] = k == 3 || k == 4 ? 1.0f + 0.2f * frnd()
				                              : frnd() * 0.5f;
		}
	d.w = (const float *const *)&w[0][0];
	void *sc;
	T_OK(o->scorer_new(ctx, &d, &sc));
	float hx[ROWS * D], *dx;
	for (size_t i = 0; i < ROWS * D; i++)
		hx[i] = frnd();
	T_OK(o->mem_new(ctx, sizeof(hx), (void **)&dx));
	T_OK(o->copy(ctx, dx, hx, sizeof(hx), NULL));
	const struct kvt_backend_score_job jobs[] = {{1, ROWS, dx, NULL},
	                                             {0, 7, dx + 3 * D, NULL}};
	float got[(ROWS + 7) * KV], want[(ROWS + 7) * KV];
	float scr[ROWS * KV * (G + 1) * DP];
	T_OK(o->scorer_run(ctx, sc, jobs, 2, got, NULL));
	const float *const *w1 = d.w + KVT_SCORER_TENSORS, *const *w0 = d.w;
	sink_gate_cpu(hx, ROWS, D, KV, G, DP, S, w1[0], w1[1], w1[2], w1[3],
	              w1[4], w1[5], w1[6], want, scr);
	sink_gate_cpu(hx + 3 * D, 7, D, KV, G, DP, S, w0[0], w0[1], w0[2],
	              w0[3], w0[4], w0[5], w0[6], want + ROWS * KV, scr);
	for (size_t i = 0; i < (ROWS + 7) * KV; i++)
		T_ASSERT(fabsf(got[i] - want[i]) <= 2e-5f + 1e-4f * fabsf(want[i]));
	o->scorer_free(ctx, sc);
	o->mem_free(ctx, dx);
	for (int l = 0; l < L; l++)
		for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++)
			free(w[l][k]);
}

TEST(cuda, backend_scorer_matches_cpu)
{
	char err[256];
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	if (o->probe(err, sizeof(err)))
		T_SKIP(err);
	void *ctx, *sc;
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_ASSERT(o->scorer_new && o->scorer_run && o->scorer_free);
	scorer_case(o, ctx, 0);
	scorer_case(o, ctx, 9);
	gate_case(o, ctx);
	/* refusals: nothing to score with */
	const struct kvt_backend_scorer none = {0};
	T_EQ(o->scorer_new(ctx, &none, &sc), KVT_EINVAL);
	T_ASSERT(sc == NULL);
	o->ctx_free(ctx);
}

/* One scorer_run of a whole sync: BS_LAYERS layers of nseq sequences, each
 * job 0 .. BS_MAXN rows (every seventh empty) at a random row of one x of
 * BS_XROWS rows; d_in BS_D is above OpenBLAS's K block, so that a bias
 * added after the product instead of before it would show in the bits. */
enum { BS_LAYERS = 30, BS_D = 520, BS_XROWS = 64, BS_MAXN = 20 };

/* Defined only by the CPU emulator (tests/kernels/emu/runtime.cc): this
 * object serves both test binaries, so the emulator is told at run time. */
extern uint64_t kvt_emu_launches(void) __attribute__((weak));

/* The launch bounds of one scorer_run (docs/cuda.md, "Device scorers"). */
static uint32_t bs_bound(uint32_t kind)
{
	return kind == KVT_SCORER_LINEAR ? 2 : kind == KVT_SCORER_MLP ? 4 : 3;
}

static float **bs_weights(const struct kvt_backend_scorer *d)
{
	float **w = calloc((size_t)d->n_layers * KVT_SCORER_TENSORS,
	                   sizeof(float *));
	T_ASSERT(w);
	for (uint32_t l = 0; l < d->n_layers; l++)
		for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++) {
			uint64_t n = kvt_scorer_floats(d, k);
			float *t = malloc(n * sizeof(float) + 4);
			T_ASSERT(t);
			/* the gate's RMSNorm gains (3, 4) near 1 */
			int gain = d->kind == KVT_SCORER_SINK_GATE &&
			           (k == 3 || k == 4);
			for (uint64_t i = 0; i < n; i++)
				t[i] = gain ? 1.0f + 0.2f * frnd()
				            : frnd() * (k % 2 ? 1.0f : 0.1f);
			w[(size_t)l * KVT_SCORER_TENSORS + k] = t;
		}
	return w;
}

/* Job j's scores by the CPU kernel the cpu policy runs. */
static void bs_want(const struct kvt_backend_scorer *d, const float *x,
                    uint32_t n, uint32_t layer, float *want, float *scr)
{
	const float *const *t = d->w + (size_t)layer * KVT_SCORER_TENSORS;
	if (d->kind == KVT_SCORER_LINEAR)
		scorer_linear_cpu(x, n, d->d_in, t[0], t[1], d->d_out, want);
	else if (d->kind == KVT_SCORER_MLP)
		scorer_mlp_cpu(x, n, d->d_in, t[0], t[1], d->hidden, t[2], t[3],
		               d->d_out, want, scr);
	else
		sink_gate_cpu(x, n, d->d_in, d->d_out, d->G, d->dp, d->S, t[0],
		              t[1], t[2], t[3], t[4], t[5], t[6], want, scr);
}

/* Scores nseq sequences' jobs in one run against the CPU kernels (the same
 * bits on the emulator, the SGEMM's tolerance on a GPU); returns the
 * run's launches. */
static uint64_t bs_run(const struct kvt_backend_ops *o, void *ctx, void *sc,
                       const struct kvt_backend_scorer *d, const float *hx,
                       const float *dx, uint32_t nseq)
{
	const uint32_t nj = nseq * BS_LAYERS, O = d->d_out;
	struct kvt_backend_score_job *jobs = malloc(nj * sizeof(*jobs));
	T_ASSERT(jobs);
	uint64_t rows = 0;
	for (uint32_t i = 0; i < nj; i++) {
		uint32_t n = i % 7 == 3 ? 0 : 1 + urnd() % BS_MAXN;
		jobs[i] = (struct kvt_backend_score_job){
			(i * 7 + i / BS_LAYERS) % BS_LAYERS, n,
			n ? dx + (size_t)(urnd() % (BS_XROWS - n + 1)) * BS_D
			  : NULL, NULL};
		rows += n;
	}
	float *got = malloc(rows * O * sizeof(float));
	float *want = malloc(rows * O * sizeof(float));
	float *scr = malloc((size_t)BS_MAXN * 64 * sizeof(float));
	T_ASSERT(got && want && scr && d->hidden <= 64 &&
	         (uint64_t)O * (d->G + 1) * d->dp <= 64);
	uint64_t h0, h1, d2h, l0, l1;
	T_OK(o->traffic(ctx, &h0, &d2h, &l0, NULL));
	T_OK(o->scorer_run(ctx, sc, jobs, nj, got, NULL));
	T_OK(o->traffic(ctx, &h1, &d2h, &l1, NULL));
	uint64_t at = 0;
	for (uint32_t j = 0; j < nj; j++) {
		if (!jobs[j].n)
			continue;
		bs_want(d, hx + (jobs[j].x - dx), jobs[j].n, jobs[j].layer,
		        want + at * O, scr);
		at += jobs[j].n;
	}
	T_EQ(at, rows);
	if (kvt_emu_launches) { /* cuBLAS is OpenBLAS with the same calls */
		T_ASSERT(memcmp(got, want, rows * O * sizeof(float)) == 0);
	} else {
		float atol = d->kind == KVT_SCORER_SINK_GATE ? 2e-5f : 1e-4f;
		for (uint64_t i = 0; i < rows * O; i++)
			T_ASSERT(fabsf(got[i] - want[i]) <=
			         atol + 1e-4f * fabsf(want[i]));
	}
	free(jobs);
	free(got);
	free(want);
	free(scr);
	return l1 - l0;
}

/* Bad jobs late in a long list: refused before anything is launched or
 * uploaded, out untouched. */
static void bs_refusals(const struct kvt_backend_ops *o, void *ctx, void *sc,
                        const float *dx)
{
	enum { NJ = 64 * BS_LAYERS };
	static struct kvt_backend_score_job jobs[NJ];
	static float out[NJ * 8], before[NJ * 8];
	for (uint32_t i = 0; i < NJ; i++)
		jobs[i] = (struct kvt_backend_score_job){i % BS_LAYERS, 1, dx,
		                                         NULL};
	memset(out, 0x5a, sizeof(out));
	memcpy(before, out, sizeof(out));
	uint64_t h0, h1, d0, d1, l0, l1;
	for (int c = 0; c < 2; c++) {
		struct kvt_backend_score_job keep = jobs[NJ - 5];
		if (c == 0)
			jobs[NJ - 5].layer = BS_LAYERS; /* beyond n_layers */
		else
			jobs[NJ - 5].x = NULL; /* rows without x */
		T_OK(o->traffic(ctx, &h0, &d0, &l0, NULL));
		T_EQ(o->scorer_run(ctx, sc, jobs, NJ, out, NULL), KVT_EINVAL);
		T_OK(o->traffic(ctx, &h1, &d1, &l1, NULL));
		T_EQ(l1, l0);
		T_EQ(h1, h0);
		T_EQ(d1, d0);
		T_ASSERT(memcmp(out, before, sizeof(out)) == 0);
		jobs[NJ - 5] = keep;
	}
}

/* Every scorer kind over 1 and 64 sequences of 30 layers: the CPU
 * kernels' scores per job, and the same launches, within the bound,
 * whatever the number of sequences. */
TEST(cuda, backend_scorer_batched_launches)
{
	char err[256];
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	if (o->probe(err, sizeof(err)))
		T_SKIP(err);
	void *ctx;
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_ASSERT(o->scorer_run && o->traffic);
	float *hx = malloc((size_t)BS_XROWS * BS_D * sizeof(float)), *dx;
	T_ASSERT(hx);
	for (size_t i = 0; i < (size_t)BS_XROWS * BS_D; i++)
		hx[i] = frnd() * 2.0f;
	T_OK(o->mem_new(ctx, (size_t)BS_XROWS * BS_D * sizeof(float),
	                (void **)&dx));
	T_OK(o->copy(ctx, dx, hx, (size_t)BS_XROWS * BS_D * sizeof(float),
	             NULL));
	const struct kvt_backend_scorer kinds[] = {
		{.kind = KVT_SCORER_LINEAR, .d_out = 8},
		{.kind = KVT_SCORER_MLP, .d_out = 8, .hidden = 16},
		{.kind = KVT_SCORER_SINK_GATE, .d_out = 2, .G = 2, .dp = 8,
		 .S = 3},
	};
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		struct kvt_backend_scorer d = kinds[k];
		d.n_layers = BS_LAYERS;
		d.d_in = BS_D;
		float **w = bs_weights(&d);
		d.w = (const float *const *)w;
		void *sc;
		T_OK(o->scorer_new(ctx, &d, &sc));
		uint64_t one = bs_run(o, ctx, sc, &d, hx, dx, 1);
		uint64_t many = bs_run(o, ctx, sc, &d, hx, dx, 64);
		T_EQ(one, many);
		T_ASSERT(many >= 1 && many <= bs_bound(d.kind));
		bs_refusals(o, ctx, sc, dx);
		o->scorer_free(ctx, sc);
		for (uint32_t i = 0; i < BS_LAYERS * KVT_SCORER_TENSORS; i++)
			free(w[i]);
		free(w);
	}
	o->mem_free(ctx, dx);
	free(hx);
	o->ctx_free(ctx);
}

TEST(cuda, backend_key_norms_match_double_loop)
{
	enum { HD = 16, PT = 4 };
	struct sel_fx f;
	dr_init(&f, PT, HD * sizeof(float));
	T_ASSERT(f.o->key_norms != NULL);
	float *img = (float *)f.h_chunk;
	for (uint64_t i = 0; i < f.chunk_bytes / sizeof(float); i++)
		img[i] = (float)(urnd() % 20001) / 1000.0f - 10.0f;
	sel_put_chunk(&f);
	for (uint32_t i = 0; i < DR_LISTS; i++)
		sel_rec(&f, i)->len = DR_PAGES * PT;
	sel_rec(&f, 3)->pages[3] = f.ppc + 2; /* entries 12..15: unmapped, NaN */
	sel_put_records(&f);
	struct kvt_backend_paged pg = sel_paged(&f);
	/* list i: entries 3i .. 3i + 9, norms interleaved with stride 2 */
	struct kvt_backend_norm_job jobs[DR_LISTS];
	enum { N = 10 };
	float got[2 * N * DR_LISTS];
	for (uint32_t i = 0; i < DR_LISTS; i++)
		jobs[i] = (struct kvt_backend_norm_job){
			i, 3 * i, N, (i / 2) * 2 * N + i % 2, 2};
	T_OK(f.o->key_norms(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, HD, jobs,
	                    DR_LISTS, got, 2 * N * DR_LISTS, NULL));
	uint32_t nan_seen = 0;
	for (uint32_t i = 0; i < DR_LISTS; i++)
		for (uint32_t k = 0; k < N; k++) {
			uint32_t e = 3 * i + k;
			const struct kvt_list_record *r = sel_rec(&f, i);
			float g = got[jobs[i].out_off + k * 2];
			if (r->pages[e / PT] >= f.ppc) {
				T_ASSERT(isnan(g));
				nan_seen++;
				continue;
			}
			const float *row = (const float *)(f.h_chunk +
			        r->pages[e / PT] * f.page_bytes) + (e % PT) * HD;
			double ss = 0;
			for (uint32_t d = 0; d < HD; d++)
				ss += (double)row[d] * row[d];
			float w = (float)sqrt(ss);
			T_ASSERT(memcmp(&g, &w, sizeof(g)) == 0);
		}
	T_EQ(nan_seen, 4);
	struct kvt_backend_norm_job bad = {DR_LISTS, 0, 1, 0, 1};
	T_EQ(f.o->key_norms(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, HD, &bad, 1,
	                    got, 4, NULL), KVT_EINVAL);
	bad = (struct kvt_backend_norm_job){0, 0, 5, 0, 1};
	T_EQ(f.o->key_norms(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, HD, &bad, 1,
	                    got, 4, NULL), KVT_EINVAL); /* beyond out */
	sel_fini(&f);
}

/* The launch bound docs/cuda.md states per call. */
#define PL_NORMS_BOUND 1

TEST(cuda, backend_key_norms_launches)
{
	/* 1 job and DR_LISTS jobs of ragged lengths (4 to 28 entries): the
	 * same launches, at most PL_NORMS_BOUND (the norms themselves:
	 * backend_key_norms_match_double_loop). */
	enum { HD = 16, PT = 4 };
	struct sel_fx f;
	dr_init(&f, PT, HD * sizeof(float));
	if (!f.o->key_norms || !f.o->traffic)
		T_SKIP("no key_norms");
	sel_set_lens(&f, DR_PAGES * PT);
	struct kvt_backend_paged pg = sel_paged(&f);
	struct kvt_backend_norm_job jobs[DR_LISTS];
	float got[DR_LISTS * 32];
	uint32_t at = 0;
	for (uint32_t i = 0; i < DR_LISTS; i++) {
		const uint32_t n = 4 + (i * 11) % 25;
		jobs[i] = (struct kvt_backend_norm_job){i, i % 3, n, at, 1};
		at += n;
	}
	uint64_t one = SEL_LAUNCHES(f.o, f.ctx, f.o->key_norms(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, HD, jobs, 1, got,
		jobs[0].n, NULL));
	uint64_t many = SEL_LAUNCHES(f.o, f.ctx, f.o->key_norms(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, HD, jobs, DR_LISTS, got, at,
		NULL));
	T_EQ(one, many);
	T_ASSERT(many >= 1 && many <= PL_NORMS_BOUND);
	sel_fini(&f);
}
