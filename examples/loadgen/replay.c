/*
 * replay.c — --verify of policies loadgen has no model for: the same
 * policy code runs in process on a shadow copy of each list (positions,
 * per-entry state, layer state, in the daemon's order), fed the same
 * inputs (the daemon's pages before the sync and the staged rows), and
 * its decisions are what verify_list expects after the sync.
 */
#include "loadgen.h"

#include <string.h>

#include "compact.h"
#include "policy.h"

/* Index of the (sequence j, layer l, head h) shadow. */
static size_t sh_idx(const struct engine *e, uint32_t j, uint32_t l,
                     uint32_t h)
{
	return ((size_t)j * e->o->layers + l) * e->o->kv_heads + h;
}

/* Staged row of an earlier position for the replay's lookback. */
struct replay_ctx {
	struct engine *e;
	uint32_t j, l, n_seen;
};

static const float *replay_row(void *ctx, uint32_t pos)
{
	const struct replay_ctx *c = ctx;
	if (pos >= c->n_seen ||
	    (uint64_t)pos + c->e->stage_tokens < c->n_seen)
		return NULL;
	/* The shadow entry is laid out as the staging one (x, else q,
	 * else lse first), which policy_row_q / _lse count from. */
	return engine_shadow(c->e, c->j, c->l, pos);
}

/*
 * Before a sync of n new tokens (positions [n_seen - n, n_seen)): runs the
 * policy on each shadow with the daemon's current pages and the staged
 * rows, leaving the decisions in sh_drop.  Also checks that the daemon's
 * entries are in the shadow's order, which makes the inputs identical.
 */
int replay_decide(struct engine *e, uint32_t n, uint32_t n_seen,
                  enum kvt_phase phase)
{
	const struct opts *o = e->o;
	struct policy *p = o->pol;
	uint32_t ef = p->entry_floats, nkv = o->kv_heads;
	size_t sb = p->layer_state_bytes;
	uint32_t d = o->heads * o->head_dim, nq = o->heads * o->head_dim;
	struct policy_head heads[64];
	for (uint32_t j = 0; j < o->seqs; j++)
		for (uint32_t l = 0; l < o->layers; l++) {
			float *x = e->in, *q = x + (size_t)n * d,
			      *lse = q + (size_t)n * nq;
			for (uint32_t k = 0; k < n && e->stage; k++) {
				uint32_t pos = n_seen - n + k;
				/* The parts the policy reads, from what loadgen
				 * staged (the others are not there and it never
				 * looks). */
				uint32_t in = policy_inputs_of(p->ops->needs);
				const float *sx = engine_shadow(e, j, l, pos);
				const float *sq = sx + (in & KVT_INPUT_X ? d : 0);
				const float *sl = sq + (in & KVT_INPUT_Q ? nq : 0);
				if (!(in & KVT_INPUT_X))
					sx = NULL;
				if (!(in & KVT_INPUT_Q))
					sq = NULL;
				if (!(in & KVT_INPUT_LSE))
					sl = NULL;
				if (sx)
					memcpy(x + (size_t)k * d, sx,
					       d * sizeof(float));
				if (sq)
					memcpy(q + (size_t)k * nq, sq,
					       nq * sizeof(float));
				if (sl)
					memcpy(lse + (size_t)k * o->heads, sl,
					       o->heads * sizeof(float));
			}
			for (uint32_t h = 0; h < nkv; h++) {
				size_t si = sh_idx(e, j, l, h);
				struct kvt_list list;
				int rc = kvt_list_get(e->c, e->seqs[j], l, h,
				                      &list);
				if (rc < 0)
					return rc;
				uint32_t len = e->sh_len[si];
				uint32_t *pos = e->sh_pos + si * e->cap;
				float *ent = ef ? e->sh_ent + si * e->cap * ef
				                : NULL;
				if (list.len != len || len + n > e->cap) {
					verify_mismatch(e, j, l, h,
					                "daemon holds %u "
					                "entries, replay %u",
					                list.len, len);
					return KVT_EINVAL;
				}
				/* row h: the policy reads every head's */
				void **pv;
				if ((rc = engine_pages_view(e, h, list.pages,
				                            list.n_pages,
				                            &pv)) < 0)
					return rc;
				for (uint32_t pg = 0; pg < list.n_pages; pg++)
					if (!pv[pg]) {
						verify_mismatch(e, j, l, h,
						                "page %u "
						                "unmapped",
						                list.pages[pg]);
						return KVT_EINVAL;
					}
				/* same order as the daemon's list */
				for (uint32_t i = 0; i < len; i++) {
					const uint8_t *v =
						(uint8_t *)pv[i / e->page_tokens] +
						(e->page_tokens +
						 i % e->page_tokens) * e->row_bytes;
					uint32_t got = pattern_get_u32(v);
					if (got != pos[i]) {
						verify_mismatch(e, j, l, h,
						                "entry %u is "
						                "position %u, "
						                "replay has %u",
						                i, got, pos[i]);
						return KVT_EINVAL;
					}
				}
				for (uint32_t k = 0; k < n; k++)
					pos[len + k] = n_seen - n + k;
				if (ent)
					memset(ent + (size_t)len * ef, 0,
					       (size_t)n * ef * sizeof(float));
				uint8_t *drop = e->sh_drop + si * e->cap;
				memset(drop, 0, len + n);
				heads[h] = (struct policy_head){
					.pos = pos, .ent = ent, .pages = pv,
					.len = len + n, .drop = drop};
			}
			struct replay_ctx rc_ = {e, j, l, n_seen};
			struct policy_layer pl = {
				.layer = l, .phase = phase, .n_new = n,
				.n_seen = n_seen,
				.x = e->stage ? x : NULL,
				.q = e->stage ? q : NULL,
				.lse = e->stage ? lse : NULL,
				.staged = replay_row, .staged_ctx = &rc_,
				.heads = heads,
				.state = sb ? e->sh_state +
				                      ((size_t)j * o->layers + l) * sb
				            : NULL,
			};
			int rc = policy_decide(p, &pl);
			if (rc < 0) {
				engine_say(e, "replay: %s", kvt_strerror(rc));
				return rc;
			}
		}
	return 0;
}

/* After the sync: the expected positions of list (j, l, h) into e->want. */
void replay_want(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                 uint32_t n, uint32_t n_seen)
{
	size_t si = sh_idx(e, j, l, h);
	uint32_t len = e->sh_len[si] + n;
	const uint32_t *pos = e->sh_pos + si * e->cap;
	const uint8_t *drop = e->sh_drop + si * e->cap;
	memset(e->want, 0, n_seen);
	for (uint32_t i = 0; i < len; i++)
		if (!drop[i])
			e->want[pos[i]] = 1;
}

/*
 * After verify_list: the shadow compacts like the daemon.  Positions
 * verify_list cleared from e->want (evicted under pressure) are dropped
 * too, so the shadow holds what the daemon holds, in its order (the next
 * replay_decide checks that).
 */
void replay_commit(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                   uint32_t n)
{
	uint32_t ef = e->o->pol->entry_floats;
	size_t si = sh_idx(e, j, l, h);
	uint32_t len = e->sh_len[si] + n, nl;
	uint32_t *pos = e->sh_pos + si * e->cap;
	uint8_t *drop = e->sh_drop + si * e->cap;
	for (uint32_t i = 0; i < len; i++)
		if (!drop[i] && !e->want[pos[i]])
			drop[i] = 1;
	uint32_t nm = compact_plan(drop, len, e->moves, &nl);
	policy_move_entries(pos, ef ? e->sh_ent + si * e->cap * ef : NULL, ef,
	                    e->moves, nm);
	e->sh_len[si] = nl;
}
