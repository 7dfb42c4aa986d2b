/*
 * test_engine_gguf.c — kvtrim-engine on llama GGUF files, through the real
 * kvtrimd: the text modes (chat, generate, score) and their refusals on a
 * tiny GGUF with a byte-level tokenizer written here (tests/harness/gb.c),
 * so they run on every machine; and SmolLM2-135M-Instruct from `make
 * models` answering a factual question and scoring English text (skipped
 * with the reason when the model is not in the cache, as the gguf and
 * tokenizer tests do).
 *
 * Expected values do not come from the engine: with policy `full` the
 * daemon-backed engine must print exactly what the dense in-process
 * reference (--no-daemon) prints; the tiny tokenizer has no merges, so a
 * text of n bytes is n tokens; SmolLM2 must know that Paris is the capital
 * of France, and its mean NLL on English prose (Lincoln's Gettysburg
 * Address and the opening of the Declaration of Independence,
 * tests/fixtures/text/english.txt) is about 2.3 nats/token (a wrong RoPE
 * or tensor layout gives 8 or more).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "gb.h"
#include "gguf.h"
#include "model.h"
#include "model_files.h"
#include "test.h"

#define ENGLISH "tests/fixtures/text/english.txt"

/* A path in the test's scratch directory; the last 16 stay valid. */
static const char *tmp_path(const char *name)
{
	static char buf[16][512];
	static int k;
	k = (k + 1) % 16;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", th_tmpdir(), name);
	return buf[k];
}

/* A tiny llama GGUF (2 layers, d 32, 4 heads, 2 KV heads, context 64) with
 * random weights, the byte tokenizer unless o says otherwise. */
static const char *tiny_gguf(const char *name, struct gb_llama_opts o)
{
	char err[512];
	struct model m;
	struct model_config c = {
		.dim = 32, .hidden_dim = 64, .n_layers = 2, .n_heads = 4,
		.n_kv_heads = 2, .vocab_size = GB_TOK_VOCAB, .seq_len = 64,
		.shared_classifier = 1,
	};
	T_OK(model_alloc(&m, &c, err, sizeof(err)));
	gb_llama_fill(&m, 3);
	struct gb b = {0};
	gb_llama(&b, &m, &o);
	const char *path = tmp_path(name);
	gb_write(&b, path);
	gb_free(&b);
	model_free(&m);
	return path;
}

/* The value after `key` in out, as a double. */
static double field(const char *out, const char *key)
{
	const char *p = strstr(out, key);
	if (!p)
		th_fail(__FILE__, __LINE__, "no '%s' in:\n%s", key, out);
	return strtod(p + strlen(key), NULL);
}

/* What a command printed: stdout and stderr apart, NUL-terminated. */
struct outs {
	char o[16384], e[8192];
	size_t olen;
	int rc;
};

static size_t slurp(const char *name, char *buf, size_t cap)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", th_tmpdir(), name);
	FILE *f = fopen(path, "rb");
	T_ASSERT(f);
	size_t n = fread(buf, 1, cap - 1, f);
	fclose(f);
	buf[n] = 0;
	return n;
}

/* Runs the command (KVTRIM_RUNTIME_DIR set when d is not NULL) with its
 * stdout and stderr in files, so they stay apart; fills *r. */
static void run(const struct th_daemon *d, struct outs *r, const char *fmt,
                ...) __attribute__((format(printf, 3, 4)));

static void run(const struct th_daemon *d, struct outs *r, const char *fmt,
                ...)
{
	char cmd[3000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	/* th_sh appends 2>&1: it lands on the exit, after the files */
	r->rc = th_sh(d, NULL, 0, "%s >%s/stdout 2>%s/stderr; exit $?", cmd,
	              th_tmpdir(), th_tmpdir());
	r->olen = slurp("stdout", r->o, sizeof(r->o));
	slurp("stderr", r->e, sizeof(r->e));
}

/* Runs the command, expecting exit status code, an empty stdout and a
 * stderr holding word. */
static void refused(const struct th_daemon *d, int code, const char *word,
                    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void refused(const struct th_daemon *d, int code, const char *word,
                    const char *fmt, ...)
{
	static struct outs r;
	char cmd[3000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	run(d, &r, "%s", cmd);
	if (r.rc != code || r.olen || !strstr(r.e, word))
		th_fail(__FILE__, __LINE__, "%s: exit %d (expected %d), stdout "
		        "\"%s\", stderr \"%s\" (expected \"%s\")", cmd, r.rc,
		        code, r.o, r.e, word);
}

TEST_T(engine_gguf, tiny_text_modes_daemon_equals_dense, 120)
{
	const char *bin = th_bin("kvtrim-engine");
	const char *mdl = tiny_gguf("tiny.gguf", (struct gb_llama_opts){
		.tokenizer = 1});
	static struct outs a, b;
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);

	run(NULL, &a, "%s --model %s info", bin, mdl);
	T_EQ(a.rc, 0);
	T_ASSERT(strstr(a.o, "gguf dim 32 hidden 64 layers 2 heads 4 "
	                     "kv_heads 2"));
	T_ASSERT(strstr(a.o, "context 64, bos none, tokenizer 258 tokens, end "
	                     "of turn 257"));

	/* stdout compared as bytes: random weights emit any byte */
	const char *modes[] = {
		"chat --prompt 'hello there' --max-tokens 12",
		"generate --prompt 'ab' --steps 9",
		"chat --prompt 'x' --max-tokens 40 --temperature 0.8 --seed 7",
	};
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		run(&d, &a, "%s --model %s --runtime-dir %s %s", bin, mdl,
		    d.dir, modes[i]);
		run(NULL, &b, "%s --model %s --no-daemon %s", bin, mdl,
		    modes[i]);
		if (a.rc || b.rc)
			th_fail(__FILE__, __LINE__, "%s: exit %d / %d: %s / %s",
			        modes[i], a.rc, b.rc, a.e, b.e);
		T_ASSERT(a.olen > 1); /* something was printed */
		T_EQ(a.olen, b.olen);
		T_ASSERT(!memcmp(a.o, b.o, a.olen));
	}
	/* generate prints the prompt first */
	run(NULL, &a, "%s --model %s --no-daemon generate --prompt 'ab' "
	    "--steps 3", bin, mdl);
	T_ASSERT(a.rc == 0 && !strncmp(a.o, "ab", 2));

	/* score: no merges, so n bytes are n tokens (no BOS) */
	run(&d, &a, "%s --model %s --runtime-dir %s --chunk 16 score --input "
	    "%s --max-bytes 600 --prefill 40", bin, mdl, d.dir, ENGLISH);
	run(NULL, &b, "%s --model %s --no-daemon --chunk 16 score --input %s "
	    "--max-bytes 600 --prefill 40", bin, mdl, ENGLISH);
	T_ASSERT(a.rc == 0 && b.rc == 0);
	/* the context is 64: the text is cut there */
	T_EQ(field(a.o, "tokens "), 64);
	T_ASSERT(fabs(field(a.o, " nll ") - field(b.o, " nll ")) < 1e-5);
	/* a random model over 258 tokens: about log(258) = 5.55 */
	T_ASSERT(field(a.o, " nll ") > 4 && field(a.o, " nll ") < 7);
	T_ASSERT(strstr(a.o, "evicted 0"));
	run(NULL, &b, "%s --model %s --no-daemon score --input %s "
	    "--max-bytes 50", bin, mdl, ENGLISH);
	T_EQ(b.rc, 0);
	T_EQ(field(b.o, "tokens "), 50);
	T_EQ(th_daemon_stop(&d), 0);
}

/* chat --prompt-file F --question Q: F's text without its trailing newline,
 * a blank line, Q; --summary's accounting against a hand count. */
TEST_T(engine_gguf, tiny_chat_prompt_file_and_summary, 120)
{
	const char *bin = th_bin("kvtrim-engine");
	const char *mdl = tiny_gguf("tiny.gguf", (struct gb_llama_opts){
		.tokenizer = 1});
	const char *doc = tmp_path("doc.txt");
	static struct outs a, b;
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	T_EQ(th_sh(NULL, NULL, 0, "printf 'hello there\n' > %s", doc), 0);

	run(&d, &a, "%s --model %s --runtime-dir %s --chunk 16 --summary chat "
	    "--prompt-file %s --question 'why?' --max-tokens 12", bin, mdl,
	    d.dir, doc);
	run(NULL, &b, "%s --model %s --no-daemon --summary chat --prompt "
	    "\"$(printf 'hello there\n\nwhy?')\" --max-tokens 12", bin, mdl);
	if (a.rc || b.rc)
		th_fail(__FILE__, __LINE__, "exit %d / %d: %s / %s", a.rc,
		        b.rc, a.e, b.e);
	T_EQ(a.olen, b.olen);
	T_ASSERT(!memcmp(a.o, b.o, a.olen));
	/* the byte tokenizer: 11 + 2 + 4 bytes, and the template's
	 * <|im_start|> "user\n" <|im_end|> "\n" <|im_start|> "assistant\n" */
	const double P = 11 + 2 + 4 + 1 + 5 + 1 + 1 + 1 + 10;
	T_EQ(field(a.e, "prompt_tokens="), P);
	T_EQ(field(b.e, "prompt_tokens="), P);
	/* every answer token is fed back but a cut answer's last */
	double n = field(a.e, "answer_tokens="), nd = field(a.e,
	                                                    "decode_tokens=");
	T_EQ(nd, strstr(a.e, "ended=eot") ? n : n - 1);
	/* 2 layers x 2 KV heads, nothing evicted; a page is 16 entries of K
	 * and V, 8 floats each: 1024 bytes */
	T_EQ(field(a.e, "entries_appended="), 4 * (P + nd));
	T_EQ(field(a.e, "entries_kept="), 4 * (P + nd));
	T_EQ(field(a.e, "entries_evicted="), 0);
	T_EQ(field(a.e, "page_bytes="), 1024);
	T_EQ(field(a.e, "kv_bytes="), 1024 * field(a.e, "pages_used="));
	/* each list: its entries, then one page of headroom (a chunk of 16) */
	T_EQ(field(a.e, "pages_used="), 4 * (ceil((P + nd) / 16) + 1));
	T_ASSERT(strstr(a.e, "kept_fraction=1.000"));
	/* without the daemon there is no pool to count */
	T_ASSERT(!strstr(b.e, "kv_bytes"));
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(engine_gguf, bad_input_refused, 120)
{
	const char *bin = th_bin("kvtrim-engine");
	const char *mdl = tiny_gguf("tiny.gguf", (struct gb_llama_opts){
		.tokenizer = 1});
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);

	/* model files: truncated, corrupt, unsupported type, wrong shape */
	const char *q5 = tiny_gguf("q5.gguf", (struct gb_llama_opts){
		.retype = "blk.0.attn_k.weight", .retype_to = GGUF_GGML_Q5_0});
	const char *shape = tiny_gguf("shape.gguf", (struct gb_llama_opts){
		.reshape = "blk.1.ffn_down.weight"});
	const char *cut = tmp_path("cut.gguf");
	T_EQ(th_sh(NULL, NULL, 0, "head -c 3000 %s > %s", mdl, cut), 0);
	/* n_kv's high bytes set: 2^63 keys claimed */
	const char *bad = tmp_path("count.gguf");
	T_EQ(th_sh(NULL, NULL, 0, "{ head -c 20 %s; printf '\\377\\377\\377"
	           "\\177'; tail -c +25 %s; } > %s", mdl, mdl, bad), 0);
	const struct {
		const char *path, *word;
	} files[] = {
		{cut, "cut.gguf"}, {bad, "count.gguf"}, {q5, "Q5_0"},
		{shape, "blk.1.ffn_down.weight"},
	};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		refused(&d, 1, files[i].word, "%s --model %s --runtime-dir %s "
		        "chat --prompt hi", bin, files[i].path, d.dir);
	/* the cached model missing: the `make models` hint */
	refused(NULL, 1, "make models", "KVTRIM_MODELS=%s %s --model smollm2 "
	        "info", th_tmpdir(), bin);

	/* prompts: invalid UTF-8 (through the daemon and without) */
	refused(&d, 2, "UTF-8",
	        "%s --model %s --runtime-dir %s chat "
	        "--prompt \"$(printf 'caf\\303')\"", bin, mdl, d.dir);
	refused(NULL, 2, "UTF-8",
	        "%s --model %s --no-daemon generate "
	        "--prompt \"$(printf 'a\\377b')\" --steps 2", bin, mdl);
	/* longer than the context (64) or than --context */
	refused(&d, 2, "no room for an answer",
	        "%s --model %s --runtime-dir %s chat "
	        "--prompt \"$(printf '%%070d' 0)\"", bin, mdl, d.dir);
	refused(NULL, 2, "the context 16",
	        "%s --model %s --no-daemon --context 16 "
	        "generate --prompt 'seventeen bytes..' --steps 2", bin, mdl);
	refused(NULL, 2, "--max-tokens", "%s --model %s --no-daemon chat "
	        "--prompt hi --max-tokens 0", bin, mdl);
	/* --prompt-file: missing, a NUL byte, invalid UTF-8, longer than the
	 * context, given with --prompt, outside chat */
	const char *nul = tmp_path("nul.txt"), *lat = tmp_path("latin1.txt");
	const char *big = tmp_path("big.txt"), *ok = tmp_path("ok.txt");
	T_EQ(th_sh(NULL, NULL, 0, "printf 'a\\000b' > %s; printf 'caf\\351' > "
	           "%s; printf '%%070d' 0 > %s; echo hi > %s", nul, lat, big,
	           ok), 0);
	refused(&d, 2, "no-such.txt: No such file", "%s --model %s "
	        "--runtime-dir %s chat --prompt-file %s/no-such.txt", bin, mdl,
	        d.dir, th_tmpdir());
	refused(NULL, 2, "NUL byte at offset 1", "%s --model %s --no-daemon "
	        "chat --prompt-file %s", bin, mdl, nul);
	refused(&d, 2, "UTF-8", "%s --model %s --runtime-dir %s chat "
	        "--prompt-file %s --question x", bin, mdl, d.dir, lat);
	refused(&d, 2, "no room for an answer", "%s --model %s --runtime-dir "
	        "%s --summary chat --prompt-file %s --question 'and?'", bin,
	        mdl, d.dir, big);
	refused(NULL, 2, "give one", "%s --model %s --no-daemon chat --prompt "
	        "hi --prompt-file %s", bin, mdl, ok);
	refused(NULL, 2, "chat's", "%s --model %s --no-daemon generate "
	        "--prompt-file %s --steps 2", bin, mdl, ok);
	/* a model without a tokenizer has no chat */
	const char *notok = tiny_gguf("notok.gguf", (struct gb_llama_opts){0});
	refused(NULL, 2, "tokenizer", "%s --model %s --no-daemon chat "
	        "--prompt hi", bin, notok);
	/* the daemon is unharmed */
	T_ASSERT(th_daemon_alive(&d));
	T_EQ(th_daemon_stop(&d), 0);
}

/* ---------------------------------------------------------------- SmolLM2 */

static void smollm2_or_skip(void)
{
	char path[4200], err[KVT_ERRTEXT_MAX], why[KVT_ERRTEXT_MAX + 32];
	if (model_files_find(MODEL_FILES_SMOLLM2, path, sizeof(path), err,
	                     sizeof(err)) < 0) {
		snprintf(why, sizeof(why), "%s", err);
		T_SKIP(why);
	}
}

TEST_T(engine_gguf, smollm2_chat_answers_through_the_daemon, 180)
{
	smollm2_or_skip();
	const char *bin = th_bin("kvtrim-engine");
	static struct outs a, b;
	struct th_daemon d;
	th_daemon_start(&d, "256M", NULL);
	run(&d, &a, "%s --model smollm2 --runtime-dir %s --timing chat "
	    "--prompt 'What is the capital of France?' --max-tokens 24", bin,
	    d.dir);
	if (a.rc || !strstr(a.o, "Paris"))
		th_fail(__FILE__, __LINE__, "exit %d, answer \"%s\", stderr %s",
		        a.rc, a.o, a.e);
	printf("    chat: %s    %s", a.o, a.e);
	run(NULL, &b, "%s --model smollm2 --no-daemon chat --prompt 'What is "
	    "the capital of France?' --max-tokens 24", bin);
	T_EQ(b.rc, 0);
	T_EQ_STR(a.o, b.o);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(engine_gguf, smollm2_score_english_text, 240)
{
	smollm2_or_skip();
	th_skip_emulated_engine("a SmolLM2 prefill of 530 tokens");
	const char *bin = th_bin("kvtrim-engine");
	static struct outs a, b;
	struct th_daemon d;
	th_daemon_start(&d, "256M", NULL);
	run(&d, &a, "%s --model smollm2 --runtime-dir %s --timing score "
	    "--input %s --prefill 4096", bin, d.dir, ENGLISH);
	T_EQ(a.rc, 0);
	double nll = field(a.o, " nll ");
	printf("    %s    %s", a.o, a.e);
	T_ASSERT(field(a.o, "tokens ") > 400);
	T_ASSERT(nll > 1.0 && nll < 3.0);
	T_ASSERT(strstr(a.o, "evicted 0"));
	/* the dense reference on a prefix, prefill then decode */
	run(&d, &a, "%s --model smollm2 --runtime-dir %s score --input %s "
	    "--max-bytes 400 --prefill 40", bin, d.dir, ENGLISH);
	run(NULL, &b, "%s --model smollm2 --no-daemon score --input %s "
	    "--max-bytes 400 --prefill 40", bin, ENGLISH);
	T_ASSERT(a.rc == 0 && b.rc == 0);
	T_ASSERT(fabs(field(a.o, " nll ") - field(b.o, " nll ")) < 1e-5);
	T_EQ(th_daemon_stop(&d), 0);
}

/*
 * A document of about 350 tokens (the Gettysburg Address with the sentence
 * examples/demo.sh plants in its document) and a question about that
 * sentence, through the daemon:
 * with the full cache the answer names it; with snapkv ratio=0.75 the
 * daemon keeps, per list, P - floor(0.75 P) prompt entries (P the prompt's
 * tokens) and every decode token (docs/policies.md).  The compressed
 * answer is printed, not judged: that is the demo's and the eval's part.
 */
TEST_T(engine_gguf, smollm2_document_question_full_and_snapkv, 300)
{
	smollm2_or_skip();
	th_skip_emulated_engine("two SmolLM2 prompts of 388 tokens");
	const char *bin = th_bin("kvtrim-engine");
	const char *doc = tmp_path("gettysburg.txt");
	static struct outs a, b;
	struct th_daemon d;
	th_daemon_start(&d, "256M", NULL);
	T_EQ(th_sh(NULL, NULL, 0, "{ sed -n 1,3p %s; echo; echo 'The first "
	           "kvtrimd ever started ran on a test machine named "
	           "Marigold.'; echo; sed -n 5p "
	           "%s; } > %s", ENGLISH, ENGLISH, doc), 0);
	const char *q = "What was the name of the test machine the first "
	                "kvtrimd ran on?";
	run(&d, &a, "%s --model smollm2 --runtime-dir %s --summary chat "
	    "--prompt-file %s --question '%s' --max-tokens 24", bin, d.dir,
	    doc, q);
	if (a.rc || !strstr(a.o, "Marigold"))
		th_fail(__FILE__, __LINE__, "exit %d, answer \"%s\", stderr %s",
		        a.rc, a.o, a.e);
	printf("    full: %s    %s", a.o, a.e);
	run(&d, &b, "%s --model smollm2 --runtime-dir %s --tenant qa-snapkv "
	    "--policy snapkv:ratio=0.75 --summary chat --prompt-file %s "
	    "--question '%s' --max-tokens 24", bin, d.dir, doc, q);
	T_EQ(b.rc, 0);
	printf("    snapkv:ratio=0.75: %s    %s", b.o, b.e);
	/* 30 layers x 3 KV heads; a page is 16 entries of K and V of 64
	 * floats: 8192 bytes */
	const double L = 90, P = field(a.e, "prompt_tokens=");
	T_ASSERT(P > 300 && P < 400);
	T_EQ(field(b.e, "prompt_tokens="), P);
	double nd = field(a.e, "decode_tokens=");
	T_EQ(field(a.e, "entries_appended="), L * (P + nd));
	T_EQ(field(a.e, "entries_kept="), L * (P + nd));
	T_EQ(field(a.e, "page_bytes="), 8192);
	T_EQ(field(a.e, "kv_bytes="), 8192 * field(a.e, "pages_used="));
	nd = field(b.e, "decode_tokens=");
	T_EQ(field(b.e, "entries_appended="), L * (P + nd));
	T_EQ(field(b.e, "entries_kept="), L * (P - floor(0.75 * P) + nd));
	T_EQ(field(b.e, "kv_bytes="), 8192 * field(b.e, "pages_used="));
	T_ASSERT(field(b.e, "kv_bytes=") < 0.5 * field(a.e, "kv_bytes="));
	T_EQ(th_daemon_stop(&d), 0);
}
