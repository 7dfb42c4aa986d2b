/*
 * recipe.h — the hyper-parameters kvtrim-train trains with and kvtrim-eval
 * runs the learned policies with, in one place so the two cannot drift.
 * Scaled to 512-position models as methods.md section 17.1 suggests; the
 * windows of models with a tokenizer are 512 tokens too.
 */
#ifndef KVT_TRAIN_RECIPE_H
#define KVT_TRAIN_RECIPE_H

#include <stdint.h>

/* KVpop: decision delay d (its window is the policy's default,
 * policy_kvpop_window); the keep fractions 1/2, 1/4, ... 1/2^RECIPE_KVPOP_SHARES at
 * which kvtrim-train measures each list's share of the budget
 * (docs/policies.md, kvpop: "The budget"). */
#define RECIPE_KVPOP_DELAY 16u
#define RECIPE_KVPOP_SHARES 5u
/* KVpop's learned memory (docs/policies.md, kvpop: "The learned
 * memory"): its readout is fitted at these entry ages (queries since the
 * entry arrived) to the attention of the next RECIPE_KVPOP_MEM_HORIZON
 * queries, once per candidate decay (in tokens); the decay that fits the
 * held-out rows best is kept per layer. */
#define RECIPE_KVPOP_MEM_HORIZON 64u
#define RECIPE_KVPOP_MEM_AGES {48u, 160u}
#define RECIPE_KVPOP_MEM_DECAYS {16u, 64u}
#define RECIPE_KVPOP_R 16u      /* projection width */
#define RECIPE_KVPOP_M 16u      /* MLP hidden width */

/* KVzap: MLP hidden d_model / 8 (kvpress h = D / 8); window at eval. */
#define RECIPE_KVZAP_HIDDEN_DIV 8u
#define RECIPE_KVZAP_WINDOW 32u

/* Fast KVzip gate: S sink keys; D' = 16 (the released gates') for
 * d_model >= 512, 8 for d_model >= 128, else 4; SGD steps of 1000 tokens:
 * 2000 for the small models, 400 for d_model >= 512, where a step costs
 * ten times more and 30 layers must fit the training's time budget. */
#define RECIPE_FKV_SINKS 16u
static inline uint32_t recipe_fkv_dp(uint32_t d_model)
{
	return d_model >= 512 ? 16u : d_model >= 128 ? 8u : 4u;
}
static inline uint32_t recipe_fkv_steps(uint32_t d_model)
{
	return d_model >= 512 ? 400u : 2000u;
}

/* Models with a tokenizer (SmolLM2): windows of W tokens, all of them the
 * KVzip context; training windows (train-man.txt) and held-out windows
 * (bytes2m-valid.txt, first part); rows sampled per window per set (the
 * KVzap paper samples 500 of each ~1000-token text).  Sized so SmolLM2's
 * training takes under 25 minutes on two cores (docs/weights.md): 128
 * windows of 384 rows (four times the 64 x 192 first shipped) raised
 * the held-out fit of KVzap-MLP from R^2 0.674 to 0.706 (Spearman 0.809
 * to 0.830) and lowered its protocol-1 KL on the held-out split at
 * 0.5 / 0.75 / 0.875 (docs/weights.md, "Data size"). */
#define RECIPE_TOK_WINDOW 512u
#define RECIPE_TOK_WINDOWS 128u
#define RECIPE_TOK_HELDOUT 8u
#define RECIPE_TOK_ROWS 384u

#endif
