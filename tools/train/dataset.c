/*
 * dataset.c — deterministic train/eval sequences; see dataset.h.
 */
#include "dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"
#include "tokenizer.h"

uint64_t dataset_rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double dataset_uniform(uint64_t *s)
{
	return (double)(dataset_rng(s) >> 11) * (1.0 / 9007199254740992.0);
}

const char *dataset_text_path(void)
{
	const char *p = getenv("KVTRIM_VALID_TEXT");
	return p && *p ? p : "../shared/models/bytes2m-valid.txt";
}

int dataset_is_bytes(const struct model *m)
{
	return m->cfg.vocab_size == 256;
}

const char *dataset_corpus_path(void)
{
	const char *p = getenv("KVTRIM_TRAIN_TEXT");
	return p && *p ? p : "../shared/corpus/train-man.txt";
}

int dataset_text(enum dataset_split split, char **out, size_t *n, char *err,
                 size_t errlen)
{
	char *buf;
	size_t len;
	int rc = file_read_all(dataset_text_path(), &buf, &len, err, errlen);
	if (rc)
		return rc;
	/* The cut: first newline at or after 60 % (inclusive in train). */
	size_t cut = (size_t)(len * DATASET_TRAIN_FRACTION);
	while (cut < len && buf[cut] != '\n')
		cut++;
	if (cut < len)
		cut++;
	size_t a = split == DATASET_EVAL ? cut : 0;
	size_t b = split == DATASET_EVAL ? len : cut;
	memmove(buf, buf + a, b - a);
	*out = buf;
	*n = b - a;
	return 0;
}

/* Samples len tokens from BOS at temperature 1 with the stream state. */
static int sample_seq(const struct model *m, uint32_t len, uint64_t st,
                      int32_t *tok)
{
	struct model_dense dn;
	uint32_t V = m->cfg.vocab_size;
	float *lg = malloc(sizeof(float) * V);
	if (!lg)
		return KVT_ENOMEM;
	int rc = model_dense_init(&dn, m, len, 0);
	if (rc) {
		free(lg);
		return rc;
	}
	tok[0] = MODEL_BOS;
	for (uint32_t t = 0; t + 1 < len && !rc; t++) {
		rc = model_dense_step(&dn, tok + t, 1, lg);
		if (rc)
			break;
		float mx;
		double z = model_logits_z(lg, V, &mx);
		double u = dataset_uniform(&st) * z, c = 0;
		uint32_t pick = V - 1;
		for (uint32_t v = 0; v < V; v++) {
			c += exp((double)lg[v] - mx);
			if (u < c) {
				pick = v;
				break;
			}
		}
		tok[t + 1] = (int32_t)pick;
	}
	model_dense_free(&dn);
	free(lg);
	return rc;
}

int dataset_build(const struct model *m, enum dataset_split split,
                  uint32_t len, uint32_t max_n, uint64_t seed,
                  struct dataset *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (len < 2 || !max_n) {
		snprintf(err, errlen, "dataset: bad length %u or count %u",
		         len, max_n);
		return KVT_EINVAL;
	}
	if (m->version == MODEL_GGUF) {
		snprintf(err, errlen, "dataset: a GGUF model's windows come "
		         "from its tokenizer (dataset_build_tok)");
		return KVT_EINVAL;
	}
	out->len = len;
	if (dataset_is_bytes(m)) {
		char *text;
		size_t n;
		int rc = dataset_text(split, &text, &n, err, errlen);
		if (rc)
			return rc;
		size_t avail = n / (len - 1);
		uint32_t k = avail < max_n ? (uint32_t)avail : max_n;
		if (!k) {
			free(text);
			snprintf(err, errlen, "dataset: text part too short");
			return KVT_EINVAL;
		}
		out->tok = malloc(sizeof(int32_t) * (size_t)k * len);
		if (!out->tok) {
			free(text);
			return KVT_ENOMEM;
		}
		for (uint32_t s = 0; s < k; s++) {
			/* evenly spaced among the avail windows */
			size_t w = (size_t)s * avail / k;
			int32_t *t = out->tok + (size_t)s * len;
			t[0] = MODEL_BOS;
			for (uint32_t i = 1; i < len; i++)
				t[i] = (unsigned char)text[w * (len - 1) + i - 1];
		}
		out->n = k;
		free(text);
		return 0;
	}
	out->tok = malloc(sizeof(int32_t) * (size_t)max_n * len);
	if (!out->tok)
		return KVT_ENOMEM;
	for (uint32_t s = 0; s < max_n; s++) {
		uint64_t st = split == DATASET_TRAIN ? seed : DATASET_EVAL_SEED;
		/* stream = (seed, split tag, index) */
		st ^= (split == DATASET_TRAIN ? 0x747261696eull
		                              : 0x6576616cull) << 20;
		st += 0x9e3779b97f4a7c15ull * (s + 1);
		(void)dataset_rng(&st);
		int rc = sample_seq(m, len, st, out->tok + (size_t)s * len);
		if (rc) {
			dataset_free(out);
			snprintf(err, errlen, "dataset: sampling failed: %s",
			         kvt_strerror(rc));
			return rc;
		}
	}
	out->n = max_n;
	return 0;
}

/* Tokens of text[0..n) from its start until at least want of them (or the
 * end): the chunk grows until it holds enough.  *used: the bytes of the
 * first want tokens (byte-level BPE: a token's bytes are its text). */
static int tok_window(const struct tok *t, const char *text, size_t n,
                      uint32_t want, struct tok_ids *ids, size_t *used,
                      char *err, size_t errlen)
{
	size_t chunk = (size_t)want * 6;
	for (;;) {
		if (chunk > n)
			chunk = n;
		/* end the chunk at a line end so no piece is cut */
		size_t e = chunk;
		while (e < n && text[e - 1] != '\n')
			e++;
		ids->n = 0;
		int rc = tok_encode(t, text, e, 0, ids, err, errlen);
		if (rc)
			return rc;
		if (ids->n >= want || e == n) {
			size_t u = 0, k = ids->n < want ? ids->n : want;
			for (size_t i = 0; i < k; i++) {
				size_t bl = 0;
				(void)tok_token_bytes(t, ids->v[i], &bl);
				u += bl;
			}
			*used = u;
			return 0;
		}
		chunk = e * 2;
	}
}

int dataset_build_tok(const struct model *m, const struct tok *t,
                      enum dataset_split split, uint32_t len, uint32_t max_n,
                      struct dataset *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	const uint32_t b = m->bos >= 0;
	if (len < 2 + b || !max_n) {
		snprintf(err, errlen, "dataset: bad length %u or count %u",
		         len, max_n);
		return KVT_EINVAL;
	}
	char *text;
	size_t n;
	int rc = split == DATASET_TRAIN
	                 ? file_read_all(dataset_corpus_path(), &text, &n, err,
	                                 errlen)
	                 : dataset_text(split, &text, &n, err, errlen);
	if (rc)
		return rc;
	out->tok = malloc(sizeof(int32_t) * (size_t)max_n * len);
	struct tok_ids ids = {0};
	if (!out->tok) {
		free(text);
		return KVT_ENOMEM;
	}
	out->len = len;
	size_t at = 0; /* end of the previous window's bytes */
	for (uint32_t k = 0; k < max_n && !rc; k++) {
		size_t s = (size_t)((double)k * n / max_n);
		if (s < at)
			s = at;
		while (s > 0 && s < n && text[s - 1] != '\n')
			s++;
		if (s >= n)
			break;
		size_t used;
		rc = tok_window(t, text + s, n - s, len - b, &ids, &used, err,
		                errlen);
		if (rc) {
			char why[512];
			snprintf(why, sizeof(why), "%s", err);
			snprintf(err, errlen, "dataset: the text from byte %zu: "
			         "%s", s, why);
			break;
		}
		if (ids.n < len - b)
			break; /* the part ran out */
		int32_t *w = out->tok + (size_t)out->n * len;
		if (b)
			w[0] = m->bos;
		memcpy(w + b, ids.v, sizeof(int32_t) * (len - b));
		out->n++;
		at = s + used;
	}
	free(ids.v);
	free(text);
	if (!rc && !out->n) {
		snprintf(err, errlen, "dataset: the text part holds no window "
		         "of %u tokens", len);
		rc = KVT_EINVAL;
	}
	if (rc)
		dataset_free(out);
	return rc;
}

void dataset_free(struct dataset *d)
{
	free(d->tok);
	memset(d, 0, sizeof(*d));
}
