/*
 * gb.c — the GGUF builder of the tests; see gb.h.
 */
#include "gb.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kernels.h"
#include "model.h"
#include "test.h"

void gb_put(struct gb *b, const void *d, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		T_ASSERT(b->p);
	}
	memcpy(b->p + b->len, d, n);
	b->len += n;
}

void gb_u8(struct gb *b, uint8_t v) { gb_put(b, &v, 1); }
void gb_u16(struct gb *b, uint16_t v) { gb_put(b, &v, 2); }
void gb_u32(struct gb *b, uint32_t v) { gb_put(b, &v, 4); }
void gb_u64(struct gb *b, uint64_t v) { gb_put(b, &v, 8); }
void gb_f32(struct gb *b, float v) { gb_put(b, &v, 4); }

void gb_str(struct gb *b, const char *s)
{
	gb_u64(b, strlen(s));
	gb_put(b, s, strlen(s));
}

void gb_hdr(struct gb *b, uint32_t version, uint64_t n_t, uint64_t n_kv)
{
	gb_put(b, "GGUF", 4);
	gb_u32(b, version);
	gb_u64(b, n_t);
	gb_u64(b, n_kv);
}

void gb_key(struct gb *b, const char *key, uint32_t type)
{
	gb_str(b, key);
	gb_u32(b, type);
}

void gb_kv_u32(struct gb *b, const char *key, uint32_t v)
{
	gb_key(b, key, GGUF_TYPE_UINT32);
	gb_u32(b, v);
}

void gb_kv_f32(struct gb *b, const char *key, float v)
{
	gb_key(b, key, GGUF_TYPE_FLOAT32);
	gb_f32(b, v);
}

void gb_kv_bool(struct gb *b, const char *key, int v)
{
	gb_key(b, key, GGUF_TYPE_BOOL);
	gb_u8(b, v ? 1 : 0);
}

void gb_kv_str(struct gb *b, const char *key, const char *v)
{
	gb_key(b, key, GGUF_TYPE_STRING);
	gb_str(b, v);
}

void gb_tinfo(struct gb *b, const char *name, uint32_t n_dims,
              const uint64_t *ne, uint32_t type, uint64_t off)
{
	gb_str(b, name);
	gb_u32(b, n_dims);
	for (uint32_t i = 0; i < n_dims; i++)
		gb_u64(b, ne[i]);
	gb_u32(b, type);
	gb_u64(b, off);
}

void gb_pad(struct gb *b, size_t align)
{
	while (b->len % align)
		gb_u8(b, 0);
}

void gb_at(struct gb *b, size_t off, const void *d, size_t n)
{
	while (b->len < off)
		gb_u8(b, 0);
	T_ASSERT(b->len == off);
	gb_put(b, d, n);
}

void gb_free(struct gb *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

void gb_write(const struct gb *b, const char *path)
{
	FILE *f = fopen(path, "wb");
	T_ASSERT(f);
	T_ASSERT(fwrite(b->p, 1, b->len, f) == b->len);
	T_ASSERT(fclose(f) == 0);
}

/* ---------------------------------------------------------------- llama */

#define Q8_SCALE (1.0f / 512)  /* 2^-9 */
#define Q8_SCALE_F16 0x1800    /* 2^-9 as f16: exponent 6, mantissa 0 */

/* The data of n floats x as type (row length ne0). */
static void put_data(struct gb *d, const float *x, uint64_t n, uint32_t type)
{
	if (type == GGUF_GGML_F32) {
		gb_put(d, x, n * 4);
	} else if (type == GGUF_GGML_F16) {
		for (uint64_t i = 0; i < n; i++) {
			uint16_t h;
			dtype_from_f32(&x[i], KVT_DTYPE_F16, &h, 1);
			gb_u16(d, h);
		}
	} else {
		T_ASSERT(type == GGUF_GGML_Q8_0 && n % 32 == 0);
		for (uint64_t i = 0; i < n; i += 32) {
			gb_u16(d, Q8_SCALE_F16);
			for (int j = 0; j < 32; j++) {
				float q = x[i + j] / Q8_SCALE;
				T_ASSERT(q == rintf(q) && fabsf(q) <= 127);
				gb_u8(d, (uint8_t)(int8_t)q);
			}
		}
	}
}

/* Bytes of n elements of type (the types the variants use). */
static uint64_t type_bytes(uint32_t type, uint64_t n)
{
	uint32_t blck, bytes;
	T_ASSERT(gguf_type_block((enum gguf_ggml_type)type, &blck,
	                         &bytes) == 0);
	return n / blck * bytes;
}

struct tw {
	struct gb ti, data;
	uint64_t n;
	const struct gb_llama_opts *o;
};

static void tensor(struct tw *w, const char *name, const float *x,
                   uint64_t ne0, uint64_t ne1, uint32_t type)
{
	const struct gb_llama_opts *o = w->o;
	uint64_t ne[2] = {ne0, ne1 ? ne1 : 1};
	int zero = 0;
	if (o->retype && !strcmp(o->retype, name)) {
		type = o->retype_to;
		zero = 1;
	}
	if (o->reshape && !strcmp(o->reshape, name)) {
		ne[1]++;
		ne1 = ne[1];
		zero = 1;
	}
	gb_tinfo(&w->ti, name, ne1 ? 2 : 1, ne, type, w->data.len);
	uint64_t n = ne[0] * ne[1];
	if (zero) {
		for (uint64_t i = type_bytes(type, n); i; i--)
			gb_u8(&w->data, 0);
	} else if (o->poison && !strcmp(o->poison, name)) {
		T_ASSERT(type == GGUF_GGML_F32);
		gb_f32(&w->data, NAN);
		put_data(&w->data, x + 1, n - 1, type);
	} else {
		put_data(&w->data, x, n, type);
	}
	gb_pad(&w->data, 32);
	w->n++;
}

/* GPT-2's byte characters: printable Latin-1 bytes stand for themselves,
 * the others for U+0100 + their rank among them. */
static void byte_token(uint8_t b, char out[3])
{
	unsigned cp = b, k = 0;
	int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) ||
	                b >= 0xae;
	if (!printable) {
		for (unsigned i = 0; i < b; i++)
			k += !((i >= '!' && i <= '~') ||
			       (i >= 0xa1 && i <= 0xac) || i >= 0xae);
		cp = 256 + k;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | (cp >> 6));
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

static const char CHATML[] =
	"{% for message in messages %}{{'<|im_start|>' + message['role'] + "
	"'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
	"{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
	"{% endif %}";

static int tokenizer_kvs(struct gb *kv)
{
	char t[3];
	gb_kv_str(kv, "tokenizer.ggml.model", "gpt2");
	gb_kv_str(kv, "tokenizer.ggml.pre", "smollm");
	gb_key(kv, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
	gb_u32(kv, GGUF_TYPE_STRING);
	gb_u64(kv, GB_TOK_VOCAB);
	for (int i = 0; i < 256; i++) {
		byte_token((uint8_t)i, t);
		gb_str(kv, t);
	}
	gb_str(kv, "<|im_start|>");
	gb_str(kv, "<|im_end|>");
	gb_key(kv, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
	gb_u32(kv, GGUF_TYPE_INT32);
	gb_u64(kv, GB_TOK_VOCAB);
	for (int i = 0; i < GB_TOK_VOCAB; i++)
		gb_u32(kv, i < 256 ? 1 : 3); /* NORMAL, CONTROL */
	gb_key(kv, "tokenizer.ggml.merges", GGUF_TYPE_ARRAY);
	gb_u32(kv, GGUF_TYPE_STRING);
	gb_u64(kv, 0);
	gb_kv_u32(kv, "tokenizer.ggml.eos_token_id", GB_TOK_IM_END);
	gb_kv_str(kv, "tokenizer.chat_template", CHATML);
	return 7; /* the keys written above */
}

void gb_llama(struct gb *b, const struct model *m,
              const struct gb_llama_opts *o)
{
	const struct model_config *c = &m->cfg;
	struct gb kv = {0};
	struct tw w = {{0}, {0}, 0, o};
	int nkv = 0;
	gb_kv_str(&kv, "general.architecture", "llama");
	const struct {
		const char *key;
		uint32_t v;
	} u[] = {
		{"llama.embedding_length", c->dim},
		{"llama.block_count", c->n_layers},
		{"llama.attention.head_count", c->n_heads},
		{"llama.attention.head_count_kv", c->n_kv_heads},
		{"llama.feed_forward_length", c->hidden_dim},
		{"llama.context_length", o->context ? o->context : c->seq_len},
		{"llama.vocab_size", c->vocab_size},
	};
	for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++)
		gb_kv_u32(&kv, u[i].key, u[i].v);
	gb_kv_f32(&kv, "llama.attention.layer_norm_rms_epsilon", c->rms_eps);
	gb_kv_f32(&kv, "llama.rope.freq_base",
	          o->rope_theta ? o->rope_theta : c->rope_theta);
	nkv = 1 + (int)(sizeof(u) / sizeof(u[0])) + 2;
	if (o->scaling) {
		gb_kv_str(&kv, "llama.rope.scaling.type", o->scaling);
		nkv++;
	}
	if (o->tokenizer) {
		T_ASSERT(c->vocab_size == GB_TOK_VOCAB);
		nkv += tokenizer_kvs(&kv);
	}
	if (o->tokenizer || o->add_bos) {
		gb_kv_u32(&kv, "tokenizer.ggml.bos_token_id", o->bos_id);
		gb_kv_bool(&kv, "tokenizer.ggml.add_bos_token", o->add_bos);
		nkv += 2;
	}

	const uint64_t d = c->dim, kvd = c->kv_dim, hid = c->hidden_dim;
	const uint32_t ty = o->type;
	tensor(&w, "token_embd.weight", m->tok_emb, d, c->vocab_size, ty);
	tensor(&w, "output_norm.weight", m->rms_final, d, 0, GGUF_GGML_F32);
	if (!c->shared_classifier)
		tensor(&w, "output.weight", m->wcls, d, c->vocab_size, ty);
	for (uint64_t l = 0; l < c->n_layers; l++) {
		const struct {
			const char *s;
			const float *x;
			uint64_t ne0, ne1;
		} t[] = {
			{"attn_norm.weight", m->rms_att + l * d, d, 0},
			{"attn_q.weight", m->wq + l * d * d, d, d},
			{"attn_k.weight", m->wk + l * kvd * d, d, kvd},
			{"attn_v.weight", m->wv + l * kvd * d, d, kvd},
			{"attn_output.weight", m->wo + l * d * d, d, d},
			{"ffn_norm.weight", m->rms_ffn + l * d, d, 0},
			{"ffn_gate.weight", m->w1 + l * hid * d, d, hid},
			{"ffn_down.weight", m->w2 + l * d * hid, hid, d},
			{"ffn_up.weight", m->w3 + l * hid * d, d, hid},
		};
		for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
			char name[64];
			snprintf(name, sizeof(name), "blk.%llu.%s",
			         (unsigned long long)l, t[i].s);
			tensor(&w, name, t[i].x, t[i].ne0, t[i].ne1,
			       t[i].ne1 ? ty : GGUF_GGML_F32);
		}
	}
	gb_hdr(b, GGUF_VERSION, w.n, (uint64_t)nkv);
	gb_put(b, kv.p, kv.len);
	gb_put(b, w.ti.p, w.ti.len);
	gb_pad(b, 32);
	gb_put(b, w.data.p, w.data.len);
	gb_free(&kv);
	gb_free(&w.ti);
	gb_free(&w.data);
}

static uint64_t fill_rng;

static float q9(void) /* a random multiple of 2^-9 in [-127, 127] 2^-9 */
{
	fill_rng = fill_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((int)((fill_rng >> 33) % 255) - 127) * Q8_SCALE;
}

void gb_llama_fill(struct model *m, uint64_t seed)
{
	const struct model_config *c = &m->cfg;
	const uint64_t L = c->n_layers, d = c->dim, kv = c->kv_dim,
	               hid = c->hidden_dim, V = c->vocab_size;
	struct {
		float *p;
		uint64_t n;
		int norm;
	} t[] = {
		{m->tok_emb, V * d, 0},  {m->rms_att, L * d, 1},
		{m->wq, L * d * d, 0},   {m->wk, L * kv * d, 0},
		{m->wv, L * kv * d, 0},  {m->wo, L * d * d, 0},
		{m->rms_ffn, L * d, 1},  {m->w1, L * hid * d, 0},
		{m->w2, L * d * hid, 0}, {m->w3, L * hid * d, 0},
		{m->rms_final, d, 1},
		{c->shared_classifier ? NULL : m->wcls, V * d, 0},
	};
	fill_rng = seed;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		for (uint64_t j = 0; t[i].p && j < t[i].n; j++)
			t[i].p[j] = (t[i].norm ? 1.0f : 0.0f) + q9();
}

void gb_tiny_llama(struct model *m, uint32_t seed)
{
	char err[256];
	struct model_config c = {
		.dim = 64, .hidden_dim = 128, .n_layers = 3, .n_heads = 4,
		.n_kv_heads = 2, .vocab_size = 300, .seq_len = 256,
		.shared_classifier = 1,
	};
	T_OK(model_alloc(m, &c, err, sizeof(err)));
	gb_llama_fill(m, seed);
	m->bos = -1;
}
