/*
 * pace_test.c — the workers' cooperative yield (daemon/pace.h): none on a
 * thread that never started pacing (the loop), one per budget of work on
 * one that did, the clock read only every 64 points.
 */
#include <pthread.h>

#include "now.h"
#include "pace.h"
#include "test.h"

/* Calls pace_point for ms of wall time; returns the yields it made. */
static uint64_t points_for(uint32_t ms)
{
	uint64_t y0 = pace_yields(), end = now_us() + (uint64_t)ms * 1000;
	while (now_us() < end)
		pace_point();
	return pace_yields() - y0;
}

static void *unpaced(void *arg)
{
	*(uint64_t *)arg = points_for(20);
	return NULL;
}

static void *paced(void *arg)
{
	pace_start(1000); /* 1 ms of work between yields */
	*(uint64_t *)arg = points_for(50);
	return NULL;
}

TEST(pace, a_thread_that_never_started_never_yields)
{
	uint64_t y = 99;
	pthread_t th;
	T_EQ(pthread_create(&th, NULL, unpaced, &y), 0);
	T_EQ(pthread_join(th, NULL), 0);
	T_EQ(y, 0);
}

TEST(pace, a_paced_thread_yields_once_per_budget)
{
	/* 50 ms of points at a 1 ms budget: about 50 yields.  The bounds
	 * are wide (the machine may deschedule the thread for a while, and
	 * each yield may come up to 63 points late), but 0 or one per
	 * point would fail them. */
	uint64_t y = 0;
	pthread_t th;
	T_EQ(pthread_create(&th, NULL, paced, &y), 0);
	T_EQ(pthread_join(th, NULL), 0);
	T_ASSERT(y >= 5);
	T_ASSERT(y <= 60);
}
