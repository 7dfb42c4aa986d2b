/*
 * context.h — the machinery of protocol 1 of kvtrim-eval, context compression
 * (docs/eval.md describes the protocol and its choices): an in-process KV
 * cache whose lists the kept entries of a policy are loaded into, the
 * full-cache reference of one window, and one policy's run on a window
 * (through kvtrimd, or from keep flags computed in process).
 *
 * The cache keeps float32 K and V rows per (layer, KV head), post-RoPE, in
 * no particular order; a step appends the new rows after each list's len
 * entries and attends with BLAS (causal, softmax in float, sums in
 * double), so the same call on the same rows gives the same bits and a
 * policy that keeps every entry reproduces the reference exactly (KL 0).
 * A tap records a step's x, q and lse and a reduction of its attention
 * onto the first ncols entries of every list (the KVzip and hindsight
 * oracles).  Errors are negative KVT_E* codes; ctx_load_daemon also writes
 * a reason.
 */
#ifndef KVT_EVAL_CONTEXT_H
#define KVT_EVAL_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "../common/eval.h"
#include "model.h"

struct ctx_cache;

/* What one step records (pointers NULL: not recorded). */
struct ctx_tap {
	float *x;    /* [L][n][dim] attention inputs of the n new tokens */
	float *q;    /* [L][n][n_heads][hd] post-RoPE queries */
	float *lse;  /* [L][n][n_heads] */
	/* red[l][g][i], i < ncols: over the step's rows r in [r0, r1), the
	 * max (max = 1) or the sum (max = 0) of a^h_{r,i}, then the max over
	 * the query heads h of KV head g.  Set by the step (not accumulated
	 * across steps). */
	uint32_t r0, r1, ncols;
	int max;
	float *red;  /* [L][n_kv][ncols] */
};

/* A cache of cap entries per list for model m; KVT_ENOMEM. */
int ctx_cache_open(const struct model *m, uint32_t cap, struct ctx_cache **out);
void ctx_cache_close(struct ctx_cache *c);

/* Every list to its first n entries (0: empty).  The first n rows are the
 * first n appended only while nothing was evicted. */
void ctx_cache_truncate(struct ctx_cache *c, uint32_t n);

/* Rows of list (layer, kv_head): K [cap][hd], V [cap][hd]; *len is its
 * length (writable: a caller that filled rows sets it, <= cap). */
float *ctx_cache_k(struct ctx_cache *c, uint32_t layer, uint32_t kv_head);
float *ctx_cache_v(struct ctx_cache *c, uint32_t layer, uint32_t kv_head);
uint32_t *ctx_cache_len(struct ctx_cache *c, uint32_t layer, uint32_t kv_head);

/* Entries over all lists. */
uint64_t ctx_cache_kept(const struct ctx_cache *c);

/* n tokens at positions pos0.. (tap may be NULL); logits [n][vocab] may
 * be NULL.  KVT_ETOOLONG when a list would exceed cap. */
int ctx_cache_step(struct ctx_cache *c, const int32_t *tok, uint32_t n,
                   uint32_t pos0, const struct ctx_tap *tap, float *logits);

/* ------------------------------------------------------------ a window */

/*
 * The full-cache reference of one window tok[0, T): context [0, P), the
 * continuation [P, T).  Built by ctx_window_build:
 *   1. prefill of the context in one step (x, q, lse recorded for the
 *      daemon's staging ring; the cache then holds its P entries);
 *   2. when sep is given, KVzip's reconstruction: sep then the context
 *      again as one step on that cache; kvzip[l][g][i] = max over the
 *      queries of sep and the copy and the group's heads of a_{j,i}
 *      (oracle.h's KVzip score, the pretext ctx sep ctx; no BOS: the
 *      model has none);
 *      the cache is cut back to the context afterwards;
 *   3. the continuation tok[P, T-1) as one step: ref = its logits, the
 *      predictions of tok[P+1, T); hind[l][g][i] = max over the group's
 *      heads of the attention entry i receives from those queries (the
 *      hindsight oracle's score); cut back to the context again.
 */
struct ctx_window {
	const int32_t *tok; /* [T] */
	uint32_t P, T;
	struct ctx_cache *full; /* the P context entries, arrival order */
	float *x, *q, *lse;     /* prefill records, ctx_tap layout, n = P */
	float *ref;             /* [T-1-P][vocab] */
	float *kvzip;           /* [L][n_kv][P], NULL without sep */
	float *hind;            /* [L][n_kv][P] */
};

int ctx_window_build(const struct model *m, const int32_t *tok, uint32_t P,
                     uint32_t T, const int32_t *sep, uint32_t n_sep,
                     struct ctx_window *w);
void ctx_window_free(struct ctx_window *w);

/* ------------------------------------------------------------ a run */

/* One run's comparison with the reference over the T-1-P predictions. */
struct ctx_score {
	double kl, top1, dnll; /* sums over the predictions */
	uint64_t npos;
	uint64_t kept;         /* entries kept of the P L n_kv */
};

/*
 * Through kvtrimd: registers tenant `tenant` with policy `spec` on the
 * runtime directory rt (NULL: libkvtrim's default), appends the window's
 * P context entries (K/V rows of w->full) with their staged x, q, lse,
 * syncs them as one prefill sync and then a decode sync of no new entry
 * (prompt-only policies such as snapkv decide at the first decode sync),
 * reads every list back (kvt_list_get, kvt_page_ptr) into c and
 * disconnects.  Reason in err.
 */
int ctx_load_daemon(const struct model *m, const struct ctx_window *w,
                    const char *rt, const char *tenant, const char *spec,
                    struct ctx_cache *c, char *err, size_t errlen);

/* The context entries of w with keep[l][g][i] set, in position order,
 * into c. */
void ctx_load_keep(const struct model *m, const struct ctx_window *w,
                   const uint8_t *keep /* [L][n_kv][P] */,
                   struct ctx_cache *c);

/* Keep flags at ratio R: kvzip = one top-k over all lists of the KVzip
 * scores, the first KVZIP_SINKS positions protected (KVzip's pair level);
 * oracle = per list top-k of the hindsight scores, P - floor(R P) each. */
int ctx_keep_kvzip(const struct model *m, const struct ctx_window *w,
                   double R, uint8_t *keep);
int ctx_keep_oracle(const struct model *m, const struct ctx_window *w,
                    double R, uint8_t *keep);

/* The continuation on c (loaded with a policy's context entries):
 * predictions compared with w->ref into s.  lg [T-1-P][vocab] scratch. */
int ctx_continue(const struct model *m, const struct ctx_window *w,
                 struct ctx_cache *c, float *lg, struct ctx_score *s);

/* ------------------------------------------------------------ the program */

#define CTX_CAL 8u /* kvzap's calibration windows (--quick: 2) */
/* kvzap's protected first positions: kvpress KVzapPress n_sink = 4 (the
 * spec's default is 0, as the paper's DMSPress; without them the scorer's
 * low log-KVzip+ for the first token, whose value vector is small, drops
 * the attention sink in the early layers) */
#define CTX_KVZAP_SINKS 4u

struct tok;
/* kvtrim-eval --model M for a model with a tokenizer: protocol 1, then
 * its tasks (tasks.h); --dump-kept and --calibrate instead when given. */
int context_main(const struct model *M, const struct eval_opts *a);

/* calibration.c */
/* Both protocols' windows and targets: the evaluation split's windows of
 * T tokens (a->nseq of them, else def; fewer where the split holds fewer,
 * said on stderr) into ev, the target ratios (--quick: 0.75, else 0.5,
 * 0.75, 0.875) in *ratios, their count returned. */
uint32_t ctx_windows(const struct model *M, const struct tok *tk,
                     const struct eval_opts *a, uint32_t T, uint32_t def,
                     struct dataset *ev, const double **ratios);
/* kvzap's calibration: ncal windows of P tokens of the training split
 * (train-man.txt) through the full-cache forward; the scores [ncal][L]
 * [n_kv][P] of the scorers a->wabs/kvzap-linear and a->wabs/kvzap-mlp in
 * zs[0], zs[1] (NULL where one is missing, reason on stderr; both where
 * there are no weights: said on stderr), *nout windows.  gs, when not
 * NULL, receives Fast KVzip's gate scores of the same windows likewise
 * (a->wabs/fastkvzip.safetensors; NULL where it is missing). */
void ctx_calibrate(const struct model *M, const struct tok *t,
                   const struct eval_opts *a, uint32_t P, uint32_t ncal,
                   float *zs[2], float **gs, uint32_t *nout);
/* --calibrate: kvzap's thresholds for 0.5 / 0.75 / 0.875 from the
 * calibration of contexts of P tokens, as "scorer target threshold"
 * lines in OUT/calibration.txt (what weights/<model>/calibration.txt
 * ships for the demo and the bench). */
int ctx_write_calibration(const struct model *M, const struct tok *tk,
                          const struct eval_opts *a, uint32_t P);

/* fastkvzip_gate.c */
/* Fast KVzip's gate (the fastkvzip.safetensors at path, the daemon's
 * kernel) for sequences of up to T rows per call; reason in err. */
struct fastkvzip_gate;
int fastkvzip_gate_open(const struct model *M, const char *path, uint32_t T,
                        struct fastkvzip_gate **out, char *err,
                        size_t errlen);
/* Scores of the attention inputs xs [L][T][d_model]: out [L][n_kv][T]. */
void fastkvzip_gate_score(struct fastkvzip_gate *f, const float *xs,
                          uint32_t T, float *out);
void fastkvzip_gate_close(struct fastkvzip_gate *f);

/* quality_md.c */
/* Protocol 1's quality.md of model's rows; what (a line) says how the run
 * was made (windows, lengths, time). */
void context_write_md(const char *dir, const struct row *rows, size_t nr,
                      const char *model, const char *what);

/* dump_kept.c */
/* --dump-kept: protocol 1's windows ev (P context + T - P tokens each),
 * run by the parity's policies, written to a->dump (docs/eval.md
 * has the files); frees ev and tk. */
int dump_kept_main(const struct model *M, const struct eval_opts *a,
                   struct tok *tk, struct dataset *ev, const int32_t *sep,
                   uint32_t nsep, uint32_t P, uint32_t T);

#endif
