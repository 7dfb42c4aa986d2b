/*
 * run.c — the modes of kvtrim-engine; see run.h.
 */
#include "run.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "file.h"
#include "kvtrim.h"
#include "oracle.h"
#include "tokenizer.h"

static void errp(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void errp(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("kvtrim-engine: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- input */

static int ids_push(struct tok_ids *ids, int32_t v)
{
	if (ids->n == ids->cap) {
		size_t cap = ids->cap ? 2 * ids->cap : 64;
		int32_t *nv = realloc(ids->v, cap * sizeof(int32_t));
		if (!nv)
			return -1;
		ids->v = nv;
		ids->cap = cap;
	}
	ids->v[ids->n++] = v;
	return 0;
}

/* Parses whitespace-separated token ids; -1 on a bad or out-of-range id. */
static int parse_ids(const char *s, uint32_t vocab, struct tok_ids *out)
{
	while (*s) {
		while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' ||
		       *s == ',')
			s++;
		if (!*s)
			break;
		char *end;
		errno = 0;
		long x = strtol(s, &end, 10);
		if (end == s || errno || x < 0 || x >= (long)vocab ||
		    ids_push(out, (int32_t)x))
			return -1;
		s = end;
	}
	return 0;
}

/*
 * Appends the ids of text[len] (NUL-terminated) to out: through the
 * tokenizer, as bytes for a byte model, else as token ids.  what names the
 * text in errors.  0, or the exit code (reason printed).
 */
static int text_ids(const struct run_model *rm, const char *text, size_t len,
                    const char *what, struct tok_ids *out)
{
	const uint32_t V = rm->m->cfg.vocab_size;
	char err[KVT_ERRTEXT_MAX];
	if (rm->tok) {
		int rc = tok_encode(rm->tok, text, len, 0, out, err,
		                    sizeof(err));
		if (rc == KVT_ENOMEM) {
			errp("%s: out of memory", what);
			return 1;
		}
		if (rc < 0) {
			errp("%s: %s", what, err);
			return 2;
		}
		return 0;
	}
	if (V == 256) {
		for (size_t i = 0; i < len; i++)
			if (ids_push(out, (unsigned char)text[i])) {
				errp("out of memory");
				return 1;
			}
		return 0;
	}
	if (parse_ids(text, V, out)) {
		errp("%s: expected token ids in [0, %u) separated by spaces "
		     "(this model has no tokenizer%s%s)", what, V,
		     rm->tok_why ? ": " : "", rm->tok_why ? rm->tok_why : "");
		return 2;
	}
	return 0;
}

/* Reads the whole file (NUL-terminated); at most max bytes when max, cut
 * back to a UTF-8 character boundary for tokenizer models (rm may be NULL
 * when max is 0).  0, 1 (out of memory) or 2 (the file cannot be opened
 * or read). */
static int read_text(const struct run_model *rm, const char *path,
                     uint32_t max, char **out, size_t *n)
{
	char *buf, why[KVT_ERRTEXT_MAX + 64];
	size_t len;
	int rc = file_read_all(path, &buf, &len, why, sizeof(why));
	if (rc < 0) {
		errp("%s", why);
		return rc == KVT_ENOMEM ? 1 : 2;
	}
	if (max && len > max) {
		len = max;
		while (rm->tok && len &&
		       ((unsigned char)buf[len] & 0xc0) == 0x80)
			len--; /* not inside a UTF-8 character */
	}
	buf[len] = 0;
	*out = buf;
	*n = len;
	return 0;
}

/* BOS (when the model has one) + ids of text. */
static int input_ids(const struct run_model *rm, const char *text,
                     size_t len, const char *what, struct tok_ids *out)
{
	if (rm->m->bos >= 0 && ids_push(out, rm->m->bos)) {
		errp("out of memory");
		return 1;
	}
	return text_ids(rm, text, len, what, out);
}

int run_tokenize(const struct run_model *rm, const struct run_opts *o)
{
	char *text;
	size_t len;
	struct tok_ids ids = {0};
	if (!o->input) {
		errp("tokenize: --input FILE");
		return 2;
	}
	int rc = read_text(rm, o->input, o->max_bytes, &text, &len);
	if (!rc)
		rc = text_ids(rm, text, len, o->input, &ids);
	for (size_t i = 0; !rc && i < ids.n; i++)
		printf(i + 1 < ids.n ? "%d " : "%d\n", (int)ids.v[i]);
	free(ids.v);
	free(text);
	return rc;
}

int run_prompt(const struct run_opts *o, char **text)
{
	char *doc = NULL;
	size_t dlen = 0;
	*text = NULL;
	if (o->prompt && o->prompt_file) {
		errp("chat: --prompt and --prompt-file: give one of them");
		return 2;
	}
	if (o->prompt_file) {
		int rc = read_text(NULL, o->prompt_file, 0, &doc, &dlen);
		if (rc)
			return rc;
		/* the template takes C strings: a NUL would cut the text */
		if (memchr(doc, 0, dlen)) {
			errp("%s: holds a NUL byte at offset %zu: not text",
			     o->prompt_file,
			     (size_t)((char *)memchr(doc, 0, dlen) - doc));
			free(doc);
			return 2;
		}
	} else if (o->prompt) {
		dlen = strlen(o->prompt);
		if (!(doc = strdup(o->prompt)))
			goto oom;
	}
	if (!o->question) {
		*text = doc;
		return 0;
	}
	size_t qlen = strlen(o->question);
	char *t = malloc(dlen + 2 + qlen + 1);
	if (!t)
		goto oom;
	size_t n = 0;
	if (doc) {
		/* a trailing newline of the file is part of the blank line */
		while (dlen && doc[dlen - 1] == '\n')
			dlen--;
		memcpy(t, doc, dlen);
		memcpy(t + dlen, "\n\n", 2);
		n = dlen + 2;
	}
	memcpy(t + n, o->question, qlen + 1);
	free(doc);
	*text = t;
	return 0;
oom:
	free(doc);
	errp("out of memory");
	return 1;
}

/* ---------------------------------------------------------------- runner */

int run_check(const struct run_model *rm, const char *mode,
              const struct run_opts *o)
{
	if (!strcmp(mode, "chat")) {
		if (!rm->tok) {
			errp("chat needs a model with a tokenizer (a GGUF "
			     "file)%s%s", rm->tok_why ? ": " : "",
			     rm->tok_why ? rm->tok_why : "");
			return 2;
		}
		if (!o->prompt) {
			errp("chat needs --prompt TEXT or --prompt-file FILE");
			return 2;
		}
		if (!o->max_tokens) {
			errp("chat: --max-tokens must be at least 1");
			return 2;
		}
	} else if (o->prompt_file || o->question || o->summary) {
		errp("%s: --prompt-file, --question and --summary are chat's",
		     mode);
		return 2;
	} else if (!strcmp(mode, "score") && !o->input) {
		errp("score needs --input FILE");
		return 2;
	}
	return 0;
}

int run_open(struct runner *r, const struct model *m, struct run_opts *o)
{
	char err[1024];
	memset(r, 0, sizeof(*r));
	r->chunk = o->eo.chunk ? o->eo.chunk : 64;
	int rc;
	if (o->no_daemon) {
		rc = model_dense_init(&r->dn, m, o->eo.context, 0);
		if (rc)
			snprintf(err, sizeof(err), "%s", kvt_strerror(rc));
	} else {
		rc = engine_open(m, &o->eo, &r->e, err, sizeof(err));
	}
	if (rc) {
		errp("%s", err);
		return 1;
	}
	return 0;
}

void run_close(struct runner *r)
{
	if (r->e)
		engine_close(r->e);
	else
		model_dense_free(&r->dn);
	memset(r, 0, sizeof(*r));
}

static int runner_feed(struct runner *r, const int32_t *t, uint32_t n,
                       enum kvt_phase ph, float *logits, size_t V)
{
	if (r->e)
		return engine_feed(r->e, t, n, ph, logits);
	uint32_t step = ph == KVT_PHASE_PREFILL ? r->chunk : 1;
	for (uint32_t i = 0; i < n; i += step) {
		uint32_t k = n - i < step ? n - i : step;
		int rc = model_dense_step(&r->dn, t + i, k,
		                          logits ? logits + i * V : NULL);
		if (rc)
			return rc;
	}
	return 0;
}

static const char *runner_error(const struct runner *r, int rc)
{
	if (r->e && engine_error(r->e)[0])
		return engine_error(r->e);
	return kvt_strerror(rc);
}

/*
 * Prefills t[n] (n >= 1) in chunks and writes the last token's logits
 * [V] into last: only the last chunk computes logits, so a long prompt
 * costs no [n][V] buffer.  0 or a KVT_E* code.
 */
static int prefill(struct runner *r, const int32_t *t, uint32_t n, float *last,
                   size_t V)
{
	uint32_t k = n % r->chunk ? n % r->chunk : r->chunk;
	float *buf = malloc(sizeof(float) * V * k);
	if (!buf)
		return KVT_ENOMEM;
	int rc = runner_feed(r, t, n - k, KVT_PHASE_PREFILL, NULL, V);
	if (!rc)
		rc = runner_feed(r, t + n - k, k, KVT_PHASE_PREFILL, buf, V);
	if (!rc)
		memcpy(last, buf + (size_t)(k - 1) * V, V * sizeof(float));
	free(buf);
	return rc;
}

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64* */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1Dull;
}

static int32_t sample(const float *logits, uint32_t V, double temp,
                      uint64_t *rng)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < V; i++)
		if (logits[i] > logits[best])
			best = i;
	if (temp <= 0)
		return (int32_t)best;
	double sum = 0, r;
	for (uint32_t i = 0; i < V; i++)
		sum += exp((logits[i] - logits[best]) / temp);
	r = (double)(rng_next(rng) >> 11) / 9007199254740992.0 * sum;
	for (uint32_t i = 0; i < V; i++) {
		r -= exp((logits[i] - logits[best]) / temp);
		if (r <= 0)
			return (int32_t)i;
	}
	return (int32_t)best;
}

static void print_token(const struct run_model *rm, int32_t t)
{
	size_t len;
	const char *b;
	if (rm->tok && (b = tok_token_bytes(rm->tok, t, &len))) {
		fwrite(b, 1, len, stdout);
	} else if (rm->m->cfg.vocab_size != 256) {
		printf("%d ", t);
	} else if (t == '\n' || t == '\t' || (t >= 32 && t < 127)) {
		putchar(t);
	} else if (t == MODEL_BOS) {
		putchar('\n');
	} else {
		printf("\\x%02x", (unsigned)t);
	}
}

/*
 * The daemon's accounting of this engine's tenant: what the policy kept.
 * Compression counts every kept entry (sinks, windows, pending decisions)
 * against every entry appended, over all layers and KV heads.
 */
static void print_kv_stats(struct runner *r, FILE *f)
{
	struct kvt_tenant_stats st;
	if (!r->e || kvt_stats(engine_client(r->e), &st) != 0)
		return;
	fprintf(f, "entries appended %llu kept %llu evicted %llu",
	       (unsigned long long)st.entries_appended,
	       (unsigned long long)st.entries_kept,
	       (unsigned long long)st.entries_evicted);
	if (st.entries_appended)
		fprintf(f, " compression %.3f",
		        1.0 - (double)st.entries_kept /
		                      (double)st.entries_appended);
	fputc('\n', f);
}

/*
 * --summary: chat's run as one line of key=value pairs on stderr, for
 * scripts (examples/demo.sh prints a table of them).  Rates are tokens
 * per second of the prefill (the whole prompt) and of the decode steps
 * (answer tokens fed back, each one forward of one token).  With the
 * daemon, its accounting of the tenant at the end of the run: the pages
 * the sequence holds in the pool times the pool's page size (what
 * kvtrimctl stats counts as kv_bytes) and the entries kept against those
 * appended, over all layers and KV heads.  Without it the kv keys are
 * absent.
 */
static void print_summary(struct runner *r, size_t prompt, size_t answer,
                          int ended, uint32_t nd, double tp, double td)
{
	fprintf(stderr, "summary: prompt_tokens=%zu answer_tokens=%zu "
	        "ended=%s prefill_s=%.3f prefill_tokens_per_s=%.1f "
	        "decode_tokens=%u decode_s=%.3f decode_tokens_per_s=%.1f",
	        prompt, answer, ended ? "eot" : "cut", tp,
	        tp > 0 ? (double)prompt / tp : 0.0, nd, td,
	        td > 0 ? nd / td : 0.0);
	struct kvt_tenant_stats st;
	struct kvt_table_view v;
	if (r->e && !kvt_stats(engine_client(r->e), &st) &&
	    !kvt_table_view(engine_client(r->e), &v))
		fprintf(stderr, " pages_used=%llu page_bytes=%llu kv_bytes=%llu "
		        "entries_appended=%llu entries_kept=%llu "
		        "entries_evicted=%llu kept_fraction=%.3f",
		        (unsigned long long)st.pages_used,
		        (unsigned long long)v.page_bytes,
		        (unsigned long long)(st.pages_used * v.page_bytes),
		        (unsigned long long)st.entries_appended,
		        (unsigned long long)st.entries_kept,
		        (unsigned long long)st.entries_evicted,
		        st.entries_appended ? (double)st.entries_kept /
		                                      (double)st.entries_appended
		                            : 1.0);
	fputc('\n', stderr);
}

static void print_timing(uint32_t np, double tp, uint32_t nd, double td)
{
	fprintf(stderr, "prefill %u tokens %.3f s (%.1f tokens/s), decode %u "
	        "tokens %.3f s (%.1f tokens/s)\n", np, tp,
	        tp > 0 ? np / tp : 0.0, nd, td, td > 0 ? nd / td : 0.0);
}

/* Positions a sequence may reach: the context, unless an evicting policy
 * in the daemon makes room (it keeps at most context entries per list). */
static uint32_t position_limit(const struct runner *r,
                               const struct run_opts *o)
{
	int evicts = r->e && o->eo.policy && strcmp(o->eo.policy, "full");
	return evicts ? UINT32_MAX : o->eo.context;
}

/* ---------------------------------------------------------------- modes */

int run_generate(const struct run_model *rm, struct runner *r,
                 const struct run_opts *o)
{
	const uint32_t V = rm->m->cfg.vocab_size;
	const char *p = o->prompt ? o->prompt : "";
	struct tok_ids ids = {0};
	float *last = NULL;
	int ret = input_ids(rm, p, strlen(p), "--prompt", &ids);
	if (ret)
		goto out;
	ret = 2;
	if (!ids.n) {
		errp("generate: an empty --prompt gives the model nothing to "
		     "continue (it has no BOS)");
		goto out;
	}
	uint32_t lim = position_limit(r, o);
	if (ids.n > lim) {
		errp("generate: the prompt is %zu tokens, the context %u",
		     ids.n, lim);
		goto out;
	}
	ret = 1;
	if (!(last = malloc(sizeof(float) * V))) {
		errp("out of memory");
		goto out;
	}
	double t0 = now_s();
	int rc = prefill(r, ids.v, (uint32_t)ids.n, last, V);
	if (rc) {
		errp("prefill: %s", runner_error(r, rc));
		goto out;
	}
	double t1 = now_s();
	for (size_t i = rm->m->bos >= 0 ? 1 : 0; i < ids.n; i++)
		print_token(rm, ids.v[i]);
	uint64_t rng = o->seed ? o->seed : 0x9E3779B97F4A7C15ull;
	uint32_t steps = o->steps, s;
	if (steps > lim - ids.n + 1)
		steps = lim - (uint32_t)ids.n + 1;
	for (s = 0; s < steps; s++) {
		int32_t t = sample(last, V, o->temperature, &rng);
		print_token(rm, t);
		fflush(stdout);
		if (s + 1 == steps)
			break;
		rc = runner_feed(r, &t, 1, KVT_PHASE_DECODE, last, V);
		if (rc) {
			putchar('\n');
			errp("decode step %u: %s", s, runner_error(r, rc));
			goto out;
		}
	}
	putchar('\n');
	if (steps < o->steps)
		errp("generate: stopped after %u tokens at the context of %u",
		     steps, lim);
	if (o->timing)
		print_timing((uint32_t)ids.n, t1 - t0, s, now_s() - t1);
	if (o->stats)
		print_kv_stats(r, stderr); /* stdout stays the generated text */
	ret = 0;
out:
	free(ids.v);
	free(last);
	return ret;
}

int run_chat(const struct run_model *rm, struct runner *r,
             const struct run_opts *o)
{
	const uint32_t V = rm->m->cfg.vocab_size;
	char err[KVT_ERRTEXT_MAX];
	int ret = run_check(rm, "chat", o);
	if (ret)
		return ret;
	struct tok_ids ids = {0}, ans = {0};
	float *last = NULL;
	char *text = NULL;
	size_t tlen;
	ret = 1;
	if (rm->m->bos >= 0 && ids_push(&ids, rm->m->bos))
		goto oom;
	struct tok_msg msg = {"user", o->prompt};
	int rc = tok_chat(rm->tok, &msg, 1, 1, &ids, err, sizeof(err));
	if (rc < 0) {
		errp("chat: %s: %s", o->prompt_file ? o->prompt_file :
		     "--prompt", err);
		ret = rc == KVT_ENOMEM ? 1 : 2;
		goto out;
	}
	/* The prompt must leave room for an answer of at least one token. */
	uint32_t lim = position_limit(r, o);
	if (ids.n >= lim) {
		errp("chat: the prompt is %zu tokens with the chat template, "
		     "the context %u: no room for an answer", ids.n, lim);
		ret = 2;
		goto out;
	}
	if (!(last = malloc(sizeof(float) * V)))
		goto oom;
	double t0 = now_s();
	if ((rc = prefill(r, ids.v, (uint32_t)ids.n, last, V))) {
		errp("prefill: %s", runner_error(r, rc));
		goto out;
	}
	double t1 = now_s();
	uint64_t rng = o->seed ? o->seed : 0x9E3779B97F4A7C15ull;
	uint32_t room = lim - (uint32_t)ids.n;
	uint32_t cap = o->max_tokens < room ? o->max_tokens : room;
	int ended = 0;
	while (ans.n < cap) {
		int32_t t = sample(last, V, o->temperature, &rng);
		if (t == tok_eot(rm->tok)) {
			ended = 1;
			break;
		}
		if (ids_push(&ans, t))
			goto oom;
		if (ans.n == cap)
			break; /* the last token is not fed: nothing reads it */
		if ((rc = runner_feed(r, &t, 1, KVT_PHASE_DECODE, last, V))) {
			errp("decode step %zu: %s", ans.n, runner_error(r, rc));
			goto out;
		}
	}
	double t2 = now_s();
	if ((rc = tok_decode(rm->tok, ans.v, ans.n, &text, &tlen, err,
	                     sizeof(err))) < 0) {
		errp("chat: %s", err);
		goto out;
	}
	fwrite(text, 1, tlen, stdout);
	putchar('\n');
	if (!ended)
		errp("chat: the answer was cut at %zu tokens (%s)", ans.n,
		     cap == o->max_tokens ? "--max-tokens" : "the context");
	/* decode steps: every answer token but a cut answer's last */
	uint32_t nd = (uint32_t)(ans.n - (ans.n && !ended));
	if (o->timing)
		print_timing((uint32_t)ids.n, t1 - t0, nd, t2 - t1);
	if (o->stats)
		print_kv_stats(r, stderr);
	if (o->summary)
		print_summary(r, ids.n, ans.n, ended, nd, t1 - t0, t2 - t1);
	ret = 0;
	goto out;
oom:
	errp("out of memory");
out:
	free(ids.v);
	free(ans.v);
	free(last);
	free(text);
	return ret;
}

/* -log softmax(l)[want] in double. */
static double nll_of(const float *l, uint32_t V, int32_t want)
{
	float mx;
	double s = model_logits_z(l, V, &mx);
	return log(s) + mx - l[want];
}

int run_score(const struct run_model *rm, struct runner *r,
              const struct run_opts *o)
{
	const uint32_t V = rm->m->cfg.vocab_size;
	if (run_check(rm, "score", o))
		return 2;
	char *text;
	size_t len;
	if (read_text(rm, o->input, rm->tok ? o->max_bytes : 0, &text, &len))
		return 1;
	struct tok_ids ids = {0};
	int ret = input_ids(rm, text, len, o->input, &ids);
	free(text);
	FILE *dump = NULL;
	float *logits = NULL;
	if (ret)
		goto out;
	/* Byte and id models count --max-bytes in tokens after BOS. */
	size_t T = ids.n, bos = rm->m->bos >= 0;
	if (!rm->tok && o->max_bytes && T > o->max_bytes + bos)
		T = o->max_bytes + bos;
	/* within the context unless eviction makes room */
	if (T > position_limit(r, o))
		T = position_limit(r, o);
	ret = 1;
	if (T < 2) {
		errp("%s: nothing to score", o->input);
		goto out;
	}
	if (!(logits = malloc(sizeof(float) * V * r->chunk))) {
		errp("out of memory");
		goto out;
	}
	/* Logits of one prefill chunk at a time, never [T][V]. */
	uint32_t pre = o->prefill_set ? o->prefill : r->chunk;
	if (pre > T)
		pre = (uint32_t)T;
	if (!pre)
		pre = 1;
	if (o->dump && !(dump = fopen(o->dump, "wb"))) {
		errp("%s: %s", o->dump, strerror(errno));
		goto out;
	}
	double nll = 0, t0 = now_s(), t1 = t0;
	for (uint32_t i = 0; i < T;) {
		int dec = i >= pre;
		uint32_t k = dec ? 1 : pre - i < r->chunk ? pre - i : r->chunk;
		int rc = runner_feed(r, ids.v + i, k,
		                     dec ? KVT_PHASE_DECODE : KVT_PHASE_PREFILL,
		                     logits, V);
		if (rc) {
			errp("score: %s", runner_error(r, rc));
			goto out;
		}
		for (uint32_t j = 0; j < k && i + j + 1 < T; j++)
			nll += nll_of(logits + (size_t)j * V, V,
			              ids.v[i + j + 1]);
		if (dump && fwrite(logits, sizeof(float) * V, k, dump) != k) {
			errp("%s: write failed", o->dump);
			goto out;
		}
		i += k;
		if (i == pre)
			t1 = now_s();
	}
	double t2 = now_s();
	if (dump) {
		int bad = fclose(dump);
		dump = NULL;
		if (bad) {
			errp("%s: write failed", o->dump);
			goto out;
		}
	}
	nll /= (double)(T - 1);
	printf("tokens %zu predicted %zu nll %.6f nats/token (%.4f bits)\n", T,
	       T - 1, nll, nll / log(2.0));
	print_kv_stats(r, stdout);
	if (o->timing)
		print_timing(pre, t1 - t0, (uint32_t)(T - pre), t2 - t1);
	ret = 0;
out:
	if (dump)
		fclose(dump);
	free(ids.v);
	free(logits);
	return ret;
}

int run_oracle(const struct run_model *rm, const struct run_opts *o)
{
	const struct model *m = rm->m;
	uint32_t context = o->eo.context;
	enum oracle_kind kind;
	if (m->version == MODEL_GGUF) {
		errp("oracle: llama2.c models only (the oracles put MODEL_BOS "
		     "and byte separators around the text)");
		return 2;
	}
	if (!o->kind || oracle_kind_parse(o->kind, &kind)) {
		errp("oracle needs --kind kvzip|kvzip+|future");
		return 2;
	}
	if (!o->input || !o->out) {
		errp("oracle needs --input FILE and --out F.bin");
		return 2;
	}
	char *text;
	size_t len;
	if (read_text(rm, o->input, 0, &text, &len))
		return 1;
	struct tok_ids in = {0};
	int ret = text_ids(rm, text, len, o->input, &in);
	free(text);
	if (ret) {
		free(in.v);
		return ret;
	}
	uint32_t n = (uint32_t)in.n;
	if (o->max_bytes && n > o->max_bytes)
		n = o->max_bytes;
	const struct model_config *c = &m->cfg;
	uint32_t horizon = o->horizon ? o->horizon : 32, T;
	float *scores = NULL;
	int rc;
	if (kind == ORACLE_FUTURE) {
		T = n + 1 < context ? n + 1 : context;
		int32_t *toks = malloc(sizeof(int32_t) * T);
		scores = malloc(sizeof(float) * c->n_layers * c->n_kv_heads * T);
		if (!toks || !scores) {
			free(toks);
			free(scores);
			free(in.v);
			return 1;
		}
		toks[0] = MODEL_BOS;
		memcpy(toks + 1, in.v, (T - 1) * sizeof(int32_t));
		rc = oracle_future(m, toks, T, horizon, scores);
		free(toks);
	} else {
		int32_t sep[ORACLE_SEP_MAX];
		uint32_t ns = oracle_default_sep(m, sep);
		uint32_t mx = oracle_kvzip_max_ctx(context, ns);
		if (n > mx)
			n = mx;
		T = n + 1;
		scores = malloc(sizeof(float) * c->n_layers * c->n_kv_heads * T);
		if (!scores) {
			free(in.v);
			return 1;
		}
		rc = oracle_kvzip(m, in.v, n, sep, ns, kind == ORACLE_KVZIP_PLUS,
		                  scores);
	}
	free(in.v);
	char err[512];
	if (rc) {
		errp("oracle: %s", kvt_strerror(rc));
	} else if ((rc = oracle_write(o->out, kind, m, T, horizon, scores, err,
	                              sizeof(err)))) {
		errp("%s", err);
	} else {
		printf("oracle %s: %u layers x %u KV heads x %u entries -> %s\n",
		       oracle_kind_name(kind), c->n_layers, c->n_kv_heads, T,
		       o->out);
	}
	free(scores);
	return rc ? 1 : 0;
}
