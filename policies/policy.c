/*
 * policy.c — the policy registry, the spec parser and the machinery every
 * policy shares (protection, budgets, pressure, timing, selection,
 * attention from staged queries, scratch arena); see policy.h.
 */
#include "errors.h"
#include "policy.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "shm.h"

/* Each policy file exports its ops; a new policy adds one line here and one
 * to registry[]. */
extern const struct policy_ops full_ops;
extern const struct policy_ops random_ops;
extern const struct policy_ops streaming_ops;
extern const struct policy_ops h2o_ops;
extern const struct policy_ops snapkv_ops;
extern const struct policy_ops tova_ops;
extern const struct policy_ops kvzap_ops;
extern const struct policy_ops fastkvzip_ops;
extern const struct policy_ops kvpop_ops;
extern const struct policy_ops knorm_ops;
extern const struct policy_ops expected_attention_ops;
extern const struct policy_ops pyramidkv_ops;
extern const struct policy_ops observed_attention_ops;

static const struct policy_ops *const registry[] = {
	&full_ops,  &random_ops, &streaming_ops,  &h2o_ops,   &snapkv_ops,
	&tova_ops,  &kvzap_ops,  &fastkvzip_ops,  &kvpop_ops, &knorm_ops,
	&expected_attention_ops, &pyramidkv_ops, &observed_attention_ops,
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

enum key_type {
	KT_U32, KT_U64, KT_RATIO, KT_FLOAT, KT_PATH, KT_AGG, KT_BOOL,
	KT_MEMORY /* a uint32 below UINT32_MAX, or "learned" */
};

/* The keys, in the bit order of enum policy_key. */
static const struct {
	const char *name;
	unsigned bit;
	enum key_type type;
	const char *what; /* for "bad value" messages */
	int min1;         /* 0 is refused: "<name> must be >= 1" */
} keys[] = {
	{"sinks", POLICY_KEY_SINKS, KT_U32, "a decimal uint32", 0},
	{"window", POLICY_KEY_WINDOW, KT_U32, "a decimal uint32", 0},
	{"tokens", POLICY_KEY_TOKENS, KT_U32, "a decimal uint32", 1},
	{"ratio", POLICY_KEY_RATIO, KT_RATIO, "a decimal number", 0},
	{"threshold", POLICY_KEY_THRESHOLD, KT_FLOAT, "a signed decimal", 0},
	{"every", POLICY_KEY_EVERY, KT_U32, "a decimal uint32", 1},
	{"delay", POLICY_KEY_DELAY, KT_U32, "a decimal uint32", 0},
	{"seed", POLICY_KEY_SEED, KT_U64, "a decimal uint64", 0},
	{"model", POLICY_KEY_MODEL, KT_PATH, "a path", 0},
	{"agg", POLICY_KEY_AGG, KT_AGG, "max or mean", 0},
	{"kernel", POLICY_KEY_KERNEL, KT_U32, "a decimal uint32", 0},
	{"beta", POLICY_KEY_BETA, KT_U32, "a decimal uint32", 1},
	{"future", POLICY_KEY_FUTURE, KT_U32, "a decimal uint32", 1},
	{"theta", POLICY_KEY_THETA, KT_RATIO, "a decimal number", 0},
	{"cov", POLICY_KEY_COV, KT_BOOL, "0 or 1", 0},
	{"vnorm", POLICY_KEY_VNORM, KT_BOOL, "0 or 1", 0},
	{"eps", POLICY_KEY_EPS, KT_RATIO, "a decimal number", 0},
	{"memory", POLICY_KEY_MEMORY, KT_MEMORY,
	 "a decimal uint32 or learned", 0},
	{"trust", POLICY_KEY_TRUST, KT_U32, "a decimal uint32", 0},
};

/* Decimal digits only (no sign, no spaces), at most max. */
static int parse_uint(const char *s, size_t n, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	if (!n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		unsigned d = (unsigned)(s[i] - '0');
		if (v > (max - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/*
 * A plain decimal: digits, at most one '.', optional exponent; it must
 * start with a digit or '.' (no sign, no "nan"/"inf", no hex floats).
 */
static int parse_decimal(const char *s, size_t n, double *out)
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
	return errors_fmt(err, errlen, KVT_EPOLICY, "unknown policy '%.*s' (known: %s)",
	              (int)(n > 64 ? 64 : n), name, known);
}

/* Parses one value of key k into a; 0, -1 (malformed) or KVT_EPOLICY. */
static int parse_value(const struct policy_ops *ops, size_t k, const char *v,
                       size_t vn, struct policy_args *a, char *err,
                       size_t errlen)
{
	uint64_t u = 0;
	double d = 0;
	switch (keys[k].type) {
	case KT_U32:
		if (parse_uint(v, vn, UINT32_MAX, &u))
			return -1;
		break;
	case KT_U64:
		if (parse_uint(v, vn, UINT64_MAX, &u))
			return -1;
		break;
	case KT_MEMORY:
		if (vn == 7 && !memcmp(v, "learned", 7))
			u = POLICY_MEMORY_LEARNED;
		else if (parse_uint(v, vn, POLICY_MEMORY_LEARNED - 1, &u))
			return -1;
		break;
	case KT_RATIO:
		if (parse_decimal(v, vn, &d))
			return -1;
		break;
	case KT_FLOAT: {
		int neg = vn && v[0] == '-';
		if (parse_decimal(v + neg, vn - (size_t)neg, &d) ||
		    !isfinite((float)d))
			return -1;
		d = neg ? -d : d;
		break;
	}
	case KT_PATH:
		if (vn >= sizeof(a->model))
			return -1;
		break;
	case KT_AGG:
		if (vn == 3 && !memcmp(v, "max", 3))
			u = POLICY_AGG_MAX;
		else if (vn == 4 && !memcmp(v, "mean", 4))
			u = POLICY_AGG_MEAN;
		else
			return -1;
		break;
	case KT_BOOL:
		if (vn != 1 || (v[0] != '0' && v[0] != '1'))
			return -1;
		u = (uint64_t)(v[0] - '0');
		break;
	}
	if (keys[k].min1 && u < 1)
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: %s must be >= 1",
		                  ops->name, keys[k].name);
	switch (keys[k].bit) {
	case POLICY_KEY_SINKS:
		a->sinks = (uint32_t)u;
		break;
	case POLICY_KEY_WINDOW:
		a->window = (uint32_t)u;
		break;
	case POLICY_KEY_TOKENS:
		a->tokens = (uint32_t)u;
		break;
	case POLICY_KEY_RATIO:
		if (!(d >= 0.0 && d < 1.0))
			return errors_fmt(err, errlen, KVT_EPOLICY,
			              "%s: ratio must be in [0, 1), got '%.*s'",
			              ops->name, (int)vn, v);
		a->ratio = d;
		break;
	case POLICY_KEY_THRESHOLD:
		a->threshold = (float)d;
		break;
	case POLICY_KEY_EVERY:
		a->every = (uint32_t)u;
		break;
	case POLICY_KEY_DELAY:
		a->delay = (uint32_t)u;
		break;
	case POLICY_KEY_SEED:
		a->seed = u;
		break;
	case POLICY_KEY_MODEL:
		memcpy(a->model, v, vn);
		a->model[vn] = '\0';
		break;
	case POLICY_KEY_AGG:
		a->agg = (enum policy_agg)u;
		break;
	case POLICY_KEY_KERNEL:
		if (u < 1 || u % 2 == 0)
			return errors_fmt(err, errlen, KVT_EPOLICY, "%s: kernel must be odd and "
			              ">= 1, got %llu", ops->name,
			              (unsigned long long)u);
		a->kernel = (uint32_t)u;
		break;
	case POLICY_KEY_BETA:
		a->beta = (uint32_t)u;
		break;
	case POLICY_KEY_FUTURE:
		a->future = (uint32_t)u;
		break;
	case POLICY_KEY_MEMORY:
		a->memory = (uint32_t)u;
		break;
	case POLICY_KEY_TRUST:
		a->trust = (uint32_t)u;
		break;
	case POLICY_KEY_THETA:
		if (!(d > 0.0))
			return errors_fmt(err, errlen, KVT_EPOLICY, "%s: theta must be > 0, "
			              "got '%.*s'", ops->name, (int)vn, v);
		a->theta = d;
		break;
	case POLICY_KEY_COV:
		a->cov = (uint8_t)u;
		break;
	case POLICY_KEY_VNORM:
		a->vnorm = (uint8_t)u;
		break;
	case POLICY_KEY_EPS:
		a->eps = d;
		break;
	}
	return 0;
}

/* Parses one "key=value" of length n into a. */
static int parse_kv(const struct policy_ops *ops, const char *s, size_t n,
                    struct policy_args *a, char *err, size_t errlen)
{
	const char *eq = memchr(s, '=', n);
	if (!n)
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: empty key=value (stray ',')",
		              ops->name);
	if (!eq || eq == s)
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: expected key=value, got '%.*s'",
		              ops->name, (int)n, s);
	size_t kn = (size_t)(eq - s);
	const char *v = eq + 1;
	size_t vn = n - kn - 1;

	size_t k = 0;
	for (; k < sizeof(keys) / sizeof(keys[0]); k++)
		if (strlen(keys[k].name) == kn && !memcmp(keys[k].name, s, kn))
			break;
	if (k == sizeof(keys) / sizeof(keys[0]))
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: unknown key '%.*s'", ops->name,
		              (int)kn, s);
	unsigned bit = keys[k].bit;
	if (!(ops->keys & bit))
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: key '%.*s' not accepted by "
		              "this policy", ops->name, (int)kn, s);
	if (a->set & bit)
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: key '%.*s' given twice",
		              ops->name, (int)kn, s);
	if (!vn)
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: key '%.*s' has no value",
		              ops->name, (int)kn, s);
	int rc = parse_value(ops, k, v, vn, a, err, errlen);
	if (rc == -1)
		return errors_fmt(err, errlen, KVT_EPOLICY,
		              "%s: bad value '%.*s' for '%.*s' (%s)", ops->name,
		              (int)vn, v, (int)kn, s, keys[k].what);
	if (rc)
		return rc;
	a->set |= bit;
	return 0;
}

/* Budget keys are exclusive: one of tokens, ratio, threshold. */
static int check_budget_keys(const struct policy_ops *ops,
                             struct policy_args *a, char *err, size_t errlen)
{
	unsigned b = a->set & (POLICY_KEY_TOKENS | POLICY_KEY_RATIO |
	                       POLICY_KEY_THRESHOLD);
	if (b & (b - 1))
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: give one of tokens, ratio, "
		              "threshold", ops->name);
	return 0;
}

static int geom_ok(const struct policy_geom *g)
{
	return g && g->n_layers && g->n_heads && g->n_kv_heads &&
	       g->head_dim && g->d_model && g->page_tokens &&
	       g->n_heads % g->n_kv_heads == 0 && kvt_dtype_size(g->dtype);
}

int policy_create(const char *spec, const struct policy_geom *geom,
                  struct policy **out, char *err, size_t errlen)
{
	*out = NULL;
	if (!spec || !*spec)
		return errors_fmt(err, errlen, KVT_EPOLICY, "empty policy spec");
	size_t len = strnlen(spec, KVT_SPEC_MAX);
	if (len >= KVT_SPEC_MAX)
		return errors_fmt(err, errlen, KVT_EPOLICY, "policy spec longer than %d bytes",
		              KVT_SPEC_MAX - 1);
	for (size_t i = 0; i < len; i++)
		if (isspace((unsigned char)spec[i]) ||
		    !isprint((unsigned char)spec[i]))
			return errors_fmt(err, errlen, KVT_EPOLICY,
			              "policy spec must not contain whitespace "
			              "or control characters");

	const char *colon = strchr(spec, ':');
	size_t nlen = colon ? (size_t)(colon - spec) : len;
	const struct policy_ops *ops = find_ops(spec, nlen);
	if (!ops)
		return unknown_policy(spec, nlen, err, errlen);
	if (!geom_ok(geom))
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: invalid model geometry",
		              ops->name);

	struct policy_args a;
	memset(&a, 0, sizeof(a));
	if (colon) {
		const char *s = colon + 1;
		const char *end = spec + len;
		if (s == end)
			return errors_fmt(err, errlen, KVT_EPOLICY, "%s: empty key list after ':'",
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
				return errors_fmt(err, errlen, KVT_EPOLICY, "%s: trailing ','",
				              ops->name);
		}
	}
	int rc = check_budget_keys(ops, &a, err, errlen);
	if (rc)
		return rc;

	struct policy *p = calloc(1, sizeof(*p));
	if (!p)
		return KVT_ENOMEM;
	p->ops = ops;
	p->args = a;
	p->geom = *geom;
	memcpy(p->spec, spec, len + 1);
	if (ops->init) {
		char why[KVT_ERRTEXT_MAX] = "";
		rc = ops->init(p, why, sizeof(why));
		if (rc) {
			policy_free(p);
			if (rc == KVT_EPOLICY)
				return errors_fmt(err, errlen, KVT_EPOLICY, "%s", why);
			if (err && errlen)
				snprintf(err, errlen, "%s", why);
			return rc;
		}
	}
	*out = p;
	return 0;
}

/* ------------------------------------------------------------ scratch */

struct policy_block {
	struct policy_block *next;
	size_t cap, used;
};

/* Data starts one cache line after the block header. */
#define BLOCK_HDR 64u

static void free_blocks(struct policy *p)
{
	while (p->blocks) {
		struct policy_block *b = p->blocks;
		p->blocks = b->next;
		free(b);
	}
}

static struct policy_block *block_new(size_t cap)
{
	struct policy_block *b = aligned_alloc(64, BLOCK_HDR + cap);
	if (b) {
		b->next = NULL;
		b->cap = cap;
		b->used = 0;
	}
	return b;
}

/* Start of a decide(): one block big enough for the largest call seen. */
static void scratch_reset(struct policy *p)
{
	if (p->blocks && p->blocks->next) {
		free_blocks(p);
		p->blocks = block_new(p->scratch_peak);
	}
	if (p->blocks)
		p->blocks->used = 0;
	p->scratch_used = 0;
}

void *policy_scratch(struct policy *p, size_t bytes)
{
	bytes = (bytes + 63) & ~(size_t)63;
	if (!bytes)
		bytes = 64;
	struct policy_block *b = p->blocks;
	if (!b || b->cap - b->used < bytes) {
		size_t cap = b ? 2 * b->cap : 1u << 16;
		if (cap < bytes)
			cap = bytes;
		struct policy_block *nb = block_new(cap);
		if (!nb)
			return NULL;
		nb->next = b;
		p->blocks = b = nb;
	}
	void *r = (char *)b + BLOCK_HDR + b->used;
	b->used += bytes;
	p->scratch_used += bytes;
	if (p->scratch_used > p->scratch_peak)
		p->scratch_peak = p->scratch_used;
	return r;
}

void policy_free(struct policy *p)
{
	if (!p)
		return;
	if (p->ops->fini)
		p->ops->fini(p);
	free_blocks(p);
	free(p);
}

/* ------------------------------------------------------------ decisions */

void policy_set_pressure(struct policy *p, float level)
{
	if (!(level > 0.0f)) /* NaN too */
		level = 0.0f;
	if (level > 1.0f)
		level = 1.0f;
	p->pressure = level;
}

/* ------------------------------------------------------------ inputs */

float policy_unstaged(void)
{
	uint32_t b = POLICY_UNSTAGED_BITS;
	float f;
	memcpy(&f, &b, sizeof(f));
	return f;
}

/*
 * Checks rows [n][width] (stride apart) of one input (x, q or lse) of
 * positions pos0..: 0, or KVT_EINVAL with p->why.  unit: floats per query
 * head (q: head_dim, lse: 1), 0 for x (named by element).
 */
static int check_input(struct policy *p, const char *name, const float *v,
                       uint32_t n, size_t width, size_t stride,
                       uint32_t unit, uint32_t layer, uint32_t pos0)
{
	for (uint32_t t = 0; t < n; t++) {
		const float *r = v + (size_t)t * stride;
		for (size_t i = 0; i < width; i++) {
			if (isfinite(r[i]))
				continue;
			uint32_t bits;
			memcpy(&bits, &r[i], sizeof(bits));
			int unstaged = bits == POLICY_UNSTAGED_BITS;
			char el[48];
			if (!unit && unstaged)
				snprintf(el, sizeof(el), "%s", name);
			else if (!unit)
				snprintf(el, sizeof(el), "%s[%zu]", name, i);
			else if (unit == 1 || unstaged)
				snprintf(el, sizeof(el), "%s of query head %zu",
				         name, i / unit);
			else
				snprintf(el, sizeof(el), "%s of query head %zu "
				         "[%zu]", name, i / unit, i % unit);
			if (unstaged)
				return errors_fmt(p->why, sizeof(p->why), KVT_EINVAL,
				                  "layer %u, position %u: %s was "
				                  "never staged (kvt_stage_%s)", layer,
				                  pos0 + t, el, name);
			return errors_fmt(p->why, sizeof(p->why), KVT_EINVAL,
			                  "layer %u, position %u: staged %s is %s",
			                  layer, pos0 + t, el,
			                  isnan(r[i]) ? "NaN"
			                  : r[i] > 0 ? "+Inf" : "-Inf");
		}
	}
	return 0;
}

/* The inputs p reads of n rows: x [n][xs], q [n][qs], lse [n][ls] strides. */
static int check_inputs(struct policy *p, const float *x, const float *q,
                        const float *lse, uint32_t n, size_t xs, size_t qs,
                        size_t ls, uint32_t layer, uint32_t pos0)
{
	const struct policy_geom *g = &p->geom;
	unsigned need = p->ops->needs;
	size_t nq = (size_t)g->n_heads * g->head_dim;
	int rc = 0;
	if ((need & POLICY_NEED_X) && x)
		rc = check_input(p, "x", x, n, g->d_model, xs, 0, layer, pos0);
	if (!rc && (need & POLICY_NEED_Q) && q)
		rc = check_input(p, "q", q, n, nq, qs, g->head_dim, layer, pos0);
	if (!rc && (need & POLICY_NEED_LSE) && lse)
		rc = check_input(p, "lse", lse, n, g->n_heads, ls, 1, layer,
		                 pos0);
	return rc;
}

uint32_t policy_inputs_of(unsigned needs)
{
	return (needs & POLICY_NEED_X ? KVT_INPUT_X : 0) |
	       (needs & POLICY_NEED_Q ? KVT_INPUT_Q : 0) |
	       (needs & POLICY_NEED_LSE ? KVT_INPUT_LSE : 0) |
	       (needs & POLICY_NEED_KV ? KVT_INPUT_KV : 0);
}

/* Offset of a part (KVT_INPUT_Q or _LSE) in p's staged rows. */
static uint64_t row_off(const struct policy *p, uint32_t part)
{
	const struct policy_geom *g = &p->geom;
	uint64_t q_off, lse_off, n;
	shm_stage_layout(policy_inputs_of(p->ops->needs), g->d_model,
	                 g->n_heads, g->head_dim, &q_off, &lse_off, &n);
	return part == KVT_INPUT_Q ? q_off : lse_off;
}

const float *policy_row_q(const struct policy *p, const float *row)
{
	return row + row_off(p, KVT_INPUT_Q);
}

const float *policy_row_lse(const struct policy *p, const float *row)
{
	return row + row_off(p, KVT_INPUT_LSE);
}

int policy_check_row(struct policy *p, uint32_t layer, uint32_t pos,
                     const float *row)
{
	p->why[0] = '\0';
	return check_inputs(p, row, policy_row_q(p, row), policy_row_lse(p, row),
	                    1, 0, 0, 0, layer, pos);
}

int policy_decides(const struct policy *p, const struct policy_layer *l)
{
	return p->ops->decide && (!p->ops->decides || p->ops->decides(p, l));
}

int policy_decide(struct policy *p, struct policy_layer *l)
{
	const struct policy_geom *g = &p->geom;
	p->why[0] = '\0';
	if (!policy_decides(p, l))
		return 0;
	int rc = check_inputs(p, l->x, l->q, l->lse, l->n_new, g->d_model,
	                      (size_t)g->n_heads * g->head_dim, g->n_heads,
	                      l->layer, l->n_seen - l->n_new);
	if (rc)
		return rc;
	for (size_t i = 0; l->pre && (p->ops->needs & POLICY_NEED_X) &&
	                   i < (size_t)l->n_new * g->n_kv_heads; i++)
		if (!isfinite(l->pre[i])) {
			snprintf(p->why, sizeof(p->why), "layer %u, position %u: "
			         "the score of staged x for KV head %u is %s (x "
			         "not finite, or never staged: kvt_stage_x)",
			         l->layer,
			         l->n_seen - l->n_new + (uint32_t)(i / g->n_kv_heads),
			         (uint32_t)(i % g->n_kv_heads),
			         isnan(l->pre[i]) ? "NaN"
			         : l->pre[i] > 0 ? "+Inf" : "-Inf");
			return KVT_EINVAL;
		}
	scratch_reset(p);
	return p->ops->decide(p, l);
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

uint32_t policy_budget_args(const struct policy_args *a, uint32_t n)
{
	/* tokens is >= 1 whenever it was given or defaulted by init(), so 0
	 * means "no token budget". */
	if (a->tokens)
		return a->tokens;
	if (a->set & POLICY_KEY_RATIO) {
		/* kvpress: keep n - floor(R * n), computed in double; the
		 * product is in [0, n], where truncation is floor. */
		uint32_t ev = (uint32_t)(a->ratio * (double)n);
		if (ev > n)
			ev = n;
		return n - ev;
	}
	return UINT32_MAX;
}

uint32_t policy_press(const struct policy *p, uint32_t b)
{
	if (b == UINT32_MAX || !(p->pressure > 0.0f))
		return b;
	/* B - floor(B * level / 2): at most half off, >= 1 when B >= 1. */
	return b - (uint32_t)((double)b * (double)p->pressure / 2.0);
}

uint32_t policy_budget(const struct policy *p, uint32_t n)
{
	return policy_press(p, policy_budget_args(&p->args, n));
}

float policy_threshold(const struct policy *p)
{
	float tau = p->args.threshold, lv = p->pressure;
	switch (p->ops->tau) {
	case POLICY_TAU_LOG:
		return tau + 2.0f * lv;
	case POLICY_TAU_PROB:
		return tau < 1.0f ? tau + (1.0f - tau) * lv / 2.0f : tau;
	case POLICY_TAU_NONE:
		break;
	}
	return tau;
}

int policy_due(const struct policy *p, const struct policy_layer *l)
{
	uint32_t e = p->args.every;
	if (!e)
		return 1;
	return l->n_seen / e > (l->n_seen - l->n_new) / e;
}

int policy_select(struct policy *p, const struct policy_layer *l,
                  struct policy_head *h, const float *score,
                  const uint8_t *protect)
{
	return policy_select_budget(p, l, h, score, protect,
	                            policy_budget(p, l->n_seen));
}

int policy_select_budget(struct policy *p, const struct policy_layer *l,
                         struct policy_head *h, const float *score,
                         const uint8_t *protect, uint32_t b)
{
	uint32_t n = h->len;
	if (!n)
		return 0;
	uint8_t *prot = policy_scratch(p, n);
	uint32_t *sc = policy_scratch(p, (size_t)n * sizeof(uint32_t));
	if (!prot || !sc)
		return KVT_ENOMEM;
	uint32_t np = 0;
	for (uint32_t i = 0; i < n; i++) {
		prot[i] = (protect && protect[i]) ||
		          policy_protected(&p->args, h->pos[i], l->n_seen);
		np += prot[i];
	}
	if (p->args.set & POLICY_KEY_THRESHOLD)
		return (int)select_threshold_cpu(score, prot, n,
		                                 policy_threshold(p), h->drop);
	if (b == UINT32_MAX) {
		memset(h->drop, 0, n);
		return 0;
	}
	uint32_t k = b > np ? b - np : 0;
	return (int)select_topk_cpu(score, h->pos, prot, n, k, h->drop, sc);
}

float *policy_attn(struct policy *p, uint32_t g, const float *q,
                   const float *lse, const uint32_t *qpos, uint32_t n_q,
                   void *const *pages, uint32_t page_tokens,
                   const uint32_t *kpos, uint32_t len)
{
	const struct policy_geom *ge = &p->geom;
	uint32_t G = ge->n_heads / ge->n_kv_heads, hd = ge->head_dim;
	float *qg = policy_scratch(p, (size_t)n_q * G * hd * sizeof(float));
	float *lg = policy_scratch(p, (size_t)n_q * G * sizeof(float));
	float *w = policy_scratch(p, (size_t)n_q * G * len * sizeof(float));
	float *ks = policy_scratch(p, (size_t)len * hd * sizeof(float));
	if (!qg || !lg || !w || !ks)
		return NULL;
	/* The G query heads of KV head g are contiguous in a staged row. */
	for (uint32_t t = 0; t < n_q; t++) {
		memcpy(qg + (size_t)t * G * hd,
		       q + ((size_t)t * ge->n_heads + (size_t)g * G) * hd,
		       (size_t)G * hd * sizeof(float));
		memcpy(lg + (size_t)t * G,
		       lse + (size_t)t * ge->n_heads + (size_t)g * G,
		       (size_t)G * sizeof(float));
	}
	if (len)
		attn_band_cpu(qg, lg, qpos, n_q, G, pages, page_tokens, hd,
		              ge->dtype, kpos, len,
		              1.0f / sqrtf((float)hd), w, ks);
	return w;
}

void policy_move_entries(uint32_t *pos, float *ent, uint32_t entry_floats,
                         const uint32_t *moves, uint32_t n_moves)
{
	for (uint32_t m = 0; m < n_moves; m++) {
		uint32_t dst = moves[2 * m], src = moves[2 * m + 1];
		pos[dst] = pos[src];
		if (ent && entry_floats)
			memcpy(ent + (size_t)dst * entry_floats,
			       ent + (size_t)src * entry_floats,
			       (size_t)entry_floats * sizeof(float));
	}
}

void policy_take_pre(const struct policy *p, struct policy_layer *l)
{
	const uint32_t nkv = p->geom.n_kv_heads, n = l->n_new;
	for (uint32_t g = 0; g < nkv; g++) {
		struct policy_head *h = &l->heads[g];
		for (uint32_t k = 0; k < n && k < h->len; k++)
			h->ent[(size_t)(h->len - n + k) * p->entry_floats] =
				l->pre[(size_t)k * nkv + g];
	}
}
