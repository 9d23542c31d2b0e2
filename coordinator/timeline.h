/*
 * coordinator/timeline: a job's history as a picture (tidectl timeline). From tided's
 * events (their typed fields: layouts with their worker maps, failures, checkpoints,
 * offline assignments) it builds one row per GPU (worker) that ever held a part of the
 * job, grouped by host, with time across: a segment per layout the GPU ran under
 * (generation and its coordinate), offline work on it when the job left it idle
 * (backfill) or inside its pipeline bubbles, the time it was failed; and marks for
 * resizes, recoveries, rollbacks and aborts (their downtime labelled), checkpoints and
 * failures. Written as a self-contained SVG whose elements carry their data as
 * attributes (class "row"/"seg"/"mark", data-worker, data-gen, data-t0, ...) so that
 * tools and tests read the picture back.
 *
 * Pure: no socket; the caller fetched the events and the workers. Workload: up to a
 * few 10^4 events, a few 10^3 GPUs. Any thread.
 */
#ifndef TIDE_COORD_TIMELINE_H
#define TIDE_COORD_TIMELINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <tide/status.h>
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tide_timeline tide_timeline_t;

/*
 * Builds job's timeline from events ev[0..n) (oldest first, every job's: offline work and
 * failures on the job's GPUs are other jobs' and cluster events), up to end_ms (the job's
 * end when an event says it ended earlier). gpus[0..n_gpus) (may be empty) name each
 * worker's host and device. TIDE_ERR_NOT_FOUND when no event gives job a layout. Caller
 * owns *out (tide_timeline_destroy).
 */
tide_status tide_timeline_build(tide_timeline_t **out, const char *job,
                                const tide_proto_event_row_t *ev, size_t n,
                                const tide_proto_gpu_row_t *gpus, size_t n_gpus, int64_t end_ms);

/* Writes t as a self-contained SVG document to out; TIDE_ERR_IO when writing fails. */
tide_status tide_timeline_svg(const tide_timeline_t *t, FILE *out);

/* Writes t as a Chrome trace (Trace Event Format JSON: Perfetto, chrome://tracing): a
   process per host, a thread per GPU, an event per segment and mark; TIDE_ERR_IO when
   writing fails. */
tide_status tide_timeline_trace(const tide_timeline_t *t, FILE *out);

/* Rows, segments and marks of t, for a one-line summary. */
void tide_timeline_counts(const tide_timeline_t *t, size_t *rows, size_t *segs, size_t *marks);

/* Frees t and sets *self_p to NULL; NULL is fine. */
void tide_timeline_destroy(tide_timeline_t **self_p);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_COORD_TIMELINE_H */
