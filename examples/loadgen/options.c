/*
 * options.c — kvtrim-loadgen's command line: defaults, parsing, and the
 * checks that need several options at once.
 */
#include "loadgen.h"
#include "dtype.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int options_parse(int argc, char **argv, struct opts *o)
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
			else if (dtype_parse(v, &o->dtype)) {
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

uint32_t options_headroom(const struct opts *o)
{
	return o->sync_every > o->page_tokens ? o->sync_every : o->page_tokens;
}
