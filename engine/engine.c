/*
 * engine.c — model forward with the KV cache in kvtrimd; see engine.h for
 * the protocol and the causal-chunk design.
 */
#include "engine.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

struct engine {
	const struct model *m;
	kvt_client *c;
	uint32_t batch;        /* sequences */
	kvt_seq *seq;          /* [batch] */
	uint8_t *seq_open;     /* [batch] */
	uint32_t *pos;         /* [batch] tokens fed (next original position) */
	uint32_t *bpos;        /* [batch] positions of a batched step */
	struct kvt_sync_item *items; /* [batch] one batched sync */
	uint32_t cur;          /* the sequence engine_attend serves */
	uint32_t chunk;        /* = headroom */
	enum kvt_dtype dtype;
	/* Cuda tenants: the pages are device memory and this engine computes
	 * on the host, so K/V rows go through kvt_memcpy, and kvt_attention
	 * (which takes device memory there) gets q, out and lse in device
	 * buffers that kvt_memcpy fills and empties (a test path: a GPU
	 * engine keeps them on the device). */
	int dev;
	uint8_t *row;          /* [2][head_dim * elem] one K and V row */
	float *dq, *dout;      /* [chunk][n_heads][head_dim] device */
	float *dlse;           /* [chunk][n_heads] device */
	char err[KVT_ERRTEXT_MAX + 64];
};

static int seterr(struct engine *e, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int seterr(struct engine *e, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->err, sizeof(e->err), fmt, ap);
	va_end(ap);
	return rc;
}

int engine_open(const struct model *m, const struct engine_opts *o,
                struct engine **out, char *err, size_t errlen)
{
	*out = NULL;
	const struct model_config *mc = &m->cfg;
	struct engine *e = calloc(1, sizeof(*e));
	if (!e) {
		snprintf(err, errlen, "out of memory");
		return KVT_ENOMEM;
	}
	e->m = m;
	e->batch = o->batch ? o->batch : 1;
	e->chunk = o->chunk ? o->chunk : 64;
	e->dtype = o->dtype;

	struct kvt_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	cfg.runtime_dir = o->runtime_dir;
	cfg.tenant = o->tenant ? o->tenant : "engine";
	cfg.geo = (struct kvt_geometry){mc->n_layers, mc->n_heads,
	                                mc->n_kv_heads, mc->head_dim, mc->dim};
	cfg.dtype = o->dtype;
	cfg.page_tokens = o->page_tokens ? o->page_tokens : 16;
	cfg.max_seqs = e->batch;
	cfg.max_tokens = o->context ? o->context : model_context(m);
	cfg.headroom = e->chunk;
	/* The ring covers the whole context of the llama2.c models (at most
	 * 512 positions, a few MB), so policies that look back at earlier
	 * staged rows (snapkv's window, delayed decisions) find them; longer
	 * contexts get ENGINE_STAGE_MAX rows (engine.h). */
	uint32_t ring = cfg.max_tokens < ENGINE_STAGE_MAX ? cfg.max_tokens
	                                                  : ENGINE_STAGE_MAX;
	cfg.stage_tokens = o->stage_tokens ? o->stage_tokens
	                   : ring > e->chunk ? ring : e->chunk;
	cfg.policy = o->policy ? o->policy : "full";
	cfg.quota_bytes = o->quota_bytes;
	cfg.timeout_ms = o->timeout_ms ? o->timeout_ms : 10000;

	char etext[KVT_ERRTEXT_MAX] = "";
	int rc = kvt_connect(&cfg, &e->c, etext);
	if (rc < 0) {
		snprintf(err, errlen, "kvt_connect: %s%s%s", kvt_strerror(rc),
		         etext[0] ? ": " : "", etext);
		free(e);
		return rc;
	}
	const struct kvt_config *reg = kvt_config_of(e->c);
	e->chunk = reg->headroom < e->chunk ? reg->headroom : e->chunk;
	e->seq = calloc(e->batch, sizeof(*e->seq));
	e->seq_open = calloc(e->batch, 1);
	e->pos = calloc(e->batch, sizeof(*e->pos));
	e->bpos = calloc(e->batch, sizeof(*e->bpos));
	e->items = calloc(e->batch, sizeof(*e->items));
	e->dev = kvt_memory_kind(e->c) == KVT_MEMORY_CUDA;
	if (e->dev)
		e->row = malloc(2 * (size_t)mc->head_dim *
		                kvt_dtype_size(e->dtype));
	if (!e->seq || !e->seq_open || !e->pos || !e->bpos || !e->items ||
	    (e->dev && !e->row)) {
		snprintf(err, errlen, "out of memory");
		engine_close(e);
		return KVT_ENOMEM;
	}
	if (e->dev) {
		/* A step attends at most chunk tokens of one sequence (a
		 * batched step one token per sequence, one at a time). */
		size_t qb = (size_t)e->chunk * mc->n_heads * mc->head_dim *
		            sizeof(float);
		if ((rc = kvt_buffer_alloc(e->c, qb, (void **)&e->dq)) < 0 ||
		    (rc = kvt_buffer_alloc(e->c, qb, (void **)&e->dout)) < 0 ||
		    (rc = kvt_buffer_alloc(e->c, (size_t)e->chunk *
		                           mc->n_heads * sizeof(float),
		                           (void **)&e->dlse)) < 0) {
			snprintf(err, errlen, "kvt_buffer_alloc: %s: %s",
			         kvt_strerror(rc), kvt_last_error(e->c));
			engine_close(e);
			return rc;
		}
	}
	for (uint32_t s = 0; s < e->batch; s++) {
		rc = kvt_seq_open(e->c, &e->seq[s]);
		if (rc < 0) {
			snprintf(err, errlen, "kvt_seq_open (sequence %u of %u): "
			         "%s: %s", s, e->batch, kvt_strerror(rc),
			         kvt_last_error(e->c));
			engine_close(e);
			return rc;
		}
		e->seq_open[s] = 1;
	}
	*out = e;
	return 0;
}

void engine_close(struct engine *e)
{
	if (!e)
		return;
	for (uint32_t s = 0; e->seq_open && s < e->batch; s++)
		if (e->seq_open[s])
			kvt_seq_close(e->c, e->seq[s]);
	kvt_buffer_free(e->c, e->dq);
	kvt_buffer_free(e->c, e->dout);
	kvt_buffer_free(e->c, e->dlse);
	kvt_disconnect(e->c);
	free(e->seq);
	free(e->seq_open);
	free(e->pos);
	free(e->bpos);
	free(e->items);
	free(e->row);
	free(e);
}

int engine_reset(struct engine *e)
{
	e->err[0] = 0;
	for (uint32_t s = 0; s < e->batch; s++) {
		if (e->seq_open[s]) {
			kvt_seq_close(e->c, e->seq[s]);
			e->seq_open[s] = 0;
		}
		e->pos[s] = 0;
	}
	for (uint32_t s = 0; s < e->batch; s++) {
		int rc = kvt_seq_open(e->c, &e->seq[s]);
		if (rc < 0)
			return seterr(e, rc, "kvt_seq_open: %s: %s",
			              kvt_strerror(rc), kvt_last_error(e->c));
		e->seq_open[s] = 1;
	}
	return 0;
}

/* kvt_attention of the n tokens of seq in layer over host q, out, lse; on
 * a cuda tenant through the device buffers (kvt_memcpy waits for the
 * stream, so out and lse are in place when it returns). */
static int attend(struct engine *e, kvt_seq seq, uint32_t layer, uint32_t n,
                  const float *q, float *out, float *lse)
{
	const struct model_config *mc = &e->m->cfg;
	const size_t qb = (size_t)n * mc->n_heads * mc->head_dim *
	                  sizeof(float);
	const size_t lb = (size_t)n * mc->n_heads * sizeof(float);
	int rc;
	if (!e->dev)
		rc = kvt_attention(e->c, seq, layer, n, q, out, lse);
	else if ((rc = kvt_memcpy(e->c, e->dq, q, qb)) >= 0 &&
	         (rc = kvt_attention(e->c, seq, layer, n, e->dq, e->dout,
	                             e->dlse)) >= 0 &&
	         (rc = kvt_memcpy(e->c, out, e->dout, qb)) >= 0)
		rc = kvt_memcpy(e->c, lse, e->dlse, lb);
	if (rc < 0)
		return seterr(e, rc, "attention in layer %u: %s: %s", layer,
		              kvt_strerror(rc), kvt_last_error(e->c));
	return 0;
}

/*
 * Append, attend over pages, stage: the n tokens of sequence s at
 * positions pos0.. (the rows of x, q, k, v, out, lse given here are
 * theirs).
 */
static int attend_seq(struct engine *e, uint32_t s, uint32_t layer,
                      uint32_t pos0, uint32_t n, const float *x,
                      const float *q, const float *k, const float *v,
                      float *out, float *lse)
{
	const kvt_seq seq = e->seq[s];
	const struct model_config *mc = &e->m->cfg;
	const uint32_t hd = mc->head_dim, H = mc->n_heads,
	               Hkv = mc->n_kv_heads;
	int rc;

	for (uint32_t g = 0; g < Hkv; g++) {
		for (uint32_t t = 0; t < n; t++) {
			void *kp, *vp;
			rc = kvt_kv_ptr(e->c, seq, layer, g, t, &kp, &vp);
			if (rc < 0)
				return seterr(e, rc, "kvt_kv_ptr(layer %u, head "
				              "%u, +%u): %s", layer, g, t,
				              kvt_strerror(rc));
			size_t rb = (size_t)hd * kvt_dtype_size(e->dtype);
			void *kd = e->dev ? (void *)e->row : kp;
			void *vd = e->dev ? (void *)(e->row + rb) : vp;
			dtype_from_f32(k + ((size_t)t * Hkv + g) * hd, e->dtype,
			               kd, hd);
			dtype_from_f32(v + ((size_t)t * Hkv + g) * hd, e->dtype,
			               vd, hd);
			if (e->dev && ((rc = kvt_memcpy(e->c, kp, kd, rb)) < 0 ||
			               (rc = kvt_memcpy(e->c, vp, vd, rb)) < 0))
				return seterr(e, rc, "kvt_memcpy: %s",
				              kvt_last_error(e->c));
		}
	}
	if ((rc = attend(e, seq, layer, n, q, out, lse)) < 0)
		return rc;
	for (uint32_t t = 0; t < n; t++) {
		/* Each part only when the policy reads it (NULL otherwise,
		 * and for tenants without staging). */
		float *sx = kvt_stage_x(e->c, seq, layer, pos0 + t);
		float *sq = kvt_stage_q(e->c, seq, layer, pos0 + t);
		float *sl = kvt_stage_lse(e->c, seq, layer, pos0 + t);
		/* kvt_memcpy: device memory on a cuda tenant */
		if ((sx && (rc = kvt_memcpy(e->c, sx, x + (size_t)t * mc->dim,
		                            mc->dim * sizeof(float))) < 0) ||
		    (sq && (rc = kvt_memcpy(e->c, sq, q + (size_t)t * H * hd,
		                            (size_t)H * hd * sizeof(float))) < 0) ||
		    (sl && (rc = kvt_memcpy(e->c, sl, lse + (size_t)t * H,
		                            H * sizeof(float))) < 0))
			return seterr(e, rc, "staging (layer %u): %s", layer,
			              kvt_last_error(e->c));
	}
	return 0;
}

/* The model_attn callback of a step of one sequence (e->cur). */
static int engine_attend(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n,
                         const float *x, const float *q, const float *k,
                         const float *v, float *out, float *lse)
{
	struct engine *e = ctx;
	return attend_seq(e, e->cur, layer, pos0, n, x, q, k, v, out, lse);
}

/* The model_attn callback of a batched step: token row c is sequence c's
 * new token, at e->bpos[c] (the pos0 given is that of row 0). */
static int engine_attend_batch(void *ctx, uint32_t layer, uint32_t pos0,
                               uint32_t n, const float *x, const float *q,
                               const float *k, const float *v, float *out,
                               float *lse)
{
	struct engine *e = ctx;
	const struct model_config *mc = &e->m->cfg;
	const size_t H = mc->n_heads, hd = mc->head_dim, kv = mc->kv_dim;
	(void)pos0;
	for (uint32_t c = 0; c < n; c++) {
		int rc = attend_seq(e, c, layer, e->bpos[c], 1,
		                    x + (size_t)c * mc->dim, q + c * H * hd,
		                    k + c * kv, v + c * kv, out + c * H * hd,
		                    lse + c * H);
		if (rc)
			return rc;
	}
	return 0;
}

int engine_step_seq(struct engine *e, uint32_t s, const int32_t *tokens,
                    uint32_t n, enum kvt_phase phase, float *logits)
{
	e->err[0] = 0;
	if (s >= e->batch)
		return seterr(e, KVT_EINVAL, "sequence %u of a batch of %u", s,
		              e->batch);
	if (!e->seq_open[s])
		return seterr(e, KVT_ENOSEQ, "no open sequence");
	if (n == 0 || n > e->chunk)
		return seterr(e, KVT_EINVAL, "step of %u tokens (1..%u)", n,
		              e->chunk);
	e->cur = s;
	struct model_attn a = {engine_attend, e};
	int rc = model_forward(e->m, tokens, n, e->pos[s], &a, logits);
	if (rc < 0) {
		if (!e->err[0])
			seterr(e, rc, "forward: %s", kvt_strerror(rc));
		return rc;
	}
	struct kvt_sync_item it = {e->seq[s], n, (uint32_t)phase, 0, 0};
	rc = kvt_sync(e->c, &it, 1);
	if (rc < 0)
		return seterr(e, rc, "kvt_sync at position %u: %s: %s",
		              e->pos[s], kvt_strerror(rc), kvt_last_error(e->c));
	e->pos[s] += n;
	return 0;
}

int engine_step(struct engine *e, const int32_t *tokens, uint32_t n,
                enum kvt_phase phase, float *logits)
{
	return engine_step_seq(e, 0, tokens, n, phase, logits);
}

int engine_step_batch(struct engine *e, const int32_t *tokens,
                      enum kvt_phase phase, float *logits)
{
	e->err[0] = 0;
	for (uint32_t s = 0; s < e->batch; s++) {
		if (!e->seq_open[s])
			return seterr(e, KVT_ENOSEQ, "sequence %u is not open",
			              s);
		e->bpos[s] = e->pos[s];
		e->items[s] = (struct kvt_sync_item){e->seq[s], 1,
		                                     (uint32_t)phase, 0, 0};
	}
	struct model_attn a = {engine_attend_batch, e};
	int rc = model_forward_pos(e->m, tokens, e->batch, e->bpos, &a,
	                           logits);
	if (rc < 0) {
		if (!e->err[0])
			seterr(e, rc, "forward: %s", kvt_strerror(rc));
		return rc;
	}
	rc = kvt_sync(e->c, e->items, e->batch);
	if (rc < 0)
		return seterr(e, rc, "kvt_sync of a batch of %u: %s: %s",
		              e->batch, kvt_strerror(rc), kvt_last_error(e->c));
	for (uint32_t s = 0; s < e->batch; s++)
		e->pos[s]++;
	return 0;
}

int engine_feed_seq(struct engine *e, uint32_t s, const int32_t *tokens,
                    uint32_t n, enum kvt_phase phase, float *logits)
{
	uint32_t step = phase == KVT_PHASE_PREFILL ? e->chunk : 1;
	size_t V = e->m->cfg.vocab_size;
	for (uint32_t i = 0; i < n; i += step) {
		uint32_t k = n - i < step ? n - i : step;
		int rc = engine_step_seq(e, s, tokens + i, k, phase,
		                         logits ? logits + (size_t)i * V : NULL);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int engine_feed(struct engine *e, const int32_t *tokens, uint32_t n,
                enum kvt_phase phase, float *logits)
{
	return engine_feed_seq(e, 0, tokens, n, phase, logits);
}

void engine_seq_advance(struct engine *e, uint32_t s, uint32_t n)
{
	if (s < e->batch)
		e->pos[s] += n;
}

uint32_t engine_batch(const struct engine *e) { return e->batch; }
uint32_t engine_pos(const struct engine *e) { return e->pos[0]; }
uint32_t engine_pos_of(const struct engine *e, uint32_t s)
{
	return s < e->batch ? e->pos[s] : 0;
}
kvt_client *engine_client(const struct engine *e) { return e->c; }
kvt_seq engine_seq(const struct engine *e) { return e->seq[0]; }
kvt_seq engine_seq_of(const struct engine *e, uint32_t s)
{
	return s < e->batch ? e->seq[s] : 0;
}
const char *engine_error(const struct engine *e) { return e->err; }
