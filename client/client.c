/*
 * client.c — libkvtrim: the public kvt_* API (session, sequences, data
 * plane, sync, stats) over the control plane (nng req0 + codec), the handle
 * channel (handle.h) and the shared segments (mem.h).
 *
 * Ordering contract with the daemon: every handle packet a reply depends on
 * (chunk grants, revocations) is written to the handle channel before that
 * reply is sent on nng, so after each reply the channel is drained without
 * waiting and the mappings are current when the caller reads the table.
 *
 * Liveness: nng's req0 silently waits for a reconnect when the daemon goes
 * away, so while a reply is awaited the handle channel is polled too: its
 * hang-up is the daemon's death and ends the wait early with KVT_ECONN.
 */
#include "kvtrim.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
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
#include "handle.h"
#include "mem.h"
#include "shm.h"

#define CLIENT_DEF_TIMEOUT_MS 5000
#define CLIENT_BYE_TIMEOUT_MS 500
/* How long a reply is still awaited after the handle channel hung up: the
 * daemon closes the channel right after refusing a hello, and that refusal
 * (with its reason) may reach us a moment after the hang-up. */
#define CLIENT_HUP_GRACE_MS 250
#define CLIENT_MAX_TICKETS 16 /* kvtrim.h: at most 16 syncs in flight */
#define CLIENT_TICKET_BITS 4  /* low bits of a ticket: its slot */
#define CLIENT_SUN_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path))

struct seq_slot {
	kvt_seq id;       /* (generation << 32) | slot, from the daemon */
	uint32_t counter; /* syncs the daemon accepted for this sequence */
	uint8_t open;
	uint8_t busy;     /* an async sync of this sequence is in flight */
};

/* One in-flight kvt_sync_async: its own nng context, so replies of
 * concurrent requests cannot be confused. */
struct ticket {
	nng_ctx ctx;
	nng_aio *aio;
	int ready;        /* ctx and aio exist (created on first use) */
	int pending;      /* a request was sent and not yet waited for */
	uint32_t gen;     /* generation, high bits of the ticket id */
	uint32_t n;
	kvt_seq *seqs;    /* [n] sequences of the sync, for the counters */
};

struct kvt_client {
	struct kvt_config cfg; /* values in force; strings point below */
	char dir[PATH_MAX];
	char name[KVT_NAME_MAX];
	char policy[KVT_SPEC_MAX];
	char last_error[KVT_ERRTEXT_MAX];

	nng_socket sock;
	int sock_open;
	nng_aio *raio;   /* receives the reply of a blocking call */
	int gone;        /* the control pipe closed (set on an nng thread) */
	int hfd;         /* handle channel, -1 when closed */
	int dead;        /* the handle channel hung up: daemon gone */
	int registered;  /* hello accepted: tenant and token are valid */
	int mem_live;    /* table and staging mapped: packets may be applied */

	uint32_t tenant;
	uint64_t token;
	struct mem mem;
	void *stream;    /* engine's cudaStream_t (kvt_set_stream), borrowed */
	struct seq_slot *seqs; /* [cfg.max_seqs] */
	struct ticket tickets[CLIENT_MAX_TICKETS];
	uint32_t ticket_gen;
};

/* ---------------------------------------------------------------- helpers */

__attribute__((format(printf, 2, 3))) static void
set_err(kvt_client *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
	va_end(ap);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int left_ms(int64_t deadline)
{
	int64_t d = deadline - now_ms();
	return d < 0 ? 0 : d > INT_MAX ? INT_MAX : (int)d;
}

static int from_nng(int rv)
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

/* A reply's error code, trusted only when it is one of ours. */
static int rep_code(int32_t e)
{
	if (e == 0)
		return 0;
	if (e > 0 || !strcmp(kvt_errname(e), "E?"))
		return KVT_EPROTO;
	return e;
}

static void req_init(const kvt_client *c, enum ipc_op op, struct ipc_req *req)
{
	memset(req, 0, sizeof(*req));
	req->version = IPC_PROTO_VERSION;
	req->op = op;
	if (!codec_op_is_admin(op) && op != IPC_OP_HELLO) {
		req->tenant = c->tenant;
		req->token = c->token;
	}
}

/*
 * Applies every packet already queued on the handle channel (never waits).
 * A packet that breaks the contract is reported in last_error and skipped,
 * so the others still apply; the pages of a chunk that failed to map are
 * then NULL to kvt_page_ptr and refused by kvt_kv_ptr.  Returns 0, the first
 * packet error, or KVT_ECONN (and marks the client dead) when the daemon
 * hung up.
 */
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

static int drain(kvt_client *c)
{
	int first = 0;
	for (;;) {
		struct handle_ext m;
		int fd = -1;
		int rc = handle_recv_ext(c->hfd, &m, &fd, 0);
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
			set_err(c, "handle channel: %s", kvt_strerror(rc));
			return first ? first : rc;
		}
		char why[KVT_ERRTEXT_MAX - 32];
		rc = mem_apply(&c->mem, &m, fd, why, sizeof(why));
		if (rc < 0) {
			set_err(c, "handle channel: %s", why);
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
static int alive(kvt_client *c)
{
	if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE))
		c->dead = 1;
	if (c->dead)
		set_err(c, "connection to kvtrimd lost");
	return !c->dead;
}

/*
 * alive() for the calls that take a const client or never talk to the
 * daemon (the data plane): once the daemon is known gone they too answer
 * KVT_ECONN (or NULL), so every call on a lost handle says so until
 * kvt_disconnect (include/kvtrim.h, "Lost connection").
 */
static int lost(const kvt_client *c)
{
	return c->dead || __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE);
}

/*
 * Runs on an nng thread when the control pipe to the daemon closes (the
 * daemon exited or died): fails every wait at once instead of letting it
 * run into its timeout.  The socket would dial a restarted daemon again,
 * but this tenant is gone with the old one, so the client stays dead.
 */
static void pipe_gone_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
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
 * alive() and the start of the operation, when the callback had nothing to
 * cancel: it sets gone before cancelling, so checking gone after starting
 * closes that window.  Any connection-level failure marks the client dead,
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
	int rc = rv == NNG_ECANCELED ? KVT_ECONN : from_nng(rv);
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
static int rpc(kvt_client *c, const struct ipc_req *req, struct ipc_rep *rep,
               int timeout_ms)
{
	memset(rep, 0, sizeof(*rep));
	if (!alive(c))
		return KVT_ECONN;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = codec_req_encode(req, &buf, &len);
	if (rc < 0) {
		set_err(c, "cannot encode %s request: %s", codec_op_name(req->op),
		        kvt_strerror(rc));
		return rc;
	}
	nng_msg *msg = NULL;
	int rv = nng_msg_alloc(&msg, 0);
	if (rv == 0 && (rv = nng_msg_append(msg, buf, len)) != 0)
		nng_msg_free(msg);
	free(buf);
	if (rv)
		return from_nng(rv);
	if ((rc = aio_step(c, 1, timeout_ms, &msg)) < 0) {
		set_err(c, "sending %s: %s", codec_op_name(req->op),
		        rc == KVT_ECONN ? "kvtrimd closed the connection"
		                        : kvt_strerror(rc));
		return rc;
	}
	if ((rc = aio_step(c, 0, timeout_ms, &msg)) < 0) {
		set_err(c, "%s: %s", codec_op_name(req->op),
		        rc == KVT_ECONN ? "kvtrimd closed the connection"
		                        : "no reply from kvtrimd in time");
		return rc;
	}
	char why[KVT_ERRTEXT_MAX - 32];
	rc = codec_rep_decode(req->op, nng_msg_body(msg), nng_msg_len(msg), rep,
	                      why, sizeof(why));
	nng_msg_free(msg);
	if (c->mem_live)
		drain(c); /* a failure is in last_error; the reply stands */
	if (rc < 0) {
		set_err(c, "bad %s reply: %s", codec_op_name(req->op), why);
		return rc;
	}
	if ((rc = rep_code(rep->err)) < 0) {
		snprintf(c->last_error, sizeof(c->last_error), "%s",
		         rep->msg[0] ? rep->msg : kvt_strerror(rc));
		return rc;
	}
	return 0;
}

static int seq_lookup(const kvt_client *c, kvt_seq seq, uint32_t *slot)
{
	uint32_t s = (uint32_t)(seq & 0xffffffffu);
	if (s >= c->cfg.max_seqs || !c->seqs[s].open || c->seqs[s].id != seq)
		return KVT_ENOSEQ;
	*slot = s;
	return 0;
}

/* The list record of an open, idle sequence, after checking every index. */
static int list_of(const kvt_client *c, kvt_seq seq, uint32_t layer,
                   uint32_t kv_head, const struct shm_list **out)
{
	uint32_t slot;
	if (lost(c))
		return KVT_ECONN;
	int rc = seq_lookup(c, seq, &slot);
	if (rc < 0)
		return rc;
	if (c->seqs[slot].busy)
		return KVT_EBUSY;
	if (layer >= c->mem.g.n_layers || kv_head >= c->mem.g.n_kv_heads)
		return KVT_EINVAL;
	*out = shm_list_at(c->mem.table, &c->mem.g, slot, layer, kv_head);
	return 0;
}

/* ---------------------------------------------------------------- session */

/* Releases everything without talking to the daemon. */
static void destroy(kvt_client *c)
{
	for (int i = 0; i < CLIENT_MAX_TICKETS; i++) {
		struct ticket *t = &c->tickets[i];
		if (!t->ready)
			continue;
		nng_aio_stop(t->aio); /* cancels an in-flight sync, waits */
		nng_msg *m = nng_aio_get_msg(t->aio);
		if (m)
			nng_msg_free(m);
		nng_ctx_close(t->ctx);
		nng_aio_free(t->aio);
		free(t->seqs);
	}
	if (c->sock_open)
		nng_close(c->sock); /* returns after the pipe callbacks ran */
	if (c->raio)
		nng_aio_free(c->raio);
	if (c->hfd >= 0)
		close(c->hfd);
	mem_fini(&c->mem);
	free(c->seqs);
	free(c);
}

/* Maps the table and staging segments, which precede the hello reply. */
static int map_segments(kvt_client *c, int64_t deadline)
{
	while (!mem_ready(&c->mem)) {
		struct handle_ext m;
		int fd = -1;
		int rc = handle_recv_ext(c->hfd, &m, &fd, left_ms(deadline));
		if (rc < 0) {
			if (rc == KVT_ECONN)
				c->dead = 1;
			set_err(c, "waiting for the table and staging segments: "
			        "%s", kvt_strerror(rc));
			return rc;
		}
		char why[KVT_ERRTEXT_MAX - 32];
		if ((rc = mem_apply(&c->mem, &m, fd, why, sizeof(why))) < 0) {
			set_err(c, "handle channel: %s", why);
			return rc;
		}
	}
	c->mem_live = 1;
	/* Chunk packets that fail are reported by drain() and only cost
	 * their pages; a hang-up is fatal. */
	return drain(c) == KVT_ECONN ? KVT_ECONN : 0;
}

static int hello(kvt_client *c, const struct kvt_config *cfg,
                 uint64_t cookie, int64_t deadline)
{
	struct ipc_req req;
	struct ipc_rep rep;
	req_init(c, IPC_OP_HELLO, &req);
	struct ipc_hello *h = &req.u.hello;
	snprintf(h->name, sizeof(h->name), "%s", c->name);
	h->geo = cfg->geo;
	h->dtype = (uint32_t)cfg->dtype;
	h->page_tokens = cfg->page_tokens;
	h->max_seqs = cfg->max_seqs;
	h->max_tokens = cfg->max_tokens;
	h->headroom = cfg->headroom;
	h->stage_tokens = cfg->stage_tokens;
	snprintf(h->policy, sizeof(h->policy), "%s", c->policy);
	h->quota_bytes = cfg->quota_bytes;
	h->cookie = cookie;
	h->pid = (uint32_t)getpid();

	int rc = rpc(c, &req, &rep, left_ms(deadline));
	if (rc == 0) {
		c->tenant = rep.u.hello.tenant;
		c->token = rep.u.hello.token;
		c->registered = 1;
		c->cfg.page_tokens = rep.u.hello.page_tokens;
		c->cfg.max_seqs = rep.u.hello.max_seqs;
		c->cfg.max_tokens = rep.u.hello.max_tokens;
		c->cfg.headroom = rep.u.hello.headroom;
		c->cfg.stage_tokens = rep.u.hello.stage_tokens;
		c->cfg.quota_bytes = rep.u.hello.quota_bytes;
	}
	codec_rep_free(&rep);
	return rc;
}

static int open_socket(kvt_client *c)
{
	char url[PATH_MAX + 16];
	int rv;
	if ((rv = nng_req0_open(&c->sock)) != 0) {
		set_err(c, "nng_req0_open: %s", nng_strerror(rv));
		return from_nng(rv);
	}
	c->sock_open = 1;
	/* Syncs are not idempotent: nng must never resend a request. */
	if ((rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME,
	                            NNG_DURATION_INFINITE)) ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO,
	                            c->cfg.timeout_ms)) ||
	    (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO,
	                            c->cfg.timeout_ms)) ||
	    (rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ,
	                              IPC_MAX_MSG)) ||
	    (rv = nng_aio_alloc(&c->raio, NULL, NULL)) ||
	    (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, pipe_gone_cb,
	                          c))) {
		set_err(c, "nng socket options: %s", nng_strerror(rv));
		return from_nng(rv);
	}
	snprintf(url, sizeof(url), "ipc://%s/ctl.ipc", c->dir);
	if ((rv = nng_dial(c->sock, url, NULL, 0)) != 0) {
		set_err(c, "cannot reach kvtrimd at %s/ctl.ipc: %s", c->dir,
		        nng_strerror(rv));
		return KVT_ECONN;
	}
	return 0;
}

static int connect_steps(kvt_client *c, const struct kvt_config *cfg)
{
	int64_t deadline = now_ms() + c->cfg.timeout_ms;
	char path[PATH_MAX + 16];
	int rc;

	if (strlen(c->dir) + sizeof("/ctl.ipc") > CLIENT_SUN_PATH_MAX) {
		set_err(c, "runtime directory path too long for a unix socket: "
		        "%s", c->dir);
		return KVT_EINVAL;
	}
	snprintf(path, sizeof(path), "%s/fd.sock", c->dir);
	if ((rc = handle_connect(path, &c->hfd)) < 0) {
		c->hfd = -1;
		set_err(c, "cannot reach kvtrimd at %s (is it running?)", path);
		return rc;
	}
	struct handle_msg w;
	int fd = -1;
	if ((rc = handle_recv(c->hfd, &w, &fd, left_ms(deadline))) < 0) {
		set_err(c, "no welcome from kvtrimd on %s: %s", path,
		        kvt_strerror(rc));
		return rc;
	}
	if (fd >= 0)
		close(fd);
	if (w.type != HANDLE_WELCOME) {
		set_err(c, "kvtrimd sent handle packet %u before its welcome",
		        (unsigned)w.type);
		return KVT_EPROTO;
	}
	if ((rc = open_socket(c)) < 0)
		return rc;
	if ((rc = hello(c, cfg, w.cookie, deadline)) < 0)
		return rc;

	char why[KVT_ERRTEXT_MAX - 48];
	struct shm_geom g;
	if ((rc = shm_geom_init(&g, &c->cfg.geo, c->cfg.dtype,
	                        c->cfg.page_tokens, c->cfg.max_seqs,
	                        c->cfg.max_tokens, c->cfg.headroom,
	                        c->cfg.stage_tokens, why, sizeof(why))) < 0) {
		set_err(c, "kvtrimd accepted a layout the client cannot use: %s",
		        why);
		return KVT_EPROTO;
	}
	if ((rc = mem_init(&c->mem, &g, c->cfg.quota_bytes)) < 0)
		return rc;
	if (!(c->seqs = calloc(c->cfg.max_seqs, sizeof(*c->seqs))))
		return KVT_ENOMEM;
	return map_segments(c, deadline);
}

int kvt_connect(const struct kvt_config *cfg, kvt_client **out, char *errtext)
{
	if (errtext)
		errtext[0] = '\0';
	if (out)
		*out = NULL;
	if (!cfg || !out) {
		if (errtext)
			snprintf(errtext, KVT_ERRTEXT_MAX, "cfg and out are required");
		return KVT_EINVAL;
	}
	kvt_client *c = calloc(1, sizeof(*c));
	if (!c) {
		if (errtext)
			snprintf(errtext, KVT_ERRTEXT_MAX, "%s",
			         kvt_strerror(KVT_ENOMEM));
		return KVT_ENOMEM;
	}
	c->hfd = -1;

	int rc = 0;
	c->cfg = *cfg;
	if (cfg->timeout_ms < 0) {
		set_err(c, "timeout_ms must be >= 0");
		rc = KVT_EINVAL;
	} else if (cfg->tenant && strlen(cfg->tenant) >= KVT_NAME_MAX) {
		set_err(c, "tenant name longer than %d bytes", KVT_NAME_MAX - 1);
		rc = KVT_EINVAL;
	} else if (cfg->policy && strlen(cfg->policy) >= KVT_SPEC_MAX) {
		set_err(c, "policy spec longer than %d bytes", KVT_SPEC_MAX - 1);
		rc = KVT_EPOLICY;
	}
	if (rc == 0) {
		rundir_resolve(cfg->runtime_dir, c->dir, sizeof(c->dir));
		if (cfg->tenant && cfg->tenant[0])
			snprintf(c->name, sizeof(c->name), "%s", cfg->tenant);
		else
			snprintf(c->name, sizeof(c->name), "engine-%ld",
			         (long)getpid());
		snprintf(c->policy, sizeof(c->policy), "%s",
		         cfg->policy && cfg->policy[0] ? cfg->policy : "full");
		c->cfg.runtime_dir = c->dir;
		c->cfg.tenant = c->name;
		c->cfg.policy = c->policy;
		if (!c->cfg.timeout_ms)
			c->cfg.timeout_ms = CLIENT_DEF_TIMEOUT_MS;
		rc = connect_steps(c, cfg);
	}
	if (rc < 0) {
		if (errtext)
			snprintf(errtext, KVT_ERRTEXT_MAX, "%s",
			         c->last_error[0] ? c->last_error
			                          : kvt_strerror(rc));
		/* Closing the handle channel makes the daemon drop a tenant
		 * registered before the failure. */
		destroy(c);
		return rc;
	}
	c->last_error[0] = '\0';
	*out = c;
	return 0;
}

void kvt_disconnect(kvt_client *c)
{
	if (!c)
		return;
	/* Pending syncs are abandoned: the tenant goes away with them. */
	for (int i = 0; i < CLIENT_MAX_TICKETS; i++)
		if (c->tickets[i].ready && c->tickets[i].pending)
			nng_aio_stop(c->tickets[i].aio);
	if (c->registered && !c->dead && c->sock_open) {
		int t = c->cfg.timeout_ms < CLIENT_BYE_TIMEOUT_MS
		                ? c->cfg.timeout_ms
		                : CLIENT_BYE_TIMEOUT_MS;
		struct ipc_req req;
		struct ipc_rep rep;
		nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, t);
		req_init(c, IPC_OP_BYE, &req);
		c->mem_live = 0; /* everything is unmapped next anyway */
		/* Device memory and events are let go before the daemon frees
		 * them (legacy IPC: the importer must close first). */
		if (mem_is_device(&c->mem))
			mem_fini(&c->mem);
		rpc(c, &req, &rep, t);
		codec_rep_free(&rep);
	}
	destroy(c);
}

const char *kvt_last_error(const kvt_client *c)
{
	return c ? c->last_error : "";
}

const struct kvt_config *kvt_config_of(const kvt_client *c)
{
	return c ? &c->cfg : NULL;
}

/* ---------------------------------------------------------------- sequences */

static int device_after_sync(kvt_client *c);

int kvt_seq_open(kvt_client *c, kvt_seq *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	struct ipc_req req;
	struct ipc_rep rep;
	req_init(c, IPC_OP_SEQ_OPEN, &req);
	int rc = rpc(c, &req, &rep, c->cfg.timeout_ms);
	if (rc == 0) {
		uint64_t seq = rep.u.seq;
		uint32_t slot = (uint32_t)(seq & 0xffffffffu);
		if (slot >= c->cfg.max_seqs) {
			set_err(c, "kvtrimd returned sequence %llu outside "
			        "max_seqs %u", (unsigned long long)seq,
			        c->cfg.max_seqs);
			rc = KVT_EPROTO;
		} else {
			c->seqs[slot] = (struct seq_slot){ .id = seq, .open = 1 };
			*out = seq;
			/* New pages (and maybe chunks) in the device table. */
			rc = device_after_sync(c);
		}
	}
	codec_rep_free(&rep);
	return rc;
}

int kvt_seq_close(kvt_client *c, kvt_seq seq)
{
	if (!c)
		return KVT_EINVAL;
	uint32_t slot;
	int rc = seq_lookup(c, seq, &slot);
	if (rc < 0)
		return rc;
	if (c->seqs[slot].busy)
		return KVT_EBUSY;
	struct ipc_req req;
	struct ipc_rep rep;
	req_init(c, IPC_OP_SEQ_CLOSE, &req);
	req.u.seq = seq;
	rc = rpc(c, &req, &rep, c->cfg.timeout_ms);
	codec_rep_free(&rep);
	/* ENOSEQ: the daemon no longer knows it either; forget it here. */
	if (rc == 0 || rc == KVT_ENOSEQ)
		c->seqs[slot].open = 0;
	if (rc == 0)
		rc = device_after_sync(c);
	return rc;
}

/* ---------------------------------------------------------------- data plane */

int kvt_list_get(const kvt_client *c, kvt_seq seq, uint32_t layer,
                 uint32_t kv_head, struct kvt_list *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	const struct shm_list *l;
	int rc = list_of(c, seq, layer, kv_head, &l);
	if (rc < 0)
		return rc;
	out->len = l->len;
	out->n_pages = l->n_pages < c->mem.g.max_pages ? l->n_pages
	                                                : c->mem.g.max_pages;
	out->epoch = l->epoch;
	out->pages = l->pages;
	return 0;
}

void *kvt_page_ptr(const kvt_client *c, uint32_t page)
{
	return c && !lost(c) ? mem_page(&c->mem, page) : NULL;
}

int kvt_kv_ptr(const kvt_client *c, kvt_seq seq, uint32_t layer,
               uint32_t kv_head, uint32_t k, void **k_out, void **v_out)
{
	if (!c)
		return KVT_EINVAL;
	const struct shm_geom *g = &c->mem.g;
	const struct shm_list *l;
	int rc = list_of(c, seq, layer, kv_head, &l);
	if (rc < 0)
		return rc;
	if (k >= g->headroom)
		return KVT_EHEADROOM;
	uint64_t e = (uint64_t)l->len + k;
	uint64_t pi = e / g->page_tokens;
	uint32_t n_pages = l->n_pages < g->max_pages ? l->n_pages
	                                             : g->max_pages;
	/* The daemon promises headroom pages after every sync; a missing
	 * page or an unmapped chunk means it broke the contract. */
	if (pi >= n_pages)
		return KVT_EPROTO;
	char *page = mem_page(&c->mem, l->pages[pi]);
	if (!page)
		return KVT_EPROTO;
	uint64_t row_bytes = (uint64_t)g->head_dim * g->elem_bytes;
	uint64_t row = e % g->page_tokens;
	if (k_out)
		*k_out = page + row * row_bytes;
	if (v_out)
		*v_out = page + (g->page_tokens + row) * row_bytes;
	return 0;
}

/* Entry [x][q][lse] of (seq, layer, pos), or NULL. */
static float *stage_entry(const kvt_client *c, kvt_seq seq, uint32_t layer,
                          uint32_t pos)
{
	uint32_t slot;
	if (!c || lost(c) || !c->mem.g.stage_tokens || !c->mem.stage ||
	    seq_lookup(c, seq, &slot) < 0 || c->seqs[slot].busy ||
	    layer >= c->mem.g.n_layers)
		return NULL;
	return shm_stage_at(c->mem.stage, &c->mem.g, slot, layer, pos);
}

float *kvt_stage_x(const kvt_client *c, kvt_seq seq, uint32_t layer,
                   uint32_t pos)
{
	return stage_entry(c, seq, layer, pos);
}

float *kvt_stage_q(const kvt_client *c, kvt_seq seq, uint32_t layer,
                   uint32_t pos)
{
	float *e = stage_entry(c, seq, layer, pos);
	return e ? e + c->mem.g.d_model : NULL;
}

float *kvt_stage_lse(const kvt_client *c, kvt_seq seq, uint32_t layer,
                     uint32_t pos)
{
	float *e = stage_entry(c, seq, layer, pos);
	return e ? e + c->mem.g.d_model +
	                   (uint64_t)c->mem.g.n_heads * c->mem.g.head_dim
	         : NULL;
}

/* ---------------------------------------------------------------- sync */

/*
 * Checks items against the local sequence table and builds the request
 * (req->u.sync.items is malloc'ed: free it).  Each item carries its
 * sequence's counter.  A sequence listed twice is passed on: the daemon
 * refuses it with a precise reason.
 */
static int build_sync(kvt_client *c, const struct kvt_sync_item *items,
                      size_t n, struct ipc_req *req)
{
	if (!items || n == 0 || n > IPC_MAX_SYNC_ITEMS)
		return KVT_EINVAL;
	req_init(c, IPC_OP_SYNC, req);
	struct ipc_sync_item *w = malloc(n * sizeof(*w));
	if (!w)
		return KVT_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		uint32_t slot;
		int rc = seq_lookup(c, items[i].seq, &slot);
		if (rc == 0 && c->seqs[slot].busy)
			rc = KVT_EBUSY;
		if (rc == 0 && items[i].phase > KVT_PHASE_DECODE)
			rc = KVT_EINVAL;
		if (rc < 0) {
			free(w);
			return rc;
		}
		w[i] = (struct ipc_sync_item){
			.seq = items[i].seq,
			.counter = c->seqs[slot].counter,
			.n_new = items[i].n_new,
			.phase = items[i].phase,
			.layer_lo = items[i].layer_lo,
			.layer_hi = items[i].layer_hi,
		};
	}
	req->u.sync.n = (uint32_t)n;
	req->u.sync.items = w;
	return 0;
}

/*
 * Device tenants: the engine's writes so far (on its stream) must land
 * before the daemon reads or moves entries, and the daemon's compaction
 * before the engine's next appends or attention on that stream.  No-ops
 * for host memory.
 */
static int device_before_sync(kvt_client *c)
{
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_record_writes(&c->mem, c->stream, why, sizeof(why));
	if (rc < 0)
		set_err(c, "%s", why);
	return rc;
}

static int device_after_sync(kvt_client *c)
{
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_device_after(&c->mem, c->stream, why, sizeof(why));
	if (rc < 0)
		set_err(c, "%s", why);
	return rc;
}

/* After an accepted sync: the sequence's counter moves on. */
static void count_sync(kvt_client *c, kvt_seq seq)
{
	uint32_t slot;
	if (seq_lookup(c, seq, &slot) == 0)
		c->seqs[slot].counter++;
}

int kvt_sync(kvt_client *c, const struct kvt_sync_item *items, size_t n)
{
	if (!c)
		return KVT_EINVAL;
	struct ipc_req req;
	struct ipc_rep rep;
	int rc = build_sync(c, items, n, &req);
	if (rc < 0)
		return rc;
	if ((rc = device_before_sync(c)) < 0) {
		free(req.u.sync.items);
		return rc;
	}
	rc = rpc(c, &req, &rep, c->cfg.timeout_ms);
	free(req.u.sync.items);
	codec_rep_free(&rep);
	for (size_t i = 0; rc == 0 && i < n; i++)
		count_sync(c, items[i].seq);
	if (rc == 0)
		rc = device_after_sync(c);
	return rc;
}

static int ticket_prepare(kvt_client *c, struct ticket *t)
{
	if (t->ready)
		return 0;
	int rv = nng_ctx_open(&t->ctx, c->sock);
	if (rv)
		return from_nng(rv);
	if ((rv = nng_ctx_set_ms(t->ctx, NNG_OPT_REQ_RESENDTIME,
	                         NNG_DURATION_INFINITE)) ||
	    (rv = nng_aio_alloc(&t->aio, NULL, NULL))) {
		nng_ctx_close(t->ctx);
		return from_nng(rv);
	}
	t->ready = 1;
	return 0;
}

int kvt_sync_async(kvt_client *c, const struct kvt_sync_item *items,
                   size_t n, kvt_ticket *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	if (!alive(c))
		return KVT_ECONN;
	int idx = -1;
	for (int i = 0; i < CLIENT_MAX_TICKETS && idx < 0; i++)
		if (!c->tickets[i].pending)
			idx = i;
	if (idx < 0)
		return KVT_EBUSY;
	struct ticket *t = &c->tickets[idx];

	struct ipc_req req;
	int rc = build_sync(c, items, n, &req);
	if (rc < 0)
		return rc;
	if ((rc = device_before_sync(c)) < 0) {
		free(req.u.sync.items);
		return rc;
	}
	kvt_seq *seqs = malloc(n * sizeof(*seqs));
	uint8_t *buf = NULL;
	size_t len = 0;
	nng_msg *msg = NULL;
	if (!seqs)
		rc = KVT_ENOMEM;
	else if ((rc = ticket_prepare(c, t)) == 0 &&
	         (rc = codec_req_encode(&req, &buf, &len)) == 0) {
		int rv = nng_msg_alloc(&msg, 0);
		if (rv == 0 && (rv = nng_msg_append(msg, buf, len)) != 0)
			nng_msg_free(msg);
		rc = from_nng(rv);
	}
	free(buf);
	free(req.u.sync.items);
	if (rc < 0) {
		free(seqs);
		return rc;
	}

	/* The send completes once the request is handed to the pipe; only
	 * the reply is left to wait for. */
	nng_aio_set_msg(t->aio, msg);
	nng_aio_set_timeout(t->aio, c->cfg.timeout_ms);
	nng_ctx_send(t->ctx, t->aio);
	nng_aio_wait(t->aio);
	int rv = nng_aio_result(t->aio);
	if (rv) {
		/* A failed send hands the request back to the aio. */
		if ((msg = nng_aio_get_msg(t->aio)) != NULL)
			nng_msg_free(msg);
		nng_aio_set_msg(t->aio, NULL);
		free(seqs);
		set_err(c, "sending sync: %s", nng_strerror(rv));
		return from_nng(rv);
	}
	nng_aio_set_timeout(t->aio, c->cfg.timeout_ms);
	nng_ctx_recv(t->ctx, t->aio);
	if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE))
		nng_aio_cancel(t->aio); /* see aio_step */

	for (size_t i = 0; i < n; i++) {
		uint32_t slot;
		seqs[i] = items[i].seq;
		if (seq_lookup(c, seqs[i], &slot) == 0)
			c->seqs[slot].busy = 1;
	}
	t->seqs = seqs;
	t->n = (uint32_t)n;
	t->pending = 1;
	if (++c->ticket_gen >= (1u << (32 - CLIENT_TICKET_BITS)))
		c->ticket_gen = 1;
	t->gen = c->ticket_gen;
	*out = (t->gen << CLIENT_TICKET_BITS) | (uint32_t)idx;
	return 0;
}

int kvt_wait(kvt_client *c, kvt_ticket tk)
{
	if (!c)
		return KVT_EINVAL;
	uint32_t idx = tk & ((1u << CLIENT_TICKET_BITS) - 1);
	struct ticket *t = &c->tickets[idx];
	if (!t->pending || t->gen != tk >> CLIENT_TICKET_BITS)
		return KVT_EINVAL;

	nng_aio_wait(t->aio);
	int rv = nng_aio_result(t->aio);
	int rc;
	struct ipc_rep rep;
	memset(&rep, 0, sizeof(rep));
	if (rv) {
		rc = from_nng(rv);
		set_err(c, "sync: %s", nng_strerror(rv));
	} else {
		nng_msg *msg = nng_aio_get_msg(t->aio);
		nng_aio_set_msg(t->aio, NULL);
		char why[KVT_ERRTEXT_MAX - 32];
		rc = codec_rep_decode(IPC_OP_SYNC, nng_msg_body(msg),
		                      nng_msg_len(msg), &rep, why, sizeof(why));
		nng_msg_free(msg);
		if (rc < 0)
			set_err(c, "bad sync reply: %s", why);
		else if ((rc = rep_code(rep.err)) < 0)
			snprintf(c->last_error, sizeof(c->last_error), "%s",
			         rep.msg[0] ? rep.msg : kvt_strerror(rc));
	}
	codec_rep_free(&rep);
	if (c->mem_live && !c->dead && drain(c) == KVT_ECONN &&
	    rc == KVT_ETIMEDOUT)
		rc = KVT_ECONN; /* no reply because the daemon is gone */

	for (uint32_t i = 0; i < t->n; i++) {
		uint32_t slot;
		if (seq_lookup(c, t->seqs[i], &slot) == 0)
			c->seqs[slot].busy = 0;
		if (rc == 0)
			count_sync(c, t->seqs[i]);
	}
	free(t->seqs);
	t->seqs = NULL;
	t->n = 0;
	t->pending = 0;
	if (rc == 0)
		rc = device_after_sync(c);
	return rc;
}

/* ---------------------------------------------------------------- device */

int kvt_memory_kind(const kvt_client *c)
{
	if (!c)
		return KVT_EINVAL;
	return mem_is_device(&c->mem) ? KVT_MEMORY_CUDA : KVT_MEMORY_HOST;
}

int kvt_set_stream(kvt_client *c, void *stream)
{
	if (!c)
		return KVT_EINVAL;
	if (!alive(c))
		return KVT_ECONN;
	c->stream = stream;
	return 0;
}

int kvt_table_view(kvt_client *c, struct kvt_table_view *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	if (!alive(c))
		return KVT_ECONN;
	return mem_table_view(&c->mem, out);
}

int kvt_list_record(kvt_client *c, kvt_seq seq, uint32_t layer,
                    uint32_t kv_head, const struct kvt_list_record **out,
                    uint32_t *slot)
{
	if (!c || !out)
		return KVT_EINVAL;
	const struct shm_list *l;
	struct kvt_table_view v;
	int rc = list_of(c, seq, layer, kv_head, &l);
	if (rc < 0 || (rc = mem_table_view(&c->mem, &v)) < 0)
		return rc;
	/* Same offset in the view's copy as in the host table. */
	size_t off = (size_t)((const char *)l - (const char *)c->mem.table);
	*out = (const struct kvt_list_record *)((const char *)v.table + off);
	if (slot)
		*slot = (uint32_t)(seq & 0xffffffffu);
	return 0;
}

int kvt_memcpy(kvt_client *c, void *dst, const void *src, size_t bytes)
{
	if (!c || ((!dst || !src) && bytes))
		return KVT_EINVAL;
	if (!alive(c))
		return KVT_ECONN;
	if (!bytes)
		return 0;
	char why[KVT_ERRTEXT_MAX - 32];
	int rc = mem_copy(&c->mem, dst, src, bytes, c->stream, why,
	                  sizeof(why));
	if (rc < 0)
		set_err(c, "%s", why);
	return rc;
}

/* ---------------------------------------------------------------- stats */

static const struct {
	const char *key;
	size_t off;
} stat_fields[] = {
#define STAT_FIELD_(f) { #f, offsetof(struct kvt_tenant_stats, f) }
	STAT_FIELD_(pages_used),   STAT_FIELD_(pages_free),
	STAT_FIELD_(chunks),       STAT_FIELD_(sequences),
	STAT_FIELD_(syncs),        STAT_FIELD_(entries_kept),
	STAT_FIELD_(entries_appended), STAT_FIELD_(entries_evicted),
	STAT_FIELD_(quota_bytes),  STAT_FIELD_(daemon_bytes),
#undef STAT_FIELD_
};

static int val_u64(const struct ipc_val *v, uint64_t *out)
{
	if (!v)
		return 0;
	if (v->type == IPC_VAL_U64)
		*out = v->v.u;
	else if (v->type == IPC_VAL_I64 && v->v.i >= 0)
		*out = (uint64_t)v->v.i;
	else
		return 0;
	return 1;
}

int kvt_stats(kvt_client *c, struct kvt_tenant_stats *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	struct ipc_req req;
	struct ipc_rep rep;
	req_init(c, IPC_OP_TENANTS, &req);
	int rc = rpc(c, &req, &rep, c->cfg.timeout_ms);
	if (rc == 0) {
		rc = KVT_ENOTENANT;
		for (uint32_t i = 0; i < rep.table.n; i++) {
			const struct ipc_row *row = &rep.table.rows[i];
			uint64_t id;
			if (!val_u64(codec_row_get(row, "id"), &id) ||
			    id != c->tenant)
				continue;
			memset(out, 0, sizeof(*out));
			for (size_t f = 0; f < sizeof(stat_fields) /
			                               sizeof(stat_fields[0]);
			     f++)
				val_u64(codec_row_get(row, stat_fields[f].key),
				        (uint64_t *)((char *)out +
				                     stat_fields[f].off));
			rc = 0;
			break;
		}
		if (rc < 0)
			set_err(c, "tenant %u is not in kvtrimd's tenant list",
			        c->tenant);
	}
	codec_rep_free(&rep);
	return rc;
}
