/*
 * test_attention.c — kvt_attention through the real daemon, on whatever
 * backend the suite runs (KVTRIM_BACKEND; `make test` also runs it on the
 * emulated cuda backend): every dtype, grouped-query attention, causal
 * chunks of several new tokens, lists compacted by a policy, lists long
 * enough for the CUDA kernel's split-K path, the empty case, and every bad
 * argument.
 *
 * Expected values come from a naive double-precision attention written
 * here, over the entries read back through kvt_list_get and kvt_page_ptr
 * (kvt_memcpy to the host on a cuda tenant), and for the first token by
 * hand (one entry: out is its V row, lse its scaled logit).  q, out and
 * lse are kvt_buffer_alloc buffers: device memory on a cuda tenant.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "dtype.h"
#include "kvtrim.h"
#include "test.h"

/* Buffers where the tenant computes (kvt_buffer_alloc: host memory, or
 * device memory of this process on a cuda tenant). */
struct mem_kind {
	kvt_client *c;
};

static void kind_open(struct mem_kind *k, kvt_client *c)
{
	k->c = c;
}

static void *kind_alloc(struct mem_kind *k, size_t bytes)
{
	void *p = NULL;
	T_OK(kvt_buffer_alloc(k->c, bytes ? bytes : 1, &p));
	return p;
}

static void kind_free3(struct mem_kind *k, void *a, void *b, void *c)
{
	T_OK(kvt_buffer_free(k->c, a));
	T_OK(kvt_buffer_free(k->c, b));
	T_OK(kvt_buffer_free(k->c, c));
}

/* A daemon, one tenant on it, its memory kind and one open sequence. */
struct fix {
	struct th_daemon d;
	kvt_client *c;
	struct mem_kind k;
	kvt_seq s;
};

/* Connects cfg (from th_small_cfg(&f->d, ...) after th_daemon_start). */
static void fix_connect(struct fix *f, const struct kvt_config *cfg)
{
	char err[KVT_ERRTEXT_MAX];
	T_OK(kvt_connect(cfg, &f->c, err));
	kind_open(&f->k, f->c);
	T_OK(kvt_seq_open(f->c, &f->s));
}

static void fix_stop(struct fix *f)
{
	kvt_disconnect(f->c);
	T_EQ(th_daemon_stop(&f->d), 0);
}

/* Deterministic values in [-1, 1). */
static uint32_t rng_state = 12345;
static float rnd(void)
{
	rng_state = rng_state * 1664525u + 1013904223u;
	return (float)(rng_state >> 8) / (float)(1u << 23) - 1.0f;
}

/* Writes random K and V rows at entries len .. len + n - 1 of every list
 * of every layer, converted to the tenant dtype. */
static void append_random(kvt_client *c, kvt_seq s, uint32_t n)
{
	const struct kvt_config *cf = kvt_config_of(c);
	uint32_t hd = cf->geo.head_dim;
	size_t rb = hd * kvt_dtype_size(cf->dtype);
	float row[256];
	uint8_t conv[1024];
	for (uint32_t l = 0; l < cf->geo.n_layers; l++)
		for (uint32_t h = 0; h < cf->geo.n_kv_heads; h++)
			for (uint32_t t = 0; t < n; t++) {
				void *kp, *vp;
				T_OK(kvt_kv_ptr(c, s, l, h, t, &kp, &vp));
				for (int side = 0; side < 2; side++) {
					for (uint32_t d = 0; d < hd; d++)
						row[d] = rnd();
					dtype_from_f32(row, cf->dtype, conv, hd);
					T_OK(kvt_memcpy(c, side ? vp : kp, conv, rb));
				}
			}
}

/* Entry e of a list, K (v 0) or V (v 1), read back to float. */
static void entry_row(kvt_client *c, const struct kvt_list *li, uint32_t e,
                      int v, float *out)
{
	const struct kvt_config *cf = kvt_config_of(c);
	uint32_t hd = cf->geo.head_dim, pt = cf->page_tokens;
	size_t es = kvt_dtype_size(cf->dtype), rb = hd * es;
	uint8_t raw[1024];
	const char *page = kvt_page_ptr(c, li->pages[e / pt]);
	T_ASSERT(page);
	const char *src = page + (v ? (size_t)pt * rb : 0) + (e % pt) * rb;
	T_OK(kvt_memcpy(c, raw, src, rb));
	dtype_to_f32(raw, cf->dtype, out, hd);
}

/*
 * Runs kvt_attention for n new tokens of layer `layer` (their K/V already
 * written) with random q and checks it against the naive attention over
 * the lists read back.  Returns the largest absolute error seen.
 */
static double check_layer_at(struct mem_kind *k, kvt_seq s, uint32_t layer,
                             uint32_t n, double tol, float scale_arg);

static double check_layer(struct mem_kind *k, kvt_seq s, uint32_t layer,
                          uint32_t n, double tol)
{
	return check_layer_at(k, s, layer, n, tol, 0);
}

/* check_layer with a softmax scale of the engine's (scale_arg > 0: the
 * call is kvt_attend with one item of that scale). */
static double check_layer_at(struct mem_kind *k, kvt_seq s, uint32_t layer,
                             uint32_t n, double tol, float scale_arg)
{
	kvt_client *c = k->c;
	const struct kvt_config *cf = kvt_config_of(c);
	const uint32_t H = cf->geo.n_heads, Hkv = cf->geo.n_kv_heads;
	const uint32_t hd = cf->geo.head_dim, G = H / Hkv;
	size_t qn = (size_t)n * H * hd;
	float *q = malloc(qn * sizeof(float));
	float *out = malloc(qn * sizeof(float));
	float *lse = malloc((size_t)n * H * sizeof(float));
	T_ASSERT(q && out && lse);
	for (size_t i = 0; i < qn; i++)
		q[i] = 2.0f * rnd();
	float *dq = kind_alloc(k, qn * sizeof(float));
	float *dout = kind_alloc(k, qn * sizeof(float));
	float *dlse = kind_alloc(k, (size_t)n * H * sizeof(float));
	T_OK(kvt_memcpy(c, dq, q, qn * sizeof(float)));
	if (scale_arg > 0) {
		struct kvt_attend_item it = {s, layer, n, scale_arg, dq, dout,
		                             dlse};
		T_OK(kvt_attend(c, &it, 1));
	} else {
		T_OK(kvt_attention(c, s, layer, n, dq, dout, dlse));
	}
	/* kvt_memcpy runs on the client's stream, after the attention. */
	T_OK(kvt_memcpy(c, out, dout, qn * sizeof(float)));
	T_OK(kvt_memcpy(c, lse, dlse, (size_t)n * H * sizeof(float)));

	double worst = 0, scale = scale_arg > 0 ? (double)scale_arg
	                                         : 1.0 / sqrt((double)hd);
	float kr[256], vr[256];
	for (uint32_t h = 0; h < Hkv; h++) {
		struct kvt_list li;
		T_OK(kvt_list_get(c, s, layer, h, &li));
		uint32_t m = li.len + n;
		double *K = malloc((size_t)m * hd * sizeof(double));
		double *V = malloc((size_t)m * hd * sizeof(double));
		double *w = malloc((size_t)m * sizeof(double));
		T_ASSERT(K && V && w);
		for (uint32_t e = 0; e < m; e++) {
			entry_row(c, &li, e, 0, kr);
			entry_row(c, &li, e, 1, vr);
			for (uint32_t d = 0; d < hd; d++) {
				K[(size_t)e * hd + d] = kr[d];
				V[(size_t)e * hd + d] = vr[d];
			}
		}
		for (uint32_t t = 0; t < n; t++)
			for (uint32_t gi = 0; gi < G; gi++) {
				uint32_t qh = h * G + gi;
				const float *qv = q + ((size_t)t * H + qh) * hd;
				uint32_t len = li.len + t + 1; /* causal */
				double mx = -INFINITY, sum = 0;
				for (uint32_t e = 0; e < len; e++) {
					double dot = 0;
					for (uint32_t d = 0; d < hd; d++)
						dot += qv[d] * K[(size_t)e * hd + d];
					w[e] = dot * scale;
					mx = w[e] > mx ? w[e] : mx;
				}
				for (uint32_t e = 0; e < len; e++)
					sum += (w[e] = exp(w[e] - mx));
				double want_lse = mx + log(sum);
				double got_lse = lse[(size_t)t * H + qh];
				double err = fabs(got_lse - want_lse);
				if (err > tol)
					th_fail(__FILE__, __LINE__, "layer %u token %u "
					        "head %u: lse %.7f, expected %.7f",
					        layer, t, qh, got_lse, want_lse);
				worst = err > worst ? err : worst;
				for (uint32_t d = 0; d < hd; d++) {
					double o = 0;
					for (uint32_t e = 0; e < len; e++)
						o += w[e] * V[(size_t)e * hd + d];
					o /= sum;
					double got = out[((size_t)t * H + qh) * hd + d];
					err = fabs(got - o);
					if (err > tol)
						th_fail(__FILE__, __LINE__, "layer %u "
						        "token %u head %u dim %u: out "
						        "%.7f, expected %.7f", layer, t,
						        qh, d, got, o);
					worst = err > worst ? err : worst;
				}
			}
		free(K);
		free(V);
		free(w);
	}
	kind_free3(k, dq, dout, dlse);
	free(q);
	free(out);
	free(lse);
	return worst;
}

/*
 * One tenant of dtype dt and (n_heads, n_kv_heads) fed in the given chunks
 * (n new tokens each, every layer checked before each sync).
 */
static void run_chunks(enum kvt_dtype dt, uint32_t H, uint32_t Hkv,
                       uint32_t hd, const char *policy, uint32_t page_tokens,
                       uint32_t max_tokens, uint32_t headroom,
                       const uint32_t *chunks, uint32_t n_chunks)
{
	struct fix f;
	th_daemon_start(&f.d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&f.d, "attn", policy);
	cfg.geo = (struct kvt_geometry){2, H, Hkv, hd, 32};
	cfg.dtype = dt;
	cfg.page_tokens = page_tokens;
	cfg.max_tokens = max_tokens;
	cfg.headroom = headroom;
	fix_connect(&f, &cfg);
	/* Errors of the float kernels over the same stored values only. */
	double tol = 2e-5 * sqrt((double)hd) + 1e-5;
	for (uint32_t i = 0; i < n_chunks; i++) {
		uint32_t n = chunks[i];
		append_random(f.c, f.s, n);
		for (uint32_t l = 0; l < cfg.geo.n_layers; l++)
			check_layer(&f.k, f.s, l, n, tol);
		struct kvt_sync_item it = {.seq = f.s, .n_new = n,
		                           .phase = n > 1 ? KVT_PHASE_PREFILL
		                                          : KVT_PHASE_DECODE};
		T_OK(kvt_sync(f.c, &it, 1));
	}
	fix_stop(&f);
}

static const uint32_t mixed[] = {5, 1, 8, 3, 1, 1, 7, 2, 8, 8, 4};

TEST(attention, f32_gqa_causal_chunks_match_naive)
{
	run_chunks(KVT_DTYPE_F32, 4, 2, 8, "full", 4, 64, 8, mixed,
	           sizeof(mixed) / sizeof(mixed[0]));
}

TEST(attention, f16_gqa_causal_chunks_match_naive)
{
	run_chunks(KVT_DTYPE_F16, 8, 2, 16, "full", 4, 64, 8, mixed,
	           sizeof(mixed) / sizeof(mixed[0]));
}

TEST(attention, bf16_mha_causal_chunks_match_naive)
{
	run_chunks(KVT_DTYPE_BF16, 2, 2, 8, "full", 4, 64, 8, mixed,
	           sizeof(mixed) / sizeof(mixed[0]));
}

/* The policy drops and compacts entries, so the lists hold them out of
 * their original order and shorter than the positions fed. */
TEST(attention, compacted_lists_match_naive)
{
	run_chunks(KVT_DTYPE_F16, 4, 1, 8, "streaming:sinks=2,tokens=12", 4,
	           64, 8, mixed, sizeof(mixed) / sizeof(mixed[0]));
}

/* Lists of several hundred entries: the CUDA kernel splits them into
 * slices and merges the slices' log-sum-exps. */
TEST_T(attention, long_lists_match_naive, 120)
{
	static const uint32_t longc[] = {64, 64, 64, 64, 64, 64, 64, 64, 64,
	                                 64, 7, 1};
	run_chunks(KVT_DTYPE_BF16, 8, 4, 64, "full", 16, 1024, 64, longc,
	           sizeof(longc) / sizeof(longc[0]));
}

/* A new sequence: n 0 writes nothing; the first token sees itself alone,
 * so out is its V row and lse its scaled logit (by hand). */
TEST(attention, empty_list_and_first_token)
{
	struct fix f;
	th_daemon_start(&f.d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&f.d, "attn0", "full");
	fix_connect(&f, &cfg);
	kvt_client *c = f.c;
	kvt_seq s = f.s;
	struct mem_kind *k = &f.k;
	struct kvt_list li;
	T_OK(kvt_list_get(c, s, 0, 0, &li));
	T_EQ(li.len, 0);
	T_OK(kvt_attention(c, s, 0, 0, NULL, NULL, NULL));

	/* geometry 4 heads, 2 KV heads, head_dim 8, f32: K of each KV
	 * head is e_0 * (h + 1), V is (h + 1) * (1..8); q of every head
	 * is 2 * e_0, so head j's logit is 2 (j / 2 + 1) / sqrt(8). */
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t h = 0; h < 2; h++) {
			float kr[8] = {0}, vr[8];
			void *kp, *vp;
			kr[0] = (float)(h + 1);
			for (int i = 0; i < 8; i++)
				vr[i] = (float)((h + 1) * (i + 1));
			T_OK(kvt_kv_ptr(c, s, l, h, 0, &kp, &vp));
			T_OK(kvt_memcpy(c, kp, kr, sizeof(kr)));
			T_OK(kvt_memcpy(c, vp, vr, sizeof(vr)));
		}
	float q[4][8] = {{0}}, out[4][8], lse[4];
	for (int j = 0; j < 4; j++)
		q[j][0] = 2.0f;
	float *dq = kind_alloc(k, sizeof(q));
	float *dout = kind_alloc(k, sizeof(out));
	float *dlse = kind_alloc(k, sizeof(lse));
	T_OK(kvt_memcpy(c, dq, q, sizeof(q)));
	T_OK(kvt_attention(c, s, 1, 1, dq, dout, dlse));
	T_OK(kvt_memcpy(c, out, dout, sizeof(out)));
	T_OK(kvt_memcpy(c, lse, dlse, sizeof(lse)));
	for (int j = 0; j < 4; j++) {
		int h = j / 2;
		double want = 2.0 * (h + 1) / sqrt(8.0);
		T_ASSERT(fabs(lse[j] - want) < 1e-6);
		for (int i = 0; i < 8; i++)
			T_ASSERT(fabsf(out[j][i] - (float)((h + 1) * (i + 1))) <
			         1e-6f);
	}
	kind_free3(k, dq, dout, dlse);
	fix_stop(&f);
}

/* Every bad argument: its code, a reason, and out / lse untouched. */
TEST(attention, bad_arguments_change_nothing)
{
	struct fix f;
	th_daemon_start(&f.d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&f.d, "attnbad", "full");
	fix_connect(&f, &cfg);
	kvt_client *c = f.c;
	kvt_seq s = f.s, closed;
	struct mem_kind *k = &f.k;
	T_OK(kvt_seq_open(c, &closed));
	T_OK(kvt_seq_close(c, closed));
	append_random(c, s, 4);

	const size_t qb = 4 * 4 * 8 * sizeof(float), lb = 4 * 4 * sizeof(float);
	float sentinel[4 * 4 * 8], back[4 * 4 * 8];
	for (size_t i = 0; i < sizeof(sentinel) / sizeof(float); i++)
		sentinel[i] = 1234.5f;
	float *dq = kind_alloc(k, qb), *dout = kind_alloc(k, qb);
	float *dlse = kind_alloc(k, lb);
	T_OK(kvt_memcpy(c, dq, sentinel, qb));
	T_OK(kvt_memcpy(c, dout, sentinel, qb));
	T_OK(kvt_memcpy(c, dlse, sentinel, lb));

	T_ERR(kvt_attention(NULL, s, 0, 1, dq, dout, dlse), KVT_EINVAL);
	T_ERR(kvt_attention(c, s + 1000, 0, 1, dq, dout, dlse), KVT_ENOSEQ);
	T_ASSERT(strstr(kvt_last_error(c), "sequence"));
	T_ERR(kvt_attention(c, closed, 0, 1, dq, dout, dlse), KVT_ENOSEQ);
	T_ERR(kvt_attention(c, s, 2, 1, dq, dout, dlse), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "layer 2"));
	T_ERR(kvt_attention(c, s, 0, 5, dq, dout, dlse), KVT_EHEADROOM);
	T_ASSERT(strstr(kvt_last_error(c), "headroom"));
	T_ERR(kvt_attention(c, s, 0, 1, NULL, dout, dlse), KVT_EINVAL);
	T_ERR(kvt_attention(c, s, 0, 1, dq, NULL, dlse), KVT_EINVAL);
	T_ERR(kvt_attention(c, s, 0, 1, dq, dout, NULL), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "NULL"));
	if (kvt_memory_kind(c) == KVT_MEMORY_CUDA) {
		/* host memory passed to a cuda tenant */
		T_ERR(kvt_attention(c, s, 0, 1, sentinel, dout, dlse),
		      KVT_EINVAL);
		T_ASSERT(strstr(kvt_last_error(c), "device memory"));
		T_ERR(kvt_attention(c, s, 0, 1, dq, back, dlse), KVT_EINVAL);
	}
	/* a sync in flight makes the sequence busy */
	struct kvt_sync_item it = {.seq = s, .n_new = 4,
	                           .phase = KVT_PHASE_PREFILL};
	kvt_ticket tk;
	T_OK(kvt_sync_async(c, &it, 1, &tk));
	T_ERR(kvt_attention(c, s, 0, 1, dq, dout, dlse), KVT_EBUSY);
	T_OK(kvt_wait(c, tk));

	T_OK(kvt_memcpy(c, back, dout, qb));
	T_ASSERT(!memcmp(back, sentinel, qb));
	T_OK(kvt_memcpy(c, back, dlse, lb));
	T_ASSERT(!memcmp(back, sentinel, lb));
	/* and the call works afterwards: the 4 entries are committed */
	append_random(c, s, 1);
	T_OK(kvt_attention(c, s, 0, 1, dq, dout, dlse));
	T_OK(kvt_memcpy(c, back, dlse, lb));
	T_ASSERT(back[0] != 1234.5f && isfinite(back[0]));

	T_ERR(kvt_attention(NULL, 1, 0, 0, NULL, NULL, NULL), KVT_EINVAL);
	kind_free3(k, dq, dout, dlse);
	fix_stop(&f);
}

/* kvt_attend: two sequences in one call, each its layer, token count and
 * scale; item results equal kvt_attention's (the same arithmetic) and an
 * engine's own scale is checked against the naive loop. */
TEST(attention, attend_many_sequences_and_scales)
{
	struct fix f;
	th_daemon_start(&f.d, "64M", NULL);
	struct kvt_config cfg = th_small_cfg(&f.d, "attnmany", "full");
	fix_connect(&f, &cfg);
	kvt_client *c = f.c;
	kvt_seq s1 = f.s, s2;
	T_OK(kvt_seq_open(c, &s2));
	append_random(c, s1, 4);
	append_random(c, s2, 3);
	struct kvt_sync_item sy[2] = {{s1, 4, KVT_PHASE_PREFILL, 0, 0},
	                              {s2, 3, KVT_PHASE_PREFILL, 0, 0}};
	T_OK(kvt_sync(c, sy, 2));
	append_random(c, s1, 2);
	append_random(c, s2, 1);
	/* an engine's scale, against the naive loop */
	check_layer_at(&f.k, s1, 1, 2, 1e-5, 0.3f);
	check_layer_at(&f.k, s2, 0, 1, 1e-5, 0.05f);
	/* two items in one call equal two kvt_attention calls */
	enum { H = 4, HD = 8 };
	float q1[2][H][HD], q2[1][H][HD];
	for (int i = 0; i < 2 * H * HD; i++)
		(&q1[0][0][0])[i] = rnd();
	for (int i = 0; i < H * HD; i++)
		(&q2[0][0][0])[i] = rnd();
	float *b[10];
	const size_t sz[10] = {sizeof(q1), sizeof(q1), 2 * H * 4, sizeof(q2),
	                       sizeof(q2), H * 4, sizeof(q1), 2 * H * 4,
	                       sizeof(q2), H * 4};
	for (int i = 0; i < 10; i++)
		b[i] = kind_alloc(&f.k, sz[i]);
	T_OK(kvt_memcpy(c, b[0], q1, sizeof(q1)));
	T_OK(kvt_memcpy(c, b[3], q2, sizeof(q2)));
	struct kvt_attend_item it[2] = {{s1, 0, 2, 0, b[0], b[1], b[2]},
	                                {s2, 1, 1, 0, b[3], b[4], b[5]}};
	T_OK(kvt_attend(c, it, 2));
	T_OK(kvt_attention(c, s1, 0, 2, b[0], b[6], b[7]));
	T_OK(kvt_attention(c, s2, 1, 1, b[3], b[8], b[9]));
	float x[2][2 * H * HD], y[2][2 * H * HD];
	T_OK(kvt_memcpy(c, x[0], b[1], sizeof(q1)));
	T_OK(kvt_memcpy(c, y[0], b[6], sizeof(q1)));
	T_OK(kvt_memcpy(c, x[1], b[4], sizeof(q2)));
	T_OK(kvt_memcpy(c, y[1], b[8], sizeof(q2)));
	T_ASSERT(!memcmp(x[0], y[0], sizeof(q1)));
	T_ASSERT(!memcmp(x[1], y[1], sizeof(q2)));
	/* a bad item anywhere refuses the whole call, naming it, and
	 * writes nothing: the first item's out keeps its sentinel */
	float sent[2 * H * HD];
	for (int i = 0; i < 2 * H * HD; i++)
		sent[i] = 1234.5f;
	T_OK(kvt_memcpy(c, b[1], sent, sizeof(sent)));
	struct kvt_attend_item bad[2] = {it[0], it[1]};
	bad[1].layer = 9;
	T_ERR(kvt_attend(c, bad, 2), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "item 1"));
	bad[1] = it[1];
	bad[1].scale = -1.0f;
	T_ERR(kvt_attend(c, bad, 2), KVT_EINVAL);
	bad[1] = it[1];
	bad[1].out = (float *)bad[1].q; /* out over q */
	T_ERR(kvt_attend(c, bad, 2), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "overlap"));
	bad[1] = it[1];
	bad[1].seq = s2 + 1;
	T_ERR(kvt_attend(c, bad, 2), KVT_ENOSEQ);
	float back[2 * H * HD];
	T_OK(kvt_memcpy(c, back, b[1], sizeof(back)));
	T_ASSERT(!memcmp(back, sent, sizeof(back)));
	/* kvt_attention refuses overlap too (the header always forbade it) */
	T_ERR(kvt_attention(c, s1, 0, 2, b[0], b[0], b[2]), KVT_EINVAL);
	T_ERR(kvt_attention(c, s1, 0, 2, b[0], b[1], b[0]), KVT_EINVAL);
	/* nor may out or lse lie in the table (host or device copy) */
	struct kvt_table_view tv;
	T_OK(kvt_table_view(c, &tv));
	T_ERR(kvt_attention(c, s1, 0, 2, b[0], (float *)tv.table, b[2]),
	      KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "table"));
	T_ERR(kvt_attention(c, s1, 0, 2, b[0], b[1], (float *)tv.table),
	      KVT_EINVAL);
	bad[1] = it[1];
	bad[1].lse = (float *)tv.table;
	T_ERR(kvt_attend(c, bad, 2), KVT_EINVAL);
	T_OK(kvt_attend(c, NULL, 0));
	for (int i = 0; i < 10; i++)
		T_OK(kvt_buffer_free(c, b[i]));
	fix_stop(&f);
}
