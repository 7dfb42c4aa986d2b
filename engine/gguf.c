/*
 * gguf.c — GGUF v3 container reader: header, metadata, tensor infos,
 * indexes and typed look-ups; see gguf.h.  The tensor types and their
 * dequantisation are in gguf_quant.c, the llama architecture check in
 * gguf_llama.c.
 *
 * Parsing walks a bounds-checked cursor over the whole file: every read
 * first checks the bytes left, and every count is compared with the bytes
 * its elements need at the least before anything is allocated for it, so a
 * corrupt header fails with a reason instead of a huge allocation or a
 * read past the map.  Tensor data are checked only once the header (and so
 * the data section's start) is known.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "kvtrim.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian data in place"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_KEY 65535u /* bytes of a key (the format's limit) */
/* Smallest encodings, to bound counts by the bytes left: a key/value is at
 * least a key length, one key byte, a type and one value byte; a tensor
 * info at least a name length, one name byte, n_dims, one dim, a type and
 * an offset. */
#define GGUF_MIN_KV 14u
#define GGUF_MIN_TENSOR 33u
#define GGUF_HEADER 24u /* magic, version, n_tensors, n_kv */

struct gguf {
	const uint8_t *base; /* [size] the file */
	uint64_t size;       /* bytes */
	int mapped;          /* base is our mmap */
	uint32_t version;
	uint32_t alignment; /* bytes, a power of two */
	uint64_t data_off;  /* bytes from the file start to the data section */
	size_t n_kv;
	struct gguf_kv *kv; /* [n_kv], file order */
	size_t *kv_idx;     /* [n_kv] indices of kv sorted by key */
	size_t n_t;
	struct gguf_tensor *t; /* [n_t], file order */
	size_t *t_idx;         /* [n_t] indices of t sorted by name */
};

/* ---------------------------------------------------------------- types */

static const char *const VTYPES[] = {
	"uint8", "int8",  "uint16", "int16", "uint32", "int32",   "float32",
	"bool",  "string", "array", "uint64", "int64", "float64",
};

const char *gguf_value_type_name(enum gguf_type t)
{
	return (uint32_t)t < sizeof(VTYPES) / sizeof(VTYPES[0]) ? VTYPES[t]
	                                                        : "unknown";
}

/* Bytes of a fixed-size value type; 0 for STRING and ARRAY, -1 unknown. */
static int vsize(uint32_t t)
{
	switch (t) {
	case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL:
		return 1;
	case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
		return 2;
	case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32:
		return 4;
	case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64:
		return 8;
	case GGUF_TYPE_STRING: case GGUF_TYPE_ARRAY:
		return 0;
	default:
		return -1;
	}
}
/* ---------------------------------------------------------------- cursor */

struct cur {
	const uint8_t *p; /* [len] */
	uint64_t len, off;
	char *err;
	size_t errlen;
};

static uint64_t left(const struct cur *c)
{
	return c->len - c->off;
}

/* Takes n bytes for what; NULL and the reason when fewer are left. */
static const uint8_t *take(struct cur *c, uint64_t n, const char *what)
{
	if (n > left(c)) {
		errors_fmt(c->err, c->errlen, KVT_EINVAL,
		           "truncated: %s at byte %llu needs %llu bytes, the "
		           "file has %llu left", what,
		           (unsigned long long)c->off, (unsigned long long)n,
		           (unsigned long long)left(c));
		return NULL;
	}
	const uint8_t *p = c->p + c->off;
	c->off += n;
	return p;
}

static int rd_u32(struct cur *c, uint32_t *v, const char *what)
{
	const uint8_t *p = take(c, 4, what);
	if (!p)
		return KVT_EINVAL;
	memcpy(v, p, 4);
	return 0;
}

static int rd_u64(struct cur *c, uint64_t *v, const char *what)
{
	const uint8_t *p = take(c, 8, what);
	if (!p)
		return KVT_EINVAL;
	memcpy(v, p, 8);
	return 0;
}

static int rd_str(struct cur *c, struct gguf_str *s, const char *what)
{
	uint64_t off = c->off;
	int rc = rd_u64(c, &s->len, what);
	if (rc < 0)
		return rc;
	if (s->len > left(c))
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "%s at byte %llu has length %llu, beyond the "
		                  "%llu bytes left in the file", what,
		                  (unsigned long long)off,
		                  (unsigned long long)s->len,
		                  (unsigned long long)left(c));
	s->p = (const char *)take(c, s->len, what);
	return 0;
}

/* ---------------------------------------------------------------- values */

static void free_value(struct gguf_value *v)
{
	if (v->type != GGUF_TYPE_ARRAY || !v->v.arr.items)
		return;
	for (uint64_t i = 0; i < v->v.arr.n; i++)
		free_value(&v->v.arr.items[i]);
	free(v->v.arr.items);
	v->v.arr.items = NULL;
}

/* Decodes one fixed-size value of type t at p. */
static void decode_fixed(uint32_t t, const uint8_t *p, struct gguf_value *v)
{
	uint8_t u8;
	uint16_t u16;
	uint32_t u32;
	uint64_t u64;
	float f;
	v->type = (enum gguf_type)t;
	switch (t) {
	case GGUF_TYPE_UINT8: memcpy(&u8, p, 1); v->v.u = u8; break;
	case GGUF_TYPE_INT8: memcpy(&u8, p, 1); v->v.i = (int8_t)u8; break;
	case GGUF_TYPE_BOOL: memcpy(&u8, p, 1); v->v.b = u8; break;
	case GGUF_TYPE_UINT16: memcpy(&u16, p, 2); v->v.u = u16; break;
	case GGUF_TYPE_INT16: memcpy(&u16, p, 2); v->v.i = (int16_t)u16; break;
	case GGUF_TYPE_UINT32: memcpy(&u32, p, 4); v->v.u = u32; break;
	case GGUF_TYPE_INT32: memcpy(&u32, p, 4); v->v.i = (int32_t)u32; break;
	case GGUF_TYPE_FLOAT32: memcpy(&f, p, 4); v->v.f = f; break;
	case GGUF_TYPE_UINT64: memcpy(&u64, p, 8); v->v.u = u64; break;
	case GGUF_TYPE_INT64: memcpy(&u64, p, 8); v->v.i = (int64_t)u64; break;
	case GGUF_TYPE_FLOAT64: memcpy(&v->v.f, p, 8); break;
	}
}

static int rd_value(struct cur *c, uint32_t t, struct gguf_value *v,
                    int depth, const char *what);

/* The bools of an array must each be 0 or 1, like a single bool. */
static int check_bools(struct cur *c, const uint8_t *p, uint64_t n,
                       const char *what)
{
	for (uint64_t i = 0; i < n; i++)
		if (p[i] > 1)
			return errors_fmt(c->err, c->errlen, KVT_EINVAL,
			                  "%s: bool element %llu is %u (0 or 1 "
			                  "expected)", what,
			                  (unsigned long long)i, p[i]);
	return 0;
}

static int rd_array(struct cur *c, struct gguf_value *v, int depth,
                    const char *what)
{
	uint32_t et;
	uint64_t n, at = c->off;
	int rc = rd_u32(c, &et, what);
	if (rc == 0)
		rc = rd_u64(c, &n, what);
	if (rc < 0)
		return rc;
	int es = vsize(et);
	if (es < 0)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "%s: array at byte %llu has unknown element "
		                  "type %u", what, (unsigned long long)at, et);
	if (et == GGUF_TYPE_ARRAY && depth + 1 >= GGUF_MAX_DEPTH)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "%s: arrays nested deeper than %d", what,
		                  GGUF_MAX_DEPTH);
	/* A string element is at least its length (8 bytes), an array one
	 * its type and count (12). */
	uint64_t min = es ? (uint64_t)es : et == GGUF_TYPE_STRING ? 8 : 12;
	if (n > left(c) / min)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "%s: array at byte %llu claims %llu elements "
		                  "of %s, more than the %llu bytes left in the "
		                  "file hold", what, (unsigned long long)at,
		                  (unsigned long long)n, gguf_value_type_name(et),
		                  (unsigned long long)left(c));
	v->v.arr.type = (enum gguf_type)et;
	v->v.arr.n = n;
	v->v.arr.data = c->p + c->off;
	v->v.arr.items = NULL;
	if (es) {
		const uint8_t *p = take(c, n * (uint64_t)es, what);
		return et == GGUF_TYPE_BOOL ? check_bools(c, p, n, what) : 0;
	}
	/* n <= file size / 8: the allocation is bounded by the file. */
	v->v.arr.items = n ? calloc((size_t)n, sizeof(*v->v.arr.items)) : NULL;
	if (n && !v->v.arr.items)
		return errors_fmt(c->err, c->errlen, KVT_ENOMEM,
		                  "%s: no memory for %llu array elements", what,
		                  (unsigned long long)n);
	for (uint64_t i = 0; i < n; i++) {
		v->v.arr.items[i].type = (enum gguf_type)et;
		if ((rc = rd_value(c, et, &v->v.arr.items[i], depth + 1,
		                   what)) < 0)
			return rc;
	}
	return 0;
}

/* Reads one value of type t; on failure v may hold items to free. */
static int rd_value(struct cur *c, uint32_t t, struct gguf_value *v,
                    int depth, const char *what)
{
	int es = vsize(t);
	v->type = (enum gguf_type)t;
	if (es < 0)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "%s: unknown value type %u", what, t);
	if (t == GGUF_TYPE_STRING)
		return rd_str(c, &v->v.s, what);
	if (t == GGUF_TYPE_ARRAY)
		return rd_array(c, v, depth, what);
	const uint8_t *p = take(c, (uint64_t)es, what);
	if (!p)
		return KVT_EINVAL;
	decode_fixed(t, p, v);
	if (t == GGUF_TYPE_BOOL && v->v.b > 1)
		return check_bools(c, p, 1, what);
	return 0;
}

/* ---------------------------------------------------------------- header */

static int rd_kvs(struct gguf *g, struct cur *c, uint64_t n)
{
	if (n > left(c) / GGUF_MIN_KV)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "header claims %llu key/value pairs, more than "
		                  "the %llu bytes of the file hold",
		                  (unsigned long long)n,
		                  (unsigned long long)c->len);
	g->kv = n ? calloc((size_t)n, sizeof(*g->kv)) : NULL;
	if (n && !g->kv)
		return errors_fmt(c->err, c->errlen, KVT_ENOMEM,
		                  "no memory for %llu keys",
		                  (unsigned long long)n);
	for (uint64_t i = 0; i < n; i++) {
		struct gguf_kv *kv = &g->kv[i];
		uint32_t t;
		int rc = rd_str(c, &kv->key, "metadata key");
		if (rc == 0 && (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY))
			rc = errors_fmt(c->err, c->errlen, KVT_EINVAL,
			                "metadata key %llu has length %llu (1.."
			                "%u)", (unsigned long long)i,
			                (unsigned long long)kv->key.len,
			                GGUF_MAX_KEY);
		if (rc == 0)
			rc = rd_u32(c, &t, "metadata value type");
		g->n_kv = (size_t)i + 1; /* so gguf_close frees what was read */
		if (rc == 0) {
			/* A reason naming the key: "value of general.name". */
			char what[96];
			snprintf(what, sizeof(what), "value of %.*s",
			         (int)(kv->key.len < 64 ? kv->key.len : 64),
			         kv->key.p);
			rc = rd_value(c, t, &kv->val, 0, what);
		}
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int rd_tensor(struct cur *c, struct gguf_tensor *t, uint64_t i)
{
	struct gguf_str name;
	uint32_t type;
	int rc = rd_str(c, &name, "tensor name");
	if (rc < 0)
		return rc;
	if (name.len == 0 || name.len > GGUF_MAX_NAME ||
	    memchr(name.p, 0, name.len))
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "tensor %llu: name of %llu bytes (1..%d, no "
		                  "NUL)", (unsigned long long)i,
		                  (unsigned long long)name.len, GGUF_MAX_NAME);
	memcpy(t->name, name.p, name.len);
	t->name[name.len] = 0;
	if ((rc = rd_u32(c, &t->n_dims, "tensor n_dims")) < 0)
		return rc;
	if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "tensor %s has %u dimensions (1..%d)", t->name,
		                  t->n_dims, GGUF_MAX_DIMS);
	t->n_elem = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = 1;
		if (d < t->n_dims &&
		    (rc = rd_u64(c, &t->ne[d], "tensor dimension")) < 0)
			return rc;
		/* ggml holds sizes in int64_t: the product must fit one. */
		if (t->ne[d] == 0 || t->ne[d] > INT64_MAX ||
		    __builtin_mul_overflow(t->n_elem, t->ne[d], &t->n_elem) ||
		    t->n_elem > INT64_MAX)
			return errors_fmt(c->err, c->errlen, KVT_EINVAL,
			                  "tensor %s: dimension %u is %llu (zero, "
			                  "or the element count overflows)",
			                  t->name, d,
			                  (unsigned long long)t->ne[d]);
	}
	if ((rc = rd_u32(c, &type, "tensor type")) < 0 ||
	    (rc = rd_u64(c, &t->offset, "tensor offset")) < 0)
		return rc;
	uint32_t blck, bytes;
	if (gguf_type_block((enum gguf_ggml_type)type, &blck, &bytes) < 0)
		return errors_fmt(c->err, c->errlen, KVT_ENOTSUP,
		                  "tensor %s has unknown tensor type %u", t->name,
		                  type);
	t->type = (enum gguf_ggml_type)type;
	if (t->ne[0] % blck)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "tensor %s: row of %llu elements is not a "
		                  "whole number of %s blocks of %u", t->name,
		                  (unsigned long long)t->ne[0],
		                  gguf_type_name(t->type), blck);
	/* n_elem < 2^63 and bytes/blck <= 36, so this cannot overflow. */
	t->n_bytes = t->n_elem / blck * bytes;
	return 0;
}

static int rd_tensors(struct gguf *g, struct cur *c, uint64_t n)
{
	if (n > left(c) / GGUF_MIN_TENSOR)
		return errors_fmt(c->err, c->errlen, KVT_EINVAL,
		                  "header claims %llu tensors, more than the "
		                  "%llu bytes of the file hold",
		                  (unsigned long long)n,
		                  (unsigned long long)c->len);
	g->t = n ? calloc((size_t)n, sizeof(*g->t)) : NULL;
	if (n && !g->t)
		return errors_fmt(c->err, c->errlen, KVT_ENOMEM,
		                  "no memory for %llu tensors",
		                  (unsigned long long)n);
	g->n_t = (size_t)n;
	for (uint64_t i = 0; i < n; i++) {
		int rc = rd_tensor(c, &g->t[i], i);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int rd_alignment(struct gguf *g, char *err, size_t errlen)
{
	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	const struct gguf_value *v = gguf_find(g, "general.alignment");
	if (!v)
		return 0;
	if (v->type != GGUF_TYPE_UINT32 || v->v.u == 0 ||
	    (v->v.u & (v->v.u - 1)))
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "general.alignment must be a uint32 power of "
		                  "two (got a %s)",
		                  gguf_value_type_name(v->type));
	g->alignment = (uint32_t)v->v.u;
	return 0;
}

/* ---------------------------------------------------------------- indexes */

/* qsort has no context argument: the array being sorted is passed here. */
static __thread const struct gguf *sort_g;

static int str_cmp(struct gguf_str a, struct gguf_str b)
{
	int r = memcmp(a.p, b.p, a.len < b.len ? a.len : b.len);
	return r ? r : (a.len > b.len) - (a.len < b.len);
}

static int cmp_kv(const void *a, const void *b)
{
	return str_cmp(sort_g->kv[*(const size_t *)a].key,
	               sort_g->kv[*(const size_t *)b].key);
}

static int cmp_tname(const void *a, const void *b)
{
	return strcmp(sort_g->t[*(const size_t *)a].name,
	              sort_g->t[*(const size_t *)b].name);
}

static int cmp_toff(const void *a, const void *b)
{
	uint64_t x = sort_g->t[*(const size_t *)a].offset;
	uint64_t y = sort_g->t[*(const size_t *)b].offset;
	return (x > y) - (x < y);
}

static size_t *sorted(const struct gguf *g, size_t n,
                      int (*cmp)(const void *, const void *))
{
	size_t *idx = malloc((n ? n : 1) * sizeof(*idx));
	if (!idx)
		return NULL;
	for (size_t i = 0; i < n; i++)
		idx[i] = i;
	sort_g = g;
	qsort(idx, n, sizeof(*idx), cmp);
	return idx;
}

static int build_indexes(struct gguf *g, char *err, size_t errlen)
{
	g->kv_idx = sorted(g, g->n_kv, cmp_kv);
	g->t_idx = sorted(g, g->n_t, cmp_tname);
	if (!g->kv_idx || !g->t_idx)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory for the "
		                  "key and tensor indexes");
	for (size_t i = 1; i < g->n_kv; i++) {
		const struct gguf_str *k = &g->kv[g->kv_idx[i]].key;
		if (!str_cmp(*k, g->kv[g->kv_idx[i - 1]].key))
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "duplicate metadata key %.*s",
			                  (int)(k->len < 200 ? k->len : 200),
			                  k->p);
	}
	for (size_t i = 1; i < g->n_t; i++)
		if (!strcmp(g->t[g->t_idx[i]].name,
		            g->t[g->t_idx[i - 1]].name))
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "duplicate tensor name %s",
			                  g->t[g->t_idx[i]].name);
	return 0;
}

/* Tensor data: aligned, inside the file, no two tensors overlapping. */
static int check_data(struct gguf *g, uint64_t header_end, char *err,
                      size_t errlen)
{
	uint64_t a = g->alignment;
	g->data_off = header_end + (a - header_end % a) % a;
	uint64_t avail = g->size > g->data_off ? g->size - g->data_off : 0;
	for (size_t i = 0; i < g->n_t; i++) {
		struct gguf_tensor *t = &g->t[i];
		if (t->offset % a)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "tensor %s: offset %llu is not a "
			                  "multiple of the alignment %u", t->name,
			                  (unsigned long long)t->offset,
			                  g->alignment);
		if (t->offset > avail || t->n_bytes > avail - t->offset)
			return errors_fmt(err, errlen, KVT_EINVAL,
			                  "tensor %s: data [%llu, +%llu) beyond "
			                  "the end of the file (data section of "
			                  "%llu bytes at byte %llu)", t->name,
			                  (unsigned long long)t->offset,
			                  (unsigned long long)t->n_bytes,
			                  (unsigned long long)avail,
			                  (unsigned long long)g->data_off);
		t->data = g->base + g->data_off + t->offset;
	}
	size_t *by_off = sorted(g, g->n_t, cmp_toff);
	if (!by_off)
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	int rc = 0;
	for (size_t i = 1; i < g->n_t && rc == 0; i++) {
		const struct gguf_tensor *p = &g->t[by_off[i - 1]];
		const struct gguf_tensor *q = &g->t[by_off[i]];
		if (p->offset + p->n_bytes > q->offset)
			rc = errors_fmt(err, errlen, KVT_EINVAL,
			                "tensors %s and %s overlap", p->name,
			                q->name);
	}
	free(by_off);
	return rc;
}

static int parse(struct gguf *g, char *err, size_t errlen)
{
	struct cur c = {g->base, g->size, 0, err, errlen};
	uint64_t n_t, n_kv;
	const uint8_t *magic = take(&c, 4, "magic");
	if (!magic)
		return KVT_EINVAL;
	if (memcmp(magic, GGUF_MAGIC, 4))
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "not a GGUF file (magic %02x %02x %02x %02x)",
		                  magic[0], magic[1], magic[2], magic[3]);
	int rc = rd_u32(&c, &g->version, "version");
	if (rc < 0)
		return rc;
	/* A big-endian file has its small version number in the top bytes. */
	if (g->version && !(g->version & 0xffffu))
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "big-endian GGUF (version bytes 0x%08x): not "
		                  "supported", g->version);
	if (g->version != GGUF_VERSION)
		return errors_fmt(err, errlen, KVT_EVERSION,
		                  "GGUF version %u: only version %d is "
		                  "supported", g->version, GGUF_VERSION);
	if ((rc = rd_u64(&c, &n_t, "tensor count")) < 0 ||
	    (rc = rd_u64(&c, &n_kv, "metadata count")) < 0 ||
	    (rc = rd_kvs(g, &c, n_kv)) < 0 ||
	    (rc = rd_tensors(g, &c, n_t)) < 0 ||
	    (rc = build_indexes(g, err, errlen)) < 0 ||
	    (rc = rd_alignment(g, err, errlen)) < 0)
		return rc;
	return check_data(g, c.off, err, errlen);
}

/* ---------------------------------------------------------------- open */

static int open_buf(const uint8_t *buf, uint64_t len, int mapped,
                    struct gguf **out, char *err, size_t errlen)
{
	struct gguf *g = calloc(1, sizeof(*g));
	if (!g) {
		if (mapped)
			munmap((void *)buf, (size_t)len);
		return errors_fmt(err, errlen, KVT_ENOMEM, "no memory");
	}
	g->base = buf;
	g->size = len;
	g->mapped = mapped;
	int rc = parse(g, err, errlen);
	if (rc < 0) {
		gguf_close(g);
		return rc;
	}
	*out = g;
	return 0;
}

int gguf_open_mem(const void *buf, size_t len, struct gguf **out, char *err,
                  size_t errlen)
{
	if (!out)
		return errors_fmt(err, errlen, KVT_EINVAL, "NULL out");
	*out = NULL;
	if (!buf && len)
		return errors_fmt(err, errlen, KVT_EINVAL, "NULL buffer");
	return open_buf(buf, len, 0, out, err, errlen);
}

int gguf_open(const char *path, struct gguf **out, char *err, size_t errlen)
{
	if (!out || !path)
		return errors_fmt(err, errlen, KVT_EINVAL, "NULL argument");
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errors_fmt(err, errlen, KVT_ESYS, "%s: %s", path,
		                  strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return errors_fmt(err, errlen, KVT_ESYS, "%s: %s", path,
		                  strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "%s: not a regular file", path);
	}
	if ((uint64_t)st.st_size < GGUF_HEADER) {
		close(fd);
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "%s: truncated: %lld bytes, a GGUF header "
		                  "needs %u", path, (long long)st.st_size,
		                  GGUF_HEADER);
	}
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	int e = errno;
	close(fd);
	if (m == MAP_FAILED)
		return errors_fmt(err, errlen, KVT_ESYS, "%s: mmap: %s", path,
		                  strerror(e));
	int rc = open_buf(m, (uint64_t)st.st_size, 1, out, err, errlen);
	if (rc < 0 && err && errlen) {
		/* Prefix the path to the parser's reason. */
		char why[KVT_ERRTEXT_MAX];
		snprintf(why, sizeof(why), "%s", err);
		snprintf(err, errlen, "%s: %s", path, why);
	}
	return rc;
}

void gguf_close(struct gguf *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->n_kv; i++)
		free_value(&g->kv[i].val);
	free(g->kv);
	free(g->kv_idx);
	free(g->t);
	free(g->t_idx);
	if (g->mapped)
		munmap((void *)g->base, (size_t)g->size);
	free(g);
}

/* ---------------------------------------------------------------- access */

uint32_t gguf_version(const struct gguf *g)
{
	return g->version;
}

uint32_t gguf_alignment(const struct gguf *g)
{
	return g->alignment;
}

uint64_t gguf_data_offset(const struct gguf *g)
{
	return g->data_off;
}

size_t gguf_kv_count(const struct gguf *g)
{
	return g->n_kv;
}

const struct gguf_kv *gguf_kv_at(const struct gguf *g, size_t i)
{
	return i < g->n_kv ? &g->kv[i] : NULL;
}

int gguf_str_eq(struct gguf_str s, const char *c)
{
	size_t n = strlen(c);
	return s.len == n && !memcmp(s.p, c, n);
}

const struct gguf_value *gguf_find(const struct gguf *g, const char *key)
{
	/* Binary search of the sorted index; before the index exists
	 * (during parsing) there is nothing to find. */
	if (!g->kv_idx)
		return NULL;
	struct gguf_str k = {key, strlen(key)};
	size_t lo = 0, hi = g->n_kv;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = str_cmp(g->kv[g->kv_idx[mid]].key, k);
		if (r == 0)
			return &g->kv[g->kv_idx[mid]].val;
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

size_t gguf_tensor_count(const struct gguf *g)
{
	return g->n_t;
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, size_t i)
{
	return i < g->n_t ? &g->t[i] : NULL;
}

const struct gguf_tensor *gguf_tensor_find(const struct gguf *g,
                                           const char *name)
{
	size_t lo = 0, hi = g->n_t;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = strcmp(g->t[g->t_idx[mid]].name, name);
		if (r == 0)
			return &g->t[g->t_idx[mid]];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int gguf_arr_item(const struct gguf_value *v, uint64_t i,
                  struct gguf_value *out)
{
	if (!v || v->type != GGUF_TYPE_ARRAY || i >= v->v.arr.n)
		return KVT_EINVAL;
	if (v->v.arr.items) {
		*out = v->v.arr.items[i];
		return 0;
	}
	int es = vsize(v->v.arr.type);
	decode_fixed(v->v.arr.type, v->v.arr.data + i * (uint64_t)es, out);
	return 0;
}

static int lookup(const struct gguf *g, const char *key,
                  const struct gguf_value **v, char *err, size_t errlen)
{
	*v = gguf_find(g, key);
	if (!*v)
		return errors_fmt(err, errlen, KVT_EINVAL, "missing key %s",
		                  key);
	return 0;
}

static int wrong_type(const char *key, const struct gguf_value *v,
                      const char *want, char *err, size_t errlen)
{
	return errors_fmt(err, errlen, KVT_EINVAL, "%s is a %s, expected %s",
	                  key, gguf_value_type_name(v->type), want);
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out,
                 char *err, size_t errlen)
{
	const struct gguf_value *v;
	int rc = lookup(g, key, &v, err, errlen);
	if (rc < 0)
		return rc;
	int unsig = v->type == GGUF_TYPE_UINT8 || v->type == GGUF_TYPE_UINT16 ||
	            v->type == GGUF_TYPE_UINT32 || v->type == GGUF_TYPE_UINT64;
	int sig = v->type == GGUF_TYPE_INT8 || v->type == GGUF_TYPE_INT16 ||
	          v->type == GGUF_TYPE_INT32 || v->type == GGUF_TYPE_INT64;
	if (!unsig && !sig)
		return wrong_type(key, v, "an integer", err, errlen);
	if ((unsig && v->v.u > UINT32_MAX) ||
	    (sig && (v->v.i < 0 || v->v.i > (int64_t)UINT32_MAX)))
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "%s is out of the uint32 range", key);
	*out = unsig ? (uint32_t)v->v.u : (uint32_t)v->v.i;
	return 0;
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out,
                 char *err, size_t errlen)
{
	const struct gguf_value *v;
	int rc = lookup(g, key, &v, err, errlen);
	if (rc < 0)
		return rc;
	if (v->type != GGUF_TYPE_FLOAT32 && v->type != GGUF_TYPE_FLOAT64)
		return wrong_type(key, v, "a float", err, errlen);
	*out = (float)v->v.f;
	return 0;
}

int gguf_get_bool(const struct gguf *g, const char *key, int *out,
                  char *err, size_t errlen)
{
	const struct gguf_value *v;
	int rc = lookup(g, key, &v, err, errlen);
	if (rc < 0)
		return rc;
	if (v->type != GGUF_TYPE_BOOL)
		return wrong_type(key, v, "a bool", err, errlen);
	*out = v->v.b;
	return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out,
                 char *err, size_t errlen)
{
	const struct gguf_value *v;
	int rc = lookup(g, key, &v, err, errlen);
	if (rc < 0)
		return rc;
	if (v->type != GGUF_TYPE_STRING)
		return wrong_type(key, v, "a string", err, errlen);
	*out = v->v.s;
	return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_type elem,
                 const struct gguf_value **out, char *err, size_t errlen)
{
	const struct gguf_value *v;
	int rc = lookup(g, key, &v, err, errlen);
	if (rc < 0)
		return rc;
	if (v->type != GGUF_TYPE_ARRAY || v->v.arr.type != elem)
		return errors_fmt(err, errlen, KVT_EINVAL,
		                  "%s is a %s%s%s, expected an array of %s", key,
		                  gguf_value_type_name(v->type),
		                  v->type == GGUF_TYPE_ARRAY ? " of " : "",
		                  v->type == GGUF_TYPE_ARRAY
		                      ? gguf_value_type_name(v->v.arr.type)
		                      : "",
		                  gguf_value_type_name(elem));
	*out = v;
	return 0;
}
