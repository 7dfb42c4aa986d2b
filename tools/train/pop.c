/*
 * pop.c — KVpop scorer training; see pop.h.
 */
#include "pop.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "kvtrim.h"

size_t pop_count(const struct pop_params *p)
{
	return (size_t)p->r * p->d + (size_t)p->m * (p->r + 1) + p->m +
	       (size_t)p->n_kv * p->m + p->n_kv;
}

static void views(const struct pop_params *p, float *flat, float **P,
                  float **W1, float **b1, float **W2, float **b2)
{
	*P = flat;
	*W1 = *P + (size_t)p->r * p->d;
	*b1 = *W1 + (size_t)p->m * (p->r + 1);
	*W2 = *b1 + p->m;
	*b2 = *W2 + (size_t)p->n_kv * p->m;
}

int pop_init(struct pop_params *p, uint32_t d, uint32_t n_kv, uint32_t r,
             uint32_t m, uint64_t seed)
{
	memset(p, 0, sizeof(*p));
	p->d = d;
	p->n_kv = n_kv;
	p->r = r;
	p->m = m;
	p->flat = calloc(pop_count(p), sizeof(float));
	if (!p->flat)
		return KVT_ENOMEM;
	views(p, p->flat, &p->P, &p->W1, &p->b1, &p->W2, &p->b2);
	uint64_t st = seed ^ 0x706f70ull;
	float a0 = 1.0f / sqrtf((float)d), a1 = 1.0f / sqrtf((float)(r + 1)),
	      a2 = 1.0f / sqrtf((float)m);
	for (size_t i = 0; i < (size_t)r * d; i++)
		p->P[i] = (float)(2 * dataset_uniform(&st) - 1) * a0;
	for (size_t i = 0; i < (size_t)m * (r + 1); i++)
		p->W1[i] = (float)(2 * dataset_uniform(&st) - 1) * a1;
	for (uint32_t i = 0; i < m; i++)
		p->b1[i] = (float)(2 * dataset_uniform(&st) - 1) * a1;
	for (size_t i = 0; i < (size_t)n_kv * m; i++)
		p->W2[i] = (float)(2 * dataset_uniform(&st) - 1) * a2;
	return 0;
}

void pop_free(struct pop_params *p)
{
	free(p->flat);
	memset(p, 0, sizeof(*p));
}

/* Forward (and, with grad, backward of the MSE against T scaled by sc)
 * for n rows; returns the summed squared error. */
static double run(const struct pop_params *p, const float *X, const float *F,
                  const float *T, size_t n, float *S, float *grad,
                  float *U /* [n][r] */, float *dU /* [n][r] */,
                  float *w /* [3][m + r + 1] */)
{
	const uint32_t r = p->r, m = p->m, nkv = p->n_kv;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)r,
	            (int)p->d, 1.0f, X, (int)p->d, p->P, (int)p->d, 0.0f, U,
	            (int)r);
	float *gP = NULL, *gW1 = NULL, *gb1 = NULL, *gW2 = NULL, *gb2 = NULL;
	if (grad) {
		views(p, grad, &gP, &gW1, &gb1, &gW2, &gb2);
		memset(dU, 0, sizeof(float) * n * r);
	}
	float *z = w, *pre = z + r + 1, *hid = pre + m;
	float sc = 2.0f / (float)(n * nkv);
	double sse = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(z, U + i * r, sizeof(float) * r);
		for (uint32_t g = 0; g < nkv; g++) {
			z[r] = logf(F[i * nkv + g] + POP_FEAT_EPS);
			for (uint32_t o = 0; o < m; o++) {
				const float *wr = p->W1 + (size_t)o * (r + 1);
				float a = p->b1[o];
				for (uint32_t c = 0; c <= r; c++)
					a += wr[c] * z[c];
				pre[o] = a;
				hid[o] = fit_gelu(a);
			}
			const float *w2 = p->W2 + (size_t)g * m;
			float s = p->b2[g];
			for (uint32_t o = 0; o < m; o++)
				s += w2[o] * hid[o];
			if (S)
				S[i * nkv + g] = s;
			if (!T)
				continue;
			float e = s - T[i * nkv + g];
			sse += (double)e * e;
			if (!grad)
				continue;
			float ds = e * sc;
			gb2[g] += ds;
			for (uint32_t o = 0; o < m; o++) {
				gW2[(size_t)g * m + o] += ds * hid[o];
				float dp = ds * w2[o] * fit_gelu_grad(pre[o]);
				gb1[o] += dp;
				float *gw = gW1 + (size_t)o * (r + 1);
				const float *wr = p->W1 + (size_t)o * (r + 1);
				for (uint32_t c = 0; c <= r; c++)
					gw[c] += dp * z[c];
				for (uint32_t c = 0; c < r; c++)
					dU[i * r + c] += dp * wr[c];
			}
		}
	}
	if (grad)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)r,
		            (int)p->d, (int)n, 1.0f, dU, (int)r, X, (int)p->d,
		            1.0f, gP, (int)p->d);
	return sse;
}

int pop_apply(const struct pop_params *p, const float *X, const float *F,
              size_t n, float *S)
{
	float *U = malloc(sizeof(float) * (n * p->r + 1));
	float *w = malloc(sizeof(float) * 3 * (p->m + p->r + 1));
	if (!U || !w) {
		free(U);
		free(w);
		return KVT_ENOMEM;
	}
	run(p, X, F, NULL, n, S, NULL, U, NULL, w);
	free(U);
	free(w);
	return 0;
}

int pop_train(struct pop_params *p, const float *X, const float *F,
              const float *T, size_t n, const struct fit_mlp_opts *o,
              double *loss)
{
	uint32_t B = o->batch ? o->batch : 512;
	size_t np = pop_count(p);
	const uint32_t d = p->d, nkv = p->n_kv;
	float *grad = malloc(sizeof(float) * np);
	float *Xb = malloc(sizeof(float) * (size_t)B * d);
	float *Fb = malloc(sizeof(float) * (size_t)B * nkv);
	float *Tb = malloc(sizeof(float) * (size_t)B * nkv);
	float *U = malloc(sizeof(float) * (size_t)B * p->r);
	float *dU = malloc(sizeof(float) * (size_t)B * p->r);
	float *w = malloc(sizeof(float) * 3 * (p->m + p->r + 1));
	uint32_t *idx = malloc(sizeof(uint32_t) * (n + 1));
	struct fit_adam ad = {0};
	int rc = KVT_ENOMEM;
	if (!grad || !Xb || !Fb || !Tb || !U || !dU || !w || !idx || !n ||
	    fit_adam_init(&ad, np, o->wd))
		goto out;
	uint64_t st = o->seed ^ 0x706f7074ull;
	/* the output offset starts at the target mean */
	fit_col_mean(T, n, nkv, p->b2);
	for (uint32_t e = 0; e < o->epochs; e++) {
		double lr = o->lr * 0.5 * (1.0 + cos(M_PI * e / o->epochs));
		double sse = 0;
		fit_shuffle(idx, n, &st);
		for (size_t s = 0; s < n; s += B) {
			uint32_t b = (uint32_t)(n - s < B ? n - s : B);
			for (uint32_t r = 0; r < b; r++) {
				size_t k = idx[s + r];
				memcpy(Xb + (size_t)r * d, X + k * d,
				       sizeof(float) * d);
				memcpy(Fb + (size_t)r * nkv, F + k * nkv,
				       sizeof(float) * nkv);
				memcpy(Tb + (size_t)r * nkv, T + k * nkv,
				       sizeof(float) * nkv);
			}
			memset(grad, 0, sizeof(float) * np);
			sse += run(p, Xb, Fb, Tb, b, NULL, grad, U, dU, w);
			fit_clip(grad, np, o->clip);
			fit_adam_step(&ad, p->flat, grad, lr);
		}
		if (loss)
			loss[e] = sse / ((double)n * nkv);
	}
	rc = 0;
out:
	fit_adam_free(&ad);
	free(grad);
	free(Xb);
	free(Fb);
	free(Tb);
	free(U);
	free(dU);
	free(w);
	free(idx);
	return rc;
}

static int cmp_float(const void *a, const void *b)
{
	const float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

int pop_shares(const float *const *pred, uint32_t L, size_t n,
               uint32_t n_kv, const float *keep, uint32_t n_f, float *share)
{
	const size_t per = n * n_kv, all = per * L;
	float *v = malloc(sizeof(float) * (all + 1));
	if (!v)
		return KVT_ENOMEM;
	for (uint32_t l = 0; l < L; l++)
		memcpy(v + l * per, pred[l], sizeof(float) * per);
	qsort(v, all, sizeof(float), cmp_float);
	for (uint32_t j = 0; j < n_f; j++) {
		size_t at = (size_t)((1.0 - (double)keep[j]) * (double)all);
		const float tau = v[at < all ? at : all - 1];
		for (uint32_t l = 0; l < L; l++)
			for (uint32_t h = 0; h < n_kv; h++) {
				size_t k = 0;
				for (size_t i = 0; i < n; i++)
					k += pred[l][i * n_kv + h] >= tau;
				share[((size_t)j * L + l) * n_kv + h] =
					(float)((double)k /
					        ((double)n * keep[j]));
			}
	}
	free(v);
	return 0;
}

/* c of a memory with decay beta once age - D queries are read (the ages
 * are above the delay: recipe.h). */
static double mem_count(double beta, uint32_t age, uint32_t D)
{
	return (1.0 - pow(beta, (double)(age - D))) / (1.0 - beta);
}

/* Solves the k x k system A x = b (k <= 3) by Gaussian elimination with
 * partial pivoting; 0, or -1 when singular. */
static int solve(double A[3][3], double *b, uint32_t k, double *x)
{
	for (uint32_t c = 0; c < k; c++) {
		uint32_t piv = c;
		for (uint32_t r = c + 1; r < k; r++)
			if (fabs(A[r][c]) > fabs(A[piv][c]))
				piv = r;
		if (!(fabs(A[piv][c]) > 1e-12))
			return -1;
		for (uint32_t e = 0; e < k; e++) {
			double t = A[c][e];
			A[c][e] = A[piv][e];
			A[piv][e] = t;
		}
		double t = b[c];
		b[c] = b[piv];
		b[piv] = t;
		for (uint32_t r = c + 1; r < k; r++) {
			double f = A[r][c] / A[c][c];
			for (uint32_t e = c; e < k; e++)
				A[r][e] -= f * A[c][e];
			b[r] -= f * b[c];
		}
	}
	for (uint32_t c = k; c-- > 0;) {
		double v = b[c];
		for (uint32_t e = c + 1; e < k; e++)
			v -= A[c][e] * x[e];
		x[c] = v / A[c][c];
	}
	return 0;
}

/* What mem_walk sums over the samples (row, KV head, age) that have a
 * target: the normal equations of the regressors z = [1, s, f_j] (the
 * first k of them) against y = ln(target + 1e-6), or, given theta, the
 * residuals' and the targets' sums for R^2. */
struct mem_acc {
	uint32_t k;          /* regressors used: 2 (s alone) or 3 */
	const double *theta; /* NULL: accumulate the normal equations */
	double A[3][3], b[3];
	double sy, syy, sse;
	size_t n;
};

static void mem_walk(const float *S, const float *M, size_t n, uint32_t nkv,
                     uint32_t D, uint32_t j, struct mem_acc *a)
{
	const double beta = exp(-1.0 / (double)pop_mem_decay(j));
	for (uint32_t k = 0; k < POP_MEM_AGES; k++) {
		const double c = mem_count(beta, pop_mem_age(k), D);
		for (size_t i = 0; i < n; i++)
			for (uint32_t g = 0; g < nkv; g++) {
				const float *f = M + (i * nkv + g) * POP_MEM_FEATS;
				const float t = f[POP_MEM_FEAT(k, 0)];
				if (!(t >= 0.0f))
					continue; /* NaN: past the window */
				const double y = log((double)t + POP_FEAT_EPS),
				             z[3] = {1.0, S[i * nkv + g],
				                     log((double)f[POP_MEM_FEAT(
				                         k, 1 + j)] / c +
				                         POP_FEAT_EPS)};
				a->n++;
				if (a->theta) {
					double e = y;
					for (uint32_t r = 0; r < a->k; r++)
						e -= a->theta[r] * z[r];
					a->sse += e * e;
					a->sy += y;
					a->syy += y * y;
					continue;
				}
				for (uint32_t r = 0; r < a->k; r++) {
					for (uint32_t e = 0; e < a->k; e++)
						a->A[r][e] += z[r] * z[e];
					a->b[r] += z[r] * y;
				}
			}
	}
}

/* Fits [1, s] (k = 2) or [1, s, f_j] (k = 3) on the training rows into
 * theta and returns its held-out R^2 (NaN when it cannot be fitted); the
 * samples fitted and scored into *nt, *nh when not NULL. */
static double mem_fit_one(const float *S_tr, const float *M_tr, size_t n_tr,
                          const float *S_ho, const float *M_ho, size_t n_ho,
                          uint32_t nkv, uint32_t D, uint32_t j, uint32_t k,
                          double *theta, size_t *nt, size_t *nh)
{
	struct mem_acc a = {.k = k};
	mem_walk(S_tr, M_tr, n_tr, nkv, D, j, &a);
	if (nt)
		*nt = a.n;
	theta[2] = 0.0;
	if (!a.n || solve(a.A, a.b, k, theta))
		return NAN;
	struct mem_acc h = {.k = k, .theta = theta};
	mem_walk(S_ho, M_ho, n_ho, nkv, D, j, &h);
	if (nh)
		*nh = h.n;
	if (!h.n)
		return NAN;
	const double sst = h.syy - h.sy * h.sy / (double)h.n;
	return sst > 0 ? 1.0 - h.sse / sst : NAN;
}

void pop_mem_fit(const float *S_tr, const float *M_tr, size_t n_tr,
                 const float *S_ho, const float *M_ho, size_t n_ho,
                 uint32_t n_kv, uint32_t D, struct pop_mem *out)
{
	double th[3];
	memset(out, 0, sizeof(*out));
	out->r2_s = mem_fit_one(S_tr, M_tr, n_tr, S_ho, M_ho, n_ho, n_kv, D,
	                        0, 2, th, &out->n_tr, &out->n_ho);
	/* s alone: the memory's weight 0, the decay the first (also when
	 * nothing could be fitted: windows too short for the ages) */
	out->decay = (float)pop_mem_decay(0);
	out->w_s = out->r2_s == out->r2_s ? (float)th[1] : 1.0f;
	out->w_f = 0.0f;
	out->r2_mem = NAN;
	for (uint32_t j = 0; j < POP_MEM_DECAYS; j++) {
		double r2 = mem_fit_one(S_tr, M_tr, n_tr, S_ho, M_ho, n_ho,
		                        n_kv, D, j, 3, th, NULL, NULL);
		/* the first finite fit, then any better one */
		if (r2 == r2 && !(r2 <= out->r2_mem)) {
			out->decay = (float)pop_mem_decay(j);
			out->w_s = (float)th[1];
			out->w_f = (float)th[2];
			out->r2_mem = r2;
		}
	}
	if (out->r2_mem != out->r2_mem)
		out->r2_mem = out->r2_s;
}
