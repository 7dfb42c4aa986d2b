/*
 * model_gguf.h — llama-architecture GGUF files (SmolLM2 and other llama
 * GGUFs) as models of the reference engine: hyperparameters from the
 * metadata, every tensor dequantised to float32 into the layout of struct
 * model (model.h), so the forward, the engines and the oracles run them as
 * they run llama2.c checkpoints.  Tested in
 * tests/integration/test_engine_gguf.c.
 *
 * What a file gives the model:
 *   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size   llama.*
 *   seq_len = usable_ctx = llama.context_length (8192 for SmolLM2: the
 *     engines use the whole trained context, not MODEL_USABLE_CTX)
 *   rope_theta = llama.rope.freq_base, rms_eps = layer_norm_rms_epsilon
 *   shared_classifier: no output.weight (tied embeddings)
 *   bos = tokenizer.ggml.bos_token_id when tokenizer.ggml.add_bos_token is
 *     true, else -1 (SmolLM2: false, no BOS; an absent flag counts as
 *     false)
 * q and k rows are used as stored: llama.cpp's converter already permuted
 * them for the adjacent-pair RoPE of model_forward (model.h).
 *
 * Refused, with a reason naming the file or tensor: everything gguf_open()
 * and gguf_llama_check() refuse (truncated or corrupt files, unknown or
 * undequantisable tensor types as KVT_ENOTSUP, shapes that do not match
 * the hyperparameters as KVT_EGEOMETRY, an architecture other than llama),
 * RoPE scaling (llama.rope.scaling.type other than none: KVT_ENOTSUP), a
 * BOS id outside the vocabulary, and tensors holding non-finite values
 * (KVT_EINVAL).  On failure the model is left zeroed.
 */
#ifndef KVT_ENGINE_MODEL_GGUF_H
#define KVT_ENGINE_MODEL_GGUF_H

#include <stddef.h>

struct gguf;
struct model;
struct tok;

/* Builds *m from an open GGUF file; g may be closed afterwards. */
int model_gguf_load(const struct gguf *g, struct model *m, char *err,
                    size_t errlen);

/* gguf_open(path) + model_gguf_load; the reasons name path. */
int model_gguf_load_file(const char *path, struct model *m, char *err,
                         size_t errlen);

/*
 * The tokenizer of the GGUF file path, for the model m loaded from it
 * (tok_load on its metadata).  KVT_EINVAL when the file has no
 * tokenizer.ggml.model or the tokenizer has more tokens than m's
 * vocabulary; tok_load's codes otherwise.  The reasons name path.
 */
int model_gguf_tok_file(const char *path, const struct model *m,
                        struct tok **out, char *err, size_t errlen);

#endif
