/*
 * notify.c — see notify.h.  Thin wrappers over libsystemd's sd_notify so
 * that the rest of the daemon names intents (ready, stopping) rather than
 * protocol strings.  The environment is left in place (unset_environment
 * 0): the watchdog keeps reading $WATCHDOG_USEC, and nothing we start
 * inherits it anyway.
 */
#include "notify.h"

#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "log.h"

static char notify_last_status[256];

static void notify_send(const char *msg)
{
	int rv = sd_notify(0, msg);
	if (rv < 0)
		LOG(LOG_LVL_WARNING, "sd_notify(%s): %s", msg, strerror(-rv));
}

void notify_ready(void)
{
	notify_send("READY=1");
}

void notify_status(const char *line)
{
	char msg[sizeof(notify_last_status) + 8];
	if (!strcmp(line, notify_last_status))
		return;
	snprintf(notify_last_status, sizeof(notify_last_status), "%s", line);
	snprintf(msg, sizeof(msg), "STATUS=%s", notify_last_status);
	notify_send(msg);
}

void notify_stopping(void)
{
	notify_send("STOPPING=1");
}

void notify_reloading(void)
{
	notify_send("RELOADING=1");
}

uint64_t notify_watchdog_period_ms(void)
{
	uint64_t usec = 0;
	if (sd_watchdog_enabled(0, &usec) <= 0 || !usec)
		return 0;
	/* Half the timeout, as sd_watchdog_enabled(3) recommends; at least
	 * 1 ms so a tiny test value still makes a running timer. */
	uint64_t ms = usec / 2000;
	return ms ? ms : 1;
}

void notify_watchdog(void)
{
	notify_send("WATCHDOG=1");
}
