/*
 * test_smollm2_logits.c — SmolLM2-135M-Instruct's logits from the engine
 * against an independent implementation: HF transformers on the same Q4_1
 * GGUF in float32, fed the same 273 token ids (the committed fixture
 * tests/fixtures/smollm2/logits.txt, written by
 * scripts/fixtures/smollm2_logits.py: per position the argmax, lse, mean,
 * RMS and 20 (id, logit) pairs).  Different summation orders over 30
 * layers make equality a tolerance: |logit - ref|, |lse - ref|, |mean|
 * and |rms| within 2e-3 (an error of RoPE layout, a tensor or the
 * classifier moves logits by whole units), argmax equal wherever the
 * reference's top two differ by more than 1e-2.  Two engines: the dense
 * in-process cache and the engine with its cache in kvtrimd (policy full,
 * prefill chunks of 64, then one token at a time).  Skipped, with the
 * reason, when the model is not in the cache (`make models`).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "engine.h"
#include "model.h"
#include "model_files.h"
#include "test.h"

#define FIXTURE "tests/fixtures/smollm2/logits.txt"
#define TOL 2e-3
#define MAX_PICK 32

struct ref_pos {
	int32_t argmax;
	double lse, mean, rms;
	int n;
	int32_t id[MAX_PICK];
	double logit[MAX_PICK];
};

struct ref {
	uint32_t n;       /* tokens */
	int32_t *ids;     /* [n] */
	struct ref_pos *p; /* [n] */
};

/* Reads the fixture; fails the test on anything malformed. */
static void ref_load(struct ref *r)
{
	FILE *f = fopen(FIXTURE, "r");
	T_ASSERT(f != NULL);
	memset(r, 0, sizeof(*r));
	char tag[8];
	int c;
	uint32_t seen = 0;
	while (fscanf(f, " %7s", tag) == 1) {
		if (tag[0] == '#') {
			while ((c = fgetc(f)) != EOF && c != '\n')
				;
		} else if (!strcmp(tag, "ids")) {
			T_ASSERT(fscanf(f, "%u", &r->n) == 1 && r->n > 0 &&
			         r->n < 100000 && !r->ids);
			r->ids = calloc(r->n, sizeof(int32_t));
			r->p = calloc(r->n, sizeof(*r->p));
			T_ASSERT(r->ids && r->p);
			for (uint32_t i = 0; i < r->n; i++)
				T_ASSERT(fscanf(f, "%d", &r->ids[i]) == 1);
		} else if (!strcmp(tag, "pos")) {
			uint32_t p;
			T_ASSERT(r->ids && fscanf(f, "%u", &p) == 1 && p == seen &&
			         p < r->n);
			struct ref_pos *q = &r->p[p];
			T_ASSERT(fscanf(f, "%d %lf %lf %lf %d", &q->argmax, &q->lse,
			                &q->mean, &q->rms, &q->n) == 5 &&
			         q->n > 0 && q->n <= MAX_PICK);
			for (int k = 0; k < q->n; k++)
				T_ASSERT(fscanf(f, "%d %lf", &q->id[k],
				                &q->logit[k]) == 2);
			seen++;
		} else {
			T_ASSERT(!"unknown fixture record");
		}
	}
	fclose(f);
	T_ASSERT(r->n && seen == r->n);
}

static void ref_free(struct ref *r)
{
	free(r->ids);
	free(r->p);
}

/* Loads SmolLM2 from the cache, or skips the test with the reason. */
static void smollm2_load(struct model *m)
{
	char path[4200], err[KVT_ERRTEXT_MAX + 64];
	if (model_files_find(MODEL_FILES_SMOLLM2, path, sizeof(path), err,
	                     sizeof(err)) < 0)
		T_SKIP(err);
	if (model_load(path, m, err, sizeof(err)) < 0)
		th_fail(__FILE__, __LINE__, "model_load: %s", err);
	T_EQ(m->cfg.vocab_size, 49152);
}

/* The largest deviations of logits [n][V] from the fixture. */
struct dev {
	double logit, lse, mean, rms;
	uint32_t argmax_miss, argmax_checked;
};

static void compare(const struct ref *r, const float *logits, uint32_t V,
                    struct dev *d)
{
	memset(d, 0, sizeof(*d));
	for (uint32_t p = 0; p < r->n; p++) {
		const float *row = logits + (size_t)p * V;
		const struct ref_pos *q = &r->p[p];
		double mx = -INFINITY, s = 0, s2 = 0;
		uint32_t am = 0;
		for (uint32_t v = 0; v < V; v++) {
			if (row[v] > mx) {
				mx = row[v];
				am = v;
			}
			s += row[v];
			s2 += (double)row[v] * row[v];
		}
		double se = 0;
		for (uint32_t v = 0; v < V; v++)
			se += exp((double)row[v] - mx);
		double lse = mx + log(se);
		d->lse = fmax(d->lse, fabs(lse - q->lse));
		d->mean = fmax(d->mean, fabs(s / V - q->mean));
		d->rms = fmax(d->rms, fabs(sqrt(s2 / V) - q->rms));
		for (int k = 0; k < q->n; k++)
			d->logit = fmax(d->logit, fabs(row[q->id[k]] - q->logit[k]));
		/* the fixture's top 12 come first, best first */
		if (q->n >= 2 && q->logit[0] - q->logit[1] > 1e-2) {
			d->argmax_checked++;
			d->argmax_miss += am != (uint32_t)q->argmax;
		}
	}
	fprintf(stderr, "  max |logit - ref| %.2e, |lse - ref| %.2e, mean %.2e, "
	        "rms %.2e; argmax equal at %u of %u positions without a near "
	        "tie\n", d->logit, d->lse, d->mean, d->rms,
	        d->argmax_checked - d->argmax_miss, d->argmax_checked);
}

static void assert_close(const struct dev *d)
{
	T_ASSERT(d->logit <= TOL);
	T_ASSERT(d->lse <= TOL);
	T_ASSERT(d->mean <= TOL);
	T_ASSERT(d->rms <= TOL);
	T_ASSERT(d->argmax_checked > 200);
	T_EQ(d->argmax_miss, 0);
}

TEST_T(smollm2_logits, dense_engine_matches_transformers, 300)
{
	struct model m;
	smollm2_load(&m);
	struct ref r;
	ref_load(&r);
	uint32_t V = m.cfg.vocab_size;
	float *logits = malloc(sizeof(float) * r.n * V);
	T_ASSERT(logits != NULL);
	T_OK(model_dense_forward(&m, r.ids, r.n, logits));
	struct dev d;
	compare(&r, logits, V, &d);
	assert_close(&d);
	free(logits);
	ref_free(&r);
	model_free(&m);
}

TEST_T(smollm2_logits, engine_through_kvtrimd_matches_transformers, 600)
{
	struct model m;
	smollm2_load(&m);
	struct ref r;
	ref_load(&r);
	struct th_daemon dm;
	th_daemon_start(&dm, "512M", NULL);
	struct engine_opts o;
	memset(&o, 0, sizeof(o));
	o.runtime_dir = dm.dir;
	o.policy = "full";
	o.context = 512;
	o.chunk = 64;
	o.quota_bytes = 256ull << 20;
	char err[512];
	struct engine *e;
	if (engine_open(&m, &o, &e, err, sizeof(err)) < 0)
		th_fail(__FILE__, __LINE__, "engine_open: %s", err);
	uint32_t V = m.cfg.vocab_size, P = 128;
	float *logits = malloc(sizeof(float) * r.n * V);
	T_ASSERT(logits != NULL);
	/* 128 prompt tokens in chunks of 64, then one token per step */
	if (engine_feed(e, r.ids, P, KVT_PHASE_PREFILL, logits) < 0 ||
	    engine_feed(e, r.ids + P, r.n - P, KVT_PHASE_DECODE,
	                logits + (size_t)P * V) < 0)
		th_fail(__FILE__, __LINE__, "engine: %s", engine_error(e));
	struct dev d;
	compare(&r, logits, V, &d);
	assert_close(&d);
	engine_close(e);
	T_EQ(th_daemon_stop(&dm), 0);
	free(logits);
	ref_free(&r);
	model_free(&m);
}
