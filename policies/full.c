/* full.c — the "full" policy: keeps every entry (the no-eviction baseline). */
#include "policy.h"

static uint32_t full_decide(const struct policy *p, const struct policy_list *l,
                            uint8_t *drop)
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
