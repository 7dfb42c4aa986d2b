/*
 * tasks_test.c — the machinery of protocol 1's needle and copy tasks
 * (tools/eval/context/tasks.h) against independent values: Wilson intervals
 * from the textbook formula computed by hand (python), greedy decoding
 * on the in-process cache against the dense forward's greedy tokens
 * (tiny random model), the teacher-forced shortcut of a job's needle
 * answer against plain greedy decoding on the same compressed cache, the
 * split prefill's staged records against a one-step prefill's, and, with
 * SmolLM2's tokenizer (skipped without the model: `make models`), the
 * case builder checked by decoding its token ids: the key at the asked
 * depth of the filler, the filler a verbatim part of the evaluation
 * text, exact lengths, the copy's line where it belongs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tasks.h"
#include "../../train/dataset.h"
#include "daemon.h"
#include "gb.h"
#include "model.h"
#include "model_files.h"
#include "model_gguf.h"
#include "test.h"
#include "tokenizer.h"

#define NP 40u

static void tokens(int32_t *tok, uint32_t n, uint32_t seed)
{
	for (uint32_t i = 0; i < n; i++)
		tok[i] = (int32_t)((i * 41u + seed * 13u + (i * i) % 11u) % 300u);
}

static const int32_t sep[3] = {5, 6, 7};

TEST(eval_task, wilson_by_hand)
{
	/* (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n) */
	static const struct {
		uint64_t k, n;
		double lo, hi;
	} want[] = {
		{9, 10, 0.595844, 0.982124}, {0, 10, 0.0, 0.277540},
		{10, 10, 0.722460, 1.0},     {5, 10, 0.236590, 0.763410},
		{24, 48, 0.363891, 0.636109},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		double lo, hi;
		task_wilson(want[i].k, want[i].n, &lo, &hi);
		if (fabs(lo - want[i].lo) > 1e-6 || fabs(hi - want[i].hi) > 1e-6)
			th_fail(__FILE__, __LINE__, "%llu/%llu: [%f, %f]",
			        (unsigned long long)want[i].k,
			        (unsigned long long)want[i].n, lo, hi);
	}
	double lo, hi;
	task_wilson(0, 0, &lo, &hi);
	T_ASSERT(lo == 0 && hi == 1);
}

/* A needle case on the tiny model: random prompt tokens, no key. */
static void tiny_case(struct task_case *c, uint32_t seed)
{
	memset(c, 0, sizeof(*c));
	c->kind = TASK_NEEDLE;
	c->P = NP;
	c->tok = malloc(sizeof(int32_t) * NP);
	T_ASSERT(c->tok);
	tokens(c->tok, NP, seed);
}

/* The dense forward's greedy tokens after prompt[NP]: n of them. */
static void dense_greedy(const struct model *m, const int32_t *prompt,
                         uint32_t n, int32_t *out)
{
	const uint32_t V = m->cfg.vocab_size;
	struct model_dense dn;
	T_OK(model_dense_init(&dn, m, NP + n, 0));
	float *lg = malloc(sizeof(float) * NP * V);
	T_ASSERT(lg);
	T_OK(model_dense_step(&dn, prompt, NP, lg));
	const float *last = lg + (size_t)(NP - 1) * V;
	for (uint32_t t = 0; t < n; t++) {
		uint32_t b = 0;
		for (uint32_t v = 1; v < V; v++)
			if (last[v] > last[b])
				b = v;
		out[t] = (int32_t)b;
		if (t + 1 < n) {
			T_OK(model_dense_step(&dn, &out[t], 1, lg));
			last = lg;
		}
	}
	free(lg);
	model_dense_free(&dn);
}

TEST_T(eval_task, reference_greedy_is_the_dense_forwards, 60)
{
	struct model m;
	gb_tiny_llama(&m, 3);
	const struct model_config *mc = &m.cfg;
	struct task_case c;
	tiny_case(&c, 1);
	const struct task_stop st = {-1, NULL, 8};
	struct task_ref r;
	T_OK(task_ref_build(&m, NULL, &c, &st, sep, 3, 1, &r));
	T_EQ(r.nans, 8);
	T_EQ(r.w.P, NP);
	T_EQ(r.w.T, NP + 8);
	int32_t want[8];
	dense_greedy(&m, c.tok, 8, want);
	for (uint32_t i = 0; i < 8; i++)
		T_EQ(r.tok[NP + i], want[i]);
	/* the staged records of the split prefill (NP - 1 tokens, then the
	 * last) are those of one step over the prompt */
	struct ctx_window w;
	int32_t tk[NP + 2];
	memcpy(tk, c.tok, sizeof(int32_t) * NP);
	tk[NP] = tk[NP + 1] = 1;
	T_OK(ctx_window_build(&m, tk, NP, NP + 2, sep, 3, &w));
	const size_t L = mc->n_layers, H = mc->n_heads, hd = mc->head_dim;
	const size_t nx = L * NP * mc->dim, nq = L * NP * H * hd, nl = L * NP * H,
	             nz = L * mc->n_kv_heads * NP;
	double worst = 0;
	for (size_t i = 0; i < nx; i++)
		worst = fmax(worst, fabs(w.x[i] - r.w.x[i]));
	for (size_t i = 0; i < nq; i++)
		worst = fmax(worst, fabs(w.q[i] - r.w.q[i]));
	for (size_t i = 0; i < nl; i++)
		worst = fmax(worst, fabs(w.lse[i] - r.w.lse[i]));
	for (size_t i = 0; i < nz; i++)
		worst = fmax(worst, fabs(w.kvzip[i] - r.w.kvzip[i]));
	if (worst > 1e-4)
		th_fail(__FILE__, __LINE__, "split prefill vs one step: %g",
		        worst);
	ctx_window_free(&w);
	task_ref_free(&r);
	task_case_free(&c);
	model_free(&m);
}

TEST_T(eval_task, needle_answer_is_greedy_decoding, 60)
{
	struct model m;
	gb_tiny_llama(&m, 4);
	const struct model_config *mc = &m.cfg;
	const struct task_stop st = {-1, NULL, 10};
	uint8_t *keep = malloc((size_t)mc->n_layers * mc->n_kv_heads * NP);
	struct ctx_cache *a, *b;
	T_ASSERT(keep);
	T_OK(ctx_cache_open(&m, NP + TASK_ANS_MAX, &a));
	T_OK(ctx_cache_open(&m, NP + TASK_ANS_MAX, &b));
	uint32_t diverged = 0;
	for (uint32_t seed = 0; seed < 4; seed++) {
		struct task_case c;
		tiny_case(&c, 10 + seed);
		struct task_ref r;
		T_OK(task_ref_build(&m, NULL, &c, &st, sep, 3, 1, &r));
		/* every entry kept: the reference's answer in one step */
		memset(keep, 1, (size_t)mc->n_layers * mc->n_kv_heads * NP);
		int32_t x[TASK_ANS_MAX], y[TASK_ANS_MAX];
		uint32_t nx, ny;
		ctx_cache_truncate(a, 0);
		ctx_load_keep(&m, &r.w, keep, a);
		T_OK(task_needle_answer(&m, NULL, a, &c, &r, &st, x, &nx));
		T_EQ(nx, r.nans);
		for (uint32_t i = 0; i < nx; i++)
			T_EQ(x[i], r.tok[NP + i]);
		/* compressed: the shortcut is plain greedy decoding */
		for (int q = 0; q < 2; q++) {
			double R = q ? 0.75 : 0.5;
			T_OK(ctx_keep_oracle(&m, &r.w, R, keep));
			ctx_cache_truncate(a, 0);
			ctx_cache_truncate(b, 0);
			ctx_load_keep(&m, &r.w, keep, a);
			ctx_load_keep(&m, &r.w, keep, b);
			T_OK(task_needle_answer(&m, NULL, a, &c, &r, &st, x,
			                           &nx));
			T_OK(task_decode(&m, b, r.first, NP, &st, y, &ny));
			T_EQ(nx, ny);
			int same = 1;
			for (uint32_t i = 0; i < nx; i++) {
				T_EQ(x[i], y[i]);
				same &= x[i] == r.tok[NP + i];
			}
			diverged += !same;
		}
		task_ref_free(&r);
		task_case_free(&c);
	}
	/* the path that decodes on after the reference was taken */
	T_ASSERT(diverged > 0);
	ctx_cache_close(a);
	ctx_cache_close(b);
	free(keep);
	model_free(&m);
}

TEST(eval_task, copy_score_by_hand)
{
	int32_t tok[6] = {9, 9, 9, 4, 5, 6}; /* prompt 3, line 4 5 6 */
	struct task_case c = {.kind = TASK_COPY, .tok = tok, .P = 3,
	                         .nans = 3};
	const int32_t right[3] = {4, 5, 6}, one_off[3] = {4, 7, 6};
	double t1;
	T_EQ(task_score(NULL, &c, right, 3, &t1), 1);
	T_ASSERT(t1 == 1.0);
	T_EQ(task_score(NULL, &c, one_off, 3, &t1), 0);
	T_ASSERT(fabs(t1 - 2.0 / 3) < 1e-12);
	T_EQ(task_score(NULL, &c, right, 2, &t1), 0);
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

/* The evaluation split's text into *text; its length. */
static size_t eval_text(char **text)
{
	char err[1024];
	size_t n;
	th_need_heldout();
	T_OK(dataset_text(DATASET_EVAL, text, &n, err, sizeof(err)));
	return n;
}

static void done(char *text, struct tok *t, struct model *m)
{
	free(text);
	tok_free(t);
	model_free(m);
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

static size_t ntok(const struct tok *t, const char *s, size_t n)
{
	struct tok_ids ids = {0};
	char err[256];
	T_OK(tok_encode(t, s, n, 0, &ids, err, sizeof(err)));
	free(ids.v);
	return ids.n;
}

TEST_T(eval_task, needle_planted_at_its_depth, 120)
{
	struct model m;
	struct tok *t = smollm2_tok(&m);
	char *text, err[1024];
	size_t n = eval_text(&text);
	static const char pre[] = "I will quiz you about the pass key.\n\n";
	static const char q[] = "\n\nWhat is the pass key?";
	static const double depth[3] = {0.1, 0.5, 0.9};
	for (uint32_t k = 0; k < 6; k++) {
		uint32_t len = k < 3 ? 1024 : 2048;
		struct task_case c;
		if (task_case_build(t, text, n, TASK_NEEDLE, len,
		                       depth[k % 3], 100 + k, &c, err,
		                       sizeof(err)) < 0)
			th_fail(__FILE__, __LINE__, "%s", err);
		T_EQ(c.P, len);
		T_EQ(strlen(c.key), 5);
		/* the key's tokens decode to the key */
		char *ks;
		text_of(t, c.tok + c.key_tok, 5, &ks);
		T_EQ_STR(ks, c.key);
		free(ks);
		char *s;
		text_of(t, c.tok, c.P, &s);
		T_ASSERT(!strncmp(s, "<|im_start|>system\n", 19));
		const char *tail = "<|im_end|>\n<|im_start|>assistant\n";
		T_EQ_STR(s + strlen(s) - strlen(tail), tail);
		T_ASSERT(strstr(s, "<|im_start|>user\n"));
		char needle[128];
		snprintf(needle, sizeof(needle), "The pass key is %s. Remember "
		         "it. %s is the pass key.\n", c.key, c.key);
		char *a = strstr(s, pre), *nd = strstr(s, needle),
		     *e = strstr(s, q);
		T_ASSERT(a && nd && e && a < nd && nd < e);
		a += strlen(pre);
		char *b = nd + strlen(needle);
		/* the filler around the needle is the evaluation text,
		 * verbatim, the needle at a line start */
		T_ASSERT(nd == a || nd[-1] == '\n');
		*nd = 0;
		*e = 0;
		T_ASSERT(memmem(text, n, a, strlen(a)));
		T_ASSERT(memmem(text, n, b, strlen(b)));
		/* the depth in filler tokens: within a line of the asked */
		double nb = ntok(t, a, strlen(a)), na = ntok(t, b, strlen(b));
		double got = nb / (nb + na);
		if (fabs(got - depth[k % 3]) > 0.03)
			th_fail(__FILE__, __LINE__, "depth %.2f at %.3f (%s)",
			        depth[k % 3], got, c.key);
		free(s);
		task_case_free(&c);
	}
	done(text, t, &m);
}

TEST_T(eval_task, copy_line_first_and_not_in_filler, 120)
{
	struct model m;
	struct tok *t = smollm2_tok(&m);
	char *text, err[1024];
	size_t n = eval_text(&text);
	for (uint32_t k = 0; k < 4; k++) {
		struct task_case c;
		if (task_case_build(t, text, n, TASK_COPY, 512, 0,
		                       200 + k, &c, err, sizeof(err)) < 0)
			th_fail(__FILE__, __LINE__, "%s", err);
		T_EQ(c.P, 512);
		T_ASSERT(memmem(text, n, c.line, strlen(c.line)));
		/* the expected answer is the line */
		char *ans;
		text_of(t, c.tok + c.P, c.nans, &ans);
		T_EQ_STR(ans, c.line);
		free(ans);
		char *s;
		text_of(t, c.tok, c.P, &s);
		char *l = strstr(s, c.line);
		T_ASSERT(l && !strstr(l + 1, c.line)); /* once, in the frame */
		T_ASSERT(l < strstr(s, "Here is a document:"));
		free(s);
		task_case_free(&c);
	}
	done(text, t, &m);
}

TEST_T(eval_task, needle_score_by_the_digits, 60)
{
	struct model m;
	struct tok *t = smollm2_tok(&m);
	struct task_case c = {.kind = TASK_NEEDLE};
	snprintf(c.key, sizeof(c.key), "48213");
	static const struct {
		const char *ans;
		int ok;
	} cases[] = {
		{"The pass key is 48213.", 1}, {"48213", 1},
		{"The key: 48213 (48213)", 1}, {"The pass key is 4821.", 0},
		{"482130", 0},                 {"12 and 48213", 0},
		{"The pass key is", 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct tok_ids ids = {0};
		char err[256];
		T_OK(tok_encode(t, cases[i].ans, strlen(cases[i].ans), 0, &ids,
		                err, sizeof(err)));
		if (task_score(t, &c, ids.v, (uint32_t)ids.n, NULL) !=
		    cases[i].ok)
			th_fail(__FILE__, __LINE__, "\"%s\" scored wrong",
			        cases[i].ans);
		free(ids.v);
	}
	tok_free(t);
	model_free(&m);
}
