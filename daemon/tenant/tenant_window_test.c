/*
 * tenant_window_test.c — how a device tenant takes its policy's
 * end-of-prefill rule (tenant_window.c, at its first sync): the backend's
 * rule of the name the policy's prompt hook gives ("snapkv" for snapkv and
 * pyramidkv, "expected_attention") with this build's layout is kept, with
 * room for its params; a backend without it (no rule member, or no rule
 * of that name) leaves the decisions to the host; a rule of another
 * layout version or of other params or job sizes refuses the sync with
 * the reason, and keeps nothing.
 *
 * The backend is the cpu table copied with its rule member replaced; the
 * tenant is a zeroed struct with what tenant_window_plan reads set, and
 * the syncs have no items (the rule is looked up before any is planned).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "expected_attention_rule.h"
#include "policy.h"
#include "snapkv_rule.h"
#include "tenant_int.h"
#include "test.h"

/* What the fake backend hands out and what it was asked. */
static struct kvt_backend_rule fake;
static int have_rule;
static char asked[32];

static int fake_run(void *ctx, const struct kvt_backend_paged *pg,
                    uint32_t n_records, const struct kvt_backend_rule_geom *g,
                    const void *params, const void *jobs, uint32_t n,
                    uint32_t *out, uint32_t out_words, void *stream)
{
	return KVT_ESYS; /* never run here: no item, no job */
}

static const struct kvt_backend_rule *fake_lookup(const char *name)
{
	snprintf(asked, sizeof(asked), "%s", name ? name : "(null)");
	return have_rule ? &fake : NULL;
}

/* A device tenant of policy spec on backend o, as far as
 * tenant_window_plan reads it. */
static void tenant_of(struct tenant *t, const char *spec,
                      const struct kvt_backend_ops *o)
{
	static char base; /* stands in for the chunk bases and staging */
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "window-test");
	t->g = (struct shm_geom){.max_seqs = 2, .n_layers = 2, .n_heads = 4,
	                         .n_kv_heads = 2, .head_dim = 8, .d_model = 16,
	                         .page_tokens = 4, .max_tokens = 32,
	                         .headroom = 4, .stage_tokens = 8};
	t->lists_per_seq = t->g.n_layers * t->g.n_kv_heads;
	const struct policy_geom pg = {
		.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 8,
		.d_model = 16, .page_tokens = 4, .dtype = KVT_DTYPE_F32,
		.headroom = 4,
	};
	char err[256];
	T_OK(policy_create(spec, &pg, &t->pol, err, sizeof(err)));
	t->bops = o;
	t->dev = 1;
	t->dsync.dbases = (void **)&base;
	t->dstage.chunk.base = &base;
}

static void tenant_done(struct tenant *t)
{
	void *p[] = {t->win.mode, t->win.widx, t->win.wn, t->win.params,
	             t->win.jobs, t->win.led, t->win.wlen, t->win.out};
	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		free(p[i]);
	policy_free(t->pol);
}

/* A sync of no items for a tenant of spec on o, and err. */
static int plan(const char *spec, const struct kvt_backend_ops *o,
                struct tenant *t, char *err, size_t errlen)
{
	tenant_of(t, spec, o);
	err[0] = '\0';
	asked[0] = '\0';
	return tenant_window_plan(t, NULL, 0, err, errlen);
}

static struct kvt_backend_ops fake_ops(void)
{
	struct kvt_backend_ops o = backend_cpu;
	o.rule = fake_lookup;
	return o;
}

TEST(tenant, window_rule_of_this_layout_is_taken)
{
	const struct kvt_backend_ops o = fake_ops();
	struct tenant t;
	char err[256];
	const struct {
		const char *spec, *rule;
		uint32_t version, params, job;
	} c[] = {
		{"snapkv", "snapkv", SNAPKV_RULE_VERSION,
		 sizeof(struct snapkv_rule), sizeof(struct snapkv_rule_job)},
		{"pyramidkv", "snapkv", SNAPKV_RULE_VERSION,
		 sizeof(struct snapkv_rule), sizeof(struct snapkv_rule_job)},
		{"expected_attention", "expected_attention",
		 EXPECTED_ATTENTION_RULE_VERSION,
		 sizeof(struct expected_attention_rule),
		 sizeof(struct expected_attention_rule_job)},
	};
	for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
		fake = (struct kvt_backend_rule){c[k].rule, c[k].version,
		                                 c[k].params, c[k].job,
		                                 fake_run};
		have_rule = 1;
		T_OK(plan(c[k].spec, &o, &t, err, sizeof(err)));
		T_EQ_STR(asked, c[k].rule);
		T_ASSERT(t.win.rule == &fake);
		T_ASSERT(t.win.params != NULL);
		T_EQ(t.win.active, 1);
		T_EQ(t.win.n_jobs, 0);
		tenant_done(&t);
	}
}

TEST(tenant, window_without_rule_decides_on_host)
{
	struct kvt_backend_ops o = fake_ops();
	struct tenant t;
	char err[256];
	/* a table without the member */
	o.rule = NULL;
	T_OK(plan("snapkv", &o, &t, err, sizeof(err)));
	T_ASSERT(t.win.rule == NULL && t.win.params == NULL);
	T_EQ(t.win.active, 0);
	tenant_done(&t);
	/* a lookup that has no rule of the name */
	o.rule = fake_lookup;
	have_rule = 0;
	T_OK(plan("expected_attention", &o, &t, err, sizeof(err)));
	T_EQ_STR(asked, "expected_attention");
	T_ASSERT(t.win.rule == NULL && t.win.params == NULL);
	T_EQ(t.win.active, 0);
	tenant_done(&t);
	/* a policy without the hook asks nothing */
	have_rule = 1;
	T_OK(plan("h2o", &o, &t, err, sizeof(err)));
	T_EQ_STR(asked, "");
	T_EQ(t.win.active, 0);
	tenant_done(&t);
}

TEST(tenant, window_rule_of_another_layout_refused)
{
	const struct kvt_backend_ops o = fake_ops();
	struct tenant t;
	char err[256];
	const struct kvt_backend_rule good = {
		"snapkv", SNAPKV_RULE_VERSION, sizeof(struct snapkv_rule),
		sizeof(struct snapkv_rule_job), fake_run,
	};
	struct kvt_backend_rule bad[3] = {good, good, good};
	bad[0].version++;
	bad[1].params_bytes += 4;
	bad[2].job_bytes -= 4;
	have_rule = 1;
	for (int k = 0; k < 3; k++) {
		fake = bad[k];
		T_EQ(plan("pyramidkv", &o, &t, err, sizeof(err)), KVT_ENOTSUP);
		T_ASSERT(strstr(err, "device rule snapkv") != NULL);
		T_ASSERT(strstr(err, "another build") != NULL);
		T_ASSERT(t.win.rule == NULL && t.win.params == NULL);
		T_EQ(t.win.active, 0);
		tenant_done(&t);
	}
	/* the reason names both layouts */
	fake = bad[0];
	T_EQ(plan("snapkv", &o, &t, err, sizeof(err)), KVT_ENOTSUP);
	char want[64];
	snprintf(want, sizeof(want), "layout version %u", bad[0].version);
	T_ASSERT(strstr(err, want) != NULL);
	tenant_done(&t);
}
