/*
 * model_files.h — where the public models fetched by `make models`
 * (scripts/models.sh) live: one rule shared by the engine, the tools and
 * the tests.
 *
 * The cache directory is $KVTRIM_MODELS when set and non-empty, else
 * $XDG_CACHE_HOME/kvtrim/models, else $HOME/.cache/kvtrim/models (an empty
 * variable counts as unset, as in the script's ${VAR:-default}).
 */
#ifndef KVT_ENGINE_MODEL_FILES_H
#define KVT_ENGINE_MODEL_FILES_H

#include <stddef.h>

/* File name of SmolLM2-135M-Instruct (Q4_1) inside the cache. */
#define MODEL_FILES_SMOLLM2 "SmolLM2-135M-Instruct.Q4_1.gguf"

/*
 * Writes the cache directory into buf (len bytes).  Returns 0, or
 * KVT_EINVAL with a reason in err when neither KVTRIM_MODELS, XDG_CACHE_HOME
 * nor HOME is set, or the path does not fit.
 */
int model_files_dir(char *buf, size_t len, char *err, size_t errlen);

/*
 * Writes the path of model file name inside the cache into buf.  Returns
 * 0 when the file and its verification stamp (<file>.sha256, written by
 * scripts/models.sh after the hash matched) are both readable; otherwise
 * KVT_EINVAL with a reason that names the path and `make models` (the
 * path is still written when it fits, for the message).
 */
int model_files_find(const char *name, char *buf, size_t len, char *err,
                size_t errlen);

/*
 * The file a --model argument names: a known model's short name
 * ("smollm2": MODEL_FILES_SMOLLM2 in the cache, through model_files_find,
 * so a missing model says to run `make models`), else the argument itself
 * as a path.  Writes it into buf; 0 or KVT_EINVAL with a reason.
 */
int model_files_resolve(const char *arg, char *buf, size_t len, char *err,
                        size_t errlen);

#endif
