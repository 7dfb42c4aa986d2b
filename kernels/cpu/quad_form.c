/*
 * quad_form.c — the quadratic form k^T S k of each of n keys in the
 * fixed order kernels.h states (quad_form_cpu), the term Expected
 * Attention adds for the queries' covariance.  Tested in
 * kernels/cpu/kernels_test.c.
 *
 * Not a GEMM: a BLAS library rounds K S in an order of its own that
 * depends on the shapes and the CPU, and the device rule
 * (policies/expected_attention.cu) computes every key of every list of a
 * sync in one kernel, where the same bits must come out.  Row d of S
 * dotted with k in attn_dot_cpu's order, then the d sums in double: the
 * vector units take eight keys, one a lane (AVX2, where the CPU has it),
 * with the same arithmetic per lane as the scalar loop.  The project
 * builds with -ffp-contract=off: no product is fused into a sum.
 */
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QF_X86 1
#endif

/* quad_form_cpu of one key: its contract, scalar. */
static double qf_one(const float *k, uint32_t hd, const float *S)
{
	double q = 0.0;
	for (uint32_t d = 0; d < hd; d++)
		q += (double)attn_dot_cpu(S + (size_t)d * hd, k, hd) * k[d];
	return q;
}

#ifdef QF_X86
#define QF_HD_MAX 256
/* out[l] += (double)ks[l] * k[l] of lanes l < 8 (ks's float lanes), each
 * product and sum rounded in double as qf_one's. */
__attribute__((target("avx2"))) static inline void
qf_acc(__m256d *lo, __m256d *hi, __m256 ks, __m256 k)
{
	*lo = _mm256_add_pd(*lo, _mm256_mul_pd(
		_mm256_cvtps_pd(_mm256_castps256_ps128(ks)),
		_mm256_cvtps_pd(_mm256_castps256_ps128(k))));
	*hi = _mm256_add_pd(*hi, _mm256_mul_pd(
		_mm256_cvtps_pd(_mm256_extractf128_ps(ks, 1)),
		_mm256_cvtps_pd(_mm256_extractf128_ps(k, 1))));
}

/* Rows d .. d + R of S (R <= 4) against the block blk [hd][8] of eight
 * keys, their float sums independent chains that share each key load,
 * then added to lo, hi in row order: lane j of row d sums S[d][c] *
 * k_j[c] in c order in float, then adds its product with k_j[d] to its
 * double sum. */
__attribute__((target("avx2"), always_inline)) static inline void
qf_rows(const float *blk, const float *S, uint32_t d, uint32_t R,
        uint32_t hd, __m256d *lo, __m256d *hi)
{
	__m256 a[4];
#pragma GCC unroll 4
	for (uint32_t r = 0; r < R; r++)
		a[r] = _mm256_setzero_ps();
	for (uint32_t c = 0; c < hd; c++) {
		__m256 kv = _mm256_loadu_ps(blk + c * 8);
#pragma GCC unroll 4
		for (uint32_t r = 0; r < R; r++)
			a[r] = _mm256_add_ps(a[r], _mm256_mul_ps(
				_mm256_set1_ps(S[(size_t)(d + r) * hd + c]), kv));
	}
#pragma GCC unroll 4
	for (uint32_t r = 0; r < R; r++)
		qf_acc(lo, hi, a[r], _mm256_loadu_ps(blk + (d + r) * 8));
}

/* Keys eight at a time, one per lane, each block transposed to [hd][8];
 * the rows of S four at a time (hd is even: a pair may be left), d
 * ascending: qf_one's arithmetic per lane.  Returns the keys done. */
__attribute__((target("avx2"))) static uint32_t
qf_avx2(const float *k, uint32_t n, uint32_t hd, const float *S, double *out)
{
	float blk[8 * QF_HD_MAX]; /* [hd][8] */
	if (hd > QF_HD_MAX)
		return 0;
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8) {
		for (uint32_t j = 0; j < 8; j++)
			for (uint32_t c = 0; c < hd; c++)
				blk[c * 8 + j] = k[(size_t)(i + j) * hd + c];
		__m256d lo = _mm256_setzero_pd(), hi = lo;
		uint32_t d = 0;
		for (; d + 4 <= hd; d += 4)
			qf_rows(blk, S, d, 4, hd, &lo, &hi);
		for (; d < hd; d += 2)
			qf_rows(blk, S, d, 2, hd, &lo, &hi);
		_mm256_storeu_pd(out + i, lo);
		_mm256_storeu_pd(out + i + 4, hi);
	}
	return i;
}
#endif

void quad_form_cpu(const float *k, uint32_t n, uint32_t hd, const float *S,
                   double *out)
{
	uint32_t i = 0;
#ifdef QF_X86
	if (hd % 2 == 0 && __builtin_cpu_supports("avx2"))
		i = qf_avx2(k, n, hd, S, out);
#endif
	for (; i < n; i++)
		out[i] = qf_one(k + (size_t)i * hd, hd, S);
}
