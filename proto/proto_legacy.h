/*
 * proto legacy: readers of the text and byte formats tided's state file held before its
 * structured fields became proto records (state schema 1), kept so that a state file an
 * older tided wrote still loads: coordinator/store.c migrates such a file once, reading
 * each old field here and storing it back as its record. Nothing writes these formats any
 * more. Each reader is as strict as the one it replaces (the exact text the old writer
 * produced, nothing weaker), returns the record validated, or TIDE_ERR_PROTOCOL (or
 * TIDE_ERR_NOMEM) with a detail quoting the bad text and *out holding nothing. Pure; any
 * thread.
 */
#ifndef TIDE_PROTO_LEGACY_H
#define TIDE_PROTO_LEGACY_H

#include <stddef.h>
#include <stdint.h>

#include <tide/status.h>
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "dp tp pp layers micro|s0 s1 ..|w0 w1 .." into a "job_layout" record of generation gen. */
tide_status tide_proto_legacy_layout(const char *text, uint64_t gen, tide_msg_t *out);

/* "name size state[ G]" per pool, ';' between (state 0 or 1: connected; 2: left at
   generation G), or one bare pool name from before jobs spanned pools (its size: size0,
   or 1 when size0 < 1), or NULL/"" (no pools), into a "job_pools" record. */
tide_status tide_proto_legacy_pools(const char *text, int32_t size0, tide_msg_t *out);

/* One "DEGREE N[ WHAT]\n" line per rule, or NULL/"" (no rules), into a "job_fit" record. */
tide_status tide_proto_legacy_fit(const char *text, tide_msg_t *out);

/* One "STEP\tDIR\n" line per checkpoint, steps increasing, or NULL/"" (none), into a
   "job_ckpts" record. */
tide_status tide_proto_legacy_ckpts(const char *text, tide_msg_t *out);

/* argv as NUL-terminated strings back to back (len bytes; 0: no arguments) into a
   "job_argv" record. */
tide_status tide_proto_legacy_argv(const void *bytes, size_t len, tide_msg_t *out);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_PROTO_LEGACY_H */
