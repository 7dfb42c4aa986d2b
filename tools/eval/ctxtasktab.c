/*
 * ctxtasktab.c — the results files of protocol 1's tasks (ctxtask.c):
 * DIR/<task>.csv (every cell: the full cache per length and depth, then
 * every job per depth and over the depths run) and DIR/<task>.md (the
 * full cache's table first, then the policies at equal ACHIEVED
 * compression, curve.c, then every run as measured).  Accuracies carry
 * their trial counts and Wilson 95 % intervals (ctxtask_wilson).
 */
#include "ctxtask.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double at[] = {0.5, 0.75, 0.875};
#define NAT (sizeof(at) / sizeof(at[0]))

#define CSV_HEADER "part,length,depth,policy,target_ratio,threshold," \
	           "achieved_ratio,correct,trials,accuracy,ci_lo,ci_hi," \
	           "prompt_tokens,token_top1"

/* The sum of the cells on[d] of c[nd] (on NULL: all). */
static struct ctxtask_cell sum(const struct ctxtask_cell *c, uint32_t nd,
                               const uint8_t *on)
{
	struct ctxtask_cell s = {0};
	for (uint32_t d = 0; d < nd; d++) {
		if (on && !on[d])
			continue;
		s.ok += c[d].ok;
		s.n += c[d].n;
		s.top1 += c[d].top1;
		s.tokens += c[d].tokens;
	}
	return s;
}

static double acc(const struct ctxtask_cell *c)
{
	return c->n ? (double)c->ok / c->n : NAN;
}

/* "k/n 0.90 [0.60, 0.98]" */
static void fmt_cell(char *b, size_t len, const struct ctxtask_cell *c)
{
	double lo, hi;
	if (!c->n) {
		snprintf(b, len, "-");
		return;
	}
	ctxtask_wilson(c->ok, c->n, &lo, &hi);
	snprintf(b, len, "%llu/%llu %.2f [%.2f, %.2f]",
	         (unsigned long long)c->ok, (unsigned long long)c->n, acc(c),
	         lo, hi);
}

static void depth_name(char *b, size_t len, const struct ctxtask_result *R,
                       uint32_t d)
{
	if (R->depth)
		snprintf(b, len, "%.2f", R->depth[d]);
	else
		snprintf(b, len, "-");
}

static void csv_row(FILE *f, const struct ctxtask_result *R,
                    const char *part, uint32_t len, const char *depth,
                    const struct job *j, double ach,
                    const struct ctxtask_cell *c)
{
	double lo, hi;
	ctxtask_wilson(c->ok, c->n, &lo, &hi);
	fprintf(f, "%s,%u,%s,%s,", part, len, depth, j ? j->name : "full");
	if (j && !j->sweep)
		fprintf(f, "%.3f", j->ratio);
	fputc(',', f);
	if (j && !isnan(j->tau))
		fprintf(f, "%.4f", j->tau);
	fputc(',', f);
	if (!isnan(ach))
		fprintf(f, "%.4f", ach);
	fprintf(f, ",%llu,%llu,", (unsigned long long)c->ok,
	        (unsigned long long)c->n);
	if (c->n)
		fprintf(f, "%.4f,%.4f,%.4f,%.1f", acc(c), lo, hi,
		        c->tokens / c->n);
	else
		fprintf(f, ",,,");
	fputc(',', f);
	if (c->n && R->kind == CTXTASK_COPY)
		fprintf(f, "%.4f", c->top1 / c->n);
	fputc('\n', f);
}

static FILE *open_out(const char *dir, const char *name, const char *ext)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/%s.%s", dir, name, ext);
	FILE *f = fopen(path, "w");
	if (!f)
		eval_die("%s: %s", path, strerror(errno));
	return f;
}

static double job_ach(const struct ctxtask_jres *r)
{
	return r->nach && !r->failed ? r->ach / r->nach : NAN;
}

static void write_csv(const char *dir, const struct ctxtask_result *R)
{
	FILE *f = open_out(dir, R->name, "csv");
	char d[16];
	fprintf(f, CSV_HEADER "\n");
	for (uint32_t li = 0; li < R->nlen; li++) {
		for (uint32_t di = 0; di < R->ndepth; di++) {
			depth_name(d, sizeof(d), R, di);
			csv_row(f, R, "full-cache", R->len[li], d, NULL, 0,
			        &R->scan[li][di]);
		}
		struct ctxtask_cell s = sum(R->scan[li], R->ndepth, NULL);
		if (R->ndepth > 1)
			csv_row(f, R, "full-cache", R->len[li], "all", NULL, 0,
			        &s);
	}
	for (uint32_t ri = 0; ri < R->nrun; ri++) {
		uint32_t L = R->len[R->run[ri].li];
		for (uint32_t k = 0; k < R->run[ri].njobs; k++) {
			const struct job *j = &R->run[ri].jobs[k];
			const struct ctxtask_jres *r = &R->run[ri].res[k];
			double a = job_ach(r);
			for (uint32_t di = 0; di < R->ndepth; di++) {
				if (!R->run[ri].on[di])
					continue;
				depth_name(d, sizeof(d), R, di);
				csv_row(f, R, "policies", L, d, j, a, &r->c[di]);
			}
			struct ctxtask_cell s = sum(r->c, R->ndepth,
			                            R->run[ri].on);
			csv_row(f, R, "policies", L, "all", j, a, &s);
		}
	}
	fclose(f);
}

/* The order of the policies of a run's jobs: table_policy_order first,
 * then the others as they come; returns their number. */
static uint32_t policies(const struct job *jobs, uint32_t nj,
                         const char **out, uint32_t max)
{
	uint32_t n = 0;
	for (size_t p = 0; p < table_npolicy && n < max; p++)
		for (uint32_t k = 0; k < nj; k++)
			if (!strcmp(jobs[k].name, table_policy_order[p])) {
				out[n++] = table_policy_order[p];
				break;
			}
	for (uint32_t k = 0; k < nj && n < max; k++) {
		int seen = 0;
		for (uint32_t i = 0; i < n; i++)
			seen |= !strcmp(out[i], jobs[k].name);
		if (!seen)
			out[n++] = jobs[k].name;
	}
	return n;
}

static void md_intro(FILE *f, const struct ctxtask_result *R,
                     const char *what)
{
	fprintf(f, "# %s: %s task, context compression\n\n"
	        "Generated by `kvtrim-eval --model %s` (tools/eval/ctxtask.c; "
	        "`make eval`) with %s.csv; do not edit by hand. Run: %s%s."
	        "\n\n", R->model, R->kind == CTXTASK_NEEDLE ? "pass-key needle"
	        : "copy", R->model, R->name, what,
	        R->quick ? " (quick: one length, policies run whatever the "
	                   "full cache scores)" : "");
	fprintf(f, "Protocol 1 (as quality.md): each case is one chat prompt "
	        "(the model's template, its default system message, ONE user "
	        "message holding the document and the question, the "
	        "generation prompt) built from the held-out evaluation text "
	        "only, seeded. It is prefilled once; each policy then "
	        "compresses the whole prompt's cache once (kvtrimd; kvzip and "
	        "the hindsight oracle in process, the oracle scoring entries by "
	        "the attention of the full cache's answer); the answer is "
	        "decoded on the kept entries without further compression, "
	        "positions continuing. The first answer token comes from the "
	        "prefill, on the full cache, for every policy. ");
	if (R->kind == CTXTASK_NEEDLE)
		fprintf(f, "The document: \"There is a pass key hidden inside a "
		        "lot of irrelevant text. ...\", then held-out filler with "
		        "the line \"The pass key is K. Remember it. K is the pass "
		        "key.\" (K: 5 seeded digits) at the first line start "
		        "after the given fraction (depth) of the filler's tokens, "
		        "then \"What is the pass key? Answer with the 5-digit "
		        "number only.\" The answer is decoded greedily (at most "
		        "%u tokens, stopping at the end of turn or after the "
		        "first run of digits) and is right when its first run of "
		        "digits is exactly K. Chance: about 0.\n\n",
		        CTXTASK_ANS_MAX);
	else
		fprintf(f, "The document: \"Remember this line:\", a held-out "
		        "line (40-%u bytes), \"Then read this text:\", held-out "
		        "filler, then the request to repeat the line exactly. "
		        "Right: exact match, computed teacher-forced (every "
		        "argmax along the line's tokens is the line's next token; "
		        "the same as a greedy answer that begins with the line); "
		        "token top-1 is the fraction of the line's tokens "
		        "predicted. Chance: about 0.\n\n", CTXTASK_LINE_MAX);
}

static void md_scan(FILE *f, const struct ctxtask_result *R)
{
	char b[96], d[16];
	fprintf(f, "## Full cache\n\nCells: correct / trials, accuracy "
	        "[Wilson 95 %% interval]; the mean prompt length (tokens) "
	        "beside the nominal one.%s Cells marked * reach %.1f: the "
	        "policies run at the shortest length of %u to %u tokens with "
	        "such a cell, at those depths, on fresh cases (another seed "
	        "stream).\n\n| length |", R->scan_trials ? "" :
	        " (quick: from the policies' cases.)", R->bar, R->run_min_len,
	        R->run_max_len);
	for (uint32_t di = 0; di < R->ndepth; di++) {
		depth_name(d, sizeof(d), R, di);
		fprintf(f, R->depth ? " depth %s |" : " accuracy |", d);
	}
	if (R->ndepth > 1)
		fprintf(f, " all depths |");
	if (R->kind == CTXTASK_COPY)
		fprintf(f, " token top-1 |");
	fprintf(f, "\n|---|");
	for (uint32_t di = 0; di < R->ndepth + (R->ndepth > 1) +
	                      (R->kind == CTXTASK_COPY); di++)
		fprintf(f, "---|");
	fprintf(f, "\n");
	for (uint32_t li = 0; li < R->nlen; li++) {
		struct ctxtask_cell s = sum(R->scan[li], R->ndepth, NULL);
		fprintf(f, "| %u (%.0f) |", R->len[li],
		        s.n ? s.tokens / s.n : 0.0);
		for (uint32_t di = 0; di < R->ndepth; di++) {
			const struct ctxtask_cell *e = &R->scan[li][di];
			fmt_cell(b, sizeof(b), e);
			fprintf(f, " %s%s |", b, e->n && acc(e) >= R->bar ? " *"
			                                                  : "");
		}
		if (R->ndepth > 1) {
			fmt_cell(b, sizeof(b), &s);
			fprintf(f, " %s |", b);
		}
		if (R->kind == CTXTASK_COPY)
			fprintf(f, " %.3f |", s.n ? s.top1 / s.n : 0.0);
		fprintf(f, "\n");
	}
	fprintf(f, "\n");
}

static void md_run(FILE *f, const struct ctxtask_result *R, uint32_t ri)
{
	const struct job *jobs = R->run[ri].jobs;
	const struct ctxtask_jres *res = R->run[ri].res;
	const uint32_t nj = R->run[ri].njobs;
	const uint8_t *on = R->run[ri].on;
	char b[96], d[16], ds[128] = "";
	for (uint32_t di = 0; di < R->ndepth && R->depth; di++)
		if (on[di]) {
			depth_name(d, sizeof(d), R, di);
			snprintf(ds + strlen(ds), sizeof(ds) - strlen(ds), "%s%s",
			         ds[0] ? ", " : "", d);
		}
	struct ctxtask_cell rf = sum(R->run[ri].ref, R->ndepth, on);
	fmt_cell(b, sizeof(b), &rf);
	fprintf(f, "## Policies at %u tokens%s%s\n\n%llu cases (mean %.0f "
	        "prompt tokens); every run below is on all of them. The "
	        "reference (the full cache in process) answers %s.\n\n"
	        "### At equal achieved compression\n\nEach policy's runs "
	        "(every target and threshold) form one curve of (achieved, "
	        "accuracy) read at the column's achieved ratio by linear "
	        "interpolation between the nearest runs on either side (n/a: "
	        "the curve does not reach it); the interval is read the same "
	        "way from the runs' Wilson intervals. Cells: accuracy "
	        "[95 %% interval].\n\n| policy |", R->len[R->run[ri].li],
	        ds[0] ? ", depths " : "", ds, (unsigned long long)rf.n,
	        rf.n ? rf.tokens / rf.n : 0.0, b);
	for (size_t q = 0; q < NAT; q++)
		fprintf(f, " achieved %.3f |", at[q]);
	fprintf(f, "\n|---|");
	for (size_t q = 0; q < NAT; q++)
		fprintf(f, "---|");
	fprintf(f, "\n");
	const char *pol[MAX_JOBS];
	uint32_t np = policies(jobs, nj, pol, MAX_JOBS);
	double x[MAX_JOBS], y[MAX_JOBS], ylo[MAX_JOBS], yhi[MAX_JOBS];
	for (uint32_t p = 0; p < np; p++) {
		uint32_t n = 0;
		struct ctxtask_cell one = {0};
		for (uint32_t k = 0; k < nj; k++) {
			if (strcmp(jobs[k].name, pol[p]) || isnan(job_ach(&res[k])))
				continue;
			one = sum(res[k].c, R->ndepth, on);
			x[n] = job_ach(&res[k]);
			y[n] = acc(&one);
			ctxtask_wilson(one.ok, one.n, &ylo[n], &yhi[n]);
			n++;
		}
		fprintf(f, "| %s%s |", pol[p], ctxtable_is_bound(pol[p])
		                                ? " (bound)" : "");
		for (size_t q = 0; q < NAT; q++) {
			if (!strcmp(pol[p], "full")) {
				fmt_cell(b, sizeof(b), &one);
				fprintf(f, " %s |", n ? b : "failed");
				continue;
			}
			double v = curve_at(x, y, n, at[q]);
			if (isnan(v))
				fprintf(f, " n/a |");
			else
				fprintf(f, " %.2f [%.2f, %.2f] |", v,
				        curve_at(x, ylo, n, at[q]),
				        curve_at(x, yhi, n, at[q]));
		}
		fprintf(f, "\n");
	}
	fprintf(f, "\n### Runs\n\nEvery run as measured (%s.csv): the target "
	        "ratio (sweep: a fixed kvzap threshold), the threshold, the "
	        "achieved ratio, then correct / trials, accuracy [95 %% "
	        "interval]%s.\n\n| policy | target | threshold | achieved | "
	        "accuracy |", R->name, R->ndepth > 1 ? ", over the depths run "
	        "and per depth" : "");
	uint32_t ncol = 0;
	for (uint32_t di = 0; di < R->ndepth && R->ndepth > 1; di++)
		if (on[di]) {
			depth_name(d, sizeof(d), R, di);
			fprintf(f, " depth %s |", d);
			ncol++;
		}
	if (R->kind == CTXTASK_COPY) {
		fprintf(f, " token top-1 |");
		ncol++;
	}
	fprintf(f, "\n|---|---|---|---|---|");
	for (uint32_t i = 0; i < ncol; i++)
		fprintf(f, "---|");
	fprintf(f, "\n");
	for (uint32_t p = 0; p < np; p++)
		for (uint32_t k = 0; k < nj; k++) {
			const struct job *j = &jobs[k];
			if (strcmp(j->name, pol[p]))
				continue;
			char t[32] = "sweep", th[32] = "";
			if (!j->sweep)
				snprintf(t, sizeof(t), "%.3f", j->ratio);
			if (!isnan(j->tau))
				snprintf(th, sizeof(th), "%.2f", j->tau);
			if (isnan(job_ach(&res[k]))) {
				fprintf(f, "| %s | %s | %s | failed | |", j->name, t,
				        th);
				for (uint32_t i = 0; i < ncol; i++)
					fprintf(f, " |");
				fprintf(f, "\n");
				continue;
			}
			struct ctxtask_cell s = sum(res[k].c, R->ndepth, on);
			fmt_cell(b, sizeof(b), &s);
			fprintf(f, "| %s | %s | %s | %.3f | %s |", j->name, t, th,
			        job_ach(&res[k]), b);
			for (uint32_t di = 0; di < R->ndepth && R->ndepth > 1;
			     di++)
				if (on[di]) {
					fmt_cell(b, sizeof(b), &res[k].c[di]);
					fprintf(f, " %s |", b);
				}
			if (R->kind == CTXTASK_COPY)
				fprintf(f, " %.3f |", s.n ? s.top1 / s.n : 0.0);
			fprintf(f, "\n");
		}
	fprintf(f, "\n");
}

void ctxtasktab_write(const char *dir, const struct ctxtask_result *R,
                      const char *what)
{
	write_csv(dir, R);
	FILE *f = open_out(dir, R->name, "md");
	md_intro(f, R, what);
	md_scan(f, R);
	if (!R->nrun)
		fprintf(f, "## Policies\n\nNot run: the full cache does not "
		        "reach %.1f at any length of %u to %u tokens, so the "
		        "task cannot tell the policies apart (a failure of the "
		        "model, not of eviction).\n", R->bar, R->run_min_len,
		        R->run_max_len);
	for (uint32_t ri = 0; ri < R->nrun; ri++)
		md_run(f, R, ri);
	fclose(f);
}
