/*
 * main.c — kvtrimd's command line.  Every setting of the config table is
 * also an option (--pool-size 256M); --config FILE is read first, so the
 * command line wins over the file, on start and on every SIGHUP reload.
 * Runs in the foreground and logs to stderr (journald under systemd).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kvtrim.h"
#include "log.h"
#include "policy.h"
#include "rundir.h"
#include "server.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtrimd [--config FILE] [--OPTION VALUE]...\n"
	           "       kvtrimd --list-policies | --help | --version\n\n"
	           "SIGHUP reloads FILE (settings marked * apply live; the "
	           "others need a restart).\n\n"
	           "options (also settable in the config file as key = value):\n");
	for (size_t i = 0; i < config_count(); i++) {
		const struct config_entry *e = config_at(i);
		char opt[64];
		snprintf(opt, sizeof(opt), "%s", e->name);
		for (char *p = opt; *p; p++)
			if (*p == '_')
				*p = '-';
		fprintf(f, " %c--%-22s %s (default: %s)\n",
		        e->flags & CONFIG_MUTABLE ? '*' : ' ', opt, e->help,
		        e->def[0] ? e->def : "empty");
	}
	fprintf(f,
	        "\nLimits (one misbehaving client cannot starve the others):\n"
	        "  connections without a tenant: max_pending_conns per socket, "
	        "max_pending_per_pid\n"
	        "  of them per process and max_pending_per_uid per uid (at the "
	        "limit the uid\n"
	        "  holding the most gives one up to a newcomer of a uid holding "
	        "fewer; fd.sock\n"
	        "  then closes its oldest one idle for 1 s; else the new one is "
	        "refused, told\n"
	        "  why: EBUSY naming the limit), each closed after "
	        "hello_timeout_ms;\n"
	        "  control requests: "
	        "max_inflight_per_conn and\n"
	        "  send_timeout_ms; stats socket: stats_max_conns and "
	        "stats_header_timeout_ms.\n"
	        "  A client that sends on fd.sock anything but CHUNK_CLOSED for "
	        "a chunk it was\n"
	        "  told to revoke is disconnected (its tenant is released).\n"
	        "  Tenants: tenant_memory_max of daemon memory each (checked at "
	        "hello), at most\n"
	        "  max_sync_lists page lists a sync; a tenant whose syncs take "
	        "longer than\n"
	        "  sync_offload_us runs them on worker threads "
	        "(UV_THREADPOOL_SIZE, default 4).\n"
	        "  Open files: kvtrimd raises its soft RLIMIT_NOFILE to the hard "
	        "limit and needs\n"
	        "  pool_size/2M + 4 x max_tenants + 3 + stats_max_conns + 2 x "
	        "(max_pending_conns\n"
	        "  + 16) + 64; under a lower limit it lowers max_pending_conns "
	        "(warning at start), so\n"
	        "  registered tenants are not the ones that run out.  A failed "
	        "accept pauses\n"
	        "  the listener 100 ms, doubling to 1 s.\n"
	        "  One kvtrimd per runtime dir: it holds RUNTIME_DIR/kvtrimd.lock "
	        "(its pid); a\n"
	        "  second one exits with status 1.\n");
}

/* "--pool-size" -> "pool_size"; NULL when arg is not an option. */
static const char *opt_key(const char *arg, char *buf, size_t len)
{
	if (strncmp(arg, "--", 2) || !arg[2])
		return NULL;
	snprintf(buf, len, "%s", arg + 2);
	for (char *p = buf; *p; p++)
		if (*p == '-')
			*p = '_';
	return buf;
}

/* One line of --list-policies: the name, its parameters and defaults (as
 * kvtrimctl policies shows them), and what it reads at every sync. */
static void list_policy(const struct policy_ops *o)
{
	static const struct {
		uint32_t bit;
		const char *what;
	} in[] = {
		{POLICY_NEED_X, "x"},
		{POLICY_NEED_Q, "q"},
		{POLICY_NEED_LSE, "lse"},
		{POLICY_NEED_KV, "K/V pages"},
	};
	char reads[64] = "";
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++)
		if (o->needs & in[i].bit) {
			size_t n = strlen(reads);
			snprintf(reads + n, sizeof(reads) - n, "%s%s",
			         n ? ", " : "", in[i].what);
		}
	printf("%-18s %s; reads %s\n", o->name, o->help,
	       reads[0] ? reads : "nothing");
}

int main(int argc, char **argv)
{
	/* The loop thread runs every scorer product; OpenBLAS's own thread
	 * pool would only add hand-offs (and spin) for per-sync batches of a
	 * few tokens, and compete with the engines for cores. */
	openblas_set_num_threads(1);
	struct config cfg;
	static struct config_args args; /* the server keeps a copy */
	char err[512], key[64];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(argv[i], "--version")) {
			printf("kvtrimd %d.%d.%d\n", KVT_VERSION_MAJOR,
			       KVT_VERSION_MINOR, KVT_VERSION_PATCH);
			return 0;
		}
		if (!strcmp(argv[i], "--list-policies")) {
			for (size_t p = 0; p < policy_count(); p++)
				list_policy(policy_at(p));
			return 0;
		}
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "kvtrimd: --config needs a file\n");
				return 2;
			}
			args.file = argv[++i];
		}
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config")) {
			i++;
			continue;
		}
		const char *k = opt_key(argv[i], key, sizeof(key));
		if (!k || !config_find(k)) {
			fprintf(stderr, "kvtrimd: unknown option '%s' (see --help)\n",
			        argv[i]);
			return 2;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "kvtrimd: %s needs a value\n", argv[i]);
			return 2;
		}
		if (args.n == CONFIG_ARGS_MAX) {
			fprintf(stderr, "kvtrimd: more than %d options\n",
			        CONFIG_ARGS_MAX);
			return 2;
		}
		snprintf(args.key[args.n], sizeof(args.key[0]), "%s", k);
		args.val[args.n++] = argv[++i];
	}
	if (config_build(&cfg, &args, err, sizeof(err))) {
		fprintf(stderr, "kvtrimd: %s\n", err);
		return 2;
	}
	if (!cfg.runtime_dir[0]) {
		char dir[sizeof(cfg.runtime_dir)];
		rundir_resolve(NULL, dir, sizeof(dir));
		memcpy(cfg.runtime_dir, dir, sizeof(dir));
	}
	log_threshold = log_parse_level(cfg.log_level);

	struct server *s;
	int rv = server_new(&cfg, &args, &s, err, sizeof(err));
	if (rv) {
		fprintf(stderr, "kvtrimd: %s (%s)\n", err, kvt_strerror(rv));
		return 1;
	}
	rv = server_run(s);
	server_free(s);
	return rv ? 1 : 0;
}
