/*
 * attn_band.c — attention weights of staged queries against one list's
 * keys, recovered from the engine's stored log-sum-exp (CPU reference);
 * see kernels.h.  Tested in kernels/cpu/kernels_test.c.
 *
 * Keys are gathered once into kscratch as float32 and all n_q * G query
 * rows hit them in one sgemm (q is [n_q][G][head_dim], i.e. already an
 * (n_q * G) x head_dim row-major matrix).  exp(logit - lse) then is the
 * softmax weight the engine's attention used, without the engine ever
 * having materialised it; the causal mask zeroes keys newer than the
 * query (kpos, qpos are original positions).
 */
#include "kernels.h"

#include <cblas.h>
#include <math.h>

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
	/* w = scale * Q K^T: [rows][head_dim] x [head_dim][len]. */
	if (head_dim == 0) {
		for (size_t j = 0; j < (size_t)rows * len; j++)
			w[j] = 0.0f;
	} else {
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows,
		            (int)len, (int)head_dim, scale, q, (int)head_dim,
		            kscratch, (int)head_dim, 0.0f, w, (int)len);
	}
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
