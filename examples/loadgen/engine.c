/*
 * engine.c — one engine process of kvtrim-loadgen: registers its tenant,
 * opens its sequences, appends one token per step to every list (the
 * pattern, then the staged inputs a policy reads) and syncs every
 * --sync-every steps, verifying after each sync when asked.  Device pages
 * are read and written through kvt_memcpy (see main.c).
 */
#include "loadgen.h"

#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels.h"
#include "policy.h"

void engine_say(const struct engine *e, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "loadgen[%u]: ", e->client);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/*
 * Host-readable pointers to the n pages ids[] (a list's page ids) in row r
 * of e->pv, returned in *out; an unmapped id gives NULL.  On host pages
 * these are the pages themselves.  On device pages they are copies in row
 * r of e->hp, made with one kvt_memcpy per run of consecutive ids in one
 * chunk (adjacent in memory), since each call waits for the stream; the
 * copies hold what the pages held when this ran.  0, or an error (said).
 */
int engine_pages_view(struct engine *e, uint32_t r, const uint32_t *ids,
                      uint32_t n, void ***out)
{
	void **pv = e->pv + (size_t)r * e->mp;
	if (n > e->mp) {
		engine_say(e, "a list of %u pages, at most %u expected", n,
		           e->mp);
		return KVT_EPROTO;
	}
	for (uint32_t p = 0; p < n; p++)
		pv[p] = kvt_page_ptr(e->c, ids[p]);
	*out = pv;
	if (!e->dev)
		return 0;
	size_t pb = e->page_bytes;
	uint32_t per_chunk = (uint32_t)(KVT_CHUNK_BYTES / pb);
	uint8_t *buf = e->hp + (size_t)r * e->mp * pb;
	for (uint32_t p = 0, q; p < n; p = q) {
		q = p + 1;
		if (!pv[p])
			continue;
		while (q < n && pv[q] && ids[q] == ids[q - 1] + 1 &&
		       ids[q] / per_chunk == ids[p] / per_chunk)
			q++;
		int rc = kvt_memcpy(e->c, buf + p * pb, pv[p], (q - p) * pb);
		if (rc < 0) {
			engine_say(e, "kvt_memcpy of %u pages to the host: %s "
			           "(%s)", q - p, kvt_strerror(rc),
			           kvt_last_error(e->c));
			return rc;
		}
		for (uint32_t i = p; i < q; i++)
			pv[i] = buf + i * pb;
	}
	return 0;
}

/* Host-readable page pointers of a list (pages_view row 0) into *pv; its
 * length in *len. */
static int list_pages(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                      void ***pv, uint32_t *len)
{
	struct kvt_list list;
	int rc = kvt_list_get(e->c, e->seqs[j], l, h, &list);
	if (rc < 0 ||
	    (rc = engine_pages_view(e, 0, list.pages, list.n_pages, pv)) < 0)
		return rc;
	for (uint32_t p = 0; p < list.n_pages; p++)
		if (!(*pv)[p])
			return KVT_EINVAL;
	*len = list.len;
	return 0;
}

/* Writes K/V of (tag, pos) at kvt_kv_ptr's kp and vp: in place on host
 * pages, else built in e->wrow and copied (2 kvt_memcpy). */
static int put_entry(struct engine *e, void *kp, void *vp, uint32_t tag,
                     uint32_t pos)
{
	const struct opts *o = e->o;
	if (!e->dev) {
		pattern_write_entry(e->bmix, kp, vp, e->row_bytes, tag, pos,
		                    o->head_dim, o->dtype, e->kf);
		return 0;
	}
	uint8_t *k = e->wrow, *v = e->wrow + e->row_bytes;
	pattern_write_entry(e->bmix, k, v, e->row_bytes, tag, pos, o->head_dim,
	                    o->dtype, e->kf);
	int rc = kvt_memcpy(e->c, kp, k, e->row_bytes);
	if (rc == 0)
		rc = kvt_memcpy(e->c, vp, v, e->row_bytes);
	if (rc < 0)
		engine_say(e, "kvt_memcpy of an entry to the device: %s (%s)",
		           kvt_strerror(rc), kvt_last_error(e->c));
	return rc;
}

float *engine_shadow(struct engine *e, uint32_t j, uint32_t l, uint32_t pos)
{
	return e->shadow + (((size_t)j * e->o->layers + l) * e->stage_tokens +
	                    pos % e->stage_tokens) * e->sfloats;
}

/*
 * Writes K/V of position pos for every list of every sequence at k, then
 * the staged inputs: x and q pseudo-random, lse the true log-sum-exp of
 * each query head over its KV head's list with the k + 1 new entries
 * appended so far (what the engine's attention computed).
 */
static int append_step(struct engine *e, uint32_t pos, uint32_t k)
{
	const struct opts *o = e->o;
	uint32_t G = o->heads / o->kv_heads;
	for (uint32_t j = 0; j < o->seqs; j++) {
		for (uint32_t l = 0; l < o->layers; l++) {
			for (uint32_t h = 0; h < o->kv_heads; h++) {
				void *kp, *vp;
				int rc = kvt_kv_ptr(e->c, e->seqs[j], l, h, k,
				                    &kp, &vp);
				if (rc < 0) {
					engine_say(e, "kvt_kv_ptr(seq %u, "
					           "layer %u, head %u, k %u): "
					           "%s", j, l, h, k,
					           kvt_strerror(rc));
					return rc;
				}
				uint32_t tag = pattern_tag(o->seed, e->client,
				                           j, l, h);
				if ((rc = put_entry(e, kp, vp, tag, pos)) < 0)
					return rc;
			}
			if (!e->stage)
				continue;
			/* Made whole here (lse needs q), staged in the
			 * parts the policy reads (the others are NULL). */
			uint32_t nx = o->heads * o->head_dim;
			float *x = e->gen, *q = x + nx, *lse = q + nx;
			float *sx = kvt_stage_x(e->c, e->seqs[j], l, pos);
			float *sq = kvt_stage_q(e->c, e->seqs[j], l, pos);
			float *sl = kvt_stage_lse(e->c, e->seqs[j], l, pos);
			if (!sx && !sq && !sl) {
				engine_say(e, "no staging entry for seq %u "
				           "layer %u", j, l);
				return KVT_EINVAL;
			}
			uint64_t base = pattern_mix(o->seed ^
			                            ((uint64_t)pos << 20) ^
			                            ((uint64_t)j << 8) ^ l);
			for (uint32_t i = 0; i < nx; i++) {
				x[i] = (float)(pattern_mix(base + i) & 0xffff) /
				               65536.0f - 0.5f;
				/* queries a bit larger than keys, so attention
				 * is far from uniform */
				q[i] = ((float)(pattern_mix(~base + i) &
				                0xffff) / 65536.0f - 0.5f) * 6.0f;
			}
			for (uint32_t h = 0; h < o->kv_heads; h++) {
				uint32_t len;
				void **pv;
				int rc = list_pages(e, j, l, h, &pv, &len);
				if (rc < 0) {
					engine_say(e, "list of seq %u layer "
					           "%u head %u: %s", j, l, h,
					           kvt_strerror(rc));
					return rc;
				}
				float out[64 * 1024 / sizeof(float)];
				float *ob = (size_t)G * o->head_dim <=
				                    sizeof(out) / sizeof(float)
				            ? out
				            : NULL;
				if (!ob)
					return KVT_EINVAL;
				paged_attention_cpu(q + (size_t)h * G * o->head_dim,
				                    G, pv, e->page_tokens,
				                    o->head_dim, o->dtype,
				                    len + k + 1,
				                    1.0f / sqrtf((float)o->head_dim),
				                    ob, lse + (size_t)h * G, e->att);
			}
			/* The parts are contiguous in the entry, which starts
			 * at the first of them: one copy (kvt_memcpy: device
			 * memory on a cuda tenant), and the replay's copy. */
			float *row = engine_shadow(e, j, l, pos), *w = row;
			if (sx)
				memcpy(w, x, nx * sizeof(float)), w += nx;
			if (sq)
				memcpy(w, q, nx * sizeof(float)), w += nx;
			if (sl)
				memcpy(w, lse, o->heads * sizeof(float));
			int rc = kvt_memcpy(e->c, sx ? sx : sq ? sq : sl, row,
			                e->sfloats * sizeof(float));
			if (rc < 0) {
				engine_say(e, "kvt_memcpy of staged inputs: %s (%s)",
				           kvt_strerror(rc), kvt_last_error(e->c));
				return rc;
			}
		}
	}
	return 0;
}

/*
 * Before retry k (from 0) of a request the full pool refused, begun at t0:
 * sleeps 5 ms doubling to 320 ms, plus jitter so refused engines do not
 * come back in step.  0 to retry; KVT_EPOOLFULL without --retry-full or
 * once 120 s have passed.
 */
static int full_backoff(struct engine *e, uint32_t k, double t0)
{
	if (!e->o->retry_full || report_now_s() - t0 > 120.0)
		return KVT_EPOOLFULL;
	uint32_t ms = 5u << (k < 6 ? k : 6);
	ms += (uint32_t)(pattern_mix(((uint64_t)e->client << 32) ^ k ^
	                             (uint64_t)(t0 * 1e6)) % ms);
	usleep(ms * 1000u);
	e->r.full_retries++;
	return 0;
}

/*
 * After kvt_connect: the page pointer rows (as many pages as a list can
 * hold under the limits in force) and, on device pages, the host copies
 * and the write buffer.  0 or KVT_ENOMEM (said).
 */
static int engine_buffers(struct engine *e, const struct kvt_config *in_force)
{
	const struct opts *o = e->o;
	int kind = kvt_memory_kind(e->c);
	uint32_t rows = o->kv_heads; /* at most 64 (engine_main) */
	e->r.memory = kind;
	e->dev = kind == KVT_MEMORY_CUDA;
	e->mp = (uint32_t)(((uint64_t)in_force->max_tokens +
	                    in_force->headroom + e->page_tokens - 1) /
	                   e->page_tokens);
	e->pv = calloc((size_t)rows * e->mp, sizeof(void *));
	if (!e->pv)
		goto oom;
	if (!e->dev)
		return 0;
	/* Pages are read only to verify or for the lse of staged inputs;
	 * the replay holds one row per KV head, everything else row 0. */
	e->page_bytes = 2 * (size_t)e->page_tokens * e->row_bytes;
	e->hp_rows = e->replay ? rows : e->model || e->stage ? 1 : 0;
	e->wrow = malloc(2 * e->row_bytes);
	if (e->hp_rows)
		e->hp = malloc((size_t)e->hp_rows * e->mp * e->page_bytes);
	if (!e->wrow || (e->hp_rows && !e->hp))
		goto oom;
	return 0;
oom:
	engine_say(e, "out of memory for page buffers");
	return KVT_ENOMEM;
}

/* Registers the tenant "NAME-CLIENT[.GEN]" with the geometry and policy of
 * the options, into e->c; 0, or an error (said) with e->c unset. */
static int engine_connect(struct engine *e)
{
	const struct opts *o = e->o;
	uint32_t headroom = options_headroom(o);
	char name[KVT_NAME_MAX];
	if (e->r.gen)
		snprintf(name, sizeof(name), "%s-%u.%u", o->name, e->client,
		         e->r.gen);
	else
		snprintf(name, sizeof(name), "%s-%u", o->name, e->client);
	struct kvt_config cfg = {
		.runtime_dir = o->dir,
		.tenant = name,
		.geo = { .n_layers = o->layers, .n_heads = o->heads,
		         .n_kv_heads = o->kv_heads, .head_dim = o->head_dim,
		         .d_model = o->heads * o->head_dim },
		.dtype = o->dtype,
		.page_tokens = o->page_tokens,
		.max_seqs = o->seqs,
		.max_tokens = o->steps + headroom,
		.headroom = headroom,
		.stage_tokens = e->stage_tokens,
		.policy = o->policy,
		.quota_bytes = o->quota,
	};
	char err[KVT_ERRTEXT_MAX];
	int rc = kvt_connect(&cfg, &e->c, err);
	if (rc < 0)
		engine_say(e, "kvt_connect: %s (%s)", kvt_strerror(rc), err);
	return rc;
}

/* Opens the o->seqs sequences into e->seqs, retrying while the pool is
 * full (full_backoff); *opened counts those open, also on failure.  0, or
 * an error (said). */
static int open_seqs(struct engine *e, uint32_t *opened)
{
	const struct opts *o = e->o;
	int rc = 0;
	for (; *opened < o->seqs; (*opened)++) {
		double t0 = report_now_s();
		for (uint32_t k = 0;; k++) {
			rc = kvt_seq_open(e->c, &e->seqs[*opened]);
			if (rc != KVT_EPOOLFULL || full_backoff(e, k, t0))
				break;
		}
		if (rc < 0) {
			engine_say(e, "kvt_seq_open: %s (%s)", kvt_strerror(rc),
			           kvt_last_error(e->c));
			return rc;
		}
	}
	return rc;
}

/*
 * Syncs the n tokens appended to every sequence since the last sync, the
 * last of them at step s, through items[o->seqs]; the replay decides first
 * what its shadows evict.  Retries while the pool is full, records the
 * latency and counts the sync in e->r.  0, or an error (said).
 */
static int sync_all(struct engine *e, struct kvt_sync_item *items, uint32_t n,
                    uint32_t s)
{
	const struct opts *o = e->o;
	enum kvt_phase phase = s < o->prefill ? KVT_PHASE_PREFILL
	                                      : KVT_PHASE_DECODE;
	int rc;
	if (e->replay && (rc = replay_decide(e, n, s + 1, phase)) < 0)
		return rc;
	for (uint32_t j = 0; j < o->seqs; j++)
		items[j] = (struct kvt_sync_item){
			.seq = e->seqs[j], .n_new = n, .phase = phase,
		};
	/* Nothing changed on a refused sync (kvtrim.h), so the same items go
	 * again; the replay's decisions stand. */
	double t0 = report_now_s();
	for (uint32_t k = 0;; k++) {
		rc = kvt_sync(e->c, items, o->seqs);
		if (rc != KVT_EPOOLFULL || full_backoff(e, k, t0))
			break;
	}
	e->r.lat[report_lat_bucket((report_now_s() - t0) * 1e6)]++;
	if (rc < 0) {
		engine_say(e, "kvt_sync at step %u: %s (%s)", s,
		           kvt_strerror(rc), kvt_last_error(e->c));
		return rc;
	}
	e->r.syncs++;
	e->r.appended += (uint64_t)n * o->seqs * o->layers * o->kv_heads;
	return rc;
}

/*
 * After a sync of n tokens that brought every list to n_seen: checks each
 * list against the replay's shadow (then commits the shadow) or the
 * model's positions, when verifying.  Mismatches are counted in e->r; 0,
 * or the first error (said).
 */
static int verify_after_sync(struct engine *e, uint32_t n, uint32_t n_seen)
{
	const struct opts *o = e->o;
	int rc = 0;
	if (e->replay) {
		for (uint32_t j = 0; j < o->seqs && rc == 0; j++)
			for (uint32_t l = 0; l < o->layers && rc == 0; l++)
				for (uint32_t h = 0; h < o->kv_heads && rc == 0;
				     h++) {
					replay_want(e, j, l, h, n, n_seen);
					rc = verify_list(e, j, l, h, n_seen,
					                 e->want);
					replay_commit(e, j, l, h, n);
				}
		return rc;
	}
	if (!e->model)
		return 0;
	model_advance(e->alive, &e->alive_seen, e->model, n_seen);
	for (uint32_t j = 0; j < o->seqs && rc == 0; j++)
		for (uint32_t l = 0; l < o->layers && rc == 0; l++)
			for (uint32_t h = 0; h < o->kv_heads && rc == 0; h++)
				rc = verify_list(e, j, l, h, n_seen, e->alive);
	return rc;
}

/*
 * The o->steps steps: one token appended to every list per step, a sync
 * (items: [o->seqs] scratch) every --sync-every steps, at the end of the
 * prefill and at the last step, each verified when asked.  --kill-after
 * kills the first generation of client 0 at its step.  0, or the first
 * error (said); the steps stop there.
 */
static int run_steps(struct engine *e, struct kvt_sync_item *items)
{
	const struct opts *o = e->o;
	uint32_t pending = 0;
	int rc = 0;
	for (uint32_t s = 0; s < o->steps; s++) {
		if (o->kill_after && e->client == 0 && !e->r.gen &&
		    s == o->kill_after)
			raise(SIGKILL);
		if (o->step_us)
			usleep(o->step_us);
		if ((rc = append_step(e, s, pending)) < 0)
			break;
		pending++;
		if (pending < o->sync_every && s + 1 < o->steps &&
		    s + 1 != o->prefill)
			continue;
		if ((rc = sync_all(e, items, pending, s)) < 0)
			break;
		uint32_t n = pending;
		pending = 0;
		if ((rc = verify_after_sync(e, n, s + 1)) < 0)
			break;
	}
	return rc;
}

/* Adds to e->r.kept the entries every list of the first opened sequences
 * keeps; a list that cannot be read counts none. */
static void count_kept(struct engine *e, uint32_t opened)
{
	const struct opts *o = e->o;
	for (uint32_t j = 0; j < opened; j++)
		for (uint32_t l = 0; l < o->layers; l++)
			for (uint32_t h = 0; h < o->kv_heads; h++) {
				struct kvt_list list;
				if (kvt_list_get(e->c, e->seqs[j], l, h,
				                 &list) == 0)
					e->r.kept += list.len;
			}
}

/* Closes the first opened sequences and disconnects (e->c NULL after);
 * returns rc, or the first close error (said) when rc is 0. */
static int engine_close(struct engine *e, uint32_t opened, int rc)
{
	for (uint32_t j = 0; j < opened; j++) {
		int crc = kvt_seq_close(e->c, e->seqs[j]);
		if (crc < 0 && rc == 0) {
			engine_say(e, "kvt_seq_close: %s (%s)",
			           kvt_strerror(crc), kvt_last_error(e->c));
			rc = crc;
		}
	}
	kvt_disconnect(e->c);
	e->c = NULL;
	return rc;
}

/* One generation of the engine: connect, open, run the steps, count what
 * is kept, close.  0, or the first error (said). */
static int engine_run(struct engine *e)
{
	const struct opts *o = e->o;
	struct kvt_sync_item *items = NULL; /* [o->seqs] */
	uint32_t opened = 0;
	int rc = engine_connect(e);
	if (rc < 0)
		return rc;
	const struct kvt_config *in_force = kvt_config_of(e->c);
	e->page_tokens = in_force->page_tokens;
	if (in_force->headroom < o->sync_every) {
		engine_say(e, "kvtrimd granted headroom %u < --sync-every %u",
		           in_force->headroom, o->sync_every);
		rc = KVT_EHEADROOM;
		goto out;
	}
	if ((rc = engine_buffers(e, in_force)) < 0 ||
	    (rc = open_seqs(e, &opened)) < 0)
		goto out;
	if (!(items = calloc(o->seqs, sizeof(*items)))) {
		rc = KVT_ENOMEM;
		goto out;
	}
	rc = run_steps(e, items);
	if (o->kill_after && e->client == 0 && !e->r.gen &&
	    o->steps == o->kill_after)
		raise(SIGKILL);
	/* Kept entries also after a failed sync: nothing changed then. */
	count_kept(e, opened);
out:
	free(items);
	return engine_close(e, opened, rc);
}

int engine_main(const struct opts *o, const struct model *m, int has_model,
                uint32_t client, uint32_t gen, int wfd)
{
	struct engine e = {
		.o = o,
		.model = o->verify && has_model ? m : NULL,
		.replay = o->verify && !has_model,
		.client = client,
		.row_bytes = (size_t)o->head_dim * kvt_dtype_size(o->dtype),
		.page_tokens = o->page_tokens,
	};
	e.r.client = client;
	e.r.gen = gen;
	e.r.memory = -1;
	uint32_t headroom = options_headroom(o);
	e.stage = !!(o->pol->ops->needs & POLICY_NEED_STAGED);
	e.stage_tokens = e.stage ? headroom + o->pol->lookback : 0;
	e.cap = o->steps + headroom;
	size_t lists = (size_t)o->seqs * o->layers * o->kv_heads;
	uint32_t G = o->heads / o->kv_heads;
	uint32_t ef = o->pol->entry_floats;
	size_t sb = o->pol->layer_state_bytes;
	e.seqs = calloc(o->seqs, sizeof(*e.seqs));
	e.seen = calloc(o->steps, 1);
	e.alive = calloc(o->steps, 1);
	e.bmix = pattern_bmix_init(e.row_bytes);
	e.kf = calloc(o->head_dim, sizeof(float));
	e.kb = calloc(e.row_bytes, 1);
	e.att = calloc((size_t)e.cap * G + 1, sizeof(float));
	e.want = calloc(o->steps, 1);
	e.moves = calloc((size_t)e.cap * 2, sizeof(uint32_t));
	e.gen = calloc(2 * (size_t)o->heads * o->head_dim + o->heads,
	               sizeof(float));
	uint32_t in = policy_inputs_of(o->pol->ops->needs);
	e.sfloats = (in & KVT_INPUT_X ? o->heads * o->head_dim : 0) +
	            (in & KVT_INPUT_Q ? o->heads * o->head_dim : 0) +
	            (in & KVT_INPUT_LSE ? o->heads : 0);
	e.shadow = calloc((size_t)o->seqs * o->layers * e.stage_tokens *
	                  e.sfloats + 1, sizeof(float));
	e.in = calloc((size_t)headroom * (2 * o->heads * o->head_dim + o->heads),
	              sizeof(float));
	e.sh_len = calloc(lists, sizeof(uint32_t));
	e.sh_pos = calloc(lists * e.cap, sizeof(uint32_t));
	e.sh_ent = calloc(lists * e.cap * ef + 1, sizeof(float));
	e.sh_drop = calloc(lists * e.cap, 1);
	e.sh_state = calloc((size_t)o->seqs * o->layers * sb + 1, 1);
	int rc = KVT_ENOMEM;
	if (o->kv_heads > 64)
		engine_say(&e, "at most 64 KV heads");
	else if (e.seqs && e.seen && e.alive && e.bmix && e.kf && e.kb &&
	         e.att && e.want && e.moves && e.in && e.gen && e.shadow &&
	         e.sh_len &&
	         e.sh_pos && e.sh_ent && e.sh_drop && e.sh_state)
		rc = engine_run(&e);
	else
		engine_say(&e, "out of memory");
	e.r.status = rc < 0 ? 2 : e.r.mismatches ? 1 : 0;
	free(e.shadow);
	free(e.seqs);
	free(e.seen);
	free(e.alive);
	free(e.bmix);
	free(e.kf);
	free(e.kb);
	free(e.att);
	free(e.pv);
	free(e.hp);
	free(e.wrow);
	free(e.want);
	free(e.moves);
	free(e.in);
	free(e.gen);
	free(e.sh_len);
	free(e.sh_pos);
	free(e.sh_ent);
	free(e.sh_drop);
	free(e.sh_state);
	ssize_t w = write(wfd, &e.r, sizeof(e.r));
	close(wfd);
	if (w != (ssize_t)sizeof(e.r))
		return 2;
	return e.r.status;
}
