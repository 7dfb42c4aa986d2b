/*
 * backend_cuda.cuh — what the files of the cuda backend (backend/cuda/)
 * share: the context, the driver entry points, the error text and the ops
 * each file implements for the table in backend_cuda.cu.  Internal to
 * libkvtrim-cuda.so: exports.map keeps every bc_* symbol local, so the
 * library still exports only kvt_cuda_backend_v1 and the kernels'
 * launchers.
 *
 * Errors: every int function returns 0 or a negative KVT_E* code and, on
 * failure, leaves the reason in bc_err (bc_note), which last_error()
 * returns.  Threads: see backend_cuda.cu.
 */
#ifndef KVT_BACKEND_CUDA_CUH
#define KVT_BACKEND_CUDA_CUH

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "common.cuh"

/* ------------------------------------------------------------ errors */

/* The text of the last failure (backend_cuda.cu).  The emulator fills its
 * own thread-local block before every thread block it runs (its
 * __shared__ variables live there) and lets one host thread at a time in,
 * so there the text is a plain global. */
#ifdef KVT_CUDA_EMU
extern char bc_err[256];
#else
extern __thread char bc_err[256];
#endif

/* Writes the reason into bc_err. */
void bc_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 0 for cudaSuccess; else notes "what: error string", clears a non-sticky
 * error and returns its KVT_E* code (common_err). */
int bc_cuda(cudaError_t e, const char *what);
/* The same for a driver API result. */
int bc_cu(CUresult r, const char *what);

#define BC_CALL(expr, what)                                                    \
	do {                                                                   \
		int rv_ = bc_cuda((expr), (what));                             \
		if (rv_)                                                       \
			return rv_;                                            \
	} while (0)

#define BC_CU(expr, what)                                                      \
	do {                                                                   \
		int rv_ = bc_cu((expr), (what));                               \
		if (rv_)                                                       \
			return rv_;                                            \
	} while (0)

/* -------------------------------------------------------- driver API */

/* The driver's cuMem* entry points (driver.cu), reached through
 * cudaGetDriverEntryPointByVersion so that no file links libcuda. */
struct bc_drv {
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
};
extern struct bc_drv bc_drv;

/* Fills bc_drv once; KVT_ENOTSUP (bc_err names the entry point) when the
 * driver lacks one: the context then shares in ipc mode. */
int bc_drv_load(void);

/* ----------------------------------------------------------- context */

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
	/* attention (attention.cu): resolved page addresses, per-list
	 * offsets and lengths, split-K partials; attn_used follows the last
	 * call that read it. */
	char *d_attn;
	size_t attn_cap;
	cudaEvent_t attn_used;
	int attn_recorded;
	/* The device rules' (policies/<name>.cu) scratch and cuBLAS handle
	 * (a cublasHandle_t), made on first use (bc_win_prepare); the rules
	 * wait for their work, so nothing is queued on them between
	 * calls. */
	char *d_win;
	size_t win_cap;
	void *win_blas;
	/* Bytes the ops copied host -> device and device -> host (traffic;
	 * bc_count), added atomically: copy runs outside the lock. */
	uint64_t h2d, d2h;
	/* Guards st[], st_next, d_gather and d_attn: the daemon calls
	 * compact, upload_regions and read_regions from several threads at
	 * once (syncs on worker threads); the rest of the ops use no shared
	 * state of the context. */
	pthread_mutex_t lock;
};

/* Counts bytes an op queued for copying between host and device (the
 * traffic op reads the sums).  Every copy site calls it once. */
static inline void bc_count(struct bc_ctx *c, uint64_t h2d, uint64_t d2h)
{
	__atomic_fetch_add(&c->h2d, h2d, __ATOMIC_RELAXED);
	__atomic_fetch_add(&c->d2h, d2h, __ATOMIC_RELAXED);
}

/* Device code of the ops that resolve page ids themselves (compact_drops,
 * key_norms): the address of entry e's K row of the list whose record is
 * r, through the tenant's device table and chunk bases in pg, or NULL
 * when its page is beyond the record or in an unmapped chunk (a daemon
 * bug must not fault the context). */
static __device__ __forceinline__ char *
bc_entry_row(const kvt_backend_paged &pg, const struct kvt_list_record *r,
             uint32_t e)
{
	uint32_t p = e / pg.page_tokens;
	if (p >= r->n_pages || p >= pg.max_pages)
		return NULL;
	uint32_t id = r->pages[p], slot = id / pg.pages_per_chunk;
	char *base = slot < pg.n_chunk_slots ? (char *)pg.chunk_bases[slot]
	                                     : NULL;
	if (!base)
		return NULL;
	return base + (uint64_t)(id % pg.pages_per_chunk) * pg.page_bytes +
	       (uint64_t)(e % pg.page_tokens) * pg.row_bytes;
}

/* ---------------------------------------------- the ops (backend.h) */

/* context.cu */
int bc_probe(char *err, size_t errlen);
int bc_device_count(int *out);
int bc_ctx_new(int device, void **ctxp, const char **mode, char *err,
               size_t errlen);
void bc_ctx_free(void *ctx);
enum kvt_backend_share bc_share(void *ctx);

/* share.cu: chunks exported and imported, in vmm or ipc mode */
int bc_chunk_new(void *ctx, uint64_t bytes, struct kvt_backend_chunk *out);
void bc_chunk_free(void *ctx, struct kvt_backend_chunk *ch);
int bc_chunk_import(void *ctx, int fd,
                    const uint8_t ipc[KVT_BACKEND_IPC_BYTES], uint64_t bytes,
                    struct kvt_backend_chunk *out);
int bc_chunk_import_ro(void *ctx, int fd,
                       const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
                       uint64_t bytes, struct kvt_backend_chunk *out,
                       int *readonly);
void bc_chunk_unmap(void *ctx, struct kvt_backend_chunk *ch);

/* streams.cu: streams and interprocess events */
int bc_stream_new(void *ctx, void **stream);
void bc_stream_free(void *ctx, void *stream);
int bc_stream_sync(void *ctx, void *stream);
int bc_stream_notify(void *ctx, void *stream, void (*fn)(void *), void *arg);
int bc_event_new(void *ctx, struct kvt_backend_event *out);
int bc_event_open(void *ctx, const uint8_t handle[KVT_BACKEND_IPC_BYTES],
                  struct kvt_backend_event *out);
void bc_event_free(void *ctx, struct kvt_backend_event *e);
int bc_event_record(void *ctx, struct kvt_backend_event *e, void *stream);
int bc_stream_wait_event(void *ctx, void *stream, struct kvt_backend_event *e);

/* ops.cu: compaction, uploads, reads, copies and their byte counts */
int bc_compact(void *ctx, const struct kvt_backend_compact *lists, uint32_t n,
               void *stream);
int bc_upload_regions(void *ctx, void *dev, const void *host,
                      const struct kvt_backend_region *r, uint32_t n,
                      void *stream);
int bc_upload_twin(void *ctx, void *dev, void *twin, const void *host,
                   const struct kvt_backend_region *r, uint32_t n,
                   void *stream);
int bc_read_regions(void *ctx, void *dst, size_t dst_stride,
                    const void *const *src, uint32_t n, size_t bytes,
                    void *stream);
int bc_copy(void *ctx, void *dst, const void *src, size_t bytes, void *stream);
int bc_mem_new(void *ctx, size_t bytes, void **out);
void bc_mem_free(void *ctx, void *p);
int bc_traffic(void *ctx, uint64_t *h2d, uint64_t *d2h, uint64_t *launches,
               uint64_t *emu_ns);

/* ops.cu: the pinned staging slots.  bc_stage_take picks a slot of at
 * least need bytes for a launch on s (the caller holds c->lock);
 * bc_stage_send queues the copy of its first bytes to the device on s;
 * the caller records st->used after the kernels that read st->d. */
int bc_stage_take(struct bc_ctx *c, size_t need, cudaStream_t s,
                  struct bc_stage **out);
int bc_stage_send(struct bc_ctx *c, struct bc_stage *st, size_t bytes,
                  cudaStream_t s);

/* compact_drops.cu: compaction from drop indices */
int bc_compact_drops(void *ctx, const struct kvt_backend_paged *pg,
                     uint32_t n_records, const struct kvt_backend_drops *lists,
                     uint32_t n, const uint32_t *drops, void *stream);

/* fill.cu: a value at a pattern of words in many rows */
int bc_fill_words(void *ctx, void *dev, uint32_t value,
                  const uint32_t *pattern, uint32_t n_words,
                  const struct kvt_backend_fill_run *runs, uint32_t n_runs,
                  void *stream);

/* scorer.cu: learned scorers with device weights */
int bc_scorer_new(void *ctx, const struct kvt_backend_scorer *d, void **out);
void bc_scorer_free(void *ctx, void *sp);
int bc_scorer_run(void *ctx, void *sp, const struct kvt_backend_score_job *jobs,
                  uint32_t n, float *out, void *stream);

/* key_norms.cu: knorm's key norms on the device */
int bc_key_norms(void *ctx, const struct kvt_backend_paged *pg,
                 uint32_t n_records, enum kvt_dtype dtype, uint32_t head_dim,
                 const struct kvt_backend_norm_job *jobs, uint32_t n,
                 float *out, uint32_t out_floats, void *stream);

/* context.cu: the scratch and cuBLAS handle the device rules share
 * (c->d_win, c->win_blas; the caller holds c->lock and waits for its work
 * before it returns): selects the device, grows the scratch to need
 * bytes, makes the handle on first use. */
int bc_win_prepare(struct bc_ctx *c, size_t need);

/* attention.cu: kvt_attention on the device */
int bc_attention(void *ctx, const struct kvt_backend_attention *a,
                 void *stream);

/* backend_cuda.cu */
const char *bc_last_error(void);
/* The policies' device rules (policies/<name>.cu), by name; NULL for a
 * name none has. */
const struct kvt_backend_rule *bc_rule(const char *name);

#endif
