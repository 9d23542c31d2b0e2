/*
 * coordinator/timeline internals shared by timeline.c (building from events) and
 * timeline_svg.c (drawing): the rows, segments and marks of a job's timeline.
 */
#ifndef TIDE_COORD_TIMELINE_INT_H
#define TIDE_COORD_TIMELINE_INT_H

#include "coordinator/timeline.h"

/* What a segment shows its GPU doing. */
enum { SEG_ONLINE, SEG_OFFLINE, SEG_BUBBLE, SEG_FAILED };

/* What a mark marks. */
enum { MK_RESIZE, MK_RECOVERY, MK_ROLLBACK, MK_ABORT, MK_CHECKPOINT, MK_FAILURE, MK_STALL };

typedef struct row {
    int32_t worker;
    char host[TIDE_PROTO_HOST_MAX + 1];
    int device; /* -1: unknown (tided forgot the worker) */
} row_t;

typedef struct seg {
    size_t row;
    int kind;
    int64_t t0, t1;                    /* ms since the epoch; t1 < 0 while open */
    uint64_t gen;                      /* SEG_ONLINE: the generation */
    int p, d, t;                       /* SEG_ONLINE: the coordinate */
    char job[TIDE_PROTO_NAME_MAX + 1]; /* SEG_OFFLINE / SEG_BUBBLE: the offline job */
} seg_t;

typedef struct mark {
    int kind;
    int64_t t0, t1; /* t0 == t1 for an instant */
    uint64_t gen;
    int32_t worker; /* MK_FAILURE: the worker, else -1 */
    int64_t step;   /* MK_CHECKPOINT: the step */
    double ms;      /* the downtime tided measured, 0: none */
    char text[192];
} mark_t;

struct tide_timeline {
    char job[TIDE_PROTO_NAME_MAX + 1];
    int64_t start, end;
    row_t *rows;
    size_t n_rows, cap_rows;
    seg_t *segs;
    size_t n_segs, cap_segs;
    mark_t *marks;
    size_t n_marks, cap_marks;
    int64_t pending_t; /* when the reconfiguration under way started, -1: none */
    uint64_t pending_gen;
    int ended; /* an event said the job ended: nothing after it is drawn */
};

/* The class names (SVG class attribute) of seg_t.kind and mark_t.kind. */
extern const char *const tide__timeline_seg_class[4];
extern const char *const tide__timeline_mark_class[7];

#endif /* TIDE_COORD_TIMELINE_INT_H */
