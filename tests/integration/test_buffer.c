/*
 * test_buffer.c — kvt_buffer_alloc / kvt_buffer_free through the real
 * daemon, on whatever backend the suite runs (KVTRIM_BACKEND; `make test`
 * also runs it on the emulated cuda backend, where the buffers are device
 * memory): zero fill and a round trip through kvt_memcpy, buffers that
 * kvt_attention takes (on cuda it refuses host memory, so a buffer it
 * accepts is of the pages' kind), every refusal leaving the buffers
 * intact, and buffers left to kvt_disconnect.
 *
 * Expected values are written here: the bytes copied in, zeroes, and the
 * attention over one entry by hand (out is its V row, lse its scaled
 * logit).  The leak check of buffers left at disconnect is LeakSanitizer's
 * (SANITIZER=address builds; the emulated cuda library is not built there,
 * so it covers the host path).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "test.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define HAVE_LSAN 1
#endif

static kvt_client *connect_small(struct th_daemon *d)
{
	th_daemon_start(d, "16M", NULL);
	struct kvt_config cfg = th_small_cfg(d, "buf", "full");
	kvt_client *c;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	return c;
}

/* bytes from the host into p and back: the same bytes. */
static void round_trip(kvt_client *c, void *p, size_t bytes, uint8_t seed)
{
	uint8_t *in = malloc(bytes), *back = malloc(bytes);
	T_ASSERT(in && back);
	for (size_t i = 0; i < bytes; i++)
		in[i] = (uint8_t)(seed + i * 7);
	T_OK(kvt_memcpy(c, p, in, bytes));
	memset(back, 0xee, bytes);
	T_OK(kvt_memcpy(c, back, p, bytes));
	T_ASSERT(!memcmp(in, back, bytes));
	free(in);
	free(back);
}

static int all_zero(kvt_client *c, const void *p, size_t bytes)
{
	uint8_t *back = malloc(bytes);
	T_ASSERT(back);
	memset(back, 0xee, bytes);
	T_OK(kvt_memcpy(c, back, p, bytes));
	int z = 1;
	for (size_t i = 0; i < bytes; i++)
		z &= back[i] == 0;
	free(back);
	return z;
}

TEST(buffer, zero_filled_and_round_trips_through_memcpy)
{
	struct th_daemon d;
	kvt_client *c = connect_small(&d);
	/* Sizes off the 64-byte grain too: the host allocation rounds up,
	 * the buffer must still hold exactly what was asked. */
	static const size_t sizes[] = {1, 63, 1000, 4096, 1 << 20};
	void *p[5];
	for (int i = 0; i < 5; i++) {
		T_OK(kvt_buffer_alloc(c, sizes[i], &p[i]));
		T_ASSERT(p[i]);
		T_EQ_STR(kvt_last_error(c), "");
		if (kvt_memory_kind(c) == KVT_MEMORY_HOST)
			T_EQ((uintptr_t)p[i] % 64, 0);
		T_ASSERT(all_zero(c, p[i], sizes[i]));
	}
	for (int i = 0; i < 5; i++)
		round_trip(c, p[i], sizes[i], (uint8_t)(i * 31));
	fprintf(stderr, "    buffers of %s memory\n",
	        kvt_memory_kind(c) == KVT_MEMORY_CUDA ? "device" : "host");
	/* Buffer to buffer, then back to the host. */
	uint8_t *host = malloc(4096);
	T_ASSERT(host);
	T_OK(kvt_memcpy(c, p[2], p[3], 1000));
	T_OK(kvt_memcpy(c, host, p[2], 1000));
	for (size_t i = 0; i < 1000; i++)
		T_EQ(host[i], (uint8_t)(3 * 31 + i * 7));
	free(host);
	/* Each round trip touched its own buffer only. */
	round_trip(c, p[4], sizes[4], 5);
	for (int i = 0; i < 5; i++)
		T_OK(kvt_buffer_free(c, p[i]));
	/* A fresh buffer after frees is zeroed again. */
	void *z;
	T_OK(kvt_buffer_alloc(c, 4096, &z));
	T_ASSERT(all_zero(c, z, 4096));
	T_OK(kvt_buffer_free(c, z));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(buffer, refusals_change_nothing)
{
	struct th_daemon d;
	kvt_client *c = connect_small(&d);
	void *p = (void *)&d;
	T_ERR(kvt_buffer_alloc(NULL, 64, &p), KVT_EINVAL);
	T_ERR(kvt_buffer_alloc(c, 64, NULL), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "NULL out"));
	T_ERR(kvt_buffer_alloc(c, 0, &p), KVT_EINVAL);
	T_ASSERT(p == NULL);
	T_ASSERT(strstr(kvt_last_error(c), "0 bytes"));

#ifndef HAVE_LSAN /* ASan aborts on such a request instead of failing */
	/* More than any machine has (and SIZE_MAX, which the host path's
	 * rounding must not wrap): a clear error, nothing listed. */
	const size_t huge[2] = {(size_t)1 << 62, SIZE_MAX};
	for (int i = 0; i < 2; i++) {
		p = (void *)&d;
		int rc = kvt_buffer_alloc(c, huge[i], &p);
		T_ASSERT(rc == KVT_ENOMEM || rc == KVT_ESYS);
		T_ASSERT(p == NULL && kvt_last_error(c)[0]);
	}
#endif
	void *a, *b;
	T_OK(kvt_buffer_alloc(c, 256, &a));
	T_OK(kvt_buffer_alloc(c, 256, &b));
	T_ASSERT(a != b);
	round_trip(c, a, 256, 1);
	round_trip(c, b, 256, 2);
	/* Keep known bytes in both while the refusals run. */
	uint8_t ina[256], inb[256], back[256];
	for (int i = 0; i < 256; i++) {
		ina[i] = (uint8_t)(i ^ 0x5a);
		inb[i] = (uint8_t)(255 - i);
	}
	T_OK(kvt_memcpy(c, a, ina, 256));
	T_OK(kvt_memcpy(c, b, inb, 256));

	T_ERR(kvt_buffer_free(NULL, a), KVT_EINVAL);
	T_OK(kvt_buffer_free(c, NULL));
	int local;
	T_ERR(kvt_buffer_free(c, &local), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "not a live buffer"));
	T_ERR(kvt_buffer_free(c, (char *)a + 1), KVT_EINVAL);
	/* A page is the client's memory but not a buffer. */
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	void *kp, *vp;
	T_OK(kvt_kv_ptr(c, s, 0, 0, 0, &kp, &vp));
	T_ERR(kvt_buffer_free(c, kp), KVT_EINVAL);
	/* A buffer of another client is not this one's. */
	struct kvt_config cfg2 = th_small_cfg(&d, "buf2", "full");
	kvt_client *c2;
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg2, &c2, err));
	void *other;
	T_OK(kvt_buffer_alloc(c2, 128, &other));
	T_ERR(kvt_buffer_free(c, other), KVT_EINVAL);
	T_ERR(kvt_buffer_free(c2, a), KVT_EINVAL);
	T_OK(kvt_buffer_free(c2, other));
	kvt_disconnect(c2);

	/* Both buffers still hold their bytes. */
	T_OK(kvt_memcpy(c, back, a, 256));
	T_ASSERT(!memcmp(back, ina, 256));
	T_OK(kvt_memcpy(c, back, b, 256));
	T_ASSERT(!memcmp(back, inb, 256));

	/* Double free: the second is refused, the other buffer lives on. */
	T_OK(kvt_buffer_free(c, a));
	T_EQ_STR(kvt_last_error(c), "");
	T_ERR(kvt_buffer_free(c, a), KVT_EINVAL);
	T_OK(kvt_memcpy(c, back, b, 256));
	T_ASSERT(!memcmp(back, inb, 256));
	T_OK(kvt_buffer_free(c, b));
	T_ERR(kvt_buffer_free(c, b), KVT_EINVAL);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * One entry per list (K row k_j = (j + 1) / 8, V row v_j = h + j / 4 for
 * KV head h), then kvt_attention of that token with q, out and lse in
 * buffers: over one entry the softmax weight is 1, so out of query head
 * qh is the V row of KV head qh / G and lse is q . k / sqrt(head_dim).
 */
TEST(buffer, attention_reads_and_writes_buffers)
{
	struct th_daemon d;
	kvt_client *c = connect_small(&d);
	const struct kvt_config *cf = kvt_config_of(c);
	const uint32_t H = cf->geo.n_heads, Hkv = cf->geo.n_kv_heads;
	const uint32_t hd = cf->geo.head_dim, G = H / Hkv;
	T_ASSERT(cf->dtype == KVT_DTYPE_F32 && hd <= 16 && H <= 8);
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	float krow[16], vrow[16];
	for (uint32_t h = 0; h < Hkv; h++) {
		void *kp, *vp;
		T_OK(kvt_kv_ptr(c, s, 0, h, 0, &kp, &vp));
		for (uint32_t j = 0; j < hd; j++) {
			krow[j] = (float)(j + 1) / 8.0f;
			vrow[j] = (float)h + (float)j / 4.0f;
		}
		T_OK(kvt_memcpy(c, kp, krow, hd * sizeof(float)));
		T_OK(kvt_memcpy(c, vp, vrow, hd * sizeof(float)));
	}
	float q[8 * 16], out[8 * 16], lse[8];
	for (uint32_t i = 0; i < H * hd; i++)
		q[i] = (float)((int)(i % 5) - 2) / 2.0f;
	float *dq, *dout, *dlse;
	T_OK(kvt_buffer_alloc(c, sizeof(q), (void **)&dq));
	T_OK(kvt_buffer_alloc(c, sizeof(out), (void **)&dout));
	T_OK(kvt_buffer_alloc(c, sizeof(lse), (void **)&dlse));
	T_OK(kvt_memcpy(c, dq, q, H * hd * sizeof(float)));
	T_OK(kvt_attention(c, s, 0, 1, dq, dout, dlse));
	T_OK(kvt_memcpy(c, out, dout, H * hd * sizeof(float)));
	T_OK(kvt_memcpy(c, lse, dlse, H * sizeof(float)));
	for (uint32_t qh = 0; qh < H; qh++) {
		double dot = 0;
		for (uint32_t j = 0; j < hd; j++)
			dot += (double)q[qh * hd + j] * (double)(j + 1) / 8.0;
		double want = dot / sqrt((double)hd);
		if (fabs(lse[qh] - want) > 1e-5)
			th_fail(__FILE__, __LINE__, "head %u: lse %.7f, "
			        "expected %.7f", qh, lse[qh], want);
		for (uint32_t j = 0; j < hd; j++) {
			double v = (double)(qh / G) + (double)j / 4.0;
			if (fabs(out[qh * hd + j] - v) > 1e-6)
				th_fail(__FILE__, __LINE__, "head %u dim %u: "
				        "out %.7f, expected %.7f", qh, j,
				        out[qh * hd + j], v);
		}
	}
	/* On a cuda tenant host memory is refused: the buffers above were
	 * device memory. */
	if (kvt_memory_kind(c) == KVT_MEMORY_CUDA)
		T_ERR(kvt_attention(c, s, 0, 1, q, out, lse), KVT_EINVAL);
	T_OK(kvt_buffer_free(c, dq));
	T_OK(kvt_buffer_free(c, dout));
	T_OK(kvt_buffer_free(c, dlse));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(buffer, left_to_disconnect_are_freed)
{
	struct th_daemon d;
	kvt_client *c = connect_small(&d);
	/* More than the list's first growth step (8), of several sizes. */
	for (int i = 0; i < 20; i++) {
		void *p;
		T_OK(kvt_buffer_alloc(c, (size_t)(i + 1) * 4096, &p));
		if (i % 3 == 0)
			round_trip(c, p, 4096, (uint8_t)i);
		if (i % 5 == 4)
			T_OK(kvt_buffer_free(c, p));
	}
	kvt_disconnect(c);
	/* The daemon saw a clean bye, and a new client starts from none. */
	struct kvt_config cfg = th_small_cfg(&d, "buf", "full");
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(&cfg, &c, err));
	void *p;
	T_OK(kvt_buffer_alloc(c, 64, &p));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
#ifdef HAVE_LSAN
	T_EQ(__lsan_do_recoverable_leak_check(), 0);
#endif
}

/* Once the daemon is gone, allocation says so and freeing still works. */
TEST(buffer, dead_client_frees_but_does_not_allocate)
{
	struct th_daemon d;
	kvt_client *c = connect_small(&d);
	void *p, *q;
	T_OK(kvt_buffer_alloc(c, 512, &p));
	th_daemon_kill(&d);
	/* The first call that notices the hang-up returns KVT_ECONN. */
	kvt_seq s;
	int rc = kvt_seq_open(c, &s);
	T_ASSERT(rc == KVT_ECONN || rc == KVT_ETIMEDOUT);
	T_ERR(kvt_buffer_alloc(c, 512, &q), KVT_ECONN);
	T_ASSERT(q == NULL);
	T_OK(kvt_buffer_free(c, p));
	T_ERR(kvt_buffer_free(c, p), KVT_EINVAL);
	kvt_disconnect(c);
}
