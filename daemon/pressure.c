/*
 * pressure.c — memory pressure, and the requests parked for pool pages.
 *
 * In three steps: above high_watermark (of the pool, or of a uid's or a
 * process's share of it) tenants get a pressure level (uids above their fair share first,
 * scaled by priority, tenant_set_pressure) that shrinks their policies'
 * budgets at their next sync; a seq_open or sync that still finds the pool
 * full is parked (its request simply is not answered yet; the loop
 * goes on) and retried as pages come free; after pressure_deadline_ms it
 * is refused with KVT_EPOOLFULL (the decision is srv_conclude's,
 * dispatch.c).  Nothing is ever over-committed: the pool's capacity is
 * checked by every allocation.  Requests waiting for a tenant's GPU writes
 * or for idle syncs park here too, without a deadline.
 */
#include <math.h>

#include "server_int.h"

/* Use (0..1 of what may be held) above high_watermark hw as a level in
 * [0, 1], rising linearly to 1 when all of it is held. */
static double level_of(double use, double hw)
{
	double level = 0;
	if (use > hw)
		level = hw < 1 ? (use - hw) / (1 - hw) : 1;
	return level > 1 ? 1 : level;
}

/* Does some uid hold more than fair chunks? */
static int some_uid_above(const struct pool *p, uint64_t fair)
{
	for (const struct pool_account *a = p->accounts; a; a = a->next)
		if (a->kind == POOL_SHARE_UID && a->refs &&
		    pool_account_chunks(a) > fair)
			return 1;
	return 0;
}

/* The larger level of st's uid's and process's use of their shares. */
static double share_level(const struct server *s, const struct srv_tenant *st,
                          double hw)
{
	double l = 0;
	for (int k = 0; k < POOL_SHARES; k++) {
		double cap = (double)pool_share_chunks(&s->pool,
		                                       (enum pool_share)k);
		double lk = level_of(
			(double)pool_account_chunks(st->acct[k]) / cap, hw);
		if (lk > l)
			l = lk;
	}
	return l;
}

/* The lowest priority of the registered tenants. */
static uint32_t min_priority(const struct server *s)
{
	uint32_t min_prio = UINT32_MAX;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i]) {
			uint32_t p = config_priority(
				&s->cfg, tenant_name(s->tenants[i]->t));
			if (p < min_prio)
				min_prio = p;
		}
	return min_prio;
}

/*
 * Levels, each rising linearly above high_watermark to 1 when full: the
 * pool's use, and a uid's (process's) use of its own share
 * (uid_pool_share, pid_pool_share), which tightens a uid that nears its
 * share before the pool is anywhere near full.  The pool's level reaches first the uids holding more than a fair
 * share (the pool over the uids with tenants): while one does, the others
 * are spared it.  A tenant gets the larger of the levels that reach it,
 * scaled by (lowest priority present / its priority): the least important
 * tenants are tightened fully, more important ones proportionally less.
 */
void srv_pressure(struct server *s)
{
	uint64_t cap = s->pool.chunk_capacity;
	double hw = s->cfg.high_watermark;
	double level =
		cap ? level_of((double)pool_chunks_used(&s->pool) / (double)cap,
		               hw)
		    : 0;
	s->pressure = (float)level;

	uint32_t uids = pool_accounts(&s->pool, POOL_SHARE_UID);
	uint64_t fair = uids ? cap / uids : cap;
	int hog = some_uid_above(&s->pool, fair);
	uint32_t min_prio = min_priority(s);
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st || st->busy)
			continue; /* mid-sync: next tick */
		uint64_t held = pool_account_chunks(st->acct[POOL_SHARE_UID]);
		double l = hog && held <= fair ? 0 : level;
		double ls = share_level(s, st, hw);
		if (ls > l)
			l = ls;
		float p = (float)(l * min_prio /
		                  config_priority(&s->cfg, tenant_name(st->t)));
		float cur = tenant_pressure(st->t);
		/* Hysteresis: policies re-plan on every change, so small
		 * wobbles of the pool are not passed on. */
		if (p == cur || (p > 0 && fabsf(p - cur) < 0.02f))
			continue;
		if (p > cur)
			s->st.pressure_tightenings_total++;
		tenant_set_pressure(st->t, p);
	}
}

/* Parked requests: s->parked_*, oldest first; retried from the cron, on
 * every wake-up that may have freed pages, and when a sync job ends. */
void srv_park(struct server *s, struct srv_req *r)
{
	r->next = NULL;
	if (s->parked_tail)
		s->parked_tail->next = r;
	else
		s->parked_head = r;
	s->parked_tail = r;
	s->n_parked++;
}

/* Retries every parked request once, oldest first. */
void srv_retry_parked(struct server *s)
{
	struct srv_req *list = s->parked_head;
	s->parked_head = s->parked_tail = NULL;
	s->n_parked = 0;
	while (list) {
		struct srv_req *r = list;
		list = r->next;
		srv_proceed(s, r, srv_handle(s, r, !r->dev_wait));
	}
}
