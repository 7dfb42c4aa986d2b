/*
 * paged_attention.c — decode attention of one query token over one paged
 * (layer, KV head) list, returning the log-sum-exp (CPU reference); see
 * kernels.h.  Tested in tests/unit/test_kernels.c.
 *
 * Three passes over the list: logits (each key row converted once and
 * dotted with all G query heads), a max-subtracted softmax so no expf can
 * overflow, then the weighted sum of value rows (each converted once).
 * Rows of f16/bf16 pages are converted in blocks of ROW_BLOCK elements on
 * the stack, so any head_dim works without allocating.  The lse it returns
 * is what attn_band_cpu later uses to recover weights without a dense map.
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

#define ROW_BLOCK 64u

struct rows {
	void *const *pages;
	uint32_t page_tokens;
	size_t row_bytes, half_bytes; /* one row; the K half of a page */
};

/* Start of K (v = 0) or V (v = 1) row of entry e. */
static inline const char *row_at(const struct rows *r, uint32_t e, int v)
{
	const char *page = r->pages[e / r->page_tokens];
	return page + (v ? r->half_bytes : 0) +
	       (size_t)(e % r->page_tokens) * r->row_bytes;
}

void paged_attention_cpu(const float *q, uint32_t G, void *const *pages,
                         uint32_t page_tokens, uint32_t head_dim,
                         enum kvt_dtype dt, uint32_t len, float scale,
                         float *out, float *lse, float *scratch)
{
	size_t esz = kvt_dtype_size(dt);
	struct rows r = {pages, page_tokens, (size_t)head_dim * esz,
	                 (size_t)page_tokens * head_dim * esz};
	float buf[ROW_BLOCK];

	memset(out, 0, (size_t)G * head_dim * sizeof(float));
	if (len == 0) {
		for (uint32_t g = 0; g < G; g++)
			lse[g] = -INFINITY;
		return;
	}

	/* Logits: scratch[g][i] = q[g] . k_i (scaled below). */
	for (uint32_t i = 0; i < len; i++) {
		const char *krow = row_at(&r, i, 0);
		for (uint32_t g = 0; g < G; g++)
			scratch[(size_t)g * len + i] = 0.0f;
		for (uint32_t c = 0; c < head_dim; c += ROW_BLOCK) {
			uint32_t m = head_dim - c < ROW_BLOCK ? head_dim - c
			                                      : ROW_BLOCK;
			dtype_to_f32(krow + c * esz, dt, buf, m);
			for (uint32_t g = 0; g < G; g++) {
				const float *qg = q + (size_t)g * head_dim + c;
				float acc = 0.0f;
				for (uint32_t d = 0; d < m; d++)
					acc += qg[d] * buf[d];
				scratch[(size_t)g * len + i] += acc;
			}
		}
	}

	/* Softmax with the max subtracted; scratch becomes probabilities. */
	for (uint32_t g = 0; g < G; g++) {
		float *s = scratch + (size_t)g * len;
		for (uint32_t i = 0; i < len; i++)
			s[i] *= scale;
		float mx = s[0];
		for (uint32_t i = 1; i < len; i++)
			mx = s[i] > mx ? s[i] : mx;
		double sum = 0.0;
		for (uint32_t i = 0; i < len; i++) {
			s[i] = expf(s[i] - mx);
			sum += s[i];
		}
		float inv = (float)(1.0 / sum);
		for (uint32_t i = 0; i < len; i++)
			s[i] *= inv;
		lse[g] = mx + (float)log(sum);
	}

	/* out[g] = sum_i p[g][i] v_i. */
	for (uint32_t i = 0; i < len; i++) {
		const char *vrow = row_at(&r, i, 1);
		for (uint32_t c = 0; c < head_dim; c += ROW_BLOCK) {
			uint32_t m = head_dim - c < ROW_BLOCK ? head_dim - c
			                                      : ROW_BLOCK;
			dtype_to_f32(vrow + c * esz, dt, buf, m);
			for (uint32_t g = 0; g < G; g++) {
				float p = scratch[(size_t)g * len + i];
				float *og = out + (size_t)g * head_dim + c;
				for (uint32_t d = 0; d < m; d++)
					og[d] += p * buf[d];
			}
		}
	}
}
