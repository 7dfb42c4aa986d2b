/*
 * regress_test.c — regression tests for bugs the libFuzzer targets
 * (tests/fuzz, `make fuzz`) found.  Each test replays the minimised input
 * and checks the promise it broke.
 */
#include "codec.h"
#include "config.h"
#include "gguf.h"
#include "test.h"
#include "tokenizer.h"
#include "weights.h"

static int all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

/*
 * fuzz_codec: a request whose op had been read and that failed later (here
 * config_set with a key holding a NUL byte) came back with op set, so a
 * caller looking at req.op after the failure saw a half-filled message.
 * codec.h: "it never returns a half-filled message"; codec.c: "Any failure
 * ... leaves the output zeroed".
 */
TEST(fuzz_regress, codec_req_failure_zeroes_output)
{
	static const uint8_t crash[] = {
		0x84, 0xa1, 0x76, 0x04, 0xa2, 0x6f, 0x70, 0xaa, 0x63, 0x6f,
		0x6e, 0x66, 0x69, 0x67, 0x5f, 0x73, 0x65, 0x74, 0xa3, 0x6b,
		0x65, 0x79, 0xae, 0x68, 0x69, 0xff, 0xff, 0x60, 0x30, 0x00,
		0x0a, 0xfd, 0xc7, 0x6d, 0x61, 0x72, 0x6b, 0xa5, 0x76, 0x61,
		0x6c, 0x75, 0x65, 0xa4, 0x30, 0x2e, 0x37, 0x35,
	};
	struct ipc_req req;
	char err[KVT_ERRTEXT_MAX];
	memset(&req, 0xa5, sizeof(req));
	int rc = codec_req_decode(crash, sizeof(crash), &req, err, sizeof(err));
	T_EQ(rc, KVT_EPROTO);
	T_ASSERT(err[0]);
	T_ASSERT(all_zero(&req, sizeof(req)));
	codec_req_free(&req);

	/* The same for a sync whose items were allocated before an item
	 * failed: freed, and nothing left pointing at them. */
	static const uint8_t sync_bad[] = {
		0x86, 0xa1, 'v', 0x04, 0xa2, 'o', 'p', 0xa4, 's', 'y', 'n',
		'c', 0xa1, 't', 0x01, 0xa1, 'k', 0x02, 0xa1, 'n', 0x01,
		0xa5, 'i', 't', 'e',
		'm', 's', 0x92, 0x96, 0x01, 0x00, 0x01, 0x01, 0x00, 0x00,
		0x96, 0x01, 0x00, 0x01, 0x02, 0x00, 0x00, /* phase 2 */
	};
	memset(&req, 0xa5, sizeof(req));
	rc = codec_req_decode(sync_bad, sizeof(sync_bad), &req, err,
	                      sizeof(err));
	T_EQ(rc, KVT_EPROTO);
	T_ASSERT(strstr(err, "phase") != NULL);
	T_ASSERT(all_zero(&req, sizeof(req)));
	codec_req_free(&req);
}

/*
 * fuzz_weights: a file whose tensors are all empty (shape [0]) has no
 * arena, and read_tensors computed NULL + 0 for their data pointers:
 * undefined behaviour that UBSan reports ("applying zero offset to null
 * pointer"; run this test in `make SANITIZER=undefined test` to see it).
 * Empty tensors now keep data NULL and weights_get still hands out a valid
 * pointer.
 */
TEST(fuzz_regress, weights_only_empty_tensors)
{
	static const char hdr[] =
		"{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
		"\"f\":{\"dtype\":\"BF16\",\"shape\":[2,0],"
		"\"data_offsets\":[0,0]}}";
	char path[512], err[KVT_ERRTEXT_MAX];
	snprintf(path, sizeof(path), "%s/empty.safetensors", th_tmpdir());
	FILE *f = fopen(path, "wb");
	uint64_t hl = sizeof(hdr) - 1;
	T_ASSERT(f);
	T_ASSERT(fwrite(&hl, 8, 1, f) == 1);
	T_ASSERT(fwrite(hdr, 1, hl, f) == hl);
	T_ASSERT(fclose(f) == 0);

	struct weights *w = NULL;
	T_EQ(weights_load(path, &w, err, sizeof(err)), 0);
	T_ASSERT(w);
	T_EQ(weights_count(w), 2);
	uint64_t s1[1] = {0}, s2[2] = {2, 0};
	T_ASSERT(weights_get(w, "e", 1, s1, err, sizeof(err)) != NULL);
	T_ASSERT(weights_get(w, "f", 2, s2, err, sizeof(err)) != NULL);
	weights_free(w);
}

/*
 * fuzz_config: config_get rendered ratios with "%g", so a value in force
 * could not always be set back from its own rendering (`kvtrimctl config
 * get` then `set`, or a reload comparing rendered values): DBL_MIN came
 * out as 2.22507e-308, a subnormal that config_set refuses (ERANGE), and
 * 0.9000001 as 0.9.  Rendering now round-trips and stays short.
 */
TEST(fuzz_regress, config_ratio_renders_round_trip)
{
	static const char *const vals[] = {
		"2.2250738585072014e-308", "0.9000001", "0.9", "1",
		"0.333333333333333314829616256247390992939472198486328125",
	};
	static const char *const shown[] = {
		"2.2250738585072014e-308", "0.9000001", "0.9", "1",
		"0.3333333333333333",
	};
	const struct config_entry *e = config_find("high_watermark");
	T_ASSERT(e);
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		struct config a, b;
		char buf[64], err[256];
		config_defaults(&a);
		config_defaults(&b);
		T_EQ(config_set(&a, "high_watermark", vals[i], err,
		                sizeof(err)), 0);
		config_get(&a, e, buf, sizeof(buf));
		if (strcmp(buf, shown[i]))
			th_fail(__FILE__, __LINE__, "%s renders as %s, "
			        "expected %s", vals[i], buf, shown[i]);
		T_EQ(config_set(&b, "high_watermark", buf, err, sizeof(err)),
		     0);
		T_ASSERT(a.high_watermark == b.high_watermark);
	}
}

/*
 * fuzz_gguf: a vocabulary whose special token's text ends inside a UTF-8
 * character ("2024, caf\xc3") split fuzz_gguf's text there, and the plain
 * piece after it began with a lone continuation byte; encode_plain's
 * decoder returned 0 for it and the loop wrote code points past its
 * buffer without advancing (heap-buffer-overflow).  Such a byte is now a
 * code point of its own, and every byte of the text comes back from
 * decoding what was encoded.  The file is the fuzzer's input, kept in the
 * corpus (tests/fuzz/corpus/gguf).
 */
TEST(fuzz_regress, special_token_ending_inside_a_character)
{
	static const char text[] = "<|im_start|>user\nHi 2024, caf\xc3\xa9!"
	                           "<|im_end|>\n  end";
	const char *path = "tests/fuzz/corpus/gguf/"
	                   "special-token-splits-a-character.gguf";
	char err[KVT_ERRTEXT_MAX];
	FILE *f = fopen(path, "rb");
	T_ASSERT(f);
	static uint8_t buf[1 << 16];
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	struct gguf *g = NULL;
	struct tok *t = NULL;
	T_EQ(gguf_open_mem(buf, n, &g, err, sizeof(err)), 0);
	T_EQ(tok_load(g, &t, err, sizeof(err)), 0);
	struct tok_ids ids = {0};
	T_EQ(tok_encode(t, text, sizeof(text) - 1, TOK_SPECIAL, &ids, err,
	                sizeof(err)), 0);
	char *out = NULL;
	size_t len = 0;
	T_EQ(tok_decode(t, ids.v, ids.n, &out, &len, err, sizeof(err)), 0);
	T_EQ(len, sizeof(text) - 1);
	T_ASSERT(!memcmp(out, text, len));
	free(out);
	free(ids.v);
	tok_free(t);
	gguf_close(g);
}
