/*
 * test_cuda_kernels.c — every CUDA op of kernels/cuda/ against its CPU
 * reference in kernels/cpu/, over many shapes, and the cuda backend
 * (chunks, interprocess events, compaction, uploads, region reads) within
 * one process and across two.  Built into build/bin/kvtrim-cuda-tests
 * (links libkvtrim-cuda.so; the normal kvtrim-tests never links CUDA).
 * Without a device every test skips with the reason.  The same file also
 * builds, against the CPU emulator of tests/kernels/emu/ (KVT_CUDA_EMU),
 * into kvtrim-cuda-emu-tests, which runs the kernels and backend_cuda.cu
 * without a GPU, in both sharing modes (the emulator has the driver's VMM
 * calls, tests/kernels/emu/driver.cc), across two processes too;
 * backend_share_in_one_process and backend_without_vmm test there what a
 * GPU does not allow (two contexts of one process sharing; a driver
 * without VMM).
 *
 * Tolerances (|gpu - cpu| <= atol + rtol * |cpu|, NaN/Inf checked first):
 *   append_kv, compact, select_*      exact (bytes / drop sets equal)
 *   paged_attention out               atol 2e-4, rtol 1e-3; lse atol 2e-4
 *   attn_band                         atol 1e-5, rtol 2e-4
 *   scorer_linear, scorer_mlp         atol 1e-4, rtol 1e-4 (FP32 SGEMM)
 *   sink_gate                         atol 2e-5, rtol 1e-4
 * The float ops differ from the CPU only in summation order.
 *
 * Run: build/bin/kvtrim-cuda-tests [substring...]
 */
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
#include "scorer_linear.cuh"
#include "scorer_mlp.cuh"
#include "select_threshold.cuh"
#include "select_topk.cuh"
#include "sink_gate.cuh"
#include "test.h"

extern const struct kvt_backend_ops kvt_cuda_backend_v1;

/* ------------------------------------------------------------ helpers */

#include "cuda_check.h"

/* Skips the test unless a CUDA device is usable; never touches CUDA
 * before the runner forked (each test initialises its own context). */
static void need_device(void)
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

static uint32_t rnd(void)
{
	rng_s ^= rng_s << 13;
	rng_s ^= rng_s >> 7;
	rng_s ^= rng_s << 17;
	return (uint32_t)(rng_s >> 16);
}

/* uniform in [-1, 1) */
static float frnd(void)
{
	return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f;
}

static void fill(float *v, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		v[i] = frnd() * scale;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	T_ASSERT(p != NULL);
	return p;
}

static void *dmalloc(size_t n)
{
	void *p = NULL;
	CK(cudaMalloc(&p, n ? n : 16));
	return p;
}

static void *to_dev(const void *h, size_t n)
{
	void *d = dmalloc(n);
	if (n)
		CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
	return d;
}

static void to_host(void *h, const void *d, size_t n)
{
	if (n)
		CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

/* Checks gpu against cpu element by element; names the first mismatch. */
static void close_enough(const char *what, const float *cpu, const float *gpu,
                         size_t n, float atol, float rtol)
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

static void plist_make(struct plist *p, uint32_t n_pages, uint32_t page_tokens,
                       uint32_t hd, enum kvt_dtype dt)
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
static uint8_t *plist_download(const struct plist *p)
{
	size_t bytes = p->pool_pages * p->page_bytes;
	uint8_t *h = xmalloc(bytes);
	to_host(h, p->dev, bytes);
	return h;
}

static void plist_free(struct plist *p)
{
	free(p->host);
	free(p->hptr);
	free(p->ids);
	cudaFree(p->dev);
	cudaFree(p->dptr);
}

static void pools_equal(const char *what, const struct plist *p)
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

/* ---------------------------------------------------------- append_kv */

/* Puts the float32 values whose f16 / bf16 conversion is easy to get
 * wrong into v (scattered): NaNs with payloads and signs, infinities,
 * signed zeros, the f16 overflow edge, f16 subnormals and the round-to-
 * even ties of both formats. */
static void put_specials(float *v, size_t n)
{
	static const uint32_t SPECIAL[] = {
		0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfe000u,
		0xffa5a000u, 0x7f800000u, 0xff800000u, 0x80000000u,
		0x00000000u, 0x477fe000u, 0x477fefffu, 0x477ff000u,
		0xc77ff000u, 0x33000000u, 0x33000001u, 0x33c00000u,
		0x387fc000u, 0x38800000u, 0x3f808000u, 0x3f818000u,
		0x7f7fffffu, 0x00000001u, 0x80000001u, 0x3f800000u};
	for (size_t j = 0; j < sizeof(SPECIAL) / 4 && j < n; j++)
		memcpy(&v[(j * 131) % n], &SPECIAL[j], sizeof(float));
}

TEST_T(cuda, append_kv, 120)
{
	need_device();
	static const uint32_t HD[] = {64, 128, 256, 80, 66, 3};
	static const uint32_t PT[] = {16, 1, 5, 64};
	for (int di = 0; di < 3; di++)
		for (size_t h = 0; h < sizeof(HD) / 4; h++)
			for (size_t t = 0; t < sizeof(PT) / 4; t++) {
				struct plist p;
				uint32_t pt = PT[t], hd = HD[h];
				plist_make(&p, 6, pt, hd, DTS[di]);
				uint32_t cap = 6 * pt;
				uint32_t first = rnd() % cap;
				uint32_t n = 1 + rnd() % (cap - first);
				float *k = xmalloc((size_t)n * hd * 4);
				float *v = xmalloc((size_t)n * hd * 4);
				fill(k, (size_t)n * hd, 3.0f);
				fill(v, (size_t)n * hd, 3.0f);
				put_specials(k, (size_t)n * hd);
				put_specials(v + (size_t)n * hd / 2,
				             (size_t)n * hd - (size_t)n * hd / 2);
				float *dk = to_dev(k, (size_t)n * hd * 4);
				float *dv = to_dev(v, (size_t)n * hd * 4);
				append_kv_cpu(p.hptr, pt, hd, DTS[di], first, k, v, n);
				T_OK(append_kv_cuda(p.dptr, pt, hd, DTS[di], first,
				                    dk, dv, n, 0));
				T_OK(append_kv_cuda(p.dptr, pt, hd, DTS[di], first,
				                    dk, dv, 0, 0));
				CK(cudaDeviceSynchronize());
				char what[64];
				snprintf(what, sizeof(what), "append %s hd %u pt %u",
				         DT_NAME[di], hd, pt);
				pools_equal(what, &p);
				cudaFree(dk);
				cudaFree(dv);
				free(k);
				free(v);
				plist_free(&p);
			}
	T_ERR(append_kv_cuda(NULL, 0, 64, KVT_DTYPE_F16, 0, NULL, NULL, 1, 0),
	      KVT_EINVAL);
	T_ERR(append_kv_cuda(NULL, 16, 64, (enum kvt_dtype)7, 0, NULL, NULL, 1, 0),
	      KVT_EINVAL);
}

/* ------------------------------------------------------------ compact */

TEST_T(cuda, compact, 120)
{
	need_device();
	static const uint32_t HD[] = {64, 128, 256, 66, 3};
	static const uint32_t PT[] = {16, 1, 7, 128};
	static const uint32_t DROP_PCT[] = {0, 10, 50, 90, 100};
	for (int di = 0; di < 3; di++)
		for (size_t h = 0; h < sizeof(HD) / 4; h++)
			for (size_t t = 0; t < sizeof(PT) / 4; t++) {
				uint32_t pt = PT[t], hd = HD[h];
				uint32_t n_pages = 1 + rnd() % 9;
				uint32_t len = 1 + rnd() % (n_pages * pt);
				struct plist p;
				plist_make(&p, n_pages, pt, hd, DTS[di]);
				uint8_t *drop = xmalloc(len);
				uint32_t pct = DROP_PCT[rnd() % 5];
				for (uint32_t i = 0; i < len; i++)
					drop[i] = rnd() % 100 < pct;
				uint32_t *mv = xmalloc((size_t)len * 2 * 4), nl;
				uint32_t nm = compact_plan(drop, len, mv, &nl);
				uint32_t *dm = to_dev(mv, (size_t)nm * 8);
				uint32_t rb = (uint32_t)p.row_bytes;
				compact_cpu(p.hptr, pt, rb, mv, nm);
				T_OK(compact_cuda(p.dptr, pt, rb, dm, nm, 0));
				CK(cudaDeviceSynchronize());
				char what[64];
				snprintf(what, sizeof(what),
				         "compact %s hd %u pt %u len %u moves %u",
				         DT_NAME[di], hd, pt, len, nm);
				pools_equal(what, &p);
				cudaFree(dm);
				free(mv);
				free(drop);
				plist_free(&p);
			}
}

/* Three lists sharing one pool, compacted in one batch launch. */
TEST_T(cuda, compact_batch, 60)
{
	need_device();
	for (int di = 0; di < 3; di++) {
		uint32_t pt = 16, hd = 128, per = 4;
		struct plist p;
		plist_make(&p, 3 * per, pt, hd, DTS[di]);
		uint32_t rb = (uint32_t)p.row_bytes;
		uint32_t *all = xmalloc((size_t)3 * per * pt * 3 * 4), n_all = 0;
		for (uint32_t l = 0; l < 3; l++) {
			uint32_t len = 1 + rnd() % (per * pt), nl;
			uint8_t *drop = xmalloc(len);
			for (uint32_t i = 0; i < len; i++)
				drop[i] = rnd() % 3 == 0;
			uint32_t *mv = xmalloc((size_t)len * 8);
			uint32_t nm = compact_plan(drop, len, mv, &nl);
			compact_cpu(p.hptr + l * per, pt, rb, mv, nm);
			for (uint32_t m = 0; m < nm; m++) {
				all[3 * n_all] = mv[2 * m];
				all[3 * n_all + 1] = mv[2 * m + 1];
				all[3 * n_all + 2] = l * per;
				n_all++;
			}
			free(mv);
			free(drop);
		}
		uint32_t *dm = to_dev(all, (size_t)n_all * 12);
		T_OK(compact_batch_cuda(p.dptr, pt, rb, dm, n_all, 0));
		CK(cudaDeviceSynchronize());
		pools_equal("compact_batch", &p);
		cudaFree(dm);
		free(all);
		plist_free(&p);
	}
}

/* ---------------------------------------------------- paged_attention */

static void pa_case(enum kvt_dtype dt, const char *dn, uint32_t hd, uint32_t G,
                    uint32_t len, uint32_t pt, int with_scratch)
{
	uint32_t n_pages = (len + pt - 1) / pt;
	struct plist p;
	plist_make(&p, n_pages ? n_pages : 1, pt, hd, dt);
	float scale = 1.0f / sqrtf((float)hd);
	size_t qn = (size_t)G * hd;
	float *q = xmalloc(qn * 4), *out = xmalloc(qn * 4), *lse = xmalloc(G * 4);
	float *gout = xmalloc(qn * 4), *glse = xmalloc(G * 4);
	float *scratch = xmalloc(((size_t)G * len + 1) * 4);
	fill(q, qn, 2.0f);
	paged_attention_cpu(q, G, p.hptr, pt, hd, dt, len, scale, out, lse,
	                    scratch);
	float *dq = to_dev(q, qn * 4), *dout = dmalloc(qn * 4);
	float *dlse = dmalloc(G * 4);
	float *dscr = with_scratch ? dmalloc(((size_t)G * len + 1) * 4) : NULL;
	CK(cudaMemset(dout, 0xff, qn * 4)); /* NaN: every value is written */
	T_OK(paged_attention_cuda(dq, G, p.dptr, pt, hd, dt, len, scale, dout,
	                          dlse, dscr, 0));
	CK(cudaDeviceSynchronize());
	to_host(gout, dout, qn * 4);
	to_host(glse, dlse, G * 4);
	char what[96];
	snprintf(what, sizeof(what), "pa %s hd %u G %u len %u pt %u%s out", dn,
	         hd, G, len, pt, with_scratch ? "" : " (no scratch)");
	close_enough(what, out, gout, qn, 2e-4f, 1e-3f);
	snprintf(what, sizeof(what), "pa %s hd %u G %u len %u pt %u lse", dn,
	         hd, G, len, pt);
	close_enough(what, lse, glse, G, 2e-4f, 1e-5f);
	cudaFree(dq);
	cudaFree(dout);
	cudaFree(dlse);
	cudaFree(dscr);
	free(q);
	free(out);
	free(lse);
	free(gout);
	free(glse);
	free(scratch);
	plist_free(&p);
}

TEST_T(cuda, paged_attention, 300)
{
	need_device();
	static const uint32_t HD[] = {64, 128, 256, 96, 72, 68, 5};
	static const uint32_t G[] = {1, 2, 4, 5, 8, 12};
	static const uint32_t LEN[] = {0, 1, 7, 255, 256, 257, 1000, 4099};
	static const uint32_t PT[] = {16, 1, 32, 5};
	/* every head_dim x dtype x group with a long and a short list */
	for (int di = 0; di < 3; di++)
		for (size_t h = 0; h < sizeof(HD) / 4; h++)
			for (size_t g = 0; g < sizeof(G) / 4; g++) {
				pa_case(DTS[di], DT_NAME[di], HD[h], G[g], 4099,
				        16, 1);
				pa_case(DTS[di], DT_NAME[di], HD[h], G[g],
				        LEN[rnd() % 8], PT[rnd() % 4], 1);
			}
	/* every length and page size at the common shape */
	for (size_t l = 0; l < sizeof(LEN) / 4; l++)
		for (size_t t = 0; t < sizeof(PT) / 4; t++) {
			pa_case(KVT_DTYPE_F16, "f16", 128, 4, LEN[l], PT[t], 1);
			pa_case(KVT_DTYPE_BF16, "bf16", 128, 4, LEN[l], PT[t], 0);
		}
	T_ERR(paged_attention_cuda(NULL, 4, NULL, 16, 512, KVT_DTYPE_F16, 0,
	                           1.0f, NULL, NULL, NULL, 0),
	      KVT_ENOTSUP);
}

/* A batch of lists of different lengths (0 included) against the CPU run
 * list by list, with and without split workspace. */
TEST_T(cuda, paged_attention_batch, 120)
{
	need_device();
	const uint32_t hd = 128, G = 4, pt = 16, n_lists = 37;
	for (int di = 0; di < 3; di++)
		for (int ws = 0; ws < 2; ws++) {
			uint32_t lens[37], first[37], max_len = 0, total = 0;
			for (uint32_t i = 0; i < n_lists; i++) {
				lens[i] = i == 3 ? 0 : rnd() % 3000;
				first[i] = total;
				total += (lens[i] + pt - 1) / pt;
				max_len = lens[i] > max_len ? lens[i] : max_len;
			}
			struct plist p;
			plist_make(&p, total, pt, hd, DTS[di]);
			size_t qn = (size_t)n_lists * G * hd;
			float *q = xmalloc(qn * 4), *out = xmalloc(qn * 4);
			float *lse = xmalloc(n_lists * G * 4);
			float *gout = xmalloc(qn * 4), *glse = xmalloc(n_lists * G * 4);
			float *scr = xmalloc(((size_t)G * max_len + 1) * 4);
			fill(q, qn, 2.0f);
			float scale = 1.0f / sqrtf((float)hd);
			for (uint32_t i = 0; i < n_lists; i++)
				paged_attention_cpu(q + (size_t)i * G * hd, G,
				                    p.hptr + first[i], pt, hd,
				                    DTS[di], lens[i], scale,
				                    out + (size_t)i * G * hd,
				                    lse + i * G, scr);
			float *dq = to_dev(q, qn * 4), *dout = dmalloc(qn * 4);
			float *dlse = dmalloc(n_lists * G * 4);
			uint32_t *dl = to_dev(lens, sizeof(lens));
			uint32_t *df = to_dev(first, sizeof(first));
			size_t wb = ws ? paged_attention_work_bytes(n_lists, G, hd,
			                                            max_len)
			               : 0;
			void *work = wb ? dmalloc(wb) : NULL;
			T_OK(paged_attention_batch_cuda(dq, G, p.dptr, df, dl,
			                                n_lists, max_len, pt, hd,
			                                DTS[di], scale, dout, dlse,
			                                work, wb, 0));
			CK(cudaDeviceSynchronize());
			to_host(gout, dout, qn * 4);
			to_host(glse, dlse, n_lists * G * 4);
			close_enough("pa batch out", out, gout, qn, 2e-4f, 1e-3f);
			close_enough("pa batch lse", lse, glse, n_lists * G, 2e-4f,
			             1e-5f);
			cudaFree(dq);
			cudaFree(dout);
			cudaFree(dlse);
			cudaFree(dl);
			cudaFree(df);
			cudaFree(work);
			free(q);
			free(out);
			free(lse);
			free(gout);
			free(glse);
			free(scr);
			plist_free(&p);
		}
}

/* ----------------------------------------------------------- attn_band */

TEST_T(cuda, attn_band, 180)
{
	need_device();
	static const uint32_t HD[] = {64, 128, 256, 80, 5};
	static const uint32_t NQ[] = {1, 5, 33};
	static const uint32_t G[] = {1, 4, 7};
	static const uint32_t LEN[] = {0, 1, 31, 100, 513};
	for (int di = 0; di < 3; di++)
		for (size_t h = 0; h < sizeof(HD) / 4; h++)
			for (int rep = 0; rep < 4; rep++) {
				uint32_t hd = HD[h], nq = NQ[rnd() % 3];
				uint32_t g = G[rnd() % 3], len = LEN[rnd() % 5];
				uint32_t pt = rep & 1 ? 16 : 3;
				uint32_t n_pages = (len + pt - 1) / pt;
				struct plist p;
				plist_make(&p, n_pages ? n_pages : 1, pt, hd, DTS[di]);
				size_t qn = (size_t)nq * g * hd;
				size_t wn = (size_t)nq * g * len;
				float *q = xmalloc(qn * 4), *lse = xmalloc(nq * g * 4);
				uint32_t *qpos = xmalloc(nq * 4);
				uint32_t *kpos = xmalloc((len + 1) * 4);
				float *w = xmalloc(wn * 4 + 4), *gw = xmalloc(wn * 4 + 4);
				float *ks = xmalloc(((size_t)len * hd + 1) * 4);
				fill(q, qn, 1.0f);
				for (size_t i = 0; i < (size_t)nq * g; i++)
					lse[i] = 2.0f + 4.0f * (frnd() + 1.0f) / 2;
				for (uint32_t i = 0; i < len; i++)
					kpos[i] = rnd() % (len + 8);
				for (uint32_t t = 0; t < nq; t++)
					qpos[t] = rnd() % (len + 8);
				float scale = 1.0f / sqrtf((float)hd);
				attn_band_cpu(q, lse, qpos, nq, g, p.hptr, pt, hd,
				              DTS[di], kpos, len, scale, w, ks);
				float *dq = to_dev(q, qn * 4);
				float *dlse = to_dev(lse, nq * g * 4);
				uint32_t *dqp = to_dev(qpos, nq * 4);
				uint32_t *dkp = to_dev(kpos, len * 4);
				float *dw = dmalloc(wn * 4);
				T_OK(attn_band_cuda(dq, dlse, dqp, nq, g, p.dptr, pt,
				                    hd, DTS[di], dkp, len, scale, dw,
				                    NULL, 0));
				CK(cudaDeviceSynchronize());
				to_host(gw, dw, wn * 4);
				char what[80];
				snprintf(what, sizeof(what),
				         "attn_band %s hd %u nq %u G %u len %u",
				         DT_NAME[di], hd, nq, g, len);
				close_enough(what, w, gw, wn, 1e-5f, 2e-4f);
				cudaFree(dq);
				cudaFree(dlse);
				cudaFree(dqp);
				cudaFree(dkp);
				cudaFree(dw);
				free(q);
				free(lse);
				free(qpos);
				free(kpos);
				free(w);
				free(gw);
				free(ks);
				plist_free(&p);
			}
}

/* ------------------------------------------------------------- scorers */

static cublasHandle_t blas(void)
{
	cublasHandle_t h;
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
		th_fail(__FILE__, __LINE__, "cublasCreate failed");
	return h;
}

TEST_T(cuda, scorer_linear, 120)
{
	need_device();
	static const uint32_t N[] = {0, 1, 17, 300};
	static const uint32_t DIN[] = {1, 64, 257, 4096};
	static const uint32_t DOUT[] = {1, 8, 33};
	cublasHandle_t h = blas();
	for (size_t a = 0; a < 4; a++)
		for (size_t b = 0; b < 4; b++)
			for (size_t c = 0; c < 3; c++)
				for (int wb = 0; wb < 2; wb++) {
					uint32_t n = N[a], di = DIN[b], dout = DOUT[c];
					float *x = xmalloc((size_t)n * di * 4 + 4);
					float *W = xmalloc((size_t)dout * di * 4);
					float *bb = xmalloc(dout * 4);
					float *y = xmalloc((size_t)n * dout * 4 + 4);
					float *gy = xmalloc((size_t)n * dout * 4 + 4);
					fill(x, (size_t)n * di, 1.0f);
					fill(W, (size_t)dout * di, 1.0f / sqrtf((float)di));
					fill(bb, dout, 1.0f);
					scorer_linear_cpu(x, n, di, W, wb ? bb : NULL,
					                  dout, y);
					float *dx = to_dev(x, (size_t)n * di * 4);
					float *dW = to_dev(W, (size_t)dout * di * 4);
					float *db = to_dev(bb, dout * 4);
					float *dy = dmalloc((size_t)n * dout * 4);
					T_OK(scorer_linear_cuda(h, dx, n, di, dW,
					                        wb ? db : NULL, dout,
					                        dy, 0));
					CK(cudaDeviceSynchronize());
					to_host(gy, dy, (size_t)n * dout * 4);
					close_enough("scorer_linear", y, gy,
					             (size_t)n * dout, 1e-4f, 1e-4f);
					cudaFree(dx);
					cudaFree(dW);
					cudaFree(db);
					cudaFree(dy);
					free(x);
					free(W);
					free(bb);
					free(y);
					free(gy);
				}
	cublasDestroy(h);
}

TEST_T(cuda, scorer_mlp, 120)
{
	need_device();
	static const uint32_t N[] = {1, 17, 300};
	static const uint32_t DIN[] = {1, 64, 513};
	static const uint32_t HID[] = {1, 16, 512};
	static const uint32_t DOUT[] = {1, 8};
	cublasHandle_t h = blas();
	for (size_t a = 0; a < 3; a++)
		for (size_t b = 0; b < 3; b++)
			for (size_t hh = 0; hh < 3; hh++)
				for (size_t c = 0; c < 2; c++) {
					uint32_t n = N[a], di = DIN[b], hid = HID[hh];
					uint32_t dout = DOUT[c];
					int wb = (a + b + hh + c) & 1;
					float *x = xmalloc((size_t)n * di * 4);
					float *W1 = xmalloc((size_t)hid * di * 4);
					float *b1 = xmalloc(hid * 4);
					float *W2 = xmalloc((size_t)dout * hid * 4);
					float *b2 = xmalloc(dout * 4);
					float *hs = xmalloc((size_t)n * hid * 4);
					float *y = xmalloc((size_t)n * dout * 4);
					float *gy = xmalloc((size_t)n * dout * 4);
					fill(x, (size_t)n * di, 2.0f);
					fill(W1, (size_t)hid * di, 1.0f / sqrtf((float)di));
					fill(b1, hid, 0.5f);
					fill(W2, (size_t)dout * hid, 1.0f / sqrtf((float)hid));
					fill(b2, dout, 0.5f);
					scorer_mlp_cpu(x, n, di, W1, wb ? b1 : NULL, hid,
					               W2, wb ? b2 : NULL, dout, y, hs);
					float *dx = to_dev(x, (size_t)n * di * 4);
					float *dW1 = to_dev(W1, (size_t)hid * di * 4);
					float *db1 = to_dev(b1, hid * 4);
					float *dW2 = to_dev(W2, (size_t)dout * hid * 4);
					float *db2 = to_dev(b2, dout * 4);
					float *dh = dmalloc((size_t)n * hid * 4);
					float *dy = dmalloc((size_t)n * dout * 4);
					T_OK(scorer_mlp_cuda(h, dx, n, di, dW1,
					                     wb ? db1 : NULL, hid, dW2,
					                     wb ? db2 : NULL, dout, dy,
					                     dh, 0));
					CK(cudaDeviceSynchronize());
					to_host(gy, dy, (size_t)n * dout * 4);
					close_enough("scorer_mlp", y, gy,
					             (size_t)n * dout, 1e-4f, 1e-4f);
					cudaFree(dx);
					cudaFree(dW1);
					cudaFree(db1);
					cudaFree(dW2);
					cudaFree(db2);
					cudaFree(dh);
					cudaFree(dy);
					free(x);
					free(W1);
					free(b1);
					free(W2);
					free(b2);
					free(hs);
					free(y);
					free(gy);
				}
	cublasDestroy(h);
}

TEST_T(cuda, sink_gate, 120)
{
	need_device();
	static const uint32_t N[] = {1, 50};
	static const uint32_t DIN[] = {32, 129};
	static const uint32_t NKV[] = {1, 3, 8};
	static const uint32_t G[] = {1, 4};
	static const uint32_t DP[] = {16, 5};
	static const uint32_t S[] = {0, 1, 16};
	cublasHandle_t h = blas();
	for (size_t a = 0; a < 2; a++)
		for (size_t b = 0; b < 2; b++)
			for (size_t c = 0; c < 3; c++)
				for (size_t d = 0; d < 2; d++)
					for (size_t e = 0; e < 2; e++) {
	uint32_t n = N[a], di = DIN[b], nkv = NKV[c], g = G[d], dp = DP[e];
	uint32_t s = S[(a + b + c + d + e) % 3];
	size_t nq = (size_t)nkv * g * dp, nk = (size_t)nkv * dp;
	float *x = xmalloc((size_t)n * di * 4), *Wq = xmalloc(nq * di * 4);
	float *cq = xmalloc(nq * 4), *Wk = xmalloc(nk * di * 4);
	float *gq = xmalloc(dp * 4), *gk = xmalloc(dp * 4);
	float *sk = xmalloc(((size_t)nkv * s * dp + 1) * 4);
	float *bias = xmalloc((size_t)nkv * g * 4);
	size_t scr_n = (size_t)n * nkv * (g + 1) * dp;
	float *scr = xmalloc(scr_n * 4), *sc = xmalloc((size_t)n * nkv * 4);
	float *gsc = xmalloc((size_t)n * nkv * 4);
	fill(x, (size_t)n * di, 2.0f);
	fill(Wq, nq * di, 1.0f / sqrtf((float)di));
	fill(cq, nq, 0.3f);
	fill(Wk, nk * di, 1.0f / sqrtf((float)di));
	fill(gq, dp, 1.0f);
	fill(gk, dp, 1.0f);
	fill(sk, (size_t)nkv * s * dp, 2.0f);
	fill(bias, (size_t)nkv * g, 2.0f);
	sink_gate_cpu(x, n, di, nkv, g, dp, s, Wq, cq, Wk, gq, gk, sk, bias, sc,
	              scr);
	float *dx = to_dev(x, (size_t)n * di * 4), *dWq = to_dev(Wq, nq * di * 4);
	float *dcq = to_dev(cq, nq * 4), *dWk = to_dev(Wk, nk * di * 4);
	float *dgq = to_dev(gq, dp * 4), *dgk = to_dev(gk, dp * 4);
	float *dsk = to_dev(sk, ((size_t)nkv * s * dp + 1) * 4);
	float *db = to_dev(bias, (size_t)nkv * g * 4);
	float *dscr = dmalloc(scr_n * 4), *dsc = dmalloc((size_t)n * nkv * 4);
	T_OK(sink_gate_cuda(h, dx, n, di, nkv, g, dp, s, dWq, dcq, dWk, dgq, dgk,
	                    dsk, db, dsc, dscr, 0));
	CK(cudaDeviceSynchronize());
	to_host(gsc, dsc, (size_t)n * nkv * 4);
	char what[80];
	snprintf(what, sizeof(what), "sink_gate n %u din %u nkv %u G %u dp %u S %u",
	         n, di, nkv, g, dp, s);
	close_enough(what, sc, gsc, (size_t)n * nkv, 2e-5f, 1e-4f);
	cudaFree(dx); cudaFree(dWq); cudaFree(dcq); cudaFree(dWk);
	cudaFree(dgq); cudaFree(dgk); cudaFree(dsk); cudaFree(db);
	cudaFree(dscr); cudaFree(dsc);
	free(x); free(Wq); free(cq); free(Wk); free(gq); free(gk); free(sk);
	free(bias); free(scr); free(sc); free(gsc);
					}
	cublasDestroy(h);
}

/* ----------------------------------------------------------- selection */

/* Scores with ties (quantised), NaNs and both zeros. */
static void sel_scores(float *sc, uint32_t n, int kind)
{
	for (uint32_t i = 0; i < n; i++) {
		float v = frnd();
		if (kind == 1)
			v = (float)(rnd() % 7) - 3.0f; /* many ties */
		sc[i] = v;
		uint32_t r = rnd() % 50;
		if (r == 0)
			sc[i] = NAN;
		else if (r == 1)
			sc[i] = -0.0f;
		else if (r == 2)
			sc[i] = 0.0f;
		else if (r == 3)
			sc[i] = -INFINITY;
	}
}

TEST_T(cuda, select_topk, 120)
{
	need_device();
	static const uint32_t N[] = {0, 1, 2, 100, 1000, 5000, 40000};
	for (size_t a = 0; a < sizeof(N) / 4; a++)
		for (int kind = 0; kind < 2; kind++)
			for (int rk = 0; rk < 3; rk++)
				for (int kk = 0; kk < 6; kk++) {
					uint32_t n = N[a];
					uint32_t K[6] = {0, 1, n / 2, n ? n - 1 : 0, n,
					                 n + 5};
					uint32_t k = K[kk];
					float *sc = xmalloc(n * 4 + 4);
					uint32_t *rank = xmalloc(n * 4 + 4);
					uint8_t *prot = xmalloc(n + 1);
					uint8_t *drop = xmalloc(n + 1), *gd = xmalloc(n + 1);
					uint32_t *scr = xmalloc(n * 4 + 4);
					sel_scores(sc, n, kind);
					for (uint32_t i = 0; i < n; i++) {
						/* distinct positions, repeated ranks, or
						 * none (index ranks) */
						rank[i] = rk == 1 ? rnd() % 5 : i * 7 + 3;
						prot[i] = rnd() % 4 == 0;
					}
					int use_prot = (kk + kind) & 1;
					uint32_t cnt = select_topk_cpu(
						sc, rk == 2 ? NULL : rank,
						use_prot ? prot : NULL, n, k, drop, scr);
					float *dsc = to_dev(sc, n * 4);
					uint32_t *drk = to_dev(rank, n * 4);
					uint8_t *dpr = to_dev(prot, n);
					uint8_t *ddr = dmalloc(n + 1);
					uint32_t *dcnt = dmalloc(4), gcnt = 12345;
					T_OK(select_topk_cuda(dsc, rk == 2 ? NULL : drk,
					                      use_prot ? dpr : NULL, n,
					                      k, ddr, NULL, dcnt, 0));
					CK(cudaDeviceSynchronize());
					to_host(gd, ddr, n);
					to_host(&gcnt, dcnt, 4);
					for (uint32_t i = 0; i < n; i++)
						if (gd[i] != drop[i])
							th_fail(__FILE__, __LINE__,
							        "topk n %u k %u kind %d "
							        "rank %d: drop[%u] cpu %u "
							        "gpu %u (score %g)",
							        n, k, kind, rk, i,
							        drop[i], gd[i], sc[i]);
					T_EQ(gcnt, cnt);
					cudaFree(dsc);
					cudaFree(drk);
					cudaFree(dpr);
					cudaFree(ddr);
					cudaFree(dcnt);
					free(sc);
					free(rank);
					free(prot);
					free(drop);
					free(gd);
					free(scr);
				}
}

/* Lists of one batch, with index ranks (rank NULL ranks each entry by its
 * index in its list), repeated ranks and ties, with and without protect. */
TEST_T(cuda, select_topk_batch, 60)
{
	need_device();
	const uint32_t L = 9;
	for (int var = 0; var < 3; var++) {
		uint32_t first[10], k[9], total = 0;
		for (uint32_t l = 0; l < L; l++) {
			first[l] = total;
			total += l == 4 ? 0 : rnd() % 3000;
			k[l] = rnd() % 1500;
		}
		first[L] = total;
		float *sc = xmalloc(total * 4 + 4);
		uint32_t *rank = xmalloc(total * 4 + 4);
		uint32_t *scr = xmalloc(total * 4 + 4);
		uint8_t *prot = xmalloc(total + 1), *drop = xmalloc(total + 1);
		uint8_t *gd = xmalloc(total + 1);
		uint32_t cnt[9], gcnt[9];
		/* 0: positions as ranks; 1: no ranks, ties; 2: repeated
		 * ranks, ties, nothing protected */
		const int no_rank = var == 1, no_prot = var == 2;
		sel_scores(sc, total, var > 0);
		for (uint32_t i = 0; i < total; i++) {
			rank[i] = var == 2 ? rnd() % 5 : i;
			prot[i] = rnd() % 5 == 0;
		}
		for (uint32_t l = 0; l < L; l++)
			cnt[l] = select_topk_cpu(
				sc + first[l], no_rank ? NULL : rank + first[l],
				no_prot ? NULL : prot + first[l],
				first[l + 1] - first[l], k[l], drop + first[l], scr);
		float *dsc = to_dev(sc, total * 4);
		uint32_t *drk = to_dev(rank, total * 4);
		uint8_t *dpr = to_dev(prot, total), *ddr = dmalloc(total + 1);
		uint32_t *df = to_dev(first, sizeof(first));
		uint32_t *dk = to_dev(k, sizeof(k));
		uint32_t *dc = dmalloc(sizeof(gcnt));
		T_OK(select_topk_batch_cuda(dsc, no_rank ? NULL : drk,
		                            no_prot ? NULL : dpr, df, L, dk, ddr,
		                            dc, 0));
		CK(cudaDeviceSynchronize());
		to_host(gd, ddr, total);
		to_host(gcnt, dc, sizeof(gcnt));
		for (uint32_t i = 0; i < total; i++)
			if (gd[i] != drop[i])
				th_fail(__FILE__, __LINE__,
				        "topk batch variant %d: drop[%u] cpu %u "
				        "gpu %u (score %g)",
				        var, i, drop[i], gd[i], sc[i]);
		for (uint32_t l = 0; l < L; l++)
			T_EQ(gcnt[l], cnt[l]);
		cudaFree(dsc);
		cudaFree(drk);
		cudaFree(dpr);
		cudaFree(ddr);
		cudaFree(df);
		cudaFree(dk);
		cudaFree(dc);
		free(sc);
		free(rank);
		free(scr);
		free(prot);
		free(drop);
		free(gd);
	}
}

TEST_T(cuda, select_threshold, 60)
{
	need_device();
	static const uint32_t N[] = {0, 1, 31, 32, 33, 1000, 100000};
	static const float TAU[] = {-INFINITY, -0.5f, 0.0f, 0.7f, INFINITY};
	for (size_t a = 0; a < sizeof(N) / 4; a++)
		for (size_t t = 0; t < 5; t++)
			for (int up = 0; up < 2; up++) {
				uint32_t n = N[a];
				float *sc = xmalloc(n * 4 + 4);
				uint8_t *prot = xmalloc(n + 1), *drop = xmalloc(n + 1);
				uint8_t *gd = xmalloc(n + 1);
				sel_scores(sc, n, (int)(t & 1));
				for (uint32_t i = 0; i < n; i++)
					prot[i] = rnd() % 3 == 0;
				uint32_t cnt = select_threshold_cpu(
					sc, up ? prot : NULL, n, TAU[t], drop);
				float *dsc = to_dev(sc, n * 4);
				uint8_t *dpr = to_dev(prot, n), *ddr = dmalloc(n + 1);
				uint32_t *dc = dmalloc(4), gcnt = 777;
				T_OK(select_threshold_cuda(dsc, up ? dpr : NULL, n,
				                           TAU[t], ddr, dc, 0));
				CK(cudaDeviceSynchronize());
				to_host(gd, ddr, n);
				to_host(&gcnt, dc, 4);
				T_ASSERT(n == 0 || memcmp(gd, drop, n) == 0);
				T_EQ(gcnt, cnt);
				cudaFree(dsc);
				cudaFree(dpr);
				cudaFree(ddr);
				cudaFree(dc);
				free(sc);
				free(prot);
				free(drop);
				free(gd);
			}
}

/* ------------------------------------------------------------- backend */

static const struct kvt_backend_ops *cuda_ops(void)
{
	static char why[256];
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	T_EQ(o->abi, KVT_BACKEND_ABI);
	T_EQ_STR(o->name, "cuda");
	if (o->probe(why, sizeof(why)))
		T_SKIP(why);
	return o;
}

TEST(cuda, backend_probe_and_chunk)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx;
	const char *mode = NULL;
	char err[256];
	int n = 0;
	T_OK(o->device_count(&n));
	T_ASSERT(n > 0);
	T_OK(o->ctx_new(0, &ctx, &mode, err, sizeof(err)));
	T_ASSERT(mode && (!strcmp(mode, "vmm") || !strcmp(mode, "ipc")));
	fprintf(stderr, "    sharing mode: %s\n", mode);
#ifdef KVT_CUDA_EMU
	/* the emulated device has VMM, like an H100/H200; without it, see
	 * backend_without_vmm */
	if (!getenv("KVTRIM_CUDA_SHARE"))
		T_EQ_STR(mode, "vmm");
#endif
	T_EQ(o->share(ctx), !strcmp(mode, "vmm") ? KVT_BACKEND_SHARE_VMM
	                                         : KVT_BACKEND_SHARE_IPC);
	if (!getenv("KVTRIM_CUDA_SHARE")) {
		void *c2;
		const char *m2 = NULL;
		/* ipc is what a forced ipc mode gives on any device */
		setenv("KVTRIM_CUDA_SHARE", "ipc", 1);
		T_OK(o->ctx_new(0, &c2, &m2, err, sizeof(err)));
		T_EQ_STR(m2, "ipc");
		o->ctx_free(c2);
		/* ipc by necessity: demanding vmm fails and says why */
		if (!strcmp(mode, "ipc")) {
			setenv("KVTRIM_CUDA_SHARE", "vmm", 1);
			T_ERR(o->ctx_new(0, &c2, NULL, err, sizeof(err)),
			      KVT_ENOTSUP);
			fprintf(stderr, "    %s\n", err);
			T_ASSERT(strstr(err, "KVTRIM_CUDA_SHARE=vmm") != NULL);
		}
		unsetenv("KVTRIM_CUDA_SHARE");
	}
	struct kvt_backend_chunk c;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &c));
	T_ASSERT(c.base != NULL);
	T_EQ_U64(c.bytes, KVT_CHUNK_BYTES);
	if (o->share(ctx) == KVT_BACKEND_SHARE_VMM)
		T_ASSERT(c.fd >= 0);
	else
		T_EQ(c.fd, -1);
	uint8_t *h = xmalloc(KVT_CHUNK_BYTES);
	to_host(h, c.base, KVT_CHUNK_BYTES);
	for (size_t i = 0; i < KVT_CHUNK_BYTES; i++)
		if (h[i])
			th_fail(__FILE__, __LINE__, "chunk byte %zu not zero", i);
	free(h);
	o->chunk_free(ctx, &c);
	T_ASSERT(c.base == NULL);
	T_EQ(c.fd, -1);
	o->chunk_free(ctx, &c); /* twice is harmless */
	T_ERR(o->chunk_new(ctx, 12345, &c), KVT_EINVAL);
	o->ctx_free(ctx);
}

/* The backend's batched compaction against compact_cpu. */
TEST(cuda, backend_compact)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ctx, &s));
	for (int round = 0; round < 3; round++) {
		struct plist a, b;
		plist_make(&a, 5, 16, 128, KVT_DTYPE_F16);
		plist_make(&b, 3, 8, 64, KVT_DTYPE_F32);
		void **ahp = xmalloc(5 * sizeof(void *));
		void **bhp = xmalloc(3 * sizeof(void *));
		for (uint32_t i = 0; i < 5; i++)
			ahp[i] = a.dev + (size_t)a.ids[i] * a.page_bytes;
		for (uint32_t i = 0; i < 3; i++)
			bhp[i] = b.dev + (size_t)b.ids[i] * b.page_bytes;
		struct kvt_backend_compact L[5];
		uint32_t *mv[2], nl;
		struct plist *ps[2] = {&a, &b};
		void **hp[2] = {ahp, bhp};
		for (int l = 0; l < 2; l++) {
			uint32_t len = ps[l]->n_pages * ps[l]->page_tokens - rnd() % 5;
			uint8_t *drop = xmalloc(len);
			for (uint32_t i = 0; i < len; i++)
				drop[i] = rnd() % 2;
			mv[l] = xmalloc((size_t)len * 8);
			uint32_t nm = compact_plan(drop, len, mv[l], &nl);
			compact_cpu(ps[l]->hptr, ps[l]->page_tokens,
			            (uint32_t)ps[l]->row_bytes, mv[l], nm);
			L[1 + 2 * l] = (struct kvt_backend_compact){
				hp[l], ps[l]->n_pages, ps[l]->page_tokens,
				(uint32_t)ps[l]->row_bytes, nm, mv[l]};
			free(drop);
		}
		/* untouched lists first, between the two geometries (a run
		 * goes on across them) and last */
		L[0] = L[1];
		L[0].n_moves = 0;
		L[0].page_tokens = 7;
		L[2] = L[4] = L[0];
		T_OK(o->compact(ctx, L, 5, s));
		T_OK(o->stream_sync(ctx, s));
		pools_equal("backend compact a", &a);
		pools_equal("backend compact b", &b);
		/* nothing to move; no list */
		T_OK(o->compact(ctx, L, 1, s));
		T_OK(o->compact(ctx, L, 0, s));
		/* a move beyond the pages is refused before any launch */
		uint32_t bad[2] = {0, 5 * 16};
		struct kvt_backend_compact B = L[1];
		B.moves = bad;
		B.n_moves = 1;
		T_ERR(o->compact(ctx, &B, 1, s), KVT_EINVAL);
		B = L[1];
		B.pages = NULL;
		T_ERR(o->compact(ctx, &B, 1, s), KVT_EINVAL);
		free(mv[0]);
		free(mv[1]);
		free(ahp);
		free(bhp);
		plist_free(&a);
		plist_free(&b);
	}
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
}

#ifdef KVT_CUDA_EMU
/*
 * The steps of cross_process below, exporter and importer in one process
 * (two contexts), which the emulator allows and CUDA does not, in both
 * sharing modes: the chunk is imported from its fd (vmm) or its 64 handle
 * bytes (ipc), an interprocess event opened from its handle; each side
 * writes, records, and the other waits and reads.  In ipc mode the
 * importer closes the chunk before the exporter frees it (the emulator
 * refuses to free memory still open through a handle, which the
 * device-memory count at the end would show).  In vmm mode the exporter
 * frees first and the importer still reads the bytes: its mapping holds
 * the memory, as the driver's reference count does, until it unmaps.
 */
static void share_in_one_process(const char *share)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ex, *im, *se, *si;
	const char *mode = NULL;
	char err[256];
	size_t free0 = 0, free1 = 0, total = 0;
	const int vmm = !strcmp(share, "vmm");
	fprintf(stderr, "    mode %s\n", share);
	setenv("KVTRIM_CUDA_SHARE", share, 1);
	CK(cudaMemGetInfo(&free0, &total));
	T_OK(o->ctx_new(0, &ex, &mode, err, sizeof(err)));
	T_EQ_STR(mode, share);
	T_OK(o->ctx_new(0, &im, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ex, &se));
	T_OK(o->stream_new(im, &si));
	struct kvt_backend_chunk c, ic, bad;
	struct kvt_backend_event e, ie;
	T_OK(o->chunk_new(ex, KVT_CHUNK_BYTES, &c));
	if (vmm)
		T_ASSERT(c.fd >= 0);
	else
		T_EQ(c.fd, -1);
	T_OK(o->event_new(ex, &e));
	T_EQ(e.owner, 1);
	T_OK(o->chunk_import(im, c.fd, vmm ? NULL : c.ipc, c.bytes, &ic));
	T_ASSERT(ic.base != NULL);
	T_ASSERT(ic.base != c.base || !vmm); /* a mapping of its own */
	T_EQ(ic.fd, -1);
	T_EQ_U64(ic.bytes, c.bytes);
	T_OK(o->event_open(im, e.handle, &ie));
	T_EQ(ie.owner, 0);

	const size_t n = KVT_CHUNK_BYTES;
	uint8_t *want = xmalloc(n), *got = xmalloc(n);
	for (size_t i = 0; i < n; i++)
		want[i] = (uint8_t)rnd();
	/* exporter writes and records; the importer's stream waits */
	T_OK(o->copy(ex, c.base, want, n, se));
	T_OK(o->event_record(ex, &e, se));
	T_OK(o->stream_wait_event(im, si, &ie));
	T_OK(o->copy(im, got, ic.base, n, si));
	T_ASSERT(memcmp(got, want, n) == 0);
	/* and back: the importer records the event it opened */
	for (size_t i = 4096; i < 8192; i++)
		want[i] = (uint8_t)~want[i];
	T_OK(o->copy(im, (char *)ic.base + 4096, want + 4096, 4096, si));
	T_OK(o->event_record(im, &ie, si));
	T_OK(o->stream_wait_event(ex, se, &e));
	T_OK(o->copy(ex, got, c.base, n, se));
	T_ASSERT(memcmp(got, want, n) == 0);

	/* an fd that is no VMM export is refused, not crashed on */
	int fd = open("/dev/null", O_RDONLY);
	T_ASSERT(fd >= 0);
	T_ERR(o->chunk_import(im, fd, NULL, KVT_CHUNK_BYTES, &bad), KVT_EINVAL);
	T_ASSERT(bad.base == NULL);
	close(fd);
	fprintf(stderr, "    %s\n", o->last_error());
	/* a size that is no multiple of the granularity is refused */
	if (vmm) {
		T_ERR(o->chunk_import(im, c.fd, NULL, c.bytes - 4096, &bad),
		      KVT_EINVAL);
		T_ASSERT(bad.base == NULL);
	}
	/* bytes that are no handle are refused */
	uint8_t junk[KVT_BACKEND_IPC_BYTES];
	memset(junk, 0x5a, sizeof(junk));
	T_ASSERT(o->chunk_import(im, -1, junk, KVT_CHUNK_BYTES, &bad) < 0);
	T_ASSERT(bad.base == NULL);
	fprintf(stderr, "    %s\n", o->last_error());

	void *ib = ic.base;
	o->event_free(im, &ie);
	if (vmm) {
		/* the exporter goes first; the importer's mapping still reads
		 * the bytes, then gives them back when it unmaps */
		o->event_free(ex, &e);
		o->chunk_free(ex, &c);
		T_ASSERT(c.base == NULL);
		T_EQ(c.fd, -1);
		memset(got, 0, n);
		T_OK(o->copy(im, got, ic.base, n, si));
		T_ASSERT(memcmp(got, want, n) == 0);
		CK(cudaMemGetInfo(&free1, &total));
		T_EQ_U64(free0 - free1, n); /* held by the mapping */
		o->chunk_unmap(im, &ic);
	} else {
		o->chunk_unmap(im, &ic);
		o->event_free(ex, &e);
		o->chunk_free(ex, &c);
	}
	T_ASSERT(ic.base == NULL);
	/* the unmapped range is no device memory any more */
	T_EQ(cudaMemcpy(got, ib, 16, cudaMemcpyDeviceToHost),
	     cudaErrorInvalidValue);
	(void)cudaGetLastError();
	o->stream_free(im, si);
	o->ctx_free(im);
	o->stream_free(ex, se);
	o->ctx_free(ex);
	CK(cudaGetLastError());
	CK(cudaMemGetInfo(&free1, &total));
	T_EQ_U64(free1, free0); /* every byte went back, the chunk's too */
	free(want);
	free(got);
	unsetenv("KVTRIM_CUDA_SHARE");
}

TEST(cuda, backend_share_in_one_process)
{
	share_in_one_process("vmm");
	share_in_one_process("ipc");
}

/*
 * A driver without VMM (kvt_emu_set_driver, emulator only; the backend
 * caches the driver entry points, so each case runs in a child of its
 * own): the backend falls back to legacy IPC, KVTRIM_CUDA_SHARE=vmm fails
 * and says why, and a VMM chunk (an fd) cannot be imported.
 */
static int without_vmm(int level)
{
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	void *ctx;
	const char *mode = NULL;
	char err[256];
	struct kvt_backend_chunk c;
	kvt_emu_set_driver(level);
	unsetenv("KVTRIM_CUDA_SHARE");
	if (o->ctx_new(0, &ctx, &mode, err, sizeof(err)) || strcmp(mode, "ipc"))
		return 1;
	if (o->chunk_new(ctx, KVT_CHUNK_BYTES, &c) || c.fd != -1)
		return 2;
	o->chunk_free(ctx, &c);
	int fd = open("/dev/null", O_RDONLY);
	int rv = o->chunk_import(ctx, fd, NULL, KVT_CHUNK_BYTES, &c);
	close(fd);
	fprintf(stderr, "    import of an fd: %s\n", o->last_error());
	if (level == KVT_EMU_DRIVER_NONE ? rv != KVT_ENOTSUP : rv >= 0)
		return 3;
	o->ctx_free(ctx);
	setenv("KVTRIM_CUDA_SHARE", "vmm", 1);
	if (o->ctx_new(0, &ctx, NULL, err, sizeof(err)) != KVT_ENOTSUP)
		return 4;
	fprintf(stderr, "    %s\n", err);
	if (!strstr(err, "KVTRIM_CUDA_SHARE=vmm") ||
	    !strstr(err, level == KVT_EMU_DRIVER_NONE ? "entry point"
	                                              : "cannot export"))
		return 5;
	return 0;
}

TEST(cuda, backend_without_vmm)
{
	cuda_ops();
	for (int level = KVT_EMU_DRIVER_NONE; level <= KVT_EMU_DRIVER_NO_VMM;
	     level++) {
		pid_t pid = fork();
		T_ASSERT(pid >= 0);
		if (pid == 0)
			_exit(without_vmm(level));
		int st = 0;
		T_EQ(waitpid(pid, &st, 0), pid);
		T_ASSERT(WIFEXITED(st));
		if (WEXITSTATUS(st))
			th_fail(__FILE__, __LINE__,
			        "driver level %d: step %d failed", level,
			        WEXITSTATUS(st));
	}
}
#endif /* KVT_CUDA_EMU */

/*
 * Importer in a child process (which has not touched CUDA: forked before
 * the parent initialises it): maps the chunk from the fd or handle, opens
 * the event, makes its stream wait on it, reads the chunk and reports
 * whether it saw the exporter's pattern.
 */
static int importer(int sock)
{
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	struct handle_ext x, xe;
	int fd, efd;
	char err[256], go;
	void *ctx, *s;
	/* the daemon's packets: the chunk (fd, or the IPC handle in data),
	 * then its event */
	if (handle_recv_ext(sock, &x, &fd, 10000) ||
	    x.h.type != HANDLE_CHUNK_DEV ||
	    handle_recv_ext(sock, &xe, &efd, 10000) ||
	    xe.h.type != HANDLE_EVENT)
		return 10;
	if (o->ctx_new(0, &ctx, NULL, err, sizeof(err)) ||
	    o->stream_new(ctx, &s))
		return 11;
	struct kvt_backend_chunk c;
	struct kvt_backend_event e;
	if (o->chunk_import(ctx, fd, x.data, x.h.size, &c)) {
		fprintf(stderr, "    import: %s\n", o->last_error());
		return 12;
	}
	if (fd >= 0)
		close(fd); /* the mapping keeps the memory */
	if (o->event_open(ctx, xe.data, &e))
		return 13;
	if (read(sock, &go, 1) != 1) /* exporter recorded its event */
		return 14;
	uint64_t bytes = x.h.size;
	uint8_t *h = malloc(bytes);
	if (!h || o->stream_wait_event(ctx, s, &e) ||
	    cudaMemcpyAsync(h, c.base, bytes, cudaMemcpyDeviceToHost,
	                    (cudaStream_t)s) != cudaSuccess ||
	    o->stream_sync(ctx, s))
		return 15;
	int bad = 0;
	for (uint64_t i = 0; i < bytes; i++)
		bad |= h[i] != 0x5a;
	free(h);
	o->event_free(ctx, &e);
	o->chunk_unmap(ctx, &c);
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
	char done = bad ? 'B' : 'G';
	if (write(sock, &done, 1) != 1)
		return 16;
	return bad ? 17 : 0;
}

static void cross_process(const char *share)
{
	int sv[2];
	/* the handle channel's socket type and packets (ipc/handle.h) */
	T_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	if (share)
		setenv("KVTRIM_CUDA_SHARE", share, 1);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		_exit(importer(sv[1]));
	}
	close(sv[1]);
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s;
	const char *mode;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, &mode, err, sizeof(err)));
	if (share)
		T_EQ_STR(mode, share);
#ifdef KVT_CUDA_EMU
	else
		T_EQ_STR(mode, "vmm"); /* as on an H100/H200 */
#endif
	fprintf(stderr, "    sharing mode: %s\n", mode);
	T_OK(o->stream_new(ctx, &s));
	struct kvt_backend_chunk c;
	struct kvt_backend_event e;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &c));
	T_OK(o->event_new(ctx, &e));
	struct handle_ext x = {.h = {.magic = HANDLE_MAGIC,
	                             .type = HANDLE_CHUNK_DEV,
	                             .size = c.bytes}};
	memcpy(x.data, c.ipc, sizeof(x.data));
	T_OK(handle_send_ext(sv[0], &x, c.fd));
	x.h.type = HANDLE_EVENT;
	x.h.size = 0;
	memcpy(x.data, e.handle, sizeof(x.data));
	T_OK(handle_send_ext(sv[0], &x, -1));
	/* write, record, tell: the importer's stream waits on the event,
	 * not on this process's host thread */
	CK(cudaMemsetAsync(c.base, 0x5a, c.bytes, (cudaStream_t)s));
	T_OK(o->event_record(ctx, &e, s));
	char go = 'r', done = 0;
	T_EQ(write(sv[0], &go, 1), 1);
	T_EQ(read(sv[0], &done, 1), 1);
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st));
	T_EQ(WEXITSTATUS(st), 0);
	T_EQ(done, 'G');
	o->event_free(ctx, &e);
	o->chunk_free(ctx, &c);
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
	close(sv[0]);
}

TEST_T(cuda, backend_share_across_processes, 60)
{
	/* probe in a child: the parent forks the importer before touching
	 * CUDA */
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		char why[256];
		_exit(kvt_cuda_backend_v1.probe(why, sizeof(why)) ? 77 : 0);
	}
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 77)
		T_SKIP("no usable CUDA device");
	cross_process(NULL);
}

TEST_T(cuda, backend_share_legacy_ipc, 60)
{
#if defined(KVT_CUDA_EMU) && defined(__SANITIZE_ADDRESS__)
	/* emulated device memory is the heap under ASan (runtime.cc) */
	T_SKIP("cuda emulator under ASan: cudaMalloc memory is heap, not "
	       "shared between processes (backend_share_in_one_process "
	       "covers ipc)");
#endif
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		char why[256];
		_exit(kvt_cuda_backend_v1.probe(why, sizeof(why)) ? 77 : 0);
	}
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 77)
		T_SKIP("no usable CUDA device");
	cross_process("ipc");
}

/*
 * ABI 3: copy (kvt_memcpy), private device memory, and upload_regions (the
 * daemon's device table, the client's chunk bases).  Expected bytes are
 * the same regions applied to a host buffer with memcpy.
 */
TEST(cuda, backend_copy_and_upload_regions)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s[2];
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ctx, &s[0]));
	T_OK(o->stream_new(ctx, &s[1]));
	const size_t n = 1 << 16;
	uint8_t *src = xmalloc(n), *want = xmalloc(n), *got = xmalloc(n);
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(rnd() | 1); /* never 0: zeros are "not copied" */

	/* mem_new is zeroed; copy goes host->device, device->device and
	 * device->host on a stream and waits. */
	void *p, *q;
	T_OK(o->mem_new(ctx, n, &p));
	T_OK(o->mem_new(ctx, n, &q));
	T_OK(o->copy(ctx, got, p, n, s[0]));
	for (size_t i = 0; i < n; i++)
		if (got[i])
			th_fail(__FILE__, __LINE__, "mem_new byte %zu not zero", i);
	T_OK(o->copy(ctx, p, src, n, s[0]));
	T_OK(o->copy(ctx, q, p, n, s[1]));
	memset(got, 0, n);
	T_OK(o->copy(ctx, got, q, n, s[1]));
	T_ASSERT(memcmp(got, src, n) == 0);
	o->mem_free(ctx, q);
	o->mem_free(ctx, NULL); /* harmless */

	/* 40 uploads of disjoint random regions, alternating streams (more
	 * than the staging slots, so slots are reused across streams), each
	 * source changed right after the call: the device must hold the
	 * bytes as they were at the call. */
	void *dev;
	T_OK(o->mem_new(ctx, n, &dev));
	memset(want, 0, n);
	uint64_t at = 0;
	for (int call = 0; call < 40; call++) {
		struct kvt_backend_region r[64];
		uint32_t k = 1 + rnd() % 64;
		for (uint32_t j = 0; j < k; j++) {
			uint64_t bytes = 4 * (uint64_t)(rnd() % 9); /* 0..32 */
			if (at + bytes > n)
				bytes = 0;
			r[j] = (struct kvt_backend_region){at, bytes};
			at += bytes + 4 * (rnd() % 3);
		}
		T_OK(o->upload_regions(ctx, dev, src, r, k, s[call % 2]));
		for (uint32_t j = 0; j < k; j++)
			memcpy(want + r[j].off, src + r[j].off, r[j].bytes);
		for (uint32_t j = 0; j < k; j++) /* the caller moves on */
			memset(src + r[j].off, 0xee, r[j].bytes);
	}
	T_OK(o->stream_sync(ctx, s[0]));
	T_OK(o->copy(ctx, got, dev, n, s[1]));
	T_ASSERT(memcmp(got, want, n) == 0);

	/* A region that is not in whole words is refused; nothing moves. */
	struct kvt_backend_region bad[2] = {{0, 8}, {6, 4}};
	T_ERR(o->upload_regions(ctx, dev, src, bad, 2, s[0]), KVT_EINVAL);
	T_OK(o->copy(ctx, got, dev, n, s[0]));
	T_ASSERT(memcmp(got, want, n) == 0);
	T_OK(o->upload_regions(ctx, dev, src, bad, 0, s[0])); /* n 0 */

	o->mem_free(ctx, dev);
	o->mem_free(ctx, p);
	o->stream_free(ctx, s[0]);
	o->stream_free(ctx, s[1]);
	o->ctx_free(ctx);
	free(src);
	free(want);
	free(got);
}

/*
 * ABI 2: read_regions gathers regions of chunk memory into a strided host
 * buffer after the stream's queued work.  The chunk holds a known image;
 * region i must land at dst + i * stride, and the gaps between regions
 * keep their sentinel.  The cases cover the 16-byte path (sizes and
 * addresses multiples of 16), the byte path (odd sizes, or addresses off
 * by a few bytes), overlapping regions, and growth of the gather buffer
 * (over 1 MiB at once).
 */
TEST(cuda, backend_read_regions)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ctx, &s));
	struct kvt_backend_chunk c;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &c));
	const size_t n_img = KVT_CHUNK_BYTES;
	uint8_t *img = xmalloc(n_img);
	for (size_t i = 0; i < n_img; i++)
		img[i] = (uint8_t)rnd();
	T_OK(o->copy(ctx, c.base, img, n_img, s));

	static const struct {
		uint32_t n;
		size_t bytes, gap; /* stride = bytes + gap */
		uint32_t align;    /* region offsets: multiples of it ... */
		uint32_t skew;     /* ... plus this */
	} C[] = {
		{7, 256, 48, 16, 0},    /* 16-byte path, strided */
		{5, 100, 0, 4, 0},      /* byte path: odd size, packed */
		{6, 64, 13, 16, 3},     /* byte path: misaligned sources */
		{1, 1, 0, 1, 0},        /* one byte */
		{33, 48, 16, 16, 0},    /* many small */
		{300, 4096, 32, 16, 0}, /* 1.2 MiB: the gather buffer grows */
		{9, 4096, 0, 1, 1},     /* after growth, byte path */
		{2, 16, 0, 16, 0},
	};
	for (size_t k = 0; k < sizeof(C) / sizeof(C[0]); k++) {
		uint32_t n = C[k].n;
		size_t bytes = C[k].bytes, stride = bytes + C[k].gap;
		size_t span = (n_img - bytes - C[k].skew) / C[k].align;
		const void **src = xmalloc(n * sizeof(void *));
		size_t *off = xmalloc(n * sizeof(size_t));
		for (uint32_t i = 0; i < n; i++) {
			off[i] = (rnd() % span) * C[k].align + C[k].skew;
			src[i] = (const char *)c.base + off[i];
		}
		/* work queued before the read: it must see it */
		uint8_t v = (uint8_t)rnd();
		CK(cudaMemsetAsync((char *)c.base + off[0], v, bytes,
		                   (cudaStream_t)s));
		memset(img + off[0], v, bytes);
		size_t dn = (size_t)n * stride;
		uint8_t *dst = xmalloc(dn);
		memset(dst, 0xa5, dn);
		T_OK(o->read_regions(ctx, dst, stride, (const void *const *)src,
		                     n, bytes, s));
		for (uint32_t i = 0; i < n; i++)
			for (size_t j = 0; j < stride; j++) {
				uint8_t w = j < bytes ? img[off[i] + j] : 0xa5;
				if (dst[(size_t)i * stride + j] != w)
					th_fail(__FILE__, __LINE__,
					        "case %zu: region %u byte %zu "
					        "is %02x, expected %02x",
					        k, i, j,
					        dst[(size_t)i * stride + j], w);
			}
		free(dst);
		free(src);
		free(off);
	}

	/* nothing to read; bad arguments touch nothing */
	const void *one[1] = {c.base};
	uint8_t sent[32];
	memset(sent, 0xa5, sizeof(sent));
	T_OK(o->read_regions(ctx, sent, 16, one, 0, 16, s));
	T_OK(o->read_regions(ctx, sent, 16, one, 1, 0, s));
	T_ERR(o->read_regions(ctx, sent, 8, one, 1, 16, s), KVT_EINVAL);
	T_ERR(o->read_regions(ctx, NULL, 16, one, 1, 16, s), KVT_EINVAL);
	T_ERR(o->read_regions(ctx, sent, 16, NULL, 1, 16, s), KVT_EINVAL);
	for (size_t i = 0; i < sizeof(sent); i++)
		T_EQ(sent[i], 0xa5);

	o->chunk_free(ctx, &c);
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
	free(img);
}

/*
 * The staging slots under load: compact and upload_regions calls on three
 * streams, with no synchronisation between them, many more than the eight
 * slots, so slots are reused across streams while earlier calls may still
 * be queued; every few calls an upload bigger than a slot makes that slot
 * grow.  The host arrays of each call (pages, moves, source bytes) are
 * overwritten right after it returns.  Each stream owns its device buffer
 * and its page list, so the final bytes are those of the calls applied in
 * order on the CPU (memcpy and compact_cpu).
 */
#define ROT_STREAMS 3
#define ROT_BYTES ((size_t)256 << 10)

struct rot_stream {
	void *s, *dev;
	uint8_t *src, *want; /* [ROT_BYTES] */
	struct plist p;
	void **hp; /* host array of the list's device page addresses */
};

static void rotation_round(const struct kvt_backend_ops *o, void *ctx,
                           int calls)
{
	struct rot_stream R[ROT_STREAMS];
	for (int k = 0; k < ROT_STREAMS; k++) {
		struct rot_stream *r = &R[k];
		T_OK(o->stream_new(ctx, &r->s));
		T_OK(o->mem_new(ctx, ROT_BYTES, &r->dev));
		r->src = xmalloc(ROT_BYTES);
		r->want = xmalloc(ROT_BYTES);
		memset(r->want, 0, ROT_BYTES); /* mem_new is zeroed */
		for (size_t i = 0; i < ROT_BYTES; i++)
			r->src[i] = (uint8_t)rnd();
		plist_make(&r->p, 4 + k, 16, 64 + 32 * k, DTS[k % 3]);
		r->hp = xmalloc(r->p.n_pages * sizeof(void *));
	}
	for (int call = 0; call < calls; call++) {
		struct rot_stream *r = &R[call % ROT_STREAMS];
		if (call % 4 == 3) {
			/* compaction of the stream's list */
			struct plist *p = &r->p;
			uint32_t cap = p->n_pages * p->page_tokens;
			uint32_t len = cap - rnd() % 5, nl;
			uint8_t *drop = xmalloc(len);
			uint32_t *mv = xmalloc((size_t)len * 8);
			for (uint32_t i = 0; i < len; i++)
				drop[i] = rnd() % 3 == 0;
			uint32_t nm = compact_plan(drop, len, mv, &nl);
			compact_cpu(p->hptr, p->page_tokens,
			            (uint32_t)p->row_bytes, mv, nm);
			for (uint32_t i = 0; i < p->n_pages; i++)
				r->hp[i] = p->dev + (size_t)p->ids[i] * p->page_bytes;
			struct kvt_backend_compact L = {
				r->hp, p->n_pages, p->page_tokens,
				(uint32_t)p->row_bytes, nm, mv};
			T_OK(o->compact(ctx, &L, 1, r->s));
			/* the caller reuses its arrays at once */
			memset(mv, 0xff, (size_t)len * 8);
			memset(r->hp, 0, p->n_pages * sizeof(void *));
			free(drop);
			free(mv);
			continue;
		}
		/* disjoint regions in one call (the scatter kernel's blocks
		 * run in parallel); later calls overwrite earlier ones */
		struct kvt_backend_region rg[48];
		uint32_t k = 1 + rnd() % 48;
		uint64_t at = 4 * (uint64_t)(rnd() % 1024);
		for (uint32_t j = 0; j < k; j++) {
			uint64_t bytes = 4 * (uint64_t)(rnd() % 64);
			if (call % 7 == 0 && j == 0)
				bytes = (uint64_t)160 << 10; /* > a 64 KiB slot */
			if (at + bytes > ROT_BYTES)
				bytes = 0;
			rg[j] = (struct kvt_backend_region){at, bytes};
			at += bytes + 4 * (rnd() % 256);
		}
		T_OK(o->upload_regions(ctx, r->dev, r->src, rg, k, r->s));
		for (uint32_t j = 0; j < k; j++) {
			memcpy(r->want + rg[j].off, r->src + rg[j].off,
			       rg[j].bytes);
			for (uint64_t i = 0; i < rg[j].bytes; i++)
				r->src[rg[j].off + i] = (uint8_t)rnd();
		}
	}
	uint8_t *got = xmalloc(ROT_BYTES);
	for (int k = 0; k < ROT_STREAMS; k++) {
		struct rot_stream *r = &R[k];
		T_OK(o->stream_sync(ctx, r->s));
		T_OK(o->copy(ctx, got, r->dev, ROT_BYTES, r->s));
		for (size_t i = 0; i < ROT_BYTES; i++)
			if (got[i] != r->want[i])
				th_fail(__FILE__, __LINE__,
				        "stream %d: device byte %zu is %02x, "
				        "expected %02x",
				        k, i, got[i], r->want[i]);
		pools_equal("rotation compact", &r->p);
		o->mem_free(ctx, r->dev);
		o->stream_free(ctx, r->s);
		plist_free(&r->p);
		free(r->hp);
		free(r->src);
		free(r->want);
	}
	free(got);
}

TEST(cuda, backend_staging_rotation)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
#ifdef KVT_CUDA_EMU
	/* Work runs when queued there, so every slot would be free at once.
	 * With a lag, an event completes only after that many later records.
	 * Each call records two (copied, used) and takes the oldest slot
	 * first, whose events are 15 and 14 records old by then: a lag of
	 * 15 leaves its copy done but its launch not (the stream waits on
	 * the device), 1000 leaves every slot busy (the host waits). */
	static const unsigned LAG[] = {0, 15, 1000};
	for (size_t i = 0; i < sizeof(LAG) / sizeof(LAG[0]); i++) {
		kvt_emu_set_event_lag(LAG[i]);
		rotation_round(o, ctx, 60);
	}
	kvt_emu_set_event_lag(0);
#else
	rotation_round(o, ctx, 60);
#endif
	o->ctx_free(ctx);
}
