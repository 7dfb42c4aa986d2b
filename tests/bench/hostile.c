/*
 * hostile.c — the hostile-client figures of kvtrim-bench (docs/bench.md,
 * "Hostile clients"): a healthy verifying engine's sync latency alone and
 * while one adversary runs beside it, one phase per adversary on a fresh
 * kvtrimd.  A window is a count of paced one-token decode syncs, each
 * timed and each followed by a check of every list against the streaming
 * rule; a failed sync, reconnect or list is an error and a sample at the
 * timeout, and a window ends at its count or its deadline, so a frozen
 * daemon shows as errors and a p99 at the cap.  Each adversary
 * (hostile_adv.c) is this binary with --adversary, reporting "ready k=v"
 * and "stat k=v" lines on its fd 3, printed as hostile_<key>_<adversary>.
 * The runner hooks the harness helpers need (th_fail, th_skip, th_tmpdir)
 * are defined here.  KVTRIM_BENCH_HOSTILE=name[,...] runs only those phases.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "codec.h"
#include "daemon.h"
#include "handle.h"
#include "hostile.h"
#include "test.h"

#define H_POOL "1G"
#define H_TIMEOUT_MS 1000  /* the healthy engine's client timeout: the cap */
#define H_PACE_US 2000     /* a sync starts at most every 2 ms */
#define H_WARMUP 300       /* syncs before the adversary: past the budget */
#define H_SINKS 4u         /* bench_small_cfg's streaming:sinks=4, */
#define H_BUDGET 256u      /* tokens=256 */
#define H_HTTP_MS 2000     /* one GET /metrics, at most */
#define H_METRICS_EVERY_MS 200
#define H_MAX_FETCH 256
#define H_MAX_KV 12

double hostile_now_ms(void)
{
	return bench_now_us() / 1e3;
}

void hostile_sleep_ms(double ms)
{
	if (ms <= 0)
		return;
	struct timespec ts = {(time_t)(ms / 1e3),
	                      (long)(fmod(ms, 1e3) * 1e6)};
	nanosleep(&ts, NULL);
}

/* ------------------------------------------------ harness runner hooks */

/* The scratch directory th_daemon_spawn puts rt/ and kvtrimd.log in. */
static char hostile_tmp[512];

/*
 * A failed harness helper ends the process it runs in.  In an adversary
 * that stops the attack (the parent reports what it had); in the bench
 * itself only th_daemon_spawn's fork can fail that way.
 */
void th_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "kvtrim-bench: %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	_exit(1);
}

void th_skip(const char *why)
{
	fprintf(stderr, "kvtrim-bench: %s\n", why);
	_exit(1);
}

const char *th_tmpdir(void)
{
	return hostile_tmp;
}

/* ------------------------------------------------ sockets */

/* A non-blocking connection to dir/name, or -1 (a full backlog: EAGAIN). */
int hostile_unix_connect(const char *dir, const char *name, int type)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if ((size_t)snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir,
	                     name) >= sizeof(a.sun_path))
		return -1;
	int fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* 1 when the peer closed fd (or it failed). */
int hostile_hung_up(int fd)
{
	struct pollfd p = {fd, 0, 0};
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

/* Waits until fd is ready for events or deadline (ms); 1 when ready. */
int hostile_wait_fd(int fd, short events, double deadline)
{
	for (;;) {
		double left = deadline - hostile_now_ms();
		if (left <= 0)
			return 0;
		struct pollfd p = {fd, events, 0};
		int n = poll(&p, 1, (int)left + 1);
		if (n > 0)
			return 1;
		if (n < 0 && errno != EINTR)
			return 0;
	}
}

/*
 * GET path on dir/stats.sock (HTTP/1.1, Connection: close), bounded by
 * timeout_ms: 1 when the status line says 200 and the server ended the
 * answer in time, else 0.
 */
static int http_get(const char *dir, const char *path, int timeout_ms)
{
	double deadline = hostile_now_ms() + timeout_ms;
	int fd = hostile_unix_connect(dir, "stats.sock", SOCK_STREAM);
	if (fd < 0)
		return 0;
	char req[256], head[16] = "";
	int len = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: "
	                   "localhost\r\nConnection: close\r\n\r\n", path);
	int off = 0, ok = 0;
	size_t got = 0;
	while (off < len && hostile_wait_fd(fd, POLLOUT, deadline)) {
		ssize_t n = send(fd, req + off, (size_t)(len - off),
		                 MSG_NOSIGNAL);
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			break;
		off += n > 0 ? (int)n : 0;
	}
	while (off == len && hostile_wait_fd(fd, POLLIN, deadline)) {
		char buf[4096];
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n == 0) {
			ok = !strncmp(head, "HTTP/1.1 200", 12) ||
			     !strncmp(head, "HTTP/1.0 200", 12);
			break;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			break;
		for (ssize_t i = 0; i < n && got + 1 < sizeof(head); i++)
			head[got++] = buf[i];
	}
	close(fd);
	return ok;
}

/* ------------------------------------------------ the healthy engine */

struct heng {
	kvt_client *c; /* NULL while disconnected */
	kvt_seq seq;
	uint32_t n;    /* tokens synced into seq; position = V element 0 */
};

static void heng_close(struct heng *e)
{
	kvt_disconnect(e->c);
	e->c = NULL;
}

static int heng_open(struct heng *e, const char *dir)
{
	struct kvt_config cfg;
	char err[KVT_ERRTEXT_MAX];
	bench_small_cfg(&cfg, dir, "healthy", 1);
	cfg.timeout_ms = H_TIMEOUT_MS;
	e->n = 0;
	int rc = kvt_connect(&cfg, &e->c, err);
	if (rc) {
		e->c = NULL;
		return rc;
	}
	if ((rc = kvt_seq_open(e->c, &e->seq)))
		heng_close(e);
	return rc;
}

/*
 * Checks every list against the streaming rule (policies/streaming.c):
 * with n tokens seen, all are kept while n <= 256, else positions < 4 and
 * >= n - 252, each once.  KVT_EINVARIANT on a mismatch.
 */
static int heng_verify(const struct heng *e)
{
	static uint8_t seen[1u << 16]; /* [position] */
	const struct kvt_config *cfg = kvt_config_of(e->c);
	uint32_t n = e->n, P = cfg->page_tokens, hd = cfg->geo.head_dim;
	uint32_t want = n < H_BUDGET ? n : H_BUDGET;
	for (uint32_t l = 0; l < cfg->geo.n_layers; l++)
		for (uint32_t h = 0; h < cfg->geo.n_kv_heads; h++) {
			struct kvt_list li;
			int rc = kvt_list_get(e->c, e->seq, l, h, &li);
			if (rc)
				return rc;
			if (li.len != want)
				return KVT_EINVARIANT;
			memset(seen, 0, n);
			for (uint32_t i = 0; i < li.len; i++) {
				const uint16_t *pg =
					kvt_page_ptr(e->c, li.pages[i / P]);
				if (!pg)
					return KVT_EINVARIANT;
				uint32_t pos = pg[(size_t)(P + i % P) * hd];
				int keep = n <= H_BUDGET || pos < H_SINKS ||
				           pos >= n - (H_BUDGET - H_SINKS);
				if (pos >= n || seen[pos] || !keep)
					return KVT_EINVARIANT;
				seen[pos] = 1;
			}
		}
	return 0;
}

/* Appends one token (its position in K's and V's element 0 of every list),
 * syncs it (*us: the kvt_sync call alone) and verifies. */
static int heng_step(struct heng *e, double *us)
{
	const struct kvt_config *cfg = kvt_config_of(e->c);
	*us = 0;
	if (e->n >= UINT16_MAX) /* positions are 16-bit */
		return KVT_ETOOLONG;
	for (uint32_t l = 0; l < cfg->geo.n_layers; l++)
		for (uint32_t h = 0; h < cfg->geo.n_kv_heads; h++) {
			void *kp, *vp;
			int rc = kvt_kv_ptr(e->c, e->seq, l, h, 0, &kp, &vp);
			if (rc)
				return rc;
			((uint16_t *)kp)[0] = (uint16_t)e->n;
			((uint16_t *)vp)[0] = (uint16_t)e->n;
		}
	struct kvt_sync_item it = {e->seq, 1, KVT_PHASE_DECODE, 0, 0};
	double t0 = bench_now_us();
	int rc = kvt_sync(e->c, &it, 1);
	*us = bench_now_us() - t0;
	if (rc)
		return rc;
	e->n++;
	return heng_verify(e);
}

/* ------------------------------------------------ /metrics in a thread */

struct hmetrics {
	pthread_t th;
	const char *dir;
	int stop;                 /* atomic: set by the engine's thread */
	double ms[H_MAX_FETCH];   /* each fetch; a failed one = H_HTTP_MS */
	int n, errors;
};

static void *metrics_main(void *arg)
{
	struct hmetrics *m = arg;
	while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE) &&
	       m->n < H_MAX_FETCH) {
		double t0 = hostile_now_ms();
		double ms = H_HTTP_MS;
		if (http_get(m->dir, "/metrics", H_HTTP_MS))
			ms = hostile_now_ms() - t0;
		else
			m->errors++;
		m->ms[m->n++] = ms < H_HTTP_MS ? ms : H_HTTP_MS;
		while (!__atomic_load_n(&m->stop, __ATOMIC_ACQUIRE) &&
		       hostile_now_ms() < t0 + H_METRICS_EVERY_MS)
			hostile_sleep_ms(10);
	}
	return NULL;
}

/* ------------------------------------------------ adversary processes */

struct hkv {
	char key[32];
	double v;
};

struct adv {
	pid_t pid;
	int rfd;         /* read end of the child's fd 3 */
	char line[512];  /* partial line */
	size_t len;
	int ready;
	int n_kv;
	struct hkv kv[H_MAX_KV];
};

static void adv_set(struct adv *a, const char *key, size_t klen, double v)
{
	int i = 0;
	while (i < a->n_kv && (strlen(a->kv[i].key) != klen ||
	                       strncmp(a->kv[i].key, key, klen)))
		i++;
	if (i == a->n_kv) {
		if (a->n_kv == H_MAX_KV || klen >= sizeof(a->kv[i].key))
			return;
		memcpy(a->kv[i].key, key, klen);
		a->kv[i].key[klen] = '\0';
		a->n_kv++;
	}
	a->kv[i].v = v;
}

/* One line: "ready k=v ..." or "stat k=v ...". */
static void adv_line(struct adv *a, char *s)
{
	if (!strncmp(s, "ready", 5))
		a->ready = 1;
	for (char *tok = strtok(s, " "); tok; tok = strtok(NULL, " ")) {
		char *eq = strchr(tok, '=');
		if (eq)
			adv_set(a, tok, (size_t)(eq - tok),
			        strtod(eq + 1, NULL));
	}
}

/* Reads what the child wrote so far; 0 once it closed its end. */
static int adv_drain(struct adv *a)
{
	for (;;) {
		char buf[1024];
		ssize_t n = read(a->rfd, buf, sizeof(buf));
		if (n == 0)
			return 0;
		if (n < 0)
			return errno == EAGAIN || errno == EINTR;
		for (ssize_t i = 0; i < n; i++) {
			if (buf[i] != '\n') {
				if (a->len + 1 < sizeof(a->line))
					a->line[a->len++] = buf[i];
				continue;
			}
			a->line[a->len] = '\0';
			adv_line(a, a->line);
			a->len = 0;
		}
	}
}

static int adv_spawn(struct adv *a, const char *self, const char *name,
                     const char *rt, int quick)
{
	int p[2];
	memset(a, 0, sizeof(*a));
	a->rfd = -1;
	if (pipe2(p, O_CLOEXEC))
		return -1;
	pid_t parent = getpid();
	a->pid = fork();
	if (a->pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (a->pid == 0) {
		/* Dies with the bench; only async-signal-safe calls here. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		if (p[1] == 3)
			fcntl(3, F_SETFD, 0);
		else if (dup2(p[1], 3) < 0)
			_exit(127);
		close_range(4, ~0u, 0);
		execl(self, self, "--adversary", name, "--runtime-dir", rt,
		      quick ? "--quick" : (char *)NULL, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	a->rfd = p[0];
	fcntl(a->rfd, F_SETFL, O_NONBLOCK);
	return 0;
}

/* Waits for the child's "ready" line; 1 when it came in budget_ms. */
static int adv_wait_ready(struct adv *a, double budget_ms)
{
	double deadline = hostile_now_ms() + budget_ms;
	while (!a->ready && adv_drain(a) && hostile_wait_fd(a->rfd, POLLIN, deadline))
		;
	if (!a->ready)
		adv_drain(a);
	return a->ready;
}

/* Kills the child and collects its last figures. */
static void adv_stop(struct adv *a)
{
	if (a->pid > 0) {
		adv_drain(a);
		kill(a->pid, SIGKILL);
		waitpid(a->pid, NULL, 0);
		a->pid = 0;
	}
	if (a->rfd >= 0) {
		adv_drain(a);
		close(a->rfd);
		a->rfd = -1;
	}
}

/* ------------------------------------------------ phases */

/* One measurement window of the healthy engine. */
struct hwin {
	double *t;          /* [n] samples, us (kept for the pooled alone) */
	int n, errors;      /* samples; failed syncs, reconnects and checks,
	                       and failed /metrics fetches */
	double p50_us, p99_us;
	double m_p99_ms;    /* /metrics, where fetched */
	int m_errors;
	/* What the window cost: the daemon's CPU time and the busy time of
	 * the whole machine (every CPU, every process), in percent of one
	 * CPU over the window's wall time; NAN where /proc cannot say. */
	double daemon_cpu_pct, busy_pct;
};

/* CPU time of process pid (user + system), in clock ticks; -1: unknown. */
static long long proc_ticks(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* After the command's closing parenthesis: state is field 3,
	 * utime 14, stime 15. */
	const char *p = strrchr(buf, ')');
	unsigned long long ut, st;
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
	                 "%llu %llu", &ut, &st) != 2)
		return -1;
	return (long long)(ut + st);
}

/* Busy ticks of the whole machine (all CPUs: everything but idle and
 * iowait); -1: unknown. */
static long long machine_busy_ticks(void)
{
	FILE *f = fopen("/proc/stat", "r");
	if (!f)
		return -1;
	unsigned long long v[8] = {0};
	int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
	               &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
	fclose(f);
	if (n != 8)
		return -1;
	return (long long)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
}

/*
 * A phase: the engine alone on a fresh daemon (before), then beside the
 * adversary (beside).  The ratio compares the two windows of one phase,
 * adjacent in time on the same daemon, so load from other processes that
 * changes over the run weighs on both alike.
 */
struct hphase {
	const struct hostile_adv *adv;
	int ran;            /* the engine was warm when the phase began */
	struct hwin before, beside;
	int n_kv;
	struct hkv kv[H_MAX_KV];
};

static struct hostile_state {
	int quick;
	const char *self;
	struct hphase ph[HOSTILE_N_ADV];
	struct hwin alone;  /* every phase's before window, pooled */
} hs;

static int daemon_up(struct th_daemon *d)
{
	static const char *const socks[] = {"ctl.ipc", "fd.sock", "stats.sock"};
	for (int tries = 0; tries < 500; tries++) {
		int up = 0;
		for (int i = 0; i < 3; i++) {
			char p[600];
			struct stat st;
			snprintf(p, sizeof(p), "%s/%s", d->dir, socks[i]);
			up += !stat(p, &st);
		}
		if (up == 3)
			return 1;
		if (!th_daemon_alive(d)) {
			d->pid = 0;
			return 0;
		}
		hostile_sleep_ms(10);
	}
	return 0;
}

static void win_stats(struct hwin *w)
{
	w->p50_us = w->p99_us = NAN;
	if (!w->n)
		return;
	double *tmp = malloc(sizeof(double) * (size_t)w->n);
	if (!tmp)
		return;
	memcpy(tmp, w->t, sizeof(double) * (size_t)w->n);
	w->p50_us = bench_pct(tmp, w->n, 0.5);
	w->p99_us = bench_pct(tmp, w->n, 0.99);
	free(tmp);
}

/* The paced, timed, verified syncs of one window (what: for messages),
 * with /metrics fetched in a thread beside them when metrics is set, and
 * a disconnect and a connect again (not timed; a failure is an error)
 * every reconnect syncs when that is not 0. */
static void measure(struct hwin *w, const char *what, struct heng *e,
                    const char *dir, int metrics, int reconnect,
                    pid_t daemon)
{
	const long long d0 = proc_ticks(daemon), b0 = machine_busy_ticks();
	const double w0 = hostile_now_ms();
	int count = hs.quick ? 400 : 2000;
	double deadline = hostile_now_ms() + (hs.quick ? 3000 : 10000);
	double next = bench_now_us(), cap = H_TIMEOUT_MS * 1e3;
	struct hmetrics m;
	memset(&m, 0, sizeof(m));
	m.dir = dir;
	int fetch = metrics && !pthread_create(&m.th, NULL, metrics_main, &m);
	w->t = malloc(sizeof(double) * (size_t)count);
	for (w->n = 0; w->t && w->n < count && hostile_now_ms() < deadline; w->n++) {
		double wait = next - bench_now_us();
		if (wait > 0)
			hostile_sleep_ms(wait / 1e3);
		next = bench_now_us() + H_PACE_US;
		double us = 0;
		if (reconnect && w->n && w->n % reconnect == 0)
			heng_close(e);
		int rc = e->c ? 0 : heng_open(e, dir);
		if (!rc)
			rc = heng_step(e, &us);
		if (rc) {
			if (!w->errors)
				fprintf(stderr, "kvtrim-bench: hostile %s: %s "
				        "(%s)\n", what, kvt_strerror(rc),
				        e->c ? kvt_last_error(e->c)
				             : "reconnect");
			w->errors++;
			us = cap;
			heng_close(e);
		}
		w->t[w->n] = us < cap ? us : cap;
	}
	win_stats(w);
	const long long d1 = proc_ticks(daemon), b1 = machine_busy_ticks();
	const double wall_s = (hostile_now_ms() - w0) / 1e3,
	             tick = (double)sysconf(_SC_CLK_TCK);
	w->daemon_cpu_pct = d0 >= 0 && d1 >= 0 && wall_s > 0
	                    ? 100.0 * (double)(d1 - d0) / tick / wall_s : NAN;
	w->busy_pct = b0 >= 0 && b1 >= 0 && wall_s > 0
	              ? 100.0 * (double)(b1 - b0) / tick / wall_s : NAN;
	w->m_p99_ms = NAN;
	if (fetch) {
		__atomic_store_n(&m.stop, 1, __ATOMIC_RELEASE);
		pthread_join(m.th, NULL);
		if (m.n)
			w->m_p99_ms = bench_pct(m.ms, m.n, 0.99);
		w->m_errors = m.errors;
		w->errors += m.errors;
	}
}

static void phase_run(struct hphase *ph, const char *tmp_dir)
{
	const struct hostile_adv *adv = ph->adv;
	struct th_daemon d;
	struct heng e = {0};
	struct adv a = {.pid = 0, .rfd = -1};
	double t0 = hostile_now_ms(), us;
	char what[64];
	ph->before.p50_us = ph->before.p99_us = ph->before.m_p99_ms = NAN;
	ph->before.daemon_cpu_pct = ph->before.busy_pct = NAN;
	ph->beside = ph->before;
	snprintf(hostile_tmp, sizeof(hostile_tmp), "%s/h-%s", tmp_dir,
	         adv->name);
	mkdir(hostile_tmp, 0700);
	if (adv->other_uid) {
		chmod(tmp_dir, 0750);
		chmod(hostile_tmp, 0750);
	}
	th_daemon_spawn(&d, H_POOL, adv->daemon_args);
	if (!daemon_up(&d)) {
		fprintf(stderr, "kvtrim-bench: hostile %s: kvtrimd did not "
		        "start (%s)\n", adv->name, d.log);
		goto out;
	}
	int rc = heng_open(&e, d.dir);
	for (int i = 0; !rc && i < H_WARMUP; i++)
		rc = heng_step(&e, &us);
	if (rc) {
		fprintf(stderr, "kvtrim-bench: hostile %s: the engine failed "
		        "before the adversary: %s\n", adv->name,
		        kvt_strerror(rc));
		goto out;
	}
	ph->ran = 1;
	snprintf(what, sizeof(what), "%s (alone)", adv->name);
	measure(&ph->before, what, &e, d.dir, adv->metrics,
	        adv->reconnect_every, d.pid);
	if (adv_spawn(&a, hs.self, adv->name, d.dir, hs.quick) ||
	    !adv_wait_ready(&a, hs.quick ? 8000 : 15000))
		fprintf(stderr, "kvtrim-bench: hostile %s: the adversary was "
		        "not ready in time\n", adv->name);
	measure(&ph->beside, adv->name, &e, d.dir, adv->metrics,
	        adv->reconnect_every, d.pid);
	adv_stop(&a);
	ph->n_kv = a.n_kv;
	memcpy(ph->kv, a.kv, sizeof(a.kv));
out:
	heng_close(&e);
	if (d.pid > 0)
		th_daemon_stop(&d);
	fprintf(stderr, "kvtrim-bench: hostile %s: alone p99 %.0f us, beside "
	        "%d syncs, p50 %.0f us, p99 %.0f us, %d errors, %.1f s\n",
	        adv->name, ph->before.p99_us, ph->beside.n, ph->beside.p50_us,
	        ph->beside.p99_us, ph->beside.errors, (hostile_now_ms() - t0) / 1e3);
}

/* Pools every phase's before window into hs.alone. */
static void alone_pool(void)
{
	int n = 0;
	for (size_t i = 0; i < HOSTILE_N_ADV; i++)
		n += hs.ph[i].before.n;
	hs.alone.t = malloc(sizeof(double) * (size_t)(n ? n : 1));
	hs.alone.m_p99_ms = NAN;
	for (size_t i = 0; hs.alone.t && i < HOSTILE_N_ADV; i++) {
		const struct hwin *b = &hs.ph[i].before;
		memcpy(hs.alone.t + hs.alone.n, b->t,
		       sizeof(double) * (size_t)b->n);
		hs.alone.n += b->n;
		hs.alone.errors += b->errors;
		if (hs.ph[i].adv->metrics) {
			hs.alone.m_p99_ms = b->m_p99_ms;
			hs.alone.m_errors += b->m_errors;
		}
	}
	win_stats(&hs.alone);
}

void hostile_run(const char *self, const char *bin_dir, const char *tmp_dir,
                 int quick)
{
	struct rlimit rl;
	/* 5000 idle connections: the adversary and the daemon (which
	 * inherits this limit) each need that many fds. */
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	setenv("KVTRIM_BIN_DIR", bin_dir, 1);
	setenv("KVTRIM_BACKEND", "cpu", 1);
	hs.quick = quick;
	hs.self = self;
	const char *only = getenv("KVTRIM_BENCH_HOSTILE");
	for (size_t i = 0; i < HOSTILE_N_ADV; i++) {
		hs.ph[i] = (struct hphase){.adv = &hostile_advs[i]};
		if (!only || !*only || strstr(only, hostile_advs[i].name))
			phase_run(&hs.ph[i], tmp_dir);
	}
	alone_pool();
}

static void print_win(FILE *f, const char *name, const struct hwin *w,
                      int ran, int metrics)
{
	fprintf(f, "hostile_sync_p50_us_%s %.1f\n", name, w->p50_us);
	fprintf(f, "hostile_sync_p99_us_%s %.1f\n", name, w->p99_us);
	if (ran)
		fprintf(f, "hostile_errors_%s %d\n", name, w->errors);
	else
		fprintf(f, "hostile_errors_%s nan\n", name);
	if (metrics) {
		fprintf(f, "hostile_metrics_p99_ms_%s %.1f\n", name,
		        w->m_p99_ms);
		fprintf(f, "hostile_metrics_errors_%s %d\n", name,
		        w->m_errors);
	}
}

void hostile_print(FILE *f)
{
	if (!hs.self)
		return;
	print_win(f, "alone", &hs.alone, hs.alone.n > 0, 1);
	for (size_t i = 0; i < HOSTILE_N_ADV; i++) {
		const struct hphase *ph = &hs.ph[i];
		const char *nm = ph->adv->name;
		print_win(f, nm, &ph->beside, ph->ran, ph->adv->metrics);
		fprintf(f, "hostile_sync_p99_us_alone_%s %.1f\n", nm,
		        ph->before.p99_us);
		fprintf(f, "hostile_p99_ratio_%s %.2f\n", nm,
		        ph->beside.p99_us / ph->before.p99_us);
		fprintf(f, "hostile_daemon_cpu_pct_alone_%s %.1f\n", nm,
		        ph->before.daemon_cpu_pct);
		fprintf(f, "hostile_daemon_cpu_pct_%s %.1f\n", nm,
		        ph->beside.daemon_cpu_pct);
		fprintf(f, "hostile_machine_busy_pct_alone_%s %.1f\n", nm,
		        ph->before.busy_pct);
		fprintf(f, "hostile_machine_busy_pct_%s %.1f\n", nm,
		        ph->beside.busy_pct);
		for (int k = 0; k < ph->n_kv; k++)
			fprintf(f, "hostile_%s_%s %.15g\n", ph->kv[k].key, nm,
			        ph->kv[k].v);
	}
}
