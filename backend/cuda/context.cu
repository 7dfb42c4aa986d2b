/*
 * context.cu — the cuda backend's probe, device count and contexts: a
 * context is one device, a stream that zeroes new chunks, the staging
 * slots of ops.cu, and the sharing mode chosen once (vmm where the device
 * can export VMM memory as an fd, else ipc; KVTRIM_CUDA_SHARE forces
 * one).  See backend_cuda.cuh.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cublas_v2.h>

#include "backend_cuda.cuh"
#include "blas.cuh"

static void bc_fill(char *err, size_t errlen, const char *msg)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", msg);
}

int bc_probe(char *err, size_t errlen)
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

int bc_device_count(int *out)
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
	if (bc_cu(bc_drv.create(&h, c->gran, &c->prop, 0), "cuMemCreate"))
		return 0;
	int ok = bc_cu(bc_drv.exportHandle(&fd, h,
	                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
	                                0),
	               "cuMemExportToShareableHandle") == 0;
	if (fd >= 0)
		close(fd);
	bc_drv.release(h);
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
	BC_CU(bc_drv.deviceGet(&dev, device), "cuDeviceGet");
	bc_drv.deviceGetAttribute(
		&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
	bc_drv.deviceGetAttribute(
		&fdok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
		dev);
	memset(&c->prop, 0, sizeof(c->prop));
	c->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	c->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	c->prop.location.id = dev;
	c->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	c->gran = 0;
	if (vmm && fdok &&
	    bc_drv.granularity(&c->gran, &c->prop,
	                    CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS)
		c->gran = 0;
	*ok = vmm && fdok && c->gran && KVT_CHUNK_BYTES % c->gran == 0 &&
	      bc_vmm_works(c);
	return 0;
}


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

int bc_ctx_new(int device, void **ctxp, const char **mode, char *err,
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

void bc_ctx_free(void *ctx)
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
	if (c->attn_recorded)
		cudaEventSynchronize(c->attn_used);
	if (c->d_attn)
		cudaFree(c->d_attn);
	if (c->attn_used)
		cudaEventDestroy(c->attn_used);
	if (c->d_win)
		cudaFree(c->d_win);
	if (c->win_blas)
		cublasDestroy((cublasHandle_t)c->win_blas);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Grows the context's rule scratch to need bytes (nothing is queued on
 * it: the rules that use it wait for their work before they return). */
static int bc_win_scratch(struct bc_ctx *c, size_t need)
{
	if (need <= c->win_cap)
		return 0;
	size_t cap = c->win_cap ? c->win_cap : (size_t)1 << 20;
	while (cap < need)
		cap *= 2;
	if (c->d_win)
		cudaFree(c->d_win);
	c->d_win = NULL;
	c->win_cap = 0;
	BC_CALL(cudaMalloc((void **)&c->d_win, cap), "cudaMalloc");
	c->win_cap = cap;
	return 0;
}

int bc_win_prepare(struct bc_ctx *c, size_t need)
{
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	int rv = bc_win_scratch(c, need);
	if (rv || c->win_blas)
		return rv;
	cublasHandle_t h;
	if ((rv = blas_err(cublasCreate(&h)))) {
		bc_note("cublasCreate failed");
		return rv;
	}
	c->win_blas = h;
	return 0;
}

enum kvt_backend_share bc_share(void *ctx)
{
	return ((struct bc_ctx *)ctx)->share;
}
