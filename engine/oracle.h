/*
 * oracle.h — offline eviction targets computed from the model itself with
 * dense attention (no daemon): KVzip, KVzip+ and future attention.  One
 * pass (oracle_run) runs a whole sequence through model_forward in one
 * step with its own attention, one [n][n] probability map per query head
 * at a time, reduced into every target asked for: memory O(n^2) for one
 * head, so contexts of thousands of tokens fit.
 *
 * Scores are [n_layers][n_kv_heads][T] float32, out[(l * n_kv + g) * T +
 * i] for position i of the scored sequence.  The definitions, pretexts and
 * separators: docs/engine.md, "Oracles".  Errors are negative KVT_E* codes.
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
#define ORACLE_WIN_MAX 8

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
 * KVzip (plus = 0) or KVzip+ (plus = 1) scores of [BOS] ctx, maxima over
 * the queries of sep and the copy in the pretext [BOS] ctx sep ctx:
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
 *   red_{h in grp(g)} sum_{t = i+lo+1}^{min(i+hi, plain-1)}
 *                      decay^(i+hi-t) a^h_{t,i}
 * with red = mean (mean = 1) or max (mean = 0); rows and plain are the
 * request's.  decay 0 means 1 (a plain sum); in (0, 1) it is the sum a
 * decayed memory holds once query i+hi has been read (KVpop's learned
 * memory, docs/policies.md).  out [n_layers][n_kv_heads][rows].
 */
struct oracle_win {
	uint32_t lo, hi;
	int mean;
	float *out;
	float decay;
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
