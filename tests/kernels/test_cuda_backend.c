/*
 * test_cuda_backend.c — the cuda backend (backend/cuda/: chunks,
 * interprocess events, compaction, uploads, region reads, staging
 * rotation) within one process and across two (the kernels:
 * test_cuda_kernels.c; helpers: cuda_fixture.h).  Built into
 * build/bin/kvtrim-cuda-tests; without a device every test skips with the
 * reason.  The same file also builds, against the CPU emulator of
 * tests/kernels/emu/ (KVT_CUDA_EMU), into kvtrim-cuda-emu-tests, which runs
 * backend_cuda.cu without a GPU, in both sharing modes (the emulator has
 * the driver's VMM calls, tests/kernels/emu/driver.cc), across two
 * processes too; backend_share_in_one_process and backend_without_vmm test
 * there what a GPU does not allow (two contexts of one process sharing; a
 * driver without VMM).  Compaction and copies are exact (bytes equal).
 *
 * Run: build/bin/kvtrim-cuda-tests backend
 */
#include <time.h>

#include "cuda_fixture.h"
/* ------------------------------------------------------------- backend */

/* This thread's CPU time, in nanoseconds. */
static double thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static const struct kvt_backend_ops *cuda_ops(void)
{
	static char why[256];
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	T_EQ(o->abi, KVT_BACKEND_ABI);
	T_EQ_STR(o->name, "cuda");
	if (o->probe(why, sizeof(why)))
		T_SKIP(why);
	return o;
}

TEST(cuda, backend_probe_and_chunk)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx;
	const char *mode = NULL;
	char err[256];
	int n = 0;
	T_OK(o->device_count(&n));
	T_ASSERT(n > 0);
	T_OK(o->ctx_new(0, &ctx, &mode, err, sizeof(err)));
	T_ASSERT(mode && (!strcmp(mode, "vmm") || !strcmp(mode, "ipc")));
	fprintf(stderr, "    sharing mode: %s\n", mode);
#ifdef KVT_CUDA_EMU
	/* the emulated device has VMM, like an H100/H200; without it, see
	 * backend_without_vmm */
	if (!getenv("KVTRIM_CUDA_SHARE"))
		T_EQ_STR(mode, "vmm");
#endif
	T_EQ(o->share(ctx), !strcmp(mode, "vmm") ? KVT_BACKEND_SHARE_VMM
	                                         : KVT_BACKEND_SHARE_IPC);
	if (!getenv("KVTRIM_CUDA_SHARE")) {
		void *c2;
		const char *m2 = NULL;
		/* ipc is what a forced ipc mode gives on any device */
		setenv("KVTRIM_CUDA_SHARE", "ipc", 1);
		T_OK(o->ctx_new(0, &c2, &m2, err, sizeof(err)));
		T_EQ_STR(m2, "ipc");
		o->ctx_free(c2);
		/* ipc by necessity: demanding vmm fails and says why */
		if (!strcmp(mode, "ipc")) {
			setenv("KVTRIM_CUDA_SHARE", "vmm", 1);
			T_ERR(o->ctx_new(0, &c2, NULL, err, sizeof(err)),
			      KVT_ENOTSUP);
			fprintf(stderr, "    %s\n", err);
			T_ASSERT(strstr(err, "KVTRIM_CUDA_SHARE=vmm") != NULL);
		}
		unsetenv("KVTRIM_CUDA_SHARE");
	}
	struct kvt_backend_chunk c;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &c));
	T_ASSERT(c.base != NULL);
	T_EQ_U64(c.bytes, KVT_CHUNK_BYTES);
	if (o->share(ctx) == KVT_BACKEND_SHARE_VMM)
		T_ASSERT(c.fd >= 0);
	else
		T_EQ(c.fd, -1);
	uint8_t *h = xmalloc(KVT_CHUNK_BYTES);
	to_host(h, c.base, KVT_CHUNK_BYTES);
	for (size_t i = 0; i < KVT_CHUNK_BYTES; i++)
		if (h[i])
			th_fail(__FILE__, __LINE__, "chunk byte %zu not zero", i);
	free(h);
	o->chunk_free(ctx, &c);
	T_ASSERT(c.base == NULL);
	T_EQ(c.fd, -1);
	o->chunk_free(ctx, &c); /* twice is harmless */
	T_ERR(o->chunk_new(ctx, 12345, &c), KVT_EINVAL);
	o->ctx_free(ctx);
}

/* The backend's batched compaction against compact_cpu. */
TEST(cuda, backend_compact)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ctx, &s));
	for (int round = 0; round < 3; round++) {
		struct plist a, b;
		plist_make(&a, 5, 16, 128, KVT_DTYPE_F16);
		plist_make(&b, 3, 8, 64, KVT_DTYPE_F32);
		void **ahp = xmalloc(5 * sizeof(void *));
		void **bhp = xmalloc(3 * sizeof(void *));
		for (uint32_t i = 0; i < 5; i++)
			ahp[i] = a.dev + (size_t)a.ids[i] * a.page_bytes;
		for (uint32_t i = 0; i < 3; i++)
			bhp[i] = b.dev + (size_t)b.ids[i] * b.page_bytes;
		struct kvt_backend_compact L[5];
		uint32_t *mv[2], nl;
		struct plist *ps[2] = {&a, &b};
		void **hp[2] = {ahp, bhp};
		for (int l = 0; l < 2; l++) {
			uint32_t len = ps[l]->n_pages * ps[l]->page_tokens - rnd() % 5;
			uint8_t *drop = xmalloc(len);
			for (uint32_t i = 0; i < len; i++)
				drop[i] = rnd() % 2;
			mv[l] = xmalloc((size_t)len * 8);
			uint32_t nm = compact_plan(drop, len, mv[l], &nl);
			compact_cpu(ps[l]->hptr, ps[l]->page_tokens,
			            (uint32_t)ps[l]->row_bytes, mv[l], nm);
			L[1 + 2 * l] = (struct kvt_backend_compact){
				hp[l], ps[l]->n_pages, ps[l]->page_tokens,
				(uint32_t)ps[l]->row_bytes, nm, mv[l]};
			free(drop);
		}
		/* untouched lists first, between the two geometries (a run
		 * goes on across them) and last */
		L[0] = L[1];
		L[0].n_moves = 0;
		L[0].page_tokens = 7;
		L[2] = L[4] = L[0];
		T_OK(o->compact(ctx, L, 5, s));
		T_OK(o->stream_sync(ctx, s));
		pools_equal("backend compact a", &a);
		pools_equal("backend compact b", &b);
		/* nothing to move; no list */
		T_OK(o->compact(ctx, L, 1, s));
		T_OK(o->compact(ctx, L, 0, s));
		/* a move beyond the pages is refused before any launch */
		uint32_t bad[2] = {0, 5 * 16};
		struct kvt_backend_compact B = L[1];
		B.moves = bad;
		B.n_moves = 1;
		T_ERR(o->compact(ctx, &B, 1, s), KVT_EINVAL);
		B = L[1];
		B.pages = NULL;
		T_ERR(o->compact(ctx, &B, 1, s), KVT_EINVAL);
		free(mv[0]);
		free(mv[1]);
		free(ahp);
		free(bhp);
		plist_free(&a);
		plist_free(&b);
	}
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
}

#ifdef KVT_CUDA_EMU
/*
 * The steps of cross_process below, exporter and importer in one process
 * (two contexts), which the emulator allows and CUDA does not, in both
 * sharing modes: the chunk is imported from its fd (vmm) or its 64 handle
 * bytes (ipc), an interprocess event opened from its handle; each side
 * writes, records, and the other waits and reads.  In ipc mode the
 * importer closes the chunk before the exporter frees it (the emulator
 * refuses to free memory still open through a handle, which the
 * device-memory count at the end would show).  In vmm mode the exporter
 * frees first and the importer still reads the bytes: its mapping holds
 * the memory, as the driver's reference count does, until it unmaps.
 */
static void share_in_one_process(const char *share)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ex, *im, *se, *si;
	const char *mode = NULL;
	char err[256];
	size_t free0 = 0, free1 = 0, total = 0;
	const int vmm = !strcmp(share, "vmm");
	fprintf(stderr, "    mode %s\n", share);
	setenv("KVTRIM_CUDA_SHARE", share, 1);
	CK(cudaMemGetInfo(&free0, &total));
	T_OK(o->ctx_new(0, &ex, &mode, err, sizeof(err)));
	T_EQ_STR(mode, share);
	T_OK(o->ctx_new(0, &im, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ex, &se));
	T_OK(o->stream_new(im, &si));
	struct kvt_backend_chunk c, ic, bad;
	struct kvt_backend_event e, ie;
	T_OK(o->chunk_new(ex, KVT_CHUNK_BYTES, &c));
	if (vmm)
		T_ASSERT(c.fd >= 0);
	else
		T_EQ(c.fd, -1);
	T_OK(o->event_new(ex, &e));
	T_EQ(e.owner, 1);
	T_OK(o->chunk_import(im, c.fd, vmm ? NULL : c.ipc, c.bytes, &ic));
	T_ASSERT(ic.base != NULL);
	T_ASSERT(ic.base != c.base || !vmm); /* a mapping of its own */
	T_EQ(ic.fd, -1);
	T_EQ_U64(ic.bytes, c.bytes);
	T_OK(o->event_open(im, e.handle, &ie));
	T_EQ(ie.owner, 0);

	const size_t n = KVT_CHUNK_BYTES;
	uint8_t *want = xmalloc(n), *got = xmalloc(n);
	for (size_t i = 0; i < n; i++)
		want[i] = (uint8_t)rnd();
	/* exporter writes and records; the importer's stream waits */
	T_OK(o->copy(ex, c.base, want, n, se));
	T_OK(o->event_record(ex, &e, se));
	T_OK(o->stream_wait_event(im, si, &ie));
	T_OK(o->copy(im, got, ic.base, n, si));
	T_ASSERT(memcmp(got, want, n) == 0);
	/* and back: the importer records the event it opened */
	for (size_t i = 4096; i < 8192; i++)
		want[i] = (uint8_t)~want[i];
	T_OK(o->copy(im, (char *)ic.base + 4096, want + 4096, 4096, si));
	T_OK(o->event_record(im, &ie, si));
	T_OK(o->stream_wait_event(ex, se, &e));
	T_OK(o->copy(ex, got, c.base, n, se));
	T_ASSERT(memcmp(got, want, n) == 0);

	/* an fd that is no VMM export is refused, not crashed on */
	int fd = open("/dev/null", O_RDONLY);
	T_ASSERT(fd >= 0);
	T_ERR(o->chunk_import(im, fd, NULL, KVT_CHUNK_BYTES, &bad), KVT_EINVAL);
	T_ASSERT(bad.base == NULL);
	close(fd);
	fprintf(stderr, "    %s\n", o->last_error());
	/* a size that is no multiple of the granularity is refused */
	if (vmm) {
		T_ERR(o->chunk_import(im, c.fd, NULL, c.bytes - 4096, &bad),
		      KVT_EINVAL);
		T_ASSERT(bad.base == NULL);
	}
	/* bytes that are no handle are refused */
	uint8_t junk[KVT_BACKEND_IPC_BYTES];
	memset(junk, 0x5a, sizeof(junk));
	T_ASSERT(o->chunk_import(im, -1, junk, KVT_CHUNK_BYTES, &bad) < 0);
	T_ASSERT(bad.base == NULL);
	fprintf(stderr, "    %s\n", o->last_error());

	void *ib = ic.base;
	o->event_free(im, &ie);
	if (vmm) {
		/* the exporter goes first; the importer's mapping still reads
		 * the bytes, then gives them back when it unmaps */
		o->event_free(ex, &e);
		o->chunk_free(ex, &c);
		T_ASSERT(c.base == NULL);
		T_EQ(c.fd, -1);
		memset(got, 0, n);
		T_OK(o->copy(im, got, ic.base, n, si));
		T_ASSERT(memcmp(got, want, n) == 0);
		CK(cudaMemGetInfo(&free1, &total));
		T_EQ_U64(free0 - free1, n); /* held by the mapping */
		o->chunk_unmap(im, &ic);
	} else {
		o->chunk_unmap(im, &ic);
		o->event_free(ex, &e);
		o->chunk_free(ex, &c);
	}
	T_ASSERT(ic.base == NULL);
	/* the unmapped range is no device memory any more */
	T_EQ(cudaMemcpy(got, ib, 16, cudaMemcpyDeviceToHost),
	     cudaErrorInvalidValue);
	(void)cudaGetLastError();
	o->stream_free(im, si);
	o->ctx_free(im);
	o->stream_free(ex, se);
	o->ctx_free(ex);
	CK(cudaGetLastError());
	CK(cudaMemGetInfo(&free1, &total));
	T_EQ_U64(free1, free0); /* every byte went back, the chunk's too */
	free(want);
	free(got);
	unsetenv("KVTRIM_CUDA_SHARE");
}

TEST(cuda, backend_share_in_one_process)
{
	share_in_one_process("vmm");
	share_in_one_process("ipc");
}

/*
 * A driver without VMM (kvt_emu_set_driver, emulator only; the backend
 * caches the driver entry points, so each case runs in a child of its
 * own): the backend falls back to legacy IPC, KVTRIM_CUDA_SHARE=vmm fails
 * and says why, and a VMM chunk (an fd) cannot be imported.
 */
static int without_vmm(int level)
{
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	void *ctx;
	const char *mode = NULL;
	char err[256];
	struct kvt_backend_chunk c;
	kvt_emu_set_driver(level);
	unsetenv("KVTRIM_CUDA_SHARE");
	if (o->ctx_new(0, &ctx, &mode, err, sizeof(err)) || strcmp(mode, "ipc"))
		return 1;
	if (o->chunk_new(ctx, KVT_CHUNK_BYTES, &c) || c.fd != -1)
		return 2;
	o->chunk_free(ctx, &c);
	int fd = open("/dev/null", O_RDONLY);
	int rv = o->chunk_import(ctx, fd, NULL, KVT_CHUNK_BYTES, &c);
	close(fd);
	fprintf(stderr, "    import of an fd: %s\n", o->last_error());
	if (level == KVT_EMU_DRIVER_NONE ? rv != KVT_ENOTSUP : rv >= 0)
		return 3;
	o->ctx_free(ctx);
	setenv("KVTRIM_CUDA_SHARE", "vmm", 1);
	if (o->ctx_new(0, &ctx, NULL, err, sizeof(err)) != KVT_ENOTSUP)
		return 4;
	fprintf(stderr, "    %s\n", err);
	if (!strstr(err, "KVTRIM_CUDA_SHARE=vmm") ||
	    !strstr(err, level == KVT_EMU_DRIVER_NONE ? "entry point"
	                                              : "cannot export"))
		return 5;
	return 0;
}

TEST(cuda, backend_without_vmm)
{
	cuda_ops();
	for (int level = KVT_EMU_DRIVER_NONE; level <= KVT_EMU_DRIVER_NO_VMM;
	     level++) {
		pid_t pid = fork();
		T_ASSERT(pid >= 0);
		if (pid == 0)
			_exit(without_vmm(level));
		int st = 0;
		T_EQ(waitpid(pid, &st, 0), pid);
		T_ASSERT(WIFEXITED(st));
		if (WEXITSTATUS(st))
			th_fail(__FILE__, __LINE__,
			        "driver level %d: step %d failed", level,
			        WEXITSTATUS(st));
	}
}
#endif /* KVT_CUDA_EMU */

/*
 * A read-only import (chunk_import_ro, as the client maps the daemon's
 * device table) after its pattern was read: in vmm mode it says it is
 * read-only and a copy into it fails (the device's fault; this process's
 * context is unusable afterwards, so the caller only cleans up); legacy
 * IPC cannot map read-only, says so, and takes the copy.  0 or a step.
 */
static int write_read_only(const struct kvt_backend_ops *o, void *ctx,
                           void *s, struct kvt_backend_chunk *c, int ro,
                           int vmm)
{
	static const uint8_t junk[64] = {1, 2, 3};
	if (ro != vmm)
		return 20;
	int rc = o->copy(ctx, c->base, junk, sizeof(junk), s);
	if (vmm && !rc)
		return 21;
	if (vmm)
		fprintf(stderr, "    write into the read-only mapping: %s\n",
		        o->last_error());
	return !vmm && rc ? 22 : 0;
}

/*
 * Importer in a child process (which has not touched CUDA: forked before
 * the parent initialises it): maps the chunk from the fd or handle
 * (read-only with readonly), opens the event, makes its stream wait on it,
 * reads the chunk and reports whether it saw the exporter's pattern.
 */
static int importer(int sock, int readonly)
{
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	struct handle_ext x, xe;
	int fd, efd;
	char err[256], go;
	void *ctx, *s;
	/* the daemon's packets: the chunk (fd, or the IPC handle in data),
	 * then its event */
	if (handle_recv_ext(sock, &x, &fd, 10000) ||
	    x.h.type != HANDLE_CHUNK_DEV ||
	    handle_recv_ext(sock, &xe, &efd, 10000) ||
	    xe.h.type != HANDLE_EVENT)
		return 10;
	if (o->ctx_new(0, &ctx, NULL, err, sizeof(err)) ||
	    o->stream_new(ctx, &s))
		return 11;
	struct kvt_backend_chunk c;
	struct kvt_backend_event e;
	int ro = -1, vmm = fd >= 0;
	if (readonly ? o->chunk_import_ro(ctx, fd, x.data, x.h.size, &c, &ro)
	             : o->chunk_import(ctx, fd, x.data, x.h.size, &c)) {
		fprintf(stderr, "    import: %s\n", o->last_error());
		return 12;
	}
	if (fd >= 0)
		close(fd); /* the mapping keeps the memory */
	if (o->event_open(ctx, xe.data, &e))
		return 13;
	if (read(sock, &go, 1) != 1) /* exporter recorded its event */
		return 14;
	uint64_t bytes = x.h.size;
	uint8_t *h = malloc(bytes);
	if (!h || o->stream_wait_event(ctx, s, &e) ||
	    cudaMemcpyAsync(h, c.base, bytes, cudaMemcpyDeviceToHost,
	                    (cudaStream_t)s) != cudaSuccess ||
	    o->stream_sync(ctx, s))
		return 15;
	int bad = 0;
	for (uint64_t i = 0; i < bytes; i++)
		bad |= h[i] != 0x5a;
	free(h);
	int step = readonly ? write_read_only(o, ctx, s, &c, ro, vmm) : 0;
	if (step)
		return step;
	o->event_free(ctx, &e);
	o->chunk_unmap(ctx, &c);
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
	char done = bad ? 'B' : 'G';
	if (write(sock, &done, 1) != 1)
		return 16;
	return bad ? 17 : 0;
}

static void cross_process(const char *share, int readonly)
{
	int sv[2];
	/* the handle channel's socket type and packets (ipc/handle.h) */
	T_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	if (share)
		setenv("KVTRIM_CUDA_SHARE", share, 1);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		_exit(importer(sv[1], readonly));
	}
	close(sv[1]);
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s;
	const char *mode;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, &mode, err, sizeof(err)));
	if (share)
		T_EQ_STR(mode, share);
#ifdef KVT_CUDA_EMU
	else
		T_EQ_STR(mode, "vmm"); /* as on an H100/H200 */
#endif
	fprintf(stderr, "    sharing mode: %s\n", mode);
	T_OK(o->stream_new(ctx, &s));
	struct kvt_backend_chunk c;
	struct kvt_backend_event e;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &c));
	T_OK(o->event_new(ctx, &e));
	struct handle_ext x = {.h = {.magic = HANDLE_MAGIC,
	                             .type = HANDLE_CHUNK_DEV,
	                             .size = c.bytes}};
	memcpy(x.data, c.ipc, sizeof(x.data));
	T_OK(handle_send_ext(sv[0], &x, c.fd));
	x.h.type = HANDLE_EVENT;
	x.h.size = 0;
	memcpy(x.data, e.handle, sizeof(x.data));
	T_OK(handle_send_ext(sv[0], &x, -1));
	/* write, record, tell: the importer's stream waits on the event,
	 * not on this process's host thread */
	CK(cudaMemsetAsync(c.base, 0x5a, c.bytes, (cudaStream_t)s));
	T_OK(o->event_record(ctx, &e, s));
	char go = 'r', done = 0;
	T_EQ(write(sv[0], &go, 1), 1);
	T_EQ(read(sv[0], &done, 1), 1);
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	T_ASSERT(WIFEXITED(st));
	T_EQ(WEXITSTATUS(st), 0);
	T_EQ(done, 'G');
	o->event_free(ctx, &e);
	o->chunk_free(ctx, &c);
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
	close(sv[0]);
}

/* Probes in a child, so that the parent forks the importer before
 * touching CUDA; skips without a usable device. */
static void skip_without_device(void)
{
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		char why[256];
		_exit(kvt_cuda_backend_v1.probe(why, sizeof(why)) ? 77 : 0);
	}
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 77)
		T_SKIP("no usable CUDA device");
}

static void skip_emulated_ipc_under_asan(void)
{
#if defined(KVT_CUDA_EMU) && defined(__SANITIZE_ADDRESS__)
	/* emulated device memory is the heap under ASan (runtime.cc) */
	T_SKIP("cuda emulator under ASan: cudaMalloc memory is heap, not "
	       "shared between processes (backend_share_in_one_process "
	       "covers ipc)");
#endif
}

TEST_T(cuda, backend_share_across_processes, 60)
{
	skip_without_device();
	cross_process(NULL, 0);
}

TEST_T(cuda, backend_share_legacy_ipc, 60)
{
	skip_emulated_ipc_under_asan();
	skip_without_device();
	cross_process("ipc", 0);
}

/* chunk_import_ro: the importer's write into its read-only
 * mapping fails in vmm mode; legacy IPC maps read-write and says so. */
TEST_T(cuda, backend_share_read_only, 60)
{
	skip_without_device();
	cross_process(NULL, 1);
}

TEST_T(cuda, backend_share_read_only_legacy_ipc, 60)
{
	skip_emulated_ipc_under_asan();
	skip_without_device();
	cross_process("ipc", 1);
}

/*
 * copy (kvt_memcpy), private device memory, and upload_regions (the
 * daemon's device table, the client's chunk bases); upload_twin
 * (the daemon's two device tables).  Expected bytes are the same regions
 * applied to a host buffer with memcpy.
 */
TEST(cuda, backend_copy_and_upload_regions)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s[2];
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ctx, &s[0]));
	T_OK(o->stream_new(ctx, &s[1]));
	const size_t n = 1 << 16;
	uint8_t *src = xmalloc(n), *want = xmalloc(n), *got = xmalloc(n);
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(rnd() | 1); /* never 0: zeros are "not copied" */

	/* mem_new is zeroed; copy goes host->device, device->device and
	 * device->host on a stream and waits. */
	void *p, *q;
	T_OK(o->mem_new(ctx, n, &p));
	T_OK(o->mem_new(ctx, n, &q));
	T_OK(o->copy(ctx, got, p, n, s[0]));
	for (size_t i = 0; i < n; i++)
		if (got[i])
			th_fail(__FILE__, __LINE__, "mem_new byte %zu not zero", i);
	T_OK(o->copy(ctx, p, src, n, s[0]));
	T_OK(o->copy(ctx, q, p, n, s[1]));
	memset(got, 0, n);
	T_OK(o->copy(ctx, got, q, n, s[1]));
	T_ASSERT(memcmp(got, src, n) == 0);
	o->mem_free(ctx, q);
	o->mem_free(ctx, NULL); /* harmless */

	/* 40 uploads of disjoint random regions, alternating streams (more
	 * than the staging slots, so slots are reused across streams), each
	 * source changed right after the call: the device must hold the
	 * bytes as they were at the call. */
	void *dev;
	T_OK(o->mem_new(ctx, n, &dev));
	memset(want, 0, n);
	uint64_t at = 0;
	for (int call = 0; call < 40; call++) {
		struct kvt_backend_region r[64];
		uint32_t k = 1 + rnd() % 64;
		for (uint32_t j = 0; j < k; j++) {
			uint64_t bytes = 4 * (uint64_t)(rnd() % 9); /* 0..32 */
			if (at + bytes > n)
				bytes = 0;
			r[j] = (struct kvt_backend_region){at, bytes};
			at += bytes + 4 * (rnd() % 3);
		}
		T_OK(o->upload_regions(ctx, dev, src, r, k, s[call % 2]));
		for (uint32_t j = 0; j < k; j++)
			memcpy(want + r[j].off, src + r[j].off, r[j].bytes);
		for (uint32_t j = 0; j < k; j++) /* the caller moves on */
			memset(src + r[j].off, 0xee, r[j].bytes);
	}
	T_OK(o->stream_sync(ctx, s[0]));
	T_OK(o->copy(ctx, got, dev, n, s[1]));
	T_ASSERT(memcmp(got, want, n) == 0);

	/* A region that is not in whole words is refused; nothing moves. */
	struct kvt_backend_region bad[2] = {{0, 8}, {6, 4}};
	T_ERR(o->upload_regions(ctx, dev, src, bad, 2, s[0]), KVT_EINVAL);
	T_OK(o->copy(ctx, got, dev, n, s[0]));
	T_ASSERT(memcmp(got, want, n) == 0);
	T_OK(o->upload_regions(ctx, dev, src, bad, 0, s[0])); /* n 0 */

	/* upload_twin writes the same regions into two buffers and
	 * moves the host bytes once, as upload_regions into one does. */
	void *twin;
	uint64_t h0, h1, h2, d2h, launches;
	struct kvt_backend_region tr[3] = {{0, 64}, {4096, 8}, {n - 4, 4}};
	T_OK(o->mem_new(ctx, n, &twin));
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(rnd() | 1);
	T_OK(o->traffic(ctx, &h0, &d2h, &launches, NULL));
	T_OK(o->upload_regions(ctx, dev, src, tr, 3, s[0]));
	T_OK(o->traffic(ctx, &h1, &d2h, &launches, NULL));
	T_OK(o->upload_twin(ctx, dev, twin, src, tr, 3, s[0]));
	T_OK(o->traffic(ctx, &h2, &d2h, &launches, NULL));
	T_EQ_U64(h2 - h1, h1 - h0);
	for (uint32_t j = 0; j < 3; j++)
		memcpy(want + tr[j].off, src + tr[j].off, tr[j].bytes);
	T_OK(o->copy(ctx, got, dev, n, s[0]));
	T_ASSERT(memcmp(got, want, n) == 0);
	T_OK(o->copy(ctx, got, twin, n, s[0]));
	for (uint32_t j = 0; j < 3; j++)
		T_ASSERT(!memcmp(got + tr[j].off, want + tr[j].off,
		                 tr[j].bytes));
	T_EQ(got[64], 0); /* the rest of twin is untouched (zeroed) */
	T_ERR(o->upload_twin(ctx, dev, NULL, src, tr, 3, s[0]), KVT_EINVAL);
	T_ERR(o->upload_twin(ctx, dev, twin, src, bad, 2, s[0]), KVT_EINVAL);
	o->mem_free(ctx, twin);

	o->mem_free(ctx, dev);
	o->mem_free(ctx, p);
	o->stream_free(ctx, s[0]);
	o->stream_free(ctx, s[1]);
	o->ctx_free(ctx);
	free(src);
	free(want);
	free(got);
}

/*
 * read_regions gathers regions of chunk memory into a strided host
 * buffer after the stream's queued work.  The chunk holds a known image;
 * region i must land at dst + i * stride, and the gaps between regions
 * keep their sentinel.  The cases cover the 16-byte path (sizes and
 * addresses multiples of 16), the byte path (odd sizes, or addresses off
 * by a few bytes), overlapping regions, and growth of the gather buffer
 * (over 1 MiB at once).
 */
TEST(cuda, backend_read_regions)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_OK(o->stream_new(ctx, &s));
	struct kvt_backend_chunk c;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &c));
	const size_t n_img = KVT_CHUNK_BYTES;
	uint8_t *img = xmalloc(n_img);
	for (size_t i = 0; i < n_img; i++)
		img[i] = (uint8_t)rnd();
	T_OK(o->copy(ctx, c.base, img, n_img, s));

	static const struct {
		uint32_t n;
		size_t bytes, gap; /* stride = bytes + gap */
		uint32_t align;    /* region offsets: multiples of it ... */
		uint32_t skew;     /* ... plus this */
	} C[] = {
		{7, 256, 48, 16, 0},    /* 16-byte path, strided */
		{5, 100, 0, 4, 0},      /* byte path: odd size, packed */
		{6, 64, 13, 16, 3},     /* byte path: misaligned sources */
		{1, 1, 0, 1, 0},        /* one byte */
		{33, 48, 16, 16, 0},    /* many small */
		{300, 4096, 32, 16, 0}, /* 1.2 MiB: the gather buffer grows */
		{9, 4096, 0, 1, 1},     /* after growth, byte path */
		{2, 16, 0, 16, 0},
	};
	for (size_t k = 0; k < sizeof(C) / sizeof(C[0]); k++) {
		uint32_t n = C[k].n;
		size_t bytes = C[k].bytes, stride = bytes + C[k].gap;
		size_t span = (n_img - bytes - C[k].skew) / C[k].align;
		const void **src = xmalloc(n * sizeof(void *));
		size_t *off = xmalloc(n * sizeof(size_t));
		for (uint32_t i = 0; i < n; i++) {
			off[i] = (rnd() % span) * C[k].align + C[k].skew;
			src[i] = (const char *)c.base + off[i];
		}
		/* work queued before the read: it must see it */
		uint8_t v = (uint8_t)rnd();
		CK(cudaMemsetAsync((char *)c.base + off[0], v, bytes,
		                   (cudaStream_t)s));
		memset(img + off[0], v, bytes);
		size_t dn = (size_t)n * stride;
		uint8_t *dst = xmalloc(dn);
		memset(dst, 0xa5, dn);
		T_OK(o->read_regions(ctx, dst, stride, (const void *const *)src,
		                     n, bytes, s));
		for (uint32_t i = 0; i < n; i++)
			for (size_t j = 0; j < stride; j++) {
				uint8_t w = j < bytes ? img[off[i] + j] : 0xa5;
				if (dst[(size_t)i * stride + j] != w)
					th_fail(__FILE__, __LINE__,
					        "case %zu: region %u byte %zu "
					        "is %02x, expected %02x",
					        k, i, j,
					        dst[(size_t)i * stride + j], w);
			}
		free(dst);
		free(src);
		free(off);
	}

	/* nothing to read; bad arguments touch nothing */
	const void *one[1] = {c.base};
	uint8_t sent[32];
	memset(sent, 0xa5, sizeof(sent));
	T_OK(o->read_regions(ctx, sent, 16, one, 0, 16, s));
	T_OK(o->read_regions(ctx, sent, 16, one, 1, 0, s));
	T_ERR(o->read_regions(ctx, sent, 8, one, 1, 16, s), KVT_EINVAL);
	T_ERR(o->read_regions(ctx, NULL, 16, one, 1, 16, s), KVT_EINVAL);
	T_ERR(o->read_regions(ctx, sent, 16, NULL, 1, 16, s), KVT_EINVAL);
	for (size_t i = 0; i < sizeof(sent); i++)
		T_EQ(sent[i], 0xa5);

	o->chunk_free(ctx, &c);
	o->stream_free(ctx, s);
	o->ctx_free(ctx);
	free(img);
}

/*
 * The staging slots under load: compact and upload_regions calls on three
 * streams, with no synchronisation between them, many more than the eight
 * slots, so slots are reused across streams while earlier calls may still
 * be queued; every few calls an upload bigger than a slot makes that slot
 * grow.  The host arrays of each call (pages, moves, source bytes) are
 * overwritten right after it returns.  Each stream owns its device buffer
 * and its page list, so the final bytes are those of the calls applied in
 * order on the CPU (memcpy and compact_cpu).
 */
#define ROT_STREAMS 3
#define ROT_BYTES ((size_t)256 << 10)

struct rot_stream {
	void *s, *dev;
	uint8_t *src, *want; /* [ROT_BYTES] */
	struct plist p;
	void **hp; /* host array of the list's device page addresses */
};

static void rotation_round(const struct kvt_backend_ops *o, void *ctx,
                           int calls)
{
	struct rot_stream R[ROT_STREAMS];
	for (int k = 0; k < ROT_STREAMS; k++) {
		struct rot_stream *r = &R[k];
		T_OK(o->stream_new(ctx, &r->s));
		T_OK(o->mem_new(ctx, ROT_BYTES, &r->dev));
		r->src = xmalloc(ROT_BYTES);
		r->want = xmalloc(ROT_BYTES);
		memset(r->want, 0, ROT_BYTES); /* mem_new is zeroed */
		for (size_t i = 0; i < ROT_BYTES; i++)
			r->src[i] = (uint8_t)rnd();
		plist_make(&r->p, 4 + k, 16, 64 + 32 * k, DTS[k % 3]);
		r->hp = xmalloc(r->p.n_pages * sizeof(void *));
	}
	for (int call = 0; call < calls; call++) {
		struct rot_stream *r = &R[call % ROT_STREAMS];
		if (call % 4 == 3) {
			/* compaction of the stream's list */
			struct plist *p = &r->p;
			uint32_t cap = p->n_pages * p->page_tokens;
			uint32_t len = cap - rnd() % 5, nl;
			uint8_t *drop = xmalloc(len);
			uint32_t *mv = xmalloc((size_t)len * 8);
			for (uint32_t i = 0; i < len; i++)
				drop[i] = rnd() % 3 == 0;
			uint32_t nm = compact_plan(drop, len, mv, &nl);
			compact_cpu(p->hptr, p->page_tokens,
			            (uint32_t)p->row_bytes, mv, nm);
			for (uint32_t i = 0; i < p->n_pages; i++)
				r->hp[i] = p->dev + (size_t)p->ids[i] * p->page_bytes;
			struct kvt_backend_compact L = {
				r->hp, p->n_pages, p->page_tokens,
				(uint32_t)p->row_bytes, nm, mv};
			T_OK(o->compact(ctx, &L, 1, r->s));
			/* the caller reuses its arrays at once */
			memset(mv, 0xff, (size_t)len * 8);
			memset(r->hp, 0, p->n_pages * sizeof(void *));
			free(drop);
			free(mv);
			continue;
		}
		/* disjoint regions in one call (the scatter kernel's blocks
		 * run in parallel); later calls overwrite earlier ones */
		struct kvt_backend_region rg[48];
		uint32_t k = 1 + rnd() % 48;
		uint64_t at = 4 * (uint64_t)(rnd() % 1024);
		for (uint32_t j = 0; j < k; j++) {
			uint64_t bytes = 4 * (uint64_t)(rnd() % 64);
			if (call % 7 == 0 && j == 0)
				bytes = (uint64_t)160 << 10; /* > a 64 KiB slot */
			if (at + bytes > ROT_BYTES)
				bytes = 0;
			rg[j] = (struct kvt_backend_region){at, bytes};
			at += bytes + 4 * (rnd() % 256);
		}
		T_OK(o->upload_regions(ctx, r->dev, r->src, rg, k, r->s));
		for (uint32_t j = 0; j < k; j++) {
			memcpy(r->want + rg[j].off, r->src + rg[j].off,
			       rg[j].bytes);
			for (uint64_t i = 0; i < rg[j].bytes; i++)
				r->src[rg[j].off + i] = (uint8_t)rnd();
		}
	}
	uint8_t *got = xmalloc(ROT_BYTES);
	for (int k = 0; k < ROT_STREAMS; k++) {
		struct rot_stream *r = &R[k];
		T_OK(o->stream_sync(ctx, r->s));
		T_OK(o->copy(ctx, got, r->dev, ROT_BYTES, r->s));
		for (size_t i = 0; i < ROT_BYTES; i++)
			if (got[i] != r->want[i])
				th_fail(__FILE__, __LINE__,
				        "stream %d: device byte %zu is %02x, "
				        "expected %02x",
				        k, i, got[i], r->want[i]);
		pools_equal("rotation compact", &r->p);
		o->mem_free(ctx, r->dev);
		o->stream_free(ctx, r->s);
		plist_free(&r->p);
		free(r->hp);
		free(r->src);
		free(r->want);
	}
	free(got);
}

TEST(cuda, backend_staging_rotation)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx;
	char err[256];
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
#ifdef KVT_CUDA_EMU
	/* Work runs when queued there, so every slot would be free at once.
	 * With a lag, an event completes only after that many later records.
	 * Each call records two (copied, used) and takes the oldest slot
	 * first, whose events are 15 and 14 records old by then: a lag of
	 * 15 leaves its copy done but its launch not (the stream waits on
	 * the device), 1000 leaves every slot busy (the host waits). */
	static const unsigned LAG[] = {0, 15, 1000};
	for (size_t i = 0; i < sizeof(LAG) / sizeof(LAG[0]); i++) {
		kvt_emu_set_event_lag(LAG[i]);
		rotation_round(o, ctx, 60);
	}
	kvt_emu_set_event_lag(0);
#else
	rotation_round(o, ctx, 60);
#endif
	o->ctx_free(ctx);
}

/*
 * traffic counts the bytes the context's ops copy between host and
 * device, over a mix of them on two streams: copies in every direction
 * (device-to-device and host-to-host count nothing), uploads (one larger
 * than a staging slot, so the slot grows), a compaction, a read of
 * regions, and refused calls (which move nothing).  Under the emulator the
 * backend's sums must equal the emulator's own count of the same window
 * (kvt_emu_traffic, every cudaMemcpy* of the process; the test copies
 * nothing itself in between); everywhere, device -> host is exactly what
 * copy and read_regions deliver, and host -> device at least the payload
 * (copied bytes, region bytes, page addresses and moves, read addresses).
 * The launch count grows with the uploads, the compaction and the
 * read (each launches), not with the copies or the refused calls; under
 * the emulator it equals the emulator's count of launches and cuBLAS
 * calls over the same window (kvt_emu_launches).
 */
TEST(cuda, backend_traffic_counts)
{
	const struct kvt_backend_ops *o = cuda_ops();
	void *ctx, *s[2];
	char err[256];
	uint64_t h0, d0, h1, d1, l0, l1;
	T_ASSERT(o->traffic != NULL);
	T_OK(o->ctx_new(0, &ctx, NULL, err, sizeof(err)));
	T_ERR(o->traffic(ctx, NULL, &d0, &l0, NULL), KVT_EINVAL);
	T_ERR(o->traffic(ctx, &h0, &d0, NULL, NULL), KVT_EINVAL);
	T_OK(o->traffic(ctx, &h0, &d0, &l0, NULL));
	T_EQ_U64(h0, 0); /* a fresh context moved nothing */
	T_EQ_U64(d0, 0);
	T_OK(o->stream_new(ctx, &s[0]));
	T_OK(o->stream_new(ctx, &s[1]));
	const size_t n = (size_t)256 << 10;
	uint8_t *src = xmalloc(n), *got = xmalloc(n);
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)rnd();
	void *dev, *dev2;
	T_OK(o->mem_new(ctx, n, &dev));
	T_OK(o->mem_new(ctx, n, &dev2));
	struct kvt_backend_chunk ch;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &ch));
	struct plist a;
	plist_make(&a, 5, 16, 128, KVT_DTYPE_F16);
	void **ahp = xmalloc(5 * sizeof(void *));
	for (uint32_t i = 0; i < 5; i++)
		ahp[i] = a.dev + (size_t)a.ids[i] * a.page_bytes;
	uint32_t len = 5 * 16 - 3, nl;
	uint8_t *drop = xmalloc(len);
	for (uint32_t i = 0; i < len; i++)
		drop[i] = rnd() % 2;
	uint32_t *mv = xmalloc((size_t)len * 8);
	uint32_t nm = compact_plan(drop, len, mv, &nl);
	T_ASSERT(nm > 0);

	uint64_t e_h0 = 0, e_d0 = 0, e_h1 = 0, e_d1 = 0, e_l0 = 0, e_l1 = 0;
#ifdef KVT_CUDA_EMU
	kvt_emu_traffic(&e_h0, &e_d0);
	e_l0 = kvt_emu_launches();
#endif
	uint64_t n0, n1;
	const double c0 = thread_cpu_ns();
	T_OK(o->traffic(ctx, &h0, &d0, &l0, &n0));
	uint64_t pay_h = 0, want_d = 0;
	/* copies */
	T_OK(o->copy(ctx, dev, src, 1000, s[0]));
	pay_h += 1000;
	T_OK(o->copy(ctx, got, dev, 600, s[1]));
	want_d += 600;
	T_OK(o->copy(ctx, dev2, dev, 4096, s[0])); /* device to device */
	T_OK(o->copy(ctx, got, src, 100, s[0]));   /* host to host */
	T_OK(o->copy(ctx, dev, src, 0, s[0]));
	T_OK(o->copy(ctx, (char *)ch.base + 64, src, 256, s[1])); /* a chunk */
	pay_h += 256;
	uint64_t lc;
	T_OK(o->traffic(ctx, &h1, &d1, &lc, NULL));
	T_EQ_U64(lc, l0); /* copies launch nothing */
	/* uploads, the last one past a 64 KiB slot */
	for (int call = 0; call < 12; call++) {
		struct kvt_backend_region r[16];
		uint32_t k = 1 + rnd() % 16;
		uint64_t at = 0;
		for (uint32_t j = 0; j < k; j++) {
			uint64_t b = 4 * (uint64_t)(rnd() % 40);
			if (call == 11 && j == 0)
				b = (uint64_t)160 << 10;
			r[j] = (struct kvt_backend_region){at, b};
			at += b + 4 * (rnd() % 8);
			pay_h += b;
		}
		T_OK(o->upload_regions(ctx, dev, src, r, k, s[call % 2]));
	}
	/* a compaction of one list: page addresses and moves go up */
	struct kvt_backend_compact L = {ahp, 5, 16, (uint32_t)a.row_bytes, nm,
	                                mv};
	T_OK(o->compact(ctx, &L, 1, s[0]));
	pay_h += 5 * sizeof(void *) + (uint64_t)nm * 8;
	/* a read of 7 regions of 256 bytes: addresses up, bytes down */
	const void *rs[7];
	for (int i = 0; i < 7; i++)
		rs[i] = (const char *)ch.base + 4096 * (size_t)i;
	T_OK(o->read_regions(ctx, got, 300, rs, 7, 256, s[1]));
	pay_h += 7 * sizeof(void *);
	want_d += 7 * 256;
	/* refused calls move nothing */
	struct kvt_backend_region bad[2] = {{0, 8}, {6, 4}};
	T_ERR(o->upload_regions(ctx, dev, src, bad, 2, s[0]), KVT_EINVAL);
	T_ERR(o->read_regions(ctx, got, 8, rs, 1, 16, s[0]), KVT_EINVAL);
	uint32_t far[2] = {0, 5 * 16};
	struct kvt_backend_compact B = L;
	B.moves = far;
	B.n_moves = 1;
	T_ERR(o->compact(ctx, &B, 1, s[0]), KVT_EINVAL);
	T_OK(o->traffic(ctx, &h1, &d1, &l1, &n1));
	const double c1 = thread_cpu_ns();
#ifdef KVT_CUDA_EMU
	/* the emulated device's work ran on this thread, inside the
	 * window: some of its CPU time, never more */
	T_ASSERT(n1 > n0);
	T_ASSERT((double)(n1 - n0) <= c1 - c0);
	kvt_emu_traffic(&e_h1, &e_d1);
	e_l1 = kvt_emu_launches();
	T_EQ_U64(h1 - h0, e_h1 - e_h0);
	T_EQ_U64(d1 - d0, e_d1 - e_d0);
	T_EQ_U64(l1 - l0, e_l1 - e_l0);
#else
	(void)e_h0; (void)e_d0; (void)e_h1; (void)e_d1; (void)e_l0; (void)e_l1;
	(void)c0; (void)c1;
	T_EQ_U64(n1, 0); /* a GPU did the work */
	T_EQ_U64(n0, 0);
#endif
	T_ASSERT(l1 - l0 >= 12 + 1 + 1); /* 12 uploads, compact, read */
	T_EQ_U64(d1 - d0, want_d);
	if (h1 - h0 < pay_h)
		th_fail(__FILE__, __LINE__, "host -> device %" PRIu64
		        " bytes, below the payload of %" PRIu64,
		        h1 - h0, pay_h);
	T_OK(o->stream_sync(ctx, s[0]));
	free(drop);
	free(mv);
	free(ahp);
	plist_free(&a);
	o->chunk_free(ctx, &ch);
	o->mem_free(ctx, dev);
	o->mem_free(ctx, dev2);
	o->stream_free(ctx, s[0]);
	o->stream_free(ctx, s[1]);
	o->ctx_free(ctx);
	free(src);
	free(got);
}
