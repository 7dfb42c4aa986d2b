/*
 * cmd_top.c — `kvtrimctl top`: the pool and every tenant, refreshed every
 * --interval, with rates from the difference of two snapshots.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "now.h"
#include "kvtrim.h"

/* ---------------------------------------------------------------- top */

static uint64_t row_u64(const struct ipc_row *row, const char *key)
{
	const struct ipc_val *v = codec_row_get(row, key);
	if (!v)
		return 0;
	if (v->type == IPC_VAL_U64)
		return v->v.u;
	if (v->type == IPC_VAL_I64 && v->v.i > 0)
		return (uint64_t)v->v.i;
	if (v->type == IPC_VAL_F64 && v->v.f > 0)
		return (uint64_t)v->v.f;
	return 0;
}

static double row_f64(const struct ipc_row *row, const char *key)
{
	const struct ipc_val *v = codec_row_get(row, key);
	if (!v)
		return 0;
	return v->type == IPC_VAL_F64 ? v->v.f
	       : v->type == IPC_VAL_U64 ? (double)v->v.u
	       : v->type == IPC_VAL_I64 ? (double)v->v.i : 0;
}

static const char *row_str(const struct ipc_row *row, const char *key)
{
	const struct ipc_val *v = codec_row_get(row, key);
	return v && v->type == IPC_VAL_STR ? v->v.s : "";
}

static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.1fG", (double)b / (1ull << 30));
	else if (b >= (1ull << 20))
		snprintf(buf, len, "%.1fM", (double)b / (1ull << 20));
	else
		snprintf(buf, len, "%.1fK", (double)b / 1024);
}

/* Previous sample of one tenant, for rates. */
struct top_prev {
	uint64_t id, syncs, evicted;
};

static const struct top_prev *top_find(const struct top_prev *p, size_t n,
                                       uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (p[i].id == id)
			return &p[i];
	return NULL;
}

static int top_cmp(const void *a, const void *b)
{
	const struct ipc_row *x = a, *y = b;
	uint64_t cx = row_u64(x, "chunks"), cy = row_u64(y, "chunks");
	if (cx != cy)
		return cx < cy ? 1 : -1;
	uint64_t ix = row_u64(x, "id"), iy = row_u64(y, "id");
	return ix < iy ? -1 : ix > iy;
}

/*
 * A refreshing view like top(1): one header of pool-wide numbers, then a
 * line per tenant, biggest holder first.  Rates are per second over the
 * last interval ("-" on the first screen).  The screen is cleared only
 * when stdout is a terminal, so `top --iterations N > file` logs plainly.
 */
int cmd_top(struct ctl *c)
{
	struct top_prev *prev = NULL;
	size_t n_prev = 0;
	uint64_t prev_syncs = 0, prev_err = 0;
	double prev_t = 0;
	int tty = isatty(STDOUT_FILENO);
	int rc = 0;

	for (long it = 0; !c->iterations || it < c->iterations; it++) {
		struct ipc_rep st, tn;
		if (it) {
			struct timespec ts = {c->interval_ms / 1000,
			                      (c->interval_ms % 1000) * 1000000L};
			nanosleep(&ts, NULL);
		}
		if (ctl_call(c, IPC_OP_STATS, NULL, &st) < 0) {
			rc = 2;
			break;
		}
		if (ctl_call(c, IPC_OP_TENANTS, NULL, &tn) < 0) {
			codec_rep_free(&st);
			rc = 2;
			break;
		}
		double now = (double)now_us() / 1e6, dt = it ? now - prev_t : 0;
		const struct ipc_row *g = st.table.n ? &st.table.rows[0] : NULL;
		if (!g) {
			fprintf(stderr, "kvtrimctl: top: empty stats reply\n");
			codec_rep_free(&st);
			codec_rep_free(&tn);
			rc = 2;
			break;
		}
		if (tn.table.n > 1)
			qsort(tn.table.rows, tn.table.n, sizeof(*tn.table.rows),
			      top_cmp);
		uint64_t syncs = row_u64(g, "syncs_total");
		uint64_t errs = row_u64(g, "error_replies_total");
		if (c->json) {
			fputs("{\"stats\":", stdout);
			out_json_row(g);
			fputs(",\"tenants\":", stdout);
			out_json_array(&tn);
			fputs("}\n", stdout);
		} else {
			char used[32], total[32], rate[32], erate[32];
			uint64_t up = row_u64(g, "uptime_seconds");
			fmt_bytes(used, sizeof(used), row_u64(g, "pool_bytes_used"));
			fmt_bytes(total, sizeof(total),
			          row_u64(g, "pool_size_bytes"));
			if (dt > 0) {
				snprintf(rate, sizeof(rate), "%.0f",
				         (double)(syncs - prev_syncs) / dt);
				snprintf(erate, sizeof(erate), "%.0f",
				         (double)(errs - prev_err) / dt);
			} else {
				snprintf(rate, sizeof(rate), "-");
				snprintf(erate, sizeof(erate), "-");
			}
			if (tty)
				fputs("\033[H\033[2J", stdout);
			printf("kvtrimd %s (%s)  up %" PRIu64 "h%02" PRIu64 "m%02"
			       PRIu64 "s  %s\n", row_str(g, "version"),
			       row_str(g, "backend"), up / 3600, up / 60 % 60,
			       up % 60, c->dir);
			printf("pool %s / %s (%.0f%%)  tenants %" PRIu64
			       "  sequences %" PRIu64 "  clients %" PRIu64
			       "  pressure %.2f  parked %" PRIu64 "\n",
			       used, total, 100 * row_f64(g, "pool_use_ratio"),
			       row_u64(g, "tenants"), row_u64(g, "sequences"),
			       row_u64(g, "clients_connected"),
			       row_f64(g, "pressure_level"),
			       row_u64(g, "backpressure_parked_requests"));
			printf("syncs/s %s  errors/s %s  evicted %" PRIu64
			       "  backpressure waits %" PRIu64 " timeouts %"
			       PRIu64 "\n\n", rate, erate,
			       row_u64(g, "entries_evicted_total"),
			       row_u64(g, "backpressure_waits_total"),
			       row_u64(g, "backpressure_timeouts_total"));
			printf("%5s %-16s %7s %-18s %5s %7s %6s %6s %8s %6s %8s "
			       "%5s\n", "ID", "NAME", "PID", "POLICY", "SEQS",
			       "PAGES", "HELD", "QUOTA%", "KEPT", "RATIO",
			       "SYNC/s", "FLAGS");
			for (uint32_t i = 0; i < tn.table.n; i++) {
				const struct ipc_row *r = &tn.table.rows[i];
				uint64_t id = row_u64(r, "id");
				uint64_t q = row_u64(r, "quota_bytes");
				const struct top_prev *p =
					top_find(prev, n_prev, id);
				char held[32], srate[32];
				uint64_t sy = row_u64(r, "syncs_total");
				fmt_bytes(held, sizeof(held), row_u64(r, "bytes"));
				if (p && dt > 0)
					snprintf(srate, sizeof(srate), "%.0f",
					         (double)(sy - p->syncs) / dt);
				else
					snprintf(srate, sizeof(srate), "-");
				printf("%5" PRIu64 " %-16.16s %7" PRIu64
				       " %-18.18s %5" PRIu64 " %7" PRIu64
				       " %6s %5.0f%% %8" PRIu64 " %6.2f %8s "
				       "%5s\n", id, row_str(r, "name"),
				       row_u64(r, "pid"), row_str(r, "policy"),
				       row_u64(r, "sequences"),
				       row_u64(r, "pages_used"), held,
				       q ? 100.0 * (double)row_u64(r, "bytes") /
				                   (double)q
				         : 0.0,
				       row_u64(r, "entries_kept"),
				       row_f64(r, "compression_ratio"), srate,
				       row_u64(r, "draining") ? "D" : "");
			}
			if (!tn.table.n)
				puts("  (no tenants)");
		}
		fflush(stdout);
		struct top_prev *np = calloc(tn.table.n ? tn.table.n : 1,
		                             sizeof(*np));
		if (np) {
			for (uint32_t i = 0; i < tn.table.n; i++)
				np[i] = (struct top_prev){
					row_u64(&tn.table.rows[i], "id"),
					row_u64(&tn.table.rows[i],
					        "syncs_total"),
					row_u64(&tn.table.rows[i],
					        "entries_evicted_total")};
			free(prev);
			prev = np;
			n_prev = tn.table.n;
		}
		prev_syncs = syncs;
		prev_err = errs;
		prev_t = now;
		codec_rep_free(&st);
		codec_rep_free(&tn);
	}
	free(prev);
	return rc;
}
