/*
 * pop.h — trains one layer of the KVpop scorer as policies/kvpop.c runs
 * it (docs/policies.md):
 *   u_i = P x_i                                   P [r][d]
 *   z   = [u_i ; ln(a_{i,g} + 1e-6)]              a: attention received
 *                                                 during the delay
 *   s   = W2[g] . gelu(W1 z + b1) + b2[g]         W1 [m][r+1], W2 [n_kv][m]
 * Target: the entry's log KVzip+ score (the oracle KVzap fits: how much
 * any later query of the context's reconstruction reads it, normalised by
 * its value; docs/policies.md says why not its future attention), MSE, AdamW with a cosine schedule
 * over epochs, global-norm clipping; samples are (token, KV head) pairs,
 * minibatches of tokens.
 */
#ifndef KVT_TRAIN_POP_H
#define KVT_TRAIN_POP_H

#include <stddef.h>
#include <stdint.h>

#include "fit.h"

#define POP_FEAT_EPS 1e-6f   /* as kvpop.c's KVPOP_EPS */

struct pop_params {
	uint32_t d, n_kv, r, m;
	float *P, *W1, *b1, *W2, *b2; /* views into flat */
	float *flat;
};

int pop_init(struct pop_params *p, uint32_t d, uint32_t n_kv, uint32_t r,
             uint32_t m, uint64_t seed);
void pop_free(struct pop_params *p);
size_t pop_count(const struct pop_params *p);

/*
 * Scores of n tokens: X [n][d], F [n][n_kv] (the raw delay attention a,
 * the log is taken here), out S [n][n_kv].
 */
int pop_apply(const struct pop_params *p, const float *X, const float *F,
              size_t n, float *S);

/*
 * Budget shares of the lists (docs/policies.md, kvpop: "The budget"):
 * pred[l] [n][n_kv] are the scores of layer l's n training rows; for
 * keep fraction keep[j], tau is the (1 - keep[j]) quantile of all
 * L n n_kv scores and share[j][l][h] = |{rows of (l, h) scoring >= tau}|
 * / (n keep[j]): what list (l, h) would hold, relative to an even
 * budget, if one threshold held the same total (mean 1 over the lists,
 * ties aside).  KVT_ENOMEM or 0.
 */
int pop_shares(const float *const *pred /* [L] */, uint32_t L, size_t n,
               uint32_t n_kv, const float *keep /* [n_f] */, uint32_t n_f,
               float *share /* [n_f][L][n_kv] */);

/* Trains on X [n][d], F [n][n_kv], T [n][n_kv] (targets, already in log
 * space); loss[e] = epoch e's mean training loss when not NULL. */
int pop_train(struct pop_params *p, const float *X, const float *F,
              const float *T, size_t n, const struct fit_mlp_opts *o,
              double *loss);

#endif
