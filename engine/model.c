/*
 * model.c — llama2.c checkpoint loader and the shared transformer forward;
 * see model.h.  GGUF files are read by model_gguf.c.
 */
#include "errors.h"
#include "kernels.h"
#include "model.h"
#include "model_gguf.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC_AK42 0x616b3432u
#define V0_HEADER 28    /* 7 int32 */
#define VN_HEADER 256   /* magic, version, 7 int32, flags, padding */

/* Sanity bounds: far above any model this engine is meant for, low enough
 * that every size product below fits in 64 bits with room to spare. */
#define MAX_DIM (1u << 16)
#define MAX_HIDDEN (1u << 18)
#define MAX_LAYERS 1024u
#define MAX_HEADS 1024u
#define MAX_VOCAB (1u << 21)
#define MAX_SEQ (1u << 20)

/* ---------------------------------------------------------------- layout */

/* Float counts of each tensor, in the order of struct model. */
struct sizes {
	uint64_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
		wcls, total;
};

static struct sizes sizes_of(const struct model_config *c)
{
	struct sizes s;
	uint64_t L = c->n_layers, d = c->dim, kv = c->kv_dim, hid = c->hidden_dim;
	s.emb = (uint64_t)c->vocab_size * d;
	s.rms_att = L * d;
	s.wq = L * d * d;
	s.wk = L * kv * d;
	s.wv = L * kv * d;
	s.wo = L * d * d;
	s.rms_ffn = L * d;
	s.w1 = L * hid * d;
	s.w2 = L * d * hid;
	s.w3 = L * hid * d;
	s.rms_final = d;
	s.wcls = c->shared_classifier ? 0 : s.emb;
	s.total = s.emb + s.rms_att + s.wq + s.wk + s.wv + s.wo + s.rms_ffn +
	          s.w1 + s.w2 + s.w3 + s.rms_final + s.wcls;
	return s;
}

static int check_config(struct model_config *c, char *err, size_t errlen)
{
	if (!c->dim || c->dim > MAX_DIM || !c->hidden_dim ||
	    c->hidden_dim > MAX_HIDDEN || !c->n_layers ||
	    c->n_layers > MAX_LAYERS || !c->n_heads || c->n_heads > MAX_HEADS ||
	    !c->n_kv_heads || !c->vocab_size || c->vocab_size > MAX_VOCAB ||
	    !c->seq_len || c->seq_len > MAX_SEQ)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "bad header: dim %u hidden %u layers %u heads %u "
		            "kv_heads %u vocab %u seq_len %u (zero or beyond "
		            "sane bounds)", c->dim, c->hidden_dim, c->n_layers,
		            c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len);
	if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads ||
	    (c->dim / c->n_heads) % 2)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "bad header: dim %u, %u heads, %u KV heads do not "
		            "give an even head_dim shared by whole groups",
		            c->dim, c->n_heads, c->n_kv_heads);
	if (c->rope_theta == 0)
		c->rope_theta = MODEL_ROPE_THETA;
	if (c->rms_eps == 0)
		c->rms_eps = MODEL_RMS_EPS;
	if (!(c->rope_theta > 0) || !isfinite(c->rope_theta) ||
	    !(c->rms_eps > 0) || !isfinite(c->rms_eps) ||
	    c->usable_ctx > c->seq_len)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "bad config: rope theta %g, rms eps %g (positive, "
		            "finite), usable context %u (at most seq_len %u)",
		            (double)c->rope_theta, (double)c->rms_eps,
		            c->usable_ctx, c->seq_len);
	c->head_dim = c->dim / c->n_heads;
	c->kv_dim = c->n_kv_heads * c->head_dim;
	return 0;
}

int model_alloc(struct model *m, const struct model_config *cfg, char *err,
                size_t errlen)
{
	memset(m, 0, sizeof(*m));
	struct model_config c = *cfg;
	c.shared_classifier = c.shared_classifier ? 1 : 0;
	int rc = check_config(&c, err, errlen);
	if (rc)
		return rc;
	struct sizes s = sizes_of(&c);
	if (s.total > (uint64_t)SIZE_MAX / sizeof(float))
		return errors_fmt(err, errlen, KVT_ENOMEM, "model too large");
	float *p = calloc((size_t)s.total, sizeof(float));
	if (!p)
		return errors_fmt(err, errlen, KVT_ENOMEM,
		            "cannot allocate %llu floats of weights",
		            (unsigned long long)s.total);
	m->cfg = c;
	m->bos = MODEL_BOS;
	m->data = p;
	m->tok_emb = p;    p += s.emb;
	m->rms_att = p;    p += s.rms_att;
	m->wq = p;         p += s.wq;
	m->wk = p;         p += s.wk;
	m->wv = p;         p += s.wv;
	m->wo = p;         p += s.wo;
	m->rms_ffn = p;    p += s.rms_ffn;
	m->w1 = p;         p += s.w1;
	m->w2 = p;         p += s.w2;
	m->w3 = p;         p += s.w3;
	m->rms_final = p;  p += s.rms_final;
	m->wcls = c.shared_classifier ? m->tok_emb : p;
	return 0;
}

void model_free(struct model *m)
{
	if (!m)
		return;
	free(m->data);
	memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------- loading */

/* A bounds-checked cursor over the file image. */
struct rd {
	const unsigned char *p;
	size_t len, off;
};

static int rd_f32(struct rd *r, float *dst, uint64_t n)
{
	if (n > (r->len - r->off) / 4)
		return -1;
	memcpy(dst, r->p + r->off, (size_t)n * 4);
	r->off += (size_t)n * 4;
	return 0;
}

static int rd_skip(struct rd *r, uint64_t bytes)
{
	if (bytes > r->len - r->off)
		return -1;
	r->off += (size_t)bytes;
	return 0;
}

/* One Q8_0 tensor: int8 values [n] then float32 scales [n / gs]. */
static int rd_q80(struct rd *r, float *dst, uint64_t n, uint32_t gs)
{
	uint64_t ns = n / gs;
	if (n > r->len - r->off || ns > (r->len - r->off - n) / 4)
		return -1;
	const signed char *q = (const signed char *)(r->p + r->off);
	const unsigned char *sp = r->p + r->off + n;
	for (uint64_t g = 0; g < ns; g++) {
		float s;
		memcpy(&s, sp + g * 4, 4);
		for (uint32_t j = 0; j < gs; j++)
			dst[g * gs + j] = (float)q[g * gs + j] * s;
	}
	r->off += (size_t)(n + ns * 4);
	return 0;
}

static int32_t rd_i32_at(const unsigned char *p, size_t off)
{
	int32_t v;
	memcpy(&v, p + off, 4);
	return v;
}

/* Fills cfg from 7 int32 at off; negative values other than vocab (v0
 * classifier flag) are a bad header. */
static int parse_params(const unsigned char *p, size_t off, int legacy,
                        struct model_config *c, char *err, size_t errlen)
{
	int32_t v[7];
	for (int i = 0; i < 7; i++)
		v[i] = rd_i32_at(p, off + 4 * (size_t)i);
	memset(c, 0, sizeof(*c));
	if (legacy) {
		c->shared_classifier = v[5] > 0;
		if (v[5] < 0 && v[5] != INT32_MIN)
			v[5] = -v[5];
	}
	for (int i = 0; i < 7; i++)
		if (v[i] <= 0)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "bad header: field %d is %d (dim, hidden, "
			            "layers, heads, kv_heads, vocab, seq_len "
			            "must be positive)", i, (int)v[i]);
	c->dim = (uint32_t)v[0];
	c->hidden_dim = (uint32_t)v[1];
	c->n_layers = (uint32_t)v[2];
	c->n_heads = (uint32_t)v[3];
	c->n_kv_heads = (uint32_t)v[4];
	c->vocab_size = (uint32_t)v[5];
	c->seq_len = (uint32_t)v[6];
	return check_config(c, err, errlen);
}

static int load_image(const unsigned char *img, size_t len, const char *path,
                      struct model *m, char *err, size_t errlen)
{
	struct model_config c;
	int version, rc;
	uint32_t gs = 0;
	if (len < V0_HEADER)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "%s: %zu bytes is too short for a llama2.c header",
		            path, len);
	uint32_t magic;
	memcpy(&magic, img, 4);
	if (magic == MAGIC_AK42) {
		if (len < VN_HEADER)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "%s: ak42 header needs %d bytes, file has "
			            "%zu", path, VN_HEADER, len);
		version = rd_i32_at(img, 4);
		if (version != 1 && version != 2)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "%s: unsupported ak42 version %d (1 and 2 "
			            "are)", path, version);
		rc = parse_params(img, 8, 0, &c, err, errlen);
		if (rc)
			return rc;
		if (img[36] > 1)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "%s: bad header: shared_classifier flag %u",
			            path, img[36]);
		c.shared_classifier = img[36];
		if (version == 2) {
			int32_t g;
			memcpy(&g, img + 37, 4);
			if (g <= 0 || c.dim % (uint32_t)g)
				return errors_fmt(err, errlen, KVT_EINVAL,
				            "%s: bad header: Q8_0 group size %d "
				            "for dim %u", path, (int)g, c.dim);
			gs = (uint32_t)g;
		}
	} else {
		version = 0;
		rc = parse_params(img, 0, 1, &c, err, errlen);
		if (rc)
			return rc;
	}

	struct sizes s = sizes_of(&c);
	uint64_t L = c.n_layers;
	uint64_t want;
	if (version == 0) {
		want = V0_HEADER +
		       4 * (s.total + (uint64_t)c.seq_len * c.head_dim);
	} else if (version == 1) {
		want = VN_HEADER + 4 * s.total;
	} else {
		/* norms in f32, the rest as int8 + one f32 scale per group;
		 * every quantized tensor (per layer) must be whole groups */
		uint64_t norms = s.rms_att + s.rms_ffn + s.rms_final;
		uint64_t per[] = {s.emb, s.wq / L, s.wk / L, s.wv / L,
		                  s.wo / L, s.w1 / L, s.w2 / L, s.w3 / L};
		for (size_t i = 0; i < sizeof(per) / sizeof(per[0]); i++)
			if (per[i] % gs)
				return errors_fmt(err, errlen, KVT_EINVAL,
				            "%s: bad header: a tensor of %llu "
				            "values is not whole groups of %u",
				            path, (unsigned long long)per[i], gs);
		uint64_t q = s.total - norms;
		want = VN_HEADER + 4 * norms + q + 4 * (q / gs);
	}
	if (want != len)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "%s: file is %zu bytes but a v%d checkpoint with "
		            "this header (dim %u, %u layers, vocab %u, %s "
		            "classifier) needs %llu: %s", path, len, version,
		            c.dim, c.n_layers, c.vocab_size,
		            c.shared_classifier ? "shared" : "separate",
		            (unsigned long long)want,
		            want > len ? "truncated" : "trailing bytes");

	rc = model_alloc(m, &c, err, errlen);
	if (rc)
		return rc;
	m->version = version;
	struct rd r = {img, len, version ? VN_HEADER : V0_HEADER};
	int bad = 0;
	if (version == 0) {
		bad |= rd_f32(&r, m->tok_emb, s.emb);
		bad |= rd_f32(&r, m->rms_att, s.rms_att);
		bad |= rd_f32(&r, m->wq, s.wq);
		bad |= rd_f32(&r, m->wk, s.wk);
		bad |= rd_f32(&r, m->wv, s.wv);
		bad |= rd_f32(&r, m->wo, s.wo);
		bad |= rd_f32(&r, m->rms_ffn, s.rms_ffn);
		bad |= rd_f32(&r, m->w1, s.w1);
		bad |= rd_f32(&r, m->w2, s.w2);
		bad |= rd_f32(&r, m->w3, s.w3);
		bad |= rd_f32(&r, m->rms_final, s.rms_final);
		/* freq_cis_real and _imag: RoPE is computed instead */
		bad |= rd_skip(&r, 4ull * c.seq_len * c.head_dim);
		if (!c.shared_classifier)
			bad |= rd_f32(&r, m->wcls, s.wcls);
	} else if (version == 1) {
		bad |= rd_f32(&r, m->rms_att, s.rms_att);
		bad |= rd_f32(&r, m->rms_ffn, s.rms_ffn);
		bad |= rd_f32(&r, m->rms_final, s.rms_final);
		bad |= rd_f32(&r, m->tok_emb, s.emb);
		bad |= rd_f32(&r, m->wq, s.wq);
		bad |= rd_f32(&r, m->wk, s.wk);
		bad |= rd_f32(&r, m->wv, s.wv);
		bad |= rd_f32(&r, m->wo, s.wo);
		bad |= rd_f32(&r, m->w1, s.w1);
		bad |= rd_f32(&r, m->w2, s.w2);
		bad |= rd_f32(&r, m->w3, s.w3);
		if (!c.shared_classifier)
			bad |= rd_f32(&r, m->wcls, s.wcls);
	} else {
		bad |= rd_f32(&r, m->rms_att, s.rms_att);
		bad |= rd_f32(&r, m->rms_ffn, s.rms_ffn);
		bad |= rd_f32(&r, m->rms_final, s.rms_final);
		bad |= rd_q80(&r, m->tok_emb, s.emb, gs);
		/* per-layer tensors, each with its own scales */
		float *t[] = {m->wq, m->wk, m->wv, m->wo, m->w1, m->w2, m->w3};
		uint64_t n[] = {s.wq, s.wk, s.wv, s.wo, s.w1, s.w2, s.w3};
		for (size_t i = 0; i < 7; i++)
			for (uint64_t l = 0; l < L; l++)
				bad |= rd_q80(&r, t[i] + l * (n[i] / L),
				              n[i] / L, gs);
		if (!c.shared_classifier)
			bad |= rd_q80(&r, m->wcls, s.wcls, gs);
	}
	if (bad || r.off != len) {
		model_free(m);
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "%s: internal size mismatch reading v%d tensors",
		            path, version);
	}
	return 0;
}

int model_load(const char *path, struct model *m, char *err, size_t errlen)
{
	memset(m, 0, sizeof(*m));
	FILE *f = fopen(path, "rb");
	if (!f)
		return errors_fmt(err, errlen, KVT_ESYS, "%s: %s", path,
		            strerror(errno));
	char magic[4];
	if (fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4)) {
		fclose(f);
		return model_gguf_load_file(path, m, err, errlen);
	}
	unsigned char *img = NULL;
	long len = -1;
	if (fseek(f, 0, SEEK_END) == 0)
		len = ftell(f);
	if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
		fclose(f);
		return errors_fmt(err, errlen, KVT_ESYS, "%s: cannot size the file",
		            path);
	}
	img = malloc(len ? (size_t)len : 1);
	if (!img) {
		fclose(f);
		return errors_fmt(err, errlen, KVT_ENOMEM, "%s: %ld bytes", path,
		            len);
	}
	size_t got = fread(img, 1, (size_t)len, f);
	int rerr = ferror(f);
	fclose(f);
	if (got != (size_t)len || rerr) {
		free(img);
		return errors_fmt(err, errlen, KVT_ESYS, "%s: short read", path);
	}
	int rc = load_image(img, (size_t)len, path, m, err, errlen);
	free(img);
	return rc;
}

const char *model_default_path(const char *explicit_path)
{
	if (explicit_path && *explicit_path)
		return explicit_path;
	const char *e = getenv("KVTRIM_MODEL");
	if (e && *e)
		return e;
	return "../shared/models/bytes2m.bin";
}

uint32_t model_context(const struct model *m)
{
	if (m->cfg.usable_ctx)
		return m->cfg.usable_ctx;
	return m->cfg.seq_len < MODEL_USABLE_CTX ? m->cfg.seq_len
	                                         : MODEL_USABLE_CTX;
}

/* ---------------------------------------------------------------- ops */

void model_rmsnorm(float *out, const float *x, const float *w, uint32_t n,
                   uint32_t dim, float eps)
{
	for (uint32_t r = 0; r < n; r++) {
		const float *xr = x + (size_t)r * dim;
		float *o = out + (size_t)r * dim;
		float ss = 0.0f;
		for (uint32_t j = 0; j < dim; j++)
			ss += xr[j] * xr[j];
		ss /= (float)dim;
		ss += eps;
		ss = 1.0f / sqrtf(ss);
		for (uint32_t j = 0; j < dim; j++)
			o[j] = w[j] * (ss * xr[j]);
	}
}

double model_logits_z(const float *l, uint32_t V, float *mx)
{
	float m = l[0];
	for (uint32_t i = 1; i < V; i++)
		m = l[i] > m ? l[i] : m;
	double z = 0;
	for (uint32_t i = 0; i < V; i++)
		z += exp((double)l[i] - m);
	*mx = m;
	return z;
}

void model_rope(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t pos,
                float theta)
{
	for (uint32_t i = 0; i < head_dim; i += 2) {
		float freq = 1.0f / powf(theta, (float)i / (float)head_dim);
		float a = (float)pos * freq;
		float c = cosf(a), s = sinf(a);
		for (uint32_t h = 0; h < n_heads; h++) {
			float *p = v + (size_t)h * head_dim + i;
			float v0 = p[0], v1 = p[1];
			p[0] = v0 * c - v1 * s;
			p[1] = v0 * s + v1 * c;
		}
	}
}

void model_matmul(float *y, const float *x, const float *W, uint32_t n,
                  uint32_t in, uint32_t out)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out,
	            (int)in, 1.0f, x, (int)in, W, (int)in, 0.0f, y, (int)out);
}

/* ---------------------------------------------------------------- forward */

/* Token t sits at position pos ? pos[t] : pos0 + t; everything else is
 * the same arithmetic for both entry points. */
static int forward(const struct model *m, const int32_t *tokens, uint32_t n,
                   uint32_t pos0, const uint32_t *pos,
                   const struct model_attn *a, float *logits)
{
	const struct model_config *c = &m->cfg;
	const uint32_t d = c->dim, kv = c->kv_dim, hid = c->hidden_dim,
	               hd = c->head_dim;
	if (!n)
		return 0;
	for (uint32_t t = 0; t < n; t++)
		if (tokens[t] < 0 || (uint32_t)tokens[t] >= c->vocab_size)
			return KVT_EINVAL;
	size_t nd = (size_t)n * d, nkv = (size_t)n * kv, nh = (size_t)n * hid;
	float *buf = malloc(sizeof(float) *
	                    (4 * nd + 2 * nkv + 2 * nh + nd +
	                     (size_t)n * c->n_heads));
	if (!buf)
		return KVT_ENOMEM;
	float *h = buf;         /* [n][d] residual stream */
	float *x = h + nd;      /* [n][d] normed input */
	float *q = x + nd;      /* [n][d] */
	float *att = q + nd;    /* [n][d] attention output (heads concat) */
	float *k = att + nd;    /* [n][kv] */
	float *v = k + nkv;     /* [n][kv] */
	float *hb = v + nkv;    /* [n][hid] */
	float *hb2 = hb + nh;   /* [n][hid] */
	float *tmp = hb2 + nh;  /* [n][d] */
	float *lse = tmp + nd;  /* [n][n_heads] */
	int rc = 0;

	for (uint32_t t = 0; t < n; t++)
		memcpy(h + (size_t)t * d, m->tok_emb + (size_t)tokens[t] * d,
		       d * sizeof(float));
	for (uint32_t l = 0; l < c->n_layers; l++) {
		model_rmsnorm(x, h, m->rms_att + (size_t)l * d, n, d,
		              c->rms_eps);
		model_matmul(q, x, m->wq + (size_t)l * d * d, n, d, d);
		model_matmul(k, x, m->wk + (size_t)l * kv * d, n, d, kv);
		model_matmul(v, x, m->wv + (size_t)l * kv * d, n, d, kv);
		for (uint32_t t = 0; t < n; t++) {
			uint32_t p = pos ? pos[t] : pos0 + t;
			model_rope(q + (size_t)t * d, c->n_heads, hd, p,
			           c->rope_theta);
			model_rope(k + (size_t)t * kv, c->n_kv_heads, hd, p,
			           c->rope_theta);
		}
		rc = a->attend(a->ctx, l, pos0, n, x, q, k, v, att, lse);
		if (rc)
			goto out;
		model_matmul(tmp, att, m->wo + (size_t)l * d * d, n, d, d);
		for (size_t i = 0; i < nd; i++)
			h[i] += tmp[i];
		model_rmsnorm(x, h, m->rms_ffn + (size_t)l * d, n, d,
		              c->rms_eps);
		model_matmul(hb, x, m->w1 + (size_t)l * hid * d, n, d, hid);
		model_matmul(hb2, x, m->w3 + (size_t)l * hid * d, n, d, hid);
		for (size_t i = 0; i < nh; i++) {
			float z = hb[i];
			z *= 1.0f / (1.0f + expf(-z));
			hb[i] = z * hb2[i];
		}
		model_matmul(tmp, hb, m->w2 + (size_t)l * d * hid, n, hid, d);
		for (size_t i = 0; i < nd; i++)
			h[i] += tmp[i];
	}
	if (logits) {
		model_rmsnorm(x, h, m->rms_final, n, d, c->rms_eps);
		model_matmul(logits, x, m->wcls, n, d, c->vocab_size);
	}
out:
	free(buf);
	return rc;
}

int model_forward(const struct model *m, const int32_t *tokens, uint32_t n,
                  uint32_t pos0, const struct model_attn *a, float *logits)
{
	return forward(m, tokens, n, pos0, NULL, a, logits);
}

int model_forward_pos(const struct model *m, const int32_t *tokens,
                      uint32_t n, const uint32_t *pos,
                      const struct model_attn *a, float *logits)
{
	return forward(m, tokens, n, n ? pos[0] : 0, pos, a, logits);
}

/* ---------------------------------------------------------------- dense */

int model_dense_init(struct model_dense *dn, const struct model *m,
                     uint32_t cap, int record_maps)
{
	const struct model_config *c = &m->cfg;
	memset(dn, 0, sizeof(*dn));
	dn->m = m;
	dn->cap = cap;
	size_t kvn = (size_t)c->n_layers * c->kv_dim * cap;
	dn->k = malloc(kvn * sizeof(float));
	dn->v = malloc(kvn * sizeof(float));
	dn->scratch = malloc((cap ? cap : 1) * sizeof(float));
	if (record_maps) {
		dn->maps = calloc((size_t)c->n_layers * c->n_heads * cap * cap,
		                  sizeof(float));
		dn->xs = calloc((size_t)c->n_layers * cap * c->dim,
		                sizeof(float));
	}
	if (!dn->k || !dn->v || !dn->scratch ||
	    (record_maps && (!dn->maps || !dn->xs))) {
		model_dense_free(dn);
		return KVT_ENOMEM;
	}
	return 0;
}

void model_dense_free(struct model_dense *dn)
{
	free(dn->k);
	free(dn->v);
	free(dn->maps);
	free(dn->xs);
	free(dn->scratch);
	memset(dn, 0, sizeof(*dn));
}

/*
 * Plain causal attention over the contiguous cache: the new tokens' K/V
 * are stored first, so token c sees positions 0..pos0+c.  The softmax is
 * paged_attention_cpu's own (paged_attention_softmax_cpu), so the dense
 * reference and the paged engine differ only where their data do.
 */
static int dense_attend(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n,
                        const float *x, const float *q, const float *k,
                        const float *v, float *out, float *lse)
{
	struct model_dense *dn = ctx;
	const struct model_config *c = &dn->m->cfg;
	const uint32_t hd = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads,
	               G = H / Hkv, cap = dn->cap;
	const float scale = 1.0f / sqrtf((float)hd);
	for (uint32_t t = 0; t < n; t++)
		for (uint32_t g = 0; g < Hkv; g++) {
			size_t at = (((size_t)layer * Hkv + g) * cap + pos0 + t) *
			            hd;
			memcpy(dn->k + at, k + ((size_t)t * Hkv + g) * hd,
			       hd * sizeof(float));
			memcpy(dn->v + at, v + ((size_t)t * Hkv + g) * hd,
			       hd * sizeof(float));
		}
	if (dn->xs)
		memcpy(dn->xs + ((size_t)layer * cap + pos0) * c->dim, x,
		       (size_t)n * c->dim * sizeof(float));
	float *s = dn->scratch;
	for (uint32_t t = 0; t < n; t++) {
		uint32_t p = pos0 + t;
		for (uint32_t h = 0; h < H; h++) {
			uint32_t g = h / G;
			const float *qh = q + ((size_t)t * H + h) * hd;
			const float *kb = dn->k + ((size_t)layer * Hkv + g) *
			                                  cap * hd;
			const float *vb = dn->v + ((size_t)layer * Hkv + g) *
			                                  cap * hd;
			for (uint32_t i = 0; i <= p; i++) {
				float dot = 0.0f;
				for (uint32_t j = 0; j < hd; j++)
					dot += qh[j] * kb[(size_t)i * hd + j];
				s[i] = dot * scale;
			}
			lse[(size_t)t * H + h] =
				paged_attention_softmax_cpu(s, p + 1);
			float *o = out + ((size_t)t * H + h) * hd;
			memset(o, 0, hd * sizeof(float));
			for (uint32_t i = 0; i <= p; i++)
				for (uint32_t j = 0; j < hd; j++)
					o[j] += s[i] * vb[(size_t)i * hd + j];
			if (dn->maps)
				memcpy(dn->maps + (((size_t)layer * H + h) * cap +
				                   p) * cap,
				       s, (p + 1) * sizeof(float));
		}
	}
	return 0;
}

int model_dense_step(struct model_dense *dn, const int32_t *tokens,
                     uint32_t n, float *logits)
{
	if ((uint64_t)dn->len + n > dn->cap)
		return KVT_ETOOLONG;
	struct model_attn a = {dense_attend, dn};
	int rc = model_forward(dn->m, tokens, n, dn->len, &a, logits);
	if (rc == 0)
		dn->len += n;
	return rc;
}

int model_dense_forward(const struct model *m, const int32_t *tokens,
                        uint32_t T, float *logits)
{
	struct model_dense dn;
	int rc = model_dense_init(&dn, m, T, 0);
	if (rc)
		return rc;
	rc = model_dense_step(&dn, tokens, T, logits);
	model_dense_free(&dn);
	return rc;
}
