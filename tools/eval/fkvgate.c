/*
 * fkvgate.c — Fast KVzip's gate scores on calibration windows, for the
 * fastkvzip-global jobs of protocol 1 (ctxmain.c): one threshold for every
 * layer, as the Fast KVzip paper evicts, chosen on the training split
 * like kvzap's (kvzap_tau: the gate's rule under protocol 1, drop iff
 * score < F outside the sinks and the window, is kvzap's).  The scores
 * are those of the daemon's policy: the same checkpoint, the same kernel
 * (sink_gate_cpu) on the same attention inputs.
 */
#include "eval.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "learned.h"
#include "model.h"
#include "weights.h"

struct fkv_gate {
	const struct model *M;
	struct weights *w;
	uint32_t dp, S, G, cap;
	/* per layer, the layouts of kernels.h sink_gate_cpu */
	const float **Wq, **cq, **Wk, **gq, **gk, **sinks, **bias;
	float *score, *scratch; /* [cap][n_kv], [cap][n_kv][G + 1][dp] */
};

void fkv_gate_close(struct fkv_gate *f)
{
	if (!f)
		return;
	weights_free(f->w);
	const float **t[] = {f->Wq, f->cq, f->Wk, f->gq, f->gk, f->sinks,
	                     f->bias};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		free((void *)t[i]);
	free(f->score);
	free(f->scratch);
	free(f);
}

/* The dimension axis of tensor name (ndim dimensions) in the checkpoint
 * at path, 0 when absent. */
static uint32_t dim_of(const char *path, const char *name, uint32_t ndim,
                       uint32_t axis)
{
	uint64_t sh[4] = {0};
	uint32_t nd = 0;
	char why[KVT_ERRTEXT_MAX];
	if (learned_shape(path, name, &nd, sh, why, sizeof(why)) ||
	    nd != ndim)
		return 0;
	return (uint32_t)sh[axis];
}

int fkv_gate_open(const struct model *M, const char *path, uint32_t T,
                  struct fkv_gate **out, char *err, size_t errlen)
{
	const struct model_config *mc = &M->cfg;
	const uint32_t L = mc->n_layers, nkv = mc->n_kv_heads, d = mc->dim;
	struct fkv_gate *f = calloc(1, sizeof(*f));
	*out = NULL;
	if (!f)
		return KVT_ENOMEM;
	f->M = M;
	f->G = mc->n_heads / nkv;
	f->cap = T;
	int rc = weights_load(path, &f->w, err, errlen);
	if (rc) {
		free(f);
		return rc;
	}
	f->dp = dim_of(path, "fastkvzip.0.q_norm.weight", 1, 0);
	f->S = dim_of(path, "fastkvzip.0.k_base", 4, 2);
	const float ***t[] = {&f->Wq, &f->cq, &f->Wk, &f->gq, &f->gk,
	                      &f->sinks, &f->bias};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		*t[i] = calloc(L, sizeof(float *));
	f->score = malloc(sizeof(float) * T * nkv);
	f->scratch = malloc(sizeof(float) * T * nkv * (f->G + 1) *
	                    (f->dp ? f->dp : 1));
	if (!f->dp || !f->S) {
		snprintf(err, errlen, "%.900s: not a Fast KVzip checkpoint", path);
		fkv_gate_close(f);
		return KVT_EINVAL;
	}
	if (!f->score || !f->scratch || !f->Wq || !f->cq || !f->Wk ||
	    !f->gq || !f->gk || !f->sinks || !f->bias) {
		fkv_gate_close(f);
		return KVT_ENOMEM;
	}
	const uint64_t G = f->G, dp = f->dp, S = f->S;
	for (uint32_t l = 0; l < L; l++) {
		struct {
			const char *fmt;
			uint32_t nd;
			uint64_t sh[4];
			const float **dst;
		} ts[] = {
			{"fastkvzip.%u.q_proj.weight", 2, {nkv * G * dp, d}, &f->Wq[l]},
			{"fastkvzip.%u.q_proj.bias", 1, {nkv * G * dp}, &f->cq[l]},
			{"fastkvzip.%u.k_proj.weight", 2, {nkv * dp, d}, &f->Wk[l]},
			{"fastkvzip.%u.q_norm.weight", 1, {dp}, &f->gq[l]},
			{"fastkvzip.%u.k_norm.weight", 1, {dp}, &f->gk[l]},
			{"fastkvzip.%u.k_base", 4, {nkv, 1, S, dp}, &f->sinks[l]},
			{"fastkvzip.%u.b", 3, {nkv, 1, G}, &f->bias[l]},
		};
		for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
			char n[64];
			snprintf(n, sizeof(n), ts[i].fmt, l);
			if (!(*ts[i].dst = weights_get(f->w, n, ts[i].nd,
			                               ts[i].sh, err, errlen))) {
				fkv_gate_close(f);
				return KVT_EINVAL;
			}
		}
	}
	*out = f;
	return 0;
}

void fkv_gate_score(struct fkv_gate *f, const float *xs, uint32_t T,
                    float *out)
{
	const struct model_config *mc = &f->M->cfg;
	const uint32_t nkv = mc->n_kv_heads, d = mc->dim;
	for (uint32_t l = 0; l < mc->n_layers; l++) {
		const float *x = xs + (size_t)l * T * d;
		for (uint32_t i0 = 0; i0 < T; i0 += f->cap) {
			uint32_t n = T - i0 < f->cap ? T - i0 : f->cap;
			sink_gate_cpu(x + (size_t)i0 * d, n, d, nkv, f->G, f->dp,
			              f->S, f->Wq[l], f->cq[l], f->Wk[l], f->gq[l],
			              f->gk[l], f->sinks[l], f->bias[l], f->score,
			              f->scratch);
			eval_put_scores(out, f->score, l, nkv, T, i0, n);
		}
	}
}
