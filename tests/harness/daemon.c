/* daemon.c — see daemon.h. */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "model_files.h"
#include "handle.h"
#include "rundir.h"
#include "test.h"

const char *th_bin(const char *name)
{
	static char buf[4][512];
	static int i;
	const char *dir = getenv("KVTRIM_BIN_DIR");
	char *b = buf[i++ % 4];
	snprintf(b, 512, "%s/%s", dir && *dir ? dir : "build/bin", name);
	return b;
}

const char *th_backend(void)
{
	const char *b = getenv("KVTRIM_BACKEND");
	return b && *b ? b : "cpu";
}

void th_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

uint64_t th_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* 1 while a live kvtrimd holds dir's lock (rundir_lock): its sockets are
 * not leftovers then. */
static int dir_locked(const char *dir)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, RUNDIR_LOCK_NAME);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	int busy = flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK;
	close(fd); /* drops the lock if the probe took it */
	return busy;
}

/* RLIMIT_NOFILE (soft and hard) of the daemons spawned next; 0: inherit. */
static unsigned long daemon_nofile;

void th_daemon_set_nofile(unsigned long n)
{
	daemon_nofile = n;
}

/* th_daemon_spawn with the backend and the runtime dir's name (under the
 * test's scratch dir; its log beside it) given. */
static void spawn_as(struct th_daemon *d, const char *backend,
                     const char *name, const char *pool,
                     const char *const *extra)
{
	const char *argv[64];
	int n = 0;
	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "%s/%s", th_tmpdir(), name);
	if (!strcmp(name, "rt"))
		snprintf(d->log, sizeof(d->log), "%s/kvtrimd.log", th_tmpdir());
	else
		snprintf(d->log, sizeof(d->log), "%s/kvtrimd-%s.log",
		         th_tmpdir(), name);
	argv[n++] = th_bin("kvtrimd");
	argv[n++] = "--runtime-dir";
	argv[n++] = d->dir;
	argv[n++] = "--backend";
	argv[n++] = backend;
	argv[n++] = "--pool-size";
	argv[n++] = pool ? pool : "64M";
	argv[n++] = "--log-level";
	argv[n++] = "info";
	for (int i = 0; extra && extra[i] && n < 62; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	static const char *const socks[] = {"ctl.ipc", "fd.sock", "stats.sock"};
	char paths[3][512];
	/* A killed daemon's leftovers; never a live one's sockets. */
	for (int i = 0; i < 3 && !dir_locked(d->dir); i++) {
		snprintf(paths[i], sizeof(paths[i]), "%s/%s", d->dir, socks[i]);
		unlink(paths[i]);
	}
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		struct rlimit rl = {daemon_nofile, daemon_nofile};
		if (daemon_nofile && setrlimit(RLIMIT_NOFILE, &rl))
			_exit(126);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	d->pid = pid;
}

void th_daemon_spawn(struct th_daemon *d, const char *pool,
                     const char *const *extra)
{
	spawn_as(d, th_backend(), "rt", pool, extra);
}

/* Waits until the sockets of a spawned daemon exist (fails the test when
 * it exits first or after 5 s). */
static void wait_sockets(struct th_daemon *d)
{
	static const char *const socks[] = {"ctl.ipc", "fd.sock", "stats.sock"};
	char paths[3][512];
	pid_t pid = d->pid;
	for (int i = 0; i < 3; i++)
		snprintf(paths[i], sizeof(paths[i]), "%s/%s", d->dir, socks[i]);
	for (int i = 0; i < 500; i++) {
		struct stat st;
		if (!stat(paths[0], &st) && !stat(paths[1], &st) &&
		    !stat(paths[2], &st))
			return;
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			char out[2048] = "";
			th_sh(NULL, out, sizeof(out), "cat %s", d->log);
			th_fail(__FILE__, __LINE__, "kvtrimd exited at start:\n%s",
			        out);
		}
		th_sleep_ms(10);
	}
	th_fail(__FILE__, __LINE__, "kvtrimd did not create its sockets in 5 s");
}

void th_daemon_start(struct th_daemon *d, const char *pool,
                     const char *const *extra)
{
	th_daemon_spawn(d, pool, extra);
	wait_sockets(d);
}

void th_daemon_start_as(struct th_daemon *d, const char *backend,
                        const char *name, const char *pool,
                        const char *const *extra)
{
	spawn_as(d, backend, name, pool, extra);
	wait_sockets(d);
}

int th_daemon_alive(const struct th_daemon *d)
{
	int status;
	return d->pid > 0 && waitpid(d->pid, &status, WNOHANG) == 0;
}

int th_daemon_stop(struct th_daemon *d)
{
	int status;
	if (d->pid <= 0)
		return -1;
	kill(d->pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
			d->pid = 0;
			return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		}
		th_sleep_ms(10);
	}
	kill(d->pid, SIGKILL);
	waitpid(d->pid, &status, 0);
	d->pid = 0;
	return -1;
}

int th_sh(const struct th_daemon *d, char *out, size_t outlen,
          const char *fmt, ...)
{
	char cmd[4096], full[4600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	if (d)
		snprintf(full, sizeof(full), "KVTRIM_RUNTIME_DIR='%s' %s 2>&1",
		         d->dir, cmd);
	else
		snprintf(full, sizeof(full), "%s 2>&1", cmd);
	FILE *p = popen(full, "r");
	if (!p)
		return -1;
	size_t n = 0;
	if (out && outlen) {
		out[0] = '\0';
		while (n + 1 < outlen) {
			size_t r = fread(out + n, 1, outlen - 1 - n, p);
			if (!r)
				break;
			n += r;
		}
		out[n] = '\0';
	}
	char sink[512];
	while (fread(sink, 1, sizeof(sink), p) > 0)
		;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* th_silent_peer's connection; *why says what failed when it returns
 * -1 (the daemon may refuse a connection at accept, before the header is
 * written: then the write fails). */
int th_ctl_connect(const struct th_daemon *d)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	T_ASSERT(strlen(d->dir) + sizeof("/ctl.ipc") <= sizeof(a.sun_path));
	memcpy(a.sun_path, d->dir, strlen(d->dir));
	memcpy(a.sun_path + strlen(d->dir), "/ctl.ipc", sizeof("/ctl.ipc"));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	T_ASSERT(fd >= 0);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	return fd;
}

static int silent_peer(const struct th_daemon *d, const char **why)
{
	int fd = th_ctl_connect(d);
	if (fd < 0) {
		*why = "connect";
		return -1;
	}
	/* SP header: 0, 'S', 'P', version 0, our protocol (req0 = 0x30),
	 * two reserved bytes.  The daemon's own header is never read. */
	static const uint8_t hdr[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
	if (send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) != (ssize_t)sizeof(hdr)) {
		*why = "write of the SP header";
		close(fd);
		return -1;
	}
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	return fd;
}

int th_silent_peer(const struct th_daemon *d)
{
	const char *why = "";
	int fd = silent_peer(d, &why);
	if (fd < 0)
		th_fail(__FILE__, __LINE__, "silent peer on %s/ctl.ipc: %s: %s",
		        d->dir, why, strerror(errno));
	return fd;
}

int th_silent_peer_try(const struct th_daemon *d)
{
	const char *why;
	return silent_peer(d, &why);
}

/* Writes all of buf or gives up at deadline (monotonic ms). */
static int write_until(int fd, const uint8_t *buf, size_t len,
                       uint64_t deadline)
{
	while (len) {
		ssize_t n = write(fd, buf, len);
		if (n > 0) {
			buf += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return -1;
		if (th_now_ms() >= deadline)
			return -1;
		th_sleep_ms(5);
	}
	return 0;
}

uint32_t th_silent_send(int fd, const void *body, size_t len, uint32_t count,
                        int budget_ms)
{
	/* Frame: type 1, u64 big-endian length, then the req0 header (the
	 * request id, high bit set) and the body. */
	size_t flen = 9 + 4 + len;
	uint8_t *f = malloc(flen);
	T_ASSERT(f);
	uint64_t plen = 4 + len;
	f[0] = 1;
	for (int i = 0; i < 8; i++)
		f[1 + i] = (uint8_t)(plen >> (56 - 8 * i));
	memcpy(f + 13, body, len);
	uint64_t deadline = th_now_ms() + (uint64_t)budget_ms;
	static uint32_t next_id = 1;
	uint32_t sent = 0;
	for (; sent < count; sent++) {
		uint32_t id = 0x80000000u | next_id++;
		for (int i = 0; i < 4; i++)
			f[9 + i] = (uint8_t)(id >> (24 - 8 * i));
		if (write_until(fd, f, flen, deadline))
			break;
	}
	free(f);
	return sent;
}

int th_raw_welcome(const struct th_daemon *d, int *hfd, uint64_t *cookie)
{
	char path[600];
	struct handle_msg m;
	int fd = -1, rc;
	snprintf(path, sizeof(path), "%s/fd.sock", d->dir);
	if ((rc = handle_connect(path, hfd)))
		return rc;
	if ((rc = handle_recv(*hfd, &m, &fd, 2000)) ||
	    m.type != HANDLE_WELCOME) {
		if (fd >= 0)
			close(fd);
		close(*hfd);
		*hfd = -1;
		return rc ? rc : KVT_EPROTO;
	}
	*cookie = m.cookie;
	return 0;
}

int th_raw_request(const struct th_daemon *d, uint32_t sock,
                   const struct ipc_req *q, struct ipc_rep *r, char *why,
                   size_t wlen)
{
	uint8_t *buf = NULL, *rep = NULL;
	size_t len = 0, rl = 0;
	int rc;
	memset(r, 0, sizeof(*r));
	if (!(rc = codec_req_encode(q, &buf, &len)) &&
	    !(rc = sock ? th_raw_call(sock, buf, len, &rep, &rl)
	                : th_raw_req(d, buf, len, &rep, &rl)))
		rc = codec_rep_decode(q->op, rep, rl, r, why, wlen);
	else
		snprintf(why, wlen, "no reply: %s", kvt_strerror(rc));
	free(buf);
	free(rep);
	return rc;
}

uint8_t *th_stats_req(size_t *len)
{
	struct ipc_req q;
	uint8_t *buf = NULL;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = IPC_OP_STATS;
	T_OK(codec_req_encode(&q, &buf, len));
	return buf;
}

uint32_t th_raw_conn(const struct th_daemon *d)
{
	nng_socket s;
	char url[600];
	snprintf(url, sizeof(url), "ipc://%s/ctl.ipc", d->dir);
	T_ASSERT(nng_req0_open(&s) == 0);
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 3000);
	nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	int rv = nng_dial(s, url, NULL, 0);
	if (rv)
		th_fail(__FILE__, __LINE__, "dial %s: %s", url, nng_strerror(rv));
	return s.id;
}

int th_raw_call(uint32_t sock, const void *buf, size_t len, uint8_t **rep,
                size_t *replen)
{
	nng_socket s = {.id = sock};
	nng_msg *m;
	int rv;
	if ((rv = nng_msg_alloc(&m, 0)) || (rv = nng_msg_append(m, buf, len)))
		return KVT_ENOMEM;
	if ((rv = nng_sendmsg(s, m, 0))) {
		nng_msg_free(m);
		return rv == NNG_ETIMEDOUT ? KVT_ETIMEDOUT : KVT_ECONN;
	}
	if ((rv = nng_recvmsg(s, &m, 0)))
		return rv == NNG_ETIMEDOUT ? KVT_ETIMEDOUT : KVT_ECONN;
	*replen = nng_msg_len(m);
	*rep = malloc(*replen ? *replen : 1);
	memcpy(*rep, nng_msg_body(m), *replen);
	nng_msg_free(m);
	return 0;
}

void th_raw_close(uint32_t sock)
{
	nng_socket s = {.id = sock};
	nng_close(s);
}

int th_raw_req(const struct th_daemon *d, const void *buf, size_t len,
               uint8_t **rep, size_t *replen)
{
	uint32_t s = th_raw_conn(d);
	int rv = th_raw_call(s, buf, len, rep, replen);
	th_raw_close(s);
	return rv;
}

uint64_t th_stat(const struct th_daemon *d, const char *key)
{
	char out[8192];
	int rc = th_sh(d, out, sizeof(out), "%s stats", th_bin("kvtrimctl"));
	if (rc != 0)
		th_fail(__FILE__, __LINE__, "kvtrimctl stats failed (%d): %s",
		        rc, out);
	size_t kl = strlen(key);
	for (char *line = out; line && *line;) {
		char *nl = strchr(line, '\n');
		if (!strncmp(line, key, kl) && (line[kl] == ' ' || line[kl] == '\t'))
			return strtoull(line + kl + 1, NULL, 10);
		line = nl ? nl + 1 : NULL;
	}
	th_fail(__FILE__, __LINE__, "kvtrimctl stats has no '%s':\n%s", key, out);
}

void th_daemon_kill(struct th_daemon *d)
{
	int status;
	if (d->pid <= 0)
		return;
	kill(d->pid, SIGKILL);
	waitpid(d->pid, &status, 0);
	d->pid = 0;
}

int th_http(const struct th_daemon *d, const char *method, const char *path,
            char *out, size_t outlen)
{
	static char buf[1 << 18];
	char dummy[8];
	if (th_sh(NULL, dummy, sizeof(dummy), "command -v curl") != 0)
		th_skip("curl is not installed");
	int rc = th_sh(NULL, buf, sizeof(buf),
	               "curl -s -m 5 -X %s -w '\\n%%{http_code}' "
	               "--unix-socket %s/stats.sock http://localhost%s",
	               method ? method : "GET", d->dir, path);
	char *nl = strrchr(buf, '\n');
	if (rc != 0 || !nl)
		return 0;
	int code = atoi(nl + 1);
	*nl = '\0';
	if (out && outlen)
		snprintf(out, outlen, "%s", buf);
	return code;
}

double th_metric_or(const struct th_daemon *d, const char *series)
{
	static char body[1 << 18];
	if (th_http(d, NULL, "/metrics", body, sizeof(body)) != 200)
		th_fail(__FILE__, __LINE__, "GET /metrics failed");
	size_t n = strlen(series);
	for (char *line = body; line && *line;) {
		char *nl = strchr(line, '\n');
		if (!strncmp(line, series, n) && line[n] == ' ')
			return strtod(line + n + 1, NULL);
		line = nl ? nl + 1 : NULL;
	}
	return -1;
}

double th_metric(const struct th_daemon *d, const char *series)
{
	double v = th_metric_or(d, series);
	if (v < 0)
		th_fail(__FILE__, __LINE__, "/metrics has no %s", series);
	return v;
}

struct kvt_config th_small_cfg(const struct th_daemon *d, const char *name,
                               const char *policy)
{
	struct kvt_config c;
	memset(&c, 0, sizeof(c));
	c.runtime_dir = d->dir;
	c.tenant = name;
	c.geo = (struct kvt_geometry){2, 4, 2, 8, 32};
	c.dtype = KVT_DTYPE_F32;
	c.page_tokens = 4;
	c.max_seqs = 4;
	c.max_tokens = 64;
	c.headroom = 4;
	c.policy = policy;
	c.timeout_ms = 3000;
	return c;
}

void th_stage_row(kvt_client *c, kvt_seq s, uint32_t l, uint32_t p,
                  const float *qv)
{
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	uint32_t in = kvt_policy_inputs(c);
	float *x = kvt_stage_x(c, s, l, p);
	float *q = kvt_stage_q(c, s, l, p);
	float *lse = kvt_stage_lse(c, s, l, p);
	T_EQ(!!x, !!(in & KVT_INPUT_X));
	T_EQ(!!q, !!(in & KVT_INPUT_Q));
	T_EQ(!!lse, !!(in & KVT_INPUT_LSE));
	uint32_t nq = g->n_heads * g->head_dim;
	float *row = malloc(sizeof(float) * (g->d_model + nq + g->n_heads));
	T_ASSERT(row);
	for (uint32_t i = 0; i < g->d_model; i++)
		row[i] = 0.25f;
	for (uint32_t i = 0; i < nq; i++)
		row[g->d_model + i] = qv ? qv[i] : 0.1f;
	for (uint32_t i = 0; i < g->n_heads; i++)
		row[g->d_model + nq + i] = logf((float)(p + 1));
	if (x)
		th_put(c, x, row, sizeof(float) * g->d_model);
	if (q)
		th_put(c, q, row + g->d_model, sizeof(float) * nq);
	if (lse)
		th_put(c, lse, row + g->d_model + nq, sizeof(float) * g->n_heads);
	free(row);
}

void th_put(kvt_client *c, void *dst, const void *src, size_t bytes)
{
	T_OK(kvt_memcpy(c, dst, src, bytes));
}

void th_put_f32(kvt_client *c, float *dst, float v)
{
	th_put(c, dst, &v, sizeof(v));
}

void th_need_heldout(void)
{
	if (access(TH_HELDOUT, R_OK))
		th_skip(TH_HELDOUT " (the held-out text) not found");
}

void th_skip_emulated_engine(const char *what)
{
	const char *emu = getenv("KVTRIM_CUDA_EMU");
	if (strcmp(th_backend(), "cuda") || !emu || !*emu)
		return;
	char why[512];
	snprintf(why, sizeof(why), "%s through the engine on the emulated "
	         "cuda backend: its attention kernel on the CPU emulator is "
	         "too slow for this (runs on the cpu pass and on a GPU)",
	         what);
	th_skip(why);
}

void th_need_smollm2_eval(void)
{
	char path[1024], err[1024];
	if (model_files_resolve("smollm2", path, sizeof(path), err,
	                        sizeof(err)))
		th_skip(err);
	if (access(th_bin("kvtrim-eval"), X_OK))
		th_skip("kvtrim-eval not built");
	th_need_heldout();
}

long th_rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	T_ASSERT(f);
	long kib = -1;
	while (kib < 0 && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) != 1)
			kib = -1;
	fclose(f);
	T_ASSERT(kib > 0);
	return kib;
}
