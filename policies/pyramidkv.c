/*
 * pyramidkv.c — PyramidKV (kvpress PyramidKVPress): SnapKV's end-of-prefill
 * compression (snapkv.c, shared through snapkv.h) with per-layer budgets
 * that fall linearly from the lowest layer to the highest, their mean the
 * ratio (or tokens) budget.
 *
 * Rule (docs/policies.md), kvpress get_layer_budget with q_len = P, the
 * prompt, w the window, L layers, computed in double as Python does:
 *   mean M = P * (1 - ratio)  (or M = tokens)
 *   cap = w + M;  min = (cap - w) / beta;  max = (cap - w) * 2 - min
 *   if max >= P - w:  max = P - w;  min = (cap - w) * 2 - max
 *   if not (P >= max >= min >= w) or L == 1:  B = round(M)
 *   else  B_layer = round(max - layer * (max - min) / (L - 1))
 * round() is Python's: half to even (nearbyint).  Pressure then applies to
 * B as to every budget.  Everything else (when, scores, protection, the
 * window inside the budget) is snapkv's.  Defaults window 64, kernel 5,
 * ratio 0.5, beta 20 (kvpress), sinks 0.
 */
#include "snapkv.h"

#include <math.h>
#include <stdio.h>

#define PYRAMIDKV_DEF_BETA 20u

static int pyramidkv_init(struct policy *p, char *err, size_t errlen)
{
	if (!(p->args.set & POLICY_KEY_BETA))
		p->args.beta = PYRAMIDKV_DEF_BETA;
	return snapkv_init_args(p, err, errlen);
}

/* Half to even, as Python's round() on a float. */
static uint32_t round_even(double v)
{
	return v > 0.0 ? (uint32_t)nearbyint(v) : 0;
}

static uint32_t pyramidkv_budget(const struct policy *p, uint32_t layer,
                                 uint32_t P)
{
	const struct policy_args *a = &p->args;
	double w = a->window, q = P, L = p->geom.n_layers;
	double mean = a->tokens ? (double)a->tokens : q * (1.0 - a->ratio);
	double cap = w + mean;
	double lo = (cap - w) / a->beta;
	double hi = (cap - w) * 2 - lo;
	if (hi >= q - w) {
		hi = q - w;
		lo = (cap - w) * 2 - hi;
	}
	uint32_t b;
	if (!(q >= hi && hi >= lo && lo >= w) || p->geom.n_layers < 2)
		b = round_even(mean); /* kvpress falls back to SnapKV */
	else
		b = round_even(hi - layer * ((hi - lo) / (L - 1)));
	return policy_press(p, b);
}

static int pyramidkv_decide(struct policy *p, struct policy_layer *l)
{
	return snapkv_compress(p, l, pyramidkv_budget);
}

static uint32_t pyramidkv_plan(struct policy *p, struct policy_layer *l,
                               const struct policy_prompt_at *at, void *jobs,
                               struct policy_prompt_job *led)
{
	return snapkv_plan(p, l, at, jobs, led, pyramidkv_budget);
}

/* SnapKV's device rule with this budget. */
static const struct policy_prompt_rule pyramidkv_window_rule = {
	.name = "snapkv",
	.version = SNAPKV_RULE_VERSION,
	.params_bytes = sizeof(struct snapkv_rule),
	.job_bytes = sizeof(struct snapkv_rule_job),
	.params = snapkv_rule_params,
	.plan = pyramidkv_plan,
};

const struct policy_ops pyramidkv_ops = {
	.name = "pyramidkv",
	.help = "PyramidKV: SnapKV scores, per-layer budgets falling linearly "
	        "with depth, mean = the ratio budget (window=64, kernel=5, "
	        "ratio=0.5 | tokens=N, beta=20, sinks=0)",
	.needs = POLICY_NEED_Q | POLICY_NEED_LSE | POLICY_NEED_KV,
	.keys = POLICY_KEY_WINDOW | POLICY_KEY_KERNEL | POLICY_KEY_TOKENS |
	        POLICY_KEY_RATIO | POLICY_KEY_SINKS | POLICY_KEY_BETA,
	.init = pyramidkv_init,
	.decide = pyramidkv_decide,
	.decides = snapkv_decides,
	.prompt = &pyramidkv_window_rule,
	.eval = {"pyramidkv:%s,window=16,kernel=5",
	         POLICY_EVAL_CONTEXT},
};
