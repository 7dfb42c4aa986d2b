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

#endif
