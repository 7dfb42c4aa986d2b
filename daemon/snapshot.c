/*
 * snapshot.c — the daemon's numbers as the outside sees them: stats
 * snapshots (stats.h) for kvtrimctl stats / tenants and for the HTTP
 * stats socket, and systemd's STATUS= line.
 *
 * The loop builds a snapshot every cron tick, and on demand when the HTTP
 * thread asks through uv_async; the HTTP thread only ever reads published
 * snapshots.
 */
#include <inttypes.h>
#include <stdio.h>

#include "http.h"
#include "notify.h"
#include "server_int.h"

#define SRV_SNAP_WAIT_MS 250 /* HTTP waits this long for a fresh snapshot */

/*
 * Appended per entry not evicted: 1 means no compression.  When every
 * entry was evicted the ratio is unbounded; the count appended is shown.
 */
static double srv_ratio(uint64_t appended, uint64_t evicted)
{
	if (!appended)
		return 1.0;
	if (evicted >= appended)
		return (double)appended;
	return (double)appended / (double)(appended - evicted);
}

/* Everything the stats outputs show, from live state (loop thread). */
struct stats_snap *srv_snapshot(struct server *s)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		n += s->tenants[i] != NULL;
	struct stats_snap *snap = stats_snap_new(n);
	if (!snap)
		return NULL;
	snap->c = s->st;
	snap->c.chunks_created_total =
		__atomic_load_n(&s->pool.chunks_created_total, __ATOMIC_RELAXED);
	snap->c.chunks_released_total =
		__atomic_load_n(&s->pool.chunks_released_total, __ATOMIC_RELAXED);
	snap->c.scorer_shared_runs_total = __atomic_load_n(
		&s->pool.scorer_shared_runs_total, __ATOMIC_RELAXED);
	snap->c.scorer_shared_syncs_total = __atomic_load_n(
		&s->pool.scorer_shared_syncs_total, __ATOMIC_RELAXED);
	snap->scorers_shared = s->pool.n_scorers;
	http_counts(s->http, &snap->c.stats_conn_timeouts_total,
	            &snap->c.stats_conn_drops_total);
	/* The backend counts what its ops copy (cuda); the cpu table has no
	 * traffic op and nothing crosses. */
	if (s->bops && s->bops->traffic && s->bctx &&
	    s->bops->traffic(s->bctx, &snap->c.device_h2d_bytes_total,
	                     &snap->c.device_d2h_bytes_total,
	                     &snap->c.device_launches_total,
	                     &snap->c.device_emulated_ns_total))
		snap->c.device_h2d_bytes_total = snap->c.device_d2h_bytes_total =
			snap->c.device_launches_total =
			snap->c.device_emulated_ns_total = 0;
	snprintf(snap->version, sizeof(snap->version), "%d.%d.%d",
	         KVT_VERSION_MAJOR, KVT_VERSION_MINOR, KVT_VERSION_PATCH);
	/* "cpu" (memfd chunks), or "cuda/vmm" / "cuda/ipc": the sharing mode
	 * rides in the existing backend stat and label. */
	if (!s->bops || s->bops->host_visible)
		snprintf(snap->backend, sizeof(snap->backend), "%s",
		         s->bops ? s->bops->name : "cpu");
	else
		snprintf(snap->backend, sizeof(snap->backend), "%s/%s",
		         s->bops->name, s->bmode ? s->bmode : "?");

	uint64_t total = pool_bytes_total(&s->pool);
	uint64_t used = pool_chunks_used(&s->pool) * KVT_CHUNK_BYTES;
	snap->uptime_seconds = (now_ms() - s->started_ms) / 1000;
	snap->pool_size_bytes = total;
	snap->pool_bytes_used = used;
	snap->pool_bytes_free = total > used ? total - used : 0;
	snap->pool_chunks_capacity = s->pool.chunk_capacity;
	snap->pool_chunks_used = pool_chunks_used(&s->pool);
	snap->pool_chunks_free =
		s->pool.chunk_capacity > pool_chunks_used(&s->pool)
			? s->pool.chunk_capacity - pool_chunks_used(&s->pool)
			: 0;
	snap->pool_use_ratio = s->pool.chunk_capacity
	                               ? (double)pool_chunks_used(&s->pool) /
	                                         (double)s->pool.chunk_capacity
	                               : 0;
	snap->pressure_level = s->pressure;
	for (struct srv_conn *c = s->fdc.conns; c; c = c->next)
		snap->clients_connected += !c->closing;
	snap->control_connections = s->ctl.n_pipes;
	snap->backpressure_parked_requests = s->n_parked;
	snap->pool_uids = pool_accounts(&s->pool, POOL_SHARE_UID);
	snap->uid_share_bytes =
		pool_share_chunks(&s->pool, POOL_SHARE_UID) * KVT_CHUNK_BYTES;
	snap->pid_share_bytes =
		pool_share_chunks(&s->pool, POOL_SHARE_PID) * KVT_CHUNK_BYTES;
	snap->uid_bytes_used_max = 0;
	for (const struct pool_account *a = s->pool.accounts; a; a = a->next)
		if (a->kind == POOL_SHARE_UID &&
		    pool_account_chunks(a) * KVT_CHUNK_BYTES >
		            snap->uid_bytes_used_max)
			snap->uid_bytes_used_max =
				pool_account_chunks(a) * KVT_CHUNK_BYTES;

	n = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st)
			continue;
		struct kvt_tenant_stats ts;
		struct stats_tenant *t = &snap->tenant_list[n++];
		srv_tenant_stats(st, &ts);
		t->id = st->id;
		snprintf(t->name, sizeof(t->name), "%s", tenant_name(st->t));
		snprintf(t->policy, sizeof(t->policy), "%s",
		         tenant_policy_spec(st->t));
		t->pid = st->pid;
		t->pages_used = ts.pages_used;
		t->pages_free = ts.pages_free;
		t->chunks = ts.chunks;
		t->bytes = ts.chunks * KVT_CHUNK_BYTES;
		t->quota_bytes = ts.quota_bytes;
		t->daemon_bytes = ts.daemon_bytes;
		t->sequences = ts.sequences;
		t->syncs = ts.syncs;
		t->entries_kept = ts.entries_kept;
		t->entries_appended = ts.entries_appended;
		t->entries_evicted = ts.entries_evicted;
		t->priority = config_priority(&s->cfg, t->name);
		t->draining = (uint64_t)st->draining;
		t->compression_ratio = srv_ratio(ts.entries_appended,
		                                 ts.entries_evicted);
		t->pressure = tenant_pressure(st->t);
		t->budget = ts.budget;

		snap->kv_bytes +=
			ts.pages_used * tenant_geom(st->t)->page_bytes;
		snap->pages_used += ts.pages_used;
		snap->sequences += ts.sequences;
		snap->entries_kept += ts.entries_kept;
		snap->tenants++;
	}
	snap->n_tenant_list = n;
	return snap;
}

void srv_publish(struct server *s)
{
	struct stats_snap *snap = srv_snapshot(s);
	if (snap)
		stats_pub_publish(&s->pub, snap);
}

void srv_snap_async_cb(uv_async_t *a)
{
	srv_publish(a->data);
}

/*
 * Runs on the HTTP thread: asks the loop for a fresh snapshot and renders
 * it, or the last one when the loop does not answer in SRV_SNAP_WAIT_MS
 * (it is busy; the data is then at most one cron tick old).
 */
int srv_http_render(void *ctx, enum stats_fmt fmt, char **out,
                    size_t *len)
{
	struct server *s = ctx;
	uint64_t want = stats_pub_gen(&s->pub) + 1;
	uv_async_send(&s->snap_async);
	return stats_pub_render(&s->pub, want, SRV_SNAP_WAIT_MS, fmt, out, len);
}

/* ---------------------------------------------------------- STATUS= */

/* "41.2MiB" */
static void srv_fmt_bytes(char *buf, size_t len, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.1fGiB", (double)b / (1ull << 30));
	else
		snprintf(buf, len, "%.1fMiB", (double)b / (1ull << 20));
}

void srv_status(struct server *s)
{
	char line[200], used[32], total[32];
	uint32_t tenants = 0;
	uint64_t seqs = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st)
			continue;
		struct kvt_tenant_stats ts;
		srv_tenant_stats(st, &ts);
		tenants++;
		seqs += ts.sequences;
	}
	uint64_t cap = pool_bytes_total(&s->pool);
	uint64_t u = pool_chunks_used(&s->pool) * KVT_CHUNK_BYTES;
	srv_fmt_bytes(used, sizeof(used), u);
	srv_fmt_bytes(total, sizeof(total), cap);
	snprintf(line, sizeof(line),
	         "tenants=%" PRIu32 " sequences=%" PRIu64 " pool=%s/%s "
	         "(%.0f%%) pressure=%.2f parked=%" PRIu32,
	         tenants, seqs, used, total, cap ? 100.0 * (double)u / (double)cap
	                                         : 0.0,
	         (double)s->pressure, s->n_parked);
	notify_status(line);
}
