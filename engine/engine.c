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
	/* K and V of a step reach the pages in one kvt_write_kv per (sequence,
	 * layer), from the model's rows ([n][n_kv][head_dim]) or, for an f16 /
	 * bf16 tenant, from kvbuf after the conversion.  Cuda tenants: the
	 * pages are device memory and this engine computes on the host;
	 * kvt_write_kv and kvt_stage copy from host memory there too, and
	 * kvt_attention / kvt_attend (which take device memory there) get q,
	 * out and lse in device buffers that kvt_memcpy fills and empties (a
	 * test path: a GPU engine keeps them on the device). */
	int dev;
	uint8_t *kvbuf;        /* [2][rows][n_kv][head_dim] in dtype, or NULL
	                          for f32 */
	uint32_t rows;         /* max(chunk, batch): tokens of one step */
	float *dq, *dout;      /* [rows][n_heads][head_dim] device */
	float *dlse;           /* [rows][n_heads] device */
	struct kvt_attend_item *att; /* [batch] a batched step's attention */
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
	e->rows = e->chunk > e->batch ? e->chunk : e->batch;
	e->att = calloc(e->batch, sizeof(*e->att));
	if (e->dtype != KVT_DTYPE_F32)
		e->kvbuf = malloc(2 * (size_t)e->rows * mc->kv_dim *
		                  kvt_dtype_size(e->dtype));
	if (!e->seq || !e->seq_open || !e->pos || !e->bpos || !e->items ||
	    !e->att || (e->dtype != KVT_DTYPE_F32 && !e->kvbuf)) {
		snprintf(err, errlen, "out of memory");
		engine_close(e);
		return KVT_ENOMEM;
	}
	if (e->dev) {
		/* A step attends at most chunk tokens of one sequence, a
		 * batched step one token of each sequence. */
		size_t qb = (size_t)e->rows * mc->n_heads * mc->head_dim *
		            sizeof(float);
		if ((rc = kvt_buffer_alloc(e->c, qb, (void **)&e->dq)) < 0 ||
		    (rc = kvt_buffer_alloc(e->c, qb, (void **)&e->dout)) < 0 ||
		    (rc = kvt_buffer_alloc(e->c, (size_t)e->rows *
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
	free(e->att);
	free(e->kvbuf);
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

/*
 * kvt_attend of items[0..m) (host q, out, lse) as one call; on a cuda
 * tenant through the device buffers, whose rows the items' q / out / lse
 * occupy in order (kvt_memcpy waits for the stream, so out and lse are in
 * place when it returns).  The items' n sum to at most e->rows, and their
 * host rows are contiguous from items[0] on ([sum n][n_heads][head_dim]).
 */
static int attend(struct engine *e, struct kvt_attend_item *items,
                  uint32_t m, uint32_t layer)
{
	const struct model_config *mc = &e->m->cfg;
	const size_t H = mc->n_heads, hd = mc->head_dim;
	uint32_t rows = 0;
	for (uint32_t i = 0; i < m; i++)
		rows += items[i].n;
	const float *q = items[0].q;
	float *out = items[0].out, *lse = items[0].lse;
	int rc;
	if (!e->dev) {
		rc = kvt_attend(e->c, items, m);
	} else {
		size_t r = 0;
		for (uint32_t i = 0; i < m; i++) {
			items[i].q = e->dq + r * H * hd;
			items[i].out = e->dout + r * H * hd;
			items[i].lse = e->dlse + r * H;
			r += items[i].n;
		}
		if ((rc = kvt_memcpy(e->c, e->dq, q, rows * H * hd *
		                     sizeof(float))) >= 0 &&
		    (rc = kvt_attend(e->c, items, m)) >= 0 &&
		    (rc = kvt_memcpy(e->c, out, e->dout, rows * H * hd *
		                     sizeof(float))) >= 0)
			rc = kvt_memcpy(e->c, lse, e->dlse,
			                rows * H * sizeof(float));
	}
	if (rc < 0)
		return seterr(e, rc, "attention in layer %u: %s: %s", layer,
		              kvt_strerror(rc), kvt_last_error(e->c));
	return 0;
}

/* K and V of the n tokens of sequence s ([n][n_kv][head_dim] float32)
 * into entries len .. len + n - 1 of the layer's lists: one
 * kvt_write_kv, after the conversion to the tenant dtype. */
static int append(struct engine *e, uint32_t s, uint32_t layer, uint32_t n,
                  const float *k, const float *v)
{
	const struct model_config *mc = &e->m->cfg;
	const void *kd = k, *vd = v;
	if (e->kvbuf) {
		size_t cnt = (size_t)n * mc->kv_dim;
		uint8_t *kb = e->kvbuf,
		        *vb = e->kvbuf + cnt * kvt_dtype_size(e->dtype);
		dtype_from_f32(k, e->dtype, kb, cnt);
		dtype_from_f32(v, e->dtype, vb, cnt);
		kd = kb;
		vd = vb;
	}
	int rc = kvt_write_kv(e->c, e->seq[s], layer, 0, n, kd, vd,
	                      mc->kv_dim, mc->head_dim);
	if (rc < 0)
		return seterr(e, rc, "kvt_write_kv(layer %u, %u tokens): %s: "
		              "%s", layer, n, kvt_strerror(rc),
		              kvt_last_error(e->c));
	return 0;
}

/* Stages what the policy reads of the n tokens of sequence s at
 * positions pos0.. (kvt_stage copies only those inputs). */
static int stage(struct engine *e, uint32_t s, uint32_t layer, uint32_t pos0,
                 uint32_t n, const float *x, const float *q, const float *lse)
{
	int rc = kvt_stage(e->c, e->seq[s], layer, pos0, n, x, q, lse);
	if (rc < 0)
		return seterr(e, rc, "staging (layer %u): %s: %s", layer,
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
	struct kvt_attend_item it = {e->seq[s], layer, n, 0, q, out, lse};
	int rc;
	if ((rc = append(e, s, layer, n, k, v)) < 0 ||
	    (rc = attend(e, &it, 1, layer)) < 0)
		return rc;
	return stage(e, s, layer, pos0, n, x, q, lse);
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
 * new token, at e->bpos[c] (the pos0 given is that of row 0).  Every
 * sequence's K/V first, then one kvt_attend for all of them, then the
 * staging. */
static int engine_attend_batch(void *ctx, uint32_t layer, uint32_t pos0,
                               uint32_t n, const float *x, const float *q,
                               const float *k, const float *v, float *out,
                               float *lse)
{
	struct engine *e = ctx;
	const struct model_config *mc = &e->m->cfg;
	const size_t H = mc->n_heads, hd = mc->head_dim, kv = mc->kv_dim;
	int rc;
	(void)pos0;
	for (uint32_t c = 0; c < n; c++) {
		if ((rc = append(e, c, layer, 1, k + c * kv, v + c * kv)) < 0)
			return rc;
		e->att[c] = (struct kvt_attend_item){
			e->seq[c], layer, 1, 0, q + c * H * hd, out + c * H * hd,
			lse + c * H};
	}
	if ((rc = attend(e, e->att, n, layer)) < 0)
		return rc;
	for (uint32_t c = 0; c < n; c++)
		if ((rc = stage(e, c, layer, e->bpos[c], 1,
		                x + (size_t)c * mc->dim, q + c * H * hd,
		                lse + c * H)) < 0)
			return rc;
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
