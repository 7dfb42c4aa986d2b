/*
 * backend.h — where kvtrimd's KV memory lives and how it is shared: one
 * const table of function pointers per backend (DESIGN.md section 2).
 *
 *   cpu   backend/cpu.c, always built in.  A chunk is a sealed memfd
 *         mapped into the daemon; the owning client maps the same fd.
 *   cuda  libkvtrim-cuda.so (backend/cuda/), loaded with
 *         dlopen by backend_open() so that kvtrimd and libkvtrim never link
 *         libcuda or libcudart and start on any machine.  A chunk is a
 *         CUDA VMM allocation exported as a POSIX fd ("vmm" mode), or a
 *         cudaMalloc block with a legacy cudaIpcMemHandle_t where the
 *         driver cannot export VMM memory ("ipc" mode).
 *
 * The cuda library exports exactly one symbol, KVT_BACKEND_CUDA_SYMBOL, a
 * const struct kvt_backend_ops.  A member marked (optional) may be NULL;
 * the cpu table leaves the stream and event members NULL.
 *
 * Errors: every int function returns 0 or a negative KVT_E* code; after a
 * failure, last_error() says why in words (the CUDA error string).
 * Threads: a context is used from one thread at a time (the daemon's loop
 * thread); probe and device_count may be called from any thread.
 */
#ifndef KVT_BACKEND_H
#define KVT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever struct kvt_backend_ops or its structs change layout;
 * backend_open refuses a library built for another version.  A device
 * rule's own params and jobs are versioned by the rule (struct
 * kvt_backend_rule's version), not here. */
#define KVT_BACKEND_ABI 15
#define KVT_BACKEND_CUDA_LIB "libkvtrim-cuda.so"
#define KVT_BACKEND_CUDA_SYMBOL "kvt_cuda_backend_v1"

/* Bytes of a cudaIpcMemHandle_t / cudaIpcEventHandle_t. */
#define KVT_BACKEND_IPC_BYTES 64

/* How a chunk reaches its client. */
enum kvt_backend_share {
	KVT_BACKEND_SHARE_MEMFD = 0, /* fd of a memfd: mmap it */
	KVT_BACKEND_SHARE_VMM = 1,   /* fd of a CUDA VMM allocation: import */
	KVT_BACKEND_SHARE_IPC = 2,   /* no fd: 64-byte cudaIpcMemHandle_t */
};

/* One pool chunk as the daemon (exporter) or a client (importer) holds it.
 * base NULL means "no chunk"; freeing such a struct does nothing. */
struct kvt_backend_chunk {
	int fd;         /* memfd or VMM POSIX fd to pass over the handle
	                   channel; -1 in ipc mode and after import */
	void *base;     /* [bytes] the chunk in this process: host mapping
	                   (cpu) or device address (cuda) */
	uint64_t bytes; /* KVT_CHUNK_BYTES in practice */
	uint8_t ipc[KVT_BACKEND_IPC_BYTES]; /* ipc mode: handle to send */
	uint64_t priv[2];                  /* the backend's own */
};

/* An interprocess event: created by one side, opened by the other from
 * its 64 handle bytes (sent in a message). */
struct kvt_backend_event {
	void *ev;                              /* cudaEvent_t */
	uint8_t handle[KVT_BACKEND_IPC_BYTES]; /* cudaIpcEventHandle_t */
	int owner;                             /* created here (1), opened (0) */
};

/* One list to compact: the moves compact_plan() wrote, applied to the
 * list's pages (addresses in this process: host for cpu, device for cuda;
 * the array itself is host memory and may be reused once compact returns). */
struct kvt_backend_compact {
	void *const *pages;    /* [n_pages] */
	uint32_t n_pages;
	uint32_t page_tokens;
	uint32_t row_bytes;    /* head_dim * elem_bytes */
	uint32_t n_moves;
	const uint32_t *moves; /* [n_moves][2] (dst, src), host memory */
};

/* One region of an upload: bytes at byte offset off of a host copy go to
 * the same offset of its device copy (off and bytes multiples of 4). */
struct kvt_backend_region {
	uint64_t off;
	uint64_t bytes;
};

/*
 * One kvt_attention call on the device: n query tokens of one
 * (sequence, layer) over its n_kv_heads lists, read from the device copy
 * of the table.  Everything but this struct is device memory.
 */
struct kvt_backend_attention {
	const void *records;      /* the list record (struct kvt_list_record)
	                             of KV head 0; head h's is at
	                             records + h * list_stride */
	uint64_t list_stride;
	void *const *chunk_bases; /* [n_chunk_slots] chunk bases, NULL when
	                             unmapped */
	uint32_t n_chunk_slots, pages_per_chunk;
	uint64_t page_bytes;
	uint32_t max_pages;       /* page ids a record holds */
	uint32_t page_tokens, head_dim, n_heads, n_kv_heads;
	enum kvt_dtype dtype;
	uint32_t n;               /* query tokens, >= 1 */
	uint32_t max_len;         /* longest list + n (the caller checked
	                             every record on the host) */
	float scale;
	const float *q;           /* [n][n_heads][head_dim] */
	float *out;               /* [n][n_heads][head_dim] */
	float *lse;               /* [n][n_heads] */
};

/*
 * Where one tenant's pages are in device memory, for ops that resolve page
 * ids on the device: the device copy of the table (record r at
 * records + r * list_stride, laid out as struct kvt_list_record) and a
 * device array of this process's chunk bases.  Everything it points at is
 * device memory; the struct itself is host memory.
 */
struct kvt_backend_paged {
	const void *records;
	uint64_t list_stride;
	uint32_t max_pages;       /* page ids a record holds */
	void *const *chunk_bases; /* [n_chunk_slots], NULL when unmapped */
	uint32_t n_chunk_slots, pages_per_chunk;
	uint64_t page_bytes;
	uint32_t page_tokens;
	uint32_t row_bytes;       /* head_dim * elem_bytes */
};

/*
 * One list of compact_drops: its record, its length before the
 * drops (the sync's new entries included) and its drops, n_drop strictly
 * ascending entry indices < len at drops[drop_off ..].  Compaction then
 * does what compact_plan() plans from the same marks: the i-th dropped
 * index below the new length len - n_drop receives the i-th kept entry at
 * or above it.
 */
struct kvt_backend_drops {
	uint32_t record;
	uint32_t len;
	uint32_t n_drop;
	uint32_t drop_off;
};

/*
 * A learned scorer of rows of x, one score per row and KV head, of
 * one of three kinds, with per layer KVT_SCORER_TENSORS weight tensors (the
 * unused ones NULL), float32, in this order:
 *   LINEAR     W [d_out][d_in], b [d_out]:             y = W x + b
 *   MLP        W1 [hidden][d_in], b1 [hidden], W2 [d_out][hidden], b2
 *              [d_out]:                         y = W2 gelu(W1 x + b1) + b2
 *              (exact erf GELU)
 *   SINK_GATE  Wq, cq, Wk, gq, gk, sinks, bias of kernels.h's
 *              sink_gate_cpu, d_out = n_kv (a low-rank gate of sink
 *              attention)
 * w holds n_layers rows of KVT_SCORER_TENSORS host pointers; scorer_new
 * copies the weights to the device.  kvt_scorer_floats gives a tensor's
 * size: the one definition of the layouts for both sides.
 */
enum kvt_scorer_kind {
	KVT_SCORER_LINEAR = 1,
	KVT_SCORER_MLP = 2,
	KVT_SCORER_SINK_GATE = 3,
};
#define KVT_SCORER_TENSORS 7

struct kvt_backend_scorer {
	uint32_t kind;         /* enum kvt_scorer_kind */
	uint32_t n_layers, d_in, d_out;
	uint32_t hidden;       /* MLP */
	uint32_t G, dp, S;     /* SINK_GATE: query heads per KV head, gate
	                          width, sink keys */
	const float *const *w; /* [n_layers][KVT_SCORER_TENSORS] */
};

/* Floats of tensor k (0 .. KVT_SCORER_TENSORS-1) of one layer of s; 0 for
 * a tensor the kind does not have. */
static inline uint64_t kvt_scorer_floats(const struct kvt_backend_scorer *s,
                                         uint32_t k)
{
	uint64_t d = s->d_in, o = s->d_out, h = s->hidden;
	uint64_t gd = (uint64_t)s->d_out * s->G * s->dp;
	switch (s->kind) {
	case KVT_SCORER_LINEAR:
		return k == 0 ? o * d : k == 1 ? o : 0;
	case KVT_SCORER_MLP:
		return k == 0 ? h * d : k == 1 ? h : k == 2 ? o * h
		       : k == 3 ? o : 0;
	case KVT_SCORER_SINK_GATE: {
		const uint64_t n[KVT_SCORER_TENSORS] = {
			gd * d, gd, o * s->dp * d, s->dp, s->dp,
			o * s->S * s->dp, o * s->G,
		};
		return k < KVT_SCORER_TENSORS ? n[k] : 0;
	}
	default:
		return 0;
	}
}

/* Rows of fill_words: row r (< rows) of block b (< blocks)
 * starts at byte first + b * block_stride + r * row_stride of the buffer
 * (all multiples of 4): the ring rows of several positions of several
 * layers of one sequence in device staging. */
struct kvt_backend_fill_run {
	uint64_t first, block_stride;
	uint32_t rows, row_stride, blocks, reserved;
};

/* One list of key_norms: entries first .. first + n - 1 of the
 * list whose record is `record`; the norm of entry first + k goes to
 * out[out_off + k * out_stride]. */
struct kvt_backend_norm_job {
	uint32_t record, first, n;
	uint32_t out_off, out_stride;
};

/*
 * How the device rules find a (sequence, layer)'s staged rows in
 * device staging: its ring holds stage_tokens rows of row_floats floats,
 * position p in row p % stage_tokens, each row x (at 0, when staged), q
 * (n_heads * head_dim at q_off) and lse (n_heads at lse_off).
 */
struct kvt_backend_rows {
	uint32_t stage_tokens, row_floats, q_off, lse_off;
};

/* n rows of x, [n][d_in] float32 in device memory, scored with layer's
 * weights; dev (NULL: none): device memory that receives the job's
 * scores [n][d_out] too, on the device, for a device rule that reads
 * them there (the host's copy still comes back). */
struct kvt_backend_score_job {
	uint32_t layer, n;
	const float *x;
	float *dev;
};

/* The geometry a device rule reads the pages and the staged rows with. */
struct kvt_backend_rule_geom {
	enum kvt_dtype dtype;
	uint32_t n_heads, n_kv_heads, head_dim;
};

/*
 * A policy's rule run on the device: a plug-in of the policy, which
 * declares its params and jobs beside its host rule (policies/<name>.c;
 * its policies/<name>_rule.h, the layout numbered there) and whose
 * backend code lives there too (the cuda backend's: policies/<name>.cu).
 * The backend names no policy: it hands out its rules by name (the ops'
 * rule member), and the caller checks version, params_bytes and job_bytes
 * against the header it was built with before it calls run.
 *
 * run(ctx, pg, n_records, g, params, jobs, n, out, out_words, stream)
 * takes the whole sync, n jobs (struct <rule>_job, the rule's params
 * struct for the call), after the work queued on stream: keys read
 * through *pg (n_records records, as key_norms reads them), staged rows in
 * device staging, the rule's state on the device.  What every rule writes
 * into out (host memory, out_words words):
 *   out[j] = 1 when a staged value job j reads is not finite (its results
 *     are then meaningless: the caller refuses the sync), else 0;
 *   out[n + j] = the drops job j made;
 *   its drop indices, ascending, at out[2 n + drop_off] (drop_off and
 *     n_drop being job j's).
 * What crosses: the jobs (host to device), those words (device to host).
 * n 0 does nothing.  KVT_EINVAL (last_error says which job) for NULL
 * params or jobs, a record beyond n_records, an output beyond out_words,
 * head_dim 0 or n_heads not a multiple of n_kv_heads, and the cases the
 * rule's header adds.  Blocks until out is filled.
 */
struct kvt_backend_rule {
	const char *name;     /* the rule's name (its policy's, or one its
	                         policies share) */
	uint32_t version;     /* layout version of its params and jobs (its
	                         header's <NAME>_RULE_VERSION) */
	uint32_t params_bytes, job_bytes; /* sizeof of both, checked by the
	                                     caller */
	int (*run)(void *ctx, const struct kvt_backend_paged *pg,
	           uint32_t n_records, const struct kvt_backend_rule_geom *g,
	           const void *params, const void *jobs, uint32_t n,
	           uint32_t *out, uint32_t out_words, void *stream);
};

struct kvt_backend_ops {
	uint32_t abi;      /* KVT_BACKEND_ABI */
	const char *name;  /* "cpu" | "cuda" */
	int host_visible;  /* chunk base is host memory the daemon may touch */

	/* Checks that the backend can run here: 0, or KVT_ENOTSUP with the
	 * reason in err ("libcuda.so.1 not found (no NVIDIA driver)", "no
	 * CUDA device").  Cheap; creates no context. */
	int (*probe)(char *err, size_t errlen);
	/* Devices usable by this backend (cpu: 1). */
	int (*device_count)(int *out);

	/* Opens a context on one device (cpu: ignored).  On success *ctx is
	 * passed to every call below and *mode is a static string naming the
	 * sharing mode: "memfd", "vmm" or "ipc".  KVTRIM_CUDA_SHARE=ipc in
	 * the environment forces ipc mode (tests). */
	int (*ctx_new)(int device, void **ctx, const char **mode, char *err,
	               size_t errlen);
	void (*ctx_free)(void *ctx);
	enum kvt_backend_share (*share)(void *ctx);

	/* Exporter: creates a zero-filled chunk of bytes (a multiple of the
	 * allocation granularity, 2 MiB on current GPUs) and its shareable
	 * handle.  Blocks until the memory is zeroed.  KVT_ESYS on failure
	 * (out of device memory included), KVT_EINVAL for a bad size. */
	int (*chunk_new)(void *ctx, uint64_t bytes,
	                 struct kvt_backend_chunk *out);
	/* Unmaps and releases a chunk (safe on base NULL); sets fd -1 and base
	 * NULL.  With VMM the memory lives on while an importer maps it. */
	void (*chunk_free)(void *ctx, struct kvt_backend_chunk *c);

	/* Importer (client side): maps a chunk received from the daemon: fd
	 * for memfd/vmm (the caller keeps and may close it afterwards), ipc
	 * bytes for ipc mode.  chunk_unmap undoes it. */
	int (*chunk_import)(void *ctx, int fd,
	                    const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
	                    uint64_t bytes, struct kvt_backend_chunk *out);
	void (*chunk_unmap)(void *ctx, struct kvt_backend_chunk *c);

	/* (optional) Streams: opaque cudaStream_t; NULL stream = the legacy
	 * default stream.  stream_sync blocks the calling thread. */
	int (*stream_new)(void *ctx, void **stream);
	void (*stream_free)(void *ctx, void *stream);
	int (*stream_sync)(void *ctx, void *stream);

	/* (optional) Interprocess events (cudaEventInterprocess |
	 * cudaEventDisableTiming).  The exporter creates the event and sends
	 * its handle; the importer opens it.  Either side records it after
	 * its writes on its stream; the other side makes its stream wait on
	 * it (no host blocking).  Destroy the exporter's event only after the
	 * importer is gone. */
	int (*event_new)(void *ctx, struct kvt_backend_event *out);
	int (*event_open)(void *ctx, const uint8_t handle[KVT_BACKEND_IPC_BYTES],
	                  struct kvt_backend_event *out);
	void (*event_free)(void *ctx, struct kvt_backend_event *e);
	int (*event_record)(void *ctx, struct kvt_backend_event *e,
	                    void *stream);
	int (*stream_wait_event)(void *ctx, void *stream,
	                         struct kvt_backend_event *e);

	/* Compacts n lists (cpu: compact_cpu on each, synchronously; cuda:
	 * stages pages and moves to the device and runs compact_batch_cuda on
	 * stream, asynchronously — record an event after it for the clients).
	 * The host arrays may be reused as soon as it returns. */
	int (*compact)(void *ctx, const struct kvt_backend_compact *lists,
	               uint32_t n, void *stream);

	/* Text of the last failure of this backend in the calling thread
	 * ("" if none). */
	const char *(*last_error)(void);

	/* (optional) Copies n regions of `bytes` each, src[i] being an
	 * address in this process's chunks (host for cpu, device for cuda),
	 * into host memory at dst + i * dst_stride, after the work already
	 * queued on stream; returns once the bytes are in dst (blocks the
	 * calling thread).  The daemon stages the keys that policies read
	 * (attn_band) this way when host_visible is 0. */
	int (*read_regions)(void *ctx, void *dst, size_t dst_stride,
	                    const void *const *src, uint32_t n, size_t bytes,
	                    void *stream);

	/* (optional) Copies bytes from src to dst, either of which
	 * may be host memory or an address in this process's device memory,
	 * on stream, and waits for the stream (kvt_memcpy). */
	int (*copy)(void *ctx, void *dst, const void *src, size_t bytes,
	            void *stream);
	/* (optional) Device memory of this process only (not
	 * shared): zero-filled; mem_free(NULL) does nothing. */
	int (*mem_new)(void *ctx, size_t bytes, void **out);
	void (*mem_free)(void *ctx, void *p);
	/* (optional) Queues on stream the copy of n regions of the
	 * host buffer `host` to the same offsets of the device buffer `dev`
	 * (one small upload and one scatter kernel, whatever n).  The host
	 * bytes are read before it returns, so the caller may change them
	 * at once; nothing blocks on the device work.  The daemon keeps the
	 * device copy of each tenant's table this way, the client its
	 * chunk-base array. */
	int (*upload_regions)(void *ctx, void *dev, const void *host,
	                      const struct kvt_backend_region *r, uint32_t n,
	                      void *stream);
	/* (optional) Calls fn(arg) once the work queued on stream so
	 * far is done, from another thread (cuda: a driver thread), or
	 * before it returns.  fn must be quick and must not call the
	 * backend.  The daemon uses it to wait for an engine's writes
	 * without blocking its loop. */
	int (*stream_notify)(void *ctx, void *stream, void (*fn)(void *),
	                     void *arg);
	/* (optional) Queues on stream the causal attention of
	 * kvt_attention (kvtrim.h): token k of a->n reads the first
	 * len + k + 1 entries of each list, len being the record's; the page
	 * addresses are resolved on the device from the records and
	 * chunk_bases, so nothing crosses from the host but the launch.
	 * KVT_EINVAL when q, out or lse is not device memory, KVT_ENOTSUP
	 * for head_dim > 256; returns without blocking on the device work.
	 * A record naming a page outside the mapped chunks (a broken
	 * daemon) makes its list attend over nothing (out 0, lse -inf)
	 * rather than fault.  The cpu table leaves it NULL: libkvtrim runs
	 * paged_attention_cpu itself. */
	int (*attention)(void *ctx, const struct kvt_backend_attention *a,
	                 void *stream);
	/* (optional) The bytes the context's ops copied so far from
	 * host to device (*h2d) and from device to host (*d2h), counted as
	 * each copy is queued: compact's and upload_regions' staged upload,
	 * read_regions' addresses and gathered bytes, copy (by which side is
	 * device memory; device-to-device counts nothing).  Monotonic, from
	 * any thread.  *launches: the kernel launches and cuBLAS
	 * calls the library's code made so far, every context of the
	 * process together.  The daemon reports them
	 * (device_h2d_bytes_total, device_d2h_bytes_total,
	 * device_launches_total).  *emu_ns (may be NULL): on the CUDA
	 * emulator, the CPU nanoseconds its entry points took so far (the
	 * device's work, run by the calling threads: device_emulated_ns_total,
	 * so that a benchmark can tell the daemon's own CPU from it); 0 on a
	 * GPU.  The cpu table leaves it NULL: nothing crosses. */
	int (*traffic)(void *ctx, uint64_t *h2d, uint64_t *d2h,
	               uint64_t *launches, uint64_t *emu_ns);
	/* (optional) Compacts n lists of one tenant from their drop
	 * indices alone, on stream, asynchronously: the moves and the page
	 * addresses are worked out on the device from the device table and
	 * chunk bases in *pg, which the stream must already see as they
	 * were before this sync's changes.  What crosses from the host is
	 * sized by the drops (4 bytes each, plus 24 per list with moves),
	 * never by the lists' lengths.  KVT_EINVAL (last_error says which
	 * list) for drops that are not strictly ascending or not below
	 * len, or a record index beyond n_records; the host arrays may be
	 * reused once it returns. */
	int (*compact_drops)(void *ctx, const struct kvt_backend_paged *pg,
	                     uint32_t n_records,
	                     const struct kvt_backend_drops *lists, uint32_t n,
	                     const uint32_t *drops, void *stream);
	/* (optional) Queues on stream the store of the 4-byte value
	 * at the n_words word offsets pattern[] of every row the runs name
	 * in the device buffer dev (struct kvt_backend_fill_run): what
	 * crosses is 4 bytes per pattern word and 32 per run, whatever the
	 * number of rows.  The host arrays are read before it returns.  The
	 * daemon marks device staging rows unstaged this way. */
	int (*fill_words)(void *ctx, void *dev, uint32_t value,
	                  const uint32_t *pattern, uint32_t n_words,
	                  const struct kvt_backend_fill_run *runs,
	                  uint32_t n_runs, void *stream);
	/* (optional) A scorer on the device: scorer_new uploads its
	 * weights (blocking) into *out, scorer_free releases it (NULL: no-op).
	 * scorer_run scores n jobs in order after the work queued on stream,
	 * through cuBLAS SGEMMs, and copies the scores to the host, out
	 * [sum of n][d_out]: the only bytes that cross, 4 per score (and,
	 * in one more launch, to the jobs' dev where they name one; out
	 * NULL: nothing crosses, every job naming its dev).  It returns
	 * once the scores are in place (blocks the calling thread).  One
	 * thread at a time per scorer (the daemon shares a scorer between
	 * tenants and serialises its runs). */
	int (*scorer_new)(void *ctx, const struct kvt_backend_scorer *s,
	                  void **out);
	void (*scorer_free)(void *ctx, void *sc);
	int (*scorer_run)(void *ctx, void *sc,
	                  const struct kvt_backend_score_job *jobs, uint32_t n,
	                  float *out, void *stream);
	/* (optional) The L2 norm of the K row of each entry the jobs
	 * name, from the pages as the stream sees them:
	 * dtype pages of head_dim, page ids resolved on the device through
	 * *pg as compact_drops does, the sum of squares in double in entry
	 * order, then sqrt and rounding to float, as the cpu policy does,
	 * so the norms are the same bits.  An entry of a page beyond its
	 * record or of an unmapped chunk gets NaN.  Copies the norms to the
	 * host, out (every out_off + k * out_stride the jobs name): what
	 * crosses is 20 bytes a job and 4 a norm.  Blocks until out is
	 * filled. */
	int (*key_norms)(void *ctx, const struct kvt_backend_paged *pg,
	                 uint32_t n_records, enum kvt_dtype dtype,
	                 uint32_t head_dim,
	                 const struct kvt_backend_norm_job *jobs, uint32_t n,
	                 float *out, uint32_t out_floats, void *stream);
	/* (optional) As chunk_import, mapped read-only for this
	 * process's device where the sharing mode allows it: in vmm mode
	 * the mapping's access is CU_MEM_ACCESS_FLAGS_PROT_READ, so a copy,
	 * memset or kernel store through it faults as any write to read-only
	 * device memory does.  Legacy IPC has no read-only mapping
	 * (cudaIpcOpenMemHandle maps read-write): in ipc mode the chunk is
	 * mapped read-write.  *readonly (when readonly is not NULL) is 1
	 * when the mapping refuses writes, else 0.  The client maps the
	 * daemon's device copy of its table this way. */
	int (*chunk_import_ro)(void *ctx, int fd,
	                       const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
	                       uint64_t bytes, struct kvt_backend_chunk *out,
	                       int *readonly);
	/* (optional) As upload_regions into two device buffers of
	 * the same layout at once, dev and twin: one upload of the regions'
	 * bytes and one scatter kernel that writes each word to both, so the
	 * second copy costs no host-to-device byte.  The daemon keeps its own
	 * device table (the one its kernels read) and the one it shares
	 * with the client this way. */
	int (*upload_twin)(void *ctx, void *dev, void *twin, const void *host,
	                   const struct kvt_backend_region *r, uint32_t n,
	                   void *stream);
	/* (optional) The device rule named name (struct
	 * kvt_backend_rule), or NULL when the backend has none of that
	 * name.  The rule is static: it lives as long as the table. */
	const struct kvt_backend_rule *(*rule)(const char *name);
};

/*
 * Picks a backend by name: "cpu", "cuda" or "auto" (cuda when the library
 * loads, probes fine and sees a device; else cpu).  On success *out is a
 * static table (never freed; the cuda library stays loaded) and err holds
 * a note for the log, e.g. why auto fell back to cpu ("" when none).  On
 * failure returns KVT_ENOTSUP ("cuda backend: libcuda.so.1 not found (no
 * NVIDIA driver)", "cuda backend: no CUDA device") or KVT_EINVAL (unknown
 * name) with the reason in err.
 *
 * The library is looked up as $KVTRIM_CUDA_LIB (a path) when set, else
 * next to the executable ($ORIGIN/../lib/libkvtrim-cuda.so), else by name
 * on the library path.
 */
int backend_open(const char *name, const struct kvt_backend_ops **out,
                 char *err, size_t errlen);

/* The cpu backend (backend/cpu.c). */
extern const struct kvt_backend_ops backend_cpu;

#ifdef __cplusplus
}
#endif
#endif
