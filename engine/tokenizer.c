/*
 * tokenizer.c — byte-level BPE (GPT-2 / SmolLM2) from GGUF metadata; see
 * tokenizer.h.
 *
 * Two open-addressing hash tables: token text -> id, and the pair (left
 * id, right id) -> (merge rank, merged id), both built once at load.  BPE
 * over a piece keeps its symbols in a linked list and the candidate pairs
 * in a binary heap ordered by (rank, position), so a piece of n bytes
 * costs O(n log n) and a long run of one character cannot make encoding
 * quadratic.
 */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "gguf.h"
#include "kvtrim.h"
#include "unicode.h"

#define TOKTYPE_CONTROL 3
#define TOKTYPE_USER 4
#define MAX_SPECIALS 1024

struct tok {
	uint32_t n;           /* vocabulary size */
	char **text;          /* [n] token texts (byte characters), NUL-ended */
	uint32_t *text_len;   /* [n] bytes */
	char **bytes;         /* [n] decoded bytes */
	uint32_t *bytes_len;  /* [n] */
	uint8_t *special;     /* [n] 1 for CONTROL / USER_DEFINED */
	int32_t byte_tok[256]; /* id of the token of each single byte */
	/* text -> id: slots hold id + 1 (0 empty); cap a power of two */
	uint32_t *vocab_slot, vocab_cap;
	/* (left, right) -> rank, merged id */
	struct merge {
		uint64_t key; /* left << 32 | right, UINT64_MAX empty */
		uint32_t rank;
		int32_t id;
	} *merge_slot;
	uint32_t merge_cap;
	int32_t specials[MAX_SPECIALS]; /* special ids, longest text first */
	uint32_t n_specials;
	int add_bos;
	int32_t bos, eot, im_start;
	char *system_default; /* the template's default system prompt, or NULL */
	int chatml;           /* the template is ChatML */
};

/* GPT-2's byte characters: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes for U+0100 upwards in byte order. */
static uint32_t byte_char(uint8_t b)
{
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
		return b;
	uint32_t k = 0;
	for (uint32_t c = 0; c < b; c++)
		if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) ||
		      c >= 174))
			k++;
	return 256 + k;
}

/* ---------------------------------------------------------------- hashes */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h;
}

static uint64_t hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static uint32_t cap_for(uint32_t n)
{
	uint32_t c = 16;
	while (c < 2 * (uint64_t)n)
		c <<= 1;
	return c;
}

static int32_t vocab_get(const struct tok *t, const char *s, size_t n)
{
	uint32_t m = t->vocab_cap - 1;
	for (uint32_t i = (uint32_t)hash_bytes(s, n) & m;; i = (i + 1) & m) {
		uint32_t v = t->vocab_slot[i];
		if (!v)
			return -1;
		if (t->text_len[v - 1] == n && !memcmp(t->text[v - 1], s, n))
			return (int32_t)(v - 1);
	}
}

/* Inserts id unless its text is there already (the first id wins). */
static void vocab_put(struct tok *t, uint32_t id)
{
	uint32_t m = t->vocab_cap - 1;
	const char *s = t->text[id];
	size_t n = t->text_len[id];
	for (uint32_t i = (uint32_t)hash_bytes(s, n) & m;; i = (i + 1) & m) {
		uint32_t v = t->vocab_slot[i];
		if (!v) {
			t->vocab_slot[i] = id + 1;
			return;
		}
		if (t->text_len[v - 1] == n && !memcmp(t->text[v - 1], s, n))
			return;
	}
}

static const struct merge *merge_get(const struct tok *t, int32_t l,
                                     int32_t r)
{
	uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
	uint32_t m = t->merge_cap - 1;
	for (uint32_t i = (uint32_t)hash_u64(key) & m;; i = (i + 1) & m) {
		const struct merge *e = &t->merge_slot[i];
		if (e->key == UINT64_MAX)
			return NULL;
		if (e->key == key)
			return e;
	}
}

/* Inserts a merge unless the pair has one (the lower rank wins). */
static void merge_put(struct tok *t, int32_t l, int32_t r, uint32_t rank,
                      int32_t id)
{
	uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
	uint32_t m = t->merge_cap - 1;
	for (uint32_t i = (uint32_t)hash_u64(key) & m;; i = (i + 1) & m) {
		struct merge *e = &t->merge_slot[i];
		if (e->key == key)
			return;
		if (e->key == UINT64_MAX) {
			*e = (struct merge){key, rank, id};
			return;
		}
	}
}

/* ---------------------------------------------------------------- load */

static char *dup_n(const char *s, size_t n)
{
	char *p = malloc(n + 1);
	if (p) {
		memcpy(p, s, n);
		p[n] = 0;
	}
	return p;
}

/* The bytes a normal token stands for: each byte character back to its
 * byte; a character that is not one is kept as UTF-8. */
static int decode_text(struct tok *t, uint32_t id, const int *rev)
{
	const uint8_t *s = (const uint8_t *)t->text[id];
	size_t n = t->text_len[id], o = 0;
	char *out = malloc(n + 1);
	if (!out)
		return KVT_ENOMEM;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t k = unicode_utf8_at(s, n, i, &cp);
		if (!k) { /* not UTF-8: keep the byte */
			out[o++] = (char)s[i++];
			continue;
		}
		if (!t->special[id] && cp < 512 && rev[cp] >= 0)
			out[o++] = (char)rev[cp];
		else
			memcpy(out + o, s + i, k), o += k;
		i += k;
	}
	out[o] = 0;
	t->bytes[id] = out;
	t->bytes_len[id] = (uint32_t)o;
	return 0;
}

static int load_tokens(struct tok *t, const struct gguf *g, char *err,
                       size_t errlen)
{
	const struct gguf_value *toks, *types = NULL;
	int rc = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING,
	                      &toks, err, errlen);
	if (rc < 0)
		return rc;
	if (toks->v.arr.n == 0 || toks->v.arr.n > INT32_MAX)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "tokenizer.ggml.tokens has %llu entries",
		                  (unsigned long long)toks->v.arr.n);
	t->n = (uint32_t)toks->v.arr.n;
	if (gguf_find(g, "tokenizer.ggml.token_type")) {
		if ((rc = gguf_get_arr(g, "tokenizer.ggml.token_type",
		                       GGUF_TYPE_INT32, &types, err, errlen)) < 0)
			return rc;
		if (types->v.arr.n != t->n)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "tokenizer.ggml.token_type has %llu "
			                  "entries for %u tokens",
			                  (unsigned long long)types->v.arr.n,
			                  t->n);
	}
	t->text = calloc(t->n, sizeof(*t->text));
	t->text_len = calloc(t->n, sizeof(*t->text_len));
	t->bytes = calloc(t->n, sizeof(*t->bytes));
	t->bytes_len = calloc(t->n, sizeof(*t->bytes_len));
	t->special = calloc(t->n, 1);
	t->vocab_cap = cap_for(t->n);
	t->vocab_slot = calloc(t->vocab_cap, sizeof(*t->vocab_slot));
	if (!t->text || !t->text_len || !t->bytes || !t->bytes_len ||
	    !t->special || !t->vocab_slot)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory for %u "
		                  "tokens", t->n);
	for (uint32_t i = 0; i < t->n; i++) {
		struct gguf_value v;
		gguf_arr_item(toks, i, &v);
		if (v.v.s.len == 0 || v.v.s.len > 4096)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "token %u has %llu bytes", i,
			                  (unsigned long long)v.v.s.len);
		if (!(t->text[i] = dup_n(v.v.s.p, v.v.s.len)))
			return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
		t->text_len[i] = (uint32_t)v.v.s.len;
		if (types) {
			gguf_arr_item(types, i, &v);
			t->special[i] = v.v.i == TOKTYPE_CONTROL ||
			                v.v.i == TOKTYPE_USER;
		}
		vocab_put(t, i);
	}
	return 0;
}

static int load_bytes(struct tok *t, char *err, size_t errlen)
{
	int rev[512], n_bytes = 0;
	for (int i = 0; i < 512; i++)
		rev[i] = -1;
	for (int b = 0; b < 256; b++) {
		char s[4];
		uint32_t c = byte_char((uint8_t)b);
		size_t k = unicode_utf8_put(c, s);
		rev[c] = b;
		/* SmolLM2 lacks 21 bytes (control characters and bytes no
		 * valid UTF-8 of its planes holds); tok_encode refuses them. */
		t->byte_tok[b] = vocab_get(t, s, k);
		n_bytes += t->byte_tok[b] >= 0;
	}
	if (n_bytes < 128)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "not a byte-level vocabulary: only %d of the "
		                  "256 byte characters are tokens", n_bytes);
	for (uint32_t i = 0; i < t->n; i++)
		if (decode_text(t, i, rev) < 0)
			return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	return 0;
}

static int load_merges(struct tok *t, const struct gguf *g, char *err,
                       size_t errlen)
{
	const struct gguf_value *mg;
	int rc = gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_TYPE_STRING,
	                      &mg, err, errlen);
	if (rc < 0)
		return rc;
	if (mg->v.arr.n > INT32_MAX)
		return errors_fmt(err, errlen, KVT_EINVAL, "too many merges");
	uint32_t n = (uint32_t)mg->v.arr.n;
	t->merge_cap = cap_for(n);
	t->merge_slot = malloc((size_t)t->merge_cap * sizeof(*t->merge_slot));
	if (!t->merge_slot)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	for (uint32_t i = 0; i < t->merge_cap; i++)
		t->merge_slot[i].key = UINT64_MAX;
	char buf[8192 + 1];
	for (uint32_t i = 0; i < n; i++) {
		struct gguf_value v;
		gguf_arr_item(mg, i, &v);
		const char *sp = memchr(v.v.s.p, ' ', v.v.s.len);
		size_t ll = sp ? (size_t)(sp - v.v.s.p) : 0;
		size_t rl = sp ? v.v.s.len - ll - 1 : 0;
		int32_t l = sp ? vocab_get(t, v.v.s.p, ll) : -1;
		int32_t r = sp ? vocab_get(t, sp + 1, rl) : -1;
		int32_t m = -1;
		if (l >= 0 && r >= 0 && ll + rl < sizeof(buf)) {
			memcpy(buf, v.v.s.p, ll);
			memcpy(buf + ll, sp + 1, rl);
			m = vocab_get(t, buf, ll + rl);
		}
		if (m < 0)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "merge %u \"%.*s\" is not two tokens "
			                  "whose join is a token", i,
			                  (int)(v.v.s.len < 64 ? v.v.s.len : 64),
			                  v.v.s.p);
		merge_put(t, l, r, i, m);
	}
	return 0;
}

/* qsort has no context argument: the tokenizer being sorted is here. */
static __thread const struct tok *special_sort_t;

static int cmp_special(const void *a, const void *b)
{
	uint32_t x = special_sort_t->text_len[*(const int32_t *)a];
	uint32_t y = special_sort_t->text_len[*(const int32_t *)b];
	return (x < y) - (x > y); /* longest first */
}

static void load_specials(struct tok *t)
{
	for (uint32_t i = 0; i < t->n && t->n_specials < MAX_SPECIALS; i++)
		if (t->special[i])
			t->specials[t->n_specials++] = (int32_t)i;
	special_sort_t = t;
	qsort(t->specials, t->n_specials, sizeof(int32_t), cmp_special);
}

/* ChatML: the template frames turns with <|im_start|> / <|im_end|>; its
 * default system prompt is the literal after "<|im_start|>system\n" in the
 * branch taken when the first message is not a system one. */
static int load_template(struct tok *t, const struct gguf *g, char *err,
                         size_t errlen)
{
	const struct gguf_value *v = gguf_find(g, "tokenizer.chat_template");
	if (!v || v->type != GGUF_TYPE_STRING)
		return 0;
	char *tpl = dup_n(v->v.s.p, v->v.s.len);
	if (!tpl)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	t->chatml = strstr(tpl, "<|im_start|>") && strstr(tpl, "<|im_end|>") &&
	            t->im_start >= 0 && tok_find(t, "<|im_end|>") >= 0;
	const char *sys = "<|im_start|>system\n";
	char *a = strstr(tpl, sys), *b = a ? strstr(a, "<|im_end|>") : NULL;
	if (t->chatml && a && b && strstr(tpl, "!= 'system'")) {
		a += strlen(sys);
		t->system_default = dup_n(a, (size_t)(b - a));
	}
	free(tpl);
	return 0;
}

static int load_ids(struct tok *t, const struct gguf *g, char *err,
                    size_t errlen)
{
	uint32_t u;
	int rc;
	t->bos = -1;
	if (gguf_find(g, "tokenizer.ggml.bos_token_id")) {
		if ((rc = gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u,
		                       err, errlen)) < 0)
			return rc;
		t->bos = u < t->n ? (int32_t)u : -1;
	}
	if (gguf_find(g, "tokenizer.ggml.add_bos_token") &&
	    (rc = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos,
	                        err, errlen)) < 0)
		return rc;
	t->im_start = tok_find(t, "<|im_start|>");
	t->eot = tok_find(t, "<|im_end|>");
	if (t->eot < 0 && gguf_find(g, "tokenizer.ggml.eos_token_id")) {
		if ((rc = gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u,
		                       err, errlen)) < 0)
			return rc;
		t->eot = u < t->n ? (int32_t)u : -1;
	}
	return 0;
}

int tok_load(const struct gguf *g, struct tok **out, char *err,
             size_t errlen)
{
	struct gguf_str s;
	*out = NULL;
	int rc = gguf_get_str(g, "tokenizer.ggml.model", &s, err, errlen);
	if (rc < 0)
		return rc;
	if (!gguf_str_eq(s, "gpt2"))
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "tokenizer model \"%.*s\" is not supported "
		                  "(only gpt2 byte-level BPE)",
		                  (int)(s.len < 64 ? s.len : 64), s.p);
	if ((rc = gguf_get_str(g, "tokenizer.ggml.pre", &s, err, errlen)) < 0)
		return rc;
	if (!gguf_str_eq(s, "smollm"))
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "pre-tokenizer \"%.*s\" is not supported (only "
		                  "smollm)", (int)(s.len < 64 ? s.len : 64), s.p);
	struct tok *t = calloc(1, sizeof(*t));
	if (!t)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	if ((rc = load_tokens(t, g, err, errlen)) < 0 ||
	    (rc = load_bytes(t, err, errlen)) < 0 ||
	    (rc = load_merges(t, g, err, errlen)) < 0 ||
	    (rc = load_ids(t, g, err, errlen)) < 0 ||
	    (rc = load_template(t, g, err, errlen)) < 0) {
		tok_free(t);
		return rc;
	}
	load_specials(t);
	*out = t;
	return 0;
}

void tok_free(struct tok *t)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->n; i++) {
		if (t->text)
			free(t->text[i]);
		if (t->bytes)
			free(t->bytes[i]);
	}
	free(t->text);
	free(t->text_len);
	free(t->bytes);
	free(t->bytes_len);
	free(t->special);
	free(t->vocab_slot);
	free(t->merge_slot);
	free(t->system_default);
	free(t);
}

uint32_t tok_vocab_size(const struct tok *t) { return t->n; }
int tok_add_bos(const struct tok *t) { return t->add_bos; }
int32_t tok_bos(const struct tok *t) { return t->bos; }
int32_t tok_eot(const struct tok *t) { return t->eot; }

int tok_is_special(const struct tok *t, int32_t id)
{
	return id >= 0 && (uint32_t)id < t->n && t->special[id];
}

int32_t tok_find(const struct tok *t, const char *s)
{
	return vocab_get(t, s, strlen(s));
}

/* ---------------------------------------------------------------- encode */

static int ids_push(struct tok_ids *o, int32_t id)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? o->cap * 2 : 256;
		int32_t *v = realloc(o->v, cap * sizeof(*v));
		if (!v)
			return KVT_ENOMEM;
		o->v = v;
		o->cap = cap;
	}
	o->v[o->n++] = id;
	return 0;
}

/* Scratch of one encode call: symbols and the candidate heap of BPE. */
struct sym {
	int32_t id;
	int32_t prev, next; /* indices, -1 at the ends */
};

struct cand {
	uint32_t rank;
	int32_t pos; /* left symbol */
	int32_t l, r, id;
};

struct scratch {
	struct sym *sym;
	struct cand *heap;
	size_t cap, n_heap;
};

static int cand_less(const struct cand *a, const struct cand *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct scratch *s, struct cand c)
{
	size_t i = s->n_heap++;
	s->heap[i] = c;
	while (i && cand_less(&s->heap[i], &s->heap[(i - 1) / 2])) {
		struct cand x = s->heap[i];
		s->heap[i] = s->heap[(i - 1) / 2];
		s->heap[(i - 1) / 2] = x;
		i = (i - 1) / 2;
	}
}

static struct cand heap_pop(struct scratch *s)
{
	struct cand top = s->heap[0];
	s->heap[0] = s->heap[--s->n_heap];
	for (size_t i = 0;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < s->n_heap && cand_less(&s->heap[l], &s->heap[m]))
			m = l;
		if (r < s->n_heap && cand_less(&s->heap[r], &s->heap[m]))
			m = r;
		if (m == i)
			break;
		struct cand x = s->heap[i];
		s->heap[i] = s->heap[m];
		s->heap[m] = x;
		i = m;
	}
	return top;
}

/* Every merge removes a symbol and adds at most two candidates, so the
 * heap never holds more than 3n entries for n bytes. */
static int scratch_fit(struct scratch *s, size_t n)
{
	if (n <= s->cap)
		return 0;
	struct sym *sy = realloc(s->sym, n * sizeof(*sy));
	if (sy)
		s->sym = sy;
	struct cand *h = realloc(s->heap, 3 * n * sizeof(*h));
	if (h)
		s->heap = h;
	if (!sy || !h)
		return KVT_ENOMEM;
	s->cap = n;
	return 0;
}

static void try_pair(const struct tok *t, struct scratch *s, int32_t a)
{
	if (a < 0 || s->sym[a].next < 0)
		return;
	int32_t b = s->sym[a].next;
	const struct merge *m = merge_get(t, s->sym[a].id, s->sym[b].id);
	if (m)
		heap_push(s, (struct cand){m->rank, a, s->sym[a].id,
		                           s->sym[b].id, m->id});
}

/* BPE over the bytes p[n] of one piece; appends its ids. */
static int bpe(const struct tok *t, struct scratch *s, const uint8_t *p,
               size_t n, struct tok_ids *out)
{
	int rc = scratch_fit(s, n);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++)
		s->sym[i] = (struct sym){t->byte_tok[p[i]], (int32_t)i - 1,
		                         i + 1 < n ? (int32_t)i + 1 : -1};
	s->n_heap = 0;
	for (size_t i = 0; i + 1 < n; i++)
		try_pair(t, s, (int32_t)i);
	while (s->n_heap) {
		struct cand c = heap_pop(s);
		struct sym *a = &s->sym[c.pos];
		if (a->id != c.l || a->next < 0 || s->sym[a->next].id != c.r)
			continue; /* stale: one side was merged since */
		int32_t b = a->next;
		a->id = c.id;
		a->next = s->sym[b].next;
		if (a->next >= 0)
			s->sym[a->next].prev = c.pos;
		s->sym[b].id = -1;
		try_pair(t, s, a->prev);
		try_pair(t, s, c.pos);
	}
	for (int32_t i = 0; i >= 0 && n; i = s->sym[i].next)
		if ((rc = ids_push(out, s->sym[i].id)) < 0)
			return rc;
	return 0;
}

/* Length in code points of the GPT-2 pattern's match at c[i] (n > i). */
static size_t gpt2_match(const uint32_t *c, size_t n, size_t i)
{
	if (c[i] == '\'' && i + 1 < n) {
		uint32_t a = c[i + 1], b = i + 2 < n ? c[i + 2] : 0;
		if (a == 's' || a == 't' || a == 'm' || a == 'd')
			return 2;
		if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
		    (a == 'l' && b == 'l'))
			return 3;
	}
	size_t k = c[i] == ' ' ? i + 1 : i; /* " ?" */
	int (*cls[3])(uint32_t) = {unicode_is_letter, unicode_is_number,
	                           unicode_is_other};
	for (int q = 0; q < 3 && k < n; q++) {
		if (!cls[q](c[k]))
			continue;
		size_t e = k;
		while (e < n && cls[q](c[e]))
			e++;
		return e - i;
	}
	/* \s+(?!\S) then \s+: a run of spaces gives its last one to the
	 * word after it. */
	size_t e = i;
	while (e < n && unicode_is_space(c[e]))
		e++;
	if (e == i) /* unreachable: every code point is in one class */
		return 1;
	if (e == n || e - i == 1)
		return e - i;
	return e - i - 1;
}

struct text {
	const uint8_t *p;
	uint32_t *cp;  /* [n] code points */
	size_t *off;   /* [n + 1] byte offset of each */
	size_t n;
};

/* Splits cps [a, b) by the GPT-2 pattern and runs BPE on each piece. */
static int encode_run(const struct tok *t, struct scratch *s,
                      const struct text *x, size_t a, size_t b,
                      struct tok_ids *out)
{
	for (size_t i = a; i < b;) {
		size_t k = gpt2_match(x->cp + a, b - a, i - a);
		int rc = bpe(t, s, x->p + x->off[i], x->off[i + k] - x->off[i],
		             out);
		if (rc < 0)
			return rc;
		i += k;
	}
	return 0;
}

/* Plain text (no special tokens): digits one by one, the rest by runs. */
static int encode_plain(const struct tok *t, struct scratch *s,
                        const uint8_t *p, size_t len, struct tok_ids *out)
{
	struct text x = {p, malloc((len + 1) * sizeof(uint32_t)),
	                 malloc((len + 1) * sizeof(size_t)), 0};
	int rc = x.cp && x.off ? 0 : KVT_ENOMEM;
	for (size_t i = 0; rc == 0 && i < len;) {
		x.off[x.n] = i;
		/* The whole text is valid UTF-8 (tok_encode checks), but a
		 * special token's text may end inside a character, which
		 * leaves this piece starting or ending with part of one: such
		 * a byte is one code point of its own (U+FFFD's class), so the
		 * loop always advances and BPE still sees every byte. */
		size_t k = unicode_utf8_at(p, len, i, &x.cp[x.n]);
		if (!k) {
			x.cp[x.n] = 0xfffd;
			k = 1;
		}
		i += k;
		x.n++;
	}
	if (rc == 0)
		x.off[x.n] = len;
	size_t run = 0;
	for (size_t i = 0; rc == 0 && i <= x.n; i++) {
		if (i < x.n && !unicode_is_number(x.cp[i]))
			continue;
		rc = encode_run(t, s, &x, run, i, out);
		if (rc == 0 && i < x.n)
			rc = bpe(t, s, p + x.off[i], x.off[i + 1] - x.off[i], out);
		run = i + 1;
	}
	free(x.cp);
	free(x.off);
	return rc;
}

/* The special token whose text starts p[n], longest first, or -1. */
static int32_t special_at(const struct tok *t, const char *p, size_t n)
{
	for (uint32_t i = 0; i < t->n_specials; i++) {
		int32_t id = t->specials[i];
		uint32_t l = t->text_len[id];
		if (l <= n && !memcmp(p, t->text[id], l))
			return id;
	}
	return -1;
}

static int encode(const struct tok *t, const char *text, size_t len,
                  unsigned flags, struct tok_ids *out)
{
	struct scratch s = {0};
	const uint8_t *p = (const uint8_t *)text;
	size_t seg = 0;
	int rc = 0;
	for (size_t i = 0; rc == 0 && i < len;) {
		int32_t id = flags & TOK_SPECIAL ? special_at(t, text + i,
		                                              len - i) : -1;
		if (id < 0) {
			i++;
			continue;
		}
		rc = encode_plain(t, &s, p + seg, i - seg, out);
		if (rc == 0)
			rc = ids_push(out, id);
		i += t->text_len[id];
		seg = i;
	}
	if (rc == 0)
		rc = encode_plain(t, &s, p + seg, len - seg, out);
	free(s.sym);
	free(s.heap);
	return rc;
}

int tok_encode(const struct tok *t, const char *text, size_t len,
               unsigned flags, struct tok_ids *out, char *err, size_t errlen)
{
	int rc = unicode_utf8_check(text, len, err, errlen);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < len; i++)
		if (t->byte_tok[(uint8_t)text[i]] < 0)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "byte 0x%02x at %zu has no token in this "
			                  "vocabulary", (uint8_t)text[i], i);
	size_t n0 = out->n;
	rc = encode(t, text, len, flags, out);
	if (rc < 0) {
		out->n = n0; /* nothing appended on failure */
		return errors_fmt(err, errlen, rc, "no memory to encode %zu "
		                  "bytes", len);
	}
	return 0;
}

/* ---------------------------------------------------------------- decode */

const char *tok_token_bytes(const struct tok *t, int32_t id, size_t *len)
{
	if (id < 0 || (uint32_t)id >= t->n)
		return NULL;
	*len = t->bytes_len[id];
	return t->bytes[id];
}

int tok_decode(const struct tok *t, const int32_t *ids, size_t n, char **out,
               size_t *len, char *err, size_t errlen)
{
	size_t total = 0, l;
	*out = NULL;
	for (size_t i = 0; i < n; i++) {
		if (!tok_token_bytes(t, ids[i], &l))
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "token id %d at %zu outside the "
			                  "vocabulary of %u", ids[i], i, t->n);
		total += l;
	}
	char *s = malloc(total + 1);
	if (!s)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		const char *b = tok_token_bytes(t, ids[i], &l);
		memcpy(s + o, b, l);
		o += l;
	}
	s[o] = 0;
	*out = s;
	*len = o;
	return 0;
}

/* ---------------------------------------------------------------- chat */

static int chat_turn(const struct tok *t, const char *role,
                     const char *content, struct tok_ids *out, char *err,
                     size_t errlen)
{
	size_t rl = strlen(role), cl = strlen(content);
	char *body = malloc(rl + cl + 2);
	if (!body)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	memcpy(body, role, rl);
	body[rl] = '\n';
	memcpy(body + rl + 1, content, cl + 1);
	int rc = ids_push(out, t->im_start) < 0 ? KVT_ENOMEM : 0;
	if (rc == 0)
		rc = tok_encode(t, body, rl + cl + 1, 0, out, err, errlen);
	if (rc == 0 && ids_push(out, t->eot) < 0)
		rc = KVT_ENOMEM;
	if (rc == 0)
		rc = tok_encode(t, "\n", 1, 0, out, err, errlen);
	free(body);
	return rc == KVT_ENOMEM ? errors_fmt(err, errlen, rc, "no memory") : rc;
}

int tok_chat(const struct tok *t, const struct tok_msg *msgs, size_t n,
             int add_generation_prompt, struct tok_ids *out, char *err,
             size_t errlen)
{
	if (!t->chatml)
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "the model's chat template is not ChatML");
	size_t n0 = out->n;
	int rc = 0;
	/* Refuse invalid UTF-8 before anything is appended. */
	for (size_t i = 0; i < n; i++) {
		char why[KVT_ERRTEXT_MAX];
		if (unicode_utf8_check(msgs[i].role, strlen(msgs[i].role), why,
		               sizeof(why)) < 0)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "message %zu role: %s", i, why);
		if (unicode_utf8_check(msgs[i].content, strlen(msgs[i].content), why,
		               sizeof(why)) < 0)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "message %zu content: %s", i, why);
	}
	if (n && strcmp(msgs[0].role, "system") && t->system_default)
		rc = chat_turn(t, "system", t->system_default, out, err, errlen);
	for (size_t i = 0; rc == 0 && i < n; i++)
		rc = chat_turn(t, msgs[i].role, msgs[i].content, out, err,
		               errlen);
	if (rc == 0 && add_generation_prompt) {
		rc = ids_push(out, t->im_start) < 0
		         ? errors_fmt(err, errlen, KVT_ENOMEM, "no memory")
		         : tok_encode(t, "assistant\n", 10, 0, out, err, errlen);
	}
	if (rc < 0)
		out->n = n0;
	return rc;
}
