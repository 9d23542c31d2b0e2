/*
 * Unit tests for tidectl (coordinator/tidectl.c built with TIDECTL_NO_MAIN), the whole CLI
 * through tidectl_main: usage errors (exit 2, nothing sent) and help, then every command
 * against a fake tided (tidectl_fixture.h) that checks each request and answers with a
 * canned reply, or not at all. Checks the exit codes scripts rely on: 0 ok, 1 refused,
 * 2 usage, 3 unreachable, 4 timeout. Part of the test_tidectl executable (test_tidectl.c).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator/tidectl.h"
#include "coordinator/tidectl_int.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "proto/proto.h"
#include "tidectl_fixture.h"

/* ---- canned answers
 * ------------------------------------------------------------------------------------ */

/* A worker table of 7 rows (ids 0, 3, 6, ... 18; the last one left) that the fake hands
   out 2 rows a page from the request's `from`: tidectl must follow the pages. */
static void answer_status_paged(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    (void)f;
    const tide_proto_status_t *q = &req->u.status;
    int n_all = q->all ? 7 : 6;
    tide_msg_init(rep, TIDE_MSG_STATUS_REPLY);
    tide_proto_status_reply_t *x = &rep->u.status_reply;
    x->time_ms = 1700000001000;
    x->total = (uint32_t)n_all;
    x->next = -1;
    x->rows = tide_calloc(2, sizeof *x->rows);
    for (int k = 0; k < n_all; k++) {
        int32_t id = 3 * k;
        if (id < q->from)
            continue;
        if (x->n_rows == 2) {
            x->next = id;
            break;
        }
        tide_proto_gpu_row_t *g = &x->rows[x->n_rows++];
        g->worker = id;
        snprintf(g->host, sizeof g->host, "page-host-%d", (int)id);
        g->kind = TIDE_DEVICE_CPU;
        g->state = k == 6 ? TIDE_WORKER_LEFT : TIDE_WORKER_IDLE;
        g->stage = g->dp_rank = g->tp_rank = -1;
    }
}

static void answer_resize(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    const tide_proto_resize_t *r = &req->u.resize;
    tide_msg_init(rep, TIDE_MSG_RESIZE_REPLY);
    tide_proto_resize_reply_t *x = &rep->u.resize_reply;
    strcpy(x->job, r->job);
    x->dry_run = r->dry_run;
    x->layout.gen = 4;
    x->layout.dp = r->dp;
    x->layout.tp = r->tp;
    x->layout.pp = r->pp;
    x->layout.num_layers = 24;
    x->layout.micro_batches = 8;
    x->layout.stage_start = tide_malloc(((size_t)r->pp + 1) * sizeof(int));
    for (int s = 0; s <= r->pp; s++)
        x->layout.stage_start[s] = r->n_stages ? r->stage_start[s] : s * 24 / r->pp;
    size_t n = (size_t)r->dp * (size_t)r->tp * (size_t)r->pp;
    x->layout.worker = tide_malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        x->layout.worker[i] = (int32_t)i;
    x->bytes_sent = 3ull << 30;
    x->bytes_default = 27ull << 30;
    x->bytes_local = 1ull << 30;
    x->max_send = 512ull << 20;
    x->messages = 12;
    x->est_ms = 1800;
    x->preempted = 1;
}

static void answer_ok(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    tide_msg_init(rep, TIDE_MSG_OK);
    if (req->type == TIDE_MSG_SUBMIT)
        strcpy(rep->u.ok.job, req->u.submit.name);
    snprintf(rep->u.ok.message, sizeof rep->u.ok.message, "%s accepted",
             tide_msg_type_name(req->type));
}

static void answer_error(const tide_msg_t *req, tide_msg_t *rep, fake_t *f)
{
    tide_msg_init(rep, TIDE_MSG_ERROR);
    rep->u.error.code = TIDE_ERR_NOT_FOUND;
    strcpy(rep->u.error.message, "no job 'ghost': see tidectl jobs");
}

/* ---- usage errors: exit 2, nothing sent
 * ---------------------------------------------------------------- */

static void expect_usage(run_t r, const char *want)
{
    cr_expect_eq(r.rc, TIDECTL_EXIT_USAGE, "rc %d, err: %s", r.rc, r.err);
    cr_expect(strstr(r.err, want) != NULL, "stderr \"%s\" lacks \"%s\"", r.err, want);
    run_free(&r);
}

Test(tidectl_cli, usage_errors_exit_2)
{
    expect_usage(run_cli(NULL), "usage: tidectl");
    expect_usage(run_cli("frob", NULL), "unknown command 'frob'");
    expect_usage(run_cli("resize", "llm", NULL), "give the new layout with --dp");
    expect_usage(run_cli("resize", "--dp", "2", "--tp", "1", "--pp", "1", NULL),
                 "usage: tidectl resize JOB");
    expect_usage(run_cli("resize", "llm", "--dp", "0", "--tp", "1", "--pp", "1", NULL),
                 "--dp: 0 is outside [1, 65536]");
    expect_usage(
        run_cli("resize", "llm", "--dp", "2", "--tp", "1", "--pp", "2", "--stages", "0-11", NULL),
        "--stages gives 1 stages but --pp is 2");
    expect_usage(run_cli("resize", "my job", "--dp", "1", "--tp", "1", "--pp", "1", NULL),
                 "may hold only letters");
    expect_usage(run_cli("resize", "llm", "--dp", "2", "--tp", "1", "--pp", "1", "--placement",
                         "best", NULL),
                 "placement 'best' is not one of: default, optimal");
    expect_usage(run_cli("drain", "gpu3", NULL), "WORKER must be a worker id");
    expect_usage(run_cli("grow", NULL), "usage: tidectl grow JOB");
    expect_usage(run_cli("grow", "llm", "--nodes", "0", NULL), "--nodes: 0 is outside [1, 4096]");
    expect_usage(run_cli("checkpoint", NULL), "usage: tidectl checkpoint JOB");
    expect_usage(run_cli("checkpoint", "llm", "--dir", "", NULL), "--dir must be a path of 1 to");
    expect_usage(run_cli("status", "extra", NULL), "takes no arguments");
    expect_usage(run_cli("status", "--frob", NULL), "unknown option '--frob'");
    expect_usage(run_cli("status", "-o", "tall", NULL), "-o/--output takes 'wide', not 'tall'");
    expect_usage(run_cli("status", "--count", "2", NULL), "--count needs --watch");
    expect_usage(run_cli("submit", "--", "python", NULL), "add --offline");
    expect_usage(run_cli("submit", "--offline", NULL), "give the command after '--'");
    expect_usage(run_cli("submit", "--offline", "--mem-cap", "lots", "--", "x", NULL),
                 "--mem-cap 'lots' is not a byte count");
    expect_usage(run_cli("submit", "--offline", "--max-memory", "lots", "--", "x", NULL),
                 "--max-memory 'lots' is not a byte count");
    expect_usage(run_cli("submit", "--offline", "--max-memory", "100K", "--", "x", NULL),
                 "--max-memory 100K is under 1 MiB");
    expect_usage(run_cli("submit", "--offline", "--max-procs", "-1", "--", "x", NULL),
                 "--max-procs");
    expect_usage(run_cli("submit", "--offline", "--max-procs", "many", "--", "x", NULL),
                 "--max-procs");
    expect_usage(run_cli("submit", "--offline", "--plugin", "p", "--max-procs", "4", NULL),
                 "a plugin runs inside the worker's own process");
    expect_usage(run_cli("events", "--since", "later", NULL), "--since 'later'");
    expect_usage(run_cli("--key", "/nonexistent.key", "status", NULL), "both --key");
    expect_usage(
        run_cli("--key", "/nonexistent.key", "--server-key", "/nonexistent.pub", "status", NULL),
        "cannot read key file /nonexistent.key");
    expect_usage(run_cli("--endpoint", "nowhere", "status", NULL), "--endpoint 'nowhere'");
    expect_usage(run_cli("--timeout-ms", "0", "status", NULL), "--timeout-ms");
}

Test(tidectl_cli, help_exits_0)
{
    run_t r = run_cli("--help", NULL);
    cr_expect_eq(r.rc, 0);
    cr_expect(strstr(r.out, "exit codes: 0 ok; 1 refused by tided"), "%s", r.out);
    run_free(&r);
    r = run_cli("resize", "--help", NULL);
    cr_expect_eq(r.rc, 0);
    cr_expect(strstr(r.out, "--placement"), "%s", r.out);
    run_free(&r);
}

/* ---- against the fake tided
 * --------------------------------------------------------------------------- */

Test(tidectl_cli, status_and_jobs)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "status", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "a-much-longer-host-name.example"), "%s", r.out);
    cr_expect_eq(f.last.type, TIDE_MSG_STATUS);
    run_free(&r);
    r = run_cli("jobs", "--json", "--endpoint", f.endpoint, NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(
        strstr(r.out, "{\"jobs\":[{\"name\":\"llm\",\"kind\":\"online\",\"state\":\"running\""),
        "%s", r.out);
    run_free(&r);
    r = run_cli("jobs", "--endpoint", f.endpoint, NULL);
    cr_expect(strstr(r.out, "dp2 tp1 pp2"), "%s", r.out);
    cr_expect_eq(col_of(r.out, "PRIORITY") + (long)strlen("PRIORITY"), col_of(r.out, "-5") + 2,
                 "numbers right-aligned under their header:\n%s", r.out);
    /* an online job's elastic declaration: its priority and bounds, and why the policy
       leaves it alone */
    cr_expect_eq(col_of(r.out, "PRIORITY") + (long)strlen("PRIORITY"), col_of(r.out, " 7 ") + 2,
                 "%s", r.out);
    cr_expect_eq(col_of(r.out, "BOUNDS"), col_of(r.out, "4-12 pinned"), "%s", r.out);
    run_free(&r);
    r = run_cli("jobs", "--json", "--endpoint", f.endpoint, NULL);
    cr_expect(strstr(r.out, "\"priority\":7,\"attempts\":0,\"min_gpus\":4,\"max_gpus\":12,"
                            "\"hold\":\"pinned\",\"allocs\":null}"),
              "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.bad_frames, 0, "requests use the [\"\"][payload] envelope");
}

Test(tidectl_cli, status_follows_every_page_and_all_lists_the_workers_that_left)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status_paged, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "--json", "status", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    for (int k = 0; k < 6; k++) {
        char want[48];
        snprintf(want, sizeof want, "\"worker\":%d,", 3 * k);
        cr_expect(strstr(r.out, want) != NULL, "row of worker %d missing:\n%s", 3 * k, r.out);
    }
    cr_expect_null(strstr(r.out, "\"left\""), "%s", r.out);
    cr_expect_eq(f.last.u.status.all, 0);
    cr_expect_eq(f.last.u.status.from, 12, "the last page starts at the id tided named");
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "status", "--all", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "7 GPUs: 0 online, 0 offline work, 6 idle, 0 draining, 0 failed, "
                            "1 left"),
              "%s", r.out);
    cr_expect(strstr(r.out, "page-host-18"), "%s", r.out);
    cr_expect_eq(f.last.u.status.all, 1);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, resize_dry_run_sends_the_layout_and_prints_the_plan)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_resize, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "resize", "llm", "--dp", "2", "--tp", "2", "--pp",
                      "2", "--stages", "0-9,10-23", "--dry-run", "--placement", "optimal", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_RESIZE);
    const tide_proto_resize_t *q = &f.last.u.resize;
    cr_expect_str_eq(q->job, "llm");
    cr_expect(q->dp == 2 && q->tp == 2 && q->pp == 2 && q->dry_run == 1);
    cr_expect_eq(q->placement, TIDE_PLACEMENT_OPTIMAL);
    cr_expect(q->n_stages == 3 && q->stage_start[1] == 10 && q->stage_start[2] == 24);
    cr_expect(strstr(r.out, "dry run for llm (nothing changed): generation 4"), "%s", r.out);
    cr_expect(strstr(r.out, "stages 0-9,10-23"), "%s", r.out);
    cr_expect(strstr(r.out, "bytes sent    3.00 GiB over the network in 12 messages"), "%s", r.out);
    cr_expect(strstr(r.out, "rank order    27.00 GiB with the default rank order"), "%s", r.out);
    cr_expect(strstr(r.out, "largest send  512.00 MiB"), "%s", r.out);
    cr_expect(strstr(r.out, "estimated     1.8 s"), "%s", r.out);
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "--json", "resize", "llm", "--dp", "1", "--tp", "1",
                "--pp", "1", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "\"dry_run\":false,\"generation\":4"), "%s", r.out);
    cr_expect(strstr(r.out, "\"bytes_sent\":3221225472,\"bytes_default\":28991029248"), "%s",
              r.out);
    cr_expect(strstr(r.out, "rank order") == NULL, "not a dry run: no comparison");
    cr_expect_eq(f.last.u.resize.n_stages, 0u, "no --stages: tided splits evenly");
    cr_expect_eq(f.last.u.resize.tp_across_hosts, 0, "TP groups inside hosts by default");
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "resize", "llm", "--dp", "1", "--tp", "2", "--pp", "1",
                "--allow-tp-across-hosts", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_eq(f.last.u.resize.tp_across_hosts, 1);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, submit_passes_argv_after_double_dash)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_ok, NULL, 0, 0);
    run_t r =
        run_cli("--endpoint", f.endpoint, "submit", "--offline", "--name", "sweep-1", "--priority",
                "-5", "--mem-cap", "16G", "--max-memory", "512M", "--max-procs", "20", "--",
                "python", "train.py", "--lr", "3e-4", "-v", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_SUBMIT);
    const tide_proto_submit_t *m = &f.last.u.submit;
    cr_expect_str_eq(m->name, "sweep-1");
    cr_expect_eq(m->kind, TIDE_JOB_COMMAND);
    cr_expect_eq(m->priority, -5);
    cr_expect_eq(m->mem_cap, 16ull << 30);
    cr_expect(m->max_memory == 512ull << 20 && m->max_procs == 20, "the attempt's limits");
    cr_assert_eq(m->argc, 5u);
    cr_expect_str_eq(m->argv[0], "python");
    cr_expect_str_eq(m->argv[2], "--lr");
    cr_expect_str_eq(m->argv[4], "-v");
    cr_expect(strstr(r.out, "submitted offline job sweep-1: submit accepted"), "%s", r.out);
    run_free(&r);
    /* default name: the command's base name */
    r = run_cli("--endpoint", f.endpoint, "submit", "--offline", "--", "/usr/bin/stress-ng", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_eq(strncmp(f.last.u.submit.name, "stress-ng-", 10), 0, "%s", f.last.u.submit.name);
    cr_expect(f.last.u.submit.max_memory == 0 && f.last.u.submit.max_procs == 0,
              "no limits given: tided's defaults apply");
    run_free(&r);
    /* a relative root is made absolute here: the workers resolve nothing */
    r = run_cli("--endpoint", f.endpoint, "checkpoint", "llm", "--dir", "ck/llm", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_CHECKPOINT);
    cr_expect_str_eq(f.last.u.checkpoint.job, "llm");
    char cwd[512], want[600];
    cr_assert_not_null(getcwd(cwd, sizeof cwd));
    snprintf(want, sizeof want, "%s/ck/llm", cwd);
    cr_expect_str_eq(f.last.u.checkpoint.dir, want);
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "checkpoint", "llm", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_str_eq(f.last.u.checkpoint.dir, "", "no --dir: the job's own root");
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "drain", "17", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect_eq(f.last.type, TIDE_MSG_DRAIN);
    cr_expect_eq(f.last.u.drain.worker, 17);
    cr_expect(strstr(r.out, "drain accepted"), "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, refusal_exits_1_with_tideds_message)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_error, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "cancel", "ghost", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_REFUSED);
    cr_expect(strstr(r.err, "tided refused cancel: no job 'ghost': see tidectl jobs "
                            "(TIDE_ERR_NOT_FOUND)"),
              "%s", r.err);
    cr_expect_str_eq(f.last.u.cancel.job, "ghost");
    cr_expect_eq(r.out_len, 0u);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, events_since_is_sent_as_wall_clock_ms)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_events, NULL, 0, 0);
    int64_t before = tide_wall_ms();
    run_t r = run_cli("--endpoint", f.endpoint, "events", "--since", "10m", "--after", "40",
                      "--limit", "5", NULL);
    int64_t after = tide_wall_ms();
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_EVENTS);
    cr_expect(f.last.u.events.since_ms >= before - 600000 &&
              f.last.u.events.since_ms <= after - 600000);
    cr_expect_eq(f.last.u.events.since_id, 40u);
    cr_expect_eq(f.last.u.events.limit, 5u);
    cr_expect(strstr(r.out, "worker_failed"), "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

/* The filters go to tided as typed fields; the table is newest first (tided's order), the
   JSON one object per line, oldest first, with the typed fields that apply. */
Test(tidectl_cli, events_filters_are_sent_and_json_is_lines_oldest_first)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_events, NULL, 0, 0);
    run_t r =
        run_cli("--endpoint", f.endpoint, "--json", "events", "--job", "llm", "--type", "resize*",
                "--since", "1700000000000", "--until", "1700000001000", "--tail", "7", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_assert_eq(f.last.type, TIDE_MSG_EVENTS);
    cr_expect_str_eq(f.last.u.events.job, "llm");
    cr_expect_str_eq(f.last.u.events.kind, "resize*");
    cr_expect_eq(f.last.u.events.since_ms, 1700000000000);
    cr_expect_eq(f.last.u.events.until_ms, 1700000001000);
    cr_expect_eq(f.last.u.events.limit, 7u);
    cr_expect(f.last.u.events.newest);
    /* the fake answers rows 41, 42 as if newest first: printed 42 then 41, one per line */
    const char *a = strstr(r.out, "{\"id\":42,");
    const char *b = strstr(r.out, "{\"id\":41,");
    cr_expect(a != NULL && b != NULL && a < b, "%s", r.out);
    cr_expect(strstr(r.out, "\"gen\":7,\"dp\":4,\"tp\":1,\"pp\":1,\"workers\":[10,11,12,13]"), "%s",
              r.out);
    cr_expect(strstr(r.out, "\"ms\":8.250}\n"), "%s", r.out);
    cr_expect(b[-1] == '\n', "one object per line: %s", r.out);
    run_free(&r);
    fake_stop(&f);
    expect_usage(run_cli("events", "--type", "resize started", NULL), "--type 'resize started'");
    expect_usage(run_cli("events", "--since", "1700000001000", "--until", "1700000000000", NULL),
                 "--until must be later");
}

Test(tidectl_cli, top_refreshes_count_times)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "top", "--count", "3", "--interval", "50", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int frames = 0;
    for (const char *p = r.out; (p = strstr(p, "tide top")) != NULL; p++)
        frames++;
    cr_expect_eq(frames, 3, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.requests, 6, "status + jobs per refresh");
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    r = run_cli("--endpoint", f.endpoint, "top", "--count", "2", "--interval", "50", "--json",
                NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int lines = 0;
    for (const char *p = r.out; *p; p++)
        lines += *p == '\n';
    cr_expect_eq(lines, 2, "one JSON document per line:\n%s", r.out);
    cr_expect_eq(strncmp(r.out, "{\"status\":{\"time_ms\":", 21), 0, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

/* status -o wide asks tided once and prints the process columns; --watch redraws every
   --interval ms, --count times here, one JSON line per refresh with --json. */
Test(tidectl_cli, status_wide_and_watch)
{
    fake_t f;
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    run_t r = run_cli("--endpoint", f.endpoint, "status", "-o", "wide", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    cr_expect(strstr(r.out, "PID") && strstr(r.out, "4242") && strstr(r.out, "launch-7"), "%s",
              r.out);
    run_free(&r);
    r = run_cli("--endpoint", f.endpoint, "status", "--output=wide", NULL);
    cr_expect(r.rc == 0 && strstr(r.out, "4242"), "%s%s", r.out, r.err);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.requests, 2);
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    r = run_cli("--endpoint", f.endpoint, "status", "--watch", "--count", "3", "--interval", "50",
                NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int frames = 0;
    for (const char *p = r.out; (p = strstr(p, "tidectl status  ")) != NULL; p++)
        frames++;
    cr_expect_eq(frames, 3, "%s", r.out);
    int tables = 0;
    for (const char *p = r.out; (p = strstr(p, "2 GPUs: ")) != NULL; p++)
        tables++;
    cr_expect_eq(tables, 3, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
    cr_expect_eq(f.requests, 3, "one status request per refresh");
    fake_start(&f, FAKE_REPLY, answer_status, NULL, 0, 0);
    r = run_cli("--endpoint", f.endpoint, "--json", "status", "--watch", "--count", "2",
                "--interval", "50", NULL);
    cr_expect_eq(r.rc, 0, "%s", r.err);
    int lines = 0;
    for (const char *p = r.out; *p; p++)
        lines += *p == '\n';
    cr_expect_eq(lines, 2, "one JSON document per line:\n%s", r.out);
    cr_expect_eq(strncmp(r.out, "{\"time_ms\":", 11), 0, "%s", r.out);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, silent_tided_times_out_with_exit_4)
{
    fake_t f;
    fake_start(&f, FAKE_SILENT, answer_ok, NULL, 0, 0);
    uint64_t t0 = tide_now_ns();
    run_t r = run_cli("--endpoint", f.endpoint, "--timeout-ms", "300", "status", NULL);
    double ms = (double)(tide_now_ns() - t0) / 1e6;
    cr_expect_eq(r.rc, TIDECTL_EXIT_TIMEOUT, "%s", r.err);
    cr_expect(strstr(r.err, "timed out after 300 ms"), "%s", r.err);
    cr_expect(ms >= 290 && ms < 3000, "took %.0f ms", ms);
    run_free(&r);
    fake_stop(&f);
}

Test(tidectl_cli, nobody_listening_exits_3)
{
    /* a port that was free a moment ago */
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_ROUTER);
    zmq_bind(s, "tcp://127.0.0.1:*");
    char ep[128];
    size_t len = sizeof ep;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
    zmq_close(s);
    zmq_ctx_term(ctx);
    run_t r = run_cli("--endpoint", ep, "--timeout-ms", "300", "jobs", NULL);
    cr_expect_eq(r.rc, TIDECTL_EXIT_UNREACHABLE, "%s", r.err);
    cr_expect(strstr(r.err, "cannot reach tided at"), "%s", r.err);
    cr_expect(strstr(r.err, "is tided running?"), "%s", r.err);
    run_free(&r);
}
