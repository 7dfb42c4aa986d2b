/*
 * tokenizer_test.c — the byte-level BPE tokenizer (engine/tokenizer.c) on
 * SmolLM2's vocabulary: ids equal to HF `tokenizers`' for texts, slices of
 * ../shared/models/bytes2m-valid.txt and ChatML prompts
 * (tests/fixtures/smollm2/tokenizer.txt, scripts/fixtures/
 * smollm2_tokenizer.py), decode round trips, special tokens, and invalid
 * UTF-8 refused.  Needs the model from `make models`; skips without it.
 * Run: build/bin/kvtrim-tests tokenizer
 */
#include <errno.h>

#include "gguf.h"
#include "model_files.h"
#include "test.h"
#include "tokenizer.h"

#define FIXTURE "tests/fixtures/smollm2/tokenizer.txt"

static struct tok *load_smollm2(void)
{
	char path[4200], err[KVT_ERRTEXT_MAX], why[KVT_ERRTEXT_MAX + 32];
	if (model_files_find(MODEL_FILES_SMOLLM2, path, sizeof(path), err,
	                sizeof(err)) < 0) {
		snprintf(why, sizeof(why), "%s", err);
		T_SKIP(why);
	}
	struct gguf *g = NULL;
	struct tok *t = NULL;
	if (gguf_open(path, &g, err, sizeof(err)) < 0 ||
	    tok_load(g, &t, err, sizeof(err)) < 0)
		th_fail(__FILE__, __LINE__, "%s", err);
	gguf_close(g); /* the tokenizer keeps copies */
	return t;
}

/* Decodes hex in place of a malloc'd buffer; returns its length. */
static size_t unhex(const char *h, char **out)
{
	size_t n = strlen(h) / 2;
	char *s = malloc(n + 1);
	T_ASSERT(s);
	for (size_t i = 0; i < n; i++) {
		char b[3] = {h[2 * i], h[2 * i + 1], 0};
		s[i] = (char)strtoul(b, NULL, 16);
	}
	s[n] = 0;
	*out = s;
	return n;
}

/* Compares got with the fixture's "ids <n> ..." line. */
static void expect_ids(const struct tok_ids *got, char *line, const char *what)
{
	char *save, *w = strtok_r(line, " \n", &save);
	T_ASSERT(w && !strcmp(w, "ids"));
	size_t n = strtoul(strtok_r(NULL, " \n", &save), NULL, 10);
	for (size_t i = 0; i < n; i++) {
		w = strtok_r(NULL, " \n", &save);
		T_ASSERT(w);
		long want = strtol(w, NULL, 10);
		if (i >= got->n || got->v[i] != want)
			th_fail(__FILE__, __LINE__, "%s: id %zu is %d, the "
			        "reference has %ld (%zu ids, reference %zu)",
			        what, i, i < got->n ? got->v[i] : -1, want,
			        got->n, n);
	}
	if (got->n != n)
		th_fail(__FILE__, __LINE__, "%s: %zu ids, the reference has %zu",
		        what, got->n, n);
}

static void roundtrip(const struct tok *t, const struct tok_ids *ids,
                      const char *text, size_t len)
{
	char *s, err[KVT_ERRTEXT_MAX];
	size_t n;
	T_OK(tok_decode(t, ids->v, ids->n, &s, &n, err, sizeof(err)));
	T_EQ(n, len);
	T_ASSERT(!memcmp(s, text, len));
	free(s);
}

/* Runs every record of kind of the fixture through fn. */
static int each_record(const char *kind,
                       void (*fn)(const struct tok *, char *rec, char *ids))
{
	struct tok *t = load_smollm2();
	FILE *f = fopen(FIXTURE, "r");
	if (!f)
		th_fail(__FILE__, __LINE__, "%s: %s (run from the repository "
		        "root)", FIXTURE, strerror(errno));
	static char rec[1 << 16], ids[1 << 16];
	int n = 0;
	size_t kl = strlen(kind);
	while (fgets(rec, sizeof(rec), f)) {
		if (strncmp(rec, kind, kl) || rec[kl] != ' ')
			continue;
		T_ASSERT(fgets(ids, sizeof(ids), f));
		rec[strcspn(rec, "\n")] = 0;
		fn(t, rec + kl + 1, ids);
		n++;
	}
	fclose(f);
	tok_free(t);
	return n;
}

static void check_text(const struct tok *t, char *rec, char *line)
{
	char *text, err[KVT_ERRTEXT_MAX];
	size_t len = unhex(rec, &text);
	struct tok_ids ids = {0};
	T_OK(tok_encode(t, text, len, TOK_SPECIAL, &ids, err, sizeof(err)));
	char what[64];
	snprintf(what, sizeof(what), "text \"%.30s\"", text);
	expect_ids(&ids, line, what);
	roundtrip(t, &ids, text, len);
	free(ids.v);
	free(text);
}

TEST_T(tokenizer, smollm2_texts_match_reference, 60)
{
	T_EQ(each_record("text", check_text), 11);
}

static void check_shared(const struct tok *t, char *rec, char *line)
{
	char path[512], err[KVT_ERRTEXT_MAX];
	unsigned long off, len, sum;
	T_EQ(sscanf(rec, "%511s %lu %lu %lu", path, &off, &len, &sum), 4);
	FILE *f = fopen(path, "rb");
	if (!f)
		T_SKIP("../shared/models/bytes2m-valid.txt not present");
	char *text = malloc(len);
	T_ASSERT(text);
	T_ASSERT(fseek(f, (long)off, SEEK_SET) == 0);
	T_EQ(fread(text, 1, len, f), len);
	fclose(f);
	unsigned long s = 0;
	for (unsigned long i = 0; i < len; i++)
		s += (uint8_t)text[i];
	T_EQ(s, sum); /* the same slice the reference saw */
	struct tok_ids ids = {0};
	T_OK(tok_encode(t, text, len, TOK_SPECIAL, &ids, err, sizeof(err)));
	expect_ids(&ids, line, path);
	roundtrip(t, &ids, text, len);
	free(ids.v);
	free(text);
}

TEST_T(tokenizer, smollm2_bytes2m_valid_matches_reference, 60)
{
	T_EQ(each_record("shared", check_shared), 2);
}

static void check_chat(const struct tok *t, char *rec, char *line)
{
	char *save, err[KVT_ERRTEXT_MAX];
	int gen = atoi(strtok_r(rec, " ", &save));
	size_t n = strtoul(strtok_r(NULL, " ", &save), NULL, 10);
	struct tok_msg msgs[8];
	char *bufs[16];
	T_ASSERT(n <= 8);
	for (size_t i = 0; i < n; i++) {
		unhex(strtok_r(NULL, " ", &save), &bufs[2 * i]);
		unhex(strtok_r(NULL, " ", &save), &bufs[2 * i + 1]);
		msgs[i] = (struct tok_msg){bufs[2 * i], bufs[2 * i + 1]};
	}
	struct tok_ids ids = {0};
	T_OK(tok_chat(t, msgs, n, gen, &ids, err, sizeof(err)));
	expect_ids(&ids, line, "chat");
	for (size_t i = 0; i < 2 * n; i++)
		free(bufs[i]);
	free(ids.v);
}

TEST_T(tokenizer, smollm2_chat_template_matches_reference, 60)
{
	T_EQ(each_record("chat", check_chat), 4);
}

TEST(tokenizer, smollm2_special_tokens_and_flags)
{
	struct tok *t = load_smollm2();
	char err[KVT_ERRTEXT_MAX];
	T_EQ(tok_vocab_size(t), 49152);
	T_EQ(tok_add_bos(t), 0);
	T_EQ(tok_eot(t), 2); /* <|im_end|> */
	T_EQ(tok_find(t, "<|im_start|>"), 1);
	T_EQ(tok_find(t, "<|endoftext|>"), 0);
	T_ASSERT(tok_is_special(t, 0) && tok_is_special(t, 2));
	T_ASSERT(!tok_is_special(t, 100));
	/* With TOK_SPECIAL the marker is one token; without it, text. */
	const char *m = "<|im_end|>";
	struct tok_ids a = {0}, b = {0};
	T_OK(tok_encode(t, m, strlen(m), TOK_SPECIAL, &a, err, sizeof(err)));
	T_EQ(a.n, 1);
	T_EQ(a.v[0], 2);
	T_OK(tok_encode(t, m, strlen(m), 0, &b, err, sizeof(err)));
	T_ASSERT(b.n > 1);
	for (size_t i = 0; i < b.n; i++)
		T_ASSERT(!tok_is_special(t, b.v[i]));
	roundtrip(t, &b, m, strlen(m));
	/* A chat content holding the marker cannot end its turn: exactly
	 * one <|im_end|> per message. */
	struct tok_msg msg = {"user", "hi<|im_end|>there"};
	struct tok_ids c = {0};
	T_OK(tok_chat(t, &msg, 1, 0, &c, err, sizeof(err)));
	int ends = 0;
	for (size_t i = 0; i < c.n; i++)
		ends += c.v[i] == 2;
	T_EQ(ends, 2); /* the default system turn and the user's */
	/* Ids outside the vocabulary do not decode. */
	int32_t bad[2] = {5, 49152};
	char *s = NULL;
	size_t n;
	T_ERR(tok_decode(t, bad, 2, &s, &n, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "49152") && s == NULL);
	T_ASSERT(tok_token_bytes(t, -1, &n) == NULL);
	free(a.v);
	free(b.v);
	free(c.v);
	tok_free(t);
}

TEST(tokenizer, invalid_utf8_refused)
{
	struct tok *t = load_smollm2();
	char err[KVT_ERRTEXT_MAX];
	static const struct {
		const char *s;
		size_t len, at;
	} bad[] = {
		{"ok\x80", 3, 2},           /* lone continuation byte */
		{"ab\xe2\x82", 4, 2},       /* truncated 3-byte sequence */
		{"\xc0\xaf", 2, 0},         /* overlong '/' */
		{"x\xe0\x80\xaf", 4, 1},    /* overlong, 3 bytes */
		{"\xed\xa0\x80", 3, 0},     /* UTF-16 surrogate */
		{"\xf4\x90\x80\x80", 4, 0}, /* beyond U+10FFFF */
		{"\xf8\x88\x80\x80\x80", 5, 0}, /* 5-byte form */
		{"\xff", 1, 0},
		{"caf\xc3", 4, 3},          /* cut inside a character */
	};
	struct tok_ids ids = {0};
	T_OK(tok_encode(t, "keep", 4, 0, &ids, err, sizeof(err)));
	size_t n0 = ids.n;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[64];
		T_ERR(tok_encode(t, bad[i].s, bad[i].len, TOK_SPECIAL, &ids, err,
		                 sizeof(err)), KVT_EINVAL);
		snprintf(want, sizeof(want), "invalid UTF-8 at byte %zu",
		         bad[i].at);
		if (!strstr(err, want))
			th_fail(__FILE__, __LINE__, "case %zu: \"%s\"", i, err);
		T_EQ(ids.n, n0); /* nothing appended */
	}
	/* Valid UTF-8 with a byte the vocabulary has no token for: refused,
	 * not dropped as the reference does. */
	T_ERR(tok_encode(t, "a\x04" "b", 3, 0, &ids, err, sizeof(err)),
	      KVT_EINVAL);
	T_ASSERT(strstr(err, "byte 0x04 at 1 has no token"));
	T_EQ(ids.n, n0);
	struct tok_msg msgs[2] = {{"user", "fine"}, {"user", "bad \xc3("}};
	T_ERR(tok_chat(t, msgs, 2, 1, &ids, err, sizeof(err)), KVT_EINVAL);
	T_ASSERT(strstr(err, "message 1 content"));
	T_EQ(ids.n, n0);
	/* Valid edge cases: NUL, U+FFFF, U+10FFFF, 4-byte emoji. */
	const char ok[] = "a\0b\xef\xbf\xbf\xf4\x8f\xbf\xbf\xf0\x9f\x99\x82";
	T_OK(tok_encode(t, ok, sizeof(ok) - 1, 0, &ids, err, sizeof(err)));
	struct tok_ids tail = {ids.v + n0, ids.n - n0, 0};
	roundtrip(t, &tail, ok, sizeof(ok) - 1);
	free(ids.v);
	tok_free(t);
}
