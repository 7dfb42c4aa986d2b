/*
 * log.h — one-line log records on stderr (journald picks them up under
 * systemd): "2026-11-29T12:00:00.123Z kvtrimd[pid] <level> text".
 * LOG() checks the level before formatting anything, so debug records cost
 * a comparison when disabled.  Levels are RFC 5424 numbers.  A record is
 * always one line: control bytes in the text (a newline or ESC quoted from
 * a peer) are written as '?'.
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

/*
 * Rate limit for records that a hostile peer could repeat at will (one per
 * refused connection or bad packet): at most one record per interval, and
 * that record tells how many were held back since the previous one.
 */
struct log_rate {
	uint64_t next_ms;    /* monotonic ms before which records are held */
	uint64_t suppressed; /* held back since the last record */
};

/*
 * 1 when a record may be written now (at now_ms, monotonic): *suppressed
 * then holds how many were held back before it and the next interval_ms
 * starts; 0 when this one is counted instead.
 */
int log_rate_due(struct log_rate *r, uint64_t now_ms, uint64_t interval_ms,
                 uint64_t *suppressed);

#define LOG(lvl, ...)                                                          \
	do {                                                                   \
		if ((lvl) <= log_threshold)                                    \
			log_emit((lvl), __VA_ARGS__);                          \
	} while (0)

/*
 * LOG_EVERY(lvl, ms, ...): LOG with a struct log_rate of its own call site
 * (used by one thread: the loop's sites by the loop); the first record
 * after a quiet spell is followed by a count of the ones left out.
 */
uint64_t log_now_ms(void); /* monotonic */

#define LOG_EVERY(lvl, interval_ms, ...)                                       \
	do {                                                                   \
		static struct log_rate lim_;                                   \
		uint64_t left_;                                                \
		if ((lvl) <= log_threshold &&                                  \
		    log_rate_due(&lim_, log_now_ms(), (interval_ms), &left_)) {\
			log_emit((lvl), __VA_ARGS__);                          \
			if (left_)                                             \
				log_emit((lvl), "(%llu similar records "      \
				         "suppressed)",                        \
				         (unsigned long long)left_);           \
		}                                                              \
	} while (0)

#endif
