/*
 * bench_cuda_ops.cu — kvtrim-cuda-bench's benchmarks of the cuda backend's
 * ops (the gpu_kvt_attention_*, gpu_key_norms_* and gpu_*_select_* lines:
 * bench_cuda.cu's header comment says what each measures), on device
 * tables and chunk-base arrays built by hand as the daemon and the client
 * keep them.
 */
#include "bench_cuda.cuh"

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

/* The end-of-prefill selections of one sequence (32 layers x 8 KV heads,
 * prompt 4096 plus 16 new tokens, f16 pages of random values, staging
 * rows x | q | lse in a ring of 128 per layer): window_select (SnapKV:
 * window 64, kernel 5, sinks 0) and expected_select (Expected Attention:
 * the last 64 queries, sinks 4, future 512, theta 1e4, cov, vnorm), each
 * keeping half the prompt; milliseconds of the whole call, and of one
 * SGEMM of window_select's logits shape per list (*floor_ms). */
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

	/* window_select: candidates i < P - W (sinks 0), the window and
	 * the new tokens protected; keep budget - W of the candidates */
	const uint32_t w_cand = P - W, w_keep = budget - W;
	const uint32_t w_drop = w_cand - w_keep;
	struct kvt_backend_window *win = (struct kvt_backend_window *)calloc(
		n_win, sizeof(*win));
	struct kvt_backend_window_list *wl =
		(struct kvt_backend_window_list *)calloc(n_lists, sizeof(*wl));
	/* expected_select: candidates sinks <= i < P; keep budget - sinks */
	const uint32_t e_sinks = 4, e_cand = P - e_sinks,
	               e_keep = budget - e_sinks, e_drop = e_cand - e_keep;
	struct kvt_backend_expected *ew = (struct kvt_backend_expected *)calloc(
		n_win, sizeof(*ew));
	struct kvt_backend_window_list *el =
		(struct kvt_backend_window_list *)calloc(n_lists, sizeof(*el));
	const uint32_t w_words = n_win + n_lists + n_lists * w_drop;
	const uint32_t e_words = n_win + n_lists + n_lists * e_drop;
	uint32_t *out = (uint32_t *)malloc(
		(size_t)(w_words > e_words ? w_words : e_words) * 4);
	if (!win || !wl || !ew || !el || !out) {
		fprintf(stderr, "bench_prompt_select: out of host memory\n");
		exit(1);
	}
	for (uint32_t j = 0; j < n_win; j++) {
		const float *rj = ring + (uint64_t)j * stage * row_floats;
		win[j].ring = rj;
		win[j].stage_tokens = stage;
		win[j].row_floats = row_floats;
		win[j].q_off = q_off;
		win[j].lse_off = lse_off;
		win[j].P = P;
		win[j].w = W;
		win[j].n_new = n_new;
		win[j].kernel = 5;
		win[j].sinks = 0;
		win[j].first_list = j * OB_KV;
		win[j].n_lists = OB_KV;
		ew[j].ring = rj;
		ew[j].stage_tokens = stage;
		ew[j].row_floats = row_floats;
		ew[j].q_off = q_off;
		ew[j].P = P;
		ew[j].from = P - W;
		ew[j].n_new = n_new;
		ew[j].sinks = e_sinks;
		ew[j].future = 512;
		ew[j].theta = 10000.0f;
		ew[j].cov = 1;
		ew[j].vnorm = 1;
		ew[j].eps = 0.0;
		ew[j].first_list = j * OB_KV;
		ew[j].n_lists = OB_KV;
	}
	for (uint32_t l = 0; l < n_lists; l++) {
		wl[l].record = l;
		wl[l].len = len;
		wl[l].keep = w_keep;
		wl[l].n_drop = w_drop;
		wl[l].drop_off = l * w_drop;
		el[l].record = l;
		el[l].len = len;
		el[l].keep = e_keep;
		el[l].n_drop = e_drop;
		el[l].drop_off = l * e_drop;
	}
	/* the first call of each is checked: no window flagged, every list
	 * dropped what the caller counted */
	auto check = [&](const char *op, uint32_t nd) {
		for (uint32_t j = 0; j < n_win; j++)
			if (out[j]) {
				fprintf(stderr, "bench_prompt_select: %s flagged "
				        "window %u\n", op, j);
				exit(1);
			}
		for (uint32_t l = 0; l < n_lists; l++)
			if (out[n_win + l] != nd) {
				fprintf(stderr, "bench_prompt_select: %s: list %u "
				        "dropped %u, expected %u\n", op, l,
				        out[n_win + l], nd);
				exit(1);
			}
	};
	auto wcall = [&] {
		OP(o->window_select(ctx, &pg, n_lists, KVT_DTYPE_F16, OB_H, OB_KV,
		                    OB_HD, win, n_win, wl, n_lists, out, w_words,
		                    s));
	};
	wcall();
	check("window_select", w_drop);
	*win_ms = wall_ms(wcall, 10, 3000);
	auto ecall = [&] {
		OP(o->expected_select(ctx, &pg, n_lists, KVT_DTYPE_F16, OB_H,
		                      OB_KV, OB_HD, ew, n_win, el, n_lists, out,
		                      e_words, s));
	};
	ecall();
	check("expected_select", e_drop);
	*exp_ms = wall_ms(ecall, 10, 3000);

	/* floor: window_select's logits SGEMM once per list, as the op calls
	 * it ([len][hd] keys and [w G][hd] q in float, one scratch reused
	 * list after list), queued then waited for */
	float *keys, *qg, *logit;
	CK(cudaMalloc(&keys, (size_t)len * OB_HD * 4));
	CK(cudaMalloc(&qg, (size_t)W * OB_G * OB_HD * 4));
	CK(cudaMalloc(&logit, (size_t)W * OB_G * len * 4));
	CK(cudaMemsetAsync(keys, 0, (size_t)len * OB_HD * 4, s));
	CK(cudaMemsetAsync(qg, 0, (size_t)W * OB_G * OB_HD * 4, s));
	cublasHandle_t hb;
	BK(cublasCreate(&hb));
	BK(cublasSetStream(hb, s));
	const float scale = 1.0f / sqrtf((float)OB_HD), zero = 0.0f;
	auto gemms = [&] {
		for (uint32_t l = 0; l < n_lists; l++)
			BK(cublasSgemm(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)len,
			               (int)(W * OB_G), (int)OB_HD, &scale, keys,
			               (int)OB_HD, qg, (int)OB_HD, &zero, logit,
			               (int)len));
		CK(cudaStreamSynchronize(s));
	};
	gemms();
	*floor_ms = wall_ms(gemms, 20, 2000);
	BK(cublasDestroy(hb));
	CK(cudaFree(keys));
	CK(cudaFree(qg));
	CK(cudaFree(logit));
	CK(cudaFree(ring));
	free(win);
	free(wl);
	free(ew);
	free(el);
	free(out);
	ob_table_free(&t);
}

