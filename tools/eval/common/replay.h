/*
 * replay.h — an in-process KV cache with per-(layer, KV head) eviction, for
 * the two policies kvtrim-eval cannot run in kvtrimd (the KVzip and the
 * hindsight oracles need the model itself, and the daemon takes no
 * external scores).  It mirrors the daemon-backed engine: the same
 * model_forward, entries appended after the kept ones in token order, the
 * same paged_attention_cpu kernel, float32 storage; with nothing evicted
 * its logits equal the engine's with policy `full`.  Eviction marks entries
 * dead; the caller selects with the shared kernels (select_topk_cpu).
 * Several caches can decode in one batched forward (model_forward_pos):
 * replay_attend_row serves row c, then each cache moves on with
 * replay_advance; a row's arithmetic is replay_step's for that token.
 */
#ifndef KVT_EVAL_REPLAY_H
#define KVT_EVAL_REPLAY_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct replay;

/* A cache of cap positions for model m; KVT_ENOMEM. */
int replay_open(const struct model *m, uint32_t cap, struct replay **out);
void replay_close(struct replay *r);

/* Empties the cache (position 0). */
void replay_reset(struct replay *r);

/* Runs n tokens at the next positions (attention over the live entries);
 * logits [n][vocab] may be NULL. */
int replay_step(struct replay *r, const int32_t *tok, uint32_t n,
                float *logits);

/*
 * Attention of the token at position replay_pos(r) of one layer, for a
 * batched forward (q [n_heads][hd], k and v [n_kv][hd] of that token;
 * out [n_heads][hd], lse [n_heads]): appended and attended as replay_step
 * does.  Call replay_advance(r, 1) once every layer has run.
 */
int replay_attend_row(struct replay *r, uint32_t layer, const float *q,
                      const float *k, const float *v, float *out, float *lse);
void replay_advance(struct replay *r, uint32_t n);

/*
 * While acc is set, every query row attended (replay_step and
 * replay_attend_row) adds its attention probabilities to it:
 * acc[(layer * n_heads + h) * cap + i] += a^h_{row, i} for every live
 * entry i (its position) of query head h, the row's own entry included.
 * NULL stops it.  The hindsight oracle of the decode protocol sums the
 * attention a full-cache run pays each entry this way.
 */
void replay_tap(struct replay *r, double *acc /* [L][n_heads][cap] */);

/* Tokens fed so far. */
uint32_t replay_pos(const struct replay *r);

/* Liveness of (layer, KV head): [replay_pos] flags, 1 = kept; writable
 * (set 0 to evict; entries never come back). */
uint8_t *replay_alive(struct replay *r, uint32_t layer, uint32_t kv_head);

/* Live entries over all layers and KV heads. */
uint64_t replay_kept(const struct replay *r);

#endif
