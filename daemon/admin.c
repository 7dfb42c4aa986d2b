/*
 * admin.c — the admin ops of the control socket (kvtrimctl): stats,
 * tenants, check, policies, config (read-only, open to whoever may open
 * the socket), and drain and config set (admin_uids / admin_gids only,
 * auth.c).
 *
 * Replies are tables (struct ipc_row); config set validates the value
 * with the config table, then the whole result, before anything is
 * applied.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "server_int.h"

static struct ipc_row *srv_rows(struct ipc_rep *rep, uint32_t n)
{
	rep->table.rows = calloc(n ? n : 1, sizeof(struct ipc_row));
	rep->table.n = rep->table.rows ? n : 0;
	return rep->table.rows;
}

/* After a check found a tenant's violations: the device table its engine
 * reads is rewritten where it differs from the table, and the log says so
 * (the check's detail has reported the first difference). */
static void srv_check_repair(struct srv_tenant *st)
{
	uint32_t fixed = 0;
	int rc = tenant_table_repair(st->t, &fixed);
	if (rc)
		LOG(LOG_LVL_WARNING, "tenant %" PRIu32 " (%s): rewriting its "
		    "device table view failed: %s", st->id, tenant_name(st->t),
		    kvt_strerror(rc));
	else if (fixed)
		LOG(LOG_LVL_WARNING, "tenant %" PRIu32 " (%s): %" PRIu32 " "
		    "records of the device table its engine reads differed "
		    "from the table (the engine wrote them); rewritten", st->id,
		    tenant_name(st->t), fixed);
}

/* kvtrimctl check: every tenant's invariants, and the pool against
 * what the tenants hold.  Run with no sync in flight (SRV_IDLE_WAIT). */
static void srv_check(struct server *s, struct ipc_row *row)
{
	char detail[IPC_STR_MAX] = "";
	uint64_t violations = 0, chunks = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st)
			continue;
		char d[IPC_STR_MAX - 32];
		int v = tenant_check(st->t, d, sizeof(d));
		if (v > 0 && !violations)
			snprintf(detail, sizeof(detail), "tenant %" PRIu32 ": %s",
			         st->id, d);
		if (v > 0)
			srv_check_repair(st);
		violations += v > 0 ? (uint64_t)v : 0;
		chunks += tenant_chunks(st->t);
	}
	if (chunks != pool_chunks_used(&s->pool)) {
		if (!violations)
			snprintf(detail, sizeof(detail),
			         "tenants hold %" PRIu64 " chunks, pool counts %" PRIu64,
			         chunks, pool_chunks_used(&s->pool));
		violations++;
	}
	if (pool_chunks_used(&s->pool) > s->pool.chunk_capacity) {
		if (!violations)
			snprintf(detail, sizeof(detail), "pool over capacity");
		violations++;
	}
	codec_row_u64(row, "ok", violations == 0);
	codec_row_u64(row, "violations", violations);
	codec_row_u64(row, "pool_chunks_used", pool_chunks_used(&s->pool));
	codec_row_str(row, "detail", violations ? detail : "every page is "
	              "free or in exactly one list; free + used = total");
}

static void srv_config_row(const struct server *s,
                           const struct config_entry *e, struct ipc_row *row)
{
	char val[IPC_STR_MAX];
	config_get(&s->cfg, e, val, sizeof(val));
	codec_row_str(row, "key", e->name);
	codec_row_str(row, "value", val);
	codec_row_u64(row, "mutable", !!(e->flags & CONFIG_MUTABLE));
}

/*
 * kvtrimctl config set: the same table validates the value, then
 * config_validate the whole result; only then is anything applied.
 */
static int srv_config_set(struct server *s, const struct ipc_req *r,
                          const struct srv_pipe *pipe, struct ipc_rep *rep,
                          char *why, size_t wlen)
{
	const char *key = r->u.set.key, *val = r->u.set.value;
	int rv = srv_pipe_admin(s, pipe, "config_set", why, wlen);
	if (rv)
		return rv;
	const struct config_entry *e = config_find(key);
	if (!e) {
		snprintf(why, wlen, "unknown setting '%s' (kvtrimctl config get "
		         "lists them)", key);
		return KVT_EINVAL;
	}
	if (!(e->flags & CONFIG_MUTABLE)) {
		snprintf(why, wlen, "%s cannot change while kvtrimd runs: set it "
		         "in the config file and restart", key);
		return KVT_ENOTSUP;
	}
	if (!s->cfg.acl_from_socket && (!strncmp(key, "allow_", 6) ||
	                                !strncmp(key, "admin_", 6))) {
		snprintf(why, wlen, "%s can change only in the config file "
		         "(then SIGHUP); acl_from_socket = 1 allows it here", key);
		return KVT_EPERM;
	}
	struct config next = s->cfg;
	if ((rv = config_set(&next, key, val, why, wlen)) ||
	    (rv = config_validate(&next, why, wlen)))
		return rv;
	if (!srv_rows(rep, 1))
		return KVT_ENOMEM;
	s->cfg = next;
	srv_config_changed(s);
	s->st.config_sets_total++;
	srv_config_row(s, e, &rep->table.rows[0]);
	LOG(LOG_LVL_NOTICE, "config set %s = %s", key,
	    rep->table.rows[0].vals[1].v.s);
	return 0;
}

/*
 * Does tenant st answer to `who`?  All digits: the tenant id in decimal;
 * anything else: the name.  Names never start with a digit
 * (tenant_name_check), so the two never collide.
 */
static int srv_tenant_is(const struct srv_tenant *st, const char *who)
{
	size_t n = strspn(who, "0123456789");
	if (n && !who[n]) {
		errno = 0;
		unsigned long long id = strtoull(who, NULL, 10);
		return errno == 0 && id == st->id;
	}
	return !strcmp(tenant_name(st->t), who);
}

/* kvtrimctl drain: every tenant matching stops (or resumes) admitting new
 * sequences; its open sequences are untouched. */
static int srv_drain_tenant(struct server *s, const struct ipc_req *r,
                            const struct srv_pipe *pipe,
                            struct ipc_rep *rep, char *why, size_t wlen)
{
	const char *who = r->u.drain.tenant;
	uint32_t n = 0;
	int rv = srv_pipe_admin(s, pipe, "drain", why, wlen);
	if (rv)
		return rv;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		n += s->tenants[i] && srv_tenant_is(s->tenants[i], who);
	if (!n) {
		snprintf(why, wlen, "no tenant %s '%s' (kvtrimctl tenants "
		         "lists them)",
		         who[0] && !who[strspn(who, "0123456789")] ? "with id"
		                                                    : "named",
		         who);
		return KVT_ENOTENANT;
	}
	if (!srv_rows(rep, n))
		return KVT_ENOMEM;
	n = 0;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st || !srv_tenant_is(st, who))
			continue;
		st->draining = !r->u.drain.undo;
		struct ipc_row *row = &rep->table.rows[n++];
		codec_row_u64(row, "id", st->id);
		codec_row_str(row, "name", tenant_name(st->t));
		codec_row_u64(row, "draining", (uint64_t)st->draining);
		LOG(LOG_LVL_NOTICE, "tenant %" PRIu32 " '%s' %s", st->id,
		    tenant_name(st->t), st->draining ?
		    "draining: no new sequences" : "admits new sequences again");
	}
	return 0;
}

int srv_admin(struct server *s, const struct ipc_req *r,
              const struct srv_pipe *pipe, struct ipc_rep *rep, char *why,
              size_t wlen)
{
	uint32_t n = 0;
	struct stats_snap *snap;
	switch (r->op) {
	case IPC_OP_STATS:
	case IPC_OP_TENANTS:
		if (!(snap = srv_snapshot(s)))
			return KVT_ENOMEM;
		n = r->op == IPC_OP_STATS ? 1 : snap->n_tenant_list;
		if (!srv_rows(rep, n)) {
			stats_snap_free(snap);
			return KVT_ENOMEM;
		}
		if (r->op == IPC_OP_STATS)
			stats_fill_row(snap, &rep->table.rows[0]);
		else
			for (uint32_t i = 0; i < n; i++)
				stats_fill_tenant_row(&snap->tenant_list[i],
				                      &rep->table.rows[i]);
		stats_snap_free(snap);
		return 0;
	case IPC_OP_CHECK:
		if (s->n_jobs)
			return SRV_IDLE_WAIT; /* a tenant is mid-sync */
		if (!srv_rows(rep, 1))
			return KVT_ENOMEM;
		srv_check(s, &rep->table.rows[0]);
		return 0;
	case IPC_OP_POLICIES:
		if (!srv_rows(rep, (uint32_t)policy_count()))
			return KVT_ENOMEM;
		for (size_t i = 0; i < policy_count(); i++) {
			codec_row_str(&rep->table.rows[i], "name",
			              policy_at(i)->name);
			codec_row_str(&rep->table.rows[i], "help",
			              policy_at(i)->help);
		}
		return 0;
	case IPC_OP_CONFIG:
		for (size_t i = 0; i < config_count(); i++)
			n += !r->u.filter[0] ||
			     !strcmp(r->u.filter, config_at(i)->name);
		if (!n) {
			snprintf(why, wlen, "unknown setting '%s'", r->u.filter);
			return KVT_EINVAL;
		}
		if (!srv_rows(rep, n))
			return KVT_ENOMEM;
		n = 0;
		for (size_t i = 0; i < config_count(); i++) {
			const struct config_entry *e = config_at(i);
			if (r->u.filter[0] && strcmp(r->u.filter, e->name))
				continue;
			srv_config_row(s, e, &rep->table.rows[n++]);
		}
		return 0;
	case IPC_OP_DRAIN:
		return srv_drain_tenant(s, r, pipe, rep, why, wlen);
	case IPC_OP_CONFIG_SET:
		return srv_config_set(s, r, pipe, rep, why, wlen);
	default:
		return KVT_EUNKNOWNOP;
	}
}
