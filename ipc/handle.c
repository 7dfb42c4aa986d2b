/*
 * handle.c — the handle channel: fixed-size packets over AF_UNIX
 * SOCK_SEQPACKET, each carrying at most one fd by SCM_RIGHTS (a grant set
 * up to HANDLE_SET_FDS); see handle.h.
 *
 * SEQPACKET keeps packet boundaries and is reliable, so one sendmsg is one
 * recvmsg and an fd always arrives with the packet that announces it.
 * The receiver trusts nothing: a packet of the wrong size, an unknown type
 * or a missing/extra fd is refused, and every fd that came with a refused
 * packet is closed so a hostile or buggy peer cannot leak fds into us.
 */
#include "handle.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvtrim.h"
#include "now.h"

/* Room for more fds than any packet may carry, so that extra fds arrive
 * (and get closed) instead of being cut off with MSG_CTRUNC. */
#define HANDLE_MAX_FDS ((int)HANDLE_SET_FDS + 8)

static bool type_known(uint16_t t)
{
	return t >= HANDLE_WELCOME && t <= HANDLE_STAGE_DEV;
}

int handle_is_ext(uint16_t t)
{
	return t >= HANDLE_CHUNK_DEV && t <= HANDLE_STAGE_DEV;
}

int handle_is_set(uint16_t t)
{
	return t == HANDLE_CHUNK_ADD_SET || t == HANDLE_CHUNK_DEV_SET;
}

uint16_t handle_set_member(uint16_t t)
{
	return t == HANDLE_CHUNK_DEV_SET ? HANDLE_CHUNK_DEV : HANDLE_CHUNK_ADD;
}

/* Bits set in a set's bitmap. */
static uint32_t set_count(const uint8_t *data)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < HANDLE_DATA_BYTES; i++)
		n += (uint32_t)__builtin_popcount(data[i]);
	return n;
}

/* A grant set's header and bitmap agree with n fds. */
static bool set_valid(const struct handle_ext *m, uint32_t n)
{
	return m->h.slot % HANDLE_SET_SLOTS == 0 && m->h.size > 0 &&
	       m->h.cookie == 0 && n >= 1 && n <= HANDLE_SET_FDS &&
	       set_count(m->data) == n;
}

static bool type_has_fd(uint16_t t)
{
	return t == HANDLE_TABLE || t == HANDLE_STAGE || t == HANDLE_CHUNK_ADD;
}

/* A device chunk (or the device table or staging) comes with its VMM
 * fd, or (legacy IPC) with none. */
static bool type_fd_optional(uint16_t t)
{
	return t == HANDLE_CHUNK_DEV || t == HANDLE_TABLE_DEV ||
	       t == HANDLE_STAGE_DEV;
}

/* Wire size of a packet of type t. */
static size_t type_len(uint16_t t)
{
	return handle_is_ext(t) ? sizeof(struct handle_ext)
	                        : sizeof(struct handle_msg);
}

static int fill_addr(const char *path, struct sockaddr_un *sa)
{
	if (!path || !*path)
		return KVT_EINVAL;
	size_t n = strlen(path);
	if (n >= sizeof(sa->sun_path))
		return KVT_EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, path, n + 1);
	return 0;
}

static void close_keep_errno(int fd)
{
	int e = errno;
	close(fd);
	errno = e;
}

/*
 * Only a socket file is unlinked: a stale one from a daemon that died
 * (bind would fail with EADDRINUSE).  Anything else at the path is left
 * alone and bind reports it.  chmod follows bind, so for that instant the
 * file has the umask's mode; the runtime directory's own mode is the real
 * fence.
 */
int handle_listen(const char *path, int *out)
{
	struct sockaddr_un sa;
	struct stat st;
	int rc, s;

	if (!out)
		return KVT_EINVAL;
	*out = -1;
	if ((rc = fill_addr(path, &sa)))
		return rc;
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		return KVT_ESYS;
	if (bind(s, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	/* The full backlog (net.core.somaxconn): a burst of connects (engines
	 * starting together, or a flood the accept path sheds) is queued for
	 * the daemon to judge, not refused by the kernel. */
	if (chmod(path, 0660) < 0 || listen(s, SOMAXCONN) < 0) {
		int e = errno;
		unlink(path);
		errno = e;
		goto fail;
	}
	*out = s;
	return 0;
fail:
	close_keep_errno(s);
	return KVT_ESYS;
}

int handle_accept(int lsock, int *out)
{
	if (!out)
		return KVT_EINVAL;
	*out = -1;
	for (;;) {
		int s = accept4(lsock, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (s >= 0) {
			*out = s;
			return 0;
		}
		/* ECONNABORTED: that peer left while queued; try the next. */
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return KVT_EBUSY;
		return KVT_ESYS;
	}
}

int handle_connect(const char *path, int *out)
{
	struct sockaddr_un sa;
	int rc, s;

	if (!out)
		return KVT_EINVAL;
	*out = -1;
	if ((rc = fill_addr(path, &sa)))
		return rc;
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return KVT_ESYS;
	while (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		/* An interrupted AF_UNIX connect may still complete. */
		if (errno == EINTR)
			continue;
		if (errno == EISCONN)
			break;
		close_keep_errno(s);
		return KVT_ECONN;
	}
	*out = s;
	return 0;
}

/* Sends m (len bytes) with nfd fds (fds[0] when nfd is 1). */
static int send_fds(int sock, const struct handle_msg *m, size_t len,
                    const int *fds, uint32_t nfd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * HANDLE_SET_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = (void *)m, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfd > HANDLE_SET_FDS)
		return KVT_EINVAL;
	if (nfd) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfd);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfd);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfd);
	}
	for (;;) {
		ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n == (ssize_t)len)
			return 0;
		if (n >= 0) /* cannot happen on SEQPACKET: it is atomic */
			return KVT_ESYS;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return KVT_EBUSY;
		if (errno == EPIPE || errno == ECONNRESET ||
		    errno == ENOTCONN || errno == ECONNREFUSED)
			return KVT_ECONN;
		return KVT_ESYS;
	}
}

static int send_packet(int sock, const struct handle_msg *m, size_t len,
                       int fd)
{
	/* Refuse what the receiver would refuse: a sender bug shows here,
	 * with its own stack, rather than as a dropped peer. */
	if (!m || m->magic != HANDLE_MAGIC || !type_known(m->type) ||
	    handle_is_set(m->type) ||
	    m->flags != 0 || len != type_len(m->type) ||
	    (!type_fd_optional(m->type) && type_has_fd(m->type) != (fd >= 0)) ||
	    ((type_has_fd(m->type) || type_fd_optional(m->type)) &&
	     m->size == 0))
		return KVT_EINVAL;
	return send_fds(sock, m, len, &fd, fd >= 0 ? 1 : 0);
}

int handle_send(int sock, const struct handle_msg *m, int fd)
{
	if (m && handle_is_ext(m->type))
		return KVT_EINVAL; /* needs its 64 bytes: handle_send_ext */
	return send_packet(sock, m, sizeof(*m), fd);
}

int handle_send_ext(int sock, const struct handle_ext *m, int fd)
{
	if (!m || !handle_is_ext(m->h.type))
		return KVT_EINVAL;
	return send_packet(sock, &m->h, sizeof(*m), fd);
}

int handle_send_set(int sock, const struct handle_ext *m, const int *fds,
                    uint32_t n)
{
	if (!m || !fds || m->h.magic != HANDLE_MAGIC ||
	    !handle_is_set(m->h.type) || m->h.flags != 0 || !set_valid(m, n))
		return KVT_EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (fds[i] < 0)
			return KVT_EINVAL;
	return send_fds(sock, &m->h, sizeof(*m), fds, n);
}

/* Waits until sock is readable; 0, KVT_ETIMEDOUT or KVT_ESYS.  A deadline
 * (not a fixed timeout per poll) keeps EINTR from stretching the wait. */
static int wait_readable(int sock, int timeout_ms, int64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = sock, .events = POLLIN};
		int left = -1;
		if (timeout_ms >= 0) {
			int64_t d = deadline - (int64_t)now_ms();
			left = d > 0 ? (int)d : 0;
		}
		int r = poll(&p, 1, left);
		if (r > 0) {
			if (p.revents & POLLNVAL) {
				errno = EBADF;
				return KVT_ESYS;
			}
			return 0; /* POLLIN, POLLHUP or POLLERR: recv tells */
		}
		if (r == 0)
			return KVT_ETIMEDOUT;
		if (errno != EINTR)
			return KVT_ESYS;
	}
}

/* What a receiver takes: plain packets only, extended ones too, or grant
 * sets as well. */
enum accept { ACC_PLAIN, ACC_EXT, ACC_SET };

/* Receives into m (room for an extended packet) and out[*nout] (room for
 * HANDLE_SET_FDS); `acc` says which types the caller can use. */
static int recv_packet(int sock, struct handle_ext *m, int *out,
                       uint32_t *nout, int timeout_ms, enum accept acc)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * HANDLE_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	int fds[HANDLE_MAX_FDS];
	int nfds = 0, rc;
	int64_t deadline = timeout_ms > 0 ? (int64_t)now_ms() + timeout_ms : 0;
	ssize_t n;
	struct msghdr mh;

	if (!m || !out || !nout)
		return KVT_EINVAL;
	*nout = 0;
	memset(m, 0, sizeof(*m));
	for (;;) {
		struct iovec iov = {.iov_base = m, .iov_len = sizeof(*m)};
		/* (a plain packet fills only m->h; its data stays zero) */
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		/* A poll (timeout 0) is one non-blocking recvmsg: it runs after
		 * every reply on the client's hot path. */
		if (timeout_ms != 0 &&
		    (rc = wait_readable(sock, timeout_ms, deadline)))
			return rc;
		/* MSG_DONTWAIT: poll said readable, but never block if another
		 * reader took the packet meanwhile; just wait again. */
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n >= 0)
			break;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			if (timeout_ms == 0)
				return KVT_ETIMEDOUT;
			continue;
		}
		if (errno == ECONNRESET || errno == ENOTCONN)
			return KVT_ECONN;
		return KVT_ESYS;
	}

	/* Collect every fd that arrived before judging the packet. */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int x;
			memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (nfds < HANDLE_MAX_FDS)
				fds[nfds++] = x;
			else
				close(x); /* cannot happen: buffer bounds k */
		}
	}

	if (n == 0 && nfds == 0) {
		rc = KVT_ECONN; /* orderly shutdown by the peer */
	} else if ((size_t)n < sizeof(m->h) || (mh.msg_flags & MSG_TRUNC) ||
	           (mh.msg_flags & MSG_CTRUNC)) {
		rc = KVT_EPROTO; /* wrong size, or fds cut off by the kernel */
	} else if (m->h.magic != HANDLE_MAGIC || !type_known(m->h.type) ||
	           m->h.flags != 0 || (size_t)n != type_len(m->h.type) ||
	           (acc == ACC_PLAIN && handle_is_ext(m->h.type)) ||
	           (acc != ACC_SET && handle_is_set(m->h.type))) {
		rc = KVT_EPROTO;
	} else if (handle_is_set(m->h.type)) {
		rc = set_valid(m, (uint32_t)nfds) ? 0 : KVT_EPROTO;
	} else if (type_fd_optional(m->h.type)) {
		rc = (nfds <= 1 && m->h.size > 0) ? 0 : KVT_EPROTO;
	} else if (type_has_fd(m->h.type)) {
		rc = (nfds == 1 && m->h.size > 0) ? 0 : KVT_EPROTO;
	} else {
		rc = nfds == 0 ? 0 : KVT_EPROTO;
	}

	if (rc) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		memset(m, 0, sizeof(*m));
		return rc;
	}
	memcpy(out, fds, (size_t)nfds * sizeof(int)); /* <= HANDLE_SET_FDS */
	*nout = (uint32_t)nfds;
	return 0;
}

int handle_recv(int sock, struct handle_msg *m, int *fd, int timeout_ms)
{
	struct handle_ext e;
	int fds[HANDLE_SET_FDS];
	uint32_t n;
	if (!m || !fd)
		return KVT_EINVAL;
	int rc = recv_packet(sock, &e, fds, &n, timeout_ms, ACC_PLAIN);
	*m = e.h;
	*fd = n ? fds[0] : -1;
	return rc;
}

int handle_recv_ext(int sock, struct handle_ext *m, int *fd, int timeout_ms)
{
	int fds[HANDLE_SET_FDS];
	uint32_t n;
	if (!m || !fd)
		return KVT_EINVAL;
	int rc = recv_packet(sock, m, fds, &n, timeout_ms, ACC_EXT);
	*fd = n ? fds[0] : -1;
	return rc;
}

int handle_recv_set(int sock, struct handle_ext *m, int *fds, uint32_t *n,
                    int timeout_ms)
{
	return recv_packet(sock, m, fds, n, timeout_ms, ACC_SET);
}

int handle_peer(int sock, uint32_t *pid, uint32_t *uid, uint32_t *gid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return KVT_ESYS;
	if (len != sizeof(cr))
		return KVT_ESYS;
	if (pid)
		*pid = (uint32_t)cr.pid;
	if (uid)
		*uid = (uint32_t)cr.uid;
	if (gid)
		*gid = (uint32_t)cr.gid;
	return 0;
}
