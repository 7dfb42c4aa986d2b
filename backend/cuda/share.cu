/*
 * share.cu — the cuda backend's chunks, the memory the daemon shares with
 * its clients: in vmm mode a cuMemCreate allocation exported as a POSIX fd
 * and mapped (reserve, map, set access) on both sides; in ipc mode a
 * cudaMalloc block and its cudaIpcMemHandle_t.  See backend_cuda.cuh and
 * the sharing modes in backend_cuda.cu.
 */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "backend_cuda.cuh"

#define BC_KIND_VMM 1u
#define BC_KIND_IPC 2u
#define BC_IPC_ALIGN 65536u /* ipc-mode chunks: whole 64 KiB blocks */

static void bc_chunk_clear(struct kvt_backend_chunk *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

/* Reserves an address range, maps h there for this device, read-write or
 * (readonly) read-only: the access flags belong to this process's mapping,
 * so the exporter's own mapping stays writable. */
static int bc_vmm_map(struct bc_ctx *c, CUmemGenericAllocationHandle h,
                      uint64_t bytes, int readonly, CUdeviceptr *out)
{
	CUdeviceptr p = 0;
	int rv;
	CUmemAccessDesc acc;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = c->device;
	acc.flags = readonly ? CU_MEM_ACCESS_FLAGS_PROT_READ
	                     : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	BC_CU(bc_drv.reserve(&p, bytes, c->gran, 0, 0), "cuMemAddressReserve");
	if ((rv = bc_cu(bc_drv.map(p, bytes, 0, h, 0), "cuMemMap"))) {
		bc_drv.addressFree(p, bytes);
		return rv;
	}
	if ((rv = bc_cu(bc_drv.setAccess(p, bytes, &acc, 1), "cuMemSetAccess"))) {
		bc_drv.unmap(p, bytes);
		bc_drv.addressFree(p, bytes);
		return rv;
	}
	*out = p;
	return 0;
}

int bc_chunk_new(void *ctx, uint64_t bytes,
                 struct kvt_backend_chunk *out)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	int rv;
	bc_chunk_clear(out);
	if (bytes == 0)
		return KVT_EINVAL;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	if (c->share == KVT_BACKEND_SHARE_VMM) {
		CUmemGenericAllocationHandle h;
		CUdeviceptr p;
		int fd = -1;
		if (bytes % c->gran) {
			bc_note("chunk size %llu is not a multiple of the VMM "
			        "granularity %zu", (unsigned long long)bytes,
			        c->gran);
			return KVT_EINVAL;
		}
		BC_CU(bc_drv.create(&h, bytes, &c->prop, 0), "cuMemCreate");
		rv = bc_cu(bc_drv.exportHandle(&fd, h,
		                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		                            0),
		           "cuMemExportToShareableHandle");
		if (!rv)
			rv = bc_vmm_map(c, h, bytes, 0, &p);
		/* The mapping and the fd hold the allocation from here on. */
		bc_drv.release(h);
		if (rv) {
			if (fd >= 0)
				close(fd);
			return rv;
		}
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		out->fd = fd;
		out->base = (void *)(uintptr_t)p;
		out->priv[0] = BC_KIND_VMM;
	} else {
		void *p = NULL;
		cudaIpcMemHandle_t ih;
		if (bytes % BC_IPC_ALIGN) {
			bc_note("chunk size %llu is not a multiple of %u",
			        (unsigned long long)bytes, BC_IPC_ALIGN);
			return KVT_EINVAL;
		}
		BC_CALL(cudaMalloc(&p, bytes), "cudaMalloc");
		if ((rv = bc_cuda(cudaIpcGetMemHandle(&ih, p),
		                  "cudaIpcGetMemHandle"))) {
			cudaFree(p);
			return rv;
		}
		static_assert(sizeof(ih) == KVT_BACKEND_IPC_BYTES,
		              "cudaIpcMemHandle_t size");
		memcpy(out->ipc, &ih, sizeof(ih));
		out->base = p;
		out->priv[0] = BC_KIND_IPC;
	}
	out->bytes = bytes;
	rv = bc_cuda(cudaMemsetAsync(out->base, 0, bytes, c->stream),
	             "cudaMemsetAsync");
	if (!rv)
		rv = bc_cuda(cudaStreamSynchronize(c->stream),
		             "zeroing a chunk");
	if (rv) {
		struct kvt_backend_chunk tmp = *out;
		bc_chunk_clear(out);
		/* free without clobbering the error text */
		char keep[sizeof(bc_err)];
		memcpy(keep, bc_err, sizeof(keep));
		if (tmp.priv[0] == BC_KIND_VMM) {
			bc_drv.unmap((CUdeviceptr)(uintptr_t)tmp.base, tmp.bytes);
			bc_drv.addressFree((CUdeviceptr)(uintptr_t)tmp.base, tmp.bytes);
			close(tmp.fd);
		} else {
			cudaFree(tmp.base);
		}
		memcpy(bc_err, keep, sizeof(keep));
	}
	return rv;
}

void bc_chunk_free(void *ctx, struct kvt_backend_chunk *ch)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!ch->base) {
		bc_chunk_clear(ch);
		return;
	}
	cudaSetDevice(c->device);
	if (ch->priv[0] == BC_KIND_VMM) {
		/* No kernel of this process may still touch the range. */
		cudaDeviceSynchronize();
		CUdeviceptr p = (CUdeviceptr)(uintptr_t)ch->base;
		bc_drv.unmap(p, ch->bytes);
		bc_drv.addressFree(p, ch->bytes);
		if (ch->fd >= 0)
			close(ch->fd);
	} else if (cudaFree(ch->base) != cudaSuccess) { /* synchronises */
		/* (a chunk another process still has open, which CUDA leaves
		 * undefined): the error is this call's, and must not stay as
		 * the thread's last error, where the next op's
		 * cudaGetLastError would take it for its own launch's */
		(void)cudaGetLastError();
	}
	bc_chunk_clear(ch);
}

/* chunk_import and chunk_import_ro: readonly asks for a read-only
 * mapping, which only vmm mode can give (cudaIpcOpenMemHandle has no
 * access flags). */
static int bc_import(void *ctx, int fd,
                     const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
                     uint64_t bytes, int readonly,
                     struct kvt_backend_chunk *out)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	bc_chunk_clear(out);
	if (bytes == 0)
		return KVT_EINVAL;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	if (fd >= 0) {
		CUmemGenericAllocationHandle h;
		CUdeviceptr p;
		int rv;
		if (!bc_drv.loaded) { /* ctx_new fell back to ipc mode */
			bc_note("a VMM chunk (fd) cannot be imported: the "
			        "driver lacks the cuMem* entry points");
			return KVT_ENOTSUP;
		}
		if (!c->gran || bytes % c->gran) {
			size_t g = 0;
			CUmemAllocationProp pr = c->prop;
			if (bc_drv.granularity(&g, &pr,
			                    CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
			    !g || bytes % g) {
				bc_note("imported chunk size %llu does not fit the "
				        "VMM granularity", (unsigned long long)bytes);
				return KVT_EINVAL;
			}
			c->gran = g;
		}
		BC_CU(bc_drv.importHandle(&h, (void *)(uintptr_t)fd,
		                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		      "cuMemImportFromShareableHandle");
		rv = bc_vmm_map(c, h, bytes, readonly, &p);
		bc_drv.release(h); /* the mapping keeps the memory */
		if (rv)
			return rv;
		out->base = (void *)(uintptr_t)p;
		out->priv[0] = BC_KIND_VMM;
	} else {
		cudaIpcMemHandle_t ih;
		void *p = NULL;
		if (!ipc)
			return KVT_EINVAL;
		memcpy(&ih, ipc, sizeof(ih));
		BC_CALL(cudaIpcOpenMemHandle(&p, ih,
		                             cudaIpcMemLazyEnablePeerAccess),
		        "cudaIpcOpenMemHandle");
		out->base = p;
		out->priv[0] = BC_KIND_IPC;
	}
	out->bytes = bytes;
	return 0;
}

int bc_chunk_import(void *ctx, int fd,
                    const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
                    uint64_t bytes, struct kvt_backend_chunk *out)
{
	return bc_import(ctx, fd, ipc, bytes, 0, out);
}

int bc_chunk_import_ro(void *ctx, int fd,
                       const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
                       uint64_t bytes, struct kvt_backend_chunk *out,
                       int *readonly)
{
	int rv = bc_import(ctx, fd, ipc, bytes, 1, out);
	if (readonly)
		*readonly = !rv && fd >= 0;
	return rv;
}

void bc_chunk_unmap(void *ctx, struct kvt_backend_chunk *ch)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (ch->base) {
		cudaSetDevice(c->device);
		cudaDeviceSynchronize();
		if (ch->priv[0] == BC_KIND_VMM) {
			CUdeviceptr p = (CUdeviceptr)(uintptr_t)ch->base;
			bc_drv.unmap(p, ch->bytes);
			bc_drv.addressFree(p, ch->bytes);
		} else {
			cudaIpcCloseMemHandle(ch->base);
		}
	}
	bc_chunk_clear(ch);
}
