/*
 * pool.c — the daemon's KV memory pool (CPU backend): one sealed memfd per
 * 2 MiB chunk; see pool.h.
 *
 * The pool only counts chunks against its capacity; which tenant owns a
 * chunk and which pages inside it are free is the tenant's business.
 */
#include "pool.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int pool_init(struct pool *p, uint64_t pool_bytes)
{
	memset(p, 0, sizeof(*p));
	if (pool_bytes < KVT_CHUNK_BYTES)
		return KVT_EINVAL;
	p->chunk_capacity = pool_bytes / KVT_CHUNK_BYTES;
	return 0;
}

int pool_chunk_new(struct pool *p, struct pool_chunk *out)
{
	out->fd = -1;
	out->base = NULL;
	out->bytes = 0;
	if (p->chunks_used >= p->chunk_capacity)
		return KVT_EPOOLFULL;

	int fd = memfd_create("kvtrim-chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return KVT_ESYS;
	/*
	 * Sealed against resizing so a client that holds the fd can never
	 * shrink it under the daemon's mapping (SIGBUS) nor grow it; F_SEAL_SEAL
	 * keeps anyone from changing the seals afterwards.
	 */
	if (ftruncate(fd, (off_t)KVT_CHUNK_BYTES) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		close(fd);
		return KVT_ESYS;
	}
	void *base = mmap(NULL, KVT_CHUNK_BYTES, PROT_READ | PROT_WRITE,
	                  MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		close(fd);
		return KVT_ESYS;
	}
	out->fd = fd;
	out->base = base;
	out->bytes = KVT_CHUNK_BYTES;
	p->chunks_used++;
	p->chunks_created_total++;
	return 0;
}

void pool_chunk_free(struct pool *p, struct pool_chunk *c)
{
	/*
	 * A live chunk always has a mapping; base NULL marks "no chunk" (a
	 * zeroed struct, or one already freed), whose fd must not be closed:
	 * fd 0 of a zeroed struct is somebody else's descriptor.
	 */
	if (c->base) {
		munmap(c->base, c->bytes ? c->bytes : KVT_CHUNK_BYTES);
		if (c->fd >= 0)
			close(c->fd);
		if (p->chunks_used)
			p->chunks_used--;
		p->chunks_released_total++;
	}
	c->fd = -1;
	c->base = NULL;
	c->bytes = 0;
}

uint64_t pool_bytes_total(const struct pool *p)
{
	return p->chunk_capacity * KVT_CHUNK_BYTES;
}
