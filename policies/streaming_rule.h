/*
 * streaming_rule.h — StreamingLLM's rule on a device (policies/
 * streaming.c's, run where the positions are): its params and jobs, as the
 * device rule named "streaming" takes them (struct kvt_backend_rule,
 * backend.h; the cuda backend's: policies/streaming.cu).  The output words
 * and the refusals every rule shares are backend.h's.
 *
 * One job per (sequence, layer), as TOVA's: the positions its lists hold
 * live in device memory (state, one mem_new buffer): for state record r
 * (the caller's index of the (sequence, layer)) and half h, [cap]
 * positions (uint32) at (uint32_t *)state + (r * 2 + h) * cap.  Every list
 * of the layer holds the same positions in the same order (the rule reads
 * positions alone, the same for every head, and every sync appends the
 * same entries to each), so one array stands for all.  A job reads the
 * half `cur` and writes the other (the new entries at n_seen - n_new + k),
 * compacted by its drops as compact_drops compacts the pages.  When due
 * (n_seen beyond the budget) an entry is kept iff pos < sinks or pos >=
 * from (the job's: streaming.c's S' and n_seen - recent); every other one
 * is dropped, the same indices in every list.  No staged row is read, so
 * no flag is ever set (out[j] = 0).
 *
 * KVT_EINVAL besides backend.h's: a state record beyond the layers of
 * n_records / n_kv_heads, cur not 0 or 1, len + n_new beyond cap, n_new
 * beyond n_seen, n_drop beyond len + n_new, or its indices beyond
 * out_words.
 */
#ifndef KVT_STREAMING_RULE_H
#define KVT_STREAMING_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct streaming_rule and streaming_rule_job (the
 * rule's kvt_backend_rule.version). */
#define STREAMING_RULE_VERSION 1

struct streaming_rule {
	void *state;  /* device: the tenant's positions (above) */
	uint32_t cap; /* entries per half */
};

/* One (sequence, layer) of the rule: its state record, the half holding
 * its positions, the length of each list before the sync, the new
 * entries, the tokens seen after them, whether a selection is due, keep
 * (0: every unprotected entry goes; batch_select.cuh's field), the kept
 * head [0, sinks) and tail [from, n_seen) of the positions, the drops
 * (the caller's count, checked; the same indices for every list) and
 * where their indices go. */
struct streaming_rule_job {
	uint32_t srec, cur;
	uint32_t len, n_new, n_seen;
	uint32_t due, keep, sinks, from, n_drop, drop_off;
};

#endif
