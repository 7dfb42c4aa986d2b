/* full.c — the "full" policy: keeps every entry (the no-eviction baseline). */
#include "policy.h"

static int full_decide(struct policy *p, struct policy_layer *l)
{
	return 0;
}

const struct policy_ops full_ops = {
	.name = "full",
	.help = "keep every entry (no eviction)",
	.needs = 0,
	.keys = 0,
	.init = NULL,
	.decide = full_decide,
};
