/*
 * run.h — the modes of kvtrim-engine (generate, chat, score, oracle) on a
 * loaded model, either on the dense in-process cache (--no-daemon) or with
 * the KV cache in kvtrimd (engine.h).  main.c parses the options, loads
 * the model and its tokenizer and calls one run_* function.
 *
 * Text goes through the model's tokenizer when it has one (GGUF files with
 * a byte-level BPE tokenizer, tokenizer.h); byte models (vocab 256, the
 * llama2.c bytes2m) read text as bytes; other models read token ids
 * ("1 42 7").  Every input starts with the model's BOS when it has one
 * (model.bos; SmolLM2 has none).
 *
 * Exit codes, returned by every run_*: 0 done, 1 a failure (model,
 * daemon, memory, I/O), 2 bad input (a prompt that is not valid UTF-8 or
 * does not fit the context, a mode the model cannot run, missing
 * options).  On a failure nothing partial is printed as an answer: chat
 * prints its answer only once it is complete.
 */
#ifndef KVT_TOOLS_ENGINE_RUN_H
#define KVT_TOOLS_ENGINE_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "model.h"

struct tok;

struct run_opts {
	const char *prompt, *input, *dump, *out, *kind;
	const char *prompt_file; /* chat: the user turn from a file */
	const char *question;    /* chat: appended after a blank line */
	struct engine_opts eo; /* eo.context: the context in use */
	int no_daemon;
	int stats;  /* generate, chat: the tenant's accounting on stderr */
	int timing; /* prefill and decode tokens/s on stderr */
	int summary; /* chat: one key=value line of the run on stderr */
	uint32_t steps, max_bytes, prefill, horizon, max_tokens;
	int prefill_set;
	double temperature;
	uint64_t seed;
};

/* The model a mode runs: weights, tokenizer (NULL: none, why in tok_why). */
struct run_model {
	const struct model *m;
	const struct tok *tok;
	const char *tok_why;
};

/* Either backend behind one "feed tokens, get logits" call. */
struct runner {
	struct engine *e;
	struct model_dense dn;
	uint32_t chunk;
};

/*
 * Assembles chat's user turn into *text (the caller frees it): --prompt
 * TEXT or the contents of --prompt-file FILE (one of them), then, when
 * --question is given, a blank line and the question.  A document with the
 * question after it is the shape SnapKV-like policies expect: the last
 * prompt tokens (the question) vote for what is kept.  *text is NULL when
 * neither was given (run_check says so).  0, 1 (out of memory) or 2 (both
 * given, the file unreadable or holding a NUL byte; reason printed).
 */
int run_prompt(const struct run_opts *o, char **text);

/* Checks what mode needs before anything is opened: a tokenizer and
 * --prompt for chat, --input for score, ...; 0 or 2 (the reason printed). */
int run_check(const struct run_model *rm, const char *mode,
              const struct run_opts *o);

/* Opens the backend o asks for with o->eo.context positions; 0 or 1 (the
 * reason printed). */
int run_open(struct runner *r, const struct model *m, struct run_opts *o);
void run_close(struct runner *r);

int run_generate(const struct run_model *rm, struct runner *r,
                 const struct run_opts *o);
int run_chat(const struct run_model *rm, struct runner *r,
             const struct run_opts *o);
int run_score(const struct run_model *rm, struct runner *r,
              const struct run_opts *o);
int run_oracle(const struct run_model *rm, const struct run_opts *o);
/* tokenize: the ids of --input's text (no BOS, special-token strings read
 * as text), space-separated on one line of stdout; 0 or 2. */
int run_tokenize(const struct run_model *rm, const struct run_opts *o);

#endif
