/*
 * internal.h — what the three parts of the CUDA emulator share (fiber.cc:
 * launches and barriers; runtime.cc: memory, streams, errors; cublas.cc).
 * Not seen by kernels or tests.
 */
#ifndef KVT_EMU_INTERNAL_H
#define KVT_EMU_INTERNAL_H

#include <stddef.h>

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

/* 1 when [p, p + n) lies inside one cudaMalloc allocation. */
bool is_device(const void *p, size_t n);
bool is_stream(cudaStream_t s);

/* cudaFuncSetAttribute(MaxDynamicSharedMemorySize) of a kernel, or -1. */
int func_max_dyn_smem(const void *func);

/* The emulated device (an H200). */
enum {
	DEV_SMS = 132,
	DEV_MAX_THREADS = 1024,
	DEV_SMEM_DEFAULT = 48 * 1024,
	DEV_SMEM_OPTIN = 227 * 1024,
};

} /* namespace kvt_emu */

#endif
