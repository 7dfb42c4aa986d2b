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
