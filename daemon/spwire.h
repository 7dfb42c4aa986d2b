/*
 * spwire.h — nng's SP wire over a stream socket, as its ipc:// transport
 * speaks it (nng's src/sp/transport/ipc), parsed and built without I/O:
 * kvtrimd serves ctl.ipc with it (ctl.c; libkvtrim and kvtrimctl dial with
 * nng's req0).  Pure functions over caller buffers, so the fuzz target
 * (tests/fuzz/fuzz_spwire.c) drives exactly what the daemon runs.
 *
 *   hello: 0x00 'S' 'P' 0x00, the sender's protocol (16 bits, big
 *          endian: req0 0x30, rep0 0x31), 0x00 0x00; once per direction;
 *   frame: type 1, a 64-bit big-endian length, that many message bytes;
 *   a req0 message: its backtrace (32-bit big-endian words, the last,
 *          the request id, with its top bit set), then the body; the rep0
 *          reply carries the same words back before its own body.
 */
#ifndef KVT_SPWIRE_H
#define KVT_SPWIRE_H

#include <stddef.h>
#include <stdint.h>

#define SPW_HELLO_LEN 8u
#define SPW_HEAD_LEN 9u
#define SPW_REQ0 0x30u
#define SPW_REP0 0x31u
#define SPW_BT_MAX 8u /* backtrace words, as nng's rep0 (NNG_MAX_MAX_TTL 15) */

enum spw_res { SPW_BAD = -1, SPW_MORE = 0, SPW_OK = 1 };

/* The peer's hello in b[n]: SPW_MORE below 8 bytes, SPW_OK when it is
 * proto's, else SPW_BAD. */
int spw_hello(const uint8_t *b, size_t n, uint16_t proto);

/* Our hello, for protocol proto, into out[SPW_HELLO_LEN]. */
void spw_hello_put(uint8_t *out, uint16_t proto);

/*
 * The frame at b[n]: SPW_MORE with *need the bytes it needs in all (9,
 * then 9 + its length); SPW_BAD with *why when its type is not 1 or its
 * length is above max (the connection must be closed: nothing after it
 * can be framed); SPW_OK with *msg, *mlen its message and *need its whole
 * length (SPW_HEAD_LEN + *mlen <= n).
 */
int spw_frame(const uint8_t *b, size_t n, uint64_t max, uint64_t *need,
              const uint8_t **msg, uint64_t *mlen, const char **why);

/* A frame's head for a message of len bytes, into out[SPW_HEAD_LEN]. */
void spw_head_put(uint8_t *out, uint64_t len);

/* The length of the req0 backtrace msg[len] begins with (4 to 4 x
 * SPW_BT_MAX bytes), or 0 when it has none within those words or within
 * len (the message is dropped then, as nng's rep0 drops it). */
uint32_t spw_backtrace(const uint8_t *msg, uint64_t len);

#endif
