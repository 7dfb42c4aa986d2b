/*
 * paged_attention.c — decode attention of one query token over one paged
 * (layer, KV head) list, returning the log-sum-exp (CPU reference); see
 * kernels.h.  Tested in kernels/cpu/kernels_test.c.  Three passes: logits,
 * a max-subtracted softmax (paged_attention_softmax_cpu, shared with the
 * dense twins in engine/model.c and tools/eval/context/window.c), the value sum.
 *
 * Arithmetic contract: every float result is what the plain scalar loops
 * (and engine/model.c's dense_attend, compared bit for bit) give:
 *   logit_i  = ((0 + q0 k_i0) + q1 k_i1) + ... in head_dim order, times scale
 *   out[d]   = ((0 + p_0 v_0d) + p_1 v_1d) + ... in entry order
 * The speed comes from independent sums side by side (KEY_BLOCK keys as
 * vector lanes, over a transposed kt; the value sum over head_dim in
 * vectors), never from reordering one.  f16/bf16 rows are converted in
 * ROW_BLOCK pieces on the stack; head_dim above KT_MAX takes the
 * row-at-a-time loop (same sums), so any head_dim works without allocating.
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

#define ROW_BLOCK 64u
#define KEY_BLOCK 16u
#define KT_MAX 256u   /* head_dim the transposed block holds */

typedef float v4f __attribute__((vector_size(16)));

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

/* Elements [c, c + m) of a row as float: the row itself when it is f32,
 * else converted into buf. */
static inline const float *row_f32(const char *row, enum kvt_dtype dt,
                                   size_t esz, uint32_t c, uint32_t m,
                                   float *buf)
{
	if (dt == KVT_DTYPE_F32)
		return (const float *)row + c;
	dtype_to_f32(row + c * esz, dt, buf, m);
	return buf;
}

/*
 * scratch[g][i] = q[g] . k_i for i in [0, len), KEY_BLOCK keys at a time:
 * four vectors of four keys, so four independent chains hide the add
 * latency (one chain per key would wait on every add).
 */
static void logits_blocked(const float *q, uint32_t G, const struct rows *r,
                           uint32_t hd, enum kvt_dtype dt, size_t esz,
                           uint32_t len, float *scratch)
{
	v4f kt[KT_MAX][KEY_BLOCK / 4]; /* kt[d][j / 4][j % 4]: key i0 + j */
	float *ktf = (float *)kt;
	float buf[ROW_BLOCK];
	for (uint32_t i0 = 0; i0 < len; i0 += KEY_BLOCK) {
		uint32_t nk = len - i0 < KEY_BLOCK ? len - i0 : KEY_BLOCK;
		if (nk < KEY_BLOCK)
			memset(kt, 0, sizeof(kt[0]) * hd);
		for (uint32_t j = 0; j < nk; j++) {
			const char *krow = row_at(r, i0 + j, 0);
			for (uint32_t c = 0; c < hd; c += ROW_BLOCK) {
				uint32_t m = hd - c < ROW_BLOCK ? hd - c
				                                : ROW_BLOCK;
				const float *k = row_f32(krow, dt, esz, c, m, buf);
				for (uint32_t d = 0; d < m; d++)
					ktf[(size_t)(c + d) * KEY_BLOCK + j] = k[d];
			}
		}
		for (uint32_t g = 0; g < G; g++) {
			const float *qg = q + (size_t)g * hd;
			v4f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
			for (uint32_t d = 0; d < hd; d++) {
				v4f qd = {qg[d], qg[d], qg[d], qg[d]};
				a0 += kt[d][0] * qd;
				a1 += kt[d][1] * qd;
				a2 += kt[d][2] * qd;
				a3 += kt[d][3] * qd;
			}
			float res[KEY_BLOCK];
			memcpy(res, &a0, sizeof(a0));
			memcpy(res + 4, &a1, sizeof(a1));
			memcpy(res + 8, &a2, sizeof(a2));
			memcpy(res + 12, &a3, sizeof(a3));
			memcpy(scratch + (size_t)g * len + i0, res,
			       nk * sizeof(float));
		}
	}
}

/* The same sums one key at a time (head_dim above KT_MAX). */
static void logits_rows(const float *q, uint32_t G, const struct rows *r,
                        uint32_t hd, enum kvt_dtype dt, size_t esz,
                        uint32_t len, float *scratch)
{
	float buf[ROW_BLOCK];
	for (uint32_t i = 0; i < len; i++) {
		const char *krow = row_at(r, i, 0);
		for (uint32_t g = 0; g < G; g++)
			scratch[(size_t)g * len + i] = 0.0f;
		for (uint32_t c = 0; c < hd; c += ROW_BLOCK) {
			uint32_t m = hd - c < ROW_BLOCK ? hd - c : ROW_BLOCK;
			const float *k = row_f32(krow, dt, esz, c, m, buf);
			for (uint32_t g = 0; g < G; g++) {
				const float *qg = q + (size_t)g * hd + c;
				float acc = scratch[(size_t)g * len + i];
				for (uint32_t d = 0; d < m; d++)
					acc += qg[d] * k[d];
				scratch[(size_t)g * len + i] = acc;
			}
		}
	}
}

/* o[d] += p * v[d] for d < m, in vectors of 4 where they fit. */
static inline void axpy(float *o, float p, const float *v, uint32_t m)
{
	uint32_t d = 0;
	const v4f pv = {p, p, p, p};
	for (; d + 4 <= m; d += 4) {
		v4f ov, vv;
		memcpy(&ov, o + d, sizeof(ov));
		memcpy(&vv, v + d, sizeof(vv));
		ov += vv * pv;
		memcpy(o + d, &ov, sizeof(ov));
	}
	for (; d < m; d++)
		o[d] += p * v[d];
}

float paged_attention_softmax_cpu(float *s, uint32_t n)
{
	float mx = -INFINITY;
	for (uint32_t i = 0; i < n; i++)
		mx = s[i] > mx ? s[i] : mx;
	double sum = 0.0;
	for (uint32_t i = 0; i < n; i++) {
		s[i] = expf(s[i] - mx);
		sum += s[i];
	}
	float inv = (float)(1.0 / sum);
	for (uint32_t i = 0; i < n; i++)
		s[i] *= inv;
	return mx + (float)log(sum);
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
	if (head_dim <= KT_MAX)
		logits_blocked(q, G, &r, head_dim, dt, esz, len, scratch);
	else
		logits_rows(q, G, &r, head_dim, dt, esz, len, scratch);

	/* Softmax with the max subtracted; scratch becomes probabilities. */
	for (uint32_t g = 0; g < G; g++) {
		float *s = scratch + (size_t)g * len;
		for (uint32_t i = 0; i < len; i++)
			s[i] *= scale;
		lse[g] = paged_attention_softmax_cpu(s, len);
	}

	/* out[g] = sum_i p[g][i] v_i. */
	for (uint32_t i = 0; i < len; i++) {
		const char *vrow = row_at(&r, i, 1);
		for (uint32_t c = 0; c < head_dim; c += ROW_BLOCK) {
			uint32_t m = head_dim - c < ROW_BLOCK ? head_dim - c
			                                      : ROW_BLOCK;
			const float *v = row_f32(vrow, dt, esz, c, m, buf);
			for (uint32_t g = 0; g < G; g++)
				axpy(out + (size_t)g * head_dim + c,
				     scratch[(size_t)g * len + i], v, m);
		}
	}
}
