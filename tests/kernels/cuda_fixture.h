/*
 * cuda_fixture.h — what the CUDA tests of the kernels and of the cuda
 * backend (tests/kernels/test_cuda_kernels.c, test_cuda_backend.c) share:
 * the device check (need_device), a deterministic generator, host and
 * device buffers, close_enough, the dtypes and a page list laid out as in
 * the pool with identical host and device copies.  Header-only (static
 * inline), so no helper name leaves a test file.  Compiled against the real
 * CUDA headers (kvtrim-cuda-tests) or the emulator's stand-ins
 * (kvtrim-cuda-emu-tests, KVT_CUDA_EMU).
 */
#ifndef KVT_CUDA_FIXTURE_H
#define KVT_CUDA_FIXTURE_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "append_kv.cuh"
#include "attn_band.cuh"
#include "backend.h"
#include "compact.cuh"
#include "compact.h"
#include "handle.h"
#include "kernels.h"
#include "paged_attention.cuh"
#include "quad_form.cuh"
#include "scorer_linear.cuh"
#include "scorer_mlp.cuh"
#include "select_threshold.cuh"
#include "select_topk.cuh"
#include "sink_gate.cuh"
#include "test.h"

extern const struct kvt_backend_ops kvt_cuda_backend_v1;

#include "cuda_check.h"

/* Skips the test unless a CUDA device is usable; never touches CUDA
 * before the runner forked (each test initialises its own context). */
static inline void need_device(void)
{
	static char why[256];
	int n = 0;
	/* the backend's probe names what is missing (driver, device) */
	if (kvt_cuda_backend_v1.probe(why, sizeof(why)))
		T_SKIP(why);
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		snprintf(why, sizeof(why), "no CUDA device (%s)",
		         cudaGetErrorString(e));
		T_SKIP(why);
	}
	if (n <= 0)
		T_SKIP("no CUDA device");
}

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;

static inline uint32_t rnd(void)
{
	rng_s ^= rng_s << 13;
	rng_s ^= rng_s >> 7;
	rng_s ^= rng_s << 17;
	return (uint32_t)(rng_s >> 16);
}

/* uniform in [-1, 1) */
static inline float frnd(void)
{
	return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f;
}

static inline void fill(float *v, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		v[i] = frnd() * scale;
}

static inline void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	T_ASSERT(p != NULL);
	return p;
}

static inline void *dmalloc(size_t n)
{
	void *p = NULL;
	CK(cudaMalloc(&p, n ? n : 16));
	return p;
}

static inline void *to_dev(const void *h, size_t n)
{
	void *d = dmalloc(n);
	if (n)
		CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
	return d;
}

static inline void to_host(void *h, const void *d, size_t n)
{
	if (n)
		CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

/* Checks gpu against cpu element by element; names the first mismatch. */
static inline void close_enough(const char *what, const float *cpu,
                                const float *gpu, size_t n, float atol,
                                float rtol)
{
	for (size_t i = 0; i < n; i++) {
		float c = cpu[i], g = gpu[i];
		if (isnan(c) || isnan(g)) {
			if (isnan(c) && isnan(g))
				continue;
			th_fail(__FILE__, __LINE__, "%s[%zu]: cpu %g gpu %g",
			        what, i, c, g);
		}
		if (isinf(c) || isinf(g)) {
			if (c == g)
				continue;
			th_fail(__FILE__, __LINE__, "%s[%zu]: cpu %g gpu %g",
			        what, i, c, g);
		}
		if (fabsf(c - g) > atol + rtol * fabsf(c))
			th_fail(__FILE__, __LINE__,
			        "%s[%zu]: cpu %.9g gpu %.9g (|d| %.3g > %.3g)",
			        what, i, c, g, fabsf(c - g),
			        atol + rtol * fabsf(c));
	}
}

static const enum kvt_dtype DTS[] = {KVT_DTYPE_F32, KVT_DTYPE_F16,
                                     KVT_DTYPE_BF16};
static const char *const DT_NAME[] = {"f32", "f16", "bf16"};

/*
 * A page list laid out as in the pool: pool_pages pages of page_bytes each
 * in one block, the list's pages a random selection of them (scattered,
 * out of order).  The host and the device hold identical copies.
 */
struct plist {
	uint32_t n_pages, page_tokens, hd, pool_pages;
	enum kvt_dtype dt;
	size_t page_bytes, row_bytes;
	uint8_t *host;  /* [pool_pages][page_bytes] */
	void **hptr;    /* [n_pages] host page addresses */
	uint8_t *dev;   /* device pool */
	void **dptr;    /* device array of device page addresses */
	uint32_t *ids;  /* [n_pages] pool page of list page i */
};

static inline void plist_make(struct plist *p, uint32_t n_pages,
                              uint32_t page_tokens, uint32_t hd,
                              enum kvt_dtype dt)
{
	memset(p, 0, sizeof(*p));
	p->n_pages = n_pages;
	p->page_tokens = page_tokens;
	p->hd = hd;
	p->dt = dt;
	p->row_bytes = (size_t)hd * kvt_dtype_size(dt);
	p->page_bytes = 2 * (size_t)page_tokens * p->row_bytes;
	p->pool_pages = n_pages + 3;
	size_t bytes = p->pool_pages * p->page_bytes;
	p->host = xmalloc(bytes);
	size_t nel = bytes / kvt_dtype_size(dt);
	float *tmp = xmalloc(nel * sizeof(float));
	fill(tmp, nel, 1.0f);
	dtype_from_f32(tmp, dt, p->host, nel);
	free(tmp);
	/* a random injective choice of pool pages */
	uint32_t *perm = xmalloc(p->pool_pages * sizeof(uint32_t));
	for (uint32_t i = 0; i < p->pool_pages; i++)
		perm[i] = i;
	for (uint32_t i = p->pool_pages; i > 1; i--) {
		uint32_t j = rnd() % i, t = perm[i - 1];
		perm[i - 1] = perm[j];
		perm[j] = t;
	}
	p->ids = perm;
	p->dev = to_dev(p->host, bytes);
	p->hptr = xmalloc((n_pages ? n_pages : 1) * sizeof(void *));
	void **dp = xmalloc((n_pages ? n_pages : 1) * sizeof(void *));
	for (uint32_t i = 0; i < n_pages; i++) {
		p->hptr[i] = p->host + (size_t)perm[i] * p->page_bytes;
		dp[i] = p->dev + (size_t)perm[i] * p->page_bytes;
	}
	p->dptr = to_dev(dp, n_pages * sizeof(void *));
	free(dp);
}

/* The device pool now, for comparison with the host one. */
static inline uint8_t *plist_download(const struct plist *p)
{
	size_t bytes = p->pool_pages * p->page_bytes;
	uint8_t *h = xmalloc(bytes);
	to_host(h, p->dev, bytes);
	return h;
}

static inline void plist_free(struct plist *p)
{
	free(p->host);
	free(p->hptr);
	free(p->ids);
	cudaFree(p->dev);
	cudaFree(p->dptr);
}

static inline void pools_equal(const char *what, const struct plist *p)
{
	uint8_t *g = plist_download(p);
	size_t bytes = p->pool_pages * p->page_bytes;
	for (size_t i = 0; i < bytes; i++)
		if (g[i] != p->host[i])
			th_fail(__FILE__, __LINE__,
			        "%s: pool byte %zu (page %zu) differs: cpu %02x "
			        "gpu %02x",
			        what, i, i / p->page_bytes, p->host[i], g[i]);
	free(g);
}

#endif
