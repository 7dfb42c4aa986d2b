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
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* --only: a kept policy's rows, read back from the last run's csv, are
 * written again byte for byte (accuracies and Wilson intervals computed
 * by hand, python, z = 1.96); the rerun policy's old rows and another
 * length's are ignored; the jobs list in the tables' order (ratio
 * policies before the learned ones).  Rows of another case count or
 * lacking a depth the run ran are refused. */
static const char *const only_rows[] = {
	"policies,1024,0.10,streaming,0.750,,0.7510,10,12,0.8333,0.5520,"
	"0.9530,1031.0,",
	"policies,1024,0.50,streaming,0.750,,0.7510,9,12,0.7500,0.4677,"
	"0.9111,1030.5,",
	"policies,1024,all,streaming,0.750,,0.7510,19,24,0.7917,0.5953,"
	"0.9076,1030.8,",
	"policies,1024,0.10,streaming,0.875,,0.8760,5,12,0.4167,0.1933,"
	"0.6805,1031.0,",
	"policies,1024,0.50,streaming,0.875,,0.8760,4,12,0.3333,0.1381,"
	"0.6094,1030.5,",
	"policies,1024,all,streaming,0.875,,0.8760,9,24,0.3750,0.2116,"
	"0.5729,1030.8,",
};

static void only_csv(const char *dir, const char *extra)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/needle.csv", dir);
	FILE *f = fopen(path, "w");
	T_ASSERT(f != NULL);
	fprintf(f, "part,length,depth,policy,target_ratio,threshold,"
	        "achieved_ratio,correct,trials,accuracy,ci_lo,ci_hi,"
	        "prompt_tokens,token_top1\n"
	        "full-cache,1024,0.10,full,,,,12,12,1.0000,0.7575,1.0000,"
	        "1031.0,\n");
	for (size_t i = 0; i < sizeof(only_rows) / sizeof(*only_rows); i++)
		fprintf(f, "%s\n", only_rows[i]);
	/* the rerun policy's old row, and another length's */
	fprintf(f, "policies,1024,0.10,kvzap-mlp,0.750,-2.3551,0.7600,1,12,"
	        "0.0833,0.0149,0.3539,1031.0,\n"
	        "policies,2048,0.10,h2o,0.750,,0.7500,3,12,0.2500,0.0893,"
	        "0.5323,2050.0,\n%s", extra);
	fclose(f);
}

static void only_result(struct task_result *R)
{
	static const uint32_t len[1] = {1024};
	static const double depth[3] = {0.1, 0.5, 0.9};
	memset(R, 0, sizeof(*R));
	R->kind = TASK_NEEDLE;
	R->name = "needle";
	R->model = "smollm2";
	R->nlen = 1;
	R->len = len;
	R->ndepth = 3;
	R->depth = depth;
	R->nrun = 1;
	R->run[0].on[0] = R->run[0].on[1] = 1; /* depth 0.9 not run */
	R->run[0].ref[0] = (struct task_cell){.ok = 12, .n = 12};
	R->run[0].ref[1] = (struct task_cell){.ok = 12, .n = 12};
	R->run[0].jobs = calloc(MAX_JOBS, sizeof(struct job));
	R->run[0].res = calloc(1, sizeof(struct task_jres));
	T_ASSERT(R->run[0].jobs && R->run[0].res);
	struct job *j = &R->run[0].jobs[0];
	snprintf(j->name, sizeof(j->name), "kvzap-mlp");
	j->ratio = 0.75;
	j->tau = -2.3551;
	for (int d = 0; d < 2; d++)
		R->run[0].res[0].c[d] = (struct task_cell){
			.ok = 11, .n = 12, .tokens = 12 * 1031.0};
	R->run[0].res[0].ach = 0.761;
	R->run[0].res[0].nach = 1;
	R->run[0].njobs = 1;
}

static void only_free(struct task_result *R)
{
	free(R->run[0].jobs);
	free(R->run[0].res);
}

TEST(eval_task, only_keeps_the_other_policies_rows)
{
	char in[600], out[600], err[1400], line[1024];
	snprintf(in, sizeof(in), "%s/only-in", th_tmpdir());
	snprintf(out, sizeof(out), "%s/only-out", th_tmpdir());
	T_ASSERT(mkdir(in, 0700) == 0 || errno == EEXIST);
	T_ASSERT(mkdir(out, 0700) == 0 || errno == EEXIST);
	only_csv(in, "");
	struct task_result R;
	only_result(&R);
	/* a whole run's order: streaming 0.75, kvzap-mlp, streaming 0.875 */
	struct job all[3] = {{.name = "streaming", .ratio = 0.75, .tau = NAN},
	                     {.name = "kvzap-mlp", .ratio = 0.75,
	                      .tau = -2.3551},
	                     {.name = "streaming", .ratio = 0.875,
	                      .tau = NAN}};
	T_OK(task_tables_keep(in, &R, 0, "kvzap-mlp", all, 3, err,
	                      sizeof(err)));
	T_EQ(R.run[0].njobs, 3);
	T_ASSERT(!strcmp(R.run[0].jobs[0].name, "streaming"));
	T_ASSERT(fabs(R.run[0].jobs[0].ratio - 0.75) < 1e-12);
	T_ASSERT(!strcmp(R.run[0].jobs[1].name, "kvzap-mlp"));
	T_ASSERT(!strcmp(R.run[0].jobs[2].name, "streaming"));
	T_ASSERT(fabs(R.run[0].jobs[2].ratio - 0.875) < 1e-12);
	T_EQ(R.run[0].res[1].c[0].ok, 11); /* this run's, not the csv's */
	T_EQ(R.run[0].res[0].c[1].ok, 9);
	T_EQ(R.run[0].res[0].c[1].n, 12);
	T_EQ(R.run[0].res[2].c[0].ok, 5);
	T_ASSERT(fabs(R.run[0].res[0].ach - 0.751) < 1e-12);
	task_tables_write(out, &R, "test");
	snprintf(line, sizeof(line), "%s/needle.csv", out);
	FILE *f = fopen(line, "r");
	T_ASSERT(f != NULL);
	size_t seen = 0;
	unsigned order = 0; /* 2 bits a policy row block, in file order */
	char last[64] = "";
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		/* the block: the columns policy and target_ratio */
		char cp[1024], *c[16], blk[64];
		snprintf(cp, sizeof(cp), "%s", line);
		if (table_split_csv(cp, c, 16) > 4 &&
		    !strcmp(c[0], "policies") && !strcmp(c[1], "1024")) {
			snprintf(blk, sizeof(blk), "%s,%s", c[3], c[4]);
			if (strcmp(last, blk)) {
				order = order << 2 |
				        (!strcmp(blk, "streaming,0.750") ? 1u
				         : !strcmp(c[3], "kvzap-mlp") ? 2u : 3u);
				snprintf(last, sizeof(last), "%s", blk);
			}
		}
		for (size_t i = 0; i < sizeof(only_rows) / sizeof(*only_rows);
		     i++)
			seen += !strcmp(line, only_rows[i]);
		T_ASSERT(strncmp(line, "policies,2048", 13) != 0);
	}
	fclose(f);
	T_EQ(seen, sizeof(only_rows) / sizeof(*only_rows));
	T_EQ(order, 0x1b); /* streaming 0.75, kvzap-mlp, streaming 0.875 */
	only_free(&R);

	/* another case count, a missing depth, a depth not run: refused */
	static const char *const bad[] = {
		"policies,1024,0.10,h2o,0.750,,0.7500,3,10,0.3000,0.1078,"
		"0.6032,1031.0,\npolicies,1024,0.50,h2o,0.750,,0.7500,3,12,"
		"0.2500,0.0893,0.5323,1030.5,\n",
		"policies,1024,0.10,h2o,0.750,,0.7500,3,12,0.2500,0.0893,"
		"0.5323,1031.0,\n",
		"policies,1024,0.90,snapkv,0.750,,0.7500,3,12,0.2500,0.0893,"
		"0.5323,1031.0,\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		only_csv(in, bad[i]);
		only_result(&R);
		err[0] = 0;
		T_ERR(task_tables_keep(in, &R, 0, "kvzap-mlp", all, 3, err,
		                       sizeof(err)), KVT_EINVAL);
		T_ASSERT(strstr(err, "rerun every policy") != NULL);
		only_free(&R);
	}
	/* no earlier csv: the run's own rows alone */
	snprintf(line, sizeof(line), "%s/none", th_tmpdir());
	only_result(&R);
	T_OK(task_tables_keep(line, &R, 0, "kvzap-mlp", all, 3, err,
	                      sizeof(err)));
	T_EQ(R.run[0].njobs, 1);
	only_free(&R);
}
