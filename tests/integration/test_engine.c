/*
 * test_engine.c — the reference engine (engine/) against the real
 * kvtrimd: with policy `full` its logits must equal the dense in-process
 * forward on the same schedule (BOS + 299 bytes of bytes2m-valid.txt, a
 * 64-token prefill chunk, then one decode step per token; the same BLAS
 * calls, so only where K/V live and the attention kernel differ), for both
 * shipped models; an evicting policy must run and show evictions; the
 * kvtrim-engine command line must agree with --no-daemon.  A cuda tenant's
 * CUDA attention, and the fully batched dense forward, get looser bounds
 * (logit_tol, model_matmul).  engine_backends: a cuda daemon against a cpu
 * one, the same kept sets and logits within LOGIT_TOL_CUDA.  The models
 * live in ../shared/models; tests skip when they are absent.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "engine.h"
#include "kvtrim.h"
#include "model.h"
#include "test.h"
#include "weights.h"

#define MODELS_DIR "../shared/models"
#define NPOS 300
#define CHUNK 64

static void load_or_skip(const char *name, struct model *m)
{
	char path[512], err[1024];
	snprintf(path, sizeof(path), "%s/%s", MODELS_DIR, name);
	if (access(path, R_OK) != 0) {
		char why[700];
		snprintf(why, sizeof(why), "model %s not found (run the tests "
		         "from the repository root with the shared models "
		         "beside it)", path);
		T_SKIP(why);
	}
	int rc = model_load(path, m, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "model_load: %s", err);
}

/* BOS + the first n - 1 bytes of the validation text. */
static void valid_tokens(int32_t *tok, uint32_t n)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/bytes2m-valid.txt", MODELS_DIR);
	FILE *f = fopen(path, "rb");
	if (!f)
		T_SKIP("../shared/models/bytes2m-valid.txt not found");
	tok[0] = MODEL_BOS;
	for (uint32_t i = 1; i < n; i++) {
		int c = fgetc(f);
		T_ASSERT(c != EOF);
		tok[i] = c;
	}
	fclose(f);
}

/*
 * The largest logit difference allowed between two forwards that differ
 * only in the attention kernel's arithmetic.  The dense reference uses the
 * CPU kernel's own softmax (model.c), so on a host tenant (cpu backend)
 * only OpenBLAS's summation order differs: 1e-5.  On a cuda tenant
 * kvt_attention runs the CUDA kernel (split-K slices merged by their lse,
 * a base-2 exponent, another summation order), whose outputs differ from
 * the CPU kernel's by a few float ulps (tests/kernels: within 2e-4 +
 * 1e-3 |out| per element, far less in practice); through the layers that
 * grows to at most 2.9e-5 in these models' logits on the emulator.  1e-4
 * leaves room for a GPU's fused multiply-adds and its exp2f.
 */
#define LOGIT_TOL_HOST 1e-5
#define LOGIT_TOL_CUDA 1e-4
static double logit_tol(struct engine *e)
{
	return kvt_memory_kind(engine_client(e)) == KVT_MEMORY_CUDA
	               ? LOGIT_TOL_CUDA : LOGIT_TOL_HOST;
}

static double max_diff(const float *a, const float *b, size_t n)
{
	double w = 0;
	for (size_t i = 0; i < n; i++)
		w = fmax(w, fabs((double)a[i] - b[i]));
	return w;
}

/* Dense reference on the engine's schedule: prefill `pre` tokens in
 * chunks of CHUNK, then decode. */
static void dense_sched(const struct model *m, const int32_t *tok,
                        uint32_t n, uint32_t pre, float *logits)
{
	struct model_dense dn;
	size_t V = m->cfg.vocab_size;
	T_OK(model_dense_init(&dn, m, n, 0));
	for (uint32_t i = 0; i < n;) {
		uint32_t k = i < pre ? (pre - i < CHUNK ? pre - i : CHUNK) : 1;
		T_OK(model_dense_step(&dn, tok + i, k, logits + i * V));
		i += k;
	}
	model_dense_free(&dn);
}

static void open_engine(const struct th_daemon *d, const struct model *m,
                        const char *policy, enum kvt_dtype dt,
                        struct engine **e)
{
	char err[1024];
	struct engine_opts o;
	memset(&o, 0, sizeof(o));
	o.runtime_dir = d->dir;
	o.policy = policy;
	o.dtype = dt;
	o.chunk = CHUNK;
	int rc = engine_open(m, &o, e, err, sizeof(err));
	if (rc)
		th_fail(__FILE__, __LINE__, "engine_open: %s", err);
}

static void feed(struct engine *e, const int32_t *tok, uint32_t n,
                 uint32_t pre, float *logits, size_t V)
{
	int rc = engine_feed(e, tok, pre, KVT_PHASE_PREFILL, logits);
	if (!rc)
		rc = engine_feed(e, tok + pre, n - pre, KVT_PHASE_DECODE,
		                 logits + pre * V);
	if (rc)
		th_fail(__FILE__, __LINE__, "engine_feed: %s",
		        engine_error(e));
}

static void check_staged(const struct model *m, struct engine *e,
                         uint32_t pos)
{
	const struct model_config *c = &m->cfg;
	uint32_t hd = c->head_dim, G = c->n_heads / c->n_kv_heads;
	kvt_client *cl = engine_client(e);
	uint32_t pt = kvt_config_of(cl)->page_tokens;
	float q[4096], lse[64];
	T_ASSERT(c->n_heads * hd <= 4096 && c->n_heads <= 64);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const float *sq = kvt_stage_q(cl, engine_seq(e), l, pos);
		const float *sl = kvt_stage_lse(cl, engine_seq(e), l, pos);
		T_ASSERT(sq && sl);
		/* staging rows may be device memory */
		th_put(cl, q, sq, sizeof(float) * c->n_heads * hd);
		th_put(cl, lse, sl, sizeof(float) * c->n_heads);
		for (uint32_t h = 0; h < c->n_heads; h++) {
			struct kvt_list li;
			T_OK(kvt_list_get(cl, engine_seq(e), l, h / G, &li));
			double sum = 0;
			for (uint32_t i = 0; i < li.len; i++) {
				/* kvt_memcpy: the page may be device memory */
				float k[512];
				T_ASSERT(hd <= 512);
				T_OK(kvt_memcpy(cl, k,
				                (const float *)kvt_page_ptr(
				                        cl, li.pages[i / pt]) +
				                        (size_t)(i % pt) * hd,
				                hd * sizeof(float)));
				double dot = 0;
				for (uint32_t j = 0; j < hd; j++)
					dot += (double)q[h * hd + j] * k[j];
				sum += exp(dot / sqrt((double)hd) - lse[h]);
			}
			T_ASSERT(fabs(sum - 1) < 1e-4);
		}
	}
}

static void full_matches_dense(const char *name)
{
	struct model m;
	load_or_skip(name, &m);
	int32_t tok[NPOS];
	valid_tokens(tok, NPOS);
	size_t V = m.cfg.vocab_size, n = (size_t)NPOS * V;
	float *ref = malloc(sizeof(float) * n), *bat = malloc(sizeof(float) * n),
	      *got = malloc(sizeof(float) * n);
	T_ASSERT(ref && bat && got);
	dense_sched(&m, tok, NPOS, CHUNK, ref);
	T_OK(model_dense_forward(&m, tok, NPOS, bat));

	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	struct engine *e;
	open_engine(&d, &m, "full", KVT_DTYPE_F32, &e);
	const double tol = logit_tol(e);
	feed(e, tok, NPOS, CHUNK, got, V);
	double dstep = max_diff(got, ref, n), dbat = max_diff(got, bat, n);
	/* every entry kept: each list holds all NPOS */
	for (uint32_t l = 0; l < m.cfg.n_layers; l++)
		for (uint32_t g = 0; g < m.cfg.n_kv_heads; g++) {
			struct kvt_list li;
			T_OK(kvt_list_get(engine_client(e), engine_seq(e), l, g,
			                  &li));
			T_EQ(li.len, NPOS);
		}
	/* "full" reads no staged input, so its tenant stages none: the
	 * staging segment has no room for any. */
	T_EQ(kvt_policy_inputs(engine_client(e)), 0);
	T_ASSERT(!kvt_stage_x(engine_client(e), engine_seq(e), 0, 0));
	T_ASSERT(!kvt_stage_q(engine_client(e), engine_seq(e), 0, 0));
	T_ASSERT(!kvt_stage_lse(engine_client(e), engine_seq(e), 0, 0));

	/* the whole sequence as prefill chunks: chunk tokens see earlier
	 * tokens of their own chunk through the uncommitted entries */
	T_OK(engine_reset(e));
	feed(e, tok, NPOS, NPOS, got, V);
	dense_sched(&m, tok, NPOS, NPOS, ref);
	double dpre = max_diff(got, ref, n);
	engine_close(e);

	/* Staged q and lse of the last token recover its attention weights
	 * over the list (every entry kept, itself included): they sum to 1
	 * for every layer and query head.  h2o reads q and lse (not x) and
	 * keeps everything under a budget above NPOS. */
	open_engine(&d, &m, "h2o:tokens=4096", KVT_DTYPE_F32, &e);
	T_EQ(kvt_policy_inputs(engine_client(e)) &
	             (KVT_INPUT_X | KVT_INPUT_Q | KVT_INPUT_LSE),
	     KVT_INPUT_Q | KVT_INPUT_LSE);
	feed(e, tok, NPOS, CHUNK, got, V);
	T_ASSERT(max_diff(got, bat, n) <= 1e-3);
	check_staged(&m, e, NPOS - 1);
	T_ASSERT(!kvt_stage_x(engine_client(e), engine_seq(e), 0, NPOS - 1));
	engine_close(e);
	T_EQ(th_daemon_stop(&d), 0);
	fprintf(stderr, "    %s: max |logit diff| engine vs dense: %.3g "
	        "(prefill %d + decode), %.3g (all prefill); vs batched dense "
	        "forward %.3g\n", name, dstep, CHUNK, dpre, dbat);
	T_ASSERT(dstep <= tol);
	T_ASSERT(dpre <= tol);
	T_ASSERT(dbat <= 1e-3);
	free(ref);
	free(bat);
	free(got);
	model_free(&m);
}

TEST_T(engine, full_matches_dense_bytes2m, 120)
{
	full_matches_dense("bytes2m.bin");
}

TEST_T(engine, full_matches_dense_stories260K, 120)
{
	full_matches_dense("stories260K.bin");
}

TEST_T(engine, streaming_evicts_and_matches_until_the_budget, 120)
{
	struct model m;
	load_or_skip("bytes2m.bin", &m);
	int32_t tok[NPOS];
	valid_tokens(tok, NPOS);
	size_t V = m.cfg.vocab_size, n = (size_t)NPOS * V;
	float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
	dense_sched(&m, tok, NPOS, CHUNK, ref);

	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	struct engine *e;
	open_engine(&d, &m, "streaming:tokens=64", KVT_DTYPE_F32, &e);
	feed(e, tok, NPOS, CHUNK, got, V);
	/* Nothing is evicted before a list exceeds 64 entries, and token 64
	 * attends before its sync evicts: positions 0..64 match exactly. */
	T_ASSERT(max_diff(got, ref, (CHUNK + 1) * V) <= logit_tol(e));
	double later = max_diff(got + (CHUNK + 1) * V, ref + (CHUNK + 1) * V,
	                        n - (CHUNK + 1) * V);
	T_ASSERT(later > 1e-3);
	for (uint32_t l = 0; l < m.cfg.n_layers; l++)
		for (uint32_t g = 0; g < m.cfg.n_kv_heads; g++) {
			struct kvt_list li;
			T_OK(kvt_list_get(engine_client(e), engine_seq(e), l, g,
			                  &li));
			T_EQ(li.len, 64);
		}
	struct kvt_tenant_stats st;
	T_OK(kvt_stats(engine_client(e), &st));
	uint64_t lists = (uint64_t)m.cfg.n_layers * m.cfg.n_kv_heads;
	T_EQ_U64(st.entries_appended, lists * NPOS);
	T_EQ_U64(st.entries_evicted, lists * (NPOS - 64));
	T_EQ_U64(th_stat(&d, "entries_evicted_total"), lists * (NPOS - 64));
	engine_close(e);
	T_EQ(th_daemon_stop(&d), 0);
	fprintf(stderr, "    streaming:tokens=64: max |logit diff| after the "
	        "budget %.3g\n", later);
	free(ref);
	free(got);
	model_free(&m);
}

TEST_T(engine, half_precision_pages_stay_close, 120)
{
	struct model m;
	load_or_skip("bytes2m.bin", &m);
	int32_t tok[NPOS];
	valid_tokens(tok, NPOS);
	size_t V = m.cfg.vocab_size, n = (size_t)NPOS * V;
	float *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
	dense_sched(&m, tok, NPOS, CHUNK, ref);
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	const enum kvt_dtype dts[2] = {KVT_DTYPE_F16, KVT_DTYPE_BF16};
	const double tol[2] = {0.05, 0.5};
	for (int i = 0; i < 2; i++) {
		struct engine *e;
		open_engine(&d, &m, "full", dts[i], &e);
		feed(e, tok, NPOS, CHUNK, got, V);
		engine_close(e);
		double w = max_diff(got, ref, n);
		fprintf(stderr, "    %s pages: max |logit diff| %.3g\n",
		        i ? "bf16" : "f16", w);
		T_ASSERT(w > 0 && w < tol[i]);
	}
	T_EQ(th_daemon_stop(&d), 0);
	free(ref);
	free(got);
	model_free(&m);
}

/* The value after `key` in out, as a double. */
static double field(const char *out, const char *key)
{
	const char *p = strstr(out, key);
	if (!p)
		th_fail(__FILE__, __LINE__, "no '%s' in:\n%s", key, out);
	return strtod(p + strlen(key), NULL);
}

TEST_T(engine, cli_agrees_with_no_daemon, 120)
{
	struct model m;
	load_or_skip("bytes2m.bin", &m);
	model_free(&m);
	char a[8192], b[8192];
	const char *bin = th_bin("kvtrim-engine");
	const char *mdl = MODELS_DIR "/bytes2m.bin";
	struct th_daemon d;
	th_daemon_start(&d, "64M", NULL);
	T_EQ(th_sh(&d, a, sizeof(a), "%s --model %s --runtime-dir %s --policy "
	           "full generate --prompt 'The program' --steps 60 "
	           "--temperature 0", bin, mdl, d.dir), 0);
	T_EQ(th_sh(NULL, b, sizeof(b), "%s --model %s --no-daemon generate "
	           "--prompt 'The program' --steps 60 --temperature 0", bin,
	           mdl), 0);
	T_EQ_STR(a, b);
	T_ASSERT(!strncmp(a, "The program", 11) && strlen(a) >= 60);

	T_EQ(th_sh(&d, a, sizeof(a), "%s --model %s --runtime-dir %s score "
	           "--input %s/bytes2m-valid.txt --max-bytes 400", bin, mdl,
	           d.dir, MODELS_DIR), 0);
	T_EQ(th_sh(NULL, b, sizeof(b), "%s --model %s --no-daemon score "
	           "--input %s/bytes2m-valid.txt --max-bytes 400", bin, mdl,
	           MODELS_DIR), 0);
	double na = field(a, " nll "), nb = field(b, " nll ");
	T_ASSERT(fabs(na - nb) < 1e-5);
	T_ASSERT(na > 0.5 && na < 2.5); /* README: 1.29 nats/byte at 512 */
	T_ASSERT(strstr(a, "evicted 0"));

	T_EQ(th_sh(&d, a, sizeof(a), "%s --model %s --runtime-dir %s --policy "
	           "streaming:tokens=32 score --input %s/bytes2m-valid.txt "
	           "--max-bytes 400", bin, mdl, d.dir, MODELS_DIR), 0);
	T_ASSERT(field(a, " evicted ") > 0);
	T_ASSERT(field(a, " nll ") > na);

	/* bad input is refused with a reason, not a crash */
	T_EQ(th_sh(&d, a, sizeof(a), "%s --model %s --runtime-dir %s --policy "
	           "nosuch generate --steps 1", bin, mdl, d.dir), 1);
	T_ASSERT(strstr(a, "policy"));
	T_EQ(th_sh(NULL, a, sizeof(a), "%s --model %s/nosuch.bin info", bin,
	           MODELS_DIR), 1);
	T_EQ(th_sh(NULL, a, sizeof(a), "%s --model %s frobnicate", bin, mdl),
	     2);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST_T(engine, oracle_cli_writes_scores, 120)
{
	struct model m;
	load_or_skip("bytes2m.bin", &m);
	char out[4096], path[512];
	const char *bin = th_bin("kvtrim-engine");
	const char *kinds[3] = {"kvzip", "kvzip+", "future"};
	const uint32_t want_T[3] = {255, 255, 301};
	for (int k = 0; k < 3; k++) {
		snprintf(path, sizeof(path), "%s/o%d.bin", th_tmpdir(), k);
		T_EQ(th_sh(NULL, out, sizeof(out), "%s --model %s/bytes2m.bin "
		           "oracle --kind %s --horizon 16 --input "
		           "%s/bytes2m-valid.txt --max-bytes 300 --out %s", bin,
		           MODELS_DIR, kinds[k], MODELS_DIR, path), 0);
		FILE *f = fopen(path, "rb");
		T_ASSERT(f);
		uint32_t hdr[8];
		T_ASSERT(fread(hdr, 4, 8, f) == 8);
		T_EQ(hdr[2], k);
		T_EQ(hdr[3], m.cfg.n_layers);
		T_EQ(hdr[4], m.cfg.n_kv_heads);
		T_EQ(hdr[5], want_T[k]);
		size_t cnt = (size_t)hdr[3] * hdr[4] * hdr[5];
		float *s = malloc(cnt * sizeof(float));
		T_ASSERT(fread(s, sizeof(float), cnt, f) == cnt);
		fclose(f);
		for (size_t i = 0; i < cnt; i++) {
			T_ASSERT(isfinite(s[i]));
			if (k != 1)
				T_ASSERT(s[i] >= 0 && s[i] <= (k == 2 ? 16 : 1));
		}
		free(s);
	}
	model_free(&m);
}

/* ---------------------------------------------------------------- backends */

/*
 * The engine on a cuda daemon against the same engine on a cpu daemon:
 * same model, tokens and policy, one daemon of each backend
 * side by side (th_daemon_start_as).  On cuda the engine's attention is
 * the CUDA kernel (kvt_attention on device buffers); on cpu the CPU
 * kernel.  Logits must agree within LOGIT_TOL_CUDA (see logit_tol), and
 * the kept sets must be the same: every list as long, holding the same
 * keys in the same order (a different kept entry would show as a key
 * differing by O(1); the same one differs by the rounding of the layers
 * below it, 1e-4 covers it as it covers the logits).  Runs on the cuda
 * passes of `make test` (KVTRIM_BACKEND=cuda, the emulated backend) and
 * on a GPU (gpu-check); skips on the cpu pass.
 */
#define NCMP 160

/* Random seeded linear KVzap weights for m (kvzap.{l}.weight [n_kv][dim]
 * uniform in [-0.1, 0.1) from a fixed LCG, bias -4): scores spread around
 * the default threshold -4, so about half the entries leaving the window
 * are evicted. */
static void write_kvzap(const struct model *m, const char *path)
{
	const uint32_t L = m->cfg.n_layers, nkv = m->cfg.n_kv_heads;
	const uint32_t dim = m->cfg.dim;
	float *w = malloc(sizeof(float) * L * nkv * dim);
	float *b = malloc(sizeof(float) * L * nkv);
	struct weights_tensor *t = calloc(2 * L, sizeof(*t));
	char (*names)[32] = calloc(2 * L, sizeof(*names));
	T_ASSERT(w && b && t && names);
	uint32_t st = 20240612u;
	for (size_t i = 0; i < (size_t)L * nkv * dim; i++) {
		st = st * 1664525u + 1013904223u;
		w[i] = 0.2f * ((float)(st >> 8) / (float)(1u << 24) - 0.5f);
	}
	for (size_t i = 0; i < (size_t)L * nkv; i++)
		b[i] = -4.0f;
	for (uint32_t l = 0; l < L; l++) {
		snprintf(names[2 * l], 32, "kvzap.%u.weight", l);
		snprintf(names[2 * l + 1], 32, "kvzap.%u.bias", l);
		t[2 * l] = (struct weights_tensor){names[2 * l], 2, {nkv, dim},
		                                   w + (size_t)l * nkv * dim};
		t[2 * l + 1] = (struct weights_tensor){names[2 * l + 1], 1,
		                                       {nkv}, b + l * nkv};
	}
	char err[256];
	T_OK(weights_write(path, t, 2 * L, err, sizeof(err)));
	free(w);
	free(b);
	free(t);
	free(names);
}

/* What one backend's run leaves: logits [NCMP][V], per list (layer, KV
 * head) its length and keys [NCMP][head_dim], the tenant's counts. */
struct backend_run {
	int kind; /* kvt_memory_kind */
	float *logits;
	uint32_t *len;
	float *keys;
	uint64_t appended, evicted;
};

static void run_on(const char *backend, const struct model *m,
                   const char *policy, const int32_t *tok,
                   struct backend_run *r)
{
	const struct model_config *mc = &m->cfg;
	const uint32_t lists = mc->n_layers * mc->n_kv_heads, hd = mc->head_dim;
	r->logits = malloc(sizeof(float) * NCMP * mc->vocab_size);
	r->len = calloc(lists, sizeof(uint32_t));
	r->keys = calloc((size_t)lists * NCMP * hd, sizeof(float));
	T_ASSERT(r->logits && r->len && r->keys);
	struct th_daemon d;
	th_daemon_start_as(&d, backend, backend, "64M", NULL);
	struct engine *e;
	open_engine(&d, m, policy, KVT_DTYPE_F32, &e);
	kvt_client *c = engine_client(e);
	r->kind = kvt_memory_kind(c);
	feed(e, tok, NCMP, CHUNK, r->logits, mc->vocab_size);
	uint32_t pt = kvt_config_of(c)->page_tokens;
	for (uint32_t l = 0; l < mc->n_layers; l++)
		for (uint32_t g = 0; g < mc->n_kv_heads; g++) {
			uint32_t li_ = l * mc->n_kv_heads + g;
			struct kvt_list li;
			T_OK(kvt_list_get(c, engine_seq(e), l, g, &li));
			T_ASSERT(li.len <= NCMP);
			r->len[li_] = li.len;
			for (uint32_t i = 0; i < li.len; i++) {
				const float *page = kvt_page_ptr(c,
				                                 li.pages[i / pt]);
				T_ASSERT(page);
				/* kvt_memcpy: the page may be device memory */
				T_OK(kvt_memcpy(c, r->keys + ((size_t)li_ * NCMP +
				                              i) * hd,
				                page + (size_t)(i % pt) * hd,
				                hd * sizeof(float)));
			}
		}
	struct kvt_tenant_stats ts;
	T_OK(kvt_stats(c, &ts));
	r->appended = ts.entries_appended;
	r->evicted = ts.entries_evicted;
	engine_close(e);
	T_EQ(th_daemon_stop(&d), 0);
}

static void backend_run_free(struct backend_run *r)
{
	free(r->logits);
	free(r->len);
	free(r->keys);
}

static void cuda_matches_cpu(const char *policy, int evicts)
{
	if (strcmp(th_backend(), "cuda"))
		T_SKIP("compares the engine on a cuda daemon with one on a cpu "
		       "daemon: runs on the cuda passes (KVTRIM_BACKEND=cuda)");
	struct model m;
	load_or_skip("bytes2m.bin", &m);
	int32_t tok[NCMP];
	valid_tokens(tok, NCMP);
	char spec[600], path[512];
	snprintf(path, sizeof(path), "%s/kvzap.safetensors", th_tmpdir());
	if (!strcmp(policy, "kvzap")) {
		write_kvzap(&m, path);
		snprintf(spec, sizeof(spec), "kvzap:model=%s,window=16", path);
	} else {
		snprintf(spec, sizeof(spec), "%s", policy);
	}
	struct backend_run cpu, cuda;
	run_on("cpu", &m, spec, tok, &cpu);
	run_on("cuda", &m, spec, tok, &cuda);
	T_EQ(cpu.kind, KVT_MEMORY_HOST);
	T_EQ(cuda.kind, KVT_MEMORY_CUDA);

	const struct model_config *mc = &m.cfg;
	const uint32_t lists = mc->n_layers * mc->n_kv_heads;
	T_EQ_U64(cuda.appended, (uint64_t)lists * NCMP);
	T_EQ_U64(cuda.appended, cpu.appended);
	T_EQ_U64(cuda.evicted, cpu.evicted);
	if (evicts)
		T_ASSERT(cpu.evicted > lists * NCMP / 8 &&
		         cpu.evicted < lists * NCMP * 7 / 8);
	else
		T_EQ_U64(cpu.evicted, 0);
	double dkey = 0;
	for (uint32_t i = 0; i < lists; i++) {
		T_EQ(cuda.len[i], cpu.len[i]);
		size_t o = (size_t)i * NCMP * mc->head_dim;
		dkey = fmax(dkey, max_diff(cuda.keys + o, cpu.keys + o,
		                           (size_t)cpu.len[i] * mc->head_dim));
	}
	double dlog = max_diff(cuda.logits, cpu.logits,
	                       (size_t)NCMP * mc->vocab_size);
	fprintf(stderr, "    %s: %llu of %llu entries evicted on both; max "
	        "|diff| cuda vs cpu: logits %.3g, kept keys %.3g\n", policy,
	        (unsigned long long)cpu.evicted,
	        (unsigned long long)cpu.appended, dlog, dkey);
	T_ASSERT(dlog <= LOGIT_TOL_CUDA);
	T_ASSERT(dkey <= LOGIT_TOL_CUDA);
	backend_run_free(&cpu);
	backend_run_free(&cuda);
	model_free(&m);
}

TEST_T(engine_backends, cuda_full_matches_cpu, 120)
{
	cuda_matches_cpu("full", 0);
}

TEST_T(engine_backends, cuda_kvzap_matches_cpu, 120)
{
	cuda_matches_cpu("kvzap", 1);
}
