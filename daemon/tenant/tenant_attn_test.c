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
 * asks and its upload, anew on a reload; one that reads the scorer's
 * scores on the device only with a device scorer.  A run's output is
 * checked against the plan (tenant_attn_check): the counts equal, or
 * within the bound of a rule with drop_bound and then taken.
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

/* t, of a policy whose device rule is dr, on o: 0 or the error. */
static int init_rule(const struct kvt_backend_ops *o, struct tenant *t,
                     struct policy_ops *ops,
                     const struct policy_device_rule *dr)
{
	char err[256];
	tenant_of(t, "attn-test", "h2o", o);
	*ops = *t->pol->ops;
	ops->device = dr;
	t->pol->ops = ops;
	asked[0] = '\0';
	mem_calls = free_calls = upload_calls = 0;
	return tenant_attn_init(t, err, sizeof(err));
}

/* t, of a policy whose device rule is any_rule, on o: 0 or the error. */
static int init_any(const struct kvt_backend_ops *o, struct tenant *t,
                    struct policy_ops *ops)
{
	return init_rule(o, t, ops, &any_rule);
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

/* The checks of a run's output (tenant_attn_check) over two layers of
 * jobs: the device's counts against the plan's; with the rule's
 * drop_bound (a threshold rule whose drops only the device knows: kvzap)
 * a count below the job's n_drop is taken, one above refused. */
static int check(struct tenant *t, struct policy_device_rule *dr,
                 int bound, const uint32_t *want, uint32_t *out,
                 struct policy_dev_job *jobs, char *err)
{
	static uint32_t first[3] = {0, 2, 3};
	static uint8_t mode[2];
	const struct policy_dev_job plan[3] = {
		{.rec = 0, .g = 0, .L = 10, .n_drop = 4, .drop_off = 0},
		{.rec = 1, .g = 1, .L = 10, .n_drop = 2, .drop_off = 4},
		{.rec = 2, .g = 0, .L = 6, .n_drop = 1, .drop_off = 6},
	};
	memcpy(jobs, plan, sizeof(plan));
	memcpy(out, want, 13 * sizeof(*out));
	mode[0] = mode[1] = TENANT_ATTN_DEVICE;
	dr->drop_bound = bound;
	t->attn.dr = dr;
	t->attn.n_jobs = 3;
	t->attn.first = first;
	t->attn.mode = mode;
	t->attn.jobs = jobs;
	t->attn.out = out;
	t->attn.active = 1;
	err[0] = '\0';
	return tenant_attn_check(t, 2, err, 256);
}

TEST(tenant, attn_drop_bound_takes_a_count_below_and_refuses_above)
{
	const struct kvt_backend_ops o = fake_ops();
	struct policy_ops ops;
	struct policy_device_rule dr = any_rule;
	struct tenant t;
	char err[256];
	fake = (struct kvt_backend_rule){"any", 7, 12, 20, fake_run};
	have_rule = 1;
	upload_fails = 0;
	T_OK(init_any(&o, &t, &ops));
	struct policy_dev_job jobs[3];
	uint32_t out[13];
	/* flags, counts, then indices: job 0 drops 2 of its 4 (0, 7), job 1
	 * none of its 2, job 2 its 1 (5) */
	const uint32_t below[13] = {0, 0, 0, 2, 0, 1, 0, 7, 9, 9, 9, 9, 5};
	T_OK(check(&t, &dr, 1, below, out, jobs, err));
	T_EQ(jobs[0].n_drop, 2);
	T_EQ(jobs[1].n_drop, 0);
	T_EQ(jobs[2].n_drop, 1);
	struct tenant_ldrop ld[2];
	T_EQ(tenant_attn_take(&t, 0, ld), 1);
	T_EQ(ld[0].n, 2);
	T_EQ(ld[0].idx[0], 0);
	T_EQ(ld[0].idx[1], 7);
	T_EQ(ld[1].n, 0);
	T_EQ(tenant_attn_take(&t, 1, ld), 1);
	T_EQ(ld[0].n, 1);
	T_EQ(ld[0].idx[0], 5);
	/* without the bound the same words are refused: the count must be
	 * the plan's */
	T_EQ(check(&t, &dr, 0, below, out, jobs, err), KVT_ESYS);
	T_ASSERT(strstr(err, "job 0 dropped 2 entries (the rule: 4)") != NULL);
	T_EQ(t.attn.active, 0);
	/* the counts the plan made, taken with or without the bound */
	const uint32_t exact[13] = {0, 0, 0, 4, 2, 1, 0, 1, 2, 7, 3, 8, 5};
	T_OK(check(&t, &dr, 0, exact, out, jobs, err));
	T_OK(check(&t, &dr, 1, exact, out, jobs, err));
	T_EQ(jobs[0].n_drop, 4);
	/* a count above the bound, indices out of order or beyond the
	 * list, refused */
	uint32_t above[13];
	memcpy(above, below, sizeof(above));
	above[4] = 3; /* job 1: 3 of at most 2 */
	T_EQ(check(&t, &dr, 1, above, out, jobs, err), KVT_ESYS);
	T_ASSERT(strstr(err, "job 1 dropped 3 entries (the rule: at most 2)") !=
	         NULL);
	memcpy(above, below, sizeof(above));
	above[7] = 0; /* job 0: 0, 0 */
	T_EQ(check(&t, &dr, 1, above, out, jobs, err), KVT_ESYS);
	memcpy(above, below, sizeof(above));
	above[12] = 6; /* job 2: index 6 of 6 entries */
	T_EQ(check(&t, &dr, 1, above, out, jobs, err), KVT_ESYS);
	/* a flagged job's layer goes to the host (its count is the veto's) */
	memcpy(above, below, sizeof(above));
	above[2] = 1;
	above[5] = UINT32_MAX;
	T_OK(check(&t, &dr, 1, above, out, jobs, err));
	T_EQ(tenant_attn_mode(&t, 1), TENANT_ATTN_FLAGGED);
	T_EQ(tenant_attn_mode(&t, 0), TENANT_ATTN_DEVICE);
	t.attn.first = NULL;
	t.attn.mode = NULL;
	t.attn.jobs = NULL;
	t.attn.out = NULL;
	tenant_done(&t);
}

/* A rule that reads the scorer's scores on the device (takes_pre) is
 * taken only by a tenant whose scorer runs there: else the host decides,
 * and nothing is allocated. */
TEST(tenant, attn_rule_taking_scores_needs_a_device_scorer)
{
	const struct kvt_backend_ops o = fake_ops();
	struct policy_ops ops;
	struct policy_device_rule dr = any_rule;
	struct tenant t;
	fake = (struct kvt_backend_rule){"any", 7, 12, 20, fake_run};
	have_rule = 1;
	upload_fails = 0;
	dr.takes_pre = 1;
	T_OK(init_rule(&o, &t, &ops, &dr));
	T_ASSERT(t.attn.rule == NULL && t.attn.state == NULL);
	T_EQ(mem_calls, 0);
	float *dev = (float *)&t;
	char err[256];
	T_OK(tenant_attn_pre(&t, 64, &dev, err, sizeof(err)));
	T_ASSERT(dev == NULL); /* no device copy of the scores wanted */
	tenant_done(&t);
}

static int never(const struct policy *p)
{
	(void)p;
	return 0;
}

/* A rule that says the instance is not its own (supports 0) is not
 * taken; a job of the whole layer (POLICY_DEV_LAYER) has its indices
 * over the lists end to end split by list, relative to each. */
TEST(tenant, attn_layer_job_drops_split_by_list)
{
	const struct kvt_backend_ops o = fake_ops();
	struct policy_ops ops;
	struct policy_device_rule dr = any_rule;
	struct tenant t;
	fake = (struct kvt_backend_rule){"any", 7, 12, 20, fake_run};
	have_rule = 1;
	upload_fails = 0;
	dr.supports = never;
	T_OK(init_rule(&o, &t, &ops, &dr));
	T_ASSERT(t.attn.rule == NULL && t.attn.state == NULL);
	T_EQ(mem_calls, 0);
	tenant_done(&t);

	dr.supports = NULL;
	dr.drop_bound = 1;
	T_OK(init_rule(&o, &t, &ops, &dr));
	T_ASSERT(t.attn.state != NULL);
	/* one layer of 2 lists of 5 and 4 entries: drops 1, 4 of list 0 and
	 * 0, 3 of list 1 (5, 8 end to end), of at most 6 */
	struct policy_head heads[2] = {{.len = 5}, {.len = 4}};
	struct policy_dev_job jobs[1] = {
		{.rec = 0, .g = POLICY_DEV_LAYER, .L = 9, .n_drop = 6},
	};
	uint32_t out[2 + 6] = {0, 4, 1, 4, 5, 8, 77, 77}, first[2] = {0, 1};
	uint8_t mode[1] = {TENANT_ATTN_DEVICE};
	char err[256];
	t.scr.heads = heads;
	t.attn.dr = &dr;
	t.attn.n_jobs = 1;
	t.attn.first = first;
	t.attn.mode = mode;
	t.attn.jobs = jobs;
	t.attn.out = out;
	t.attn.active = 1;
	T_OK(tenant_attn_check(&t, 1, err, sizeof(err)));
	T_EQ(jobs[0].n_drop, 4);
	struct tenant_ldrop ld[2];
	T_EQ(tenant_attn_take(&t, 0, ld), 1);
	T_EQ(ld[0].n, 2);
	T_EQ(ld[0].idx[0], 1);
	T_EQ(ld[0].idx[1], 4);
	T_EQ(ld[1].n, 2);
	T_EQ(ld[1].idx[0], 0);
	T_EQ(ld[1].idx[1], 3);
	/* an index beyond the layer's entries is refused */
	uint32_t bad[2 + 6] = {0, 2, 1, 9};
	jobs[0].n_drop = 6;
	t.attn.out = bad;
	T_EQ(tenant_attn_check(&t, 1, err, sizeof(err)), KVT_ESYS);
	t.scr.heads = NULL;
	t.attn.first = NULL;
	t.attn.mode = NULL;
	t.attn.jobs = NULL;
	t.attn.out = NULL;
	tenant_done(&t);
}

/* The fake device memory's copy: host memory on both sides. */
static int fake_copy(void *ctx, void *dst, const void *src, size_t bytes,
                     void *stream)
{
	memcpy(dst, src, bytes);
	return 0;
}

/* A rule whose one record of a layer holds its lists one after the other
 * in each half (fastkvzip's layout: list g's positions at ((r * 2 + h) *
 * n_kv + g) * cap * 2 words into the state). */
static void lists_shape(const struct policy *p, uint32_t cap,
                        struct policy_dev_shape *s)
{
	*s = (struct policy_dev_shape){
		.records = 1,
		.record_bytes = 2 * (size_t)p->geom.n_kv_heads * cap * 8,
		.positions = 1, .list_bytes = (size_t)cap * 8,
	};
}

static const struct policy_device_rule lists_rule = {
	.name = "lists", .version = 1, .params_bytes = 4, .job_bytes = 4,
	.shape = lists_shape,
};

/* List (slot 1, layer 1, head 1)'s three positions written where the
 * rule's header says, in the half cur (1) of its record, decoys in the
 * other half and in head 0's place, then read back. */
static void read_back(struct tenant *t, uint32_t rec, uint32_t *at,
                      uint32_t *other, uint32_t *head0)
{
	const uint32_t want[3] = {3, 8, 21};
	t->attn.cur[rec] = 1;
	for (int k = 0; k < 3; k++) {
		at[k] = want[k];
		other[k] = 100 + k;
		if (head0 && head0 != at)
			head0[k] = 200 + k;
	}
	uint32_t got[3] = {0};
	T_OK(tenant_attn_read_pos(t, 1, 1, 1, 3, got));
	T_ASSERT(!memcmp(got, want, sizeof(want)));
	T_OK(tenant_attn_read_pos(t, 1, 1, 1, 0, NULL)); /* nothing read */
}

/* Where the rule's state holds the positions (policy_dev_shape.positions)
 * the tenant keeps no host copy (tenant_dpos) and reads a list's back from
 * the half its record is in, at the place each rule's header gives
 * (h2o_rule.h: (r * 2 + h) * cap * (1 + G) words, a record a list;
 * tova_rule.h: (r * 2 + h) * cap, one array for the layer's lists; a
 * layer's lists in one record, fastkvzip_rule.h's layout); a rule that
 * does not say so keeps them on the host. */
TEST(tenant, attn_positions_read_back_where_the_rule_keeps_them)
{
	struct kvt_backend_ops o = fake_ops();
	o.copy = fake_copy;
	struct tenant t;
	char err[256];
	const uint32_t cap = 32, nkv = 2, G = 2, nl = 2;
	/* h2o: records n_kv a (slot, layer), list 1's of slot 1 layer 1 */
	fake = (struct kvt_backend_rule){"h2o", H2O_RULE_VERSION,
	                                 sizeof(struct h2o_rule),
	                                 sizeof(struct h2o_rule_job), fake_run};
	have_rule = 1;
	T_OK(init("h2o", &o, &t, err, sizeof(err)));
	T_ASSERT(tenant_dpos(&t));
	uint32_t *st = t.attn.state, r = (1 * nl + 1) * nkv + 1;
	read_back(&t, r, st + (r * 2 + 1) * cap * (1 + G),
	          st + (r * 2 + 0) * cap * (1 + G), NULL);
	tenant_done(&t);
	/* tova: one record a (slot, layer), head 1 reads the layer's array */
	fake = (struct kvt_backend_rule){"tova", TOVA_RULE_VERSION,
	                                 sizeof(struct tova_rule),
	                                 sizeof(struct tova_rule_job), fake_run};
	T_OK(init("tova", &o, &t, err, sizeof(err)));
	T_ASSERT(tenant_dpos(&t));
	st = t.attn.state;
	r = 1 * nl + 1;
	read_back(&t, r, st + (r * 2 + 1) * cap, st + (r * 2 + 0) * cap, NULL);
	tenant_done(&t);
	/* a layer's lists in one record: head 1's after head 0's */
	struct policy_ops ops;
	fake = (struct kvt_backend_rule){"lists", 1, 4, 4, fake_run};
	T_OK(init_rule(&o, &t, &ops, &lists_rule));
	T_ASSERT(tenant_dpos(&t));
	st = t.attn.state;
	r = 1 * nl + 1;
	read_back(&t, r, st + ((r * 2 + 1) * nkv + 1) * cap * 2,
	          st + ((r * 2 + 0) * nkv + 1) * cap * 2,
	          st + ((r * 2 + 1) * nkv + 0) * cap * 2);
	tenant_done(&t);
	/* a rule that does not hold them: the host keeps its copy */
	fake = (struct kvt_backend_rule){"any", 7, 12, 20, fake_run};
	upload_fails = 0;
	T_OK(init_any(&o, &t, &ops));
	T_ASSERT(t.attn.state != NULL && !tenant_dpos(&t));
	tenant_done(&t);
}
