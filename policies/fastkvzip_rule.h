/*
 * fastkvzip_rule.h — Fast KVzip's selection on a device (policies/
 * fastkvzip.c's rule, a layer-wide top-k under a token or ratio budget or
 * a threshold, run where the scores of the entries are): its params and
 * jobs, as the device rule named "fastkvzip" takes them (struct
 * kvt_backend_rule, backend.h; the cuda backend's: policies/fastkvzip.cu).  The output words and the
 * refusals every rule shares are backend.h's.
 *
 * The per-entry state of a tenant's lists lives in device memory (state,
 * one mem_new buffer): one record per (sequence, layer), two halves, each
 * holding its n_kv_heads lists: for record r, half h and KV head g the
 * entries' [cap] positions (uint32) then their [cap] scores (float, the
 * gate's score at arrival), at (uint32_t *)state + ((r * 2 + h) * n_kv +
 * g) * cap * 2.  A job reads the half `cur` and writes the other, so the
 * caller commits a sync by flipping cur and a refused sync leaves no
 * trace.  The rule is policies/fastkvzip.c's: list g's new entries get
 * position n_seen - n_new + k and score pre[k * n_kv_heads + g] (the
 * scorer's output for the job's (sequence, layer), in device memory);
 * when due, the layer's lists laid end to end in g order are one
 * selection: protected pos < sinks or pos + window >= n_seen, of the
 * others the best min(budget - protected, entries) stay when budget >
 * protected, none else (select_topk_cpu over the concatenation, ranked
 * by position, ties keep the later entry); with a threshold (threshold
 * 1) every unprotected entry whose score is not >= tau is dropped instead
 * (select_threshold_cpu: strict <, NaN dropped; budget unread).  The drop
 * indices index the concatenation (POLICY_DEV_LAYER), each list's half
 * compacted by its own.
 *
 * Run: n jobs, a (sequence, layer) each, after the work queued on the
 * stream (the scorer's writes of pre among it).  out[j] = 1 when a new
 * score of job j is not finite (its drops: none, count UINT32_MAX).
 * n_drop is the most the job may drop (the caller's bound: entries -
 * budget; with a threshold, the entries not yet judged that left the
 * window, fkv_plan): at most n_drop indices are written, out[n + j] is the
 * count.
 * KVT_EINVAL besides backend.h's: a record beyond n_records, more KV heads
 * than FASTKVZIP_RULE_MAX_KV, a list beyond cap, n_new beyond n_seen, new
 * entries without pre, drops beyond the output.
 */
#ifndef KVT_FASTKVZIP_RULE_H
#define KVT_FASTKVZIP_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct fastkvzip_rule and fastkvzip_rule_job (the
 * rule's kvt_backend_rule.version). */
#define FASTKVZIP_RULE_VERSION 2

/* The most KV heads a job holds (a model with more decides on the
 * host). */
#define FASTKVZIP_RULE_MAX_KV 16

struct fastkvzip_rule {
	void *state;            /* device: the tenant's state (above) */
	uint32_t cap;           /* entries per list per half */
	uint32_t sinks, window; /* 0: none */
	uint32_t threshold;     /* 1: drop below tau; 0: the budgets */
	float tau;              /* the threshold, pressure applied */
};

/* One (sequence, layer): the new entries' scores [n_new][n_kv_heads]
 * (device), its state record and the half holding its state, its lists'
 * entries laid end to end with the new ones (len; n_new 0: the fields
 * batch_select.cuh reads), the new entries of each list (nn) and their
 * lengths before the sync (lens), the tokens seen after them, whether a
 * selection is due, the layer's budget (budget of one list times
 * n_kv_heads; UINT32_MAX: none), keep (0: worked out on the device), the
 * most drops and where their indices go. */
struct fastkvzip_rule_job {
	const float *pre;
	uint32_t record, cur;
	uint32_t len, n_new, nn, n_seen;
	uint32_t due, budget, keep, n_drop, drop_off;
	uint32_t lens[FASTKVZIP_RULE_MAX_KV];
};

#endif
