/*
 * Part of the test_examples_tide_recover executable (tests/test_examples_tide_recover.c):
 * what tided and tidectl report about the recovery. The `tidectl --json` queries and the
 * readers of their replies; rank 0's checks after the job's last step (status, jobs, the
 * events of the failure, the recovery or rollback, the checkpoints); the layout scenario's
 * refused `tidectl resize --dp 3`; and rank 0's watchdog thread: the recovery must come,
 * not a hang (zero1: tided stalls the job and says why; stopped: the resumed rank is fenced
 * and leaves, never listed idle).
 */
#include <ctype.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_harness.h"
#include "tide_recover_int.h"

#define DP3_REASON "dp 3 x 4 micro-batches = 12 does not divide 16 (the global batch)"

/* ---- tidectl ------------------------------------------------------------------------------- */

/* Runs `tidectl --endpoint E --json CMD` with stdout into out; its exit status. */
static int tidectl_json(const char *tidectl, const char *endpoint, const char *cmd, char *out,
                        size_t cap)
{
    const char *args[] = {"--json", cmd, NULL};
    return coord_tidectl(tidectl, endpoint, args, out, cap);
}

/* `tidectl --json events` for every event of this short test (tidectl lists the newest 100
   unless told otherwise), into out; its exit status. */
int tidectl_events(const char *tidectl, const char *endpoint, char *out, size_t cap)
{
    const char *args[] = {"--json", "events", "--limit", "500", NULL};
    return coord_tidectl(tidectl, endpoint, args, out, cap);
}

int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* The JSON object ({...}) of hay around p (a position in it), copied into out. */
static void object_at(const char *hay, const char *p, char *out, size_t cap)
{
    const char *a = p, *b = p;
    while (a > hay && *a != '{')
        a--;
    while (*b != '\0' && *b != '}')
        b++;
    size_t n = (size_t)(b - a) + 1 < cap ? (size_t)(b - a) + 1 : cap - 1;
    memcpy(out, a, n);
    out[n] = '\0';
}

/* The JSON object of hay that contains needle (its first), copied into out; 0 when none. */
int object_with(const char *hay, const char *needle, char *out, size_t cap)
{
    const char *p = strstr(hay, needle);
    if (p == NULL)
        return 0;
    object_at(hay, p, out, cap);
    return 1;
}

/* Whether s holds text, a number that ends text matched whole ("step 4" is not in "step
   40", nor "steps lost: 1" in "steps lost: 12"). */
int has_text(const char *s, const char *text)
{
    size_t n = strlen(text);
    int num = n > 0 && isdigit((unsigned char)text[n - 1]);
    for (const char *p = strstr(s, text); p != NULL; p = strstr(p + 1, text))
        if (!num || !isdigit((unsigned char)p[n]))
            return 1;
    return 0;
}

/* The number of events of kind in a `tidectl --json events` reply whose object holds text
   (has_text). */
int events_with(const char *events, const char *kind, const char *text)
{
    char needle[96], obj[2048];
    snprintf(needle, sizeof needle, "\"kind\":\"%s\"", kind);
    int n = 0;
    for (const char *p = strstr(events, needle); p != NULL; p = strstr(p + 1, needle)) {
        object_at(events, p, obj, sizeof obj);
        n += has_text(obj, text);
    }
    return n;
}

/* ckpt-corrupt: whether the damaged checkpoint was saved again when generation 3 redid its
   step (two checkpoint_saved events for it), as rank 0 saw in check_tidectl */
int g_resaved;

/* Rank 0, after the job's last step and before any bye: what tidectl reports. */
tide_t *g_t; /* rank 0's runtime, for the victim's worker id */

void check_tidectl(const char *tidectl, const char *endpoint, const tide_layout_t *now)
{
    static char buf[1 << 18];
    char obj[2048], want[400];
    MT_ASSERT(tidectl_json(tidectl, endpoint, "status", buf, sizeof buf) == 0,
              "tidectl status failed: %s", buf);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MT_ASSERT(count_of(buf, "\"worker\":") == size, "tidectl status lists %d workers, want %d: %s",
              count_of(buf, "\"worker\":"), size, buf);
    MT_ASSERT(count_of(buf, "\"state\":\"failed\"") == 1,
              "tidectl status shows %d failed workers, want exactly the victim: %s",
              count_of(buf, "\"state\":\"failed\""), buf);
    MT_ASSERT(count_of(buf, "\"job\":\"" JOB "\"") == (int)tide_layout_size(now),
              "tidectl status shows %d workers in the job, want the %zu of the recovery layout: "
              "%s",
              count_of(buf, "\"job\":\"" JOB "\""), tide_layout_size(now), buf);

    MT_ASSERT(tidectl_json(tidectl, endpoint, "jobs", buf, sizeof buf) == 0,
              "tidectl jobs failed: %s", buf);
    MT_ASSERT(object_with(buf, "\"name\":\"" JOB "\"", obj, sizeof obj), "no job %s in %s", JOB,
              buf);
    snprintf(want, sizeof want, "\"gen\":%llu,\"dp\":%d,\"tp\":%d,\"pp\":%d",
             (unsigned long long)g.final_gen, now->dp, now->tp, now->pp);
    MT_ASSERT(strstr(obj, want) != NULL && strstr(obj, "\"state\":\"running\"") != NULL,
              "tidectl jobs: want %s, running; got %s", want, obj);

    /* ckpt modes: the last checkpoints' reports may still be on their way (rank 0, their
       publisher, waited until they were published, not until tided heard of them) */
    uint64_t deadline = tide_now_ns() + 10 * 1000000000ull;
    for (;;) {
        MT_ASSERT(tidectl_events(tidectl, endpoint, buf, sizeof buf) == 0,
                  "tidectl events failed: %s", buf);
        if (!g.ckpt || unreported_checkpoint(buf) < 0 || tide_now_ns() >= deadline)
            break;
        tide_sleep_ms(50);
    }
    MT_ASSERT(object_with(buf, "\"kind\":\"worker_failed\"", obj, sizeof obj),
              "no worker_failed event: %s", buf);
    snprintf(want, sizeof want, " rank %d on ", g.victim);
    MT_ASSERT(strstr(obj, want) != NULL && strstr(obj, "no message for") != NULL,
              "the failed worker is not rank %d (missed heartbeats): %s", g.victim, obj);
    MT_ASSERT(count_of(buf, "\"kind\":\"worker_failed\"") == 1, "more than one worker failed: %s",
              buf);
    /* the commit's event: a rollback's is rolled_back (checked below) */
    const char *commit = g.ckpt ? "rolled_back" : "recovered";
    char committed[64];
    snprintf(want, sizeof want, "\"kind\":\"%s\"", commit);
    snprintf(committed, sizeof committed,
             "generation %llu committed: ", (unsigned long long)g.final_gen);
    MT_ASSERT(object_with(buf, want, obj, sizeof obj) && strstr(obj, committed) != NULL,
              "no %s event for generation %llu: %s", commit, (unsigned long long)g.final_gen, buf);
    snprintf(want, sizeof want, "from step %d,", g.switch_at);
    MT_ASSERT(g.ckpt || strstr(obj, want) != NULL, "recovered event: want %s in %s", want, obj);
    /* ckpt-corrupt: generation 2, whose checkpoint no member could load, was abandoned */
    MT_ASSERT(count_of(buf, "\"kind\":\"resize_aborted\"") == g.corrupt &&
                  (!g.corrupt || events_with(buf, "resize_aborted", "generation 2 abandoned: ")),
              "want %d resize_aborted events%s: %s", g.corrupt,
              g.corrupt ? " (\"generation 2 abandoned: \")" : "", buf);
    /* a rank that comes back after the job recovered without it never rejoins the pool */
    MT_ASSERT(count_of(buf, "\"kind\":\"worker_back\"") == 0,
              "a failed worker was taken back (stopped mode: the resumed rank must be fenced): %s",
              buf);
    snprintf(want, sizeof want, "on worker %d ", tide_pool_worker_id(g_t, g.victim));
    MT_ASSERT(!object_with(buf, want, obj, sizeof obj) ||
                  strstr(obj, "\"kind\":\"offline_assigned\"") == NULL,
              "offline work was given to the failed worker: %s", obj);
    MT_ASSERT(count_of(buf, "\"kind\":\"resize_started\"") == g.sc.n_resizes,
              "want %d resize_started events, one per resize of the scenario (the refused dp 3 "
              "must change nothing): %s",
              g.sc.n_resizes, buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"stalled\"") == 0, "the job was stalled: %s", buf);
    if (g.ckpt) {
        /* one event for each checkpoint published, in both generations: the one the job
           rolled back to was not saved again, and the periodic saves went on after it */
        int k = unreported_checkpoint(buf);
        snprintf(want, sizeof want, "step %d", g.ckpt_at);
        g_resaved = g.corrupt && events_with(buf, "checkpoint_saved", want) == 2;
        MT_ASSERT(k < 0,
                  "want one checkpoint_saved event with \"step %d\" (every %d steps, each "
                  "published once) within 10 s of its publication: %s",
                  k, g.every, buf);
        snprintf(want, sizeof want, "from the checkpoint of step %d", g.ckpt_at);
        MT_ASSERT(count_of(buf, "\"kind\":\"recovery_started\"") == 1 + g.corrupt &&
                      events_with(buf, "recovery_started", want) == 1,
                  "want %d recovery_started events, one \"%s\": %s", 1 + g.corrupt, want, buf);
        if (g.corrupt) {
            /* the damaged checkpoint is refused and the next recovery starts from the one
               before it */
            snprintf(want, sizeof want, "from the checkpoint of step %d", g.switch_at);
            MT_ASSERT(events_with(buf, "recovery_started", want) == 1,
                      "want a second recovery_started event, \"%s\": %s", want, buf);
            snprintf(want, sizeof want, "the checkpoint of step %d (%s/step-%012d)", g.ckpt_at,
                     g_ckpt_root, g.ckpt_at);
            MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_refused\"") == 1 &&
                          object_with(buf, "\"kind\":\"checkpoint_refused\"", obj, sizeof obj) &&
                          strstr(obj, want) != NULL && strstr(obj, "could not be loaded") != NULL,
                      "want one checkpoint_refused event, \"%s ... could not be loaded\": %s", want,
                      buf);
            /* and the members that read the damaged shard say which file, in the events */
            MT_ASSERT(object_with(buf, "\"kind\":\"checkpoint_failed\"", obj, sizeof obj) &&
                          strstr(obj, "shard-") != NULL && strstr(obj, "is corrupted") != NULL,
                      "want a checkpoint_failed event naming the damaged shard file: %s", buf);
        } else {
            MT_ASSERT(count_of(buf, "\"kind\":\"checkpoint_refused\"") == 0,
                      "a checkpoint was refused: %s", buf);
        }
        MT_ASSERT(count_of(buf, "\"kind\":\"rolled_back\"") == 1,
                  "want exactly one rolled_back event: %s", buf);
        MT_ASSERT(object_with(buf, "\"kind\":\"rolled_back\"", obj, sizeof obj), "no rolled_back");
        snprintf(want, sizeof want, "from the checkpoint of step %d (%s/step-%012d)", g.switch_at,
                 g_ckpt_root, g.switch_at);
        MT_ASSERT(strstr(obj, want) != NULL, "the rolled_back event must name the %s: %s",
                  want + strlen("from the "), obj);
        snprintf(want, sizeof want, "steps lost: %d (the job had completed %d)",
                 g.kill - g.switch_at, g.kill);
        MT_ASSERT(has_text(obj, want), "the rolled_back event must say \"%s\": %s", want, obj);
    }
    if (g.fit) {
        MT_ASSERT(object_with(buf, "\"kind\":\"job_created\"", obj, sizeof obj) &&
                      strstr(obj, "fit: dp x micro-batches divides 16 (the global batch); tp "
                                  "divides 256 (the FFN width); tp divides 64 (the "
                                  "vocabulary)") != NULL,
                  "the job's limits are not in its job_created event: %s", obj);
        MT_ASSERT(object_with(buf, "\"kind\":\"recovery_started\"", obj, sizeof obj) &&
                      strstr(obj, "dp 2 instead of 4") != NULL &&
                      strstr(obj, "the job's program cannot run dp 3: " DP3_REASON) != NULL &&
                      strstr(obj, "1 worker left idle for offline work") != NULL,
                  "the recovery event must say why dp 2 and what is left idle: %s", obj);
    }
}

/* layout mode, rank 0 while the job trains in generation 1: `tidectl resize --dp 3`, with
   and without --dry-run, is refused with the model's reason and exit code 1. */
void check_refused_resize(const char *tidectl, const char *endpoint)
{
    static char out[8192];
    const char *dry[] = {"resize", JOB, "--dp", "3", "--dry-run", NULL};
    const char *real[] = {"resize", JOB, "--dp", "3", NULL};
    const char *const *cmds[] = {dry, real};
    for (int i = 0; i < 2; i++) {
        int code = coord_tidectl_io(tidectl, endpoint, cmds[i], out, sizeof out, 1);
        MT_ASSERT(code == 1 && strstr(out, DP3_REASON) != NULL,
                  "tidectl resize --dp 3%s must be refused (exit 1) with \"" DP3_REASON
                  "\"; exit %d: %s",
                  i == 0 ? " --dry-run" : "", code, out);
    }
    printf("recover-layout: tidectl resize --dp 3 refused while training: %s", out);
    fflush(stdout);
}

/* ---- watchdog (rank 0 thread): the recovery must come, not a hang --------------------------- */

/* zero1 mode, rank 0's thread (its main thread waits in the step like every survivor, until
   tided's halt ends it): once tided stalled the job, checks what it says. */
static void check_stalled(watch *w)
{
    static char buf[1 << 18];
    char obj[2048];
    uint64_t deadline = tide_now_ns() + DETECT_S * 1000000000ull;
    while (w->killed_ns == 0 || !strstr(buf, "\"kind\":\"stalled\"")) {
        MT_ASSERT(w->killed_ns == 0 || tide_now_ns() < deadline,
                  "tided did not stall the job within %d s of the kill: %s", DETECT_S, buf);
        tide_sleep_ms(100);
        if (w->killed_ns != 0)
            MT_ASSERT(tidectl_json(w->tidectl, w->endpoint, "events", buf, sizeof buf) == 0,
                      "tidectl events failed: %s", buf);
    }
    tide_sleep_ms(1500); /* a recovery started after the stall would show by now */
    MT_ASSERT(tidectl_json(w->tidectl, w->endpoint, "events", buf, sizeof buf) == 0,
              "tidectl events failed: %s", buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"recovery_started\"") == 0,
              "tided started %d recoveries that cannot succeed (the lost ZeRO-1 moments have no "
              "replica): %s",
              count_of(buf, "\"kind\":\"recovery_started\""), buf);
    MT_ASSERT(count_of(buf, "\"kind\":\"stalled\"") == 1, "one stalled event: %s", buf);
    MT_ASSERT(object_with(buf, "\"kind\":\"stalled\"", obj, sizeof obj) &&
                  strstr(obj, "cannot be rebuilt from the survivors") != NULL &&
                  strstr(obj, ".exp_avg") != NULL && strstr(obj, "checkpoint") != NULL,
              "the stalled event must name the lost moments and the way out: %s", obj);
    MT_ASSERT(tidectl_json(w->tidectl, w->endpoint, "jobs", buf, sizeof buf) == 0,
              "tidectl jobs failed: %s", buf);
    MT_ASSERT(object_with(buf, "\"name\":\"" JOB "\"", obj, sizeof obj) &&
                  strstr(obj, "\"gen\":1,") != NULL &&
                  strstr(obj, "\"state\":\"stalled\"") != NULL,
              "the stalled job stays at generation 1, listed stalled: %s", obj);
    printf("recover-zero1: rank %d killed after step %d; tided stalled the job: no live replica "
           "of its ZeRO-1 moments; no recovery started\n",
           g.victim, g.kill - 1);
    fflush(stdout);
}

/* The state tided lists for worker id in a status reply (a tidectl --json status), copied
   into out; "" when it is not listed. */
static void worker_state_of(const char *status, int32_t id, char *out, size_t cap)
{
    char needle[48], obj[1024];
    snprintf(needle, sizeof needle, "\"worker\":%d,", (int)id);
    out[0] = '\0';
    if (!object_with(status, needle, obj, sizeof obj))
        return;
    const char *p = strstr(obj, "\"state\":\"");
    if (p == NULL)
        return;
    p += strlen("\"state\":\"");
    size_t n = strcspn(p, "\"");
    n = n < cap - 1 ? n : cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

/* stopped mode, rank 0's thread: once tided committed the recovery without the stopped
   rank, resumes it; from then on tided must list it failed (never idle: it would be handed
   offline work while its program is stuck in a step of the old generation) until it has
   been told it was fenced and its process has left. */
static void watch_stopped(watch *w)
{
    static char buf[1 << 18];
    char st[32];
    uint64_t deadline = 0;
    while (!w->stop) {
        tide_sleep_ms(50);
        if (w->killed_ns == 0)
            continue;
        if (deadline == 0)
            deadline = tide_now_ns() + 2ull * DETECT_S * 1000000000ull;
        if (tide_now_ns() > deadline) {
            snprintf(w->why, sizeof w->why,
                     "%s within %d s of the stop (victim worker %d, last state '%s')",
                     w->resumed ? "the resumed rank was not fenced and gone"
                                : "no recovery committed",
                     2 * DETECT_S, (int)w->victim_id, st);
            return;
        }
        if (tidectl_json(w->tidectl, w->endpoint, "status", buf, sizeof buf) != 0)
            continue;
        worker_state_of(buf, w->victim_id, st, sizeof st);
        if (!w->resumed) {
            if (tidectl_json(w->tidectl, w->endpoint, "jobs", buf, sizeof buf) != 0)
                continue;
            char obj[1024];
            char gen[32];
            snprintf(gen, sizeof gen, "\"gen\":%llu,", (unsigned long long)g.final_gen);
            if (!object_with(buf, "\"name\":\"" JOB "\"", obj, sizeof obj) ||
                strstr(obj, gen) == NULL || strstr(obj, "\"state\":\"running\"") == NULL)
                continue;
            if (strcmp(st, "failed") != 0) {
                snprintf(w->why, sizeof w->why,
                         "the recovery committed but the stopped worker %d is '%s', not failed",
                         (int)w->victim_id, st);
                return;
            }
            fprintf(stderr, "[rank 0] generation %llu committed without rank %d: resuming it\n",
                    (unsigned long long)g.final_gen, g.victim);
            kill(w->victim_pid, SIGCONT);
            w->resumed = 1;
            continue;
        }
        if (st[0] != '\0' && strcmp(st, "failed") != 0) {
            snprintf(w->why, sizeof w->why,
                     "tided lists the resumed (fenced) worker %d as '%s': it must stay failed",
                     (int)w->victim_id, st);
            return;
        }
        if (kill(w->victim_pid, 0) != 0 &&
            tidectl_json(w->tidectl, w->endpoint, "events", buf, sizeof buf) == 0) {
            char want[64], obj[2048];
            snprintf(want, sizeof want, "\"kind\":\"worker_fenced\"");
            snprintf(st, sizeof st, "worker %d ", (int)w->victim_id);
            if (!object_with(buf, want, obj, sizeof obj) || strstr(obj, st) == NULL) {
                snprintf(w->why, sizeof w->why,
                         "the resumed rank left but tided recorded no worker_fenced event for "
                         "worker %d",
                         (int)w->victim_id);
                return;
            }
            w->fenced = 1;
            return;
        }
    }
}

void *watchdog(void *arg)
{
    watch *w = arg;
    if (g.stopped) {
        watch_stopped(w);
        return NULL;
    }
    if (g.halt) {
        check_stalled(w);
        return NULL;
    }
    void *ctx = zmq_ctx_new();
    void *s = coord_connect(ctx, w->endpoint, NULL, NULL, NULL, 5000);
    while (s != NULL && !w->stop) {
        tide_sleep_ms(100);
        if (w->killed_ns == 0 || tide_now_ns() - w->killed_ns < DETECT_S * 1000000000ull)
            continue;
        tide_msg_t q, r;
        tide_msg_init(&q, TIDE_MSG_JOBS);
        uint64_t gen = 0;
        if (coord_call(s, &q, &r) == 0 && r.type == TIDE_MSG_JOBS_REPLY)
            for (uint32_t i = 0; i < r.u.jobs_reply.n_rows; i++)
                if (strcmp(r.u.jobs_reply.rows[i].name, JOB) == 0)
                    gen = r.u.jobs_reply.rows[i].gen;
        tide_msg_clear(&r);
        if (gen <= (uint64_t)g.kill_gen && !w->stop) {
            static char ev[1 << 18]; /* what tided did instead */
            if (tidectl_events(w->tidectl, w->endpoint, ev, sizeof ev) != 0)
                ev[0] = '\0';
            MT_FAIL("no recovery committed %d s after rank %d was killed (job at generation "
                    "%llu); tided's events: %s",
                    DETECT_S, g.victim, (unsigned long long)gen, ev);
        }
        break;
    }
    if (s != NULL)
        zmq_close(s);
    zmq_ctx_term(ctx);
    return NULL;
}
