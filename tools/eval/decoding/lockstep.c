/*
 * lockstep.c — protocol 2's run (decoding_run, contract in decoding.h):
 * groups of jobs decoding their windows in lockstep, one batched forward a
 * step and one sync per tenant, the reference's logits shared step by
 * step, the hindsight oracle's eviction and the scoring.  The groups run
 * on the worker pool; docs/eval.md, "Protocol 2", states the protocol.
 */
#include "decoding.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "now.h"
#include "../common/pool.h"
#include "../common/replay.h"

/* eval_daemon_start's --pool-size; 80 % of it is shared by the groups
 * that run at once */
#define D2_POOL (2048ull << 20)
#define D2_PAGE 16u /* engine_opts.page_tokens 0 */

/* ------------------------------------------------------------ a group */

/* One row of a group's batched forward: window w of job j (NULL: the
 * window's reference). */
struct d2row {
	struct job *j;
	uint32_t w;
	kvt_client *cl;   /* daemon rows */
	kvt_seq seq;
	struct replay *r; /* reference and oracle rows */
};

struct group {
	struct job **jobs;       /* [nj] */
	uint32_t nj;
	int producer;            /* group 0: the references only, stored */
	int oracle;              /* the oracle jobs and references */
	uint64_t bytes;          /* estimated daemon pages */
};

/* What the groups share, under the pool's lock. */
struct groups {
	const struct decoding_set *s;
	struct job *jobs;        /* decoding_run's: right's job index */
	struct pool *pl;         /* the pool running them: its lock */
	struct group *g;
	uint32_t ng;
	/* the producer's: logits of the reference, one row per window and
	 * decode step, as they come; the oracle's totals at its end */
	float *ref;              /* [nwin][T-1-P][V] */
	uint32_t ref_steps;      /* steps stored */
	double *tot;             /* [nwin][L][H][T] */
	int state;               /* 0 running, 1 done, -1 failed */
	pthread_cond_t cond;
};

/* What a running group's forward needs (the attention callback's ctx). */
struct run {
	struct groups *p;
	const struct group *g;
	uint32_t gi, nref;       /* nref: reference rows (0 or nwin) */
	struct d2row *rows;      /* [nrows]: references first (row w), if
	                            the group has them */
	uint32_t nrows, *live, nlive;
	struct engine **e;       /* [nj] daemon jobs' engines */
	uint32_t t;              /* position of the step */
	/* scratch of the steps */
	int32_t *tok;            /* [nrows] */
	uint32_t *pos;           /* [nrows] */
	float *lg;               /* [nrows][V] */
	kvt_ticket *tk;          /* [nj] */
	double *acc;             /* [nwin][L][H][T] the references' taps */
	float *sc;               /* [L][H][T] the oracle's scores */
};

static void fail(struct job *j, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void fail(struct job *j, const char *fmt, ...)
{
	if (j->failed)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(j->err, sizeof(j->err), fmt, ap);
	va_end(ap);
	j->failed = 1;
	fprintf(stderr, "  %-13s %.3f FAILED: %s\n", j->name, j->ratio, j->err);
}

/*
 * A daemon row's token at position pos of layer l: K and V appended at
 * entry len of each list, attention over the lists' first len + 1
 * entries (kvt_attention: the library's CPU kernel on a host tenant's
 * pages), x / q / lse staged (as engine.c's attend_seq for one token).
 * Reason in err.
 */
static int attend_daemon(const struct run *u, const struct d2row *rw,
                         uint32_t l, uint32_t pos, const float *x,
                         const float *q, const float *k, const float *v,
                         float *out, float *lse, char *err, size_t errlen)
{
	const struct model_config *mc = &u->p->s->M->cfg;
	const uint32_t hd = mc->head_dim, H = mc->n_heads;
	const size_t rb = sizeof(float) * hd;
	for (uint32_t h = 0; h < mc->n_kv_heads; h++) {
		void *kp, *vp;
		int rc = kvt_kv_ptr(rw->cl, rw->seq, l, h, 0, &kp, &vp);
		if (rc < 0) {
			snprintf(err, errlen, "kvt_kv_ptr(layer %u, head %u): %s",
			         l, h, kvt_strerror(rc));
			return rc;
		}
		memcpy(kp, k + (size_t)h * hd, rb);
		memcpy(vp, v + (size_t)h * hd, rb);
	}
	int rc = kvt_attention(rw->cl, rw->seq, l, 1, q, out, lse);
	if (rc < 0) {
		snprintf(err, errlen, "kvt_attention(layer %u): %s", l,
		         kvt_last_error(rw->cl));
		return rc;
	}
	float *sx = kvt_stage_x(rw->cl, rw->seq, l, pos),
	      *sq = kvt_stage_q(rw->cl, rw->seq, l, pos),
	      *sl = kvt_stage_lse(rw->cl, rw->seq, l, pos);
	/* kvt_memcpy: the rows are device memory on a cuda tenant */
	if ((sx && (rc = kvt_memcpy(rw->cl, sx, x, sizeof(float) * mc->dim))) ||
	    (sq && (rc = kvt_memcpy(rw->cl, sq, q, sizeof(float) * H * hd))) ||
	    (sl && (rc = kvt_memcpy(rw->cl, sl, lse, sizeof(float) * H)))) {
		snprintf(err, errlen, "staging (layer %u): %s", l,
		         kvt_last_error(rw->cl));
		return rc;
	}
	return 0;
}

/* The model_attn callback of a group's step: live row c is rows[live[c]].
 * A daemon row that fails fails its job (its output is zeroed; the job's
 * rows leave the group at the next step); the other rows go on. */
static int attend(void *ctx, uint32_t l, uint32_t pos0, uint32_t n,
                  const float *x, const float *q, const float *k,
                  const float *v, float *out, float *lse)
{
	struct run *u = ctx;
	const struct model_config *mc = &u->p->s->M->cfg;
	const size_t H = mc->n_heads, hd = mc->head_dim, kv = mc->kv_dim,
	             d = mc->dim;
	(void)pos0;
	for (uint32_t c = 0; c < n; c++) {
		struct d2row *rw = &u->rows[u->live[c]];
		float *o = out + c * H * hd, *ls = lse + c * H;
		int rc;
		if (rw->r) {
			rc = replay_attend_row(rw->r, l, q + c * H * hd, k + c * kv,
			                       v + c * kv, o, ls);
			if (rc)
				return rc; /* the cache is full: a bug */
			continue;
		}
		if (rw->j->failed) {
			memset(o, 0, sizeof(float) * H * hd);
			memset(ls, 0, sizeof(float) * H);
			continue;
		}
		char err[300];
		rc = attend_daemon(u, rw, l, u->t, x + c * d, q + c * H * hd,
		                   k + c * kv, v + c * kv, o, ls, err,
		                   sizeof(err));
		if (rc) {
			fail(rw->j, "window %u, position %u: %s", rw->w, u->t, err);
			memset(o, 0, sizeof(float) * H * hd);
			memset(ls, 0, sizeof(float) * H);
		}
	}
	return 0;
}

/* Daemon entries kept by a row's lists. */
static uint64_t kept_daemon(const struct model *M, const struct d2row *rw)
{
	const struct model_config *mc = &M->cfg;
	uint64_t s = 0;
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t h = 0; h < mc->n_kv_heads; h++) {
			struct kvt_list li;
			if (kvt_list_get(rw->cl, rw->seq, l, h, &li) == 0)
				s += li.len;
		}
	return s;
}

/* Registration and prefill of a daemon job: engine e (one sequence per
 * window), the rows of its windows.  0, or the job failed. */
static int open_daemon(const struct decoding_set *s, struct job *j, uint32_t gi,
                       uint32_t k, struct engine **e, struct d2row *rows)
{
	char err[1024], tn[64];
	struct engine_opts o;
	memset(&o, 0, sizeof(o));
	snprintf(tn, sizeof(tn), "p2-%.24s-g%u-%u", j->name, gi, k);
	o.runtime_dir = s->rt;
	o.tenant = tn;
	o.policy = j->spec[C_MAIN];
	o.context = s->T;
	o.chunk = s->P;
	o.stage_tokens = s->P + CTX_LOOKBACK;
	o.batch = s->nwin;
	if (engine_open(s->M, &o, e, err, sizeof(err))) {
		fail(j, "%s", err);
		return -1;
	}
	kvt_client *cl = engine_client(*e);
	if (kvt_memory_kind(cl) != KVT_MEMORY_HOST) {
		fail(j, "protocol 2 reads the pages in host memory: run "
		     "kvtrimd with --backend cpu");
		return -1;
	}
	for (uint32_t w = 0; w < s->nwin; w++) {
		struct d2row *rw = &rows[w];
		rw->cl = cl;
		rw->seq = engine_seq_of(*e, w);
		/* decode appends one entry per sync: asked before the
		 * prefill sync, in force after it */
		int rc = kvt_seq_headroom(cl, rw->seq, 1);
		if (!rc)
			rc = engine_feed_seq(*e, w, s->tok + (size_t)w * s->T,
			                     s->P, KVT_PHASE_PREFILL, NULL);
		if (rc) {
			fail(j, "prefill of window %u: %s: %s", w,
			     kvt_strerror(rc), engine_error(*e)[0]
			     ? engine_error(*e) : kvt_last_error(cl));
			return -1;
		}
	}
	return 0;
}

/* The oracle rows of window w after a sync of n tokens: scores sc
 * [L][H][T] = totals - prefixes of the reference's attention. */
static int oracle_step(const struct decoding_set *s, const double *tot,
                       const double *pre, float *sc, struct d2row *rows,
                       uint32_t nrows, uint32_t w, uint32_t n)
{
	const struct model_config *mc = &s->M->cfg;
	const size_t T = s->T, LH = (size_t)mc->n_layers * mc->n_heads;
	const double *tw = tot + (size_t)w * LH * T,
	             *pw = pre ? pre + (size_t)w * LH * T : NULL;
	for (size_t lh = 0; lh < LH; lh++)
		for (uint32_t i = 0; i < n; i++)
			sc[lh * T + i] = (float)(tw[lh * T + i] -
			                         (pw ? pw[lh * T + i] : 0));
	for (uint32_t c = 0; c < nrows; c++) {
		struct d2row *rw = &rows[c];
		if (!rw->j || rw->w != w || rw->j->kind != J_ORACLE ||
		    rw->j->failed)
			continue;
		/* its budget: spec "oracle:tokens=B" or "oracle:ratio=F",
		 * else the job's ratio */
		const char *sp = rw->j->spec[C_MAIN],
		           *rs = strstr(sp, "ratio="), *ts = strstr(sp, "tokens=");
		double R = rs ? strtod(rs + 6, NULL) : rw->j->ratio;
		uint32_t B = ts ? (uint32_t)strtoul(ts + 7, NULL, 10) : 0;
		int rc = score_oracle_evict(s->M, rw->r, R, B, sc,
		                          mc->n_heads * T, T);
		if (rc)
			return rc;
	}
	return 0;
}

/* The group's rows, prefilled: its references (when it has them) and
 * its jobs' windows; u's scratch allocated. */
static void group_open(struct run *u)
{
	const struct decoding_set *s = u->p->s;
	const struct model *M = s->M;
	const struct model_config *mc = &M->cfg;
	const struct group *g = u->g;
	const uint32_t nw = s->nwin, P = s->P, T = s->T;
	const size_t LHT = (size_t)mc->n_layers * mc->n_heads * T;
	const int tap = g->oracle || (g->producer && u->p->tot);
	u->rows = calloc(u->nrows, sizeof(*u->rows));
	u->live = malloc(sizeof(uint32_t) * u->nrows);
	u->e = calloc(g->nj + 1, sizeof(*u->e));
	u->tok = malloc(sizeof(int32_t) * u->nrows);
	u->tk = malloc(sizeof(kvt_ticket) * (g->nj + 1));
	u->pos = malloc(sizeof(uint32_t) * u->nrows);
	u->lg = malloc(sizeof(float) * u->nrows * mc->vocab_size);
	u->acc = tap ? calloc(nw * LHT, sizeof(double)) : NULL;
	u->sc = g->oracle ? malloc(sizeof(float) * LHT) : NULL;
	if (!u->rows || !u->live || !u->e || !u->tok || !u->pos || !u->tk ||
	    !u->lg || (tap && !u->acc) || (g->oracle && !u->sc))
		eval_die("out of memory");
	for (uint32_t w = 0; w < u->nref; w++) {
		struct d2row *rw = &u->rows[w];
		rw->w = w;
		if (replay_open(M, T, &rw->r))
			eval_die("out of memory");
		if (replay_step(rw->r, s->tok + (size_t)w * T, P, NULL))
			eval_die("reference prefill of window %u failed", w);
		if (u->acc)
			replay_tap(rw->r, u->acc + (size_t)w * LHT);
	}
	for (uint32_t k = 0; k < g->nj; k++) {
		struct job *j = g->jobs[k];
		struct d2row *rw = &u->rows[u->nref + nw * k];
		for (uint32_t w = 0; w < nw; w++) {
			rw[w].j = j;
			rw[w].w = w;
		}
		if (j->kind == J_DAEMON) {
			open_daemon(s, j, u->gi, k, &u->e[k], rw);
			continue;
		}
		for (uint32_t w = 0; w < nw; w++) {
			if (replay_open(M, T, &rw[w].r))
				eval_die("out of memory");
			if (replay_step(rw[w].r, s->tok + (size_t)w * T, P, NULL))
				eval_die("oracle prefill of window %u failed", w);
		}
	}
}

/* Starts one sync per daemon tenant of the group (all started before any
 * is waited for), tickets in u->tk. */
static void sync_start(struct run *u)
{
	const uint32_t nw = u->p->s->nwin;
	struct kvt_sync_item it[64]; /* nwin <= 64 (decoding_run) */
	for (uint32_t k = 0; k < u->g->nj; k++) {
		struct job *j = u->g->jobs[k];
		if (j->kind != J_DAEMON || j->failed)
			continue;
		for (uint32_t w = 0; w < nw; w++)
			it[w] = (struct kvt_sync_item){engine_seq_of(u->e[k], w),
			                               1, KVT_PHASE_DECODE, 0, 0};
		kvt_client *cl = engine_client(u->e[k]);
		int rc = kvt_sync_async(cl, it, nw, &u->tk[k]);
		if (rc < 0)
			fail(j, "sync at position %u: %s: %s", u->t,
			     kvt_strerror(rc), kvt_last_error(cl));
	}
}

/* Waits for the syncs sync_start started; a sync under memory pressure
 * fails its job. */
static void sync_wait(struct run *u)
{
	for (uint32_t k = 0; k < u->g->nj; k++) {
		struct job *j = u->g->jobs[k];
		if (j->kind != J_DAEMON || j->failed)
			continue;
		kvt_client *cl = engine_client(u->e[k]);
		struct kvt_sync_info si;
		int rc = kvt_wait(cl, u->tk[k]);
		if (rc < 0)
			fail(j, "sync at position %u: %s: %s", u->t,
			     kvt_strerror(rc), kvt_last_error(cl));
		else if (kvt_last_sync(cl, &si) == 0 && si.pressure > 0)
			fail(j, "the daemon applied memory pressure %.3f at "
			     "position %u: not the policy's decisions",
			     si.pressure, u->t);
	}
}

/* The step's predictions of the live job rows against the reference's,
 * once the producer has stored the step's (a job is touched by its group
 * only: no lock for its sums). */
static void score_step(struct run *u)
{
	struct groups *p = u->p;
	const struct decoding_set *s = p->s;
	const uint32_t T = s->T, P = s->P, t = u->t,
	               V = s->M->cfg.vocab_size;
	const size_t C = T - 1 - P;
	pthread_mutex_lock(&p->pl->lock);
	while (!u->g->producer && p->state == 0 && p->ref_steps <= t - P)
		pthread_cond_wait(&p->cond, &p->pl->lock);
	int noref = !u->g->producer && p->ref_steps <= t - P;
	pthread_mutex_unlock(&p->pl->lock);
	for (uint32_t c = 0; c < u->nlive; c++) {
		const struct d2row *rw = &u->rows[u->live[c]];
		if (!rw->j || rw->j->failed)
			continue;
		if (noref) {
			fail(rw->j, "no reference: its group failed");
			continue;
		}
		double kl, dnll;
		int top1;
		score_compare(p->ref + ((size_t)rw->w * C + (t - P)) * V,
		              u->lg + (size_t)c * V, V,
		              s->tok[(size_t)rw->w * T + t + 1], &kl, &top1,
		              &dnll);
		rw->j->kl += kl;
		rw->j->top1 += top1;
		rw->j->dnll += dnll;
		rw->j->npos++;
		/* an answer token's prediction: exact match of the argmax */
		if (s->ans0 && t + 1 >= s->ans0 &&
		    t + 1 - s->ans0 < s->nans[rw->w]) {
			const float *lg = u->lg + (size_t)c * V;
			uint32_t b = 0;
			for (uint32_t i = 1; i < V; i++)
				if (lg[i] > lg[b])
					b = i;
			if ((int32_t)b != s->tok[(size_t)rw->w * T + t + 1])
				s->right[(size_t)(rw->j - p->jobs) * s->nwin +
				         rw->w] = 0;
		}
	}
}

/* The producer's logits of the step, stored for every group. */
static void store_ref(struct run *u)
{
	struct groups *p = u->p;
	const struct decoding_set *s = p->s;
	const uint32_t V = s->M->cfg.vocab_size, P = s->P;
	const size_t C = s->T - 1 - P;
	for (uint32_t w = 0; w < s->nwin; w++)
		memcpy(p->ref + ((size_t)w * C + (u->t - P)) * V,
		       u->lg + (size_t)w * V, sizeof(float) * V);
	pthread_mutex_lock(&p->pl->lock);
	p->ref_steps = u->t - P + 1;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->pl->lock);
}

/* Achieved after the step's sync: n = t + 1 tokens seen. */
static void add_achieved(struct run *u)
{
	const struct model *M = u->p->s->M;
	const double lists = (double)M->cfg.n_layers * M->cfg.n_kv_heads;
	for (uint32_t c = u->nref; c < u->nrows; c++) {
		const struct d2row *rw = &u->rows[c];
		if (rw->j->failed || (!rw->r && !rw->cl))
			continue;
		uint64_t kept = rw->r ? replay_kept(rw->r) : kept_daemon(M, rw);
		rw->j->ach += 1.0 - (double)kept / ((u->t + 1) * lists);
		rw->j->nach++;
	}
}

/* Decode step t of the group: one batched forward of its live rows, the
 * syncs, the scores, the oracle's eviction.  0, or the forward failed
 * (every job of the group failed). */
static int group_step(struct run *u, uint32_t t)
{
	struct groups *p = u->p;
	const struct decoding_set *s = p->s;
	const struct group *g = u->g;
	u->t = t;
	u->nlive = 0;
	for (uint32_t c = 0; c < u->nrows; c++) {
		const struct d2row *rw = &u->rows[c];
		if (rw->j && (rw->j->failed || (!rw->r && !rw->cl)))
			continue;
		u->tok[u->nlive] = s->tok[(size_t)rw->w * s->T + t];
		u->pos[u->nlive] = t;
		u->live[u->nlive++] = c;
	}
	struct model_attn a = {attend, u};
	int rc = model_forward_pos(s->M, u->tok, u->nlive, u->pos, &a, u->lg);
	if (rc) {
		for (uint32_t k = 0; k < g->nj; k++)
			fail(g->jobs[k], "forward at position %u: %s", t,
			     kvt_strerror(rc));
		return rc;
	}
	if (g->producer)
		store_ref(u);
	sync_start(u);
	for (uint32_t c = 0; c < u->nlive; c++)
		if (u->rows[u->live[c]].r)
			replay_advance(u->rows[u->live[c]].r, 1);
	/* the scores while the daemon decides */
	score_step(u);
	sync_wait(u);
	for (uint32_t w = 0; g->oracle && p->state > 0 && w < s->nwin; w++)
		if (oracle_step(s, p->tot, u->acc, u->sc, u->rows, u->nrows, w,
		                t + 1))
			eval_die("out of memory");
	add_achieved(u);
	pthread_mutex_lock(&p->pl->lock);
	pool_progress(p->pl, u->nrows);
	pthread_mutex_unlock(&p->pl->lock);
	return 0;
}

/* The group's end: the producer's state (and the oracle's totals) for
 * the others, its engines and caches closed, u's scratch freed. */
static void group_close(struct run *u, int broken, uint64_t t0)
{
	struct groups *p = u->p;
	const struct decoding_set *s = p->s;
	const struct model_config *mc = &s->M->cfg;
	if (u->g->producer) {
		pthread_mutex_lock(&p->pl->lock);
		if (u->acc)
			memcpy(p->tot, u->acc, sizeof(double) * s->nwin *
			       mc->n_layers * mc->n_heads * s->T);
		p->state = broken ? -1 : 1;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->pl->lock);
	}
	for (uint32_t k = 0; k < u->g->nj; k++)
		engine_close(u->e[k]);
	for (uint32_t c = 0; c < u->nrows; c++)
		replay_close(u->rows[c].r);
	if (s->label) {
		pthread_mutex_lock(&p->pl->lock);
		fprintf(stderr, "kvtrim-eval: group %u/%u (%u jobs, %u rows) "
		        "done in %.0fs\n", u->gi + 1, p->ng, u->g->nj, u->nrows,
		        (double)(now_ms() - t0) / 1e3);
		pthread_mutex_unlock(&p->pl->lock);
	}
	free(u->rows);
	free(u->live);
	free(u->e);
	free(u->tok);
	free(u->tk);
	free(u->pos);
	free(u->lg);
	free(u->acc);
	free(u->sc);
}

/* Runs group gi to its end; its jobs' results added up.  References: the
 * producer's are THE reference (stored, scored against by every group);
 * the oracle group's give its prefixes, so it starts once the producer
 * has ended. */
static void run_group(struct groups *p, uint32_t gi)
{
	const struct decoding_set *s = p->s;
	const struct group *g = &p->g[gi];
	uint64_t t0 = now_ms();
	struct run u = {.p = p, .g = g, .gi = gi,
	                .nref = g->producer || g->oracle ? s->nwin : 0};
	u.nrows = u.nref + s->nwin * g->nj;
	if (g->oracle) {
		pthread_mutex_lock(&p->pl->lock);
		while (p->state == 0)
			pthread_cond_wait(&p->cond, &p->pl->lock);
		pthread_mutex_unlock(&p->pl->lock);
	}
	group_open(&u);
	for (uint32_t k = 0; p->state < 0 && k < g->nj; k++)
		fail(g->jobs[k], "no reference: its group failed");
	for (uint32_t w = 0; g->oracle && p->state > 0 && w < s->nwin; w++)
		if (oracle_step(s, p->tot, NULL, u.sc, u.rows, u.nrows, w, s->P))
			eval_die("out of memory");
	int broken = 0;
	for (uint32_t t = s->P; t + 1 < s->T && !broken; t++)
		broken = group_step(&u, t) != 0;
	group_close(&u, broken, t0);
}

static void run_job(struct pool *pl, void *scratch, uint64_t gi)
{
	run_group(pl->ctx, (uint32_t)gi);
}

/* Pages a daemon job's tenant may hold at its end: every list at
 * T - floor(R T) entries (sweeps at SWEEP_LO) plus the headroom entry. */
static uint64_t job_bytes(const struct decoding_set *s, const struct job *j)
{
	const struct model_config *mc = &s->M->cfg;
	if (j->kind != J_DAEMON)
		return 0;
	double R = j->sweep ? SWEEP_LO : j->ratio;
	uint64_t kept = s->T - (uint32_t)floor(R * s->T) + 1;
	uint64_t pages = (kept + D2_PAGE - 1) / D2_PAGE + 1;
	return (uint64_t)s->nwin * mc->n_layers * mc->n_kv_heads * pages * 2 *
	       D2_PAGE * mc->head_dim * sizeof(float);
}

/*
 * The groups of jobs[njobs] into p->g (p->ng of them), their jobs listed
 * in lst: group 0 holds the references (stored for every group; the
 * oracle's totals), the jobs follow in order, daemon jobs first, packed
 * by count (cap_j, references counting as a job) and pages (cap_b); the
 * oracle jobs need references of their own and the totals, so they are
 * never in group 0.  Returns the row-steps of all groups.
 */
static uint64_t pack_groups(struct groups *p, struct job *jobs,
                            uint32_t njobs, struct job **lst,
                            uint32_t cap_j, uint64_t cap_b)
{
	const struct decoding_set *s = p->s;
	uint32_t nl = 0, nor = 0;
	p->g[p->ng++].producer = 1;
	for (uint32_t k = 0; k < njobs; k++)
		if (jobs[k].kind == J_DAEMON)
			lst[nl++] = &jobs[k];
	for (uint32_t k = 0; k < njobs; k++)
		if (jobs[k].kind == J_ORACLE)
			lst[nl + nor++] = &jobs[k];
	for (uint32_t k = 0; k < nl + nor; k++) {
		struct group *g = &p->g[p->ng - 1];
		int orc = lst[k]->kind == J_ORACLE;
		uint64_t b = job_bytes(s, lst[k]);
		uint32_t units = g->nj + (g->producer || g->oracle) + 1 +
		                 (orc && !g->oracle);
		if (units > cap_j || (orc && g->producer) ||
		    (g->nj && g->bytes + b > cap_b))
			g = &p->g[p->ng++];
		if (!g->jobs)
			g->jobs = &lst[k];
		g->nj++;
		g->bytes += b;
		g->oracle |= orc;
	}
	uint64_t total = 0;
	for (uint32_t gi = 0; gi < p->ng; gi++)
		total += (uint64_t)s->nwin * (s->T - 1 - s->P) *
		         ((p->g[gi].producer || p->g[gi].oracle) + p->g[gi].nj);
	return total;
}

int decoding_run(const struct decoding_set *s, struct job *jobs, uint32_t njobs)
{
	if (!s->M || !s->tok || !s->nwin || s->P < 1 || s->T < s->P + 2 ||
	    s->threads < 1 || s->nwin > 64)
		return KVT_EINVAL;
	uint32_t cap_j = s->group_jobs ? s->group_jobs : DECODING_GROUP_JOBS;
	if (cap_j > DECODING_GROUP_JOBS * 2)
		return KVT_EINVAL;
	uint64_t cap_b = s->group_bytes ? s->group_bytes
	                                : D2_POOL / 10 * 8 / (uint64_t)s->threads;
	const struct model_config *mc = &s->M->cfg;
	const size_t C = s->T - 1 - s->P;
	uint32_t nor = 0;
	for (uint32_t k = 0; k < njobs; k++) {
		if (jobs[k].kind == J_KVZIP)
			return KVT_EINVAL;
		nor += jobs[k].kind == J_ORACLE;
	}
	if (s->ans0 && (!s->nans || !s->right || s->ans0 <= s->P))
		return KVT_EINVAL;
	for (uint32_t w = 0; s->ans0 && w < s->nwin; w++)
		if (s->ans0 + s->nans[w] > s->T)
			return KVT_EINVAL;
	struct groups p = {.s = s, .jobs = jobs,
	                   .cond = PTHREAD_COND_INITIALIZER};
	p.g = calloc(njobs + 2, sizeof(*p.g));
	struct job **lst = calloc(njobs + 1, sizeof(*lst));
	p.ref = malloc(sizeof(float) * s->nwin * C * mc->vocab_size);
	p.tot = nor ? malloc(sizeof(double) * s->nwin * mc->n_layers *
	                     mc->n_heads * s->T) : NULL;
	int rc = KVT_ENOMEM;
	if (!p.g || !lst || !p.ref || (nor && !p.tot))
		goto out;
	char label[160];
	snprintf(label, sizeof(label), "%s decoding-time compression, "
	         "row-steps", s->label ? s->label : "");
	struct pool pl = {.threads = s->threads, .ctx = &p, .run = run_job,
	                  .label = s->label ? label : NULL};
	pl.units = pack_groups(&p, jobs, njobs, lst, cap_j, cap_b);
	pl.njobs = p.ng;
	p.pl = &pl;
	if (s->label)
		fprintf(stderr, "kvtrim-eval: %s: %u jobs in %u groups of at "
		        "most %u, %u windows of %u + %u tokens, %d threads\n",
		        s->label, njobs, p.ng, cap_j, s->nwin, s->P,
		        s->T - 1 - s->P, s->threads);
	pool_run(&pl);
	rc = 0;
out:
	free(p.ref);
	free(p.tot);
	free(p.g);
	free(lst);
	return rc;
}

double decoding_inv_seen(uint32_t P, uint32_t T)
{
	double s = 0;
	for (uint32_t t = P; t + 1 < T; t++)
		s += 1.0 / (t + 1);
	return s / (T - 1 - P);
}

uint32_t decoding_tokens(double R, uint32_t P, uint32_t T, int up)
{
	uint32_t best = up ? 1 : T;
	for (uint32_t N = 1; N <= T; N++) {
		double a = 0;
		for (uint32_t n = P + 1; n < T; n++)
			a += n > N ? 1.0 - (double)N / n : 0;
		a /= T - 1 - P;
		if (up && a >= R)
			best = N;
		if (!up && a <= R)
			return N;
	}
	return best;
}

uint32_t decoding_budget(double R, uint32_t P, uint32_t T)
{
	double n = (1.0 - R) / decoding_inv_seen(P, T);
	return n < 1 ? 1 : (uint32_t)lround(n);
}
