/*
 * model_gguf.c — llama GGUF files into struct model; see model_gguf.h.
 */
#include "model_gguf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "gguf.h"
#include "kvtrim.h"
#include "model.h"
#include "tokenizer.h"

/* Dequantises tensor name (n floats, as gguf_llama_check sized it) into
 * dst and refuses non-finite values: a flipped exponent bit in an f16
 * scale would otherwise turn into NaN logits far from its cause. */
static int fill(const struct gguf *g, const char *name, float *dst,
                uint64_t n, char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_tensor_find(g, name);
	if (!t || t->n_elem != n)
		return errors_fmt(err, errlen, KVT_EGEOMETRY,
		                  "tensor %s: %llu elements, expected %llu", name,
		                  t ? (unsigned long long)t->n_elem : 0ull,
		                  (unsigned long long)n);
	int rc = gguf_dequant(t, 0, n, dst, err, errlen);
	if (rc < 0)
		return rc;
	for (uint64_t i = 0; i < n; i++)
		if (!isfinite(dst[i]))
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "tensor %s: element %llu is not finite "
			                  "(corrupt data)", name,
			                  (unsigned long long)i);
	return 0;
}

/* The forward implements plain RoPE only. */
static int check_rope(const struct gguf *g, char *err, size_t errlen)
{
	struct gguf_str s;
	if (!gguf_find(g, "llama.rope.scaling.type"))
		return 0;
	int rc = gguf_get_str(g, "llama.rope.scaling.type", &s, err, errlen);
	if (rc < 0)
		return rc;
	if (!gguf_str_eq(s, "none"))
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "RoPE scaling \"%.*s\" is not supported",
		                  (int)(s.len < 32 ? s.len : 32), s.p);
	return 0;
}

static int bos_of(const struct gguf *g, uint32_t vocab, int32_t *bos,
                  char *err, size_t errlen)
{
	int add = 0, rc;
	uint32_t id;
	*bos = -1;
	if (gguf_find(g, "tokenizer.ggml.add_bos_token") &&
	    (rc = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add, err,
	                        errlen)) < 0)
		return rc;
	if (!add)
		return 0;
	if ((rc = gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id, err,
	                       errlen)) < 0)
		return rc;
	if (id >= vocab)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "tokenizer.ggml.bos_token_id %u is outside the "
		                  "vocabulary of %u", id, vocab);
	*bos = (int32_t)id;
	return 0;
}

static int load(const struct gguf *g, struct model *m, char *err,
                size_t errlen)
{
	struct gguf_llama hp;
	int32_t bos;
	int rc;
	if ((rc = gguf_llama_check(g, &hp, err, errlen)) < 0 ||
	    (rc = check_rope(g, err, errlen)) < 0 ||
	    (rc = bos_of(g, hp.n_vocab, &bos, err, errlen)) < 0)
		return rc;
	struct model_config c = {
		.dim = hp.n_embd, .hidden_dim = hp.n_ff,
		.n_layers = hp.n_layer, .n_heads = hp.n_head,
		.n_kv_heads = hp.n_head_kv, .vocab_size = hp.n_vocab,
		.seq_len = hp.n_ctx, .shared_classifier = (uint32_t)hp.tied,
		.rope_theta = hp.rope_theta, .rms_eps = hp.rms_eps,
		.usable_ctx = hp.n_ctx,
	};
	if ((rc = model_alloc(m, &c, err, errlen)) < 0)
		return rc;
	m->version = MODEL_GGUF;
	m->bos = bos;
	const uint64_t d = c.dim, kv = m->cfg.kv_dim, hid = c.hidden_dim;
	const uint64_t V = c.vocab_size;
	if ((rc = fill(g, "token_embd.weight", m->tok_emb, V * d, err,
	               errlen)) < 0 ||
	    (rc = fill(g, "output_norm.weight", m->rms_final, d, err,
	               errlen)) < 0 ||
	    (!hp.tied && (rc = fill(g, "output.weight", m->wcls, V * d, err,
	                            errlen)) < 0))
		return rc;
	/* Per layer: the GGUF name, where it goes in struct model, and its
	 * size in floats (ne[0] = in is the row length in both). */
	for (uint64_t l = 0; l < c.n_layers; l++) {
		const struct {
			const char *suffix;
			float *dst;
			uint64_t n;
		} t[] = {
			{"attn_norm.weight", m->rms_att + l * d, d},
			{"attn_q.weight", m->wq + l * d * d, d * d},
			{"attn_k.weight", m->wk + l * kv * d, kv * d},
			{"attn_v.weight", m->wv + l * kv * d, kv * d},
			{"attn_output.weight", m->wo + l * d * d, d * d},
			{"ffn_norm.weight", m->rms_ffn + l * d, d},
			{"ffn_gate.weight", m->w1 + l * hid * d, hid * d},
			{"ffn_down.weight", m->w2 + l * d * hid, d * hid},
			{"ffn_up.weight", m->w3 + l * hid * d, hid * d},
		};
		for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
			char name[GGUF_MAX_NAME + 1];
			snprintf(name, sizeof(name), "blk.%llu.%s",
			         (unsigned long long)l, t[i].suffix);
			if ((rc = fill(g, name, t[i].dst, t[i].n, err,
			               errlen)) < 0)
				return rc;
		}
	}
	return 0;
}

int model_gguf_load(const struct gguf *g, struct model *m, char *err,
                    size_t errlen)
{
	memset(m, 0, sizeof(*m));
	int rc = load(g, m, err, errlen);
	if (rc < 0)
		model_free(m);
	return rc;
}

int model_gguf_load_file(const char *path, struct model *m, char *err,
                         size_t errlen)
{
	struct gguf *g = NULL;
	memset(m, 0, sizeof(*m));
	int rc = gguf_open(path, &g, err, errlen);
	if (rc < 0)
		return rc; /* gguf_open's reasons name the path */
	char why[KVT_ERRTEXT_MAX];
	rc = model_gguf_load(g, m, why, sizeof(why));
	gguf_close(g);
	if (rc < 0)
		return errors_fmt(err, errlen, rc, "%s: %s", path, why);
	return 0;
}

int model_gguf_tok_file(const char *path, const struct model *m,
                        struct tok **out, char *err, size_t errlen)
{
	struct gguf *g = NULL;
	*out = NULL;
	int rc = gguf_open(path, &g, err, errlen);
	if (rc < 0)
		return rc;
	char why[KVT_ERRTEXT_MAX];
	if (!gguf_find(g, "tokenizer.ggml.model"))
		rc = errors_fmt(why, sizeof(why), KVT_EINVAL,
		                "no tokenizer in the file");
	else if ((rc = tok_load(g, out, why, sizeof(why))) == 0 &&
	         tok_vocab_size(*out) > m->cfg.vocab_size) {
		rc = errors_fmt(why, sizeof(why), KVT_EINVAL, "the tokenizer has "
		                "%u tokens, the model's vocabulary %u",
		                tok_vocab_size(*out), m->cfg.vocab_size);
		tok_free(*out);
		*out = NULL;
	}
	gguf_close(g);
	if (rc < 0)
		return errors_fmt(err, errlen, rc, "%s: %s", path, why);
	return 0;
}
