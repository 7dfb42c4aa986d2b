/*
 * bench_cuda.cuh — what the two files of kvtrim-cuda-bench share
 * (bench_cuda.cu: the kernels against their floors, and main;
 * bench_cuda_ops.cu: the cuda backend's ops): the includes, the
 * exit-on-error checks (a benchmark, not the daemon), the report line,
 * the random stream and the event timer.
 */
#ifndef KVT_BENCH_CUDA_CUH
#define KVT_BENCH_CUDA_CUH
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "common.cuh" /* KVT_LAUNCH */

#include "compact.cuh"
extern "C" {
#include "compact.h" /* compact_plan: a C header without guards */
}
#include "paged_attention.cuh"
#include "scorer_mlp.cuh"
#include "sink_gate.cuh"

extern "C" const struct kvt_backend_ops kvt_cuda_backend_v1;

#define CK(x)                                                                  \
	do {                                                                   \
		cudaError_t e_ = (x);                                          \
		if (e_ != cudaSuccess) {                                       \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, \
			        #x, cudaGetErrorString(e_));                   \
			exit(1);                                               \
		}                                                              \
	} while (0)
#define OK(x)                                                                  \
	do {                                                                   \
		int r_ = (x);                                                  \
		if (r_) {                                                      \
			fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__,   \
			        __LINE__, #x, r_);                             \
			exit(1);                                               \
		}                                                              \
	} while (0)

/* An op of the cuda backend: 0 or exit with its last_error. */
#define OP(x)                                                                  \
	do {                                                                   \
		int r_ = (x);                                                  \
		if (r_) {                                                      \
			fprintf(stderr, "%s:%d: %s failed (%d): %s\n",         \
			        __FILE__, __LINE__, #x, r_,                    \
			        kvt_cuda_backend_v1.last_error());             \
			exit(1);                                               \
		}                                                              \
	} while (0)
#define BK(x)                                                                  \
	do {                                                                   \
		cublasStatus_t b_ = (x);                                       \
		if (b_ != CUBLAS_STATUS_SUCCESS) {                             \
			fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n",        \
			        __FILE__, __LINE__, #x, (int)b_);              \
			exit(1);                                               \
		}                                                              \
	} while (0)

extern FILE *out_f;

/* Prints "name value" (and appends it to --out FILE). */
void report(const char *name, double v);

/* xorshift: the benchmarks' one random stream. */
uint32_t rnd(void);

/* Fisher-Yates with rnd(). */
void shuffle(uint32_t *v, uint32_t n);

/* qsort order of floats. */
static inline int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/* Median milliseconds of reps runs of fn(arg) on stream s. */
template <typename F> static float time_ms(F fn, int reps, cudaStream_t s)
{
	cudaEvent_t a, b;
	float t[64];
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	fn(); /* warm-up */
	CK(cudaStreamSynchronize(s));
	if (reps > 64)
		reps = 64;
	for (int i = 0; i < reps; i++) {
		CK(cudaEventRecord(a, s));
		fn();
		CK(cudaEventRecord(b, s));
		CK(cudaEventSynchronize(b));
		CK(cudaEventElapsedTime(&t[i], a, b));
	}
	CK(cudaEventDestroy(a));
	CK(cudaEventDestroy(b));
	qsort(t, (size_t)reps, sizeof(float), cmp_f);
	return t[reps / 2];
}

/* bench_cuda_ops.cu: the backend's ops (bench_cuda.cu's header comment
 * says what each measures). */
double bench_kvt_attention(const struct kvt_backend_ops *o, void *ctx,
                           cudaStream_t s, double *us);
double bench_key_norms(const struct kvt_backend_ops *o, void *ctx,
                       cudaStream_t s, double *floor_us);
void bench_prompt_select(const struct kvt_backend_ops *o, void *ctx,
                         cudaStream_t s, double *win_ms, double *exp_ms,
                         double *floor_ms);
void bench_decode_select(const struct kvt_backend_ops *o, void *ctx,
                         cudaStream_t s, double *h2o_us, double *tova_us,
                         double *pop_us, double *floor_us);

#endif
