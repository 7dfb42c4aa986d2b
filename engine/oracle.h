/*
 * oracle.h — offline eviction targets computed from the model itself with
 * dense attention (no daemon): KVzip, KVzip+ and future attention
 * (methods.md sections 1, 3, 11, 17).  One oracle pass (oracle_run) runs a
 * whole sequence through model_forward in one step with its own attention
 * (BLAS, one [n][n] probability map per query head at a time, never all
 * of them), and reduces every map into the targets asked for while it is
 * at hand; so a pass costs memory O(n^2) for one head, not
 * O(layers * heads * n^2), and contexts of thousands of tokens fit.
 *
 * Scores are [n_layers][n_kv_heads][T] float32, entry i of KV head g of
 * layer l at out[(l * n_kv + g) * T + i], i = position in the scored
 * sequence (position 0 is BOS for models that have one, m->bos >= 0, the
 * first context token for the others, e.g. SmolLM2).
 *
 * KVzip / KVzip+ (context reconstruction).  The pretext is
 *     [BOS] ctx sep ctx          (BOS only when m->bos >= 0)
 * The scored entries are the T = (BOS ? 1 : 0) + n_ctx positions of
 * [BOS] ctx; the queries are the n_ctx positions of the repeated copy (not
 * the separator); softmax rows run causally over the whole pretext, as one
 * KVzip chunk does.
 *   kvzip:  s_{i,g}  = max_{h in grp(g)} max_{j in copy} a^h_{j,i}
 *           reported as is, in [0, 1].
 *   kvzip+: s+_{i,g} = max_{h in grp(g)} max_{j in copy}
 *                        a^h_{j,i} * ||W_O^h v_i|| / ||x_j||
 *           (x_j = attention input after the input RMSNorm, as kvpress
 *           kvzap/data.py), reported as log(max(s+, 1e-30)).
 * Separators:
 *   - byte-level models (vocab 256): "\n\n" (oracle_default_sep: the pair
 *     ends a paragraph in the training text, and the model's copy heads
 *     work at short range, so a long instruction would only cost context);
 *   - llama2.c token-id models (stories260K): BOS (a new story);
 *   - models with a tokenizer (oracle_repeat_sep): KVzip's repeat prompt
 *     "\n\nRepeat the previous context exactly." followed, for a ChatML
 *     model, by "<|im_end|>\n<|im_start|>assistant\n" (the turn of an
 *     assistant that repeats), else by "\n" (kvpress KVzipPress without a
 *     chat template).  No user-turn opener goes before ctx: the scored
 *     positions then see exactly the prefix they see in a plain pass of the
 *     text, which is what the learned scorers are fed at inference.
 * The pretext must fit the context: see oracle_max_ctx.
 *
 * Future attention (KVpop's proposed target, methods.md section 3) over a
 * plain causal pass of the given sequence tokens[0..T):
 *   y_{i,g} = max_{h in grp(g)} sum_{t = i+1}^{min(i + N, T - 1)} a^h_{t,i}
 * (the sum is truncated at the end of the sequence; the last entry gets 0).
 * oracle_run's windows generalise it (other offsets, mean over the group),
 * which is how kvtrim-train gets KVpop's delay feature and its target.
 *
 * Errors are negative KVT_E* codes.
 */
#ifndef KVT_TINYLLM_ORACLE_H
#define KVT_TINYLLM_ORACLE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct tok;

enum oracle_kind {
	ORACLE_KVZIP = 0,
	ORACLE_KVZIP_PLUS = 1,
	ORACLE_FUTURE = 2,
};

#define ORACLE_SEP_MAX 64
#define ORACLE_WIN_MAX 4

/* "kvzip" | "kvzip+" | "future" -> kind; KVT_EINVAL when unknown. */
int oracle_kind_parse(const char *s, enum oracle_kind *out);
const char *oracle_kind_name(enum oracle_kind k);

/* Writes the default separator of a llama2.c model (no tokenizer) into
 * sep[ORACLE_SEP_MAX]; returns its length. */
uint32_t oracle_default_sep(const struct model *m, int32_t *sep);

/*
 * The repeat prompt of a model with a tokenizer (see above) in its tokens:
 * sep[ORACLE_SEP_MAX], length in *n.  KVT_EINVAL (with a reason) when it
 * does not fit ORACLE_SEP_MAX tokens.
 */
int oracle_repeat_sep(const struct tok *t, int32_t *sep, uint32_t *n,
                      char *err, size_t errlen);

/* Longest ctx whose pretext [BOS] ctx sep ctx fits `context` positions
 * (with a BOS; oracle_max_ctx says it for a given model). */
uint32_t oracle_kvzip_max_ctx(uint32_t context, uint32_t n_sep);
uint32_t oracle_max_ctx(const struct model *m, uint32_t context,
                        uint32_t n_sep);

/* Entries the KVzip oracles score for n_ctx context tokens: n_ctx, plus 1
 * for the BOS of models that have one. */
uint32_t oracle_scored(const struct model *m, uint32_t n_ctx);

/*
 * KVzip (plus = 0) or KVzip+ (plus = 1) scores of [BOS] ctx:
 * out [n_layers][n_kv_heads][oracle_scored(m, n_ctx)].  KVT_EINVAL for an
 * empty ctx or bad tokens, KVT_ENOMEM.
 */
int oracle_kvzip(const struct model *m, const int32_t *ctx, uint32_t n_ctx,
                 const int32_t *sep, uint32_t n_sep, int plus, float *out);

/* Future attention of tokens[0..T) with horizon N >= 1:
 * out [n_layers][n_kv_heads][T]. */
int oracle_future(const struct model *m, const int32_t *tokens, uint32_t T,
                  uint32_t horizon, float *out);

/*
 * A window reduction: entry i < rows gets, per KV head g,
 *   red_{h in grp(g)} sum_{t = i+lo+1}^{min(i+hi, plain-1)} a^h_{t,i}
 * with red = mean (mean = 1) or max (mean = 0); rows and plain are the
 * request's.  out [n_layers][n_kv_heads][rows].
 */
struct oracle_win {
	uint32_t lo, hi;
	int mean;
	float *out;
};

/*
 * One oracle pass of tokens[0..n) from position 0; every output is
 * optional (NULL / 0: not computed).
 *   kvzip, kvzip_plus [L][n_kv][scored]: as above, queries [q0, n)
 *                        (q0 < n, scored <= q0)
 *   win[n_win]         window reductions over entries [0, rows), queries
 *                        t < plain (rows <= plain <= n)
 *   xs [L][xs_rows][d] attention inputs of positions [0, xs_rows)
 *   logits [n][vocab]  the model's logits (e.g. to check that the model
 *                        does repeat the context)
 * KVT_EINVAL for inconsistent bounds or bad tokens, KVT_ENOMEM.
 */
struct oracle_req {
	const int32_t *tokens;
	uint32_t n;
	uint32_t scored, q0;
	float *kvzip, *kvzip_plus;
	uint32_t rows, plain, n_win;
	struct oracle_win win[ORACLE_WIN_MAX];
	float *xs;
	uint32_t xs_rows;
	float *logits;
};
int oracle_run(const struct model *m, const struct oracle_req *r);

/*
 * File format of `kvtrim-engine oracle --out F`: a 32-byte header of
 * little-endian uint32 {magic 0x4f54564b ("KVTO"), version 1, kind,
 * n_layers, n_kv_heads, T, horizon (0 unless future), first (position of
 * the first scored entry: 0)}, then float32 [n_layers][n_kv_heads][T].
 */
#define ORACLE_FILE_MAGIC 0x4f54564bu
int oracle_write(const char *path, enum oracle_kind kind,
                 const struct model *m, uint32_t T, uint32_t horizon,
                 const float *scores, char *err, size_t errlen);

#endif
