/*
 * Unit tests for the Slurm provider (coordinator/slurm.c) against fake Slurm commands:
 * shell scripts in a temporary folder (the provider's --slurm-bin) that log how they were
 * called and answer from files the test writes. A grow submits the template's batch script
 * with its folder, partition and name; every pending reason is an event, one that can
 * never clear cancels the allocation, as does pending past the limit and the job's end;
 * sbatch's refusal and a script-less template are refused with Slurm's words; a watched
 * allocation is reported when it leaves and when it starts again; the "none" provider
 * refuses with what to do. Plus the parsers of Slurm's text. Milliseconds each.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "coordinator/provider.h"

static char dir[64];
static char events[64][1100]; /* "job kind: detail" */
static int n_events;

static void sink(void *ctx, const char *job, const char *kind, const char *detail)
{
    (void)ctx;
    if (n_events < 64)
        snprintf(events[n_events++], sizeof events[0], "%s %s: %s", job, kind, detail);
}

/* Writes the fake's file `name` whole at once (a rename): a fake command that reads it
 * meanwhile sees the old text or the new, never an empty file. */
static void put(const char *name, const char *text)
{
    char path[128], tmp[140];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(rename(tmp, path), 0);
}

/* squeue runs the fake made so far (lines of $D/calls naming it). */
static int squeue_calls(void)
{
    char path[128], line[512];
    snprintf(path, sizeof path, "%s/calls", dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        n += strncmp(line, "squeue", 6) == 0;
    if (f != NULL)
        fclose(f);
    return n;
}

static void script(const char *name, const char *body)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\nD=%s\necho \"%s $*\" >> $D/calls\n%s\n", dir, name, body);
    fclose(f);
    chmod(path, 0755);
}

/* The fake Slurm: scontrol prints $D/show.out, sbatch prints $D/sbatch.out (exit
 * $D/sbatch.rc), squeue prints $D/queue.out (exit $D/queue.rc), scancel succeeds. */
static void fake_slurm(void)
{
    snprintf(dir, sizeof dir, "/tmp/tide-fake-slurm-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    script("scontrol", "cat $D/show.out");
    script("sbatch", "cat $D/sbatch.out; exit $(cat $D/sbatch.rc 2>/dev/null || echo 0)");
    script("squeue", "cat $D/queue.out; exit $(cat $D/queue.rc 2>/dev/null || echo 0)");
    script("scancel", "exit 0");
    put("show.out", "JobId=5 JobName=tide job UserId=u(1) Partition=low ReqNodeList=(null) "
                "NodeList=h[1-2] Command=/jobs/my job.sh WorkDir=/tmp Power=\n");
    put("sbatch.out", "17\n");
    put("queue.out", "");
    n_events = 0;
}

static void cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static tide_provider_t slurm_with(uint64_t pending_ms)
{
    tide_slurm_config cfg = {.poll_ms = 5, .pending_ms = pending_ms, .cmd_ms = 5000};
    snprintf(cfg.bin, sizeof cfg.bin, "%s", dir);
    tide_provider_t p;
    cr_assert_eq(tide_provider_slurm(&p, &cfg, sink, NULL), TIDE_OK);
    return p;
}

/* Ticks p until a poll that began after this call has been judged, so that the provider
 * has seen the fake's present text whatever the machine's load: three more squeue runs
 * (the one in flight may have read the earlier text; polls run one at a time, so the third
 * starts after the second's output was judged). Fails after 10 s. */
static void settle(tide_provider_t *p)
{
    int want = squeue_calls() + 3;
    uint64_t end = tide_now_ns() + 10000000000ull;
    while (squeue_calls() < want) {
        cr_assert(tide_now_ns() < end, "squeue was not run three times in 10 s");
        p->ops->tick(p->self, tide_now_ns());
        tide_sleep_ms(2);
    }
}

/* Ticks p until an event containing `what` arrived (fails after 10 s); its index. */
static int until(tide_provider_t *p, const char *what)
{
    uint64_t end = tide_now_ns() + 10000000000ull;
    for (;;) {
        for (int i = 0; i < n_events; i++)
            if (strstr(events[i], what) != NULL)
                return i;
        if (tide_now_ns() > end) {
            for (int i = 0; i < n_events; i++)
                fprintf(stderr, "event: %s\n", events[i]);
            cr_assert_fail("no event with '%s'", what);
        }
        p->ops->tick(p->self, tide_now_ns());
        tide_sleep_ms(2);
    }
}

/* 1 when the fake's call log has a line containing `what`. */
static int called(const char *what)
{
    char path[128], line[1024];
    snprintf(path, sizeof path, "%s/calls", dir);
    FILE *f = fopen(path, "r");
    int found = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        found |= strstr(line, what) != NULL;
    if (f != NULL)
        fclose(f);
    return found;
}

TestSuite(slurm_provider, .init = fake_slurm, .fini = cleanup);

Test(slurm_provider, grow_submits_the_script_again_and_reports_until_it_runs)
{
    tide_provider_t p = slurm_with(0);
    char why[512];
    cr_assert_eq(p.ops->grow(p.self, "mlp", "5", 2, why, sizeof why), TIDE_OK);
    cr_assert(strstr(why, "2 more nodes") != NULL, "%s", why);
    put("queue.out", "17|PENDING|Resources||N/A\n");
    until(&p, "allocation_submitted: Slurm job 17: 2 nodes in partition low for job mlp");
    cr_assert(called("scontrol show job -o 5"));
    cr_assert(called("sbatch --parsable --nodes=2 --partition=low --job-name=tide job "
                     "--chdir=/tmp /jobs/my job.sh"));
    until(&p, "allocation_pending: Slurm job 17 for job mlp waits: Resources (no free nodes yet)");
    cr_assert_eq(p.ops->grow(p.self, "mlp", "5", 1, why, sizeof why), TIDE_ERR_BUSY);
    cr_assert(strstr(why, "Slurm job 17") != NULL, "%s", why);
    p.ops->describe(p.self, "mlp", why, sizeof why);
    cr_assert_str_eq(why, "slurm 17 pending (Resources)");
    put("queue.out", "17|PENDING|Priority||N/A\n");
    until(&p, "waits: Priority");
    put("queue.out", "17|RUNNING|None|h[3-4]|2026-01-01T00:00:00\n");
    until(&p, "allocation_started: Slurm job 17 started on h[3-4]: its pools join job mlp");
    p.ops->describe(p.self, "mlp", why, sizeof why);
    cr_assert_str_eq(why, "");
    /* the next request is accepted once the first started */
    cr_assert_eq(p.ops->grow(p.self, "mlp", "17", 1, why, sizeof why), TIDE_OK);
    p.ops->destroy(p.self);
}

Test(slurm_provider, a_limit_that_never_clears_cancels)
{
    tide_provider_t p = slurm_with(0);
    char why[512];
    cr_assert_eq(p.ops->grow(p.self, "mlp", "5", 9, why, sizeof why), TIDE_OK);
    put("queue.out", "17|PENDING|PartitionNodeLimit||N/A\n");
    until(&p, "grow_refused: Slurm cannot start job 17 as asked: PartitionNodeLimit (more nodes "
              "than the partition allows); cancelled");
    for (int i = 0; i < 1000 && !called("scancel 17"); i++) {
        p.ops->tick(p.self, tide_now_ns());
        tide_sleep_ms(2);
    }
    cr_assert(called("scancel 17"));
    p.ops->destroy(p.self);
}

Test(slurm_provider, pending_too_long_and_job_end_cancel)
{
    tide_provider_t p = slurm_with(100);
    char why[512];
    cr_assert_eq(p.ops->grow(p.self, "mlp", "5", 1, why, sizeof why), TIDE_OK);
    put("queue.out", "17|PENDING|Resources||N/A\n");
    until(&p, "grow_refused: Slurm job 17 still pending after 0.1 s (Resources: no free nodes yet)");
    p.ops->destroy(p.self);

    tide_provider_t q = slurm_with(0);
    n_events = 0;
    cr_assert_eq(q.ops->grow(q.self, "mlp", "5", 1, why, sizeof why), TIDE_OK);
    until(&q, "allocation_submitted");
    q.ops->job_ended(q.self, "other"); /* not this job's */
    q.ops->job_ended(q.self, "mlp");
    until(&q, "allocation_cancelled: Slurm job 17 cancelled: job mlp ended");
    for (int i = 0; i < 1000 && !called("scancel 17"); i++) {
        q.ops->tick(q.self, tide_now_ns());
        tide_sleep_ms(2);
    }
    cr_assert(called("scancel 17"));
    q.ops->destroy(q.self);
}

Test(slurm_provider, refusals_name_the_reason)
{
    tide_provider_t p = slurm_with(0);
    char why[512];
    put("sbatch.out", "sbatch: error: invalid partition specified: low\n"
                  "sbatch: error: Batch job submission failed: Invalid partition name specified\n");
    put("sbatch.rc", "1\n");
    cr_assert_eq(p.ops->grow(p.self, "mlp", "5", 1, why, sizeof why), TIDE_OK);
    until(&p, "grow_refused: Slurm refused 1 more node for job mlp: sbatch: error: Batch job "
              "submission failed: Invalid partition name specified");
    put("show.out", "JobId=6 JobName=wrap Partition=low Command=(null) WorkDir=/tmp\n");
    cr_assert_eq(p.ops->grow(p.self, "mlp", "6", 1, why, sizeof why), TIDE_OK);
    until(&p, "Slurm job 6 has no batch script file to submit again");
    put("show.out", "slurm_load_jobs error: Invalid job id specified\n");
    script("scontrol", "cat $D/show.out; exit 1");
    cr_assert_eq(p.ops->grow(p.self, "mlp", "7", 1, why, sizeof why), TIDE_OK);
    until(&p, "grow_refused: cannot read Slurm job 7 (the job's allocation): slurm_load_jobs "
              "error: Invalid job id specified");
    cr_assert_eq(p.ops->grow(p.self, "mlp", "7", 0, why, sizeof why), TIDE_ERR_INVALID);
    cr_assert_eq(p.ops->grow(p.self, "mlp", "7; rm", 1, why, sizeof why), TIDE_ERR_INVALID);
    p.ops->destroy(p.self);
}

Test(slurm_provider, a_watched_allocation_leaves_and_comes_back)
{
    tide_provider_t p = slurm_with(0);
    put("queue.out", "21|RUNNING|None|h3|2026-01-01T00:00:00\n");
    p.ops->watch(p.self, "mlp", "21");
    p.ops->watch(p.self, "mlp", "21"); /* once */
    settle(&p);
    cr_assert_eq(n_events, 0, "a running allocation giving its nodes back was reported");
    char why[256];
    p.ops->describe(p.self, "mlp", why, sizeof why);
    cr_assert_str_eq(why, "slurm 21 leaving");
    put("queue.out", "21|PENDING|BeginTime||N/A\n");
    until(&p, "allocation_pending: Slurm job 21 for job mlp waits: BeginTime");
    put("queue.out", "21|RUNNING|None|h2|2026-01-01T00:05:00\n");
    until(&p, "allocation_started: Slurm job 21 started again on h2");

    /* restarted between two polls: a new start time says so */
    n_events = 0;
    put("queue.out", "22|RUNNING|None|h3|2026-01-01T00:00:00\n");
    p.ops->watch(p.self, "mlp", "22");
    settle(&p);
    put("queue.out", "22|RUNNING|None|h1|2026-01-01T00:09:00\n");
    until(&p, "Slurm job 22 started again on h1");

    /* ended instead of requeued */
    put("queue.out", "23|RUNNING|None|h3|2026-01-01T00:00:00\n");
    p.ops->watch(p.self, "mlp", "23");
    settle(&p);
    put("queue.out", "23|COMPLETED|None|h3|2026-01-01T00:00:00\n");
    until(&p, "allocation_ended: Slurm job 23 is COMPLETED instead of requeued");
    /* forgotten by Slurm */
    p.ops->watch(p.self, "mlp", "24");
    put("queue.out", "slurm_load_jobs error: Invalid job id specified\n");
    put("queue.rc", "1\n");
    until(&p, "allocation_ended: Slurm job 24 is gone");
    p.ops->destroy(p.self);
}

Test(slurm_provider, none_refuses_with_what_to_do)
{
    tide_provider_t p;
    tide_provider_none(&p);
    char why[512];
    cr_assert_eq(p.ops->grow(p.self, "mlp", "5", 1, why, sizeof why), TIDE_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "--provider slurm") != NULL, "%s", why);
    p.ops->describe(p.self, "mlp", why, sizeof why);
    cr_assert_str_eq(why, "");
    p.ops->destroy(p.self);
    int on = -1;
    cr_assert_eq(tide_provider_parse("slurm", &on), TIDE_OK);
    cr_assert_eq(on, 1);
    cr_assert_eq(tide_provider_parse("none", &on), TIDE_OK);
    cr_assert_eq(on, 0);
    cr_assert_eq(tide_provider_parse("pbs", &on), TIDE_ERR_INVALID);
}

Test(slurm_text, fields_ids_reasons)
{
    const char *line = "JobId=12 JobName=my job NodeList=h[1-2] ReqNodeList=(null) "
                       "BatchHost=h1 Command=/a b/c.sh WorkDir=/w TRES=cpu=8,node=2\n";
    char v[64];
    cr_assert_eq(tide_slurm_field(line, "JobName", v, sizeof v), TIDE_OK);
    cr_assert_str_eq(v, "my job");
    cr_assert_eq(tide_slurm_field(line, "NodeList", v, sizeof v), TIDE_OK);
    cr_assert_str_eq(v, "h[1-2]");
    cr_assert_eq(tide_slurm_field(line, "ReqNodeList", v, sizeof v), TIDE_ERR_NOT_FOUND);
    cr_assert_eq(tide_slurm_field(line, "Command", v, sizeof v), TIDE_OK);
    cr_assert_str_eq(v, "/a b/c.sh");
    cr_assert_eq(tide_slurm_field(line, "TRES", v, sizeof v), TIDE_OK);
    cr_assert_str_eq(v, "cpu=8,node=2");
    cr_assert_eq(tide_slurm_field(line, "Name", v, sizeof v), TIDE_ERR_NOT_FOUND);
    cr_assert_eq(tide_slurm_field(line, "Command", v, 4), TIDE_ERR_RANGE);
    cr_assert_eq(tide_slurm_parsable_id("123;tide\n", v, sizeof v), TIDE_OK);
    cr_assert_str_eq(v, "123");
    cr_assert_eq(tide_slurm_parsable_id("123\n", v, sizeof v), TIDE_OK);
    cr_assert_eq(tide_slurm_parsable_id("sbatch: error\n", v, sizeof v), TIDE_ERR_PROTOCOL);
    cr_assert_eq(tide_slurm_parsable_id("", v, sizeof v), TIDE_ERR_PROTOCOL);
    cr_assert(tide_slurm_id_ok("123") && tide_slurm_id_ok("123_4"));
    cr_assert(!tide_slurm_id_ok("") && !tide_slurm_id_ok("12 3") && !tide_slurm_id_ok("_1") &&
              !tide_slurm_id_ok("-1") && !tide_slurm_id_ok("12345678901234567890123456789012"));
    cr_assert(tide_slurm_reason_fatal("PartitionNodeLimit"));
    cr_assert(!tide_slurm_reason_fatal("Resources") && !tide_slurm_reason_fatal("BeginTime"));
}
