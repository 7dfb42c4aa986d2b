/*
 * test_eval_decoding.c — kvtrim-eval's protocol 2 (decoding-time compression,
 * tools/eval/decoding/decoding.h) through a real kvtrimd on a tiny random model,
 * checked against values computed here independently: the dense forward
 * (model_dense_forward) as the reference, and streaming run by hand on
 * protocol 1's in-process cache (context.h, BLAS attention) with its
 * definition's keep set (docs/policies.md: sinks and the most recent
 * entries, B = n - floor(R n) after every sync); its achieved ratio by
 * hand.  Then `kvtrim-eval --model smollm2 --protocol 2 --quick` end to
 * end, its windows and its decoding-time needle apart (skip without the
 * model: `make models`).  The daemon runs the cpu
 * backend: protocol 2 reads the pages in host memory (skipped otherwise).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../tools/eval/context/context.h"
#include "../../tools/eval/decoding/decoding.h"
#include "daemon.h"
#include "gb.h"
#include "model.h"
#include "model_files.h"
#include "test.h"

#define NW 2u
#define NP 24u
#define NC 12u
#define NT (NP + NC + 1)

struct rig {
	struct model m;
	struct th_daemon d;
	int32_t tok[NW * NT];
};

static void rig_up(struct rig *r)
{
	if (strcmp(th_backend(), "cpu"))
		T_SKIP("protocol 2 needs a cpu-backend kvtrimd");
	gb_tiny_llama(&r->m, 6);
	for (uint32_t i = 0; i < NW * NT; i++)
		r->tok[i] = (int32_t)((i * 59u + 3u + (i * i) % 19u) % 300u);
	th_daemon_start(&r->d, "256M", NULL);
}

static void rig_down(struct rig *r)
{
	T_EQ(th_daemon_stop(&r->d), 0);
	model_free(&r->m);
}

static int run(struct rig *r, struct job *jobs, uint32_t nj, uint32_t gj,
               int threads)
{
	struct decoding_set s = {
		.M = &r->m, .tok = r->tok, .nwin = NW, .P = NP, .T = NT,
		.rt = r->d.dir, .threads = threads, .group_jobs = gj,
	};
	return decoding_run(&s, jobs, nj);
}

/* What streaming:ratio=R,sinks=4 must give, computed by hand: per window
 * the dense reference, and a decode on a ctx cache cut to the sinks and
 * the last B - 4 entries after the prefill and after every step. */
struct expect {
	double kl, top1, dnll, ach;
};

static void cut_streaming(const struct model *m, struct ctx_cache *c,
                          uint32_t n, double R)
{
	const struct model_config *mc = &m->cfg;
	uint32_t B = n - (uint32_t)floor(R * n);
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			uint32_t *len = ctx_cache_len(c, l, g);
			if (*len <= B)
				continue;
			/* entries are in position order: keep 0..3 and the
			 * last B - 4 */
			float *K = ctx_cache_k(c, l, g), *V = ctx_cache_v(c, l, g);
			size_t hd = mc->head_dim, keep = B - 4;
			memmove(K + 4 * hd, K + (*len - keep) * hd,
			        sizeof(float) * keep * hd);
			memmove(V + 4 * hd, V + (*len - keep) * hd,
			        sizeof(float) * keep * hd);
			*len = B;
		}
}

static void streaming_by_hand(const struct rig *r, double R, struct expect *x)
{
	const struct model *m = &r->m;
	const size_t Vc = m->cfg.vocab_size;
	const double lists = (double)m->cfg.n_layers * m->cfg.n_kv_heads;
	float *ref = malloc(sizeof(float) * NT * Vc),
	      *lg = malloc(sizeof(float) * Vc);
	struct ctx_cache *c;
	T_ASSERT(ref && lg);
	T_OK(ctx_cache_open(m, NT, &c));
	memset(x, 0, sizeof(*x));
	for (uint32_t w = 0; w < NW; w++) {
		const int32_t *tk = r->tok + (size_t)w * NT;
		T_OK(model_dense_forward(m, tk, NT, ref));
		ctx_cache_truncate(c, 0);
		T_OK(ctx_cache_step(c, tk, NP, 0, NULL, NULL));
		cut_streaming(m, c, NP, R);
		for (uint32_t t = NP; t + 1 < NT; t++) {
			T_OK(ctx_cache_step(c, tk + t, 1, t, NULL, lg));
			cut_streaming(m, c, t + 1, R);
			double kl, dnll;
			int top1;
			score_compare(ref + (size_t)t * Vc, lg, (uint32_t)Vc,
			            tk[t + 1], &kl, &top1, &dnll);
			x->kl += kl;
			x->top1 += top1;
			x->dnll += dnll;
			uint32_t n = t + 1;
			x->ach += (double)(uint32_t)floor(R * n) / n;
		}
	}
	(void)lists;
	ctx_cache_close(c);
	free(ref);
	free(lg);
}

static void expect_streaming(const struct job *j, const struct expect *x)
{
	if (j->failed)
		th_fail(__FILE__, __LINE__, "streaming failed: %s", j->err);
	T_EQ(j->npos, NW * NC);
	T_EQ(j->nach, NW * NC);
	/* kept counted from the daemon's lists: exactly the definition */
	if (fabs(j->ach - x->ach) > 1e-9)
		th_fail(__FILE__, __LINE__, "achieved %.12f, by hand %.12f",
		        j->ach / j->nach, x->ach / j->nach);
	/* the two caches attend with different arithmetic (paged kernel,
	 * BLAS): float rounding apart */
	if (fabs(j->kl - x->kl) > 1e-4 * (1 + x->kl) ||
	    fabs(j->dnll - x->dnll) > 1e-4 * (1 + fabs(x->dnll)))
		th_fail(__FILE__, __LINE__, "KL %.8f dNLL %.8f, by hand %.8f "
		        "%.8f", j->kl, j->dnll, x->kl, x->dnll);
	T_ASSERT(fabs(j->top1 - x->top1) <= 1);
	T_ASSERT(x->kl > 0); /* it evicts something that matters */
}

static struct job job(const char *name, double R, enum jkind k,
                      const char *spec)
{
	struct job j;
	memset(&j, 0, sizeof(j));
	snprintf(j.name, sizeof(j.name), "%s", name);
	snprintf(j.spec[C_MAIN], sizeof(j.spec[C_MAIN]), "%s", spec);
	j.ratio = R;
	j.kind = k;
	j.tau = NAN;
	return j;
}

TEST_T(eval_decoding, full_is_the_dense_forward, 60)
{
	struct rig r;
	rig_up(&r);
	struct job j[2] = {job("full", 0, J_DAEMON, "full"),
	                   job("streaming", 0.5, J_DAEMON,
	                       "streaming:ratio=0.5,sinks=4")};
	T_OK(run(&r, j, 2, 0, 1));
	T_ASSERT(!j[0].failed);
	T_EQ(j[0].npos, NW * NC);
	/* every entry kept, the same attention as the reference: float
	 * rounding of the batched matmuls at most (the reference is
	 * decoded in a batch of its own: OpenBLAS's kernels depend on the
	 * rows of a call) */
	T_ASSERT(j[0].kl >= 0 && j[0].kl / j[0].npos < 1e-9);
	if (fabs(j[0].dnll) / j[0].npos > 1e-5)
		th_fail(__FILE__, __LINE__, "full: mean dNLL %g",
		        j[0].dnll / j[0].npos);
	T_EQ(j[0].top1, NW * NC);
	T_ASSERT(j[0].ach == 0);
	struct expect x;
	streaming_by_hand(&r, 0.5, &x);
	expect_streaming(&j[1], &x);
	rig_down(&r);
}

TEST_T(eval_decoding, groups_and_the_oracle, 90)
{
	struct rig r;
	rig_up(&r);
	/* one job per group on two threads: full, streaming, random, then
	 * the oracle group after the first one's totals */
	struct job j[4] = {
		job("full", 0, J_DAEMON, "full"),
		job("streaming", 0.5, J_DAEMON, "streaming:ratio=0.5,sinks=4"),
		job("random", 0.5, J_DAEMON, "random:ratio=0.5,seed=1"),
		job("oracle", 0.5, J_ORACLE, "oracle"),
	};
	T_OK(run(&r, j, 4, 1, 2));
	for (int k = 0; k < 4; k++)
		if (j[k].failed)
			th_fail(__FILE__, __LINE__, "%s: %s", j[k].name, j[k].err);
	T_ASSERT(j[0].kl / j[0].npos < 1e-9);
	struct expect x;
	streaming_by_hand(&r, 0.5, &x);
	expect_streaming(&j[1], &x);
	/* the oracle's budget is streaming's: the same achieved ratio */
	T_ASSERT(fabs(j[3].ach - x.ach) < 1e-9);
	T_ASSERT(fabs(j[2].ach - x.ach) < 1e-9);
	/* the hindsight bound beats random at the same budget */
	T_ASSERT(j[3].kl > 0 && j[3].kl < j[2].kl);
	rig_down(&r);
}

TEST_T(eval_decoding, bad_jobs, 60)
{
	struct rig r;
	rig_up(&r);
	struct job j[2] = {job("nosuch", 0.5, J_DAEMON, "nosuch:ratio=0.5"),
	                   job("full", 0, J_DAEMON, "full")};
	T_OK(run(&r, j, 2, 0, 1));
	/* a spec the daemon refuses fails its job with the reason; the
	 * other job is untouched */
	T_ASSERT(j[0].failed && strstr(j[0].err, "nosuch"));
	T_ASSERT(!j[1].failed && j[1].npos == NW * NC &&
	         j[1].kl / j[1].npos < 1e-9);
	struct job z = job("kvzip", 0.5, J_KVZIP, "kvzip");
	T_EQ(run(&r, &z, 1, 0, 1), KVT_EINVAL);
	struct decoding_set s = {.M = &r.m, .tok = r.tok, .nwin = NW, .P = NP,
	                     .T = NP + 1, .rt = r.d.dir, .threads = 1};
	T_EQ(decoding_run(&s, j, 1), KVT_EINVAL);
	T_ASSERT(th_daemon_alive(&r.d));
	rig_down(&r);
}

TEST_T(eval_decoding, quick_smollm2, 300)
{
	if (strcmp(th_backend(), "cpu"))
		T_SKIP("protocol 2 needs a cpu-backend kvtrimd");
	/* SmolLM2, kvtrim-eval and the held-out text (shared data, not in the
	 * repository: a fresh clone skips). */
	th_need_smollm2_eval();
	struct th_daemon d;
	th_daemon_start(&d, "512M", NULL);
	static char out[32768];
	/* the windows only: the decoding-time needle is quick_needle's */
	int rc = th_sh(&d, out, sizeof(out), "%s --model smollm2 --protocol 2 "
	               "--out %s/out --weights %s/none --runtime-dir %s --quick "
	               "--no-tasks",
	               th_bin("kvtrim-eval"), th_tmpdir(), th_tmpdir(), d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrim-eval: %d\n%s", rc, out);
	T_ASSERT(th_daemon_alive(&d));
	char p[512], line[1024];
	snprintf(p, sizeof(p), "%s/out/protocol2.csv", th_tmpdir());
	FILE *f = fopen(p, "r");
	T_ASSERT(f);
	T_ASSERT(fgets(line, sizeof(line), f));
	T_EQ_STR(line, "model,policy,target_ratio,achieved_ratio,kl,top1,"
	               "dnll,copy_acc,needle_acc,threshold\n");
	static const char *const want[] = {"full", "random", "streaming",
	                                   "h2o", "tova", "knorm", "oracle"};
	int seen[7] = {0};
	double kl_rand = -1, kl_oracle = -1;
	while (fgets(line, sizeof(line), f)) {
		char pol[64];
		double tg, ach, kl, top1;
		T_ASSERT(sscanf(line, "smollm2,%63[^,],%lf,%lf,%lf,%lf", pol, &tg,
		                &ach, &kl, &top1) == 5);
		for (int i = 0; i < 7; i++)
			seen[i] |= !strcmp(pol, want[i]);
		if (!strcmp(pol, "full")) {
			T_ASSERT(kl < 1e-6 && top1 == 1 && ach == 0);
			continue;
		}
		/* one target, the lowest: asked for R, a budget rounded
		 * up, at most mean(1/n) = 0.021 under R (32 + 32 tokens) */
		T_ASSERT(fabs(tg - 0.75) < 1e-9 && ach <= 0.75 && ach > 0.728);
		T_ASSERT(kl > 0 && top1 > 0 && top1 < 1);
		if (!strcmp(pol, "random"))
			kl_rand = kl;
		if (!strcmp(pol, "oracle"))
			kl_oracle = kl;
	}
	fclose(f);
	for (int i = 0; i < 7; i++)
		if (!seen[i])
			th_fail(__FILE__, __LINE__, "no row for %s", want[i]);
	T_ASSERT(kl_oracle > 0 && kl_oracle < kl_rand);
	snprintf(p, sizeof(p), "%s/out/protocol2.md", th_tmpdir());
	f = fopen(p, "r");
	T_ASSERT(f);
	int goal = 0, cols = 0;
	while (fgets(line, sizeof(line), f)) {
		goal |= strstr(line, "## Goal") != NULL;
		cols |= strstr(line, "| achieved 0.750 |") != NULL;
	}
	fclose(f);
	T_ASSERT(goal && cols);
	th_daemon_stop(&d);
}

/* A row of needle-decoding.csv. */
struct nd_row {
	char pol[64];
	double tg, ach, acc, lo, hi, rel, kl;
	unsigned ok, n;
	int failed;
};

static int nd_parse(const char *line, struct nd_row *r)
{
	return sscanf(line, "smollm2,%63[^,],%lf,%lf,%u,%u,%lf,%lf,%lf,%lf,"
	              "%lf,%d", r->pol, &r->tg, &r->ach, &r->ok, &r->n,
	              &r->acc, &r->lo, &r->hi, &r->rel, &r->kl,
	              &r->failed) == 11;
}

/* The decoding-time needle's quick path (decoding/needle.c: 2 cases of
 * 128 prefilled + 48 decoded tokens, the target 0.75) alone through a
 * real kvtrimd: every policy's row on both cases, the full cache right on
 * both (its answer, teacher-forced through the daemon's pages, is the
 * reference's), the hindsight oracle (every entry the question and the
 * answer will read kept) right on both, the Wilson interval around each
 * accuracy, protocol 2's tables not written; then a rerun of two
 * policies (--only) that keeps the other rows and spec lines. */
TEST_T(eval_decoding, quick_needle_smollm2, 300)
{
	if (strcmp(th_backend(), "cpu"))
		T_SKIP("protocol 2 needs a cpu-backend kvtrimd");
	th_need_smollm2_eval();
	struct th_daemon d;
	th_daemon_start(&d, "512M", NULL);
	static char out[32768];
	int rc = th_sh(&d, out, sizeof(out), "%s --model smollm2 --protocol 2 "
	               "--out %s/nd --weights %s/none --runtime-dir %s --quick "
	               "--tasks-only", th_bin("kvtrim-eval"), th_tmpdir(),
	               th_tmpdir(), d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrim-eval: %d\n%s", rc, out);
	T_ASSERT(th_daemon_alive(&d));
	char p[512], line[1024];
	snprintf(p, sizeof(p), "%s/nd/protocol2.csv", th_tmpdir());
	T_ASSERT(access(p, F_OK) != 0);
	snprintf(p, sizeof(p), "%s/nd/needle-decoding.csv", th_tmpdir());
	FILE *f = fopen(p, "r");
	T_ASSERT(f);
	T_ASSERT(fgets(line, sizeof(line), f));
	T_EQ_STR(line, "model,policy,target_ratio,achieved_ratio,right,cases,"
	               "accuracy,wilson_lo,wilson_hi,relative,kl,failed\n");
	static const char *const want[] = {"full", "random", "streaming",
	                                   "h2o", "tova", "knorm", "oracle"};
	int seen[7] = {0}, nrow = 0, h2o_before = -1;
	struct nd_row r;
	while (fgets(line, sizeof(line), f)) {
		T_ASSERT(nd_parse(line, &r));
		for (int i = 0; i < 7; i++)
			seen[i] |= !strcmp(r.pol, want[i]);
		if (!strcmp(r.pol, "h2o"))
			h2o_before = nrow;
		nrow++;
		T_ASSERT(!r.failed && r.n == 2 && r.ok <= r.n);
		T_ASSERT(fabs(r.acc - r.ok / 2.0) < 1e-9 && r.lo <= r.acc &&
		         r.acc <= r.hi);
		if (!strcmp(r.pol, "full")) {
			T_ASSERT(r.ok == 2 && r.ach == 0 && r.kl < 1e-6);
			continue;
		}
		/* asked for at least the target */
		T_ASSERT(fabs(r.tg - 0.75) < 1e-9 && r.ach >= 0.75 &&
		         r.ach < 0.78);
		if (!strcmp(r.pol, "oracle"))
			T_ASSERT(r.ok == 2);
	}
	fclose(f);
	for (int i = 0; i < 7; i++)
		if (!seen[i])
			th_fail(__FILE__, __LINE__, "no row for %s", want[i]);
	snprintf(p, sizeof(p), "%s/nd/needle-decoding.md", th_tmpdir());
	f = fopen(p, "r");
	T_ASSERT(f);
	int col = 0;
	while (fgets(line, sizeof(line), f))
		col |= strstr(line, "## At 0.750") != NULL;
	fclose(f);
	T_ASSERT(col);
	snprintf(p, sizeof(p), "%s/nd/specs-smollm2-needle-decoding.txt",
	         th_tmpdir());
	T_ASSERT(access(p, R_OK) == 0);

	/* --only full,tova reruns those two and keeps the others' rows and
	 * spec lines: h2o's row, marked here with a kl no run gives, comes
	 * back as it was, in its place, and every policy has one row */
	snprintf(p, sizeof(p), "%s/nd/needle-decoding.csv", th_tmpdir());
	static char csv[16384];
	size_t used = 0;
	T_ASSERT((f = fopen(p, "r")));
	while (fgets(line, sizeof(line), f)) {
		char pol[64];
		if (sscanf(line, "smollm2,%63[^,],", pol) == 1 &&
		    !strcmp(pol, "h2o")) {
			char *kl = line;
			for (int c = 0; c < 10; c++)
				kl = strchr(kl, ',') + 1;
			snprintf(kl, sizeof(line) - (size_t)(kl - line),
			         "9.876543,0\n");
		}
		used += (size_t)snprintf(csv + used, sizeof(csv) - used, "%s",
		                         line);
	}
	fclose(f);
	T_ASSERT(used < sizeof(csv) && (f = fopen(p, "w")));
	fputs(csv, f);
	fclose(f);
	rc = th_sh(&d, out, sizeof(out), "%s --model smollm2 --protocol 2 "
	           "--out %s/nd --weights %s/none --runtime-dir %s --quick "
	           "--tasks-only --only full,tova", th_bin("kvtrim-eval"),
	           th_tmpdir(), th_tmpdir(), d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrim-eval --only: %d\n%s", rc,
		        out);
	T_ASSERT((f = fopen(p, "r")));
	T_ASSERT(fgets(line, sizeof(line), f));
	int rows[7] = {0}, at = 0, h2o_at = -1;
	while (fgets(line, sizeof(line), f)) {
		T_ASSERT(nd_parse(line, &r));
		for (int i = 0; i < 7; i++)
			rows[i] += !strcmp(r.pol, want[i]);
		if (!strcmp(r.pol, "h2o")) {
			h2o_at = at;
			T_ASSERT(fabs(r.kl - 9.876543) < 1e-9 && r.n == 2);
		}
		T_ASSERT(!strcmp(r.pol, "h2o") || r.kl < 9);
		at++;
	}
	fclose(f);
	for (int i = 0; i < 7; i++)
		T_EQ(rows[i], 1);
	T_EQ(at, nrow);
	T_EQ(h2o_at, h2o_before); /* its place, as the first run wrote it */
	snprintf(p, sizeof(p), "%s/nd/needle-decoding.md", th_tmpdir());
	T_ASSERT((f = fopen(p, "r")));
	col = 0;
	while (fgets(line, sizeof(line), f))
		col |= strstr(line, "--only: the other policies' rows are the "
		                    "previous run's") != NULL;
	fclose(f);
	T_ASSERT(col);
	snprintf(p, sizeof(p), "%s/nd/specs-smollm2-needle-decoding.txt",
	         th_tmpdir());
	T_ASSERT((f = fopen(p, "r")));
	int specs[7] = {0};
	while (fgets(line, sizeof(line), f)) {
		char pol[64];
		if (line[0] == '#' || sscanf(line, "%63s", pol) != 1)
			continue;
		for (int i = 0; i < 7; i++)
			specs[i] += !strcmp(pol, want[i]);
	}
	fclose(f);
	for (int i = 0; i < 7; i++)
		T_EQ(specs[i], 1);
	th_daemon_stop(&d);
}
