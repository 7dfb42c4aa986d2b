/*
 * save.h — writes what kvtrim-train learned in the formats the policies
 * load (policies/weights.h, docs/weights.md): kvpress KVzap checkpoint
 * directories (config.json + model.safetensors, layers.{l}.weight/.bias
 * or layers.{l}.0.* / layers.{l}.2.*), and one safetensors file each for
 * the Fast KVzip gates (fastkvzip.{l}.*) and the KVpop scorers
 * (kvpop.{l}.*), all layers of the model.  dt is the files' element
 * type (kvtrim-train --dtype: f32, or f16 / bf16 rounded to nearest even,
 * which the loaders widen back to float32).  Errors are negative KVT_E*
 * codes with a reason naming the path.
 */
#ifndef KVT_TRAIN_SAVE_H
#define KVT_TRAIN_SAVE_H

#include <stddef.h>
#include <stdint.h>

#include "gate.h"
#include "model.h"
#include "pop.h"

/* mkdir -p; -1 with errno on failure. */
int save_mkdirs(const char *path);

/*
 * dir/config.json + dir/model.safetensors of a KVzap model: linear when
 * hidden is 0 (W1 [n_kv][d], b1 [n_kv] per layer), else the MLP with that
 * hidden width (W1 [hidden][d], b1 [hidden], W2 [n_kv][hidden], b2
 * [n_kv]).  Arrays of n_layers pointers.
 */
int save_kvzap(const char *dir, const struct model_config *c,
               uint32_t hidden, float *const *W1, float *const *b1,
               float *const *W2, float *const *b2, enum kvt_dtype dt,
               char *err, size_t errlen);

/* The gates gp[n_layers] into the safetensors file path. */
int save_fastkvzip(const char *path, const struct model_config *c,
                   const struct gate_params *gp, enum kvt_dtype dt,
                   char *err, size_t errlen);

/* The KVpop scorers pp[n_layers] into the safetensors file path, with
 * their budget shares: kvpop.share [n_f][n_layers][n_kv_heads] at the keep
 * fractions kvpop.share_keep [n_f] (pop_shares), and the learned memory:
 * kvpop.memory [n_layers][3], per layer its decay in tokens and the
 * readout's weights of the score and of the memory (pop.h). */
int save_kvpop(const char *path, const struct model_config *c,
               const struct pop_params *pp, const float *share,
               const float *keep, uint32_t n_f, const float *memory,
               enum kvt_dtype dt, char *err, size_t errlen);

#endif
