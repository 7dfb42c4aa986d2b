/*
 * curve.c — comparisons at equal achieved compression: a policy's runs are
 * points (achieved ratio, metric) of one curve, and the curve is read at a
 * given achieved ratio by linear interpolation between the nearest
 * measured points on either side.  Points whose metric is NaN (a failed
 * run) are ignored; points at the same achieved ratio count as their mean.
 * Outside the measured range there is no value (NaN, "n/a" in the
 * tables): a curve is never extrapolated.
 */
#include "eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Mean of y over the points at exactly x0 (n counted). */
static double mean_at(const double *x, const double *y, size_t n, double x0)
{
	double s = 0;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (!isnan(y[i]) && x[i] == x0) {
			s += y[i];
			k++;
		}
	return s / (double)k;
}

double curve_at(const double *x, const double *y, size_t n, double x0)
{
	double lo = -INFINITY, hi = INFINITY;
	for (size_t i = 0; i < n; i++) {
		if (isnan(y[i]) || isnan(x[i]))
			continue;
		if (x[i] <= x0 && x[i] > lo)
			lo = x[i];
		if (x[i] >= x0 && x[i] < hi)
			hi = x[i];
	}
	if (isinf(lo) || isinf(hi))
		return NAN;
	double ylo = mean_at(x, y, n, lo);
	if (hi == lo)
		return ylo;
	double yhi = mean_at(x, y, n, hi);
	return ylo + (yhi - ylo) * (x0 - lo) / (hi - lo);
}

/* The policies of model's rows in table order (table_order), at most
 * max. */
static size_t policies_of(const struct row *rows, size_t nr,
                          const char *model, const char **out, size_t max)
{
	const char **names = malloc(sizeof(*names) * (nr + 1));
	if (!names)
		eval_die("out of memory");
	size_t k = 0;
	for (size_t i = 0; i < nr; i++)
		if (!strcmp(rows[i].model, model))
			names[k++] = rows[i].policy;
	size_t n = table_order(names, k, out, max);
	free(names);
	return n;
}

static void fmt_or(char *b, size_t n, double v, const char *f)
{
	if (isnan(v))
		snprintf(b, n, "n/a");
	else
		snprintf(b, n, f, v);
}

void curve_write_tables(FILE *f, const struct row *rows, size_t nr,
                           const char *model, const char *csv)
{
	fprintf(f,
	        "## At equal achieved compression\n\n"
	        "Each policy's runs (every target and threshold) form one "
	        "curve of (achieved, metric); the cells read it at the "
	        "achieved ratio of the column by linear interpolation between "
	        "the nearest runs on either side (n/a: the curve does not "
	        "reach it; no extrapolation). Cells: KL / top-1 / dNLL. Bounds "
	        "are marked.\n\n| policy |");
	table_md_at_header(f, 0);
	const char *pol[128];
	size_t np = policies_of(rows, nr, model, pol, 128);
	double *x = malloc(sizeof(double) * (nr + 1) * 4);
	if (!x)
		eval_die("out of memory");
	double *ykl = x + nr + 1, *yt = ykl + nr + 1, *yd = yt + nr + 1;
	for (size_t p = 0; p < np; p++) {
		size_t n = 0;
		for (size_t i = 0; i < nr; i++) {
			const struct row *r = &rows[i];
			if (strcmp(r->model, model) || strcmp(r->policy, pol[p]) ||
			    isnan(r->kl))
				continue;
			x[n] = r->ach;
			ykl[n] = r->kl;
			yt[n] = r->top1;
			yd[n++] = r->dnll;
		}
		fprintf(f, "| %s%s |", pol[p], eval_is_bound(pol[p]) ? " (bound)" : "");
		if (!strcmp(pol[p], "full")) {
			/* no compression: its own run, in every column */
			for (size_t q = 0; q < TABLE_NAT; q++)
				if (n)
					fprintf(f, " %.4f / %.3f / %.4f (achieved "
					        "%.3f) |", ykl[0], yt[0], yd[0],
					        x[0]);
				else
					fprintf(f, " failed |");
			fprintf(f, "\n");
			continue;
		}
		for (size_t q = 0; q < TABLE_NAT; q++) {
			char a[32], b[32], c[32];
			fmt_or(a, sizeof(a), curve_at(x, ykl, n, table_at[q]), "%.4f");
			fmt_or(b, sizeof(b), curve_at(x, yt, n, table_at[q]), "%.3f");
			fmt_or(c, sizeof(c), curve_at(x, yd, n, table_at[q]), "%.4f");
			if (!strcmp(a, "n/a"))
				fprintf(f, " n/a |");
			else
				fprintf(f, " %s / %s / %s |", a, b, c);
		}
		fprintf(f, "\n");
	}
	fprintf(f, "\n## Runs\n\nEvery run as measured (%s): the "
	           "target ratio (empty for a threshold-sweep run), kvzap's "
	           "threshold, the achieved ratio.\n\n| policy | target | "
	           "threshold | achieved | KL | top-1 | dNLL |\n"
	           "|---|---|---|---|---|---|---|\n", csv);
	for (size_t p = 0; p < np; p++)
		for (size_t i = 0; i < nr; i++) {
			const struct row *r = &rows[i];
			if (strcmp(r->model, model) || strcmp(r->policy, pol[p]))
				continue;
			char t[32], th[32];
			if (isnan(r->target))
				snprintf(t, sizeof(t), "sweep");
			else
				snprintf(t, sizeof(t), "%.3f", r->target);
			if (isnan(r->tau))
				th[0] = 0;
			else
				snprintf(th, sizeof(th), "%.4g", r->tau);
			if (isnan(r->kl))
				fprintf(f, "| %s | %s | %s | failed | | | |\n",
				        r->policy, t, th);
			else
				fprintf(f, "| %s | %s | %s | %.3f | %.4f | %.3f | "
				           "%.4f |\n", r->policy, t, th, r->ach,
				        r->kl, r->top1, r->dnll);
		}
	free(x);
}
