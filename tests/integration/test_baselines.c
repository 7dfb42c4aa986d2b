/*
 * test_baselines.c — the kvpress baselines (knorm, expected_attention,
 * pyramidkv) in a real kvtrimd on real sockets, on whatever backend the
 * suite runs (KVTRIM_BACKEND; the policies run on the daemon's CPU for
 * both, reading the K/V rows back from device pages on a cuda tenant): a
 * tenant registered with each spec stages its inputs, syncs a chunked
 * prefill and a decode token, and evicts what the rule says.
 *
 * Every key row is [c, 0, ..., 0] with c distinct per (layer, head,
 * position), so the entries a list holds are named by reading its keys
 * back (kvt_page_ptr, kvt_memcpy to the host on a cuda tenant).  Expected
 * sets: knorm's simulated here from the norms (naive sort, sync by sync);
 * pyramidkv's budgets by hand; expected_attention's length and sinks by
 * hand (its scores are checked against a naive implementation in
 * policies/policy_baselines_test.c).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

#define P_PROMPT 32 /* prompt, two prefill chunks of 16 */
#define N_POS (P_PROMPT + 2) /* and two decode tokens */
#define HD 8        /* th_small_cfg's head_dim */

/* The key of (layer, head, position): distinct over the N_POS positions
 * of a list (7 is prime to 34), positive, norm = itself. */
static float key_of(uint32_t l, uint32_t h, uint32_t pos)
{
	return (float)(((pos + 5 * l + 3 * h) * 7) % N_POS + 1) * 0.1f;
}

static uint32_t pos_of(uint32_t l, uint32_t h, float k)
{
	for (uint32_t p = 0; p < N_POS; p++)
		if (fabsf(key_of(l, h, p) - k) < 1e-4f)
			return p;
	th_fail(__FILE__, __LINE__, "key %g matches no position", (double)k);
}

static kvt_client *connect_spec(struct th_daemon *d, const char *spec)
{
	struct kvt_config cfg = th_small_cfg(d, "baseline", spec);
	cfg.headroom = 16;
	cfg.stage_tokens = 32;
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = kvt_connect(&cfg, &c, err);
	if (rc < 0)
		th_fail(__FILE__, __LINE__, "%s: %s: %s", spec,
		        kvt_errname(rc), err);
	/* on the cuda backend the pages the policy reads are device memory */
	if (!strcmp(th_backend(), "cuda"))
		T_EQ(kvt_memory_kind(c), KVT_MEMORY_CUDA);
	return c;
}

/* Appends positions [from, from + n) to every list and stages finite x,
 * q, lse for them; then one sync of the given phase. */
static void feed(kvt_client *c, kvt_seq s, uint32_t from, uint32_t n,
                 enum kvt_phase ph)
{
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	for (uint32_t l = 0; l < g->n_layers; l++) {
		for (uint32_t h = 0; h < g->n_kv_heads; h++)
			for (uint32_t t = 0; t < n; t++) {
				void *kp, *vp;
				float k[HD] = {0}, v[HD];
				k[0] = key_of(l, h, from + t);
				for (uint32_t d = 0; d < HD; d++)
					v[d] = 0.1f * (float)((from + t + d) % 5 + 1);
				T_OK(kvt_kv_ptr(c, s, l, h, t, &kp, &vp));
				T_OK(kvt_memcpy(c, kp, k, sizeof(k)));
				T_OK(kvt_memcpy(c, vp, v, sizeof(v)));
			}
		for (uint32_t p = from; p < from + n; p++) {
			float q[1024];
			uint32_t nq = g->n_heads * g->head_dim;
			T_ASSERT(nq <= 1024);
			for (uint32_t i = 0; i < nq; i++)
				q[i] = 0.3f * (float)((p * 3 + i) % 7) - 0.9f;
			th_stage_row(c, s, l, p, q);
		}
	}
	struct kvt_sync_item it = {.seq = s, .n_new = n, .phase = ph};
	int rc = kvt_sync(c, &it, 1);
	if (rc < 0)
		th_fail(__FILE__, __LINE__, "sync at %u: %s: %s", from,
		        kvt_errname(rc), kvt_last_error(c));
}

/* The positions list (l, h) holds, as a bitmap [N_POS]; returns its len. */
static uint32_t held(kvt_client *c, kvt_seq s, uint32_t l, uint32_t h,
                     uint8_t *has)
{
	const struct kvt_config *cf = kvt_config_of(c);
	uint32_t pt = cf->page_tokens;
	size_t rb = HD * sizeof(float);
	struct kvt_list li;
	T_OK(kvt_list_get(c, s, l, h, &li));
	memset(has, 0, N_POS);
	for (uint32_t e = 0; e < li.len; e++) {
		const char *page = kvt_page_ptr(c, li.pages[e / pt]);
		T_ASSERT(page);
		float k[HD];
		T_OK(kvt_memcpy(c, k, page + (e % pt) * rb, rb));
		uint32_t p = pos_of(l, h, k[0]);
		T_ASSERT(!has[p]);
		has[p] = 1;
	}
	return li.len;
}

/* The prompt, then one decode token. */
static kvt_seq run_prompt(kvt_client *c)
{
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	feed(c, s, 0, 16, KVT_PHASE_PREFILL);
	feed(c, s, 16, 16, KVT_PHASE_PREFILL);
	feed(c, s, P_PROMPT, 1, KVT_PHASE_DECODE);
	return s;
}

TEST(baselines_daemon, listed_by_kvtrimctl)
{
	struct th_daemon d;
	char out[8192];
	th_daemon_start(&d, "16M", NULL);
	T_EQ(th_sh(&d, out, sizeof(out), "%s policies", th_bin("kvtrimctl")),
	     0);
	T_ASSERT(strstr(out, "knorm") && strstr(out, "Knorm: minus the L2"));
	T_ASSERT(strstr(out, "expected_attention") &&
	         strstr(out, "Expected Attention:"));
	T_ASSERT(strstr(out, "pyramidkv") && strstr(out, "PyramidKV:"));
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(baselines_daemon, knorm_evicts_the_largest_keys_in_kvtrimd)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	kvt_client *c = connect_spec(&d, "knorm:ratio=0.5,sinks=1");
	T_EQ(kvt_policy_inputs(c), KVT_INPUT_KV);
	kvt_seq s = run_prompt(c);
	/* The rule, sync by sync: keep n - floor(n / 2) of the n seen, the
	 * sink and the smallest keys. */
	static const uint32_t upto[] = {16, 32, 33};
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			uint8_t want[N_POS] = {0}, has[N_POS];
			for (size_t y = 0; y < 3; y++) {
				uint32_t n = upto[y], from = y ? upto[y - 1] : 0;
				for (uint32_t p = from; p < n; p++)
					want[p] = 1;
				uint32_t keep = n - n / 2, k = 0;
				uint8_t next[N_POS] = {0};
				next[0] = want[0];
				k = next[0];
				while (k < keep) {
					int best = -1;
					for (uint32_t p = 1; p < n; p++)
						if (want[p] && !next[p] &&
						    (best < 0 ||
						     key_of(l, h, p) <
						             key_of(l, h, best)))
							best = (int)p;
					next[best] = 1;
					k++;
				}
				memcpy(want, next, sizeof(want));
			}
			T_EQ(held(c, s, l, h, has), 33 - 16);
			T_ASSERT(!memcmp(has, want, N_POS));
		}
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	T_EQ_U64(ts.syncs, 3);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(baselines_daemon, expected_attention_compresses_the_prompt_in_kvtrimd)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	kvt_client *c = connect_spec(&d, "expected_attention:window=8,sinks=2,"
	                                 "ratio=0.5,theta=10000");
	T_EQ(kvt_policy_inputs(c), KVT_INPUT_Q | KVT_INPUT_KV);
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	feed(c, s, 0, 16, KVT_PHASE_PREFILL);
	feed(c, s, 16, 16, KVT_PHASE_PREFILL);
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	uint8_t has[N_POS];
	/* nothing during prefill */
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++)
			T_EQ(held(c, s, l, h, has), P_PROMPT);
	/* the first decode sync: B = 32 - 16 of the prompt, the 2 sinks
	 * among them, and the decode token */
	feed(c, s, P_PROMPT, 1, KVT_PHASE_DECODE);
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			T_EQ(held(c, s, l, h, has), 16 + 1);
			T_ASSERT(has[0] && has[1] && has[P_PROMPT]);
		}
	/* once: the next decode token stays, and so does every other */
	feed(c, s, P_PROMPT + 1, 1, KVT_PHASE_DECODE);
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++)
			T_EQ(held(c, s, l, h, has), 16 + 2);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(baselines_daemon, pyramidkv_budgets_by_layer_in_kvtrimd)
{
	struct th_daemon d;
	th_daemon_start(&d, "16M", NULL);
	kvt_client *c = connect_spec(&d, "pyramidkv:window=4,kernel=1,"
	                                 "ratio=0.5");
	T_EQ(kvt_policy_inputs(c), KVT_INPUT_Q | KVT_INPUT_LSE | KVT_INPUT_KV);
	kvt_seq s = run_prompt(c);
	/*
	 * P 32, window 4, ratio .5, 2 layers: mean 16, min 16/20 = .8, max
	 * 32 - .8 = 31.2 >= 28, so max 28, min 32 - 28 = 4: layer 0 keeps
	 * 28 of the prompt, layer 1 4 (just the window 28..31).
	 */
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	uint8_t has[N_POS];
	for (uint32_t h = 0; h < g->n_kv_heads; h++) {
		T_EQ(held(c, s, 0, h, has), 28 + 1);
		for (uint32_t p = 28; p <= P_PROMPT; p++)
			T_ASSERT(has[p]);
		T_EQ(held(c, s, 1, h, has), 4 + 1);
		for (uint32_t p = 28; p <= P_PROMPT; p++)
			T_ASSERT(has[p]);
	}
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}
