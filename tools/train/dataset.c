/*
 * dataset.c — deterministic train/eval sequences; see dataset.h.
 */
#include "dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int dataset_text(enum dataset_split split, char **out, size_t *n, char *err,
                 size_t errlen)
{
	const char *path = dataset_text_path();
	*out = NULL;
	*n = 0;
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return KVT_ESYS;
	}
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	while (buf) {
		size_t r = fread(buf + len, 1, cap - len, f);
		len += r;
		if (len < cap)
			break;
		char *nb = realloc(buf, cap * 2);
		if (!nb) {
			free(buf);
			buf = NULL;
			break;
		}
		buf = nb;
		cap *= 2;
	}
	fclose(f);
	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return KVT_ENOMEM;
	}
	/* The cut: first newline at or after 60 % (inclusive in train). */
	size_t cut = (size_t)(len * DATASET_TRAIN_FRACTION);
	while (cut < len && buf[cut] != '\n')
		cut++;
	if (cut < len)
		cut++;
	size_t a = split == DATASET_TRAIN ? 0 : cut;
	size_t b = split == DATASET_TRAIN ? cut : len;
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
		float mx = lg[0];
		for (uint32_t v = 1; v < V; v++)
			mx = lg[v] > mx ? lg[v] : mx;
		double z = 0;
		for (uint32_t v = 0; v < V; v++)
			z += exp((double)lg[v] - mx);
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

void dataset_free(struct dataset *d)
{
	free(d->tok);
	memset(d, 0, sizeof(*d));
}
