/*
 * service_fixture.h — what the service tests (tests/integration/
 * test_service*.c) share: clocks, the big-page configuration (one 2 MiB
 * chunk holds two sequences), polling a metric, reading the daemon's log,
 * writing a file.  Header-only (static inline), so no helper name leaves a
 * test file.
 */
#ifndef KVT_SERVICE_FIXTURE_H
#define KVT_SERVICE_FIXTURE_H

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "kvtrim.h"
#include "test.h"
static inline void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static inline double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Pages of 256 KiB ([K 256 x 128][V 256 x 128] f32): 8 per 2 MiB chunk.
 * A sequence has 2 layers x 2 KV heads = 4 lists of one page each (the
 * headroom of 256 entries), so one chunk holds exactly two sequences.
 */
static inline struct kvt_config big_cfg(const struct th_daemon *d,
                                        const char *name)
{
	struct kvt_config c;
	memset(&c, 0, sizeof(c));
	c.runtime_dir = d->dir;
	c.tenant = name;
	c.geo = (struct kvt_geometry){2, 2, 2, 128, 256};
	c.dtype = KVT_DTYPE_F32;
	c.page_tokens = 256;
	c.max_seqs = 8;
	c.max_tokens = 1024;
	c.headroom = 256;
	c.policy = "full";
	c.timeout_ms = 5000;
	return c;
}

/* Polls a metric until it reaches want (at most ms); returns the last. */
static inline double wait_metric(const struct th_daemon *d, const char *series,
                                 double want, int ms)
{
	double v = -1;
	for (int waited = 0; waited <= ms; waited += 50) {
		v = th_metric_or(d, series);
		if (v >= want)
			return v;
		sleep_ms(50);
	}
	return v;
}

static inline int log_has(const struct th_daemon *d, const char *text)
{
	char out[1 << 16];
	th_sh(NULL, out, sizeof(out), "cat %s", d->log);
	return strstr(out, text) != NULL;
}

static inline void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fputs(text, f);
	T_ASSERT(fclose(f) == 0);
}

#endif
