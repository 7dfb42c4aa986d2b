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
	uint64_t default_quota;          /* bytes; 0 = pool / expected_tenants */
	uint32_t max_tenants;
	uint32_t contexts;               /* requests being served at once */
	uint32_t hello_timeout_ms;       /* handle channel without hello */
	char log_level[16];
	uint32_t stats_tcp_port;         /* 0 = no TCP listener */
	uint64_t max_quota;              /* bytes; 0 = the whole pool */
	char allow_uids[256];            /* "" or "0,1000,alice" */
	char allow_gids[256];            /* "" or "kvtrim,1001" */
	double high_watermark;           /* pool use where pressure starts */
	uint32_t pressure_deadline_ms;   /* longest backpressure wait */
	char tenant_priorities[256];     /* "" or "name=N,name=N" */
	char admin_uids[256];            /* "" or "0,alice": admin changes */
	char admin_gids[256];            /* "" or "wheel" */
	uint32_t acl_from_socket;        /* 1: config set may change ACLs */
	uint32_t max_pending_conns;      /* per socket, without a tenant */
	uint32_t max_pending_per_pid;    /* ... of them, one process's */
	uint32_t max_pending_per_uid;    /* ... of them, one uid's (0: half) */
	uint32_t max_inflight_per_conn;  /* control requests per pipe */
	uint32_t send_timeout_ms;        /* reply not taken: pipe closed */
	uint32_t max_sync_lists;         /* lists one sync may touch */
	uint32_t sync_offload_us;        /* slower syncs run on workers */
	uint32_t scorer_gather_us;       /* a shared scorer's run waits this
	                                    long for other tenants' syncs */
	uint32_t stats_max_conns;        /* HTTP connections at once */
	uint32_t stats_header_timeout_ms; /* HTTP headers complete by then */
	uint64_t tenant_memory_max;      /* daemon bytes per tenant, outside
	                                    the pool */
	uint32_t expected_tenants;       /* default_quota 0: pool / this */
	double uid_pool_share;           /* pool one uid's tenants may hold;
	                                    0 = config_pool_share's default */
	double pid_pool_share;           /* ... one process's tenants */
};

/* CONFIG_RATIO: a double in (0, 1] (with CONFIG_AUTO, [0, 1]); min and max
 * of its entry are unused. */
enum config_type { CONFIG_STR, CONFIG_SIZE, CONFIG_U32, CONFIG_RATIO };

#define CONFIG_MUTABLE 1u /* may change at run time (kvtrimctl config set) */
#define CONFIG_AUTO 2u    /* a ratio that may be 0: "derived", as its doc
                             says */

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

/*
 * Parses an allow list ("0,1000,alice"): numbers, or user (group) names
 * resolved through NSS.  Writes at most cap ids; returns how many the list
 * holds (0 for ""), or -1 when an item is neither a number nor a known name.
 */
int config_parse_ids(const char *list, int groups, uint32_t *out, size_t cap);

/*
 * The priority of a tenant name in tenant_priorities ("a=3,b=1"): 1 when
 * the name is not listed.  Priorities are 1..1000; higher is protected
 * longer under memory pressure.
 */
uint32_t config_priority(const struct config *c, const char *name);

/*
 * The share of the pool (0, 1] that the tenants of one uid (pid 0) or of
 * one process (pid 1) may hold together: uid_pool_share (pid_pool_share),
 * or when 0 the default.  With f = 1 / expected_tenants (the fair share,
 * the default quota): a uid 1 - f, so that whatever one uid holds, another
 * uid's engine finds its fair share free; a process 1 - 2f, at least f, so
 * that another process of the same uid does too.  Both are 1 when
 * expected_tenants is 1 (the pool is one engine's), and the process share
 * never exceeds its uid's.
 */
double config_pool_share(const struct config *c, int pid);

/* ---- building and reloading */

#define CONFIG_ARGS_MAX 64

/*
 * What the command line said, kept so a reload (SIGHUP) rebuilds the same
 * way: defaults, then the file, then these overrides.  Values point into
 * argv (they live as long as the process).
 */
struct config_args {
	const char *file; /* --config FILE, NULL when none */
	int n;
	char key[CONFIG_ARGS_MAX][64]; /* "pool_size" for --pool-size */
	const char *val[CONFIG_ARGS_MAX];
};

/*
 * Defaults, then a->file (when set), then a's overrides, then
 * config_validate().  runtime_dir is left "" when nobody set it (the
 * caller resolves it).  On error *out is unspecified and err says why.
 */
int config_build(struct config *out, const struct config_args *a, char *err,
                 size_t errlen);

/*
 * Copies into cur every mutable setting whose value differs in next.
 * Names of the applied keys go to applied, names of immutable keys that
 * differ (kept at their old value: they need a restart) to ignored, both
 * space-separated.  Returns how many were applied.
 */
int config_apply_mutable(struct config *cur, const struct config *next,
                         char *applied, size_t alen, char *ignored,
                         size_t ilen);

#endif
