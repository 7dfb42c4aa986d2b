/*
 * kernels_fixture.h — what the CPU kernel tests (kernels/cpu/kernels*_test.c)
 * share: the dtypes, the case description printed with a mismatch, a
 * deterministic generator, check_close, the naive f16/bf16 decoders
 * (ldexp arithmetic, not bit tricks) and a paged list with each page
 * malloc'ed on its own.  Header-only (static inline): each test file has
 * its own copy, and no helper name leaves it.
 */
#ifndef KVT_KERNELS_FIXTURE_H
#define KVT_KERNELS_FIXTURE_H

#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "test.h"
static const enum kvt_dtype all_dt[] = {KVT_DTYPE_F32, KVT_DTYPE_F16,
                                        KVT_DTYPE_BF16};
static const char *const dt_name[] = {"f32", "f16", "bf16"};

/* Describes the case being checked, printed with any mismatch. */
static char ctx[256];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline void rng_seed(uint64_t s)
{
	rng_state = s * 0x9e3779b97f4a7c15ull + 1;
}

/* splitmix64: deterministic, so a failure reproduces. */
static inline uint64_t rng_u64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline float rng_f(float lo, float hi)
{
	return lo + (hi - lo) * (float)((rng_u64() >> 40) * 0x1p-24);
}

static inline float *rand_vec(size_t n, float lo, float hi)
{
	float *v = malloc((n ? n : 1) * sizeof(float));
	T_ASSERT(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rng_f(lo, hi);
	return v;
}

static inline void check_close(const char *what, size_t idx, double got,
                               double ref, double atol, double rtol)
{
	if (isnan(got) != isnan(ref) || (isinf(got) && got != ref) ||
	    (!isinf(ref) && fabs(got - ref) > atol + rtol * fabs(ref)))
		th_fail(__FILE__, __LINE__,
		        "%s [%s] index %zu: got %.9g, expected %.9g (atol %g, "
		        "rtol %g)", what, ctx, idx, got, ref, atol, rtol);
}

/* Naive decoders: value = sign * mantissa * 2^exponent with ldexp. */
static inline double naive_f16(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v;
	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return s ? -v : v;
}

static inline double naive_bf16(uint16_t h)
{
	int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
	double v;
	if (e == 255)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -133);
	else
		v = ldexp(128 + m, e - 134);
	return s ? -v : v;
}

static inline double naive_elem(const void *base, enum kvt_dtype dt, size_t i)
{
	if (dt == KVT_DTYPE_F32)
		return ((const float *)base)[i];
	uint16_t h = ((const uint16_t *)base)[i];
	return dt == KVT_DTYPE_F16 ? naive_f16(h) : naive_bf16(h);
}

/* A paged list of len entries; each page malloc'ed on its own so the
 * kernels really follow the page table. */
struct plist {
	void **pages;
	uint32_t n_pages, pt, hd;
	enum kvt_dtype dt;
};

static inline void plist_init(struct plist *l, uint32_t len, uint32_t pt,
                              uint32_t hd, enum kvt_dtype dt)
{
	l->n_pages = (len + pt - 1) / pt + 1; /* one spare, as headroom */
	l->pt = pt;
	l->hd = hd;
	l->dt = dt;
	l->pages = calloc(l->n_pages, sizeof(void *));
	T_ASSERT(l->pages);
	size_t bytes = 2 * (size_t)pt * hd * kvt_dtype_size(dt);
	for (uint32_t p = 0; p < l->n_pages; p++) {
		l->pages[p] = malloc(bytes ? bytes : 1);
		T_ASSERT(l->pages[p]);
		memset(l->pages[p], 0xa5, bytes);
	}
}

/* Fills entries [0, len) with random K and V in [-1, 1). */
static inline void plist_fill(struct plist *l, uint32_t len)
{
	size_t esz = kvt_dtype_size(l->dt);
	float *row = rand_vec(l->hd, -1, 1);
	for (uint32_t e = 0; e < len; e++) {
		char *page = l->pages[e / l->pt];
		size_t off = (size_t)(e % l->pt) * l->hd * esz;
		for (int kv = 0; kv < 2; kv++) {
			for (uint32_t d = 0; d < l->hd; d++)
				row[d] = rng_f(-1, 1);
			dtype_from_f32(row,
			               l->dt, page + off +
			                          kv * (size_t)l->pt * l->hd * esz,
			               l->hd);
		}
	}
	free(row);
}

/* Element d of entry e's K (kv = 0) or V (kv = 1), naively decoded. */
static inline double plist_at(const struct plist *l, uint32_t e, int kv,
                              uint32_t d)
{
	const char *page = l->pages[e / l->pt];
	size_t idx = (size_t)kv * l->pt * l->hd + (size_t)(e % l->pt) * l->hd +
	             d;
	return naive_elem(page, l->dt, idx);
}

static inline void plist_free(struct plist *l)
{
	for (uint32_t p = 0; p < l->n_pages; p++)
		free(l->pages[p]);
	free(l->pages);
}

#endif
