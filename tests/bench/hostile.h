/*
 * hostile.h — what hostile.c (the phases: the healthy engine, its windows,
 * the figures) and hostile_adv.c (the adversary processes) share.
 */
#ifndef KVT_BENCH_HOSTILE_H
#define KVT_BENCH_HOSTILE_H

#include "daemon.h"

/* One adversary: its name (the phase's and its figures' suffix), its
 * process body (never returns), whether the healthy engine also fetches
 * /metrics in that phase, and every how many syncs it registers and opens
 * its sequence anew (0: never), in both windows of the phase. */
struct hostile_adv {
	const char *name;
	void (*run)(const struct th_daemon *d, int quick);
	int metrics;
	int reopen_every;
};
#define HOSTILE_N_ADV 7
extern const struct hostile_adv hostile_advs[HOSTILE_N_ADV];

/* The bench's clock in ms, and a sleep of ms (nothing when <= 0). */
double hostile_now_ms(void);
void hostile_sleep_ms(double ms);

/* A connected socket of type to dir/name, or -1. */
int hostile_unix_connect(const char *dir, const char *name, int type);

/* 1 once fd is ready for events (poll), 0 at the deadline (ms, the
 * clock of hostile_now_ms) or on an error. */
int hostile_wait_fd(int fd, short events, double deadline);

/* Nonzero when the peer of fd hung up (or fd failed). */
int hostile_hung_up(int fd);

#endif
