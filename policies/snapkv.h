/*
 * snapkv.h — SnapKV's end-of-prefill compression (snapkv.c), shared by
 * snapkv and pyramidkv, which differ only in the budget each layer keeps.
 * The rule is in snapkv.c's header and docs/policies.md.
 */
#ifndef KVT_SNAPKV_H
#define KVT_SNAPKV_H

#include "policy.h"
#include "snapkv_rule.h"

/*
 * Defaults and checks of the keys both share: window 64 (>= 1, refused
 * with KVT_EPOLICY and a reason naming p->ops->name), kernel 5, ratio 0.5
 * when no tokens / ratio budget was given; sets layer_state_bytes (the
 * once-only flag) and lookback (the window).
 */
int snapkv_init_args(struct policy *p, char *err, size_t errlen);

/* Entries of a prompt of P tokens that layer keeps, pressure applied
 * (UINT32_MAX: no budget). */
typedef uint32_t (*snapkv_budget_fn)(const struct policy *p, uint32_t layer,
                                     uint32_t P);

/* decides() of both: at the first decode sync of the (sequence, layer)
 * only, while the prompt is not compressed yet. */
int snapkv_decides(const struct policy *p, const struct policy_layer *l);

/* The device rule's params and plan of both (policy_ops.window: struct
 * policy_prompt_rule; the jobs are snapkv_rule.h's, one a KV head), the
 * plan with their budget. */
void snapkv_rule_params(const struct policy *p,
                        const struct kvt_backend_rows *rows, void *params);
uint32_t snapkv_plan(struct policy *p, struct policy_layer *l,
                     const struct policy_prompt_at *at, void *jobs,
                     struct policy_prompt_job *led, snapkv_budget_fn budget);

/*
 * decide() of both: at the first decode sync of the (sequence, layer),
 * once, scores the prompt entries by the observation window's attention
 * (max-pooled) and keeps budget(p, layer, P) of the prompt per KV head.
 */
int snapkv_compress(struct policy *p, struct policy_layer *l,
                    snapkv_budget_fn budget);

#endif
