/*
 * tokenizer.h — the byte-level BPE tokenizer of GGUF models whose
 * tokenizer.ggml.model is "gpt2" and pre-tokenizer "smollm" (SmolLM2):
 * encode, decode, special tokens and the ChatML chat template.  Tested in
 * tests/unit/test_tokenizer.c (`kvtrim-tests tokenizer`) against ids from
 * HF `tokenizers` (tests/fixtures/smollm2/tokenizer.txt).
 *
 * Encoding, as the original model's tokenizer.json does it:
 *   1. special tokens (token_type CONTROL or USER_DEFINED, e.g.
 *      <|im_start|>) are cut out of the text first, when asked for;
 *   2. every Unicode number (\p{N}) becomes a piece of its own (the
 *      Digits pre-tokenizer, individual_digits);
 *   3. the rest is split by the GPT-2 pattern
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      with no prefix space added;
 *   4. each piece's bytes map to GPT-2's byte characters and are merged
 *      by BPE, lowest merge rank first, leftmost first among equals.
 * No BOS is prepended (tokenizer.ggml.add_bos_token is false for SmolLM2);
 * tok_add_bos() reports the flag for models where it is true.
 *
 * Text must be valid UTF-8 (no overlong forms, surrogates or code points
 * beyond U+10FFFF): anything else is refused with KVT_EINVAL and the byte
 * offset, and nothing is appended.  So is a byte the vocabulary has no
 * token for (SmolLM2 has none for 21 bytes, e.g. 0x04 and the lead bytes
 * 0xf1, 0xf2 of U+40000..U+BFFFF): HF tokenizers drops such bytes
 * silently, which would feed the model a text other than the one given.
 * Errors are KVT_E* codes with a reason.
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
