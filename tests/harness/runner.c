/*
 * runner.c — forks each registered test with a timeout and prints the
 * closing "N passed, N failed, N skipped" line.  Exit status 1 when any
 * test failed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define TH_MAX_TESTS 1024
#define TH_EXIT_SKIP 77

struct th_test {
	const char *suite, *name;
	const char *file; /* source file, as the compiler named it */
	th_fn fn;
	int timeout_s;
};

static struct th_test th_tests[TH_MAX_TESTS];
static int th_n;
static char th_dir[256];

void th_register(const char *suite, const char *name, const char *file,
                 th_fn fn, int timeout_s)
{
	if (th_n < TH_MAX_TESTS)
		th_tests[th_n++] =
			(struct th_test){suite, name, file, fn, timeout_s};
}

void th_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "    %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
	_exit(1);
}

void th_skip(const char *why)
{
	fprintf(stderr, "    skip: %s\n", why);
	fflush(stderr);
	_exit(TH_EXIT_SKIP);
}

const char *th_tmpdir(void)
{
	return th_dir;
}

static int matches(const struct th_test *t, int argc, char **argv)
{
	char full[256];
	if (argc < 2)
		return 1;
	snprintf(full, sizeof(full), "%s.%s", t->suite, t->name);
	for (int i = 1; i < argc; i++) {
		size_t n = strlen(argv[i]);
		int by_file = strchr(argv[i], '/') ||
		              (n >= 7 && !strcmp(argv[i] + n - 7, "_test.c"));
		if (strstr(by_file ? t->file : full, argv[i]))
			return 1;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void rm_rf(const char *dir)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "    warning: could not remove %s\n", dir);
}

int main(int argc, char **argv)
{
	int passed = 0, failed = 0, skipped = 0;
	signal(SIGPIPE, SIG_IGN);
	for (int i = 0; i < th_n; i++) {
		struct th_test *t = &th_tests[i];
		if (!matches(t, argc, argv))
			continue;
		snprintf(th_dir, sizeof(th_dir), "/tmp/kvt-test-%d-%d",
		         (int)getpid(), i);
		mkdir(th_dir, 0700);
		fflush(stdout);
		double t0 = now_s();
		pid_t pid = fork();
		if (pid == 0) {
			setpgid(0, 0);
			alarm((unsigned)t->timeout_s);
			t->fn();
			fflush(stdout);
			_exit(0);
		}
		int st = 0;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		/* Reap whatever the test left behind (daemons, engines). */
		kill(-pid, SIGKILL);
		double dt = now_s() - t0;
		const char *verdict;
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
			verdict = "ok";
			passed++;
		} else if (WIFEXITED(st) && WEXITSTATUS(st) == TH_EXIT_SKIP) {
			verdict = "skip";
			skipped++;
		} else {
			verdict = "FAIL";
			failed++;
			if (WIFSIGNALED(st))
				fprintf(stderr, "    killed by signal %d%s\n",
				        WTERMSIG(st),
				        WTERMSIG(st) == SIGALRM ? " (timeout)"
				                                : "");
		}
		printf("%-4s %s.%s (%.2fs)\n", verdict, t->suite, t->name, dt);
		fflush(stdout);
		rm_rf(th_dir);
	}
	printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
	return failed ? 1 : 0;
}
