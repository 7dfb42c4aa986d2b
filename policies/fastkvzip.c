/*
 * fastkvzip.c — Fast KVzip: a low-rank sink-attention gate on the
 * attention input x scores each entry in (0, 1) at arrival (the score
 * depends on x_i only, so scoring at arrival gives the paper's numbers
 * without keeping x); evictions keep the best-scored entries of the layer
 * (all KV heads compete for one budget, as kvpress's layerwise press) or
 * drop those below a threshold, outside the sinks and the recent window.
 * The rule, timing and defaults: docs/policies.md, **fastkvzip**.
 */
#include "learned.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "fastkvzip_rule.h"
#include "kernels.h"

#define FKV_DEF_WINDOW 128u
#define FKV_DEF_SINKS 4u
#define FKV_DEF_EVERY 128u
#define FKV_DEF_RATIO 0.5

struct fkv_layer {
	const float *Wq, *cq, *Wk, *gq, *gk, *sinks, *bias;
};

struct fkv {
	struct learned_priv lp; /* layers: struct fkv_layer [n_layers] */
	uint32_t dp, S;
};

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

	int rc = learned_open(p, sizeof(struct fkv), err, errlen);
	struct fkv *f = p->priv;
	if (rc)
		return rc;
	if ((rc = learned_dim(p, "fastkvzip.0.q_norm.weight", 1, 0, 65536,
	                      &f->dp, err, errlen)) ||
	    (rc = learned_dim(p, "fastkvzip.0.k_base", 4, 2, 65536, &f->S, err,
	                      errlen)) ||
	    (rc = learned_layers_fit(p, f->lp.w, "fastkvzip.%u.q_proj.weight",
	                             err, errlen)))
		return rc;
	uint64_t nkv = g->n_kv_heads, G = g->n_heads / g->n_kv_heads;
	uint64_t dp = f->dp, S = f->S, d = g->d_model;
	const struct learned_tensor t[] = {
		{"fastkvzip.%u.q_proj.weight", 2, {nkv * G * dp, d},
		 offsetof(struct fkv_layer, Wq)},
		{"fastkvzip.%u.q_proj.bias", 1, {nkv * G * dp},
		 offsetof(struct fkv_layer, cq)},
		{"fastkvzip.%u.k_proj.weight", 2, {nkv * dp, d},
		 offsetof(struct fkv_layer, Wk)},
		{"fastkvzip.%u.q_norm.weight", 1, {dp},
		 offsetof(struct fkv_layer, gq)},
		{"fastkvzip.%u.k_norm.weight", 1, {dp},
		 offsetof(struct fkv_layer, gk)},
		{"fastkvzip.%u.k_base", 4, {nkv, 1, S, dp},
		 offsetof(struct fkv_layer, sinks)},
		{"fastkvzip.%u.b", 3, {nkv, 1, G}, offsetof(struct fkv_layer, bias)},
	};
	return learned_get_layers(p, sizeof(struct fkv_layer), t,
	                          sizeof(t) / sizeof(t[0]), err, errlen);
}

size_t fastkvzip_gate_scratch(const struct policy *p, uint32_t n)
{
	const struct policy_geom *ge = &p->geom;
	const struct fkv *f = p->priv;
	return (size_t)n * ge->n_kv_heads *
	       (ge->n_heads / ge->n_kv_heads + 1) * f->dp;
}

void fastkvzip_gate(const struct policy *p, uint32_t layer, const float *x,
                    uint32_t n, float *score, float *scratch)
{
	const struct policy_geom *ge = &p->geom;
	const struct fkv *f = p->priv;
	const struct fkv_layer *fl = learned_layer(p, layer);
	uint32_t nkv = ge->n_kv_heads;
	sink_gate_cpu(x, n, ge->d_model, nkv, ge->n_heads / nkv, f->dp, f->S,
	              fl->Wq, fl->cq, fl->Wk, fl->gq, fl->gk, fl->sinks,
	              fl->bias, score, scratch);
}

static void fkv_scorer(const struct policy *p, uint32_t layer,
                       struct kvt_backend_scorer *out, const float **w)
{
	const struct policy_geom *ge = &p->geom;
	const struct fkv *f = p->priv;
	const struct fkv_layer *fl = learned_layer(p, layer);
	*out = (struct kvt_backend_scorer){
		.kind = KVT_SCORER_SINK_GATE, .d_in = ge->d_model,
		.d_out = ge->n_kv_heads, .G = ge->n_heads / ge->n_kv_heads,
		.dp = f->dp, .S = f->S,
	};
	const float *t[KVT_SCORER_TENSORS] = {fl->Wq, fl->cq, fl->Wk, fl->gq,
	                                      fl->gk, fl->sinks, fl->bias};
	for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++)
		w[k] = t[k];
}

static int fkv_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	uint32_t nkv = ge->n_kv_heads, n = l->n_new;
	if (n && l->pre) {
		policy_take_pre(p, l);
	} else if (n) {
		float *s = policy_scratch(p, (size_t)n * nkv * sizeof(float));
		float *sc = policy_scratch(p, fastkvzip_gate_scratch(p, n) *
		                                 sizeof(float));
		if (!s || !sc)
			return KVT_ENOMEM;
		fastkvzip_gate(p, l->layer, l->x, n, s, sc);
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

/* policy.h: the device runs the layer-wide top-k or the threshold, for
 * the KV heads a job holds. */
static int fkv_supports(const struct policy *p)
{
	return p->geom.n_kv_heads <= FASTKVZIP_RULE_MAX_KV;
}

/*
 * The most entries of any one list that a threshold selection at this
 * sync can drop, O(1): those it is the first to judge (a list drops at
 * most its length of them).  A selection drops every unprotected entry
 * below the threshold, and the scores are fixed at arrival, so an entry
 * that an earlier selection saw unprotected and kept stays above it while
 * the threshold does not rise (pressure raises it: then every unprotected
 * entry is judged again).  The last selection came at or after m, the
 * last multiple of every at or below the tokens seen before this sync (the
 * sync that crossed m selected: a decode sync crossing a multiple is due,
 * a prefill sync always selects; every 0: each sync selects, m is the
 * previous sync's end), and saw the positions below m - window
 * unprotected; so only the positions in [max(sinks, m - window), n_seen -
 * window) can drop, at most one entry each.
 */
static uint64_t fkv_thr_bound(const struct policy *p,
                              const struct policy_layer *l)
{
	const uint64_t win = p->args.window, e = p->args.every;
	const uint64_t prev = l->n_seen - l->n_new;
	uint64_t lo = p->args.sinks;
	if (!(p->pressure > 0.0f)) {
		const uint64_t m = e ? prev / e * e : prev;
		lo = m > win && m - win > lo ? m - win : lo;
	}
	const uint64_t hi = l->n_seen > win ? l->n_seen - win : 0;
	return hi > lo ? hi - lo : 0;
}

/* policy.h: one record per (sequence, layer), two halves of every KV
 * head's cap positions and cap scores, fastkvzip_rule.h's layout. */
static void fkv_shape(const struct policy *p, uint32_t cap,
                      struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){
		.records = 1,
		.record_bytes = 2 * (size_t)p->geom.n_kv_heads * cap * 2 *
		                sizeof(float),
		.positions = 1, .list_bytes = (size_t)cap * 2 * sizeof(float),
	};
}

/*
 * policy.h: a job per (sequence, layer) at a sync with new entries (its
 * lists' states carried, and the selection where fkv_decide selects).
 * The drops are the layer's entries beyond the budget the unprotected
 * ones get, or those below the threshold, known where the scores are:
 * n_drop is the bound (drop_bound), entries - budget x KV heads (exact
 * when the budget covers the protected) or fkv_thr_bound's over the
 * lists, O(KV heads), no pass over the lists.
 */
static int fkv_plan(const struct policy *p, const struct policy_layer *l,
                    const struct policy_dev_layer *c, void *jobs,
                    struct policy_dev_job *hj, uint32_t *n, char *err,
                    size_t errlen)
{
	const uint32_t nkv = p->geom.n_kv_heads;
	*n = 0;
	if (!l->n_new)
		return 0;
	if (nkv > FASTKVZIP_RULE_MAX_KV) {
		snprintf(err, errlen, "fastkvzip: %u KV heads, a job holds %u",
		         nkv, FASTKVZIP_RULE_MAX_KV);
		return KVT_ESYS;
	}
	struct fastkvzip_rule_job *bj = jobs;
	*bj = (struct fastkvzip_rule_job){
		.pre = c->pre, .record = c->state_rec, .cur = c->cur[0],
		.nn = l->n_new, .n_seen = l->n_seen, .drop_off = c->drop_off,
	};
	const int thr = !!(p->args.set & POLICY_KEY_THRESHOLD);
	const int sel = l->phase != KVT_PHASE_DECODE || policy_due(p, l);
	const uint64_t r = thr && sel ? fkv_thr_bound(p, l) : 0;
	uint64_t total = 0, tb = 0;
	for (uint32_t g = 0; g < nkv; g++) {
		const uint64_t L = (uint64_t)c->len[g] + l->n_new;
		bj->lens[g] = c->len[g];
		total += L;
		tb += r < L ? r : L;
	}
	const uint32_t bud = thr ? UINT32_MAX : policy_budget(p, l->n_seen);
	const uint64_t b = (uint64_t)bud * nkv;
	const uint64_t bound = thr ? tb
	                       : sel && bud != UINT32_MAX && total > b
	                       ? total - b : 0;
	bj->len = (uint32_t)total;
	bj->budget = bud == UINT32_MAX || b > UINT32_MAX ? UINT32_MAX
	                                                 : (uint32_t)b;
	bj->due = bound != 0;
	bj->n_drop = (uint32_t)bound;
	hj[0] = (struct policy_dev_job){
		.rec = c->state_rec, .g = POLICY_DEV_LAYER, .L = (uint32_t)total,
		.n_drop = (uint32_t)bound, .drop_off = c->drop_off,
	};
	*n = 1;
	return 0;
}

static void fkv_params(const struct policy *p, const struct policy_dev_bufs *b,
                       void *out)
{
	*(struct fastkvzip_rule *)out = (struct fastkvzip_rule){
		.state = b->state, .cap = b->cap, .sinks = p->args.sinks,
		.window = p->args.window,
		.threshold = !!(p->args.set & POLICY_KEY_THRESHOLD),
		.tau = policy_threshold(p),
	};
}

static const struct policy_device_rule fkv_device = {
	.name = "fastkvzip", .version = FASTKVZIP_RULE_VERSION,
	.params_bytes = sizeof(struct fastkvzip_rule),
	.job_bytes = sizeof(struct fastkvzip_rule_job),
	.supports = fkv_supports, .shape = fkv_shape, .plan = fkv_plan,
	.params = fkv_params, .takes_pre = 1, .drop_bound = 1,
};

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
	.fini = learned_fini,
	.decide = fkv_decide,
	.scorer = fkv_scorer,
	.device = &fkv_device,
};
