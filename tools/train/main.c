/*
 * kvtrim-train — learns the scorers of the learned policies from a model's
 * own oracles and writes them where the policies load them.
 *
 *   kvtrim-train --model M --out DIR [--seed S] [--quick] [--windows N]
 *
 * Data (dataset.h): training sequences of the model's context length
 * (512); never the evaluation split.  Per sequence and layer:
 *   - KVzip / KVzip+ targets (oracle.h) of its first 1 + n_ctx positions,
 *     n_ctx = the longest context whose reconstruction pretext
 *     [BOS] ctx sep ctx fits the context (254 bytes for bytes2m);
 *   - attention inputs x (post input-RMSNorm) from a dense pass over the
 *     whole sequence (causal, so the first positions equal the pretext's);
 *   - KVpop features and targets from the same pass's attention maps:
 *     a_{i,g} = sum_{t in (i, i+d]} mean_{h in grp(g)} a^h_{t,i}  (what
 *     the policy accumulates during the delay d) and the target
 *     y_{i,g} = max_{h in grp(g)} sum_{t in (i+d, i+d+N]} a^h_{t,i}, the
 *     future attention after the decision (horizon N), for every i whose
 *     horizon fits the sequence.
 * The last 10 % of the sequences are held out: the R^2 / Spearman printed
 * per layer are on them.
 *
 * Models (recipe.h), written under DIR:
 *   kvzap-linear/  config.json + model.safetensors  ridge, alpha 1, on
 *                  log KVzip+ (kvpress layout layers.{l}.weight/.bias)
 *   kvzap-mlp/     config.json + model.safetensors  Linear-GELU-Linear,
 *                  hidden d/8 (layers.{l}.0.* / layers.{l}.2.*)
 *   fastkvzip.safetensors   sink-attention gate, BCE on KVzip (gate.h)
 *   kvpop.safetensors       KVpop scorer on ln future attention (pop.h)
 *   fit.txt                 the fit table printed on stdout
 * Deterministic for a given seed: one thread, fixed shapes, seeded
 * shuffles and inits.
 */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "dataset.h"
#include "fit.h"
#include "gate.h"
#include "kernels.h"
#include "model.h"
#include "oracle.h"
#include "pop.h"
#include "recipe.h"
#include "weights.h"

void openblas_set_num_threads(int n);

static FILE *fit_out;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	if (fit_out) {
		va_start(ap, fmt);
		vfprintf(fit_out, fmt, ap);
		va_end(ap);
	}
	fflush(stdout);
}

static int mkdirs(const char *path)
{
	char b[1024];
	snprintf(b, sizeof(b), "%s", path);
	for (char *p = b + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			if (mkdir(b, 0755) < 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	return mkdir(b, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtrim-train --model M --out DIR [--seed S] "
	           "[--quick] [--windows N]\n");
}

/* Per-layer sample arrays (train and held-out halves share a buffer:
 * rows [0, n_tr) train, [n_tr, n) held out). */
struct set {
	size_t n, n_tr;
	float *x;  /* [L][n][d] */
	float *y1; /* [L][n][n_kv] */
	float *y2; /* [L][n][n_kv] */
};

static int set_alloc(struct set *s, uint32_t L, size_t n, uint32_t d,
                     uint32_t nkv)
{
	s->n = n;
	s->x = malloc(sizeof(float) * L * n * d + 1);
	s->y1 = malloc(sizeof(float) * L * n * nkv + 1);
	s->y2 = malloc(sizeof(float) * L * n * nkv + 1);
	return s->x && s->y1 && s->y2 ? 0 : KVT_ENOMEM;
}

static void set_free(struct set *s)
{
	free(s->x);
	free(s->y1);
	free(s->y2);
}

static int write_kvzap(const char *dir, const struct model_config *c,
                       uint32_t hidden, float *const *W1, float *const *b1,
                       float *const *W2, float *const *b2, char *err,
                       size_t errlen)
{
	if (mkdirs(dir) < 0) {
		snprintf(err, errlen, "%.900s: %s", dir, strerror(errno));
		return KVT_ESYS;
	}
	uint32_t L = c->n_layers, per = hidden ? 4 : 2;
	struct weights_tensor *t = calloc((size_t)L * per, sizeof(*t));
	char(*names)[48] = calloc((size_t)L * per, sizeof(*names));
	if (!t || !names) {
		free(t);
		free(names);
		return KVT_ENOMEM;
	}
	size_t k = 0;
	for (uint32_t l = 0; l < L; l++) {
		uint32_t o1 = hidden ? hidden : c->n_kv_heads;
		snprintf(names[k], 48, hidden ? "layers.%u.0.weight"
		                              : "layers.%u.weight", l);
		t[k] = (struct weights_tensor){names[k], 2, {o1, c->dim}, W1[l]};
		k++;
		snprintf(names[k], 48, hidden ? "layers.%u.0.bias"
		                              : "layers.%u.bias", l);
		t[k] = (struct weights_tensor){names[k], 1, {o1}, b1[l]};
		k++;
		if (!hidden)
			continue;
		snprintf(names[k], 48, "layers.%u.2.weight", l);
		t[k] = (struct weights_tensor){names[k], 2,
		                               {c->n_kv_heads, hidden}, W2[l]};
		k++;
		snprintf(names[k], 48, "layers.%u.2.bias", l);
		t[k] = (struct weights_tensor){names[k], 1, {c->n_kv_heads},
		                               b2[l]};
		k++;
	}
	char path[1024];
	snprintf(path, sizeof(path), "%.1000s/model.safetensors", dir);
	int rc = weights_write(path, t, k, err, errlen);
	free(t);
	free(names);
	if (rc)
		return rc;
	snprintf(path, sizeof(path), "%.1000s/config.json", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		snprintf(err, errlen, "%.900s: %s", path, strerror(errno));
		return KVT_ESYS;
	}
	char hd[16] = "null";
	if (hidden)
		snprintf(hd, sizeof(hd), "%u", hidden);
	fprintf(f, "{\"input_dim\": %u, \"output_dim\": %u, \"hidden_dim\": "
	           "%s, \"n_modules\": %u}\n", c->dim, c->n_kv_heads, hd, L);
	return fclose(f) ? KVT_ESYS : 0;
}

/* Pools the held-out rows of one layer: column-major over heads. */
static void metrics(const float *pred, const float *y, size_t n, uint32_t k,
                    double *r2, double *rho)
{
	float *a = malloc(sizeof(float) * n * k + 1);
	float *b = malloc(sizeof(float) * n * k + 1);
	if (!a || !b) {
		*r2 = *rho = NAN;
		free(a);
		free(b);
		return;
	}
	for (size_t i = 0; i < n * k; i++) {
		a[i] = pred[i];
		b[i] = y[i];
	}
	*r2 = fit_r2(a, b, n * k);
	*rho = fit_spearman(a, b, n * k);
	free(a);
	free(b);
}

int main(int argc, char **argv)
{
	int rc_main = 1;
	const char *model_path = NULL, *out = NULL;
	uint64_t seed = 1;
	int quick = 0;
	uint32_t windows = 0;
	static const struct option lo[] = {
		{"model", required_argument, 0, 'm'},
		{"out", required_argument, 0, 'o'},
		{"seed", required_argument, 0, 's'},
		{"quick", no_argument, 0, 'q'},
		{"windows", required_argument, 0, 'w'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	int ch;
	while ((ch = getopt_long(argc, argv, "m:o:s:qw:h", lo, NULL)) != -1) {
		switch (ch) {
		case 'm': model_path = optarg; break;
		case 'o': out = optarg; break;
		case 's': seed = strtoull(optarg, NULL, 0); break;
		case 'q': quick = 1; break;
		case 'w': windows = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!out || optind != argc) {
		usage(stderr);
		return 2;
	}
	openblas_set_num_threads(1);
	char err[1024];
	struct model m;
	model_path = model_default_path(model_path);
	if (model_load(model_path, &m, err, sizeof(err))) {
		fprintf(stderr, "kvtrim-train: %s\n", err);
		return 1;
	}
	if (mkdirs(out) < 0) {
		fprintf(stderr, "kvtrim-train: %s: %s\n", out, strerror(errno));
		return 1;
	}
	const struct model_config *c = &m.cfg;
	const uint32_t L = c->n_layers, H = c->n_heads, nkv = c->n_kv_heads,
	               G = H / nkv, d = c->dim, ctx = model_context(&m);
	const uint32_t D = RECIPE_KVPOP_DELAY, N = RECIPE_KVPOP_HORIZON;
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t nsep = oracle_default_sep(&m, sep);
	uint32_t nctx = oracle_kvzip_max_ctx(ctx, nsep), T = 1 + nctx;
	if (!windows)
		windows = quick ? 6 : 192;
	struct dataset ds;
	time_t t0 = time(NULL);
	if (dataset_build(&m, DATASET_TRAIN, ctx, windows, seed, &ds, err,
	                  sizeof(err))) {
		fprintf(stderr, "kvtrim-train: %s\n", err);
		return 1;
	}
	if (ds.n < 2 || ctx <= D + N + 1) {
		fprintf(stderr, "kvtrim-train: too little data\n");
		return 1;
	}
	uint32_t nho = ds.n / 10 ? ds.n / 10 : 1, ntr = ds.n - nho;
	uint32_t npw = ctx - D - N; /* kvpop rows per sequence */
	struct set z = {0}, p = {0};
	if (set_alloc(&z, L, (size_t)ds.n * T, d, nkv) ||
	    set_alloc(&p, L, (size_t)ds.n * npw, d, nkv)) {
		fprintf(stderr, "kvtrim-train: out of memory\n");
		return 1;
	}
	z.n_tr = (size_t)ntr * T;
	p.n_tr = (size_t)ntr * npw;
	float *kz = malloc(sizeof(float) * L * nkv * T);
	float *kzp = malloc(sizeof(float) * L * nkv * T);
	if (!kz || !kzp)
		return 1;
	char fitpath[1100];
	snprintf(fitpath, sizeof(fitpath), "%s/fit.txt", out);
	fit_out = fopen(fitpath, "w");
	say("kvtrim-train: model %s (d %u, %u layers, %u KV heads), seed %llu"
	    "%s\n", model_path, d, L, nkv, (unsigned long long)seed,
	    quick ? ", quick" : "");
	say("data: %u training sequences of %u tokens (%u held out), "
	    "KVzip ctx %u, KVpop delay %u horizon %u\n", ds.n, ctx, nho, nctx,
	    D, N);
	for (uint32_t w = 0; w < ds.n; w++) {
		const int32_t *tok = ds.tok + (size_t)w * ctx;
		int rc = oracle_kvzip(&m, tok + 1, nctx, sep, nsep, 0, kz);
		if (!rc)
			rc = oracle_kvzip(&m, tok + 1, nctx, sep, nsep, 1, kzp);
		struct model_dense dn;
		if (!rc)
			rc = model_dense_init(&dn, &m, ctx, 1);
		if (!rc) {
			rc = model_dense_step(&dn, tok, ctx, NULL);
			if (rc)
				model_dense_free(&dn);
		}
		if (rc) {
			fprintf(stderr, "kvtrim-train: oracle: %s\n",
			        kvt_strerror(rc));
			return 1;
		}
		for (uint32_t l = 0; l < L; l++) {
			size_t zo = (size_t)l * z.n + (size_t)w * T;
			memcpy(z.x + zo * d, dn.xs + (size_t)l * ctx * d,
			       sizeof(float) * T * d);
			for (uint32_t i = 0; i < T; i++)
				for (uint32_t g = 0; g < nkv; g++) {
					size_t src = ((size_t)l * nkv + g) * T + i;
					z.y1[(zo + i) * nkv + g] = kzp[src];
					z.y2[(zo + i) * nkv + g] = kz[src];
				}
			size_t po = (size_t)l * p.n + (size_t)w * npw;
			memcpy(p.x + po * d, dn.xs + (size_t)l * ctx * d,
			       sizeof(float) * npw * d);
			for (uint32_t i = 0; i < npw; i++)
				for (uint32_t g = 0; g < nkv; g++) {
					double a = 0, best = 0;
					for (uint32_t h = g * G; h < (g + 1) * G;
					     h++) {
						const float *mp =
							dn.maps + ((size_t)l * H + h) *
							                  ctx * ctx;
						double s1 = 0, s2 = 0;
						for (uint32_t t = i + 1; t <= i + D; t++)
							s1 += mp[(size_t)t * ctx + i];
						for (uint32_t t = i + D + 1;
						     t <= i + D + N; t++)
							s2 += mp[(size_t)t * ctx + i];
						a += s1 / G;
						best = s2 > best ? s2 : best;
					}
					p.y1[(po + i) * nkv + g] = (float)a;
					p.y2[(po + i) * nkv + g] = logf(
						(float)best + POP_TARGET_EPS);
				}
		}
		model_dense_free(&dn);
	}
	say("oracles: %ld s\n", (long)(time(NULL) - t0));

	/* ---- fits */
	uint32_t hid = d / RECIPE_KVZAP_HIDDEN_DIV, dp = recipe_fkv_dp(d),
	         S = RECIPE_FKV_SINKS;
	float **lW = calloc(L, sizeof(float *)), **lb = calloc(L, sizeof(float *));
	float **mW1 = calloc(L, sizeof(float *)), **mb1 = calloc(L, sizeof(float *));
	float **mW2 = calloc(L, sizeof(float *)), **mb2 = calloc(L, sizeof(float *));
	struct gate_params *gp = calloc(L, sizeof(*gp));
	struct pop_params *pp = calloc(L, sizeof(*pp));
	size_t nh = z.n - z.n_tr, nph = p.n - p.n_tr;
	float *pred = malloc(sizeof(float) * (nh > nph ? nh : nph) * nkv + 1);
	if (!lW || !lb || !mW1 || !mb1 || !mW2 || !mb2 || !gp || !pp || !pred)
		return 1;
	struct fit_mlp_opts mo = {quick ? 3 : 15, 512, 5e-3, 0.01, 1.0, seed};
	struct fit_mlp_opts po = {quick ? 3 : 10, 512, 5e-3, 0.01, 1.0, seed};
	struct gate_opts go = {quick ? 60 : 2000, 1000, 0.2, 0.9, seed};
	say("held-out fit per layer (R2 / Spearman against the oracle; "
	    "KVzap on log KVzip+, Fast KVzip on KVzip, KVpop on "
	    "ln future attention; 'delay' = Spearman of the raw delay "
	    "attention alone)\n");
	say("%-5s %-15s %-15s %-24s %-15s %s\n", "layer", "kvzap-linear",
	    "kvzap-mlp", "fastkvzip (bce)", "kvpop", "delay");
	double *mloss = calloc(mo.epochs > po.epochs ? mo.epochs : po.epochs,
	                       sizeof(double));
	for (uint32_t l = 0; l < L; l++) {
		const float *X = z.x + (size_t)l * z.n * d;
		const float *Yp = z.y1 + (size_t)l * z.n * nkv;
		const float *Yz = z.y2 + (size_t)l * z.n * nkv;
		const float *Xh = X + z.n_tr * d;
		double r2[4], rho[5];
		lW[l] = malloc(sizeof(float) * nkv * d);
		lb[l] = malloc(sizeof(float) * nkv);
		mW1[l] = malloc(sizeof(float) * hid * d);
		mb1[l] = malloc(sizeof(float) * hid);
		mW2[l] = malloc(sizeof(float) * nkv * hid);
		mb2[l] = malloc(sizeof(float) * nkv);
		if (fit_ridge(X, Yp, z.n_tr, d, nkv, 1.0, lW[l], lb[l])) {
			fprintf(stderr, "kvtrim-train: ridge failed\n");
			return 1;
		}
		scorer_linear_cpu(Xh, (uint32_t)nh, d, lW[l], lb[l], nkv, pred);
		metrics(pred, Yp + z.n_tr * nkv, nh, nkv, &r2[0], &rho[0]);

		if (fit_mlp(X, Yp, z.n_tr, d, hid, nkv, &mo, mW1[l], mb1[l],
		            mW2[l], mb2[l], mloss) ||
		    fit_mlp_apply(Xh, nh, d, hid, nkv, mW1[l], mb1[l], mW2[l],
		                  mb2[l], pred)) {
			fprintf(stderr, "kvtrim-train: mlp failed\n");
			return 1;
		}
		metrics(pred, Yp + z.n_tr * nkv, nh, nkv, &r2[1], &rho[1]);

		double lf = 0, ll = 0;
		if (gate_init(&gp[l], d, nkv, G, dp, S, seed + l) ||
		    gate_train(&gp[l], X, Yz, z.n_tr, &go, &lf, &ll)) {
			fprintf(stderr, "kvtrim-train: gate failed\n");
			return 1;
		}
		double hb = gate_loss(&gp[l], Xh, Yz + z.n_tr * nkv, nh, NULL,
		                      pred);
		metrics(pred, Yz + z.n_tr * nkv, nh, nkv, &r2[2], &rho[2]);

		const float *PX = p.x + (size_t)l * p.n * d;
		const float *PF = p.y1 + (size_t)l * p.n * nkv;
		const float *PT = p.y2 + (size_t)l * p.n * nkv;
		if (pop_init(&pp[l], d, nkv, RECIPE_KVPOP_R, RECIPE_KVPOP_M,
		             seed + 100 + l) ||
		    pop_train(&pp[l], PX, PF, PT, p.n_tr, &po, NULL) ||
		    pop_apply(&pp[l], PX + p.n_tr * d, PF + p.n_tr * nkv, nph,
		              pred)) {
			fprintf(stderr, "kvtrim-train: kvpop failed\n");
			return 1;
		}
		metrics(pred, PT + p.n_tr * nkv, nph, nkv, &r2[3], &rho[3]);
		rho[4] = fit_spearman(PF + p.n_tr * nkv, PT + p.n_tr * nkv,
		                      nph * nkv);
		char b[4][64];
		snprintf(b[0], 64, "%.3f / %.3f", r2[0], rho[0]);
		snprintf(b[1], 64, "%.3f / %.3f", r2[1], rho[1]);
		snprintf(b[2], 64, "%.3f / %.3f (%.3f)", r2[2], rho[2], hb);
		snprintf(b[3], 64, "%.3f / %.3f", r2[3], rho[3]);
		say("%-5u %-15s %-15s %-24s %-15s %.3f\n", l, b[0], b[1], b[2],
		    b[3], rho[4]);
		say("      mlp loss %.4f -> %.4f; gate train bce %.4f -> %.4f\n",
		    mloss[0], mloss[mo.epochs - 1], lf, ll);
	}

	/* ---- write */
	char dir[1100], path[1100];
	snprintf(dir, sizeof(dir), "%s/kvzap-linear", out);
	if (write_kvzap(dir, c, 0, lW, lb, NULL, NULL, err, sizeof(err)))
		goto werr;
	snprintf(dir, sizeof(dir), "%s/kvzap-mlp", out);
	if (write_kvzap(dir, c, hid, mW1, mb1, mW2, mb2, err, sizeof(err)))
		goto werr;
	{
		struct weights_tensor *t = calloc((size_t)L * 7, sizeof(*t));
		char(*nm)[48] = calloc((size_t)L * 7, sizeof(*nm));
		size_t k = 0;
		uint64_t nq = (uint64_t)nkv * G * dp;
		for (uint32_t l = 0; l < L; l++) {
			const struct gate_params *g = &gp[l];
#define T1(fmt, nd, s0, s1, s2, s3, ptr)                                        \
	do {                                                                   \
		snprintf(nm[k], 48, fmt, l);                                   \
		t[k] = (struct weights_tensor){nm[k], nd, {s0, s1, s2, s3},    \
		                               ptr};                           \
		k++;                                                           \
	} while (0)
			T1("fastkvzip.%u.q_proj.weight", 2, nq, d, 0, 0, g->Wq);
			T1("fastkvzip.%u.q_proj.bias", 1, nq, 0, 0, 0, g->cq);
			T1("fastkvzip.%u.k_proj.weight", 2, (uint64_t)nkv * dp, d,
			   0, 0, g->Wk);
			T1("fastkvzip.%u.q_norm.weight", 1, dp, 0, 0, 0, g->gq);
			T1("fastkvzip.%u.k_norm.weight", 1, dp, 0, 0, 0, g->gk);
			T1("fastkvzip.%u.k_base", 4, nkv, 1, S, dp, g->sinks);
			T1("fastkvzip.%u.b", 3, nkv, 1, G, 0, g->bias);
		}
		snprintf(path, sizeof(path), "%s/fastkvzip.safetensors", out);
		int rc = weights_write(path, t, k, err, sizeof(err));
		k = 0;
		for (uint32_t l = 0; l < L && !rc; l++) {
			const struct pop_params *q = &pp[l];
			T1("kvpop.%u.proj.weight", 2, q->r, d, 0, 0, q->P);
			T1("kvpop.%u.fc1.weight", 2, q->m, q->r + 1, 0, 0, q->W1);
			T1("kvpop.%u.fc1.bias", 1, q->m, 0, 0, 0, q->b1);
			T1("kvpop.%u.fc2.weight", 2, nkv, q->m, 0, 0, q->W2);
			T1("kvpop.%u.fc2.bias", 1, nkv, 0, 0, 0, q->b2);
		}
#undef T1
		snprintf(path, sizeof(path), "%s/kvpop.safetensors", out);
		if (!rc)
			rc = weights_write(path, t, k, err, sizeof(err));
		free(t);
		free(nm);
		if (rc)
			goto werr;
	}
	say("wrote %s/{kvzap-linear,kvzap-mlp}/, fastkvzip.safetensors, "
	    "kvpop.safetensors in %ld s\n", out, (long)(time(NULL) - t0));
	if (fit_out)
		fclose(fit_out);
	fit_out = NULL;
	rc_main = 0;
	goto done;
werr:
	fprintf(stderr, "kvtrim-train: %s\n", err);
done:
	/* Everything is released, so LeakSanitizer (make SANITIZER=address
	 * test runs this tool) only ever reports real leaks. */
	if (fit_out)
		fclose(fit_out);
	for (uint32_t l = 0; l < L; l++) {
		free(lW[l]);
		free(lb[l]);
		free(mW1[l]);
		free(mb1[l]);
		free(mW2[l]);
		free(mb2[l]);
		gate_free(&gp[l]);
		pop_free(&pp[l]);
	}
	free(lW);
	free(lb);
	free(mW1);
	free(mb1);
	free(mW2);
	free(mb2);
	free(gp);
	free(pp);
	free(pred);
	free(mloss);
	free(kz);
	free(kzp);
	set_free(&z);
	set_free(&p);
	dataset_free(&ds);
	model_free(&m);
	return rc_main;
}
