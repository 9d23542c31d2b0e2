/*
 * coordinator/timeline (tidectl timeline's picture and trace) from a synthetic history:
 * what the real job of test_timeline.sh does not go through (failures, recoveries,
 * rollbacks, checkpoints, events after the job's end).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/timeline.h"
#include "core/error.h"
#include "proto/proto.h"

/* An event of the synthetic history below. */
static void ev(tide_proto_event_row_t *e, int64_t t, const char *job, const char *kind,
               uint64_t gen, int dp, int tp, int pp, int32_t *workers, uint32_t n)
{
    memset(e, 0, sizeof *e);
    e->time_ms = t;
    strcpy(e->job, job);
    strcpy(e->kind, kind);
    e->fields.step = -1;
    e->fields.gen = gen;
    e->fields.dp = dp, e->fields.tp = tp, e->fields.pp = pp;
    e->fields.workers = workers;
    e->fields.n_workers = n;
}

/* The number of occurrences of needle in hay. */
static int count_in(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A failure and its recovery, a rollback and a checkpoint, drawn from their events: the
   failed worker's row turns failed, the marks carry their generation, downtime and step,
   another job's events do not count, and nothing after the job's end is drawn. */
Test(tidectl_timeline, failures_recoveries_and_checkpoints_are_drawn)
{
    int32_t g1[4] = {10, 11, 12, 13}, g2[2] = {10, 11}, g3[2] = {11, 10}, w12 = 12, w11 = 11;
    tide_proto_event_row_t e[12];
    size_t n = 0;
    ev(&e[n++], 500, "other", "layout", 1, 1, 1, 1, &w11, 1); /* before the job: ignored */
    ev(&e[n++], 1000, "j", "layout", 1, 2, 1, 2, g1, 4);
    ev(&e[n], 2000, "j", "checkpoint_saved", 1, 0, 0, 0, &w11, 1);
    e[n++].fields.step = 40;
    ev(&e[n], 3000, "", "worker_failed", 0, 0, 0, 0, &w12, 1);
    strcpy(e[n++].fields.reason, "missed heartbeats");
    ev(&e[n++], 3100, "j", "recovery_started", 2, 2, 1, 1, g2, 2);
    ev(&e[n], 3600, "j", "recovered", 2, 2, 1, 1, g2, 2);
    e[n++].fields.ms = 500;
    ev(&e[n++], 5000, "j", "resize_started", 3, 1, 2, 1, g3, 2);
    ev(&e[n], 5400, "j", "rolled_back", 3, 1, 2, 1, g3, 2);
    e[n].fields.ms = 400, e[n++].fields.steps_lost = 7;
    ev(&e[n++], 6000, "j", "job_ended", 0, 0, 0, 0, NULL, 0);
    ev(&e[n++], 6500, "j", "layout", 9, 1, 1, 1, &w12, 1); /* after the end: not drawn */
    tide_proto_gpu_row_t gpus[2] = {{.worker = 10, .host = "b", .device = 1},
                                    {.worker = 12, .host = "a", .device = 0}};
    tide_timeline_t *t = NULL;
    cr_assert_eq(tide_timeline_build(&t, "j", e, n, gpus, 2, 9000), TIDE_OK, "%s",
                 tide_last_error());
    char *svg;
    size_t len;
    FILE *f = open_memstream(&svg, &len);
    cr_assert_eq(tide_timeline_svg(t, f), TIDE_OK);
    fclose(f);
    size_t rows, segs, marks;
    tide_timeline_counts(t, &rows, &segs, &marks);
    cr_expect_eq(rows, 4);
    cr_expect_eq(marks, 4, "checkpoint, failure, recovery, rollback: %zu", marks);
    /* rows by host then device: a (12), b (10), then the unknown hosts */
    const char *ra = strstr(svg, "data-worker=\"12\" data-host=\"a\" data-device=\"0\"");
    const char *rb = strstr(svg, "data-worker=\"10\" data-host=\"b\" data-device=\"1\"");
    cr_expect(ra != NULL && rb != NULL && ra < rb, "%s", svg);
    cr_expect(strstr(svg, "class=\"seg failed\" data-worker=\"12\" data-t0=\"2000\" "
                          "data-t1=\"5000\""),
              "%s", svg);
    cr_expect(strstr(svg, "class=\"seg online\" data-worker=\"12\" data-t0=\"0\" "
                          "data-t1=\"2000\" data-gen=\"1\" data-role=\"p1 d0 t0\""),
              "%s", svg);
    cr_expect(strstr(svg, "class=\"seg online\" data-worker=\"10\" data-t0=\"4400\" "
                          "data-t1=\"5000\" data-gen=\"3\" data-role=\"p0 d0 t1\""),
              "%s", svg);
    cr_expect(strstr(svg, "class=\"mark recovery\" data-gen=\"2\" data-t0=\"2100\" "
                          "data-t1=\"2600\" data-ms=\"500.0\""),
              "%s", svg);
    cr_expect(strstr(svg, "class=\"mark checkpoint\" data-gen=\"1\" data-t0=\"1000\" "
                          "data-t1=\"1000\" data-ms=\"0.0\" data-step=\"40\""),
              "%s", svg);
    cr_expect(strstr(svg, "7 steps lost"), "%s", svg);
    cr_expect(strstr(svg, "class=\"mark failure\""), "%s", svg);
    cr_expect_eq(count_in(svg, "data-gen=\"9\""), 0, "drawn after the end: %s", svg);
    cr_expect(strstr(svg, "data-end-ms=\"6000\""), "the job's end ends it: %s", svg);
    free(svg);
    /* the same as a Chrome trace: the recovery's downtime a duration in microseconds */
    f = open_memstream(&svg, &len);
    cr_assert_eq(tide_timeline_trace(t, f), TIDE_OK);
    fclose(f);
    cr_expect(strstr(svg, "\"ph\":\"X\",\"dur\":500000,\"cat\":\"recovery\",\"pid\":0,\"tid\":0,"
                          "\"ts\":2100000,\"args\":{\"gen\":2,"),
              "%s", svg);
    cr_expect(strstr(svg, "\"name\":\"GPU 0 (worker 12)\""), "%s", svg);
    cr_expect(strstr(svg,
                     "{\"ph\":\"X\",\"name\":\"failed\",\"cat\":\"failed\",\"pid\":1,\"tid\":12,"
                     "\"ts\":2000000,\"dur\":3000000}"),
              "%s", svg);
    free(svg);
    tide_timeline_destroy(&t);
    cr_expect_null(t);
    cr_expect_eq(tide_timeline_build(&t, "nobody", e, n, gpus, 2, 9000), TIDE_ERR_NOT_FOUND);
}

