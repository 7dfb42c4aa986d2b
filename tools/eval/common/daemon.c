/*
 * daemon.c — how kvtrim-eval ends: the kvtrimd it started (when no
 * --runtime-dir was given) and its scratch directory never outlive it,
 * whether it dies on an error or is interrupted.
 */
#include "eval.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t daemon_pid;
static char rt_tmp[256];

void eval_daemon_stop(void)
{
	if (daemon_pid > 0) {
		kill(daemon_pid, SIGTERM);
		waitpid(daemon_pid, NULL, 0);
		daemon_pid = 0;
	}
	if (rt_tmp[0]) {
		char cmd[300];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rt_tmp);
		if (system(cmd) != 0)
			fprintf(stderr, "kvtrim-eval: could not remove %s\n",
			        rt_tmp);
		rt_tmp[0] = 0;
	}
}

void eval_die(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "kvtrim-eval: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	eval_daemon_stop();
	exit(1);
}

/* SIGINT / SIGTERM: the daemon this run started must not outlive it. */
void eval_on_signal(int sig)
{
	if (daemon_pid > 0)
		kill(daemon_pid, SIGTERM);
	signal(sig, SIG_DFL);
	raise(sig);
}

void eval_daemon_start(const char *argv0, char *rt, size_t rtlen)
{
	char exe[PATH_MAX], bin[PATH_MAX + 16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		snprintf(exe, sizeof(exe), "%s", argv0);
	else
		exe[n] = 0;
	char *slash = strrchr(exe, '/');
	if (slash)
		*slash = 0;
	snprintf(bin, sizeof(bin), "%s/kvtrimd", slash ? exe : ".");
	snprintf(rt_tmp, sizeof(rt_tmp), "/tmp/kvtrim-eval.XXXXXX");
	if (!mkdtemp(rt_tmp))
		eval_die("mkdtemp: %s", strerror(errno));
	snprintf(rt, rtlen, "%s/rt", rt_tmp);
	char logp[300];
	snprintf(logp, sizeof(logp), "%s/kvtrimd.log", rt_tmp);
	pid_t pid = fork();
	if (pid < 0)
		eval_die("fork: %s", strerror(errno));
	if (pid == 0) {
		int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		/* one client process, this one: its tenants may hold the
		 * whole pool (expected_tenants 1 lifts the per-uid and
		 * per-process shares, which would leave it half: the
		 * decoding-time needle's 8 windows of 5 or 6 jobs need more) */
		execl(bin, bin, "--runtime-dir", rt, "--backend", "cpu",
		      "--pool-size", "2048M", "--high-watermark", "1",
		      "--expected-tenants", "1", "--log-level", "warning",
		      (char *)NULL);
		_exit(127);
	}
	daemon_pid = pid;
	for (int i = 0; i < 500; i++) {
		char p[3][400];
		snprintf(p[0], 400, "%.380s/ctl.ipc", rt);
		snprintf(p[1], 400, "%.380s/fd.sock", rt);
		snprintf(p[2], 400, "%.380s/stats.sock", rt);
		if (!access(p[0], F_OK) && !access(p[1], F_OK) &&
		    !access(p[2], F_OK))
			return;
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			daemon_pid = 0;
			eval_die("%s exited at start (log %s)", bin, logp);
		}
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	eval_die("%s did not start in 5 s", bin);
}

void eval_runtime_dir(const char *given, const char *argv0, char *rt,
                      size_t rtlen)
{
	if (given)
		snprintf(rt, rtlen, "%s", given);
	else
		eval_daemon_start(argv0, rt, rtlen);
}
