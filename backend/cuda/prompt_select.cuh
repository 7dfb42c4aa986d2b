/*
 * prompt_select.cuh — what every device rule's call shares (struct
 * kvt_backend_rule, backend.h; entry_state.cuh's bc_es_entry): the checks
 * of a call's arguments, the copy of its output words to the host, and
 * the rounding of its scratch offsets (the rules' plan and selection:
 * batch_select.cuh).
 * Internal to libkvtrim-cuda.so; each file includes its own static copy.
 */
#ifndef KVT_CUDA_PROMPT_SELECT_CUH
#define KVT_CUDA_PROMPT_SELECT_CUH

#include "backend_cuda.cuh"

/* A scratch offset rounded up to 256 bytes. */
static inline size_t bc_ps_al(size_t b) { return (b + 255) & ~(size_t)255; }

/* KVT_EINVAL (noted) for a NULL argument, a page table the ops cannot
 * resolve through, an unknown dtype, or flags and counts beyond
 * out_words. */
static inline int bc_ps_check_call(const char *op,
                                   const struct kvt_backend_paged *pg,
                                   const void *win, uint32_t n_win,
                                   const void *lists, uint32_t n_lists,
                                   enum kvt_dtype dtype, const uint32_t *out,
                                   uint32_t out_words)
{
	if (!pg || !win || !out || (n_lists && !lists) || !pg->records ||
	    !pg->chunk_bases || !pg->page_tokens || !pg->pages_per_chunk ||
	    (dtype != KVT_DTYPE_F32 && dtype != KVT_DTYPE_F16 &&
	     dtype != KVT_DTYPE_BF16) ||
	    (uint64_t)n_win + n_lists > out_words) {
		bc_note("%s: a NULL argument, dtype %d or %u windows and %u "
		        "lists in %u words", op, (int)dtype, n_win, n_lists,
		        out_words);
		return KVT_EINVAL;
	}
	return 0;
}

/* The output words' one copy to the host after the work queued on s
 * (counted), and the wait for it. */
static inline int bc_ps_finish(struct bc_ctx *c, uint32_t *out,
                               const uint32_t *dout, uint32_t out_words,
                               cudaStream_t s, const char *op)
{
	cudaError_t e = cudaMemcpyAsync(out, dout, (size_t)out_words * 4,
	                                cudaMemcpyDeviceToHost, s);
	if (e == cudaSuccess)
		bc_count(c, 0, (uint64_t)out_words * 4);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(s);
	return bc_cuda(e, op);
}

#endif
