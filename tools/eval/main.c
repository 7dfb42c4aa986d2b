/*
 * main.c — kvtrim-eval: quality of every eviction policy against the full
 * cache, on held-out inputs, through one real kvtrimd.
 *
 *   kvtrim-eval --model M --out DIR [--quick] [--protocol 1|2] [...]
 *
 * The options, the byte and token-id models' protocol and its outputs
 * (quality.csv, quality.md, quality.png, specs-<model>.txt,
 * needle-<model>.txt) are in docs/eval.md.  Models with a tokenizer go to
 * protocol 1 (context.c) or 2 (decoding.c).  This file holds the options,
 * the cases and jobs of a run and the results files; eval.h lists the
 * other files of tools/eval/.
 */
#include "bytes/bytes.h"
#include "common/eval.h"
#include "context/context.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../train/dataset.h"
#include "../train/recipe.h"
#include "decoding/decoding.h"
#include "engine.h"
#include "model.h"
#include "model_files.h"
#include "policy.h"

void openblas_set_num_threads(int n);

/* The run: its cases and jobs (add_job), filled by main. */
static struct ecase *cases;
static uint32_t ncases;
static struct job jobs[MAX_JOBS];
static uint32_t njobs;

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtrim-eval --model M --out DIR [--quick] "
	           "[--weights WDIR] [--runtime-dir RT] [--threads N] "
	           "[--seqs N] [--protocol 1|2] [--dump-kept DIR] "
	           "[--no-tasks | --tasks-only] [--only NAME,...] "
	           "[--calibrate]\n");
}

static struct job *add_job(const char *name, double R, enum jkind kind,
                           const char *spec, const char *spec_copy,
                           const char *spec_needle)
{
	return eval_add_job(jobs, &njobs, name, R, kind, spec, spec_copy,
	                    spec_needle);
}

int main(int argc, char **argv)
{
	const char *model_path = NULL, *out = NULL, *wdir_arg = NULL,
	           *rt_arg = NULL, *dump = NULL, *only = NULL;
	int quick = 0, threads = 2, notasks = 0, tasksonly = 0, protocol = 1;
	int calibrate = 0;
	uint32_t nseq = 0;
	static const struct option lo[] = {
		{"model", required_argument, 0, 'm'},
		{"out", required_argument, 0, 'o'},
		{"quick", no_argument, 0, 'q'},
		{"weights", required_argument, 0, 'w'},
		{"runtime-dir", required_argument, 0, 'r'},
		{"threads", required_argument, 0, 't'},
		{"seqs", required_argument, 0, 's'},
		{"dump-kept", required_argument, 0, 'd'}, /* dump_kept.c */
		{"no-tasks", no_argument, 0, 'n'},
		{"tasks-only", no_argument, 0, 'T'},
		{"protocol", required_argument, 0, 'p'},
		{"only", required_argument, 0, 'O'},
		{"calibrate", no_argument, 0, 'C'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	int ch;
	while ((ch = getopt_long(argc, argv, "m:o:qw:r:t:s:d:nTp:O:Ch", lo, NULL)) !=
	       -1) {
		switch (ch) {
		case 'm': model_path = optarg; break;
		case 'o': out = optarg; break;
		case 'q': quick = 1; break;
		case 'w': wdir_arg = optarg; break;
		case 'r': rt_arg = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 's': nseq = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'd': dump = out = optarg; break;
		case 'n': notasks = 1; break;
		case 'T': tasksonly = 1; break;
		case 'p': protocol = atoi(optarg); break;
		case 'O': only = optarg; break;
		case 'C': calibrate = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!out || optind != argc || threads < 1 || threads > 16 ||
	    (protocol != 1 && protocol != 2) || (notasks && tasksonly) ||
	    (tasksonly && protocol != 1) || (calibrate && protocol != 1)) {
		usage(stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, eval_on_signal);
	signal(SIGTERM, eval_on_signal);
	openblas_set_num_threads(1);
	char err[1024];
	static struct model m;
	/* a known model's short name (smollm2) names the model and its
	 * weights directory; a path names them by its file */
	char mpath[PATH_MAX], mname[64];
	if (model_path) {
		if (model_files_resolve(model_path, mpath, sizeof(mpath), err,
		                        sizeof(err)))
			eval_die("%s", err);
		if (strcmp(mpath, model_path) && !strchr(model_path, '/'))
			snprintf(mname, sizeof(mname), "%s", model_path);
		else
			mname[0] = 0;
		model_path = mpath;
	} else {
		mname[0] = 0;
	}
	model_path = model_default_path(model_path);
	if (model_load(model_path, &m, err, sizeof(err)))
		eval_die("%s", err);
	const struct model *M = &m;
	const struct model_config *mc = &m.cfg;
	if (!mname[0]) {
		const char *b = strrchr(model_path, '/');
		snprintf(mname, sizeof(mname), "%s", b ? b + 1 : model_path);
		char *dot = strrchr(mname, '.');
		if (dot)
			*dot = 0;
	}
	char wdir[PATH_MAX];
	if (wdir_arg)
		snprintf(wdir, sizeof(wdir), "%s", wdir_arg);
	else
		snprintf(wdir, sizeof(wdir), "build/weights/%s", mname);
	char wabs[PATH_MAX] = "";
	int have_w = realpath(wdir, wabs) != NULL;
	if (mkdir(out, 0755) < 0 && errno != EEXIST)
		eval_die("%s: %s", out, strerror(errno));
	if (protocol == 2 && m.version != MODEL_GGUF)
		eval_die("--protocol 2 is for models with a tokenizer (GGUF); "
		         "%s decodes with the policy active under its own "
		         "protocol already", mname);
	if (m.version == MODEL_GGUF) {
		/* a model with a tokenizer: protocol 1 (context.c) or 2
		 * (lockstep.c) */
		struct eval_opts ca = {
			.argv0 = argv[0], .model_path = model_path,
			.mname = mname, .out = out, .wdir = wdir,
			.wabs = have_w ? wabs : "", .rt = rt_arg,
			.quick = quick, .threads = threads, .nseq = nseq,
			.notasks = notasks, .tasksonly = tasksonly,
			.only = only,
			.dump = dump,
			.calibrate = calibrate,
		};
		int rc = protocol == 2 ? decoding_main(M, &ca) : context_main(M, &ca);
		model_free(&m);
		return rc;
	}

	const uint32_t T = quick ? 256 : model_context(&m);
	const uint32_t P = quick ? 192 : T * 3 / 4;
	if (!nseq)
		nseq = quick ? 2 : 32;
	uint32_t ncopy = dataset_is_bytes(&m) ? (quick ? 2 : 24) : 0;
	uint32_t nneedle = dataset_is_bytes(&m) ? (quick ? 1 : 16) *
	                   NEEDLE_NDEPTH : 0;
	static const double full_ratios[] = {0.5, 0.75, 0.875};
	static const double quick_ratios[] = {0.75};
	const double *ratios = quick ? quick_ratios : full_ratios;
	uint32_t nrat = quick ? 1 : 3;
	time_t t0 = time(NULL);

	struct dataset ev;
	if (dataset_build(&m, DATASET_EVAL, T, nseq, 0, &ev, err, sizeof(err)))
		eval_die("%s", err);
	cases = calloc(ev.n + ncopy + nneedle, sizeof(*cases));
	if (!cases)
		eval_die("out of memory");
	for (uint32_t i = 0; i < ev.n; i++) {
		cases[i].tok = ev.tok + (size_t)i * T;
		cases[i].T = T;
		cases[i].P = P;
	}
	ncases = ev.n;
	if (ncopy)
		ncases += cases_copy(cases + ev.n, ncopy);
	uint32_t ncp = ncases - ev.n;
	for (uint32_t i = 0; i < ncases; i++) {
		cases_ref(M, &cases[i]);
		cases_kvzip(M, &cases[i]);
	}
	/* Needles: the full cache first; the cases of a depth where it
	 * reaches NEEDLE_BAR join the policies' cases, the others go. */
	double nd_digit[NEEDLE_NDEPTH], nd_exact[NEEDLE_NDEPTH];
	uint32_t nd_per[NEEDLE_NDEPTH] = {0};
	int nd_pass[NEEDLE_NDEPTH] = {0};
	uint32_t nnd = 0;
	if (nneedle) {
		struct ecase *nc = cases + ncases;
		cases_needle(nc, nneedle);
		for (uint32_t i = 0; i < nneedle; i++)
			cases_ref(M, &nc[i]);
		cases_needle_full(M, nc, nneedle, nd_digit, nd_exact, nd_per);
		for (int d = 0; d < NEEDLE_NDEPTH; d++)
			nd_pass[d] = nd_digit[d] >= NEEDLE_BAR;
		for (uint32_t i = 0; i < nneedle; i++) {
			struct ecase c = nc[i];
			if (nd_pass[c.di]) {
				cases_kvzip(M, &c);
				nc[nnd++] = c;
			} else {
				free(c.tok);
				free(c.ref);
			}
		}
		memset(nc + nnd, 0, sizeof(*nc) * (nneedle - nnd));
		ncases += nnd;
		for (int d = 0; d < NEEDLE_NDEPTH; d++)
			fprintf(stderr, "kvtrim-eval: needle depth %u, full "
			        "cache: per digit %.3f, exact %.3f (%u cases)%s\n",
			        cases_needle_depth[d], nd_digit[d], nd_exact[d],
			        nd_per[d], nd_pass[d] ? "" : ": below the bar, "
			        "not run");
	}
	fprintf(stderr, "kvtrim-eval: %s: %u sequences of %u (prefill %u), "
	        "%u copy cases, %u needle cases; references in %lds\n", mname,
	        ev.n, T, P, ncp, nnd, (long)(time(NULL) - t0));

	/* ---- jobs */
	uint32_t cP = 0, cT = 0, nP = 0, nT = 0;
	for (uint32_t i = ev.n; i < ncases; i++) {
		if (cases[i].kind == C_COPY) {
			cP += cases[i].P;
			cT += cases[i].T;
		} else {
			nP += cases[i].P;
			nT += cases[i].T;
		}
	}
	if (ncp) {
		cP /= ncp;
		cT /= ncp;
	}
	if (nnd) {
		nP /= nnd;
		nT /= nnd;
	}
	/* kvzap calibration on the training split */
	float *zs[2] = {NULL, NULL};
	uint32_t ncal = quick ? 2 : 16;
	if (have_w) {
		struct dataset cal;
		if (dataset_build(&m, DATASET_TRAIN, T, ncal, 1, &cal, err,
		                  sizeof(err)))
			eval_die("%s", err);
		ncal = cal.n;
		for (int v = 0; v < 2; v++) {
			char d[PATH_MAX + 32];
			snprintf(d, sizeof(d), "%s/%s", wabs, kvzap_names[v]);
			zs[v] = kvzap_scores(M, d, &cal, err, sizeof(err));
			if (!zs[v])
				fprintf(stderr, "kvtrim-eval: %s: %s (skipped)\n",
				        kvzap_names[v], err);
		}
		dataset_free(&cal);
	} else {
		fprintf(stderr, "kvtrim-eval: no weights in %s: learned "
		        "policies skipped (run make weights)\n", wdir);
	}
	add_job("full", 0, J_DAEMON, "full", NULL, NULL);
	char s[KVT_SPEC_MAX], sc[KVT_SPEC_MAX], sn[KVT_SPEC_MAX];
	for (uint32_t k = 0; k < nrat; k++) {
		double R = ratios[k];
		eval_add_ratio_jobs(jobs, &njobs, M, POLICY_EVAL_BYTES, R, R);
		for (int v = 0; v < 2; v++)
			if (zs[v])
				kvzap_add_target(jobs, &njobs, M, wabs, v, zs[v],
				                 ncal, T, P, -1, R);
		if (have_w) {
			eval_add_fastkvzip(jobs, &njobs, wabs, R, R, 16);
			eval_kvpop_spec(s, sizeof(s), wabs, decoding_budget(R, P, T));
			eval_kvpop_spec(sc, sizeof(sc), wabs,
			                cT ? decoding_budget(R, cP, cT) : 1);
			eval_kvpop_spec(sn, sizeof(sn), wabs,
			                nT ? decoding_budget(R, nP, nT) : 1);
			add_job("kvpop", R, J_DAEMON, s, ncp ? sc : NULL,
			        nnd ? sn : NULL);
		}
		add_job("kvzip", R, J_KVZIP, "kvzip (in-process replay)", NULL,
		        NULL);
		add_job("oracle", R, J_ORACLE, "hindsight oracle (in-process "
		        "replay)", NULL, NULL);
	}
	/* kvzap threshold sweep: fixed thresholds from the training split
	 * (kvzap_sweep_grid), the achieved ratio measured */
	for (int v = 0; v < 2; v++)
		if (zs[v])
			kvzap_add_sweep(jobs, &njobs, M, wabs, v, zs[v], ncal, T,
			                P, -1, quick ? 2 : 6);
	free(zs[0]);
	free(zs[1]);

	/* ---- one daemon, every tenant registered at once */
	uint32_t maxT = 0;
	for (uint32_t i = 0; i < ncases; i++)
		maxT = cases[i].T > maxT ? cases[i].T : maxT;
	char rt[400];
	eval_runtime_dir(rt_arg, argv[0], rt, sizeof(rt));
	for (uint32_t k = 0; k < njobs; k++) {
		struct job *j = &jobs[k];
		if (j->kind != J_DAEMON)
			continue;
		static const char *const sfx[C_NKIND] = {"", "-copy",
		                                         "-needle"};
		for (int c = 0; c < C_NKIND; c++) {
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
			if (engine_open(&m, &o, &j->e[c], err, sizeof(err)))
				eval_die("%s (%s): %s", j->name, o.policy, err);
		}
	}
	fprintf(stderr, "kvtrim-eval: %u jobs (%u threads) on %s\n", njobs,
	        threads, rt);
	run_jobs(M, cases, ncases, jobs, njobs, threads);
	for (uint32_t k = 0; k < njobs; k++)
		for (int c = 0; c < C_NKIND; c++)
			engine_close(jobs[k].e[c]);
	eval_daemon_stop();

	/* ---- results: merge with other models' rows */
	char path[1200];
	snprintf(path, sizeof(path), "%s/quality.csv", out);
	struct row *rows = calloc(1024 + njobs, sizeof(*rows));
	size_t nr = table_read_others(path, mname, rows, 1024);
	FILE *f;
	int bad = 0;
	for (uint32_t k = 0; k < njobs; k++) {
		struct job *j = &jobs[k];
		struct row *r = &rows[nr++];
		snprintf(r->model, sizeof(r->model), "%s", mname);
		snprintf(r->policy, sizeof(r->policy), "%.31s", j->name);
		r->target = j->sweep ? NAN : j->ratio;
		r->tau = j->tau;
		r->needle = NAN;
		bad |= j->failed;
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
	table_write_csv(path, rows, nr);
	snprintf(path, sizeof(path), "%s/specs-%s.txt", out, mname);
	f = fopen(path, "w");
	if (f) {
		fprintf(f, "# %s: T %u, prefill %u, %u sequences, %u copy "
		        "cases, %u of %u needle cases run%s\n", mname, T, P,
		        ev.n, ncp, nnd, nneedle, quick ? " (quick)" : "");
		for (uint32_t k = 0; k < njobs; k++)
			table_write_spec(f, &jobs[k], wabs, wdir);
		fclose(f);
	}
	if (nneedle) {
		snprintf(path, sizeof(path), "%s/needle-%s.txt", out, mname);
		f = fopen(path, "w");
		if (!f)
			eval_die("%s: %s", path, strerror(errno));
		fprintf(f, "# %s key-value needles (kvtrim-eval): cases of %u "
		        "bytes, target + %u distractor records, %u digits; "
		        "chance %.2f per digit\n# a depth is run for the "
		        "policies when the full cache's per-digit top-1 "
		        "accuracy >= %.2f%s\n# full DEPTH CASES DIGIT_ACC "
		        "EXACT_ACC pass|below\n", mname, NEEDLE_LEN,
		        NEEDLE_DISTRACTORS, NEEDLE_DIGITS, 0.1, NEEDLE_BAR,
		        quick ? " (quick)" : "");
		for (int d = 0; d < NEEDLE_NDEPTH; d++)
			fprintf(f, "full %u %u %.4f %.4f %s\n",
			        cases_needle_depth[d], nd_per[d], nd_digit[d],
			        nd_exact[d],
			        nd_pass[d] ? "pass" : "below");
		if (nnd)
			fprintf(f, "# policy TARGET|sweep:TAU DEPTH CASES "
			        "DIGIT_ACC EXACT_ACC\n");
		for (uint32_t k = 0; k < njobs && nnd; k++) {
			const struct job *j = &jobs[k];
			for (int d = 0; d < NEEDLE_NDEPTH; d++) {
				if (!j->nd_cases[d])
					continue;
				if (j->sweep)
					fprintf(f, "policy %s sweep:%.4f", j->name,
					        j->tau);
				else
					fprintf(f, "policy %s %.3f", j->name,
					        j->ratio);
				fprintf(f, " %u %" PRIu64 " %.4f %.4f\n",
				        cases_needle_depth[d], j->nd_cases[d],
				        (double)j->nd_ok[d] / j->nd_n[d],
				        (double)j->nd_exact[d] /
				                j->nd_cases[d]);
			}
		}
		fclose(f);
	}
	bytes_write_md(out, rows, nr);
	table_write_png(out, rows, nr, 0);
	table_print_model(rows, nr, mname);
	fprintf(stderr, "kvtrim-eval: %s done in %lds\n", mname,
	        (long)(time(NULL) - t0));
	free(rows);
	(void)mc;
	return bad ? 1 : 0;
}
