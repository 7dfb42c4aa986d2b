/*
 * fit.c — ridge, AdamW, the KVzap MLP trainer and fit metrics; see fit.h.
 */
#include "fit.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "kvtrim.h"

int fit_cholesky_solve(double *A, double *B, uint32_t d, uint32_t k)
{
	/* A = L L^T, L in the lower triangle of A. */
	for (uint32_t j = 0; j < d; j++) {
		double s = A[(size_t)j * d + j];
		for (uint32_t p = 0; p < j; p++)
			s -= A[(size_t)j * d + p] * A[(size_t)j * d + p];
		if (!(s > 0))
			return KVT_EINVAL;
		double ljj = sqrt(s);
		A[(size_t)j * d + j] = ljj;
		for (uint32_t i = j + 1; i < d; i++) {
			double t = A[(size_t)i * d + j];
			for (uint32_t p = 0; p < j; p++)
				t -= A[(size_t)i * d + p] * A[(size_t)j * d + p];
			A[(size_t)i * d + j] = t / ljj;
		}
	}
	for (uint32_t c = 0; c < k; c++) {
		/* L z = b, then L^T x = z */
		for (uint32_t i = 0; i < d; i++) {
			double t = B[(size_t)i * k + c];
			for (uint32_t p = 0; p < i; p++)
				t -= A[(size_t)i * d + p] * B[(size_t)p * k + c];
			B[(size_t)i * k + c] = t / A[(size_t)i * d + i];
		}
		for (uint32_t i = d; i-- > 0;) {
			double t = B[(size_t)i * k + c];
			for (uint32_t p = i + 1; p < d; p++)
				t -= A[(size_t)p * d + i] * B[(size_t)p * k + c];
			B[(size_t)i * k + c] = t / A[(size_t)i * d + i];
		}
	}
	return 0;
}

int fit_ridge(const float *X, const float *Y, size_t n, uint32_t d,
              uint32_t k, double alpha, float *W, float *b)
{
	double *mx = calloc(d, sizeof(double)), *my = calloc(k, sizeof(double));
	double *A = calloc((size_t)d * d, sizeof(double));
	double *B = calloc((size_t)d * k, sizeof(double));
	double *xc = malloc(sizeof(double) * d);
	int rc = KVT_ENOMEM;
	if (!mx || !my || !A || !B || !xc || !n)
		goto out;
	for (size_t r = 0; r < n; r++) {
		for (uint32_t i = 0; i < d; i++)
			mx[i] += X[r * d + i];
		for (uint32_t c = 0; c < k; c++)
			my[c] += Y[r * k + c];
	}
	for (uint32_t i = 0; i < d; i++)
		mx[i] /= (double)n;
	for (uint32_t c = 0; c < k; c++)
		my[c] /= (double)n;
	/* Upper triangle of Xc^T Xc by rank-1 updates (n is at most a few
	 * 100k rows of d <= 256: fine in double without BLAS). */
	for (size_t r = 0; r < n; r++) {
		for (uint32_t i = 0; i < d; i++)
			xc[i] = X[r * d + i] - mx[i];
		for (uint32_t i = 0; i < d; i++) {
			double xi = xc[i];
			double *Ai = A + (size_t)i * d;
			for (uint32_t j = i; j < d; j++)
				Ai[j] += xi * xc[j];
			for (uint32_t c = 0; c < k; c++)
				B[(size_t)i * k + c] += xi * (Y[r * k + c] - my[c]);
		}
	}
	for (uint32_t i = 0; i < d; i++) {
		A[(size_t)i * d + i] += alpha;
		for (uint32_t j = 0; j < i; j++)
			A[(size_t)i * d + j] = A[(size_t)j * d + i];
	}
	rc = fit_cholesky_solve(A, B, d, k);
	if (rc)
		goto out;
	for (uint32_t c = 0; c < k; c++) {
		double bc = my[c];
		for (uint32_t i = 0; i < d; i++) {
			W[(size_t)c * d + i] = (float)B[(size_t)i * k + c];
			bc -= B[(size_t)i * k + c] * mx[i];
		}
		b[c] = (float)bc;
	}
out:
	free(mx);
	free(my);
	free(A);
	free(B);
	free(xc);
	return rc;
}

double fit_r2(const float *pred, const float *y, size_t n)
{
	if (!n)
		return NAN;
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m += y[i];
	m /= (double)n;
	double res = 0, tot = 0;
	for (size_t i = 0; i < n; i++) {
		res += ((double)pred[i] - y[i]) * ((double)pred[i] - y[i]);
		tot += ((double)y[i] - m) * ((double)y[i] - m);
	}
	return tot > 0 ? 1.0 - res / tot : NAN;
}

struct kv {
	float v;
	uint32_t i;
};

static int cmp_kv(const void *a, const void *b)
{
	const struct kv *x = a, *y = b;
	if (x->v < y->v)
		return -1;
	if (x->v > y->v)
		return 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

/* Average ranks (1-based) of a into r. */
static int ranks(const float *a, size_t n, double *r)
{
	struct kv *s = malloc(sizeof(*s) * n);
	if (!s)
		return KVT_ENOMEM;
	for (size_t i = 0; i < n; i++)
		s[i] = (struct kv){a[i], (uint32_t)i};
	qsort(s, n, sizeof(*s), cmp_kv);
	for (size_t i = 0; i < n;) {
		size_t j = i;
		while (j + 1 < n && s[j + 1].v == s[i].v)
			j++;
		double avg = 0.5 * (double)(i + j) + 1.0;
		for (size_t t = i; t <= j; t++)
			r[s[t].i] = avg;
		i = j + 1;
	}
	free(s);
	return 0;
}

double fit_spearman(const float *a, const float *b, size_t n)
{
	double *ra = malloc(sizeof(double) * (n + 1));
	double *rb = malloc(sizeof(double) * (n + 1));
	double out = NAN;
	if (!ra || !rb || !n || ranks(a, n, ra) || ranks(b, n, rb))
		goto done;
	double ma = 0, mb = 0;
	for (size_t i = 0; i < n; i++) {
		ma += ra[i];
		mb += rb[i];
	}
	ma /= (double)n;
	mb /= (double)n;
	double sab = 0, saa = 0, sbb = 0;
	for (size_t i = 0; i < n; i++) {
		sab += (ra[i] - ma) * (rb[i] - mb);
		saa += (ra[i] - ma) * (ra[i] - ma);
		sbb += (rb[i] - mb) * (rb[i] - mb);
	}
	if (saa > 0 && sbb > 0)
		out = sab / sqrt(saa * sbb);
done:
	free(ra);
	free(rb);
	return out;
}

float fit_gelu(float z)
{
	return 0.5f * z * (1.0f + erff(z * 0.70710678118654752440f));
}

float fit_gelu_grad(float z)
{
	float cdf = 0.5f * (1.0f + erff(z * 0.70710678118654752440f));
	float pdf = 0.39894228040143267794f * expf(-0.5f * z * z);
	return cdf + z * pdf;
}

int fit_adam_init(struct fit_adam *a, size_t n, double wd)
{
	memset(a, 0, sizeof(*a));
	a->m = calloc(n ? n : 1, sizeof(float));
	a->v = calloc(n ? n : 1, sizeof(float));
	if (!a->m || !a->v) {
		fit_adam_free(a);
		return KVT_ENOMEM;
	}
	a->n = n;
	a->beta1 = 0.9;
	a->beta2 = 0.999;
	a->eps = 1e-8;
	a->wd = wd;
	return 0;
}

void fit_adam_free(struct fit_adam *a)
{
	free(a->m);
	free(a->v);
	a->m = a->v = NULL;
}

void fit_adam_step(struct fit_adam *a, float *p, const float *g, double lr)
{
	a->t++;
	double c1 = 1.0 - pow(a->beta1, (double)a->t);
	double c2 = 1.0 - pow(a->beta2, (double)a->t);
	for (size_t i = 0; i < a->n; i++) {
		a->m[i] = (float)(a->beta1 * a->m[i] + (1 - a->beta1) * g[i]);
		a->v[i] = (float)(a->beta2 * a->v[i] +
		                  (1 - a->beta2) * (double)g[i] * g[i]);
		double mh = a->m[i] / c1, vh = a->v[i] / c2;
		p[i] -= (float)(lr * (a->wd * p[i]));
		p[i] -= (float)(lr * mh / (sqrt(vh) + a->eps));
	}
}

double fit_clip(float *g, size_t n, double clip)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)g[i] * g[i];
	s = sqrt(s);
	if (clip > 0 && s > clip) {
		float f = (float)(clip / (s + 1e-6));
		for (size_t i = 0; i < n; i++)
			g[i] *= f;
	}
	return s;
}

void fit_col_mean(const float *Y, size_t n, uint32_t k, float *mean)
{
	for (uint32_t c = 0; c < k; c++) {
		double m = 0;
		for (size_t r = 0; r < n; r++)
			m += Y[r * k + c];
		mean[c] = (float)(m / (double)n);
	}
}

void fit_shuffle(uint32_t *idx, size_t n, uint64_t *state)
{
	for (size_t i = 0; i < n; i++)
		idx[i] = (uint32_t)i;
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)(dataset_rng(state) % i);
		uint32_t t = idx[i - 1];
		idx[i - 1] = idx[j];
		idx[j] = t;
	}
}

/* Forward of B gathered rows: Z = X W1^T + b1, H = gelu(Z),
 * P = H W2^T + b2. */
static void mlp_fwd(const float *Xb, uint32_t B, uint32_t d, uint32_t h,
                    uint32_t k, const float *W1, const float *b1,
                    const float *W2, const float *b2, float *Z, float *H,
                    float *P)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, (int)h,
	            (int)d, 1.0f, Xb, (int)d, W1, (int)d, 0.0f, Z, (int)h);
	for (uint32_t r = 0; r < B; r++)
		for (uint32_t j = 0; j < h; j++) {
			float z = Z[(size_t)r * h + j] + b1[j];
			Z[(size_t)r * h + j] = z;
			H[(size_t)r * h + j] = fit_gelu(z);
		}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, (int)k,
	            (int)h, 1.0f, H, (int)h, W2, (int)h, 0.0f, P, (int)k);
	for (uint32_t r = 0; r < B; r++)
		for (uint32_t c = 0; c < k; c++)
			P[(size_t)r * k + c] += b2[c];
}

int fit_mlp_apply(const float *X, size_t n, uint32_t d, uint32_t h,
                  uint32_t k, const float *W1, const float *b1,
                  const float *W2, const float *b2, float *Y)
{
	const uint32_t CH = 1024;
	float *Z = malloc(sizeof(float) * CH * h), *H = malloc(sizeof(float) * CH * h);
	if (!Z || !H) {
		free(Z);
		free(H);
		return KVT_ENOMEM;
	}
	for (size_t r = 0; r < n; r += CH) {
		uint32_t B = (uint32_t)(n - r < CH ? n - r : CH);
		mlp_fwd(X + r * d, B, d, h, k, W1, b1, W2, b2, Z, H, Y + r * k);
	}
	free(Z);
	free(H);
	return 0;
}

int fit_mlp(const float *X, const float *Y, size_t n, uint32_t d, uint32_t h,
            uint32_t k, const struct fit_mlp_opts *o, float *W1, float *b1,
            float *W2, float *b2, double *loss)
{
	uint64_t st = o->seed ^ 0x6d6c70ull;
	uint32_t B = o->batch ? o->batch : 512;
	size_t np = (size_t)h * d + h + (size_t)k * h + k;
	float *par = malloc(sizeof(float) * np), *grad = malloc(sizeof(float) * np);
	float *Xb = malloc(sizeof(float) * (size_t)B * d);
	float *Z = malloc(sizeof(float) * (size_t)B * h);
	float *H = malloc(sizeof(float) * (size_t)B * h);
	float *dH = malloc(sizeof(float) * (size_t)B * h);
	float *P = malloc(sizeof(float) * (size_t)B * k);
	uint32_t *idx = malloc(sizeof(uint32_t) * (n + 1));
	struct fit_adam ad = {0};
	int rc = KVT_ENOMEM;
	if (!par || !grad || !Xb || !Z || !H || !dH || !P || !idx || !n ||
	    fit_adam_init(&ad, np, o->wd))
		goto out;
	/* parameter views inside par / grad */
	float *pW1 = par, *pb1 = pW1 + (size_t)h * d, *pW2 = pb1 + h,
	      *pb2 = pW2 + (size_t)k * h;
	float *gW1 = grad, *gb1 = gW1 + (size_t)h * d, *gW2 = gb1 + h,
	      *gb2 = gW2 + (size_t)k * h;
	float a1 = 1.0f / sqrtf((float)d), a2 = 1.0f / sqrtf((float)h);
	for (size_t i = 0; i < (size_t)h * d; i++)
		pW1[i] = (float)(2 * dataset_uniform(&st) - 1) * a1;
	for (uint32_t i = 0; i < h; i++)
		pb1[i] = (float)(2 * dataset_uniform(&st) - 1) * a1;
	for (size_t i = 0; i < (size_t)k * h; i++)
		pW2[i] = (float)(2 * dataset_uniform(&st) - 1) * a2;
	fit_col_mean(Y, n, k, pb2);
	for (uint32_t e = 0; e < o->epochs; e++) {
		double lr = o->lr * 0.5 * (1.0 + cos(M_PI * e / o->epochs));
		double lsum = 0;
		fit_shuffle(idx, n, &st);
		for (size_t s = 0; s < n; s += B) {
			uint32_t b = (uint32_t)(n - s < B ? n - s : B);
			for (uint32_t r = 0; r < b; r++)
				memcpy(Xb + (size_t)r * d, X + (size_t)idx[s + r] * d,
				       sizeof(float) * d);
			mlp_fwd(Xb, b, d, h, k, pW1, pb1, pW2, pb2, Z, H, P);
			memset(grad, 0, sizeof(float) * np);
			float sc = 2.0f / (float)(b * k);
			for (uint32_t r = 0; r < b; r++)
				for (uint32_t c = 0; c < k; c++) {
					float err = P[(size_t)r * k + c] -
					            Y[(size_t)idx[s + r] * k + c];
					lsum += (double)err * err;
					P[(size_t)r * k + c] = err * sc; /* dP */
					gb2[c] += err * sc;
				}
			/* gW2 = dP^T H;  dH = dP W2 */
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans,
			            (int)k, (int)h, (int)b, 1.0f, P, (int)k, H,
			            (int)h, 0.0f, gW2, (int)h);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
			            (int)b, (int)h, (int)k, 1.0f, P, (int)k, pW2,
			            (int)h, 0.0f, dH, (int)h);
			for (uint32_t r = 0; r < b; r++)
				for (uint32_t j = 0; j < h; j++) {
					float g = dH[(size_t)r * h + j] *
					          fit_gelu_grad(Z[(size_t)r * h + j]);
					dH[(size_t)r * h + j] = g;
					gb1[j] += g;
				}
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans,
			            (int)h, (int)d, (int)b, 1.0f, dH, (int)h, Xb,
			            (int)d, 0.0f, gW1, (int)d);
			fit_clip(grad, np, o->clip);
			fit_adam_step(&ad, par, grad, lr);
		}
		if (loss)
			loss[e] = lsum / ((double)n * k);
	}
	memcpy(W1, pW1, sizeof(float) * (size_t)h * d);
	memcpy(b1, pb1, sizeof(float) * h);
	memcpy(W2, pW2, sizeof(float) * (size_t)k * h);
	memcpy(b2, pb2, sizeof(float) * k);
	rc = 0;
out:
	fit_adam_free(&ad);
	free(par);
	free(grad);
	free(Xb);
	free(Z);
	free(H);
	free(dH);
	free(P);
	free(idx);
	return rc;
}
