/*
 * weights.h — safetensors weights for the learned scorers (KVzap, Fast
 * KVzip, KVpop), loaded once per policy instance and read-only afterwards.
 *
 * Input: a .safetensors file, or a directory in kvpress's KVzap checkpoint
 * layout holding model.safetensors and optionally config.json (keys
 * input_dim, output_dim, hidden_dim, n_modules).  Tensors of dtype F32, F16
 * and BF16 are converted to float32 at load; anything else is refused.
 * Every tensor is checked completely at load (offsets, sizes, overlaps,
 * NaN/Inf), so a policy that got its tensors from weights_get() never sees a
 * malformed value.
 *
 * Errors: negative KVT_E* codes (KVT_EINVAL for a bad file, KVT_ENOMEM,
 * KVT_ESYS for an unreadable one) plus a NUL-terminated reason in err
 * (err may be NULL; errlen includes the NUL), naming the tensor at fault.
 *
 * Threads: a loaded struct weights is immutable; any number of threads may
 * read it concurrently.  Pointers it returns live until weights_free().
 */
#ifndef KVT_WEIGHTS_H
#define KVT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

/* Most dimensions a tensor may have. */
#define WEIGHTS_MAX_DIMS 8

struct weights;

/* Loads path (file or kvpress directory) into *out.  On failure *out is
 * NULL and err says why. */
int weights_load(const char *path, struct weights **out, char *err,
                 size_t errlen);

void weights_free(struct weights *w);

/*
 * The tensor name as float32 (row-major, product(shape) elements) if it
 * exists with exactly ndim dimensions of sizes shape[0..ndim); otherwise
 * NULL and a reason ("missing tensor x", "tensor x has shape [3,4],
 * expected [4,3]").
 */
const float *weights_get(const struct weights *w, const char *name,
                         uint32_t ndim, const uint64_t *shape /* [ndim] */,
                         char *err, size_t errlen);

/* 1 when a tensor called name exists (any shape), else 0. */
int weights_has(const struct weights *w, const char *name);

/* Listing, in the file's header order: i < weights_count(w). */
size_t weights_count(const struct weights *w);
const char *weights_name_at(const struct weights *w, size_t i);

/*
 * An unsigned integer key of config.json (kvpress layout).  KVT_EINVAL when
 * no config.json was loaded, the key is absent, null (hidden_dim of a linear
 * KVzap) or not an integer in [0, 2^32).
 */
int weights_config_u32(const struct weights *w, const char *key,
                       uint32_t *out);

/* One tensor to write: data is float32 [shape[0]]...[shape[ndim-1]]. */
struct weights_tensor {
	const char *name;
	uint32_t ndim; /* <= 4 */
	uint64_t shape[4];
	const float *data;
};

/*
 * Writes n tensors as an F32 safetensors file (header JSON padded with
 * spaces so the data starts 8-byte aligned; tensors back to back in the
 * given order).  The file is written to path.tmp and renamed, so a reader
 * never sees half a file.  Names must be distinct and not "__metadata__";
 * a value that is not finite, or becomes so in its dtype (past 65504 in
 * f16), is refused, as the reader would refuse it.
 */
int weights_write(const char *path, const struct weights_tensor *t, size_t n,
                  char *err, size_t errlen);
/* The same with every tensor stored as dt: F16 and BF16 round to nearest
 * even (core/dtype.h); the loader widens them back to float32. */
int weights_write_as(const char *path, const struct weights_tensor *t,
                     size_t n, enum kvt_dtype dt, char *err, size_t errlen);

#endif
