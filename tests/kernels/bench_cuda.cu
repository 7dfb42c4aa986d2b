/*
 * bench_cuda.cu — GPU benchmarks of the CUDA ops, each next to its floor
 * measured in the same run (build/bin/kvtrim-cuda-bench [--out FILE]).
 * Prints "name value" lines (and appends them to FILE); docs/cuda.md,
 * "GPU check", lists every line with its geometry and target.  The
 * kernels are timed directly (compact, paged attention, the scorers), the
 * daemon's ops through the cuda backend's table (kvt_cuda_backend_v1, one
 * context) on device tables and chunk-base arrays built by hand as the
 * daemon and the client keep them.  Times are the median of repeats after
 * a warm-up, with CUDA events; the synchronous ops (they copy their output
 * to the host and wait) and their floors by the host wall clock around
 * the whole call, an upper bound on their device time.  Errors exit.
 */
#include "bench_cuda.cuh"

FILE *out_f;

void report(const char *name, double v)
{
	printf("%s %.6g\n", name, v);
	fflush(stdout);
	if (out_f) {
		fprintf(out_f, "%s %.6g\n", name, v);
		fflush(out_f);
	}
}

static uint64_t rs = 0x2545f4914f6cdd1dull;
uint32_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (uint32_t)(rs >> 16);
}

void shuffle(uint32_t *v, uint32_t n)
{
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = rnd() % i, t = v[i - 1];
		v[i - 1] = v[j];
		v[j] = t;
	}
}

static double bench_memcpy(cudaStream_t s)
{
	size_t bytes = (size_t)1 << 30;
	void *a, *b;
	CK(cudaMalloc(&a, bytes));
	CK(cudaMalloc(&b, bytes));
	CK(cudaMemset(a, 1, bytes));
	float ms = time_ms([&] {
		CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
	}, 10, s);
	CK(cudaFree(a));
	CK(cudaFree(b));
	return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

static double bench_compact(cudaStream_t s)
{
	const uint32_t pt = 16, row = 128 * 2;
	const size_t page_bytes = 2 * (size_t)pt * row;
	const uint32_t n_pages = (uint32_t)(((size_t)1 << 30) / page_bytes);
	const uint32_t len = n_pages * pt;
	char *pool;
	CK(cudaMalloc(&pool, (size_t)n_pages * page_bytes));
	CK(cudaMemset(pool, 3, (size_t)n_pages * page_bytes));
	uint32_t *perm = (uint32_t *)malloc(n_pages * sizeof(uint32_t));
	void **hp = (void **)malloc(n_pages * sizeof(void *));
	for (uint32_t i = 0; i < n_pages; i++)
		perm[i] = i;
	shuffle(perm, n_pages);
	for (uint32_t i = 0; i < n_pages; i++)
		hp[i] = pool + (size_t)perm[i] * page_bytes;
	uint8_t *drop = (uint8_t *)malloc(len);
	for (uint32_t i = 0; i < len; i++)
		drop[i] = rnd() & 1;
	uint32_t *mv = (uint32_t *)malloc((size_t)len * 8), nl;
	uint32_t nm = compact_plan(drop, len, mv, &nl);
	void **dp;
	uint32_t *dm;
	CK(cudaMalloc(&dp, n_pages * sizeof(void *)));
	CK(cudaMalloc(&dm, (size_t)nm * 8));
	CK(cudaMemcpy(dp, hp, n_pages * sizeof(void *), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dm, mv, (size_t)nm * 8, cudaMemcpyHostToDevice));
	float ms = time_ms([&] { OK(compact_cuda(dp, pt, row, dm, nm, s)); },
	                   10, s);
	report("compact_moves", nm);
	CK(cudaFree(pool));
	CK(cudaFree(dp));
	CK(cudaFree(dm));
	free(perm);
	free(hp);
	free(drop);
	free(mv);
	/* each move reads and writes a K row and a V row */
	return 2.0 * 2.0 * nm * row / (ms * 1e-3) / 1e9;
}

static double bench_attention(cudaStream_t s, double *us)
{
	const uint32_t batch = 64, ctx = 32768, n_kv = 8, G = 4, hd = 128;
	const uint32_t pt = 16, n_lists = batch * n_kv;
	const size_t row = hd * 2, page_bytes = 2 * (size_t)pt * row;
	const uint32_t per = ctx / pt, n_pages = n_lists * per;
	char *pool;
	CK(cudaMalloc(&pool, (size_t)n_pages * page_bytes));
	CK(cudaMemset(pool, 0x3c, (size_t)n_pages * page_bytes)); /* ~1.0 */
	uint32_t *perm = (uint32_t *)malloc(n_pages * sizeof(uint32_t));
	void **hp = (void **)malloc((size_t)n_pages * sizeof(void *));
	for (uint32_t i = 0; i < n_pages; i++)
		perm[i] = i;
	shuffle(perm, n_pages);
	for (uint32_t i = 0; i < n_pages; i++)
		hp[i] = pool + (size_t)perm[i] * page_bytes;
	uint32_t *first = (uint32_t *)malloc(n_lists * 4);
	uint32_t *lens = (uint32_t *)malloc(n_lists * 4);
	for (uint32_t l = 0; l < n_lists; l++) {
		first[l] = l * per;
		lens[l] = ctx;
	}
	void **dp;
	uint32_t *df, *dl;
	float *q, *o, *lse;
	CK(cudaMalloc(&dp, (size_t)n_pages * sizeof(void *)));
	CK(cudaMemcpy(dp, hp, (size_t)n_pages * sizeof(void *),
	              cudaMemcpyHostToDevice));
	CK(cudaMalloc(&df, n_lists * 4));
	CK(cudaMalloc(&dl, n_lists * 4));
	CK(cudaMemcpy(df, first, n_lists * 4, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dl, lens, n_lists * 4, cudaMemcpyHostToDevice));
	CK(cudaMalloc(&q, (size_t)n_lists * G * hd * 4));
	CK(cudaMalloc(&o, (size_t)n_lists * G * hd * 4));
	CK(cudaMalloc(&lse, (size_t)n_lists * G * 4));
	CK(cudaMemset(q, 0, (size_t)n_lists * G * hd * 4));
	size_t wb = paged_attention_work_bytes(n_lists, G, hd, ctx);
	void *work = NULL;
	if (wb)
		CK(cudaMalloc(&work, wb));
	float ms = time_ms([&] {
		OK(paged_attention_batch_cuda(q, G, dp, df, dl, n_lists, ctx,
		                              pt, hd, KVT_DTYPE_F16,
		                              0.08838834764f, o, lse, work, wb,
		                              s));
	}, 20, s);
	CK(cudaFree(pool));
	CK(cudaFree(dp));
	CK(cudaFree(df));
	CK(cudaFree(dl));
	CK(cudaFree(q));
	CK(cudaFree(o));
	CK(cudaFree(lse));
	if (work)
		CK(cudaFree(work));
	free(perm);
	free(hp);
	free(first);
	free(lens);
	*us = ms * 1e3;
	double bytes = (double)n_lists * ctx * 2.0 * row;
	return bytes / (ms * 1e-3) / 1e9;
}

static void bench_kvzap(cudaStream_t s, double *mlp_tps, double *gemm_tps)
{
	const uint32_t n = 8192, d_in = 4096, hid = 512, d_out = 8;
	float *x, *W1, *b1, *W2, *b2, *h, *y;
	CK(cudaMalloc(&x, (size_t)n * d_in * 4));
	CK(cudaMalloc(&W1, (size_t)hid * d_in * 4));
	CK(cudaMalloc(&b1, hid * 4));
	CK(cudaMalloc(&W2, (size_t)d_out * hid * 4));
	CK(cudaMalloc(&b2, d_out * 4));
	CK(cudaMalloc(&h, (size_t)n * hid * 4));
	CK(cudaMalloc(&y, (size_t)n * d_out * 4));
	CK(cudaMemset(x, 0, (size_t)n * d_in * 4));
	CK(cudaMemset(W1, 0, (size_t)hid * d_in * 4));
	CK(cudaMemset(b1, 0, hid * 4));
	CK(cudaMemset(W2, 0, (size_t)d_out * hid * 4));
	CK(cudaMemset(b2, 0, d_out * 4));
	cublasHandle_t hb;
	if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, "cublasCreate failed\n");
		exit(1);
	}
	cublasSetStream(hb, s);
	float ms = time_ms([&] {
		OK(scorer_mlp_cuda(hb, x, n, d_in, W1, b1, hid, W2, b2, d_out, y,
		                   h, s));
	}, 20, s);
	const float one = 1.f, zero = 0.f;
	float gms = time_ms([&] {
		cublasSetStream(hb, s);
		cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)hid, (int)n,
		            (int)d_in, &one, W1, (int)d_in, x, (int)d_in, &zero,
		            h, (int)hid);
		cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)d_out, (int)n,
		            (int)hid, &one, W2, (int)hid, h, (int)hid, &zero, y,
		            (int)d_out);
	}, 20, s);
	cublasDestroy(hb);
	CK(cudaFree(x));
	CK(cudaFree(W1));
	CK(cudaFree(b1));
	CK(cudaFree(W2));
	CK(cudaFree(b2));
	CK(cudaFree(h));
	CK(cudaFree(y));
	*mlp_tps = n / (ms * 1e-3);
	*gemm_tps = n / (gms * 1e-3);
}

/* Fast KVzip's gate on n rows of Qwen3-8B's x, and its two projection
 * GEMMs alone: rows per second of each. */
static void bench_gate(cudaStream_t s, double *gate_rps, double *gemm_rps)
{
	const uint32_t n = 8192, d = 4096, kv = 8, G = 4, dp = 16, S = 16;
	const size_t nq = (size_t)kv * G * dp, nk = (size_t)kv * dp;
	float *x, *Wq, *cq, *Wk, *gq, *gk, *sk, *bias, *score, *scr;
	CK(cudaMalloc(&x, (size_t)n * d * 4));
	CK(cudaMalloc(&Wq, nq * d * 4));
	CK(cudaMalloc(&cq, nq * 4));
	CK(cudaMalloc(&Wk, nk * d * 4));
	CK(cudaMalloc(&gq, dp * 4));
	CK(cudaMalloc(&gk, dp * 4));
	CK(cudaMalloc(&sk, (size_t)kv * S * dp * 4));
	CK(cudaMalloc(&bias, (size_t)kv * G * 4));
	CK(cudaMalloc(&score, (size_t)n * kv * 4));
	CK(cudaMalloc(&scr, (size_t)n * kv * (G + 1) * dp * 4));
	float *all[] = {x, Wq, cq, Wk, gq, gk, sk, bias};
	size_t sz[] = {(size_t)n * d, nq * d, nq, nk * d, dp, dp,
	               (size_t)kv * S * dp, (size_t)kv * G};
	for (int i = 0; i < 8; i++)
		CK(cudaMemset(all[i], 0, sz[i] * 4));
	cublasHandle_t hb;
	if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, "cublasCreate failed\n");
		exit(1);
	}
	cublasSetStream(hb, s);
	float ms = time_ms([&] {
		OK(sink_gate_cuda(hb, x, n, d, kv, G, dp, S, Wq, cq, Wk, gq, gk, sk,
		                  bias, score, scr, s));
	}, 20, s);
	const float one = 1.f, zero = 0.f;
	float gms = time_ms([&] {
		cublasSetStream(hb, s);
		cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)nq, (int)n, (int)d,
		            &one, Wq, (int)d, x, (int)d, &zero, scr, (int)nq);
		cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)nk, (int)n, (int)d,
		            &one, Wk, (int)d, x, (int)d, &zero,
		            scr + (size_t)n * nq, (int)nk);
	}, 20, s);
	cublasDestroy(hb);
	for (int i = 0; i < 8; i++)
		CK(cudaFree(all[i]));
	CK(cudaFree(score));
	CK(cudaFree(scr));
	*gate_rps = n / (ms * 1e-3);
	*gemm_rps = n / (gms * 1e-3);
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--out") && i + 1 < argc) {
			out_f = fopen(argv[++i], "a");
			if (!out_f) {
				perror(argv[i]);
				return 1;
			}
		} else {
			fprintf(stderr, "usage: kvtrim-cuda-bench [--out FILE]\n");
			return 2;
		}
	}
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		fprintf(stderr, "kvtrim-cuda-bench: no CUDA device\n");
		return 77;
	}
	cudaDeviceProp pr;
	CK(cudaGetDeviceProperties(&pr, 0));
	printf("# device %s, %d SMs\n", pr.name, pr.multiProcessorCount);
	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	double mem = bench_memcpy(s);
	report("d2d_memcpy_gbps", mem);
	double comp = bench_compact(s);
	report("compact_gbps", comp);
	report("compact_vs_memcpy", comp / mem);
	double us;
	double pa = bench_attention(s, &us);
	report("paged_attention_gbps", pa);
	report("paged_attention_us", us);
	report("paged_attention_vs_memcpy", pa / mem);
	double mt, gt;
	bench_kvzap(s, &mt, &gt);
	report("kvzap_mlp_tokens_per_s", mt);
	report("kvzap_gemm_tokens_per_s", gt);
	report("kvzap_mlp_vs_gemm", mt / gt);
	/* per decoded token per sequence: one row in each of 32 layers */
	report("gpu_scorer_us_per_token_kvzap", 32e6 / mt);
	report("gpu_scorer_floor_us_per_token_kvzap", 32e6 / gt);
	double gr, ggr;
	bench_gate(s, &gr, &ggr);
	report("gpu_scorer_us_per_token_fastkvzip", 32e6 / gr);
	report("gpu_scorer_floor_us_per_token_fastkvzip", 32e6 / ggr);

	/* the backend's ops, on one context of the library's table */
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	char err[256];
	const char *mode = NULL;
	void *ctx = NULL;
	if (o->abi != KVT_BACKEND_ABI || !o->attention || !o->key_norms ||
	    !o->rule) {
		fprintf(stderr, "kvtrim-cuda-bench: the cuda backend (ABI %u, "
		        "built for %u) lacks an op\n", o->abi,
		        (unsigned)KVT_BACKEND_ABI);
		return 1;
	}
	if (o->probe(err, sizeof(err)) ||
	    o->ctx_new(0, &ctx, &mode, err, sizeof(err))) {
		fprintf(stderr, "kvtrim-cuda-bench: cuda backend: %s\n", err);
		return 1;
	}
	printf("# cuda backend context, %s mode\n", mode ? mode : "?");
	double kus;
	double ka = bench_kvt_attention(o, ctx, s, &kus);
	report("gpu_kvt_attention_gbps", ka);
	report("gpu_kvt_attention_us", kus);
	report("gpu_kvt_attention_vs_memcpy", ka / mem);
	double knf;
	double kn = bench_key_norms(o, ctx, s, &knf);
	report("gpu_key_norms_us_per_token", kn);
	report("gpu_key_norms_floor_us_per_token", knf);
	double wms, ems, pfm;
	bench_prompt_select(o, ctx, s, &wms, &ems, &pfm);
	report("gpu_snapkv_rule_ms_per_seq", wms);
	report("gpu_expected_attention_rule_ms_per_seq", ems);
	report("gpu_prompt_select_floor_ms_per_seq", pfm);
	double hus, tus, pus, afu;
	bench_decode_select(o, ctx, s, &hus, &tus, &pus, &afu);
	report("gpu_scorer_us_per_token_h2o", hus);
	report("gpu_scorer_us_per_token_tova", tus);
	report("gpu_scorer_us_per_token_kvpop", pus);
	report("gpu_h2o_rule_floor_us_per_token", afu);
	o->ctx_free(ctx);
	CK(cudaStreamDestroy(s));
	if (out_f)
		fclose(out_f);
	return 0;
}
