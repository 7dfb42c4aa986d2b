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

/* weights_get() of the tensor named by fmt, with the policy's name and the
 * model path in the reason.  NULL on failure. */
const float *learned_get(const struct policy *p, const struct weights *w,
                         char *err, size_t errlen, uint32_t ndim,
                         const uint64_t *shape, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));

#endif
