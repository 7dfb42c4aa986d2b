/*
 * main.c — kvtrim-engine, the reference engine's command line.  All the
 * work is in model.c (loader, forward), engine.c (KV cache in kvtrimd) and
 * oracle.c; this file parses options and prints.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kvtrim.h"
#include "model.h"
#include "oracle.h"

static const char usage[] =
	"usage: kvtrim-engine [options] MODE [mode options]\n"
	"options:\n"
	"  --model PATH         llama2.c checkpoint (default $KVTRIM_MODEL,\n"
	"                       else ../shared/models/bytes2m.bin)\n"
	"  --runtime-dir DIR    kvtrimd runtime directory\n"
	"  --policy SPEC        eviction policy spec (default full)\n"
	"  --dtype f32|f16|bf16 K/V storage type in the pool (default f32)\n"
	"  --page-tokens N      entries per page (default 16)\n"
	"  --chunk N            prefill chunk = headroom (default 64)\n"
	"  --stage-tokens N     staging ring (default = context)\n"
	"  --context N          max entries per list (default min(seq_len, 512))\n"
	"  --tenant NAME        tenant name in the daemon's stats\n"
	"  --no-daemon          dense in-process reference, no kvtrimd\n"
	"  --stats              generate: print what the policy kept (stderr)\n"
	"modes:\n"
	"  generate --prompt TEXT --steps N [--temperature T] [--seed S]\n"
	"           byte models: TEXT is text; token models: ids \"1 42 7\"\n"
	"  score --input FILE [--max-bytes N] [--prefill N] [--dump-logits F]\n"
	"           teacher-forced mean NLL of BOS + FILE (truncated to the\n"
	"           context); the first N tokens (default chunk) are prefill,\n"
	"           the rest decode one by one; F gets float32 [T][vocab]\n"
	"  oracle --kind kvzip|kvzip+|future --input FILE --out F.bin\n"
	"         [--horizon N (default 32)] [--max-bytes N]\n"
	"  info     print the model header\n";

struct opts {
	const char *model, *mode, *prompt, *input, *dump, *out, *kind;
	struct engine_opts eo;
	int no_daemon;
	int stats; /* generate: print the tenant's accounting to stderr */
	uint32_t steps, max_bytes, prefill, horizon;
	int prefill_set;
	double temperature;
	uint64_t seed;
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
			o->eo.runtime_dir = v;
		} else if (!strcmp(a, "--policy")) {
			NEED_V();
			o->eo.policy = v;
		} else if (!strcmp(a, "--tenant")) {
			NEED_V();
			o->eo.tenant = v;
		} else if (!strcmp(a, "--dtype")) {
			NEED_V();
			if (!strcmp(v, "f32"))
				o->eo.dtype = KVT_DTYPE_F32;
			else if (!strcmp(v, "f16"))
				o->eo.dtype = KVT_DTYPE_F16;
			else if (!strcmp(v, "bf16"))
				o->eo.dtype = KVT_DTYPE_BF16;
			else {
				fprintf(stderr, "kvtrim-engine: --dtype %s: "
				        "f32, f16 or bf16\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--page-tokens")) {
			NEED_U32(o->eo.page_tokens);
		} else if (!strcmp(a, "--chunk")) {
			NEED_U32(o->eo.chunk);
		} else if (!strcmp(a, "--stage-tokens")) {
			NEED_U32(o->eo.stage_tokens);
		} else if (!strcmp(a, "--context")) {
			NEED_U32(o->eo.context);
		} else if (!strcmp(a, "--no-daemon")) {
			o->no_daemon = 1;
		} else if (!strcmp(a, "--stats")) {
			o->stats = 1;
		} else if (!strcmp(a, "--prompt")) {
			NEED_V();
			o->prompt = v;
		} else if (!strcmp(a, "--steps")) {
			NEED_U32(o->steps);
		} else if (!strcmp(a, "--temperature")) {
			NEED_V();
			char *end;
			o->temperature = strtod(v, &end);
			if (end == v || *end || !(o->temperature >= 0)) {
				fprintf(stderr, "kvtrim-engine: bad "
				        "--temperature '%s'\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--seed")) {
			NEED_V();
			char *end;
			o->seed = strtoull(v, &end, 10);
			if (end == v || *end) {
				fprintf(stderr, "kvtrim-engine: bad --seed "
				        "'%s'\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--input")) {
			NEED_V();
			o->input = v;
		} else if (!strcmp(a, "--max-bytes")) {
			NEED_U32(o->max_bytes);
		} else if (!strcmp(a, "--prefill")) {
			NEED_U32(o->prefill);
			o->prefill_set = 1;
		} else if (!strcmp(a, "--dump-logits")) {
			NEED_V();
			o->dump = v;
		} else if (!strcmp(a, "--kind")) {
			NEED_V();
			o->kind = v;
		} else if (!strcmp(a, "--horizon")) {
			NEED_U32(o->horizon);
		} else if (!strcmp(a, "--out")) {
			NEED_V();
			o->out = v;
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

/* ---------------------------------------------------------------- input */

/* Parses whitespace-separated token ids; -1 on a bad or out-of-range id. */
static int parse_ids(const char *s, uint32_t vocab, int32_t **out,
                     uint32_t *n)
{
	size_t cap = 64, k = 0;
	int32_t *v = malloc(cap * sizeof(int32_t));
	if (!v)
		return -1;
	while (*s) {
		while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' ||
		       *s == ',')
			s++;
		if (!*s)
			break;
		char *end;
		errno = 0;
		long x = strtol(s, &end, 10);
		if (end == s || errno || x < 0 || x >= (long)vocab) {
			free(v);
			return -1;
		}
		if (k == cap) {
			int32_t *nv = realloc(v, 2 * cap * sizeof(int32_t));
			if (!nv) {
				free(v);
				return -1;
			}
			v = nv;
			cap *= 2;
		}
		v[k++] = (int32_t)x;
		s = end;
	}
	*out = v;
	*n = (uint32_t)k;
	return 0;
}

/*
 * Reads FILE as model input, without BOS: the bytes for byte-level models
 * (vocab 256), whitespace-separated token ids otherwise; at most max items
 * (0 = no limit).
 */
static int read_input(const struct model *m, const char *path, uint32_t max,
                      int32_t **out, uint32_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "kvtrim-engine: %s: %s\n", path,
		        strerror(errno));
		return -1;
	}
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap + 1);
	size_t got;
	while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
		len += got;
		if (len == cap) {
			char *nb = realloc(buf, 2 * cap + 1);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	fclose(f);
	if (!buf) {
		fprintf(stderr, "kvtrim-engine: out of memory\n");
		return -1;
	}
	buf[len] = 0;
	int rc = 0;
	if (m->cfg.vocab_size == 256) {
		*out = malloc((len ? len : 1) * sizeof(int32_t));
		if (!*out)
			rc = -1;
		for (size_t i = 0; !rc && i < len; i++)
			(*out)[i] = (unsigned char)buf[i];
		*n = (uint32_t)len;
	} else if (parse_ids(buf, m->cfg.vocab_size, out, n)) {
		fprintf(stderr, "kvtrim-engine: %s: expected token ids in "
		        "[0, %u) separated by spaces\n", path,
		        m->cfg.vocab_size);
		rc = -1;
	}
	free(buf);
	if (!rc && max && *n > max)
		*n = max;
	return rc;
}

/* ---------------------------------------------------------------- runner */

/* Either backend behind one "feed tokens, get logits" call. */
struct runner {
	struct engine *e;
	struct model_dense dn;
	uint32_t chunk;
};

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

static void print_token(const struct model *m, int32_t t)
{
	if (m->cfg.vocab_size != 256) {
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

static int cmd_generate(const struct model *m, struct runner *r,
                        const struct opts *o)
{
	const uint32_t V = m->cfg.vocab_size;
	int32_t *toks = NULL;
	uint32_t n = 0;
	const char *p = o->prompt ? o->prompt : "";
	if (V == 256) {
		size_t len = strlen(p);
		toks = malloc((len + 1) * sizeof(int32_t));
		if (!toks)
			return 1;
		for (size_t i = 0; i < len; i++)
			toks[1 + i] = (unsigned char)p[i];
		n = (uint32_t)len + 1;
	} else {
		int32_t *ids;
		uint32_t k;
		if (parse_ids(p, V, &ids, &k)) {
			fprintf(stderr, "kvtrim-engine: --prompt: token ids "
			        "in [0, %u)\n", V);
			return 2;
		}
		toks = malloc((k + 1) * sizeof(int32_t));
		if (!toks) {
			free(ids);
			return 1;
		}
		memcpy(toks + 1, ids, k * sizeof(int32_t));
		free(ids);
		n = k + 1;
	}
	toks[0] = MODEL_BOS;
	float *logits = malloc(sizeof(float) * V * n);
	if (!logits) {
		free(toks);
		return 1;
	}
	int rc = runner_feed(r, toks, n, KVT_PHASE_PREFILL, logits, V);
	if (rc) {
		fprintf(stderr, "kvtrim-engine: prefill: %s\n",
		        runner_error(r, rc));
		free(toks);
		free(logits);
		return 1;
	}
	for (uint32_t i = 1; i < n; i++)
		print_token(m, toks[i]);
	uint64_t rng = o->seed ? o->seed : 0x9E3779B97F4A7C15ull;
	float *last = logits + (size_t)(n - 1) * V;
	for (uint32_t s = 0; s < o->steps; s++) {
		int32_t t = sample(last, V, o->temperature, &rng);
		print_token(m, t);
		fflush(stdout);
		if (s + 1 == o->steps)
			break;
		rc = runner_feed(r, &t, 1, KVT_PHASE_DECODE, last, V);
		if (rc) {
			fprintf(stderr, "\nkvtrim-engine: decode step %u: "
			        "%s\n", s, runner_error(r, rc));
			break;
		}
	}
	putchar('\n');
	if (!rc && o->stats)
		print_kv_stats(r, stderr); /* stdout stays the generated text */
	free(toks);
	free(logits);
	return rc ? 1 : 0;
}

static int cmd_score(const struct model *m, struct runner *r,
                     const struct opts *o, uint32_t context)
{
	const uint32_t V = m->cfg.vocab_size;
	if (!o->input) {
		fprintf(stderr, "kvtrim-engine: score needs --input FILE\n");
		return 2;
	}
	int32_t *in;
	uint32_t n;
	if (read_input(m, o->input, o->max_bytes, &in, &n))
		return 1;
	/* BOS + input, within the context unless eviction makes room */
	uint32_t T = n + 1;
	if (T > context && (!o->eo.policy || !strcmp(o->eo.policy, "full") ||
	                    !r->e))
		T = context;
	int32_t *toks = malloc(sizeof(int32_t) * T);
	float *logits = malloc(sizeof(float) * V * T);
	if (!toks || !logits) {
		free(in);
		free(toks);
		free(logits);
		return 1;
	}
	toks[0] = MODEL_BOS;
	memcpy(toks + 1, in, (T - 1) * sizeof(int32_t));
	free(in);
	if (T < 2) {
		fprintf(stderr, "kvtrim-engine: %s: nothing to score\n",
		        o->input);
		free(toks);
		free(logits);
		return 1;
	}
	uint32_t pre = o->prefill_set ? o->prefill : r->chunk;
	if (pre > T)
		pre = T;
	int rc = runner_feed(r, toks, pre, KVT_PHASE_PREFILL, logits, V);
	if (!rc)
		rc = runner_feed(r, toks + pre, T - pre, KVT_PHASE_DECODE,
		                 logits + (size_t)pre * V, V);
	if (rc) {
		fprintf(stderr, "kvtrim-engine: score: %s\n",
		        runner_error(r, rc));
		free(toks);
		free(logits);
		return 1;
	}
	double nll = 0;
	for (uint32_t t = 0; t + 1 < T; t++) {
		const float *l = logits + (size_t)t * V;
		float mx = l[0];
		for (uint32_t i = 1; i < V; i++)
			mx = l[i] > mx ? l[i] : mx;
		double s = 0;
		for (uint32_t i = 0; i < V; i++)
			s += exp((double)l[i] - mx);
		nll += log(s) + mx - l[toks[t + 1]];
	}
	nll /= (double)(T - 1);
	printf("tokens %u predicted %u nll %.6f nats/token (%.4f bits)\n", T,
	       T - 1, nll, nll / log(2.0));
	print_kv_stats(r, stdout);
	rc = 0;
	if (o->dump) {
		FILE *f = fopen(o->dump, "wb");
		if (!f || fwrite(logits, sizeof(float) * V, T, f) != T) {
			fprintf(stderr, "kvtrim-engine: %s: write failed\n",
			        o->dump);
			rc = 1;
		}
		if (f && fclose(f))
			rc = 1;
	}
	free(toks);
	free(logits);
	return rc;
}

static int cmd_oracle(const struct model *m, const struct opts *o,
                      uint32_t context)
{
	enum oracle_kind kind;
	if (!o->kind || oracle_kind_parse(o->kind, &kind)) {
		fprintf(stderr, "kvtrim-engine: oracle needs --kind "
		        "kvzip|kvzip+|future\n");
		return 2;
	}
	if (!o->input || !o->out) {
		fprintf(stderr, "kvtrim-engine: oracle needs --input FILE "
		        "and --out F.bin\n");
		return 2;
	}
	int32_t *in;
	uint32_t n;
	if (read_input(m, o->input, o->max_bytes, &in, &n))
		return 1;
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
			free(in);
			return 1;
		}
		toks[0] = MODEL_BOS;
		memcpy(toks + 1, in, (T - 1) * sizeof(int32_t));
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
			free(in);
			return 1;
		}
		rc = oracle_kvzip(m, in, n, sep, ns, kind == ORACLE_KVZIP_PLUS,
		                  scores);
	}
	free(in);
	char err[512];
	if (rc) {
		fprintf(stderr, "kvtrim-engine: oracle: %s\n",
		        kvt_strerror(rc));
	} else if ((rc = oracle_write(o->out, kind, m, T, horizon, scores, err,
	                              sizeof(err)))) {
		fprintf(stderr, "kvtrim-engine: %s\n", err);
	} else {
		printf("oracle %s: %u layers x %u KV heads x %u entries -> %s\n",
		       oracle_kind_name(kind), c->n_layers, c->n_kv_heads, T,
		       o->out);
	}
	free(scores);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	memset(&o, 0, sizeof(o));
	int pr = parse_args(argc, argv, &o);
	if (pr)
		return pr > 0 ? 0 : 2;
	if (!o.mode) {
		fputs(usage, stderr);
		return 2;
	}
	if (strcmp(o.mode, "generate") && strcmp(o.mode, "score") &&
	    strcmp(o.mode, "oracle") && strcmp(o.mode, "info")) {
		fprintf(stderr, "kvtrim-engine: unknown mode '%s'\n%s", o.mode,
		        usage);
		return 2;
	}
	struct model m;
	char err[1024];
	const char *path = model_default_path(o.model);
	int rc = model_load(path, &m, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvtrim-engine: %s\n", err);
		return 1;
	}
	uint32_t context = o.eo.context ? o.eo.context : model_context(&m);
	int ret = 0;
	if (!strcmp(o.mode, "info")) {
		const struct model_config *c = &m.cfg;
		printf("%s: v%d dim %u hidden %u layers %u heads %u kv_heads %u "
		       "head_dim %u vocab %u seq_len %u classifier %s, "
		       "context %u\n", path, m.version, c->dim, c->hidden_dim,
		       c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
		       c->vocab_size, c->seq_len,
		       c->shared_classifier ? "shared" : "separate", context);
	} else if (!strcmp(o.mode, "oracle")) {
		ret = cmd_oracle(&m, &o, context);
	} else {
		struct runner r;
		memset(&r, 0, sizeof(r));
		r.chunk = o.eo.chunk ? o.eo.chunk : 64;
		if (o.no_daemon) {
			rc = model_dense_init(&r.dn, &m, context, 0);
		} else {
			o.eo.context = context;
			rc = engine_open(&m, &o.eo, &r.e, err, sizeof(err));
		}
		if (rc) {
			fprintf(stderr, "kvtrim-engine: %s\n",
			        o.no_daemon ? kvt_strerror(rc) : err);
			model_free(&m);
			return 1;
		}
		if (!strcmp(o.mode, "generate"))
			ret = cmd_generate(&m, &r, &o);
		else
			ret = cmd_score(&m, &r, &o, context);
		if (r.e)
			engine_close(r.e);
		else
			model_dense_free(&r.dn);
	}
	model_free(&m);
	return ret;
}
