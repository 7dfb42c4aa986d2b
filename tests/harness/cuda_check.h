/*
 * cuda_check.h — CK(expr): fails the test with the CUDA error text when a
 * runtime call does not return cudaSuccess.  For the CUDA tests, on a GPU
 * or on the CPU emulator (tests/kernels/); include after the CUDA runtime
 * header and test.h.
 */
#ifndef KVT_CUDA_CHECK_H
#define KVT_CUDA_CHECK_H

#define CK(x)                                                                  \
	do {                                                                   \
		cudaError_t e_ = (x);                                          \
		if (e_ != cudaSuccess)                                         \
			th_fail(__FILE__, __LINE__, "%s: %s", #x,              \
			        cudaGetErrorString(e_));                       \
	} while (0)

#endif
