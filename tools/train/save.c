/*
 * save.c — the weight files of kvtrim-train; see save.h.
 */
#include "save.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "weights.h"

int save_mkdirs(const char *path)
{
	char b[1024];
	snprintf(b, sizeof(b), "%s", path);
	for (char *p = b + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			if (mkdir(b, 0755) < 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	return mkdir(b, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

int save_kvzap(const char *dir, const struct model_config *c,
               uint32_t hidden, float *const *W1, float *const *b1,
               float *const *W2, float *const *b2, enum kvt_dtype dt,
               char *err, size_t errlen)
{
	if (save_mkdirs(dir) < 0) {
		snprintf(err, errlen, "%.900s: %s", dir, strerror(errno));
		return KVT_ESYS;
	}
	uint32_t L = c->n_layers, per = hidden ? 4 : 2;
	struct weights_tensor *t = calloc((size_t)L * per, sizeof(*t));
	char(*names)[48] = calloc((size_t)L * per, sizeof(*names));
	if (!t || !names) {
		free(t);
		free(names);
		return KVT_ENOMEM;
	}
	size_t k = 0;
	for (uint32_t l = 0; l < L; l++) {
		uint32_t o1 = hidden ? hidden : c->n_kv_heads;
		snprintf(names[k], 48, hidden ? "layers.%u.0.weight"
		                              : "layers.%u.weight", l);
		t[k] = (struct weights_tensor){names[k], 2, {o1, c->dim}, W1[l]};
		k++;
		snprintf(names[k], 48, hidden ? "layers.%u.0.bias"
		                              : "layers.%u.bias", l);
		t[k] = (struct weights_tensor){names[k], 1, {o1}, b1[l]};
		k++;
		if (!hidden)
			continue;
		snprintf(names[k], 48, "layers.%u.2.weight", l);
		t[k] = (struct weights_tensor){names[k], 2,
		                               {c->n_kv_heads, hidden}, W2[l]};
		k++;
		snprintf(names[k], 48, "layers.%u.2.bias", l);
		t[k] = (struct weights_tensor){names[k], 1, {c->n_kv_heads},
		                               b2[l]};
		k++;
	}
	char path[1024];
	snprintf(path, sizeof(path), "%.1000s/model.safetensors", dir);
	int rc = weights_write_as(path, t, k, dt, err, errlen);
	free(t);
	free(names);
	if (rc)
		return rc;
	snprintf(path, sizeof(path), "%.1000s/config.json", dir);
	FILE *f = fopen(path, "w");
	if (!f) {
		snprintf(err, errlen, "%.900s: %s", path, strerror(errno));
		return KVT_ESYS;
	}
	char hd[16] = "null";
	if (hidden)
		snprintf(hd, sizeof(hd), "%u", hidden);
	fprintf(f, "{\"input_dim\": %u, \"output_dim\": %u, \"hidden_dim\": "
	           "%s, \"n_modules\": %u}\n", c->dim, c->n_kv_heads, hd, L);
	if (fclose(f)) {
		snprintf(err, errlen, "%.900s: write failed", path);
		return KVT_ESYS;
	}
	return 0;
}

/* A table of up to per * n_layers tensors, their names and dtype. */
struct table {
	struct weights_tensor *t;
	char (*nm)[48];
	size_t k;
	enum kvt_dtype dt;
};

static int table_init(struct table *tb, size_t n, enum kvt_dtype dt)
{
	tb->t = calloc(n, sizeof(*tb->t));
	tb->nm = calloc(n, sizeof(*tb->nm));
	tb->k = 0;
	tb->dt = dt;
	return tb->t && tb->nm ? 0 : KVT_ENOMEM;
}

static void table_free(struct table *tb)
{
	free(tb->t);
	free(tb->nm);
}

static void add(struct table *tb, const char *fmt, uint32_t l, uint32_t nd,
                uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3,
                const float *data)
{
	snprintf(tb->nm[tb->k], 48, fmt, l);
	tb->t[tb->k] = (struct weights_tensor){tb->nm[tb->k], nd,
	                                       {s0, s1, s2, s3}, data};
	tb->k++;
}

int save_fastkvzip(const char *path, const struct model_config *c,
                   const struct gate_params *gp, enum kvt_dtype dt,
                   char *err, size_t errlen)
{
	const uint32_t L = c->n_layers, nkv = c->n_kv_heads;
	struct table tb;
	int rc = table_init(&tb, (size_t)L * 7, dt);
	for (uint32_t l = 0; l < L && !rc; l++) {
		const struct gate_params *g = &gp[l];
		uint64_t nq = (uint64_t)nkv * g->G * g->dp;
		add(&tb, "fastkvzip.%u.q_proj.weight", l, 2, nq, c->dim, 0, 0,
		    g->Wq);
		add(&tb, "fastkvzip.%u.q_proj.bias", l, 1, nq, 0, 0, 0, g->cq);
		add(&tb, "fastkvzip.%u.k_proj.weight", l, 2,
		    (uint64_t)nkv * g->dp, c->dim, 0, 0, g->Wk);
		add(&tb, "fastkvzip.%u.q_norm.weight", l, 1, g->dp, 0, 0, 0,
		    g->gq);
		add(&tb, "fastkvzip.%u.k_norm.weight", l, 1, g->dp, 0, 0, 0,
		    g->gk);
		add(&tb, "fastkvzip.%u.k_base", l, 4, nkv, 1, g->S, g->dp,
		    g->sinks);
		add(&tb, "fastkvzip.%u.b", l, 3, nkv, 1, g->G, 0, g->bias);
	}
	if (!rc)
		rc = weights_write_as(path, tb.t, tb.k, tb.dt, err, errlen);
	table_free(&tb);
	return rc;
}

int save_kvpop(const char *path, const struct model_config *c,
               const struct pop_params *pp, const float *share,
               const float *keep, uint32_t n_f, const float *memory,
               enum kvt_dtype dt, char *err, size_t errlen)
{
	const uint32_t L = c->n_layers, nkv = c->n_kv_heads;
	struct table tb;
	int rc = table_init(&tb, (size_t)L * 5 + 3, dt);
	if (!rc) {
		add(&tb, "kvpop.share", 0, 3, n_f, L, nkv, 0, share);
		add(&tb, "kvpop.share_keep", 0, 1, n_f, 0, 0, 0, keep);
		add(&tb, "kvpop.memory", 0, 2, L, 3, 0, 0, memory);
	}
	for (uint32_t l = 0; l < L && !rc; l++) {
		const struct pop_params *q = &pp[l];
		add(&tb, "kvpop.%u.proj.weight", l, 2, q->r, c->dim, 0, 0, q->P);
		add(&tb, "kvpop.%u.fc1.weight", l, 2, q->m, q->r + 1, 0, 0,
		    q->W1);
		add(&tb, "kvpop.%u.fc1.bias", l, 1, q->m, 0, 0, 0, q->b1);
		add(&tb, "kvpop.%u.fc2.weight", l, 2, nkv, q->m, 0, 0, q->W2);
		add(&tb, "kvpop.%u.fc2.bias", l, 1, nkv, 0, 0, 0, q->b2);
	}
	if (!rc)
		rc = weights_write_as(path, tb.t, tb.k, tb.dt, err, errlen);
	table_free(&tb);
	return rc;
}
