/*
 * snapkv_rule.h — SnapKV's end-of-prefill rule on a device (policies/
 * snapkv.c's, for snapkv and pyramidkv, run where the prompt's keys and
 * the observation window's staged rows are): its params and jobs, as the
 * device rule named "snapkv" takes them (struct kvt_backend_rule,
 * backend.h; the cuda backend's: policies/snapkv.cu).  The output words
 * and the refusals every rule shares are backend.h's.
 *
 * A job is one list (one KV head of a (sequence, layer)) whose entry i
 * holds position i (the planner checks that nothing was evicted before).
 * The rule is snapkv.c's: with P = len and from = P - w, an entry i <
 * from scores the mean over the window's queries t (positions [from, P))
 * and the G query heads of its KV head of exp(q . k_i * scale - lse) (0
 * where i > from + t; the logits in attn_band_cpu's order), max-pooled
 * over its kernel neighbours (< from) in index order; entries i >= from
 * and i < sinks are protected; of the others the best keep stay (ties
 * keep the higher index).
 *
 * Run: out[j] = 1 when a q or lse value (every query head) of job j's
 * rows [len - w, len + n_new) is not finite.  A job that is not due only
 * has those rows checked (w 0: the new rows alone) and drops nothing.
 * KVT_EINVAL besides backend.h's: a KV head g >= n_kv_heads, w > len, a
 * due job with w 0, rows beyond the ring or q / lse beyond a row, kernel
 * even where a job is due.
 */
#ifndef KVT_SNAPKV_RULE_H
#define KVT_SNAPKV_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct snapkv_rule and snapkv_rule_job (the rule's
 * kvt_backend_rule.version). */
#define SNAPKV_RULE_VERSION 1

struct snapkv_rule {
	struct kvt_backend_rows rows; /* device staging's layout */
	uint32_t kernel;              /* max-pooling width, odd */
	uint32_t sinks;               /* first entries protected */
};

/* One list of the rule: the ring of its (sequence, layer) in device
 * staging, its record and KV head g, its prompt (len: the entries before
 * the sync, entry i at position i) and new entries, the observation
 * window, whether a selection is due, the unprotected entries kept, the
 * drops (the caller's count, checked) and where their indices go. */
struct snapkv_rule_job {
	const float *ring;
	uint32_t record, g;
	uint32_t len, n_new, w;
	uint32_t due, keep, n_drop, drop_off;
};

#endif
