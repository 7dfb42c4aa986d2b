/*
 * daemon.h — integration-test helpers: start the real kvtrimd on a scratch
 * runtime directory, run the real tools, and talk raw nng to the control
 * socket for bad-input tests.  Binaries come from $KVTRIM_BIN_DIR
 * (default build/bin).
 */
#ifndef KVT_TH_DAEMON_H
#define KVT_TH_DAEMON_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvtrim.h"

struct th_daemon {
	pid_t pid;
	char dir[256];  /* runtime dir */
	char log[300];  /* daemon stderr */
};

/* The backend the tests run kvtrimd with: $KVTRIM_BACKEND (cpu, cuda or
 * auto), default "cpu". */
const char *th_backend(void);

/* Monotonic clock in milliseconds; a sleep of ms milliseconds. */
uint64_t th_now_ms(void);
void th_sleep_ms(int ms);

/* Path of a built binary. */
const char *th_bin(const char *name);

/*
 * Starts kvtrimd --runtime-dir <tmp>/rt --backend <th_backend()> --pool-size pool
 * plus extra args (NULL-terminated, may be NULL) and waits until its three
 * sockets exist (fails the test after 5 s).  Socket files a killed daemon
 * left in that directory are removed first, so a restart waits for the
 * new daemon's; while a live kvtrimd holds the directory's lock
 * (kvtrimd.lock) they are its own and stay.  The daemon inherits the test's environment (set
 * NOTIFY_SOCKET and the like with setenv before).
 */
void th_daemon_start(struct th_daemon *d, const char *pool,
                     const char *const *extra);

/* th_daemon_start with an explicit backend ("cpu", "cuda") and runtime
 * directory <tmp>/name (log <tmp>/kvtrimd-name.log), so one test can run
 * daemons of both backends side by side; name "rt" is th_daemon_start's. */
void th_daemon_start_as(struct th_daemon *d, const char *backend,
                        const char *name, const char *pool,
                        const char *const *extra);

/* Like th_daemon_start without the wait: the caller decides when the
 * daemon is up (e.g. from its READY=1). */
void th_daemon_spawn(struct th_daemon *d, const char *pool,
                     const char *const *extra);

/*
 * Daemons spawned after this call run with RLIMIT_NOFILE n, soft and hard
 * (so kvtrimd cannot raise it); 0 (the default) inherits the test's.
 */
void th_daemon_set_nofile(unsigned long n);

/* SIGTERM and wait (5 s at most); returns the exit status, -1 if killed. */
int th_daemon_stop(struct th_daemon *d);

/* 1 while the daemon process is alive. */
int th_daemon_alive(const struct th_daemon *d);

/*
 * Runs a shell command (with KVTRIM_RUNTIME_DIR set to d->dir when d is not
 * NULL), captures stdout+stderr into out, returns its exit status.
 */
int th_sh(const struct th_daemon *d, char *out, size_t outlen,
          const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/*
 * Sends raw bytes to ctl.ipc with a fresh req0 socket and returns the reply
 * bytes (malloc'ed into *rep, *replen) or a negative KVT code (timeout
 * 3 s).
 */
int th_raw_req(const struct th_daemon *d, const void *buf, size_t len,
               uint8_t **rep, size_t *replen);

/*
 * A persistent raw control connection (one nng pipe), for tests that must
 * register a tenant by hand: tenants are bound to the pipe of their hello.
 * th_raw_conn returns a socket id (> 0) or fails the test.
 */
uint32_t th_raw_conn(const struct th_daemon *d);
int th_raw_call(uint32_t sock, const void *buf, size_t len, uint8_t **rep,
                size_t *replen);
void th_raw_close(uint32_t sock);

/*
 * A control-socket peer that never reads: a plain AF_UNIX stream socket
 * speaking nng's IPC wire format by hand (the SP handshake as a req0 peer,
 * then length-framed messages each led by a 4-byte request id), so nothing
 * drains the daemon's replies and its sends to this peer back up, as with
 * a hostile or wedged client.  th_silent_peer connects and returns the fd
 * (fails the test when ctl.ipc cannot be reached); th_silent_peer_try
 * returns -1 instead (a peer the daemon refuses at accept may see its
 * header's write fail); th_silent_send writes
 * `count` copies of body as requests with fresh ids and returns how many
 * the kernel took before `budget_ms` ran out (the peer's own socket buffer
 * fills once the daemon stops reading, which is also what the test wants
 * to see); the caller closes the fd.
 */
int th_silent_peer(const struct th_daemon *d);
/* A blocking stream connection to ctl.ipc, nothing sent; -1 when it
 * cannot connect. */
int th_ctl_connect(const struct th_daemon *d);
int th_silent_peer_try(const struct th_daemon *d);
uint32_t th_silent_send(int fd, const void *body, size_t len, uint32_t count,
                        int budget_ms);

/*
 * The first step of a registration by hand: connects to fd.sock and reads
 * its WELCOME.  0 with *hfd open and *cookie set, or a negative code with
 * nothing left open (never fails the test: the bench's adversaries use it).
 */
int th_raw_welcome(const struct th_daemon *d, int *hfd, uint64_t *cookie);

/*
 * Encodes q, sends it on the raw connection sock (0: a fresh one for this
 * request) and decodes the reply into *r (the caller frees it with
 * codec_rep_free; its code is r->err).  Returns 0 when a reply was
 * decoded, else a negative code (why says which); never fails the test.
 */
struct ipc_req;
struct ipc_rep;
int th_raw_request(const struct th_daemon *d, uint32_t sock,
                   const struct ipc_req *q, struct ipc_rep *r, char *why,
                   size_t wlen);

/* An encoded {v, op: "stats"} request (malloc'ed; the caller frees it). */
uint8_t *th_stats_req(size_t *len);

/* Reads one numeric key from `kvtrimctl stats` (fails the test if absent). */
uint64_t th_stat(const struct th_daemon *d, const char *key);

/* Process pid's resident set (VmRSS), in KiB. */
long th_rss_kib(pid_t pid);

/* SIGKILL and reap (no drain, socket files stay behind). */
void th_daemon_kill(struct th_daemon *d);

/*
 * GET path from the stats socket with curl (skips the test when curl is
 * missing); returns the HTTP status, 0 when no answer came.  The body goes
 * to out (truncated to outlen).  method NULL means GET.
 */
int th_http(const struct th_daemon *d, const char *method, const char *path,
            char *out, size_t outlen);

/*
 * The value of one sample of GET /metrics, named exactly as exposed
 * ("kvtrim_tenant_sequences{tenant=\"a\",id=\"1\"}"); fails the test when
 * absent.
 */
double th_metric(const struct th_daemon *d, const char *series);

/* Like th_metric, but -1 when the series is absent. */
double th_metric_or(const struct th_daemon *d, const char *series);

/*
 * Registration parameters of the small model the integration tests use:
 * 2 layers, 4 query heads, 2 KV heads, head_dim 8, d_model 32, f32, pages of
 * 4 entries (256 bytes), 4 sequences of at most 64 entries, headroom 4,
 * timeout 3 s.
 */
/* The held-out text (../shared/models/bytes2m-valid.txt, shared data that a
 * fresh clone lacks): returns when it is readable, else skips the test. */
#define TH_HELDOUT "../shared/models/bytes2m-valid.txt"
void th_need_heldout(void);
/* Skips unless kvtrim-eval can run on SmolLM2: the model in its cache
 * (model_files_resolve), kvtrim-eval built, the held-out text there. */
void th_need_smollm2_eval(void);

/*
 * Stages one token's inputs (position p, layer l): x = 0.25 each, q = q[i]
 * (NULL: 0.1 each; [n_heads * head_dim]), lse = ln(p + 1), each only in
 * the parts the tenant's policy reads, and asserts exactly those parts
 * are there (kvt_policy_inputs; the others have no room: NULL).
 */
void th_stage_row(kvt_client *c, kvt_seq s, uint32_t l, uint32_t p,
                  const float *q);

/*
 * Writes bytes of host memory into a tenant's pages or staging rows (or
 * reads them back: either side may be host memory) through kvt_memcpy,
 * which on a cuda tenant is a device copy: staging rows and pages are
 * device memory there (kvt_stage_*, kvt_kv_ptr), never to be dereferenced
 * by the test.  th_put_f32 stores one float.
 */
void th_put(kvt_client *c, void *dst, const void *src, size_t bytes);
void th_put_f32(kvt_client *c, float *dst, float v);

/*
 * Skips the test on the emulated cuda backend (KVTRIM_BACKEND=cuda with
 * KVTRIM_CUDA_EMU set, the cuda passes of `make test`), saying `what` it
 * runs: for tests that feed a model hundreds of tokens through the
 * reference engine on a daemon, whose attention there is the CUDA kernel
 * on the CPU emulator, some 40 times slower than the CPU kernel (a
 * SmolLM2 prefill of 530 tokens: about 340 s).  The engine on the cuda
 * backend is checked there on bytes2m (engine_backends); on a GPU these
 * tests run.
 */
void th_skip_emulated_engine(const char *what);

struct kvt_config th_small_cfg(const struct th_daemon *d, const char *name,
                               const char *policy);

#endif
