/*
 * scorer.cu — the cuda backend's learned scorers (backend.h ops
 * scorer_new, scorer_free, scorer_run): a policy's per-layer scorer of x
 * (struct kvt_backend_scorer: KVzap's linear or MLP surrogate, Fast KVzip's
 * sink gate) with its weights in device memory, run on rows of x that
 * already are device memory (the tenant's device staging).  Only the
 * scores come back: 4 bytes per row and KV head, where staging x on the
 * host cost 4 * d_model per row.
 *
 * scorer_run does all its jobs (every sequence and layer of a sync) at
 * once: their rows are packed one after the other in the scratch
 * matrices, each GEMM stage is one grouped cuBLAS call with one problem
 * per job (the call scorer_linear_cpu makes for that job), and each
 * elementwise stage one kernel over every row (kernels/cuda/
 * scorer_linear_batch_cuda, scorer_mlp_batch_cuda, sink_gate_batch_cuda).
 * Launches per run: linear 2, MLP 4, sink gate 3, whatever the jobs, and
 * one more (bc_sc_scatter) where jobs name a device copy of their scores
 * (kvt_backend_score_job.dev: a device rule reads them there); the
 * rows' segments, the GEMMs' pointer arrays and those copies' addresses
 * go up in one copy.
 *
 * A scorer holds its own cuBLAS handle and scratch and takes no context
 * lock: its caller runs it from one thread at a time (the daemon serialises
 * the runs of a scorer that several tenants share, tenant_scorer.c).
 * Tests: kvtrim-cuda-tests backend_scorer (against the CPU kernels).
 */
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "blas.cuh"
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
	struct blas_grouped g1, g2; /* host halves of the GEMM stages */
	/* one run's segments, then its pointer arrays: host, then device */
	void *hmeta, *dmeta;
	uint64_t meta_cap; /* bytes of each */
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
	cudaFree(s->dmeta);
	free(s->hmeta);
	blas_grouped_free(&s->g1);
	blas_grouped_free(&s->g2);
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

/* Pointers per job in the GEMM stages' arrays (W, x, y per product). */
static uint32_t bc_sc_ptrs(const struct kvt_backend_scorer *d)
{
	return d->kind == KVT_SCORER_LINEAR ? 3 : 6;
}

/* Checks every job before anything runs; *nseg, *rows: the non-empty jobs
 * and their rows. */
static int bc_sc_check(const struct bc_scorer *s,
                       const struct kvt_backend_score_job *jobs, uint32_t n,
                       uint32_t *nseg, uint64_t *rows)
{
	*nseg = 0;
	*rows = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (jobs[i].layer >= s->d.n_layers || (jobs[i].n && !jobs[i].x)) {
			bc_note("scorer_run: job %u: layer %u of %u, %u rows "
			        "at %p",
			        i, jobs[i].layer, s->d.n_layers, jobs[i].n,
			        (const void *)jobs[i].x);
			return KVT_EINVAL;
		}
		*nseg += jobs[i].n != 0;
		*rows += jobs[i].n;
	}
	if (*rows > UINT32_MAX) {
		bc_note("scorer_run: %llu rows in one run",
		        (unsigned long long)*rows);
		return KVT_EINVAL;
	}
	return 0;
}

/* Makes the scratch hold rows (grown by doubling; the last run synchronised
 * its stream before returning, so nothing uses the old one) and the meta
 * buffers meta bytes. */
static int bc_sc_grow(struct bc_scorer *s, uint64_t rows, uint64_t meta)
{
	uint64_t sr = bc_sc_scratch(&s->d);
	if (rows > s->cap) {
		uint64_t cap = s->cap ? s->cap : 256;
		while (cap < rows)
			cap *= 2;
		cudaFree(s->y);
		cudaFree(s->hs);
		s->y = s->hs = NULL;
		s->cap = 0;
		BC_CALL(cudaMalloc((void **)&s->y,
		                   cap * s->d.d_out * sizeof(float)),
		        "cudaMalloc");
		if (sr)
			BC_CALL(cudaMalloc((void **)&s->hs, cap * sr * sizeof(float)),
			        "cudaMalloc");
		s->cap = cap;
	}
	if (meta > s->meta_cap) {
		uint64_t cap = s->meta_cap ? s->meta_cap : 4096;
		while (cap < meta)
			cap *= 2;
		void *h = realloc(s->hmeta, cap);
		if (!h)
			return KVT_ENOMEM;
		s->hmeta = h;
		cudaFree(s->dmeta);
		s->dmeta = NULL;
		s->meta_cap = 0;
		BC_CALL(cudaMalloc(&s->dmeta, cap), "cudaMalloc");
		s->meta_cap = cap;
	}
	return 0;
}

/* Lays out the run on the host: the segments (hmeta), then per GEMM stage
 * the W, x and output pointer arrays, each nseg long (the sink gate's
 * query problems, then its key problems: 2 nseg long), then the
 * segments' device copies (dev, nseg long), with g1 / g2 the stages'
 * groups in the same order; *ndev: the segments with a device copy. */
static int bc_sc_plan(struct bc_scorer *s,
                      const struct kvt_backend_score_job *jobs, uint32_t n,
                      uint32_t nseg, uint64_t rows, uint32_t *ndev)
{
	const struct kvt_backend_scorer *d = &s->d;
	struct blas_seg *seg = (struct blas_seg *)s->hmeta;
	const float **p = (const float **)(seg + nseg);
	const uint32_t P = d->kind == KVT_SCORER_SINK_GATE ? 2 * nseg : nseg;
	const uint64_t qc = (uint64_t)d->d_out * d->G * d->dp, kc =
		(uint64_t)d->d_out * d->dp, hid = d->hidden;
	int rv = blas_grouped_reset(&s->g1, P);
	if (!rv)
		rv = blas_grouped_reset(&s->g2, P);
	if (rv)
		return rv;
	uint32_t j = 0, row = 0;
	float *K = s->hs ? s->hs + rows * qc : NULL; /* the gate's keys */
	float **dv = (float **)(p + (size_t)bc_sc_ptrs(d) * nseg);
	*ndev = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_score_job *jb = &jobs[i];
		if (!jb->n)
			continue;
		const float *w = s->w + jb->layer * s->per_layer;
		seg[j].row0 = row;
		seg[j].layer = jb->layer;
		dv[j] = jb->dev;
		*ndev += jb->dev != NULL;
		switch (d->kind) {
		case KVT_SCORER_LINEAR:
			p[j] = w + s->off[0];
			p[P + j] = jb->x;
			p[2 * P + j] = s->y + (uint64_t)row * d->d_out;
			rv = blas_grouped_add(&s->g1, jb->n, d->d_in, d->d_out,
			                      1.f);
			break;
		case KVT_SCORER_MLP:
			p[j] = w + s->off[0];
			p[P + j] = jb->x;
			p[2 * P + j] = p[4 * P + j] = s->hs + row * hid;
			p[3 * P + j] = w + s->off[2];
			p[5 * P + j] = s->y + (uint64_t)row * d->d_out;
			rv = blas_grouped_add(&s->g1, jb->n, d->d_in, d->hidden,
			                      1.f);
			if (!rv)
				rv = blas_grouped_add(&s->g2, jb->n, d->hidden,
				                      d->d_out, 1.f);
			break;
		default: /* queries in [0, nseg), keys in [nseg, 2 nseg) */
			p[j] = w + s->off[0];
			p[nseg + j] = w + s->off[2];
			p[P + j] = p[P + nseg + j] = jb->x;
			p[2 * P + j] = s->hs + row * qc;
			p[2 * P + nseg + j] = K + row * kc;
			rv = blas_grouped_add(&s->g1, jb->n, d->d_in,
			                      (uint32_t)qc, 1.f);
		}
		if (rv)
			return rv;
		row += jb->n;
		j++;
	}
	/* the gate's key problems follow all its query problems */
	for (uint32_t i = 0; d->kind == KVT_SCORER_SINK_GATE && i < n; i++)
		if (jobs[i].n &&
		    (rv = blas_grouped_add(&s->g1, jobs[i].n, d->d_in,
		                           (uint32_t)kc, 1.f)))
			return rv;
	return 0;
}

/* The run's launches, on the uploaded segments and pointer arrays. */
static int bc_sc_launch(struct bc_scorer *s, uint32_t nseg, uint64_t rows,
                        cudaStream_t st)
{
	const struct kvt_backend_scorer *d = &s->d;
	const struct blas_seg *seg = (const struct blas_seg *)s->dmeta;
	const float *const *p = (const float *const *)(seg + nseg);
	const float *t[KVT_SCORER_TENSORS]; /* layer 0's tensors */
	for (uint32_t k = 0; k < KVT_SCORER_TENSORS; k++)
		t[k] = s->w + s->off[k];
	switch (d->kind) {
	case KVT_SCORER_LINEAR:
		return scorer_linear_batch_cuda(s->blas, &s->g1, p, seg, nseg,
		                                rows, t[1], s->per_layer,
		                                d->d_out, s->y, st);
	case KVT_SCORER_MLP:
		return scorer_mlp_batch_cuda(s->blas, &s->g1, &s->g2, p, seg,
		                             nseg, rows, t[1], d->hidden, t[3],
		                             d->d_out, s->per_layer, s->hs,
		                             s->y, st);
	default:
		return sink_gate_batch_cuda(s->blas, &s->g1, p, seg, nseg, rows,
		                            d->d_out, d->G, d->dp, d->S, t[1],
		                            t[3], t[4], t[5], t[6],
		                            s->per_layer, s->hs, s->y, st);
	}
}

/* The scores of every segment with a device copy (dv[j]) into it, one
 * thread a score: y [rows][d_out], packed as the segments say. */
static __global__ void bc_sc_scatter(const struct blas_seg *seg,
                                     float *const *dv, uint32_t nseg,
                                     uint64_t rows, uint32_t d_out,
                                     const float *y)
{
	const uint64_t tot = rows * d_out;
	for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     e < tot; e += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t r = (uint32_t)(e / d_out);
		const uint32_t j = blas_seg_find(seg, nseg, r);
		if (dv[j])
			dv[j][(uint64_t)(r - seg[j].row0) * d_out + e % d_out] = y[e];
	}
}

int bc_scorer_run(void *ctx, void *sp, const struct kvt_backend_score_job *jobs,
                  uint32_t n, float *out, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	struct bc_scorer *s = (struct bc_scorer *)sp;
	cudaStream_t st = (cudaStream_t)stream;
	if (!s || (n && !jobs))
		return KVT_EINVAL;
	uint32_t nseg;
	uint64_t rows;
	int rv = bc_sc_check(s, jobs, n, &nseg, &rows);
	if (rv || !rows)
		return rv;
	for (uint32_t i = 0; !out && i < n; i++)
		if (jobs[i].n && !jobs[i].dev) {
			bc_note("scorer_run: job %u: no host output and no "
			        "device copy", i);
			return KVT_EINVAL;
		}
	const uint64_t meta =
		(uint64_t)nseg * (sizeof(struct blas_seg) +
		                  (bc_sc_ptrs(&s->d) + 1) * sizeof(float *));
	uint32_t ndev = 0;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	if ((rv = bc_sc_grow(s, rows, meta)) ||
	    (rv = bc_sc_plan(s, jobs, n, nseg, rows, &ndev))) {
		bc_note("scorer_run: no room for %llu rows in %u jobs (%d)",
		        (unsigned long long)rows, nseg, rv);
		return rv;
	}
	BC_CALL(cudaMemcpyAsync(s->dmeta, s->hmeta, meta,
	                        cudaMemcpyHostToDevice, st),
	        "cudaMemcpyAsync");
	bc_count(c, meta, 0);
	if ((rv = bc_sc_launch(s, nseg, rows, st))) {
		bc_note("scorer_run: %u jobs of %llu rows failed (%d)", nseg,
		        (unsigned long long)rows, rv);
		cudaStreamSynchronize(st); /* the meta buffers are reused */
		return rv;
	}
	if (ndev) {
		const struct blas_seg *seg = (const struct blas_seg *)s->dmeta;
		float *const *dv = (float *const *)(seg + nseg) +
		                   (size_t)bc_sc_ptrs(&s->d) * nseg;
		const uint64_t tot = rows * s->d.d_out;
		const uint64_t b = (tot + 255) / 256;
		KVT_LAUNCH(bc_sc_scatter, b > 4096 ? 4096 : (uint32_t)b, 256, 0,
		           st, seg, dv, nseg, rows, s->d.d_out, s->y);
		BC_CALL(cudaGetLastError(), "scorer_run scatter");
	}
	if (out) {
		BC_CALL(cudaMemcpyAsync(out, s->y,
		                        rows * s->d.d_out * sizeof(float),
		                        cudaMemcpyDeviceToHost, st),
		        "cudaMemcpyAsync");
		bc_count(c, 0, rows * s->d.d_out * sizeof(float));
	}
	BC_CALL(cudaStreamSynchronize(st), "scorer_run");
	return 0;
}
