/*
 * learned.c — the private state of the learned policies (open, per-layer
 * tensors, fini) and loading and checking their weights; see learned.h and
 * docs/weights.md.
 */
#include "errors.h"
#include "learned.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Same limit as weights.c: a header beyond it is refused there anyway. */
#define LEARNED_MAX_HEADER (100u << 20)

int learned_load(const struct policy *p, struct weights **w, char *err,
                 size_t errlen)
{
	*w = NULL;
	if (!p->args.model[0])
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: model=PATH is required",
		              p->ops->name);
	char why[KVT_ERRTEXT_MAX] = "";
	int rc = weights_load(p->args.model, w, why, sizeof(why));
	if (rc == KVT_ENOMEM)
		return rc;
	if (rc)
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: model %s: %s", p->ops->name,
		              p->args.model, why);
	return 0;
}

int learned_open(struct policy *p, size_t size, char *err, size_t errlen)
{
	struct learned_priv *lp = calloc(1, size);
	if (!lp)
		return KVT_ENOMEM;
	p->priv = lp;
	return learned_load(p, &lp->w, err, errlen);
}

int learned_get_layers(struct policy *p, size_t layer_size,
                       const struct learned_tensor *t, size_t n, char *err,
                       size_t errlen)
{
	struct learned_priv *lp = p->priv;
	if (!(lp->layers = calloc(p->geom.n_layers, layer_size)))
		return KVT_ENOMEM;
	lp->layer_size = layer_size;
	for (uint32_t l = 0; l < p->geom.n_layers; l++) {
		char *ls = (char *)lp->layers + (size_t)l * layer_size;
		for (size_t i = 0; i < n; i++) {
			const float **d = (const float **)(ls + t[i].off);
			if (!(*d = learned_get(p, lp->w, err, errlen, t[i].ndim,
			                       t[i].shape, t[i].fmt, l)))
				return KVT_EPOLICY;
		}
	}
	return 0;
}

void learned_fini(struct policy *p)
{
	struct learned_priv *lp = p->priv;
	if (!lp)
		return;
	weights_free(lp->w);
	free(lp->layers);
	free(lp);
	p->priv = NULL;
}

static int read_full(int fd, void *buf, size_t n)
{
	char *b = buf;
	while (n) {
		ssize_t r = read(fd, b, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

int learned_shape(const char *path, const char *name, uint32_t *ndim,
                  uint64_t shape[4], char *err, size_t errlen)
{
	char file[KVT_SPEC_MAX + 32];
	struct stat st;
	if (stat(path, &st) < 0)
		return errors_fmt(err, errlen, KVT_EPOLICY, "cannot open %s: %s", path,
		              strerror(errno));
	snprintf(file, sizeof(file), S_ISDIR(st.st_mode)
	                                     ? "%s/model.safetensors"
	                                     : "%s", path);
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errors_fmt(err, errlen, KVT_EPOLICY, "cannot open %s: %s", file,
		              strerror(errno));
	uint8_t b8[8];
	uint64_t hlen = 0;
	int rc = 0;
	char *hdr = NULL;
	cJSON *j = NULL;
	if (read_full(fd, b8, 8)) {
		rc = errors_fmt(err, errlen, KVT_EPOLICY, "%s: cannot read the header", file);
		goto out;
	}
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | b8[i];
	if (hlen > LEARNED_MAX_HEADER || !(hdr = malloc(hlen + 1))) {
		rc = hlen > LEARNED_MAX_HEADER
		             ? errors_fmt(err, errlen, KVT_EPOLICY, "%s: header too long", file)
		             : KVT_ENOMEM;
		goto out;
	}
	if (read_full(fd, hdr, hlen)) {
		rc = errors_fmt(err, errlen, KVT_EPOLICY, "%s: truncated header", file);
		goto out;
	}
	hdr[hlen] = '\0';
	j = cJSON_Parse(hdr);
	const cJSON *t = j ? cJSON_GetObjectItemCaseSensitive(j, name) : NULL;
	const cJSON *sh = t ? cJSON_GetObjectItemCaseSensitive(t, "shape")
	                    : NULL;
	if (!j) {
		rc = errors_fmt(err, errlen, KVT_EPOLICY, "%s: header is not JSON", file);
		goto out;
	}
	if (!cJSON_IsArray(sh)) {
		rc = errors_fmt(err, errlen, KVT_EPOLICY, "missing tensor %s", name);
		goto out;
	}
	int n = cJSON_GetArraySize(sh);
	*ndim = (uint32_t)n;
	for (int i = 0; i < n && i < 4; i++) {
		const cJSON *d = cJSON_GetArrayItem(sh, i);
		if (!cJSON_IsNumber(d) || d->valuedouble < 0 ||
		    d->valuedouble > 4294967295.0) {
			rc = errors_fmt(err, errlen, KVT_EPOLICY, "tensor %s: bad shape", name);
			goto out;
		}
		shape[i] = (uint64_t)d->valuedouble;
	}
out:
	cJSON_Delete(j);
	free(hdr);
	close(fd);
	return rc;
}

const float *learned_get(const struct policy *p, const struct weights *w,
                         char *err, size_t errlen, uint32_t ndim,
                         const uint64_t *shape, const char *fmt, ...)
{
	char name[128], why[KVT_ERRTEXT_MAX] = "";
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	const float *d = weights_get(w, name, ndim, shape, why, sizeof(why));
	if (!d)
		errors_fmt(err, errlen, KVT_EPOLICY, "%s: model %s: %s", p->ops->name,
		       p->args.model, why);
	return d;
}

int learned_dim(const struct policy *p, const char *name, uint32_t ndim,
                uint32_t axis, uint64_t max, uint32_t *out, char *err,
                size_t errlen)
{
	uint32_t nd = 0;
	uint64_t sh[4] = {0};
	char why[KVT_ERRTEXT_MAX] = "";
	int rc = learned_shape(p->args.model, name, &nd, sh, why, sizeof(why));
	if (rc == KVT_ENOMEM)
		return rc;
	if (rc || nd != ndim || axis >= 4 || !sh[axis] || sh[axis] > max)
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: model %s: %s: %s",
		                  p->ops->name, p->args.model, name,
		                  rc ? why : "unexpected shape");
	*out = (uint32_t)sh[axis];
	return 0;
}

int learned_layers_fit(const struct policy *p, const struct weights *w,
                       const char *fmt, char *err, size_t errlen)
{
	char extra[96];
	snprintf(extra, sizeof(extra), fmt, p->geom.n_layers);
	if (weights_has(w, extra))
		return errors_fmt(err, errlen, KVT_EPOLICY, "%s: model %s has %s: "
		                  "more layers than the model's %u",
		                  p->ops->name, p->args.model, extra,
		                  p->geom.n_layers);
	return 0;
}
