/*
 * test_engine_batch.c — the engine's batched decode step (engine.h,
 * engine_step_batch) against the real kvtrimd: B sequences of one tenant,
 * prefilled to different lengths, then decode steps of one token per
 * sequence through one forward and one sync of B items, against B
 * single-sequence engines fed the same tokens.  The batched matmuls run
 * with M = B rows, and OpenBLAS picks kernels by size (model_matmul), so
 * logits must agree to BATCH_TOL absolute (the test prints the
 * differences).  A tiny random model runs everywhere, with `full` and with
 * streaming (each sequence crosses its budget at its own step);
 * SmolLM2-135M-Instruct runs when `make models` cached it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "engine.h"
#include "gb.h"
#include "kvtrim.h"
#include "model.h"
#include "model_files.h"
#include "test.h"

#define BATCH_TOL 1e-4
#define B 4
#define STEPS 6

static double max_diff(const float *a, const float *b, size_t n)
{
	double w = 0;
	for (size_t i = 0; i < n; i++)
		w = fmax(w, fabs((double)a[i] - b[i]));
	return w;
}

static void open_engine(const struct th_daemon *d, const struct model *m,
                        const char *policy, const char *tenant,
                        uint32_t batch, struct engine **e)
{
	char err[1024];
	struct engine_opts o;
	memset(&o, 0, sizeof(o));
	o.runtime_dir = d->dir;
	o.tenant = tenant;
	o.policy = policy;
	o.chunk = 16;
	o.context = 128;
	o.batch = batch;
	if (engine_open(m, &o, e, err, sizeof(err)))
		th_fail(__FILE__, __LINE__, "engine_open: %s", err);
}

/* Token i of sequence s: any id of the vocabulary, different per s. */
static int32_t tok_of(const struct model *m, uint32_t s, uint32_t i)
{
	return (int32_t)((s * 7919u + i * 104729u + 13u) %
	                 m->cfg.vocab_size);
}

/*
 * Prefills sequence s of the batch engine and single engine s to len[s],
 * then STEPS batched steps against STEPS single decode steps.  Returns
 * the largest logit difference; fails past BATCH_TOL.
 */
static double batch_vs_single(const struct model *m, const char *policy,
                              const uint32_t *len, uint32_t nb)
{
	struct th_daemon d;
	th_daemon_start(&d, "256M", NULL);
	size_t V = m->cfg.vocab_size;
	struct engine *be, *se[B];
	char name[32];
	open_engine(&d, m, policy, "batch", nb, &be);
	T_EQ(engine_batch(be), nb);
	int32_t tok[64];
	for (uint32_t s = 0; s < nb; s++) {
		snprintf(name, sizeof(name), "single%u", s);
		open_engine(&d, m, policy, name, 1, &se[s]);
		T_ASSERT(len[s] <= 64);
		for (uint32_t i = 0; i < len[s]; i++)
			tok[i] = tok_of(m, s, i);
		T_OK(engine_feed_seq(be, s, tok, len[s], KVT_PHASE_PREFILL,
		                     NULL));
		T_OK(engine_feed(se[s], tok, len[s], KVT_PHASE_PREFILL, NULL));
		T_EQ(engine_pos_of(be, s), len[s]);
	}
	float *got = malloc(sizeof(float) * nb * V);
	float *want = malloc(sizeof(float) * nb * V);
	T_ASSERT(got && want);
	double worst = 0;
	for (uint32_t k = 0; k < STEPS; k++) {
		int32_t bt[B];
		for (uint32_t s = 0; s < nb; s++) {
			bt[s] = tok_of(m, s, len[s] + k);
			if (engine_step(se[s], &bt[s], 1, KVT_PHASE_DECODE,
			                want + s * V))
				th_fail(__FILE__, __LINE__, "engine_step: %s",
				        engine_error(se[s]));
		}
		if (engine_step_batch(be, bt, KVT_PHASE_DECODE, got))
			th_fail(__FILE__, __LINE__, "engine_step_batch: %s",
			        engine_error(be));
		for (uint32_t s = 0; s < nb; s++) {
			double w = max_diff(got + s * V, want + s * V, V);
			if (!(w <= BATCH_TOL))
				th_fail(__FILE__, __LINE__, "%s: step %u sequence "
				        "%u: max |logit diff| %g > %g", policy, k,
				        s, w, BATCH_TOL);
			worst = fmax(worst, w);
		}
	}
	/* each sequence's lists hold what its single twin's hold */
	for (uint32_t s = 0; s < nb; s++) {
		T_EQ(engine_pos_of(be, s), len[s] + STEPS);
		for (uint32_t l = 0; l < m->cfg.n_layers; l++)
			for (uint32_t g = 0; g < m->cfg.n_kv_heads; g++) {
				struct kvt_list a, b;
				T_OK(kvt_list_get(engine_client(be),
				                  engine_seq_of(be, s), l, g, &a));
				T_OK(kvt_list_get(engine_client(se[s]),
				                  engine_seq(se[s]), l, g, &b));
				T_EQ(a.len, b.len);
			}
	}
	/* one sync per batched step, not one per sequence */
	struct kvt_tenant_stats st;
	T_OK(kvt_stats(engine_client(be), &st));
	uint64_t prefill_syncs = 0;
	for (uint32_t s = 0; s < nb; s++)
		prefill_syncs += (len[s] + 15) / 16;
	T_EQ_U64(st.syncs, prefill_syncs + STEPS);
	/* a sequence outside the batch is refused and changes nothing */
	T_EQ(engine_step_seq(be, nb, tok, 1, KVT_PHASE_DECODE, NULL),
	     KVT_EINVAL);
	T_EQ(engine_pos_of(be, 0), len[0] + STEPS);
	engine_close(be);
	for (uint32_t s = 0; s < nb; s++)
		engine_close(se[s]);
	T_EQ(th_daemon_stop(&d), 0);
	free(got);
	free(want);
	return worst;
}

static void tiny_model(struct model *m)
{
	char err[512];
	struct model_config c = {
		.dim = 64, .hidden_dim = 128, .n_layers = 3, .n_heads = 4,
		.n_kv_heads = 2, .vocab_size = 300, .seq_len = 256,
		.shared_classifier = 1,
	};
	T_OK(model_alloc(m, &c, err, sizeof(err)));
	gb_llama_fill(m, 11);
}

TEST_T(engine_batch, tiny_full_matches_single_engines, 60)
{
	struct model m;
	tiny_model(&m);
	const uint32_t len[B] = {1, 9, 33, 50};
	double w = batch_vs_single(&m, "full", len, B);
	fprintf(stderr, "    tiny, full: max |logit diff| batch vs single "
	        "%.3g\n", w);
	model_free(&m);
}

TEST_T(engine_batch, tiny_streaming_evicts_per_sequence, 60)
{
	struct model m;
	tiny_model(&m);
	/* budget 24: sequence 0 crosses it while decoding, 1 and 2 in
	 * prefill, 3 never */
	const uint32_t len[B] = {20, 40, 64, 5};
	double w = batch_vs_single(&m, "streaming:sinks=2,tokens=24", len, B);
	fprintf(stderr, "    tiny, streaming: max |logit diff| batch vs "
	        "single %.3g\n", w);
	model_free(&m);
}

TEST_T(engine_batch, smollm2_matches_single_engines, 300)
{
	char path[1024], err[1024];
	if (model_files_resolve("smollm2", path, sizeof(path), err,
	                        sizeof(err)))
		T_SKIP(err);
	struct model m;
	if (model_load(path, &m, err, sizeof(err)))
		th_fail(__FILE__, __LINE__, "model_load: %s", err);
	const uint32_t len[3] = {3, 17, 40};
	double w = batch_vs_single(&m, "full", len, 3);
	fprintf(stderr, "    smollm2, full: max |logit diff| batch vs single "
	        "%.3g\n", w);
	model_free(&m);
}
