/*
 * pattern.c — the bytes kvtrim-loadgen writes into K and V (see main.c):
 * V carries its position and a tag naming who wrote it, the rest of V and
 * all of K are a hash of (tag, position, byte), so any surviving entry can
 * be decoded and checked byte for byte after any amount of compaction.
 * Pure functions; kf and kb are the caller's scratch.
 */
#include "loadgen.h"

#include <stdlib.h>

#include "kernels.h"

uint64_t pattern_mix(uint64_t x)
{
	/* splitmix64 finaliser: cheap, and every input bit moves every
	 * output bit, so neighbouring positions get unrelated bytes. */
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint32_t pattern_tag(uint64_t seed, uint32_t client, uint32_t seq,
                     uint32_t layer, uint32_t head)
{
	uint64_t h = pattern_mix(seed);
	h = pattern_mix(h ^ client);
	h = pattern_mix(h ^ seq);
	h = pattern_mix(h ^ layer);
	h = pattern_mix(h ^ head);
	return (uint32_t)h;
}

/* The per-byte part of the pattern hash: depends on (byte, is_v) only, so
 * engines compute it once per row layout (see pattern_bmix_init). */
static uint64_t bmix_of(uint32_t b, int is_v)
{
	return pattern_mix((uint64_t)b << 1 | (uint64_t)is_v);
}

/* bmix: [2 * row_bytes] as filled by pattern_bmix_init; byte b of K or V. */
static uint8_t byte_of(const uint64_t *bmix, size_t row_bytes, uint32_t tag,
                       uint32_t pos, uint32_t b, int is_v)
{
	return (uint8_t)pattern_mix(((uint64_t)tag << 32 | pos) ^
	                            bmix[(size_t)is_v * row_bytes + b]);
}

uint64_t *pattern_bmix_init(size_t row_bytes)
{
	uint64_t *t = malloc(2 * row_bytes * sizeof(*t));
	for (size_t b = 0; t && b < row_bytes; b++) {
		t[b] = bmix_of((uint32_t)b, 0);
		t[row_bytes + b] = bmix_of((uint32_t)b, 1);
	}
	return t;
}

static void put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

uint32_t pattern_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* The K row of (tag, pos): head_dim floats in [-1, 1) in dtype dt, into
 * out [row_bytes]; kf [head_dim] float scratch. */
static void key_row(const uint64_t *bmix, size_t row_bytes, uint32_t tag,
                    uint32_t pos, uint32_t head_dim, enum kvt_dtype dt,
                    float *kf, uint8_t *out)
{
	for (uint32_t e = 0; e < head_dim; e++)
		kf[e] = (float)(pattern_mix(((uint64_t)tag << 32 | pos) ^
		                            bmix[e]) >> 40) *
		        (2.0f / 16777216.0f) - 1.0f;
	dtype_from_f32(kf, dt, out, head_dim);
}

/* k, v: [row_bytes] each (head_dim elements of the tenant dtype). */
void pattern_write_entry(const uint64_t *bmix, uint8_t *k, uint8_t *v,
                         size_t row_bytes, uint32_t tag, uint32_t pos,
                         uint32_t head_dim, enum kvt_dtype dt, float *kf)
{
	key_row(bmix, row_bytes, tag, pos, head_dim, dt, kf, k);
	put_u32(v, pos);
	put_u32(v + 4, tag);
	for (size_t b = 8; b < row_bytes; b++)
		v[b] = byte_of(bmix, row_bytes, tag, pos, (uint32_t)b, 1);
}

/* Byte index of the first wrong byte, or -1 when the entry is intact.
 * kf [head_dim], kb [row_bytes] scratch. */
long pattern_check_entry(const uint64_t *bmix, const uint8_t *k,
                         const uint8_t *v, size_t row_bytes, uint32_t tag,
                         uint32_t pos, uint32_t head_dim, enum kvt_dtype dt,
                         float *kf, uint8_t *kb, int *is_v)
{
	*is_v = 0;
	key_row(bmix, row_bytes, tag, pos, head_dim, dt, kf, kb);
	for (size_t b = 0; b < row_bytes; b++)
		if (k[b] != kb[b])
			return (long)b;
	*is_v = 1;
	for (size_t b = 8; b < row_bytes; b++)
		if (v[b] != byte_of(bmix, row_bytes, tag, pos, (uint32_t)b, 1))
			return (long)b;
	return -1;
}
