/*
 * learned.h — what the learned policies (kvzap, fastkvzip, kvpop) share:
 * loading model=PATH, reading a tensor's shape (to learn the hidden sizes a
 * checkpoint was trained with) and fetching per-layer tensors with a
 * reason that names the policy, the file and the tensor.
 *
 * All failures are KVT_EPOLICY (or KVT_ENOMEM) with a reason: bad weights
 * are refused when the policy is created, never at a sync.
 */
#ifndef KVT_LEARNED_H
#define KVT_LEARNED_H

#include <stddef.h>
#include <stdint.h>

#include "policy.h"
#include "weights.h"

/* Loads p->args.model (required) into *w. */
int learned_load(const struct policy *p, struct weights **w, char *err,
                 size_t errlen);

/*
 * Shape of tensor name in the safetensors file at path (a kvpress directory
 * means path/model.safetensors): *ndim and shape[0..min(ndim, 4)).  Read
 * from the file's header; the values are then checked against the data by
 * weights_get().
 */
int learned_shape(const char *path, const char *name, uint32_t *ndim,
                  uint64_t shape[4], char *err, size_t errlen);

/*
 * Dimension `axis` of tensor name (which must have ndim dimensions), read
 * from the file header: how checkpoints tell their hidden sizes.  Refused
 * unless it is in [1, max].
 */
int learned_dim(const struct policy *p, const char *name, uint32_t ndim,
                uint32_t axis, uint64_t max, uint32_t *out, char *err,
                size_t errlen);

/*
 * Refuses a checkpoint trained for a deeper model: one that has the tensor
 * fmt (with a %u for the layer) for layer n_layers.
 */
int learned_layers_fit(const struct policy *p, const struct weights *w,
                       const char *fmt, char *err, size_t errlen);

/* weights_get() of the tensor named by fmt, with the policy's name and the
 * model path in the reason.  NULL on failure. */
const float *learned_get(const struct policy *p, const struct weights *w,
                         char *err, size_t errlen, uint32_t ndim,
                         const uint64_t *shape, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));

#endif
