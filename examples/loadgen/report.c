/*
 * report.c — what the engines measure and the parent sums and prints: the
 * clock, the sync latency histogram, the reports read from the pipe and
 * the one summary line.
 */
#include "loadgen.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

double report_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

uint32_t report_lat_bucket(double us)
{
	if (!(us >= 1.0))
		return 0;
	double b = floor(log2(us) * 4.0);
	return b >= LAT_BUCKETS - 1 ? LAT_BUCKETS - 1 : (uint32_t)b;
}

/* Upper bound of bucket b in microseconds. */
static double lat_upper(uint32_t b)
{
	return exp2((b + 1) / 4.0);
}

/* The q-quantile (0..1) of a histogram in microseconds; 0 when empty. */
static double lat_quantile(const uint64_t *h, double q)
{
	uint64_t n = 0, seen = 0;
	for (uint32_t b = 0; b < LAT_BUCKETS; b++)
		n += h[b];
	if (!n)
		return 0;
	uint64_t want = (uint64_t)ceil(q * (double)n);
	if (want < 1)
		want = 1;
	for (uint32_t b = 0; b < LAT_BUCKETS; b++)
		if ((seen += h[b]) >= want)
			return lat_upper(b);
	return lat_upper(LAT_BUCKETS - 1);
}

/* Reads every report waiting in the (non-blocking) pipe into tot; got[i]
 * marks that the current generation of engine i reported. */
void report_read(int fd, const struct opts *o, const uint32_t *gens,
                 uint8_t *got, struct totals *tot)
{
	struct report r;
	ssize_t n;
	while ((n = read(fd, &r, sizeof(r))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(r) || r.client >= o->clients)
			return; /* EAGAIN: none left */
		if (r.gen == gens[r.client])
			got[r.client] = 1;
		tot->syncs += r.syncs;
		tot->appended += r.appended;
		tot->kept += r.kept;
		tot->mismatches += r.mismatches;
		tot->full_retries += r.full_retries;
		tot->pressure_evicted += r.pressure_evicted;
		if (r.memory >= 0 && tot->memory == -1)
			tot->memory = r.memory;
		else if (r.memory >= 0 && r.memory != tot->memory)
			tot->memory = -2;
		for (uint32_t b = 0; b < LAT_BUCKETS; b++)
			tot->lat[b] += r.lat[b];
	}
}

/* The summary line on stdout (scripts and tests read its key=value
 * fields). */
void report_print(const struct opts *o, const struct totals *tot,
                  uint32_t killed, uint32_t failed, uint32_t respawned,
                  double elapsed)
{
	const char *verdict = !o->verify ? "off"
	                      : (tot->mismatches || failed) ? "fail" : "ok";
	const char *memory = tot->memory == KVT_MEMORY_HOST   ? "host"
	                     : tot->memory == KVT_MEMORY_CUDA ? "cuda"
	                     : tot->memory == -2              ? "mixed"
	                                                      : "unknown";
	printf("loadgen: clients=%u seqs=%u steps=%u policy=%s syncs=%" PRIu64
	       " appended=%" PRIu64 " kept=%" PRIu64 " evicted=%" PRIu64
	       " mismatches=%" PRIu64 " verify=%s killed=%u failed=%u "
	       "elapsed_s=%.3f sync_p50_us=%.0f sync_p99_us=%.0f "
	       "sync_max_us=%.0f full_retries=%" PRIu64 " respawned=%u "
	       "pressure_evicted=%" PRIu64 " memory=%s\n",
	       o->clients, o->seqs, o->steps, o->policy, tot->syncs,
	       tot->appended, tot->kept,
	       tot->appended > tot->kept ? tot->appended - tot->kept : 0,
	       tot->mismatches, verdict, killed, failed, elapsed,
	       lat_quantile(tot->lat, 0.50), lat_quantile(tot->lat, 0.99),
	       lat_quantile(tot->lat, 1.0), tot->full_retries, respawned,
	       tot->pressure_evicted, memory);
}
