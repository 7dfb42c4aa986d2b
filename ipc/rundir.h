/*
 * rundir.h — where the daemon's sockets live, resolved the same way by the
 * daemon, libkvtrim and the tools: the explicit value, else
 * $KVTRIM_RUNTIME_DIR, else $XDG_RUNTIME_DIR/kvtrim, else /run/kvtrimd (the
 * systemd RuntimeDirectory).
 */
#ifndef KVT_RUNDIR_H
#define KVT_RUNDIR_H

#include <stddef.h>

void rundir_resolve(const char *given, char *out, size_t len);

/* The lock file inside the runtime dir; it holds the owner's pid. */
#define RUNDIR_LOCK_NAME "kvtrimd.lock"

/*
 * One daemon owns a runtime dir at a time.  Takes dir/kvtrimd.lock: opens
 * (or creates, mode 0644) it close-on-exec, flock(LOCK_EX | LOCK_NB), and
 * writes the caller's pid into it.  The lock lasts as long as *fd stays
 * open; the kernel drops it when the process dies (SIGKILL included), so a
 * file left by a dead daemon is simply taken over.  Returns 0 and *fd, or
 * KVT_EBUSY when a live process holds it (*holder = its pid as the file
 * says, 0 when unreadable), or KVT_ESYS (errno says why).  Only after 0 may
 * the caller remove stale socket files of the dir.
 */
int rundir_lock(const char *dir, int *fd, long *holder);

/* Removes the lock file, then closes fd (which drops the lock).  Only the
 * holder calls it, at exit, after removing its sockets.  fd < 0: no-op. */
void rundir_unlock(const char *dir, int fd);

/* 1 while dir/kvtrimd.lock still names the file fd locked (rundir_lock);
 * 0 once it was removed or replaced, or the dir with it. */
int rundir_lock_held(const char *dir, int fd);

/*
 * The claim on a runtime dir that removing the dir cannot undo: a
 * listening abstract Unix socket named after the dir's canonical path
 * ("kvtrimd-rundir:PATH", or a hash of PATH where it does not fit), which
 * the kernel keeps as long as *fd is open, whatever happens to the files.
 * A second daemon on a dir that was removed and made again under the first
 * is refused here, where the lock file (a new one in the new dir) would
 * let it in.  It holds within one network namespace (abstract names live
 * there); the lock file covers the rest.  Returns 0 and *fd, or KVT_EBUSY
 * when another process holds it (*holder = its pid, from the kernel, 0
 * when it cannot be read), or KVT_ESYS (errno).  Call it before
 * rundir_lock, after the dir exists.
 */
int rundir_claim(const char *dir, int *fd, long *holder);

#endif
