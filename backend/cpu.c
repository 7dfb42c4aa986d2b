/*
 * cpu.c — the cpu backend (see backend.h): pool chunks are sealed
 * memfds mapped into the daemon and, by the owning tenant only, into its
 * client; compaction runs compact_cpu in the calling thread.  No device,
 * no streams, no events.
 */
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "compact.h"

static _Thread_local char cpu_err[128];

static int cpu_fail(const char *what)
{
	snprintf(cpu_err, sizeof(cpu_err), "%s: %s", what, strerror(errno));
	return KVT_ESYS;
}

static int cpu_probe(char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	return 0;
}

static int cpu_device_count(int *out)
{
	*out = 1;
	return 0;
}

/* The cpu backend keeps no state; any non-NULL token will do. */
static int cpu_ctx_token;

static int cpu_ctx_new(int device, void **ctx, const char **mode, char *err,
                       size_t errlen)
{
	(void)device;
	if (err && errlen)
		err[0] = '\0';
	*ctx = &cpu_ctx_token;
	if (mode)
		*mode = "memfd";
	return 0;
}

static void cpu_ctx_free(void *ctx)
{
	(void)ctx;
}

static enum kvt_backend_share cpu_share(void *ctx)
{
	(void)ctx;
	return KVT_BACKEND_SHARE_MEMFD;
}

static void cpu_chunk_clear(struct kvt_backend_chunk *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static int cpu_chunk_new(void *ctx, uint64_t bytes,
                         struct kvt_backend_chunk *out)
{
	(void)ctx;
	cpu_chunk_clear(out);
	if (bytes == 0 || bytes % (uint64_t)sysconf(_SC_PAGESIZE))
		return KVT_EINVAL;
	int fd = memfd_create("kvtrim-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return cpu_fail("memfd_create");
	/*
	 * Sealed against resizing so a client that holds the fd can never
	 * shrink it under the daemon's mapping (SIGBUS) nor grow it; F_SEAL_SEAL
	 * keeps anyone from changing the seals afterwards.
	 */
	if (ftruncate(fd, (off_t)bytes) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		int rv = cpu_fail("memfd size/seals");
		close(fd);
		return rv;
	}
	void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		int rv = cpu_fail("mmap chunk");
		close(fd);
		return rv;
	}
	out->fd = fd;
	out->base = base;
	out->bytes = bytes;
	return 0;
}

static void cpu_chunk_free(void *ctx, struct kvt_backend_chunk *c)
{
	(void)ctx;
	/*
	 * A live chunk always has a mapping; base NULL marks "no chunk" (a
	 * zeroed struct, or one already freed), whose fd must not be closed:
	 * fd 0 of a zeroed struct is somebody else's descriptor.
	 */
	if (c->base) {
		munmap(c->base, c->bytes ? c->bytes : KVT_CHUNK_BYTES);
		if (c->fd >= 0)
			close(c->fd);
	}
	cpu_chunk_clear(c);
}

static int cpu_chunk_import(void *ctx, int fd,
                            const uint8_t ipc[KVT_BACKEND_IPC_BYTES],
                            uint64_t bytes, struct kvt_backend_chunk *out)
{
	(void)ctx;
	(void)ipc;
	cpu_chunk_clear(out);
	if (fd < 0 || bytes == 0)
		return KVT_EINVAL;
	void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
		return cpu_fail("mmap imported chunk");
	out->base = base;
	out->bytes = bytes;
	return 0;
}

static void cpu_chunk_unmap(void *ctx, struct kvt_backend_chunk *c)
{
	(void)ctx;
	if (c->base)
		munmap(c->base, c->bytes);
	cpu_chunk_clear(c);
}

static int cpu_compact(void *ctx, const struct kvt_backend_compact *lists,
                       uint32_t n, void *stream)
{
	(void)ctx;
	(void)stream;
	for (uint32_t i = 0; i < n; i++)
		if (lists[i].n_moves)
			compact_cpu(lists[i].pages, lists[i].page_tokens,
			            lists[i].row_bytes, lists[i].moves,
			            lists[i].n_moves);
	return 0;
}

/* Host memory: a plain copy; there is no queued work to wait for. */
static int cpu_read_regions(void *ctx, void *dst, size_t dst_stride,
                            const void *const *src, uint32_t n, size_t bytes,
                            void *stream)
{
	(void)ctx;
	(void)stream;
	for (uint32_t i = 0; i < n; i++)
		memcpy((char *)dst + (size_t)i * dst_stride, src[i], bytes);
	return 0;
}

static const char *cpu_last_error(void)
{
	return cpu_err;
}

const struct kvt_backend_ops backend_cpu = {
	.abi = KVT_BACKEND_ABI,
	.name = "cpu",
	.host_visible = 1,
	.probe = cpu_probe,
	.device_count = cpu_device_count,
	.ctx_new = cpu_ctx_new,
	.ctx_free = cpu_ctx_free,
	.share = cpu_share,
	.chunk_new = cpu_chunk_new,
	.chunk_free = cpu_chunk_free,
	.chunk_import = cpu_chunk_import,
	.chunk_unmap = cpu_chunk_unmap,
	.compact = cpu_compact,
	.last_error = cpu_last_error,
	.read_regions = cpu_read_regions,
};
