/*
 * tenant_scorer_test.c — device scorers shared by content (tenant_scorer.c):
 * weights equal byte for byte share one device copy, freed with the last
 * hold; weights of the same sizes and other bytes, or of other sizes, get
 * their own; two holders' syncs that arrive together are scored in one run
 * and each gets its own rows' scores; a failed shared run fails both, each
 * with the backend's reason.
 *
 * The backend is the cpu table with a fake scorer (host memory standing in
 * for the device): its score of row r of a job is x[r] + 0.5 k for output
 * k, computed independently below, and it counts what it is asked.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "tenant_int.h"
#include "test.h"

#define F_DOUT 2u

static struct {
	int news, frees, runs, fail;
	uint32_t jobs; /* of the last run */
	char why[64];
} fk;

static int fake_new(void *ctx, const struct kvt_backend_scorer *s, void **out)
{
	(void)ctx;
	fk.news++;
	*out = calloc(1, 1);
	return *out ? 0 : KVT_ENOMEM;
}

static void fake_free(void *ctx, void *sc)
{
	(void)ctx;
	fk.frees++;
	free(sc);
}

static int fake_run(void *ctx, void *sc,
                    const struct kvt_backend_score_job *jobs, uint32_t n,
                    float *out, void *stream)
{
	(void)ctx;
	(void)sc;
	(void)stream;
	fk.runs++;
	fk.jobs = n;
	if (fk.fail) {
		snprintf(fk.why, sizeof(fk.why), "injected failure");
		return KVT_ESYS;
	}
	for (uint32_t j = 0; j < n; j++)
		for (uint32_t r = 0; r < jobs[j].n; r++, out += F_DOUT)
			for (uint32_t k = 0; k < F_DOUT; k++)
				out[k] = jobs[j].x[r] + 0.5f * (float)k;
	return 0;
}

static int fake_sync(void *ctx, void *stream)
{
	(void)ctx;
	(void)stream;
	return 0;
}

static const char *fake_error(void) { return fk.why; }

static struct kvt_backend_ops fake_ops(void)
{
	struct kvt_backend_ops o = backend_cpu;
	o.scorer_new = fake_new;
	o.scorer_free = fake_free;
	o.scorer_run = fake_run;
	o.stream_sync = fake_sync;
	o.last_error = fake_error;
	return o;
}

/* A linear scorer of 2 layers (d_in 3, d_out F_DOUT) whose tensors are
 * copies of t (W: 6 floats, b: 2, per layer); w is the pointer array
 * tscorer_get takes. */
struct fscorer {
	struct kvt_backend_scorer d;
	float t[2][20];
	const float **w;
};

static void fscorer_init(struct fscorer *f, const float *t, uint32_t d_out)
{
	memset(f, 0, sizeof(*f));
	f->d = (struct kvt_backend_scorer){.kind = KVT_SCORER_LINEAR,
	                                   .n_layers = 2, .d_in = 3,
	                                   .d_out = d_out};
	for (uint32_t l = 0; l < 2; l++) /* a layer: W [d_out][3], b */
		memcpy(f->t[l], t + l * 4 * d_out, 4 * d_out * sizeof(float));
	f->w = calloc(2 * KVT_SCORER_TENSORS, sizeof(*f->w));
	T_ASSERT(f->w);
	for (uint32_t l = 0; l < 2; l++) {
		f->w[l * KVT_SCORER_TENSORS] = f->t[l];
		f->w[l * KVT_SCORER_TENSORS + 1] = f->t[l] + 3 * d_out;
	}
}

static const float T_A[2][8] = {{1, 2, 3, 4, 5, 6, 7, 8},
                                {9, 10, 11, 12, 13, 14, 15, 16}};

TEST(tenant_scorer, equal_bytes_share_one_copy_freed_with_the_last)
{
	struct kvt_backend_ops o = fake_ops();
	struct pool pool;
	memset(&pool, 0, sizeof(pool));
	memset(&fk, 0, sizeof(fk));
	int ctx;
	char err[256];
	float tb[2][8];
	memcpy(tb, T_A, sizeof(tb));
	tb[1][7] = 16.5f; /* the last bias of the last layer differs */
	static struct fscorer a, a2, b, c;
	fscorer_init(&a, &T_A[0][0], F_DOUT);
	fscorer_init(&a2, &T_A[0][0], F_DOUT); /* own copy, same bytes */
	fscorer_init(&b, &tb[0][0], F_DOUT);
	fscorer_init(&c, &T_A[0][0], 1); /* other sizes, a prefix of a's */
	struct tscorer_hold *ha, *ha2, *hb, *hc;
	T_OK(tscorer_get(&pool, &o, &ctx, &a.d, a.w, &ha, err, sizeof(err)));
	T_OK(tscorer_get(&pool, &o, &ctx, &a2.d, a2.w, &ha2, err, sizeof(err)));
	T_EQ(fk.news, 1);
	T_ASSERT(ha->e == ha2->e);
	T_EQ(tscorer_holders(ha), 2);
	T_OK(tscorer_get(&pool, &o, &ctx, &b.d, b.w, &hb, err, sizeof(err)));
	T_OK(tscorer_get(&pool, &o, &ctx, &c.d, c.w, &hc, err, sizeof(err)));
	T_EQ(fk.news, 3);
	T_ASSERT(hb->e != ha->e && hc->e != ha->e && hc->e != hb->e);
	T_EQ(pool.n_scorers, 3);
	/* the first holder goes: its copy stays for the second, which is now
	 * what a newcomer is compared with */
	tscorer_put(ha);
	T_EQ(fk.frees, 0);
	struct fscorer a3;
	fscorer_init(&a3, &T_A[0][0], F_DOUT);
	struct tscorer_hold *ha3;
	T_OK(tscorer_get(&pool, &o, &ctx, &a3.d, a3.w, &ha3, err, sizeof(err)));
	T_EQ(fk.news, 3);
	T_ASSERT(ha3->e == ha2->e);
	tscorer_put(ha2);
	T_EQ(fk.frees, 0);
	tscorer_put(ha3);
	T_EQ(fk.frees, 1);
	T_EQ(pool.n_scorers, 2);
	tscorer_put(hb);
	tscorer_put(hc);
	T_EQ(fk.frees, 3);
	T_EQ(pool.n_scorers, 0);
	T_ASSERT(pool.scorers == NULL);
	tscorer_put(NULL);
}

/*
 * Weights that hash alike and differ: the last two 8-byte words of the
 * last tensor (the last layer's bias, d_out 4: 16 bytes) changed so that
 * FNV-1a's state after them is the same.  With P the prime and s the state
 * before them, H = ((s ^ A) P ^ B) P: s follows from H, A and B (P is odd,
 * so invertible mod 2^64), and B2 = (s ^ A) P ^ (s ^ A2) P ^ B gives the
 * same H for any A2.
 */
TEST(tenant_scorer, a_hash_hit_with_other_bytes_is_not_shared)
{
	const uint64_t P = 0x100000001b3ull;
	uint64_t Pi = P;
	for (int i = 0; i < 6; i++)
		Pi *= 2 - P * Pi; /* Newton: the inverse of P mod 2^64 */
	T_ASSERT(P * Pi == 1);
	static float t1[2][20], t2[2][20];
	for (int l = 0; l < 2; l++)
		for (int i = 0; i < 20; i++)
			t1[l][i] = (float)(l * 20 + i) * 0.25f;
	memcpy(t2, t1, sizeof(t2));
	struct fscorer a, b;
	fscorer_init(&a, &t1[0][0], 4); /* W 12 floats, b 4 per layer */
	fscorer_init(&b, &t2[0][0], 4);
	a.d.w = a.w;
	b.d.w = b.w;
	float *bias2 = b.t[1] + 12;
	uint64_t A, B, A2, B2;
	memcpy(&A, a.t[1] + 12, 8);
	memcpy(&B, a.t[1] + 14, 8);
	const uint64_t s = (((tscorer_hash(&a.d) * Pi) ^ B) * Pi) ^ A;
	A2 = A ^ 0x5a5a5a5a5a5a5a5aull;
	B2 = ((s ^ A) * P) ^ ((s ^ A2) * P) ^ B;
	memcpy(bias2, &A2, 8);
	memcpy(bias2 + 2, &B2, 8);
	T_EQ_U64(tscorer_hash(&a.d), tscorer_hash(&b.d));
	T_ASSERT(memcmp(a.t, b.t, sizeof(a.t)));

	struct kvt_backend_ops o = fake_ops();
	struct pool pool;
	memset(&pool, 0, sizeof(pool));
	memset(&fk, 0, sizeof(fk));
	int ctx;
	char err[256];
	struct tscorer_hold *ha, *hb;
	T_OK(tscorer_get(&pool, &o, &ctx, &a.d, a.w, &ha, err, sizeof(err)));
	T_OK(tscorer_get(&pool, &o, &ctx, &b.d, b.w, &hb, err, sizeof(err)));
	T_EQ(fk.news, 2);
	T_ASSERT(ha->e != hb->e);
	tscorer_put(ha);
	tscorer_put(hb);
	T_EQ(fk.frees, 2);
}

/* One holder's sync: 2 jobs of rows x[0..3) and x[3..5). */
struct fsync {
	struct tscorer_hold *h;
	float x[5];
	struct kvt_backend_score_job jobs[2];
	float out[5 * F_DOUT];
	int rc;
	char err[256];
};

static void *fsync_run(void *arg)
{
	struct fsync *s = arg;
	s->jobs[0] = (struct kvt_backend_score_job){0, 3, s->x, NULL};
	s->jobs[1] = (struct kvt_backend_score_job){1, 2, s->x + 3,
	                                              NULL};
	/* gathers until the other holder's sync is queued: they meet */
	s->rc = tscorer_run(s->h, s->jobs, 2, s->out, s, 60u * 1000 * 1000,
	                    s->err, sizeof(s->err));
	return NULL;
}

/* Two holders of one scorer sync at once; fail: the run fails. */
static void two_syncs(int fail, struct fsync *s, struct pool *pool)
{
	struct kvt_backend_ops o = fake_ops();
	memset(pool, 0, sizeof(*pool));
	memset(&fk, 0, sizeof(fk));
	fk.fail = fail;
	int ctx;
	char err[256];
	static struct fscorer a, a2;
	fscorer_init(&a, &T_A[0][0], F_DOUT);
	fscorer_init(&a2, &T_A[0][0], F_DOUT);
	T_OK(tscorer_get(pool, &o, &ctx, &a.d, a.w, &s[0].h, err, sizeof(err)));
	T_OK(tscorer_get(pool, &o, &ctx, &a2.d, a2.w, &s[1].h, err,
	                 sizeof(err)));
	pthread_t th[2];
	for (int i = 0; i < 2; i++) {
		for (int r = 0; r < 5; r++)
			s[i].x[r] = (float)(10 * i + r);
		T_EQ(pthread_create(&th[i], NULL, fsync_run, &s[i]), 0);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	T_EQ(fk.runs, 1);
	T_EQ(fk.jobs, 4);
	tscorer_put(s[0].h);
	tscorer_put(s[1].h);
}

TEST(tenant_scorer, syncs_together_share_one_run_each_its_scores)
{
	struct fsync s[2];
	struct pool pool;
	memset(s, 0, sizeof(s));
	two_syncs(0, s, &pool);
	for (int i = 0; i < 2; i++) {
		T_OK(s[i].rc);
		for (int r = 0; r < 5; r++)
			for (uint32_t k = 0; k < F_DOUT; k++)
				T_ASSERT(s[i].out[r * F_DOUT + k] ==
				         (float)(10 * i + r) + 0.5f * (float)k);
	}
	T_EQ_U64(pool.scorer_shared_runs_total, 1);
	T_EQ_U64(pool.scorer_shared_syncs_total, 2);
}

TEST(tenant_scorer, failed_shared_run_fails_each_sync_with_the_reason)
{
	struct fsync s[2];
	struct pool pool;
	memset(s, 0, sizeof(s));
	two_syncs(1, s, &pool);
	for (int i = 0; i < 2; i++) {
		T_EQ(s[i].rc, KVT_ESYS);
		T_ASSERT(strstr(s[i].err, "injected failure"));
		T_ASSERT(strstr(s[i].err, "one run for 2 syncs"));
		for (int r = 0; r < 5 * (int)F_DOUT; r++)
			T_ASSERT(s[i].out[r] == 0.0f); /* nothing handed out */
	}
	T_EQ_U64(pool.scorer_shared_runs_total, 0);
}
