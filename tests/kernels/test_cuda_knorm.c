/*
 * test_cuda_knorm.c — the cuda backend's device rule "knorm" (the
 * key-norm baseline's rule on the device, policies/knorm.cu) against the
 * cpu policy's own operations (policies/knorm.c: each new key converted to
 * float, squared and summed in double in index order, sqrt, rounded to
 * float; score -norm; the protection of sinks and window;
 * select_topk_cpu ranked by position; compact_plan's moves): over several
 * syncs of NJ lists of ragged lengths (prefills of different sizes, decode
 * steps, syncs of no token and syncs not due) with the pages compacted by
 * compact_drops between syncs, the drop indices, the positions and the
 * norms (both halves) must be the host's exactly, in a bounded number of
 * launches whatever NJ, for f32 and f16 keys.  Then the refusals, which
 * launch nothing.  Built into kvtrim-cuda-tests and, under the CPU
 * emulator, kvtrim-cuda-emu-tests; skips without a device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compact.h"
#include "dtype.h"
#include "kernels.h"
#include "knorm_rule.h"
#include "test.h"

#define SEL_SEED 47
#include "select_fixture.h"

enum { HD = 8, PT = 4, NP = 12, CAP = NP * PT, NJ = 5, NR = NJ + 2 };

struct kx {
	struct sel_fx fx;
	enum kvt_dtype dt;
	const struct kvt_backend_rule *rule;
	void *state;
	/* per job: its record (job k: NR - 1 - k), the host's positions and
	 * norms, their length, the half they are in, the tokens seen */
	uint32_t pos[NJ][CAP], len[NJ], cur[NJ], seen[NJ];
	float norm[NJ][CAP];
};

static uint32_t kx_rec(uint32_t k) { return NR - 1 - k; }

static void kx_init(struct kx *f, enum kvt_dtype dt)
{
	memset(f, 0, sizeof(*f));
	f->dt = dt;
	sel_init(&f->fx, PT, HD * (uint32_t)kvt_dtype_size(dt), NR, NP);
	f->rule = sel_rule(&f->fx, "knorm", KNORM_RULE_VERSION,
	                   sizeof(struct knorm_rule),
	                   sizeof(struct knorm_rule_job));
	f->state = sel_mem(&f->fx, (size_t)NR * 2 * CAP * 8);
	sel_fill_floats(&f->fx, dt);
}

/* Half h of job k's state, read back: positions and norms. */
static void kx_half(struct kx *f, uint32_t k, uint32_t h, uint32_t *pos,
                    float *norm)
{
	uint32_t buf[2 * CAP];
	T_OK(f->fx.o->copy(f->fx.ctx, buf,
	                   (uint32_t *)f->state +
	                           ((uint64_t)kx_rec(k) * 2 + h) * CAP * 2,
	                   sizeof(buf), NULL));
	memcpy(pos, buf, CAP * 4);
	memcpy(norm, buf + CAP, CAP * 4);
}

/* Whether norms a and b [n] are the same bits, a NaN matching any NaN (a
 * GPU's NaN need not carry the host's payload). */
static int kx_same(const float *a, const float *b, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i])))
			return 0;
	return 1;
}

/* The norm of entry i of job k's list, as knorm_decide takes it. */
static float kx_norm(struct kx *f, uint32_t k, uint32_t i)
{
	void *pv[NP];
	float row[HD];
	sel_pages(&f->fx, kx_rec(k), pv);
	const size_t rb = HD * kvt_dtype_size(f->dt);
	dtype_to_f32((const char *)pv[i / PT] + (size_t)(i % PT) * rb, f->dt,
	             row, HD);
	double ss = 0.0;
	for (uint32_t d = 0; d < HD; d++)
		ss += (double)row[d] * row[d];
	return (float)sqrt(ss);
}

/*
 * One sync: job k gets n_new[k] tokens, budget b[k], due or not; the host
 * does what knorm_decide does, the device rule "knorm"; then both compact.
 * Returns the drops made.
 */
static uint32_t kx_sync(struct kx *f, const uint32_t *n_new, const uint32_t *b,
                        int due, uint32_t sinks, uint32_t window)
{
	struct knorm_rule_job jobs[NJ];
	uint8_t want[NJ][CAP];
	uint32_t nd[NJ], map[NJ], nj = 0, off = 0, total = 0;
	for (uint32_t k = 0; k < NJ; k++) {
		const uint32_t prev = f->seen[k], seen = prev + n_new[k];
		const uint32_t L = f->len[k] + n_new[k];
		for (uint32_t i = 0; i < n_new[k]; i++) {
			f->pos[k][f->len[k] + i] = prev + i;
			f->norm[k][f->len[k] + i] = kx_norm(f, k, f->len[k] + i);
		}
		memset(want[k], 0, sizeof(want[k]));
		nd[k] = 0;
		uint32_t keep = 0;
		if (due && L) {
			float s[CAP];
			uint8_t pr[CAP];
			uint32_t np = 0, scr[CAP];
			for (uint32_t i = 0; i < L; i++) {
				s[i] = -f->norm[k][i];
				const uint32_t p = f->pos[k][i];
				pr[i] = p < sinks ||
				        (window && p + (uint64_t)window >= seen);
				np += pr[i];
			}
			keep = b[k] > np ? b[k] - np : 0;
			nd[k] = select_topk_cpu(s, f->pos[k], pr, L, keep,
			                        want[k], scr);
		}
		if (!L || (!n_new[k] && !due))
			continue;
		map[nj] = k;
		jobs[nj++] = (struct knorm_rule_job){
			.record = kx_rec(k), .cur = f->cur[k], .len = f->len[k],
			.n_new = n_new[k], .n_seen = seen, .due = (uint32_t)due,
			.keep = keep, .n_drop = nd[k], .drop_off = off,
		};
		off += nd[k];
	}
	const struct knorm_rule a = {.state = f->state, .cap = CAP,
	                             .sinks = sinks, .window = window};
	struct kvt_backend_paged pg = sel_paged(&f->fx);
	uint32_t out[2 * NJ + NJ * CAP];
	memset(out, 0xff, sizeof(out));
	if (nj) {
		/* the plan, the scores, the selection's three */
		const uint64_t nl = SEL_LAUNCHES(f->fx.o, f->fx.ctx,
			sel_run(&f->fx, f->rule, &pg, NR, f->dt, 2, 1, HD, &a,
			        jobs, nj, out, 2 * nj + off, NULL));
		T_ASSERT(nl <= 5);
	}
	struct kvt_backend_drops dl[NJ];
	uint32_t drops[NJ * CAP], ndl = 0, at = 0;
	for (uint32_t j = 0; j < nj; j++) {
		const uint32_t k = map[j], L = f->len[k] + jobs[j].n_new;
		T_EQ(out[j], 0);
		sel_check_drops(out, nj, j, L, nd[k], jobs[j].drop_off, want[k]);
		uint32_t hp[CAP];
		float hn[CAP];
		/* the half read is left as it was */
		kx_half(f, k, f->cur[k], hp, hn);
		T_ASSERT(memcmp(hp, f->pos[k], f->len[k] * 4) == 0);
		T_ASSERT(kx_same(hn, f->norm[k], f->len[k]));
		uint32_t moves[2 * CAP], nl;
		uint32_t nm = compact_plan(want[k], L, moves, &nl);
		T_EQ(nl, L - nd[k]);
		for (uint32_t i = 0; i < nm; i++) {
			f->pos[k][moves[2 * i]] = f->pos[k][moves[2 * i + 1]];
			f->norm[k][moves[2 * i]] = f->norm[k][moves[2 * i + 1]];
		}
		void *pv[NP];
		sel_pages(&f->fx, kx_rec(k), pv);
		compact_cpu(pv, PT, HD * kvt_dtype_size(f->dt), moves, nm);
		if (nd[k]) {
			dl[ndl++] = (struct kvt_backend_drops){kx_rec(k), L,
			                                       nd[k], at};
			for (uint32_t i = 0; i < L; i++)
				if (want[k][i])
					drops[at++] = i;
		}
		f->len[k] = nl;
		f->cur[k] ^= 1;
		/* the device's new half: positions and norms, exactly */
		kx_half(f, k, f->cur[k], hp, hn);
		T_ASSERT(memcmp(hp, f->pos[k], nl * 4) == 0);
		T_ASSERT(kx_same(hn, f->norm[k], nl));
		total += nd[k];
	}
	if (ndl)
		T_OK(f->fx.o->compact_drops(f->fx.ctx, &pg, NR, dl, ndl, drops,
		                            NULL));
	T_ASSERT(sel_chunk_same(&f->fx));
	for (uint32_t k = 0; k < NJ; k++)
		f->seen[k] += n_new[k];
	return total;
}

static void run_case(enum kvt_dtype dt, uint32_t sinks, uint32_t window,
                     uint32_t every, int poison)
{
	struct kx f;
	kx_init(&f, dt);
	if (poison) {
		/* keys the engine wrote badly: infinite and NaN norms, which
		 * knorm takes as they are (dropped first: -inf, and NaN
		 * after every number) */
		float *c = (float *)f.fx.h_chunk;
		for (uint64_t i = 0; i < f.fx.chunk_bytes / 4; i += 37)
			c[i] = i % 2 ? INFINITY : NAN;
		sel_put_chunk(&f.fx);
	}
	uint32_t drops = 0, skipped = 0;
	for (uint32_t s = 0; s < 12; s++) {
		uint32_t n[NJ], b[NJ];
		for (uint32_t k = 0; k < NJ; k++) {
			/* ragged prefills, then 0 to 3 tokens a sync */
			n[k] = s == 0 ? 4 + 4 * k : urnd() % 4;
			b[k] = 5 + (k + s) % 7;
			if (f.len[k] + n[k] > CAP)
				n[k] = 0;
		}
		/* every: due at one sync of every (the plan's policy_due
		 * decides it; the rule takes the flag) */
		const int due = !every || s % every == 0;
		drops += kx_sync(&f, n, b, due, sinks, window);
		skipped += !due;
	}
	T_ASSERT(drops > 0);
	T_ASSERT(every < 2 || skipped > 0);
	sel_fini(&f.fx);
}

TEST(cuda, backend_knorm_rule_matches_knorm)
{
	run_case(KVT_DTYPE_F32, 0, 0, 0, 0); /* knorm's defaults */
	run_case(KVT_DTYPE_F32, 2, 3, 0, 0); /* sinks and a window */
	run_case(KVT_DTYPE_F16, 1, 0, 3, 0); /* f16 keys, every 3 */
	run_case(KVT_DTYPE_F32, 1, 2, 0, 1); /* infinite and NaN keys */
}

/* A refused call of the rule: KVT_EINVAL, nothing launched or copied. */
#define REFUSED(params, job)                                                  \
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,                                   \
	                  sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32,      \
	                          2, 1, HD, params, job, 1, out, 16,          \
	                          NULL))

TEST(cuda, backend_knorm_rule_refuses)
{
	struct kx f;
	kx_init(&f, KVT_DTYPE_F32);
	const uint32_t n[NJ] = {9, 9, 9, 9, 9}, b[NJ] = {5, 5, 5, 5, 5};
	kx_sync(&f, n, b, 1, 0, 0);
	const struct knorm_rule_job j = {
		.record = kx_rec(0), .cur = f.cur[0], .len = f.len[0],
		.n_new = 2, .n_seen = 11, .due = 1, .keep = 5, .n_drop = 2,
	};
	const struct knorm_rule a = {.state = f.state, .cap = CAP};
	struct kvt_backend_paged pg = sel_paged(&f.fx);
	uint32_t out[16];
	struct knorm_rule_job bad = j;
	bad.record = NR; /* beyond n_records */
	REFUSED(&a, &bad);
	bad = j;
	bad.cur = 2;
	REFUSED(&a, &bad);
	bad = j;
	bad.len = CAP - 1; /* len + n_new = CAP + 1 */
	REFUSED(&a, &bad);
	bad = j;
	bad.n_seen = 1; /* fewer tokens seen than new ones */
	REFUSED(&a, &bad);
	bad = j;
	bad.n_drop = f.len[0] + 3; /* more drops than entries */
	REFUSED(&a, &bad);
	bad = j;
	bad.drop_off = 13; /* its indices to out[16] of 16 words */
	REFUSED(&a, &bad);
	SEL_REFUSED_UNRUN(f.fx.o, f.fx.ctx,
		sel_run(&f.fx, f.rule, &pg, NR, KVT_DTYPE_F32, 2, 1, 0, &a,
		        &j, 1, out, 16, NULL)); /* head_dim 0 */
	/* the refusals left the half read alone */
	uint32_t hp[CAP];
	float hn[CAP];
	kx_half(&f, 0, f.cur[0], hp, hn);
	T_ASSERT(memcmp(hp, f.pos[0], f.len[0] * 4) == 0);
	T_ASSERT(kx_same(hn, f.norm[0], f.len[0]));
	sel_fini(&f.fx);
}
#undef REFUSED
