/*
 * ctl.h — what the files of kvtrimctl share: the session (struct ctl), the
 * request helpers (ctl.c), the output helpers (out.c) and the commands
 * (cmd.c, cmd_top.c) that main.c dispatches to.
 *
 * Files: main.c (usage, options, dispatch), ctl.c (the nng req0 session
 * with kvtrimd's control socket), out.c (JSON and plain renderings of
 * reply rows), cmd.c (stats, tenants, policies, config, check, drain,
 * metrics), cmd_top.c (the refreshing top view).  A command returns the
 * process exit status (0 ok, 1 check found violations, 2 error).
 */
#ifndef KVT_CTL_H
#define KVT_CTL_H

#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#include <nng/nng.h>

#include "codec.h"

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

/* ctl.c: dials ctl.ipc (0, or -1 after printing why). */
int ctl_open(struct ctl *c);
/* One admin request; 0 with *rep filled (codec_rep_free it) or -1 after
 * printing why (encode, send, receive, decode or an error reply), *rep
 * then already freed. */
int ctl_send(struct ctl *c, const struct ipc_req *rq, struct ipc_rep *rep);
/* ctl_send of a request with only op and an optional filter. */
int ctl_call(struct ctl *c, enum ipc_op op, const char *filter,
             struct ipc_rep *rep);

/* out.c */
const char *out_val_text(const struct ipc_val *v, char *buf, size_t len);
void out_json_row(const struct ipc_row *row);
void out_json_array(const struct ipc_rep *rep);
void out_json_rows(const struct ipc_rep *rep);
void out_plain_kv(const struct ipc_row *row);
void out_plain_table(const struct ipc_rep *rep);

/* cmd.c, cmd_top.c */
int cmd_stats(struct ctl *c, const char *tenant);
int cmd_rows(struct ctl *c, enum ipc_op op, const char *filter);
int cmd_check(struct ctl *c);
int cmd_config_set(struct ctl *c, const char *key, const char *val);
int cmd_drain(struct ctl *c, const char *tenant);
int cmd_metrics(struct ctl *c);
int cmd_top(struct ctl *c);

#endif
