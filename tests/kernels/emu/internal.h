/*
 * internal.h — what the three parts of the CUDA emulator share (fiber.cc:
 * launches and barriers; runtime.cc: memory, streams, errors; cublas.cc).
 * Not seen by kernels or tests.
 */
#ifndef KVT_EMU_INTERNAL_H
#define KVT_EMU_INTERNAL_H

#include <stddef.h>

#include <mutex>

#include "include/cuda_runtime_api.h"

namespace kvt_emu {

/* Prints "cuda emulator: ..." on stderr (every error the emulator returns
 * is explained there, since a bare code rarely says which pointer). */
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The error cudaGetLastError returns next.  Sticky errors (a fault found
 * in a kernel) are returned by every later call until cudaDeviceReset, as
 * after a device fault. */
void set_error(cudaError_t e, bool sticky);
cudaError_t sticky_error(void);

/* The emulator's state (allocations, streams, events, the fibers of a
 * launch) belongs to whoever holds this lock: every runtime and cuBLAS
 * entry point and every launch takes it, so host threads of one process
 * (kvtrim-eval's engine threads) take turns.  Work still runs
 * synchronously on the calling thread; __shared__ is that thread's. */
std::recursive_mutex &big_lock(void);

/* The CPU time of the calling thread spent inside the emulator's entry
 * points, outermost calls only (kvt_emu_api_ns): what a GPU would have
 * done, as opposed to what its host does around it, so that a benchmark
 * can tell the daemon's own CPU from the emulated device's.  Taken on the
 * thread's CPU clock once the big lock is held (its nesting depth is
 * the lock holder's, no thread-local: the library's TLS block is
 * __shared__'s, fiber.cc). */
struct api_timer {
	api_timer();
	~api_timer();
	api_timer(const api_timer &) = delete;
	api_timer &operator=(const api_timer &) = delete;
	long long t0; /* -1: an inner call */
};
#define EMU_API_LOCK()                                                         \
	std::lock_guard<std::recursive_mutex> emu_api_guard_(                  \
		kvt_emu::big_lock());                                          \
	kvt_emu::api_timer emu_api_timer_

/* 1 when [p, p + n) lies inside one cudaMalloc allocation (or one
 * accessible cuMemMap mapping, driver.cc). */
bool is_device(const void *p, size_t n);

/* driver.cc: a VMM mapping made accessible (cuMemSetAccess) is recorded as
 * device memory, so that copies, memsets and cuBLAS accept it; cudaFree
 * and cudaIpcGetMemHandle refuse it.  A read-only one (PROT_READ) is
 * recorded so: a copy or memset into it fails with the sticky
 * cudaErrorIllegalAddress of a device fault.  Dropped again at cuMemUnmap
 * or when access goes back to none.  add_device_bytes counts cuMemCreate's
 * allocations in cudaMemGetInfo (negative when one is gone). */
void add_vmm_range(void *base, size_t bytes, bool readonly);
void drop_vmm_range(void *base);
void add_device_bytes(long long n);
/* driver.cc: the emulated driver entry point named symbol, or NULL (not
 * emulated, or hidden by kvt_emu_set_driver). */
void *driver_entry(const char *symbol);
/* Completes every queued event, as a device-wide synchronisation does. */
void complete_all_events(void);
bool is_stream(cudaStream_t s);

/* cudaFuncSetAttribute(MaxDynamicSharedMemorySize) of a kernel, or -1. */
int func_max_dyn_smem(const void *func);

/* Kernel launches and cuBLAS calls so far (kvt_emu_launches): the
 * emulator's own count, against which the backend's (traffic) is checked.
 * Incremented under the big lock. */
extern uint64_t launches_total;
/* Threads of the kernel launches that ran (grid x block each;
 * kvt_emu_threads), under the big lock too. */
extern uint64_t threads_total;

/* The emulated device (an H200). */
enum {
	DEV_SMS = 132,
	DEV_MAX_THREADS = 1024,
	DEV_SMEM_DEFAULT = 48 * 1024,
	DEV_SMEM_OPTIN = 227 * 1024,
};

} /* namespace kvt_emu */

#endif
