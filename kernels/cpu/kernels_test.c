/*
 * kernels_test.c — the CPU kernels of kernels.h that convert, store, attend
 * and score (dtypes, append_kv, paged attention, the attention band, the
 * linear and MLP scorers) against a naive oracle
 * written here: plain loops in double precision, no BLAS, and page bytes
 * decoded by kernels_fixture.h's own f16/bf16 decoders, so a bug shared by
 * kernel and oracle is unlikely.
 *
 * Tolerances are atol + rtol * |ref| per element, stated beside each op;
 * NaN/Inf in a result fails before the tolerance is looked at.
 * Run: build/bin/kvtrim-tests kernels
 */
#include "kernels_fixture.h"
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

/* kernels.h's fixed order, written out here: d ascending from 0, each
 * product and each sum rounded to float (volatile: no FMA whatever the
 * flags), then times scale. */
static float fixed_logit(const float *q, const struct plist *l, uint32_t i,
                         float scale)
{
	volatile float acc = 0.0f;
	for (uint32_t d = 0; d < l->hd; d++) {
		volatile float p = q[d] * (float)plist_at(l, i, 0, d);
		acc = acc + p;
	}
	volatile float lg = acc * scale;
	return lg;
}

/* lse is the causal log-sum-exp of each query over these keys (what an
 * engine stores), so each row of w with a visible key also sums to 1.
 * w: atol 1e-6 + rtol 1e-4 against the double reference (weights in
 * [0, 1], exp of float logits), and bit for bit expf(fixed_logit - lse),
 * the order the device selections reproduce; row sums: atol 1e-4. */
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
			float fx = kpos[i] <= qpos[t]
			           ? expf(fixed_logit(q + (size_t)r * hd, &l, i,
			                              (float)scale) - lse[r])
			           : 0.0f;
			if (memcmp(&fx, &w[at], sizeof(fx)))
				th_fail(__FILE__, __LINE__, "[%s] w[%zu] = %a, the "
				        "fixed order gives %a", ctx, at, w[at], fx);
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

/* kernels.h's order of quad_form_cpu written out: row d of S dotted with
 * k in float, c ascending from 0, each product and sum rounded (volatile:
 * no FMA whatever the flags), times k[d] in double, summed d ascending
 * from 0. */
static double fixed_quad(const float *k, uint32_t hd, const float *S)
{
	volatile double q = 0.0;
	for (uint32_t d = 0; d < hd; d++) {
		volatile float acc = 0.0f;
		for (uint32_t c = 0; c < hd; c++) {
			volatile float p = S[(size_t)d * hd + c] * k[c];
			acc = acc + p;
		}
		volatile double t = (double)acc * k[d];
		q = q + t;
	}
	return q;
}

TEST(kernels, quad_form_shapes)
{
	/* Bit for bit the order written out above, for key counts that fill
	 * the vector lanes, leave some over or none, and head_dims even
	 * (the vector path), odd and beyond its 256 (scalar). */
	const uint32_t hds[] = {1, 2, 7, 8, 64, 128, 256, 258};
	const uint32_t ns[] = {0, 1, 7, 8, 9, 37};
	rng_seed(9);
	for (size_t hi = 0; hi < sizeof(hds) / sizeof(hds[0]); hi++)
		for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
			const uint32_t hd = hds[hi], n = ns[ni];
			snprintf(ctx, sizeof(ctx), "hd %u n %u", hd, n);
			float *k = rand_vec((size_t)n * hd + 1, -3, 3);
			float *S = rand_vec((size_t)hd * hd, -2, 2);
			double *out = malloc(((size_t)n + 1) * sizeof(double));
			out[n] = 7.0; /* stays */
			quad_form_cpu(k, n, hd, S, out);
			for (uint32_t i = 0; i < n; i++)
				T_ASSERT(out[i] == fixed_quad(k + (size_t)i * hd,
				                              hd, S));
			T_ASSERT(out[n] == 7.0);
			free(k);
			free(S);
			free(out);
		}
}

TEST(kernels, quad_form_order_hand)
{
	/* Every row of S (1e8, 1, -1e8, 1) against k = (1, 1, 1, 1): in c
	 * order the float sum is 1e8, 1e8 (the 1 is lost), 0, 1, so each
	 * (S k)[d] is 1 and k^T S k is 4 (exactly 8 in real numbers; 0 for
	 * pairs summed first).  Nine keys: the vector lanes and one more. */
	float S[16], k[9 * 4];
	double out[9];
	for (uint32_t d = 0; d < 4; d++) {
		S[d * 4 + 0] = 1e8f;
		S[d * 4 + 1] = 1.0f;
		S[d * 4 + 2] = -1e8f;
		S[d * 4 + 3] = 1.0f;
	}
	for (uint32_t e = 0; e < 9 * 4; e++)
		k[e] = 1.0f;
	quad_form_cpu(k, 9, 4, S, out);
	snprintf(ctx, sizeof(ctx), "order hand");
	for (uint32_t i = 0; i < 9; i++)
		T_ASSERT(out[i] == 4.0);
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
