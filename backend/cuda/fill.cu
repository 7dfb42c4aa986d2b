/*
 * fill.cu — the cuda backend's `fill_words` op (backend.h): one
 * value stored at a pattern of word offsets in many rows of a device
 * buffer, the rows given as runs (blocks of evenly spaced rows), the
 * pattern and the runs staged in one of the context's pinned slots
 * (ops.cu), so a call costs one small upload and one launch whatever the
 * number of rows.  The daemon marks the staging rows of the
 * positions a sequence may append next "never staged" with it (tenant
 * sync, docs/cuda.md), which on the host is a store per marked float.
 */
#include <string.h>

#include "backend_cuda.cuh"

#define BC_FILL_THREADS 128

/* Blocks stride over the rows of all runs (flattened: run i holds
 * blocks x rows rows, in order); threads over the pattern. */
__global__ void bc_fill_kernel(char *dev, uint32_t value,
                               const uint32_t *pattern, uint32_t n_words,
                               const kvt_backend_fill_run *runs,
                               uint32_t n_runs, uint64_t total)
{
	for (uint64_t x = blockIdx.x; x < total; x += gridDim.x) {
		uint64_t k = x;
		uint32_t i = 0;
		while (i < n_runs &&
		       k >= (uint64_t)runs[i].rows * runs[i].blocks) {
			k -= (uint64_t)runs[i].rows * runs[i].blocks;
			i++;
		}
		const kvt_backend_fill_run r = runs[i];
		uint32_t *row = (uint32_t *)(dev + r.first +
		                             (k / r.rows) * r.block_stride +
		                             (k % r.rows) * r.row_stride);
		for (uint32_t w = threadIdx.x; w < n_words; w += blockDim.x)
			row[pattern[w]] = value;
	}
}

static int bc_fill_words_locked(struct bc_ctx *c, void *dev, uint32_t value,
                                const uint32_t *pattern, uint32_t n_words,
                                const struct kvt_backend_fill_run *runs,
                                uint32_t n_runs, cudaStream_t s)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < n_runs; i++) {
		const struct kvt_backend_fill_run *r = &runs[i];
		if (r->first % 4 || r->block_stride % 4 || r->row_stride % 4) {
			bc_note("fill_words: run %u (at byte %llu) is not in 4-byte "
			        "words", i, (unsigned long long)r->first);
			return KVT_EINVAL;
		}
		total += (uint64_t)r->rows * r->blocks;
	}
	if (!total)
		return 0;
	size_t rbytes = (size_t)n_runs * sizeof(*runs);
	size_t need = rbytes + (size_t)n_words * sizeof(uint32_t);
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	int rv = bc_stage_take(c, need, s, &st);
	if (rv)
		return rv;
	memcpy(st->h, runs, rbytes);
	memcpy(st->h + rbytes, pattern, (size_t)n_words * sizeof(uint32_t));
	if ((rv = bc_stage_send(c, st, need, s)))
		return rv;
	unsigned blocks = total < 1024 ? (unsigned)total : 1024;
	KVT_LAUNCH(bc_fill_kernel, blocks, BC_FILL_THREADS, 0, s, (char *)dev,
	           value, (const uint32_t *)(st->d + rbytes), n_words,
	           (const kvt_backend_fill_run *)st->d, n_runs, total);
	cudaError_t e = cudaGetLastError();
	cudaError_t e2 = cudaEventRecord(st->used, s);
	if (e != cudaSuccess)
		return bc_cuda(e, "fill kernel");
	return bc_cuda(e2, "cudaEventRecord");
}

int bc_fill_words(void *ctx, void *dev, uint32_t value,
                  const uint32_t *pattern, uint32_t n_words,
                  const struct kvt_backend_fill_run *runs, uint32_t n_runs,
                  void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n_runs || !n_words)
		return 0;
	if (!dev || !pattern || !runs)
		return KVT_EINVAL;
	pthread_mutex_lock(&c->lock);
	int rv = bc_fill_words_locked(c, dev, value, pattern, n_words, runs,
	                              n_runs, (cudaStream_t)stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
