/*
 * out.c — renderings of reply rows: JSON (--json) and plain
 * "key value" lines or aligned tables.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "kvtrim.h"

/* ---------------------------------------------------------------- output */

static void json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"':
			fputs("\\\"", stdout);
			break;
		case '\\':
			fputs("\\\\", stdout);
			break;
		case '\n':
			fputs("\\n", stdout);
			break;
		case '\t':
			fputs("\\t", stdout);
			break;
		case '\r':
			fputs("\\r", stdout);
			break;
		default:
			if (*p < 0x20)
				printf("\\u%04x", *p);
			else
				putchar(*p);
		}
	}
	putchar('"');
}

/* A value as text (plain output); buf holds at least IPC_STR_MAX bytes. */
const char *out_val_text(const struct ipc_val *v, char *buf, size_t len)
{
	switch (v->type) {
	case IPC_VAL_U64:
		snprintf(buf, len, "%" PRIu64, v->v.u);
		break;
	case IPC_VAL_I64:
		snprintf(buf, len, "%" PRId64, v->v.i);
		break;
	case IPC_VAL_F64:
		snprintf(buf, len, "%.6g", v->v.f);
		break;
	case IPC_VAL_STR:
		return v->v.s;
	}
	return buf;
}

static void json_val(const struct ipc_val *v)
{
	switch (v->type) {
	case IPC_VAL_U64:
		printf("%" PRIu64, v->v.u);
		break;
	case IPC_VAL_I64:
		printf("%" PRId64, v->v.i);
		break;
	case IPC_VAL_F64:
		if (isfinite(v->v.f))
			printf("%.17g", v->v.f);
		else
			fputs("null", stdout);
		break;
	case IPC_VAL_STR:
		json_str(v->v.s);
		break;
	}
}

void out_json_row(const struct ipc_row *row)
{
	putchar('{');
	for (uint32_t i = 0; i < row->n; i++) {
		if (i)
			putchar(',');
		json_str(row->vals[i].key);
		putchar(':');
		json_val(&row->vals[i]);
	}
	putchar('}');
}

void out_json_array(const struct ipc_rep *rep)
{
	putchar('[');
	for (uint32_t i = 0; i < rep->table.n; i++) {
		if (i)
			putchar(',');
		out_json_row(&rep->table.rows[i]);
	}
	putchar(']');
}

void out_json_rows(const struct ipc_rep *rep)
{
	out_json_array(rep);
	putchar('\n');
}

/* "key value" per line for one row. */
void out_plain_kv(const struct ipc_row *row)
{
	char buf[IPC_STR_MAX];
	for (uint32_t i = 0; i < row->n; i++)
		printf("%s %s\n", row->vals[i].key,
		       out_val_text(&row->vals[i], buf, sizeof(buf)));
}

/*
 * A table: the columns of the first row in their order (then any key a
 * later row adds), left-aligned, "-" where a row lacks a column.
 */
void out_plain_table(const struct ipc_rep *rep)
{
	const char *cols[IPC_MAX_COLS];
	size_t width[IPC_MAX_COLS];
	uint32_t nc = 0;
	char buf[IPC_STR_MAX];

	for (uint32_t r = 0; r < rep->table.n; r++) {
		const struct ipc_row *row = &rep->table.rows[r];
		for (uint32_t i = 0; i < row->n && nc < IPC_MAX_COLS; i++) {
			uint32_t k;
			for (k = 0; k < nc; k++)
				if (!strcmp(cols[k], row->vals[i].key))
					break;
			if (k == nc) {
				cols[nc] = row->vals[i].key;
				width[nc++] = strlen(row->vals[i].key);
			}
			size_t w = strlen(out_val_text(&row->vals[i], buf,
			                           sizeof(buf)));
			if (w > width[k])
				width[k] = w;
		}
	}
	for (uint32_t k = 0; k < nc; k++)
		printf("%-*s%s", (int)width[k], cols[k],
		       k + 1 < nc ? "  " : "\n");
	for (uint32_t r = 0; r < rep->table.n; r++) {
		const struct ipc_row *row = &rep->table.rows[r];
		for (uint32_t k = 0; k < nc; k++) {
			const struct ipc_val *v = codec_row_get(row, cols[k]);
			const char *t = v ? out_val_text(v, buf, sizeof(buf)) : "-";
			if (k + 1 < nc)
				printf("%-*s  ", (int)width[k], t);
			else
				printf("%s\n", t);
		}
	}
}
