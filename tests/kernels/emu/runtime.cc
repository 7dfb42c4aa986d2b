/*
 * runtime.cc — the CUDA runtime API of the CPU emulator (declared in
 * include/cuda_runtime_api.h; docs/cuda.md, "CPU emulation of the
 * kernels").
 *
 * Device memory is host memory, filled with 0xff bytes so that a kernel
 * reading memory nobody wrote sees NaN, as it might see garbage on the
 * device.  Outside ASan builds each allocation is a memfd mapped
 * MAP_SHARED (page-aligned), so that another process can map it from its
 * legacy IPC handle (the handle names the exporter's pid, the fd and the
 * memfd's serial; the importer opens /proc/<pid>/fd/<fd>).  ASan builds use
 * posix_memalign at the exact size instead (256-byte aligned like
 * cudaMalloc's), so that ASan reports the first byte beyond it; their
 * handles open in the one process only.  Every allocation (and every
 * imported mapping) is recorded, and copies and memsets check that their
 * device side lies inside one: a host pointer passed as device memory is
 * an error here too.  Streams and events are handles; all work runs at
 * once, in order, so a stream is always idle and a recorded event complete
 * (kvt_emu_set_event_lag can make queries say otherwise for a while).  An
 * event opened from another process's handle is a new event that is
 * always complete: ordering between processes is not modelled.  Errors
 * are explained on stderr as they are returned.  The bytes of every copy
 * between host and device are counted by direction (kvt_emu_traffic), the
 * side that is device memory told from the address as cudaMemcpyDefault
 * does; device-to-device and host-to-host copies, and memsets, move no
 * byte across and are not counted.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <memory>
#include <set>

#include "emu.h"
#include "internal.h"

struct CUstream_st {
	unsigned flags;
};

/* What an event and the events opened from its IPC handle share. */
struct emu_event_state {
	bool recorded;
	double ms;           /* CLOCK_MONOTONIC when recorded */
	cudaStream_t stream; /* of the last record; NULL once it is destroyed */
	bool pending;        /* the event lag has not let it complete yet */
	uint64_t tick;       /* record_clock at the last record */
	unsigned lag;        /* event_lag at the last record */
	uint64_t ipc;        /* serial of its IPC handle, 0 before one */
};

struct CUevent_st {
	unsigned flags;
	std::shared_ptr<emu_event_state> st;
};

namespace kvt_emu {

namespace {

struct alloc_rec {
	size_t bytes;
	uint64_t serial; /* tells a freed allocation from a later one */
	int ipc_opens;   /* cudaIpcOpenMemHandle minus cudaIpcCloseMemHandle */
	int fd;          /* its memfd, or -1 (ASan builds: heap memory) */
	size_t map_bytes; /* of the mapping (bytes rounded up to a page) */
	bool imported;   /* mapped from another process's handle */
	int32_t pid;     /* imported: the exporter and its serial */
	bool vmm;        /* a cuMemMap mapping (driver.cc), not cudaMalloc */
	bool readonly;   /* vmm: its access is CU_MEM_ACCESS_FLAGS_PROT_READ */
};

std::map<uintptr_t, alloc_rec> allocs; /* base -> allocation or import */
std::map<uintptr_t, size_t> pinned;   /* cudaMallocHost: base -> bytes */
uint64_t next_serial = 1;
std::set<const void *> streams, events;
/* Destroyed events stay allocated, so that their address is not reused
 * and a later use is reported as what it is. */
std::set<const void *> dead_events;
std::map<uint64_t, std::weak_ptr<emu_event_state>> ipc_events;
/* kvt_emu_set_event_lag: an event completes once event_lag more records
 * (of any event) followed its own, or when something synchronises it. */
unsigned event_lag;
uint64_t record_clock;
std::map<const void *, int> func_smem; /* kernel -> max dynamic smem */
cudaError_t last_err = cudaSuccess, sticky_err = cudaSuccess;
size_t alloc_bytes;
/* Bytes copied host -> device and device -> host (kvt_emu_traffic). */
uint64_t traffic_h2d, traffic_d2h;

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

/* The allocation that holds p, or allocs.end(). */
std::map<uintptr_t, alloc_rec>::iterator alloc_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	auto it = allocs.upper_bound(a);
	if (it == allocs.begin())
		return allocs.end();
	--it;
	return a - it->first < it->second.bytes ? it : allocs.end();
}

/* A write of n bytes at p, device memory, through a read-only mapping
 * (cuMemSetAccess PROT_READ): the device's MMU refuses it, a fault that
 * leaves the context unusable, so the error is sticky as a kernel's
 * fault is. */
cudaError_t check_writable(const char *fn, void *p, size_t n)
{
	auto it = alloc_of(p);
	if (it == allocs.end() || !it->second.readonly)
		return cudaSuccess;
	note("%s: %p + %zu bytes lies in a read-only mapping "
	     "(cuMemSetAccess PROT_READ): %s",
	     fn, p, n, cudaGetErrorString(cudaErrorIllegalAddress));
	set_error(cudaErrorIllegalAddress, true);
	return cudaErrorIllegalAddress;
}

/* The device side(s) of a copy must be allocations: nd bytes from dst, ns
 * from src (they differ for a 2D copy with two pitches).  With
 * cudaMemcpyDefault (unified addressing) a side is device memory when its
 * first byte lies in an allocation, as the driver tells from the address. */
cudaError_t check_copy(const char *fn, void *dst, const void *src, size_t nd,
                       size_t ns, enum cudaMemcpyKind kind)
{
	if ((unsigned)kind > cudaMemcpyDefault)
		return fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d", fn,
		            (int)kind);
	if (nd == 0 || ns == 0)
		return cudaSuccess;
	if (!dst || !src)
		return fail(cudaErrorInvalidValue, "%s: NULL pointer", fn);
	if (kind == cudaMemcpyDefault) {
		bool d = alloc_of(dst) != allocs.end();
		bool s = alloc_of(src) != allocs.end();
		kind = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
		         : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
	}
	bool dd = kind == cudaMemcpyHostToDevice ||
	          kind == cudaMemcpyDeviceToDevice;
	bool sd = kind == cudaMemcpyDeviceToHost ||
	          kind == cudaMemcpyDeviceToDevice;
	if (dd && !is_device(dst, nd))
		return fail(cudaErrorInvalidValue,
		            "%s(%s): destination %p + %zu bytes is not inside "
		            "a cudaMalloc allocation",
		            fn, kind_name(kind), dst, nd);
	if (sd && !is_device(src, ns))
		return fail(cudaErrorInvalidValue,
		            "%s(%s): source %p + %zu bytes is not inside a "
		            "cudaMalloc allocation",
		            fn, kind_name(kind), src, ns);
	return dd ? check_writable(fn, dst, nd) : cudaSuccess;
}

/* Counts a copy that check_copy let through: n bytes from src to dst,
 * host -> device or device -> host as the addresses tell (the copy's kind
 * was checked against them; a host side is any address outside the
 * allocations, pinned or not). */
void count_copy(void *dst, const void *src, size_t n)
{
	bool d = alloc_of(dst) != allocs.end();
	bool s = alloc_of(src) != allocs.end();
	if (d && !s)
		traffic_h2d += n;
	else if (s && !d)
		traffic_d2h += n;
}

cudaError_t check_stream(const char *fn, cudaStream_t s)
{
	if (!is_stream(s))
		return fail(cudaErrorInvalidResourceHandle,
		            "%s: %p is not a live stream", fn, (void *)s);
	return cudaSuccess;
}

cudaError_t check_event(const char *fn, cudaEvent_t e)
{
	if (events.count(e))
		return cudaSuccess;
	if (dead_events.count(e))
		return fail(cudaErrorInvalidResourceHandle,
		            "%s: event %p was destroyed", fn, (void *)e);
	return fail(cudaErrorInvalidResourceHandle, "%s: %p is not an event",
	            fn, (void *)e);
}

bool legacy_stream(cudaStream_t s)
{
	return !s || s == cudaStreamLegacy;
}

/* The events recorded on s are complete once s is synchronised; with all,
 * every event (cudaDeviceSynchronize, cudaFree).  Synchronising the legacy
 * stream (NULL) waits for the blocking streams too. */
void complete_events(cudaStream_t s, bool all)
{
	for (const void *p : events) {
		emu_event_state &st = *((cudaEvent_t)p)->st;
		cudaStream_t r = st.stream;
		if (all || r == s ||
		    (legacy_stream(s) &&
		     (legacy_stream(r) || r == cudaStreamPerThread ||
		      !(r->flags & cudaStreamNonBlocking))))
			st.pending = false;
	}
}

/* The handles' layout (64 bytes): a magic, the exporting process, and what
 * the handle names. */
struct ipc_bytes {
	char magic[8];
	int32_t pid;
	int32_t fd;      /* memory: the allocation's memfd in pid, or -1 */
	uint64_t base;   /* memory: the allocation */
	uint64_t serial; /* memory: the allocation's; event: the state's */
	uint64_t bytes;  /* memory: the allocation's size */
	char pad[CUDA_IPC_HANDLE_SIZE - 40];
};
static_assert(sizeof(ipc_bytes) == CUDA_IPC_HANDLE_SIZE, "IPC handle size");

const char IPC_MEM[8] = {'k', 'v', 't', 'e', 'm', 'u', 'M', 'H'};
const char IPC_EV[8] = {'k', 'v', 't', 'e', 'm', 'u', 'E', 'H'};

/* Decodes a handle (of this process or another). */
cudaError_t ipc_decode(const char *fn, const char *raw, const char *magic,
                       ipc_bytes *out)
{
	memcpy(out, raw, sizeof(*out));
	if (memcmp(out->magic, magic, sizeof(out->magic)))
		return fail(cudaErrorInvalidValue,
		            "%s: not a handle from cudaIpcGet%sHandle", fn,
		            magic == IPC_MEM ? "Mem" : "Event");
	return cudaSuccess;
}

/* The name of an allocation's memfd: an importer checks it, so that a
 * stale handle whose fd number was reused opens nothing. */
void memfd_name(char *b, size_t n, uint64_t serial)
{
	snprintf(b, n, "kvtemu-%llu", (unsigned long long)serial);
}

size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) / pg * pg;
}

/*
 * Maps the allocation of another process from its handle: opens the
 * exporter's memfd through /proc/<pid>/fd/<fd> (a new open file
 * description of the same memory) and maps it MAP_SHARED.  The importer
 * keeps the fd with a shared flock on it until cudaIpcCloseMemHandle, so
 * that the exporter's cudaFree can tell that another process still has
 * it open (legacy IPC leaves freeing that undefined; it fails here).
 */
cudaError_t ipc_import(const ipc_bytes &b, void **out)
{
	for (auto &a : allocs)
		if (a.second.imported && a.second.pid == b.pid &&
		    a.second.serial == b.serial) {
			a.second.ipc_opens++;
			*out = (void *)a.first;
			return cudaSuccess;
		}
	if (b.fd < 0)
		return fail(cudaErrorNotSupported,
		            "cudaIpcOpenMemHandle: the handle comes from "
		            "process %d, whose device memory is its heap (ASan "
		            "build): not shared between processes",
		            (int)b.pid);
	char path[64], want[64], got[128];
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)b.pid, (int)b.fd);
	memfd_name(want, sizeof(want), b.serial);
	ssize_t n = readlink(path, got, sizeof(got) - 1);
	got[n > 0 ? n : 0] = '\0';
	size_t wl = strlen(want);
	if (n <= 0 || strncmp(got, "/memfd:", 7) ||
	    strncmp(got + 7, want, wl) ||
	    (got[7 + wl] != '\0' && got[7 + wl] != ' '))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaIpcOpenMemHandle: %s is not allocation %llu of "
		            "process %d (%s): freed, or the process is gone",
		            path, (unsigned long long)b.serial, (int)b.pid,
		            n > 0 ? got : strerror(errno));
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaIpcOpenMemHandle: open %s: %s", path,
		            strerror(errno));
	struct stat st;
	size_t map = page_round((size_t)b.bytes);
	void *m = MAP_FAILED;
	if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= b.bytes &&
	    flock(fd, LOCK_SH | LOCK_NB) == 0)
		m = mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		         0);
	if (m == MAP_FAILED) {
		close(fd);
		return fail(cudaErrorMapBufferObjectFailed,
		            "cudaIpcOpenMemHandle: cannot map %s (%llu bytes): "
		            "%s",
		            path, (unsigned long long)b.bytes, strerror(errno));
	}
	alloc_rec r{(size_t)b.bytes, b.serial, 1, fd, map, true, b.pid, false,
	            false};
	allocs[(uintptr_t)m] = r;
	*out = m;
	return cudaSuccess;
}

/* True when no other process has the memfd open through an IPC handle
 * (importers hold a shared flock; ipc_import).  An importer that has just
 * exited may release its lock a moment after its socket closed, which is
 * what the exporter reacts to: so this waits up to 200 ms for it. */
bool lock_out_importers(int fd)
{
	for (int i = 0; i < 200; i++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return true;
		if (errno != EWOULDBLOCK && errno != EINTR)
			return true; /* no locks here: nothing to check */
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, nullptr);
	}
	return false;
}

} /* namespace */

std::recursive_mutex &big_lock(void)
{
	static std::recursive_mutex m;
	return m;
}

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
	size_t b = it->second.bytes;
	return a - it->first <= b && n <= b - (a - it->first);
}

bool is_stream(cudaStream_t s)
{
	return !s || s == cudaStreamLegacy || s == cudaStreamPerThread ||
	       streams.count(s);
}

void add_vmm_range(void *base, size_t bytes, bool readonly)
{
	allocs[(uintptr_t)base] =
		alloc_rec{bytes, next_serial++, 0, -1, 0, false, 0, true, readonly};
}

void drop_vmm_range(void *base)
{
	auto it = allocs.find((uintptr_t)base);
	if (it != allocs.end() && it->second.vmm)
		allocs.erase(it);
}

void add_device_bytes(long long n)
{
	alloc_bytes += (size_t)n;
}

void complete_all_events(void)
{
	complete_events(nullptr, true);
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
	EMU_API_LOCK();
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
	case cudaErrorInvalidPitchValue:
		return "invalid pitch argument";
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
	case cudaErrorMapBufferObjectFailed:
		return "mapping of buffer object failed";
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
	EMU_API_LOCK();
#define EMU_NAME(x)                                                            \
	case x:                                                                \
		return #x;
	switch (e) {
		EMU_NAME(cudaSuccess)
		EMU_NAME(cudaErrorInvalidValue)
		EMU_NAME(cudaErrorMemoryAllocation)
		EMU_NAME(cudaErrorInitializationError)
		EMU_NAME(cudaErrorInvalidConfiguration)
		EMU_NAME(cudaErrorInvalidPitchValue)
		EMU_NAME(cudaErrorInvalidDevicePointer)
		EMU_NAME(cudaErrorInvalidMemcpyDirection)
		EMU_NAME(cudaErrorInsufficientDriver)
		EMU_NAME(cudaErrorNoDevice)
		EMU_NAME(cudaErrorInvalidDevice)
		EMU_NAME(cudaErrorMapBufferObjectFailed)
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
	EMU_API_LOCK();
	cudaError_t e = last_err;
	last_err = sticky_err;
	return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void)
{
	EMU_API_LOCK();
	return last_err;
}

/* ------------------------------------------------------------- device */

extern "C" cudaError_t cudaDriverGetVersion(int *version)
{
	EMU_API_LOCK();
	if (!version)
		return fail(cudaErrorInvalidValue, "cudaDriverGetVersion: NULL");
	*version = CUDART_VERSION;
	return cudaSuccess;
}

extern "C" cudaError_t cudaRuntimeGetVersion(int *version)
{
	EMU_API_LOCK();
	if (!version)
		return fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion: NULL");
	*version = CUDART_VERSION;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGetDriverEntryPointByVersion(
	const char *symbol, void **funcPtr, unsigned int cudaVersion,
	unsigned long long flags,
	enum cudaDriverEntryPointQueryResult *driverStatus)
{
	EMU_API_LOCK();
	if (!symbol || !funcPtr)
		return fail(cudaErrorInvalidValue,
		            "cudaGetDriverEntryPointByVersion: NULL");
	*funcPtr = nullptr;
	if (cudaVersion > CUDART_VERSION)
		return fail(cudaErrorInvalidValue,
		            "cudaGetDriverEntryPointByVersion(%s): version %u "
		            "beyond the driver's %d",
		            symbol, cudaVersion, CUDART_VERSION);
	*funcPtr = driver_entry(symbol);
	if (driverStatus)
		*driverStatus = *funcPtr ? cudaDriverEntryPointSuccess
		                         : cudaDriverEntryPointSymbolNotFound;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceCount(int *n)
{
	EMU_API_LOCK();
	if (!n)
		return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: NULL");
	*n = 1;
	return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *dev)
{
	EMU_API_LOCK();
	if (!dev)
		return fail(cudaErrorInvalidValue, "cudaGetDevice: NULL");
	*dev = 0;
	return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int dev)
{
	EMU_API_LOCK();
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
	EMU_API_LOCK();
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

static void hostfn_drain(cudaStream_t s); /* host functions, below */

extern "C" cudaError_t cudaDeviceSynchronize(void)
{
	EMU_API_LOCK();
	EMU_STICKY();
	hostfn_drain(nullptr);
	complete_events(nullptr, true);
	return cudaSuccess;
}

/* As on the device, the only way out of a sticky error. */
extern "C" cudaError_t cudaDeviceReset(void)
{
	EMU_API_LOCK();
	sticky_err = last_err = cudaSuccess;
	return cudaSuccess;
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func,
                                            enum cudaFuncAttribute attr,
                                            int value)
{
	EMU_API_LOCK();
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
	EMU_API_LOCK();
	EMU_STICKY();
	if (!p)
		return fail(cudaErrorInvalidValue, "cudaMalloc: NULL");
	*p = nullptr;
	if (n == 0)
		return cudaSuccess;
	void *m = nullptr;
	uint64_t serial = next_serial++;
	int fd = -1;
	size_t map = 0;
#ifdef __SANITIZE_ADDRESS__
	if (posix_memalign(&m, 256, n))
		return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu)", n);
#else
	char name[64];
	memfd_name(name, sizeof(name), serial);
	map = page_round(n);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)n) < 0 ||
	    (m = mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
	              0)) == MAP_FAILED) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return fail(cudaErrorMemoryAllocation, "cudaMalloc(%zu): %s", n,
		            strerror(e));
	}
#endif
	memset(m, 0xff, n); /* device memory starts out as garbage */
	allocs[(uintptr_t)m] =
		alloc_rec{n, serial, 0, fd, map, false, 0, false, false};
	alloc_bytes += n;
	*p = m;
	return cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!p)
		return cudaSuccess;
	auto it = allocs.find((uintptr_t)p);
	if (it == allocs.end())
		return fail(cudaErrorInvalidValue,
		            "cudaFree(%p): not the start of a cudaMalloc "
		            "allocation",
		            p);
	if (it->second.vmm)
		return fail(cudaErrorInvalidValue,
		            "cudaFree(%p): mapped with cuMemMap (cuMemUnmap "
		            "unmaps it)",
		            p);
	if (it->second.imported)
		return fail(cudaErrorInvalidValue,
		            "cudaFree(%p): opened from process %d's IPC handle "
		            "(cudaIpcCloseMemHandle closes it)",
		            p, (int)it->second.pid);
	/* The exporter must not free what an importer still maps. */
	if (it->second.ipc_opens)
		return fail(cudaErrorInvalidValue,
		            "cudaFree(%p): still open through "
		            "cudaIpcOpenMemHandle (%d opens not closed; CUDA "
		            "leaves this undefined)",
		            p, it->second.ipc_opens);
	if (it->second.fd >= 0 && !lock_out_importers(it->second.fd))
		return fail(cudaErrorInvalidValue,
		            "cudaFree(%p): another process still has it open "
		            "through cudaIpcOpenMemHandle (CUDA leaves this "
		            "undefined)",
		            p);
	hostfn_drain(nullptr);
	complete_events(nullptr, true); /* cudaFree waits for the device */
	alloc_bytes -= it->second.bytes;
	if (it->second.fd >= 0) {
		munmap(p, it->second.map_bytes);
		close(it->second.fd);
	} else {
		free(p);
	}
	allocs.erase(it);
	return cudaSuccess;
}

extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a,
                                               const void *p)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!a)
		return fail(cudaErrorInvalidValue,
		            "cudaPointerGetAttributes: NULL");
	memset(a, 0, sizeof(*a));
	uintptr_t u = (uintptr_t)p;
	auto it = pinned.upper_bound(u);
	bool host = it != pinned.begin() &&
	            (--it, u - it->first < (it->second ? it->second : 1));
	if (p && is_device(p, 1)) {
		a->type = cudaMemoryTypeDevice;
		a->devicePointer = (void *)p;
	} else if (p && host) {
		a->type = cudaMemoryTypeHost;
		a->hostPointer = (void *)p;
	} else {
		a->type = cudaMemoryTypeUnregistered;
		a->device = -2; /* as CUDA reports an unregistered address */
		a->hostPointer = (void *)p;
	}
	return cudaSuccess;
}

extern "C" cudaError_t cudaMallocHost(void **p, size_t n)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!p)
		return fail(cudaErrorInvalidValue, "cudaMallocHost: NULL");
	*p = nullptr;
	void *m = nullptr;
	if (posix_memalign(&m, 256, n ? n : 1))
		return fail(cudaErrorMemoryAllocation, "cudaMallocHost(%zu)",
		            n);
	memset(m, 0xff, n ? n : 1);
	pinned[(uintptr_t)m] = n;
	*p = m;
	return cudaSuccess;
}

extern "C" cudaError_t cudaFreeHost(void *p)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!p)
		return cudaSuccess;
	if (!pinned.erase((uintptr_t)p))
		return fail(cudaErrorInvalidValue,
		            "cudaFreeHost(%p): not from cudaMallocHost", p);
	free(p);
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
	EMU_API_LOCK();
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
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t e = check_copy("cudaMemcpy", dst, src, n, n, kind);
	if (e == cudaSuccess && n) {
		memcpy(dst, src, n);
		count_copy(dst, src, n);
	}
	return e;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n,
                                       enum cudaMemcpyKind kind,
                                       cudaStream_t s)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t e = check_stream("cudaMemcpyAsync", s);
	if (e == cudaSuccess)
		e = check_copy("cudaMemcpyAsync", dst, src, n, n, kind);
	if (e == cudaSuccess && n) {
		memcpy(dst, src, n);
		count_copy(dst, src, n);
	}
	return e;
}

extern "C" cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src,
                                    size_t spitch, size_t width,
                                    size_t height, enum cudaMemcpyKind kind)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (width > dpitch || width > spitch)
		return fail(cudaErrorInvalidPitchValue,
		            "cudaMemcpy2D: width %zu beyond a pitch", width);
	if (!width || !height)
		return cudaSuccess;
	size_t span_d = dpitch * (height - 1) + width;
	size_t span_s = spitch * (height - 1) + width;
	cudaError_t e =
		check_copy("cudaMemcpy2D", dst, src, span_d, span_s, kind);
	if (e != cudaSuccess)
		return e;
	for (size_t r = 0; r < height; r++)
		memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch,
		       width);
	count_copy(dst, src, width * height); /* the rows, not the pitch */
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch,
                                         const void *src, size_t spitch,
                                         size_t width, size_t height,
                                         enum cudaMemcpyKind kind,
                                         cudaStream_t s)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t e = check_stream("cudaMemcpy2DAsync", s);
	if (e != cudaSuccess)
		return e;
	return cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind);
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t n)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (n && !is_device(p, n))
		return fail(cudaErrorInvalidValue,
		            "cudaMemset: %p + %zu bytes is not inside a "
		            "cudaMalloc allocation",
		            p, n);
	if (n && check_writable("cudaMemset", p, n))
		return cudaErrorIllegalAddress;
	if (n)
		memset(p, value, n);
	return cudaSuccess;
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t n,
                                       cudaStream_t s)
{
	EMU_API_LOCK();
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
	EMU_API_LOCK();
	EMU_STICKY();
	if (!s)
		return fail(cudaErrorInvalidValue, "cudaStreamCreate: NULL");
	*s = new CUstream_st{flags};
	streams.insert(*s);
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	EMU_API_LOCK();
	return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	EMU_API_LOCK();
	if (s)
		hostfn_drain(s); /* a GPU runs them before the stream goes */
	if (!s || !streams.erase(s))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaStreamDestroy(%p): not a created stream",
		            (void *)s);
	/* Its work completes; its events forget it. */
	for (const void *p : events) {
		emu_event_state &st = *((cudaEvent_t)p)->st;
		if (st.stream == s) {
			st.pending = false;
			st.stream = nullptr;
		}
	}
	delete s;
	return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t e = check_stream("cudaStreamSynchronize", s);
	if (e == cudaSuccess) {
		hostfn_drain(s);
		complete_events(s, false);
	}
	return e;
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s)
{
	EMU_API_LOCK();
	EMU_STICKY();
	return check_stream("cudaStreamQuery", s);
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                           unsigned int flags)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t r = check_event("cudaStreamWaitEvent", e);
	if (r != cudaSuccess)
		return r;
	if (flags & ~1u) /* cudaEventWaitDefault, cudaEventWaitExternal */
		return fail(cudaErrorInvalidValue,
		            "cudaStreamWaitEvent: flags %#x", flags);
	/* The stream's later work runs after the event's: all work runs when
	 * it is queued, so there is nothing to wait for. */
	return check_stream("cudaStreamWaitEvent", s);
}

/*
 * Host functions.  By default fn runs before cudaLaunchHostFunc returns.
 * With KVT_EMU_HOSTFN_DELAY_US=N it runs on a thread of its own N us
 * later, as a driver thread would once the stream got there, so callers
 * meet the "not yet" path; a synchronisation of its stream (or of the
 * device, or a cudaFree) waits for it, as on a GPU.
 */
static std::mutex hf_mu;
static std::condition_variable hf_cv;
static std::map<cudaStream_t, unsigned> hf_pending; /* by stream */

static long hostfn_delay_us(void)
{
	static long d = -1;
	if (d < 0) {
		const char *e = getenv("KVT_EMU_HOSTFN_DELAY_US");
		d = e && *e ? atol(e) : 0;
		if (d < 0)
			d = 0;
	}
	return d;
}

/* Waits for the deferred host functions of s (nullptr: of every stream). */
static void hostfn_drain(cudaStream_t s)
{
	std::unique_lock<std::mutex> lk(hf_mu);
	hf_cv.wait(lk, [s] {
		if (!s) {
			for (auto &kv : hf_pending)
				if (kv.second)
					return false;
			return true;
		}
		auto it = hf_pending.find(s);
		return it == hf_pending.end() || it->second == 0;
	});
}

extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn,
                                          void *user_data)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t r = check_stream("cudaLaunchHostFunc", s);
	if (r != cudaSuccess)
		return r;
	if (!fn)
		return fail(cudaErrorInvalidValue, "cudaLaunchHostFunc: NULL fn");
	long d = hostfn_delay_us();
	if (!d) {
		fn(user_data); /* the stream's earlier work is done */
		return cudaSuccess;
	}
	{
		std::lock_guard<std::mutex> g(hf_mu);
		hf_pending[s]++;
	}
	std::thread([s, fn, user_data, d] {
		usleep((useconds_t)d);
		fn(user_data); /* must not call the runtime, as on a GPU */
		std::lock_guard<std::mutex> g(hf_mu);
		hf_pending[s]--;
		hf_cv.notify_all();
	}).detach();
	return cudaSuccess;
}

/* ------------------------------------------------------------- events */

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e,
                                                unsigned int flags)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!e)
		return fail(cudaErrorInvalidValue, "cudaEventCreate: NULL");
	const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming |
	                       cudaEventInterprocess;
	if (flags & ~known)
		return fail(cudaErrorInvalidValue,
		            "cudaEventCreateWithFlags: flags %#x", flags);
	if ((flags & cudaEventInterprocess) &&
	    !(flags & cudaEventDisableTiming))
		return fail(cudaErrorInvalidValue,
		            "cudaEventCreateWithFlags: cudaEventInterprocess "
		            "needs cudaEventDisableTiming");
	*e = new CUevent_st{flags, std::make_shared<emu_event_state>()};
	events.insert(*e);
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	EMU_API_LOCK();
	return cudaEventCreateWithFlags(e, cudaEventDefault);
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	EMU_API_LOCK();
	cudaError_t r = check_event("cudaEventDestroy", e);
	if (r != cudaSuccess)
		return r;
	events.erase(e);
	e->st.reset(); /* events opened from its handle keep the state */
	dead_events.insert(e);
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t r = check_event("cudaEventRecord", e);
	if (r == cudaSuccess)
		r = check_stream("cudaEventRecord", s);
	if (r != cudaSuccess)
		return r;
	e->st->recorded = true;
	e->st->ms = now_ms();
	e->st->stream = s;
	e->st->tick = ++record_clock;
	e->st->lag = event_lag;
	e->st->pending = event_lag > 0;
	return cudaSuccess;
}

/* A never-recorded event is complete, as in CUDA. */
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t r = check_event("cudaEventSynchronize", e);
	if (r == cudaSuccess)
		e->st->pending = false;
	return r;
}

/* cudaErrorNotReady is an answer, not an error: cudaGetLastError does
 * not return it. */
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e)
{
	EMU_API_LOCK();
	EMU_STICKY();
	cudaError_t r = check_event("cudaEventQuery", e);
	if (r != cudaSuccess)
		return r;
	emu_event_state &st = *e->st;
	if (st.pending && record_clock - st.tick < st.lag)
		return cudaErrorNotReady;
	st.pending = false;
	return cudaSuccess;
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                            cudaEvent_t end)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!ms || !events.count(start) || !events.count(end))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventElapsedTime: not events");
	if ((start->flags | end->flags) & cudaEventDisableTiming)
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventElapsedTime: an event without timing");
	if (!start->st->recorded || !end->st->recorded)
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventElapsedTime: an event not recorded");
	*ms = (float)(end->st->ms - start->st->ms);
	return cudaSuccess;
}

namespace kvt_emu {
uint64_t launches_total;
uint64_t threads_total;

static int api_depth;          /* under the big lock */
static uint64_t api_ns_total; /* under it too; read without it */
/* Off until kvt_emu_api_ns is first called: the thread's CPU clock is a
 * system call on most hosts (no vDSO), two per entry point, and an engine
 * process that never asks (a bench's synthetic engine, every test) would
 * spend most of its time in them. */
static int api_timing;

static long long thread_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

api_timer::api_timer()
	: t0(api_depth++ || !__atomic_load_n(&api_timing, __ATOMIC_RELAXED)
	             ? -1
	             : thread_ns())
{
}

api_timer::~api_timer()
{
	api_depth--;
	if (t0 >= 0)
		__atomic_add_fetch(&api_ns_total,
		                   (uint64_t)(thread_ns() - t0),
		                   __ATOMIC_RELAXED);
}
}

/* CPU nanoseconds the process's threads spent inside the emulator's
 * entry points (internal.h, struct api_timer) since this was first called
 * (0 then): a caller measures differences between two calls. */
extern "C" uint64_t kvt_emu_api_ns(void)
{
	__atomic_store_n(&kvt_emu::api_timing, 1, __ATOMIC_RELAXED);
	return __atomic_load_n(&kvt_emu::api_ns_total, __ATOMIC_RELAXED);
}

/* Kernel launches and cuBLAS calls of the process so far. */
extern "C" uint64_t kvt_emu_launches(void)
{
	EMU_API_LOCK();
	return kvt_emu::launches_total;
}

/* Threads of the process's kernel launches so far. */
extern "C" uint64_t kvt_emu_threads(void)
{
	EMU_API_LOCK();
	return kvt_emu::threads_total;
}

extern "C" void kvt_emu_traffic(uint64_t *h2d, uint64_t *d2h)
{
	EMU_API_LOCK();
	if (h2d)
		*h2d = traffic_h2d;
	if (d2h)
		*d2h = traffic_d2h;
}

extern "C" unsigned kvt_emu_set_event_lag(unsigned n)
{
	EMU_API_LOCK();
	unsigned old = event_lag;
	event_lag = n;
	return old;
}

/* ---------------------------------------------------------- legacy IPC */

extern "C" cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle,
                                           void *devPtr)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!handle)
		return fail(cudaErrorInvalidValue, "cudaIpcGetMemHandle: NULL");
	auto it = alloc_of(devPtr);
	if (it == allocs.end())
		return fail(cudaErrorInvalidValue,
		            "cudaIpcGetMemHandle(%p): not inside a cudaMalloc "
		            "allocation",
		            devPtr);
	ipc_bytes b;
	memset(&b, 0, sizeof(b));
	memcpy(b.magic, IPC_MEM, sizeof(b.magic));
	b.pid = (int32_t)getpid();
	b.fd = it->second.fd;
	b.base = it->first;
	b.serial = it->second.serial;
	b.bytes = it->second.bytes;
	if (it->second.imported)
		return fail(cudaErrorInvalidValue,
		            "cudaIpcGetMemHandle(%p): opened from another "
		            "process's handle",
		            devPtr);
	if (it->second.vmm)
		return fail(cudaErrorInvalidValue,
		            "cudaIpcGetMemHandle(%p): a cuMemMap mapping (VMM "
		            "memory is shared through cuMemExportToShareableHandle)",
		            devPtr);
	memcpy(handle->reserved, &b, sizeof(b));
	return cudaSuccess;
}

extern "C" cudaError_t cudaIpcOpenMemHandle(void **devPtr,
                                            cudaIpcMemHandle_t handle,
                                            unsigned int flags)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!devPtr)
		return fail(cudaErrorInvalidValue, "cudaIpcOpenMemHandle: NULL");
	*devPtr = nullptr;
	if (flags != cudaIpcMemLazyEnablePeerAccess)
		return fail(cudaErrorInvalidValue,
		            "cudaIpcOpenMemHandle: flags %#x (must be "
		            "cudaIpcMemLazyEnablePeerAccess)",
		            flags);
	ipc_bytes b;
	cudaError_t r = ipc_decode("cudaIpcOpenMemHandle", handle.reserved,
	                           IPC_MEM, &b);
	if (r != cudaSuccess)
		return r;
	if (b.pid != (int32_t)getpid())
		return ipc_import(b, devPtr);
	auto it = allocs.find((uintptr_t)b.base);
	if (it == allocs.end() || it->second.imported || it->second.vmm ||
	    it->second.serial != b.serial)
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaIpcOpenMemHandle: the allocation at %#llx was "
		            "freed",
		            (unsigned long long)b.base);
	it->second.ipc_opens++;
	*devPtr = (void *)it->first;
	return cudaSuccess;
}

extern "C" cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
	EMU_API_LOCK();
	EMU_STICKY();
	auto it = allocs.find((uintptr_t)devPtr);
	if (it == allocs.end() || !it->second.ipc_opens)
		return fail(cudaErrorInvalidValue,
		            "cudaIpcCloseMemHandle(%p): not opened with "
		            "cudaIpcOpenMemHandle",
		            devPtr);
	if (--it->second.ipc_opens == 0 && it->second.imported) {
		munmap(devPtr, it->second.map_bytes);
		close(it->second.fd); /* drops the shared lock */
		allocs.erase(it);
	}
	return cudaSuccess;
}

extern "C" cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle,
                                             cudaEvent_t event)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!handle)
		return fail(cudaErrorInvalidValue, "cudaIpcGetEventHandle: NULL");
	cudaError_t r = check_event("cudaIpcGetEventHandle", event);
	if (r != cudaSuccess)
		return r;
	if (!(event->flags & cudaEventInterprocess))
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaIpcGetEventHandle(%p): not created with "
		            "cudaEventInterprocess",
		            (void *)event);
	if (!event->st->ipc) {
		event->st->ipc = next_serial++;
		ipc_events[event->st->ipc] = event->st;
	}
	ipc_bytes b;
	memset(&b, 0, sizeof(b));
	memcpy(b.magic, IPC_EV, sizeof(b.magic));
	b.pid = (int32_t)getpid();
	b.serial = event->st->ipc;
	memcpy(handle->reserved, &b, sizeof(b));
	return cudaSuccess;
}

extern "C" cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event,
                                              cudaIpcEventHandle_t handle)
{
	EMU_API_LOCK();
	EMU_STICKY();
	if (!event)
		return fail(cudaErrorInvalidValue, "cudaIpcOpenEventHandle: NULL");
	ipc_bytes b;
	cudaError_t r = ipc_decode("cudaIpcOpenEventHandle", handle.reserved,
	                           IPC_EV, &b);
	if (r != cudaSuccess)
		return r;
	if (b.pid != (int32_t)getpid()) {
		/* Another process's event: its records happen there, and all
		 * work there has run when it is recorded, so this one is a
		 * new event that is always complete (never recorded here). */
		*event = new CUevent_st{
			cudaEventInterprocess | cudaEventDisableTiming,
			std::make_shared<emu_event_state>()};
		events.insert(*event);
		return cudaSuccess;
	}
	auto it = ipc_events.find(b.serial);
	std::shared_ptr<emu_event_state> st;
	if (it != ipc_events.end())
		st = it->second.lock();
	if (!st) {
		if (it != ipc_events.end())
			ipc_events.erase(it);
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaIpcOpenEventHandle: its event was destroyed");
	}
	*event = new CUevent_st{cudaEventInterprocess | cudaEventDisableTiming,
	                        st};
	events.insert(*event);
	return cudaSuccess;
}
