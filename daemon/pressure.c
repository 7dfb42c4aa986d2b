/*
 * pressure.c — memory pressure, and the requests parked for pool pages.
 *
 * In three steps: above high_watermark every tenant gets a pressure level
 * (scaled by its priority, tenant_set_pressure) that shrinks its policy's
 * budgets at its next sync; a seq_open or sync that still finds the pool
 * full is parked (its request simply is not answered yet; the loop
 * goes on) and retried as pages come free; after pressure_deadline_ms it
 * is refused with KVT_EPOOLFULL (the decision is srv_conclude's,
 * dispatch.c).  Nothing is ever over-committed: the pool's capacity is
 * checked by every allocation.  Requests waiting for a tenant's GPU writes
 * or for idle syncs park here too, without a deadline.
 */
#include <math.h>

#include "server_int.h"

/*
 * Pool use above high_watermark becomes a pool-wide level in (0, 1],
 * rising linearly to 1 at a full pool.  Each tenant gets that level scaled
 * by (lowest priority present / its priority): the least important tenants
 * are tightened fully, more important ones proportionally less.
 */
void srv_pressure(struct server *s)
{
	double use = s->pool.chunk_capacity
	                     ? (double)pool_chunks_used(&s->pool) /
	                               (double)s->pool.chunk_capacity
	                     : 0;
	double hw = s->cfg.high_watermark;
	double level = 0;
	if (use > hw)
		level = hw < 1 ? (use - hw) / (1 - hw) : 1;
	if (level > 1)
		level = 1;
	s->pressure = (float)level;

	uint32_t min_prio = UINT32_MAX;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i]) {
			uint32_t p = config_priority(
				&s->cfg, tenant_name(s->tenants[i]->t));
			if (p < min_prio)
				min_prio = p;
		}
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (!st || st->busy)
			continue; /* mid-sync: next tick */
		float p = (float)(level * min_prio /
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
