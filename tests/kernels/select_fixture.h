/*
 * select_fixture.h — what the tests of the cuda backend's device-sync ops
 * and device rules share (tests/kernels/test_cuda_h2o.c: the rule "h2o",
 * test_cuda_tova.c: "tova", test_cuda_kvpop.c: "kvpop", test_cuda_snapkv.c:
 * "snapkv", test_cuda_expected_attention.c: "expected_attention";
 * test_cuda_sync_ops.c: compact_drops, key_norms): the tests' LCG (urnd, frnd), and one chunk of paged KV
 * on the device as the pool lays it out — n_lists lists of list_pages pages of page_tokens K rows
 * then as many V rows of row_bytes, one list record each at a stride
 * rounded up to 64 bytes, a chunk-bases array of two slots (slot 1
 * unmapped) — with a host image of the chunk and of the records, the
 * struct kvt_backend_paged that describes them, and the teardown.  A test
 * adds its own device buffers with sel_mem; sel_fini frees them too.
 * sel_rule finds a device rule and sel_run runs it; SEL_LAUNCHES counts
 * the launches of a call and SEL_REFUSED_UNRUN checks a refusal launched
 * and copied nothing; sel_check_drops checks a job's drops against
 * marks and sel_keep_best is the rules' references' top-k.
 *
 * Header-only (static inline), so no helper name leaves a test file.  The
 * test file defines SEL_SEED (its stream's first state) before including
 * it, and SEL_FRND_STEPS if frnd's grid is not 1/1000.  Not for use with
 * cuda_fixture.h (both define a frnd).  The tests built from these files
 * run in kvtrim-cuda-tests and, under the CPU emulator,
 * kvtrim-cuda-emu-tests.
 */
#ifndef KVT_SELECT_FIXTURE_H
#define KVT_SELECT_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "test.h"

extern const struct kvt_backend_ops kvt_cuda_backend_v1;

#ifndef SEL_SEED
#error "define SEL_SEED (the test's first LCG state) before select_fixture.h"
#endif
#ifndef SEL_FRND_STEPS
#define SEL_FRND_STEPS 1000
#endif

/* The LCG (Numerical Recipes' constants), its top 24 bits; each test
 * starts from SEL_SEED (the runner forks every test). */
static uint32_t sel_seed = SEL_SEED;

static inline uint32_t urnd(void)
{
	sel_seed = sel_seed * 1664525u + 1013904223u;
	return sel_seed >> 8;
}

/* Uniform on the grid k / steps - 1, k = 0 .. 2 steps: [-1, 1]. */
static inline float sel_unif(uint32_t steps)
{
	return (float)(urnd() % (2 * steps + 1)) / (float)steps - 1.0f;
}

static inline float frnd(void)
{
	return sel_unif(SEL_FRND_STEPS);
}

/*
 * One chunk of n_lists * list_pages pages (pt K rows, then pt V rows, of
 * row bytes a page); list i owns pages i * list_pages .. in reversed order
 * (its record's pages[p] = i * list_pages + list_pages - 1 - p).
 */
struct sel_fx {
	const struct kvt_backend_ops *o;
	void *ctx;
	uint32_t pt, row, n_lists, max_pages, ppc; /* ppc: pages per chunk */
	uint64_t page_bytes, stride, chunk_bytes;
	void *chunk, **d_bases, *d_rec;  /* the device's */
	uint8_t *h_chunk, *h_rec;        /* the host's images of them */
	void *extra[8];                  /* sel_mem's, freed by sel_fini */
	uint32_t n_extra;
};

static inline struct kvt_list_record *sel_rec(struct sel_fx *f, uint32_t i)
{
	return (struct kvt_list_record *)(f->h_rec + i * f->stride);
}

/* The host records to the device. */
static inline void sel_put_records(struct sel_fx *f)
{
	T_OK(f->o->copy(f->ctx, f->d_rec, f->h_rec, f->n_lists * f->stride,
	                NULL));
}

/* Every list's record holds len entries, on the host and the device. */
static inline void sel_set_lens(struct sel_fx *f, uint32_t len)
{
	for (uint32_t i = 0; i < f->n_lists; i++)
		sel_rec(f, i)->len = len;
	sel_put_records(f);
}

/* The host image of the chunk to the device. */
static inline void sel_put_chunk(struct sel_fx *f)
{
	T_OK(f->o->copy(f->ctx, f->chunk, f->h_chunk, f->chunk_bytes, NULL));
}

/* Skips without a device; else a context, the chunk (its contents
 * undefined until a sel_fill_*), the bases and the records, on the host
 * and the device. */
static inline void sel_init(struct sel_fx *f, uint32_t pt, uint32_t row,
                            uint32_t n_lists, uint32_t list_pages)
{
	char err[256];
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	if (o->probe(err, sizeof(err)))
		T_SKIP(err);
	memset(f, 0, sizeof(*f));
	f->o = o;
	T_OK(o->ctx_new(0, &f->ctx, NULL, err, sizeof(err)));
	f->pt = pt;
	f->row = row;
	f->n_lists = n_lists;
	f->max_pages = list_pages;
	f->ppc = n_lists * list_pages;
	f->page_bytes = 2ull * pt * row;
	f->stride = (sizeof(struct kvt_list_record) +
	             list_pages * sizeof(uint32_t) + 63) / 64 * 64;
	f->chunk_bytes = f->ppc * f->page_bytes;
	T_OK(o->mem_new(f->ctx, f->chunk_bytes, &f->chunk));
	T_OK(o->mem_new(f->ctx, 2 * sizeof(void *), (void **)&f->d_bases));
	T_OK(o->mem_new(f->ctx, n_lists * f->stride, &f->d_rec));
	void *bases[2] = {f->chunk, NULL}; /* slot 1: unmapped */
	T_OK(o->copy(f->ctx, f->d_bases, bases, sizeof(bases), NULL));
	f->h_chunk = malloc(f->chunk_bytes);
	f->h_rec = calloc(n_lists, f->stride);
	T_ASSERT(f->h_chunk && f->h_rec);
	for (uint32_t i = 0; i < n_lists; i++) {
		struct kvt_list_record *r = sel_rec(f, i);
		r->n_pages = list_pages;
		for (uint32_t p = 0; p < list_pages; p++)
			r->pages[p] = i * list_pages + (list_pages - 1 - p);
	}
	sel_put_records(f);
}

/* Another device buffer of the test's, freed by sel_fini. */
static inline void *sel_mem(struct sel_fx *f, size_t bytes)
{
	void *p = NULL;
	T_ASSERT(f->n_extra < sizeof(f->extra) / sizeof(f->extra[0]));
	T_OK(f->o->mem_new(f->ctx, bytes, &p));
	f->extra[f->n_extra++] = p;
	return p;
}

/* The chunk: random bytes (one urnd each), on the host and the device. */
static inline void sel_fill_bytes(struct sel_fx *f)
{
	for (uint64_t i = 0; i < f->chunk_bytes; i++)
		f->h_chunk[i] = (uint8_t)urnd();
	sel_put_chunk(f);
}

/* sel_init with the chunk's random bytes (sel_fill_bytes). */
static inline void sel_init_bytes(struct sel_fx *f, uint32_t pt, uint32_t row,
                                  uint32_t n_lists, uint32_t list_pages)
{
	sel_init(f, pt, row, n_lists, list_pages);
	sel_fill_bytes(f);
}

/* The chunk: elements of dtype dt, each from sel_unif(1000) (one urnd),
 * on the host and the device. */
static inline void sel_fill_floats(struct sel_fx *f, enum kvt_dtype dt)
{
	const size_t esz = kvt_dtype_size(dt);
	for (uint64_t i = 0; i < f->chunk_bytes / esz; i++) {
		float v = sel_unif(1000);
		dtype_from_f32(&v, dt, f->h_chunk + i * esz, 1);
	}
	sel_put_chunk(f);
}

/* The host addresses of list i's pages. */
static inline void sel_pages(struct sel_fx *f, uint32_t i, void **pv)
{
	const struct kvt_list_record *r = sel_rec(f, i);
	for (uint32_t p = 0; p < f->max_pages; p++)
		pv[p] = f->h_chunk + r->pages[p] * f->page_bytes;
}

/* Whether the device's chunk is the host image, byte for byte. */
static inline int sel_chunk_same(struct sel_fx *f)
{
	uint8_t *got = malloc(f->chunk_bytes);
	T_ASSERT(got);
	T_OK(f->o->copy(f->ctx, got, f->chunk, f->chunk_bytes, NULL));
	int same = memcmp(got, f->h_chunk, f->chunk_bytes) == 0;
	free(got);
	return same;
}

static inline struct kvt_backend_paged sel_paged(const struct sel_fx *f)
{
	return (struct kvt_backend_paged){
		.records = f->d_rec, .list_stride = f->stride,
		.max_pages = f->max_pages, .chunk_bases = f->d_bases,
		.n_chunk_slots = 2, .pages_per_chunk = f->ppc,
		.page_bytes = f->page_bytes, .page_tokens = f->pt,
		.row_bytes = f->row,
	};
}

/* The backend's device rule named name, whose layout must be the test's
 * header's (version, params and job bytes); skips when the backend has
 * none. */
static inline const struct kvt_backend_rule *
sel_rule(const struct sel_fx *f, const char *name, uint32_t version,
         size_t params_bytes, size_t job_bytes)
{
	const struct kvt_backend_rule *r = f->o->rule ? f->o->rule(name) : NULL;
	if (!r || !f->o->compact_drops)
		T_SKIP("no device rule or compact_drops");
	T_ASSERT(strcmp(r->name, name) == 0);
	T_EQ(r->version, version);
	T_EQ(r->params_bytes, params_bytes);
	T_EQ(r->job_bytes, job_bytes);
	return r;
}

/* Rule r over n jobs of geometry (dt, n_heads, n_kv_heads, head_dim). */
static inline int sel_run(struct sel_fx *f, const struct kvt_backend_rule *r,
                          const struct kvt_backend_paged *pg,
                          uint32_t n_records, enum kvt_dtype dt,
                          uint32_t n_heads, uint32_t n_kv_heads,
                          uint32_t head_dim, const void *params,
                          const void *jobs, uint32_t n, uint32_t *out,
                          uint32_t out_words, void *stream)
{
	const struct kvt_backend_rule_geom g = {dt, n_heads, n_kv_heads,
	                                        head_dim};
	return r->run(f->ctx, pg, n_records, &g, params, jobs, n, out,
	              out_words, stream);
}

/* The launches (kernels and cuBLAS calls) backend o counted (its traffic
 * op) during call, which must return 0. */
#define SEL_LAUNCHES(o, ctx, call)                                             \
	({                                                                     \
		uint64_t h_, d_, l0_, l1_;                                     \
		T_OK((o)->traffic((ctx), &h_, &d_, &l0_, NULL));               \
		T_OK(call);                                                    \
		T_OK((o)->traffic((ctx), &h_, &d_, &l1_, NULL));               \
		l1_ - l0_;                                                     \
	})

/* call refused with KVT_EINVAL before backend o launched anything or
 * copied anything to the device. */
#define SEL_REFUSED_UNRUN(o, ctx, call)                                        \
	do {                                                                   \
		uint64_t h0_, d0_, l0_, h1_, d1_, l1_;                         \
		T_OK((o)->traffic((ctx), &h0_, &d0_, &l0_, NULL));             \
		T_EQ((call), KVT_EINVAL);                                      \
		T_OK((o)->traffic((ctx), &h1_, &d1_, &l1_, NULL));             \
		T_EQ(l1_, l0_);                                                \
		T_EQ(h1_, h0_);                                                \
	} while (0)

/* Job k of a call of n jobs (rule jobs' output: n flags, n drop counts,
 * then the drops' indices), of len entries with the new ones and n_drop
 * drops from word 2 n + drop_off: its count and indices against the
 * marks want [len]. */
static inline void sel_check_drops(const uint32_t *out, uint32_t n,
                                   uint32_t k, uint32_t len, uint32_t n_drop,
                                   uint32_t drop_off, const uint8_t *want)
{
	T_EQ(out[n + k], n_drop);
	uint32_t c = 0;
	for (uint32_t i = 0; i < len; i++)
		if (want[i])
			T_EQ(out[2 * n + drop_off + c++], i);
	T_EQ(c, n_drop);
}

/* Of the candidates cand [nc] scored by s, the best keep (ties: the higher
 * index) stay; the others are marked in drop.  The rules' references in
 * double select with it (a plain exchange sort, not the rules' code). */
static inline void sel_keep_best(const double *s, uint32_t *cand, uint32_t nc,
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

static inline void sel_fini(struct sel_fx *f)
{
	for (uint32_t i = 0; i < f->n_extra; i++)
		f->o->mem_free(f->ctx, f->extra[i]);
	f->o->mem_free(f->ctx, f->chunk);
	f->o->mem_free(f->ctx, f->d_bases);
	f->o->mem_free(f->ctx, f->d_rec);
	f->o->ctx_free(f->ctx);
	free(f->h_chunk);
	free(f->h_rec);
}

#endif
