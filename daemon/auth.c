/*
 * auth.c — who may do what.
 *
 * Peers are checked against allow_uids / allow_gids (empty: the daemon's
 * own uid and root) twice: SO_PEERCRED on fd.sock at accept (fdchan.c),
 * and the control connection's (read at its accept, ctl.c) at hello
 * (lease.c).  The admin ops that
 * change something (drain, config_set) are checked against admin_uids /
 * admin_gids instead (same default): a tenant is not an admin, and the
 * four lists change from the socket only with acl_from_socket = 1
 * (admin.c).  Read-only admin ops are open to whoever may open the socket
 * (mode 0660).  Beyond max_pending_conns, only admins are let in at
 * ctl.ipc's accept (pipes.c).
 *
 * A registered tenant's requests carry its id and token, and must come on
 * the control connection it registered on (srv_auth).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server_int.h"

/* Is gid among the supplementary groups of a live process (/proc)? */
static int srv_pid_in_group(uint32_t pid, uint32_t gid)
{
	char path[64], line[4096];
	int found = 0;
	if (!pid)
		return 0;
	snprintf(path, sizeof(path), "/proc/%" PRIu32 "/status", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "Groups:", 7))
			continue;
		char *p = line + 7, *end;
		for (;;) {
			unsigned long g = strtoul(p, &end, 10);
			if (end == p)
				break;
			if (g == gid) {
				found = 1;
				break;
			}
			p = end;
		}
		break;
	}
	fclose(f);
	return found;
}

/*
 * An access list: a peer is in it when its uid is in uids or its primary
 * or a supplementary group is in gids.  With both lists empty it holds the
 * daemon's own uid and root (and nobody else).  Two lists: allow (who may
 * register a tenant) and admin (who may use the admin ops that change
 * something: drain, config set); being one does not make a peer the other.
 * Read by the HTTP thread too, hence acl_lock.
 */
int srv_acl_has(const struct server *s, const struct srv_acl *a,
                uint32_t pid, uint32_t uid, uint32_t gid)
{
	int in = 0;
	pthread_mutex_lock((pthread_mutex_t *)&s->acl_lock);
	if (!a->configured)
		in = uid == 0 || uid == (uint32_t)geteuid();
	for (uint32_t i = 0; i < a->n_uid && !in; i++)
		in = a->uid[i] == uid;
	for (uint32_t i = 0; i < a->n_gid && !in; i++)
		in = a->gid[i] == gid || srv_pid_in_group(pid, a->gid[i]);
	pthread_mutex_unlock((pthread_mutex_t *)&s->acl_lock);
	return in;
}

int srv_allowed(const struct server *s, uint32_t pid, uint32_t uid,
                uint32_t gid)
{
	return srv_acl_has(s, &s->allow, pid, uid, gid);
}

/* Re-reads one list after a config change (values were validated by the
 * config table, so a parse failure means a name vanished from NSS since:
 * that list then holds nobody, which fails closed). */
static uint32_t srv_acl_load(const char *key, const char *list, int gids,
                             uint32_t *ids)
{
	int n = config_parse_ids(list, gids, ids, SRV_ALLOW_MAX);
	if (n < 0 || n > SRV_ALLOW_MAX)
		LOG(LOG_LVL_WARNING, "%s: %s", key, n < 0 ?
		    "a name no longer resolves; the list allows nobody" :
		    "more than 64 entries; the rest are ignored");
	return n < 0 ? 0 : n > SRV_ALLOW_MAX ? SRV_ALLOW_MAX : (uint32_t)n;
}

static void srv_acl_set(struct srv_acl *a, const char *ukey,
                        const char *uids, const char *gkey, const char *gids)
{
	a->configured = uids[0] || gids[0];
	a->n_uid = srv_acl_load(ukey, uids, 0, a->uid);
	a->n_gid = srv_acl_load(gkey, gids, 1, a->gid);
}

void srv_allow_refresh(struct server *s)
{
	pthread_mutex_lock(&s->acl_lock);
	srv_acl_set(&s->allow, "allow_uids", s->cfg.allow_uids, "allow_gids",
	            s->cfg.allow_gids);
	srv_acl_set(&s->admin, "admin_uids", s->cfg.admin_uids, "admin_gids",
	            s->cfg.admin_gids);
	pthread_mutex_unlock(&s->acl_lock);
}

/* Checks the control connection's peer (SO_PEERCRED, read at accept)
 * against the allow list, or the admin list (admin 1). */
static int srv_pipe_check(struct server *s, const struct srv_pipe *p,
                          int admin, const char *what, char *why,
                          size_t wlen)
{
	if (srv_acl_has(s, admin ? &s->admin : &s->allow, p->pid, p->uid,
	                p->gid))
		return 0;
	snprintf(why, wlen, "%s refused: uid %" PRIu32 " gid %" PRIu32
	         " is not allowed (%s)", what, p->uid, p->gid,
	         admin ? "admin_uids / admin_gids" : "allow_uids / allow_gids");
	s->st.auth_refusals_total++;
	LOG_EVERY(LOG_LVL_WARNING, 1000, "%s (pid %" PRIu32 ")", why, p->pid);
	return KVT_EPERM;
}

int srv_pipe_allowed(struct server *s, const struct srv_pipe *p,
                     const char *what, char *why, size_t wlen)
{
	return srv_pipe_check(s, p, 0, what, why, wlen);
}

int srv_pipe_admin(struct server *s, const struct srv_pipe *p,
                   const char *what, char *why, size_t wlen)
{
	return srv_pipe_check(s, p, 1, what, why, wlen);
}

/* The tenant a request names, when it is that tenant's. */
int srv_auth(struct server *s, const struct ipc_req *r,
             const struct srv_pipe *pipe, struct srv_tenant **out,
             char *why, size_t wlen)
{
	struct srv_tenant *st = srv_find_tenant(s, r->tenant);
	if (!st || st->token != r->token || st->pipe_id != pipe->id) {
		snprintf(why, wlen, "tenant %" PRIu32 " is not registered on "
		         "this connection", r->tenant);
		return KVT_ENOTENANT;
	}
	*out = st;
	return 0;
}
