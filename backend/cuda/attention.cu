/*
 * attention.cu — the cuda backend's `attention` op (backend.h), what
 * kvt_attention runs on a cuda tenant: n query tokens of one (sequence,
 * layer) over its KV heads' lists, causal within the chunk, through
 * paged_attention_batch_cuda.  List (t, h) = t * n_kv + h reads KV head h
 * with length len_h + t + 1, so the kernel's layouts are kvt_attention's.
 * A small kernel first resolves page ids into addresses from the device
 * table and the client's chunk-base array, so a call moves no bytes
 * between host and device whatever the context length.  One device buffer
 * per context (addresses, offsets, lengths, split-K partials) grows on
 * demand; attn_used is recorded after every call and the next call's
 * stream waits on it.  See backend_cuda.cuh.
 */
#include "backend_cuda.cuh"
#include "paged_attention.cuh"

#define BC_ATTN_THREADS 128

struct bc_attn_resolve {
	const char *records;
	uint64_t stride;
	void *const *bases;
	uint32_t n_slots, ppc;
	uint64_t page_bytes;
	uint32_t max_pages, page_tokens, n, n_kv, max_len;
	void **pages;    /* [n_kv][max_pages] */
	uint32_t *first; /* [n][n_kv] index in pages of the list's page 0 */
	uint32_t *lens;  /* [n][n_kv] */
};

/* Block h resolves KV head h's pages and writes its n lists.  A record
 * that does not hold its entries, or a page of an unmapped chunk, leaves
 * the head's lists empty: a fault would kill the engine's context. */
__global__ void bc_attn_resolve_kernel(const bc_attn_resolve a)
{
	__shared__ int bad;
	const uint32_t h = blockIdx.x;
	const struct kvt_list_record *r =
		(const struct kvt_list_record *)(a.records + h * a.stride);
	const uint32_t len = r->len;
	const uint32_t np = r->n_pages < a.max_pages ? r->n_pages : a.max_pages;
	const uint64_t need =
		((uint64_t)len + a.n + a.page_tokens - 1) / a.page_tokens;
	if (threadIdx.x == 0)
		bad = need > np || (uint64_t)len + a.n > a.max_len;
	__syncthreads();
	const int skip = bad;
	for (uint32_t i = threadIdx.x; !skip && i < need; i += blockDim.x) {
		uint32_t id = r->pages[i], slot = id / a.ppc;
		char *base = slot < a.n_slots ? (char *)a.bases[slot] : NULL;
		if (!base)
			bad = 1; /* every writer stores the same value */
		a.pages[(size_t)h * a.max_pages + i] =
			base ? base + (uint64_t)(id % a.ppc) * a.page_bytes
			     : NULL;
	}
	__syncthreads();
	for (uint32_t t = threadIdx.x; t < a.n; t += blockDim.x) {
		size_t l = (size_t)t * a.n_kv + h;
		a.first[l] = h * a.max_pages;
		a.lens[l] = bad ? 0 : len + t + 1;
	}
}

/* KVT_EINVAL unless p is device (or managed) memory. */
static int bc_device_ptr(const void *p, const char *what)
{
	cudaPointerAttributes at;
	cudaError_t e = cudaPointerGetAttributes(&at, p);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		bc_note("attention: %s (%p): %s", what, p,
		        cudaGetErrorString(e));
		return KVT_EINVAL;
	}
	if (at.type != cudaMemoryTypeDevice &&
	    at.type != cudaMemoryTypeManaged) {
		bc_note("attention: %s (%p) is not device memory (a cuda "
		        "tenant's q, out and lse live on the GPU)", what, p);
		return KVT_EINVAL;
	}
	return 0;
}

static size_t bc_align(size_t x)
{
	return (x + 255) & ~(size_t)255;
}

static int bc_attention_locked(struct bc_ctx *c,
                               const struct kvt_backend_attention *a,
                               cudaStream_t s)
{
	const uint32_t n_kv = a->n_kv_heads, G = a->n_heads / n_kv;
	const uint64_t n_lists = (uint64_t)a->n * n_kv;
	const size_t pbytes = bc_align((size_t)n_kv * a->max_pages *
	                               sizeof(void *));
	const size_t lbytes = bc_align((size_t)n_lists * sizeof(uint32_t));
	const size_t wbytes = paged_attention_work_bytes(
		(uint32_t)n_lists, G, a->head_dim, a->max_len);
	const size_t need = pbytes + 2 * lbytes + wbytes;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	if (!c->attn_used)
		BC_CALL(cudaEventCreateWithFlags(&c->attn_used,
		                                 cudaEventDisableTiming),
		        "cudaEventCreate");
	if (c->attn_recorded)
		BC_CALL(cudaStreamWaitEvent(s, c->attn_used, 0),
		        "cudaStreamWaitEvent");
	if (need > c->attn_cap) {
		size_t cap = c->attn_cap ? c->attn_cap : (size_t)1 << 16;
		while (cap < need)
			cap *= 2;
		if (c->attn_recorded)
			BC_CALL(cudaEventSynchronize(c->attn_used),
			        "attention buffer wait");
		if (c->d_attn)
			cudaFree(c->d_attn);
		c->d_attn = NULL;
		c->attn_cap = 0;
		BC_CALL(cudaMalloc((void **)&c->d_attn, cap), "cudaMalloc");
		c->attn_cap = cap;
	}
	bc_attn_resolve r;
	r.records = (const char *)a->records;
	r.stride = a->list_stride;
	r.bases = a->chunk_bases;
	r.n_slots = a->n_chunk_slots;
	r.ppc = a->pages_per_chunk;
	r.page_bytes = a->page_bytes;
	r.max_pages = a->max_pages;
	r.page_tokens = a->page_tokens;
	r.n = a->n;
	r.n_kv = n_kv;
	r.max_len = a->max_len;
	r.pages = (void **)c->d_attn;
	r.first = (uint32_t *)(c->d_attn + pbytes);
	r.lens = (uint32_t *)(c->d_attn + pbytes + lbytes);
	KVT_LAUNCH(bc_attn_resolve_kernel, n_kv, BC_ATTN_THREADS, 0, s, r);
	BC_CALL(cudaGetLastError(), "attention: resolve kernel");
	int rv = paged_attention_batch_cuda(
		a->q, G, r.pages, r.first, r.lens, (uint32_t)n_lists,
		a->max_len, a->page_tokens, a->head_dim, a->dtype, a->scale,
		a->out, a->lse, wbytes ? c->d_attn + pbytes + 2 * lbytes : NULL,
		wbytes, s);
	if (rv)
		bc_note("attention: paged_attention_batch_cuda failed (%d)", rv);
	/* Recorded even after a failed launch: the resolve kernel is queued. */
	int rr = bc_cuda(cudaEventRecord(c->attn_used, s), "cudaEventRecord");
	if (!rr)
		c->attn_recorded = 1;
	return rv ? rv : rr;
}

int bc_attention(void *ctx, const struct kvt_backend_attention *a,
                 void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	int rv;
	if (!c || !a || !a->n || !a->n_kv_heads || !a->n_heads ||
	    a->n_heads % a->n_kv_heads || !a->head_dim || !a->page_tokens ||
	    !a->pages_per_chunk || !a->max_pages || !a->records ||
	    !a->chunk_bases || !common_dt_size(a->dtype) ||
	    a->max_len < a->n || (uint64_t)a->n * a->n_kv_heads > INT32_MAX ||
	    (uint64_t)a->n_kv_heads * a->max_pages > UINT32_MAX) {
		bc_note("attention: bad arguments");
		return KVT_EINVAL;
	}
	if (a->head_dim > 256) {
		bc_note("attention: head_dim %u beyond the CUDA kernel's 256",
		        a->head_dim);
		return KVT_ENOTSUP;
	}
	if ((rv = bc_device_ptr(a->q, "q")) ||
	    (rv = bc_device_ptr(a->out, "out")) ||
	    (rv = bc_device_ptr(a->lse, "lse")))
		return rv;
	pthread_mutex_lock(&c->lock);
	rv = bc_attention_locked(c, a, (cudaStream_t)stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
