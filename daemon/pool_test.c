/* pool_test.c — pool chunks: capacity, sealing, mapping, release. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pool.h"
#include "test.h"

TEST(pool, init_capacity)
{
	struct pool p;
	T_ERR(pool_init(&p, 0), KVT_EINVAL);
	T_ERR(pool_init(&p, KVT_CHUNK_BYTES - 1), KVT_EINVAL);
	T_OK(pool_init(&p, 3 * KVT_CHUNK_BYTES + 5));
	T_EQ_U64(p.chunk_capacity, 3);
	T_EQ_U64(p.chunks_used, 0);
	T_EQ_U64(pool_bytes_total(&p), 3 * KVT_CHUNK_BYTES);
}

TEST(pool, chunk_is_sealed_zeroed_and_shared)
{
	struct pool p;
	struct pool_chunk c;
	T_OK(pool_init(&p, 2 * KVT_CHUNK_BYTES));
	T_OK(pool_chunk_new(&p, NULL, &c));
	T_ASSERT(c.fd >= 0);
	T_ASSERT(c.base != NULL);
	T_EQ_U64(c.bytes, KVT_CHUNK_BYTES);
	T_EQ_U64(p.chunks_used, 1);
	T_EQ_U64(p.chunks_created_total, 1);

	struct stat st;
	T_EQ(fstat(c.fd, &st), 0);
	T_EQ_U64((uint64_t)st.st_size, KVT_CHUNK_BYTES);
	int seals = fcntl(c.fd, F_GET_SEALS);
	T_EQ(seals & (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
	     F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
	T_ASSERT(ftruncate(c.fd, 4096) < 0);
	T_ASSERT(ftruncate(c.fd, 2 * KVT_CHUNK_BYTES) < 0);
	T_ASSERT(fcntl(c.fd, F_ADD_SEALS, F_SEAL_WRITE) < 0);

	const uint8_t *b = c.base;
	for (uint64_t i = 0; i < KVT_CHUNK_BYTES; i += 4093)
		T_EQ(b[i], 0);
	/* A second mapping of the fd (what a client does) sees the bytes. */
	uint8_t *m = mmap(NULL, KVT_CHUNK_BYTES, PROT_READ | PROT_WRITE,
	                  MAP_SHARED, c.fd, 0);
	T_ASSERT(m != MAP_FAILED);
	((uint8_t *)c.base)[12345] = 0xab;
	T_EQ(m[12345], 0xab);
	m[KVT_CHUNK_BYTES - 1] = 0xcd;
	T_EQ(b[KVT_CHUNK_BYTES - 1], 0xcd);
	munmap(m, KVT_CHUNK_BYTES);

	pool_chunk_free(&p, &c);
	T_EQ(c.fd, -1);
	T_ASSERT(c.base == NULL);
	T_EQ_U64(p.chunks_used, 0);
	T_EQ_U64(p.chunks_released_total, 1);
	/* twice is harmless */
	pool_chunk_free(&p, &c);
	T_EQ_U64(p.chunks_used, 0);
	T_EQ_U64(p.chunks_released_total, 1);
}

TEST(pool, capacity_exhausted_and_returned)
{
	struct pool p;
	struct pool_chunk c[3];
	T_OK(pool_init(&p, 2 * KVT_CHUNK_BYTES));
	T_OK(pool_chunk_new(&p, NULL, &c[0]));
	T_OK(pool_chunk_new(&p, NULL, &c[1]));
	T_ERR(pool_chunk_new(&p, NULL, &c[2]), KVT_EPOOLFULL);
	T_EQ(c[2].fd, -1);
	T_ASSERT(c[2].base == NULL);
	T_EQ_U64(p.chunks_used, 2);
	pool_chunk_free(&p, &c[0]);
	T_EQ_U64(p.chunks_used, 1);
	T_OK(pool_chunk_new(&p, NULL, &c[2]));
	T_EQ_U64(p.chunks_used, 2);
	T_EQ_U64(p.chunks_created_total, 3);
	pool_chunk_free(&p, &c[1]);
	pool_chunk_free(&p, &c[2]);
	T_EQ_U64(p.chunks_used, 0);
	T_EQ_U64(p.chunks_released_total, 3);
}

TEST(pool, free_zeroed_chunk_is_safe)
{
	struct pool p;
	T_OK(pool_init(&p, KVT_CHUNK_BYTES));
	/* Make sure fd 0 is open: a zeroed chunk names it and must not close
	 * it. */
	int nul = open("/dev/null", O_RDONLY);
	T_ASSERT(nul >= 0);
	T_EQ(dup2(nul, 0), 0);
	struct pool_chunk z;
	memset(&z, 0, sizeof(z));
	pool_chunk_free(&p, &z);
	T_ASSERT(fcntl(0, F_GETFD) >= 0);
	T_EQ(z.fd, -1);
	T_EQ_U64(p.chunks_used, 0);
	T_EQ_U64(p.chunks_released_total, 0);
}

/* A uid's (and a process's) account holds at most its share of the pool;
 * what one account holds leaves the others theirs. */
TEST(pool, shares_cap_each_account)
{
	struct pool p;
	struct pool_chunk c[4];
	T_OK(pool_init(&p, 4 * KVT_CHUNK_BYTES));
	double share[POOL_SHARES] = {0.75, 1};
	pool_set_shares(&p, share);
	T_EQ_U64(pool_share_chunks(&p, POOL_SHARE_UID), 3);
	T_EQ_U64(pool_share_chunks(&p, POOL_SHARE_PID), 4);
	struct pool_account *hog[POOL_SHARES] = {
		pool_account_get(&p, POOL_SHARE_UID, 1000),
		pool_account_get(&p, POOL_SHARE_PID, 77)};
	struct pool_account *other[POOL_SHARES] = {
		pool_account_get(&p, POOL_SHARE_UID, 65534),
		pool_account_get(&p, POOL_SHARE_PID, 78)};
	T_ASSERT(hog[0] && hog[1] && other[0] && other[1]);
	T_EQ(pool_accounts(&p, POOL_SHARE_UID), 2);
	for (int i = 0; i < 3; i++)
		T_OK(pool_chunk_new(&p, hog, &c[i]));
	T_ERR(pool_chunk_new(&p, hog, &c[3]), KVT_EPOOLFULL);
	T_EQ_U64(pool_account_chunks(hog[0]), 3);
	T_EQ_U64(pool_account_chunks(hog[1]), 3); /* nothing half-counted */
	T_EQ_U64(p.chunks_used, 3);
	T_OK(pool_chunk_new(&p, other, &c[3]));
	T_EQ_U64(pool_account_chunks(other[0]), 1);
	for (int i = 0; i < 4; i++)
		pool_chunk_free(&p, &c[i]);
	T_EQ_U64(pool_account_chunks(hog[0]), 0);
	T_EQ_U64(pool_account_chunks(other[1]), 0);
	/* The same id again is the same account, while referred to. */
	T_ASSERT(pool_account_get(&p, POOL_SHARE_UID, 1000) == hog[0]);
	pool_account_put(&p, hog[0]);
	for (int k = 0; k < POOL_SHARES; k++) {
		pool_account_put(&p, hog[k]);
		pool_account_put(&p, other[k]);
	}
	T_ASSERT(p.accounts == NULL);
	/* A share too small for a chunk still allows one. */
	double tiny[POOL_SHARES] = {0.01, 0.01};
	pool_set_shares(&p, tiny);
	T_EQ_U64(pool_share_chunks(&p, POOL_SHARE_UID), 1);
}
