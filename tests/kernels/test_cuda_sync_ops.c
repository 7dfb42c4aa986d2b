/*
 * test_cuda_sync_ops.c — the cuda backend's ops of a device sync
 * (backend.h), each against a host computation on an image of the same
 * memory: fill_words against the same stores; scorer_run's linear, MLP and
 * sink-gate scorers against scorer_*_cpu / sink_gate_cpu (tolerances:
 * docs/cuda.md); key_norms bit for bit against a double loop;
 * compact_drops against compact_plan + compact_cpu, the whole chunk byte
 * for byte over several drop patterns, row sizes and page orders, with an
 * unmapped chunk slot skipped; window_select and expected_select against
 * their rules in double.  Every op's refusals change nothing.  Built into
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
	sel_init(f, pt, row, DR_LISTS, DR_PAGES);
	T_ASSERT(f->o->compact_drops != NULL);
	sel_fill_bytes(f);
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
		{2, 5, dx}, {0, 0, NULL}, {1, 30, dx + 5 * D}, {0, 35, dx + 35 * D},
		{2, 70, dx},
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
	const struct kvt_backend_score_job bad = {L, 1, dx};
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
	const struct kvt_backend_score_job jobs[] = {{1, ROWS, dx},
	                                             {0, 7, dx + 3 * D}};
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
			  : NULL};
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
		jobs[i] = (struct kvt_backend_score_job){i % BS_LAYERS, 1, dx};
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

/* The naive rules' selection: of the nc candidates cand[] (scores s by
 * index), the best keep stay (score, then the higher index), the others
 * are marked in drop. */
static void naive_keep_best(const double *s, uint32_t *cand, uint32_t nc,
                            uint32_t keep, uint8_t *drop)
{
	for (uint32_t a = 0; a < nc; a++)
		for (uint32_t b = a + 1; b < nc; b++)
			if (s[cand[b]] > s[cand[a]] ||
			    (s[cand[b]] == s[cand[a]] && cand[b] > cand[a])) {
				uint32_t x = cand[a];
				cand[a] = cand[b];
				cand[b] = x;
			}
	for (uint32_t c = keep; c < nc; c++)
		drop[cand[c]] = 1;
}

/* The rule of struct kvt_backend_window in double, for list li of the
 * fixture: its drop marks. */
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
	naive_keep_best(s, cand, nc, keep, drop);
}

TEST(cuda, backend_window_select_matches_naive)
{
	/* Two lists (KV heads) of 36 f32 entries of head_dim 8 (the
	 * fixture's lists 0 and 1), 2 query heads each; a prompt of 32, 4
	 * new entries, window 4, kernel 3, sinks 1, keep 10 of the 27
	 * unprotected: the drops must be the rule's computed in double.  A
	 * window whose rows hold a NaN is flagged; the refusals. */
	enum { HD = 8, PT = 4, G = 2, NKV = 2, H = G * NKV, ST = 16, P = 32,
	       W = 4, NN = 4, KEEP = 10 };
	struct sel_fx f;
	dr_init(&f, PT, HD * sizeof(float));
	if (!f.o->window_select)
		T_SKIP("no window_select");
	sel_fill_floats(&f, KVT_DTYPE_F32);
	for (uint32_t i = 0; i < DR_LISTS; i++)
		sel_rec(&f, i)->len = P + NN;
	sel_put_records(&f);
	const uint32_t rf = H * HD + H;
	float ring[ST * (H * HD + H)];
	for (uint32_t r = 0; r < ST; r++)
		for (uint32_t e = 0; e < rf; e++)
			ring[r * rf + e] = e < H * HD
			        ? (float)(urnd() % 2001) / 1000.0f - 1.0f
			        : 0.25f * (float)(urnd() % 8);
	void *dring;
	T_OK(f.o->mem_new(f.ctx, sizeof(ring), &dring));
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	struct kvt_backend_paged pg = sel_paged(&f);
	struct kvt_backend_window win[2] = {
		{.ring = dring, .rows = {ST, rf, 0, H * HD}, .P = P, .w = W,
		 .n_new = NN, .kernel = 3, .sinks = 1, .first_list = 0, .n_lists = NKV},
	};
	uint8_t want[NKV][P + NN];
	uint32_t nd[NKV];
	struct kvt_backend_window_list lists[NKV];
	uint32_t off = 0;
	for (uint32_t g = 0; g < NKV; g++) {
		window_naive(&f, sel_rec(&f, g), ring, rf, ST, g, G, HD, P, W, NN,
		             3, 1, KEEP, want[g]);
		nd[g] = 0;
		for (uint32_t i = 0; i < P + NN; i++)
			nd[g] += want[g][i];
		T_EQ(nd[g], 27 - KEEP);
		lists[g] = (struct kvt_backend_window_list){g, P + NN, KEEP,
		                                             nd[g], off};
		off += nd[g];
	}
	uint32_t out[1 + NKV + 64];
	T_OK(f.o->window_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                        HD, win, 1, lists, NKV, out, 1 + NKV + off,
	                        NULL));
	T_EQ(out[0], 0);
	for (uint32_t g = 0; g < NKV; g++) {
		T_EQ(out[1 + g], nd[g]);
		uint32_t k = 0;
		for (uint32_t i = 0; i < P + NN; i++)
			if (want[g][i])
				T_EQ(out[1 + NKV + lists[g].drop_off + k++], i);
	}
	/* a NaN in a new row's lse: flagged; a check-only window too */
	ring[((P + 1) % ST) * rf + H * HD + 3] = NAN;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	win[1] = win[0];
	win[1].w = 0;
	win[1].n_lists = 0;
	T_OK(f.o->window_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                        HD, win, 2, lists, NKV, out, 2 + NKV + off,
	                        NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], 1);
	/* refusals */
	struct kvt_backend_window bad = win[0];
	bad.kernel = 2;
	T_EQ(f.o->window_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                        HD, &bad, 1, lists, NKV, out, 1 + NKV + off,
	                        NULL), KVT_EINVAL);
	bad = win[0];
	bad.w = P + 1;
	T_EQ(f.o->window_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                        HD, &bad, 1, lists, NKV, out, 1 + NKV + off,
	                        NULL), KVT_EINVAL);
	T_EQ(f.o->window_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                        HD, win, 1, lists, NKV, out, NKV + off, NULL),
	     KVT_EINVAL); /* beyond out */
	lists[1].record = DR_LISTS;
	T_EQ(f.o->window_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                        HD, win, 1, lists, NKV, out, 1 + NKV + off,
	                        NULL), KVT_EINVAL);
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}

/* Expected Attention's rule (struct kvt_backend_expected) in double for
 * list r of KV head g (H query heads, G a group), the ring's q rows at
 * row_floats apart: its drop marks [P + n_new]. */
static void expected_naive(const struct sel_fx *f,
                           const struct kvt_list_record *r,
                           const float *ring, uint32_t row_floats,
                           uint32_t g, uint32_t G, uint32_t hd,
                           const struct kvt_backend_expected *w,
                           uint32_t keep, uint8_t *drop)
{
	enum { MAXL = 128, MAXD = 16, MAXN = 16 };
	const uint32_t P = w->P, N = P - w->from, len = P + w->n_new;
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
			uint32_t pos = w->from + t;
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
	naive_keep_best(s, cand, nc, keep, drop);
}

TEST(cuda, backend_expected_select_matches_naive)
{
	/* Three windows (cov and vnorm; no cov; vnorm off with eps) of two
	 * lists each (KV heads; the fixture's lists 0 to 5), 2 query heads
	 * a group, f32 entries of head_dim 8 in pages of 8: a prompt of 64
	 * (K S' in two SGEMM blocks: 64 and 4 keys), 4 new entries, the
	 * statistics of the last 6 queries, sinks 2 (so 62 candidates), keep
	 * 20: the drops must be the rule's computed in double.  A window
	 * whose rows hold a NaN is flagged, a check-only window too; the
	 * refusals. */
	enum { HD = 8, PT = 8, G = 2, NKV = 2, H = G * NKV, ST = 16, P = 64,
	       W = 6, NN = 4, SINKS = 2, KEEP = 20, NW = 3 };
	struct sel_fx f;
	dr_init(&f, PT, HD * sizeof(float));
	if (!f.o->expected_select)
		T_SKIP("no expected_select");
	sel_fill_floats(&f, KVT_DTYPE_F32);
	for (uint32_t i = 0; i < DR_LISTS; i++)
		sel_rec(&f, i)->len = P + NN;
	sel_put_records(&f);
	const uint32_t rf = H * HD + 3; /* q at 3: other parts before it */
	float ring[ST * (H * HD + 3)];
	for (uint32_t e = 0; e < ST * rf; e++)
		ring[e] = (float)(urnd() % 2001) / 500.0f - 2.0f;
	void *dring;
	T_OK(f.o->mem_new(f.ctx, sizeof(ring), &dring));
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	struct kvt_backend_paged pg = sel_paged(&f);
	struct kvt_backend_expected win[NW + 1];
	for (uint32_t j = 0; j < NW; j++)
		win[j] = (struct kvt_backend_expected){
			.ring = dring, .rows = {ST, rf, 3, 0}, .P = P,
			.from = P - W, .n_new = NN,
			.sinks = SINKS, .future = 40, .theta = 10000.0f,
			.cov = j != 1, .vnorm = j != 2, .eps = j == 2 ? 0.01 : 0,
			.first_list = j * NKV, .n_lists = NKV,
		};
	uint8_t want[NW * NKV][P + NN];
	struct kvt_backend_window_list lists[NW * NKV];
	const uint32_t nd = P - SINKS - KEEP;
	for (uint32_t l = 0; l < NW * NKV; l++) {
		expected_naive(&f, sel_rec(&f, l), ring, rf, l % NKV, G, HD,
		               &win[l / NKV], KEEP, want[l]);
		lists[l] = (struct kvt_backend_window_list){l, P + NN, KEEP, nd,
		                                             l * nd};
	}
	enum { WORDS = NW + 1 + NW * NKV + NW * NKV * (P - SINKS - KEEP) };
	uint32_t out[WORDS];
	T_OK(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, win, NW, lists, NW * NKV, out,
	                          WORDS - 1, NULL));
	for (uint32_t j = 0; j < NW; j++)
		T_EQ(out[j], 0);
	for (uint32_t l = 0; l < NW * NKV; l++) {
		T_EQ(out[NW + l], nd);
		uint32_t k = 0;
		for (uint32_t i = 0; i < P + NN; i++)
			if (want[l][i])
				T_EQ(out[NW + NW * NKV + lists[l].drop_off + k++],
				     i);
		T_EQ(k, nd);
	}
	/* a NaN in a new row's q: flagged, in the check-only window too
	 * (and a NaN in a row outside q, which neither reads) */
	ring[((P + 2) % ST) * rf + 3 + 5] = NAN;
	ring[((P - 1) % ST) * rf + 1] = NAN;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	win[NW] = win[0];
	win[NW].from = P;
	win[NW].n_lists = 0;
	struct kvt_backend_expected two[2] = {win[0], win[NW]};
	T_OK(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, two, 2, lists, NKV, out,
	                          2 + NKV + NKV * nd, NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], 1);
	/* the NaN before P only touches window 0 (its statistics' rows) */
	ring[((P + 2) % ST) * rf + 3 + 5] = 1.0f;
	ring[((P - 1) % ST) * rf + 3 + 2] = NAN;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	T_OK(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, two, 2, lists, NKV, out,
	                          2 + NKV + NKV * nd, NULL));
	T_EQ(out[0], 1);
	T_EQ(out[1], 0);
	/* q finite again: the NaN outside q stays unread, same drops */
	ring[((P - 1) % ST) * rf + 3 + 2] = 0.5f;
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	T_OK(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, two, 2, lists, NKV, out,
	                          2 + NKV + NKV * nd, NULL));
	T_EQ(out[0], 0);
	T_EQ(out[1], 0);
	T_EQ(out[2], nd);
	T_EQ(out[3], nd);
	/* refusals */
	const uint32_t words = NW + NW * NKV + NW * NKV * nd;
	struct kvt_backend_expected bad = win[0];
	bad.from = P + 1;
	T_EQ(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, &bad, 1, lists, NKV, out, words, NULL),
	     KVT_EINVAL);
	bad = win[0];
	bad.future = 0;
	T_EQ(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, &bad, 1, lists, NKV, out, words, NULL),
	     KVT_EINVAL);
	bad = win[0];
	bad.from = P - ST; /* rows beyond the ring */
	T_EQ(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, &bad, 1, lists, NKV, out, words, NULL),
	     KVT_EINVAL);
	T_EQ(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD - 1, win, 1, lists, NKV, out, words, NULL),
	     KVT_EINVAL); /* odd head_dim */
	T_EQ(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, win, NW, lists, NW * NKV, out, words - 1,
	                          NULL), KVT_EINVAL); /* beyond out */
	lists[1].record = DR_LISTS;
	T_EQ(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, win, 1, lists, NKV, out, words, NULL),
	     KVT_EINVAL);
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}

/* The launches (kernels and cuBLAS calls) the backend counted during
 * one call of ops whose result is rv; rv 0 expected. */
#define PL_LAUNCHES(o, ctx, call)                                              \
	({                                                                     \
		uint64_t h_, d_, l0_, l1_;                                     \
		T_OK((o)->traffic((ctx), &h_, &d_, &l0_, NULL));               \
		T_OK(call);                                                    \
		T_OK((o)->traffic((ctx), &h_, &d_, &l1_, NULL));               \
		l1_ - l0_;                                                     \
	})

/* Each list's drops of a prompt call (n_win windows, n lists) against
 * the naive marks want [n][cap]. */
static void pl_check(const uint32_t *out, uint32_t n_win,
                     const struct kvt_backend_window_list *lists, uint32_t n,
                     const uint8_t *want, uint32_t cap)
{
	for (uint32_t l = 0; l < n; l++) {
		T_EQ(out[n_win + l], lists[l].n_drop);
		uint32_t k = 0;
		for (uint32_t i = 0; i < lists[l].len; i++)
			if (want[l * cap + i])
				T_EQ(out[n_win + n + lists[l].drop_off + k++], i);
		T_EQ(k, lists[l].n_drop);
	}
}

/* The launch bounds docs/cuda.md states per call. */
#define PL_WINDOW_BOUND 6
#define PL_EXPECTED_BOUND 14 /* one tile */
#define PL_NORMS_BOUND 1

TEST(cuda, backend_window_select_launches)
{
	/* 1 and 24 windows of ragged prompts (8 to 32, so lists of 12 to
	 * 36 entries; 2 lists each, records shared), window 4, kernel 3,
	 * sinks 1: the drops are the rule's in double (window_naive) and a
	 * call takes the same launches whatever its windows, at most
	 * PL_WINDOW_BOUND.  Two windows naming one list are refused before
	 * anything is launched. */
	enum { HD = 8, PT = 4, G = 2, NKV = 2, H = G * NKV, ST = 16, W = 4,
	       NN = 4, NW = 24, CAP = DR_PAGES * PT };
	struct sel_fx f;
	dr_init(&f, PT, HD * sizeof(float));
	if (!f.o->window_select || !f.o->traffic)
		T_SKIP("no window_select");
	sel_fill_floats(&f, KVT_DTYPE_F32);
	for (uint32_t i = 0; i < DR_LISTS; i++)
		sel_rec(&f, i)->len = CAP;
	sel_put_records(&f);
	const uint32_t rf = H * HD + H;
	static float ring[ST * (H * HD + H)];
	for (uint32_t e = 0; e < ST * rf; e++)
		ring[e] = e % rf < H * HD ? sel_unif(1000) : 0.25f * (float)(urnd() % 8);
	void *dring;
	T_OK(f.o->mem_new(f.ctx, sizeof(ring), &dring));
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	struct kvt_backend_paged pg = sel_paged(&f);
	struct kvt_backend_window win[NW];
	struct kvt_backend_window_list lists[NW * NKV];
	static uint8_t want[NW * NKV * CAP];
	static uint32_t out[NW + NW * NKV + NW * NKV * CAP];
	uint32_t off = 0;
	for (uint32_t j = 0; j < NW; j++) {
		const uint32_t P = 8 + (j * 7) % 25, keep = (P - W - 1) / 2;
		win[j] = (struct kvt_backend_window){
			.ring = dring, .rows = {ST, rf, 0, H * HD}, .P = P, .w = W,
			.n_new = NN, .kernel = 3, .sinks = 1,
			.first_list = j * NKV, .n_lists = NKV};
		for (uint32_t g = 0; g < NKV; g++) {
			const uint32_t l = j * NKV + g, rec = l % DR_LISTS;
			window_naive(&f, sel_rec(&f, rec), ring, rf, ST, g, G, HD, P,
			             W, NN, 3, 1, keep, want + l * CAP);
			uint32_t nd = 0;
			for (uint32_t i = 0; i < P + NN; i++)
				nd += want[l * CAP + i];
			lists[l] = (struct kvt_backend_window_list){rec, P + NN,
			                                             keep, nd, off};
			off += nd;
		}
	}
	uint64_t one = PL_LAUNCHES(f.o, f.ctx, f.o->window_select(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, win, 1, lists,
		NKV, out, 1 + NKV + lists[1].drop_off + lists[1].n_drop, NULL));
	pl_check(out, 1, lists, NKV, want, CAP);
	uint64_t many = PL_LAUNCHES(f.o, f.ctx, f.o->window_select(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, win, NW, lists,
		NW * NKV, out, NW + NW * NKV + off, NULL));
	for (uint32_t j = 0; j < NW; j++)
		T_EQ(out[j], 0);
	pl_check(out, NW, lists, NW * NKV, want, CAP);
	T_EQ(one, many);
	T_ASSERT(many <= PL_WINDOW_BOUND);
	/* window 5 names window 4's lists: refused, nothing launched */
	win[5].first_list = win[4].first_list;
	uint64_t h0, d0, l0, h1, d1, l1;
	T_OK(f.o->traffic(f.ctx, &h0, &d0, &l0, NULL));
	T_EQ(f.o->window_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                        HD, win, NW, lists, NW * NKV, out,
	                        NW + NW * NKV + off, NULL), KVT_EINVAL);
	T_OK(f.o->traffic(f.ctx, &h1, &d1, &l1, NULL));
	T_EQ(l1, l0);
	T_EQ(h1, h0);
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}

TEST(cuda, backend_expected_select_launches)
{
	/* 1 and 18 windows of ragged prompts (10 to 68, so lists of 14 to
	 * 72 entries: K S' of one short block, or of 64 keys and a short
	 * one; 2 lists each, records shared), cov off in every third: the
	 * drops are the rule's in double (expected_naive) and a call takes
	 * the same launches whatever its windows, at most
	 * PL_EXPECTED_BOUND; split into tiles of one window
	 * (KVTRIM_CUDA_TILE_BYTES), the same drops.  Overlapping lists are
	 * refused, nothing launched. */
	enum { HD = 8, PT = 8, G = 2, NKV = 2, H = G * NKV, ST = 16, W = 6,
	       NN = 4, SINKS = 2, NW = 18, CAP = DR_PAGES * PT };
	struct sel_fx f;
	dr_init(&f, PT, HD * sizeof(float));
	if (!f.o->expected_select || !f.o->traffic)
		T_SKIP("no expected_select");
	sel_fill_floats(&f, KVT_DTYPE_F32);
	for (uint32_t i = 0; i < DR_LISTS; i++)
		sel_rec(&f, i)->len = CAP;
	sel_put_records(&f);
	const uint32_t rf = H * HD + 3;
	static float ring[ST * (H * HD + 3)];
	for (uint32_t e = 0; e < ST * rf; e++)
		ring[e] = (float)(urnd() % 2001) / 500.0f - 2.0f;
	void *dring;
	T_OK(f.o->mem_new(f.ctx, sizeof(ring), &dring));
	T_OK(f.o->copy(f.ctx, dring, ring, sizeof(ring), NULL));
	struct kvt_backend_paged pg = sel_paged(&f);
	struct kvt_backend_expected win[NW];
	struct kvt_backend_window_list lists[NW * NKV];
	static uint8_t want[NW * NKV * CAP];
	static uint32_t out[NW + NW * NKV + NW * NKV * CAP];
	uint32_t off = 0;
	for (uint32_t j = 0; j < NW; j++) {
		const uint32_t P = 10 + (j * 13) % 59, keep = (P - SINKS) / 3;
		win[j] = (struct kvt_backend_expected){
			.ring = dring, .rows = {ST, rf, 3, 0}, .P = P,
			.from = P - W, .n_new = NN, .sinks = SINKS, .future = 40,
			.theta = 10000.0f, .cov = j % 3 != 1, .vnorm = j % 2,
			.eps = 0.01, .first_list = j * NKV, .n_lists = NKV};
		for (uint32_t g = 0; g < NKV; g++) {
			const uint32_t l = j * NKV + g, rec = l % DR_LISTS;
			expected_naive(&f, sel_rec(&f, rec), ring, rf, g, G, HD,
			               &win[j], keep, want + l * CAP);
			const uint32_t nd = P - SINKS - keep;
			lists[l] = (struct kvt_backend_window_list){rec, P + NN,
			                                             keep, nd, off};
			off += nd;
		}
	}
	uint64_t one = PL_LAUNCHES(f.o, f.ctx, f.o->expected_select(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, win, 1, lists,
		NKV, out, 1 + NKV + lists[1].drop_off + lists[1].n_drop, NULL));
	pl_check(out, 1, lists, NKV, want, CAP);
	uint64_t many = PL_LAUNCHES(f.o, f.ctx, f.o->expected_select(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, win, NW, lists,
		NW * NKV, out, NW + NW * NKV + off, NULL));
	for (uint32_t j = 0; j < NW; j++)
		T_EQ(out[j], 0);
	pl_check(out, NW, lists, NW * NKV, want, CAP);
	T_EQ(one, many);
	T_ASSERT(many <= PL_EXPECTED_BOUND);
	/* tiles of one window each: the same drops, 1 + at most 13 a tile */
	memset(out, 0xff, sizeof(out));
	T_OK(setenv("KVTRIM_CUDA_TILE_BYTES", "1", 1));
	uint64_t tiled = PL_LAUNCHES(f.o, f.ctx, f.o->expected_select(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV, HD, win, NW, lists,
		NW * NKV, out, NW + NW * NKV + off, NULL));
	T_OK(unsetenv("KVTRIM_CUDA_TILE_BYTES"));
	for (uint32_t j = 0; j < NW; j++)
		T_EQ(out[j], 0);
	pl_check(out, NW, lists, NW * NKV, want, CAP);
	T_ASSERT(tiled > many && tiled <= 1 + (PL_EXPECTED_BOUND - 1) * NW);
	/* window 3's lists reach into window 4's: refused */
	win[3].first_list = win[4].first_list - 1;
	uint64_t h0, d0, l0, h1, d1, l1;
	T_OK(f.o->traffic(f.ctx, &h0, &d0, &l0, NULL));
	T_EQ(f.o->expected_select(f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, H, NKV,
	                          HD, win, NW, lists, NW * NKV, out,
	                          NW + NW * NKV + off, NULL), KVT_EINVAL);
	T_OK(f.o->traffic(f.ctx, &h1, &d1, &l1, NULL));
	T_EQ(l1, l0);
	T_EQ(h1, h0);
	f.o->mem_free(f.ctx, dring);
	sel_fini(&f);
}

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
	for (uint32_t i = 0; i < DR_LISTS; i++)
		sel_rec(&f, i)->len = DR_PAGES * PT;
	sel_put_records(&f);
	struct kvt_backend_paged pg = sel_paged(&f);
	struct kvt_backend_norm_job jobs[DR_LISTS];
	float got[DR_LISTS * 32];
	uint32_t at = 0;
	for (uint32_t i = 0; i < DR_LISTS; i++) {
		const uint32_t n = 4 + (i * 11) % 25;
		jobs[i] = (struct kvt_backend_norm_job){i, i % 3, n, at, 1};
		at += n;
	}
	uint64_t one = PL_LAUNCHES(f.o, f.ctx, f.o->key_norms(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, HD, jobs, 1, got,
		jobs[0].n, NULL));
	uint64_t many = PL_LAUNCHES(f.o, f.ctx, f.o->key_norms(
		f.ctx, &pg, DR_LISTS, KVT_DTYPE_F32, HD, jobs, DR_LISTS, got, at,
		NULL));
	T_EQ(one, many);
	T_ASSERT(many >= 1 && many <= PL_NORMS_BOUND);
	sel_fini(&f);
}
