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
 * The staged inputs the policy reads come through tenant_stage.c, the
 * device's part of each step through tenant_device.c.
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

/* Step 1: every check that needs no policy decision.  Gives the number of
 * list entries (len + n_new summed over lists) the decisions need, of lists
 * and of new entries (n_new summed over lists). */
static int validate(struct tenant *t, uint64_t no,
                    const struct ipc_sync_item *items, uint32_t n,
                    size_t *entries, size_t *lists, size_t *fresh,
                    char *err, size_t errlen)
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
	size_t ent = 0, nl = 0, nf = 0;
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
				nf += it->n_new;
				nl++;
			}
		}
	}
	*entries = ent;
	*lists = nl;
	*fresh = nf;
	return 0;
}

void tenant_sync_reply(const struct tenant *t, struct ipc_rep *rep)
{
	rep->u.sync.press = t->sync_press;
	rep->u.sync.budget = t->sync_budget;
}

/* Where the walks of a sync stand: offsets into the per-sync scratch
 * (t->scr.drop, t->scr.ent, t->scr.newlen and t->dsync.ldrop by list, t->scr.state and
 * the device's decisions by (item, layer), t->dscore.pre by new row), what the
 * decisions need and free, and the device's compaction batch. */
struct sync_walk {
	size_t off, eoff, li, ly, pre_at;
	uint64_t need_pages, freed;
	uint32_t most_seen;
	size_t drops;  /* entries the decisions drop */
	uint32_t nb;   /* device: lists batched for one compact call */
	size_t bp, bm; /* their pages and move pairs so far */
};

/* The per-sync scratch sized for entries over nlists lists. */
static int sync_scratch(struct tenant *t, size_t entries, size_t nlists,
                        char *err, size_t errlen)
{
	size_t nlayers = nlists / t->g.n_kv_heads;
	/* A device rule's tenant touches the marks and entry states only in
	 * a layer it refuses: their growth need not copy them (megabytes as
	 * its lists grow).  Where the host decides, every page is written at
	 * every sync, and a fresh block would fault all of them in anew. */
	int (*grow)(void **, size_t *, size_t, size_t) =
		t->attn.state ? tenant_grow_fresh : tenant_grow;
	if (grow((void **)&t->scr.drop, &t->scr.drop_cap, entries ? entries : 1, 1) ||
	    tenant_grow((void **)&t->scr.newlen, &t->scr.newlen_cap, nlists, sizeof(uint32_t)) ||
	    grow((void **)&t->scr.ent, &t->scr.ent_cap, entries * t->ef + 1,
	         sizeof(float)) ||
	    tenant_grow((void **)&t->scr.state, &t->scr.state_cap,
	         nlayers * t->sbytes + 1, 1) ||
	    tenant_grow((void **)&t->dsync.ldrop, &t->dsync.ldrop_cap, nlists + 1,
	         sizeof(*t->dsync.ldrop)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	return 0;
}

/* Before the decisions of a device tenant: its scratch, the device
 * scorer's and key norms' passes, the window's and the attention rule's
 * plans.  A host tenant's sync never comes here (tenant_sync). */
static int sync_prepare(struct tenant *t, const struct ipc_sync_item *items,
                        uint32_t n, size_t nlists, size_t entries,
                        size_t fresh, char *err, size_t errlen)
{
	int rc;
	if ((rc = tenant_device_prepare(t, nlists, entries, fresh, err,
	                                errlen)))
		return rc;
	if (t->dscore.scorer &&
	    (rc = tenant_score_on_device(t, items, n, fresh, err, errlen)))
		return rc;
	/* the norms are decide()'s input: not needed where the policy's
	 * device rule decides every layer (t->attn.state) */
	if (t->dscore.norms && !t->attn.state &&
	    (rc = tenant_norms_on_device(t, items, n)))
		return errors_fmt(err, errlen, rc, "%s backend: key norms: %s",
		            t->bops->name, t->bops->last_error());
	if ((rc = tenant_window_plan(t, items, n, err, errlen)) ||
	    (rc = tenant_attn_plan(t, items, n, err, errlen)))
		return rc;
	return 0;
}

/*
 * The lists of one (item, layer) laid out for the policy in t->scr.heads:
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
	/* positions on the device only: none written here, unless the host
	 * decides this layer (a flagged one, which it refuses with the cpu
	 * backend's reason), which reads them back first */
	const int dpos = tenant_dpos(t), write_pos = !dpos || host;
	uint32_t nk = 0; /* K halves staged for this layer */
	for (uint32_t head = 0; head < g->n_kv_heads; head++) {
		pace_point();
		const struct tlist *l = tlist_at(t, slot, layer, head);
		size_t li = lidx(t, layer, head);
		uint32_t *pos = seq_pos(t, s, li);
		uint32_t len = l->len + it->n_new;
		int prc;
		if (dpos && host &&
		    (prc = tenant_attn_read_pos(t, slot, layer, head, l->len,
		                                pos)))
			return errors_fmt(err, errlen, prc, "%s backend: reading "
			                  "positions back: %s", t->bops->name,
			                  t->bops->last_error());
		for (uint32_t k = 0; write_pos && k < it->n_new; k++)
			pos[l->len + k] = prev + k;
		if (host)
			memset(t->scr.drop + w->off, 0, len);
		float *e = t->ef && host ? t->scr.ent + w->eoff : NULL;
		if (e) {
			size_t old = (size_t)l->len * t->ef;
			memcpy(e, seq_ent(t, s, li), old * sizeof(float));
			memset(e + old, 0, (size_t)it->n_new * t->ef *
			       sizeof(float));
		}
		void **pv = NULL;
		if (!dec) {
			/* decide() does not run */
		} else if ((need & POLICY_NEED_KV) && t->dscore.norms) {
			pv = NULL; /* decide() takes pre */
		} else if ((need & POLICY_NEED_KV) && t->dev) {
			pv = t->scr.pagev + (size_t)head * g->max_pages;
			tenant_stage_keys(t, seq_pages(t, s, li), len, pv, &nk);
		} else if (need & POLICY_NEED_KV) {
			pv = t->scr.pagev + (size_t)head * g->max_pages;
			const uint32_t *pg = seq_pages(t, s, li);
			for (uint32_t p = 0; p < l->n_pages; p++)
				pv[p] = page_ptr(t, pg[p]);
		}
		t->scr.heads[head] = (struct policy_head){
			.pos = pos, .ent = e, .pages = pv,
			.len = len, .drop = t->scr.drop + w->off,
		};
		w->off += len;
		w->eoff += (size_t)len * t->ef;
	}
	int rc;
	if (nk && (rc = t->bops->read_regions(
		           t->bctx, t->dsync.kbuf, tenant_staged_page_bytes(t),
		           (const void *const *)t->dsync.ksrc, nk,
		           tenant_staged_page_bytes(t), t->dsync.stream)))
		return errors_fmt(err, errlen, rc, "%s backend: staging keys: "
		            "%s", t->bops->name, t->bops->last_error());
	return 0;
}

/* The nonzero bytes of m [n], eight at a time: a byte's low seven bits
 * carried into its top one, or its top bit, says it is not zero; the
 * eight flags, moved to the bytes' low bits, are summed by one multiply
 * (no popcount instruction in the baseline x86-64). */
static uint32_t count_marks(const uint8_t *m, uint32_t n)
{
	const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full, ones = 0x0101010101010101ull;
	uint32_t c = 0, i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t x;
		memcpy(&x, m + i, 8);
		uint64_t f = ((((x & lo7) + lo7) | x) & ~lo7) >> 7;
		c += (uint32_t)((f * ones) >> 56);
	}
	for (; i < n; i++)
		c += m[i] != 0;
	return c;
}

/* The indices of m [n]'s nonzero bytes, ascending, into idx; their
 * number.  Words of eight zero bytes (most of a list) are skipped whole. */
static uint32_t gather_marks(const uint8_t *m, uint32_t n, uint32_t *idx)
{
	uint32_t c = 0, i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t x;
		memcpy(&x, m + i, 8);
		if (!x)
			continue;
		for (uint32_t k = 0; k < 8; k++)
			if (m[i + k])
				idx[c++] = i + k;
	}
	for (; i < n; i++)
		if (m[i])
			idx[c++] = i;
	return c;
}

/* After the decision of one (item, layer) whose lists start at off in
 * t->scr.drop: each list's new length into t->scr.newlen, and the pages it needs
 * or frees into w. */
static void count_layer(struct tenant *t, const struct ipc_sync_item *it,
                        uint32_t slot, uint32_t layer, size_t off,
                        struct sync_walk *w)
{
	const struct shm_geom *g = &t->g;
	for (uint32_t head = 0; head < g->n_kv_heads; head++) {
		const struct tlist *l = tlist_at(t, slot, layer, head);
		uint32_t len = l->len + it->n_new, nd = 0;
		if (t->dsync.ldrop[w->li].idx)
			nd = t->dsync.ldrop[w->li].n;
		else
			nd = count_marks(t->scr.drop + off, len);
		uint32_t want = pages_for(g, len - nd, item_room(t, it));
		t->scr.newlen[w->li++] = len - nd;
		w->drops += nd;
		if (want > l->n_pages)
			w->need_pages += want - l->n_pages;
		else
			w->freed += l->n_pages - want;
		off += len;
	}
}

/*
 * Step 2 for item i's (sequence, layer): the policy decides on scratch
 * copies of the entry and layer states (t->scr.ent, t->scr.state,
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
	struct tenant_stage_ctx sc = {t, slot, layer, seen};
	if (seen > w->most_seen)
		w->most_seen = seen;
	struct policy_layer pl = {
		.layer = layer,
		.phase = (enum kvt_phase)it->phase,
		.n_new = it->n_new, .n_seen = seen,
		.staged = tenant_stage_row, .staged_ctx = &sc,
		.heads = t->scr.heads,
		.state = t->sbytes ? t->scr.state + w->ly * t->sbytes : NULL,
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
	if (t->dscore.scorer || t->dscore.norms) {
		pl.pre = t->dscore.pre + w->pre_at * g->n_kv_heads;
		w->pre_at += it->n_new;
	} else if (dec && t->dstage.chunk.base &&
	           (rc = tenant_fetch_rows(t, slot, layer, prev, it->n_new))) {
		return errors_fmt(err, errlen, rc, "%s backend: reading staged "
		            "rows: %s", t->bops->name, t->bops->last_error());
	}
	if (dec && (need & POLICY_NEED_STAGED) && !t->dscore.scorer)
		tenant_gather_inputs(t, slot, layer, prev, it->n_new, &pl);
	const size_t off0 = w->off;
	if ((rc = stage_layer(t, it, s, slot, layer, dec, w, err, errlen)))
		return rc;
	pace_point_slow(); /* the policy's work is per layer */
	uint64_t d0 = now_ns();
	struct tenant_ldrop *ld = t->dsync.ldrop + w->li;
	const int on_dev = t->dev && tenant_attn_take(t, w->ly, ld);
	if (!on_dev)
		for (uint32_t h = 0; h < g->n_kv_heads; h++)
			ld[h].idx = NULL; /* marks in t->scr.drop */
	rc = on_dev || (t->dev && tenant_window_take(t, w->ly, &pl))
	     ? 0 : policy_decide(t->pol, &pl);
	t->scorer_ns += now_ns() - d0;
	if (t->dstage.chunk.base && t->dstage.ring_err)
		return errors_fmt(err, errlen, t->dstage.ring_err, "%s backend: "
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

/* One list's compaction along its drops (its device table record, its
 * page ids pg), queued where the list lives: the drop indices batched for
 * the device's compact_drops (device table), the page addresses and moves
 * batched for the backend's compact, or done on the host.  The positions
 * and entry states e (NULL: none) follow. */
static void compact_list(struct tenant *t, uint32_t record,
                         const struct tlist *l, const uint32_t *pg,
                         uint32_t *pos, float *e, const uint8_t *drop,
                         const struct tenant_ldrop *ld, uint32_t len,
                         uint32_t *nl, struct sync_walk *w)
{
	const struct shm_geom *g = &t->g;
	const uint32_t row_bytes = g->head_dim * g->elem_bytes;
	uint32_t nm;
	if (ld->idx && tenant_dpos(t)) {
		/* no host positions to move (the device's half moved them),
		 * so no plan: nm only says whether a kept entry moves (a drop
		 * below the new length); compact_drops takes the indices (a
		 * rule's state exists only beside the device table's bases,
		 * tenant_attn_init) */
		*nl = len - ld->n;
		nm = ld->n && ld->idx[0] < *nl;
	} else if (ld->idx) {
		nm = compact_plan_drops(ld->idx, ld->n, len, t->scr.moves, nl);
	} else if (t->dsync.dbases) {
		/* the marks as indices where the device takes them: one pass
		 * over the list, the plan then over its drops only */
		uint32_t *d = t->dsync.bdrops + w->bm;
		nm = compact_plan_drops(d, gather_marks(drop, len, d), len,
		                        t->scr.moves, nl);
	} else {
		nm = compact_plan(drop, len, t->scr.moves, nl);
	}
	if (!nm)
		return;
	if (t->dsync.dbases) {
		/* Only the drop indices go to the device (compact_drops). */
		t->dsync.bdl[w->nb++] = (struct kvt_backend_drops){
			.record = record,
			.len = len, .n_drop = len - *nl,
			.drop_off = (uint32_t)w->bm,
		};
		if (ld->idx)
			memcpy(t->dsync.bdrops + w->bm, ld->idx,
			       (size_t)ld->n * sizeof(uint32_t));
		w->bm += len - *nl;
	} else if (t->dev) {
		/* The page addresses are taken before the frees of step 4; a
		 * chunk emptied by them is destroyed only after the queued
		 * compaction (chunk_free syncs the device first). */
		void **bpv = t->dsync.bpages + w->bp;
		for (uint32_t p = 0; p < l->n_pages; p++)
			bpv[p] = page_ptr(t, pg[p]);
		memcpy(t->dsync.bmoves + 2 * w->bm, t->scr.moves,
		       (size_t)nm * 2 * sizeof(uint32_t));
		t->dsync.blist[w->nb++] = (struct kvt_backend_compact){
			.pages = bpv, .n_pages = l->n_pages,
			.page_tokens = g->page_tokens, .row_bytes = row_bytes,
			.n_moves = nm, .moves = t->dsync.bmoves + 2 * w->bm,
		};
		w->bp += l->n_pages;
		w->bm += nm;
	} else {
		for (uint32_t p = 0; p < l->n_pages; p++)
			t->scr.pagev[p] = page_ptr(t, pg[p]);
		compact_cpu(t->scr.pagev, g->page_tokens, row_bytes, t->scr.moves, nm);
	}
	if (!tenant_dpos(t))
		policy_move_entries(pos, e, t->ef, t->scr.moves, nm);
}

/* Step 4, pass 1, for one list of item it: compacted, its entry states
 * committed, the pages beyond its new length freed, the counters moved;
 * t->scr.newlen takes the pages it wants for pass 2. */
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
	           ? t->scr.ent + w->eoff : NULL;
	/* count_layer's new length: a list that drops nothing has nothing to
	 * plan (its marks need no second pass) */
	if (t->scr.newlen[w->li] != len)
		compact_list(t, (uint32_t)(slot * t->lists_per_seq + li), l,
		             pg, pos, e, t->scr.drop + w->off,
		             &t->dsync.ldrop[w->li], len, &nl, w);
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
	t->scr.newlen[w->li++] = want; /* for pass 2 */
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
				uint32_t want = t->scr.newlen[li_all++];
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
	if (nb && t->dsync.dbases)
		drc = tenant_compact_on_device(t, nb);
	else if (nb)
		drc = t->bops->compact(t->bctx, t->dsync.blist, nb, t->dsync.stream);
	if (drc)
		t->dsync.failed = 1;
	else
		drc = tenant_table_flush(t);
	return drc;
}

static int sync_run(struct tenant *t, uint64_t no,
                    const struct ipc_sync_item *items, uint32_t n,
                    char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	size_t entries = 0, nlists = 0, fresh = 0;
	t->scorer_ns = 0;
	/* Reached the tenant, refused or not: the order checks of
	 * tenant_seq_reconcile and tenant_seq_query read it. */
	if (no > t->sync_no)
		t->sync_no = no;
	/* Step 1. */
	int rc = validate(t, no, items, n, &entries, &nlists, &fresh, err,
	                  errlen);
	if (rc || (rc = sync_scratch(t, entries, nlists, err, errlen)) ||
	    (t->dev && (rc = sync_prepare(t, items, n, nlists, entries, fresh,
	                                  err, errlen))))
		return rc;
	/* Step 2: decisions, one (sequence, layer) at a time.  t->scr.drop's
	 * marks are cleared list by list, for the lists the host decides:
	 * the device's come back as indices (t->dsync.ldrop), so a sync of a
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
	/* Step 3: the drop indices' room and pages; the last step that may
	 * fail. */
	if (t->dsync.dbases &&
	    tenant_grow((void **)&t->dsync.bdrops, &t->dsync.bdrops_cap,
	                w.drops + 1, sizeof(*t->dsync.bdrops)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	rc = tenant_reserve_pages(t, w.need_pages, w.freed, err, errlen);
	if (rc)
		return rc;
	if (t->dev)
		tenant_attn_commit(t); /* the device's entry states */
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
				       t->scr.state + w.ly * t->sbytes,
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

int tenant_sync(struct tenant *t, uint64_t no,
                const struct ipc_sync_item *items, uint32_t n, char *err,
                size_t errlen)
{
	const uint64_t c0 = now_thread_cpu_ns();
	int rc = sync_run(t, no, items, n, err, errlen);
	t->sync_cpu_ns = now_thread_cpu_ns() - c0;
	return rc;
}
