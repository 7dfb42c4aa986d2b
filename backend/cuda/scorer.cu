/*
 * scorer.cu — the cuda backend's learned scorers (backend.h ops
 * scorer_new, scorer_free, scorer_run): a policy's per-layer scorer of x
 * (struct kvt_backend_scorer: KVzap's linear or MLP surrogate, Fast KVzip's
 * sink gate) with its weights in device memory, run on rows of x that
 * already are device memory (the tenant's device staging), through
 * scorer_linear_cuda / scorer_mlp_cuda / sink_gate_cuda (kernels/cuda/).  Only the scores come back: 4 bytes per row and KV
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
#include "sink_gate.cuh"

struct bc_scorer {
	struct kvt_backend_scorer d;  /* kind and sizes (w unused) */
	float *w;                     /* device: every layer's tensors, packed */
	uint64_t off[KVT_SCORER_TENSORS]; /* floats before tensor k in a layer */
	uint64_t per_layer;           /* floats of one layer in w */
	cublasHandle_t blas;
	float *y, *hs;      /* device scratch [cap][d_out], [cap][scratch_row] */
	uint64_t cap;       /* rows */
};

/* Scratch floats per row: the MLP's hidden layer, the gate's projected
 * queries and keys (kernels/cuda/sink_gate.cuh). */
static uint64_t bc_sc_scratch(const struct kvt_backend_scorer *d)
{
	if (d->kind == KVT_SCORER_MLP)
		return d->hidden;
	if (d->kind == KVT_SCORER_SINK_GATE)
		return (uint64_t)d->d_out * (d->G + 1) * d->dp;
	return 0;
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
	if (!d || !d->n_layers || !d->d_in || !d->d_out || !d->w ||
	    d->kind < KVT_SCORER_LINEAR || d->kind > KVT_SCORER_SINK_GATE ||
	    (d->kind == KVT_SCORER_MLP && !d->hidden) ||
	    (d->kind == KVT_SCORER_SINK_GATE && (!d->G || !d->dp || !d->S))) {
		bc_note("scorer_new: no such scorer (kind %u)", d ? d->kind : 0);
		return KVT_EINVAL;
	}
	struct bc_scorer *s = (struct bc_scorer *)calloc(1, sizeof(*s));
	if (!s)
		return KVT_ENOMEM;
	s->d = *d;
	s->d.w = NULL;
	for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++) {
		s->off[k] = s->per_layer;
		s->per_layer += kvt_scorer_floats(d, k);
	}
	int rv = bc_cuda(cudaSetDevice(c->device), "cudaSetDevice");
	if (!rv)
		rv = bc_cuda(cudaMalloc((void **)&s->w, s->per_layer * d->n_layers *
		                                                sizeof(float)),
		             "cudaMalloc");
	for (uint32_t l = 0; !rv && l < d->n_layers; l++)
		for (uint32_t k = 0; !rv && k < KVT_SCORER_TENSORS; k++) {
			uint64_t n = kvt_scorer_floats(d, k);
			const float *src = d->w[(size_t)l * KVT_SCORER_TENSORS + k];
			if (!n)
				continue;
			if (!src) {
				bc_note("scorer_new: layer %u lacks tensor %u", l, k);
				rv = KVT_EINVAL;
				break;
			}
			rv = bc_cuda(cudaMemcpy(s->w + l * s->per_layer + s->off[k],
			                        src, n * sizeof(float),
			                        cudaMemcpyHostToDevice),
			             "weights upload");
			bc_count(c, n * sizeof(float), 0);
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

/* One job's launches: y [n][d_out] from x [n][d_in] with layer's weights. */
static int bc_score_job(struct bc_scorer *s, const float *w, const float *x,
                        uint32_t n, float *y, cudaStream_t st)
{
	const struct kvt_backend_scorer *d = &s->d;
	const float *t[KVT_SCORER_TENSORS];
	for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++)
		t[k] = w + s->off[k];
	switch (d->kind) {
	case KVT_SCORER_LINEAR:
		return scorer_linear_cuda(s->blas, x, n, d->d_in, t[0], t[1],
		                          d->d_out, y, st);
	case KVT_SCORER_MLP:
		return scorer_mlp_cuda(s->blas, x, n, d->d_in, t[0], t[1],
		                       d->hidden, t[2], t[3], d->d_out, y, s->hs,
		                       st);
	default:
		return sink_gate_cuda(s->blas, x, n, d->d_in, d->d_out, d->G, d->dp,
		                      d->S, t[0], t[1], t[2], t[3], t[4], t[5],
		                      t[6], y, s->hs, st);
	}
}

int bc_scorer_run(void *ctx, void *sp, const struct kvt_backend_score_job *jobs,
                  uint32_t n, float *out, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	struct bc_scorer *s = (struct bc_scorer *)sp;
	cudaStream_t st = (cudaStream_t)stream;
	if (!s || (n && (!jobs || !out)))
		return KVT_EINVAL;
	const uint32_t d_out = s->d.d_out;
	uint64_t rows = 0, sr = bc_sc_scratch(&s->d);
	for (uint32_t i = 0; i < n; i++) {
		if (jobs[i].layer >= s->d.n_layers || (jobs[i].n && !jobs[i].x)) {
			bc_note("scorer_run: job %u: layer %u of %u", i,
			        jobs[i].layer, s->d.n_layers);
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
		BC_CALL(cudaMalloc((void **)&s->y, cap * d_out * sizeof(float)),
		        "cudaMalloc");
		if (sr)
			BC_CALL(cudaMalloc((void **)&s->hs, cap * sr * sizeof(float)),
			        "cudaMalloc");
		s->cap = cap;
	}
	/* hs serves one job at a time: the jobs run in order on st */
	uint64_t at = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_score_job *j = &jobs[i];
		if (!j->n)
			continue;
		int rv = bc_score_job(s, s->w + j->layer * s->per_layer, j->x, j->n,
		                      s->y + at * d_out, st);
		if (rv) {
			bc_note("scorer_run: job %u (layer %u, %u rows) failed (%d)",
			        i, j->layer, j->n, rv);
			return rv;
		}
		at += j->n;
	}
	BC_CALL(cudaMemcpyAsync(out, s->y, rows * d_out * sizeof(float),
	                        cudaMemcpyDeviceToHost, st),
	        "cudaMemcpyAsync");
	bc_count(c, 0, rows * d_out * sizeof(float));
	BC_CALL(cudaStreamSynchronize(st), "scorer_run");
	return 0;
}
