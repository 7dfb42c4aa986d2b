/*
 * test_device.c — syncs of a policy that reads K (h2o) on whatever backend
 * the suite runs (KVTRIM_BACKEND): on cuda the daemon must not wait on its
 * loop for the engine's GPU writes; it parks the sync until the writes
 * are done (device_waits_total) and answers it then.  Under the CPU
 * emulator with KVT_EMU_HOSTFN_DELAY_US set, the "writes done" callback
 * comes late on purpose, so every such sync is parked (on a loaded host
 * the callback may beat the daemon's look at it now and then); on the cpu
 * backend none is.  Expected lengths are h2o's budget by hand.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

TEST(device, key_reading_syncs_park_instead_of_blocking)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c[2];
	th_daemon_start(&d, "64M", NULL);
	/* two engines, so a parked sync of one meets the other's requests */
	for (int i = 0; i < 2; i++) {
		struct kvt_config cfg = th_small_cfg(&d, i ? "h2o-b" : "h2o-a",
		                                     "h2o:tokens=8");
		cfg.headroom = 4;
		cfg.stage_tokens = 64;
		T_OK(kvt_connect(&cfg, &c[i], err));
	}
	kvt_seq s[2];
	for (int i = 0; i < 2; i++)
		T_OK(kvt_seq_open(c[i], &s[i]));

	/* 10 syncs of 4 entries each per engine, interleaved; K/V and the
	 * staged q/lse are whatever the pages hold (zeros): h2o needs only
	 * their presence to run its attention. */
	const struct kvt_config *rc = kvt_config_of(c[0]);
	size_t qn = (size_t)rc->geo.n_heads * rc->geo.head_dim;
	float *zero = calloc(qn, sizeof(float));
	T_ASSERT(zero);
	uint32_t pos = 0;
	for (int step = 0; step < 10; step++) {
		for (int i = 0; i < 2; i++) {
			for (uint32_t k = 0; k < 4; k++)
				for (uint32_t l = 0; l < rc->geo.n_layers; l++) {
					float *q = kvt_stage_q(c[i], s[i], l,
					                       pos + k);
					float *lse = kvt_stage_lse(c[i], s[i], l,
					                           pos + k);
					T_ASSERT(q && lse);
					th_put(c[i], q, zero, qn * sizeof(float));
					th_put(c[i], lse, zero, rc->geo.n_heads *
					                        sizeof(float));
				}
			struct kvt_sync_item it = {.seq = s[i], .n_new = 4,
			                           .phase = KVT_PHASE_DECODE};
			T_OK(kvt_sync(c[i], &it, 1));
		}
		pos += 4;
	}
	free(zero);
	/* h2o keeps its budget of 8 of the 40 entries */
	for (int i = 0; i < 2; i++)
		for (uint32_t l = 0; l < rc->geo.n_layers; l++)
			for (uint32_t h = 0; h < rc->geo.n_kv_heads; h++) {
				struct kvt_list li;
				T_OK(kvt_list_get(c[i], s[i], l, h, &li));
				T_EQ(li.len, 8);
			}

	uint64_t waits = th_stat(&d, "device_waits_total");
	if (!strcmp(th_backend(), "cpu"))
		T_EQ_U64(waits, 0);
	else if (getenv("KVTRIM_CUDA_EMU") && getenv("KVT_EMU_HOSTFN_DELAY_US") &&
	         atol(getenv("KVT_EMU_HOSTFN_DELAY_US")) >= 1000)
		/* every sync parks once, unless the daemon's thread lost the
		 * CPU for the whole delay between queueing the callback and
		 * looking at it (a loaded host: CI beside a build); never
		 * more than once */
		T_ASSERT(waits >= 15 && waits <= 20);
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	for (int i = 0; i < 2; i++)
		kvt_disconnect(c[i]);
	T_EQ(th_daemon_stop(&d), 0);
}
