/*
 * policy.h — eviction policies: a small vtable plus the machinery every
 * policy shares (spec parsing, sinks, recent window, budgets, pressure,
 * timing, selection, attention from staged queries, scratch memory).
 * docs/policies.md states every policy's exact rule and every spec key.
 *
 * Spec string: "name" or "name:key=value,key=value", parsed once here for
 * every policy (each says which keys it accepts).  Unknown keys, repeated
 * keys, malformed numbers, out-of-range values and weight files that do not
 * fit the model geometry are refused with KVT_EPOLICY and a reason
 * (policy_create loads weights, never the first sync).  Decisions are per
 * (sequence, layer), all KV heads at once (struct policy_layer); decide()'s
 * contract is at struct policy_ops.
 */
#ifndef KVT_POLICY_H
#define KVT_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kvtrim.h"

/* What decide() needs (bit set). */
enum policy_need {
	POLICY_NEED_X = 1u << 0,   /* staged attention input x */
	POLICY_NEED_Q = 1u << 1,   /* staged post-RoPE queries */
	POLICY_NEED_LSE = 1u << 2, /* staged log-sum-exp per query head */
	POLICY_NEED_KV = 1u << 3,  /* the K/V pages of each list */
	POLICY_NEED_V = 1u << 4,   /* with KV: it reads the V halves too (a
	                              device tenant then stages whole pages
	                              to the host, not their K halves) */
};
#define POLICY_NEED_STAGED (POLICY_NEED_X | POLICY_NEED_Q | POLICY_NEED_LSE)

/* Which keys a policy accepts (bit set). */
enum policy_key {
	POLICY_KEY_SINKS = 1u << 0,
	POLICY_KEY_WINDOW = 1u << 1,
	POLICY_KEY_TOKENS = 1u << 2,
	POLICY_KEY_RATIO = 1u << 3,
	POLICY_KEY_THRESHOLD = 1u << 4,
	POLICY_KEY_EVERY = 1u << 5,
	POLICY_KEY_DELAY = 1u << 6,
	POLICY_KEY_SEED = 1u << 7,
	POLICY_KEY_MODEL = 1u << 8,
	POLICY_KEY_AGG = 1u << 9,
	POLICY_KEY_KERNEL = 1u << 10,
	POLICY_KEY_BETA = 1u << 11,
	POLICY_KEY_FUTURE = 1u << 12,
	POLICY_KEY_THETA = 1u << 13,
	POLICY_KEY_COV = 1u << 14,
	POLICY_KEY_VNORM = 1u << 15,
	POLICY_KEY_EPS = 1u << 16,
	POLICY_KEY_MEMORY = 1u << 17,
	POLICY_KEY_TRUST = 1u << 18,
};

/* How an attention policy folds a KV head's group into one score: the
 * mean or the max of the accumulated S[j], or (observed_attention) the
 * mean of S[j] / (n_seen - pos), the attention averaged over the queries
 * that could see the entry, as kvpress's ObservedAttentionPress. */
enum policy_agg {
	POLICY_AGG_MEAN = 0,
	POLICY_AGG_MAX = 1,
	POLICY_AGG_OBSERVED = 2,
};

/* How pressure raises a threshold (see policy_threshold). */
enum policy_tau {
	POLICY_TAU_NONE = 0, /* the policy has no threshold */
	POLICY_TAU_LOG,      /* log-space score: tau + 2 * level */
	POLICY_TAU_PROB,     /* probability: tau + (1 - tau) * level / 2 */
};

/* kvpop's default window for a budget of `tokens` a list: min(48,
 * floor(2 tokens / 5)) (policies/kvpop.c; kvtrim-eval names it in its
 * specs). */
uint32_t policy_kvpop_window(uint32_t tokens);

/* memory=learned: kvpop's memory with the decay and readout of its
 * weights (policies/kvpop.c). */
#define POLICY_MEMORY_LEARNED UINT32_MAX

struct policy_args {
	uint32_t sinks, window, tokens, every, delay, kernel;
	uint32_t beta, future;
	uint32_t memory, trust; /* kvpop's memory: decay tokens (or
	                           POLICY_MEMORY_LEARNED), weight */
	double ratio;
	double theta, eps;
	uint8_t cov, vnorm; /* 0 or 1 */
	float threshold;
	uint64_t seed;
	enum policy_agg agg;
	char model[KVT_SPEC_MAX]; /* "" when not given */
	/* enum policy_key bits given in the spec; init() adds the RATIO or
	 * THRESHOLD bit of a budget it defaults (a defaulted tokens budget
	 * shows as tokens != 0 only). */
	unsigned set;
};

/* The model geometry a policy instance works with (fixed at creation). */
struct policy_geom {
	uint32_t n_layers, n_heads, n_kv_heads, head_dim, d_model;
	uint32_t page_tokens;
	enum kvt_dtype dtype;
	uint32_t headroom; /* most new entries per sync */
};

/* One KV head's list as decide() sees it. */
struct policy_head {
	const uint32_t *pos; /* [len] original positions, list order */
	float *ent;          /* [len][entry_floats] per-entry state (writable
	                        scratch; NULL when entry_floats is 0) */
	void *const *pages;  /* [ceil(len / page_tokens)] page bases, each
	                        [K: page_tokens x head_dim][V: ...] in dtype;
	                        NULL unless ops->needs has POLICY_NEED_KV */
	uint32_t len;        /* entries, the n_new new ones included */
	uint8_t *drop;       /* [len] zeroed; decide() marks 1 = evict */
};

/* One (sequence, layer) decision. */
struct policy_layer {
	uint32_t layer;
	enum kvt_phase phase;
	uint32_t n_new;  /* new tokens, positions [n_seen - n_new, n_seen) */
	uint32_t n_seen; /* tokens of this (sequence, layer), new included */
	/* Staged inputs of the new tokens, contiguous; NULL unless needed. */
	const float *x;   /* [n_new][d_model] */
	const float *q;   /* [n_new][n_heads][head_dim] */
	const float *lse; /* [n_new][n_heads] */
	/*
	 * Earlier staged rows, for policies with lookback > 0: the ring entry
	 * [x: d_model][q: n_heads * head_dim][lse: n_heads] of position pos,
	 * or NULL when the ring no longer (or not yet) holds it.  The tenant
	 * guarantees positions [n_seen - n_new - lookback, n_seen).
	 */
	const float *(*staged)(void *ctx, uint32_t pos);
	void *staged_ctx;
	struct policy_head *heads; /* [n_kv_heads] */
	void *state; /* [layer_state_bytes] writable scratch, zeroed at open */
	/*
	 * The new entries' scores, [n_new][n_kv_heads], when the tenant had
	 * them computed elsewhere, on the device that holds the inputs: the
	 * policy's scorer of x (ops->scorer; x is then NULL) or its keys'
	 * norms (ops->new_key_norms; pages NULL).  decide() uses these
	 * instead of scoring.  NULL otherwise.  For a policy that reads x,
	 * policy_decide refuses non-finite ones (a non-finite or
	 * never-staged x scores NaN or +-Inf), as it would refuse such an x.
	 */
	const float *pre;
};

struct policy;

/*
 * Where a (sequence, layer)'s end-of-prefill rule plans its device jobs
 * (struct policy_prompt_rule's plan): its lists hold the prompt, entry i
 * at position i (the tenant checked), and the device rule reads its rows
 * in device staging.
 */
struct policy_prompt_at {
	const float *ring;      /* device: the ring of the (sequence, layer) */
	uint32_t stage_tokens;  /* its rows: position p in row
	                           p % stage_tokens */
	uint32_t record;        /* list record of KV head 0; head h's is
	                           record + h */
	uint32_t P, n_new;      /* the prompt (entries of each list before the
	                           sync), new tokens of the sync */
	uint32_t drop_off;      /* where the first drop index of its jobs
	                           goes (they take the ones after in order) */
};

/* What the tenant reads back of one job of an end-of-prefill rule: the
 * KV head whose list it decides (its drop indices mark that head), the
 * drops the rule makes (the device's count is checked against it) and
 * where their indices go; head UINT32_MAX: a job that only has rows
 * checked. */
struct policy_prompt_job {
	uint32_t head, n_drop, drop_off;
};

/*
 * A policy's end-of-prefill rule as a device runs it (policy_ops.prompt):
 * the device rule of that name (backend.h's struct kvt_backend_rule, its
 * params and jobs in policies/<name>_rule.h, whose layout version and
 * sizes the tenant checks against the backend's) and how the policy fills
 * them, so that the tenant names no policy.
 */
struct policy_prompt_rule {
	const char *name;
	uint32_t version, params_bytes, job_bytes;
	/* The rule's params (struct <name>_rule) for device staging laid
	 * out as rows. */
	void (*params)(const struct policy *p,
	               const struct kvt_backend_rows *rows, void *params);
	/* At a sync where the policy decides (decides() 1) and every list
	 * of l's (sequence, layer) holds at->P entries at their indices:
	 * marks the decision made in l->state as decide() would; with at,
	 * writes the jobs that do its decision into jobs (room for
	 * geom.n_kv_heads) and what the tenant reads back of each into led,
	 * and returns their number: jobs that select (the prompt is
	 * compressed), or one that only checks the rows decide() would read
	 * (it keeps all); 0 when decide() must run on the host (the ring no
	 * longer holds the rows it reads).  at NULL: only marks the
	 * decision (the device decided it). */
	uint32_t (*plan)(struct policy *p, struct policy_layer *l,
	                 const struct policy_prompt_at *at, void *jobs,
	                 struct policy_prompt_job *led);
};

/*
 * A policy's rule run on a device where the keys, the staged queries and
 * its entry states are (policy_ops.device): the policy plans each
 * (sequence, layer)'s jobs and fills the params, the backend's rule of
 * the same name (backend.h's struct kvt_backend_rule; its params, jobs and
 * layout version in policies/<name>_rule.h) runs a whole sync of them.
 * The tenant keeps the device memory, the checks and the commit, and
 * knows no rule: what it needs is below.
 *
 * The state lives in records of two halves: a job reads its record's half
 * `cur` and writes the other, and the sync's commit flips the halves of
 * its jobs' records, so a refused sync leaves no trace.  Records are
 * numbered (sequence slot, layer) major, `records` of them per (slot,
 * layer); a rule with n_kv_heads of them a layer has the lists' own
 * numbering (state_rec == list_rec below).
 */

/* The device memory a rule's state takes (shape). */
struct policy_dev_shape {
	uint32_t records;     /* state records per (sequence slot, layer) */
	size_t record_bytes;  /* one record, both halves */
	size_t layer_bytes;   /* a device buffer per (sequence slot, layer)
	                         besides, kept across syncs and copied at a
	                         fork (0: none) */
	/* 1: the state holds the positions of the lists' entries, [cap]
	 * uint32 at the start of a list's block in each record half
	 * (records == n_kv_heads: list g's in record g; records == 1: list
	 * g's at g * list_bytes into the half, or one array for every list
	 * of the layer when list_bytes is 0), in the lists' order.  Then the
	 * tenant keeps no host copy of them (a sync touches no list's
	 * positions on the host) and reads them back where it needs them:
	 * a plan's policy_dev_pos, a refused layer, a check. */
	int positions;
	size_t list_bytes;
};

/* What a rule's params are made of at a run (params). */
struct policy_dev_bufs {
	void *state;        /* device: [max_seqs * n_layers * records]
	                       records of record_bytes */
	void *layers;       /* device: [max_seqs * n_layers] buffers of
	                       layer_bytes, slot major; NULL without */
	const void *consts; /* device: what upload copied; NULL without */
	uint32_t cap;       /* entries per half (the tenant's max_tokens) */
	struct kvt_backend_rows rows; /* device staging's layout */
};

/* One (sequence, layer) of a sync as a rule's plan sees it (with its
 * policy_layer: layer, phase, n_new, n_seen). */
struct policy_dev_layer {
	const float *ring;          /* its rows in device staging (NULL
	                               for a policy that reads no staged
	                               rows: the tenant has none) */
	const uint32_t *len;        /* [n_kv_heads] each list's entries
	                               before the sync */
	const uint32_t *const *pos; /* [n_kv_heads] their positions; NULL
	                               where they live on the device only
	                               (read through policy_dev_pos) */
	/* head h's [len[h]] positions read back from the device, where pos
	 * is NULL: into host memory that stays valid through the plan;
	 * NULL when the read failed */
	const uint32_t *(*fetch_pos)(void *ctx, uint32_t h);
	void *fetch_ctx;
	uint32_t list_rec;          /* KV head 0's list record (head g's:
	                               + g), as the keys are read */
	uint32_t state_rec;         /* its first state record */
	const uint8_t *cur;         /* [records] the half each of its state
	                               records is in */
	uint32_t *word;             /* the plan's own word of the (slot,
	                               layer), kept across syncs, copied at a
	                               fork; 0 at registration */
	uint32_t drop_off;          /* where its first drop index goes */
	const float *pre;           /* device: the new entries' scores
	                               [n_new][n_kv_heads], as the policy's
	                               scorer wrote them on the device (a
	                               rule with takes_pre); NULL otherwise */
};

/* Head h's positions before the sync for a plan that cannot count from
 * the numbers alone (a protected tail that moved back): a read back from
 * the device where the tenant keeps no host copy, so a plan calls it
 * only then.  NULL when that read failed. */
static inline const uint32_t *policy_dev_pos(const struct policy_dev_layer *c,
                                             uint32_t h)
{
	return c->pos ? c->pos[h] : c->fetch_pos(c->fetch_ctx, h);
}

/* A job as the tenant checks and applies it: the state record whose
 * halves the commit flips, the KV head whose list it decides
 * (POLICY_DEV_ALL: every list of the layer the same), its entries with
 * the new ones, its drops (the host's count: the device's must equal it;
 * with the rule's drop_bound, the most it may drop: the device's count,
 * at most n_drop, is then taken, and a larger one refused) and where
 * their indices go in the output words (n_drop words are kept for
 * them). */
struct policy_dev_job {
	uint32_t rec, g, L, n_drop, drop_off;
};
#define POLICY_DEV_ALL UINT32_MAX
/* g of a job that decides every list of the layer at once with drops of
 * its own each (fastkvzip's layer-wide top-k): L counts the lists' entries
 * laid end to end in KV head order (the new ones included), its drop
 * indices index that concatenation, and the tenant splits them by list. */
#define POLICY_DEV_LAYER (UINT32_MAX - 1)

struct policy_device_rule {
	const char *name;   /* the backend's rule it runs on */
	uint32_t version, params_bytes, job_bytes; /* its header's layout,
	                                              checked against the
	                                              backend's */
	/* The device memory of p's state for cap entries a list. */
	void (*shape)(const struct policy *p, uint32_t cap,
	              struct policy_dev_shape *s);
	/* (optional) p's tensors in the rule's layout, copied to a new
	 * device buffer *out (o's mem_new and copy; the caller frees it with
	 * mem_free), at registration and on a weights reload; 0, or an error
	 * with the reason and nothing allocated. */
	int (*upload)(const struct policy *p, const struct kvt_backend_ops *o,
	              void *bctx, void **out, char *err, size_t errlen);
	/* The jobs of one (sequence, layer), at most n_kv_heads: the
	 * rule's at jobs (job_bytes each) and the tenant's view of each at
	 * hj, their drop offsets from c->drop_off on, in order; *n of them
	 * (0: nothing changes).  0, or an error with the reason (a broken
	 * invariant of the lists). */
	int (*plan)(const struct policy *p, const struct policy_layer *l,
	            const struct policy_dev_layer *c, void *jobs,
	            struct policy_dev_job *hj, uint32_t *n, char *err,
	            size_t errlen);
	/* The rule's params (params_bytes at out) for a run over b. */
	void (*params)(const struct policy *p, const struct policy_dev_bufs *b,
	               void *out);
	/* (optional) 0 when p's instance cannot run on the rule (its
	 * decisions then stay on the host: fastkvzip with a threshold, or
	 * more KV heads than its jobs hold); NULL: every instance can. */
	int (*supports)(const struct policy *p);
	/* 1: the plan reads policy_dev_layer.pre, the new entries' scores
	 * as the policy's scorer (ops->scorer) wrote them on the device; a
	 * tenant without a device scorer leaves the decisions to the host. */
	int takes_pre;
	/* 1: a job's n_drop is an upper bound, for a rule whose drops the
	 * host cannot count from the positions alone (a threshold on a
	 * score that lives on the device); the tenant takes the device's
	 * count when it is at most n_drop and refuses the sync otherwise. */
	int drop_bound;
};

/* The programs of kvtrim-eval (tools/eval/, docs/eval.md) that sweep a
 * policy over target ratios (bit set).  Protocol 2 runs only policies
 * that decide at every sync (a prompt-only one cannot reach its ratios);
 * the byte models' tables keep the five policies they were made with. */
enum policy_eval_in {
	POLICY_EVAL_BYTES = 1u << 0,    /* the byte and token-id models */
	POLICY_EVAL_CONTEXT = 1u << 1,  /* protocol 1: context compression */
	POLICY_EVAL_DECODING = 1u << 2, /* protocol 2: decoding-time */
};

/* How kvtrim-eval sweeps a policy over its target ratios. */
struct policy_eval {
	/* the spec with one %s where the budget goes ("ratio=R" or
	 * "tokens=B": every policy here takes both); NULL: the evaluation
	 * makes the policy's jobs itself (full; the learned policies, whose
	 * weights and thresholds come from the run) */
	const char *spec;
	unsigned in; /* enum policy_eval_in bits: the programs that run it */
};

struct policy_ops {
	const char *name;
	const char *help;  /* one line for --list-policies */
	unsigned needs;    /* enum policy_need bits */
	unsigned keys;     /* enum policy_key bits accepted */
	enum policy_tau tau;
	/* Validates args, applies defaults, loads weights, sets
	 * entry_floats / layer_state_bytes / lookback.  (optional) */
	int (*init)(struct policy *p, char *err, size_t errlen);
	void (*fini)(struct policy *p); /* frees priv (optional) */
	/* decide(): the tenant hands it each head's list (positions, pages,
	 * per-entry state), the staged inputs of the n_new new tokens gathered
	 * contiguous, and the layer's state blob; it marks drops.
	 * - The new entries are the last n_new of every head's list, at
	 *   positions [n_seen - n_new, n_seen); their ent rows arrive zeroed.
	 * - It may rewrite ent rows and the layer state (the tenant passes
	 *   scratch copies and commits them only when the whole sync succeeds,
	 *   so a refused sync leaves no trace), and marks drop[i] = 1 (drop[]
	 *   arrives zeroed). It returns 0 or a negative KVT_E* (KVT_ENOMEM).
	 * - Its result is a pure function of the policy (args, weights,
	 *   pressure), the inputs and the states: tests and loadgen replay it.
	 *   The scratch arena (policy_scratch) carries nothing across calls.
	 * - Staged lse is the natural-log log-sum-exp of each query head's
	 *   logits q . k / sqrt(head_dim) over the keys the engine attended to
	 *   (its own list at the time, causal); attention weights are
	 *   recovered from it.
	 * - Its inputs are checked: policy_decide calls decide() only when
	 *   every staged input the policy reads (ops->needs) of every new
	 *   token is finite and was staged (see POLICY_UNSTAGED); else it
	 *   refuses with KVT_EINVAL and p->why, and nothing was decided.
	 */
	int (*decide)(struct policy *p, struct policy_layer *l);
	/* (optional) The policy's per-entry scorer of the new tokens' x, as
	 * a device can run it (backend.h's struct kvt_backend_scorer, d_out
	 * = n_kv_heads: the scores decide() takes as policy_layer.pre):
	 * fills the kind and sizes of *out (not n_layers or w) and the
	 * KVT_SCORER_TENSORS host pointers of layer's weights in w, which
	 * the policy owns. */
	void (*scorer)(const struct policy *p, uint32_t layer,
	               struct kvt_backend_scorer *out, const float **w);
	/* (optional) 0 when decide() reads nothing and changes nothing at
	 * this sync: l's layer, phase, n_new, n_seen and state are set,
	 * heads and inputs not yet.  The tenant then stages nothing for it
	 * (no keys, no staged rows: on a device tenant nothing crosses),
	 * and policy_decide neither checks the inputs nor calls decide().
	 * NULL: it decides at every sync.  The prompt-only policies
	 * (snapkv, pyramidkv, expected_attention) decide once per
	 * (sequence, layer), at the first decode sync. */
	int (*decides)(const struct policy *p, const struct policy_layer *l);
	/* (optional) For a policy whose decision is an end-of-prefill rule
	 * a device can run where the keys and queries are (snapkv and
	 * pyramidkv: the device rule "snapkv"; expected_attention:
	 * "expected_attention"): the rule and its planner. */
	const struct policy_prompt_rule *prompt;
	/* (optional) The policy's rule a device may run where the keys,
	 * queries, scores and entry states are, at every sync
	 * (policy_device_rule; h2o, observed_attention, tova, kvpop, kvzap,
	 * fastkvzip). */
	const struct policy_device_rule *device;
	/* 1: of the pages, decide() reads only the L2 norms of the new
	 * entries' keys (knorm), which a device tenant may compute where the
	 * keys are and pass as policy_layer.pre ([n_new][n_kv_heads] norms;
	 * pages NULL). */
	int new_key_norms;
	/* How kvtrim-eval sweeps the policy (policy_eval). */
	struct policy_eval eval;
};

struct policy_block; /* scratch arena block (policy.c) */

struct policy {
	const struct policy_ops *ops;
	struct policy_args args;
	struct policy_geom geom;
	char spec[KVT_SPEC_MAX]; /* as given */
	/* Set by init() from args and geometry: */
	uint32_t entry_floats;    /* floats of state per entry */
	size_t layer_state_bytes; /* state per (sequence, layer) */
	uint32_t lookback;        /* earlier staged rows decide() reads */
	float pressure;           /* 0..1, policy_set_pressure */
	void *priv;               /* the policy's own data (weights) */
	/* Scratch arena, reset at every decide(). */
	struct policy_block *blocks;
	size_t scratch_used, scratch_peak;
	/* Why the last policy_decide refused its inputs ("" otherwise). */
	char why[KVT_ERRTEXT_MAX];
};

/*
 * Parses spec for geom; *out is heap-allocated (policy_free).  KVT_EPOLICY
 * with a reason for a bad spec or bad weights; KVT_ENOMEM.
 */
int policy_create(const char *spec, const struct policy_geom *geom,
                  struct policy **out, char *err, size_t errlen);
void policy_free(struct policy *p); /* NULL-safe */

/*
 * Memory pressure, level in [0, 1] (clamped; NaN = 0).  0 = as configured.
 * Budgets shrink to B - floor(B * level / 2) (half at level 1, never below
 * 1); thresholds rise per ops->tau (see policy_threshold).  Policies with
 * neither ignore it.  Decisions already made stay made.
 */
void policy_set_pressure(struct policy *p, float level);

/*
 * Staged inputs that are not numbers are refused, never scored: a NaN or an
 * infinity in x, q or lse would rank its entries at random (a NaN score
 * ranks lowest, an infinite one highest) and silently change what is kept.
 * Rows the engine never staged are refused likewise: the tenant writes
 * POLICY_UNSTAGED (a quiet NaN whose payload says "never staged") into x[0],
 * the first element of every query head's q and every lse of the ring rows
 * of the positions a sequence may append next, at open and after every
 * sync, so a row the engine skipped still holds it when its sync comes
 * (stage_tokens >= headroom + lookback keeps the rows a policy looks back
 * at out of reach).
 */
#define POLICY_UNSTAGED_BITS 0x7fc57a6eu
float policy_unstaged(void); /* the float with POLICY_UNSTAGED_BITS */

/* 1 when decide() may read its inputs or change state at this sync
 * (ops->decides; always without it). */
int policy_decides(const struct policy *p, const struct policy_layer *l);

/*
 * Runs decide() on one (sequence, layer); 0 or a negative KVT_E*.  Nothing
 * at a sync where the policy does not decide (policy_decides).  First
 * checks every input the policy reads (ops->needs) of the n_new new tokens:
 * a non-finite or never-staged float gives KVT_EINVAL with p->why naming
 * the layer, the position, the input (x element, or q / lse of a query
 * head) and what was wrong, and decide() does not run.
 */
int policy_decide(struct policy *p, struct policy_layer *l);

/*
 * The same check for one ring row of position pos (the staged parts the
 * policy reads: policy_row_q / policy_row_lse), for policies reading
 * earlier rows (lookback): 0, or KVT_EINVAL with p->why.
 */
int policy_check_row(struct policy *p, uint32_t layer, uint32_t pos,
                     const float *row);

/*
 * A staged row holds only the inputs the policy reads (ipc/shm.h's
 * staging layout, from policy_inputs_of(needs)): its q and lse parts.
 * Only for a policy that reads them.
 */
const float *policy_row_q(const struct policy *p, const float *row);
const float *policy_row_lse(const struct policy *p, const float *row);

/* The KVT_INPUT_* bits (kvtrim.h) of a policy's needs. */
uint32_t policy_inputs_of(unsigned needs);

/* Registry, in listing order. */
size_t policy_count(void);
const struct policy_ops *policy_at(size_t i);

/* ---- shared machinery for decide() implementations */

/* 1 when pos is protected by the sinks or the recent window after n_seen
 * tokens (the window covers [n_seen - window, n_seen)). */
int policy_protected(const struct policy_args *a, uint32_t pos,
                     uint32_t n_seen);

/* Budget out of n tokens seen, pressure applied (UINT32_MAX = none). */
uint32_t policy_budget(const struct policy *p, uint32_t n);

/* The configured budget without pressure (UINT32_MAX = none). */
uint32_t policy_budget_args(const struct policy_args *a, uint32_t n);

/* Pressure applied to a budget b a policy computed itself:
 * b - floor(b * level / 2) (UINT32_MAX stays). */
uint32_t policy_press(const struct policy *p, uint32_t b);

/* Threshold with pressure applied: LOG tau + 2 level; PROB
 * tau + (1 - tau) level / 2. */
float policy_threshold(const struct policy *p);

/* 1 when evictions are due at this sync: always without every=N, else
 * when floor(n_seen / N) > floor((n_seen - n_new) / N). */
int policy_due(const struct policy *p, const struct policy_layer *l);

/*
 * Scratch memory for the current decide(): 64-byte aligned, valid until it
 * returns; NULL when out of memory.  Never carries data across calls.
 */
void *policy_scratch(struct policy *p, size_t bytes);

/*
 * Marks drops in one head from per-entry scores (higher = keep):
 * protected entries (sinks, recent window, and protect[i] != 0 when
 * protect is not NULL) are never dropped.  With a token/ratio budget B
 * (counted over the n_seen tokens) the best max(0, B - protected) others
 * are kept (ties keep the more recent position; NaN ranks lowest); with a
 * threshold, others scoring below it (or NaN) are dropped.  Returns the
 * number marked or KVT_ENOMEM.
 */
int policy_select(struct policy *p, const struct policy_layer *l,
                  struct policy_head *h, const float *score /* [len] */,
                  const uint8_t *protect /* [len] or NULL */);

/* policy_select with the head's own token budget b (UINT32_MAX: none)
 * in place of policy_budget's, for a policy that shares a budget out
 * unevenly (kvpop); a threshold policy's threshold still applies. */
int policy_select_budget(struct policy *p, const struct policy_layer *l,
                         struct policy_head *h,
                         const float *score /* [len] */,
                         const uint8_t *protect /* [len] or NULL */,
                         uint32_t b);

/*
 * Attention weights of n_q query rows against the entries of one KV head:
 * w[t][j][i] for query head j of group g (G = n_heads / n_kv_heads),
 * causal by position (kpos[i] <= qpos[t]).  q [n_q][n_heads][head_dim] and
 * lse [n_q][n_heads] are full staged rows (the group is picked here);
 * pages/page_tokens/kpos/len describe the keys.  Returns scratch
 * [n_q][G][len] or NULL when out of memory.
 */
float *policy_attn(struct policy *p, uint32_t g, const float *q,
                   const float *lse, const uint32_t *qpos, uint32_t n_q,
                   void *const *pages, uint32_t page_tokens,
                   const uint32_t *kpos, uint32_t len);

/*
 * Stores l->pre (the new entries' scores computed on a device,
 * [n_new][n_kv_heads]) as the first state float of each head's new
 * entries, what a policy that scores an entry once at arrival keeps.
 */
void policy_take_pre(const struct policy *p, struct policy_layer *l);

/*
 * Applies compaction moves (dst, src pairs as compact_plan writes them) to
 * a list's per-entry arrays: positions and entry_floats-wide state rows
 * (ent may be NULL).  Shared by the tenant and loadgen's replay.
 */
void policy_move_entries(uint32_t *pos, float *ent, uint32_t entry_floats,
                         const uint32_t *moves, uint32_t n_moves);

#endif
