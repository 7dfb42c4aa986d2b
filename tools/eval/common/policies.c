/*
 * policies.c — the jobs of every program: one policy at one budget
 * (eval_add_job), with the specs the programs share (the ratio policies,
 * fastkvzip, kvpop), and which policies bound the others in the tables.
 */
#include "eval.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../../train/recipe.h"
#include "model.h"
#include "policy.h"

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

/* The budget clause of a spec: "tokens=B" when tokens > 0, else
 * "ratio=Rs". */
static void budget_clause(char *b, size_t len, double Rs, uint32_t tokens)
{
	if (tokens)
		snprintf(b, len, "tokens=%u", tokens);
	else
		snprintf(b, len, "ratio=%.4f", Rs);
}

void eval_add_budget_jobs(struct job *jobs, uint32_t *n, const struct model *M,
                          unsigned in, double R, double Rs, uint32_t tokens)
{
	char b[48];
	budget_clause(b, sizeof(b), Rs, tokens);
	const float theta = M->cfg.rope_theta ? M->cfg.rope_theta
	                                      : MODEL_ROPE_THETA;
	for (size_t i = 0; i < policy_count(); i++) {
		const struct policy_ops *ops = policy_at(i);
		if (!ops->eval.spec || !(ops->eval.in & in))
			continue;
		char s[KVT_SPEC_MAX];
		int k = snprintf(s, sizeof(s), ops->eval.spec, b);
		/* the daemon is not told the model's RoPE base */
		if (ops->keys & POLICY_KEY_THETA && k > 0 &&
		    (size_t)k < sizeof(s))
			snprintf(s + k, sizeof(s) - (size_t)k, ",theta=%g",
			         (double)theta);
		eval_add_job(jobs, n, ops->name, R, J_DAEMON, s, NULL, NULL);
	}
}

void eval_add_fastkvzip(struct job *jobs, uint32_t *n, const char *wabs,
                        double R, double Rs, uint32_t tokens, uint32_t every)
{
	char s[KVT_SPEC_MAX], b[48];
	budget_clause(b, sizeof(b), Rs, tokens);
	snprintf(s, sizeof(s), "fastkvzip:model=%s/fastkvzip.safetensors,"
	         "%s,window=16,sinks=4,every=%u", wabs, b, every);
	eval_add_job(jobs, n, "fastkvzip", R, J_DAEMON, s, NULL, NULL);
}

void eval_kvpop_spec(char *s, size_t len, const char *wabs, uint32_t tokens)
{
	/* kvpop's defaults for the window and the memory (policies/kvpop.c),
	 * written out so that the specs files name them */
	const uint32_t win = policy_kvpop_window(tokens);
	snprintf(s, len, "kvpop:model=%s/kvpop.safetensors,tokens=%u,delay=%u,"
	         "sinks=4,window=%u,memory=0,trust=0", wabs, tokens,
	         RECIPE_KVPOP_DELAY, win);
}

int eval_in_list(const char *list, const char *name)
{
	const size_t len = strlen(name);
	for (const char *p = list; p && *p;) {
		const char *c = strchr(p, ',');
		const size_t pl = c ? (size_t)(c - p) : strlen(p);
		if (pl == len && !strncmp(p, name, len))
			return 1;
		p = c ? c + 1 : NULL;
	}
	return 0;
}

uint32_t eval_only_jobs(struct job *jobs, uint32_t n, const char *list)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < n; i++)
		if (eval_in_list(list, jobs[i].name)) {
			if (k != i)
				jobs[k] = jobs[i];
			k++;
		}
	if (!k)
		eval_die("--only %s: no job of those names", list);
	return k;
}

int eval_is_bound(const char *p)
{
	return !strcmp(p, "full") || !strcmp(p, "random") ||
	       !strcmp(p, "kvzip") || !strcmp(p, "oracle");
}

/* The order: full and the ratio policies (the registry's policies without
 * weights, in its order), then the learned ones (kvzap as its two
 * scorers), then the in-process bounds. */
static const char *order[64];
static size_t norder;
static pthread_once_t order_once = PTHREAD_ONCE_INIT;

static void build_order(void)
{
	for (int learned = 0; learned < 2; learned++)
		for (size_t i = 0; i < policy_count(); i++) {
			const struct policy_ops *ops = policy_at(i);
			if (!(ops->keys & POLICY_KEY_MODEL) != !learned)
				continue;
			if (!strcmp(ops->name, "kvzap")) {
				order[norder++] = kvzap_names[0];
				order[norder++] = kvzap_names[1];
			} else {
				order[norder++] = ops->name;
			}
		}
	order[norder++] = "kvzip";
	order[norder++] = "oracle";
}

size_t eval_policy_order(const char *const **names)
{
	pthread_once(&order_once, build_order);
	*names = order;
	return norder;
}
