/*
 * ctl.c — kvtrimctl's session with kvtrimd: nng req0 on ctl.ipc, one
 * admin request at a time, every failure printed with what to check.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "ctl.h"
#include "kvtrim.h"

int ctl_open(struct ctl *c)
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


int ctl_call(struct ctl *c, enum ipc_op op, const char *filter,
                    struct ipc_rep *rep)
{
	struct ipc_req req;
	memset(&req, 0, sizeof(req));
	req.op = op;
	if (filter)
		snprintf(req.u.filter, sizeof(req.u.filter), "%s", filter);
	return ctl_send(c, &req, rep);
}

/* ctl_send without the free on failure. */
static int send_once(struct ctl *c, const struct ipc_req *rq,
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

int ctl_send(struct ctl *c, const struct ipc_req *rq, struct ipc_rep *rep)
{
	int rc = send_once(c, rq, rep);
	if (rc < 0)
		codec_rep_free(rep);
	return rc;
}
