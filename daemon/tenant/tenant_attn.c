/*
 * tenant_attn.c — the attention-based rules run on the device (a policy's
 * policy_ops.attn, run by the backend's device rule of the same name,
 * struct kvt_backend_rule: h2o and observed_attention by "h2o", tova by
 * "tova", kvpop by "kvpop"; their params and jobs in policies/<name>_rule.h),
 * so a sync moves the decisions (a job per list up, a flag, a count and
 * the drop indices down), not the lists' keys.  The tenant looks its rule
 * up once and checks its layout against the headers it was built with; a
 * backend without the rule leaves the decisions to the host.
 *
 * The per-entry state lives in device memory, two halves a record: a sync
 * reads the current half and writes the other, and the sync's commit flips
 * them (tenant_attn_commit), so a refused sync leaves no trace.  A record
 * is a list, or for TOVA a (sequence, layer).  Such a tenant's syncs go to
 * the device from the first one, so the host's entry and layer states are
 * never used.  The host works out each job's drop count from its own
 * positions and checks the device's against it; a row the device finds
 * not finite sends its (sequence, layer) to the host path, which refuses
 * the sync with the cpu backend's reason (docs/cuda.md, "Wiring").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "h2o_rule.h"
#include "kvpop_rule.h"
#include "log.h"
#include "policy.h"
#include "tenant_int.h"
#include "tova_rule.h"

static uint32_t group(const struct tenant *t)
{
	return t->g.n_heads / t->g.n_kv_heads;
}

/* The device rule of each kind, as this daemon was built: its name and
 * the layout of its params and jobs (the rule's header). */
static const struct {
	const char *name;
	uint32_t version, params_bytes, job_bytes;
} rule_layout[] = {
	[POLICY_ATTN_H2O] = {"h2o", H2O_RULE_VERSION, sizeof(struct h2o_rule),
	                     sizeof(struct h2o_rule_job)},
	[POLICY_ATTN_TOVA] = {"tova", TOVA_RULE_VERSION,
	                      sizeof(struct tova_rule),
	                      sizeof(struct tova_rule_job)},
	[POLICY_ATTN_KVPOP] = {"kvpop", KVPOP_RULE_VERSION,
	                       sizeof(struct kvpop_rule),
	                       sizeof(struct kvpop_rule_job)},
};

/* The rule of the tenant's policy (at a sync with nothing seen): 1 when
 * it has one a device can run (KVpop's: with its weights), else 0. */
static int attn_rule(const struct tenant *t, struct policy_attn_rule *r)
{
	const struct policy *p = t->pol;
	struct policy_layer pl = {0};
	if (!p->ops->attn || !p->ops->attn(p, &pl, r))
		return 0;
	if ((size_t)r->kind >= sizeof(rule_layout) / sizeof(rule_layout[0]))
		return 0;
	return r->kind != POLICY_ATTN_KVPOP || p->ops->pop_weights;
}

/* The backend's device rule of kind into *out: NULL when the backend has
 * none of its name (the host decides); KVT_ENOTSUP with the reason when
 * its layout is not the one this daemon was built with. */
static int attn_lookup(const struct tenant *t, int kind,
                       const struct kvt_backend_rule **out, char *err,
                       size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	const struct kvt_backend_rule *b =
		o->rule ? o->rule(rule_layout[kind].name) : NULL;
	*out = NULL;
	if (!b || !b->run)
		return 0;
	if (b->version != rule_layout[kind].version ||
	    b->params_bytes != rule_layout[kind].params_bytes ||
	    b->job_bytes != rule_layout[kind].job_bytes)
		return errors_fmt(err, errlen, KVT_ENOTSUP, "the %s backend's "
		                  "device rule %s has layout version %u (params "
		                  "%u, job %u bytes), this kvtrimd's %u (%u, %u "
		                  "bytes): a backend library of another build",
		                  o->name, rule_layout[kind].name, b->version,
		                  b->params_bytes, b->job_bytes,
		                  rule_layout[kind].version,
		                  rule_layout[kind].params_bytes,
		                  rule_layout[kind].job_bytes);
	*out = b;
	return 0;
}

/* KVpop's widths (r, m: the same in every layer) and layer 0's tensors. */
static struct policy_pop_weights pop_dims(const struct policy *p)
{
	struct policy_pop_weights w;
	p->ops->pop_weights(p, 0, &w);
	return w;
}

/* KVpop's tensors of every layer of p, in its device rule's layout
 * (kvpop_rule.h), copied to a new device buffer *out. */
static int pop_upload(struct tenant *t, const struct policy *p, void **out,
                      char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	const uint32_t nkv = t->g.n_kv_heads, d = p->geom.d_model;
	struct policy_pop_weights w = pop_dims(p);
	const uint64_t lf = kvpop_layer_floats(w.r, w.m, d, nkv);
	const size_t bytes = (size_t)(lf * t->g.n_layers * sizeof(float));
	float *h = malloc(bytes ? bytes : 1);
	if (!h)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	for (uint32_t l = 0; l < t->g.n_layers; l++) {
		p->ops->pop_weights(p, l, &w);
		float *dst = h + l * lf;
		const struct {
			const float *src;
			uint64_t n;
		} part[] = {
			{w.P, (uint64_t)w.r * d}, {w.W1, (uint64_t)w.m * (w.r + 1)},
			{w.b1, w.m}, {w.W2, (uint64_t)nkv * w.m}, {w.b2, nkv},
		};
		for (size_t k = 0; k < sizeof(part) / sizeof(part[0]); k++) {
			memcpy(dst, part[k].src, part[k].n * sizeof(float));
			dst += part[k].n;
		}
	}
	int rc = o->mem_new(t->bctx, bytes ? bytes : 4, out);
	if (!rc && (rc = o->copy(t->bctx, *out, h, bytes, NULL))) {
		o->mem_free(t->bctx, *out);
		*out = NULL;
	}
	free(h);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: kvpop's weights "
		                  "(%zu bytes): %s", o->name, bytes,
		                  o->last_error());
	return 0;
}

static void attn_free_device(struct tenant *t)
{
	const struct kvt_backend_ops *o = t->bops;
	void *dev[] = {t->attn.state, t->attn.u, t->attn.weights};
	for (size_t k = 0; k < sizeof(dev) / sizeof(dev[0]); k++)
		if (dev[k])
			o->mem_free(t->bctx, dev[k]);
	t->attn.state = t->attn.u = t->attn.weights = NULL;
	free(t->attn.cur);
	free(t->attn.start);
	t->attn.cur = NULL;
	t->attn.start = NULL;
}

/* The state records of one sequence slot (TOVA: one per layer; the
 * others: one per list) and the bytes of one record, both halves. */
static uint32_t slot_records(const struct tenant *t, int kind)
{
	return kind == POLICY_ATTN_TOVA ? t->g.n_layers : t->lists_per_seq;
}

static size_t record_bytes(const struct tenant *t, int kind)
{
	const uint32_t floats = kind == POLICY_ATTN_H2O ? group(t)
	                        : kind == POLICY_ATTN_KVPOP ? 2 : 0;
	return 2 * (size_t)t->g.max_tokens * (1 + floats) * sizeof(float);
}

/* The bytes of one (sequence, layer)'s u ring (KVpop). */
static size_t ring_bytes(const struct tenant *t,
                         const struct policy_attn_rule *r)
{
	return (size_t)(r->delay + t->g.headroom) * pop_dims(t->pol).r *
	       sizeof(float);
}

int tenant_attn_init(struct tenant *t, char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	struct policy_attn_rule r;
	if (!t->dsync.dbases || !t->dstage.chunk.base || !o->mem_new || !o->mem_free ||
	    !attn_rule(t, &r))
		return 0;
	int rc = attn_lookup(t, (int)r.kind, &t->attn.rule, err, errlen);
	if (rc || !t->attn.rule)
		return rc;
	const struct shm_geom *g = &t->g;
	t->attn.kind = (int)r.kind;
	size_t nrec = (size_t)g->max_seqs * slot_records(t, t->attn.kind);
	size_t bytes = nrec * record_bytes(t, t->attn.kind);
	t->attn.cur = calloc(nrec ? nrec : 1, 1);
	t->attn.start = calloc((size_t)g->max_seqs * g->n_layers + 1,
	                   sizeof(*t->attn.start));
	if (!t->attn.cur || !t->attn.start)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	/* Device memory outside the pool, like the device table: when it is
	 * not to be had, the tenant still registers and decides on the host
	 * (its keys then cross, as before this path existed). */
	char why[256] = "";
	rc = o->mem_new(t->bctx, bytes ? bytes : 4, &t->attn.state);
	if (rc) {
		t->attn.state = NULL;
		snprintf(why, sizeof(why), "%zu bytes of entry states: %s",
		         bytes, o->last_error());
	} else if (r.kind == POLICY_ATTN_KVPOP) {
		if (!(rc = pop_upload(t, t->pol, &t->attn.weights, why,
		                      sizeof(why)))) {
			size_t ub = (size_t)g->max_seqs * g->n_layers *
			            ring_bytes(t, &r);
			if ((rc = o->mem_new(t->bctx, ub ? ub : 4,
			                     (void **)&t->attn.u))) {
				t->attn.u = NULL;
				snprintf(why, sizeof(why), "%zu bytes of u rings: "
				         "%s", ub, o->last_error());
			}
		}
	}
	if (rc) {
		LOG(LOG_LVL_WARNING, "tenant %s: no device memory for %s's "
		    "state (%s); it decides on the host", t->name,
		    t->pol->ops->name, why);
		attn_free_device(t);
	}
	return 0;
}

int tenant_attn_fork(struct tenant *t, uint32_t dst, uint32_t src)
{
	if (!t->attn.state)
		return 0;
	const struct kvt_backend_ops *o = t->bops;
	const uint32_t per = slot_records(t, t->attn.kind), nl = t->g.n_layers;
	const size_t rb = (size_t)per * record_bytes(t, t->attn.kind);
	char *st = t->attn.state;
	if (o->copy(t->bctx, st + dst * rb, st + src * rb, rb, t->dsync.stream))
		return KVT_ESYS;
	memcpy(t->attn.cur + (size_t)dst * per, t->attn.cur + (size_t)src * per, per);
	memcpy(t->attn.start + (size_t)dst * nl, t->attn.start + (size_t)src * nl,
	       nl * sizeof(*t->attn.start));
	struct policy_attn_rule r;
	if (t->attn.u && attn_rule(t, &r)) {
		const size_t ub = nl * ring_bytes(t, &r);
		char *u = (char *)t->attn.u;
		if (o->copy(t->bctx, u + dst * ub, u + src * ub, ub,
		            t->dsync.stream))
			return KVT_ESYS;
	}
	return 0;
}

int tenant_attn_reload(struct tenant *t, const struct policy *np, char *err,
                       size_t errlen)
{
	if (!t->attn.state || t->attn.kind != POLICY_ATTN_KVPOP)
		return 0;
	/* u's width is the same: tenant_reload_policy refused a change of
	 * the layer state (delay + headroom rows of r floats) already */
	void *w = NULL;
	int rc = pop_upload(t, np, &w, err, errlen);
	if (rc)
		return rc;
	t->bops->mem_free(t->bctx, t->attn.weights);
	t->attn.weights = w;
	return 0;
}

void tenant_attn_fini(struct tenant *t)
{
	attn_free_device(t);
	free(t->attn.mode);
	free(t->attn.first);
	free(t->attn.jobs);
	free(t->attn.bjobs);
	free(t->attn.out);
	t->attn.mode = NULL;
	t->attn.first = NULL;
	t->attn.jobs = NULL;
	t->attn.bjobs = NULL;
	t->attn.out = NULL;
}

/* 1 when position p is protected by rule r after n_seen tokens. */
static int protected(const struct policy_attn_rule *r, uint32_t p,
                     uint32_t n_seen)
{
	return (r->recent && p + (uint64_t)r->recent >= n_seen) ||
	       p < r->sinks || (r->window && p + (uint64_t)r->window >= n_seen);
}

/* What the host knows of one list before the device runs: the drops the
 * rule makes (due: of L = len + n_new entries, the old ones at pos, the
 * new ones at prev ..), the unprotected entries kept, and (KVpop) the
 * entries in the band of the new queries. */
struct list_plan {
	uint32_t keep, n_drop, n_band;
};

/* The newest positions rule r protects: its recent, window or delay. */
static uint32_t protected_tail(const struct policy_attn_rule *r)
{
	if (r->kind == POLICY_ATTN_KVPOP)
		return r->delay;
	return r->recent > r->window ? r->recent : r->window;
}

/* |[0, min(a, n)) u [n - min(b, n), n)|: the positions below a or among
 * the last b of n seen. */
static uint32_t head_tail(uint32_t a, uint32_t b, uint32_t n)
{
	a = a < n ? a : n;
	b = b < n ? b : n;
	uint32_t both = a > n - b ? a - (n - b) : 0;
	return a + b - both;
}

/*
 * The protection covers the sinks and the newest positions (TOVA: its
 * window; KVpop: its delay; H2O: its window or recent half): a position
 * protected now was protected at every sync since it arrived when that
 * tail's start never moved back, so it is still in the list, and so is
 * every position of KVpop's band (its delay has not ended before this
 * sync).  Then the counts follow from the positions' numbers alone,
 * without a pass over the list (the device's own counts, of the entries
 * it holds, are checked against these: a difference refuses the sync).
 * TOVA's window and KVpop's delay are fixed; H2O's recent half moves with
 * the budget, back too when pressure eases, so H2O counts from the
 * positions when its tail now starts before where it started at some
 * earlier sync of the sequence (tail_held 0).
 */
static struct list_plan plan_list(const struct policy_attn_rule *r, int due,
                                  const uint32_t *pos, uint32_t len,
                                  uint32_t n_new, uint32_t prev,
                                  int tail_held)
{
	struct list_plan lp = {0};
	const uint32_t seen = prev + n_new, L = len + n_new;
	if (r->kind == POLICY_ATTN_KVPOP && n_new && r->delay)
		lp.n_band = (prev < r->delay ? prev : r->delay) + n_new;
	if (!due)
		return lp;
	uint32_t np = 0;
	if (tail_held) {
		np = head_tail(r->sinks, protected_tail(r), seen);
	} else {
		for (uint32_t k = 0; k < len; k++)
			np += protected(r, pos[k], seen);
		for (uint32_t k = 0; k < n_new; k++)
			np += protected(r, prev + k, seen);
	}
	lp.keep = r->budget > np ? r->budget - np : 0;
	lp.n_drop = L - np > lp.keep ? L - np - lp.keep : 0;
	return lp;
}

/* The jobs of one (item, layer) into t->attn.jobs and t->attn.bjobs; *drops
 * counts the output words of their indices. */
static int plan_layer(struct tenant *t, const struct ipc_sync_item *it,
                      uint32_t slot, struct tseq *s, uint32_t layer,
                      const struct policy_attn_rule *r, uint32_t *drops,
                      char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	const uint32_t prev = s->n_seen[layer], seen = prev + it->n_new;
	const int due = r->due && r->budget != UINT32_MAX;
	const float *ring = shm_stage_at(t->dstage.chunk.base, g, slot, layer, 0);
	const uint32_t lrec = (uint32_t)(slot * t->lists_per_seq +
	                                 lidx(t, layer, 0));
	const uint32_t srec = slot * g->n_layers + layer;
	if (t->attn.kind == POLICY_ATTN_TOVA) {
		const uint32_t len = tlist_at(t, slot, layer, 0)->len;
		for (uint32_t h = 1; h < g->n_kv_heads; h++)
			if (tlist_at(t, slot, layer, h)->len != len)
				return errors_fmt(err, errlen, KVT_ESYS, "tova: "
				                  "layer %u: its lists' lengths "
				                  "differ (an invariant)", layer);
		if (!it->n_new)
			return 0; /* no query: nothing changes */
		struct list_plan lp = plan_list(r, due, seq_pos(t, s,
		                                lidx(t, layer, 0)), len,
		                                it->n_new, prev, 1);
		struct tova_rule_job *bj = t->attn.bjobs;
		bj[t->attn.n_jobs] = (struct tova_rule_job){
			.ring = ring, .record = lrec, .srec = srec,
			.cur = t->attn.cur[srec], .len = len, .n_new = it->n_new,
			.n_seen = seen, .due = (uint32_t)due, .keep = lp.keep,
			.n_drop = lp.n_drop, .drop_off = *drops,
		};
		t->attn.jobs[t->attn.n_jobs++] = (struct tenant_ajob){
			.rec = srec, .g = TENANT_AJOB_ALL, .L = len + it->n_new,
			.n_drop = lp.n_drop, .drop_off = *drops,
		};
		*drops += lp.n_drop;
		return 0;
	}
	/* H2O: whether its protected tail starts where no entry was ever
	 * dropped (at or after every earlier start; updated eagerly, which
	 * a refused sync only makes stricter) */
	int tail_held = 1;
	if (t->attn.kind == POLICY_ATTN_H2O) {
		const uint32_t tail = protected_tail(r);
		const uint32_t start = seen - (tail < seen ? tail : seen);
		if (!prev)
			t->attn.start[srec] = 0; /* a new sequence in the slot */
		tail_held = start >= t->attn.start[srec];
		if (tail_held)
			t->attn.start[srec] = start;
	}
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		const size_t li = lidx(t, layer, h);
		const uint32_t len = tlist_at(t, slot, layer, h)->len;
		const uint32_t L = len + it->n_new;
		if (!L || (!it->n_new && !due))
			continue; /* nothing changes */
		struct list_plan lp = plan_list(r, due, seq_pos(t, s, li), len,
		                                it->n_new, prev, tail_held);
		const uint32_t rec = lrec + h;
		if (t->attn.kind == POLICY_ATTN_KVPOP) {
			struct kvpop_rule_job *bj = t->attn.bjobs;
			bj[t->attn.n_jobs] = (struct kvpop_rule_job){
				.ring = ring, .layer = layer, .record = rec,
				.cur = t->attn.cur[rec],
				.proj = h == 0 && it->n_new, .len = len,
				.n_new = it->n_new, .n_seen = seen,
				.n_band = lp.n_band, .due = (uint32_t)due,
				.keep = lp.keep, .n_drop = lp.n_drop,
				.drop_off = *drops,
			};
		} else {
			struct h2o_rule_job *bj = t->attn.bjobs;
			bj[t->attn.n_jobs] = (struct h2o_rule_job){
				.ring = ring, .record = rec, .g = h,
				.cur = t->attn.cur[rec], .len = len,
				.n_new = it->n_new, .n_seen = seen,
				.due = (uint32_t)due, .recent = r->recent,
				.keep = lp.keep, .n_drop = lp.n_drop,
				.drop_off = *drops,
			};
		}
		t->attn.jobs[t->attn.n_jobs++] = (struct tenant_ajob){
			.rec = rec, .g = h, .L = L, .n_drop = lp.n_drop,
			.drop_off = *drops,
		};
		*drops += lp.n_drop;
	}
	return 0;
}

/* The rule over the planned jobs, into t->attn.out. */
static int run_rule(struct tenant *t, const struct policy_attn_rule *r,
                    uint32_t words)
{
	const struct shm_geom *g = &t->g;
	const struct kvt_backend_paged pg = tenant_paged(t);
	const uint32_t nr = g->max_seqs * t->lists_per_seq, nj = t->attn.n_jobs;
	const struct kvt_backend_rule_geom geom = {
		.dtype = t->pol->geom.dtype, .n_heads = g->n_heads,
		.n_kv_heads = g->n_kv_heads, .head_dim = g->head_dim,
	};
	union {
		struct h2o_rule h2o;
		struct tova_rule tova;
		struct kvpop_rule kvpop;
	} a;
	if (t->attn.kind == POLICY_ATTN_TOVA) {
		a.tova = (struct tova_rule){
			.state = t->attn.state, .cap = g->max_tokens,
			.rows = tenant_rows(t),
			.sinks = r->sinks, .window = r->window,
		};
	} else if (t->attn.kind == POLICY_ATTN_KVPOP) {
		const struct policy_pop_weights w = pop_dims(t->pol);
		a.kvpop = (struct kvpop_rule){
			.state = t->attn.state, .u = t->attn.u, .weights = t->attn.weights,
			.cap = g->max_tokens, .rows = tenant_rows(t),
			.d_model = t->pol->geom.d_model, .r = w.r, .m = w.m,
			.ring = r->delay + g->headroom, .delay = r->delay,
			.sinks = r->sinks,
		};
	} else {
		a.h2o = (struct h2o_rule){
			.state = t->attn.state, .cap = g->max_tokens,
			.rows = tenant_rows(t), .agg = (uint32_t)r->agg,
			.sinks = r->sinks, .window = r->window,
		};
	}
	return t->attn.rule->run(t->bctx, &pg, nr, &geom, &a, t->attn.bjobs, nj,
	                         t->attn.out, words, t->dsync.stream);
}

int tenant_attn_plan(struct tenant *t, const struct ipc_sync_item *items,
                     uint32_t n, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	struct policy *pol = t->pol;
	t->attn.active = 0;
	t->attn.n_jobs = 0;
	if (!t->attn.state)
		return 0;
	size_t nly, entries;
	tenant_sync_extent(t, items, n, &nly, &entries);
	size_t nj = nly * g->n_kv_heads + 1;
	if (tenant_grow((void **)&t->attn.mode, &t->attn.mode_cap, nly + 1, 1) ||
	    tenant_grow((void **)&t->attn.first, &t->attn.first_cap, nly + 1,
	                sizeof(*t->attn.first)) ||
	    tenant_grow((void **)&t->attn.jobs, &t->attn.jobs_cap, nj,
	                sizeof(*t->attn.jobs)) ||
	    tenant_grow(&t->attn.bjobs, &t->attn.bjobs_cap, nj,
	                rule_layout[t->attn.kind].job_bytes) ||
	    tenant_grow((void **)&t->attn.out, &t->attn.out_cap, 2 * nj + entries + 1,
	                sizeof(*t->attn.out)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	struct policy_attn_rule r = {0};
	uint32_t drops = 0;
	size_t ly = 0;
	int rc = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, it, &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, ly++) {
			const uint32_t seen = s->n_seen[layer] + it->n_new;
			struct policy_layer pl = {
				.layer = layer,
				.phase = (enum kvt_phase)it->phase,
				.n_new = it->n_new, .n_seen = seen,
			};
			t->attn.mode[ly] = TENANT_ATTN_DEVICE;
			t->attn.first[ly] = t->attn.n_jobs;
			(void)pol->ops->attn(pol, &pl, &r);
			if ((rc = plan_layer(t, it, slot, s, layer, &r, &drops,
			                     err, errlen)))
				return rc;
		}
	}
	t->attn.first[ly] = t->attn.n_jobs;
	t->attn.active = 1;
	if (!t->attn.n_jobs)
		return 0;
	const uint32_t nja = t->attn.n_jobs;
	rc = tenant_bases_sync(t);
	if (!rc)
		rc = run_rule(t, &r, 2 * nja + drops);
	if (rc) {
		t->attn.active = 0;
		return errors_fmt(err, errlen, rc, "%s backend: %s's selection: "
		                  "%s", t->bops->name, pol->ops->name,
		                  t->bops->last_error());
	}
	/* the layers of a flagged job go to the host, which refuses them;
	 * the device's counts against the host's: an invariant */
	for (ly = 0; ly < nly; ly++)
		for (uint32_t j = t->attn.first[ly]; j < t->attn.first[ly + 1]; j++) {
			const struct tenant_ajob *J = &t->attn.jobs[j];
			const uint32_t *idx = t->attn.out + 2 * nja + J->drop_off;
			int ok = t->attn.out[nja + j] == J->n_drop;
			for (uint32_t d = 0; ok && d < J->n_drop; d++)
				ok = idx[d] < J->L && (!d || idx[d] > idx[d - 1]);
			if (t->attn.out[j])
				t->attn.mode[ly] = TENANT_ATTN_FLAGGED;
			else if (!ok) {
				t->attn.active = 0;
				return errors_fmt(err, errlen, KVT_ESYS, "%s "
				                  "backend: %s's selection: job %u "
				                  "dropped %u entries (the rule: "
				                  "%u), or not in order",
				                  t->bops->name, pol->ops->name, j,
				                  t->attn.out[nja + j], J->n_drop);
			}
		}
	return 0;
}

int tenant_attn_take(struct tenant *t, size_t ly, struct tenant_ldrop *ld)
{
	if (tenant_attn_mode(t, ly) != TENANT_ATTN_DEVICE)
		return 0;
	const uint32_t *idx = t->attn.out + 2 * t->attn.n_jobs;
	for (uint32_t h = 0; h < t->g.n_kv_heads; h++)
		ld[h] = (struct tenant_ldrop){idx, 0}; /* no job: no drops */
	for (uint32_t j = t->attn.first[ly]; j < t->attn.first[ly + 1]; j++) {
		const struct tenant_ajob *J = &t->attn.jobs[j];
		uint32_t h = J->g == TENANT_AJOB_ALL ? 0 : J->g;
		uint32_t end = J->g == TENANT_AJOB_ALL ? t->g.n_kv_heads : h + 1;
		for (; h < end; h++)
			ld[h] = (struct tenant_ldrop){idx + J->drop_off,
			                              J->n_drop};
	}
	return 1;
}

void tenant_attn_commit(struct tenant *t)
{
	if (!t->attn.active)
		return;
	for (uint32_t j = 0; j < t->attn.n_jobs; j++)
		t->attn.cur[t->attn.jobs[j].rec] ^= 1;
	t->attn.n_jobs = 0; /* once; the apply step still reads attn.mode */
}
