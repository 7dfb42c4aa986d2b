/*
 * bytes.c — kvtrim-eval on a byte or token-id model (llama2.c checkpoint):
 * its cases (held-out sequences, copy cases, the needles the full cache
 * retrieves), its jobs (the registry's ratio policies, kvzap at its
 * calibrated and swept thresholds, fastkvzip, kvpop, kvzip, oracle), every
 * job a tenant of one kvtrimd registered at once, and the results: rows
 * merged into OUT/quality.csv, quality.md, quality.png,
 * specs-<model>.txt, needle-<model>.txt.  The protocol: docs/eval.md.
 */
#include "bytes.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../train/dataset.h"
#include "../decoding/decoding.h"
#include "engine.h"
#include "model.h"
#include "policy.h"

/* One run: its inputs, its jobs and what the needles' scan found. */
struct bytes_run {
	const struct model *M;
	const struct eval_opts *a;
	uint32_t T, P;
	struct dataset ev;
	struct ecase *cases;   /* [ncases]: sequences, copy, needles run */
	uint32_t ncases, ncp, nnd, nneedle;
	double nd_digit[NEEDLE_NDEPTH], nd_exact[NEEDLE_NDEPTH];
	uint32_t nd_per[NEEDLE_NDEPTH];
	int nd_pass[NEEDLE_NDEPTH];
	struct job jobs[MAX_JOBS];
	uint32_t njobs;
};

/* The sequences and copy cases with their references and KVzip scores. */
static void make_cases(struct bytes_run *b)
{
	const struct model *M = b->M;
	const int quick = b->a->quick;
	char err[1024];
	uint32_t nseq = b->a->nseq ? b->a->nseq : quick ? 2 : 32;
	uint32_t ncopy = dataset_is_bytes(M) ? (quick ? 2 : 24) : 0;
	b->nneedle = dataset_is_bytes(M) ? (quick ? 1 : 16) * NEEDLE_NDEPTH : 0;
	if (dataset_build(M, DATASET_EVAL, b->T, nseq, 0, &b->ev, err,
	                  sizeof(err)))
		eval_die("%s", err);
	b->cases = calloc(b->ev.n + ncopy + b->nneedle, sizeof(*b->cases));
	if (!b->cases)
		eval_die("out of memory");
	for (uint32_t i = 0; i < b->ev.n; i++) {
		b->cases[i].tok = b->ev.tok + (size_t)i * b->T;
		b->cases[i].T = b->T;
		b->cases[i].P = b->P;
	}
	b->ncases = b->ev.n;
	if (ncopy)
		b->ncases += cases_copy(b->cases + b->ev.n, ncopy);
	b->ncp = b->ncases - b->ev.n;
	for (uint32_t i = 0; i < b->ncases; i++) {
		cases_ref(M, &b->cases[i]);
		cases_kvzip(M, &b->cases[i]);
	}
}

/* Needles: the full cache first; the cases of a depth where it reaches
 * NEEDLE_BAR join the policies' cases, the others go. */
static void make_needles(struct bytes_run *b)
{
	const struct model *M = b->M;
	if (!b->nneedle)
		return;
	struct ecase *nc = b->cases + b->ncases;
	cases_needle(nc, b->nneedle);
	for (uint32_t i = 0; i < b->nneedle; i++)
		cases_ref(M, &nc[i]);
	cases_needle_full(M, nc, b->nneedle, b->nd_digit, b->nd_exact,
	                  b->nd_per);
	for (int d = 0; d < NEEDLE_NDEPTH; d++)
		b->nd_pass[d] = b->nd_digit[d] >= NEEDLE_BAR;
	for (uint32_t i = 0; i < b->nneedle; i++) {
		struct ecase c = nc[i];
		if (b->nd_pass[c.di]) {
			cases_kvzip(M, &c);
			nc[b->nnd++] = c;
		} else {
			free(c.tok);
			free(c.ref);
		}
	}
	memset(nc + b->nnd, 0, sizeof(*nc) * (b->nneedle - b->nnd));
	b->ncases += b->nnd;
	for (int d = 0; d < NEEDLE_NDEPTH; d++)
		fprintf(stderr, "kvtrim-eval: needle depth %u, full cache: per "
		        "digit %.3f, exact %.3f (%u cases)%s\n",
		        cases_needle_depth[d], b->nd_digit[d], b->nd_exact[d],
		        b->nd_per[d], b->nd_pass[d] ? "" : ": below the bar, "
		        "not run");
}

/* kvzap's calibration scores on the training split, zs[v] NULL where a
 * scorer is missing; the calibration sequences in *ncal. */
static void calibrate(struct bytes_run *b, float *zs[2], uint32_t *ncal)
{
	const struct eval_opts *a = b->a;
	char err[1024];
	zs[0] = zs[1] = NULL;
	*ncal = a->quick ? 2 : 16;
	if (!a->wabs[0]) {
		fprintf(stderr, "kvtrim-eval: no weights in %s: learned "
		        "policies skipped (run make weights)\n", a->wdir);
		return;
	}
	struct dataset cal;
	if (dataset_build(b->M, DATASET_TRAIN, b->T, *ncal, 1, &cal, err,
	                  sizeof(err)))
		eval_die("%s", err);
	*ncal = cal.n;
	for (int v = 0; v < 2; v++) {
		char d[PATH_MAX + 32];
		snprintf(d, sizeof(d), "%s/%s", a->wabs, kvzap_names[v]);
		zs[v] = kvzap_scores(b->M, d, &cal, err, sizeof(err));
		if (!zs[v])
			fprintf(stderr, "kvtrim-eval: %s: %s (skipped)\n",
			        kvzap_names[v], err);
	}
	dataset_free(&cal);
}

/* The mean prompt and total lengths of the cases of kind k. */
static void mean_len(const struct bytes_run *b, enum ckind k, uint32_t *P,
                     uint32_t *T)
{
	uint32_t n = 0;
	*P = *T = 0;
	for (uint32_t i = b->ev.n; i < b->ncases; i++)
		if (b->cases[i].kind == k) {
			*P += b->cases[i].P;
			*T += b->cases[i].T;
			n++;
		}
	if (n) {
		*P /= n;
		*T /= n;
	}
}

/* The jobs: full, then per target the ratio policies, kvzap, fastkvzip,
 * kvpop (a budget per kind of case), kvzip and oracle, then kvzap's
 * threshold sweep. */
static void make_jobs(struct bytes_run *b)
{
	static const double full_ratios[] = {0.5, 0.75, 0.875};
	static const double quick_ratios[] = {0.75};
	const struct eval_opts *a = b->a;
	const double *ratios = a->quick ? quick_ratios : full_ratios;
	const uint32_t nrat = a->quick ? 1 : 3, T = b->T, P = b->P;
	struct job *jobs = b->jobs;
	uint32_t *nj = &b->njobs, cP, cT, nP, nT, ncal;
	mean_len(b, C_COPY, &cP, &cT);
	mean_len(b, C_NEEDLE, &nP, &nT);
	float *zs[2];
	calibrate(b, zs, &ncal);
	eval_add_job(jobs, nj, "full", 0, J_DAEMON, "full", NULL, NULL);
	char s[KVT_SPEC_MAX], sc[KVT_SPEC_MAX], sn[KVT_SPEC_MAX];
	for (uint32_t k = 0; k < nrat; k++) {
		double R = ratios[k];
		eval_add_budget_jobs(jobs, nj, b->M, POLICY_EVAL_BYTES, R, R, 0);
		for (int v = 0; v < 2; v++)
			if (zs[v])
				kvzap_add_target(jobs, nj, b->M, a->wabs, v, zs[v],
				                 ncal, T, P, -1, R);
		if (a->wabs[0]) {
			eval_add_fastkvzip(jobs, nj, a->wabs, R, R, 0, 16);
			eval_kvpop_spec(s, sizeof(s), a->wabs,
			                decoding_budget(R, P, T));
			eval_kvpop_spec(sc, sizeof(sc), a->wabs,
			                cT ? decoding_budget(R, cP, cT) : 1);
			eval_kvpop_spec(sn, sizeof(sn), a->wabs,
			                nT ? decoding_budget(R, nP, nT) : 1);
			eval_add_job(jobs, nj, "kvpop", R, J_DAEMON, s,
			             b->ncp ? sc : NULL, b->nnd ? sn : NULL);
		}
		eval_add_job(jobs, nj, "kvzip", R, J_KVZIP,
		             "kvzip (in-process replay)", NULL, NULL);
		eval_add_job(jobs, nj, "oracle", R, J_ORACLE, "hindsight "
		             "oracle (in-process replay)", NULL, NULL);
	}
	/* fixed thresholds from the training split (kvzap_sweep_grid), the
	 * achieved ratio measured */
	for (int v = 0; v < 2; v++)
		if (zs[v])
			kvzap_add_sweep(jobs, nj, b->M, a->wabs, v, zs[v], ncal, T,
			                P, -1, a->quick ? 2 : 6);
	free(zs[0]);
	free(zs[1]);
}

/* Every daemon job's tenants (one per kind of case with a spec of its
 * own), registered at once on the daemon of rt. */
static void open_engines(struct bytes_run *b, const char *rt)
{
	static const char *const sfx[C_NKIND] = {"", "-copy", "-needle"};
	char err[1024];
	uint32_t maxT = 0;
	for (uint32_t i = 0; i < b->ncases; i++)
		maxT = b->cases[i].T > maxT ? b->cases[i].T : maxT;
	for (uint32_t k = 0; k < b->njobs; k++) {
		struct job *j = &b->jobs[k];
		for (int c = 0; j->kind == J_DAEMON && c < C_NKIND; c++) {
			if (c && !j->spec[c][0])
				continue;
			struct engine_opts o;
			memset(&o, 0, sizeof(o));
			char tn[64];
			if (j->sweep)
				snprintf(tn, sizeof(tn), "eval-%.31s-t%.3f%s",
				         j->name, j->tau, sfx[c]);
			else
				snprintf(tn, sizeof(tn), "eval-%.31s-%.3f%s",
				         j->name, j->ratio, sfx[c]);
			o.runtime_dir = rt;
			o.tenant = tn;
			o.policy = j->spec[c];
			o.chunk = CHUNK;
			o.context = maxT;
			if (engine_open(b->M, &o, &j->e[c], err, sizeof(err)))
				eval_die("%s (%s): %s", j->name, o.policy, err);
		}
	}
}

/* OUT/quality.csv: other models' rows kept, then one per job; *bad: a job
 * failed.  The rows, *nr of them. */
static struct row *write_csv(const struct bytes_run *b, size_t *nr, int *bad)
{
	char path[1200];
	snprintf(path, sizeof(path), "%s/quality.csv", b->a->out);
	struct row *rows = calloc(1024 + b->njobs, sizeof(*rows));
	if (!rows)
		eval_die("out of memory");
	size_t n = table_read_others(path, b->a->mname, NULL, rows, 1024);
	*bad = 0;
	for (uint32_t k = 0; k < b->njobs; k++) {
		const struct job *j = &b->jobs[k];
		struct row *r = &rows[n++];
		snprintf(r->model, sizeof(r->model), "%s", b->a->mname);
		snprintf(r->policy, sizeof(r->policy), "%.31s", j->name);
		r->target = j->sweep ? NAN : j->ratio;
		r->tau = j->tau;
		r->needle = NAN;
		*bad |= j->failed;
		if (j->failed || !j->npos) {
			r->ach = r->kl = r->top1 = r->dnll = r->copy = NAN;
			continue;
		}
		/* needle_acc: per-digit accuracy over the depths where the
		 * full cache reaches the bar (only those cases were run) */
		uint64_t ok = 0, nn = 0;
		for (int d = 0; d < NEEDLE_NDEPTH; d++) {
			ok += j->nd_ok[d];
			nn += j->nd_n[d];
		}
		r->needle = nn ? (double)ok / nn : NAN;
		r->ach = j->nach ? j->ach / j->nach : NAN;
		r->kl = j->kl / j->npos;
		r->top1 = j->top1 / j->npos;
		r->dnll = j->dnll / j->npos;
		r->copy = j->copy_n ? (double)j->copy_ok / j->copy_n : NAN;
	}
	table_write_csv(path, rows, n);
	*nr = n;
	return rows;
}

static void write_specs(const struct bytes_run *b)
{
	const struct eval_opts *a = b->a;
	char path[1200];
	snprintf(path, sizeof(path), "%s/specs-%s.txt", a->out, a->mname);
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	fprintf(f, "# %s: T %u, prefill %u, %u sequences, %u copy cases, %u "
	        "of %u needle cases run%s\n", a->mname, b->T, b->P, b->ev.n,
	        b->ncp, b->nnd, b->nneedle, a->quick ? " (quick)" : "");
	for (uint32_t k = 0; k < b->njobs; k++)
		table_write_spec(f, &b->jobs[k], a->wabs, a->wdir);
	fclose(f);
}

/* OUT/needle-<model>.txt: the full cache per depth, then every job's. */
static void write_needles(const struct bytes_run *b)
{
	const struct eval_opts *a = b->a;
	char path[1200];
	snprintf(path, sizeof(path), "%s/needle-%s.txt", a->out, a->mname);
	FILE *f = fopen(path, "w");
	if (!f)
		eval_die("%s: %s", path, strerror(errno));
	fprintf(f, "# %s key-value needles (kvtrim-eval): cases of %u bytes, "
	        "target + %u distractor records, %u digits; chance %.2f per "
	        "digit\n# a depth is run for the policies when the full "
	        "cache's per-digit top-1 accuracy >= %.2f%s\n# full DEPTH "
	        "CASES DIGIT_ACC EXACT_ACC pass|below\n", a->mname, NEEDLE_LEN,
	        NEEDLE_DISTRACTORS, NEEDLE_DIGITS, 0.1, NEEDLE_BAR,
	        a->quick ? " (quick)" : "");
	for (int d = 0; d < NEEDLE_NDEPTH; d++)
		fprintf(f, "full %u %u %.4f %.4f %s\n", cases_needle_depth[d],
		        b->nd_per[d], b->nd_digit[d], b->nd_exact[d],
		        b->nd_pass[d] ? "pass" : "below");
	if (b->nnd)
		fprintf(f, "# policy TARGET|sweep:TAU DEPTH CASES DIGIT_ACC "
		        "EXACT_ACC\n");
	for (uint32_t k = 0; k < b->njobs && b->nnd; k++) {
		const struct job *j = &b->jobs[k];
		for (int d = 0; d < NEEDLE_NDEPTH; d++) {
			if (!j->nd_cases[d])
				continue;
			if (j->sweep)
				fprintf(f, "policy %s sweep:%.4f", j->name, j->tau);
			else
				fprintf(f, "policy %s %.3f", j->name, j->ratio);
			fprintf(f, " %u %" PRIu64 " %.4f %.4f\n",
			        cases_needle_depth[d], j->nd_cases[d],
			        (double)j->nd_ok[d] / j->nd_n[d],
			        (double)j->nd_exact[d] / j->nd_cases[d]);
		}
	}
	fclose(f);
}

int bytes_main(const struct model *M, const struct eval_opts *a)
{
	static struct bytes_run b;
	b.M = M;
	b.a = a;
	b.T = a->quick ? 256 : model_context(M);
	b.P = a->quick ? 192 : b.T * 3 / 4;
	time_t t0 = time(NULL);
	make_cases(&b);
	make_needles(&b);
	fprintf(stderr, "kvtrim-eval: %s: %u sequences of %u (prefill %u), "
	        "%u copy cases, %u needle cases; references in %lds\n",
	        a->mname, b.ev.n, b.T, b.P, b.ncp, b.nnd,
	        (long)(time(NULL) - t0));
	make_jobs(&b);

	/* one daemon, every tenant registered at once */
	char rt[400];
	eval_runtime_dir(a->rt, a->argv0, rt, sizeof(rt));
	open_engines(&b, rt);
	fprintf(stderr, "kvtrim-eval: %u jobs (%u threads) on %s\n", b.njobs,
	        a->threads, rt);
	run_jobs(M, b.cases, b.ncases, b.jobs, b.njobs, a->threads);
	for (uint32_t k = 0; k < b.njobs; k++)
		for (int c = 0; c < C_NKIND; c++)
			engine_close(b.jobs[k].e[c]);
	eval_daemon_stop();

	size_t nr;
	int bad;
	struct row *rows = write_csv(&b, &nr, &bad);
	write_specs(&b);
	if (b.nneedle)
		write_needles(&b);
	bytes_write_md(a->out, rows, nr);
	table_write_png(a->out, rows, nr, 0);
	table_print_model(rows, nr, a->mname);
	fprintf(stderr, "kvtrim-eval: %s done in %lds\n", a->mname,
	        (long)(time(NULL) - t0));
	free(rows);
	return bad ? 1 : 0;
}
