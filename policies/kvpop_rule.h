/*
 * kvpop_rule.h — KVpop's rule on a device (policies/kvpop.c's, run where
 * the staged rows, the keys, the projections u and the entries' state
 * are): its params and jobs, as the device rule named "kvpop" takes them
 * (struct kvt_backend_rule, backend.h; the cuda backend's:
 * policies/kvpop.cu), and the layout of its weights.  The output words
 * and the refusals every rule shares are backend.h's.
 *
 * One job per list.  Per-entry state in device memory (state): for list
 * record r and half h, [cap] positions (uint32) then [cap][F] floats (a:
 * the attention received within the delay, s: the score and, with a
 * memory, m and c: the decayed sum and count of the attention received
 * after it; F = KVPOP_ENTRY_FLOATS(memory)) at (uint32_t *)state + (r * 2
 * + h) * cap * (1 + F); read in half cur, written (compacted by the
 * drops) in the other, as H2O's (h2o_rule.h).  The projections u = P x
 * of the tokens still in their delay live in u: for u record ur (list
 * record / n_kv_heads: the (sequence, layer)) [ring][r] floats at u + ur *
 * ring * r, position p in row p % ring.  The weights: layer l's tensors,
 * float32, one after the other from weights + l * kvpop_layer_floats(): P
 * [r][d_model], W1 [m][r + 1], b1 [m], W2 [n_kv_heads][m], b2
 * [n_kv_heads]; with the learned memory its table mem (struct kvpop_rule)
 * follows the last layer's (kvpop_upload).  The rule is policies/kvpop.c's,
 * its operations in its order:
 *   proj jobs (the first job of a (sequence, layer) with new entries): u
 *     of the new rows = P x by SGEMM (scorer_linear_cpu's call, no bias),
 *     into their ring rows;
 *   the new entries get position n_seen - n_new + k and a = s = m = c =
 *     0;
 *   when n_new and (delay or memory): the band, the entries i (in index
 *     order) with pos_i + delay >= n_seen - n_new (with a memory: every
 *     entry; n_band of them, the caller's count, checked), against the
 *     new queries by one SGEMM (attn_band_cpu's call over the band's
 *     keys); for each query t in order with pos_t > pos_i, v = (sum over
 *     the G query heads j of the list's KV head, in order, of exp(logit -
 *     lse)) / G, and a_i += v when pos_t - pos_i <= delay, else (a
 *     memory) m_i = beta m_i + v, c_i = beta c_i + 1 (beta: the rule's,
 *     or with the learned memory its layer's in mem);
 *   entries whose delay ends in the sync (n_seen - n_new <= pos + delay <
 *     n_seen): s = W2[g] . gelu(W1 [u; ln(a + 1e-6)] + b1) + b2[g] (exact
 *     erf GELU, kvpop_score's loops);
 *   when due: protected pos + delay >= n_seen, pos < sinks and, with a
 *     window, pos + window >= n_seen; of the others the best keep stay
 *     (ties keep the higher position), ranked by s or, with a memory and
 *     c > 0, by (trust s + c ln(KVPOP_HORIZON m / c + 1e-6)) / (trust +
 *     c); with the learned memory (mem not NULL) every entry by
 *     KVPOP_READOUT, w_s s + w_f ln(m / c + 1e-6) with a / delay in place
 *     of m / c while c = 0.
 *
 * Run: n jobs in order after the work queued on the stream: keys read
 * through the paged table, the new rows' x, q and lse in device staging,
 * u and the state on the device.  out[j] = 1 when an x, q or lse value of
 * job j's new rows is not finite (checked by proj jobs).  KVT_EINVAL
 * besides backend.h's: len + n_new beyond cap, n_band beyond len + n_new,
 * n_new beyond ring, rows beyond the staging ring, r or m 0, a memory
 * whose beta is not in (0, 1) or whose trust is not finite and >= 0
 * (memory=T's: the learned memory's are the host's, checked when the
 * weights loaded), mem without a memory.
 */
#ifndef KVT_KVPOP_RULE_H
#define KVT_KVPOP_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct kvpop_rule and kvpop_rule_job (the rule's
 * kvt_backend_rule.version). */
#define KVPOP_RULE_VERSION 4

struct kvpop_rule {
	void *state;           /* device: the entries' state (above) */
	float *u;              /* device: the u rings (above) */
	const float *weights;  /* device: every layer's tensors (above) */
	uint32_t cap;          /* entries per half */
	struct kvt_backend_rows rows; /* device staging's layout (x read) */
	uint32_t d_model, r, m, ring, delay, sinks;
	uint32_t window;       /* the recent window protected (0: none) */
	uint32_t memory;       /* the memory's decay in tokens (0: none) */
	float beta;            /* exp(-1 / memory), the host's expf */
	float trust;           /* the learned score's weight in the blend */
	/* device: memory=learned (memory then nonzero, beta and trust
	 * unused): per layer [n_layers][3] its decay beta (exp(-1 / T_l),
	 * the host's expf) and the readout's w_s and w_f
	 * (KVPOP_MEM_FLOATS); NULL: memory=T or none */
	const float *mem;
};

/* The horizon of the scorer's training target (tools/train/recipe.h's
 * RECIPE_KVPOP_HORIZON): s estimates ln of the attention over N queries,
 * so the memory's estimate is ln(N m / c). */
#define KVPOP_HORIZON 128.0f

/* The selection's rank of an entry with a memory (c > 0): the learned
 * score s blended with the memory's estimate ln(N m / c), trust K to c.
 * A macro, so that the host rule and the device's (policies/kvpop.c,
 * kvpop.cu) compute it with the same float operations. */
#define KVPOP_BLEND(K, s, m, c) \
	(((K) * (s) + (c) * logf(KVPOP_HORIZON * (m) / (c) + 1e-6f)) / \
	 ((K) + (c)))

/* The selection's rank of an entry with the learned memory: w_s s + w_f
 * ln(m / c + 1e-6), with the delay's mean a / delay for m / c before a
 * query past the delay has read the entry (c = 0).  A macro for the same
 * reason as KVPOP_BLEND. */
#define KVPOP_READOUT(ws, wf, s, a, m, c, delay)                           \
	((ws) * (s) +                                                      \
	 (wf) * logf(((c) > 0.0f ? (m) / (c)                               \
	                         : (a) / (float)((delay) ? (delay) : 1)) + \
	             1e-6f))

/* Floats a layer of the learned memory's table (mem): beta, w_s, w_f. */
#define KVPOP_MEM_FLOATS 3u

/* Floats of an entry's state: [a, s], with a memory [a, s, m, c].  A
 * macro, since the device code (policies/kvpop.cu) needs it too. */
#define KVPOP_ENTRY_FLOATS(memory) ((memory) ? 4u : 2u)

/* Floats of one layer's tensors in weights (above). */
static inline uint64_t kvpop_layer_floats(uint32_t r, uint32_t m,
                                          uint32_t d_model,
                                          uint32_t n_kv_heads)
{
	return (uint64_t)r * d_model + (uint64_t)m * (r + 1) + m +
	       (uint64_t)n_kv_heads * m + n_kv_heads;
}

/* One list of the rule: ring of its (sequence, layer) in device
 * staging, its layer, its list record r (KV head r % n_kv_heads of the
 * (sequence, layer) whose u record is r / n_kv_heads: the daemon numbers
 * both so, and a job carries no more than it must, since the jobs cross
 * at every sync), the half holding its state, whether it projects its
 * (sequence, layer)'s new rows (proj; the later jobs of the (sequence,
 * layer) read them), its length before the sync, the new entries, the
 * tokens seen after them, the band's entries (the caller's count),
 * whether a selection is due, the unprotected entries kept, the drops
 * (the caller's count, checked) and where their indices go. */
struct kvpop_rule_job {
	const float *ring;
	uint32_t layer, record, cur, proj;
	uint32_t len, n_new, n_seen, n_band;
	uint32_t due, keep, n_drop, drop_off;
};

#endif
