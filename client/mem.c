/*
 * mem.c — mapping the tenant's segments and chunks; see mem.h.
 *
 * Device chunks (cuda backend) are imported through the same
 * libkvtrim-cuda.so the daemon uses, loaded here with dlopen on the first
 * packet that needs it, so libkvtrim itself never links CUDA and a host
 * tenant never loads it.
 */
#include "errors.h"
#include "mem.h"
#include "page.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* bases[slot] = base, remembering the slot for the device upload. */
static void base_set(struct mem *m, uint32_t slot, void *base)
{
	m->bases[slot] = base;
	if (m->dirty_lo >= m->dirty_hi) {
		m->dirty_lo = slot;
		m->dirty_hi = slot + 1;
	} else {
		if (slot < m->dirty_lo)
			m->dirty_lo = slot;
		if (slot + 1 > m->dirty_hi)
			m->dirty_hi = slot + 1;
	}
}

static void chunk_release(struct mem *m, uint32_t slot)
{
	struct mem_chunk *c = &m->chunks[slot];
	if (!m->bases[slot])
		return;
	if (c->dev)
		m->bops->chunk_unmap(m->bctx, &c->bc);
	else
		munmap(m->bases[slot], c->bytes);
	c->dev = c->ipc = 0;
	base_set(m, slot, NULL);
}

void mem_fini(struct mem *m)
{
	if (m->table)
		munmap(m->table, m->g.table_bytes);
	if (m->stage)
		munmap(m->stage, m->g.stage_bytes);
	for (uint32_t i = 0; i < m->n_chunks; i++)
		chunk_release(m, i);
	if (m->bops) {
		m->bops->chunk_unmap(m->bctx, &m->dtab);
		m->bops->chunk_unmap(m->bctx, &m->dstage);
		m->bops->mem_free(m->bctx, m->d_bases);
		m->d_bases = NULL;
		for (int i = 0; i < 2; i++)
			if (m->ev[i].ev)
				m->bops->event_free(m->bctx, &m->ev[i]);
		if (m->bctx)
			m->bops->ctx_free(m->bctx);
	}
	free(m->chunks);
	free(m->bases);
	free(m->acks);
	m->table = m->stage = NULL;
	m->chunks = NULL;
	m->bases = NULL;
	m->acks = NULL;
	m->n_chunks = m->n_acks = m->acks_cap = 0;
	m->n_dbases = m->dirty_lo = m->dirty_hi = 0;
	m->bops = NULL;
	m->bctx = NULL;
}

int mem_is_device(const struct mem *m) { return m->bops != NULL; }

/* dlopen of path, "" when it does not exist (not an error: try the next). */
static void *try_open(const char *path)
{
	return access(path, F_OK) == 0 ? dlopen(path, RTLD_NOW | RTLD_LOCAL)
	                               : NULL;
}

/*
 * Finds libkvtrim-cuda.so as kvtrimd does (backend.h): $KVTRIM_CUDA_LIB,
 * else next to libkvtrim itself (dladdr), next to the executable
 * ($ORIGIN/../lib), then the library path; checks the ABI and probes.
 */
static int cuda_open(struct mem *m, char *err, size_t errlen)
{
	char path[PATH_MAX + 32], exe[PATH_MAX];
	const char *env = getenv("KVTRIM_CUDA_LIB");
	void *h = NULL;
	Dl_info di;
	if (env && env[0]) {
		h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
	} else {
		if (dladdr((void *)cuda_open, &di) && di.dli_fname &&
		    strrchr(di.dli_fname, '/')) {
			snprintf(path, sizeof(path), "%.*s/%s",
			         (int)(strrchr(di.dli_fname, '/') - di.dli_fname),
			         di.dli_fname, KVT_BACKEND_CUDA_LIB);
			h = try_open(path);
		}
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		if (!h && n > 0) {
			exe[n] = '\0';
			char *slash = strrchr(exe, '/');
			if (slash) {
				*slash = '\0';
				snprintf(path, sizeof(path), "%s/../lib/%s", exe,
				         KVT_BACKEND_CUDA_LIB);
				h = try_open(path);
			}
		}
		if (!h)
			h = dlopen(KVT_BACKEND_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
	}
	if (!h) {
		const char *dl = dlerror();
		return errors_fmt(err, errlen, KVT_ENOTSUP, "the daemon shares device "
		            "memory but %s cannot be loaded: %s",
		            KVT_BACKEND_CUDA_LIB, dl ? dl : "not found");
	}
	/* Never dlclose'd: the CUDA runtime does not support unloading. */
	const struct kvt_backend_ops *ops = dlsym(h, KVT_BACKEND_CUDA_SYMBOL);
	if (!ops || ops->abi != KVT_BACKEND_ABI)
		return errors_fmt(err, errlen, KVT_ENOTSUP, "%s: no backend of ABI %u",
		            KVT_BACKEND_CUDA_LIB, KVT_BACKEND_ABI);
	char why[256];
	const char *mode = NULL;
	why[0] = '\0';
	if (ops->probe(why, sizeof(why)))
		return errors_fmt(err, errlen, KVT_ENOTSUP, "cuda backend: %s", why);
	/* Device 0: the daemon's device (docs/cuda.md: both processes must
	 * see the same GPU first, e.g. the same CUDA_VISIBLE_DEVICES). */
	int rc = ops->ctx_new(0, &m->bctx, &mode, why, sizeof(why));
	if (rc)
		return errors_fmt(err, errlen, rc, "cuda backend: %s", why);
	m->bops = ops;
	return 0;
}

int mem_ready(const struct mem *m)
{
	return m->table && m->stage && (!m->bops || m->dtab.base);
}

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
		return errors_fmt(err, errlen, KVT_ESYS, "fstat of a segment: %s",
		            strerror(errno));
	if (st.st_size < 0 || (uint64_t)st.st_size < bytes)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "segment file holds %llu bytes, %llu announced",
		            (unsigned long long)st.st_size,
		            (unsigned long long)bytes);
	void *p = mmap(NULL, bytes, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return errors_fmt(err, errlen, KVT_ESYS, "mmap of %llu bytes: %s",
		            (unsigned long long)bytes, strerror(errno));
	*out = p;
	return 0;
}

/* Queues a CHUNK_CLOSED confirmation (client.c sends them). */
static int ack_push(struct mem *m, uint64_t serial)
{
	if (m->n_acks == m->acks_cap) {
		uint32_t n = m->acks_cap ? 2 * m->acks_cap : 8;
		uint64_t *a = realloc(m->acks, n * sizeof(*a));
		if (!a)
			return KVT_ENOMEM;
		m->acks = a;
		m->acks_cap = n;
	}
	m->acks[m->n_acks++] = serial;
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
	m->chunks = c;
	void **b = realloc(m->bases, n * sizeof(*b));
	if (!b)
		return KVT_ENOMEM; /* chunks[] grew; n_chunks did not: fine */
	m->bases = b;
	memset(c + m->n_chunks, 0, (n - m->n_chunks) * sizeof(*c));
	memset(b + m->n_chunks, 0, (n - m->n_chunks) * sizeof(*b));
	m->n_chunks = (uint32_t)n;
	return 0;
}

/* Unmaps chunk slot (a CHUNK_REVOKE, or one bit of a CHUNK_REVOKE_SET);
 * a legacy IPC chunk's cookie is acknowledged (CHUNK_CLOSED). */
static int chunk_revoke(struct mem *m, uint32_t slot, uint64_t cookie,
                        char *err, size_t errlen)
{
	if (slot >= m->max_chunks)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "revoke of chunk slot %u beyond the quota's %u slots",
		            slot, m->max_chunks);
	if (slot < m->n_chunks && m->bases[slot]) {
		int ipc = m->chunks[slot].ipc;
		chunk_release(m, slot);
		int rc;
		if (ipc && (rc = ack_push(m, cookie)))
			return errors_fmt(err, errlen, rc, "out of memory");
	}
	return 0;
}

/*
 * The daemon's device copy of the table, mapped read-only where the sharing
 * mode allows it (vmm): only kvtrimd writes it.  Legacy IPC maps it
 * read-write (it has no read-only mapping); mem_copy still refuses it as a
 * destination, and kvtrimd never reads this copy back for its own work.
 */
static int table_import(struct mem *m, int fd, const uint8_t *ipc,
                        uint64_t bytes)
{
	if (m->bops->chunk_import_ro)
		return m->bops->chunk_import_ro(m->bctx, fd, ipc, bytes, &m->dtab,
		                                NULL);
	return m->bops->chunk_import(m->bctx, fd, ipc, bytes, &m->dtab);
}

/*
 * One helper per handle packet type, called by apply below.  Each checks the
 * packet's slot and size before it maps, imports or releases anything, and
 * returns 0 or a KVT_E* code with the reason in err.
 */

/* HANDLE_TABLE: maps the host table read-only, once, after checking its
 * size and header against the registered geometry. */
static int apply_table(struct mem *m, const struct handle_msg *h, int fd,
                       char *err, size_t errlen)
{
	const struct shm_geom *g = &m->g;
	int rc;

	if (m->table)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "second table segment");
	if (fd < 0 || h->size != g->table_bytes)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "table segment of %llu bytes, expected %llu",
		            (unsigned long long)h->size,
		            (unsigned long long)g->table_bytes);
	if ((rc = map_fd(fd, h->size, PROT_READ, &m->table, err, errlen)))
		return rc;
	if (shm_table_check(m->table, g)) {
		munmap(m->table, g->table_bytes);
		m->table = NULL;
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "table header does not match the registered "
		            "geometry");
	}
	return 0;
}

/* HANDLE_STAGE: maps the host staging segment read-write, once, after
 * checking its size and header against the geometry. */
static int apply_stage(struct mem *m, const struct handle_msg *h, int fd,
                       char *err, size_t errlen)
{
	const struct shm_geom *g = &m->g;
	int rc;

	if (m->stage)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "second staging segment");
	if (fd < 0 || h->size != g->stage_bytes)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "staging segment of %llu bytes, expected %llu",
		            (unsigned long long)h->size,
		            (unsigned long long)g->stage_bytes);
	if ((rc = map_fd(fd, h->size, PROT_READ | PROT_WRITE, &m->stage, err,
	                 errlen)))
		return rc;
	if (shm_stage_check(m->stage, g)) {
		munmap(m->stage, g->stage_bytes);
		m->stage = NULL;
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "staging header does not match the registered "
		            "geometry and the policy's inputs");
	}
	return 0;
}

/* HANDLE_CHUNK_ADD: maps a host chunk into its slot, replacing whatever
 * the slot held. */
static int apply_chunk_add(struct mem *m, const struct handle_msg *h, int fd,
                           char *err, size_t errlen)
{
	int rc;
	void *base;

	if (h->slot >= m->max_chunks)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "chunk slot %u beyond the quota's %u slots",
		            h->slot, m->max_chunks);
	if (fd < 0 || h->size != KVT_CHUNK_BYTES)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "chunk of %llu bytes, expected %llu",
		            (unsigned long long)h->size,
		            (unsigned long long)KVT_CHUNK_BYTES);
	if ((rc = grow(m, h->slot)))
		return errors_fmt(err, errlen, rc,
		            "no memory for chunk slot %u", h->slot);
	/* Packets come in order: a grant into an occupied slot replaces a
	 * chunk that was revoked in the same breath. */
	chunk_release(m, h->slot);
	if ((rc = map_fd(fd, h->size, PROT_READ | PROT_WRITE, &base, err,
	                 errlen)))
		return rc;
	m->chunks[h->slot].bytes = h->size;
	base_set(m, h->slot, base);
	return 0;
}

/* HANDLE_CHUNK_REVOKE_SET: unmaps every slot whose bit is set in x->data,
 * the slots counted from h->slot. */
static int apply_revoke_set(struct mem *m, const struct handle_ext *x,
                            char *err, size_t errlen)
{
	const struct handle_msg *h = &x->h;
	int rc;

	/* Checked whole before any chunk goes: a bad packet changes
	 * nothing. */
	if (h->slot % HANDLE_REVOKE_SET_SLOTS)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "revoke set at slot %u, not a multiple of %u",
		            h->slot, HANDLE_REVOKE_SET_SLOTS);
	for (uint32_t i = 0; i < HANDLE_REVOKE_SET_SLOTS; i++)
		if ((x->data[i / 8] >> (i % 8) & 1) &&
		    (uint64_t)h->slot + i >= m->max_chunks)
			return errors_fmt(err, errlen, KVT_EPROTO,
			            "revoke of chunk slot %llu beyond the "
			            "quota's %u slots",
			            (unsigned long long)h->slot + i,
			            m->max_chunks);
	for (uint32_t i = 0; i < HANDLE_REVOKE_SET_SLOTS; i++)
		if ((x->data[i / 8] >> (i % 8) & 1) &&
		    (rc = chunk_revoke(m, h->slot + i, 0, err, errlen)))
			return rc;
	return 0;
}

/* HANDLE_EVENT: opens the daemon's event for slot h->slot, once, loading
 * the cuda backend on first use. */
static int apply_event(struct mem *m, const struct handle_ext *x, char *err,
                       size_t errlen)
{
	const struct handle_msg *h = &x->h;
	int rc;

	if (h->slot > HANDLE_EVENT_COMPACT || m->ev[h->slot].ev)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "event packet for slot %u", h->slot);
	if (!m->bops && (rc = cuda_open(m, err, errlen)))
		return rc;
	if ((rc = m->bops->event_open(m->bctx, x->data, &m->ev[h->slot])))
		return errors_fmt(err, errlen, rc, "cuda backend: %s",
		            m->bops->last_error());
	return 0;
}

/* HANDLE_CHUNK_DEV: imports a device chunk into its slot (by fd, or by
 * legacy IPC handle in x->data when fd < 0), replacing what it held. */
static int apply_chunk_dev(struct mem *m, const struct handle_ext *x, int fd,
                           char *err, size_t errlen)
{
	const struct handle_msg *h = &x->h;
	int rc;

	if (h->slot >= m->max_chunks)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "chunk slot %u beyond the quota's %u slots",
		            h->slot, m->max_chunks);
	if (h->size != KVT_CHUNK_BYTES)
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "chunk of %llu bytes, expected %llu",
		            (unsigned long long)h->size,
		            (unsigned long long)KVT_CHUNK_BYTES);
	if (!m->bops && (rc = cuda_open(m, err, errlen)))
		return rc;
	if ((rc = grow(m, h->slot)))
		return errors_fmt(err, errlen, rc,
		            "no memory for chunk slot %u", h->slot);
	chunk_release(m, h->slot);
	struct mem_chunk *c = &m->chunks[h->slot];
	if ((rc = m->bops->chunk_import(m->bctx, fd, x->data, h->size,
	                                &c->bc)))
		return errors_fmt(err, errlen, rc, "importing a device "
		            "chunk: %s", m->bops->last_error());
	c->bytes = h->size;
	c->dev = 1;
	c->ipc = fd < 0;
	base_set(m, h->slot, c->bc.base);
	return 0;
}

/* HANDLE_TABLE_DEV: imports the device table, once, with a device array
 * of h->slot chunk bases; h->slot becomes the last grantable slot. */
static int apply_table_dev(struct mem *m, const struct handle_ext *x, int fd,
                           char *err, size_t errlen)
{
	const struct handle_msg *h = &x->h;
	const struct shm_geom *g = &m->g;
	int rc;

	if (m->dtab.base)
		return errors_fmt(err, errlen, KVT_EPROTO,
		                  "second device table");
	if (h->size != g->table_bytes || !h->slot || h->slot > m->max_chunks)
		return errors_fmt(err, errlen, KVT_EPROTO,
		                  "device table of %llu bytes for %u chunk "
		                  "slots, expected %llu bytes and at most "
		                  "%u slots", (unsigned long long)h->size,
		                  h->slot,
		                  (unsigned long long)g->table_bytes,
		                  m->max_chunks);
	if (!m->bops && (rc = cuda_open(m, err, errlen)))
		return rc;
	/* The allocation is whole chunks (the granularity). */
	uint64_t bytes = shm_whole_chunks(h->size);
	void *db = NULL; /* [h->slot] device chunk bases */
	if ((rc = m->bops->mem_new(m->bctx, (size_t)h->slot * sizeof(void *),
	                           &db)))
		return errors_fmt(err, errlen, rc, "chunk-base array: "
		                  "%s", m->bops->last_error());
	if ((rc = table_import(m, fd, x->data, bytes))) {
		m->bops->mem_free(m->bctx, db);
		return errors_fmt(err, errlen, rc, "importing the "
		                  "device table: %s",
		                  m->bops->last_error());
	}
	m->d_bases = db;
	m->n_dbases = h->slot;
	/* The daemon's slots end there: nothing beyond can be granted, so
	 * the host arrays need not grow further. */
	m->max_chunks = h->slot;
	return 0;
}

/* HANDLE_STAGE_DEV: imports the device staging segment, once. */
static int apply_stage_dev(struct mem *m, const struct handle_ext *x, int fd,
                           char *err, size_t errlen)
{
	const struct handle_msg *h = &x->h;
	const struct shm_geom *g = &m->g;
	int rc;

	if (m->dstage.base)
		return errors_fmt(err, errlen, KVT_EPROTO,
		                  "second device staging segment");
	if (h->size != g->stage_bytes || !g->stage_entry_floats)
		return errors_fmt(err, errlen, KVT_EPROTO,
		                  "device staging segment of %llu bytes, "
		                  "expected %llu (and staged inputs)",
		                  (unsigned long long)h->size,
		                  (unsigned long long)g->stage_bytes);
	if (!m->bops && (rc = cuda_open(m, err, errlen)))
		return rc;
	if ((rc = m->bops->chunk_import(m->bctx, fd, x->data,
	                                shm_whole_chunks(h->size),
	                                &m->dstage)))
		return errors_fmt(err, errlen, rc, "importing the device "
		                  "staging segment: %s",
		                  m->bops->last_error());
	return 0;
}

/* Applies one handle packet (fd: its descriptor, or -1 when it carries
 * none); 0, or a KVT_E* code with the reason in err. */
static int apply(struct mem *m, const struct handle_ext *x, int fd, char *err,
                 size_t errlen)
{
	const struct handle_msg *h = &x->h;

	switch (h->type) {
	case HANDLE_TABLE:
		return apply_table(m, h, fd, err, errlen);
	case HANDLE_STAGE:
		return apply_stage(m, h, fd, err, errlen);
	case HANDLE_CHUNK_ADD:
		return apply_chunk_add(m, h, fd, err, errlen);
	case HANDLE_CHUNK_REVOKE:
		return chunk_revoke(m, h->slot, h->cookie, err, errlen);
	case HANDLE_CHUNK_REVOKE_SET:
		return apply_revoke_set(m, x, err, errlen);
	case HANDLE_EVENT:
		return apply_event(m, x, err, errlen);
	case HANDLE_CHUNK_DEV:
		return apply_chunk_dev(m, x, fd, err, errlen);
	case HANDLE_TABLE_DEV:
		return apply_table_dev(m, x, fd, err, errlen);
	case HANDLE_STAGE_DEV:
		return apply_stage_dev(m, x, fd, err, errlen);
	default:
		return errors_fmt(err, errlen, KVT_EPROTO,
		            "unexpected handle packet type %u",
		            (unsigned)h->type);
	}
}

int mem_overlaps(const void *p, size_t n, const void *base, uint64_t len)
{
	uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
	return base && n && len && a < b + len && b < a + n;
}

int mem_in_table(const struct mem *m, const void *p, size_t bytes)
{
	return mem_overlaps(p, bytes, m->table, m->g.table_bytes) ||
	       mem_overlaps(p, bytes, m->dtab.base, m->g.table_bytes);
}

static int copy_check(const struct mem *m, const void *dst, size_t bytes,
                      char *err, size_t errlen)
{
	if (mem_in_table(m, dst, bytes))
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "the destination %p + %zu bytes lies in the "
		                  "table (kvt_table_view, kvt_list_get), which "
		                  "only kvtrimd writes", dst, bytes);
	return 0;
}

int mem_copy(struct mem *m, void *dst, const void *src, size_t bytes,
             void *stream, char *err, size_t errlen)
{
	int rc = copy_check(m, dst, bytes, err, errlen);
	if (rc)
		return rc;
	if (!m->bops) {
		memmove(dst, src, bytes);
		return 0;
	}
	rc = m->bops->copy(m->bctx, dst, src, bytes, stream);
	if (rc < 0)
		return errors_fmt(err, errlen, rc, "cuda backend: %s",
		                  m->bops->last_error());
	return 0;
}

int mem_attention(struct mem *m, const struct kvt_backend_attention *a,
                  void *stream, char *err, size_t errlen)
{
	if (!m->bops || !m->bops->attention)
		return errors_fmt(err, errlen, KVT_ENOTSUP, "no device "
		                  "attention in this backend");
	int rc = m->bops->attention(m->bctx, a, stream);
	if (rc < 0)
		return errors_fmt(err, errlen, rc, "cuda backend: %s",
		                  m->bops->last_error());
	return 0;
}

int mem_buffer_new(struct mem *m, size_t bytes, void **out, char *err,
                   size_t errlen)
{
	*out = NULL;
	if (m->bops) {
		int rc = m->bops->mem_new(m->bctx, bytes, out);
		if (rc < 0)
			return errors_fmt(err, errlen, rc, "cuda backend: %s",
			                  m->bops->last_error());
		return 0;
	}
	/* aligned_alloc wants a multiple of the alignment; 64 bytes is a
	 * cache line and what the CPU kernels' vector loads like. */
	size_t whole = (bytes + 63) & ~(size_t)63;
	void *p = whole >= bytes ? aligned_alloc(64, whole) : NULL;
	if (!p)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory for %zu "
		                  "bytes", bytes);
	memset(p, 0, whole);
	*out = p;
	return 0;
}

void mem_buffer_free(struct mem *m, void *p, int dev)
{
	if (!dev)
		free(p);
	else if (m->bops)
		m->bops->mem_free(m->bctx, p);
}

int mem_device_after(struct mem *m, void *stream, char *err, size_t errlen)
{
	if (!m->bops)
		return 0;
	if (m->dirty_lo < m->dirty_hi) {
		if (!m->d_bases || m->dirty_hi > m->n_dbases)
			return errors_fmt(err, errlen, KVT_EPROTO, "chunk slot %u "
			                  "beyond the device table's %u slots",
			                  m->dirty_hi - 1, m->n_dbases);
		struct kvt_backend_region r = {
			.off = (uint64_t)m->dirty_lo * sizeof(void *),
			.bytes = (uint64_t)(m->dirty_hi - m->dirty_lo) *
			         sizeof(void *),
		};
		/* bases and d_bases share offsets: upload_regions copies
		 * host + off to dev + off. */
		int rc = m->bops->upload_regions(m->bctx, m->d_bases, m->bases,
		                                 &r, 1, stream);
		if (rc)
			return errors_fmt(err, errlen, rc, "cuda backend: %s",
			                  m->bops->last_error());
		m->dirty_lo = m->dirty_hi = 0;
	}
	return mem_wait_compact(m, stream, err, errlen);
}

int mem_table_view(const struct mem *m, struct kvt_table_view *out)
{
	const struct shm_geom *g = &m->g;
	if (!mem_ready(m))
		return KVT_EPROTO;
	const char *t = m->bops ? (const char *)m->dtab.base
	                        : (const char *)m->table;
	uint64_t roff = (uint64_t)((const char *)shm_list_at(m->table, g, 0,
	                                                       0, 0) -
	                           (const char *)m->table);
	*out = (struct kvt_table_view){
		.table = t,
		.records_offset = roff,
		.list_stride = g->list_stride,
		.max_seqs = g->max_seqs,
		.n_layers = g->n_layers,
		.n_kv_heads = g->n_kv_heads,
		.max_pages = g->max_pages,
		.chunk_bases = m->bops ? (void *const *)m->d_bases
		                       : (void *const *)m->bases,
		.n_chunk_slots = m->bops ? m->n_dbases : m->n_chunks,
		.pages_per_chunk = g->pages_per_chunk,
		.page_bytes = g->page_bytes,
	};
	return 0;
}

int mem_record_writes(struct mem *m, void *stream, char *err, size_t errlen)
{
	if (!m->bops)
		return 0;
	if (!m->ev[HANDLE_EVENT_WRITES].ev)
		return errors_fmt(err, errlen, KVT_EPROTO, "no writes event from "
		            "kvtrimd");
	int rc = m->bops->event_record(m->bctx, &m->ev[HANDLE_EVENT_WRITES],
	                               stream);
	return rc ? errors_fmt(err, errlen, rc, "cuda backend: %s",
	                 m->bops->last_error())
	          : 0;
}

int mem_wait_compact(struct mem *m, void *stream, char *err, size_t errlen)
{
	if (!m->bops)
		return 0;
	if (!m->ev[HANDLE_EVENT_COMPACT].ev)
		return errors_fmt(err, errlen, KVT_EPROTO, "no compaction event from "
		            "kvtrimd");
	int rc = m->bops->stream_wait_event(m->bctx, stream,
	                                    &m->ev[HANDLE_EVENT_COMPACT]);
	return rc ? errors_fmt(err, errlen, rc, "cuda backend: %s",
	                 m->bops->last_error())
	          : 0;
}

int mem_apply(struct mem *m, const struct handle_ext *h, int fd, char *err,
              size_t errlen)
{
	int rc = apply(m, h, fd, err, errlen);
	if (fd >= 0)
		close(fd);
	return rc;
}

int mem_apply_fds(struct mem *m, const struct handle_ext *h, const int *fds,
                  uint32_t n, char *err, size_t errlen)
{
	if (!handle_is_set(h->h.type))
		return mem_apply(m, h, n ? fds[0] : -1, err, errlen);
	/* A grant set: each chunk as its own CHUNK_ADD / CHUNK_DEV, in slot
	 * order (handle_recv_set checked one fd per bit).  The first error
	 * is kept; the other chunks still map. */
	int first = 0;
	uint32_t k = 0;
	for (uint32_t bit = 0; bit < HANDLE_SET_SLOTS && k < n; bit++) {
		if (!(h->data[bit / 8] & (1u << (bit % 8))))
			continue;
		struct handle_ext one = {.h = h->h};
		one.h.type = handle_set_member(h->h.type);
		one.h.slot = h->h.slot + bit;
		int rc = mem_apply(m, &one, fds[k++], err, errlen);
		if (rc && !first)
			first = rc;
	}
	return first;
}

void *mem_page(const struct mem *m, uint32_t page)
{
	uint32_t slot = page_chunk(page, m->g.pages_per_chunk);
	if (slot >= m->n_chunks || !m->bases[slot])
		return NULL;
	return (char *)m->bases[slot] +
	       page_offset(page, m->g.pages_per_chunk, m->g.page_bytes);
}
