/*
 * ops.cu — the cuda backend's work on device memory: compaction (the
 * kernels of kernels/cuda/compact.cu), uploads of host regions, reads of
 * regions to the host, copies and private device memory.  Compaction and
 * uploads stage their arguments in the context's pinned slots, round
 * robin, so a sync of one tenant does not wait for another's queued GPU
 * work; the ops that use the slots or the gather buffer hold the
 * context's lock (the daemon calls them from several threads).  Every
 * host <-> device copy is counted where it is queued (bc_count; the
 * traffic op).  See backend_cuda.cuh.
 */
#include <string.h>

#include "backend_cuda.cuh"
#include "compact.cuh"

/* ---------------------------------------------------------- compaction */

/*
 * A staging slot with at least need bytes, ready to be refilled for a
 * launch on stream s.  Prefers a slot whose last launch is done (no wait
 * at all), then one whose pinned bytes have reached the device (s waits
 * on the device for the launch still reading the device copy; the host
 * does not block), and only when every slot's copy is still queued behind
 * other work does the host wait, for the oldest.  So a sync of one tenant
 * does not stall the daemon behind another tenant's GPU backlog unless
 * BC_STAGES syncs are in flight.
 */
int bc_stage_take(struct bc_ctx *c, size_t need, cudaStream_t s,
                  struct bc_stage **out)
{
	struct bc_stage *st = NULL;
	for (int pass = 0; pass < 2 && !st; pass++)
		for (uint32_t k = 0; k < BC_STAGES && !st; k++) {
			struct bc_stage *x = &c->st[(c->st_next + k) % BC_STAGES];
			if (!x->staged ||
			    cudaEventQuery(pass ? x->copied : x->used) ==
			            cudaSuccess)
				st = x;
		}
	cudaGetLastError(); /* a query's cudaErrorNotReady is not an error */
	if (!st)
		st = &c->st[c->st_next % BC_STAGES];
	c->st_next = (uint32_t)(st - c->st) + 1;
	if (need > st->cap) {
		size_t cap = st->cap ? st->cap : (size_t)1 << 16;
		while (cap < need)
			cap *= 2;
		if (st->staged)
			BC_CALL(cudaEventSynchronize(st->used), "staging wait");
		if (st->h)
			cudaFreeHost(st->h);
		if (st->d)
			cudaFree(st->d);
		st->h = st->d = NULL;
		st->cap = 0;
		st->staged = 0;
		BC_CALL(cudaMallocHost((void **)&st->h, cap), "cudaMallocHost");
		BC_CALL(cudaMalloc((void **)&st->d, cap), "cudaMalloc");
		st->cap = cap;
	}
	if (st->staged) {
		BC_CALL(cudaEventSynchronize(st->copied), "staging wait");
		BC_CALL(cudaStreamWaitEvent(s, st->used, 0), "cudaStreamWaitEvent");
	}
	*out = st;
	return 0;
}

/* Queues the copy of st's first bytes to the device on s. */
int bc_stage_send(struct bc_ctx *c, struct bc_stage *st, size_t bytes,
                  cudaStream_t s)
{
	BC_CALL(cudaMemcpyAsync(st->d, st->h, bytes, cudaMemcpyHostToDevice, s),
	        "cudaMemcpyAsync");
	bc_count(c, bytes, 0);
	BC_CALL(cudaEventRecord(st->copied, s), "cudaEventRecord");
	st->staged = 1;
	return 0;
}

/*
 * Runs of consecutive lists with one geometry become one launch each:
 * their page addresses are concatenated and every move carries the index
 * of its list's page 0, (dst, src, first) as compact_batch_cuda wants.
 * Everything goes to the device in one copy from pinned memory.
 */
static int bc_compact_locked(void *ctx,
                             const struct kvt_backend_compact *lists,
                             uint32_t n, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	uint64_t pages = 0, moves = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_compact *l = &lists[i];
		if (!l->n_moves)
			continue;
		if (!l->page_tokens || !l->row_bytes || !l->pages || !l->moves)
			return KVT_EINVAL;
		uint64_t cap = (uint64_t)l->n_pages * l->page_tokens;
		for (uint32_t m = 0; m < 2 * l->n_moves; m++)
			if (l->moves[m] >= cap) {
				bc_note("compact: list %u moves entry %u beyond its "
				        "%u pages", i, l->moves[m], l->n_pages);
				return KVT_EINVAL;
			}
		pages += l->n_pages;
		moves += l->n_moves;
	}
	if (moves == 0)
		return 0;
	if (pages > UINT32_MAX || moves > UINT32_MAX)
		return KVT_EINVAL;
	size_t pbytes = (size_t)pages * sizeof(void *);
	size_t need = pbytes + (size_t)moves * 3 * sizeof(uint32_t);
	int rv;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	if ((rv = bc_stage_take(c, need, s, &st)))
		return rv;
	void **hp = (void **)st->h;
	uint32_t *hm = (uint32_t *)(st->h + pbytes);
	uint32_t np = 0, nm = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_compact *l = &lists[i];
		if (!l->n_moves)
			continue;
		memcpy(hp + np, l->pages, (size_t)l->n_pages * sizeof(void *));
		for (uint32_t m = 0; m < l->n_moves; m++) {
			hm[3 * (nm + m)] = l->moves[2 * m];
			hm[3 * (nm + m) + 1] = l->moves[2 * m + 1];
			hm[3 * (nm + m) + 2] = np;
		}
		np += l->n_pages;
		nm += l->n_moves;
	}
	if ((rv = bc_stage_send(c, st, need, s)))
		return rv;
	void *const *dp = (void *const *)st->d;
	const uint32_t *dm = (const uint32_t *)(st->d + pbytes);
	uint32_t run_m = 0, i = 0;
	while (i < n) {
		if (!lists[i].n_moves) {
			i++;
			continue;
		}
		uint32_t pt = lists[i].page_tokens, rb = lists[i].row_bytes;
		uint32_t cnt = 0;
		while (i < n && (!lists[i].n_moves ||
		                 (lists[i].page_tokens == pt &&
		                  lists[i].row_bytes == rb))) {
			cnt += lists[i].n_moves;
			i++;
		}
		rv = compact_batch_cuda(dp, pt, rb, dm + 3 * (size_t)run_m, cnt, s);
		if (rv) {
			bc_note("compact_batch_cuda failed (%d)", rv);
			break;
		}
		run_m += cnt;
	}
	cudaError_t e = cudaEventRecord(st->used, s);
	if (!rv)
		rv = bc_cuda(e, "cudaEventRecord");
	return rv;
}

/* ---------------------------------------------------- upload_regions */

/* One region of an upload as the scatter kernel reads it: 4-byte words
 * at word offset src of the staged bytes go to word offset dst of dev. */
struct bc_up {
	uint64_t dst;
	uint32_t src, words; /* the staged bytes of one call fit 2^32 words */
};

/* Block b copies region b into dev and, when not NULL, twin; threads
 * stride over its words. */
__global__ void bc_scatter_kernel(uint32_t *dev, uint32_t *twin,
                                  const struct bc_up *up,
                                  const uint32_t *bytes)
{
	const struct bc_up u = up[blockIdx.x];
	for (uint64_t i = threadIdx.x; i < u.words; i += blockDim.x) {
		uint32_t w = bytes[u.src + i];
		dev[u.dst + i] = w;
		if (twin)
			twin[u.dst + i] = w;
	}
}

static int bc_upload_regions_locked(void *ctx, void *dev, void *twin,
                                    const void *host,
                                    const struct kvt_backend_region *r,
                                    uint32_t n, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	uint64_t words = 0;
	if (!n)
		return 0;
	if (!dev || !host || !r || n > INT32_MAX)
		return KVT_EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if (r[i].off % 4 || r[i].bytes % 4) {
			bc_note("upload: region %u (offset %llu, %llu bytes) "
			        "is not in 4-byte words", i,
			        (unsigned long long)r[i].off,
			        (unsigned long long)r[i].bytes);
			return KVT_EINVAL;
		}
		words += r[i].bytes / 4;
	}
	if (words > UINT32_MAX) {
		bc_note("upload: %llu words in one call", (unsigned long long)words);
		return KVT_EINVAL;
	}
	size_t dbytes = (size_t)n * sizeof(struct bc_up);
	size_t need = dbytes + (size_t)words * 4;
	int rv;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	if ((rv = bc_stage_take(c, need, s, &st)))
		return rv;
	struct bc_up *hu = (struct bc_up *)st->h;
	uint32_t *hw = (uint32_t *)(st->h + dbytes);
	uint64_t at = 0;
	for (uint32_t i = 0; i < n; i++) {
		hu[i].dst = r[i].off / 4;
		hu[i].src = (uint32_t)at;
		hu[i].words = (uint32_t)(r[i].bytes / 4);
		memcpy(hw + at, (const char *)host + r[i].off, r[i].bytes);
		at += r[i].bytes / 4;
	}
	if ((rv = bc_stage_send(c, st, need, s)))
		return rv;
	KVT_LAUNCH(bc_scatter_kernel, n, 128, 0, s, (uint32_t *)dev,
	           (uint32_t *)twin, (const struct bc_up *)st->d,
	           (const uint32_t *)(st->d + dbytes));
	BC_CALL(cudaGetLastError(), "scatter kernel");
	BC_CALL(cudaEventRecord(st->used, s), "cudaEventRecord");
	return 0;
}

/* ------------------------------------------------- copy, private memory */

/* 1 when p is device memory of this process as unified addressing tells
 * (what cudaMemcpyDefault decides from), for copy's count. */
static int bc_is_device(const void *p)
{
	cudaPointerAttributes at;
	if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return at.type == cudaMemoryTypeDevice ||
	       at.type == cudaMemoryTypeManaged;
}

int bc_copy(void *ctx, void *dst, const void *src, size_t bytes,
            void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	/* Unified addressing tells host from device on either side. */
	BC_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s),
	        "cudaMemcpyAsync");
	if (bytes) {
		int dd = bc_is_device(dst), sd = bc_is_device(src);
		bc_count(c, dd && !sd ? bytes : 0, sd && !dd ? bytes : 0);
	}
	BC_CALL(cudaStreamSynchronize(s), "cudaStreamSynchronize");
	return 0;
}

/* The emulator's (tests/kernels/emu) CPU time of the device's work;
 * absent from the CUDA runtime, where a GPU does it. */
extern "C" uint64_t kvt_emu_api_ns(void) __attribute__((weak));

int bc_traffic(void *ctx, uint64_t *h2d, uint64_t *d2h, uint64_t *launches,
               uint64_t *emu_ns)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!c || !h2d || !d2h || !launches)
		return KVT_EINVAL;
	*h2d = __atomic_load_n(&c->h2d, __ATOMIC_RELAXED);
	*d2h = __atomic_load_n(&c->d2h, __ATOMIC_RELAXED);
	*launches = __atomic_load_n(common_launches(), __ATOMIC_RELAXED);
	if (emu_ns)
		*emu_ns = kvt_emu_api_ns ? kvt_emu_api_ns() : 0;
	return 0;
}

int bc_mem_new(void *ctx, size_t bytes, void **out)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	void *p = NULL;
	*out = NULL;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	BC_CALL(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
	/* cudaMemset on device memory may return before it is done, and
	 * runs on the legacy stream, which the callers' non-blocking streams
	 * do not wait for: their first upload could land before the zeroes.
	 * So zero on the context's stream and wait, as chunk_new does. */
	cudaError_t e = cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess) {
		int rv = bc_cuda(e, "zeroing device memory");
		cudaFree(p);
		return rv;
	}
	*out = p;
	return 0;
}

void bc_mem_free(void *ctx, void *p)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!p)
		return;
	cudaSetDevice(c->device);
	/* cudaFree waits for the device work that may still read p; an error
	 * of it is not left as the thread's last error (bc_chunk_free) */
	if (cudaFree(p) != cudaSuccess)
		(void)cudaGetLastError();
}

/* ------------------------------------------------------ read_regions */

/* Block b copies region b (bytes) from src[b] to out + b * bytes; 16-byte
 * units when every address and the size allow, else single bytes. */
__global__ void bc_gather_kernel(const void *const *src, char *out,
                                 size_t bytes, int wide)
{
	const char *s = (const char *)src[blockIdx.x];
	char *d = out + (size_t)blockIdx.x * bytes;
	if (wide) {
		const uint4 *s4 = (const uint4 *)s;
		uint4 *d4 = (uint4 *)d;
		for (size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
			d4[i] = s4[i];
	} else {
		for (size_t i = threadIdx.x; i < bytes; i += blockDim.x)
			d[i] = s[i];
	}
}

/*
 * One gather kernel into a device buffer, then one strided copy to the
 * host: a layer's key pages cost two operations instead of one memcpy per
 * page.  Synchronous on stream (the policies read the bytes right after).
 */
static int bc_read_regions_locked(void *ctx, void *dst, size_t dst_stride,
                                  const void *const *src, uint32_t n,
                                  size_t bytes, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	if (!n || !bytes)
		return 0;
	if (!dst || !src || dst_stride < bytes)
		return KVT_EINVAL;
	size_t abytes = ((size_t)n * sizeof(void *) + 15) & ~(size_t)15;
	size_t need = abytes + (size_t)n * bytes;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	if (need > c->gather_cap) {
		size_t cap = c->gather_cap ? c->gather_cap : (size_t)1 << 20;
		while (cap < need)
			cap *= 2;
		/* the previous read finished: it synchronised its stream */
		if (c->d_gather)
			cudaFree(c->d_gather);
		c->d_gather = NULL;
		c->gather_cap = 0;
		BC_CALL(cudaMalloc((void **)&c->d_gather, cap), "cudaMalloc");
		c->gather_cap = cap;
	}
	int wide = bytes % 16 == 0;
	for (uint32_t i = 0; wide && i < n; i++)
		wide = ((uintptr_t)src[i] & 15) == 0;
	BC_CALL(cudaMemcpyAsync(c->d_gather, src, (size_t)n * sizeof(void *),
	                        cudaMemcpyHostToDevice, s),
	        "cudaMemcpyAsync");
	bc_count(c, (size_t)n * sizeof(void *), 0);
	KVT_LAUNCH(bc_gather_kernel, n, 256, 0, s,
	           (const void *const *)c->d_gather, c->d_gather + abytes, bytes,
	           wide);
	BC_CALL(cudaGetLastError(), "gather kernel");
	BC_CALL(cudaMemcpy2DAsync(dst, dst_stride, c->d_gather + abytes, bytes,
	                          bytes, n, cudaMemcpyDeviceToHost, s),
	        "cudaMemcpy2DAsync");
	bc_count(c, 0, (size_t)n * bytes);
	BC_CALL(cudaStreamSynchronize(s), "read_regions");
	return 0;
}

/* The ops that use the context's staging slots and gather buffer,
 * each whole under its lock. */
int bc_compact(void *ctx, const struct kvt_backend_compact *lists,
               uint32_t n, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	pthread_mutex_lock(&c->lock);
	int rv = bc_compact_locked(ctx, lists, n, stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}

int bc_upload_regions(void *ctx, void *dev, const void *host,
                      const struct kvt_backend_region *r, uint32_t n,
                      void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	pthread_mutex_lock(&c->lock);
	int rv = bc_upload_regions_locked(ctx, dev, NULL, host, r, n, stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}

int bc_upload_twin(void *ctx, void *dev, void *twin, const void *host,
                   const struct kvt_backend_region *r, uint32_t n,
                   void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!twin)
		return KVT_EINVAL;
	pthread_mutex_lock(&c->lock);
	int rv = bc_upload_regions_locked(ctx, dev, twin, host, r, n, stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}

int bc_read_regions(void *ctx, void *dst, size_t dst_stride,
                    const void *const *src, uint32_t n, size_t bytes,
                    void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	pthread_mutex_lock(&c->lock);
	int rv = bc_read_regions_locked(ctx, dst, dst_stride, src, n, bytes,
	                                stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
