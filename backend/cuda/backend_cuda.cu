/*
 * backend_cuda.cu — the cuda backend of backend/backend.h, the one symbol
 * libkvtrim-cuda.so exports (kvt_cuda_backend_v1).  Only this library
 * links the CUDA runtime and cuBLAS; the driver API (cuMem*) is reached
 * through cudaGetDriverEntryPointByVersion, so a machine without a driver
 * loads it and probe() says what is missing.  Sharing modes (vmm: VMM
 * allocations exported as fds; ipc: legacy cudaIpc handles, read-write
 * only, chunks revoked before they are freed) are chosen per context:
 * docs/cuda.md, "Backend interface".  A context is used from one thread
 * at a time.  The CPU emulator (tests/kernels/emu/) compiles these files
 * too, so both modes run under `make test`.
 *
 * This file holds the error text and the table; around the private header
 * backend_cuda.cuh, the ops are in driver.cu (cuMem* entry points),
 * context.cu (probe, contexts, sharing mode), share.cu (chunk export and
 * import), streams.cu (streams, interprocess events), ops.cu (compaction,
 * uploads, reads, copies, traffic), and one file per op: attention.cu,
 * compact_drops.cu, fill.cu, scorer.cu, key_norms.cu.  The policies'
 * device rules live beside their host rules (policies/<name>.cu) and are
 * registered here, a line each (BC_RULES).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

/* ------------------------------------------------------ device rules */

/* The policies' device rules, one line each: policies/<name>.cu defines
 * bc_<name>_rule, whose name field is <name>. */
#define BC_RULES(X)                                                            \
	X(h2o)                                                                 \
	X(tova)                                                                \
	X(kvpop)                                                               \
	X(kvzap)                                                               \
	X(fastkvzip)                                                           \
	X(snapkv)                                                              \
	X(expected_attention)                                                  \
	X(streaming)                                                           \
	X(knorm)                                                               \
	X(random)

#define BC_RULE_DECL(n) extern const struct kvt_backend_rule bc_##n##_rule;
#define BC_RULE_REF(n) &bc_##n##_rule,
BC_RULES(BC_RULE_DECL)

static const struct kvt_backend_rule *const bc_rules[] = {
	BC_RULES(BC_RULE_REF)
};

const struct kvt_backend_rule *bc_rule(const char *name)
{
	const size_t n = sizeof(bc_rules) / sizeof(bc_rules[0]);
	for (size_t i = 0; name && i < n; i++)
		if (!strcmp(bc_rules[i]->name, name))
			return bc_rules[i];
	return NULL;
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
	/* .chunk_import_ro = */ bc_chunk_import_ro,
	/* .upload_twin = */ bc_upload_twin,
	/* .rule = */ bc_rule,
};
