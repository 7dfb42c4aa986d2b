/*
 * engine.h — the reference engine's forward with its KV cache inside
 * kvtrimd, through libkvtrim (DESIGN.md section 4).
 *
 * One engine = one tenant with one sequence.  A step of n tokens (a
 * prefill chunk, or one decode token) runs model_forward(); per layer and
 * KV head its attention callback
 *   1. appends K (post-RoPE) and V of the n new tokens at list entries
 *      len .. len+n-1 through kvt_kv_ptr (converted to the tenant dtype),
 *   2. attends with paged_attention_cpu, one call per (new token, KV head)
 *      for the G query heads of that KV head, scale 1/sqrt(head_dim),
 *   3. stages x (post input-RMSNorm), q (post-RoPE) and lse of every new
 *      token at its original position (kvt_stage_x/q/lse),
 * and after the last layer one kvt_sync commits the n entries
 * (phase prefill or decode) and lets the policy evict.
 *
 * Causality inside a chunk: entries appended but not yet synced sit at
 * list indices len .. len+n-1 in token order, right after the committed
 * entries [0, len) (whatever order eviction left those in).  So new token
 * c attends over the first len + c + 1 entries of the list: every kept
 * committed entry, the chunk's earlier tokens and itself — the causal mask
 * is a length, no mask array is needed.  Its lse covers the same set.
 *
 * Registration: geometry from the model, max_tokens = context, headroom =
 * chunk (a whole chunk is appended between two syncs), stage_tokens =
 * max(min(context, ENGINE_STAGE_MAX), chunk) unless given (a sync may carry
 * at most stage_tokens new entries, and policies with a lookback read
 * earlier rows of the ring; the daemon refuses a policy whose lookback does
 * not fit).  The cap keeps long-context models affordable: a staged token
 * of SmolLM2 is 30 layers x (576 + 576 + 9) floats, 136 KiB, so a ring of
 * its whole 8192-token context would be 1.1 GiB, over the daemon's
 * default tenant_memory_max.
 * Inputs are always staged; a policy that reads none ignores them.
 */
#ifndef KVT_TINYLLM_ENGINE_H
#define KVT_TINYLLM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"
#include "model.h"

#define ENGINE_STAGE_MAX 512 /* default staging ring cap, tokens */

struct engine_opts {
	const char *runtime_dir;  /* NULL: libkvtrim's default */
	const char *tenant;       /* NULL: "engine" */
	const char *policy;       /* NULL: "full" */
	enum kvt_dtype dtype;     /* K/V storage (f32 default) */
	uint32_t page_tokens;     /* 0: 16 */
	uint32_t context;         /* max_tokens per list; 0: model_context() */
	uint32_t chunk;           /* prefill chunk = headroom; 0: 64 */
	uint32_t stage_tokens;    /* 0: max(min(context, ENGINE_STAGE_MAX),
	                             chunk) */
	uint64_t quota_bytes;     /* 0: the daemon's default */
	int timeout_ms;           /* 0: 10000 */
};

struct engine;

/* Connects, registers and opens the sequence.  Reason in err. */
int engine_open(const struct model *m, const struct engine_opts *o,
                struct engine **out, char *err, size_t errlen);

/* Closes the sequence and disconnects; safe with NULL. */
void engine_close(struct engine *e);

/* Drops the sequence and opens an empty one (position 0). */
int engine_reset(struct engine *e);

/*
 * One step: n tokens (1 <= n <= chunk) at the next positions, one sync
 * with that phase.  logits [n][vocab] may be NULL.  On an error the
 * sequence is unusable until engine_reset (its lists may hold appended,
 * uncommitted entries); the reason is in engine_error().
 */
int engine_step(struct engine *e, const int32_t *tokens, uint32_t n,
                enum kvt_phase phase, float *logits);

/*
 * Feeds n tokens: prefill in steps of chunk tokens, decode one token per
 * step.  logits [n][vocab] may be NULL.
 */
int engine_feed(struct engine *e, const int32_t *tokens, uint32_t n,
                enum kvt_phase phase, float *logits);

/* Tokens fed so far (= the next position). */
uint32_t engine_pos(const struct engine *e);

/* The connection, for stats and list inspection. */
kvt_client *engine_client(const struct engine *e);
kvt_seq engine_seq(const struct engine *e);

/* Why the last call failed ("" if it did not). */
const char *engine_error(const struct engine *e);

#endif
