/*
 * pace.c — the yield of pace.h: a per-thread budget in us and the time of
 * the last yield.
 */
#include "pace.h"

#include <sched.h>

#include "now.h"

_Thread_local uint32_t pace_calls;
static _Thread_local uint32_t pace_budget_us; /* 0: this thread never yields */
static _Thread_local uint64_t pace_last_us;
static _Thread_local uint64_t pace_n_yields;

void pace_start(uint32_t budget_us)
{
	pace_budget_us = budget_us;
	pace_last_us = now_us();
}

void pace_point_slow(void)
{
	if (!pace_budget_us)
		return;
	uint64_t t = now_us();
	if (t - pace_last_us < pace_budget_us)
		return;
	sched_yield();
	pace_n_yields++;
	pace_last_us = now_us();
}

uint64_t pace_yields(void)
{
	return pace_n_yields;
}
