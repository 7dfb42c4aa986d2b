/*
 * loader.c — picks the backend at start (see backend.h).  The cuda
 * backend is a separate shared object found and loaded here with dlopen,
 * so this file, and everything linked with it, needs no CUDA library: a
 * machine without driver, toolkit or GPU gets a clear refusal for
 * "--backend cuda" and the cpu backend for "auto".
 */
#include "backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"

/* dlopen's message, shortened to what an operator needs: a missing driver
 * library is named as such. */
static void cuda_dl_reason(const char *dl, char *out, size_t outlen)
{
	static const char *const libs[] = {"libcuda.so.1", "libcudart.so",
	                                   "libcublas.so", "libcublasLt.so"};
	for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
		if (dl && strstr(dl, libs[i]) &&
		    strstr(dl, "cannot open shared object")) {
			snprintf(out, outlen, "%s not found (%s)", libs[i],
			         i == 0 ? "no NVIDIA driver"
			                : "CUDA toolkit libraries missing");
			return;
		}
	}
	snprintf(out, outlen, "%s", dl ? dl : "dlopen failed");
}

/* Directory of the running executable + "/../lib/" + name. */
static int beside_exe(const char *name, char *out, size_t outlen)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return -1;
	exe[n] = '\0';
	char *slash = strrchr(exe, '/');
	if (!slash)
		return -1;
	*slash = '\0';
	int w = snprintf(out, outlen, "%s/../lib/%s", exe, name);
	return w > 0 && (size_t)w < outlen ? 0 : -1;
}

/* Loads the cuda library once per process; never unloaded (the CUDA
 * runtime does not support being unloaded while contexts exist). */
static int cuda_load(const struct kvt_backend_ops **out, char *err,
                     size_t errlen)
{
	static const struct kvt_backend_ops *cached;
	char path[PATH_MAX + 32], reason[384];
	void *h = NULL;
	const char *env = getenv("KVTRIM_CUDA_LIB");

	if (cached) {
		*out = cached;
		return 0;
	}
	reason[0] = '\0';
	if (env && env[0]) {
		h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			cuda_dl_reason(dlerror(), reason, sizeof(reason));
			return errors_fmt(err, errlen, KVT_ENOTSUP,
			                  "cuda backend: %s (KVTRIM_CUDA_LIB=%s)",
			                  reason, env);
		}
	} else {
		if (beside_exe(KVT_BACKEND_CUDA_LIB, path, sizeof(path)) == 0 &&
		    access(path, F_OK) == 0) {
			h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
			if (!h)
				cuda_dl_reason(dlerror(), reason, sizeof(reason));
		}
		if (!h && !reason[0]) {
			h = dlopen(KVT_BACKEND_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
			if (!h) {
				const char *dl = dlerror();
				if (dl && strstr(dl, KVT_BACKEND_CUDA_LIB))
					snprintf(reason, sizeof(reason),
					         "%s not found next to the "
					         "executable nor on the library "
					         "path (built with USE_CUDA=no?)",
					         KVT_BACKEND_CUDA_LIB);
				else
					cuda_dl_reason(dl, reason,
					               sizeof(reason));
			}
		}
		if (!h) {
			return errors_fmt(err, errlen, KVT_ENOTSUP,
			                  "cuda backend: %s", reason);
		}
	}
	const struct kvt_backend_ops *ops = dlsym(h, KVT_BACKEND_CUDA_SYMBOL);
	if (!ops) {
		dlclose(h);
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "cuda backend: %s has no symbol %s",
		                  KVT_BACKEND_CUDA_LIB, KVT_BACKEND_CUDA_SYMBOL);
	}
	if (ops->abi != KVT_BACKEND_ABI) {
		/* the text first: ops lives in the library dlclose unmaps */
		errors_fmt(err, errlen, KVT_ENOTSUP, "cuda backend: %s was built "
		           "for another kvtrimd (backend ABI %u, expected %u)",
		           KVT_BACKEND_CUDA_LIB, ops->abi, KVT_BACKEND_ABI);
		dlclose(h);
		return KVT_ENOTSUP;
	}
	cached = ops;
	*out = ops;
	return 0;
}

/* Loads, probes and counts devices; the reason of a refusal in err. */
static int cuda_usable(const struct kvt_backend_ops **out, char *err,
                       size_t errlen)
{
	const struct kvt_backend_ops *ops;
	char why[256];
	int rv, n = 0;
	if ((rv = cuda_load(&ops, err, errlen)))
		return rv;
	why[0] = '\0';
	if ((rv = ops->probe(why, sizeof(why)))) {
		return errors_fmt(err, errlen, KVT_ENOTSUP, "cuda backend: %s",
		                  why[0] ? why : "probe failed");
	}
	if (ops->device_count(&n) || n <= 0) {
		return errors_fmt(err, errlen, KVT_ENOTSUP,
		                  "cuda backend: no CUDA device");
	}
	*out = ops;
	return 0;
}

int backend_open(const char *name, const struct kvt_backend_ops **out,
                 char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!name || !strcmp(name, "auto")) {
		char why[384];
		if (cuda_usable(out, why, sizeof(why)) == 0)
			return 0;
		*out = &backend_cpu;
		return errors_fmt(err, errlen, 0, "%s; using the cpu backend",
		                  why);
	}
	if (!strcmp(name, "cpu")) {
		*out = &backend_cpu;
		return 0;
	}
	if (!strcmp(name, "cuda"))
		return cuda_usable(out, err, errlen);
	return errors_fmt(err, errlen, KVT_EINVAL,
	                  "unknown backend '%s' (auto, cpu or cuda)", name);
}
