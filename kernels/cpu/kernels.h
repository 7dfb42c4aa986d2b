/*
 * kernels.h — the CPU reference of every op the daemon and the engines run,
 * one file per op in kernels/cpu/ (op.c exports op_cpu...).  The CUDA twins
 * in kernels/cuda/ take the same arguments plus a stream and are tested
 * against these.  Dense products go to OpenBLAS (cblas_sgemm), batched over
 * tokens; loops here are for what BLAS cannot express.
 *
 * Conventions: float32 activations and weights, row-major; K/V pages are in
 * the tenant dtype, laid out as shm.h says:
 *   page = [K: page_tokens x head_dim][V: page_tokens x head_dim]
 * and entry e of a list lives in pages[e / page_tokens], row e % page_tokens.
 * Query head h reads KV head h / G (G = n_heads / n_kv_heads).
 * No op allocates unless it says so; none exits; none keeps global state.
 */
#ifndef KVT_KERNELS_H
#define KVT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h" /* the ops convert pages with dtype_to_f32 / _from_f32 */
#include "kvtrim.h"

/* ---------------------------------------------------------------- append_kv */

/*
 * Writes n entries into a list at entries [first, first + n): k and v are
 * [n][head_dim] float32, converted to dt.  Pages must exist (headroom).
 */
void append_kv_cpu(void *const *pages, uint32_t page_tokens,
                   uint32_t head_dim, enum kvt_dtype dt, uint32_t first,
                   const float *k /* [n][head_dim] */,
                   const float *v /* [n][head_dim] */, uint32_t n);

/* ---------------------------------------------------------------- attention */

/*
 * Decode attention of one query token over one (layer, KV head) list, for
 * the G query heads that read it (what an engine runs per KV head):
 *   out[g][:] = sum_i softmax_i(q[g] . k_i * scale) v_i,
 *   lse[g]    = log sum_i exp(q[g] . k_i * scale)       (natural log)
 * over entries i in [0, len).  len 0 gives out 0 and lse -INFINITY.
 * scratch holds at least len floats per query head: [G][len].
 */
void paged_attention_cpu(const float *q /* [G][head_dim] */, uint32_t G,
                         void *const *pages, uint32_t page_tokens,
                         uint32_t head_dim, enum kvt_dtype dt, uint32_t len,
                         float scale, float *out /* [G][head_dim] */,
                         float *lse /* [G] */, float *scratch);
/*
 * Its softmax, in place: the scaled logits s[n] become probabilities
 * (max subtracted, the sum in double); returns the lse (natural log;
 * -INFINITY for n 0).  Dense references call it so that they compute
 * paged_attention_cpu's arithmetic exactly.
 */
float paged_attention_softmax_cpu(float *s /* [n] */, uint32_t n);

/*
 * Attention weights of n_q staged queries against the entries of one
 * (layer, KV head) list, recomputed from the log-sum-exp the engine stored,
 * so no dense map ever existed:
 *   w[t][g][i] = exp(q[t][g] . k_i * scale - lse[t][g])  if kpos[i] <= qpos[t]
 *              = 0                                        otherwise (causal)
 * for t < n_q, g < G, i < len.  Keys are gathered to float32 in kscratch
 * ([len][head_dim]).  The logit q . k * scale is attn_dot_cpu(q, k,
 * head_dim) * scale, rounded once more: a fixed order that the device
 * selections reproduce bit for bit (they compute every list of a sync in
 * one kernel, where a GEMM library's order would not be the CPU's).
 */
/*
 * The dot product of the attention ops' fixed order: d ascending from
 * 0.0f, each product a[d] * b[d] rounded to float, then each sum rounded
 * (no fused multiply-add).  Device twins: common_dot_rn (kernels/cuda).
 */
float attn_dot_cpu(const float *a /* [n] */, const float *b /* [n] */,
                   uint32_t n);

/*
 * out[i] = k_i^T S k_i for n keys k [n][hd] and S [hd][hd] (row-major),
 * in one fixed order: for d ascending, the float (S k_i)[d] =
 * attn_dot_cpu(S row d, k_i, hd), times k_i[d] in double, added to a
 * double sum from 0.0 (each product and sum rounded, no fused
 * multiply-add).  Expected Attention's covariance term; device twins:
 * common_quad_rn (kernels/cuda/common.cuh), quad_form_cuda, the same
 * bits.
 */
void quad_form_cpu(const float *k /* [n][hd] */, uint32_t n, uint32_t hd,
                   const float *S /* [hd][hd] */, double *out /* [n] */);

void attn_band_cpu(const float *q /* [n_q][G][head_dim] */,
                   const float *lse /* [n_q][G] */,
                   const uint32_t *qpos /* [n_q] */, uint32_t n_q, uint32_t G,
                   void *const *pages, uint32_t page_tokens,
                   uint32_t head_dim, enum kvt_dtype dt,
                   const uint32_t *kpos /* [len] */, uint32_t len, float scale,
                   float *w /* [n_q][G][len] */,
                   float *kscratch /* [len][head_dim] */);

/* ---------------------------------------------------------------- scorers */

/* y = x W^T + b: x [n][d_in], W [d_out][d_in], b [d_out] (NULL = 0). */
void scorer_linear_cpu(const float *x, uint32_t n, uint32_t d_in,
                       const float *W, const float *b, uint32_t d_out,
                       float *y /* [n][d_out] */);

/*
 * y = W2 gelu(W1 x + b1) + b2 with the exact erf GELU
 * (0.5 z (1 + erf(z / sqrt 2))), as kvpress's KVzap MLP (nn.GELU()).
 * W1 [hidden][d_in], b1 [hidden], W2 [d_out][hidden], b2 [d_out];
 * hscratch [n][hidden].
 */
void scorer_mlp_cpu(const float *x, uint32_t n, uint32_t d_in,
                    const float *W1, const float *b1, uint32_t hidden,
                    const float *W2, const float *b2, uint32_t d_out,
                    float *y /* [n][d_out] */, float *hscratch);

/*
 * Fast KVzip's low-rank sink-attention gate for n tokens of one layer.
 * Parameters (layouts of the released checkpoints, KV-head-major):
 *   Wq [n_kv][G][dp][d_in], cq [n_kv][G][dp]  query projection and bias
 *   Wk [n_kv][dp][d_in]                        key projection (no bias)
 *   gq [dp], gk [dp]                           RMSNorm weights, eps 1e-6
 *   sinks [n_kv][S][dp]                        learned sink keys
 *   bias [n_kv][G]                             logit bias per query head
 * For token i, KV head g, query head (g, j):
 *   qt = rmsnorm(Wq[g][j] x_i + cq[g][j]) * gq;  kt = rmsnorm(Wk[g] x_i) * gk
 *   l  = qt . kt / sqrt(dp) + bias[g][j];  ls_s = qt . sinks[g][s] / sqrt(dp)
 *   p  = 1 / (1 + sum_s exp(ls_s - l))
 *   score[i][g] = mean_j p                   in (0, 1)
 * scratch: n * n_kv * (G + 1) * dp floats.
 */
void sink_gate_cpu(const float *x /* [n][d_in] */, uint32_t n, uint32_t d_in,
                   uint32_t n_kv, uint32_t G, uint32_t dp, uint32_t S,
                   const float *Wq, const float *cq, const float *Wk,
                   const float *gq, const float *gk, const float *sinks,
                   const float *bias, float *score /* [n][n_kv] */,
                   float *scratch);

/* ---------------------------------------------------------------- selection */

/*
 * Marks the entries to drop so that at most k of n remain: keeps the k
 * highest scores.  Ties are broken towards keeping the higher rank[] value
 * (callers pass original positions, so the more recent entry wins); NaN
 * scores rank below everything.  Only entries with protect[i] == 0 are
 * candidates (protect may be NULL); protected entries are never dropped and
 * do not count against k.  drop[] is written for every i (0 or 1).  Linear
 * expected time (quickselect on a copy in scratch [n] of the candidates).
 * Returns the number marked.
 */
uint32_t select_topk_cpu(const float *score /* [n] */,
                         const uint32_t *rank /* [n] */,
                         const uint8_t *protect /* [n] or NULL */, uint32_t n,
                         uint32_t k, uint8_t *drop /* [n] */,
                         uint32_t *scratch /* [n] */);

/*
 * Marks unprotected entries with score < tau (or NaN) for dropping.
 * Returns the number marked; drop[] written for every i.
 */
uint32_t select_threshold_cpu(const float *score /* [n] */,
                              const uint8_t *protect /* [n] or NULL */,
                              uint32_t n, float tau, uint8_t *drop /* [n] */);

#endif
