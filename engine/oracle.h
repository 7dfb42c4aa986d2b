/*
 * oracle.h — offline eviction targets computed from the model itself with
 * dense attention maps (no daemon): KVzip, KVzip+ and future attention
 * (methods.md sections 1, 3, 11, 17).  Contexts are at most 512 positions,
 * so every layer's [n_heads][T][T] map is materialised.
 *
 * Scores are [n_layers][n_kv_heads][T] float32, entry i of KV head g of
 * layer l at out[(l * n_kv + g) * T + i], i = position in the scored
 * sequence (position 0 is BOS).
 *
 * KVzip / KVzip+ (context reconstruction).  The pretext is
 *     [BOS] ctx sep ctx
 * (methods.md 17.1: a base model without a chat template).  The scored
 * entries are the T = 1 + n_ctx positions of [BOS] ctx; the queries are
 * the n_ctx positions of the repeated copy (not the separator); softmax
 * rows run causally over the whole pretext, as one KVzip chunk does.
 *   kvzip:  s_{i,g}  = max_{h in grp(g)} max_{j in copy} a^h_{j,i}
 *           reported as is, in [0, 1].
 *   kvzip+: s+_{i,g} = max_{h in grp(g)} max_{j in copy}
 *                        a^h_{j,i} * ||W_O^h v_i|| / ||x_j||
 *           (x_j = attention input after the input RMSNorm, as kvpress
 *           kvzap/data.py), reported as log(max(s+, 1e-30)).
 * Default separator: "\n\n" for byte-level models (vocab 256: the pair
 * ends a paragraph in the training text, and the model's copy heads work
 * at short range, so a long instruction would only cost context); BOS for
 * token-id models (stories260K: BOS opens a new story).  The pretext must
 * fit the context: n_ctx <= (context - 1 - n_sep) / 2, i.e. 254 bytes at
 * 512 with "\n\n".
 *
 * Future attention (KVpop's proposed target, methods.md section 3) over a
 * plain causal pass of the given sequence tokens[0..T):
 *   y_{i,g} = max_{h in grp(g)} sum_{t = i+1}^{min(i + N, T - 1)} a^h_{t,i}
 * (the sum is truncated at the end of the sequence; the last entry gets 0).
 */
#ifndef KVT_TINYLLM_ORACLE_H
#define KVT_TINYLLM_ORACLE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

enum oracle_kind {
	ORACLE_KVZIP = 0,
	ORACLE_KVZIP_PLUS = 1,
	ORACLE_FUTURE = 2,
};

#define ORACLE_SEP_MAX 64

/* "kvzip" | "kvzip+" | "future" -> kind; KVT_EINVAL when unknown. */
int oracle_kind_parse(const char *s, enum oracle_kind *out);
const char *oracle_kind_name(enum oracle_kind k);

/* Writes the model's default separator into sep[ORACLE_SEP_MAX];
 * returns its length. */
uint32_t oracle_default_sep(const struct model *m, int32_t *sep);

/* Longest ctx whose pretext fits `context` positions. */
uint32_t oracle_kvzip_max_ctx(uint32_t context, uint32_t n_sep);

/*
 * KVzip (plus = 0) or KVzip+ (plus = 1) scores of [BOS] ctx:
 * out [n_layers][n_kv_heads][1 + n_ctx].  KVT_EINVAL for an empty ctx or
 * bad tokens, KVT_ENOMEM.
 */
int oracle_kvzip(const struct model *m, const int32_t *ctx, uint32_t n_ctx,
                 const int32_t *sep, uint32_t n_sep, int plus, float *out);

/* Future attention of tokens[0..T) with horizon N >= 1:
 * out [n_layers][n_kv_heads][T]. */
int oracle_future(const struct model *m, const int32_t *tokens, uint32_t T,
                  uint32_t horizon, float *out);

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
