/*
 * dataset.h — the token sequences kvtrim-train learns from and kvtrim-eval
 * measures on, built deterministically from the model's own material so
 * that the two never share a sequence: byte models cut the held-out text
 * once (train before the cut, eval after), models with a tokenizer take
 * windows of a training corpus, a held-out part and an evaluation part,
 * token-id models sample from the model on disjoint seeded streams.  The
 * exact parts and windows: docs/weights.md, "Data".  Errors are negative
 * KVT_E* codes with a reason in err.
 */
#ifndef KVT_TRAIN_DATASET_H
#define KVT_TRAIN_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define DATASET_TRAIN_FRACTION 0.6
#define DATASET_EVAL_SEED 0x6576616c2d6b7674ull /* "eval-kvt" */

enum dataset_split {
	DATASET_TRAIN = 0,
	DATASET_EVAL = 1,
	DATASET_HELDOUT = 2, /* models with a tokenizer only (above) */
};

struct tok;

struct dataset {
	uint32_t n;    /* sequences */
	uint32_t len;  /* tokens per sequence */
	int32_t *tok;  /* [n][len]; tok[k * len] is the model's BOS when it
	                  has one */
};

/* splitmix64 step: the one generator of both tools (deterministic,
 * platform independent). */
uint64_t dataset_rng(uint64_t *state);
/* Uniform double in [0, 1) from the generator. */
double dataset_uniform(uint64_t *state);

/* Path of the held-out text: $KVTRIM_VALID_TEXT, else
 * ../shared/models/bytes2m-valid.txt (relative to the repository root). */
const char *dataset_text_path(void);

/* Path of the training text of models with a tokenizer:
 * $KVTRIM_TRAIN_TEXT, else ../shared/corpus/train-man.txt. */
const char *dataset_corpus_path(void);

/*
 * Reads the text part of split (byte models): malloc'ed bytes in *out,
 * length in *n.  KVT_ESYS when the file cannot be read.
 */
int dataset_text(enum dataset_split split, char **out, size_t *n, char *err,
                 size_t errlen);

/*
 * Builds up to max_n sequences of len tokens of split for model m (byte
 * text or model samples, see above).  Byte models give fewer when the part
 * holds fewer windows.  seed is used by training splits of token-id
 * models only.  A GGUF model is refused (KVT_EINVAL): its sequences come
 * from dataset_build_tok.
 */
int dataset_build(const struct model *m, enum dataset_split split,
                  uint32_t len, uint32_t max_n, uint64_t seed,
                  struct dataset *out, char *err, size_t errlen);

/*
 * The windows of split (train, heldout or eval) for a model with the
 * tokenizer t (see above): up to max_n sequences of len tokens.
 * KVT_ESYS when a text cannot be read, KVT_EINVAL when the part holds no
 * window or the text does not tokenize (with the byte offset).
 */
int dataset_build_tok(const struct model *m, const struct tok *t,
                      enum dataset_split split, uint32_t len, uint32_t max_n,
                      struct dataset *out, char *err, size_t errlen);

void dataset_free(struct dataset *d);

/* 1 for byte-level models (vocab 256, text available), else 0. */
int dataset_is_bytes(const struct model *m);

#endif
