/*
 * tenant_sync.c — the sync of a tenant (tenant_sync, tenant.h), in the
 * order that keeps a refusal invisible:
 *   1. validate: every check that needs no policy decision, for every item,
 *      before anything else;
 *   2. decide: the policy runs on scratch copies of positions, entry and
 *      layer states; the drop marks say each list's new length;
 *   3. reserve the pages the new lengths need: the last step that may fail;
 *   4. apply: compact each list along compact_plan()'s moves (on the host,
 *      or batched into one backend call on a device tenant), commit the
 *      policy states, free pages, then allocate (room for each item's
 *      headroom: the one it asked, else the registration's), mirror the
 *      table records, bump the counters and mark the staging rows of the
 *      next positions unstaged.
 * Also the device-side preparation of a sync (tenant_sync_ready's wait for
 * the engine's writes, the stream's wait, keys staged to host memory).
 */
#include "errors.h"
#include "tenant_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compact.h"
#include "now.h"
#include "pace.h"
#include "policy.h"

/* What the staged-row accessor of policy_layer needs. */
struct stage_ctx {
	struct tenant *t;
	uint32_t slot, layer, n_seen;
};

/* Runs on a driver thread (or inline) once the tenant stream passed the
 * engine's writes: no backend calls here, only the flag and the wakeup. */
static void writes_done_cb(void *arg)
{
	struct tenant *t = arg;
	__atomic_store_n(&t->kv_wait, 2, __ATOMIC_RELEASE);
	t->wake(t->wake_arg);
}

int tenant_sync_ready(struct tenant *t, void (*wake)(void *), void *arg)
{
	const struct kvt_backend_ops *o = t->bops;
	/* Keys and device staging rows are read after the engine's writes. */
	if (!t->dev || !o->stream_notify ||
	    (!(t->pol->ops->needs & POLICY_NEED_KV) && !t->dstage.base))
		return 1;
	int st = __atomic_load_n(&t->kv_wait, __ATOMIC_ACQUIRE);
	if (st == 1)
		return 0;
	if (st == 2) {
		/* The writes this sync's keys come from were recorded before
		 * its request left the engine, so before the wait queued for
		 * it or for an earlier request: they are done. */
		t->kv_wait = 0;
		return 1;
	}
	t->wake = wake;
	t->wake_arg = arg;
	/* 1 first: the callback may run before stream_notify returns. */
	__atomic_store_n(&t->kv_wait, 1, __ATOMIC_RELEASE);
	if (o->stream_wait_event(t->bctx, t->stream, &t->ev_writes) ||
	    o->stream_notify(t->bctx, t->stream, writes_done_cb, t)) {
		/* The sync will wait on the host instead; it reports a
		 * device failure itself. */
		__atomic_store_n(&t->kv_wait, 0, __ATOMIC_RELEASE);
		return 1;
	}
	if (__atomic_load_n(&t->kv_wait, __ATOMIC_ACQUIRE) == 2) {
		t->kv_wait = 0;
		return 1;
	}
	return 0;
}

/* Step 1: every check that needs no policy decision.  Returns the number of
 * list entries (len + n_new summed over lists) the decisions need. */
static int validate(struct tenant *t, uint64_t no,
                    const struct ipc_sync_item *items, uint32_t n,
                    size_t *entries, size_t *lists, char *err,
                    size_t errlen)
{
	const struct shm_geom *g = &t->g;
	if (!items || !n)
		return errors_fmt(err, errlen, KVT_EINVAL, "sync without items");
	if (++t->serial == 0) {
		/* Wrapped: forget old marks so none can collide. */
		for (uint32_t i = 0; i < g->max_seqs; i++)
			t->seqs[i].mark = 0;
		t->serial = 1;
	}
	size_t ent = 0, nl = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		int64_t sl = tenant_seq_slot(t, it->seq);
		if (sl < 0)
			return errors_fmt(err, errlen, KVT_ENOSEQ,
			            "item %u: no open sequence %#llx", i,
			            (unsigned long long)it->seq);
		struct tseq *s = &t->seqs[sl];
		if (s->mark == t->serial)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "item %u: sequence %#llx appears twice", i,
			            (unsigned long long)it->seq);
		s->mark = t->serial;
		if (s->void_no && no <= s->void_no)
			return errors_fmt(err, errlen, KVT_ESTALE,
			            "item %u: sync %llu of sequence %#llx was "
			            "given up: kvt_seq_query answered that it "
			            "was not applied", i, (unsigned long long)no,
			            (unsigned long long)it->seq);
		if (it->counter != s->counter)
			return errors_fmt(err, errlen, KVT_ESTALE,
			            "item %u: sync counter %u, expected %u", i,
			            it->counter, s->counter);
		if (it->phase > KVT_PHASE_DECODE)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "item %u: unknown phase %u", i, it->phase);
		uint32_t lo, hi;
		if (item_layers(t, it, &lo, &hi))
			return errors_fmt(err, errlen, KVT_ELAYERS,
			            "item %u: layers [%u, %u) not within [0, %u)",
			            i, it->layer_lo, it->layer_hi, g->n_layers);
		if (it->n_new > s->room)
			return errors_fmt(err, errlen, KVT_EHEADROOM,
			            "item %u: %u new entries, headroom is %u%s", i,
			            it->n_new, s->room, s->room < g->headroom ?
			            " (as the last sync asked)" : "");
		if (it->headroom > g->headroom)
			return errors_fmt(err, errlen, KVT_EHEADROOM,
			            "item %u: asks headroom %u after the sync, "
			            "the registration's is %u", i, it->headroom,
			            g->headroom);
		if ((t->pol->ops->needs & POLICY_NEED_STAGED) &&
		    it->n_new > g->stage_tokens)
			return errors_fmt(err, errlen, KVT_EHEADROOM,
			            "item %u: %u new entries, staging ring holds "
			            "%u", i, it->n_new, g->stage_tokens);
		for (uint32_t layer = lo; layer < hi; layer++) {
			if ((uint64_t)s->n_seen[layer] + it->n_new > UINT32_MAX)
				return errors_fmt(err, errlen, KVT_ETOOLONG,
				            "item %u: layer %u: positions exhausted",
				            i, layer);
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				pace_point();
				uint32_t len = tlist_at(t, (uint32_t)sl, layer,
				                        head)->len;
				if ((uint64_t)len + it->n_new > g->max_tokens)
					return errors_fmt(err, errlen, KVT_ETOOLONG,
					            "item %u: layer %u head %u: "
					            "%u + %u entries exceed "
					            "max_tokens %u", i, layer,
					            head, len, it->n_new,
					            g->max_tokens);
				ent += (size_t)len + it->n_new;
				nl++;
			}
		}
	}
	*entries = ent;
	*lists = nl;
	return 0;
}

/* tenant_int.h */
int tenant_grow(void **p, size_t *cap, size_t want, size_t elem)
{
	if (want <= *cap)
		return 0;
	void *q = realloc(*p, want * elem);
	if (!q)
		return KVT_ENOMEM;
	*p = q;
	*cap = want;
	return 0;
}

/*
 * Device staging: the rows of positions [from, from + n) of (slot, layer)
 * as fill runs, contiguous in the ring but where it wraps, queued for the
 * next table flush.  The call after a call for the same slot, positions
 * and the previous layer (what a sync and an open make, layer after
 * layer) adds a block to its runs instead: a sequence's marks are one or
 * two runs, not one row per position and layer.
 */
static void poison_runs(struct tenant *t, uint32_t slot, uint32_t layer,
                        uint32_t from, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	if (!n)
		return;
	if (t->n_prun && t->pslot == slot && t->pfrom == from && t->pn == n &&
	    layer == t->player + 1) {
		for (uint32_t k = 0; k < t->pruns; k++)
			t->prun[t->n_prun - 1 - k].blocks++;
		t->player = layer;
		return;
	}
	if (t->n_prun + 2 > TENANT_POISON_RUNS && tenant_stage_poison_flush(t))
		t->failed = 1;
	const char *base = t->dstage.base;
	uint64_t eb = g->stage_entry_floats * sizeof(float);
	uint64_t ls = layer + 1 < g->n_layers
	              ? (uint64_t)((const char *)shm_stage_at(t->dstage.base, g,
	                                                      slot, layer + 1, 0) -
	                           (const char *)shm_stage_at(t->dstage.base, g,
	                                                      slot, layer, 0))
	              : 0;
	uint32_t r0 = from % g->stage_tokens;
	uint32_t n1 = g->stage_tokens - r0 < n ? g->stage_tokens - r0 : n;
	t->pruns = 0;
	for (uint32_t part = 0; part < 2; part++) {
		uint32_t k = part ? n - n1 : n1;
		if (!k)
			continue;
		const char *row = (const char *)shm_stage_at(
			t->dstage.base, g, slot, layer, from + (part ? n1 : 0));
		t->prun[t->n_prun++] = (struct kvt_backend_fill_run){
			.first = (uint64_t)(row - base), .block_stride = ls,
			.rows = k, .row_stride = (uint32_t)eb, .blocks = 1,
		};
		t->pruns++;
	}
	t->pslot = slot;
	t->player = layer;
	t->pfrom = from;
	t->pn = n;
}

void tenant_stage_poison(struct tenant *t, uint32_t slot, uint32_t layer,
                         uint32_t from, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	unsigned need = t->pol->ops->needs;
	if (!(need & POLICY_NEED_STAGED) || !g->stage_tokens)
		return;
	if (t->dstage.base) {
		poison_runs(t, slot, layer, from, n);
		return;
	}
	const float u = policy_unstaged();
	for (uint32_t k = 0; k < n; k++) {
		float *row = shm_stage_at(t->stage, g, slot, layer, from + k);
		float *q = row + g->stage_q_off, *lse = row + g->stage_lse_off;
		if (need & POLICY_NEED_X)
			row[0] = u;
		for (uint32_t h = 0; h < g->n_heads; h++) {
			if (need & POLICY_NEED_Q)
				q[(size_t)h * g->head_dim] = u;
			if (need & POLICY_NEED_LSE)
				lse[h] = u;
		}
	}
}

int tenant_stage_poison_flush(struct tenant *t)
{
	if (!t->n_prun)
		return 0;
	int rc = t->bops->fill_words(t->bctx, t->dstage.base,
	                             POLICY_UNSTAGED_BITS, t->ppat, t->n_ppat,
	                             t->prun, t->n_prun, t->stream);
	t->n_prun = 0;
	return rc;
}

void tenant_sync_reply(const struct tenant *t, struct ipc_rep *rep)
{
	rep->u.sync.press = t->sync_press;
	rep->u.sync.budget = t->sync_budget;
}

/*
 * Device staging: reads the n rows of (slot, layer) from position pos into
 * t->ring at row pos - ring_first, in one read_regions after the engine's
 * writes (the stream waited on them).
 */
static int ring_read(struct tenant *t, uint32_t slot, uint32_t layer,
                     uint32_t pos, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	for (uint32_t k = 0; k < n; k++)
		t->rsrc[k] = shm_stage_at(t->dstage.base, g, slot, layer, pos + k);
	size_t rb = g->stage_entry_floats * sizeof(float);
	return t->bops->read_regions(t->bctx, t->ring + (size_t)(pos -
	                                                          t->ring_first) *
	                                                 g->stage_entry_floats,
	                             rb, t->rsrc, n, rb, t->stream);
}

/*
 * Staged row of an earlier position, for policies with lookback: from the
 * ring of the host segment, or on device staging from the host copy of
 * the rows this sync may read (fetch_rows), the lookback rows read on the
 * first call that wants one (most syncs of snapkv or expected_attention
 * decide nothing and read none).  A failed read gives NULL and leaves its
 * code in t->ring_err, which fails the sync.
 */
static const float *stage_row(void *ctx, uint32_t pos)
{
	const struct stage_ctx *c = ctx;
	struct tenant *t = c->t;
	if (pos >= c->n_seen || (uint64_t)pos + t->g.stage_tokens < c->n_seen)
		return NULL;
	if (!t->dstage.base)
		return shm_stage_at(t->stage, &t->g, c->slot, c->layer, pos);
	if (pos < t->ring_first || pos - t->ring_first >= t->ring_n)
		return NULL;
	if (pos - t->ring_first < t->ring_lb && !t->ring_lb_ok) {
		int rc = ring_read(t, c->slot, c->layer, t->ring_first,
		                   t->ring_lb);
		if (rc) {
			t->ring_err = rc;
			return NULL;
		}
		t->ring_lb_ok = 1;
	}
	return t->ring + (size_t)(pos - t->ring_first) * t->g.stage_entry_floats;
}

/*
 * Device staging: copies the rows of the new positions [first, first + n)
 * of (slot, layer) into t->ring, after the lookback rows [first -
 * lookback, first) (from 0) that stage_row reads if the policy asks: all a
 * decision may read of the staged inputs (policy.h: the tenant guarantees
 * those).
 */
static int fetch_rows(struct tenant *t, uint32_t slot, uint32_t layer,
                      uint32_t first, uint32_t n)
{
	uint32_t lb = t->pol->lookback;
	t->ring_lb = first > lb ? lb : first;
	t->ring_first = first - t->ring_lb;
	t->ring_n = t->ring_lb + n;
	t->ring_lb_ok = t->ring_lb == 0;
	t->ring_err = 0;
	return ring_read(t, slot, layer, first, n);
}

/*
 * Copies the staged inputs the policy reads of positions [first, first + n)
 * out of the ring (which the client may keep writing) into t->in,
 * contiguous ([headroom] rows of each part, stage_all_floats), and points
 * pl at them.  n <= headroom (validated).
 */
static void gather_inputs(struct tenant *t, uint32_t slot, uint32_t layer,
                          uint32_t first, uint32_t n,
                          struct policy_layer *pl)
{
	const struct shm_geom *g = &t->g;
	size_t nq = (size_t)g->n_heads * g->head_dim;
	float *x = t->in;
	float *q = x + (size_t)g->headroom * g->d_model;
	float *lse = q + (size_t)g->headroom * nq;
	unsigned need = t->pol->ops->needs;
	for (uint32_t k = 0; k < n; k++) {
		const float *row =
			t->dstage.base
			? t->ring + (size_t)(first + k - t->ring_first) *
			                    g->stage_entry_floats
			: shm_stage_at(t->stage, g, slot, layer, first + k);
		if (need & POLICY_NEED_X)
			memcpy(x + (size_t)k * g->d_model, row,
			       g->d_model * sizeof(float));
		if (need & POLICY_NEED_Q)
			memcpy(q + k * nq, row + g->stage_q_off,
			       nq * sizeof(float));
		if (need & POLICY_NEED_LSE)
			memcpy(lse + (size_t)k * g->n_heads,
			       row + g->stage_lse_off,
			       g->n_heads * sizeof(float));
	}
	pl->x = need & POLICY_NEED_X ? x : NULL;
	pl->q = need & POLICY_NEED_Q ? q : NULL;
	pl->lse = need & POLICY_NEED_LSE ? lse : NULL;
}

/* Bytes of a page a device tenant stages for its policy: the K half
 * (what attn_band and kvpop read), or the whole page for a policy that
 * reads V too (expected_attention's value norm). */
static size_t staged_page_bytes(const struct tenant *t)
{
	size_t k = (size_t)t->g.page_tokens * t->g.head_dim * t->g.elem_bytes;
	return t->pol->ops->needs & POLICY_NEED_V ? 2 * k : k;
}

/*
 * Device tenant, first half of a sync: the scratch the apply step needs
 * (it cannot fail later) and the stream's wait for the client's writes,
 * ahead of every key read and move of this sync.
 */
static int device_prepare(struct tenant *t, size_t nlists, size_t entries,
                          char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	if (tenant_grow((void **)&t->blist, &t->blist_cap, nlists ? nlists : 1,
	         sizeof(*t->blist)) ||
	    tenant_grow((void **)&t->bpages, &t->bpages_cap,
	         nlists * g->max_pages + 1, sizeof(*t->bpages)) ||
	    tenant_grow((void **)&t->bmoves, &t->bmoves_cap, 2 * entries + 2,
	         sizeof(*t->bmoves)) ||
	    (t->dbases &&
	     (tenant_grow((void **)&t->bdl, &t->bdl_cap, nlists ? nlists : 1,
	           sizeof(*t->bdl)) ||
	      tenant_grow((void **)&t->bdrops, &t->bdrops_cap, entries + 1,
	           sizeof(*t->bdrops)))) ||
	    (t->dscorer &&
	     tenant_grow((void **)&t->jobs, &t->jobs_cap,
	          2 * (nlists / g->n_kv_heads) + 1, sizeof(*t->jobs))) ||
	    (t->dnorms &&
	     tenant_grow((void **)&t->njobs, &t->njobs_cap, nlists + 1,
	          sizeof(*t->njobs))) ||
	    ((t->dscorer || t->dnorms) &&
	     tenant_grow((void **)&t->pre, &t->pre_cap, entries + 1,
	          sizeof(*t->pre))))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	if (t->pol->ops->needs & POLICY_NEED_KV) {
		size_t n = (size_t)g->n_kv_heads * g->max_pages;
		if (tenant_grow((void **)&t->kbuf, &t->kbuf_cap,
		         n * staged_page_bytes(t), 1) ||
		    tenant_grow((void **)&t->ksrc, &t->ksrc_cap, n, sizeof(*t->ksrc)))
			return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	int rc = t->bops->stream_wait_event(t->bctx, t->stream, &t->ev_writes);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: %s", t->bops->name,
		            t->bops->last_error());
	return 0;
}

/*
 * Device tenant, a policy that reads K: the pages holding entries
 * [0, len) of a list get a host copy of their K half in t->kbuf (copied
 * per layer by read_regions, after the wait for the client's writes), and
 * pv points the policy at those copies.  attn_band and kvpop read K rows
 * only, so the V halves are copied only for a policy that reads them
 * (POLICY_NEED_V, staged_page_bytes).
 */
static void stage_keys(struct tenant *t, const uint32_t *pg, uint32_t len,
                       void **pv, uint32_t *nk)
{
	uint32_t used = (len + t->g.page_tokens - 1) / t->g.page_tokens;
	for (uint32_t p = 0; p < used; p++) {
		t->ksrc[*nk] = page_ptr(t, pg[p]);
		pv[p] = t->kbuf + (size_t)*nk * staged_page_bytes(t);
		(*nk)++;
	}
}

/*
 * Device tenant with compact_drops: queues the compaction of the sync's
 * nb lists that move (t->bdl, t->bdrops), after bringing the device copy
 * of the daemon's chunk bases up to date (chunks taken since the last
 * sync; the compaction reads only pages of chunks that existed before
 * it, and revoked chunks are destroyed only after the queued work).
 */
/* tenant_int.h */
int tenant_bases_sync(struct tenant *t)
{
	int changed = 0;
	for (uint32_t i = 0; i < t->max_chunks; i++)
		if (t->hbases[i] != t->chunks[i].pc.base) {
			t->hbases[i] = t->chunks[i].pc.base;
			changed = 1;
		}
	struct kvt_backend_region all = {0, (uint64_t)t->max_chunks *
	                                        sizeof(void *)};
	return changed ? t->bops->upload_regions(t->bctx, t->dbases, t->hbases,
	                                         &all, 1, t->stream)
	               : 0;
}

/* tenant_int.h */
struct kvt_backend_paged tenant_paged(const struct tenant *t)
{
	const struct shm_geom *g = &t->g;
	return (struct kvt_backend_paged){
		.records = shm_list_at(t->dtab_own, g, 0, 0, 0),
		.list_stride = g->list_stride,
		.max_pages = g->max_pages,
		.chunk_bases = t->dbases,
		.n_chunk_slots = t->max_chunks,
		.pages_per_chunk = g->pages_per_chunk,
		.page_bytes = g->page_bytes,
		.page_tokens = g->page_tokens,
		.row_bytes = g->head_dim * g->elem_bytes,
	};
}

static int compact_on_device(struct tenant *t, uint32_t nb)
{
	int rc = tenant_bases_sync(t);
	if (rc)
		return rc;
	const struct kvt_backend_paged pg = tenant_paged(t);
	return t->bops->compact_drops(t->bctx, &pg,
	                              t->g.max_seqs * t->lists_per_seq, t->bdl,
	                              nb, t->bdrops, t->stream);
}

/*
 * Device norms (tenant_int.h, dnorms): the norms of the new entries' keys
 * of every list of the sync, computed where the keys are, into t->pre as
 * [n_new][n_kv_heads] per (item, layer) in the decide loop's order.
 */
static int norms_on_device(struct tenant *t,
                           const struct ipc_sync_item *items, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	uint32_t nj = 0, at = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot, lo, hi;
		(void)item_seq(t, it, &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++) {
			for (uint32_t head = 0; head < g->n_kv_heads; head++)
				t->njobs[nj++] = (struct kvt_backend_norm_job){
					.record = (uint32_t)(slot * t->lists_per_seq +
					                     lidx(t, layer, head)),
					.first = tlist_at(t, slot, layer, head)->len,
					.n = it->n_new,
					.out_off = at + head,
					.out_stride = g->n_kv_heads,
				};
			at += it->n_new * g->n_kv_heads;
		}
	}
	int rc = tenant_bases_sync(t);
	if (rc)
		return rc;
	const struct kvt_backend_paged pg = tenant_paged(t);
	return t->bops->key_norms(t->bctx, &pg, g->max_seqs * t->lists_per_seq,
	                          t->pol->geom.dtype, g->head_dim, t->njobs,
	                          nj, t->pre, at, t->stream);
}

/*
 * Device scorer (tenant_int.h, dscorer): scores the new rows of x of every
 * (item, layer) of the sync where they are staged, in one scorer_run,
 * into t->pre in the order the decide loop takes them.  A (sequence,
 * layer)'s rows are contiguous in its ring but where they wrap: two jobs.
 */
static int score_on_device(struct tenant *t,
                           const struct ipc_sync_item *items, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	uint32_t nj = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, it, &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++) {
			uint32_t prev = s->n_seen[layer], r = prev % g->stage_tokens;
			uint32_t n1 = g->stage_tokens - r < it->n_new
			              ? g->stage_tokens - r : it->n_new;
			for (uint32_t part = 0; part < 2; part++) {
				uint32_t k = part ? it->n_new - n1 : n1;
				if (!k)
					continue;
				t->jobs[nj++] = (struct kvt_backend_score_job){
					.layer = layer, .n = k,
					.x = shm_stage_at(t->dstage.base, g, slot,
					                  layer, prev + (part ? n1 : 0)),
				};
			}
		}
	}
	return t->bops->scorer_run(t->bctx, t->dscorer, t->jobs, nj, t->pre,
	                           t->stream);
}

/* Where the walks of a sync stand: offsets into the per-sync scratch
 * (t->drop, t->ent_scr, t->newlen and t->ldrop by list, t->state_scr and
 * the device's decisions by (item, layer), t->pre by new row), what the
 * decisions need and free, and the device's compaction batch. */
struct sync_walk {
	size_t off, eoff, li, ly, pre_at;
	uint64_t need_pages, freed;
	uint32_t most_seen;
	uint32_t nb;   /* device: lists batched for one compact call */
	size_t bp, bm; /* their pages and move pairs so far */
};

/* The per-sync scratch sized for entries over nlists lists. */
static int sync_scratch(struct tenant *t, size_t entries, size_t nlists,
                        char *err, size_t errlen)
{
	size_t nlayers = nlists / t->g.n_kv_heads;
	if (tenant_grow((void **)&t->drop, &t->drop_cap, entries ? entries : 1, 1) ||
	    tenant_grow((void **)&t->newlen, &t->newlen_cap, nlists, sizeof(uint32_t)) ||
	    tenant_grow((void **)&t->ent_scr, &t->ent_cap, entries * t->ef + 1,
	         sizeof(float)) ||
	    tenant_grow((void **)&t->state_scr, &t->state_cap,
	         nlayers * t->sbytes + 1, 1) ||
	    tenant_grow((void **)&t->ldrop, &t->ldrop_cap, nlists + 1,
	         sizeof(*t->ldrop)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	return 0;
}

/* Before the decisions of a device tenant: its scratch, the device
 * scorer's and key norms' passes, the window's and the attention rule's
 * plans.  A host tenant passes through (the plans return at once). */
static int sync_prepare(struct tenant *t, const struct ipc_sync_item *items,
                        uint32_t n, size_t nlists, size_t entries,
                        char *err, size_t errlen)
{
	int rc;
	if (t->dev && (rc = device_prepare(t, nlists, entries, err, errlen)))
		return rc;
	if (t->dscorer && (rc = score_on_device(t, items, n)))
		return errors_fmt(err, errlen, rc, "%s backend: scoring staged "
		            "x: %s", t->bops->name, t->bops->last_error());
	if (t->dnorms && (rc = norms_on_device(t, items, n)))
		return errors_fmt(err, errlen, rc, "%s backend: key norms: %s",
		            t->bops->name, t->bops->last_error());
	if ((rc = tenant_window_plan(t, items, n, err, errlen)) ||
	    (rc = tenant_attn_plan(t, items, n, err, errlen)))
		return rc;
	return 0;
}

/*
 * The lists of one (item, layer) laid out for the policy in t->heads:
 * the new entries' positions written past len (nothing committed there
 * yet), drop marks cleared and scratch entry states copied where the host
 * decides, and the pages (or staged keys) where the policy reads keys.
 * Walks w->off and w->eoff over the layer's lists; 0 or an error.
 */
static int stage_layer(struct tenant *t, const struct ipc_sync_item *it,
                       struct tseq *s, uint32_t slot, uint32_t layer,
                       int dec, struct sync_walk *w, char *err,
                       size_t errlen)
{
	const struct shm_geom *g = &t->g;
	const unsigned need = t->pol->ops->needs;
	const uint32_t prev = s->n_seen[layer];
	const int host = tenant_attn_host(t, w->ly);
	uint32_t nk = 0; /* K halves staged for this layer */
	for (uint32_t head = 0; head < g->n_kv_heads; head++) {
		pace_point();
		const struct tlist *l = tlist_at(t, slot, layer, head);
		size_t li = lidx(t, layer, head);
		uint32_t *pos = seq_pos(t, s, li);
		uint32_t len = l->len + it->n_new;
		for (uint32_t k = 0; k < it->n_new; k++)
			pos[l->len + k] = prev + k;
		if (host)
			memset(t->drop + w->off, 0, len);
		float *e = t->ef && host ? t->ent_scr + w->eoff : NULL;
		if (e) {
			size_t old = (size_t)l->len * t->ef;
			memcpy(e, seq_ent(t, s, li), old * sizeof(float));
			memset(e + old, 0, (size_t)it->n_new * t->ef *
			       sizeof(float));
		}
		void **pv = NULL;
		if (!dec) {
			/* decide() does not run */
		} else if ((need & POLICY_NEED_KV) && t->dnorms) {
			pv = NULL; /* decide() takes pre */
		} else if ((need & POLICY_NEED_KV) && t->dev) {
			pv = t->pagev + (size_t)head * g->max_pages;
			stage_keys(t, seq_pages(t, s, li), len, pv, &nk);
		} else if (need & POLICY_NEED_KV) {
			pv = t->pagev + (size_t)head * g->max_pages;
			const uint32_t *pg = seq_pages(t, s, li);
			for (uint32_t p = 0; p < l->n_pages; p++)
				pv[p] = page_ptr(t, pg[p]);
		}
		t->heads[head] = (struct policy_head){
			.pos = pos, .ent = e, .pages = pv,
			.len = len, .drop = t->drop + w->off,
		};
		w->off += len;
		w->eoff += (size_t)len * t->ef;
	}
	int rc;
	if (nk && (rc = t->bops->read_regions(
		           t->bctx, t->kbuf, staged_page_bytes(t),
		           (const void *const *)t->ksrc, nk,
		           staged_page_bytes(t), t->stream)))
		return errors_fmt(err, errlen, rc, "%s backend: staging keys: "
		            "%s", t->bops->name, t->bops->last_error());
	return 0;
}

/* After the decision of one (item, layer) whose lists start at off in
 * t->drop: each list's new length into t->newlen, and the pages it needs
 * or frees into w. */
static void count_layer(struct tenant *t, const struct ipc_sync_item *it,
                        uint32_t slot, uint32_t layer, size_t off,
                        struct sync_walk *w)
{
	const struct shm_geom *g = &t->g;
	for (uint32_t head = 0; head < g->n_kv_heads; head++) {
		const struct tlist *l = tlist_at(t, slot, layer, head);
		uint32_t len = l->len + it->n_new, nd = 0;
		if (t->ldrop[w->li].idx)
			nd = t->ldrop[w->li].n;
		else
			for (uint32_t k = 0; k < len; k++)
				nd += t->drop[off + k] != 0;
		uint32_t want = pages_for(g, len - nd, item_room(t, it));
		t->newlen[w->li++] = len - nd;
		if (want > l->n_pages)
			w->need_pages += want - l->n_pages;
		else
			w->freed += l->n_pages - want;
		off += len;
	}
}

/*
 * Step 2 for item i's (sequence, layer): the policy decides on scratch
 * copies of the entry and layer states (t->ent_scr, t->state_scr,
 * committed in step 4), or the device decided it already, or nothing is
 * due; so a refusal here or in step 3 leaves no trace.  0 or an error.
 */
static int decide_layer(struct tenant *t, const struct ipc_sync_item *it,
                        uint32_t i, struct tseq *s, uint32_t slot,
                        uint32_t layer, struct sync_walk *w, char *err,
                        size_t errlen)
{
	const struct shm_geom *g = &t->g;
	const unsigned need = t->pol->ops->needs;
	const uint32_t prev = s->n_seen[layer], seen = prev + it->n_new;
	struct stage_ctx sc = {t, slot, layer, seen};
	if (seen > w->most_seen)
		w->most_seen = seen;
	struct policy_layer pl = {
		.layer = layer,
		.phase = (enum kvt_phase)it->phase,
		.n_new = it->n_new, .n_seen = seen,
		.staged = stage_row, .staged_ctx = &sc,
		.heads = t->heads,
		.state = t->sbytes ? t->state_scr + w->ly * t->sbytes : NULL,
	};
	/* a layer the device decides keeps its state there */
	if (t->sbytes && tenant_attn_host(t, w->ly))
		memcpy(pl.state, seq_state(t, s, layer), t->sbytes);
	/* a policy that decides nothing now reads nothing: no rows or keys
	 * are staged for it, nor for one the device decides
	 * (tenant_window.c, tenant_attn.c) */
	const int dec = policy_decides(t->pol, &pl) &&
	                tenant_window_host(t, w->ly) &&
	                tenant_attn_host(t, w->ly);
	int rc;
	if (t->dscorer || t->dnorms) {
		pl.pre = t->pre + w->pre_at * g->n_kv_heads;
		w->pre_at += it->n_new;
	} else if (dec && t->dstage.base &&
	           (rc = fetch_rows(t, slot, layer, prev, it->n_new))) {
		return errors_fmt(err, errlen, rc, "%s backend: reading staged "
		            "rows: %s", t->bops->name, t->bops->last_error());
	}
	if (dec && (need & POLICY_NEED_STAGED) && !t->dscorer)
		gather_inputs(t, slot, layer, prev, it->n_new, &pl);
	const size_t off0 = w->off;
	if ((rc = stage_layer(t, it, s, slot, layer, dec, w, err, errlen)))
		return rc;
	pace_point_slow(); /* the policy's work is per layer */
	uint64_t d0 = now_ns();
	struct tenant_ldrop *ld = t->ldrop + w->li;
	const int on_dev = tenant_attn_take(t, w->ly, ld);
	if (!on_dev)
		for (uint32_t h = 0; h < g->n_kv_heads; h++)
			ld[h].idx = NULL; /* marks in t->drop */
	rc = on_dev || tenant_window_take(t, w->ly, &pl)
	     ? 0 : policy_decide(t->pol, &pl);
	t->scorer_ns += now_ns() - d0;
	if (t->dstage.base && t->ring_err)
		return errors_fmt(err, errlen, t->ring_err, "%s backend: "
		            "reading staged rows: %s", t->bops->name,
		            t->bops->last_error());
	if (rc)
		return errors_fmt(err, errlen, rc, "item %u: sequence %#llx: "
		            "policy %s: %s", i, (unsigned long long)it->seq,
		            t->pol->ops->name, t->pol->why[0]
		            ? t->pol->why : kvt_strerror(rc));
	if (tenant_attn_mode(t, w->ly) == TENANT_ATTN_FLAGGED)
		return errors_fmt(err, errlen, KVT_EINVAL, "item %u: layer %u: "
		            "a staged q or lse is not finite (device)", i,
		            layer);
	count_layer(t, it, slot, layer, off0, w);
	return 0;
}

/* One list's compaction along its drops, queued where the list lives: the
 * drop indices batched for the device's compact_drops (device table), the
 * page addresses and moves batched for the backend's compact, or done on
 * the host.  The positions and entry states e (NULL: none) follow. */
static void compact_list(struct tenant *t, uint32_t slot, size_t li,
                         const struct tlist *l, uint32_t *pos, float *e,
                         const uint8_t *drop, const struct tenant_ldrop *ld,
                         uint32_t len, uint32_t *nl, struct sync_walk *w)
{
	const struct shm_geom *g = &t->g;
	const uint32_t row_bytes = g->head_dim * g->elem_bytes;
	const uint32_t *pg = seq_pages(t, &t->seqs[slot], li);
	uint32_t nm = ld->idx ? compact_plan_drops(ld->idx, ld->n, len,
	                                           t->moves, nl)
	                      : compact_plan(drop, len, t->moves, nl);
	if (!nm)
		return;
	if (t->dbases) {
		/* Only the drop indices go to the device (compact_drops). */
		t->bdl[w->nb++] = (struct kvt_backend_drops){
			.record = (uint32_t)(slot * t->lists_per_seq + li),
			.len = len, .n_drop = len - *nl,
			.drop_off = (uint32_t)w->bm,
		};
		if (ld->idx) {
			memcpy(t->bdrops + w->bm, ld->idx,
			       (size_t)ld->n * sizeof(uint32_t));
			w->bm += ld->n;
		} else {
			for (uint32_t k = 0; k < len; k++)
				if (drop[k])
					t->bdrops[w->bm++] = k;
		}
	} else if (t->dev) {
		/* The page addresses are taken before the frees of step 4; a
		 * chunk emptied by them is destroyed only after the queued
		 * compaction (chunk_free syncs the device first). */
		void **bpv = t->bpages + w->bp;
		for (uint32_t p = 0; p < l->n_pages; p++)
			bpv[p] = page_ptr(t, pg[p]);
		memcpy(t->bmoves + 2 * w->bm, t->moves,
		       (size_t)nm * 2 * sizeof(uint32_t));
		t->blist[w->nb++] = (struct kvt_backend_compact){
			.pages = bpv, .n_pages = l->n_pages,
			.page_tokens = g->page_tokens, .row_bytes = row_bytes,
			.n_moves = nm, .moves = t->bmoves + 2 * w->bm,
		};
		w->bp += l->n_pages;
		w->bm += nm;
	} else {
		for (uint32_t p = 0; p < l->n_pages; p++)
			t->pagev[p] = page_ptr(t, pg[p]);
		compact_cpu(t->pagev, g->page_tokens, row_bytes, t->moves, nm);
	}
	policy_move_entries(pos, e, t->ef, t->moves, nm);
}

/* Step 4, pass 1, for one list of item it: compacted, its entry states
 * committed, the pages beyond its new length freed, the counters moved;
 * t->newlen takes the pages it wants for pass 2. */
static void apply_list(struct tenant *t, const struct ipc_sync_item *it,
                       struct tseq *s, uint32_t slot, uint32_t layer,
                       uint32_t head, struct sync_walk *w)
{
	const struct shm_geom *g = &t->g;
	struct tlist *l = tlist_at(t, slot, layer, head);
	size_t li = lidx(t, layer, head);
	uint32_t *pos = seq_pos(t, s, li);
	uint32_t *pg = seq_pages(t, s, li);
	uint32_t len = l->len + it->n_new, nl = len;
	float *e = t->ef && tenant_attn_host(t, w->ly)
	           ? t->ent_scr + w->eoff : NULL;
	compact_list(t, slot, li, l, pos, e, t->drop + w->off,
	             &t->ldrop[w->li], len, &nl, w);
	if (e)
		memcpy(seq_ent(t, s, li), e, (size_t)nl * t->ef * sizeof(float));
	t->appended += it->n_new;
	t->evicted += len - nl;
	uint32_t want = pages_for(g, nl, item_room(t, it));
	while (l->n_pages > want)
		tenant_page_free(t, pg[--l->n_pages]);
	t->kept += nl;
	t->kept -= l->len;
	l->len = nl;
	l->epoch++;
	t->newlen[w->li++] = want; /* for pass 2 */
	w->off += len;
	w->eoff += (size_t)len * t->ef;
}

/* Step 4, pass 2: each list grown to the pages it wants, its table
 * record mirrored; then each sequence's counters and staging marks. */
static void allocate(struct tenant *t, uint64_t no,
                     const struct ipc_sync_item *items, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	size_t li_all = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, it, &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++) {
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				pace_point();
				struct tlist *l = tlist_at(t, slot, layer, head);
				uint32_t *pg = seq_pages(t, s,
				                         lidx(t, layer, head));
				uint32_t want = t->newlen[li_all++];
				while (l->n_pages < want)
					pg[l->n_pages++] = tenant_page_alloc(t);
				tenant_mirror(t, slot, layer, head);
			}
			s->n_seen[layer] += it->n_new;
			tenant_stage_poison(t, slot, layer, s->n_seen[layer],
			                    item_room(t, it));
		}
		s->room = item_room(t, it);
		s->counter++;
		s->last_no = no;
	}
}

/*
 * Device: one launch for the whole sync's compaction (nb lists), the
 * upload of the changed table records, then the event the client's
 * stream waits on before it touches the lists again.  All are only
 * queued; a failure here comes after the bookkeeping is committed, so the
 * tenant is marked failed and the server drops it.
 */
static int finish_device(struct tenant *t, uint32_t nb)
{
	int drc = 0;
	if (nb && t->dbases)
		drc = compact_on_device(t, nb);
	else if (nb)
		drc = t->bops->compact(t->bctx, t->blist, nb, t->stream);
	if (drc)
		t->failed = 1;
	else
		drc = tenant_table_flush(t);
	return drc;
}

int tenant_sync(struct tenant *t, uint64_t no,
                const struct ipc_sync_item *items, uint32_t n, char *err,
                size_t errlen)
{
	const struct shm_geom *g = &t->g;
	size_t entries = 0, nlists = 0;
	t->scorer_ns = 0;
	/* Reached the tenant, refused or not: the order checks of
	 * tenant_seq_reconcile and tenant_seq_query read it. */
	if (no > t->sync_no)
		t->sync_no = no;
	/* Step 1. */
	int rc = validate(t, no, items, n, &entries, &nlists, err, errlen);
	if (rc || (rc = sync_scratch(t, entries, nlists, err, errlen)) ||
	    (rc = sync_prepare(t, items, n, nlists, entries, err, errlen)))
		return rc;
	/* Step 2: decisions, one (sequence, layer) at a time.  t->drop's
	 * marks are cleared list by list, for the lists the host decides:
	 * the device's come back as indices (t->ldrop), so a sync of a
	 * device tenant makes no pass over its lists' entries. */
	struct sync_walk w = {0};
	for (uint32_t i = 0; i < n; i++) {
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, &items[i], &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, w.ly++)
			if ((rc = decide_layer(t, &items[i], i, s, slot, layer,
			                       &w, err, errlen)))
				return rc;
	}
	/* Step 3: pages; the last step that may fail. */
	rc = tenant_reserve_pages(t, w.need_pages, w.freed, err, errlen);
	if (rc)
		return rc;
	tenant_attn_commit(t); /* the device's entry states of this sync */
	/* Step 4: apply.  Pass 1 compacts, commits the policy states and
	 * frees, pass 2 allocates, so the frees of one list can serve the
	 * growth of another. */
	w.off = w.eoff = w.li = w.ly = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, it, &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, w.ly++) {
			if (t->sbytes && tenant_attn_host(t, w.ly))
				memcpy(seq_state(t, s, layer),
				       t->state_scr + w.ly * t->sbytes,
				       t->sbytes);
			for (uint32_t head = 0; head < g->n_kv_heads; head++) {
				pace_point();
				apply_list(t, it, s, slot, layer, head, &w);
			}
		}
	}
	allocate(t, no, items, n);
	t->syncs++;
	uint32_t b = policy_budget(t->pol, w.most_seen);
	t->sync_budget = b == UINT32_MAX ? 0 : b;
	t->sync_press = (uint32_t)lrintf(t->pol->pressure * (float)IPC_PRESS_ONE);
	int drc = t->dev ? finish_device(t, w.nb) : 0;
	tenant_revoke_empty(t);
	if (drc)
		return errors_fmt(err, errlen, KVT_ESYS, "%s backend: compaction: "
		            "%s", t->bops->name, t->bops->last_error());
	return 0;
}
