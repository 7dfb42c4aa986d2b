/*
 * client.c — libkvtrim, the public kvt_* API over the control plane (nng
 * req0 + codec), the handle channel (handle.h) and the shared segments
 * (mem.h); this file holds the session (connect: welcome, hello, segments;
 * disconnect; last error, config) and the tenant's stats.  The other calls
 * are in rpc.c, seq.c, sync.c and device.c (client.h).
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
#include "client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/req.h>

#include "handle.h"
#include "now.h"
#include "rundir.h"
#include "shm.h"

#define CLIENT_DEF_TIMEOUT_MS 5000
#define CLIENT_BYE_TIMEOUT_MS 500
#define CLIENT_SUN_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path))

/* ms left until a monotonic deadline (now_ms), clamped for poll. */
static int left_ms(int64_t deadline)
{
	int64_t d = deadline - (int64_t)now_ms();
	return d < 0 ? 0 : d > INT_MAX ? INT_MAX : (int)d;
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
	}
	/* The pipe callback (client_pipe_gone, an nng thread) cancels the
	 * tickets' aios: they are freed only once nng_close has returned,
	 * which is after every pipe callback ran. */
	if (c->sock_open)
		nng_close(c->sock);
	for (int i = 0; i < CLIENT_MAX_TICKETS; i++) {
		struct ticket *t = &c->tickets[i];
		if (!t->ready)
			continue;
		nng_aio_free(t->aio);
		free(t->seqs);
	}
	if (c->raio)
		nng_aio_free(c->raio);
	if (c->hfd >= 0)
		close(c->hfd);
	client_buffers_free(c);
	mem_fini(&c->mem);
	client_attention_free(c);
	free(c->seqs);
	free(c);
}

/* Maps the table and staging segments, which precede the hello reply. */
static int map_segments(kvt_client *c, int64_t deadline)
{
	while (!mem_ready(&c->mem)) {
		struct handle_ext m;
		int fds[HANDLE_SET_FDS];
		uint32_t nfd = 0;
		int rc = handle_recv_set(c->hfd, &m, fds, &nfd,
		                         left_ms(deadline));
		if (rc < 0) {
			if (rc == KVT_ECONN)
				c->dead = 1;
			client_set_err(c, "waiting for the table and staging "
			               "segments: %s", kvt_strerror(rc));
			return rc;
		}
		char why[KVT_ERRTEXT_MAX - 32];
		if ((rc = mem_apply_fds(&c->mem, &m, fds, nfd, why,
		                        sizeof(why))) < 0) {
			client_set_err(c, "handle channel: %s", why);
			return rc;
		}
	}
	c->mem_live = 1;
	/* Chunk packets that fail are reported by client_drain() and only
	 * cost their pages; a hang-up is fatal. */
	return client_drain(c) == KVT_ECONN ? KVT_ECONN : 0;
}

static int hello(kvt_client *c, const struct kvt_config *cfg,
                 uint64_t cookie, int64_t deadline)
{
	struct ipc_req req;
	struct ipc_rep rep;
	client_req_init(c, IPC_OP_HELLO, &req);
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

	int rc = client_rpc(c, &req, &rep, left_ms(deadline));
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
		c->inputs = rep.u.hello.inputs;
	}
	codec_rep_free(&rep);
	return rc;
}

/*
 * kvtrimd opens model= weights itself, as its own user and from its own
 * working directory, and refuses relative paths: a relative one is made
 * absolute here, against the engine's working directory, which is what
 * the engine's user means by it (docs/weights.md, "Paths").
 */
static int absolute_models(kvt_client *c)
{
	const char *colon = strchr(c->policy, ':');
	if (!colon || !strstr(colon, "model="))
		return 0;
	char out[KVT_SPEC_MAX], cwd[PATH_MAX] = "";
	size_t n = (size_t)(colon + 1 - c->policy);
	memcpy(out, c->policy, n);
	for (const char *p = colon + 1; *p;) {
		size_t len = strcspn(p, ",");
		int rel = len > 6 && !strncmp(p, "model=", 6) && p[6] != '/';
		if (rel && !cwd[0] && !getcwd(cwd, sizeof(cwd))) {
			client_set_err(c, "policy %s: cannot make model=%.*s "
			               "absolute: getcwd failed", c->policy,
			               (int)(len - 6), p + 6);
			return KVT_ESYS;
		}
		const char *sep = p[len] ? "," : "";
		int w = rel ? snprintf(out + n, sizeof(out) - n,
		                       "model=%s/%.*s%s", cwd, (int)(len - 6),
		                       p + 6, sep)
		            : snprintf(out + n, sizeof(out) - n, "%.*s%s",
		                       (int)len, p, sep);
		if (w < 0 || (size_t)w >= sizeof(out) - n) {
			client_set_err(c, "policy spec with model= made "
			               "absolute (against %s) is longer than %d "
			               "bytes", cwd, KVT_SPEC_MAX - 1);
			return KVT_EPOLICY;
		}
		n += (size_t)w;
		p += len + (p[len] ? 1 : 0);
	}
	memcpy(c->policy, out, n + 1);
	return 0;
}

static int open_socket(kvt_client *c)
{
	char url[PATH_MAX + 16];
	int rv;
	if ((rv = nng_req0_open(&c->sock)) != 0) {
		client_set_err(c, "nng_req0_open: %s", nng_strerror(rv));
		return client_from_nng(rv);
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
	    (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST,
	                          client_pipe_gone, c))) {
		client_set_err(c, "nng socket options: %s", nng_strerror(rv));
		return client_from_nng(rv);
	}
	snprintf(url, sizeof(url), "ipc://%s/ctl.ipc", c->dir);
	if ((rv = nng_dial(c->sock, url, NULL, 0)) != 0) {
		client_set_err(c, "cannot reach kvtrimd at %s/ctl.ipc: %s",
		               c->dir, nng_strerror(rv));
		return KVT_ECONN;
	}
	return 0;
}

static int connect_steps(kvt_client *c, const struct kvt_config *cfg)
{
	int64_t deadline = (int64_t)now_ms() + c->cfg.timeout_ms;
	char path[PATH_MAX + 16];
	int rc;

	if (strlen(c->dir) + sizeof("/ctl.ipc") > CLIENT_SUN_PATH_MAX) {
		client_set_err(c, "runtime directory path too long for a unix "
		               "socket: %s", c->dir);
		return KVT_EINVAL;
	}
	snprintf(path, sizeof(path), "%s/fd.sock", c->dir);
	if ((rc = handle_connect(path, &c->hfd)) < 0) {
		c->hfd = -1;
		client_set_err(c, "cannot reach kvtrimd at %s (is it running?)",
		               path);
		return rc;
	}
	struct handle_msg w;
	int fd = -1;
	if ((rc = handle_recv(c->hfd, &w, &fd, left_ms(deadline))) < 0) {
		client_set_err(c, "no welcome from kvtrimd on %s: %s", path,
		               kvt_strerror(rc));
		return rc;
	}
	if (fd >= 0)
		close(fd);
	if (w.type != HANDLE_WELCOME) {
		client_set_err(c, "kvtrimd sent handle packet %u before its "
		               "welcome", (unsigned)w.type);
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
	                        c->cfg.stage_tokens, c->inputs, why,
	                        sizeof(why))) < 0) {
		client_set_err(c, "kvtrimd accepted a layout the client cannot "
		               "use: %s", why);
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
		client_set_err(c, "timeout_ms must be >= 0");
		rc = KVT_EINVAL;
	} else if (cfg->tenant && strlen(cfg->tenant) >= KVT_NAME_MAX) {
		client_set_err(c, "tenant name longer than %d bytes",
		               KVT_NAME_MAX - 1);
		rc = KVT_EINVAL;
	} else if (cfg->policy && strlen(cfg->policy) >= KVT_SPEC_MAX) {
		client_set_err(c, "policy spec longer than %d bytes",
		               KVT_SPEC_MAX - 1);
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
		rc = absolute_models(c);
		if (rc == 0)
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
		client_req_init(c, IPC_OP_BYE, &req);
		c->mem_live = 0; /* everything is unmapped next anyway */
		/* Device memory and events are let go before the daemon frees
		 * them (legacy IPC: the importer must close first). */
		if (mem_is_device(&c->mem)) {
			client_buffers_free(c);
			mem_fini(&c->mem);
		}
		client_rpc(c, &req, &rep, t);
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

uint32_t kvt_policy_inputs(const kvt_client *c)
{
	return c ? c->inputs : 0;
}

/* ---------------------------------------------------------------- stats */

/* Row keys of the `tenants` reply (kvtrimd's one name of each figure, as
 * in /metrics) and the members of struct kvt_tenant_stats they fill. */
static const struct {
	const char *key;
	size_t off;
} stat_fields[] = {
#define STAT_FIELD_(f, key) { key, offsetof(struct kvt_tenant_stats, f) }
	STAT_FIELD_(pages_used, "pages_used"),
	STAT_FIELD_(pages_free, "pages_free"),
	STAT_FIELD_(chunks, "chunks"),
	STAT_FIELD_(sequences, "sequences"),
	STAT_FIELD_(syncs, "syncs_total"),
	STAT_FIELD_(entries_kept, "entries_kept"),
	STAT_FIELD_(entries_appended, "entries_appended_total"),
	STAT_FIELD_(entries_evicted, "entries_evicted_total"),
	STAT_FIELD_(quota_bytes, "quota_bytes"),
	STAT_FIELD_(daemon_bytes, "daemon_memory_bytes"),
	STAT_FIELD_(budget, "budget_entries"),
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
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (!out) {
		client_set_err(c, "kvt_stats: out is NULL");
		return KVT_EINVAL;
	}
	struct ipc_req req;
	struct ipc_rep rep;
	client_req_init(c, IPC_OP_TENANTS, &req);
	int rc = client_rpc(c, &req, &rep, c->cfg.timeout_ms);
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
			/* the row has the level (float) the metrics show;
			 * rounded without libm, which libkvtrim.a users
			 * need not link */
			const struct ipc_val *pv = codec_row_get(row, "pressure");
			if (pv && pv->type == IPC_VAL_F64 && pv->v.f > 0 &&
			    pv->v.f <= 1)
				out->pressure_ppm = (uint64_t)(
					pv->v.f * IPC_PRESS_ONE + 0.5);
			rc = 0;
			break;
		}
		if (rc < 0)
			client_set_err(c, "tenant %u is not in kvtrimd's tenant "
			               "list", c->tenant);
	}
	codec_rep_free(&rep);
	return rc;
}
