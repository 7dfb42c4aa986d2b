/*
 * scorer.cu — the cuda backend's learned scorers (backend.h, ABI 5: ops
 * scorer_new, scorer_free, scorer_run): a policy's per-layer linear or MLP
 * scorer (policy.h's struct policy_scorer, KVzap's) with its weights in
 * device memory, run on rows of x that already are device memory (the
 * tenant's device staging), through scorer_linear_cuda / scorer_mlp_cuda
 * (kernels/cuda/).  Only the scores come back: 4 bytes per row and KV
 * head, where staging x on the host cost 4 * d_model per row.
 *
 * A scorer belongs to one tenant, whose syncs run one at a time, so it
 * holds its own cuBLAS handle and output scratch and takes no context
 * lock.  Test: kvtrim-cuda-tests backend_scorer (against the CPU kernels).
 */
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "scorer_linear.cuh"
#include "scorer_mlp.cuh"

struct bc_scorer {
	uint32_t n_layers, d_in, hidden, d_out;
	float *w;          /* device: every layer's W1 b1 W2 b2, packed */
	uint64_t per_layer; /* floats of one layer in w */
	cublasHandle_t blas;
	float *y, *hs;     /* device scratch [cap][d_out], [cap][hidden] */
	uint64_t cap;      /* rows */
};

static uint64_t bc_sc_o1(const struct bc_scorer *s)
{
	return s->hidden ? s->hidden : s->d_out;
}

void bc_scorer_free(void *ctx, void *sp)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	struct bc_scorer *s = (struct bc_scorer *)sp;
	if (!s)
		return;
	cudaSetDevice(c->device);
	if (s->blas)
		cublasDestroy(s->blas);
	cudaFree(s->w);
	cudaFree(s->y);
	cudaFree(s->hs);
	free(s);
}

int bc_scorer_new(void *ctx, const struct kvt_backend_scorer *d, void **out)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	*out = NULL;
	if (!d || !d->n_layers || !d->d_in || !d->d_out || !d->W1 || !d->b1 ||
	    (d->hidden && (!d->W2 || !d->b2)))
		return KVT_EINVAL;
	struct bc_scorer *s = (struct bc_scorer *)calloc(1, sizeof(*s));
	if (!s)
		return KVT_ENOMEM;
	s->n_layers = d->n_layers;
	s->d_in = d->d_in;
	s->hidden = d->hidden;
	s->d_out = d->d_out;
	uint64_t o1 = bc_sc_o1(s);
	s->per_layer = o1 * d->d_in + o1 +
	               (d->hidden ? (uint64_t)d->d_out * d->hidden + d->d_out : 0);
	int rv = bc_cuda(cudaSetDevice(c->device), "cudaSetDevice");
	if (!rv)
		rv = bc_cuda(cudaMalloc((void **)&s->w, s->per_layer * d->n_layers *
		                                                sizeof(float)),
		             "cudaMalloc");
	for (uint32_t l = 0; !rv && l < d->n_layers; l++) {
		float *w = s->w + l * s->per_layer;
		const struct {
			const float *src;
			uint64_t n;
		} part[4] = {
			{d->W1[l], o1 * d->d_in},
			{d->b1[l], o1},
			{d->hidden ? d->W2[l] : NULL, (uint64_t)d->d_out * d->hidden},
			{d->hidden ? d->b2[l] : NULL, d->hidden ? d->d_out : 0},
		};
		for (int k = 0; !rv && k < 4; k++) {
			if (part[k].n && !part[k].src)
				rv = KVT_EINVAL;
			else if (part[k].n) {
				rv = bc_cuda(cudaMemcpy(w, part[k].src,
				                        part[k].n * sizeof(float),
				                        cudaMemcpyHostToDevice),
				             "weights upload");
				bc_count(c, part[k].n * sizeof(float), 0);
			}
			w += part[k].n;
		}
	}
	if (!rv && cublasCreate(&s->blas) != CUBLAS_STATUS_SUCCESS) {
		bc_note("cublasCreate failed");
		rv = KVT_ESYS;
	}
	if (rv) {
		bc_scorer_free(ctx, s);
		return rv;
	}
	*out = s;
	return 0;
}

int bc_scorer_run(void *ctx, void *sp, const struct kvt_backend_score_job *jobs,
                  uint32_t n, float *out, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	struct bc_scorer *s = (struct bc_scorer *)sp;
	cudaStream_t st = (cudaStream_t)stream;
	if (!s || (n && (!jobs || !out)))
		return KVT_EINVAL;
	uint64_t rows = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (jobs[i].layer >= s->n_layers || (jobs[i].n && !jobs[i].x)) {
			bc_note("scorer_run: job %u: layer %u of %u", i,
			        jobs[i].layer, s->n_layers);
			return KVT_EINVAL;
		}
		rows += jobs[i].n;
	}
	if (!rows)
		return 0;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	if (rows > s->cap) {
		uint64_t cap = s->cap ? s->cap : 256;
		while (cap < rows)
			cap *= 2;
		/* the last run synchronised its stream before returning */
		cudaFree(s->y);
		cudaFree(s->hs);
		s->y = s->hs = NULL;
		s->cap = 0;
		BC_CALL(cudaMalloc((void **)&s->y, cap * s->d_out * sizeof(float)),
		        "cudaMalloc");
		if (s->hidden)
			BC_CALL(cudaMalloc((void **)&s->hs,
			                   cap * s->hidden * sizeof(float)),
			        "cudaMalloc");
		s->cap = cap;
	}
	uint64_t at = 0, o1 = bc_sc_o1(s);
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_score_job *j = &jobs[i];
		if (!j->n)
			continue;
		const float *W1 = s->w + j->layer * s->per_layer;
		const float *b1 = W1 + o1 * s->d_in;
		const float *W2 = b1 + o1, *b2 = W2 + (uint64_t)s->d_out * s->hidden;
		int rv = s->hidden
		         ? scorer_mlp_cuda(s->blas, j->x, j->n, s->d_in, W1, b1,
		                           s->hidden, W2, b2, s->d_out,
		                           s->y + at * s->d_out, s->hs, st)
		         : scorer_linear_cuda(s->blas, j->x, j->n, s->d_in, W1, b1,
		                              s->d_out, s->y + at * s->d_out, st);
		if (rv) {
			bc_note("scorer_run: job %u (layer %u, %u rows) failed (%d)",
			        i, j->layer, j->n, rv);
			return rv;
		}
		at += j->n;
	}
	BC_CALL(cudaMemcpyAsync(out, s->y, rows * s->d_out * sizeof(float),
	                        cudaMemcpyDeviceToHost, st),
	        "cudaMemcpyAsync");
	bc_count(c, 0, rows * s->d_out * sizeof(float));
	BC_CALL(cudaStreamSynchronize(st), "scorer_run");
	return 0;
}
