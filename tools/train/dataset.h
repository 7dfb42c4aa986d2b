/*
 * dataset.h — the token sequences kvtrim-train learns from and kvtrim-eval
 * measures on, built deterministically from the model's own material so
 * that the two never share a sequence.
 *
 * Byte models (vocab 256, bytes2m): the held-out text bytes2m-valid.txt
 * (never seen by the model's own training) is cut once, at the first
 * newline at or after 60 % of its bytes:
 *   train = bytes [0, cut)    kvtrim-train only (targets, fits, and
 *                             kvtrim-eval's threshold calibration)
 *   eval  = bytes [cut, end)  kvtrim-eval's measurements only
 * A sequence is BOS followed by len - 1 consecutive bytes; windows do not
 * overlap and, when there are more than asked for, are taken evenly spaced
 * over the part (so they are not all from its first documents).
 *
 * Models with a tokenizer (GGUF, SmolLM2; dataset_build_tok): text through
 * the model's tokenizer, BOS first only when the model has one (m->bos >=
 * 0; SmolLM2 has none).  The parts:
 *   train    ../shared/corpus/train-man.txt ($KVTRIM_TRAIN_TEXT), whole:
 *            rendered man pages, none of them in the held-out text
 *   heldout  bytes [0, cut) of the held-out text above: kvtrim-train's
 *            held-out fit metrics only
 *   eval     bytes [cut, end) of it: kvtrim-eval's measurements only
 * Window k of n starts at the first line start at or after byte
 * k * part / n of its part (later, at the first line start after the
 * previous window's text, when that ran past it), and holds the first len
 * tokens of the text from there; windows never overlap and never cross their part's end
 * (fewer come back when the part runs out).  Each window is tokenized on
 * its own, so the sub-sample never tokenizes the whole 3 MB.
 *
 * Token-id models (stories260K, whose tokenizer is not available): every
 * sequence is sampled from the model itself at temperature 1, starting at
 * BOS and continuing through later BOS tokens (new stories), len tokens.
 * Training sequence k uses the stream (seed, "train", k); evaluation
 * sequence k uses the fixed stream (DATASET_EVAL_SEED, "eval", k), which
 * no --seed can select, so the splits are disjoint whatever seed the
 * trainer is given.
 *
 * Errors are negative KVT_E* codes with a reason in err.
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
