/*
 * test_cuda_kernels.c — every CUDA op of kernels/cuda/ against its CPU
 * reference in kernels/cpu/, over many shapes (the cuda backend:
 * test_cuda_backend.c; helpers: cuda_fixture.h).  Built into
 * build/bin/kvtrim-cuda-tests (links libkvtrim-cuda.so; the normal
 * kvtrim-tests never links CUDA).  Without a device every test skips with
 * the reason.  The same file also builds, against the CPU emulator of
 * tests/kernels/emu/ (KVT_CUDA_EMU), into kvtrim-cuda-emu-tests, which runs
 * the kernels without a GPU.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol * |cpu|, NaN/Inf checked first):
 *   append_kv, compact, select_*      exact (bytes / drop sets equal)
 *   paged_attention out               atol 2e-4, rtol 1e-3; lse atol 2e-4
 *   attn_band                         atol 1e-5, rtol 2e-4
 *   quad_form                         exact (its order's bits)
 *   scorer_linear, scorer_mlp         atol 1e-4, rtol 1e-4 (FP32 SGEMM)
 *   sink_gate                         atol 2e-5, rtol 1e-4
 * The float ops differ from the CPU only in summation order.
 *
 * Run: build/bin/kvtrim-cuda-tests [substring...]
 */
#include "cuda_fixture.h"
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

/* Defined by the CPU emulator's runtime only: there the kernels' float
 * operations are the host's, so fixed-order results must be the cpu's
 * bits; on a GPU expf rounds otherwise. */
extern uint64_t kvt_emu_launches(void) __attribute__((weak));

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
				/* on the emulator (expf is the host's) the fixed
				 * order gives the cpu's bits exactly */
				if (kvt_emu_launches &&
				    memcmp(w, gw, wn * sizeof(float)))
					th_fail(__FILE__, __LINE__, "%s: not the cpu's "
					        "bits on the emulator", what);
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

/* ----------------------------------------------------------- quad_form */

/* kernels.h's order of quad_form_cpu written out: row d of S dotted with
 * k in float, c ascending, each product and sum rounded (volatile: no
 * FMA), times k[d] in double, summed d ascending from 0. */
static double quad_naive(const float *k, uint32_t hd, const float *S)
{
	volatile double q = 0.0;
	for (uint32_t d = 0; d < hd; d++) {
		volatile float acc = 0.0f;
		for (uint32_t c = 0; c < hd; c++) {
			volatile float p = S[(size_t)d * hd + c] * k[c];
			acc = acc + p;
		}
		volatile double t = (double)acc * k[d];
		q = q + t;
	}
	return q;
}

/* The device's k^T S k of n keys: the cpu's and the naive order's bits,
 * on a GPU too (IEEE products and sums only, none fused). */
static void quad_case(const char *what, const float *k, uint32_t n,
                      uint32_t hd, const float *S)
{
	double *cpu = xmalloc(((size_t)n + 1) * 8);
	double *gpu = xmalloc(((size_t)n + 1) * 8);
	quad_form_cpu(k, n, hd, S, cpu);
	float *dk = to_dev(k, (size_t)n * hd * 4 + 4);
	float *dS = to_dev(S, (size_t)hd * hd * 4);
	double *dout = dmalloc((size_t)n * 8 + 8);
	T_OK(quad_form_cuda(dk, n, hd, dS, dout, 0));
	CK(cudaDeviceSynchronize());
	to_host(gpu, dout, (size_t)n * 8);
	for (uint32_t i = 0; i < n; i++) {
		const double want = quad_naive(k + (size_t)i * hd, hd, S);
		if (memcmp(&cpu[i], &want, 8) || memcmp(&gpu[i], &want, 8))
			th_fail(__FILE__, __LINE__, "%s: key %u: cpu %.17g gpu "
			        "%.17g, the order's %.17g", what, i, cpu[i],
			        gpu[i], want);
	}
	cudaFree(dk);
	cudaFree(dS);
	cudaFree(dout);
	free(cpu);
	free(gpu);
}

TEST(cuda, quad_form)
{
	/* Random keys and S of head_dims even, odd and beyond the cpu's
	 * vector path, counts that fill its lanes or not; then every row
	 * of S (1e8, 1, -1e8, 1) against k = (1, 1, 1, 1): 4 in this order
	 * only (each (S k)[d] loses the first 1: 8 in real numbers, 0 for
	 * the terms summed in reverse or in pairs). */
	need_device();
	static const uint32_t HD[] = {1, 2, 7, 8, 64, 128, 256, 258};
	static const uint32_t N[] = {0, 1, 9, 37, 300};
	for (size_t h = 0; h < sizeof(HD) / 4; h++)
		for (size_t c = 0; c < sizeof(N) / 4; c++) {
			const uint32_t hd = HD[h], n = N[c];
			float *k = xmalloc(((size_t)n * hd + 1) * 4);
			float *S = xmalloc((size_t)hd * hd * 4);
			fill(k, (size_t)n * hd, 3.0f);
			fill(S, (size_t)hd * hd, 2.0f);
			char what[48];
			snprintf(what, sizeof(what), "quad_form hd %u n %u", hd, n);
			quad_case(what, k, n, hd, S);
			free(k);
			free(S);
		}
	/* k as quad_case's copies read it: one float past the keys */
	float S[16], k[9 * 4 + 1];
	for (uint32_t e = 0; e < 16; e++)
		S[e] = e % 2 ? 1.0f : e % 4 == 0 ? 1e8f : -1e8f;
	for (uint32_t e = 0; e < 9 * 4 + 1; e++)
		k[e] = 1.0f;
	quad_case("quad_form hand", k, 9, 4, S);
	T_ASSERT(quad_naive(k, 4, S) == 4.0);
	double one;
	double *d1 = dmalloc(8);
	float *dk = to_dev(k, sizeof(k)), *dS = to_dev(S, sizeof(S));
	T_OK(quad_form_cuda(dk, 1, 4, dS, d1, 0));
	CK(cudaDeviceSynchronize());
	to_host(&one, d1, 8);
	T_ASSERT(one == 4.0);
	T_EQ(quad_form_cuda(NULL, 1, 4, dS, d1, 0), KVT_EINVAL);
	cudaFree(d1);
	cudaFree(dk);
	cudaFree(dS);
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

/* Defined by the CPU emulator's runtime only: the threads its launches
 * ran. */
extern uint64_t kvt_emu_threads(void) __attribute__((weak));

/* One batched selection over L lists of len[l] entries keeping k[l],
 * launched with the bound max_len on the longest list, against
 * select_topk_cpu on each list.  var 0: positions as ranks; 1: no ranks
 * (index ranks), ties; 2: repeated ranks, ties, nothing protected.
 * Returns the threads the call launched on the emulator (0 elsewhere). */
static uint64_t sel_batch_check(const uint32_t *len, const uint32_t *k,
                                uint32_t L, uint32_t max_len, int var)
{
	uint32_t *first = xmalloc((L + 1) * 4), total = 0;
	for (uint32_t l = 0; l < L; l++) {
		first[l] = total;
		total += len[l];
	}
	first[L] = total;
	float *sc = xmalloc(total * 4 + 4);
	uint32_t *rank = xmalloc(total * 4 + 4), *scr = xmalloc(total * 4 + 4);
	uint8_t *prot = xmalloc(total + 1), *drop = xmalloc(total + 1);
	uint8_t *gd = xmalloc(total + 1);
	uint32_t *cnt = xmalloc(L * 4), *gcnt = xmalloc(L * 4);
	const int no_rank = var == 1, no_prot = var == 2;
	sel_scores(sc, total, var > 0);
	for (uint32_t i = 0; i < total; i++) {
		rank[i] = var == 2 ? rnd() % 5 : i;
		prot[i] = rnd() % 5 == 0;
	}
	for (uint32_t l = 0; l < L; l++)
		cnt[l] = select_topk_cpu(
			sc + first[l], no_rank ? NULL : rank + first[l],
			no_prot ? NULL : prot + first[l], len[l], k[l],
			drop + first[l], scr);
	float *dsc = to_dev(sc, total * 4);
	uint32_t *drk = to_dev(rank, total * 4);
	uint8_t *dpr = to_dev(prot, total), *ddr = dmalloc(total + 1);
	uint32_t *df = to_dev(first, (L + 1) * 4), *dk = to_dev(k, L * 4);
	uint32_t *dc = dmalloc(L * 4);
	const uint64_t t0 = kvt_emu_threads ? kvt_emu_threads() : 0;
	T_OK(select_topk_batch_cuda(dsc, no_rank ? NULL : drk,
	                            no_prot ? NULL : dpr, df, L, max_len, dk,
	                            ddr, dc, 0));
	CK(cudaDeviceSynchronize());
	const uint64_t threads = kvt_emu_threads ? kvt_emu_threads() - t0 : 0;
	to_host(gd, ddr, total);
	to_host(gcnt, dc, L * 4);
	for (uint32_t i = 0; i < total; i++)
		if (gd[i] != drop[i])
			th_fail(__FILE__, __LINE__,
			        "topk batch variant %d max_len %u: drop[%u] cpu "
			        "%u gpu %u (score %g)", var, max_len, i, drop[i],
			        gd[i], sc[i]);
	for (uint32_t l = 0; l < L; l++)
		T_EQ(gcnt[l], cnt[l]);
	cudaFree(dsc); cudaFree(drk); cudaFree(dpr); cudaFree(ddr);
	cudaFree(df); cudaFree(dk); cudaFree(dc);
	free(first); free(sc); free(rank); free(scr); free(prot); free(drop);
	free(gd); free(cnt); free(gcnt);
	return threads;
}

/* Lists of one batch, with index ranks (rank NULL ranks each entry by its
 * index in its list), repeated ranks and ties, with and without protect. */
TEST_T(cuda, select_topk_batch, 60)
{
	need_device();
	enum { L = 9 };
	for (int var = 0; var < 3; var++) {
		uint32_t len[L], k[L], maxl = 0;
		for (uint32_t l = 0; l < L; l++) {
			len[l] = l == 4 ? 0 : rnd() % 3000;
			k[l] = rnd() % 1500;
			maxl = len[l] > maxl ? len[l] : maxl;
		}
		sel_batch_check(len, k, L, maxl, var);
	}
}

/* The block size follows max_len, BS[b] threads for the bound MAXL[b]
 * (the emulator counts them), and changes no result: lists of mixed
 * lengths, short ones and some longer than 1024 entries, under bounds
 * that give every block size, the true bound, and bounds below the
 * longest list (each thread then takes several entries of it). */
TEST_T(cuda, select_topk_batch_block_sizes, 60)
{
	need_device();
	static const uint32_t LEN[] = {3, 1, 31, 32, 33, 70, 1024, 1025, 2500,
	                               0, 129};
	static const uint32_t MAXL[] = {0, 1, 32, 33, 64, 100, 200, 500, 1024,
	                                2500, UINT32_MAX};
	static const uint32_t BS[] = {32, 32, 32, 64, 64, 128, 256, 512, 1024,
	                              1024, 1024};
	enum { L = sizeof(LEN) / 4 };
	for (size_t b = 0; b < sizeof(MAXL) / 4; b++)
		for (int var = 0; var < 3; var++) {
			uint32_t k[L];
			for (uint32_t l = 0; l < L; l++)
				k[l] = l % 3 == 0 ? LEN[l] / 2
				       : l % 3 == 1 ? rnd() % (LEN[l] + 1) : 1;
			uint64_t t = sel_batch_check(LEN, k, L, MAXL[b], var);
			if (kvt_emu_threads)
				T_EQ(t, (uint64_t)L * BS[b]);
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
