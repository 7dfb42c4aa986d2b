/*
 * test_table_view.c — kvt_table_view and kvt_list_record against the real
 * kvtrimd: the table a GPU kernel would read (host memory on the cpu
 * backend, the daemon's device copy on cuda) must say what kvt_list_get
 * says, and the chunk-base array must turn every page id into the address
 * kvt_page_ptr gives.  Everything is read through kvt_memcpy, so the same
 * test runs on both backends (KVTRIM_BACKEND=cuda in scripts/gpu-check.sh).
 * Expected lengths and addresses come from the header's formulas and the
 * test's own arithmetic.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "kvtrim.h"
#include "seqid.h"
#include "test.h"

/* 64-token pages of 128 f32 dims: 64 KiB a page, 32 pages a chunk, so a
 * few sequences spread over more than one chunk. */
static struct kvt_config view_cfg(const struct th_daemon *d)
{
	struct kvt_config cfg = th_small_cfg(d, "viewer", "full");
	cfg.geo.head_dim = 128;
	cfg.page_tokens = 64;
	cfg.max_tokens = 512;
	cfg.headroom = 64;
	return cfg;
}

/* The record of (slot, layer, head) by the formula of kvtrim.h. */
static const void *rec_at(const struct kvt_table_view *v, uint32_t slot,
                          uint32_t layer, uint32_t head)
{
	return (const char *)v->table + v->records_offset +
	       (((uint64_t)slot * v->n_layers + layer) * v->n_kv_heads + head) *
	               v->list_stride;
}

/* Compares every list of seq with kvt_list_get and every page address
 * with kvt_page_ptr; want_len is what the full policy must hold. */
static void check_seq(kvt_client *c, const struct kvt_table_view *v,
                      void *const *bases, kvt_seq seq, uint32_t want_len)
{
	size_t rbytes = sizeof(struct kvt_list_record) +
	                (size_t)v->max_pages * sizeof(uint32_t);
	struct kvt_list_record *r = malloc(rbytes);
	T_ASSERT(r);
	for (uint32_t l = 0; l < v->n_layers; l++)
		for (uint32_t h = 0; h < v->n_kv_heads; h++) {
			const struct kvt_list_record *dr;
			uint32_t slot = UINT32_MAX;
			struct kvt_list lg;
			T_OK(kvt_list_record(c, seq, l, h, &dr, &slot));
			T_EQ(slot, seqid_slot(seq));
			T_ASSERT((const void *)dr == rec_at(v, slot, l, h));
			T_OK(kvt_memcpy(c, r, dr, rbytes));
			T_OK(kvt_list_get(c, seq, l, h, &lg));
			T_EQ(r->len, want_len);
			T_EQ(r->len, lg.len);
			T_EQ(r->n_pages, lg.n_pages);
			T_EQ_U64(r->epoch, lg.epoch);
			/* full keeps everything: len entries plus the
			 * headroom, in whole pages */
			T_EQ(r->n_pages, (want_len + 64 + 63) / 64);
			for (uint32_t p = 0; p < r->n_pages; p++) {
				uint32_t id = r->pages[p];
				T_EQ(id, lg.pages[p]);
				T_ASSERT(id / v->pages_per_chunk < v->n_chunk_slots);
				char *b = bases[id / v->pages_per_chunk];
				T_ASSERT(b != NULL);
				T_ASSERT(b + (uint64_t)(id % v->pages_per_chunk) *
				                     v->page_bytes ==
				         (char *)kvt_page_ptr(c, id));
			}
		}
	free(r);
}

TEST(table_view, describes_lists_and_pages_on_any_backend)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c;
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = view_cfg(&d);
	T_OK(kvt_connect(&cfg, &c, err));

	kvt_seq s[4];
	for (int i = 0; i < 4; i++)
		T_OK(kvt_seq_open(c, &s[i]));
	/* Sequence i gets 10 + 15 * i entries a sync, three syncs. */
	for (int round = 0; round < 3; round++)
		for (int i = 0; i < 4; i++) {
			struct kvt_sync_item it = {.seq = s[i],
			                           .n_new = 10 + 15 * (uint32_t)i};
			T_OK(kvt_sync(c, &it, 1));
		}

	struct kvt_table_view v;
	T_OK(kvt_table_view(c, &v));
	T_EQ(v.max_seqs, 4);
	T_EQ(v.n_layers, 2);
	T_EQ(v.n_kv_heads, 2);
	T_EQ(v.max_pages, (512 + 64 + 63) / 64);
	T_EQ_U64(v.page_bytes, 2ull * 64 * 128 * 4);
	T_EQ(v.pages_per_chunk, (2u << 20) / (2u * 64 * 128 * 4));
	T_ASSERT(v.list_stride >= sizeof(struct kvt_list_record) +
	                                  (uint64_t)v.max_pages * 4);
	/* lists of 30, 75, 120 and 165 entries plus 64 headroom: 2, 3, 3
	 * and 4 pages, times 4 lists = 48 pages > 32: two chunks at least */
	T_ASSERT(v.n_chunk_slots >= 2);
	void **bases = calloc(v.n_chunk_slots, sizeof(void *));
	T_ASSERT(bases);
	T_OK(kvt_memcpy(c, bases, v.chunk_bases,
	                (size_t)v.n_chunk_slots * sizeof(void *)));
	uint32_t live = 0;
	for (uint32_t i = 0; i < v.n_chunk_slots; i++)
		live += bases[i] != NULL;
	T_ASSERT(live >= 2);
	for (int i = 0; i < 4; i++)
		check_seq(c, &v, bases, s[i], 3 * (10 + 15 * (uint32_t)i));

	/* A closed sequence's records read empty in the same memory. */
	uint32_t slot1 = seqid_slot(s[1]);
	T_OK(kvt_seq_close(c, s[1]));
	T_OK(kvt_table_view(c, &v));
	struct kvt_list_record r;
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < 2; h++) {
			T_OK(kvt_memcpy(c, &r, rec_at(&v, slot1, l, h),
			                sizeof(r)));
			T_EQ(r.len, 0);
			T_EQ(r.n_pages, 0);
		}
	/* The others are unchanged. */
	T_OK(kvt_memcpy(c, bases, v.chunk_bases,
	                (size_t)v.n_chunk_slots * sizeof(void *)));
	check_seq(c, &v, bases, s[3], 3 * 55);

	/* Bad arguments change nothing and say so. */
	const struct kvt_list_record *dr;
	T_ERR(kvt_table_view(NULL, &v), KVT_EINVAL);
	T_ERR(kvt_table_view(c, NULL), KVT_EINVAL);
	T_ERR(kvt_list_record(c, s[0], 2, 0, &dr, NULL), KVT_EINVAL);
	T_ERR(kvt_list_record(c, s[0], 0, 2, &dr, NULL), KVT_EINVAL);
	T_ERR(kvt_list_record(c, s[1], 0, 0, &dr, NULL), KVT_ENOSEQ);
	T_ERR(kvt_list_record(c, s[0], 0, 0, NULL, NULL), KVT_EINVAL);

	/* The daemon's own audit while the tenant lives (on cuda it
	 * compares the device table with the host table record by record). */
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	free(bases);
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}
