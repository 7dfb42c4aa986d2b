/*
 * test_ctl_wire.c — the control socket's SP wire as kvtrimd serves it
 * (daemon/ctl.c): each violation closes only its own connection and is
 * counted, a malformed backtrace drops only its message, and a peer that
 * reads slowly still gets every reply, in order, with its own request id
 * (the daemon stops reading it while its replies are unsent, then goes
 * on).  Frames are written and read by hand here, from nng's wire format
 * (src/sp/transport/ipc in nng's tree), not from the daemon's code.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codec.h"
#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

/* A blocking connection to ctl.ipc with no SP header sent yet. */
static int raw_connect(const struct th_daemon *d)
{
	int fd = th_ctl_connect(d);
	T_ASSERT(fd >= 0);
	return fd;
}

static void put_all(int fd, const void *buf, size_t len)
{
	const uint8_t *b = buf;
	while (len) {
		ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
		T_ASSERT(n > 0);
		b += n;
		len -= (size_t)n;
	}
}

/* Reads len bytes within ms: 1, 0 on EOF or reset first, -1 on timeout. */
static int get_all(int fd, void *buf, size_t len, int ms)
{
	uint8_t *b = buf;
	uint64_t deadline = th_now_ms() + (uint64_t)ms;
	while (len) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int left = (int)(deadline - th_now_ms());
		if (left <= 0 || poll(&p, 1, left) <= 0)
			return -1;
		ssize_t n = read(fd, b, len);
		if (n <= 0)
			return 0;
		b += n;
		len -= (size_t)n;
	}
	return 1;
}

/* Waits up to ms for EOF (or a reset) on fd, reading past anything
 * before it: 1 when the daemon closed it. */
static int closed_within(int fd, int ms)
{
	uint64_t deadline = th_now_ms() + (uint64_t)ms;
	char buf[4096];
	while (th_now_ms() < deadline) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 50) <= 0)
			continue;
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			return 1;
	}
	return 0;
}

static const uint8_t req0_hdr[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};

/* One frame: type, the 64-bit big-endian length, then body. */
static void put_frame(int fd, uint8_t type, const void *body, uint64_t len,
                      size_t have)
{
	/* One write: a daemon that closes at the head must not make the
	 * body's write fail. */
	uint8_t *f = malloc(9 + have);
	T_ASSERT(f);
	f[0] = type;
	for (int i = 0; i < 8; i++)
		f[1 + i] = (uint8_t)(len >> (56 - 8 * i));
	if (have)
		memcpy(f + 9, body, have);
	put_all(fd, f, 9 + have);
	free(f);
}

/* A stats request with request id id (top bit set by the caller). */
static void put_stats(int fd, uint32_t id, const uint8_t *req, size_t len)
{
	uint8_t *b = malloc(4 + len);
	T_ASSERT(b);
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(id >> (24 - 8 * i));
	memcpy(b + 4, req, len);
	put_frame(fd, 1, b, 4 + len, 4 + len);
	free(b);
}

/* Reads one reply frame: its request id in *id, its body's length in
 * *len (the body is decoded as a stats reply and must be one). */
static void get_reply(int fd, uint32_t *id, size_t *len)
{
	uint8_t h[13];
	T_EQ(get_all(fd, h, sizeof(h), 10000), 1);
	T_EQ(h[0], 1);
	uint64_t n = 0;
	for (int i = 0; i < 8; i++)
		n = n << 8 | h[1 + i];
	T_ASSERT(n > 4 && n < (1u << 22));
	*id = (uint32_t)h[9] << 24 | (uint32_t)h[10] << 16 |
	      (uint32_t)h[11] << 8 | h[12];
	uint8_t *body = malloc(n - 4);
	T_ASSERT(body);
	T_EQ(get_all(fd, body, n - 4, 10000), 1);
	struct ipc_rep rep;
	char why[256];
	T_OK(codec_rep_decode(IPC_OP_STATS, body, n - 4, &rep, why,
	                      sizeof(why)));
	T_EQ(rep.err, 0);
	codec_rep_free(&rep);
	free(body);
	*len = n - 4;
}

TEST(ctl_wire, violations_close_only_their_connection)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	size_t qlen;
	uint8_t *q = th_stats_req(&qlen);

	/* A bystander with a request answered before and after. */
	int ok = raw_connect(&d);
	put_all(ok, req0_hdr, sizeof(req0_hdr));
	uint8_t their[8];
	T_EQ(get_all(ok, their, 8, 5000), 1);
	/* the daemon's header: SP, version 0, rep0 (0x31) */
	T_EQ(their[1], 'S');
	T_EQ(their[2], 'P');
	T_EQ(their[4] << 8 | their[5], 0x31);
	uint32_t id;
	size_t len;
	put_stats(ok, 0x80000001u, q, qlen);
	get_reply(ok, &id, &len);
	T_EQ(id, 0x80000001u);

	/* 1: the header of another protocol (pair1, 0x11). */
	int a = raw_connect(&d);
	static const uint8_t pair1[8] = {0, 'S', 'P', 0, 0x00, 0x11, 0, 0};
	put_all(a, pair1, sizeof(pair1));
	T_ASSERT(closed_within(a, 5000));
	close(a);
	/* 2: not an SP header at all. */
	a = raw_connect(&d);
	put_all(a, "GET / HTTP/1.0\r\n\r\n", 18);
	T_ASSERT(closed_within(a, 5000));
	close(a);
	/* 3: a frame of type 2. */
	a = raw_connect(&d);
	put_all(a, req0_hdr, sizeof(req0_hdr));
	put_frame(a, 2, "abcd", 4, 4);
	T_ASSERT(closed_within(a, 5000));
	close(a);
	/* 4: a frame announcing 8 MiB, above the 4 MiB bound: closed at its
	 * header, nothing of it buffered. */
	a = raw_connect(&d);
	put_all(a, req0_hdr, sizeof(req0_hdr));
	put_frame(a, 1, NULL, 8u << 20, 0);
	T_ASSERT(closed_within(a, 5000));
	close(a);
	T_EQ(th_stat(&d, "control_conns_closed_protocol_total"), 4);

	/* 5: a backtrace without its last word (no top bit in 8 bytes): the
	 * message is dropped, the connection serves on. */
	uint64_t dropped = th_stat(&d, "control_requests_dropped_total");
	a = raw_connect(&d);
	put_all(a, req0_hdr, sizeof(req0_hdr));
	static const uint8_t nobt[8] = {0, 0, 0, 1, 0, 0, 0, 2};
	put_frame(a, 1, nobt, sizeof(nobt), sizeof(nobt));
	/* ... nor does an empty one */
	put_frame(a, 1, NULL, 0, 0);
	put_stats(a, 0x80000007u, q, qlen);
	T_EQ(get_all(a, their, 8, 5000), 1);
	get_reply(a, &id, &len);
	T_EQ(id, 0x80000007u);
	T_EQ(th_stat(&d, "control_requests_dropped_total"), dropped + 2);
	T_EQ(th_stat(&d, "control_conns_closed_protocol_total"), 4);
	close(a);

	/* The bystander was never disturbed. */
	put_stats(ok, 0x80000002u, q, qlen);
	get_reply(ok, &id, &len);
	T_EQ(id, 0x80000002u);
	close(ok);
	free(q);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(ctl_wire, a_slow_reader_gets_every_reply_in_order, 60)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	size_t qlen;
	uint8_t *q = th_stats_req(&qlen);
	int fd = raw_connect(&d);
	put_all(fd, req0_hdr, sizeof(req0_hdr));
	uint8_t their[8];
	T_EQ(get_all(fd, their, 8, 5000), 1);
	/* Far more than max_inflight_per_conn (32) and, at a few KB each,
	 * more replies than 256 KiB plus the kernel's buffers: the daemon
	 * must stop reading and go on as they are taken.  Written from a
	 * child, so this process reads while it writes. */
	enum { N = 600 };
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		for (uint32_t i = 0; i < N; i++)
			put_stats(fd, 0x80000000u | (i + 1), q, qlen);
		_exit(0);
	}
	/* Nothing read for a while: the daemon pauses this connection. */
	uint64_t deadline = th_now_ms() + 10000;
	while (th_stat(&d, "control_reads_paused_total") < 1 &&
	       th_now_ms() < deadline)
		th_sleep_ms(50);
	T_ASSERT(th_stat(&d, "control_reads_paused_total") >= 1);
	/* ... and a healthy engine is served meanwhile. */
	struct kvt_config cfg = th_small_cfg(&d, "beside", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	uint64_t seq;
	T_OK(kvt_seq_open(c, &seq));
	kvt_disconnect(c);
	for (uint32_t i = 0; i < N; i++) {
		uint32_t id;
		size_t len;
		get_reply(fd, &id, &len);
		T_EQ(id, 0x80000000u | (i + 1));
	}
	int st;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	T_EQ(th_stat(&d, "control_requests_dropped_total"), 0);
	T_EQ(th_stat(&d, "control_conns_closed_send_timeout_total"), 0);
	close(fd);
	free(q);
	T_EQ(th_daemon_stop(&d), 0);
}

/* Peers without a tenant announcing big frames and sending them slowly:
 * each frame is refused unread (longer than any request such a peer may
 * send) and at most SRV_RX_BIG_MAX (8) of them could get a big buffer at
 * once anyway (ctl.c), so the daemon's memory does not grow with their
 * number.  Everyone else is served meanwhile. */
TEST_T(ctl_wire, many_big_frames_in_flight_are_bounded, 60)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	enum { PEERS = 32 };
	const size_t flen = 3u << 20; /* under 4 x IPC_MAX_MSG */
	uint8_t *junk = calloc(1, flen);
	T_ASSERT(junk);
	long rss0 = th_rss_kib(d.pid);
	int fds[PEERS];
	for (int i = 0; i < PEERS; i++) {
		fds[i] = raw_connect(&d);
		put_all(fds[i], req0_hdr, sizeof(req0_hdr));
		put_frame(fds[i], 1, NULL, flen, 0);
		/* all but its last byte, as much as the daemon takes */
		int fl = fcntl(fds[i], F_GETFL);
		fcntl(fds[i], F_SETFL, fl | O_NONBLOCK);
		size_t off = 0;
		uint64_t deadline = th_now_ms() + 300;
		while (off < flen - 1 && th_now_ms() < deadline) {
			ssize_t n = write(fds[i], junk + off, flen - 1 - off);
			if (n > 0)
				off += (size_t)n;
			else
				th_sleep_ms(5);
		}
	}
	long grew = th_rss_kib(d.pid) - rss0;
	fprintf(stderr, "    daemon RSS grew by %ld KiB with %d peers half "
	        "way through 3 MiB frames\n", grew, PEERS);
	/* 8 x 3 MiB, and room for the rest; 32 x 3 MiB without the bound */
	T_ASSERT(grew < 40 * 1024);
	char out[4096];
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats >/dev/null",
	           th_bin("kvtrimctl")), 0);
	for (int i = 0; i < PEERS; i++)
		close(fds[i]);
	free(junk);
	T_EQ(th_daemon_stop(&d), 0);
}
