/*
 * http.c — see http.h.
 *
 * The Unix socket is created here rather than by libmicrohttpd (which only
 * binds TCP) and handed over with MHD_OPTION_LISTEN_SOCKET; MHD closes it
 * at stop.  One internal polling thread serves every connection: requests
 * are tiny and rare, and the render callback does the real work elsewhere.
 */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvtrim.h"
#include "log.h"

#define HTTP_CONN_LIMIT 32
#define HTTP_CONN_TIMEOUT_S 10

struct http {
	struct MHD_Daemon *unix_d;
	struct MHD_Daemon *tcp_d;
	http_render_fn render;
	void *ctx;
	char path[PATH_MAX];
};

static void http_log(void *cls, const char *fmt, va_list ap)
{
	char buf[512];
	vsnprintf(buf, sizeof(buf), fmt, ap);
	size_t n = strlen(buf);
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	LOG(LOG_LVL_WARNING, "stats socket: %s", buf);
}

static enum MHD_Result http_reply(struct MHD_Connection *conn,
                                  unsigned status, const char *type,
                                  char *body, size_t len, int owned)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		if (owned)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET");
	enum MHD_Result rv = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return rv;
}

#define HTTP_TEXT "text/plain; charset=utf-8"

static enum MHD_Result http_handle(void *cls, struct MHD_Connection *conn,
                                   const char *url, const char *method,
                                   const char *version,
                                   const char *upload_data,
                                   size_t *upload_data_size, void **req_cls)
{
	static const char not_found[] =
		"not found: try /metrics (Prometheus) or /stats (JSON)\n";
	static const char not_allowed[] = "method not allowed: use GET\n";
	static const char unavailable[] = "statistics unavailable\n";
	struct http *h = cls;
	enum stats_fmt fmt;

	if (strcmp(method, MHD_HTTP_METHOD_GET))
		return http_reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, HTTP_TEXT,
		                  (char *)not_allowed, sizeof(not_allowed) - 1,
		                  0);
	if (!strcmp(url, "/metrics"))
		fmt = STATS_FMT_PROM;
	else if (!strcmp(url, "/stats"))
		fmt = STATS_FMT_JSON;
	else
		return http_reply(conn, MHD_HTTP_NOT_FOUND, HTTP_TEXT,
		                  (char *)not_found, sizeof(not_found) - 1, 0);

	char *body = NULL;
	size_t len = 0;
	if (h->render(h->ctx, fmt, &body, &len))
		return http_reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, HTTP_TEXT,
		                  (char *)unavailable, sizeof(unavailable) - 1,
		                  0);
	return http_reply(conn, MHD_HTTP_OK,
	                  fmt == STATS_FMT_PROM
	                          ? "text/plain; version=0.0.4; charset=utf-8"
	                          : "application/json",
	                  body, len, 1);
}

static int unix_listen(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa;
	struct stat st;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "%s: path too long for a Unix socket", path);
		return -1;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	/* A socket file left by a daemon that died is replaced; anything
	 * else at that path is not ours to remove. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	mode_t old = umask(0117);
	int rv = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	umask(old);
	if (rv < 0 || listen(fd, 64) < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", path,
		         strerror(rv < 0 ? e : errno));
		if (rv == 0)
			unlink(path);
		close(fd);
		return -1;
	}
	return fd;
}

int http_start(const char *path, unsigned tcp_port, http_render_fn render,
               void *ctx, struct http **out, char *err, size_t errlen)
{
	const unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
	                       MHD_USE_ERROR_LOG;
	struct http *h = calloc(1, sizeof(*h));
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return KVT_ENOMEM;
	}
	h->render = render;
	h->ctx = ctx;
	snprintf(h->path, sizeof(h->path), "%s", path);
	int fd = unix_listen(path, err, errlen);
	if (fd < 0) {
		free(h);
		return KVT_ESYS;
	}
	h->unix_d = MHD_start_daemon(
		flags, 0, NULL, NULL, http_handle, h,
		MHD_OPTION_EXTERNAL_LOGGER, http_log, NULL,
		MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_LIMIT,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_CONN_TIMEOUT_S,
		MHD_OPTION_END);
	if (!h->unix_d) {
		snprintf(err, errlen, "libmicrohttpd cannot serve %s", path);
		close(fd);
		unlink(path);
		free(h);
		return KVT_ESYS;
	}
	if (tcp_port) {
		struct sockaddr_in sin;
		memset(&sin, 0, sizeof(sin));
		sin.sin_family = AF_INET;
		sin.sin_port = htons((uint16_t)tcp_port);
		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		h->tcp_d = MHD_start_daemon(
			flags, (uint16_t)tcp_port, NULL, NULL, http_handle, h,
			MHD_OPTION_EXTERNAL_LOGGER, http_log, NULL,
			MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
			MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_LIMIT,
			MHD_OPTION_CONNECTION_TIMEOUT,
			(unsigned)HTTP_CONN_TIMEOUT_S,
			MHD_OPTION_END);
		if (!h->tcp_d) {
			snprintf(err, errlen, "cannot serve stats on "
			         "127.0.0.1:%u (port in use?)", tcp_port);
			http_stop(h);
			return KVT_ESYS;
		}
	}
	*out = h;
	return 0;
}

void http_stop(struct http *h)
{
	if (!h)
		return;
	if (h->tcp_d)
		MHD_stop_daemon(h->tcp_d);
	if (h->unix_d)
		MHD_stop_daemon(h->unix_d);
	unlink(h->path);
	free(h);
}
