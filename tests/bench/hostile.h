/*
 * hostile.h — what hostile.c (the phases: the healthy engine, its windows,
 * the figures) and hostile_adv.c (the adversary processes) share.
 */
#ifndef KVT_BENCH_HOSTILE_H
#define KVT_BENCH_HOSTILE_H

#include "daemon.h"

/* One adversary: its name (the phase's and its figures' suffix), its
 * process body (never returns), whether the healthy engine also fetches
 * /metrics in that phase, the phase daemon's extra arguments (NULL:
 * none), how many syncs the engine runs between a disconnect and a
 * connect again in each window (0: it stays connected), and whether the
 * adversary runs as another uid (the scratch directory is then opened to
 * group root, as the sockets are). */
struct hostile_adv {
	const char *name;
	void (*run)(const struct th_daemon *d, int quick);
	int metrics;
	const char *const *daemon_args;
	int reconnect_every;
	int other_uid;
};
#define HOSTILE_N_ADV 11
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
