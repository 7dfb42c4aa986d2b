/*
 * calibration.c — what protocols 1 and 2 (models with a tokenizer) start
 * from: the evaluation split's windows and the target ratios, and the
 * learned scorers' scores on the training split from which kvzap's (and
 * Fast KVzip's global) thresholds are chosen; `--calibrate` writes those
 * thresholds to OUT/calibration.txt.
 */
#include "context.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "../../train/recipe.h"
#include "now.h"

uint32_t ctx_windows(const struct model *M, const struct tok *tk,
                     const struct eval_opts *a, uint32_t T, uint32_t def,
                     struct dataset *ev, const double **ratios)
{
	static const double full_ratios[] = {0.5, 0.75, 0.875};
	static const double quick_ratios[] = {0.75};
	char err[1024];
	const uint32_t nwant = a->nseq ? a->nseq : def;
	if (dataset_build_tok(M, tk, DATASET_EVAL, T, nwant, ev, err,
	                      sizeof(err)))
		eval_die("%s", err);
	if (ev->n < nwant)
		fprintf(stderr, "kvtrim-eval: the evaluation split holds %u "
		        "windows of %u tokens, not %u\n", ev->n, T, nwant);
	*ratios = a->quick ? quick_ratios : full_ratios;
	return a->quick ? 1 : 3;
}

/*
 * kvzap's calibration on the training split (ncal windows of P tokens of
 * train-man.txt): the scores of both scorers under protocol 1, in zs[v]
 * (NULL where a scorer is missing).
 */
void ctx_calibrate(const struct model *M, const struct tok *t,
                   const struct eval_opts *a, uint32_t P, uint32_t ncal,
                   float *zs[2], float **gs, uint32_t *nout)
{
	const struct model_config *mc = &M->cfg;
	const size_t per = (size_t)mc->n_layers * mc->n_kv_heads * P;
	char err[1024];
	struct kvzap_scorer *z[2] = {NULL, NULL};
	struct fastkvzip_gate *fg = NULL;
	zs[0] = zs[1] = NULL;
	if (gs)
		*gs = NULL;
	*nout = 0;
	if (!a->wabs[0]) {
		fprintf(stderr, "kvtrim-eval: no weights in %s: learned "
		        "policies skipped (run make weights)\n", a->wdir);
		return;
	}
	for (int v = 0; v < 2; v++) {
		char d[PATH_MAX + 32];
		snprintf(d, sizeof(d), "%s/%s", a->wabs, kvzap_names[v]);
		if (kvzap_open(M, d, P, &z[v], err, sizeof(err)))
			fprintf(stderr, "kvtrim-eval: %s: %s (skipped)\n",
			        kvzap_names[v], err);
	}
	if (gs) {
		char f[PATH_MAX + 32];
		snprintf(f, sizeof(f), "%s/fastkvzip.safetensors", a->wabs);
		if (fastkvzip_gate_open(M, f, P, &fg, err, sizeof(err)))
			fprintf(stderr, "kvtrim-eval: fastkvzip-global: %s "
			        "(skipped)\n", err);
	}
	if (!z[0] && !z[1] && !fg)
		return;
	struct dataset cal;
	if (dataset_build_tok(M, t, DATASET_TRAIN, P, ncal, &cal, err,
	                      sizeof(err)))
		eval_die("%s", err);
	struct ctx_cache *c;
	float *xs = malloc(sizeof(float) * mc->n_layers * P * mc->dim);
	if (!xs || ctx_cache_open(M, P, &c))
		eval_die("out of memory");
	for (int v = 0; v < 2; v++)
		if (z[v] && !(zs[v] = malloc(sizeof(float) * per * cal.n)))
			eval_die("out of memory");
	if (fg && !(*gs = malloc(sizeof(float) * per * cal.n)))
		eval_die("out of memory");
	uint64_t t0 = now_ms();
	for (uint32_t q = 0; q < cal.n; q++) {
		struct ctx_tap tp = {.x = xs};
		ctx_cache_truncate(c, 0);
		if (ctx_cache_step(c, cal.tok + (size_t)q * P, P, 0, &tp, NULL))
			eval_die("calibration forward failed");
		for (int v = 0; v < 2; v++)
			if (z[v])
				kvzap_score(z[v], xs, P, zs[v] + per * q);
		if (fg)
			fastkvzip_gate_score(fg, xs, P, *gs + per * q);
	}
	fprintf(stderr, "kvtrim-eval: kvzap calibration: %u training windows "
	        "of %u tokens in %.0fs\n", cal.n, P,
	        (double)(now_ms() - t0) / 1e3);
	*nout = cal.n;
	ctx_cache_close(c);
	free(xs);
	dataset_free(&cal);
	kvzap_close(z[0]);
	kvzap_close(z[1]);
	fastkvzip_gate_close(fg);
}

/*
 * kvtrim-eval --calibrate: kvzap's thresholds for the protocol's targets
 * (and 0.5), from the same calibration windows and rule as the run's
 * jobs (kvzap_tau, window RECIPE_KVZAP_WINDOW, sinks CTX_KVZAP_SINKS),
 * written to OUT/calibration.txt as "scorer target threshold" lines: what
 * weights/<model>/calibration.txt ships for the demo and the bench.
 */
int ctx_write_calibration(const struct model *M, const struct tok *tk,
                                 const struct eval_opts *a, uint32_t P)
{
	static const double targets[] = {0.5, 0.75, 0.875};
	float *zs[2] = {NULL, NULL};
	uint32_t ncal = 0;
	ctx_calibrate(M, tk, a, P, a->quick ? 2 : CTX_CAL, zs, NULL, &ncal);
	if (!zs[0] && !zs[1])
		eval_die("--calibrate: no kvzap scorer in %s", a->wdir);
	char path[1200];
	snprintf(path, sizeof(path), "%s/calibration.txt", a->out);
	FILE *f = fopen(path, "w");
	if (!f)
		eval_die("%s: %s", path, strerror(errno));
	fprintf(f, "# kvzap thresholds: %u training-split windows of %u "
	        "tokens, protocol 1, window %u, sinks %u (kvtrim-eval "
	        "--calibrate%s)\n", ncal, P, RECIPE_KVZAP_WINDOW,
	        CTX_KVZAP_SINKS, a->quick ? " --quick" : "");
	for (int v = 0; v < 2; v++)
		for (size_t i = 0; zs[v] && i < 3; i++) {
			float tau = kvzap_tau(M, zs[v], ncal, P, P,
			                      RECIPE_KVZAP_WINDOW,
			                      CTX_KVZAP_SINKS, targets[i]);
			fprintf(f, "%s %.3f %.4f\n", kvzap_names[v],
			        targets[i], tau);
		}
	int bad = fclose(f) != 0;
	free(zs[0]);
	free(zs[1]);
	if (bad)
		eval_die("%s: write failed", path);
	fprintf(stderr, "kvtrim-eval: wrote %s\n", path);
	return 0;
}
