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

/* ------------------------------------------------ one name per figure */

/*
 * The names one output shows.  The test below reads them from the outputs
 * themselves (rows, /metrics, /stats), never from stats.h, so two names
 * for one figure fail it whichever list they come from.
 */
struct names {
	int n;
	char v[192][64];
};

static void names_add(struct names *s, const char *name, size_t len)
{
	if (s->n >= 192 || len >= sizeof(s->v[0]))
		th_fail(__FILE__, __LINE__, "too many names or one too long: "
		        "%.*s", (int)len, name);
	memcpy(s->v[s->n], name, len);
	s->v[s->n++][len] = '\0';
}

static int names_has(const struct names *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->v[i], name))
			return 1;
	return 0;
}

/* `kvtrimctl stats`: the first word of each "key value" line. */
static void names_of_kv(struct names *s, const char *text)
{
	for (const char *l = text; *l;) {
		const char *nl = strchr(l, '\n');
		names_add(s, l, strcspn(l, " \n"));
		l = nl ? nl + 1 : l + strlen(l);
	}
}

/* `kvtrimctl tenants`: the words of the table's header line. */
static void names_of_header(struct names *s, const char *text)
{
	const char *p = text;
	while (*p && *p != '\n') {
		size_t n = strcspn(p, " \n");
		names_add(s, p, n);
		p += n;
		p += strspn(p, " ");
	}
}

/*
 * The keys of a JSON text: those of the top object into top, those of the
 * objects in tenant_list (the only objects three levels deep) into
 * tenant, and those of the objects inside the top one as "parent.key"
 * into sub (a histogram's count and sum).
 */
static void names_of_json(const char *j, struct names *top,
                          struct names *sub, struct names *tenant)
{
	int depth = 0;
	char parent[64] = "";
	for (const char *p = j; *p; p++) {
		if (*p == '{' || *p == '[') {
			depth++;
			continue;
		}
		if (*p == '}' || *p == ']') {
			depth--;
			continue;
		}
		if (*p != '"')
			continue;
		const char *s = ++p;
		while (*p && *p != '"')
			p += *p == '\\' && p[1] ? 2 : 1;
		T_ASSERT(*p == '"');
		if (p[1] != ':')
			continue; /* a value */
		size_t n = (size_t)(p - s);
		if (depth == 1) {
			names_add(top, s, n);
			snprintf(parent, sizeof(parent), "%.*s", (int)n, s);
		} else if (depth == 2) {
			char k[128];
			snprintf(k, sizeof(k), "%s.%.*s", parent, (int)n, s);
			names_add(sub, k, strlen(k));
		} else if (depth == 3) {
			names_add(tenant, s, n);
		}
	}
	T_EQ(depth, 0);
}

/* /metrics: the names of the # TYPE lines (types[i] the type of
 * fam->v[i]) and of the # HELP lines. */
static void names_of_metrics(const char *body, struct names *fam,
                             struct names *types, struct names *help)
{
	for (const char *l = body; *l;) {
		const char *nl = strchr(l, '\n');
		if (!strncmp(l, "# TYPE kvtrim_", 14)) {
			const char *name = l + 14;
			size_t n = strcspn(name, " \n");
			names_add(fam, name, n);
			const char *type = name + n + 1;
			names_add(types, type, strcspn(type, "\n"));
		} else if (!strncmp(l, "# HELP kvtrim_", 14)) {
			names_add(help, l + 14, strcspn(l + 14, " \n"));
		}
		l = nl ? nl + 1 : l + strlen(l);
	}
}

static const char *type_of(const struct names *fam,
                           const struct names *types, const char *name)
{
	for (int i = 0; i < fam->n; i++)
		if (!strcmp(fam->v[i], name))
			return types->v[i];
	return NULL;
}

/* The value of the sample "kvtrim_<name><labels> v" (labels "" for
 * none), -1 when there is none (every figure here is >= 0). */
static double sample(const char *body, const char *name, const char *labels)
{
	char want[256];
	snprintf(want, sizeof(want), "\nkvtrim_%s%s ", name, labels);
	const char *p = strstr(body, want);
	return p ? strtod(p + strlen(want), NULL) : -1;
}

/* Row key k of a histogram: k is <base>_count or <base>_sum and the
 * metric <base> is a histogram.  Returns the base in buf, or NULL. */
static const char *hist_base(const struct names *fam,
                             const struct names *types, const char *k,
                             char *buf, size_t len)
{
	static const char *const suf[] = {"_count", "_sum"};
	for (int i = 0; i < 2; i++) {
		size_t kl = strlen(k), sl = strlen(suf[i]);
		if (kl <= sl || strcmp(k + kl - sl, suf[i]))
			continue;
		snprintf(buf, len, "%.*s", (int)(kl - sl), k);
		const char *t = type_of(fam, types, buf);
		if (t && !strcmp(t, "histogram"))
			return buf;
	}
	return NULL;
}

/*
 * One name per figure: every row key of `kvtrimctl stats` is the metric
 * kvtrim_<key> and a key of /stats (a histogram: rows <name>_count and
 * <name>_sum, the metric <name>, the JSON object <name> with count and
 * sum), every row key of `kvtrimctl tenants` the metric
 * kvtrim_tenant_<key> and a key of each tenant in /stats; the rows'
 * strings are labels of the info metrics.  And back: every metric and
 * every /stats key is a row key (errors by code: the rows show only the
 * codes seen, so an error metric missing from them must be 0).
 */
TEST(stats, fields_are_defined_once_and_shown_everywhere)
{
	struct th_daemon d;
	static char body[1 << 18], json[1 << 18], rows[1 << 16], trows[1 << 16];
	static struct names r, t, fam, types, help, jtop, jsub, jten;
	char b[64];
	kvt_client *c, *bad;
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "32M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "fields", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	/* One error reply, so the rows show an errors_<NAME>_total. */
	struct kvt_config bcfg = th_small_cfg(&d, "fields-bad", "no-such");
	T_ERR(kvt_connect(&bcfg, &bad, err), KVT_EPOLICY);

	T_EQ(th_sh(&d, rows, sizeof(rows), "%s stats", th_bin("kvtrimctl")), 0);
	T_EQ(th_sh(&d, trows, sizeof(trows), "%s tenants",
	           th_bin("kvtrimctl")), 0);
	T_EQ(th_http(&d, NULL, "/metrics", body, sizeof(body)), 200);
	T_EQ(th_http(&d, NULL, "/stats", json, sizeof(json)), 200);
	check_exposition(body);
	names_of_kv(&r, rows);
	names_of_header(&t, trows);
	names_of_metrics(body, &fam, &types, &help);
	names_of_json(json, &jtop, &jsub, &jten);
	T_ASSERT(r.n > 40 && t.n > 10);
	T_ASSERT(names_has(&r, "errors_EPOLICY_total"));

	/* Each # HELP has its # TYPE and back. */
	for (int i = 0; i < fam.n; i++)
		if (!names_has(&help, fam.v[i]))
			th_fail(__FILE__, __LINE__, "no # HELP for %s",
			        fam.v[i]);
	T_EQ(help.n, fam.n);

	/* Rows -> /metrics and /stats. */
	for (int i = 0; i < r.n; i++) {
		const char *k = r.v[i];
		char want[128];
		if (!strcmp(k, "version") || !strcmp(k, "backend")) {
			snprintf(want, sizeof(want), "%s=\"", k);
			const char *info = strstr(body, "\nkvtrim_info{");
			T_ASSERT(info && strstr(info, want) &&
			         strstr(info, want) < strchr(info + 1, '\n'));
			T_ASSERT(names_has(&jtop, k));
		} else if (hist_base(&fam, &types, k, b, sizeof(b))) {
			snprintf(want, sizeof(want), "%s.%s", b,
			         k + strlen(b) + 1);
			if (!names_has(&jsub, want))
				th_fail(__FILE__, __LINE__, "row %s: /stats "
				        "has no %s", k, want);
			if (sample(body, k, "") < 0)
				th_fail(__FILE__, __LINE__, "row %s: no sample "
				        "kvtrim_%s", k, k);
		} else {
			if (!type_of(&fam, &types, k) ||
			    sample(body, k, "") < 0)
				th_fail(__FILE__, __LINE__, "row %s: /metrics "
				        "has no kvtrim_%s", k, k);
			if (!names_has(&jtop, k))
				th_fail(__FILE__, __LINE__, "row %s: not a key "
				        "of /stats", k);
		}
	}

	/* Tenant rows -> /metrics (the tenant's series) and /stats. */
	const char *lab = "{tenant=\"fields\",id=\"1\"}";
	T_ASSERT(sample(body, "tenant_info",
	                "{tenant=\"fields\",id=\"1\",policy=\"full\"}") == 1);
	for (int i = 0; i < t.n; i++) {
		const char *k = t.v[i];
		char m[96];
		if (!names_has(&jten, k))
			th_fail(__FILE__, __LINE__, "tenants column %s: not a "
			        "key of /stats' tenant_list", k);
		if (!strcmp(k, "id") || !strcmp(k, "name") ||
		    !strcmp(k, "policy"))
			continue; /* the labels of kvtrim_tenant_info */
		snprintf(m, sizeof(m), "tenant_%s", k);
		/* a daemon-wide figure may start with tenant_ too
		 * (tenant_memory_refusals_total), but not take a name
		 * a tenant's figure has in /metrics */
		if (names_has(&r, m))
			th_fail(__FILE__, __LINE__, "row %s and tenants column "
			        "%s are both kvtrim_%s", m, k, m);
		if (!type_of(&fam, &types, m) || sample(body, m, lab) < 0)
			th_fail(__FILE__, __LINE__, "tenants column %s: "
			        "/metrics has no kvtrim_%s%s", k, m, lab);
	}
	for (int i = 0; i < jten.n; i++)
		if (!names_has(&t, jten.v[i]))
			th_fail(__FILE__, __LINE__, "/stats tenant key %s is "
			        "no tenants column", jten.v[i]);

	/* /metrics -> rows. */
	for (int i = 0; i < fam.n; i++) {
		const char *f = fam.v[i];
		char k[96];
		if (!strcmp(f, "info") || !strcmp(f, "tenant_info") ||
		    names_has(&r, f))
			continue;
		if (!strncmp(f, "tenant_", 7)) {
			if (!names_has(&t, f + 7))
				th_fail(__FILE__, __LINE__, "kvtrim_%s: no "
				        "tenants column %s", f, f + 7);
		} else if (!strcmp(types.v[i], "histogram")) {
			snprintf(k, sizeof(k), "%s_count", f);
			T_ASSERT(names_has(&r, k));
			snprintf(k, sizeof(k), "%s_sum", f);
			T_ASSERT(names_has(&r, k));
		} else {
			/* only an error code not seen may be missing */
			if (strncmp(f, "errors_", 7) ||
			    sample(body, f, "") != 0)
				th_fail(__FILE__, __LINE__, "kvtrim_%s is no "
				        "row of kvtrimctl stats", f);
		}
	}

	/* /stats -> /metrics (all of its keys are metrics, errors too). */
	for (int i = 0; i < jtop.n; i++) {
		const char *k = jtop.v[i];
		if (!strcmp(k, "version") || !strcmp(k, "backend") ||
		    !strcmp(k, "tenant_list"))
			continue;
		if (!type_of(&fam, &types, k))
			th_fail(__FILE__, __LINE__, "/stats key %s: /metrics "
			        "has no kvtrim_%s", k, k);
	}
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
