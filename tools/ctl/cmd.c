/*
 * cmd.c — the one-shot commands: stats, tenants, policies, config,
 * check, drain, and metrics (GET /metrics over stats.sock).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl.h"
#include "kvtrim.h"

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
 * A name several tenants share is refused (exit 2) with their ids.
 */
int cmd_stats(struct ctl *c, const char *tenant)
{
	struct ipc_rep rep;
	if (ctl_call(c, tenant ? IPC_OP_TENANTS : IPC_OP_STATS, NULL,
	             &rep) < 0)
		return 2;
	const struct ipc_row *row = NULL;
	uint32_t n = 0;
	char ids[256] = "";
	for (uint32_t i = 0; i < rep.table.n; i++) {
		if (tenant && !row_is(&rep.table.rows[i], tenant))
			continue;
		if (!row)
			row = &rep.table.rows[i];
		const struct ipc_val *id = codec_row_get(&rep.table.rows[i],
		                                         "id");
		size_t at = strlen(ids);
		if (id && id->type == IPC_VAL_U64 && at < sizeof(ids) - 24)
			snprintf(ids + at, sizeof(ids) - at, "%s%" PRIu64,
			         n ? ", " : "", id->v.u);
		n++;
		if (!tenant)
			break;
	}
	int rc = 0;
	if (n > 1) {
		/* Names may repeat; one of them picked silently would show
		 * another engine's counters. */
		fprintf(stderr, "kvtrimctl: stats: %u tenants are named %s "
		        "(ids %s): give the id\n", (unsigned)n, tenant, ids);
		rc = 2;
	} else if (!row) {
		if (tenant)
			fprintf(stderr, "kvtrimctl: stats: no tenant named %s\n",
			        tenant);
		else
			fprintf(stderr, "kvtrimctl: stats: empty reply\n");
		rc = 2;
	} else if (c->json) {
		out_json_row(row);
		putchar('\n');
	} else {
		out_plain_kv(row);
	}
	codec_rep_free(&rep);
	return rc;
}

/* ------------------------------------------------------------- row replies */

/* The plain renderings of one row of the replies that have their own. */
static void policy_row(const struct ctl *c, const struct ipc_row *row)
{
	const struct ipc_val *n = codec_row_get(row, "name");
	const struct ipc_val *h = codec_row_get(row, "help");
	printf("%-12s %s\n", n && n->type == IPC_VAL_STR ? n->v.s : "?",
	       h && h->type == IPC_VAL_STR ? h->v.s : "");
}

static void config_row(const struct ctl *c, const struct ipc_row *row)
{
	const struct ipc_val *k = codec_row_get(row, "key");
	const struct ipc_val *v = codec_row_get(row, "value");
	char buf[IPC_STR_MAX];
	printf("%s %s\n", k && k->type == IPC_VAL_STR ? k->v.s : "?",
	       v ? out_val_text(v, buf, sizeof(buf)) : "");
}

/* config set answers the key and its new value, both strings. */
static void config_set_row(const struct ctl *c, const struct ipc_row *row)
{
	const struct ipc_val *k = codec_row_get(row, "key");
	const struct ipc_val *v = codec_row_get(row, "value");
	printf("%s %s\n", k && k->type == IPC_VAL_STR ? k->v.s : "?",
	       v && v->type == IPC_VAL_STR ? v->v.s : "?");
}

static void drain_row(const struct ctl *c, const struct ipc_row *row)
{
	const struct ipc_val *id = codec_row_get(row, "id");
	const struct ipc_val *n = codec_row_get(row, "name");
	printf("tenant %" PRIu64 " '%s' %s\n",
	       id && id->type == IPC_VAL_U64 ? id->v.u : 0,
	       n && n->type == IPC_VAL_STR ? n->v.s : "?",
	       c->undo ? "admits new sequences again"
	               : "draining: no new sequences, open ones continue");
}

/* Prints a reply and frees it: its rows as JSON with --json, else each
 * row through plain (NULL: the generic table); exit status 0. */
static int print_rows(const struct ctl *c, struct ipc_rep *rep,
                      void (*plain)(const struct ctl *c,
                                    const struct ipc_row *row))
{
	if (c->json)
		out_json_rows(rep);
	else if (!plain)
		out_plain_table(rep);
	else
		for (uint32_t i = 0; i < rep->table.n; i++)
			plain(c, &rep->table.rows[i]);
	codec_rep_free(rep);
	return 0;
}

int cmd_rows(struct ctl *c, enum ipc_op op, const char *filter)
{
	struct ipc_rep rep;
	if (ctl_call(c, op, filter, &rep) < 0)
		return 2;
	return print_rows(c, &rep, op == IPC_OP_POLICIES ? policy_row
	                           : op == IPC_OP_CONFIG ? config_row
	                                                 : NULL);
}

int cmd_check(struct ctl *c)
{
	struct ipc_rep rep;
	if (ctl_call(c, IPC_OP_CHECK, NULL, &rep) < 0)
		return 2;
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
		out_json_row(row);
		putchar('\n');
	} else if (clean) {
		puts("ok");
	} else {
		char buf[IPC_STR_MAX];
		printf("%s violation(s): %s\n",
		       nv ? out_val_text(nv, buf, sizeof(buf)) : "?",
		       detail && detail->type == IPC_VAL_STR ? detail->v.s
		                                             : "(no detail)");
	}
	codec_rep_free(&rep);
	return clean ? 0 : 1;
}

int cmd_config_set(struct ctl *c, const char *key, const char *val)
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
	if (ctl_send(c, &req, &rep) < 0)
		return 2;
	return print_rows(c, &rep, config_set_row);
}

int cmd_drain(struct ctl *c, const char *tenant)
{
	struct ipc_req req;
	struct ipc_rep rep;
	memset(&req, 0, sizeof(req));
	req.op = IPC_OP_DRAIN;
	snprintf(req.u.drain.tenant, sizeof(req.u.drain.tenant), "%s", tenant);
	req.u.drain.undo = (uint32_t)c->undo;
	if (ctl_send(c, &req, &rep) < 0)
		return 2;
	return print_rows(c, &rep, drain_row);
}


/* ---------------------------------------------------------------- metrics */

/* GET /metrics over stats.sock with a plain HTTP/1.0 request (no curl
 * needed on a minimal host); prints the body. */
int cmd_metrics(struct ctl *c)
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
