/*
 * oracle.c — KVzip, KVzip+ and future-attention targets from dense
 * attention maps; see oracle.h for the definitions.
 */
#include "oracle.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oracle_kind_parse(const char *s, enum oracle_kind *out)
{
	if (!strcmp(s, "kvzip"))
		*out = ORACLE_KVZIP;
	else if (!strcmp(s, "kvzip+") || !strcmp(s, "kvzip_plus"))
		*out = ORACLE_KVZIP_PLUS;
	else if (!strcmp(s, "future") || !strcmp(s, "future_attention"))
		*out = ORACLE_FUTURE;
	else
		return KVT_EINVAL;
	return 0;
}

const char *oracle_kind_name(enum oracle_kind k)
{
	switch (k) {
	case ORACLE_KVZIP: return "kvzip";
	case ORACLE_KVZIP_PLUS: return "kvzip+";
	case ORACLE_FUTURE: return "future";
	}
	return "?";
}

uint32_t oracle_default_sep(const struct model *m, int32_t *sep)
{
	if (m->cfg.vocab_size == 256) {
		sep[0] = '\n';
		sep[1] = '\n';
		return 2;
	}
	sep[0] = MODEL_BOS;
	return 1;
}

uint32_t oracle_kvzip_max_ctx(uint32_t context, uint32_t n_sep)
{
	return context < 1 + n_sep ? 0 : (context - 1 - n_sep) / 2;
}

/* Dense pass of tokens[0..T) recording maps, x and v. */
static int record(const struct model *m, const int32_t *tokens, uint32_t T,
                  struct model_dense *dn)
{
	int rc = model_dense_init(dn, m, T, 1);
	if (rc)
		return rc;
	rc = model_dense_step(dn, tokens, T, NULL);
	if (rc)
		model_dense_free(dn);
	return rc;
}

int oracle_kvzip(const struct model *m, const int32_t *ctx, uint32_t n_ctx,
                 const int32_t *sep, uint32_t n_sep, int plus, float *out)
{
	const struct model_config *c = &m->cfg;
	if (!n_ctx)
		return KVT_EINVAL;
	const uint32_t T = 1 + n_ctx, N = 1 + 2 * n_ctx + n_sep;
	const uint32_t j0 = 1 + n_ctx + n_sep; /* first query of the copy */
	const uint32_t H = c->n_heads, Hkv = c->n_kv_heads, G = H / Hkv,
	               hd = c->head_dim, d = c->dim;
	int32_t *seq = malloc(sizeof(int32_t) * N);
	float *nv = malloc(sizeof(float) * (size_t)H * T);    /* [H][T] */
	float *inx = malloc(sizeof(float) * N);               /* [N] */
	if (!seq || !nv || !inx) {
		free(seq);
		free(nv);
		free(inx);
		return KVT_ENOMEM;
	}
	seq[0] = MODEL_BOS;
	memcpy(seq + 1, ctx, n_ctx * sizeof(int32_t));
	memcpy(seq + 1 + n_ctx, sep, n_sep * sizeof(int32_t));
	memcpy(seq + j0, ctx, n_ctx * sizeof(int32_t));
	struct model_dense dn;
	int rc = record(m, seq, N, &dn);
	if (rc)
		goto out;

	for (uint32_t l = 0; l < c->n_layers; l++) {
		if (plus) {
			/* ||W_O^h v_i||: W_O^h = columns h*hd.. of wo [d][d] */
			const float *wo = m->wo + (size_t)l * d * d;
			for (uint32_t h = 0; h < H; h++) {
				const float *vb = dn.v + ((size_t)l * Hkv + h / G) *
				                                 N * hd;
				for (uint32_t i = 0; i < T; i++) {
					const float *vi = vb + (size_t)i * hd;
					double ss = 0.0;
					for (uint32_t r = 0; r < d; r++) {
						const float *w = wo + (size_t)r * d +
						                 (size_t)h * hd;
						double u = 0.0;
						for (uint32_t e = 0; e < hd; e++)
							u += (double)w[e] * vi[e];
						ss += u * u;
					}
					nv[(size_t)h * T + i] = (float)sqrt(ss);
				}
			}
			for (uint32_t j = j0; j < N; j++) {
				const float *x = dn.xs + ((size_t)l * N + j) * d;
				double ss = 0.0;
				for (uint32_t e = 0; e < d; e++)
					ss += (double)x[e] * x[e];
				inx[j] = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
			}
		}
		for (uint32_t g = 0; g < Hkv; g++) {
			float *o = out + ((size_t)l * Hkv + g) * T;
			for (uint32_t i = 0; i < T; i++)
				o[i] = 0.0f;
			for (uint32_t h = g * G; h < (g + 1) * G; h++) {
				const float *map = dn.maps +
				                   (size_t)(l * H + h) * N * N;
				for (uint32_t j = j0; j < N; j++) {
					const float *row = map + (size_t)j * N;
					for (uint32_t i = 0; i < T; i++) {
						float a = row[i];
						if (plus)
							a *= nv[(size_t)h * T + i] *
							     inx[j];
						if (a > o[i])
							o[i] = a;
					}
				}
			}
			if (plus)
				for (uint32_t i = 0; i < T; i++)
					o[i] = logf(o[i] > 1e-30f ? o[i]
					                          : 1e-30f);
		}
	}
	model_dense_free(&dn);
out:
	free(seq);
	free(nv);
	free(inx);
	return rc;
}

int oracle_future(const struct model *m, const int32_t *tokens, uint32_t T,
                  uint32_t horizon, float *out)
{
	const struct model_config *c = &m->cfg;
	if (!T || !horizon)
		return KVT_EINVAL;
	const uint32_t H = c->n_heads, Hkv = c->n_kv_heads, G = H / Hkv;
	struct model_dense dn;
	int rc = record(m, tokens, T, &dn);
	if (rc)
		return rc;
	for (uint32_t l = 0; l < c->n_layers; l++)
		for (uint32_t g = 0; g < Hkv; g++) {
			float *o = out + ((size_t)l * Hkv + g) * T;
			for (uint32_t i = 0; i < T; i++) {
				uint32_t end = (uint64_t)i + horizon < T - 1
				                       ? i + horizon
				                       : T - 1;
				float best = 0.0f;
				for (uint32_t h = g * G; h < (g + 1) * G; h++) {
					const float *map =
						dn.maps +
						(size_t)(l * H + h) * T * T;
					double s = 0.0;
					for (uint32_t t = i + 1; t <= end; t++)
						s += map[(size_t)t * T + i];
					if ((float)s > best)
						best = (float)s;
				}
				o[i] = best;
			}
		}
	model_dense_free(&dn);
	return 0;
}

int oracle_write(const char *path, enum oracle_kind kind,
                 const struct model *m, uint32_t T, uint32_t horizon,
                 const float *scores, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	uint32_t hdr[8] = {ORACLE_FILE_MAGIC, 1, (uint32_t)kind, c->n_layers,
	                   c->n_kv_heads, T,
	                   kind == ORACLE_FUTURE ? horizon : 0, 0};
	size_t n = (size_t)c->n_layers * c->n_kv_heads * T;
	FILE *f = fopen(path, "wb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return KVT_ESYS;
	}
	int bad = fwrite(hdr, sizeof(hdr), 1, f) != 1 ||
	          fwrite(scores, sizeof(float), n, f) != n;
	bad |= fclose(f) != 0;
	if (bad) {
		snprintf(err, errlen, "%s: write failed", path);
		return KVT_ESYS;
	}
	return 0;
}
