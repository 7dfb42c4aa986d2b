/* mem.c — mapping the tenant's segments and chunks; see mem.h. */
#include "mem.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

__attribute__((format(printf, 4, 5))) static int
fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

int mem_init(struct mem *m, const struct shm_geom *g, uint64_t quota_bytes)
{
	memset(m, 0, sizeof(*m));
	if (!g->page_bytes || !g->pages_per_chunk)
		return KVT_EINVAL;
	m->g = *g;
	/* Page ids are uint32: slots beyond 2^32 / pages_per_chunk could
	 * never be addressed, so a larger quota changes nothing here.  A
	 * quota of 0 (none reported) bounds nothing either. */
	uint64_t addressable = ((uint64_t)UINT32_MAX + 1) / g->pages_per_chunk;
	uint64_t slots = quota_bytes ? quota_bytes / KVT_CHUNK_BYTES
	                             : addressable;
	m->max_chunks = (uint32_t)(slots < addressable ? slots : addressable);
	return 0;
}

void mem_fini(struct mem *m)
{
	if (m->table)
		munmap(m->table, m->g.table_bytes);
	if (m->stage)
		munmap(m->stage, m->g.stage_bytes);
	for (uint32_t i = 0; i < m->n_chunks; i++)
		if (m->chunks[i].base)
			munmap(m->chunks[i].base, m->chunks[i].bytes);
	free(m->chunks);
	m->table = m->stage = NULL;
	m->chunks = NULL;
	m->n_chunks = 0;
}

int mem_ready(const struct mem *m) { return m->table && m->stage; }

/*
 * Maps fd after checking the file really holds `bytes`: touching a shared
 * mapping beyond the end of its file raises SIGBUS in the engine, far from
 * the cause, so a short file is refused here instead.
 */
static int map_fd(int fd, uint64_t bytes, int prot, void **out, char *err,
                  size_t errlen)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return fail(err, errlen, KVT_ESYS, "fstat of a segment: %s",
		            strerror(errno));
	if (st.st_size < 0 || (uint64_t)st.st_size < bytes)
		return fail(err, errlen, KVT_EPROTO,
		            "segment file holds %llu bytes, %llu announced",
		            (unsigned long long)st.st_size,
		            (unsigned long long)bytes);
	void *p = mmap(NULL, bytes, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return fail(err, errlen, KVT_ESYS, "mmap of %llu bytes: %s",
		            (unsigned long long)bytes, strerror(errno));
	*out = p;
	return 0;
}

/* Makes chunks[] hold at least slot + 1 entries (zeroed when new). */
static int grow(struct mem *m, uint32_t slot)
{
	if (slot < m->n_chunks)
		return 0;
	uint64_t n = m->n_chunks ? m->n_chunks : 16;
	while (n <= slot)
		n *= 2;
	if (n > m->max_chunks)
		n = m->max_chunks;
	struct mem_chunk *c = realloc(m->chunks, n * sizeof(*c));
	if (!c)
		return KVT_ENOMEM;
	memset(c + m->n_chunks, 0, (n - m->n_chunks) * sizeof(*c));
	m->chunks = c;
	m->n_chunks = (uint32_t)n;
	return 0;
}

static int apply(struct mem *m, const struct handle_msg *h, int fd, char *err,
                 size_t errlen)
{
	const struct shm_geom *g = &m->g;
	int rc;

	switch (h->type) {
	case HANDLE_TABLE:
		if (m->table)
			return fail(err, errlen, KVT_EPROTO,
			            "second table segment");
		if (fd < 0 || h->size != g->table_bytes)
			return fail(err, errlen, KVT_EPROTO,
			            "table segment of %llu bytes, expected %llu",
			            (unsigned long long)h->size,
			            (unsigned long long)g->table_bytes);
		if ((rc = map_fd(fd, h->size, PROT_READ, &m->table, err,
		                 errlen)))
			return rc;
		if (shm_table_check(m->table, g)) {
			munmap(m->table, g->table_bytes);
			m->table = NULL;
			return fail(err, errlen, KVT_EPROTO,
			            "table header does not match the registered "
			            "geometry");
		}
		return 0;
	case HANDLE_STAGE:
		if (m->stage)
			return fail(err, errlen, KVT_EPROTO,
			            "second staging segment");
		if (fd < 0 || h->size != g->stage_bytes)
			return fail(err, errlen, KVT_EPROTO,
			            "staging segment of %llu bytes, expected %llu",
			            (unsigned long long)h->size,
			            (unsigned long long)g->stage_bytes);
		return map_fd(fd, h->size, PROT_READ | PROT_WRITE, &m->stage,
		              err, errlen);
	case HANDLE_CHUNK_ADD:
		if (h->slot >= m->max_chunks)
			return fail(err, errlen, KVT_EPROTO,
			            "chunk slot %u beyond the quota's %u slots",
			            h->slot, m->max_chunks);
		if (fd < 0 || h->size != KVT_CHUNK_BYTES)
			return fail(err, errlen, KVT_EPROTO,
			            "chunk of %llu bytes, expected %llu",
			            (unsigned long long)h->size,
			            (unsigned long long)KVT_CHUNK_BYTES);
		if ((rc = grow(m, h->slot)))
			return fail(err, errlen, rc,
			            "no memory for chunk slot %u", h->slot);
		/* Packets come in order: a grant into an occupied slot
		 * replaces a chunk that was revoked in the same breath. */
		if (m->chunks[h->slot].base) {
			munmap(m->chunks[h->slot].base,
			       m->chunks[h->slot].bytes);
			m->chunks[h->slot].base = NULL;
		}
		if ((rc = map_fd(fd, h->size, PROT_READ | PROT_WRITE,
		                 &m->chunks[h->slot].base, err, errlen)))
			return rc;
		m->chunks[h->slot].bytes = h->size;
		return 0;
	case HANDLE_CHUNK_REVOKE:
		if (h->slot >= m->max_chunks)
			return fail(err, errlen, KVT_EPROTO,
			            "revoke of chunk slot %u beyond the quota's "
			            "%u slots", h->slot, m->max_chunks);
		if (h->slot < m->n_chunks && m->chunks[h->slot].base) {
			munmap(m->chunks[h->slot].base,
			       m->chunks[h->slot].bytes);
			m->chunks[h->slot].base = NULL;
		}
		return 0;
	default:
		return fail(err, errlen, KVT_EPROTO,
		            "unexpected handle packet type %u",
		            (unsigned)h->type);
	}
}

int mem_apply(struct mem *m, const struct handle_msg *h, int fd, char *err,
              size_t errlen)
{
	int rc = apply(m, h, fd, err, errlen);
	if (fd >= 0)
		close(fd);
	return rc;
}

void *mem_page(const struct mem *m, uint32_t page)
{
	uint32_t slot = page / m->g.pages_per_chunk;
	if (slot >= m->n_chunks || !m->chunks[slot].base)
		return NULL;
	return (char *)m->chunks[slot].base +
	       (uint64_t)(page % m->g.pages_per_chunk) * m->g.page_bytes;
}
