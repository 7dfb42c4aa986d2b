/*
 * bench_cuda_ops.cu — kvtrim-cuda-bench's benchmarks of the cuda backend's
 * ops and device rules (the gpu_kvt_attention_*, gpu_key_norms_*,
 * gpu_*_select_* and gpu_scorer_us_per_token_{h2o,tova,kvpop} lines:
 * bench_cuda.cu's header comment says what each measures), on device
 * tables and chunk-base arrays built by hand as the daemon and the client
 * keep them.
 */
#include "bench_cuda.cuh"
#include "expected_attention_rule.h"
#include "h2o_rule.h"
#include "kvpop_rule.h"
#include "snapkv_rule.h"
#include "tova_rule.h"

/* ------------------------------------------ through the backend's ops */

/* The 8B geometry of the op benchmarks: f16 pages of 16 entries of
 * head_dim 128 (K rows, then V rows), 32 layers, 32 query heads on 8 KV
 * heads. */
#define OB_PT 16u
#define OB_HD 128u
#define OB_ROW (OB_HD * 2u)
#define OB_PAGE ((uint64_t)2 * OB_PT * OB_ROW)
#define OB_LAYERS 32u
#define OB_KV 8u
#define OB_G 4u
#define OB_H (OB_KV * OB_G)

static double wall_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median host milliseconds of fn(), which must return with its work done
 * (a synchronous op, or work queued then waited for): at least 3 runs,
 * then more up to reps while the runs so far took under budget_ms.  No
 * warm-up: the caller runs fn once first (and checks what it wrote). */
template <typename F> static double wall_ms(F fn, int reps, double budget_ms)
{
	double t[64], spent = 0;
	int n = 0;
	if (reps > 64)
		reps = 64;
	while (n < reps && (n < 3 || spent < budget_ms)) {
		double a = wall_now_ms();
		fn();
		t[n] = wall_now_ms() - a;
		spent += t[n++];
	}
	qsort(t, (size_t)n, sizeof(double), cmp_d);
	return t[n / 2];
}

static __device__ uint32_t ob_hash(uint64_t i, uint32_t seed)
{
	uint32_t h = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ seed;
	h ^= h >> 15;
	h *= 2246822519u;
	h ^= h >> 13;
	h *= 3266489917u;
	h ^= h >> 16;
	return h;
}

/* n halves uniform in [-1, 1). */
__global__ void ob_fill_f16(uint16_t *p, uint64_t n, uint32_t seed)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		float x = (float)(ob_hash(i, seed) >> 8) * (1.0f / 8388608.0f) -
		          1.0f;
		p[i] = __half_as_ushort(__float2half(x));
	}
}

/* Staging rows of row_floats: lse (n_heads floats at lse_off) = lse, the
 * rest (x, q) uniform in [-1, 1). */
__global__ void ob_fill_ring(float *p, uint64_t n, uint32_t row_floats,
                             uint32_t lse_off, uint32_t n_heads, float lse,
                             uint32_t seed)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t col = (uint32_t)(i % row_floats);
		p[i] = col >= lse_off && col < lse_off + n_heads
		       ? lse
		       : (float)(ob_hash(i, seed) >> 8) * (1.0f / 8388608.0f) -
		                 1.0f;
	}
}

/* A device table as the daemon keeps one: n_lists records of max_pages
 * page ids (struct kvt_list_record, 64-byte aligned stride), each list's
 * last ppl ids its own pages (the ids before them repeat its first page),
 * the pages shuffled over one pool cut into KVT_CHUNK_BYTES chunk slots,
 * the slots' bases in a device array. */
struct ob_table {
	char *pool;
	void **d_bases;
	char *d_rec;
	uint64_t stride;
	uint32_t n_lists, max_pages, n_slots, ppc;
};

static void ob_table_new(struct ob_table *t, uint32_t n_lists, uint32_t ppl,
                         uint32_t max_pages, uint32_t len, int random,
                         cudaStream_t s)
{
	const uint64_t chunk = KVT_CHUNK_BYTES;
	const uint64_t n_pages64 = (uint64_t)n_lists * ppl;
	if (!ppl || ppl > max_pages || n_pages64 > UINT32_MAX ||
	    (uint64_t)len > (uint64_t)ppl * OB_PT + (max_pages - ppl) * OB_PT) {
		fprintf(stderr, "ob_table_new: bad shape\n");
		exit(1);
	}
	const uint32_t n_pages = (uint32_t)n_pages64;
	memset(t, 0, sizeof(*t));
	t->n_lists = n_lists;
	t->max_pages = max_pages;
	t->ppc = (uint32_t)(chunk / OB_PAGE);
	t->n_slots = (n_pages + t->ppc - 1) / t->ppc;
	const size_t pool_bytes = (size_t)t->n_slots * chunk;
	CK(cudaMalloc(&t->pool, pool_bytes));
	if (random) {
		KVT_LAUNCH(ob_fill_f16, 4096, 256, 0, s, (uint16_t *)t->pool,
		           (uint64_t)(pool_bytes / 2), 0x9e3779b9u);
		CK(cudaGetLastError());
	} else {
		CK(cudaMemsetAsync(t->pool, 0x3c, pool_bytes, s)); /* ~1.06 */
	}
	void **hb = (void **)malloc((size_t)t->n_slots * sizeof(void *));
	uint32_t *perm = (uint32_t *)malloc((size_t)n_pages * 4);
	t->stride = (sizeof(struct kvt_list_record) +
	             (uint64_t)max_pages * sizeof(uint32_t) + 63) / 64 * 64;
	char *hr = (char *)calloc(n_lists, t->stride);
	if (!hb || !perm || !hr) {
		fprintf(stderr, "ob_table_new: out of host memory\n");
		exit(1);
	}
	for (uint32_t i = 0; i < t->n_slots; i++)
		hb[i] = t->pool + (size_t)i * chunk;
	for (uint32_t i = 0; i < n_pages; i++)
		perm[i] = i;
	shuffle(perm, n_pages);
	const uint32_t lead = max_pages - ppl;
	for (uint32_t l = 0; l < n_lists; l++) {
		struct kvt_list_record *r =
			(struct kvt_list_record *)(hr + (size_t)l * t->stride);
		const uint32_t *mine = perm + (size_t)l * ppl;
		r->len = len;
		r->n_pages = max_pages;
		for (uint32_t i = 0; i < max_pages; i++)
			r->pages[i] = mine[i < lead ? 0 : i - lead];
	}
	CK(cudaMalloc(&t->d_bases, (size_t)t->n_slots * sizeof(void *)));
	CK(cudaMalloc(&t->d_rec, (size_t)n_lists * t->stride));
	CK(cudaMemcpy(t->d_bases, hb, (size_t)t->n_slots * sizeof(void *),
	              cudaMemcpyHostToDevice));
	CK(cudaMemcpy(t->d_rec, hr, (size_t)n_lists * t->stride,
	              cudaMemcpyHostToDevice));
	CK(cudaStreamSynchronize(s));
	CK(cudaDeviceSynchronize());
	free(hb);
	free(perm);
	free(hr);
}

static void ob_table_free(struct ob_table *t)
{
	CK(cudaFree(t->pool));
	CK(cudaFree(t->d_bases));
	CK(cudaFree(t->d_rec));
	memset(t, 0, sizeof(*t));
}

static struct kvt_backend_paged ob_paged(const struct ob_table *t)
{
	struct kvt_backend_paged pg;
	memset(&pg, 0, sizeof(pg));
	pg.records = t->d_rec;
	pg.list_stride = t->stride;
	pg.max_pages = t->max_pages;
	pg.chunk_bases = t->d_bases;
	pg.n_chunk_slots = t->n_slots;
	pg.pages_per_chunk = t->ppc;
	pg.page_bytes = OB_PAGE;
	pg.page_tokens = OB_PT;
	pg.row_bytes = OB_ROW;
	return pg;
}

/* kvt_attention through the backend's `attention` op: one decode step of
 * one layer at batch 64, 32768-entry lists (record len 32767 + the new
 * token), the paged_attention_* geometry; K+V GB/s read, *us the step. */
double bench_kvt_attention(const struct kvt_backend_ops *o, void *ctx,
                                  cudaStream_t s, double *us)
{
	const uint32_t batch = 64, ctxlen = 32768, n_lists = batch * OB_KV;
	const uint32_t per = ctxlen / OB_PT;
	struct ob_table t;
	ob_table_new(&t, n_lists, per, per, ctxlen - 1, 0, s);
	float *q, *out, *lse;
	const size_t qf = (size_t)batch * OB_H * OB_HD;
	CK(cudaMalloc(&q, qf * 4));
	CK(cudaMalloc(&out, qf * 4));
	CK(cudaMalloc(&lse, (size_t)batch * OB_H * 4));
	CK(cudaMemsetAsync(q, 0, qf * 4, s));
	CK(cudaStreamSynchronize(s));
	struct kvt_backend_attention *a = (struct kvt_backend_attention *)calloc(
		batch, sizeof(*a));
	if (!a) {
		fprintf(stderr, "bench_kvt_attention: out of host memory\n");
		exit(1);
	}
	for (uint32_t i = 0; i < batch; i++) {
		a[i].records = t.d_rec + (size_t)i * OB_KV * t.stride;
		a[i].list_stride = t.stride;
		a[i].chunk_bases = t.d_bases;
		a[i].n_chunk_slots = t.n_slots;
		a[i].pages_per_chunk = t.ppc;
		a[i].page_bytes = OB_PAGE;
		a[i].max_pages = t.max_pages;
		a[i].page_tokens = OB_PT;
		a[i].head_dim = OB_HD;
		a[i].n_heads = OB_H;
		a[i].n_kv_heads = OB_KV;
		a[i].dtype = KVT_DTYPE_F16;
		a[i].n = 1;
		a[i].max_len = ctxlen;
		a[i].scale = 0.08838834764f;
		a[i].q = q + (size_t)i * OB_H * OB_HD;
		a[i].out = out + (size_t)i * OB_H * OB_HD;
		a[i].lse = lse + (size_t)i * OB_H;
	}
	auto step = [&] {
		for (uint32_t i = 0; i < batch; i++)
			OP(o->attention(ctx, &a[i], s));
	};
	/* q 0 over keys and values all 0x3c3c: every head attends evenly
	 * over all 32768 entries (lse ln 32768, out the value); an empty
	 * list (a page not resolved) would give lse -inf, out 0 */
	step();
	CK(cudaStreamSynchronize(s));
	float *hl = (float *)malloc((size_t)batch * OB_H * 4), ho[2];
	if (!hl) {
		fprintf(stderr, "bench_kvt_attention: out of host memory\n");
		exit(1);
	}
	CK(cudaMemcpy(hl, lse, (size_t)batch * OB_H * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(&ho[0], out, 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(&ho[1], out + qf - 1, 4, cudaMemcpyDeviceToHost));
	const float want_lse = logf((float)ctxlen), want_v = 1.05859375f;
	for (uint32_t i = 0; i < batch * OB_H; i++)
		if (!(fabsf(hl[i] - want_lse) < 1e-2f)) {
			fprintf(stderr, "bench_kvt_attention: lse[%u] %g, expected "
			        "%g\n", i, hl[i], want_lse);
			exit(1);
		}
	for (int i = 0; i < 2; i++)
		if (!(fabsf(ho[i] - want_v) < 1e-2f)) {
			fprintf(stderr, "bench_kvt_attention: out %g, expected "
			        "%g\n", ho[i], want_v);
			exit(1);
		}
	float ms = time_ms(step, 20, s);
	free(hl);
	free(a);
	CK(cudaFree(q));
	CK(cudaFree(out));
	CK(cudaFree(lse));
	ob_table_free(&t);
	*us = ms * 1e3;
	double bytes = (double)n_lists * ctxlen * 2.0 * OB_ROW;
	return bytes / (ms * 1e-3) / 1e9;
}

/* knorm's `key_norms` op: 64 sequences x 256 lists of 32768 entries, the
 * newest entry of each (what a sync every token asks); microseconds per
 * sequence of the whole call, and of its floor (*floor_us). */
double bench_key_norms(const struct kvt_backend_ops *o, void *ctx,
                              cudaStream_t s, double *floor_us)
{
	const uint32_t seqs = 64, n_lists = seqs * OB_LAYERS * OB_KV;
	const uint32_t ctxlen = 32768, max_pages = ctxlen / OB_PT;
	struct ob_table t;
	/* one page of its own per list (the one the new entry is in) */
	ob_table_new(&t, n_lists, 1, max_pages, ctxlen - 1, 0, s);
	const struct kvt_backend_paged pg = ob_paged(&t);
	struct kvt_backend_norm_job *jobs =
		(struct kvt_backend_norm_job *)malloc((size_t)n_lists *
		                                      sizeof(*jobs));
	float *norms = (float *)malloc((size_t)n_lists * 4);
	if (!jobs || !norms) {
		fprintf(stderr, "bench_key_norms: out of host memory\n");
		exit(1);
	}
	for (uint32_t l = 0; l < n_lists; l++) {
		jobs[l].record = l;
		jobs[l].first = ctxlen - 1;
		jobs[l].n = 1;
		jobs[l].out_off = l;
		jobs[l].out_stride = 1;
	}
	auto call = [&] {
		OP(o->key_norms(ctx, &pg, n_lists, KVT_DTYPE_F16, OB_HD, jobs,
		                n_lists, norms, n_lists, s));
	};
	call();
	/* every K element 0x3c3c: norm sqrt(128) * 1.05859375 */
	const float want = sqrtf((float)OB_HD) * 1.05859375f;
	for (uint32_t l = 0; l < n_lists; l++)
		if (!(fabsf(norms[l] - want) < 1e-3f * want)) {
			fprintf(stderr, "bench_key_norms: norm[%u] %g, expected "
			        "%g\n", l, norms[l], want);
			exit(1);
		}
	double ms = wall_ms(call, 20, 2000);
	/* floor: the same K bytes copied device to device, queued and
	 * waited for as the call is (one launch and one host round trip
	 * plus the bytes; an empty launch would leave the bytes out) */
	const size_t kbytes = (size_t)n_lists * OB_ROW;
	char *src, *dst;
	CK(cudaMalloc(&src, kbytes));
	CK(cudaMalloc(&dst, kbytes));
	CK(cudaMemsetAsync(src, 0x3c, kbytes, s));
	auto copy = [&] {
		CK(cudaMemcpyAsync(dst, src, kbytes, cudaMemcpyDeviceToDevice, s));
		CK(cudaStreamSynchronize(s));
	};
	copy();
	double fms = wall_ms(copy, 20, 2000);
	CK(cudaFree(src));
	CK(cudaFree(dst));
	free(jobs);
	free(norms);
	ob_table_free(&t);
	*floor_us = fms * 1e3 / seqs;
	return ms * 1e3 / seqs;
}

/* The floor of the selections' logits: n_lists cuBLAS SGEMMs of the ops'
 * shape, [rows][hd] queries against [len][hd] keys in float (one scratch
 * reused list after list, as the ops reuse theirs), queued then waited
 * for; the median milliseconds of the whole. */
static double ob_logits_floor_ms(cudaStream_t s, uint32_t n_lists,
                                 uint32_t len, uint32_t rows)
{
	float *keys, *qg, *logit;
	CK(cudaMalloc(&keys, (size_t)len * OB_HD * 4));
	CK(cudaMalloc(&qg, (size_t)rows * OB_HD * 4));
	CK(cudaMalloc(&logit, (size_t)rows * len * 4));
	CK(cudaMemsetAsync(keys, 0, (size_t)len * OB_HD * 4, s));
	CK(cudaMemsetAsync(qg, 0, (size_t)rows * OB_HD * 4, s));
	cublasHandle_t hb;
	BK(cublasCreate(&hb));
	BK(cublasSetStream(hb, s));
	const float scale = 1.0f / sqrtf((float)OB_HD), zero = 0.0f;
	auto gemms = [&] {
		for (uint32_t l = 0; l < n_lists; l++)
			BK(cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)len,
			               (int)rows, (int)OB_HD, &scale, keys,
			               (int)OB_HD, qg, (int)OB_HD, &zero, logit,
			               (int)len));
		CK(cudaStreamSynchronize(s));
	};
	gemms();
	const double ms = wall_ms(gemms, 20, 2000);
	BK(cublasDestroy(hb));
	CK(cudaFree(keys));
	CK(cudaFree(qg));
	CK(cudaFree(logit));
	return ms;
}

/* The end-of-prefill selections of one sequence (32 layers x 8 KV heads,
 * prompt 4096 plus 16 new tokens, f16 pages of random values, staging
 * rows x | q | lse in a ring of 128 per layer): the device rules "snapkv"
 * (window 64, kernel 5, sinks 0) and "expected_attention" (the last 64
 * queries, sinks 4, future 512, theta 1e4, cov, vnorm), a job a list,
 * each keeping half the prompt; milliseconds of the whole call, and of
 * one SGEMM of SnapKV's logits shape per list (*floor_ms). */
void bench_prompt_select(const struct kvt_backend_ops *o, void *ctx,
                                cudaStream_t s, double *win_ms,
                                double *exp_ms, double *floor_ms)
{
	const uint32_t P = 4096, n_new = 16, len = P + n_new, W = 64;
	const uint32_t n_lists = OB_LAYERS * OB_KV, n_win = OB_LAYERS;
	const uint32_t ppl = (len + OB_PT - 1) / OB_PT;
	const uint32_t stage = 128, d_model = 4096;
	const uint32_t q_off = d_model, lse_off = q_off + OB_H * OB_HD;
	const uint32_t row_floats = lse_off + OB_H;
	const uint32_t budget = P - P / 2; /* ratio 0.5 */
	struct ob_table t;
	ob_table_new(&t, n_lists, ppl, ppl, len, 1, s);
	const struct kvt_backend_paged pg = ob_paged(&t);
	float *ring;
	const uint64_t ring_floats = (uint64_t)n_win * stage * row_floats;
	CK(cudaMalloc(&ring, ring_floats * 4));
	/* lse about ln(4096 e^0): logits of these q and k are small */
	KVT_LAUNCH(ob_fill_ring, 4096, 256, 0, s, ring, ring_floats, row_floats,
	           lse_off, OB_H, 8.3f, 0x85ebca6bu);
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));

	/* snapkv: candidates i < P - W (sinks 0), the window and the new
	 * tokens protected; keep budget - W of the candidates */
	const uint32_t w_cand = P - W, w_keep = budget - W;
	const uint32_t w_drop = w_cand - w_keep;
	/* expected_attention: candidates sinks <= i < P; keep budget - sinks */
	const uint32_t e_sinks = 4, e_cand = P - e_sinks,
	               e_keep = budget - e_sinks, e_drop = e_cand - e_keep;
	const struct kvt_backend_rule *wr = o->rule("snapkv"),
	                              *er = o->rule("expected_attention");
	struct snapkv_rule_job *wj = (struct snapkv_rule_job *)calloc(
		n_lists, sizeof(*wj));
	struct expected_attention_rule_job *ej =
		(struct expected_attention_rule_job *)calloc(n_lists,
		                                             sizeof(*ej));
	const uint32_t w_words = 2 * n_lists + n_lists * w_drop;
	const uint32_t e_words = 2 * n_lists + n_lists * e_drop;
	uint32_t *out = (uint32_t *)malloc(
		(size_t)(w_words > e_words ? w_words : e_words) * 4);
	if (!wr || !er || !wj || !ej || !out) {
		fprintf(stderr, "bench_prompt_select: no rule or out of host "
		        "memory\n");
		exit(1);
	}
	const struct kvt_backend_rows rows = {stage, row_floats, q_off, lse_off};
	const struct snapkv_rule wa = {rows, 5, 0};
	struct expected_attention_rule ea;
	memset(&ea, 0, sizeof(ea));
	ea.rows = rows;
	ea.sinks = e_sinks;
	ea.future = 512;
	ea.theta = 10000.0f;
	ea.cov = 1;
	ea.vnorm = 1;
	for (uint32_t l = 0; l < n_lists; l++) {
		const float *rj = ring + (uint64_t)(l / OB_KV) * stage * row_floats;
		wj[l] = {rj, l, l % OB_KV, P, n_new, W, 1, w_keep, w_drop,
		         l * w_drop};
		ej[l] = {rj, l, l % OB_KV, P, n_new, P - W, 1, e_keep, e_drop,
		         l * e_drop};
	}
	const struct kvt_backend_rule_geom geo = {KVT_DTYPE_F16, OB_H, OB_KV,
	                                          OB_HD};
	/* the first call of each is checked: no job flagged, every list
	 * dropped what the caller counted */
	auto check = [&](const char *op, uint32_t nd) {
		for (uint32_t l = 0; l < n_lists; l++)
			if (out[l] || out[n_lists + l] != nd) {
				fprintf(stderr, "bench_prompt_select: %s: job %u "
				        "flagged %u, dropped %u, expected %u\n", op,
				        l, out[l], out[n_lists + l], nd);
				exit(1);
			}
	};
	auto wcall = [&] {
		OP(wr->run(ctx, &pg, n_lists, &geo, &wa, wj, n_lists, out,
		           w_words, s));
	};
	wcall();
	check("snapkv", w_drop);
	*win_ms = wall_ms(wcall, 10, 3000);
	auto ecall = [&] {
		OP(er->run(ctx, &pg, n_lists, &geo, &ea, ej, n_lists, out,
		           e_words, s));
	};
	ecall();
	check("expected_attention", e_drop);
	*exp_ms = wall_ms(ecall, 10, 3000);

	/* floor: SnapKV's logits SGEMM once per list */
	*floor_ms = ob_logits_floor_ms(s, n_lists, len, W * OB_G);
	CK(cudaFree(ring));
	free(wj);
	free(ej);
	free(out);
	ob_table_free(&t);
}


/* ------------------------------------- the decode syncs' selections */

/* n floats uniform in [-a, a). */
__global__ void ob_fill_f32(float *p, uint64_t n, float a, uint32_t seed)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] = ((float)(ob_hash(i, seed) >> 8) * (1.0f / 8388608.0f) -
		        1.0f) * a;
}

/* A rule as policies/attn_plan.c's policy_attn_count counts it: protected
 * pos + recent >= n_seen (recent 0: none), pos < sinks and pos + window
 * >= n_seen (window 0: none); budget entries stay. */
struct ob_rule {
	uint32_t sinks, window, recent, budget;
};

static int ob_protected(const struct ob_rule *r, uint32_t p, uint32_t n_seen)
{
	return (r->recent && p + (uint64_t)r->recent >= n_seen) ||
	       p < r->sinks || (r->window && p + (uint64_t)r->window >= n_seen);
}

/* policy_attn_count's keep and drops of L entries at positions 0 .. L -
 * 1; exits unless the drops are n_drop. */
static uint32_t ob_plan(const char *op, const struct ob_rule *r, uint32_t L,
                        uint32_t n_seen, uint32_t n_drop)
{
	uint32_t np = 0;
	for (uint32_t p = 0; p < L; p++)
		np += ob_protected(r, p, n_seen);
	const uint32_t keep = r->budget > np ? r->budget - np : 0;
	const uint32_t nd = L - np > keep ? L - np - keep : 0;
	if (nd != n_drop) {
		fprintf(stderr, "bench_decode_select: %s's rule drops %u, not "
		        "%u\n", op, nd, n_drop);
		exit(1);
	}
	return keep;
}

/* Records 0 .. n_rec - 1 of a state of F floats an entry (entry_state's
 * bc_es_half layout): positions 0 .. len - 1 in both halves, floats 0;
 * returns once they are there. */
static void ob_state_init(void *state, uint32_t n_rec, uint32_t cap,
                          uint32_t F, const uint32_t *pos, uint32_t len)
{
	const uint64_t half = (uint64_t)cap * (1 + F);
	CK(cudaMemset(state, 0, (size_t)(2 * n_rec * half * 4)));
	for (uint64_t h = 0; h < 2 * (uint64_t)n_rec; h++)
		CK(cudaMemcpy((uint32_t *)state + h * half, pos,
		              (size_t)len * 4, cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize()); /* the ops run on another stream */
}

/* The first call's output words (n jobs, drops at j * n_drop): no job
 * flagged, each dropped n_drop entries, ascending, below L, and none
 * that r protects (positions are the indices). */
static void ob_check_drops(const char *op, const uint32_t *out, uint32_t n,
                           uint32_t n_drop, uint32_t L, uint32_t n_seen,
                           const struct ob_rule *r)
{
	const uint32_t *drops = out + 2 * (uint64_t)n;
	for (uint32_t j = 0; j < n; j++) {
		const uint32_t *d = drops + (uint64_t)j * n_drop;
		int bad = out[j] || out[n + j] != n_drop;
		for (uint32_t k = 0; !bad && k < n_drop; k++)
			bad = d[k] >= L || (k && d[k] <= d[k - 1]) ||
			      ob_protected(r, d[k], n_seen);
		if (bad) {
			fprintf(stderr, "bench_decode_select: %s: job %u "
			        "flagged %u, dropped %u (expected %u), or a "
			        "drop out of order, beyond %u or protected\n",
			        op, j, out[j], out[n + j], n_drop, L);
			exit(1);
		}
	}
}

/* The backend's device rule named name, of the layout of this build's
 * header; exits when it has none or another. */
static const struct kvt_backend_rule *
ob_rule(const struct kvt_backend_ops *o, const char *name, uint32_t version,
        size_t params_bytes, size_t job_bytes)
{
	const struct kvt_backend_rule *r = o->rule ? o->rule(name) : NULL;
	if (!r || r->version != version || r->params_bytes != params_bytes ||
	    r->job_bytes != job_bytes) {
		fprintf(stderr, "bench_decode_select: the cuda backend has no "
		        "device rule %s of layout version %u\n", name, version);
		exit(1);
	}
	return r;
}

/* The attention-based selections the daemon runs on the device at every
 * decode sync (daemon/tenant/tenant_attn.c) for one sequence: 32 layers x 8 KV
 * heads, lists of len 4096 entries (positions 0 .. 4095) and a sync of 16
 * new tokens (n_seen 4112), f16 pages of random values, staging rows
 * x | q | lse in a ring of 128 per layer, a budget of len: each list
 * drops 16 (keep and drops counted as policy_attn_count counts them),
 * due.
 *   the device rule "h2o" (agg mean, sinks 0, recent budget / 2): a job a
 *     list;
 *   "tova" (window 1, sinks 0): a job a layer (its 8 lists);
 *   "kvpop" (r 16, m 32, delay 32, sinks 4, ring delay + 64, random
 *     weights and u): a job a list, the first of a layer projecting its x;
 * microseconds of each whole call per new token, and of the 256 logits
 * SGEMMs of H2O's shape ([n_new G][hd] x [hd][L] per list) (*floor_us).  A
 * call reads the state half cur and writes the other and flips nothing
 * (the caller does): every timed call redoes the first one's work. */
void bench_decode_select(const struct kvt_backend_ops *o, void *ctx,
                         cudaStream_t s, double *h2o_us, double *tova_us,
                         double *pop_us, double *floor_us)
{
	const uint32_t len = 4096, n_new = 16, L = len + n_new, n_seen = L;
	const uint32_t n_lists = OB_LAYERS * OB_KV;
	const uint32_t ppl = (L + OB_PT - 1) / OB_PT;
	const uint32_t cap = L + 496; /* entries a half (max_tokens) */
	const uint32_t stage = 128, d_model = 4096;
	const uint32_t q_off = d_model, lse_off = q_off + OB_H * OB_HD;
	const uint32_t row_floats = lse_off + OB_H;
	const uint32_t pr = 16, pm = 32, delay = 32, pring = delay + 64;
	const double per = 1e3 / n_new; /* ms a call -> us a token */
	struct ob_table t;
	ob_table_new(&t, n_lists, ppl, ppl, L, 1, s);
	const struct kvt_backend_paged pg = ob_paged(&t);
	const uint64_t ring_floats = (uint64_t)OB_LAYERS * stage * row_floats;
	const uint64_t lf = kvpop_layer_floats(pr, pm, d_model, OB_KV);
	const uint64_t w_floats = OB_LAYERS * lf;
	const uint64_t u_floats = (uint64_t)OB_LAYERS * pring * pr;
	float *ring, *weights, *u;
	void *state; /* sized for H2O's, the largest: G floats an entry */
	CK(cudaMalloc(&ring, ring_floats * 4));
	CK(cudaMalloc(&weights, w_floats * 4));
	CK(cudaMalloc(&u, u_floats * 4));
	CK(cudaMalloc(&state, (size_t)n_lists * 2 * cap * (1 + OB_G) * 4));
	/* lse about ln(4112 e^0): logits of these q and k are small */
	KVT_LAUNCH(ob_fill_ring, 4096, 256, 0, s, ring, ring_floats, row_floats,
	           lse_off, OB_H, 8.3f, 0x27d4eb2fu);
	KVT_LAUNCH(ob_fill_f32, 4096, 256, 0, s, weights, w_floats, 0.05f,
	           0x165667b1u);
	KVT_LAUNCH(ob_fill_f32, 1024, 256, 0, s, u, u_floats, 1.0f,
	           0xd3a2646cu);
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));
	const uint32_t words = 2 * n_lists + n_lists * n_new;
	uint32_t *pos = (uint32_t *)malloc((size_t)len * 4);
	uint32_t *out = (uint32_t *)malloc((size_t)words * 4);
	struct h2o_rule_job *hj = (struct h2o_rule_job *)calloc(
		n_lists, sizeof(*hj));
	struct tova_rule_job *tj = (struct tova_rule_job *)calloc(
		OB_LAYERS, sizeof(*tj));
	struct kvpop_rule_job *pj = (struct kvpop_rule_job *)calloc(
		n_lists, sizeof(*pj));
	if (!pos || !out || !hj || !tj || !pj) {
		fprintf(stderr, "bench_decode_select: out of host memory\n");
		exit(1);
	}
	for (uint32_t i = 0; i < len; i++)
		pos[i] = i;
	/* a budget of len: every list drops what the sync brings */
	const struct ob_rule rh = {0, 0, len / 2, len}, rt = {0, 1, 0, len},
	                     rp = {4, 0, delay, len};
	const uint32_t hkeep = ob_plan("h2o", &rh, L, n_seen, n_new);
	const uint32_t tkeep = ob_plan("tova", &rt, L, n_seen, n_new);
	const uint32_t pkeep = ob_plan("kvpop", &rp, L, n_seen, n_new);
	uint32_t n_band = 0; /* KVpop's band: pos + delay >= n_seen - n_new */
	for (uint32_t p = 0; p < L; p++)
		n_band += p + (uint64_t)delay >= n_seen - n_new;
	for (uint32_t l = 0; l < n_lists; l++) {
		const uint32_t layer = l / OB_KV, g = l % OB_KV;
		const float *rl = ring + (uint64_t)layer * stage * row_floats;
		hj[l] = {
			rl, l, g, 0, len, n_new, n_seen, 1, rh.recent, hkeep,
			n_new, l * n_new,
		};
		pj[l] = {
			rl, layer, l, 0, g == 0, len, n_new, n_seen,
			n_band, 1, pkeep, n_new, l * n_new,
		};
		if (g == 0)
			tj[layer] = {
				rl, l, layer, 0, len, n_new, n_seen, 1, tkeep,
				n_new, layer * n_new,
			};
	}
	struct h2o_rule ha;
	struct tova_rule ta;
	struct kvpop_rule pa;
	memset(&ha, 0, sizeof(ha));
	memset(&ta, 0, sizeof(ta));
	memset(&pa, 0, sizeof(pa));
	ha.state = ta.state = pa.state = state;
	ha.cap = ta.cap = pa.cap = cap;
	const struct kvt_backend_rows rl = {stage, row_floats, q_off, lse_off};
	ha.rows = ta.rows = pa.rows = rl;
	ha.agg = 0;
	ha.sinks = rh.sinks;
	ha.window = rh.window;
	ta.sinks = rt.sinks;
	ta.window = rt.window;
	pa.u = u;
	pa.weights = weights;
	pa.d_model = d_model;
	pa.r = pr;
	pa.m = pm;
	pa.ring = pring;
	pa.delay = delay;
	pa.sinks = rp.sinks;

	const struct kvt_backend_rule *hr = ob_rule(o, "h2o", H2O_RULE_VERSION,
	                                            sizeof(ha), sizeof(*hj));
	const struct kvt_backend_rule *tr = ob_rule(o, "tova", TOVA_RULE_VERSION,
	                                            sizeof(ta), sizeof(*tj));
	const struct kvt_backend_rule *kr = ob_rule(o, "kvpop",
	                                             KVPOP_RULE_VERSION,
	                                             sizeof(pa), sizeof(*pj));
	const struct kvt_backend_rule_geom geom = {KVT_DTYPE_F16, OB_H, OB_KV,
	                                           OB_HD};

	/* H2O: a job a list, G floats of state an entry */
	ob_state_init(state, n_lists, cap, OB_G, pos, len);
	auto hcall = [&] {
		OP(hr->run(ctx, &pg, n_lists, &geom, &ha, hj, n_lists, out,
		           words, s));
	};
	hcall();
	ob_check_drops("h2o", out, n_lists, n_new, L, n_seen, &rh);
	*h2o_us = wall_ms(hcall, 20, 2000) * per;

	/* TOVA: a job a layer, positions only, one array a layer */
	ob_state_init(state, OB_LAYERS, cap, 0, pos, len);
	const uint32_t twords = 2 * OB_LAYERS + OB_LAYERS * n_new;
	auto tcall = [&] {
		OP(tr->run(ctx, &pg, n_lists, &geom, &ta, tj, OB_LAYERS, out,
		           twords, s));
	};
	tcall();
	ob_check_drops("tova", out, OB_LAYERS, n_new, L, n_seen, &rt);
	*tova_us = wall_ms(tcall, 20, 2000) * per;

	/* KVpop: a job a list, (a, s) an entry */
	ob_state_init(state, n_lists, cap, 2, pos, len);
	auto pcall = [&] {
		OP(kr->run(ctx, &pg, n_lists, &geom, &pa, pj, n_lists, out,
		            words, s));
	};
	pcall();
	ob_check_drops("kvpop", out, n_lists, n_new, L, n_seen, &rp);
	*pop_us = wall_ms(pcall, 20, 2000) * per;

	/* floor: H2O's logits SGEMM once per list */
	*floor_us = ob_logits_floor_ms(s, n_lists, L, n_new * OB_G) * per;
	CK(cudaFree(ring));
	CK(cudaFree(weights));
	CK(cudaFree(u));
	CK(cudaFree(state));
	free(pos);
	free(out);
	free(hj);
	free(tj);
	free(pj);
	ob_table_free(&t);
}
