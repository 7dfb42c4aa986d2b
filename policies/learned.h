/*
 * learned.h — what the learned policies (kvzap, fastkvzip, kvpop) share:
 * their private state's head (struct learned_priv: the weights and the
 * per-layer tensor table, opened by learned_open, filled by
 * learned_get_layers, freed by learned_fini, their ops->fini), loading
 * model=PATH, reading a tensor's shape (to learn the hidden sizes a
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

/*
 * The first member of a learned policy's p->priv: the weights of
 * model=PATH and the per-layer tensor pointers, an array of the policy's
 * own layer struct (const float * members only).
 */
struct learned_priv {
	struct weights *w;
	void *layers;      /* [n_layers][layer_size] bytes */
	size_t layer_size;
};

/* One tensor of every layer, for learned_get_layers. */
struct learned_tensor {
	const char *fmt;   /* name, with a %u for the layer */
	uint32_t ndim;
	uint64_t shape[4]; /* [ndim] used */
	size_t off;        /* offsetof its const float * in the layer struct */
};

/*
 * Allocates p->priv (size bytes, zeroed; it starts with struct
 * learned_priv) and loads model=PATH into its w (learned_load).  A failure
 * may leave p->priv set: learned_fini frees what there is.
 */
int learned_open(struct policy *p, size_t size, char *err, size_t errlen);

/*
 * Allocates the layer table ([n_layers] structs of layer_size bytes) and
 * fetches the n tensors t of every layer into it, layer by layer in
 * table order (learned_get); KVT_EPOLICY with the reason of the first
 * missing or misshapen one, or KVT_ENOMEM.
 */
int learned_get_layers(struct policy *p, size_t layer_size,
                       const struct learned_tensor *t, size_t n, char *err,
                       size_t errlen);

/* The layer struct of layer (learned_get_layers filled it). */
static inline const void *learned_layer(const struct policy *p,
                                        uint32_t layer)
{
	const struct learned_priv *lp = p->priv;
	return (const char *)lp->layers + (size_t)layer * lp->layer_size;
}

/* ops->fini of the learned policies: the weights, the layer table and
 * p->priv. */
void learned_fini(struct policy *p);

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

/*
 * Fast KVzip's gate of policy p (a fastkvzip policy, policy_create) for n
 * attention inputs x [n][d_model] of one layer: score [n][n_kv], as the
 * policy stores them at arrival.  scratch: fastkvzip_gate_scratch(p, n)
 * floats.  For callers outside the daemon that need the same numbers (the
 * eval's threshold calibration, tools/eval/context/fastkvzip_gate.c).
 */
size_t fastkvzip_gate_scratch(const struct policy *p, uint32_t n);
void fastkvzip_gate(const struct policy *p, uint32_t layer, const float *x,
                    uint32_t n, float *score, float *scratch);

#endif
