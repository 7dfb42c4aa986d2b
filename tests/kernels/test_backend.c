/*
 * test_backend.c — backend selection (backend/loader.c) in the normal
 * suite, which links no CUDA: "cuda" must fail with a clear reason where
 * there is no library, driver or device, "auto" must then pick cpu, and
 * the cpu backend's chunks behave as the pool's always did.  On a GPU host
 * the two cuda expectations turn into checks of the loaded table.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "test.h"

TEST(backend, cuda_fails_cleanly_without_device)
{
	const struct kvt_backend_ops *ops = NULL;
	char err[512];
	int rv = backend_open("cuda", &ops, err, sizeof(err));
	if (rv == 0) {
		T_EQ_STR(ops->name, "cuda");
		T_EQ(ops->abi, KVT_BACKEND_ABI);
		T_SKIP("a CUDA device is present: cuda backend opened");
	}
	T_ERR(rv, KVT_ENOTSUP);
	fprintf(stderr, "    refusal: %s\n", err);
	T_ASSERT(strncmp(err, "cuda backend: ", 14) == 0);
	T_ASSERT(strlen(err) > 14);
	/* the reason names what is missing */
	T_ASSERT(strstr(err, "not found") || strstr(err, "no CUDA device") ||
	         strstr(err, "driver"));
}

TEST(backend, auto_picks_cpu_without_device)
{
	const struct kvt_backend_ops *ops = NULL;
	char err[512];
	T_OK(backend_open("auto", &ops, err, sizeof(err)));
	T_ASSERT(ops != NULL);
	if (!strcmp(ops->name, "cuda"))
		T_SKIP("a CUDA device is present: auto picked cuda");
	T_EQ_STR(ops->name, "cpu");
	T_ASSERT(ops == &backend_cpu);
	/* the note says why cuda was not taken */
	T_ASSERT(strstr(err, "using the cpu backend") != NULL);
	T_OK(backend_open(NULL, &ops, err, sizeof(err)));
}

TEST(backend, cuda_library_path_override)
{
	const struct kvt_backend_ops *ops = NULL;
	char err[512];
	setenv("KVTRIM_CUDA_LIB", "/nonexistent/libkvtrim-cuda.so", 1);
	T_ERR(backend_open("cuda", &ops, err, sizeof(err)), KVT_ENOTSUP);
	T_ASSERT(strstr(err, "KVTRIM_CUDA_LIB=/nonexistent") != NULL);
	T_OK(backend_open("auto", &ops, err, sizeof(err)));
	T_EQ_STR(ops->name, "cpu");
}

TEST(backend, unknown_and_cpu)
{
	const struct kvt_backend_ops *ops = NULL;
	char err[256];
	T_ERR(backend_open("tpu", &ops, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "tpu") != NULL);
	T_OK(backend_open("cpu", &ops, err, sizeof(err)));
	T_ASSERT(ops == &backend_cpu);
	T_EQ_STR(err, "");
	T_EQ(ops->abi, KVT_BACKEND_ABI);
	T_OK(ops->probe(err, sizeof(err)));
	int n = 0;
	T_OK(ops->device_count(&n));
	T_EQ(n, 1);
}

TEST(backend, cpu_chunk_export_import_compact)
{
	const struct kvt_backend_ops *o = &backend_cpu;
	void *ctx;
	const char *mode = NULL;
	char err[128];
	T_OK(o->ctx_new(0, &ctx, &mode, err, sizeof(err)));
	T_EQ_STR(mode, "memfd");
	T_EQ(o->share(ctx), KVT_BACKEND_SHARE_MEMFD);
	struct kvt_backend_chunk c, m;
	T_OK(o->chunk_new(ctx, KVT_CHUNK_BYTES, &c));
	T_ASSERT(c.fd >= 0 && c.base != NULL);
	T_EQ_U64(c.bytes, KVT_CHUNK_BYTES);
	int seals = fcntl(c.fd, F_GET_SEALS);
	T_EQ(seals & (F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
	     F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
	/* what a client does with the fd */
	T_OK(o->chunk_import(ctx, c.fd, NULL, c.bytes, &m));
	uint8_t *b = c.base, *mb = m.base;
	b[777] = 0x42;
	T_EQ(mb[777], 0x42);

	/* compact through the table: rows of 8 bytes, 4 per page, page 0
	 * and page 1 of a list at the start of the chunk */
	for (int i = 0; i < 128; i++)
		b[i] = (uint8_t)i;
	void *pages[2] = {b, b + 64};
	uint32_t moves[2] = {0, 5}; /* entry 5 (page 1 row 1) -> entry 0 */
	struct kvt_backend_compact l = {pages, 2, 4, 8, 1, moves};
	T_OK(o->compact(ctx, &l, 1, NULL));
	for (int i = 0; i < 8; i++) {
		T_EQ(b[i], 64 + 8 + i);      /* K row */
		T_EQ(b[32 + i], 64 + 40 + i); /* V row */
	}
	o->chunk_unmap(ctx, &m);
	T_ASSERT(m.base == NULL);
	o->chunk_free(ctx, &c);
	T_ASSERT(c.base == NULL);
	T_EQ(c.fd, -1);
	o->chunk_free(ctx, &c);
	T_ERR(o->chunk_new(ctx, 12345, &c), KVT_EINVAL);
	T_ASSERT(o->event_new == NULL && o->stream_new == NULL);
	o->ctx_free(ctx);
}
