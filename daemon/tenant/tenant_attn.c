/*
 * tenant_attn.c — the policies' rules run on the device at every sync (a
 * policy's policy_ops.device, run by the backend's rule of the same name,
 * struct kvt_backend_rule), so a sync moves the decisions (the policy's
 * jobs up, a flag, a count and the drop indices down), not the lists' keys.
 * The tenant looks the rule up once and checks its layout against the
 * policy's (the headers kvtrimd was built with); a backend without the
 * rule leaves the decisions to the host.  The policy plans the jobs and
 * fills the params; the tenant keeps the device memory, the checks and
 * the commit, and knows no rule.
 *
 * The per-entry state lives in device memory, two halves a record: a sync
 * reads the current half and writes the other, and the sync's commit flips
 * them (tenant_attn_commit), so a refused sync leaves no trace.  Such a
 * tenant's syncs go to the device from the first one, so the host's entry
 * and layer states are never used; nor its positions where the rule's
 * state holds them (every rule's: policy_dev_shape.positions,
 * tenant_dpos): a sync then writes and moves none on the host (they were
 * the most of its host time, a cache miss a list), and the few who need
 * them read them back (tenant_attn_read_pos: a plan whose protected tail
 * moved back, through policy_dev_pos; a flagged layer; the check).  The
 * policy works out each job's drop count from the numbers (or those
 * positions) and the tenant checks the device's against it (a rule with drop_bound: the most it may drop, the device's
 * count then taken); a row the device finds not finite sends its
 * (sequence, layer) to the host path, which refuses the sync with the cpu
 * backend's reason (docs/cuda.md, "Wiring").  A rule that reads the
 * scorer's scores (takes_pre) gets them in device memory (attn.dpre,
 * written by the scorer's run, tenant_score_on_device), and only a
 * flagged sync reads them back, for that reason.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "log.h"
#include "policy.h"
#include "tenant_int.h"

static void attn_free_device(struct tenant *t)
{
	const struct kvt_backend_ops *o = t->bops;
	void *dev[] = {t->attn.state, t->attn.layers, t->attn.consts,
	               t->attn.dpre};
	for (size_t k = 0; k < sizeof(dev) / sizeof(dev[0]); k++)
		if (dev[k])
			o->mem_free(t->bctx, dev[k]);
	t->attn.state = t->attn.layers = t->attn.consts = NULL;
	t->attn.dpre = NULL;
	t->attn.dpre_cap = 0;
	free(t->attn.cur);
	free(t->attn.word);
	free(t->attn.params);
	free(t->attn.llen);
	free(t->attn.lpos);
	t->attn.cur = NULL;
	t->attn.word = NULL;
	t->attn.params = NULL;
	t->attn.llen = NULL;
	t->attn.lpos = NULL;
}

/* The device buffers of the rule's state: the records, its upload, the
 * per-(slot, layer) buffers; 0, or an error with the reason in why. */
static int attn_mem_new(struct tenant *t, size_t bytes, char *why,
                        size_t whylen)
{
	const struct kvt_backend_ops *o = t->bops;
	const struct policy_device_rule *dr = t->attn.dr;
	int rc = o->mem_new(t->bctx, bytes ? bytes : 4, &t->attn.state);
	if (rc) {
		t->attn.state = NULL;
		return errors_fmt(why, whylen, rc, "%zu bytes of entry states: "
		                  "%s", bytes, o->last_error());
	}
	if (dr->upload && (rc = dr->upload(t->pol, o, t->bctx, &t->attn.consts,
	                                   why, whylen))) {
		t->attn.consts = NULL;
		return rc;
	}
	const size_t lb = (size_t)t->g.max_seqs * t->g.n_layers *
	                  t->attn.shape.layer_bytes;
	if (lb && (rc = o->mem_new(t->bctx, lb, &t->attn.layers))) {
		t->attn.layers = NULL;
		return errors_fmt(why, whylen, rc, "%zu bytes of the rule's "
		                  "buffers: %s", lb, o->last_error());
	}
	return 0;
}

int tenant_attn_init(struct tenant *t, char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	const struct policy_device_rule *dr = t->pol->ops->device;
	/* device staging only where the policy reads staged rows (a rule
	 * of positions or keys alone reads none) */
	const int staged = !!(t->pol->ops->needs & POLICY_NEED_STAGED);
	if (!t->dsync.dbases || (staged && !t->dstage.chunk.base) ||
	    !o->mem_new || !o->mem_free || !dr ||
	    (dr->takes_pre && !t->dscore.scorer) ||
	    (dr->supports && !dr->supports(t->pol)))
		return 0;
	int rc = tenant_rule_lookup(t, dr->name, dr->version,
	                            dr->params_bytes, dr->job_bytes,
	                            &t->attn.rule, err, errlen);
	if (rc || !t->attn.rule)
		return rc;
	const struct shm_geom *g = &t->g;
	t->attn.dr = dr;
	dr->shape(t->pol, g->max_tokens, &t->attn.shape);
	const size_t nl = (size_t)g->max_seqs * g->n_layers;
	const size_t nrec = nl * t->attn.shape.records;
	const size_t bytes = nrec * t->attn.shape.record_bytes;
	t->attn.cur = calloc(nrec ? nrec : 1, 1);
	t->attn.word = calloc(nl + 1, sizeof(*t->attn.word));
	t->attn.params = calloc(1, dr->params_bytes ? dr->params_bytes : 1);
	t->attn.llen = calloc(g->n_kv_heads + 1, sizeof(*t->attn.llen));
	t->attn.lpos = calloc(g->n_kv_heads + 1, sizeof(*t->attn.lpos));
	if (!t->attn.cur || !t->attn.word || !t->attn.params ||
	    !t->attn.llen || !t->attn.lpos)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	/* Device memory outside the pool, like the device table: when it is
	 * not to be had, the tenant still registers and decides on the host
	 * (its keys then cross, as before this path existed). */
	char why[256] = "";
	if (attn_mem_new(t, bytes, why, sizeof(why))) {
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
	const uint32_t nl = t->g.n_layers, per = nl * t->attn.shape.records;
	const size_t rb = (size_t)per * t->attn.shape.record_bytes;
	char *st = t->attn.state;
	if (o->copy(t->bctx, st + dst * rb, st + src * rb, rb, t->dsync.stream))
		return KVT_ESYS;
	memcpy(t->attn.cur + (size_t)dst * per, t->attn.cur + (size_t)src * per, per);
	memcpy(t->attn.word + (size_t)dst * nl, t->attn.word + (size_t)src * nl,
	       nl * sizeof(*t->attn.word));
	const size_t lb = nl * t->attn.shape.layer_bytes;
	char *u = t->attn.layers;
	if (u && o->copy(t->bctx, u + dst * lb, u + src * lb, lb,
	                 t->dsync.stream))
		return KVT_ESYS;
	return 0;
}

int tenant_attn_reload(struct tenant *t, const struct policy *np, char *err,
                       size_t errlen)
{
	if (!t->attn.state || !t->attn.dr->upload)
		return 0;
	/* the per-layer buffers' sizes are the same: tenant_reload_policy
	 * refused a change of the layer state already */
	void *w = NULL;
	int rc = t->attn.dr->upload(np, t->bops, t->bctx, &w, err, errlen);
	if (rc)
		return rc;
	t->bops->mem_free(t->bctx, t->attn.consts);
	t->attn.consts = w;
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

int tenant_attn_pre(struct tenant *t, size_t fresh, float **dev, char *err,
                    size_t errlen)
{
	*dev = NULL;
	if (!t->attn.state || !t->attn.dr->takes_pre)
		return 0;
	if (fresh > t->attn.dpre_cap) {
		const struct kvt_backend_ops *o = t->bops;
		size_t cap = t->attn.dpre_cap ? t->attn.dpre_cap : 4096;
		while (cap < fresh)
			cap *= 2;
		/* the last sync's rule is done with it: its run waited */
		if (t->attn.dpre)
			o->mem_free(t->bctx, t->attn.dpre);
		t->attn.dpre = NULL;
		t->attn.dpre_cap = 0;
		int rc = o->mem_new(t->bctx, cap * sizeof(float),
		                    (void **)&t->attn.dpre);
		if (rc) {
			t->attn.dpre = NULL;
			return errors_fmt(err, errlen, rc, "%s backend: %zu "
			                  "bytes of device scores: %s", o->name,
			                  cap * sizeof(float), o->last_error());
		}
		t->attn.dpre_cap = cap;
	}
	t->attn.dpre_n = fresh;
	*dev = t->attn.dpre;
	return 0;
}

/* tenant_int.h */
int tenant_attn_read_pos(const struct tenant *t, uint32_t slot,
                         uint32_t layer, uint32_t head, uint32_t n,
                         uint32_t *dst)
{
	const struct policy_dev_shape *sh = &t->attn.shape;
	const int one = sh->records == 1; /* one record holds the layer */
	const size_t rec = ((size_t)slot * t->g.n_layers + layer) *
	                   sh->records + (one ? 0 : head);
	const char *src = (const char *)t->attn.state +
	                  rec * sh->record_bytes +
	                  t->attn.cur[rec] * (sh->record_bytes / 2) +
	                  (one ? head * sh->list_bytes : 0);
	if (!n)
		return 0;
	return t->bops->copy(t->bctx, dst, src, (size_t)n * sizeof(uint32_t),
	                     t->dsync.stream);
}

/* A plan's policy_dev_pos where the positions live on the device: head
 * h's read back into the host's (unused) copy of that list. */
struct pos_fetch {
	struct tenant *t;
	const struct tseq *s;
	uint32_t slot, layer;
};

static const uint32_t *fetch_pos(void *ctx, uint32_t h)
{
	const struct pos_fetch *f = ctx;
	uint32_t *dst = seq_pos(f->t, f->s, lidx(f->t, f->layer, h));
	return tenant_attn_read_pos(f->t, f->slot, f->layer, h,
	                            f->t->attn.llen[h], dst) ? NULL : dst;
}

/* The jobs of one (item, layer) into t->attn.jobs and t->attn.bjobs, as
 * its policy plans them; *drops counts the output words of their
 * indices. */
static int plan_layer(struct tenant *t, uint32_t slot, struct tseq *s,
                      const struct policy_layer *pl, const float *pre,
                      uint32_t *drops, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	const struct policy_device_rule *dr = t->attn.dr;
	const uint32_t layer = pl->layer, sl = slot * g->n_layers + layer;
	const int dpos = tenant_dpos(t);
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		t->attn.llen[h] = tlist_at(t, slot, layer, h)->len;
		if (!dpos)
			t->attn.lpos[h] = seq_pos(t, s, lidx(t, layer, h));
	}
	struct pos_fetch pf = {t, s, slot, layer};
	const uint32_t srec = sl * t->attn.shape.records;
	const struct policy_dev_layer c = {
		.ring = t->dstage.chunk.base
		        ? shm_stage_at(t->dstage.chunk.base, g, slot, layer, 0)
		        : NULL, /* a policy that reads no staged rows */
		.len = t->attn.llen, .pos = dpos ? NULL : t->attn.lpos,
		.fetch_pos = fetch_pos, .fetch_ctx = &pf,
		.list_rec = (uint32_t)(slot * t->lists_per_seq +
		                       lidx(t, layer, 0)),
		.state_rec = srec, .cur = t->attn.cur + srec,
		.word = &t->attn.word[sl], .drop_off = *drops, .pre = pre,
	};
	const uint32_t first = t->attn.n_jobs;
	struct policy_dev_job *hj = t->attn.jobs + first;
	uint32_t n = 0;
	int rc = dr->plan(t->pol, pl, &c,
	                  (char *)t->attn.bjobs + (size_t)first * dr->job_bytes,
	                  hj, &n, err, errlen);
	if (rc)
		return rc;
	/* what the commit flips and the checks read: the plan's contract */
	int ok = n <= g->n_kv_heads;
	for (uint32_t k = 0; ok && k < n; k++) {
		ok = hj[k].rec - srec < t->attn.shape.records &&
		     (hj[k].g < g->n_kv_heads || hj[k].g == POLICY_DEV_ALL ||
		      hj[k].g == POLICY_DEV_LAYER) &&
		     hj[k].drop_off == *drops && hj[k].n_drop <= hj[k].L;
		*drops += hj[k].n_drop;
	}
	if (!ok)
		return errors_fmt(err, errlen, KVT_ESYS, "%s: layer %u: a job "
		                  "out of its records, heads or drops (an "
		                  "invariant)", t->pol->ops->name, layer);
	t->attn.n_jobs += n;
	return 0;
}

/* The rule over the planned jobs, into t->attn.out. */
static int run_rule(struct tenant *t, uint32_t words)
{
	const struct shm_geom *g = &t->g;
	const struct kvt_backend_paged pg = tenant_paged(t);
	const uint32_t nr = g->max_seqs * t->lists_per_seq, nj = t->attn.n_jobs;
	const struct kvt_backend_rule_geom geom = {
		.dtype = t->pol->geom.dtype, .n_heads = g->n_heads,
		.n_kv_heads = g->n_kv_heads, .head_dim = g->head_dim,
	};
	const struct policy_dev_bufs b = {
		.state = t->attn.state, .layers = t->attn.layers,
		.consts = t->attn.consts, .cap = g->max_tokens,
		.rows = tenant_rows(t),
	};
	t->attn.dr->params(t->pol, &b, t->attn.params);
	return t->attn.rule->run(t->bctx, &pg, nr, &geom, t->attn.params,
	                         t->attn.bjobs, nj, t->attn.out, words,
	                         t->dsync.stream);
}

/* tenant_int.h */
int tenant_attn_check(struct tenant *t, size_t nly, char *err,
                      size_t errlen)
{
	const uint32_t nja = t->attn.n_jobs;
	const struct policy *pol = t->pol;
	/* the layers of a flagged job go to the host, which refuses them;
	 * the device's counts against the host's (or within its bound, then
	 * taken): an invariant */
	const int bound = t->attn.dr->drop_bound;
	for (size_t ly = 0; ly < nly; ly++)
		for (uint32_t j = t->attn.first[ly]; j < t->attn.first[ly + 1]; j++) {
			struct policy_dev_job *J = &t->attn.jobs[j];
			const uint32_t got = t->attn.out[nja + j];
			const uint32_t nd = bound && got < J->n_drop ? got
			                                             : J->n_drop;
			if (t->attn.out[j]) {
				t->attn.mode[ly] = TENANT_ATTN_FLAGGED;
			} else if (!tenant_rule_drops_ok(t->attn.out, nja, j, nd,
			                                 J->drop_off, J->L)) {
				t->attn.active = 0;
				return errors_fmt(err, errlen, KVT_ESYS, "%s "
				                  "backend: %s's selection: job %u "
				                  "dropped %u entries (the rule: "
				                  "%s%u), or not in order",
				                  t->bops->name, pol->ops->name, j,
				                  got, bound ? "at most " : "",
				                  J->n_drop);
			}
			J->n_drop = nd;
		}
	return 0;
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
	                t->attn.dr->job_bytes) ||
	    /* a word at least (tenant_attn_take points into it); the run's
	     * words once the plan knows them */
	    tenant_grow((void **)&t->attn.out, &t->attn.out_cap, 1,
	                sizeof(*t->attn.out)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	uint32_t drops = 0;
	size_t ly = 0, at = 0; /* at: the layer's first score row */
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
			const float *pre = t->attn.dr->takes_pre
			                   ? t->attn.dpre + at * g->n_kv_heads
			                   : NULL;
			at += it->n_new;
			if ((rc = plan_layer(t, slot, s, &pl, pre, &drops, err,
			                     errlen)))
				return rc;
		}
	}
	t->attn.first[ly] = t->attn.n_jobs;
	t->attn.active = 1;
	if (!t->attn.n_jobs)
		return 0;
	const uint32_t nja = t->attn.n_jobs;
	/* the run writes every word before anything reads one: no copy */
	if (tenant_grow_fresh((void **)&t->attn.out, &t->attn.out_cap,
	                      2 * (size_t)nja + drops, sizeof(*t->attn.out))) {
		t->attn.active = 0;
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	rc = tenant_bases_sync(t);
	if (!rc)
		rc = run_rule(t, 2 * nja + drops);
	if (rc) {
		t->attn.active = 0;
		return errors_fmt(err, errlen, rc, "%s backend: %s's selection: "
		                  "%s", t->bops->name, pol->ops->name,
		                  t->bops->last_error());
	}
	if ((rc = tenant_attn_check(t, nly, err, errlen)))
		return rc;
	/* the host refuses a flagged layer with the reason the cpu backend
	 * gives, from the scores: they come back then only */
	int flagged = 0;
	for (ly = 0; ly < nly; ly++)
		flagged |= t->attn.mode[ly] == TENANT_ATTN_FLAGGED;
	if (flagged && t->attn.dr->takes_pre && t->attn.dpre_n &&
	    (rc = t->bops->copy(t->bctx, t->dscore.pre, t->attn.dpre,
	                        t->attn.dpre_n * sizeof(float),
	                        t->dsync.stream))) {
		t->attn.active = 0;
		return errors_fmt(err, errlen, rc, "%s backend: reading the "
		                  "scores back: %s", t->bops->name,
		                  t->bops->last_error());
	}
	return 0;
}

/* A POLICY_DEV_LAYER job's n ascending drop indices d over the layer's
 * lists end to end (each of t->scr.heads[h].len entries: the layer as
 * stage_layer laid it out) split by list, in place, into list-relative
 * indices. */
static void take_layer(struct tenant *t, uint32_t *d, uint32_t n,
                       struct tenant_ldrop *ld)
{
	uint32_t k = 0, off = 0;
	for (uint32_t h = 0; h < t->g.n_kv_heads; h++) {
		const uint32_t len = t->scr.heads[h].len, k0 = k;
		for (; k < n && d[k] - off < len; k++)
			d[k] -= off;
		ld[h] = (struct tenant_ldrop){d + k0, k - k0};
		off += len;
	}
}

int tenant_attn_take(struct tenant *t, size_t ly, struct tenant_ldrop *ld)
{
	if (tenant_attn_mode(t, ly) != TENANT_ATTN_DEVICE)
		return 0;
	uint32_t *idx = t->attn.out + 2 * t->attn.n_jobs;
	for (uint32_t h = 0; h < t->g.n_kv_heads; h++)
		ld[h] = (struct tenant_ldrop){idx, 0}; /* no job: no drops */
	for (uint32_t j = t->attn.first[ly]; j < t->attn.first[ly + 1]; j++) {
		const struct policy_dev_job *J = &t->attn.jobs[j];
		if (J->g == POLICY_DEV_LAYER) {
			take_layer(t, idx + J->drop_off, J->n_drop, ld);
			continue;
		}
		uint32_t h = J->g == POLICY_DEV_ALL ? 0 : J->g;
		uint32_t end = J->g == POLICY_DEV_ALL ? t->g.n_kv_heads : h + 1;
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
