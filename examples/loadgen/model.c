/*
 * model.c — loadgen's own model of the policies it can verify without
 * their code (full, streaming): which positions a list must still hold.
 * Written from the policies' documented rules, never from the daemon's
 * policy code, so a bug the daemon and its checker share cannot hide.
 */
#include "loadgen.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Is spec ("name[:args]") the policy `name`? */
int model_policy_is(const char *spec, const char *name)
{
	size_t n = strcspn(spec, ":");
	return n == strlen(name) && !strncmp(spec, name, n);
}

/*
 * Parses the policy spec into a model.  0, or -1 with the reason in why
 * when loadgen has no model for it.
 */
int model_parse(const char *spec, struct model *m, char *why, size_t len)
{
	memset(m, 0, sizeof(*m));
	const char *colon = strchr(spec, ':');
	if (model_policy_is(spec, "full")) {
		m->kind = MODEL_FULL;
		return 0;
	}
	if (!model_policy_is(spec, "streaming"))
		return 1; /* verified by replaying the policy code */
	m->kind = MODEL_STREAMING;
	m->sinks = 4;
	char args[KVT_SPEC_MAX];
	snprintf(args, sizeof(args), "%s", colon ? colon + 1 : "");
	char *save = NULL;
	for (char *kv = strtok_r(args, ",", &save); kv;
	     kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '=');
		char *end = NULL;
		if (!eq) {
			snprintf(why, len, "policy streaming: '%s' is not "
			         "key=value", kv);
			return -1;
		}
		*eq = '\0';
		const char *val = eq + 1;
		errno = 0;
		if (!strcmp(kv, "sinks")) {
			unsigned long long x = strtoull(val, &end, 10);
			if (errno || *end || x > UINT32_MAX)
				goto bad;
			m->sinks = (uint32_t)x;
		} else if (!strcmp(kv, "tokens")) {
			unsigned long long x = strtoull(val, &end, 10);
			if (errno || *end || x > UINT32_MAX)
				goto bad;
			m->tokens = (uint32_t)x;
			m->has_tokens = 1;
		} else if (!strcmp(kv, "ratio")) {
			double x = strtod(val, &end);
			if (errno || *end || !(x >= 0 && x < 1))
				goto bad;
			m->ratio = x;
			m->has_ratio = 1;
		} else {
			snprintf(why, len, "policy streaming with key %s has "
			         "no model", kv);
			return -1;
		}
		continue;
bad:
		snprintf(why, len, "policy streaming: bad value %s=%s", kv,
		         val);
		return -1;
	}
	if (!m->has_tokens && !m->has_ratio) {
		m->tokens = 256;
		m->has_tokens = 1;
	}
	return 0;
}

/* Does a list that has seen n_seen tokens keep position pos? */
static int model_keeps(const struct model *m, uint32_t n_seen, uint32_t pos)
{
	if (m->kind == MODEL_FULL)
		return 1;
	/* Both budgets given: each is a cap, so the tighter one wins. */
	uint64_t b = UINT64_MAX;
	if (m->has_tokens)
		b = m->tokens;
	if (m->has_ratio) {
		uint64_t br = n_seen - (uint64_t)floor(m->ratio * n_seen);
		if (br < b)
			b = br;
	}
	if (n_seen <= b)
		return 1;
	uint64_t s = m->sinks < b ? m->sinks : b;
	uint64_t recent = b - s;
	return pos < s || (uint64_t)pos >= n_seen - recent;
}

/*
 * Advances the model to n_seen tokens.  Eviction is final, so what the
 * daemon must hold is the history of decisions, not one rule applied to
 * n_seen: a position dropped under an earlier, tighter budget (a ratio
 * budget can grow again) stays dropped.
 */
void model_advance(uint8_t *alive, uint32_t *alive_seen,
                   const struct model *m, uint32_t n_seen)
{
	for (uint32_t p = 0; p < n_seen; p++) {
		int keep = model_keeps(m, n_seen, p);
		alive[p] = p < *alive_seen ? (uint8_t)(alive[p] && keep)
		                           : (uint8_t)keep;
	}
	*alive_seen = n_seen;
}
