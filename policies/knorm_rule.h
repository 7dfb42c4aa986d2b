/*
 * knorm_rule.h — the key-norm baseline's rule on a device (policies/
 * knorm.c's, run where the keys and the norms are): its params and jobs,
 * as the device rule named "knorm" takes them (struct kvt_backend_rule,
 * backend.h; the cuda backend's: policies/knorm.cu).  The output words and
 * the refusals every rule shares are backend.h's.
 *
 * The state lives in device memory (state, one mem_new buffer): for list
 * record r (the caller's numbering of lists, the same as its table's) and
 * half h, [cap] positions (uint32) then [cap] key norms (float) at
 * (uint32_t *)state + (r * 2 + h) * cap * 2.  A job reads the half `cur`
 * and writes the other: the old entries carried, each new entry (index
 * len + k, position n_seen - n_new + k) with the L2 norm of its key as
 * stored (read through the paged table, converted to float, squared and
 * summed in double in index order, sqrt, rounded to float: knorm.c's and
 * key_norms' bits), compacted by its drops as compact_drops compacts the
 * pages.  When due, knorm_decide's selection: score -norm; protected: pos
 * < sinks and pos + window >= n_seen (window 0: none); of the others the
 * best keep stay (ties keep the higher position).  No staged row is read,
 * so no flag is ever set (out[j] = 0).
 *
 * KVT_EINVAL besides backend.h's: a record beyond n_records, cur not 0
 * or 1, len + n_new beyond cap, n_new beyond n_seen, n_drop beyond len +
 * n_new, or its indices beyond out_words.
 */
#ifndef KVT_KNORM_RULE_H
#define KVT_KNORM_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct knorm_rule and knorm_rule_job (the rule's
 * kvt_backend_rule.version). */
#define KNORM_RULE_VERSION 1

struct knorm_rule {
	void *state;            /* device: the tenant's state (above) */
	uint32_t cap;           /* entries per half */
	uint32_t sinks, window; /* 0: none */
};

/* One list of the rule: its record (its keys' and its state's), the half
 * holding its state, its length before the sync, the new entries, the
 * tokens seen after them, whether a selection is due, the unprotected
 * entries kept, the drops (the caller's count, checked) and where their
 * indices go. */
struct knorm_rule_job {
	uint32_t record, cur;
	uint32_t len, n_new, n_seen;
	uint32_t due, keep, n_drop, drop_off;
};

#endif
