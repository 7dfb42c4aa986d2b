/*
 * random_rule.h — the random baseline's rule on a device (policies/
 * random.c's, run where the positions are): its params and jobs, as the
 * device rule named "random" takes them (struct kvt_backend_rule,
 * backend.h; the cuda backend's: policies/random.cu).  The output words
 * and the refusals every rule shares are backend.h's.
 *
 * The state lives in device memory (state, one mem_new buffer): for list
 * record r (the caller's numbering of lists) and half h, [cap] positions
 * (uint32) at (uint32_t *)state + (r * 2 + h) * cap.  A job reads the half
 * `cur` and writes the other (the new entries at n_seen - n_new + k),
 * compacted by its drops as compact_drops compacts the pages.  When due,
 * random_decide's selection: entry score (mix(base ^ pos) >> 40) * 2^-24,
 * base = mix(mix(mix(seed) ^ layer) ^ g), mix splitmix64's finaliser
 * (random.c's); protected: pos < sinks and pos + window >= n_seen (window
 * 0: none); of the others the best keep stay (ties keep the higher
 * position).  The score is a function of the position, so no score is
 * kept.  No staged row is read, so no flag is ever set (out[j] = 0).
 *
 * KVT_EINVAL besides backend.h's: a record beyond n_records, g beyond
 * n_kv_heads, cur not 0 or 1, len + n_new beyond cap, n_new beyond n_seen,
 * n_drop beyond len + n_new, or its indices beyond out_words.
 */
#ifndef KVT_RANDOM_RULE_H
#define KVT_RANDOM_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct random_rule and random_rule_job (the rule's
 * kvt_backend_rule.version). */
#define RANDOM_RULE_VERSION 1

struct random_rule {
	void *state;            /* device: the tenant's positions (above) */
	uint64_t seed;          /* the policy's seed */
	uint32_t cap;           /* entries per half */
	uint32_t sinks, window; /* 0: none */
};

/* One list of the rule: its state record, its layer and KV head g (the
 * hash's), the half holding its positions, its length before the sync,
 * the new entries, the tokens seen after them, whether a selection is
 * due, the unprotected entries kept, the drops (the caller's count,
 * checked) and where their indices go. */
struct random_rule_job {
	uint32_t record, layer, g, cur;
	uint32_t len, n_new, n_seen;
	uint32_t due, keep, n_drop, drop_off;
};

#endif
