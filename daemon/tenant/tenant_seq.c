/*
 * tenant_seq.c — sequences and their page lists: opening (headroom pages
 * for every list), forking (a copy of another's lists and policy state),
 * closing (pages back, generation bumped), and the query of one
 * sequence's counter and lengths.  See tenant_int.h.
 */
#include "tenant_int.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ sequences */

/* The open slot an id names, or -1: another tenant's id (ipc/seqid.h),
 * a closed sequence's and a reused slot's old ids name none. */
int64_t tenant_seq_slot(const struct tenant *t, uint64_t seq)
{
	uint32_t slot = seqid_slot(seq), gen = seqid_gen(seq);
	if (!seqid_of_tenant(seq, t->id) || slot >= t->g.max_seqs ||
	    !t->seqs[slot].open || t->seqs[slot].gen != gen)
		return -1;
	return slot;
}

void tenant_seq_release(struct tseq *s)
{
	free(s->n_seen);
	free(s->pages);
	free(s->pos);
	free(s->ent);
	free(s->state);
	s->n_seen = s->pages = s->pos = NULL;
	s->ent = NULL;
	s->state = NULL;
}

/* First half of an open: a free slot (*slot) and its per-sequence arrays
 * (n_seen and state zeroed); KVT_ESEQLIMIT or KVT_ENOMEM, nothing kept. */
static int seq_slot_new(struct tenant *t, uint32_t *slot_out)
{
	const struct shm_geom *g = &t->g;
	uint32_t slot = 0;
	while (slot < g->max_seqs && t->seqs[slot].open)
		slot++;
	if (slot == g->max_seqs)
		return KVT_ESEQLIMIT;

	struct tseq *s = &t->seqs[slot];
	s->n_seen = calloc(g->n_layers, sizeof(uint32_t));
	s->pages = calloc((size_t)t->lists_per_seq * g->max_pages,
	                  sizeof(uint32_t));
	s->pos = malloc((size_t)t->lists_per_seq * t->pos_cap *
	                sizeof(uint32_t));
	if (t->ef)
		s->ent = malloc((size_t)t->lists_per_seq * t->pos_cap * t->ef *
		                sizeof(float));
	if (t->sbytes)
		s->state = calloc(g->n_layers, t->sbytes);
	if (!s->n_seen || !s->pages || !s->pos || (t->ef && !s->ent) ||
	    (t->sbytes && !s->state)) {
		tenant_seq_release(s);
		return KVT_ENOMEM;
	}
	*slot_out = slot;
	return 0;
}

/* Second half of an open: slot s becomes open, numbered by the latest
 * open, with the registration's headroom. */
static void seq_slot_start(struct tenant *t, struct tseq *s)
{
	s->open = 1;
	s->used = 1;
	s->counter = 0;
	s->last_no = 0;
	s->void_no = 0;
	s->mark = 0;
	s->open_no = t->open_no;
	s->room = t->g.headroom;
	t->n_open++;
}

/*
 * First half of an open or a fork, and the start of the second: a slot,
 * the sequence's arrays and `need` pages, checked before anything is
 * allocated (a refused open, parked and asked again at every wake-up
 * while the pool is full, costs none); then *slot is open.  KVT_ESEQLIMIT,
 * KVT_ENOMEM or a pages refusal (reason in err) with nothing changed.
 */
static int seq_slot_take(struct tenant *t, uint64_t need, uint32_t *slot,
                         char *err, size_t errlen)
{
	uint64_t k;
	if (t->n_open >= t->g.max_seqs)
		return KVT_ESEQLIMIT;
	int rc = tenant_pages_check(t, need, 0, &k, err, errlen);
	if (rc || (rc = seq_slot_new(t, slot)))
		return rc;
	struct tseq *s = &t->seqs[*slot];
	if ((rc = tenant_reserve_pages(t, need, 0, err, errlen))) {
		tenant_seq_release(s);
		return rc;
	}
	seq_slot_start(t, s);
	return 0;
}

int tenant_seq_open(struct tenant *t, uint64_t *seq)
{
	return tenant_seq_open_why(t, seq, NULL, 0);
}

int tenant_seq_open_why(struct tenant *t, uint64_t *seq, char *err,
                        size_t errlen)
{
	const struct shm_geom *g = &t->g;
	uint32_t per_list = pages_for(g, 0, g->headroom);
	uint32_t slot;
	int rc = seq_slot_take(t, (uint64_t)per_list * t->lists_per_seq, &slot,
	                       err, errlen);
	if (rc)
		return rc;
	struct tseq *s = &t->seqs[slot];
	for (uint32_t layer = 0; layer < g->n_layers; layer++)
		for (uint32_t head = 0; head < g->n_kv_heads; head++) {
			struct tlist *l = tlist_at(t, slot, layer, head);
			uint32_t *pg = seq_pages(t, s, lidx(t, layer, head));
			for (uint32_t i = 0; i < per_list; i++)
				pg[i] = tenant_page_alloc(t);
			l->len = 0;
			l->n_pages = per_list;
			l->epoch++;
			tenant_mirror(t, slot, layer, head);
		}
	for (uint32_t layer = 0; layer < g->n_layers; layer++)
		tenant_stage_poison(t, slot, layer, 0, s->room);
	/* Resets the allocation cursor; nothing is empty. */
	tenant_revoke_empty(t);
	*seq = seqid_make(t->id, s->gen, slot);
	return tenant_table_flush(t) ? KVT_ESYS : 0;
}

/* Copies the first n_pages pages of one list into another's (host memcpy,
 * or the backend's copy on a device tenant); 0 or KVT_ESYS. */
static int copy_pages(struct tenant *t, const uint32_t *dst,
                      const uint32_t *src, uint32_t n_pages)
{
	for (uint32_t i = 0; i < n_pages; i++) {
		void *d = page_ptr(t, dst[i]);
		const void *s = page_ptr(t, src[i]);
		if (!t->dev)
			memcpy(d, s, t->g.page_bytes);
		else if (t->bops->copy(t->bctx, d, s, t->g.page_bytes,
		                       t->dsync.stream))
			return KVT_ESYS;
	}
	return 0;
}

int tenant_seq_fork(struct tenant *t, uint64_t from, uint64_t *seq,
                    char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	int64_t sl = tenant_seq_slot(t, from);
	if (sl < 0)
		return KVT_ENOSEQ;
	const uint32_t src = (uint32_t)sl;
	uint64_t need = 0;
	for (uint32_t layer = 0; layer < g->n_layers; layer++)
		for (uint32_t head = 0; head < g->n_kv_heads; head++)
			need += pages_for(g, tlist_at(t, src, layer, head)->len,
			                  g->headroom);
	uint32_t slot;
	int rc = seq_slot_take(t, need, &slot, err, errlen);
	if (rc)
		return rc;
	struct tseq *s = &t->seqs[slot];
	const struct tseq *f = &t->seqs[src];
	memcpy(s->n_seen, f->n_seen, g->n_layers * sizeof(uint32_t));
	if (t->sbytes)
		memcpy(s->state, f->state, g->n_layers * t->sbytes);
	for (uint32_t layer = 0; layer < g->n_layers; layer++)
		for (uint32_t head = 0; head < g->n_kv_heads; head++) {
			const size_t li = lidx(t, layer, head);
			const struct tlist *fl = tlist_at(t, src, layer, head);
			struct tlist *l = tlist_at(t, slot, layer, head);
			uint32_t *pg = seq_pages(t, s, li);
			const uint32_t np = pages_for(g, fl->len, g->headroom),
			               full = pages_for(g, fl->len, 0);
			for (uint32_t i = 0; i < np; i++)
				pg[i] = tenant_page_alloc(t);
			if (copy_pages(t, pg, seq_pages(t, f, li), full))
				t->dsync.failed = 1;
			if (!tenant_dpos(t)) /* else tenant_attn_fork's */
				memcpy(seq_pos(t, s, li), seq_pos(t, f, li),
				       (size_t)fl->len * sizeof(uint32_t));
			if (t->ef)
				memcpy(seq_ent(t, s, li), seq_ent(t, f, li),
				       (size_t)fl->len * t->ef * sizeof(float));
			l->len = fl->len;
			l->n_pages = np;
			l->epoch++;
			t->kept += l->len;
			tenant_mirror(t, slot, layer, head);
		}
	if (tenant_attn_fork(t, slot, src))
		t->dsync.failed = 1;
	for (uint32_t layer = 0; layer < g->n_layers; layer++)
		tenant_stage_poison(t, slot, layer, s->n_seen[layer], s->room);
	tenant_revoke_empty(t);
	*seq = seqid_make(t->id, s->gen, slot);
	if (t->dsync.failed)
		return KVT_ESYS;
	return tenant_table_flush(t) ? KVT_ESYS : 0;
}

int tenant_seq_reconcile(struct tenant *t, uint64_t no, uint64_t undo,
                         uint32_t *closed)
{
	*closed = 0;
	if (no < t->open_no || (t->sync_no && no <= t->sync_no))
		return KVT_ESTALE;
	for (uint32_t i = 0; undo && i < t->g.max_seqs; i++) {
		const struct tseq *s = &t->seqs[i];
		if (!s->open || s->open_no < undo || s->open_no >= no)
			continue;
		int rc = tenant_seq_close(t, seqid_make(t->id, s->gen, i));
		if (rc)
			return rc;
		(*closed)++;
	}
	if (no)
		t->open_no = no;
	return 0;
}

int tenant_seq_close(struct tenant *t, uint64_t seq)
{
	int64_t sl = tenant_seq_slot(t, seq);
	if (sl < 0)
		return KVT_ENOSEQ;
	uint32_t slot = (uint32_t)sl;
	struct tseq *s = &t->seqs[slot];
	for (uint32_t layer = 0; layer < t->g.n_layers; layer++)
		for (uint32_t head = 0; head < t->g.n_kv_heads; head++) {
			struct tlist *l = tlist_at(t, slot, layer, head);
			uint32_t *pg = seq_pages(t, s, lidx(t, layer, head));
			for (uint32_t i = 0; i < l->n_pages; i++)
				tenant_page_free(t, pg[i]);
			t->kept -= l->len;
			l->len = 0;
			l->n_pages = 0;
			l->epoch++;
		}
	s->open = 0;
	/* Generation 0 is never issued; the id holds SEQID_GEN_BITS of it. */
	s->gen = s->gen == SEQID_GEN_MAX ? 1 : s->gen + 1;
	s->counter = 0;
	t->n_open--;
	for (uint32_t layer = 0; layer < t->g.n_layers; layer++)
		for (uint32_t head = 0; head < t->g.n_kv_heads; head++)
			tenant_mirror(t, slot, layer, head);
	tenant_seq_release(s);
	tenant_revoke_empty(t);
	return tenant_table_flush(t) ? KVT_ESYS : 0;
}

int tenant_seq_query(struct tenant *t, uint64_t seq, uint64_t no,
                     uint64_t after, struct ipc_seq_state *out)
{
	int64_t sl = tenant_seq_slot(t, seq);
	if (sl < 0)
		return KVT_ENOSEQ;
	uint32_t slot = (uint32_t)sl;
	struct tseq *s = &t->seqs[slot];
	if (after && after >= no)
		return KVT_EINVAL;
	/* Not applied by now: never, so that the answer below stays true.  A
	 * sync that has not reached the tenant (after > sync_no) never will:
	 * it would have come before this query. */
	if (after && s->last_no != after && after > s->void_no &&
	    after <= t->sync_no)
		s->void_no = after;
	*out = (struct ipc_seq_state){
		.syncs = s->counter,
		.last = s->last_no,
		.seen_lo = UINT32_MAX,
		.len_lo = UINT32_MAX,
	};
	for (uint32_t layer = 0; layer < t->g.n_layers; layer++) {
		uint32_t n = s->n_seen[layer];
		out->seen_lo = n < out->seen_lo ? n : out->seen_lo;
		out->seen_hi = n > out->seen_hi ? n : out->seen_hi;
		for (uint32_t head = 0; head < t->g.n_kv_heads; head++) {
			uint32_t len = tlist_at(t, slot, layer, head)->len;
			out->len_lo = len < out->len_lo ? len : out->len_lo;
			out->len_hi = len > out->len_hi ? len : out->len_hi;
		}
	}
	return 0;
}
