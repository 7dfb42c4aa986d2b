/*
 * codec_fixture.h — what the codec tests (ipc/codec*_test.c) share:
 * an independent encoder (msgpack-c's packer driven by hand), the refusal
 * and acceptance checks (refuse_req, refuse_rep, accept_req report the
 * caller's file and line), round trips and a reference hello.  Header-only
 * (static inline), so no helper name leaves a test file.
 */
#ifndef KVT_CODEC_FIXTURE_H
#define KVT_CODEC_FIXTURE_H

#include <msgpack.h>

#include "codec.h"
#include "test.h"
/* An independent encoder: msgpack-c's packer driven by hand. */
struct mp {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static inline void mp_init(struct mp *m)
{
	msgpack_sbuffer_init(&m->sb);
	msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static inline void mp_s(struct mp *m, const char *s)
{
	msgpack_pack_str(&m->pk, strlen(s));
	msgpack_pack_str_body(&m->pk, s, strlen(s));
}

static inline void mp_u(struct mp *m, uint64_t v)
{
	msgpack_pack_uint64(&m->pk, v);
}

static inline void mp_i(struct mp *m, int64_t v)
{
	msgpack_pack_int64(&m->pk, v);
}

static inline void mp_map(struct mp *m, size_t n)
{
	msgpack_pack_map(&m->pk, n);
}

static inline void mp_arr(struct mp *m, size_t n)
{
	msgpack_pack_array(&m->pk, n);
}

static inline void mp_ku(struct mp *m, const char *k, uint64_t v)
{
	mp_s(m, k);
	mp_u(m, v);
}

static inline void mp_ks(struct mp *m, const char *k, const char *v)
{
	mp_s(m, k);
	mp_s(m, v);
}

static inline void mp_free(struct mp *m) { msgpack_sbuffer_destroy(&m->sb); }

/* Starts a request map of n keys with v and op (n counts them). */
static inline void mp_req(struct mp *m, size_t n, const char *op)
{
	mp_init(m);
	mp_map(m, n);
	mp_ku(m, "v", IPC_PROTO_VERSION);
	mp_ks(m, "op", op);
}

static inline void mp_item(struct mp *m, uint64_t seq, uint64_t ctr,
                           uint64_t n_new, uint64_t phase, uint64_t lo,
                           uint64_t hi)
{
	mp_arr(m, 6);
	mp_u(m, seq);
	mp_u(m, ctr);
	mp_u(m, n_new);
	mp_u(m, phase);
	mp_u(m, lo);
	mp_u(m, hi);
}

/* Decodes m as a request, expects code, a non-empty reason and (when
 * given) a reason containing want; releases m. */
static inline void refuse_req_(struct mp *m, int code, const char *want,
                               const char *file, int line)
{
	struct ipc_req r;
	char err[256];
	memset(err, 'x', sizeof(err));
	int rc = codec_req_decode((const uint8_t *)m->sb.data, m->sb.size, &r,
	                          err, sizeof(err));
	codec_req_free(&r);
	mp_free(m);
	if (rc != code)
		th_fail(file, line, "decode gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (!err[0] || !memchr(err, 0, sizeof(err)) || strchr(err, '\n'))
		th_fail(file, line, "no one-line reason");
	if (want && !strstr(err, want))
		th_fail(file, line, "reason \"%s\" lacks \"%s\"", err, want);
}
#define refuse_req(m, code, want) refuse_req_(m, code, want, __FILE__, __LINE__)

static inline void refuse_rep_(enum ipc_op op, struct mp *m, int code,
                               const char *want, const char *file, int line)
{
	struct ipc_rep r;
	char err[256] = "";
	int rc = codec_rep_decode(op, (const uint8_t *)m->sb.data, m->sb.size,
	                          &r, err, sizeof(err));
	codec_rep_free(&r);
	mp_free(m);
	if (rc != code)
		th_fail(file, line, "decode gave %s (%s), expected %s",
		        kvt_errname(rc), err, kvt_errname(code));
	if (!err[0])
		th_fail(file, line, "no reason");
	if (want && !strstr(err, want))
		th_fail(file, line, "reason \"%s\" lacks \"%s\"", err, want);
}
#define refuse_rep(op, m, code, want)                                          \
	refuse_rep_(op, m, code, want, __FILE__, __LINE__)

static inline void accept_req_(struct mp *m, struct ipc_req *r,
                               const char *file, int line)
{
	char err[256] = "";
	int rc = codec_req_decode((const uint8_t *)m->sb.data, m->sb.size, r,
	                          err, sizeof(err));
	mp_free(m);
	if (rc)
		th_fail(file, line, "decode gave %s: %s", kvt_errname(rc), err);
}
#define accept_req(m, r) accept_req_(m, r, __FILE__, __LINE__)

static inline struct ipc_req hello_req(void)
{
	struct ipc_req q;
	memset(&q, 0, sizeof(q));
	q.op = IPC_OP_HELLO;
	struct ipc_hello *h = &q.u.hello;
	snprintf(h->name, sizeof(h->name), "engine-7");
	h->geo = (struct kvt_geometry){32, 32, 8, 128, 4096};
	h->dtype = KVT_DTYPE_BF16;
	h->page_tokens = 16;
	h->max_seqs = 8;
	h->max_tokens = UINT32_MAX;
	h->headroom = 17;
	h->stage_tokens = 64;
	snprintf(h->policy, sizeof(h->policy), "snapkv:budget=512,window=32");
	h->quota_bytes = UINT64_MAX;
	h->cookie = 0x0123456789abcdefull;
	h->pid = 4242;
	return q;
}

static inline void req_roundtrip(const struct ipc_req *in, struct ipc_req *out)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	char err[256] = "";
	T_OK(codec_req_encode(in, &buf, &len));
	T_ASSERT(buf && len > 0 && len <= IPC_MAX_MSG);
	int rc = codec_req_decode(buf, len, out, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "decode: %s", err);
	T_EQ_STR(err, "");
	T_EQ(out->version, IPC_PROTO_VERSION);
	T_EQ(out->op, in->op);
	free(buf);
}

static inline void rep_roundtrip(enum ipc_op op, const struct ipc_rep *in,
                                 struct ipc_rep *out)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	char err[256] = "";
	T_OK(codec_rep_encode(op, in, &buf, &len));
	int rc = codec_rep_decode(op, buf, len, out, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "decode: %s", err);
	T_EQ(out->version, IPC_PROTO_VERSION);
	T_EQ(out->err, in->err);
	free(buf);
}

/* Number of keys of the top-level map of buf, read by msgpack-c. */
static inline uint32_t top_keys(const uint8_t *buf, size_t len)
{
	msgpack_unpacked up;
	size_t off = 0;
	uint32_t n = 0;
	msgpack_unpacked_init(&up);
	if (msgpack_unpack_next(&up, (const char *)buf, len, &off) ==
	            MSGPACK_UNPACK_SUCCESS &&
	    up.data.type == MSGPACK_OBJECT_MAP)
		n = up.data.via.map.size;
	msgpack_unpacked_destroy(&up);
	return n;
}

#endif
