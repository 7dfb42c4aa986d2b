/*
 * prepare.c — the policy spec loadgen sends and its local instance:
 * learned policies without model= get random seeded weights written into a
 * scratch directory (removed at exit), and the spec names them.
 */
#include "loadgen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "policy.h"
#include "weights.h"

/* Uniform in [lo, hi) from (seed, tensor, index). */
static float frand(uint64_t seed, uint32_t t, uint64_t i, float lo, float hi)
{
	uint64_t h = pattern_mix(pattern_mix(seed ^ 0x5eed) ^
	                         ((uint64_t)t << 40) ^ i);
	return lo + (hi - lo) * (float)(h >> 40) / 16777216.0f;
}

struct wbuild {
	struct weights_tensor t[64 * 8];
	char names[64 * 8][48];
	float *data[64 * 8];
	size_t n;
	uint64_t seed;
};

/* Adds a tensor filled uniform in [lo, hi) (lo == hi: constant). */
static int wb_add(struct wbuild *b, const char *name, uint32_t nd,
                  uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3,
                  float lo, float hi)
{
	if (b->n == sizeof(b->t) / sizeof(b->t[0]))
		return -1;
	uint64_t sh[4] = {s0, s1, s2, s3}, numel = 1;
	for (uint32_t d = 0; d < nd; d++)
		numel *= sh[d];
	float *v = malloc(numel * sizeof(float) + 1);
	if (!v)
		return -1;
	for (uint64_t i = 0; i < numel; i++)
		v[i] = lo == hi ? lo : frand(b->seed, (uint32_t)b->n, i, lo, hi);
	snprintf(b->names[b->n], sizeof(b->names[0]), "%s", name);
	b->t[b->n] = (struct weights_tensor){b->names[b->n], nd,
	                                     {s0, s1, s2, s3}, v};
	b->data[b->n++] = v;
	return 0;
}

/*
 * Writes random seeded weights for a learned policy (kvzap: MLP hidden 8,
 * output bias -4 so about half the entries fall below the default
 * threshold; fastkvzip: D' 4, 4 sinks; kvpop: r 4, m 8 and a learned
 * memory) into o->scratch
 * and appends model=PATH to spec.  0, or -1 with a message printed.
 */
static int gen_weights(struct opts *o, const char *name, char *spec,
                       size_t len)
{
	struct wbuild *b = calloc(1, sizeof(*b));
	if (!b)
		return -1;
	b->seed = o->seed;
	uint64_t d = (uint64_t)o->heads * o->head_dim, nkv = o->kv_heads;
	uint64_t G = o->heads / o->kv_heads;
	int bad = 0;
	char nm[48];
	for (uint32_t l = 0; l < o->layers && !bad; l++) {
#define ADD(fmt, ...)                                                          	(snprintf(nm, sizeof(nm), fmt, l), bad |= wb_add(b, nm, __VA_ARGS__))
		if (!strcmp(name, "kvzap")) {
			ADD("kvzap.%u.fc1.weight", 2, 8, d, 0, 0, -1.0f, 1.0f);
			ADD("kvzap.%u.fc1.bias", 1, 8, 0, 0, 0, -0.5f, 0.5f);
			ADD("kvzap.%u.fc2.weight", 2, nkv, 8, 0, 0, -1.0f, 1.0f);
			ADD("kvzap.%u.fc2.bias", 1, nkv, 0, 0, 0, -4.0f, -4.0f);
		} else if (!strcmp(name, "fastkvzip")) {
			ADD("fastkvzip.%u.q_proj.weight", 2, nkv * G * 4, d, 0, 0,
			    -0.5f, 0.5f);
			ADD("fastkvzip.%u.q_proj.bias", 1, nkv * G * 4, 0, 0, 0,
			    -0.5f, 0.5f);
			ADD("fastkvzip.%u.k_proj.weight", 2, nkv * 4, d, 0, 0,
			    -0.5f, 0.5f);
			ADD("fastkvzip.%u.q_norm.weight", 1, 4, 0, 0, 0, 1.0f, 1.0f);
			ADD("fastkvzip.%u.k_norm.weight", 1, 4, 0, 0, 0, 1.0f, 1.0f);
			ADD("fastkvzip.%u.k_base", 4, nkv, 1, 4, 4, -1.0f, 1.0f);
			ADD("fastkvzip.%u.b", 3, nkv, 1, G, 0, -0.5f, 0.5f);
		} else {
			ADD("kvpop.%u.proj.weight", 2, 4, d, 0, 0, -0.5f, 0.5f);
			ADD("kvpop.%u.fc1.weight", 2, 8, 5, 0, 0, -1.0f, 1.0f);
			ADD("kvpop.%u.fc1.bias", 1, 8, 0, 0, 0, -0.5f, 0.5f);
			ADD("kvpop.%u.fc2.weight", 2, nkv, 8, 0, 0, -1.0f, 1.0f);
			ADD("kvpop.%u.fc2.bias", 1, nkv, 0, 0, 0, 0.0f, 0.0f);
		}
#undef ADD
	}
	/* kvpop's learned memory (memory=learned; the other specs leave it
	 * unread): per layer a decay in [1, 9) tokens and readout weights
	 * w_s, w_f in [-1, 1) */
	if (!bad && !strcmp(name, "kvpop")) {
		bad |= wb_add(b, "kvpop.memory", 2, o->layers, 3, 0, 0, -1.0f,
		              1.0f);
		for (uint32_t l = 0; !bad && l < o->layers; l++) {
			float *v = b->data[b->n - 1] + 3 * l;
			v[0] = 1.0f + 8.0f * fabsf(v[0]);
		}
	}
	char path[128], err[KVT_ERRTEXT_MAX] = "";
	snprintf(path, sizeof(path), "%s/%s.safetensors", o->scratch, name);
	int rc = bad ? -1 : weights_write(path, b->t, b->n, err, sizeof(err));
	for (size_t i = 0; i < b->n; i++)
		free(b->data[i]);
	free(b);
	if (rc) {
		fprintf(stderr, "kvtrim-loadgen: cannot write weights: %s\n",
		        bad ? "out of memory" : err);
		return -1;
	}
	size_t n = strlen(spec);
	snprintf(spec + n, len - n, "%smodel=%s", strchr(spec, ':') ? "," : ":",
	         path);
	return 0;
}

void prepare_remove_scratch(const struct opts *o)
{
	static const char *const names[] = {"kvzap", "fastkvzip", "kvpop"};
	char path[128];
	if (!o->scratch[0])
		return;
	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/%s.safetensors", o->scratch,
		         names[i]);
		unlink(path);
	}
	rmdir(o->scratch);
}

/*
 * Completes the spec (generated weights for a learned policy without
 * model=) and creates the local policy instance for the geometry.
 */
int prepare_policy(struct opts *o, char *spec, size_t len)
{
	snprintf(spec, len, "%s", o->policy);
	const char *learned = model_policy_is(spec, "kvzap")       ? "kvzap"
	                      : model_policy_is(spec, "fastkvzip") ? "fastkvzip"
	                      : model_policy_is(spec, "kvpop")     ? "kvpop"
	                                                     : NULL;
	if (learned && !strstr(spec, "model=")) {
		snprintf(o->scratch, sizeof(o->scratch),
		         "/tmp/kvtrim-loadgen-XXXXXX");
		if (!mkdtemp(o->scratch) || chmod(o->scratch, 0755) ||
		    gen_weights(o, learned, spec, len)) {
			perror("kvtrim-loadgen: scratch directory");
			return -1;
		}
	}
	o->policy = spec;
	uint32_t headroom = options_headroom(o);
	struct policy_geom ge = {
		.n_layers = o->layers, .n_heads = o->heads,
		.n_kv_heads = o->kv_heads, .head_dim = o->head_dim,
		.d_model = o->heads * o->head_dim,
		.page_tokens = o->page_tokens, .dtype = o->dtype,
		.headroom = headroom,
	};
	char err[KVT_ERRTEXT_MAX] = "";
	if (policy_create(spec, &ge, &o->pol, err, sizeof(err))) {
		fprintf(stderr, "kvtrim-loadgen: policy: %s\n", err);
		return -1;
	}
	return 0;
}
