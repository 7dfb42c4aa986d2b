/*
 * loadgen.c — kvtrim-loadgen: synthetic inference engines for kvtrimd.
 *
 * Forks N engine processes; each registers a tenant (PREFIX-i), opens M
 * sequences and for S steps appends one token to every sequence, writing K
 * and V of every (layer, KV head) through kvt_kv_ptr with a pattern that
 * encodes who wrote it and at which position:
 *
 *   K bytes 0..3  position (uint32 little-endian)
 *   K bytes 4..7  tag = hash(seed, client, sequence index, layer, head)
 *   other bytes   hash(tag, position, byte index, is_v) & 0xff
 *                 (K from byte 8 on, V from byte 0)
 *
 * so after any amount of compaction every surviving entry can be decoded
 * and checked byte for byte.  With --verify, after every sync the set of
 * positions in each list is compared with an independent model of the
 * policy written here (never the daemon's policy code): a bug shared by the
 * daemon and its checker cannot hide.
 *
 * Children report their counts through a pipe; the parent prints one
 * summary line and exits 0 only when every child succeeded (a child killed
 * on purpose with --kill-after-steps does not count as a failure).
 */
#include "kvtrim.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REPORTED_MISMATCHES 10 /* per child, on stderr */

struct opts {
	const char *dir;     /* NULL: the library's default */
	uint32_t clients, seqs, steps, sync_every;
	uint32_t layers, heads, kv_heads, head_dim, page_tokens;
	enum kvt_dtype dtype;
	const char *policy;
	const char *name;
	uint64_t seed, quota;
	uint32_t kill_after; /* 0: never */
	uint32_t step_us;    /* pause per step, like an engine's decode step */
	int verify;
};

/* What a child tells the parent; one write, well below PIPE_BUF. */
struct report {
	uint32_t client;
	int32_t status; /* the child's exit status */
	uint64_t syncs, appended, kept, mismatches;
};

/* Independent model of the policies loadgen can verify. */
enum model_kind { MODEL_FULL, MODEL_STREAMING };
struct model {
	enum model_kind kind;
	uint32_t sinks;
	int has_tokens, has_ratio;
	uint32_t tokens;
	double ratio;
};

/* ---------------------------------------------------------------- pattern */

static uint64_t mix(uint64_t x)
{
	/* splitmix64 finaliser: cheap, and every input bit moves every
	 * output bit, so neighbouring positions get unrelated bytes. */
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint32_t tag_of(uint64_t seed, uint32_t client, uint32_t seq,
                       uint32_t layer, uint32_t head)
{
	uint64_t h = mix(seed);
	h = mix(h ^ client);
	h = mix(h ^ seq);
	h = mix(h ^ layer);
	h = mix(h ^ head);
	return (uint32_t)h;
}

/* The per-byte part of the pattern hash: depends on (byte, is_v) only, so
 * engines compute it once per row layout (see bmix_init). */
static uint64_t bmix_of(uint32_t b, int is_v)
{
	return mix((uint64_t)b << 1 | (uint64_t)is_v);
}

/* bmix: [2 * row_bytes] as filled by bmix_init; byte b of K or V. */
static uint8_t byte_of(const uint64_t *bmix, size_t row_bytes, uint32_t tag,
                       uint32_t pos, uint32_t b, int is_v)
{
	return (uint8_t)mix(((uint64_t)tag << 32 | pos) ^
	                    bmix[(size_t)is_v * row_bytes + b]);
}

static uint64_t *bmix_init(size_t row_bytes)
{
	uint64_t *t = malloc(2 * row_bytes * sizeof(*t));
	for (size_t b = 0; t && b < row_bytes; b++) {
		t[b] = bmix_of((uint32_t)b, 0);
		t[row_bytes + b] = bmix_of((uint32_t)b, 1);
	}
	return t;
}

static void put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* k, v: [row_bytes] each (head_dim elements of the tenant dtype). */
static void write_entry(const uint64_t *bmix, uint8_t *k, uint8_t *v,
                        size_t row_bytes, uint32_t tag, uint32_t pos)
{
	put_u32(k, pos);
	put_u32(k + 4, tag);
	for (size_t b = 8; b < row_bytes; b++)
		k[b] = byte_of(bmix, row_bytes, tag, pos, (uint32_t)b, 0);
	for (size_t b = 0; b < row_bytes; b++)
		v[b] = byte_of(bmix, row_bytes, tag, pos, (uint32_t)b, 1);
}

/* Byte index of the first wrong byte, or -1 when the entry is intact. */
static long check_entry(const uint64_t *bmix, const uint8_t *k,
                        const uint8_t *v, size_t row_bytes, uint32_t tag,
                        uint32_t pos, int *is_v)
{
	*is_v = 0;
	for (size_t b = 8; b < row_bytes; b++)
		if (k[b] != byte_of(bmix, row_bytes, tag, pos, (uint32_t)b, 0))
			return (long)b;
	*is_v = 1;
	for (size_t b = 0; b < row_bytes; b++)
		if (v[b] != byte_of(bmix, row_bytes, tag, pos, (uint32_t)b, 1))
			return (long)b;
	return -1;
}

/* ---------------------------------------------------------------- model */

/* Is spec ("name[:args]") the policy `name`? */
static int policy_is(const char *spec, const char *name)
{
	size_t n = strcspn(spec, ":");
	return n == strlen(name) && !strncmp(spec, name, n);
}

/*
 * Parses the policy spec into a model.  0, or -1 with the reason in why
 * when loadgen has no model for it.
 */
static int model_parse(const char *spec, struct model *m, char *why,
                       size_t len)
{
	memset(m, 0, sizeof(*m));
	const char *colon = strchr(spec, ':');
	if (policy_is(spec, "full")) {
		m->kind = MODEL_FULL;
		return 0;
	}
	if (!policy_is(spec, "streaming")) {
		snprintf(why, len, "policy %.*s has no model",
		         (int)strcspn(spec, ":"), spec);
		return -1;
	}
	m->kind = MODEL_STREAMING;
	m->sinks = 4;
	char args[KVT_SPEC_MAX];
	snprintf(args, sizeof(args), "%s", colon ? colon + 1 : "");
	char *save = NULL;
	for (char *kv = strtok_r(args, ",", &save); kv;
	     kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '=');
		char *end = NULL;
		if (!eq) {
			snprintf(why, len, "policy streaming: '%s' is not "
			         "key=value", kv);
			return -1;
		}
		*eq = '\0';
		const char *val = eq + 1;
		errno = 0;
		if (!strcmp(kv, "sinks")) {
			unsigned long long x = strtoull(val, &end, 10);
			if (errno || *end || x > UINT32_MAX)
				goto bad;
			m->sinks = (uint32_t)x;
		} else if (!strcmp(kv, "tokens")) {
			unsigned long long x = strtoull(val, &end, 10);
			if (errno || *end || x > UINT32_MAX)
				goto bad;
			m->tokens = (uint32_t)x;
			m->has_tokens = 1;
		} else if (!strcmp(kv, "ratio")) {
			double x = strtod(val, &end);
			if (errno || *end || !(x >= 0 && x < 1))
				goto bad;
			m->ratio = x;
			m->has_ratio = 1;
		} else {
			snprintf(why, len, "policy streaming with key %s has "
			         "no model", kv);
			return -1;
		}
		continue;
bad:
		snprintf(why, len, "policy streaming: bad value %s=%s", kv,
		         val);
		return -1;
	}
	if (!m->has_tokens && !m->has_ratio) {
		m->tokens = 256;
		m->has_tokens = 1;
	}
	return 0;
}

/* Does a list that has seen n_seen tokens keep position pos? */
static int model_keeps(const struct model *m, uint32_t n_seen, uint32_t pos)
{
	if (m->kind == MODEL_FULL)
		return 1;
	/* Both budgets given: each is a cap, so the tighter one wins. */
	uint64_t b = UINT64_MAX;
	if (m->has_tokens)
		b = m->tokens;
	if (m->has_ratio) {
		uint64_t br = n_seen - (uint64_t)floor(m->ratio * n_seen);
		if (br < b)
			b = br;
	}
	if (n_seen <= b)
		return 1;
	uint64_t s = m->sinks < b ? m->sinks : b;
	uint64_t recent = b - s;
	return pos < s || (uint64_t)pos >= n_seen - recent;
}

/* ---------------------------------------------------------------- child */

/*
 * Advances the model to n_seen tokens.  Eviction is final, so what the
 * daemon must hold is the history of decisions, not one rule applied to
 * n_seen: a position dropped under an earlier, tighter budget (a ratio
 * budget can grow again) stays dropped.
 */
static void model_advance(uint8_t *alive, uint32_t *alive_seen,
                          const struct model *m, uint32_t n_seen)
{
	for (uint32_t p = 0; p < n_seen; p++) {
		int keep = model_keeps(m, n_seen, p);
		alive[p] = p < *alive_seen ? (uint8_t)(alive[p] && keep)
		                           : (uint8_t)keep;
	}
	*alive_seen = n_seen;
}

struct engine {
	const struct opts *o;
	const struct model *model; /* NULL unless verifying */
	uint32_t client;
	kvt_client *c;
	kvt_seq *seqs;    /* [o->seqs] */
	uint8_t *seen;    /* [o->steps] scratch for verify */
	uint8_t *alive;   /* [o->steps] positions the model still keeps; the
	                     same for every list, as all advance together */
	uint32_t alive_seen; /* tokens the model has been advanced to */
	uint64_t *bmix;   /* [2 * row_bytes] see bmix_init */
	size_t row_bytes; /* head_dim * dtype size */
	uint32_t page_tokens;
	int stage;        /* the policy wants staged inputs */
	struct report r;
};

__attribute__((format(printf, 2, 3))) static void
say(const struct engine *e, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "loadgen[%u]: ", e->client);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

__attribute__((format(printf, 5, 6))) static void
mismatch(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
         const char *fmt, ...)
{
	if (e->r.mismatches++ < MAX_REPORTED_MISMATCHES) {
		char buf[256];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(buf, sizeof(buf), fmt, ap);
		va_end(ap);
		say(e, "mismatch seq=%u layer=%u head=%u: %s", j, l, h, buf);
	}
}

/* Checks one list against the pattern and the model after n_seen tokens. */
static int verify_list(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                       uint32_t n_seen)
{
	struct kvt_list list;
	int rc = kvt_list_get(e->c, e->seqs[j], l, h, &list);
	if (rc < 0) {
		say(e, "kvt_list_get: %s", kvt_strerror(rc));
		return rc;
	}
	uint32_t tag = tag_of(e->o->seed, e->client, j, l, h);
	memset(e->seen, 0, n_seen);
	for (uint32_t i = 0; i < list.len; i++) {
		uint32_t pi = i / e->page_tokens, row = i % e->page_tokens;
		if (pi >= list.n_pages) {
			mismatch(e, j, l, h, "entry %u beyond the %u pages", i,
			         list.n_pages);
			continue;
		}
		uint8_t *page = kvt_page_ptr(e->c, list.pages[pi]);
		if (!page) {
			mismatch(e, j, l, h, "page %u of entry %u unmapped",
			         list.pages[pi], i);
			continue;
		}
		const uint8_t *k = page + row * e->row_bytes;
		const uint8_t *v = page + (e->page_tokens + row) * e->row_bytes;
		uint32_t pos = get_u32(k), got_tag = get_u32(k + 4);
		int is_v;
		long bad;
		if (got_tag != tag)
			mismatch(e, j, l, h, "entry %u: tag %08x, expected %08x",
			         i, got_tag, tag);
		else if (pos >= n_seen)
			mismatch(e, j, l, h, "entry %u: position %u of %u seen",
			         i, pos, n_seen);
		else if (e->seen[pos]++)
			mismatch(e, j, l, h, "entry %u: position %u twice", i,
			         pos);
		else if ((bad = check_entry(e->bmix, k, v, e->row_bytes, tag,
		                            pos, &is_v)) >= 0)
			mismatch(e, j, l, h, "entry %u (position %u): %c byte "
			         "%ld differs", i, pos, is_v ? 'V' : 'K', bad);
	}
	for (uint32_t p = 0; p < n_seen; p++) {
		int want = e->alive[p];
		if (want && !e->seen[p])
			mismatch(e, j, l, h, "position %u missing (len %u, "
			         "seen %u)", p, list.len, n_seen);
		else if (!want && e->seen[p])
			mismatch(e, j, l, h, "position %u kept, policy "
			         "evicts it (len %u, seen %u)", p, list.len,
			         n_seen);
	}
	return 0;
}

/* Writes K/V of position pos for every list of every sequence at k. */
static int append_step(struct engine *e, uint32_t pos, uint32_t k)
{
	const struct opts *o = e->o;
	for (uint32_t j = 0; j < o->seqs; j++) {
		for (uint32_t l = 0; l < o->layers; l++) {
			for (uint32_t h = 0; h < o->kv_heads; h++) {
				void *kp, *vp;
				int rc = kvt_kv_ptr(e->c, e->seqs[j], l, h, k,
				                    &kp, &vp);
				if (rc < 0) {
					say(e, "kvt_kv_ptr(seq %u, layer %u, "
					    "head %u, k %u): %s", j, l, h, k,
					    kvt_strerror(rc));
					return rc;
				}
				write_entry(e->bmix, kp, vp, e->row_bytes,
				            tag_of(o->seed, e->client, j, l, h),
				            pos);
			}
			if (!e->stage)
				continue;
			/* Plausible, deterministic scorer inputs. */
			float *x = kvt_stage_x(e->c, e->seqs[j], l, pos);
			float *q = kvt_stage_q(e->c, e->seqs[j], l, pos);
			float *lse = kvt_stage_lse(e->c, e->seqs[j], l, pos);
			if (!x || !q || !lse) {
				say(e, "no staging entry for seq %u layer %u",
				    j, l);
				return KVT_EINVAL;
			}
			uint64_t base = mix(o->seed ^ ((uint64_t)pos << 20) ^
			                    ((uint64_t)j << 8) ^ l);
			uint32_t nx = o->heads * o->head_dim;
			for (uint32_t i = 0; i < nx; i++) {
				x[i] = (float)(mix(base + i) & 0xffff) /
				               65536.0f - 0.5f;
				q[i] = (float)(mix(~base + i) & 0xffff) /
				               65536.0f - 0.5f;
			}
			for (uint32_t i = 0; i < o->heads; i++)
				lse[i] = logf((float)pos + 1.0f);
		}
	}
	return 0;
}

static int engine_run(struct engine *e)
{
	const struct opts *o = e->o;
	uint32_t headroom = o->sync_every > o->page_tokens ? o->sync_every
	                                                    : o->page_tokens;
	char name[KVT_NAME_MAX];
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
		.stage_tokens = e->stage ? headroom : 0,
		.policy = o->policy,
		.quota_bytes = o->quota,
	};
	char err[KVT_ERRTEXT_MAX];
	struct kvt_sync_item *items = NULL;
	uint32_t opened = 0, pending = 0;
	int rc = kvt_connect(&cfg, &e->c, err);
	if (rc < 0) {
		say(e, "kvt_connect: %s (%s)", kvt_strerror(rc), err);
		return rc;
	}
	const struct kvt_config *in_force = kvt_config_of(e->c);
	e->page_tokens = in_force->page_tokens;
	if (in_force->headroom < o->sync_every) {
		say(e, "kvtrimd granted headroom %u < --sync-every %u",
		    in_force->headroom, o->sync_every);
		rc = KVT_EHEADROOM;
		goto out;
	}
	for (; opened < o->seqs; opened++)
		if ((rc = kvt_seq_open(e->c, &e->seqs[opened])) < 0) {
			say(e, "kvt_seq_open: %s (%s)", kvt_strerror(rc),
			    kvt_last_error(e->c));
			goto out;
		}
	if (!(items = calloc(o->seqs, sizeof(*items)))) {
		rc = KVT_ENOMEM;
		goto out;
	}
	for (uint32_t s = 0; s < o->steps; s++) {
		if (o->kill_after && e->client == 0 && s == o->kill_after)
			raise(SIGKILL);
		if (o->step_us)
			usleep(o->step_us);
		if ((rc = append_step(e, s, pending)) < 0)
			break;
		pending++;
		if (pending < o->sync_every && s + 1 < o->steps)
			continue;
		for (uint32_t j = 0; j < o->seqs; j++)
			items[j] = (struct kvt_sync_item){
				.seq = e->seqs[j], .n_new = pending,
				.phase = KVT_PHASE_DECODE,
			};
		if ((rc = kvt_sync(e->c, items, o->seqs)) < 0) {
			say(e, "kvt_sync at step %u: %s (%s)", s,
			    kvt_strerror(rc), kvt_last_error(e->c));
			break;
		}
		e->r.syncs++;
		e->r.appended += (uint64_t)pending * o->seqs * o->layers *
		                 o->kv_heads;
		pending = 0;
		if (!e->model)
			continue;
		model_advance(e->alive, &e->alive_seen, e->model, s + 1);
		for (uint32_t j = 0; j < o->seqs && rc == 0; j++)
			for (uint32_t l = 0; l < o->layers && rc == 0; l++)
				for (uint32_t h = 0; h < o->kv_heads && rc == 0;
				     h++)
					rc = verify_list(e, j, l, h, s + 1);
		if (rc < 0)
			break;
	}
	if (o->kill_after && e->client == 0 && o->steps == o->kill_after)
		raise(SIGKILL);

	/* Kept entries also after a failed sync: nothing changed then. */
	for (uint32_t j = 0; j < opened; j++)
		for (uint32_t l = 0; l < o->layers; l++)
			for (uint32_t h = 0; h < o->kv_heads; h++) {
				struct kvt_list list;
				if (kvt_list_get(e->c, e->seqs[j], l, h,
				                 &list) == 0)
					e->r.kept += list.len;
			}
out:
	free(items);
	for (uint32_t j = 0; j < opened; j++) {
		int crc = kvt_seq_close(e->c, e->seqs[j]);
		if (crc < 0 && rc == 0) {
			say(e, "kvt_seq_close: %s (%s)", kvt_strerror(crc),
			    kvt_last_error(e->c));
			rc = crc;
		}
	}
	kvt_disconnect(e->c);
	e->c = NULL;
	return rc;
}

static int child_main(const struct opts *o, const struct model *m,
                      uint32_t client, int wfd)
{
	struct engine e = {
		.o = o,
		.model = o->verify ? m : NULL,
		.client = client,
		.row_bytes = (size_t)o->head_dim * kvt_dtype_size(o->dtype),
		.page_tokens = o->page_tokens,
	};
	e.r.client = client;
	/* Policies other than the two without inputs get staged inputs. */
	e.stage = !policy_is(o->policy, "full") &&
	          !policy_is(o->policy, "streaming");
	e.seqs = calloc(o->seqs, sizeof(*e.seqs));
	e.seen = calloc(o->steps, 1);
	e.alive = calloc(o->steps, 1);
	e.bmix = bmix_init(e.row_bytes);
	int rc = KVT_ENOMEM;
	if (e.seqs && e.seen && e.alive && e.bmix)
		rc = engine_run(&e);
	else
		say(&e, "out of memory");
	e.r.status = rc < 0 ? 2 : e.r.mismatches ? 1 : 0;
	free(e.seqs);
	free(e.seen);
	free(e.alive);
	free(e.bmix);
	ssize_t w = write(wfd, &e.r, sizeof(e.r));
	close(wfd);
	if (w != (ssize_t)sizeof(e.r))
		return 2;
	return e.r.status;
}

/* ---------------------------------------------------------------- parent */

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: kvtrim-loadgen [--runtime-dir DIR] [--clients N] "
	        "[--seqs M] [--steps S]\n"
	        "         [--policy SPEC] [--verify] [--sync-every K] "
	        "[--layers L] [--heads H]\n"
	        "         [--kv-heads H] [--head-dim D] [--dtype "
	        "f32|f16|bf16] [--page-tokens P]\n"
	        "         [--seed X] [--name PREFIX] [--quota BYTES] "
	        "[--kill-after-steps N] [--step-us U]\n"
	        "\n"
	        "Forks N synthetic engines (tenants PREFIX-0..N-1); each "
	        "opens M sequences and\n"
	        "appends S tokens to each, syncing every K steps.  --verify "
	        "checks every entry's\n"
	        "bytes and the kept positions against loadgen's own model "
	        "of the policy\n"
	        "(full, streaming).  Prints one summary line; exit 0 when "
	        "every engine succeeded.\n"
	        "Defaults: clients 1, seqs 1, steps 100, policy full, "
	        "sync-every 1, layers 2,\n"
	        "heads 4, kv-heads 2, head-dim 16, dtype f32, page-tokens "
	        "16, seed 1, name loadgen.\n");
}

static int parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi,
                     uint64_t *out)
{
	char *end = NULL;
	errno = 0;
	unsigned long long v = s ? strtoull(s, &end, 0) : 0;
	if (!s || errno || end == s || *end || s[0] == '-' || v < lo ||
	    v > hi) {
		fprintf(stderr, "kvtrim-loadgen: %s needs an integer in "
		        "[%" PRIu64 ", %" PRIu64 "]\n", opt, lo, hi);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){
		.clients = 1, .seqs = 1, .steps = 100, .sync_every = 1,
		.layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 16,
		.page_tokens = 16, .dtype = KVT_DTYPE_F32, .policy = "full",
		.name = "loadgen", .seed = 1,
	};
	static const struct {
		const char *name;
		size_t off;
		uint64_t lo, hi;
	} nums[] = {
#define U32_OPT_(n, f, lo, hi) { n, offsetof(struct opts, f), lo, hi }
		U32_OPT_("--clients", clients, 1, 1024),
		U32_OPT_("--seqs", seqs, 1, 65536),
		U32_OPT_("--steps", steps, 1, 1u << 24),
		U32_OPT_("--sync-every", sync_every, 1, 1u << 16),
		U32_OPT_("--layers", layers, 1, 1024),
		U32_OPT_("--heads", heads, 1, 1024),
		U32_OPT_("--kv-heads", kv_heads, 1, 1024),
		U32_OPT_("--head-dim", head_dim, 1, 1024),
		U32_OPT_("--page-tokens", page_tokens, 1, 4096),
		U32_OPT_("--kill-after-steps", kill_after, 1, 1u << 24),
		U32_OPT_("--step-us", step_us, 0, 10000000),
#undef U32_OPT_
	};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t x;
		size_t k;
		for (k = 0; k < sizeof(nums) / sizeof(nums[0]); k++)
			if (!strcmp(a, nums[k].name))
				break;
		if (k < sizeof(nums) / sizeof(nums[0])) {
			if (parse_u64(a, v, nums[k].lo, nums[k].hi, &x))
				return -1;
			*(uint32_t *)((char *)o + nums[k].off) = (uint32_t)x;
			i++;
		} else if (!strcmp(a, "--verify")) {
			o->verify = 1;
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(a, "--seed") || !strcmp(a, "--quota")) {
			if (parse_u64(a, v, 0, UINT64_MAX,
			              a[2] == 's' ? &o->seed : &o->quota))
				return -1;
			i++;
		} else if (!strcmp(a, "--runtime-dir") ||
		           !strcmp(a, "--policy") || !strcmp(a, "--name") ||
		           !strcmp(a, "--dtype")) {
			if (!v) {
				fprintf(stderr, "kvtrim-loadgen: %s needs a "
				        "value\n", a);
				return -1;
			}
			i++;
			if (a[2] == 'r')
				o->dir = v;
			else if (a[2] == 'p')
				o->policy = v;
			else if (a[2] == 'n')
				o->name = v;
			else if (!strcmp(v, "f32"))
				o->dtype = KVT_DTYPE_F32;
			else if (!strcmp(v, "f16"))
				o->dtype = KVT_DTYPE_F16;
			else if (!strcmp(v, "bf16"))
				o->dtype = KVT_DTYPE_BF16;
			else {
				fprintf(stderr, "kvtrim-loadgen: --dtype is "
				        "f32, f16 or bf16\n");
				return -1;
			}
		} else {
			fprintf(stderr, "kvtrim-loadgen: unknown argument %s "
			        "(see --help)\n", a);
			return -1;
		}
	}
	if ((size_t)o->head_dim * kvt_dtype_size(o->dtype) < 8) {
		fprintf(stderr, "kvtrim-loadgen: a K row must hold at least 8 "
		        "bytes (position and tag): raise --head-dim\n");
		return -1;
	}
	if (o->heads % o->kv_heads) {
		fprintf(stderr, "kvtrim-loadgen: --heads must be a multiple "
		        "of --kv-heads\n");
		return -1;
	}
	if (strlen(o->name) + 12 > KVT_NAME_MAX) {
		fprintf(stderr, "kvtrim-loadgen: --name is too long\n");
		return -1;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse_args(argc, argv, &o) < 0)
		return 2;
	struct model m;
	char why[256];
	if (o.verify && model_parse(o.policy, &m, why, sizeof(why)) < 0) {
		fprintf(stderr, "verify: %s\n", why);
		return 2;
	}

	int pfd[2];
	if (pipe(pfd) < 0) {
		perror("kvtrim-loadgen: pipe");
		return 2;
	}
	pid_t *pids = calloc(o.clients, sizeof(*pids));
	struct report *reps = calloc(o.clients, sizeof(*reps));
	uint8_t *got = calloc(o.clients, 1);
	if (!pids || !reps || !got) {
		fprintf(stderr, "kvtrim-loadgen: out of memory\n");
		return 2;
	}
	double t0 = now_s();
	fflush(NULL);
	uint32_t started = 0;
	for (; started < o.clients; started++) {
		pid_t pid = fork();
		if (pid < 0) {
			perror("kvtrim-loadgen: fork");
			break;
		}
		if (pid == 0) {
			close(pfd[0]);
			int st = child_main(&o, &m, started, pfd[1]);
			fflush(NULL);
			_exit(st);
		}
		pids[started] = pid;
	}
	close(pfd[1]);

	/* Reports until every child has closed its end (exit or kill). */
	struct report r;
	ssize_t n;
	while ((n = read(pfd[0], &r, sizeof(r))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(r) || r.client >= o.clients)
			break;
		reps[r.client] = r;
		got[r.client] = 1;
	}
	close(pfd[0]);

	uint64_t syncs = 0, appended = 0, kept = 0, mismatches = 0;
	uint32_t killed = 0, failed = started < o.clients;
	for (uint32_t i = 0; i < started; i++) {
		int st;
		while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
			;
		if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && i == 0 &&
		    o.kill_after) {
			killed++;
			continue;
		}
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !got[i]) {
			if (WIFSIGNALED(st))
				fprintf(stderr, "loadgen[%u]: killed by signal "
				        "%d\n", i, WTERMSIG(st));
			failed++;
		}
		syncs += reps[i].syncs;
		appended += reps[i].appended;
		kept += reps[i].kept;
		mismatches += reps[i].mismatches;
	}
	double elapsed = now_s() - t0;
	const char *verdict = !o.verify ? "off"
	                      : (mismatches || failed) ? "fail" : "ok";
	printf("loadgen: clients=%u seqs=%u steps=%u policy=%s syncs=%" PRIu64
	       " appended=%" PRIu64 " kept=%" PRIu64 " evicted=%" PRIu64
	       " mismatches=%" PRIu64 " verify=%s killed=%u failed=%u "
	       "elapsed_s=%.3f\n",
	       o.clients, o.seqs, o.steps, o.policy, syncs, appended, kept,
	       appended > kept ? appended - kept : 0, mismatches, verdict,
	       killed, failed, elapsed);
	free(pids);
	free(reps);
	free(got);
	return failed || mismatches ? 1 : 0;
}
