/* compact_test.c — compaction planning and the CPU mover, hand-checked. */
#include <stdlib.h>
#include <string.h>

#include "compact.h"
#include "test.h"

/* Runs compact_plan and compares with the expected (dst, src) pairs. */
static void expect_plan(const uint8_t *drop, uint32_t len, uint32_t want_len,
                        const uint32_t *want, uint32_t want_n)
{
	uint32_t moves[64][2];
	uint32_t new_len = 12345;
	memset(moves, 0xee, sizeof(moves));
	uint32_t n = compact_plan(drop, len, &moves[0][0], &new_len);
	T_EQ(new_len, want_len);
	T_EQ(n, want_n);
	for (uint32_t i = 0; i < n; i++) {
		T_EQ(moves[i][0], want[2 * i]);
		T_EQ(moves[i][1], want[2 * i + 1]);
	}
}

TEST(compact, plan_none_dropped)
{
	const uint8_t drop[5] = {0, 0, 0, 0, 0};
	expect_plan(drop, 5, 5, NULL, 0);
}

TEST(compact, plan_all_dropped)
{
	const uint8_t drop[4] = {1, 1, 1, 1};
	expect_plan(drop, 4, 0, NULL, 0);
}

TEST(compact, plan_empty_list)
{
	expect_plan((const uint8_t *)"", 0, 0, NULL, 0);
}

TEST(compact, plan_only_tail_dropped)
{
	const uint8_t drop[5] = {0, 0, 0, 1, 1};
	expect_plan(drop, 5, 3, NULL, 0);
}

TEST(compact, plan_holes_at_front)
{
	/* kept: 2,3,4,5 -> new_len 4; holes 0,1 take 4,5. */
	const uint8_t drop[6] = {1, 1, 0, 0, 0, 0};
	const uint32_t want[] = {0, 4, 1, 5};
	expect_plan(drop, 6, 4, want, 2);
}

TEST(compact, plan_alternating)
{
	/* kept: 1,3,5,7 -> new_len 4; holes 0,2 take 5,7. */
	const uint8_t drop[8] = {1, 0, 1, 0, 1, 0, 1, 0};
	const uint32_t want[] = {0, 5, 2, 7};
	expect_plan(drop, 8, 4, want, 2);
}

TEST(compact, plan_mixed_tail_skips_dropped)
{
	/* kept: 0,2,3,6,8 -> new_len 5; holes 1,4 take 6,8 (7 skipped). */
	const uint8_t drop[9] = {0, 1, 0, 0, 1, 1, 0, 1, 0};
	const uint32_t want[] = {1, 6, 4, 8};
	expect_plan(drop, 9, 5, want, 2);
}

TEST(compact, plan_single_survivor_at_end)
{
	const uint8_t drop[4] = {1, 1, 1, 0};
	const uint32_t want[] = {0, 3};
	expect_plan(drop, 4, 1, want, 1);
}

/* K byte j of entry e, and its V twin. */
static uint8_t kb(uint32_t e, uint32_t j) { return (uint8_t)(e * 16 + j); }
static uint8_t vb(uint32_t e, uint32_t j) { return (uint8_t)(255 - e * 16 - j); }

TEST(compact, cpu_moves_rows_across_pages)
{
	enum { P = 3, ROW = 8, NPAGES = 4 };
	/* Separate allocations: nothing may assume pages are contiguous. */
	uint8_t *pages[NPAGES];
	for (int p = 0; p < NPAGES; p++) {
		pages[p] = malloc(2 * P * ROW);
		T_ASSERT(pages[p]);
		for (uint32_t r = 0; r < P; r++)
			for (uint32_t j = 0; j < ROW; j++) {
				uint32_t e = (uint32_t)p * P + r;
				pages[p][r * ROW + j] = kb(e, j);
				pages[p][P * ROW + r * ROW + j] = vb(e, j);
			}
	}
	/* entry 1 (page 0 row 1) <- entry 10 (page 3 row 1);
	 * entry 4 (page 1 row 1) <- entry 8 (page 2 row 2);
	 * entry 2 (page 0 row 2) <- entry 9 (page 3 row 0). */
	const uint32_t moves[] = {1, 10, 2, 9, 4, 8};
	compact_cpu((void *const *)pages, P, ROW, moves, 3);

	/* expected source entry of every slot after the moves */
	uint32_t from[NPAGES * P];
	for (uint32_t e = 0; e < NPAGES * P; e++)
		from[e] = e;
	from[1] = 10;
	from[2] = 9;
	from[4] = 8;
	for (uint32_t e = 0; e < NPAGES * P; e++)
		for (uint32_t j = 0; j < ROW; j++) {
			uint8_t *pg = pages[e / P];
			T_EQ(pg[(e % P) * ROW + j], kb(from[e], j));
			T_EQ(pg[P * ROW + (e % P) * ROW + j], vb(from[e], j));
		}
	for (int p = 0; p < NPAGES; p++)
		free(pages[p]);
}

TEST(compact, cpu_no_moves_touches_nothing)
{
	uint8_t page[2 * 2 * 4];
	memset(page, 0x5a, sizeof(page));
	void *pages[1] = {page};
	compact_cpu(pages, 2, 4, NULL, 0);
	for (size_t i = 0; i < sizeof(page); i++)
		T_EQ(page[i], 0x5a);
}

TEST(compact, large_compaction_streams_and_keeps_every_row)
{
	/* 32768 entries of 256-byte rows in 16-entry pages, every even entry
	 * dropped: 8192 moves, 4 MiB moved, which takes the streaming-store
	 * path.  Every row carries its entry id in all its 32-bit words. */
	enum { P = 16, ROW = 256, LEN = 32768, NP = LEN / P };
	uint32_t *mem = malloc((size_t)NP * 2 * P * ROW);
	void **pages = malloc(sizeof(void *) * NP);
	uint8_t *drop = malloc(LEN);
	uint32_t *moves = malloc(sizeof(uint32_t) * 2 * LEN);
	T_ASSERT(mem && pages && drop && moves);
	for (uint32_t p = 0; p < NP; p++) /* reversed page order */
		pages[p] = (char *)mem + (size_t)(NP - 1 - p) * 2 * P * ROW;
	for (uint32_t e = 0; e < LEN; e++) {
		uint32_t *k = (uint32_t *)((char *)pages[e / P] + (e % P) * ROW);
		uint32_t *v = (uint32_t *)((char *)k + P * ROW);
		for (uint32_t w = 0; w < ROW / 4; w++) {
			k[w] = e;
			v[w] = ~e;
		}
		drop[e] = e % 2 == 0;
	}
	uint32_t new_len;
	uint32_t n = compact_plan(drop, LEN, moves, &new_len);
	T_EQ(new_len, LEN / 2);
	T_EQ(n, LEN / 4); /* even entries below LEN/2 */
	compact_cpu(pages, P, ROW, moves, n);
	uint8_t *seen = calloc(LEN, 1);
	for (uint32_t e = 0; e < new_len; e++) {
		uint32_t *k = (uint32_t *)((char *)pages[e / P] + (e % P) * ROW);
		uint32_t *v = (uint32_t *)((char *)k + P * ROW);
		uint32_t id = k[0];
		T_ASSERT(id < LEN && id % 2 == 1 && !seen[id]);
		seen[id] = 1;
		for (uint32_t w = 0; w < ROW / 4; w++) {
			T_EQ(k[w], id);
			T_EQ(v[w], ~id);
		}
	}
	free(seen);
	free(mem);
	free(pages);
	free(drop);
	free(moves);
}

/* compact_plan_drops against compact_plan (an independent walk over the
 * marks) on random mark patterns of every density, and the edge cases: no
 * drops, all dropped, drops only in the tail, only in the head. */
TEST(compact, plan_drops_equals_plan_of_marks)
{
	enum { LEN = 97 };
	uint8_t drop[LEN];
	uint32_t d[LEN], m1[2 * LEN], m2[2 * LEN];
	uint32_t seed = 12345;
	for (uint32_t trial = 0; trial < 400; trial++) {
		uint32_t len = trial % LEN + 1, nd = 0, dens = trial % 7;
		for (uint32_t i = 0; i < len; i++) {
			seed = seed * 1664525u + 1013904223u;
			drop[i] = dens == 0 ? 0 : dens == 6 ? 1
			          : dens == 5 ? i >= len / 2
			          : dens == 4 ? i < len / 3
			          : (seed >> 16) % 6 < dens;
			if (drop[i])
				d[nd++] = i;
		}
		uint32_t nl1, nl2;
		uint32_t n1 = compact_plan(drop, len, m1, &nl1);
		uint32_t n2 = compact_plan_drops(d, nd, len, m2, &nl2);
		T_EQ(nl2, nl1);
		T_EQ(n2, n1);
		T_ASSERT(!memcmp(m1, m2, (size_t)n1 * 2 * sizeof(uint32_t)));
	}
}
