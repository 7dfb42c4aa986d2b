/*
 * engine.h — the reference engine's forward with its KV cache inside
 * kvtrimd, through libkvtrim (DESIGN.md section 4).
 *
 * One engine = one tenant with a batch of B sequences (B = 1 unless
 * engine_opts.batch says more).  A step of n tokens of one sequence (a
 * prefill chunk, or one decode token) runs model_forward(); per layer and
 * KV head its attention callback
 *   1. appends K (post-RoPE) and V of the n new tokens at list entries
 *      len .. len+n-1 through kvt_kv_ptr (converted to the tenant dtype),
 *   2. attends with kvt_attention over the layer's lists (scale
 *      1/sqrt(head_dim)): on a host tenant in place on the model's q, out
 *      and lse (libkvtrim's paged_attention_cpu, per new token and KV
 *      head); on a cuda tenant q goes to a device buffer
 *      (kvt_buffer_alloc) with kvt_memcpy, the CUDA kernel runs on the
 *      client's stream, and out and lse come back with kvt_memcpy (K/V
 *      rows go to the device pages with kvt_memcpy too: this engine
 *      computes on the host),
 *   3. stages x (post input-RMSNorm), q (post-RoPE) and lse of every new
 *      token at its original position (kvt_stage_x/q/lse),
 * and after the last layer one kvt_sync commits the n entries
 * (phase prefill or decode) and lets the policy evict.
 *
 * A batched step (engine_step_batch) decodes one token of every sequence,
 * each at its own position, through ONE model_forward_pos (every weight
 * matrix read once for the batch: sgemm with M = B) whose callback does
 * 1-3 above for row c over sequence c's lists, then ONE kvt_sync with B
 * items.  Its logits equal B single-sequence steps' up to OpenBLAS's
 * choice of kernel by M (model.h, model_matmul): the attention arithmetic
 * is the same call on the same data.
 *
 * Causality inside a chunk: entries appended but not yet synced sit at
 * list indices len .. len+n-1 in token order, right after the committed
 * entries [0, len) (whatever order eviction left those in).  So new token
 * c attends over the first len + c + 1 entries of the list: every kept
 * committed entry, the chunk's earlier tokens and itself — the causal mask
 * is a length, no mask array is needed.  Its lse covers the same set.
 *
 * Registration: geometry from the model, max_seqs = batch, max_tokens =
 * context, headroom =
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
	uint32_t batch;           /* sequences (max_seqs); 0: 1 */
};

struct engine;

/* Connects, registers and opens the batch's sequences.  Reason in err. */
int engine_open(const struct model *m, const struct engine_opts *o,
                struct engine **out, char *err, size_t errlen);

/* Closes the sequences and disconnects; safe with NULL. */
void engine_close(struct engine *e);

/* Drops every sequence and opens empty ones (position 0). */
int engine_reset(struct engine *e);

/*
 * One step of sequence 0: n tokens (1 <= n <= chunk) at the next
 * positions, one sync with that phase.  logits [n][vocab] may be NULL.  On an error the
 * sequence is unusable until engine_reset (its lists may hold appended,
 * uncommitted entries); the reason is in engine_error().
 */
int engine_step(struct engine *e, const int32_t *tokens, uint32_t n,
                enum kvt_phase phase, float *logits);

/* engine_step on sequence s (< engine_batch; else KVT_EINVAL). */
int engine_step_seq(struct engine *e, uint32_t s, const int32_t *tokens,
                    uint32_t n, enum kvt_phase phase, float *logits);

/*
 * A batched step: tokens[s] of every sequence s at its own next position,
 * one forward and one kvt_sync of B items with that phase.  logits
 * [B][vocab] (row s: sequence s) may be NULL.  Errors as engine_step (the
 * whole batch is then unusable until engine_reset).
 */
int engine_step_batch(struct engine *e, const int32_t *tokens /* [B] */,
                      enum kvt_phase phase, float *logits);

/*
 * Feeds n tokens to sequence 0: prefill in steps of chunk tokens, decode
 * one token per step.  logits [n][vocab] may be NULL.
 */
int engine_feed(struct engine *e, const int32_t *tokens, uint32_t n,
                enum kvt_phase phase, float *logits);
int engine_feed_seq(struct engine *e, uint32_t s, const int32_t *tokens,
                    uint32_t n, enum kvt_phase phase, float *logits);

/*
 * For a caller that appended and synced n entries of sequence s itself
 * through engine_client/engine_seq_of (the bench fills long caches with
 * synthetic K/V that way): its next position moves on by n.
 */
void engine_seq_advance(struct engine *e, uint32_t s, uint32_t n);

/* Sequences of the batch. */
uint32_t engine_batch(const struct engine *e);

/* Tokens fed so far (= the next position) of sequence 0, of sequence s. */
uint32_t engine_pos(const struct engine *e);
uint32_t engine_pos_of(const struct engine *e, uint32_t s);

/* The connection, for stats and list inspection; sequence 0's id, sequence
 * s's (s < engine_batch). */
kvt_client *engine_client(const struct engine *e);
kvt_seq engine_seq(const struct engine *e);
kvt_seq engine_seq_of(const struct engine *e, uint32_t s);

/* Why the last call failed ("" if it did not). */
const char *engine_error(const struct engine *e);

#endif
