/*
 * log.h — one-line log records on stderr (journald picks them up under
 * systemd): "2026-11-29T12:00:00.123Z kvtrimd[pid] <level> text".
 * LOG() checks the level before formatting anything, so debug records cost
 * a comparison when disabled.  Levels are RFC 5424 numbers.
 */
#ifndef KVT_LOG_H
#define KVT_LOG_H

#include <stdint.h>

enum log_lvl {
	LOG_LVL_ERR = 3,
	LOG_LVL_WARNING = 4,
	LOG_LVL_NOTICE = 5,
	LOG_LVL_INFO = 6,
	LOG_LVL_DEBUG = 7,
};

extern int log_threshold; /* records above it are dropped */

void log_emit(int lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Parses "err|warning|notice|info|debug"; -1 when unknown. */
int log_parse_level(const char *s);
const char *log_level_name(int lvl);

#define LOG(lvl, ...)                                                          \
	do {                                                                   \
		if ((lvl) <= log_threshold)                                    \
			log_emit((lvl), __VA_ARGS__);                          \
	} while (0)

/*
 * A record that a hostile peer could make repeat (a refused connection, a
 * junk packet): LOG_EVERY(lvl, ms, ...) writes at most one record per ms
 * milliseconds from its call site; the first record after a quiet spell
 * is followed by a count of the ones left out.  Each call site keeps its
 * own state, used by one thread (the loop's sites by the loop).
 */
struct log_limit {
	uint64_t next_ms;    /* monotonic; earlier records pass */
	uint64_t suppressed; /* dropped since the last record written */
};

/* 1: write the record now (then *suppressed tells how many were left out
 * before it); 0: drop it. */
int log_limit_pass(struct log_limit *l, uint32_t interval_ms,
                   uint64_t *suppressed);

#define LOG_EVERY(lvl, interval_ms, ...)                                       \
	do {                                                                   \
		static struct log_limit lim_;                                  \
		uint64_t left_;                                                \
		if ((lvl) <= log_threshold &&                                  \
		    log_limit_pass(&lim_, (interval_ms), &left_)) {            \
			log_emit((lvl), __VA_ARGS__);                          \
			if (left_)                                             \
				log_emit((lvl), "(%llu similar records "      \
				         "suppressed)",                        \
				         (unsigned long long)left_);           \
		}                                                              \
	} while (0)

#endif
