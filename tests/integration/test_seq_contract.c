/*
 * test_seq_contract.c — the sequence part of the contract between
 * libkvtrim and an engine, against the real daemon: a sync that
 * timed out while kvtrimd was stopped is resolved with kvt_seq_query and
 * the sequence goes on; sequence ids carry their tenant and
 * generation; and the smaller promises (kvt_last_error
 * always about the last call, the one-sync-per-sequence rule with a
 * reason, a sync of zero items, a drained tenant's code text, const
 * accessors, kvtrimctl stats of a shared name, the policy's inputs in the
 * connect reply).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

/* ------------------------------------------------------------- helpers */

/* The length every list of seq has (fails the test when they differ). */
static uint32_t seq_len(const kvt_client *c, kvt_seq seq)
{
	const struct kvt_config *cfg = kvt_config_of(c);
	uint32_t len = UINT32_MAX;
	for (uint32_t l = 0; l < cfg->geo.n_layers; l++)
		for (uint32_t h = 0; h < cfg->geo.n_kv_heads; h++) {
			struct kvt_list v;
			T_OK(kvt_list_get(c, seq, l, h, &v));
			if (len == UINT32_MAX)
				len = v.len;
			T_EQ(v.len, len);
		}
	return len;
}

static struct kvt_sync_item one(kvt_seq seq, uint32_t n_new)
{
	return (struct kvt_sync_item){.seq = seq, .n_new = n_new,
	                              .phase = KVT_PHASE_DECODE};
}

/* Small geometry (th_small_cfg: headroom 4, policy "full" keeps every
 * entry, so lengths are sums of n_new) with a short timeout. */
static struct kvt_config quick_cfg(const struct th_daemon *d,
                                   const char *name)
{
	struct kvt_config cfg = th_small_cfg(d, name, "full");
	cfg.timeout_ms = 400;
	return cfg;
}

/* ------------------------------------------------- timed-out syncs (1) */

/*
 * kvtrimd is stopped (SIGSTOP) while a sync is under way: the sync times
 * out, the sequence is in doubt (syncs refused with ESTALE naming
 * kvt_seq_query, lists EBUSY, a query while still stopped times out and
 * changes nothing), and once the daemon runs again kvt_seq_query says the
 * sync was applied (blocking and async) or not (one the daemon refused:
 * 5 new entries with headroom 4); the next syncs succeed with the right
 * lengths and the pool checks clean.
 */
TEST_T(seq_contract, timed_out_sync_is_resolved_by_a_query, 60)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c;
	kvt_seq seq, other;
	struct kvt_seq_info info;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = quick_cfg(&d, "paused");
	/* Long enough that a loaded machine still writes each request to the
	 * socket before its call times out (a request nng never sent is,
	 * rightly, "not applied", which is not what case 1 sets up); every
	 * timeout below happens while the daemon is stopped. */
	cfg.timeout_ms = 1500;
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	T_OK(kvt_seq_open(c, &other));
	struct kvt_sync_item it = one(seq, 2);
	T_OK(kvt_sync(c, &it, 1));
	T_EQ(seq_len(c, seq), 2);
	T_OK(kvt_seq_query(c, seq, &info));
	T_EQ(info.syncs, 1);
	T_EQ(info.last_sync, -1); /* nothing was in doubt */

	/* 1. Blocking sync, applied after the pause. */
	struct kvt_sync_info si;
	T_OK(kvt_last_sync(c, &si));
	uint64_t accepted = si.syncs;
	T_EQ(kill(d.pid, SIGSTOP), 0);
	it = one(seq, 3);
	T_ERR(kvt_sync(c, &it, 1), KVT_ETIMEDOUT);
	T_ASSERT(strstr(kvt_last_error(c), "no reply"));
	it = one(seq, 1);
	T_ERR(kvt_sync(c, &it, 1), KVT_ESTALE);
	T_ASSERT(strstr(kvt_last_error(c), "kvt_seq_query"));
	struct kvt_list v;
	T_ERR(kvt_list_get(c, seq, 0, 0, &v), KVT_EBUSY);
	void *kp, *vp;
	T_ERR(kvt_kv_ptr(c, seq, 0, 0, 0, &kp, &vp), KVT_EBUSY);
	/* Another sequence of the client, not in that sync, is not in
	 * doubt. */
	T_EQ(seq_len(c, other), 0);
	T_ERR(kvt_seq_query(c, seq, &info), KVT_ETIMEDOUT);
	it = one(seq, 1);
	T_ERR(kvt_sync(c, &it, 1), KVT_ESTALE); /* still in doubt */
	T_EQ(kill(d.pid, SIGCONT), 0);
	memset(&info, 0x5a, sizeof(info));
	T_OK(kvt_seq_query(c, seq, &info));
	/* Applied (the request was on the wire before the call gave up: the
	 * usual case) or not (under heavy load nng may still have held it
	 * when the call timed out): the query must say which, and the
	 * counts must agree with what it says. */
	T_ASSERT(info.last_sync == 1 || info.last_sync == 0);
	uint32_t a = (uint32_t)info.last_sync, len = 2 + 3 * a;
	T_EQ(info.syncs, 1 + a);
	T_EQ(info.seen_min, len);
	T_EQ(info.seen_max, len);
	T_EQ(info.len_min, len);
	T_EQ(info.len_max, len);
	T_EQ(seq_len(c, seq), len);
	/* kvt_last_sync counts the sync found applied. */
	T_OK(kvt_last_sync(c, &si));
	T_EQ_U64(si.syncs, accepted + a);
	it = one(seq, 1);
	T_OK(kvt_sync(c, &it, 1));
	T_EQ(seq_len(c, seq), len + 1);
	uint32_t syncs = 2 + a;
	len += 1;

	/* 2. A sync the daemon refuses once it runs again (5 > headroom 4;
	 * the library does not check n_new): not applied. */
	T_EQ(kill(d.pid, SIGSTOP), 0);
	it = one(seq, 5);
	T_ERR(kvt_sync(c, &it, 1), KVT_ETIMEDOUT);
	T_EQ(kill(d.pid, SIGCONT), 0);
	T_OK(kvt_seq_query(c, seq, &info));
	T_EQ(info.last_sync, 0);
	T_EQ(info.syncs, syncs);
	T_EQ(info.len_max, len);
	it = one(seq, 4);
	T_OK(kvt_sync(c, &it, 1));
	syncs++;
	len += 4;
	T_EQ(seq_len(c, seq), len);

	/* 3. Async: kvt_wait times out, then the same resolution. */
	T_OK(kvt_last_sync(c, &si));
	accepted = si.syncs;
	T_EQ(kill(d.pid, SIGSTOP), 0);
	kvt_ticket tk;
	struct kvt_sync_item two[2] = {one(seq, 2), one(other, 3)};
	T_OK(kvt_sync_async(c, two, 2, &tk));
	T_ERR(kvt_wait(c, tk), KVT_ETIMEDOUT);
	T_EQ(kill(d.pid, SIGCONT), 0);
	T_OK(kvt_seq_query(c, seq, &info));
	T_ASSERT(info.last_sync == 1 || info.last_sync == 0); /* see case 1 */
	a = (uint32_t)info.last_sync;
	T_EQ(info.syncs, syncs + a);
	T_EQ(info.len_max, len + 2 * a);
	/* A sequence still in doubt is refused as one item among others. */
	T_ERR(kvt_sync(c, two, 2), KVT_ESTALE);
	T_OK(kvt_seq_query(c, other, &info));
	T_EQ(info.last_sync, (int)a); /* one request: both or neither */
	T_EQ(info.syncs, a);
	T_EQ(seq_len(c, other), 3 * a);
	/* One sync found applied through both its sequences: counted once. */
	T_OK(kvt_last_sync(c, &si));
	T_EQ_U64(si.syncs, accepted + a);
	two[0] = one(seq, 1);
	two[1] = one(other, 1);
	for (int i = 0; i < 3; i++)
		T_OK(kvt_sync(c, two, 2));
	T_EQ(seq_len(c, seq), len + 2 * a + 3);
	T_EQ(seq_len(c, other), 3 * a + 3);
	T_OK(kvt_seq_query(c, seq, &info));
	T_EQ(info.syncs, syncs + a + 3);
	T_EQ(info.last_sync, -1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_OK(kvt_seq_close(c, seq));
	T_ERR(kvt_seq_query(c, seq, &info), KVT_ENOSEQ);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ------------------------------------------------ timed-out opens (8) */

/*
 * A kvt_seq_open that times out while kvtrimd is stopped may still open a
 * sequence once it runs again, whose id the client never learns.  With
 * max_seqs 2 and one sequence open, that lost one took the last slot:
 * before, every later open failed with ESEQLIMIT until disconnect.  Now
 * the next open has the daemon close it first: the open succeeds and the
 * tenant holds exactly the client's two sequences.
 */
TEST_T(seq_contract, timed_out_open_is_closed_by_the_next_open, 60)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c;
	kvt_seq a, b;
	struct kvt_tenant_stats st;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = quick_cfg(&d, "lost-open");
	cfg.max_seqs = 2;
	cfg.timeout_ms = 1500; /* see timed_out_sync_is_resolved_by_a_query */
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &a));
	T_EQ(kill(d.pid, SIGSTOP), 0);
	kvt_seq lost = 0;
	T_ERR(kvt_seq_open(c, &lost), KVT_ETIMEDOUT);
	T_EQ(lost, 0);
	T_EQ(kill(d.pid, SIGCONT), 0);
	/* A round trip: the lost open, when it reached the daemon, has been
	 * applied by the time the answer comes. */
	T_OK(kvt_stats(c, &st));
	fprintf(stderr, "    the timed-out open %s applied\n",
	        st.sequences == 2 ? "was" : "was not");
	T_ASSERT(st.sequences == 1 || st.sequences == 2);
	T_OK(kvt_seq_open(c, &b));
	T_ASSERT(b != a);
	T_OK(kvt_stats(c, &st));
	T_EQ_U64(st.sequences, 2);
	struct kvt_sync_item it = one(b, 1);
	T_OK(kvt_sync(c, &it, 1));
	T_EQ(seq_len(c, b), 1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_OK(kvt_seq_close(c, a));
	T_OK(kvt_seq_close(c, b));
	T_OK(kvt_stats(c, &st));
	T_EQ_U64(st.sequences, 0);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* --------------------------------------------- ids carry the tenant (2) */

/*
 * Two clients (an engine with two models) each open a sequence in slot 0:
 * the ids differ, and each client refuses the other's id with ENOSEQ in
 * every call, changing nothing on either side.  A stale id of a closed
 * sequence is refused once its slot is reused.
 */
TEST(seq_contract, ids_of_another_client_and_stale_ids_are_enoseq)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *a, *b;
	kvt_seq sa, sb;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config ca = quick_cfg(&d, "model-a"),
	                  cb = quick_cfg(&d, "model-b");
	T_OK(kvt_connect(&ca, &a, err));
	T_OK(kvt_connect(&cb, &b, err));
	T_OK(kvt_seq_open(a, &sa));
	T_OK(kvt_seq_open(b, &sb));
	T_ASSERT(sa != sb);
	struct kvt_sync_item it = one(sa, 3);
	T_OK(kvt_sync(a, &it, 1));
	it = one(sb, 1);
	T_OK(kvt_sync(b, &it, 1));

	/* Both sequences are at counter 1 now, so only the id tells. */
	struct kvt_list v;
	struct kvt_seq_info info;
	void *kp, *vp;
	it = one(sa, 2);
	T_ERR(kvt_sync(b, &it, 1), KVT_ENOSEQ);
	T_ASSERT(strstr(kvt_last_error(b), "no open sequence"));
	kvt_ticket tk;
	T_ERR(kvt_sync_async(b, &it, 1, &tk), KVT_ENOSEQ);
	T_ERR(kvt_list_get(b, sa, 0, 0, &v), KVT_ENOSEQ);
	T_ERR(kvt_kv_ptr(b, sa, 0, 0, 0, &kp, &vp), KVT_ENOSEQ);
	T_ASSERT(kvt_stage_x(b, sa, 0, 0) == NULL);
	T_ERR(kvt_seq_query(b, sa, &info), KVT_ENOSEQ);
	T_ERR(kvt_seq_close(b, sa), KVT_ENOSEQ);
	it = one(sb, 2);
	T_ERR(kvt_sync(a, &it, 1), KVT_ENOSEQ);
	T_ERR(kvt_seq_close(a, sb), KVT_ENOSEQ);
	T_EQ(seq_len(a, sa), 3);
	T_EQ(seq_len(b, sb), 1);
	T_OK(kvt_seq_query(a, sa, &info));
	T_EQ(info.syncs, 1);
	T_OK(kvt_seq_query(b, sb, &info));
	T_EQ(info.syncs, 1);

	/* A stale id: its slot closed and reopened. */
	kvt_seq sa2;
	T_OK(kvt_seq_close(a, sa));
	T_OK(kvt_seq_open(a, &sa2));
	T_ASSERT(sa2 != sa);
	it = one(sa, 1);
	T_ERR(kvt_sync(a, &it, 1), KVT_ENOSEQ);
	T_ERR(kvt_list_get(a, sa, 0, 0, &v), KVT_ENOSEQ);
	T_ERR(kvt_seq_close(a, sa), KVT_ENOSEQ);
	T_EQ(seq_len(a, sa2), 0);
	it = one(sa2, 2);
	T_OK(kvt_sync(a, &it, 1));
	T_EQ(seq_len(a, sa2), 2);
	T_EQ(seq_len(b, sb), 1);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	kvt_disconnect(a);
	kvt_disconnect(b);
	T_EQ(th_daemon_stop(&d), 0);
}

/* ------------------------------------------------------ smaller ones (8) */

/*
 * kvt_last_error is about the last call only: a client-side refusal sets
 * its own reason (not an older daemon text), a success clears it.
 */
TEST(seq_contract, last_error_follows_the_last_call)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	kvt_seq seq;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = quick_cfg(&d, "errs");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	T_EQ_STR(kvt_last_error(c), "");
	struct kvt_sync_item it = one(seq, 9); /* headroom 4: the daemon */
	T_ERR(kvt_sync(c, &it, 1), KVT_EHEADROOM);
	T_ASSERT(strstr(kvt_last_error(c), "headroom"));
	it = one(seq + 1, 1); /* no such sequence: libkvtrim itself */
	T_ERR(kvt_sync(c, &it, 1), KVT_ENOSEQ);
	T_ASSERT(strstr(kvt_last_error(c), "no open sequence"));
	T_ASSERT(!strstr(kvt_last_error(c), "headroom"));
	it = one(seq, 1);
	it.phase = 7;
	T_ERR(kvt_sync(c, &it, 1), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "phase"));
	T_ERR(kvt_wait(c, 12345), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "ticket"));
	T_ERR(kvt_memcpy(c, NULL, &it, 4), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "NULL"));
	it = one(seq, 1);
	T_OK(kvt_sync(c, &it, 1));
	T_EQ_STR(kvt_last_error(c), "");
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * One sync per sequence in flight: a second sync (async or blocking) of a
 * sequence whose async sync is pending, and its close, are EBUSY with a
 * reason that says so; another sequence is not held up; after kvt_wait
 * all of them work.
 */
TEST(seq_contract, one_sync_per_sequence_in_flight_is_ebusy_with_a_reason)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	kvt_seq seq, other;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "busy", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	T_OK(kvt_seq_open(c, &other));
	kvt_ticket t1, t2;
	struct kvt_sync_item it = one(seq, 1);
	T_OK(kvt_sync_async(c, &it, 1, &t1));
	T_ERR(kvt_sync_async(c, &it, 1, &t2), KVT_EBUSY);
	T_ASSERT(strstr(kvt_last_error(c), "one sync per sequence"));
	T_ERR(kvt_sync(c, &it, 1), KVT_EBUSY);
	T_ASSERT(strstr(kvt_last_error(c), "kvt_wait"));
	T_ERR(kvt_seq_close(c, seq), KVT_EBUSY);
	T_ASSERT(strstr(kvt_last_error(c), "in flight"));
	struct kvt_sync_item o = one(other, 2);
	T_OK(kvt_sync(c, &o, 1));
	T_OK(kvt_wait(c, t1));
	T_OK(kvt_sync(c, &it, 1));
	T_EQ(seq_len(c, seq), 2);
	T_EQ(seq_len(c, other), 2);
	T_OK(kvt_seq_close(c, seq));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * A sync of zero items is a no-op: 0 from kvt_sync (items may be NULL),
 * KVT_TICKET_NONE from kvt_sync_async, which kvt_wait answers with 0;
 * nothing reaches the daemon (its sync count stays).
 */
TEST(seq_contract, sync_of_zero_items_is_a_no_op)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	kvt_seq seq;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "empty", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = one(seq, 1);
	T_OK(kvt_sync(c, &it, 1));
	struct kvt_tenant_stats st;
	T_OK(kvt_stats(c, &st));
	T_EQ_U64(st.syncs, 1);
	T_EQ(kvt_sync(c, NULL, 0), 0);
	T_EQ(kvt_sync(c, &it, 0), 0);
	kvt_ticket tk = 99;
	T_EQ(kvt_sync_async(c, NULL, 0, &tk), 0);
	T_EQ(tk, KVT_TICKET_NONE);
	T_EQ(kvt_wait(c, tk), 0);
	T_EQ(kvt_wait(c, KVT_TICKET_NONE), 0);
	T_OK(kvt_stats(c, &st));
	T_EQ_U64(st.syncs, 1);
	T_EQ(seq_len(c, seq), 1);
	/* NULL items with items to sync stays an error. */
	T_ERR(kvt_sync(c, NULL, 1), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "NULL"));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* The types of the two readers, checked at run time so a wrong one fails
 * this test rather than the build. */
#define TAKES_CONST_(fn, type) _Generic(&(fn), type: 1, default: 0)

/*
 * The table view and the list record read like kvt_list_get: through a
 * const client.
 */
TEST(seq_contract, table_view_and_list_record_take_a_const_client)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	kvt_client *c;
	kvt_seq seq;
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "constant", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = one(seq, 3);
	T_OK(kvt_sync(c, &it, 1));
	T_ASSERT(TAKES_CONST_(kvt_table_view,
	                      int (*)(const kvt_client *,
	                              struct kvt_table_view *)));
	T_ASSERT(TAKES_CONST_(kvt_list_record,
	                      int (*)(const kvt_client *, kvt_seq, uint32_t,
	                              uint32_t,
	                              const struct kvt_list_record **,
	                              uint32_t *)));
	const kvt_client *cc = c;
	struct kvt_table_view v;
	const struct kvt_list_record *r;
	uint32_t slot = 99;
	T_OK(kvt_table_view(cc, &v));
	T_OK(kvt_list_record(cc, seq, 1, 1, &r, &slot));
	T_EQ(slot, 0);
	if (kvt_memory_kind(cc) == KVT_MEMORY_HOST)
		T_EQ(r->len, 3);
	struct kvt_list l;
	T_OK(kvt_list_get(cc, seq, 1, 1, &l));
	T_EQ(l.len, 3);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* A drained tenant's KVT_ESHUTDOWN reads right in kvt_strerror too (an
 * engine that prints only the code's text must not be told the daemon is
 * going away). */
TEST(seq_contract, eshutdown_text_covers_a_drained_tenant)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c;
	kvt_seq seq;
	T_ASSERT(strstr(kvt_strerror(KVT_ESHUTDOWN), "drained"));
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "drained", "full");
	T_OK(kvt_connect(&cfg, &c, err));
	T_EQ(th_sh(&d, out, sizeof(out), "%s drain drained",
	           th_bin("kvtrimctl")), 0);
	T_ERR(kvt_seq_open(c, &seq), KVT_ESHUTDOWN);
	T_ASSERT(strstr(kvt_last_error(c), "draining"));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/* kvtrimctl stats NAME with two tenants of that name refuses, naming both
 * ids (either could be meant); by id each answers. */
TEST(seq_contract, ctl_stats_of_a_shared_name_refuses_with_the_ids)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[8192], want[64];
	kvt_client *a, *b;
	const char *ctl = th_bin("kvtrimctl");
	th_daemon_start(&d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(&d, "twin", "full");
	T_OK(kvt_connect(&cfg, &a, err));
	T_OK(kvt_connect(&cfg, &b, err));
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats twin", ctl), 2);
	T_ASSERT(strstr(out, "2 tenants are named twin (ids 1, 2)"));
	T_ASSERT(!strstr(out, "pages_used"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats 2", ctl), 0);
	snprintf(want, sizeof(want), "name");
	T_ASSERT(strstr(out, want) && strstr(out, "twin"));
	kvt_disconnect(b);
	T_EQ(th_sh(&d, out, sizeof(out), "%s stats twin", ctl), 0);
	kvt_disconnect(a);
	T_EQ(th_daemon_stop(&d), 0);
}

/* The connect reply says which staged inputs the policy reads. */
TEST(seq_contract, policy_inputs_come_with_the_connect_reply)
{
	static const struct {
		const char *spec;
		uint32_t want;
	} cases[] = {
		{"full", 0},
		{"streaming:tokens=8", 0},
		{"h2o:tokens=16", KVT_INPUT_Q | KVT_INPUT_LSE | KVT_INPUT_KV},
		{"snapkv:window=8,tokens=16", KVT_INPUT_Q | KVT_INPUT_LSE | KVT_INPUT_KV},
	};
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX];
	th_daemon_start(&d, "32M", NULL);
	T_EQ(kvt_policy_inputs(NULL), 0);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		kvt_client *c;
		struct kvt_config cfg = th_small_cfg(&d, "inputs",
		                                     cases[i].spec);
		cfg.stage_tokens = 64;
		int rc = kvt_connect(&cfg, &c, err);
		if (rc < 0)
			th_fail(__FILE__, __LINE__, "%s: %s", cases[i].spec, err);
		T_EQ(kvt_policy_inputs(c), cases[i].want);
		kvt_disconnect(c);
	}
	T_EQ(th_daemon_stop(&d), 0);
}
