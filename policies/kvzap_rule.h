/*
 * kvzap_rule.h — KVzap's rule on a device (policies/kvzap.c's, run where
 * the scores of the entries are): its params and jobs, as the device rule
 * named "kvzap" takes them (struct kvt_backend_rule, backend.h; the cuda
 * backend's: policies/kvzap.cu).  The output words and the refusals every
 * rule shares are backend.h's.
 *
 * The per-entry state of a tenant's lists lives in device memory (state,
 * one mem_new buffer): for state record r (a list's) and half h (0 or 1)
 * the entries' [cap] positions (uint32) then their [cap] scores (float,
 * what the scorer gave the entry at its arrival), at (uint32_t *)state +
 * (r * 2 + h) * cap * 2.  A job reads the half `cur` and writes the other,
 * so the caller commits a sync by flipping cur and a refused sync leaves
 * no trace.  The rule is policies/kvzap.c's: the new entries get position
 * n_seen - n_new + k and score pre[k * n_kv_heads + g] (the scorer's
 * output for the job's (sequence, layer), in device memory); an entry at
 * pos is dropped iff it leaves the recent window at this sync
 * (n_seen - n_new <= pos + window < n_seen), pos >= sinks and
 * !(score >= tau) (strict <, NaN dropped); the others stay; then the state
 * half is compacted as compact_drops compacts the pages.
 *
 * Run: n jobs, a list each, after the work queued on the stream (the
 * scorer's writes of pre among it).  out[j] = 1 when a new score of job
 * j is not finite (its drops: none, count UINT32_MAX).  n_drop is the
 * most the job may drop (the caller's bound: the entries that leave the
 * window): at most n_drop indices are written, out[n + j] is the count.
 * KVT_EINVAL besides backend.h's: a record beyond n_records, a KV head
 * beyond the geometry's, len + n_new beyond cap, n_new beyond n_seen, new
 * entries without pre, drops beyond the output.
 */
#ifndef KVT_KVZAP_RULE_H
#define KVT_KVZAP_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct kvzap_rule and kvzap_rule_job (the rule's
 * kvt_backend_rule.version). */
#define KVZAP_RULE_VERSION 1

struct kvzap_rule {
	void *state;            /* device: the tenant's state (above) */
	uint32_t cap;           /* entries per half */
	uint32_t sinks, window; /* 0: none */
	float tau;              /* the threshold, pressure applied */
};

/* One list of the rule: the new entries' scores of its (sequence, layer)
 * [n_new][n_kv_heads] (device), its state record and KV head g, the half
 * holding its state, its length before the sync, the new entries, the
 * tokens seen after them, whether any entry may leave the window (due),
 * keep (0: unused), the most drops and where their indices go. */
struct kvzap_rule_job {
	const float *pre;
	uint32_t record, g, cur;
	uint32_t len, n_new, n_seen;
	uint32_t due, keep, n_drop, drop_off;
};

#endif
