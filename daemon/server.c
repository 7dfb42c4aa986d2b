/*
 * server.c — see server.h: kvtrimd's lifecycle.  server_new sets up the
 * backend, the pool, the loop's handles, the runtime dir (created, then
 * locked) and every listening socket; server_run serves until a signal;
 * the cron tick does every part's periodic work; SIGHUP reloads the
 * config and the tenants' weights; SIGTERM / SIGINT drain, then shut
 * down; server_free closes what is left and removes the socket files.
 *
 * The server's other parts, one file per concern, and the state they
 * share are in server_int.h.
 *
 * Shutdown: at the signal both listeners stop, parked requests get
 * KVT_ESHUTDOWN and new requests too (dispatch.c); the drain timer lets
 * the replies in flight finish (at most 5 s), then closes ctl.ipc and its
 * connections (ctl.c), reclaims every tenant and closes the loop's
 * handles, which ends uv_run.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handle.h"
#include "http.h"
#include "notify.h"
#include "rundir.h"
#include "server_int.h"

#define SRV_CRON_MS 100
#define SRV_DRAIN_MS 200
#define SRV_STATUS_MS 1000   /* STATUS= refresh period */
#define SRV_RUNDIR_MS 1000   /* srv_rundir_watch period */

/* ---------------------------------------------------------- config */

/* Settings read at use time need nothing here; these keep derived state. */
void srv_config_changed(struct server *s)
{
	int lvl = log_parse_level(s->cfg.log_level);
	if (lvl >= 0)
		log_threshold = lvl;
	srv_allow_refresh(s);
	srv_shares_refresh(s);
}

/* ---------------------------------------------------------- timers */

static void srv_rundir_watch(struct server *s);

/* Every SRV_CRON_MS: each part's periodic work, in this order. */
static void srv_cron_cb(uv_timer_t *t)
{
	struct server *s = t->data;
	uint64_t now = now_ms();
	s->refusals_tick = 0;
	srv_conn_cron(s, now);
	srv_pipe_cron(s, now);
	srv_accept_resume(s, now);
	srv_ctl_cron(s, now);
	/* A process that died while a forked child kept its sockets open
	 * would otherwise hold its pages: check the peer pid directly. */
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (st && st->pid && kill((pid_t)st->pid, 0) < 0 &&
		    errno == ESRCH) {
			s->st.tenants_reclaimed_total++;
			srv_reclaim(s, st, "client process is gone");
		}
	}
	srv_pressure(s);
	if (s->n_parked)
		srv_retry_parked(s); /* deadlines, and pages freed meanwhile */
	srv_publish(s);
	if (now - s->rd.rundir_ms >= SRV_RUNDIR_MS) {
		s->rd.rundir_ms = now;
		srv_rundir_watch(s);
	}
	if (now - s->status_ms >= SRV_STATUS_MS) {
		s->status_ms = now;
		srv_status(s);
	}
}

static void srv_watchdog_cb(uv_timer_t *t)
{
	notify_watchdog();
}

/* ---------------------------------------------------------- reload */

/* SIGHUP also re-reads every tenant's scorer weights; a tenant whose new
 * weights do not load keeps its old ones, and nobody is dropped. */
void srv_reload_one(struct server *s, struct srv_tenant *st)
{
	char why[KVT_ERRTEXT_MAX];
	st->reload_pending = 0;
	int rv = tenant_reload_policy(st->t, why, sizeof(why));
	if (rv > 0) {
		s->st.weights_reloads_total++;
		LOG(LOG_LVL_NOTICE, "SIGHUP: tenant %" PRIu32 " '%s': "
		    "weights re-read (%s)", st->id, tenant_name(st->t),
		    tenant_policy_spec(st->t));
	} else if (rv < 0) {
		s->st.weights_reload_failures_total++;
		LOG(LOG_LVL_ERR, "SIGHUP: tenant %" PRIu32 " '%s' keeps "
		    "its old weights: %s", st->id, tenant_name(st->t), why);
	}
}

/* A tenant with a sync on a worker re-reads its weights when that ends. */
static void srv_reload_weights(struct server *s)
{
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++) {
		struct srv_tenant *st = s->tenants[i];
		if (st && st->busy)
			st->reload_pending = 1;
		else if (st)
			srv_reload_one(s, st);
	}
}

/* SIGHUP: the file (and the command line over it) again; only mutable
 * settings change, a bad file changes nothing, tenants stay. */
static void srv_reload(struct server *s)
{
	struct config next;
	char err[512], applied[512], ignored[512];
	notify_reloading();
	int rv = config_build(&next, &s->args, err, sizeof(err));
	if (rv) {
		s->st.config_reload_failures_total++;
		LOG(LOG_LVL_ERR, "SIGHUP: new config refused, the running one is "
		    "kept: %s", err);
	} else {
		if (!next.runtime_dir[0])
			rundir_resolve(NULL, next.runtime_dir,
			               sizeof(next.runtime_dir));
		int n = config_apply_mutable(&s->cfg, &next, applied,
		                             sizeof(applied), ignored,
		                             sizeof(ignored));
		srv_config_changed(s);
		s->st.config_reloads_total++;
		LOG(LOG_LVL_NOTICE, "SIGHUP: config reloaded%s%s: %s",
		    s->args.file ? " from " : " (no --config file)",
		    s->args.file ? s->args.file : "",
		    n ? applied : "nothing changed");
		if (ignored[0])
			LOG(LOG_LVL_WARNING, "SIGHUP: %s changed but cannot "
			    "change while kvtrimd runs; restart to apply",
			    ignored);
	}
	srv_reload_weights(s);
	notify_ready();
}

static void srv_hup_cb(uv_signal_t *h, int signum)
{
	srv_reload(h->data);
}

/* ---------------------------------------------------------- shutdown */

static void srv_stop_loop(struct server *s)
{
	/* The HTTP thread first: it may still poke snap_async. */
	if (s->pub_ready)
		stats_pub_close(&s->pub);
	http_stop(s->http);
	s->http = NULL;
	for (uint32_t i = 0; i < s->cfg.max_tenants; i++)
		if (s->tenants[i])
			srv_reclaim(s, s->tenants[i], "daemon shutting down");
	while (s->fdc.conns)
		srv_conn_close(s->fdc.conns);
	if (s->fdc.hpoll_ready)
		uv_close((uv_handle_t *)&s->fdc.hpoll, NULL);
	uv_close((uv_handle_t *)&s->wake, NULL);
	uv_close((uv_handle_t *)&s->snap_async, NULL);
	uv_close((uv_handle_t *)&s->sigterm, NULL);
	uv_close((uv_handle_t *)&s->sigint, NULL);
	uv_close((uv_handle_t *)&s->sighup, NULL);
	uv_close((uv_handle_t *)&s->cron, NULL);
	uv_close((uv_handle_t *)&s->drain, NULL);
	uv_close((uv_handle_t *)&s->watchdog, NULL);
}

static int srv_busy(struct server *s)
{
	return s->ctl.low_head || s->n_parked || s->n_jobs ||
	       srv_ctl_writing(s);
}

static void srv_drain_cb(uv_timer_t *t)
{
	struct server *s = t->data;
	/* Replies in flight finish first, but never wait forever. */
	if (srv_busy(s) && now_ms() - s->drain_started_ms < 5000)
		return;
	srv_ctl_close(s);
	uv_timer_stop(t);
	srv_stop_loop(s);
}

/* Stops taking connections and drains (srv_drain_cb ends the loop). */
static void srv_shutdown(struct server *s)
{
	if (s->draining)
		return;
	notify_stopping();
	s->draining = 1;
	s->drain_started_ms = now_ms();
	uv_poll_stop(&s->fdc.hpoll);
	srv_ctl_stop_accepting(s);
	/* Parked requests now get KVT_ESHUTDOWN instead of waiting on. */
	if (s->n_parked)
		srv_retry_parked(s);
	uv_timer_start(&s->drain, srv_drain_cb, SRV_DRAIN_MS, 20);
}

static void srv_signal_cb(uv_signal_t *h, int signum)
{
	struct server *s = h->data;
	if (s->draining)
		return;
	LOG(LOG_LVL_NOTICE, "signal %d: shutting down", signum);
	srv_shutdown(s);
}

/* ---------------------------------------------------------- runtime dir */

static int mkdir_p(const char *path)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0755) && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(tmp, 0770) && errno != EEXIST)
		return -1;
	return 0;
}

/* Hands a socket file to group kvtrim when that group exists, so members
 * (engines running as other users) can connect; mode stays 0660. */
static void srv_socket_group(const char *path)
{
	struct group g, *r = NULL;
	char buf[4096];
	if (getgrnam_r("kvtrim", &g, buf, sizeof(buf), &r) || !r)
		return;
	if (chown(path, (uid_t)-1, r->gr_gid))
		LOG(LOG_LVL_INFO, "cannot give %s to group kvtrim: %s", path,
		    strerror(errno));
}

/*
 * Takes the runtime dir's lock before anything in it is touched: a second
 * kvtrimd on a live dir must neither replace the first one's sockets nor,
 * when it exits, remove them.
 */
static int srv_lock_rundir(struct server *s, char *err, size_t errlen)
{
	long holder = 0;
	int rv = rundir_claim(s->cfg.runtime_dir, &s->rd.claim_fd, &holder);
	if (rv == KVT_ESYS) {
		snprintf(err, errlen, "cannot claim runtime dir %s: %s",
		         s->cfg.runtime_dir, strerror(errno));
		return rv;
	}
	if (rv == 0)
		rv = rundir_lock(s->cfg.runtime_dir, &s->rd.lock_fd, &holder);
	if (rv == KVT_EBUSY && holder)
		snprintf(err, errlen, "runtime dir %s is in use by kvtrimd pid "
		         "%ld (%s/%s)", s->cfg.runtime_dir, holder,
		         s->cfg.runtime_dir, RUNDIR_LOCK_NAME);
	else if (rv == KVT_EBUSY)
		snprintf(err, errlen, "runtime dir %s is in use by another "
		         "kvtrimd (%s/%s is locked)", s->cfg.runtime_dir,
		         s->cfg.runtime_dir, RUNDIR_LOCK_NAME);
	else if (rv)
		snprintf(err, errlen, "cannot lock runtime dir %s (%s/%s): %s",
		         s->cfg.runtime_dir, s->cfg.runtime_dir,
		         RUNDIR_LOCK_NAME, strerror(errno));
	return rv;
}

/* Notes the socket files as bound (after server_new made them all). */
static void srv_own_files(struct server *s)
{
	const char *paths[3] = {s->ctl_path, s->fd_path, s->stats_path};
	struct stat st;
	for (int i = 0; i < 3; i++) {
		s->rd.own[i] = (struct srv_own_file){.path = paths[i]};
		if (stat(paths[i], &st) == 0) {
			s->rd.own[i].dev = st.st_dev;
			s->rd.own[i].ino = st.st_ino;
			s->rd.own[i].bound = 1;
		}
	}
}

/* 1 while f's path names the file this daemon bound. */
static int srv_own_file_there(const struct srv_own_file *f)
{
	struct stat st;
	return f->bound && stat(f->path, &st) == 0 && st.st_dev == f->dev &&
	       st.st_ino == f->ino;
}

/* Removes the socket files that are still this daemon's. */
static void srv_unlink_own(struct server *s)
{
	for (int i = 0; i < 3; i++)
		if (srv_own_file_there(&s->rd.own[i]))
			unlink(s->rd.own[i].path);
}

/*
 * Every SRV_RUNDIR_MS: the runtime dir still holds this daemon's lock file
 * and sockets.  Once one is removed or replaced (the dir deleted, a
 * tmpfiles cleanup, an rm), no engine can reach this daemon any more; it
 * says so in the log and exits with status 1, draining like SIGTERM, so
 * that the service manager (Restart=on-failure) starts a fresh one on a
 * fresh dir.  Its abstract claim (rundir_claim) keeps a second daemon
 * from taking the path over meanwhile.
 */
static void srv_rundir_watch(struct server *s)
{
	const char *lost = NULL;
	if (s->draining || s->rd.lock_fd < 0)
		return;
	if (!rundir_lock_held(s->cfg.runtime_dir, s->rd.lock_fd))
		lost = RUNDIR_LOCK_NAME;
	for (int i = 0; !lost && i < 3; i++)
		if (s->rd.own[i].bound && !srv_own_file_there(&s->rd.own[i]))
			lost = strrchr(s->rd.own[i].path, '/') + 1;
	if (!lost)
		return;
	LOG(LOG_LVL_ERR, "runtime dir %s lost: %s was removed or replaced "
	    "under this kvtrimd, so engines can no longer reach it; shutting "
	    "down with exit status 1 (a service manager restarts it on a "
	    "fresh dir)", s->cfg.runtime_dir, lost);
	s->exit_status = 1;
	srv_shutdown(s);
}

/* ---------------------------------------------------------- lifecycle */

int server_new(const struct config *cfg, const struct config_args *args,
               struct server **out, char *err, size_t errlen)
{
	struct server *s = calloc(1, sizeof(*s));
	int rv;
	mode_t old_umask;
	if (!s)
		return KVT_ENOMEM;
	s->cfg = *cfg;
	if (args)
		s->args = *args;
	s->fdc.hsock = -1;
	s->ctl.csock = -1;
	s->rd.lock_fd = -1;
	s->rd.claim_fd = -1;
	s->next_tenant_id = 1;
	s->started_ms = now_ms();
	pthread_mutex_init(&s->acl_lock, NULL);
	stats_pub_init(&s->pub);
	s->pub_ready = 1;
	srv_allow_refresh(s);
	{
		char note[512];
		/* "auto": cuda where the library loads and sees a device, else
		 * cpu with the reason in note; "cuda" without them fails. */
		if ((rv = backend_open(cfg->backend, &s->bops, note,
		                       sizeof(note)))) {
			snprintf(err, errlen, "%s", note);
			goto fail;
		}
		if (note[0])
			LOG(LOG_LVL_NOTICE, "%s", note);
		if ((rv = s->bops->ctx_new(0, &s->bctx, &s->bmode, note,
		                           sizeof(note)))) {
			snprintf(err, errlen, "%s backend: %s", s->bops->name,
			         note[0] ? note : kvt_strerror(rv));
			s->bctx = NULL;
			goto fail;
		}
	}
	if ((rv = pool_init(&s->pool, cfg->pool_size))) {
		snprintf(err, errlen, "pool_size %" PRIu64 " holds no 2 MiB chunk",
		         cfg->pool_size);
		goto fail;
	}
	pool_set_backend(&s->pool, s->bops, s->bctx);
	srv_shares_refresh(s);
	s->tenants = calloc(cfg->max_tenants, sizeof(*s->tenants));
	s->ctl.reqs = calloc(cfg->contexts, sizeof(*s->ctl.reqs));
	if (!s->tenants || !s->ctl.reqs) {
		rv = KVT_ENOMEM;
		goto fail;
	}
	if (uv_loop_init(&s->loop)) {
		rv = KVT_ESYS;
		goto fail;
	}
	s->loop_ready = 1;
	uv_async_init(&s->loop, &s->wake, srv_wake_cb);
	s->wake.data = s;
	uv_async_init(&s->loop, &s->snap_async, srv_snap_async_cb);
	s->snap_async.data = s;
	uv_signal_init(&s->loop, &s->sigterm);
	uv_signal_init(&s->loop, &s->sigint);
	uv_signal_init(&s->loop, &s->sighup);
	s->sigterm.data = s->sigint.data = s->sighup.data = s;
	/* Catch signals before any socket exists: a supervisor (or a test)
	 * that sees the sockets may signal at once, and the default action
	 * would kill the daemon instead of draining it.  The callbacks run
	 * once server_run starts the loop. */
	signal(SIGPIPE, SIG_IGN);
	uv_signal_start(&s->sigterm, srv_signal_cb, SIGTERM);
	uv_signal_start(&s->sigint, srv_signal_cb, SIGINT);
	uv_signal_start(&s->sighup, srv_hup_cb, SIGHUP);
	uv_timer_init(&s->loop, &s->cron);
	uv_timer_init(&s->loop, &s->drain);
	uv_timer_init(&s->loop, &s->watchdog);
	s->cron.data = s->drain.data = s->watchdog.data = s;
	if (mkdir_p(cfg->runtime_dir)) {
		snprintf(err, errlen, "cannot create runtime dir %s: %s",
		         cfg->runtime_dir, strerror(errno));
		rv = KVT_ESYS;
		goto fail;
	}
	/* Nothing in the dir is touched (stale sockets removed) before the
	 * lock is ours. */
	if ((rv = srv_lock_rundir(s, err, errlen)))
		goto fail;
	srv_fd_budget(s);
	snprintf(s->ctl_path, sizeof(s->ctl_path), "%s/ctl.ipc", cfg->runtime_dir);
	snprintf(s->fd_path, sizeof(s->fd_path), "%s/fd.sock", cfg->runtime_dir);
	snprintf(s->stats_path, sizeof(s->stats_path), "%s/stats.sock",
	         cfg->runtime_dir);

	/* Socket files are born 0660: the umask covers the moment between
	 * bind and the chmod the listeners do afterwards. */
	old_umask = umask(0117);
	rv = handle_listen(s->fd_path, &s->fdc.hsock);
	umask(old_umask);
	if (rv) {
		snprintf(err, errlen, "cannot listen on %s: %s", s->fd_path,
		         strerror(errno));
		goto fail;
	}
	if ((rv = srv_ctl_open(s, err, errlen)))
		goto fail;
	uv_poll_init(&s->loop, &s->fdc.hpoll, s->fdc.hsock);
	s->fdc.hpoll.data = s;
	s->fdc.hpoll_ready = 1;
	/* The stats socket last: the HTTP thread starts serving at once and
	 * must find a snapshot to render. */
	srv_publish(s);
	if ((rv = http_start(s->stats_path,
	                     &(struct http_opts){
	                             .tcp_port = cfg->stats_tcp_port,
	                             .max_conns = cfg->stats_max_conns,
	                             .header_timeout_ms =
	                                     cfg->stats_header_timeout_ms},
	                     srv_http_render, s, &s->http, err, errlen)))
		goto fail;
	srv_socket_group(s->fd_path);
	srv_socket_group(s->ctl_path);
	srv_socket_group(s->stats_path);
	srv_own_files(s);
	*out = s;
	return 0;
fail:
	server_free(s);
	return rv;
}

int server_run(struct server *s)
{
	srv_accept_start(s);
	uv_timer_start(&s->cron, srv_cron_cb, SRV_CRON_MS, SRV_CRON_MS);
	s->watchdog_ms = notify_watchdog_period_ms();
	if (s->watchdog_ms) {
		notify_watchdog();
		uv_timer_start(&s->watchdog, srv_watchdog_cb, s->watchdog_ms,
		               s->watchdog_ms);
	}
	srv_ctl_start(s);
	LOG(LOG_LVL_NOTICE,
	    "kvtrimd ready: runtime dir %s, backend %s (%s), pool %" PRIu64
	    " bytes (%" PRIu64 " chunks)%s", s->cfg.runtime_dir,
	    s->bops->name, s->bmode, pool_bytes_total(&s->pool),
	    s->pool.chunk_capacity,
	    s->watchdog_ms ? ", systemd watchdog on" : "");
	srv_status(s);
	s->status_ms = now_ms();
	notify_ready();
	uv_run(&s->loop, UV_RUN_DEFAULT);
	LOG(LOG_LVL_NOTICE, "kvtrimd stopped%s",
	    s->exit_status ? " (exit status 1: its runtime dir was lost)" : "");
	return s->exit_status;
}

void server_free(struct server *s)
{
	if (!s)
		return;
	if (s->pub_ready)
		stats_pub_close(&s->pub);
	http_stop(s->http);
	s->http = NULL;
	if (s->loop_ready)
		srv_ctl_close(s);
	if (s->loop_ready) {
		if (!uv_is_closing((uv_handle_t *)&s->wake)) {
			/* server_run never ran: close what server_new opened. */
			srv_stop_loop(s);
		}
		uv_run(&s->loop, UV_RUN_DEFAULT);
		uv_loop_close(&s->loop);
	}
	/* Socket files are removed only by the lock's holder: they are its
	 * own (a daemon refused the lock never created any). */
	if (s->fdc.hsock >= 0)
		close(s->fdc.hsock);
	if (s->rd.lock_fd >= 0)
		srv_unlink_own(s);
	/* Every tenant and chunk is gone (srv_stop_loop reclaimed them). */
	if (s->bctx)
		s->bops->ctx_free(s->bctx);
	free(s->tenants);
	free(s->ctl.pipes);
	if (s->pub_ready)
		stats_pub_destroy(&s->pub);
	pthread_mutex_destroy(&s->acl_lock);
	rundir_unlock(s->cfg.runtime_dir, s->rd.lock_fd);
	if (s->rd.claim_fd >= 0)
		close(s->rd.claim_fd);
	free(s->ctl.reqs);
	free(s);
}
