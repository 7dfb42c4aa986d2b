/*
 * runtime.cc — the CUDA runtime API of the CPU emulator (declared in
 * include/cuda_runtime_api.h; docs/cuda.md, "CPU emulation of the
 * kernels").
 *
 * Device memory is host memory from posix_memalign (256-byte aligned like
 * cudaMalloc's, exact size so that ASan reports the first byte beyond it),
 * filled with 0xff bytes so that a kernel reading memory nobody wrote sees
 * NaN, as it might see garbage on the device.  Every allocation is
 * recorded, and copies and memsets check that their device side lies
 * inside one: a host pointer passed as device memory is an error here too.
 * Streams and events are handles; all work runs at once, in order, so a
 * stream is always idle.  Errors are explained on stderr as they are
 * returned.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <map>
#include <set>

#include "emu.h"
#include "internal.h"

struct CUstream_st {
	unsigned flags;
};

struct CUevent_st {
	unsigned flags;
	bool recorded;
	double ms; /* CLOCK_MONOTONIC when recorded */
};

namespace kvt_emu {

namespace {

std::map<uintptr_t, size_t> allocs; /* base -> bytes */
std::set<const void *> streams, events;
std::map<const void *, int> func_smem; /* kernel -> max dynamic smem */
cudaError_t last_err = cudaSuccess, sticky_err = cudaSuccess;
size_t alloc_bytes;

/* Must precede any other work: after a fault the device is unusable. */
#define EMU_STICKY()                                                           \
	do {                                                                   \
		if (sticky_err != cudaSuccess)                                 \
			return sticky_err;                                     \
	} while (0)

cudaError_t fail(cudaError_t e, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
cudaError_t fail(cudaError_t e, const char *fmt, ...)
{
	char b[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	note("%s: %s", b, cudaGetErrorString(e));
	set_error(e, false);
	return e;
}

double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *kind_name(enum cudaMemcpyKind k)
{
	static const char *const n[] = {"HostToHost", "HostToDevice",
	                                "DeviceToHost", "DeviceToDevice",
	                                "Default"};
	return (unsigned)k <= 4 ? n[k] : "?";
}

/* The device side(s) of a copy of n bytes must be allocations. */
cudaError_t check_copy(const char *fn, void *dst, const void *src, size_t n,
                       enum cudaMemcpyKind kind)
{
	if ((unsigned)kind > cudaMemcpyDefault)
		return fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d", fn,
		            (int)kind);
	if (n == 0)
		return cudaSuccess;
	if (!dst || !src)
		return fail(cudaErrorInvalidValue, "%s: NULL pointer", fn);
	bool dd = kind == cudaMemcpyHostToDevice ||
	          kind == cudaMemcpyDeviceToDevice;
	bool sd = kind == cudaMemcpyDeviceToHost ||
	          kind == cudaMemcpyDeviceToDevice;
	if (dd && !is_device(dst, n))
		return fail(cudaErrorInvalidValue,
		            "%s(%s): destination %p + %zu bytes is not inside "
		            "a cudaMalloc allocation",
		            fn, kind_name(kind), dst, n);
	if (sd && !is_device(src, n))
		return fail(cudaErrorInvalidValue,
		            "%s(%s): source %p + %zu bytes is not inside a "
		            "cudaMalloc allocation",
		            fn, kind_name(kind), src, n);
	return cudaSuccess;
}

cudaError_t check_stream(const char *fn, cudaStream_t s)
{
	if (!is_stream(s))
		return fail(cudaErrorInvalidResourceHandle,
		            "%s: %p is not a live stream", fn, (void *)s);
	return cudaSuccess;
}

} /* namespace */

void note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("cuda emulator: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	fflush(stderr);
}

void set_error(cudaError_t e, bool sticky)
{
	if (sticky && sticky_err == cudaSuccess)
		sticky_err = e;
	last_err = e;
}

cudaError_t sticky_error(void)
{
	return sticky_err;
}

bool is_device(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	auto it = allocs.upper_bound(a);
	if (it == allocs.begin())
		return false;
	--it;
	return a - it->first <= it->second && n <= it->second - (a - it->first);
}

bool is_stream(cudaStream_t s)
{
	return !s || s == cudaStreamLegacy || s == cudaStreamPerThread ||
	       streams.count(s);
}

int func_max_dyn_smem(const void *func)
{
	auto it = func_smem.find(func);
	return it == func_smem.end() ? -1 : it->second;
}

} /* namespace kvt_emu */

using namespace kvt_emu;

/* ------------------------------------------------------------- errors */

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "no error";
	case cudaErrorInvalidValue:
		return "invalid argument";
	case cudaErrorMemoryAllocation:
		return "out of memory";
	case cudaErrorInitializationError:
		return "initialization error";
	case cudaErrorInvalidConfiguration:
		return "invalid configuration argument";
	case cudaErrorInvalidDevicePointer:
		return "invalid device pointer";
	case cudaErrorInvalidMemcpyDirection:
		return "invalid copy direction for memcpy";
	case cudaErrorInsufficientDriver:
		return "CUDA driver version is insufficient for CUDA runtime "
		       "version";
	case cudaErrorNoDevice:
		return "no CUDA-capable device is detected";
	case cudaErrorInvalidDevice:
		return "invalid device ordinal";
	case cudaErrorNoKernelImageForDevice:
		return "no kernel image is available for execution on the "
		       "device";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle";
	case cudaErrorNotReady:
		return "device not ready";
	case cudaErrorIllegalAddress:
		return "an illegal memory access was encountered";
	case cudaErrorLaunchOutOfResources:
		return "too many resources requested for launch";
	case cudaErrorAssert:
		return "device-side assert triggered";
	case cudaErrorLaunchFailure:
		return "unspecified launch failure";
	case cudaErrorNotSupported:
		return "operation not supported";
	default:
		return "unknown error";
	}
}

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
#define EMU_NAME(x)                                                            \
	case x:                                                                \
		return #x;
	switch (e) {
		EMU_NAME(cudaSuccess)
		EMU_NAME(cudaErrorInvalidValue)
		EMU_NAME(cudaErrorMemoryAllocation)
		EMU_NAME(cudaErrorInitializationError)
		EMU_NAME(cudaErrorInvalidConfiguration)
		EMU_NAME(cudaErrorInvalidDevicePointer)
		EMU_NAME(cudaErrorInvalidMemcpyDirection)
		EMU_NAME(cudaErrorInsufficientDriver)
		EMU_NAME(cudaErrorNoDevice)
		EMU_NAME(cudaErrorInvalidDevice)
		EMU_NAME(cudaErrorNoKernelImageForDevice)
		EMU_NAME(cudaErrorInvalidResourceHandle)
		EMU_NAME(cudaErrorNotReady)
		EMU_NAME(cudaErrorIllegalAddress)
		EMU_NAME(cudaErrorLaunchOutOfResources)
		EMU_NAME(cudaErrorAssert)
		EMU_NAME(cudaErrorLaunchFailure)
		EMU_NAME(cudaErrorNotSupported)
	default:
		return "cudaErrorUnknown";
	}
#undef EMU_NAME
}

extern "C" cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_err;
	last_err = sticky_err;
	return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void)
{
	return last_err;
}

/* ------------------------------------------------------------- device */

extern "C" cudaError_t cudaGetDeviceCount(int *n)
{
	if (!n)
		return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: NULL");
	*n = 1;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *dev)
{
	if (!dev)
		return fail(cudaErrorInvalidValue, "cudaGetDevice: NULL");
	*dev = 0;
	return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int dev)
{
	if (dev != 0)
		return fail(cudaErrorInvalidDevice,
		            "cudaSetDevice(%d): the emulator has device 0",
		            dev);
	return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value,
                                              enum cudaDeviceAttr attr,
                                              int dev)
{
	if (!value)
		return fail(cudaErrorInvalidValue,
		            "cudaDeviceGetAttribute: NULL");
	if (dev != 0)
		return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: "
		                                    "device %d", dev);
	switch (attr) {
	case cudaDevAttrMaxThreadsPerBlock:
	case cudaDevAttrMaxBlockDimX:
	case cudaDevAttrMaxBlockDimY:
		*value = DEV_MAX_THREADS;
		break;
	case cudaDevAttrMaxBlockDimZ:
		*value = 64;
		break;
	case cudaDevAttrMaxGridDimX:
		*value = 0x7fffffff;
		break;
	case cudaDevAttrMaxGridDimY:
	case cudaDevAttrMaxGridDimZ:
		*value = 65535;
		break;
	case cudaDevAttrMaxSharedMemoryPerBlock:
		*value = DEV_SMEM_DEFAULT;
		break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin:
		*value = DEV_SMEM_OPTIN;
		break;
	case cudaDevAttrWarpSize:
		*value = 32;
		break;
	case cudaDevAttrMultiProcessorCount:
		*value = DEV_SMS;
		break;
	case cudaDevAttrL2CacheSize:
		*value = 60 * 1024 * 1024;
		break;
	case cudaDevAttrComputeCapabilityMajor:
		*value = 9;
		break;
	case cudaDevAttrComputeCapabilityMinor:
		*value = 0;
		break;
	default:
		return fail(cudaErrorInvalidValue,
		            "cudaDeviceGetAttribute: attribute %d is not "
		            "emulated",
		            (int)attr);
	}
	return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
	EMU_STICKY();
	return cudaSuccess;
}

/* As on the device, the only way out of a sticky error. */
extern "C" cudaError_t cudaDeviceReset(void)
{
	sticky_err = last_err = cudaSuccess;
	return cudaSuccess;
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func,
                                            enum cudaFuncAttribute attr,
                                            int value)
{
	EMU_STICKY();
	if (!func)
		return fail(cudaErrorInvalidDevicePointer,
		            "cudaFuncSetAttribute: NULL kernel");
	if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
		return cudaSuccess;
	if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
		return fail(cudaErrorInvalidValue,
		            "cudaFuncSetAttribute: attribute %d is not "
		            "emulated",
		            (int)attr);
	if (value < 0 || value > DEV_SMEM_OPTIN)
		return fail(cudaErrorInvalidValue,
		            "cudaFuncSetAttribute: %d bytes of dynamic shared "
		            "memory (the device has %d)",
		            value, DEV_SMEM_OPTIN);
	func_smem[func] = value;
	return cudaSuccess;
}

/* ------------------------------------------------------------- memory */

extern "C" cudaError_t cudaMalloc(void **p, size_t n)
{
	EMU_STICKY();
	if (!p)
		return fail(cudaErrorInvalidValue, "cudaMalloc: NULL");
	*p = nullptr;
	if (n == 0)
		return cudaSuccess;
	void *m = nullptr;
	if (posix_memalign(&m, 256, n))
		return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu)", n);
	memset(m, 0xff, n); /* device memory starts out as garbage */
	allocs[(uintptr_t)m] = n;
	alloc_bytes += n;
	*p = m;
	return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p)
{
	EMU_STICKY();
	if (!p)
		return cudaSuccess;
	auto it = allocs.find((uintptr_t)p);
	if (it == allocs.end())
		return fail(cudaErrorInvalidValue,
		            "cudaFree(%p): not the start of a cudaMalloc "
		            "allocation",
		            p);
	alloc_bytes -= it->second;
	allocs.erase(it);
	free(p);
	return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void **p, size_t n)
{
	EMU_STICKY();
	if (!p)
		return fail(cudaErrorInvalidValue, "cudaMallocHost: NULL");
	*p = nullptr;
	if (posix_memalign(p, 256, n ? n : 1))
		return fail(cudaErrorMemoryAllocation, "cudaMallocHost(%zu)",
		            n);
	return cudaSuccess;
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
	free(p);
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	const size_t total = (size_t)141 << 30; /* an H200's 141 GB */
	if (free_bytes)
		*free_bytes = alloc_bytes < total ? total - alloc_bytes : 0;
	if (total_bytes)
		*total_bytes = total;
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                                  enum cudaMemcpyKind kind)
{
	EMU_STICKY();
	cudaError_t e = check_copy("cudaMemcpy", dst, src, n, kind);
	if (e == cudaSuccess && n)
		memcpy(dst, src, n);
	return e;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                       enum cudaMemcpyKind kind,
                                       cudaStream_t s)
{
	EMU_STICKY();
	cudaError_t e = check_stream("cudaMemcpyAsync", s);
	if (e == cudaSuccess)
		e = check_copy("cudaMemcpyAsync", dst, src, n, kind);
	if (e == cudaSuccess && n)
		memcpy(dst, src, n);
	return e;
}

extern "C" cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src,
                                    size_t spitch, size_t width,
                                    size_t height, enum cudaMemcpyKind kind)
{
	EMU_STICKY();
	if (width > dpitch || width > spitch)
		return fail(cudaErrorInvalidValue,
		            "cudaMemcpy2D: width %zu beyond a pitch", width);
	if (!width || !height)
		return cudaSuccess;
	size_t span_d = dpitch * (height - 1) + width;
	size_t span_s = spitch * (height - 1) + width;
	cudaError_t e = check_copy("cudaMemcpy2D", dst, src, span_d, kind);
	if (e == cudaSuccess)
		e = check_copy("cudaMemcpy2D", dst, src, span_s, kind);
	if (e != cudaSuccess)
		return e;
	for (size_t r = 0; r < height; r++)
		memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch,
		       width);
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch,
                                         const void *src, size_t spitch,
                                         size_t width, size_t height,
                                         enum cudaMemcpyKind kind,
                                         cudaStream_t s)
{
	EMU_STICKY();
	cudaError_t e = check_stream("cudaMemcpy2DAsync", s);
	if (e != cudaSuccess)
		return e;
	return cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t n)
{
	EMU_STICKY();
	if (n && !is_device(p, n))
		return fail(cudaErrorInvalidValue,
		            "cudaMemset: %p + %zu bytes is not inside a "
		            "cudaMalloc allocation",
		            p, n);
	if (n)
		memset(p, value, n);
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t n,
                                       cudaStream_t s)
{
	EMU_STICKY();
	cudaError_t e = check_stream("cudaMemsetAsync", s);
	if (e != cudaSuccess)
		return e;
	return cudaMemset(p, value, n);
}

/* ------------------------------------------------------------ streams */

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s,
                                                 unsigned int flags)
{
	EMU_STICKY();
	if (!s)
		return fail(cudaErrorInvalidValue, "cudaStreamCreate: NULL");
	*s = new CUstream_st{flags};
	streams.insert(*s);
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (!s || !streams.erase(s))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaStreamDestroy(%p): not a created stream",
		            (void *)s);
	delete s;
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	EMU_STICKY();
	return check_stream("cudaStreamSynchronize", s);
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s)
{
	EMU_STICKY();
	return check_stream("cudaStreamQuery", s);
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                           unsigned int flags)
{
	EMU_STICKY();
	if (!events.count(e))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaStreamWaitEvent: %p is not an event",
		            (void *)e);
	return check_stream("cudaStreamWaitEvent", s);
}

/* ------------------------------------------------------------- events */

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e,
                                                unsigned int flags)
{
	EMU_STICKY();
	if (!e)
		return fail(cudaErrorInvalidValue, "cudaEventCreate: NULL");
	*e = new CUevent_st{flags, false, 0.0};
	events.insert(*e);
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	return cudaEventCreateWithFlags(e, cudaEventDefault);
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	if (!events.erase(e))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventDestroy(%p): not an event", (void *)e);
	delete e;
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	EMU_STICKY();
	if (!events.count(e))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventRecord: %p is not an event", (void *)e);
	cudaError_t r = check_stream("cudaEventRecord", s);
	if (r != cudaSuccess)
		return r;
	e->recorded = true;
	e->ms = now_ms();
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	EMU_STICKY();
	if (!events.count(e))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventSynchronize: %p is not an event",
		            (void *)e);
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t e)
{
	return cudaEventSynchronize(e);
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                            cudaEvent_t end)
{
	EMU_STICKY();
	if (!ms || !events.count(start) || !events.count(end))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventElapsedTime: not events");
	if ((start->flags | end->flags) & cudaEventDisableTiming)
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventElapsedTime: an event without timing");
	if (!start->recorded || !end->recorded)
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventElapsedTime: an event not recorded");
	*ms = (float)(end->ms - start->ms);
	return cudaSuccess;
}
