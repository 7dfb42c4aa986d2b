/*
 * tenant_attn_test.c — how a device tenant takes its policy's device rule
 * (tenant_attn.c, at tenant_attn_init): the backend's rule of the policy's
 * name ("h2o" for h2o and observed_attention, "tova" for tova) with this
 * build's layout is kept and gets its state in device memory; a backend
 * without it (no rule member, or no rule of that name) leaves the
 * decisions to the host, as before there was a device path; a rule of
 * another layout version or of other params or job sizes refuses the
 * tenant with the reason and allocates nothing.  The tenant knows no
 * rule: a policy's rule of any name gets the device memory its shape
 * asks and its upload, anew on a reload.
 *
 * The backend is the cpu table copied with its rule member and device
 * memory replaced by the test's (host memory standing in); the tenant is
 * a zeroed struct with what tenant_attn_init reads set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "h2o_rule.h"
#include "policy.h"
#include "test.h"
#include "tova_rule.h"

#define TENANT_FIXTURE_RULE
#include "tenant_fixture.h"

/* The fake device memory's calls, and the first mem_new sizes. */
static int mem_calls, free_calls;
static size_t mem_bytes[8];

static int fake_mem_new(void *ctx, size_t bytes, void **out)
{
	if (mem_calls < 8)
		mem_bytes[mem_calls] = bytes;
	mem_calls++;
	*out = calloc(1, bytes);
	return *out ? 0 : KVT_ENOMEM;
}

static void fake_mem_free(void *ctx, void *p)
{
	free_calls++;
	free(p);
}

static void tenant_done(struct tenant *t)
{
	tenant_attn_fini(t);
	policy_free(t->pol);
}

/* Initialises a tenant of spec on o: tenant_attn_init's code, and err. */
static int init(const char *spec, const struct kvt_backend_ops *o,
                struct tenant *t, char *err, size_t errlen)
{
	tenant_of(t, "attn-test", spec, o);
	err[0] = '\0';
	asked[0] = '\0';
	mem_calls = free_calls = 0;
	return tenant_attn_init(t, err, errlen);
}

static struct kvt_backend_ops fake_ops(void)
{
	struct kvt_backend_ops o = backend_cpu;
	o.mem_new = fake_mem_new;
	o.mem_free = fake_mem_free;
	o.rule = fake_lookup;
	return o;
}

/* What tenant_attn_init leaves in t with a rule and without (rule_setup). */
static void taken(const struct tenant *t)
{
	T_ASSERT(t->attn.rule == &fake);
	T_ASSERT(t->attn.state != NULL);
	T_ASSERT(mem_calls >= 1);
}

static void none(const struct tenant *t)
{
	T_ASSERT(t->attn.rule == NULL && t->attn.state == NULL);
	T_EQ(mem_calls, 0);
}

static const struct rule_setup attn = {init, taken, none, tenant_done};

TEST(tenant, attn_rule_of_this_layout_is_taken)
{
	const struct kvt_backend_ops o = fake_ops();
	const struct rule_case c[] = {
		{"tova", "tova", TOVA_RULE_VERSION, sizeof(struct tova_rule),
		 sizeof(struct tova_rule_job)},
		{"h2o", "h2o", H2O_RULE_VERSION, sizeof(struct h2o_rule),
		 sizeof(struct h2o_rule_job)},
		{"observed_attention", "h2o", H2O_RULE_VERSION,
		 sizeof(struct h2o_rule), sizeof(struct h2o_rule_job)},
	};
	rule_cases_taken(&attn, &o, c, sizeof(c) / sizeof(c[0]));
}

TEST(tenant, attn_without_rule_decides_on_host)
{
	struct kvt_backend_ops o = fake_ops();
	struct tenant t;
	char err[256];
	/* a table without the member */
	o.rule = NULL;
	T_OK(init("tova", &o, &t, err, sizeof(err)));
	none(&t);
	tenant_done(&t);
	/* a lookup that has no rule of the name */
	o.rule = fake_lookup;
	have_rule = 0;
	T_OK(init("h2o", &o, &t, err, sizeof(err)));
	T_EQ_STR(asked, "h2o");
	none(&t);
	tenant_done(&t);
}

TEST(tenant, attn_rule_of_another_layout_refused)
{
	const struct kvt_backend_ops o = fake_ops();
	const struct kvt_backend_rule good = {
		"tova", TOVA_RULE_VERSION, sizeof(struct tova_rule),
		sizeof(struct tova_rule_job), fake_run,
	};
	rule_other_layouts_refused(&attn, &o, "tova", &good);
}

/* A rule no daemon was told about: its shape, and an upload of 64 bytes
 * that counts its calls and the policy it was given (fails when
 * upload_fails). */
static int upload_calls, upload_fails;
static const struct policy *uploaded;

static void any_shape(const struct policy *p, uint32_t cap,
                      struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){.records = 3,
	                               .record_bytes = 2 * (size_t)cap * 5,
	                               .layer_bytes = 40};
}

static int any_upload(const struct policy *p, const struct kvt_backend_ops *o,
                      void *bctx, void **out, char *err, size_t errlen)
{
	upload_calls++;
	uploaded = p;
	*out = NULL;
	if (upload_fails) {
		snprintf(err, errlen, "no weights");
		return KVT_ENOMEM;
	}
	return o->mem_new(bctx, 64, out);
}

static const struct policy_device_rule any_rule = {
	.name = "any", .version = 7, .params_bytes = 12, .job_bytes = 20,
	.shape = any_shape, .upload = any_upload,
};

/* t, of a policy whose device rule is any_rule, on o: 0 or the error. */
static int init_any(const struct kvt_backend_ops *o, struct tenant *t,
                    struct policy_ops *ops)
{
	char err[256];
	tenant_of(t, "attn-test", "h2o", o);
	*ops = *t->pol->ops;
	ops->device = &any_rule;
	t->pol->ops = ops;
	asked[0] = '\0';
	mem_calls = free_calls = upload_calls = 0;
	return tenant_attn_init(t, err, sizeof(err));
}

TEST(tenant, attn_rule_of_any_name_gets_what_its_shape_asks)
{
	const struct kvt_backend_ops o = fake_ops();
	struct policy_ops ops, ops2;
	struct tenant t;
	char err[256];
	fake = (struct kvt_backend_rule){"any", 7, 12, 20, fake_run};
	have_rule = 1;
	upload_fails = 0;
	T_OK(init_any(&o, &t, &ops));
	T_EQ_STR(asked, "any");
	T_ASSERT(t.attn.rule == &fake && t.attn.state && t.attn.consts &&
	         t.attn.layers);
	/* 2 slots x 2 layers: 3 records of 2 x 32 x 5 bytes each, the
	 * upload, a buffer of 40 bytes each */
	T_EQ(mem_calls, 3);
	T_EQ(mem_bytes[0], 2 * 2 * 3 * 2 * 32 * 5);
	T_EQ(mem_bytes[1], 64);
	T_EQ(mem_bytes[2], 2 * 2 * 40);
	T_EQ(upload_calls, 1);
	T_ASSERT(uploaded == t.pol);
	/* a reload uploads the new policy's, then frees the old */
	struct policy *np;
	const struct policy_geom pg = t.pol->geom;
	T_OK(policy_create("h2o", &pg, &np, err, sizeof(err)));
	ops2 = ops;
	np->ops = &ops2;
	T_OK(tenant_attn_reload(&t, np, err, sizeof(err)));
	T_EQ(upload_calls, 2);
	T_ASSERT(uploaded == np);
	T_EQ(free_calls, 1);
	T_ASSERT(t.attn.consts != NULL);
	/* a failed one keeps the tenant's */
	upload_fails = 1;
	void *kept = t.attn.consts;
	T_EQ(tenant_attn_reload(&t, np, err, sizeof(err)), KVT_ENOMEM);
	T_ASSERT(t.attn.consts == kept);
	T_EQ(free_calls, 1);
	policy_free(np);
	tenant_done(&t);
	T_EQ(free_calls, mem_calls);
}

TEST(tenant, attn_rule_whose_upload_fails_decides_on_host)
{
	const struct kvt_backend_ops o = fake_ops();
	struct policy_ops ops;
	struct tenant t;
	fake = (struct kvt_backend_rule){"any", 7, 12, 20, fake_run};
	have_rule = 1;
	upload_fails = 1;
	T_OK(init_any(&o, &t, &ops));
	T_EQ(upload_calls, 1);
	T_ASSERT(t.attn.state == NULL && t.attn.consts == NULL &&
	         t.attn.layers == NULL);
	T_EQ(free_calls, mem_calls); /* the state it had taken, freed */
	upload_fails = 0;
	tenant_done(&t);
}
