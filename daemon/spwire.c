/*
 * spwire.c — see spwire.h: nng's SP wire (ipc:// framing), parsed and
 * built without I/O.
 */
#include "spwire.h"

int spw_hello(const uint8_t *b, size_t n, uint16_t proto)
{
	if (n < SPW_HELLO_LEN)
		return SPW_MORE;
	if (b[0] || b[1] != 'S' || b[2] != 'P' || b[3] || b[6] || b[7] ||
	    ((uint16_t)(b[4] << 8 | b[5])) != proto)
		return SPW_BAD;
	return SPW_OK;
}

void spw_hello_put(uint8_t *out, uint16_t proto)
{
	out[0] = 0;
	out[1] = 'S';
	out[2] = 'P';
	out[3] = 0;
	out[4] = (uint8_t)(proto >> 8);
	out[5] = (uint8_t)proto;
	out[6] = out[7] = 0;
}

int spw_frame(const uint8_t *b, size_t n, uint64_t max, uint64_t *need,
              const uint8_t **msg, uint64_t *mlen, const char **why)
{
	if (n < SPW_HEAD_LEN) {
		*need = SPW_HEAD_LEN;
		return SPW_MORE;
	}
	uint64_t len = 0;
	for (int i = 0; i < 8; i++)
		len = len << 8 | b[1 + i];
	if (b[0] != 1) {
		*why = "a frame of an unknown type";
		return SPW_BAD;
	}
	if (len > max) {
		*why = "a frame above the largest message";
		return SPW_BAD;
	}
	*need = SPW_HEAD_LEN + len;
	if (n - SPW_HEAD_LEN < len)
		return SPW_MORE;
	*msg = b + SPW_HEAD_LEN;
	*mlen = len;
	return SPW_OK;
}

void spw_head_put(uint8_t *out, uint64_t len)
{
	out[0] = 1;
	for (int i = 0; i < 8; i++)
		out[1 + i] = (uint8_t)(len >> (56 - 8 * i));
}

uint32_t spw_backtrace(const uint8_t *msg, uint64_t len)
{
	for (uint32_t w = 0; w < SPW_BT_MAX && 4 * (uint64_t)w + 4 <= len;
	     w++)
		if (msg[4 * w] & 0x80)
			return 4 * w + 4;
	return 0;
}
