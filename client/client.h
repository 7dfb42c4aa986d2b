/*
 * client.h — what the files of libkvtrim (client/) share and nothing else
 * does: the client handle (struct kvt_client, opaque in kvtrim.h) and the
 * client_* helpers of the control plane.  Internal to client/; not part of
 * the public API (libkvtrim exports only kvt_*).
 *
 *   client.c   the session: connect (welcome, hello, segments),
 *              disconnect, last error, config, the tenant's stats
 *   rpc.c      the control plane: one request/reply, the handle channel
 *              drained after it, liveness (the daemon's death ends waits)
 *   seq.c      sequences and the data plane (lists, pages, staging)
 *   sync.c     kvt_sync, kvt_sync_async and kvt_wait (one nng context per
 *              ticket), and the device ordering around them
 *   device.c   the cuda-facing calls (stream, table view, memcpy)
 *   attention.c kvt_attention (the CPU kernel, or the backend's op)
 *   buffer.c   kvt_buffer_alloc / kvt_buffer_free (memory of the pages'
 *              kind for an engine's q, out and lse)
 *
 * Threads: a kvt_client is used from one thread at a time; only `gone` is
 * written from an nng thread (client_pipe_gone), atomically.
 */
#ifndef KVT_CLIENT_H
#define KVT_CLIENT_H

#include <limits.h>
#include <stdint.h>

#include <nng/nng.h>

#include "codec.h"
#include "kvtrim.h"
#include "mem.h"

#define CLIENT_MAX_TICKETS 16 /* kvtrim.h: at most 16 syncs in flight */
#define CLIENT_TICKET_BITS 4  /* low bits of a ticket: its slot */

struct seq_slot {
	kvt_seq id;       /* from the daemon: tenant, generation, slot
	                     (ipc/seqid.h) */
	uint32_t counter; /* syncs the daemon accepted for this sequence */
	uint32_t room;    /* headroom in force: what open or the last accepted
	                     sync left room for (kvt_kv_ptr's bound) */
	uint32_t want;    /* kvt_seq_headroom: asked of each sync, 0 = the
	                     registration's */
	uint32_t sent;    /* the room the sync in flight asked (want resolved) */
	uint64_t sent_no; /* the number of its last sync sent (the one in
	                     flight or in doubt): what kvt_seq_query asks
	                     about */
	uint8_t open;
	uint8_t busy;     /* an async sync of this sequence is in flight */
	uint8_t doubt;    /* a sync of it ended without a verdict (timed out,
	                     unreadable reply): refused until kvt_seq_query
	                     learns whether the daemon applied it (and
	                     makes sure a late arrival is refused) */
	uint8_t counted;  /* the sync in doubt was found applied through
	                     another sequence it named, and counted in
	                     last_sync.syncs then */
};

/* One in-flight kvt_sync_async: its own nng context, so replies of
 * concurrent requests cannot be confused. */
struct ticket {
	nng_ctx ctx;
	nng_aio *aio;
	int ready;        /* ctx and aio exist (created on first use) */
	int pending;      /* a request was sent and not yet waited for */
	uint32_t gen;     /* generation, high bits of the ticket id */
	uint32_t n;
	kvt_seq *seqs;    /* [n] sequences of the sync, for the counters */
};

/* One buffer of kvt_buffer_alloc. */
struct client_buffer {
	void *p;
	int dev; /* device memory (mem_buffer_free's kind) */
};

struct kvt_client {
	struct kvt_config cfg; /* values in force; strings point below */
	char dir[PATH_MAX];
	char name[KVT_NAME_MAX];
	char policy[KVT_SPEC_MAX];
	char last_error[KVT_ERRTEXT_MAX];

	nng_socket sock;
	int sock_open;
	nng_aio *raio;   /* receives the reply of a blocking call */
	int gone;        /* the control pipe closed (set on an nng thread) */
	int hfd;         /* handle channel, -1 when closed */
	int dead;        /* the handle channel hung up: daemon gone */
	int registered;  /* hello accepted: tenant and token are valid */
	int mem_live;    /* table and staging mapped: packets may be applied */

	uint32_t tenant;
	uint64_t token;
	uint32_t inputs; /* KVT_INPUT_* bits of the policy, from the hello */
	struct mem mem;
	void *stream;    /* engine's cudaStream_t (kvt_set_stream), borrowed */
	struct seq_slot *seqs; /* [cfg.max_seqs] */
	struct ticket tickets[CLIENT_MAX_TICKETS];
	uint32_t ticket_gen;
	uint64_t req_no;   /* the last request number issued: every sync and
	                      seq_open carries the next ("n"), so the daemon
	                      can tell one from another (kvt_seq_query,
	                      kvt_seq_open's undo) */
	uint64_t open_undo; /* the first seq_open since the last one with a
	                       verdict that ended without one (0: none): the
	                       next open asks the daemon to close what those
	                       opened */
	struct kvt_sync_info last_sync; /* what the last accepted sync applied */
	/* kvt_attention on a host tenant (attention.c), allocated on first
	 * use: page addresses [n_kv_heads][max_pages] and logits
	 * [G][max_pages * page_tokens]. */
	void **attn_pages;
	float *attn_logits;
	/* kvt_buffer_alloc's live buffers (buffer.c), in no order: what
	 * kvt_buffer_free accepts and kvt_disconnect frees. */
	struct client_buffer *bufs; /* [bufs_cap], the first n_bufs live */
	uint32_t n_bufs, bufs_cap;
};


/* ---------------------------------------------------------------- rpc.c */

/* Formats the reason of the last failure into c->last_error. */
__attribute__((format(printf, 2, 3))) void
client_set_err(kvt_client *c, const char *fmt, ...);

/* At the start of every call on a mutable client: kvt_last_error then
 * tells about this call only ("" when it succeeds). */
void client_begin(kvt_client *c);

/* Copies bytes between host memory and the pages' (kvt_memcpy's work,
 * device.c): memcpy on a host tenant, a copy on the client's stream and a
 * wait for it on a cuda tenant.  0, or KVT_ESYS with the reason set. */
int client_copy(kvt_client *c, void *dst, const void *src, size_t bytes);

/* nng error -> KVT_E* (connection-level failures are KVT_ECONN). */
int client_from_nng(int rv);

/* A reply's error code, trusted only when it is one of ours. */
int client_rep_code(int32_t e);

/* A request of op from this tenant (its id and token, but for hello and
 * admin operations). */
void client_req_init(const kvt_client *c, enum ipc_op op, struct ipc_req *req);

/* Applies every packet already queued on the handle channel (never waits):
 * 0, the first packet error, or KVT_ECONN when the daemon hung up. */
int client_drain(kvt_client *c);

/* 0 (and last_error says so) once the daemon is known gone. */
int client_alive(kvt_client *c);

/* client_alive for const clients; writes nothing. */
int client_lost(const kvt_client *c);

/* nng pipe callback (NNG_PIPE_EV_REM_POST): the daemon went away. */
void client_pipe_gone(nng_pipe p, nng_pipe_ev ev, void *arg);

/* One request/reply, bounded by timeout_ms; *rep decoded (codec_rep_free
 * it, also after an error).  0, the daemon's code or a local one. */
int client_rpc(kvt_client *c, const struct ipc_req *req, struct ipc_rep *rep,
               int timeout_ms);

/* ---------------------------------------------------------------- seq.c */

/* The slot of an open sequence, or KVT_ENOSEQ. */
int client_seq_lookup(const kvt_client *c, kvt_seq seq, uint32_t *slot);

/* The list record of an open, idle sequence, after checking every index;
 * KVT_EBUSY while a sync of it is in flight or in doubt. */
int client_list_of(const kvt_client *c, kvt_seq seq, uint32_t layer,
                   uint32_t kv_head, const struct shm_list **out);

/* After a sync of seq failed with rc: a timeout or an unreadable reply
 * leaves it in doubt (struct seq_slot), other codes change nothing. */
void client_seq_doubt(kvt_client *c, kvt_seq seq, int rc);

/* ---------------------------------------------------------------- attention.c */

/* Frees kvt_attention's host buffers (safe when none were allocated). */
void client_attention_free(kvt_client *c);

/* ---------------------------------------------------------------- buffer.c */

/* Frees every buffer kvt_buffer_alloc gave and the list; before mem_fini,
 * which ends the backend context device buffers belong to.  Safe twice. */
void client_buffers_free(kvt_client *c);

/* ---------------------------------------------------------------- sync.c */

/* After an accepted sync of seq: its counter moves on and its room
 * becomes what the sync asked. */
void client_count_sync(kvt_client *c, kvt_seq seq);

/* After an accepted sync: keeps what its reply says was applied. */
void client_note_sync(kvt_client *c, const struct ipc_rep *rep);

/* Device tenants, after a reply that may have changed chunks or the
 * table: queues the chunk-base upload and the wait for the daemon's
 * compaction on the engine's stream (0 on a host tenant). */
int client_device_after(kvt_client *c);

#endif
