/*
 * loadgen.h — what the files of kvtrim-loadgen share (examples/loadgen/):
 * the options, the report a child engine sends the parent, the independent
 * model of full and streaming, and the state of one engine process.
 *
 *   main.c     the parent: forks the engines, waits, respawns, prints
 *   options.c  command line and its checks
 *   prepare.c  the policy spec: generated weights for learned policies
 *   pattern.c  the byte pattern written into K and V, and its check
 *   model.c    the independent model of full and streaming
 *   engine.c   one engine process: tenant, sequences, appends, syncs
 *   verify.c   --verify: a list checked against the pattern and the model
 *   replay.c   --verify of other policies: the policy code replayed on a
 *              shadow of every list
 *   report.c   sync latency histogram, totals, the summary line
 *
 * See main.c for what loadgen does and the pattern it writes.
 */
#ifndef KVT_LOADGEN_H
#define KVT_LOADGEN_H

#include <stddef.h>
#include <stdint.h>

#include "kvtrim.h"

struct policy;

/* The command line (options.c); read-only once the engines run. */
struct opts {
	const char *dir;     /* NULL: the library's default */
	uint32_t clients, seqs, steps, sync_every;
	uint32_t layers, heads, kv_heads, head_dim, page_tokens;
	enum kvt_dtype dtype;
	const char *policy;
	const char *name;
	uint64_t seed, quota;
	uint32_t kill_after; /* 0: never */
	uint32_t step_us;    /* pause per step, like an engine's decode step */
	uint32_t prefill;    /* first N tokens synced as prefill */
	int verify;
	int retry_full;      /* back off and retry on KVT_EPOOLFULL */
	int expect_kills;    /* SIGKILLed children are not failures */
	int tolerate_pressure; /* verify: extra evictions are allowed */
	uint32_t respawn;    /* replacement engines for killed ones */
	struct policy *pol;  /* local instance: needs, lookback, the replay */
	char scratch[64];    /* generated weights live here ("" = none) */
};

/*
 * Sync latency histogram: bucket b counts latencies in
 * [2^(b/4), 2^((b+1)/4)) microseconds (four buckets per octave, so a
 * percentile read from it is at most 19% high); the last bucket is open.
 */
#define LAT_BUCKETS 112

/* What a child tells the parent; one write, well below PIPE_BUF. */
struct report {
	uint32_t client;
	uint32_t gen;   /* 0, or the respawn that ran this client */
	int32_t status; /* the child's exit status */
	uint64_t syncs, appended, kept, mismatches;
	uint64_t full_retries;     /* KVT_EPOOLFULL answers retried */
	uint64_t pressure_evicted; /* extra evictions (--tolerate-pressure) */
	int32_t memory; /* kvt_memory_kind of its pages; -1 before connect */
	uint32_t lat[LAT_BUCKETS]; /* sync latencies, see LAT_BUCKETS */
};

/* Independent model of the policies loadgen can verify (model.c). */
enum model_kind { MODEL_FULL, MODEL_STREAMING };
struct model {
	enum model_kind kind;
	uint32_t sinks;
	int has_tokens, has_ratio;
	uint32_t tokens;
	double ratio;
};

/* Sums of the reports of every engine (killed ones send none). */
struct totals {
	uint64_t syncs, appended, kept, mismatches, full_retries;
	uint64_t pressure_evicted;
	int memory; /* the engines' kvt_memory_kind; -1 none, -2 mixed */
	uint64_t lat[LAT_BUCKETS];
};

/* One engine process (engine.c), its buffers and its verifier state. */
struct engine {
	const struct opts *o;
	const struct model *model; /* NULL unless verifying */
	uint32_t client;
	kvt_client *c;
	kvt_seq *seqs;    /* [o->seqs] */
	uint8_t *seen;    /* [o->steps] scratch for verify */
	uint8_t *alive;   /* [o->steps] positions the model still keeps; the
	                     same for every list, as all advance together */
	uint32_t alive_seen; /* tokens the model has been advanced to */
	uint64_t *bmix;   /* [2 * row_bytes] see pattern_bmix_init */
	size_t row_bytes; /* head_dim * dtype size */
	uint32_t page_tokens;
	int stage;        /* the policy wants staged inputs */
	uint32_t stage_tokens;
	struct report r;
	float *kf;        /* [head_dim] key scratch */
	uint8_t *kb;      /* [row_bytes] key scratch */
	float *att;       /* [max_tokens * G] paged_attention scratch */
	void **pv;        /* [kv_heads][mp] page pointers, one row per list
	                     (the replay holds a layer's lists at once) */
	uint32_t mp;      /* page pointers per row of pv */
	/* Device pages (kvt_memory_kind KVT_MEMORY_CUDA); all NULL/0 on host
	 * pages, which loadgen reads and writes in place. */
	int dev;
	size_t page_bytes; /* 2 * page_tokens * row_bytes */
	uint8_t *hp;      /* [hp_rows][mp][page_bytes] host copies of pages,
	                     row r for the pointers of pv row r */
	uint32_t hp_rows;
	uint8_t *wrow;    /* [2][row_bytes] K and V of the entry written */
	/* Replay (verify of policies without an independent model): one
	 * shadow per (sequence, layer, head) list, index
	 * (j * layers + l) * kv_heads + h, cap entries each. */
	int replay;
	uint32_t cap;
	uint32_t *sh_len;  /* [lists] */
	uint32_t *sh_pos;  /* [lists][cap] */
	float *sh_ent;     /* [lists][cap][entry_floats] */
	uint8_t *sh_drop;  /* [lists][cap] decisions of the pending sync */
	uint8_t *sh_state; /* [seqs * layers][layer_state_bytes] */
	uint8_t *want;     /* [steps] expected positions of one list */
	uint32_t *moves;   /* [cap][2] */
	float *in;         /* staged rows gathered: x, q, lse of pending */
	float *gen;        /* [2 * heads * head_dim + heads] one token's x, q,
	                      lse as made, before the staged parts get them */
	/* What loadgen staged, as the staging entries hold it (ipc/shm.h:
	 * the policy's parts x, q, lse in that order): the replay reads
	 * these, since the staging rows are device memory on a cuda tenant.
	 * Entry of (sequence j, layer l, position p) at
	 * ((j * layers + l) * stage_tokens + p % stage_tokens) * sfloats. */
	float *shadow;
	uint32_t sfloats;
};


/* options.c */
/* Fills o from argv; 0, or -1 with a message printed.  --help exits. */
int options_parse(int argc, char **argv, struct opts *o);
/* The headroom every tenant asks for: room for a sync and a page. */
uint32_t options_headroom(const struct opts *o);

/* prepare.c */
int prepare_policy(struct opts *o, char *spec, size_t len);
void prepare_remove_scratch(const struct opts *o);

/* pattern.c */
uint64_t pattern_mix(uint64_t x);
uint32_t pattern_tag(uint64_t seed, uint32_t client, uint32_t seq,
                     uint32_t layer, uint32_t head);
uint64_t *pattern_bmix_init(size_t row_bytes);
uint32_t pattern_get_u32(const uint8_t *p);
void pattern_write_entry(const uint64_t *bmix, uint8_t *k, uint8_t *v,
                         size_t row_bytes, uint32_t tag, uint32_t pos,
                         uint32_t head_dim, enum kvt_dtype dt, float *kf);
long pattern_check_entry(const uint64_t *bmix, const uint8_t *k,
                         const uint8_t *v, size_t row_bytes, uint32_t tag,
                         uint32_t pos, uint32_t head_dim, enum kvt_dtype dt,
                         float *kf, uint8_t *kb, int *is_v);

/* model.c */
int model_policy_is(const char *spec, const char *name);
int model_parse(const char *spec, struct model *m, char *why, size_t len);
void model_advance(uint8_t *alive, uint32_t *alive_seen,
                   const struct model *m, uint32_t n_seen);

/* engine.c */
/* The body of engine process `client` (generation gen): runs it and
 * writes its report to wfd; its exit status. */
int engine_main(const struct opts *o, const struct model *m, int has_model,
                uint32_t client, uint32_t gen, int wfd);
__attribute__((format(printf, 2, 3)))
void engine_say(const struct engine *e, const char *fmt, ...);
/* The shadow entry of what loadgen staged for (sequence j, layer l,
 * position pos); stage_tokens must be non-zero. */
float *engine_shadow(struct engine *e, uint32_t j, uint32_t l, uint32_t pos);
int engine_pages_view(struct engine *e, uint32_t r, const uint32_t *ids,
                      uint32_t n, void ***out);

/* verify.c */
__attribute__((format(printf, 5, 6)))
void verify_mismatch(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                     const char *fmt, ...);
int verify_list(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                uint32_t n_seen, uint8_t *want_alive);

/* replay.c */
int replay_decide(struct engine *e, uint32_t n, uint32_t n_seen,
                  enum kvt_phase phase);
void replay_want(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                 uint32_t n, uint32_t n_seen);
void replay_commit(struct engine *e, uint32_t j, uint32_t l, uint32_t h,
                   uint32_t n);

/* report.c */
double report_now_s(void);
uint32_t report_lat_bucket(double us);
void report_read(int fd, const struct opts *o, const uint32_t *gens,
                 uint8_t *got, struct totals *tot);
void report_print(const struct opts *o, const struct totals *tot,
                  uint32_t killed, uint32_t failed, uint32_t respawned,
                  double elapsed);

#endif
