/* rndweights.c — see rndweights.h. */
#include "rndweights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "weights.h"

const struct th_wshape TH_WSHAPE_FULL = {512, 16, 16, 16, 64};

/* The tensors of one file under construction. */
struct wfile {
	struct weights_tensor *t;
	float **data;
	char (*nm)[48];
	size_t n, cap;
	uint64_t seed;
};

static uint64_t wmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Adds tensor fmt(l) of shape s (nd dims), uniform in
 * [centre - width/2, centre + width/2).  -1 when out of memory. */
static int wadd(struct wfile *w, const char *fmt, uint32_t l, uint32_t nd,
                uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3,
                float width, float centre)
{
	uint64_t sh[4] = {s0, s1, s2, s3}, ne = 1;
	for (uint32_t d = 0; d < nd; d++)
		ne *= sh[d];
	float *v = malloc(ne * sizeof(float) + 1);
	if (!v || w->n == w->cap) {
		free(v);
		return -1;
	}
	uint64_t base = wmix(w->seed ^ ((uint64_t)w->n << 40));
	for (uint64_t i = 0; i < ne; i++)
		v[i] = centre + width * ((float)(wmix(base + i) >> 40) /
		                         16777216.0f - 0.5f);
	snprintf(w->nm[w->n], sizeof(w->nm[0]), fmt, l);
	w->t[w->n] = (struct weights_tensor){w->nm[w->n], nd,
	                                     {s0, s1, s2, s3}, v};
	w->data[w->n++] = v;
	return 0;
}

/* Whether spec (a policy name, or a spec "name:...") names policy name. */
static int names(const char *spec, const char *name)
{
	const size_t n = strcspn(spec, ":");
	return strlen(name) == n && !strncmp(spec, name, n);
}

int th_random_weights(const char *policy, const struct kvt_geometry *g,
                      const struct th_wshape *sh, uint64_t seed,
                      const char *path, char *err, size_t errlen)
{
	int kind = names(policy, "kvzap")       ? 0
	           : names(policy, "fastkvzip") ? 1
	           : names(policy, "kvpop")     ? 2
	                                        : -1;
	if (kind < 0 || !g->n_kv_heads || g->n_heads % g->n_kv_heads)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "no random weights for policy %s", policy);
	struct wfile w = {.cap = 7 * (size_t)g->n_layers + 1, .seed = seed};
	w.t = calloc(w.cap, sizeof(*w.t));
	w.data = calloc(w.cap, sizeof(*w.data));
	w.nm = calloc(w.cap, sizeof(*w.nm));
	const uint64_t d = g->d_model, kv = g->n_kv_heads;
	const uint64_t G = g->n_heads / g->n_kv_heads;
	int bad = !w.t || !w.data || !w.nm;
	for (uint32_t l = 0; l < g->n_layers && !bad; l++) {
		const uint64_t h = sh->kvzap_hidden, dp = sh->fkv_dp;
		if (kind == 0) {
			bad |= wadd(&w, "kvzap.%u.fc1.weight", l, 2, h, d, 0, 0,
			            0.05f, 0);
			bad |= wadd(&w, "kvzap.%u.fc1.bias", l, 1, h, 0, 0, 0,
			            0.1f, 0);
			bad |= wadd(&w, "kvzap.%u.fc2.weight", l, 2, kv, h, 0, 0,
			            0.05f, 0);
			bad |= wadd(&w, "kvzap.%u.fc2.bias", l, 1, kv, 0, 0, 0,
			            0, -4.0f);
		} else if (kind == 1) {
			bad |= wadd(&w, "fastkvzip.%u.q_proj.weight", l, 2,
			            kv * G * dp, d, 0, 0, 0.05f, 0);
			bad |= wadd(&w, "fastkvzip.%u.q_proj.bias", l, 1,
			            kv * G * dp, 0, 0, 0, 0.1f, 0);
			bad |= wadd(&w, "fastkvzip.%u.k_proj.weight", l, 2,
			            kv * dp, d, 0, 0, 0.05f, 0);
			bad |= wadd(&w, "fastkvzip.%u.q_norm.weight", l, 1, dp,
			            0, 0, 0, 0.2f, 1.0f);
			bad |= wadd(&w, "fastkvzip.%u.k_norm.weight", l, 1, dp,
			            0, 0, 0, 0.2f, 1.0f);
			bad |= wadd(&w, "fastkvzip.%u.k_base", l, 4, kv, 1,
			            sh->fkv_s, dp, 2.0f, 0);
			bad |= wadd(&w, "fastkvzip.%u.b", l, 3, kv, 1, G, 0,
			            1.0f, 0);
		} else {
			const uint64_t r = sh->kvpop_r, m = sh->kvpop_m;
			bad |= wadd(&w, "kvpop.%u.proj.weight", l, 2, r, d, 0, 0,
			            0.05f, 0);
			bad |= wadd(&w, "kvpop.%u.fc1.weight", l, 2, m, r + 1, 0,
			            0, 0.5f, 0);
			bad |= wadd(&w, "kvpop.%u.fc1.bias", l, 1, m, 0, 0, 0,
			            0.1f, 0);
			bad |= wadd(&w, "kvpop.%u.fc2.weight", l, 2, kv, m, 0, 0,
			            0.5f, 0);
			bad |= wadd(&w, "kvpop.%u.fc2.bias", l, 1, kv, 0, 0, 0,
			            0.1f, 0);
		}
	}
	/* kvpop's learned memory (read by memory=learned only): per layer a
	 * decay of 2 to 10 tokens and readout weights w_s, w_f about 1 */
	if (kind == 2 && !bad) {
		bad |= wadd(&w, "kvpop.memory", 0, 2, g->n_layers, 3, 0, 0,
		            1.0f, 1.0f);
		for (uint32_t l = 0; !bad && l < g->n_layers; l++)
			w.data[w.n - 1][3 * l] = 2.0f + (float)(l % 5) * 2.0f;
	}
	int rc = bad ? errors_fmt(err, errlen, KVT_ENOMEM,
	                          "random weights: out of memory")
	             : weights_write(path, w.t, w.n, err, errlen);
	for (size_t i = 0; i < w.n; i++)
		free(w.data[i]);
	free(w.t);
	free(w.data);
	free(w.nm);
	return rc;
}
