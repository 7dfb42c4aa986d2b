/*
 * run.c — the worker threads of kvtrim-eval: each job's cases run through
 * its tenant of kvtrimd (the reference engine) or, for kvzip and the
 * hindsight oracle, through the in-process replay (replay.h); every decode
 * prediction is scored against the full-cache reference.
 */
#include "bytes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernels.h"
#include "model.h"
#include "../common/pool.h"
#include "../common/replay.h"

/* Adds the comparison of one prediction to job j. */
static void score_step(const struct model *M, struct job *j,
                       const struct ecase *c, uint32_t t, const float *lg)
{
	uint32_t V = M->cfg.vocab_size;
	const float *rf = c->ref + (size_t)(t - c->P) * V;
	int32_t y = c->tok[t + 1];
	if (c->kind != C_MAIN) {
		if (t + 1 < c->c0)
			return;
		uint32_t am = 0;
		for (uint32_t v = 1; v < V; v++)
			if (lg[v] > lg[am])
				am = v;
		if (c->kind == C_COPY) {
			j->copy_ok += (int32_t)am == y;
			j->copy_n++;
		} else {
			j->nd_ok[c->di] += (int32_t)am == y;
			j->nd_n[c->di]++;
			j->case_ok += (int32_t)am == y;
		}
		return;
	}
	double kl, dnll;
	int top1;
	score_compare(rf, lg, V, y, &kl, &top1, &dnll);
	j->kl += kl;
	j->top1 += top1;
	j->dnll += dnll;
	j->npos++;
}

static void add_ach(const struct model *M, struct job *j, const struct ecase *c,
                    uint64_t kept, uint32_t n_seen)
{
	if (c->kind != C_MAIN)
		return;
	const struct model_config *mc = &M->cfg;
	j->ach += 1.0 - (double)kept / ((double)n_seen * mc->n_layers *
	                                mc->n_kv_heads);
	j->nach++;
}

static uint64_t engine_kept(const struct model *M, struct engine *e)
{
	const struct model_config *mc = &M->cfg;
	uint64_t s = 0;
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			struct kvt_list li;
			if (kvt_list_get(engine_client(e), engine_seq(e), l, g,
			                 &li) == 0)
				s += li.len;
		}
	return s;
}

static int run_daemon_case(const struct model *M, struct job *j,
                           const struct ecase *c, float *lg)
{
	struct engine *e = j->e[c->kind] ? j->e[c->kind] : j->e[C_MAIN];
	int rc = engine_reset(e);
	if (!rc)
		rc = engine_feed(e, c->tok, c->P, KVT_PHASE_PREFILL, NULL);
	for (uint32_t t = c->P; !rc && t + 1 < c->T; t++) {
		rc = engine_step(e, c->tok + t, 1, KVT_PHASE_DECODE, lg);
		if (rc)
			break;
		score_step(M, j, c, t, lg);
		add_ach(M, j, c, engine_kept(M, e), t + 1);
	}
	if (rc)
		snprintf(j->err, sizeof(j->err), "%s", engine_error(e));
	return rc;
}

/* One top-k over every layer and KV head of the prompt (KVzip pair
 * level), first KVZIP_SINKS positions protected. */
static int evict_kvzip(const struct model *M, struct replay *r,
                       const struct ecase *c, double R)
{
	const struct model_config *mc = &M->cfg;
	uint32_t P = c->P, nl = mc->n_layers * mc->n_kv_heads;
	uint8_t *drop = malloc((size_t)nl * P);
	int rc = drop ? score_kvzip_drop(c->kvzip, nl, P, R, drop) : KVT_ENOMEM;
	for (uint32_t li = 0; !rc && li < nl; li++) {
		uint8_t *al = replay_alive(r, li / mc->n_kv_heads,
		                           li % mc->n_kv_heads);
		for (uint32_t i = 0; i < P; i++)
			if (drop[(size_t)li * P + i])
				al[i] = 0;
	}
	free(drop);
	return rc;
}

/* The oracle after a sync of n = replay_pos(r) tokens: the attention the
 * entries still receive from the queries t in [n, T - 2] (suffix sums,
 * suf[l][h][n][i]). */
static int evict_oracle(const struct model *M, struct replay *r,
                        const struct ecase *c, const float *suf, double R)
{
	const size_t T = c->T, H = M->cfg.n_heads;
	uint32_t n = replay_pos(r);
	return score_oracle_evict(M, r, R, 0, n < T ? suf + (size_t)n * T : NULL,
	                        H * T * T, T * T);
}

static int run_replay_case(const struct model *M, struct job *j,
                           struct replay *r, const struct ecase *c, float *lg)
{
	int rc = 0;
	float *suf = NULL;
	struct model_dense dn;
	if (j->kind == J_ORACLE) {
		/* suffix sums of the full run's attention maps over the
		 * scored queries: suf[l][h][n][i] = sum_{t = n}^{T - 2}
		 * a^h_{t,i} (the maps buffer is reused in place) */
		const struct model_config *mc = &M->cfg;
		uint32_t T = c->T;
		if (model_dense_init(&dn, M, T, 1) ||
		    model_dense_step(&dn, c->tok, T, NULL))
			eval_die("hindsight pass failed");
		suf = dn.maps;
		for (size_t lh = 0; lh < (size_t)mc->n_layers * mc->n_heads;
		     lh++) {
			float *mp = suf + lh * T * T;
			for (uint32_t i = 0; i < T; i++)
				mp[(size_t)(T - 1) * T + i] = 0;
			for (uint32_t t = T - 1; t-- > 0;)
				for (uint32_t i = 0; i < T; i++)
					mp[(size_t)t * T + i] +=
						mp[(size_t)(t + 1) * T + i];
		}
	}
	replay_reset(r);
	for (uint32_t i = 0; i < c->P && !rc; i += CHUNK) {
		uint32_t k = c->P - i < CHUNK ? c->P - i : CHUNK;
		rc = replay_step(r, c->tok + i, k, NULL);
		if (!rc && j->kind == J_ORACLE)
			rc = evict_oracle(M, r, c, suf, j->ratio);
	}
	if (!rc && j->kind == J_KVZIP)
		rc = evict_kvzip(M, r, c, j->ratio);
	for (uint32_t t = c->P; !rc && t + 1 < c->T; t++) {
		rc = replay_step(r, c->tok + t, 1, lg);
		if (!rc && j->kind == J_ORACLE)
			rc = evict_oracle(M, r, c, suf, j->ratio);
		if (rc)
			break;
		score_step(M, j, c, t, lg);
		add_ach(M, j, c, replay_kept(r), t + 1);
	}
	if (rc)
		snprintf(j->err, sizeof(j->err), "replay: %s", kvt_strerror(rc));
	if (suf)
		model_dense_free(&dn);
	return rc;
}

/* What the workers share: the cases every job runs. */
struct run_ctx {
	const struct model *M;
	const struct ecase *cases;
	uint32_t ncases;
	struct job *jobs;
};

/* A worker's scratch: one prediction's logits, the replay of the
 * in-process jobs. */
struct run_scratch {
	float *lg;        /* [V] */
	struct replay *r;
};

static void *run_open(struct pool *p)
{
	const struct run_ctx *x = p->ctx;
	uint32_t maxT = 0;
	for (uint32_t i = 0; i < x->ncases; i++)
		maxT = x->cases[i].T > maxT ? x->cases[i].T : maxT;
	struct run_scratch *s = calloc(1, sizeof(*s));
	if (!s || !(s->lg = malloc(sizeof(float) * x->M->cfg.vocab_size)) ||
	    replay_open(x->M, maxT, &s->r))
		eval_die("out of memory");
	return s;
}

static void run_close(struct pool *p, void *scratch)
{
	struct run_scratch *s = scratch;
	replay_close(s->r);
	free(s->lg);
	free(s);
}

/* Job k: every case, until one fails; a line on stderr at its end. */
static void run_job(struct pool *p, void *scratch, uint64_t k)
{
	const struct run_ctx *x = p->ctx;
	struct run_scratch *s = scratch;
	struct job *j = &x->jobs[k];
	for (uint32_t i = 0; i < x->ncases && !j->failed; i++) {
		const struct ecase *c = &x->cases[i];
		j->case_ok = 0;
		int rc = j->kind == J_DAEMON
		                 ? run_daemon_case(x->M, j, c, s->lg)
		                 : run_replay_case(x->M, j, s->r, c, s->lg);
		if (rc)
			j->failed = 1;
		else if (c->kind == C_NEEDLE) {
			j->nd_cases[c->di]++;
			j->nd_exact[c->di] += j->case_ok == NEEDLE_DIGITS;
		}
	}
	if (j->sweep)
		fprintf(stderr, "  %-13s tau %.2f done%s%s\n", j->name, j->tau,
		        j->failed ? ": FAILED: " : "", j->failed ? j->err : "");
	else
		fprintf(stderr, "  %-13s %.3f done%s%s\n", j->name, j->ratio,
		        j->failed ? ": FAILED: " : "", j->failed ? j->err : "");
}

void run_jobs(const struct model *M, const struct ecase *cases,
              uint32_t ncases, struct job *jobs, uint32_t njobs, int threads)
{
	struct run_ctx x = {.M = M, .cases = cases, .ncases = ncases,
	                    .jobs = jobs};
	struct pool p = {.threads = threads, .njobs = njobs, .ctx = &x,
	                 .open = run_open, .close = run_close, .run = run_job};
	pool_run(&p);
}
