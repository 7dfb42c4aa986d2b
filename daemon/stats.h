/*
 * stats.h — the daemon's counters, defined once.  STATS_COUNTERS generates
 * the struct and its rendering into a reply row (kvtrimctl stats), so a
 * counter added here shows everywhere.  Gauges (pool bytes, tenants ...)
 * are computed from live state when a row is rendered, never stored.
 * Threads: loop thread only.
 */
#ifndef KVT_STATS_H
#define KVT_STATS_H

#include <stdint.h>

#include "codec.h"

#define STATS_COUNTERS(X)                                                      \
	X(requests_total, "control requests received")                         \
	X(errors_total, "requests answered with an error")                     \
	X(syncs_total, "sync requests applied")                                \
	X(sync_items_total, "sequence items in applied syncs")                 \
	X(sync_us_total, "daemon time spent applying syncs, microseconds")     \
	X(entries_appended_total, "KV entries committed")                      \
	X(entries_evicted_total, "KV entries evicted by policies")             \
	X(tenants_registered_total, "tenants registered")                      \
	X(tenants_reclaimed_total, "tenants dropped after their client died")  \
	X(seqs_opened_total, "sequences opened")                               \
	X(seqs_closed_total, "sequences closed")

struct stats {
#define STATS_FIELD_(name, help) uint64_t name;
	STATS_COUNTERS(STATS_FIELD_)
#undef STATS_FIELD_
	/* errors by code: index = -code */
	uint64_t errors_by_code[64];
};

/* Appends every counter to row. */
void stats_fill_row(const struct stats *s, struct ipc_row *row);

/* Counts an error reply of code err (< 0). */
void stats_count_error(struct stats *s, int err);

#endif
