/*
 * replay.c — in-process evicting KV cache; see replay.h.
 */
#include "replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

struct replay {
	const struct model *m;
	uint32_t cap, pos;
	float *kv;        /* [L][n_kv][cap][2][hd]: K row then V row, so one
	                     entry is a page of page_tokens 1 */
	uint8_t *alive;   /* [L][n_kv][cap] */
	void **pages;     /* [cap] */
	uint32_t *idx;    /* [cap] position of each entry of pages */
	float *scratch;   /* [G][cap] */
	double *tap;      /* replay_tap's sums, or NULL */
};

int replay_open(const struct model *m, uint32_t cap, struct replay **out)
{
	const struct model_config *c = &m->cfg;
	struct replay *r = calloc(1, sizeof(*r));
	size_t lists = (size_t)c->n_layers * c->n_kv_heads;
	if (!r)
		return KVT_ENOMEM;
	r->m = m;
	r->cap = cap;
	r->kv = malloc(sizeof(float) * lists * cap * 2 * c->head_dim);
	r->alive = calloc(lists * cap, 1);
	r->pages = malloc(sizeof(void *) * cap);
	r->idx = malloc(sizeof(uint32_t) * cap);
	r->scratch = malloc(sizeof(float) * cap * (c->n_heads / c->n_kv_heads));
	if (!r->kv || !r->alive || !r->pages || !r->idx || !r->scratch) {
		replay_close(r);
		return KVT_ENOMEM;
	}
	*out = r;
	return 0;
}

void replay_close(struct replay *r)
{
	if (!r)
		return;
	free(r->kv);
	free(r->alive);
	free(r->pages);
	free(r->idx);
	free(r->scratch);
	free(r);
}

void replay_reset(struct replay *r)
{
	const struct model_config *c = &r->m->cfg;
	r->pos = 0;
	memset(r->alive, 0, (size_t)c->n_layers * c->n_kv_heads * r->cap);
}

static int attend(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n,
                  const float *x, const float *q, const float *k,
                  const float *v, float *out, float *lse)
{
	struct replay *r = ctx;
	const struct model_config *c = &r->m->cfg;
	const uint32_t hd = c->head_dim, H = c->n_heads, nkv = c->n_kv_heads,
	               G = H / nkv;
	const float scale = 1.0f / sqrtf((float)hd);
	(void)x;
	if (pos0 + n > r->cap)
		return KVT_ETOOLONG;
	for (uint32_t g = 0; g < nkv; g++) {
		size_t li = (size_t)layer * nkv + g;
		float *base = r->kv + li * r->cap * 2 * hd;
		uint8_t *al = r->alive + li * r->cap;
		uint32_t len = 0;
		for (uint32_t i = 0; i < pos0; i++)
			if (al[i]) {
				r->idx[len] = i;
				r->pages[len++] = base + (size_t)i * 2 * hd;
			}
		for (uint32_t t = 0; t < n; t++) {
			float *row = base + (size_t)(pos0 + t) * 2 * hd;
			memcpy(row, k + ((size_t)t * nkv + g) * hd,
			       sizeof(float) * hd);
			memcpy(row + hd, v + ((size_t)t * nkv + g) * hd,
			       sizeof(float) * hd);
			al[pos0 + t] = 1;
			r->idx[len + t] = pos0 + t;
			r->pages[len + t] = row;
		}
		for (uint32_t t = 0; t < n; t++) {
			size_t qo = (size_t)t * H + (size_t)g * G;
			uint32_t nv = len + t + 1;
			paged_attention_cpu(q + qo * hd, G, r->pages, 1, hd,
			                    KVT_DTYPE_F32, nv, scale,
			                    out + qo * hd, lse + qo, r->scratch);
			/* the kernel leaves the probabilities in scratch
			 * [G][nv] */
			for (uint32_t j = 0; r->tap && j < G; j++) {
				double *acc = r->tap + ((size_t)layer * H +
				                        (size_t)g * G + j) * r->cap;
				const float *pr = r->scratch + (size_t)j * nv;
				for (uint32_t e = 0; e < nv; e++)
					acc[r->idx[e]] += pr[e];
			}
		}
	}
	return 0;
}

int replay_attend_row(struct replay *r, uint32_t layer, const float *q,
                      const float *k, const float *v, float *out, float *lse)
{
	return attend(r, layer, r->pos, 1, NULL, q, k, v, out, lse);
}

void replay_advance(struct replay *r, uint32_t n) { r->pos += n; }

void replay_tap(struct replay *r, double *acc) { r->tap = acc; }

int replay_step(struct replay *r, const int32_t *tok, uint32_t n,
                float *logits)
{
	struct model_attn a = {attend, r};
	int rc = model_forward(r->m, tok, n, r->pos, &a, logits);
	if (!rc)
		r->pos += n;
	return rc;
}

uint32_t replay_pos(const struct replay *r) { return r->pos; }

uint8_t *replay_alive(struct replay *r, uint32_t layer, uint32_t kv_head)
{
	return r->alive + ((size_t)layer * r->m->cfg.n_kv_heads + kv_head) *
	                          r->cap;
}

uint64_t replay_kept(const struct replay *r)
{
	const struct model_config *c = &r->m->cfg;
	uint64_t s = 0;
	for (size_t li = 0; li < (size_t)c->n_layers * c->n_kv_heads; li++)
		for (uint32_t i = 0; i < r->pos; i++)
			s += r->alive[li * r->cap + i];
	return s;
}
