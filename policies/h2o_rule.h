/*
 * h2o_rule.h — H2O's rule on a device (policies/h2o.c's, run where the
 * keys, the staged queries and the per-entry state are): its params and
 * jobs, as the device rule named "h2o" takes them (struct
 * kvt_backend_rule, backend.h; the cuda backend's: policies/h2o.cu).
 * observed_attention runs it too (agg 2).  The output words and the
 * refusals every rule shares are backend.h's.
 *
 * The per-entry state of a tenant's lists lives in device memory (state,
 * one mem_new buffer): for list record r and half h (0 or 1) the entries
 * [cap] positions (uint32) then [cap][G] floats S, the attention each of
 * the G query heads of the list's KV head gave the entry, at
 * (uint32_t *)state + (r * 2 + h) * cap * (1 + G).  A job reads the half
 * `cur` and writes the other, so the caller commits a sync by flipping
 * cur and a refused sync leaves no trace.  The rule is policies/h2o.c's:
 * the new entries get position n_seen - n_new + k and S 0; every entry i
 * adds, per query head j in t order, exp(scale q_t . k_i - lse_t) where
 * pos_i <= position of q_t (else 0), the logits by one SGEMM as
 * attn_band_cpu; when due, score = mean (sum in j order / G) or max over
 * j, protected: pos < sinks, window (pos + window >= n_seen) and recent
 * (pos + recent >= n_seen; 0 for none); of the others the best keep stay
 * (ties keep the higher position), then the state half is compacted as
 * compact_drops compacts the pages.
 *
 * Run: n jobs, a list each, after the work queued on the stream: keys
 * read through the paged table, the new rows' q and lse in device
 * staging, the state read in each job's half cur and written (compacted
 * by its drops) in the other.  out[j] = 1 when a q or lse value of job
 * j's new rows (every query head) is not finite.  KVT_EINVAL besides
 * backend.h's: len + n_new beyond cap, rows beyond the ring.
 */
#ifndef KVT_H2O_RULE_H
#define KVT_H2O_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct h2o_rule and h2o_rule_job (the rule's
 * kvt_backend_rule.version). */
#define H2O_RULE_VERSION 1

struct h2o_rule {
	void *state;           /* device: the tenant's state (above) */
	uint32_t cap;          /* entries per half */
	struct kvt_backend_rows rows; /* device staging's layout */
	uint32_t agg;          /* 0 mean, 1 max, 2 observed (mean of S / the
	                          queries that could see the entry) */
	uint32_t sinks, window; /* 0: none */
};

/* One list of the rule: ring of its (sequence, layer) in device
 * staging, its record and KV head g, the half holding its state, its
 * length before the sync, the new entries, the tokens seen after them,
 * whether a selection is due, recent, the unprotected entries kept, the
 * drops (the caller's count, checked) and where their indices go. */
struct h2o_rule_job {
	const float *ring;
	uint32_t record, g, cur;
	uint32_t len, n_new, n_seen;
	uint32_t due, recent, keep, n_drop, drop_off;
};

#endif
