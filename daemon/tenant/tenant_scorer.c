/*
 * tenant_scorer.c — device scorers shared between tenants: one device copy
 * of a scorer's weights per distinct weights (found by content), and one
 * scorer_run for the syncs of its tenants that reach their scorer stage
 * together.  See tenant_int.h, struct tscorer_hold.
 *
 * Sharing.  tscorer_get hashes the kind, the sizes and every tensor's bytes;
 * on a hash hit it compares the bytes with those of a tenant already
 * holding the entry (its policy's host tensors, which live as long as its
 * hold), so two tenants share a device copy only when their weights are
 * equal byte for byte.  An entry is freed with its last hold.
 *
 * Group commit.  A sync's scorer stage queues its jobs on the entry (an
 * ask).  With no run in progress the asker leads: it may wait up to its
 * gather_us for more asks (never on the loop thread, whose gather_us is 0:
 * an ask that may not wait also ends any gathering), takes every queued
 * ask, runs them in one scorer_run on its own stream after each other
 * participant's stream has drained (their queued waits for the engine's
 * writes), and hands each ask its scores; the others wait on the entry's
 * condition variable, and the first ask left over leads the next run.
 * Scores depend only on each job's rows and layer, so a shared run gives
 * every ask the bits it would get alone.  A failed run fails every ask it
 * served, with the backend's reason; scoring comes before a sync commits
 * anything, so each of those syncs is refused without a trace.
 *
 * Threads: get and put on the loop thread; tscorer_run on the loop or a
 * sync worker, one sync per tenant at a time.  The entry's queue, busy flag
 * and holders are under its mutex; its scratch is the leader's alone.
 */
#include "errors.h"
#include "tenant_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One sync's scorer stage, queued on an entry (on the asker's stack). */
struct tscorer_ask {
	struct tscorer_ask *next;
	const struct kvt_backend_score_job *jobs;
	uint32_t n;
	uint64_t rows;
	float *out;    /* [rows][d_out] */
	void *stream;  /* the asker's: its queued work comes first */
	int done, rc;
	char why[KVT_ERRTEXT_MAX];
};

struct tscorer {
	struct tscorer *next;          /* the pool's list (loop thread) */
	struct pool *pool;
	const struct kvt_backend_ops *o;
	void *bctx;
	void *sc;                      /* the backend's scorer */
	struct kvt_backend_scorer d;   /* kind, sizes; w: a holder's tensors */
	uint64_t hash;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct tscorer_hold *holds;    /* mu */
	uint32_t refs;                 /* holds (mu) */
	struct tscorer_ask *q, **qtail; /* asks not taken yet (mu) */
	uint32_t nq;                   /* of them (mu) */
	int busy;                      /* a leader gathers or runs (mu) */
	int cut;                       /* an ask that may not wait queued (mu) */
	/* the leader's scratch */
	struct kvt_backend_score_job *jobs;
	size_t jobs_cap;
	float *out;
	size_t out_cap;
};

/* ------------------------------------------------------------ sharing */

/* FNV-1a, 8 bytes a step (a full-width multiply mixes each word). */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (; n >= 8; n -= 8, b += 8) {
		uint64_t w;
		memcpy(&w, b, 8);
		h = (h ^ w) * 0x100000001b3ull;
	}
	for (; n; n--, b++)
		h = (h ^ *b) * 0x100000001b3ull;
	return h;
}

uint64_t tscorer_hash(const struct kvt_backend_scorer *d)
{
	const uint32_t sizes[] = {d->kind, d->n_layers, d->d_in, d->d_out,
	                          d->hidden, d->G, d->dp, d->S};
	uint64_t h = hash_bytes(0xcbf29ce484222325ull, sizes, sizeof(sizes));
	for (uint32_t l = 0; l < d->n_layers; l++)
		for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++) {
			const float *t = d->w[(size_t)l * KVT_SCORER_TENSORS + k];
			uint64_t n = kvt_scorer_floats(d, k);
			if (n && t)
				h = hash_bytes(h, t, n * sizeof(float));
		}
	return h;
}

/* Whether a and b are the same scorer: kind, sizes and every byte. */
static int scorer_same(const struct kvt_backend_scorer *a,
                       const struct kvt_backend_scorer *b)
{
	if (a->kind != b->kind || a->n_layers != b->n_layers ||
	    a->d_in != b->d_in || a->d_out != b->d_out ||
	    a->hidden != b->hidden || a->G != b->G || a->dp != b->dp ||
	    a->S != b->S)
		return 0;
	for (size_t i = 0; i < (size_t)a->n_layers * KVT_SCORER_TENSORS; i++) {
		uint64_t n = kvt_scorer_floats(a, (uint32_t)(i % KVT_SCORER_TENSORS));
		if (!n)
			continue;
		if (!a->w[i] != !b->w[i] ||
		    (a->w[i] && memcmp(a->w[i], b->w[i], n * sizeof(float))))
			return 0;
	}
	return 1;
}

static void entry_free(struct tscorer *e)
{
	if (e->sc)
		e->o->scorer_free(e->bctx, e->sc);
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->cv);
	free(e->jobs);
	free(e->out);
	free(e);
}

/* A new entry holding the device copy of d's weights; 0 or an error. */
static int entry_new(struct pool *pool, const struct kvt_backend_ops *o,
                     void *bctx, const struct kvt_backend_scorer *d,
                     uint64_t hash, struct tscorer **out, char *err,
                     size_t errlen)
{
	struct tscorer *e = calloc(1, sizeof(*e));
	if (!e)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, &ca);
	pthread_condattr_destroy(&ca);
	e->pool = pool;
	e->o = o;
	e->bctx = bctx;
	e->d = *d;
	e->hash = hash;
	e->qtail = &e->q;
	int rc = o->scorer_new(bctx, d, &e->sc);
	if (rc) {
		e->sc = NULL;
		entry_free(e);
		return errors_fmt(err, errlen, rc, "%s backend: %s", o->name,
		                  o->last_error());
	}
	*out = e;
	return 0;
}

int tscorer_get(struct pool *pool, const struct kvt_backend_ops *o,
                void *bctx, const struct kvt_backend_scorer *d,
                const float **w, struct tscorer_hold **out, char *err,
                size_t errlen)
{
	*out = NULL;
	struct tscorer_hold *h = calloc(1, sizeof(*h));
	if (!h) {
		free(w);
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	h->w = w;
	struct kvt_backend_scorer dd = *d;
	dd.w = w;
	const uint64_t hash = tscorer_hash(&dd);
	struct tscorer *e = pool->scorers;
	while (e && !(e->o == o && e->bctx == bctx && e->hash == hash &&
	              scorer_same(&e->d, &dd)))
		e = e->next;
	if (!e) {
		int rc = entry_new(pool, o, bctx, &dd, hash, &e, err, errlen);
		if (rc) {
			free(h->w);
			free(h);
			return rc;
		}
		e->next = pool->scorers;
		pool->scorers = e;
		pool->n_scorers++;
	}
	h->e = e;
	pthread_mutex_lock(&e->mu);
	h->next = e->holds;
	e->holds = h;
	e->refs++;
	pthread_mutex_unlock(&e->mu);
	*out = h;
	return 0;
}

void tscorer_put(struct tscorer_hold *h)
{
	if (!h)
		return;
	struct tscorer *e = h->e;
	struct pool *pool = e->pool;
	pthread_mutex_lock(&e->mu);
	struct tscorer_hold **pp = &e->holds;
	while (*pp != h)
		pp = &(*pp)->next;
	*pp = h->next;
	uint32_t left = --e->refs;
	/* the tensors compared against must stay alive: another holder's */
	if (e->holds)
		e->d.w = e->holds->w;
	pthread_mutex_unlock(&e->mu);
	free(h->w);
	free(h);
	if (left)
		return;
	struct tscorer **ep = &pool->scorers;
	while (*ep != e)
		ep = &(*ep)->next;
	*ep = e->next;
	pool->n_scorers--;
	entry_free(e);
}

uint32_t tscorer_holders(const struct tscorer_hold *h)
{
	struct tscorer *e = h->e;
	pthread_mutex_lock(&e->mu);
	uint32_t n = e->refs;
	pthread_mutex_unlock(&e->mu);
	return n;
}

/* ---------------------------------------------------------- group commit */

/* Waits (mu held) until gather_us passed, an ask that may not wait is
 * queued, or every holder has an ask queued. */
static void gather(struct tscorer *e, uint32_t gather_us)
{
	struct timespec dl;
	clock_gettime(CLOCK_MONOTONIC, &dl);
	uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)gather_us * 1000u;
	dl.tv_sec += (time_t)(ns / 1000000000u);
	dl.tv_nsec = (long)(ns % 1000000000u);
	while (!e->cut && e->nq < e->refs)
		if (pthread_cond_timedwait(&e->cv, &e->mu, &dl) == ETIMEDOUT)
			break;
}

/* The batch's jobs one after the other in e->jobs, and room for their
 * scores in e->out; 0 or KVT_ENOMEM. */
static int batch_pack(struct tscorer *e, const struct tscorer_ask *b,
                      uint32_t *nj, uint64_t *rows)
{
	size_t n = 0, r = 0;
	for (const struct tscorer_ask *a = b; a; a = a->next) {
		n += a->n;
		r += a->rows;
	}
	if (n > UINT32_MAX ||
	    tenant_grow((void **)&e->jobs, &e->jobs_cap, n + 1, sizeof(*e->jobs)) ||
	    tenant_grow((void **)&e->out, &e->out_cap, r * e->d.d_out + 1,
	                sizeof(float)))
		return KVT_ENOMEM;
	n = 0;
	for (const struct tscorer_ask *a = b; a; a = a->next) {
		memcpy(e->jobs + n, a->jobs, a->n * sizeof(*a->jobs));
		n += a->n;
	}
	*nj = (uint32_t)n;
	*rows = r;
	return 0;
}

/* Runs the batch b (taken off the queue; led on stream) in one
 * scorer_run, and sets every ask's rc (and why on failure). */
static void batch_run(struct tscorer *e, struct tscorer_ask *b, void *stream)
{
	const struct kvt_backend_ops *o = e->o;
	uint32_t nj = 0, asks = 0;
	uint64_t rows = 0;
	int rc = 0, host = 0;
	const char *what = "scoring staged x";
	for (const struct tscorer_ask *a = b; a; a = a->next) {
		asks++;
		host |= a->out != NULL; /* else scores stay on the device */
	}
	/* The run reads every participant's rows of x: after the work each
	 * queued on its own stream (the wait for its engine's writes). */
	for (struct tscorer_ask *a = b; a && !rc; a = a->next)
		if (a->stream != stream && o->stream_sync &&
		    (rc = o->stream_sync(e->bctx, a->stream)))
			what = "waiting for a sharing tenant's stream";
	if (!rc && asks == 1)
		rc = o->scorer_run(e->bctx, e->sc, b->jobs, b->n, b->out, stream);
	else if (!rc && (rc = batch_pack(e, b, &nj, &rows)) == 0 &&
	         (rc = o->scorer_run(e->bctx, e->sc, e->jobs, nj,
	                             host ? e->out : NULL, stream)) == 0) {
		const float *s = e->out;
		for (struct tscorer_ask *a = b; a; a = a->next) {
			if (a->out)
				memcpy(a->out, s,
				       a->rows * e->d.d_out * sizeof(float));
			s += a->rows * e->d.d_out;
		}
		__atomic_add_fetch(&e->pool->scorer_shared_runs_total, 1,
		                   __ATOMIC_RELAXED);
		__atomic_add_fetch(&e->pool->scorer_shared_syncs_total, asks,
		                   __ATOMIC_RELAXED);
	}
	for (struct tscorer_ask *a = b; a; a = a->next) {
		a->rc = rc;
		if (rc == KVT_ENOMEM)
			errors_fmt(a->why, sizeof(a->why), rc, "out of memory");
		else if (rc && asks == 1)
			errors_fmt(a->why, sizeof(a->why), rc, "%s backend: %s: "
			           "%s", o->name, what, o->last_error());
		else if (rc)
			errors_fmt(a->why, sizeof(a->why), rc, "%s backend: %s "
			           "(one run for %u syncs sharing the scorer's "
			           "weights): %s", o->name, what, asks,
			           o->last_error());
	}
}

int tscorer_run(struct tscorer_hold *h,
                const struct kvt_backend_score_job *jobs, uint32_t n,
                float *out, void *stream, uint32_t gather_us, char *err,
                size_t errlen)
{
	struct tscorer *e = h->e;
	struct tscorer_ask a = {.jobs = jobs, .n = n, .out = out,
	                        .stream = stream};
	for (uint32_t i = 0; i < n; i++)
		a.rows += jobs[i].n;
	if (!a.rows)
		return 0;
	pthread_mutex_lock(&e->mu);
	*e->qtail = &a;
	e->qtail = &a.next;
	e->nq++;
	if (!gather_us)
		e->cut = 1;
	if (e->busy) /* a gathering leader looks at the queue again */
		pthread_cond_broadcast(&e->cv);
	while (!a.done && e->busy)
		pthread_cond_wait(&e->cv, &e->mu);
	if (!a.done) {
		e->busy = 1;
		if (gather_us)
			gather(e, gather_us);
		struct tscorer_ask *b = e->q;
		e->q = NULL;
		e->qtail = &e->q;
		e->nq = 0;
		e->cut = 0;
		pthread_mutex_unlock(&e->mu);
		batch_run(e, b, stream);
		pthread_mutex_lock(&e->mu);
		for (; b; b = b->next)
			b->done = 1;
		e->busy = 0;
		pthread_cond_broadcast(&e->cv);
	}
	pthread_mutex_unlock(&e->mu);
	if (a.rc)
		return errors_fmt(err, errlen, a.rc, "%s", a.why);
	return 0;
}
