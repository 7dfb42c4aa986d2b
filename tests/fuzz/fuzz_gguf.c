/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (engine/gguf.h) and
 * the tokenizer built from its metadata (engine/tokenizer.h).
 *
 * The input is one GGUF file, opened from memory.  A file that opens is
 * walked completely: every metadata value (arrays item by item), every
 * tensor's first and last elements dequantised where the type allows, the
 * llama check, and, where a tokenizer loads from it, an encode of a fixed
 * text (with special tokens) and a decode of what came out.  The reader
 * promises to validate everything at open (gguf.h), so nothing past a
 * successful open may fault, whatever the bytes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MUST(c)                                                                \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "fuzz_gguf: %s:%d: %s\n", __FILE__,    \
			        __LINE__, #c);                                 \
			abort();                                               \
		}                                                              \
	} while (0)

/* Touches every byte of a value so ASan sees any read out of the map. */
static unsigned walk_value(const struct gguf_value *v, int depth)
{
	unsigned h = (unsigned)v->type;
	MUST(depth <= GGUF_MAX_DEPTH);
	switch (v->type) {
	case GGUF_TYPE_STRING:
		for (uint64_t i = 0; i < v->v.s.len; i++)
			h = h * 31 + (unsigned char)v->v.s.p[i];
		break;
	case GGUF_TYPE_ARRAY:
		for (uint64_t i = 0; i < v->v.arr.n && i < 4096; i++) {
			struct gguf_value it;
			MUST(gguf_arr_item(v, i, &it) == 0);
			h += walk_value(&it, depth + 1);
		}
		break;
	default:
		h += (unsigned)v->v.u;
	}
	return h;
}

static void walk_tensors(const struct gguf *g)
{
	char err[256];
	float buf[64];
	for (size_t i = 0; i < gguf_tensor_count(g); i++) {
		const struct gguf_tensor *t = gguf_tensor_at(g, i);
		MUST(t);
		if (!gguf_can_dequant(t->type))
			continue;
		uint64_t n = t->n_elem, k = n < 64 ? n : 64;
		if (!k)
			continue;
		MUST(gguf_dequant(t, 0, k, buf, err, sizeof(err)) == 0);
		MUST(gguf_dequant(t, n - k, k, buf, err, sizeof(err)) == 0);
		MUST(gguf_dequant(t, n, 1, buf, err, sizeof(err)) < 0);
	}
}

static void walk_tokenizer(const struct gguf *g)
{
	static const char text[] = "<|im_start|>user\nHi 2024, caf\xc3\xa9!"
	                           "<|im_end|>\n  end";
	char err[256];
	struct tok *t;
	if (tok_load(g, &t, err, sizeof(err)) < 0)
		return;
	struct tok_ids ids = {0};
	if (tok_encode(t, text, sizeof(text) - 1, TOK_SPECIAL, &ids, err,
	               sizeof(err)) == 0) {
		char *out = NULL;
		size_t len = 0;
		if (tok_decode(t, ids.v, ids.n, &out, &len, err,
		               sizeof(err)) == 0)
			MUST(out && strlen(out) <= len);
		free(out);
	}
	free(ids.v);
	tok_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	struct gguf *g;
	if (gguf_open_mem(data, size, &g, err, sizeof(err)) < 0) {
		MUST(err[0]);
		return 0;
	}
	unsigned h = 0;
	for (size_t i = 0; i < gguf_kv_count(g); i++)
		h += walk_value(&gguf_kv_at(g, i)->val, 0);
	walk_tensors(g);
	struct gguf_llama hp;
	(void)gguf_llama_check(g, &hp, err, sizeof(err));
	walk_tokenizer(g);
	gguf_close(g);
	return (int)(h & 0);
}
