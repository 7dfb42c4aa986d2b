/*
 * task_case.c — the cases of protocol 1's tasks (tasks.h,
 * task_case_build): the needle's and the copy's chat prompts built
 * from the held-out evaluation text, of an exact length, with what a
 * right answer is.  The protocol they serve is in docs/eval.md.
 */
#include "tasks.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../train/dataset.h"
#include "tokenizer.h"

static const char needle_pre[] =
	"There is a pass key hidden inside a lot of irrelevant text. Find "
	"it and memorize it. I will quiz you about the pass key.\n\n";
static const char needle_q[] =
	"\n\nWhat is the pass key? Answer with the 5-digit number only.";
static const char copy_pre[] = "Here is a line of text:\n\n";
static const char copy_mid[] = "\n\nHere is a document:\n\n";
static const char copy_q[] =
	"\n\nRepeat the line of text given at the start, word for word. "
	"Output only that line.";

/* ------------------------------------------------------------ cases */

void task_case_free(struct task_case *c)
{
	free(c->tok);
	memset(c, 0, sizeof(*c));
}

/* The start of the line holding byte i (or i itself at a line start). */
static size_t next_line(const char *text, size_t n, size_t i)
{
	while (i > 0 && i < n && text[i - 1] != '\n')
		i++;
	return i;
}

/* A held-out line for the copy task at or after byte *at (bullet and
 * spaces stripped, 40..TASK_LINE_MAX printable ASCII bytes, four words
 * at least) into line; 0 when none was found from there. */
static int pick_line(const char *text, size_t n, size_t at, char *line)
{
	for (size_t s = next_line(text, n, at); s < n;) {
		size_t e = s;
		while (e < n && text[e] != '\n')
			e++;
		size_t a = s, b = e;
		while (a < b && (text[a] == ' ' || text[a] == '-' ||
		                 text[a] == '*'))
			a++;
		while (b > a && text[b - 1] == ' ')
			b--;
		int ok = b - a >= 40 && b - a <= TASK_LINE_MAX;
		uint32_t sp = 0;
		for (size_t i = a; ok && i < b; i++) {
			/* printable ASCII, no run of spaces (justified man
			 * page text, which a model retypes with single
			 * spaces) */
			ok = text[i] >= 0x20 && text[i] < 0x7f &&
			     !(text[i] == ' ' && text[i + 1] == ' ');
			sp += text[i] == ' ';
		}
		/* a sentence: capital first, full stop last */
		ok = ok && isupper((unsigned char)text[a]) && text[b - 1] == '.';
		if (ok && sp >= 3) {
			memcpy(line, text + a, b - a);
			line[b - a] = 0;
			return 1;
		}
		s = e + 1;
	}
	return 0;
}

/* Bytes of the first F tokens of text[s, n) (tokenized from s), cut back
 * to a character boundary; KVT_EINVAL when the text from s holds fewer. */
static int filler_bytes(const struct tok *t, const char *text, size_t n,
                        size_t s, uint32_t F, struct tok_ids *ids,
                        size_t *nb, char *err, size_t errlen)
{
	size_t chunk = (size_t)F * 6 + 64;
	for (;;) {
		size_t e = s + chunk < n ? s + chunk : n;
		while (e < n && text[e - 1] != '\n')
			e++;
		ids->n = 0;
		int rc = tok_encode(t, text + s, e - s, 0, ids, err, errlen);
		if (rc)
			return rc;
		if (ids->n >= F + 1) /* one more: the cut needs the next byte */
			break;
		if (e == n) {
			snprintf(err, errlen, "the evaluation text from byte "
			         "%zu holds %zu tokens, not %u", s, ids->n, F);
			return KVT_EINVAL;
		}
		chunk *= 2;
	}
	size_t b = 0;
	for (uint32_t i = 0; i < F; i++) {
		size_t bl = 0;
		(void)tok_token_bytes(t, ids->v[i], &bl);
		b += bl;
	}
	/* end at a character boundary (the text is byte-level BPE's) */
	while (b > 0 && ((unsigned char)text[s + b] & 0xc0) == 0x80)
		b--;
	*nb = b;
	return 0;
}

/* The user message of the case: kind's frame around filler[nb], the
 * needle line (key) at byte ib of the filler, or the line first. */
static char *message(enum task_kind kind, const char *fill, size_t nb,
                     size_t ib, const char *key, const char *line)
{
	size_t cap = nb + 512 + TASK_LINE_MAX;
	char *m = malloc(cap);
	if (!m)
		return NULL;
	if (kind == TASK_NEEDLE) {
		int sep = ib > 0 && fill[ib - 1] != '\n';
		snprintf(m, cap, "%s%.*s%sThe pass key is %s. Remember it. %s "
		         "is the pass key.\n%.*s%s", needle_pre, (int)ib, fill,
		         sep ? "\n" : "", key, key, (int)(nb - ib), fill + ib,
		         needle_q);
	} else {
		snprintf(m, cap, "%s%s%s%.*s%s", copy_pre, line, copy_mid,
		         (int)nb, fill, copy_q);
	}
	return m;
}

/* The prompt of one message through the chat template into ids. */
static int chat(const struct tok *t, const char *msg, struct tok_ids *ids,
                char *err, size_t errlen)
{
	struct tok_msg mm = {"user", msg};
	ids->n = 0;
	return tok_chat(t, &mm, 1, 1, ids, err, errlen);
}

/* Index of the first run of the key's digits in ids (single-digit
 * tokens), or UINT32_MAX. */
static uint32_t find_key(const struct tok *t, const struct tok_ids *ids,
                         const char *key)
{
	for (size_t i = 0; i + TASK_KEY_DIGITS <= ids->n; i++) {
		uint32_t k = 0;
		for (; k < TASK_KEY_DIGITS; k++) {
			size_t bl;
			const char *b = tok_token_bytes(t, ids->v[i + k], &bl);
			if (!b || bl != 1 || b[0] != key[k])
				break;
		}
		if (k == TASK_KEY_DIGITS)
			return (uint32_t)i;
	}
	return UINT32_MAX;
}

int task_case_build(const struct tok *t, const char *text, size_t n,
                       enum task_kind kind, uint32_t len, double depth,
                       uint64_t seed, struct task_case *c, char *err,
                       size_t errlen)
{
	memset(c, 0, sizeof(*c));
	c->kind = kind;
	c->depth = depth;
	uint64_t st = seed;
	struct tok_ids ids = {0}, fid = {0};
	char *msg = NULL;
	int rc = 0;
	if (kind == TASK_NEEDLE) {
		snprintf(c->key, sizeof(c->key), "%05u",
		         (unsigned)(10000 + dataset_rng(&st) % 90000));
	} else if (!pick_line(text, n, (size_t)(dataset_uniform(&st) * n),
	                      c->line) &&
	           !pick_line(text, n, 0, c->line)) {
		snprintf(err, errlen, "the evaluation text holds no line for "
		         "the copy task");
		return KVT_EINVAL;
	}
	/* the frame's tokens: the filler gets the rest of len */
	if (!(msg = message(kind, "", 0, 0, c->key, c->line)))
		return KVT_ENOMEM;
	rc = chat(t, msg, &ids, err, errlen);
	free(msg);
	msg = NULL;
	if (!rc && ids.n + 8 > len) {
		snprintf(err, errlen, "a %s prompt needs %zu tokens around the "
		         "filler, more than %u", kind == TASK_NEEDLE ? "needle" : "copy", ids.n + 8, len);
		rc = KVT_EINVAL;
	}
	const uint32_t F0 = len - (uint32_t)ids.n;
	uint32_t F = F0;
	size_t s = 0, nb = 0;
	/* filler starts until one gives a prompt of len tokens exactly */
	for (int attempt = 0; !rc && attempt < 8; attempt++) {
		F = F0;
		for (int tries = 0; !rc; tries++) {
			/* the filler's start: a seeded line start leaving room */
			size_t room = (size_t)F * 8;
			s = next_line(text, n,
			              (size_t)(dataset_uniform(&st) *
			                       (n > room ? n - room : 0)));
			rc = filler_bytes(t, text, n, s, F, &fid, &nb, err,
			                  errlen);
			if (rc || kind == TASK_NEEDLE)
				break;
			/* the copy's line must not be in its filler */
			char *f = strndup(text + s, nb);
			if (!f) {
				rc = KVT_ENOMEM;
				break;
			}
			int seen = strstr(f, c->line) != NULL;
			free(f);
			if (!seen)
				break;
			if (tries == 20) {
				snprintf(err, errlen, "no filler without "
				         "the line");
				rc = KVT_EINVAL;
			}
		}
		/* passes: each corrects F by what the one before
		 * missed, so that the prompt has len tokens exactly (the
		 * ratio budgets are then exact: floor(R len) of len) */
		for (int pass = 0; !rc && pass < 6; pass++) {
			if (pass) {
				F += len - (uint32_t)ids.n;
				if ((rc = filler_bytes(t, text, n, s, F, &fid,
				                       &nb, err, errlen)))
					break;
			}
			size_t ib = 0;
			if (kind == TASK_NEEDLE) {
				uint32_t at = (uint32_t)floor(depth * F);
				for (uint32_t i = 0; i < at && i < fid.n; i++) {
					size_t bl = 0;
					(void)tok_token_bytes(t, fid.v[i],
					                      &bl);
					ib += bl;
				}
				ib = ib < nb ? next_line(text + s, nb, ib)
				             : nb;
			}
			msg = message(kind, text + s, nb, ib, c->key,
			              c->line);
			if (!msg) {
				rc = KVT_ENOMEM;
				break;
			}
			rc = chat(t, msg, &ids, err, errlen);
			free(msg);
			msg = NULL;
			if (ids.n == len)
				break;
		}
		if (ids.n == len)
			break;
	}
	struct tok_ids ans = {0};
	if (!rc && kind == TASK_COPY)
		rc = tok_encode(t, c->line, strlen(c->line), 0, &ans, err,
		                errlen);
	if (!rc) {
		c->P = (uint32_t)ids.n;
		c->nans = (uint32_t)ans.n;
		c->tok = malloc(sizeof(int32_t) * (c->P + c->nans));
		if (!c->tok)
			rc = KVT_ENOMEM;
	}
	if (!rc) {
		memcpy(c->tok, ids.v, sizeof(int32_t) * c->P);
		if (c->nans)
			memcpy(c->tok + c->P, ans.v, sizeof(int32_t) * c->nans);
		if (kind == TASK_NEEDLE &&
		    (c->key_tok = find_key(t, &ids, c->key)) == UINT32_MAX) {
			snprintf(err, errlen, "the key %s is not in its prompt's "
			         "tokens", c->key);
			rc = KVT_EPROTO;
		}
	}
	free(ids.v);
	free(fid.v);
	free(ans.v);
	if (rc)
		task_case_free(c);
	return rc;
}
