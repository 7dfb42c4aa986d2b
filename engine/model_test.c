/*
 * model_test.c — the reference engine's model code without a daemon:
 * loader (every format, and its refusals on files written here), RMSNorm
 * and RoPE on hand-computed cases, the batched forward against a naive
 * token-by-token double-precision forward written here, and the oracles
 * (KVzip, KVzip+, future attention) against the same naive computation,
 * on a tiny random model built in memory; and llama GGUF files
 * (engine/model_gguf.c) written by tests/harness/gb.c: the same weights
 * load to the same model as through a llama2.c checkpoint, the
 * hyperparameters come from the metadata, bad files are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gb.h"
#include "gguf.h"
#include "model.h"
#include "oracle.h"
#include "test.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state;

static float frand(float a) /* uniform in [-a, a) */
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return a * (2.0f * (float)((rng_state >> 40) / 16777216.0) - 1.0f);
}

static const struct model_config tiny_cfg = {
	.dim = 16, .hidden_dim = 40, .n_layers = 2, .n_heads = 4,
	.n_kv_heads = 2, .vocab_size = 32, .seq_len = 64,
	.shared_classifier = 1,
};

static void fill(float *p, size_t n, float a, float base)
{
	for (size_t i = 0; i < n; i++)
		p[i] = base + frand(a);
}

/* A random model whose attention is far from uniform. */
static void tiny_model(struct model *m, int shared, uint64_t seed)
{
	char err[256];
	struct model_config c = tiny_cfg;
	c.shared_classifier = (uint32_t)shared;
	T_OK(model_alloc(m, &c, err, sizeof(err)));
	rng_state = seed;
	uint32_t L = c.n_layers, d = c.dim, kv = m->cfg.kv_dim,
	         hid = c.hidden_dim, V = c.vocab_size;
	fill(m->tok_emb, (size_t)V * d, 1.0f, 0);
	fill(m->rms_att, (size_t)L * d, 0.2f, 1.0f);
	fill(m->wq, (size_t)L * d * d, 0.6f, 0);
	fill(m->wk, (size_t)L * kv * d, 0.6f, 0);
	fill(m->wv, (size_t)L * kv * d, 0.5f, 0);
	fill(m->wo, (size_t)L * d * d, 0.3f, 0);
	fill(m->rms_ffn, (size_t)L * d, 0.2f, 1.0f);
	fill(m->w1, (size_t)L * hid * d, 0.4f, 0);
	fill(m->w2, (size_t)L * d * hid, 0.3f, 0);
	fill(m->w3, (size_t)L * hid * d, 0.4f, 0);
	fill(m->rms_final, d, 0.2f, 1.0f);
	if (!shared)
		fill(m->wcls, (size_t)V * d, 1.0f, 0);
}

static void put_i32(FILE *f, int32_t v)
{
	T_ASSERT(fwrite(&v, 4, 1, f) == 1);
}

static void put_f32(FILE *f, const float *p, size_t n)
{
	T_ASSERT(fwrite(p, 4, n, f) == n);
}

static void put_params(FILE *f, const struct model_config *c, int32_t vocab)
{
	put_i32(f, (int32_t)c->dim);
	put_i32(f, (int32_t)c->hidden_dim);
	put_i32(f, (int32_t)c->n_layers);
	put_i32(f, (int32_t)c->n_heads);
	put_i32(f, (int32_t)c->n_kv_heads);
	put_i32(f, vocab);
	put_i32(f, (int32_t)c->seq_len);
}

struct tsz {
	size_t emb, rms, wq, wk, wo, w1;
};

static struct tsz tsz_of(const struct model *m)
{
	const struct model_config *c = &m->cfg;
	struct tsz s = {
		(size_t)c->vocab_size * c->dim, (size_t)c->n_layers * c->dim,
		(size_t)c->n_layers * c->dim * c->dim,
		(size_t)c->n_layers * c->kv_dim * c->dim,
		(size_t)c->n_layers * c->dim * c->dim,
		(size_t)c->n_layers * c->hidden_dim * c->dim,
	};
	return s;
}

/* Legacy v0 file, as llama2.c export.py legacy_export writes it. */
static void write_v0(const char *path, const struct model *m)
{
	const struct model_config *c = &m->cfg;
	struct tsz s = tsz_of(m);
	FILE *f = fopen(path, "wb");
	T_ASSERT(f);
	put_params(f, c, c->shared_classifier ? (int32_t)c->vocab_size
	                                      : -(int32_t)c->vocab_size);
	put_f32(f, m->tok_emb, s.emb);
	put_f32(f, m->rms_att, s.rms);
	put_f32(f, m->wq, s.wq);
	put_f32(f, m->wk, s.wk);
	put_f32(f, m->wv, s.wk);
	put_f32(f, m->wo, s.wo);
	put_f32(f, m->rms_ffn, s.rms);
	put_f32(f, m->w1, s.w1);
	put_f32(f, m->w2, s.w1);
	put_f32(f, m->w3, s.w1);
	put_f32(f, m->rms_final, c->dim);
	size_t nf = (size_t)c->seq_len * c->head_dim; /* cos + sin tables */
	float *z = calloc(nf, sizeof(float));
	put_f32(f, z, nf);
	free(z);
	if (!c->shared_classifier)
		put_f32(f, m->wcls, s.emb);
	T_EQ(fclose(f), 0);
}

static void put_header_vn(FILE *f, const struct model_config *c, int version,
                          int32_t gs)
{
	uint32_t magic = 0x616b3432u;
	T_ASSERT(fwrite(&magic, 4, 1, f) == 1);
	put_i32(f, version);
	put_params(f, c, (int32_t)c->vocab_size);
	unsigned char shared = (unsigned char)c->shared_classifier;
	T_ASSERT(fwrite(&shared, 1, 1, f) == 1);
	long at = 37;
	if (version == 2) {
		put_i32(f, gs);
		at += 4;
	}
	char pad[256] = {0};
	T_ASSERT(fwrite(pad, 1, (size_t)(256 - at), f) == (size_t)(256 - at));
}

static void write_v1(const char *path, const struct model *m)
{
	const struct model_config *c = &m->cfg;
	struct tsz s = tsz_of(m);
	FILE *f = fopen(path, "wb");
	T_ASSERT(f);
	put_header_vn(f, c, 1, 0);
	put_f32(f, m->rms_att, s.rms);
	put_f32(f, m->rms_ffn, s.rms);
	put_f32(f, m->rms_final, c->dim);
	put_f32(f, m->tok_emb, s.emb);
	put_f32(f, m->wq, s.wq);
	put_f32(f, m->wk, s.wk);
	put_f32(f, m->wv, s.wk);
	put_f32(f, m->wo, s.wo);
	put_f32(f, m->w1, s.w1);
	put_f32(f, m->w2, s.w1);
	put_f32(f, m->w3, s.w1);
	if (!c->shared_classifier)
		put_f32(f, m->wcls, s.emb);
	T_EQ(fclose(f), 0);
}

/* Q8_0 as export.py quantize_q80; the expected dequantized values replace
 * w in place so the loaded model can be compared exactly. */
static void put_q80(FILE *f, float *w, size_t n, uint32_t gs)
{
	signed char *q = malloc(n);
	float *sc = malloc(sizeof(float) * (n / gs));
	for (size_t g = 0; g < n / gs; g++) {
		float mx = 0;
		for (uint32_t j = 0; j < gs; j++)
			mx = fabsf(w[g * gs + j]) > mx ? fabsf(w[g * gs + j]) : mx;
		sc[g] = mx / 127.0f;
		for (uint32_t j = 0; j < gs; j++) {
			q[g * gs + j] = (signed char)lrintf(w[g * gs + j] / sc[g]);
			w[g * gs + j] = (float)q[g * gs + j] * sc[g];
		}
	}
	T_ASSERT(fwrite(q, 1, n, f) == n);
	put_f32(f, sc, n / gs);
	free(q);
	free(sc);
}

static void write_v2(const char *path, struct model *m, uint32_t gs)
{
	const struct model_config *c = &m->cfg;
	struct tsz s = tsz_of(m);
	uint32_t L = c->n_layers;
	FILE *f = fopen(path, "wb");
	T_ASSERT(f);
	put_header_vn(f, c, 2, (int32_t)gs);
	put_f32(f, m->rms_att, s.rms);
	put_f32(f, m->rms_ffn, s.rms);
	put_f32(f, m->rms_final, c->dim);
	put_q80(f, m->tok_emb, s.emb, gs);
	float *t[] = {m->wq, m->wk, m->wv, m->wo, m->w1, m->w2, m->w3};
	size_t n[] = {s.wq, s.wk, s.wk, s.wo, s.w1, s.w1, s.w1};
	for (int i = 0; i < 7; i++)
		for (uint32_t l = 0; l < L; l++)
			put_q80(f, t[i] + l * (n[i] / L), n[i] / L, gs);
	if (!c->shared_classifier)
		put_q80(f, m->wcls, s.emb, gs);
	T_EQ(fclose(f), 0);
}

static void same_model(const struct model *a, const struct model *b)
{
	T_EQ(a->cfg.dim, b->cfg.dim);
	T_EQ(a->cfg.n_kv_heads, b->cfg.n_kv_heads);
	T_EQ(a->cfg.vocab_size, b->cfg.vocab_size);
	T_EQ(a->cfg.shared_classifier, b->cfg.shared_classifier);
	struct tsz s = tsz_of(a);
	T_ASSERT(!memcmp(a->tok_emb, b->tok_emb, s.emb * 4));
	T_ASSERT(!memcmp(a->wq, b->wq, s.wq * 4));
	T_ASSERT(!memcmp(a->wk, b->wk, s.wk * 4));
	T_ASSERT(!memcmp(a->wv, b->wv, s.wk * 4));
	T_ASSERT(!memcmp(a->wo, b->wo, s.wo * 4));
	T_ASSERT(!memcmp(a->w1, b->w1, s.w1 * 4));
	T_ASSERT(!memcmp(a->w2, b->w2, s.w1 * 4));
	T_ASSERT(!memcmp(a->w3, b->w3, s.w1 * 4));
	T_ASSERT(!memcmp(a->rms_att, b->rms_att, s.rms * 4));
	T_ASSERT(!memcmp(a->rms_ffn, b->rms_ffn, s.rms * 4));
	T_ASSERT(!memcmp(a->rms_final, b->rms_final, a->cfg.dim * 4));
	T_ASSERT(!memcmp(a->wcls, b->wcls, s.emb * 4));
	T_EQ(a->cfg.shared_classifier, a->wcls == a->tok_emb);
	T_EQ(b->cfg.shared_classifier, b->wcls == b->tok_emb);
}

static const char *tmp_path(const char *name)
{
	static char buf[4][512];
	static int k;
	k = (k + 1) % 4;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", th_tmpdir(), name);
	return buf[k];
}

static void truncate_copy(const char *src, const char *dst, long drop,
                          long add)
{
	FILE *f = fopen(src, "rb");
	T_ASSERT(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = calloc(1, (size_t)(n + add));
	T_ASSERT(fread(b, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	f = fopen(dst, "wb");
	T_ASSERT(fwrite(b, 1, (size_t)(n - drop + add), f) ==
	         (size_t)(n - drop + add));
	fclose(f);
	free(b);
}

/* ---------------------------------------------------------------- loader */

TEST(model, loads_every_format)
{
	char err[512];
	struct model m, l;
	for (int shared = 0; shared <= 1; shared++) {
		tiny_model(&m, shared, 7 + (uint64_t)shared);
		write_v0(tmp_path("v0.bin"), &m);
		T_OK(model_load(tmp_path("v0.bin"), &l, err, sizeof(err)));
		T_EQ(l.version, 0);
		same_model(&m, &l);
		model_free(&l);
		write_v1(tmp_path("v1.bin"), &m);
		T_OK(model_load(tmp_path("v1.bin"), &l, err, sizeof(err)));
		T_EQ(l.version, 1);
		same_model(&m, &l);
		model_free(&l);
		write_v2(tmp_path("v2.bin"), &m, 8); /* m now dequantized */
		T_OK(model_load(tmp_path("v2.bin"), &l, err, sizeof(err)));
		T_EQ(l.version, 2);
		same_model(&m, &l);
		model_free(&l);
		model_free(&m);
	}
}

TEST(model, loader_refuses_truncated_oversized_and_bad_headers)
{
	char err[512];
	struct model m, l;
	tiny_model(&m, 1, 3);
	write_v0(tmp_path("ok0.bin"), &m);
	write_v1(tmp_path("ok1.bin"), &m);
	write_v2(tmp_path("ok2.bin"), &m, 8);
	model_free(&m);

	const char *ok[] = {"ok0.bin", "ok1.bin", "ok2.bin"};
	for (int i = 0; i < 3; i++) {
		truncate_copy(tmp_path(ok[i]), tmp_path("t.bin"), 4, 0);
		T_ERR(model_load(tmp_path("t.bin"), &l, err, sizeof(err)),
		      KVT_EINVAL);
		T_ASSERT(strstr(err, "truncated"));
		T_ASSERT(l.data == NULL);
		truncate_copy(tmp_path(ok[i]), tmp_path("t.bin"), 0, 4);
		T_ERR(model_load(tmp_path("t.bin"), &l, err, sizeof(err)),
		      KVT_EINVAL);
		T_ASSERT(strstr(err, "trailing"));
	}
	/* a header alone, and less than a header */
	truncate_copy(tmp_path("ok0.bin"), tmp_path("t.bin"), 0, 0);
	FILE *f = fopen(tmp_path("short.bin"), "wb");
	put_i32(f, 16);
	put_i32(f, 40);
	fclose(f);
	T_ERR(model_load(tmp_path("short.bin"), &l, err, sizeof(err)),
	      KVT_EINVAL);
	T_ASSERT(strstr(err, "too short"));

	/* bad v0 headers: zero dim, negative layers, heads not dividing dim,
	 * kv heads not dividing heads, odd head_dim */
	struct model_config bad[5];
	for (int i = 0; i < 5; i++)
		bad[i] = tiny_cfg;
	bad[0].dim = 0;
	bad[1].n_layers = (uint32_t)-2;
	bad[2].n_heads = 3;
	bad[3].n_kv_heads = 3;
	bad[4].n_heads = 8; /* head_dim 2 is fine ... */
	bad[4].dim = 24;    /* ... head_dim 3 is not */
	for (int i = 0; i < 5; i++) {
		f = fopen(tmp_path("bad.bin"), "wb");
		put_params(f, &bad[i], (int32_t)bad[i].vocab_size);
		char zeros[4096] = {0};
		fwrite(zeros, 1, sizeof(zeros), f);
		fclose(f);
		T_ERR(model_load(tmp_path("bad.bin"), &l, err, sizeof(err)),
		      KVT_EINVAL);
		T_ASSERT(strstr(err, "bad header"));
	}
	/* ak42 with an unknown version, and a bad Q8_0 group size */
	f = fopen(tmp_path("v9.bin"), "wb");
	put_header_vn(f, &tiny_cfg, 9, 0);
	fclose(f);
	T_ERR(model_load(tmp_path("v9.bin"), &l, err, sizeof(err)),
	      KVT_EINVAL);
	T_ASSERT(strstr(err, "version 9"));
	f = fopen(tmp_path("g.bin"), "wb");
	put_header_vn(f, &tiny_cfg, 2, 7);
	fclose(f);
	T_ERR(model_load(tmp_path("g.bin"), &l, err, sizeof(err)),
	      KVT_EINVAL);
	T_ASSERT(strstr(err, "group size"));
	T_ERR(model_load(tmp_path("absent.bin"), &l, err, sizeof(err)),
	      KVT_ESYS);
}

/* ---------------------------------------------------------------- GGUF */

/* dim 32 so that Q8_0 rows are whole blocks. */
static const struct model_config gguf_cfg = {
	.dim = 32, .hidden_dim = 64, .n_layers = 2, .n_heads = 4,
	.n_kv_heads = 2, .vocab_size = 40, .seq_len = 96,
};

static void gguf_file(const char *path, const struct model *m,
                      const struct gb_llama_opts *o)
{
	struct gb b = {0};
	gb_llama(&b, m, o);
	gb_write(&b, path);
	gb_free(&b);
}

static void logits_of(const struct model *m, float *out, uint32_t T)
{
	int32_t t[24];
	T_ASSERT(T <= 24);
	for (uint32_t i = 0; i < T; i++)
		t[i] = (int32_t)((i * 7 + 3) % m->cfg.vocab_size);
	T_OK(model_dense_forward(m, t, T, out));
}

/*
 * The same weights written as a llama2.c checkpoint and as GGUF files in
 * F32, F16 and Q8_0 (values exact in each: multiples of 2^-9) load to the
 * same model and give the same logits; what the test expects is the
 * weights it wrote, not what a loader computed.
 */
TEST(model, gguf_loads_the_same_model_as_llama2c)
{
	char err[512];
	const uint32_t types[] = {GGUF_GGML_F32, GGUF_GGML_F16, GGUF_GGML_Q8_0};
	const size_t V = gguf_cfg.vocab_size, T = 20;
	float *la = malloc(sizeof(float) * V * T);
	float *lg = malloc(sizeof(float) * V * T);
	T_ASSERT(la && lg);
	for (int shared = 0; shared <= 1; shared++) {
		struct model src, a, g;
		struct model_config c = gguf_cfg;
		c.shared_classifier = (uint32_t)shared;
		T_OK(model_alloc(&src, &c, err, sizeof(err)));
		gb_llama_fill(&src, 11 + (uint64_t)shared);
		write_v0(tmp_path("m.bin"), &src);
		T_OK(model_load(tmp_path("m.bin"), &a, err, sizeof(err)));
		same_model(&src, &a);
		logits_of(&a, la, T);
		for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
			struct gb_llama_opts o = {.type = types[i]};
			gguf_file(tmp_path("m.gguf"), &src, &o);
			if (model_load(tmp_path("m.gguf"), &g, err, sizeof(err)))
				th_fail(__FILE__, __LINE__, "%s", err);
			T_EQ(g.version, MODEL_GGUF);
			same_model(&a, &g);
			T_EQ(g.cfg.n_layers, 2);
			T_EQ(g.cfg.n_heads, 4);
			T_EQ(g.cfg.hidden_dim, 64);
			T_ASSERT(g.cfg.rope_theta == 10000.0f);
			T_ASSERT(g.cfg.rms_eps == 1e-5f);
			T_EQ(g.bos, -1); /* no add_bos_token: no BOS */
			T_EQ(a.bos, MODEL_BOS);
			T_EQ(model_context(&g), 96); /* context_length */
			logits_of(&g, lg, T);
			T_ASSERT(!memcmp(la, lg, sizeof(float) * V * T));
			model_free(&g);
		}
		model_free(&a);
		model_free(&src);
	}
	free(la);
	free(lg);
}

TEST(model, gguf_hyperparameters_from_the_metadata)
{
	char err[512];
	struct model src, g, h;
	T_OK(model_alloc(&src, &gguf_cfg, err, sizeof(err)));
	gb_llama_fill(&src, 5);
	/* SmolLM2's theta and a context above MODEL_USABLE_CTX */
	struct gb_llama_opts o = {.rope_theta = 100000.0f, .context = 4096};
	gguf_file(tmp_path("t.gguf"), &src, &o);
	T_OK(model_load(tmp_path("t.gguf"), &g, err, sizeof(err)));
	T_ASSERT(g.cfg.rope_theta == 100000.0f);
	T_EQ(g.cfg.seq_len, 4096);
	T_EQ(model_context(&g), 4096);
	o.rope_theta = 10000.0f;
	gguf_file(tmp_path("h.gguf"), &src, &o);
	T_OK(model_load(tmp_path("h.gguf"), &h, err, sizeof(err)));
	/* theta matters from position 1 on, never at position 0 */
	const size_t V = gguf_cfg.vocab_size;
	float lg[24 * 40], lh[24 * 40];
	logits_of(&g, lg, 8);
	logits_of(&h, lh, 8);
	T_ASSERT(!memcmp(lg, lh, V * sizeof(float)));
	T_ASSERT(memcmp(lg + 7 * V, lh + 7 * V, V * sizeof(float)));
	model_free(&g);
	model_free(&h);

	o = (struct gb_llama_opts){.tokenizer = 0, .add_bos = 1, .bos_id = 3};
	gguf_file(tmp_path("b.gguf"), &src, &o);
	T_OK(model_load(tmp_path("b.gguf"), &g, err, sizeof(err)));
	T_EQ(g.bos, 3);
	model_free(&g);
	o.bos_id = 40; /* outside the vocabulary of 40 */
	gguf_file(tmp_path("b.gguf"), &src, &o);
	T_ERR(model_load(tmp_path("b.gguf"), &g, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "bos_token_id 40"));
	model_free(&src);
}

/* Expects path refused with code and a reason naming the file and word. */
static void refused(const char *path, int code, const char *word)
{
	char err[512] = "";
	struct model m;
	T_ERR(model_load(path, &m, err, sizeof(err)), code);
	if (!strstr(err, word) || !strstr(err, path))
		th_fail(__FILE__, __LINE__, "reason \"%s\" lacks \"%s\" or the "
		        "path", err, word);
	T_ASSERT(m.data == NULL && m.wq == NULL);
}

TEST(model, gguf_bad_files_refused)
{
	char err[512];
	struct model src;
	T_OK(model_alloc(&src, &gguf_cfg, err, sizeof(err)));
	gb_llama_fill(&src, 9);
	struct gb b = {0};
	gb_llama(&b, &src, &(struct gb_llama_opts){.type = GGUF_GGML_Q8_0});
	/* truncated: inside the header, inside the data */
	const size_t cuts[] = {10, 200, b.len / 2, b.len - 1};
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		struct gb c = {0};
		gb_put(&c, b.p, cuts[i]);
		gb_write(&c, tmp_path("cut.gguf"));
		gb_free(&c);
		refused(tmp_path("cut.gguf"), KVT_EINVAL, "cut.gguf");
	}
	/* a corrupt version and a corrupt tensor count */
	b.p[4] = 7;
	gb_write(&b, tmp_path("v7.gguf"));
	refused(tmp_path("v7.gguf"), KVT_EVERSION, "7");
	b.p[4] = 3;
	b.p[15] = 0x7f;
	gb_write(&b, tmp_path("count.gguf"));
	refused(tmp_path("count.gguf"), KVT_EINVAL, "count.gguf");
	gb_free(&b);

	const struct {
		struct gb_llama_opts o;
		int code;
		const char *word;
	} v[] = {
		{{.retype = "blk.0.attn_q.weight", .retype_to = GGUF_GGML_Q5_0},
		 KVT_ENOTSUP, "Q5_0"},
		{{.reshape = "blk.1.ffn_up.weight"}, KVT_EGEOMETRY,
		 "blk.1.ffn_up.weight"},
		{{.reshape = "token_embd.weight"}, KVT_EGEOMETRY,
		 "token_embd.weight"},
		{{.scaling = "linear"}, KVT_ENOTSUP, "RoPE scaling \"linear\""},
		{{.poison = "blk.1.attn_norm.weight"}, KVT_EINVAL, "not finite"},
	};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		gguf_file(tmp_path("bad.gguf"), &src, &v[i].o);
		refused(tmp_path("bad.gguf"), v[i].code, v[i].word);
	}
	model_free(&src);
}

/* ---------------------------------------------------------------- ops */

TEST(model, rmsnorm_hand_computed)
{
	float x[4] = {3, 4, 1, -1}, w[2] = {1, 2}, o[4];
	model_rmsnorm(o, x, w, 2, 2, 1e-5f);
	double r0 = 1.0 / sqrt(12.5 + 1e-5), r1 = 1.0 / sqrt(1.0 + 1e-5);
	T_ASSERT(fabs(o[0] - 3 * r0) < 1e-6);
	T_ASSERT(fabs(o[1] - 8 * r0) < 1e-6);
	T_ASSERT(fabs(o[2] - 1 * r1) < 1e-6);
	T_ASSERT(fabs(o[3] + 2 * r1) < 1e-6);
	/* eps is the caller's: 0.5 moves the second row visibly */
	model_rmsnorm(o, x, w, 2, 2, 0.5f);
	T_ASSERT(fabs(o[2] - 1 / sqrt(1.5)) < 1e-6);
}

TEST(model, rope_hand_computed)
{
	/* head_dim 4: pair 0 turns by pos rad, pair 1 by pos * 10000^-0.5 */
	float v[8] = {1, 0, 0, 1, 2, 3, 4, 5};
	model_rope(v, 2, 4, 3, 10000.0f);
	double a = 3.0, b = 0.03;
	double want[8] = {cos(a), sin(a), -sin(b), cos(b),
	                  2 * cos(a) - 3 * sin(a), 2 * sin(a) + 3 * cos(a),
	                  4 * cos(b) - 5 * sin(b), 4 * sin(b) + 5 * cos(b)};
	for (int i = 0; i < 8; i++)
		T_ASSERT(fabs(v[i] - want[i]) < 1e-5);
	float z[4] = {0.5f, -0.25f, 2, 1};
	model_rope(z, 1, 4, 0, 10000.0f); /* position 0 is the identity */
	T_ASSERT(z[0] == 0.5f && z[1] == -0.25f && z[2] == 2 && z[3] == 1);
	/* SmolLM2's theta 100000: pair 1 turns by pos * 100000^-0.5 */
	float u[4] = {0, 0, 1, 0};
	model_rope(u, 1, 4, 5, 100000.0f);
	double c = 5.0 / sqrt(100000.0);
	T_ASSERT(fabs(u[2] - cos(c)) < 1e-6 && fabs(u[3] - sin(c)) < 1e-6);
}

/* ---------------------------------------------------------------- naive */

/*
 * Token-by-token forward in double, written from the llama2.c recipe and
 * independent of model.c: logits [T][V], maps [L][H][T][T], xnorm [L][T]
 * (||x_j||), vnorm [L][H][T] (||W_O^h v_i||).
 */
struct naive {
	double *logits, *maps, *xnorm, *vnorm;
};

static void naive_rms(double *o, const double *x, const float *w, int d)
{
	double ss = 0;
	for (int i = 0; i < d; i++)
		ss += x[i] * x[i];
	ss = 1.0 / sqrt(ss / d + 1e-5);
	for (int i = 0; i < d; i++)
		o[i] = w[i] * x[i] * ss;
}

static void naive_mv(double *y, const float *W, const double *x, int out,
                     int in)
{
	for (int r = 0; r < out; r++) {
		double s = 0;
		for (int c = 0; c < in; c++)
			s += (double)W[r * in + c] * x[c];
		y[r] = s;
	}
}

static void naive_rope(double *v, int n, int hd, int pos)
{
	for (int h = 0; h < n; h++)
		for (int i = 0; i < hd; i += 2) {
			double th = pos * pow(10000.0, -(double)i / hd);
			double a = v[h * hd + i], b = v[h * hd + i + 1];
			v[h * hd + i] = a * cos(th) - b * sin(th);
			v[h * hd + i + 1] = a * sin(th) + b * cos(th);
		}
}

static void naive_run(const struct model *m, const int32_t *tok, int T,
                      struct naive *o)
{
	const struct model_config *c = &m->cfg;
	int d = (int)c->dim, L = (int)c->n_layers, H = (int)c->n_heads,
	    Hkv = (int)c->n_kv_heads, hd = (int)c->head_dim,
	    kvd = (int)c->kv_dim, hid = (int)c->hidden_dim,
	    V = (int)c->vocab_size, G = H / Hkv;
	o->logits = calloc((size_t)T * V, sizeof(double));
	o->maps = calloc((size_t)L * H * T * T, sizeof(double));
	o->xnorm = calloc((size_t)L * T, sizeof(double));
	o->vnorm = calloc((size_t)L * H * T, sizeof(double));
	double *kc = calloc((size_t)L * T * kvd, sizeof(double));
	double *vc = calloc((size_t)L * T * kvd, sizeof(double));
	double *h = malloc(sizeof(double) * d), *x = malloc(sizeof(double) * d),
	       *q = malloc(sizeof(double) * d), *att = malloc(sizeof(double) * d),
	       *tmp = malloc(sizeof(double) * d),
	       *a1 = malloc(sizeof(double) * hid),
	       *a3 = malloc(sizeof(double) * hid),
	       *s = malloc(sizeof(double) * T);
	for (int t = 0; t < T; t++) {
		for (int i = 0; i < d; i++)
			h[i] = m->tok_emb[(size_t)tok[t] * d + i];
		for (int l = 0; l < L; l++) {
			naive_rms(x, h, m->rms_att + l * d, d);
			double xx = 0;
			for (int i = 0; i < d; i++)
				xx += x[i] * x[i];
			o->xnorm[l * T + t] = sqrt(xx);
			double *kt = kc + ((size_t)l * T + t) * kvd;
			double *vt = vc + ((size_t)l * T + t) * kvd;
			naive_mv(q, m->wq + (size_t)l * d * d, x, d, d);
			naive_mv(kt, m->wk + (size_t)l * kvd * d, x, kvd, d);
			naive_mv(vt, m->wv + (size_t)l * kvd * d, x, kvd, d);
			naive_rope(q, H, hd, t);
			naive_rope(kt, Hkv, hd, t);
			for (int hh = 0; hh < H; hh++) {
				int g = hh / G;
				double mx = -1e300, sum = 0;
				for (int i = 0; i <= t; i++) {
					const double *ki = kc +
						((size_t)l * T + i) * kvd + g * hd;
					double dot = 0;
					for (int e = 0; e < hd; e++)
						dot += q[hh * hd + e] * ki[e];
					s[i] = dot / sqrt((double)hd);
					mx = s[i] > mx ? s[i] : mx;
				}
				for (int i = 0; i <= t; i++)
					sum += (s[i] = exp(s[i] - mx));
				for (int e = 0; e < hd; e++)
					att[hh * hd + e] = 0;
				for (int i = 0; i <= t; i++) {
					double a = s[i] / sum;
					o->maps[(((size_t)l * H + hh) * T + t) *
					        T + i] = a;
					const double *vi = vc +
						((size_t)l * T + i) * kvd + g * hd;
					for (int e = 0; e < hd; e++)
						att[hh * hd + e] += a * vi[e];
				}
				/* ||W_O^h v_t|| for the entry of this token */
				double nn = 0;
				for (int r = 0; r < d; r++) {
					double u = 0;
					for (int e = 0; e < hd; e++)
						u += (double)m->wo[(size_t)l * d * d +
						                   (size_t)r * d +
						                   hh * hd + e] *
						     vt[g * hd + e];
					nn += u * u;
				}
				o->vnorm[((size_t)l * H + hh) * T + t] = sqrt(nn);
			}
			naive_mv(tmp, m->wo + (size_t)l * d * d, att, d, d);
			for (int i = 0; i < d; i++)
				h[i] += tmp[i];
			naive_rms(x, h, m->rms_ffn + l * d, d);
			naive_mv(a1, m->w1 + (size_t)l * hid * d, x, hid, d);
			naive_mv(a3, m->w3 + (size_t)l * hid * d, x, hid, d);
			for (int i = 0; i < hid; i++)
				a1[i] = a1[i] / (1 + exp(-a1[i])) * a3[i];
			naive_mv(tmp, m->w2 + (size_t)l * d * hid, a1, d, hid);
			for (int i = 0; i < d; i++)
				h[i] += tmp[i];
		}
		naive_rms(x, h, m->rms_final, d);
		naive_mv(o->logits + (size_t)t * V, m->wcls, x, V, d);
	}
	free(kc);
	free(vc);
	free(h);
	free(x);
	free(q);
	free(att);
	free(tmp);
	free(a1);
	free(a3);
	free(s);
}

static void naive_free(struct naive *o)
{
	free(o->logits);
	free(o->maps);
	free(o->xnorm);
	free(o->vnorm);
}

static void tiny_tokens(int32_t *t, int T, uint32_t V)
{
	t[0] = MODEL_BOS;
	for (int i = 1; i < T; i++)
		t[i] = (int32_t)((i * 7 + (i * i) % 5) % (int)V);
}

/* ---------------------------------------------------------------- forward */

TEST(model, forward_matches_naive_and_chunking)
{
	struct model m;
	for (int shared = 0; shared <= 1; shared++) {
		tiny_model(&m, shared, 11);
		enum { T = 40 };
		int32_t tok[T];
		tiny_tokens(tok, T, m.cfg.vocab_size);
		uint32_t V = m.cfg.vocab_size;
		float *lg = malloc(sizeof(float) * T * V);
		float *ls = malloc(sizeof(float) * T * V);
		T_OK(model_dense_forward(&m, tok, T, lg));
		struct naive nv;
		naive_run(&m, tok, T, &nv);
		double worst = 0;
		for (size_t i = 0; i < (size_t)T * V; i++)
			worst = fmax(worst, fabs(lg[i] - nv.logits[i]));
		T_ASSERT(worst < 1e-4);
		/* chunks of 7 then one by one on the dense cache */
		struct model_dense dn;
		T_OK(model_dense_init(&dn, &m, T, 0));
		T_OK(model_dense_step(&dn, tok, 7, ls));
		T_OK(model_dense_step(&dn, tok + 7, 7, ls + 7 * V));
		for (int t = 14; t < T; t++)
			T_OK(model_dense_step(&dn, tok + t, 1, ls + t * V));
		T_ERR(model_dense_step(&dn, tok, 1, NULL), KVT_ETOOLONG);
		model_dense_free(&dn);
		double wc = 0;
		for (size_t i = 0; i < (size_t)T * V; i++)
			wc = fmax(wc, fabs(lg[i] - ls[i]));
		T_ASSERT(wc < 1e-4);
		int32_t badtok = (int32_t)V;
		T_ERR(model_dense_forward(&m, &badtok, 1, lg), KVT_EINVAL);
		naive_free(&nv);
		free(lg);
		free(ls);
		model_free(&m);
	}
}

/* ---------------------------------------------------------------- oracles */

TEST(model, oracles_match_naive_maps)
{
	struct model m;
	tiny_model(&m, 1, 5);
	const struct model_config *c = &m.cfg;
	const int L = (int)c->n_layers, H = (int)c->n_heads,
	          Hkv = (int)c->n_kv_heads, G = H / Hkv;
	enum { NC = 9, NS = 2 };
	int32_t ctx[NC], sep[NS] = {3, 4};
	for (int i = 0; i < NC; i++)
		ctx[i] = (int32_t)(5 + (i * 11) % 27);
	/* the pretext, built here independently */
	enum { N = 1 + 2 * NC + NS, TS = 1 + NC, J0 = 1 + NC + NS };
	int32_t full[N];
	full[0] = MODEL_BOS;
	for (int i = 0; i < NC; i++)
		full[1 + i] = full[J0 + i] = ctx[i];
	full[1 + NC] = sep[0];
	full[2 + NC] = sep[1];
	struct naive nv;
	naive_run(&m, full, N, &nv);

	float *kz = malloc(sizeof(float) * L * Hkv * TS);
	float *kp = malloc(sizeof(float) * L * Hkv * TS);
	T_OK(oracle_kvzip(&m, ctx, NC, sep, NS, 0, kz));
	T_OK(oracle_kvzip(&m, ctx, NC, sep, NS, 1, kp));
	double wz = 0, wp = 0, lo = 1, hi = 0;
	for (int l = 0; l < L; l++)
		for (int g = 0; g < Hkv; g++)
			for (int i = 0; i < TS; i++) {
				double bz = 0, bp = 0;
				for (int h = g * G; h < (g + 1) * G; h++)
					for (int j = TS; j < N; j++) {
						double a = nv.maps[(((size_t)l * H + h) *
						                    N + j) * N + i];
						bz = fmax(bz, a);
						bp = fmax(bp, a * nv.vnorm[((size_t)l * H +
						                            h) * N + i] /
						                      nv.xnorm[l * N + j]);
					}
				size_t at = ((size_t)l * Hkv + g) * TS + i;
				wz = fmax(wz, fabs(kz[at] - bz));
				wp = fmax(wp, fabs(kp[at] - log(bp)));
				lo = fmin(lo, bz);
				hi = fmax(hi, bz);
			}
	T_ASSERT(wz < 1e-5);
	T_ASSERT(wp < 1e-4);
	T_ASSERT(hi - lo > 0.1); /* scores are not all alike */
	naive_free(&nv);

	/* future attention on a plain sequence, horizon 5 */
	enum { TF = 30, HZ = 5 };
	int32_t tok[TF];
	tiny_tokens(tok, TF, c->vocab_size);
	naive_run(&m, tok, TF, &nv);
	float *fu = malloc(sizeof(float) * L * Hkv * TF);
	T_OK(oracle_future(&m, tok, TF, HZ, fu));
	double wf = 0;
	for (int l = 0; l < L; l++)
		for (int g = 0; g < Hkv; g++)
			for (int i = 0; i < TF; i++) {
				double best = 0;
				for (int h = g * G; h < (g + 1) * G; h++) {
					double s = 0;
					for (int t = i + 1; t <= i + HZ && t < TF;
					     t++)
						s += nv.maps[(((size_t)l * H + h) *
						              TF + t) * TF + i];
					best = fmax(best, s);
				}
				wf = fmax(wf, fabs(fu[((size_t)l * Hkv + g) * TF +
				                      i] - best));
			}
	T_ASSERT(wf < 1e-5);
	T_ASSERT(fu[TF - 1] == 0.0f); /* no future for the last entry */
	T_ERR(oracle_future(&m, tok, TF, 0, fu), KVT_EINVAL);
	T_ERR(oracle_kvzip(&m, ctx, 0, sep, NS, 0, kz), KVT_EINVAL);

	/* file format */
	char err[256];
	T_OK(oracle_write(tmp_path("o.bin"), ORACLE_FUTURE, &m, TF, HZ, fu, err,
	                  sizeof(err)));
	FILE *f = fopen(tmp_path("o.bin"), "rb");
	uint32_t hdr[8];
	T_ASSERT(fread(hdr, 4, 8, f) == 8);
	T_EQ(hdr[0], ORACLE_FILE_MAGIC);
	T_EQ(hdr[2], ORACLE_FUTURE);
	T_EQ(hdr[5], TF);
	T_EQ(hdr[6], HZ);
	float first;
	T_ASSERT(fread(&first, 4, 1, f) == 1);
	T_ASSERT(first == fu[0]);
	fclose(f);
	enum oracle_kind k;
	T_OK(oracle_kind_parse("kvzip+", &k));
	T_EQ(k, ORACLE_KVZIP_PLUS);
	T_ERR(oracle_kind_parse("kvzap", &k), KVT_EINVAL);
	T_EQ(oracle_kvzip_max_ctx(512, 2), 254);

	naive_free(&nv);
	free(kz);
	free(kp);
	free(fu);
	model_free(&m);
}
