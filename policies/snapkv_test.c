/*
 * snapkv_test.c — how snapkv, pyramidkv and expected_attention plan their
 * end-of-prefill decision as device jobs (policy_ops.prompt: struct
 * policy_prompt_rule): the rule's name and layout; at the first decode
 * sync of a (sequence, layer) one job a KV head with the drops the rule
 * makes (counted here from the rule as docs/policies.md states it: the
 * candidates less the budget's share), or one job that only checks rows
 * when the prompt is within the budget, or none when the ring no longer
 * holds the rows the host would read; and the decision marked made.
 */
#include <stdint.h>
#include <string.h>

#include "expected_attention_rule.h"
#include "policy.h"
#include "snapkv_rule.h"
#include "test.h"

#define PP_KV 2

/* A policy of spec over 2 layers of 2 KV heads (4 query heads). */
static struct policy *pp_make(const char *spec)
{
	const struct policy_geom g = {
		.n_layers = 2, .n_heads = 4, .n_kv_heads = PP_KV, .head_dim = 8,
		.d_model = 16, .page_tokens = 4, .dtype = KVT_DTYPE_F32,
		.headroom = 4,
	};
	struct policy *p;
	char err[256];
	T_OK(policy_create(spec, &g, &p, err, sizeof(err)));
	return p;
}

/* The first decode sync of layer 0 after a prompt of P tokens, n_new new
 * ones, state (zeroed: nothing decided yet) in st. */
static struct policy_layer pp_layer(uint32_t P, uint32_t n_new, void *st)
{
	return (struct policy_layer){.layer = 0, .phase = KVT_PHASE_DECODE,
	                             .n_new = n_new, .n_seen = P + n_new,
	                             .state = st};
}

/* The plan of policy p for a prompt of P (n_new new tokens) with a ring
 * of stage rows, into jobs / led; the state is checked marked. */
static uint32_t pp_plan(struct policy *p, uint32_t P, uint32_t n_new,
                        uint32_t stage, void *jobs,
                        struct policy_prompt_job *led)
{
	uint8_t st[64] = {0};
	T_ASSERT(p->layer_state_bytes <= sizeof(st));
	struct policy_layer l = pp_layer(P, n_new, st);
	T_EQ(policy_decides(p, &l), 1);
	const struct policy_prompt_at at = {
		.ring = (const float *)st, .stage_tokens = stage, .record = 6,
		.P = P, .n_new = n_new, .drop_off = 5};
	uint32_t n = p->ops->prompt->plan(p, &l, &at, jobs, led);
	T_EQ(policy_decides(p, &l), 0); /* decided, as decide() marks it */
	return n;
}

TEST(policy, snapkv_plans_one_job_a_kv_head)
{
	/* prompt 20, window 4, budget 10, sinks 1: candidates [0, 16), the
	 * window and the sink protected, so 10 - 4 - 1 = 5 of the 15 others
	 * kept: 10 drops a head */
	const char *spec[] = {"snapkv:window=4,tokens=10,sinks=1",
	                      "pyramidkv:window=4,tokens=10,sinks=1"};
	for (int k = 0; k < 2; k++) {
		struct policy *p = pp_make(spec[k]);
		const struct policy_prompt_rule *r = p->ops->prompt;
		T_ASSERT(r != NULL);
		T_EQ_STR(r->name, "snapkv");
		T_EQ(r->version, SNAPKV_RULE_VERSION);
		T_EQ(r->params_bytes, sizeof(struct snapkv_rule));
		T_EQ(r->job_bytes, sizeof(struct snapkv_rule_job));
		struct snapkv_rule_job j[PP_KV];
		struct policy_prompt_job led[PP_KV];
		/* pyramidkv's first layer keeps more than the mean: only its
		 * counts are the rule's, checked against snapkv's shape */
		T_EQ(pp_plan(p, 20, 2, 64, j, led), PP_KV);
		for (uint32_t h = 0; h < PP_KV; h++) {
			T_EQ(j[h].record, 6 + h);
			T_EQ(j[h].g, h);
			T_EQ(j[h].len, 20);
			T_EQ(j[h].n_new, 2);
			T_EQ(j[h].w, 4);
			T_EQ(j[h].due, 1);
			T_EQ(j[h].n_drop, 15 - j[h].keep);
			T_EQ(j[h].drop_off, 5 + h * j[h].n_drop);
			T_EQ(led[h].head, h);
			T_EQ(led[h].n_drop, j[h].n_drop);
			T_EQ(led[h].drop_off, j[h].drop_off);
		}
		if (k == 0) {
			T_EQ(j[0].keep, 5);
			T_EQ(j[0].n_drop, 10);
		}
		/* within the budget: one job that checks the new rows */
		T_EQ(pp_plan(p, 9, 2, 64, j, led), 1);
		T_EQ(j[0].due, 0);
		T_EQ(j[0].w, 0);
		T_EQ(j[0].n_drop, 0);
		T_EQ(led[0].head, UINT32_MAX);
		/* a ring of 5 rows no longer holds the window of 4 and the 2
		 * new rows: the host decides */
		T_EQ(pp_plan(p, 20, 2, 5, j, led), 0);
		struct snapkv_rule a;
		const struct kvt_backend_rows rows = {64, 40, 8, 40};
		r->params(p, &rows, &a);
		T_EQ(a.kernel, 5);
		T_EQ(a.sinks, 1);
		T_EQ(a.rows.q_off, 8);
		policy_free(p);
	}
}

TEST(policy, expected_attention_plans_one_job_a_kv_head)
{
	/* prompt 20, window 4, budget 10, sinks 2: candidates [2, 20), the
	 * sinks counting against the budget, so 8 of 18 kept: 10 drops a
	 * head; the statistics from position 16 */
	struct policy *p =
		pp_make("expected_attention:window=4,tokens=10,sinks=2,future=7");
	const struct policy_prompt_rule *r = p->ops->prompt;
	T_ASSERT(r != NULL);
	T_EQ_STR(r->name, "expected_attention");
	T_EQ(r->version, EXPECTED_ATTENTION_RULE_VERSION);
	T_EQ(r->params_bytes, sizeof(struct expected_attention_rule));
	T_EQ(r->job_bytes, sizeof(struct expected_attention_rule_job));
	struct expected_attention_rule_job j[PP_KV];
	struct policy_prompt_job led[PP_KV];
	T_EQ(pp_plan(p, 20, 2, 64, j, led), PP_KV);
	for (uint32_t h = 0; h < PP_KV; h++) {
		T_EQ(j[h].record, 6 + h);
		T_EQ(j[h].g, h);
		T_EQ(j[h].from, 16);
		T_EQ(j[h].due, 1);
		T_EQ(j[h].keep, 8);
		T_EQ(j[h].n_drop, 10);
		T_EQ(j[h].drop_off, 5 + h * 10);
		T_EQ(led[h].head, h);
		T_EQ(led[h].n_drop, 10);
	}
	/* within the budget: one job that checks the new rows */
	T_EQ(pp_plan(p, 10, 2, 64, j, led), 1);
	T_EQ(j[0].due, 0);
	T_EQ(j[0].from, 10);
	T_EQ(led[0].head, UINT32_MAX);
	/* the statistics' rows [16, 22) beyond a ring of 5: the host */
	T_EQ(pp_plan(p, 20, 2, 5, j, led), 0);
	struct expected_attention_rule a;
	const struct kvt_backend_rows rows = {64, 40, 8, 40};
	r->params(p, &rows, &a);
	T_EQ(a.sinks, 2);
	T_EQ(a.future, 7);
	T_EQ(a.cov, 1);
	T_EQ(a.vnorm, 1);
	policy_free(p);
}
