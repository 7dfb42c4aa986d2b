/*
 * _kvtrim.c — the CPython extension under the kvtrim package: libkvtrim's
 * calls, one method each, on raw addresses and integers; __init__.py turns
 * them into Python's idiom.  Written against the stable ABI
 * (Py_LIMITED_API 3.11), so one build serves every CPython from 3.11 on;
 * libkvtrim.a is linked in, so the module needs no libkvtrim.so.
 *
 * Errors: every libkvtrim code becomes the exception class of its name
 * (kvtrim.EINVAL, ...), carrying (code, name, text).  Lifetime: a Client's
 * mappings outlive close() while a Region (a buffer exported from its
 * pages, staging rows or table, or a DLPack capsule of device memory) is
 * alive; kvt_disconnect runs once the client is closed and its last Region
 * is gone.  A view of a page the daemon later revokes is not guarded:
 * views are valid until the next sync of their sequence.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvtrim.h"

/* ---------------------------------------------------------------- errors */

static PyObject *err_by_code[128]; /* index -code; NULL: use err_base */
static PyObject *err_base;

/* Raises the exception of code with text (may be NULL or ""). */
static PyObject *raise_code(int code, const char *text)
{
	int i = -code;
	PyObject *cls = i > 0 && i < 128 && err_by_code[i] ? err_by_code[i]
	                                                    : err_base;
	if (!cls)
		cls = PyExc_RuntimeError;
	PyObject *args = Py_BuildValue("(iss)", code, kvt_errname(code),
	                               text && *text ? text
	                                             : kvt_strerror(code));
	if (args) {
		PyErr_SetObject(cls, args);
		Py_DECREF(args);
	}
	return NULL;
}

static PyObject *mod_errors(PyObject *self, PyObject *unused)
{
	PyObject *l = PyList_New(0);
	for (int i = 1; l && i < 128; i++) {
		const char *name = kvt_errname(-i);
		if (!strcmp(name, "E?"))
			continue;
		PyObject *t = Py_BuildValue("(iss)", -i, name, kvt_strerror(-i));
		if (!t || PyList_Append(l, t) < 0) {
			Py_XDECREF(t);
			Py_DECREF(l);
			return NULL;
		}
		Py_DECREF(t);
	}
	return l;
}

/* _set_errors(base, {code: class}) */
static PyObject *mod_set_errors(PyObject *self, PyObject *args)
{
	PyObject *base, *map, *k, *v;
	Py_ssize_t pos = 0;
	if (!PyArg_ParseTuple(args, "OO", &base, &map))
		return NULL;
	if (!PyDict_Check(map))
		return PyErr_Format(PyExc_TypeError, "a dict of classes");
	Py_XDECREF(err_base);
	Py_INCREF(base);
	err_base = base;
	while (PyDict_Next(map, &pos, &k, &v)) {
		long c = PyLong_AsLong(k);
		if (c == -1 && PyErr_Occurred())
			return NULL;
		if (c >= 0 || c <= -128)
			continue;
		Py_XDECREF(err_by_code[-c]);
		Py_INCREF(v);
		err_by_code[-c] = v;
	}
	Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- client */

typedef struct {
	PyObject_HEAD
	kvt_client *c;
	int closed;         /* close() was called */
	Py_ssize_t exports; /* live Regions */
	char *tenant, *policy, *runtime_dir; /* what cfg pointed at */
} Client;

static PyTypeObject *ClientType, *RegionType;

static void client_release(Client *self)
{
	if (self->c && self->closed && self->exports == 0) {
		kvt_disconnect(self->c);
		self->c = NULL;
	}
}

/* The live handle, or NULL and a raised error. */
static kvt_client *live(Client *self)
{
	if (self->closed || !self->c) {
		raise_code(KVT_ECONN, "the client is closed");
		return NULL;
	}
	return self->c;
}

/* Raises rc's exception with the client's last error. */
static PyObject *fail(Client *self, int rc)
{
	return raise_code(rc, self->c ? kvt_last_error(self->c) : NULL);
}

/* None after a call that returned rc 0, else its exception. */
static PyObject *done(Client *self, int rc)
{
	if (rc)
		return fail(self, rc);
	Py_RETURN_NONE;
}

static char *dup_or_null(const char *s)
{
	if (!s)
		return NULL;
	size_t n = strlen(s) + 1;
	char *d = PyMem_Malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

static int client_init(Client *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {
		"runtime_dir", "tenant", "n_layers", "n_heads", "n_kv_heads",
		"head_dim", "d_model", "dtype", "page_tokens", "max_seqs",
		"max_tokens", "headroom", "stage_tokens", "policy", "quota_bytes",
		"timeout_ms", NULL};
	const char *rt = NULL, *tenant = NULL, *policy = NULL;
	unsigned int L = 0, H = 0, KV = 0, hd = 0, d = 0, dt = 0, pt = 0,
	             ms = 0, mt = 0, hr = 0, st = 0;
	unsigned long long quota = 0;
	int timeout = 0;
	if (self->c) {
		PyErr_SetString(PyExc_RuntimeError, "Client already connected");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzIIIIIIIIIIIzKi", kwlist,
	                                 &rt, &tenant, &L, &H, &KV, &hd, &d, &dt,
	                                 &pt, &ms, &mt, &hr, &st, &policy,
	                                 &quota, &timeout))
		return -1;
	self->runtime_dir = dup_or_null(rt);
	self->tenant = dup_or_null(tenant);
	self->policy = dup_or_null(policy);
	struct kvt_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	cfg.runtime_dir = self->runtime_dir;
	cfg.tenant = self->tenant;
	cfg.geo = (struct kvt_geometry){L, H, KV, hd, d};
	cfg.dtype = (enum kvt_dtype)dt;
	cfg.page_tokens = pt;
	cfg.max_seqs = ms;
	cfg.max_tokens = mt;
	cfg.headroom = hr;
	cfg.stage_tokens = st;
	cfg.policy = self->policy;
	cfg.quota_bytes = quota;
	cfg.timeout_ms = timeout;
	char errtext[KVT_ERRTEXT_MAX] = "";
	kvt_client *c = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_connect(&cfg, &c, errtext);
	Py_END_ALLOW_THREADS
	if (rc) {
		raise_code(rc, errtext);
		return -1;
	}
	self->c = c;
	self->closed = 0;
	return 0;
}

static void client_dealloc(Client *self)
{
	self->closed = 1;
	self->exports = 0;
	client_release(self);
	PyMem_Free(self->tenant);
	PyMem_Free(self->policy);
	PyMem_Free(self->runtime_dir);
	PyTypeObject *tp = Py_TYPE(self);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(self);
	Py_DECREF(tp);
}

static PyObject *client_close(Client *self, PyObject *unused)
{
	self->closed = 1;
	client_release(self);
	Py_RETURN_NONE;
}

static PyObject *client_get_closed(Client *self, void *unused)
{
	return PyBool_FromLong(self->closed || !self->c);
}

static PyObject *client_last_error(Client *self, PyObject *unused)
{
	return PyUnicode_FromString(self->c ? kvt_last_error(self->c) : "");
}

static PyObject *client_config(Client *self, PyObject *unused)
{
	kvt_client *c = live(self);
	if (!c)
		return NULL;
	const struct kvt_config *g = kvt_config_of(c);
	return Py_BuildValue(
		"{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:K,s:i}",
		"runtime_dir", g->runtime_dir ? g->runtime_dir : "",
		"tenant", g->tenant ? g->tenant : "",
		"n_layers", g->geo.n_layers, "n_heads", g->geo.n_heads,
		"n_kv_heads", g->geo.n_kv_heads, "head_dim", g->geo.head_dim,
		"d_model", g->geo.d_model, "dtype", (unsigned)g->dtype,
		"page_tokens", g->page_tokens, "max_seqs", g->max_seqs,
		"max_tokens", g->max_tokens, "headroom", g->headroom,
		"stage_tokens", g->stage_tokens,
		"policy", g->policy ? g->policy : "full",
		"quota_bytes", (unsigned long long)g->quota_bytes,
		"timeout_ms", g->timeout_ms);
}

static PyObject *client_policy_inputs(Client *self, PyObject *unused)
{
	kvt_client *c = live(self);
	return c ? PyLong_FromUnsignedLong(kvt_policy_inputs(c)) : NULL;
}

static PyObject *client_memory_kind(Client *self, PyObject *unused)
{
	kvt_client *c = live(self);
	return c ? PyLong_FromLong(kvt_memory_kind(c)) : NULL;
}

static PyObject *client_seq_open(Client *self, PyObject *unused)
{
	kvt_client *c = live(self);
	kvt_seq s = 0;
	int rc;
	if (!c)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_seq_open(c, &s);
	Py_END_ALLOW_THREADS
	return rc ? fail(self, rc) : PyLong_FromUnsignedLongLong(s);
}

static PyObject *client_seq_fork(Client *self, PyObject *args)
{
	unsigned long long from;
	kvt_seq s = 0;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "K", &from))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_seq_fork(c, from, &s);
	Py_END_ALLOW_THREADS
	return rc ? fail(self, rc) : PyLong_FromUnsignedLongLong(s);
}

static PyObject *client_seq_close(Client *self, PyObject *args)
{
	unsigned long long s;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "K", &s))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_seq_close(c, s);
	Py_END_ALLOW_THREADS
	return done(self, rc);
}

static PyObject *client_seq_query(Client *self, PyObject *args)
{
	unsigned long long s;
	kvt_client *c = live(self);
	struct kvt_seq_info i;
	int rc;
	if (!c || !PyArg_ParseTuple(args, "K", &s))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_seq_query(c, s, &i);
	Py_END_ALLOW_THREADS
	if (rc)
		return fail(self, rc);
	return Py_BuildValue("{s:I,s:I,s:I,s:I,s:I,s:i}", "syncs", i.syncs,
	                     "seen_min", i.seen_min, "seen_max", i.seen_max,
	                     "len_min", i.len_min, "len_max", i.len_max,
	                     "last_sync", (int)i.last_sync);
}

static PyObject *client_seq_headroom(Client *self, PyObject *args)
{
	unsigned long long s;
	unsigned int n;
	kvt_client *c = live(self);
	if (!c || !PyArg_ParseTuple(args, "KI", &s, &n))
		return NULL;
	int rc = kvt_seq_headroom(c, s, n);
	return done(self, rc);
}

static PyObject *client_seq_reserve(Client *self, PyObject *args)
{
	unsigned long long s;
	unsigned int n;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "KI", &s, &n))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_seq_reserve(c, s, n);
	Py_END_ALLOW_THREADS
	return done(self, rc);
}

/* list_get(seq, layer, head) -> (len, n_pages, epoch, pages_addr) */
static PyObject *client_list_get(Client *self, PyObject *args)
{
	unsigned long long s;
	unsigned int l, h;
	kvt_client *c = live(self);
	struct kvt_list li;
	if (!c || !PyArg_ParseTuple(args, "KII", &s, &l, &h))
		return NULL;
	int rc = kvt_list_get(c, s, l, h, &li);
	if (rc)
		return raise_code(rc, NULL);
	return Py_BuildValue("(IIKK)", li.len, li.n_pages,
	                     (unsigned long long)li.epoch,
	                     (unsigned long long)(uintptr_t)li.pages);
}

static PyObject *client_page_ptr(Client *self, PyObject *args)
{
	unsigned int p;
	kvt_client *c = live(self);
	if (!c || !PyArg_ParseTuple(args, "I", &p))
		return NULL;
	void *v = kvt_page_ptr(c, p);
	if (!v)
		return raise_code(KVT_EINVAL, "kvt_page_ptr: page not mapped "
		                  "by this client");
	return PyLong_FromUnsignedLongLong((uintptr_t)v);
}

static PyObject *client_kv_ptr(Client *self, PyObject *args)
{
	unsigned long long s;
	unsigned int l, h, k;
	void *kp, *vp;
	kvt_client *c = live(self);
	if (!c || !PyArg_ParseTuple(args, "KIII", &s, &l, &h, &k))
		return NULL;
	int rc = kvt_kv_ptr(c, s, l, h, k, &kp, &vp);
	if (rc)
		return raise_code(rc, NULL);
	return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)kp,
	                     (unsigned long long)(uintptr_t)vp);
}

/* stage_ptr(which, seq, layer, pos): which 0 x, 1 q, 2 lse; 0 for NULL */
static PyObject *client_stage_ptr(Client *self, PyObject *args)
{
	unsigned long long s;
	unsigned int w, l, pos;
	kvt_client *c = live(self);
	if (!c || !PyArg_ParseTuple(args, "IKII", &w, &s, &l, &pos))
		return NULL;
	float *p = w == 0 ? kvt_stage_x(c, s, l, pos)
	         : w == 1 ? kvt_stage_q(c, s, l, pos)
	         : w == 2 ? kvt_stage_lse(c, s, l, pos) : NULL;
	return PyLong_FromUnsignedLongLong((uintptr_t)p);
}

/* The items of a sync from a sequence of (seq, n_new, phase, lo, hi). */
static struct kvt_sync_item *parse_items(PyObject *seq, Py_ssize_t *n)
{
	PyObject *fast = PySequence_Fast(seq, "items must be a sequence");
	if (!fast)
		return NULL;
	*n = PySequence_Size(fast);
	struct kvt_sync_item *it = PyMem_Calloc(*n ? *n : 1, sizeof(*it));
	if (!it) {
		Py_DECREF(fast);
		PyErr_NoMemory();
		return NULL;
	}
	for (Py_ssize_t i = 0; i < *n; i++) {
		PyObject *o = PySequence_GetItem(fast, i);
		unsigned long long s;
		unsigned int nn, ph, lo, hi;
		int ok = o && PyArg_ParseTuple(o, "KIIII", &s, &nn, &ph, &lo,
		                               &hi);
		Py_XDECREF(o);
		if (!ok) {
			PyMem_Free(it);
			Py_DECREF(fast);
			return NULL;
		}
		it[i] = (struct kvt_sync_item){s, nn, ph, lo, hi};
	}
	Py_DECREF(fast);
	return it;
}

static PyObject *client_sync(Client *self, PyObject *args)
{
	PyObject *items;
	Py_ssize_t n;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "O", &items))
		return NULL;
	struct kvt_sync_item *it = parse_items(items, &n);
	if (!it)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_sync(c, it, (size_t)n);
	Py_END_ALLOW_THREADS
	PyMem_Free(it);
	return done(self, rc);
}

static PyObject *client_sync_async(Client *self, PyObject *args)
{
	PyObject *items;
	Py_ssize_t n;
	kvt_client *c = live(self);
	kvt_ticket t = 0;
	int rc;
	if (!c || !PyArg_ParseTuple(args, "O", &items))
		return NULL;
	struct kvt_sync_item *it = parse_items(items, &n);
	if (!it)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_sync_async(c, it, (size_t)n, &t);
	Py_END_ALLOW_THREADS
	PyMem_Free(it);
	return rc ? fail(self, rc) : PyLong_FromUnsignedLong(t);
}

static PyObject *client_wait(Client *self, PyObject *args)
{
	unsigned int t;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "I", &t))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_wait(c, t);
	Py_END_ALLOW_THREADS
	return done(self, rc);
}

static PyObject *client_last_sync(Client *self, PyObject *unused)
{
	kvt_client *c = live(self);
	struct kvt_sync_info i;
	if (!c)
		return NULL;
	int rc = kvt_last_sync(c, &i);
	if (rc)
		return fail(self, rc);
	return Py_BuildValue("{s:d,s:I,s:K}", "pressure", (double)i.pressure,
	                     "budget", i.budget, "syncs",
	                     (unsigned long long)i.syncs);
}

static PyObject *client_stats(Client *self, PyObject *unused)
{
	kvt_client *c = live(self);
	struct kvt_tenant_stats s;
	int rc;
	if (!c)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_stats(c, &s);
	Py_END_ALLOW_THREADS
	if (rc)
		return fail(self, rc);
	return Py_BuildValue(
		"{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
		"pages_used", (unsigned long long)s.pages_used,
		"pages_free", (unsigned long long)s.pages_free,
		"chunks", (unsigned long long)s.chunks,
		"sequences", (unsigned long long)s.sequences,
		"syncs", (unsigned long long)s.syncs,
		"entries_kept", (unsigned long long)s.entries_kept,
		"entries_appended", (unsigned long long)s.entries_appended,
		"entries_evicted", (unsigned long long)s.entries_evicted,
		"quota_bytes", (unsigned long long)s.quota_bytes,
		"daemon_bytes", (unsigned long long)s.daemon_bytes,
		"pressure_ppm", (unsigned long long)s.pressure_ppm,
		"budget", (unsigned long long)s.budget);
}

static PyObject *client_set_stream(Client *self, PyObject *args)
{
	unsigned long long a;
	kvt_client *c = live(self);
	if (!c || !PyArg_ParseTuple(args, "K", &a))
		return NULL;
	int rc = kvt_set_stream(c, (void *)(uintptr_t)a);
	return done(self, rc);
}

static PyObject *client_memcpy(Client *self, PyObject *args)
{
	unsigned long long d, s, n;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "KKK", &d, &s, &n))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_memcpy(c, (void *)(uintptr_t)d, (const void *)(uintptr_t)s,
	                (size_t)n);
	Py_END_ALLOW_THREADS
	return done(self, rc);
}

static PyObject *client_buffer_alloc(Client *self, PyObject *args)
{
	unsigned long long n;
	void *p = NULL;
	kvt_client *c = live(self);
	if (!c || !PyArg_ParseTuple(args, "K", &n))
		return NULL;
	int rc = kvt_buffer_alloc(c, (size_t)n, &p);
	return rc ? fail(self, rc)
	          : PyLong_FromUnsignedLongLong((uintptr_t)p);
}

static PyObject *client_buffer_free(Client *self, PyObject *args)
{
	unsigned long long a;
	if (!self->c) /* the memory is this process's: a closed client too */
		return raise_code(KVT_ECONN, "the client is disconnected");
	if (!PyArg_ParseTuple(args, "K", &a))
		return NULL;
	int rc = kvt_buffer_free(self->c, (void *)(uintptr_t)a);
	return done(self, rc);
}

static PyObject *client_table_view(Client *self, PyObject *unused)
{
	kvt_client *c = live(self);
	struct kvt_table_view v;
	if (!c)
		return NULL;
	int rc = kvt_table_view(c, &v);
	if (rc)
		return raise_code(rc, NULL);
	return Py_BuildValue(
		"{s:K,s:K,s:K,s:I,s:I,s:I,s:I,s:K,s:I,s:I,s:K}",
		"table", (unsigned long long)(uintptr_t)v.table,
		"records_offset", (unsigned long long)v.records_offset,
		"list_stride", (unsigned long long)v.list_stride,
		"max_seqs", v.max_seqs, "n_layers", v.n_layers,
		"n_kv_heads", v.n_kv_heads, "max_pages", v.max_pages,
		"chunk_bases", (unsigned long long)(uintptr_t)v.chunk_bases,
		"n_chunk_slots", v.n_chunk_slots,
		"pages_per_chunk", v.pages_per_chunk,
		"page_bytes", (unsigned long long)v.page_bytes);
}

static PyObject *client_list_record(Client *self, PyObject *args)
{
	unsigned long long s;
	unsigned int l, h, slot = 0;
	const struct kvt_list_record *r = NULL;
	kvt_client *c = live(self);
	if (!c || !PyArg_ParseTuple(args, "KII", &s, &l, &h))
		return NULL;
	int rc = kvt_list_record(c, s, l, h, &r, &slot);
	if (rc)
		return raise_code(rc, NULL);
	return Py_BuildValue("(KI)", (unsigned long long)(uintptr_t)r, slot);
}

/* attend([(seq, layer, n, scale, q, out, lse)]): kvt_attend, addresses */
static PyObject *client_attend(Client *self, PyObject *args)
{
	PyObject *items, *fast;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "O", &items))
		return NULL;
	if (!(fast = PySequence_Fast(items, "items must be a sequence")))
		return NULL;
	Py_ssize_t n = PySequence_Size(fast);
	struct kvt_attend_item *it = PyMem_Calloc(n ? n : 1, sizeof(*it));
	if (!it) {
		Py_DECREF(fast);
		return PyErr_NoMemory();
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *o = PySequence_GetItem(fast, i);
		unsigned long long s, q, out, lse;
		unsigned int l, k;
		float sc;
		int ok = o && PyArg_ParseTuple(o, "KIIfKKK", &s, &l, &k, &sc, &q,
		                               &out, &lse);
		Py_XDECREF(o);
		if (!ok) {
			PyMem_Free(it);
			Py_DECREF(fast);
			return NULL;
		}
		it[i] = (struct kvt_attend_item){s, l, k, sc,
		                                 (const float *)(uintptr_t)q,
		                                 (float *)(uintptr_t)out,
		                                 (float *)(uintptr_t)lse};
	}
	Py_DECREF(fast);
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_attend(c, it, (size_t)n);
	Py_END_ALLOW_THREADS
	PyMem_Free(it);
	return done(self, rc);
}

/* write_kv(seq, layer, k0, n, k, v, tok_stride, head_stride) */
static PyObject *client_write_kv(Client *self, PyObject *args)
{
	unsigned long long s, k, v, ts, hs;
	unsigned int l, k0, n;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "KIIIKKKK", &s, &l, &k0, &n, &k, &v,
	                            &ts, &hs))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_write_kv(c, s, l, k0, n, (const void *)(uintptr_t)k,
	                  (const void *)(uintptr_t)v, ts, hs);
	Py_END_ALLOW_THREADS
	return done(self, rc);
}

/* stage(seq, layer, pos0, n, x, q, lse): addresses, 0 for NULL */
static PyObject *client_stage(Client *self, PyObject *args)
{
	unsigned long long s, x, q, lse;
	unsigned int l, p0, n;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "KIIIKKK", &s, &l, &p0, &n, &x, &q,
	                            &lse))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_stage(c, s, l, p0, n, (const float *)(uintptr_t)x,
	               (const float *)(uintptr_t)q,
	               (const float *)(uintptr_t)lse);
	Py_END_ALLOW_THREADS
	return done(self, rc);
}

/* attention(seq, layer, n, q, out, lse): addresses; the GIL is released
 * for the kernel. */
static PyObject *client_attention(Client *self, PyObject *args)
{
	unsigned long long s, q, o, lse;
	unsigned int l, n;
	kvt_client *c = live(self);
	int rc;
	if (!c || !PyArg_ParseTuple(args, "KIIKKK", &s, &l, &n, &q, &o, &lse))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = kvt_attention(c, s, l, n, (const float *)(uintptr_t)q,
	                   (float *)(uintptr_t)o, (float *)(uintptr_t)lse);
	Py_END_ALLOW_THREADS
	return done(self, rc);
}

/* region(addr, nbytes, writable): a buffer over this client's host
 * memory that keeps the client's mappings alive while it lives. */
static PyObject *client_region(Client *self, PyObject *args);

/* dlpack(...): a DLPack capsule over this client's memory. */
static PyObject *client_dlpack(Client *self, PyObject *args);

static PyMethodDef client_methods[] = {
	{"close", (PyCFunction)client_close, METH_NOARGS,
	 "Disconnects (once no Region of this client is alive)."},
	{"last_error", (PyCFunction)client_last_error, METH_NOARGS, NULL},
	{"config", (PyCFunction)client_config, METH_NOARGS, NULL},
	{"policy_inputs", (PyCFunction)client_policy_inputs, METH_NOARGS, NULL},
	{"memory_kind", (PyCFunction)client_memory_kind, METH_NOARGS, NULL},
	{"seq_open", (PyCFunction)client_seq_open, METH_NOARGS, NULL},
	{"seq_fork", (PyCFunction)client_seq_fork, METH_VARARGS, NULL},
	{"seq_close", (PyCFunction)client_seq_close, METH_VARARGS, NULL},
	{"seq_query", (PyCFunction)client_seq_query, METH_VARARGS, NULL},
	{"seq_headroom", (PyCFunction)client_seq_headroom, METH_VARARGS, NULL},
	{"seq_reserve", (PyCFunction)client_seq_reserve, METH_VARARGS, NULL},
	{"list_get", (PyCFunction)client_list_get, METH_VARARGS, NULL},
	{"page_ptr", (PyCFunction)client_page_ptr, METH_VARARGS, NULL},
	{"kv_ptr", (PyCFunction)client_kv_ptr, METH_VARARGS, NULL},
	{"stage_ptr", (PyCFunction)client_stage_ptr, METH_VARARGS, NULL},
	{"sync", (PyCFunction)client_sync, METH_VARARGS, NULL},
	{"sync_async", (PyCFunction)client_sync_async, METH_VARARGS, NULL},
	{"wait", (PyCFunction)client_wait, METH_VARARGS, NULL},
	{"last_sync", (PyCFunction)client_last_sync, METH_NOARGS, NULL},
	{"stats", (PyCFunction)client_stats, METH_NOARGS, NULL},
	{"set_stream", (PyCFunction)client_set_stream, METH_VARARGS, NULL},
	{"memcpy", (PyCFunction)client_memcpy, METH_VARARGS, NULL},
	{"buffer_alloc", (PyCFunction)client_buffer_alloc, METH_VARARGS, NULL},
	{"buffer_free", (PyCFunction)client_buffer_free, METH_VARARGS, NULL},
	{"table_view", (PyCFunction)client_table_view, METH_NOARGS, NULL},
	{"list_record", (PyCFunction)client_list_record, METH_VARARGS, NULL},
	{"attention", (PyCFunction)client_attention, METH_VARARGS, NULL},
	{"write_kv", (PyCFunction)client_write_kv, METH_VARARGS, NULL},
	{"attend", (PyCFunction)client_attend, METH_VARARGS, NULL},
	{"stage", (PyCFunction)client_stage, METH_VARARGS, NULL},
	{"region", (PyCFunction)client_region, METH_VARARGS, NULL},
	{"dlpack", (PyCFunction)client_dlpack, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL}};

static PyGetSetDef client_getset[] = {
	{"closed", (getter)client_get_closed, NULL, NULL, NULL},
	{NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot client_slots[] = {
	{Py_tp_init, client_init},
	{Py_tp_dealloc, client_dealloc},
	{Py_tp_methods, client_methods},
	{Py_tp_getset, client_getset},
	{Py_tp_new, PyType_GenericNew},
	{Py_tp_doc, "libkvtrim's client (kvt_connect ... kvt_disconnect); "
	            "see kvtrim.Client for the Python API."},
	{0, NULL}};

static PyType_Spec client_spec = {"kvtrim._kvtrim.Client", sizeof(Client), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
                                  client_slots};

/* ---------------------------------------------------------------- region */

typedef struct {
	PyObject_HEAD
	Client *owner;
	void *addr;
	Py_ssize_t len;
	int writable;
} Region;

static PyObject *client_region(Client *self, PyObject *args)
{
	unsigned long long a, n;
	int w, host = 0;
	/* host: the caller knows a is host memory on any tenant (the host
	 * table kvt_list_get reads). */
	if (!live(self) || !PyArg_ParseTuple(args, "KKp|p", &a, &n, &w, &host))
		return NULL;
	if (!host && kvt_memory_kind(self->c) != KVT_MEMORY_HOST)
		return raise_code(KVT_ENOTSUP, "host views of a cuda tenant's "
		                  "memory (use the device views)");
	if (!a || n > (unsigned long long)PY_SSIZE_T_MAX)
		return raise_code(KVT_EINVAL, "region: NULL or too large");
	Region *r = PyObject_New(Region, RegionType);
	if (!r)
		return NULL;
	Py_INCREF(self);
	r->owner = self;
	r->addr = (void *)(uintptr_t)a;
	r->len = (Py_ssize_t)n;
	r->writable = w;
	self->exports++;
	return (PyObject *)r;
}

static void region_dealloc(Region *r)
{
	Client *o = r->owner;
	if (o) {
		o->exports--;
		client_release(o);
		Py_DECREF(o);
	}
	PyTypeObject *tp = Py_TYPE(r);
	PyObject_Free(r);
	Py_DECREF(tp);
}

static int region_getbuffer(Region *r, Py_buffer *view, int flags)
{
	return PyBuffer_FillInfo(view, (PyObject *)r, r->addr, r->len,
	                         !r->writable, flags);
}

static void region_releasebuffer(Region *r, Py_buffer *view) {}

static PyType_Slot region_slots[] = {
	{Py_tp_dealloc, region_dealloc},
	{Py_bf_getbuffer, region_getbuffer},
	{Py_bf_releasebuffer, region_releasebuffer},
	{Py_tp_doc, "Host memory of a kvtrim client (pages, staging rows, "
	            "table), exported through the buffer protocol."},
	{0, NULL}};

static PyType_Spec region_spec = {"kvtrim._kvtrim.Region", sizeof(Region), 0,
                                  Py_TPFLAGS_DEFAULT, region_slots};

/* ---------------------------------------------------------------- dlpack */

/*
 * DLPack (dmlc/dlpack, include/dlpack/dlpack.h, v1.0) for a cuda tenant's
 * device memory and a bf16 tenant's host views (numpy exports the others
 * itself, but would say uint16 for bf16): kvtrim.DeviceArray.__dlpack__
 * and the views' ask dlpack() below for the capsule.  The structs are written here from the header's definitions
 * (the package builds without it); their layout is the ABI, so neither
 * field order nor widths may change.
 */
typedef struct {
	int32_t device_type;
	int32_t device_id;
} DLDevice;

typedef struct {
	uint8_t code;
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;   /* [ndim] */
	int64_t *strides; /* [ndim], in elements; NULL means compact */
	uint64_t byte_offset;
} DLTensor;

/* The classic struct, capsule "dltensor" (renamed "used_dltensor" by the
 * consumer that takes it over, which then calls deleter). */
typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
	uint32_t major;
	uint32_t minor;
} DLPackVersion;

/* DLPack 1.0's, capsule "dltensor_versioned" ("used_dltensor_versioned"):
 * it can say read-only, which the classic struct cannot. */
typedef struct DLManagedTensorVersioned {
	DLPackVersion version;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensorVersioned *self);
	uint64_t flags;
	DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define DL_CPU 1                    /* DLDeviceType kDLCPU */
#define DL_CUDA 2                   /* DLDeviceType kDLCUDA */
#define DL_FLAG_READ_ONLY (1u << 0) /* DLPACK_FLAG_BITMASK_READ_ONLY */

/*
 * The CUDA ordinal of the pages in this process.  libkvtrim imports them on
 * the device it opens its backend context on, which is device 0 of this
 * process (client/mem.c: ctx_new(0, ...); kvtrim.h: the daemon's GPU 0),
 * and exposes no other; a consumer numbers devices as this process does
 * (CUDA_VISIBLE_DEVICES included), so 0 is the id to give.
 */
#define DL_DEVICE_ID 0

/* One export: the managed tensor a consumer holds, and what it keeps alive
 * (the owner, a DeviceArray or a view, and the client, counted in exports
 * as a Region is, so the mappings outlive close() while the tensor
 * lives). */
struct dl_export {
	union {
		DLManagedTensor m;
		DLManagedTensorVersioned v;
	} t;
	PyObject *owner;
	Client *client;
	int64_t dims[]; /* shape[ndim], then strides[ndim] */
};

/* The deleter's work; it may run on any thread, with or without the GIL
 * (a consumer frees its tensor wherever it drops it). */
static void dl_export_free(struct dl_export *e)
{
	PyGILState_STATE g = PyGILState_Ensure();
	Client *o = e->client;
	o->exports--;
	client_release(o);
	Py_DECREF((PyObject *)o);
	Py_DECREF(e->owner);
	free(e);
	PyGILState_Release(g);
}

static void dl_delete(DLManagedTensor *m)
{
	dl_export_free(m->manager_ctx);
}

static void dl_delete_versioned(DLManagedTensorVersioned *v)
{
	dl_export_free(v->manager_ctx);
}

/* A capsule dropped before any consumer took it over still has its first
 * name, and its tensor is freed here; a consumed one is the consumer's. */
static void dl_capsule_free(PyObject *cap)
{
	PyObject *t, *v, *tb;
	PyErr_Fetch(&t, &v, &tb);
	if (PyCapsule_IsValid(cap, "dltensor")) {
		DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
		m->deleter(m);
	} else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		DLManagedTensorVersioned *m =
			PyCapsule_GetPointer(cap, "dltensor_versioned");
		m->deleter(m);
	}
	PyErr_Restore(t, v, tb);
}

/* n integers of seq into out: 0, or -1 with an exception raised (a
 * negative one too when nonneg). */
static int dl_ints(PyObject *seq, int64_t *out, Py_ssize_t n, int nonneg)
{
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *d = PySequence_GetItem(seq, i);
		long long v = d ? PyLong_AsLongLong(d) : -1;
		Py_XDECREF(d);
		if (v == -1 && PyErr_Occurred())
			return -1;
		if (nonneg && v < 0) {
			raise_code(KVT_EINVAL, "dlpack: negative extent");
			return -1;
		}
		out[i] = v;
	}
	return 0;
}

/* dlpack(owner, addr, shape, strides, code, bits, readonly, versioned): a
 * DLPack capsule over this client's memory at addr (device memory of a
 * cuda tenant, host memory of a host one), strides in elements (None:
 * compact and row-major, which is what the capsule then says), that keeps
 * owner and the client's mappings alive until its deleter runs.
 * versioned: DLManagedTensorVersioned (1.0) with the read-only flag from
 * readonly, else the classic DLManagedTensor (readonly is then the
 * caller's to refuse).  The checks of the protocol (stream, device, copy)
 * are the Python layer's.  A closed client whose memory is still mapped
 * (a Region or export alive) exports too. */
static PyObject *client_dlpack(Client *self, PyObject *args)
{
	PyObject *owner, *shape, *st;
	unsigned long long a;
	unsigned int code, bits;
	int ro, ver;
	if (!PyArg_ParseTuple(args, "OKOOIIpp", &owner, &a, &shape, &st, &code,
	                      &bits, &ro, &ver))
		return NULL;
	if (!self->c)
		return raise_code(KVT_ECONN, "the client is disconnected");
	if (!a || code > 255 || !bits || bits > 255)
		return raise_code(KVT_EINVAL, "dlpack: NULL address or a bad "
		                  "element type");
	Py_ssize_t n = PySequence_Size(shape);
	if (n < 0)
		return NULL;
	if (n > 32)
		return raise_code(KVT_EINVAL, "dlpack: more than 32 dimensions");
	if (st != Py_None && PySequence_Size(st) != n) {
		if (!PyErr_Occurred())
			raise_code(KVT_EINVAL, "dlpack: strides and shape differ "
			           "in length");
		return NULL;
	}
	struct dl_export *e = calloc(1, sizeof(*e) + 2 * (size_t)n *
	                                                 sizeof(int64_t));
	if (!e)
		return PyErr_NoMemory();
	int64_t *strides = e->dims + n, step = 1;
	if (dl_ints(shape, e->dims, n, 1) ||
	    (st != Py_None && dl_ints(st, strides, n, 0))) {
		free(e);
		return NULL;
	}
	for (Py_ssize_t i = n - 1; st == Py_None && i >= 0; i--) {
		strides[i] = step;
		step *= e->dims[i];
	}
	int cuda = kvt_memory_kind(self->c) == KVT_MEMORY_CUDA;
	DLTensor dt = {
		.data = (void *)(uintptr_t)a,
		.device = {cuda ? DL_CUDA : DL_CPU, cuda ? DL_DEVICE_ID : 0},
		.ndim = (int32_t)n,
		.dtype = {(uint8_t)code, (uint8_t)bits, 1},
		.shape = e->dims,
		.strides = strides,
		.byte_offset = 0,
	};
	void *p;
	const char *name;
	if (ver) {
		e->t.v.version = (DLPackVersion){1, 0};
		e->t.v.manager_ctx = e;
		e->t.v.deleter = dl_delete_versioned;
		e->t.v.flags = ro ? DL_FLAG_READ_ONLY : 0;
		e->t.v.dl_tensor = dt;
		p = &e->t.v;
		name = "dltensor_versioned";
	} else {
		e->t.m.dl_tensor = dt;
		e->t.m.manager_ctx = e;
		e->t.m.deleter = dl_delete;
		p = &e->t.m;
		name = "dltensor";
	}
	Py_INCREF(owner);
	e->owner = owner;
	Py_INCREF((PyObject *)self);
	e->client = self;
	self->exports++;
	PyObject *cap = PyCapsule_New(p, name, dl_capsule_free);
	if (!cap)
		dl_export_free(e);
	return cap;
}

/* ---------------------------------------------------------------- module */

static PyObject *mod_dtype_size(PyObject *self, PyObject *args)
{
	unsigned int dt;
	if (!PyArg_ParseTuple(args, "I", &dt))
		return NULL;
	return PyLong_FromSize_t(kvt_dtype_size((enum kvt_dtype)dt));
}

static PyMethodDef mod_methods[] = {
	{"errors", mod_errors, METH_NOARGS,
	 "libkvtrim's error list: [(code, name, text)]."},
	{"_set_errors", mod_set_errors, METH_VARARGS, NULL},
	{"dtype_size", mod_dtype_size, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL}};

static struct PyModuleDef mod_def = {PyModuleDef_HEAD_INIT, "_kvtrim",
                                     "libkvtrim, linked in.", -1, mod_methods,
                                     NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kvtrim(void)
{
	PyObject *m = PyModule_Create(&mod_def);
	if (!m)
		return NULL;
	ClientType = (PyTypeObject *)PyType_FromSpec(&client_spec);
	RegionType = (PyTypeObject *)PyType_FromSpec(&region_spec);
	if (!ClientType || !RegionType ||
	    PyModule_AddObject(m, "Client", (PyObject *)ClientType) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	Py_INCREF(ClientType);
	PyModule_AddIntConstant(m, "MEMORY_HOST", KVT_MEMORY_HOST);
	PyModule_AddIntConstant(m, "MEMORY_CUDA", KVT_MEMORY_CUDA);
	PyModule_AddIntConstant(m, "INPUT_X", KVT_INPUT_X);
	PyModule_AddIntConstant(m, "INPUT_Q", KVT_INPUT_Q);
	PyModule_AddIntConstant(m, "INPUT_LSE", KVT_INPUT_LSE);
	PyModule_AddIntConstant(m, "INPUT_KV", KVT_INPUT_KV);
	PyModule_AddIntConstant(m, "PHASE_PREFILL", KVT_PHASE_PREFILL);
	PyModule_AddIntConstant(m, "PHASE_DECODE", KVT_PHASE_DECODE);
	PyModule_AddIntConstant(m, "NAME_MAX", KVT_NAME_MAX);
	PyModule_AddIntConstant(m, "SPEC_MAX", KVT_SPEC_MAX);
	PyModule_AddIntConstant(m, "DL_CUDA", DL_CUDA);
	PyModule_AddIntConstant(m, "DL_DEVICE_ID", DL_DEVICE_ID);
	return m;
}
