/*
 * mem_test.c — libkvtrim's mapping of handle packets (client/mem.c) on its
 * own: packets that break the contract are refused before they touch
 * anything (no CUDA is loaded for a malformed device packet), and the
 * chunk-base array behind kvt_table_view follows grants and revocations.
 * Expected values are the test's own memfds and arithmetic.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mem.h"
#include "test.h"

static struct shm_geom geom(void)
{
	struct shm_geom g;
	char why[128];
	struct kvt_geometry geo = {2, 4, 2, 8, 32};
	T_OK(shm_geom_init(&g, &geo, KVT_DTYPE_F32, 4, 2, 16, 4, 0,
	                   SHM_STAGE_ALL, why, sizeof(why)));
	return g;
}

static struct handle_ext pkt(uint16_t type, uint32_t slot, uint64_t size)
{
	struct handle_ext x;
	memset(&x, 0, sizeof(x));
	x.h.magic = HANDLE_MAGIC;
	x.h.type = type;
	x.h.slot = slot;
	x.h.size = size;
	return x;
}

/* A memfd of bytes, as the daemon's chunks are. */
static int memfd_of(uint64_t bytes)
{
	int fd = memfd_create("test-chunk", MFD_CLOEXEC);
	T_ASSERT(fd >= 0);
	T_ASSERT(ftruncate(fd, (off_t)bytes) == 0);
	return fd;
}

TEST(mem, malformed_device_table_is_refused_before_cuda)
{
	struct mem m;
	struct shm_geom g = geom();
	char err[256];
	/* quota of 4 chunks: slots 0..3 */
	T_OK(mem_init(&m, &g, 4ull * KVT_CHUNK_BYTES));
	struct handle_ext x = pkt(HANDLE_TABLE_DEV, 4, g.table_bytes + 4);
	T_ERR(mem_apply(&m, &x, -1, err, sizeof(err)), KVT_EPROTO);
	T_ASSERT(strstr(err, "device table"));
	x = pkt(HANDLE_TABLE_DEV, 0, g.table_bytes); /* no slots */
	T_ERR(mem_apply(&m, &x, -1, err, sizeof(err)), KVT_EPROTO);
	x = pkt(HANDLE_TABLE_DEV, 5, g.table_bytes); /* beyond the quota */
	T_ERR(mem_apply(&m, &x, -1, err, sizeof(err)), KVT_EPROTO);
	/* nothing was loaded or mapped */
	T_ASSERT(!mem_is_device(&m));
	T_ASSERT(!mem_ready(&m));
	struct kvt_table_view v;
	T_ERR(mem_table_view(&m, &v), KVT_EPROTO);
	mem_fini(&m);
}

TEST(mem, chunk_bases_follow_grants_and_revocations)
{
	struct mem m;
	struct shm_geom g = geom();
	char err[256];
	T_OK(mem_init(&m, &g, 4ull * KVT_CHUNK_BYTES));

	/* table and staging segments, zeroed then given a header */
	int tfd = memfd_of(g.table_bytes), sfd = memfd_of(g.stage_bytes);
	void *tm = mmap(NULL, g.table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
	                tfd, 0);
	T_ASSERT(tm != MAP_FAILED);
	shm_table_init(tm, &g);
	struct handle_ext x = pkt(HANDLE_TABLE, 0, g.table_bytes);
	T_OK(mem_apply(&m, &x, tfd, err, sizeof(err)));
	/* A staging header that does not match the geometry (zeroed) is
	 * refused, like a table's; the daemon's is taken. */
	x = pkt(HANDLE_STAGE, 0, g.stage_bytes);
	T_ERR(mem_apply(&m, &x, sfd, err, sizeof(err)), KVT_EPROTO);
	T_ASSERT(strstr(err, "staging header"));
	sfd = memfd_of(g.stage_bytes); /* mem_apply took the first */
	void *sm = mmap(NULL, g.stage_bytes, PROT_READ | PROT_WRITE,
	                MAP_SHARED, sfd, 0);
	T_ASSERT(sm != MAP_FAILED);
	shm_stage_init(sm, &g);
	munmap(sm, g.stage_bytes);
	T_OK(mem_apply(&m, &x, sfd, err, sizeof(err)));
	T_ASSERT(mem_ready(&m));

	/* chunks in slots 2 and 0 */
	x = pkt(HANDLE_CHUNK_ADD, 2, KVT_CHUNK_BYTES);
	T_OK(mem_apply(&m, &x, memfd_of(KVT_CHUNK_BYTES), err, sizeof(err)));
	x = pkt(HANDLE_CHUNK_ADD, 0, KVT_CHUNK_BYTES);
	T_OK(mem_apply(&m, &x, memfd_of(KVT_CHUNK_BYTES), err, sizeof(err)));
	/* a grant beyond the quota changes nothing */
	x = pkt(HANDLE_CHUNK_ADD, 4, KVT_CHUNK_BYTES);
	int bad = memfd_of(KVT_CHUNK_BYTES);
	T_ERR(mem_apply(&m, &x, bad, err, sizeof(err)), KVT_EPROTO);

	struct kvt_table_view v;
	T_OK(mem_table_view(&m, &v));
	/* the client's own mapping of the same segment */
	T_ASSERT(memcmp(v.table, tm, sizeof(struct shm_table_hdr)) == 0);
	T_EQ(v.pages_per_chunk, (uint32_t)(KVT_CHUNK_BYTES / g.page_bytes));
	T_EQ_U64(v.page_bytes, 2ull * 4 * 8 * 4);
	T_ASSERT(v.n_chunk_slots >= 3 && v.n_chunk_slots <= 4);
	T_ASSERT(v.chunk_bases[0] != NULL);
	T_ASSERT(v.chunk_bases[1] == NULL);
	T_ASSERT(v.chunk_bases[2] != NULL);
	/* page id -> address as kvtrim.h says, for the first page of slot 2
	 * and the last page of slot 0 */
	uint32_t ppc = v.pages_per_chunk;
	T_ASSERT(mem_page(&m, 2 * ppc) == v.chunk_bases[2]);
	T_ASSERT(mem_page(&m, ppc - 1) ==
	         (char *)v.chunk_bases[0] + (uint64_t)(ppc - 1) * v.page_bytes);
	/* the record offset: the header, then record 0 */
	T_EQ_U64(v.records_offset, (uint64_t)((char *)shm_list_at(tm, &g, 0,
	                                                           0, 0) -
	                                      (char *)tm));

	x = pkt(HANDLE_CHUNK_REVOKE, 2, 0);
	T_OK(mem_apply(&m, &x, -1, err, sizeof(err)));
	T_OK(mem_table_view(&m, &v));
	T_ASSERT(v.chunk_bases[2] == NULL);
	T_ASSERT(v.chunk_bases[0] != NULL);
	T_ASSERT(mem_page(&m, 2 * ppc) == NULL);

	munmap(tm, g.table_bytes);
	mem_fini(&m);
}
