/* rundir.c — see rundir.h. */
#include "rundir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvtrim.h"

/* A holder that exits unlinks the file it locked: a contender that opened
 * that file just before then locks an orphan inode.  It notices (the path
 * names another inode, or none) and tries again, a few times at most. */
#define RUNDIR_LOCK_TRIES 8

void rundir_resolve(const char *given, char *out, size_t len)
{
	const char *e;
	if (given && given[0])
		snprintf(out, len, "%s", given);
	else if ((e = getenv("KVTRIM_RUNTIME_DIR")) && e[0])
		snprintf(out, len, "%s", e);
	else if ((e = getenv("XDG_RUNTIME_DIR")) && e[0])
		snprintf(out, len, "%s/kvtrim", e);
	else
		snprintf(out, len, "/run/kvtrimd");
}

static int lock_path(const char *dir, char *path, size_t len)
{
	int n = snprintf(path, len, "%s/%s", dir, RUNDIR_LOCK_NAME);
	if (n < 0 || (size_t)n >= len) {
		errno = ENAMETOOLONG;
		return KVT_ESYS;
	}
	return 0;
}

/* The pid the holder wrote (0 when the file says nothing usable yet). */
static long lock_holder(int fd)
{
	char buf[32];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	long pid = strtol(buf, NULL, 10);
	return pid > 0 ? pid : 0;
}

/* 1 when path still names the inode fd has open. */
static int same_file(int fd, const char *path)
{
	struct stat a, b;
	return fstat(fd, &a) == 0 && stat(path, &b) == 0 &&
	       a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int write_pid(int fd)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n)
		return KVT_ESYS;
	return 0;
}

int rundir_lock(const char *dir, int *fd, long *holder)
{
	char path[4096];
	int rc;

	*fd = -1;
	*holder = 0;
	if ((rc = lock_path(dir, path, sizeof(path))))
		return rc;
	for (int i = 0; i < RUNDIR_LOCK_TRIES; i++) {
		int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
		if (f < 0)
			return KVT_ESYS;
		while ((rc = flock(f, LOCK_EX | LOCK_NB)) < 0 && errno == EINTR)
			;
		if (rc < 0) {
			int e = errno;
			if (e == EWOULDBLOCK)
				*holder = lock_holder(f);
			close(f);
			errno = e;
			return e == EWOULDBLOCK ? KVT_EBUSY : KVT_ESYS;
		}
		if (!same_file(f, path)) {
			close(f); /* an orphan: its holder removed it meanwhile */
			continue;
		}
		if ((rc = write_pid(f))) {
			int e = errno;
			close(f);
			errno = e;
			return rc;
		}
		*fd = f;
		return 0;
	}
	errno = EAGAIN;
	return KVT_ESYS;
}

void rundir_unlock(const char *dir, int fd)
{
	char path[4096];
	if (fd < 0)
		return;
	/* Unlink first, while still holding the lock: a contender that opened
	 * the file meanwhile finds it orphaned and retries (rundir_lock). */
	if (!lock_path(dir, path, sizeof(path)) && same_file(fd, path))
		unlink(path);
	close(fd);
}

int rundir_lock_held(const char *dir, int fd)
{
	char path[4096];
	return fd >= 0 && !lock_path(dir, path, sizeof(path)) &&
	       same_file(fd, path);
}

/* The claim's abstract address for dir: sun_path[0] = 0, then the name
 * (not NUL-terminated: the length says where it ends). */
static socklen_t claim_addr(const char *dir, struct sockaddr_un *sa)
{
	char canon[PATH_MAX];
	const char *p = realpath(dir, canon) ? canon : dir;
	char name[sizeof(sa->sun_path)];
	int n = snprintf(name, sizeof(name), "kvtrimd-rundir:%s", p);
	if (n < 0 || (size_t)n >= sizeof(name) - 1) {
		/* FNV-1a: only collisions matter here, and a collision merely
		 * refuses a second daemon, saying who holds the claim. */
		uint64_t h = 1469598103934665603ull;
		for (const char *c = p; *c; c++)
			h = (h ^ (unsigned char)*c) * 1099511628211ull;
		n = snprintf(name, sizeof(name), "kvtrimd-rundir#%016llx",
		             (unsigned long long)h);
	}
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path + 1, name, (size_t)n);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* The pid listening on the claim address (SO_PEERCRED of a connection
 * to it, which the holder never accepts); 0 when it cannot be read. */
static long claim_holder(const struct sockaddr_un *sa, socklen_t len)
{
	int c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c < 0)
		return 0;
	struct ucred cr = {0};
	socklen_t cl = sizeof(cr);
	long pid = 0;
	if (connect(c, (const struct sockaddr *)sa, len) == 0 &&
	    getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
		pid = cr.pid;
	close(c);
	return pid;
}

int rundir_claim(const char *dir, int *fd, long *holder)
{
	struct sockaddr_un sa;
	socklen_t len = claim_addr(dir, &sa);
	*fd = -1;
	*holder = 0;
	int f = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (f < 0)
		return KVT_ESYS;
	/* Listening only so that a contender can learn the holder's pid;
	 * nothing is ever accepted. */
	if (bind(f, (const struct sockaddr *)&sa, len) < 0 || listen(f, 1) < 0) {
		int e = errno;
		close(f);
		if (e == EADDRINUSE) {
			*holder = claim_holder(&sa, len);
			errno = e;
			return KVT_EBUSY;
		}
		errno = e;
		return KVT_ESYS;
	}
	*fd = f;
	return 0;
}
