/*
 * stats.h — the daemon's statistics, defined once.
 *
 * Every field is declared in one of the X-macro lists below (STATS_COUNTERS,
 * _GAUGES, _FGAUGES, _HISTOGRAMS, _TENANT_U64, _TENANT_F64), and that list
 * generates the storage, the `kvtrimctl stats` / `tenants` rows, GET
 * /metrics and GET /stats: a field added here shows in all four, under one
 * name (the naming rules: docs/protocol.md, "Names of the statistics").
 * Columns: X(name, help) for the global lists; X(field, kind, name, help)
 * for the tenant lists, `field` mirroring struct kvt_tenant_stats.
 *
 * Threads: struct stats and snapshots belong to the loop thread; the loop
 * publishes a finished snapshot into a struct stats_pub (mutex + condition
 * variable), the only thing other threads (the HTTP server) read.
 */
#ifndef KVT_STATS_H
#define KVT_STATS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "kvtrim.h"

#define STATS_COUNTERS(X)                                                      \
	X(requests_total, "control requests received")                         \
	X(error_replies_total, "requests answered with an error")              \
	X(syncs_total, "sync requests applied")                                \
	X(sync_items_total, "sequence items in applied syncs")                 \
	X(entries_appended_total, "KV entries committed")                      \
	X(entries_evicted_total, "KV entries evicted by policies")             \
	X(tenants_registered_total, "tenants registered")                      \
	X(tenants_reclaimed_total,                                             \
	  "tenants dropped after their client died or left")                   \
	X(sequences_opened_total, "sequences opened")                          \
	X(sequences_closed_total, "sequences closed")                          \
	X(chunks_created_total, "2 MiB pool chunks created")                   \
	X(chunks_released_total, "2 MiB pool chunks released")                 \
	X(auth_refusals_total,                                                 \
	  "connections or hellos refused by the uid/gid allow lists")          \
	X(handle_accept_failures_total,                                        \
	  "fd.sock accepts that failed (e.g. out of fds); each pauses the "    \
	  "listener 100 ms to 1 s")                                            \
	X(handle_pending_refusals_total,                                       \
	  "fd.sock connections refused at accept, or one without a tenant "    \
	  "closed for a newcomer (max_pending_conns, max_pending_per_uid, "    \
	  "max_pending_per_pid)")                                              \
	X(handle_violations_total,                                             \
	  "fd.sock peers disconnected for sending what the protocol never "    \
	  "asks (junk, a packet before hello, a CHUNK_CLOSED for no chunk)")   \
	X(quota_refusals_total,                                                \
	  "hellos refused for asking more than max_quota")                     \
	X(tenant_memory_refusals_total,                                        \
	  "hellos refused for needing more daemon memory than "               \
	  "tenant_memory_max")                                                 \
	X(pressure_tightenings_total,                                          \
	  "times a tenant's compression was tightened under memory pressure")  \
	X(backpressure_waits_total, "requests parked waiting for pool pages")  \
	X(backpressure_resumed_total,                                          \
	  "parked requests that got their pages and completed")                \
	X(backpressure_timeouts_total,                                         \
	  "parked requests refused with EPOOLFULL after pressure_deadline_ms") \
	X(device_waits_total,                                                  \
	  "syncs parked until the engine's GPU writes were done (cuda, "      \
	  "policies that read K)")                                             \
	X(control_conns_refused_total,                                         \
	  "control connections refused at accept (max_pending_conns, "        \
	  "max_pending_per_uid, max_pending_per_pid)")                         \
	X(control_conns_evicted_total,                                         \
	  "control connections without a tenant closed at max_pending_conns " \
	  "for a newcomer of a uid holding fewer")                             \
	X(control_conns_closed_idle_total,                                     \
	  "control connections the daemon closed for sending no request and " \
	  "having no tenant within hello_timeout_ms")                          \
	X(control_conns_closed_send_timeout_total,                             \
	  "control connections the daemon closed for not taking a reply "     \
	  "within send_timeout_ms")                                            \
	X(syncs_offloaded_total,                                               \
	  "syncs run on a worker thread (sync_offload_us)")                    \
	X(device_h2d_bytes_total,                                              \
	  "bytes the daemon's backend ops copied from host to device memory " \
	  "(cuda; 0 on cpu)")                                                  \
	X(device_d2h_bytes_total,                                              \
	  "bytes the daemon's backend ops copied from device to host memory " \
	  "(cuda; 0 on cpu)")                                                  \
	X(device_launches_total,                                               \
	  "kernel launches and cuBLAS calls the daemon's backend made (cuda; " \
	  "0 on cpu)")                                                         \
	X(sync_cpu_ns_total,                                                   \
	  "CPU nanoseconds the threads that applied syncs spent in them, "    \
	  "refused ones included (the loop's or a worker's)")                  \
	X(device_emulated_ns_total,                                            \
	  "CPU nanoseconds the daemon's threads spent running the device's "  \
	  "work on the CUDA emulator (its kernels, cuBLAS and copies), "      \
	  "counted from the first stats read; 0 on a GPU and on cpu")         \
	X(scorer_shared_runs_total,                                            \
	  "device scorer runs that scored the syncs of several tenants "      \
	  "sharing the scorer's weights at once (scorer_gather_us)")          \
	X(scorer_shared_syncs_total,                                           \
	  "syncs scored in those runs")                                        \
	X(handle_barred_refusals_total,                                        \
	  "handle channels of a process barred for breaking the handle "      \
	  "protocol (1 s doubling to 60 s); their hellos are refused")        \
	X(control_requests_dropped_total,                                      \
	  "control requests read and never answered: their connection "      \
	  "closed first, or they were malformed")                              \
	X(control_requests_unread_total,                                       \
	  "requests of control connections without a tenant refused with "   \
	  "ETOOBIG unread: longer than any hello or admin request")            \
	X(control_reads_paused_total,                                          \
	  "times the daemon stopped reading a control connection: "           \
	  "max_inflight_per_conn requests unanswered or its unsent replies "  \
	  "above 256 KiB (it is read again as they drain)")                   \
	X(control_conns_closed_protocol_total,                                 \
	  "control connections closed for breaking the SP wire (bad header, " \
	  "frame type or a frame above 4 MiB)")                                \
	X(control_accept_failures_total,                                       \
	  "ctl.ipc accepts that failed (out of fds, say; the listener then "  \
	  "pauses 100 ms doubling to 1 s)")                                    \
	X(config_reloads_total, "config reloads (SIGHUP) applied")             \
	X(config_reload_failures_total,                                        \
	  "config reloads refused (the old config was kept)")                  \
	X(config_sets_total,                                                   \
	  "settings changed live with kvtrimctl config set")                   \
	X(weights_reloads_total, "tenant scorer weights re-read on SIGHUP")    \
	X(weights_reload_failures_total,                                       \
	  "weight reloads refused (the tenant kept its old weights)")          \
	X(stats_conn_timeouts_total,                                           \
	  "stats-socket connections closed for no complete request head "     \
	  "within stats_header_timeout_ms, or a reply not read in 10 s")       \
	X(stats_conn_drops_total,                                              \
	  "stats-socket connections closed at stats_max_conns to make room "  \
	  "(the one waiting longest for a request)")

#define STATS_GAUGES(X)                                                        \
	X(uptime_seconds, "seconds since kvtrimd started")                     \
	X(pool_size_bytes, "bytes of the KV pool")                             \
	X(pool_bytes_used, "pool bytes in chunks held by tenants")             \
	X(pool_bytes_free, "pool bytes not in any chunk")                      \
	X(pool_chunks_capacity, "2 MiB chunks the pool can hold")              \
	X(pool_chunks_used, "2 MiB chunks held by tenants")                    \
	X(pool_chunks_free, "2 MiB chunks the pool can still create")          \
	X(kv_bytes, "bytes of pages holding KV entries or headroom")           \
	X(pages_used, "pages in use over all tenants")                         \
	X(tenants, "registered tenants")                                       \
	X(scorers_shared,                                                      \
	  "device copies of scorer weights in use: one per distinct weights, " \
	  "however many tenants share it")                                     \
	X(sequences, "open sequences")                                         \
	X(entries_kept, "KV entries held over all lists")                      \
	X(clients_connected, "engine processes connected (handle channels)")   \
	X(control_connections,                                                 \
	  "open control-socket connections (engines and kvtrimctl)")           \
	X(backpressure_parked_requests, "requests waiting for pool pages now") \
	X(pool_uids, "uids holding a registered tenant")                       \
	X(uid_share_bytes,                                                     \
	  "pool bytes the tenants of one uid may hold together "               \
	  "(uid_pool_share)")                                                  \
	X(pid_share_bytes,                                                     \
	  "pool bytes the tenants of one process may hold together "           \
	  "(pid_pool_share)")                                                  \
	X(uid_bytes_used_max,                                                  \
	  "pool bytes held by the tenants of the uid holding most")

#define STATS_FGAUGES(X)                                                       \
	X(pool_use_ratio, "pool chunks in use / capacity")                     \
	X(pressure_level, "0 below high_watermark, rising to 1 at a full pool")

#define STATS_HISTOGRAMS(X)                                                    \
	X(sync_latency_seconds,                                                \
	  "sync requests: receipt to reply, including any backpressure wait")  \
	X(sync_apply_seconds,                                                  \
	  "time in the tenant's sync apply: scoring, decisions, compaction, "  \
	  "pages")                                                             \
	X(scorer_seconds,                                                      \
	  "time in the policies' scoring and decisions (part of "             \
	  "sync_apply_seconds)")

#define STATS_TENANT_U64(X)                                                    \
	X(pid, STATS_GAUGE, "pid", "process id of the tenant's engine")        \
	X(pages_used, STATS_GAUGE, "pages_used",                               \
	  "pages holding entries or headroom")                                 \
	X(pages_free, STATS_GAUGE, "pages_free",                               \
	  "free pages inside the tenant's chunks")                             \
	X(chunks, STATS_GAUGE, "chunks", "2 MiB chunks held")                  \
	X(bytes, STATS_GAUGE, "bytes",                                         \
	  "bytes of chunks held (what the quota counts)")                      \
	X(quota_bytes, STATS_GAUGE, "quota_bytes", "hard quota")               \
	X(daemon_bytes, STATS_GAUGE, "daemon_memory_bytes",                    \
	  "daemon memory outside the pool the tenant may cause at most "       \
	  "(table, staging, sequence state, scratch; tenant_memory_max caps "  \
	  "it)")                                                               \
	X(sequences, STATS_GAUGE, "sequences", "open sequences")               \
	X(syncs, STATS_COUNTER, "syncs_total", "syncs applied")                \
	X(entries_kept, STATS_GAUGE, "entries_kept", "KV entries held now")    \
	X(entries_appended, STATS_COUNTER, "entries_appended_total",           \
	  "KV entries committed")                                              \
	X(entries_evicted, STATS_COUNTER, "entries_evicted_total",             \
	  "KV entries evicted")                                                \
	X(priority, STATS_GAUGE, "priority",                                   \
	  "priority under memory pressure (tenant_priorities)")                \
	X(draining, STATS_GAUGE, "draining",                                   \
	  "1 while the tenant admits no new sequences (kvtrimctl drain)")     \
	X(budget, STATS_GAUGE, "budget_entries",                               \
	  "entries per list the policy's budget allowed at the last sync, "   \
	  "pressure applied (0: no entry budget)")

#define STATS_TENANT_F64(X)                                                    \
	X(compression_ratio, STATS_GAUGE, "compression_ratio",                 \
	  "entries appended per entry not evicted (1 = no compression)")       \
	X(pressure, STATS_GAUGE, "pressure",                                   \
	  "memory-pressure level applied to the tenant (0..1)")

enum stats_kind { STATS_COUNTER, STATS_GAUGE };

/* Upper bounds of the histogram buckets, seconds (+Inf is implicit). */
#define STATS_BUCKETS(X)                                                       \
	X(0.00001) X(0.000025) X(0.00005) X(0.0001) X(0.00025) X(0.0005)       \
	X(0.001) X(0.0025) X(0.005) X(0.01) X(0.025) X(0.05) X(0.1)            \
	X(0.25) X(0.5) X(1) X(2.5) X(5)

#define STATS_COUNT_(x) +1
enum { STATS_NBUCKETS = 0 STATS_BUCKETS(STATS_COUNT_) };
#undef STATS_COUNT_

#define STATS_NERR 64 /* error codes counted: 1..63 */

struct stats_hist {
	uint64_t bucket[STATS_NBUCKETS + 1]; /* not cumulative; last = +Inf */
	uint64_t count;
	double sum; /* seconds */
};

struct stats {
#define STATS_FIELD_(name, help) uint64_t name;
	STATS_COUNTERS(STATS_FIELD_)
#undef STATS_FIELD_
#define STATS_HFIELD_(name, help) struct stats_hist name;
	STATS_HISTOGRAMS(STATS_HFIELD_)
#undef STATS_HFIELD_
	uint64_t errors_by_code[STATS_NERR]; /* index = -code */
};

struct stats_tenant {
	uint32_t id;
	char name[KVT_NAME_MAX];
	char policy[KVT_SPEC_MAX];
#define STATS_TU_(field, kind, name, help) uint64_t field;
	STATS_TENANT_U64(STATS_TU_)
#undef STATS_TU_
#define STATS_TF_(field, kind, name, help) double field;
	STATS_TENANT_F64(STATS_TF_)
#undef STATS_TF_
};

/* Everything /metrics, /stats and `kvtrimctl stats` show, at one instant. */
struct stats_snap {
	struct stats c;
#define STATS_G_(name, help) uint64_t name;
	STATS_GAUGES(STATS_G_)
#undef STATS_G_
#define STATS_F_(name, help) double name;
	STATS_FGAUGES(STATS_F_)
#undef STATS_F_
	char version[16];
	char backend[16];
	uint32_t n_tenant_list;
	struct stats_tenant *tenant_list; /* [n_tenant_list], owned by the snapshot */
};

/* Allocates a zeroed snapshot with room for n tenants; NULL when out of
 * memory.  stats_snap_free releases it (NULL-safe). */
struct stats_snap *stats_snap_new(uint32_t n);
void stats_snap_free(struct stats_snap *s);

/* Counts an error reply of code err (< 0). */
void stats_count_error(struct stats *s, int err);

/* Adds one observation (seconds) to a histogram. */
void stats_observe(struct stats_hist *h, double seconds);

/*
 * Appends the daemon-wide fields of a snapshot to a reply row: gauges,
 * counters, histogram _count/_sum, then errors_<NAME>_total for codes seen
 * while the row has room (IPC_MAX_COLS; /metrics and /stats always have
 * them all).
 */
void stats_fill_row(const struct stats_snap *s, struct ipc_row *row);

/* Appends one tenant's fields (id, name, policy and the tenant lists). */
void stats_fill_tenant_row(const struct stats_tenant *t, struct ipc_row *row);

enum stats_fmt { STATS_FMT_PROM, STATS_FMT_JSON };

/*
 * Renders a snapshot as Prometheus text exposition (version 0.0.4) or as
 * one JSON object.  *out is malloc'ed (free() it).  0 or KVT_ENOMEM.
 */
int stats_render(const struct stats_snap *s, enum stats_fmt fmt, char **out,
                 size_t *len);

/* ---- publication to other threads */

struct stats_pub {
	pthread_mutex_t lock;
	pthread_cond_t cond;    /* signalled on each publication and at close */
	struct stats_snap *snap; /* latest, owned; NULL before the first */
	uint64_t gen;           /* publications so far */
	int closed;
};

void stats_pub_init(struct stats_pub *p);
void stats_pub_destroy(struct stats_pub *p); /* frees the last snapshot */

/* Loop thread: replaces the published snapshot (takes ownership). */
void stats_pub_publish(struct stats_pub *p, struct stats_snap *snap);

/* Wakes every waiter for good: stats_pub_render stops waiting. */
void stats_pub_close(struct stats_pub *p);

/* Publications so far. */
uint64_t stats_pub_gen(struct stats_pub *p);

/*
 * Any thread: waits up to wait_ms for publication number min_gen (0 = take
 * what is there), then renders the latest snapshot.  KVT_EBUSY when nothing
 * was ever published, KVT_ENOMEM.
 */
int stats_pub_render(struct stats_pub *p, uint64_t min_gen, int wait_ms,
                     enum stats_fmt fmt, char **out, size_t *len);

#endif
