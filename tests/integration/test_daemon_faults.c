/*
 * test_daemon_faults.c — the real kvtrimd against bad input (garbage,
 * truncated, oversized and unknown-version messages, refused registrations
 * and syncs that change nothing, a garbage flood beside verifying engines)
 * and faults (a SIGKILLed client, the daemon gone, SIGTERM with clients
 * connected).  Expected values come from the test's own arithmetic.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "daemon.h"
#include "handle.h"
#include "kvtrim.h"
#include "test.h"
/* ---------------------------------------------------------- bad input */

static int raw_error(const struct th_daemon *d, const void *buf, size_t len,
                     char *msg)
{
	uint8_t *rep;
	size_t rl;
	struct ipc_rep r;
	char why[256];
	T_OK(th_raw_req(d, buf, len, &rep, &rl));
	/* Error replies decode the same whatever the op. */
	T_OK(codec_rep_decode(IPC_OP_STATS, rep, rl, &r, why, sizeof(why)));
	free(rep);
	if (msg)
		snprintf(msg, KVT_ERRTEXT_MAX, "%s", r.msg);
	int e = r.err;
	codec_rep_free(&r);
	return e;
}

/* One request on a raw connection (sock 0: a fresh one for this call). */
static int raw_req_on(const struct th_daemon *d, uint32_t sock,
                      const struct ipc_req *q, struct ipc_rep *r)
{
	char why[256];
	int rc = th_raw_request(d, sock, q, r, why, sizeof(why));
	if (rc)
		th_fail(__FILE__, __LINE__, "%s", why);
	return r->err;
}

TEST(badinput, garbage_truncated_oversized_unknown_version)
{
	struct th_daemon d;
	char msg[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "16M", NULL);

	T_EQ(raw_error(&d, "\xc1\xc1garbage", 9, msg), KVT_EPROTO);
	T_ASSERT(msg[0]);
	T_EQ(raw_error(&d, "", 0, NULL), KVT_EPROTO);

	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = IPC_OP_STATS;
	uint8_t *buf;
	size_t len;
	T_OK(codec_req_encode(&q, &buf, &len));
	for (size_t cut = 1; cut < len; cut++)
		T_EQ(raw_error(&d, buf, cut, NULL), KVT_EPROTO);
	free(buf);

	size_t big = IPC_MAX_MSG + 16;
	uint8_t *huge = calloc(1, big);
	T_EQ(raw_error(&d, huge, big, NULL), KVT_ETOOBIG);
	free(huge);

	/* {"v": 99, "op": "stats"} */
	const uint8_t v99[] = {0x82, 0xa1, 'v', 99, 0xa2, 'o', 'p',
	                       0xa5, 's', 't', 'a', 't', 's'};
	T_EQ(raw_error(&d, v99, sizeof(v99), msg), KVT_EVERSION);
	/* {"v": 4, "op": "launch"} */
	const uint8_t unk[] = {0x82, 0xa1, 'v', IPC_PROTO_VERSION, 0xa2, 'o',
	                       'p', 0xa6, 'l', 'a', 'u', 'n', 'c', 'h'};
	T_EQ(raw_error(&d, unk, sizeof(unk), msg), KVT_EUNKNOWNOP);
	/* A version 1 client (sequence ids without their tenant) is refused
	 * at its first request, its hello (docs/protocol.md, Versions). */
	const uint8_t v1[] = {0x82, 0xa1, 'v', 1, 0xa2, 'o', 'p',
	                      0xa5, 'h', 'e', 'l', 'l', 'o'};
	T_EQ(raw_error(&d, v1, sizeof(v1), msg), KVT_EVERSION);
	T_ASSERT(strstr(msg, "protocol version 1, this side speaks 4"));
	/* So is a version 2 one (syncs without numbers). */
	const uint8_t v2[] = {0x82, 0xa1, 'v', 2, 0xa2, 'o', 'p',
	                      0xa5, 'h', 'e', 'l', 'l', 'o'};
	T_EQ(raw_error(&d, v2, sizeof(v2), msg), KVT_EVERSION);
	T_ASSERT(strstr(msg, "protocol version 2, this side speaks 4"));
	/* And a version 3 one (queries without numbers). */
	const uint8_t v3[] = {0x82, 0xa1, 'v', 3, 0xa2, 'o', 'p',
	                      0xa5, 'h', 'e', 'l', 'l', 'o'};
	T_EQ(raw_error(&d, v3, sizeof(v3), msg), KVT_EVERSION);
	T_ASSERT(strstr(msg, "protocol version 3, this side speaks 4"));

	/* The daemon still serves: stats answer, errors were counted. */
	T_EQ_U64(th_stat(&d, "tenants"), 0);
	T_ASSERT(th_stat(&d, "error_replies_total") >= 6);
	T_ASSERT(th_daemon_alive(&d));
	T_EQ(th_daemon_stop(&d), 0);
}

static int raw_req(const struct th_daemon *d, const struct ipc_req *q,
                   struct ipc_rep *r)
{
	return raw_req_on(d, 0, q, r);
}

/* A tenant registered by hand: handle channel + raw hello on its own
 * persistent control connection. */
static struct kvt_geometry raw_geo = {2, 4, 2, 8, 32};

struct raw_tenant {
	int hfd;
	uint32_t sock;
	uint32_t id;
	uint64_t token;
};

#define RT_REQ(rt, q, rep) raw_req_on(&d, (rt)->sock, (q), (rep))

static void raw_hello(const struct th_daemon *d, struct raw_tenant *rt,
                      struct ipc_rep *rep, const char *policy, uint64_t quota,
                      int expect)
{
	uint64_t cookie;
	T_OK(th_raw_welcome(d, &rt->hfd, &cookie));
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = IPC_OP_HELLO;
	snprintf(q.u.hello.name, sizeof(q.u.hello.name), "raw");
	q.u.hello.geo = raw_geo;
	q.u.hello.page_tokens = 4;
	q.u.hello.max_seqs = 2;
	q.u.hello.max_tokens = 32;
	q.u.hello.headroom = 4;
	snprintf(q.u.hello.policy, sizeof(q.u.hello.policy), "%s", policy);
	q.u.hello.quota_bytes = quota;
	q.u.hello.cookie = cookie;
	q.u.hello.pid = (uint32_t)getpid();
	rt->sock = th_raw_conn(d);
	T_EQ(raw_req_on(d, rt->sock, &q, rep), expect);
	if (!expect) {
		rt->id = rep->u.hello.tenant;
		rt->token = rep->u.hello.token;
	}
}

static struct ipc_req tq(const struct raw_tenant *rt, enum ipc_op op)
{
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = op;
	q.tenant = rt->id;
	q.token = rt->token;
	return q;
}

TEST(badinput, registration_refusals_change_nothing)
{
	struct th_daemon d;
	struct raw_tenant rt;
	struct ipc_rep rep;
	th_daemon_start(&d, "16M", NULL);
	raw_hello(&d, &rt, &rep, "nonsense:x=1", 0, KVT_EPOLICY);
	T_ASSERT(strstr(rep.msg, "nonsense"));
	codec_rep_free(&rep);
	close(rt.hfd);
	th_raw_close(rt.sock);
	raw_hello(&d, &rt, &rep, "streaming:tokens=abc", 0, KVT_EPOLICY);
	codec_rep_free(&rep);
	close(rt.hfd);
	th_raw_close(rt.sock);
	raw_hello(&d, &rt, &rep, "full", 32ull << 20, KVT_EQUOTA);
	codec_rep_free(&rep);
	close(rt.hfd);
	th_raw_close(rt.sock);
	/* A cookie nobody was given. */
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.version = IPC_PROTO_VERSION;
	q.op = IPC_OP_HELLO;
	q.u.hello.geo = (struct kvt_geometry){2, 4, 2, 8, 32};
	q.u.hello.cookie = 12345;
	T_EQ(raw_req(&d, &q, &rep), KVT_ENOTENANT);
	codec_rep_free(&rep);
	/* Bad geometry: 5 query heads over 2 KV heads. */
	raw_geo.n_heads = 5;
	raw_hello(&d, &rt, &rep, "full", 0, KVT_EGEOMETRY);
	T_ASSERT(strstr(rep.msg, "n_heads"));
	codec_rep_free(&rep);
	close(rt.hfd);
	th_raw_close(rt.sock);
	T_EQ_U64(th_stat(&d, "tenants"), 0);
	raw_geo.n_heads = 4;
	raw_hello(&d, &rt, &rep, "full", 0, 0);
	codec_rep_free(&rep);
	T_EQ_U64(th_stat(&d, "tenants"), 1);
	T_EQ_U64(th_stat(&d, "pool_chunks_used"), 0);
	close(rt.hfd);
	th_raw_close(rt.sock);
	th_sleep_ms(200);
	T_EQ_U64(th_stat(&d, "tenants"), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(badinput, sync_refusals_change_nothing)
{
	struct th_daemon d;
	struct raw_tenant rt, other;
	struct ipc_rep rep;
	struct ipc_req q;
	char out[4096];
	th_daemon_start(&d, "16M", NULL);
	raw_hello(&d, &rt, &rep, "full", 0, 0);
	codec_rep_free(&rep);

	q = tq(&rt, IPC_OP_SEQ_OPEN);
	T_OK(RT_REQ(&rt, &q, &rep));
	uint64_t seq = rep.u.seq;
	codec_rep_free(&rep);

	struct ipc_sync_item it = {seq, 0, 2, KVT_PHASE_PREFILL, 0, 0, 0};
	q = tq(&rt, IPC_OP_SYNC);
	q.u.sync.no = 7;
	q.u.sync.n = 1;
	q.u.sync.items = &it;
	T_OK(RT_REQ(&rt, &q, &rep));
	codec_rep_free(&rep);
	uint64_t appended = th_stat(&d, "entries_appended_total");
	T_EQ_U64(appended, 2 * 2 * 2);

	/* The same sync again (counter 0): a resend must not commit twice. */
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ESTALE);
	codec_rep_free(&rep);
	it.counter = 1;
	it.n_new = 5; /* headroom 4 */
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_EHEADROOM);
	codec_rep_free(&rep);
	it.n_new = 1;
	it.layer_lo = 1;
	it.layer_hi = 3;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ELAYERS);
	codec_rep_free(&rep);
	it.layer_lo = 1;
	it.layer_hi = 1;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ELAYERS);
	codec_rep_free(&rep);
	it.layer_lo = 0;
	it.layer_hi = 0;
	it.seq = seq ^ (1ull << 32); /* right slot, wrong generation */
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ENOSEQ);
	codec_rep_free(&rep);
	it.seq = 77;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ENOSEQ);
	codec_rep_free(&rep);
	/* Two items of the same sequence, the first valid: nothing applies. */
	struct ipc_sync_item two[2] = {{seq, 1, 1, 1, 0, 0, 0},
	                               {seq, 1, 1, 1, 0, 0, 0}};
	q.u.sync.n = 2;
	q.u.sync.items = two;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_EINVAL);
	codec_rep_free(&rep);
	/* Wrong token. */
	q = tq(&rt, IPC_OP_SEQ_OPEN);
	q.token ^= 1;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ENOTENANT);
	codec_rep_free(&rep);

	/* A second tenant cannot name the first one's sequence, even with
	 * a sequence of its own in the same slot and generation (sequence
	 * ids carry their tenant). */
	raw_hello(&d, &other, &rep, "full", 0, 0);
	codec_rep_free(&rep);
	q = tq(&other, IPC_OP_SEQ_OPEN);
	T_OK(RT_REQ(&other, &q, &rep));
	uint64_t own = rep.u.seq;
	codec_rep_free(&rep);
	T_ASSERT(own != seq);
	T_EQ(own & 0xffff, seq & 0xffff); /* the same slot */
	struct ipc_sync_item foreign = {seq, 0, 1, 1, 0, 0, 0};
	q = tq(&other, IPC_OP_SYNC);
	q.u.sync.n = 1;
	q.u.sync.items = &foreign;
	T_EQ(RT_REQ(&other, &q, &rep), KVT_ENOSEQ);
	codec_rep_free(&rep);
	q = tq(&other, IPC_OP_SEQ_CLOSE);
	q.u.seq = seq;
	T_EQ(RT_REQ(&other, &q, &rep), KVT_ENOSEQ);
	codec_rep_free(&rep);
	q = tq(&other, IPC_OP_SEQ_QUERY);
	q.u.query.seq = seq;
	T_EQ(RT_REQ(&other, &q, &rep), KVT_ENOSEQ);
	codec_rep_free(&rep);
	q.u.query.seq = own; /* its own sequence is untouched */
	T_OK(RT_REQ(&other, &q, &rep));
	T_EQ(rep.u.query.syncs, 0);
	T_EQ(rep.u.query.len_hi, 0);
	codec_rep_free(&rep);

	T_EQ_U64(th_stat(&d, "entries_appended_total"), appended);
	T_EQ_U64(th_stat(&d, "entries_kept"), appended);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	/* A query naming a sync not sent before it (at or above the query's
	 * own number) is refused and marks nothing: sync 50 is then
	 * applied, not voided. */
	q = tq(&rt, IPC_OP_SEQ_QUERY);
	q.u.query.seq = seq;
	q.u.query.no = 20;
	q.u.query.after = 50;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_EINVAL);
	T_ASSERT(strstr(rep.msg, "had not sent"));
	codec_rep_free(&rep);
	q.u.query.no = 100;
	q.u.query.after = UINT64_MAX;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_EINVAL);
	codec_rep_free(&rep);
	it = (struct ipc_sync_item){seq, 1, 1, KVT_PHASE_DECODE, 0, 0, 0};
	q = tq(&rt, IPC_OP_SYNC);
	q.u.sync.no = 50;
	q.u.sync.n = 1;
	q.u.sync.items = &it;
	T_OK(RT_REQ(&rt, &q, &rep));
	codec_rep_free(&rep);
	T_EQ_U64(th_stat(&d, "entries_appended_total"), appended + 4);
	/* A sync that reached the tenant and was refused (a wrong counter)
	 * can be asked about: "not applied" (last is 50), and it is voided,
	 * so the same number is refused even when it is right; the next
	 * number is applied. */
	it.counter = 9;
	q.u.sync.no = 60;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ESTALE);
	codec_rep_free(&rep);
	q = tq(&rt, IPC_OP_SEQ_QUERY);
	q.u.query.seq = seq;
	q.u.query.no = 61;
	q.u.query.after = 60;
	T_OK(RT_REQ(&rt, &q, &rep));
	T_EQ_U64(rep.u.query.last, 50);
	T_EQ(rep.u.query.syncs, 2);
	codec_rep_free(&rep);
	it.counter = 2;
	q = tq(&rt, IPC_OP_SYNC);
	q.u.sync.no = 60;
	q.u.sync.n = 1;
	q.u.sync.items = &it;
	T_EQ(RT_REQ(&rt, &q, &rep), KVT_ESTALE);
	T_ASSERT(strstr(rep.msg, "given up"));
	codec_rep_free(&rep);
	T_EQ_U64(th_stat(&d, "entries_appended_total"), appended + 4);
	q.u.sync.no = 62;
	T_OK(RT_REQ(&rt, &q, &rep));
	codec_rep_free(&rep);
	T_EQ_U64(th_stat(&d, "entries_appended_total"), appended + 8);
	q = tq(&rt, IPC_OP_SEQ_QUERY);
	q.u.query.seq = seq;
	q.u.query.no = 63;
	q.u.query.after = 62;
	T_OK(RT_REQ(&rt, &q, &rep));
	T_EQ_U64(rep.u.query.last, 62);
	T_EQ(rep.u.query.syncs, 3);
	codec_rep_free(&rep);
	/* One counter numbers a client's opens and syncs: an open numbered
	 * at or below a sync seen (or unnumbered, 0) is refused, nothing
	 * opened; the next number opens. */
	uint64_t opened = th_stat(&d, "sequences_opened_total");
	uint64_t nos[] = {3, 62, 0};
	for (size_t i = 0; i < sizeof(nos) / sizeof(nos[0]); i++) {
		q = tq(&rt, IPC_OP_SEQ_OPEN);
		q.u.open.no = nos[i];
		T_EQ(RT_REQ(&rt, &q, &rep), KVT_ESTALE);
		T_ASSERT(strstr(rep.msg, "numbered later"));
		codec_rep_free(&rep);
	}
	T_EQ_U64(th_stat(&d, "sequences_opened_total"), opened);
	q = tq(&rt, IPC_OP_SEQ_OPEN);
	q.u.open.no = 64;
	T_OK(RT_REQ(&rt, &q, &rep));
	codec_rep_free(&rep);
	T_EQ_U64(th_stat(&d, "sequences_opened_total"), opened + 1);
	close(rt.hfd);
	th_raw_close(rt.sock);
	close(other.hfd);
	th_raw_close(other.sock);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------- faults */

TEST_T(faults, sigkilled_client_pages_return_within_a_second, 120)
{
	struct th_daemon d;
	char out[8192];
	th_daemon_start(&d, "128M", NULL);
	/* A healthy tenant that verifies throughout, in the background. */
	char cmd[1024];
	snprintf(cmd, sizeof(cmd),
	         "KVTRIM_RUNTIME_DIR=%s %s --runtime-dir %s --clients 2 "
	         "--seqs 3 --steps 400 --policy streaming:tokens=32 --verify "
	         "--name healthy > %s/healthy.out 2>&1",
	         d.dir, th_bin("kvtrim-loadgen"), d.dir, th_tmpdir());
	pid_t bg = fork();
	if (bg == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	/* A victim that kills itself mid-run, holding pages. */
	int rc = th_sh(&d, out, sizeof(out),
	               "%s --runtime-dir %s --clients 1 --seqs 4 --steps 300 "
	               "--policy full --kill-after-steps 100 --name victim",
	               th_bin("kvtrim-loadgen"), d.dir);
	T_ASSERT(strstr(out, "killed=1"));
	(void)rc;
	/* Within one second no tenant named victim holds anything. */
	int gone = 0;
	for (int i = 0; i < 20 && !gone; i++) {
		th_sh(&d, out, sizeof(out), "%s tenants", th_bin("kvtrimctl"));
		gone = !strstr(out, "victim");
		if (!gone)
			th_sleep_ms(50);
	}
	T_ASSERT(gone);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	int st;
	waitpid(bg, &st, 0);
	th_sh(NULL, out, sizeof(out), "cat %s/healthy.out", th_tmpdir());
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		th_fail(__FILE__, __LINE__, "healthy loadgen failed:\n%s", out);
	T_ASSERT(strstr(out, "mismatches=0"));
	T_EQ_U64(th_stat(&d, "pool_chunks_used"), 0);
	T_ASSERT(th_stat(&d, "tenants_reclaimed_total") >= 1);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(faults, daemon_gone_is_a_typed_error_not_a_hang)
{
	struct th_daemon d;
	kvt_client *c;
	kvt_seq seq;
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "orphan", "full");
	cfg.timeout_ms = 1000;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	T_EQ(th_daemon_stop(&d), 0);
	struct kvt_sync_item it = {seq, 1, KVT_PHASE_DECODE, 0, 0};
	int rv = kvt_sync(c, &it, 1);
	T_ASSERT(rv == KVT_ECONN || rv == KVT_ETIMEDOUT || rv == KVT_ESHUTDOWN);
	kvt_disconnect(c);
	/* Nothing listens now: connecting fails at once with ECONN. */
	T_ERR(kvt_connect(&cfg, &c, err), KVT_ECONN);
}

TEST(faults, sigterm_while_clients_connected_exits_zero)
{
	struct th_daemon d;
	kvt_client *c[3];
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "32M", NULL);
	for (int i = 0; i < 3; i++) {
		struct kvt_config cfg = th_small_cfg(&d, "busy", "streaming");
		kvt_seq seq;
		T_OK(kvt_connect(&cfg, &c[i], err));
		T_OK(kvt_seq_open(c[i], &seq));
	}
	T_EQ(th_daemon_stop(&d), 0);
	for (int i = 0; i < 3; i++)
		kvt_disconnect(c[i]);
}

TEST_T(badinput, garbage_flood_while_others_verify, 120)
{
	struct th_daemon d;
	char out[8192], cmd[1024];
	th_daemon_start(&d, "64M", NULL);
	snprintf(cmd, sizeof(cmd),
	         "%s --runtime-dir %s --clients 2 --seqs 3 --steps 300 "
	         "--policy streaming:tokens=24 --step-us 300 --verify "
	         "--name steady > %s/steady.out 2>&1",
	         th_bin("kvtrim-loadgen"), d.dir, th_tmpdir());
	pid_t bg = fork();
	if (bg == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	/* 300 random messages of 1..600 bytes, some starting like a valid
	 * request, each on its own connection, while the engines run. */
	uint64_t x = 0x9e3779b97f4a7c15ull;
	uint8_t buf[600];
	const uint8_t head[] = {0x84, 0xa1, 'v', 1, 0xa2, 'o', 'p', 0xa4,
	                        's', 'y', 'n', 'c'};
	int refused = 0;
	for (int i = 0; i < 300; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		size_t len = 1 + x % sizeof(buf);
		for (size_t j = 0; j < len; j++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			buf[j] = (uint8_t)x;
		}
		if (i % 2 && len > sizeof(head))
			memcpy(buf, head, sizeof(head));
		uint8_t *rep;
		size_t rl;
		struct ipc_rep r;
		char why[256];
		T_OK(th_raw_req(&d, buf, len, &rep, &rl));
		T_OK(codec_rep_decode(IPC_OP_STATS, rep, rl, &r, why, sizeof(why)));
		refused += r.err < 0;
		codec_rep_free(&r);
		free(rep);
	}
	T_EQ(refused, 300);
	int st;
	waitpid(bg, &st, 0);
	th_sh(NULL, out, sizeof(out), "cat %s/steady.out", th_tmpdir());
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		th_fail(__FILE__, __LINE__, "engines failed:\n%s", out);
	T_ASSERT(strstr(out, "mismatches=0"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_ASSERT(th_stat(&d, "error_replies_total") >= 300);
	T_EQ(th_daemon_stop(&d), 0);
}
