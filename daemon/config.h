/*
 * config.h — the daemon's settings, defined once in a table that drives the
 * config file ("key = value" lines, '#' comments), the command line
 * (--key-with-dashes VALUE) and `kvtrimctl config`.
 * Precedence: defaults, then the file, then the command line.
 */
#ifndef KVT_CONFIG_H
#define KVT_CONFIG_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

struct config {
	char runtime_dir[PATH_MAX - 64]; /* leaves room for "/ctl.ipc" */
	char backend[16];                /* auto | cpu | cuda */
	uint64_t pool_size;              /* bytes, multiple of 2 MiB */
	uint64_t default_quota;          /* bytes; 0 = the whole pool */
	uint32_t max_tenants;
	uint32_t contexts;               /* nng contexts = requests in flight */
	uint32_t hello_timeout_ms;       /* handle channel without hello */
	char log_level[16];
};

enum config_type { CONFIG_STR, CONFIG_SIZE, CONFIG_U32 };

#define CONFIG_MUTABLE 1u /* may change at run time (kvtrimctl config set) */

struct config_entry {
	const char *name; /* file key; the option is --name with '-' for '_' */
	enum config_type type;
	unsigned flags;
	uint64_t min, max; /* numbers: bounds; strings: max length excl NUL */
	const char *def;
	size_t off;
	const char *help;
};

/* Fills every field with its default (cannot fail: defaults are valid). */
void config_defaults(struct config *c);

/*
 * Sets one key from text, validating type, bounds and enumerations.
 * 0, or KVT_EINVAL with a reason ("pool_size: '12Q' is not a size").
 */
int config_set(struct config *c, const char *key, const char *val, char *err,
               size_t errlen);

/* Loads a file; on error nothing is applied (parsed into a copy first). */
int config_load_file(struct config *c, const char *path, char *err,
                     size_t errlen);

/* Renders one value as text. */
void config_get(const struct config *c, const struct config_entry *e,
                char *buf, size_t len);

size_t config_count(void);
const struct config_entry *config_at(size_t i);
const struct config_entry *config_find(const char *key);

/* Cross-field checks after everything was set. */
int config_validate(const struct config *c, char *err, size_t errlen);

/* "256M" / "2G" / "1048576" -> bytes; -1 on malformed input. */
int config_parse_size(const char *s, uint64_t *out);

#endif
