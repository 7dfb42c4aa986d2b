/*
 * hostile_adv.c — the adversaries of kvtrim-bench's hostile-client phases
 * (hostile.c, docs/bench.md "Hostile clients"), each the body of a child
 * process of this binary (kvtrim-bench --adversary NAME --runtime-dir DIR
 * [--quick]).  Each reports "ready k=v ..." once in place and "stat k=v
 * ..." as it goes on its fd 3, and runs until killed; a connection the
 * daemon closes is reopened, so the attack lasts the phase.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "bench.h"
#include "codec.h"
#include "daemon.h"
#include "handle.h"
#include "hostile.h"

#define H_STAT_EVERY_MS 250

static double adv_start_ms;

/* One report line on fd 3; dropped when the bench is not reading. */
static void adv_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void adv_say(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(3, buf, (size_t)n) < 0) {
		/* the bench stopped reading: nothing to do */
	}
}

/* Reports every H_STAT_EVERY_MS (last: the time of the last report). */
static int adv_due(double *last)
{
	double t = hostile_now_ms();
	if (t - *last < H_STAT_EVERY_MS)
		return 0;
	*last = t;
	return 1;
}

/*
 * never_reading: NR_PEERS control connections that write stats requests
 * (without a hello) and never read a reply; one the daemon closes is
 * reopened.  Ready after half a second of writing.
 */
#define NR_PEERS 4
#define NR_BATCH 64      /* requests per peer per turn */
#define NR_TURN_MS 20    /* th_silent_send's budget per turn */

__attribute__((noreturn))
static void adv_never_reading(const struct th_daemon *d, int quick)
{
	size_t len;
	uint8_t *req = th_stats_req(&len);
	(void)quick;
	int fd[NR_PEERS];
	unsigned long long sent = 0, closed = 0;
	for (int i = 0; i < NR_PEERS; i++)
		fd[i] = th_silent_peer(d);
	double last = hostile_now_ms();
	int ready = 0;
	for (;;) {
		for (int i = 0; i < NR_PEERS; i++) {
			if (fd[i] < 0) { /* refused: try again next turn */
				fd[i] = th_silent_peer_try(d);
				continue;
			}
			sent += th_silent_send(fd[i], req, len, NR_BATCH,
			                       NR_TURN_MS);
			if (hostile_hung_up(fd[i])) {
				close(fd[i]);
				closed++;
				fd[i] = th_silent_peer_try(d);
			}
		}
		if (!ready && hostile_now_ms() - adv_start_ms >= 500) {
			adv_say("ready requests=%llu closed=%llu", sent,
			        closed);
			ready = 1;
		} else if (ready && adv_due(&last)) {
			adv_say("stat requests=%llu closed=%llu", sent, closed);
		}
	}
}

/*
 * idle_5000: 5000 connections, the even ones to ctl.ipc (connect and the
 * SP header, then silence), the odd ones to fd.sock (connect, never a
 * hello; the WELCOME is never read).  Fewer when the fd limit is lower
 * ("open" says how many).  Every 500 ms the ones the daemon closed are
 * reopened.
 */
#define IDLE_N 5000
#define IDLE_SWEEP_MS 500

/* The SP header a ctl.ipc client sends first (th_silent_peer's). */
static const uint8_t idle_hdr[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};

static int idle_open(const char *dir, int i)
{
	if (i % 2)
		return hostile_unix_connect(dir, "fd.sock", SOCK_SEQPACKET);
	/* ctl.ipc: connect and the SP header, without th_silent_peer's
	 * asserts: the daemon may refuse it at accept, and the sweep then
	 * reopens it. */
	int fd = hostile_unix_connect(dir, "ctl.ipc", SOCK_STREAM);
	if (fd >= 0 && send(fd, idle_hdr, sizeof(idle_hdr),
	                    MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		/* refused already: reported hung up at the next sweep */
	}
	return fd;
}

/* idle_5000's connections and sweeps against the sockets ctl.ipc and
 * fd.sock of dir (kvtrimd's, or idle_floor's stand-in). */
__attribute__((noreturn))
static void idle_run(const char *dir, int quick)
{
	static int fd[IDLE_N];
	static struct pollfd pf[IDLE_N];
	struct rlimit rl;
	int n = IDLE_N, open = 0;
	unsigned long long closed = 0;
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < (rlim_t)n + 64)
		n = rl.rlim_cur > 64 ? (int)rl.rlim_cur - 64 : 0;
	double deadline = hostile_now_ms() + (quick ? 4000 : 8000);
	for (int i = 0; i < n && hostile_now_ms() < deadline;) {
		if ((fd[i] = idle_open(dir, i)) < 0) {
			hostile_sleep_ms(1); /* a full backlog: the daemon is behind */
			continue;
		}
		open = ++i;
	}
	for (int i = open; i < IDLE_N; i++)
		fd[i] = -1;
	adv_say("ready open=%d closed=0", open);
	double last = hostile_now_ms();
	for (;;) {
		hostile_sleep_ms(IDLE_SWEEP_MS);
		for (int i = 0; i < open; i++)
			pf[i] = (struct pollfd){fd[i], 0, 0};
		poll(pf, (nfds_t)open, 0);
		for (int i = 0; i < open; i++) {
			int hup = pf[i].revents & (POLLHUP | POLLERR);
			if (fd[i] >= 0 && !hup)
				continue;
			if (fd[i] >= 0) {
				close(fd[i]);
				closed++;
			}
			fd[i] = idle_open(dir, i);
		}
		if (adv_due(&last))
			adv_say("stat closed=%llu", closed);
	}
}

__attribute__((noreturn))
static void adv_idle(const struct th_daemon *d, int quick)
{
	idle_run(d->dir, quick);
}

/*
 * idle_floor: idle_5000's process, connections and sweeps, against a
 * stand-in for kvtrimd's two sockets served by a second process of the
 * adversary, not the daemon, that treats them as kvtrimd's defaults do:
 * per socket it holds FLOOR_HELD connections of the uid (max_pending_per_uid
 * of max_pending_conns 256), answering each as kvtrimd does (an SP header
 * on the stream socket, a WELCOME-sized packet on the seqpacket one), and
 * closes them after hello_timeout_ms (10 s), at most 16 a socket every
 * 100 ms; the others are accepted, answered and kept FLOOR_REFUSED_MS
 * (ctl.ipc's 1 s, fd.sock's 2 s) at most FLOOR_REFUSALS at once (the
 * oldest closed for a newer), and after FLOOR_REFUSALS_TICK refusals in a
 * 100 ms tick nothing more is accepted until the next.  The floor beside
 * idle_5000: what that churn of connections costs the healthy engine on
 * this machine when kvtrimd has no part in it.
 */
#define FLOOR_TICK_MS 100.0
#define FLOOR_TIMEOUT_MS 10000.0
#define FLOOR_HELD 128
#define FLOOR_CLOSES 16
#define FLOOR_REFUSALS 16
#define FLOOR_REFUSALS_TICK 32

struct floor_conn {
	int fd;
	double born;
};

/* One listening socket and what it holds: kind 0 stream, 1 seqpacket. */
struct floor_sock {
	int l, kind, n_held, n_ref;
	double refused_ms;
	struct floor_conn held[FLOOR_HELD], ref[FLOOR_REFUSALS];
};

static int floor_listen(const char *dir, const char *name, int type)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	snprintf(a.sun_path, sizeof(a.sun_path), "%s/%s", dir, name);
	int fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
	    listen(fd, type == SOCK_STREAM ? 512 : SOMAXCONN))
		return -1;
	return fd;
}

/* Accepts up to 16 (kvtrimd's batch) of what waits on f; *refusals counts
 * this tick's refusals over both sockets. */
static void floor_accept(struct floor_sock *f, int *refusals)
{
	static const uint8_t welcome[32] = {0};
	for (int k = 0; k < 16 && *refusals < FLOOR_REFUSALS_TICK; k++) {
		int fd = accept4(f->l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		const void *b = f->kind ? (const void *)welcome
		                        : (const void *)idle_hdr;
		if (send(fd, b, f->kind ? sizeof(welcome) : sizeof(idle_hdr),
		         MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
			/* the client is gone: closed when due */
		}
		struct floor_conn c = {fd, hostile_now_ms()};
		if (f->n_held < FLOOR_HELD) {
			f->held[f->n_held++] = c;
			continue;
		}
		(*refusals)++;
		if (f->n_ref == FLOOR_REFUSALS) {
			close(f->ref[0].fd);
			memmove(f->ref, f->ref + 1,
			        sizeof(c) * (FLOOR_REFUSALS - 1));
			f->n_ref--;
		}
		f->ref[f->n_ref++] = c;
	}
}

/* The tick: held ones past the timeout (at most FLOOR_CLOSES) and refused
 * ones past their time are closed. */
static void floor_tick(struct floor_sock *f, double now)
{
	int closed = 0;
	for (int i = 0; i < f->n_held && closed < FLOOR_CLOSES;) {
		if (now - f->held[i].born <= FLOOR_TIMEOUT_MS) {
			i++;
			continue;
		}
		close(f->held[i].fd);
		f->held[i] = f->held[--f->n_held];
		closed++;
	}
	int k = 0;
	while (k < f->n_ref && now - f->ref[k].born >= f->refused_ms)
		close(f->ref[k++].fd);
	memmove(f->ref, f->ref + k, sizeof(f->ref[0]) * (size_t)(f->n_ref - k));
	f->n_ref -= k;
}

__attribute__((noreturn))
static void floor_serve(struct floor_sock *f)
{
	double tick = hostile_now_ms();
	int refusals = 0;
	for (;;) {
		struct pollfd p[2] = {{f[0].l, POLLIN, 0}, {f[1].l, POLLIN, 0}};
		double now = hostile_now_ms();
		int wait = (int)(tick + FLOOR_TICK_MS - now) + 1;
		/* past the tick's refusals the listeners wait for the next */
		poll(p, refusals < FLOOR_REFUSALS_TICK ? 2 : 0,
		     wait > 0 ? wait : 0);
		for (int i = 0; i < 2; i++)
			if (refusals < FLOOR_REFUSALS_TICK && p[i].revents)
				floor_accept(&f[i], &refusals);
		if ((now = hostile_now_ms()) >= tick + FLOOR_TICK_MS) {
			floor_tick(&f[0], now);
			floor_tick(&f[1], now);
			refusals = 0;
			tick = now;
		}
	}
}

__attribute__((noreturn))
static void adv_idle_floor(const struct th_daemon *d, int quick)
{
	static struct floor_sock f[2];
	char dir[sizeof(d->dir) + 8];
	snprintf(dir, sizeof(dir), "%s.floor", d->dir);
	mkdir(dir, 0700);
	f[0] = (struct floor_sock){.kind = 0, .refused_ms = 1000,
	                           .l = floor_listen(dir, "ctl.ipc",
	                                             SOCK_STREAM)};
	f[1] = (struct floor_sock){.kind = 1, .refused_ms = 2000,
	                           .l = floor_listen(dir, "fd.sock",
	                                             SOCK_SEQPACKET)};
	if (f[0].l < 0 || f[1].l < 0) {
		fprintf(stderr, "kvtrim-bench: idle_floor: cannot listen in "
		        "%s: %s\n", dir, strerror(errno));
		adv_say("ready open=0 closed=0");
		for (;;)
			pause();
	}
	if (fork() == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		floor_serve(f);
	}
	close(f[0].l);
	close(f[1].l);
	idle_run(dir, quick);
}

/*
 * fd_flood: a tenant registered by hand (WELCOME cookie, then a raw
 * hello on its own control connection) whose process sends well-formed
 * WELCOME packets, which the protocol never asks a client to send, on its
 * handle channel as fast as the daemon takes them.  When the daemon drops
 * it, it registers again.
 */
struct raw_reg {
	int hfd;
	uint32_t sock;
};

static int flood_register(const struct th_daemon *d, struct raw_reg *r)
{
	char why[KVT_ERRTEXT_MAX];
	struct handle_msg m;
	uint64_t cookie;
	int fd = -1, rc;
	if ((rc = th_raw_welcome(d, &r->hfd, &cookie)))
		return rc;
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = IPC_OP_HELLO;
	snprintf(q.u.hello.name, sizeof(q.u.hello.name), "hostile-flood");
	q.u.hello.geo = (struct kvt_geometry){2, 4, 2, 8, 32};
	q.u.hello.dtype = KVT_DTYPE_F32;
	q.u.hello.page_tokens = 4;
	q.u.hello.max_seqs = 1;
	q.u.hello.max_tokens = 64;
	q.u.hello.headroom = 4;
	snprintf(q.u.hello.policy, sizeof(q.u.hello.policy), "full");
	q.u.hello.cookie = cookie;
	q.u.hello.pid = (uint32_t)getpid();
	struct ipc_rep rp;
	r->sock = th_raw_conn(d);
	if (!(rc = th_raw_request(d, r->sock, &q, &rp, why, sizeof(why))))
		rc = rp.err;
	codec_rep_free(&rp);
	if (rc) {
		close(r->hfd);
		th_raw_close(r->sock);
		return rc;
	}
	/* The TABLE and STAGE segments came before the reply. */
	while (!handle_recv(r->hfd, &m, &fd, 0))
		if (fd >= 0)
			close(fd);
	return 0;
}

__attribute__((noreturn))
static void adv_fd_flood(const struct th_daemon *d, int quick)
{
	struct raw_reg r;
	struct handle_msg p = {.magic = HANDLE_MAGIC, .type = HANDLE_WELCOME};
	unsigned long long pkts = 0, closed = 0;
	int rc;
	(void)quick;
	while ((rc = flood_register(d, &r))) {
		fprintf(stderr, "kvtrim-bench: fd_flood: hello: %s\n",
		        kvt_strerror(rc));
		hostile_sleep_ms(200);
	}
	double t0 = hostile_now_ms(), last = t0;
	int ready = 0;
	for (unsigned long i = 0;; i++) {
		ssize_t n = send(r.hfd, &p, sizeof(p),
		                 MSG_DONTWAIT | MSG_NOSIGNAL);
		int dropped = 0;
		if (n == (ssize_t)sizeof(p)) {
			pkts++;
		} else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			hostile_wait_fd(r.hfd, POLLOUT, hostile_now_ms() + 100);
		} else {
			closed++;
			dropped = 1;
			close(r.hfd);
			th_raw_close(r.sock);
			hostile_sleep_ms(50);
			/* (a daemon that bars a violating process refuses
			 * these for a while: each refusal is quiet here) */
			while (flood_register(d, &r))
				hostile_sleep_ms(200);
		}
		/* Reported by time after each drop too: registering again
		 * may take seconds once the daemon bars the process. */
		if (i % 1024 && !dropped)
			continue;
		double t = hostile_now_ms();
		double pps = t > t0 ? pkts / ((t - t0) / 1e3) : 0;
		if (!ready && t - t0 >= 100) {
			adv_say("ready packets_per_s=%.0f closed=%llu", pps,
			        closed);
			ready = 1;
		} else if (ready && adv_due(&last)) {
			adv_say("stat packets_per_s=%.0f closed=%llu", pps,
			        closed);
		}
	}
}

/*
 * largest_tenant: a hostile geometry (pages of 4 bytes: head_dim 1, f16,
 * one entry a page; 256 layers x 256 KV heads = 65536 lists a sequence;
 * max_tokens 4, streaming:sinks=1,tokens=2 so every sync evicts), with the
 * largest max_seqs the daemon admits: 65536 (the protocol's limit), halved
 * until the hello passes (see largest_hello).  It opens up to LT_SEQS
 * sequences (what it could in the time given) and syncs all of them, one
 * token each, in a loop, reporting the time of each round: in one sync, or
 * in as few as the daemon's max_sync_lists allows (a sync refused with
 * ETOOBIG is split in two, and so on).
 */
#define LT_SEQS 256
#define LT_SEQS_QUICK 32
#define LT_TIMES 4096

/*
 * Connects with max_seqs from 65536 down, halving after each refusal;
 * where not even one sequence passes, with half the layers (lists a
 * sequence) again.  Stops at the first hello admitted, or when the daemon
 * is unreachable or does not answer; *refused counts the refusals.
 */
static int largest_hello(struct kvt_config *c, kvt_client **cl, int *refused,
                         char *err)
{
	int rc = KVT_EGEOMETRY;
	for (uint32_t layers = 256; layers; layers /= 2) {
		c->geo.n_layers = layers;
		for (uint32_t seqs = 1u << 16; seqs; seqs /= 2) {
			c->max_seqs = seqs;
			rc = kvt_connect(c, cl, err);
			if (!rc || rc == KVT_ECONN || rc == KVT_ETIMEDOUT)
				return rc;
			(*refused)++;
		}
	}
	return rc;
}

__attribute__((noreturn))
static void adv_largest(const struct th_daemon *d, int quick)
{
	static struct kvt_sync_item it[LT_SEQS];
	static double ms[LT_TIMES];
	struct kvt_config c;
	kvt_client *cl = NULL;
	char err[KVT_ERRTEXT_MAX] = "";
	int refused = 0;
	memset(&c, 0, sizeof(c));
	c.runtime_dir = d->dir;
	c.tenant = "hostile-largest";
	c.geo = (struct kvt_geometry){256, 256, 256, 1, 256};
	c.dtype = KVT_DTYPE_F16;
	c.page_tokens = 1;
	c.max_tokens = 4;
	c.headroom = 1;
	c.policy = "streaming:sinks=1,tokens=2";
	c.timeout_ms = 30000;
	int rc = largest_hello(&c, &cl, &refused, err);
	if (rc) {
		fprintf(stderr, "kvtrim-bench: largest_tenant: no hello "
		        "admitted: %s: %s\n", kvt_strerror(rc), err);
		adv_say("ready max_seqs=0 refused=%d", refused);
		for (;;)
			pause();
	}
	uint32_t cap = quick ? LT_SEQS_QUICK : LT_SEQS, n = 0;
	double deadline = hostile_now_ms() + (quick ? 2000 : 6000);
	while (n < cap && n < c.max_seqs && hostile_now_ms() < deadline &&
	       !kvt_seq_open(cl, &it[n].seq)) {
		it[n] = (struct kvt_sync_item){it[n].seq, 1, KVT_PHASE_DECODE,
		                               0, 0};
		n++;
	}
	uint64_t lists = (uint64_t)n * c.geo.n_layers * c.geo.n_kv_heads;
	adv_say("ready layers=%u max_seqs=%u refused=%d seqs=%u lists=%llu",
	        c.geo.n_layers, c.max_seqs, refused, n,
	        (unsigned long long)lists);
	int syncs = 0, errors = 0;
	uint32_t batch = n;
	double worst = 0;
	for (;;) {
		double t0 = hostile_now_ms();
		rc = n ? 0 : KVT_EINVAL;
		for (uint32_t off = 0; off < n && !rc; off += batch)
			rc = kvt_sync(cl, it + off,
			              n - off < batch ? n - off : batch);
		double dt = hostile_now_ms() - t0;
		if (rc == KVT_ETOOBIG && batch > 1) {
			/* Nothing of that sync was applied: smaller ones. */
			batch /= 2;
			adv_say("stat big_batch=%u", batch);
			continue;
		}
		if (rc) {
			if (!errors++)
				fprintf(stderr, "kvtrim-bench: largest_tenant: "
				        "sync: %s: %s\n", kvt_strerror(rc),
				        kvt_last_error(cl));
			adv_say("stat big_errors=%d", errors);
			if (rc == KVT_ECONN || !n)
				for (;;)
					pause();
			hostile_sleep_ms(100);
			continue;
		}
		ms[syncs++ % LT_TIMES] = dt;
		worst = dt > worst ? dt : worst;
		double tmp[LT_TIMES];
		int k = syncs < LT_TIMES ? syncs : LT_TIMES;
		memcpy(tmp, ms, sizeof(double) * (size_t)k);
		adv_say("stat big_syncs=%d big_errors=%d big_sync_ms_p50=%.1f "
		        "big_sync_ms_max=%.1f", syncs, errors,
		        bench_pct(tmp, k, 0.5), worst);
	}
}

/*
 * slow_http: 32 connections to stats.sock, each sending a partial request
 * line ("GET /metrics?") and then one byte every 500 ms, never the end of
 * the headers.  One the daemon closes is reopened at the next tick.
 */
#define SL_CONNS 32
#define SL_TICK_MS 500
#define SL_SEND (MSG_NOSIGNAL | MSG_DONTWAIT)

static int slow_open(const struct th_daemon *d)
{
	static const char part[] = "GET /metrics?";
	int fd = hostile_unix_connect(d->dir, "stats.sock", SOCK_STREAM);
	if (fd >= 0 && send(fd, part, sizeof(part) - 1, MSG_NOSIGNAL) !=
	                       (ssize_t)sizeof(part) - 1) {
		close(fd);
		fd = -1;
	}
	return fd;
}

__attribute__((noreturn))
static void adv_slow_http(const struct th_daemon *d, int quick)
{
	int fd[SL_CONNS], open = 0;
	unsigned long long closed = 0;
	(void)quick;
	for (int i = 0; i < SL_CONNS; i++)
		open += (fd[i] = slow_open(d)) >= 0;
	adv_say("ready open=%d closed=0", open);
	for (;;) {
		hostile_sleep_ms(SL_TICK_MS);
		for (int i = 0; i < SL_CONNS; i++) {
			if (fd[i] >= 0 && !hostile_hung_up(fd[i]) &&
			    send(fd[i], "a", 1, SL_SEND) == 1)
				continue;
			if (fd[i] >= 0) {
				close(fd[i]);
				closed++;
			}
			fd[i] = slow_open(d);
		}
		adv_say("stat closed=%llu", closed);
	}
}

/*
 * cpu_hog: no client of the daemon at all, one process spinning at nice 10
 * (the priority of kvtrimd's sync workers, daemon/jobs.c) in the pattern
 * of the largest tenant's worker (busy for HOG_BUSY_MS, a 1 ms pause) but
 * without its yields (daemon/pace.h).  The floor beside largest_tenant:
 * what one core taken by a CPU-bound neighbour costs the healthy engine
 * on this machine, whatever the daemon does.
 */
#define HOG_BUSY_MS 350

__attribute__((noreturn))
static void adv_cpu_hog(const struct th_daemon *d, int quick)
{
	(void)d;
	(void)quick;
	setpriority(PRIO_PROCESS, 0, 10);
	adv_say("ready nice=10");
	volatile uint64_t x = 0;
	for (;;) {
		double t0 = hostile_now_ms();
		while (hostile_now_ms() - t0 < HOG_BUSY_MS)
			for (int i = 0; i < 1000; i++)
				x += (uint64_t)i;
		hostile_sleep_ms(1);
		adv_say("stat spins=%llu", (unsigned long long)(x & 0xffff));
	}
}

/*
 * mem_hog: no client of the daemon either, one process at nice 10 copying
 * one half of a MEMHOG_MIB buffer onto the other for HOG_BUSY_MS, a 1 ms
 * pause, again: a neighbour that takes a core and the memory bandwidth, as
 * the largest tenant's worker does (its syncs walk millions of list
 * records and per-entry states).  The second floor beside largest_tenant:
 * what memory traffic on the other core costs the healthy engine on this
 * machine, whatever the daemon does.
 */
#define MEMHOG_MIB 256

__attribute__((noreturn))
static void adv_mem_hog(const struct th_daemon *d, int quick)
{
	(void)d;
	(void)quick;
	setpriority(PRIO_PROCESS, 0, 10);
	const size_t half = (size_t)MEMHOG_MIB << 19;
	char *buf = malloc(2 * half);
	if (!buf) {
		adv_say("ready bytes=0");
		for (;;)
			hostile_sleep_ms(1000);
	}
	memset(buf, 1, 2 * half);
	adv_say("ready nice=10");
	unsigned long long copies = 0;
	for (;;) {
		double t0 = hostile_now_ms();
		while (hostile_now_ms() - t0 < HOG_BUSY_MS) {
			memcpy(buf + (copies % 2) * half,
			       buf + (1 - copies % 2) * half, half);
			copies++;
		}
		hostile_sleep_ms(1);
		adv_say("stat copies=%llu", copies);
	}
}

/*
 * slow_decode: SD_PEERS control connections without a tenant, each
 * sending, back to back (the next as soon as the reply came), a request
 * of IPC_MAX_MSG bytes that is nothing but msgpack nils: a million in an
 * array on the even peers, half a million pairs of them in a map on the
 * odd ones.  No such request can be useful; the figures count the replies
 * (requests) and those that were KVT_ETOOBIG (too_big).  A peer whose
 * connection failed dials again.
 */
#define SD_PEERS 4

struct sd_peer {
	pthread_t th;
	const struct th_daemon *d;
	int map;
	unsigned long long requests, too_big; /* atomic */
};

/* A body of IPC_MAX_MSG bytes (or one less for the map: pairs) of nils
 * under one array32 or map32 header. */
static uint8_t *sd_body(int map, size_t *len)
{
	size_t n = map ? (IPC_MAX_MSG - 5) / 2 : IPC_MAX_MSG - 5;
	*len = 5 + (map ? 2 * n : n);
	uint8_t *b = malloc(*len);
	if (!b)
		return NULL;
	b[0] = map ? 0xdf : 0xdd;
	for (int i = 0; i < 4; i++)
		b[1 + i] = (uint8_t)(n >> (24 - 8 * i));
	memset(b + 5, 0xc0, *len - 5);
	return b;
}

static void *sd_main(void *arg)
{
	struct sd_peer *p = arg;
	size_t len;
	uint8_t *body = sd_body(p->map, &len);
	if (!body)
		return NULL;
	for (;;) {
		uint32_t sock = th_raw_conn(p->d);
		uint8_t *rep;
		size_t rl;
		while (!th_raw_call(sock, body, len, &rep, &rl)) {
			struct ipc_rep r;
			char why[KVT_ERRTEXT_MAX];
			int too_big = !codec_rep_decode(IPC_OP_STATS, rep, rl,
			                                &r, why, sizeof(why)) &&
			              r.err == KVT_ETOOBIG;
			codec_rep_free(&r);
			free(rep);
			__atomic_add_fetch(&p->requests, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&p->too_big, (unsigned)too_big,
			                   __ATOMIC_RELAXED);
		}
		th_raw_close(sock);
		hostile_sleep_ms(10);
	}
	return NULL;
}

__attribute__((noreturn))
static void adv_slow_decode(const struct th_daemon *d, int quick)
{
	static struct sd_peer p[SD_PEERS];
	(void)quick;
	for (int i = 0; i < SD_PEERS; i++) {
		p[i] = (struct sd_peer){.d = d, .map = i % 2};
		if (pthread_create(&p[i].th, NULL, sd_main, &p[i])) {
			fprintf(stderr, "kvtrim-bench: slow_decode: no "
			        "thread\n");
			_exit(1);
		}
	}
	double last = hostile_now_ms();
	int ready = 0;
	for (;;) {
		hostile_sleep_ms(50);
		unsigned long long req = 0, big = 0;
		for (int i = 0; i < SD_PEERS; i++) {
			req += __atomic_load_n(&p[i].requests,
			                       __ATOMIC_RELAXED);
			big += __atomic_load_n(&p[i].too_big,
			                       __ATOMIC_RELAXED);
		}
		if (!ready && req >= SD_PEERS) {
			adv_say("ready requests=%llu too_big=%llu", req, big);
			ready = 1;
		} else if (ready && adv_due(&last)) {
			adv_say("stat requests=%llu too_big=%llu", req, big);
		}
	}
}

/*
 * uid_300: one uid (nobody, 65534, when the bench runs as root; group
 * root, which the sockets belong to) with UID_CONNS control connections
 * without a tenant from UID_PROCS processes (each within
 * max_pending_per_pid), each connection sending a stats request when it
 * opens and every UID_STATS_MS after (staggered), reading the replies, so
 * that the idle close never fires.  One the daemon refuses (the reply
 * names max_pending_...) or closes is closed and opened again
 * UID_STATS_MS later.  The phase's daemon makes nobody an admin, so the
 * healthy engine (root) is a plain uid, and the engine connects again
 * every UID_RECONNECT syncs of each window.
 */
#define UID_CONNS 300
#define UID_PROCS 5
#define UID_PER_PROC (UID_CONNS / UID_PROCS)
#define UID_STATS_MS 3000
#define UID_TICK_MS 20
#define UID_RECONNECT 100
#define UID_NOBODY 65534

struct uid_conn {
	int fd;          /* -1: closed until next_ms */
	double next_ms;  /* its next stats request, or its reopening */
};

/* One process's figures, in memory all of them share (atomic). */
struct uid_figs {
	unsigned long long held, refused, closed;
};

/* Reads what c's replies hold so far: 1 when c is refused or closed. */
static int uid_drain(struct uid_conn *c, struct uid_figs *f)
{
	char buf[8192];
	for (;;) {
		ssize_t n = read(c->fd, buf, sizeof(buf));
		if (n > 0) {
			if (memmem(buf, (size_t)n, "max_pending", 11)) {
				__atomic_add_fetch(&f->refused, 1,
				                   __ATOMIC_RELAXED);
				return 1;
			}
			continue;
		}
		return n == 0 || (errno != EAGAIN && errno != EINTR);
	}
}

/* One process's connections, forever: reopen, send, read. */
__attribute__((noreturn))
static void uid_proc(const struct th_daemon *d, struct uid_figs *f, int k)
{
	static struct uid_conn c[UID_PER_PROC];
	size_t len;
	uint8_t *req = th_stats_req(&len);
	double t0 = hostile_now_ms();
	for (int i = 0; i < UID_PER_PROC; i++)
		c[i] = (struct uid_conn){-1, t0 + (i * UID_PROCS + k) * 2.0};
	for (;;) {
		double now = hostile_now_ms();
		unsigned long long held = 0;
		for (int i = 0; i < UID_PER_PROC; i++) {
			if (c[i].fd < 0 && now >= c[i].next_ms &&
			    (c[i].fd = th_silent_peer_try(d)) >= 0)
				c[i].next_ms = now;
			if (c[i].fd < 0)
				continue;
			if (now >= c[i].next_ms) {
				th_silent_send(c[i].fd, req, len, 1, 5);
				c[i].next_ms = now + UID_STATS_MS;
			}
			if (uid_drain(&c[i], f)) {
				close(c[i].fd);
				c[i].fd = -1;
				c[i].next_ms = now + UID_STATS_MS;
				__atomic_add_fetch(&f->closed, 1,
				                   __ATOMIC_RELAXED);
				continue;
			}
			held++;
		}
		__atomic_store_n(&f->held, held, __ATOMIC_RELAXED);
		hostile_sleep_ms(UID_TICK_MS);
	}
}

/* Sums the processes' figures (key: held, refused or closed). */
static unsigned long long uid_sum(const struct uid_figs *f, size_t off)
{
	unsigned long long n = 0;
	for (int k = 0; k < UID_PROCS; k++)
		n += __atomic_load_n((const unsigned long long *)
		                     ((const char *)&f[k] + off),
		                     __ATOMIC_RELAXED);
	return n;
}

__attribute__((noreturn))
static void adv_uid_300(const struct th_daemon *d, int quick)
{
	int other = 0;
	(void)quick;
	if (geteuid() == 0) {
		gid_t g0[] = {0};
		if (setgroups(1, g0) || setgid(0) || setuid(UID_NOBODY)) {
			fprintf(stderr, "kvtrim-bench: uid_300: cannot become "
			        "uid %d: %s\n", UID_NOBODY, strerror(errno));
			_exit(1);
		}
		other = 1;
	}
	struct uid_figs *f = mmap(NULL, sizeof(*f) * UID_PROCS,
	                          PROT_READ | PROT_WRITE,
	                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (f == MAP_FAILED)
		_exit(1);
	pid_t self = getpid();
	for (int k = 0; k < UID_PROCS; k++) {
		pid_t pid = fork();
		if (pid == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != self)
				_exit(1);
			uid_proc(d, &f[k], k);
		}
	}
	double t0 = hostile_now_ms(), last = t0;
	hostile_sleep_ms(2.0 * UID_CONNS + 500);
	adv_say("ready other_uid=%d held=%llu refused=%llu closed=%llu", other,
	        uid_sum(f, offsetof(struct uid_figs, held)),
	        uid_sum(f, offsetof(struct uid_figs, refused)),
	        uid_sum(f, offsetof(struct uid_figs, closed)));
	for (;;) {
		hostile_sleep_ms(H_STAT_EVERY_MS);
		if (adv_due(&last))
			adv_say("stat held=%llu refused=%llu closed=%llu",
			        uid_sum(f, offsetof(struct uid_figs, held)),
			        uid_sum(f, offsetof(struct uid_figs, refused)),
			        uid_sum(f, offsetof(struct uid_figs, closed)));
	}
}

/* The uid_300 phase's daemon: nobody's uid is an admin, so root (the
 * bench, the healthy engine) is not one and the limits apply to it. */
static const char *const uid_300_args[] = {"--admin-uids", "65533", NULL};

/*
 * pool_hog: one process registers PH_TENANTS tenants at the default quota
 * (a fair share, pool / expected_tenants) and opens sequences of a wide
 * geometry (16 chunks each) in every one until refused, then keeps asking
 * for more: without shares of the pool it would hold it all.  Ready at the
 * first refusal; it reports the chunks it holds.
 */
#define PH_TENANTS 4
#define PH_SEQS 8

/* One tenant of the hog: 32 layers x 8 KV heads of 128 KiB pages, one
 * page a list (the headroom): a sequence takes 16 chunks. */
static kvt_client *hog_tenant(const struct th_daemon *d, int i)
{
	char name[32], err[KVT_ERRTEXT_MAX];
	struct kvt_config c;
	kvt_client *cl;
	memset(&c, 0, sizeof(c));
	snprintf(name, sizeof(name), "hostile-hog-%d", i);
	c.runtime_dir = d->dir;
	c.tenant = name;
	c.geo = (struct kvt_geometry){32, 8, 8, 128, 1024};
	c.dtype = KVT_DTYPE_F16;
	c.page_tokens = 256;
	c.max_seqs = PH_SEQS;
	c.max_tokens = 256;
	c.headroom = 256;
	c.policy = "full";
	c.timeout_ms = 30000;
	int rc = kvt_connect(&c, &cl, err);
	if (rc) {
		fprintf(stderr, "kvtrim-bench: pool_hog: tenant %d: %s: %s\n",
		        i, kvt_strerror(rc), err);
		return NULL;
	}
	return cl;
}

/* Opens sequences in cl until refused (or all PH_SEQS are); *open counts
 * them.  The refusal, or 0. */
static int hog_fill(kvt_client *cl, int *open)
{
	int rc = 0;
	while (*open < PH_SEQS) {
		kvt_seq s;
		if ((rc = kvt_seq_open(cl, &s)))
			return rc;
		(*open)++;
	}
	return rc;
}

__attribute__((noreturn))
static void adv_pool_hog(const struct th_daemon *d, int quick)
{
	kvt_client *cl[PH_TENANTS];
	int open[PH_TENANTS] = {0}, refused = 0;
	(void)quick;
	for (int i = 0; i < PH_TENANTS; i++)
		cl[i] = hog_tenant(d, i);
	/* In place at the first refusal: the pool (or the share) is full. */
	for (int i = 0; i < PH_TENANTS && !refused; i++)
		if (cl[i] && hog_fill(cl[i], &open[i]))
			refused++;
	int seqs = 0;
	for (int i = 0; i < PH_TENANTS; i++)
		seqs += open[i];
	adv_say("ready tenants=%d seqs=%d chunks=%d refused=%d", PH_TENANTS,
	        seqs, seqs * 16, refused);
	for (;;) {
		/* Keeps asking: each refused open waits the daemon's
		 * pressure_deadline_ms first. */
		for (int i = 0; i < PH_TENANTS; i++)
			if (cl[i] && open[i] < PH_SEQS &&
			    hog_fill(cl[i], &open[i]))
				refused++;
		seqs = 0;
		for (int i = 0; i < PH_TENANTS; i++)
			seqs += open[i];
		adv_say("stat seqs=%d chunks=%d refused=%d", seqs, seqs * 16,
		        refused);
		hostile_sleep_ms(100);
	}
}

const struct hostile_adv hostile_advs[] = {
	{"never_reading", adv_never_reading, 0, NULL, 0, 0},
	{"idle_5000", adv_idle, 0, NULL, 0, 0},
	{"idle_floor", adv_idle_floor, 0, NULL, 0, 0},
	{"fd_flood", adv_fd_flood, 0, NULL, 0, 0},
	{"largest_tenant", adv_largest, 0, NULL, 0, 0},
	{"cpu_hog", adv_cpu_hog, 0, NULL, 0, 0},
	{"mem_hog", adv_mem_hog, 0, NULL, 0, 0},
	{"slow_http", adv_slow_http, 1, NULL, 0, 0},
	{"slow_decode", adv_slow_decode, 0, NULL, 0, 0},
	{"uid_300", adv_uid_300, 0, uid_300_args, UID_RECONNECT, 1},
	{"pool_hog", adv_pool_hog, 0, NULL, 50, 0},
};
_Static_assert(sizeof(hostile_advs) / sizeof(hostile_advs[0]) == HOSTILE_N_ADV,
               "HOSTILE_N_ADV (hostile.h) counts the adversaries");

int hostile_adversary_main(int argc, char **argv)
{
	struct th_daemon d;
	if (argc < 5 || strcmp(argv[3], "--runtime-dir"))
		return 2;
	memset(&d, 0, sizeof(d));
	snprintf(d.dir, sizeof(d.dir), "%s", argv[4]);
	int quick = argc > 5 && !strcmp(argv[5], "--quick");
	signal(SIGPIPE, SIG_IGN);
	fcntl(3, F_SETFL, O_NONBLOCK);
	adv_start_ms = hostile_now_ms();
	for (size_t i = 0; i < HOSTILE_N_ADV; i++)
		if (!strcmp(argv[2], hostile_advs[i].name))
			hostile_advs[i].run(&d, quick);
	return 2;
}

