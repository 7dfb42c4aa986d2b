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
 *        An importer may map a chunk read-only (chunk_import_ro: the
 *        access flags of its own mapping), as clients map the table.
 *   ipc  cudaMalloc + cudaIpcGetMemHandle where the device or driver
 *        cannot export VMM memory, or the driver lacks the cuMem* entry
 *        points (or KVTRIM_CUDA_SHARE=ipc): 64 handle bytes instead of an
 *        fd; the daemon must not free a chunk before its client closed it
 *        (DESIGN.md: chunks are revoked first).  cudaIpcOpenMemHandle
 *        maps read-write whatever the importer wants: nothing is
 *        read-only to an importer in this mode.
 *
 * Threads: a context is used from one thread at a time.
 *
 * The CPU emulator (tests/kernels/emu/, docs/cuda.md) compiles these files
 * with g++ too, and emulates the driver's VMM entry points, so both modes
 * run there (`make test`).
 *
 * This file holds the error text and the table; the ops are in
 *   driver.cu    the driver API entry points (cuMem*), found at run time
 *   context.cu   probe, device count, contexts and their sharing mode
 *   share.cu     chunks: VMM export and import as fds, legacy IPC
 *   streams.cu   streams and interprocess events
 *   ops.cu       compaction, uploads, reads and copies (the staging slots),
 *                and the count of the bytes they move (traffic)
 *   attention.cu kvt_attention's causal paged attention
 *   compact_drops.cu compaction from drop indices
 *   fill.cu      a value at a pattern of words in many rows
 *   scorer.cu    learned scorers with device weights
 *   key_norms.cu knorm's key norms
 *   window_select.cu SnapKV's selection
 * around the private header backend_cuda.cuh.
 */
#include <stdarg.h>
#include <stdio.h>

#include "backend_cuda.cuh"

#ifdef KVT_CUDA_EMU
char bc_err[256];
#else
__thread char bc_err[256];
#endif

void bc_note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(bc_err, sizeof(bc_err), fmt, ap);
	va_end(ap);
}

int bc_cuda(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	bc_note("%s: %s", what, cudaGetErrorString(e));
	(void)cudaGetLastError(); /* clears a non-sticky error */
	return common_err(e);
}

const char *bc_last_error(void)
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
	/* .attention = */ bc_attention,
	/* .traffic = */ bc_traffic,
	/* .compact_drops = */ bc_compact_drops,
	/* .fill_words = */ bc_fill_words,
	/* .scorer_new = */ bc_scorer_new,
	/* .scorer_free = */ bc_scorer_free,
	/* .scorer_run = */ bc_scorer_run,
	/* .key_norms = */ bc_key_norms,
	/* .window_select = */ bc_window_select,
	/* .expected_select = */ bc_expected_select,
	/* .attn_select = */ bc_attn_select,
	/* .tova_select = */ bc_tova_select,
	/* .pop_select = */ bc_pop_select,
	/* .chunk_import_ro = */ bc_chunk_import_ro,
	/* .upload_twin = */ bc_upload_twin,
};
