/*
 * compact_drops.cu — the cuda backend's `compact_drops` op (backend.h):
 * a sync's compaction worked out on the device from each list's drop
 * indices (24 bytes a moving list and 4 a drop cross from the host), one
 * warp per move finding its source by compact_plan()'s pairing and its
 * page addresses from the device table and chunk bases as the stream sees
 * them.  A page id beyond the record or in an unmapped chunk skips the
 * move (a daemon bug must not fault the context).  The op validates every
 * list on the host first and stages its arguments in one of the context's
 * pinned slots (bc_stage_take) under the context's lock.  The pairing:
 * docs/cuda.md, "Device ops, step by step".  Test: kvtrim-cuda-tests
 * compact_drops.
 */
#include <string.h>

#include <algorithm>

#include "backend_cuda.cuh"
#include "common.cuh"

/* A list as the kernel reads it: the host's struct plus where its moves
 * start in the launch and how many there are (holes below the new length). */
struct bc_drop_list {
	uint32_t record, len, n_drop, drop_off, move_off, n_moves;
};

#define BC_DROPS_THREADS 256

/* The list holding move w: the last one whose move_off <= w. */
__device__ static uint32_t bc_drops_find(const bc_drop_list *l, uint32_t n,
                                         uint32_t w)
{
	uint32_t lo = 0, hi = n; /* l[lo].move_off <= w < l[hi].move_off */
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (l[mid].move_off <= w)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* One warp per move, every lane working out the same addresses (the loads
 * are broadcasts), then the lanes copy the K and V rows in units of V. */
template <typename V>
__global__ void bc_drops_kernel(const kvt_backend_paged pg,
                                const bc_drop_list *lists, uint32_t n_lists,
                                const uint32_t *drops, uint32_t total)
{
	const uint32_t lane = threadIdx.x % 32;
	const uint32_t upr = pg.row_bytes / (uint32_t)sizeof(V);
	const uint64_t v_off = (uint64_t)pg.page_tokens * pg.row_bytes;
	const uint64_t warps = (uint64_t)gridDim.x * (blockDim.x / 32);
	for (uint64_t w = (uint64_t)blockIdx.x * (blockDim.x / 32) +
	                  threadIdx.x / 32;
	     w < total; w += warps) {
		const bc_drop_list l = lists[bc_drops_find(lists, n_lists,
		                                           (uint32_t)w)];
		const uint32_t j = (uint32_t)w - l.move_off;
		const uint32_t *d = drops + l.drop_off;
		const uint32_t L = l.len - l.n_drop;
		const uint32_t *t = d + l.n_moves;
		uint32_t lo = 0, hi = l.n_drop - l.n_moves;
		while (lo < hi) { /* smallest k with t[k] - k > L + j */
			uint32_t mid = lo + (hi - lo) / 2;
			if (t[mid] - mid > L + j)
				hi = mid;
			else
				lo = mid + 1;
		}
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)((const char *)pg.records +
			                                 (uint64_t)l.record *
			                                         pg.list_stride);
		char *dst = bc_entry_row(pg, r, d[j]);
		const char *src = bc_entry_row(pg, r, L + j + lo);
		if (!dst || !src)
			continue;
		for (uint32_t u = lane; u < 2 * upr; u += 32) {
			uint64_t off = u < upr ? (uint64_t)u * sizeof(V)
			                       : v_off + (uint64_t)(u - upr) *
			                                         sizeof(V);
			*(V *)(dst + off) = *(const V *)(src + off);
		}
	}
}

/* Checks one list; its holes below the new length in *moves. */
static int bc_drops_check(const struct kvt_backend_drops *l, uint32_t i,
                          uint32_t n_records, const uint32_t *drops,
                          uint32_t *moves)
{
	if (l->record >= n_records || l->n_drop > l->len) {
		bc_note("compact_drops: list %u: record %u of %u, %u drops of "
		        "%u entries", i, l->record, n_records, l->n_drop, l->len);
		return KVT_EINVAL;
	}
	const uint32_t *d = drops + l->drop_off, nl = l->len - l->n_drop;
	uint32_t h = 0;
	for (uint32_t k = 0; k < l->n_drop; k++) {
		if (d[k] >= l->len || (k && d[k] <= d[k - 1])) {
			bc_note("compact_drops: list %u: drop %u (entry %u) is not "
			        "ascending below its length %u", i, k, d[k],
			        l->len);
			return KVT_EINVAL;
		}
		h += d[k] < nl;
	}
	*moves = h;
	return 0;
}

static int bc_compact_drops_locked(struct bc_ctx *c,
                                   const struct kvt_backend_paged *pg,
                                   uint32_t n_records,
                                   const struct kvt_backend_drops *lists,
                                   uint32_t n, const uint32_t *drops,
                                   cudaStream_t s)
{
	uint64_t total = 0, nd = 0;
	uint32_t nl = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t h;
		int rv = bc_drops_check(&lists[i], i, n_records, drops, &h);
		if (rv)
			return rv;
		if (h) {
			total += h;
			nd += lists[i].n_drop;
			nl++;
		}
	}
	if (!total)
		return 0;
	if (total > UINT32_MAX || nd > UINT32_MAX || !pg || !pg->records ||
	    !pg->chunk_bases || !pg->page_tokens || !pg->row_bytes ||
	    !pg->pages_per_chunk)
		return KVT_EINVAL;
	size_t lbytes = ((size_t)nl * sizeof(bc_drop_list) + 15) & ~(size_t)15;
	size_t need = lbytes + (size_t)nd * sizeof(uint32_t);
	BC_CALL(cudaSetDevice(c->device), "cudaSetDevice");
	struct bc_stage *st;
	int rv = bc_stage_take(c, need, s, &st);
	if (rv)
		return rv;
	bc_drop_list *hl = (bc_drop_list *)st->h;
	uint32_t *hd = (uint32_t *)(st->h + lbytes);
	uint32_t k = 0, mo = 0, doff = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_backend_drops *l = &lists[i];
		/* checked above: the holes are the drops below the new length */
		const uint32_t *d = drops + l->drop_off, nlen = l->len - l->n_drop;
		uint32_t h = (uint32_t)(std::lower_bound(d, d + l->n_drop, nlen) - d);
		if (!h)
			continue;
		hl[k++] = (bc_drop_list){l->record, l->len, l->n_drop, doff, mo,
		                         h};
		memcpy(hd + doff, drops + l->drop_off,
		       (size_t)l->n_drop * sizeof(uint32_t));
		doff += l->n_drop;
		mo += h;
	}
	if ((rv = bc_stage_send(c, st, need, s)))
		return rv;
	const bc_drop_list *dl = (const bc_drop_list *)st->d;
	const uint32_t *dd = (const uint32_t *)(st->d + lbytes);
	int sms = common_sm_count();
	unsigned cap = (unsigned)(sms > 0 ? sms : 132) * 16;
	unsigned blocks = common_cdiv(total, BC_DROPS_THREADS / 32);
	if (blocks > cap)
		blocks = cap;
	const kvt_backend_paged p = *pg;
	if (p.row_bytes % 16 == 0 && p.page_bytes % 16 == 0)
		KVT_LAUNCH(bc_drops_kernel<uint4>, blocks, BC_DROPS_THREADS, 0, s,
		           p, dl, nl, dd, (uint32_t)total);
	else if (p.row_bytes % 4 == 0 && p.page_bytes % 4 == 0)
		KVT_LAUNCH(bc_drops_kernel<uint32_t>, blocks, BC_DROPS_THREADS, 0,
		           s, p, dl, nl, dd, (uint32_t)total);
	else if (p.row_bytes % 2 == 0 && p.page_bytes % 2 == 0)
		KVT_LAUNCH(bc_drops_kernel<uint16_t>, blocks, BC_DROPS_THREADS, 0,
		           s, p, dl, nl, dd, (uint32_t)total);
	else
		KVT_LAUNCH(bc_drops_kernel<uint8_t>, blocks, BC_DROPS_THREADS, 0,
		           s, p, dl, nl, dd, (uint32_t)total);
	cudaError_t e = cudaGetLastError();
	cudaError_t e2 = cudaEventRecord(st->used, s);
	if (e != cudaSuccess)
		return bc_cuda(e, "compact_drops kernel");
	return bc_cuda(e2, "cudaEventRecord");
}

int bc_compact_drops(void *ctx, const struct kvt_backend_paged *pg,
                     uint32_t n_records, const struct kvt_backend_drops *lists,
                     uint32_t n, const uint32_t *drops, void *stream)
{
	struct bc_ctx *c = (struct bc_ctx *)ctx;
	if (!n)
		return 0;
	if (!lists || !drops)
		return KVT_EINVAL;
	pthread_mutex_lock(&c->lock);
	int rv = bc_compact_drops_locked(c, pg, n_records, lists, n, drops,
	                                 (cudaStream_t)stream);
	pthread_mutex_unlock(&c->lock);
	return rv;
}
