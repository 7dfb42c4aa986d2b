/*
 * gb.h — the GGUF builder of the tests: a growing byte buffer that tests
 * write GGUF files into, field by field (gb_hdr, gb_kv_*, gb_tinfo, ...),
 * and a whole llama-architecture file from the weights of a struct model
 * (gb_llama), optionally with a byte-level tokenizer and a ChatML
 * template, in F32, F16 or Q8_0.  Shared by engine/gguf_test.c,
 * engine/model_test.c and tests/integration/test_engine_gguf.c, so the
 * files the engine's loaders are tested on are written by code independent
 * of them.
 * Allocation failures end the test (T_ASSERT).
 */
#ifndef KVT_TH_GB_H
#define KVT_TH_GB_H

#include <stddef.h>
#include <stdint.h>

struct model;

/* A growing byte buffer (zero-initialise it; free with gb_free). */
struct gb {
	uint8_t *p;
	size_t len, cap;
};

void gb_put(struct gb *b, const void *d, size_t n);
void gb_u8(struct gb *b, uint8_t v);
void gb_u16(struct gb *b, uint16_t v);
void gb_u32(struct gb *b, uint32_t v);
void gb_u64(struct gb *b, uint64_t v);
void gb_f32(struct gb *b, float v);
/* A GGUF string: u64 length, bytes. */
void gb_str(struct gb *b, const char *s);
/* "GGUF", version, tensor count, key count. */
void gb_hdr(struct gb *b, uint32_t version, uint64_t n_t, uint64_t n_kv);
/* A key and its value type (the value follows). */
void gb_key(struct gb *b, const char *key, uint32_t type);
void gb_kv_u32(struct gb *b, const char *key, uint32_t v);
void gb_kv_f32(struct gb *b, const char *key, float v);
void gb_kv_bool(struct gb *b, const char *key, int v);
void gb_kv_str(struct gb *b, const char *key, const char *v);
/* A tensor info: name, n_dims, ne[n_dims], ggml type, data offset. */
void gb_tinfo(struct gb *b, const char *name, uint32_t n_dims,
              const uint64_t *ne, uint32_t type, uint64_t off);
/* Zero bytes up to a multiple of align. */
void gb_pad(struct gb *b, size_t align);
/* Puts n bytes of d at offset off of b (zero-filling any gap). */
void gb_at(struct gb *b, size_t off, const void *d, size_t n);
void gb_free(struct gb *b);
/* Writes the bytes to path. */
void gb_write(const struct gb *b, const char *path);

/* ---------------------------------------------------------------- llama */

/* Vocabulary of the gb_llama tokenizer: token i < 256 is byte i (GPT-2's
 * byte characters), then <|im_start|> and <|im_end|>. */
#define GB_TOK_VOCAB 258
#define GB_TOK_IM_START 256
#define GB_TOK_IM_END 257

struct gb_llama_opts {
	uint32_t type;       /* 2-D weights as GGUF_GGML_F32 (0), F16 or Q8_0
	                        (whose blocks get the scale 2^-9: fill the
	                        model with gb_llama_fill so it is exact) */
	float rope_theta;    /* llama.rope.freq_base; 0: the model's */
	uint32_t context;    /* llama.context_length; 0: m's seq_len */
	int tokenizer;       /* the byte tokenizer above and a ChatML
	                        template (m's vocab must be GB_TOK_VOCAB) */
	int add_bos;         /* tokenizer.ggml.add_bos_token true, bos id
	                        bos_id */
	uint32_t bos_id;
	const char *scaling; /* llama.rope.scaling.type, or NULL: none */
	const char *retype;  /* this tensor's type is retype_to (zero data
	                        of that type's size) */
	uint32_t retype_to;
	const char *reshape; /* this tensor's ne[1] is one more (zero data) */
	const char *poison;  /* this F32 tensor's first value is NaN */
};

/*
 * Writes a llama GGUF file holding m's weights (q and k rows as they are:
 * the layout a llama.cpp conversion stores) into b: token_embd,
 * output_norm, output unless m's classifier is shared, and per layer
 * attn_norm, attn_q/k/v, attn_output, ffn_norm, ffn_gate (w1), ffn_down
 * (w2), ffn_up (w3).  Norms are F32.
 */
void gb_llama(struct gb *b, const struct model *m,
              const struct gb_llama_opts *o);

/* Fills m's weights with random multiples of 2^-9 in [-127, 127] 2^-9
 * (exact in F16 and in Q8_0 with scale 2^-9), norms with 1 + such a
 * value, from seed. */
void gb_llama_fill(struct model *m, uint64_t seed);

/*
 * A tiny GGUF-like llama (dim 64, 3 layers, 4 heads over 2 KV heads,
 * vocab 300, seq_len 256, shared classifier, no BOS: like SmolLM2, its
 * KVzip pretext is ctx sep ctx), weights from gb_llama_fill(seed).  For
 * the eval tests, unit and integration.
 */
void gb_tiny_llama(struct model *m, uint32_t seed);

#endif
