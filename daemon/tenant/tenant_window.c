/*
 * tenant_window.c — the end-of-prefill selections run on the device
 * (SnapKV's for snapkv and pyramidkv: window_select; Expected Attention's:
 * expected_select), so the sync where such a policy decides moves drop
 * indices to the host, not the prompt's keys and the window's rows.  A
 * (sequence, layer) goes to the device when the policy decides at this
 * sync, each of its lists holds the prompt with every position at its
 * index (tenant_window_plan checks the host's positions) and the ring
 * still holds the window; anything else, or a layer whose rows the device
 * found not finite, stays on the host path, which refuses the sync with
 * the reason as the cpu backend does.  The drops are the cpu policy's
 * (the same float operations; kvtrim-loadgen --verify checks it).
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

/* Drops of one list, from the rule's counts with position = index:
 * SnapKV's (snapkv.c: candidates [0, from), the window and the new
 * entries protected, sinks too) or Expected Attention's
 * (expected_attention.c: candidates [sinks, P), the sinks counting
 * against the budget, everything else protected; from >= sinks and
 * from < P when it compresses).  *keep: the candidates kept. */
static uint32_t rule_drops(const struct policy_window *w, uint32_t P,
                           uint32_t *keep)
{
	if (w->rule == POLICY_WINDOW_EXPECTED) {
		uint32_t nc = P - w->sinks;
		*keep = w->budget > w->sinks ? w->budget - w->sinks : 0;
		return nc > *keep ? nc - *keep : 0;
	}
	uint32_t from = P - w->w, ms = w->sinks < from ? w->sinks : from;
	uint32_t np = w->w + ms;
	*keep = w->budget > np ? w->budget - np : 0;
	uint32_t unprot = from - ms;
	return unprot > *keep ? unprot - *keep : 0;
}

/* The first list and the number of lists of window wi. */
static void win_lists(const struct tenant *t, uint32_t wi, uint32_t *first,
                      uint32_t *n)
{
	if (t->win.rule == POLICY_WINDOW_EXPECTED) {
		*first = t->win.ewins[wi].first_list;
		*n = t->win.ewins[wi].n_lists;
	} else {
		*first = t->win.wins[wi].first_list;
		*n = t->win.wins[wi].n_lists;
	}
}

/* Adds the window of (slot, layer) and, with lists, one list per KV head
 * from rule w over a prompt of P entries and n_new new ones; returns the
 * window's index.  The arrays have room (tenant_window_plan). */
static uint32_t add_window(struct tenant *t, uint32_t slot, uint32_t layer,
                           uint32_t P, uint32_t n_new,
                           const struct policy_window *w, int lists,
                           uint32_t *drops)
{
	const struct shm_geom *g = &t->g;
	uint32_t wi = t->win.n_wins++;
	const float *ring = shm_stage_at(t->dstage.chunk.base, g, slot, layer, 0);
	const uint32_t nl = lists ? g->n_kv_heads : 0;
	if (w->rule == POLICY_WINDOW_EXPECTED)
		t->win.ewins[wi] = (struct kvt_backend_expected){
			.ring = ring, .rows = tenant_rows(t),
			.P = P, .from = lists ? P - w->w : P, .n_new = n_new,
			.sinks = w->sinks, .future = w->future,
			.theta = (float)w->theta, .cov = w->cov,
			.vnorm = w->vnorm, .eps = w->eps,
			.first_list = t->win.n_lists, .n_lists = nl,
		};
	else
		t->win.wins[wi] = (struct kvt_backend_window){
			.ring = ring, .rows = tenant_rows(t),
			.P = P, .w = lists ? w->w : 0, .n_new = n_new,
			.kernel = w->kernel, .sinks = w->sinks,
			.first_list = t->win.n_lists, .n_lists = nl,
		};
	if (!lists)
		return wi;
	uint32_t keep, nd = rule_drops(w, P, &keep);
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		t->win.lists[t->win.n_lists++] = (struct kvt_backend_window_list){
			.record = (uint32_t)(slot * t->lists_per_seq +
			                     lidx(t, layer, h)),
			.len = P + n_new, .keep = keep, .n_drop = nd,
			.drop_off = *drops,
		};
		*drops += nd;
	}
	return wi;
}

/* Room for nly layers' ways, as many windows, nly * n_kv_heads lists and
 * the output words (entries: the sync's entries, a bound on the drops). */
static int make_room(struct tenant *t, size_t nly, size_t entries)
{
	if (tenant_grow((void **)&t->win.mode, &t->win.mode_cap, nly + 1, 1) ||
	    tenant_grow((void **)&t->win.widx, &t->win.widx_cap, nly + 1,
	                sizeof(*t->win.widx)))
		return KVT_ENOMEM;
	size_t nl = nly * t->g.n_kv_heads + 1;
	if (tenant_grow((void **)&t->win.wins, &t->win.wins_cap, nly + 1,
	            sizeof(*t->win.wins)) ||
	    tenant_grow((void **)&t->win.ewins, &t->win.ewins_cap, nly + 1,
	            sizeof(*t->win.ewins)) ||
	    tenant_grow((void **)&t->win.lists, &t->win.lists_cap, nl,
	            sizeof(*t->win.lists)) ||
	    tenant_grow((void **)&t->win.out, &t->win.out_cap, nly + nl + entries + 1,
	            sizeof(*t->win.out)))
		return KVT_ENOMEM;
	return 0;
}

int tenant_window_plan(struct tenant *t, const struct ipc_sync_item *items,
                       uint32_t n, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	struct policy *pol = t->pol;
	t->win.active = 0;
	t->win.n_wins = t->win.n_lists = 0;
	if (!t->dev || !t->dsync.dbases || !t->dstage.chunk.base || !pol->ops->window ||
	    (!t->bops->window_select && !t->bops->expected_select))
		return 0;
	size_t nly, entries;
	tenant_sync_extent(t, items, n, &nly, &entries);
	if (make_room(t, nly, entries))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	uint32_t drops = 0;
	size_t ly = 0;
	t->win.rule = -1; /* the rule of the first window (one policy: one rule) */
	for (uint32_t i = 0; i < n; i++) {
		const struct ipc_sync_item *it = &items[i];
		uint32_t slot, lo, hi;
		struct tseq *s = item_seq(t, it, &slot, &lo, &hi);
		for (uint32_t layer = lo; layer < hi; layer++, ly++) {
			uint32_t prev = s->n_seen[layer];
			struct policy_layer pl = {
				.layer = layer,
				.phase = (enum kvt_phase)it->phase,
				.n_new = it->n_new, .n_seen = prev + it->n_new,
				.state = t->scr.state,
			};
			t->win.mode[ly] = TENANT_WIN_HOST;
			if (t->sbytes)
				memcpy(pl.state, seq_state(t, s, layer),
				       t->sbytes);
			if (!policy_decides(pol, &pl) ||
			    !identity(t, s, slot, layer, prev))
				continue;
			struct policy_window w;
			int lists = pol->ops->window(pol, &pl, &w);
			/* the host reads the window through the ring; one
			 * it no longer holds keeps all there */
			if (lists && (uint64_t)prev - w.w + g->stage_tokens <
			                     (uint64_t)prev + it->n_new)
				continue;
			const int has = w.rule == POLICY_WINDOW_EXPECTED
			                ? t->bops->expected_select != NULL
			                : t->bops->window_select != NULL;
			if (!has || (t->win.rule >= 0 && t->win.rule != (int)w.rule))
				continue; /* no such op: the host decides */
			t->win.rule = (int)w.rule;
			t->win.widx[ly] = add_window(t, slot, layer, prev,
			                         it->n_new, &w, lists, &drops);
			t->win.mode[ly] = lists ? TENANT_WIN_DEVICE
			                     : TENANT_WIN_KEEP;
		}
	}
	t->win.active = 1;
	if (!t->win.n_wins)
		return 0;
	uint32_t words = t->win.n_wins + t->win.n_lists + drops;
	int rc = tenant_bases_sync(t);
	const struct kvt_backend_paged pg = tenant_paged(t);
	const uint32_t nrec = g->max_seqs * t->lists_per_seq;
	if (!rc && t->win.rule == POLICY_WINDOW_EXPECTED)
		rc = t->bops->expected_select(
			t->bctx, &pg, nrec, pol->geom.dtype, g->n_heads,
			g->n_kv_heads, g->head_dim, t->win.ewins, t->win.n_wins,
			t->win.lists, t->win.n_lists, t->win.out, words, t->dsync.stream);
	else if (!rc)
		rc = t->bops->window_select(
			t->bctx, &pg, nrec, pol->geom.dtype, g->n_heads,
			g->n_kv_heads, g->head_dim, t->win.wins, t->win.n_wins,
			t->win.lists, t->win.n_lists, t->win.out, words, t->dsync.stream);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: window "
		                  "selection: %s", t->bops->name,
		                  t->bops->last_error());
	/* the device's counts against the rule's: an invariant */
	for (uint32_t w = 0; w < t->win.n_wins; w++) {
		uint32_t first, nl;
		win_lists(t, w, &first, &nl);
		for (uint32_t k = 0; !t->win.out[w] && k < nl; k++) {
			const uint32_t l = first + k;
			const struct kvt_backend_window_list *L = &t->win.lists[l];
			const uint32_t *idx = t->win.out + t->win.n_wins + t->win.n_lists +
			                      L->drop_off;
			int ok = t->win.out[t->win.n_wins + l] == L->n_drop;
			for (uint32_t d = 0; ok && d < L->n_drop; d++)
				ok = idx[d] < L->len && (!d || idx[d] > idx[d - 1]);
			if (!ok)
				return errors_fmt(err, errlen, KVT_ESYS, "%s "
				                  "backend: window selection: list "
				                  "%u dropped %u entries (the rule: "
				                  "%u), or not in order",
				                  t->bops->name, l,
				                  t->win.out[t->win.n_wins + l], L->n_drop);
		}
	}
	return 0;
}

int tenant_window_take(struct tenant *t, size_t ly, struct policy_layer *pl)
{
	if (tenant_window_host(t, ly))
		return 0;
	struct policy_window w;
	(void)t->pol->ops->window(t->pol, pl, &w); /* marks it decided */
	uint32_t first, nl;
	win_lists(t, t->win.widx[ly], &first, &nl);
	const uint32_t *idx = t->win.out + t->win.n_wins + t->win.n_lists;
	for (uint32_t k = 0; k < nl; k++) {
		const struct kvt_backend_window_list *l = &t->win.lists[first + k];
		for (uint32_t d = 0; d < l->n_drop; d++)
			pl->heads[k].drop[idx[l->drop_off + d]] = 1;
	}
	return 1;
}
