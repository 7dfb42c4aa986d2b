/*
 * jobs.c — syncs offloaded to libuv's worker threads (srv_sync_offload
 * says which), one at a time per tenant, several tenants at once.
 *
 * While its job runs the tenant is the worker's alone (st->busy): the loop keeps the tenant's other requests in order in
 * its wait queue, stops reading its handle channel, and reads its counters
 * from st->cached; a tenant released meanwhile is freed when the job ends.
 * srv_sync_finish is what follows every sync's apply, inline ones too.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pace.h"
#include "server_int.h"

#define SRV_INLINE_LISTS 4096 /* a sync touching more runs on a worker */
#define SRV_WORKER_NICE 10    /* workers' priority below the loop's */

/* A sync running on a libuv worker thread for one tenant. */
struct srv_job {
	uv_work_t work;
	struct server *s;
	struct srv_tenant *st;
	struct srv_req *r;
	int parked;          /* r is a backpressure retry */
	struct ipc_req req;  /* the decoded sync, owned by the job */
	int rv;
	char why[KVT_ERRTEXT_MAX];
	struct kvt_tenant_stats before, after;
	uint64_t apply_us, scorer_ns;
};

/*
 * Where a sync runs.  The loop serves everyone, so a tenant whose syncs
 * are expensive (their moving average above sync_offload_us, or this one
 * touching many lists) runs them on libuv's worker threads, one at a time
 * per tenant, several tenants at once (UV_THREADPOOL_SIZE, default 4);
 * cheap ones stay on the loop, where they cost no thread hand-off.
 */
int srv_sync_offload(const struct server *s,
                     const struct srv_tenant *st, uint64_t lists)
{
	return !s->cfg.sync_offload_us || st->sync_us > s->cfg.sync_offload_us ||
	       lists > SRV_INLINE_LISTS;
}

/*
 * What follows a sync's apply, on the loop, wherever it ran: the counters,
 * the tenant's moving average, the chunk grants it queued (before the
 * reply), or the drop of a tenant whose device failed.
 */
int srv_sync_finish(struct server *s, struct srv_tenant *st, int rv,
                    uint32_t items,
                    const struct kvt_tenant_stats *before,
                    const struct kvt_tenant_stats *after,
                    uint64_t apply_us, uint64_t scorer_ns, char *why,
                    size_t wlen)
{
	st->sync_us = (3 * st->sync_us + apply_us) / 4;
	s->st.sync_cpu_ns_total += tenant_sync_cpu_ns(st->t);
	if (rv && tenant_failed(st->t)) {
		LOG(LOG_LVL_ERR, "tenant %" PRIu32 ": %s", st->id, why);
		return srv_device_failed(s, st, rv, "sync");
	}
	if (rv)
		return rv;
	stats_observe(&s->st.sync_apply_seconds, (double)apply_us / 1e6);
	stats_observe(&s->st.scorer_seconds, (double)scorer_ns / 1e9);
	s->st.syncs_total++;
	s->st.sync_items_total += items;
	s->st.entries_appended_total +=
		after->entries_appended - before->entries_appended;
	s->st.entries_evicted_total +=
		after->entries_evicted - before->entries_evicted;
	return srv_flush(s, st, why, wlen);
}

/*
 * Worker thread: the tenant is this job's alone (st->busy).  Workers run
 * at a lower priority than the loop (nice SRV_WORKER_NICE): where cores are
 * short, a heavy tenant's syncs take the cycles the loop leaves, not the
 * other way round.  Priority alone does not preempt a busy worker before
 * the scheduler's tick, so they also yield every PACE_US of work (pace.h).
 */
static void srv_job_run(uv_work_t *w)
{
	static _Thread_local int niced;
	if (!niced) {
		niced = 1;
		setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid),
		            SRV_WORKER_NICE);
		pace_start(PACE_US);
	}
	struct srv_job *j = w->data;
	struct tenant *t = j->st->t;
	tenant_stats(t, &j->before);
	uint64_t t0 = now_us();
	j->rv = tenant_sync(t, j->req.u.sync.no, j->req.u.sync.items,
	                    j->req.u.sync.n, j->why, sizeof(j->why));
	j->apply_us = now_us() - t0;
	j->scorer_ns = tenant_scorer_ns(t);
	tenant_stats(t, &j->after);
}

static void srv_job_done(uv_work_t *w, int status);

/* Hands the sync r (decoded in req, whose items the job takes) to a
 * worker; nonzero when it cannot (it then runs on the loop). */
int srv_job_start(struct server *s, struct srv_tenant *st,
                  struct srv_req *rq, int parked, struct ipc_req *req)
{
	struct srv_job *j = calloc(1, sizeof(*j));
	if (!j)
		return -1;
	j->s = s;
	j->st = st;
	j->r = rq;
	j->parked = parked;
	j->req = *req;
	j->work.data = j;
	tenant_stats(st->t, &st->cached);
	/* a worker may wait for other tenants' syncs to share its scorer run
	 * (the loop never does: srv_handle sets 0 for its own) */
	tenant_set_gather(st->t, s->cfg.scorer_gather_us);
	if (uv_queue_work(&s->loop, &j->work, srv_job_run, srv_job_done)) {
		free(j);
		return -1;
	}
	req->u.sync.items = NULL; /* the job's now */
	req->u.sync.n = 0;
	st->busy = 1;
	s->n_jobs++;
	s->st.syncs_offloaded_total++;
	return 0;
}

/*
 * A sync job ended (loop thread): its tenant is the loop's again; the
 * reply goes out (or the request parks under pressure), then the requests
 * that waited for the tenant are handled, in order.  A tenant released
 * meanwhile is freed now and its requests get ENOTENANT.
 */
static void srv_job_done(uv_work_t *w, int status)
{
	struct srv_job *j = w->data;
	struct server *s = j->s;
	struct srv_tenant *st = j->st;
	struct srv_req *r = j->r, *waiting = st->wait_head;
	int rv = j->rv;
	uint32_t items = j->req.u.sync.n;
	st->wait_head = st->wait_tail = NULL;
	st->busy = 0;
	st->cached = j->after;
	if (st->conn && !st->conn->closing)
		srv_conn_resume(st->conn);
	s->n_jobs--;
	codec_req_free(&j->req);
	if (st->doomed) {
		snprintf(j->why, sizeof(j->why), "tenant %" PRIu32 " was "
		         "released while this sync ran (%s)", st->id,
		         st->doomed_why);
		rv = KVT_ENOTENANT;
		srv_tenant_free(s, st, st->doomed_why);
	} else {
		rv = srv_sync_finish(s, st, rv, items, &j->before, &j->after,
		                     j->apply_us, j->scorer_ns, j->why,
		                     sizeof(j->why));
		/* (st is gone if that dropped the tenant.) */
	}
	struct ipc_rep rep;
	memset(&rep, 0, sizeof(rep));
	rep.version = IPC_PROTO_VERSION;
	if (!rv)
		tenant_sync_reply(st->t, &rep);
	enum srv_verdict v = srv_conclude(s, r, IPC_OP_SYNC, rv, &rep, j->why,
	                                  sizeof(j->why), j->parked);
	free(j);
	if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
		/* ctl.ipc is closed: nothing can be sent any more. */
		free(r->msg);
		r->msg = NULL;
		for (struct srv_req *q = waiting; q; q = q->next) {
			free(q->msg);
			q->msg = NULL;
		}
		return;
	}
	srv_proceed(s, r, v);
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i] && s->tenants[i]->reload_pending &&
		    !s->tenants[i]->busy)
			srv_reload_one(s, s->tenants[i]);
	while (waiting) {
		struct srv_req *q = waiting;
		waiting = q->next;
		srv_proceed(s, q, srv_handle(s, q, q->held_parked));
	}
	if (s->n_parked)
		srv_retry_parked(s); /* check waits; pages freed */
}
