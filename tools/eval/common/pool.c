/*
 * pool.c — the one worker pool (pool.h): threads that take job indices in
 * order under the pool's lock, and the progress line.
 */
#include "pool.h"

#include <stdio.h>

#include "eval.h"
#include "now.h"

static void hms(char *b, size_t n, double s)
{
	long v = s > 0 && s < 1e8 ? (long)(s + 0.5) : 0;
	snprintf(b, n, "%ldm%02lds", v / 60, v % 60);
}

void pool_progress(struct pool *p, uint64_t n)
{
	uint64_t t = now_ms(), units = p->units ? p->units : p->njobs;
	p->done += n;
	if (!p->label || (p->done < units && t - p->last < 10000))
		return;
	p->last = t;
	double el = (double)(t - p->t0) / 1e3,
	       left = p->done ? el * (double)(units - p->done) / p->done : 0;
	char d[160], e[32], eta[32];
	if (p->describe)
		p->describe(p, d, sizeof(d));
	else
		snprintf(d, sizeof(d), "%llu/%llu", (unsigned long long)p->done,
		         (unsigned long long)units);
	hms(e, sizeof(e), el);
	hms(eta, sizeof(eta), left);
	fprintf(stderr, "kvtrim-eval: %s: %s, elapsed %s, ETA %s\n", p->label,
	        d, e, eta);
}

static void *worker(void *arg)
{
	struct pool *p = arg;
	void *scratch = p->open ? p->open(p) : NULL;
	pthread_mutex_lock(&p->lock);
	while (p->next < p->njobs) {
		uint64_t k = p->next++;
		pthread_mutex_unlock(&p->lock);
		p->run(p, scratch, k);
		pthread_mutex_lock(&p->lock);
		if (!p->units)
			pool_progress(p, 1);
	}
	pthread_mutex_unlock(&p->lock);
	if (p->close)
		p->close(p, scratch);
	return NULL;
}

void pool_run(struct pool *p)
{
	pthread_t th[POOL_MAX_THREADS];
	int nt = p->threads < 1 ? 1 : p->threads > POOL_MAX_THREADS
	                                  ? POOL_MAX_THREADS : p->threads;
	pthread_mutex_init(&p->lock, NULL);
	p->next = p->done = 0;
	p->t0 = p->last = now_ms();
	for (int i = 0; i < nt; i++)
		if (pthread_create(&th[i], NULL, worker, p))
			eval_die("pthread_create failed");
	for (int i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&p->lock);
}
