/*
 * tenant_window.c — the end-of-prefill selections run on the device (a
 * policy's policy_ops.prompt: the device rule of its name, struct
 * kvt_backend_rule, whose jobs the policy plans), so the sync where such
 * a policy decides moves drop indices to the host, not the prompt's keys
 * and the window's rows.  A (sequence, layer) goes to the device when the
 * policy decides at this sync, each of its lists holds the prompt with
 * every position at its index (checked here against the host's positions)
 * and the policy's plan takes it; anything else, or a layer whose rows
 * the device found not finite, stays on the host path, which refuses the
 * sync with the reason as the cpu backend does.  The drops are the cpu
 * policy's (the same float operations; kvtrim-loadgen --verify checks
 * it).
 */
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "policy.h"
#include "tenant_int.h"

/* 1 when every list of (slot, layer) holds exactly prev entries, entry k at
 * position k. */
static int identity(const struct tenant *t, const struct tseq *s,
                    uint32_t slot, uint32_t layer, uint32_t prev)
{
	for (uint32_t h = 0; h < t->g.n_kv_heads; h++) {
		if (tlist_at(t, slot, layer, h)->len != prev)
			return 0;
		const uint32_t *pos = seq_pos(t, s, lidx(t, layer, h));
		for (uint32_t k = 0; k < prev; k++)
			if (pos[k] != k)
				return 0;
	}
	return 1;
}

/* The backend's device rule of the policy's end-of-prefill rule r into
 * t->win.rule, asked once: NULL when the backend has none of its name
 * (the host decides); KVT_ENOTSUP with the reason when its layout is not
 * the one this daemon was built with. */
static int rule_lookup(struct tenant *t, const struct policy_prompt_rule *r,
                       char *err, size_t errlen)
{
	if (t->win.looked)
		return 0;
	const struct kvt_backend_rule *b;
	int rc = tenant_rule_lookup(t, r->name, r->version, r->params_bytes,
	                            r->job_bytes, &b, err, errlen);
	if (rc)
		return rc;
	t->win.params = b ? calloc(1, r->params_bytes ? r->params_bytes : 1)
	                  : NULL;
	if (b && !t->win.params)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	t->win.rule = b;
	t->win.looked = 1;
	return 0;
}

/* Room for nly layers' ways and n_kv_heads jobs each of job_bytes (the
 * output words wait for the plan: they follow its drops, not the sync's
 * entries, which grow with the lists at every sync where nothing is
 * decided). */
static int make_room(struct tenant *t, size_t nly, size_t job_bytes)
{
	const size_t nj = nly * t->g.n_kv_heads + 1;
	if (tenant_grow((void **)&t->win.mode, &t->win.mode_cap, nly + 1, 1) ||
	    tenant_grow((void **)&t->win.widx, &t->win.widx_cap, nly + 1,
	                sizeof(*t->win.widx)) ||
	    tenant_grow((void **)&t->win.wn, &t->win.wn_cap, nly + 1,
	                sizeof(*t->win.wn)) ||
	    tenant_grow(&t->win.jobs, &t->win.jobs_cap, nj, job_bytes) ||
	    tenant_grow((void **)&t->win.led, &t->win.led_cap, nj,
	                sizeof(*t->win.led)) ||
	    tenant_grow((void **)&t->win.wlen, &t->win.wlen_cap, nj,
	                sizeof(*t->win.wlen)))
		return KVT_ENOMEM;
	return 0;
}

/* The jobs of the (item, layer) ly: the policy's plan where it decides
 * now and every list holds the prompt at its indices (mode DEVICE), else
 * none (HOST).  *drops: the drops planned so far. */
static void plan_layer(struct tenant *t, const struct ipc_sync_item *it,
                       struct tseq *s, uint32_t slot, uint32_t layer,
                       size_t ly, uint32_t *drops)
{
	struct policy *pol = t->pol;
	const struct policy_prompt_rule *r = pol->ops->prompt;
	const uint32_t prev = s->n_seen[layer];
	struct policy_layer pl = {
		.layer = layer,
		.phase = (enum kvt_phase)it->phase,
		.n_new = it->n_new, .n_seen = prev + it->n_new,
		.state = t->scr.state,
	};
	t->win.mode[ly] = TENANT_WIN_HOST;
	t->win.widx[ly] = t->win.n_jobs;
	t->win.wn[ly] = 0;
	if (t->sbytes)
		memcpy(pl.state, seq_state(t, s, layer), t->sbytes);
	if (!policy_decides(pol, &pl) || !identity(t, s, slot, layer, prev))
		return;
	const struct policy_prompt_at at = {
		.ring = shm_stage_at(t->dstage.chunk.base, &t->g, slot, layer, 0),
		.stage_tokens = t->g.stage_tokens,
		.record = (uint32_t)(slot * t->lists_per_seq + lidx(t, layer, 0)),
		.P = prev, .n_new = it->n_new, .drop_off = *drops,
	};
	const uint32_t k = t->win.n_jobs;
	const uint32_t nj = r->plan(pol, &pl, &at,
	                            (char *)t->win.jobs + (size_t)k * r->job_bytes,
	                            t->win.led + k);
	if (!nj || nj > t->g.n_kv_heads)
		return; /* the host decides */
	for (uint32_t j = 0; j < nj; j++) {
		*drops += t->win.led[k + j].n_drop;
		t->win.wlen[k + j] = prev + it->n_new;
	}
	t->win.n_jobs += nj;
	t->win.wn[ly] = nj;
	t->win.mode[ly] = TENANT_WIN_DEVICE;
}

/* The device's counts and indices against the plan's (each index below
 * its list's length, ascending): an invariant.  A job whose rows were not
 * finite is left to the host. */
static int check_out(const struct tenant *t, char *err, size_t errlen)
{
	const uint32_t n = t->win.n_jobs;
	for (uint32_t j = 0; j < n; j++) {
		const struct policy_prompt_job *L = &t->win.led[j];
		if (t->win.out[j])
			continue;
		if ((L->head >= t->g.n_kv_heads && L->n_drop) ||
		    !tenant_rule_drops_ok(t->win.out, n, j, L->n_drop,
		                          L->drop_off, t->win.wlen[j]))
			return errors_fmt(err, errlen, KVT_ESYS, "%s backend: "
			                  "device rule %s: job %u dropped %u "
			                  "entries (the plan: %u), or not in "
			                  "order", t->bops->name, t->win.rule->name,
			                  j, t->win.out[n + j], L->n_drop);
	}
	return 0;
}

int tenant_window_plan(struct tenant *t, const struct ipc_sync_item *items,
                       uint32_t n, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	struct policy *pol = t->pol;
	const struct policy_prompt_rule *r = pol->ops->prompt;
	t->win.active = 0;
	t->win.n_jobs = 0;
	if (!t->dev || !t->dsync.dbases || !t->dstage.chunk.base || !r)
		return 0;
	int rc = rule_lookup(t, r, err, errlen);
	if (rc || !t->win.rule)
		return rc;
	size_t nly, entries;
	tenant_sync_extent(t, items, n, &nly, &entries);
	if (make_room(t, nly, r->job_bytes))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	uint32_t drops = 0;
	size_t ly = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, &items[i], &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, ly++)
			plan_layer(t, &items[i], s, slot, layer, ly, &drops);
	}
	t->win.active = 1;
	if (!t->win.n_jobs)
		return 0;
	const uint32_t words = 2 * t->win.n_jobs + drops;
	/* the run writes every word before anything reads one */
	if (tenant_grow_fresh((void **)&t->win.out, &t->win.out_cap, words,
	                      sizeof(*t->win.out))) {
		t->win.active = 0;
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	const struct kvt_backend_rows rows = tenant_rows(t);
	r->params(pol, &rows, t->win.params);
	rc = tenant_bases_sync(t);
	const struct kvt_backend_paged pg = tenant_paged(t);
	const struct kvt_backend_rule_geom rg = {
		pol->geom.dtype, g->n_heads, g->n_kv_heads, g->head_dim};
	if (!rc)
		rc = t->win.rule->run(t->bctx, &pg, g->max_seqs * t->lists_per_seq,
		                      &rg, t->win.params, t->win.jobs,
		                      t->win.n_jobs, t->win.out, words,
		                      t->dsync.stream);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: device rule "
		                  "%s: %s", t->bops->name, t->win.rule->name,
		                  t->bops->last_error());
	return check_out(t, err, errlen);
}

int tenant_window_take(struct tenant *t, size_t ly, struct policy_layer *pl)
{
	if (tenant_window_host(t, ly))
		return 0;
	(void)t->pol->ops->prompt->plan(t->pol, pl, NULL, NULL, NULL);
	const uint32_t n = t->win.n_jobs;
	for (uint32_t k = 0; k < t->win.wn[ly]; k++) {
		const struct policy_prompt_job *L = &t->win.led[t->win.widx[ly] + k];
		if (L->head >= t->g.n_kv_heads)
			continue; /* a job that only checked rows */
		const uint32_t *idx = t->win.out + 2 * n + L->drop_off;
		for (uint32_t d = 0; d < L->n_drop; d++)
			pl->heads[L->head].drop[idx[d]] = 1;
	}
	return 1;
}
