/*
 * seqid.h — the layout of a sequence id (kvt_seq, "seq" on the wire),
 * shared by kvtrimd, which issues ids, and libkvtrim, which finds a
 * sequence's slot in them (header only).
 *
 *   bits 63..40  tenant: the low 24 bits of the issuing tenant's id
 *   bits 39..16  generation of the slot: never 0, bumped on every close
 *   bits 15..0   slot (max_seqs is at most 65536, ipc/shm.c)
 *
 * The tenant field makes another tenant's id unknown (KVT_ENOSEQ) both in
 * libkvtrim and in the daemon, so an engine that mixes up the ids of two
 * clients is refused instead of acting on its other sequence; tenant ids
 * only grow (the daemon never reuses one), so two live tenants share the
 * field only when 2^24 registrations lie between them.  The generation
 * makes an id of a closed sequence unknown once its slot is reused, until
 * the slot was reopened 2^24 - 1 times.  An id is never 0 (tenant ids
 * start at 1).  Engines treat ids as opaque.
 */
#ifndef KVT_SEQID_H
#define KVT_SEQID_H

#include <stdint.h>

#define SEQID_SLOT_BITS 16
#define SEQID_GEN_BITS 24
#define SEQID_TENANT_BITS 24
#define SEQID_GEN_MAX ((1u << SEQID_GEN_BITS) - 1)
#define SEQID_TENANT_MASK ((1u << SEQID_TENANT_BITS) - 1)

static inline uint64_t seqid_make(uint32_t tenant, uint32_t gen,
                                  uint32_t slot)
{
	return (uint64_t)(tenant & SEQID_TENANT_MASK)
	               << (SEQID_GEN_BITS + SEQID_SLOT_BITS) |
	       (uint64_t)(gen & SEQID_GEN_MAX) << SEQID_SLOT_BITS |
	       (slot & ((1u << SEQID_SLOT_BITS) - 1));
}

static inline uint32_t seqid_slot(uint64_t id)
{
	return (uint32_t)(id & ((1u << SEQID_SLOT_BITS) - 1));
}

static inline uint32_t seqid_gen(uint64_t id)
{
	return (uint32_t)(id >> SEQID_SLOT_BITS) & SEQID_GEN_MAX;
}

/* 1 when id carries the tenant field of tenant id `tenant`. */
static inline int seqid_of_tenant(uint64_t id, uint32_t tenant)
{
	return (uint32_t)(id >> (SEQID_GEN_BITS + SEQID_SLOT_BITS)) ==
	       (tenant & SEQID_TENANT_MASK);
}

#endif
