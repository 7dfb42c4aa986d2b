/*
 * cudaTypedefs.h — stand-in for the toolkit's typedefs of driver entry
 * points, in the CPU emulation (tests/kernels/emu/, docs/cuda.md): the
 * PFN_* types that backend/cuda/ casts the results of
 * cudaGetDriverEntryPointByVersion to, with the toolkit's signatures.  The
 * emulator's cudaGetDriverEntryPointByVersion returns its own functions of
 * these types (tests/kernels/emu/driver.cc).
 */
#ifndef KVT_EMU_CUDA_TYPEDEFS_H
#define KVT_EMU_CUDA_TYPEDEFS_H

#include "cuda.h"

typedef CUresult(CUDAAPI *PFN_cuGetErrorString_v6000)(CUresult error,
                                                      const char **pStr);
typedef CUresult(CUDAAPI *PFN_cuDeviceGet_v2000)(CUdevice_v1 *device,
                                                 int ordinal);
typedef CUresult(CUDAAPI *PFN_cuDeviceGetAttribute_v2000)(
	int *pi, CUdevice_attribute attrib, CUdevice_v1 dev);
typedef CUresult(CUDAAPI *PFN_cuMemAddressReserve_v10020)(
	CUdeviceptr_v2 *ptr, size_t size, size_t alignment, CUdeviceptr_v2 addr,
	unsigned long long flags);
typedef CUresult(CUDAAPI *PFN_cuMemAddressFree_v10020)(CUdeviceptr_v2 ptr,
                                                       size_t size);
typedef CUresult(CUDAAPI *PFN_cuMemCreate_v10020)(
	CUmemGenericAllocationHandle_v1 *handle, size_t size,
	const CUmemAllocationProp_v1 *prop, unsigned long long flags);
typedef CUresult(CUDAAPI *PFN_cuMemRelease_v10020)(
	CUmemGenericAllocationHandle_v1 handle);
typedef CUresult(CUDAAPI *PFN_cuMemMap_v10020)(
	CUdeviceptr_v2 ptr, size_t size, size_t offset,
	CUmemGenericAllocationHandle_v1 handle, unsigned long long flags);
typedef CUresult(CUDAAPI *PFN_cuMemUnmap_v10020)(CUdeviceptr_v2 ptr,
                                                 size_t size);
typedef CUresult(CUDAAPI *PFN_cuMemSetAccess_v10020)(
	CUdeviceptr_v2 ptr, size_t size, const CUmemAccessDesc_v1 *desc,
	size_t count);
typedef CUresult(CUDAAPI *PFN_cuMemExportToShareableHandle_v10020)(
	void *shareableHandle, CUmemGenericAllocationHandle_v1 handle,
	CUmemAllocationHandleType handleType, unsigned long long flags);
typedef CUresult(CUDAAPI *PFN_cuMemImportFromShareableHandle_v10020)(
	CUmemGenericAllocationHandle_v1 *handle, void *osHandle,
	CUmemAllocationHandleType shHandleType);
typedef CUresult(CUDAAPI *PFN_cuMemGetAllocationGranularity_v10020)(
	size_t *granularity, const CUmemAllocationProp_v1 *prop,
	CUmemAllocationGranularity_flags option);

#endif
