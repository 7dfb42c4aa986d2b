/*
 * loadgen.c — kvtrim-loadgen: synthetic inference engines for kvtrimd.
 *
 * Forks N engine processes; each registers a tenant (PREFIX-i), opens M
 * sequences and for S steps appends one token to every sequence, writing K
 * and V of every (layer, KV head) through kvt_kv_ptr with a pattern that
 * encodes who wrote it and at which position:
 *
 *   V bytes 0..3  position (uint32 little-endian)
 *   V bytes 4..7  tag = hash(seed, client, sequence index, layer, head)
 *   V bytes 8..   hash(tag, position, byte index, 1) & 0xff
 *   K element e   a float in [-1, 1) from hash(tag, position, e, 0), stored
 *                 in the tenant dtype (proper keys, so attention-based
 *                 policies see real weights)
 *
 * so after any amount of compaction every surviving entry can be decoded
 * and checked byte for byte.  Policies that read staged inputs get x and q
 * pseudo-random from (seed, position, sequence, layer) and the true lse of
 * each query head over its list (paged_attention_cpu, like an engine).
 *
 * --verify checks the kept positions after every sync.  full and streaming
 * against an independent model written here (never the daemon's policy
 * code), so a bug shared by the daemon and its checker cannot hide; every
 * other policy against an in-process replay of the same policy code on a
 * shadow copy of each list (positions, per-entry state, layer state, in the
 * daemon's order), fed the same inputs: the daemon's pages before the sync
 * and the staged rows.  Learned policies without model= get random seeded
 * weights written (weights_write) into a scratch directory; the spec sent to
 * the daemon names them.  --prefill N sends the first N tokens as prefill
 * syncs (snapkv acts at the first decode sync).
 *
 * Pages in device memory (a tenant of kvtrimd --backend cuda, where
 * kvt_memory_kind() says KVT_MEMORY_CUDA): every byte goes through
 * kvt_memcpy.  Each entry's K and V rows are built in a host buffer and
 * copied to kvt_kv_ptr's addresses (two copies per list and token); to
 * read a list (--verify, the lse of staged policies, the replay) its pages
 * are copied into host memory first, one copy per run of consecutive page
 * ids in one chunk, as each kvt_memcpy waits for the stream.  On host
 * pages loadgen reads and writes them in place, as before.  The staging
 * segment is host memory on both.
 *
 * Engines die with loadgen (PR_SET_PDEATHSIG): a SIGKILLed loadgen leaves
 * no engine running.  Children report their counts through a pipe; the
 * parent prints one summary line (memory=host|cuda: where the engines'
 * pages were; "mixed" when engines disagreed) and exits 0 only when every
 * child succeeded (a child killed on purpose with --kill-after-steps does
 * not count as a failure).
 *
 * Soak options (scripts/soak.sh): --retry-full backs off and retries a sync
 * or sequence open that the full pool refused (KVT_EPOOLFULL), for up to
 * 120 s; --expect-kills counts a child killed by SIGKILL from outside as
 * killed, not failed, and --respawn N starts up to N replacement engines
 * (tenant PREFIX-i.G) for killed ones; --tolerate-pressure lets --verify
 * accept extra evictions, which memory pressure causes by shrinking
 * budgets and raising thresholds: every entry kept must still be intact
 * and one the policy keeps, and the verifier then adopts the daemon's
 * extra evictions (counted as pressure_evicted) and checks everything after
 * against them.  The summary adds sync latency percentiles measured
 * around kvt_sync (a retried sync counts once, from its first attempt).
 */
#include "kvtrim.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compact.h"
#include "kernels.h"
#include "policy.h"
#include "weights.h"

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
	uint32_t prefill;    /* first N tokens synced as prefill */
	int verify;
	int retry_full;      /* back off and retry on KVT_EPOOLFULL */
	int expect_kills;    /* SIGKILLed children are not failures */
	int tolerate_pressure; /* verify: extra evictions are allowed */
	uint32_t respawn;    /* replacement engines for killed ones */
	struct policy *pol;  /* local instance: needs, lookback, the replay */
	char scratch[64];    /* generated weights live here ("" = none) */
};

/*
 * Sync latency histogram: bucket b counts latencies in
 * [2^(b/4), 2^((b+1)/4)) microseconds (four buckets per octave, so a
 * percentile read from it is at most 19% high); the last bucket is open.
 */
#define LAT_BUCKETS 112

/* What a child tells the parent; one write, well below PIPE_BUF. */
struct report {
	uint32_t client;
	uint32_t gen;   /* 0, or the respawn that ran this client */
	int32_t status; /* the child's exit status */
	uint64_t syncs, appended, kept, mismatches;
	uint64_t full_retries;     /* KVT_EPOOLFULL answers retried */
	uint64_t pressure_evicted; /* extra evictions (--tolerate-pressure) */
	int32_t memory; /* kvt_memory_kind of its pages; -1 before connect */
	uint32_t lat[LAT_BUCKETS]; /* sync latencies, see LAT_BUCKETS */
};

static uint32_t lat_bucket(double us)
{
	if (!(us >= 1.0))
		return 0;
	double b = floor(log2(us) * 4.0);
	return b >= LAT_BUCKETS - 1 ? LAT_BUCKETS - 1 : (uint32_t)b;
}

/* Upper bound of bucket b in microseconds. */
static double lat_upper(uint32_t b)
{
	return exp2((b + 1) / 4.0);
}

/* The q-quantile (0..1) of a histogram in microseconds; 0 when empty. */
static double lat_quantile(const uint64_t *h, double q)
{
	uint64_t n = 0, seen = 0;
	for (uint32_t b = 0; b < LAT_BUCKETS; b++)
		n += h[b];
	if (!n)
		return 0;
	uint64_t want = (uint64_t)ceil(q * (double)n);
	if (want < 1)
		want = 1;
	for (uint32_t b = 0; b < LAT_BUCKETS; b++)
		if ((seen += h[b]) >= want)
			return lat_upper(b);
	return lat_upper(LAT_BUCKETS - 1);
}

/* Independent model of the policies loadgen can verify. */
enum model_kind { MODEL_FULL, MODEL_STREAMING };
struct model {
	enum model_kind kind;
	uint32_t sinks;
	int has_tokens, has_ratio;
	uint32_t tokens;
	double ratio;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

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

/* The K row of (tag, pos): head_dim floats in [-1, 1) in dtype dt, into
 * out [row_bytes]; kf [head_dim] float scratch. */
static void key_row(const uint64_t *bmix, size_t row_bytes, uint32_t tag,
                    uint32_t pos, uint32_t head_dim, enum kvt_dtype dt,
                    float *kf, uint8_t *out)
{
	for (uint32_t e = 0; e < head_dim; e++)
		kf[e] = (float)(mix(((uint64_t)tag << 32 | pos) ^ bmix[e]) >> 40) *
		                (2.0f / 16777216.0f) - 1.0f;
	dtype_from_f32(kf, dt, out, head_dim);
}

/* k, v: [row_bytes] each (head_dim elements of the tenant dtype). */
static void write_entry(const uint64_t *bmix, uint8_t *k, uint8_t *v,
                        size_t row_bytes, uint32_t tag, uint32_t pos,
                        uint32_t head_dim, enum kvt_dtype dt, float *kf)
{
	key_row(bmix, row_bytes, tag, pos, head_dim, dt, kf, k);
	put_u32(v, pos);
	put_u32(v + 4, tag);
	for (size_t b = 8; b < row_bytes; b++)
		v[b] = byte_of(bmix, row_bytes, tag, pos, (uint32_t)b, 1);
}

/* Byte index of the first wrong byte, or -1 when the entry is intact.
 * kf [head_dim], kb [row_bytes] scratch. */
static long check_entry(const uint64_t *bmix, const uint8_t *k,
                        const uint8_t *v, size_t row_bytes, uint32_t tag,
                        uint32_t pos, uint32_t head_dim, enum kvt_dtype dt,
                        float *kf, uint8_t *kb, int *is_v)
{
	*is_v = 0;
	key_row(bmix, row_bytes, tag, pos, head_dim, dt, kf, kb);
	for (size_t b = 0; b < row_bytes; b++)
		if (k[b] != kb[b])
			return (long)b;
	*is_v = 1;
	for (size_t b = 8; b < row_bytes; b++)
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
	if (!policy_is(spec, "streaming"))
		return 1; /* verified by replaying the policy code */
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
	uint32_t stage_tokens;
	struct report r;
	float *kf;        /* [head_dim] key scratch */
	uint8_t *kb;      /* [row_bytes] key scratch */
	float *att;       /* [max_tokens * G] paged_attention scratch */
	void **pv;        /* [kv_heads][mp] page pointers, one row per list
	                     (the replay holds a layer's lists at once) */
	uint32_t mp;      /* page pointers per row of pv */
	/* Device pages (kvt_memory_kind KVT_MEMORY_CUDA); all NULL/0 on host
	 * pages, which loadgen reads and writes in place. */
	int dev;
	size_t page_bytes; /* 2 * page_tokens * row_bytes */
	uint8_t *hp;      /* [hp_rows][mp][page_bytes] host copies of pages,
	                     row r for the pointers of pv row r */
	uint32_t hp_rows;
	uint8_t *wrow;    /* [2][row_bytes] K and V of the entry written */
	/* Replay (verify of policies without an independent model): one
	 * shadow per (sequence, layer, head) list, index
	 * (j * layers + l) * kv_heads + h, cap entries each. */
	int replay;
	uint32_t cap;
	uint32_t *sh_len;  /* [lists] */
	uint32_t *sh_pos;  /* [lists][cap] */
	float *sh_ent;     /* [lists][cap][entry_floats] */
	uint8_t *sh_drop;  /* [lists][cap] decisions of the pending sync */
	uint8_t *sh_state; /* [seqs * layers][layer_state_bytes] */
	uint8_t *want;     /* [steps] expected positions of one list */
	uint32_t *moves;   /* [cap][2] */
	float *in;         /* staged rows gathered: x, q, lse of pending */
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

/*
 * Host-readable pointers to the n pages ids[] (a list's page ids) in row r
 * of e->pv, returned in *out; an unmapped id gives NULL.  On host pages
 * these are the pages themselves.  On device pages they are copies in row
 * r of e->hp, made with one kvt_memcpy per run of consecutive ids in one
 * chunk (adjacent in memory), since each call waits for the stream; the
 * copies hold what the pages held when this ran.  0, or an error (said).
 */
static int pages_view(struct engine *e, uint32_t r, const uint32_t *ids,
                      uint32_t n, void ***out)
{
	void **pv = e->pv + (size_t)r * e->mp;
	if (n > e->mp) {
		say(e, "a list of %u pages, at most %u expected", n, e->mp);
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
			say(e, "kvt_memcpy of %u pages to the host: %s (%s)",
			    q - p, kvt_strerror(rc), kvt_last_error(e->c));
			return rc;
		}
		for (uint32_t i = p; i < q; i++)
			pv[i] = buf + i * pb;
	}
	return 0;
}

/*
 * Checks one list against the pattern and want[p] (1 = position p must be
 * present) after n_seen tokens.  With --tolerate-pressure a wanted position
 * the daemon evicted is not a mismatch: it is counted and cleared in
 * want_alive, so the caller's expectation follows the daemon from here on
 * (eviction is final) and every later list and sync is checked against it.
 */
static int verify_list(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                       uint32_t n_seen, uint8_t *want_alive)
{
	struct kvt_list list;
	int rc = kvt_list_get(e->c, e->seqs[j], l, h, &list);
	if (rc < 0) {
		say(e, "kvt_list_get: %s", kvt_strerror(rc));
		return rc;
	}
	/* the pages that hold entries [0, len) */
	uint32_t np = (uint32_t)(((uint64_t)list.len + e->page_tokens - 1) /
	                         e->page_tokens);
	void **pv;
	if (np > list.n_pages)
		np = list.n_pages;
	if ((rc = pages_view(e, 0, list.pages, np, &pv)) < 0)
		return rc;
	uint32_t tag = tag_of(e->o->seed, e->client, j, l, h);
	memset(e->seen, 0, n_seen);
	for (uint32_t i = 0; i < list.len; i++) {
		uint32_t pi = i / e->page_tokens, row = i % e->page_tokens;
		if (pi >= list.n_pages) {
			mismatch(e, j, l, h, "entry %u beyond the %u pages", i,
			         list.n_pages);
			continue;
		}
		const uint8_t *page = pv[pi];
		if (!page) {
			mismatch(e, j, l, h, "page %u of entry %u unmapped",
			         list.pages[pi], i);
			continue;
		}
		const uint8_t *k = page + row * e->row_bytes;
		const uint8_t *v = page + (e->page_tokens + row) * e->row_bytes;
		uint32_t pos = get_u32(v), got_tag = get_u32(v + 4);
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
		                            pos, e->o->head_dim, e->o->dtype,
		                            e->kf, e->kb, &is_v)) >= 0)
			mismatch(e, j, l, h, "entry %u (position %u): %c byte "
			         "%ld differs", i, pos, is_v ? 'V' : 'K', bad);
	}
	for (uint32_t p = 0; p < n_seen; p++) {
		int want = want_alive[p];
		if (want && !e->seen[p] && e->o->tolerate_pressure) {
			want_alive[p] = 0;
			e->r.pressure_evicted++;
		} else if (want && !e->seen[p])
			mismatch(e, j, l, h, "position %u missing (len %u, "
			         "seen %u)", p, list.len, n_seen);
		else if (!want && e->seen[p])
			mismatch(e, j, l, h, "position %u kept, policy "
			         "evicts it (len %u, seen %u)", p, list.len,
			         n_seen);
	}
	return 0;
}

static uint32_t headroom_of(const struct opts *o)
{
	return o->sync_every > o->page_tokens ? o->sync_every : o->page_tokens;
}

/* Index of the (sequence j, layer l, head h) shadow. */
static size_t sh_idx(const struct engine *e, uint32_t j, uint32_t l,
                     uint32_t h)
{
	return ((size_t)j * e->o->layers + l) * e->o->kv_heads + h;
}

/* Host-readable page pointers of a list (pages_view row 0) into *pv; its
 * length in *len. */
static int list_pages(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                      void ***pv, uint32_t *len)
{
	struct kvt_list list;
	int rc = kvt_list_get(e->c, e->seqs[j], l, h, &list);
	if (rc < 0 ||
	    (rc = pages_view(e, 0, list.pages, list.n_pages, pv)) < 0)
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
		write_entry(e->bmix, kp, vp, e->row_bytes, tag, pos,
		            o->head_dim, o->dtype, e->kf);
		return 0;
	}
	uint8_t *k = e->wrow, *v = e->wrow + e->row_bytes;
	write_entry(e->bmix, k, v, e->row_bytes, tag, pos, o->head_dim,
	            o->dtype, e->kf);
	int rc = kvt_memcpy(e->c, kp, k, e->row_bytes);
	if (rc == 0)
		rc = kvt_memcpy(e->c, vp, v, e->row_bytes);
	if (rc < 0)
		say(e, "kvt_memcpy of an entry to the device: %s (%s)",
		    kvt_strerror(rc), kvt_last_error(e->c));
	return rc;
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
					say(e, "kvt_kv_ptr(seq %u, layer %u, "
					    "head %u, k %u): %s", j, l, h, k,
					    kvt_strerror(rc));
					return rc;
				}
				uint32_t tag = tag_of(o->seed, e->client, j,
				                      l, h);
				if ((rc = put_entry(e, kp, vp, tag, pos)) < 0)
					return rc;
			}
			if (!e->stage)
				continue;
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
				/* queries a bit larger than keys, so attention
				 * is far from uniform */
				q[i] = ((float)(mix(~base + i) & 0xffff) /
				                65536.0f - 0.5f) * 6.0f;
			}
			for (uint32_t h = 0; h < o->kv_heads; h++) {
				uint32_t len;
				void **pv;
				int rc = list_pages(e, j, l, h, &pv, &len);
				if (rc < 0) {
					say(e, "list of seq %u layer %u head %u: "
					    "%s", j, l, h, kvt_strerror(rc));
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
		}
	}
	return 0;
}

/* Staged row of an earlier position for the replay's lookback. */
struct replay_ctx {
	struct engine *e;
	uint32_t j, l, n_seen;
};

static const float *replay_row(void *ctx, uint32_t pos)
{
	const struct replay_ctx *c = ctx;
	if (pos >= c->n_seen ||
	    (uint64_t)pos + c->e->stage_tokens < c->n_seen)
		return NULL;
	return kvt_stage_x(c->e->c, c->e->seqs[c->j], c->l, pos);
}

/*
 * Before a sync of n new tokens (positions [n_seen - n, n_seen)): runs the
 * policy on each shadow with the daemon's current pages and the staged
 * rows, leaving the decisions in sh_drop.  Also checks that the daemon's
 * entries are in the shadow's order, which makes the inputs identical.
 */
static int replay_decide(struct engine *e, uint32_t n, uint32_t n_seen,
                         enum kvt_phase phase)
{
	const struct opts *o = e->o;
	struct policy *p = o->pol;
	uint32_t ef = p->entry_floats, nkv = o->kv_heads;
	size_t sb = p->layer_state_bytes;
	uint32_t d = o->heads * o->head_dim, nq = o->heads * o->head_dim;
	struct policy_head heads[64];
	for (uint32_t j = 0; j < o->seqs; j++)
		for (uint32_t l = 0; l < o->layers; l++) {
			float *x = e->in, *q = x + (size_t)n * d,
			      *lse = q + (size_t)n * nq;
			for (uint32_t k = 0; k < n && e->stage; k++) {
				uint32_t pos = n_seen - n + k;
				memcpy(x + (size_t)k * d,
				       kvt_stage_x(e->c, e->seqs[j], l, pos),
				       d * sizeof(float));
				memcpy(q + (size_t)k * nq,
				       kvt_stage_q(e->c, e->seqs[j], l, pos),
				       nq * sizeof(float));
				memcpy(lse + (size_t)k * o->heads,
				       kvt_stage_lse(e->c, e->seqs[j], l, pos),
				       o->heads * sizeof(float));
			}
			for (uint32_t h = 0; h < nkv; h++) {
				size_t si = sh_idx(e, j, l, h);
				struct kvt_list list;
				int rc = kvt_list_get(e->c, e->seqs[j], l, h,
				                      &list);
				if (rc < 0)
					return rc;
				uint32_t len = e->sh_len[si];
				uint32_t *pos = e->sh_pos + si * e->cap;
				float *ent = ef ? e->sh_ent + si * e->cap * ef
				                : NULL;
				if (list.len != len || len + n > e->cap) {
					mismatch(e, j, l, h, "daemon holds %u "
					         "entries, replay %u", list.len,
					         len);
					return KVT_EINVAL;
				}
				/* row h: the policy reads every head's */
				void **pv;
				if ((rc = pages_view(e, h, list.pages,
				                     list.n_pages, &pv)) < 0)
					return rc;
				for (uint32_t pg = 0; pg < list.n_pages; pg++)
					if (!pv[pg]) {
						mismatch(e, j, l, h, "page %u "
						         "unmapped",
						         list.pages[pg]);
						return KVT_EINVAL;
					}
				/* same order as the daemon's list */
				for (uint32_t i = 0; i < len; i++) {
					const uint8_t *v =
						(uint8_t *)pv[i / e->page_tokens] +
						(e->page_tokens +
						 i % e->page_tokens) * e->row_bytes;
					if (get_u32(v) != pos[i]) {
						mismatch(e, j, l, h, "entry %u is "
						         "position %u, replay "
						         "has %u", i, get_u32(v),
						         pos[i]);
						return KVT_EINVAL;
					}
				}
				for (uint32_t k = 0; k < n; k++)
					pos[len + k] = n_seen - n + k;
				if (ent)
					memset(ent + (size_t)len * ef, 0,
					       (size_t)n * ef * sizeof(float));
				uint8_t *drop = e->sh_drop + si * e->cap;
				memset(drop, 0, len + n);
				heads[h] = (struct policy_head){
					.pos = pos, .ent = ent, .pages = pv,
					.len = len + n, .drop = drop};
			}
			struct replay_ctx rc_ = {e, j, l, n_seen};
			struct policy_layer pl = {
				.layer = l, .phase = phase, .n_new = n,
				.n_seen = n_seen,
				.x = e->stage ? x : NULL,
				.q = e->stage ? q : NULL,
				.lse = e->stage ? lse : NULL,
				.staged = replay_row, .staged_ctx = &rc_,
				.heads = heads,
				.state = sb ? e->sh_state +
				                      ((size_t)j * o->layers + l) * sb
				            : NULL,
			};
			int rc = policy_decide(p, &pl);
			if (rc < 0) {
				say(e, "replay: %s", kvt_strerror(rc));
				return rc;
			}
		}
	return 0;
}

/* After the sync: the expected positions of list (j, l, h) into e->want. */
static void replay_want(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                        uint32_t n, uint32_t n_seen)
{
	size_t si = sh_idx(e, j, l, h);
	uint32_t len = e->sh_len[si] + n;
	const uint32_t *pos = e->sh_pos + si * e->cap;
	const uint8_t *drop = e->sh_drop + si * e->cap;
	memset(e->want, 0, n_seen);
	for (uint32_t i = 0; i < len; i++)
		if (!drop[i])
			e->want[pos[i]] = 1;
}

/*
 * After verify_list: the shadow compacts like the daemon.  Positions
 * verify_list cleared from e->want (evicted under pressure) are dropped
 * too, so the shadow holds what the daemon holds, in its order (the next
 * replay_decide checks that).
 */
static void replay_commit(struct engine *e, uint32_t j, uint32_t l,
                          uint32_t h, uint32_t n)
{
	uint32_t ef = e->o->pol->entry_floats;
	size_t si = sh_idx(e, j, l, h);
	uint32_t len = e->sh_len[si] + n, nl;
	uint32_t *pos = e->sh_pos + si * e->cap;
	uint8_t *drop = e->sh_drop + si * e->cap;
	for (uint32_t i = 0; i < len; i++)
		if (!drop[i] && !e->want[pos[i]])
			drop[i] = 1;
	uint32_t nm = compact_plan(drop, len, e->moves, &nl);
	policy_move_entries(pos, ef ? e->sh_ent + si * e->cap * ef : NULL, ef,
	                    e->moves, nm);
	e->sh_len[si] = nl;
}

/*
 * Before retry k (from 0) of a request the full pool refused, begun at t0:
 * sleeps 5 ms doubling to 320 ms, plus jitter so refused engines do not
 * come back in step.  0 to retry; KVT_EPOOLFULL without --retry-full or
 * once 120 s have passed.
 */
static int full_backoff(struct engine *e, uint32_t k, double t0)
{
	if (!e->o->retry_full || now_s() - t0 > 120.0)
		return KVT_EPOOLFULL;
	uint32_t ms = 5u << (k < 6 ? k : 6);
	ms += (uint32_t)(mix(((uint64_t)e->client << 32) ^ k ^
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
	uint32_t rows = o->kv_heads; /* at most 64 (child_main) */
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
	say(e, "out of memory for page buffers");
	return KVT_ENOMEM;
}

static int engine_run(struct engine *e)
{
	const struct opts *o = e->o;
	uint32_t headroom = headroom_of(o);
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
	if ((rc = engine_buffers(e, in_force)) < 0)
		goto out;
	for (; opened < o->seqs; opened++) {
		double t0 = now_s();
		for (uint32_t k = 0;; k++) {
			rc = kvt_seq_open(e->c, &e->seqs[opened]);
			if (rc != KVT_EPOOLFULL || full_backoff(e, k, t0))
				break;
		}
		if (rc < 0) {
			say(e, "kvt_seq_open: %s (%s)", kvt_strerror(rc),
			    kvt_last_error(e->c));
			goto out;
		}
	}
	if (!(items = calloc(o->seqs, sizeof(*items)))) {
		rc = KVT_ENOMEM;
		goto out;
	}
	for (uint32_t s = 0; s < o->steps; s++) {
		if (o->kill_after && e->client == 0 && !e->r.gen &&
		    s == o->kill_after)
			raise(SIGKILL);
		if (o->step_us)
			usleep(o->step_us);
		if ((rc = append_step(e, s, pending)) < 0)
			break;
		pending++;
		enum kvt_phase phase = s < o->prefill ? KVT_PHASE_PREFILL
		                                      : KVT_PHASE_DECODE;
		if (pending < o->sync_every && s + 1 < o->steps &&
		    s + 1 != o->prefill)
			continue;
		if (e->replay &&
		    (rc = replay_decide(e, pending, s + 1, phase)) < 0)
			break;
		for (uint32_t j = 0; j < o->seqs; j++)
			items[j] = (struct kvt_sync_item){
				.seq = e->seqs[j], .n_new = pending,
				.phase = phase,
			};
		/* Nothing changed on a refused sync (kvtrim.h), so the same
		 * items go again; the replay's decisions stand. */
		double t0 = now_s();
		for (uint32_t k = 0;; k++) {
			rc = kvt_sync(e->c, items, o->seqs);
			if (rc != KVT_EPOOLFULL || full_backoff(e, k, t0))
				break;
		}
		e->r.lat[lat_bucket((now_s() - t0) * 1e6)]++;
		if (rc < 0) {
			say(e, "kvt_sync at step %u: %s (%s)", s,
			    kvt_strerror(rc), kvt_last_error(e->c));
			break;
		}
		e->r.syncs++;
		e->r.appended += (uint64_t)pending * o->seqs * o->layers *
		                 o->kv_heads;
		uint32_t n = pending;
		pending = 0;
		if (e->replay) {
			for (uint32_t j = 0; j < o->seqs && rc == 0; j++)
				for (uint32_t l = 0; l < o->layers && rc == 0;
				     l++)
					for (uint32_t h = 0;
					     h < o->kv_heads && rc == 0; h++) {
						replay_want(e, j, l, h, n, s + 1);
						rc = verify_list(e, j, l, h, s + 1,
						                 e->want);
						replay_commit(e, j, l, h, n);
					}
			if (rc < 0)
				break;
			continue;
		}
		if (!e->model)
			continue;
		model_advance(e->alive, &e->alive_seen, e->model, s + 1);
		for (uint32_t j = 0; j < o->seqs && rc == 0; j++)
			for (uint32_t l = 0; l < o->layers && rc == 0; l++)
				for (uint32_t h = 0; h < o->kv_heads && rc == 0;
				     h++)
					rc = verify_list(e, j, l, h, s + 1,
					                 e->alive);
		if (rc < 0)
			break;
	}
	if (o->kill_after && e->client == 0 && !e->r.gen &&
	    o->steps == o->kill_after)
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
                      int has_model, uint32_t client, uint32_t gen, int wfd)
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
	uint32_t headroom = headroom_of(o);
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
	e.bmix = bmix_init(e.row_bytes);
	e.kf = calloc(o->head_dim, sizeof(float));
	e.kb = calloc(e.row_bytes, 1);
	e.att = calloc((size_t)e.cap * G + 1, sizeof(float));
	e.want = calloc(o->steps, 1);
	e.moves = calloc((size_t)e.cap * 2, sizeof(uint32_t));
	e.in = calloc((size_t)headroom * (2 * o->heads * o->head_dim + o->heads),
	              sizeof(float));
	e.sh_len = calloc(lists, sizeof(uint32_t));
	e.sh_pos = calloc(lists * e.cap, sizeof(uint32_t));
	e.sh_ent = calloc(lists * e.cap * ef + 1, sizeof(float));
	e.sh_drop = calloc(lists * e.cap, 1);
	e.sh_state = calloc((size_t)o->seqs * o->layers * sb + 1, 1);
	int rc = KVT_ENOMEM;
	if (o->kv_heads > 64)
		say(&e, "at most 64 KV heads");
	else if (e.seqs && e.seen && e.alive && e.bmix && e.kf && e.kb &&
	         e.att && e.want && e.moves && e.in && e.sh_len &&
	         e.sh_pos && e.sh_ent && e.sh_drop && e.sh_state)
		rc = engine_run(&e);
	else
		say(&e, "out of memory");
	e.r.status = rc < 0 ? 2 : e.r.mismatches ? 1 : 0;
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
	        "[--kill-after-steps N] [--step-us U] [--prefill N]\n"
	        "         [--retry-full] [--expect-kills] [--respawn N] "
	        "[--tolerate-pressure]\n"
	        "\n"
	        "Forks N synthetic engines (tenants PREFIX-0..N-1); each "
	        "opens M sequences and\n"
	        "appends S tokens to each, syncing every K steps.  --verify "
	        "checks every entry's\n"
	        "bytes and the kept positions against loadgen's own model "
	        "of the policy\n"
	        "(full, streaming) or an in-process replay of the policy "
	        "code (all others;\n"
	        "learned policies without model= get random seeded "
	        "weights).  --prefill N\n"
	        "syncs the first N tokens as prefill.  Prints one summary "
	        "line (with sync\nlatency percentiles and memory=host|cuda, "
	        "where the pages were: on a cuda\ntenant of kvtrimd --backend "
	        "cuda they are written and read with kvt_memcpy);\nexit 0 "
	        "when every engine succeeded.\n"
	        "Soak: --retry-full backs off and retries requests the full "
	        "pool refused;\n--expect-kills counts engines SIGKILLed from "
	        "outside as killed, not failed,\nand --respawn N replaces up "
	        "to N of them; --tolerate-pressure lets --verify\naccept "
	        "the extra evictions of memory pressure (kept entries are "
	        "still checked).\n"
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
		U32_OPT_("--prefill", prefill, 0, 1u << 24),
		U32_OPT_("--respawn", respawn, 0, 1u << 20),
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
		} else if (!strcmp(a, "--retry-full")) {
			o->retry_full = 1;
		} else if (!strcmp(a, "--expect-kills")) {
			o->expect_kills = 1;
		} else if (!strcmp(a, "--tolerate-pressure")) {
			o->tolerate_pressure = 1;
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
	if (strlen(o->name) + 24 > KVT_NAME_MAX) {
		fprintf(stderr, "kvtrim-loadgen: --name is too long\n");
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- weights */

/* Uniform in [lo, hi) from (seed, tensor, index). */
static float frand(uint64_t seed, uint32_t t, uint64_t i, float lo, float hi)
{
	uint64_t h = mix(mix(seed ^ 0x5eed) ^ ((uint64_t)t << 40) ^ i);
	return lo + (hi - lo) * (float)(h >> 40) / 16777216.0f;
}

struct wbuild {
	struct weights_tensor t[64 * 8];
	char names[64 * 8][48];
	float *data[64 * 8];
	size_t n;
	uint64_t seed;
};

/* Adds a tensor filled uniform in [lo, hi) (lo == hi: constant). */
static int wb_add(struct wbuild *b, const char *name, uint32_t nd,
                  uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3,
                  float lo, float hi)
{
	if (b->n == sizeof(b->t) / sizeof(b->t[0]))
		return -1;
	uint64_t sh[4] = {s0, s1, s2, s3}, numel = 1;
	for (uint32_t d = 0; d < nd; d++)
		numel *= sh[d];
	float *v = malloc(numel * sizeof(float) + 1);
	if (!v)
		return -1;
	for (uint64_t i = 0; i < numel; i++)
		v[i] = lo == hi ? lo : frand(b->seed, (uint32_t)b->n, i, lo, hi);
	snprintf(b->names[b->n], sizeof(b->names[0]), "%s", name);
	b->t[b->n] = (struct weights_tensor){b->names[b->n], nd,
	                                     {s0, s1, s2, s3}, v};
	b->data[b->n++] = v;
	return 0;
}

/*
 * Writes random seeded weights for a learned policy (kvzap: MLP hidden 8,
 * output bias -4 so about half the entries fall below the default
 * threshold; fastkvzip: D' 4, 4 sinks; kvpop: r 4, m 8) into o->scratch
 * and appends model=PATH to spec.  0, or -1 with a message printed.
 */
static int gen_weights(struct opts *o, const char *name, char *spec,
                       size_t len)
{
	struct wbuild *b = calloc(1, sizeof(*b));
	if (!b)
		return -1;
	b->seed = o->seed;
	uint64_t d = (uint64_t)o->heads * o->head_dim, nkv = o->kv_heads;
	uint64_t G = o->heads / o->kv_heads;
	int bad = 0;
	char nm[48];
	for (uint32_t l = 0; l < o->layers && !bad; l++) {
#define ADD(fmt, ...)                                                          	(snprintf(nm, sizeof(nm), fmt, l), bad |= wb_add(b, nm, __VA_ARGS__))
		if (!strcmp(name, "kvzap")) {
			ADD("kvzap.%u.fc1.weight", 2, 8, d, 0, 0, -1.0f, 1.0f);
			ADD("kvzap.%u.fc1.bias", 1, 8, 0, 0, 0, -0.5f, 0.5f);
			ADD("kvzap.%u.fc2.weight", 2, nkv, 8, 0, 0, -1.0f, 1.0f);
			ADD("kvzap.%u.fc2.bias", 1, nkv, 0, 0, 0, -4.0f, -4.0f);
		} else if (!strcmp(name, "fastkvzip")) {
			ADD("fastkvzip.%u.q_proj.weight", 2, nkv * G * 4, d, 0, 0,
			    -0.5f, 0.5f);
			ADD("fastkvzip.%u.q_proj.bias", 1, nkv * G * 4, 0, 0, 0,
			    -0.5f, 0.5f);
			ADD("fastkvzip.%u.k_proj.weight", 2, nkv * 4, d, 0, 0,
			    -0.5f, 0.5f);
			ADD("fastkvzip.%u.q_norm.weight", 1, 4, 0, 0, 0, 1.0f, 1.0f);
			ADD("fastkvzip.%u.k_norm.weight", 1, 4, 0, 0, 0, 1.0f, 1.0f);
			ADD("fastkvzip.%u.k_base", 4, nkv, 1, 4, 4, -1.0f, 1.0f);
			ADD("fastkvzip.%u.b", 3, nkv, 1, G, 0, -0.5f, 0.5f);
		} else {
			ADD("kvpop.%u.proj.weight", 2, 4, d, 0, 0, -0.5f, 0.5f);
			ADD("kvpop.%u.fc1.weight", 2, 8, 5, 0, 0, -1.0f, 1.0f);
			ADD("kvpop.%u.fc1.bias", 1, 8, 0, 0, 0, -0.5f, 0.5f);
			ADD("kvpop.%u.fc2.weight", 2, nkv, 8, 0, 0, -1.0f, 1.0f);
			ADD("kvpop.%u.fc2.bias", 1, nkv, 0, 0, 0, 0.0f, 0.0f);
		}
#undef ADD
	}
	char path[128], err[KVT_ERRTEXT_MAX] = "";
	snprintf(path, sizeof(path), "%s/%s.safetensors", o->scratch, name);
	int rc = bad ? -1 : weights_write(path, b->t, b->n, err, sizeof(err));
	for (size_t i = 0; i < b->n; i++)
		free(b->data[i]);
	free(b);
	if (rc) {
		fprintf(stderr, "kvtrim-loadgen: cannot write weights: %s\n",
		        bad ? "out of memory" : err);
		return -1;
	}
	size_t n = strlen(spec);
	snprintf(spec + n, len - n, "%smodel=%s", strchr(spec, ':') ? "," : ":",
	         path);
	return 0;
}

static void scratch_remove(const struct opts *o)
{
	static const char *const names[] = {"kvzap", "fastkvzip", "kvpop"};
	char path[128];
	if (!o->scratch[0])
		return;
	for (size_t i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/%s.safetensors", o->scratch,
		         names[i]);
		unlink(path);
	}
	rmdir(o->scratch);
}

/*
 * Completes the spec (generated weights for a learned policy without
 * model=) and creates the local policy instance for the geometry.
 */
static int prepare_policy(struct opts *o, char *spec, size_t len)
{
	snprintf(spec, len, "%s", o->policy);
	const char *learned = policy_is(spec, "kvzap")       ? "kvzap"
	                      : policy_is(spec, "fastkvzip") ? "fastkvzip"
	                      : policy_is(spec, "kvpop")     ? "kvpop"
	                                                     : NULL;
	if (learned && !strstr(spec, "model=")) {
		snprintf(o->scratch, sizeof(o->scratch),
		         "/tmp/kvtrim-loadgen-XXXXXX");
		if (!mkdtemp(o->scratch) || chmod(o->scratch, 0755) ||
		    gen_weights(o, learned, spec, len)) {
			perror("kvtrim-loadgen: scratch directory");
			return -1;
		}
	}
	o->policy = spec;
	uint32_t headroom = headroom_of(o);
	struct policy_geom ge = {
		.n_layers = o->layers, .n_heads = o->heads,
		.n_kv_heads = o->kv_heads, .head_dim = o->head_dim,
		.d_model = o->heads * o->head_dim,
		.page_tokens = o->page_tokens, .dtype = o->dtype,
		.headroom = headroom,
	};
	char err[KVT_ERRTEXT_MAX] = "";
	if (policy_create(spec, &ge, &o->pol, err, sizeof(err))) {
		fprintf(stderr, "kvtrim-loadgen: policy: %s\n", err);
		return -1;
	}
	return 0;
}

/* Sums of the reports of every engine (killed ones send none). */
struct totals {
	uint64_t syncs, appended, kept, mismatches, full_retries;
	uint64_t pressure_evicted;
	int memory; /* the engines' kvt_memory_kind; -1 none, -2 mixed */
	uint64_t lat[LAT_BUCKETS];
};

/*
 * Forks engine `client` (generation gen); its pid, or -1.  An engine dies
 * with loadgen: killed with SIGKILL when the parent dies (even by SIGKILL,
 * which the parent cannot forward), so no engine runs on for its whole run
 * holding pool pages.  A parent that died between fork and the prctl is
 * caught by the getppid check (the child was already reparented).
 */
static pid_t spawn(const struct opts *o, const struct model *m, int has_model,
                   uint32_t client, uint32_t gen, const int *pfd)
{
	pid_t parent = getpid();
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("kvtrim-loadgen: fork");
		return -1;
	}
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 ||
		    getppid() != parent)
			_exit(1);
		close(pfd[0]);
		int st = child_main(o, m, has_model, client, gen, pfd[1]);
		fflush(NULL);
		_exit(st);
	}
	return pid;
}

/* Reads every report waiting in the (non-blocking) pipe into tot; got[i]
 * marks that the current generation of engine i reported. */
static void read_reports(int fd, const struct opts *o, const uint32_t *gens,
                         uint8_t *got, struct totals *tot)
{
	struct report r;
	ssize_t n;
	while ((n = read(fd, &r, sizeof(r))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(r) || r.client >= o->clients)
			return; /* EAGAIN: none left */
		if (r.gen == gens[r.client])
			got[r.client] = 1;
		tot->syncs += r.syncs;
		tot->appended += r.appended;
		tot->kept += r.kept;
		tot->mismatches += r.mismatches;
		tot->full_retries += r.full_retries;
		tot->pressure_evicted += r.pressure_evicted;
		if (r.memory >= 0 && tot->memory == -1)
			tot->memory = r.memory;
		else if (r.memory >= 0 && r.memory != tot->memory)
			tot->memory = -2;
		for (uint32_t b = 0; b < LAT_BUCKETS; b++)
			tot->lat[b] += r.lat[b];
	}
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse_args(argc, argv, &o) < 0)
		return 2;
	static char spec[KVT_SPEC_MAX + 160];
	if (prepare_policy(&o, spec, sizeof(spec)) < 0) {
		scratch_remove(&o);
		return 2;
	}
	struct model m;
	char why[256];
	int has_model = 0;
	if (o.verify) {
		int mr = model_parse(o.policy, &m, why, sizeof(why));
		if (mr < 0) {
			fprintf(stderr, "verify: %s\n", why);
			scratch_remove(&o);
			return 2;
		}
		has_model = mr == 0;
	}

	int pfd[2];
	if (pipe(pfd) < 0) {
		perror("kvtrim-loadgen: pipe");
		return 2;
	}
	pid_t *pids = calloc(o.clients, sizeof(*pids));
	uint32_t *gens = calloc(o.clients, sizeof(*gens));
	uint8_t *got = calloc(o.clients, 1);
	if (!pids || !gens || !got) {
		fprintf(stderr, "kvtrim-loadgen: out of memory\n");
		return 2;
	}
	double t0 = now_s();
	uint32_t started = 0, running = 0, respawned = 0;
	for (; started < o.clients; started++) {
		if ((pids[started] = spawn(&o, &m, has_model, started, 0,
		                           pfd)) < 0)
			break;
		running++;
	}
	/* The read end only polls: reports are written before a child
	 * exits, so after its waitpid they are all in the pipe.  The write
	 * end stays open here for engines respawned later. */
	int fl = fcntl(pfd[0], F_GETFL);
	if (fl < 0 || fcntl(pfd[0], F_SETFL, fl | O_NONBLOCK) < 0) {
		perror("kvtrim-loadgen: pipe");
		return 2;
	}

	struct totals tot = {.memory = -1};
	uint32_t killed = 0, failed = started < o.clients;
	while (running) {
		int st;
		pid_t pid = waitpid(-1, &st, 0);
		if (pid < 0) {
			if (errno == EINTR)
				continue;
			perror("kvtrim-loadgen: waitpid");
			failed += running;
			break;
		}
		read_reports(pfd[0], &o, gens, got, &tot);
		uint32_t i = 0;
		while (i < started && pids[i] != pid)
			i++;
		if (i == started)
			continue; /* not an engine of ours */
		running--;
		int sigkill = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
		if (sigkill && ((i == 0 && o.kill_after && !gens[i]) ||
		                o.expect_kills)) {
			killed++;
			if (o.expect_kills && respawned < o.respawn) {
				pid_t np = spawn(&o, &m, has_model, i,
				                 gens[i] + 1, pfd);
				if (np > 0) {
					pids[i] = np;
					gens[i]++;
					got[i] = 0;
					respawned++;
					running++;
				}
			}
			continue;
		}
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !got[i]) {
			if (WIFSIGNALED(st))
				fprintf(stderr, "loadgen[%u]: killed by signal "
				        "%d\n", i, WTERMSIG(st));
			failed++;
		}
	}
	read_reports(pfd[0], &o, gens, got, &tot);
	close(pfd[0]);
	close(pfd[1]);

	double elapsed = now_s() - t0;
	const char *verdict = !o.verify ? "off"
	                      : (tot.mismatches || failed) ? "fail" : "ok";
	const char *memory = tot.memory == KVT_MEMORY_HOST   ? "host"
	                     : tot.memory == KVT_MEMORY_CUDA ? "cuda"
	                     : tot.memory == -2              ? "mixed"
	                                                     : "unknown";
	printf("loadgen: clients=%u seqs=%u steps=%u policy=%s syncs=%" PRIu64
	       " appended=%" PRIu64 " kept=%" PRIu64 " evicted=%" PRIu64
	       " mismatches=%" PRIu64 " verify=%s killed=%u failed=%u "
	       "elapsed_s=%.3f sync_p50_us=%.0f sync_p99_us=%.0f "
	       "sync_max_us=%.0f full_retries=%" PRIu64 " respawned=%u "
	       "pressure_evicted=%" PRIu64 " memory=%s\n",
	       o.clients, o.seqs, o.steps, o.policy, tot.syncs, tot.appended,
	       tot.kept, tot.appended > tot.kept ? tot.appended - tot.kept : 0,
	       tot.mismatches, verdict, killed, failed, elapsed,
	       lat_quantile(tot.lat, 0.50), lat_quantile(tot.lat, 0.99),
	       lat_quantile(tot.lat, 1.0), tot.full_retries, respawned,
	       tot.pressure_evicted, memory);
	free(gens);
	free(pids);
	free(got);
	policy_free(o.pol);
	scratch_remove(&o);
	return failed || tot.mismatches ? 1 : 0;
}
