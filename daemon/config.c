/* config.c — the one config table; see config.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtrim.h"
#include "log.h"

#define F(field) offsetof(struct config, field)
#define STR_MAX(field) (sizeof(((struct config *)0)->field) - 1)

static const struct config_entry config_table[] = {
	{"runtime_dir", CONFIG_STR, 0, 1, sizeof(((struct config *)0)->runtime_dir) - 1,
	 "", F(runtime_dir),
	 "directory of ctl.ipc, fd.sock and stats.sock (default "
	 "$KVTRIM_RUNTIME_DIR, then $XDG_RUNTIME_DIR/kvtrim, then /run/kvtrimd)"},
	{"backend", CONFIG_STR, 0, 1, 15, "auto", F(backend),
	 "memory backend: auto, cpu or cuda"},
	{"pool_size", CONFIG_SIZE, 0, KVT_CHUNK_BYTES, 1ull << 40, "256M",
	 F(pool_size), "bytes of KV memory in the pool (multiple of 2M)"},
	{"default_quota", CONFIG_SIZE, CONFIG_MUTABLE, 0, 1ull << 40, "0",
	 F(default_quota),
	 "pool bytes a tenant may hold when it asks for none (0 = a fair share: "
	 "pool_size / expected_tenants in whole 2M chunks, at least one; never "
	 "more than max_quota)"},
	{"expected_tenants", CONFIG_U32, CONFIG_MUTABLE, 1, 4096, "4",
	 F(expected_tenants),
	 "tenants the pool is shared between: sizes the fair-share default "
	 "quota (1 = a tenant asking no quota may take the whole pool)"},
	{"uid_pool_share", CONFIG_RATIO, CONFIG_MUTABLE | CONFIG_AUTO, 0, 0,
	 "0", F(uid_pool_share),
	 "share of the pool [0..1] the tenants of one uid may hold together, "
	 "whatever quotas they asked (0 = 1 - 1/expected_tenants: every other "
	 "uid finds a fair share free; 1 when expected_tenants is 1; 1 = no "
	 "limit); a hello asking a larger quota is refused"},
	{"pid_pool_share", CONFIG_RATIO, CONFIG_MUTABLE | CONFIG_AUTO, 0, 0,
	 "0", F(pid_pool_share),
	 "share of the pool [0..1] the tenants of one process may hold "
	 "together, never more than uid_pool_share (0 = 1 - 2/expected_tenants,"
	 " at least 1/expected_tenants: another process of the same uid finds "
	 "a fair share free too; 1 when expected_tenants is 1)"},
	{"max_tenants", CONFIG_U32, 0, 1, 4096, "64", F(max_tenants),
	 "registered tenants at once"},
	{"contexts", CONFIG_U32, 0, 1, 4096, "256", F(contexts),
	 "control requests in flight at once (over all connections)"},
	{"hello_timeout_ms", CONFIG_U32, CONFIG_MUTABLE, 100, 600000, "10000",
	 F(hello_timeout_ms),
	 "a handle-channel connection without a hello is closed after this"},
	{"log_level", CONFIG_STR, CONFIG_MUTABLE, 1, 15, "notice", F(log_level),
	 "err, warning, notice, info or debug"},
	{"stats_tcp_port", CONFIG_U32, 0, 0, 65535, "0", F(stats_tcp_port),
	 "also serve /metrics and /stats on 127.0.0.1:PORT (0 = off)"},
	{"max_quota", CONFIG_SIZE, CONFIG_MUTABLE, 0, 1ull << 40, "0",
	 F(max_quota),
	 "largest quota a tenant may ask for; more is refused (0 = whole pool)"},
	{"allow_uids", CONFIG_STR, CONFIG_MUTABLE, 0, STR_MAX(allow_uids), "",
	 F(allow_uids),
	 "users (ids or names, comma-separated) allowed to register; with "
	 "allow_gids empty too: the daemon's own uid and root"},
	{"allow_gids", CONFIG_STR, CONFIG_MUTABLE, 0, STR_MAX(allow_gids), "",
	 F(allow_gids),
	 "groups (ids or names, comma-separated) whose members may register"},
	{"high_watermark", CONFIG_RATIO, CONFIG_MUTABLE, 0, 0, "0.9",
	 F(high_watermark),
	 "pool use (0..1] above which tenants' compression is tightened"},
	{"pressure_deadline_ms", CONFIG_U32, CONFIG_MUTABLE, 0, 60000, "2000",
	 F(pressure_deadline_ms),
	 "a request that needs pages the full pool lacks waits this long, then "
	 "gets EPOOLFULL (0 = at once)"},
	{"admin_uids", CONFIG_STR, CONFIG_MUTABLE, 0, STR_MAX(admin_uids), "",
	 F(admin_uids),
	 "users (ids or names) allowed the admin ops that change something "
	 "(drain, config set); with admin_gids empty too: the daemon's own uid "
	 "and root"},
	{"admin_gids", CONFIG_STR, CONFIG_MUTABLE, 0, STR_MAX(admin_gids), "",
	 F(admin_gids), "groups whose members are admins (see admin_uids)"},
	{"acl_from_socket", CONFIG_U32, 0, 0, 1, "0", F(acl_from_socket),
	 "1: kvtrimctl config set may change allow_* and admin_* (0: only the "
	 "config file and SIGHUP can)"},
	{"max_pending_conns", CONFIG_U32, CONFIG_MUTABLE, 1, 65536, "256",
	 F(max_pending_conns),
	 "connections of each socket (ctl.ipc, fd.sock) not bound to a tenant; "
	 "more are refused at accept (fd.sock first closes its oldest one idle "
	 "for 1 s); lowered at start to fit the open-file limit"},
	{"max_pending_per_pid", CONFIG_U32, CONFIG_MUTABLE, 1, 65536, "64",
	 F(max_pending_per_pid),
	 "of those, what one process may hold on each socket; its further "
	 "ones are refused at accept (they close nobody else's)"},
	{"max_pending_per_uid", CONFIG_U32, CONFIG_MUTABLE, 0, 65536, "0",
	 F(max_pending_per_uid),
	 "of those, what one uid may hold on each socket (0: half of "
	 "max_pending_conns; admins exempt); its further ones are refused "
	 "with EBUSY naming this limit, and at max_pending_conns a newcomer "
	 "of another uid closes one of the uid holding the most"},
	{"max_inflight_per_conn", CONFIG_U32, CONFIG_MUTABLE, 1, 1024, "32",
	 F(max_inflight_per_conn),
	 "requests of one control connection unanswered at once; the "
	 "connection is not read beyond that until replies go out"},
	{"send_timeout_ms", CONFIG_U32, CONFIG_MUTABLE, 10, 60000, "2000",
	 F(send_timeout_ms),
	 "replies waiting this long without the peer taking a byte close "
	 "its connection"},
	{"max_sync_lists", CONFIG_U32, CONFIG_MUTABLE, 1, 1u << 24, "65536",
	 F(max_sync_lists),
	 "page lists one sync may touch (items x layers x KV heads); bounds "
	 "the time one sync holds the daemon's loop"},
	{"sync_offload_us", CONFIG_U32, CONFIG_MUTABLE, 0, 10000000, "200",
	 F(sync_offload_us),
	 "a tenant whose syncs take longer than this (moving average) runs "
	 "them on worker threads, so they never hold the loop (0 = always)"},
	{"scorer_gather_us", CONFIG_U32, CONFIG_MUTABLE, 0, 100000, "0",
	 F(scorer_gather_us),
	 "a sync on a worker thread whose device scorer's weights other "
	 "tenants share waits up to this long for their syncs, to score them "
	 "all in one run (0 = only the syncs already waiting; syncs on the "
	 "loop never wait)"},
	{"stats_max_conns", CONFIG_U32, 0, 1, 4096, "256", F(stats_max_conns),
	 "HTTP connections to the stats socket (and to the TCP port) at once; "
	 "at the limit a new connection closes the one that has waited longest "
	 "for a complete request"},
	{"stats_header_timeout_ms", CONFIG_U32, 0, 100, 60000, "2000",
	 F(stats_header_timeout_ms),
	 "an HTTP connection without complete request headers this long after "
	 "it opened (or after its previous reply) is closed, trickling or not"},
	{"tenant_memory_max", CONFIG_SIZE, CONFIG_MUTABLE, 1ull << 16,
	 1ull << 40, "1G", F(tenant_memory_max),
	 "daemon memory outside the pool one tenant may cause at its worst "
	 "(table and staging segments, state of max_seqs open sequences, "
	 "scratch); a hello whose geometry needs more is refused with EQUOTA"},
	{"tenant_priorities", CONFIG_STR, CONFIG_MUTABLE, 0,
	 STR_MAX(tenant_priorities), "", F(tenant_priorities),
	 "name=N,... (N 1..1000, default 1): higher is tightened less under "
	 "pressure"},
};

#define CONFIG_N (sizeof(config_table) / sizeof(config_table[0]))

size_t config_count(void) { return CONFIG_N; }

const struct config_entry *config_at(size_t i)
{
	return i < CONFIG_N ? &config_table[i] : NULL;
}

const struct config_entry *config_find(const char *key)
{
	for (size_t i = 0; i < CONFIG_N; i++)
		if (!strcmp(config_table[i].name, key))
			return &config_table[i];
	return NULL;
}

int config_parse_size(const char *s, uint64_t *out)
{
	char *end;
	if (!*s || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	unsigned shift = 0;
	switch (*end) {
	case '\0':
		break;
	case 'k': case 'K':
		shift = 10;
		break;
	case 'm': case 'M':
		shift = 20;
		break;
	case 'g': case 'G':
		shift = 30;
		break;
	case 't': case 'T':
		shift = 40;
		break;
	default:
		return -1;
	}
	if (*end && end[1] && !(end[1] == 'i' && end[2] == 'B' && !end[3]) &&
	    !(end[1] == 'B' && !end[2]))
		return -1;
	if (shift && v > (UINT64_MAX >> shift))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

/* Resolves one list item: a decimal id or an NSS name; -1 if neither. */
static int parse_id(const char *item, size_t n, int groups, uint32_t *out)
{
	char name[128], buf[4096];
	if (!n || n >= sizeof(name))
		return -1;
	memcpy(name, item, n);
	name[n] = '\0';
	if (isdigit((unsigned char)name[0])) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(name, &end, 10);
		if (*end || errno || v >= UINT32_MAX)
			return -1;
		*out = (uint32_t)v;
		return 0;
	}
	if (groups) {
		struct group g, *r = NULL;
		if (getgrnam_r(name, &g, buf, sizeof(buf), &r) || !r)
			return -1;
		*out = (uint32_t)r->gr_gid;
	} else {
		struct passwd pw, *r = NULL;
		if (getpwnam_r(name, &pw, buf, sizeof(buf), &r) || !r)
			return -1;
		*out = (uint32_t)r->pw_uid;
	}
	return 0;
}

int config_parse_ids(const char *list, int groups, uint32_t *out, size_t cap)
{
	int n = 0;
	const char *p = list;
	while (*p == ' ')
		p++;
	if (!*p)
		return 0;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		while (len && p[len - 1] == ' ')
			len--;
		uint32_t id;
		if (parse_id(p, len, groups, &id))
			return -1;
		if ((size_t)n < cap)
			out[n] = id;
		n++;
		if (!end)
			return n;
		p = end + 1;
		while (*p == ' ')
			p++;
	}
}

/*
 * Walks "name=N,name=N"; returns the priority of `name` (1 when absent),
 * or 0 when the list is malformed (only config_set ever sees that).
 */
static uint32_t priority_lookup(const char *list, const char *name)
{
	uint32_t found = 1;
	const char *p = list;
	if (!*p)
		return 1;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		const char *eq = memchr(p, '=', len);
		if (!eq || eq == p)
			return 0;
		char num[16];
		size_t nl = len - (size_t)(eq + 1 - p);
		if (!nl || nl >= sizeof(num))
			return 0;
		memcpy(num, eq + 1, nl);
		num[nl] = '\0';
		char *e;
		unsigned long v = strtoul(num, &e, 10);
		if (*e || !isdigit((unsigned char)num[0]) || v < 1 || v > 1000)
			return 0;
		if (name && strlen(name) == (size_t)(eq - p) &&
		    !memcmp(name, p, (size_t)(eq - p)))
			found = (uint32_t)v;
		if (!end)
			return found;
		p = end + 1;
	}
}

uint32_t config_priority(const struct config *c, const char *name)
{
	uint32_t v = priority_lookup(c->tenant_priorities, name);
	return v ? v : 1;
}

static int enum_ok(const struct config_entry *e, const char *val)
{
	uint32_t ids[1];
	if (!strcmp(e->name, "backend"))
		return !strcmp(val, "auto") || !strcmp(val, "cpu") ||
		       !strcmp(val, "cuda");
	if (!strcmp(e->name, "log_level"))
		return log_parse_level(val) >= 0;
	if (!strcmp(e->name, "allow_uids"))
		return config_parse_ids(val, 0, ids, 0) >= 0;
	if (!strcmp(e->name, "allow_gids"))
		return config_parse_ids(val, 1, ids, 0) >= 0;
	if (!strcmp(e->name, "tenant_priorities"))
		return priority_lookup(val, NULL) != 0;
	return 1;
}

double config_pool_share(const struct config *c, int pid)
{
	uint32_t n = c->expected_tenants ? c->expected_tenants : 1;
	double fair = 1.0 / n;
	double uid = c->uid_pool_share;
	if (uid <= 0)
		uid = n > 1 ? 1 - fair : 1;
	if (!pid)
		return uid;
	double p = c->pid_pool_share;
	if (p <= 0)
		p = n > 1 ? (1 - 2 * fair > fair ? 1 - 2 * fair : fair) : 1;
	return p < uid ? p : uid;
}

int config_set(struct config *c, const char *key, const char *val, char *err,
               size_t errlen)
{
	const struct config_entry *e = config_find(key);
	if (!e) {
		snprintf(err, errlen, "unknown setting '%s'", key);
		return KVT_EINVAL;
	}
	char *field = (char *)c + e->off;
	uint64_t v;
	switch (e->type) {
	case CONFIG_STR: {
		size_t n = strlen(val);
		if (n < e->min || n > e->max) {
			snprintf(err, errlen, "%s: length must be in [%" PRIu64
			         ", %" PRIu64 "]", key, e->min, e->max);
			return KVT_EINVAL;
		}
		if (!enum_ok(e, val)) {
			snprintf(err, errlen, "%s: '%s' is not allowed (%s)", key,
			         val, e->help);
			return KVT_EINVAL;
		}
		memcpy(field, val, n + 1);
		return 0;
	}
	case CONFIG_SIZE:
		if (config_parse_size(val, &v)) {
			snprintf(err, errlen, "%s: '%s' is not a size (e.g. 256M)",
			         key, val);
			return KVT_EINVAL;
		}
		break;
	case CONFIG_RATIO: {
		char *end;
		errno = 0;
		double d = strtod(val, &end);
		int zero = !!(e->flags & CONFIG_AUTO);
		if (!*val || *end || errno || !isfinite(d) || d < 0 ||
		    (d == 0 && !zero) || d > 1) {
			snprintf(err, errlen, "%s: '%s' is not a ratio in %s, 1]",
			         key, val, zero ? "[0" : "(0");
			return KVT_EINVAL;
		}
		*(double *)(void *)field = d;
		return 0;
	}
	case CONFIG_U32: {
		char *end;
		errno = 0;
		unsigned long long u = strtoull(val, &end, 10);
		if (!isdigit((unsigned char)*val) || *end || errno) {
			snprintf(err, errlen, "%s: '%s' is not a number", key, val);
			return KVT_EINVAL;
		}
		v = u;
		break;
	}
	default:
		return KVT_EINVAL;
	}
	if (v < e->min || v > e->max) {
		snprintf(err, errlen, "%s: %" PRIu64 " is outside [%" PRIu64
		         ", %" PRIu64 "]", key, v, e->min, e->max);
		return KVT_EINVAL;
	}
	if (e->type == CONFIG_SIZE)
		*(uint64_t *)(void *)field = v;
	else
		*(uint32_t *)(void *)field = (uint32_t)v;
	return 0;
}

void config_defaults(struct config *c)
{
	char err[128];
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < CONFIG_N; i++)
		if (config_table[i].def[0] || config_table[i].type != CONFIG_STR)
			config_set(c, config_table[i].name, config_table[i].def,
			           err, sizeof(err));
}

void config_get(const struct config *c, const struct config_entry *e,
                char *buf, size_t len)
{
	const char *field = (const char *)c + e->off;
	switch (e->type) {
	case CONFIG_STR:
		snprintf(buf, len, "%s", field);
		break;
	case CONFIG_SIZE:
		snprintf(buf, len, "%" PRIu64, *(const uint64_t *)(const void *)field);
		break;
	case CONFIG_U32:
		snprintf(buf, len, "%" PRIu32, *(const uint32_t *)(const void *)field);
		break;
	case CONFIG_RATIO: {
		/* The shortest text that reads back as the same double.
		 * "%g" alone lost digits, so a value in force could render
		 * as text config_set refuses (DBL_MIN as 2.22507e-308, a
		 * subnormal) or reads as another value (found by
		 * fuzz_config). */
		double d = *(const double *)(const void *)field;
		for (int prec = 6; prec <= 17; prec++) {
			snprintf(buf, len, "%.*g", prec, d);
			if (strtod(buf, NULL) == d)
				break;
		}
		break;
	}
	}
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

int config_load_file(struct config *c, const char *path, char *err,
                     size_t errlen)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return KVT_ESYS;
	}
	struct config tmp = *c;
	char line[4096], why[256];
	int lineno = 0, rv = 0;
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			snprintf(err, errlen, "%s:%d: line too long", path, lineno);
			rv = KVT_EINVAL;
			break;
		}
		char *s = trim(line);
		if (!*s || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		if (!eq) {
			snprintf(err, errlen, "%s:%d: expected 'key = value'",
			         path, lineno);
			rv = KVT_EINVAL;
			break;
		}
		*eq = '\0';
		char *key = trim(s), *val = trim(eq + 1);
		if ((rv = config_set(&tmp, key, val, why, sizeof(why)))) {
			snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
			break;
		}
	}
	fclose(f);
	if (!rv)
		*c = tmp;
	return rv;
}

int config_validate(const struct config *c, char *err, size_t errlen)
{
	if (c->pool_size % KVT_CHUNK_BYTES) {
		snprintf(err, errlen, "pool_size must be a multiple of 2M");
		return KVT_EINVAL;
	}
	if (c->default_quota > c->pool_size) {
		snprintf(err, errlen, "default_quota is larger than pool_size");
		return KVT_EINVAL;
	}
	if (c->max_quota > c->pool_size) {
		snprintf(err, errlen, "max_quota is larger than pool_size");
		return KVT_EINVAL;
	}
	if (c->max_quota && c->default_quota > c->max_quota) {
		snprintf(err, errlen, "default_quota is larger than max_quota");
		return KVT_EINVAL;
	}
	return 0;
}

int config_build(struct config *out, const struct config_args *a, char *err,
                 size_t errlen)
{
	int rv;
	config_defaults(out);
	if (a->file && (rv = config_load_file(out, a->file, err, errlen)))
		return rv;
	for (int i = 0; i < a->n; i++)
		if ((rv = config_set(out, a->key[i], a->val[i], err, errlen)))
			return rv;
	return config_validate(out, err, errlen);
}

static size_t field_size(const struct config_entry *e)
{
	switch (e->type) {
	case CONFIG_STR:
		return (size_t)e->max + 1;
	case CONFIG_SIZE:
		return sizeof(uint64_t);
	case CONFIG_U32:
		return sizeof(uint32_t);
	case CONFIG_RATIO:
		return sizeof(double);
	}
	return 0;
}

static void append_word(char *buf, size_t len, const char *w)
{
	size_t n = strlen(buf);
	if (n + 1 < len)
		snprintf(buf + n, len - n, "%s%s", n ? " " : "", w);
}

int config_apply_mutable(struct config *cur, const struct config *next,
                         char *applied, size_t alen, char *ignored,
                         size_t ilen)
{
	int n = 0;
	if (alen)
		applied[0] = '\0';
	if (ilen)
		ignored[0] = '\0';
	for (size_t i = 0; i < CONFIG_N; i++) {
		const struct config_entry *e = &config_table[i];
		char a[512], b[512];
		config_get(cur, e, a, sizeof(a));
		config_get(next, e, b, sizeof(b));
		if (!strcmp(a, b))
			continue;
		if (!(e->flags & CONFIG_MUTABLE)) {
			append_word(ignored, ilen, e->name);
			continue;
		}
		memcpy((char *)cur + e->off, (const char *)next + e->off,
		       field_size(e));
		append_word(applied, alen, e->name);
		n++;
	}
	return n;
}
