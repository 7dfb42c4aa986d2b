/*
 * tenant.c — one registered engine's lifecycle; see tenant.h.  Admission
 * (the name, the quota, the estimate of the daemon memory the tenant may
 * cause), the table and staging segments, on a device backend the stream,
 * the two interprocess events and the device table, then free, the
 * accessors and the statistics.  The rest of the module: tenant_int.h.
 */
#include "errors.h"
#include "tenant_int.h"

#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "policy.h"

/* ------------------------------------------------------------ segments */

/*
 * A shared segment of `bytes`, mapped read-write here.  seals are added
 * after the daemon's own mapping exists, so F_SEAL_FUTURE_WRITE leaves that
 * mapping writable and refuses every later writable mapping, write() and
 * hole punch, whoever holds the fd (a reopened /proc/PID/fd path too: seals
 * belong to the file).  Sealing beats sending an O_RDONLY fd reopened
 * through /proc: the client could reopen that one read-write.
 */
static int segment_new(const char *name, uint64_t bytes, unsigned seals,
                       int *fd_out, void **map_out)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return KVT_ESYS;
	if (ftruncate(fd, (off_t)bytes) < 0) {
		close(fd);
		return KVT_ESYS;
	}
	void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		close(fd);
		return KVT_ESYS;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | seals |
	                               F_SEAL_SEAL) < 0) {
		munmap(m, bytes);
		close(fd);
		return KVT_ESYS;
	}
	*fd_out = fd;
	*map_out = m;
	return 0;
}

/* ------------------------------------------------------------ device */

/*
 * A policy that reads x alone through a scorer the device can run
 * (policy_ops.scorer): its weights go to the device at registration and at each
 * reload (tenant_reload_policy), once for every tenant with the same
 * weights (tenant_scorer.c), and syncs score x where it is staged
 * (tenant_int.h, struct tdscore).  *out stays NULL for any other policy.
 */
static int scorer_dev_new(const struct tenant *t, const struct policy *p,
                          struct tscorer_hold **out, char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	uint32_t L = t->g.n_layers;
	*out = NULL;
	if (!p->ops->scorer || p->ops->needs != POLICY_NEED_X || p->lookback ||
	    !o->scorer_new || !o->scorer_free || !o->scorer_run)
		return 0;
	const float **w = calloc((size_t)L * KVT_SCORER_TENSORS, sizeof(*w));
	if (!w)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	struct kvt_backend_scorer d = {0};
	for (uint32_t l = 0; l < L; l++)
		p->ops->scorer(p, l, &d, w + (size_t)l * KVT_SCORER_TENSORS);
	d.n_layers = L;
	char why[KVT_ERRTEXT_MAX];
	int rc = tscorer_get(t->pool, o, t->bctx, &d, w, out, why, sizeof(why));
	if (rc)
		return errors_fmt(err, errlen, rc, "scorer of policy %s: %s",
		                  p->ops->name, why);
	return 0;
}

/*
 * Device staging (see tenant_int.h): the rows in device memory, sent to the
 * client after the device table, the host copies a sync reads them into,
 * and the pattern of words that mark a row unstaged (those of
 * tenant_stage_poison: x[0], each query head's q[0] and lse).  Only for
 * policies that read staged inputs, on backends with fill_words.
 */
static int stage_dev_init(struct tenant *t, char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	const struct shm_geom *g = &t->g;
	unsigned need = t->pol->ops->needs;
	if (!(need & POLICY_NEED_STAGED) || !g->stage_tokens ||
	    !g->stage_entry_floats || !o->fill_words)
		return 0;
	uint32_t rows = g->headroom + t->pol->lookback;
	t->dstage.ring = malloc((size_t)rows * g->stage_entry_floats * sizeof(float));
	t->dstage.rsrc = malloc((size_t)rows * sizeof(*t->dstage.rsrc));
	t->dstage.ppat = malloc((1 + 2 * (size_t)g->n_heads) * sizeof(uint32_t));
	t->dstage.prun = malloc(TENANT_POISON_RUNS * sizeof(*t->dstage.prun));
	if (!t->dstage.ring || !t->dstage.rsrc || !t->dstage.ppat || !t->dstage.prun ||
	    tenant_ensure_room((void **)&t->ev, &t->ev_cap, t->n_ev + 1,
	                       sizeof(*t->ev)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	if (need & POLICY_NEED_X)
		t->dstage.ppat[t->dstage.n_ppat++] = 0;
	for (uint32_t h = 0; h < g->n_heads; h++) {
		if (need & POLICY_NEED_Q)
			t->dstage.ppat[t->dstage.n_ppat++] =
				(uint32_t)(g->stage_q_off + (uint64_t)h * g->head_dim);
		if (need & POLICY_NEED_LSE)
			t->dstage.ppat[t->dstage.n_ppat++] = (uint32_t)(g->stage_lse_off + h);
	}
	uint64_t sb = shm_whole_chunks(g->stage_bytes);
	int rc = o->chunk_new(t->bctx, sb, &t->dstage.chunk);
	if (rc)
		return errors_fmt(err, errlen, rc, "%s backend: device staging "
		                  "of %llu bytes: %s", o->name,
		                  (unsigned long long)sb, o->last_error());
	if ((rc = scorer_dev_new(t, t->pol, &t->dscore.scorer, err, errlen)))
		return rc;
	struct tenant_event *e = &t->ev[t->n_ev++];
	*e = (struct tenant_event){
		.type = HANDLE_STAGE_DEV,
		.fd = t->dstage.chunk.fd,
		.size = g->stage_bytes,
	};
	memcpy(e->data, t->dstage.chunk.ipc, sizeof(e->data));
	return 0;
}

/*
 * Device tenant: its stream and the two interprocess events, whose handles
 * are queued for the client (sent before the segments, see tenant.h).
 */
static int device_init(struct tenant *t, char *err, size_t errlen)
{
	const struct kvt_backend_ops *o = t->bops;
	if (!o->stream_new || !o->stream_free || !o->stream_sync ||
	    !o->event_new || !o->event_free || !o->event_record ||
	    !o->stream_wait_event || !o->read_regions || !o->upload_regions ||
	    !o->upload_twin || !o->mem_new || !o->mem_free)
		return errors_fmt(err, errlen, KVT_ENOTSUP, "the %s backend lacks "
		            "what a device tenant needs (streams, events, "
		            "uploads, device memory)", o->name);
	t->ipc_share = o->share(t->bctx) == KVT_BACKEND_SHARE_IPC;
	int rc;
	if ((rc = o->stream_new(t->bctx, &t->dsync.stream)) ||
	    (rc = o->event_new(t->bctx, &t->dsync.ev_writes)) ||
	    (rc = o->event_new(t->bctx, &t->dsync.ev_compact)))
		return errors_fmt(err, errlen, rc, "%s backend: %s", o->name,
		            o->last_error());
	if (tenant_ensure_room((void **)&t->ev, &t->ev_cap, 3, sizeof(*t->ev)))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	const struct kvt_backend_event *evs[2] = {&t->dsync.ev_writes,
	                                          &t->dsync.ev_compact};
	for (uint32_t i = 0; i < 2; i++) {
		struct tenant_event *e = &t->ev[t->n_ev++];
		*e = (struct tenant_event){
			.type = HANDLE_EVENT,
			.slot = i ? HANDLE_EVENT_COMPACT : HANDLE_EVENT_WRITES,
			.fd = -1,
		};
		memcpy(e->data, evs[i]->handle, sizeof(e->data));
	}
	/* The device tables: the shared one a whole number of chunks (the
	 * allocation granularity), the daemon's own exactly the table's
	 * size, both zeroed, then the header; every record starts as the
	 * zeroed host record does (len 0, no pages). */
	uint64_t tb = shm_whole_chunks(t->g.table_bytes);
	struct kvt_backend_region hdr = {0, sizeof(struct shm_table_hdr)};
	t->dtable.dirty = malloc((size_t)2 * t->g.max_seqs * t->lists_per_seq *
	                  sizeof(*t->dtable.dirty));
	if (!t->dtable.dirty)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	if ((rc = o->chunk_new(t->bctx, tb, &t->dtable.shared)) ||
	    (rc = o->mem_new(t->bctx, t->g.table_bytes, &t->dtable.own)) ||
	    (rc = o->upload_twin(t->bctx, t->dtable.own, t->dtable.shared.base, t->table,
	                         &hdr, 1, t->dsync.stream)) ||
	    (rc = o->event_record(t->bctx, &t->dsync.ev_compact, t->dsync.stream)))
		return errors_fmt(err, errlen, rc, "%s backend: device table of "
		                  "%llu bytes: %s", o->name,
		                  (unsigned long long)tb, o->last_error());
	/* Compaction from drop indices resolves pages on the device through
	 * the daemon's chunk bases (tenant_sync keeps them current). */
	if (o->compact_drops && o->mem_new && o->mem_free) {
		size_t bb = (size_t)(t->max_chunks ? t->max_chunks : 1) *
		            sizeof(void *);
		t->dsync.hbases = calloc(1, bb);
		if (!t->dsync.hbases)
			return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
		if ((rc = o->mem_new(t->bctx, bb, (void **)&t->dsync.dbases)))
			return errors_fmt(err, errlen, rc, "%s backend: chunk "
			                  "bases: %s", o->name, o->last_error());
	}
	t->dscore.norms = t->dsync.dbases && t->pol->ops->new_key_norms && o->key_norms;
	struct tenant_event *e = &t->ev[t->n_ev++];
	*e = (struct tenant_event){
		.type = HANDLE_TABLE_DEV,
		.slot = t->max_chunks, /* sizes the client's chunk-base array */
		.fd = t->dtable.shared.fd,
		.size = t->g.table_bytes,
	};
	memcpy(e->data, t->dtable.shared.ipc, sizeof(e->data));
	if ((rc = stage_dev_init(t, err, errlen)))
		return rc;
	return tenant_attn_init(t, err, errlen);
}

static void device_fini(struct tenant *t)
{
	const struct kvt_backend_ops *o = t->bops;
	if (t->dsync.stream) {
		o->stream_sync(t->bctx, t->dsync.stream);
		o->stream_free(t->bctx, t->dsync.stream);
		t->dsync.stream = NULL;
	}
	if (t->dsync.ev_writes.ev)
		o->event_free(t->bctx, &t->dsync.ev_writes);
	if (t->dsync.ev_compact.ev)
		o->event_free(t->bctx, &t->dsync.ev_compact);
	/* VMM: the driver keeps the memory while the client maps it.  Legacy
	 * IPC: the client is gone or said bye (as for the chunks). */
	o->chunk_free(t->bctx, &t->dtable.shared);
	if (t->dtable.own)
		o->mem_free(t->bctx, t->dtable.own);
	t->dtable.own = NULL;
	o->chunk_free(t->bctx, &t->dstage.chunk);
	tscorer_put(t->dscore.scorer);
	t->dscore.scorer = NULL;
	tenant_attn_fini(t);
	if (t->dsync.dbases)
		o->mem_free(t->bctx, t->dsync.dbases);
	t->dsync.dbases = NULL;
	/* the device path's host scratch; tenant_free frees t next */
	void *scratch[] = {t->dscore.jobs, t->dscore.njobs, t->dscore.pre, t->dstage.ring, t->dstage.rsrc,
	                   t->dstage.ppat, t->dstage.prun, t->dtable.dirty, t->dsync.hbases, t->dsync.bdl,
	                   t->dsync.bdrops, t->win.mode, t->win.widx, t->win.wn, t->win.params,
	                   t->win.jobs, t->win.led, t->win.wlen, t->win.out};
	for (size_t i = 0; i < sizeof(scratch) / sizeof(scratch[0]); i++)
		free(scratch[i]);
	t->dtable.dirty = NULL;
}

/* ------------------------------------------------------------ admission */

/* Saturating arithmetic: an estimate that wraps would admit anything. */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
	return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

static uint64_t mul3(uint64_t a, uint64_t b, uint64_t c)
{
	return mul_sat(mul_sat(a, b), c);
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Per entry of one decide(), bytes of the policies' scratch arena: score,
 * protection, ranking and index arrays (policy_select and every policy's
 * decide() stay below this, the arena's 64-byte rounding included). */
#define TENANT_POLICY_ENTRY_BYTES 64u

/* Floats of a row of every staged part: the sync's gathered inputs
 * (t->scr.in) are laid out by part whatever the staging segment holds. */
static uint64_t stage_all_floats(const struct shm_geom *g)
{
	uint64_t q_off, lse_off, n;
	shm_stage_layout(SHM_STAGE_ALL, g->d_model, g->n_heads, g->head_dim,
	                 &q_off, &lse_off, &n);
	return n;
}

/*
 * Each term mirrors an allocation of the tenant module (tenant.c,
 * tenant_seq.c, tenant_pages.c, tenant_sync.c, tenant_check.c), at the size
 * it reaches at its worst (see struct tenant_mem):
 *   seqs    per open slot (tenant_seq_open): n_seen [n_layers] u32, pages
 *           [lists][max_pages] u32, pos [lists][pos_cap] u32, ent
 *           [lists][pos_cap][entry_floats] f32, state [n_layers][state].
 *   lists   struct tenant, seqs [max_seqs], lists [max_seqs][lists], and on
 *           a device backend the dirty-region array (two per list).
 *   chunks  per chunk of the quota: its slot, its free-page stack
 *           [pages_per_chunk] u32, two events and a revocation (both queues
 *           grow by doubling), and tenant_check's bitmap and slot bases.
 *   scratch tenant_new's fixed buffers (moves, pagev, heads, in), the
 *           scratch of the largest sync (every list of every slot, each at
 *           max_tokens entries: scr.drop, newlen, ent and state; on a
 *           device backend blist, bpages, bmoves, bdl, bdrops, hbases
 *           [chunks], device staging's ring, rsrc, prun, ppat, and kbuf,
 *           ksrc for
 *           policies that read K), and the policy arena of one decide
 *           (n_kv_heads lists of max_tokens entries; attention policies add
 *           their weights [n_q][G][len] and key rows [len][head_dim] f32,
 *           n_q <= headroom + lookback), twice, as the arena grows by
 *           doubling; the sync's scratch half again, as tenant_grow grows.
 */
void tenant_memory(const struct shm_geom *g, const struct policy *pol,
                   uint64_t quota, int dev, struct tenant_mem *out)
{
	uint64_t S = g->max_seqs, L = g->n_layers, H = g->n_kv_heads;
	uint64_t LP = L * H, P = (uint64_t)g->max_tokens + g->headroom;
	uint64_t MP = g->max_pages, T = g->max_tokens;
	uint64_t ef = pol->entry_floats, sb = pol->layer_state_bytes;
	uint64_t C = quota / KVT_CHUNK_BYTES, nl = S * LP;
	uint64_t E = mul_sat(nl, T); /* entries of the largest sync */
	unsigned need = pol->ops->needs;
	memset(out, 0, sizeof(*out));

	out->table = g->table_bytes;
	if (dev) /* the shared device copy and the daemon's own */
		out->table = add_sat(add_sat(out->table,
		                             shm_whole_chunks(g->table_bytes)),
		                     g->table_bytes);
	out->stage = g->stage_bytes;
	if (dev && (need & POLICY_NEED_STAGED) && g->stage_entry_floats)
		out->stage = add_sat(out->stage,
		                     shm_whole_chunks(g->stage_bytes));

	uint64_t per_seq = L * 4 + LP * MP * 4;
	per_seq = add_sat(per_seq, mul_sat(LP * P, 4 + 4 * ef));
	per_seq = add_sat(per_seq, mul_sat(L, sb));
	out->seqs = mul_sat(S, per_seq);

	out->lists = sizeof(struct tenant) + S * sizeof(struct tseq) +
	             nl * sizeof(struct tlist);
	if (dev)
		out->lists += 2 * nl * sizeof(struct kvt_backend_region);

	uint64_t per_chunk = sizeof(struct tchunk) +
	                     (uint64_t)g->pages_per_chunk * 4 +
	                     2 * (2 * sizeof(struct tenant_event) +
	                          sizeof(struct tdead)) +
	                     sizeof(uint64_t) + g->pages_per_chunk / 8 + 1;
	out->chunks = mul_sat(C, per_chunk) + 6 * sizeof(struct tenant_event);

	uint64_t sc = T * 2 * 4 + H * MP * sizeof(void *) +
	              H * sizeof(struct policy_head);
	if (need & POLICY_NEED_STAGED)
		sc = add_sat(sc, mul3(g->headroom, stage_all_floats(g), 4));
	/* what tenant_grow grows (and, on a device backend, the few fixed
	 * buffers beside them, counted with them) */
	uint64_t gs = 0;
	gs = add_sat(gs, E);                            /* drop */
	gs = add_sat(gs, nl * 4);                       /* newlen */
	gs = add_sat(gs, mul3(E, ef, 4));               /* scr.ent */
	gs = add_sat(gs, mul3(S, L, sb));               /* scr.state */
	if (dev) {
		gs = add_sat(gs, nl * sizeof(struct kvt_backend_compact));
		gs = add_sat(gs, mul3(nl, MP, sizeof(void *)));
		gs = add_sat(gs, mul_sat(E, 8));        /* bmoves */
		/* compact_drops: bdl, bdrops, hbases */
		gs = add_sat(gs, nl * sizeof(struct kvt_backend_drops));
		gs = add_sat(gs, mul_sat(E, 4));
		gs = add_sat(gs, C * sizeof(void *));
		if (need == POLICY_NEED_X) /* device scorer: pre, jobs */
			gs = add_sat(gs, mul_sat(E, 4) + 2 * S * L * 24);
		if (pol->ops->new_key_norms) /* device norms: pre, njobs */
			gs = add_sat(gs, mul_sat(E, 4) +
			                 nl * sizeof(struct kvt_backend_norm_job));
		if ((need & POLICY_NEED_STAGED) && g->stage_entry_floats)
			gs = add_sat(gs, mul_sat((uint64_t)g->headroom +
			                                 pol->lookback,
			                         g->stage_entry_floats * 4 + 8) +
			                         TENANT_POISON_RUNS *
			                                 sizeof(struct kvt_backend_fill_run) +
			                         (1 + 2 * (uint64_t)g->n_heads) * 4);
		if (need & POLICY_NEED_KV)
			gs = add_sat(gs, mul_sat(H * MP,
			                         (uint64_t)g->page_tokens *
			                                 g->head_dim *
			                                 g->elem_bytes *
			                                 (need & POLICY_NEED_V ? 2
			                                                       : 1) +
			                                 sizeof(void *)));
	}
	sc = add_sat(sc, add_sat(gs, gs / 2));
	uint64_t per_entry = TENANT_POLICY_ENTRY_BYTES;
	if (need & POLICY_NEED_Q) {
		uint64_t G = g->n_heads / g->n_kv_heads;
		uint64_t nq = (uint64_t)g->headroom + pol->lookback;
		per_entry += (uint64_t)g->head_dim * 4 + nq * G * 4;
	}
	sc = add_sat(sc, mul3(2, H * T, per_entry));
	out->scratch = sc;

	uint64_t tot = 0;
	const uint64_t parts[] = {out->table, out->stage, out->seqs, out->lists,
	                          out->chunks, out->scratch};
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
		tot = add_sat(tot, parts[i]);
	out->total = tot;
}

/* "1.5 GiB", "12 MiB", "300 B": sizes in reason texts. */
static const char *human(uint64_t v, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB",
	                                   "PiB", "EiB"};
	double x = (double)v;
	unsigned u = 0;
	while (x >= 1024 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		x /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)v);
	else
		snprintf(buf, len, "%.*f %s", x < 10 ? 1 : 0, x, unit[u]);
	return buf;
}

/*
 * The refusal of a hello whose tenant_memory exceeds the cap: the total,
 * every part, and what to lower for the largest part (it fits
 * KVT_ERRTEXT_MAX: the longest form is about 230 bytes).
 */
static int memory_refusal(const struct tenant_mem *m, uint64_t max, char *err,
                          size_t errlen)
{
	char b[8][16];
	const uint64_t part[] = {m->table, m->stage, m->seqs, m->lists,
	                         m->chunks, m->scratch};
	static const char *const fix[] = {
		"lower max_seqs or max_tokens, or raise page_tokens",
		"lower stage_tokens or max_seqs",
		"lower max_seqs or max_tokens",
		"lower max_seqs",
		"lower quota_bytes, or raise page_tokens",
		"lower max_seqs or max_tokens",
	};
	size_t big = 0;
	for (size_t i = 1; i < sizeof(part) / sizeof(part[0]); i++)
		if (part[i] > part[big])
			big = i;
	return errors_fmt(err, errlen, KVT_EQUOTA,
	            "needs %s of daemon memory, over tenant_memory_max %s "
	            "(table %s, staging %s, sequences %s, lists %s, chunks "
	            "%s, scratch %s): %s",
	            human(m->total, b[0], 16), human(max, b[1], 16),
	            human(m->table, b[2], 16), human(m->stage, b[3], 16),
	            human(m->seqs, b[4], 16), human(m->lists, b[5], 16),
	            human(m->chunks, b[6], 16), human(m->scratch, b[7], 16),
	            fix[big]);
}

int tenant_name_check(const char *name, char *err, size_t errlen)
{
	char q[72]; /* the name escaped, truncated: the reason must fit */
	size_t n = strnlen(name, KVT_NAME_MAX);
	if (n >= KVT_NAME_MAX)
		return errors_fmt(err, errlen, KVT_EINVAL, "tenant name longer "
		                  "than %d bytes", KVT_NAME_MAX - 1);
	if (!n)
		return errors_fmt(err, errlen, KVT_EINVAL, "empty tenant name");
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)name[i];
		int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		         (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
		         ch == '-' || ch == '@' || ch == ':';
		if (!ok || (i == 0 && ch >= '0' && ch <= '9')) {
			errors_quote(q, sizeof(q), name);
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "tenant name \"%s\": %s (names are 1..%d "
			            "bytes of A-Z a-z 0-9 . _ - @ :, not "
			            "starting with a digit)", q,
			            ok ? "starts with a digit"
			               : "byte outside the name characters",
			            KVT_NAME_MAX - 1);
		}
	}
	return 0;
}

/*
 * The quota of a hello asking none: default_quota, or the fair share
 * pool / expected_tenants in whole chunks (at least one), capped by
 * max_quota and by the pool.
 */
static uint64_t default_quota_of(const struct tenant_limits *lim,
                                 uint64_t pool_bytes)
{
	uint64_t q = lim->default_quota;
	if (!q) {
		uint64_t n = lim->expected_tenants ? lim->expected_tenants : 1;
		q = pool_bytes / n / KVT_CHUNK_BYTES * KVT_CHUNK_BYTES;
		if (q < KVT_CHUNK_BYTES)
			q = KVT_CHUNK_BYTES;
	}
	if (lim->max_quota && q > lim->max_quota)
		q = lim->max_quota;
	return q < pool_bytes ? q : pool_bytes;
}

/* The first model= value of a spec ("name:k=v,...") that is not an
 * absolute path, or NULL (docs/weights.md, "Paths"). */
static const char *relative_model(const char *spec)
{
	const char *p = strchr(spec, ':');
	while (p) {
		p++;
		if (!strncmp(p, "model=", 6) && p[6] != '/')
			return p + 6;
		p = strchr(p, ',');
	}
	return NULL;
}

/* tenant_new's first step: the geometry the hello asks for, with the
 * defaults filled in and every staged part laid out (the policy, created
 * from it, says which it reads), and the tenant's name. */
static int admit_geometry(const struct ipc_hello *h, uint32_t id,
                          struct shm_geom *g, char name[KVT_NAME_MAX],
                          char *err, size_t errlen)
{
	uint32_t page_tokens = h->page_tokens ? h->page_tokens
	                                      : TENANT_DEF_PAGE_TOKENS;
	uint32_t max_seqs = h->max_seqs ? h->max_seqs : TENANT_DEF_MAX_SEQS;
	uint32_t max_tokens = h->max_tokens ? h->max_tokens
	                                    : TENANT_DEF_MAX_TOKENS;
	/* Default headroom: one page, but never more than a list can hold. */
	uint32_t headroom = h->headroom ? h->headroom
	                    : page_tokens < max_tokens ? page_tokens
	                                               : max_tokens;
	int rc = shm_geom_init(g, &h->geo, (enum kvt_dtype)h->dtype,
	                       page_tokens, max_seqs, max_tokens, headroom,
	                       h->stage_tokens, SHM_STAGE_ALL, err, errlen);
	if (rc)
		return rc;
	if (h->name[0] && (rc = tenant_name_check(h->name, err, errlen)))
		return rc;
	if (h->name[0])
		snprintf(name, KVT_NAME_MAX, "%s", h->name);
	else
		snprintf(name, KVT_NAME_MAX, "tenant-%" PRIu32, id);
	return 0;
}

/* tenant_new's quota: the hello's, or the default share of the pool;
 * whole chunks, at least one, at most the pool. */
static int admit_quota(struct pool *pool, const struct tenant_limits *lim,
                       const struct ipc_hello *h, uint64_t *out, char *err,
                       size_t errlen)
{
	uint64_t pool_bytes = pool_bytes_total(pool);
	uint64_t quota = h->quota_bytes;
	if (!quota)
		quota = default_quota_of(lim, pool_bytes);
	if (quota > pool_bytes)
		return errors_fmt(err, errlen, KVT_EQUOTA,
		            "quota of %llu bytes exceeds the pool (%llu bytes)",
		            (unsigned long long)quota,
		            (unsigned long long)pool_bytes);
	if (quota < KVT_CHUNK_BYTES)
		return errors_fmt(err, errlen, KVT_EQUOTA,
		            "quota of %llu bytes is below one chunk (%llu bytes)",
		            (unsigned long long)quota,
		            (unsigned long long)KVT_CHUNK_BYTES);
	/* Chunks are the unit of quota: what a part chunk would add can
	 * never be held, so the quota is what is usable (and reported). */
	*out = quota / KVT_CHUNK_BYTES * KVT_CHUNK_BYTES;
	return 0;
}

/* tenant_new's policy: created from the hello's spec on the geometry g,
 * whose staging is then laid out again with only the inputs it reads.
 * On failure nothing is left to free. */
static int admit_policy(const struct ipc_hello *h, struct shm_geom *g,
                        struct policy **out, char *err, size_t errlen)
{
	const char *rel = relative_model(h->policy);
	if (rel)
		return errors_fmt(err, errlen, KVT_EPOLICY,
		            "model=%.*s is a relative path: kvtrimd opens weights "
		            "itself, as its own user and from its own working "
		            "directory, so give an absolute one (libkvtrim makes "
		            "relative paths absolute against the engine's)",
		            (int)strcspn(rel, ","), rel);
	struct policy *pol = NULL;
	struct policy_geom pg = {
		.n_layers = g->n_layers, .n_heads = g->n_heads,
		.n_kv_heads = g->n_kv_heads, .head_dim = g->head_dim,
		.d_model = g->d_model, .page_tokens = g->page_tokens,
		.dtype = (enum kvt_dtype)h->dtype, .headroom = g->headroom,
	};
	int rc = policy_create(h->policy[0] ? h->policy : TENANT_DEF_POLICY,
	                       &pg, &pol, err, errlen);
	if (rc)
		return rc;
	/* A sync stages up to headroom new rows; lookback rows before them
	 * must survive in the ring. */
	if ((pol->ops->needs & POLICY_NEED_STAGED) &&
	    g->stage_tokens < (uint64_t)g->headroom + pol->lookback) {
		rc = errors_fmt(err, errlen, KVT_EPOLICY,
		          "policy '%s' needs staged inputs: stage_tokens must be "
		          ">= headroom + %u = %llu, got %u", pol->ops->name,
		          pol->lookback,
		          (unsigned long long)g->headroom + pol->lookback,
		          g->stage_tokens);
		policy_free(pol);
		return rc;
	}
	/* The staging segment holds only what the policy reads (the same
	 * checks passed above; only the entry layout changes). */
	rc = shm_geom_init(g, &h->geo, (enum kvt_dtype)h->dtype,
	                   g->page_tokens, g->max_seqs, g->max_tokens,
	                   g->headroom, h->stage_tokens,
	                   policy_inputs_of(pol->ops->needs), err, errlen);
	if (rc) {
		policy_free(pol);
		return rc;
	}
	*out = pol;
	return 0;
}

/* tenant_new's host memory: the slots, lists, chunks and fixed scratch of
 * t (its geometry, policy and quota set), then its table and staging
 * segments.  On failure the caller frees t. */
static int alloc_host(struct tenant *t, char *err, size_t errlen)
{
	const struct shm_geom *g = &t->g;
	int staged = !!(t->pol->ops->needs & POLICY_NEED_STAGED);
	t->chunks = calloc(t->max_chunks, sizeof(*t->chunks));
	t->seqs = calloc(g->max_seqs, sizeof(*t->seqs));
	t->lists = calloc((size_t)g->max_seqs * t->lists_per_seq,
	                  sizeof(*t->lists));
	t->scr.moves = malloc((size_t)g->max_tokens * 2 * sizeof(uint32_t));
	t->scr.pagev = malloc((size_t)g->n_kv_heads * g->max_pages *
	                      sizeof(void *));
	t->scr.heads = calloc(g->n_kv_heads, sizeof(*t->scr.heads));
	if (staged)
		t->scr.in = malloc((size_t)g->headroom * stage_all_floats(g) *
		                   sizeof(float));
	if (!t->chunks || !t->seqs || !t->lists || !t->scr.moves ||
	    !t->scr.pagev || !t->scr.heads || (staged && !t->scr.in))
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < t->max_chunks; i++)
		t->chunks[i].pc.fd = -1;
	for (uint32_t i = 0; i < g->max_seqs; i++)
		t->seqs[i].gen = 1;
	if (segment_new("kvtrim-table", g->table_bytes, F_SEAL_FUTURE_WRITE,
	                &t->table_fd, &t->table) ||
	    segment_new("kvtrim-stage", g->stage_bytes, 0, &t->stage_fd,
	                &t->stage))
		return errors_fmt(err, errlen, KVT_ESYS,
		            "cannot create the table and staging segments");
	shm_table_init(t->table, g);
	shm_stage_init(t->stage, g);
	return 0;
}

int tenant_new(struct pool *pool, uint32_t id, const struct ipc_hello *h,
               struct tenant_limits *lim, struct tenant **out, char *err,
               size_t errlen)
{
	*out = NULL;
	lim->memory_need = 0;
	struct shm_geom g;
	char name[KVT_NAME_MAX];
	uint64_t quota = 0;
	struct policy *pol = NULL;
	int rc = admit_geometry(h, id, &g, name, err, errlen);
	if (rc || (rc = admit_quota(pool, lim, h, &quota, err, errlen)) ||
	    (rc = admit_policy(h, &g, &pol, err, errlen)))
		return rc;
	void *bctx;
	struct tenant_mem mem;
	tenant_memory(&g, pol, quota, !pool_backend(pool, &bctx)->host_visible,
	              &mem);
	lim->memory_need = mem.total;
	if (mem.total > lim->memory_max) {
		policy_free(pol);
		return memory_refusal(&mem, lim->memory_max, err, errlen);
	}

	struct tenant *t = calloc(1, sizeof(*t));
	if (!t) {
		policy_free(pol);
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	}
	t->id = id;
	memcpy(t->name, name, sizeof(t->name));
	t->mem = mem;
	t->g = g;
	t->pol = pol;
	t->pool = pool;
	t->quota = quota;
	t->max_chunks = (uint32_t)(quota / KVT_CHUNK_BYTES);
	memcpy(t->acct, lim->acct, sizeof(t->acct));
	t->lists_per_seq = g.n_layers * g.n_kv_heads;
	t->pos_cap = g.max_tokens + g.headroom;
	t->alloc_cur = TENANT_NO_CHUNK;
	t->table_fd = t->stage_fd = -1;
	t->ef = pol->entry_floats;
	t->sbytes = pol->layer_state_bytes;
	if ((rc = alloc_host(t, err, errlen))) {
		tenant_free(t);
		return rc;
	}
	t->bops = pool_backend(pool, &t->bctx);
	t->dev = !t->bops->host_visible;
	if (t->dev && (rc = device_init(t, err, errlen))) {
		tenant_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

void tenant_free(struct tenant *t)
{
	if (!t)
		return;
	/* Queued device work first: it may still touch the chunks. */
	if (t->dev && t->dsync.stream)
		t->bops->stream_sync(t->bctx, t->dsync.stream);
	if (t->chunks)
		for (uint32_t i = 0; i < t->max_chunks; i++) {
			pool_chunk_free(t->pool, &t->chunks[i].pc);
			free(t->chunks[i].free);
		}
	/* A client that is gone closed its IPC mappings by exiting; one
	 * that said bye is past using them (kvt_disconnect). */
	for (uint32_t i = 0; i < t->n_dead; i++)
		pool_chunk_free(t->pool, &t->dead[i].pc);
	if (t->dev)
		device_fini(t);
	if (t->seqs)
		for (uint32_t i = 0; i < t->g.max_seqs; i++)
			tenant_seq_release(&t->seqs[i]);
	if (t->table)
		munmap(t->table, t->g.table_bytes);
	if (t->stage)
		munmap(t->stage, t->g.stage_bytes);
	if (t->table_fd >= 0)
		close(t->table_fd);
	if (t->stage_fd >= 0)
		close(t->stage_fd);
	policy_free(t->pol);
	free(t->chunks);
	free(t->dead);
	free(t->ev);
	free(t->seqs);
	free(t->lists);
	free(t->scr.drop);
	free(t->dsync.ldrop);
	free(t->scr.newlen);
	free(t->scr.moves);
	free(t->scr.pagev);
	free(t->scr.ent);
	free(t->scr.state);
	free(t->scr.heads);
	free(t->scr.in);
	free(t->dsync.blist);
	free(t->dsync.bpages);
	free(t->dsync.bmoves);
	free(t->dsync.kbuf);
	free(t->dsync.ksrc);
	free(t);
}

uint32_t tenant_id(const struct tenant *t) { return t->id; }
const char *tenant_name(const struct tenant *t) { return t->name; }
const char *tenant_policy_spec(const struct tenant *t) { return t->pol->spec; }
uint32_t tenant_policy_inputs(const struct tenant *t)
{
	return policy_inputs_of(t->pol->ops->needs);
}
int tenant_reload_policy(struct tenant *t, char *err, size_t errlen)
{
	const struct policy *old = t->pol;
	struct policy *np;
	if (!strstr(old->spec, "model="))
		return 0;
	int rc = policy_create(old->spec, &old->geom, &np, err, errlen);
	if (rc)
		return rc;
	if (np->entry_floats != old->entry_floats ||
	    np->layer_state_bytes != old->layer_state_bytes ||
	    np->lookback != old->lookback) {
		policy_free(np);
		return errors_fmt(err, errlen, KVT_EPOLICY,
		                  "the new weights change the policy's state "
		                  "layout; re-register the tenant to use them");
	}
	/* A device scorer and a device rule's uploaded tensors hold a copy
	 * of the weights: the new ones first, so that a failure keeps the
	 * tenant as it was. */
	struct tscorer_hold *sc = NULL;
	if (t->dscore.scorer && (rc = scorer_dev_new(t, np, &sc, err, errlen))) {
		policy_free(np);
		return rc;
	}
	if ((rc = tenant_attn_reload(t, np, err, errlen))) {
		tscorer_put(sc);
		policy_free(np);
		return rc;
	}
	/* the old hold compares the old policy's tensors: gone before it */
	if (t->dscore.scorer) {
		tscorer_put(t->dscore.scorer);
		t->dscore.scorer = sc;
	}
	policy_set_pressure(np, t->pressure);
	policy_free(t->pol);
	t->pol = np;
	return 1;
}

uint64_t tenant_scorer_ns(const struct tenant *t) { return t->scorer_ns; }
uint64_t tenant_sync_cpu_ns(const struct tenant *t) { return t->sync_cpu_ns; }

void tenant_set_gather(struct tenant *t, uint32_t us) { t->gather_us = us; }

float tenant_pressure(const struct tenant *t) { return t->pressure; }

void tenant_set_pressure(struct tenant *t, float level)
{
	policy_set_pressure(t->pol, level);
	t->pressure = t->pol->pressure; /* clamped there */
}
const struct shm_geom *tenant_geom(const struct tenant *t) { return &t->g; }
uint64_t tenant_quota(const struct tenant *t) { return t->quota; }
int tenant_table_fd(const struct tenant *t) { return t->table_fd; }
int tenant_stage_fd(const struct tenant *t) { return t->stage_fd; }

/* Live chunks plus revoked ones not yet destroyed: what the pool counts. */
uint64_t tenant_chunks(const struct tenant *t)
{
	return (uint64_t)t->n_chunks + t->n_dead;
}

int tenant_failed(const struct tenant *t)
{
	return t->dsync.failed;
}

/* ------------------------------------------------------------ stats */

void tenant_stats(const struct tenant *t, struct kvt_tenant_stats *out)
{
	memset(out, 0, sizeof(*out));
	out->pages_used = (uint64_t)t->n_chunks * t->g.pages_per_chunk -
	                  t->free_pages;
	out->entries_kept = t->kept;
	out->pages_free = t->free_pages;
	out->chunks = t->n_chunks;
	out->sequences = t->n_open;
	out->syncs = t->syncs;
	out->entries_appended = t->appended;
	out->entries_evicted = t->evicted;
	out->quota_bytes = t->quota;
	out->daemon_bytes = t->mem.total;
	out->pressure_ppm = (uint64_t)llrint((double)t->pressure * IPC_PRESS_ONE);
	out->budget = t->sync_budget;
}

const struct tenant_mem *tenant_mem_of(const struct tenant *t)
{
	return &t->mem;
}
