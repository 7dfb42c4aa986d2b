/*
 * fit.h — the numerical pieces of kvtrim-train: closed-form ridge
 * regression (KVzap-Linear), the KVzap-MLP trainer, AdamW, and the fit
 * metrics (R^2, Spearman) printed against the oracles.
 *
 * Everything is deterministic: no threads of its own, BLAS called with
 * fixed shapes, shuffles from dataset_rng with the caller's seed.
 * Matrices are float32 row-major unless a double is named; errors are
 * negative KVT_E* codes.
 */
#ifndef KVT_TRAIN_FIT_H
#define KVT_TRAIN_FIT_H

#include <stddef.h>
#include <stdint.h>

/*
 * Solves A X = B in place for symmetric positive definite A by Cholesky
 * (A is overwritten by its factor, B by X).  KVT_EINVAL when A is not
 * positive definite.
 */
int fit_cholesky_solve(double *A /* [d][d] */, double *B /* [d][k] */,
                       uint32_t d, uint32_t k);

/*
 * Ridge regression with an unpenalised intercept (sklearn Ridge(alpha)):
 * centre X and Y, solve (Xc^T Xc + alpha I) W^T = Xc^T Yc, then
 * b = mean(Y) - W mean(X).  Accumulates in double.
 */
int fit_ridge(const float *X /* [n][d] */, const float *Y /* [n][k] */,
              size_t n, uint32_t d, uint32_t k, double alpha,
              float *W /* [k][d] */, float *b /* [k] */);

/* Coefficient of determination 1 - SS_res / SS_tot (NaN when y is
 * constant or n == 0). */
double fit_r2(const float *pred /* [n] */, const float *y /* [n] */,
              size_t n);

/* Spearman rank correlation (ties get their average rank); NaN when one
 * side is constant.  KVT_ENOMEM is reported as NaN as well. */
double fit_spearman(const float *a /* [n] */, const float *b /* [n] */,
                    size_t n);

/* exact-erf GELU and its derivative */
float fit_gelu(float z);
float fit_gelu_grad(float z);

/* AdamW state over one flat parameter vector (torch.optim.AdamW). */
struct fit_adam {
	size_t n;
	float *m, *v; /* [n] */
	uint64_t t;
	double beta1, beta2, eps, wd;
};
int fit_adam_init(struct fit_adam *a, size_t n, double wd);
void fit_adam_free(struct fit_adam *a);
/* One step with learning rate lr: p -= lr * (mhat / (sqrt(vhat) + eps)
 * + wd * p). */
void fit_adam_step(struct fit_adam *a, float *p /* [n] */,
                   const float *g /* [n] */, double lr);

/* Scales g to global norm at most clip (clip <= 0: no clipping); returns
 * the norm before clipping. */
double fit_clip(float *g /* [n] */, size_t n, double clip);

struct fit_mlp_opts {
	uint32_t epochs; /* cosine schedule over epochs (CosineAnnealingLR) */
	uint32_t batch;
	double lr, wd, clip;
	uint64_t seed;   /* init and shuffles */
};

/*
 * Trains y = W2 gelu(W1 x + b1) + b2 with MSE (mean over n * k), AdamW,
 * a cosine learning rate per epoch and global-norm clipping — kvpress
 * kvzap/train.py scaled down.  Init: torch's nn.Linear uniform bounds
 * 1/sqrt(fan_in), except b2 = mean(Y) (the log-score offset would
 * otherwise take most of the epochs).  loss[e] receives epoch e's mean
 * training loss when loss is not NULL ([epochs]).
 */
int fit_mlp(const float *X /* [n][d] */, const float *Y /* [n][k] */,
            size_t n, uint32_t d, uint32_t h, uint32_t k,
            const struct fit_mlp_opts *o, float *W1 /* [h][d] */,
            float *b1 /* [h] */, float *W2 /* [k][h] */, float *b2 /* [k] */,
            double *loss /* [epochs] or NULL */);

/* y = W2 gelu(W1 x + b1) + b2 for n rows (scratch allocated here). */
int fit_mlp_apply(const float *X, size_t n, uint32_t d, uint32_t h,
                  uint32_t k, const float *W1, const float *b1,
                  const float *W2, const float *b2, float *Y /* [n][k] */);

/* Column means of Y, accumulated in double: the trainers start their
 * output offsets there. */
void fit_col_mean(const float *Y /* [n][k] */, size_t n, uint32_t k,
                  float *mean /* [k] */);

/* Fisher-Yates permutation of [0, n) from the generator state. */
void fit_shuffle(uint32_t *idx /* [n] */, size_t n, uint64_t *state);

#endif
