/*
 * rpc.c — libkvtrim's control plane: one request/reply on the nng req0
 * socket (client_rpc), the handle-channel packets drained after each reply,
 * and liveness: the pipe callback that ends every wait when the daemon goes
 * away.  See client.h; the ordering contract is in client.c.
 */
#include "client.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"

void
client_set_err(kvt_client *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
	va_end(ap);
}

void client_begin(kvt_client *c)
{
	c->last_error[0] = '\0';
}

int client_from_nng(int rv)
{
	switch (rv) {
	case 0:
		return 0;
	case NNG_ETIMEDOUT:
		return KVT_ETIMEDOUT;
	case NNG_ENOMEM:
		return KVT_ENOMEM;
	case NNG_EMSGSIZE:
		return KVT_ETOOBIG;
	case NNG_EINVAL:
		return KVT_EINVAL;
	case NNG_ECLOSED:
	case NNG_ECONNREFUSED:
	case NNG_ECONNSHUT:
	case NNG_ECONNRESET:
	case NNG_ECONNABORTED:
	case NNG_ECANCELED:
	case NNG_ENOENT:
	case NNG_EADDRINVAL:
	case NNG_EPEERAUTH:
		return KVT_ECONN;
	default:
		return KVT_ESYS;
	}
}

int client_rep_code(int32_t e)
{
	if (e == 0)
		return 0;
	if (e > 0 || !strcmp(kvt_errname(e), "E?"))
		return KVT_EPROTO;
	return e;
}

void client_req_init(const kvt_client *c, enum ipc_op op, struct ipc_req *req)
{
	memset(req, 0, sizeof(*req));
	req->version = IPC_PROTO_VERSION;
	req->op = op;
	if (!codec_op_is_admin(op) && op != IPC_OP_HELLO) {
		req->tenant = c->tenant;
		req->token = c->token;
	}
}

/* Confirms the legacy-IPC chunks closed since the last call: only then may
 * the daemon free them.  A failed send is the daemon's hang-up, which the
 * next receive reports. */
static void send_acks(kvt_client *c)
{
	for (uint32_t i = 0; i < c->mem.n_acks; i++) {
		struct handle_ext x;
		memset(&x, 0, sizeof(x));
		x.h.magic = HANDLE_MAGIC;
		x.h.type = HANDLE_CHUNK_CLOSED;
		x.h.cookie = c->mem.acks[i];
		if (handle_send_ext(c->hfd, &x, -1) < 0)
			break;
	}
	c->mem.n_acks = 0;
}

/*
 * Applies every packet already queued on the handle channel (never waits).
 * A packet that breaks the contract is reported in last_error and skipped,
 * so the others still apply; the pages of a chunk that failed to map are
 * then NULL to kvt_page_ptr and refused by kvt_kv_ptr.  Returns 0, the first
 * packet error, or KVT_ECONN (and marks the client dead) when the daemon
 * hung up.
 */
int client_drain(kvt_client *c)
{
	int first = 0;
	for (;;) {
		struct handle_ext m;
		int fds[HANDLE_SET_FDS];
		uint32_t nfd = 0;
		int rc = handle_recv_set(c->hfd, &m, fds, &nfd, 0);
		if (rc == KVT_ETIMEDOUT) {
			if (c->mem.n_acks)
				send_acks(c);
			return first;
		}
		if (rc == KVT_ECONN) {
			c->dead = 1;
			return KVT_ECONN;
		}
		if (rc < 0) {
			client_set_err(c, "handle channel: %s",
			               kvt_strerror(rc));
			return first ? first : rc;
		}
		char why[KVT_ERRTEXT_MAX - 32];
		rc = mem_apply_fds(&c->mem, &m, fds, nfd, why, sizeof(why));
		if (rc < 0) {
			client_set_err(c, "handle channel: %s", why);
			if (!first)
				first = rc;
		}
	}
}

/*
 * Notices a daemon that died since the last call before a request is sent:
 * nng would wait the whole send timeout for a pipe that never comes back.
 * The pipe callback has told us already; no system call needed.
 */
int client_alive(kvt_client *c)
{
	if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE))
		c->dead = 1;
	if (c->dead)
		client_set_err(c, "connection to kvtrimd lost");
	return !c->dead;
}

/*
 * client_alive() for the calls that take a const client or never talk to
 * the daemon (the data plane): once the daemon is known gone they too
 * answer KVT_ECONN (or NULL), so every call on a lost handle says so until
 * kvt_disconnect (include/kvtrim.h, "Lost connection").
 */
int client_lost(const kvt_client *c)
{
	return c->dead || __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE);
}

/*
 * Runs on an nng thread when the control pipe to the daemon closes (the
 * daemon exited or died): fails every wait at once instead of letting it
 * run into its timeout.  The socket would dial a restarted daemon again,
 * but this tenant is gone with the old one, so the client stays dead.
 */
void client_pipe_gone(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	kvt_client *c = arg;
	(void)p;
	(void)ev;
	__atomic_store_n(&c->gone, 1, __ATOMIC_RELEASE);
	nng_aio_cancel(c->raio);
	for (int i = 0; i < CLIENT_MAX_TICKETS; i++) {
		nng_aio *a = __atomic_load_n(&c->tickets[i].aio, __ATOMIC_ACQUIRE);
		if (a)
			nng_aio_cancel(a);
	}
}

/*
 * Sends a request, or waits for its reply, in the socket's default context.
 * A blocking aio wait wakes on a condition variable, which costs far less
 * than polling nng's notification descriptor; the pipe callback above
 * cancels it when the daemon goes away.  The pipe may also close between
 * client_alive() and the start of the operation, when the callback had
 * nothing to cancel: it sets gone before cancelling, so checking gone after
 * starting closes that window.  Any connection-level failure marks the client dead,
 * so every later call fails at once instead of waiting for a pipe that
 * will not come back.
 */
static int aio_step(kvt_client *c, int send, int timeout_ms, nng_msg **msg)
{
	nng_aio_set_timeout(c->raio, timeout_ms);
	if (send) {
		nng_aio_set_msg(c->raio, *msg);
		nng_send_aio(c->sock, c->raio);
	} else {
		nng_recv_aio(c->sock, c->raio);
	}
	if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE))
		nng_aio_cancel(c->raio);
	nng_aio_wait(c->raio);
	int rv = nng_aio_result(c->raio);
	if (rv == 0) {
		if (!send)
			*msg = nng_aio_get_msg(c->raio);
		return 0;
	}
	if (send) {
		/* A failed send leaves the message with the caller. */
		nng_msg *m = nng_aio_get_msg(c->raio);
		if (m)
			nng_msg_free(m);
		nng_aio_set_msg(c->raio, NULL);
	}
	int rc = rv == NNG_ECANCELED ? KVT_ECONN : client_from_nng(rv);
	if (rc == KVT_ECONN || __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE)) {
		c->dead = 1;
		return KVT_ECONN;
	}
	return rc;
}

/*
 * One request/reply on the socket's default context, bounded by timeout_ms.
 * On success *rep is decoded (codec_rep_free it, also after an error).
 * Returns 0, the daemon's error code (its text in last_error), or a local
 * code.  Drains the handle channel after the reply.
 */
int client_rpc(kvt_client *c, const struct ipc_req *req, struct ipc_rep *rep,
                      int timeout_ms)
{
	memset(rep, 0, sizeof(*rep));
	if (!client_alive(c))
		return KVT_ECONN;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = codec_req_encode(req, &buf, &len);
	if (rc < 0) {
		client_set_err(c, "cannot encode %s request: %s",
		               codec_op_name(req->op), kvt_strerror(rc));
		return rc;
	}
	nng_msg *msg = NULL;
	int rv = nng_msg_alloc(&msg, 0);
	if (rv == 0 && (rv = nng_msg_append(msg, buf, len)) != 0)
		nng_msg_free(msg);
	free(buf);
	if (rv)
		return client_from_nng(rv);
	if ((rc = aio_step(c, 1, timeout_ms, &msg)) < 0) {
		client_set_err(c, "sending %s: %s", codec_op_name(req->op),
		               rc == KVT_ECONN ? "kvtrimd closed the connection"
		                               : kvt_strerror(rc));
		return rc;
	}
	if ((rc = aio_step(c, 0, timeout_ms, &msg)) < 0) {
		client_set_err(c, "%s: %s", codec_op_name(req->op),
		               rc == KVT_ECONN ? "kvtrimd closed the connection"
		                               : "no reply from kvtrimd in time");
		return rc;
	}
	char why[KVT_ERRTEXT_MAX - 32];
	rc = codec_rep_decode(req->op, nng_msg_body(msg), nng_msg_len(msg), rep,
	                      why, sizeof(why));
	nng_msg_free(msg);
	if (c->mem_live) /* a failure is in last_error; the reply stands */
		client_drain(c);
	if (rc < 0) {
		client_set_err(c, "bad %s reply: %s", codec_op_name(req->op),
		               why);
		return rc;
	}
	if ((rc = client_rep_code(rep->err)) < 0) {
		snprintf(c->last_error, sizeof(c->last_error), "%s",
		         rep->msg[0] ? rep->msg : kvt_strerror(rc));
		return rc;
	}
	return 0;
}
