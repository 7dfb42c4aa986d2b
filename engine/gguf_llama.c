/*
 * gguf_llama.c — the llama architecture check of a GGUF file: the
 * hyperparameters from its metadata and the shape and type of every tensor
 * the llama forward reads; see gguf.h (gguf_llama_check).
 */
#include "gguf.h"

#include <stdio.h>
#include <string.h>

#include "errors.h"
#include "kvtrim.h"

/* Checks that tensor name exists with ne = {ne0, ne1} (ne1 == 0: 1-D) and a
 * type gguf_dequant() handles. */
static int want_tensor(const struct gguf *g, const char *name, uint64_t ne0,
                       uint64_t ne1, char *err, size_t errlen)
{
	const struct gguf_tensor *t = gguf_tensor_find(g, name);
	uint32_t nd = ne1 ? 2 : 1;
	if (!t)
		return errors_fmt(err, errlen, KVT_EGEOMETRY,
		                  "missing tensor %s", name);
	if (t->n_dims != nd || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1))
		return errors_fmt(err, errlen, KVT_EGEOMETRY,
		                  "tensor %s has %u dims {%llu, %llu, ...}, "
		                  "expected {%llu%s%.0llu} from the "
		                  "hyperparameters", name, t->n_dims,
		                  (unsigned long long)t->ne[0],
		                  (unsigned long long)t->ne[1],
		                  (unsigned long long)ne0, ne1 ? ", " : "",
		                  (unsigned long long)ne1);
	if (!gguf_can_dequant(t->type))
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "tensor %s has type %s, which this reader "
		                  "cannot dequantise", name,
		                  gguf_type_name(t->type));
	return 0;
}

static int llama_hparams(const struct gguf *g, struct gguf_llama *hp,
                         char *err, size_t errlen)
{
	int rc;
	if ((rc = gguf_get_u32(g, "llama.embedding_length", &hp->n_embd, err,
	                       errlen)) < 0 ||
	    (rc = gguf_get_u32(g, "llama.block_count", &hp->n_layer, err,
	                       errlen)) < 0 ||
	    (rc = gguf_get_u32(g, "llama.attention.head_count", &hp->n_head,
	                       err, errlen)) < 0 ||
	    (rc = gguf_get_u32(g, "llama.feed_forward_length", &hp->n_ff, err,
	                       errlen)) < 0 ||
	    (rc = gguf_get_u32(g, "llama.context_length", &hp->n_ctx, err,
	                       errlen)) < 0 ||
	    (rc = gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon",
	                       &hp->rms_eps, err, errlen)) < 0)
		return rc;
	hp->n_head_kv = hp->n_head;
	if (gguf_find(g, "llama.attention.head_count_kv") &&
	    (rc = gguf_get_u32(g, "llama.attention.head_count_kv",
	                       &hp->n_head_kv, err, errlen)) < 0)
		return rc;
	hp->rope_theta = 10000.0f;
	if (gguf_find(g, "llama.rope.freq_base") &&
	    (rc = gguf_get_f32(g, "llama.rope.freq_base", &hp->rope_theta, err,
	                       errlen)) < 0)
		return rc;
	if (!hp->n_embd || !hp->n_layer || !hp->n_head || !hp->n_head_kv ||
	    !hp->n_ff || !hp->n_ctx || hp->n_head % hp->n_head_kv ||
	    hp->n_embd % hp->n_head || !(hp->rms_eps > 0) ||
	    !(hp->rope_theta > 0))
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "inconsistent llama hyperparameters: "
		                  "n_embd %u n_layer %u n_head %u n_head_kv %u "
		                  "n_ff %u n_ctx %u eps %g theta %g", hp->n_embd,
		                  hp->n_layer, hp->n_head, hp->n_head_kv,
		                  hp->n_ff, hp->n_ctx, (double)hp->rms_eps,
		                  (double)hp->rope_theta);
	hp->head_dim = hp->n_embd / hp->n_head;
	/* Models whose head size is not n_embd / n_head, or that rotate only
	 * part of each head, say so in these keys: not supported. */
	static const char *const same[] = {"llama.rope.dimension_count",
	                                   "llama.attention.key_length",
	                                   "llama.attention.value_length"};
	for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
		uint32_t v;
		if (!gguf_find(g, same[i]))
			continue;
		if ((rc = gguf_get_u32(g, same[i], &v, err, errlen)) < 0)
			return rc;
		if (v != hp->head_dim)
			return errors_fmt(err, errlen, KVT_ENOTSUP,
			                  "%s is %u, not n_embd / n_head = %u: "
			                  "not supported", same[i], v,
			                  hp->head_dim);
	}
	const struct gguf_value *toks = gguf_find(g, "tokenizer.ggml.tokens");
	if (gguf_find(g, "llama.vocab_size")) {
		if ((rc = gguf_get_u32(g, "llama.vocab_size", &hp->n_vocab, err,
		                       errlen)) < 0)
			return rc;
	} else if (toks && toks->type == GGUF_TYPE_ARRAY &&
	           toks->v.arr.n <= UINT32_MAX) {
		hp->n_vocab = (uint32_t)toks->v.arr.n;
	}
	if (!hp->n_vocab)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "no vocabulary size: neither llama.vocab_size "
		                  "nor a tokenizer.ggml.tokens array");
	return 0;
}

static int llama_layer(const struct gguf *g, const struct gguf_llama *hp,
                       uint32_t l, char *err, size_t errlen)
{
	const uint64_t e = hp->n_embd, q = (uint64_t)hp->n_head * hp->head_dim;
	const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;
	const uint64_t ff = hp->n_ff;
	const struct {
		const char *suffix;
		uint64_t ne0, ne1; /* ggml order: ne0 is the row length (in) */
	} want[] = {
		{"attn_norm.weight", e, 0},   {"attn_q.weight", e, q},
		{"attn_k.weight", e, kv},     {"attn_v.weight", e, kv},
		{"attn_output.weight", q, e}, {"ffn_norm.weight", e, 0},
		{"ffn_gate.weight", e, ff},   {"ffn_up.weight", e, ff},
		{"ffn_down.weight", ff, e},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char name[GGUF_MAX_NAME + 1];
		snprintf(name, sizeof(name), "blk.%u.%s", l, want[i].suffix);
		int rc = want_tensor(g, name, want[i].ne0, want[i].ne1, err,
		                     errlen);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int gguf_llama_check(const struct gguf *g, struct gguf_llama *hp, char *err,
                     size_t errlen)
{
	struct gguf_str arch;
	struct gguf_llama h;
	memset(&h, 0, sizeof(h));
	int rc = gguf_get_str(g, "general.architecture", &arch, err, errlen);
	if (rc < 0)
		return rc;
	if (!gguf_str_eq(arch, "llama"))
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "architecture \"%.*s\" is not supported (only "
		                  "llama)", (int)(arch.len < 64 ? arch.len : 64),
		                  arch.p);
	if ((rc = llama_hparams(g, &h, err, errlen)) < 0 ||
	    (rc = want_tensor(g, "token_embd.weight", h.n_embd, h.n_vocab, err,
	                      errlen)) < 0 ||
	    (rc = want_tensor(g, "output_norm.weight", h.n_embd, 0, err,
	                      errlen)) < 0)
		return rc;
	h.tied = gguf_tensor_find(g, "output.weight") == NULL;
	if (!h.tied && (rc = want_tensor(g, "output.weight", h.n_embd,
	                                 h.n_vocab, err, errlen)) < 0)
		return rc;
	for (uint32_t l = 0; l < h.n_layer; l++)
		if ((rc = llama_layer(g, &h, l, err, errlen)) < 0)
			return rc;
	if (hp)
		*hp = h;
	return 0;
}
