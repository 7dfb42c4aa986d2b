/*
 * needle_test.c — the decoding-time needle of kvtrim-eval's protocol 2
 * (tools/eval/decoding/needle.c and lockstep.c's answer scoring, decoding.h)
 * against independent values: on a tiny random model, a job that keeps
 * every entry (the hindsight oracle at ratio 0, in process: no daemon)
 * scored right on answers that are the dense forward's greedy tokens, wrong
 * where one scored token is not, and nothing scored past an answer's end;
 * with SmolLM2's tokenizer (skipped without the model: `make models`), the
 * case builder checked by decoding its ids: the key sentence whole in the
 * prefill, the question last, exact lengths, the same case for the same
 * seed.  The task through a real kvtrimd: tests/integration/
 * test_eval_decoding.c.
 */
#include <stdlib.h>
#include <string.h>

#include "decoding.h"
#include "../../train/dataset.h"
#include "../context/tasks.h"
#include "daemon.h"
#include "gb.h"
#include "model.h"
#include "model_files.h"
#include "model_gguf.h"
#include "test.h"
#include "tokenizer.h"

#define NW 2u
#define NP 8u
#define NLEN 20u
#define NA 4u
#define NT (NLEN + NA)

static int32_t argmax(const float *v, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (v[i] > v[b])
			b = i;
	return (int32_t)b;
}

/* Window w's prompt (NLEN seeded tokens), then NA greedy tokens of the
 * dense forward, each from the prompt and the greedy tokens before it. */
static void greedy_window(const struct model *m, int32_t *tok, uint32_t w)
{
	const uint32_t V = m->cfg.vocab_size;
	for (uint32_t i = 0; i < NLEN; i++)
		tok[i] = (int32_t)((i * 37u + w * 11u + (i * i) % 13u) % 300u);
	float *lg = malloc(sizeof(float) * NT * V);
	T_ASSERT(lg);
	for (uint32_t i = 0; i < NA; i++) {
		T_OK(model_dense_forward(m, tok, NLEN + i, lg));
		tok[NLEN + i] = argmax(lg + (size_t)(NLEN + i - 1) * V, V);
	}
	free(lg);
}

static int run(const struct model *m, const int32_t *tok,
               const uint32_t *nans, uint8_t *right, struct job *j)
{
	memset(j, 0, sizeof(*j));
	snprintf(j->name, sizeof(j->name), "oracle");
	snprintf(j->spec[C_MAIN], sizeof(j->spec[C_MAIN]), "oracle:ratio=0");
	j->kind = J_ORACLE;
	memset(right, 1, NW);
	struct decoding_set s = {
		.M = m, .tok = tok, .nwin = NW, .P = NP, .T = NT, .rt = "",
		.threads = 1, .ans0 = NLEN, .nans = nans, .right = right,
	};
	return decoding_run(&s, j, 1);
}

TEST_T(eval_needle, answer_right_at_every_argmax, 60)
{
	struct model m;
	gb_tiny_llama(&m, 7);
	int32_t tok[NW * NT];
	for (uint32_t w = 0; w < NW; w++)
		greedy_window(&m, tok + w * NT, w);
	uint8_t right[NW];
	struct job j;
	uint32_t nans[NW] = {NA, NA};
	/* every entry kept: the dense forward's greedy answer */
	T_OK(run(&m, tok, nans, right, &j));
	T_ASSERT(!j.failed && right[0] == 1 && right[1] == 1);
	/* window 1's last answer token not the greedy one: wrong there, not
	 * in window 0 */
	tok[NT + NLEN + NA - 1] = (tok[NT + NLEN + NA - 1] + 1) % 300;
	T_OK(run(&m, tok, nans, right, &j));
	T_ASSERT(right[0] == 1 && right[1] == 0);
	/* an answer one token shorter leaves that token unscored */
	nans[1] = NA - 1;
	T_OK(run(&m, tok, nans, right, &j));
	T_ASSERT(right[0] == 1 && right[1] == 1);
	/* answers must lie after the prefill and inside the windows */
	struct decoding_set s = {
		.M = &m, .tok = tok, .nwin = NW, .P = NP, .T = NT, .rt = "",
		.threads = 1, .ans0 = NP, .nans = nans, .right = right,
	};
	T_EQ(decoding_run(&s, &j, 1), KVT_EINVAL);
	s.ans0 = NLEN + 1;
	nans[1] = NA;
	T_EQ(decoding_run(&s, &j, 1), KVT_EINVAL);
	model_free(&m);
}

/* ------------------------------------------------------------ SmolLM2 */

static struct tok *smollm2_tok(struct model *m)
{
	char path[4200], err[KVT_ERRTEXT_MAX], why[KVT_ERRTEXT_MAX + 32];
	if (model_files_find(MODEL_FILES_SMOLLM2, path, sizeof(path), err,
	                     sizeof(err)) < 0) {
		snprintf(why, sizeof(why), "%s", err);
		T_SKIP(why);
	}
	struct tok *t;
	T_OK(model_load(path, m, err, sizeof(err)));
	if (model_gguf_tok_file(path, m, &t, err, sizeof(err)) < 0)
		th_fail(__FILE__, __LINE__, "%s", err);
	return t;
}

/* The decoded text of ids[n] into *out (malloc'd). */
static void text_of(const struct tok *t, const int32_t *ids, size_t n,
                    char **out)
{
	char err[256];
	size_t len;
	if (tok_decode(t, ids, n, out, &len, err, sizeof(err)) < 0)
		th_fail(__FILE__, __LINE__, "%s", err);
}

TEST_T(eval_needle, case_key_whole_in_the_prefill, 120)
{
	struct model m;
	struct tok *t = smollm2_tok(&m);
	char err[1024], *text, want[128];
	size_t n;
	th_need_heldout();
	T_OK(dataset_text(DATASET_EVAL, &text, &n, err, sizeof(err)));
	static const uint32_t geo[][2] = {{128, 176}, {256, 790}};
	for (uint32_t g = 0; g < 2; g++) {
		const uint32_t P = geo[g][0], len = geo[g][1];
		for (uint64_t seed = 1; seed <= 4; seed++) {
			struct task_case c, c2;
			if (needle_case_build(t, text, n, P, len, seed, &c, err,
			                      sizeof(err)))
				th_fail(__FILE__, __LINE__, "%s", err);
			T_EQ(c.P, len);
			T_ASSERT(c.key_tok + TASK_KEY_DIGITS <= P);
			snprintf(want, sizeof(want), "The pass key is %s. "
			         "Remember it. %s is the pass key.", c.key, c.key);
			char *pre, *all;
			text_of(t, c.tok, P, &pre);
			text_of(t, c.tok, c.P, &all);
			T_ASSERT(strstr(pre, want));
			/* the question after the prefill (the decoded text
			 * between), the generation prompt last */
			const char *q = strstr(all, "What is the pass key? "
			                       "Answer with the 5-digit number "
			                       "only.");
			const size_t qat = q ? (size_t)(q - all) : 0,
			             al = strlen(all);
			T_ASSERT(qat > strlen(pre));
			T_ASSERT(al > 22 && !strcmp(all + al - 22,
			                            "<|im_start|>assistant\n"));
			free(pre);
			free(all);
			/* the same seed, the same case */
			T_OK(needle_case_build(t, text, n, P, len, seed, &c2, err,
			                       sizeof(err)));
			T_ASSERT(c2.P == c.P && !memcmp(c2.tok, c.tok,
			                               sizeof(int32_t) * c.P));
			task_case_free(&c2);
			task_case_free(&c);
		}
	}
	/* a prefill too short for the frame and the sentence */
	struct task_case c;
	T_EQ(needle_case_build(t, text, n, 40, 176, 1, &c, err, sizeof(err)),
	     KVT_EINVAL);
	free(text);
	tok_free(t);
	model_free(&m);
}
