/*
 * attn_plan.c — the host's counts of an attention-based rule's jobs on a
 * device (attn_plan.h).
 */
#include "attn_plan.h"

/* 1 when position p is protected by rule r after n_seen tokens. */
static int protected(const struct policy_attn_rule *r, uint32_t p,
                     uint32_t n_seen)
{
	return (r->recent && p + (uint64_t)r->recent >= n_seen) ||
	       p < r->sinks || (r->window && p + (uint64_t)r->window >= n_seen);
}

/* |[0, min(a, n)) u [n - min(b, n), n)|: the positions below a or among
 * the last b of n seen. */
static uint32_t head_tail(uint32_t a, uint32_t b, uint32_t n)
{
	a = a < n ? a : n;
	b = b < n ? b : n;
	uint32_t both = a > n - b ? a - (n - b) : 0;
	return a + b - both;
}

/*
 * The protection covers the sinks and the newest positions (TOVA: its
 * window; KVpop: its delay; H2O: its window or recent half): a position
 * protected now was protected at every sync since it arrived when that
 * tail's start never moved back, so it is still in the list.  Then the
 * counts follow from the positions' numbers alone, without a pass over
 * the list (the device's own counts, of the entries it holds, are checked
 * against these by the tenant: a difference refuses the sync).
 */
struct policy_attn_counts policy_attn_count(const struct policy_attn_rule *r,
                                            uint32_t tail, int due,
                                            const uint32_t *pos, uint32_t len,
                                            uint32_t n_new, uint32_t prev,
                                            int tail_held)
{
	struct policy_attn_counts c = {0};
	const uint32_t seen = prev + n_new, L = len + n_new;
	if (!due)
		return c;
	uint32_t np = 0;
	if (tail_held) {
		np = head_tail(r->sinks, tail, seen);
	} else {
		for (uint32_t k = 0; k < len; k++)
			np += protected(r, pos[k], seen);
		for (uint32_t k = 0; k < n_new; k++)
			np += protected(r, prev + k, seen);
	}
	c.keep = r->budget > np ? r->budget - np : 0;
	c.n_drop = L - np > c.keep ? L - np - c.keep : 0;
	return c;
}

int policy_attn_list_job(const struct policy_attn_rule *r, uint32_t tail,
                         int tail_held, const struct policy_layer *l,
                         const struct policy_dev_layer *c, uint32_t h,
                         uint32_t drop_off, struct policy_dev_job *hj,
                         uint32_t *keep)
{
	const int due = policy_attn_due(r);
	const uint32_t len = c->len[h], L = len + l->n_new;
	if (!L || (!l->n_new && !due))
		return 0; /* nothing changes */
	const uint32_t *pos = NULL;
	if (due && !tail_held && len && !(pos = policy_dev_pos(c, h)))
		return -1;
	struct policy_attn_counts n = policy_attn_count(
		r, tail, due, pos, len, l->n_new, l->n_seen - l->n_new,
		tail_held);
	*hj = (struct policy_dev_job){
		.rec = c->state_rec + h, .g = h, .L = L, .n_drop = n.n_drop,
		.drop_off = drop_off,
	};
	*keep = n.keep;
	return 1;
}
