/*
 * select_threshold.c — drop unprotected entries scoring below tau (CPU
 * reference); see kernels.h.  Tested in kernels/cpu/kernels_test.c.
 *
 * Written as !(score >= tau) so that NaN, which compares false with
 * everything, is dropped too: a scorer that produced NaN has no opinion
 * worth keeping memory for.  Equality keeps the entry.
 */
#include "kernels.h"

uint32_t select_threshold_cpu(const float *score, const uint8_t *protect,
                              uint32_t n, float tau, uint8_t *drop)
{
	uint32_t marked = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t d = (!protect || !protect[i]) && !(score[i] >= tau);
		drop[i] = d;
		marked += d;
	}
	return marked;
}
