/*
 * kvpop.c — KVpop: a fixed total budget, shared out among the lists;
 * each entry is scored once, delay tokens after it arrived, by a learned
 * scorer that sees the token's attention input and the attention the
 * entry received from the delay queries that followed it (trained on the
 * entry's log KVzip+ score, KVzap's target); the lowest-ranked entries of
 * each list beyond its share are evicted.  The paper (arXiv 2607.05061)
 * does not publish the scorer: the one here is kvtrim's choice
 * (docs/policies.md, **kvpop**, has the formulas and the variants
 * measured; docs/weights.md the weights).  s is computed at the sync where
 * the query at position i + delay arrives and never again.  Protected: the
 * entries still in their delay, the sinks and the newest window positions
 * (policy_protected; default min(48, 2 tokens / 5): at small budgets
 * three fifths stay for the shares to hand out, docs/policies.md).
 *
 * The budget: tokens=B a list on average.  Weights with kvpop.share (what
 * kvtrim-train writes) give each (layer, KV head) its share of the free
 * part B - P0 (P0 = sinks + max(window, delay), which every list holds),
 * measured in training as what that list would hold if one threshold on
 * the scores held the same total, at the keep fractions kvpop.share_keep;
 * the list's budget at a sync is P0 + (B - P0) share, water-filled below
 * what the list can hold and rounded by largest remainders over all lists
 * (kvpop_head_budget), the share interpolated in ln phi at the free
 * fraction phi = (B - P0) / (n_seen - P0) (share 1 at phi = 1).  The
 * shares have mean 1 at every fraction (normalised here), so the lists of
 * a sequence together hold exactly n_layers n_kv_heads B entries once
 * full: the memory is known in advance, as the
 * paper promises, while the layers whose entries the scorer rates higher
 * hold more of it.  Weights without kvpop.share: B for every list.
 *
 * With memory=T (default 0: none) an entry past its delay keeps a decayed
 * sum m and count c of the attention each later query pays it (decay
 * exp(-1/T) a query; entry state [a, s, m, c], else [a, s]) and the
 * selection ranks by (K s + c ln(N m / c)) / (K + c), K = trust (default
 * 0), N = KVPOP_HORIZON: measured with the earlier future-attention
 * scorer and kept for that record (docs/policies.md).  memory=learned
 * runs the same cell with each layer's decay and readout from the
 * weights' kvpop.memory (kvtrim-train fits them to the attention of the
 * next 64 queries): rank w_s s + w_f ln(m / c + 1e-6), with the delay's
 * mean a / delay for m / c before a later query has read the entry
 * (KVPOP_READOUT); the device rule runs it too, the table uploaded after
 * the layers' tensors (kvpop_upload).
 */
#include "learned.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_plan.h"
#include "errors.h"
#include "kernels.h"
#include "kvpop_rule.h"

#define KVPOP_DEF_TOKENS 256u
#define KVPOP_DEF_DELAY 32u
#define KVPOP_DEF_SINKS 4u
#define KVPOP_DEF_WINDOW 48u /* at most 2 tokens / 5; docs/policies.md */
#define KVPOP_EPS 1e-6f
#define KVPOP_SHARES_MAX 16u /* keep fractions in kvpop.share */

struct kvpop_layer {
	const float *P, *W1, *b1, *W2, *b2;
};

struct kvpop {
	struct learned_priv lp; /* layers: struct kvpop_layer [n_layers] */
	uint32_t r, m, ring; /* ring: rows of u kept per (sequence, layer) */
	float beta; /* the memory's decay a query, exp(-1 / memory) */
	uint32_t n_f;  /* keep fractions of the shares (0: none) */
	const float *keep; /* [n_f], decreasing in (0, 1): the weights' */
	float *share;  /* [n_f][n_layers][n_kv_heads], mean 1 per fraction */
	/* memory=learned: per layer [n_layers][KVPOP_MEM_FLOATS] its decay
	 * beta = expf(-1 / T_l) (T_l the weights' kvpop.memory decay) and
	 * the readout's w_s and w_f, the device rule's table (kvpop_rule.h):
	 * built once, read by kvpop_decide, copied by kvpop_upload; NULL
	 * otherwise */
	float *mem;
};

uint32_t policy_kvpop_window(uint32_t tokens)
{
	const uint64_t w = 2 * (uint64_t)tokens / 5;
	return w < KVPOP_DEF_WINDOW ? (uint32_t)w : KVPOP_DEF_WINDOW;
}

static void kvpop_fini(struct policy *p)
{
	struct kvpop *k = p->priv;
	if (k) {
		free(k->share);
		free(k->mem);
	}
	learned_fini(p);
}

/*
 * The budget shares of the weights (kvpop.share [n_f][n_layers][n_kv] at
 * kvpop.share_keep [n_f]), both or neither: checked (1 <= n_f <= 16,
 * fractions decreasing in (0, 1), shares >= 0 with a positive sum per
 * fraction) and normalised to mean 1 per fraction in double.
 */
static int kvpop_shares(struct policy *p, char *err, size_t errlen)
{
	struct kvpop *k = p->priv;
	const struct policy_geom *g = &p->geom;
	const int has_s = weights_has(k->lp.w, "kvpop.share"),
	          has_k = weights_has(k->lp.w, "kvpop.share_keep");
	if (!has_s && !has_k)
		return 0;
	if (has_s != has_k) {
		snprintf(err, errlen, "kvpop: %s: kvpop.share and "
		         "kvpop.share_keep come together", p->args.model);
		return KVT_EPOLICY;
	}
	uint32_t n_f;
	int rc = learned_dim(p, "kvpop.share_keep", 1, 0, KVPOP_SHARES_MAX,
	                     &n_f, err, errlen);
	if (rc)
		return rc;
	const uint64_t per = (uint64_t)g->n_layers * g->n_kv_heads;
	const uint64_t ks[1] = {n_f}, ss[3] = {n_f, g->n_layers, g->n_kv_heads};
	const float *kv = learned_get(p, k->lp.w, err, errlen, 1, ks,
	                              "kvpop.share_keep");
	const float *sv = kv ? learned_get(p, k->lp.w, err, errlen, 3, ss,
	                                   "kvpop.share") : NULL;
	if (!sv)
		return KVT_EPOLICY;
	for (uint32_t j = 0; j < n_f; j++)
		if (!(kv[j] > 0.0f && kv[j] < (j ? kv[j - 1] : 1.0f))) {
			snprintf(err, errlen, "kvpop: %s: kvpop.share_keep[%u] = "
			         "%g: the fractions must decrease inside (0, 1)",
			         p->args.model, j, (double)kv[j]);
			return KVT_EPOLICY;
		}
	k->keep = kv;
	if (!(k->share = malloc(sizeof(float) * n_f * per)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	for (uint32_t j = 0; j < n_f; j++) {
		const float *s = sv + j * per;
		double sum = 0;
		for (uint64_t i = 0; i < per; i++) {
			if (!(s[i] >= 0.0f)) {
				snprintf(err, errlen, "kvpop: %s: kvpop.share[%u] "
				         "has a negative share", p->args.model, j);
				return KVT_EPOLICY;
			}
			sum += s[i];
		}
		if (!(sum > 0)) {
			snprintf(err, errlen, "kvpop: %s: kvpop.share[%u] is all "
			         "zero", p->args.model, j);
			return KVT_EPOLICY;
		}
		for (uint64_t i = 0; i < per; i++)
			k->share[j * per + i] =
				(float)((double)s[i] * (double)per / sum);
	}
	k->n_f = n_f;
	return 0;
}

/* The rounding of a layer's budgets (kvpop_head_budget): the segment of
 * the shares at phi (share = lo + t (hi - lo), lo NULL: 1), the free
 * budget a list avail, what a list can hold beyond P0 cap, and the
 * water level lam. */
struct kvpop_fill {
	const float *lo, *hi;
	float t;
	double avail, cap, lam;
};

/* List i's part of the free budget: avail share, raised lam times and
 * cut at cap. */
static double kvpop_part(const struct kvpop_fill *w, size_t i)
{
	const float s0 = w->lo ? w->lo[i] : 1.0f;
	const double x = w->lam * w->avail *
	                 (double)(s0 + w->t * (w->hi[i] - s0));
	return x < w->cap ? x : w->cap;
}

/*
 * The budget of KV head g of layer `layer` after n_seen tokens
 * (UINT32_MAX: none).  With shares: list i's part of the free budget is
 * x_i = (B - P0) share_i(phi), share_i linear in ln phi between the
 * fractions around phi (share 1 at phi = 1, the last fraction's below
 * it), so the x_i sum to the free total F = n_lists (B - P0) (up to
 * rounding).  A part above what a list can hold beyond P0, n_seen - P0,
 * is cut to it and the others raised by one factor until they again sum
 * to F (water filling: F <= n_lists (n_seen - P0) as B <= n_seen), and
 * largest remainders round the parts: every list gets the floor of its
 * part, and the F - (sum of floors) lists with the largest fractional
 * parts (ties: the lower list index, (layer, head) major) one more.  So
 * the lists together hold exactly n_lists B once full, and a list's
 * budget follows from the numbers alone: the host rule and the device
 * plan compute it alike.  O(n_lists) a call, a few times that where
 * parts are cut.
 */
static uint32_t kvpop_head_budget(const struct policy *p, uint32_t layer,
                                  uint32_t g, uint32_t n_seen)
{
	const struct kvpop *k = p->priv;
	const struct policy_args *a = &p->args;
	const uint32_t B = policy_budget(p, n_seen);
	const uint64_t P0 = (uint64_t)a->sinks +
	                    (a->window > a->delay ? a->window : a->delay);
	if (!k->n_f || B == UINT32_MAX || B <= P0 || n_seen <= B)
		return B;
	const float phi = (float)(B - P0) / (float)(n_seen - P0);
	const size_t per = (size_t)p->geom.n_layers * p->geom.n_kv_heads;
	struct kvpop_fill w = {
		.t = 1.0f, .avail = (double)(B - P0),
		.cap = (double)(n_seen - P0), .lam = 1.0,
	};
	float f_hi = 1.0f;
	for (uint32_t j = 0; j < k->n_f; j++) {
		w.hi = k->share + j * per;
		if (phi >= k->keep[j]) {
			w.t = logf(f_hi / phi) / logf(f_hi / k->keep[j]);
			break;
		}
		w.lo = w.hi;
		f_hi = k->keep[j];
	}
	const double F = w.avail * (double)per;
	/* the water level: lam grows, and the set of cut parts with it,
	 * until the set stays */
	for (size_t cut_prev = 0;;) {
		size_t cut = 0;
		double rest = 0;
		for (size_t i = 0; i < per; i++) {
			const double x = kvpop_part(&w, i);
			if (x >= w.cap)
				cut++;
			else
				rest += x / w.lam;
		}
		if (!cut || cut == cut_prev || !(rest > 0))
			break;
		cut_prev = cut;
		w.lam = (F - (double)cut * w.cap) / rest;
	}
	const size_t me = (size_t)layer * p->geom.n_kv_heads + g;
	const double x = kvpop_part(&w, me), fl = floor(x), fr = x - fl;
	double sum = 0;
	size_t above = 0; /* lists whose remainder ranks before mine */
	for (size_t i = 0; i < per; i++) {
		const double xi = kvpop_part(&w, i), fi = floor(xi);
		sum += fi;
		above += i != me && (xi - fi > fr || (xi - fi == fr && i < me));
	}
	const double b = (double)P0 + fl + ((double)above < F - sum ? 1 : 0);
	return b >= (double)(UINT32_MAX - 1) ? UINT32_MAX - 1 : (uint32_t)b;
}

/*
 * memory=learned: the weights' kvpop.memory [n_layers][3], checked (a
 * decay >= 1 token; the loader has refused values that are not finite),
 * into k->mem.
 */
static int kvpop_memory(struct policy *p, char *err, size_t errlen)
{
	struct kvpop *k = p->priv;
	const uint32_t L = p->geom.n_layers;
	const uint64_t shape[2] = {L, 3};
	if (p->args.trust) {
		snprintf(err, errlen, "kvpop: trust=%u weighs the learned "
		         "score against memory=T; memory=learned has its "
		         "weights' readout", p->args.trust);
		return KVT_EPOLICY;
	}
	if (!weights_has(k->lp.w, "kvpop.memory")) {
		snprintf(err, errlen, "kvpop: %s: memory=learned needs the "
		         "weights' kvpop.memory (kvtrim-train writes it)",
		         p->args.model);
		return KVT_EPOLICY;
	}
	const float *w = learned_get(p, k->lp.w, err, errlen, 2, shape,
	                             "kvpop.memory");
	if (!w)
		return KVT_EPOLICY;
	for (uint32_t l = 0; l < L; l++)
		if (!(w[3 * l] >= 1.0f)) {
			snprintf(err, errlen, "kvpop: %s: kvpop.memory[%u]'s "
			         "decay is %g: it must be >= 1 token",
			         p->args.model, l, (double)w[3 * l]);
			return KVT_EPOLICY;
		}
	if (!(k->mem = malloc(sizeof(float) * KVPOP_MEM_FLOATS * L)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	for (uint32_t l = 0; l < L; l++) {
		float *t = k->mem + (size_t)l * KVPOP_MEM_FLOATS;
		t[0] = expf(-1.0f / w[3 * l]);
		t[1] = w[3 * l + 1];
		t[2] = w[3 * l + 2];
	}
	return 0;
}

static int kvpop_init(struct policy *p, char *err, size_t errlen)
{
	struct policy_args *a = &p->args;
	const struct policy_geom *g = &p->geom;
	if (!(a->set & POLICY_KEY_TOKENS))
		a->tokens = KVPOP_DEF_TOKENS;
	if (!(a->set & POLICY_KEY_DELAY))
		a->delay = KVPOP_DEF_DELAY;
	if (!(a->set & POLICY_KEY_SINKS))
		a->sinks = KVPOP_DEF_SINKS;
	if (!(a->set & POLICY_KEY_WINDOW))
		a->window = policy_kvpop_window(a->tokens);
	if ((uint64_t)a->delay + g->headroom > (1u << 20)) {
		snprintf(err, errlen, "kvpop: delay %u is too long", a->delay);
		return KVT_EPOLICY;
	}
	p->entry_floats = KVPOP_ENTRY_FLOATS(a->memory);

	int rc = learned_open(p, sizeof(struct kvpop), err, errlen);
	struct kvpop *k = p->priv;
	if (rc)
		return rc;
	if ((rc = learned_dim(p, "kvpop.0.proj.weight", 2, 0, 65536, &k->r,
	                      err, errlen)) ||
	    (rc = learned_dim(p, "kvpop.0.fc1.weight", 2, 0, 65536, &k->m,
	                      err, errlen)) ||
	    (rc = learned_layers_fit(p, k->lp.w, "kvpop.%u.proj.weight", err,
	                             errlen)))
		return rc;
	if ((rc = kvpop_shares(p, err, errlen)))
		return rc;
	if (a->memory == POLICY_MEMORY_LEARNED &&
	    (rc = kvpop_memory(p, err, errlen)))
		return rc;
	k->ring = a->delay + g->headroom;
	k->beta = a->memory && a->memory != POLICY_MEMORY_LEARNED
	          ? expf(-1.0f / (float)a->memory) : 0.0f;
	p->layer_state_bytes = (size_t)k->ring * k->r * sizeof(float);
	uint64_t r = k->r, m = k->m, nkv = g->n_kv_heads;
	const struct learned_tensor t[] = {
		{"kvpop.%u.proj.weight", 2, {r, g->d_model},
		 offsetof(struct kvpop_layer, P)},
		{"kvpop.%u.fc1.weight", 2, {m, r + 1},
		 offsetof(struct kvpop_layer, W1)},
		{"kvpop.%u.fc1.bias", 1, {m}, offsetof(struct kvpop_layer, b1)},
		{"kvpop.%u.fc2.weight", 2, {nkv, m},
		 offsetof(struct kvpop_layer, W2)},
		{"kvpop.%u.fc2.bias", 1, {nkv}, offsetof(struct kvpop_layer, b2)},
	};
	return learned_get_layers(p, sizeof(struct kvpop_layer), t,
	                          sizeof(t) / sizeof(t[0]), err, errlen);
}

/* s = W2[g] . gelu(W1 [u; f] + b1) + b2[g]; hid: [m] scratch. */
static float kvpop_score(const struct kvpop *k, const struct kvpop_layer *kl,
                         uint32_t g, const float *u, float f, float *hid)
{
	const float inv_sqrt2 = 0.70710678118654752440f;
	uint32_t r = k->r;
	for (uint32_t o = 0; o < k->m; o++) {
		const float *w = kl->W1 + (size_t)o * (r + 1);
		float z = kl->b1[o];
		for (uint32_t c = 0; c < r; c++)
			z += w[c] * u[c];
		z += w[r] * f;
		hid[o] = 0.5f * z * (1.0f + erff(z * inv_sqrt2));
	}
	const float *w2 = kl->W2 + (size_t)g * k->m;
	float s = kl->b2[g];
	for (uint32_t o = 0; o < k->m; o++)
		s += w2[o] * hid[o];
	return s;
}

static int kvpop_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *ge = &p->geom;
	const struct kvpop *k = p->priv;
	const struct kvpop_layer *kl = learned_layer(p, l->layer);
	uint32_t nkv = ge->n_kv_heads, G = ge->n_heads / nkv, n = l->n_new;
	uint32_t d = p->args.delay, prev = l->n_seen - n;
	float *ring = l->state; /* [k->ring][r], row pos % k->ring */
	size_t row_bytes = (size_t)ge->head_dim * kvt_dtype_size(ge->dtype);

	uint32_t *qpos = policy_scratch(p, (n + 1) * sizeof(uint32_t));
	float *hid = policy_scratch(p, (k->m + 1) * sizeof(float));
	if (!qpos || !hid)
		return KVT_ENOMEM;
	if (n) {
		float *u = policy_scratch(p, (size_t)n * k->r * sizeof(float));
		if (!u)
			return KVT_ENOMEM;
		scorer_linear_cpu(l->x, n, ge->d_model, kl->P, NULL, k->r, u);
		for (uint32_t t = 0; t < n; t++) {
			qpos[t] = prev + t;
			memcpy(ring + (size_t)((prev + t) % k->ring) * k->r,
			       u + (size_t)t * k->r, k->r * sizeof(float));
		}
	}
	int due = policy_due(p, l);
	const uint32_t ef = p->entry_floats, T = p->args.memory;
	const float *lm = k->mem ? k->mem + (size_t)KVPOP_MEM_FLOATS * l->layer
	                         : NULL;
	const float beta = lm ? lm[0] : k->beta,
	            K = (float)p->args.trust;
	for (uint32_t g = 0; g < nkv; g++) {
		struct policy_head *h = &l->heads[g];
		uint32_t len = h->len;
		if (!len)
			continue;
		/* Attention from the new queries to the entries still inside
		 * their delay (pos + d >= prev; with a memory, to every entry),
		 * through one-row "pages" that point at their K rows
		 * (attn_band reads K only). */
		if (n && (d || T)) {
			uint32_t *idx = policy_scratch(p, len * sizeof(uint32_t));
			uint32_t *kp = policy_scratch(p, len * sizeof(uint32_t));
			void **rows = policy_scratch(p, len * sizeof(void *));
			if (!idx || !kp || !rows)
				return KVT_ENOMEM;
			uint32_t c = 0;
			for (uint32_t i = 0; i < len; i++) {
				if (!T && (uint64_t)h->pos[i] + d < prev)
					continue;
				idx[c] = i;
				kp[c] = h->pos[i];
				rows[c++] = (char *)h->pages[i / ge->page_tokens] +
				            (size_t)(i % ge->page_tokens) * row_bytes;
			}
			const float *w = c ? policy_attn(p, g, l->q, l->lse,
			                                 qpos, n, rows, 1, kp, c)
			                   : NULL;
			if (c && !w)
				return KVT_ENOMEM;
			for (uint32_t e = 0; e < c; e++) {
				float *acc = &h->ent[(size_t)idx[e] * ef];
				for (uint32_t t = 0; t < n; t++) {
					if (qpos[t] <= kp[e] ||
					    (!T && qpos[t] - kp[e] > d))
						continue;
					float v = 0.0f;
					for (uint32_t j = 0; j < G; j++)
						v += w[((size_t)t * G + j) * c + e];
					v /= (float)G;
					if (qpos[t] - kp[e] <= d) {
						acc[0] += v;
					} else { /* the memory, in query order */
						acc[2] = beta * acc[2] + v;
						acc[3] = beta * acc[3] + 1.0f;
					}
				}
			}
		}
		/* Score the entries whose delay ends in this sync. */
		for (uint32_t i = 0; i < len; i++) {
			uint64_t pd = (uint64_t)h->pos[i] + d;
			if (pd < prev || pd >= l->n_seen)
				continue;
			float *e = &h->ent[(size_t)i * ef];
			const float *u = ring +
			        (size_t)(h->pos[i] % k->ring) * k->r;
			e[1] = kvpop_score(k, kl, g, u, logf(e[0] + KVPOP_EPS),
			                   hid);
		}
		if (!due)
			continue;
		float *s = policy_scratch(p, len * sizeof(float));
		uint8_t *prot = policy_scratch(p, len);
		if (!s || !prot)
			return KVT_ENOMEM;
		for (uint32_t i = 0; i < len; i++) {
			const float *e = &h->ent[(size_t)i * ef];
			s[i] = e[1];
			if (lm) /* the learned readout; before the first
			         * query after the delay, the delay's mean */
				s[i] = KVPOP_READOUT(lm[1], lm[2], e[1], e[0],
				                     e[2], e[3], d);
			else if (T && e[3] > 0.0f)
				s[i] = KVPOP_BLEND(K, e[1], e[2], e[3]);
			prot[i] = (uint64_t)h->pos[i] + d >= l->n_seen;
		}
		int rc = policy_select_budget(p, l, h, s, prot,
		                              kvpop_head_budget(p, l->layer, g,
		                                                l->n_seen));
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* policy.h: the rule kvpop_decide applies, for a device to run it. */
static int kvpop_attn(const struct policy *p, const struct policy_layer *l,
                      struct policy_attn_rule *r)
{
	*r = (struct policy_attn_rule){
		.sinks = p->args.sinks,
		.window = p->args.window, .recent = p->args.delay,
		.budget = policy_budget(p, l->n_seen),
		.due = policy_due(p, l), .delay = p->args.delay,
	};
	return 1;
}

/* policy.h: per list record two halves of cap positions and [a, s] (with
 * a memory [a, s, m, c]), per (sequence, layer) its ring of u rows
 * (kvpop_rule.h's layout). */
static void kvpop_shape(const struct policy *p, uint32_t cap,
                        struct policy_dev_shape *s)
{
	const struct kvpop *k = p->priv;
	*s = (struct policy_dev_shape){
		.records = p->geom.n_kv_heads,
		.record_bytes = 2 * (size_t)cap *
		                (1 + p->entry_floats) * sizeof(float),
		.layer_bytes = (size_t)k->ring * k->r * sizeof(float),
		.positions = 1,
	};
}

/* policy.h: every layer's tensors, in kvpop_rule.h's layout, then with
 * the learned memory its table (k->mem, struct kvpop_rule's mem). */
static int kvpop_upload(const struct policy *p, const struct kvt_backend_ops *o,
                        void *bctx, void **out, char *err, size_t errlen)
{
	const struct kvpop *k = p->priv;
	const uint32_t nkv = p->geom.n_kv_heads, d = p->geom.d_model,
	               L = p->geom.n_layers;
	const uint64_t lf = kvpop_layer_floats(k->r, k->m, d, nkv);
	const uint64_t mf = k->mem ? (uint64_t)L * KVPOP_MEM_FLOATS : 0;
	const size_t bytes = (size_t)((lf * L + mf) * sizeof(float));
	float *h = malloc(bytes ? bytes : 1);
	*out = NULL;
	if (!h)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	for (uint32_t l = 0; l < p->geom.n_layers; l++) {
		const struct kvpop_layer *w = learned_layer(p, l);
		float *dst = h + l * lf;
		const struct {
			const float *src;
			uint64_t n;
		} part[] = {
			{w->P, (uint64_t)k->r * d},
			{w->W1, (uint64_t)k->m * (k->r + 1)}, {w->b1, k->m},
			{w->W2, (uint64_t)nkv * k->m}, {w->b2, nkv},
		};
		for (size_t i = 0; i < sizeof(part) / sizeof(part[0]); i++) {
			memcpy(dst, part[i].src, part[i].n * sizeof(float));
			dst += part[i].n;
		}
	}
	if (mf)
		memcpy(h + lf * L, k->mem, mf * sizeof(float));
	int rc = o->mem_new(bctx, bytes ? bytes : 4, out);
	if (!rc && (rc = o->copy(bctx, *out, h, bytes, NULL))) {
		o->mem_free(bctx, *out);
		*out = NULL;
	}
	free(h);
	if (rc) {
		*out = NULL;
		return errors_fmt(err, errlen, rc, "%s backend: kvpop's weights "
		                  "(%zu bytes): %s", o->name, bytes,
		                  o->last_error());
	}
	return 0;
}

/* policy.h: a job per list that changes, the first with new rows
 * projecting them; the protected tail (the delay, or the window where it
 * is longer) is fixed, so the counts follow from the numbers
 * (policy_attn_count), and so does the band: its delay has not ended
 * before this sync, so every position of it is still in the list; with a
 * memory the band is the whole list. */
static int kvpop_plan(const struct policy *p, const struct policy_layer *l,
                      const struct policy_dev_layer *c, void *jobs,
                      struct policy_dev_job *hj, uint32_t *n, char *err,
                      size_t errlen)
{
	struct policy_attn_rule r;
	(void)kvpop_attn(p, l, &r);
	const uint32_t prev = l->n_seen - l->n_new;
	const uint32_t band = l->n_new && r.delay
	                      ? (prev < r.delay ? prev : r.delay) + l->n_new
	                      : 0;
	const uint32_t tail = r.window > r.delay ? r.window : r.delay;
	struct kvpop_rule_job *bj = jobs;
	uint32_t k = 0, off = c->drop_off, keep;
	for (uint32_t h = 0; h < p->geom.n_kv_heads; h++) {
		r.budget = kvpop_head_budget(p, l->layer, h, l->n_seen);
		if (!policy_attn_list_job(&r, tail, 1, l, c, h, off, &hj[k],
		                          &keep))
			continue;
		bj[k] = (struct kvpop_rule_job){
			.ring = c->ring, .layer = l->layer, .record = hj[k].rec,
			.cur = c->cur[h], .proj = h == 0 && l->n_new,
			.len = c->len[h], .n_new = l->n_new, .n_seen = l->n_seen,
			.n_band = l->n_new && p->args.memory
			          ? c->len[h] + l->n_new : band,
			.due = (uint32_t)policy_attn_due(&r),
			.keep = keep, .n_drop = hj[k].n_drop, .drop_off = off,
		};
		off += hj[k++].n_drop;
	}
	*n = k;
	return 0;
}

static void kvpop_params(const struct policy *p,
                         const struct policy_dev_bufs *b, void *out)
{
	const struct kvpop *k = p->priv;
	const uint64_t lf = kvpop_layer_floats(k->r, k->m, p->geom.d_model,
	                                       p->geom.n_kv_heads);
	*(struct kvpop_rule *)out = (struct kvpop_rule){
		.state = b->state, .u = b->layers, .weights = b->consts,
		.cap = b->cap, .rows = b->rows, .d_model = p->geom.d_model,
		.r = k->r, .m = k->m, .ring = k->ring, .delay = p->args.delay,
		.sinks = p->args.sinks, .window = p->args.window,
		.memory = p->args.memory,
		.beta = k->beta, /* kvpop_decide's, so both rules decay alike */
		.trust = (float)p->args.trust,
		/* the learned memory's table, after the layers (kvpop_upload) */
		.mem = k->mem ? (const float *)b->consts + lf * p->geom.n_layers
		              : NULL,
	};
}

static const struct policy_device_rule kvpop_device = {
	.name = "kvpop", .version = KVPOP_RULE_VERSION,
	.params_bytes = sizeof(struct kvpop_rule),
	.job_bytes = sizeof(struct kvpop_rule_job),
	.shape = kvpop_shape, .upload = kvpop_upload, .plan = kvpop_plan,
	.params = kvpop_params,
};

const struct policy_ops kvpop_ops = {
	.name = "kvpop",
	.help = "KVpop: learned delayed scorer on x + attention received, "
	        "a fixed total budget shared out among the lists by the "
	        "weights' learned shares (model=PATH, tokens=256 a list on "
	        "average, delay=32, sinks=4, window=min(48, 2 tokens/5), "
	        "memory=0 (decay tokens of a memory of the attention paid, "
	        "or learned: the weights' decay and readout), "
	        "trust=0, every=N)",
	.needs = POLICY_NEED_X | POLICY_NEED_Q | POLICY_NEED_LSE |
	         POLICY_NEED_KV,
	.keys = POLICY_KEY_MODEL | POLICY_KEY_TOKENS | POLICY_KEY_DELAY |
	        POLICY_KEY_SINKS | POLICY_KEY_WINDOW | POLICY_KEY_EVERY |
	        POLICY_KEY_MEMORY | POLICY_KEY_TRUST,
	.init = kvpop_init,
	.fini = kvpop_fini,
	.decide = kvpop_decide,
	.device = &kvpop_device,
};
