/*
 * scorer_mlp.c — y = W2 gelu(W1 x + b1) + b2 for a batch of tokens (CPU
 * reference, KVzap-MLP); see kernels.h.  Tested in
 * kernels/cpu/kernels_test.c.
 *
 * Both layers are one sgemm each (through scorer_linear_cpu); the GELU is
 * the exact erf form, as nn.GELU() with its default approximate='none',
 * because the released checkpoints were trained with it and the tanh form
 * differs by up to ~1e-3 per unit.
 */
#include "kernels.h"

#include <math.h>

void scorer_mlp_cpu(const float *x, uint32_t n, uint32_t d_in,
                    const float *W1, const float *b1, uint32_t hidden,
                    const float *W2, const float *b2, uint32_t d_out,
                    float *y, float *hscratch)
{
	const float inv_sqrt2 = 0.70710678118654752440f;
	size_t nh = (size_t)n * hidden;

	scorer_linear_cpu(x, n, d_in, W1, b1, hidden, hscratch);
	for (size_t i = 0; i < nh; i++) {
		float z = hscratch[i];
		hscratch[i] = 0.5f * z * (1.0f + erff(z * inv_sqrt2));
	}
	scorer_linear_cpu(hscratch, n, hidden, W2, b2, d_out, y);
}
