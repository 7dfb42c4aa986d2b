/*
 * engine.h — the reference engine's forward with its KV cache inside
 * kvtrimd, through libkvtrim (DESIGN.md section 4).
 *
 * One engine = one tenant with a batch of B sequences.  A step of n tokens
 * runs model_forward(); per layer and KV head its attention callback
 * appends K/V (kvt_kv_ptr), attends with kvt_attention (host or device
 * pages) and stages x, q and lse; then one kvt_sync commits the step.
 * engine_step_batch decodes one token of every sequence through one
 * forward and one sync.  Within a chunk the causal mask is a length.  The
 * step, the registration's sizes and why: docs/engine.md.
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
