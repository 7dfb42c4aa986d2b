/*
 * seq.c — sequences (open, close) and libkvtrim's data plane: list records,
 * page and K/V pointers, staged inputs, all read from the shared segments
 * without a round trip, and the query that resolves a sync left in doubt.
 * A sequence whose sync is in flight (kvt_sync_async) is busy: its records
 * may change under the caller until kvt_wait; one in doubt likewise until
 * kvt_seq_query.  See client.h.
 */
#include "client.h"

#include <string.h>

#include "seqid.h"
#include "shm.h"

int client_seq_lookup(const kvt_client *c, kvt_seq seq, uint32_t *slot)
{
	uint32_t s = seqid_slot(seq);
	if (s >= c->cfg.max_seqs || !c->seqs[s].open || c->seqs[s].id != seq)
		return KVT_ENOSEQ;
	*slot = s;
	return 0;
}

/* The list record of an open, idle sequence, after checking every index. */
int client_list_of(const kvt_client *c, kvt_seq seq, uint32_t layer,
                          uint32_t kv_head, const struct shm_list **out)
{
	uint32_t slot;
	if (client_lost(c))
		return KVT_ECONN;
	int rc = client_seq_lookup(c, seq, &slot);
	if (rc < 0)
		return rc;
	if (c->seqs[slot].busy || c->seqs[slot].doubt)
		return KVT_EBUSY;
	if (layer >= c->mem.g.n_layers || kv_head >= c->mem.g.n_kv_heads)
		return KVT_EINVAL;
	*out = shm_list_at(c->mem.table, &c->mem.g, slot, layer, kv_head);
	return 0;
}

void client_seq_doubt(kvt_client *c, kvt_seq seq, int rc)
{
	uint32_t slot;
	if ((rc == KVT_ETIMEDOUT || rc == KVT_EPROTO) &&
	    client_seq_lookup(c, seq, &slot) == 0)
		c->seqs[slot].doubt = 1;
}

/* ---------------------------------------------------------------- sequences */

/* The slot of seq for a call that changes it: KVT_ENOSEQ, or KVT_EBUSY
 * while its async sync is in flight, with the reason in last_error. */
static int seq_idle(kvt_client *c, const char *call, kvt_seq seq,
                    uint32_t *slot)
{
	if (client_seq_lookup(c, seq, slot) < 0) {
		client_set_err(c, "%s: no open sequence %#llx on this client "
		               "(closed, never opened, or another client's)",
		               call, (unsigned long long)seq);
		return KVT_ENOSEQ;
	}
	if (c->seqs[*slot].busy) {
		client_set_err(c, "%s: sequence %#llx has a sync in flight "
		               "(kvt_sync_async): kvt_wait its ticket first",
		               call, (unsigned long long)seq);
		return KVT_EBUSY;
	}
	return 0;
}

/*
 * kvt_seq_open and kvt_seq_fork: a seq_open request, copying `from` when
 * nonzero.  A request without a verdict may have opened a sequence whose
 * id never came back: the next open has it closed.  Any verdict means
 * this request, undo included, was handled.
 */
static int seq_open_req(kvt_client *c, kvt_seq from, kvt_seq *out)
{
	struct ipc_req req;
	struct ipc_rep rep;
	client_req_init(c, IPC_OP_SEQ_OPEN, &req);
	req.u.open.no = ++c->req_no;
	req.u.open.undo = c->open_undo;
	req.u.open.from = from;
	int rc = client_rpc(c, &req, &rep, c->cfg.timeout_ms);
	if (rc == KVT_ETIMEDOUT || rc == KVT_EPROTO) {
		if (!c->open_undo)
			c->open_undo = req.u.open.no;
	} else if (rc != KVT_ECONN) {
		c->open_undo = 0;
	}
	if (rc == 0) {
		uint64_t seq = rep.u.seq;
		uint32_t slot = seqid_slot(seq);
		if (slot >= c->cfg.max_seqs ||
		    !seqid_of_tenant(seq, c->tenant)) {
			client_set_err(c, "kvtrimd returned sequence %#llx "
			               "outside max_seqs %u or not of tenant %u",
			               (unsigned long long)seq, c->cfg.max_seqs,
			               c->tenant);
			rc = KVT_EPROTO;
		} else {
			c->seqs[slot] = (struct seq_slot){
				.id = seq, .open = 1, .room = c->cfg.headroom};
			*out = seq;
			/* New pages (and maybe chunks) in the device table. */
			rc = client_device_after(c);
		}
	}
	codec_rep_free(&rep);
	return rc;
}

int kvt_seq_open(kvt_client *c, kvt_seq *out)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (!out) {
		client_set_err(c, "kvt_seq_open: out is NULL");
		return KVT_EINVAL;
	}
	return seq_open_req(c, 0, out);
}

int kvt_seq_fork(kvt_client *c, kvt_seq from, kvt_seq *out)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (!out) {
		client_set_err(c, "kvt_seq_fork: out is NULL");
		return KVT_EINVAL;
	}
	uint32_t slot;
	int rc = seq_idle(c, "kvt_seq_fork", from, &slot);
	if (rc < 0)
		return rc;
	if (c->seqs[slot].doubt) {
		client_set_err(c, "kvt_seq_fork: a sync of sequence %#llx ended "
		               "without a verdict: kvt_seq_query it first",
		               (unsigned long long)from);
		return KVT_ESTALE;
	}
	return seq_open_req(c, from, out);
}


int kvt_seq_close(kvt_client *c, kvt_seq seq)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	uint32_t slot;
	int rc = seq_idle(c, "kvt_seq_close", seq, &slot);
	if (rc < 0)
		return rc;
	struct ipc_req req;
	struct ipc_rep rep;
	client_req_init(c, IPC_OP_SEQ_CLOSE, &req);
	req.u.seq = seq;
	rc = client_rpc(c, &req, &rep, c->cfg.timeout_ms);
	codec_rep_free(&rep);
	/* ENOSEQ: the daemon no longer knows it either; forget it here. */
	if (rc == 0 || rc == KVT_ENOSEQ)
		c->seqs[slot].open = 0;
	if (rc == 0)
		rc = client_device_after(c);
	return rc;
}

int kvt_seq_headroom(kvt_client *c, kvt_seq seq, uint32_t entries)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	if (client_lost(c))
		return KVT_ECONN;
	uint32_t slot;
	int rc = client_seq_lookup(c, seq, &slot);
	if (rc < 0) {
		client_set_err(c, "kvt_seq_headroom: no open sequence %#llx on "
		               "this client (closed, never opened, or another "
		               "client's)", (unsigned long long)seq);
		return rc;
	}
	if (entries > c->cfg.headroom) {
		client_set_err(c, "headroom %u beyond the registration's %u",
		               entries, c->cfg.headroom);
		return KVT_EHEADROOM;
	}
	c->seqs[slot].want = entries;
	return 0;
}

int kvt_seq_reserve(kvt_client *c, kvt_seq seq, uint32_t entries)
{
	if (!c)
		return KVT_EINVAL;
	uint32_t slot;
	int rc = seq_idle(c, "kvt_seq_reserve", seq, &slot);
	if (rc < 0)
		return rc;
	uint32_t want = c->seqs[slot].want;
	if ((rc = kvt_seq_headroom(c, seq, entries)) < 0)
		return rc;
	uint32_t room = c->seqs[slot].room;
	if ((entries ? entries : c->cfg.headroom) <= room)
		return 0;
	struct kvt_sync_item it = {seq, 0, KVT_PHASE_PREFILL, 0, 0};
	rc = kvt_sync(c, &it, 1);
	/* Refused: nothing changed, so neither does the headroom asked.  In
	 * doubt (timed out) the query that resolves it tells. */
	if (rc < 0 && rc != KVT_ETIMEDOUT && rc != KVT_EPROTO &&
	    client_seq_lookup(c, seq, &slot) == 0)
		c->seqs[slot].want = want;
	return rc;
}

/*
 * A sync in doubt, numbered no, was found applied: kvt_last_sync's count
 * takes it once, though it may have named several sequences, each of
 * them in doubt until queried (counted: this one's was counted already).
 */
static void seq_count_found(kvt_client *c, uint64_t no, int counted)
{
	if (counted)
		return;
	c->last_sync.syncs++;
	for (uint32_t i = 0; i < c->cfg.max_seqs; i++)
		if (c->seqs[i].doubt && c->seqs[i].sent_no == no)
			c->seqs[i].counted = 1;
}

int kvt_seq_query(kvt_client *c, kvt_seq seq, struct kvt_seq_info *out)
{
	if (!c)
		return KVT_EINVAL;
	client_begin(c);
	uint32_t slot;
	int rc = seq_idle(c, "kvt_seq_query", seq, &slot);
	if (rc < 0)
		return rc;
	if (!out) {
		client_set_err(c, "kvt_seq_query: out is NULL");
		return KVT_EINVAL;
	}
	struct ipc_req req;
	struct ipc_rep rep;
	struct seq_slot *s = &c->seqs[slot];
	client_req_init(c, IPC_OP_SEQ_QUERY, &req);
	req.u.query.seq = seq;
	req.u.query.no = ++c->req_no;
	/* The sync in doubt, by number: the daemon answers whether it was
	 * applied, and voids it when not, so a copy still on its way is
	 * refused when it arrives and the answer stays final. */
	req.u.query.after = s->doubt ? s->sent_no : 0;
	rc = client_rpc(c, &req, &rep, c->cfg.timeout_ms);
	if (rc == 0) {
		const struct ipc_seq_state *q = &rep.u.query;
		int applied = s->doubt && q->last == s->sent_no;
		/* Only this client syncs the sequence: the daemon's counter
		 * is ours, plus one when the sync in doubt was applied. */
		if (q->syncs != s->counter + (uint32_t)applied) {
			client_set_err(c, "kvt_seq_query: kvtrimd counts %u "
			               "syncs of sequence %#llx, this client "
			               "%u%s", q->syncs, (unsigned long long)seq,
			               s->counter, applied ? " and one applied"
			               : "");
			rc = KVT_EPROTO;
		} else {
			*out = (struct kvt_seq_info){
				.syncs = q->syncs,
				.seen_min = q->seen_lo,
				.seen_max = q->seen_hi,
				.len_min = q->len_lo,
				.len_max = q->len_hi,
				.last_sync = !s->doubt ? -1 : applied,
			};
			/* An applied sync left the room it asked for, and
			 * counts among the accepted ones. */
			if (applied) {
				s->room = s->sent;
				seq_count_found(c, s->sent_no, s->counted);
			}
			s->counter = q->syncs;
			s->doubt = 0;
			/* An applied sync's chunks and compaction. */
			rc = client_device_after(c);
		}
	} else if (rc == KVT_ENOSEQ) {
		s->open = 0; /* the daemon no longer knows it either */
	}
	codec_rep_free(&rep);
	return rc;
}

/* ---------------------------------------------------------------- data plane */

int kvt_list_get(const kvt_client *c, kvt_seq seq, uint32_t layer,
                 uint32_t kv_head, struct kvt_list *out)
{
	if (!c || !out)
		return KVT_EINVAL;
	const struct shm_list *l;
	int rc = client_list_of(c, seq, layer, kv_head, &l);
	if (rc < 0)
		return rc;
	out->len = l->len;
	out->n_pages = l->n_pages < c->mem.g.max_pages ? l->n_pages
	                                                : c->mem.g.max_pages;
	out->epoch = l->epoch;
	out->pages = l->pages;
	return 0;
}

void *kvt_page_ptr(const kvt_client *c, uint32_t page)
{
	return c && !client_lost(c) ? mem_page(&c->mem, page) : NULL;
}

int kvt_kv_ptr(const kvt_client *c, kvt_seq seq, uint32_t layer,
               uint32_t kv_head, uint32_t k, void **k_out, void **v_out)
{
	if (!c)
		return KVT_EINVAL;
	const struct shm_geom *g = &c->mem.g;
	const struct shm_list *l;
	int rc = client_list_of(c, seq, layer, kv_head, &l);
	if (rc < 0)
		return rc;
	uint32_t slot = 0;
	client_seq_lookup(c, seq, &slot); /* open: client_list_of said so */
	if (k >= c->seqs[slot].room)
		return KVT_EHEADROOM;
	uint64_t e = (uint64_t)l->len + k;
	uint64_t pi = e / g->page_tokens;
	uint32_t n_pages = l->n_pages < g->max_pages ? l->n_pages
	                                             : g->max_pages;
	/* The daemon promises headroom pages after every sync; a missing
	 * page or an unmapped chunk means it broke the contract. */
	if (pi >= n_pages)
		return KVT_EPROTO;
	char *page = mem_page(&c->mem, l->pages[pi]);
	if (!page)
		return KVT_EPROTO;
	uint64_t row_bytes = (uint64_t)g->head_dim * g->elem_bytes;
	uint64_t row = e % g->page_tokens;
	if (k_out)
		*k_out = page + row * row_bytes;
	if (v_out)
		*v_out = page + (g->page_tokens + row) * row_bytes;
	return 0;
}

/* Entry [x][q][lse] of (seq, layer, pos), or NULL. */
/* The part `input` (KVT_INPUT_*) of a staging entry, NULL when the policy
 * does not read it (the layout then has no room for it). */
static float *stage_entry(const kvt_client *c, kvt_seq seq, uint32_t layer,
                          uint32_t pos, uint32_t input)
{
	uint32_t slot;
	if (!c || client_lost(c) || !c->mem.g.stage_tokens || !c->mem.stage ||
	    !(c->mem.g.stage_inputs & input) ||
	    client_seq_lookup(c, seq, &slot) < 0 || c->seqs[slot].busy ||
	    c->seqs[slot].doubt || layer >= c->mem.g.n_layers)
		return NULL;
	const struct shm_geom *g = &c->mem.g;
	/* Device staging has the host segment's layout (ipc/shm.h). */
	float *e = shm_stage_at(c->mem.dstage.base ? c->mem.dstage.base
	                                           : c->mem.stage,
	                        g, slot, layer, pos);
	return e + (input == KVT_INPUT_Q     ? g->stage_q_off
	            : input == KVT_INPUT_LSE ? g->stage_lse_off
	                                     : 0);
}

float *kvt_stage_x(const kvt_client *c, kvt_seq seq, uint32_t layer,
                   uint32_t pos)
{
	return stage_entry(c, seq, layer, pos, KVT_INPUT_X);
}

float *kvt_stage_q(const kvt_client *c, kvt_seq seq, uint32_t layer,
                   uint32_t pos)
{
	return stage_entry(c, seq, layer, pos, KVT_INPUT_Q);
}

float *kvt_stage_lse(const kvt_client *c, kvt_seq seq, uint32_t layer,
                     uint32_t pos)
{
	return stage_entry(c, seq, layer, pos, KVT_INPUT_LSE);
}
