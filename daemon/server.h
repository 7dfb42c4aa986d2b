/*
 * server.h — kvtrimd's event loop: the nng control socket, the handle
 * channel, tenants and their leases, signals, and the cron timer.
 *
 * Threads: libuv's loop thread owns every piece of state.  nng completes
 * requests on its own threads; those callbacks only push the context onto a
 * mutex-protected queue and wake the loop with uv_async_send (libuv may
 * coalesce wake-ups, so the loop drains the whole queue each time).
 */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include <stddef.h>

#include "config.h"

struct server;

/*
 * Creates the runtime directory, the pool and every listening socket.
 * On failure nothing is left behind and err says why.
 */
int server_new(const struct config *cfg, struct server **out, char *err,
               size_t errlen);

/*
 * Serves until SIGTERM or SIGINT: then stops accepting, answers new
 * requests with KVT_ESHUTDOWN, lets replies in flight finish, reclaims every
 * tenant and returns 0.
 */
int server_run(struct server *s);

/* Closes everything and removes the socket files.  NULL-safe. */
void server_free(struct server *s);

#endif
