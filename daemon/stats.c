/* stats.c — see stats.h. */
#include "stats.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double stats_bounds[STATS_NBUCKETS] = {
#define STATS_B_(x) x,
	STATS_BUCKETS(STATS_B_)
#undef STATS_B_
};

/* Error names by number, from the one error list. */
static const char *err_name(int num)
{
	switch (num) {
#define STATS_E_(name, n, text) case n: return #name;
		KVT_ERRNO_MAP(STATS_E_)
#undef STATS_E_
	default:
		return NULL;
	}
}

/* The one name of code c's counter, errors_<NAME>_total, in buf. */
static const char *err_key(char *buf, size_t len, int c)
{
	snprintf(buf, len, "errors_%s_total", err_name(c));
	return buf;
}

struct stats_snap *stats_snap_new(uint32_t n)
{
	struct stats_snap *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->tenant_list = calloc(n ? n : 1, sizeof(*s->tenant_list));
	if (!s->tenant_list) {
		free(s);
		return NULL;
	}
	return s;
}

void stats_snap_free(struct stats_snap *s)
{
	if (!s)
		return;
	free(s->tenant_list);
	free(s);
}

void stats_count_error(struct stats *s, int err)
{
	s->error_replies_total++;
	if (err < 0 && err > -STATS_NERR)
		s->errors_by_code[-err]++;
}

void stats_observe(struct stats_hist *h, double seconds)
{
	int b = 0;
	while (b < STATS_NBUCKETS && seconds > stats_bounds[b])
		b++;
	h->bucket[b]++;
	h->count++;
	h->sum += seconds;
}

/* ------------------------------------------------------------------ rows */

void stats_fill_row(const struct stats_snap *s, struct ipc_row *row)
{
	char key[IPC_KEY_MAX];
	codec_row_str(row, "version", s->version);
	codec_row_str(row, "backend", s->backend);
#define STATS_RG_(name, help) codec_row_u64(row, #name, s->name);
	STATS_GAUGES(STATS_RG_)
#undef STATS_RG_
#define STATS_RF_(name, help) codec_row_f64(row, #name, s->name);
	STATS_FGAUGES(STATS_RF_)
#undef STATS_RF_
#define STATS_RC_(name, help) codec_row_u64(row, #name, s->c.name);
	STATS_COUNTERS(STATS_RC_)
#undef STATS_RC_
#define STATS_RH_(name, help)                                                  \
	codec_row_u64(row, #name "_count", s->c.name.count);                   \
	codec_row_f64(row, #name "_sum", s->c.name.sum);
	STATS_HISTOGRAMS(STATS_RH_)
#undef STATS_RH_
	for (int c = 1; c < STATS_NERR && row->n < IPC_MAX_COLS; c++) {
		if (!s->c.errors_by_code[c] || !err_name(c))
			continue;
		codec_row_u64(row, err_key(key, sizeof(key), c),
		              s->c.errors_by_code[c]);
	}
}

void stats_fill_tenant_row(const struct stats_tenant *t, struct ipc_row *row)
{
	codec_row_u64(row, "id", t->id);
	codec_row_str(row, "name", t->name);
	codec_row_str(row, "policy", t->policy);
#define STATS_TRU_(field, kind, name, help) codec_row_u64(row, name, t->field);
	STATS_TENANT_U64(STATS_TRU_)
#undef STATS_TRU_
#define STATS_TRF_(field, kind, name, help) codec_row_f64(row, name, t->field);
	STATS_TENANT_F64(STATS_TRF_)
#undef STATS_TRF_
}

/* ------------------------------------------------------------ rendering */

/*
 * Length of the well-formed UTF-8 sequence at p (1..4), or 0 when the bytes
 * there are not one (overlong forms, surrogates and code points above
 * U+10FFFF included).  Names and specs are checked at hello, but what
 * reaches /metrics and /stats must be valid whatever a bug lets through.
 */
static size_t utf8_len(const unsigned char *p)
{
	if (p[0] < 0x80)
		return 1;
	size_t n = p[0] >= 0xc2 && p[0] <= 0xdf   ? 2
	           : p[0] >= 0xe0 && p[0] <= 0xef ? 3
	           : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
	                                          : 0;
	for (size_t i = 1; i < n; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) ||
	    (p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
		return 0;
	return n;
}

/* A Prometheus label value: backslash, double quote and newline escaped,
 * other control bytes dropped, bytes that are not UTF-8 as U+FFFD. */
static void prom_label(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		size_t n = utf8_len(p);
		if (*p == '\\')
			fputs("\\\\", f);
		else if (*p == '"')
			fputs("\\\"", f);
		else if (*p == '\n')
			fputs("\\n", f);
		else if (!n)
			fputs("\xef\xbf\xbd", f);
		else if (*p >= 0x20 && *p != 0x7f)
			fwrite(p, 1, n, f);
		p += n ? n : 1;
	}
}

static void prom_head(FILE *f, const char *name, const char *type,
                      const char *help)
{
	fprintf(f, "# HELP kvtrim_%s %s\n# TYPE kvtrim_%s %s\n", name, help,
	        name, type);
}

static void prom_hist(FILE *f, const char *name, const struct stats_hist *h)
{
	uint64_t cum = 0;
	for (int b = 0; b <= STATS_NBUCKETS; b++) {
		cum += h->bucket[b];
		if (b < STATS_NBUCKETS)
			fprintf(f, "kvtrim_%s_bucket{le=\"%g\"} %" PRIu64 "\n",
			        name, stats_bounds[b], cum);
		else
			fprintf(f, "kvtrim_%s_bucket{le=\"+Inf\"} %" PRIu64
			        "\n", name, cum);
	}
	fprintf(f, "kvtrim_%s_sum %.17g\n", name, h->sum);
	fprintf(f, "kvtrim_%s_count %" PRIu64 "\n", name, h->count);
}

static void prom_tenant_labels(FILE *f, const struct stats_tenant *t)
{
	fputs("{tenant=\"", f);
	prom_label(f, t->name);
	fprintf(f, "\",id=\"%" PRIu32 "\"}", t->id);
}

static void render_prom(const struct stats_snap *s, FILE *f)
{
	const struct stats_tenant *tl = s->tenant_list;
	const uint32_t nt = s->n_tenant_list;
	char key[IPC_KEY_MAX];
	fputs("# HELP kvtrim_info build and backend of this kvtrimd\n"
	      "# TYPE kvtrim_info gauge\nkvtrim_info{version=\"", f);
	prom_label(f, s->version);
	fputs("\",backend=\"", f);
	prom_label(f, s->backend);
	fputs("\"} 1\n", f);
#define STATS_PG_(name, help)                                                  \
	prom_head(f, #name, "gauge", help);                                    \
	fprintf(f, "kvtrim_" #name " %" PRIu64 "\n", s->name);
	STATS_GAUGES(STATS_PG_)
#undef STATS_PG_
#define STATS_PF_(name, help)                                                  \
	prom_head(f, #name, "gauge", help);                                    \
	fprintf(f, "kvtrim_" #name " %.17g\n", s->name);
	STATS_FGAUGES(STATS_PF_)
#undef STATS_PF_
#define STATS_PC_(name, help)                                                  \
	prom_head(f, #name, "counter", help);                                  \
	fprintf(f, "kvtrim_" #name " %" PRIu64 "\n", s->c.name);
	STATS_COUNTERS(STATS_PC_)
#undef STATS_PC_
#define STATS_PH_(name, help)                                                  \
	prom_head(f, #name, "histogram", help);                                \
	prom_hist(f, #name, &s->c.name);
	STATS_HISTOGRAMS(STATS_PH_)
#undef STATS_PH_
	/* Every known code, zeros included: a series that appears only after
	 * the first error breaks rate() over the window before it. */
	for (int c = 1; c < STATS_NERR; c++)
		if (err_name(c)) {
			err_key(key, sizeof(key), c);
			fprintf(f, "# HELP kvtrim_%s error replies with code "
			        "%s\n# TYPE kvtrim_%s counter\nkvtrim_%s %" PRIu64
			        "\n", key, err_name(c), key, key,
			        s->c.errors_by_code[c]);
		}
	/* Per tenant: one metric at a time, a line per tenant; first the
	 * strings of its row as labels of kvtrim_tenant_info. */
	fputs("# HELP kvtrim_tenant_info name, id and policy of each tenant\n"
	      "# TYPE kvtrim_tenant_info gauge\n", f);
	for (uint32_t i = 0; i < nt; i++) {
		fputs("kvtrim_tenant_info{tenant=\"", f);
		prom_label(f, tl[i].name);
		fprintf(f, "\",id=\"%" PRIu32 "\",policy=\"", tl[i].id);
		prom_label(f, tl[i].policy);
		fputs("\"} 1\n", f);
	}
/* One family per field: every tenant's value, printed with fmt. */
#define STATS_PT_(field, kind, name, help, fmt)                                \
	prom_head(f, "tenant_" name,                                           \
	          kind == STATS_COUNTER ? "counter" : "gauge", help);          \
	for (uint32_t i = 0; i < nt; i++) {                                    \
		fputs("kvtrim_tenant_" name, f);                               \
		prom_tenant_labels(f, &tl[i]);                                 \
		fprintf(f, fmt, tl[i].field);                                  \
	}
#define STATS_PTU_(field, kind, name, help)                                    \
	STATS_PT_(field, kind, name, help, " %" PRIu64 "\n")
#define STATS_PTF_(field, kind, name, help)                                    \
	STATS_PT_(field, kind, name, help, " %.17g\n")
	STATS_TENANT_U64(STATS_PTU_)
	STATS_TENANT_F64(STATS_PTF_)
#undef STATS_PTF_
#undef STATS_PTU_
#undef STATS_PT_
}

/* A JSON string: quotes, backslashes and controls escaped, bytes that
 * are not UTF-8 as \ufffd (JSON text must be valid UTF-8). */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		size_t n = utf8_len(p);
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\u%04x", *p);
		else if (!n)
			fputs("\\ufffd", f);
		else
			fwrite(p, 1, n, f);
		p += n ? n : 1;
	}
	fputc('"', f);
}

/* JSON has no NaN or infinity. */
static void json_f64(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.17g", v);
	else
		fputs("null", f);
}

static void json_hist(FILE *f, const struct stats_hist *h)
{
	uint64_t cum = 0;
	fputs("{\"buckets\":[", f);
	for (int b = 0; b < STATS_NBUCKETS; b++) {
		cum += h->bucket[b];
		fprintf(f, "%s[%g,%" PRIu64 "]", b ? "," : "", stats_bounds[b],
		        cum);
	}
	fprintf(f, "],\"count\":%" PRIu64 ",\"sum\":", h->count);
	json_f64(f, h->sum);
	fputc('}', f);
}

static void render_json(const struct stats_snap *s, FILE *f)
{
	char key[IPC_KEY_MAX];
	fputs("{\"version\":", f);
	json_str(f, s->version);
	fputs(",\"backend\":", f);
	json_str(f, s->backend);
#define STATS_JG_(name, help)                                                  \
	fprintf(f, ",\"" #name "\":%" PRIu64, s->name);
	STATS_GAUGES(STATS_JG_)
#undef STATS_JG_
#define STATS_JF_(name, help)                                                  \
	fputs(",\"" #name "\":", f);                                           \
	json_f64(f, s->name);
	STATS_FGAUGES(STATS_JF_)
#undef STATS_JF_
#define STATS_JC_(name, help)                                                  \
	fprintf(f, ",\"" #name "\":%" PRIu64, s->c.name);
	STATS_COUNTERS(STATS_JC_)
#undef STATS_JC_
#define STATS_JH_(name, help)                                                  \
	fputs(",\"" #name "\":", f);                                           \
	json_hist(f, &s->c.name);
	STATS_HISTOGRAMS(STATS_JH_)
#undef STATS_JH_
	for (int c = 1; c < STATS_NERR; c++)
		if (err_name(c))
			fprintf(f, ",\"%s\":%" PRIu64,
			        err_key(key, sizeof(key), c),
			        s->c.errors_by_code[c]);
	fputs(",\"tenant_list\":[", f);
	for (uint32_t i = 0; i < s->n_tenant_list; i++) {
		const struct stats_tenant *t = &s->tenant_list[i];
		fprintf(f, "%s{\"id\":%" PRIu32 ",\"name\":", i ? "," : "",
		        t->id);
		json_str(f, t->name);
		fputs(",\"policy\":", f);
		json_str(f, t->policy);
#define STATS_JTU_(field, kind, name, help)                                    \
		fprintf(f, ",\"" name "\":%" PRIu64, t->field);
		STATS_TENANT_U64(STATS_JTU_)
#undef STATS_JTU_
#define STATS_JTF_(field, kind, name, help)                                    \
		fputs(",\"" name "\":", f);                                    \
		json_f64(f, t->field);
		STATS_TENANT_F64(STATS_JTF_)
#undef STATS_JTF_
		fputc('}', f);
	}
	fputs("]}\n", f);
}

int stats_render(const struct stats_snap *s, enum stats_fmt fmt, char **out,
                 size_t *len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return KVT_ENOMEM;
	if (fmt == STATS_FMT_PROM)
		render_prom(s, f);
	else
		render_json(s, f);
	int bad = ferror(f);
	if (fclose(f) || bad) {
		free(buf);
		return KVT_ENOMEM;
	}
	*out = buf;
	*len = n;
	return 0;
}

/* ---------------------------------------------------------- publication */

void stats_pub_init(struct stats_pub *p)
{
	pthread_condattr_t ca;
	memset(p, 0, sizeof(*p));
	pthread_mutex_init(&p->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cond, &ca);
	pthread_condattr_destroy(&ca);
}

void stats_pub_destroy(struct stats_pub *p)
{
	stats_snap_free(p->snap);
	p->snap = NULL;
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
}

void stats_pub_publish(struct stats_pub *p, struct stats_snap *snap)
{
	struct stats_snap *old;
	pthread_mutex_lock(&p->lock);
	old = p->snap;
	p->snap = snap;
	p->gen++;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	stats_snap_free(old);
}

void stats_pub_close(struct stats_pub *p)
{
	pthread_mutex_lock(&p->lock);
	p->closed = 1;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

uint64_t stats_pub_gen(struct stats_pub *p)
{
	pthread_mutex_lock(&p->lock);
	uint64_t g = p->gen;
	pthread_mutex_unlock(&p->lock);
	return g;
}

int stats_pub_render(struct stats_pub *p, uint64_t min_gen, int wait_ms,
                     enum stats_fmt fmt, char **out, size_t *len)
{
	struct timespec dl;
	int rv;
	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += wait_ms / 1000;
	dl.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&p->lock);
	while (!p->closed && p->gen < min_gen &&
	       pthread_cond_timedwait(&p->cond, &p->lock, &dl) != ETIMEDOUT)
		;
	/* Rendering under the lock keeps the snapshot alive; the loop only
	 * waits here for as long as one rendering takes. */
	rv = p->snap ? stats_render(p->snap, fmt, out, len) : KVT_EBUSY;
	pthread_mutex_unlock(&p->lock);
	return rv;
}
