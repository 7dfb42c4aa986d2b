/*
 * attn_band.c — attention weights of staged queries against one list's
 * keys, recovered from the engine's stored log-sum-exp (CPU reference);
 * see kernels.h.  Tested in kernels/cpu/kernels_test.c.
 *
 * Keys are gathered once into kscratch as float32.  Each logit is a dot
 * product in the one fixed order kernels.h states (d ascending, product
 * and sum each rounded, no fused multiply-add), not a BLAS call: a BLAS
 * library sums in an order of its own that depends on the shapes and the
 * CPU, and the device selections (backend/cuda/) compute the same logits
 * for every list of a sync in one kernel, which must give the same bits
 * as this reference.  The order leaves the vector units free across keys:
 * eight keys, one a lane (AVX2, where the CPU has it), the same
 * arithmetic per lane as the scalar loop.  exp(logit - lse) then is
 * the softmax weight the engine's attention used, without the engine ever
 * having materialised it; the causal mask zeroes keys newer than the
 * query (kpos, qpos are original positions).
 */
#include "kernels.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AB_X86 1
#endif

/* The scalar order itself: kernels.h's contract.  The project builds
 * with -ffp-contract=off (Makefile): a compiler that fused a * b + c into
 * an FMA (aarch64's default) would change the bits. */
float attn_dot_cpu(const float *a, const float *b, uint32_t n)
{
	float acc = 0.0f;
	for (uint32_t d = 0; d < n; d++) {
		float p = a[d] * b[d];
		acc = acc + p;
	}
	return acc;
}

/* w[r][i] = dot(q_r, k_i) * scale for rows r < R and keys i < len, keys
 * [len][hd]: scalar. */
static void ab_logits_scalar(const float *q, uint32_t R, const float *k, uint32_t len,
                 uint32_t hd, float scale, float *w)
{
	for (uint32_t r = 0; r < R; r++)
		for (uint32_t i = 0; i < len; i++)
			w[(size_t)r * len + i] =
				attn_dot_cpu(q + (size_t)r * hd, k + (size_t)i * hd,
				             hd) * scale;
}

#ifdef AB_X86
/* Keys eight at a time, one per lane, each block transposed to [hd][8] so
 * that a lane's d-th product is one load; four query rows share each
 * load.  Lane j of row r sums q_r[d] * k_j[d] in d order, rounding each
 * product and each sum, which is ab_logits_scalar's arithmetic. */
#define AB_HD_MAX 256
__attribute__((target("avx2"))) static void
ab_logits_avx2(const float *q, uint32_t R, const float *k, uint32_t len,
               uint32_t hd, float scale, float *w)
{
	float blk[8 * AB_HD_MAX]; /* [hd][8] */
	const __m256 sc = _mm256_set1_ps(scale);
	uint32_t i = 0;
	for (; hd <= AB_HD_MAX && i + 8 <= len; i += 8) {
		for (uint32_t j = 0; j < 8; j++)
			for (uint32_t d = 0; d < hd; d++)
				blk[d * 8 + j] = k[(size_t)(i + j) * hd + d];
		uint32_t r = 0;
		for (; r + 4 <= R; r += 4) {
			const float *q0 = q + (size_t)r * hd, *q1 = q0 + hd,
			            *q2 = q1 + hd, *q3 = q2 + hd;
			__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
			for (uint32_t d = 0; d < hd; d++) {
				__m256 kv = _mm256_loadu_ps(blk + d * 8);
				a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_set1_ps(q0[d]), kv));
				a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_set1_ps(q1[d]), kv));
				a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_set1_ps(q2[d]), kv));
				a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_set1_ps(q3[d]), kv));
			}
			_mm256_storeu_ps(w + (size_t)r * len + i, _mm256_mul_ps(a0, sc));
			_mm256_storeu_ps(w + (size_t)(r + 1) * len + i, _mm256_mul_ps(a1, sc));
			_mm256_storeu_ps(w + (size_t)(r + 2) * len + i, _mm256_mul_ps(a2, sc));
			_mm256_storeu_ps(w + (size_t)(r + 3) * len + i, _mm256_mul_ps(a3, sc));
		}
		for (; r < R; r++) {
			const float *qr = q + (size_t)r * hd;
			__m256 a = _mm256_setzero_ps();
			for (uint32_t d = 0; d < hd; d++)
				a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(qr[d]),
				                                   _mm256_loadu_ps(blk + d * 8)));
			_mm256_storeu_ps(w + (size_t)r * len + i, _mm256_mul_ps(a, sc));
		}
	}
	if (i == len)
		return;
	/* the keys left: scalar, into the same rows */
	for (uint32_t r = 0; r < R; r++)
		for (uint32_t j = i; j < len; j++)
			w[(size_t)r * len + j] =
				attn_dot_cpu(q + (size_t)r * hd, k + (size_t)j * hd,
				             hd) * scale;
}
#endif

void attn_band_cpu(const float *q, const float *lse, const uint32_t *qpos,
                   uint32_t n_q, uint32_t G, void *const *pages,
                   uint32_t page_tokens, uint32_t head_dim,
                   enum kvt_dtype dt, const uint32_t *kpos, uint32_t len,
                   float scale, float *w, float *kscratch)
{
	uint32_t rows = n_q * G;
	if (rows == 0 || len == 0)
		return;
	size_t esz = kvt_dtype_size(dt);
	size_t row_bytes = (size_t)head_dim * esz;
	for (uint32_t i = 0; i < len; i++) {
		const char *page = pages[i / page_tokens];
		dtype_to_f32(page + (size_t)(i % page_tokens) * row_bytes, dt,
		             kscratch + (size_t)i * head_dim, head_dim);
	}
#ifdef AB_X86
	if (__builtin_cpu_supports("avx2"))
		ab_logits_avx2(q, rows, kscratch, len, head_dim, scale, w);
	else
#endif
		ab_logits_scalar(q, rows, kscratch, len, head_dim, scale, w);
	for (uint32_t t = 0; t < n_q; t++) {
		for (uint32_t g = 0; g < G; g++) {
			float l = lse[(size_t)t * G + g];
			float *wr = w + ((size_t)t * G + g) * len;
			for (uint32_t i = 0; i < len; i++)
				wr[i] = kpos[i] <= qpos[t] ? expf(wr[i] - l)
				                           : 0.0f;
		}
	}
}
