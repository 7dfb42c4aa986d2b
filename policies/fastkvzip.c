/*
 * fastkvzip.c — Fast KVzip: a low-rank sink-attention gate on the
 * attention input x scores each entry in (0, 1) at arrival; evictions keep
 * the best-scored entries of the layer (all KV heads compete for one
 * budget) or drop those below a threshold, outside the sinks and the
 * recent window.
 *
 * Rule (docs/policies.md):
 *   arrival: score[g] = sink_gate(x) (kernels.h), stored per entry.  The
 *   paper buffers decode hidden states and scores them every 128 tokens;
 *   the score depends on x_i only, so scoring at arrival gives the same
 *   numbers without keeping x.
 *   when: every prefill sync (one chunk each); in decode when n_seen
 *   crosses a multiple of every (default 128).
 *   candidates: sinks <= pos < n_seen - window (sinks 4, window 128).
 *   ratio R (default 0.5) or tokens N: the layer keeps
 *   n_kv * B(n_seen) entries, B = n_seen - floor(R n_seen) or N (pressure
 *   applied), protected ones included: one top-k over the candidates of all
 *   heads (kvpress FastKVzipPress(layerwise=True): heads get non-uniform
 *   budgets).  threshold F: candidates with score < F (or NaN) dropped.
 */
#include "learned.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define FKV_DEF_WINDOW 128u
#define FKV_DEF_SINKS 4u
#define FKV_DEF_EVERY 128u
#define FKV_DEF_RATIO 0.5

struct fkv_layer {
	const float *Wq, *cq, *Wk, *gq, *gk, *sinks, *bias;
};

struct fkv {
	struct weights *w;
	uint32_t dp, S;
	struct fkv_layer *l; /* [n_layers] */
};

static void fkv_fini(struct policy *p)
{
	struct fkv *f = p->priv;
	if (!f)
		return;
	weights_free(f->w);
	free(f->l);
	free(f);
	p->priv = NULL;
}

static int fkv_init(struct policy *p, char *err, size_t errlen)
{
	struct policy_args *a = &p->args;
	const struct policy_geom *g = &p->geom;
	if (!(a->set & POLICY_KEY_WINDOW))
		a->window = FKV_DEF_WINDOW;
	if (!(a->set & POLICY_KEY_SINKS))
		a->sinks = FKV_DEF_SINKS;
	if (!(a->set & POLICY_KEY_EVERY))
		a->every = FKV_DEF_EVERY;
	if (!(a->set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO |
	                POLICY_KEY_THRESHOLD))) {
		a->ratio = FKV_DEF_RATIO;
		a->set |= POLICY_KEY_RATIO;
	}
	p->entry_floats = 1;

	struct fkv *f = calloc(1, sizeof(*f));
	if (!f)
		return KVT_ENOMEM;
	p->priv = f;
	int rc = learned_load(p, &f->w, err, errlen);
	if (rc)
		return rc;
	if ((rc = learned_dim(p, "fastkvzip.0.q_norm.weight", 1, 0, 65536,
	                      &f->dp, err, errlen)) ||
	    (rc = learned_dim(p, "fastkvzip.0.k_base", 4, 2, 65536, &f->S, err,
	                      errlen)) ||
	    (rc = learned_layers_fit(p, f->w, "fastkvzip.%u.q_proj.weight",
	                             err, errlen)))
		return rc;
	if (!(f->l = calloc(g->n_layers, sizeof(*f->l))))
		return KVT_ENOMEM;
	uint64_t nkv = g->n_kv_heads, G = g->n_heads / g->n_kv_heads;
	uint64_t dp = f->dp, S = f->S, d = g->d_model;
	uint64_t swq[2] = {nkv * G * dp, d}, scq[1] = {nkv * G * dp};
	uint64_t swk[2] = {nkv * dp, d}, sg[1] = {dp};
	uint64_t ssk[4] = {nkv, 1, S, dp}, sb[3] = {nkv, 1, G};
	for (uint32_t l = 0; l < g->n_layers; l++) {
		struct fkv_layer *fl = &f->l[l];
		if (!(fl->Wq = learned_get(p, f->w, err, errlen, 2, swq,
		                           "fastkvzip.%u.q_proj.weight", l)) ||
		    !(fl->cq = learned_get(p, f->w, err, errlen, 1, scq,
		                           "fastkvzip.%u.q_proj.bias", l)) ||
		    !(fl->Wk = learned_get(p, f->w, err, errlen, 2, swk,
		                           "fastkvzip.%u.k_proj.weight", l)) ||
		    !(fl->gq = learned_get(p, f->w, err, errlen, 1, sg,
		                           "fastkvzip.%u.q_norm.weight", l)) ||
		    !(fl->gk = learned_get(p, f->w, err, errlen, 1, sg,
		                           "fastkvzip.%u.k_norm.weight", l)) ||
		    !(fl->sinks = learned_get(p, f->w, err, errlen, 4, ssk,
		                              "fastkvzip.%u.k_base", l)) ||
		    !(fl->bias = learned_get(p, f->w, err, errlen, 3, sb,
		                             "fastkvzip.%u.b", l)))
			return KVT_EPOLICY;
	}
	return 0;
}

static int fkv_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	const struct fkv *f = p->priv;
	uint32_t nkv = ge->n_kv_heads, G = ge->n_heads / nkv, n = l->n_new;
	if (n) {
		const struct fkv_layer *fl = &f->l[l->layer];
		float *s = policy_scratch(p, (size_t)n * nkv * sizeof(float));
		float *sc = policy_scratch(p, (size_t)n * nkv * (G + 1) *
		                                 f->dp * sizeof(float));
		if (!s || !sc)
			return KVT_ENOMEM;
		sink_gate_cpu(l->x, n, ge->d_model, nkv, G, f->dp, f->S,
		              fl->Wq, fl->cq, fl->Wk, fl->gq, fl->gk,
		              fl->sinks, fl->bias, s, sc);
		for (uint32_t g = 0; g < nkv; g++) {
			struct policy_head *h = &l->heads[g];
			for (uint32_t k = 0; k < n && k < h->len; k++)
				h->ent[h->len - n + k] = s[(size_t)k * nkv + g];
		}
	}
	if (l->phase == KVT_PHASE_DECODE && !policy_due(p, l))
		return 0;
	if (p->args.set & POLICY_KEY_THRESHOLD) {
		for (uint32_t g = 0; g < nkv; g++) {
			int rc = policy_select(p, l, &l->heads[g],
			                       l->heads[g].ent, NULL);
			if (rc < 0)
				return rc;
		}
		return 0;
	}
	/* One top-k over every head's entries of the layer. */
	size_t total = 0;
	for (uint32_t g = 0; g < nkv; g++)
		total += l->heads[g].len;
	float *s = policy_scratch(p, (total + 1) * sizeof(float));
	uint32_t *rank = policy_scratch(p, (total + 1) * sizeof(uint32_t));
	uint32_t *sc = policy_scratch(p, (total + 1) * sizeof(uint32_t));
	uint8_t *prot = policy_scratch(p, total + 1);
	uint8_t *drop = policy_scratch(p, total + 1);
	if (!s || !rank || !sc || !prot || !drop)
		return KVT_ENOMEM;
	size_t o = 0, np = 0;
	for (uint32_t g = 0; g < nkv; g++) {
		const struct policy_head *h = &l->heads[g];
		for (uint32_t i = 0; i < h->len; i++, o++) {
			s[o] = h->ent[i];
			rank[o] = h->pos[i];
			prot[o] = (uint8_t)policy_protected(&p->args, h->pos[i],
			                                    l->n_seen);
			np += prot[o];
		}
	}
	uint64_t b = (uint64_t)policy_budget(p, l->n_seen) * nkv;
	uint32_t k = b > np ? (uint32_t)(b - np < total ? b - np : total) : 0;
	select_topk_cpu(s, rank, prot, (uint32_t)total, k, drop, sc);
	o = 0;
	for (uint32_t g = 0; g < nkv; g++) {
		memcpy(l->heads[g].drop, drop + o, l->heads[g].len);
		o += l->heads[g].len;
	}
	return 0;
}

const struct policy_ops fastkvzip_ops = {
	.name = "fastkvzip",
	.help = "Fast KVzip: sink-attention gate on x, layer-wide top-k or "
	        "threshold (model=PATH, ratio=0.5 | tokens=N | threshold=F, "
	        "window=128, sinks=4, every=128)",
	.needs = POLICY_NEED_X,
	.keys = POLICY_KEY_MODEL | POLICY_KEY_RATIO | POLICY_KEY_TOKENS |
	        POLICY_KEY_THRESHOLD | POLICY_KEY_WINDOW | POLICY_KEY_SINKS |
	        POLICY_KEY_EVERY,
	.tau = POLICY_TAU_PROB,
	.init = fkv_init,
	.fini = fkv_fini,
	.decide = fkv_decide,
};
