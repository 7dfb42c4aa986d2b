/*
 * lease.c — a tenant's lease: registration at hello, lookup, the events
 * sent before a reply, and release.
 *
 * A tenant is bound to one handle-channel connection and one control
 * connection, both from the same process (peer pid checked at hello).  When either
 * closes, or the process is gone (cron), the tenant is reclaimed at once:
 * it leaves the table, its connections close and its memory goes back to
 * the pool; while one of its syncs runs on a worker (jobs.c), it is freed
 * when that sync ends.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "handle.h"
#include "server_int.h"

struct srv_tenant *srv_find_tenant(struct server *s, uint32_t id)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] && s->tenants[i]->id == id)
			return s->tenants[i];
	return NULL;
}

/* Does process pid hold a registered tenant? */
int srv_pid_has_tenant(const struct server *s, uint32_t pid)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] && s->tenants[i]->pid == pid)
			return 1;
	return 0;
}

/* The tenant's counters: live when no sync of it runs, else as of the
 * last time they were read live. */
void srv_tenant_stats(struct srv_tenant *st,
                      struct kvt_tenant_stats *out)
{
	if (!st->busy)
		tenant_stats(st->t, &st->cached);
	*out = st->cached;
}

/* Frees the tenant of st (NULL: none), then the shares it counted in
 * (its chunks are gone by then), then st. */
static void tenant_undo(struct server *s, struct srv_tenant *st)
{
	tenant_free(st->t);
	for (int k = 0; k < POOL_SHARES; k++)
		pool_account_put(&s->pool, st->acct[k]);
	free(st);
}

void srv_tenant_free(struct server *s, struct srv_tenant *st,
                     const char *why)
{
	struct kvt_tenant_stats ts;
	tenant_stats(st->t, &ts);
	LOG(LOG_LVL_NOTICE,
	    "tenant %" PRIu32 " '%s' (pid %" PRIu32 ") released: %s; "
	    "%" PRIu64 " pages, %" PRIu64 " chunks back to the pool",
	    st->id, tenant_name(st->t), st->pid, why, ts.pages_used, ts.chunks);
	tenant_undo(s, st);
}

void srv_shares_refresh(struct server *s)
{
	double share[POOL_SHARES] = {config_pool_share(&s->cfg, 0),
	                             config_pool_share(&s->cfg, 1)};
	pool_set_shares(&s->pool, share);
}

/* What sets quota_cap: a share of the pool (enum pool_share), these, */
#define CAP_MAX_QUOTA POOL_SHARES /* max_quota */
#define CAP_POOL (POOL_SHARES + 1) /* the pool itself */

/*
 * The largest quota any tenant may hold: max_quota, and what the tenants of
 * one uid and of one process may hold together (their shares of the pool);
 * *which says which sets it.
 */
static uint64_t quota_cap(const struct server *s, int *which)
{
	uint64_t cap = pool_bytes_total(&s->pool);
	*which = CAP_POOL;
	if (s->cfg.max_quota && s->cfg.max_quota < cap) {
		cap = s->cfg.max_quota;
		*which = CAP_MAX_QUOTA;
	}
	for (int k = 0; k < POOL_SHARES; k++) {
		uint64_t b = pool_share_chunks(&s->pool, (enum pool_share)k) *
		             KVT_CHUNK_BYTES;
		if (b < cap) {
			cap = b;
			*which = k;
		}
	}
	return cap;
}

/*
 * A quota asked beyond quota_cap is refused (KVT_EQUOTA, the text naming
 * the setting); the asked quota counts in whole chunks, as it is held.
 * More than the pool itself is tenant_new's refusal, with its text.
 */
static int quota_allowed(struct server *s, uint64_t asked, uint64_t *cap,
                         char *why, size_t wlen)
{
	static const char *const who[POOL_SHARES] = {"uid", "process"};
	static const char *const key[POOL_SHARES] = {"uid_pool_share",
	                                             "pid_pool_share"};
	int which;
	*cap = quota_cap(s, &which);
	if (which == CAP_POOL ||
	    asked / KVT_CHUNK_BYTES * KVT_CHUNK_BYTES <= *cap)
		return 0;
	if (which == CAP_MAX_QUOTA)
		snprintf(why, wlen, "quota of %" PRIu64 " bytes is above "
		         "max_quota (%" PRIu64 " bytes)", asked, *cap);
	else
		snprintf(why, wlen, "quota of %" PRIu64 " bytes is above what "
		         "the tenants of one %s may hold together: %s %g of "
		         "the pool, %" PRIu64 " bytes", asked, who[which],
		         key[which], config_pool_share(&s->cfg, which), *cap);
	s->st.quota_refusals_total++;
	return KVT_EQUOTA;
}

/* The uid's and process's accounts for st (KVT_ENOMEM). */
static int shares_bind(struct server *s, struct srv_tenant *st,
                       const struct srv_conn *c)
{
	st->acct[POOL_SHARE_UID] = pool_account_get(&s->pool, POOL_SHARE_UID,
	                                            c->uid);
	st->acct[POOL_SHARE_PID] = pool_account_get(&s->pool, POOL_SHARE_PID,
	                                            c->pid);
	return st->acct[POOL_SHARE_UID] && st->acct[POOL_SHARE_PID]
	               ? 0
	               : KVT_ENOMEM;
}

/*
 * Ends a tenant's lease: it leaves the table (its requests from now on get
 * ENOTENANT), its connections close, and its memory goes back to the pool
 * now, or, while one of its syncs runs on a worker, when that sync ends.
 */
void srv_reclaim(struct server *s, struct srv_tenant *st,
                 const char *why)
{
	if (st->doomed)
		return;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] == st)
			s->tenants[i] = NULL;
	srv_pipe_bind(s, st->pipe_id, 0);
	if (st->conn) {
		st->conn->st = NULL;
		srv_conn_close(st->conn);
		st->conn = NULL;
	}
	if (st->busy) {
		st->doomed = 1;
		snprintf(st->doomed_why, sizeof(st->doomed_why), "%s", why);
		return;
	}
	srv_tenant_free(s, st, why);
}

/*
 * rv from a tenant operation: when a device call failed after the change
 * was committed (tenant_failed), the tenant's K/V and table cannot be
 * trusted any more, so it is reclaimed; rv is returned either way.
 */
int srv_device_failed(struct server *s, struct srv_tenant *st, int rv,
                      const char *op)
{
	if (!tenant_failed(st->t))
		return rv;
	LOG(LOG_LVL_ERR, "tenant %" PRIu32 ": device failure during %s",
	    st->id, op);
	s->st.tenants_reclaimed_total++;
	srv_reclaim(s, st, "device failure");
	return rv;
}

/* Sends queued chunk grants before the reply; a client that cannot take
 * them loses its tenant (its lease cannot be honoured any more). */
int srv_flush(struct server *s, struct srv_tenant *st, char *why,
              size_t wlen)
{
	int rv = srv_send_events(st->conn, st->t);
	if (rv) {
		snprintf(why, wlen, "handle channel to the client failed (%s)",
		         kvt_strerror(rv));
		s->st.tenants_reclaimed_total++;
		srv_reclaim(s, st, "handle channel send failed");
		return KVT_ECONN;
	}
	return 0;
}

int srv_hello(struct server *s, const struct ipc_hello *h,
              const struct srv_pipe *pipe,
              struct ipc_rep *rep, char *why, size_t wlen)
{
	struct srv_conn *c;
	for (c = s->fdc.conns; c; c = c->next)
		if (!c->closing && c->cookie == h->cookie)
			break;
	if (!c) {
		snprintf(why, wlen, "unknown handle-channel cookie: connect to "
		         "fd.sock first and send its welcome cookie");
		return KVT_ENOTENANT;
	}
	if (c->st) {
		snprintf(why, wlen, "this handle channel already has a tenant");
		return KVT_EEXIST;
	}
	if (c->denied) {
		snprintf(why, wlen, "hello refused: uid %" PRIu32 " gid %" PRIu32
		         " is not allowed (allow_uids / allow_gids)", c->uid,
		         c->gid);
		LOG(LOG_LVL_WARNING, "%s (pid %" PRIu32 ")", why, c->pid);
		return KVT_EPERM;
	}
	if (c->refused[0]) {
		snprintf(why, wlen, "hello refused: %s", c->refused);
		return KVT_EBUSY;
	}
	if (c->barred_ms) {
		snprintf(why, wlen, "hello refused: this process (pid %" PRIu32
		         ") broke the handle-channel protocol moments ago; it "
		         "may register again in %" PRIu64 " ms", c->pid,
		         c->barred_ms);
		return KVT_EPERM;
	}
	int rv = srv_pipe_allowed(s, pipe, "hello", why, wlen);
	if (rv)
		return rv;
	uint64_t cap;
	if ((rv = quota_allowed(s, h->quota_bytes, &cap, why, wlen)))
		return rv;
	if (pipe->pid != c->pid) {
		snprintf(why, wlen, "control connection (pid %" PRIu32 ") and "
		         "handle channel (pid %" PRIu32 ") are different "
		         "processes", pipe->pid, c->pid);
		return KVT_EPERM;
	}
	uint32_t slot = s->cfg.max_tenants;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (!s->tenants[i]) {
			slot = i;
			break;
		}
	if (slot == s->cfg.max_tenants) {
		snprintf(why, wlen, "too many tenants (max_tenants %" PRIu32 ")",
		         s->cfg.max_tenants);
		return KVT_EBUSY;
	}
	struct srv_tenant *st = calloc(1, sizeof(*st));
	if (!st)
		return KVT_ENOMEM;
	if (shares_bind(s, st, c)) {
		tenant_undo(s, st);
		return KVT_ENOMEM;
	}
	/* A hello asking no quota gets default_quota (0: a fair share of the
	 * pool), never more than quota_cap; tenant_memory_max caps the daemon
	 * memory its geometry may need. */
	struct tenant_limits lim = {
		.default_quota = s->cfg.default_quota,
		.max_quota = cap,
		.expected_tenants = s->cfg.expected_tenants,
		.memory_max = s->cfg.tenant_memory_max,
		.acct = {st->acct[POOL_SHARE_UID], st->acct[POOL_SHARE_PID]},
	};
	rv = tenant_new(&s->pool, s->next_tenant_id, h, &lim, &st->t, why,
	                wlen);
	if (rv) {
		if (lim.memory_need > lim.memory_max)
			s->st.tenant_memory_refusals_total++;
		tenant_undo(s, st);
		return rv;
	}
	const struct shm_geom *g = tenant_geom(st->t);
	if ((uint64_t)g->n_layers * g->n_kv_heads > s->cfg.max_sync_lists) {
		snprintf(why, wlen, "a sequence has %" PRIu64 " page lists "
		         "(n_layers x n_kv_heads), more than one sync may touch "
		         "(max_sync_lists %" PRIu32 ")",
		         (uint64_t)g->n_layers * g->n_kv_heads,
		         s->cfg.max_sync_lists);
		tenant_undo(s, st);
		return KVT_EGEOMETRY;
	}
	/* Device tenants: the two event handles go first, so the client has
	 * them (or fails) before its segments complete the hello. */
	if (srv_send_events(c, st->t)) {
		tenant_undo(s, st);
		snprintf(why, wlen, "cannot send event handles over the handle "
		         "channel");
		return KVT_ECONN;
	}
	struct handle_msg tm = {.magic = HANDLE_MAGIC, .type = HANDLE_TABLE,
	                        .size = g->table_bytes};
	struct handle_msg sm = {.magic = HANDLE_MAGIC, .type = HANDLE_STAGE,
	                        .size = g->stage_bytes};
	if (handle_send(c->fd, &tm, tenant_table_fd(st->t)) ||
	    handle_send(c->fd, &sm, tenant_stage_fd(st->t))) {
		tenant_undo(s, st);
		snprintf(why, wlen, "cannot send segments over the handle channel");
		return KVT_ECONN;
	}
	st->id = s->next_tenant_id++;
	st->token = random_u64();
	st->pipe_id = pipe->id;
	st->pid = c->pid;
	st->conn = c;
	c->st = st;
	s->tenants[slot] = st;
	srv_pipe_bind(s, st->pipe_id, 1);
	s->st.tenants_registered_total++;

	rep->u.hello.tenant = st->id;
	rep->u.hello.token = st->token;
	rep->u.hello.max_seqs = g->max_seqs;
	rep->u.hello.max_tokens = g->max_tokens;
	rep->u.hello.headroom = g->headroom;
	rep->u.hello.stage_tokens = g->stage_tokens;
	rep->u.hello.page_tokens = g->page_tokens;
	rep->u.hello.quota_bytes = tenant_quota(st->t);
	rep->u.hello.inputs = tenant_policy_inputs(st->t);
	LOG(LOG_LVL_NOTICE,
	    "tenant %" PRIu32 " '%s' registered (pid %" PRIu32 ", policy '%s', "
	    "quota %" PRIu64 " bytes, page %" PRIu64 " bytes)",
	    st->id, tenant_name(st->t), st->pid, tenant_policy_spec(st->t),
	    tenant_quota(st->t), g->page_bytes);
	return 0;
}
