/*
 * fuzz_config.c — libFuzzer target for the daemon's config parser
 * (daemon/config.h).
 *
 * The input is a config file, handed to config_load_file through a memfd
 * (path /proc/self/fd/N: no disk I/O, nothing left behind).  The promise
 * checked: a file that fails changes nothing (the struct stays
 * byte-identical), one that loads renders every key through config_get and
 * each rendered value is accepted again by config_set with the same
 * rendering.  Each line that looks like "key = value" is also fed to
 * config_set directly (the kvtrimctl config set path), and the size parser
 * and the priority lookup get the raw value.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "kvtrim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MUST(c)                                                                \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "fuzz_config: %s:%d: %s\n", __FILE__,  \
			        __LINE__, #c);                                 \
			abort();                                               \
		}                                                              \
	} while (0)

/* One memfd for the whole run, rewritten per input. */
static int memfd = -1;
static char memfd_path[64];

static void check_render(const struct config *c)
{
	char buf[512], again[512], err[512];
	struct config *copy = malloc(sizeof(*copy));
	MUST(copy);
	for (size_t i = 0; i < config_count(); i++) {
		const struct config_entry *e = config_at(i);
		*copy = *c;
		config_get(c, e, buf, sizeof(buf));
		/* A loaded value must survive its own rendering; "" is the
		 * one string the table refuses to set back (min length). */
		if (e->type == CONFIG_STR && strlen(buf) < e->min)
			continue;
		if (config_set(copy, e->name, buf, err, sizeof(err))) {
			fprintf(stderr, "fuzz_config: %s = '%s' refused: %s\n",
			        e->name, buf, err);
			MUST(0);
		}
		config_get(copy, e, again, sizeof(again));
		MUST(!strcmp(buf, again));
	}
	free(copy);
}

/* Feeds every "key = value" line of text to config_set. */
static void set_lines(struct config *c, char *text)
{
	char err[512];
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');
		if (!eq)
			continue;
		*eq = '\0';
		const char *key = line, *val = eq + 1;
		while (*key == ' ')
			key++;
		while (*val == ' ')
			val++;
		uint64_t sz;
		(void)config_parse_size(val, &sz);
		struct config before = *c;
		int rc = config_set(c, key, val, err, sizeof(err));
		if (rc) {
			MUST(rc < 0 && err[0]);
			MUST(!memcmp(&before, c, sizeof(before)));
		}
		(void)config_priority(c, key);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (memfd < 0) {
		memfd = memfd_create("fuzz_config", MFD_CLOEXEC);
		MUST(memfd >= 0);
		snprintf(memfd_path, sizeof(memfd_path), "/proc/self/fd/%d",
		         memfd);
	}
	MUST(ftruncate(memfd, 0) == 0);
	MUST(pwrite(memfd, data, size, 0) == (ssize_t)size);

	struct config *c = malloc(sizeof(*c)), *before = malloc(sizeof(*c));
	char err[512];
	MUST(c && before);
	config_defaults(c);
	*before = *c;
	int rc = config_load_file(c, memfd_path, err, sizeof(err));
	if (rc) {
		MUST(rc < 0 && err[0]);
		MUST(!memcmp(before, c, sizeof(*c)));
	} else {
		(void)config_validate(c, err, sizeof(err));
		check_render(c);
		(void)config_apply_mutable(before, c, err, sizeof(err) / 2,
		                           err + sizeof(err) / 2,
		                           sizeof(err) / 2);
	}

	char *text = malloc(size + 1);
	MUST(text);
	memcpy(text, data, size);
	text[size] = '\0';
	config_defaults(c);
	set_lines(c, text);
	free(text);
	free(c);
	free(before);
	return 0;
}
