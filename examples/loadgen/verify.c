/*
 * verify.c — --verify of one list: every entry the daemon holds is checked
 * against the pattern (tag, position, every byte) and the set of positions
 * against what the model or the replay expects.  Mismatches are counted in
 * the engine's report; the first MAX_REPORTED_MISMATCHES are said.
 */
#include "loadgen.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_REPORTED_MISMATCHES 10 /* per child, on stderr */

void verify_mismatch(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                     const char *fmt, ...)
{
	if (e->r.mismatches++ < MAX_REPORTED_MISMATCHES) {
		char buf[256];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(buf, sizeof(buf), fmt, ap);
		va_end(ap);
		engine_say(e, "mismatch seq=%u layer=%u head=%u: %s", j, l, h,
		           buf);
	}
}

/*
 * Checks one list against the pattern and want[p] (1 = position p must be
 * present) after n_seen tokens.  With --tolerate-pressure a wanted position
 * the daemon evicted is not a mismatch: it is counted and cleared in
 * want_alive, so the caller's expectation follows the daemon from here on
 * (eviction is final) and every later list and sync is checked against it.
 */
int verify_list(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                uint32_t n_seen, uint8_t *want_alive)
{
	struct kvt_list list;
	int rc = kvt_list_get(e->c, e->seqs[j], l, h, &list);
	if (rc < 0) {
		engine_say(e, "kvt_list_get: %s", kvt_strerror(rc));
		return rc;
	}
	/* the pages that hold entries [0, len) */
	uint32_t np = (uint32_t)(((uint64_t)list.len + e->page_tokens - 1) /
	                         e->page_tokens);
	void **pv;
	if (np > list.n_pages)
		np = list.n_pages;
	if ((rc = engine_pages_view(e, 0, list.pages, np, &pv)) < 0)
		return rc;
	uint32_t tag = pattern_tag(e->o->seed, e->client, j, l, h);
	memset(e->seen, 0, n_seen);
	for (uint32_t i = 0; i < list.len; i++) {
		uint32_t pi = i / e->page_tokens, row = i % e->page_tokens;
		if (pi >= list.n_pages) {
			verify_mismatch(e, j, l, h, "entry %u beyond the %u "
			                "pages", i, list.n_pages);
			continue;
		}
		const uint8_t *page = pv[pi];
		if (!page) {
			verify_mismatch(e, j, l, h, "page %u of entry %u "
			                "unmapped", list.pages[pi], i);
			continue;
		}
		const uint8_t *k = page + row * e->row_bytes;
		const uint8_t *v = page + (e->page_tokens + row) * e->row_bytes;
		uint32_t pos = pattern_get_u32(v);
		uint32_t got_tag = pattern_get_u32(v + 4);
		int is_v;
		long bad;
		if (got_tag != tag)
			verify_mismatch(e, j, l, h, "entry %u: tag %08x, "
			                "expected %08x", i, got_tag, tag);
		else if (pos >= n_seen)
			verify_mismatch(e, j, l, h, "entry %u: position %u of "
			                "%u seen", i, pos, n_seen);
		else if (e->seen[pos]++)
			verify_mismatch(e, j, l, h, "entry %u: position %u "
			                "twice", i, pos);
		else if ((bad = pattern_check_entry(e->bmix, k, v, e->row_bytes,
		                                    tag, pos, e->o->head_dim,
		                                    e->o->dtype, e->kf, e->kb,
		                                    &is_v)) >= 0)
			verify_mismatch(e, j, l, h, "entry %u (position %u): "
			                "%c byte %ld differs", i, pos,
			                is_v ? 'V' : 'K', bad);
	}
	for (uint32_t p = 0; p < n_seen; p++) {
		int want = want_alive[p];
		if (want && !e->seen[p] && e->o->tolerate_pressure) {
			want_alive[p] = 0;
			e->r.pressure_evicted++;
		} else if (want && !e->seen[p])
			verify_mismatch(e, j, l, h, "position %u missing (len "
			                "%u, seen %u)", p, list.len, n_seen);
		else if (!want && e->seen[p])
			verify_mismatch(e, j, l, h, "position %u kept, policy "
			                "evicts it (len %u, seen %u)", p,
			                list.len, n_seen);
	}
	return 0;
}
