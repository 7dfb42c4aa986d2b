/*
 * recipe.h — the hyper-parameters kvtrim-train trains with and kvtrim-eval
 * runs the learned policies with, in one place so the two cannot drift.
 * Scaled to 512-position models as methods.md section 17.1 suggests.
 */
#ifndef KVT_TRAIN_RECIPE_H
#define KVT_TRAIN_RECIPE_H

#include <stdint.h>

/* KVpop: decision delay d and the future-attention horizon N after it. */
#define RECIPE_KVPOP_DELAY 16u
#define RECIPE_KVPOP_HORIZON 128u
#define RECIPE_KVPOP_R 16u      /* projection width */
#define RECIPE_KVPOP_M 16u      /* MLP hidden width */

/* KVzap: MLP hidden d_model / 8 (kvpress h = D / 8); window at eval. */
#define RECIPE_KVZAP_HIDDEN_DIV 8u
#define RECIPE_KVZAP_WINDOW 32u

/* Fast KVzip gate: S sink keys; D' = 8 for d_model >= 128, else 4. */
#define RECIPE_FKV_SINKS 16u
static inline uint32_t recipe_fkv_dp(uint32_t d_model)
{
	return d_model >= 128 ? 8u : 4u;
}

#endif
