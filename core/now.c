/* now.c — the monotonic clock in ms, us and ns; see now.h. */
#include "now.h"

#include <time.h>

uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t now_thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t now_us(void)
{
	return now_ns() / 1000u;
}

uint64_t now_ms(void)
{
	return now_ns() / 1000000u;
}
