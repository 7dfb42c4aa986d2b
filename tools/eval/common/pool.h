/*
 * pool.h — the one worker pool of kvtrim-eval's programs: `threads`
 * workers take the jobs 0 .. njobs - 1 in index order, each job index
 * handed out once under the pool's lock, each worker with scratch of its
 * own; a progress line goes to stderr at most every 10 s and at the end.
 *
 * The jobs may keep their shared state under the pool's lock (lock) and
 * wait on condition variables of their own with it; a job may wait only
 * for jobs of lower index (taken before it), so the pool cannot deadlock.
 */
#ifndef KVT_EVAL_POOL_H
#define KVT_EVAL_POOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define POOL_MAX_THREADS 16

struct pool {
	/* set by the caller */
	int threads;      /* clamped to 1 .. POOL_MAX_THREADS */
	uint64_t njobs;
	void *ctx;        /* the jobs' shared state */
	/* (optional) a worker's scratch, made before its first job and freed
	 * after its last; dies (eval_die) when it cannot be made */
	void *(*open)(struct pool *p);
	void (*close)(struct pool *p, void *scratch);
	/* runs job k, called without the lock */
	void (*run)(struct pool *p, void *scratch, uint64_t k);
	/* progress: "kvtrim-eval: LABEL: DETAIL, elapsed E, ETA T" (label
	 * NULL: no line), the ETA from the units done so far; units 0: one
	 * unit per job, counted when it returns, else the jobs count them
	 * (pool_progress) */
	const char *label;
	uint64_t units;
	/* (optional) DETAIL into b, under the lock; else "done/units" */
	void (*describe)(struct pool *p, char *b, size_t n);
	/* the pool's */
	pthread_mutex_t lock;
	uint64_t next, done, t0, last; /* t0, last: ms */
};

/* Runs every job; returns when all have returned. */
void pool_run(struct pool *p);

/* Under the lock: n more units done; the progress line when it is due. */
void pool_progress(struct pool *p, uint64_t n);

#endif
