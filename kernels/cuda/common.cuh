/*
 * common.cuh — what every CUDA op of kernels/cuda/ shares: error mapping
 * (launchers RETURN a KVT_E* code, never exit), dtype loads and stores on
 * the device, and the page addressing of kernels.h:
 *   page = [K: page_tokens x head_dim][V: page_tokens x head_dim] (dtype)
 *   entry e of a list is row e % page_tokens of page pages[e / page_tokens].
 *
 * Internal to libkvtrim-cuda.so: everything here is static or inline; no
 * symbol leaves the file that includes it.
 */
#ifndef KVT_CUDA_COMMON_CUH
#define KVT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "dtype.h"
#include "kvtrim.h"

/* ------------------------------------------------------------- errors */

/* cudaError_t -> KVT_E*: invalid arguments stay EINVAL, a missing driver
 * or device is ENOTSUP, everything else (launch failures, out of device
 * memory, sticky faults) is ESYS.  cudaGetErrorString() of the original
 * code is what callers log; kvtrim.h has no CUDA-specific code. */
static inline int common_err(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidConfiguration:
		return KVT_EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorNoKernelImageForDevice:
		return KVT_ENOTSUP;
	default:
		return KVT_ESYS;
	}
}

/* Returns the mapped code from the enclosing launcher on failure. */
#define COMMON_CALL(expr)                                                      \
	do {                                                                   \
		cudaError_t e_ = (expr);                                       \
		if (e_ != cudaSuccess)                                         \
			return common_err(e_);                                 \
	} while (0)

/* After a launch: configuration errors surface here; faults inside the
 * kernel surface at the caller's next synchronisation. */
#define COMMON_LAUNCHED() COMMON_CALL(cudaGetLastError())

/* ------------------------------------------------------------- launch */

/*
 * kernel<<<grid, block, smem, stream>>>(...), spelled so that g++ can read
 * it too: the CPU emulator (tests/kernels/emu/, docs/cuda.md) compiles
 * these files without nvcc and runs the launch on fibers.  A kernel whose
 * template arguments hold commas goes in parentheses:
 *   KVT_LAUNCH((k<T, 4>), grid, 128, 0, s, args);
 */
/* The launches (KVT_LAUNCH) and cuBLAS calls (common_count_launch before
 * each) of this module so far: one counter per linked module (an inline
 * function's static), which libkvtrim-cuda.so's traffic op reports, so
 * that a benchmark sees what a sync costs in launches where no GPU is. */
inline unsigned long long *common_launches(void)
{
	static unsigned long long n;
	return &n;
}

static inline void common_count_launch(void)
{
	__atomic_fetch_add(common_launches(), 1ull, __ATOMIC_RELAXED);
}

#if defined(__CUDACC__)
#define KVT_LAUNCH(kernel, grid, block, smem, stream, ...)                     \
	(common_count_launch(),                                                \
	 kernel<<<grid, block, smem, stream>>>(__VA_ARGS__))
#elif defined(KVT_CUDA_EMU)
#define KVT_LAUNCH(kernel, grid, block, smem, stream, ...)                     \
	(common_count_launch(),                                                \
	 KVT_EMU_LAUNCH(kernel, grid, block, smem, stream, __VA_ARGS__))
#else
#error "kernels/cuda/ builds with nvcc, or with g++ under the CUDA emulator"
#endif

/* The launch's dynamic shared memory as T name[] (its size is the launch's
 * smem argument).  The emulator keeps __shared__ variables static, and a
 * static cannot be declared extern, hence the macro. */
#if defined(__CUDACC__)
#define KVT_DYN_SHARED(T, name) extern __shared__ T name[]
#else
#define KVT_DYN_SHARED(T, name) T *const name = (T *)kvt_emu::dyn_shared()
#endif

static inline unsigned common_cdiv(uint64_t a, uint64_t b)
{
	return (unsigned)((a + b - 1) / b);
}

/* log2 of a power of two, or 32 when x is not one (callers then divide). */
static inline uint32_t common_shift(uint32_t x)
{
	if (x == 0 || (x & (x - 1)))
		return 32;
	uint32_t s = 0;
	while ((1u << s) != x)
		s++;
	return s;
}

/* Multiprocessors of the current device (cached per device, 0 on error). */
static inline int common_sm_count(void)
{
	static int cache[64];
	int dev = 0, n = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0)
		return 0;
	if (dev < 64 && cache[dev])
		return cache[dev];
	if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) !=
	    cudaSuccess)
		return 0;
	if (dev < 64)
		cache[dev] = n; /* same value from every thread: benign */
	return n;
}

/* ------------------------------------------------------------- dtypes */

/* Bytes per element, 0 for an unknown dtype (kvt_dtype_size lives in
 * core/dtype.c, which this library does not link: its inline body,
 * dtype_size in core/dtype.h). */
static inline uint32_t common_dt_size(enum kvt_dtype dt)
{
	return (uint32_t)dtype_size(dt);
}

typedef __half f16_t;
typedef __nv_bfloat16 bf16_t;

__device__ __forceinline__ float common_to_f(float x) { return x; }
__device__ __forceinline__ float common_to_f(f16_t x) { return __half2float(x); }
__device__ __forceinline__ float common_to_f(bf16_t x)
{
	return __bfloat162float(x);
}

/* attn_dot_cpu's fixed order (kernels.h): d ascending from 0.0f, each
 * product and each sum rounded, never fused (__fmul_rn / __fadd_rn: nvcc
 * contracts a * b + c into an FMA otherwise).  a and b strided by sa, sb
 * floats. */
__device__ __forceinline__ float common_dot_rn(const float *a, uint32_t sa,
                                               const float *b, uint32_t sb,
                                               uint32_t n)
{
	float acc = 0.0f;
	for (uint32_t d = 0; d < n; d++)
		acc = __fadd_rn(acc, __fmul_rn(a[(uint64_t)d * sa],
		                               b[(uint64_t)d * sb]));
	return acc;
}

/* quad_form_cpu's fixed order (kernels.h) for one key k [hd] (entries of
 * E, read as float) and S [hd][hd]: for d ascending, row d of S dotted
 * with k as common_dot_rn, times k[d] in double, summed from 0.0; the _rn
 * intrinsics keep nvcc from fusing a product into its sum, so the bits
 * are the cpu's on a GPU too (only IEEE products and sums).  One thread,
 * nothing stored. */
template <typename E>
__device__ __forceinline__ double common_quad_rn(const E *k, const float *S,
                                                 uint32_t hd)
{
	double q = 0.0;
	for (uint32_t d = 0; d < hd; d++) {
		const float *s = S + (uint64_t)d * hd;
		float acc = 0.0f;
		for (uint32_t c = 0; c < hd; c++)
			acc = __fadd_rn(acc, __fmul_rn(s[c], common_to_f(k[c])));
		q = __dadd_rn(q, __dmul_rn((double)acc,
		                           (double)common_to_f(k[d])));
	}
	return q;
}

/* Round to nearest even, bit for bit as dtype_from_f32, NaNs included:
 * the conversion instructions turn every NaN into the canonical 0x7fff,
 * while the CPU keeps the sign and the top of the payload (f16: quiet bit
 * set; bf16: truncated, quiet bit set), so NaNs are converted here. */
template <typename T> __device__ __forceinline__ T common_from_f(float x);
template <> __device__ __forceinline__ float common_from_f<float>(float x)
{
	return x;
}
template <> __device__ __forceinline__ f16_t common_from_f<f16_t>(float x)
{
	if (isnan(x)) {
		uint32_t u = __float_as_uint(x);
		return __ushort_as_half((unsigned short)((u >> 16 & 0x8000u) |
		                                         0x7e00u |
		                                         (u >> 13 & 0x3ffu)));
	}
	return __float2half_rn(x);
}
template <> __device__ __forceinline__ bf16_t common_from_f<bf16_t>(float x)
{
	if (isnan(x))
		return __ushort_as_bfloat16(
			(unsigned short)(__float_as_uint(x) >> 16 | 0x0040u));
	return __float2bfloat16_rn(x);
}

/* Elements of T in one 16-byte vector. */
template <typename T> struct common_vec {
	static constexpr int n = 16 / (int)sizeof(T);
};

/* Unpacks a 16-byte vector of T into floats. */
__device__ __forceinline__ void common_unpack(uint4 r, float *f, float)
{
	f[0] = __uint_as_float(r.x);
	f[1] = __uint_as_float(r.y);
	f[2] = __uint_as_float(r.z);
	f[3] = __uint_as_float(r.w);
}
/* Element 2i is the low half of word i.  The halves are taken apart with
 * shifts: reading a uint32_t through a __half2 pointer is undefined
 * behaviour in C++ (strict aliasing), which g++ optimises on. */
__device__ __forceinline__ void common_unpack(uint4 r, float *f, f16_t)
{
	const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
	for (int i = 0; i < 4; i++) {
		f[2 * i] = __half2float(__ushort_as_half(w[i] & 0xffffu));
		f[2 * i + 1] = __half2float(__ushort_as_half(w[i] >> 16));
	}
}
__device__ __forceinline__ void common_unpack(uint4 r, float *f, bf16_t)
{
	const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
	for (int i = 0; i < 4; i++) { /* bf16 is the top half of a float */
		f[2 * i] = __uint_as_float(w[i] << 16);
		f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
	}
}

/* Row e of a page list: the K row; the V row is v_off bytes further. */
__device__ __forceinline__ const char *
common_row(void *const *pages, uint32_t e, uint32_t page_tokens,
           uint32_t shift, uint32_t row_bytes)
{
	uint32_t pg, r;
	if (shift < 32) {
		pg = e >> shift;
		r = e & (page_tokens - 1);
	} else {
		pg = e / page_tokens;
		r = e % page_tokens;
	}
	return (const char *)pages[pg] + (size_t)r * row_bytes;
}

/* Dispatches a runtime kvt_dtype to a template type T inside a launcher. */
#define COMMON_DISPATCH_DT(dt, T, ...)                                         \
	switch (dt) {                                                          \
	case KVT_DTYPE_F32: {                                                  \
		typedef float T;                                               \
		__VA_ARGS__;                                                   \
		break;                                                         \
	}                                                                      \
	case KVT_DTYPE_F16: {                                                  \
		typedef f16_t T;                                               \
		__VA_ARGS__;                                                   \
		break;                                                         \
	}                                                                      \
	case KVT_DTYPE_BF16: {                                                 \
		typedef bf16_t T;                                              \
		__VA_ARGS__;                                                   \
		break;                                                         \
	}                                                                      \
	default:                                                               \
		return KVT_EINVAL;                                             \
	}

#endif
