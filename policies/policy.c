/*
 * policy.c — the policy registry, the spec parser and the machinery every
 * policy shares (sinks, recent window, budgets); see policy.h.
 */
#include "policy.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each policy file exports its ops; a new policy adds one line here and one
 * to registry[]. */
extern const struct policy_ops full_ops;
extern const struct policy_ops streaming_ops;

static const struct policy_ops *const registry[] = {
	&full_ops,
	&streaming_ops,
};

#define N_POLICIES (sizeof(registry) / sizeof(registry[0]))

size_t policy_count(void)
{
	return N_POLICIES;
}

const struct policy_ops *policy_at(size_t i)
{
	return i < N_POLICIES ? registry[i] : NULL;
}

static int refuse(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int refuse(char *err, size_t errlen, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return KVT_EPOLICY;
}

/* The common keys, in the bit order of enum policy_key. */
static const struct {
	const char *name;
	unsigned bit;
} common_keys[] = {
	{"sinks", POLICY_KEY_SINKS},
	{"window", POLICY_KEY_WINDOW},
	{"tokens", POLICY_KEY_TOKENS},
	{"ratio", POLICY_KEY_RATIO},
};

/* Decimal digits only (no sign, no spaces), fitting in uint32. */
static int parse_u32(const char *s, size_t n, uint32_t *out)
{
	uint64_t v = 0;
	if (!n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (uint64_t)(s[i] - '0');
		if (v > UINT32_MAX)
			return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/*
 * A plain decimal fraction: digits, at most one '.', optional exponent; it
 * must start with a digit or '.' (no sign, no "nan"/"inf", no hex floats).
 */
static int parse_ratio(const char *s, size_t n, double *out)
{
	char buf[64];
	if (!n || n >= sizeof(buf))
		return -1;
	if (!isdigit((unsigned char)s[0]) && s[0] != '.')
		return -1;
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char)s[i]) && !strchr(".eE+-", s[i]))
			return -1;
	memcpy(buf, s, n);
	buf[n] = '\0';
	char *end = NULL;
	errno = 0;
	double v = strtod(buf, &end);
	if (errno || end != buf + n || !isfinite(v))
		return -1;
	*out = v;
	return 0;
}

static const struct policy_ops *find_ops(const char *name, size_t n)
{
	for (size_t i = 0; i < N_POLICIES; i++)
		if (strlen(registry[i]->name) == n &&
		    !memcmp(registry[i]->name, name, n))
			return registry[i];
	return NULL;
}

static int unknown_policy(const char *name, size_t n, char *err,
                          size_t errlen)
{
	char known[KVT_ERRTEXT_MAX] = "";
	size_t off = 0;
	for (size_t i = 0; i < N_POLICIES && off < sizeof(known); i++)
		off += (size_t)snprintf(known + off, sizeof(known) - off,
		                        "%s%s", i ? ", " : "",
		                        registry[i]->name);
	return refuse(err, errlen, "unknown policy '%.*s' (known: %s)",
	              (int)(n > 64 ? 64 : n), name, known);
}

/* Parses one "key=value" of length n into a. */
static int parse_kv(const struct policy_ops *ops, const char *s, size_t n,
                    struct policy_args *a, char *err, size_t errlen)
{
	const char *eq = memchr(s, '=', n);
	if (!n)
		return refuse(err, errlen, "%s: empty key=value (stray ',')",
		              ops->name);
	if (!eq || eq == s)
		return refuse(err, errlen, "%s: expected key=value, got '%.*s'",
		              ops->name, (int)n, s);
	size_t kn = (size_t)(eq - s);
	const char *v = eq + 1;
	size_t vn = n - kn - 1;

	unsigned bit = 0;
	for (size_t i = 0; i < sizeof(common_keys) / sizeof(common_keys[0]);
	     i++)
		if (strlen(common_keys[i].name) == kn &&
		    !memcmp(common_keys[i].name, s, kn))
			bit = common_keys[i].bit;
	if (!bit)
		return refuse(err, errlen, "%s: unknown key '%.*s'", ops->name,
		              (int)kn, s);
	if (!(ops->keys & bit))
		return refuse(err, errlen, "%s: key '%.*s' not accepted by "
		              "this policy", ops->name, (int)kn, s);
	if (a->set & bit)
		return refuse(err, errlen, "%s: key '%.*s' given twice",
		              ops->name, (int)kn, s);
	if (!vn)
		return refuse(err, errlen, "%s: key '%.*s' has no value",
		              ops->name, (int)kn, s);

	int bad = 0;
	switch (bit) {
	case POLICY_KEY_SINKS:
		bad = parse_u32(v, vn, &a->sinks);
		break;
	case POLICY_KEY_WINDOW:
		bad = parse_u32(v, vn, &a->window);
		break;
	case POLICY_KEY_TOKENS:
		bad = parse_u32(v, vn, &a->tokens);
		if (!bad && a->tokens < 1)
			return refuse(err, errlen, "%s: tokens must be >= 1",
			              ops->name);
		break;
	case POLICY_KEY_RATIO:
		bad = parse_ratio(v, vn, &a->ratio);
		if (!bad && !(a->ratio >= 0.0 && a->ratio < 1.0))
			return refuse(err, errlen,
			              "%s: ratio must be in [0, 1), got '%.*s'",
			              ops->name, (int)vn, v);
		break;
	}
	if (bad)
		return refuse(err, errlen,
		              "%s: bad value '%.*s' for '%.*s' (%s)", ops->name,
		              (int)vn, v, (int)kn, s,
		              bit == POLICY_KEY_RATIO ? "a decimal number"
		                                      : "a decimal uint32");
	a->set |= bit;
	return 0;
}

int policy_create(const char *spec, struct policy **out, char *err,
                  size_t errlen)
{
	*out = NULL;
	if (!spec || !*spec)
		return refuse(err, errlen, "empty policy spec");
	size_t len = strnlen(spec, KVT_SPEC_MAX);
	if (len >= KVT_SPEC_MAX)
		return refuse(err, errlen, "policy spec longer than %d bytes",
		              KVT_SPEC_MAX - 1);
	for (size_t i = 0; i < len; i++)
		if (isspace((unsigned char)spec[i]) ||
		    !isprint((unsigned char)spec[i]))
			return refuse(err, errlen,
			              "policy spec must not contain whitespace "
			              "or control characters");

	const char *colon = strchr(spec, ':');
	size_t nlen = colon ? (size_t)(colon - spec) : len;
	const struct policy_ops *ops = find_ops(spec, nlen);
	if (!ops)
		return unknown_policy(spec, nlen, err, errlen);

	struct policy_args a;
	memset(&a, 0, sizeof(a));
	if (colon) {
		const char *s = colon + 1;
		const char *end = spec + len;
		if (s == end)
			return refuse(err, errlen, "%s: empty key list after ':'",
			              ops->name);
		for (;;) {
			const char *comma = memchr(s, ',', (size_t)(end - s));
			const char *stop = comma ? comma : end;
			int rc = parse_kv(ops, s, (size_t)(stop - s), &a, err,
			                  errlen);
			if (rc)
				return rc;
			if (!comma)
				break;
			s = comma + 1;
			if (s == end)
				return refuse(err, errlen, "%s: trailing ','",
				              ops->name);
		}
	}

	struct policy *p = calloc(1, sizeof(*p));
	if (!p)
		return KVT_ENOMEM;
	p->ops = ops;
	p->args = a;
	memcpy(p->spec, spec, len + 1);
	if (ops->init) {
		char why[KVT_ERRTEXT_MAX] = "";
		int rc = ops->init(p, why, sizeof(why));
		if (rc) {
			free(p);
			if (rc == KVT_EPOLICY)
				return refuse(err, errlen, "%s", why);
			if (err && errlen)
				snprintf(err, errlen, "%s", why);
			return rc;
		}
	}
	*out = p;
	return 0;
}

void policy_free(struct policy *p)
{
	free(p);
}

uint32_t policy_decide(const struct policy *p, const struct policy_list *l,
                       uint8_t *drop)
{
	if (!p->ops->decide || !l->len)
		return 0;
	return p->ops->decide(p, l, drop);
}

int policy_protected(const struct policy_args *a, uint32_t pos,
                     uint32_t n_seen)
{
	if (pos < a->sinks)
		return 1;
	/* The window covers [n_seen - window, n_seen); all of it when
	 * fewer than window tokens were seen. */
	return a->window && pos + (uint64_t)a->window >= n_seen;
}

uint32_t policy_budget(const struct policy_args *a, uint32_t n_seen)
{
	/* tokens is >= 1 whenever it was given or defaulted by init(), so 0
	 * means "no token budget". */
	if (a->tokens)
		return a->tokens;
	if (a->set & POLICY_KEY_RATIO) {
		/* kvpress: keep n - floor(R * n), computed in double; the
		 * product is in [0, n_seen], where truncation is floor. */
		uint32_t ev = (uint32_t)(a->ratio * (double)n_seen);
		if (ev > n_seen)
			ev = n_seen;
		return n_seen - ev;
	}
	return UINT32_MAX;
}
