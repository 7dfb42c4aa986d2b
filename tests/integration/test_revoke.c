/*
 * test_revoke.c — one operation that empties hundreds of pool chunks at
 * once (closing a long sequence, or a policy compressing a batch of long
 * prompts in one sync) through the real kvtrimd.
 *
 * The daemon tells the client about emptied chunks on the handle channel
 * before the reply, and the client reads that channel only after the
 * reply, so what one operation sends must fit the socket's send buffer
 * (about 200 small packets on Linux by default).  With one CHUNK_REVOKE
 * per chunk, emptying 640 chunks overflowed it and the daemon dropped the
 * tenant ("handle channel to the client failed (resource busy)"); revokes
 * now travel as CHUNK_REVOKE_SET packets of up to 512 slots.  Expected
 * values by hand: 256 lists x 1 page of 128 KiB per 64-token sync = 16
 * chunks of 2 MiB per sync, 40 syncs = 640 chunks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

TEST_T(revoke, closing_a_sequence_of_640_chunks_keeps_the_tenant, 120)
{
	const char *share = getenv("KVTRIM_CUDA_SHARE");
	if (!strcmp(th_backend(), "cuda") && share && !strcmp(share, "ipc"))
		T_SKIP("legacy IPC chunks are revoked one packet each (their "
		       "cookies are acknowledged): docs/protocol.md");
	struct th_daemon d;
	const char *extra[] = {"--tenant-memory-max", "2G",
	                       "--expected-tenants", "1", NULL};
	th_daemon_start(&d, "1400M", extra);
	struct kvt_config cfg = th_small_cfg(&d, "wide", "full");
	/* 32 layers x 8 KV heads = 256 lists; pages of 64 f32 entries of
	 * head_dim 256: 2 x 64 x 256 x 4 B = 128 KiB, 16 to a chunk. */
	cfg.geo = (struct kvt_geometry){32, 8, 8, 256, 2048};
	cfg.page_tokens = 64;
	cfg.headroom = 64;
	cfg.max_seqs = 1;
	cfg.max_tokens = 41 * 64;
	cfg.quota_bytes = 1400ull << 20;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	if (kvt_connect(&cfg, &c, err) < 0)
		th_fail(__FILE__, __LINE__, "kvt_connect: %s", err);
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_sync_item it = {.seq = seq, .n_new = 64};
	for (int i = 0; i < 40; i++)
		T_OK(kvt_sync(c, &it, 1));
	struct kvt_tenant_stats st;
	T_OK(kvt_stats(c, &st));
	/* 40 full pages and the headroom page of each list */
	T_EQ_U64(st.pages_used, 41 * 256);
	T_ASSERT(st.chunks >= 640);
	T_OK(kvt_seq_close(c, seq));
	T_OK(kvt_stats(c, &st)); /* still registered */
	T_EQ_U64(st.pages_used, 0);
	T_EQ_U64(st.chunks, 0);
	/* and it can grow again */
	T_OK(kvt_seq_open(c, &seq));
	it.seq = seq;
	T_OK(kvt_sync(c, &it, 1));
	kvt_disconnect(c);
	char out[256];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * The other direction: one request that gains 640 chunks.  A sequence of
 * headroom 40 x 64 tokens opens with 40 pages in each of its 256 lists:
 * 10240 pages of 128 KiB = 640 chunks, all granted before the seq_open
 * reply.  A CHUNK_ADD (or VMM CHUNK_DEV) per chunk overflowed the send
 * buffer and lost the tenant (ECONN); grants now go as CHUNK_ADD_SET /
 * CHUNK_DEV_SET packets of up to 64 fds.  Every chunk is usable: an entry
 * written at the far end of the headroom of the last list commits and
 * reads back.
 */
TEST_T(revoke, opening_a_sequence_of_640_chunks_keeps_the_tenant, 120)
{
	const char *share = getenv("KVTRIM_CUDA_SHARE");
	if (!strcmp(th_backend(), "cuda") && share && !strcmp(share, "ipc"))
		T_SKIP("legacy IPC chunks are granted one packet each (no fd "
		       "to batch): docs/protocol.md");
	struct th_daemon d;
	const char *extra[] = {"--tenant-memory-max", "2G",
	                       "--expected-tenants", "1", NULL};
	th_daemon_start(&d, "1400M", extra);
	struct kvt_config cfg = th_small_cfg(&d, "deep", "full");
	cfg.geo = (struct kvt_geometry){32, 8, 8, 256, 2048};
	cfg.page_tokens = 64;
	cfg.headroom = 40 * 64;
	cfg.max_seqs = 1;
	cfg.max_tokens = 41 * 64;
	cfg.quota_bytes = 1400ull << 20;
	/* The open makes 640 chunks: seconds on the CUDA emulator's VMM. */
	cfg.timeout_ms = 60000;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	if (kvt_connect(&cfg, &c, err) < 0)
		th_fail(__FILE__, __LINE__, "kvt_connect: %s", err);
	kvt_seq seq;
	T_OK(kvt_seq_open(c, &seq));
	struct kvt_tenant_stats st;
	T_OK(kvt_stats(c, &st));
	T_EQ_U64(st.pages_used, 40 * 256);
	T_EQ_U64(st.chunks, 640);
	/* Entry 2559 of list (layer 31, head 7): the last page of the last
	 * list, in the last chunk granted. */
	void *kp, *vp;
	float k[256], v[256], back[256];
	for (int i = 0; i < 256; i++) {
		k[i] = (float)i;
		v[i] = -(float)i;
	}
	T_OK(kvt_kv_ptr(c, seq, 31, 7, 40 * 64 - 1, &kp, &vp));
	T_OK(kvt_memcpy(c, kp, k, sizeof(k)));
	T_OK(kvt_memcpy(c, vp, v, sizeof(v)));
	/* Room for one more entry afterwards (41 pages a list, 656 chunks,
	 * within the quota's 700), not another 2560. */
	T_OK(kvt_seq_headroom(c, seq, 1));
	struct kvt_sync_item it = {.seq = seq, .n_new = 40 * 64};
	T_OK(kvt_sync(c, &it, 1));
	struct kvt_list l;
	T_OK(kvt_list_get(c, seq, 31, 7, &l));
	T_EQ(l.len, 40 * 64);
	const char *page = kvt_page_ptr(c, l.pages[39]);
	T_ASSERT(page);
	T_OK(kvt_memcpy(c, back, page + 63 * sizeof(k), sizeof(back)));
	T_ASSERT(!memcmp(back, k, sizeof(k)));
	T_OK(kvt_seq_close(c, seq));
	T_OK(kvt_stats(c, &st));
	T_EQ_U64(st.chunks, 0);
	kvt_disconnect(c);
	char out[256];
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	T_EQ(th_daemon_stop(&d), 0);
}
