/*
 * gen_seeds.c — writes the seed corpora of the fuzz targets:
 *
 *   OUT/codec/    a valid encoding of every request op and of every reply
 *                 (success and error) from the real encoder, plus a few
 *                 near misses (wrong version, unknown op, trailing byte)
 *   OUT/weights/  small safetensors files in fuzz_weights' input layout
 *                 (byte 0 the form): F32 from weights_write, F16 and BF16
 *                 built by hand, a kvpress directory with config.json, and
 *                 invalid ones (overlap, short data, NaN, bad dtype)
 *   OUT/config/   config files: every key set, comments, sizes with
 *                 suffixes, and files with errors
 *
 * Usage: gen_seeds OUT.  Deterministic, so `make fuzz-seeds` can be rerun;
 * the committed corpora are these seeds merged with what the fuzzers found.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec.h"
#include "weights.h"

static const char *out_dir;

static void die(const char *what)
{
	fprintf(stderr, "gen_seeds: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void mkdir_p(const char *sub)
{
	char p[512];
	snprintf(p, sizeof(p), "%s", out_dir);
	if (mkdir(p, 0755) && errno != EEXIST)
		die(p);
	snprintf(p, sizeof(p), "%s/%s", out_dir, sub);
	if (mkdir(p, 0755) && errno != EEXIST)
		die(p);
}

static void put2(const char *sub, const char *name, const void *a, size_t na,
                 const void *b, size_t nb)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s/%s", out_dir, sub, name);
	FILE *f = fopen(p, "wb");
	if (!f || fwrite(a, 1, na, f) != na ||
	    (nb && fwrite(b, 1, nb, f) != nb) || fclose(f))
		die(p);
}

static void put(const char *sub, const char *name, const void *a, size_t n)
{
	put2(sub, name, a, n, NULL, 0);
}

/* ------------------------------------------------------------- codec */

static void seed_req(const char *name, const struct ipc_req *r)
{
	uint8_t *b;
	size_t n;
	if (codec_req_encode(r, &b, &n)) {
		fprintf(stderr, "gen_seeds: cannot encode request %s\n", name);
		exit(1);
	}
	put("codec", name, b, n);
	free(b);
}

static void seed_rep(const char *name, enum ipc_op op,
                     const struct ipc_rep *r)
{
	uint8_t *b;
	size_t n;
	if (codec_rep_encode(op, r, &b, &n)) {
		fprintf(stderr, "gen_seeds: cannot encode reply %s\n", name);
		exit(1);
	}
	put("codec", name, b, n);
	free(b);
}

static void gen_codec(void)
{
	static struct ipc_req r;
	static struct ipc_rep p;
	char name[64];

	mkdir_p("codec");
	memset(&r, 0, sizeof(r));
	r.op = IPC_OP_HELLO;
	snprintf(r.u.hello.name, sizeof(r.u.hello.name), "engine-0");
	r.u.hello.geo = (struct kvt_geometry){2, 4, 2, 16, 64};
	r.u.hello.dtype = KVT_DTYPE_F16;
	r.u.hello.page_tokens = 16;
	r.u.hello.max_seqs = 8;
	r.u.hello.max_tokens = 4096;
	r.u.hello.headroom = 16;
	r.u.hello.stage_tokens = 32;
	snprintf(r.u.hello.policy, sizeof(r.u.hello.policy),
	         "kvzap:model=/w.safetensors,threshold=-4,window=128");
	r.u.hello.quota_bytes = 64u << 20;
	r.u.hello.cookie = 0x0123456789abcdefull;
	r.u.hello.pid = 4242;
	seed_req("req-hello", &r);

	memset(&r, 0, sizeof(r));
	r.tenant = 3;
	r.token = 0xfeedfacecafebeefull;
	r.op = IPC_OP_BYE;
	seed_req("req-bye", &r);
	r.op = IPC_OP_SEQ_OPEN;
	r.u.open.no = 5;
	r.u.open.undo = 3;
	seed_req("req-seq_open", &r);
	r.u.open.undo = 0;
	r.op = IPC_OP_SEQ_CLOSE;
	r.u.seq = 7;
	seed_req("req-seq_close", &r);
	r.op = IPC_OP_SEQ_QUERY;
	r.u.query.seq = 0x0000010000010003ull;
	r.u.query.no = 42;
	r.u.query.after = 41;
	seed_req("req-seq_query", &r);

	struct ipc_sync_item items[3] = {
		{1, 0, 16, KVT_PHASE_PREFILL, 0, 1},
		{2, 41, 1, KVT_PHASE_DECODE, 0, 0},
		{UINT64_MAX, UINT32_MAX, 4, KVT_PHASE_DECODE, 1, 2},
	};
	r.op = IPC_OP_SYNC;
	r.u.sync.no = 17;
	r.u.sync.n = 3;
	r.u.sync.items = items;
	seed_req("req-sync", &r);
	r.u.sync.n = 1;
	seed_req("req-sync-one", &r);

	/* Admin ops, without and with credentials and filters. */
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
		if (!codec_op_is_admin((enum ipc_op)op))
			continue;
		memset(&r, 0, sizeof(r));
		r.op = (enum ipc_op)op;
		if (op == IPC_OP_DRAIN)
			snprintf(r.u.drain.tenant, sizeof(r.u.drain.tenant),
			         "engine-0");
		if (op == IPC_OP_CONFIG_SET) {
			snprintf(r.u.set.key, sizeof(r.u.set.key),
			         "high_watermark");
			snprintf(r.u.set.value, sizeof(r.u.set.value), "0.75");
		}
		snprintf(name, sizeof(name), "req-%s", codec_op_name(r.op));
		seed_req(name, &r);
		r.tenant = 1;
		r.token = 99;
		if (op == IPC_OP_STATS)
			snprintf(r.u.filter, sizeof(r.u.filter), "engine-0");
		if (op == IPC_OP_CONFIG)
			snprintf(r.u.filter, sizeof(r.u.filter), "pool_size");
		if (op == IPC_OP_DRAIN)
			r.u.drain.undo = 1;
		snprintf(name, sizeof(name), "req-%s-full",
		         codec_op_name(r.op));
		seed_req(name, &r);
	}

	/* Replies: one success per op and one error. */
	for (int op = IPC_OP_NONE + 1; op < IPC_OP_COUNT; op++) {
		memset(&p, 0, sizeof(p));
		struct ipc_row *rows = NULL;
		if (op == IPC_OP_HELLO) {
			p.u.hello.tenant = 5;
			p.u.hello.token = 0x1122334455667788ull;
			p.u.hello.max_seqs = 8;
			p.u.hello.max_tokens = 4096;
			p.u.hello.headroom = 16;
			p.u.hello.stage_tokens = 32;
			p.u.hello.page_tokens = 16;
			p.u.hello.quota_bytes = 128u << 20;
			p.u.hello.inputs = KVT_INPUT_X | KVT_INPUT_KV;
		} else if (op == IPC_OP_SEQ_OPEN) {
			p.u.seq = 12;
		} else if (op == IPC_OP_SEQ_QUERY) {
			p.u.query.syncs = 21;
			p.u.query.seen_lo = 300;
			p.u.query.seen_hi = 301;
			p.u.query.len_lo = 64;
			p.u.query.len_hi = 65;
			p.u.query.last = 1234;
		} else if (codec_op_is_admin((enum ipc_op)op)) {
			rows = calloc(2, sizeof(*rows));
			if (!rows)
				die("calloc");
			codec_row_u64(&rows[0], "pool_bytes_used", 4u << 20);
			codec_row_i64(&rows[0], "delta", -17);
			codec_row_f64(&rows[0], "pressure_level", 0.25);
			codec_row_str(&rows[0], "name", "engine-0");
			codec_row_str(&rows[1], "key", "pool_size");
			codec_row_str(&rows[1], "value", "268435456");
			codec_row_u64(&rows[1], "mutable", 0);
			p.table.n = 2;
			p.table.rows = rows;
		}
		snprintf(name, sizeof(name), "rep-%s", codec_op_name(op));
		seed_rep(name, (enum ipc_op)op, &p);
		codec_rep_free(&p);
		codec_rep_error(&p, KVT_EPOOLFULL, "pool full (deadline)");
		snprintf(name, sizeof(name), "rep-%s-error", codec_op_name(op));
		seed_rep(name, (enum ipc_op)op, &p);
	}

	/* Near misses: the error paths right next to valid messages (v1 is
	 * the old protocol version, refused). */
	static const uint8_t v1[] = {0x82, 0xa1, 'v', 0x01, 0xa2, 'o', 'p',
	                             0xa3, 'b', 'y', 'e'};
	static const uint8_t unk[] = {0x82, 0xa1, 'v', 0x02, 0xa2, 'o', 'p',
	                              0xa3, 'f', 'o', 'o'};
	static const uint8_t trail[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p',
	                                0xa3, 'b', 'y', 'e', 0xa1, 't', 0x01,
	                                0xa1, 'k', 0x02, 0xc0};
	put("codec", "bad-version", v1, sizeof(v1));
	put("codec", "bad-op", unk, sizeof(unk));
	put("codec", "bad-trailing", trail, sizeof(trail));
}

/* ------------------------------------------------------------- weights */

/* A safetensors file from a header string and a data section. */
static void st_put(const char *name, uint8_t form, const char *cfg,
                   const char *hdr, const void *data, size_t dlen)
{
	size_t hl = strlen(hdr), cl = cfg ? strlen(cfg) : 0;
	size_t n = 2 + cl + 8 + hl + dlen;
	uint8_t *b = malloc(n), *p = b;
	uint64_t h64 = hl;
	if (!b)
		die("malloc");
	*p++ = form;
	if (form & 1) {
		*p++ = (uint8_t)cl;
		memcpy(p, cfg, cl);
		p += cl;
	}
	memcpy(p, &h64, 8);
	memcpy(p + 8, hdr, hl);
	memcpy(p + 8 + hl, data, dlen);
	p += 8 + hl + dlen;
	put("weights", name, b, (size_t)(p - b));
	free(b);
}

static void gen_weights(void)
{
	char err[KVT_ERRTEXT_MAX], tmp[] = "/tmp/kvtrim-seeds-XXXXXX";
	char path[128];
	float w1[2 * 3] = {0.5f, -1, 2, 0.25f, 3, -4};
	float b1[2] = {-4, 1};
	float k4[1 * 1 * 2 * 2] = {1, 2, 3, 4};

	mkdir_p("weights");
	if (!mkdtemp(tmp))
		die("mkdtemp");
	snprintf(path, sizeof(path), "%s/w.safetensors", tmp);
	struct weights_tensor t[4] = {
		{"kvzap.0.fc1.weight", 2, {2, 3, 0, 0}, w1},
		{"kvzap.0.fc1.bias", 1, {2, 0, 0, 0}, b1},
		{"fastkvzip.0.k_base", 4, {1, 1, 2, 2}, k4},
		{"empty", 2, {0, 3, 0, 0}, NULL},
	};
	if (weights_write(path, t, 4, err, sizeof(err))) {
		fprintf(stderr, "gen_seeds: %s\n", err);
		exit(1);
	}
	FILE *f = fopen(path, "rb");
	static uint8_t buf[1 << 16];
	size_t n = f ? fread(buf + 1, 1, sizeof(buf) - 1, f) : 0;
	if (!f || !n)
		die(path);
	fclose(f);
	unlink(path);
	rmdir(tmp);
	buf[0] = 0;
	put("weights", "f32-written", buf, n + 1);

	/* F16 1.0, -2.0; BF16 0.5, 3.0 (little endian). */
	static const uint8_t f16[] = {0x00, 0x3c, 0x00, 0xc0};
	static const uint8_t bf16[] = {0x00, 0x3f, 0x40, 0x40};
	st_put("f16", 0, NULL,
	       "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
	       f16, sizeof(f16));
	st_put("bf16-meta", 0, NULL,
	       "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"BF16\","
	       "\"shape\":[1,2],\"data_offsets\":[0,4]}}   ",
	       bf16, sizeof(bf16));
	st_put("kvpress-dir", 1,
	       "{\"input_dim\":64,\"output_dim\":2,\"hidden_dim\":null,"
	       "\"n_modules\":2}",
	       "{\"layers.0.weight\":{\"dtype\":\"F32\",\"shape\":[2,1],"
	       "\"data_offsets\":[0,8]}}",
	       w1, 8);
	st_put("kvpress-dir-noconfig", 1, "",
	       "{\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
	       w1, 4);

	/* Invalid: each refused for one reason. */
	static const float nan1[1] = {__builtin_nanf("")};
	st_put("bad-nan", 0, NULL,
	       "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
	       nan1, 4);
	st_put("bad-overlap", 0, NULL,
	       "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
	       "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
	       w1, 8);
	st_put("bad-short", 0, NULL,
	       "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
	       w1, 8);
	st_put("bad-dtype", 0, NULL,
	       "{\"x\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
	       w1, 8);
	st_put("bad-dup", 0, NULL,
	       "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
	       "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
	       w1, 8);
	st_put("bad-json", 0, NULL, "{\"x\":{\"dtype\":", w1, 8);
}

/* ------------------------------------------------------------- config */

static void gen_config(void)
{
	mkdir_p("config");
	static const char all[] =
		"# every key\n"
		"runtime_dir = /run/kvtrimd\n"
		"backend = cpu\n"
		"pool_size = 64M\n"
		"default_quota = 16MiB\n"
		"max_tenants = 32\n"
		"contexts = 16\n"
		"hello_timeout_ms = 5000\n"
		"log_level = debug\n"
		"stats_tcp_port = 9100\n"
		"max_quota = 32MB\n"
		"allow_uids = 0,1000,root\n"
		"allow_gids = 0,root\n"
		"high_watermark = 0.75\n"
		"pressure_deadline_ms = 500\n"
		"tenant_priorities = engine-0=10,batch=1\n";
	static const char spaces[] =
		"\n   \t# indented comment\n\tpool_size\t=\t2G  \n"
		"high_watermark=1\r\nlog_level = warning\n";
	static const char bad_key[] = "pool_size = 64M\nno_such_key = 1\n";
	static const char bad_size[] = "pool_size = 12Q\n";
	static const char bad_line[] = "pool_size 64M\n";
	static const char bad_ratio[] = "high_watermark = 1.5\n";
	static const char bad_prio[] = "tenant_priorities = a=0,b\n";
	static const char bad_validate[] =
		"pool_size = 3M\ndefault_quota = 1G\n";
	put("config", "all-keys", all, sizeof(all) - 1);
	put("config", "spaces", spaces, sizeof(spaces) - 1);
	put("config", "bad-key", bad_key, sizeof(bad_key) - 1);
	put("config", "bad-size", bad_size, sizeof(bad_size) - 1);
	put("config", "bad-line", bad_line, sizeof(bad_line) - 1);
	put("config", "bad-ratio", bad_ratio, sizeof(bad_ratio) - 1);
	put("config", "bad-prio", bad_prio, sizeof(bad_prio) - 1);
	put("config", "bad-validate", bad_validate, sizeof(bad_validate) - 1);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_seeds OUT_DIR\n");
		return 2;
	}
	out_dir = argv[1];
	gen_codec();
	gen_weights();
	gen_config();
	return 0;
}
