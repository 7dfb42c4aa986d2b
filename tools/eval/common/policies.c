/*
 * policies.c — the jobs of every program: one policy at one budget
 * (eval_add_job), with the specs the programs share (the ratio policies,
 * fastkvzip, kvpop), and which policies bound the others in the tables.
 */
#include "eval.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../train/recipe.h"

struct job *eval_add_job(struct job *jobs, uint32_t *n, const char *name,
                         double R, enum jkind kind, const char *spec,
                         const char *spec_copy, const char *spec_needle)
{
	if (*n >= MAX_JOBS)
		eval_die("too many jobs");
	struct job *j = &jobs[(*n)++];
	memset(j, 0, sizeof(*j));
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->ratio = R;
	j->kind = kind;
	j->tau = NAN;
	const char *sp[C_NKIND] = {spec, spec_copy, spec_needle};
	for (int c = 0; c < C_NKIND; c++)
		snprintf(j->spec[c], sizeof(j->spec[c]), "%s",
		         sp[c] ? sp[c] : "");
	return j;
}

void eval_add_ratio_jobs(struct job *jobs, uint32_t *n,
                         const struct eval_ratio_policy *pol, size_t np,
                         double R, double Rs)
{
	char s[KVT_SPEC_MAX];
	for (size_t i = 0; i < np; i++) {
		snprintf(s, sizeof(s), pol[i].fmt, Rs);
		eval_add_job(jobs, n, pol[i].name, R, J_DAEMON, s, NULL, NULL);
	}
}

void eval_add_fastkvzip(struct job *jobs, uint32_t *n, const char *wabs,
                        double R, double Rs, uint32_t every)
{
	char s[KVT_SPEC_MAX];
	snprintf(s, sizeof(s), "fastkvzip:model=%s/fastkvzip.safetensors,"
	         "ratio=%.4f,window=16,sinks=4,every=%u", wabs, Rs, every);
	eval_add_job(jobs, n, "fastkvzip", R, J_DAEMON, s, NULL, NULL);
}

void eval_kvpop_spec(char *s, size_t len, const char *wabs, uint32_t tokens)
{
	snprintf(s, len, "kvpop:model=%s/kvpop.safetensors,tokens=%u,delay=%u,"
	         "sinks=4", wabs, tokens, RECIPE_KVPOP_DELAY);
}

int eval_is_bound(const char *p)
{
	return !strcmp(p, "full") || !strcmp(p, "random") ||
	       !strcmp(p, "kvzip") || !strcmp(p, "oracle");
}
