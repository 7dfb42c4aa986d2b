/*
 * gate.h — trains one layer of Fast KVzip's low-rank sink-attention gate
 * (methods.md section 2; the forward is kernels.h sink_gate_cpu, whose
 * parameter layouts these are) against KVzip scores in [0, 1].
 *
 * Loss: binary cross-entropy with the continuous target ("cnt"), mean over
 * tokens, summed over the layer's KV heads.  Optimiser as the paper's
 * optim.py: SGD with momentum 0.9, lr 0.2, warm-up over the first 1 % of
 * steps (multiplier step / warm-up), x0.5 after 50 % and x0.25 after 75 %
 * of the steps, minibatches of tokens drawn without replacement per pass.
 * Differences, both forced by starting from scratch: RMSNorm gains start
 * at 1 and the projections and sink keys at small seeded uniform values
 * (all-zero parameters, as the released training starts, have zero
 * gradient for everything but the bias: the normalised query and key are
 * both 0); the bias is added once in training as in inference (the
 * optim.py double-bias quirk is not reproduced).
 */
#ifndef KVT_TRAIN_GATE_H
#define KVT_TRAIN_GATE_H

#include <stddef.h>
#include <stdint.h>

struct gate_params {
	uint32_t d, n_kv, G, dp, S;
	float *Wq;    /* [n_kv][G][dp][d] */
	float *cq;    /* [n_kv][G][dp] */
	float *Wk;    /* [n_kv][dp][d] */
	float *gq;    /* [dp] */
	float *gk;    /* [dp] */
	float *sinks; /* [n_kv][S][dp] */
	float *bias;  /* [n_kv][G] */
	float *flat;  /* owns all of the above, gate_count() floats */
};

struct gate_opts {
	uint32_t steps, batch;
	double lr, momentum;
	uint64_t seed;
};

/* Allocates and initialises (see above) the parameters of one layer. */
int gate_init(struct gate_params *p, uint32_t d, uint32_t n_kv, uint32_t G,
              uint32_t dp, uint32_t S, uint64_t seed);
void gate_free(struct gate_params *p);
size_t gate_count(const struct gate_params *p);

/*
 * Mean loss (sum over heads) of rows X [n][d] against Y [n][n_kv]; when
 * grad is not NULL ([gate_count] floats, zeroed by the caller) adds the
 * gradient of that mean.  score [n][n_kv] receives the gate outputs when
 * not NULL.
 */
double gate_loss(const struct gate_params *p, const float *X, const float *Y,
                 size_t n, float *grad, float *score);

/* Trains p on X/Y; loss_first / loss_last: mean loss of the first and the
 * last 5 % of the steps. */
int gate_train(struct gate_params *p, const float *X, const float *Y,
               size_t n, const struct gate_opts *o, double *loss_first,
               double *loss_last);

#endif
