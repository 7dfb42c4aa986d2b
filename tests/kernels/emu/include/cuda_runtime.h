/*
 * cuda_runtime.h — stand-in for the toolkit's header in the CPU emulation
 * of the kernels (tests/kernels/emu/, docs/cuda.md): the runtime API, and
 * for C++ the device language of tests/kernels/emu/emu.h (__global__,
 * threadIdx, __syncthreads, warp intrinsics, KVT_EMU_LAUNCH), as the real
 * header gives nvcc's device code.
 */
#ifndef KVT_EMU_CUDA_RUNTIME_H
#define KVT_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "../emu.h"
#endif

#endif
