/*
 * table.c — kvtrim-eval's results files, shared by its programs: csv rows
 * (read back, so other models' rows are kept, and written; the rows of
 * protocols 1 and 2 from their jobs), the specs files (every job's spec as
 * run), the tables' order of the policies and quality.png (gnuplot).
 */
#include "eval.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int table_is_sweep(const struct row *r) { return isnan(r->target); }

static void fmt_num(char *b, size_t n, double v, const char *f)
{
	if (isnan(v))
		b[0] = 0;
	else
		snprintf(b, n, f, v);
}

int table_split_csv(char *line, char **f, int max)
{
	int n = 0;
	line[strcspn(line, "\r\n")] = 0;
	for (char *p = line; n < max;) {
		f[n++] = p;
		p = strchr(p, ',');
		if (!p)
			break;
		*p++ = 0;
	}
	return n;
}

/* Of this header or of the earlier one (no threshold): 9 or 10 fields. */
int table_parse_row(const char *line, struct row *r)
{
	char buf[1024], *f[11];
	snprintf(buf, sizeof(buf), "%s", line);
	int k = table_split_csv(buf, f, 11); /* an 11th field is ignored */
	if (k < 9)
		return -1;
	for (int i = 0; i < k && i < 10; i++)
		if (strlen(f[i]) >= 64)
			return -1;
	if (k == 9)
		f[9] = "";
	snprintf(r->model, sizeof(r->model), "%s", f[0]);
	snprintf(r->policy, sizeof(r->policy), "%s", f[1]);
	double *v[8] = {&r->target, &r->ach, &r->kl, &r->top1, &r->dnll,
	                &r->copy, &r->needle, &r->tau};
	for (int i = 0; i < 8; i++)
		*v[i] = f[2 + i][0] ? strtod(f[2 + i], NULL) : NAN;
	return 0;
}

size_t table_read_others(const char *path, const char *model,
                         const char *only, struct row *rows, size_t max)
{
	size_t nr = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char line[1024];
	while (fgets(line, sizeof(line), f) && nr < max) {
		if (!strncmp(line, "model,", 6))
			continue;
		if (table_parse_row(line, &rows[nr]) == 0 &&
		    (strcmp(rows[nr].model, model) ||
		     (only && !eval_in_list(only, rows[nr].policy))))
			nr++;
	}
	fclose(f);
	return nr;
}

void table_write_row(FILE *f, const struct row *r)
{
	char b[8][32];
	fmt_num(b[0], 32, r->target, "%.3f");
	fmt_num(b[1], 32, r->ach, "%.4f");
	fmt_num(b[2], 32, r->kl, "%.6f");
	fmt_num(b[3], 32, r->top1, "%.4f");
	fmt_num(b[4], 32, r->dnll, "%.5f");
	fmt_num(b[5], 32, r->copy, "%.4f");
	fmt_num(b[6], 32, r->needle, "%.4f");
	fmt_num(b[7], 32, r->tau, "%.4f");
	fprintf(f, "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", r->model, r->policy,
	        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
}

void table_write_csv(const char *path, const struct row *rows, size_t nr)
{
	FILE *f = fopen(path, "w");
	if (!f)
		eval_die("%s: %s", path, strerror(errno));
	fprintf(f, TABLE_CSV_HEADER "\n");
	for (size_t i = 0; i < nr; i++)
		table_write_row(f, &rows[i]);
	fclose(f);
}

void table_print_model(const struct row *rows, size_t nr, const char *model)
{
	for (size_t i = 0; i < nr; i++)
		if (!strcmp(rows[i].model, model))
			table_write_row(stdout, &rows[i]);
}

struct row *table_job_rows(const char *path, const char *model,
                           const char *only, const struct job *jobs,
                           uint32_t njobs, size_t *nout, int *bad)
{
	struct row *rows = calloc(1024 + njobs, sizeof(*rows));
	if (!rows)
		eval_die("out of memory");
	size_t nr = table_read_others(path, model, only, rows, 1024);
	*bad = 0;
	for (uint32_t k = 0; k < njobs; k++) {
		const struct job *j = &jobs[k];
		struct row *r = &rows[nr++];
		snprintf(r->model, sizeof(r->model), "%s", model);
		snprintf(r->policy, sizeof(r->policy), "%.31s", j->name);
		r->target = j->sweep ? NAN : j->ratio;
		r->tau = j->tau;
		r->copy = r->needle = NAN;
		*bad |= j->failed;
		if (j->failed || !j->npos || !j->nach) {
			r->ach = r->kl = r->top1 = r->dnll = NAN;
			continue;
		}
		r->ach = j->ach / j->nach;
		r->kl = j->kl / j->npos;
		r->top1 = j->top1 / j->npos;
		r->dnll = j->dnll / j->npos;
	}
	*nout = nr;
	return rows;
}

/* spec with every occurrence of abs replaced by rel. */
static void spec_print(FILE *f, const char *spec, const char *abs,
                       const char *rel)
{
	size_t n = strlen(abs);
	while (*spec) {
		if (n && !strncmp(spec, abs, n)) {
			fputs(rel, f);
			spec += n;
		} else {
			fputc(*spec++, f);
		}
	}
}

void table_write_spec(FILE *f, const struct job *j, const char *wabs,
                      const char *wdir)
{
	static const char *const lab[C_NKIND] = {"", " | copy: ",
	                                         " | needle: "};
	if (j->sweep)
		fprintf(f, "%s sweep ", j->name);
	else
		fprintf(f, "%s %.3f ", j->name, j->ratio);
	spec_print(f, j->spec[C_MAIN], wabs, wdir);
	for (int c = 1; c < C_NKIND; c++)
		if (j->spec[c][0]) {
			fputs(lab[c], f);
			spec_print(f, j->spec[c], wabs, wdir);
		}
	fputc('\n', f);
}

/* The lines of the specs file at path of the policies not in only (its
 * first line, the run's, dropped), malloc'd, or NULL.  A line is at most
 * three specs of KVT_SPEC_MAX and a name, well inside line[]. */
static char *specs_others(const char *path, const char *only)
{
	FILE *f = only ? fopen(path, "r") : NULL;
	if (!f)
		return NULL;
	char *keep = NULL, line[4096];
	size_t n = 0;
	FILE *m = open_memstream(&keep, &n);
	if (!m) {
		fclose(f);
		return NULL;
	}
	while (fgets(line, sizeof(line), f)) {
		char name[64];
		if (line[0] == '#' || sscanf(line, "%63s", name) != 1 ||
		    eval_in_list(only, name))
			continue;
		fputs(line, m);
	}
	fclose(f);
	fclose(m);
	return keep;
}

void table_write_specs(const char *path, const char *what, const char *only,
                       const struct job *jobs, uint32_t njobs,
                       const char *wabs, const char *wdir)
{
	char *others = specs_others(path, only);
	FILE *f = fopen(path, "w");
	if (!f)
		eval_die("%s: %s", path, strerror(errno));
	fprintf(f, "# %s\n", what);
	if (others)
		fputs(others, f);
	free(others);
	for (uint32_t k = 0; k < njobs; k++)
		table_write_spec(f, &jobs[k], wabs, wdir);
	fclose(f);
}


size_t table_order(const char *const *names, size_t nn, const char **out,
                   size_t max)
{
	const char *const *pol;
	const size_t npol = eval_policy_order(&pol);
	size_t n = 0;
	for (size_t p = 0; p < npol && n < max; p++)
		for (size_t i = 0; i < nn; i++)
			if (!strcmp(names[i], pol[p])) {
				out[n++] = pol[p];
				break;
			}
	for (size_t i = 0; i < nn && n < max; i++) {
		int seen = 0;
		for (size_t k = 0; k < n; k++)
			seen |= !strcmp(out[k], names[i]);
		if (!seen)
			out[n++] = names[i];
	}
	return n;
}

const double table_at[TABLE_NAT] = {0.5, 0.75, 0.875};

/* The header cells " what v |" of the columns v[n], then the separator
 * line. */
void table_md_cols(FILE *f, const char *what, const double *v, size_t n)
{
	for (size_t q = 0; q < n; q++)
		fprintf(f, " %s %.3f |", what, v[q]);
	fprintf(f, "\n|---|");
	for (size_t q = 0; q < n; q++)
		fprintf(f, "---|");
	fprintf(f, "\n");
}

void table_md_at_header(FILE *f, size_t q0)
{
	table_md_cols(f, "achieved", table_at + q0, TABLE_NAT - q0);
}

/* Sorts the row indices idx[n] by threshold (by_tau) or achieved ratio. */
static void sort_rows(const struct row *rows, size_t *idx, size_t n,
                      int by_tau)
{
	for (size_t a = 0; a < n; a++)
		for (size_t b = a + 1; b < n; b++) {
			const struct row *ra = &rows[idx[a]], *rb = &rows[idx[b]];
			if (by_tau ? rb->tau < ra->tau : rb->ach < ra->ach) {
				size_t t = idx[a];
				idx[a] = idx[b];
				idx[b] = t;
			}
		}
}

/* Indices of model's sweep rows of policy pol, by threshold. */
size_t table_sweep_rows(const struct row *rows, size_t nr, const char *model,
                         const char *pol, size_t *idx)
{
	size_t n = 0;
	for (size_t i = 0; i < nr; i++)
		if (table_is_sweep(&rows[i]) && !strcmp(rows[i].model, model) &&
		    !strcmp(rows[i].policy, pol))
			idx[n++] = i;
	sort_rows(rows, idx, n, 1);
	return n;
}

/* The models of the rows (at most 8), in order of first appearance. */
int table_models(const struct row *rows, size_t nr, char models[8][64])
{
	int nm = 0;
	for (size_t i = 0; i < nr; i++) {
		int seen = 0;
		for (int k = 0; k < nm; k++)
			seen |= !strcmp(models[k], rows[i].model);
		if (!seen && nm < 8)
			snprintf(models[nm++], 64, "%s", rows[i].model);
	}
	return nm;
}

FILE *table_open_md(const char *dir)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/quality.md", dir);
	FILE *f = fopen(path, "w");
	if (!f)
		eval_die("%s: %s", path, strerror(errno));
	return f;
}

void table_write_png(const char *dir, struct row *rows, size_t nr, int merge)
{
	if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
		fprintf(stderr, "kvtrim-eval: gnuplot not found, quality.png "
		                "not written (make deps installs gnuplot-nox)\n");
		return;
	}
	char models[8][64];
	int nm = table_models(rows, nr, models);
	const char *const *pol;
	const size_t npol = eval_policy_order(&pol);
	char dat[1200], gp[1200];
	snprintf(dat, sizeof(dat), "%s/.quality-plot.dat", dir);
	snprintf(gp, sizeof(gp), "%s/.quality-plot.gp", dir);
	FILE *d = fopen(dat, "w"), *g = fopen(gp, "w");
	size_t *idx = malloc(sizeof(size_t) * (nr + 1));
	if (!d || !g || !idx)
		eval_die("%s: %s", dat, strerror(errno));
	fprintf(g, "set terminal pngcairo size %d,480 font ',9'\n"
	           "set output '%s/quality.png'\n"
	           "set multiplot layout 1,%d\n"
	           "set logscale y\nset key left top font ',8'\n"
	           "set xlabel 'achieved compression ratio'\n"
	           "set ylabel 'mean next-token KL vs full (nats)'\n"
	           "set grid\n%s", 640 * nm, dir, nm,
	        merge ? "set xrange [0:1]\n" : "");
	int block = 0;
	for (int k = 0; k < nm; k++) {
		fprintf(g, "set title '%s'\nplot ", models[k]);
		int first = 1, lt = 0, lt_of[64] = {0};
		for (size_t p = 1; p < npol; p++) {
			int any = 0;
			size_t n = 0;
			for (size_t i = 0; i < nr; i++) {
				const struct row *r = &rows[i];
				if (strcmp(r->model, models[k]) ||
				    strcmp(r->policy, pol[p]) ||
				    (table_is_sweep(r) && !merge) || isnan(r->kl) ||
				    r->kl <= 0)
					continue;
				idx[n++] = i;
			}
			/* by achieved ratio, so a merged curve is a line */
			sort_rows(rows, idx, n, 0);
			for (size_t q = 0; q < n; q++) {
				fprintf(d, "%.5f %.8f\n", rows[idx[q]].ach,
				        rows[idx[q]].kl);
				any = 1;
			}
			if (!any)
				continue;
			fprintf(d, "\n\n");
			lt_of[p] = ++lt;
			fprintf(g, "%s'%s' index %d using 1:2 with linespoints "
			           "lt %d title '%s'", first ? "" : ", ", dat,
			        block, lt, pol[p]);
			block++;
			first = 0;
		}
		/* sweeps: dashed, in their policy's colour, by achieved ratio */
		for (size_t p = 1; p < npol && !merge; p++) {
			size_t n = table_sweep_rows(rows, nr, models[k],
			                      pol[p], idx);
			sort_rows(rows, idx, n, 0);
			int any = 0;
			for (size_t q = 0; q < n; q++) {
				const struct row *r = &rows[idx[q]];
				if (isnan(r->kl) || r->kl <= 0)
					continue;
				fprintf(d, "%.5f %.8f\n", r->ach, r->kl);
				any = 1;
			}
			if (!any)
				continue;
			fprintf(d, "\n\n");
			fprintf(g, "%s'%s' index %d using 1:2 with linespoints "
			           "lt %d dt 2 pt 6 title '%s sweep'",
			        first ? "" : ", ", dat, block,
			        lt_of[p] ? lt_of[p] : ++lt, pol[p]);
			block++;
			first = 0;
		}
		if (first)
			fprintf(g, "1/0 notitle");
		fprintf(g, "\n");
	}
	fprintf(g, "unset multiplot\n");
	fclose(d);
	fclose(g);
	free(idx);
	char cmd[2600];
	snprintf(cmd, sizeof(cmd), "gnuplot '%s'", gp);
	if (system(cmd) != 0)
		fprintf(stderr, "kvtrim-eval: gnuplot failed\n");
	unlink(dat);
	unlink(gp);
}

int table_write_results(const struct eval_opts *a, const struct job *jobs,
                      uint32_t njobs, const char *what, const char *tag,
                      const char *csv, table_md_fn md, table_png_fn png)
{
	char path[1200], w2[1024];
	if (a->only) { /* the md's and the specs' run line says so */
		snprintf(w2, sizeof(w2), "%s; --only %s: the other policies' "
		         "rows are the previous run's", what, a->only);
		what = w2;
	}
	snprintf(path, sizeof(path), "%s/specs-%s%s.txt", a->out, a->mname,
	         tag);
	table_write_specs(path, what, a->only, jobs, njobs, a->wabs, a->wdir);
	snprintf(path, sizeof(path), "%s/%s", a->out, csv);
	size_t nr;
	int bad;
	struct row *rows = table_job_rows(path, a->mname, a->only, jobs, njobs,
	                                  &nr, &bad);
	table_write_csv(path, rows, nr);
	md(a->out, rows, nr, a->mname, what);
	png(a->out, rows, nr, a->mname);
	table_print_model(rows, nr, a->mname);
	free(rows);
	return bad;
}
