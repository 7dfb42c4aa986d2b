/*
 * main.c — kvtrim-engine, the reference engine's command line.  All the
 * work is in engine/ (model.c and model_gguf.c: loaders and forward,
 * engine.c: the KV cache in kvtrimd, tokenizer.c, oracle.c) and run.c (the
 * modes); this file parses options, loads the model and its tokenizer and
 * dispatches.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gguf.h"
#include "kvtrim.h"
#include "model.h"
#include "model_files.h"
#include "model_gguf.h"
#include "run.h"
#include "tokenizer.h"

static const char usage[] =
	"usage: kvtrim-engine [options] MODE [mode options]\n"
	"options:\n"
	"  --model PATH|NAME    llama2.c checkpoint or llama GGUF file, or\n"
	"                       smollm2 (SmolLM2-135M-Instruct from `make\n"
	"                       models`); default $KVTRIM_MODEL, else\n"
	"                       ../shared/models/bytes2m.bin\n"
	"  --runtime-dir DIR    kvtrimd runtime directory\n"
	"  --policy SPEC        eviction policy spec (default full)\n"
	"  --dtype f32|f16|bf16 K/V storage type in the pool (default f32)\n"
	"  --page-tokens N      entries per page (default 16)\n"
	"  --chunk N            prefill chunk = headroom (default 64)\n"
	"  --stage-tokens N     staging ring (default min(context, 512),\n"
	"                       at least chunk)\n"
	"  --context N          max entries per list (default: a GGUF's\n"
	"                       context_length, else min(seq_len, 512))\n"
	"  --tenant NAME        tenant name in the daemon's stats\n"
	"  --no-daemon          dense in-process reference, no kvtrimd\n"
	"  --stats              generate, chat: print what the policy kept\n"
	"                       (stderr)\n"
	"  --timing             prefill and decode tokens/s (stderr)\n"
	"  --summary            chat: one line of key=value on stderr:\n"
	"                       tokens, prefill and decode tokens/s, and\n"
	"                       the daemon's kv_bytes and entries kept\n"
	"  --temperature T      sampling temperature (default 0: greedy)\n"
	"  --seed S             sampling seed\n"
	"modes:\n"
	"  chat --prompt TEXT|--prompt-file FILE [--question TEXT]\n"
	"       [--max-tokens N (default 256)]\n"
	"           answers TEXT (or FILE's text, then a blank line and the\n"
	"           question) as the user's turn of the model's chat\n"
	"           template; stops at the end of turn; needs a tokenizer\n"
	"  generate --prompt TEXT --steps N\n"
	"           continues TEXT: through the tokenizer, as bytes for byte\n"
	"           models, else token ids \"1 42 7\"\n"
	"  score --input FILE [--max-bytes N] [--prefill N] [--dump-logits F]\n"
	"           teacher-forced mean NLL of [BOS +] FILE (truncated to the\n"
	"           context); the first N tokens (default chunk) are prefill,\n"
	"           the rest decode one by one; F gets float32 [T][vocab]\n"
	"  tokenize --input FILE [--max-bytes N]\n"
	"           the tokenizer's ids of FILE's text (no BOS), on one line\n"
	"  oracle --kind kvzip|kvzip+|future --input FILE --out F.bin\n"
	"         [--horizon N (default 32)] [--max-bytes N]\n"
	"  info     print the model's hyperparameters\n";

struct opts {
	const char *model, *mode;
	struct run_opts r;
};

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-')
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		int u = 0; /* 1: consumed v */
		uint32_t n;
#define NEED_V()                                                               \
	do {                                                                   \
		if (!v) {                                                      \
			fprintf(stderr, "kvtrim-engine: %s needs a value\n", \
			        a);                                            \
			return -1;                                             \
		}                                                              \
		u = 1;                                                         \
	} while (0)
#define NEED_U32(dst)                                                          \
	do {                                                                   \
		NEED_V();                                                      \
		if (parse_u32(v, &n)) {                                        \
			fprintf(stderr, "kvtrim-engine: %s: bad number "     \
			        "'%s'\n", a, v);                               \
			return -1;                                             \
		}                                                              \
		dst = n;                                                       \
	} while (0)
		if (!strcmp(a, "--model")) {
			NEED_V();
			o->model = v;
		} else if (!strcmp(a, "--runtime-dir")) {
			NEED_V();
			o->r.eo.runtime_dir = v;
		} else if (!strcmp(a, "--policy")) {
			NEED_V();
			o->r.eo.policy = v;
		} else if (!strcmp(a, "--tenant")) {
			NEED_V();
			o->r.eo.tenant = v;
		} else if (!strcmp(a, "--dtype")) {
			NEED_V();
			if (dtype_parse(v, &o->r.eo.dtype)) {
				fprintf(stderr, "kvtrim-engine: --dtype %s: "
				        "f32, f16 or bf16\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--page-tokens")) {
			NEED_U32(o->r.eo.page_tokens);
		} else if (!strcmp(a, "--chunk")) {
			NEED_U32(o->r.eo.chunk);
		} else if (!strcmp(a, "--stage-tokens")) {
			NEED_U32(o->r.eo.stage_tokens);
		} else if (!strcmp(a, "--context")) {
			NEED_U32(o->r.eo.context);
		} else if (!strcmp(a, "--no-daemon")) {
			o->r.no_daemon = 1;
		} else if (!strcmp(a, "--stats")) {
			o->r.stats = 1;
		} else if (!strcmp(a, "--prompt")) {
			NEED_V();
			o->r.prompt = v;
		} else if (!strcmp(a, "--prompt-file")) {
			NEED_V();
			o->r.prompt_file = v;
		} else if (!strcmp(a, "--question")) {
			NEED_V();
			o->r.question = v;
		} else if (!strcmp(a, "--summary")) {
			o->r.summary = 1;
		} else if (!strcmp(a, "--timing")) {
			o->r.timing = 1;
		} else if (!strcmp(a, "--max-tokens")) {
			NEED_U32(o->r.max_tokens);
		} else if (!strcmp(a, "--steps")) {
			NEED_U32(o->r.steps);
		} else if (!strcmp(a, "--temperature")) {
			NEED_V();
			char *end;
			o->r.temperature = strtod(v, &end);
			if (end == v || *end || !(o->r.temperature >= 0)) {
				fprintf(stderr, "kvtrim-engine: bad "
				        "--temperature '%s'\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--seed")) {
			NEED_V();
			char *end;
			o->r.seed = strtoull(v, &end, 10);
			if (end == v || *end) {
				fprintf(stderr, "kvtrim-engine: bad --seed "
				        "'%s'\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--input")) {
			NEED_V();
			o->r.input = v;
		} else if (!strcmp(a, "--max-bytes")) {
			NEED_U32(o->r.max_bytes);
		} else if (!strcmp(a, "--prefill")) {
			NEED_U32(o->r.prefill);
			o->r.prefill_set = 1;
		} else if (!strcmp(a, "--dump-logits")) {
			NEED_V();
			o->r.dump = v;
		} else if (!strcmp(a, "--kind")) {
			NEED_V();
			o->r.kind = v;
		} else if (!strcmp(a, "--horizon")) {
			NEED_U32(o->r.horizon);
		} else if (!strcmp(a, "--out")) {
			NEED_V();
			o->r.out = v;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			fputs(usage, stdout);
			return 1;
		} else if (a[0] == '-') {
			fprintf(stderr, "kvtrim-engine: unknown option %s\n", a);
			return -1;
		} else if (!o->mode) {
			o->mode = a;
		} else {
			fprintf(stderr, "kvtrim-engine: unexpected '%s'\n", a);
			return -1;
		}
		i += u;
#undef NEED_V
#undef NEED_U32
	}
	return 0;
}

/* The model and, for a GGUF file, its tokenizer (NULL with the reason in
 * why when it has none this engine reads). */
static int load(const char *path, struct model *m, struct tok **tok,
                char *why, size_t whylen)
{
	char err[1024];
	struct gguf *g = NULL;
	*tok = NULL;
	snprintf(why, whylen, "a llama2.c checkpoint has none");
	int rc = model_load(path, m, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvtrim-engine: %s\n", err);
		return 1;
	}
	if (m->version != MODEL_GGUF)
		return 0;
	/* model_load checked the file; opening it again is a map. */
	if (gguf_open(path, &g, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvtrim-engine: %s\n", err);
		model_free(m);
		return 1;
	}
	if (!gguf_find(g, "tokenizer.ggml.model")) {
		snprintf(why, whylen, "no tokenizer.ggml.model in the file");
	} else if ((rc = tok_load(g, tok, err, sizeof(err))) < 0) {
		if (rc != KVT_ENOTSUP) {
			fprintf(stderr, "kvtrim-engine: %s: tokenizer: %s\n",
			        path, err);
			gguf_close(g);
			model_free(m);
			return 1;
		}
		snprintf(why, whylen, "%s", err);
	} else if (tok_vocab_size(*tok) > m->cfg.vocab_size) {
		fprintf(stderr, "kvtrim-engine: %s: the tokenizer has %u "
		        "tokens, the model's vocabulary %u\n", path,
		        tok_vocab_size(*tok), m->cfg.vocab_size);
		tok_free(*tok);
		*tok = NULL;
		gguf_close(g);
		model_free(m);
		return 1;
	}
	gguf_close(g);
	return 0;
}

static void info(const char *path, const struct model *m,
                 const struct tok *tok, const char *why, uint32_t context)
{
	const struct model_config *c = &m->cfg;
	if (m->version == MODEL_GGUF)
		printf("%s: gguf", path);
	else
		printf("%s: v%d", path, m->version);
	printf(" dim %u hidden %u layers %u heads %u kv_heads %u head_dim %u "
	       "vocab %u seq_len %u classifier %s, rope theta %g, rms eps "
	       "%g, context %u, bos ", c->dim, c->hidden_dim, c->n_layers,
	       c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size,
	       c->seq_len, c->shared_classifier ? "shared" : "separate",
	       (double)c->rope_theta, (double)c->rms_eps, context);
	if (m->bos >= 0)
		printf("%d", m->bos);
	else
		printf("none");
	if (tok)
		printf(", tokenizer %u tokens, end of turn %d\n",
		       tok_vocab_size(tok), tok_eot(tok));
	else
		printf(", no tokenizer (%s)\n", why);
}

int main(int argc, char **argv)
{
	struct opts o;
	memset(&o, 0, sizeof(o));
	o.r.max_tokens = 256;
	int pr = parse_args(argc, argv, &o);
	if (pr)
		return pr > 0 ? 0 : 2;
	if (!o.mode) {
		fputs(usage, stderr);
		return 2;
	}
	static const char *const modes[] = {"generate", "chat", "score",
	                                    "oracle", "info", "tokenize"};
	const size_t nm = sizeof(modes) / sizeof(modes[0]);
	size_t mi = 0;
	while (mi < nm && strcmp(o.mode, modes[mi]))
		mi++;
	if (mi == nm) {
		fprintf(stderr, "kvtrim-engine: unknown mode '%s'\n%s", o.mode,
		        usage);
		return 2;
	}
	char path[4200], err[1024], why[1100];
	if (model_files_resolve(model_default_path(o.model), path, sizeof(path),
	                        err, sizeof(err)) < 0) {
		fprintf(stderr, "kvtrim-engine: %s\n", err);
		return 1;
	}
	struct model m;
	struct tok *tok;
	if (load(path, &m, &tok, why, sizeof(why)))
		return 1;
	if (!o.r.eo.context)
		o.r.eo.context = model_context(&m);
	struct run_model rm = {&m, tok, tok ? NULL : why};
	int ret;
	if (!strcmp(o.mode, "info")) {
		info(path, &m, tok, why, o.r.eo.context);
		ret = 0;
	} else if (!strcmp(o.mode, "oracle")) {
		ret = run_oracle(&rm, &o.r);
	} else if (!strcmp(o.mode, "tokenize")) {
		ret = run_tokenize(&rm, &o.r);
	} else {
		struct runner r;
		char *prompt = NULL;
		ret = 0;
		if (!strcmp(o.mode, "chat") &&
		    !(ret = run_prompt(&o.r, &prompt)) && prompt)
			o.r.prompt = prompt;
		if (!ret)
			ret = run_check(&rm, o.mode, &o.r);
		if (!ret)
			ret = run_open(&r, &m, &o.r);
		if (!ret) {
			if (!strcmp(o.mode, "generate"))
				ret = run_generate(&rm, &r, &o.r);
			else if (!strcmp(o.mode, "chat"))
				ret = run_chat(&rm, &r, &o.r);
			else
				ret = run_score(&rm, &r, &o.r);
			run_close(&r);
		}
		free(prompt);
	}
	tok_free(tok);
	model_free(&m);
	return ret;
}
