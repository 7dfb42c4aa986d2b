/*
 * cases.c — the inputs of kvtrim-eval (docs/eval.md has the protocol): copy
 * and key-value needle cases built from the evaluation text, and for every
 * case its full-cache reference logits and the KVzip scores of its prompt.
 */
#include "bytes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "model.h"
#include "oracle.h"

const uint32_t cases_needle_depth[NEEDLE_NDEPTH] = {50, 100, 200, 400};

/* Full-cache logits on the engine's schedule. */
void cases_ref(const struct model *M, struct ecase *c)
{
	uint32_t V = M->cfg.vocab_size;
	struct model_dense dn;
	float *lg = malloc(sizeof(float) * CHUNK * V);
	c->ref = malloc(sizeof(float) * (size_t)(c->T - c->P) * V);
	if (!lg || !c->ref || model_dense_init(&dn, M, c->T, 0))
		eval_die("out of memory");
	for (uint32_t i = 0; i + 1 < c->T;) {
		uint32_t k = i < c->P ? (c->P - i < CHUNK ? c->P - i : CHUNK) : 1;
		if (model_dense_step(&dn, c->tok + i, k, lg))
			eval_die("dense forward failed");
		if (i >= c->P)
			memcpy(c->ref + (size_t)(i - c->P) * V, lg,
			       sizeof(float) * V);
		i += k;
	}
	model_dense_free(&dn);
	free(lg);
}

/* KVzip scores of the prompt [0, P), in reconstruction chunks. */
void cases_kvzip(const struct model *M, struct ecase *c)
{
	const struct model_config *mc = &M->cfg;
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t nsep = oracle_default_sep(M, sep);
	uint32_t mx = oracle_kvzip_max_ctx(model_context(M), nsep);
	uint32_t nctx = c->P - 1, nch = (nctx + mx - 1) / mx;
	size_t nl = (size_t)mc->n_layers * mc->n_kv_heads;
	c->kvzip = calloc(nl * c->P, sizeof(float));
	float *o = malloc(sizeof(float) * nl * (mx + 1));
	if (!c->kvzip || !o)
		eval_die("out of memory");
	for (uint32_t k = 0; k < nch; k++) {
		uint32_t a = 1 + (uint32_t)((uint64_t)k * nctx / nch);
		uint32_t b = 1 + (uint32_t)((uint64_t)(k + 1) * nctx / nch);
		uint32_t len = b - a;
		if (oracle_kvzip(M, c->tok + a, len, sep, nsep, 0, o))
			eval_die("kvzip oracle failed");
		for (size_t li = 0; li < nl; li++) {
			const float *src = o + li * (len + 1);
			float *dst = c->kvzip + li * c->P;
			dst[0] = src[0] > dst[0] ? src[0] : dst[0];
			for (uint32_t i = 0; i < len; i++)
				dst[a + i] = src[1 + i];
		}
	}
	free(o);
}

/* Copy cases from the evaluation text: lines of 55-65 printable bytes,
 * evenly spaced, filler from half the text away. */
uint32_t cases_copy(struct ecase *out, uint32_t want)
{
	char *text, err[512];
	size_t n;
	if (dataset_text(DATASET_EVAL, &text, &n, err, sizeof(err)))
		eval_die("%s", err);
	size_t *cand = malloc(sizeof(size_t) * (n / 55 + 1));
	uint32_t *clen = malloc(sizeof(uint32_t) * (n / 55 + 1));
	size_t nc = 0;
	for (size_t i = 0; i < n;) {
		size_t e = i;
		while (e < n && text[e] != '\n')
			e++;
		size_t len = e - i;
		if (len >= 55 && len <= 65) {
			cand[nc] = i;
			clen[nc++] = (uint32_t)len;
		}
		i = e + 1;
	}
	uint32_t k = nc < want ? (uint32_t)nc : want;
	for (uint32_t s = 0; s < k; s++) {
		size_t ci = (size_t)s * nc / k;
		size_t at = cand[ci];
		uint32_t len = clen[ci];
		struct ecase *c = &out[s];
		memset(c, 0, sizeof(*c));
		c->kind = C_COPY;
		c->T = 1 + len + COPY_FILLER + len;
		c->P = 1 + len + COPY_FILLER;
		c->c0 = c->P + COPY_SKIP;
		c->tok = malloc(sizeof(int32_t) * c->T);
		if (!c->tok)
			eval_die("out of memory");
		c->tok[0] = MODEL_BOS;
		size_t f = (at + n / 2) % (n - COPY_FILLER);
		for (uint32_t i = 0; i < len; i++)
			c->tok[1 + i] = c->tok[c->P + i] =
				(unsigned char)text[at + i];
		for (uint32_t i = 0; i < COPY_FILLER; i++)
			c->tok[1 + len + i] = (unsigned char)text[f + i];
	}
	free(cand);
	free(clen);
	free(text);
	return k;
}

/* Key-value needle cases from the evaluation text (byte models): NEEDLE_LEN
 * bytes, BOS then consecutive held-out filler from a seeded offset into
 * which are set, each on a line of its own (the filler byte before it
 * becomes a newline), three distractor records `code WXYZ: 12345`, 4-8
 * filler bytes apart, then the target record `code ABCD: 48213`, then
 * exactly depth bytes of filler, then the query `code ABCD: ` and the
 * target's 5 digits, which end the case.  Keys are 4 random uppercase
 * letters, distinct within a case; digits uniform.  Prefill stops where
 * the query starts: the query is decoded with the policy active and the
 * digits are scored teacher-forced (per-digit top-1, and exact = all 5).
 * Case s has depth cases_needle_depth[s % NEEDLE_NDEPTH]. */
/* Writes the first n bytes of "code KEY: VALUE\n" (17) at t. */
static void needle_record(int32_t *t, const char *key, const char *val,
                          size_t n)
{
	char b[32];
	snprintf(b, sizeof(b), "code %.4s: %.5s\n", key, val);
	for (size_t i = 0; i < n && b[i]; i++)
		t[i] = (unsigned char)b[i];
}

void cases_needle(struct ecase *out, uint32_t want)
{
	char *text, err[512];
	size_t n;
	if (dataset_text(DATASET_EVAL, &text, &n, err, sizeof(err)))
		eval_die("%s", err);
	if (n < 2 * NEEDLE_LEN)
		eval_die("needles: evaluation text too short");
	const uint32_t rec = 17; /* "code ABCD: 48213\n" */
	for (uint32_t s = 0; s < want; s++) {
		struct ecase *c = &out[s];
		uint64_t st = NEEDLE_SEED + 0x9e3779b97f4a7c15ull * (s + 1);
		(void)dataset_rng(&st);
		char key[NEEDLE_DISTRACTORS + 1][5], val[NEEDLE_DISTRACTORS + 1][6];
		for (uint32_t k = 0; k <= NEEDLE_DISTRACTORS; k++) {
			int dup;
			do {
				for (int i = 0; i < 4; i++)
					key[k][i] = (char)('A' +
					            dataset_rng(&st) % 26);
				key[k][4] = 0;
				dup = 0;
				for (uint32_t q = 0; q < k; q++)
					dup |= !memcmp(key[q], key[k], 4);
			} while (dup);
			for (uint32_t i = 0; i < NEEDLE_DIGITS; i++)
				val[k][i] = (char)('0' + dataset_rng(&st) % 10);
			val[k][5] = 0;
		}
		uint32_t gap[NEEDLE_DISTRACTORS], gs = 0;
		for (uint32_t k = 0; k < NEEDLE_DISTRACTORS; k++)
			gs += gap[k] = 4 + (uint32_t)(dataset_rng(&st) % 5);
		size_t f = dataset_rng(&st) % (n - NEEDLE_LEN);
		memset(c, 0, sizeof(*c));
		c->kind = C_NEEDLE;
		c->di = s % NEEDLE_NDEPTH;
		uint32_t depth = cases_needle_depth[c->di];
		c->T = NEEDLE_LEN;
		c->c0 = c->T - NEEDLE_DIGITS;
		c->P = c->c0 - 11; /* "code ABCD: " */
		uint32_t lead = c->P - depth - rec * (NEEDLE_DISTRACTORS + 1) -
		                gs - 1;
		if ((int32_t)lead < 1)
			eval_die("needles: depth %u does not fit", depth);
		c->tok = malloc(sizeof(int32_t) * c->T);
		if (!c->tok)
			eval_die("out of memory");
		/* filler everywhere, then the records over it */
		c->tok[0] = MODEL_BOS;
		for (uint32_t i = 1; i < c->T; i++)
			c->tok[i] = (unsigned char)text[f + i - 1];
		uint32_t at = 1 + lead;
		for (uint32_t k = 0; k <= NEEDLE_DISTRACTORS; k++) {
			/* k < NEEDLE_DISTRACTORS: distractor k; last: target */
			uint32_t r = k < NEEDLE_DISTRACTORS ? k + 1 : 0;
			c->tok[at - 1] = '\n';
			needle_record(c->tok + at, key[r], val[r], rec);
			at += rec + (k < NEEDLE_DISTRACTORS ? gap[k] : depth);
		}
		if (at != c->P)
			eval_die("needles: layout error");
		c->tok[at - 1] = '\n';
		/* the query and the digits: the case ends there */
		needle_record(c->tok + at, key[0], val[0], c->T - at);
	}
	free(text);
}

/* Full-cache needle accuracy per depth from the reference logits. */
void cases_needle_full(const struct model *M, const struct ecase *c,
                       uint32_t nc, double *digit, double *exact,
                       uint32_t *per_depth)
{
	uint32_t V = M->cfg.vocab_size;
	uint64_t ok[NEEDLE_NDEPTH] = {0}, ex[NEEDLE_NDEPTH] = {0};
	memset(per_depth, 0, sizeof(uint32_t) * NEEDLE_NDEPTH);
	for (uint32_t i = 0; i < nc; i++) {
		uint32_t k = 0;
		for (uint32_t t = c[i].c0 - 1; t + 1 < c[i].T; t++) {
			const float *rf = c[i].ref + (size_t)(t - c[i].P) * V;
			uint32_t am = 0;
			for (uint32_t v = 1; v < V; v++)
				if (rf[v] > rf[am])
					am = v;
			k += (int32_t)am == c[i].tok[t + 1];
		}
		ok[c[i].di] += k;
		ex[c[i].di] += k == NEEDLE_DIGITS;
		per_depth[c[i].di]++;
	}
	for (int d = 0; d < NEEDLE_NDEPTH; d++) {
		digit[d] = per_depth[d] ? (double)ok[d] /
		           ((double)per_depth[d] * NEEDLE_DIGITS) : NAN;
		exact[d] = per_depth[d] ? (double)ex[d] / per_depth[d] : NAN;
	}
}
