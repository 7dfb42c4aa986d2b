/*
 * model.h — the models of the reference engine (engine/): llama2.c
 * checkpoints and llama-architecture GGUF files (model_gguf.c), one
 * float32 layout for both, and the transformer forward.
 *
 * model_forward() runs the n new tokens of one step batched through BLAS
 * and hands attention to a callback, so every engine (in-process caches,
 * the kvtrimd-backed engine) shares every other floating-point operation:
 * the tests demand equal logits to 1e-5.  Weights are float32, row-major,
 * [out][in]; a model owns one buffer holding every tensor.  The
 * architecture and RoPE layout: docs/engine.md.  Errors are negative
 * KVT_E* codes with a reason in err.
 */
#ifndef KVT_TINYLLM_MODEL_H
#define KVT_TINYLLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

#define MODEL_BOS 1           /* BOS token id of both llama2.c models */
#define MODEL_USABLE_CTX 512  /* positions the llama2.c models were trained on */
#define MODEL_RMS_EPS 1e-5f       /* llama2.c's; the default of model_alloc */
#define MODEL_ROPE_THETA 10000.0f /* llama2.c's; the default of model_alloc */
#define MODEL_GGUF 3          /* struct model version of a GGUF file */

struct model_config {
	uint32_t dim;        /* d_model */
	uint32_t hidden_dim; /* FFN width */
	uint32_t n_layers;
	uint32_t n_heads;
	uint32_t n_kv_heads;
	uint32_t vocab_size;
	uint32_t seq_len;    /* as the header says (not necessarily usable) */
	uint32_t shared_classifier; /* 1: the classifier is tok_emb */
	float rope_theta;    /* RoPE base; 0: MODEL_ROPE_THETA */
	float rms_eps;       /* RMSNorm epsilon; 0: MODEL_RMS_EPS */
	uint32_t usable_ctx; /* positions the engines use (model_context);
	                        0: min(seq_len, MODEL_USABLE_CTX) */
	/* derived by model_alloc */
	uint32_t head_dim;   /* dim / n_heads */
	uint32_t kv_dim;     /* n_kv_heads * head_dim */
};

struct model {
	struct model_config cfg;
	int version;       /* llama2.c format 0 legacy, 1 fp32, 2 Q8_0, or
	                      MODEL_GGUF */
	int32_t bos;       /* token id put before every input, or -1: none
	                      (MODEL_BOS for llama2.c models) */
	float *data;       /* owns every tensor below */
	float *tok_emb;    /* [vocab][dim] */
	float *rms_att;    /* [L][dim] */
	float *wq;         /* [L][dim][dim] */
	float *wk;         /* [L][kv_dim][dim] */
	float *wv;         /* [L][kv_dim][dim] */
	float *wo;         /* [L][dim][dim] */
	float *rms_ffn;    /* [L][dim] */
	float *w1;         /* [L][hidden][dim] */
	float *w2;         /* [L][dim][hidden] */
	float *w3;         /* [L][hidden][dim] */
	float *rms_final;  /* [dim] */
	float *wcls;       /* [vocab][dim]; == tok_emb when shared */
};

/*
 * Checks a configuration (positive sizes within sane bounds, dim divisible
 * by n_heads, n_heads by n_kv_heads, even head_dim, a positive finite
 * theta and eps), fills the defaults and derived fields and allocates
 * zeroed tensors; bos is MODEL_BOS.  For tests and the loaders.
 */
int model_alloc(struct model *m, const struct model_config *cfg, char *err,
                size_t errlen);

/*
 * Loads a model file: a GGUF file (it starts with "GGUF"; see
 * model_gguf.h for what is checked) or a llama2.c checkpoint: legacy v0
 * (7 int32 header, negative vocab = separate classifier, freq_cis tables
 * skipped), or "ak42" version 1 (float32) or 2 (Q8_0 groups, dequantized
 * here).  A checkpoint's length must be exactly what the header implies;
 * anything else is refused with KVT_EINVAL (bad header, truncated or
 * oversized file) or KVT_ESYS (cannot read) and a reason.
 */
int model_load(const char *path, struct model *m, char *err, size_t errlen);

/* Frees the tensors; safe on a zeroed or freed model. */
void model_free(struct model *m);

/*
 * Model path: explicit if not NULL, else $KVTRIM_MODEL, else the repo's
 * default ../shared/models/bytes2m.bin (relative to the working directory,
 * i.e. the repository root).
 */
const char *model_default_path(const char *explicit_path);

/* Context the engines use: cfg.usable_ctx (a GGUF's context_length),
 * else min(header seq_len, MODEL_USABLE_CTX). */
uint32_t model_context(const struct model *m);

/* ---------------------------------------------------------------- ops */

/* out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps) for n rows of dim. */
void model_rmsnorm(float *out /* [n][dim] */, const float *x /* [n][dim] */,
                   const float *w /* [dim] */, uint32_t n, uint32_t dim,
                   float eps);

/* The softmax normaliser of logits l[V] in double: sum of exp(l[i] - mx)
 * with *mx the largest logit (ln Z = mx + log of it). */
double model_logits_z(const float *l /* [V] */, uint32_t V, float *mx);

/* Rotates v in place for position pos: pairs (2i, 2i+1) of each head by
 * pos * theta^(-2i / head_dim). */
void model_rope(float *v /* [n_heads][head_dim] */, uint32_t n_heads,
                uint32_t head_dim, uint32_t pos, float theta);

/*
 * y = x W^T through cblas_sgemm.  Note: OpenBLAS (0.3.21 here) picks
 * different kernels by size (small-matrix paths when M*N*K is small, the
 * gemv-like path for one or two rows), so a row's result can differ in the
 * last bits with the number of rows in the call.  Runs that must agree
 * bit for bit on the matmuls therefore use the same step schedule
 * (model_dense_step with the engine's chunks).
 */
void model_matmul(float *y /* [n][out] */, const float *x /* [n][in] */,
                  const float *W /* [out][in] */, uint32_t n, uint32_t in,
                  uint32_t out);

/* ---------------------------------------------------------------- forward */

/*
 * Attention of one layer for the n new tokens at positions pos0..pos0+n-1.
 * q, k are post-RoPE.  The callee stores k, v of the new tokens wherever it
 * keeps its cache and writes, for each new token c and query head h,
 *   out[c][h*hd..] = sum_i softmax_i(q[c][h] . k_i / sqrt(hd)) v_i
 *   lse[c][h]      = log sum_i exp(q[c][h] . k_i / sqrt(hd))
 * over the cached entries it keeps plus the new tokens 0..c (causal).
 * x is the attention input (post-RMSNorm), for engines that stage it.
 */
struct model_attn {
	int (*attend)(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n,
	              const float *x /* [n][dim] */,
	              const float *q /* [n][n_heads][hd] */,
	              const float *k /* [n][n_kv][hd] */,
	              const float *v /* [n][n_kv][hd] */,
	              float *out /* [n][n_heads][hd] */,
	              float *lse /* [n][n_heads] */);
	void *ctx;
};

/*
 * Runs n tokens starting at position pos0 through the model, attention by
 * a->attend, and writes logits [n][vocab] (logits may be NULL).  Tokens
 * outside [0, vocab) are KVT_EINVAL.  Allocates its scratch per call.
 * Returns 0 or the first error of attend.
 */
int model_forward(const struct model *m, const int32_t *tokens, uint32_t n,
                  uint32_t pos0, const struct model_attn *a,
                  float *logits /* [n][vocab] */);

/*
 * model_forward for n tokens at positions of their own: token t (of any
 * sequence) at pos[t], as a batched decode step of n sequences needs (one
 * token each, every weight matrix read once for all of them).  attend gets
 * pos0 = pos[0]; a callback serving several sequences knows from its ctx
 * which sequence (and position) each token row is.  With pos[t] = pos0 + t
 * it computes exactly what model_forward does.
 */
int model_forward_pos(const struct model *m, const int32_t *tokens,
                      uint32_t n, const uint32_t *pos /* [n] */,
                      const struct model_attn *a,
                      float *logits /* [n][vocab] */);

/*
 * The dense reference cache: every entry kept, contiguous float32.
 * Optionally records what the oracles need: attention maps and the
 * attention inputs x of every layer (pointers NULL = not recorded).
 */
struct model_dense {
	const struct model *m;
	uint32_t cap;  /* positions */
	uint32_t len;  /* positions cached, = next pos0 */
	float *k;      /* [L][n_kv][cap][hd] post-RoPE */
	float *v;      /* [L][n_kv][cap][hd] */
	float *maps;   /* [L][n_heads][cap][cap] a[t][i] (0 for i > t), or NULL */
	float *xs;     /* [L][cap][dim] attention inputs, or NULL */
	float *scratch; /* [cap] */
};

/* Allocates a dense cache of cap positions; record_maps adds maps + xs. */
int model_dense_init(struct model_dense *d, const struct model *m,
                     uint32_t cap, int record_maps);
void model_dense_free(struct model_dense *d);

/*
 * Runs n more tokens through the model on the dense cache (prefill when
 * the cache is empty and n > 1, decode when n == 1): logits [n][vocab].
 * KVT_ETOOLONG when the cache would exceed cap.
 */
int model_dense_step(struct model_dense *d, const int32_t *tokens, uint32_t n,
                     float *logits);

/* Dense forward of a whole sequence from an empty cache. */
int model_dense_forward(const struct model *m, const int32_t *tokens,
                        uint32_t T, float *logits /* [T][vocab] */);

#endif
