/*
 * fill.cu — the cuda backend's `fill_words` op (backend.h, ABI 5): one
 * value stored at a pattern of word offsets in many rows of a device
 * buffer, the pattern and the row offsets staged in one of the context's
 * pinned slots (ops.cu), so a call costs one small upload and one launch
 * whatever the number of rows.  The daemon marks the staging rows of the
 * positions a sequence may append next "never staged" with it (tenant
 * sync, docs/cuda.md), which on the host is a store per marked float.
 */
#include <string.h>

#include "backend_cuda.cuh"

#define BC_FILL_THREADS 128

/* Block b strides over rows; its threads over the pattern. */
__global__ void bc_fill_kernel(char *dev, uint32_t value,
                               const uint32_t *pattern, uint32_t n_words,
                               const uint64_t *rows, uint32_t n_rows)
{
	for (uint32_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
		uint32_t *row = (uint32_t *)(dev + rows[r]);
		for (uint32_t w = threadIdx.x; w < n_words; w += blockDim.x)
			row[pattern[w]] = value;
	}
}

static int bc_fill_words_locked(struct bc_ctx *c, void *dev, uint32_t value,
                                const uint32_t *pattern, uint32_t n_words,
                                const uint64_t *rows, uint32_t n_rows,
                                cudaStream_t s)
{
	for (uint32_t r = 0; r < n_rows; r++)
		if (rows[r] % 4) {
			bc_note("fill_words: row %u at byte %llu is not in 4-byte "
			        "words", r, (unsigned long long)rows[r]);
			return KVT_EINVAL;
		}
	size_t rbytes = (size_t)n_rows * sizeof(uint64_t);
	size_t need = rbytes + (size_t)n_words * sizeof(uint32_t);
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	int rv = bc_stage_take(c, need, s, &st);
	if (rv)
		return rv;
	memcpy(st->h, rows, rbytes);
	memcpy(st->h + rbytes, pattern, (size_t)n_words * sizeof(uint32_t));
	if ((rv = bc_stage_send(c, st, need, s)))
		return rv;
	unsigned blocks = n_rows < 1024 ? n_rows : 1024;
	KVT_LAUNCH(bc_fill_kernel, blocks, BC_FILL_THREADS, 0, s, (char *)dev,
	           value, (const uint32_t *)(st->d + rbytes), n_words,
	           (const uint64_t *)st->d, n_rows);
	cudaError_t e = cudaGetLastError();
	cudaError_t e2 = cudaEventRecord(st->used, s);
	if (e != cudaSuccess)
		return bc_cuda(e, "fill kernel");
	return bc_cuda(e2, "cudaEventRecord");
}

int bc_fill_words(void *ctx, void *dev, uint32_t value,
                  const uint32_t *pattern, uint32_t n_words,
                  const uint64_t *rows, uint32_t n_rows, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n_rows || !n_words)
		return 0;
	if (!dev || !pattern || !rows)
		return KVT_EINVAL;
	pthread_mutex_lock(&c->lock);
	int rv = bc_fill_words_locked(c, dev, value, pattern, n_words, rows,
	                              n_rows, (cudaStream_t)stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
