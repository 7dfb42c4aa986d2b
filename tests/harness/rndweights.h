/*
 * rndweights.h — random seeded weights of a learned policy (kvzap MLP,
 * fastkvzip, kvpop with its learned memory's kvpop.memory) for any
 * geometry, written with weights_write, for the
 * tests and the bench that need a learned policy to run and have no
 * trained file.  Shapes per docs/weights.md; the values are uniform, so
 * only the cost and the traffic of the policy are realistic, not its
 * choices.
 */
#ifndef KVT_TH_RNDWEIGHTS_H
#define KVT_TH_RNDWEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

/* The sizes a weights file picks (docs/weights.md). */
struct th_wshape {
	uint32_t kvzap_hidden;  /* kvzap MLP hidden width */
	uint32_t fkv_dp, fkv_s; /* fastkvzip D' and sink keys S */
	uint32_t kvpop_r, kvpop_m;
};

/* The released gates' shapes: kvzap hidden 512, fastkvzip D' 16 S 16,
 * kvpop r 16 m 64 (the bench's). */
extern const struct th_wshape TH_WSHAPE_FULL;

/*
 * Writes weights of `policy` ("kvzap", "fastkvzip" or "kvpop", or a spec
 * of one: "kvpop:tokens=12,...") for all of g's layers into path, each
 * tensor uniform around its centre from (seed, tensor, element): kvzap's
 * output bias is -4, its threshold's default,
 * so about half the entries fall below it; the norms are near 1.  0, or
 * KVT_EINVAL (another policy name), KVT_ENOMEM, or weights_write's code,
 * with the reason in err.
 */
int th_random_weights(const char *policy, const struct kvt_geometry *g,
                      const struct th_wshape *sh, uint64_t seed,
                      const char *path, char *err, size_t errlen);

#endif
