/*
 * rundir_test.c — the runtime dir's lock (rundir_lock / rundir_unlock) and
 * the daemon log's rate limit (log_rate_due).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvtrim.h"
#include "log.h"
#include "rundir.h"
#include "test.h"

/* flock locks belong to an open file description, so a second
 * rundir_lock in the same process contends like another process would. */
TEST(rundir, lock_is_exclusive_and_names_its_holder)
{
	char path[600], buf[32];
	int fd, fd2;
	long holder;
	struct stat st;
	const char *dir = th_tmpdir();
	snprintf(path, sizeof(path), "%s/%s", dir, RUNDIR_LOCK_NAME);

	T_OK(rundir_lock(dir, &fd, &holder));
	T_ASSERT(fd >= 0);
	T_ASSERT(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	int f = open(path, O_RDONLY);
	T_ASSERT(f >= 0);
	ssize_t n = read(f, buf, sizeof(buf) - 1);
	close(f);
	T_ASSERT(n > 0);
	buf[n] = '\0';
	T_EQ(atol(buf), (long)getpid());

	T_ERR(rundir_lock(dir, &fd2, &holder), KVT_EBUSY);
	T_EQ(fd2, -1);
	T_EQ(holder, (long)getpid());

	rundir_unlock(dir, fd);
	T_EQ(stat(path, &st), -1); /* the holder removed it */
	T_OK(rundir_lock(dir, &fd2, &holder));
	rundir_unlock(dir, fd2);
	rundir_unlock(dir, -1); /* no-op */
}

/* A file left by a dead holder (nobody has it locked) is taken over. */
TEST(rundir, stale_lock_file_is_taken_over)
{
	char path[600];
	int fd;
	long holder;
	const char *dir = th_tmpdir();
	snprintf(path, sizeof(path), "%s/%s", dir, RUNDIR_LOCK_NAME);
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fputs("999999999\n", f);
	fclose(f);
	T_OK(rundir_lock(dir, &fd, &holder));
	char buf[32] = "";
	T_ASSERT(pread(fd, buf, sizeof(buf) - 1, 0) > 0);
	T_EQ(atol(buf), (long)getpid()); /* rewritten, no stale digits left */
	rundir_unlock(dir, fd);
}

TEST(rundir, lock_in_a_missing_dir_fails)
{
	int fd;
	long holder;
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/no/such/dir", th_tmpdir());
	T_ERR(rundir_lock(dir, &fd, &holder), KVT_ESYS);
	T_EQ(fd, -1);
}

TEST(log, rate_one_record_per_interval_with_the_count_held_back)
{
	struct log_rate r = {0, 0};
	uint64_t held = 77;
	T_EQ(log_rate_due(&r, 1000, 5000, &held), 1);
	T_EQ_U64(held, 0);
	for (int i = 0; i < 10; i++) /* t = 1000 .. 5500: inside */
		T_EQ(log_rate_due(&r, 1000 + (uint64_t)i * 500, 5000, &held), 0);
	T_EQ(log_rate_due(&r, 5999, 5000, &held), 0);
	T_EQ(log_rate_due(&r, 6000, 5000, &held), 1);
	T_EQ_U64(held, 11);
	T_EQ(log_rate_due(&r, 20000, 5000, &held), 1);
	T_EQ_U64(held, 0);
}
