/*
 * notify.h — the systemd service protocol (sd_notify): readiness, status,
 * stopping and the watchdog.  Every call is a no-op when the daemon was not
 * started by systemd (no $NOTIFY_SOCKET), so callers never check.
 *
 * Threads: loop thread only.
 */
#ifndef KVT_NOTIFY_H
#define KVT_NOTIFY_H

#include <stdint.h>

/* READY=1: the pool exists and every socket listens. */
void notify_ready(void);

/* STATUS=<line>: one human-readable line; sent only when it changed. */
void notify_status(const char *line);

/* STOPPING=1: a drain began (SIGTERM). */
void notify_stopping(void);

/* RELOADING=1 before a config reload, READY=1 after it. */
void notify_reloading(void);

/*
 * Milliseconds between two WATCHDOG=1 pings: half of $WATCHDOG_USEC when
 * systemd expects pings from this process (sd_watchdog_enabled), else 0.
 */
uint64_t notify_watchdog_period_ms(void);

/* WATCHDOG=1. */
void notify_watchdog(void);

#endif
