/*
 * main.c — kvtrim-loadgen: synthetic inference engines for kvtrimd.
 *
 * Forks N engine processes; each registers a tenant (PREFIX-i), opens M
 * sequences and for S steps appends one token to every sequence, writing K
 * and V of every (layer, KV head) through kvt_kv_ptr with a pattern that
 * encodes who wrote it and at which position:
 *
 *   V bytes 0..3  position (uint32 little-endian)
 *   V bytes 4..7  tag = hash(seed, client, sequence index, layer, head)
 *   V bytes 8..   hash(tag, position, byte index, 1) & 0xff
 *   K element e   a float in [-1, 1) from hash(tag, position, e, 0), stored
 *                 in the tenant dtype (proper keys, so attention-based
 *                 policies see real weights)
 *
 * so after any amount of compaction every surviving entry can be decoded
 * and checked byte for byte.  Policies that read staged inputs get x and q
 * pseudo-random from (seed, position, sequence, layer) and the true lse of
 * each query head over its list (paged_attention_cpu, like an engine).
 *
 * --verify checks the kept positions after every sync.  full and streaming
 * against an independent model written here (never the daemon's policy
 * code), so a bug shared by the daemon and its checker cannot hide; every
 * other policy against an in-process replay of the same policy code on a
 * shadow copy of each list (positions, per-entry state, layer state, in the
 * daemon's order), fed the same inputs: the daemon's pages before the sync
 * and the staged rows.  Learned policies without model= get random seeded
 * weights written (weights_write) into a scratch directory; the spec sent to
 * the daemon names them.  --prefill N sends the first N tokens as prefill
 * syncs (snapkv acts at the first decode sync).
 *
 * Pages in device memory (a tenant of kvtrimd --backend cuda, where
 * kvt_memory_kind() says KVT_MEMORY_CUDA): every byte goes through
 * kvt_memcpy.  Each entry's K and V rows are built in a host buffer and
 * copied to kvt_kv_ptr's addresses (two copies per list and token); to
 * read a list (--verify, the lse of staged policies, the replay) its pages
 * are copied into host memory first, one copy per run of consecutive page
 * ids in one chunk, as each kvt_memcpy waits for the stream.  On host
 * pages loadgen reads and writes them in place, as before.  The staging
 * segment is host memory on both.
 *
 * Engines die with loadgen (PR_SET_PDEATHSIG): a SIGKILLed loadgen leaves
 * no engine running.  Children report their counts through a pipe; the
 * parent prints one summary line (memory=host|cuda: where the engines'
 * pages were; "mixed" when engines disagreed) and exits 0 only when every
 * child succeeded (a child killed on purpose with --kill-after-steps does
 * not count as a failure).
 *
 * Soak options (scripts/soak.sh): --retry-full backs off and retries a sync
 * or sequence open that the full pool refused (KVT_EPOOLFULL), for up to
 * 120 s; --expect-kills counts a child killed by SIGKILL from outside as
 * killed, not failed, and --respawn N starts up to N replacement engines
 * (tenant PREFIX-i.G) for killed ones; --tolerate-pressure lets --verify
 * accept extra evictions, which memory pressure causes by shrinking
 * budgets and raising thresholds: every entry kept must still be intact
 * and one the policy keeps, and the verifier then adopts the daemon's
 * extra evictions (counted as pressure_evicted) and checks everything after
 * against them.  The summary adds sync latency percentiles measured
 * around kvt_sync (a retried sync counts once, from its first attempt).
 *
 * This file is the parent (fork, wait, respawn, the summary line);
 * loadgen.h lists the other files of examples/loadgen/.
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
