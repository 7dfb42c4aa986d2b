/* log.c — see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "now.h"

int log_threshold = LOG_LVL_NOTICE;

static const char *const log_names[] = {
	[LOG_LVL_ERR] = "err",   [LOG_LVL_WARNING] = "warning",
	[LOG_LVL_NOTICE] = "notice", [LOG_LVL_INFO] = "info",
	[LOG_LVL_DEBUG] = "debug",
};

const char *log_level_name(int lvl)
{
	if (lvl < LOG_LVL_ERR || lvl > LOG_LVL_DEBUG)
		return "?";
	return log_names[lvl];
}

int log_parse_level(const char *s)
{
	for (int l = LOG_LVL_ERR; l <= LOG_LVL_DEBUG; l++)
		if (!strcmp(s, log_names[l]))
			return l;
	return -1;
}

/* now_ms itself, for LOG_EVERY: log.h does not include now.h, so that a
 * file with a now_ms of its own can still include log.h. */
uint64_t log_now_ms(void)
{
	return now_ms();
}

void log_emit(int lvl, const char *fmt, ...)
{
	char line[1024];
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	int n = (int)strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += snprintf(line + n, sizeof(line) - (size_t)n, ".%03dZ kvtrimd[%d] %s ",
	              (int)(tv.tv_usec / 1000), (int)getpid(),
	              log_level_name(lvl));
	va_list ap;
	va_start(ap, fmt);
	if (n < (int)sizeof(line))
		n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n >= (int)sizeof(line) - 1)
		n = (int)sizeof(line) - 2;
	/* Messages quote what peers sent (names, keys, values): a control
	 * byte there must not start a fake record or drive a terminal. */
	for (int i = 0; i < n; i++)
		if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
			line[i] = '?';
	line[n++] = '\n';
	/* One write per record so lines from concurrent writers never mix. */
	ssize_t w = write(STDERR_FILENO, line, (size_t)n);
	(void)w;
}

int log_rate_due(struct log_rate *r, uint64_t now_ms, uint64_t interval_ms,
                 uint64_t *suppressed)
{
	if (now_ms < r->next_ms) {
		r->suppressed++;
		return 0;
	}
	*suppressed = r->suppressed;
	r->suppressed = 0;
	r->next_ms = now_ms + interval_ms;
	return 1;
}
