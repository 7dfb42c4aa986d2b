/*
 * streams.cu — the cuda backend's streams and interprocess events
 * (cudaEventInterprocess): the exporter creates an event and sends its
 * handle, the importer opens it, and either side orders its stream after
 * the other's writes without blocking the host.  See backend.h.
 */
#include <string.h>

#include "backend_cuda.cuh"

int bc_stream_new(void *ctx, void **stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	cudaStream_t s;
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	BC_CALL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
	        "cudaStreamCreate");
	*stream = (void *)s;
	return 0;
}

void bc_stream_free(void *ctx, void *stream)
{
	(void)ctx;
	if (stream)
		cudaStreamDestroy((cudaStream_t)stream);
}

int bc_stream_sync(void *ctx, void *stream)
{
	(void)ctx;
	BC_CALL(cudaStreamSynchronize((cudaStream_t)stream),
	        "cudaStreamSynchronize");
	return 0;
}

int bc_stream_notify(void *ctx, void *stream, void (*fn)(void *),
                     void *arg)
{
	(void)ctx;
	BC_CALL(cudaLaunchHostFunc((cudaStream_t)stream, fn, arg),
	        "cudaLaunchHostFunc");
	return 0;
}

int bc_event_new(void *ctx, struct kvt_backend_event *out)
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

int bc_event_open(void *ctx, const uint8_t handle[KVT_BACKEND_IPC_BYTES],
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

void bc_event_free(void *ctx, struct kvt_backend_event *e)
{
	(void)ctx;
	if (e->ev)
		cudaEventDestroy((cudaEvent_t)e->ev);
	memset(e, 0, sizeof(*e));
}

int bc_event_record(void *ctx, struct kvt_backend_event *e,
                    void *stream)
{
	(void)ctx;
	BC_CALL(cudaEventRecord((cudaEvent_t)e->ev, (cudaStream_t)stream),
	        "cudaEventRecord");
	return 0;
}

int bc_stream_wait_event(void *ctx, void *stream,
                         struct kvt_backend_event *e)
{
	(void)ctx;
	BC_CALL(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)e->ev, 0),
	        "cudaStreamWaitEvent");
	return 0;
}
