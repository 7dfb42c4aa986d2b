/*
 * fastkvzip_gate.c — Fast KVzip's gate scores on calibration windows, for
 * protocol 1's fastkvzip-global jobs: one threshold for every layer, as
 * the Fast KVzip paper evicts, chosen on the training split like kvzap's
 * (kvzap_tau: the gate's rule under protocol 1 is kvzap's).  The scores
 * are the daemon's: the fastkvzip policy itself computes them
 * (fastkvzip_gate, policies/learned.h).
 */
#include "context.h"

#include <stdio.h>
#include <stdlib.h>

#include "learned.h"
#include "model.h"

struct fastkvzip_gate {
	const struct model *M;
	struct policy *p;
	uint32_t cap;
	float *score, *scratch; /* [cap][n_kv], fastkvzip_gate_scratch(cap) */
};

void fastkvzip_gate_close(struct fastkvzip_gate *f)
{
	if (!f)
		return;
	policy_free(f->p);
	free(f->score);
	free(f->scratch);
	free(f);
}

int fastkvzip_gate_open(const struct model *M, const char *path, uint32_t T,
                  struct fastkvzip_gate **out, char *err, size_t errlen)
{
	const struct model_config *mc = &M->cfg;
	const struct policy_geom geo = {
		.n_layers = mc->n_layers, .n_heads = mc->n_heads,
		.n_kv_heads = mc->n_kv_heads, .head_dim = mc->head_dim,
		.d_model = mc->dim, .page_tokens = 1, .dtype = KVT_DTYPE_F32,
		.headroom = T,
	};
	char spec[KVT_SPEC_MAX];
	struct fastkvzip_gate *f = calloc(1, sizeof(*f));
	*out = NULL;
	if (!f)
		return KVT_ENOMEM;
	f->M = M;
	f->cap = T;
	snprintf(spec, sizeof(spec), "fastkvzip:model=%s", path);
	int rc = policy_create(spec, &geo, &f->p, err, errlen);
	if (!rc) {
		f->score = malloc(sizeof(float) * T * mc->n_kv_heads);
		f->scratch = malloc(sizeof(float) *
		                    fastkvzip_gate_scratch(f->p, T));
		if (!f->score || !f->scratch)
			rc = KVT_ENOMEM;
	}
	if (rc) {
		fastkvzip_gate_close(f);
		return rc;
	}
	*out = f;
	return 0;
}

void fastkvzip_gate_score(struct fastkvzip_gate *f, const float *xs, uint32_t T,
                    float *out)
{
	const struct model_config *mc = &f->M->cfg;
	const uint32_t nkv = mc->n_kv_heads, d = mc->dim;
	for (uint32_t l = 0; l < mc->n_layers; l++) {
		const float *x = xs + (size_t)l * T * d;
		for (uint32_t i0 = 0; i0 < T; i0 += f->cap) {
			uint32_t n = T - i0 < f->cap ? T - i0 : f->cap;
			fastkvzip_gate(f->p, l, x + (size_t)i0 * d, n, f->score,
			               f->scratch);
			eval_put_scores(out, f->score, l, nkv, T, i0, n);
		}
	}
}
