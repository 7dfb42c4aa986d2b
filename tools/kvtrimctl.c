/*
 * kvtrimctl.c — the operator's command line for kvtrimd.
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
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "codec.h"
#include "rundir.h"
#include "kvtrim.h"

#define CTL_DEF_TIMEOUT_MS 5000
#define CTL_DEF_INTERVAL_MS 1000
#define CTL_MAX_ARGS 3

struct ctl {
	char dir[PATH_MAX];
	int json;
	int timeout_ms;
	long iterations;  /* top: 0 = until interrupted */
	long interval_ms; /* top */
	int undo;         /* drain --undo */
	nng_socket sock;
};

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
		        "%s (is kvtrimd running with this runtime dir? see "
		        "--runtime-dir)\n", c->dir, nng_strerror(rv));
		return -1;
	}
	return 0;
}

/* One admin request; 0 with *rep filled (codec_rep_free it) or -1. */
static int ctl_send(struct ctl *c, const struct ipc_req *rq,
                    struct ipc_rep *rep);

static int ctl_call(struct ctl *c, enum ipc_op op, const char *filter,
                    struct ipc_rep *rep)
{
	struct ipc_req req;
	memset(&req, 0, sizeof(req));
	req.op = op;
	if (filter)
		snprintf(req.u.filter, sizeof(req.u.filter), "%s", filter);
	return ctl_send(c, &req, rep);
}

static int ctl_send(struct ctl *c, const struct ipc_req *rq,
                    struct ipc_rep *rep)
{
	struct ipc_req req = *rq;
	enum ipc_op op = req.op;
	memset(rep, 0, sizeof(*rep));
	req.version = IPC_PROTO_VERSION;

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

static void json_array(const struct ipc_rep *rep)
{
	putchar('[');
	for (uint32_t i = 0; i < rep->table.n; i++) {
		if (i)
			putchar(',');
		json_row(&rep->table.rows[i]);
	}
	putchar(']');
}

static void json_rows(const struct ipc_rep *rep)
{
	json_array(rep);
	putchar('\n');
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

/* Does a tenants row belong to `who`?  All digits: its id in decimal;
 * anything else: its name (names never start with a digit), as kvtrimd
 * matches `drain`. */
static int row_is(const struct ipc_row *row, const char *who)
{
	const struct ipc_val *name = codec_row_get(row, "name");
	const struct ipc_val *id = codec_row_get(row, "id");
	size_t nd = strspn(who, "0123456789");
	if (nd && !who[nd])
		return id && id->type == IPC_VAL_U64 &&
		       id->v.u == strtoull(who, NULL, 10);
	return name && name->type == IPC_VAL_STR && !strcmp(name->v.s, who);
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

static int cmd_config_set(struct ctl *c, const char *key, const char *val)
{
	struct ipc_req req;
	struct ipc_rep rep;
	memset(&req, 0, sizeof(req));
	req.op = IPC_OP_CONFIG_SET;
	if (strlen(key) >= sizeof(req.u.set.key) ||
	    strlen(val) >= sizeof(req.u.set.value)) {
		fprintf(stderr, "kvtrimctl: config set: key or value too long\n");
		return 2;
	}
	snprintf(req.u.set.key, sizeof(req.u.set.key), "%s", key);
	snprintf(req.u.set.value, sizeof(req.u.set.value), "%s", val);
	if (ctl_send(c, &req, &rep) < 0) {
		codec_rep_free(&rep);
		return 2;
	}
	if (c->json) {
		json_rows(&rep);
	} else {
		for (uint32_t i = 0; i < rep.table.n; i++) {
			const struct ipc_val *k =
				codec_row_get(&rep.table.rows[i], "key");
			const struct ipc_val *v =
				codec_row_get(&rep.table.rows[i], "value");
			printf("%s %s\n", k && k->type == IPC_VAL_STR ? k->v.s : "?",
			       v && v->type == IPC_VAL_STR ? v->v.s : "?");
		}
	}
	codec_rep_free(&rep);
	return 0;
}

static int cmd_drain(struct ctl *c, const char *tenant)
{
	struct ipc_req req;
	struct ipc_rep rep;
	memset(&req, 0, sizeof(req));
	req.op = IPC_OP_DRAIN;
	snprintf(req.u.drain.tenant, sizeof(req.u.drain.tenant), "%s", tenant);
	req.u.drain.undo = (uint32_t)c->undo;
	if (ctl_send(c, &req, &rep) < 0) {
		codec_rep_free(&rep);
		return 2;
	}
	if (c->json) {
		json_rows(&rep);
	} else {
		for (uint32_t i = 0; i < rep.table.n; i++) {
			const struct ipc_row *row = &rep.table.rows[i];
			const struct ipc_val *id = codec_row_get(row, "id");
			const struct ipc_val *n = codec_row_get(row, "name");
			printf("tenant %" PRIu64 " '%s' %s\n",
			       id && id->type == IPC_VAL_U64 ? id->v.u : 0,
			       n && n->type == IPC_VAL_STR ? n->v.s : "?",
			       c->undo ? "admits new sequences again"
			               : "draining: no new sequences, open ones "
			                 "continue");
		}
	}
	codec_rep_free(&rep);
	return 0;
}

/* ---------------------------------------------------------------- top */

static uint64_t row_u64(const struct ipc_row *row, const char *key)
{
	const struct ipc_val *v = codec_row_get(row, key);
	if (!v)
		return 0;
	if (v->type == IPC_VAL_U64)
		return v->v.u;
	if (v->type == IPC_VAL_I64 && v->v.i > 0)
		return (uint64_t)v->v.i;
	if (v->type == IPC_VAL_F64 && v->v.f > 0)
		return (uint64_t)v->v.f;
	return 0;
}

static double row_f64(const struct ipc_row *row, const char *key)
{
	const struct ipc_val *v = codec_row_get(row, key);
	if (!v)
		return 0;
	return v->type == IPC_VAL_F64 ? v->v.f
	       : v->type == IPC_VAL_U64 ? (double)v->v.u
	       : v->type == IPC_VAL_I64 ? (double)v->v.i : 0;
}

static const char *row_str(const struct ipc_row *row, const char *key)
{
	const struct ipc_val *v = codec_row_get(row, key);
	return v && v->type == IPC_VAL_STR ? v->v.s : "";
}

static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.1fG", (double)b / (1ull << 30));
	else if (b >= (1ull << 20))
		snprintf(buf, len, "%.1fM", (double)b / (1ull << 20));
	else
		snprintf(buf, len, "%.1fK", (double)b / 1024);
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Previous sample of one tenant, for rates. */
struct top_prev {
	uint64_t id, syncs, evicted;
};

static const struct top_prev *top_find(const struct top_prev *p, size_t n,
                                       uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (p[i].id == id)
			return &p[i];
	return NULL;
}

static int top_cmp(const void *a, const void *b)
{
	const struct ipc_row *x = a, *y = b;
	uint64_t cx = row_u64(x, "chunks"), cy = row_u64(y, "chunks");
	if (cx != cy)
		return cx < cy ? 1 : -1;
	uint64_t ix = row_u64(x, "id"), iy = row_u64(y, "id");
	return ix < iy ? -1 : ix > iy;
}

/*
 * A refreshing view like top(1): one header of pool-wide numbers, then a
 * line per tenant, biggest holder first.  Rates are per second over the
 * last interval ("-" on the first screen).  The screen is cleared only
 * when stdout is a terminal, so `top --iterations N > file` logs plainly.
 */
static int cmd_top(struct ctl *c)
{
	struct top_prev *prev = NULL;
	size_t n_prev = 0;
	uint64_t prev_syncs = 0, prev_err = 0;
	double prev_t = 0;
	int tty = isatty(STDOUT_FILENO);
	int rc = 0;

	for (long it = 0; !c->iterations || it < c->iterations; it++) {
		struct ipc_rep st, tn;
		if (it) {
			struct timespec ts = {c->interval_ms / 1000,
			                      (c->interval_ms % 1000) * 1000000L};
			nanosleep(&ts, NULL);
		}
		if (ctl_call(c, IPC_OP_STATS, NULL, &st) < 0) {
			codec_rep_free(&st);
			rc = 2;
			break;
		}
		if (ctl_call(c, IPC_OP_TENANTS, NULL, &tn) < 0) {
			codec_rep_free(&st);
			codec_rep_free(&tn);
			rc = 2;
			break;
		}
		double now = mono_s(), dt = it ? now - prev_t : 0;
		const struct ipc_row *g = st.table.n ? &st.table.rows[0] : NULL;
		if (!g) {
			fprintf(stderr, "kvtrimctl: top: empty stats reply\n");
			codec_rep_free(&st);
			codec_rep_free(&tn);
			rc = 2;
			break;
		}
		if (tn.table.n > 1)
			qsort(tn.table.rows, tn.table.n, sizeof(*tn.table.rows),
			      top_cmp);
		uint64_t syncs = row_u64(g, "syncs_total");
		uint64_t errs = row_u64(g, "errors_total");
		if (c->json) {
			fputs("{\"stats\":", stdout);
			json_row(g);
			fputs(",\"tenants\":", stdout);
			json_array(&tn);
			fputs("}\n", stdout);
		} else {
			char used[32], total[32], rate[32], erate[32];
			uint64_t up = row_u64(g, "uptime_seconds");
			fmt_bytes(used, sizeof(used), row_u64(g, "pool_bytes_used"));
			fmt_bytes(total, sizeof(total),
			          row_u64(g, "pool_bytes_total"));
			if (dt > 0) {
				snprintf(rate, sizeof(rate), "%.0f",
				         (double)(syncs - prev_syncs) / dt);
				snprintf(erate, sizeof(erate), "%.0f",
				         (double)(errs - prev_err) / dt);
			} else {
				snprintf(rate, sizeof(rate), "-");
				snprintf(erate, sizeof(erate), "-");
			}
			if (tty)
				fputs("\033[H\033[2J", stdout);
			printf("kvtrimd %s (%s)  up %" PRIu64 "h%02" PRIu64 "m%02"
			       PRIu64 "s  %s\n", row_str(g, "version"),
			       row_str(g, "backend"), up / 3600, up / 60 % 60,
			       up % 60, c->dir);
			printf("pool %s / %s (%.0f%%)  tenants %" PRIu64
			       "  sequences %" PRIu64 "  clients %" PRIu64
			       "  pressure %.2f  parked %" PRIu64 "\n",
			       used, total, 100 * row_f64(g, "pool_use_ratio"),
			       row_u64(g, "tenants"), row_u64(g, "sequences"),
			       row_u64(g, "clients_connected"),
			       row_f64(g, "pressure_level"),
			       row_u64(g, "parked_requests"));
			printf("syncs/s %s  errors/s %s  evicted %" PRIu64
			       "  backpressure waits %" PRIu64 " timeouts %"
			       PRIu64 "\n\n", rate, erate,
			       row_u64(g, "entries_evicted_total"),
			       row_u64(g, "backpressure_waits_total"),
			       row_u64(g, "backpressure_timeouts_total"));
			printf("%5s %-16s %7s %-18s %5s %7s %6s %6s %8s %6s %8s "
			       "%5s\n", "ID", "NAME", "PID", "POLICY", "SEQS",
			       "PAGES", "HELD", "QUOTA%", "KEPT", "RATIO",
			       "SYNC/s", "FLAGS");
			for (uint32_t i = 0; i < tn.table.n; i++) {
				const struct ipc_row *r = &tn.table.rows[i];
				uint64_t id = row_u64(r, "id");
				uint64_t q = row_u64(r, "quota_bytes");
				const struct top_prev *p =
					top_find(prev, n_prev, id);
				char held[32], srate[32];
				fmt_bytes(held, sizeof(held), row_u64(r, "bytes"));
				if (p && dt > 0)
					snprintf(srate, sizeof(srate), "%.0f",
					         (double)(row_u64(r, "syncs") -
					                  p->syncs) / dt);
				else
					snprintf(srate, sizeof(srate), "-");
				printf("%5" PRIu64 " %-16.16s %7" PRIu64
				       " %-18.18s %5" PRIu64 " %7" PRIu64
				       " %6s %5.0f%% %8" PRIu64 " %6.2f %8s "
				       "%5s\n", id, row_str(r, "name"),
				       row_u64(r, "pid"), row_str(r, "policy"),
				       row_u64(r, "sequences"),
				       row_u64(r, "pages_used"), held,
				       q ? 100.0 * (double)row_u64(r, "bytes") /
				                   (double)q
				         : 0.0,
				       row_u64(r, "entries_kept"),
				       row_f64(r, "compression_ratio"), srate,
				       row_u64(r, "draining") ? "D" : "");
			}
			if (!tn.table.n)
				puts("  (no tenants)");
		}
		fflush(stdout);
		struct top_prev *np = calloc(tn.table.n ? tn.table.n : 1,
		                             sizeof(*np));
		if (np) {
			for (uint32_t i = 0; i < tn.table.n; i++)
				np[i] = (struct top_prev){
					row_u64(&tn.table.rows[i], "id"),
					row_u64(&tn.table.rows[i], "syncs"),
					row_u64(&tn.table.rows[i],
					        "entries_evicted")};
			free(prev);
			prev = np;
			n_prev = tn.table.n;
		}
		prev_syncs = syncs;
		prev_err = errs;
		prev_t = now;
		codec_rep_free(&st);
		codec_rep_free(&tn);
	}
	free(prev);
	return rc;
}

/* ---------------------------------------------------------------- metrics */

/* GET /metrics over stats.sock with a plain HTTP/1.0 request (no curl
 * needed on a minimal host); prints the body. */
static int cmd_metrics(struct ctl *c)
{
	struct sockaddr_un sa;
	char path[PATH_MAX + 16];
	snprintf(path, sizeof(path), "%s/stats.sock", c->dir);
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "kvtrimctl: %s: path too long\n", path);
		return 2;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		fprintf(stderr, "kvtrimctl: cannot reach kvtrimd's stats socket "
		        "at %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 2;
	}
	struct timeval tv = {c->timeout_ms / 1000, (c->timeout_ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	static const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n"
	                          "\r\n";
	if (write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
		fprintf(stderr, "kvtrimctl: writing to %s: %s\n", path,
		        strerror(errno));
		close(fd);
		return 2;
	}
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (!buf) {
			close(fd);
			fprintf(stderr, "kvtrimctl: out of memory\n");
			return 2;
		}
		if (n + 1 >= cap) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb)
				free(buf);
			buf = nb;
			continue;
		}
		ssize_t r = read(fd, buf + n, cap - 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = '\0';
	char *body = strstr(buf, "\r\n\r\n");
	if (strncmp(buf, "HTTP/1.", 7) || !body || strncmp(buf + 8, " 200", 4)) {
		fprintf(stderr, "kvtrimctl: bad answer from %s: %.60s\n", path,
		        buf);
		free(buf);
		return 2;
	}
	fputs(body + 4, stdout);
	free(buf);
	return 0;
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

int main(int argc, char **argv)
{
	struct ctl c = {.timeout_ms = CTL_DEF_TIMEOUT_MS,
	                .interval_ms = CTL_DEF_INTERVAL_MS};
	const char *dir = NULL, *pos[CTL_MAX_ARGS + 2];
	int npos = 0, iter_set = 0, interval_set = 0;
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
			c.json = 1;
		} else if (opts && !strcmp(a, "--undo")) {
			c.undo = 1;
		} else if (opts && !strcmp(a, "--runtime-dir") && i + 1 < argc) {
			dir = argv[++i];
		} else if (opts && !strcmp(a, "--timeout") && i + 1 < argc) {
			if (parse_long(a, argv[++i], 1, INT_MAX, &v))
				return 2;
			c.timeout_ms = (int)v;
		} else if (opts && !strcmp(a, "--iterations") && i + 1 < argc) {
			if (parse_long(a, argv[++i], 1, LONG_MAX, &c.iterations))
				return 2;
			iter_set = 1;
		} else if (opts && !strcmp(a, "--interval") && i + 1 < argc) {
			if (parse_long(a, argv[++i], 10, 3600000, &c.interval_ms))
				return 2;
			interval_set = 1;
		} else if (opts && a[0] == '-' && a[1]) {
			fprintf(stderr, "kvtrimctl: unknown or incomplete option "
			        "%s (see --help)\n", a);
			return 2;
		} else if (npos < CTL_MAX_ARGS + 1) {
			pos[npos++] = a;
		} else {
			fprintf(stderr, "kvtrimctl: too many arguments (see "
			        "--help)\n");
			return 2;
		}
	}
	if (!npos) {
		usage(stderr);
		return 2;
	}
	const char *cmd = pos[0];
	int nargs = npos - 1;
	const char *a1 = nargs > 0 ? pos[1] : NULL;
	const char *a2 = nargs > 1 ? pos[2] : NULL;

	/* Validate the command and its arguments before connecting. */
	enum { C_STATS, C_TOP, C_TENANTS, C_CGET, C_CSET, C_CHECK, C_DRAIN,
	       C_POLICIES, C_METRICS } which;
	int min = 0, max = 0;
	if (!strcmp(cmd, "stats")) {
		which = C_STATS, max = 1;
	} else if (!strcmp(cmd, "top")) {
		which = C_TOP;
	} else if (!strcmp(cmd, "tenants")) {
		which = C_TENANTS;
	} else if (!strcmp(cmd, "config")) {
		if (a1 && !strcmp(a1, "set")) {
			which = C_CSET, min = max = 3;
		} else if (a1 && !strcmp(a1, "get")) {
			which = C_CGET, max = 2;
			a1 = a2;
		} else {
			which = C_CGET, max = 1;
		}
	} else if (!strcmp(cmd, "check")) {
		which = C_CHECK;
	} else if (!strcmp(cmd, "drain")) {
		which = C_DRAIN, min = max = 1;
	} else if (!strcmp(cmd, "undrain")) {
		which = C_DRAIN, min = max = 1;
		c.undo = 1;
	} else if (!strcmp(cmd, "policies")) {
		which = C_POLICIES;
	} else if (!strcmp(cmd, "metrics")) {
		which = C_METRICS;
	} else {
		fprintf(stderr, "kvtrimctl: unknown command '%s' (commands: "
		        "stats, top, tenants, config, check, drain, policies, "
		        "metrics; see --help)\n", cmd);
		return 2;
	}
	if (nargs < min || nargs > max) {
		if (which == C_CSET)
			fprintf(stderr, "kvtrimctl: usage: config set KEY VALUE\n");
		else if (which == C_DRAIN)
			fprintf(stderr, "kvtrimctl: usage: %s TENANT (name or "
			        "id)\n", cmd);
		else if (!max)
			fprintf(stderr, "kvtrimctl: %s takes no argument\n", cmd);
		else
			fprintf(stderr, "kvtrimctl: too many arguments for %s "
			        "(see --help)\n", cmd);
		return 2;
	}
	if ((iter_set || interval_set) && which != C_TOP) {
		fprintf(stderr, "kvtrimctl: --iterations and --interval are for "
		        "top\n");
		return 2;
	}
	if (c.undo && which != C_DRAIN) {
		fprintf(stderr, "kvtrimctl: --undo is for drain\n");
		return 2;
	}
	const char *name_arg = which == C_CSET ? pos[2] : a1;
	if (name_arg && strlen(name_arg) >= KVT_NAME_MAX) {
		fprintf(stderr, "kvtrimctl: '%s' is longer than %d bytes\n",
		        name_arg, KVT_NAME_MAX - 1);
		return 2;
	}

	rundir_resolve(dir, c.dir, sizeof(c.dir));
	if (which == C_METRICS) {
		int rc = cmd_metrics(&c);
		if (fflush(stdout) != 0 && rc == 0)
			rc = 2;
		return rc;
	}
	if (ctl_open(&c) < 0)
		return 2;
	int rc;
	switch (which) {
	case C_STATS:
		rc = cmd_stats(&c, a1);
		break;
	case C_TOP:
		rc = cmd_top(&c);
		break;
	case C_TENANTS:
		rc = cmd_rows(&c, IPC_OP_TENANTS, NULL);
		break;
	case C_CGET:
		rc = cmd_rows(&c, IPC_OP_CONFIG, a1);
		break;
	case C_CSET:
		rc = cmd_config_set(&c, pos[2], pos[3]);
		break;
	case C_CHECK:
		rc = cmd_check(&c);
		break;
	case C_DRAIN:
		rc = cmd_drain(&c, a1);
		break;
	case C_POLICIES:
		rc = cmd_rows(&c, IPC_OP_POLICIES, NULL);
		break;
	default:
		rc = 2;
		break;
	}
	if (fflush(stdout) != 0 && rc == 0)
		rc = 2;
	nng_close(c.sock);
	return rc;
}
