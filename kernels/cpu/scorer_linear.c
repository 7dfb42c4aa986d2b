/*
 * scorer_linear.c — y = x W^T + b for a batch of tokens (CPU reference,
 * KVzap-Linear); see kernels.h.  Tested in kernels/cpu/kernels_test.c.
 *
 * y is seeded with the bias and one sgemm adds x W^T (beta = 1), so the
 * bias costs no second pass and W stays in its PyTorch [d_out][d_in]
 * layout (TransB).
 */
#include "kernels.h"

#include <cblas.h>
#include <string.h>

void scorer_linear_cpu(const float *x, uint32_t n, uint32_t d_in,
                       const float *W, const float *b, uint32_t d_out,
                       float *y)
{
	if (n == 0 || d_out == 0)
		return;
	for (uint32_t i = 0; i < n; i++) {
		if (b)
			memcpy(y + (size_t)i * d_out, b, d_out * sizeof(float));
		else
			memset(y + (size_t)i * d_out, 0, d_out * sizeof(float));
	}
	if (d_in == 0)
		return;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)d_out,
	            (int)d_in, 1.0f, x, (int)d_in, W, (int)d_in, 1.0f, y,
	            (int)d_out);
}
