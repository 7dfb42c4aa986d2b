/*
 * expected_attention_rule.h — Expected Attention's end-of-prefill rule on
 * a device (policies/expected_attention.c's, run where the prompt's keys
 * and values and the staged queries are): its params and jobs, as the
 * device rule named "expected_attention" takes them (struct
 * kvt_backend_rule, backend.h; the cuda backend's:
 * policies/expected_attention.cu).  The output words and the refusals
 * every rule shares are backend.h's.
 *
 * A job is one list (one KV head g of a (sequence, layer)) whose entry i
 * holds position i (the planner checks that nothing was evicted before).
 * The rule is expected_attention.c's, its operations in its order, for
 * the G query heads of g: the q of positions [from, P) (P = len) stand
 * for the future queries: each un-rotated from its position (RoPE of base
 * theta, float), mean and (cov) covariance in double, both rotated by the
 * mean rotation of positions [P, P + future); z_i = mu' . k_i / sqrt(d) +
 * (cov) k_i^T S' k_i / (2 d) (quad_form_cpu's fixed order, kernels.h),
 * softmax over the candidates sinks <= i < P per query head, the
 * mean over the G heads, (vnorm) times ||v_i|| after adding eps.  Entries
 * outside the candidates are protected; of the candidates the best keep
 * stay (ties keep the higher index).
 *
 * Run: out[j] = 1 when a q value of job j's rows [from, len + n_new) is
 * not finite (lse is not read).  A job that is not due only has those
 * rows checked (from = len: the new rows alone) and drops nothing.
 * KVT_EINVAL besides backend.h's: a KV head g >= n_kv_heads, from > len,
 * a due job with from = len or from < sinks, rows beyond the ring or q
 * beyond a row, head_dim odd, future 0 or theta not > 0 where a job is
 * due.
 */
#ifndef KVT_EXPECTED_ATTENTION_RULE_H
#define KVT_EXPECTED_ATTENTION_RULE_H

#include <stdint.h>

#include "backend.h"

/* Layout version of struct expected_attention_rule and
 * expected_attention_rule_job (the rule's kvt_backend_rule.version). */
#define EXPECTED_ATTENTION_RULE_VERSION 1

struct expected_attention_rule {
	struct kvt_backend_rows rows; /* device staging's layout (q only) */
	uint32_t sinks, future;
	float theta;                  /* RoPE base, as the policy rounds it */
	uint32_t cov, vnorm;          /* 0 or 1 */
	double eps;
};

/* One list of the rule: the ring of its (sequence, layer) in device
 * staging, its record and KV head g, its prompt (len) and new entries,
 * the first query of the statistics, whether a selection is due, the
 * candidates kept, the drops (the caller's count, checked) and where
 * their indices go. */
struct expected_attention_rule_job {
	const float *ring;
	uint32_t record, g;
	uint32_t len, n_new, from;
	uint32_t due, keep, n_drop, drop_off;
};

#endif
