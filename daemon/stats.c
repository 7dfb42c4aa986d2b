/* stats.c — see stats.h. */
#include "stats.h"

#include <stdio.h>

#include "kvtrim.h"

void stats_fill_row(const struct stats *s, struct ipc_row *row)
{
#define STATS_ROW_(name, help) codec_row_u64(row, #name, s->name);
	STATS_COUNTERS(STATS_ROW_)
#undef STATS_ROW_
	for (int c = 1; c < 64; c++) {
		if (!s->errors_by_code[c])
			continue;
		char key[IPC_KEY_MAX];
		snprintf(key, sizeof(key), "errors_%s_total", kvt_errname(-c));
		codec_row_u64(row, key, s->errors_by_code[c]);
	}
}

void stats_count_error(struct stats *s, int err)
{
	s->errors_total++;
	if (err < 0 && err > -64)
		s->errors_by_code[-err]++;
}
