/*
 * tova_rule.h — TOVA's rule on a device (policies/tova.c's, run where the
 * keys, the staged queries and the positions are): its params and jobs,
 * as the device rule named "tova" takes them (struct kvt_backend_rule,
 * backend.h; the cuda backend's: policies/tova.cu).  The output words and
 * the refusals every rule shares are backend.h's.
 *
 * One job per (sequence, layer): the positions its lists hold live in
 * device memory (state, one mem_new buffer): for state record r (the
 * caller's index of the (sequence, layer)) and half h, [cap] positions
 * (uint32) at (uint32_t *)state + (r * 2 + h) * cap.  Every list of the
 * layer holds the same positions in the same order (TOVA's decisions are
 * shared and every sync appends the same entries to each), so one array
 * stands for all.  A job reads the half `cur` and writes the other (the
 * new entries at n_seen - n_new + k), compacted by its drops as
 * compact_drops compacts the pages.  The rule is policies/tova.c's: when
 * due, the newest query of the sync (position n_seen - 1) scores entry i
 * by (1/H) sum over the KV heads g in order of (sum over the G query
 * heads j of g in order of exp(scale q_j . k_gi - lse_j)), the logits of
 * each list by one SGEMM as attn_band_cpu; protected: pos < sinks and pos
 * + window >= n_seen; of the others the best keep stay (ties keep the
 * higher position); the same drops in every list.
 *
 * Run: n jobs after the work queued on the stream: keys read through the
 * paged table, the newest row's q and lse in device staging, the
 * positions read in each job's half cur and written (compacted by its
 * drops) in the other.  out[j] = 1 when a q or lse value of job j's new
 * rows (every query head) is not finite; its drops are one list's (every
 * list of the layer drops them).  KVT_EINVAL besides backend.h's: a
 * record beyond n_records is the job's last list's, len + n_new beyond
 * cap, n_new 0, rows beyond the ring.
 */
#ifndef KVT_TOVA_RULE_H
#define KVT_TOVA_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct tova_rule and tova_rule_job (the rule's
 * kvt_backend_rule.version). */
#define TOVA_RULE_VERSION 1

struct tova_rule {
	void *state;           /* device: the tenant's positions (above) */
	uint32_t cap;          /* entries per half */
	struct kvt_backend_rows rows; /* device staging's layout */
	uint32_t sinks, window; /* 0: none */
};

/* One (sequence, layer) of the rule: ring of its (sequence, layer) in
 * device staging, the list record of KV head 0 (KV head g at record + g),
 * its state record, the half holding its positions, the length of each
 * list before the sync, the new entries, the tokens seen after them,
 * whether a selection is due, the unprotected entries kept, the drops
 * (the caller's count, checked; the same indices for every list) and
 * where their indices go. */
struct tova_rule_job {
	const float *ring;
	uint32_t record, srec, cur;
	uint32_t len, n_new, n_seen;
	uint32_t due, keep, n_drop, drop_off;
};

#endif
