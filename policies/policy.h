/*
 * policy.h — eviction policies: a small vtable plus the machinery every
 * policy shares (spec parsing, sinks, recent window, budgets).
 *
 * Spec string: "name" or "name:key=value,key=value".  Common keys, parsed
 * once here for every policy (a policy says which it accepts):
 *   sinks=N    first N positions of a sequence are never evicted
 *   window=N   the N most recent positions are never evicted
 *   tokens=N   budget: keep at most N entries per (sequence, layer, head)
 *   ratio=R    budget: evict the fraction R (0 <= R < 1) of the entries
 *              seen, kvpress's "compression_ratio"; keep n - floor(R * n)
 * Unknown keys, repeated keys, malformed numbers and out-of-range values
 * are refused with KVT_EPOLICY and a reason.
 *
 * Contract of decide(): given one list's entries (original positions in
 * list order; the last n_new were committed by this sync) it marks entries
 * to drop with drop[i] = 1 (drop[] arrives zeroed) and returns how many it
 * marked.  It must be a pure function of its input (and the policy's own
 * state), so tests and loadgen can replay it.
 */
#ifndef KVT_POLICY_H
#define KVT_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

/* Inputs a policy needs staged by the engine (bit set). */
enum policy_need {
	POLICY_NEED_X = 1u << 0,
	POLICY_NEED_Q = 1u << 1,
	POLICY_NEED_LSE = 1u << 2,
};

/* Which common keys a policy accepts (bit set). */
enum policy_key {
	POLICY_KEY_SINKS = 1u << 0,
	POLICY_KEY_WINDOW = 1u << 1,
	POLICY_KEY_TOKENS = 1u << 2,
	POLICY_KEY_RATIO = 1u << 3,
};

struct policy_args {
	uint32_t sinks, window, tokens;
	double ratio;
	unsigned set; /* enum policy_key bits actually given in the spec */
};

struct policy_list {
	const uint32_t *pos; /* [len] original positions, list order */
	uint32_t len;        /* entries, including the new ones */
	uint32_t n_new;      /* entries pos[len - n_new .. len) are new */
	uint32_t n_seen;     /* tokens of this (sequence, layer) seen so far */
	uint32_t layer, head;
	enum kvt_phase phase;
};

struct policy;

struct policy_ops {
	const char *name;
	const char *help;  /* one line for --list-policies */
	unsigned needs;    /* enum policy_need bits */
	unsigned keys;     /* enum policy_key bits accepted */
	/* Validates args beyond ranges and applies defaults. (optional) */
	int (*init)(struct policy *p, char *err, size_t errlen);
	uint32_t (*decide)(const struct policy *p, const struct policy_list *l,
	                   uint8_t *drop);
};

struct policy {
	const struct policy_ops *ops;
	struct policy_args args;
	char spec[KVT_SPEC_MAX]; /* as given */
};

/* Parses spec; *out is heap-allocated (policy_free).  KVT_EPOLICY + reason. */
int policy_create(const char *spec, struct policy **out, char *err,
                  size_t errlen);
void policy_free(struct policy *p);

/* Runs decide() on one list; returns the number of entries marked. */
uint32_t policy_decide(const struct policy *p, const struct policy_list *l,
                       uint8_t *drop);

/* Registry, in listing order. */
size_t policy_count(void);
const struct policy_ops *policy_at(size_t i);

/*
 * Shared machinery for decide() implementations: 1 when position pos is
 * protected by the sinks or the recent window of a list that has seen
 * n_seen tokens.
 */
int policy_protected(const struct policy_args *a, uint32_t pos,
                     uint32_t n_seen);

/* Budget of a list: entries to keep out of n_seen (UINT32_MAX = none). */
uint32_t policy_budget(const struct policy_args *a, uint32_t n_seen);

#endif
