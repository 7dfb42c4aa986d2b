/*
 * test_stats.c — the stats socket: GET /metrics (Prometheus text, checked
 * line by line for the exposition format), GET /stats (JSON), the refusals
 * of other paths and methods, the optional TCP listener, and the fields
 * that `kvtrimctl stats` / `tenants`, /metrics and /stats all show.  Every
 * test starts the real daemon on a scratch runtime directory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "kvtrim.h"
#include "stats.h"
#include "test.h"

/* ---------------------------------------------------------------- stats */

/* Checks the exposition format: HELP/TYPE once per family and before its
 * samples, kvtrim_ prefix, counters ending in _total, numeric values,
 * cumulative histogram buckets ending in +Inf == _count. */
static void check_exposition(const char *body)
{
	char fam[256][96], type[256][16];
	int nf = 0;
	const char *line = body;
	uint64_t last_bucket = 0;
	while (*line) {
		const char *nl = strchr(line, '\n');
		T_ASSERT(nl); /* every line ends with a newline */
		char l[1024];
		size_t n = (size_t)(nl - line);
		T_ASSERT(n < sizeof(l));
		memcpy(l, line, n);
		l[n] = '\0';
		line = nl + 1;
		char name[96], t[16];
		if (sscanf(l, "# TYPE %95s %15s", name, t) == 2) {
			for (int i = 0; i < nf; i++)
				if (!strcmp(fam[i], name))
					th_fail(__FILE__, __LINE__,
					        "family %s typed twice", name);
			T_ASSERT(nf < 256);
			snprintf(fam[nf], sizeof(fam[nf]), "%s", name);
			snprintf(type[nf++], sizeof(type[0]), "%s", t);
			if (!strcmp(t, "counter") &&
			    (strlen(name) < 6 ||
			     strcmp(name + strlen(name) - 6, "_total")))
				th_fail(__FILE__, __LINE__,
				        "counter %s lacks _total", name);
			continue;
		}
		if (l[0] == '#') {
			T_ASSERT(!strncmp(l, "# HELP kvtrim_", 14));
			continue;
		}
		/* A sample: name[{labels}] value */
		T_ASSERT(!strncmp(l, "kvtrim_", 7));
		size_t nl_ = strcspn(l, "{ ");
		T_ASSERT(nl_ < sizeof(name));
		memcpy(name, l, nl_);
		name[nl_] = '\0';
		const char *val = strrchr(l, ' ');
		T_ASSERT(val);
		char *end;
		double v = strtod(val + 1, &end);
		if (*end)
			th_fail(__FILE__, __LINE__, "bad value in '%s'", l);
		/* Its family must be declared before, with the same type. */
		int found = -1;
		for (int i = nf - 1; i >= 0 && found < 0; i--) {
			size_t fl = strlen(fam[i]);
			if (!strcmp(fam[i], name))
				found = i;
			else if (!strcmp(type[i], "histogram") &&
			         !strncmp(name, fam[i], fl) &&
			         (!strcmp(name + fl, "_bucket") ||
			          !strcmp(name + fl, "_sum") ||
			          !strcmp(name + fl, "_count")))
				found = i;
		}
		if (found < 0)
			th_fail(__FILE__, __LINE__, "sample before its TYPE: %s", l);
		if (strstr(name, "_bucket")) {
			T_ASSERT((uint64_t)v >= last_bucket);
			last_bucket = strstr(l, "le=\"+Inf\"") ? 0 : (uint64_t)v;
		}
	}
	T_ASSERT(nf > 20);
}

TEST(stats, metrics_over_the_unix_socket)
{
	struct th_daemon d;
	static char body[1 << 18];
	char err[KVT_ERRTEXT_MAX], series[256];
	kvt_client *c;
	kvt_seq seq;
	th_daemon_start(&d, "64M", NULL);

	T_EQ(th_http(&d, NULL, "/metrics", body, sizeof(body)), 200);
	check_exposition(body);
	T_ASSERT(strstr(body, "# TYPE kvtrim_pool_bytes_used gauge\n"));
	T_ASSERT(strstr(body, "\nkvtrim_pool_bytes_used 0\n"));
	T_ASSERT(strstr(body, "\nkvtrim_pool_bytes_free 67108864\n"));
	T_ASSERT(strstr(body, "kvtrim_pool_chunks_capacity 32\n"));
	T_ASSERT(strstr(body, "# TYPE kvtrim_errors_ESTALE_total counter\n"));
	T_ASSERT(strstr(body, "\nkvtrim_errors_ESTALE_total 0\n"));
	T_ASSERT(strstr(body, "# TYPE kvtrim_sync_latency_seconds histogram\n"));
	T_ASSERT(strstr(body, "kvtrim_sync_latency_seconds_bucket{le=\"+Inf\"} 0\n"));
	T_ASSERT(strstr(body, "# TYPE kvtrim_scorer_seconds histogram\n"));
	T_EQ(th_metric(&d, "kvtrim_clients_connected"), 0);

	/* One tenant, one sequence, five syncs, one refused hello. */
	struct kvt_config cfg = th_small_cfg(&d, "svc-a", "streaming:tokens=8");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	for (int i = 0; i < 5; i++) {
		struct kvt_sync_item it = {seq, 2, KVT_PHASE_DECODE, 0, 0};
		T_OK(kvt_sync(c, &it, 1));
	}
	kvt_client *bad;
	struct kvt_config bcfg = th_small_cfg(&d, "svc-bad", "no-such-policy");
	T_ERR(kvt_connect(&bcfg, &bad, err), KVT_EPOLICY);
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));

	/* Fresh on request: no waiting for a cron tick. */
	T_EQ(th_metric(&d, "kvtrim_pool_bytes_used"), 2 << 20);
	T_EQ(th_metric(&d, "kvtrim_pool_chunks_used"), 1);
	T_EQ(th_metric(&d, "kvtrim_tenants"), 1);
	T_EQ(th_metric(&d, "kvtrim_clients_connected"), 1);
	T_EQ(th_metric(&d, "kvtrim_syncs_total"), 5);
	T_EQ(th_metric(&d, "kvtrim_sync_latency_seconds_count"), 5);
	T_EQ(th_metric(&d, "kvtrim_sync_latency_seconds_bucket{le=\"+Inf\"}"),
	     5);
	T_EQ(th_metric(&d, "kvtrim_scorer_seconds_count"), 5);
	T_ASSERT(th_metric(&d, "kvtrim_sync_latency_seconds_sum") > 0);
	T_EQ(th_metric(&d, "kvtrim_errors_EPOLICY_total"), 1);
	T_EQ(th_metric(&d, "kvtrim_error_replies_total"), 1);
	const char *lab = "{tenant=\"svc-a\",id=\"1\"}";
	snprintf(series, sizeof(series), "kvtrim_tenant_pages_used%s", lab);
	T_EQ(th_metric(&d, series), (double)ts.pages_used);
	snprintf(series, sizeof(series), "kvtrim_tenant_sequences%s", lab);
	T_EQ(th_metric(&d, series), 1);
	snprintf(series, sizeof(series), "kvtrim_tenant_entries_kept%s", lab);
	T_EQ(th_metric(&d, series), (double)ts.entries_kept);
	snprintf(series, sizeof(series),
	         "kvtrim_tenant_entries_evicted_total%s", lab);
	T_EQ(th_metric(&d, series), (double)ts.entries_evicted);
	/* No quota asked: the fair share, 64M / expected_tenants 4. */
	snprintf(series, sizeof(series), "kvtrim_tenant_quota_bytes%s", lab);
	T_EQ(th_metric(&d, series), 16 << 20);
	/* 10 appended per list, 8 kept: ratio 10 / 8. */
	snprintf(series, sizeof(series), "kvtrim_tenant_compression_ratio%s",
	         lab);
	T_EQ(ts.entries_appended, 40);
	T_ASSERT(th_metric(&d, series) == 40.0 / (40.0 - ts.entries_evicted));
	T_EQ(th_http(&d, NULL, "/metrics", body, sizeof(body)), 200);
	check_exposition(body);

	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
	struct stat st;
	char path[600];
	snprintf(path, sizeof(path), "%s/stats.sock", d.dir);
	T_ASSERT(stat(path, &st) != 0); /* removed at exit */
}

TEST(stats, json_404_405_and_socket_mode)
{
	struct th_daemon d;
	static char body[1 << 18];
	char path[600];
	struct stat st;
	th_daemon_start(&d, "32M", NULL);
	snprintf(path, sizeof(path), "%s/stats.sock", d.dir);
	T_EQ(stat(path, &st), 0);
	T_ASSERT(S_ISSOCK(st.st_mode));
	T_EQ(st.st_mode & 0777, 0660);

	T_EQ(th_http(&d, NULL, "/stats", body, sizeof(body)), 200);
	T_ASSERT(body[0] == '{');
	T_ASSERT(strstr(body, "\"pool_size_bytes\":33554432"));
	T_ASSERT(strstr(body, "\"tenant_list\":[]"));
	T_ASSERT(strstr(body, ",\"errors_EINVAL_total\":0,"));
	T_ASSERT(strstr(body, "\"sync_latency_seconds\":{\"buckets\":[["));
	T_EQ(th_http(&d, NULL, "/nope", body, sizeof(body)), 404);
	T_ASSERT(strstr(body, "/metrics"));
	T_EQ(th_http(&d, NULL, "/", body, sizeof(body)), 404);
	T_EQ(th_http(&d, "POST", "/metrics", body, sizeof(body)), 405);
	T_EQ(th_http(&d, "DELETE", "/stats", body, sizeof(body)), 405);
	/* Still serving after the refusals. */
	T_EQ(th_http(&d, NULL, "/metrics", body, sizeof(body)), 200);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(stats, fields_are_defined_once_and_shown_everywhere)
{
	struct th_daemon d;
	static char body[1 << 18], ctl[1 << 16];
	char want[160];
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "32M", NULL);

	/* kvtrimctl stats: exactly the generated keys (no error yet). */
	T_EQ(th_sh(&d, ctl, sizeof(ctl), "%s stats", th_bin("kvtrimctl")), 0);
	int lines = 0;
	for (const char *p = ctl; *p; p++)
		lines += *p == '\n';
	int expect = 2; /* version, backend */
#define COUNT_(name, help) expect++;
	STATS_GAUGES(COUNT_) STATS_FGAUGES(COUNT_) STATS_COUNTERS(COUNT_)
#undef COUNT_
#define COUNT2_(name, help) expect += 2;
	STATS_HISTOGRAMS(COUNT2_)
#undef COUNT2_
	T_EQ(lines, expect);

	T_EQ(th_http(&d, NULL, "/metrics", body, sizeof(body)), 200);
	static char json[1 << 18];
	T_EQ(th_http(&d, NULL, "/stats", json, sizeof(json)), 200);
#define CHECK_(name, help)                                                     \
	snprintf(want, sizeof(want), "\n" #name " ");                          \
	T_ASSERT(strstr(ctl, want));                                           \
	snprintf(want, sizeof(want), "\"" #name "\":");                        \
	T_ASSERT(strstr(json, want));                                          \
	snprintf(want, sizeof(want), "\nkvtrim_" #name " ");                   \
	T_ASSERT(strstr(body, want));
	STATS_GAUGES(CHECK_) STATS_FGAUGES(CHECK_) STATS_COUNTERS(CHECK_)
#undef CHECK_

	/* Per-tenant fields: in `tenants`, /stats and /metrics. */
	struct kvt_config cfg = th_small_cfg(&d, "fields", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	T_EQ(th_sh(&d, ctl, sizeof(ctl), "%s --json tenants",
	           th_bin("kvtrimctl")), 0);
	T_EQ(th_http(&d, NULL, "/metrics", body, sizeof(body)), 200);
	T_EQ(th_http(&d, NULL, "/stats", json, sizeof(json)), 200);
#define TCHECK_(field, kind, name, help)                                       \
	snprintf(want, sizeof(want), "\"" name "\":");                         \
	T_ASSERT(strstr(ctl, want));                                           \
	T_ASSERT(strstr(json, want));                                          \
	snprintf(want, sizeof(want),                                           \
	         "\nkvtrim_tenant_" name "{tenant=\"fields\",id=\"1\"} ");  \
	T_ASSERT(strstr(body, want));
	STATS_TENANT_U64(TCHECK_) STATS_TENANT_F64(TCHECK_)
#undef TCHECK_
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(stats, optional_tcp_listener_on_loopback)
{
	struct th_daemon d;
	char port[16], out[1 << 16];
	snprintf(port, sizeof(port), "%d", 20000 + (int)(getpid() % 20000));
	const char *extra[] = {"--stats-tcp-port", port, NULL};
	th_daemon_start(&d, "16M", extra);
	int rc = th_sh(NULL, out, sizeof(out),
	               "curl -s -m 5 -w '\\n%%{http_code}' "
	               "http://127.0.0.1:%s/metrics", port);
	T_EQ(rc, 0);
	T_ASSERT(strstr(out, "kvtrim_pool_size_bytes 16777216\n"));
	T_ASSERT(strstr(out, "\n200"));
	T_EQ(th_daemon_stop(&d), 0);
	/* Off by default: the default config has no TCP port. */
	struct config def;
	config_defaults(&def);
	T_EQ(def.stats_tcp_port, 0);
}
