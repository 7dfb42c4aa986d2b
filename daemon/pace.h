/*
 * pace.h — cooperative yielding for the long work of kvtrimd's sync
 * workers (daemon/jobs.c).
 *
 * Why: a worker applying a heavy tenant's sync keeps a core busy for up
 * to hundreds of ms.  On this kernel class (EEVDF, preempt=none, HZ 250)
 * a thread woken on that core (the loop, nng's threads, another tenant's
 * engine) waits for the next tick, about 4 ms, even when the worker runs
 * at nice 10: that was the whole of the healthy tenant's p99 beside the
 * largest tenant (kvtrim-bench, hostile_*_largest_tenant).  A worker that
 * yields every PACE_US of work hands the core to whoever waits for it
 * within that bound, and takes it back at once when nobody does.
 *
 * pace_point() is called at the work's natural boundaries (per list and
 * per layer in tenant_sync); it does nothing on threads that never
 * called pace_start() (the loop runs cheap syncs inline and must not
 * yield).  Per thread, no locks.
 */
#ifndef KVT_PACE_H
#define KVT_PACE_H

#include <stdint.h>

/* Work between two yields, at most (plus one list).  A thread woken on
 * the worker's core waits about this long, which bounds what the largest
 * tenant adds to another's sync (kvtrim-bench largest_tenant: p99 about
 * 0.85 ms at 500 us, 0.3 ms at 100 us); a yield with nobody waiting costs
 * about a microsecond, and the worker's own round took as long at both. */
#define PACE_US 100u

/* This thread yields every budget_us of work from now on. */
void pace_start(uint32_t budget_us);

void pace_point_slow(void);

/* Yields this thread made so far (for tests and diagnosis). */
uint64_t pace_yields(void);

/* A boundary of the work: yields when this thread's budget is spent.
 * Reads the clock once every 64 calls. */
static inline void pace_point(void)
{
	extern _Thread_local uint32_t pace_calls;
	if (!(++pace_calls & 63u))
		pace_point_slow();
}

#endif
