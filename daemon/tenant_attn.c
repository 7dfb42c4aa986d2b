/*
 * tenant_attn.c — H2O's rule run on the device (h2o: policy_ops.attn; the
 * backend's attn_select, backend/cuda/attn_select.cu), so that a sync
 * moves the decisions (a job per list up, a flag, a count and the drop
 * indices down) instead of the K halves of every page of every list
 * (issue 12: what crosses is sized by the decisions, not by the lists).
 *
 * The per-entry state (each entry's position and the attention each query
 * head of its group gave it) lives in device memory, two halves a list
 * record: a sync reads the current half and writes the other, compacted
 * by its drops as compact_drops compacts the pages; the sync's commit
 * flips the halves (tenant_attn_commit), so a refused sync leaves no
 * trace.  Every sync of such a tenant goes to the device from its first
 * one, so the host's entry states (t->ent_scr, seq_ent) are never used.
 * The host works out each list's drop count from its own positions and
 * the rule (as policy_select counts), and the device's counts are checked
 * against it.  A new row the device finds not finite sends its (sequence,
 * layer) to the host path, which refuses the sync with the cpu backend's
 * reason (policy_decide's input check; tenant_sync refuses it itself
 * should the host find the rows finite).  The drops are what the cpu
 * policy's would be: the same float operations (kvtrim-loadgen --verify).
 */
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "log.h"
#include "policy.h"
#include "tenant_int.h"

static uint32_t group(const struct tenant *t)
{
	return t->g.n_heads / t->g.n_kv_heads;
}

int tenant_attn_init(struct tenant *t, char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	if (!t->dbases || !t->dstage.base || !t->pol->ops->attn ||
	    !o->attn_select || !o->mem_new || !o->mem_free)
		return 0;
	size_t nrec = (size_t)t->g.max_seqs * t->lists_per_seq;
	size_t bytes = nrec * 2 * t->g.max_tokens * (1 + group(t)) *
	               sizeof(float);
	t->acur = calloc(nrec ? nrec : 1, 1);
	if (!t->acur)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	/* Device memory outside the pool, like the device table: when it is
	 * not to be had, the tenant still registers and decides on the host
	 * (its keys then cross, as before this path existed). */
	if (o->mem_new(t->bctx, bytes ? bytes : 4, &t->astate)) {
		LOG(LOG_LVL_WARNING, "tenant %s: no device memory for h2o's "
		    "entry states (%zu bytes: %s); it decides on the host",
		    t->name, bytes, o->last_error());
		t->astate = NULL;
		free(t->acur);
		t->acur = NULL;
	}
	return 0;
}

void tenant_attn_fini(struct tenant *t)
{
	if (t->astate)
		t->bops->mem_free(t->bctx, t->astate);
	t->astate = NULL;
	free(t->acur);
	free(t->amode);
	free(t->afirst);
	t->afirst = NULL;
	free(t->ajobs);
	free(t->aout);
	t->acur = t->amode = NULL;
	t->ajobs = NULL;
	t->aout = NULL;
}

/* 1 when position p is protected by rule r after n_seen tokens. */
static int protected(const struct policy_attn_rule *r, uint32_t p,
                     uint32_t n_seen)
{
	return (r->recent && p + (uint64_t)r->recent >= n_seen) ||
	       p < r->sinks || (r->window && p + (uint64_t)r->window >= n_seen);
}

int tenant_attn_plan(struct tenant *t, const struct ipc_sync_item *items,
                     uint32_t n, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	struct policy *pol = t->pol;
	t->aactive = 0;
	t->n_ajobs = 0;
	if (!t->astate || !pol->ops->attn)
		return 0;
	size_t nly, entries;
	tenant_sync_extent(t, items, n, &nly, &entries);
	size_t nj = nly * g->n_kv_heads + 1;
	if (tenant_grow((void **)&t->amode, &t->amode_cap, nly + 1, 1) ||
	    tenant_grow((void **)&t->afirst, &t->afirst_cap, nly + 1,
	            sizeof(*t->afirst)) ||
	    tenant_grow((void **)&t->ajobs, &t->ajobs_cap, nj, sizeof(*t->ajobs)) ||
	    tenant_grow((void **)&t->aout, &t->aout_cap, 2 * nj + entries + 1,
	            sizeof(*t->aout)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	struct policy_attn_rule r = {0};
	uint32_t drops = 0;
	size_t ly = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, it, &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, ly++) {
			const uint32_t prev = s->n_seen[layer],
			               seen = prev + it->n_new;
			struct policy_layer pl = {
				.layer = layer,
				.phase = (enum kvt_phase)it->phase,
				.n_new = it->n_new, .n_seen = seen,
			};
			t->amode[ly] = TENANT_ATTN_DEVICE;
			t->afirst[ly] = t->n_ajobs;
			(void)pol->ops->attn(pol, &pl, &r);
			const int due = r.due && r.budget != UINT32_MAX;
			for (uint32_t h = 0; h < g->n_kv_heads; h++) {
				const size_t li = lidx(t, layer, h);
				const uint32_t len = tlist_at(t, slot, layer, h)->len;
				const uint32_t L = len + it->n_new;
				if (!L || (!it->n_new && !due))
					continue; /* nothing changes */
				uint32_t np = 0, keep = 0, nd = 0;
				if (due) {
					const uint32_t *pos = seq_pos(t, s, li);
					for (uint32_t k = 0; k < len; k++)
						np += protected(&r, pos[k], seen);
					for (uint32_t k = 0; k < it->n_new; k++)
						np += protected(&r, prev + k, seen);
					keep = r.budget > np ? r.budget - np : 0;
					nd = L - np > keep ? L - np - keep : 0;
				}
				const uint32_t rec = (uint32_t)(slot *
				                                t->lists_per_seq + li);
				t->ajobs[t->n_ajobs++] = (struct kvt_backend_attn_job){
					.ring = shm_stage_at(t->dstage.base, g, slot,
					                     layer, 0),
					.record = rec, .g = h, .cur = t->acur[rec],
					.len = len, .n_new = it->n_new, .n_seen = seen,
					.due = (uint32_t)due, .recent = r.recent,
					.keep = keep, .n_drop = nd, .drop_off = drops,
				};
				drops += nd;
			}
		}
	}
	t->afirst[ly] = t->n_ajobs;
	t->aactive = 1;
	if (!t->n_ajobs)
		return 0;
	const struct kvt_backend_attn a = {
		.state = t->astate, .cap = g->max_tokens,
		.stage_tokens = g->stage_tokens,
		.row_floats = g->stage_entry_floats, .q_off = g->stage_q_off,
		.lse_off = g->stage_lse_off, .agg = (uint32_t)r.agg,
		.sinks = r.sinks, .window = r.window,
	};
	const uint32_t nja = t->n_ajobs, words = 2 * nja + drops;
	int rc = tenant_bases_sync(t);
	const struct kvt_backend_paged pg = tenant_paged(t);
	if (!rc)
		rc = t->bops->attn_select(t->bctx, &pg,
		                          g->max_seqs * t->lists_per_seq,
		                          pol->geom.dtype, g->n_heads,
		                          g->n_kv_heads, g->head_dim, &a, t->ajobs,
		                          nja, t->aout, words, t->stream);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: attention "
		                  "selection: %s", t->bops->name,
		                  t->bops->last_error());
	/* the layers of a flagged job go to the host, which refuses them;
	 * the device's counts against the host's: an invariant */
	for (ly = 0; ly < nly; ly++)
		for (uint32_t j = t->afirst[ly]; j < t->afirst[ly + 1]; j++) {
			const struct kvt_backend_attn_job *J = &t->ajobs[j];
			const uint32_t *idx = t->aout + 2 * nja + J->drop_off;
			int ok = t->aout[nja + j] == J->n_drop;
			for (uint32_t d = 0; ok && d < J->n_drop; d++)
				ok = idx[d] < J->len + J->n_new &&
				     (!d || idx[d] > idx[d - 1]);
			if (t->aout[j])
				t->amode[ly] = TENANT_ATTN_FLAGGED;
			else if (!ok)
				return errors_fmt(err, errlen, KVT_ESYS, "%s backend: "
				                  "attention selection: job %u dropped "
				                  "%u entries (the rule: %u), or not in "
				                  "order", t->bops->name, j,
				                  t->aout[nja + j], J->n_drop);
		}
	return 0;
}

int tenant_attn_take(struct tenant *t, size_t ly, struct policy_layer *pl)
{
	if (tenant_attn_mode(t, ly) != TENANT_ATTN_DEVICE)
		return 0;
	const uint32_t *idx = t->aout + 2 * t->n_ajobs;
	for (uint32_t j = t->afirst[ly]; j < t->afirst[ly + 1]; j++) {
		const struct kvt_backend_attn_job *J = &t->ajobs[j];
		for (uint32_t d = 0; d < J->n_drop; d++)
			pl->heads[J->g].drop[idx[J->drop_off + d]] = 1;
	}
	return 1;
}

void tenant_attn_commit(struct tenant *t)
{
	if (!t->aactive)
		return;
	for (uint32_t j = 0; j < t->n_ajobs; j++)
		t->acur[t->ajobs[j].record] ^= 1;
	t->n_ajobs = 0; /* once; the apply step still reads amode */
}
