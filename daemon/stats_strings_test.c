/*
 * stats_strings_test.c — strings that came from peers, rendered where
 * operators read them: /stats JSON and /metrics label values stay valid
 * whatever the bytes (stats.c), and reason texts quote them as printable
 * ASCII (errors_quote).
 */
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "stats.h"
#include "test.h"

/* Renders a snapshot with one tenant named `name`. */
static char *render(const char *name, enum stats_fmt fmt)
{
	struct stats_snap *s = stats_snap_new(1);
	T_ASSERT(s);
	s->n_tenant_list = 1;
	snprintf(s->tenant_list[0].name, sizeof(s->tenant_list[0].name), "%s",
	         name);
	snprintf(s->tenant_list[0].policy, sizeof(s->tenant_list[0].policy),
	         "full");
	char *out = NULL;
	size_t len = 0;
	T_OK(stats_render(s, fmt, &out, &len));
	T_EQ_U64(strlen(out), len);
	stats_snap_free(s);
	return out;
}

TEST(stats_strings, json_escapes_controls_and_bad_utf8)
{
	/* ESC, a newline, a quote, a lone 0xff, a truncated 2-byte form and
	 * a valid "é" (c3 a9), which is kept. */
	char *j = render("a\x1b[2J\n\"\xff" "b\xc3" "c\xc3\xa9", STATS_FMT_JSON);
	T_ASSERT(strstr(j, "\"name\":\"a\\u001b[2J\\u000a\\\"\\ufffdb"
	                   "\\ufffdc\xc3\xa9\""));
	for (const unsigned char *p = (const unsigned char *)j; *p; p++)
		T_ASSERT(*p >= 0x20 || *p == '\n');
	free(j);
}

TEST(stats_strings, prometheus_labels_stay_one_valid_line)
{
	char *m = render("x\"\\\n\x1b\xfe" "y", STATS_FMT_PROM);
	/* quote, backslash and newline escaped; ESC dropped; 0xfe as
	 * U+FFFD (ef bf bd). */
	T_ASSERT(strstr(m, "{tenant=\"x\\\"\\\\\\n\xef\xbf\xbdy\",id=\"0\"}"));
	for (const unsigned char *p = (const unsigned char *)m; *p; p++)
		T_ASSERT(*p >= 0x20 || *p == '\n');
	free(m);
}

TEST(stats_strings, errors_quote_gives_printable_ascii)
{
	char q[32];
	T_EQ_STR(errors_quote(q, sizeof(q), "ok-name"), "ok-name");
	T_EQ_STR(errors_quote(q, sizeof(q), "a\nb\x1b\"\\\xff"),
	         "a\\x0ab\\x1b\\x22\\x5c\\xff");
	/* Truncated whole: never half an escape. */
	T_EQ_STR(errors_quote(q, 6, "ab\x01z"), "ab");
	T_EQ_STR(errors_quote(q, 1, "abc"), "");
}
