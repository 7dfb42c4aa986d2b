/*
 * test_cuda_rules.c — the cuda backend's device rules by name (the ops'
 * rule member, backend_cuda.cu's BC_RULES): "h2o", "tova", "kvpop",
 * "snapkv", "expected_attention", "streaming", "knorm", "random", "kvzap"
 * and "fastkvzip" are there with
 * the layout version and the params and job sizes of their headers
 * (policies/<name>_rule.h: what the daemon checks before it runs one),
 * and run; any other name, NULL included, has none.  Needs no device.
 * Built into kvtrim-cuda-tests and, under the CPU emulator,
 * kvtrim-cuda-emu-tests.
 */
#include <stddef.h>
#include <string.h>

#include "backend.h"
#include "expected_attention_rule.h"
#include "fastkvzip_rule.h"
#include "h2o_rule.h"
#include "knorm_rule.h"
#include "kvpop_rule.h"
#include "kvzap_rule.h"
#include "random_rule.h"
#include "snapkv_rule.h"
#include "streaming_rule.h"
#include "test.h"
#include "tova_rule.h"

extern const struct kvt_backend_ops kvt_cuda_backend_v1;

TEST(cuda, backend_rules_by_name)
{
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	T_EQ(o->abi, KVT_BACKEND_ABI);
	T_ASSERT(o->rule != NULL);
	const struct {
		const char *name;
		uint32_t version;
		size_t params, job;
	} want[] = {
		{"h2o", H2O_RULE_VERSION, sizeof(struct h2o_rule),
		 sizeof(struct h2o_rule_job)},
		{"tova", TOVA_RULE_VERSION, sizeof(struct tova_rule),
		 sizeof(struct tova_rule_job)},
		{"kvpop", KVPOP_RULE_VERSION, sizeof(struct kvpop_rule),
		 sizeof(struct kvpop_rule_job)},
		{"kvzap", KVZAP_RULE_VERSION, sizeof(struct kvzap_rule),
		 sizeof(struct kvzap_rule_job)},
		{"fastkvzip", FASTKVZIP_RULE_VERSION,
		 sizeof(struct fastkvzip_rule),
		 sizeof(struct fastkvzip_rule_job)},
		{"snapkv", SNAPKV_RULE_VERSION, sizeof(struct snapkv_rule),
		 sizeof(struct snapkv_rule_job)},
		{"expected_attention", EXPECTED_ATTENTION_RULE_VERSION,
		 sizeof(struct expected_attention_rule),
		 sizeof(struct expected_attention_rule_job)},
		{"streaming", STREAMING_RULE_VERSION,
		 sizeof(struct streaming_rule),
		 sizeof(struct streaming_rule_job)},
		{"knorm", KNORM_RULE_VERSION, sizeof(struct knorm_rule),
		 sizeof(struct knorm_rule_job)},
		{"random", RANDOM_RULE_VERSION, sizeof(struct random_rule),
		 sizeof(struct random_rule_job)},
	};
	for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++) {
		const struct kvt_backend_rule *r = o->rule(want[k].name);
		T_ASSERT(r != NULL);
		T_EQ_STR(r->name, want[k].name);
		T_EQ(r->version, want[k].version);
		T_EQ(r->params_bytes, want[k].params);
		T_EQ(r->job_bytes, want[k].job);
		T_ASSERT(r->run != NULL);
		T_ASSERT(o->rule(want[k].name) == r); /* the same, static */
	}
	/* observed_attention runs "h2o", pyramidkv "snapkv"; no rule of
	 * their own */
	const char *none[] = {"observed_attention", "pyramidkv", "H2O", "h2o ",
	                      "", "x"};
	for (size_t k = 0; k < sizeof(none) / sizeof(none[0]); k++)
		T_ASSERT(o->rule(none[k]) == NULL);
	T_ASSERT(o->rule(NULL) == NULL);
}

/* A rule with nothing to do does nothing (no context needed), and bad
 * arguments are refused before any device work: NULL params, jobs or
 * geometry. */
TEST(cuda, backend_rules_refuse_null_arguments)
{
	const struct kvt_backend_ops *o = &kvt_cuda_backend_v1;
	const struct kvt_backend_rule_geom g = {KVT_DTYPE_F32, 4, 2, 8};
	const char *names[] = {"h2o", "tova", "kvpop", "snapkv",
	                       "expected_attention",
	                       "streaming", "knorm", "random",
	                       "kvzap", "fastkvzip"};
	const struct kvt_backend_paged pg = {0};
	uint32_t out[4];
	char params[256] = {0}, jobs[256] = {0};
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		const struct kvt_backend_rule *r = o->rule(names[k]);
		T_ASSERT(r && r->params_bytes <= sizeof(params) &&
		         r->job_bytes <= sizeof(jobs));
		T_OK(r->run(NULL, &pg, 1, &g, params, jobs, 0, out, 4, NULL));
		T_EQ(r->run(NULL, &pg, 1, &g, NULL, jobs, 1, out, 4, NULL),
		     KVT_EINVAL);
		T_EQ(r->run(NULL, &pg, 1, &g, params, NULL, 1, out, 4, NULL),
		     KVT_EINVAL);
		T_EQ(r->run(NULL, &pg, 1, NULL, params, jobs, 1, out, 4, NULL),
		     KVT_EINVAL);
		T_ASSERT(strstr(o->last_error(), names[k]) != NULL);
	}
}
