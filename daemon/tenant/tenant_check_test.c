/*
 * tenant_check_test.c — the tenant invariant checker: it finds a corrupt
 * table, random operations keep every invariant, and it reads no table
 * page it need not touch.
 *
 * The simulated client (struct sim) and its checks are tenant_fixture.h's.
 */
#include "tenant_fixture.h"

/*
 * The tenant's own read-write mapping of a segment: this test process is
 * the "daemon", so /proc/self/maps lists it (the rw-s mapping of the
 * memfd's inode).
 */
static uint8_t *daemon_mapping(int fd)
{
	struct stat st;
	T_EQ(fstat(fd, &st), 0);
	FILE *f = fopen("/proc/self/maps", "r");
	T_ASSERT(f);
	char line[512];
	unsigned long lo = 0, hi, ino;
	char perm[8];
	int found = 0;
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perm,
		               &ino) == 4 &&
		        ino == (unsigned long)st.st_ino &&
		        !strcmp(perm, "rw-s");
	fclose(f);
	T_ASSERT(found);
	return (uint8_t *)lo;
}

TEST(tenant, check_detects_corrupt_table)
{
	struct pool pool;
	T_OK(pool_init(&pool, 4 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("full");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t sq;
	T_OK(tenant_seq_open(s.t, &sq));
	flush(&s);
	uint32_t ctr = 0, seen[2] = {0, 0};
	STEP(&s, sq, &ctr, 0, 0, 4, seen);

	/* A slot opened and closed again: its records were written. */
	uint64_t sq2;
	T_OK(tenant_seq_open(s.t, &sq2));
	T_OK(tenant_seq_close(s.t, sq2));
	flush(&s);

	/* The client cannot write the table (sealed); the daemon's own
	 * mapping, in this same process, stands in for a daemon bug. */
	const struct shm_geom *g = s.g;
	T_ASSERT(mmap(NULL, g->table_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
	              tenant_table_fd(s.t), 0) == MAP_FAILED);
	uint8_t *rw = daemon_mapping(tenant_table_fd(s.t));
	struct shm_list *l = shm_list_at(rw, g, seqid_slot(sq), 1, 1);
	T_EQ(l->n_pages, 2);
	char d[KVT_ERRTEXT_MAX];

	uint32_t keep = l->pages[1];
	l->pages[1] = l->pages[0]; /* a page twice */
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	T_ASSERT(d[0] != '\0');
	l->pages[1] = 999999; /* a page that does not exist */
	d[0] = '\0';
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	T_ASSERT(d[0] != '\0');
	l->pages[1] = keep;
	CLEAN(&s);

	l->len++;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	l->len--;
	l->n_pages++;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	l->n_pages--;
	l->epoch += 7;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	l->epoch -= 7;
	CLEAN(&s);

	/* a closed slot that claims entries */
	struct shm_list *c = shm_list_at(rw, g, seqid_slot(sq2), 0, 0);
	c->len = 1;
	T_ASSERT(tenant_check(s.t, d, sizeof(d)) > 0);
	c->len = 0;
	struct shm_table_hdr *hd = (struct shm_table_hdr *)rw;
	hd->magic ^= 1;
	T_ASSERT(tenant_check(s.t, NULL, 0) > 0);
	hd->magic ^= 1;
	CLEAN(&s);

	/* the daemon never trusted the table: the next sync repairs it */
	l->pages[0] = 12345;
	struct ipc_sync_item it = item(sq, ctr, 0, 0, 0);
	T_OK(tenant_sync(s.t, 0, &it, 1, NULL, 0));
	CLEAN(&s);
	sim_free(&s);
}

TEST(tenant, random_ops_keep_invariants)
{
	/* Many sequences, random opens, closes and batched syncs, checked
	 * after every operation against the streaming rule. */
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h = hello_a("streaming:sinks=1,tokens=9");
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	uint64_t id[4];
	int open[4] = {0};
	uint32_t ctr[4], seen[4][2];
	uint32_t rng = 12345;
	char err[KVT_ERRTEXT_MAX];
	for (int op = 0; op < 400; op++) {
		rng = rng * 1103515245u + 12345u;
		uint32_t r = rng >> 8;
		int k = (int)(r % 4);
		if (!open[k] || r % 23 == 0) {
			if (open[k])
				T_OK(tenant_seq_close(s.t, id[k]));
			T_OK(tenant_seq_open(s.t, &id[k]));
			open[k] = 1;
			ctr[k] = 0;
			seen[k][0] = seen[k][1] = 0;
		} else {
			struct ipc_sync_item its[4];
			int who[4];
			uint32_t n = 0, lo = 0, hi = 0;
			if (r % 5 == 0) {
				lo = (r >> 4) % 2;
				hi = lo + 1;
			}
			for (int j = 0; j < 4; j++) {
				if (!open[j] || (j != k && (r >> (8 + j)) % 2))
					continue;
				uint32_t nn = (r >> (12 + 2 * j)) % 5;
				append(&s, id[j], lo, hi ? hi : 2, nn, seen[j]);
				who[n] = j;
				its[n++] = item(id[j], ctr[j], nn, lo, hi);
			}
			if (tenant_sync(s.t, 0, its, n, err, sizeof(err)))
				th_fail(__FILE__, __LINE__, "op %d: %s", op,
				        err);
			for (uint32_t i = 0; i < n; i++) {
				int j = who[i];
				ctr[j]++;
				for (uint32_t layer = lo; layer < (hi ? hi : 2);
				     layer++)
					seen[j][layer] += its[i].n_new;
			}
		}
		flush(&s);
		CLEAN(&s);
		for (int j = 0; j < 4; j++) {
			if (!open[j])
				continue;
			for (uint32_t layer = 0; layer < 2; layer++) {
				uint32_t n = seen[j][layer], want[16], m;
				if (n <= 9) {
					iota(want, n, 0);
					m = n;
				} else {
					want[0] = 0;
					iota(want + 1, 8, n - 8);
					m = 9;
				}
				VERIFY(&s, id[j], layer, 0, want, m);
				VERIFY(&s, id[j], layer, 1, want, m);
			}
		}
	}
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}

/* Pages of [map, map + bytes) in the page cache (mincore). */
static size_t resident_pages(const void *map, size_t bytes)
{
	size_t ps = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + ps - 1) / ps;
	unsigned char *v = malloc(n);
	T_ASSERT(v);
	T_EQ(mincore((void *)map, bytes, v), 0);
	size_t r = 0;
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

TEST(tenant, check_reads_no_untouched_table_page)
{
	/*
	 * 64 slots of 16 layers x 16 KV heads, records of 64 bytes (pages of
	 * one entry, max_tokens 4, headroom 1: 5 page ids): a 1 MiB table,
	 * 16 KiB (4 pages) per slot.
	 */
	struct pool pool;
	T_OK(pool_init(&pool, 8 * KVT_CHUNK_BYTES));
	struct ipc_hello h;
	memset(&h, 0, sizeof(h));
	strcpy(h.name, "wide");
	h.geo = (struct kvt_geometry){16, 16, 16, 8, 16};
	h.dtype = KVT_DTYPE_F32;
	h.page_tokens = 1;
	h.max_seqs = 64;
	h.max_tokens = 4;
	h.headroom = 1;
	struct sim s;
	sim_new(&s, &pool, &h, 0);
	T_EQ_U64(s.g->table_bytes, 128 + 64 * 256 * 64);
	uint64_t a, b;
	T_OK(tenant_seq_open(s.t, &a));
	T_OK(tenant_seq_open(s.t, &b));
	T_OK(tenant_seq_close(s.t, b)); /* closed, but its records written */
	flush(&s);
	size_t before = resident_pages(s.table, s.g->table_bytes);
	CLEAN(&s);
	CLEAN(&s);
	size_t after = resident_pages(s.table, s.g->table_bytes);
	/* The header page and two slots' 4 pages each (one more where a
	 * slot straddles a page); reading all 64 slots would make 257. */
	T_ASSERT(before <= 10);
	T_EQ_U64(after, before);
	T_OK(tenant_seq_close(s.t, a));
	flush(&s);
	sim_free(&s);
	T_EQ_U64(pool.chunks_used, 0);
}
