/*
 * test.h — the project's small test runner.
 *
 * TEST(suite, name) { ... } defines and registers a test.  The runner forks
 * each test into its own process with a timeout (a crash or hang fails that
 * test only), and ends with one line "N passed, N failed, N skipped".
 * Run `build/bin/kvtrim-tests [selector...]` to run a subset: a selector
 * is a substring of "suite.name", or, when it holds a '/' or ends in
 * "_test.c", of the test's source file: `tests/integration/` selects the
 * integration tests, `_test.c` the unit tests (<module>_test.c beside each
 * module), `ipc/` the tests of ipc/.
 *
 * Assertions print file:line and the values, then end the test process.
 */
#ifndef KVT_TEST_H
#define KVT_TEST_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtrim.h"

typedef void (*th_fn)(void);

void th_register(const char *suite, const char *name, const char *file,
                 th_fn fn, int timeout_s);
void th_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 3, 4)));
void th_skip(const char *why) __attribute__((noreturn));
/* Scratch directory of the current test (created on first use, removed by
 * the runner after the test). */
const char *th_tmpdir(void);

#define TEST_T(suite, name, timeout_s)                                         \
	static void test_##suite##_##name(void);                               \
	__attribute__((constructor)) static void reg_##suite##_##name(void)    \
	{                                                                      \
		th_register(#suite, #name, __FILE__, test_##suite##_##name,    \
		            timeout_s);                                        \
	}                                                                      \
	static void test_##suite##_##name(void)
#define TEST(suite, name) TEST_T(suite, name, 30)

#define T_ASSERT(c)                                                            \
	do {                                                                   \
		if (!(c))                                                      \
			th_fail(__FILE__, __LINE__, "assertion failed: %s",   \
			        #c);                                           \
	} while (0)

#define T_EQ(a, b)                                                             \
	do {                                                                   \
		long long a_ = (long long)(a), b_ = (long long)(b);            \
		if (a_ != b_)                                                  \
			th_fail(__FILE__, __LINE__, "%s == %lld, expected %s " \
			        "== %lld", #a, a_, #b, b_);                   \
	} while (0)

#define T_EQ_U64(a, b)                                                         \
	do {                                                                   \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);               \
		if (a_ != b_)                                                  \
			th_fail(__FILE__, __LINE__,                            \
			        "%s == %" PRIu64 ", expected %" PRIu64, #a,    \
			        a_, b_);                                       \
	} while (0)

#define T_EQ_STR(a, b)                                                         \
	do {                                                                   \
		const char *a_ = (a), *b_ = (b);                               \
		if (!a_ || !b_ || strcmp(a_, b_))                              \
			th_fail(__FILE__, __LINE__, "%s == \"%s\", expected " \
			        "\"%s\"", #a, a_ ? a_ : "(null)",             \
			        b_ ? b_ : "(null)");                           \
	} while (0)

/* expr returns a kvt error code; expect success. */
#define T_OK(expr)                                                             \
	do {                                                                   \
		int rv_ = (int)(expr);                                         \
		if (rv_ < 0)                                                   \
			th_fail(__FILE__, __LINE__, "%s failed: %s (%s)",     \
			        #expr, kvt_errname(rv_), kvt_strerror(rv_));   \
	} while (0)

/* expr returns a kvt error code; expect exactly code. */
#define T_ERR(expr, code)                                                      \
	do {                                                                   \
		int rv_ = (int)(expr);                                         \
		if (rv_ != (code))                                             \
			th_fail(__FILE__, __LINE__, "%s gave %s, expected %s",\
			        #expr, kvt_errname(rv_), kvt_errname(code));   \
	} while (0)

#define T_SKIP(why) th_skip(why)

#endif
