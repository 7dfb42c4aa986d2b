/*
 * table_test.c — kvtrim-eval's results files under --only: a rerun of
 * some policies replaces their rows and specs lines and keeps every other
 * one (the model's other policies, other models), checked against files
 * written by hand.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "test.h"

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	T_ASSERT(f != NULL);
	fputs(text, f);
	fclose(f);
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "r");
	T_ASSERT(f != NULL);
	static char buf[8192];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

/* A kvpop job at the target 0.75 that measured nothing yet. */
static void kvpop_job(struct job *j)
{
	memset(j, 0, sizeof(*j));
	snprintf(j->name, sizeof(j->name), "kvpop");
	j->ratio = 0.75;
}

TEST(eval_table, only_replaces_its_policies_rows_and_keeps_the_others)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/only.csv", th_tmpdir());
	write_file(path, TABLE_CSV_HEADER "\n"
	           "m,full,0.000,0.0000,0.000000,1.0000,0.00000,,,\n"
	           "m,h2o,0.750,0.7500,0.074000,0.8820,0.07340,,,\n"
	           "m,kvpop,0.750,0.7500,0.161000,0.8390,0.14680,,,\n"
	           "m,kvpopx,0.750,0.7500,0.200000,0.8000,0.20000,,,\n"
	           "other,kvpop,0.750,0.7500,0.500000,0.5000,0.50000,,,\n");
	static struct job jobs[1];
	kvpop_job(jobs);
	jobs[0].tau = NAN;
	jobs[0].kl = 0.2;   /* over 2 positions: 0.1 */
	jobs[0].top1 = 1.8;
	jobs[0].dnll = 0.4;
	jobs[0].npos = 2;
	jobs[0].ach = 1.5;  /* over 2: 0.75 */
	jobs[0].nach = 2;
	size_t nr;
	int bad = 1;
	struct row *rows = table_job_rows(path, "m", "h2o_x,kvpop", jobs, 1,
	                                  &nr, &bad);
	T_EQ(bad, 0);
	/* other's kvpop, m's full, h2o and kvpopx (not named: "kvpop" is
	 * matched whole), then the new kvpop */
	T_EQ(nr, 5);
	int kept[4] = {0};
	for (size_t i = 0; i + 1 < nr; i++) {
		kept[0] |= !strcmp(rows[i].model, "other");
		kept[1] |= !strcmp(rows[i].model, "m") &&
		           !strcmp(rows[i].policy, "full");
		kept[2] |= !strcmp(rows[i].model, "m") &&
		           !strcmp(rows[i].policy, "h2o") &&
		           fabs(rows[i].kl - 0.074) < 1e-9;
		kept[3] |= !strcmp(rows[i].policy, "kvpopx");
		T_ASSERT(strcmp(rows[i].model, "m") ||
		         strcmp(rows[i].policy, "kvpop"));
	}
	T_ASSERT(kept[0] && kept[1] && kept[2] && kept[3]);
	T_ASSERT(!strcmp(rows[4].model, "m") && !strcmp(rows[4].policy, "kvpop"));
	T_ASSERT(fabs(rows[4].kl - 0.1) < 1e-12);
	T_ASSERT(fabs(rows[4].ach - 0.75) < 1e-12);
	free(rows);

	/* without --only, the model's rows are all the run's */
	rows = table_job_rows(path, "m", NULL, jobs, 1, &nr, &bad);
	T_EQ(nr, 2);
	T_ASSERT(!strcmp(rows[0].model, "other"));
	free(rows);
}

TEST(eval_table, only_keeps_the_other_policies_specs)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/only-specs.txt", th_tmpdir());
	write_file(path, "# the run before\n"
	           "full 0.000 full\n"
	           "kvpop 0.750 kvpop:model=w/kvpop.safetensors,tokens=9\n"
	           "h2o 0.750 h2o:ratio=0.75\n");
	static struct job jobs[1];
	kvpop_job(jobs);
	snprintf(jobs[0].spec[C_MAIN], KVT_SPEC_MAX,
	         "kvpop:model=/abs/w/kvpop.safetensors,tokens=7");
	table_write_specs(path, "this run", "kvpop", jobs, 1, "/abs/w", "w");
	T_ASSERT(!strcmp(read_file(path),
	                 "# this run\n"
	                 "full 0.000 full\n"
	                 "h2o 0.750 h2o:ratio=0.75\n"
	                 "kvpop 0.750 kvpop:model=w/kvpop.safetensors,"
	                 "tokens=7\n"));
	/* without --only the file is the run's alone */
	table_write_specs(path, "again", NULL, jobs, 1, "/abs/w", "w");
	T_ASSERT(!strcmp(read_file(path),
	                 "# again\n"
	                 "kvpop 0.750 kvpop:model=w/kvpop.safetensors,"
	                 "tokens=7\n"));
}
