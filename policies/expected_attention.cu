/*
 * expected_attention.cu — Expected Attention's end-of-prefill rule on the
 * cuda backend, the device rule "expected_attention"
 * (expected_attention_rule.h; struct kvt_backend_rule, backend.h):
 * policies/expected_attention.c's selection computed where the keys, the
 * values and the staged queries are, so that only the drop indices come
 * to the host.  The kept sets are the cpu policy's bit for bit on the CPU
 * emulator: every step repeats ea_decide's operations in its order (each
 * kernel's comment names the host function it follows), and the softmax's
 * max and sum, whose order the bits depend on, run in one thread.
 *
 * A call: the rows' checks beside the plan (batch_select.cuh's, one
 * launch), then every due list in one launch (bc_ea_lists: a block a
 * list in turn, each in a scratch slot of its own: the rotation and the
 * un-rotated queries, the statistics, z with k^T S' k in quad_form_cpu's
 * fixed order in each thread's registers, the softmaxes and the scores),
 * then one segmented top-k and the drop indices over every list: 4
 * launches whatever the call's sequences, layers, heads and lengths.  The
 * steps: docs/cuda.md, "Device ops, step by step".  Scratch: the
 * context's (bc_win_prepare), under its lock; the rule waits for its
 * output.  Built into libkvtrim-cuda.so (backend/cuda/cuda.mk) and
 * registered in backend_cuda.cu's BC_RULES.  Tests:
 * cuda.backend_expected_attention_rule_matches_naive, _launches and the
 * emulated passes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.cuh"
#include "common.cuh"
#include "expected_attention_rule.h"

typedef expected_attention_rule ea_rule;
typedef expected_attention_rule_job ea_job;

/* What batch_select.cuh asks of a job: its list is its record; no band;
 * no state (the half is unused). */
static __device__ __forceinline__ uint32_t
bc_bs_srec(const ea_job &j) { return j.record; }
static __device__ __forceinline__ int
bc_bs_band(const ea_job &, uint32_t) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_band_n(const ea_job &) { return 0; }
static __device__ __forceinline__ uint32_t
bc_bs_next_half(const ea_job &) { return 0; }

#include "batch_select.cuh"

#define BC_EA_THREADS 256

/* q of position p of a job's ring. */
static __device__ __forceinline__ const float *
bc_ea_q(const ea_rule &a, const ea_job &j, uint32_t p)
{
	return bc_es_row(j.ring, a.rows, p) + a.rows.q_off;
}

/* RoPE frequency of pair k, as ea_freq (and model_rope) computes it. */
static __device__ __forceinline__ float bc_ea_freq(float theta, uint32_t k,
                                                   uint32_t hd)
{
	return 1.0f / powf(theta, (float)(2 * k) / (float)hd);
}

/*
 * One launch of n + 1 blocks: block k < n checks job k's rows [from, len
 * + n_new), every q value of every query head (out[k] = 1 when one is not
 * finite: the cpu policy refuses such a sync), block n plans the due
 * lists (bc_bs_plan_dev).
 */
__global__ void bc_ea_check_plan(const ea_job *jobs, uint32_t n,
                                 const ea_rule a, uint32_t nq, uint32_t *out,
                                 uint32_t *at, uint32_t *first,
                                 uint32_t *keep, struct bc_seg *segs)
{
	__shared__ uint64_t sum[BC_BS_THREADS + 1][3];
	__shared__ uint32_t bad;
	if (blockIdx.x == n) {
		bc_bs_plan_dev(jobs, n, 0, at, NULL, first, keep, segs, sum);
		return;
	}
	const ea_job j = jobs[blockIdx.x];
	if (threadIdx.x == 0)
		bad = 0;
	__syncthreads();
	const uint64_t tot = (uint64_t)(j.len - j.from + j.n_new) * nq;
	uint32_t mine = 0;
	for (uint64_t e = threadIdx.x; e < tot; e += blockDim.x)
		mine |= !isfinite(bc_ea_q(a, j, j.from + (uint32_t)(e / nq))[e % nq]);
	if (mine)
		atomicOr(&bad, 1u);
	__syncthreads();
	if (threadIdx.x == 0)
		out[blockIdx.x] = bad;
}

/* Lists in flight at once: a block each, each with its scratch slot, the
 * blocks taking the call's due lists in turn.  Bounds the scratch (a slot
 * is about 0.5 MB at the 8B geometry and a 4K prompt) whatever the
 * sync's lists, and keeps every SM of an H200 busy with two blocks. */
#define BC_EA_SLOTS 256u

/* One slot's arrays, for the list its block holds: rc [hd] (the future
 * rotation), qs [N][G][hd] (the un-rotated queries), mu [G][hd] and (cov)
 * S' [G][hd][hd] of its query heads, z and acc [L] (a head's scores, then
 * their exps; the sum over the heads). */
struct bc_ea_slot {
	double *rc, *mu, *z, *acc;
	float *qs, *S;
};

/* A call's due lists segs [nseg] (the plan's) and its slots: stride
 * bytes apart from base, the arrays at the offsets o_* within each. */
struct bc_ea_due {
	const ea_job *jobs;
	const struct bc_seg *segs;
	uint32_t nseg, G, hd;
	char *base;
	uint64_t stride, o_rc, o_qs, o_mu, o_S, o_z, o_acc;
};

static __device__ __forceinline__ struct bc_ea_slot
bc_ea_slot_of(const struct bc_ea_due &T, uint32_t k)
{
	char *b = T.base + (uint64_t)k * T.stride;
	struct bc_ea_slot s;
	s.rc = (double *)(b + T.o_rc);
	s.mu = (double *)(b + T.o_mu);
	s.z = (double *)(b + T.o_z);
	s.acc = (double *)(b + T.o_acc);
	s.qs = (float *)(b + T.o_qs);
	s.S = (float *)(b + T.o_S);
	return s;
}

/* The block's threads over [0, n). */
#define BC_EA_EACH(i, n)                                                       \
	for (uint64_t i = threadIdx.x; i < (n); i += blockDim.x)

/* Step 2a (ea_future_rot): rc [hd / 2][2], the mean cos and sin of the
 * future positions' angles, each pair's sums in t order. */
static __device__ void bc_ea_rot(const ea_rule &a, const ea_job &j,
                                 uint32_t hd, double *rc)
{
	BC_EA_EACH(q, hd / 2) {
		double f = bc_ea_freq(a.theta, (uint32_t)q, hd), c = 0.0,
		       s = 0.0;
		for (uint32_t t = 0; t < a.future; t++) {
			double ang = ((double)j.len + t) * f;
			c += cos(ang);
			s += sin(ang);
		}
		rc[2 * q] = c / a.future;
		rc[2 * q + 1] = s / a.future;
	}
}

/* Step 2a (ea_unrope): qs [N][G][hd], the q of the job's query heads at
 * positions [from, P) rotated back to before RoPE with the same float
 * angles. */
static __device__ void bc_ea_unrope(const ea_rule &a, const ea_job &j,
                                    uint32_t G, uint32_t hd, float *qs)
{
	const uint32_t nq = G * hd;
	BC_EA_EACH(e, (uint64_t)(j.len - j.from) * nq) {
		const uint32_t t = (uint32_t)(e / nq), r = (uint32_t)(e % nq);
		const uint32_t d = r % hd, q = d / 2, pos = j.from + t;
		const float *v = bc_ea_q(a, j, pos) +
		                 (uint64_t)(j.g * G + r / hd) * hd;
		float ang = (float)pos * bc_ea_freq(a.theta, q, hd);
		float c = cosf(ang), s = sinf(ang);
		float v0 = v[2 * q], v1 = v[2 * q + 1];
		qs[e] = d % 2 == 0 ? v0 * c + v1 * s : -v0 * s + v1 * c;
	}
}

/* The mean of dimension d of query head j (ea_stats: summed in t order,
 * divided by N), the same bits wherever it is computed. */
static __device__ __forceinline__ double
bc_ea_mean_of(const float *qs, uint32_t N, uint32_t G, uint32_t hd,
              uint32_t j, uint32_t d)
{
	double v = 0.0;
	for (uint32_t t = 0; t < N; t++)
		v += qs[((uint64_t)t * G + j) * hd + d];
	return v / N;
}

/* Step 2b (ea_stats), one thread per query head j and pair q: mu [G][hd]
 * = R m, m the means. */
static __device__ void bc_ea_mean(const struct bc_ea_slot &sl, uint32_t N,
                                  uint32_t G, uint32_t hd)
{
	const uint32_t half = hd / 2;
	BC_EA_EACH(e, (uint64_t)G * half) {
		const uint32_t j = (uint32_t)(e / half), q = (uint32_t)(e % half);
		const double m0 = bc_ea_mean_of(sl.qs, N, G, hd, j, 2 * q),
		             m1 = bc_ea_mean_of(sl.qs, N, G, hd, j, 2 * q + 1);
		const double c = sl.rc[2 * q], s = sl.rc[2 * q + 1];
		double *mu = sl.mu + (uint64_t)j * hd;
		mu[2 * q] = c * m0 - s * m1;
		mu[2 * q + 1] = s * m0 + c * m1;
	}
}

/* Step 2b (ea_stats, cov), one thread per 2 x 2 block (rows 2a, 2a + 1,
 * columns 2b, 2b + 1) of query head j's S' [hd][hd]: its four
 * covariances, each summed in t order from 0 and divided by N (the means
 * recomputed as step 3a computes them), then R on the rows, then on the
 * columns, rounded to float, as the host does in place. */
static __device__ void bc_ea_cov(const struct bc_ea_slot &sl, uint32_t N,
                                 uint32_t G, uint32_t hd)
{
	const uint32_t half = hd / 2;
	BC_EA_EACH(e, (uint64_t)G * half * half) {
		const uint32_t j = (uint32_t)(e / ((uint64_t)half * half));
		const uint32_t a = (uint32_t)(e / half % half),
		               b = (uint32_t)(e % half);
		double mr[2], mc[2], C[2][2];
		for (uint32_t u = 0; u < 2; u++) {
			mr[u] = bc_ea_mean_of(sl.qs, N, G, hd, j, 2 * a + u);
			mc[u] = bc_ea_mean_of(sl.qs, N, G, hd, j, 2 * b + u);
		}
		for (uint32_t u = 0; u < 2; u++)
			for (uint32_t v = 0; v < 2; v++) {
				const uint32_t r = 2 * a + u, c = 2 * b + v;
				double x = 0.0;
				for (uint32_t t = 0; t < N; t++) {
					const float *q = sl.qs + ((uint64_t)t * G +
					                          j) * hd;
					double dr = q[r] - mr[u];
					x += dr * (q[c] - mc[v]);
				}
				C[u][v] = x / N;
			}
		const double cr = sl.rc[2 * a], sr = sl.rc[2 * a + 1];
		const double cc = sl.rc[2 * b], sc = sl.rc[2 * b + 1];
		float *S = sl.S + (uint64_t)j * hd * hd;
		for (uint32_t u = 0; u < 2; u++) {
			double r0 = u == 0 ? cr * C[0][0] - sr * C[1][0]
			                   : sr * C[0][0] + cr * C[1][0];
			double r1 = u == 0 ? cr * C[0][1] - sr * C[1][1]
			                   : sr * C[0][1] + cr * C[1][1];
			float *o = S + (uint64_t)(2 * a + u) * hd;
			o[2 * b] = (float)(cc * r0 - sc * r1);
			o[2 * b + 1] = (float)(sc * r0 + cc * r1);
		}
	}
}

/* z of ea_expect for the key row k (NULL: a page beyond its record or of
 * an unmapped chunk, NaN) against mu' [hd] and (cov) S' of one query
 * head: the linear term summed in double in d order, unfused; k^T S' k
 * in quad_form_cpu's order (common_quad_rn), in the thread's registers,
 * no K S' stored. */
template <typename E>
static __device__ double bc_ea_z(const ea_rule &a, const E *k,
                                 const double *mu, const float *S,
                                 uint32_t hd)
{
	if (!k)
		return nan("");
	double lin = 0.0;
	for (uint32_t d = 0; d < hd; d++)
		lin = __dadd_rn(lin, __dmul_rn(mu[d], (double)common_to_f(k[d])));
	const double quad = a.cov ? common_quad_rn(k, S, hd) : 0.0;
	return lin / sqrt((double)hd) + quad / (2.0 * hd);
}

/*
 * Step 2c (ea_expect) of query head j of the list (record r, entries
 * [0, L)), by every thread of the block: z of the candidates [sinks,
 * min(P, L)) in parallel, one thread an entry, its key read from its
 * page; then the max and the sum in index order by one thread (a tree
 * would change the bits), acc += e / sum / G in parallel.  It leaves the
 * block synchronised.
 */
template <typename E>
static __device__ void bc_ea_soft(const kvt_backend_paged &pg,
                                  const ea_rule &a,
                                  const struct bc_ea_due &T,
                                  const struct bc_ea_slot &sl,
                                  const struct kvt_list_record *r,
                                  uint32_t lo, uint32_t hi, uint32_t j)
{
	__shared__ double zmax, sum;
	const double *mu = sl.mu + (uint64_t)j * T.hd;
	const float *S = sl.S + (uint64_t)j * T.hd * T.hd;
	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
		sl.z[i] = bc_ea_z<E>(a, (const E *)bc_entry_row(pg, r, i), mu,
		                     S, T.hd);
	__syncthreads();
	if (threadIdx.x == 0) {
		double v = -INFINITY;
		for (uint32_t i = lo; i < hi; i++)
			if (sl.z[i] > v)
				v = sl.z[i];
		zmax = v;
	}
	__syncthreads();
	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
		sl.z[i] = exp(sl.z[i] - zmax);
	__syncthreads();
	if (threadIdx.x == 0) {
		double v = 0.0;
		for (uint32_t i = lo; i < hi; i++)
			v += sl.z[i];
		sum = v;
	}
	__syncthreads();
	for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
		sl.acc[i] = (j ? sl.acc[i] : 0.0) + sl.z[i] / sum / T.G;
	__syncthreads();
}

/* Step 2d (ea_decide's tail) of the list (segment sg, job jb), by the
 * threads of the block: s from acc, the sum over the group's heads, and
 * the protection into the call's flat arrays; a candidate's value row
 * (the page's V half, after its page_tokens K rows) weighs it with vnorm;
 * a value of a page beyond its record or of an unmapped chunk makes the
 * score NaN. */
template <typename E>
static __device__ void bc_ea_score(const kvt_backend_paged &pg,
                                   const ea_rule &a, uint32_t G, uint32_t hd,
                                   const struct bc_ea_slot &sl,
                                   const struct kvt_list_record *r,
                                   const struct bc_seg &sg,
                                   const ea_job &jb, float *s, uint8_t *prot)
{
	for (uint32_t i = threadIdx.x; i < sg.L; i += blockDim.x) {
		const int cand = i >= a.sinks && i < jb.len;
		double v = cand && G ? sl.acc[i] : 0.0; /* no head: none */
		if (a.vnorm && cand) {
			const char *row = bc_entry_row(pg, r, i);
			double ss = nan("");
			if (row) {
				const E *vr = (const E *)(row +
				        (uint64_t)pg.page_tokens * pg.row_bytes);
				ss = 0.0;
				for (uint32_t d = 0; d < hd; d++) {
					float x = common_to_f(vr[d]);
					ss += (double)x * x;
				}
			}
			v = (v + a.eps) * sqrt(ss);
		}
		s[sg.first + i] = (float)v;
		prot[sg.first + i] = !cand;
	}
}

/*
 * Every due list of a call in one launch, min(lists, BC_EA_SLOTS) blocks
 * taking the lists in turn, each in its slot: the future rotation and the
 * un-rotated queries, the statistics, per query head of the group in
 * order its softmax, then the scores.  ea_decide's operations in its
 * order; barriers between the steps, as each reads what the one before
 * wrote.
 */
template <typename E>
__global__ void bc_ea_lists(const kvt_backend_paged pg, const ea_rule a,
                            const struct bc_ea_due T, float *s,
                            uint8_t *prot)
{
	const struct bc_ea_slot sl = bc_ea_slot_of(T, blockIdx.x);
	for (uint32_t l = blockIdx.x; l < T.nseg; l += gridDim.x) {
		const struct bc_seg sg = T.segs[l];
		const ea_job jb = T.jobs[sg.job];
		const struct kvt_list_record *r =
			(const struct kvt_list_record *)((const char *)pg.records +
			        (uint64_t)jb.record * pg.list_stride);
		bc_ea_rot(a, jb, T.hd, sl.rc);
		bc_ea_unrope(a, jb, T.G, T.hd, sl.qs);
		__syncthreads();
		bc_ea_mean(sl, jb.len - jb.from, T.G, T.hd);
		if (a.cov)
			bc_ea_cov(sl, jb.len - jb.from, T.G, T.hd);
		__syncthreads();
		const uint32_t hi = jb.len < sg.L ? jb.len : sg.L;
		for (uint32_t j = 0; j < T.G; j++)
			bc_ea_soft<E>(pg, a, T, sl, r, a.sinks, hi, j);
		bc_ea_score<E>(pg, a, T.G, T.hd, sl, r, sg, jb, s, prot);
		__syncthreads(); /* the slot is the next list's */
	}
}

static int bc_ea_check_args(uint32_t n_records, uint32_t n_heads,
                            uint32_t nkv, uint32_t hd, const ea_rule *a,
                            const ea_job *jobs, uint32_t n,
                            uint32_t out_words)
{
	const struct kvt_backend_rows rl = a->rows;
	if (!hd || hd % 2 || !nkv || n_heads % nkv || !rl.stage_tokens ||
	    rl.q_off + (uint64_t)n_heads * hd > rl.row_floats) {
		bc_note("expected_attention rule: %u query heads on %u KV "
		        "heads, head_dim %u, or q beyond rows of %u floats",
		        n_heads, nkv, hd, rl.row_floats);
		return KVT_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		const ea_job *j = &jobs[k];
		if (!j->ring || j->record >= n_records || j->g >= nkv ||
		    j->from > j->len ||
		    (j->due && (j->from == j->len || j->from < a->sinks ||
		                !a->future || !(a->theta > 0.0f))) ||
		    (uint64_t)j->len - j->from + j->n_new > rl.stage_tokens ||
		    j->n_drop > (uint64_t)j->len + j->n_new ||
		    2 * (uint64_t)n + j->drop_off + j->n_drop > out_words) {
			bc_note("expected_attention rule: job %u: record %u of "
			        "%u, KV head %u, prompt %u, from %u, new %u, "
			        "future %u, drops %u + %u of %u words", k,
			        j->record, n_records, j->g, j->len, j->from,
			        j->n_new, a->future, j->drop_off, j->n_drop,
			        out_words);
			return KVT_EINVAL;
		}
	}
	return 0;
}

#define BC_EA_DISPATCH(kernel, dt, grid, s, ...)                               \
	do {                                                                   \
		if ((dt) == KVT_DTYPE_F16)                                     \
			KVT_LAUNCH(kernel<f16_t>, grid, BC_EA_THREADS, 0, s,   \
			           __VA_ARGS__);                               \
		else if ((dt) == KVT_DTYPE_BF16)                               \
			KVT_LAUNCH(kernel<bf16_t>, grid, BC_EA_THREADS, 0, s,  \
			           __VA_ARGS__);                               \
		else                                                           \
			KVT_LAUNCH(kernel<float>, grid, BC_EA_THREADS, 0, s,   \
			           __VA_ARGS__);                               \
	} while (0)

/* Scratch offsets of a call: the output words, the jobs, the plan, the
 * flat score, protection and drop arrays, then the slots. */
struct bc_ea_call {
	size_t jobs, at, first, keep, segs, sc, prot, drop, slots;
};

static struct bc_ea_call bc_ea_call_layout(uint32_t n, uint32_t out_words,
                                           const struct bc_bs_count &cn)
{
	struct bc_ea_call m;
	m.jobs = bc_ps_al((size_t)out_words * 4);
	m.at = m.jobs + bc_ps_al((size_t)n * sizeof(ea_job));
	m.first = m.at + bc_ps_al((size_t)n * 4);
	m.keep = m.first + bc_ps_al((size_t)(cn.nseg + 1) * 4);
	m.segs = m.keep + bc_ps_al((size_t)cn.nseg * 4);
	m.sc = m.segs + bc_ps_al((size_t)cn.nseg * sizeof(struct bc_seg));
	m.prot = m.sc + bc_ps_al((size_t)cn.tot * 4);
	m.drop = m.prot + bc_ps_al(cn.tot);
	m.slots = m.drop + bc_ps_al(cn.tot);
	return m;
}

/* The slots' layout for the call's due lists (nseg; the longest list
 * and statistics window among them): the offsets and the stride, the
 * pointers left for the caller. */
static struct bc_ea_due bc_ea_due_of(const ea_job *jobs, uint32_t n,
                                     uint32_t nseg, uint32_t G, uint32_t hd,
                                     uint32_t cov)
{
	uint64_t maxN = 0, maxL = 0;
	for (uint32_t k = 0; k < n; k++) {
		const uint64_t L = (uint64_t)jobs[k].len + jobs[k].n_new;
		if (!jobs[k].due || !L)
			continue;
		maxL = L > maxL ? L : maxL;
		if (jobs[k].len - jobs[k].from > maxN)
			maxN = jobs[k].len - jobs[k].from;
	}
	struct bc_ea_due T;
	memset(&T, 0, sizeof(T));
	T.nseg = nseg;
	T.G = G;
	T.hd = hd;
	T.o_rc = 0;
	T.o_qs = T.o_rc + bc_ps_al((size_t)hd * 8);
	T.o_mu = T.o_qs + bc_ps_al(maxN * G * hd * 4);
	T.o_S = T.o_mu + bc_ps_al((uint64_t)G * hd * 8);
	T.o_z = T.o_S + (cov ? bc_ps_al((uint64_t)G * hd * hd * 4) : 0);
	T.o_acc = T.o_z + bc_ps_al(maxL * 8);
	T.stride = T.o_acc + bc_ps_al(maxL * 8);
	return T;
}

/*
 * The launches of one call, 4 whatever its jobs: the checks and the plan
 * (one), every due list in its slot (bc_ea_lists, one), the segmented
 * top-k and the drop indices over every list (two); the jobs go up in
 * one copy, the output comes back in one.
 */
static int bc_ea_run_locked(struct bc_ctx *c, const kvt_backend_paged *pg,
                            const struct kvt_backend_rule_geom *g,
                            const ea_rule *a, const ea_job *jobs, uint32_t n,
                            uint32_t *out, uint32_t out_words, cudaStream_t s)
{
	const uint32_t G = g->n_heads / g->n_kv_heads, hd = g->head_dim;
	struct bc_bs_count cn;
	if (bc_bs_count_jobs(jobs, n, &cn)) {
		bc_note("expected_attention rule: more than 2^32 entries in "
		        "one call");
		return KVT_EINVAL;
	}
	const struct bc_ea_call m = bc_ea_call_layout(n, out_words, cn);
	const uint32_t slots = cn.nseg < BC_EA_SLOTS ? cn.nseg : BC_EA_SLOTS;
	struct bc_ea_due T = bc_ea_due_of(jobs, n, cn.nseg, G, hd, a->cov);
	int rv = bc_win_prepare(c, m.slots + (size_t)slots * T.stride);
	if (rv)
		return rv;
	char *d = c->d_win;
	T.jobs = (const ea_job *)(d + m.jobs);
	T.segs = (const struct bc_seg *)(d + m.segs);
	T.base = d + m.slots;
	uint32_t *dout = (uint32_t *)d;
	ea_job *dj = (ea_job *)(d + m.jobs);
	struct bc_seg *segs = (struct bc_seg *)(d + m.segs);
	float *sc = (float *)(d + m.sc);
	uint8_t *prot = (uint8_t *)(d + m.prot);
	BC_CALL(cudaMemsetAsync(dout, 0, (size_t)out_words * 4, s),
	        "expected_attention rule");
	BC_CALL(cudaMemcpyAsync(dj, jobs, (size_t)n * sizeof(*jobs),
	                        cudaMemcpyHostToDevice, s),
	        "expected_attention rule");
	bc_count(c, (uint64_t)n * sizeof(*jobs) + sizeof(*a), 0);
	KVT_LAUNCH(bc_ea_check_plan, n + 1, BC_BS_THREADS, 0, s, dj, n, *a,
	           g->n_heads * hd, dout, (uint32_t *)(d + m.at),
	           (uint32_t *)(d + m.first), (uint32_t *)(d + m.keep), segs);
	BC_CALL(cudaGetLastError(), "expected_attention rule check");
	if (slots) {
		BC_EA_DISPATCH(bc_ea_lists, g->dtype, slots, s, *pg, *a, T, sc,
		               prot);
		BC_CALL(cudaGetLastError(), "expected_attention rule lists");
	}
	if ((rv = bc_bs_select("expected_attention rule", NULL, 0, 0, sc, NULL,
	                       prot, (uint8_t *)(d + m.drop),
	                       (const uint32_t *)(d + m.first),
	                       (const uint32_t *)(d + m.keep), segs, cn.nseg,
	                       cn.maxL, NULL, 0, dout, s)))
		return rv;
	return bc_ps_finish(c, out, dout, out_words, s,
	                    "expected_attention rule");
}

static int bc_ea_run(void *ctx, const struct kvt_backend_paged *pg,
                     uint32_t n_records,
                     const struct kvt_backend_rule_geom *g,
                     const void *params, const void *jobs_, uint32_t n,
                     uint32_t *out, uint32_t out_words, void *stream)
{
	const ea_rule *a = (const ea_rule *)params;
	const ea_job *jobs = (const ea_job *)jobs_;
	return bc_es_entry(
		ctx, "expected_attention rule", pg, g, a, jobs, n, out,
		out_words,
		[&] {
			return bc_ea_check_args(n_records, g->n_heads,
			          g->n_kv_heads, g->head_dim, a, jobs, n,
			          out_words);
		},
		[&](struct bc_ctx *c) {
			return bc_ea_run_locked(c, pg, g, a, jobs, n, out,
			                        out_words, (cudaStream_t)stream);
		});
}

extern const struct kvt_backend_rule bc_expected_attention_rule;
const struct kvt_backend_rule bc_expected_attention_rule = {
	/* .name = */ "expected_attention",
	/* .version = */ EXPECTED_ATTENTION_RULE_VERSION,
	/* .params_bytes = */ sizeof(struct expected_attention_rule),
	/* .job_bytes = */ sizeof(struct expected_attention_rule_job),
	/* .run = */ bc_ea_run,
};
