/*
 * weights.c — safetensors reader/writer for the learned scorers; see
 * weights.h.  Tested in policies/weights_test.c (`kvtrim-tests weights`).
 *
 * Format (huggingface/safetensors): u64 little-endian header length N, N
 * bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, ...,
 * "__metadata__": {...}}, then the data section; offsets are relative to
 * its start.  The whole header is validated before any data is read, and
 * every value after conversion, so a policy never meets a half-checked
 * tensor.  Data are read with pread into one float32 arena: no mmap, so a
 * file replaced or truncated under a running daemon cannot fault it.
 */
#include "errors.h"
#include "weights.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "weights.c reads and writes little-endian data in place"
#endif

/* Largest header we parse: the format's own reference refuses > 100 MB. */
#define WEIGHTS_MAX_HEADER (100u * 1000u * 1000u)
/* config.json is a handful of keys; anything larger is not one. */
#define WEIGHTS_MAX_CONFIG (1u << 20)
/* Elements per f16/bf16 read: bounds the staging buffer at 128 KiB. */
#define WEIGHTS_CHUNK 65536u
/* JSON numbers are doubles: integers are exact below 2^53. */
#define WEIGHTS_MAX_INT 9007199254740992.0

struct wtensor {
	char *name;
	uint32_t ndim;
	uint64_t shape[WEIGHTS_MAX_DIMS];
	uint64_t numel;
	enum kvt_dtype dt;
	uint64_t begin, end; /* bytes, relative to the data section */
	float *data;         /* [numel], into weights.arena */
};

struct weights {
	size_t n;
	struct wtensor *t; /* [n], header order */
	float *arena;      /* every tensor's float32 values */
	cJSON *config;     /* config.json object, or NULL */
};

static void shape_str(char *buf, size_t len, uint32_t ndim,
                      const uint64_t *shape)
{
	size_t o = 0;
	o += (size_t)snprintf(buf + o, len - o, "[");
	for (uint32_t i = 0; i < ndim && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? "," : "",
		                      (unsigned long long)shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

/* Reads exactly len bytes at off; 0, or KVT_ESYS / KVT_EINVAL (short). */
static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;
	while (len) {
		ssize_t r = pread(fd, p, len, (off_t)off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return KVT_ESYS;
		}
		if (r == 0)
			return KVT_EINVAL; /* file shrank under us */
		p += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* A JSON number that is an integer in [0, max]. */
static int json_uint(const cJSON *j, double max, uint64_t *out)
{
	if (!cJSON_IsNumber(j))
		return 0;
	double d = j->valuedouble;
	if (!(d >= 0 && d <= max) || d != floor(d))
		return 0;
	*out = (uint64_t)d;
	return 1;
}

/* The safetensors name of a dtype this file reads and writes. */
static const char *dtype_name(enum kvt_dtype dt)
{
	return dt == KVT_DTYPE_F16 ? "F16" : dt == KVT_DTYPE_BF16 ? "BF16" : "F32";
}

static int parse_dtype(const char *s, enum kvt_dtype *dt)
{
	if (!strcmp(s, "F32"))
		*dt = KVT_DTYPE_F32;
	else if (!strcmp(s, "F16"))
		*dt = KVT_DTYPE_F16;
	else if (!strcmp(s, "BF16"))
		*dt = KVT_DTYPE_BF16;
	else
		return 0;
	return 1;
}

/* Fills t from one header entry; data_len is the data section's size. */
static int parse_entry(const cJSON *e, struct wtensor *t, uint64_t data_len,
                       char *err, size_t errlen)
{
	const char *name = e->string;
	if (!cJSON_IsObject(e))
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s: entry is not an object", name);
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
	const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
	if (!dt)
		return errors_fmt(err, errlen, KVT_EINVAL, "tensor %s has no dtype",
		            name);
	if (!sh)
		return errors_fmt(err, errlen, KVT_EINVAL, "tensor %s has no shape",
		            name);
	if (!of)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s has no data_offsets", name);
	if (!cJSON_IsString(dt))
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s: dtype is not a string", name);
	if (!parse_dtype(dt->valuestring, &t->dt))
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s has unsupported dtype %s (want F32, "
		            "F16 or BF16)", name, dt->valuestring);
	if (!cJSON_IsArray(sh))
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s: shape is not an array", name);
	int nd = cJSON_GetArraySize(sh);
	if (nd > WEIGHTS_MAX_DIMS)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s has %d dimensions, at most %d supported",
		            name, nd, WEIGHTS_MAX_DIMS);
	t->ndim = (uint32_t)nd;
	t->numel = 1;
	const cJSON *d;
	uint32_t i = 0;
	cJSON_ArrayForEach(d, sh)
	{
		uint64_t v;
		if (!json_uint(d, WEIGHTS_MAX_INT, &v))
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "tensor %s: shape[%u] is not a non-negative "
			            "integer", name, i);
		t->shape[i++] = v;
		if (v && t->numel > UINT64_MAX / 8 / v)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "tensor %s: shape too large", name);
		t->numel *= v;
	}
	if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2 ||
	    !json_uint(cJSON_GetArrayItem(of, 0), WEIGHTS_MAX_INT, &t->begin) ||
	    !json_uint(cJSON_GetArrayItem(of, 1), WEIGHTS_MAX_INT, &t->end))
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s: data_offsets is not [begin, end] of "
		            "non-negative integers", name);
	if (t->end < t->begin)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s: data_offsets [%llu, %llu] end before "
		            "begin", name, (unsigned long long)t->begin,
		            (unsigned long long)t->end);
	uint64_t want = t->numel * kvt_dtype_size(t->dt);
	if (t->end - t->begin != want) {
		char s[128];
		shape_str(s, sizeof(s), t->ndim, t->shape);
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s: data_offsets [%llu, %llu] span %llu "
		            "bytes, shape %s of %s needs %llu", name,
		            (unsigned long long)t->begin,
		            (unsigned long long)t->end,
		            (unsigned long long)(t->end - t->begin), s,
		            dt->valuestring, (unsigned long long)want);
	}
	if (t->end > data_len)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "tensor %s: data_offsets [%llu, %llu] beyond the "
		            "%llu-byte data section", name,
		            (unsigned long long)t->begin,
		            (unsigned long long)t->end,
		            (unsigned long long)data_len);
	return 0;
}

static int cmp_begin(const void *a, const void *b)
{
	const struct wtensor *x = *(const struct wtensor *const *)a;
	const struct wtensor *y = *(const struct wtensor *const *)b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

static int check_overlaps(struct weights *w, char *err, size_t errlen)
{
	if (w->n < 2)
		return 0;
	struct wtensor **by = malloc(w->n * sizeof(*by));
	if (!by)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	for (size_t i = 0; i < w->n; i++)
		by[i] = &w->t[i];
	qsort(by, w->n, sizeof(*by), cmp_begin);
	int rv = 0;
	for (size_t i = 1; i < w->n; i++) {
		if (by[i]->begin < by[i - 1]->end) {
			rv = errors_fmt(err, errlen, KVT_EINVAL,
			          "tensor %s [%llu, %llu) overlaps tensor %s "
			          "[%llu, %llu)", by[i]->name,
			          (unsigned long long)by[i]->begin,
			          (unsigned long long)by[i]->end,
			          by[i - 1]->name,
			          (unsigned long long)by[i - 1]->begin,
			          (unsigned long long)by[i - 1]->end);
			break;
		}
	}
	free(by);
	return rv;
}

/* Reads and converts every tensor, then checks every value is finite. */
static int read_tensors(struct weights *w, int fd, uint64_t data_off,
                        const char *path, char *err, size_t errlen)
{
	uint64_t total = 0;
	for (size_t i = 0; i < w->n; i++)
		total += w->t[i].numel; /* bounded by the file size */
	if (total) {
		w->arena = malloc(total * sizeof(float));
		if (!w->arena)
			return errors_fmt(err, errlen, KVT_ENOMEM,
			            "out of memory for %llu floats",
			            (unsigned long long)total);
	}
	uint16_t *stage = NULL;
	int rv = 0;
	float *next = w->arena;
	for (size_t i = 0; i < w->n && !rv; i++) {
		struct wtensor *t = &w->t[i];
		/* An empty tensor has no storage (data stays NULL): with
		 * only empty tensors the arena is NULL, and NULL + 0 is
		 * undefined in C (found by fuzz_weights). */
		if (t->numel) {
			t->data = next;
			next += t->numel;
		}
		uint64_t off = data_off + t->begin;
		if (t->dt == KVT_DTYPE_F32) {
			rv = read_at(fd, t->data, t->numel * sizeof(float), off);
		} else {
			if (!stage && !(stage = malloc(WEIGHTS_CHUNK * 2))) {
				rv = errors_fmt(err, errlen, KVT_ENOMEM,
				          "out of memory");
				break;
			}
			for (uint64_t j = 0; j < t->numel && !rv;
			     j += WEIGHTS_CHUNK) {
				size_t m = t->numel - j < WEIGHTS_CHUNK
				                   ? (size_t)(t->numel - j)
				                   : WEIGHTS_CHUNK;
				rv = read_at(fd, stage, m * 2, off + j * 2);
				if (!rv)
					dtype_to_f32(stage, t->dt, t->data + j,
					             m);
			}
		}
		if (rv == KVT_ESYS)
			rv = errors_fmt(err, errlen, rv, "%s: read tensor %s: %s",
			          path, t->name, strerror(errno));
		else if (rv)
			rv = errors_fmt(err, errlen, rv,
			          "%s: file shrank while reading tensor %s",
			          path, t->name);
		for (uint64_t j = 0; j < t->numel && !rv; j++) {
			if (!isfinite(t->data[j]))
				rv = errors_fmt(err, errlen, KVT_EINVAL,
				          "tensor %s has %s at index %llu",
				          t->name,
				          isnan(t->data[j]) ? "NaN" : "Inf",
				          (unsigned long long)j);
		}
	}
	free(stage);
	return rv;
}

/* Parses the header JSON into w->t (no data read yet). */
static int parse_header(struct weights *w, const char *hdr, size_t hlen,
                        uint64_t data_len, char *err, size_t errlen)
{
	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
	if (!root)
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "header is not valid JSON (at byte %td of %zu)",
		            end ? end - hdr : (ptrdiff_t)0, hlen);
	int rv = 0;
	/* The format allows only space padding after the object; anything
	 * else means the length or the writer is wrong. */
	for (const char *c = end; c && c < hdr + hlen; c++) {
		if (*c != ' ' && *c != '\t' && *c != '\n' && *c != '\r') {
			rv = errors_fmt(err, errlen, KVT_EINVAL,
			          "header has bytes after the JSON object (at "
			          "byte %td of %zu)", c - hdr, hlen);
			goto out;
		}
	}
	if (!cJSON_IsObject(root)) {
		rv = errors_fmt(err, errlen, KVT_EINVAL,
		          "header JSON is not an object");
		goto out;
	}
	size_t n = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, root)
	{
		if (strcmp(e->string, "__metadata__"))
			n++;
	}
	w->t = calloc(n ? n : 1, sizeof(*w->t));
	if (!w->t) {
		rv = errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
		goto out;
	}
	cJSON_ArrayForEach(e, root)
	{
		if (!strcmp(e->string, "__metadata__"))
			continue;
		for (size_t i = 0; i < w->n; i++) {
			if (!strcmp(w->t[i].name, e->string)) {
				rv = errors_fmt(err, errlen, KVT_EINVAL,
				          "tensor %s appears twice in the "
				          "header", e->string);
				goto out;
			}
		}
		struct wtensor *t = &w->t[w->n];
		if ((rv = parse_entry(e, t, data_len, err, errlen)) != 0)
			goto out;
		if (!(t->name = strdup(e->string))) {
			rv = errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
			goto out;
		}
		w->n++;
	}
out:
	cJSON_Delete(root);
	return rv;
}

/* Reads a whole small file into a NUL-terminated buffer. */
static int slurp(const char *path, size_t max, char **out, size_t *len,
                 char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errors_fmt(err, errlen, KVT_ESYS, "cannot open %s: %s", path,
		            strerror(errno));
	struct stat st;
	int rv = 0;
	char *buf = NULL;
	if (fstat(fd, &st) < 0) {
		rv = errors_fmt(err, errlen, KVT_ESYS, "cannot stat %s: %s", path,
		          strerror(errno));
		goto out;
	}
	if ((uint64_t)st.st_size > max) {
		rv = errors_fmt(err, errlen, KVT_EINVAL, "%s is larger than %zu bytes",
		          path, max);
		goto out;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		rv = errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
		goto out;
	}
	if ((rv = read_at(fd, buf, (size_t)st.st_size, 0)) != 0) {
		rv = errors_fmt(err, errlen, rv, "cannot read %s: %s", path,
		          rv == KVT_ESYS ? strerror(errno) : "file shrank");
		free(buf);
		buf = NULL;
		goto out;
	}
	buf[st.st_size] = 0;
	*len = (size_t)st.st_size;
out:
	close(fd);
	*out = buf;
	return rv;
}

static int load_config(struct weights *w, const char *path, char *err,
                       size_t errlen)
{
	char *buf;
	size_t len = 0;
	int rv = slurp(path, WEIGHTS_MAX_CONFIG, &buf, &len, err, errlen);
	if (rv)
		return rv;
	w->config = cJSON_ParseWithLength(buf, len);
	free(buf);
	if (!w->config || !cJSON_IsObject(w->config))
		return errors_fmt(err, errlen, KVT_EINVAL,
		            "%s is not a JSON object", path);
	return 0;
}

static int load_file(struct weights *w, const char *path, char *err,
                     size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errors_fmt(err, errlen, KVT_ESYS, "cannot open %s: %s", path,
		            strerror(errno));
	int rv = 0;
	char *hdr = NULL;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rv = errors_fmt(err, errlen, KVT_ESYS, "cannot stat %s: %s", path,
		          strerror(errno));
		goto out;
	}
	uint64_t size = (uint64_t)st.st_size;
	if (size < 8) {
		rv = errors_fmt(err, errlen, KVT_EINVAL,
		          "%s is %llu bytes, shorter than the 8-byte header "
		          "length", path, (unsigned long long)size);
		goto out;
	}
	uint64_t hlen;
	if ((rv = read_at(fd, &hlen, 8, 0)) != 0) {
		rv = errors_fmt(err, errlen, rv, "cannot read %s", path);
		goto out;
	}
	if (hlen > WEIGHTS_MAX_HEADER) {
		rv = errors_fmt(err, errlen, KVT_EINVAL,
		          "%s: header length %llu is over the 100 MB limit",
		          path, (unsigned long long)hlen);
		goto out;
	}
	if (hlen > size - 8) {
		rv = errors_fmt(err, errlen, KVT_EINVAL,
		          "%s: header length %llu runs beyond the %llu-byte "
		          "file", path, (unsigned long long)hlen,
		          (unsigned long long)size);
		goto out;
	}
	if (!(hdr = malloc(hlen + 1))) {
		rv = errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
		goto out;
	}
	if ((rv = read_at(fd, hdr, hlen, 8)) != 0) {
		rv = errors_fmt(err, errlen, rv, "cannot read %s header", path);
		goto out;
	}
	hdr[hlen] = 0;
	if ((rv = parse_header(w, hdr, hlen, size - 8 - hlen, err, errlen)))
		goto out;
	if ((rv = check_overlaps(w, err, errlen)))
		goto out;
	rv = read_tensors(w, fd, 8 + hlen, path, err, errlen);
out:
	free(hdr);
	close(fd);
	return rv;
}

int weights_load(const char *path, struct weights **out, char *err,
                 size_t errlen)
{
	*out = NULL;
	if (err && errlen)
		err[0] = 0;
	struct weights *w = calloc(1, sizeof(*w));
	if (!w)
		return errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
	struct stat st;
	int rv;
	if (stat(path, &st) < 0) {
		rv = errors_fmt(err, errlen, KVT_ESYS, "cannot open %s: %s", path,
		          strerror(errno));
		goto fail;
	}
	if (S_ISDIR(st.st_mode)) {
		/* kvpress layout: dir/model.safetensors [+ dir/config.json] */
		size_t n = strlen(path) + sizeof("/model.safetensors");
		char *p = malloc(n);
		if (!p) {
			rv = errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
			goto fail;
		}
		snprintf(p, n, "%s/config.json", path);
		rv = 0;
		if (access(p, F_OK) == 0)
			rv = load_config(w, p, err, errlen);
		if (!rv) {
			snprintf(p, n, "%s/model.safetensors", path);
			rv = load_file(w, p, err, errlen);
		}
		free(p);
	} else {
		rv = load_file(w, path, err, errlen);
	}
	if (rv)
		goto fail;
	*out = w;
	return 0;
fail:
	weights_free(w);
	return rv;
}

void weights_free(struct weights *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n; i++)
		free(w->t[i].name);
	free(w->t);
	free(w->arena);
	cJSON_Delete(w->config);
	free(w);
}

static const struct wtensor *find(const struct weights *w, const char *name)
{
	for (size_t i = 0; i < w->n; i++)
		if (!strcmp(w->t[i].name, name))
			return &w->t[i];
	return NULL;
}

const float *weights_get(const struct weights *w, const char *name,
                         uint32_t ndim, const uint64_t *shape, char *err,
                         size_t errlen)
{
	const struct wtensor *t = find(w, name);
	if (!t) {
		errors_fmt(err, errlen, KVT_EINVAL, "missing tensor %s", name);
		return NULL;
	}
	int same = t->ndim == ndim;
	for (uint32_t i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same) {
		char have[160], want[160];
		shape_str(have, sizeof(have), t->ndim, t->shape);
		if (ndim <= WEIGHTS_MAX_DIMS)
			shape_str(want, sizeof(want), ndim, shape);
		else
			snprintf(want, sizeof(want), "(%u dims)", ndim);
		errors_fmt(err, errlen, KVT_EINVAL, "tensor %s has shape %s, "
		     "expected %s", name, have, want);
		return NULL;
	}
	/* A tensor with no elements has no storage: give a valid pointer
	 * anyway so NULL always means failure. */
	static const float empty[1];
	return t->data ? t->data : empty;
}

int weights_has(const struct weights *w, const char *name)
{
	return find(w, name) != NULL;
}

size_t weights_count(const struct weights *w)
{
	return w->n;
}

const char *weights_name_at(const struct weights *w, size_t i)
{
	return i < w->n ? w->t[i].name : NULL;
}

int weights_config_u32(const struct weights *w, const char *key,
                       uint32_t *out)
{
	if (!w->config)
		return KVT_EINVAL;
	uint64_t v;
	if (!json_uint(cJSON_GetObjectItemCaseSensitive(w->config, key),
	               (double)UINT32_MAX, &v))
		return KVT_EINVAL;
	*out = (uint32_t)v;
	return 0;
}

/* ---------------------------------------------------------------- writer */

static char *build_header(const struct weights_tensor *t, size_t n,
                          enum kvt_dtype dt, char *err, size_t errlen,
                          int *rv)
{
	cJSON *root = cJSON_CreateObject(), *meta;
	char *text = NULL;
	*rv = KVT_ENOMEM;
	if (!root)
		goto out;
	if (!(meta = cJSON_AddObjectToObject(root, "__metadata__")) ||
	    !cJSON_AddStringToObject(meta, "format", "pt"))
		goto out;
	uint64_t off = 0;
	for (size_t i = 0; i < n; i++) {
		uint64_t numel = 1;
		for (uint32_t d = 0; d < t[i].ndim; d++)
			numel *= t[i].shape[d];
		cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
		cJSON *sh = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
		cJSON *of = sh ? cJSON_AddArrayToObject(e, "data_offsets")
		               : NULL;
		if (!of || !cJSON_AddStringToObject(e, "dtype",
		                                     dtype_name(dt)))
			goto out;
		for (uint32_t d = 0; d < t[i].ndim; d++) {
			cJSON *v = cJSON_CreateNumber((double)t[i].shape[d]);
			if (!v || !cJSON_AddItemToArray(sh, v))
				goto out;
		}
		cJSON *b = cJSON_CreateNumber((double)off);
		off += numel * dtype_size(dt);
		cJSON *en = cJSON_CreateNumber((double)off);
		if (!b || !en) {
			cJSON_Delete(b);
			cJSON_Delete(en);
			goto out;
		}
		cJSON_AddItemToArray(of, b);
		cJSON_AddItemToArray(of, en);
	}
	text = cJSON_PrintUnformatted(root);
	if (text)
		*rv = 0;
out:
	if (*rv)
		errors_fmt(err, errlen, *rv, "out of memory");
	cJSON_Delete(root);
	return text;
}

static int check_tensors(const struct weights_tensor *t, size_t n,
                         enum kvt_dtype dt, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		if (!t[i].name || !t[i].name[0] ||
		    !strcmp(t[i].name, "__metadata__"))
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "tensor %zu has no usable name", i);
		if (t[i].ndim > 4)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "tensor %s has %u dimensions, at most 4",
			            t[i].name, t[i].ndim);
		uint64_t numel = 1;
		for (uint32_t d = 0; d < t[i].ndim; d++) {
			uint64_t v = t[i].shape[d];
			if (v > (1ull << 40) || (v && numel > (1ull << 40) / v))
				return errors_fmt(err, errlen, KVT_EINVAL,
				            "tensor %s is too large", t[i].name);
			numel *= v;
		}
		if (numel && !t[i].data)
			return errors_fmt(err, errlen, KVT_EINVAL,
			            "tensor %s has no data", t[i].name);
		/* The reader refuses these; better to fail at the writer,
		 * next to the trainer step that produced them.  A value is
		 * checked as it will be stored (f16 overflows past 65504). */
		for (uint64_t j = 0; j < numel; j++) {
			float v = t[i].data[j];
			if (dt != KVT_DTYPE_F32) {
				uint16_t h;
				dtype_from_f32(&v, dt, &h, 1);
				dtype_to_f32(&h, dt, &v, 1);
			}
			if (!isfinite(v))
				return errors_fmt(err, errlen, KVT_EINVAL,
				            "tensor %s has %s at index %llu%s%s",
				            t[i].name, isnan(v) ? "NaN" : "Inf",
				            (unsigned long long)j,
				            isfinite(t[i].data[j])
				                    ? " once stored as " : "",
				            isfinite(t[i].data[j])
				                    ? dtype_name(dt) : "");
		}
		for (size_t k = 0; k < i; k++)
			if (!strcmp(t[k].name, t[i].name))
				return errors_fmt(err, errlen, KVT_EINVAL,
				            "tensor %s appears twice", t[i].name);
	}
	return 0;
}

/* numel elements of t's float32 data as dt, converted in blocks; 1 on
 * success. */
static int write_data(FILE *f, const struct weights_tensor *t, size_t numel,
                      enum kvt_dtype dt)
{
	if (dt == KVT_DTYPE_F32)
		return fwrite(t->data ? (const void *)t->data : "", 4, numel,
		              f) == numel;
	uint16_t b[1024];
	for (size_t j = 0; j < numel; j += 1024) {
		size_t k = numel - j < 1024 ? numel - j : 1024;
		dtype_from_f32(t->data + j, dt, b, k);
		if (fwrite(b, 2, k, f) != k)
			return 0;
	}
	return 1;
}

int weights_write(const char *path, const struct weights_tensor *t, size_t n,
                  char *err, size_t errlen)
{
	return weights_write_as(path, t, n, KVT_DTYPE_F32, err, errlen);
}

int weights_write_as(const char *path, const struct weights_tensor *t,
                     size_t n, enum kvt_dtype dt, char *err, size_t errlen)
{
	int rv;
	if (err && errlen)
		err[0] = 0;
	if (!dtype_size(dt))
		return errors_fmt(err, errlen, KVT_EINVAL, "unknown dtype %d",
		                  (int)dt);
	if ((rv = check_tensors(t, n, dt, err, errlen)))
		return rv;
	char *hdr = build_header(t, n, dt, err, errlen, &rv);
	if (!hdr)
		return rv;

	size_t tlen = strlen(path) + 5;
	char *tmp = malloc(tlen);
	FILE *f = NULL;
	if (!tmp) {
		rv = errors_fmt(err, errlen, KVT_ENOMEM, "out of memory");
		goto out;
	}
	snprintf(tmp, tlen, "%s.tmp", path);
	if (!(f = fopen(tmp, "wbe"))) {
		rv = errors_fmt(err, errlen, KVT_ESYS, "cannot create %s: %s", tmp,
		          strerror(errno));
		goto out;
	}
	/* Pad the header with spaces (valid JSON whitespace) so the data
	 * section starts 8-byte aligned, as the reference writer does. */
	size_t len = strlen(hdr);
	uint64_t hlen = (uint64_t)((len + 7) & ~(size_t)7);
	int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(hdr, 1, len, f) == len;
	for (size_t i = len; ok && i < hlen; i++)
		ok = fputc(' ', f) != EOF;
	for (size_t i = 0; ok && i < n; i++) {
		size_t numel = 1;
		for (uint32_t d = 0; d < t[i].ndim; d++)
			numel *= (size_t)t[i].shape[d];
		ok = write_data(f, &t[i], numel, dt);
	}
	if (fflush(f) != 0 || fsync(fileno(f)) != 0)
		ok = 0;
	if (!ok)
		rv = errors_fmt(err, errlen, KVT_ESYS, "cannot write %s: %s", tmp,
		          strerror(errno));
	if (fclose(f) != 0 && ok)
		rv = errors_fmt(err, errlen, KVT_ESYS, "cannot write %s: %s", tmp,
		          strerror(errno));
	if (!rv && rename(tmp, path) != 0)
		rv = errors_fmt(err, errlen, KVT_ESYS, "cannot rename %s to %s: %s",
		          tmp, path, strerror(errno));
	if (rv)
		unlink(tmp);
out:
	free(tmp);
	cJSON_free(hdr);
	return rv;
}
