/*
 * now.h — the monotonic clock (CLOCK_MONOTONIC) in the units the code
 * counts in: deadlines and timeouts in ms, request latencies in us, the
 * scorer's time in ns.  Never goes back; unrelated to the wall clock (log
 * lines take theirs from gettimeofday).  Any thread.
 */
#ifndef KVT_NOW_H
#define KVT_NOW_H

#include <stdint.h>

uint64_t now_ms(void);
uint64_t now_us(void);
uint64_t now_ns(void);

/* The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), in ns: what a
 * piece of work cost whatever else ran beside it. */
uint64_t now_thread_cpu_ns(void);

#endif
