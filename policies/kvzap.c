/*
 * kvzap.c — KVzap (kvpress DMSPress(KVzapPress)): a linear or MLP surrogate
 * predicts, from the attention input x of each new token, the log KVzip+
 * score of its entry in every KV head; an entry is evicted when it leaves
 * the recent window with a predicted score below the threshold, decided
 * once.
 *
 * Rule (docs/policies.md):
 *   arrival: y = W x + b (linear) or W2 gelu(W1 x + b1) + b2 (MLP, erf
 *   GELU), y in R^{n_kv}; entry state = y[g] for head g.
 *   decision: an entry leaves the window at the sync where
 *   n_seen - n_new <= pos + window < n_seen; it is then dropped iff
 *   !(score >= tau) (strict <, NaN dropped) and pos >= sinks (default 0).
 *   Entries that stayed are never revisited (pressure raises tau only for
 *   later decisions).  Defaults window 128, threshold -4.
 * Weights (docs/weights.md): kvpress checkpoint directories as they are
 * (layers.{l}.weight/bias; layers.{l}.0.* and layers.{l}.2.*), or our names
 * kvzap.{l}.weight/bias and kvzap.{l}.fc1.* / kvzap.{l}.fc2.*.
 */
#include "learned.h"

#include <stddef.h>
#include <stdio.h>

#include "kernels.h"
#include "kvzap_rule.h"

#define KVZAP_DEF_WINDOW 128u
#define KVZAP_DEF_THRESHOLD (-4.0f)

/* o1 = hidden (MLP) or n_kv (linear) */
struct kvzap_layer {
	const float *W1, *b1; /* [o1][d_model], [o1] */
	const float *W2, *b2; /* [n_kv][hidden], [n_kv]; MLP only */
};

struct kvzap {
	struct learned_priv lp; /* layers: struct kvzap_layer [n_layers] */
	uint32_t hidden; /* 0: linear */
};

/* The four naming schemes, by layer-0 probe name. */
static const struct {
	const char *probe;              /* layer 0 weight that identifies it */
	const char *w1, *b1, *w2, *b2;  /* formats with %u = layer */
	int mlp;
} schemes[] = {
	{"layers.0.0.weight", "layers.%u.0.weight", "layers.%u.0.bias",
	 "layers.%u.2.weight", "layers.%u.2.bias", 1},
	{"layers.0.weight", "layers.%u.weight", "layers.%u.bias", NULL, NULL,
	 0},
	{"kvzap.0.fc1.weight", "kvzap.%u.fc1.weight", "kvzap.%u.fc1.bias",
	 "kvzap.%u.fc2.weight", "kvzap.%u.fc2.bias", 1},
	{"kvzap.0.weight", "kvzap.%u.weight", "kvzap.%u.bias", NULL, NULL, 0},
};

static int kvzap_init(struct policy *p, char *err, size_t errlen)
{
	struct policy_args *a = &p->args;
	const struct policy_geom *g = &p->geom;
	if (a->set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO)) {
		snprintf(err, errlen, "kvzap: the budget is a threshold");
		return KVT_EPOLICY;
	}
	if (!(a->set & POLICY_KEY_WINDOW))
		a->window = KVZAP_DEF_WINDOW;
	if (!(a->set & POLICY_KEY_THRESHOLD)) {
		a->threshold = KVZAP_DEF_THRESHOLD;
		a->set |= POLICY_KEY_THRESHOLD;
	}
	p->entry_floats = 1;

	int rc = learned_open(p, sizeof(struct kvzap), err, errlen);
	struct kvzap *z = p->priv;
	if (rc)
		return rc;
	size_t s = 0, ns = sizeof(schemes) / sizeof(schemes[0]);
	while (s < ns && !weights_has(z->lp.w, schemes[s].probe))
		s++;
	if (s == ns) {
		snprintf(err, errlen, "kvzap: model %s: no KVzap tensors (want "
		         "layers.0.weight, layers.0.0.weight, kvzap.0.weight "
		         "or kvzap.0.fc1.weight)", a->model);
		return KVT_EPOLICY;
	}
	uint32_t d = g->d_model, nkv = g->n_kv_heads;
	if (schemes[s].mlp &&
	    (rc = learned_dim(p, schemes[s].probe, 2, 0, UINT32_MAX, &z->hidden,
	                      err, errlen)))
		return rc;
	/* A kvpress config.json, when present, must describe this model. */
	uint32_t v;
	if (!weights_config_u32(z->lp.w, "input_dim", &v) && v != d) {
		snprintf(err, errlen, "kvzap: model %s: input_dim %u, model "
		         "d_model is %u", a->model, v, d);
		return KVT_EPOLICY;
	}
	if (!weights_config_u32(z->lp.w, "output_dim", &v) && v != nkv) {
		snprintf(err, errlen, "kvzap: model %s: output_dim %u, model "
		         "has %u KV heads", a->model, v, nkv);
		return KVT_EPOLICY;
	}
	if ((rc = learned_layers_fit(p, z->lp.w, schemes[s].w1, err, errlen)))
		return rc;
	uint32_t h = z->hidden, out1 = h ? h : nkv;
	const struct learned_tensor t[] = {
		{schemes[s].w1, 2, {out1, d}, offsetof(struct kvzap_layer, W1)},
		{schemes[s].b1, 1, {out1}, offsetof(struct kvzap_layer, b1)},
		{schemes[s].w2, 2, {nkv, h}, offsetof(struct kvzap_layer, W2)},
		{schemes[s].b2, 1, {nkv}, offsetof(struct kvzap_layer, b2)},
	};
	/* The linear scheme has the first two only. */
	return learned_get_layers(p, sizeof(struct kvzap_layer), t, h ? 4 : 2,
	                          err, errlen);
}

static int kvzap_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	const struct kvzap *z = p->priv;
	uint32_t nkv = ge->n_kv_heads, n = l->n_new;
	if (n && l->pre) {
		policy_take_pre(p, l);
	} else if (n) {
		float *y = policy_scratch(p, (size_t)n * nkv * sizeof(float));
		float *hs = policy_scratch(p, (size_t)n * (z->hidden + 1) *
		                                 sizeof(float));
		if (!y || !hs)
			return KVT_ENOMEM;
		const struct kvzap_layer *zl = learned_layer(p, l->layer);
		if (z->hidden)
			scorer_mlp_cpu(l->x, n, ge->d_model, zl->W1, zl->b1,
			               z->hidden, zl->W2, zl->b2, nkv, y, hs);
		else
			scorer_linear_cpu(l->x, n, ge->d_model, zl->W1, zl->b1,
			                  nkv, y);
		for (uint32_t g = 0; g < nkv; g++) {
			struct policy_head *h = &l->heads[g];
			for (uint32_t k = 0; k < n && k < h->len; k++)
				h->ent[h->len - n + k] = y[(size_t)k * nkv + g];
		}
	}
	float tau = policy_threshold(p);
	uint64_t prev = l->n_seen - n, win = p->args.window;
	for (uint32_t g = 0; g < nkv; g++) {
		struct policy_head *h = &l->heads[g];
		uint8_t *prot = policy_scratch(p, h->len + 1);
		if (!prot)
			return KVT_ENOMEM;
		for (uint32_t i = 0; i < h->len; i++) {
			uint64_t pw = h->pos[i] + win;
			prot[i] = !(pw >= prev && pw < l->n_seen) ||
			          h->pos[i] < p->args.sinks;
		}
		select_threshold_cpu(h->ent, prot, h->len, tau, h->drop);
	}
	return 0;
}

static void kvzap_scorer(const struct policy *p, uint32_t layer,
                         struct kvt_backend_scorer *out, const float **w)
{
	const struct kvzap *z = p->priv;
	const struct kvzap_layer *zl = learned_layer(p, layer);
	*out = (struct kvt_backend_scorer){
		.kind = z->hidden ? KVT_SCORER_MLP : KVT_SCORER_LINEAR,
		.d_in = p->geom.d_model, .d_out = p->geom.n_kv_heads,
		.hidden = z->hidden,
	};
	const float *t[KVT_SCORER_TENSORS] = {zl->W1, zl->b1, zl->W2, zl->b2};
	for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++)
		w[k] = t[k];
}

/* policy.h: per list record two halves of cap positions and cap scores,
 * kvzap_rule.h's layout. */
static void kvzap_shape(const struct policy *p, uint32_t cap,
                        struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){
		.records = p->geom.n_kv_heads,
		.record_bytes = 2 * (size_t)cap * 2 * sizeof(float),
		.positions = 1,
	};
}

/*
 * policy.h: a job per list at a sync with new entries (nothing changes
 * without).  Its drops are the entries that leave the window now below
 * the threshold, known only where the scores are: n_drop is the bound
 * (drop_bound), the positions in [n_seen - n_new - window, n_seen -
 * window) at or above the sinks, at most one entry each; O(1) a list.
 */
static int kvzap_plan(const struct policy *p, const struct policy_layer *l,
                      const struct policy_dev_layer *c, void *jobs,
                      struct policy_dev_job *hj, uint32_t *n, char *err,
                      size_t errlen)
{
	(void)err;
	(void)errlen;
	*n = 0;
	if (!l->n_new)
		return 0;
	const uint64_t win = p->args.window, prev = l->n_seen - l->n_new;
	uint64_t lo = prev > win ? prev - win : 0;
	const uint64_t hi = l->n_seen > win ? l->n_seen - win : 0;
	lo = lo > p->args.sinks ? lo : p->args.sinks;
	const uint64_t leave = hi > lo ? hi - lo : 0;
	struct kvzap_rule_job *bj = jobs;
	uint32_t off = c->drop_off;
	for (uint32_t h = 0; h < p->geom.n_kv_heads; h++) {
		const uint32_t L = c->len[h] + l->n_new;
		const uint32_t nd = leave < L ? (uint32_t)leave : L;
		hj[h] = (struct policy_dev_job){
			.rec = c->state_rec + h, .g = h, .L = L, .n_drop = nd,
			.drop_off = off,
		};
		bj[h] = (struct kvzap_rule_job){
			.pre = c->pre, .record = c->state_rec + h, .g = h,
			.cur = c->cur[h], .len = c->len[h], .n_new = l->n_new,
			.n_seen = l->n_seen, .due = nd != 0, .n_drop = nd,
			.drop_off = off,
		};
		off += nd;
	}
	*n = p->geom.n_kv_heads;
	return 0;
}

static void kvzap_params(const struct policy *p,
                         const struct policy_dev_bufs *b, void *out)
{
	*(struct kvzap_rule *)out = (struct kvzap_rule){
		.state = b->state, .cap = b->cap, .sinks = p->args.sinks,
		.window = p->args.window, .tau = policy_threshold(p),
	};
}

static const struct policy_device_rule kvzap_device = {
	.name = "kvzap", .version = KVZAP_RULE_VERSION,
	.params_bytes = sizeof(struct kvzap_rule),
	.job_bytes = sizeof(struct kvzap_rule_job),
	.shape = kvzap_shape, .plan = kvzap_plan, .params = kvzap_params,
	.takes_pre = 1, .drop_bound = 1,
};

const struct policy_ops kvzap_ops = {
	.name = "kvzap",
	.help = "KVzap: linear/MLP surrogate of log KVzip+ on x, dropped "
	        "below threshold when leaving the window (model=PATH, "
	        "threshold=-4, window=128, sinks=0)",
	.needs = POLICY_NEED_X,
	.keys = POLICY_KEY_MODEL | POLICY_KEY_THRESHOLD | POLICY_KEY_WINDOW |
	        POLICY_KEY_SINKS,
	.tau = POLICY_TAU_LOG,
	.init = kvzap_init,
	.fini = learned_fini,
	.decide = kvzap_decide,
	.scorer = kvzap_scorer,
	.device = &kvzap_device,
};
