/*
 * key_norms.cu — the cuda backend's `key_norms` op (backend.h): the
 * L2 norms of the new entries' keys that knorm scores by, computed where
 * the keys are, so that only the norms (4 bytes an entry) come to the
 * host instead of the K halves of every page of every list (what the
 * attention policies still stage, read_regions).
 *
 * One thread per entry: its K row through the device table record and the
 * daemon's device array of chunk bases (bc_entry_row, as compact_drops), the K
 * row converted to float and squared and summed in double in index
 * order, sqrt, rounded to float.  The products of two floats are exact in
 * double and the sum runs in the same order as policies/knorm.c's, so the
 * norms are bit-identical to the cpu backend's (a fused multiply-add of
 * an exact product changes nothing).  The jobs are staged in one of the
 * context's pinned slots (ops.cu) under its lock; the norms land in the
 * slot's device buffer after the jobs and come back in one copy.
 * Test: kvtrim-cuda-tests backend_key_norms.
 */
#include <math.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "common.cuh"

#define BC_NORM_THREADS 128

template <typename T>
__global__ void bc_norm_kernel(const kvt_backend_paged pg, uint32_t head_dim,
                               const kvt_backend_norm_job *jobs, uint32_t n_jobs,
                               float *out)
{
	const uint32_t j = blockIdx.x;
	if (j >= n_jobs)
		return;
	const kvt_backend_norm_job jb = jobs[j];
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)((const char *)pg.records +
		                                 (uint64_t)jb.record * pg.list_stride);
	for (uint32_t k = threadIdx.x; k < jb.n; k += blockDim.x) {
		const T *row = (const T *)bc_entry_row(pg, r, jb.first + k);
		float v = nanf("");
		if (row) {
			double ss = 0.0;
			for (uint32_t d = 0; d < head_dim; d++) {
				double x = (double)common_to_f(row[d]);
				ss += x * x;
			}
			v = (float)sqrt(ss);
		}
		out[jb.out_off + (uint64_t)k * jb.out_stride] = v;
	}
}

static int bc_key_norms_locked(struct bc_ctx *c, const struct kvt_backend_paged *pg,
                               uint32_t n_records, enum kvt_dtype dt,
                               uint32_t hd, const struct kvt_backend_norm_job *jobs,
                               uint32_t n, float *out, uint32_t out_floats,
                               cudaStream_t s)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_norm_job *j = &jobs[i];
		uint64_t last = j->n ? j->out_off + (uint64_t)(j->n - 1) *
		                                          j->out_stride
		                     : 0;
		if (j->record >= n_records || (j->n && last >= out_floats)) {
			bc_note("key_norms: job %u: record %u of %u, output %llu of "
			        "%u", i, j->record, n_records,
			        (unsigned long long)last, out_floats);
			return KVT_EINVAL;
		}
	}
	size_t jb = ((size_t)n * sizeof(*jobs) + 15) & ~(size_t)15;
	size_t need = jb + (size_t)out_floats * sizeof(float);
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	int rv = bc_stage_take(c, need, s, &st);
	if (rv)
		return rv;
	memcpy(st->h, jobs, (size_t)n * sizeof(*jobs));
	if ((rv = bc_stage_send(c, st, jb, s)))
		return rv;
	const kvt_backend_norm_job *dj = (const kvt_backend_norm_job *)st->d;
	float *dout = (float *)(st->d + jb);
	const kvt_backend_paged p = *pg;
	if (dt == KVT_DTYPE_F16)
		KVT_LAUNCH(bc_norm_kernel<f16_t>, n, BC_NORM_THREADS, 0, s, p, hd,
		           dj, n, dout);
	else if (dt == KVT_DTYPE_BF16)
		KVT_LAUNCH(bc_norm_kernel<bf16_t>, n, BC_NORM_THREADS, 0, s, p, hd,
		           dj, n, dout);
	else
		KVT_LAUNCH(bc_norm_kernel<float>, n, BC_NORM_THREADS, 0, s, p, hd,
		           dj, n, dout);
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		e = cudaMemcpyAsync(out, dout, (size_t)out_floats * sizeof(float),
		                    cudaMemcpyDeviceToHost, s);
	if (e == cudaSuccess)
		bc_count(c, 0, (uint64_t)out_floats * sizeof(float));
	cudaError_t e2 = cudaEventRecord(st->used, s);
	if (e == cudaSuccess)
		e = e2;
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(s);
	return bc_cuda(e, "key_norms");
}

int bc_key_norms(void *ctx, const struct kvt_backend_paged *pg,
                 uint32_t n_records, enum kvt_dtype dtype, uint32_t head_dim,
                 const struct kvt_backend_norm_job *jobs, uint32_t n,
                 float *out, uint32_t out_floats, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n || !out_floats)
		return 0;
	if (!pg || !jobs || !out || !pg->records || !pg->chunk_bases ||
	    !pg->page_tokens || !pg->pages_per_chunk || !head_dim ||
	    (dtype != KVT_DTYPE_F32 && dtype != KVT_DTYPE_F16 &&
	     dtype != KVT_DTYPE_BF16))
		return KVT_EINVAL;
	pthread_mutex_lock(&c->lock);
	int rv = bc_key_norms_locked(c, pg, n_records, dtype, head_dim, jobs, n,
	                             out, out_floats, (cudaStream_t)stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
