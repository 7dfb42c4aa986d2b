/*
 * append_kv.c — write new K/V rows into a paged list (CPU reference); see
 * kernels.h.  Tested in kernels/cpu/kernels_test.c.
 *
 * Page layout (shm.h): page = [K: page_tokens x head_dim][V: page_tokens x
 * head_dim] in dtype dt; entry e lives in pages[e / page_tokens], row
 * e % page_tokens.  Conversion rounds to nearest even (dtype_from_f32).
 */
#include "kernels.h"

void append_kv_cpu(void *const *pages, uint32_t page_tokens,
                   uint32_t head_dim, enum kvt_dtype dt, uint32_t first,
                   const float *k, const float *v, uint32_t n)
{
	size_t esz = kvt_dtype_size(dt);
	size_t row = (size_t)head_dim * esz;
	size_t vbase = (size_t)page_tokens * row; /* V half of a page */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t e = first + i;
		char *page = pages[e / page_tokens];
		size_t r = (size_t)(e % page_tokens) * row;
		dtype_from_f32(k + (size_t)i * head_dim, dt, page + r,
		               head_dim);
		dtype_from_f32(v + (size_t)i * head_dim, dt, page + vbase + r,
		               head_dim);
	}
}
