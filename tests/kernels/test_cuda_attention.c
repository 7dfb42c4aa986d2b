/*
 * test_cuda_attention.c — the cuda backend's attention op (backend.h;
 * what kvt_attention runs on a cuda tenant) on a table and pages built
 * by hand in device memory, against paged_attention_cpu (kernels/cpu/) run
 * per (token, KV head) over the same pages with the causal length
 * len + t + 1.  Also: calls alternating between two streams and growing
 * the op's buffer, a record naming an unmapped chunk (its head attends
 * over nothing instead of faulting), and the refusals (host pointers,
 * head_dim beyond 256, bad sizes).  Built into kvtrim-cuda-tests and,
 * under the CPU emulator, kvtrim-cuda-emu-tests (backend/cuda/cuda.mk,
 * tests/kernels/emu/emu.mk); skips without a device.
 * Tolerance as paged_attention's in test_cuda_kernels.c: out atol 2e-4,
 * rtol 1e-3; lse atol 2e-4.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kernels.h"
#include "test.h"

extern const struct kvt_backend_ops kvt_cuda_backend_v1;

static uint32_t seed = 7;
static float frnd(void)
{
	seed = seed * 1664525u + 1013904223u;
	return (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
}

/* A tenant-like layout in device memory: one chunk of pages, its base in a
 * one-slot device array, and the records of n_kv lists. */
struct fake {
	const struct kvt_backend_ops *o;
	void *ctx;
	uint32_t n_kv, hd, pt, max_pages, ppc;
	uint64_t page_bytes, stride;
	void *chunk, **d_bases, *d_rec;
	float *h_chunk;  /* host image of the chunk (f32 pages) */
	uint8_t *h_rec;  /* host image of the records */
};

static void fake_init(struct fake *f, uint32_t n_kv, uint32_t hd,
                      uint32_t pt, uint32_t max_pages)
{
	char err[256];
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	if (o->probe(err, sizeof(err)))
		T_SKIP(err);
	memset(f, 0, sizeof(*f));
	f->o = o;
	T_OK(o->ctx_new(0, &f->ctx, NULL, err, sizeof(err)));
	f->n_kv = n_kv;
	f->hd = hd;
	f->pt = pt;
	f->max_pages = max_pages;
	f->page_bytes = 2ull * pt * hd * sizeof(float);
	f->ppc = n_kv * max_pages;
	f->stride = (sizeof(struct kvt_list_record) +
	             max_pages * sizeof(uint32_t) + 63) / 64 * 64;
	size_t cb = f->ppc * f->page_bytes;
	T_OK(o->mem_new(f->ctx, cb, &f->chunk));
	T_OK(o->mem_new(f->ctx, sizeof(void *), (void **)&f->d_bases));
	T_OK(o->mem_new(f->ctx, n_kv * f->stride, &f->d_rec));
	T_OK(o->copy(f->ctx, f->d_bases, &f->chunk, sizeof(void *), NULL));
	f->h_chunk = malloc(cb);
	f->h_rec = calloc(n_kv, f->stride);
	T_ASSERT(f->h_chunk && f->h_rec);
	for (size_t i = 0; i < cb / sizeof(float); i++)
		f->h_chunk[i] = frnd();
	T_OK(o->copy(f->ctx, f->chunk, f->h_chunk, cb, NULL));
}

static struct kvt_list_record *rec(struct fake *f, uint32_t h)
{
	return (struct kvt_list_record *)(f->h_rec + h * f->stride);
}

/* List h holds len entries in pages [h * max_pages + ...), reversed so
 * page order differs from address order; uploads the records. */
static void fake_lists(struct fake *f, const uint32_t *lens)
{
	for (uint32_t h = 0; h < f->n_kv; h++) {
		struct kvt_list_record *r = rec(f, h);
		r->len = lens[h];
		r->n_pages = f->max_pages;
		for (uint32_t i = 0; i < f->max_pages; i++)
			r->pages[i] = h * f->max_pages + (f->max_pages - 1 - i);
	}
	T_OK(f->o->copy(f->ctx, f->d_rec, f->h_rec, f->n_kv * f->stride,
	                NULL));
}

static void fake_fini(struct fake *f)
{
	f->o->mem_free(f->ctx, f->chunk);
	f->o->mem_free(f->ctx, f->d_bases);
	f->o->mem_free(f->ctx, f->d_rec);
	f->o->ctx_free(f->ctx);
	free(f->h_chunk);
	free(f->h_rec);
}

static struct kvt_backend_attention fake_args(struct fake *f, uint32_t H,
                                              uint32_t n, uint32_t max_len)
{
	return (struct kvt_backend_attention){
		.records = f->d_rec, .list_stride = f->stride,
		.chunk_bases = f->d_bases, .n_chunk_slots = 1,
		.pages_per_chunk = f->ppc, .page_bytes = f->page_bytes,
		.max_pages = f->max_pages, .page_tokens = f->pt,
		.head_dim = f->hd, .n_heads = H, .n_kv_heads = f->n_kv,
		.dtype = KVT_DTYPE_F32, .n = n, .max_len = max_len,
		.scale = 1.0f / sqrtf((float)f->hd),
	};
}

/* The CPU reference of one call; dead[h] marks heads expected empty. */
static void expect(struct fake *f, uint32_t H, uint32_t n, const float *q,
                   const float *out, const float *lse, const int *dead)
{
	const uint32_t G = H / f->n_kv, hd = f->hd;
	void **pv = malloc(f->max_pages * sizeof(void *));
	float *ro = malloc((size_t)G * hd * sizeof(float)), rl[64];
	float *scr = malloc((size_t)G * f->max_pages * f->pt * sizeof(float));
	T_ASSERT(pv && ro && scr && G <= 64);
	for (uint32_t h = 0; h < f->n_kv; h++) {
		struct kvt_list_record *r = rec(f, h);
		for (uint32_t i = 0; i < f->max_pages; i++)
			pv[i] = (char *)f->h_chunk + r->pages[i] * f->page_bytes;
		for (uint32_t t = 0; t < n; t++) {
			size_t qh = (size_t)t * H + (size_t)h * G;
			paged_attention_cpu(q + qh * hd, G, pv, f->pt, hd,
			                    KVT_DTYPE_F32, r->len + t + 1,
			                    1.0f / sqrtf((float)hd), ro, rl, scr);
			for (uint32_t g = 0; g < G; g++) {
				float wl = dead && dead[h] ? -INFINITY : rl[g];
				float gl = lse[qh + g];
				T_ASSERT(isinf(wl) ? gl == wl
				                   : fabsf(gl - wl) <= 2e-4f);
				for (uint32_t d = 0; d < hd; d++) {
					float w = dead && dead[h] ? 0.0f
					                          : ro[g * hd + d];
					float x = out[(qh + g) * hd + d];
					if (!(fabsf(x - w) <= 2e-4f + 1e-3f * fabsf(w)))
						th_fail(__FILE__, __LINE__, "head %u "
						        "token %u dim %u: %g, expected "
						        "%g", h * G + g, t, d, x, w);
				}
			}
		}
	}
	free(pv);
	free(ro);
	free(scr);
}

TEST(cuda, backend_attention_matches_cpu)
{
	struct fake f;
	fake_init(&f, 4, 64, 16, 40); /* 640 entries per list at most */
	const uint32_t H = 8, n_max = 32;
	const struct kvt_backend_ops *o = f.o;
	void *s[2];
	T_OK(o->stream_new(f.ctx, &s[0]));
	T_OK(o->stream_new(f.ctx, &s[1]));
	size_t qb = (size_t)n_max * H * f.hd * sizeof(float);
	float *q = malloc(qb), *out = malloc(qb), *lse = malloc(qb / f.hd);
	void *dq, *dout, *dlse;
	T_OK(o->mem_new(f.ctx, qb, &dq));
	T_OK(o->mem_new(f.ctx, qb, &dout));
	T_OK(o->mem_new(f.ctx, qb / f.hd, &dlse));
	/* short lists first, then long ones (split-K, a bigger buffer),
	 * alternating streams; per-head lengths differ */
	static const uint32_t shapes[][5] = {
		{1, 0, 0, 0, 0},     {3, 5, 0, 17, 2},  {32, 1, 40, 9, 100},
		{1, 600, 300, 31, 7}, {16, 608, 500, 0, 260},
		{2, 10, 20, 30, 40},
	};
	for (uint32_t c = 0; c < sizeof(shapes) / sizeof(shapes[0]); c++) {
		uint32_t n = shapes[c][0], max_len = 0;
		fake_lists(&f, shapes[c] + 1);
		for (uint32_t h = 0; h < f.n_kv; h++)
			if (shapes[c][1 + h] + n > max_len)
				max_len = shapes[c][1 + h] + n;
		for (size_t i = 0; i < (size_t)n * H * f.hd; i++)
			q[i] = 2.0f * frnd();
		T_OK(o->copy(f.ctx, dq, q, (size_t)n * H * f.hd * 4, s[c % 2]));
		struct kvt_backend_attention a = fake_args(&f, H, n, max_len);
		a.q = dq;
		a.out = dout;
		a.lse = dlse;
		T_OK(o->attention(f.ctx, &a, s[c % 2]));
		T_OK(o->copy(f.ctx, out, dout, (size_t)n * H * f.hd * 4,
		             s[c % 2]));
		T_OK(o->copy(f.ctx, lse, dlse, (size_t)n * H * 4, s[c % 2]));
		expect(&f, H, n, q, out, lse, NULL);
	}

	/* Head 2 names a page of chunk slot 1, which does not exist: its
	 * lists come out empty, the others as before. */
	static const uint32_t lens[4] = {9, 9, 9, 9};
	fake_lists(&f, lens);
	rec(&f, 2)->pages[0] = f.ppc + 3;
	T_OK(o->copy(f.ctx, f.d_rec, f.h_rec, f.n_kv * f.stride, NULL));
	struct kvt_backend_attention a = fake_args(&f, H, 2, 11);
	a.q = dq;
	a.out = dout;
	a.lse = dlse;
	T_OK(o->attention(f.ctx, &a, s[0]));
	T_OK(o->copy(f.ctx, out, dout, (size_t)2 * H * f.hd * 4, s[0]));
	T_OK(o->copy(f.ctx, lse, dlse, (size_t)2 * H * 4, s[0]));
	rec(&f, 2)->pages[0] = 2 * f.max_pages; /* for the reference */
	static const int dead[4] = {0, 0, 1, 0};
	expect(&f, H, 2, q, out, lse, dead);

	/* Refusals. */
	a.q = q; /* host memory */
	T_ERR(o->attention(f.ctx, &a, s[0]), KVT_EINVAL);
	T_ASSERT(strstr(o->last_error(), "not device memory"));
	a.q = dq;
	a.lse = lse;
	T_ERR(o->attention(f.ctx, &a, s[0]), KVT_EINVAL);
	a.lse = dlse;
	a.head_dim = 512;
	T_ERR(o->attention(f.ctx, &a, s[0]), KVT_ENOTSUP);
	a.head_dim = f.hd;
	a.n_heads = 6; /* not a multiple of n_kv_heads */
	T_ERR(o->attention(f.ctx, &a, s[0]), KVT_EINVAL);
	a.n_heads = H;
	a.n = 0;
	T_ERR(o->attention(f.ctx, &a, s[0]), KVT_EINVAL);
	a.n = 4;
	a.max_len = 3; /* shorter than the chunk itself */
	T_ERR(o->attention(f.ctx, &a, s[0]), KVT_EINVAL);
	T_ERR(o->attention(f.ctx, NULL, s[0]), KVT_EINVAL);

	o->mem_free(f.ctx, dq);
	o->mem_free(f.ctx, dout);
	o->mem_free(f.ctx, dlse);
	o->stream_free(f.ctx, s[0]);
	o->stream_free(f.ctx, s[1]);
	fake_fini(&f);
	free(q);
	free(out);
	free(lse);
}
