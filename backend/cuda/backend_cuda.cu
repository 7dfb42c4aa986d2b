/*
 * backend_cuda.cu — the cuda backend of backend/backend.h, the one symbol
 * libkvtrim-cuda.so exports (kvt_cuda_backend_v1).  kvtrimd loads it with
 * dlopen, so only this library links the CUDA runtime and cuBLAS; the
 * driver API (cuMem*) is reached through cudaGetDriverEntryPointByVersion,
 * so not even this library links libcuda: a machine without a driver loads
 * it fine and probe() says what is missing.
 *
 * Sharing modes, chosen per context (ctx_new):
 *   vmm  cuMemCreate(POSIX_FILE_DESCRIPTOR) + cuMemExportToShareableHandle:
 *        the fd goes over the handle channel like a memfd; the client
 *        imports, reserves, maps and sets access.  The driver reference
 *        counts the allocation (fd, mappings), so a dead client never
 *        leaves the daemon with memory freed under a mapping.
 *   ipc  cudaMalloc + cudaIpcGetMemHandle where the device or driver
 *        cannot export VMM memory, or the driver lacks the cuMem* entry
 *        points (or KVTRIM_CUDA_SHARE=ipc): 64 handle bytes instead of an
 *        fd; the daemon must not free a chunk before its client closed it
 *        (DESIGN.md: chunks are revoked first).
 *
 * Threads: a context is used from one thread at a time.
 *
 * The CPU emulator (tests/kernels/emu/, docs/cuda.md) compiles this file
 * with g++ too, and emulates the driver's VMM entry points, so both modes
 * run there (`make test`).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "common.cuh"
#include "compact.cuh"

/* The emulator fills its own thread-local block before every thread block
 * it runs (its __shared__ variables live there) and lets one host thread
 * at a time in, so there the text is a plain static. */
#ifdef KVT_CUDA_EMU
static char bc_err[256];
#else
static __thread char bc_err[256];
#endif

static void bc_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void bc_note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(bc_err, sizeof(bc_err), fmt, ap);
	va_end(ap);
}

static int bc_cuda(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	bc_note("%s: %s", what, cudaGetErrorString(e));
	(void)cudaGetLastError(); /* clears a non-sticky error */
	return common_err(e);
}

#define BC_CALL(expr, what)                                                    \
	do {                                                                   \
		int rv_ = bc_cuda((expr), (what));                             \
		if (rv_)                                                       \
			return rv_;                                            \
	} while (0)

/* ---------------------------------------------------------- driver API */

static struct {
	int loaded;
	PFN_cuGetErrorString_v6000 getErrorString;
	PFN_cuDeviceGet_v2000 deviceGet;
	PFN_cuDeviceGetAttribute_v2000 deviceGetAttribute;
	PFN_cuMemGetAllocationGranularity_v10020 granularity;
	PFN_cuMemCreate_v10020 create;
	PFN_cuMemRelease_v10020 release;
	PFN_cuMemExportToShareableHandle_v10020 exportHandle;
	PFN_cuMemImportFromShareableHandle_v10020 importHandle;
	PFN_cuMemAddressReserve_v10020 reserve;
	PFN_cuMemAddressFree_v10020 addressFree;
	PFN_cuMemMap_v10020 map;
	PFN_cuMemUnmap_v10020 unmap;
	PFN_cuMemSetAccess_v10020 setAccess;
} drv;

static int bc_cu(CUresult r, const char *what)
{
	if (r == CUDA_SUCCESS)
		return 0;
	const char *s = NULL;
	if (drv.getErrorString)
		drv.getErrorString(r, &s);
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

#define BC_CU(expr, what)                                                      \
	do {                                                                   \
		int rv_ = bc_cu((expr), (what));                               \
		if (rv_)                                                       \
			return rv_;                                            \
	} while (0)

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

static int bc_drv_load(void)
{
	int rv;
	if (drv.loaded)
		return 0;
#define BC_SYM(field, name)                                                    \
	do {                                                                   \
		void *fn_;                                                     \
		if ((rv = bc_sym(name, &fn_)))                                 \
			return rv;                                             \
		memcpy(&drv.field, &fn_, sizeof(fn_));                         \
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
	drv.loaded = 1;
	return 0;
}

/* ------------------------------------------------------------- context */

/* A pinned host buffer copied to a device buffer of the same size for one
 * launch: host -> device in one copy, whatever the number of items. */
struct bc_stage {
	char *h, *d;
	size_t cap;
	cudaEvent_t copied, used; /* after the H2D copy; after the kernels */
	int staged;               /* events recorded at least once */
};

#define BC_STAGES 8

struct bc_ctx {
	int device;
	enum kvt_backend_share share;
	size_t gran;           /* VMM granularity (vmm mode) */
	CUmemAllocationProp prop;
	cudaStream_t stream;   /* zeroing of new chunks */
	/* Staging slots shared by compact and upload_regions (pages and
	 * moves; descriptors and bytes), used round robin so that one
	 * tenant's sync never waits for another tenant's queued GPU work
	 * (bc_stage_take). */
	struct bc_stage st[BC_STAGES];
	uint32_t st_next;
	/* read_regions: source addresses, then the gathered bytes */
	char *d_gather;
	size_t gather_cap;
	/* Guards st[], st_next and d_gather: the daemon calls compact,
	 * upload_regions and read_regions from several threads at once
	 * (syncs on worker threads); the rest of the ops use no shared
	 * state of the context. */
	pthread_mutex_t lock;
};

static void bc_fill(char *err, size_t errlen, const char *msg)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", msg);
}

static int bc_probe(char *err, size_t errlen)
{
	bc_fill(err, errlen, "");
#ifndef KVT_CUDA_EMU /* the emulator is its own driver */
	/* cudart would load the driver library itself; asking first turns
	 * "insufficient driver" into the reason an operator can act on. */
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		bc_fill(err, errlen, "libcuda.so.1 not found (no NVIDIA driver)");
		return KVT_ENOTSUP;
	}
	/* kept loaded: the runtime uses it from here on */
#endif
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0)) {
		(void)cudaGetLastError();
		bc_fill(err, errlen, "no CUDA device");
		return KVT_ENOTSUP;
	}
	if (e == cudaErrorInsufficientDriver) {
		int dv = 0;
		char msg[160];
		(void)cudaGetLastError();
		cudaDriverGetVersion(&dv);
		snprintf(msg, sizeof(msg),
		         "NVIDIA driver supports CUDA %d.%d, this build needs "
		         "%d.%d",
		         dv / 1000, dv % 1000 / 10, CUDART_VERSION / 1000,
		         CUDART_VERSION % 1000 / 10);
		bc_fill(err, errlen, msg);
		return KVT_ENOTSUP;
	}
	if (e != cudaSuccess) {
		char msg[160];
		(void)cudaGetLastError();
		snprintf(msg, sizeof(msg), "cudaGetDeviceCount: %s",
		         cudaGetErrorString(e));
		bc_fill(err, errlen, msg);
		return KVT_ENOTSUP;
	}
	return 0;
}

static int bc_device_count(int *out)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		*out = 0;
		return e == cudaErrorNoDevice ? 0 : bc_cuda(e, "cudaGetDeviceCount");
	}
	*out = n;
	return 0;
}

/* 1 when a granularity-sized VMM allocation can be created and exported
 * as an fd here (devices may claim support that a container or driver
 * setting then refuses). */
static int bc_vmm_works(struct bc_ctx *c)
{
	CUmemGenericAllocationHandle h;
	int fd = -1;
	if (bc_cu(drv.create(&h, c->gran, &c->prop, 0), "cuMemCreate"))
		return 0;
	int ok = bc_cu(drv.exportHandle(&fd, h,
	                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
	                                0),
	               "cuMemExportToShareableHandle") == 0;
	if (fd >= 0)
		close(fd);
	drv.release(h);
	return ok;
}

/* Sets *ok to 1 when device can share VMM memory as POSIX fds (attributes,
 * granularity dividing the chunk size, and a trial export), and fills
 * c->prop and c->gran for it.  Needs the driver entry points. */
static int bc_vmm_probe(struct bc_ctx *c, int device, int *ok)
{
	CUdevice dev;
	int vmm = 0, fdok = 0;
	*ok = 0;
	BC_CU(drv.deviceGet(&dev, device), "cuDeviceGet");
	drv.deviceGetAttribute(
		&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
	drv.deviceGetAttribute(
		&fdok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
		dev);
	memset(&c->prop, 0, sizeof(c->prop));
	c->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	c->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	c->prop.location.id = dev;
	c->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	c->gran = 0;
	if (vmm && fdok &&
	    drv.granularity(&c->gran, &c->prop,
	                    CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
		c->gran = 0;
	*ok = vmm && fdok && c->gran && KVT_CHUNK_BYTES % c->gran == 0 &&
	      bc_vmm_works(c);
	return 0;
}

static void bc_ctx_free(void *ctx);

static int bc_stage_init(struct bc_stage *st)
{
	BC_CALL(cudaEventCreateWithFlags(&st->copied, cudaEventDisableTiming),
	        "cudaEventCreate");
	BC_CALL(cudaEventCreateWithFlags(&st->used, cudaEventDisableTiming),
	        "cudaEventCreate");
	return 0;
}

static int bc_stages_init(struct bc_ctx *c)
{
	for (int i = 0; i < BC_STAGES; i++) {
		int rv = bc_stage_init(&c->st[i]);
		if (rv)
			return rv;
	}
	return 0;
}

static void bc_stage_fini(struct bc_stage *st)
{
	if (st->staged)
		cudaEventSynchronize(st->used);
	if (st->h)
		cudaFreeHost(st->h);
	if (st->d)
		cudaFree(st->d);
	if (st->copied)
		cudaEventDestroy(st->copied);
	if (st->used)
		cudaEventDestroy(st->used);
	memset(st, 0, sizeof(*st));
}

static int bc_ctx_new(int device, void **ctxp, const char **mode, char *err,
                      size_t errlen)
{
	int rv;
	bc_fill(err, errlen, "");
	struct bc_ctx *c = (struct bc_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return KVT_ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	c->device = device;
	if ((rv = bc_cuda(cudaSetDevice(device), "cudaSetDevice")) ||
	    (rv = bc_cuda(cudaFree(0), "CUDA context")) ||
	    (rv = bc_cuda(cudaStreamCreateWithFlags(&c->stream,
	                                            cudaStreamNonBlocking),
	                  "cudaStreamCreate")) ||
	    (rv = bc_stages_init(c)))
		goto fail;

	{
		const char *force = getenv("KVTRIM_CUDA_SHARE");
		int can_vmm = 0;
		bc_err[0] = '\0';
		/* A driver without the cuMem* entry points cannot do VMM, but
		 * legacy IPC needs only the runtime: fall back to it, as for a device
		 * without VMM.  bc_err then names the missing entry point,
		 * which KVTRIM_CUDA_SHARE=vmm reports below. */
		if (bc_drv_load() == 0 &&
		    (rv = bc_vmm_probe(c, device, &can_vmm)))
			goto fail;
		if (force && !strcmp(force, "vmm") && !can_vmm) {
			char msg[sizeof(bc_err) + 96];
			snprintf(msg, sizeof(msg),
			         "KVTRIM_CUDA_SHARE=vmm but device %d cannot "
			         "export VMM memory as an fd (%s)",
			         device, bc_err[0] ? bc_err : "unsupported");
			bc_fill(err, errlen, msg);
			rv = KVT_ENOTSUP;
			goto fail;
		}
		c->share = can_vmm && !(force && !strcmp(force, "ipc"))
		                   ? KVT_BACKEND_SHARE_VMM
		                   : KVT_BACKEND_SHARE_IPC;
	}
	if (mode)
		*mode = c->share == KVT_BACKEND_SHARE_VMM ? "vmm" : "ipc";
	*ctxp = c;
	return 0;
fail:
	if (err && errlen && !err[0])
		bc_fill(err, errlen, bc_err);
	bc_ctx_free(c);
	return rv;
}

static void bc_ctx_free(void *ctx)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!c)
		return;
	cudaSetDevice(c->device);
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	for (int i = 0; i < BC_STAGES; i++)
		bc_stage_fini(&c->st[i]);
	if (c->d_gather)
		cudaFree(c->d_gather);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static enum kvt_backend_share bc_share(void *ctx)
{
	return ((struct bc_ctx *)ctx)->share;
}

/* -------------------------------------------------------------- chunks */

#define BC_KIND_VMM 1u
#define BC_KIND_IPC 2u
#define BC_IPC_ALIGN 65536u /* ipc-mode chunks: whole 64 KiB blocks */

static void bc_chunk_clear(struct kvt_backend_chunk *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

/* Reserves an address range, maps h there read-write for this device. */
static int bc_vmm_map(struct bc_ctx *c, CUmemGenericAllocationHandle h,
                      uint64_t bytes, CUdeviceptr *out)
{
	CUdeviceptr p = 0;
	int rv;
	CUmemAccessDesc acc;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = c->device;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	BC_CU(drv.reserve(&p, bytes, c->gran, 0, 0), "cuMemAddressReserve");
	if ((rv = bc_cu(drv.map(p, bytes, 0, h, 0), "cuMemMap"))) {
		drv.addressFree(p, bytes);
		return rv;
	}
	if ((rv = bc_cu(drv.setAccess(p, bytes, &acc, 1), "cuMemSetAccess"))) {
		drv.unmap(p, bytes);
		drv.addressFree(p, bytes);
		return rv;
	}
	*out = p;
	return 0;
}

static int bc_chunk_new(void *ctx, uint64_t bytes,
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
		BC_CU(drv.create(&h, bytes, &c->prop, 0), "cuMemCreate");
		rv = bc_cu(drv.exportHandle(&fd, h,
		                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		                            0),
		           "cuMemExportToShareableHandle");
		if (!rv)
			rv = bc_vmm_map(c, h, bytes, &p);
		/* The mapping and the fd hold the allocation from here on. */
		drv.release(h);
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
			drv.unmap((CUdeviceptr)(uintptr_t)tmp.base, tmp.bytes);
			drv.addressFree((CUdeviceptr)(uintptr_t)tmp.base, tmp.bytes);
			close(tmp.fd);
		} else {
			cudaFree(tmp.base);
		}
		memcpy(bc_err, keep, sizeof(keep));
	}
	return rv;
}

static void bc_chunk_free(void *ctx, struct kvt_backend_chunk *ch)
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
		drv.unmap(p, ch->bytes);
		drv.addressFree(p, ch->bytes);
		if (ch->fd >= 0)
			close(ch->fd);
	} else {
		cudaFree(ch->base); /* synchronises the device */
	}
	bc_chunk_clear(ch);
}

static int bc_chunk_import(void *ctx, int fd,
                           const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
                           uint64_t bytes, struct kvt_backend_chunk *out)
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
		if (!drv.loaded) { /* ctx_new fell back to ipc mode */
			bc_note("a VMM chunk (fd) cannot be imported: the "
			        "driver lacks the cuMem* entry points");
			return KVT_ENOTSUP;
		}
		if (!c->gran || bytes % c->gran) {
			size_t g = 0;
			CUmemAllocationProp pr = c->prop;
			if (drv.granularity(&g, &pr,
			                    CU_MEM_ALLOC_GRANULARITY_MINIMUM) ||
			    !g || bytes % g) {
				bc_note("imported chunk size %llu does not fit the "
				        "VMM granularity", (unsigned long long)bytes);
				return KVT_EINVAL;
			}
			c->gran = g;
		}
		BC_CU(drv.importHandle(&h, (void *)(uintptr_t)fd,
		                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		      "cuMemImportFromShareableHandle");
		rv = bc_vmm_map(c, h, bytes, &p);
		drv.release(h); /* the mapping keeps the memory */
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

static void bc_chunk_unmap(void *ctx, struct kvt_backend_chunk *ch)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (ch->base) {
		cudaSetDevice(c->device);
		cudaDeviceSynchronize();
		if (ch->priv[0] == BC_KIND_VMM) {
			CUdeviceptr p = (CUdeviceptr)(uintptr_t)ch->base;
			drv.unmap(p, ch->bytes);
			drv.addressFree(p, ch->bytes);
		} else {
			cudaIpcCloseMemHandle(ch->base);
		}
	}
	bc_chunk_clear(ch);
}

/* ------------------------------------------------------ streams, events */

static int bc_stream_new(void *ctx, void **stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	BC_CALL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
	        "cudaStreamCreate");
	*stream = (void *)s;
	return 0;
}

static void bc_stream_free(void *ctx, void *stream)
{
	(void)ctx;
	if (stream)
		cudaStreamDestroy((cudaStream_t)stream);
}

static int bc_stream_sync(void *ctx, void *stream)
{
	(void)ctx;
	BC_CALL(cudaStreamSynchronize((cudaStream_t)stream),
	        "cudaStreamSynchronize");
	return 0;
}

static int bc_stream_notify(void *ctx, void *stream, void (*fn)(void *),
                            void *arg)
{
	(void)ctx;
	BC_CALL(cudaLaunchHostFunc((cudaStream_t)stream, fn, arg),
	        "cudaLaunchHostFunc");
	return 0;
}

static int bc_event_new(void *ctx, struct kvt_backend_event *out)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaEvent_t e;
	cudaIpcEventHandle_t h;
	int rv;
	memset(out, 0, sizeof(*out));
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	BC_CALL(cudaEventCreateWithFlags(&e, cudaEventInterprocess |
	                                         cudaEventDisableTiming),
	        "cudaEventCreate(interprocess)");
	if ((rv = bc_cuda(cudaIpcGetEventHandle(&h, e),
	                  "cudaIpcGetEventHandle"))) {
		cudaEventDestroy(e);
		return rv;
	}
	static_assert(sizeof(h) == KVT_BACKEND_IPC_BYTES,
	              "cudaIpcEventHandle_t size");
	memcpy(out->handle, &h, sizeof(h));
	out->ev = (void *)e;
	out->owner = 1;
	return 0;
}

static int bc_event_open(void *ctx, const uint8_t handle[KVT_BACKEND_IPC_BYTES],
                         struct kvt_backend_event *out)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaIpcEventHandle_t h;
	cudaEvent_t e;
	memset(out, 0, sizeof(*out));
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	memcpy(&h, handle, sizeof(h));
	BC_CALL(cudaIpcOpenEventHandle(&e, h), "cudaIpcOpenEventHandle");
	memcpy(out->handle, handle, sizeof(h));
	out->ev = (void *)e;
	out->owner = 0;
	return 0;
}

static void bc_event_free(void *ctx, struct kvt_backend_event *e)
{
	(void)ctx;
	if (e->ev)
		cudaEventDestroy((cudaEvent_t)e->ev);
	memset(e, 0, sizeof(*e));
}

static int bc_event_record(void *ctx, struct kvt_backend_event *e,
                           void *stream)
{
	(void)ctx;
	BC_CALL(cudaEventRecord((cudaEvent_t)e->ev, (cudaStream_t)stream),
	        "cudaEventRecord");
	return 0;
}

static int bc_stream_wait_event(void *ctx, void *stream,
                                struct kvt_backend_event *e)
{
	(void)ctx;
	BC_CALL(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)e->ev, 0),
	        "cudaStreamWaitEvent");
	return 0;
}

/* ---------------------------------------------------------- compaction */

/*
 * A staging slot with at least need bytes, ready to be refilled for a
 * launch on stream s.  Prefers a slot whose last launch is done (no wait
 * at all), then one whose pinned bytes have reached the device (s waits
 * on the device for the launch still reading the device copy; the host
 * does not block), and only when every slot's copy is still queued behind
 * other work does the host wait, for the oldest.  So a sync of one tenant
 * does not stall the daemon behind another tenant's GPU backlog unless
 * BC_STAGES syncs are in flight.
 */
static int bc_stage_take(struct bc_ctx *c, size_t need, cudaStream_t s,
                         struct bc_stage **out)
{
	struct bc_stage *st = NULL;
	for (int pass = 0; pass < 2 && !st; pass++)
		for (uint32_t k = 0; k < BC_STAGES && !st; k++) {
			struct bc_stage *x = &c->st[(c->st_next + k) % BC_STAGES];
			if (!x->staged ||
			    cudaEventQuery(pass ? x->copied : x->used) ==
			            cudaSuccess)
				st = x;
		}
	cudaGetLastError(); /* a query's cudaErrorNotReady is not an error */
	if (!st)
		st = &c->st[c->st_next % BC_STAGES];
	c->st_next = (uint32_t)(st - c->st) + 1;
	if (need > st->cap) {
		size_t cap = st->cap ? st->cap : (size_t)1 << 16;
		while (cap < need)
			cap *= 2;
		if (st->staged)
			BC_CALL(cudaEventSynchronize(st->used), "staging wait");
		if (st->h)
			cudaFreeHost(st->h);
		if (st->d)
			cudaFree(st->d);
		st->h = st->d = NULL;
		st->cap = 0;
		st->staged = 0;
		BC_CALL(cudaMallocHost((void **)&st->h, cap), "cudaMallocHost");
		BC_CALL(cudaMalloc((void **)&st->d, cap), "cudaMalloc");
		st->cap = cap;
	}
	if (st->staged) {
		BC_CALL(cudaEventSynchronize(st->copied), "staging wait");
		BC_CALL(cudaStreamWaitEvent(s, st->used, 0), "cudaStreamWaitEvent");
	}
	*out = st;
	return 0;
}

/* Queues the copy of st's first bytes to the device on s. */
static int bc_stage_send(struct bc_stage *st, size_t bytes, cudaStream_t s)
{
	BC_CALL(cudaMemcpyAsync(st->d, st->h, bytes, cudaMemcpyHostToDevice, s),
	        "cudaMemcpyAsync");
	BC_CALL(cudaEventRecord(st->copied, s), "cudaEventRecord");
	st->staged = 1;
	return 0;
}

/*
 * Runs of consecutive lists with one geometry become one launch each:
 * their page addresses are concatenated and every move carries the index
 * of its list's page 0, (dst, src, first) as compact_batch_cuda wants.
 * Everything goes to the device in one copy from pinned memory.
 */
static int bc_compact_locked(void *ctx,
                             const struct kvt_backend_compact *lists,
                             uint32_t n, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	uint64_t pages = 0, moves = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_compact *l = &lists[i];
		if (!l->n_moves)
			continue;
		if (!l->page_tokens || !l->row_bytes || !l->pages || !l->moves)
			return KVT_EINVAL;
		uint64_t cap = (uint64_t)l->n_pages * l->page_tokens;
		for (uint32_t m = 0; m < 2 * l->n_moves; m++)
			if (l->moves[m] >= cap) {
				bc_note("compact: list %u moves entry %u beyond its "
				        "%u pages", i, l->moves[m], l->n_pages);
				return KVT_EINVAL;
			}
		pages += l->n_pages;
		moves += l->n_moves;
	}
	if (moves == 0)
		return 0;
	if (pages > UINT32_MAX || moves > UINT32_MAX)
		return KVT_EINVAL;
	size_t pbytes = (size_t)pages * sizeof(void *);
	size_t need = pbytes + (size_t)moves * 3 * sizeof(uint32_t);
	int rv;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	if ((rv = bc_stage_take(c, need, s, &st)))
		return rv;
	void **hp = (void **)st->h;
	uint32_t *hm = (uint32_t *)(st->h + pbytes);
	uint32_t np = 0, nm = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_compact *l = &lists[i];
		if (!l->n_moves)
			continue;
		memcpy(hp + np, l->pages, (size_t)l->n_pages * sizeof(void *));
		for (uint32_t m = 0; m < l->n_moves; m++) {
			hm[3 * (nm + m)] = l->moves[2 * m];
			hm[3 * (nm + m) + 1] = l->moves[2 * m + 1];
			hm[3 * (nm + m) + 2] = np;
		}
		np += l->n_pages;
		nm += l->n_moves;
	}
	if ((rv = bc_stage_send(st, need, s)))
		return rv;
	void *const *dp = (void *const *)st->d;
	const uint32_t *dm = (const uint32_t *)(st->d + pbytes);
	uint32_t run_m = 0, i = 0;
	while (i < n) {
		if (!lists[i].n_moves) {
			i++;
			continue;
		}
		uint32_t pt = lists[i].page_tokens, rb = lists[i].row_bytes;
		uint32_t cnt = 0;
		while (i < n && (!lists[i].n_moves ||
		                 (lists[i].page_tokens == pt &&
		                  lists[i].row_bytes == rb))) {
			cnt += lists[i].n_moves;
			i++;
		}
		rv = compact_batch_cuda(dp, pt, rb, dm + 3 * (size_t)run_m, cnt, s);
		if (rv) {
			bc_note("compact_batch_cuda failed (%d)", rv);
			break;
		}
		run_m += cnt;
	}
	cudaError_t e = cudaEventRecord(st->used, s);
	if (!rv)
		rv = bc_cuda(e, "cudaEventRecord");
	return rv;
}

/* ---------------------------------------------------- upload_regions */

/* One region of an upload as the scatter kernel reads it: 4-byte words
 * at word offset src of the staged bytes go to word offset dst of dev. */
struct bc_up {
	uint64_t dst, src, words;
};

/* Block b copies region b; threads stride over its words. */
__global__ void bc_scatter_kernel(uint32_t *dev, const struct bc_up *up,
                                  const uint32_t *bytes)
{
	const struct bc_up u = up[blockIdx.x];
	for (uint64_t i = threadIdx.x; i < u.words; i += blockDim.x)
		dev[u.dst + i] = bytes[u.src + i];
}

static int bc_upload_regions_locked(void *ctx, void *dev, const void *host,
                                    const struct kvt_backend_region *r,
                                    uint32_t n, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	uint64_t words = 0;
	if (!n)
		return 0;
	if (!dev || !host || !r || n > INT32_MAX)
		return KVT_EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if (r[i].off % 4 || r[i].bytes % 4) {
			bc_note("upload: region %u (offset %llu, %llu bytes) "
			        "is not in 4-byte words", i,
			        (unsigned long long)r[i].off,
			        (unsigned long long)r[i].bytes);
			return KVT_EINVAL;
		}
		words += r[i].bytes / 4;
	}
	size_t dbytes = (size_t)n * sizeof(struct bc_up);
	size_t need = dbytes + (size_t)words * 4;
	int rv;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	if ((rv = bc_stage_take(c, need, s, &st)))
		return rv;
	struct bc_up *hu = (struct bc_up *)st->h;
	uint32_t *hw = (uint32_t *)(st->h + dbytes);
	uint64_t at = 0;
	for (uint32_t i = 0; i < n; i++) {
		hu[i].dst = r[i].off / 4;
		hu[i].src = at;
		hu[i].words = r[i].bytes / 4;
		memcpy(hw + at, (const char *)host + r[i].off, r[i].bytes);
		at += r[i].bytes / 4;
	}
	if ((rv = bc_stage_send(st, need, s)))
		return rv;
	KVT_LAUNCH(bc_scatter_kernel, n, 128, 0, s, (uint32_t *)dev,
	           (const struct bc_up *)st->d,
	           (const uint32_t *)(st->d + dbytes));
	BC_CALL(cudaGetLastError(), "scatter kernel");
	BC_CALL(cudaEventRecord(st->used, s), "cudaEventRecord");
	return 0;
}

/* ------------------------------------------------- copy, private memory */

static int bc_copy(void *ctx, void *dst, const void *src, size_t bytes,
                   void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	/* Unified addressing tells host from device on either side. */
	BC_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s),
	        "cudaMemcpyAsync");
	BC_CALL(cudaStreamSynchronize(s), "cudaStreamSynchronize");
	return 0;
}

static int bc_mem_new(void *ctx, size_t bytes, void **out)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	void *p = NULL;
	*out = NULL;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	BC_CALL(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
	/* cudaMemset on device memory may return before it is done, and
	 * runs on the legacy stream, which the callers' non-blocking streams
	 * do not wait for: their first upload could land before the zeroes.
	 * So zero on the context's stream and wait, as chunk_new does. */
	cudaError_t e = cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(c->stream);
	if (e != cudaSuccess) {
		int rv = bc_cuda(e, "zeroing device memory");
		cudaFree(p);
		return rv;
	}
	*out = p;
	return 0;
}

static void bc_mem_free(void *ctx, void *p)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!p)
		return;
	cudaSetDevice(c->device);
	/* cudaFree waits for the device work that may still read p. */
	cudaFree(p);
}

/* ------------------------------------------------------ read_regions */

/* Block b copies region b (bytes) from src[b] to out + b * bytes; 16-byte
 * units when every address and the size allow, else single bytes. */
__global__ void bc_gather_kernel(const void *const *src, char *out,
                                 size_t bytes, int wide)
{
	const char *s = (const char *)src[blockIdx.x];
	char *d = out + (size_t)blockIdx.x * bytes;
	if (wide) {
		const uint4 *s4 = (const uint4 *)s;
		uint4 *d4 = (uint4 *)d;
		for (size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
			d4[i] = s4[i];
	} else {
		for (size_t i = threadIdx.x; i < bytes; i += blockDim.x)
			d[i] = s[i];
	}
}

/*
 * One gather kernel into a device buffer, then one strided copy to the
 * host: a layer's key pages cost two operations instead of one memcpy per
 * page.  Synchronous on stream (the policies read the bytes right after).
 */
static int bc_read_regions_locked(void *ctx, void *dst, size_t dst_stride,
                                  const void *const *src, uint32_t n,
                                  size_t bytes, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s = (cudaStream_t)stream;
	if (!n || !bytes)
		return 0;
	if (!dst || !src || dst_stride < bytes)
		return KVT_EINVAL;
	size_t abytes = ((size_t)n * sizeof(void *) + 15) & ~(size_t)15;
	size_t need = abytes + (size_t)n * bytes;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	if (need > c->gather_cap) {
		size_t cap = c->gather_cap ? c->gather_cap : (size_t)1 << 20;
		while (cap < need)
			cap *= 2;
		/* the previous read finished: it synchronised its stream */
		if (c->d_gather)
			cudaFree(c->d_gather);
		c->d_gather = NULL;
		c->gather_cap = 0;
		BC_CALL(cudaMalloc((void **)&c->d_gather, cap), "cudaMalloc");
		c->gather_cap = cap;
	}
	int wide = bytes % 16 == 0;
	for (uint32_t i = 0; wide && i < n; i++)
		wide = ((uintptr_t)src[i] & 15) == 0;
	BC_CALL(cudaMemcpyAsync(c->d_gather, src, (size_t)n * sizeof(void *),
	                        cudaMemcpyHostToDevice, s),
	        "cudaMemcpyAsync");
	KVT_LAUNCH(bc_gather_kernel, n, 256, 0, s,
	           (const void *const *)c->d_gather, c->d_gather + abytes, bytes,
	           wide);
	BC_CALL(cudaGetLastError(), "gather kernel");
	BC_CALL(cudaMemcpy2DAsync(dst, dst_stride, c->d_gather + abytes, bytes,
	                          bytes, n, cudaMemcpyDeviceToHost, s),
	        "cudaMemcpy2DAsync");
	BC_CALL(cudaStreamSynchronize(s), "read_regions");
	return 0;
}

/* The three ops that use the context's staging slots and gather buffer,
 * each whole under its lock. */
static int bc_compact(void *ctx, const struct kvt_backend_compact *lists,
                      uint32_t n, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	pthread_mutex_lock(&c->lock);
	int rv = bc_compact_locked(ctx, lists, n, stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}

static int bc_upload_regions(void *ctx, void *dev, const void *host,
                             const struct kvt_backend_region *r, uint32_t n,
                             void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	pthread_mutex_lock(&c->lock);
	int rv = bc_upload_regions_locked(ctx, dev, host, r, n, stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}

static int bc_read_regions(void *ctx, void *dst, size_t dst_stride,
                           const void *const *src, uint32_t n, size_t bytes,
                           void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	pthread_mutex_lock(&c->lock);
	int rv = bc_read_regions_locked(ctx, dst, dst_stride, src, n, bytes,
	                                stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}

static const char *bc_last_error(void)
{
	return bc_err;
}

/* ------------------------------------------------------------- export */

extern "C" KVT_API const struct kvt_backend_ops kvt_cuda_backend_v1;

extern "C" KVT_API const struct kvt_backend_ops kvt_cuda_backend_v1 = {
	/* .abi = */ KVT_BACKEND_ABI,
	/* .name = */ "cuda",
	/* .host_visible = */ 0,
	/* .probe = */ bc_probe,
	/* .device_count = */ bc_device_count,
	/* .ctx_new = */ bc_ctx_new,
	/* .ctx_free = */ bc_ctx_free,
	/* .share = */ bc_share,
	/* .chunk_new = */ bc_chunk_new,
	/* .chunk_free = */ bc_chunk_free,
	/* .chunk_import = */ bc_chunk_import,
	/* .chunk_unmap = */ bc_chunk_unmap,
	/* .stream_new = */ bc_stream_new,
	/* .stream_free = */ bc_stream_free,
	/* .stream_sync = */ bc_stream_sync,
	/* .event_new = */ bc_event_new,
	/* .event_open = */ bc_event_open,
	/* .event_free = */ bc_event_free,
	/* .event_record = */ bc_event_record,
	/* .stream_wait_event = */ bc_stream_wait_event,
	/* .compact = */ bc_compact,
	/* .last_error = */ bc_last_error,
	/* .read_regions = */ bc_read_regions,
	/* .copy = */ bc_copy,
	/* .mem_new = */ bc_mem_new,
	/* .mem_free = */ bc_mem_free,
	/* .upload_regions = */ bc_upload_regions,
	/* .stream_notify = */ bc_stream_notify,
};
