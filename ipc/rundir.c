/* rundir.c — see rundir.h. */
#include "rundir.h"

#include <stdio.h>
#include <stdlib.h>

void rundir_resolve(const char *given, char *out, size_t len)
{
	const char *e;
	if (given && given[0])
		snprintf(out, len, "%s", given);
	else if ((e = getenv("KVTRIM_RUNTIME_DIR")) && e[0])
		snprintf(out, len, "%s", e);
	else if ((e = getenv("XDG_RUNTIME_DIR")) && e[0])
		snprintf(out, len, "%s/kvtrim", e);
	else
		snprintf(out, len, "/run/kvtrimd");
}
