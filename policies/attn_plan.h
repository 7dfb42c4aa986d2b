/*
 * attn_plan.h — what the attention-based rules (h2o, observed_attention,
 * tova, kvpop) share for a device to run them: the rule at one
 * (sequence, layer), as their decide() applies it, and the host's counts
 * of a list's job (policy_device_rule's plan), worked out from the
 * positions' numbers alone where the protection allows it.
 */
#ifndef KVT_ATTN_PLAN_H
#define KVT_ATTN_PLAN_H

#include <stdint.h>

#include "policy.h"

/* An attention-based rule for one (sequence, layer) (h2o_rule.h's struct
 * h2o_rule, tova_rule.h's and kvpop_rule.h's take its constant part). */
struct policy_attn_rule {
	enum policy_agg agg; /* H2O, observed_attention */
	uint32_t sinks, window; /* policy_protected's; window 0: none */
	uint32_t recent;  /* also protected: pos + recent >= n_seen (0: none;
	                     KVpop: its delay, the entries not yet scored) */
	uint32_t budget;  /* policy_budget at n_seen, pressure applied */
	int due;          /* a selection at this sync (TOVA: and a query) */
	uint32_t delay;   /* KVpop: attention is accumulated from the queries
	                     at most delay tokens after an entry */
};

/* Whether r selects at this sync (an unbounded budget never drops). */
static inline int policy_attn_due(const struct policy_attn_rule *r)
{
	return r->due && r->budget != UINT32_MAX;
}

/* What the host knows of one list before the device runs: the
 * unprotected entries kept and the drops. */
struct policy_attn_counts {
	uint32_t keep, n_drop;
};

/*
 * The counts of a list of len entries at pos before the sync and n_new
 * new ones at prev = n_seen - n_new on, under rule r whose protected tail
 * is the newest `tail` positions (nothing unless due).  tail_held: the
 * tail starts where no entry was ever dropped, so a protected position
 * is still in the list and the counts follow from the numbers alone;
 * else they come from the positions.
 */
struct policy_attn_counts policy_attn_count(const struct policy_attn_rule *r,
                                            uint32_t tail, int due,
                                            const uint32_t *pos, uint32_t len,
                                            uint32_t n_new, uint32_t prev,
                                            int tail_held);

/*
 * A per-list rule's job of KV head h in c (h2o's, kvpop's): 1 when its
 * list changes at this sync (it has entries, and new ones or a selection
 * due), the host's view in *hj (record c->state_rec + h, drops from
 * drop_off) and the kept count in *keep; else 0.  -1 when the counts
 * need the positions (tail_held 0) and policy_dev_pos could not read
 * them back: never with tail_held 1.
 */
int policy_attn_list_job(const struct policy_attn_rule *r, uint32_t tail,
                         int tail_held, const struct policy_layer *l,
                         const struct policy_dev_layer *c, uint32_t h,
                         uint32_t drop_off, struct policy_dev_job *hj,
                         uint32_t *keep);

#endif
