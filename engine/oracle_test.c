/*
 * oracle_test.c — the oracles (engine/oracle.c) on a tiny llama GGUF model
 * with the byte tokenizer of tests/harness/gb.h and no BOS, as SmolLM2
 * is: the repeat prompt in the tokenizer's ids, KVzip / KVzip+ of
 * ctx sep ctx, window reductions, attention inputs and logits, each
 * against a computation written out here from the attention maps of the
 * engine's dense reference (model_dense with recorded maps: scalar
 * attention, no BLAS, a different implementation from the oracle's pass).
 * Run: build/bin/kvtrim-tests oracle
 */
#include <math.h>

#include "gb.h"
#include "gguf.h"
#include "model.h"
#include "oracle.h"
#include "test.h"
#include "tokenizer.h"

/* 2 layers, d 32, 4 heads over 2 KV heads, context 512, q/k scaled up so
 * the attention maps are not flat. */
static void tiny_gguf_model(struct model *m, struct tok **t)
{
	char err[512], path[600];
	struct model src;
	struct model_config c = {
		.dim = 32, .hidden_dim = 64, .n_layers = 2, .n_heads = 4,
		.n_kv_heads = 2, .vocab_size = GB_TOK_VOCAB, .seq_len = 512,
		.shared_classifier = 1,
	};
	T_OK(model_alloc(&src, &c, err, sizeof(err)));
	gb_llama_fill(&src, 21);
	for (size_t i = 0; i < (size_t)c.n_layers * c.dim * c.dim; i++)
		src.wq[i] *= 8;
	for (size_t i = 0; i < (size_t)c.n_layers * src.cfg.kv_dim * c.dim; i++)
		src.wk[i] *= 8;
	struct gb b = {0};
	gb_llama(&b, &src, &(struct gb_llama_opts){.tokenizer = 1});
	snprintf(path, sizeof(path), "%s/tiny.gguf", th_tmpdir());
	gb_write(&b, path);
	gb_free(&b);
	model_free(&src);
	if (model_load(path, m, err, sizeof(err)))
		th_fail(__FILE__, __LINE__, "%s", err);
	struct gguf *g;
	if (gguf_open(path, &g, err, sizeof(err)) < 0 ||
	    tok_load(g, t, err, sizeof(err)) < 0)
		th_fail(__FILE__, __LINE__, "%s", err);
	gguf_close(g);
}

/* The dense reference of tokens[0..n): maps, xs, v, logits. */
struct ref {
	struct model_dense dn;
	float *logits; /* [n][vocab] */
};

static void ref_run(const struct model *m, const int32_t *tok, uint32_t n,
                    struct ref *r)
{
	r->logits = malloc(sizeof(float) * n * m->cfg.vocab_size);
	T_ASSERT(r->logits);
	T_OK(model_dense_init(&r->dn, m, n, 1));
	T_OK(model_dense_step(&r->dn, tok, n, r->logits));
}

static void ref_free(struct ref *r)
{
	model_dense_free(&r->dn);
	free(r->logits);
}

/* a^h_{t,i} of layer l */
static double amap(const struct ref *r, uint32_t l, uint32_t h, uint32_t t,
                   uint32_t i)
{
	const struct model_config *c = &r->dn.m->cfg;
	size_t N = r->dn.cap;
	return r->dn.maps[(((size_t)l * c->n_heads + h) * N + t) * N + i];
}

/* ||W_O^h v_i|| of layer l, in double from the cache's v */
static double vnorm(const struct ref *r, uint32_t l, uint32_t h, uint32_t i)
{
	const struct model *m = r->dn.m;
	const struct model_config *c = &m->cfg;
	const uint32_t d = c->dim, hd = c->head_dim,
	               G = c->n_heads / c->n_kv_heads;
	const float *v = r->dn.v + (((size_t)l * c->n_kv_heads + h / G) *
	                                    r->dn.cap + i) * hd;
	double ss = 0;
	for (uint32_t row = 0; row < d; row++) {
		double u = 0;
		for (uint32_t e = 0; e < hd; e++)
			u += (double)m->wo[(size_t)l * d * d + (size_t)row * d +
			                   h * hd + e] * v[e];
		ss += u * u;
	}
	return sqrt(ss);
}

static double xnorm(const struct ref *r, uint32_t l, uint32_t j)
{
	const uint32_t d = r->dn.m->cfg.dim;
	const float *x = r->dn.xs + ((size_t)l * r->dn.cap + j) * d;
	double ss = 0;
	for (uint32_t e = 0; e < d; e++)
		ss += (double)x[e] * x[e];
	return sqrt(ss);
}

TEST(oracle, repeat_prompt_in_tokenizer_ids)
{
	struct model m;
	struct tok *t;
	tiny_gguf_model(&m, &t);
	T_EQ(m.bos, -1);
	T_EQ(m.version, MODEL_GGUF);
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t ns = 0;
	char err[256];
	T_OK(oracle_repeat_sep(t, sep, &ns, err, sizeof(err)));
	/* byte tokens, then the ChatML turn of the assistant */
	const char *p = "\n\nRepeat the previous context exactly.";
	int32_t want[ORACLE_SEP_MAX];
	uint32_t k = 0;
	for (const char *s = p; *s; s++)
		want[k++] = (unsigned char)*s;
	want[k++] = GB_TOK_IM_END;
	want[k++] = '\n';
	want[k++] = GB_TOK_IM_START;
	for (const char *s = "assistant\n"; *s; s++)
		want[k++] = (unsigned char)*s;
	T_EQ(ns, k);
	for (uint32_t i = 0; i < k; i++)
		T_EQ(sep[i], want[i]);
	/* no BOS: T = n_ctx, and the pretext ctx sep ctx fills the context */
	T_EQ(oracle_scored(&m, 100), 100);
	T_EQ(oracle_max_ctx(&m, 512, ns), (512 - ns) / 2);
	tok_free(t);
	model_free(&m);
}

TEST(oracle, kvzip_no_bos_matches_dense_maps)
{
	struct model m;
	struct tok *t;
	tiny_gguf_model(&m, &t);
	const struct model_config *c = &m.cfg;
	const uint32_t L = c->n_layers, H = c->n_heads, Hkv = c->n_kv_heads,
	               G = H / Hkv;
	char err[256];
	int32_t sep[ORACLE_SEP_MAX];
	uint32_t ns;
	T_OK(oracle_repeat_sep(t, sep, &ns, err, sizeof(err)));
	const char *text = "the cat sat on the mat; the dog ran off.";
	struct tok_ids ids = {0};
	T_OK(tok_encode(t, text, strlen(text), 0, &ids, err, sizeof(err)));
	const uint32_t nc = (uint32_t)ids.n, N = 2 * nc + ns, J0 = nc + ns;
	/* the pretext, built here: ctx sep ctx, no BOS */
	int32_t *full = malloc(sizeof(int32_t) * N);
	memcpy(full, ids.v, nc * 4);
	memcpy(full + nc, sep, ns * 4);
	memcpy(full + J0, ids.v, nc * 4);
	struct ref r;
	ref_run(&m, full, N, &r);

	float *kz = malloc(sizeof(float) * L * Hkv * nc);
	float *kp = malloc(sizeof(float) * L * Hkv * nc);
	T_OK(oracle_kvzip(&m, ids.v, nc, sep, ns, 0, kz));
	T_OK(oracle_kvzip(&m, ids.v, nc, sep, ns, 1, kp));
	double wz = 0, wp = 0, lo = 1, hi = 0;
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t g = 0; g < Hkv; g++)
			for (uint32_t i = 0; i < nc; i++) {
				double bz = 0, bp = 0;
				for (uint32_t h = g * G; h < (g + 1) * G; h++)
					for (uint32_t j = nc; j < N; j++) {
						double a = amap(&r, l, h, j, i);
						bz = fmax(bz, a);
						bp = fmax(bp, a * vnorm(&r, l, h, i) /
						                      xnorm(&r, l, j));
					}
				size_t at = ((size_t)l * Hkv + g) * nc + i;
				wz = fmax(wz, fabs(kz[at] - bz));
				wp = fmax(wp, fabs(kp[at] - log(bp)));
				lo = fmin(lo, bz);
				hi = fmax(hi, bz);
			}
	/* float32 with peaked maps: 2e-5 and 2e-4 measured; a wrong index
	 * or query range costs 1e-2 and more */
	T_ASSERT(wz < 1e-4);
	T_ASSERT(wp < 1e-3);
	T_ASSERT(hi - lo > 0.1); /* scores are not all alike */
	ref_free(&r);
	free(kz);
	free(kp);
	free(full);
	free(ids.v);
	tok_free(t);
	model_free(&m);
}

TEST(oracle, windows_xs_logits_match_dense)
{
	struct model m;
	struct tok *t;
	tiny_gguf_model(&m, &t);
	const struct model_config *c = &m.cfg;
	const uint32_t L = c->n_layers, H = c->n_heads, Hkv = c->n_kv_heads,
	               G = H / Hkv, d = c->dim, V = c->vocab_size;
	enum { N = 60, PLAIN = 50, ROWS = 40, XR = 45 };
	int32_t tok[N];
	uint64_t st = 7;
	for (int i = 0; i < N; i++) {
		st = st * 6364136223846793005ull + 1442695040888963407ull;
		tok[i] = (int32_t)((st >> 33) % V);
	}
	struct ref r;
	ref_run(&m, tok, N, &r);
	float *w0 = malloc(sizeof(float) * L * Hkv * ROWS);
	float *w1 = malloc(sizeof(float) * L * Hkv * ROWS);
	float *w2 = malloc(sizeof(float) * L * Hkv * ROWS);
	float *xs = malloc(sizeof(float) * L * XR * d);
	float *lg = malloc(sizeof(float) * N * V);
	struct oracle_req q = {.tokens = tok, .n = N, .rows = ROWS,
	                       .plain = PLAIN, .n_win = 3,
	                       .win = {{0, 3, 1, w0}, {3, 12, 0, w1},
	                               {3, 12, 1, w2, 0.75f}},
	                       .xs = xs, .xs_rows = XR, .logits = lg};
	T_OK(oracle_run(&m, &q));
	double ww = 0, wx = 0, wl = 0;
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t g = 0; g < Hkv; g++)
			for (uint32_t i = 0; i < ROWS; i++) {
				double mean = 0, best = 0, dec = 0;
				for (uint32_t h = g * G; h < (g + 1) * G; h++) {
					double s0 = 0, s1 = 0, s2 = 0;
					for (uint32_t t2 = i + 1;
					     t2 <= i + 3 && t2 < PLAIN; t2++)
						s0 += amap(&r, l, h, t2, i);
					/* the decayed sum as of query i + 12,
					 * every weight a power of 0.75 written
					 * out: 0.75^(i + 12 - t) */
					for (uint32_t t2 = i + 4;
					     t2 <= i + 12 && t2 < PLAIN; t2++) {
						s1 += amap(&r, l, h, t2, i);
						s2 += pow(0.75, (double)(i + 12 -
						                         t2)) *
						      amap(&r, l, h, t2, i);
					}
					mean += s0 / G;
					dec += s2 / G;
					best = fmax(best, s1);
				}
				size_t at = ((size_t)l * Hkv + g) * ROWS + i;
				ww = fmax(ww, fabs(w0[at] - mean));
				ww = fmax(ww, fabs(w1[at] - best));
				ww = fmax(ww, fabs(w2[at] - dec));
			}
	for (uint32_t l = 0; l < L; l++)
		for (size_t k = 0; k < (size_t)XR * d; k++)
			wx = fmax(wx, fabs(xs[(size_t)l * XR * d + k] -
			                   r.dn.xs[(size_t)l * N * d + k]));
	for (size_t k = 0; k < (size_t)N * V; k++)
		wl = fmax(wl, fabs(lg[k] - r.logits[k]));
	T_ASSERT(ww < 1e-4); /* 1.6e-5 measured */
	T_ASSERT(wx < 1e-4);
	T_ASSERT(wl < 1e-4);
	/* the last row's window is cut at plain: row 39 sums t in (42, 49] */
	T_ASSERT(w1[ROWS - 1] > 0);

	/* future attention is the max window (0, horizon] over the sequence */
	float *fu = malloc(sizeof(float) * L * Hkv * N);
	T_OK(oracle_future(&m, tok, N, 12, fu));
	T_ASSERT(fu[N - 1] == 0.0f);

	/* inconsistent requests are refused */
	struct oracle_req bad = q;
	bad.rows = PLAIN + 1;
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	bad = q;
	bad.plain = N + 1;
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	bad = q;
	bad.win[1].lo = 12;
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	bad = q;
	bad.win[2].decay = 1.5f;
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	bad.win[2].decay = NAN;
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	bad.win[2].decay = -0.5f;
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	bad = (struct oracle_req){.tokens = tok, .n = N, .scored = 10,
	                          .q0 = 5, .kvzip = w0};
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	bad.q0 = N;
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	int32_t badtok = (int32_t)V;
	bad = (struct oracle_req){.tokens = &badtok, .n = 1, .logits = lg};
	T_ERR(oracle_run(&m, &bad), KVT_EINVAL);
	ref_free(&r);
	free(w0);
	free(w1);
	free(w2);
	free(xs);
	free(lg);
	free(fu);
	tok_free(t);
	model_free(&m);
}
