/*
 * kvtrimctl.c — the operator's command line for kvtrimd.
 *
 *   kvtrimctl [--runtime-dir DIR] [--json] [--timeout MS] COMMAND [ARG]
 *
 * Speaks the admin ops of the control plane directly (nng req0 + codec):
 * they need no registered tenant, so kvtrimctl never touches the handle
 * channel or shared memory.  Exit status: 0 success, 1 `check` found
 * violations, 2 any error (usage, daemon unreachable, error reply).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "codec.h"
#include "rundir.h"
#include "kvtrim.h"

#define CTL_DEF_TIMEOUT_MS 5000

struct ctl {
	char dir[PATH_MAX];
	int json;
	int timeout_ms;
	nng_socket sock;
};

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: kvtrimctl [--runtime-dir DIR] [--json] [--timeout MS] "
	        "COMMAND [ARG]\n"
	        "\n"
	        "commands:\n"
	        "  stats [TENANT]  daemon-wide counters, or one tenant's "
	        "(name or id),\n"
	        "                  \"key value\" per line\n"
	        "  tenants         one line per registered tenant, every "
	        "column\n"
	        "  check           verify the pool invariants: prints \"ok\" "
	        "(exit 0) or the\n"
	        "                  violation (exit 1)\n"
	        "  policies        eviction policies the daemon knows, with "
	        "a line of help\n"
	        "  config [KEY]    the daemon's configuration\n"
	        "\n"
	        "options:\n"
	        "  --runtime-dir DIR  where kvtrimd's sockets live (default "
	        "$KVTRIM_RUNTIME_DIR,\n"
	        "                     then $XDG_RUNTIME_DIR/kvtrim, then "
	        "/run/kvtrimd)\n"
	        "  --json             machine-readable output\n"
	        "  --timeout MS       how long to wait for the daemon "
	        "(default %d)\n"
	        "\n"
	        "exit status: 0 ok, 1 check found violations, 2 error\n",
	        CTL_DEF_TIMEOUT_MS);
}

static int ctl_open(struct ctl *c)
{
	char url[PATH_MAX + 16];
	int rv;
	snprintf(url, sizeof(url), "ipc://%s/ctl.ipc", c->dir);
	if ((rv = nng_req0_open(&c->sock)) != 0 ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME,
	                            NNG_DURATION_INFINITE)) != 0 ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO,
	                            c->timeout_ms)) != 0 ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO,
	                            c->timeout_ms)) != 0 ||
	    (rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ,
	                              IPC_MAX_MSG)) != 0 ||
	    (rv = nng_dial(c->sock, url, NULL, 0)) != 0) {
		fprintf(stderr, "kvtrimctl: cannot reach kvtrimd at %s/ctl.ipc: "
		        "%s\n", c->dir, nng_strerror(rv));
		return -1;
	}
	return 0;
}

/* One admin request; 0 with *rep filled (codec_rep_free it) or -1. */
static int ctl_call(struct ctl *c, enum ipc_op op, const char *filter,
                    struct ipc_rep *rep)
{
	struct ipc_req req;
	memset(&req, 0, sizeof(req));
	memset(rep, 0, sizeof(*rep));
	req.version = IPC_PROTO_VERSION;
	req.op = op;
	if (filter)
		snprintf(req.u.filter, sizeof(req.u.filter), "%s", filter);

	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = codec_req_encode(&req, &buf, &len);
	if (rc < 0) {
		fprintf(stderr, "kvtrimctl: cannot encode %s: %s\n",
		        codec_op_name(op), kvt_strerror(rc));
		return -1;
	}
	int rv = nng_send(c->sock, buf, len, 0);
	free(buf);
	if (rv != 0) {
		fprintf(stderr, "kvtrimctl: sending to kvtrimd at %s/ctl.ipc: "
		        "%s\n", c->dir, nng_strerror(rv));
		return -1;
	}
	nng_msg *msg = NULL;
	if ((rv = nng_recvmsg(c->sock, &msg, 0)) != 0) {
		fprintf(stderr, "kvtrimctl: no reply from kvtrimd at "
		        "%s/ctl.ipc: %s\n", c->dir, nng_strerror(rv));
		return -1;
	}
	char why[256];
	rc = codec_rep_decode(op, nng_msg_body(msg), nng_msg_len(msg), rep, why,
	                      sizeof(why));
	nng_msg_free(msg);
	if (rc < 0) {
		fprintf(stderr, "kvtrimctl: bad %s reply from kvtrimd: %s\n",
		        codec_op_name(op), why);
		return -1;
	}
	if (rep->err != 0) {
		fprintf(stderr, "kvtrimctl: %s: %s (%s)\n", codec_op_name(op),
		        rep->msg[0] ? rep->msg : kvt_strerror(rep->err),
		        kvt_errname(rep->err));
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- output */

static void json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"':
			fputs("\\\"", stdout);
			break;
		case '\\':
			fputs("\\\\", stdout);
			break;
		case '\n':
			fputs("\\n", stdout);
			break;
		case '\t':
			fputs("\\t", stdout);
			break;
		case '\r':
			fputs("\\r", stdout);
			break;
		default:
			if (*p < 0x20)
				printf("\\u%04x", *p);
			else
				putchar(*p);
		}
	}
	putchar('"');
}

/* A value as text (plain output); buf holds at least IPC_STR_MAX bytes. */
static const char *val_text(const struct ipc_val *v, char *buf, size_t len)
{
	switch (v->type) {
	case IPC_VAL_U64:
		snprintf(buf, len, "%" PRIu64, v->v.u);
		break;
	case IPC_VAL_I64:
		snprintf(buf, len, "%" PRId64, v->v.i);
		break;
	case IPC_VAL_F64:
		snprintf(buf, len, "%.6g", v->v.f);
		break;
	case IPC_VAL_STR:
		return v->v.s;
	}
	return buf;
}

static void json_val(const struct ipc_val *v)
{
	switch (v->type) {
	case IPC_VAL_U64:
		printf("%" PRIu64, v->v.u);
		break;
	case IPC_VAL_I64:
		printf("%" PRId64, v->v.i);
		break;
	case IPC_VAL_F64:
		if (isfinite(v->v.f))
			printf("%.17g", v->v.f);
		else
			fputs("null", stdout);
		break;
	case IPC_VAL_STR:
		json_str(v->v.s);
		break;
	}
}

static void json_row(const struct ipc_row *row)
{
	putchar('{');
	for (uint32_t i = 0; i < row->n; i++) {
		if (i)
			putchar(',');
		json_str(row->vals[i].key);
		putchar(':');
		json_val(&row->vals[i]);
	}
	putchar('}');
}

static void json_rows(const struct ipc_rep *rep)
{
	putchar('[');
	for (uint32_t i = 0; i < rep->table.n; i++) {
		if (i)
			putchar(',');
		json_row(&rep->table.rows[i]);
	}
	fputs("]\n", stdout);
}

/* "key value" per line for one row. */
static void plain_kv(const struct ipc_row *row)
{
	char buf[IPC_STR_MAX];
	for (uint32_t i = 0; i < row->n; i++)
		printf("%s %s\n", row->vals[i].key,
		       val_text(&row->vals[i], buf, sizeof(buf)));
}

/*
 * A table: the columns of the first row in their order (then any key a
 * later row adds), left-aligned, "-" where a row lacks a column.
 */
static void plain_table(const struct ipc_rep *rep)
{
	const char *cols[IPC_MAX_COLS];
	size_t width[IPC_MAX_COLS];
	uint32_t nc = 0;
	char buf[IPC_STR_MAX];

	for (uint32_t r = 0; r < rep->table.n; r++) {
		const struct ipc_row *row = &rep->table.rows[r];
		for (uint32_t i = 0; i < row->n && nc < IPC_MAX_COLS; i++) {
			uint32_t k;
			for (k = 0; k < nc; k++)
				if (!strcmp(cols[k], row->vals[i].key))
					break;
			if (k == nc) {
				cols[nc] = row->vals[i].key;
				width[nc++] = strlen(row->vals[i].key);
			}
			size_t w = strlen(val_text(&row->vals[i], buf,
			                           sizeof(buf)));
			if (w > width[k])
				width[k] = w;
		}
	}
	for (uint32_t k = 0; k < nc; k++)
		printf("%-*s%s", (int)width[k], cols[k],
		       k + 1 < nc ? "  " : "\n");
	for (uint32_t r = 0; r < rep->table.n; r++) {
		const struct ipc_row *row = &rep->table.rows[r];
		for (uint32_t k = 0; k < nc; k++) {
			const struct ipc_val *v = codec_row_get(row, cols[k]);
			const char *t = v ? val_text(v, buf, sizeof(buf)) : "-";
			if (k + 1 < nc)
				printf("%-*s  ", (int)width[k], t);
			else
				printf("%s\n", t);
		}
	}
}

/* ---------------------------------------------------------------- commands */

/* Does a tenants row belong to `who` (its name, or its id in decimal)? */
static int row_is(const struct ipc_row *row, const char *who)
{
	const struct ipc_val *name = codec_row_get(row, "name");
	const struct ipc_val *id = codec_row_get(row, "id");
	char buf[32];
	if (name && name->type == IPC_VAL_STR && !strcmp(name->v.s, who))
		return 1;
	return id && id->type == IPC_VAL_U64 &&
	       !strcmp(val_text(id, buf, sizeof(buf)), who);
}

/*
 * Daemon-wide stats, or one tenant's row.  The tenant's row comes from the
 * tenants op, filtered here: it carries every per-tenant counter, and the
 * filter then works whatever the daemon does with stats' optional "tenant".
 */
static int cmd_stats(struct ctl *c, const char *tenant)
{
	struct ipc_rep rep;
	if (ctl_call(c, tenant ? IPC_OP_TENANTS : IPC_OP_STATS, NULL,
	             &rep) < 0) {
		codec_rep_free(&rep);
		return 2;
	}
	const struct ipc_row *row = NULL;
	for (uint32_t i = 0; i < rep.table.n && !row; i++)
		if (!tenant || row_is(&rep.table.rows[i], tenant))
			row = &rep.table.rows[i];
	int rc = 0;
	if (!row) {
		if (tenant)
			fprintf(stderr, "kvtrimctl: stats: no tenant named %s\n",
			        tenant);
		else
			fprintf(stderr, "kvtrimctl: stats: empty reply\n");
		rc = 2;
	} else if (c->json) {
		json_row(row);
		putchar('\n');
	} else {
		plain_kv(row);
	}
	codec_rep_free(&rep);
	return rc;
}

static int cmd_rows(struct ctl *c, enum ipc_op op, const char *filter)
{
	struct ipc_rep rep;
	if (ctl_call(c, op, filter, &rep) < 0) {
		codec_rep_free(&rep);
		return 2;
	}
	if (c->json) {
		json_rows(&rep);
	} else if (op == IPC_OP_POLICIES) {
		for (uint32_t i = 0; i < rep.table.n; i++) {
			const struct ipc_row *row = &rep.table.rows[i];
			const struct ipc_val *n = codec_row_get(row, "name");
			const struct ipc_val *h = codec_row_get(row, "help");
			printf("%-12s %s\n",
			       n && n->type == IPC_VAL_STR ? n->v.s : "?",
			       h && h->type == IPC_VAL_STR ? h->v.s : "");
		}
	} else if (op == IPC_OP_CONFIG) {
		for (uint32_t i = 0; i < rep.table.n; i++) {
			const struct ipc_row *row = &rep.table.rows[i];
			const struct ipc_val *k = codec_row_get(row, "key");
			const struct ipc_val *v = codec_row_get(row, "value");
			char buf[IPC_STR_MAX];
			printf("%s %s\n",
			       k && k->type == IPC_VAL_STR ? k->v.s : "?",
			       v ? val_text(v, buf, sizeof(buf)) : "");
		}
	} else {
		plain_table(&rep);
	}
	codec_rep_free(&rep);
	return 0;
}

static int cmd_check(struct ctl *c)
{
	struct ipc_rep rep;
	if (ctl_call(c, IPC_OP_CHECK, NULL, &rep) < 0) {
		codec_rep_free(&rep);
		return 2;
	}
	if (rep.table.n < 1) {
		fprintf(stderr, "kvtrimctl: check: empty reply\n");
		codec_rep_free(&rep);
		return 2;
	}
	const struct ipc_row *row = &rep.table.rows[0];
	const struct ipc_val *ok = codec_row_get(row, "ok");
	const struct ipc_val *nv = codec_row_get(row, "violations");
	const struct ipc_val *detail = codec_row_get(row, "detail");
	int clean = ok && ((ok->type == IPC_VAL_U64 && ok->v.u == 1) ||
	                   (ok->type == IPC_VAL_I64 && ok->v.i == 1));
	if (c->json) {
		json_row(row);
		putchar('\n');
	} else if (clean) {
		puts("ok");
	} else {
		char buf[IPC_STR_MAX];
		printf("%s violation(s): %s\n",
		       nv ? val_text(nv, buf, sizeof(buf)) : "?",
		       detail && detail->type == IPC_VAL_STR ? detail->v.s
		                                             : "(no detail)");
	}
	codec_rep_free(&rep);
	return clean ? 0 : 1;
}

int main(int argc, char **argv)
{
	struct ctl c = { .timeout_ms = CTL_DEF_TIMEOUT_MS };
	const char *dir = NULL;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(a, "--json")) {
			c.json = 1;
		} else if (!strcmp(a, "--runtime-dir") && i + 1 < argc) {
			dir = argv[++i];
		} else if (!strcmp(a, "--timeout") && i + 1 < argc) {
			char *end = NULL;
			errno = 0;
			long v = strtol(argv[++i], &end, 10);
			if (errno || *end || v <= 0 || v > INT_MAX) {
				fprintf(stderr, "kvtrimctl: --timeout needs a "
				        "positive number of milliseconds\n");
				return 2;
			}
			c.timeout_ms = (int)v;
		} else {
			fprintf(stderr, "kvtrimctl: unknown or incomplete option "
			        "%s (see --help)\n", a);
			return 2;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[i++];
	const char *arg = i < argc ? argv[i++] : NULL;
	if (i < argc) {
		fprintf(stderr, "kvtrimctl: too many arguments (see --help)\n");
		return 2;
	}
	int takes_arg = !strcmp(cmd, "stats") || !strcmp(cmd, "config");
	if (arg && !takes_arg) {
		fprintf(stderr, "kvtrimctl: %s takes no argument\n", cmd);
		return 2;
	}
	if (arg && strlen(arg) >= KVT_NAME_MAX) {
		fprintf(stderr, "kvtrimctl: %s is longer than %d bytes\n", arg,
		        KVT_NAME_MAX - 1);
		return 2;
	}
	enum ipc_op op = IPC_OP_NONE;
	if (!strcmp(cmd, "stats"))
		op = IPC_OP_STATS;
	else if (!strcmp(cmd, "tenants"))
		op = IPC_OP_TENANTS;
	else if (!strcmp(cmd, "check"))
		op = IPC_OP_CHECK;
	else if (!strcmp(cmd, "policies"))
		op = IPC_OP_POLICIES;
	else if (!strcmp(cmd, "config"))
		op = IPC_OP_CONFIG;
	else {
		fprintf(stderr, "kvtrimctl: unknown command %s (see --help)\n",
		        cmd);
		return 2;
	}

	rundir_resolve(dir, c.dir, sizeof(c.dir));
	if (ctl_open(&c) < 0)
		return 2;
	int rc;
	switch (op) {
	case IPC_OP_STATS:
		rc = cmd_stats(&c, arg);
		break;
	case IPC_OP_CHECK:
		rc = cmd_check(&c);
		break;
	default:
		rc = cmd_rows(&c, op, arg);
		break;
	}
	if (fflush(stdout) != 0 && rc == 0)
		rc = 2;
	nng_close(c.sock);
	return rc;
}
