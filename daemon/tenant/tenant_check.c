/*
 * tenant_check.c — the invariant checker (tenant_check, tenant.h): every
 * page free or in exactly one list, the running totals, the table records
 * against the private state, and on a device tenant both device copies of
 * the table (the daemon's own and the client's) against the host table.
 * It reads the state only; its cost follows the live state (slots never
 * opened are not read).  tenant_table_repair rewrites the client's copy
 * where it differs.
 */
#include "tenant_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct checker {
	int n;
	char *detail;
	size_t len;
};

static void violation(struct checker *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void violation(struct checker *c, const char *fmt, ...)
{
	if (!c->n++ && c->detail && c->len) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->detail, c->len, fmt, ap);
		va_end(ap);
	}
}

/* Sets bit i; returns whether it was already set. */
static int test_and_set(uint8_t *bits, uint64_t i)
{
	int was = bits[i / 8] >> (i % 8) & 1;
	bits[i / 8] |= (uint8_t)(1u << (i % 8));
	return was;
}

/*
 * Device tenants: each device copy of the table must equal the host table
 * in every header field and valid page id, once the queued work is done
 * (read_regions waits for the tenant's stream).  Only the records of slots
 * that were ever open are read (the others were uploaded zeroed and never
 * changed), in batches of BATCH records, so the host buffer stays small and
 * the cost follows the live state whatever the table's size.
 */
enum { BATCH = 256 };

/* Reads records first .. first + k - 1 (k <= BATCH) of the device table at
 * base into buf, list_stride bytes each; 0 or the backend's code. */
static int read_records(const struct tenant *t, const void *base, char *buf,
                        uint64_t first, uint32_t k)
{
	const struct shm_geom *g = &t->g;
	const void *src[BATCH];
	const char *rec0 = (const char *)shm_list_at(t->table, g, 0, 0, 0);
	uint64_t roff = (uint64_t)(rec0 - (const char *)t->table);
	for (uint32_t j = 0; j < k; j++)
		src[j] = (const char *)base + roff + (first + j) * g->list_stride;
	return t->bops->read_regions(t->bctx, buf, g->list_stride, src, k,
	                             g->list_stride, t->dsync.stream);
}

/* Record r of the host table. */
static const struct shm_list *host_record(const struct tenant *t, uint64_t r)
{
	const char *rec0 = (const char *)shm_list_at(t->table, &t->g, 0, 0, 0);
	return (const struct shm_list *)(rec0 + r * t->g.list_stride);
}

/* 1 when d, record r as read from a device copy, differs from the host's
 * in a header field or a valid page id (ids beyond n_pages are
 * unspecified on the device). */
static int record_differs(const struct tenant *t, const struct shm_list *d,
                          uint64_t r)
{
	const struct shm_list *h = host_record(t, r);
	uint32_t np = h->n_pages < t->g.max_pages ? h->n_pages : t->g.max_pages;
	return d->len != h->len || d->n_pages != h->n_pages ||
	       d->epoch != h->epoch ||
	       memcmp(d->pages, h->pages, np * sizeof(uint32_t));
}

/* Calls fn(t, arg, first, k, buf) for every batch of the records of the
 * slots that were ever open, buf holding them as read from base; stops at
 * a nonzero return, which it returns (a read's failure too, negative). */
typedef int (*batch_fn)(const struct tenant *t, void *arg, uint64_t first,
                        uint32_t k, const char *buf);

static int each_batch(const struct tenant *t, const void *base, char *buf,
                      batch_fn fn, void *arg)
{
	int rc = 0;
	for (uint32_t slot = 0; slot < t->g.max_seqs && !rc; slot++) {
		if (!t->seqs[slot].used)
			continue;
		uint64_t first = (uint64_t)slot * t->lists_per_seq;
		for (uint32_t i = 0; i < t->lists_per_seq && !rc; i += BATCH) {
			uint32_t k = t->lists_per_seq - i < BATCH
			                     ? t->lists_per_seq - i
			                     : BATCH;
			rc = read_records(t, base, buf, first + i, k);
			if (!rc)
				rc = fn(t, arg, first + i, k, buf);
		}
	}
	return rc;
}

struct first_diff {
	struct checker *c;
	const char *which, *why; /* the copy, what a difference means */
};

/* batch_fn of check_device_table: the first record that differs is a
 * violation. */
static int report_first(const struct tenant *t, void *arg, uint64_t first,
                        uint32_t k, const char *buf)
{
	const struct first_diff *f = arg;
	for (uint32_t j = 0; j < k; j++) {
		const struct shm_list *d = (const struct shm_list *)(
			buf + (size_t)j * t->g.list_stride);
		if (!record_differs(t, d, first + j))
			continue;
		const struct shm_list *h = host_record(t, first + j);
		violation(f->c, "%s: record %llu differs from the table (len "
		          "%u/%u pages %u/%u epoch %llu/%llu)%s", f->which,
		          (unsigned long long)(first + j), d->len, h->len,
		          d->n_pages, h->n_pages,
		          (unsigned long long)d->epoch,
		          (unsigned long long)h->epoch, f->why);
		return 1;
	}
	return 0;
}

/* One device copy at base against the host table; which names it, why
 * says what a difference means. */
static void check_copy(const struct tenant *t, const void *base,
                       const char *which, const char *why,
                       struct checker *c, char *buf)
{
	size_t hdr = sizeof(struct shm_table_hdr);
	const void *src[1] = {base};
	struct first_diff f = {c, which, why};
	int rc = t->bops->read_regions(t->bctx, buf, hdr, src, 1, hdr,
	                               t->dsync.stream);
	if (!rc && memcmp(buf, t->table, hdr)) {
		violation(c, "%s: header differs from the table%s", which, why);
		return;
	}
	if (!rc)
		rc = each_batch(t, base, buf, report_first, &f);
	if (rc < 0)
		violation(c, "%s: %s", which, t->bops->last_error());
}

static void check_device_table(const struct tenant *t, struct checker *c)
{
	char *buf = malloc(BATCH * t->g.list_stride);
	if (!buf) {
		violation(c, "out of memory reading the device table back");
		return;
	}
	/* The daemon's own copy first: a difference there is a daemon bug;
	 * in the client's an engine wrote what it should only read. */
	check_copy(t, t->dtable.own, "kvtrimd's device table", "", c, buf);
	if (c->n == 0)
		check_copy(t, t->dtable.shared.base, "the device table the engine reads",
		           "; the engine wrote it (kvtrimd follows its own copy "
		           "and rewrites this one)", c, buf);
	free(buf);
}

/* batch_fn of tenant_table_repair: queues the upload of every record that
 * differs, whole, into the shared copy. */
static int repair_batch(const struct tenant *t, void *arg, uint64_t first,
                        uint32_t k, const char *buf)
{
	uint32_t *fixed = arg;
	struct kvt_backend_region r[BATCH];
	uint32_t n = 0;
	uint64_t roff = (uint64_t)((const char *)host_record(t, 0) -
	                           (const char *)t->table);
	for (uint32_t j = 0; j < k; j++) {
		const struct shm_list *d = (const struct shm_list *)(
			buf + (size_t)j * t->g.list_stride);
		if (record_differs(t, d, first + j))
			r[n++] = (struct kvt_backend_region){
				roff + (first + j) * t->g.list_stride,
				t->g.list_stride};
	}
	*fixed += n;
	return n ? t->bops->upload_regions(t->bctx, t->dtable.shared.base, t->table, r,
	                                   n, t->dsync.stream)
	         : 0;
}

int tenant_table_repair(struct tenant *t, uint32_t *fixed)
{
	*fixed = 0;
	if (!t->dev || !t->dtable.shared.base)
		return 0;
	size_t hdr = sizeof(struct shm_table_hdr);
	char *buf = malloc(BATCH * t->g.list_stride);
	if (!buf)
		return KVT_ENOMEM;
	const void *src[1] = {t->dtable.shared.base};
	struct kvt_backend_region head = {0, hdr};
	int rc = t->bops->read_regions(t->bctx, buf, hdr, src, 1, hdr,
	                               t->dsync.stream);
	if (!rc && memcmp(buf, t->table, hdr)) {
		rc = t->bops->upload_regions(t->bctx, t->dtable.shared.base, t->table,
		                             &head, 1, t->dsync.stream);
		++*fixed;
	}
	if (!rc)
		rc = each_batch(t, t->dtable.shared.base, buf, repair_batch, fixed);
	free(buf);
	/* The client's stream waits on COMPACT before its next reads. */
	if (!rc && *fixed)
		rc = t->bops->event_record(t->bctx, &t->dsync.ev_compact, t->dsync.stream);
	return rc;
}

/* What tenant_check counts while it walks: one bit per page of the live
 * chunks (base[slot] the first bit of a live slot's pages, UINT64_MAX for a
 * slot without a chunk), and the totals it compares with the tenant's. */
struct walk {
	struct checker *c;
	uint32_t ppc;    /* pages per chunk */
	uint64_t *base;  /* [max_chunks] */
	uint8_t *seen;   /* [bits] */
	uint32_t live;   /* chunks */
	uint64_t free_pages, used, kept;
	uint32_t *pos;   /* [pos_cap] a list's positions read back from the
	                    device (tenant_dpos); NULL otherwise */
};

/* The free page stacks of the live chunks: in range, each page free once. */
static void check_chunks(const struct tenant *t, struct walk *w)
{
	struct checker *c = w->c;
	for (uint32_t i = 0; i < t->max_chunks; i++) {
		const struct tchunk *ch = &t->chunks[i];
		if (!ch->pc.base)
			continue;
		w->live++;
		if (ch->n_free > w->ppc) {
			violation(c, "chunk %u: %u free pages of %u", i,
			          ch->n_free, w->ppc);
			continue;
		}
		w->free_pages += ch->n_free;
		for (uint32_t k = 0; k < ch->n_free; k++) {
			uint32_t idx = ch->free[k];
			if (idx >= w->ppc)
				violation(c, "chunk %u: free index %u out of "
				          "range", i, idx);
			else if (test_and_set(w->seen, w->base[i] + idx))
				violation(c, "page %llu free twice",
				          (unsigned long long)i * w->ppc + idx);
		}
	}
	if (w->live != t->n_chunks)
		violation(c, "%u live chunks, counted %u", w->live, t->n_chunks);
	if ((uint64_t)w->live * KVT_CHUNK_BYTES > t->quota)
		violation(c, "%u chunks exceed the quota of %llu bytes", w->live,
		          (unsigned long long)t->quota);
}

/* The pages of an open list: the table says the same, each id in a live
 * chunk and held once. */
static void check_list_pages(const struct tenant *t, struct walk *w,
                             const struct shm_list *r, const struct tlist *l,
                             const uint32_t *pg, /* [l->n_pages] */
                             uint32_t slot, uint32_t layer, uint32_t head)
{
	for (uint32_t p = 0; p < l->n_pages; p++) {
		uint32_t id = pg[p];
		if (r->n_pages == l->n_pages && r->pages[p] != id)
			violation(w->c, "slot %u layer %u head %u: table page "
			          "%u is %u, daemon %u", slot, layer, head, p,
			          r->pages[p], id);
		if (id / w->ppc >= t->max_chunks ||
		    w->base[id / w->ppc] == UINT64_MAX)
			violation(w->c, "page id %u not in a live chunk", id);
		else if (test_and_set(w->seen, w->base[id / w->ppc] +
		                      id % w->ppc))
			violation(w->c, "page %u used twice or also free", id);
	}
}

/* One list of a used slot: its table record matches, a closed slot's list
 * is empty, an open one's length, pages and positions are in bounds. */
static void check_list(const struct tenant *t, struct walk *w,
                       const struct tseq *s, uint32_t slot, uint32_t layer,
                       uint32_t head)
{
	const struct shm_geom *g = &t->g;
	struct checker *c = w->c;
	const struct tlist *l = tlist_at(t, slot, layer, head);
	const struct shm_list *r = shm_list_at(t->table, g, slot, layer, head);
	if (r->len != l->len || r->n_pages != l->n_pages ||
	    r->epoch != l->epoch)
		violation(c, "seq slot %u layer %u head %u: table says len %u "
		          "pages %u epoch %llu, daemon %u %u %llu", slot, layer,
		          head, r->len, r->n_pages,
		          (unsigned long long)r->epoch, l->len, l->n_pages,
		          (unsigned long long)l->epoch);
	if (!s->open) {
		if (l->len || l->n_pages)
			violation(c, "closed slot %u holds entries", slot);
		return;
	}
	size_t li = lidx(t, layer, head);
	const uint32_t *pos = seq_pos(t, s, li);
	if (w->pos && l->len <= t->pos_cap) {
		pos = w->pos;
		if (tenant_attn_read_pos(t, slot, layer, head, l->len, w->pos)) {
			violation(c, "slot %u layer %u head %u: its positions "
			          "could not be read back from the device: %s",
			          slot, layer, head, t->bops->last_error());
			return;
		}
	}
	if (l->len > g->max_tokens)
		violation(c, "slot %u layer %u head %u: len %u > max_tokens",
		          slot, layer, head, l->len);
	if (l->n_pages != pages_for(g, l->len, s->room) ||
	    s->room > g->headroom)
		violation(c, "slot %u layer %u head %u: %u pages for len %u and "
		          "room %u, want %u", slot, layer, head, l->n_pages,
		          l->len, s->room, pages_for(g, l->len, s->room));
	w->kept += l->len;
	if (l->n_pages > g->max_pages)
		return;
	w->used += l->n_pages;
	check_list_pages(t, w, r, l, seq_pages(t, s, li), slot, layer, head);
	for (uint32_t e = 0; e < l->len && e < t->pos_cap; e++)
		if (pos[e] >= s->n_seen[layer]) {
			violation(c, "slot %u layer %u head %u: position %u not "
			          "below n_seen %u", slot, layer, head, pos[e],
			          s->n_seen[layer]);
			break;
		}
}

/* After the walk: every page of a live chunk was seen, and the counts
 * agree with the tenant's running totals. */
static void check_totals(const struct tenant *t, struct walk *w)
{
	struct checker *c = w->c;
	for (uint32_t i = 0; i < t->max_chunks; i++) {
		if (!t->chunks[i].pc.base)
			continue;
		for (uint32_t k = 0; k < w->ppc; k++) {
			uint64_t bit = w->base[i] + k;
			if (!(w->seen[bit / 8] >> (bit % 8) & 1)) {
				violation(c, "page %llu neither free nor in "
				          "a list",
				          (unsigned long long)i * w->ppc + k);
				break;
			}
		}
	}
	if (w->free_pages != t->free_pages || w->kept != t->kept)
		violation(c, "running totals: free %llu (counted %llu), kept "
		          "%llu (counted %llu)",
		          (unsigned long long)w->free_pages,
		          (unsigned long long)t->free_pages,
		          (unsigned long long)w->kept,
		          (unsigned long long)t->kept);
	if (w->free_pages + w->used != (uint64_t)w->live * w->ppc)
		violation(c, "free %llu + used %llu != %llu pages",
		          (unsigned long long)w->free_pages,
		          (unsigned long long)w->used,
		          (unsigned long long)w->live * w->ppc);
}

int tenant_check(const struct tenant *t, char *detail, size_t len)
{
	const struct shm_geom *g = &t->g;
	struct checker c = {0, detail, len};
	if (detail && len)
		detail[0] = '\0';
	struct walk w = {.c = &c, .ppc = g->pages_per_chunk};
	w.base = malloc((size_t)t->max_chunks * sizeof(*w.base));
	uint64_t nbits = 0;
	for (uint32_t i = 0; w.base && i < t->max_chunks; i++) {
		w.base[i] = t->chunks[i].pc.base ? nbits : UINT64_MAX;
		nbits += t->chunks[i].pc.base ? w.ppc : 0;
	}
	w.seen = calloc(nbits / 8 + 1, 1);
	const int dpos = tenant_dpos(t);
	if (dpos)
		w.pos = malloc((size_t)t->pos_cap * sizeof(*w.pos));
	if (!w.base || !w.seen || (dpos && !w.pos)) {
		free(w.base);
		free(w.seen);
		free(w.pos);
		return KVT_ENOMEM;
	}

	if (shm_table_check(t->table, g))
		violation(&c, "table header does not match the geometry");
	check_chunks(t, &w);
	uint32_t n_open = 0;
	for (uint32_t slot = 0; slot < g->max_seqs; slot++) {
		const struct tseq *s = &t->seqs[slot];
		n_open += !!s->open;
		/* Never opened: its records and lists are the zeroes they were
		 * created with (nobody but the daemon writes the table), and
		 * reading them would fault in table pages nothing touched. */
		if (!s->used)
			continue;
		for (uint32_t layer = 0; layer < g->n_layers; layer++)
			for (uint32_t head = 0; head < g->n_kv_heads; head++)
				check_list(t, &w, s, slot, layer, head);
	}
	if (n_open != t->n_open)
		violation(&c, "%u open sequences, counted %u", n_open,
		          t->n_open);
	check_totals(t, &w);
	if (t->dev && t->dtable.shared.base)
		check_device_table(t, &c);
	free(w.pos);
	free(w.seen);
	free(w.base);
	return c.n;
}
