/*
 * gate.c — Fast KVzip gate training; see gate.h.  The forward repeats
 * sink_gate_cpu's arithmetic (tests compare the two), the backward is
 * written out by hand:
 *   p = e^l / (e^l + sum_s e^{ls_s})       dl = dp p (1 - p)
 *                                          dls_s = -dp p pi_s
 *   rmsnorm: xh = u / r, r = sqrt(mean u^2 + eps)
 *            du = (dxh - xh mean(dxh * xh)) / r
 */
#include "gate.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "fit.h"
#include "kvtrim.h"

#define GATE_EPS 1e-6f

size_t gate_count(const struct gate_params *p)
{
	size_t nq = (size_t)p->n_kv * p->G * p->dp;
	return nq * p->d + nq + (size_t)p->n_kv * p->dp * p->d + 2 * p->dp +
	       (size_t)p->n_kv * p->S * p->dp + (size_t)p->n_kv * p->G;
}

/* Points the named tensors into a flat vector laid out in gate order. */
static void views(const struct gate_params *p, float *flat, float **Wq,
                  float **cq, float **Wk, float **gq, float **gk,
                  float **sinks, float **bias)
{
	size_t nq = (size_t)p->n_kv * p->G * p->dp;
	*Wq = flat;
	*cq = *Wq + nq * p->d;
	*Wk = *cq + nq;
	*gq = *Wk + (size_t)p->n_kv * p->dp * p->d;
	*gk = *gq + p->dp;
	*sinks = *gk + p->dp;
	*bias = *sinks + (size_t)p->n_kv * p->S * p->dp;
}

int gate_init(struct gate_params *p, uint32_t d, uint32_t n_kv, uint32_t G,
              uint32_t dp, uint32_t S, uint64_t seed)
{
	memset(p, 0, sizeof(*p));
	p->d = d;
	p->n_kv = n_kv;
	p->G = G;
	p->dp = dp;
	p->S = S;
	p->flat = calloc(gate_count(p), sizeof(float));
	if (!p->flat)
		return KVT_ENOMEM;
	views(p, p->flat, &p->Wq, &p->cq, &p->Wk, &p->gq, &p->gk, &p->sinks,
	      &p->bias);
	uint64_t st = seed ^ 0x67617465ull;
	float a = 1.0f / sqrtf((float)d);
	size_t nq = (size_t)n_kv * G * dp;
	for (size_t i = 0; i < nq * d; i++)
		p->Wq[i] = (float)(2 * dataset_uniform(&st) - 1) * a;
	for (size_t i = 0; i < (size_t)n_kv * dp * d; i++)
		p->Wk[i] = (float)(2 * dataset_uniform(&st) - 1) * a;
	for (uint32_t i = 0; i < dp; i++)
		p->gq[i] = p->gk[i] = 1.0f;
	for (size_t i = 0; i < (size_t)n_kv * S * dp; i++)
		p->sinks[i] = (float)(2 * dataset_uniform(&st) - 1);
	return 0;
}

void gate_free(struct gate_params *p)
{
	free(p->flat);
	memset(p, 0, sizeof(*p));
}

/* Normalises u [dp] into xh, returns 1 / r. */
static float rms(const float *u, uint32_t dp, float *xh)
{
	float s = 0;
	for (uint32_t e = 0; e < dp; e++)
		s += u[e] * u[e];
	float ir = 1.0f / sqrtf(s / (float)dp + GATE_EPS);
	for (uint32_t e = 0; e < dp; e++)
		xh[e] = u[e] * ir;
	return ir;
}

/* du from dxh through the RMSNorm (xh, 1 / r). */
static void rms_back(const float *xh, const float *dxh, float ir, uint32_t dp,
                     float *du)
{
	float m = 0;
	for (uint32_t e = 0; e < dp; e++)
		m += dxh[e] * xh[e];
	m /= (float)dp;
	for (uint32_t e = 0; e < dp; e++)
		du[e] = (dxh[e] - xh[e] * m) * ir;
}

double gate_loss(const struct gate_params *p, const float *X, const float *Y,
                 size_t n, float *grad, float *score)
{
	const uint32_t d = p->d, nkv = p->n_kv, G = p->G, dp = p->dp, S = p->S;
	const size_t nq = (size_t)nkv * G * dp, nk = (size_t)nkv * dp;
	const float isd = 1.0f / sqrtf((float)dp);
	float *U = malloc(sizeof(float) * (n * nq + 1));
	float *K = malloc(sizeof(float) * (n * nk + 1));
	float *dU = grad ? calloc(n * nq + 1, sizeof(float)) : NULL;
	float *dK = grad ? calloc(n * nk + 1, sizeof(float)) : NULL;
	float *tmp = malloc(sizeof(float) * (8 * dp + 2 * (S + 1) + G * (2 * dp + 1)));
	double loss = NAN;
	if (!U || !K || !tmp || (grad && (!dU || !dK)))
		goto out;
	float *gWq = NULL, *gcq = NULL, *gWk = NULL, *ggq = NULL, *ggk = NULL,
	      *gsk = NULL, *gb = NULL;
	if (grad)
		views(p, grad, &gWq, &gcq, &gWk, &ggq, &ggk, &gsk, &gb);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nq,
	            (int)d, 1.0f, X, (int)d, p->Wq, (int)d, 0.0f, U, (int)nq);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nk,
	            (int)d, 1.0f, X, (int)d, p->Wk, (int)d, 0.0f, K, (int)nk);
	float *kh = tmp, *kt = kh + dp, *dkt = kt + dp, *dk = dkt + dp;
	float *qh = dk + dp, *qt = qh + dp, *dqt = qt + dp, *dq = dqt + dp;
	float *ls = dq + dp, *pi = ls + S + 1;
	float *pj = pi + S + 1;              /* [G] p per query head */
	float *qhs = pj + G;                 /* [G][dp] qh per head */
	float *qts = qhs + (size_t)G * dp;   /* [G][dp] */
	double L = 0;
	for (size_t r = 0; r < n; r++) {
		const float *Ur = U + r * nq;
		for (uint32_t g = 0; g < nkv; g++) {
			float *Kg = K + r * nk + (size_t)g * dp;
			float irk = rms(Kg, dp, kh);
			for (uint32_t e = 0; e < dp; e++)
				kt[e] = kh[e] * p->gk[e];
			const float *sk = p->sinks + (size_t)g * S * dp;
			float irqs[64];
			float pim[64][33]; /* pi per head when S <= 32 */
			double sc = 0;
			for (uint32_t j = 0; j < G; j++) {
				float *u = (float *)Ur + ((size_t)g * G + j) * dp;
				for (uint32_t e = 0; e < dp; e++)
					u[e] += p->cq[((size_t)g * G + j) * dp + e];
				float *qhj = qhs + (size_t)j * dp,
				      *qtj = qts + (size_t)j * dp;
				irqs[j & 63] = rms(u, dp, qhj);
				for (uint32_t e = 0; e < dp; e++)
					qtj[e] = qhj[e] * p->gq[e];
				float l = p->bias[(size_t)g * G + j], mx;
				for (uint32_t e = 0; e < dp; e++)
					l += qtj[e] * kt[e] * isd;
				mx = l;
				for (uint32_t s = 0; s < S; s++) {
					float v = 0;
					for (uint32_t e = 0; e < dp; e++)
						v += qtj[e] * sk[(size_t)s * dp + e];
					ls[s] = v * isd;
					mx = ls[s] > mx ? ls[s] : mx;
				}
				double z = exp((double)l - mx);
				double e0 = z;
				for (uint32_t s = 0; s < S; s++)
					z += exp((double)ls[s] - mx);
				pj[j] = (float)(e0 / z);
				if (S <= 32)
					for (uint32_t s = 0; s < S; s++)
						pim[j & 63][s] = (float)(exp((double)ls[s] - mx) / z);
				sc += pj[j];
			}
			sc /= G;
			if (score)
				score[r * nkv + g] = (float)sc;
			double y = Y[r * nkv + g];
			double sv = sc < 1e-7 ? 1e-7 : sc > 1 - 1e-7 ? 1 - 1e-7 : sc;
			L += -(y * log(sv) + (1 - y) * log(1 - sv));
			if (!grad)
				continue;
			float ds = (float)((sv - y) / (sv * (1 - sv)) / (double)n);
			memset(dkt, 0, sizeof(float) * dp);
			for (uint32_t j = 0; j < G; j++) {
				float dpj = ds / (float)G;
				float pp = pj[j];
				float dl = dpj * pp * (1 - pp);
				float *qhj = qhs + (size_t)j * dp,
				      *qtj = qts + (size_t)j * dp;
				gb[(size_t)g * G + j] += dl;
				for (uint32_t e = 0; e < dp; e++) {
					dqt[e] = dl * kt[e] * isd;
					dkt[e] += dl * qtj[e] * isd;
				}
				for (uint32_t s = 0; s < S && S <= 32; s++) {
					float dls = -dpj * pp * pim[j & 63][s] * isd;
					const float *kv = sk + (size_t)s * dp;
					float *gk_ = gsk + ((size_t)g * S + s) * dp;
					for (uint32_t e = 0; e < dp; e++) {
						dqt[e] += dls * kv[e];
						gk_[e] += dls * qtj[e];
					}
				}
				for (uint32_t e = 0; e < dp; e++) {
					ggq[e] += dqt[e] * qhj[e];
					dqt[e] *= p->gq[e];
				}
				float *du = dU + r * nq + ((size_t)g * G + j) * dp;
				rms_back(qhj, dqt, irqs[j & 63], dp, du);
				for (uint32_t e = 0; e < dp; e++)
					gcq[((size_t)g * G + j) * dp + e] += du[e];
			}
			for (uint32_t e = 0; e < dp; e++) {
				ggk[e] += dkt[e] * kh[e];
				dkt[e] *= p->gk[e];
			}
			rms_back(kh, dkt, irk, dp, dK + r * nk + (size_t)g * dp);
		}
	}
	loss = L / (double)n;
	if (grad) {
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nq,
		            (int)d, (int)n, 1.0f, dU, (int)nq, X, (int)d, 1.0f,
		            gWq, (int)d);
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk,
		            (int)d, (int)n, 1.0f, dK, (int)nk, X, (int)d, 1.0f,
		            gWk, (int)d);
	}
out:
	free(U);
	free(K);
	free(dU);
	free(dK);
	free(tmp);
	return loss;
}

int gate_train(struct gate_params *p, const float *X, const float *Y,
               size_t n, const struct gate_opts *o, double *loss_first,
               double *loss_last)
{
	if (p->S > 32 || p->G > 64 || !n)
		return KVT_EINVAL;
	size_t np = gate_count(p);
	uint32_t B = o->batch < n ? o->batch : (uint32_t)n;
	float *grad = malloc(sizeof(float) * np);
	float *mom = calloc(np, sizeof(float));
	float *Xb = malloc(sizeof(float) * (size_t)B * p->d);
	float *Yb = malloc(sizeof(float) * (size_t)B * p->n_kv);
	uint32_t *idx = malloc(sizeof(uint32_t) * n);
	int rc = KVT_ENOMEM;
	if (!grad || !mom || !Xb || !Yb || !idx)
		goto out;
	uint64_t st = o->seed ^ 0x73676475ull;
	size_t at = n; /* position in the current pass */
	uint32_t warm = o->steps / 100 ? o->steps / 100 : 1;
	uint32_t tail = o->steps / 20 ? o->steps / 20 : 1;
	double lf = 0, ll = 0;
	for (uint32_t step = 0; step < o->steps; step++) {
		if (at + B > n) {
			fit_shuffle(idx, n, &st);
			at = 0;
		}
		for (uint32_t r = 0; r < B; r++) {
			memcpy(Xb + (size_t)r * p->d, X + (size_t)idx[at + r] * p->d,
			       sizeof(float) * p->d);
			memcpy(Yb + (size_t)r * p->n_kv,
			       Y + (size_t)idx[at + r] * p->n_kv,
			       sizeof(float) * p->n_kv);
		}
		at += B;
		memset(grad, 0, sizeof(float) * np);
		double l = gate_loss(p, Xb, Yb, B, grad, NULL);
		if (isnan(l))
			goto out;
		if (step < tail)
			lf += l / tail;
		if (step >= o->steps - tail)
			ll += l / tail;
		double mult = step < warm ? (double)(step + 1) / warm : 1.0;
		if (step >= o->steps / 2)
			mult = 0.5;
		if (step >= o->steps * 3 / 4)
			mult = 0.25;
		float lr = (float)(o->lr * mult), mu = (float)o->momentum;
		for (size_t i = 0; i < np; i++) {
			mom[i] = mu * mom[i] + grad[i];
			p->flat[i] -= lr * mom[i];
		}
	}
	if (loss_first)
		*loss_first = lf;
	if (loss_last)
		*loss_last = ll;
	rc = 0;
out:
	free(grad);
	free(mom);
	free(Xb);
	free(Yb);
	free(idx);
	return rc;
}
