/*
 * test_kernels.c — every CPU kernel of kernels.h against a naive oracle
 * written here: plain loops in double precision, no BLAS, and page bytes
 * decoded by this file's own f16/bf16 decoders (ldexp arithmetic, not bit
 * tricks), so a bug shared by kernel and oracle is unlikely.
 *
 * Tolerances are atol + rtol * |ref| per element, stated beside each op;
 * NaN/Inf in a result fails before the tolerance is looked at.
 * Run: build/bin/kvtrim-tests kernels
 */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "test.h"

/* ---------------------------------------------------------------- helpers */

static const enum kvt_dtype all_dt[] = {KVT_DTYPE_F32, KVT_DTYPE_F16,
                                        KVT_DTYPE_BF16};
static const char *const dt_name[] = {"f32", "f16", "bf16"};

/* Describes the case being checked, printed with any mismatch. */
static char ctx[256];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static void rng_seed(uint64_t s)
{
	rng_state = s * 0x9e3779b97f4a7c15ull + 1;
}

/* splitmix64: deterministic, so a failure reproduces. */
static uint64_t rng_u64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static float rng_f(float lo, float hi)
{
	return lo + (hi - lo) * (float)((rng_u64() >> 40) * 0x1p-24);
}

static float *rand_vec(size_t n, float lo, float hi)
{
	float *v = malloc((n ? n : 1) * sizeof(float));
	T_ASSERT(v);
	for (size_t i = 0; i < n; i++)
		v[i] = rng_f(lo, hi);
	return v;
}

static void check_close(const char *what, size_t idx, double got, double ref,
                        double atol, double rtol)
{
	if (isnan(got) != isnan(ref) || (isinf(got) && got != ref) ||
	    (!isinf(ref) && fabs(got - ref) > atol + rtol * fabs(ref)))
		th_fail(__FILE__, __LINE__,
		        "%s [%s] index %zu: got %.9g, expected %.9g (atol %g, "
		        "rtol %g)", what, ctx, idx, got, ref, atol, rtol);
}

/* Naive decoders: value = sign * mantissa * 2^exponent with ldexp. */
static double naive_f16(uint16_t h)
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

static double naive_bf16(uint16_t h)
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

static double naive_elem(const void *base, enum kvt_dtype dt, size_t i)
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

static void plist_init(struct plist *l, uint32_t len, uint32_t pt,
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
static void plist_fill(struct plist *l, uint32_t len)
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
static double plist_at(const struct plist *l, uint32_t e, int kv, uint32_t d)
{
	const char *page = l->pages[e / l->pt];
	size_t idx = (size_t)kv * l->pt * l->hd + (size_t)(e % l->pt) * l->hd +
	             d;
	return naive_elem(page, l->dt, idx);
}

static void plist_free(struct plist *l)
{
	for (uint32_t p = 0; p < l->n_pages; p++)
		free(l->pages[p]);
	free(l->pages);
}

/* ---------------------------------------------------------------- dtype */

TEST(kernels, dtype_decode_exhaustive)
{
	for (uint32_t h = 0; h < 65536; h++) {
		uint16_t v = (uint16_t)h;
		float f;
		dtype_to_f32(&v, KVT_DTYPE_F16, &f, 1);
		double ref = naive_f16(v);
		T_ASSERT(isnan(ref) ? isnan(f) : (double)f == ref);
		T_ASSERT(!!signbit(f) == !!signbit(ref) || isnan(ref));
		dtype_to_f32(&v, KVT_DTYPE_BF16, &f, 1);
		ref = naive_bf16(v);
		T_ASSERT(isnan(ref) ? isnan(f) : (double)f == ref);
		T_ASSERT(!!signbit(f) == !!signbit(ref) || isnan(ref));
	}
}

TEST(kernels, dtype_round_trip_exhaustive)
{
	/* Every f16/bf16 value survives to_f32 then from_f32; NaN stays
	 * NaN (payload may be quietened). */
	for (int which = 1; which <= 2; which++) {
		enum kvt_dtype dt = all_dt[which];
		for (uint32_t h = 0; h < 65536; h++) {
			uint16_t v = (uint16_t)h, back;
			float f;
			dtype_to_f32(&v, dt, &f, 1);
			dtype_from_f32(&f, dt, &back, 1);
			if (isnan(f)) {
				double r = dt == KVT_DTYPE_F16 ? naive_f16(back)
				                               : naive_bf16(back);
				T_ASSERT(isnan(r));
			} else {
				T_EQ(back, v);
			}
		}
	}
}

/* Checks that h is the round-to-nearest-even encoding of x: no
 * neighbouring code is closer, and a tie picks the even code.  Past the
 * largest finite value the next code (inf) stands for the next power of
 * two, which is how IEEE rounding decides overflow. */
static void check_rne(float x, uint16_t h, enum kvt_dtype dt)
{
	uint16_t inf = dt == KVT_DTYPE_F16 ? 0x7c00 : 0x7f80;
	double top = dt == KVT_DTYPE_F16 ? 65536.0 : ldexp(1, 128);
	double ax = fabs((double)x);
	uint16_t mag = h & 0x7fff;
	if (isnan(x)) {
		T_ASSERT(mag > inf);
		return;
	}
	if ((h >> 15) != (signbit(x) ? 1 : 0))
		th_fail(__FILE__, __LINE__, "sign of %a lost: 0x%04x", x, h);
	if (isinf(x)) {
		T_EQ(mag, inf);
		return;
	}
	T_ASSERT(mag <= inf);
#define VAL(m)                                                                 \
	((m) == inf ? top                                                      \
	            : (dt == KVT_DTYPE_F16 ? naive_f16(m) : naive_bf16(m)))
	double here = fabs(ax - VAL(mag));
	for (int side = -1; side <= 1; side += 2) {
		int nb = (int)mag + side;
		if (nb < 0 || nb > inf)
			continue;
		double there = fabs(ax - VAL((uint16_t)nb));
		if (there < here || (there == here && (mag & 1)))
			th_fail(__FILE__, __LINE__,
			        "%s(%a) gave 0x%04x, but 0x%04x is %s",
			        dt_name[dt], x, h, nb,
			        there < here ? "closer" : "an even tie");
	}
#undef VAL
}

TEST(kernels, dtype_encode_rne)
{
	rng_seed(1);
	/* Hand-picked edges, then random bit patterns and random values in
	 * the f16 range (where subnormals and overflow live). */
	const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f,
	                      65520.0f, 65536.0f, 0x1p-24f, 0x1p-25f,
	                      0x1.8p-25f, 0x1.000002p-25f, 0x1p-14f,
	                      0x1.ffcp-15f, 0x1.ffep-15f, 1.0f + 0x1p-8f,
	                      1.0f + 0x3p-8f, 1.0f + 0x1p-11f,
	                      1.0f + 0x3p-11f, 3.4028235e38f, 1e-40f,
	                      INFINITY, -INFINITY, NAN, -NAN};
	uint16_t h[2];
	for (size_t i = 0; i < sizeof(edge) / sizeof(edge[0]); i++) {
		dtype_from_f32(&edge[i], KVT_DTYPE_F16, &h[0], 1);
		dtype_from_f32(&edge[i], KVT_DTYPE_BF16, &h[1], 1);
		check_rne(edge[i], h[0], KVT_DTYPE_F16);
		check_rne(edge[i], h[1], KVT_DTYPE_BF16);
	}
	/* Known codes. */
	const struct {
		float x;
		uint16_t f16, bf16;
	} known[] = {
		{1.0f, 0x3c00, 0x3f80},         {-2.0f, 0xc000, 0xc000},
		{65504.0f, 0x7bff, 0x4780},     {65520.0f, 0x7c00, 0x4780},
		{0x1p-24f, 0x0001, 0x3380},     {0x1p-25f, 0x0000, 0x3300},
		{-0.0f, 0x8000, 0x8000},        {1.0f + 0x1p-8f, 0x3c04, 0x3f80},
		{1.0f + 0x3p-8f, 0x3c0c, 0x3f82}, {INFINITY, 0x7c00, 0x7f80},
		{3.4028235e38f, 0x7c00, 0x7f80},
	};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		dtype_from_f32(&known[i].x, KVT_DTYPE_F16, &h[0], 1);
		dtype_from_f32(&known[i].x, KVT_DTYPE_BF16, &h[1], 1);
		T_EQ(h[0], known[i].f16);
		T_EQ(h[1], known[i].bf16);
	}
	float nan = NAN;
	dtype_from_f32(&nan, KVT_DTYPE_F16, &h[0], 1);
	dtype_from_f32(&nan, KVT_DTYPE_BF16, &h[1], 1);
	T_ASSERT(isnan(naive_f16(h[0])) && isnan(naive_bf16(h[1])));

	enum { N = 4096 };
	float x[N];
	uint16_t a[N], b[N];
	for (int round = 0; round < 200; round++) {
		for (int i = 0; i < N; i++) {
			if (i & 1) {
				uint32_t bits = (uint32_t)rng_u64();
				memcpy(&x[i], &bits, 4);
			} else {
				x[i] = ldexpf(rng_f(1, 2), (int)(rng_u64() % 48) -
				                               30);
				if (rng_u64() & 1)
					x[i] = -x[i];
			}
		}
		dtype_from_f32(x, KVT_DTYPE_F16, a, N);
		dtype_from_f32(x, KVT_DTYPE_BF16, b, N);
		for (int i = 0; i < N; i++) {
			check_rne(x[i], a[i], KVT_DTYPE_F16);
			check_rne(x[i], b[i], KVT_DTYPE_BF16);
		}
	}
}

TEST(kernels, dtype_f32_is_copy)
{
	float s[5] = {1.5f, -0.0f, INFINITY, 1e-45f, 3.0f}, d[5];
	dtype_to_f32(s, KVT_DTYPE_F32, d, 5);
	T_ASSERT(!memcmp(s, d, sizeof(s)));
	memset(d, 0, sizeof(d));
	dtype_from_f32(s, KVT_DTYPE_F32, d, 5);
	T_ASSERT(!memcmp(s, d, sizeof(s)));
	dtype_to_f32(s, KVT_DTYPE_F16, d, 0); /* n 0 touches nothing */
}

/* ---------------------------------------------------------------- append_kv */

/* One append of n entries at first; checks values and untouched rows. */
static void append_case(enum kvt_dtype dt, uint32_t hd, uint32_t pt,
                        uint32_t first, uint32_t n)
{
	snprintf(ctx, sizeof(ctx), "%s hd %u pt %u first %u n %u",
	         dt_name[dt], hd, pt, first, n);
	struct plist l;
	plist_init(&l, first + n, pt, hd, dt);
	float *k = rand_vec((size_t)n * hd, -4, 4);
	float *v = rand_vec((size_t)n * hd, -4, 4);
	append_kv_cpu(l.pages, pt, hd, dt, first, k, v, n);

	/* Each value is the dtype_from_f32 code of the input (exact match,
	 * decoded naively) and within half an ulp of it: relative 2^-11 for
	 * f16 (atol 2^-25 for its subnormals), 2^-8 for bf16, 0 for f32. */
	double rtol = dt == KVT_DTYPE_F16 ? 0x1p-11 : dt == KVT_DTYPE_BF16 ? 0x1p-8 : 0;
	double atol = dt == KVT_DTYPE_F16 ? 0x1p-25 : 0;
	for (uint32_t i = 0; i < n; i++)
		for (int kv = 0; kv < 2; kv++)
			for (uint32_t d = 0; d < hd; d++) {
				float x = (kv ? v : k)[(size_t)i * hd + d];
				double got = plist_at(&l, first + i, kv, d);
				uint16_t enc;
				double want = x;
				if (dt != KVT_DTYPE_F32) {
					dtype_from_f32(&x, dt, &enc, 1);
					want = dt == KVT_DTYPE_F16 ? naive_f16(enc)
					                           : naive_bf16(enc);
				}
				check_close("append_kv code", i, got, want, 0, 0);
				check_close("append_kv rounding", i, got, x, atol,
				            rtol);
			}

	/* Rows outside [first, first + n) keep their sentinel bytes. */
	size_t rb = hd * kvt_dtype_size(dt);
	for (uint32_t e = 0; e < l.n_pages * pt; e++) {
		if (e >= first && e < first + n)
			continue;
		const unsigned char *pg = l.pages[e / pt];
		for (int kv = 0; kv < 2; kv++) {
			const unsigned char *r = pg + ((size_t)kv * pt + e % pt) * rb;
			for (size_t b = 0; b < rb; b++)
				T_EQ(r[b], 0xa5);
		}
	}
	free(k);
	free(v);
	plist_free(&l);
}

TEST(kernels, append_kv_shapes)
{
	const uint32_t hds[] = {8, 64, 128, 256}, pts[] = {1, 4, 16};
	rng_seed(2);
	for (int di = 0; di < 3; di++)
		for (size_t hi = 0; hi < 4; hi++)
			for (size_t pi = 0; pi < 3; pi++) {
				append_case(all_dt[di], hds[hi], pts[pi], 0, 37);
				append_case(all_dt[di], hds[hi], pts[pi], 3, 0);
				append_case(all_dt[di], hds[hi], pts[pi], 16, 5);
				append_case(all_dt[di], hds[hi], pts[pi], 7, 1);
			}
}

/* ---------------------------------------------------------------- attention */

/* out/lse of one query head over entries [0, len), all in double. */
static void naive_attention(const float *q, const struct plist *l,
                            uint32_t len, double scale, double *out,
                            double *lse)
{
	double *s = malloc((len ? len : 1) * sizeof(double));
	T_ASSERT(s);
	double mx = -INFINITY;
	for (uint32_t i = 0; i < len; i++) {
		double acc = 0;
		for (uint32_t d = 0; d < l->hd; d++)
			acc += (double)q[d] * plist_at(l, i, 0, d);
		s[i] = acc * scale;
		if (s[i] > mx)
			mx = s[i];
	}
	double sum = 0;
	for (uint32_t i = 0; i < len; i++)
		sum += exp(s[i] - mx);
	for (uint32_t d = 0; d < l->hd; d++) {
		double acc = 0;
		for (uint32_t i = 0; i < len; i++)
			acc += exp(s[i] - mx) / sum * plist_at(l, i, 1, d);
		out[d] = len ? acc : 0;
	}
	*lse = len ? mx + log(sum) : -INFINITY;
	free(s);
}

/* q in [-2, 2), K/V in [-1, 1): outputs are convex combinations of V.
 * Float accumulation over head_dim <= 256 stays far inside
 * out: atol 2e-5 + rtol 1e-4; lse: atol 2e-5 + rtol 1e-5. */
static void attention_case(enum kvt_dtype dt, uint32_t hd, uint32_t pt,
                           uint32_t len, uint32_t G)
{
	snprintf(ctx, sizeof(ctx), "%s hd %u pt %u len %u G %u", dt_name[dt],
	         hd, pt, len, G);
	struct plist l;
	plist_init(&l, len, pt, hd, dt);
	plist_fill(&l, len);
	float *q = rand_vec((size_t)G * hd, -2, 2);
	float *out = rand_vec((size_t)G * hd, 5, 6); /* must be overwritten */
	float *lse = rand_vec(G, 5, 6);
	float *scratch = malloc(((size_t)G * len + 1) * sizeof(float));
	double *ref = malloc(hd * sizeof(double)), rlse;
	float scale = 1.0f / sqrtf((float)hd);

	paged_attention_cpu(q, G, l.pages, pt, hd, dt, len, scale, out, lse,
	                    scratch);
	for (uint32_t g = 0; g < G; g++) {
		naive_attention(q + (size_t)g * hd, &l, len, scale, ref, &rlse);
		for (uint32_t d = 0; d < hd; d++)
			check_close("paged_attention out", (size_t)g * hd + d,
			            out[(size_t)g * hd + d], ref[d], 2e-5, 1e-4);
		check_close("paged_attention lse", g, lse[g], rlse, 2e-5, 1e-5);
	}
	free(q);
	free(out);
	free(lse);
	free(scratch);
	free(ref);
	plist_free(&l);
}

TEST_T(kernels, paged_attention_shapes, 120)
{
	const uint32_t hds[] = {8, 64, 128, 256}, pts[] = {1, 4, 16};
	const uint32_t lens[] = {0, 1, 5, 37, 100}, Gs[] = {1, 4};
	rng_seed(3);
	for (int di = 0; di < 3; di++)
		for (size_t hi = 0; hi < 4; hi++)
			for (size_t pi = 0; pi < 3; pi++)
				for (size_t li = 0; li < 5; li++)
					for (size_t gi = 0; gi < 2; gi++)
						attention_case(all_dt[di], hds[hi], pts[pi],
						               lens[li], Gs[gi]);
}

TEST(kernels, paged_attention_large_logits)
{
	/* Logits around +-1000 overflow a naive expf; the max-subtraction
	 * keeps out finite and lse = max + log(sum). */
	const uint32_t hd = 8, len = 6, pt = 4;
	struct plist l;
	plist_init(&l, len, pt, hd, KVT_DTYPE_F32);
	rng_seed(4);
	plist_fill(&l, len);
	float q[8], out[8], lse, scratch[6];
	double ref[8], rlse;
	for (int d = 0; d < 8; d++)
		q[d] = 400.0f * (d & 1 ? -1 : 1);
	snprintf(ctx, sizeof(ctx), "large logits");
	paged_attention_cpu(q, 1, l.pages, pt, hd, KVT_DTYPE_F32, len, 1.0f,
	                    out, &lse, scratch);
	naive_attention(q, &l, len, 1.0, ref, &rlse);
	for (uint32_t d = 0; d < hd; d++)
		check_close("out", d, out[d], ref[d], 1e-5, 1e-4);
	check_close("lse", 0, lse, rlse, 1e-3, 1e-6);
	plist_free(&l);
}

TEST(kernels, paged_attention_empty)
{
	float q[16] = {1}, out[16], lse[2] = {0, 0};
	void *pages[1] = {NULL};
	memset(out, 0x7f, sizeof(out));
	paged_attention_cpu(q, 2, pages, 4, 8, KVT_DTYPE_F16, 0, 1.0f, out,
	                    lse, NULL);
	for (int i = 0; i < 16; i++)
		T_ASSERT(out[i] == 0.0f);
	T_ASSERT(isinf(lse[0]) && lse[0] < 0 && isinf(lse[1]) && lse[1] < 0);
}

/* q . k_i * scale of one query row, in double. */
static double naive_logit(const float *q, const struct plist *l, uint32_t i,
                          double scale)
{
	double acc = 0;
	for (uint32_t d = 0; d < l->hd; d++)
		acc += (double)q[d] * plist_at(l, i, 0, d);
	return acc * scale;
}

/* lse is the causal log-sum-exp of each query over these keys (what an
 * engine stores), so each row of w with a visible key also sums to 1.
 * w: atol 1e-6 + rtol 1e-4 (weights in [0, 1], exp of float logits from
 * one sgemm); row sums: atol 1e-4. */
static void band_case(enum kvt_dtype dt, uint32_t hd, uint32_t pt,
                      uint32_t len, uint32_t n_q, uint32_t G)
{
	snprintf(ctx, sizeof(ctx), "%s hd %u pt %u len %u n_q %u G %u",
	         dt_name[dt], hd, pt, len, n_q, G);
	struct plist l;
	plist_init(&l, len, pt, hd, dt);
	plist_fill(&l, len);
	/* Keys at positions 3i + 1 (gaps, as after eviction); queries
	 * anywhere from before the first key to after the last. */
	uint32_t *kpos = malloc((len + 1) * sizeof(uint32_t));
	uint32_t *qpos = malloc(n_q * sizeof(uint32_t));
	for (uint32_t i = 0; i < len; i++)
		kpos[i] = 3 * i + 1;
	for (uint32_t t = 0; t < n_q; t++)
		qpos[t] = (uint32_t)(rng_u64() % (3 * len + 3));
	if (n_q > 1)
		qpos[0] = 0; /* sees no key at all */
	float *q = rand_vec((size_t)n_q * G * hd, -2, 2);
	float *lse = malloc((size_t)n_q * G * sizeof(float));
	float scale = 1.0f / sqrtf((float)hd);
	for (uint32_t r = 0; r < n_q * G; r++) {
		uint32_t t = r / G;
		double mx = -INFINITY, sum = 0;
		for (uint32_t i = 0; i < len; i++)
			if (kpos[i] <= qpos[t])
				mx = fmax(mx, naive_logit(q + (size_t)r * hd, &l, i, scale));
		for (uint32_t i = 0; i < len; i++)
			if (kpos[i] <= qpos[t])
				sum += exp(naive_logit(q + (size_t)r * hd, &l, i, scale) - mx);
		/* No visible key: any finite lse, the row must be all 0. */
		lse[r] = sum > 0 ? (float)(mx + log(sum)) : 0.0f;
	}
	size_t nw = (size_t)n_q * G * len;
	float *w = rand_vec(nw, 7, 8);
	float *ks = malloc(((size_t)len * hd + 1) * sizeof(float));

	attn_band_cpu(q, lse, qpos, n_q, G, l.pages, pt, hd, dt, kpos, len,
	              (float)scale, w, ks);
	for (uint32_t r = 0; r < n_q * G; r++) {
		uint32_t t = r / G;
		double rowsum = 0;
		int visible = 0;
		for (uint32_t i = 0; i < len; i++) {
			size_t at = (size_t)r * len + i;
			double ref = 0;
			if (kpos[i] <= qpos[t]) {
				ref = exp(naive_logit(q + (size_t)r * hd, &l, i,
				                      (float)scale) - lse[r]);
				visible = 1;
			} else if (w[at] != 0.0f) { /* causal: exactly 0 */
				th_fail(__FILE__, __LINE__, "[%s] w[%zu] = %g "
				        "for a future key", ctx, at, w[at]);
			}
			check_close("attn_band w", at, w[at], ref, 1e-6, 1e-4);
			rowsum += w[at];
		}
		check_close("attn_band row sum", r, rowsum, visible ? 1.0 : 0.0,
		            1e-4, 0);
	}
	free(kpos);
	free(qpos);
	free(q);
	free(lse);
	free(w);
	free(ks);
	plist_free(&l);
}

TEST_T(kernels, attn_band_shapes, 120)
{
	const uint32_t hds[] = {8, 64, 128, 256}, pts[] = {1, 4, 16};
	const uint32_t lens[] = {0, 1, 5, 37, 100}, nqs[] = {1, 3, 7};
	rng_seed(5);
	for (int di = 0; di < 3; di++)
		for (size_t hi = 0; hi < 4; hi++)
			for (size_t pi = 0; pi < 3; pi++)
				for (size_t li = 0; li < 5; li++)
					for (size_t qi = 0; qi < 3; qi++)
						band_case(all_dt[di], hds[hi], pts[pi],
						          lens[li], nqs[qi], 1 + (uint32_t)qi % 2);
}

TEST(kernels, attn_band_causal_hand)
{
	/* Two keys at positions 0 and 5, hd 1, k = (1, 2); q = 1 at position
	 * 3 and 7, scale 1, lse given: w[0] = (e^(1-l0), 0) (key 5 is in the
	 * future of query 3), w[1] = (e^(1-l1), e^(2-l1)). */
	float page[2][2][1] = {{{1}, {2}}, {{0}, {0}}}; /* pt 2: [K][V] */
	void *pages[1] = {page};
	const uint32_t kpos[2] = {0, 5}, qpos[2] = {3, 7};
	const float q[2] = {1, 1}, lse[2] = {1.0f, 2.5f};
	float w[4], ks[2];
	attn_band_cpu(q, lse, qpos, 2, 1, pages, 2, 1, KVT_DTYPE_F32, kpos, 2,
	              1.0f, w, ks);
	snprintf(ctx, sizeof(ctx), "causal hand");
	check_close("w", 0, w[0], 1.0, 1e-6, 1e-6);
	T_ASSERT(w[1] == 0.0f);
	check_close("w", 2, w[2], exp(-1.5), 1e-6, 1e-6);
	check_close("w", 3, w[3], exp(-0.5), 1e-6, 1e-6);
}

/* ---------------------------------------------------------------- scorers */

static void naive_linear(const float *x, uint32_t n, uint32_t d_in,
                         const float *W, const float *b, uint32_t d_out,
                         double *y)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t o = 0; o < d_out; o++) {
			double acc = b ? b[o] : 0;
			for (uint32_t k = 0; k < d_in; k++)
				acc += (double)x[(size_t)i * d_in + k] *
				       W[(size_t)o * d_in + k];
			y[(size_t)i * d_out + o] = acc;
		}
}

TEST(kernels, scorer_linear_shapes)
{
	/* Inputs in [-1, 1): |y| <= d_in + 1; float sgemm error grows with
	 * d_in: atol 1e-5 * (1 + d_in) + rtol 1e-5. */
	const uint32_t ns[] = {0, 1, 37}, dins[] = {1, 8, 64, 130},
	               douts[] = {1, 4, 8};
	rng_seed(6);
	for (size_t a = 0; a < 3; a++)
		for (size_t b = 0; b < 4; b++)
			for (size_t c = 0; c < 3; c++)
				for (int withb = 0; withb < 2; withb++) {
					uint32_t n = ns[a], din = dins[b], dout = douts[c];
					snprintf(ctx, sizeof(ctx), "n %u d_in %u d_out %u bias %d", n, din, dout, withb);
					float *x = rand_vec((size_t)n * din, -1, 1);
					float *W = rand_vec((size_t)dout * din, -1, 1);
					float *bb = withb ? rand_vec(dout, -1, 1) : NULL;
					float *y = rand_vec((size_t)n * dout, 9, 10);
					double *ref = malloc(((size_t)n * dout + 1) * sizeof(double));
					scorer_linear_cpu(x, n, din, W, bb, dout, y);
					naive_linear(x, n, din, W, bb, dout, ref);
					for (size_t i = 0; i < (size_t)n * dout; i++)
						check_close("scorer_linear", i, y[i], ref[i], 1e-5 * (1 + din), 1e-5);
					free(x);
					free(W);
					free(bb);
					free(y);
					free(ref);
				}
}

TEST(kernels, scorer_mlp_shapes)
{
	/* Exact erf GELU in double as the oracle; same tolerance rule as
	 * linear on the sum of both layers: atol 1e-5 * (1 + d_in + hidden)
	 * + rtol 1e-5. */
	const uint32_t ns[] = {0, 1, 37}, dins[] = {1, 8, 64},
	               hids[] = {1, 8, 32}, douts[] = {1, 4};
	rng_seed(7);
	for (size_t a = 0; a < 3; a++)
		for (size_t b = 0; b < 3; b++)
			for (size_t h = 0; h < 3; h++)
				for (size_t c = 0; c < 2; c++) {
					uint32_t n = ns[a], din = dins[b], hid = hids[h], dout = douts[c];
					snprintf(ctx, sizeof(ctx), "n %u d_in %u hidden %u d_out %u", n, din, hid, dout);
					float *x = rand_vec((size_t)n * din, -2, 2);
					float *W1 = rand_vec((size_t)hid * din, -1, 1);
					float *b1 = rand_vec(hid, -1, 1);
					float *W2 = rand_vec((size_t)dout * hid, -1, 1);
					float *b2 = rand_vec(dout, -1, 1);
					float *y = rand_vec((size_t)n * dout, 9, 10);
					float *hs = malloc(((size_t)n * hid + 1) * sizeof(float));
					double *h1 = malloc(((size_t)n * hid + 1) * sizeof(double));
					scorer_mlp_cpu(x, n, din, W1, b1, hid, W2, b2, dout, y, hs);
					naive_linear(x, n, din, W1, b1, hid, h1);
					for (uint32_t i = 0; i < n; i++)
						for (uint32_t o = 0; o < dout; o++) {
							double acc = b2[o];
							for (uint32_t k = 0; k < hid; k++) {
								double z = h1[(size_t)i * hid + k];
								acc += 0.5 * z * (1 + erf(z / sqrt(2.0))) * W2[(size_t)o * hid + k];
							}
							check_close("scorer_mlp", (size_t)i * dout + o, y[(size_t)i * dout + o], acc,
							            1e-5 * (1 + din + hid), 1e-5);
						}
					free(x);
					free(W1);
					free(b1);
					free(W2);
					free(b2);
					free(y);
					free(hs);
					free(h1);
				}
}

TEST(kernels, scorer_mlp_gelu_is_erf)
{
	/* One unit, identity weights: y = gelu(z) exactly as nn.GELU():
	 * gelu(1) = 0.8413447460685429, gelu(-1) = -0.15865525393145707,
	 * gelu(0) = 0; the tanh form would give 0.841192 for gelu(1). */
	const float W = 1.0f, zs[3] = {1.0f, -1.0f, 0.0f};
	const double want[3] = {0.8413447460685429, -0.15865525393145707, 0};
	float y[3], h[3];
	scorer_mlp_cpu(zs, 3, 1, &W, NULL, 1, &W, NULL, 1, y, h);
	snprintf(ctx, sizeof(ctx), "gelu");
	for (int i = 0; i < 3; i++)
		check_close("gelu", (size_t)i, y[i], want[i], 1e-7, 1e-6);
}

/* ---------------------------------------------------------------- sink_gate */

static void naive_rms(double *v, const float *g, uint32_t dp)
{
	double ss = 0;
	for (uint32_t d = 0; d < dp; d++)
		ss += v[d] * v[d];
	double inv = 1.0 / sqrt(ss / dp + 1e-6);
	for (uint32_t d = 0; d < dp; d++)
		v[d] = v[d] * inv * g[d];
}

static void naive_sink_gate(const float *x, uint32_t n, uint32_t d_in,
                            uint32_t n_kv, uint32_t G, uint32_t dp,
                            uint32_t S, const float *Wq, const float *cq,
                            const float *Wk, const float *gq,
                            const float *gk, const float *sinks,
                            const float *bias, double *score)
{
	double qt[64], kt[64];
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t g = 0; g < n_kv; g++) {
			for (uint32_t d = 0; d < dp; d++) {
				double acc = 0;
				for (uint32_t c = 0; c < d_in; c++)
					acc += (double)Wk[((size_t)g * dp + d) * d_in + c] * x[(size_t)i * d_in + c];
				kt[d] = acc;
			}
			naive_rms(kt, gk, dp);
			double psum = 0;
			for (uint32_t j = 0; j < G; j++) {
				size_t row = ((size_t)g * G + j) * dp;
				for (uint32_t d = 0; d < dp; d++) {
					double acc = cq[row + d];
					for (uint32_t c = 0; c < d_in; c++)
						acc += (double)Wq[(row + d) * d_in + c] * x[(size_t)i * d_in + c];
					qt[d] = acc;
				}
				naive_rms(qt, gq, dp);
				double l = bias[(size_t)g * G + j], den = 1;
				for (uint32_t d = 0; d < dp; d++)
					l += qt[d] * kt[d] / sqrt(dp);
				for (uint32_t s = 0; s < S; s++) {
					double ls = 0;
					for (uint32_t d = 0; d < dp; d++)
						ls += qt[d] * sinks[((size_t)g * S + s) * dp + d] / sqrt(dp);
					den += exp(ls - l);
				}
				psum += 1 / den;
			}
			score[(size_t)i * n_kv + g] = psum / G;
		}
}

TEST(kernels, sink_gate_hand)
{
	/* dp 2, S 1, G 1, n_kv 1, d_in 2, Wq = Wk = I, cq 0, gains 1.
	 * x = (1, -1): mean square 1, so qt = kt = (1, -1) (eps 1e-6 moves
	 * them by 5e-7); l = qt.kt / sqrt 2 + b = sqrt 2 + b.
	 * Case A: sink (1, 1), b 0: ls = 0, p = 1 / (1 + e^-sqrt2)
	 *         = 1 / 1.2431167 = 0.8044297.
	 * Case B: sink (0, 0), b -sqrt 2: l = 0, ls = 0, p = 0.5. */
	const float x[2] = {1, -1}, I[4] = {1, 0, 0, 1}, zero[2] = {0, 0};
	const float one[2] = {1, 1};
	float score, scratch[4];
	double ref;
	float b = 0;
	snprintf(ctx, sizeof(ctx), "hand case A");
	sink_gate_cpu(x, 1, 2, 1, 1, 2, 1, I, zero, I, one, one, one, &b,
	              &score, scratch);
	check_close("sink_gate", 0, score, 0.8044297, 2e-6, 0);
	naive_sink_gate(x, 1, 2, 1, 1, 2, 1, I, zero, I, one, one, one, &b,
	                &ref);
	check_close("sink_gate naive", 0, ref, 0.8044297, 2e-6, 0);
	b = -sqrtf(2.0f);
	snprintf(ctx, sizeof(ctx), "hand case B");
	sink_gate_cpu(x, 1, 2, 1, 1, 2, 1, I, zero, I, one, one, zero, &b,
	              &score, scratch);
	check_close("sink_gate", 0, score, 0.5, 2e-6, 0);
}

TEST(kernels, sink_gate_shapes)
{
	/* Scores in (0, 1); float projections + 16-long dots: atol 1e-5 +
	 * rtol 1e-4. */
	const uint32_t ns[] = {1, 37}, nkvs[] = {1, 2}, Gs[] = {1, 4},
	               dps[] = {2, 16}, Ss[] = {1, 16}, dins[] = {8, 64};
	rng_seed(8);
	for (int m = 0; m < 64; m++) {
		uint32_t n = ns[m & 1], n_kv = nkvs[(m >> 1) & 1],
		         G = Gs[(m >> 2) & 1], dp = dps[(m >> 3) & 1],
		         S = Ss[(m >> 4) & 1], din = dins[(m >> 5) & 1];
		snprintf(ctx, sizeof(ctx), "n %u n_kv %u G %u dp %u S %u d_in %u",
		         n, n_kv, G, dp, S, din);
		float *x = rand_vec((size_t)n * din, -1, 1);
		float *Wq = rand_vec((size_t)n_kv * G * dp * din, -0.5f, 0.5f);
		float *cq = rand_vec((size_t)n_kv * G * dp, -0.5f, 0.5f);
		float *Wk = rand_vec((size_t)n_kv * dp * din, -0.5f, 0.5f);
		float *gq = rand_vec(dp, 0.5f, 1.5f);
		float *gk = rand_vec(dp, 0.5f, 1.5f);
		float *sk = rand_vec((size_t)n_kv * S * dp, -1, 1);
		float *bias = rand_vec((size_t)n_kv * G, -2, 2);
		float *score = rand_vec((size_t)n * n_kv, 3, 4);
		float *scratch =
			malloc((size_t)n * n_kv * (G + 1) * dp * sizeof(float));
		double *ref = malloc((size_t)n * n_kv * sizeof(double));
		sink_gate_cpu(x, n, din, n_kv, G, dp, S, Wq, cq, Wk, gq, gk, sk,
		              bias, score, scratch);
		naive_sink_gate(x, n, din, n_kv, G, dp, S, Wq, cq, Wk, gq, gk,
		                sk, bias, ref);
		for (size_t i = 0; i < (size_t)n * n_kv; i++) {
			T_ASSERT(score[i] > 0 && score[i] < 1);
			check_close("sink_gate", i, score[i], ref[i], 1e-5, 1e-4);
		}
		free(x);
		free(Wq);
		free(cq);
		free(Wk);
		free(gq);
		free(gk);
		free(sk);
		free(bias);
		free(score);
		free(scratch);
		free(ref);
	}
}

/* ---------------------------------------------------------------- select_topk */

/* Runs select_topk and checks drop[] against the expected 0/1 list. */
static void expect_topk(const float *score, const uint32_t *rank,
                        const uint8_t *protect, uint32_t n, uint32_t k,
                        const uint8_t *want)
{
	uint8_t drop[64];
	uint32_t scratch[64];
	memset(drop, 7, sizeof(drop));
	uint32_t marked = select_topk_cpu(score, rank, protect, n, k, drop,
	                                  scratch);
	uint32_t want_n = 0;
	for (uint32_t i = 0; i < n; i++) {
		want_n += want[i];
		if (drop[i] != want[i])
			th_fail(__FILE__, __LINE__,
			        "k %u: drop[%u] = %u, expected %u", k, i,
			        drop[i], want[i]);
	}
	T_EQ(marked, want_n);
}

static const uint32_t idx_rank[64] = {
	0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
	16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
	32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
	48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};

TEST(kernels, select_topk_hand)
{
	const float s[5] = {0.5f, 0.1f, 0.9f, 0.3f, 0.7f};
	expect_topk(s, idx_rank, NULL, 5, 2, (const uint8_t[]){1, 1, 0, 1, 0});
	expect_topk(s, idx_rank, NULL, 5, 1, (const uint8_t[]){1, 1, 0, 1, 1});
	expect_topk(s, idx_rank, NULL, 5, 4, (const uint8_t[]){0, 1, 0, 0, 0});
	/* k >= n: nothing to drop; k = 0: every candidate goes. */
	expect_topk(s, idx_rank, NULL, 5, 5, (const uint8_t[]){0, 0, 0, 0, 0});
	expect_topk(s, idx_rank, NULL, 5, 99, (const uint8_t[]){0, 0, 0, 0, 0});
	expect_topk(s, idx_rank, NULL, 5, 0, (const uint8_t[]){1, 1, 1, 1, 1});
	/* n = 0 writes nothing and marks nothing. */
	expect_topk(s, idx_rank, NULL, 0, 0, (const uint8_t[]){0});
	/* Negative scores and -inf are ordinary values. */
	const float neg[4] = {-3.0f, -INFINITY, -0.5f, -10.0f};
	expect_topk(neg, idx_rank, NULL, 4, 2, (const uint8_t[]){0, 1, 0, 1});
}

TEST(kernels, select_topk_ties_keep_higher_rank)
{
	const float eq[6] = {1, 1, 1, 1, 1, 1};
	expect_topk(eq, idx_rank, NULL, 6, 3, (const uint8_t[]){1, 1, 1, 0, 0, 0});
	/* Ranks are positions, not indices: the list was compacted. */
	const uint32_t rank[6] = {40, 10, 50, 20, 60, 30};
	expect_topk(eq, rank, NULL, 6, 2, (const uint8_t[]){1, 1, 0, 1, 0, 1});
	expect_topk(eq, rank, NULL, 6, 3, (const uint8_t[]){0, 1, 0, 1, 0, 1});
	/* A tie only at the boundary: 0.5 x3, one slot left for them. */
	const float s[5] = {0.5f, 0.9f, 0.5f, 0.5f, 0.1f};
	expect_topk(s, idx_rank, NULL, 5, 2, (const uint8_t[]){1, 0, 1, 0, 1});
	/* +0 and -0 are equal scores: the rank decides. */
	const float z[2] = {0.0f, -0.0f};
	expect_topk(z, idx_rank, NULL, 2, 1, (const uint8_t[]){1, 0});
}

TEST(kernels, select_topk_nan_lowest)
{
	const float s[5] = {NAN, 1.0f, NAN, 0.0f, -INFINITY};
	expect_topk(s, idx_rank, NULL, 5, 3, (const uint8_t[]){1, 0, 1, 0, 0});
	/* One NaN must stay: the higher-ranked one. */
	expect_topk(s, idx_rank, NULL, 5, 4, (const uint8_t[]){1, 0, 0, 0, 0});
	expect_topk(s, idx_rank, NULL, 5, 1, (const uint8_t[]){1, 0, 1, 1, 1});
}

TEST(kernels, select_topk_protected)
{
	/* Protected entries stay whatever their score and do not use up k:
	 * of the 4 candidates (1, 2, 4, 5) the best 2 stay. */
	const float s[6] = {-5, 0.3f, 0.8f, NAN, 0.1f, 0.9f};
	const uint8_t prot[6] = {1, 0, 0, 1, 0, 0};
	expect_topk(s, idx_rank, prot, 6, 2, (const uint8_t[]){0, 1, 0, 0, 1, 0});
	expect_topk(s, idx_rank, prot, 6, 0, (const uint8_t[]){0, 1, 1, 0, 1, 1});
	expect_topk(s, idx_rank, prot, 6, 4, (const uint8_t[]){0, 0, 0, 0, 0, 0});
	const uint8_t all[3] = {1, 1, 1};
	expect_topk(s, idx_rank, all, 3, 0, (const uint8_t[]){0, 0, 0});
}

/* The oracle: sort candidates best first (an O(n^2) insertion sort, as
 * obvious as it gets) and drop everything past k. */
static const float *o_score;
static const uint32_t *o_rank;

static int o_better(uint32_t a, uint32_t b)
{
	double sa = o_score[a], sb = o_score[b];
	if (isnan(sa) || isnan(sb)) {
		if (!isnan(sa))
			return 1;
		if (!isnan(sb))
			return 0;
	} else if (sa != sb) {
		return sa > sb;
	}
	return o_rank[a] > o_rank[b];
}

static void naive_topk(const float *score, const uint32_t *rank,
                       const uint8_t *protect, uint32_t n, uint32_t k,
                       uint8_t *drop)
{
	uint32_t *c = malloc((n + 1) * sizeof(uint32_t)), m = 0;
	o_score = score;
	o_rank = rank;
	for (uint32_t i = 0; i < n; i++) {
		drop[i] = 0;
		if (protect && protect[i])
			continue;
		uint32_t j = m++;
		while (j > 0 && o_better(i, c[j - 1])) {
			c[j] = c[j - 1];
			j--;
		}
		c[j] = i;
	}
	for (uint32_t j = k; j < m; j++)
		drop[c[j]] = 1;
	free(c);
}

TEST_T(kernels, select_topk_vs_naive, 60)
{
	/* Distinct ranks (a shuffled permutation), scores from a small set
	 * so ties are common, some NaN, random protection, every k. */
	const uint32_t ns[] = {1, 2, 3, 37, 100, 1000};
	rng_seed(9);
	for (size_t a = 0; a < 6; a++) {
		uint32_t n = ns[a];
		float *s = malloc(n * sizeof(float));
		uint32_t *rank = malloc(n * sizeof(uint32_t)),
		         *scr = malloc(n * sizeof(uint32_t));
		uint8_t *prot = malloc(n), *d = malloc(n), *w = malloc(n);
		for (int trial = 0; trial < 30; trial++) {
			for (uint32_t i = 0; i < n; i++) {
				rank[i] = i * 7 + 3;
				uint32_t j = (uint32_t)(rng_u64() % (i + 1));
				uint32_t t = rank[i];
				rank[i] = rank[j];
				rank[j] = t;
				uint64_t r = rng_u64();
				s[i] = (r % 13 == 0) ? NAN
				                     : (float)((r >> 8) % (trial % 3 ? 5 : 1000));
				prot[i] = (r >> 32) % 5 == 0;
			}
			uint32_t ks[] = {0, 1, n / 3, n / 2, n - 1, n, n + 5};
			for (size_t ki = 0; ki < 7; ki++)
				for (int withp = 0; withp < 2; withp++) {
					const uint8_t *p = withp ? prot : NULL;
					uint32_t got = select_topk_cpu(s, rank, p, n, ks[ki], d, scr);
					naive_topk(s, rank, p, n, ks[ki], w);
					uint32_t want = 0;
					for (uint32_t i = 0; i < n; i++) {
						want += w[i];
						if (d[i] != w[i])
							th_fail(__FILE__, __LINE__, "n %u k %u trial %d: drop[%u] = %u, expected %u",
							        n, ks[ki], trial, i, d[i], w[i]);
					}
					T_EQ(got, want);
				}
		}
		free(s);
		free(rank);
		free(scr);
		free(prot);
		free(d);
		free(w);
	}
}

TEST_T(kernels, select_topk_adversarial_is_fast, 60)
{
	/* Sorted, reverse sorted, all equal, organ pipe and interleaved
	 * halves at n = 2^20 (shapes that make naive pivots quadratic):
	 * must finish well inside the timeout.  Checks the kept count and
	 * the boundary: every kept entry beats every dropped one. */
	const uint32_t n = 1u << 20, k = n / 3;
	float *s = malloc(n * sizeof(float));
	uint32_t *rank = malloc(n * sizeof(uint32_t)),
	         *scr = malloc(n * sizeof(uint32_t));
	uint8_t *d = malloc(n);
	for (int shape = 0; shape < 5; shape++) {
		for (uint32_t i = 0; i < n; i++) {
			rank[i] = i;
			switch (shape) {
			case 0: s[i] = (float)i; break;
			case 1: s[i] = (float)(n - i); break;
			case 2: s[i] = 1.0f; break;
			case 3: s[i] = (float)(i < n / 2 ? i : n - i); break;
			default: /* odd first half ascending, then evens */
				s[i] = (float)(i < n / 2 ? 2 * i + 1 : 2 * (i - n / 2));
			}
		}
		uint32_t marked = select_topk_cpu(s, rank, NULL, n, k, d, scr);
		T_EQ(marked, n - k);
		o_score = s;
		o_rank = rank;
		/* The worst kept beats the best dropped. */
		uint32_t worst_kept = UINT32_MAX, best_drop = UINT32_MAX;
		for (uint32_t i = 0; i < n; i++) {
			if (!d[i] && (worst_kept == UINT32_MAX || o_better(worst_kept, i)))
				worst_kept = i;
			if (d[i] && (best_drop == UINT32_MAX || o_better(i, best_drop)))
				best_drop = i;
		}
		T_ASSERT(o_better(worst_kept, best_drop));
	}
	free(s);
	free(rank);
	free(scr);
	free(d);
}

/* ---------------------------------------------------------------- select_threshold */

TEST(kernels, select_threshold_hand)
{
	/* Only score < tau (or NaN) is dropped: equality keeps. */
	const float s[7] = {-4.0f, -4.5f, NAN, -3.9f, -INFINITY, INFINITY, -4.0001f};
	uint8_t d[7];
	memset(d, 9, sizeof(d));
	T_EQ(select_threshold_cpu(s, NULL, 7, -4.0f, d), 4);
	const uint8_t want[7] = {0, 1, 1, 0, 1, 0, 1};
	for (int i = 0; i < 7; i++)
		T_EQ(d[i], want[i]);
	/* Protected entries stay, NaN included. */
	const uint8_t prot[7] = {0, 1, 1, 0, 0, 0, 0};
	T_EQ(select_threshold_cpu(s, prot, 7, -4.0f, d), 2);
	const uint8_t want2[7] = {0, 0, 0, 0, 1, 0, 1};
	for (int i = 0; i < 7; i++)
		T_EQ(d[i], want2[i]);
	/* -0 == +0 at tau: kept. */
	const float z[1] = {-0.0f};
	T_EQ(select_threshold_cpu(z, NULL, 1, 0.0f, d), 0);
	T_EQ(d[0], 0);
	T_EQ(select_threshold_cpu(s, NULL, 0, 0.0f, d), 0);
}

TEST(kernels, select_threshold_vs_naive)
{
	rng_seed(10);
	enum { N = 1000 };
	float s[N];
	uint8_t prot[N], d[N];
	for (int trial = 0; trial < 20; trial++) {
		float tau = (float)(trial - 10) / 4;
		uint32_t want = 0;
		for (int i = 0; i < N; i++) {
			uint64_t r = rng_u64();
			s[i] = r % 17 == 0 ? NAN : (float)((int)(r % 41) - 20) / 4;
			prot[i] = (r >> 20) % 4 == 0;
		}
		uint32_t got = select_threshold_cpu(s, prot, N, tau, d);
		for (int i = 0; i < N; i++) {
			int w = !prot[i] && (isnan(s[i]) || s[i] < tau);
			want += (uint32_t)w;
			T_EQ(d[i], w);
		}
		T_EQ(got, want);
	}
}
