/*
 * collect.h — the training sets of kvtrim-train: per window, the oracle
 * passes (engine/oracle.h) that give the learned scorers their inputs and
 * targets, sampled rows of them stored per layer.
 *
 * One window is a sequence of W tokens (dataset.h).  What it gives:
 *   KVzap / Fast KVzip rows, for the T = bos + n_ctx entries of
 *     [BOS] ctx, ctx = the window's first n_ctx tokens after its BOS:
 *     x (the attention input), log KVzip+ and KVzip (oracle_kvzip's
 *     pretext [BOS] ctx sep ctx);
 *   KVpop rows, for the npw = W - D - N entries whose delay D and horizon
 *     N fit the window: x, the attention a_{i,g} = sum_{t in (i, i+D]}
 *     mean_{h in grp(g)} a^h_{t,i} the policy accumulates during the delay,
 *     and the target ln(y + POP_TARGET_EPS), y_{i,g} = max_{h in grp(g)}
 *     sum_{t in (i+D, i+D+N]} a^h_{t,i} (attention in a plain causal pass
 *     of the window).
 * When T == W (models with a tokenizer: the whole window is the KVzip
 * context) one pass of the pretext gives everything, its first W
 * positions being the plain pass of the window; otherwise (byte models:
 * ctx is the longest that fits the 512-position context, 254 bytes) a
 * second, plain pass of the window gives the KVpop rows and the x.
 *
 * Rows: nz of the T KVzap entries and np of the npw KVpop entries of each
 * window, drawn without replacement from the stream (seed, window) and
 * kept in position order (all of them when nz >= T, np >= npw).  Window w
 * owns rows [w * nz, (w + 1) * nz) and [w * np, (w + 1) * np), so the
 * sets do not depend on how many workers filled them: collect_run is
 * deterministic for any jobs.  x is stored as IEEE f16 (core/dtype.h;
 * half the memory of float32, relative error 2^-11); a value beyond the
 * f16 range is refused (see collect_run).
 *
 * Errors are negative KVT_E* codes with a reason.
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
	uint32_t D, N;  /* KVpop delay and horizon */
	uint32_t npw;   /* KVpop entries per window: W - D - N */
	uint32_t nz, np; /* rows sampled per window (<= T, <= npw) */
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t n_sep;
};

/* Per-layer rows of one kind: row r of layer l at x[(l * n + r) * d]. */
struct collect_set {
	size_t n;     /* rows */
	uint16_t *x;  /* [L][n][d] f16 */
	float *y1;    /* [L][n][n_kv]: log KVzip+ | delay attention a */
	float *y2;    /* [L][n][n_kv]: KVzip | ln(future + eps) */
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
