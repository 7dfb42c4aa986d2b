/*
 * test_hostile_decode.c — requests that would be slow to decode, against
 * the real kvtrimd: a megabyte of msgpack nils (an array, or a map of
 * them) from a connection without a tenant is refused unread, for being
 * longer than any hello or admin request, and from a tenant's connection
 * before it is unpacked, for holding more objects than any request; each
 * gets a KVT_ETOOBIG reply that says so, and the connection, the daemon
 * and a tenant's large syncs go on.  On the SP wire written by hand, the
 * frames after one refused unread are read in step.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "codec.h"
#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

/* About IPC_MAX_MSG bytes of nils: an array32 of them, or (map) a map32 of
 * pairs of them. */
static uint8_t *nil_flood(int map, size_t *len)
{
	size_t n = map ? (IPC_MAX_MSG - 5) / 2 : IPC_MAX_MSG - 5;
	*len = 5 + (map ? 2 * n : n);
	uint8_t *b = malloc(*len);
	T_ASSERT(b);
	b[0] = map ? 0xdf : 0xdd;
	for (int i = 0; i < 4; i++)
		b[1 + i] = (uint8_t)(n >> (24 - 8 * i));
	memset(b + 5, 0xc0, *len - 5);
	return b;
}

/* Sends buf, a request of op, on the raw connection sock; the reply's
 * code, its text in msg[KVT_ERRTEXT_MAX].  (Error replies decode the same
 * whatever the op.) */
static int raw_call(uint32_t sock, enum ipc_op op, const void *buf,
                    size_t len, char *msg)
{
	uint8_t *rep;
	size_t rl;
	struct ipc_rep r;
	char why[KVT_ERRTEXT_MAX];
	T_OK(th_raw_call(sock, buf, len, &rep, &rl));
	T_OK(codec_rep_decode(op, rep, rl, &r, why, sizeof(why)));
	free(rep);
	snprintf(msg, KVT_ERRTEXT_MAX, "%s", r.msg);
	int e = r.err;
	codec_rep_free(&r);
	return e;
}

/* Encodes q and sends it on sock: as raw_call. */
static int raw_req(uint32_t sock, const struct ipc_req *q, char *msg)
{
	uint8_t *buf;
	size_t len;
	T_OK(codec_req_encode(q, &buf, &len));
	int e = raw_call(sock, q->op, buf, len, msg);
	free(buf);
	return e;
}

static struct ipc_req req_of(enum ipc_op op)
{
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = op;
	return q;
}

/* A healthy engine: registers, opens a sequence, syncs it. */
static int healthy_engine(const struct th_daemon *d, int syncs)
{
	struct kvt_config cfg = th_small_cfg(d, "healthy", "full");
	kvt_client *c = NULL;
	char err[KVT_ERRTEXT_MAX];
	uint64_t seq;
	int rv = kvt_connect(&cfg, &c, err);
	if (rv)
		return rv;
	if (!(rv = kvt_seq_open(c, &seq)))
		for (int i = 0; i < syncs && !rv; i++) {
			struct kvt_sync_item it = {.seq = seq, .n_new = 1};
			rv = kvt_sync(c, &it, 1);
		}
	kvt_disconnect(c);
	return rv;
}

TEST(hostile_decode, nil_floods_without_a_tenant_are_refused_unread)
{
	struct th_daemon d;
	char msg[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "16M", NULL);
	uint32_t sock = th_raw_conn(&d);
	for (int map = 0; map < 2; map++) {
		size_t len;
		uint8_t *b = nil_flood(map, &len);
		/* Before: EPROTO ("message is an array, not a map", "missing
		 * protocol version"), after msgpack-c built a million
		 * objects on the daemon's loop. */
		T_EQ(raw_call(sock, IPC_OP_STATS, b, len, msg), KVT_ETOOBIG);
		T_ASSERT(strstr(msg, "without a tenant"));
		T_ASSERT(strstr(msg, "hello and admin requests"));
		T_ASSERT(strstr(msg, "refused unread"));
		free(b);
	}
	/* {"v": 3, "op": "hello", "name": 2000 bytes}: longer than any
	 * hello, so refused unread as well (not for its name, which nobody
	 * read). */
	static const uint8_t head[] = {0x83, 0xa1, 'v', IPC_PROTO_VERSION,
	                               0xa2, 'o', 'p', 0xa5, 'h', 'e', 'l',
	                               'l', 'o', 0xa4, 'n', 'a', 'm', 'e',
	                               0xda, 2000 >> 8, 2000 & 0xff};
	uint8_t hello[sizeof(head) + 2000];
	memcpy(hello, head, sizeof(head));
	memset(hello + sizeof(head), 'a', 2000);
	T_EQ(raw_call(sock, IPC_OP_HELLO, hello, sizeof(hello), msg),
	     KVT_ETOOBIG);
	T_ASSERT(strstr(msg, "refused unread"));
	/* A hello as long as a real one may be is read and judged: its
	 * cookie is unknown, which only a decode can tell. */
	struct ipc_req q = req_of(IPC_OP_HELLO);
	memset(q.u.hello.name, 'n', KVT_NAME_MAX - 1);
	memset(q.u.hello.policy, 'p', KVT_SPEC_MAX - 1);
	q.u.hello.geo = (struct kvt_geometry){2, 4, 2, 8, 32};
	T_ASSERT(raw_req(sock, &q, msg) != KVT_ETOOBIG);
	T_ASSERT(strstr(msg, "cookie"));
	/* The connection goes on: the same one gets its stats. */
	q = req_of(IPC_OP_STATS);
	T_EQ(raw_req(sock, &q, msg), 0);
	th_raw_close(sock);
	T_EQ_U64(th_stat(&d, "control_requests_unread_total"), 3);
	T_ASSERT(th_stat(&d, "errors_ETOOBIG_total") >= 3);
	T_EQ_U64(th_stat(&d, "control_conns_closed_protocol_total"), 0);
	/* And so does the daemon. */
	T_OK(healthy_engine(&d, 20));
	T_ASSERT(th_daemon_alive(&d));
	T_EQ(th_daemon_stop(&d), 0);
}

/* A tenant registered by hand on a raw connection. */
struct raw_tenant {
	int hfd;
	uint32_t sock, id;
	uint64_t token;
};

static void raw_register(const struct th_daemon *d, struct raw_tenant *rt,
                         uint32_t max_seqs)
{
	uint64_t cookie;
	char why[KVT_ERRTEXT_MAX];
	struct ipc_rep rep;
	T_OK(th_raw_welcome(d, &rt->hfd, &cookie));
	struct ipc_req q = req_of(IPC_OP_HELLO);
	snprintf(q.u.hello.name, sizeof(q.u.hello.name), "raw");
	q.u.hello.geo = (struct kvt_geometry){2, 4, 2, 8, 32};
	q.u.hello.page_tokens = 4;
	q.u.hello.max_seqs = max_seqs;
	q.u.hello.max_tokens = 32;
	q.u.hello.headroom = 4;
	snprintf(q.u.hello.policy, sizeof(q.u.hello.policy), "full");
	q.u.hello.cookie = cookie;
	q.u.hello.pid = (uint32_t)getpid();
	rt->sock = th_raw_conn(d);
	T_OK(th_raw_request(d, rt->sock, &q, &rep, why, sizeof(why)));
	T_EQ(rep.err, 0);
	rt->id = rep.u.hello.tenant;
	rt->token = rep.u.hello.token;
	codec_rep_free(&rep);
}

TEST(hostile_decode, a_tenants_nil_flood_is_refused_before_unpacking)
{
	struct th_daemon d;
	struct raw_tenant rt;
	char msg[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "16M", NULL);
	raw_register(&d, &rt, 2);
	for (int map = 0; map < 2; map++) {
		size_t len;
		uint8_t *b = nil_flood(map, &len);
		/* Before: EPROTO, as above. */
		T_EQ(raw_call(rt.sock, IPC_OP_STATS, b, len, msg), KVT_ETOOBIG);
		T_ASSERT(strstr(msg, "msgpack objects"));
		T_ASSERT(strstr(msg, "refused before unpacking"));
		free(b);
	}
	/* A tenant's connection may send long requests: these were read
	 * and walked, not refused unread. */
	T_EQ_U64(th_stat(&d, "control_requests_unread_total"), 0);
	/* The tenant goes on, on the same connection. */
	struct ipc_req q = req_of(IPC_OP_SEQ_OPEN);
	q.tenant = rt.id;
	q.token = rt.token;
	q.u.open.no = 1;
	T_EQ(raw_req(rt.sock, &q, msg), 0);
	T_EQ_U64(th_stat(&d, "tenants"), 1);
	th_raw_close(rt.sock);
	close(rt.hfd);
	T_OK(healthy_engine(&d, 5));
	T_EQ(th_daemon_stop(&d), 0);
}

/* A tenant's requests are not held to the bound of connections without
 * one: a sync of 256 items (a few KiB, several times the longest hello)
 * is served. */
TEST(hostile_decode, a_tenants_large_sync_is_served)
{
	enum { N = 256 };
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "large", "full");
	cfg.max_seqs = N;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	static struct kvt_sync_item it[N];
	for (int i = 0; i < N; i++) {
		T_OK(kvt_seq_open(c, &it[i].seq));
		it[i].n_new = 1;
	}
	struct ipc_req q = req_of(IPC_OP_SYNC);
	struct ipc_sync_item items[N];
	memset(items, 0, sizeof(items));
	for (int i = 0; i < N; i++)
		items[i].seq = it[i].seq;
	q.u.sync.no = 1;
	q.u.sync.n = N;
	q.u.sync.items = items;
	q.tenant = UINT32_MAX;
	q.token = UINT64_MAX;
	uint8_t *buf;
	size_t len;
	T_OK(codec_req_encode(&q, &buf, &len));
	free(buf);
	T_ASSERT(len > codec_req_len_max(IPC_OP_HELLO) + 32);
	T_OK(kvt_sync(c, it, N));
	T_OK(kvt_sync(c, it, N));
	struct kvt_list li;
	T_OK(kvt_list_get(c, it[N - 1].seq, 1, 1, &li));
	T_EQ(li.len, 2);
	kvt_disconnect(c);
	T_EQ_U64(th_stat(&d, "control_requests_unread_total"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ------------------------------------------------ the SP wire by hand */

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

static void get_all(int fd, void *buf, size_t len)
{
	uint8_t *b = buf;
	uint64_t deadline = th_now_ms() + 10000;
	while (len) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int left = (int)(deadline - th_now_ms());
		T_ASSERT(left > 0 && poll(&p, 1, left) > 0);
		ssize_t n = read(fd, b, len);
		T_ASSERT(n > 0);
		b += n;
		len -= (size_t)n;
	}
}

/* A frame of type 1: its 64-bit length, the 4-byte word w (a request id
 * when its top bit is set), then body[len]. */
static void put_frame(int fd, uint32_t w, const void *body, size_t len)
{
	uint8_t h[13] = {1};
	for (int i = 0; i < 8; i++)
		h[1 + i] = (uint8_t)((uint64_t)(4 + len) >> (56 - 8 * i));
	for (int i = 0; i < 4; i++)
		h[9 + i] = (uint8_t)(w >> (24 - 8 * i));
	put_all(fd, h, sizeof(h));
	put_all(fd, body, len);
}

/* One reply frame: its request id, and its code (decoded as a reply to
 * op). */
static int get_reply(int fd, enum ipc_op op, uint32_t *id)
{
	uint8_t h[13];
	get_all(fd, h, sizeof(h));
	T_EQ(h[0], 1);
	uint64_t n = 0;
	for (int i = 0; i < 8; i++)
		n = n << 8 | h[1 + i];
	T_ASSERT(n > 4 && n < (1u << 22));
	*id = (uint32_t)h[9] << 24 | (uint32_t)h[10] << 16 |
	      (uint32_t)h[11] << 8 | h[12];
	uint8_t *body = malloc(n - 4);
	T_ASSERT(body);
	get_all(fd, body, n - 4);
	struct ipc_rep rep;
	char why[KVT_ERRTEXT_MAX];
	T_OK(codec_rep_decode(op, body, n - 4, &rep, why, sizeof(why)));
	int e = rep.err;
	codec_rep_free(&rep);
	free(body);
	return e;
}

/*
 * In one stream, without waiting: a frame of 3 MiB of junk (above
 * IPC_MAX_MSG, under the 4 MiB that closes a connection), one of 64 KiB
 * whose backtrace never ends (dropped, as nng's rep0 drops it), then a
 * stats request.  The first is answered KVT_ETOOBIG at once, the second
 * dropped, both skipped as they come, and the third is read in step and
 * answered.
 */
TEST(hostile_decode, frames_after_one_refused_unread_are_read_in_step)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	uint64_t dropped = th_stat(&d, "control_requests_dropped_total");
	int fd = th_ctl_connect(&d);
	T_ASSERT(fd >= 0);
	static const uint8_t req0_hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
	put_all(fd, req0_hdr, sizeof(req0_hdr));
	uint8_t their[8];
	get_all(fd, their, sizeof(their));
	size_t big = 3u << 20, qlen;
	uint8_t *junk = malloc(big);
	T_ASSERT(junk);
	memset(junk, 'x', big); /* no word of it has its top bit set */
	uint8_t *q = th_stats_req(&qlen);
	put_frame(fd, 0x80000001u, junk, big - 4);
	put_frame(fd, 0x00000001u, junk, (64u << 10) - 4);
	put_frame(fd, 0x80000003u, q, qlen);
	uint32_t id;
	T_EQ(get_reply(fd, IPC_OP_STATS, &id), KVT_ETOOBIG);
	T_EQ(id, 0x80000001u);
	T_EQ(get_reply(fd, IPC_OP_STATS, &id), 0);
	T_EQ(id, 0x80000003u);
	T_EQ_U64(th_stat(&d, "control_requests_unread_total"), 1);
	T_EQ_U64(th_stat(&d, "control_requests_dropped_total"), dropped + 1);
	T_EQ_U64(th_stat(&d, "control_conns_closed_protocol_total"), 0);
	close(fd);
	free(junk);
	free(q);
	T_EQ(th_daemon_stop(&d), 0);
}
