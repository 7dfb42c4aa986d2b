/*
 * handle_test.c — the handle channel: fd passing over SEQPACKET, packet
 * validation without fd leaks, timeouts, peer close, listen/connect/accept.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "handle.h"
#include "test.h"

/* Open fds of this process (the directory's own fd counted each time). */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;
	T_ASSERT(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static void pair(int sv[2])
{
	T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
}

static struct handle_msg msg(uint16_t type, uint32_t slot, uint64_t size)
{
	struct handle_msg m;
	memset(&m, 0, sizeof(m));
	m.magic = HANDLE_MAGIC;
	m.type = type;
	m.slot = slot;
	m.size = size;
	return m;
}

/* A memfd of size bytes filled with a pattern derived from seed. */
static int make_memfd(size_t size, uint8_t seed)
{
	int fd = memfd_create("kvt-test", MFD_CLOEXEC);
	T_ASSERT(fd >= 0);
	T_ASSERT(ftruncate(fd, (off_t)size) == 0);
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	T_ASSERT(p != MAP_FAILED);
	for (size_t i = 0; i < size; i++)
		p[i] = (uint8_t)(seed + i * 31);
	munmap(p, size);
	return fd;
}

/* Sends raw bytes with nfds fds attached, bypassing handle_send's checks. */
static void raw_send(int sock, const void *buf, size_t len, const int *fds,
                     int nfds)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	T_EQ(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

TEST(handle, chunk_add_maps_senders_bytes)
{
	int sv[2];
	pair(sv);
	size_t size = 2 << 20;
	int fd = make_memfd(size, 7);
	struct handle_msg m = msg(HANDLE_CHUNK_ADD, 5, size);
	T_OK(handle_send(sv[0], &m, fd));
	close(fd); /* the receiver's copy keeps the memory alive */

	struct handle_msg got;
	int rfd = -2;
	T_OK(handle_recv(sv[1], &got, &rfd, 1000));
	T_EQ(got.magic, HANDLE_MAGIC);
	T_EQ(got.type, HANDLE_CHUNK_ADD);
	T_EQ(got.slot, 5);
	T_EQ_U64(got.size, size);
	T_ASSERT(rfd >= 0);
	T_ASSERT(fcntl(rfd, F_GETFD) & FD_CLOEXEC);
	uint8_t *p = mmap(NULL, size, PROT_READ, MAP_SHARED, rfd, 0);
	T_ASSERT(p != MAP_FAILED);
	for (size_t i = 0; i < size; i += 4093)
		T_EQ(p[i], (uint8_t)(7 + i * 31));
	munmap(p, size);
	close(rfd);
	close(sv[0]);
	close(sv[1]);
}

TEST(handle, table_stage_revoke_in_order)
{
	int sv[2];
	pair(sv);
	int t = make_memfd(4096, 1), s = make_memfd(8192, 2);
	struct handle_msg m = msg(HANDLE_TABLE, 0, 4096);
	T_OK(handle_send(sv[0], &m, t));
	m = msg(HANDLE_STAGE, 0, 8192);
	T_OK(handle_send(sv[0], &m, s));
	m = msg(HANDLE_CHUNK_REVOKE, 9, 0);
	T_OK(handle_send(sv[0], &m, -1));
	close(t);
	close(s);

	struct handle_msg got;
	int fd;
	T_OK(handle_recv(sv[1], &got, &fd, 1000));
	T_EQ(got.type, HANDLE_TABLE);
	struct stat st;
	T_ASSERT(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 4096);
	close(fd);
	T_OK(handle_recv(sv[1], &got, &fd, 1000));
	T_EQ(got.type, HANDLE_STAGE);
	T_ASSERT(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 8192);
	close(fd);
	T_OK(handle_recv(sv[1], &got, &fd, 1000));
	T_EQ(got.type, HANDLE_CHUNK_REVOKE);
	T_EQ(got.slot, 9);
	T_EQ(fd, -1);
	close(sv[0]);
	close(sv[1]);
}

TEST(handle, welcome_cookie)
{
	int sv[2];
	pair(sv);
	struct handle_msg m = msg(HANDLE_WELCOME, 0, 0), got;
	m.cookie = 0xfedcba9876543210ull;
	T_OK(handle_send(sv[1], &m, -1));
	int fd = 123;
	T_OK(handle_recv(sv[0], &got, &fd, -1));
	T_EQ(got.type, HANDLE_WELCOME);
	T_EQ_U64(got.cookie, 0xfedcba9876543210ull);
	T_EQ(fd, -1);
	close(sv[0]);
	close(sv[1]);
}

struct bad_case {
	const char *what;
	const void *buf;
	size_t len;
	int nfds;
};

/* Each bad packet is refused with KVT_EPROTO, every fd it carried is
 * closed, and the channel stays usable for the next good packet. */
TEST(handle, refuses_bad_packets_without_leaks)
{
	int sv[2];
	pair(sv);
	int mfd = make_memfd(4096, 3);
	struct handle_msg good = msg(HANDLE_CHUNK_ADD, 1, 4096), got;
	uint8_t big[sizeof(good) + 8];
	int fds2[2] = {mfd, mfd};
	int base = count_fds();

	struct bad_case cases[16];
	int nc = 0;
	static struct handle_msg v[8];
	v[0] = good;
	v[0].magic ^= 1;
	v[1] = good;
	v[1].type = 0;
	v[2] = good;
	v[2].type = 6;
	v[3] = good;
	v[3].flags = 1;
	v[4] = good;
	v[4].size = 0;
	v[5] = msg(HANDLE_WELCOME, 0, 0);
	v[6] = msg(HANDLE_CHUNK_REVOKE, 1, 0);
	memset(big, 0, sizeof(big));
	memcpy(big, &good, sizeof(good));

	cases[nc++] = (struct bad_case){"short", &good, sizeof(good) - 1, 1};
	cases[nc++] = (struct bad_case){"long", big, sizeof(big), 1};
	cases[nc++] = (struct bad_case){"magic", &v[0], sizeof(good), 1};
	cases[nc++] = (struct bad_case){"type 0", &v[1], sizeof(good), 1};
	cases[nc++] = (struct bad_case){"type 6", &v[2], sizeof(good), 1};
	cases[nc++] = (struct bad_case){"flags", &v[3], sizeof(good), 1};
	cases[nc++] = (struct bad_case){"size 0", &v[4], sizeof(good), 1};
	cases[nc++] = (struct bad_case){"add no fd", &good, sizeof(good), 0};
	cases[nc++] = (struct bad_case){"add 2 fds", &good, sizeof(good), 2};
	cases[nc++] = (struct bad_case){"welcome fd", &v[5], sizeof(good), 1};
	cases[nc++] = (struct bad_case){"revoke fd", &v[6], sizeof(good), 1};
	cases[nc++] = (struct bad_case){"1 byte", "x", 1, 0};

	for (int i = 0; i < nc; i++) {
		raw_send(sv[0], cases[i].buf, cases[i].len, fds2,
		         cases[i].nfds);
		int fd = 77;
		int rc = handle_recv(sv[1], &got, &fd, 1000);
		if (rc != KVT_EPROTO)
			th_fail(__FILE__, __LINE__, "%s: got %s", cases[i].what,
			        kvt_errname(rc));
		T_EQ(fd, -1);
		T_EQ(got.magic, 0); /* nothing half-filled */
		int now = count_fds();
		if (now != base)
			th_fail(__FILE__, __LINE__, "%s: %d fds, expected %d",
			        cases[i].what, now, base);
	}

	T_OK(handle_send(sv[0], &good, mfd));
	int fd;
	T_OK(handle_recv(sv[1], &got, &fd, 1000));
	T_ASSERT(fd >= 0);
	close(fd);
	T_EQ(count_fds(), base);
	close(mfd);
	close(sv[0]);
	close(sv[1]);
}

TEST(handle, send_refuses_inconsistent_packets)
{
	int sv[2];
	pair(sv);
	int mfd = make_memfd(4096, 0);
	struct handle_msg m = msg(HANDLE_CHUNK_ADD, 0, 4096);
	T_ERR(handle_send(sv[0], &m, -1), KVT_EINVAL);
	m.size = 0;
	T_ERR(handle_send(sv[0], &m, mfd), KVT_EINVAL);
	m = msg(HANDLE_WELCOME, 0, 0);
	T_ERR(handle_send(sv[0], &m, mfd), KVT_EINVAL);
	m.magic = 0;
	T_ERR(handle_send(sv[0], &m, -1), KVT_EINVAL);
	m = msg(9, 0, 0);
	T_ERR(handle_send(sv[0], &m, -1), KVT_EINVAL);
	T_ERR(handle_send(sv[0], NULL, -1), KVT_EINVAL);
	/* Nothing reached the peer. */
	struct handle_msg got;
	int fd;
	T_ERR(handle_recv(sv[1], &got, &fd, 0), KVT_ETIMEDOUT);
	close(mfd);
	close(sv[0]);
	close(sv[1]);
}

TEST(handle, peer_close_is_econn)
{
	int sv[2];
	pair(sv);
	struct handle_msg m = msg(HANDLE_CHUNK_REVOKE, 2, 0), got;
	T_OK(handle_send(sv[0], &m, -1));
	close(sv[0]);
	int fd;
	/* A packet sent before the close is still delivered, then ECONN. */
	T_OK(handle_recv(sv[1], &got, &fd, 1000));
	T_EQ(got.slot, 2);
	T_ERR(handle_recv(sv[1], &got, &fd, 1000), KVT_ECONN);
	T_ERR(handle_recv(sv[1], &got, &fd, -1), KVT_ECONN);
	/* And sending to a closed peer is ECONN, not SIGPIPE. */
	signal(SIGPIPE, SIG_DFL);
	T_ERR(handle_send(sv[1], &m, -1), KVT_ECONN);
	close(sv[1]);
}

static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

TEST(handle, timeouts)
{
	int sv[2];
	pair(sv);
	struct handle_msg got;
	int fd;
	T_ERR(handle_recv(sv[1], &got, &fd, 0), KVT_ETIMEDOUT);
	T_EQ(fd, -1);
	double t0 = mono_ms();
	T_ERR(handle_recv(sv[1], &got, &fd, 80), KVT_ETIMEDOUT);
	double dt = mono_ms() - t0;
	T_ASSERT(dt >= 75 && dt < 2000);
	/* A pending packet is returned even with timeout 0. */
	struct handle_msg m = msg(HANDLE_CHUNK_REVOKE, 1, 0);
	T_OK(handle_send(sv[0], &m, -1));
	T_OK(handle_recv(sv[1], &got, &fd, 0));
	close(sv[0]);
	close(sv[1]);
}

static void on_alarm(int sig) { (void)sig; }

TEST(handle, timeout_survives_signals)
{
	int sv[2];
	pair(sv);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm; /* no SA_RESTART: poll sees EINTR */
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {{0, 10000}, {0, 10000}}; /* every 10 ms */
	setitimer(ITIMER_REAL, &it, NULL);
	struct handle_msg got;
	int fd;
	double t0 = mono_ms();
	T_ERR(handle_recv(sv[1], &got, &fd, 150), KVT_ETIMEDOUT);
	double dt = mono_ms() - t0;
	memset(&it, 0, sizeof(it));
	setitimer(ITIMER_REAL, &it, NULL);
	T_ASSERT(dt >= 145 && dt < 2000);
	close(sv[0]);
	close(sv[1]);
}

TEST(handle, full_nonblocking_send_is_ebusy)
{
	int sv[2];
	pair(sv);
	T_ASSERT(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
	struct handle_msg m = msg(HANDLE_CHUNK_REVOKE, 0, 0);
	int rc = 0, n = 0;
	while (n < 1000000 && (rc = handle_send(sv[0], &m, -1)) == 0)
		n++;
	T_ERR(rc, KVT_EBUSY);
	T_ASSERT(n > 0);
	close(sv[0]);
	close(sv[1]);
}

TEST(handle, listen_connect_accept)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/fd.sock", th_tmpdir());
	int ls, cs, as;
	T_OK(handle_listen(path, &ls));
	struct stat st;
	T_ASSERT(lstat(path, &st) == 0);
	T_ASSERT(S_ISSOCK(st.st_mode));
	T_EQ(st.st_mode & 07777, 0660);
	T_ASSERT(fcntl(ls, F_GETFL) & O_NONBLOCK);
	T_ASSERT(fcntl(ls, F_GETFD) & FD_CLOEXEC);

	T_ERR(handle_accept(ls, &as), KVT_EBUSY);
	T_EQ(as, -1);
	T_OK(handle_connect(path, &cs));
	T_ASSERT(!(fcntl(cs, F_GETFL) & O_NONBLOCK));
	T_ASSERT(fcntl(cs, F_GETFD) & FD_CLOEXEC);
	T_OK(handle_accept(ls, &as));
	T_ASSERT(fcntl(as, F_GETFL) & O_NONBLOCK);
	T_ASSERT(fcntl(as, F_GETFD) & FD_CLOEXEC);

	/* The daemon's side greets; the client reads the cookie. */
	struct handle_msg m = msg(HANDLE_WELCOME, 0, 0), got;
	m.cookie = 42;
	T_OK(handle_send(as, &m, -1));
	int fd;
	T_OK(handle_recv(cs, &got, &fd, 1000));
	T_EQ(got.cookie, 42);

	/* Credentials are ours, from either end. */
	uint32_t pid, uid, gid;
	T_OK(handle_peer(as, &pid, &uid, &gid));
	T_EQ(pid, (uint32_t)getpid());
	T_EQ(uid, (uint32_t)getuid());
	T_EQ(gid, (uint32_t)getgid());
	T_OK(handle_peer(cs, &pid, NULL, NULL));
	T_EQ(pid, (uint32_t)getpid());

	/* Client leaves: the daemon's side sees ECONN. */
	close(cs);
	T_ERR(handle_recv(as, &got, &fd, 1000), KVT_ECONN);
	close(as);

	/* A stale socket file from a dead daemon is replaced. */
	close(ls);
	T_ASSERT(lstat(path, &st) == 0);
	T_OK(handle_listen(path, &ls));
	T_OK(handle_connect(path, &cs));
	T_OK(handle_accept(ls, &as));
	close(cs);
	close(as);
	close(ls);
}

TEST(handle, listen_and_connect_errors)
{
	char path[512];
	int s = 5;
	/* Nobody listening. */
	snprintf(path, sizeof(path), "%s/none.sock", th_tmpdir());
	T_ERR(handle_connect(path, &s), KVT_ECONN);
	T_EQ(s, -1);
	/* A regular file at the path is not ours to delete. */
	snprintf(path, sizeof(path), "%s/file", th_tmpdir());
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fputs("keep", f);
	fclose(f);
	T_ERR(handle_listen(path, &s), KVT_ESYS);
	struct stat st;
	T_ASSERT(stat(path, &st) == 0 && S_ISREG(st.st_mode));
	T_ERR(handle_connect(path, &s), KVT_ECONN);
	/* Path longer than sun_path. */
	char longp[300];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = 0;
	T_ERR(handle_listen(longp, &s), KVT_EINVAL);
	T_ERR(handle_listen("", &s), KVT_EINVAL);
	/* Missing directory. */
	snprintf(path, sizeof(path), "%s/no/such/dir.sock", th_tmpdir());
	T_ERR(handle_listen(path, &s), KVT_ESYS);
}

TEST(handle, peer_on_socketpair)
{
	int sv[2];
	pair(sv);
	uint32_t pid = 0, uid = 1, gid = 1;
	T_OK(handle_peer(sv[0], &pid, &uid, &gid));
	T_EQ(pid, (uint32_t)getpid());
	T_EQ(uid, (uint32_t)getuid());
	T_EQ(gid, (uint32_t)getgid());
	close(sv[0]);
	close(sv[1]);
	T_ERR(handle_peer(sv[0], &pid, &uid, &gid), KVT_ESYS);
}

/*
 * A grant set: chunks 512 + {3, 9, 200} in one packet, their memfds in
 * slot order; each received fd maps its own sender's bytes.  The plain
 * receivers refuse a set (closing its fds), and a set whose fds do not
 * match its bitmap, or whose slot is not a window's first, is refused
 * without leaking; the sender refuses the same.
 */
TEST(handle, chunk_add_set_carries_fds_in_slot_order)
{
	int sv[2];
	pair(sv);
	size_t size = 64 << 10;
	int base = count_fds();
	int fds[3] = {make_memfd(size, 3), make_memfd(size, 9),
	              make_memfd(size, 200)};
	struct handle_ext x;
	memset(&x, 0, sizeof(x));
	x.h = msg(HANDLE_CHUNK_ADD_SET, 512, size);
	x.data[0] = 1u << 3 | 1u << 1; /* bits 3 and 1: two bits ... */
	T_ERR(handle_send_set(sv[0], &x, fds, 3), KVT_EINVAL); /* ... 3 fds */
	x.data[0] = 1u << 3;
	x.data[1] = 1u << 1;           /* 9 */
	x.data[25] = 1u << 0;          /* 200 */
	x.h.slot = 513;
	T_ERR(handle_send_set(sv[0], &x, fds, 3), KVT_EINVAL);
	x.h.slot = 512;
	T_OK(handle_send_set(sv[0], &x, fds, 3));
	struct handle_ext got;
	int rfds[HANDLE_SET_FDS];
	uint32_t n = 99;
	T_OK(handle_recv_set(sv[1], &got, rfds, &n, 1000));
	T_EQ(got.h.type, HANDLE_CHUNK_ADD_SET);
	T_EQ(got.h.slot, 512);
	T_EQ(n, 3);
	const uint8_t seeds[3] = {3, 9, 200};
	for (int i = 0; i < 3; i++) {
		uint8_t *p = mmap(NULL, size, PROT_READ, MAP_SHARED, rfds[i],
		                  0);
		T_ASSERT(p != MAP_FAILED);
		T_EQ(p[1000], (uint8_t)(seeds[i] + 1000 * 31));
		munmap(p, size);
		close(rfds[i]);
	}
	/* A plain receiver cannot use a set: refused, fds closed. */
	T_OK(handle_send_set(sv[0], &x, fds, 3));
	int rfd = -2;
	T_ERR(handle_recv_ext(sv[1], &got, &rfd, 1000), KVT_EPROTO);
	T_EQ(rfd, -1);
	/* Raw: a bitmap of 3 with 2 fds, and slot 7: refused, no leak. */
	raw_send(sv[0], &x, sizeof(x), fds, 2);
	T_ERR(handle_recv_set(sv[1], &got, rfds, &n, 1000), KVT_EPROTO);
	T_EQ(n, 0);
	x.h.slot = 7;
	raw_send(sv[0], &x, sizeof(x), fds, 3);
	T_ERR(handle_recv_set(sv[1], &got, rfds, &n, 1000), KVT_EPROTO);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	T_EQ(count_fds(), base);
	close(sv[0]);
	close(sv[1]);
}
