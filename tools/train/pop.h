/*
 * pop.h — trains one layer of the KVpop scorer as policies/kvpop.c runs
 * it (docs/policies.md):
 *   u_i = P x_i                                   P [r][d]
 *   z   = [u_i ; ln(a_{i,g} + 1e-6)]              a: attention received
 *                                                 during the delay
 *   s   = W2[g] . gelu(W1 z + b1) + b2[g]         W1 [m][r+1], W2 [n_kv][m]
 * Target: the entry's log KVzip+ score (the oracle KVzap fits: how much
 * any later query of the context's reconstruction reads it, normalised by
 * its value; docs/policies.md says why not its future attention), MSE
 * (keep-or-drop losses lost to it: docs/policies.md, kvpop, the eighth
 * round), AdamW with a cosine schedule
 * over epochs, global-norm clipping; samples are (token, KV head) pairs,
 * minibatches of tokens.
 */
#ifndef KVT_TRAIN_POP_H
#define KVT_TRAIN_POP_H

#include <stddef.h>
#include <stdint.h>

#include "fit.h"
#include "recipe.h"

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

/*
 * The learned memory (docs/policies.md, kvpop: "The learned memory").  An
 * entry past its delay keeps m = sum over the later queries t of
 * beta^(age - t) v_t (v: the attention the group's heads pay it, their
 * mean) and c = sum of beta^(age - t); the selection ranks it by
 *   w_s s + w_f ln(m / c + 1e-6)
 * (s: the scorer's score), w_s and w_f fitted per layer by least squares
 * (with an intercept, which the ranking ignores) to ln of the attention
 * the next RECIPE_KVPOP_MEM_HORIZON queries pay it (the most any head of
 * the group pays, the paper's future attention), at the ages
 * RECIPE_KVPOP_MEM_AGES, once per decay of RECIPE_KVPOP_MEM_DECAYS; the
 * decay whose fit explains the held-out rows best is the layer's.
 *
 * The rows' features, as collect_run stores them (collect_set.mem): per
 * age k, [POP_MEM_FEAT(k, 0)] the target (NaN where its queries run past
 * the window), then [POP_MEM_FEAT(k, 1 + j)] m at decay j.
 */
#define POP_MEM_AGES 2u
#define POP_MEM_DECAYS 2u
#define POP_MEM_FEATS (POP_MEM_AGES * (1u + POP_MEM_DECAYS))
#define POP_MEM_FEAT(k, f) ((k) * (1u + POP_MEM_DECAYS) + (f))

/* Age k (< POP_MEM_AGES) and decay j (< POP_MEM_DECAYS, in tokens) of
 * recipe.h's lists. */
static inline uint32_t pop_mem_age(uint32_t k)
{
	static const uint32_t a[POP_MEM_AGES] = RECIPE_KVPOP_MEM_AGES;
	return a[k];
}
static inline uint32_t pop_mem_decay(uint32_t j)
{
	static const uint32_t d[POP_MEM_DECAYS] = RECIPE_KVPOP_MEM_DECAYS;
	return d[j];
}

struct pop_mem {
	float decay;          /* tokens: beta = exp(-1 / decay) */
	float w_s, w_f;       /* the readout */
	double r2_s, r2_mem;  /* held-out R^2 of the target: from s alone,
	                         from s and the memory */
	size_t n_tr, n_ho;    /* (row, head, age) samples fitted, scored */
};

/*
 * Fits one layer's memory: S_tr [n_tr][n_kv] and S_ho [n_ho][n_kv] are
 * the scorer's scores of the training and held-out rows, M_tr and M_ho
 * their features [n][n_kv][POP_MEM_FEATS]; D the delay.  Without a
 * sample that has a target (windows shorter than the ages and the
 * horizon) the readout is s alone (w_s 1, w_f 0, R^2 NaN).
 */
void pop_mem_fit(const float *S_tr, const float *M_tr, size_t n_tr,
                 const float *S_ho, const float *M_ho, size_t n_ho,
                 uint32_t n_kv, uint32_t D, struct pop_mem *out);

/* Trains on X [n][d], F [n][n_kv], T [n][n_kv] (targets, already in log
 * space); loss[e] = epoch e's mean training loss when not NULL. */
int pop_train(struct pop_params *p, const float *X, const float *F,
              const float *T, size_t n, const struct fit_mlp_opts *o,
              double *loss);

#endif
