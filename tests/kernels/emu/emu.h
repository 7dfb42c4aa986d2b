/*
 * emu.h — the CUDA device language for g++, so that the kernel files of
 * kernels/cuda/ run on a machine without a GPU.  The build force-includes
 * it (g++ -include) into every kernel file; the stand-in headers next to
 * it (include/) give the runtime API, cuBLAS and the half types.  A launch
 * runs synchronously, block after block, each thread a fiber switched only
 * at barriers; barriers that cannot complete end the launch with an error
 * naming the threads and lines; shared memory is filled with 0xff before
 * every block.  What it models and what it does not (concurrency between
 * blocks, the memory model, timing, the device's libm): docs/cuda.md,
 * "CPU emulation of the kernels".
 */
#ifndef KVT_EMU_H
#define KVT_EMU_H

#ifndef __cplusplus
#error "emu.h is the device language of the CUDA emulator: compile as C++"
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>

#include "include/cuda_runtime_api.h"

/* ---------------------------------------------------------- qualifiers */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
/* Checked at launch: tests/kernels/emu/wrap.awk registers each kernel's
 * bound after its file (KVT_EMU_BOUNDS). */
#define __launch_bounds__(...)
/* Static storage: blocks run one at a time, on the launching host thread.
 * Outside ASan they are thread_local, which puts all of them, template
 * kernels' too, in the TLS block of the emulator's object (the test
 * executable, or the emulated libkvtrim-cuda.so), which fiber.cc fills
 * with 0xff before every block (a section attribute would do, but GCC
 * ignores it on statics in templates).  ASan builds keep plain statics:
 * those get red zones. */
#ifdef __SANITIZE_ADDRESS__
#define __shared__ static
#else
#define __shared__ static thread_local
#endif

/* ---------------------------------------------------- built-in variables */

namespace kvt_emu {

/* The registers of the running thread (first member of its fiber). */
struct thread_regs {
	uint3 tid;
};

extern thread_regs *cur; /* NULL outside a kernel */
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

} /* namespace kvt_emu */

#define threadIdx (static_cast<const uint3 &>(kvt_emu::cur->tid))
#define blockIdx (static_cast<const uint3 &>(kvt_emu::block_idx))
#define blockDim (static_cast<const dim3 &>(kvt_emu::block_dim))
#define gridDim (static_cast<const dim3 &>(kvt_emu::grid_dim))

static constexpr int warpSize = 32;

/* ------------------------------------------------------------ barriers */

namespace kvt_emu {

enum warp_op {
	W_SYNC,
	W_SHFL,
	W_SHFL_UP,
	W_SHFL_DOWN,
	W_SHFL_XOR,
	W_BALLOT,
	W_ANY,
	W_ALL
};

void syncthreads(const char *file, int line);
/* Waits until every lane of mask has called the same op at the same line,
 * then returns this lane's result: the value of the source lane (shuffles,
 * value and result as raw bits), the vote (ballot, any, all), 0 (sync). */
uint64_t warp(int op, unsigned mask, uint64_t value, int arg, int width,
              const char *file, int line);
/* The launch's dynamic shared memory (KVT_DYN_SHARED). */
void *dyn_shared(void);

template <typename T> static inline uint64_t to_bits(T v)
{
	static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
	              "warp exchange of at most 8 bytes");
	uint64_t u = 0;
	memcpy(&u, &v, sizeof(T));
	return u;
}

template <typename T> static inline T from_bits(uint64_t u)
{
	T v;
	memcpy(&v, &u, sizeof(T));
	return v;
}

} /* namespace kvt_emu */

/* The call site (file, line) comes in through default arguments, so that
 * lanes at different barriers are told apart without macros. */
static inline void __syncthreads(const char *file = __builtin_FILE(),
                                 int line = __builtin_LINE())
{
	kvt_emu::syncthreads(file, line);
}

static inline void __syncwarp(unsigned mask = 0xffffffffu,
                              const char *file = __builtin_FILE(),
                              int line = __builtin_LINE())
{
	kvt_emu::warp(kvt_emu::W_SYNC, mask, 0, 0, 32, file, line);
}

template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane,
                            int width = 32,
                            const char *file = __builtin_FILE(),
                            int line = __builtin_LINE())
{
	return kvt_emu::from_bits<T>(kvt_emu::warp(
		kvt_emu::W_SHFL, mask, kvt_emu::to_bits(var), src_lane, width,
		file, line));
}

template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta,
                               int width = 32,
                               const char *file = __builtin_FILE(),
                               int line = __builtin_LINE())
{
	return kvt_emu::from_bits<T>(kvt_emu::warp(
		kvt_emu::W_SHFL_UP, mask, kvt_emu::to_bits(var), (int)delta,
		width, file, line));
}

template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta,
                                 int width = 32,
                                 const char *file = __builtin_FILE(),
                                 int line = __builtin_LINE())
{
	return kvt_emu::from_bits<T>(kvt_emu::warp(
		kvt_emu::W_SHFL_DOWN, mask, kvt_emu::to_bits(var), (int)delta,
		width, file, line));
}

template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask,
                                int width = 32,
                                const char *file = __builtin_FILE(),
                                int line = __builtin_LINE())
{
	return kvt_emu::from_bits<T>(kvt_emu::warp(
		kvt_emu::W_SHFL_XOR, mask, kvt_emu::to_bits(var), lane_mask,
		width, file, line));
}

static inline unsigned __ballot_sync(unsigned mask, int pred,
                                     const char *file = __builtin_FILE(),
                                     int line = __builtin_LINE())
{
	return (unsigned)kvt_emu::warp(kvt_emu::W_BALLOT, mask, pred != 0, 0,
	                               32, file, line);
}

static inline int __any_sync(unsigned mask, int pred,
                             const char *file = __builtin_FILE(),
                             int line = __builtin_LINE())
{
	return (int)kvt_emu::warp(kvt_emu::W_ANY, mask, pred != 0, 0, 32,
	                          file, line);
}

static inline int __all_sync(unsigned mask, int pred,
                             const char *file = __builtin_FILE(),
                             int line = __builtin_LINE())
{
	return (int)kvt_emu::warp(kvt_emu::W_ALL, mask, pred != 0, 0, 32,
	                          file, line);
}

/* One host thread runs everything, in program order: fences have nothing
 * to order. */
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

/* -------------------------------------------------------------- memory */

/* Cache hints change nothing on the host. */
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
template <typename T> static inline T __ldca(const T *p) { return *p; }
template <typename T> static inline T __ldlu(const T *p) { return *p; }
template <typename T> static inline T __ldcv(const T *p) { return *p; }
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }
template <typename T> static inline void __stcg(T *p, T v) { *p = v; }
template <typename T> static inline void __stwt(T *p, T v) { *p = v; }

/* Fibers switch only at barriers, so a read-modify-write is atomic. */
#define KVT_EMU_ATOMIC(T)                                                      \
	static inline T atomicAdd(T *p, T v)                                   \
	{                                                                      \
		T o = *p;                                                      \
		*p = o + v;                                                    \
		return o;                                                      \
	}                                                                      \
	static inline T atomicExch(T *p, T v)                                  \
	{                                                                      \
		T o = *p;                                                      \
		*p = v;                                                        \
		return o;                                                      \
	}
#define KVT_EMU_ATOMIC_INT(T)                                                  \
	KVT_EMU_ATOMIC(T)                                                      \
	static inline T atomicSub(T *p, T v)                                   \
	{                                                                      \
		T o = *p;                                                      \
		*p = o - v;                                                    \
		return o;                                                      \
	}                                                                      \
	static inline T atomicMax(T *p, T v)                                   \
	{                                                                      \
		T o = *p;                                                      \
		*p = o > v ? o : v;                                            \
		return o;                                                      \
	}                                                                      \
	static inline T atomicMin(T *p, T v)                                   \
	{                                                                      \
		T o = *p;                                                      \
		*p = o < v ? o : v;                                            \
		return o;                                                      \
	}                                                                      \
	static inline T atomicOr(T *p, T v)                                    \
	{                                                                      \
		T o = *p;                                                      \
		*p = o | v;                                                    \
		return o;                                                      \
	}                                                                      \
	static inline T atomicAnd(T *p, T v)                                   \
	{                                                                      \
		T o = *p;                                                      \
		*p = o & v;                                                    \
		return o;                                                      \
	}                                                                      \
	static inline T atomicCAS(T *p, T cmp, T v)                            \
	{                                                                      \
		T o = *p;                                                      \
		if (o == cmp)                                                  \
			*p = v;                                                \
		return o;                                                      \
	}
KVT_EMU_ATOMIC_INT(int)
KVT_EMU_ATOMIC_INT(unsigned int)
KVT_EMU_ATOMIC_INT(unsigned long long)
KVT_EMU_ATOMIC(float)
KVT_EMU_ATOMIC(double)
#undef KVT_EMU_ATOMIC_INT
#undef KVT_EMU_ATOMIC

/* ---------------------------------------------------------------- bits */

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x)
{
	return __builtin_popcountll(x);
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x)
{
	return x ? __builtin_clz((unsigned)x) : 32;
}
static inline int __clzll(long long x)
{
	return x ? __builtin_clzll((unsigned long long)x) : 64;
}
static inline unsigned __brev(unsigned x)
{
	x = (x >> 1 & 0x55555555u) | (x & 0x55555555u) << 1;
	x = (x >> 2 & 0x33333333u) | (x & 0x33333333u) << 2;
	x = (x >> 4 & 0x0f0f0f0fu) | (x & 0x0f0f0f0fu) << 4;
	return __builtin_bswap32(x);
}
static inline unsigned __float_as_uint(float f)
{
	return kvt_emu::from_bits<unsigned>(kvt_emu::to_bits(f));
}
static inline float __uint_as_float(unsigned u)
{
	return kvt_emu::from_bits<float>(kvt_emu::to_bits(u));
}
static inline int __float_as_int(float f)
{
	return kvt_emu::from_bits<int>(kvt_emu::to_bits(f));
}
static inline float __int_as_float(int u)
{
	return kvt_emu::from_bits<float>(kvt_emu::to_bits(u));
}

/* ---------------------------------------------------------------- math */

/* CUDA math functions that glibc lacks, and the fast-math intrinsics as
 * their accurate versions (the device's are approximations; a kernel whose
 * test needs the device's exact error is not a kernel test).  __expf,
 * __logf, __sinf and the like are glibc's own (the same accurate ones). */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
static inline float __saturatef(float x)
{
	return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f;
}
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c)
{
	return fmaf(a, b, c);
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }

/* -------------------------------------------------------------- launch */

namespace kvt_emu {

struct launch_desc {
	const char *name; /* the kernel as written at the launch site */
	const void *func; /* for cudaFuncSetAttribute */
	dim3 grid, block;
	size_t smem;
	cudaStream_t stream;
	const char *file; /* of the launch site */
	int line;
	void (*run)(void *obj); /* the kernel body of one thread */
	void *obj;
};

/* Runs the grid; the outcome is what cudaGetLastError returns next. */
void launch(const launch_desc &d);

/* The registry behind __launch_bounds__ (see wrap.awk). */
int register_bounds(const char *file, const char *name, long max_threads);

/* A launch with the kernel's parameter types P..., so the arguments convert
 * at the call as they do at a <<<>>> launch (NULL to a pointer, int to
 * uint64_t), and each thread gets its own copy of them. */
template <typename... P> struct launcher {
	launch_desc desc;
	void (*kernel)(P...);

	void operator()(P... args) const
	{
		struct bound {
			void (*fn)(P...);
			std::tuple<P...> params;
			static void run(void *obj)
			{
				bound *b = (bound *)obj;
				std::apply(b->fn, b->params);
			}
		};
		bound b{kernel, std::tuple<P...>(args...)};
		launch_desc d = desc;
		d.run = &bound::run;
		d.obj = &b;
		launch(d);
	}
};

template <typename... P>
static inline launcher<P...>
make_launcher(const char *name, void (*kernel)(P...), dim3 grid, dim3 block,
              size_t smem, cudaStream_t stream, const char *file, int line)
{
	launcher<P...> l;
	l.desc = launch_desc{name, (const void *)kernel, grid, block, smem,
	                     stream, file, line, nullptr, nullptr};
	l.kernel = kernel;
	return l;
}

} /* namespace kvt_emu */

/* kernel<<<grid, block, smem, stream>>>(...) */
#define KVT_EMU_LAUNCH(kernel, grid, block, smem, stream, ...)                 \
	kvt_emu::make_launcher(#kernel, kernel, grid, block, smem, stream,     \
	                       __FILE__, __LINE__)(__VA_ARGS__)

#define KVT_EMU_CAT2(a, b) a##b
#define KVT_EMU_CAT(a, b) KVT_EMU_CAT2(a, b)
/* Emitted by wrap.awk after a kernel file, one per __launch_bounds__. */
#define KVT_EMU_BOUNDS(file, kernel, max_threads)                              \
	static const int KVT_EMU_CAT(kvt_emu_bounds_, __COUNTER__)             \
		__attribute__((unused)) = kvt_emu::register_bounds(            \
			file, #kernel, (long)(max_threads))

#endif
