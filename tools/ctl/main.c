/*
 * main.c — kvtrimctl, the operator's command line for kvtrimd.
 *
 *   kvtrimctl [OPTIONS] COMMAND [ARG...]   (options may also follow it)
 *
 * Speaks the admin ops of the control plane directly (nng req0 + codec):
 * they need no registered tenant, so kvtrimctl never touches the handle
 * channel or shared memory.  `metrics` reads the stats socket instead.
 * Exit status: 0 success, 1 `check` found violations, 2 any error (usage,
 * daemon unreachable, error reply).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>

#include "kvtrim.h"
#include "rundir.h"

#include "ctl.h"


static void usage(FILE *f)
{
	fprintf(f,
	        "usage: kvtrimctl [OPTIONS] COMMAND [ARG...]\n"
	        "\n"
	        "commands:\n"
	        "  stats [TENANT]          daemon-wide counters and gauges, or "
	        "one tenant's\n"
	        "                          (name or id), \"key value\" per line\n"
	        "  top                     refreshing view of the pool and "
	        "every tenant\n"
	        "  tenants                 one line per registered tenant\n"
	        "  TENANT is an id when all digits, else a name (names never "
	        "start with a digit)\n"
	        "  config get [KEY]        settings in force (also: config "
	        "[KEY])\n"
	        "  config set KEY VALUE    change a mutable setting now "
	        "(kvtrimd --help marks\n"
	        "                          them *); validated like the config "
	        "file\n"
	        "  check                   verify the pool invariants: \"ok\" "
	        "(exit 0) or the\n"
	        "                          violation (exit 1)\n"
	        "  drain TENANT            stop admitting new sequences for a "
	        "tenant (name or\n"
	        "                          id); open ones continue; --undo "
	        "admits again\n"
	        "  policies                eviction policies the daemon knows\n"
	        "  metrics                 Prometheus text from stats.sock "
	        "(like curl)\n"
	        "\n"
	        "options:\n"
	        "  --runtime-dir DIR  where kvtrimd's sockets live (default "
	        "$KVTRIM_RUNTIME_DIR,\n"
	        "                     then $XDG_RUNTIME_DIR/kvtrim, then "
	        "/run/kvtrimd)\n"
	        "  --json             machine-readable output\n"
	        "  --timeout MS       how long to wait for the daemon "
	        "(default %d)\n"
	        "  --iterations N     top: refresh N times, then exit "
	        "(default: until ^C)\n"
	        "  --interval MS      top: time between refreshes (default "
	        "%d)\n"
	        "  --undo             drain: admit new sequences again\n"
	        "\n"
	        "examples:\n"
	        "  kvtrimctl top\n"
	        "  kvtrimctl config set log_level debug\n"
	        "  kvtrimctl --json stats engine-a\n"
	        "\n"
	        "exit status: 0 ok, 1 check found violations, 2 error\n",
	        CTL_DEF_TIMEOUT_MS, CTL_DEF_INTERVAL_MS);
}


/* ---------------------------------------------------------------- main */

static int parse_long(const char *opt, const char *v, long min, long max,
                      long *out)
{
	char *end = NULL;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || !*v || *end || x < min || x > max) {
		fprintf(stderr, "kvtrimctl: %s needs a number in [%ld, %ld], "
		        "not '%s'\n", opt, min, max, v);
		return -1;
	}
	*out = x;
	return 0;
}

/* The command line as main reads it, beside the session it fills. */
struct cmdline {
	const char *dir;                    /* --runtime-dir, or NULL */
	const char *pos[CTL_MAX_ARGS + 2];  /* [npos]: COMMAND, then its ARGs */
	int npos;
	int iter_set, interval_set;         /* --iterations, --interval seen */
	enum { C_STATS, C_TOP, C_TENANTS, C_CGET, C_CSET, C_CHECK, C_DRAIN,
	       C_POLICIES, C_METRICS } which;
	const char *a1;                     /* the command's first argument:
	                                     * KEY for config get, else pos[1] */
};

/*
 * Reads the options into c and cl and the other words into cl->pos.
 * Returns -1 to go on, or the exit status (0 after --help, 2 after
 * printing why).
 */
static int parse_options(int argc, char **argv, struct ctl *c,
                         struct cmdline *cl)
{
	long v;

	/* Options anywhere; "--" ends them (a tenant named "-x"). */
	for (int i = 1, opts = 1; i < argc; i++) {
		const char *a = argv[i];
		if (opts && !strcmp(a, "--")) {
			opts = 0;
		} else if (opts && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
			usage(stdout);
			return 0;
		} else if (opts && !strcmp(a, "--json")) {
			c->json = 1;
		} else if (opts && !strcmp(a, "--undo")) {
			c->undo = 1;
		} else if (opts && !strcmp(a, "--runtime-dir") && i + 1 < argc) {
			cl->dir = argv[++i];
		} else if (opts && !strcmp(a, "--timeout") && i + 1 < argc) {
			if (parse_long(a, argv[++i], 1, INT_MAX, &v))
				return 2;
			c->timeout_ms = (int)v;
		} else if (opts && !strcmp(a, "--iterations") && i + 1 < argc) {
			if (parse_long(a, argv[++i], 1, LONG_MAX, &c->iterations))
				return 2;
			cl->iter_set = 1;
		} else if (opts && !strcmp(a, "--interval") && i + 1 < argc) {
			if (parse_long(a, argv[++i], 10, 3600000, &c->interval_ms))
				return 2;
			cl->interval_set = 1;
		} else if (opts && a[0] == '-' && a[1]) {
			fprintf(stderr, "kvtrimctl: unknown or incomplete option "
			        "%s (see --help)\n", a);
			return 2;
		} else if (cl->npos < CTL_MAX_ARGS + 1) {
			cl->pos[cl->npos++] = a;
		} else {
			fprintf(stderr, "kvtrimctl: too many arguments (see "
			        "--help)\n");
			return 2;
		}
	}
	if (!cl->npos) {
		usage(stderr);
		return 2;
	}
	return -1;
}

/*
 * Names the command (cl->which, cl->a1; `undrain` sets c->undo) and checks
 * its arguments and options, all before connecting.  Returns 0, or 2 after
 * printing why.
 */
static int check_command(struct ctl *c, struct cmdline *cl)
{
	const char *cmd = cl->pos[0];
	int nargs = cl->npos - 1;
	const char *a2 = nargs > 1 ? cl->pos[2] : NULL;
	int min = 0, max = 0;

	cl->a1 = nargs > 0 ? cl->pos[1] : NULL;
	if (!strcmp(cmd, "stats")) {
		cl->which = C_STATS, max = 1;
	} else if (!strcmp(cmd, "top")) {
		cl->which = C_TOP;
	} else if (!strcmp(cmd, "tenants")) {
		cl->which = C_TENANTS;
	} else if (!strcmp(cmd, "config")) {
		if (cl->a1 && !strcmp(cl->a1, "set")) {
			cl->which = C_CSET, min = max = 3;
		} else if (cl->a1 && !strcmp(cl->a1, "get")) {
			cl->which = C_CGET, max = 2;
			cl->a1 = a2;
		} else {
			cl->which = C_CGET, max = 1;
		}
	} else if (!strcmp(cmd, "check")) {
		cl->which = C_CHECK;
	} else if (!strcmp(cmd, "drain")) {
		cl->which = C_DRAIN, min = max = 1;
	} else if (!strcmp(cmd, "undrain")) {
		cl->which = C_DRAIN, min = max = 1;
		c->undo = 1;
	} else if (!strcmp(cmd, "policies")) {
		cl->which = C_POLICIES;
	} else if (!strcmp(cmd, "metrics")) {
		cl->which = C_METRICS;
	} else {
		fprintf(stderr, "kvtrimctl: unknown command '%s' (commands: "
		        "stats, top, tenants, config, check, drain, policies, "
		        "metrics; see --help)\n", cmd);
		return 2;
	}
	if (nargs < min || nargs > max) {
		if (cl->which == C_CSET)
			fprintf(stderr, "kvtrimctl: usage: config set KEY VALUE\n");
		else if (cl->which == C_DRAIN)
			fprintf(stderr, "kvtrimctl: usage: %s TENANT (name or "
			        "id)\n", cmd);
		else if (!max)
			fprintf(stderr, "kvtrimctl: %s takes no argument\n", cmd);
		else
			fprintf(stderr, "kvtrimctl: too many arguments for %s "
			        "(see --help)\n", cmd);
		return 2;
	}
	if ((cl->iter_set || cl->interval_set) && cl->which != C_TOP) {
		fprintf(stderr, "kvtrimctl: --iterations and --interval are for "
		        "top\n");
		return 2;
	}
	if (c->undo && cl->which != C_DRAIN) {
		fprintf(stderr, "kvtrimctl: --undo is for drain\n");
		return 2;
	}
	const char *name_arg = cl->which == C_CSET ? cl->pos[2] : cl->a1;
	if (name_arg && strlen(name_arg) >= KVT_NAME_MAX) {
		fprintf(stderr, "kvtrimctl: '%s' is longer than %d bytes\n",
		        name_arg, KVT_NAME_MAX - 1);
		return 2;
	}
	return 0;
}

/* Runs the checked command against the daemon; returns the exit status
 * (2 also when stdout cannot be flushed). */
static int run_command(struct ctl *c, const struct cmdline *cl)
{
	int rc;

	rundir_resolve(cl->dir, c->dir, sizeof(c->dir));
	if (cl->which == C_METRICS) {
		rc = cmd_metrics(c);
		if (fflush(stdout) != 0 && rc == 0)
			rc = 2;
		return rc;
	}
	if (ctl_open(c) < 0)
		return 2;
	switch (cl->which) {
	case C_STATS:
		rc = cmd_stats(c, cl->a1);
		break;
	case C_TOP:
		rc = cmd_top(c);
		break;
	case C_TENANTS:
		rc = cmd_rows(c, IPC_OP_TENANTS, NULL);
		break;
	case C_CGET:
		rc = cmd_rows(c, IPC_OP_CONFIG, cl->a1);
		break;
	case C_CSET:
		rc = cmd_config_set(c, cl->pos[2], cl->pos[3]);
		break;
	case C_CHECK:
		rc = cmd_check(c);
		break;
	case C_DRAIN:
		rc = cmd_drain(c, cl->a1);
		break;
	case C_POLICIES:
		rc = cmd_rows(c, IPC_OP_POLICIES, NULL);
		break;
	default:
		rc = 2;
		break;
	}
	if (fflush(stdout) != 0 && rc == 0)
		rc = 2;
	nng_close(c->sock);
	return rc;
}

int main(int argc, char **argv)
{
	struct ctl c = {.timeout_ms = CTL_DEF_TIMEOUT_MS,
	                .interval_ms = CTL_DEF_INTERVAL_MS};
	struct cmdline cl = {0};
	int rc;

	if ((rc = parse_options(argc, argv, &c, &cl)) >= 0)
		return rc;
	if ((rc = check_command(&c, &cl)))
		return rc;
	return run_command(&c, &cl);
}
