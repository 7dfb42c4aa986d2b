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
#include "test.h"

#define TENANT_FIXTURE_RULE
#include "tenant_fixture.h"

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
	tenant_of(t, "window-test", spec, o);
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

/* What tenant_window_plan leaves in t with a rule and without (rule_setup). */
static void taken(const struct tenant *t)
{
	T_ASSERT(t->win.rule == &fake);
	T_ASSERT(t->win.params != NULL);
	T_EQ(t->win.active, 1);
	T_EQ(t->win.n_jobs, 0);
}

static void none(const struct tenant *t)
{
	T_ASSERT(t->win.rule == NULL && t->win.params == NULL);
	T_EQ(t->win.active, 0);
}

static const struct rule_setup window = {plan, taken, none, tenant_done};

TEST(tenant, window_rule_of_this_layout_is_taken)
{
	const struct kvt_backend_ops o = fake_ops();
	const struct rule_case c[] = {
		{"snapkv", "snapkv", SNAPKV_RULE_VERSION,
		 sizeof(struct snapkv_rule), sizeof(struct snapkv_rule_job)},
		{"pyramidkv", "snapkv", SNAPKV_RULE_VERSION,
		 sizeof(struct snapkv_rule), sizeof(struct snapkv_rule_job)},
		{"expected_attention", "expected_attention",
		 EXPECTED_ATTENTION_RULE_VERSION,
		 sizeof(struct expected_attention_rule),
		 sizeof(struct expected_attention_rule_job)},
	};
	rule_cases_taken(&window, &o, c, sizeof(c) / sizeof(c[0]));
}

TEST(tenant, window_without_rule_decides_on_host)
{
	struct kvt_backend_ops o = fake_ops();
	struct tenant t;
	char err[256];
	/* a table without the member */
	o.rule = NULL;
	T_OK(plan("snapkv", &o, &t, err, sizeof(err)));
	none(&t);
	tenant_done(&t);
	/* a lookup that has no rule of the name */
	o.rule = fake_lookup;
	have_rule = 0;
	T_OK(plan("expected_attention", &o, &t, err, sizeof(err)));
	T_EQ_STR(asked, "expected_attention");
	none(&t);
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
	const struct kvt_backend_rule good = {
		"snapkv", SNAPKV_RULE_VERSION, sizeof(struct snapkv_rule),
		sizeof(struct snapkv_rule_job), fake_run,
	};
	rule_other_layouts_refused(&window, &o, "pyramidkv", &good);
	rule_other_layouts_refused(&window, &o, "snapkv", &good);
}
