/*
 * tokenizer.h — the byte-level BPE tokenizer of GGUF models whose
 * tokenizer.ggml.model is "gpt2" and pre-tokenizer "smollm" (SmolLM2):
 * encode, decode, special tokens and the ChatML chat template.  Tested in
 * engine/tokenizer_test.c (`kvtrim-tests tokenizer`) against ids from
 * HF `tokenizers` (tests/fixtures/smollm2/tokenizer.txt).
 *
 * Encoding follows the model's tokenizer.json (steps: docs/engine.md,
 * "Tokenizer"); no BOS is prepended.  Text that is not valid UTF-8, or
 * holds a byte the vocabulary has no token for, is refused with
 * KVT_EINVAL and the byte offset, and nothing is appended.
 */
#ifndef KVT_ENGINE_TOKENIZER_H
#define KVT_ENGINE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf;
struct tok;

/* A growing list of token ids (free with free(ids.v)). */
struct tok_ids {
	int32_t *v; /* [n] */
	size_t n, cap;
};

/* A chat message: role ("system", "user", "assistant") and content, both
 * NUL-terminated UTF-8. */
struct tok_msg {
	const char *role;
	const char *content;
};

/* tok_encode flags */
#define TOK_SPECIAL 1u /* match special-token strings in the text */

/*
 * Builds the tokenizer from g's metadata (tokenizer.ggml.tokens, merges,
 * token_type, pre, the ids and tokenizer.chat_template); copies what it
 * keeps, so g may be closed afterwards.  KVT_ENOTSUP for another tokenizer
 * model or pre-tokenizer, KVT_EINVAL for inconsistent metadata (a merge of
 * tokens not in the vocabulary, a byte without a token, ...).
 */
int tok_load(const struct gguf *g, struct tok **out, char *err,
             size_t errlen);
void tok_free(struct tok *t);

uint32_t tok_vocab_size(const struct tok *t);
int tok_add_bos(const struct tok *t);  /* tokenizer.ggml.add_bos_token */
int32_t tok_bos(const struct tok *t);  /* tokenizer.ggml.bos_token_id */
int32_t tok_eot(const struct tok *t);  /* end of turn: <|im_end|>, else eos */
int tok_is_special(const struct tok *t, int32_t id);
/* The id of the token whose text is exactly s, or -1. */
int32_t tok_find(const struct tok *t, const char *s);

/* Appends the ids of text[len] to out.  KVT_EINVAL (invalid UTF-8, with
 * the byte offset), KVT_ENOMEM. */
int tok_encode(const struct tok *t, const char *text, size_t len,
               unsigned flags, struct tok_ids *out, char *err,
               size_t errlen);

/* The bytes token id decodes to (len in *len; not NUL-terminated; a
 * special token decodes to its text), or NULL for an id out of range.
 * One token may hold part of a UTF-8 sequence: stream bytes, not tokens. */
const char *tok_token_bytes(const struct tok *t, int32_t id, size_t *len);

/* Decodes ids[n] into a malloc'd NUL-terminated string *out (*len bytes).
 * KVT_EINVAL for an id out of range. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n, char **out,
               size_t *len, char *err, size_t errlen);

/*
 * Appends the ids of the model's ChatML template applied to msgs[n]:
 *   (a default system message when msgs[0] is not one and the template
 *    has one) then per message <|im_start|> role "\n" content <|im_end|>
 *   "\n", then <|im_start|> "assistant\n" when add_generation_prompt.
 * Roles and contents are encoded as text: a "<|im_end|>" written inside a
 * content stays text, it cannot end the turn.  KVT_ENOTSUP when the
 * model's template is not ChatML; KVT_EINVAL for invalid UTF-8.
 */
int tok_chat(const struct tok *t, const struct tok_msg *msgs, size_t n,
             int add_generation_prompt, struct tok_ids *out, char *err,
             size_t errlen);

#endif
