/*
 * tenant_stage.c — a tenant's staging rows (the x, q and lse an engine
 * stages for its policy): the marks that say a position is not staged
 * yet, and the reads of the rows a sync's decisions take, from the host
 * segment or, on device staging, copied to the host ring first.  See
 * tenant_int.h.
 */
#include "tenant_int.h"

#include <string.h>

#include "policy.h"

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
	if (t->dstage.n_prun && t->dstage.pslot == slot && t->dstage.pfrom == from && t->dstage.pn == n &&
	    layer == t->dstage.player + 1) {
		for (uint32_t k = 0; k < t->dstage.pruns; k++)
			t->dstage.prun[t->dstage.n_prun - 1 - k].blocks++;
		t->dstage.player = layer;
		return;
	}
	if (t->dstage.n_prun + 2 > TENANT_POISON_RUNS && tenant_stage_poison_flush(t))
		t->dsync.failed = 1;
	const char *base = t->dstage.chunk.base;
	uint64_t eb = g->stage_entry_floats * sizeof(float);
	uint64_t ls = layer + 1 < g->n_layers
	              ? (uint64_t)((const char *)shm_stage_at(t->dstage.chunk.base, g,
	                                                      slot, layer + 1, 0) -
	                           (const char *)shm_stage_at(t->dstage.chunk.base, g,
	                                                      slot, layer, 0))
	              : 0;
	uint32_t r0 = from % g->stage_tokens;
	uint32_t n1 = g->stage_tokens - r0 < n ? g->stage_tokens - r0 : n;
	t->dstage.pruns = 0;
	for (uint32_t part = 0; part < 2; part++) {
		uint32_t k = part ? n - n1 : n1;
		if (!k)
			continue;
		const char *row = (const char *)shm_stage_at(
			t->dstage.chunk.base, g, slot, layer, from + (part ? n1 : 0));
		t->dstage.prun[t->dstage.n_prun++] = (struct kvt_backend_fill_run){
			.first = (uint64_t)(row - base), .block_stride = ls,
			.rows = k, .row_stride = (uint32_t)eb, .blocks = 1,
		};
		t->dstage.pruns++;
	}
	t->dstage.pslot = slot;
	t->dstage.player = layer;
	t->dstage.pfrom = from;
	t->dstage.pn = n;
}

void tenant_stage_poison(struct tenant *t, uint32_t slot, uint32_t layer,
                         uint32_t from, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	unsigned need = t->pol->ops->needs;
	if (!(need & POLICY_NEED_STAGED) || !g->stage_tokens)
		return;
	if (t->dstage.chunk.base) {
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
	if (!t->dstage.n_prun)
		return 0;
	int rc = t->bops->fill_words(t->bctx, t->dstage.chunk.base,
	                             POLICY_UNSTAGED_BITS, t->dstage.ppat, t->dstage.n_ppat,
	                             t->dstage.prun, t->dstage.n_prun, t->dsync.stream);
	t->dstage.n_prun = 0;
	return rc;
}

/*
 * Device staging: reads the n rows of (slot, layer) from position pos into
 * t->dstage.ring at row pos - ring_first, in one read_regions after the engine's
 * writes (the stream waited on them).
 */
static int ring_read(struct tenant *t, uint32_t slot, uint32_t layer,
                     uint32_t pos, uint32_t n)
{
	const struct shm_geom *g = &t->g;
	for (uint32_t k = 0; k < n; k++)
		t->dstage.rsrc[k] = shm_stage_at(t->dstage.chunk.base, g, slot, layer, pos + k);
	size_t rb = g->stage_entry_floats * sizeof(float);
	return t->bops->read_regions(t->bctx, t->dstage.ring + (size_t)(pos -
	                                                          t->dstage.ring_first) *
	                                                 g->stage_entry_floats,
	                             rb, t->dstage.rsrc, n, rb, t->dsync.stream);
}

/*
 * Staged row of an earlier position, for policies with lookback: from the
 * ring of the host segment, or on device staging from the host copy of
 * the rows this sync may read (tenant_fetch_rows), the lookback rows read
 * on the first call that wants one (most syncs of a policy that decides
 * at the end of prefill decide nothing and read none).  A failed read gives
 * NULL and leaves its code in t->dstage.ring_err, which fails the sync.
 */
const float *tenant_stage_row(void *ctx, uint32_t pos)
{
	const struct tenant_stage_ctx *c = ctx;
	struct tenant *t = c->t;
	if (pos >= c->n_seen || (uint64_t)pos + t->g.stage_tokens < c->n_seen)
		return NULL;
	if (!t->dstage.chunk.base)
		return shm_stage_at(t->stage, &t->g, c->slot, c->layer, pos);
	if (pos < t->dstage.ring_first || pos - t->dstage.ring_first >= t->dstage.ring_n)
		return NULL;
	if (pos - t->dstage.ring_first < t->dstage.ring_lb && !t->dstage.ring_lb_ok) {
		int rc = ring_read(t, c->slot, c->layer, t->dstage.ring_first,
		                   t->dstage.ring_lb);
		if (rc) {
			t->dstage.ring_err = rc;
			return NULL;
		}
		t->dstage.ring_lb_ok = 1;
	}
	return t->dstage.ring + (size_t)(pos - t->dstage.ring_first) * t->g.stage_entry_floats;
}

/*
 * Device staging: copies the rows of the new positions [first, first + n)
 * of (slot, layer) into t->dstage.ring, after the lookback rows [first -
 * lookback, first) (from 0) that tenant_stage_row reads if the policy
 * asks: all a decision may read of the staged inputs (policy.h: the tenant
 * guarantees those).
 */
int tenant_fetch_rows(struct tenant *t, uint32_t slot, uint32_t layer,
                      uint32_t first, uint32_t n)
{
	uint32_t lb = t->pol->lookback;
	t->dstage.ring_lb = first > lb ? lb : first;
	t->dstage.ring_first = first - t->dstage.ring_lb;
	t->dstage.ring_n = t->dstage.ring_lb + n;
	t->dstage.ring_lb_ok = t->dstage.ring_lb == 0;
	t->dstage.ring_err = 0;
	return ring_read(t, slot, layer, first, n);
}

/*
 * Copies the staged inputs the policy reads of positions [first, first + n)
 * out of the ring (which the client may keep writing) into t->scr.in,
 * contiguous ([headroom] rows of each part, stage_all_floats), and points
 * pl at them.  n <= headroom (validated).
 */
void tenant_gather_inputs(struct tenant *t, uint32_t slot, uint32_t layer,
                          uint32_t first, uint32_t n,
                          struct policy_layer *pl)
{
	const struct shm_geom *g = &t->g;
	size_t nq = (size_t)g->n_heads * g->head_dim;
	float *x = t->scr.in;
	float *q = x + (size_t)g->headroom * g->d_model;
	float *lse = q + (size_t)g->headroom * nq;
	unsigned need = t->pol->ops->needs;
	for (uint32_t k = 0; k < n; k++) {
		const float *row =
			t->dstage.chunk.base
			? t->dstage.ring + (size_t)(first + k - t->dstage.ring_first) *
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
