/* rundir.c — see rundir.h. */
#include "rundir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
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
