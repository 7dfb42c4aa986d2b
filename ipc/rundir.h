/*
 * rundir.h — where the daemon's sockets live, resolved the same way by the
 * daemon, libkvtrim and the tools: the explicit value, else
 * $KVTRIM_RUNTIME_DIR, else $XDG_RUNTIME_DIR/kvtrim, else /run/kvtrimd (the
 * systemd RuntimeDirectory).
 */
#ifndef KVT_RUNDIR_H
#define KVT_RUNDIR_H

#include <stddef.h>

void rundir_resolve(const char *given, char *out, size_t len);

#endif
