/*
 * test_device_table.c — the table is read-only to the engine, on either
 * backend, and kvtrimd never follows a page id an engine wrote.
 *
 *   kvt_memcpy into the table (kvt_table_view's or kvt_list_get's) fails
 *   with KVT_EINVAL and a reason, and changes nothing (kvtrimctl check
 *   stays clean); on the emulated cuda backend the device copy is mapped
 *   read-only in VMM sharing (a store through it faults) and read-write in
 *   legacy IPC sharing, where read-only mappings do not exist.
 *
 *   A hostile engine that writes its device copy anyway (legacy IPC, or
 *   its own cuMemSetAccess, which the test stands in for with mprotect:
 *   emulated device memory is host memory) points one list at another's
 *   pages; ten syncs of a streaming policy later, both lists hold exactly
 *   what the policy keeps, as in a sequence nobody damaged: the daemon
 *   compacted through its own copy.  kvtrimctl check reports the damaged
 *   record, rewrites it, and the next check is clean.
 *
 * Expected positions come from docs/policies.md's streaming rule.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "kvtrim.h"
#include "seqid.h"
#include "test.h"

#define SINKS 2u
#define BUDGET 8u
#define STEP 4u /* tokens a sync: the headroom */

static int emulated_cuda(void)
{
	return !strcmp(th_backend(), "cuda") && getenv("KVTRIM_CUDA_EMU");
}

static int legacy_ipc(void)
{
	const char *s = getenv("KVTRIM_CUDA_SHARE");
	return s && !strcmp(s, "ipc");
}

static struct kvt_config table_cfg(const struct th_daemon *d)
{
	static char spec[64];
	snprintf(spec, sizeof(spec), "streaming:sinks=%u,tokens=%u", SINKS,
	         BUDGET);
	struct kvt_config cfg = th_small_cfg(d, "tablewriter", spec);
	cfg.headroom = STEP;
	return cfg;
}

/* The record of (slot, layer, head) in the view, by kvtrim.h's formula. */
static struct kvt_list_record *rec_at(const struct kvt_table_view *v,
                                      uint32_t slot, uint32_t layer,
                                      uint32_t head)
{
	return (struct kvt_list_record *)(
		(char *)v->table + v->records_offset +
		(((uint64_t)slot * v->n_layers + layer) * v->n_kv_heads + head) *
		        v->list_stride);
}

/* Element i of the K (kv 0) or V (kv 1) row of position pos in (layer,
 * head): exact in float, and no two lists or positions share one. */
static float val(uint32_t pos, uint32_t layer, uint32_t head, uint32_t kv,
                 uint32_t i)
{
	return (float)(pos * 1000 + layer * 100 + head * 10 + kv) +
	       (float)i / 16.0f;
}

/* Writes positions pos .. pos + STEP - 1 of every list of s and syncs. */
static void step(kvt_client *c, kvt_seq s, uint32_t pos)
{
	const struct kvt_geometry *g = &kvt_config_of(c)->geo;
	float row[64];
	T_ASSERT(g->head_dim <= 64);
	for (uint32_t k = 0; k < STEP; k++)
		for (uint32_t l = 0; l < g->n_layers; l++)
			for (uint32_t h = 0; h < g->n_kv_heads; h++) {
				void *kv[2];
				T_OK(kvt_kv_ptr(c, s, l, h, k, &kv[0], &kv[1]));
				for (uint32_t w = 0; w < 2; w++) {
					for (uint32_t i = 0; i < g->head_dim; i++)
						row[i] = val(pos + k, l, h, w, i);
					th_put(c, kv[w], row,
					       g->head_dim * sizeof(float));
				}
			}
	struct kvt_sync_item it = {.seq = s, .n_new = STEP,
	                           .phase = KVT_PHASE_DECODE};
	T_OK(kvt_sync(c, &it, 1));
}

/*
 * Every list of s holds, by the host table, the positions streaming keeps
 * of n_seen (pos < SINKS or pos >= n_seen - (BUDGET - SINKS)), each once,
 * K and V rows both those of its own list.
 */
static void check_kept(kvt_client *c, kvt_seq s, uint32_t n_seen)
{
	const struct kvt_config *cfg = kvt_config_of(c);
	const struct kvt_geometry *g = &cfg->geo;
	uint32_t pt = cfg->page_tokens, hd = g->head_dim;
	size_t row = hd * sizeof(float);
	float k[64], v[64];
	for (uint32_t l = 0; l < g->n_layers; l++)
		for (uint32_t h = 0; h < g->n_kv_heads; h++) {
			struct kvt_list li;
			uint8_t seen[256] = {0};
			T_OK(kvt_list_get(c, s, l, h, &li));
			T_EQ(li.len, BUDGET);
			for (uint32_t e = 0; e < li.len; e++) {
				char *p = kvt_page_ptr(c, li.pages[e / pt]);
				T_ASSERT(p != NULL);
				p += (size_t)(e % pt) * row;
				T_OK(kvt_memcpy(c, k, p, row));
				T_OK(kvt_memcpy(c, v, p + (size_t)pt * row, row));
				uint32_t pos = (uint32_t)k[0] / 1000;
				T_ASSERT(pos < n_seen && pos < sizeof(seen));
				T_ASSERT(pos < SINKS ||
				         pos >= n_seen - (BUDGET - SINKS));
				T_ASSERT(!seen[pos]);
				seen[pos] = 1;
				for (uint32_t i = 0; i < hd; i++) {
					T_ASSERT(k[i] == val(pos, l, h, 0, i));
					T_ASSERT(v[i] == val(pos, l, h, 1, i));
				}
			}
		}
}

/* Stores through the view in a child process; its exit status: 0 when the
 * store landed, or the signal that stopped it. */
static int store_in_child(uint32_t *where)
{
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		signal(SIGBUS, SIG_DFL);
		*(volatile uint32_t *)where = 0xdeadbeefu;
		_exit(0);
	}
	int st = 0;
	T_EQ(waitpid(pid, &st, 0), pid);
	return WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st);
}

TEST(device_table, engine_writes_into_the_table_fail)
{
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c;
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = table_cfg(&d);
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq s;
	T_OK(kvt_seq_open(c, &s));
	step(c, s, 0);

	struct kvt_table_view v;
	const struct kvt_list_record *dr;
	struct kvt_list li;
	struct kvt_list_record before, after;
	static const uint32_t junk[4] = {7, 7, 7, 7};
	T_OK(kvt_table_view(c, &v));
	T_OK(kvt_list_record(c, s, 1, 1, &dr, NULL));
	T_OK(kvt_list_get(c, s, 1, 1, &li));
	T_OK(kvt_memcpy(c, &before, dr, sizeof(before)));

	/* the view (device memory on cuda), its first byte, a range that
	 * ends inside it, and the host table kvt_list_get points into */
	T_ERR(kvt_memcpy(c, (void *)dr, junk, sizeof(junk)), KVT_EINVAL);
	T_ASSERT(strstr(kvt_last_error(c), "only kvtrimd writes"));
	T_ERR(kvt_memcpy(c, (void *)v.table, junk, 4), KVT_EINVAL);
	T_ERR(kvt_memcpy(c, (char *)v.table - 8, junk, sizeof(junk)),
	      KVT_EINVAL);
	T_ERR(kvt_memcpy(c, (void *)li.pages, junk, sizeof(junk)), KVT_EINVAL);
	T_ERR(kvt_memcpy(c, (void *)dr, dr, sizeof(*dr)), KVT_EINVAL);
	/* reading it stays fine, and nothing changed */
	T_OK(kvt_memcpy(c, &after, dr, sizeof(after)));
	T_ASSERT(!memcmp(&before, &after, sizeof(after)));
	T_EQ(after.len, li.len);
	step(c, s, STEP); /* the client still works */
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);

	/* On the emulator device memory is host memory: a store through the
	 * view faults in VMM sharing (read-only mapping) and lands in legacy
	 * IPC sharing (cudaIpcOpenMemHandle maps read-write). */
	if (emulated_cuda()) {
		int r = store_in_child((uint32_t *)rec_at(&v, seqid_slot(s), 0,
		                                          0)->pages);
		if (legacy_ipc())
			T_EQ(r, 0);
		else
			T_EQ(r, SIGSEGV);
	}
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}

TEST(device_table, daemon_never_follows_ids_an_engine_wrote)
{
	if (!emulated_cuda())
		T_SKIP("needs the emulated cuda backend (device memory the test "
		       "can store into)");
	struct th_daemon d;
	char err[KVT_ERRTEXT_MAX], out[4096];
	kvt_client *c;
	th_daemon_start(&d, "64M", NULL);
	struct kvt_config cfg = table_cfg(&d);
	T_OK(kvt_connect(&cfg, &c, err));
	kvt_seq bad, good;
	T_OK(kvt_seq_open(c, &bad));
	T_OK(kvt_seq_open(c, &good));
	uint32_t pos = 0;
	for (; pos < BUDGET; pos += STEP) {
		step(c, bad, pos);
		step(c, good, pos);
	}

	/* bad's list (0, 0) in the device view now names the pages of its
	 * list (1, 1), as an engine writing its own mapping would leave it */
	struct kvt_table_view v;
	T_OK(kvt_table_view(c, &v));
	struct kvt_list_record *victim = rec_at(&v, seqid_slot(bad), 0, 0);
	const struct kvt_list_record *other = rec_at(&v, seqid_slot(bad), 1, 1);
	T_EQ(victim->n_pages, other->n_pages);
	long ps = sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)victim & ~(uintptr_t)(ps - 1);
	size_t span = (uintptr_t)(victim->pages + victim->n_pages) - lo;
	if (!legacy_ipc()) /* the engine's cuMemSetAccess(READWRITE) */
		T_EQ(mprotect((void *)lo, span, PROT_READ | PROT_WRITE), 0);
	memcpy(victim->pages, other->pages, other->n_pages * sizeof(uint32_t));
	if (!legacy_ipc())
		T_EQ(mprotect((void *)lo, span, PROT_READ), 0);

	/* ten syncs that evict (and so compact) on the device */
	for (uint32_t i = 0; i < 10; i++, pos += STEP) {
		step(c, bad, pos);
		step(c, good, pos);
	}
	check_kept(c, good, pos);
	check_kept(c, bad, pos);

	/* the check reports the damage, rewrites it, then finds none */
	T_ASSERT(th_sh(&d, out, sizeof(out), "%s check",
	               th_bin("kvtrimctl")) != 0);
	T_ASSERT(strstr(out, "the device table the engine reads"));
	T_EQ(th_sh(&d, out, sizeof(out), "%s check", th_bin("kvtrimctl")), 0);
	struct kvt_list li;
	T_OK(kvt_table_view(c, &v));
	victim = rec_at(&v, seqid_slot(bad), 0, 0);
	T_OK(kvt_list_get(c, bad, 0, 0, &li));
	T_EQ(victim->n_pages, li.n_pages);
	T_ASSERT(!memcmp(victim->pages, li.pages,
	                 li.n_pages * sizeof(uint32_t)));
	kvt_disconnect(c);
	T_EQ(th_daemon_stop(&d), 0);
}
