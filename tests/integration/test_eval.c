/*
 * test_eval.c — kvtrim-train --quick and kvtrim-eval --quick on bytes2m
 * against a real kvtrimd: every policy runs, the csv has the documented
 * columns, and the full cache compared with itself gives KL 0 and top-1
 * agreement 1.  Skips when the shared models are absent.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "test.h"

#define MODEL "../shared/models/bytes2m.bin"
#define TEXT "../shared/models/bytes2m-valid.txt"

TEST_T(eval, quick_bytes2m, 240)
{
	if (access(MODEL, R_OK) || access(TEXT, R_OK))
		T_SKIP("../shared/models/bytes2m.bin or its text not found");
	if (access(th_bin("kvtrim-eval"), X_OK) ||
	    access(th_bin("kvtrim-train"), X_OK))
		T_SKIP("kvtrim-eval / kvtrim-train not built");
	struct th_daemon d;
	const char *extra[] = {"--high-watermark", "1", NULL};
	th_daemon_start(&d, "512M", extra);
	static char out[16384];
	int rc = th_sh(&d, out, sizeof(out), "%s --model %s --out %s/w "
	               "--seed 1 --quick", th_bin("kvtrim-train"), MODEL,
	               th_tmpdir());
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrim-train: %d\n%s", rc, out);
	rc = th_sh(&d, out, sizeof(out), "%s --model %s --out %s/out "
	           "--weights %s/w --runtime-dir %s --quick",
	           th_bin("kvtrim-eval"), MODEL, th_tmpdir(), th_tmpdir(),
	           d.dir);
	if (rc)
		th_fail(__FILE__, __LINE__, "kvtrim-eval: %d\n%s", rc, out);
	T_ASSERT(th_daemon_alive(&d));

	char path[512], line[1024];
	snprintf(path, sizeof(path), "%s/out/quality.csv", th_tmpdir());
	FILE *f = fopen(path, "r");
	T_ASSERT(f);
	T_ASSERT(fgets(line, sizeof(line), f));
	T_EQ_STR(line, "model,policy,target_ratio,achieved_ratio,kl,top1,"
	               "dnll,copy_acc,needle_acc\n");
	static const char *const want[] = {
		"full", "random", "streaming", "h2o", "snapkv", "tova",
		"kvzap-linear", "kvzap-mlp", "fastkvzip", "kvpop", "kvzip",
		"oracle"};
	int seen[12] = {0};
	while (fgets(line, sizeof(line), f)) {
		char model[64], pol[64];
		double tg, ach, kl, top1, dnll, copy;
		int n = sscanf(line, "%63[^,],%63[^,],%lf,%lf,%lf,%lf,%lf,%lf",
		               model, pol, &tg, &ach, &kl, &top1, &dnll, &copy);
		if (n != 8)
			th_fail(__FILE__, __LINE__, "bad row: %s", line);
		T_EQ_STR(model, "bytes2m");
		for (int i = 0; i < 12; i++)
			if (!strcmp(pol, want[i]))
				seen[i] = 1;
		T_ASSERT(kl >= 0 && top1 >= 0 && top1 <= 1);
		T_ASSERT(ach >= 0 && ach < 1);
		if (!strcmp(pol, "full")) {
			T_ASSERT(kl < 1e-6);
			T_ASSERT(top1 == 1.0);
			T_ASSERT(fabs(dnll) < 1e-5);
			T_ASSERT(ach == 0.0);
			T_ASSERT(copy > 0.5); /* the model copies (README) */
		} else {
			T_ASSERT(ach > 0.5); /* quick runs at ratio 0.75 */
			T_ASSERT(kl > 0);
		}
	}
	fclose(f);
	for (int i = 0; i < 12; i++)
		if (!seen[i])
			th_fail(__FILE__, __LINE__, "no row for %s", want[i]);
	snprintf(path, sizeof(path), "%s/out/quality.md", th_tmpdir());
	T_ASSERT(access(path, R_OK) == 0);
	th_daemon_stop(&d);
}
