/*
 * tenant_device.c — the device's part of a sync of a device tenant: the
 * wait for the engine's writes, the scratch and the stream's wait before
 * the decisions, keys staged to host memory for a policy that reads them
 * there, the device copy of the chunk bases, the scorer, key norms
 * and compaction run where the pages are, and the lookup of a policy's
 * device rule with the check of its layout.  See tenant_int.h.
 */
#include "errors.h"
#include "tenant_int.h"

#include <string.h>

#include "policy.h"

/* Runs on a driver thread (or inline) once the tenant stream passed the
 * engine's writes: no backend calls here, only the flag and the wakeup. */
static void writes_done_cb(void *arg)
{
	struct tenant *t = arg;
	__atomic_store_n(&t->dsync.kv_wait, 2, __ATOMIC_RELEASE);
	t->dsync.wake(t->dsync.wake_arg);
}

int tenant_sync_ready(struct tenant *t, void (*wake)(void *), void *arg)
{
	const struct kvt_backend_ops *o = t->bops;
	/* Keys and device staging rows are read after the engine's writes. */
	if (!t->dev || !o->stream_notify ||
	    (!(t->pol->ops->needs & POLICY_NEED_KV) && !t->dstage.chunk.base))
		return 1;
	int st = __atomic_load_n(&t->dsync.kv_wait, __ATOMIC_ACQUIRE);
	if (st == 1)
		return 0;
	if (st == 2) {
		/* The writes this sync's keys come from were recorded before
		 * its request left the engine, so before the wait queued for
		 * it or for an earlier request: they are done. */
		t->dsync.kv_wait = 0;
		return 1;
	}
	t->dsync.wake = wake;
	t->dsync.wake_arg = arg;
	/* 1 first: the callback may run before stream_notify returns. */
	__atomic_store_n(&t->dsync.kv_wait, 1, __ATOMIC_RELEASE);
	if (o->stream_wait_event(t->bctx, t->dsync.stream, &t->dsync.ev_writes) ||
	    o->stream_notify(t->bctx, t->dsync.stream, writes_done_cb, t)) {
		/* The sync will wait on the host instead; it reports a
		 * device failure itself. */
		__atomic_store_n(&t->dsync.kv_wait, 0, __ATOMIC_RELEASE);
		return 1;
	}
	if (__atomic_load_n(&t->dsync.kv_wait, __ATOMIC_ACQUIRE) == 2) {
		t->dsync.kv_wait = 0;
		return 1;
	}
	return 0;
}

int tenant_rule_lookup(const struct tenant *t, const char *name,
                       uint32_t version, uint32_t params_bytes,
                       uint32_t job_bytes,
                       const struct kvt_backend_rule **out, char *err,
                       size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	const struct kvt_backend_rule *b = o->rule ? o->rule(name) : NULL;
	*out = NULL;
	if (!b || !b->run)
		return 0;
	if (b->version != version || b->params_bytes != params_bytes ||
	    b->job_bytes != job_bytes)
		return errors_fmt(err, errlen, KVT_ENOTSUP, "the %s backend's "
		                  "device rule %s has layout version %u (params "
		                  "%u, job %u bytes), this kvtrimd's %u (%u, %u "
		                  "bytes): a backend library of another build",
		                  o->name, name, b->version, b->params_bytes,
		                  b->job_bytes, version, params_bytes,
		                  job_bytes);
	*out = b;
	return 0;
}

int tenant_rule_drops_ok(const uint32_t *out, uint32_t n, uint32_t j,
                         uint32_t n_drop, uint32_t drop_off, uint32_t L)
{
	const uint32_t *idx = out + 2 * (size_t)n + drop_off;
	if (out[n + j] != n_drop)
		return 0;
	for (uint32_t d = 0; d < n_drop; d++)
		if (idx[d] >= L || (d && idx[d] <= idx[d - 1]))
			return 0;
	return 1;
}

/* Bytes of a page a device tenant stages for its policy: the K half
 * (what the attention policies read), or the whole page for a policy that
 * reads V too (POLICY_NEED_V: a value norm). */
size_t tenant_staged_page_bytes(const struct tenant *t)
{
	size_t k = (size_t)t->g.page_tokens * t->g.head_dim * t->g.elem_bytes;
	return t->pol->ops->needs & POLICY_NEED_V ? 2 * k : k;
}

/*
 * Device tenant, first half of a sync: the scratch the apply step needs
 * (it cannot fail later) and the stream's wait for the client's writes,
 * ahead of every key read and move of this sync.
 */
int tenant_device_prepare(struct tenant *t, size_t nlists, size_t entries,
                          size_t fresh, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	/* With compact_drops the drop indices' room waits for the decisions
	 * (tenant_sync.c, step 3): it is what they drop, not the entries. */
	if ((!t->dsync.dbases &&
	     (tenant_grow((void **)&t->dsync.blist, &t->dsync.blist_cap,
	                  nlists ? nlists : 1, sizeof(*t->dsync.blist)) ||
	      tenant_grow((void **)&t->dsync.bpages, &t->dsync.bpages_cap,
	                  nlists * g->max_pages + 1,
	                  sizeof(*t->dsync.bpages)) ||
	      tenant_grow((void **)&t->dsync.bmoves, &t->dsync.bmoves_cap,
	                  2 * entries + 2, sizeof(*t->dsync.bmoves)))) ||
	    (t->dsync.dbases &&
	     tenant_grow((void **)&t->dsync.bdl, &t->dsync.bdl_cap,
	                 nlists ? nlists : 1, sizeof(*t->dsync.bdl))) ||
	    (t->dscore.scorer &&
	     tenant_grow((void **)&t->dscore.jobs, &t->dscore.jobs_cap,
	          2 * (nlists / g->n_kv_heads) + 1, sizeof(*t->dscore.jobs))) ||
	    (t->dscore.norms &&
	     tenant_grow((void **)&t->dscore.njobs, &t->dscore.njobs_cap, nlists + 1,
	          sizeof(*t->dscore.njobs))) ||
	    ((t->dscore.scorer || t->dscore.norms) &&
	     tenant_grow((void **)&t->dscore.pre, &t->dscore.pre_cap, fresh + 1,
	          sizeof(*t->dscore.pre))))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	if (t->pol->ops->needs & POLICY_NEED_KV) {
		size_t n = (size_t)g->n_kv_heads * g->max_pages;
		if (tenant_grow((void **)&t->dsync.kbuf, &t->dsync.kbuf_cap,
		         n * tenant_staged_page_bytes(t), 1) ||
		    tenant_grow((void **)&t->dsync.ksrc, &t->dsync.ksrc_cap, n, sizeof(*t->dsync.ksrc)))
			return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	int rc = t->bops->stream_wait_event(t->bctx, t->dsync.stream, &t->dsync.ev_writes);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: %s", t->bops->name,
		            t->bops->last_error());
	return 0;
}

/*
 * Device tenant, a policy that reads K: the pages holding entries
 * [0, len) of a list get a host copy of their K half in t->dsync.kbuf (copied
 * per layer by read_regions, after the wait for the client's writes), and
 * pv points the policy at those copies.  The attention policies read K
 * rows only, so the V halves are copied only for a policy that reads them
 * (POLICY_NEED_V, tenant_staged_page_bytes).
 */
void tenant_stage_keys(struct tenant *t, const uint32_t *pg, uint32_t len,
                       void **pv, uint32_t *nk)
{
	uint32_t used = (len + t->g.page_tokens - 1) / t->g.page_tokens;
	for (uint32_t p = 0; p < used; p++) {
		t->dsync.ksrc[*nk] = page_ptr(t, pg[p]);
		pv[p] = t->dsync.kbuf + (size_t)*nk * tenant_staged_page_bytes(t);
		(*nk)++;
	}
}

/*
 * Device tenant with compact_drops: queues the compaction of the sync's
 * nb lists that move (t->dsync.bdl, t->dsync.bdrops), after bringing the device copy
 * of the daemon's chunk bases up to date (chunks taken since the last
 * sync; the compaction reads only pages of chunks that existed before
 * it, and revoked chunks are destroyed only after the queued work).
 */
int tenant_bases_sync(struct tenant *t)
{
	int changed = 0;
	for (uint32_t i = 0; i < t->max_chunks; i++)
		if (t->dsync.hbases[i] != t->chunks[i].pc.base) {
			t->dsync.hbases[i] = t->chunks[i].pc.base;
			changed = 1;
		}
	struct kvt_backend_region all = {0, (uint64_t)t->max_chunks *
	                                        sizeof(void *)};
	return changed ? t->bops->upload_regions(t->bctx, t->dsync.dbases, t->dsync.hbases,
	                                         &all, 1, t->dsync.stream)
	               : 0;
}

struct kvt_backend_paged tenant_paged(const struct tenant *t)
{
	const struct shm_geom *g = &t->g;
	return (struct kvt_backend_paged){
		.records = shm_list_at(t->dtable.own, g, 0, 0, 0),
		.list_stride = g->list_stride,
		.max_pages = g->max_pages,
		.chunk_bases = t->dsync.dbases,
		.n_chunk_slots = t->max_chunks,
		.pages_per_chunk = g->pages_per_chunk,
		.page_bytes = g->page_bytes,
		.page_tokens = g->page_tokens,
		.row_bytes = g->head_dim * g->elem_bytes,
	};
}

int tenant_compact_on_device(struct tenant *t, uint32_t nb)
{
	int rc = tenant_bases_sync(t);
	if (rc)
		return rc;
	const struct kvt_backend_paged pg = tenant_paged(t);
	return t->bops->compact_drops(t->bctx, &pg,
	                              t->g.max_seqs * t->lists_per_seq, t->dsync.bdl,
	                              nb, t->dsync.bdrops, t->dsync.stream);
}

/*
 * Device norms (tenant_int.h, struct tdscore): the norms of the new entries' keys
 * of every list of the sync, computed where the keys are, into t->dscore.pre as
 * [n_new][n_kv_heads] per (item, layer) in the decide loop's order.
 */
int tenant_norms_on_device(struct tenant *t,
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
				t->dscore.njobs[nj++] = (struct kvt_backend_norm_job){
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
	                          t->pol->geom.dtype, g->head_dim, t->dscore.njobs,
	                          nj, t->dscore.pre, at, t->dsync.stream);
}

/*
 * Device scorer (tenant_int.h, struct tdscore): scores the new rows of x of every
 * (item, layer) of the sync where they are staged, in one scorer_run shared
 * with the syncs of other tenants holding the same weights (tscorer_run),
 * into t->dscore.pre in the order the decide loop takes them.  A (sequence,
 * layer)'s rows are contiguous in its ring but where they wrap: two jobs.
 */
int tenant_score_on_device(struct tenant *t,
                           const struct ipc_sync_item *items, uint32_t n,
                           size_t fresh, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	uint32_t nj = 0;
	/* where the policy's device rule reads the scores there, they are
	 * copied there too, by the job (dev: the rows' place in the sync's
	 * [rows][n_kv_heads], as in dscore.pre) */
	float *dev;
	int rc = tenant_attn_pre(t, fresh, &dev, err, errlen);
	if (rc)
		return rc;
	size_t row = 0;
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
				t->dscore.jobs[nj++] = (struct kvt_backend_score_job){
					.layer = layer, .n = k,
					.x = shm_stage_at(t->dstage.chunk.base, g, slot,
					                  layer, prev + (part ? n1 : 0)),
					.dev = dev ? dev + row * g->n_kv_heads
					           : NULL,
				};
				row += k;
			}
		}
	}
	/* with the device copy, nothing comes back: the host reads the
	 * scores only to refuse a flagged layer (tenant_attn_plan) */
	return tscorer_run(t->dscore.scorer, t->dscore.jobs, nj,
	                   dev ? NULL : t->dscore.pre, t->dsync.stream,
	                   t->gather_us, err, errlen);
}
