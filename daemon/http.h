/*
 * http.h — the stats socket: HTTP/1.1 over a Unix socket (and optionally
 * 127.0.0.1:PORT), served by libmicrohttpd on its own thread.
 *
 *   GET /metrics  Prometheus text exposition (text/plain; version=0.0.4)
 *   GET /stats    the same fields as one JSON object
 *   other paths 404, other methods 405 (with Allow: GET)
 *
 * The HTTP thread never touches daemon state: it asks the render callback
 * for a body, and the callback (the server's) reads the snapshot the loop
 * thread published.  The callback therefore must be thread-safe.
 *
 * Slow clients cannot hold the socket (rules in http.c): a request head
 * must be complete within header_timeout_ms of the accept, a reply must be
 * read within 10 s, and at max_conns connections a new one closes the one
 * that has waited longest for a request.
 */
#ifndef KVT_HTTP_H
#define KVT_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "stats.h"

/*
 * Produces a body in *out (malloc'ed; the HTTP server frees it) and its
 * length; 0 or a KVT_E* code (the client then gets 503).
 */
typedef int (*http_render_fn)(void *ctx, enum stats_fmt fmt, char **out,
                              size_t *len);

struct http;

struct http_opts {
	unsigned tcp_port;          /* also 127.0.0.1:tcp_port; 0 = off */
	unsigned max_conns;         /* connections per listener (>= 1) */
	unsigned header_timeout_ms; /* request head complete by then */
};

/*
 * Creates the Unix socket at path with mode 0660 (no other mode is ever
 * visible: the umask is set around bind), listens, and starts serving;
 * with o->tcp_port != 0 also listens on 127.0.0.1:tcp_port.  A stale
 * socket file at path is replaced.  On failure nothing is left and err
 * says why.
 */
int http_start(const char *path, const struct http_opts *o,
               http_render_fn render, void *ctx, struct http **out,
               char *err, size_t errlen);

/* Stops serving (waits for the HTTP thread), closes and unlinks the
 * socket.  NULL-safe. */
void http_stop(struct http *h);

/*
 * Connections closed so far by the deadlines (timeouts) and by the limit
 * (dropped); any thread, NULL-safe (zeros).
 */
void http_counts(const struct http *h, uint64_t *timeouts,
                 uint64_t *dropped);

#endif
