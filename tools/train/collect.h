/*
 * collect.h — the training sets of kvtrim-train: per window, the oracle
 * passes (engine/oracle.h) that give the learned scorers their inputs and
 * targets, sampled rows of them stored per layer (what a window gives:
 * docs/weights.md, "What a window gives").  Window w owns its rows, drawn
 * without replacement from the stream (seed, window) and kept in position
 * order, so collect_run is deterministic for any number of jobs.  x is
 * stored as IEEE f16 (core/dtype.h); a value beyond the f16 range is
 * refused.  Errors are negative KVT_E* codes with a reason.
 */
#ifndef KVT_TRAIN_COLLECT_H
#define KVT_TRAIN_COLLECT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "oracle.h"

struct collect_geom {
	uint32_t W;     /* window tokens */
	uint32_t n_ctx; /* KVzip context tokens */
	uint32_t T;     /* KVzip entries: bos + n_ctx (<= W) */
	uint32_t D;     /* KVpop delay */
	uint32_t npw;   /* KVpop entries per window: min(W - D, T), the
	                   positions whose delay ends inside the window and
	                   that KVzip scores */
	uint32_t nz, np; /* rows sampled per window (<= T, <= npw) */
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t n_sep;
};

/* Per-layer rows of one kind: row r of layer l at x[(l * n + r) * d]. */
struct collect_set {
	size_t n;     /* rows */
	uint16_t *x;  /* [L][n][d] f16 */
	float *y1;    /* [L][n][n_kv]: log KVzip+ | delay attention a */
	float *y2;    /* [L][n][n_kv]: KVzip | log KVzip+ (KVpop's target) */
	float *mem;   /* KVpop's rows only: [L][n][n_kv][POP_MEM_FEATS], the
	                 learned memory's features and targets (pop.h) */
};

/* Allocates the two sets for n_win windows (z: KVzap rows, p: KVpop
 * rows). */
int collect_alloc(const struct model *m, const struct collect_geom *g,
                  uint32_t n_win, struct collect_set *z,
                  struct collect_set *p);
void collect_free(struct collect_set *s);

/* Float32 copy of layer l's x: out [n][d]. */
void collect_layer_x(const struct collect_set *s, uint32_t l, uint32_t d,
                     float *out);

/* Called after each window (under a lock, from any worker): windows done
 * so far of n_win. */
typedef void (*collect_progress_fn)(void *ctx, uint32_t done,
                                    uint32_t n_win);

/*
 * Fills z and p from the windows tok[w] (W tokens each, w < n_win) with
 * jobs worker threads (1: the calling thread only).  copy_from: windows w
 * >= copy_from also report how well the model repeats their context:
 * *copy_acc = top-1 agreement of the model's prediction with the copy
 * tokens, over those windows (NaN when there are none).  KVT_EINVAL when
 * an x does not fit f16 (or is not finite), an oracle's error otherwise;
 * the reason names the window.
 */
int collect_run(const struct model *m, const struct collect_geom *g,
                const int32_t *const *tok, uint32_t n_win, uint64_t seed,
                uint32_t jobs, uint32_t copy_from, struct collect_set *z,
                struct collect_set *p, double *copy_acc,
                collect_progress_fn progress, void *pctx, char *err,
                size_t errlen);

#endif
