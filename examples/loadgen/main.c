/*
 * main.c — kvtrim-loadgen: synthetic inference engines for kvtrimd.
 *
 * Forks N engine processes; each registers a tenant (PREFIX-i), opens M
 * sequences and appends tokens whose K/V bytes encode who wrote them and
 * at which position, so every surviving entry can be checked byte for byte
 * after any compaction (--verify).  The pattern, the verification, device
 * pages, the summary line and the soak options are in docs/loadgen.md.
 * Engines die with loadgen (PR_SET_PDEATHSIG).  This file is the parent
 * (fork, wait, respawn, the summary line); loadgen.h lists the other
 * files of examples/loadgen/.
 */
#include "kvtrim.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loadgen.h"
#include "policy.h"

/*
 * Forks engine `client` (generation gen); its pid, or -1.  An engine dies
 * with loadgen: killed with SIGKILL when the parent dies (even by SIGKILL,
 * which the parent cannot forward), so no engine runs on for its whole run
 * holding pool pages.  A parent that died between fork and the prctl is
 * caught by the getppid check (the child was already reparented).
 */
static pid_t spawn(const struct opts *o, const struct model *m, int has_model,
                   uint32_t client, uint32_t gen, const int *pfd)
{
	pid_t parent = getpid();
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("kvtrim-loadgen: fork");
		return -1;
	}
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 ||
		    getppid() != parent)
			_exit(1);
		close(pfd[0]);
		int st = engine_main(o, m, has_model, client, gen, pfd[1]);
		fflush(NULL);
		_exit(st);
	}
	return pid;
}

int main(int argc, char **argv)
{
	struct opts o;
	if (options_parse(argc, argv, &o) < 0)
		return 2;
	static char spec[KVT_SPEC_MAX + 160];
	if (prepare_policy(&o, spec, sizeof(spec)) < 0) {
		prepare_remove_scratch(&o);
		return 2;
	}
	struct model m;
	char why[256];
	int has_model = 0;
	if (o.verify) {
		int mr = model_parse(o.policy, &m, why, sizeof(why));
		if (mr < 0) {
			fprintf(stderr, "verify: %s\n", why);
			prepare_remove_scratch(&o);
			return 2;
		}
		has_model = mr == 0;
	}

	int pfd[2];
	if (pipe(pfd) < 0) {
		perror("kvtrim-loadgen: pipe");
		return 2;
	}
	pid_t *pids = calloc(o.clients, sizeof(*pids));
	uint32_t *gens = calloc(o.clients, sizeof(*gens));
	uint8_t *got = calloc(o.clients, 1);
	if (!pids || !gens || !got) {
		fprintf(stderr, "kvtrim-loadgen: out of memory\n");
		return 2;
	}
	double t0 = report_now_s();
	uint32_t started = 0, running = 0, respawned = 0;
	for (; started < o.clients; started++) {
		if ((pids[started] = spawn(&o, &m, has_model, started, 0,
		                           pfd)) < 0)
			break;
		running++;
	}
	/* The read end only polls: reports are written before a child
	 * exits, so after its waitpid they are all in the pipe.  The write
	 * end stays open here for engines respawned later. */
	int fl = fcntl(pfd[0], F_GETFL);
	if (fl < 0 || fcntl(pfd[0], F_SETFL, fl | O_NONBLOCK) < 0) {
		perror("kvtrim-loadgen: pipe");
		return 2;
	}

	struct totals tot = {.memory = -1};
	uint32_t killed = 0, failed = started < o.clients;
	while (running) {
		int st;
		pid_t pid = waitpid(-1, &st, 0);
		if (pid < 0) {
			if (errno == EINTR)
				continue;
			perror("kvtrim-loadgen: waitpid");
			failed += running;
			break;
		}
		report_read(pfd[0], &o, gens, got, &tot);
		uint32_t i = 0;
		while (i < started && pids[i] != pid)
			i++;
		if (i == started)
			continue; /* not an engine of ours */
		running--;
		int sigkill = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
		if (sigkill && ((i == 0 && o.kill_after && !gens[i]) ||
		                o.expect_kills)) {
			killed++;
			if (o.expect_kills && respawned < o.respawn) {
				pid_t np = spawn(&o, &m, has_model, i,
				                 gens[i] + 1, pfd);
				if (np > 0) {
					pids[i] = np;
					gens[i]++;
					got[i] = 0;
					respawned++;
					running++;
				}
			}
			continue;
		}
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !got[i]) {
			if (WIFSIGNALED(st))
				fprintf(stderr, "loadgen[%u]: killed by signal "
				        "%d\n", i, WTERMSIG(st));
			failed++;
		}
	}
	report_read(pfd[0], &o, gens, got, &tot);
	close(pfd[0]);
	close(pfd[1]);

	double elapsed = report_now_s() - t0;
	report_print(&o, &tot, killed, failed, respawned, elapsed);
	free(gens);
	free(pids);
	free(got);
	policy_free(o.pol);
	prepare_remove_scratch(&o);
	return failed || tot.mismatches ? 1 : 0;
}
