/*
 * server.h — kvtrimd's event loop: the control socket (nng's SP req/rep
 * wire, served on the loop), the handle channel, tenants and their
 * leases, signals, and the cron timer.
 *
 * Threads: libuv's loop thread owns every piece of state.  Syncs offloaded
 * to worker threads own their tenant until they end and report back
 * through the loop (jobs.c); a driver thread only wakes the loop.
 */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include <stddef.h>

#include "config.h"

struct server;

/*
 * Creates the runtime directory, the pool and every listening socket
 * (ctl.ipc, fd.sock, stats.sock; mode 0660, group kvtrim when it exists).
 * args (may be NULL) is how cfg was built: SIGHUP rebuilds from it.
 * On failure nothing is left behind and err says why.
 */
int server_new(const struct config *cfg, const struct config_args *args,
               struct server **out, char *err, size_t errlen);

/*
 * Serves until SIGTERM or SIGINT: then stops accepting, answers new
 * requests with KVT_ESHUTDOWN, lets replies in flight finish, reclaims every
 * tenant and returns 0.  Tells systemd READY=1 once serving, STATUS= every
 * second, WATCHDOG=1 when asked, STOPPING=1 at the signal.  SIGHUP reloads
 * the config (mutable settings only; a bad file is refused and logged).
 */
int server_run(struct server *s);

/* Closes everything and removes the socket files.  NULL-safe. */
void server_free(struct server *s);

#endif
