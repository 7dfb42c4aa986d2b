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

#endif
