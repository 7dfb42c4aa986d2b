/*
 * cuda_runtime_api.h — stand-in for the CUDA runtime API in the CPU
 * emulation of the kernels (tests/kernels/emu/, docs/cuda.md "CPU emulation
 * of the kernels").  It declares the part of the runtime that the kernel
 * files of kernels/cuda/ and tests/kernels/test_cuda_kernels.c call, with the
 * toolkit's names and error numbers, implemented in
 * tests/kernels/emu/runtime.cc on host memory: "device" memory is
 * posix_memalign'd (so ASan sees overruns), streams run synchronously and
 * there is one emulated device, an sm_90 with 132 multiprocessors (an
 * H200, so launch plans that depend on the SM count match the real one).
 * Valid C and C++; including it defines KVT_CUDA_EMU, which the test uses
 * to skip what the emulator does not provide (two processes sharing device
 * memory) and to reach kvt_emu_set_event_lag below.
 *
 * The part that backend/cuda/ needs is here too: pinned host
 * memory, interprocess events and legacy IPC memory handles (usable within
 * the one process), cudaMemcpyDefault, and a driver-entry-point lookup that
 * finds nothing (no driver API, so no VMM: the backend uses ipc mode).
 */
#ifndef KVT_EMU_CUDA_RUNTIME_API_H
#define KVT_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>
#include <stdint.h>

#include "vector_types.h"

#ifndef KVT_CUDA_EMU
#define KVT_CUDA_EMU 1
#endif

#define CUDART_VERSION 13000

/* The toolkit's numbers (driver_types.h), so codes print the same. */
typedef enum cudaError {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
	cudaErrorInvalidConfiguration = 9,
	cudaErrorInvalidPitchValue = 12,
	cudaErrorInvalidDevicePointer = 17,
	cudaErrorInvalidMemcpyDirection = 21,
	cudaErrorInsufficientDriver = 35,
	cudaErrorNoDevice = 100,
	cudaErrorMapBufferObjectFailed = 205,
	cudaErrorInvalidDevice = 101,
	cudaErrorNoKernelImageForDevice = 209,
	cudaErrorInvalidResourceHandle = 400,
	cudaErrorNotReady = 600,
	cudaErrorIllegalAddress = 700,
	cudaErrorLaunchOutOfResources = 701,
	cudaErrorAssert = 710,
	cudaErrorLaunchFailure = 719,
	cudaErrorNotSupported = 801,
	cudaErrorUnknown = 999
} cudaError_t;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4
};

enum cudaDeviceAttr {
	cudaDevAttrMaxThreadsPerBlock = 1,
	cudaDevAttrMaxBlockDimX = 2,
	cudaDevAttrMaxBlockDimY = 3,
	cudaDevAttrMaxBlockDimZ = 4,
	cudaDevAttrMaxGridDimX = 5,
	cudaDevAttrMaxGridDimY = 6,
	cudaDevAttrMaxGridDimZ = 7,
	cudaDevAttrMaxSharedMemoryPerBlock = 8,
	cudaDevAttrWarpSize = 10,
	cudaDevAttrMultiProcessorCount = 16,
	cudaDevAttrL2CacheSize = 38,
	cudaDevAttrComputeCapabilityMajor = 75,
	cudaDevAttrComputeCapabilityMinor = 76,
	cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

enum cudaFuncAttribute {
	cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
	cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventBlockingSync 0x1
#define cudaEventDisableTiming 0x2
#define cudaEventInterprocess 0x4
#define cudaIpcMemLazyEnablePeerAccess 0x1

/* Legacy interprocess handles: 64 opaque bytes, as in the toolkit. */
#define CUDA_IPC_HANDLE_SIZE 64
typedef struct cudaIpcEventHandle_st {
	char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcEventHandle_t;
typedef struct cudaIpcMemHandle_st {
	char reserved[CUDA_IPC_HANDLE_SIZE];
} cudaIpcMemHandle_t;

/* cudaPointerGetAttributes: what memory an address is in. */
enum cudaMemoryType {
	cudaMemoryTypeUnregistered = 0,
	cudaMemoryTypeHost = 1,
	cudaMemoryTypeDevice = 2,
	cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
	enum cudaMemoryType type;
	int device;
	void *devicePointer;
	void *hostPointer;
};

enum cudaGetDriverEntryPointFlags {
	cudaEnableDefault = 0x0,
	cudaEnableLegacyStream = 0x1,
	cudaEnablePerThreadDefaultStream = 0x2
};

enum cudaDriverEntryPointQueryResult {
	cudaDriverEntryPointSuccess = 0,
	cudaDriverEntryPointSymbolNotFound = 1,
	cudaDriverEntryPointVersionNotSufficent = 2
};

#ifdef __cplusplus
extern "C" {
#endif

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
/* The launch error (configuration, or a fault the emulator found in the
 * kernel: deadlock, barrier divergence) is returned once, then cleared. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaDriverGetVersion(int *version);
cudaError_t cudaRuntimeGetVersion(int *version);
/* The driver API is the VMM calls of tests/kernels/emu/driver.cc (the
 * cuMem* that backend/cuda/ uses, cuDeviceGet,
 * cuDeviceGetAttribute, cuGetErrorString): *funcPtr is the emulator's
 * function and *driverStatus cudaDriverEntryPointSuccess.  Any other
 * symbol, or any at all after kvt_emu_set_driver(KVT_EMU_DRIVER_NONE),
 * gives a NULL function and cudaDriverEntryPointSymbolNotFound
 * (cudaSuccess, as the runtime answers for a symbol the driver lacks). */
#ifdef __cplusplus
cudaError_t cudaGetDriverEntryPointByVersion(
	const char *symbol, void **funcPtr, unsigned int cudaVersion,
	unsigned long long flags,
	enum cudaDriverEntryPointQueryResult *driverStatus = NULL);
#else
cudaError_t cudaGetDriverEntryPointByVersion(
	const char *symbol, void **funcPtr, unsigned int cudaVersion,
	unsigned long long flags,
	enum cudaDriverEntryPointQueryResult *driverStatus);
#endif

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr,
                                   int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
                                 int value);

cudaError_t cudaMalloc(void **p, size_t n);
/* Device for an address inside an allocation or import, Host inside a
 * cudaMallocHost block, else Unregistered (success, as CUDA 11+). */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a,
                                     const void *p);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n,
                       enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                            enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src,
                         size_t spitch, size_t width, size_t height,
                         enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemset(void *p, int value, size_t n);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                unsigned int flags);
/* Work runs when queued, so fn runs before this returns (on the calling
 * thread; on a GPU it runs on a driver thread once the stream gets
 * there).  fn must not call the runtime, as on a GPU. */
typedef void (*cudaHostFn_t)(void *user_data);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn,
                               void *user_data);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                 cudaEvent_t end);

/* Legacy IPC.  A memory handle
 * names the allocation that holds devPtr; opening it returns that
 * allocation's base (counted: each open needs its close, and cudaFree of
 * an allocation still open fails, where CUDA leaves it undefined).  An
 * event handle opens as a new cudaEvent_t that shares the exporter's
 * state.  Unlike CUDA, the exporting process may open its own handles;
 * another process maps the allocation's memfd (ASan builds, whose device
 * memory is heap, refuse that), and an event opened there is always
 * complete (runtime.cc). */
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr);
cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
                                 unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void *devPtr);
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle,
                                  cudaEvent_t event);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event,
                                   cudaIpcEventHandle_t handle);

/* Emulator only (not CUDA).  Work runs when it is queued, so every event
 * is complete once recorded.  With a lag of n, cudaEventQuery answers
 * cudaErrorNotReady for an event until n more events (any) have been
 * recorded after it, as if the device ran n records behind the host, or
 * until the event, its stream or the device is synchronised: code that
 * polls events (staging buffers reused round robin) then takes its
 * "still busy" paths.  0, the default, turns it off.  Returns the
 * previous lag. */
unsigned kvt_emu_set_event_lag(unsigned n);

/* Emulator only (not CUDA).  The bytes this process copied so far from
 * host to device (*h2d) and from device to host (*d2h), over every
 * cudaMemcpy, cudaMemcpyAsync, cudaMemcpy2D and cudaMemcpy2DAsync (a 2D
 * copy counts width x height).  The direction comes from the addresses, as
 * cudaMemcpyDefault tells it: a side is device memory when its first byte
 * lies in an allocation (or a mapping); device-to-device and host-to-host
 * copies count nothing, nor do memsets.  Either pointer may be NULL. */
void kvt_emu_traffic(uint64_t *h2d, uint64_t *d2h);
/* Kernel launches and cuBLAS calls of the process so far. */
uint64_t kvt_emu_launches(void);
/* Emulator only (not CUDA).  The threads of the process's kernel launches
 * so far, grid times block of each launch that ran (a refused
 * configuration counts none): what a test reads to check a launch's
 * block size. */
uint64_t kvt_emu_threads(void);
/* Emulator only (not CUDA).  CPU nanoseconds the process's threads spent
 * inside the emulator's entry points (kernels, cuBLAS, copies, and the
 * runtime calls around them) since the first call, which returns 0 and
 * turns the count on (it costs two clock reads an entry point): the work
 * a GPU and its driver would have done, which the daemon's CPU time on
 * the emulator includes.  Differences between calls are what it means. */
uint64_t kvt_emu_api_ns(void);

/* Emulator only (not CUDA).  What driver the backend finds:
 *   KVT_EMU_DRIVER_VMM     the default: the VMM calls, and device 0 reports
 *                          VMM and POSIX-fd handle support;
 *   KVT_EMU_DRIVER_NO_VMM  the calls, but the device reports neither
 *                          (a device or driver without VMM);
 *   KVT_EMU_DRIVER_NONE    no driver entry point at all.
 * Returns the previous level.  Set it before anything asks for entry
 * points: code that caches them (the backend does) keeps what it got. */
enum { KVT_EMU_DRIVER_NONE = 0, KVT_EMU_DRIVER_NO_VMM = 1,
       KVT_EMU_DRIVER_VMM = 2 };
int kvt_emu_set_driver(int level);

#ifdef __cplusplus
}

/* The runtime's C++ overload: any kernel pointer. */
template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *func,
                                               enum cudaFuncAttribute attr,
                                               int value)
{
	return cudaFuncSetAttribute((const void *)func, attr, value);
}
#endif

#endif
