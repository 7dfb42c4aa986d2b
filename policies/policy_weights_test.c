/*
 * policy_weights_test.c — the policies with learned scorers (kvzap linear
 * and MLP, fastkvzip, kvpop) on weight files written here, their weight
 * refusals, staged inputs that are not finite refused before decide(),
 * and kvzap's and fastkvzip's device plans against their host rules.
 *
 * The miniature tenant (struct fx) is policy_fixture.h's.
 */
#include "policy_fixture.h"

#include "fastkvzip_rule.h"
#include "kvpop_rule.h"
#include "kvzap_rule.h"

static const char *tmp_path(const char *name)
{
	static char buf[4][512];
	static int n;
	char *b = buf[n++ % 4];
	snprintf(b, 512, "%s/%s", th_tmpdir(), name);
	return b;
}

static void write_w(const char *path, const struct weights_tensor *t,
                    size_t n)
{
	char err[KVT_ERRTEXT_MAX] = "";
	int rc = weights_write(path, t, n, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "weights_write: %s", err);
}

/* Replaces the first float equal to from in the file by NaN. */
static void poison(const char *path, float from)
{
	FILE *f = fopen(path, "r+b");
	T_ASSERT(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	char *b = malloc((size_t)n);
	fseek(f, 0, SEEK_SET);
	T_EQ(fread(b, 1, (size_t)n, f), (size_t)n);
	for (long i = 0; i + 4 <= n; i++) {
		float v;
		memcpy(&v, b + i, 4);
		if (v == from) {
			float nan = NAN;
			fseek(f, i, SEEK_SET);
			fwrite(&nan, 4, 1, f);
			break;
		}
	}
	fclose(f);
	free(b);
}

/* kvzap linear weights for 2 layers, 2 KV heads, d 4: head 0 reads x0,
 * head 1 reads x1.  names: "kvzap" or "kvpress" scheme; skip_b1: leave
 * layer 1's bias out; wide: a bad shape. */
static void kvzap_linear(const char *path, int kvpress, int skip_b1, int wide)
{
	static const float W[8] = {1, 0, 0, 0, 0, 1, 0, 0};
	static const float Ww[10] = {1, 0, 0, 0, 0, 0, 1, 0, 0, 0};
	static const float b[2] = {0, 1234.5f};
	static const float z[2] = {0, 0};
	struct weights_tensor t[4];
	char names[4][32];
	size_t n = 0;
	for (uint32_t l = 0; l < 2; l++) {
		snprintf(names[n], 32, kvpress ? "layers.%u.weight"
		                               : "kvzap.%u.weight", l);
		t[n] = (struct weights_tensor){names[n], 2, {2, wide ? 5 : 4},
		                               wide ? Ww : W};
		n++;
		if (l == 1 && skip_b1)
			continue;
		snprintf(names[n], 32, kvpress ? "layers.%u.bias"
		                               : "kvzap.%u.bias", l);
		/* layer 0's bias is 0; layer 1's carries a marker value */
		t[n] = (struct weights_tensor){names[n], 1, {2},
		                               l ? b : z};
		n++;
	}
	write_w(path, t, n);
}

TEST(policy, kvzap_linear_rule)
{
	/* window 2, threshold 0.5: an entry is decided at n = pos + 3.
	 * head 0 score x0, head 1 score x1. */
	const char *w = tmp_path("kvzap.safetensors");
	kvzap_linear(w, 0, 0, 0);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=2,threshold=0.5",
	         w);
	const float x[5][FX_D] = {{.9f, .1f}, {.2f, .8f}, {.7f, .5f},
	                          {.1f, .1f}, {.6f, .3f}};
	const float a[FX_KV] = {0};
	struct fx f;
	fx_init(&f, spec, 2, 2);
	T_EQ(f.p->entry_floats, 1);
	for (uint32_t n = 0; n < 5; n++) {
		fx_step(&f, a, x[n]);
		if (n == 2) { /* pos 0 decided: head 1 drops it */
			FX_EXPECT(&f, 0, 0, 1, 2);
			FX_EXPECT(&f, 1, 1, 2);
		}
	}
	/* pos 1: head 0 drops (.2); pos 2: .7 keeps, .5 == tau keeps;
	 * pos 3, 4 still in the window */
	FX_EXPECT(&f, 0, 0, 2, 3, 4);
	FX_EXPECT(&f, 1, 1, 2, 3, 4);
	/* the score moved with its entry */
	for (uint32_t i = 0; i < f.len[1]; i++)
		if (f.pos[1][i] == 1)
			T_ASSERT(f.ent[1][i] == 0.8f);
	policy_free(f.p);

	/* the same in one prefill sync: pos 0..2 leave the window at once */
	fx_init(&f, spec, 2, 2);
	T_OK(fx_sync(&f, 5, KVT_PHASE_PREFILL, NULL, x, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 2, 3, 4);
	FX_EXPECT(&f, 1, 1, 2, 3, 4);
	/* decided once: pos 0 of head 0 (.9) stays under any later pressure */
	policy_set_pressure(f.p, 1.0f); /* tau 2.5 */
	fx_step(&f, a, (const float[FX_D]){.9f, .9f});
	/* pos 3 left now: .1 < 2.5 dropped in both; pos 0, 2 untouched */
	FX_EXPECT(&f, 0, 0, 2, 4, 5);
	FX_EXPECT(&f, 1, 1, 2, 4, 5);
	policy_free(f.p);

	/* window 0 decides at arrival; a NaN x is refused before it is
	 * scored (policy.inputs_refused) */
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=0,threshold=0", w);
	fx_init(&f, spec, 2, 2);
	T_ERR(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL,
	              (const float[1][FX_D]){{NAN, 1.0f}}, NULL, NULL),
	      KVT_EINVAL);
	f.n_seen = 0;
	f.len[0] = f.len[1] = 0;
	fx_step(&f, a, (const float[FX_D]){0.0f, -1.0f});
	FX_EXPECT(&f, 0, 0); /* 0 >= 0 keeps */
	T_EQ(f.len[1], 0);
	policy_free(f.p);

	/* sinks protect */
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=0,sinks=1,"
	         "threshold=5", w);
	fx_init(&f, spec, 2, 2);
	fx_step(&f, a, x[0]);
	fx_step(&f, a, x[1]);
	FX_EXPECT(&f, 0, 0);
	FX_EXPECT(&f, 1, 0);
	policy_free(f.p);
}

TEST(policy, kvzap_mlp_and_kvpress_dir)
{
	/* MLP hidden 1: head 0 = gelu(x0), head 1 = -gelu(x0); threshold 0
	 * keeps head 0 for x0 >= 0 and head 1 only at x0 = 0. */
	const char *dir = tmp_path("kvzap-mlp");
	T_EQ(mkdir(dir, 0755), 0);
	char path[600];
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	static const float W1[4] = {1, 0, 0, 0}, b1[1] = {0};
	static const float W2[2] = {1, -1}, b2[2] = {0, 0};
	struct weights_tensor t[8];
	char nm[8][32];
	for (uint32_t l = 0; l < 2; l++) {
		snprintf(nm[4 * l], 32, "layers.%u.0.weight", l);
		snprintf(nm[4 * l + 1], 32, "layers.%u.0.bias", l);
		snprintf(nm[4 * l + 2], 32, "layers.%u.2.weight", l);
		snprintf(nm[4 * l + 3], 32, "layers.%u.2.bias", l);
		t[4 * l] = (struct weights_tensor){nm[4 * l], 2, {1, 4}, W1};
		t[4 * l + 1] = (struct weights_tensor){nm[4 * l + 1], 1, {1}, b1};
		t[4 * l + 2] = (struct weights_tensor){nm[4 * l + 2], 2, {2, 1},
		                                       W2};
		t[4 * l + 3] = (struct weights_tensor){nm[4 * l + 3], 1, {2}, b2};
	}
	write_w(path, t, 8);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	FILE *c = fopen(path, "w");
	fprintf(c, "{\"input_dim\": 4, \"output_dim\": 2, \"hidden_dim\": 1, "
	           "\"n_modules\": 2}\n");
	fclose(c);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvzap:model=%s,window=0,threshold=0", dir);
	struct fx f;
	fx_init(&f, spec, 2, 2);
	const float a[FX_KV] = {0};
	fx_step(&f, a, (const float[FX_D]){1.0f});
	fx_step(&f, a, (const float[FX_D]){-1.0f});
	fx_step(&f, a, (const float[FX_D]){0.0f});
	/* gelu(-1) = -.159: head 0 drops pos 1, head 1 (+.159) keeps it */
	FX_EXPECT(&f, 0, 0, 2);
	FX_EXPECT(&f, 1, 1, 2);
	policy_free(f.p);

	/* config.json describing another model is refused */
	c = fopen(path, "w");
	fprintf(c, "{\"input_dim\": 8, \"output_dim\": 2, \"hidden_dim\": 1}\n");
	fclose(c);
	struct policy_geom ge = geom(2, 2);
	refused_why(spec, &ge, "input_dim", __LINE__);
}

TEST(policy, kvzap_weight_refusals)
{
	struct policy_geom ge = geom(2, 2);
	char spec[600];
	const char *w = tmp_path("bad.safetensors");
	/* missing tensor */
	kvzap_linear(w, 1, 1, 0);
	snprintf(spec, sizeof(spec), "kvzap:model=%s", w);
	refused_why(spec, &ge, "layers.1.bias", __LINE__);
	/* bad shape */
	kvzap_linear(w, 0, 0, 1);
	refused_why(spec, &ge, "shape", __LINE__);
	/* fine, then NaN */
	kvzap_linear(w, 0, 0, 0);
	struct policy *p = make_g(spec, &ge);
	policy_free(p);
	poison(w, 1234.5f);
	refused_why(spec, &ge, "NaN", __LINE__);
	/* more layers than the model */
	kvzap_linear(w, 0, 0, 0);
	struct policy_geom one = ge;
	one.n_layers = 1;
	refused_why(spec, &one, "more layers", __LINE__);
	/* fewer: a 3-layer model lacks layer 2 */
	struct policy_geom three = ge;
	three.n_layers = 3;
	refused_why(spec, &three, "kvzap.2.weight", __LINE__);
	/* not KVzap at all */
	write_w(w, &(struct weights_tensor){"x", 1, {1}, (const float[1]){0}},
	        1);
	refused_why(spec, &ge, "no KVzap tensors", __LINE__);
}

/* fastkvzip gate weights, 2 layers, 2 KV heads, G 1, dp 1, S 1: q from
 * x0, k from x1 (head 0) or x2 (head 1), zero sink key, bias 0, so
 * score = sigmoid(sign(x0) sign(x_{1+g})). */
static void fkv_weights(const char *path, int skip, float gq)
{
	static const float Wq[8] = {1, 0, 0, 0, 1, 0, 0, 0};
	static const float Wk[8] = {0, 1, 0, 0, 0, 0, 1, 0};
	static const float z2[2] = {0, 0}, one[1] = {1};
	float g[1] = {gq};
	struct weights_tensor t[14];
	char nm[14][48];
	size_t n = 0;
	for (uint32_t l = 0; l < 2; l++) {
#define T_(fmt, nd, s0, s1, s2, s3, d)                                         \
	do {                                                                   \
		snprintf(nm[n], 48, fmt, l);                                   \
		t[n] = (struct weights_tensor){nm[n], nd, {s0, s1, s2, s3}, d};\
		n++;                                                           \
	} while (0)
		T_("fastkvzip.%u.q_proj.weight", 2, 2, 4, 0, 0, Wq);
		T_("fastkvzip.%u.q_proj.bias", 1, 2, 0, 0, 0, z2);
		T_("fastkvzip.%u.k_proj.weight", 2, 2, 4, 0, 0, Wk);
		T_("fastkvzip.%u.q_norm.weight", 1, 1, 0, 0, 0,
		   l ? g : one);
		T_("fastkvzip.%u.k_norm.weight", 1, 1, 0, 0, 0, one);
		T_("fastkvzip.%u.k_base", 4, 2, 1, 1, 1, z2);
		if (!(skip && l == 1))
			T_("fastkvzip.%u.b", 3, 2, 1, 1, 0, z2);
#undef T_
	}
	write_w(path, t, n);
}

TEST(policy, fastkvzip_rule)
{
	const char *w = tmp_path("fkv.safetensors");
	fkv_weights(w, 0, 1.0f);
	char spec[600];
	/* prefill of 8, sinks 1, window 2, ratio 0.5: B 4 per head, the layer
	 * keeps 8; protected 0, 6, 7 in each head (6), so 2 more of the
	 * candidates 1..5 of both heads: head 0 agrees (score .73) at 1, 2,
	 * everything else .27: head 0 keeps 0 1 2 6 7, head 1 keeps 0 6 7 */
	snprintf(spec, sizeof(spec), "fastkvzip:model=%s,sinks=1,window=2", w);
	const float x[8][FX_D] = {{1, 1, 1}, {1, 1, -1}, {-1, -1, 1},
	                          {1, -1, -1}, {-1, 1, 1}, {1, -1, -1},
	                          {1, 1, 1}, {1, 1, 1}};
	struct fx f;
	fx_init(&f, spec, 2, 2);
	T_OK(fx_sync(&f, 8, KVT_PHASE_PREFILL, NULL, x, NULL, NULL));
	FX_EXPECT(&f, 0, 0, 1, 2, 6, 7);
	FX_EXPECT(&f, 1, 0, 6, 7);
	float s = f.ent[0][0];
	T_ASSERT(fabsf(s - 1.0f / (1.0f + expf(-1.0f))) < 1e-3f);
	policy_free(f.p);

	/* decode: threshold 0.5, window 2, sinks 0, every 4: decisions only
	 * at n 4 (candidates pos < 2) and n 8 (pos < 6) */
	snprintf(spec, sizeof(spec), "fastkvzip:model=%s,sinks=0,window=2,"
	         "threshold=0.5,every=4", w);
	fx_init(&f, spec, 2, 2);
	const float a[FX_KV] = {0};
	for (uint32_t n = 0; n < 8; n++) {
		fx_step(&f, a, x[n]);
		if (n == 2) {
			T_EQ(f.len[0], 3);
			T_EQ(f.len[1], 3);
		}
		if (n == 3) { /* pos 0 agrees in both, 1 only in head 0 */
			FX_EXPECT(&f, 0, 0, 1, 2, 3);
			FX_EXPECT(&f, 1, 0, 2, 3);
		}
	}
	/* n 8: pos 2..5 decided: head 0 keeps 2, head 1 none */
	FX_EXPECT(&f, 0, 0, 1, 2, 6, 7);
	FX_EXPECT(&f, 1, 0, 6, 7);
	policy_free(f.p);
}

TEST(policy, fastkvzip_weight_refusals)
{
	struct policy_geom ge = geom(2, 2);
	const char *w = tmp_path("fkv-bad.safetensors");
	char spec[600];
	snprintf(spec, sizeof(spec), "fastkvzip:model=%s", w);
	fkv_weights(w, 1, 1.0f);
	refused_why(spec, &ge, "fastkvzip.1.b", __LINE__);
	fkv_weights(w, 0, 1234.5f);
	struct policy *p = make_g(spec, &ge);
	policy_free(p);
	poison(w, 1234.5f);
	refused_why(spec, &ge, "NaN", __LINE__);
	fkv_weights(w, 0, 1.0f);
	struct policy_geom g4 = geom(4, 2); /* G 2: q_proj must be [4][4] */
	refused_why(spec, &g4, "shape", __LINE__);
	refused_why("fastkvzip", &ge, "model=PATH", __LINE__);
}

/* kvpop's budget shares in a weights file: kvpop.share [n_f][layers][1]
 * (share) and kvpop.share_keep [n_f] (keep; NULL: left out). */
struct kvpop_shares {
	uint32_t n_f, layers;
	const float *share, *keep;
};

/* kvpop weights, 2 layers, r 1, m 1: u = x0; z = W1 [u, ln a] + 10;
 * s = z (gelu is the identity that far out); with shares sh when not
 * NULL and the learned memory kvpop.memory [2][3] mem when not NULL. */
static void kvpop_weights_shm(const char *path, float wu, float wa, int bad,
                              const struct kvpop_shares *sh,
                              const float *mem)
{
	static const float P[4] = {1, 0, 0, 0}, b1[1] = {10}, W2[1] = {1},
	                   b2[1] = {0};
	float W1[2] = {wu, wa};
	struct weights_tensor t[13];
	char nm[13][40];
	size_t n = 0;
	if (mem)
		t[n++] = (struct weights_tensor){"kvpop.memory", 2, {2, 3}, mem};
	if (sh) {
		t[n++] = (struct weights_tensor){"kvpop.share", 3,
		                                 {sh->n_f, sh->layers, 1},
		                                 sh->share};
		if (sh->keep)
			t[n++] = (struct weights_tensor){"kvpop.share_keep", 1,
			                                 {sh->n_f}, sh->keep};
	}
	for (uint32_t l = 0; l < 2; l++) {
		snprintf(nm[n], 40, "kvpop.%u.proj.weight", l);
		t[n] = (struct weights_tensor){nm[n], 2, {1, 4}, P};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc1.weight", l);
		t[n] = (struct weights_tensor){nm[n], 2, {1, bad ? 1 : 2}, W1};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc1.bias", l);
		t[n] = (struct weights_tensor){nm[n], 1, {1}, b1};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc2.weight", l);
		t[n] = (struct weights_tensor){nm[n], 2, {1, 1}, W2};
		n++;
		snprintf(nm[n], 40, "kvpop.%u.fc2.bias", l);
		t[n] = (struct weights_tensor){nm[n], 1, {1}, b2};
		n++;
	}
	write_w(path, t, n);
}

static void kvpop_weights_sh(const char *path, float wu, float wa, int bad,
                             const struct kvpop_shares *sh)
{
	kvpop_weights_shm(path, wu, wa, bad, sh, NULL);
}

static void kvpop_weights(const char *path, float wu, float wa, int bad)
{
	kvpop_weights_sh(path, wu, wa, bad, NULL);
}

TEST(policy, kvpop_delayed_scores)
{
	/* score = x0 + 10 at age 2, tokens 3, delay 2, sinks 0, no window
	 * and no memory (the scorer alone):
	 * x0 .5 .1 .9 .3 .2 .8
	 *   n 3: pos 0 scored; 1, 2 protected; keep 0
	 *   n 4: pos 1 (10.1) vs 0 (10.5): drop 1
	 *   n 5: pos 2 (10.9) vs 0: drop 0
	 *   n 6: pos 3 (10.3) vs 2: drop 3 -> {2, 4, 5} */
	const char *w = tmp_path("kvpop.safetensors");
	kvpop_weights(w, 1.0f, 0.0f, 0);
	char spec[600];
	/* the defaults: a window of min(48, floor(2/5 of the budget)), no
	 * memory */
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=7", w);
	struct fx f;
	fx_init(&f, spec, 2, 1);
	T_EQ(f.p->args.window, 2);
	T_EQ(f.p->args.memory, 0);
	T_EQ(f.p->args.trust, 0);
	T_EQ(f.p->entry_floats, 2);
	policy_free(f.p);
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=100", w);
	fx_init(&f, spec, 2, 1);
	T_EQ(f.p->args.window, 40);
	policy_free(f.p);
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=121", w);
	fx_init(&f, spec, 2, 1);
	T_EQ(f.p->args.window, 48);
	policy_free(f.p);
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=3,delay=2,sinks=0,"
	         "window=0,memory=0", w);
	fx_init(&f, spec, 2, 1);
	T_EQ(f.p->entry_floats, 2);
	const float x0[6] = {.5f, .1f, .9f, .3f, .2f, .8f};
	const float a[FX_KV] = {0};
	for (uint32_t n = 0; n < 6; n++) {
		fx_step(&f, a, (const float[FX_D]){x0[n]});
		if (n == 3)
			FX_EXPECT(&f, 0, 0, 2, 3);
	}
	FX_EXPECT(&f, 0, 2, 4, 5);
	policy_free(f.p);
}

/* kvpop's device plan (policy_ops.device) counts the drops its decide()
 * makes, at every sync of a ragged run (fx_plan_sync), with and without
 * sinks and every, and with more protected than the budget keeps. */
TEST(policy, kvpop_device_plan_counts_its_drops)
{
	const char *w = tmp_path("kvpop3.safetensors");
	kvpop_weights(w, 0.5f, 1.0f, 0);
	/* the scorer alone (the third protects more than it keeps) */
	const char *args[] = {"tokens=6,delay=2,sinks=0,window=0,memory=0",
	                      "tokens=7,delay=3,sinks=2,every=3,window=0,"
	                      "memory=0",
	                      "tokens=3,delay=3,sinks=2,window=0,memory=0",
	                      /* the defaults: window 3 and a memory */
	                      "tokens=6,delay=2,sinks=1",
	                      /* a window longer than the delay (the
	                       * second protecting more than it keeps), and
	                       * one shorter */
	                      "tokens=8,delay=2,sinks=1,window=4,every=2",
	                      "tokens=4,delay=1,sinks=1,window=5",
	                      "tokens=6,delay=3,sinks=0,window=2",
	                      /* a memory: the band is the whole list, the
	                       * counts are the same rule's */
	                      "tokens=8,delay=2,sinks=1,window=4,memory=8,"
	                      "trust=2,every=2"};
	for (size_t k = 0; k < sizeof(args) / sizeof(args[0]); k++) {
		char spec[600];
		snprintf(spec, sizeof(spec), "kvpop:model=%s,%s", w, args[k]);
		struct fx f;
		fx_init(&f, spec, 2, 1);
		uint32_t word = 0, seed = 11 + (uint32_t)k;
		fx_plan_sync(&f, 9, &word, &seed);
		while (f.n_seen + 4 < FX_MAX - 1)
			fx_plan_sync(&f, fx_next(&seed) % 5, &word, &seed);
		policy_free(f.p);
	}
}

/* Runs kvpop with shares share[2] (layers 0 and 1, one KV head) at the
 * one keep fraction keep, tokens 10, delay 2, no sinks or window, a token
 * a sync for 20 tokens, x0 of token n = (n m % q) / q: each layer's list
 * length after token n must be want[layer][n]; then the device plan must
 * count what decide() drops, in both layers, over ragged syncs from
 * seed0. */
static void kvpop_budget_run(const char *file, const float share[2],
                             float keep, const uint32_t want[2][20],
                             uint32_t m, uint32_t q, uint32_t seed0)
{
	const char *w = tmp_path(file);
	const struct kvpop_shares sh = {1, 2, share, &keep};
	kvpop_weights_sh(w, 1.0f, 0.0f, 0, &sh);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=10,delay=2,"
	         "sinks=0,window=0", w);
	const float a[FX_KV] = {0};
	for (uint32_t layer = 0; layer < 2; layer++) {
		struct fx f;
		fx_init(&f, spec, 2, 1);
		f.layer = layer;
		for (uint32_t n = 0; n < 20; n++) {
			fx_step(&f, a, (const float[FX_D]){(float)((n * m) % q) /
			                                   (float)q});
			T_EQ(f.len[0], want[layer][n]);
		}
		policy_free(f.p);
	}
	for (uint32_t layer = 0; layer < 2; layer++) {
		struct fx f;
		fx_init(&f, spec, 2, 1);
		f.layer = layer;
		uint32_t word = 0, seed = seed0 + layer;
		fx_plan_sync(&f, 9, &word, &seed);
		while (f.n_seen + 4 < FX_MAX - 1)
			fx_plan_sync(&f, fx_next(&seed) % 5, &word, &seed);
		policy_free(f.p);
	}
}

/*
 * Budget shares by hand: keep fraction 1/2 with shares 1.5 (layer 0) and
 * 0.5 (layer 1); tokens 10, delay 2, no sinks or window: P0 = 2, free
 * budget 8 a list, 16 for both, phi = 8 / (n - 2); list i's part is x_i =
 * 8 share_i, share linear in ln phi from 1 at phi = 1 to the table's at
 * phi = 1/2 (t = ln(1 / phi) / ln 2) and the table's below; each list gets
 * floor(x_i), and the one with the larger remainder the 16 - floor(x0) -
 * floor(x1) entries left (largest remainders):
 *   n    phi    t      x0      x1     R  budget0  budget1
 *   11   0.889  0.170  8.680   7.320  1  2+9=11   2+7=9
 *   12   0.8    0.322  9.288   6.712  1  11       9
 *   13   0.727  0.459  9.838   6.162  1  12       8
 *   14   0.667  0.585  10.340  5.660  1  12       8
 *   15   0.615  0.700  10.802  5.198  1  13       7
 *   16   0.571  0.807  11.229  4.771  1  13       7
 *   17   0.533  0.907  11.628  4.372  1  14       6
 *   18+  <= .5  1      12      4      0  14       6
 * (a share linear in phi would give budget0 12 at n = 12, where x0 = 9.6
 * takes the remainder; plain floors would give 10 and 9 at n = 11, one
 * entry short); a list holds min(its length before + 1,
 * budget), and the two together exactly 2 x 10 once full.  Up to n = 10
 * nothing is dropped.  The shares as written sum to 4 (mean 2): they are
 * normalised to 1.5 and 0.5.
 */
TEST(policy, kvpop_budget_shares_by_hand)
{
	static const uint32_t want[2][20] = {
		{1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
		 11, 11, 12, 12, 13, 13, 14, 14, 14, 14},
		{1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
		 9, 9, 8, 8, 7, 7, 6, 6, 6, 6},
	};
	kvpop_budget_run("kvpop-sh.safetensors", (const float[2]){3.0f, 1.0f}, 0.5f, want, 7,
	                 11, 5);
}

/*
 * A part larger than its list can hold goes to the others (water
 * filling): shares 1.9 and 0.1 at keep 3/4, tokens 10, delay 2, no sinks
 * or window: P0 = 2, free total 16, phi = 8 / (n - 2), share linear in ln
 * phi from 1 at phi = 1 to the table's at phi = 3/4 (t = ln(1 / phi) /
 * ln(4 / 3)), the table's below; list 0's part x0 = 8 share0 is cut to
 * what it can hold, n - 2, and list 1 gets the rest, 16 - (n - 2):
 *   n    phi    share0  x0     cut  list 1's part  budget0  budget1
 *   11   0.889  1.368   10.95  9    7              11       9
 *   12   0.8    1.698   13.59  10   6              12       8
 *   13   0.727  1.9     15.2   11   5              13       7
 *   ...  (one less for list 1 a token)
 *   17   0.533  1.9     15.2   15   1              17       3
 *   18+         1.9     15.2   -    0.8: the remainder's entry, 17 and 3
 * Together exactly 2 x 10 from n = 10 on; without the cut list 1 would
 * get 2 + 5 = 7 at n = 11 (x1 = 8 x 0.632 = 5.05) and the two would hold
 * 18.
 */
TEST(policy, kvpop_budget_cut_parts_go_to_the_others)
{
	static const uint32_t want[2][20] = {
		{1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
		 11, 12, 13, 14, 15, 16, 17, 17, 17, 17},
		{1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
		 9, 8, 7, 6, 5, 4, 3, 3, 3, 3},
	};
	kvpop_budget_run("kvpop-cut.safetensors", (const float[2]){1.9f, 0.1f}, 0.75f, want, 5,
	                 7, 9);
}

/* Shares that do not make a budget are refused when the policy is
 * created, with the reason. */
TEST(policy, kvpop_share_refusals)
{
	struct policy_geom ge = geom(2, 1);
	const char *w = tmp_path("kvpop-shbad.safetensors");
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s", w);
	const float ok[4] = {1, 1, 2, 0}, neg[2] = {2, -1}, zero[2] = {0, 0};
	const float k1[1] = {0.5f}, k2[2] = {0.5f, 0.5f}, kone[1] = {1.0f};
	const struct {
		struct kvpop_shares sh;
		const char *needle;
	} bad[] = {
		{{1, 2, ok, NULL}, "come together"},
		{{1, 3, ok, k1}, "shape"},     /* three layers for two */
		{{2, 2, ok, k2}, "decrease"},  /* 1/2 twice */
		{{1, 2, ok, kone}, "decrease"}, /* a fraction of 1 */
		{{1, 2, neg, k1}, "negative"},
		{{1, 2, zero, k1}, "all zero"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kvpop_weights_sh(w, 1.0f, 0.0f, 0, &bad[i].sh);
		refused_why(spec, &ge, bad[i].needle, __LINE__);
	}
	/* two fractions, the second smaller: loads */
	const struct kvpop_shares good = {2, 2, ok, (const float[2]){.5f, .25f}};
	kvpop_weights_sh(w, 1.0f, 0.0f, 0, &good);
	policy_free(make_g(spec, &ge));
}

TEST(policy, kvpop_attention_feature)
{
	/* score = ln(A + 1e-6) + 10, A = attention received from the two
	 * following queries, mean over G: q 1, lse 0 give alpha_i each, so
	 * A = 2 alpha_i.  tokens 3, delay 2, sinks 0.
	 * alpha .5 .1 .3 .4 .2 .6:
	 *   n 4: pos 1 (A .2) vs 0 (1.0): drop 1
	 *   n 5: pos 2 (.6) vs 0: drop 2
	 *   n 6: pos 3 (.8) vs 0: drop 3 -> {0, 4, 5} */
	const char *w = tmp_path("kvpop2.safetensors");
	kvpop_weights(w, 0.0f, 1.0f, 0);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=3,delay=2,sinks=0,"
	         "window=0,memory=0", w);
	struct fx f;
	fx_init(&f, spec, 2, 1);
	const float al[6] = {.5f, .1f, .3f, .4f, .2f, .6f};
	for (uint32_t n = 0; n < 6; n++) {
		float av[FX_KV] = {al[n]};
		fx_step(&f, av, NULL);
	}
	FX_EXPECT(&f, 0, 0, 4, 5);
	for (uint32_t i = 0; i < f.len[0]; i++)
		if (f.pos[0][i] == 0)
			T_ASSERT(fabsf(f.ent[0][2 * i] - 1.0f) < 1e-4f);
	policy_free(f.p);

	/* the same prompt in one prefill sync gives the same survivors when
	 * the budget allows them all to age: tokens 6 keeps everything */
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=6,delay=2,sinks=0,"
	         "window=0,memory=0", w);
	fx_init(&f, spec, 2, 1);
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL,
	             (const float[6][FX_KV]){{.5f}, {.1f}, {.3f}, {.4f}, {.2f},
	                                     {.6f}},
	             NULL, NULL, NULL));
	T_EQ(f.len[0], 6);
	/* entry 0 received 2 x .5 in the same sync */
	for (uint32_t i = 0; i < f.len[0]; i++)
		if (f.pos[0][i] == 0)
			T_ASSERT(fabsf(f.ent[0][2 * i] - 1.0f) < 1e-4f);
	policy_free(f.p);

	/* window=3 protects the newest three beside the delay of 2, and
	 * the budget of 3 keeps no more: at n = 4, 5, 6 the oldest goes
	 * whatever its score (pos 0's A = 1.0 is the best) -> {3, 4, 5} */
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=3,delay=2,sinks=0,"
	         "window=3,memory=0", w);
	fx_init(&f, spec, 2, 1);
	for (uint32_t n = 0; n < 6; n++) {
		float av[FX_KV] = {al[n]};
		fx_step(&f, av, NULL);
	}
	FX_EXPECT(&f, 0, 3, 4, 5);
	policy_free(f.p);
}

/* The four steps of kvpop_memory_by_hand under spec; the query of step
 * k has q = qv[k] in both query heads (the attention paid to a key ln a
 * is a^q), entries' keys ln 2, ln .5, ln 1, ln 1. */
static void memory_steps(struct fx *f, const char *spec)
{
	static const float keys[4] = {2.0f, 0.5f, 1.0f, 1.0f},
	                   qv[4] = {1.0f, 1.0f, 1.0f, -2.0f};
	fx_init(f, spec, 2, 1);
	for (uint32_t k = 0; k < 4; k++) {
		float a[1][FX_KV] = {{keys[k]}}, q[1][FX_H] = {{qv[k], qv[k]}};
		T_OK(fx_sync(f, 1, KVT_PHASE_DECODE, a, NULL, q, NULL));
	}
}

TEST(policy, kvpop_memory_by_hand)
{
	/* delay 1, memory 2 (decay b = e^-1/2 a query).  Step 1's query
	 * pays entry 0 2^1 inside its delay: a0 = 2.  Step 2 (q 1): entry 0
	 * is past it, m0 = 2, c0 = 1; entry 1 in it, a1 = .5.  Step 3
	 * (q -2): m0 = 2b + 2^-2, c0 = b + 1; m1 = .5^-2 = 4, c1 = 1; a2 = 1. */
	const char *w = tmp_path("kvpop-mem.safetensors");
	kvpop_weights(w, 0.0f, 1.0f, 0);
	const double b = exp(-0.5);
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=16,delay=1,"
	         "sinks=0,memory=2", w);
	struct fx f;
	memory_steps(&f, spec);
	T_EQ(f.p->entry_floats, 4);
	T_EQ(f.len[0], 4);
	const double want[4][4] = {{2, NAN, 2 * b + 0.25, b + 1},
	                           {0.5, NAN, 4, 1},
	                           {1, NAN, 0, 0},
	                           {0, NAN, 0, 0}};
	for (uint32_t i = 0; i < 4; i++) {
		const float *e = &f.ent[0][(size_t)i * 4];
		T_EQ(f.pos[0][i], i);
		for (uint32_t c = 0; c < 4; c++)
			if (!isnan(want[i][c]))
				T_ASSERT(fabs(e[c] - want[i][c]) < 1e-5);
	}
	policy_free(f.p);

	/* Budget 3, position 3 in its delay: one of 0, 1, 2 goes.  The
	 * learned scores s = gelu(ln A + 10): about 10.69, 9.31, 10.
	 * trust 0 ranks by ln(128 m / c) where there is a memory: entry 0
	 * ln(128 (2b + .25) / (b + 1)) = 4.76 (fading), entry 1 ln 512 =
	 * 6.24 (now read), entry 2 (none) its s, 10: entry 0 goes.  trust
	 * 1000 weighs the learned score 1000 to c: entry 0 about 10.68,
	 * entry 1 9.30, entry 2 10: entry 1 goes, as without a memory. */
	const struct {
		const char *extra;
		uint32_t gone;
	} c[] = {{"memory=2,trust=0", 0}, {"memory=2,trust=1000", 1},
	         {"memory=0", 1}};
	for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
		snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=3,delay=1,"
		         "sinks=0,%s", w, c[k].extra);
		memory_steps(&f, spec);
		T_EQ(f.len[0], 3);
		for (uint32_t i = 0; i < f.len[0]; i++)
			T_ASSERT(f.pos[0][i] != c[k].gone);
		policy_free(f.p);
	}
}

TEST(policy, kvpop_learned_memory_by_hand)
{
	/* memory_steps with memory=learned, layer 0's row {2, w_s, w_f}:
	 * its decay of 2 tokens gives the m and c of kvpop_memory_by_hand
	 * (layer 1's row, decay 64, must not be read).  Budget 3, one of
	 * entries 0, 1, 2 goes; s about 10.69, 9.31, 10; f = ln(m / c):
	 * entry 0 ln((2b + .25) / (b + 1)) = -0.094, entry 1 ln 4 = 1.386,
	 * entry 2 (no query yet past its delay) the delay's mean, ln(1 / 1)
	 * = 0.  The readout w_s s + w_f f:
	 *   {0, 1}: -0.094, 1.386, 0: entry 0 goes (with f = ln 1e-6 for
	 *           the entry without a memory, entry 2 would);
	 *   {1, 0}: the scores alone: entry 1 goes;
	 *   {1, 2}: 10.51, 12.08, 10: entry 2 goes. */
	const double b = exp(-0.5);
	const struct {
		float ws, wf;
		uint32_t gone;
	} c[] = {{0, 1, 0}, {1, 0, 1}, {1, 2, 2}};
	const char *w = tmp_path("kvpop-lmem.safetensors");
	char spec[600];
	struct fx f;
	for (size_t k = 0; k < sizeof(c) / sizeof(c[0]); k++) {
		const float mem[6] = {2, c[k].ws, c[k].wf, 64, 5, -5};
		kvpop_weights_shm(w, 0.0f, 1.0f, 0, NULL, mem);
		snprintf(spec, sizeof(spec), "kvpop:model=%s,tokens=3,delay=1,"
		         "sinks=0,window=0,memory=learned", w);
		memory_steps(&f, spec);
		T_EQ(f.p->args.memory, POLICY_MEMORY_LEARNED);
		T_EQ(f.p->entry_floats, 4);
		T_EQ(f.len[0], 3);
		for (uint32_t i = 0; i < f.len[0]; i++) {
			const float *e = &f.ent[0][(size_t)i * 4];
			T_ASSERT(f.pos[0][i] != c[k].gone);
			if (f.pos[0][i] == 0) /* m0, c0 at decay 2 */
				T_ASSERT(fabs(e[2] - (2 * b + 0.25)) < 1e-5 &&
				         fabs(e[3] - (b + 1)) < 1e-5);
		}
		policy_free(f.p);
	}
}

/* A device for kvpop_upload: host memory, its sizes recorded. */
static size_t up_bytes;
static int up_mem_new(void *ctx, size_t bytes, void **out)
{
	(void)ctx;
	up_bytes = bytes;
	return (*out = calloc(1, bytes)) ? 0 : KVT_ENOMEM;
}
static void up_mem_free(void *ctx, void *p)
{
	(void)ctx;
	free(p);
}
static int up_copy(void *ctx, void *dst, const void *src, size_t bytes,
                   void *stream)
{
	(void)ctx;
	(void)stream;
	memcpy(dst, src, bytes);
	return 0;
}
static const char *up_error(void)
{
	return "";
}

/*
 * kvpop's device rule takes memory=learned (no veto): its upload puts the
 * table after the two layers' tensors (9 floats a layer: P [1][4], W1
 * [1][2], b1, W2, b2), per layer beta = e^(-1/T), w_s, w_f, and its params
 * point there; memory=2 uploads no table and points at none.
 */
TEST(policy, kvpop_learned_memory_goes_to_the_device)
{
	const char *w = tmp_path("kvpop-lmem-up.safetensors");
	const float mem[6] = {2, 0.25f, -1.5f, 64, 5, -5};
	kvpop_weights_shm(w, 0.0f, 1.0f, 0, NULL, mem);
	struct kvt_backend_ops o;
	memset(&o, 0, sizeof(o));
	o.name = "test";
	o.mem_new = up_mem_new;
	o.mem_free = up_mem_free;
	o.copy = up_copy;
	o.last_error = up_error;
	const char *opt[] = {"memory=learned", "memory=2"};
	for (int k = 0; k < 2; k++) {
		char spec[600], err[128];
		snprintf(spec, sizeof(spec), "kvpop:model=%s,%s", w, opt[k]);
		struct fx f;
		fx_init(&f, spec, 2, 1);
		const struct policy_device_rule *dr = f.p->ops->device;
		T_ASSERT(!dr->supports || dr->supports(f.p));
		void *c = NULL;
		T_OK(dr->upload(f.p, &o, NULL, &c, err, sizeof(err)));
		const float *t = (const float *)c + 2 * 9;
		struct kvpop_rule r;
		const struct policy_dev_bufs b = {.consts = c, .cap = 8};
		dr->params(f.p, &b, &r);
		if (k == 0) {
			T_EQ(up_bytes, (2 * 9 + 6) * sizeof(float));
			T_ASSERT(r.mem == t);
			T_EQ(r.memory, POLICY_MEMORY_LEARNED);
			T_ASSERT(fabs(t[0] - exp(-0.5)) < 1e-7);
			T_ASSERT(fabs(t[3] - exp(-1.0 / 64)) < 1e-7);
			T_ASSERT(t[1] == 0.25f && t[2] == -1.5f && t[4] == 5.0f &&
			         t[5] == -5.0f);
		} else {
			T_EQ(up_bytes, 2 * 9 * sizeof(float));
			T_ASSERT(r.mem == NULL);
			T_EQ(r.memory, 2);
			T_ASSERT(fabs(r.beta - exp(-0.5)) < 1e-7);
		}
		/* layer 1's P: its first weight, 1 */
		T_ASSERT(((const float *)c)[9] == 1.0f);
		o.mem_free(NULL, c);
		policy_free(f.p);
	}
}

TEST(policy, kvpop_learned_memory_refusals)
{
	struct policy_geom ge = geom(2, 1);
	const char *w = tmp_path("kvpop-lmem-bad.safetensors");
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s,memory=learned", w);
	kvpop_weights(w, 1.0f, 0.0f, 0); /* no kvpop.memory */
	refused_why(spec, &ge, "kvpop.memory", __LINE__);
	/* a decay below one token, in either layer (values that are not
	 * finite the weights loader refuses first) */
	const float bad[][6] = {
		{0.5f, 1, 1, 2, 1, 1},
		{2, 1, 1, 0, 1, 1},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kvpop_weights_shm(w, 1.0f, 0.0f, 0, NULL, bad[i]);
		refused_why(spec, &ge, "kvpop.memory[", __LINE__);
	}
	const float ok[6] = {2, 1, 1, 64, 0, 1};
	kvpop_weights_shm(w, 1.0f, 0.0f, 0, NULL, ok);
	policy_free(make_g(spec, &ge));
	/* trust weighs memory=T's blend: refused beside memory=learned */
	snprintf(spec, sizeof(spec), "kvpop:model=%s,memory=learned,trust=1",
	         w);
	refused_why(spec, &ge, "trust", __LINE__);
	/* the value is a uint32 below 2^32 - 1 or the word learned */
	const char *vals[] = {"learnt", "Learned", "4294967295", "-1", ""};
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		snprintf(spec, sizeof(spec), "kvpop:model=%s,memory=%s", w,
		         vals[i]);
		refused_why(spec, &ge, "memory", __LINE__);
	}
	snprintf(spec, sizeof(spec), "kvpop:model=%s,memory=4294967294", w);
	policy_free(make_g(spec, &ge));
}

TEST(policy, kvpop_weight_refusals)
{
	struct policy_geom ge = geom(2, 1);
	const char *w = tmp_path("kvpop-bad.safetensors");
	char spec[600];
	snprintf(spec, sizeof(spec), "kvpop:model=%s", w);
	kvpop_weights(w, 1.0f, 0.0f, 1);
	refused_why(spec, &ge, "shape", __LINE__);
	kvpop_weights(w, 1234.5f, 0.0f, 0);
	struct policy *p = make_g(spec, &ge);
	policy_free(p);
	poison(w, 1234.5f);
	refused_why(spec, &ge, "NaN", __LINE__);
	struct policy_geom g2 = geom(2, 2); /* fc2 must be [2][1] */
	kvpop_weights(w, 1.0f, 0.0f, 0);
	refused_why(spec, &g2, "shape", __LINE__);
}

/* ------------------------------------------------------------ inputs */

/*
 * A policy reading staged inputs: two finite tokens pass; then a sync whose
 * token 1 (position 3) carries `bad` at index 1 of input `which` (0 x, 1 q,
 * 2 lse) is refused with KVT_EINVAL and a reason containing needle, before
 * decide() ran (the layer state is untouched); the same sync with the
 * input fixed then passes.  The second sync is a decode sync for a policy
 * that decides only there (snapkv: policy_decides; at a sync where it
 * decides nothing it reads, and so checks, nothing).
 */
static void bad_input_(const char *spec, uint32_t H, uint32_t nkv, int which,
                       float bad, const char *needle, int line)
{
	const enum kvt_phase ph = strncmp(spec, "snapkv", 6)
	                          ? KVT_PHASE_PREFILL : KVT_PHASE_DECODE;
	struct fx f;
	fx_init(&f, spec, H, nkv);
	float x[2][FX_D], q[2][FX_H], lse[2][FX_H];
	for (uint32_t k = 0; k < 2; k++) {
		for (uint32_t d = 0; d < FX_D; d++)
			x[k][d] = 0.5f;
		for (uint32_t j = 0; j < FX_H; j++) {
			q[k][j] = 1.0f;
			lse[k][j] = 0.0f;
		}
	}
	const float a[2][FX_KV] = {{.5f, .5f}, {.5f, .5f}};
	T_OK(fx_sync(&f, 2, KVT_PHASE_PREFILL, a, x, q, lse));
	uint32_t n_seen = f.n_seen, len[FX_KV];
	memcpy(len, f.len, sizeof(len));
	static uint8_t state[sizeof(f.state)];
	memcpy(state, f.state, sizeof(state));
	float *slot = which == 0 ? &x[1][1] : which == 1 ? &q[1][1] : &lse[1][1];
	float good = *slot;
	*slot = bad;
	int rc = fx_sync(&f, 2, ph, a, x, q, lse);
	if (rc != KVT_EINVAL || !strstr(f.p->why, needle))
		th_fail(__FILE__, line, "%s: gave %s (%s), expected EINVAL "
		        "with '%s'", spec, kvt_errname(rc), f.p->why, needle);
	if (memcmp(state, f.state, sizeof(state)))
		th_fail(__FILE__, line, "%s: layer state changed", spec);
	/* The fixture appended before deciding; a tenant commits nothing
	 * of a refused sync, so rewind it the same way. */
	f.n_seen = n_seen;
	memcpy(f.len, len, sizeof(len));
	*slot = good;
	rc = fx_sync(&f, 2, ph, a, x, q, lse);
	if (rc || f.p->why[0])
		th_fail(__FILE__, line, "%s: fixed sync gave %s (%s)", spec,
		        kvt_errname(rc), f.p->why);
	policy_free(f.p);
}
#define bad_input(spec, H, nkv, which, bad, needle)                           \
	bad_input_(spec, H, nkv, which, bad, needle, __LINE__)

TEST(policy, inputs_refused)
{
	const char *wz = tmp_path("kvzap.safetensors");
	const char *wf = tmp_path("fkv.safetensors");
	const char *wp = tmp_path("kvpop.safetensors");
	kvzap_linear(wz, 0, 0, 0);
	fkv_weights(wf, 0, 1.0f);
	kvpop_weights(wp, 1.0f, 0.0f, 0);
	char kvzap[600], fkv[600], kvpop[600];
	snprintf(kvzap, sizeof(kvzap), "kvzap:model=%s,window=1", wz);
	snprintf(fkv, sizeof(fkv), "fastkvzip:model=%s", wf);
	snprintf(kvpop, sizeof(kvpop), "kvpop:model=%s,tokens=3,delay=2", wp);
	const float nan = NAN, inf = INFINITY, un = policy_unstaged();
	/* every policy that reads an input, for each input it reads
	 * (head_dim 1: a q element is named by its head alone) */
	const struct {
		const char *spec;
		uint32_t H, nkv;
		unsigned inputs; /* bit 0 x, 1 q, 2 lse */
	} pol[] = {
		{"h2o:tokens=8", 2, 1, 6},  {"snapkv:window=1", 2, 1, 6},
		{"tova:tokens=8", 2, 1, 6}, {kvzap, 2, 2, 1},
		{fkv, 2, 2, 1},             {kvpop, 2, 1, 7},
	};
	static const char *const what[3][3] = {
		{"layer 0, position 3: staged x[1] is NaN",
		 "layer 0, position 3: staged x[1] is +Inf",
		 "layer 0, position 3: x was never staged (kvt_stage_x)"},
		{"layer 0, position 3: staged q of query head 1 is NaN",
		 "layer 0, position 3: staged q of query head 1 is -Inf",
		 "layer 0, position 3: q of query head 1 was never staged "
		 "(kvt_stage_q)"},
		{"layer 0, position 3: staged lse of query head 1 is NaN",
		 "layer 0, position 3: staged lse of query head 1 is +Inf",
		 "layer 0, position 3: lse of query head 1 was never staged "
		 "(kvt_stage_lse)"},
	};
	for (size_t i = 0; i < sizeof(pol) / sizeof(pol[0]); i++)
		for (int in = 0; in < 3; in++) {
			if (!(pol[i].inputs & (1u << in)))
				continue;
			bad_input(pol[i].spec, pol[i].H, pol[i].nkv, in, nan,
			          what[in][0]);
			bad_input(pol[i].spec, pol[i].H, pol[i].nkv, in,
			          in == 1 ? -inf : inf, what[in][1]);
			bad_input(pol[i].spec, pol[i].H, pol[i].nkv, in, un,
			          what[in][2]);
		}
	/* x's marker sits in x[0] (what the tenant writes) */
	struct fx f;
	fx_init(&f, kvzap, 2, 2);
	T_ERR(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL,
	              (const float[1][FX_D]){{un, 1, 1, 1}}, NULL, NULL),
	      KVT_EINVAL);
	T_EQ_STR(f.p->why, "layer 0, position 0: x was never staged "
	                   "(kvt_stage_x)");
	policy_free(f.p);
	/* inputs a policy does not read are not checked */
	fx_init(&f, "h2o:tokens=8", 2, 1);
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL,
	             (const float[1][FX_D]){{nan, un, inf, 0}}, NULL, NULL));
	policy_free(f.p);
	/* the full policy reads nothing */
	fx_init(&f, "full", 2, 1);
	T_OK(fx_sync(&f, 1, KVT_PHASE_DECODE, NULL, NULL,
	             (const float[1][FX_H]){{nan, un}}, NULL));
	policy_free(f.p);
}

TEST(policy, snapkv_rechecks_its_window)
{
	/* snapkv reads the window rows from the ring at the first decode
	 * sync; one rewritten with a NaN since its own sync is refused */
	struct fx f;
	fx_init(&f, "snapkv:window=2,kernel=1,tokens=2", 2, 1);
	const float a[6][FX_KV] = {{.5f}, {.5f}, {.5f}, {.5f}, {.5f}, {.5f}};
	T_OK(fx_sync(&f, 6, KVT_PHASE_PREFILL, a, NULL, NULL, NULL));
	f.stage[4][f.lo + 1] = NAN; /* lse of query head 1, position 4 */
	T_ERR(fx_sync(&f, 1, KVT_PHASE_DECODE, a, NULL, NULL, NULL),
	      KVT_EINVAL);
	T_EQ_STR(f.p->why, "layer 0, position 4: staged lse of query head 1 "
	                   "is NaN");
	policy_free(f.p);
}

/*
 * kvzap's device plan (policy_ops.device, drop_bound) against its host
 * rule over ragged syncs: a job per list at a sync with new entries, its
 * n_drop the entries that leave the window then at or above the sinks
 * (counted here from the positions the host holds), at least what
 * decide() dropped, and exactly that when every score is below tau; the
 * jobs read the scores at c->pre and their offsets follow each other.
 */
TEST(policy, kvzap_device_plan_bounds_the_drops)
{
	const char *w = tmp_path("kvzap-plan.safetensors");
	kvzap_linear(w, 0, 0, 0);
	const char *opts[] = {"window=3,threshold=0.5",
	                      "window=0,sinks=2,threshold=0.5",
	                      "window=5,sinks=1,threshold=0.25"};
	static const float pre_dev[4]; /* stands in for device scores */
	for (size_t o = 0; o < 2 * sizeof(opts) / sizeof(opts[0]); o++) {
		char spec[600];
		snprintf(spec, sizeof(spec), "kvzap:model=%s,%s", w, opts[o / 2]);
		const int all_below = o % 2; /* every score below tau */
		struct fx f;
		fx_init(&f, spec, 2, 2);
		const struct policy_device_rule *dr = f.p->ops->device;
		T_ASSERT(dr && dr->takes_pre && dr->drop_bound);
		T_EQ_STR(dr->name, "kvzap");
		uint32_t seed = 11 + (uint32_t)o, word = 0, drops = 0;
		for (uint32_t k = 0; f.n_seen + 4 < FX_MAX - 1; k++) {
			const uint32_t n = k == 0 ? 9 : fx_next(&seed) % 5;
			const uint32_t nkv = f.ge.n_kv_heads, prev = f.n_seen,
			               seen = prev + n;
			uint32_t before[FX_KV], bound[FX_KV];
			const uint32_t *pos[FX_KV];
			const uint8_t cur[FX_KV] = {1, 0};
			for (uint32_t h = 0; h < nkv; h++) {
				before[h] = f.len[h];
				pos[h] = f.pos[h];
				/* the entries leaving now, from the positions */
				bound[h] = 0;
				for (uint32_t i = 0; i < f.len[h] + n; i++) {
					const uint32_t p = i < f.len[h]
					                   ? f.pos[h][i]
					                   : prev + (i - f.len[h]);
					const uint64_t pw = (uint64_t)p + f.p->args.window;
					bound[h] += pw >= prev && pw < seen &&
					            p >= f.p->args.sinks;
				}
			}
			const struct policy_dev_layer c = {
				.len = before, .pos = pos, .state_rec = 4,
				.cur = cur, .word = &word, .drop_off = 3,
				.pre = pre_dev,
			};
			const struct policy_layer l = {
				.layer = 1, .n_new = n, .n_seen = seen,
				.phase = prev ? KVT_PHASE_DECODE
				              : KVT_PHASE_PREFILL,
			};
			struct kvzap_rule_job bj[FX_KV];
			struct policy_dev_job hj[FX_KV];
			uint32_t nj = 99;
			char err[128];
			T_OK(dr->plan(f.p, &l, &c, bj, hj, &nj, err, sizeof(err)));
			T_EQ(nj, n ? nkv : 0);
			float x[FX_MAX][FX_D] = {{0}};
			for (uint32_t t = 0; t < n; t++)
				for (uint32_t d = 0; d < 2; d++)
					x[t][d] = all_below ? -1.0f
					          : (float)(fx_next(&seed) % 9) / 8.0f;
			T_OK(fx_sync(&f, n, l.phase, NULL,
			             (const float(*)[FX_D])x, NULL, NULL));
			uint32_t off = c.drop_off;
			for (uint32_t j = 0; j < nj; j++) {
				const uint32_t h = hj[j].g;
				const uint32_t dropped = before[h] + n - f.len[h];
				T_EQ(h, j);
				T_EQ(hj[j].rec, c.state_rec + h);
				T_EQ(hj[j].L, before[h] + n);
				T_EQ(hj[j].drop_off, off);
				T_EQ(hj[j].n_drop, bound[h]);
				T_ASSERT(dropped <= hj[j].n_drop);
				if (all_below)
					T_EQ(dropped, hj[j].n_drop);
				drops += dropped;
				T_ASSERT(bj[j].pre == pre_dev);
				T_EQ(bj[j].record, hj[j].rec);
				T_EQ(bj[j].g, h);
				T_EQ(bj[j].cur, cur[h]);
				T_EQ(bj[j].len, before[h]);
				T_EQ(bj[j].n_new, n);
				T_EQ(bj[j].n_seen, seen);
				T_EQ(bj[j].n_drop, hj[j].n_drop);
				T_EQ(bj[j].due, hj[j].n_drop != 0);
				T_EQ(bj[j].drop_off, off);
				off += hj[j].n_drop;
			}
			for (uint32_t h = 0; !nj && h < nkv; h++)
				T_EQ(f.len[h], before[h]); /* nothing new: no drop */
		}
		T_ASSERT(drops > 0);
		policy_free(f.p);
	}
}

/* One sync of n tokens of layer 0 (a prefill first, then decode steps)
 * on fixture f, x's first 3 floats +-1 from seed: the device plan's jobs
 * (bj, hj, *nj: one when n > 0, else none) taken against c before
 * fx_sync lets decide() run; *L the layer's entries with the new ones,
 * *dropped what decide() dropped.  Returns whether fkv_decide selects at
 * it. */
static int fkv_plan_sync(struct fx *f, const struct policy_dev_layer *c,
                         uint32_t n, uint32_t *seed,
                         struct fastkvzip_rule_job *bj,
                         struct policy_dev_job *hj, uint32_t *nj,
                         uint32_t *L, uint32_t *dropped)
{
	const uint32_t prev = f->n_seen;
	const struct policy_layer l = {
		.layer = 0, .n_new = n, .n_seen = prev + n,
		.phase = prev ? KVT_PHASE_DECODE : KVT_PHASE_PREFILL,
	};
	const int sel = !prev || policy_due(f->p, &l);
	char err[128];
	*nj = 99;
	T_OK(f->p->ops->device->plan(f->p, &l, c, bj, hj, nj, err,
	                             sizeof(err)));
	float x[FX_MAX][FX_D] = {{0}};
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t d = 0; d < 3; d++)
			x[t][d] = fx_next(seed) % 2 ? 1.0f : -1.0f;
	T_OK(fx_sync(f, n, l.phase, NULL, (const float(*)[FX_D])x, NULL,
	             NULL));
	T_EQ(*nj, n ? 1 : 0);
	*L = *dropped = 0;
	for (uint32_t h = 0; h < f->ge.n_kv_heads; h++) {
		*L += c->len[h] + n;
		*dropped += c->len[h] + n - f->len[h];
	}
	return sel;
}

/*
 * fastkvzip's device plan (a layer-wide top-k, POLICY_DEV_LAYER,
 * drop_bound) against its host rule over ragged syncs: one job per
 * (sequence, layer) at a sync with new entries, its L the lists' entries
 * end to end, its n_drop entries - budget x KV heads when fkv_decide
 * selects (a prefill, or a due decode sync), else 0: at least what
 * decide() dropped from the layer, exactly that while the budget covers
 * the protected; the device job mirrors it with each list's length.
 */
TEST(policy, fastkvzip_device_plan_bounds_the_drops)
{
	const char *w = tmp_path("fkv-plan.safetensors");
	fkv_weights(w, 0, 1.0f);
	const char *opts[] = {"sinks=1,window=2,every=3,tokens=5",
	                      "sinks=0,window=0,every=1,ratio=0.5",
	                      "sinks=2,window=3,every=4,tokens=2"};
	static const float pre_dev[4];
	for (size_t o = 0; o < sizeof(opts) / sizeof(opts[0]); o++) {
		char spec[600];
		snprintf(spec, sizeof(spec), "fastkvzip:model=%s,%s", w, opts[o]);
		struct fx f;
		fx_init(&f, spec, 2, 2);
		const struct policy_device_rule *dr = f.p->ops->device;
		T_ASSERT(dr && dr->takes_pre && dr->drop_bound);
		T_ASSERT(dr->supports(f.p));
		T_EQ_STR(dr->name, "fastkvzip");
		uint32_t seed = 5 + (uint32_t)o, word = 0, drops = 0, exact = 0;
		for (uint32_t k = 0; f.n_seen + 4 < FX_MAX / 2; k++) {
			const uint32_t n = k == 0 ? 9 : fx_next(&seed) % 4;
			const uint32_t nkv = f.ge.n_kv_heads, prev = f.n_seen,
			               seen = prev + n;
			uint32_t before[FX_KV], np = 0;
			const uint32_t *pos[FX_KV];
			const uint8_t cur[1] = {1};
			for (uint32_t h = 0; h < nkv; h++) {
				before[h] = f.len[h];
				pos[h] = f.pos[h];
				for (uint32_t i = 0; i < f.len[h] + n; i++) {
					const uint32_t p = i < f.len[h]
					                   ? f.pos[h][i]
					                   : prev + (i - f.len[h]);
					np += policy_protected(&f.p->args, p, seen);
				}
			}
			const struct policy_dev_layer c = {
				.len = before, .pos = pos, .state_rec = 2,
				.cur = cur, .word = &word, .drop_off = 3,
				.pre = pre_dev,
			};
			const uint32_t b = policy_budget(f.p, seen) * nkv;
			struct fastkvzip_rule_job bj[FX_KV];
			struct policy_dev_job hj[FX_KV];
			uint32_t nj;
			uint32_t L, dropped;
			const int sel = fkv_plan_sync(&f, &c, n, &seed, bj, hj, &nj,
			                              &L, &dropped);
			if (!nj)
				continue;
			for (uint32_t h = 0; h < nkv; h++)
				T_EQ(bj[0].lens[h], before[h]);
			const uint32_t bound = sel && L > b ? L - b : 0;
			T_EQ(hj[0].g, POLICY_DEV_LAYER);
			T_EQ(hj[0].rec, c.state_rec);
			T_EQ(hj[0].L, L);
			T_EQ(hj[0].drop_off, c.drop_off);
			T_EQ(hj[0].n_drop, bound);
			T_ASSERT(dropped <= bound);
			if (np <= b) {
				T_EQ(dropped, bound);
				exact += bound != 0;
			}
			drops += dropped;
			T_ASSERT(bj[0].pre == pre_dev);
			T_EQ(bj[0].record, c.state_rec);
			T_EQ(bj[0].cur, 1);
			T_EQ(bj[0].len, L);
			T_EQ(bj[0].n_new, 0);
			T_EQ(bj[0].nn, n);
			T_EQ(bj[0].n_seen, seen);
			T_EQ(bj[0].budget, b);
			T_EQ(bj[0].n_drop, bound);
			T_EQ(bj[0].due, bound != 0);
			T_EQ(bj[0].drop_off, c.drop_off);
		}
		/* the last: the protected exceed the budget, a loose bound */
		if (drops == 0 || (exact == 0) != (o == 2))
			th_fail(__FILE__, __LINE__, "%s: %u drops, %u exact",
			        spec, drops, exact);
		policy_free(f.p);
	}
}

/*
 * The same plan with a threshold: n_drop, a bound on what fkv_decide
 * drops (each list's unprotected entries below tau, when it selects), is
 * the entries that no earlier selection judged under the same threshold
 * (fkv_thr_bound); at least what decide() dropped over ragged syncs, and
 * well below the entries while the pressure is 0; pressure (a higher
 * threshold) midway re-judges the kept ones, which the bound covers.
 */
TEST(policy, fastkvzip_device_plan_bounds_threshold_drops)
{
	const char *w = tmp_path("fkv-thr-plan.safetensors");
	fkv_weights(w, 0, 1.0f);
	/* the gate scores sigmoid(+-1), 0.27 or 0.73; the last, under
	 * pressure 0.8, has tau 0.6 + 0.4 x 0.4 = 0.76: every score below */
	const char *opts[] = {"sinks=1,window=2,every=3,threshold=0.5",
	                      "sinks=0,window=0,every=1,threshold=0.5",
	                      "sinks=2,window=3,every=2,threshold=0.5",
	                      "sinks=1,window=4,every=5,threshold=0.6"};
	static const float pre_dev[4];
	for (size_t o = 0; o < sizeof(opts) / sizeof(opts[0]); o++) {
		const int press = o == 3; /* pressure from the middle on */
		char spec[600];
		snprintf(spec, sizeof(spec), "fastkvzip:model=%s,%s", w,
		         opts[o]);
		struct fx f;
		fx_init(&f, spec, 2, 2);
		const struct policy_device_rule *dr = f.p->ops->device;
		T_ASSERT(dr->supports(f.p));
		uint32_t seed = 11 + (uint32_t)o, word = 0, drops = 0;
		uint64_t sum_bound = 0, sum_L = 0;
		for (uint32_t k = 0; f.n_seen + 4 < FX_MAX / 2; k++) {
			if (press && f.n_seen > FX_MAX / 4)
				f.p->pressure = 0.8f;
			const uint32_t n = k == 0 ? 9 : fx_next(&seed) % 4;
			const uint32_t nkv = f.ge.n_kv_heads;
			uint32_t before[FX_KV];
			const uint32_t *pos[FX_KV];
			const uint8_t cur[1] = {0};
			for (uint32_t h = 0; h < nkv; h++) {
				before[h] = f.len[h];
				pos[h] = f.pos[h];
			}
			const struct policy_dev_layer c = {
				.len = before, .pos = pos, .state_rec = 0,
				.cur = cur, .word = &word, .drop_off = 0,
				.pre = pre_dev,
			};
			struct fastkvzip_rule_job bj[FX_KV];
			struct policy_dev_job hj[FX_KV];
			uint32_t nj;
			uint32_t L, dropped;
			fkv_plan_sync(&f, &c, n, &seed, bj, hj, &nj, &L, &dropped);
			if (!nj)
				continue;
			if (dropped > hj[0].n_drop)
				th_fail(__FILE__, __LINE__, "%s: sync %u dropped "
				        "%u, the bound %u", spec, k, dropped,
				        hj[0].n_drop);
			T_EQ(bj[0].n_drop, hj[0].n_drop);
			T_EQ(bj[0].due, hj[0].n_drop != 0);
			T_EQ(bj[0].len, L);
			drops += dropped;
			if (!f.p->pressure) {
				sum_bound += hj[0].n_drop;
				sum_L += L;
			}
		}
		/* some dropped, some unprotected kept (before the pressure):
		 * the bound is tested */
		uint32_t kept = press;
		for (uint32_t h = 0; h < f.ge.n_kv_heads; h++)
			for (uint32_t i = 0; i < f.len[h]; i++)
				kept += !policy_protected(&f.p->args, f.pos[h][i],
				                          f.n_seen);
		if (!drops || !kept || 2 * sum_bound > sum_L)
			th_fail(__FILE__, __LINE__, "%s: %u drops, %u unprotected "
			        "kept, bounds %llu of %llu entries", spec, drops,
			        kept, (unsigned long long)sum_bound,
			        (unsigned long long)sum_L);
		policy_free(f.p);
	}
}
