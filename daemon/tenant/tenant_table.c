/*
 * tenant_table.c — the table segment's records that mirror every list of
 * a tenant (written after each change; the daemon never reads them back
 * for a decision), and on a device tenant their upload to both device
 * copies of the table.  See tenant_int.h.
 */
#include "tenant_int.h"

#include <string.h>

/*
 * Writes the private state of one list into its table record.  On a
 * device tenant the record's changed parts are queued for upload: the
 * header, and the page ids from the first one that differs from what the
 * record held (which is what the device copy holds: every change is
 * uploaded).  Compaction keeps a list's pages and only frees or adds at
 * its end, so a sync uploads a few ids per list, not all of them.
 */
void tenant_mirror(struct tenant *t, uint32_t slot, uint32_t layer,
                   uint32_t head)
{
	const struct tlist *l = tlist_at(t, slot, layer, head);
	struct shm_list *r = shm_list_at(t->table, &t->g, slot, layer, head);
	const uint32_t *pg = t->seqs[slot].open
	                     ? seq_pages(t, &t->seqs[slot], lidx(t, layer, head))
	                     : NULL;
	uint32_t np = pg ? l->n_pages : 0, old = r->n_pages, same = 0;
	while (same < np && same < old && r->pages[same] == pg[same])
		same++;
	r->len = l->len;
	r->n_pages = l->n_pages;
	r->epoch = l->epoch;
	/* Only what changed is written: the ids from the first difference,
	 * and zeros over the ids the list gave up (those beyond a record's
	 * n_pages are always 0 in the host table, so the rest already are). */
	if (np > same)
		memcpy(r->pages + same, pg + same,
		       (size_t)(np - same) * sizeof(uint32_t));
	if (old > np)
		memset(r->pages + np, 0, (size_t)(old - np) * sizeof(uint32_t));
	/* Each list is mirrored at most once per operation and takes at most
	 * two regions, so the array (two per list) cannot overflow; ids
	 * beyond n_pages are unspecified on the device. */
	if (!t->dtable.shared.base || t->dtable.n_dirty + 2 > 2 * t->g.max_seqs * t->lists_per_seq)
		return;
	uint64_t off = (uint64_t)((char *)r - (char *)t->table);
	uint64_t tail = (uint64_t)(l->n_pages - (same < l->n_pages ? same
	                                                         : l->n_pages)) *
	                sizeof(uint32_t);
	if (same == 0) {
		t->dtable.dirty[t->dtable.n_dirty++] = (struct kvt_backend_region){
			off, sizeof(*r) + tail};
		return;
	}
	t->dtable.dirty[t->dtable.n_dirty++] = (struct kvt_backend_region){off, sizeof(*r)};
	if (tail)
		t->dtable.dirty[t->dtable.n_dirty++] = (struct kvt_backend_region){
			off + sizeof(*r) + (uint64_t)same * sizeof(uint32_t),
			tail};
}

/*
 * Device tenants: queues on the tenant's stream the upload of the records
 * tenant_mirror() changed, into both device tables (the daemon's own and
 * the client's), then the COMPACT event, so the client's stream
 * (which waits on that event after every reply that changes lists) reads
 * the new table.  A failure marks the tenant failed (the server drops it).
 */
int tenant_table_flush(struct tenant *t)
{
	if (!t->dev)
		return 0;
	int rc = tenant_stage_poison_flush(t);
	if (!rc && t->dtable.n_dirty)
		rc = t->bops->upload_twin(t->bctx, t->dtable.own, t->dtable.shared.base,
		                          t->table, t->dtable.dirty, t->dtable.n_dirty,
		                          t->dsync.stream);
	t->dtable.n_dirty = 0;
	if (!rc)
		rc = t->bops->event_record(t->bctx, &t->dsync.ev_compact, t->dsync.stream);
	if (rc)
		t->dsync.failed = 1;
	return rc;
}
