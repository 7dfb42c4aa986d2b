/*
 * model_gguf.h — llama-architecture GGUF files (SmolLM2 and other llama
 * GGUFs) as models of the reference engine: hyperparameters from the
 * metadata, every tensor dequantised to float32 into the layout of struct
 * model (model.h), so the forward, the engines and the oracles run them as
 * they run llama2.c checkpoints.  Tested in
 * tests/integration/test_engine_gguf.c.
 *
 * Which keys give which field, and what is refused (with a reason naming
 * the file or tensor): docs/engine.md, "GGUF files".  On failure the model
 * is left zeroed.
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
