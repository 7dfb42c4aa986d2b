/* config.c — the one config table; see config.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtrim.h"
#include "log.h"

#define F(field) offsetof(struct config, field)

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
	 "pool bytes a tenant may hold when it asks for none (0 = whole pool)"},
	{"max_tenants", CONFIG_U32, 0, 1, 4096, "64", F(max_tenants),
	 "registered tenants at once"},
	{"contexts", CONFIG_U32, 0, 1, 1024, "64", F(contexts),
	 "control requests in flight at once"},
	{"hello_timeout_ms", CONFIG_U32, CONFIG_MUTABLE, 100, 600000, "10000",
	 F(hello_timeout_ms),
	 "a handle-channel connection without a hello is closed after this"},
	{"log_level", CONFIG_STR, CONFIG_MUTABLE, 1, 15, "notice", F(log_level),
	 "err, warning, notice, info or debug"},
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

static int enum_ok(const struct config_entry *e, const char *val)
{
	if (!strcmp(e->name, "backend"))
		return !strcmp(val, "auto") || !strcmp(val, "cpu") ||
		       !strcmp(val, "cuda");
	if (!strcmp(e->name, "log_level"))
		return log_parse_level(val) >= 0;
	return 1;
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
	return 0;
}
