/*
 * select_topk.c — keep the k best unprotected entries (CPU reference); see
 * kernels.h.  Tested in kernels/cpu/kernels_test.c.
 *
 * Introselect on the candidate indices: quickselect with a median-of-three
 * pivot, expected linear; a depth budget of 2 log2(n) catches the inputs
 * that defeat median-of-three and finishes the remaining range with
 * heapsort (n log n worst case).  No randomness, so the same input always
 * gives the same drop set, on every run and every machine.
 *
 * Order ("better first"), strict and total so that partitions never meet
 * equal keys: non-NaN before NaN; higher score; higher rank[]; higher index
 * (only reached when a caller repeats a rank).
 */
#include "kernels.h"

#include <math.h>

struct order {
	const float *score;  /* [n] */
	const uint32_t *rank; /* [n] or NULL (then the index ranks) */
};

/* 1 when entry a must be kept before entry b. */
static inline int better(const struct order *o, uint32_t a, uint32_t b)
{
	float sa = o->score[a], sb = o->score[b];
	int na = isnan(sa), nb = isnan(sb);
	if (na != nb)
		return nb;
	if (!na && sa != sb)
		return sa > sb;
	if (o->rank) {
		uint32_t ra = o->rank[a], rb = o->rank[b];
		if (ra != rb)
			return ra > rb;
	}
	return a > b;
}

static inline void swap_u32(uint32_t *v, uint32_t i, uint32_t j)
{
	uint32_t t = v[i];
	v[i] = v[j];
	v[j] = t;
}

/* Heap whose root is the worst element, so that heapsort leaves v best
 * first. */
static void sift_down(const struct order *o, uint32_t *v, uint32_t root,
                      uint32_t n)
{
	for (;;) {
		uint32_t c = 2 * root + 1;
		if (c >= n)
			return;
		if (c + 1 < n && better(o, v[c], v[c + 1]))
			c++;
		if (!better(o, v[root], v[c]))
			return;
		swap_u32(v, root, c);
		root = c;
	}
}

static void heap_sort(const struct order *o, uint32_t *v, uint32_t n)
{
	for (uint32_t i = n / 2; i-- > 0;)
		sift_down(o, v, i, n);
	for (uint32_t end = n; end > 1; end--) {
		swap_u32(v, 0, end - 1);
		sift_down(o, v, 0, end - 1);
	}
}

/* Rearranges v[0..n) so that v[0..k) holds the k best (in any order). */
static void select_best(const struct order *o, uint32_t *v, uint32_t n,
                        uint32_t k)
{
	uint32_t lo = 0, hi = n - 1, target = k - 1;
	unsigned depth = 0;
	for (uint32_t m = n; m > 1; m >>= 1)
		depth += 2;

	while (lo < hi) {
		if (depth-- == 0) {
			heap_sort(o, v + lo, hi - lo + 1);
			return;
		}
		/* Median of three to the end as pivot. */
		uint32_t mid = lo + (hi - lo) / 2;
		if (better(o, v[mid], v[lo]))
			swap_u32(v, mid, lo);
		if (better(o, v[hi], v[lo]))
			swap_u32(v, hi, lo);
		if (better(o, v[mid], v[hi]))
			swap_u32(v, mid, hi);
		/* Now v[lo] best, v[hi] the median, v[mid] worst: Lomuto. */
		uint32_t piv = v[hi], p = lo;
		for (uint32_t i = lo; i < hi; i++)
			if (better(o, v[i], piv))
				swap_u32(v, i, p++);
		swap_u32(v, p, hi);

		if (p == target)
			return;
		if (target < p)
			hi = p - 1;
		else
			lo = p + 1;
	}
}

uint32_t select_topk_cpu(const float *score, const uint32_t *rank,
                         const uint8_t *protect, uint32_t n, uint32_t k,
                         uint8_t *drop, uint32_t *scratch)
{
	uint32_t c = 0;
	for (uint32_t i = 0; i < n; i++) {
		drop[i] = 0;
		if (!protect || !protect[i])
			scratch[c++] = i;
	}
	if (k >= c)
		return 0;
	if (k > 0) {
		struct order o = {score, rank};
		select_best(&o, scratch, c, k);
	}
	for (uint32_t j = k; j < c; j++)
		drop[scratch[j]] = 1;
	return c - k;
}
