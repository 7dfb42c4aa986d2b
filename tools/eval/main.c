/*
 * main.c — kvtrim-eval: quality of every eviction policy against the full
 * cache, on held-out inputs, through one real kvtrimd.
 *
 *   kvtrim-eval --model M --out DIR [--quick] [--protocol 1|2] [...]
 *
 * The options into struct eval_opts, the model loaded, and a call into the
 * program the model and the protocol select: bytes/ (a byte or token-id
 * model), context/ (a model with a tokenizer, protocol 1) or decoding/
 * (protocol 2).  The options and the protocols: docs/eval.md.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bytes/bytes.h"
#include "common/eval.h"
#include "context/context.h"
#include "decoding/decoding.h"
#include "model.h"
#include "model_files.h"

void openblas_set_num_threads(int n);

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtrim-eval --model M --out DIR [--quick] "
	           "[--weights WDIR] [--runtime-dir RT] [--threads N] "
	           "[--seqs N] [--protocol 1|2] [--dump-kept DIR] "
	           "[--no-tasks | --tasks-only] [--only NAME,...] "
	           "[--calibrate]\n");
}

/* The options into a (model_path and wdir as given); 0, or the exit
 * status (usage printed). */
static int parse_opts(int argc, char **argv, struct eval_opts *a)
{
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
	*a = (struct eval_opts){.argv0 = argv[0], .threads = 2, .protocol = 1};
	int ch;
	while ((ch = getopt_long(argc, argv, "m:o:qw:r:t:s:d:nTp:O:Ch", lo,
	                         NULL)) != -1) {
		switch (ch) {
		case 'm': a->model_path = optarg; break;
		case 'o': a->out = optarg; break;
		case 'q': a->quick = 1; break;
		case 'w': a->wdir = optarg; break;
		case 'r': a->rt = optarg; break;
		case 't': a->threads = atoi(optarg); break;
		case 's': a->nseq = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'd': a->dump = a->out = optarg; break;
		case 'n': a->notasks = 1; break;
		case 'T': a->tasksonly = 1; break;
		case 'p': a->protocol = atoi(optarg); break;
		case 'O': a->only = optarg; break;
		case 'C': a->calibrate = 1; break;
		case 'h': usage(stdout); return -1;
		default: usage(stderr); return 2;
		}
	}
	if (!a->out || optind != argc || a->threads < 1 || a->threads > 16 ||
	    (a->protocol != 1 && a->protocol != 2) ||
	    (a->notasks && a->tasksonly) ||
	    (a->calibrate && a->protocol != 1)) {
		usage(stderr);
		return 2;
	}
	return 0;
}

/* The model of a->model_path loaded into m: a known model's short name
 * (smollm2) names the model and its weights directory, a path names them
 * by its file.  Sets a->model_path, a->mname (into mname), a->wdir (the
 * default build/weights/<model> into wdir when none was given) and
 * a->wabs (into wabs; "" when the directory does not exist). */
static void open_model(struct eval_opts *a, struct model *m,
                       char mpath[PATH_MAX], char mname[64],
                       char wdir[PATH_MAX], char wabs[PATH_MAX])
{
	char err[1024];
	mname[0] = 0;
	if (a->model_path) {
		if (model_files_resolve(a->model_path, mpath, PATH_MAX, err,
		                        sizeof(err)))
			eval_die("%s", err);
		if (strcmp(mpath, a->model_path) && !strchr(a->model_path, '/'))
			snprintf(mname, 64, "%s", a->model_path);
		a->model_path = mpath;
	}
	a->model_path = model_default_path(a->model_path);
	if (model_load(a->model_path, m, err, sizeof(err)))
		eval_die("%s", err);
	if (!mname[0]) {
		const char *b = strrchr(a->model_path, '/');
		snprintf(mname, 64, "%s", b ? b + 1 : a->model_path);
		char *dot = strrchr(mname, '.');
		if (dot)
			*dot = 0;
	}
	a->mname = mname;
	if (a->wdir)
		snprintf(wdir, PATH_MAX, "%s", a->wdir);
	else
		snprintf(wdir, PATH_MAX, "build/weights/%s", mname);
	a->wdir = wdir;
	if (!realpath(wdir, wabs))
		wabs[0] = 0;
	a->wabs = wabs;
}

int main(int argc, char **argv)
{
	static struct eval_opts a;
	static struct model m;
	static char mpath[PATH_MAX], mname[64], wdir[PATH_MAX], wabs[PATH_MAX];
	int rc = parse_opts(argc, argv, &a);
	if (rc)
		return rc < 0 ? 0 : rc;
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, eval_on_signal);
	signal(SIGTERM, eval_on_signal);
	openblas_set_num_threads(1);
	open_model(&a, &m, mpath, mname, wdir, wabs);
	if (mkdir(a.out, 0755) < 0 && errno != EEXIST)
		eval_die("%s: %s", a.out, strerror(errno));
	if (a.protocol == 2 && m.version != MODEL_GGUF)
		eval_die("--protocol 2 is for models with a tokenizer (GGUF); "
		         "%s decodes with the policy active under its own "
		         "protocol already", mname);
	if (m.version != MODEL_GGUF)
		rc = bytes_main(&m, &a);
	else if (a.protocol == 2)
		rc = decoding_main(&m, &a);
	else
		rc = context_main(&m, &a);
	model_free(&m);
	return rc;
}
