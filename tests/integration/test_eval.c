/*
 * test_eval.c — kvtrim-train --quick and kvtrim-eval --quick on bytes2m
 * against a real kvtrimd: every policy runs, the csv has the documented
 * columns, the full cache compared with itself gives KL 0 and top-1
 * agreement 1, both kvzap scorers have threshold-sweep rows (no target,
 * achieved ratio measured), and the needle figures of the full cache are
 * written per depth, with needle_acc filled only where one reaches the
 * bar.  Skips when the shared models are absent.
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
	th_skip_emulated_engine("kvtrim-eval --quick on bytes2m (every "
	                        "policy over its held-out windows)");
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
	               "dnll,copy_acc,needle_acc,threshold\n");
	static const char *const want[] = {
		"full", "random", "streaming", "h2o", "snapkv", "tova",
		"kvzap-linear", "kvzap-mlp", "fastkvzip", "kvpop", "kvzip",
		"oracle"};
	int seen[12] = {0}, sweeps[2] = {0}, needles = 0;
	while (fgets(line, sizeof(line), f)) {
		/* 10 fields, empty ones allowed */
		char fld[10][64];
		int nf = 0;
		const char *p = line;
		for (;;) {
			size_t len = strcspn(p, ",\n");
			T_ASSERT(nf < 10 && len < 64);
			memcpy(fld[nf], p, len);
			fld[nf++][len] = 0;
			if (p[len] != ',')
				break;
			p += len + 1;
		}
		if (nf != 10)
			th_fail(__FILE__, __LINE__, "bad row: %s", line);
		const char *pol = fld[1];
		double ach = atof(fld[3]), kl = atof(fld[4]),
		       top1 = atof(fld[5]), dnll = atof(fld[6]);
		T_EQ_STR(fld[0], "bytes2m");
		for (int i = 0; i < 12; i++)
			if (!strcmp(pol, want[i]))
				seen[i] = 1;
		T_ASSERT(fld[3][0] && fld[4][0] && fld[5][0] && fld[7][0]);
		T_ASSERT(kl >= 0 && top1 >= 0 && top1 <= 1);
		T_ASSERT(ach >= 0 && ach < 1);
		needles += fld[8][0] != 0;
		int kvzap = !strncmp(pol, "kvzap-", 6);
		/* the threshold column: kvzap rows only */
		T_ASSERT(!!fld[9][0] == kvzap);
		if (!fld[2][0]) {
			/* a threshold-sweep row: kvzap, achieved ratio measured */
			T_ASSERT(kvzap);
			sweeps[!strcmp(pol, "kvzap-mlp")]++;
			T_ASSERT(ach > 0.1 && kl > 0);
			continue;
		}
		if (!strcmp(pol, "full")) {
			T_ASSERT(kl < 1e-6);
			T_ASSERT(top1 == 1.0);
			T_ASSERT(fabs(dnll) < 1e-5);
			T_ASSERT(ach == 0.0);
			T_ASSERT(atof(fld[7]) > 0.5); /* the model copies */
		} else {
			T_ASSERT(ach > 0.5); /* quick runs at ratio 0.75 */
			T_ASSERT(kl > 0);
		}
	}
	fclose(f);
	for (int i = 0; i < 12; i++)
		if (!seen[i])
			th_fail(__FILE__, __LINE__, "no row for %s", want[i]);
	T_ASSERT(sweeps[0] >= 1 && sweeps[1] >= 1);
	/* needles: the full cache's figures per depth; needle_acc is
	 * filled exactly when some depth reached the bar */
	snprintf(path, sizeof(path), "%s/out/needle-bytes2m.txt", th_tmpdir());
	f = fopen(path, "r");
	T_ASSERT(f);
	int depths = 0, pass = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned dep, nc;
		double dg, ex;
		char st[16];
		if (sscanf(line, "full %u %u %lf %lf %15s", &dep, &nc, &dg, &ex,
		           st) != 5)
			continue;
		depths++;
		T_ASSERT(nc >= 1 && dg >= 0 && dg <= 1 && ex >= 0 && ex <= dg);
		T_ASSERT(!strcmp(st, dg >= 0.5 ? "pass" : "below"));
		pass += dg >= 0.5;
	}
	fclose(f);
	T_ASSERT(depths == 4);
	T_ASSERT(pass ? needles > 0 : needles == 0);
	snprintf(path, sizeof(path), "%s/out/quality.md", th_tmpdir());
	T_ASSERT(access(path, R_OK) == 0);
	th_daemon_stop(&d);
}
