/*
 * driver.cu — the driver API of the cuda backend: the cuMem* entry points
 * that vmm mode needs, looked up once through
 * cudaGetDriverEntryPointByVersion (so no file of libkvtrim-cuda.so links
 * libcuda), and the mapping of their results to KVT_E* codes.  See
 * backend_cuda.cuh.
 */
#include <string.h>

#include "backend_cuda.cuh"

struct bc_drv bc_drv;

int bc_cu(CUresult r, const char *what)
{
	if (r == CUDA_SUCCESS)
		return 0;
	const char *s = NULL;
	if (bc_drv.getErrorString)
		bc_drv.getErrorString(r, &s);
	bc_note("%s: %s", what, s ? s : "CUDA driver error");
	switch (r) {
	case CUDA_ERROR_INVALID_VALUE:
		return KVT_EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED:
	case CUDA_ERROR_NO_DEVICE:
		return KVT_ENOTSUP;
	default:
		return KVT_ESYS;
	}
}

/* The ABI of each entry point as of CUDA 12.0 (all unchanged since 10.2). */
static int bc_sym(const char *sym, void **fn)
{
	cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	*fn = NULL;
	cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fn, 12000,
	                                                 cudaEnableDefault, &q);
	if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn) {
		(void)cudaGetLastError();
		bc_note("driver entry point %s unavailable", sym);
		return KVT_ENOTSUP;
	}
	return 0;
}

int bc_drv_load(void)
{
	int rv;
	if (bc_drv.loaded)
		return 0;
#define BC_SYM(field, name)                                                    \
	do {                                                                   \
		void *fn_;                                                     \
		if ((rv = bc_sym(name, &fn_)))                                 \
			return rv;                                             \
		memcpy(&bc_drv.field, &fn_, sizeof(fn_));                         \
	} while (0)
	BC_SYM(getErrorString, "cuGetErrorString");
	BC_SYM(deviceGet, "cuDeviceGet");
	BC_SYM(deviceGetAttribute, "cuDeviceGetAttribute");
	BC_SYM(granularity, "cuMemGetAllocationGranularity");
	BC_SYM(create, "cuMemCreate");
	BC_SYM(release, "cuMemRelease");
	BC_SYM(exportHandle, "cuMemExportToShareableHandle");
	BC_SYM(importHandle, "cuMemImportFromShareableHandle");
	BC_SYM(reserve, "cuMemAddressReserve");
	BC_SYM(addressFree, "cuMemAddressFree");
	BC_SYM(map, "cuMemMap");
	BC_SYM(unmap, "cuMemUnmap");
	BC_SYM(setAccess, "cuMemSetAccess");
#undef BC_SYM
	bc_drv.loaded = 1;
	return 0;
}
