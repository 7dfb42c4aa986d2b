/*
 * handle.h — the handle channel: AF_UNIX SOCK_SEQPACKET with SCM_RIGHTS,
 * because nng cannot pass file descriptors.  The connection is also the
 * client's lease: when it closes (the process exited or died) the daemon
 * reclaims the tenant at once.
 *
 * The daemon sends WELCOME {cookie} on accept (the client puts the cookie
 * in its nng hello), then the table, staging, chunk and event packets; the
 * client sends only CHUNK_CLOSED.  Every packet, its fields and when it is
 * sent: docs/protocol.md, "Handle channel packets".  Packets are processed
 * in order.
 */
#ifndef KVT_HANDLE_H
#define KVT_HANDLE_H

#include <stdint.h>

#define HANDLE_MAGIC 0x4b564846u /* "KVHF" */

enum handle_type {
	HANDLE_WELCOME = 1,
	HANDLE_TABLE = 2,
	HANDLE_STAGE = 3,
	HANDLE_CHUNK_ADD = 4,
	HANDLE_CHUNK_REVOKE = 5,
	/* Extended packets (struct handle_ext on the wire): */
	HANDLE_CHUNK_DEV = 6,
	HANDLE_EVENT = 7,
	HANDLE_CHUNK_CLOSED = 8,
	HANDLE_TABLE_DEV = 9,
	HANDLE_CHUNK_REVOKE_SET = 10,
	HANDLE_CHUNK_ADD_SET = 11,
	HANDLE_CHUNK_DEV_SET = 12,
	HANDLE_STAGE_DEV = 13,
};

#define HANDLE_EVENT_WRITES 0u  /* client records, daemon waits */
#define HANDLE_EVENT_COMPACT 1u /* daemon records, client waits */
#define HANDLE_DATA_BYTES 64u   /* cudaIpc{Mem,Event}Handle_t */
#define HANDLE_REVOKE_SET_SLOTS (8u * HANDLE_DATA_BYTES) /* per packet */
#define HANDLE_SET_SLOTS HANDLE_REVOKE_SET_SLOTS /* window of any set */
/* fds one CHUNK_ADD_SET / CHUNK_DEV_SET carries at most (SCM_RIGHTS takes
 * up to 253): 64 x ~200 packets of send buffer = ~25 GiB of grants. */
#define HANDLE_SET_FDS 64u

/* 1 for CHUNK_ADD_SET and CHUNK_DEV_SET. */
int handle_is_set(uint16_t type);

/* The single-chunk type a set grants as: CHUNK_ADD or CHUNK_DEV. */
uint16_t handle_set_member(uint16_t type);

struct handle_msg {
	uint32_t magic;  /* HANDLE_MAGIC */
	uint16_t type;   /* enum handle_type */
	uint16_t flags;  /* 0 */
	uint32_t slot;   /* chunk slot (CHUNK_*), else 0 */
	uint32_t reserved;
	uint64_t size;   /* bytes of the segment/chunk behind the fd */
	uint64_t cookie; /* WELCOME; REVOKE and CHUNK_CLOSED of device chunks */
};

/* An extended packet: the header, then 64 bytes (zero when unused). */
struct handle_ext {
	struct handle_msg h;
	uint8_t data[HANDLE_DATA_BYTES];
};

/* 1 for the types sent as struct handle_ext. */
int handle_is_ext(uint16_t type);

/*
 * Creates a listening SEQPACKET socket at path (unlinking a stale socket
 * file first), mode 0660, non-blocking, close-on-exec.  Returns 0 and *out,
 * or KVT_ESYS / KVT_EINVAL (path too long).
 */
int handle_listen(const char *path, int *out);

/* Accepts one connection, non-blocking + close-on-exec; 0, KVT_EBUSY when
 * none is pending (EAGAIN), or KVT_ESYS. */
int handle_accept(int lsock, int *out);

/* Connects to path (blocking socket, close-on-exec); 0 or KVT_ECONN. */
int handle_connect(const char *path, int *out);

/*
 * Sends one packet, with fd attached when fd >= 0.  Never blocks on a
 * non-blocking socket: a full buffer gives KVT_EBUSY.  0 or KVT_E*.
 */
int handle_send(int sock, const struct handle_msg *m, int fd);

/* Sends an extended packet (handle_is_ext(m->h.type)); like handle_send.
 * CHUNK_DEV takes an fd or none; the others none. */
int handle_send_ext(int sock, const struct handle_ext *m, int fd);

/* Sends a grant set (handle_is_set): fds[n] in increasing slot order, n
 * the bits set in m->data, 1 <= n <= HANDLE_SET_FDS, m->h.slot a multiple
 * of HANDLE_SET_SLOTS; else KVT_EINVAL.  Like handle_send otherwise. */
int handle_send_set(int sock, const struct handle_ext *m, const int *fds,
                    uint32_t n);

/*
 * Receives one packet.  timeout_ms < 0 waits forever, 0 polls.  A received
 * fd is returned in *fd (close-on-exec), -1 when none came.  Validates magic,
 * type, size and that exactly the fds the type calls for came (closing any
 * unexpected fd).  Returns 0, KVT_ETIMEDOUT, KVT_ECONN (peer closed),
 * KVT_EPROTO or KVT_ESYS.
 */
int handle_recv(int sock, struct handle_msg *m, int *fd, int timeout_ms);

/* Like handle_recv, but also takes extended packets: m->data holds their
 * 64 bytes (zeroed for a plain packet).  Refuses grant sets (EPROTO). */
int handle_recv_ext(int sock, struct handle_ext *m, int *fd, int timeout_ms);

/* Like handle_recv_ext, and takes grant sets too: fds[*n] (room for
 * HANDLE_SET_FDS) are the fds that came, in the packet's slot order for a
 * set (checked: one per bit of data, slot a window's first), at most one
 * otherwise. */
int handle_recv_set(int sock, struct handle_ext *m, int *fds, uint32_t *n,
                    int timeout_ms);

/* Peer credentials of a connected socket (SO_PEERCRED). */
int handle_peer(int sock, uint32_t *pid, uint32_t *uid, uint32_t *gid);

#endif
