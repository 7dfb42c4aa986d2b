/*
 * attn_plan_test.c — the device rules' plans (policy_ops.device, with
 * attn_plan.c's counts) against the host rules: at every sync of a run of
 * ragged syncs (prefill, decode, syncs of no token, `every`, pressure that
 * moves h2o's protected tail forward and back, protection beyond the
 * budget, so that the count depends on which protected positions are
 * still held) each job's drop count is the number of entries decide()
 * dropped from its list, a list without a job drops none, and the jobs'
 * offsets follow each other, and the same plans with the positions read
 * back only where the counts need them (a tail that moved back) give the
 * same jobs (policy_fixture.h's fx_plan_sync; kvpop's, which needs
 * weights, in policy_weights_test.c).
 */
#include "policy_fixture.h"

TEST(policy, device_plans_count_the_host_rules_drops)
{
	const char *specs[] = {
		"h2o:tokens=12,window=0",
		"h2o:tokens=14",
		"h2o:tokens=8,sinks=6", /* protects more than it keeps */
		"h2o:tokens=12,window=3,sinks=2,agg=max,every=2",
		"observed_attention:tokens=10,every=3",
		"tova:tokens=10",
		"tova:tokens=9,window=3,sinks=2,every=2",
		"streaming:tokens=10,sinks=2",
		"streaming:ratio=0.5", /* the tail grows with n_seen */
		"streaming:tokens=3,sinks=6", /* sinks beyond the budget */
		"knorm:tokens=10",
		"knorm:tokens=8,sinks=3,window=4,every=3",
		"knorm:tokens=4,sinks=3,window=3", /* protects more */
		"random:tokens=10,seed=3",
		"random:tokens=7,sinks=2,window=3,every=2",
	};
	uint32_t fetched[2] = {0}; /* h2o's, streaming's */
	/* tokens per sync: a prefill, then decode syncs of 0 to 4 */
	for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
		struct fx f;
		fx_init(&f, specs[s], 4, 2);
		T_ASSERT(f.p->ops->device != NULL);
		uint32_t word = 0, seed = 7 + (uint32_t)s;
		fx_plan_sync(&f, 9, &word, &seed);
		for (uint32_t k = 0; f.n_seen + 4 < FX_MAX - 1; k++) {
			/* pressure halves the budget for a while, then eases:
			 * h2o's recent half moves forward, then back, by more
			 * than the syncs of 0 and 1 token that follow bring */
			if (k == 6)
				policy_set_pressure(f.p, 1.0f);
			if (k == 12)
				policy_set_pressure(f.p, 0.0f);
			const uint32_t n = k == 12 ? 0 : k == 13 ? 1
			                   : fx_next(&seed) % 5;
			fx_plan_sync(&f, n, &word, &seed);
		}
		/* h2o's and streaming's tails move back under the pressure
		 * above, and their counts then read the positions (where they
		 * live on the device only: read back); the other rules' tails
		 * are fixed, so they never read one */
		if (!strncmp(specs[s], "h2o", 3))
			fetched[0] += f.fetches;
		else if (!strncmp(specs[s], "streaming", 9))
			fetched[1] += f.fetches;
		else if (strncmp(specs[s], "observed_attention", 18))
			T_EQ(f.fetches, 0);
		policy_free(f.p);
	}
	T_ASSERT(fetched[0] > 0 && fetched[1] > 0);
}
